#!/usr/bin/env bash
# The GPU checks and measurements, each stage one command that fits a
# 10-minute device call; logs and JSON go to $OUT (default build/gpu-out).
# Run on the GPU host from the repository root, with build-portable/bin
# carried there (`make portable-tools` on the build machine, right before).
# In order of need (each stands alone; a session's 15 minutes of device time,
# the machine's start included, hold `quick` and little else):
#
#   scripts/gpu-session.sh quick        # first, in one call: the new code's GPU tests (CUDA graphs and a failed capture, generated kernels), GPT 23M and Llama 0.9B once each (fsdpc, replayed, tuned, FSDP2); fsdpc-unfused where fsdpc fails
#   scripts/gpu-session.sh tests        # runtime build, make test-gpu (6 workers), the host's CPU time per step
#   scripts/gpu-session.sh bench-llama  # Llama 0.9B: fsdpc (also with the plan's search's settings), FSDP2, FSDP2 + compile, torch.compile; fsdpc's warm start
#   scripts/gpu-session.sh bench-gpt    # GPT 23M: fsdpc (also replayed as a CUDA graph), FSDP2, FSDP2 + compile, torch.compile, twice (cold and warm); the Llama 0.9B replayed
#   scripts/gpu-session.sh offload      # host optimizer rate; Llama 2.6B offloaded: FSDP2, fsdpc (the plan's fit) stepped in backward and beside the next forward
#   scripts/gpu-session.sh profile      # Llama 0.9B: one profiled step of fsdpc and of FSDP2 + compile, where their time went (fsdpc's generated kernels by name)
#
# Each stage builds the runtime first (seconds when it is built). A failing
# test or run is logged and the stage goes on to its next measurement.
set -euo pipefail
stage=${1:?"usage: scripts/gpu-session.sh quick|tests|bench-llama|bench-gpt|offload|profile"}
case "$stage" in
  quick|tests|bench-llama|bench-gpt|offload|profile) ;;
  *) echo "unknown stage '$stage': use quick, tests, bench-llama, bench-gpt, offload or profile" >&2; exit 2 ;;
esac
if [ ! -x build-portable/bin/fsdp-opt ] || [ ! -x build-portable/bin/fsdp-translate ]; then
  echo "build-portable/bin/fsdp-opt and fsdp-translate are missing: run 'make portable-tools' on the build" \
       "machine and carry build-portable/bin" >&2
  exit 2
fi
if [ "$(scripts/compiler-digest.sh)" != "$(cat build-portable/bin/sources.sha256 2>/dev/null)" ]; then
  echo "build-portable/bin was built from other compiler sources than this tree's: run 'make portable-tools'" \
       "on the build machine again and carry build-portable/bin" >&2
  exit 2
fi
OUT=$(realpath -m "${OUT:-build/gpu-out}")
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1 || true
make runtime JOBS="$(nproc)" > "$OUT/build-$stage.log" 2>&1 || { tail -40 "$OUT/build-$stage.log" >&2; exit 1; }

case "$stage" in
  quick)
    (cd python/tests && timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -n 4 --timeout 180 test_gpu.py \
      -k "cuda_graph or uncapturable or llama or launches" test_pointwise_kernels.py 2>&1 | tee "$OUT/test-quick.log") || true
    timeout 160 python3 benchmarks/gpu.py --models gpt-23m --repeats 1 --steps 8 --warmup 4 --json "$OUT/gpt-quick.json" \
      --systems fsdpc fsdpc-graph fsdp2 2>&1 | tee "$OUT/gpt-quick.log" || true
    timeout 200 python3 benchmarks/gpu.py --models llama-0.9b --repeats 1 --steps 8 --warmup 4 \
      --json "$OUT/llama-quick.json" --systems fsdpc fsdpc-tuned fsdp2 2>&1 | tee "$OUT/llama-quick.log" || true
    # Where fsdpc's own run failed (its generated kernels are new to a GPU),
    # the rest of fsdpc is still measured: every elementwise call an ATen kernel.
    if ! python3 -c 'import json, sys; sys.exit(not json.load(open(sys.argv[1]))["llama-0.9b"].get("fsdpc"))' \
        "$OUT/llama-quick.json" 2>/dev/null; then
      timeout 100 python3 benchmarks/gpu.py --models llama-0.9b --repeats 1 --steps 8 --warmup 4 \
        --json "$OUT/llama-unfused.json" --systems fsdpc-unfused 2>&1 | tee "$OUT/llama-unfused.log" || true
    fi
    ;;
  tests)
    (cd python/tests && timeout 450 python3 -m pytest -q -rs -p no:cacheprovider -n 6 --timeout 400 test_gpu.py \
      test_cuda_capture.py test_pointwise_kernels.py 2>&1 | tee "$OUT/test-gpu.log") || true
    # The same host-bound measurement as on the build machine: how fast this
    # host's CPU dispatches (the time model's issue cost, capture's speed).
    timeout 90 python3 -m torch.distributed.run --nproc-per-node 1 benchmarks/host_overhead.py --rounds 5 --calls 50 \
      2>&1 | tee "$OUT/host-overhead.log" || true
    ;;
  bench-llama)
    timeout 330 python3 benchmarks/gpu.py --models llama-0.9b --repeats 1 --json "$OUT/llama.json" \
      --systems fsdpc fsdp2 fsdp2-compile compile fsdpc-tuned 2>&1 | tee "$OUT/llama.log" || true
    timeout 150 python3 benchmarks/gpu.py --models llama-0.9b --repeats 2 --steps 4 --warmup 2 \
      --json "$OUT/llama-warm.json" --systems fsdpc 2>&1 | tee "$OUT/llama-warm.log" || true
    ;;
  bench-gpt)
    timeout 420 python3 benchmarks/gpu.py --models gpt-23m --repeats 2 --json "$OUT/gpt.json" \
      --systems fsdpc fsdpc-graph fsdp2 fsdp2-compile compile 2>&1 | tee "$OUT/gpt.log" || true
    timeout 120 python3 benchmarks/gpu.py --models llama-0.9b --repeats 1 --json "$OUT/llama-graph.json" \
      --systems fsdpc-graph 2>&1 | tee "$OUT/llama-graph.log" || true
    ;;
  offload)
    timeout 60 python3 benchmarks/host_optimizer.py --threads 1 "$(nproc)" 2>&1 | tee "$OUT/host-optimizer.log" || true
    timeout 480 python3 benchmarks/gpu.py --models llama-2.6b --repeats 1 --steps 3 --warmup 2 --run-timeout 200 \
      --json "$OUT/offload.json" --systems fsdp2-offload fsdpc-fit-inbackward fsdpc-fit-overlap 2>&1 \
      | tee "$OUT/offload.log" || true
    ;;
  profile)
    # One rank started directly (gpu.py does the same), its rendezvous here.
    export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29811
    for system in fsdpc fsdp2-compile; do
      timeout 150 python3 benchmarks/gpu_one.py --model llama-0.9b --system "$system" --steps 4 --warmup 3 \
        --out "$OUT/profile-$system.json" --trace "/tmp/profile-$system.trace.json" > "/tmp/profile-$system.log" 2>&1 \
        || tail -20 "/tmp/profile-$system.log" > "$OUT/profile-$system.txt"  # at most 8 files come back
      python3 benchmarks/trace_summary.py "/tmp/profile-$system.trace.json" --top 40 2>&1 | tee -a "$OUT/profile-$system.txt" || true
    done
    tar czf "$OUT/profile-traces.tgz" -C /tmp profile-fsdpc.trace.json profile-fsdp2-compile.trace.json || true
    ;;
esac

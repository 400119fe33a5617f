#!/usr/bin/env bash
# The GPU checks and measurements, each stage one command that fits a
# 10-minute device call; logs and JSON go to $OUT (default build/gpu-out).
# Run on the GPU host from the repository root, with build-portable/bin
# carried there (`make portable-tools` on the build machine).
#
#   scripts/gpu-session.sh tests     # runtime build, make test-gpu (6 workers), the host's CPU time per step
#   scripts/gpu-session.sh bench     # Llama 0.9B and GPT 23M: fsdpc (also gathering into the parameters, and without generated kernels), FSDP2, FSDP2 + compile, torch.compile
#   scripts/gpu-session.sh offload   # host optimizer rate; Llama 2.6B offloaded: fsdpc (plain, overlapped, the plan's pick), FSDP2
#
# Each stage builds the runtime first (seconds when it is built).
set -euo pipefail
stage=${1:?"usage: scripts/gpu-session.sh tests|bench|offload"}
case "$stage" in
  tests|bench|offload) ;;
  *) echo "unknown stage '$stage': use tests, bench or offload" >&2; exit 2 ;;
esac
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1 || true
make runtime JOBS="$(nproc)" > "$OUT/build-$stage.log" 2>&1

case "$stage" in
  tests)
    cd python/tests
    timeout 480 python3 -m pytest -q -rs -p no:cacheprovider -n 6 --timeout 400 test_gpu.py test_cuda_capture.py \
      test_pointwise_kernels.py 2>&1 | tee "$OUT/test-gpu.log"
    cd ../..
    # The same host-bound measurement as on the build machine: how fast this
    # host's CPU dispatches (the time model's issue cost, capture's speed).
    timeout 60 python3 -m torch.distributed.run --nproc-per-node 1 benchmarks/host_overhead.py --rounds 5 --calls 50 \
      2>&1 | tee "$OUT/host-overhead.log" || true
    ;;
  bench)
    timeout 540 python3 benchmarks/gpu.py --models llama-0.9b gpt-23m --repeats 2 --json "$OUT/gpu.json" \
      --systems fsdpc fsdpc-into-results fsdp2 fsdp2-compile compile fsdpc-unfused 2>&1 | tee "$OUT/bench.log"
    ;;
  offload)
    python3 benchmarks/host_optimizer.py --threads 1 "$(nproc)" 2>&1 | tee "$OUT/host-optimizer.log"
    timeout 480 python3 benchmarks/gpu.py --models llama-2.6b --repeats 1 --json "$OUT/offload.json" \
      --systems fsdpc-offload fsdpc-offload-overlap fsdpc-fit-overlap fsdp2-offload 2>&1 | tee "$OUT/offload.log"
    ;;
esac

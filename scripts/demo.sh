#!/usr/bin/env bash
# The main job: train the built-in GPT on 2 CPU ranks (Gloo) with a compiled,
# FULL_SHARD step on a small public-domain text, one progress line per step;
# the memory report and the schedule trace of the compiled step are written
# to build/demo/. STEPS overrides the number of steps (default 200).
set -euo pipefail
BUILD_DIR="${1:-build}"
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="$PWD/python" FSDP_OPT="$BUILD_DIR/bin/fsdp-opt" OMP_NUM_THREADS=1

echo "== torchrun --nproc-per-node 2 examples/train_gpt.py --steps ${STEPS:-200} --out $BUILD_DIR/demo"
"$PYTHON" -m torch.distributed.run --nproc-per-node 2 --master-port "${MASTER_PORT:-29477}" \
  examples/train_gpt.py --steps "${STEPS:-200}" --out "$BUILD_DIR/demo"

#!/usr/bin/env bash
# The main job: train the built-in GPT on 2 CPU ranks (Gloo) with fsdpc.shard,
# built on the meta device, one progress line per step; a checkpoint is saved
# after step 100 (resume it with the command the run prints), and the memory
# report and a measured trace of the last step are written to build/demo/.
# STEPS overrides the number of steps (default 200).
set -euo pipefail
BUILD_DIR="${1:-build}"
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="$PWD/python" FSDP_OPT="$BUILD_DIR/bin/fsdp-opt" OMP_NUM_THREADS=1
STEPS="${STEPS:-200}"

echo "== torchrun --nproc-per-node 2 examples/train_gpt.py --steps $STEPS --save-at $((STEPS / 2)) --out $BUILD_DIR/demo"
"$PYTHON" -m torch.distributed.run --nproc-per-node 2 --master-port "${MASTER_PORT:-29477}" \
  examples/train_gpt.py --steps "$STEPS" --save-at "$((STEPS / 2))" --out "$BUILD_DIR/demo"

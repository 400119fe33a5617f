#!/usr/bin/env bash
# The main job, until the training driver lands: capture the built-in GPT's
# training step with bf16 mixed precision, shard it FULL_SHARD over 4 ranks
# with fsdp-opt, and print the memory and communication reports; the sharded
# IR and a Chrome trace of its schedule are written under the build folder.
set -euo pipefail
BUILD_DIR="${1:-build}"
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="$PWD/python" FSDP_OPT="$BUILD_DIR/bin/fsdp-opt"

echo "== python -m fsdpc export --model gpt --param-dtype bf16 --reduce-dtype f32 --out $BUILD_DIR/gpt.mlir"
"$PYTHON" -m fsdpc export --model gpt --param-dtype bf16 --reduce-dtype f32 --out "$BUILD_DIR/gpt.mlir"
echo

OPTIONS="ranks=4 strategy=full-shard memory-report=- comm-report=- trace=$BUILD_DIR/gpt-trace.json"
echo "== fsdp-opt $BUILD_DIR/gpt.mlir --fsdp-sharding-pipeline=\"$OPTIONS\" -o $BUILD_DIR/gpt-sharded.mlir"
"$BUILD_DIR/bin/fsdp-opt" "$BUILD_DIR/gpt.mlir" --fsdp-sharding-pipeline="$OPTIONS" -o "$BUILD_DIR/gpt-sharded.mlir"
echo
echo "sharded step: $BUILD_DIR/gpt-sharded.mlir; schedule trace (chrome://tracing, Perfetto): $BUILD_DIR/gpt-trace.json"

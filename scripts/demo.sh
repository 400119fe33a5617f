#!/usr/bin/env bash
# The main job, until the training driver lands: capture the built-in GPT's
# training step into fsdp IR, then run an fsdp-opt pipeline on the hand-sharded
# MLP step and print the result.
set -euo pipefail
BUILD_DIR="${1:-build}"
PYTHON="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="$PWD/python" FSDP_OPT="$BUILD_DIR/bin/fsdp-opt"

echo "== python -m fsdpc export --model gpt --out $BUILD_DIR/gpt.mlir"
"$PYTHON" -m fsdpc export --model gpt --out "$BUILD_DIR/gpt.mlir"
echo

EXAMPLE=examples/mlp_sharded.mlir
PIPELINE="builtin.module(canonicalize,cse)"
echo "== fsdp-opt --pass-pipeline='$PIPELINE' $EXAMPLE"
"$BUILD_DIR/bin/fsdp-opt" --pass-pipeline="$PIPELINE" "$EXAMPLE"

#!/usr/bin/env bash
# The main job, until the training driver lands: run an fsdp-opt pipeline on the
# hand-sharded MLP step and print the result.
set -euo pipefail
BUILD_DIR="${1:-build}"
EXAMPLE=examples/mlp_sharded.mlir
PIPELINE="builtin.module(canonicalize,cse)"
echo "== fsdp-opt --pass-pipeline='$PIPELINE' $EXAMPLE"
"$BUILD_DIR/bin/fsdp-opt" --pass-pipeline="$PIPELINE" "$EXAMPLE"

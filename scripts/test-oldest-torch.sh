#!/usr/bin/env bash
# The Python suite against the oldest torch fsdpc supports (the GPU hosts'
# 2.11, with their transformers), which CI's .venv never has: a venv of its
# own (.venv-oldest), the runtime built against that torch (build-oldest),
# then every test file but those that need what this machine lacks
# (test_gpu.py: a GPU; test_fuzz_program.py: its runtime is built under
# AddressSanitizer against .venv's torch). Needs `make build` first: the
# tests run build/bin's fsdp-opt and fsdp-translate.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TORCH="${OLDEST_TORCH:-2.11.0}"
TRANSFORMERS="${OLDEST_TRANSFORMERS:-5.17.0}"
VENV="$ROOT/.venv-oldest"
BUILD="$ROOT/build-oldest"
JOBS="${JOBS:-2}"

if [[ ! -x build/bin/fsdp-opt || ! -x build/bin/fsdp-translate ]]; then
  echo "test-oldest-torch: build/bin/fsdp-opt and fsdp-translate are missing: run 'make build' first" >&2
  exit 2
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
wanted="torch==$TORCH transformers==$TRANSFORMERS numpy pytest"
if [[ "$(cat "$VENV/.installed" 2>/dev/null)" != "$wanted" ]]; then
  echo "test-oldest-torch: installing $wanted into $VENV (torch is large: minutes)"
  # shellcheck disable=SC2086  # one word per requirement
  "$VENV/bin/python" -m pip install --quiet --no-compile $wanted
  echo "$wanted" > "$VENV/.installed"
fi
mkdir -p "$BUILD"
cmake -G Ninja -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFSDP_RUNTIME_ONLY=ON -DFSDP_PYTHON="$VENV/bin/python" \
  > "$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log" >&2; exit 1; }
cmake --build "$BUILD" -j "$JOBS"
versions='import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
echo "test-oldest-torch: $("$VENV/bin/python" -c "$versions")"
cd python/tests
tests=()
for file in test_*.py; do
  case "$file" in test_gpu.py|test_fuzz_program.py) ;; *) tests+=("$file") ;; esac
done
FSDP_RT_PYTHON="$BUILD/python" PYTHONPATH="$ROOT/python" "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}"

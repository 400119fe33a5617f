#!/usr/bin/env bash
# Checks that compiler binaries run without LLVM/MLIR installed: no shared
# library of LLVM, MLIR, z3 or ICU among their dependencies.
set -euo pipefail
for binary in "$@"; do
  if ldd "$binary" | grep -E 'libLLVM|libMLIR|libz3|libicu|libstdc\+\+' >&2; then
    echo "check-portable: $binary still needs the libraries above" >&2
    exit 1
  fi
  echo "check-portable: $binary ($(du -h "$binary" | cut -f1)) needs only: $(ldd "$binary" | awk '{print $1}' | tr '\n' ' ')"
done

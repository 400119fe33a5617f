#!/usr/bin/env bash
# The digest of the sources fsdp-opt and fsdp-translate are built from.
# `make portable-tools` writes it beside the binaries it builds, and
# scripts/gpu-session.sh refuses binaries built from other sources than the
# tree it runs in (a stale compiler would lower programs the runtime built
# there does not expect).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The runtime's headers the compiler includes too (one definition of the
# shard layout, program format, element types and host staging).
shared=$(grep -rhoE '#include "fsdp_rt/[A-Za-z]+\.h"' lib include tools dialects | sed -E 's|.*"(.*)"|runtime/include/\1|' \
  | LC_ALL=C sort -u)
{ find CMakeLists.txt cmake dialects include lib tools -type f -print0; printf '%s\0' $shared; } | LC_ALL=C sort -z \
  | xargs -0 sha256sum | sha256sum | cut -d' ' -f1

#!/usr/bin/env bash
# The digest of the sources fsdp-opt and fsdp-translate are built from.
# `make portable-tools` writes it beside the binaries it builds, and
# scripts/gpu-session.sh refuses binaries built from other sources than the
# tree it runs in (a stale compiler would lower programs the runtime built
# there does not expect).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
find CMakeLists.txt cmake dialects include lib tools runtime/include -type f -print0 | LC_ALL=C sort -z \
  | xargs -0 sha256sum | sha256sum | cut -d' ' -f1

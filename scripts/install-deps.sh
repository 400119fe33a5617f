#!/usr/bin/env bash
# Installs what fsdpc needs and is missing, and nothing else: Debian packages for
# the compiler toolchain, and a project-local virtualenv (.venv) with the Python
# packages from requirements.txt. Quick when everything is already there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
APT_PACKAGES=(
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools llvm-22-linker-tools
  cmake ninja-build g++ libgtest-dev python3-dev
)

missing=()
for package in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if ((${#missing[@]})); then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "install-deps: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# Reinstall only when requirements.txt changed since the last successful install.
stamp="$VENV/.requirements.sha256"
wanted="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
  echo "install-deps: installing Python packages from requirements.txt (torch is large: minutes)"
  # --no-compile: Python compiles the modules a process imports, once, on
  # first import; compiling all of torch up front cost 40 s of a fresh setup.
  "$VENV/bin/python" -m pip install --quiet --no-compile -r "$ROOT/requirements.txt"
  echo "$wanted" > "$stamp"
fi

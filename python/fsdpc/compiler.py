"""Run ``fsdp-opt`` on fsdp-dialect IR.

Debian's MLIR ships no Python bindings, so Python talks to the compiler as a
subprocess: IR text in, IR text (or diagnostics) out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

_REPO_ROOT = Path(__file__).resolve().parents[2]


class FsdpOptError(RuntimeError):
    """fsdp-opt rejected its input; ``diagnostics`` holds what it printed."""

    def __init__(self, command: Sequence[str], returncode: int, diagnostics: str):
        self.command = list(command)
        self.returncode = returncode
        self.diagnostics = diagnostics
        super().__init__(f"fsdp-opt failed (exit {returncode}):\n{diagnostics.rstrip()}")


def find_fsdp_opt() -> Path:
    """Locates fsdp-opt: $FSDP_OPT, then this checkout's build/, then PATH."""
    candidates = []
    if os.environ.get("FSDP_OPT"):
        candidates.append(Path(os.environ["FSDP_OPT"]))
    candidates.append(_REPO_ROOT / "build" / "bin" / "fsdp-opt")
    on_path = shutil.which("fsdp-opt")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "fsdp-opt not found: set FSDP_OPT, run `make` in the repository, or put it on PATH "
        f"(looked at: {', '.join(str(c) for c in candidates)})"
    )


def run_fsdp_opt(
    ir: str | Path,
    args: Sequence[str] = (),
    *,
    timeout: float = 300.0,
) -> str:
    """Runs fsdp-opt with ``args`` on the IR text ``ir`` (or the IR file at
    that Path, text or bytecode) and returns its output.

    Raises FsdpOptError with fsdp-opt's diagnostics when it rejects the input;
    locations in them name "<stdin>" or the source locations the IR carries.
    """
    from_file = isinstance(ir, Path)
    command = [str(find_fsdp_opt()), str(ir) if from_file else "-", *args]
    completed = subprocess.run(
        command, input=None if from_file else ir, capture_output=True, text=True, timeout=timeout, check=False
    )
    if completed.returncode != 0:
        raise FsdpOptError(command, completed.returncode, completed.stderr)
    return completed.stdout

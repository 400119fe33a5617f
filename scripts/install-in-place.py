"""Makes `import fsdpc` work in this interpreter without PYTHONPATH: a
`fsdpc.pth` naming this checkout's python/ folder goes into its
site-packages (the user's when that one is not writable). The package stays
in the checkout, next to the build/ that holds fsdp-opt, fsdp-translate and
the runtime extension it loads. Delete the file it names to undo.

    python3 scripts/install-in-place.py
"""

import os
import site
import sys
import sysconfig
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "python"


def target() -> Path:
    shared = Path(sysconfig.get_paths()["purelib"])
    if os.access(shared, os.W_OK):
        return shared
    user = Path(site.getusersitepackages())
    user.mkdir(parents=True, exist_ok=True)
    return user


def main() -> None:
    pth = target() / "fsdpc.pth"
    pth.write_text(f"{PACKAGE_ROOT}\n")
    print(f"fsdpc installed in place for {sys.executable}: {pth} -> {PACKAGE_ROOT}")


if __name__ == "__main__":
    main()

"""The compiled-program cache: a warm start skips capture, sharding and
lowering.

An entry holds what compiling produced (the program, the memory report, the
sharded IR) under keys made from the step itself, as it ran, never from
the code alone: a key computed without running the step cannot see what the
Python code reads while it runs, and a stale program trains with the wrong
loss without a word. Three keys, cheapest first, each joined with the
pipeline options and world size and the versions of Python, torch, the
program format, fsdpc's compiler binaries and (for the first two) fsdpc's
own code:
- `forward_key` of the call trace (`fsdpc.call_trace`): every torch call
  the step's Python makes, run on meta under export's modes and flags,
  with its arguments, results, modules and stack, and the contents of the
  source files it ran. A start whose record is unchanged skips export.
- `forward_key` of export's trace (`ExportStage.fingerprint`): every op,
  literal, shape and source line of the forward; the joint trace and the
  IR are functions of it, so a start whose export is unchanged skips the
  joint trace.
- `program_key` of the captured IR text, which skips sharding and
  lowering.
`capture_key` keys the captured IR alone under either trace, for `fsdpc
plan --model`. `FSDPC_CACHE` moves the cache (default ~/.cache/fsdpc);
`FSDPC_CACHE=off` turns it off.

`setup_key` is a different fingerprint, computed without capturing: the
model's structure, parameter and buffer names, shapes, dtypes and ties, the
batch's shapes, the options, and the source files of the job. Ranks compare
it before anything compiles, so that ranks that set up different steps are
refused instead of running rank 0's program.

The directory is private (0700, owned by the user; anything else is
refused) and entries are written under a temporary name and renamed, so a
killed writer never leaves a partial entry.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import stat
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from fsdpc.compiler import find_fsdp_opt
from fsdpc.program import runtime_extension

ENTRY_VERSION = 1
_SIMPLE = (bool, int, float, str, type(None))


class CacheError(RuntimeError):
    """The cache directory cannot be used safely."""


def directory() -> Path | None:
    setting = os.environ.get("FSDPC_CACHE", "")
    if setting.lower() in ("off", "0", "no"):
        return None
    path = Path(setting) if setting else Path.home() / ".cache" / "fsdpc"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise CacheError(f"fsdpc cache {path} must be owned by you and private (chmod 700), "
                         f"it has mode {oct(stat.S_IMODE(info.st_mode))} and owner {info.st_uid}")
    return path


def _file_digest(path: str | os.PathLike, digests: dict) -> str:
    if path not in digests:
        try:
            digests[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            digests[path] = "unreadable"
    return digests[path]


def source_digests(files) -> list[tuple[str, str]]:
    """The contents' digests of the source files a trace ran, but torch's
    and fsdpc's own (their versions key the cache): code that ran only in
    backward, a custom autograd Function's, changes a fingerprint too."""
    own = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
    digests: dict = {}
    return [(file, _file_digest(file, digests)) for file in sorted(set(files))
            if not file.startswith("<") and not file.startswith(own)]


def _user_source_files() -> list[str]:
    """Python files loaded from outside the standard library and site-packages."""
    roots = [p for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_paths().get(key))]
    # Most modules' paths start with an installed root as spelled; only the
    # others need the (slow) symlink resolution.
    spelled = tuple(root + os.sep for root in roots)
    resolved = tuple(os.path.realpath(root) + os.sep for root in roots)
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        # Relative names are torch's pseudo-modules (torch.ops: "_ops.py").
        if not path or not path.endswith(".py") or not os.path.isabs(path) or path.startswith(spelled):
            continue
        real = os.path.realpath(path)
        if not real.startswith(resolved):
            files.add(real)
    return sorted(files)


def _plain(value) -> object:
    if isinstance(value, _SIMPLE):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SIMPLE) for v in value):
        return list(value)
    return None


def _defining_file(obj) -> str | None:
    """The source file of a class or function, also for modules loaded from
    a path (which inspect cannot find through sys.modules)."""
    try:
        return inspect.getsourcefile(obj)
    except (TypeError, OSError):
        pass
    for code_holder in (getattr(obj, "forward", None), obj):
        code = getattr(code_holder, "__code__", None)
        if code is not None:
            return code.co_filename
    return None


def _code_of(fn) -> list:
    """Where a callable is defined, and the plain values it closes over (a
    functools.partial: its function's, and the plain values it binds). Never
    an address: every rank's must be equal."""
    if isinstance(fn, functools.partial):
        return _code_of(fn.func) + [["functools.partial", [_plain(value) for value in fn.args],
                                     {name: _plain(value) for name, value in sorted(fn.keywords.items())}]]
    source = _defining_file(fn if hasattr(fn, "__qualname__") else type(fn))
    cells = [_plain(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ())]
    return [getattr(fn, "__module__", None), getattr(fn, "__qualname__", None) or type(fn).__qualname__, source, cells]


def setup_key(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *, options: dict,
              world: int) -> str:
    digests: dict = {}
    modules = []
    for name, module in model.named_modules(remove_duplicate=False):
        attributes = {k: _plain(v) for k, v in sorted(vars(module).items()) if not k.startswith("_")}
        modules.append([name, type(module).__module__, type(module).__qualname__, attributes,
                        _file_digest(_defining_file(type(module)) or "", digests)])
    identity: dict[int, int] = {}
    params = [[name, list(p.shape), str(p.dtype), p.requires_grad, identity.setdefault(id(p), len(identity))]
              for name, p in model.named_parameters(remove_duplicate=False)]
    buffers = [[name, list(b.shape), str(b.dtype)] for name, b in model.named_buffers(remove_duplicate=False)]
    leaves, structure = tree_flatten(tuple(batch))
    loss = _code_of(loss_fn)
    if loss[2]:
        loss.append(_file_digest(loss[2], digests))
    key = {
        "world": world, "options": {k: (_code_of(v) if callable(v) else repr(v)) for k, v in sorted(options.items())},
        "modules": modules, "params": params, "buffers": buffers, "loss": loss,
        "batch": [[list(t.shape), str(t.dtype)] for t in leaves], "batch_structure": str(structure),
        "sources": [[path, _file_digest(path, digests)] for path in _user_source_files()],
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()


def program_key(captured_ir: str, *, pipeline: str) -> str:
    """The cache key of the program compiled from `captured_ir` with the
    sharding pipeline `pipeline` (which holds the world's ranks)."""
    digests: dict = {}
    tools = find_fsdp_opt()
    key = {
        "entry": ENTRY_VERSION, "python": sys.version, "abi": sysconfig.get_config_var("SOABI"),
        "torch": torch.__version__, "program": runtime_extension().PROGRAM_VERSION, "pipeline": pipeline,
        "tools": [_file_digest(tools, digests), _file_digest(tools.with_name("fsdp-translate"), digests)],
        "captured": hashlib.sha256(captured_ir.encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _fsdpc_sources() -> list:
    digests: dict = {}
    package = Path(__file__).parent
    return [[str(path.relative_to(package)), _file_digest(path, digests)] for path in sorted(package.rglob("*.py"))]


def capture_key(fingerprint: str) -> str:
    """The cache key of a captured step (its IR, before sharding) whose
    forward has `fingerprint` (the call trace's or export's): the rest of
    capture is a function of it, of torch and of fsdpc's own code (what
    `fsdpc plan --model` reuses)."""
    key = {"entry": ENTRY_VERSION, "python": sys.version, "torch": torch.__version__,
           "captured from": fingerprint, "fsdpc": _fsdpc_sources()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def forward_key(fingerprint: str, *, pipeline: str) -> str:
    """The cache key of the program compiled from a capture whose forward
    has `fingerprint` (the call trace's, or export's trace's, see
    `ExportStage.fingerprint`): the rest of capture is a function of it and
    of fsdpc's own code."""
    key = {"program": program_key(fingerprint, pipeline=pipeline), "fsdpc": _fsdpc_sources()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def load(key: str) -> dict | None:
    root = directory()
    if root is None:
        return None
    try:
        entry = json.loads((root / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return entry if entry.get("key") == key and entry.get("entry") == ENTRY_VERSION else None


def store(key: str, entry: dict) -> None:
    root = directory()
    if root is None:
        return
    descriptor, temporary = tempfile.mkstemp(dir=root, prefix=f".{key}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as out:
            json.dump({**entry, "key": key, "entry": ENTRY_VERSION}, out)
        os.replace(temporary, root / f"{key}.json")
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

"""A warm start's cache key without export: the step's Python run once on
the meta tensors capture already holds, every torch call it makes recorded.

Export (non-strict) runs the model's Python under fake tensors and builds a
graph from what reaches the dispatcher. What it builds is a function of the
torch calls that Python makes, in order, with their arguments, of where
each was made (the IR keeps source lines and modules) and of torch's and
fsdpc's code. Export's machinery around those calls is most of its time:
1.3 s of a 1.3 s warm start on the 0.9B Llama on the build machine, 4.9 s
on the GPU host.

This runs the same Python under what export runs it under (the policy's
casts and the fused-kernel modes of `capture.capture_modes`, and torch's
compiling, exporting and fx-tracing flags, which models branch on) and
records, from a torch function mode below those modes, what reaches torch:

    torch.Tensor.add  (%3, 1.0)  {}  -> %4 (4, 2048) torch.bfloat16 ...
        in module model.layers.0.attn, called from llama.py:88 < ...

each call's function, its arguments (tensors by origin: a parameter's or
buffer's name, a batch item, an earlier result), its results' shapes,
dtypes, strides and devices, the modules running and the whole Python stack
above it; then the contents of the source files in those stacks (torch's
and fsdpc's are keyed by their versions), so that code which runs only in
backward, a custom autograd Function's, is in the key too. Any Python value
the step reads reaches the record as the value it had, the same way it
reaches export's trace. The record's digest keys the program cache beside
export's fingerprint (`cache.forward_key`): a start whose record is
unchanged takes the program without exporting (0.14 s instead of 1.3 s).

Where the record cannot be complete there is no key, and capture exports
as before: a parameter, buffer or batch item not on meta, an argument that
is neither a plain value nor a traced tensor (a tensor made outside torch's
functions, an arbitrary object), a call of a function of the user's own
that closes over values or is bound to an object (its name would not say
what it computes), or an error while the step runs.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import re
import sys
import warnings
from dataclasses import dataclass
from enum import Enum
from types import ModuleType
from typing import Callable, Sequence

import torch
import torch.fx._symbolic_trace as fx_tracing
from torch import nn
from torch.overrides import TorchFunctionMode

from fsdpc import functions
from fsdpc.autocast import ambient_autocast
from fsdpc.cache import source_digests
from fsdpc.capture import (CaptureError, MixedPrecision, _definition_of, _TrainingStep, batch_leaves,
                           capture_modes, say_ignored_hooks)
from fsdpc.watch import user_file

_FORMAT = "fsdpc call trace 2"
_PLAIN = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), torch.dtype, torch.device,
          torch.layout, torch.memory_format, torch.Size)
_PLAIN_NAMES = frozenset(kind.__name__ for kind in _PLAIN)  # as `_shown` reads descriptions


class _Incomplete(Exception):
    """The record would miss something export sees."""


@dataclass
class CallTrace:
    """A step's recorded calls: `fingerprint` digests them; `printed` and
    `complained` are what the step wrote to stdout and stderr while it ran
    (a start served from the cache shows them); `calls` and `frames` are the
    record (`_CallRecorder`), which ranks compare (`computed`)."""

    fingerprint: str
    printed: str
    complained: str
    ignored_hooks: list[str]  # where the step entered saved-tensor hooks, which do not apply
    calls: tuple
    frames: tuple  # (file, line, function) of each frame the calls' stacks index

    def echo(self) -> None:
        sys.stdout.write(self.printed)
        sys.stderr.write(self.complained)
        say_ignored_hooks(self.ignored_hooks)

    def computed(self) -> list[str]:
        """Each call as what it computes, readably: `torch.Tensor.add(%17,
        1.0) -> (4, 1) torch.float32 in model.head`, and its results' layout,
        requires_grad and autocast region, without its stack: what every
        rank running the same step records alike, wherever its files and
        objects are (addresses are each process's own)."""
        return [_computed(*call) for call in self.calls]

    def where(self, index: int) -> str:
        """`file:line` of the user's innermost frame above call `index`."""
        stack = [self.frames[frame] for frame in self.calls[index][5]]
        file, line, _ = next((frame for frame in stack if user_file(frame[0])), stack[0] if stack else ("?", 0, ""))
        return f"{file}:{line}"


# An object's address in a description (`Sequential at 0x7f6d...`): each process's own.
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _computed(name, args, kwargs, results, modules, stack, autocast) -> str:
    """One recorded call, as `CallTrace.computed` lists it."""
    arguments = [*map(_shown, args[1]), *(f"{_shown(key)}={_shown(value)}" for key, value in kwargs[1])]
    text = f"{name}({', '.join(arguments)}) -> {_shown(results)} in {_module_named(modules)} (autocast {autocast})"
    return _ADDRESS.sub(" at 0x...", text)


def _module_named(modules: tuple) -> str:
    """The innermost module running (`_module_stack`), as the user names it:
    the step runs loss_fn as its root and the model as its `model`."""
    name = modules[-1] if modules else ""
    if not name:
        return "loss_fn"
    return "the model" if name == "model" else f"module '{name.removeprefix('model.')}'"


def _shown(described) -> str:
    """A recorded argument or result (`_CallRecorder.describe`, `results`) as code would write it."""
    if isinstance(described, str):  # "float 1.0" -> "1.0"; tensors by origin ("%3", "parameter w")
        kind, _, value = described.partition(" ")
        return value if kind in _PLAIN_NAMES else described
    if isinstance(described, tuple) and len(described) == 2 and described[0] in ("tuple", "list") \
            and isinstance(described[1], tuple):
        items = ", ".join(map(_shown, described[1]))
        return f"[{items}]" if described[0] == "list" else f"({items})"
    if isinstance(described, tuple) and described and isinstance(described[0], str) \
            and described[0].startswith("%") and len(described) == 6:  # a new tensor
        name, shape, dtype, layout, device, requires_grad = described
        return f"{name} {tuple(shape)} {dtype} strides {layout} requires_grad={requires_grad}"
    return repr(described)


class _CallRecorder(TorchFunctionMode):
    """Records each torch call that reaches it: below fsdpc's capture modes,
    it sees the calls they make instead of the ones they replace."""

    def __init__(self, root_frame_id: int, device: str) -> None:
        super().__init__()
        self.device = device  # the target's device type, whose autocast state each call records
        self.origin: dict[int, str] = {}   # id(tensor) -> where it came from
        self.alive: list[torch.Tensor] = []  # every result is kept, so that no id is reused
        self.module_names: dict[int, str] = {}
        self.modules: list[str] = []        # the modules running, outermost first
        self.calls: list[tuple] = []
        self._root_frame_id = root_frame_id  # an id, not the frame: the frame holds this recorder
        self._names: dict[object, str] = {}
        self.frames: dict[tuple, int] = {}  # (code, line) -> index, in order of appearance
        self.recording = False

    def name_tensors(self, named: dict[str, torch.Tensor]) -> None:
        for name, tensor in named.items():
            self.origin.setdefault(id(tensor), name)
            self.alive.append(tensor)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.recording:  # setting up the capture modes
            return func(*args, **kwargs)
        call = (self._function_name(func), self.describe(args), self.describe(kwargs))
        result = func(*args, **kwargs)
        # On meta tensors autocast casts nothing: the region a call is made in is recorded beside it.
        self.calls.append((*call, self.results(result), tuple(self.modules), self._stack(),
                           str(ambient_autocast(self.device))))
        return result

    def _function_name(self, func) -> str:
        name = self._names.get(func)
        if name is None:
            if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
                name = f"op {func}"
            else:
                name = torch.overrides.resolve_name(func)
                if name is None:  # not torch's: named by where it is defined, if nothing else is in it
                    owner = getattr(func, "__self__", None)  # a builtin's is its module
                    if getattr(func, "__closure__", None) or not (owner is None or isinstance(owner, ModuleType)):
                        raise _Incomplete(f"a call of {func!r}, whose name does not say what it computes")
                    name = f"{getattr(func, '__module__', None)}.{getattr(func, '__qualname__', None)}"
            self._names[func] = name
        return name

    def describe(self, value):
        """An argument, exactly: plain values by repr, tensors by origin."""
        if isinstance(value, torch.Tensor):
            origin = self.origin.get(id(value))
            if origin is None:
                raise _Incomplete("a tensor that no traced call made")
            return origin
        if isinstance(value, _PLAIN):
            return f"{type(value).__name__} {value!r}"
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(self.describe(item) for item in value))
        if isinstance(value, dict):
            return ("dict", tuple((self.describe(k), self.describe(v)) for k, v in value.items()))
        if isinstance(value, slice):
            return ("slice", self.describe(value.start), self.describe(value.stop), self.describe(value.step))
        if isinstance(value, Enum):
            return f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"
        if isinstance(value, type):
            return f"class {value.__module__}.{value.__qualname__}"
        raise _Incomplete(f"an argument of type {type(value).__qualname__}")

    def results(self, value):
        """A result: new tensors get a name and their metadata."""
        if isinstance(value, torch.Tensor):
            known = self.origin.get(id(value))
            if known is not None:
                return ("same", known)
            name = f"%{len(self.alive)}"
            self.origin[id(value)] = name
            self.alive.append(value)
            layout = value.stride() if value.layout == torch.strided else str(value.layout)
            return (name, tuple(value.shape), str(value.dtype), layout, str(value.device), value.requires_grad)
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(self.results(item) for item in value))
        try:
            return self.describe(value)
        except _Incomplete:
            return type(value).__qualname__

    def _stack(self) -> tuple[int, ...]:
        """The Python stack above a call, each frame as its index in `frames`."""
        stack = []
        frame = sys._getframe(2)
        while frame is not None and id(frame) != self._root_frame_id:
            stack.append(self.frames.setdefault((frame.f_code, frame.f_lineno), len(self.frames)))
            frame = frame.f_back
        return tuple(stack)

    def frame_table(self) -> tuple:
        return tuple((code.co_filename, line, code.co_name) for code, line in self.frames)


def _fx_tracing_flag() -> tuple[Callable[[], bool], Callable[[bool], None]]:
    """How this torch reads and sets `torch.fx._symbolic_trace.is_fx_tracing()`:
    a thread-local behind accessors (newer torch), or a module global
    (torch 2.11, the GPU hosts')."""
    if hasattr(fx_tracing, "_get_is_fx_tracing") and hasattr(fx_tracing, "_set_is_fx_tracing"):
        return fx_tracing._get_is_fx_tracing, fx_tracing._set_is_fx_tracing
    if isinstance(getattr(fx_tracing, "_is_fx_tracing_flag", None), bool):
        return (lambda: fx_tracing._is_fx_tracing_flag,
                lambda value: setattr(fx_tracing, "_is_fx_tracing_flag", value))
    raise _Incomplete("this torch keeps its fx tracing flag elsewhere")


@contextlib.contextmanager
def _as_export_runs_it():
    """torch's flags as non-strict export sets them while the step runs
    (`torch.compiler.is_compiling()`, `is_exporting()`, fx tracing): models
    branch on them."""
    compiler = torch.compiler
    if not all(hasattr(compiler, flag) for flag in ("_is_compiling_flag", "_is_exporting_flag")):
        raise _Incomplete("this torch keeps its compiling flags elsewhere")
    get_fx_tracing, set_fx_tracing = _fx_tracing_flag()
    saved = compiler._is_compiling_flag, compiler._is_exporting_flag, get_fx_tracing()
    compiler._is_compiling_flag = compiler._is_exporting_flag = True
    set_fx_tracing(True)
    try:
        yield
    finally:
        compiler._is_compiling_flag, compiler._is_exporting_flag = saved[:2]
        set_fx_tracing(saved[2])


@contextlib.contextmanager
def _module_stack(recorder: _CallRecorder):
    """Keeps `recorder.modules` as the modules whose forward is running."""
    def enter(module, args):
        recorder.modules.append(recorder.module_names.get(id(module), f"new {type(module).__qualname__}"))

    def leave(module, args, output):
        recorder.modules.pop()

    handles = [nn.modules.module.register_module_forward_pre_hook(enter),
               nn.modules.module.register_module_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _environment() -> tuple:
    """Global state that changes what the same calls trace to."""
    autocast = tuple((kind, torch.is_autocast_enabled(kind), str(torch.get_autocast_dtype(kind)))
                     for kind in ("cpu", "cuda"))
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            str(torch.get_default_dtype()), torch.are_deterministic_algorithms_enabled(), autocast)


def _inputs(model: nn.Module, batch: Sequence[torch.Tensor]) -> tuple:
    """The step's parameters, buffers and batch as capture would name them."""
    identity: dict[int, int] = {}
    params = tuple((name, tuple(p.shape), str(p.dtype), p.requires_grad, identity.setdefault(id(p), len(identity)))
                   for name, p in model.named_parameters(remove_duplicate=False))
    persistent = {f"{prefix}.{name}" if prefix else name
                  for prefix, module in model.named_modules(remove_duplicate=False)
                  for name in module._buffers if name not in module._non_persistent_buffers_set}
    buffers = tuple((name, tuple(b.shape), str(b.dtype), name in persistent)
                    for name, b in model.named_buffers(remove_duplicate=False))
    return params, buffers, tuple((tuple(t.shape), str(t.dtype), t.stride()) for t in batch)


def trace_calls(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *,
                unit_modules: Sequence[str], mixed_precision: MixedPrecision | None,
                device: str) -> CallTrace | None:
    """Runs `loss_fn(model, *batch)` on meta as capture for `device` runs
    it, and digests every torch call (None where the record cannot be
    complete: see the module's docstring)."""
    batch = tuple(batch)
    try:
        leaves, structure = batch_leaves(batch)
    except CaptureError:
        return None  # export says what is wrong
    tensors = [*model.parameters(), *model.buffers(), *leaves]
    if not all(isinstance(t, torch.Tensor) and t.is_meta for t in tensors):
        return None
    step = _TrainingStep(model, loss_fn, device)
    units = {name: model.get_submodule(name) for name in unit_modules}
    recorder = _CallRecorder(id(sys._getframe()), device)
    printed, complained = io.StringIO(), io.StringIO()
    collecting = gc.isenabled()
    gc.disable()  # the record makes many small objects and frees none: collections would only cost
    try:
        with recorder, contextlib.redirect_stdout(printed), contextlib.redirect_stderr(complained), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with capture_modes(model, units, mixed_precision, device) as observed:
                recorder.name_tensors({f"parameter {name}": p
                                       for name, p in step.named_parameters(remove_duplicate=False)})
                recorder.name_tensors({f"buffer {name}": b for name, b in step.named_buffers(remove_duplicate=False)})
                recorder.name_tensors({f"batch item {i}": t for i, t in enumerate(leaves)})
                recorder.module_names = {id(m): name for name, m in reversed(
                    list(step.named_modules(remove_duplicate=False)))}
                with _module_stack(recorder), _as_export_runs_it():
                    recorder.recording = True
                    loss = step(*batch)
                    recorder.recording = False
        result = recorder.results(loss)
    except Exception:  # whatever stops the record, export decides (and explains)
        return None
    finally:
        if collecting:
            gc.enable()
    frames = recorder.frame_table()
    record = (_FORMAT, device, repr(mixed_precision), str(_definition_of(loss_fn)), tuple(unit_modules),
              _environment(), _inputs(model, leaves), str(structure), frames,
              source_digests(file for file, _, _ in frames), functions.code_key(observed.applied),
              tuple(recorder.calls), result, sorted(observed.regions.saved))
    return CallTrace(hashlib.sha256(repr(record).encode()).hexdigest(), printed.getvalue(), complained.getvalue(),
                     observed.ignored_hooks, tuple(recorder.calls), frames)

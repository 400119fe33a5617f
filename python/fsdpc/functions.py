"""Custom `torch.autograd.Function`s keep their own backward in the step.

Export traces a Function's `forward` op by op and drops the Function: the
joint trace would then differentiate those ops, not run the Function's
`backward` (a gradient reversal's -grad became +grad, a straight-through
estimator's gradient through `round` became zero, silently). So, while
export traces (`kept_whole`), `Function.apply` of a Function defined
outside torch becomes one opaque call, `fsdpc::autograd_function(n,
tensors)`, the trace's n-th such call: its fake kernel runs the Function
(without grad) for the output shapes; the trace's list of calls keeps the
Function and its non-tensor arguments. The joint trace
(`capture._Composites`) runs the Function itself there, with grad
(`run_whole`): its forward's ops are traced where it is called, and
autograd runs its `backward` in the joint trace, as eager would. The
files defining the Functions key the program cache (`code_key`): their
backward's code is in no trace of forward; the call carries the
Function's name and its non-tensor arguments (`_Call.signature`), so the
graph and every key hold them. A Function's forward run outside a kept
call (an `apply` bound before capture) is refused rather than inlined.
A Function may read the model's tensors it is not passed (a checkpointing
Function recomputes the module it closes over): in the joint trace the
model's slots hold the trace's tensors (`capture._holding`), and what its
backward accumulates into a parameter's `.grad` by itself is that
parameter's gradient too.

torch's own Functions (checkpointing, its internals) trace as before.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import types
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from fsdpc.attention import draws_random
from fsdpc.cache import source_digests
from fsdpc.watch import cell_value, machinery_file, nested_codes, user_file, user_function


_TENSOR = object()  # a tensor's place among a call's arguments or results (None is a value of its own)
_PLAIN = (bool, int, float, str, torch.dtype, torch.device)


@dataclass
class _Call:
    """One `Function.apply` call export met: the Function, its arguments
    with the tensors taken out (_TENSOR in their places), and, once its
    fake kernel ran, the structure of what it returned with its non-tensors."""
    function: type
    arguments: list
    structure: TreeSpec
    returned: tuple[list, TreeSpec] | None = None

    def signature(self) -> str:
        """The Function and its non-tensor arguments, as the graph (and so
        every key of the program) holds them: another value (a gradient
        reversal's scale) is another step, never a stale program."""
        def described(leaf) -> str:
            if leaf is _TENSOR:
                return "tensor"
            if leaf is None or isinstance(leaf, _PLAIN):
                return repr(leaf)
            return f"{type(leaf).__qualname__} at {id(leaf):#x}"  # an object: this one, in this process

        return (f"{self.function.__module__}.{self.function.__qualname__}"
                f"({', '.join(described(leaf) for leaf in self.arguments)})")


# The calls of the export tracing now and capture's rewrites of Python calls (kept_whole), innermost last.
_TRACING: list[tuple[list[_Call], Callable[[], ContextManager]]] = []
_ORIGINAL_APPLY = torch.autograd.Function.__dict__["apply"]  # a classmethod: Python in older torch, C++ in newer
_applying = threading.local()  # .depth: inside a kept call's fake kernel, where forward may run


def _applied(function: type, *args, **kwargs):
    """`function.apply(*args, **kwargs)` as torch defines it."""
    return _ORIGINAL_APPLY.__get__(None, function)(*args, **kwargs)


def _arguments(call: _Call, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    """The call's (args, kwargs), with `tensors` in the tensors' places."""
    remaining = iter(tensors)
    leaves = [next(remaining) if leaf is _TENSOR else leaf for leaf in call.arguments]
    return tree_unflatten(leaves, call.structure)


def _tensors_of(call: _Call, returned) -> list[torch.Tensor]:
    leaves, structure = tree_flatten(returned)
    call.returned = ([_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], structure)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


@torch.library.custom_op("fsdpc::autograd_function", mutates_args=())
def _autograd_function(signature: str, call_id: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    raise RuntimeError("fsdpc::autograd_function only stands for a Function while export traces")


@_autograd_function.register_fake
def _(signature: str, call_id: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    calls, rewrites = _TRACING[-1]
    call = calls[call_id]
    args, kwargs = _arguments(call, tensors)
    _applying.depth = getattr(_applying, "depth", 0) + 1
    try:
        with torch.no_grad(), rewrites():
            returned = _applied(call.function, *args, **kwargs)
    finally:
        _applying.depth -= 1
    # A custom operator's results may not alias its inputs (export checks): copies, of the same layout.
    return [tensor.clone() for tensor in _tensors_of(call, returned)]


def _traced_by_torch(function: type) -> bool:
    return function.__module__.split(".")[0] == "torch"


def _user_functions() -> list[type]:
    """Every Function subclass defined outside torch, loaded now."""
    found, pending = [], [torch.autograd.Function]
    while pending:
        for subclass in pending.pop().__subclasses__():
            pending.append(subclass)
            if not _traced_by_torch(subclass):
                found.append(subclass)
    return found


def _guarded(function: type, forward):
    """`forward` of `function`, refusing to run outside a kept call: an
    `apply` bound before capture (`reverse = Reverse.apply`) bypasses
    kept_whole's, and export would inline the forward and lose the backward."""
    def guarded_forward(*args, **kwargs):
        if getattr(_applying, "depth", 0) == 0 and _TRACING:
            raise RuntimeError(
                f"{function.__qualname__}.forward ran without {function.__qualname__}.apply at the call (an apply "
                f"saved before fsdpc.shard, `f = {function.__qualname__}.apply`?): fsdpc keeps a Function's own "
                f"backward where the step calls {function.__qualname__}.apply(...) itself")
        return forward(*args, **kwargs)
    return guarded_forward


@contextlib.contextmanager
def kept_whole(rewrites: Callable[[], ContextManager]) -> Iterator[list[_Call]]:
    """While export traces (on this thread): each `apply` of a Function
    defined outside torch is one `fsdpc::autograd_function` call, whose fake
    kernel runs the Function's forward under capture's `rewrites` of
    Python calls (as export's trace runs forward); yields the trace's
    calls, for `run_whole` and `code_key`."""
    calls: list[_Call] = []
    owner = threading.get_ident()

    def apply(cls, *args, **kwargs):
        if _traced_by_torch(cls) or threading.get_ident() != owner:
            return _applied(cls, *args, **kwargs)
        leaves, structure = tree_flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        call = _Call(cls, [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], structure)
        call_id = len(calls)
        calls.append(call)
        results = iter(torch.ops.fsdpc.autograd_function(call.signature(), call_id, tensors))
        kept, shape = call.returned
        return tree_unflatten([next(results) if leaf is _TENSOR else leaf for leaf in kept], shape)

    previous = torch.autograd.Function.__dict__["apply"]
    forwards = {function: function.__dict__["forward"] for function in _user_functions()
                if isinstance(function.__dict__.get("forward"), staticmethod)}
    _TRACING.append((calls, rewrites))
    torch.autograd.Function.apply = classmethod(apply)
    for function, forward in forwards.items():
        function.forward = staticmethod(_guarded(function, forward.__func__))
    try:
        yield calls
    finally:
        for function, forward in forwards.items():
            function.forward = forward
        torch.autograd.Function.apply = previous
        _TRACING.pop()


OPAQUE = torch.ops.fsdpc.autograd_function.default


_DREW_IN_FORWARD: set[type] = set()  # the Functions whose forward drew random numbers in the joint trace now


def run_whole(calls: Sequence[_Call], rewrites: Callable[[], ContextManager], signature: str, call_id: int,
              tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The Function the trace met as its call `call_id` (of `calls`),
    applied to `tensors` with grad (in the joint trace), its forward under
    capture's `rewrites` of Python calls: its tensors returned, in order."""
    call = calls[call_id]
    args, kwargs = _arguments(call, tensors)
    with rewrites(), _Random(call.function, refuse=False):
        return _tensors_of(call, _applied(call.function, *args, **kwargs))


class RandomInBackward(RuntimeError):
    """A custom Function's backward drew random numbers in the joint trace."""


class _Random(TorchDispatchMode):
    """Random draws of a custom Function (`function`): noted in its forward,
    and in its backward refused where its forward drew too. Such a backward
    recomputes the forward (a checkpointing Function, which restores the
    generator's state to replay the forward's draws); the step cannot give
    it the forward's draws. A backward drawing afresh (stochastic rounding)
    draws as a step does, from the step's generator."""

    def __init__(self, function: type, refuse: bool):
        super().__init__()
        self.function, self.refuse = function, refuse

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if draws_random(func, args, kwargs or {}):
            if not self.refuse:
                _DREW_IN_FORWARD.add(self.function)
            elif self.function in _DREW_IN_FORWARD:
                name = self.function.__qualname__
                raise RandomInBackward(
                    f"{name}.backward draws random numbers ({func.name()}) as its forward did: a recomputation, "
                    "which the step cannot give the forward's draws (a checkpointing Function recomputing dropout "
                    "would get another mask); checkpoint with torch.utils.checkpoint, whose regions fsdpc "
                    "recomputes with the forward's draws, or turn the dropout off")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def backward_in_capture(calls: Sequence[_Call], rewrites: Callable[[], ContextManager]) -> Iterator[None]:
    """While the joint trace runs: the backward of each Function `calls`
    applied runs under capture's `rewrites` of Python calls (a
    checkpointing Function's recomputes forward), and refuses random draws
    that recompute the forward's (see _Random)."""
    patched = []
    for function in dict.fromkeys(call.function for call in calls):
        # Its backward is `vjp` where it defines that instead (torch refuses both).
        method = "vjp" if function.vjp is not torch.autograd.Function.vjp else "backward"
        backward = getattr(function, method)

        def watched(ctx, *grads, backward=backward, function=function):
            with rewrites(), _Random(function, refuse=True):
                return backward(ctx, *grads)

        patched.append((function, method, function.__dict__.get(method)))
        setattr(function, method, staticmethod(watched))
    try:
        yield
    finally:
        _DREW_IN_FORWARD.clear()
        for function, method, own in reversed(patched):
            if own is None:
                delattr(function, method)  # inherited
            else:
                setattr(function, method, own)


_CALLED_DEPTH = 3  # how deep code_key follows the user's functions a Function's methods call by name


def _unwrapped(value) -> list:
    """`value` and what it calls in turn: a partial's function, a decorated
    or cached function's own (`__wrapped__`), innermost last."""
    chain = [value]
    for _ in range(8):
        if isinstance(value, functools.partial):
            value = value.func
        elif callable(value) and hasattr(value, "__wrapped__"):
            value = value.__wrapped__
        else:
            break
        chain.append(value)
    return chain


def _source_file(path: str | None) -> str | None:
    """`path` where it is Python source outside torch, Python and fsdpc (a
    compiled extension's file is not: hashing one on every fingerprint
    costs seconds)."""
    return path if path and path.endswith(".py") and not machinery_file(path) else None


def _called_files(function: types.FunctionType, files: set[str], seen: set[int], depth: int = 0) -> None:
    """Adds to `files` those of the code `function` calls by name (a helper
    function, class or module in another file, `pkg.sub.helper(...)`), and
    of what the user's helpers call in turn (`seen`: the functions followed
    so far)."""
    seen.add(id(function))
    names = {name for code in nested_codes(function.__code__) for name in code.co_names}
    # What it calls: globals by name, and helpers handed to it in a closure or as defaults.
    called = [function.__globals__.get(name) for name in names]
    called += [cell_value(cell) for cell in function.__closure__ or ()]
    called += [*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values()]
    for found in called:
        *wrappers, value = _unwrapped(found)
        for wrapper in wrappers:  # a decorator's wrapper runs too
            if isinstance(wrapper, types.FunctionType) and (path := _source_file(wrapper.__code__.co_filename)):
                files.add(path)
        if isinstance(value, types.ModuleType):  # `helpers.fused_backward(...)`, `pkg.sub.f(...)`
            path = _source_file(getattr(value, "__file__", None))
            if path:
                files.add(path)
            if path and user_file(path):  # a library's module may import as its attributes are read
                for attribute in names:
                    inner = getattr(value, attribute, None)
                    if isinstance(inner, types.ModuleType) and (path := _source_file(getattr(inner, "__file__", None))):
                        files.add(path)
            continue
        if isinstance(value, type) and (module := sys.modules.get(value.__module__)) is not None:
            if path := _source_file(getattr(module, "__file__", None)):  # `Helper.grad(...)`
                files.add(path)
            continue
        if isinstance(value, types.FunctionType) and id(value) not in seen:
            if path := _source_file(value.__code__.co_filename):
                files.add(path)
            if depth < _CALLED_DEPTH and user_function(value):
                _called_files(value, files, seen, depth + 1)


def code_key(calls: Sequence[_Call]) -> list:
    """What keys the program for the Functions of `calls` besides their
    signatures: the contents of the files whose code each Function and the
    classes it derives from outside torch define, and of the code they call
    by name (its backward runs in no trace of forward); a Function defined
    where no file holds its code (a notebook cell) keys by its identity, so
    that no other process's program serves it."""
    files, unknown, seen = set(), set(), set()
    for call in calls:
        for cls in call.function.__mro__:
            if cls is object or _traced_by_torch(cls):
                continue
            methods = [getattr(member, "__func__", member) for member in vars(cls).values()]
            methods = [method for method in methods if isinstance(method, types.FunctionType)]
            named = {method.__code__.co_filename for method in methods}
            files |= {name for name in named if not name.startswith("<")}
            if any(name.startswith("<") for name in named):
                unknown.add(f"{cls.__qualname__} at {id(cls):#x}")
            for method in methods:
                _called_files(method, files, seen)
    return [source_digests(sorted(name for name in files if not name.startswith("<"))), sorted(unknown)]

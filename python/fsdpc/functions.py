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
files defining the Functions key the program cache (`source_files`): their
backward's code is in no trace of forward.

torch's own Functions (checkpointing, its internals) trace as before.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten


@dataclass
class _Call:
    """One `Function.apply` call export met: the Function, its arguments
    with the tensors taken out (None in their places), and, once its fake
    kernel ran, the structure of what it returned with its non-tensors."""
    function: type
    arguments: list
    structure: TreeSpec
    returned: tuple[list, TreeSpec] | None = None


_TRACING: list[list[_Call]] = []  # the calls of the export tracing now (kept_whole), innermost last
_ORIGINAL_APPLY = torch.autograd.Function.__dict__["apply"]  # a classmethod: Python in older torch, C++ in newer


def _applied(function: type, *args, **kwargs):
    """`function.apply(*args, **kwargs)` as torch defines it."""
    return _ORIGINAL_APPLY.__get__(None, function)(*args, **kwargs)


def _arguments(call: _Call, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    """The call's (args, kwargs), with `tensors` in the tensors' places."""
    remaining = iter(tensors)
    leaves = [next(remaining) if leaf is None else leaf for leaf in call.arguments]
    return tree_unflatten(leaves, call.structure)


def _tensors_of(call: _Call, returned) -> list[torch.Tensor]:
    leaves, structure = tree_flatten(returned)
    call.returned = ([None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], structure)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


@torch.library.custom_op("fsdpc::autograd_function", mutates_args=())
def _autograd_function(call_id: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    raise RuntimeError("fsdpc::autograd_function only stands for a Function while export traces")


@_autograd_function.register_fake
def _(call_id: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    call = _TRACING[-1][call_id]
    args, kwargs = _arguments(call, tensors)
    with torch.no_grad():
        returned = _applied(call.function, *args, **kwargs)
    # A custom operator's results may not alias its inputs (export checks): copies, of the same layout.
    return [tensor.clone() for tensor in _tensors_of(call, returned)]


def _traced_by_torch(function: type) -> bool:
    return function.__module__.split(".")[0] == "torch"


@contextlib.contextmanager
def kept_whole() -> Iterator[list[_Call]]:
    """While export traces: each `apply` of a Function defined outside
    torch is one `fsdpc::autograd_function` call; yields the trace's calls,
    for `run_whole` and `source_files`."""
    calls: list[_Call] = []

    def apply(cls, *args, **kwargs):
        if _traced_by_torch(cls):
            return _applied(cls, *args, **kwargs)
        leaves, structure = tree_flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        call = _Call(cls, [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], structure)
        calls.append(call)
        results = iter(torch.ops.fsdpc.autograd_function(len(calls) - 1, tensors))
        kept, shape = call.returned
        return tree_unflatten([next(results) if leaf is None else leaf for leaf in kept], shape)

    _TRACING.append(calls)
    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield calls
    finally:
        torch.autograd.Function.apply = _ORIGINAL_APPLY
        _TRACING.pop()


OPAQUE = torch.ops.fsdpc.autograd_function.default


def run_whole(calls: Sequence[_Call], call_id: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The Function the trace met as its call `call_id` (of `calls`),
    applied to `tensors` with grad (in the joint trace): its tensors
    returned, in order."""
    call = calls[call_id]
    args, kwargs = _arguments(call, tensors)
    return _tensors_of(call, _applied(call.function, *args, **kwargs))


def source_files(calls: Sequence[_Call]) -> list[str]:
    """The files that define the Functions of `calls`."""
    files = set()
    for call in calls:
        try:
            files.add(inspect.getsourcefile(call.function))
        except TypeError:  # defined in C
            continue
    return sorted(file for file in files if file)

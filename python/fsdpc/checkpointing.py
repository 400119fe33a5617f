"""The model's own activation checkpointing, kept through capture.

A model that wraps its blocks with `torch.utils.checkpoint.checkpoint` (or
`checkpoint_wrapper`, or Hugging Face's `gradient_checkpointing_enable()`,
which call it) asks PyTorch to keep only each region's inputs between
forward and backward and to run the region again in backward. Export traces
the region's calls like any others, and the joint trace would save their
results: the step would silently need the memory the model meant not to
use. So while capture traces the step, each region's calls are marked with
the region's number (`torch.fx.traceback.annotate`, which the joint trace
copies onto the ATen calls it makes of them), the IR carries it
(`fsdp.aten ... checkpoint N`) and `fsdp-activation-checkpoint` recomputes
each region in backward.

How the regions are found: the non-reentrant checkpoint (the default, and
`checkpoint_wrapper`'s) enters `torch.utils.checkpoint._checkpoint_hook`
around exactly the checkpointed call, looked up when it runs, so wrapping
that class's `__enter__` and `__exit__` sees every region however the model
bound `checkpoint`. The reentrant one (`use_reentrant=True`) runs its
function under `no_grad` inside an autograd Function that export cannot see
through; while capturing, that Function runs the function as a region
instead, which gives the same gradients wherever PyTorch gives any: where
none of the region's tensor inputs requires grad, PyTorch gives the
parameters inside none (its warning "None of the inputs have
requires_grad=True"), and capture refuses the step, naming the call,
rather than train them or not (a forward-only step, under no_grad, has no
gradients to lose and passes).

Selective checkpointing (a `context_fn` such as
`create_selective_checkpoint_contexts`, torchtitan's op-level policy) saves
the results of the calls its policy names and recomputes the rest. Its
policy decides while export traces the region, as it would in eager
PyTorch (each call once, in order, `is_recompute` false); a saved call is
recorded as its region, operator and occurrence among the region's calls
of that operator (the way PyTorch keys its own cache). The joint trace
meets the same calls again below autograd and marks the nodes of each
saved one (`SAVED_KEY`): they stay out of the region, so their results are
kept for backward and what the region recomputes starts from them. The
recorded decisions are part of the step's fingerprint (a changed policy
compiles anew).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.fx.traceback as fx_traceback
from torch import fx
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.utils import checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

REGION_KEY = "fsdpc_checkpoint"  # in a node's meta["custom"]
SAVED_KEY = "fsdpc_saved"  # in a node's meta: a call its region's selective policy saves

# A call a selective policy saves: its region, its operator, and which of the
# region's calls of that operator it is (from 0).
SavedCall = tuple[int, str, int]

# What a policy returns that saves: PyTorch's own set where it has one.
_SAVING = frozenset(getattr(torch_checkpoint, "_SAVE_POLICIES", (torch_checkpoint.CheckpointPolicy.MUST_SAVE,
                                                                 torch_checkpoint.CheckpointPolicy.PREFER_SAVE)))


@dataclass
class CheckpointRegions:
    """What a traced step's checkpoint calls were: `saved` holds the calls
    that selective policies (`context_fn`) save."""

    saved: set[SavedCall] = field(default_factory=set)


def _recording(policy: Callable, region: int, saved: set[SavedCall]) -> Callable:
    """`policy`, its saving decisions added to `saved`."""
    occurrences: collections.Counter[str] = collections.Counter()

    def decide(context, operator, *args, **kwargs):
        decision = policy(context, operator, *args, **kwargs)
        name = str(operator)
        if decision is True or (not isinstance(decision, bool) and decision in _SAVING):
            saved.add((region, name, occurrences[name]))
        occurrences[name] += 1
        return decision

    return decide


class SavingSelectively(TorchDispatchMode):
    """While the joint trace runs the forward: marks the nodes of each call
    a selective policy saved, found as the same occurrence of the same
    operator in the same region; `unfound` is what it has not met."""

    def __init__(self, saved: set[SavedCall]) -> None:
        super().__init__()
        self.saved = saved
        self.unfound = set(saved)
        self.occurrences: collections.Counter[tuple[int, str]] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        region = (fx_traceback.current_meta.get("custom") or {}).get(REGION_KEY)
        if region is None or func in torch_checkpoint.SAC_IGNORED_OPS:  # calls PyTorch's policy never sees
            return func(*args, **kwargs)
        name = str(func)
        call = (region, name, self.occurrences[region, name])
        self.occurrences[region, name] += 1
        if call not in self.saved:
            return func(*args, **kwargs)
        graph = get_proxy_mode().tracer.graph
        before = len(graph.nodes)
        result = func(*args, **kwargs)
        for node in itertools.islice(reversed(graph.nodes), len(graph.nodes) - before):
            node.meta[SAVED_KEY] = True
        self.unfound.discard(call)
        return result


@contextlib.contextmanager
def patched(owner: type, **replacements) -> Iterator[None]:
    """`owner`'s attributes replaced while tracing, then put back as they
    were: reassigned where `owner` defined them, removed where it inherited
    them (classes and modules: capture's other patches use it too)."""
    inherited = object()
    saved = {name: owner.__dict__.get(name, inherited) for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is inherited:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def _marked(region: int, open_regions: list[int]) -> contextlib.ExitStack:
    """Marks every node traced until it closes as in `region`, the
    innermost of `open_regions` meanwhile."""
    stack = contextlib.ExitStack()
    stack.enter_context(fx_traceback.preserve_node_meta())
    stack.enter_context(fx_traceback.annotate({REGION_KEY: region}))
    open_regions.append(region)
    stack.callback(open_regions.pop)
    return stack


@contextlib.contextmanager
def checkpoint_regions() -> Iterator[CheckpointRegions]:
    """While tracing, each torch.utils.checkpoint call's nodes carry its
    region number (from 0, in call order), and the calls their selective
    policies save are recorded."""
    hook = torch_checkpoint._checkpoint_hook
    enter, leave = hook.__enter__, hook.__exit__
    selective = torch_checkpoint._CachingTorchDispatchMode
    selective_enter = selective.__enter__
    regions = itertools.count()
    open_regions: list[int] = []
    seen = CheckpointRegions()

    def entered(self):
        self._fsdpc_region = _marked(next(regions), open_regions)
        return enter(self)

    def left(self, *exception):
        try:
            return leave(self, *exception)
        finally:
            self._fsdpc_region.close()

    def reentrant(run, preserve_rng_state, *args):
        if torch.is_grad_enabled() and not any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args):
            from fsdpc.capture import CaptureError, user_frame  # capture imports this module

            line = user_frame(traceback.extract_stack()[:-1])
            raise CaptureError(
                f"{line or 'the model'}: checkpoint(use_reentrant=True) of inputs none of which requires grad: "
                "PyTorch gives the parameters inside it no gradient; pass use_reentrant=False, which gives them "
                "theirs, or freeze them (requires_grad_(False)) if that is what you meant")
        with _marked(next(regions), open_regions):
            return run(*args)

    def selective_entered(self):
        if open_regions:  # entered by its checkpoint, inside the region
            self.policy_fn = _recording(self.policy_fn, open_regions[-1], seen.saved)
        return selective_enter(self)

    with (patched(hook, __enter__=entered, __exit__=left),
          patched(torch_checkpoint.CheckpointFunction, apply=staticmethod(reentrant)),
          patched(selective, __enter__=selective_entered)):
        yield seen


def regions_of(graph: fx.Graph, loss: fx.Node) -> dict[fx.Node, int]:
    """The forward calls of `graph` (up to `loss`) that ran in a checkpoint
    region, with its number, but for those its selective policy saves."""
    regions = {}
    for node in graph.nodes:
        region = (node.meta.get("custom") or {}).get(REGION_KEY)
        if node.op == "call_function" and region is not None and not node.meta.get(SAVED_KEY):
            regions[node] = region
        if node is loss:
            break
    return regions

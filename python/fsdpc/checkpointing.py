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
`create_selective_checkpoint_contexts`) saves what its policy says; capture
recomputes such a region whole and says so (fsdpc's own
`checkpoint-policy=ops` is the usual policy: attention and every other
matrix product saved).
"""

from __future__ import annotations

import contextlib
import itertools
import traceback
import warnings
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.fx.traceback as fx_traceback
from torch import fx
from torch.utils import checkpoint as torch_checkpoint

REGION_KEY = "fsdpc_checkpoint"  # in a node's meta["custom"]


@dataclass
class CheckpointRegions:
    """What a traced step's checkpoint calls were: `selective` when one had
    a selective policy (recomputed whole)."""

    selective: bool = False

    def say(self) -> None:
        """Warns of a selective policy recomputed whole; capture's own
        warnings are silenced while it traces."""
        if self.selective:
            warnings.warn("fsdpc: a selective activation checkpoint (context_fn) is recomputed whole; fsdpc's "
                          "pipeline option checkpoint-policy=ops saves attention and every other matrix product, "
                          "as torchtitan's op-level policy does", stacklevel=2)


@contextlib.contextmanager
def patched(owner: type, **replacements) -> Iterator[None]:
    """`owner`'s attributes replaced while tracing, then put back as they
    were: reassigned where `owner` defined them, removed where it inherited
    them (capture's refusal of autocast uses it too)."""
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


def _marked(regions: Iterator[int]) -> contextlib.ExitStack:
    """Marks every node traced until it closes as in the next region."""
    stack = contextlib.ExitStack()
    stack.enter_context(fx_traceback.preserve_node_meta())
    stack.enter_context(fx_traceback.annotate({REGION_KEY: next(regions)}))
    return stack


@contextlib.contextmanager
def checkpoint_regions() -> Iterator[CheckpointRegions]:
    """While tracing, each torch.utils.checkpoint call's nodes carry its
    region number (from 0, in call order)."""
    hook = torch_checkpoint._checkpoint_hook
    enter, leave = hook.__enter__, hook.__exit__
    selective = torch_checkpoint._CachingTorchDispatchMode
    selective_enter = selective.__enter__
    regions = itertools.count()
    seen = CheckpointRegions()

    def entered(self):
        self._fsdpc_region = _marked(regions)
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
        with _marked(regions):
            return run(*args)

    def selective_entered(self):
        seen.selective = True
        return selective_enter(self)

    with (patched(hook, __enter__=entered, __exit__=left),
          patched(torch_checkpoint.CheckpointFunction, apply=staticmethod(reentrant)),
          patched(selective, __enter__=selective_entered)):
        yield seen


def regions_of(graph: fx.Graph, loss: fx.Node) -> dict[fx.Node, int]:
    """The forward calls of `graph` (up to `loss`) that ran in a checkpoint
    region, with its number."""
    regions = {}
    for node in graph.nodes:
        region = (node.meta.get("custom") or {}).get(REGION_KEY)
        if node.op == "call_function" and region is not None:
            regions[node] = region
        if node is loss:
            break
    return regions

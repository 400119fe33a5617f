"""`torch.autocast` in a compiled step: the same casts eager PyTorch makes.

Capture traces on the meta device, where autocast casts nothing (it casts
only tensors of its own device type). So:

- the export trace records each autocast region the step enters (the
  user's `with torch.autocast(...)`, or the one a call under autocast runs
  in: `ambient_autocast`) as a region of the graph, whatever it casts;
- where the graph holds such a region (`casts_in`), the step is
  exported again, and the joint trace runs, on fake tensors of the
  target's device type, so that PyTorch's own autocast makes its casts
  there, by its own op lists, forward and backward, and the step's Python
  reads the dtypes eager's reads (`x.to(h.dtype)`);
- an autocast for a tensor's device type (`torch.autocast(x.device.type,
  enabled=False)`), "meta" in the first export, is for the target's
  (`recording_regions`): torch's would refuse "meta";
- the operators capture chooses itself in place of an autocast-listed call
  (fused attention, fused RMSNorm) take their inputs as autocast would have
  cast them (`as_autocast_casts`). The written-out RMSNorms inside a
  region stay as written (`fuse_written_out_rms_norms` reads the top-level
  graph only): its rewrite does not model autocast's casts of pow and
  rsqrt.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import fx

from fsdpc.checkpointing import patched

_REGION = torch.ops.higher_order.wrap_with_autocast


def ambient_autocast(device_type: str) -> torch.dtype | None:
    """The dtype of the autocast enabled for `device_type` here (None: none
    is): a call under it computes as it would in eager PyTorch, and the
    step compiled for it holds the casts, so it keys the programs."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


@contextlib.contextmanager
def recording_regions(device_type: str) -> Iterator[None]:
    """While capture traces: the caller's autocast is off (the step enters
    its own, `ambient_autocast`, as a region); an autocast for the device
    type of a tensor (`torch.autocast(x.device.type, enabled=False)`, as
    models force fp32 where precision matters) is for the target's, not for
    meta's, where capture runs; and, for a CUDA target on a machine without
    a GPU, `torch.autocast("cuda", ...)` stays enabled instead of disabling
    itself: on meta tensors it only marks a region."""
    autocast = torch.amp.autocast_mode.autocast
    make = autocast.__init__

    def for_the_target(self, *args, **kwargs):
        args, kwargs = _for_device_type(device_type, args, kwargs)
        make(self, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        if device_type == "cuda" and not torch.cuda.is_available():
            stack.enter_context(patched(torch.cuda.amp.common, amp_definitely_not_available=lambda: False))
            stack.enter_context(patched(torch.cuda, is_bf16_supported=lambda *args, **kwargs: True))
        stack.enter_context(patched(autocast, __init__=for_the_target))
        stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _for_device_type(device_type: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An autocast's arguments with device type "meta" (first, or by name)
    replaced by `device_type`."""
    if args and args[0] == "meta":
        return (device_type, *args[1:]), kwargs
    if kwargs.get("device_type") == "meta":
        return args, {**kwargs, "device_type": device_type}
    return args, kwargs


def casts_in(graph_module: fx.GraphModule, device_type: str) -> bool:
    """Whether an export graph enters an enabled autocast region of
    `device_type` (at any depth)."""
    return any(node.op == "call_function" and node.target is _REGION and node.args[0] == device_type and node.args[2]
               for module in graph_module.modules() if isinstance(module, fx.GraphModule)
               for node in module.graph.nodes)


def autocast_lists(op: str, device_type: str) -> bool:
    """Whether autocast, enabled here for `device_type`, casts the arguments
    of the ATen operator `op` (an overload: "aten::upsample_nearest2d.vec")."""
    return ambient_autocast(device_type) is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
        op, "AutocastCUDA" if device_type == "cuda" else "AutocastCPU")


def as_autocast_casts(op: str, device_type: str, tensors: Sequence, *, to_fp32: bool) -> list | None:
    """`tensors` (a call's arguments) as autocast, if enabled here for
    `device_type`, casts the arguments of the ATen operator `op` before
    running it: floating tensors other than float64 to float32 (`to_fp32`,
    its fp32 list) or to the autocast dtype (its lower-precision list).
    Unchanged where autocast is off, or does not list `op` for that device
    (the lists differ by device and torch version: the dispatcher says) and
    the tensors are the fake ones of the second export, whose dtypes are
    autocast's; None where they are meta, whose dtypes autocast has not
    cast: a kernel cannot be chosen for them."""
    dtype = ambient_autocast(device_type)
    if dtype is None:
        return list(tensors)
    if not autocast_lists(op, device_type):
        return None if any(isinstance(t, torch.Tensor) and t.is_meta for t in tensors) else list(tensors)
    target = torch.float32 if to_fp32 else dtype
    return [t.to(target) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            else t for t in tensors]

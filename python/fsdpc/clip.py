"""Clipping gradients by their global norm in a few fused launches.

A sharded module's gradients are many small tensors (76 in the GPT 23M). A
norm and a scale per tensor are four kernels each, hundreds per step, which
on a GPU is host time a launch-bound step does not have. Here each device
and dtype gets one fused norm (`_foreach_norm`, accumulated in float64) and
one fused scale (`_foreach_mul_` by a 0-dim tensor), and the scale is
decided on the device, so clipping needs no host synchronization.
`ShardedModule.clip_grad_norm_` adds the shard groups' all-reduce.
"""

from __future__ import annotations

import math

import torch


def by_device_and_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """`tensors` in lists of one device and dtype each, in first-seen order."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    return list(groups.values())


def norm_terms(tensors: list[torch.Tensor], norm_type: float, device: torch.device) -> torch.Tensor:
    """What `tensors` add to the global `norm_type`-norm, as a float64 0-dim
    tensor on `device`: the sum of their norms to the power `norm_type`, or
    their largest norm for the infinity norm. Summing these terms over all
    tensors and taking the `1 / norm_type` root gives the global norm. An
    empty tensor (a rank's shard of a parameter with fewer rows than ranks)
    adds nothing; torch's infinity norm would raise on it."""
    tensors = [tensor for tensor in tensors if tensor.numel()]
    if not tensors:
        return torch.zeros((), dtype=torch.float64, device=device)
    norms = torch.cat([torch.stack(torch._foreach_norm(group, norm_type, dtype=torch.float64)).to(device)
                       for group in by_device_and_dtype(tensors)])
    return norms.max() if math.isinf(norm_type) else norms.pow(norm_type).sum()


def global_norm(terms: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The global norm (float32, 0-dim) from every group's `norm_terms`."""
    if math.isinf(norm_type):
        return torch.stack(terms).max().float()
    return torch.stack(terms).sum().pow(1.0 / norm_type).float()


def scale_(tensors: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """Scales `tensors` in place by `max_norm / total` where that is below 1,
    as `torch.nn.utils.clip_grad_norm_` does (by 1 otherwise, which changes
    nothing); by 1 where `total` is not finite."""
    coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0)
    coefficient = torch.where(torch.isfinite(total), coefficient, 1.0)
    for group in by_device_and_dtype(tensors):
        torch._foreach_mul_(group, coefficient.to(group[0].device))

"""Batch norms as a step can compute them.

**Cumulative average (`momentum=None`).** Eager BatchNorm then averages its
running statistics over every batch so far: each training forward counts
the batch and weights it by 1 / count, a count it reads in Python
(`float(self.num_batches_tracked)`), which a static step cannot. While
fsdpc captures, such a module normalizes by the batch's statistics as eager
does and updates its running statistics with that factor computed from the
count in the step.

**SyncBatchNorm.** In training, eager normalizes by the statistics of the
batch of every rank together: it all-gathers each rank's mean, inverse
deviation and count in forward and all-reduces the gradients' two sums in
backward, in a custom Function whose collectives no trace holds (and whose
kernels exist for GPUs only). While fsdpc captures, such a module computes
the same statistics with `data_parallel_sum`, a custom operator that stands
for `fsdp.data_parallel_sum` in the IR (a sum over every data-parallel
rank, an all-reduce once sharded): the sum and count of the rank's
elements, then the sum of squared deviations from the joint mean, each in
fp32 for a low-precision input, as eager's kernels accumulate. The sum's
gradient is the sum of the ranks' gradients, so the backward all-reduces
too and autograd writes the rest. The counts travel in the sum, so ranks
whose batches differ in size weigh in as eager weighs them.

Eval mode takes torch's own forward, as does a BatchNorm whose momentum
is a number.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fsdpc.checkpointing import patched


@torch.library.custom_op("fsdpc::data_parallel_sum", mutates_args=())
def data_parallel_sum(input: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of `input` over every rank of the job."""
    total = input.clone()
    dist.all_reduce(total)
    return total


@data_parallel_sum.register_fake
def _(input):
    return torch.empty_like(input)


data_parallel_sum.register_autograd(lambda ctx, grad: data_parallel_sum(grad))
DATA_PARALLEL_SUM = torch.ops.fsdpc.data_parallel_sum.default  # the operator the traced graphs hold


def _cumulative_factor(module: _BatchNorm) -> torch.Tensor | float:
    """The weight of this batch in the running statistics; counts it first."""
    module.num_batches_tracked.add_(1)
    if module.momentum is not None:
        return module.momentum
    return 1.0 / module.num_batches_tracked.to(module.running_mean.dtype)


def _averaging_forward(original: Callable) -> Callable:
    def forward(self, input):
        if not (self.momentum is None and self.training and self.track_running_stats
                and self.num_batches_tracked is not None):
            return original(self, input)
        self._check_input_dim(input)
        factor = _cumulative_factor(self)
        output = F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
        with torch.no_grad():
            # Eager accumulates a low-precision input's statistics in fp32, the running statistics' dtype.
            statistics = input.to(self.running_mean.dtype)
            dims = [0, *range(2, input.dim())]
            self.running_mean.copy_(factor * statistics.mean(dims) + (1 - factor) * self.running_mean)
            self.running_var.copy_(factor * statistics.var(dims, correction=1) + (1 - factor) * self.running_var)
        return output

    return forward


def _synced_forward(original: Callable) -> Callable:
    def forward(self, input):
        # Whatever the job's size, as the rest of the step: one program for any
        # number of ranks, and `fsdpc plan` counts the sums. fsdpc.shard refuses
        # a process group of fewer ranks (partly_synced).
        if not self.training:
            return original(self, input)
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        if input.numel() // input.shape[1] == 1 and not (dist.is_initialized() and dist.get_world_size() > 1):
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.size()}")
        tracked = self.track_running_stats and self.running_mean is not None
        factor = _cumulative_factor(self) if tracked and self.num_batches_tracked is not None else self.momentum
        return _synced_batch_norm(input, self.weight, self.bias, self.running_mean if tracked else None,
                                  self.running_var if tracked else None, factor, self.eps)

    return forward


def _synced_batch_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                       running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                       factor: torch.Tensor | float, eps: float) -> torch.Tensor:
    """Batch norm over every rank's batch (training mode)."""
    channels = input.shape[1]
    shape = [1, channels] + [1] * (input.dim() - 2)
    dims = [0, *range(2, input.dim())]
    statistics_dtype = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    x = input.to(statistics_dtype)
    local_count = torch.full((1,), input.numel() // channels, dtype=statistics_dtype, device=input.device)
    sum_and_count = data_parallel_sum(torch.cat([x.sum(dims), local_count]))
    count = sum_and_count[channels]
    mean = sum_and_count[:channels] / count
    centered = x - mean.view(shape)
    var = data_parallel_sum(centered.square().sum(dims)) / count
    # One scale per channel, so that backward keeps only `centered` of the batch's size.
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    output = centered * scale.view(shape)
    if bias is not None:
        output = output + bias.view(shape)
    if running_mean is not None:
        with torch.no_grad():
            unbiased = var * (count / (count - 1))
            running_mean.copy_(factor * mean + (1 - factor) * running_mean)
            running_var.copy_(factor * unbiased + (1 - factor) * running_var)
    return output.to(input.dtype)


def partly_synced(model: nn.Module) -> list[str]:
    """The SyncBatchNorms of `model` that synchronize over fewer ranks than
    the job's, where fsdpc would sum over every rank."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.SyncBatchNorm)
            and module.process_group not in (None, dist.group.WORLD)
            and dist.get_world_size(module.process_group) != dist.get_world_size()]


def batch_norms_traceable() -> contextlib.AbstractContextManager:
    """While capture traces: BatchNorm with `momentum=None` and SyncBatchNorm (above)."""
    stack = contextlib.ExitStack()
    stack.enter_context(patched(_BatchNorm, forward=_averaging_forward(_BatchNorm.forward)))
    stack.enter_context(patched(nn.SyncBatchNorm, forward=_synced_forward(nn.SyncBatchNorm.forward)))
    return stack

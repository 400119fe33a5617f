"""Batch norm's cumulative average (`momentum=None`), as a step can compute it.

With `momentum=None`, eager BatchNorm averages its running statistics over
every batch so far: each training forward counts the batch and weights it
by 1 / count, a count it reads in Python (`float(self.num_batches_tracked)`),
which a static step cannot. While fsdpc captures, such a module normalizes
by the batch's statistics as eager does and updates its running statistics
with that factor computed from the count in the step; a momentum that is a
number, and eval mode, take torch's own forward.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from fsdpc.checkpointing import patched


def _averaging_forward(original: Callable) -> Callable:
    def forward(self, input):
        if not (self.momentum is None and self.training and self.track_running_stats
                and self.num_batches_tracked is not None):
            return original(self, input)
        self._check_input_dim(input)
        self.num_batches_tracked.add_(1)
        output = F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
        with torch.no_grad():
            # Eager accumulates a low-precision input's statistics in fp32, the running statistics' dtype.
            statistics = input.to(self.running_mean.dtype)
            dims = [0, *range(2, input.dim())]
            factor = 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
            self.running_mean.copy_(factor * statistics.mean(dims) + (1 - factor) * self.running_mean)
            self.running_var.copy_(factor * statistics.var(dims, correction=1) + (1 - factor) * self.running_var)
        return output

    return forward


def cumulative_averages_traceable() -> contextlib.AbstractContextManager:
    """While capture traces: BatchNorm with `momentum=None` (above)."""
    return patched(_BatchNorm, forward=_averaging_forward(_BatchNorm.forward))

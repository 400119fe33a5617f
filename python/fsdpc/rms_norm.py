"""RMSNorm kept whole for a CUDA target.

On a GPU, eager PyTorch runs `F.rms_norm` (`nn.RMSNorm`, as torchtitan's
Llama uses it) as one kernel, `aten::_fused_rms_norm`, and its gradient as
another, `aten::_fused_rms_norm_backward`: ATen's `rms_norm` takes the
fused operator unless the input is complex or channels-last or the weight's
dtype differs from the input's. That operator has a CUDA kernel only; on
the meta device, where capture runs, it is a composite of pow, mean, rsqrt
and products, whose backward is a dozen more calls with more saved for it.

So, when capturing for CUDA, a torch function mode routes each such call
to a custom operator that stands for the fused one (`STANDS_FOR`): its fake
kernel allocates what the CUDA kernel allocates, its autograd formula calls
the stand-in of the fused backward, and the IR names them by the ATen
operators, which the runtime calls on the GPU. Without a weight (the fused
backward would then return an undefined weight gradient, which a custom
operator cannot), and for a CPU target, capture takes the composite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten


def _statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """The CUDA kernel's accumulation type, which its `rstd` has."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.custom_op("fsdpc::fused_rms_norm", mutates_args=())
def fused_rms_norm(input: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor,
                   eps: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    return aten._fused_rms_norm(input, normalized_shape, weight, eps)


@fused_rms_norm.register_fake
def _(input, normalized_shape, weight, eps):
    axis = input.dim() - len(normalized_shape)
    statistics = list(input.shape[:axis]) + [1] * len(normalized_shape)
    return (torch.empty_like(input, memory_format=torch.contiguous_format),
            input.new_empty(statistics, dtype=_statistics_dtype(input.dtype)))


@torch.library.custom_op("fsdpc::fused_rms_norm_backward", mutates_args=())
def fused_rms_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, normalized_shape: list[int],
                            rstd: torch.Tensor, weight: torch.Tensor,
                            output_mask: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    return aten._fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask)


@fused_rms_norm_backward.register_fake
def _(grad_out, input, normalized_shape, rstd, weight, output_mask):
    return (torch.empty_like(input, memory_format=torch.contiguous_format),
            torch.empty_like(weight, memory_format=torch.contiguous_format))


def _setup_context(ctx, inputs, output):
    input, normalized_shape, weight, _ = inputs
    ctx.save_for_backward(input, output[1], weight)
    ctx.normalized_shape = normalized_shape


def _backward(ctx, grad_out, _grad_rstd):
    input, rstd, weight = ctx.saved_tensors
    grad_input, grad_weight = fused_rms_norm_backward(grad_out, input, ctx.normalized_shape, rstd, weight,
                                                      [True, True])
    return grad_input, None, grad_weight, None


fused_rms_norm.register_autograd(_backward, setup_context=_setup_context)

# The custom operators and the ATen operators they stand for in the IR.
STANDS_FOR = {
    torch.ops.fsdpc.fused_rms_norm.default: aten._fused_rms_norm.default,
    torch.ops.fsdpc.fused_rms_norm_backward.default: aten._fused_rms_norm_backward.default,
}


def takes_fused_kernel(input: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether ATen's `rms_norm` on a CUDA input takes `_fused_rms_norm`."""
    channels_last = input.dim() in (4, 5) and input.suggest_memory_format() in (
        torch.channels_last, torch.channels_last_3d)
    return (weight is not None and weight.dtype == input.dtype and input.is_floating_point()
            and not channels_last)


class FusedRmsNormFor(TorchFunctionMode):
    """While capture traces for `device`, routes `F.rms_norm` and
    `torch.rms_norm` to the fused operator's stand-in where eager PyTorch on
    a GPU would run the fused kernel."""

    def __init__(self, device: str):
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.device != "cuda" or func not in (F.rms_norm, torch.rms_norm):
            return func(*args, **kwargs)
        names = ("input", "normalized_shape", "weight", "eps")
        call = {**dict(zip(names, args)), **kwargs}
        input, weight = call["input"], call.get("weight")
        if not takes_fused_kernel(input, weight):
            return func(*args, **kwargs)
        return fused_rms_norm(input, list(call["normalized_shape"]), weight, call.get("eps"))[0]

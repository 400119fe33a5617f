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

An RMSNorm written out by hand (`x * torch.rsqrt(x.pow(2).mean(-1,
keepdim=True) + eps) * weight`, the project's Llama and many others) is
recognized in the exported forward (`fuse_written_out_rms_norms`), also
computed in fp32 and cast back as Hugging Face's norms write it, and
becomes the same stand-in, as a compiler fuses it: one pass each way
instead of five kernels forward and a dozen backward. The fused kernel
computes in fp32 and rounds once where the written-out form rounds after
each of its ops in bf16 (or once more before the weight), as the generated
pointwise kernels do.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx
from torch._prims_common import suggest_memory_format
from torch.overrides import TorchFunctionMode

from fsdpc.autocast import as_autocast_casts

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
    # Python has no Tensor.suggest_memory_format (C++'s, which eager reads): torch's own rule instead.
    channels_last = input.dim() in (4, 5) and suggest_memory_format(input) in (
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
        # Cast as autocast would cast for the call replaced (CUDA's fp32 list holds rms_norm in
        # torch 2.15, not in 2.11).
        cast = as_autocast_casts("aten::rms_norm", self.device, (call["input"], call.get("weight")), to_fp32=True)
        if cast is None:
            return func(*args, **kwargs)
        input, weight = cast
        if not takes_fused_kernel(input, weight):
            return func(*args, **kwargs)
        return fused_rms_norm(input, list(call["normalized_shape"]), weight, call.get("eps"))[0]


def _calls(node, *targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _readers(node: fx.Node) -> set[fx.Node]:
    """Who reads `node`, leaving out export's dtype assertions on it (the
    joint trace drops those)."""
    return {user for user in node.users if not _calls(user, aten._assert_tensor_metadata.default)}


def _only_feeds(node: fx.Node, user: fx.Node) -> bool:
    """`node` is read by `user` alone, so the fused call can replace it."""
    return _readers(node) == {user}


def _either_order(pair):
    first, second = pair
    return ((first, second), (second, first))


def _cast_of(node) -> tuple[fx.Node, torch.dtype] | None:
    """(source, dtype) where `node` is `source.to(dtype)` and nothing more."""
    if _calls(node, aten.to.dtype) and len(node.args) == 2 and not node.kwargs:
        return node.args[0], node.args[1]
    if _calls(node, aten._to_copy.default) and len(node.args) == 1 and set(node.kwargs) == {"dtype"}:
        return node.args[0], node.kwargs["dtype"]
    return None


# Inputs whose upcast to fp32, as Hugging Face's norms write it, loses nothing.
_EXACT_IN_FP32 = (torch.bfloat16, torch.float16, torch.float32)


def _written_out_norm(product: fx.Node):
    """(input, weight, eps, the nodes the fused call replaces) where
    `product` is `x * rsqrt(mean(x ** 2, [-1], keepdim=True) + eps) *
    weight`: the multiplications in either order, `x * x` for the square,
    and optionally computed in fp32 as Hugging Face's norms are (`x` the
    input cast to fp32, the normalized value cast back to the input's dtype
    before the weight); else None."""
    if not _calls(product, aten.mul.Tensor) or product.kwargs:
        return None
    for scaled, weight in _either_order(product.args):
        cast_back = _cast_of(scaled)
        normed = cast_back[0] if cast_back else scaled
        if cast_back and not _only_feeds(scaled, product):
            continue
        if not _calls(normed, aten.mul.Tensor) or normed.kwargs or not _only_feeds(normed, scaled if cast_back
                                                                                    else product):
            continue
        for x, root in _either_order(normed.args):
            if not _calls(root, aten.rsqrt.default) or not _only_feeds(root, normed):
                continue
            shifted = root.args[0]
            if not _calls(shifted, aten.add.Tensor) or shifted.kwargs or not _only_feeds(shifted, root):
                continue
            mean, eps = shifted.args
            if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not _calls(mean, aten.mean.dim) \
                    or not _only_feeds(mean, shifted) or mean.kwargs.get("dtype") is not None:
                continue
            squared, dims, *rest = mean.args
            keepdim = rest[0] if rest else mean.kwargs.get("keepdim", False)
            if not keepdim or not _only_feeds(squared, mean):
                continue
            if not (_calls(squared, aten.pow.Tensor_Scalar) and squared.args == (x, 2)) and \
                    not (_calls(squared, aten.mul.Tensor) and squared.args == (x, x) and not squared.kwargs):
                continue
            upcast = _cast_of(x)
            input = upcast[0] if upcast and upcast[1] == torch.float32 else x
            values = [getattr(n, "meta", {}).get("val") for n in (input, x, weight, product)]
            if not all(isinstance(v, torch.Tensor) for v in values) or values[0].dim() < 1:
                continue
            input_value, x_value, weight_value, result = values
            if input is not x and input_value.dtype not in _EXACT_IN_FP32:
                continue
            if list(dims) not in ([-1], [x_value.dim() - 1]) or weight_value.shape != input_value.shape[-1:]:
                continue
            if not takes_fused_kernel(input_value, weight_value) or result.dtype != input_value.dtype \
                    or result.shape != input_value.shape:
                continue
            replaced = [product, *([scaled] if cast_back else []), normed, root, shifted, mean, squared]
            if input is not x and _readers(x) <= set(replaced):
                replaced.append(x)
            return input, weight, float(eps), replaced
    return None


def fuse_written_out_rms_norms(graph_module: fx.GraphModule) -> int:
    """Rewrites each written-out RMSNorm of an exported forward for a CUDA
    target into the fused operator's stand-in, as `F.rms_norm` is captured
    there, with the source line and module of the norm's last product.
    Returns how many it rewrote."""
    graph = graph_module.graph
    rewritten = 0
    for node in list(graph.nodes):  # a match's nodes precede its last product, so none is erased ahead
        match = _written_out_norm(node)
        if match is None:
            continue
        x, weight, eps, replaced = match
        x_value, weight_value = x.meta["val"], weight.meta["val"]
        with x_value.fake_mode:
            values = fused_rms_norm(x_value, [x_value.shape[-1]], weight_value, eps)
        inherited = {key: value for key, value in node.meta.items() if key != "val"}
        with graph.inserting_before(node):
            fused = graph.call_function(torch.ops.fsdpc.fused_rms_norm.default,
                                        (x, [x_value.shape[-1]], weight, eps))
            normalized = graph.call_function(operator.getitem, (fused, 0))
        fused.meta.update(inherited, val=values)
        normalized.meta.update(inherited, val=values[0])
        node.replace_all_uses_with(normalized)
        for dead in replaced:
            for assertion in list(dead.users):  # only export's dtype assertions are left reading it
                graph.erase_node(assertion)
            graph.erase_node(dead)
        rewritten += 1
    if rewritten:
        graph_module.recompile()
    return rewritten

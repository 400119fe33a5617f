"""Fused attention kept whole for the target device.

Capture runs on the meta device, where `F.scaled_dot_product_attention` has
no fused kernel to choose and falls back to math attention: an fp32 softmax
over batch x heads x seq x seq per layer (1 GiB per layer for a Llama at
4 x 16 x 2048 x 2048) and many passes over memory. Eager PyTorch on a GPU
runs one fused kernel there. So, when capturing for CUDA, a torch function
mode routes each call to the fused ATen operator that eager PyTorch would
choose for that dtype, shape and mask on the target GPU (an H100 unless
told otherwise): cuDNN, flash or memory-efficient attention. The
operator's own meta kernel gives the shapes, autograd its backward
operator, and both reach the IR whole. No GPU is needed to capture: the
choice restates the rules of PyTorch's CUDA dispatcher (`sdp_utils.cpp`,
torch 2.11 to 2.15), its backend switches and priority order included
(`torch.nn.attention.sdpa_kernel`, `torch.backends.cuda.enable_*_sdp`), as
they stand when the call is captured.

Keys and values repeated to the query's heads before the call
(`k.repeat_interleave(q_heads // kv_heads, dim=1)`, grouped-query
attention written out) reach cuDNN's and flash attention's kernels
unrepeated, as `enable_gqa=True` would pass them, wherever one of those
takes the grouped call: the kernels read each key/value head for its group
of query heads, which is what the repeat computes, so the repeated copies
(forward, and saved for backward) and the gradients' sums over the repeats
are gone.

For a CPU target, capture takes the CPU's fused kernel where eager would
(`cpu_attention_kernel`): it computes a bf16 call in fp32 and never holds
the scores, where math attention rounds them to bf16 and materializes them.
Wherever no fused kernel applies, capture takes math attention by name, so
that autograd differentiates its ops one by one.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from fsdpc.autocast import as_autocast_casts
from fsdpc.checkpointing import patched

TARGET_DEVICES = ("cpu", "cuda")


class AttentionKernel(Enum):
    CUDNN = "cudnn"
    FLASH = "flash"
    EFFICIENT = "efficient"
    CPU_FLASH = "cpu flash"
    MATH = "math"


@dataclass(frozen=True)
class CudaTarget:
    """What PyTorch's choice depends on besides the call: the GPU's compute
    capability and the cuDNN version torch loads."""
    capability: tuple[int, int] = (9, 0)  # H100 / H200
    cudnn_version: int = 0                # 0: the installed wheel's (torch.backends.cudnn.version())

    def cudnn(self) -> int:
        if self.cudnn_version:
            return self.cudnn_version
        return (torch.backends.cudnn.version() or 0) if torch.backends.cudnn.is_available() else 0

    def prefers_cudnn(self) -> bool:
        """PyTorch tries cuDNN attention first on sm90/sm100 with cuDNN newer
        than 9.15, unless TORCH_CUDNN_SDPA_DEPRIORITIZED is set."""
        deprioritized = os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").lower() in ("1", "true", "on", "yes")
        return not deprioritized and self.capability[0] in (9, 10) and self.cudnn() > 91500

    def cudnn_head_dim_limit(self) -> int:
        """cuDNN attention's largest head dim in PyTorch: 256 on sm90 (H100,
        H200) from cuDNN 9.10 on, else 128."""
        return 256 if self.capability == (9, 0) and self.cudnn() >= 91000 else 128


_SDPA_PARAMETERS = inspect.Signature([
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
    for name, default in (("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty),
                          ("value", inspect.Parameter.empty), ("attn_mask", None), ("dropout_p", 0.0),
                          ("is_causal", False), ("scale", None), ("enable_gqa", False))])

_REPEAT_INTERLEAVE = (torch.Tensor.repeat_interleave, torch.repeat_interleave)
_REPEAT_PARAMETERS = inspect.Signature([
    inspect.Parameter("input", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("repeats", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    inspect.Parameter("dim", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
    inspect.Parameter("output_size", inspect.Parameter.KEYWORD_ONLY, default=None)])

_SDPA = F.scaled_dot_product_attention
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_GRID_LIMIT = 65535  # batch and heads of one launch


class NoAttentionKernel(RuntimeError):
    """No kernel the backend switches leave on takes the call: eager PyTorch
    raises "No available kernel" there too."""


# torch's backend numbers (`torch.nn.attention.SDPBackend`) in its priority order.
_BACKEND_KERNELS = {0: AttentionKernel.MATH, 1: AttentionKernel.FLASH, 2: AttentionKernel.EFFICIENT,
                    3: AttentionKernel.CUDNN}
_DEFAULT_PRIORITY = (1, 2, 0, 3, 4)
_CUDNN_FIRST = (AttentionKernel.CUDNN, AttentionKernel.FLASH, AttentionKernel.EFFICIENT, AttentionKernel.MATH)


def backend_switches(device_type: str) -> tuple:
    """What of torch's global state picks the attention kernels of a step on
    `device_type` besides the call: the backends switched on
    (`torch.backends.cuda.enable_*_sdp`, which `torch.nn.attention.sdpa_kernel`
    sets; the flash one also rules the CPU's kernel) in the order tried
    (`sdpa_kernel(..., set_priority=True)`), and whether math attention may
    reduce in half precision. A program compiled under other switches
    holds other kernels."""
    order = _cuda_order(CudaTarget()) if device_type == "cuda" else (AttentionKernel.CPU_FLASH, AttentionKernel.MATH)
    return (tuple((kernel.value, _switched_on(kernel)) for kernel in order),
            torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed())


# Each kernel's switch (the flash one rules the CPU's kernel too).
_SWITCHES = {AttentionKernel.CUDNN: torch.backends.cuda.cudnn_sdp_enabled,
             AttentionKernel.FLASH: torch.backends.cuda.flash_sdp_enabled,
             AttentionKernel.CPU_FLASH: torch.backends.cuda.flash_sdp_enabled,
             AttentionKernel.EFFICIENT: torch.backends.cuda.mem_efficient_sdp_enabled,
             AttentionKernel.MATH: torch.backends.cuda.math_sdp_enabled}


def _switched_on(kernel: AttentionKernel) -> bool:
    return _SWITCHES[kernel]()


def _cuda_order(target: CudaTarget) -> tuple[AttentionKernel, ...]:
    """The order eager tries kernels in: torch's priority order, which its
    first CUDA call replaces by cuDNN's first where cuDNN is preferred (an
    order the user set is kept)."""
    priority = tuple(torch._C._get_sdp_priority_order())
    if priority == _DEFAULT_PRIORITY and target.prefers_cudnn():
        return _CUDNN_FIRST
    return tuple(_BACKEND_KERNELS[backend] for backend in priority if backend in _BACKEND_KERNELS)


def _no_kernel(device: str, fits: dict[AttentionKernel, bool]) -> NoAttentionKernel:
    switched_off = [kernel.value for kernel in fits if not _switched_on(kernel)]
    unfit = [kernel.value for kernel, fit in fits.items() if _switched_on(kernel) and not fit]
    return NoAttentionKernel(
        f"scaled_dot_product_attention: no available kernel for this call on the {device} target, as in eager "
        f"PyTorch (switched off: {', '.join(switched_off) or 'none'}; on, but not taking these inputs: "
        f"{', '.join(unfit) or 'none'}); switch math attention back on (torch.backends.cuda.enable_math_sdp(True) "
        f"or sdpa_kernel's list) or change the call")


def cuda_attention_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attn_mask: torch.Tensor | None, is_causal: bool, enable_gqa: bool,
                          target: CudaTarget = CudaTarget()) -> AttentionKernel:
    """The kernel eager PyTorch picks on `target` for dense 4-D inputs: the
    first, in its priority order, that is switched on and takes the call,
    with the limits of the cuDNN that torch loads (`target.cudnn()`)."""
    dense = all(t.dim() == 4 and not t.is_nested and t.stride(-1) == 1 for t in (query, key, value))
    same_dtype = query.dtype == key.dtype == value.dtype
    batch, heads, seq_q, head_dim = query.shape
    seq_k, value_dim = key.shape[2], value.shape[-1]
    same_heads = heads == key.shape[1] == value.shape[1]
    grouped = enable_gqa and key.shape[1] == value.shape[1] and heads % key.shape[1] == 0
    fused = dense and same_dtype and (same_heads or grouped) and seq_q > 0 and seq_k > 0
    low_precision = query.dtype in _LOW_PRECISION
    deterministic = torch.are_deterministic_algorithms_enabled() and \
        not torch.is_deterministic_algorithms_warn_only_enabled()
    alignment = 4 if query.dtype == torch.float32 else 8
    fits = {
        AttentionKernel.CUDNN: (
            fused and low_precision and not deterministic and target.capability >= (8, 0)
            and target.cudnn() >= 90000 and head_dim == key.shape[-1] == value_dim and head_dim % 8 == 0
            and head_dim <= target.cudnn_head_dim_limit() and seq_k != 1 and batch <= _GRID_LIMIT
            and heads <= _GRID_LIMIT and (attn_mask is None or (attn_mask.dim() in (2, 4)
                                                                and not attn_mask.requires_grad))),
        AttentionKernel.FLASH: (
            fused and low_precision and attn_mask is None and head_dim == key.shape[-1] == value_dim
            and head_dim <= 256 and (not is_causal or seq_q == seq_k) and batch <= _GRID_LIMIT
            and heads <= _GRID_LIMIT),
        AttentionKernel.EFFICIENT: (
            fused and query.dtype in (*_LOW_PRECISION, torch.float32) and same_heads and head_dim == key.shape[-1]
            and head_dim % alignment == 0 and value_dim % alignment == 0
            and (attn_mask is None or attn_mask.stride(-1) == 1)),
        AttentionKernel.MATH: True,
    }
    for kernel in _cuda_order(target):
        if _switched_on(kernel) and fits[kernel]:
            return kernel
    raise _no_kernel("cuda", fits)


_CPU_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def cpu_attention_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attn_mask: torch.Tensor | None, dropout_p: float, enable_gqa: bool) -> AttentionKernel:
    """The kernel eager PyTorch picks on a CPU (its `sdp_utils_cpp` rules):
    the fused flash kernel for dense 4-D inputs of one dtype with equal
    heads (or grouped ones, with `enable_gqa`) and head widths, no dropout
    and a mask of (batch or 1, heads or 1, queries or 1, keys or 1) that
    takes no gradient, while `torch.backends.cuda.enable_flash_sdp` (one
    switch for both devices) is on; else math, while its switch is on.
    (Newer torch also takes flash for 3-D inputs; capture takes math there,
    as torch 2.11 does.)"""
    fits = {AttentionKernel.CPU_FLASH: _cpu_flash_fits(query, key, value, attn_mask, dropout_p, enable_gqa),
            AttentionKernel.MATH: True}
    for kernel, fit in fits.items():
        if _switched_on(kernel) and fit:
            return kernel
    raise _no_kernel("cpu", fits)


def _cpu_flash_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None, dropout_p: float, enable_gqa: bool) -> bool:
    tensors = (query, key, value)
    if not (dropout_p == 0.0 and all(t.dim() == 4 and not t.is_nested and t.stride(-1) == 1 for t in tensors)
            and query.dtype == key.dtype == value.dtype and query.dtype in _CPU_FLASH_DTYPES):
        return False
    batch, heads, seq_q, head_dim = query.shape
    kv_heads = key.shape[1]
    heads_fit = heads == kv_heads if not enable_gqa else heads % kv_heads == 0
    if not (batch == key.shape[0] == value.shape[0] and kv_heads == value.shape[1] and heads_fit
            and head_dim == key.shape[-1] == value.shape[-1] and seq_q > 0 and key.shape[2] > 0):
        return False
    if attn_mask is None:
        return True
    shape, seq_k = attn_mask.shape, key.shape[2]
    return (not attn_mask.requires_grad and attn_mask.dim() in (2, 4) and shape[-2] in (seq_q, 1)
            and shape[-1] in (seq_k, 1) and (attn_mask.dim() == 2 or (shape[0] in (batch, 1) and shape[1] in (heads, 1))))


def draws_random(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether a call of `op` touches the random generator. Torch tags every
    fused attention operator (flash, memory-efficient, cuDNN, and the
    backwards that replay their dropout) as seeded, since each can drop out;
    at `dropout_p` 0 none of them reads or advances the generator, so such a
    call is free to recompute under checkpointing like any other."""
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    for index, argument in enumerate(op._schema.arguments):
        if argument.name == "dropout_p":
            default = argument.default_value if argument.has_default_value() else None
            dropout = args[index] if index < len(args) else kwargs.get("dropout_p", default)
            return not (isinstance(dropout, float) and dropout == 0.0)
    return True


_FLASH_HEAD_ALIGNMENT = 8      # flash attention's head width, padded to it
_EFFICIENT_BIAS_ALIGNMENT = 8  # the memory-efficient kernel's bias strides


def _additive_mask(mask: torch.Tensor | None, dtype: torch.dtype, kernel: AttentionKernel) -> torch.Tensor | None:
    """`mask` as the kernel takes it: a boolean mask (True: attend) becomes
    the additive one eager's `scaled_dot_product_attention` makes before it
    calls any kernel, in the query's dtype: -inf where masked, or -65504
    for cuDNN (whose kernels mishandle -inf); a float mask is additive
    already. The kernels themselves add whatever they are given."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    fill = -65504.0 if kernel is AttentionKernel.CUDNN else -math.inf
    return torch.where(mask.logical_not(), fill, torch.zeros((), dtype=dtype, device=mask.device))


def _padded_to(tensor: torch.Tensor, alignment: int) -> torch.Tensor:
    """`tensor` with zeros after its last dimension up to a multiple of `alignment`."""
    extra = -tensor.shape[-1] % alignment
    return F.pad(tensor, (0, extra)) if extra else tensor


def _efficient_bias(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """An additive mask as eager hands it to the memory-efficient kernel:
    rows aligned (padded where a stride is not a multiple of 8, then sliced
    back) and expanded to (batch, heads, queries, keys)."""
    aligned = mask.stride(-1) == 1 and all(mask.stride(d) % _EFFICIENT_BIAS_ALIGNMENT == 0
                                           for d in range(mask.dim() - 1))
    if not aligned:
        width = mask.shape[-1]
        mask = F.pad(mask, (0, _EFFICIENT_BIAS_ALIGNMENT - width % _EFFICIENT_BIAS_ALIGNMENT))[..., :width]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


class FusedAttentionFor(TorchFunctionMode):
    """While capture traces, routes `F.scaled_dot_product_attention` to the
    fused operator `cuda_attention_kernel` picks; the operator's first
    result is the attention output."""

    def __init__(self, device: str, gpu: CudaTarget = CudaTarget()):
        super().__init__()
        if device not in TARGET_DEVICES:
            raise ValueError(f"unknown target device '{device}'; use one of {', '.join(TARGET_DEVICES)}")
        self.device, self.gpu = device, gpu
        self.chosen: list[AttentionKernel] = []
        # 4-D tensors repeated along the heads: the result -> (the tensor repeated, repeats).
        self._head_repeats = WeakIdKeyDictionary()

    def __enter__(self):
        # F.multi_head_attention_forward (nn.MultiheadAttention) reaches this
        # mode whole, and calls attention in its body by its global name,
        # which the mode does not see: there the name routes too.
        self._routing = patched(F, scaled_dot_product_attention=self._routed)
        self._routing.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self._routing.__exit__(None, None, None)
        return super().__exit__(*exc)

    def _routed(self, *args, **kwargs):
        return self.__torch_function__(_SDPA, (), args, kwargs)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _REPEAT_INTERLEAVE:
            result = func(*args, **kwargs)
            self._note_head_repeat(args, kwargs, result)
            return result
        if func is not _SDPA:
            return func(*args, **kwargs)
        call = _SDPA_PARAMETERS.bind(*args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        # Cast as autocast would cast for the call replaced: the kernel is chosen for the dtype it runs in.
        cast = as_autocast_casts("aten::scaled_dot_product_attention", self.device,
                                 (a["query"], a["key"], a["value"], a["attn_mask"]), to_fp32=False)
        if cast is None:
            return func(*args, **kwargs)
        q, k, v, mask = cast
        aten = torch.ops.aten
        if self.device == "cuda" and not a["enable_gqa"]:
            k, v, a["enable_gqa"] = self._unrepeated(q, k, v, mask, a["is_causal"])
        kernel = (cuda_attention_kernel(q, k, v, mask, a["is_causal"], a["enable_gqa"], self.gpu)
                  if self.device == "cuda" else cpu_attention_kernel(q, k, v, mask, a["dropout_p"], a["enable_gqa"]))
        self.chosen.append(kernel)
        mask = _additive_mask(mask, q.dtype, kernel)
        if kernel is AttentionKernel.MATH:
            # Math attention by name, whatever device the traced tensors are
            # on: autograd then differentiates its ops one by one.
            return aten._scaled_dot_product_attention_math(
                q, k, v, mask, a["dropout_p"], a["is_causal"], scale=a["scale"], enable_gqa=a["enable_gqa"])[0]
        if kernel is AttentionKernel.CPU_FLASH:
            return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, a["dropout_p"], a["is_causal"],
                                                                    attn_mask=mask, scale=a["scale"])[0]
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        # Grouped heads reach cuDNN's and flash's kernels unrepeated, as in
        # eager: both take fewer key/value heads (torch >= 2.8 for cuDNN).
        if kernel is AttentionKernel.CUDNN:
            return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, needs_grad, a["dropout_p"],
                                                            a["is_causal"], scale=a["scale"])[0]
        if kernel is AttentionKernel.FLASH:
            # Eager pads the heads to a multiple of 8 and scales by the unpadded width.
            head_dim = q.shape[-1]
            scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(head_dim)
            q, k, v = (_padded_to(t, _FLASH_HEAD_ALIGNMENT) for t in (q, k, v))
            out = aten._scaled_dot_product_flash_attention(q, k, v, a["dropout_p"], a["is_causal"], scale=scale)[0]
            return out[..., :head_dim] if out.shape[-1] != head_dim else out
        if mask is not None:
            mask = _efficient_bias(mask, q, k)
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, needs_grad, a["dropout_p"],
                                                            a["is_causal"], scale=a["scale"])[0]

    def _note_head_repeat(self, args, kwargs, result) -> None:
        """Remembers `result` if it is a 4-D tensor's heads (dimension 1)
        each repeated a whole number of times in place."""
        try:
            call = _REPEAT_PARAMETERS.bind(*args, **kwargs)
        except TypeError:
            return
        source, repeats, dim = call.arguments["input"], call.arguments["repeats"], call.arguments.get("dim")
        if (isinstance(source, torch.Tensor) and source.dim() == 4 and dim in (1, -3)
                and isinstance(repeats, int) and not isinstance(repeats, bool) and repeats >= 1
                and isinstance(result, torch.Tensor)):
            self._head_repeats[result] = (source, repeats)

    def _unrepeated(self, q, k, v, mask, is_causal) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(key, value, enable_gqa): the tensors `k` and `v` repeat, grouped,
        where both repeat their heads alike to the query's and the kernel
        eager runs the repeated call with on the target, cuDNN or flash
        attention, takes the grouped call too; else as given."""
        key, value = self._head_repeats.get(k), self._head_repeats.get(v)
        if key is None or value is None or key[1] != value[1] or q.dim() != 4:
            return k, v, False
        (k_heads, repeats), (v_heads, _) = key, value
        if q.shape[1] != k_heads.shape[1] * repeats or k_heads.shape[1] != v_heads.shape[1]:
            return k, v, False
        try:  # the kernel eager runs the repeated call with, taking the grouped one
            repeated = cuda_attention_kernel(q, k, v, mask, is_causal, False, self.gpu)
            grouped = cuda_attention_kernel(q, k_heads, v_heads, mask, is_causal, True, self.gpu)
        except NoAttentionKernel:  # the call as written says so
            return k, v, False
        if grouped is not repeated or grouped not in (AttentionKernel.CUDNN, AttentionKernel.FLASH):
            return k, v, False
        return k_heads, v_heads, True

"""`nn.TransformerEncoder`'s nested-tensor path, as eager takes it.

Where nothing in it takes a gradient (eval under `torch.no_grad()`, or a
frozen encoder in eval mode), eager PyTorch runs an encoder built with
`enable_nested_tensor` (the default) over a nested tensor of each
sequence's unpadded tokens when it is given a `src_key_padding_mask` whose
padding is all at the end of each sequence ("left-aligned"): the layers
compute the tokens as with the mask, and the padded positions come out as
zeros, then go through the final norm. The masked path computes them as
tokens that attend to the others. A loss or a pooling over every position
differs between the two (FSDP2 takes eager's path).

Capture cannot take the nested path: export traces the masked one (and
torch itself skips the nested path under torch.compile and export). So
while fsdpc captures, the encoder's forward computes the masked path and
then, where eager would have taken the nested one, zeros the padded
positions before the final norm. Whether the padding is left-aligned is
data: the step computes it and chooses per call, as eager's check does.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import transformer

from fsdpc.checkpointing import patched

FAST_PATH_SWITCH = "torch.backends.mha.get_fastpath_enabled()"


def _takes_nested_path(encoder: nn.TransformerEncoder, src: torch.Tensor, mask, padding) -> bool:
    """Eager's choice of the nested path, on what capture knows before the
    data (torch's TransformerEncoder.forward; whether the padding is
    left-aligned is decided in the step). Capture's own tensors are fake:
    eager's check for tensor subclasses is left out, since eager's are
    plain tensors (FSDP2's unsharded parameters too)."""
    first = encoder.layers[0]
    if not (torch.backends.mha.get_fastpath_enabled() and getattr(encoder, "use_nested_tensor", False)):
        return False
    if first.training or src.dim() != 3 or padding is None or mask is not None or src.is_nested:
        return False
    if torch.is_autocast_enabled():
        return False
    attention = first.self_attn
    read = (src, attention.in_proj_weight, attention.in_proj_bias, attention.out_proj.weight,
            attention.out_proj.bias, first.norm1.weight, first.norm1.bias, first.norm2.weight, first.norm2.bias,
            first.linear1.weight, first.linear1.bias, first.linear2.weight, first.linear2.bias)
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in read))


def _left_aligned(keep: torch.Tensor) -> torch.Tensor:
    """Whether every row of `keep` (batch x sequence, True for a token) is
    its tokens followed by its padding: a boolean of no dimensions."""
    positions = torch.arange(keep.shape[1], device=keep.device)
    return (keep == (positions < keep.sum(1, keepdim=True))).all()


def _encoder_forward_as_eager(original: Callable) -> Callable:
    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        padding = F._canonical_mask(mask=src_key_padding_mask, mask_name="src_key_padding_mask",
                                    other_type=F._none_or_dtype(mask), other_name="mask", target_type=src.dtype)
        canonical_mask = F._canonical_mask(mask=mask, mask_name="mask", other_type=None, other_name="",
                                           target_type=src.dtype, check_other=False)
        if not _takes_nested_path(self, src, canonical_mask, padding):
            return original(self, src, mask, src_key_padding_mask, is_causal)
        seq_len = transformer._get_seq_len(src, self.layers[0].self_attn.batch_first)
        is_causal = transformer._detect_is_causal_mask(None, is_causal, seq_len)
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=None, is_causal=is_causal, src_key_padding_mask=padding)
        keep = padding == 0  # the canonical mask is 0 for a token, -inf for padding
        zeroed = output.masked_fill(keep.logical_not().unsqueeze(-1), 0.0)
        output = torch.where(_left_aligned(keep), zeroed, output) if getattr(self, "mask_check", True) else zeroed
        return self.norm(output) if self.norm is not None else output

    return forward


def nested_encoders_as_eager() -> contextlib.AbstractContextManager:
    """While capture traces: nn.TransformerEncoder (and subclasses that
    call its forward) computes what eager's nested path would (above)."""
    return patched(nn.TransformerEncoder, forward=_encoder_forward_as_eager(nn.TransformerEncoder.forward))


def fast_path_reads(model: nn.Module) -> list[tuple[str, Callable[[], object]]]:
    """The switch that decides eager's nested path, where the model has an
    encoder that may take it: it keys the compiled steps, as the values a
    step reads do."""
    if any(isinstance(m, nn.TransformerEncoder) and getattr(m, "use_nested_tensor", False) for m in model.modules()):
        return [(FAST_PATH_SWITCH, torch.backends.mha.get_fastpath_enabled)]
    return []

"""clip.py's fused norm and scale against torch.nn.utils.clip_grad_norm_
(the sharded module's clip_grad_norm_ against eager's runs in test_api.py's
scenarios, and against a dead rank in test_failures.py)."""

import math

import pytest
import torch

from fsdpc import clip


def gradients(mixed: bool = False) -> list[torch.Tensor]:
    """fp32 gradients as a sharded module's are (fp32 master weights); with
    `mixed`, also a bf16 and an fp64 one."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5,), (), (2, 4, 3), (11,)]
    tensors = [torch.randn(shape, generator=generator) for shape in shapes]
    if mixed:
        tensors += [torch.randn(6, 2, generator=generator).to(torch.bfloat16),
                    torch.randn(9, generator=generator).double()]
    return tensors


def fsdpc_clip(tensors: list[torch.Tensor], max_norm: float, norm_type: float, split: int) -> torch.Tensor:
    """Clips as ShardedModule.clip_grad_norm_ does, with the tensors held by two groups."""
    terms = [clip.norm_terms(tensors[:split], norm_type, torch.device("cpu")),
             clip.norm_terms(tensors[split:], norm_type, torch.device("cpu"))]
    total = clip.global_norm(terms, norm_type)
    clip.scale_(tensors, max_norm, total)
    return total


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_the_fused_clip_equals_torchs(norm_type, max_norm):
    ours, theirs = gradients(), gradients()
    total = fsdpc_clip(ours, max_norm, norm_type, split=3)
    expected = torch.nn.utils.clip_grad_norm_(_with_grads(theirs), max_norm, norm_type)
    assert total.dtype == torch.float32 and total.dim() == 0
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=0)
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-7)
    if max_norm > total:  # not clipped: untouched, to the bit
        assert all(torch.equal(mine, original) for mine, original in zip(ours, gradients()))


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
def test_mixed_dtypes_are_normed_in_float64(norm_type):
    """torch's clip takes a bf16 gradient's norm in bf16 (2^-8 relative);
    here every norm accumulates in float64, and each tensor is scaled in
    its own dtype."""
    tensors = gradients(mixed=True)
    norms = torch.stack([torch.linalg.vector_norm(t.double(), norm_type) for t in tensors])
    expected = torch.linalg.vector_norm(norms, norm_type).float()
    originals = [t.clone() for t in tensors]
    total = fsdpc_clip(tensors, 0.5, norm_type, split=4)
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=0)
    coefficient = 0.5 / (expected + 1e-6)
    for clipped, original in zip(tensors, originals):
        assert clipped.dtype == original.dtype
        torch.testing.assert_close(clipped, (original * coefficient).to(original.dtype), rtol=1e-6, atol=1e-7)


def _with_grads(tensors: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    """Parameters whose gradients are `tensors` (clipped in place through them)."""
    params = []
    for tensor in tensors:
        param = torch.nn.Parameter(torch.empty_like(tensor))
        param.grad = tensor
        params.append(param)
    return params


def test_a_non_finite_norm_scales_nothing():
    tensors = gradients(mixed=True)
    tensors[1][2] = math.inf
    before = [t.clone() for t in tensors]
    total = fsdpc_clip(tensors, 0.5, 2.0, split=2)
    assert torch.isinf(total)
    assert all(torch.equal(after, original) for after, original in zip(tensors, before))


def test_no_gradients_have_norm_zero():
    total = clip.global_norm([clip.norm_terms([], 2.0, torch.device("cpu"))], 2.0)
    assert total.item() == 0.0 and total.dtype == torch.float32


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_an_empty_shard_adds_nothing(norm_type):
    """A rank holding no rows of a 1-row parameter (2 ranks): before
    2026-11-28 the infinity norm raised there while the other rank waited
    in the all-reduce."""
    grads = [torch.tensor([[3.0, -4.0]]), torch.empty(0, 2)]
    expected = clip.norm_terms(grads[:1], norm_type, torch.device("cpu"))
    torch.testing.assert_close(clip.norm_terms(grads, norm_type, torch.device("cpu")), expected)
    assert float(clip.norm_terms(grads[1:], norm_type, torch.device("cpu"))) == 0.0


def test_each_device_and_dtype_gets_one_group_in_first_seen_order():
    a, b, c = torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16), torch.zeros(3)
    assert [[id(t) for t in group] for group in clip.by_device_and_dtype([a, b, c])] == [[id(a), id(c)], [id(b)]]

"""Kernels over split halves (fsdp-fuse-pointwise's rewrite of half slices
and concatenations, the rotary embeddings' `rotate_half`) compute what the
calls they replace compute, and lay their results out as eager does.

Each case is a function of ATen calls (its arguments first copied
row-major: the batch's layout is the caller's, which fusion does not
assume); fsdp-fuse-pointwise rewrites it for
a CUDA step, and both versions run on the CPU through `ir_eval` (each
kernel's body call by call in its dtype, its results laid out by
TensorIterator's rule over the kernel's inputs): the results must be equal
to the bit, with the same strides, in f32 and bf16.
"""

import pytest
import torch

from fsdpc.compiler import run_fsdp_opt
from ir_eval import run_function


def ty(shape, dtype):
    return "tensor<" + "".join(f"{d}x" for d in shape) + dtype + ">"


def rotary_forward(dtype: str) -> tuple[str, list[list[int]]]:
    """q * cos + cat(-q[..., 4:], q[..., :4]) * sin on heads viewed from a
    matrix product's rows, permuted to [batch, heads, seq, dim]."""
    b, s, h, d = 2, 6, 3, 8
    q4, q = [b, s, h, d], [b, h, s, d]
    half = [b, h, s, d // 2]
    t = lambda shape: ty(shape, dtype)  # noqa: E731
    return f"""
func.func @case(%x: {t([b * s, h * d])}, %cos: {t([s, d])}, %sin: {t([s, d])}) -> {t(q)} {{
  %cosc = fsdp.aten "aten::clone"(%cos) args [0 : index, "contiguous_format"] : ({t([s, d])}) -> {t([s, d])}
  %sinc = fsdp.aten "aten::clone"(%sin) args [0 : index, "contiguous_format"] : ({t([s, d])}) -> {t([s, d])}
  %xc = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : ({t([b * s, h * d])}) -> {t([b * s, h * d])}
  %v = fsdp.aten "aten::view"(%xc) args [0 : index, {q4}] : ({t([b * s, h * d])}) -> {t(q4)}
  %q = fsdp.aten "aten::permute"(%v) args [0 : index, [0, 2, 1, 3]] : ({t(q4)}) -> {t(q)}
  %lo = fsdp.aten "aten::slice.Tensor"(%q) args [0 : index, 3, 0, {d // 2}, 1] : ({t(q)}) -> {t(half)}
  %hi = fsdp.aten "aten::slice.Tensor"(%q) args [0 : index, 3, {d // 2}, 9223372036854775807, 1] : ({t(q)}) -> {t(half)}
  %qc = fsdp.aten "aten::mul.Tensor"(%q, %cosc) : ({t(q)}, {t([s, d])}) -> {t(q)}
  %n = fsdp.aten "aten::neg"(%hi) : ({t(half)}) -> {t(half)}
  %r = fsdp.aten "aten::cat"(%n, %lo) args [[0 : index, 1 : index], -1] : ({t(half)}, {t(half)}) -> {t(q)}
  %rs = fsdp.aten "aten::mul.Tensor"(%r, %sinc) : ({t(q)}, {t([s, d])}) -> {t(q)}
  %out = fsdp.aten "aten::add.Tensor"(%qc, %rs) args [0 : index, 1 : index, 1] : ({t(q)}, {t(q)}) -> {t(q)}
  return %out : {t(q)}
}}""", [[b * s, h * d], [s, d], [s, d]]


def rotary_backward(dtype: str) -> tuple[str, list[list[int]]]:
    """g * cos + cat(y[..., 4:], -y[..., :4]), y = g * sin: halves of a
    product computed inside the kernel."""
    b, s, h, d = 2, 6, 3, 8
    g4, g = [b, s, h, d], [b, h, s, d]
    half = [b, h, s, d // 2]
    t = lambda shape: ty(shape, dtype)  # noqa: E731
    return f"""
func.func @case(%x: {t([b * s, h * d])}, %cos: {t([s, d])}, %sin: {t([s, d])}) -> {t([b * s, h * d])} {{
  %cosc = fsdp.aten "aten::clone"(%cos) args [0 : index, "contiguous_format"] : ({t([s, d])}) -> {t([s, d])}
  %sinc = fsdp.aten "aten::clone"(%sin) args [0 : index, "contiguous_format"] : ({t([s, d])}) -> {t([s, d])}
  %xc = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : ({t([b * s, h * d])}) -> {t([b * s, h * d])}
  %v = fsdp.aten "aten::view"(%xc) args [0 : index, {g4}] : ({t([b * s, h * d])}) -> {t(g4)}
  %g = fsdp.aten "aten::permute"(%v) args [0 : index, [0, 2, 1, 3]] : ({t(g4)}) -> {t(g)}
  %y = fsdp.aten "aten::mul.Tensor"(%g, %sinc) : ({t(g)}, {t([s, d])}) -> {t(g)}
  %lo = fsdp.aten "aten::slice.Tensor"(%y) args [0 : index, 3, 0, {d // 2}, 1] : ({t(g)}) -> {t(half)}
  %hi = fsdp.aten "aten::slice.Tensor"(%y) args [0 : index, 3, {d // 2}, {d}, 1] : ({t(g)}) -> {t(half)}
  %n = fsdp.aten "aten::neg"(%lo) : ({t(half)}) -> {t(half)}
  %gc = fsdp.aten "aten::mul.Tensor"(%g, %cosc) : ({t(g)}, {t([s, d])}) -> {t(g)}
  %r = fsdp.aten "aten::cat"(%hi, %n) args [[0 : index, 1 : index], 3] : ({t(half)}, {t(half)}) -> {t(g)}
  %out = fsdp.aten "aten::add.Tensor"(%gc, %r) args [0 : index, 1 : index, 1] : ({t(g)}, {t(g)}) -> {t(g)}
  %p = fsdp.aten "aten::permute"(%out) args [0 : index, [0, 2, 1, 3]] : ({t(g)}) -> {t(g4)}
  %flat = fsdp.aten "aten::view"(%p) args [0 : index, [{b * s}, {h * d}]] : ({t(g4)}) -> {t([b * s, h * d])}
  return %flat : {t([b * s, h * d])}
}}""", [[b * s, h * d], [s, d], [s, d]]


def middle_dimension(dtype: str) -> tuple[str, list[list[int]]]:
    """Halves of a middle dimension swapped and scaled: the half index
    broadcasts over the dimensions after it."""
    t = lambda shape: ty(shape, dtype)  # noqa: E731
    return f"""
func.func @case(%x: {t([3, 8, 5])}, %w: {t([8, 1])}) -> {t([3, 8, 5])} {{
  %xc = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : ({t([3, 8, 5])}) -> {t([3, 8, 5])}
  %wc = fsdp.aten "aten::clone"(%w) args [0 : index, "contiguous_format"] : ({t([8, 1])}) -> {t([8, 1])}
  %x1 = fsdp.aten "aten::exp"(%xc) : ({t([3, 8, 5])}) -> {t([3, 8, 5])}
  %lo = fsdp.aten "aten::slice.Tensor"(%x1) args [0 : index, 1, 0, 4, 1] : ({t([3, 8, 5])}) -> {t([3, 4, 5])}
  %hi = fsdp.aten "aten::slice.Tensor"(%x1) args [0 : index, 1, 4, 8, 1] : ({t([3, 8, 5])}) -> {t([3, 4, 5])}
  %s = fsdp.aten "aten::sigmoid"(%lo) : ({t([3, 4, 5])}) -> {t([3, 4, 5])}
  %r = fsdp.aten "aten::cat"(%hi, %s) args [[0 : index, 1 : index], 1] : ({t([3, 4, 5])}, {t([3, 4, 5])}) -> {t([3, 8, 5])}
  %out = fsdp.aten "aten::mul.Tensor"(%r, %wc) : ({t([3, 8, 5])}, {t([8, 1])}) -> {t([3, 8, 5])}
  return %out : {t([3, 8, 5])}
}}""", [[3, 8, 5], [8, 1]]


def gated_half(dtype: str) -> tuple[str, list[list[int]]]:
    """GLU, `x[..., :4] * sigmoid(x[..., 4:])`: its result is a half, which
    a kernel over halves does not hand out; the calls stay."""
    t = lambda shape: ty(shape, dtype)  # noqa: E731
    return f"""
func.func @case(%x: {t([4, 8])}) -> {t([4, 4])} {{
  %xc = fsdp.aten "aten::clone"(%x) args [0 : index, "contiguous_format"] : ({t([4, 8])}) -> {t([4, 8])}
  %x1 = fsdp.aten "aten::exp"(%xc) : ({t([4, 8])}) -> {t([4, 8])}
  %lo = fsdp.aten "aten::slice.Tensor"(%x1) args [0 : index, 1, 0, 4, 1] : ({t([4, 8])}) -> {t([4, 4])}
  %hi = fsdp.aten "aten::slice.Tensor"(%x1) args [0 : index, 1, 4, 8, 1] : ({t([4, 8])}) -> {t([4, 4])}
  %s = fsdp.aten "aten::sigmoid"(%hi) : ({t([4, 4])}) -> {t([4, 4])}
  %out = fsdp.aten "aten::mul.Tensor"(%lo, %s) : ({t([4, 4])}, {t([4, 4])}) -> {t([4, 4])}
  return %out : {t([4, 4])}
}}""", [[4, 8]]


CASES = {"rotary_forward": (rotary_forward, True), "rotary_backward": (rotary_backward, True),
         "middle_dimension": (middle_dimension, True), "gated_half": (gated_half, False)}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_over_halves_equals_the_calls(case, dtype):
    build, fuses = CASES[case]
    body, shapes = build(dtype)
    module = 'module attributes {fsdp.device = "cuda"} {' + body + "\n}\n"
    fused = run_fsdp_opt(module, ["--fsdp-fuse-pointwise"])
    if fuses:
        assert '"aten::where.self"' in fused and '"aten::cat"' not in fused, fused
    else:
        assert "fsdp.pointwise" not in fused or '"aten::slice.Tensor"(%' in fused, fused
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    generator = torch.Generator().manual_seed(0)
    arguments = [torch.randn(shape, generator=generator).to(torch_dtype) for shape in shapes]
    (expected,) = run_function(module, "case", arguments)
    (got,) = run_function(fused, "case", arguments)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected)
    assert all(size == 1 or a == b for size, a, b in zip(got.shape, got.stride(), expected.stride())), (
        got.stride(), expected.stride())

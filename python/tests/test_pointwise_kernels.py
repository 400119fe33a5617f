"""Generated elementwise kernels (fsdp.pointwise) without a GPU.

- The Llama step captured for CUDA fuses its elementwise chains: fewer
  instructions, kernels deduplicated across layers; a CPU step keeps ATen's
  calls. Fusion never raises the step's peak (the default Llama and one of
  the 70B's proportions, at 1 to 8 ranks, with recomputation or without).
- Every kernel of that program compiles, as the runtime prints it around
  the element function, with the runtime's NVRTC for sm_90; a source NVRTC
  refuses is an error with its log. The loader refuses kernels whose loop
  would leave a tensor, write an output element twice or not at all, or
  launch what CUDA refuses.
- Every operator of the table (fsdp/Dialect/Pointwise.h) computes what ATen
  computes, f32 and bf16: the runtime's whole kernel, compiled for the host
  with g++ and run over its grid one thread at a time, against the ATen
  operator on CPU; so do a broadcasting chain (RMSNorm's tail), the rotary
  embeddings over halves and a kernel over a transposed input, aligned and
  not (the loop then goes one element at a time).
- Where a GPU is present (`make test-gpu` runs this file too), the runtime
  compiles, loads and launches the same kernels, f32 and bf16, against ATen
  on the GPU.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from fsdpc.__main__ import main
from fsdpc.compiler import run_fsdp_opt
from fsdpc.program import Program, ProgramError, translate

aten = torch.ops.aten


@pytest.fixture(scope="module")
def llama_bf16(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("pointwise") / "llama.mlir"
    assert main(["export", "--model", "llama", "--device", "cuda", "--param-dtype", "bf16",
                 "--reduce-dtype", "f32", "--out", str(out)]) == 0
    return out.read_text()


def sharded(ir: str, options: str) -> str:
    return run_fsdp_opt(ir, [f"--fsdp-sharding-pipeline=ranks=2 backend=nccl {options}"])


def peak(ir: str, options: str, ranks: int = 2) -> int:
    report = run_fsdp_opt(ir, [f"--fsdp-sharding-pipeline=ranks={ranks} backend=nccl report-format=json "
                               f"memory-report=- {options}", "-o", "/dev/null"])
    return json.loads(report)[0]["peak"]["above_step_start"]


def test_the_llama_step_fuses_its_chains(llama_bf16):
    fused, unfused = sharded(llama_bf16, ""), sharded(llama_bf16, "fuse-pointwise=false")
    program, plain = translate(fused), translate(unfused)
    kernels = json.loads(program.text)["kernels"]
    calls = program.functions["train_step"].instructions
    # Per layer at least the rotary and SwiGLU chains each way (its norms are fused calls of their own).
    assert fused.count("fsdp.pointwise") >= 6 * 2 and "fsdp.pointwise" not in unfused
    assert calls < plain.functions["train_step"].instructions - 20
    # Two identical layers share their kernels: fewer kernels than fused ops.
    assert 0 < len(kernels) < fused.count("= fsdp.pointwise")
    assert json.loads(plain.text)["kernels"] == []


@pytest.fixture(scope="module")
def wide_ffn_llama() -> str:
    """The 70B Llama's proportions at toy size (a feed-forward 3.5x wide, few
    KV heads, a small vocabulary): the step's peak falls in the last layer's
    backward, among SwiGLU's gradients, where kernels that hold their calls'
    operands until they run could raise it (by 2% here before fusion was
    held to the peak)."""
    from fsdpc.export import export_training_step
    from fsdpc.capture import MixedPrecision
    from fsdpc.models.llama import LlamaConfig, _make

    with torch.device("meta"):
        model, batch, loss_fn = _make(LlamaConfig(vocab_size=1024, dim=512, n_layers=4, n_heads=8, n_kv_heads=2,
                                                  ffn_dim=1792, max_seq=512), 1, 512)
    precision = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return export_training_step(model, batch, loss_fn, mixed_precision=precision, device="cuda").mlir


def half_index_bytes(ir: str) -> int:
    """The [2, 2] identities (in the kernel's element type) that kernels over
    halves read (rotary embeddings), made once at the step's start: the one
    allocation fusion adds."""
    element_bytes = {"f32": 4, "bf16": 2, "f16": 2}
    return sum(4 * element_bytes[dtype] for dtype in re.findall(r'"aten::eye"\(\) args \[2, (\w+),', ir))


def live_bytes(ir: str, frees: str) -> tuple[list[int], int]:
    """`fsdp-test-live-bytes`: the bytes live after each op, and the peak."""
    out = run_fsdp_opt(ir, [f"--fsdp-test-live-bytes=frees={frees}"])
    after = re.search(r"test\.live_after = array<i64: ([0-9, ]*)>", out).group(1)
    return [int(n) for n in after.split(", ")], int(re.search(r"test\.live_peak = (\d+)", out).group(1))


@pytest.mark.parametrize("ranks, options", [(1, ""), (8, "checkpoint=*")])
@pytest.mark.parametrize("model", ["llama_bf16", "wide_ffn_llama"])
def test_the_guard_frees_where_plan_lifetimes_releases(request, model, ranks, options):
    """The rule fusion's peak guard plans by, before any release exists
    (storage freed after its last use), gives the bytes the memory model
    gives after each op of the step as plan-lifetimes releases it."""
    planned = run_fsdp_opt(request.getfixturevalue(model),
                           [f"--fsdp-sharding-pipeline=ranks={ranks} backend=nccl {options}"])
    stripped = re.sub(r"^\s*fsdp\.release .*\n", "", planned, flags=re.MULTILINE)
    assert "fsdp.release" in planned and "fsdp.release" not in stripped
    assert live_bytes(stripped, "last-use") == live_bytes(planned, "releases")


@pytest.mark.parametrize("ranks, options", [(2, ""), (1, ""), (8, ""), (8, "checkpoint=*"),
                                            (8, "selective-recompute=false")])
@pytest.mark.parametrize("model", ["llama_bf16", "wide_ffn_llama"])
def test_fusion_never_raises_the_peak(request, model, ranks, options):
    ir = request.getfixturevalue(model)
    fused = run_fsdp_opt(ir, [f"--fsdp-sharding-pipeline=ranks={ranks} backend=nccl {options}"])
    assert "fsdp.pointwise" in fused
    assert peak(ir, options, ranks) <= peak(ir, f"fuse-pointwise=false {options}", ranks) + half_index_bytes(fused)


SWIGLU_GRADIENTS = """module attributes {fsdp.device = "cuda"} {
func.func @case(%x: tensor<64x64xbf16>, %gate: tensor<64x64xbf16>, %up: tensor<64x64xbf16>, %y: tensor<1024x64xbf16>) -> (tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<1024x1xbf16>) {
  %wide = fsdp.aten "aten::mm"(%y, %x) : (tensor<1024x64xbf16>, tensor<64x64xbf16>) -> tensor<1024x64xbf16>
  %peak = fsdp.aten "aten::sum.dim_IntList"(%wide) args [0 : index, [1], true, unit] : (tensor<1024x64xbf16>) -> tensor<1024x1xbf16>
  %gd = fsdp.aten "aten::clone"(%gate) args [0 : index, "contiguous_format"] : (tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %ud = fsdp.aten "aten::clone"(%up) args [0 : index, "contiguous_format"] : (tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %s = fsdp.aten "aten::silu"(%gd) : (tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %h = fsdp.aten "aten::mul.Tensor"(%s, %ud) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %dh = fsdp.aten "aten::mm"(%h, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %g = fsdp.aten "aten::mm"(%dh, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %gu = fsdp.aten "aten::mul.Tensor"(%g, %s) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %dw = fsdp.aten "aten::mm"(%gu, %x) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %a = fsdp.aten "aten::mul.Tensor"(%g, %ud) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  %gg = fsdp.aten "aten::silu_backward"(%a, %gd) : (tensor<64x64xbf16>, tensor<64x64xbf16>) -> tensor<64x64xbf16>
  return %dh, %dw, %gg, %peak : tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<64x64xbf16>, tensor<1024x1xbf16>
}
}
"""


def test_swiglu_gradients_as_kernels_compute_what_their_calls_compute():
    """SwiGLU forward and its input gradients as two kernels: the gate's
    gradient moved up to the up projection's (siblings, across a weight
    gradient's mm), silu(gate) computed again inside instead of read from
    the forward kernel, which writes only the product. They equal the calls
    within bf16's rounding (a kernel rounds only what it writes)."""
    from ir_eval import run_function

    fused = run_fsdp_opt(SWIGLU_GRADIENTS, ["--fsdp-fuse-pointwise"])
    kernels = re.findall(r"= fsdp.pointwise\((.*)\) : \(.*\) -> (.*) \{", fused)
    assert [(len(inputs.split(", ")), results.count("tensor<")) for inputs, results in kernels] == [(2, 1), (3, 2)], fused
    generator = torch.Generator().manual_seed(0)
    arguments = [(torch.randn(shape, generator=generator) / 8).to(torch.bfloat16)
                 for shape in [(64, 64)] * 3 + [(1024, 64)]]
    expected, got = run_function(SWIGLU_GRADIENTS, "case", arguments), run_function(fused, "case", arguments)
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-2, atol=1e-2)


def test_a_cpu_step_keeps_aten_calls(tmp_path):
    out = tmp_path / "llama-cpu.mlir"
    assert main(["export", "--model", "llama", "--device", "cpu", "--out", str(out)]) == 0
    program = translate(sharded(out.read_text(), ""))
    assert json.loads(program.text)["kernels"] == []


def damaged(text: str, how: str) -> str:
    program = json.loads(text)
    kernel = program["kernels"][0]
    call = next(inst for inst in program["functions"][0]["instructions"] if inst["op"] == "pointwise")
    if how == "cpu program":
        program["device"] = "cpu"
    elif how == "arity":
        kernel["inputs"].append(kernel["inputs"][0])
    elif how == "too many":
        kernel["outputs"] = kernel["outputs"] * 9
    elif how == "index":
        call["kernel"] = len(program["kernels"])
    elif how == "name":
        kernel["name"] = "fsdp pointwise"
    elif how == "twice":
        program["kernels"].append(dict(kernel))
    elif how == "undefined":
        kernel["source"] = kernel["source"].replace(kernel["name"], "other")
    elif how == "dtype":
        kernel["element_type"] = "i64"
    elif how == "past the input":
        kernel["inputs"][0]["steps"][-1] += 1
    elif how == "past the output":
        kernel["outputs"][0]["shape"][0] -= 1
    elif how == "overlapping output":
        kernel["outputs"][0]["steps"][0] = 0
    elif how == "steps":
        kernel["inputs"][0]["steps"].append(0)
    elif how == "vector":
        kernel["vector"] = 3
    elif how == "wide vector":
        kernel["vector"] = 16
    elif how == "block":
        kernel["block"] = 2048
    elif how == "grid":
        kernel["grid"] += 1
    return json.dumps(program)


@pytest.mark.parametrize("how, message", [
    ("cpu program", "generated kernels run on cuda, and the program is for cpu"),
    ("arity", "pointwise takes"),
    ("too many", "a kernel takes and makes 1 to 8"),
    ("index", "is outside the program's"),
    ("name", "the name is not a C++ identifier"),
    ("twice", "is listed twice"),
    ("undefined", "the source does not define it"),
    ("dtype", "kernels compute f32, bf16 or f16"),
    ("past the input", "past the tensor's last"),
    ("past the output", "past the tensor's last"),
    ("overlapping output", "not written densely, each of its elements once"),
    ("steps", "steps for"),
    ("vector", "vector width 3 is not a power of two"),
    ("wide vector", "vector width 16 is not a power of two of at most 16 bytes"),
    ("block", "a block is 32 to 1024 threads"),
    ("grid", "iterations, which need at most"),
])
def test_the_loader_refuses_damaged_kernels(llama_bf16, how, message):
    text = translate(sharded(llama_bf16, "")).text
    Program.parse(text)
    with pytest.raises(ProgramError, match=re.escape(message)):
        Program.parse(damaged(text, how))


def compiles(program: Program, index: int) -> bytes:
    """Kernel `index` compiled by the runtime with NVRTC for an H100 (sm_90)."""
    try:
        return program.loaded.compile_kernel(index, 90)
    except RuntimeError as error:
        if "built against a torch without CUDA" in str(error):
            pytest.skip("this torch has no CUDA: the runtime compiles no kernels")
        raise


def test_every_llama_kernel_compiles_with_nvrtc(llama_bf16):
    program = translate(sharded(llama_bf16, ""))
    kernels = json.loads(program.text)["kernels"]
    assert kernels
    for index, kernel in enumerate(kernels):
        assert compiles(program, index).startswith(b"\x7fELF"), kernel["name"]
    # The check can fail: a source NVRTC refuses is an error naming the kernel, with NVRTC's log.
    text = json.loads(program.text)
    text["kernels"][0]["source"] = text["kernels"][0]["source"].replace(";", "", 1)
    with pytest.raises(RuntimeError, match=r"kernel fsdp_pointwise_0 does not compile for sm_90(.|\n)*error"):
        compiles(Program.parse(json.dumps(text)), 0)


def mlir_type(shape: tuple[int, ...]) -> str:
    return "tensor<" + "".join(f"{dim}x" for dim in shape) + "f32>"


# (name, callee, input shapes, args, ATen reference over the inputs, inputs kept positive)
CASES = [
    ("add", "aten::add.Tensor", [(64,), (64,)], "[0 : index, 1 : index, 2.5]",
     lambda a, b: aten.add.Tensor(a, b, alpha=2.5), False),
    ("add_number", "aten::add.Tensor", [(64,)], "[0 : index, 0.25, 1]", lambda a: aten.add.Tensor(a, 0.25), False),
    ("sub", "aten::sub.Tensor", [(64,), (64,)], "[0 : index, 1 : index, 1]", lambda a, b: aten.sub.Tensor(a, b), False),
    ("add_scalar", "aten::add.Scalar", [(64,)], "[0 : index, 3, 2]", lambda a: aten.add.Scalar(a, 3, alpha=2), False),
    ("sub_scalar", "aten::sub.Scalar", [(64,)], "[0 : index, 1.5, 1]", lambda a: aten.sub.Scalar(a, 1.5), False),
    ("mul", "aten::mul.Tensor", [(64,), (64,)], None, lambda a, b: aten.mul.Tensor(a, b), False),
    ("mul_scalar", "aten::mul.Scalar", [(64,)], "[0 : index, -0.5]", lambda a: aten.mul.Scalar(a, -0.5), False),
    ("div", "aten::div.Tensor", [(64,), (64,)], None, lambda a, b: aten.div.Tensor(a, b), True),
    ("div_scalar", "aten::div.Scalar", [(64,)], "[0 : index, 64]", lambda a: aten.div.Scalar(a, 64), False),
    ("pow2", "aten::pow.Tensor_Scalar", [(64,)], "[0 : index, 2]", lambda a: aten.pow.Tensor_Scalar(a, 2), False),
    ("pow3", "aten::pow.Tensor_Scalar", [(64,)], "[0 : index, 3]", lambda a: aten.pow.Tensor_Scalar(a, 3), False),
    ("pow_half", "aten::pow.Tensor_Scalar", [(64,)], "[0 : index, 0.5]",
     lambda a: aten.pow.Tensor_Scalar(a, 0.5), True),
    ("pow_minus_one", "aten::pow.Tensor_Scalar", [(64,)], "[0 : index, -1]",
     lambda a: aten.pow.Tensor_Scalar(a, -1), True),
    ("pow_minus_half", "aten::pow.Tensor_Scalar", [(64,)], "[0 : index, -0.5]",
     lambda a: aten.pow.Tensor_Scalar(a, -0.5), True),
    ("pow_other", "aten::pow.Tensor_Scalar", [(64,)], "[0 : index, 1.7]",
     lambda a: aten.pow.Tensor_Scalar(a, 1.7), True),
    ("neg", "aten::neg", [(64,)], None, aten.neg, False),
    ("reciprocal", "aten::reciprocal", [(64,)], None, aten.reciprocal, True),
    ("rsqrt", "aten::rsqrt", [(64,)], None, aten.rsqrt, True),
    ("sqrt", "aten::sqrt", [(64,)], None, aten.sqrt, True),
    ("exp", "aten::exp", [(64,)], None, aten.exp, False),
    ("tanh", "aten::tanh", [(64,)], None, aten.tanh, False),
    ("sigmoid", "aten::sigmoid", [(64,)], None, aten.sigmoid, False),
    ("silu", "aten::silu", [(64,)], None, aten.silu, False),
    ("relu", "aten::relu", [(64,)], None, aten.relu, False),
    ("silu_backward", "aten::silu_backward", [(64,), (64,)], None, aten.silu_backward, False),
    ("sigmoid_backward", "aten::sigmoid_backward", [(64,), (64,)], None, aten.sigmoid_backward, False),
    ("tanh_backward", "aten::tanh_backward", [(64,), (64,)], None, aten.tanh_backward, False),
    ("threshold_backward", "aten::threshold_backward", [(64,), (64,)], "[0 : index, 1 : index, 0.25]",
     lambda g, x: aten.threshold_backward(g, x, 0.25), False),
    ("gelu", "aten::gelu", [(64,)], None, aten.gelu, False),
    ("gelu_tanh", "aten::gelu", [(64,)], '[0 : index, "tanh"]', lambda a: aten.gelu(a, approximate="tanh"), False),
    ("gelu_backward", "aten::gelu_backward", [(64,), (64,)], None, aten.gelu_backward, False),
    ("gelu_tanh_backward", "aten::gelu_backward", [(64,), (64,)], '[0 : index, 1 : index, "tanh"]',
     lambda g, x: aten.gelu_backward(g, x, approximate="tanh"), False),
]


def single_call(name: str, callee: str, shapes, args: str | None) -> str:
    arguments = ", ".join(f"%in{i}: {mlir_type(shape)}" for i, shape in enumerate(shapes))
    operands = ", ".join(f"%in{i}" for i in range(len(shapes)))
    inner = ", ".join(f"%a{i}" for i in range(len(shapes)))
    types = ", ".join(mlir_type(shape) for shape in shapes)
    block = ", ".join(f"%a{i}: {mlir_type(shape)}" for i, shape in enumerate(shapes))
    out = mlir_type(shapes[0])
    args_text = f" args {args}" if args else ""
    return (f"func.func @{name}({arguments}) -> {out} {{\n"
            f"  %y = fsdp.pointwise ({operands}) : ({types}) -> {out} {{\n"
            f"  ^bb0({block}):\n"
            f'    %r = fsdp.aten "{callee}"({inner}){args_text} : ({types}) -> {out}\n'
            f"    fsdp.yield %r : {out}\n  }}\n  return %y : {out}\n}}\n")


RMSNORM_TAIL = """func.func @rmsnorm_tail(%x: tensor<4x8xf32>, %ms: tensor<4x1xf32>, %w: tensor<8xf32>) -> tensor<4x8xf32> {
  %y = fsdp.pointwise (%x, %ms, %w) : (tensor<4x8xf32>, tensor<4x1xf32>, tensor<8xf32>) -> tensor<4x8xf32> {
  ^bb0(%a: tensor<4x8xf32>, %b: tensor<4x1xf32>, %c: tensor<8xf32>):
    %e = fsdp.aten "aten::add.Tensor"(%b) args [0 : index, 1.0e-05, 1] : (tensor<4x1xf32>) -> tensor<4x1xf32>
    %r = fsdp.aten "aten::rsqrt"(%e) : (tensor<4x1xf32>) -> tensor<4x1xf32>
    %n = fsdp.aten "aten::mul.Tensor"(%a, %r) : (tensor<4x8xf32>, tensor<4x1xf32>) -> tensor<4x8xf32>
    %s = fsdp.aten "aten::mul.Tensor"(%n, %c) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    fsdp.yield %s : tensor<4x8xf32>
  }
  return %y : tensor<4x8xf32>
}
"""

# The rotary embeddings as a kernel over split halves (fsdp-fuse-pointwise's
# rewrite of `q * cos + cat(-q[..., 4:], q[..., :4]) * sin`): the query split
# [..., 2, 4], its halves, the tables split alike, and which half an element
# is in (0 or 1 in the kernel's dtype, compared inside: no bool input).
ROTARY_HALVES = """func.func @rotary_halves(%q: tensor<2x2x4x2x4xf32>, %c: tensor<4x2x4xf32>, %hi: tensor<2x2x4x1x4xf32>, %lo: tensor<2x2x4x1x4xf32>, %s: tensor<4x2x4xf32>, %h: tensor<2x1xf32>) -> tensor<2x2x4x2x4xf32> {
  %y = fsdp.pointwise (%q, %c, %hi, %lo, %s, %h) : (tensor<2x2x4x2x4xf32>, tensor<4x2x4xf32>, tensor<2x2x4x1x4xf32>, tensor<2x2x4x1x4xf32>, tensor<4x2x4xf32>, tensor<2x1xf32>) -> tensor<2x2x4x2x4xf32> {
  ^bb0(%a: tensor<2x2x4x2x4xf32>, %b: tensor<4x2x4xf32>, %d: tensor<2x2x4x1x4xf32>, %e: tensor<2x2x4x1x4xf32>, %f: tensor<4x2x4xf32>, %g: tensor<2x1xf32>):
    %qc = fsdp.aten "aten::mul.Tensor"(%a, %b) : (tensor<2x2x4x2x4xf32>, tensor<4x2x4xf32>) -> tensor<2x2x4x2x4xf32>
    %n = fsdp.aten "aten::neg"(%d) : (tensor<2x2x4x1x4xf32>) -> tensor<2x2x4x1x4xf32>
    %second = fsdp.aten "aten::ne.Scalar"(%g) args [0 : index, 0] : (tensor<2x1xf32>) -> tensor<2x1xi1>
    %r = fsdp.aten "aten::where.self"(%second, %e, %n) : (tensor<2x1xi1>, tensor<2x2x4x1x4xf32>, tensor<2x2x4x1x4xf32>) -> tensor<2x2x4x2x4xf32>
    %rs = fsdp.aten "aten::mul.Tensor"(%r, %f) : (tensor<2x2x4x2x4xf32>, tensor<4x2x4xf32>) -> tensor<2x2x4x2x4xf32>
    %o = fsdp.aten "aten::add.Tensor"(%qc, %rs) args [0 : index, 1 : index, 1] : (tensor<2x2x4x2x4xf32>, tensor<2x2x4x2x4xf32>) -> tensor<2x2x4x2x4xf32>
    fsdp.yield %o : tensor<2x2x4x2x4xf32>
  }
  return %y : tensor<2x2x4x2x4xf32>
}
"""


def rotary_halves_inputs(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The kernel's inputs for query `q` [2, 2, 4, 8] (any strides) and
    tables [4, 8], and what the calls it replaces compute, split alike."""
    q2 = q.view(2, 2, 4, 2, 4)
    half = torch.tensor([[0.0], [1.0]], device=q.device, dtype=q.dtype)
    inputs = [q2, cos.view(4, 2, 4), q2[..., 1:2, :], q2[..., 0:1, :], sin.view(4, 2, 4), half]
    qf, cf, sf = q.float(), cos.float(), sin.float()
    rotated = torch.cat([-qf[..., 4:], qf[..., :4]], dim=-1)
    return inputs, (qf * cf + rotated * sf).view(2, 2, 4, 2, 4)


# A transposed input (it orders the loop: its inner dimension is the
# output's), a row-major one read across that (one element at a time) and a
# column broadcast along the outer dimension.
STRIDED = """func.func @strided(%a: tensor<8x64xf32>, %b: tensor<8x1xf32>, %c: tensor<64x8xf32>) -> tensor<8x64xf32> {
  %t = fsdp.aten "aten::t"(%c) : (tensor<64x8xf32>) -> tensor<8x64xf32>
  %y = fsdp.pointwise (%t, %a, %b) : (tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x1xf32>) -> tensor<8x64xf32> {
  ^bb0(%x: tensor<8x64xf32>, %z: tensor<8x64xf32>, %w: tensor<8x1xf32>):
    %m = fsdp.aten "aten::mul.Tensor"(%x, %z) : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>
    %s = fsdp.aten "aten::sub.Tensor"(%m, %w) args [0 : index, 1 : index, 1] : (tensor<8x64xf32>, tensor<8x1xf32>) -> tensor<8x64xf32>
    fsdp.yield %s : tensor<8x64xf32>
  }
  return %y : tensor<8x64xf32>
}
"""


def table_module(dtype: str = "f32") -> str:
    """A CUDA module of one function per table operator, RMSNorm's tail, the
    rotary embeddings over halves and the strided kernel."""
    functions = "".join(single_call(name, callee, shapes, args) for name, callee, shapes, args, _, _ in CASES)
    return (f'module attributes {{fsdp.device = "cuda"}} {{\n{functions}{RMSNORM_TAIL}{ROTARY_HALVES}{STRIDED}}}\n'
            .replace("f32>", f"{dtype}>"))


# The CUDA built-ins the runtime's kernels use, for the host: one thread at a
# time runs the kernel's body over the launch's grid.
HOST_PRELUDE = """#include <math.h>
#include <string.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
struct fsdp_dim { unsigned x; };
static fsdp_dim blockIdx, threadIdx, blockDim, gridDim;
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(threads)
#define __restrict__
"""


def host_program(program: Program) -> str:
    """The program's kernels as the runtime compiles them (each in a
    namespace of its own) and a main that launches kernel argv[1]: stdin
    holds, per tensor, its byte size, its first element's byte offset and
    (inputs) its bytes; stdout gets the outputs' bytes."""
    kernels = json.loads(program.text)["kernels"]
    parts = [HOST_PRELUDE]
    for index in range(len(kernels)):
        parts.append(f"namespace k{index} {{\n{program.loaded.kernel_source(index)}}}\n")
    parts.append("int main(int argc, char** argv) {\n  int which = std::atoi(argv[1]);\n"
                 "  std::vector<std::vector<unsigned char>> data(16);\n  std::vector<uint64_t> offset(16);\n"
                 "  auto take = [&](int i, bool input) {\n    uint64_t size = 0;\n"
                 "    if (std::fread(&size, 8, 1, stdin) != 1 || std::fread(&offset[i], 8, 1, stdin) != 1) std::abort();\n"
                 "    data[i].resize(size);\n"
                 "    if (input && size && std::fread(data[i].data(), 1, size, stdin) != size) std::abort();\n"
                 "  };\n  switch (which) {\n")
    for index, kernel in enumerate(kernels):
        ins, outs = len(kernel["inputs"]), len(kernel["outputs"])
        pointers = [f"(const k{index}::fsdp_storage*)(data[{i}].data() + offset[{i}])" for i in range(ins)]
        pointers += [f"(k{index}::fsdp_storage*)(data[{ins + i}].data() + offset[{ins + i}])" for i in range(outs)]
        parts.append(f"  case {index}:\n    for (int i = 0; i < {ins}; ++i) take(i, true);\n"
                     f"    for (int i = {ins}; i < {ins + outs}; ++i) take(i, false);\n"
                     f"    blockDim.x = {kernel['block']}; gridDim.x = {kernel['grid']};\n"
                     f"    for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x)\n"
                     f"      for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x)\n"
                     f"        k{index}::{kernel['name']}_kernel({', '.join(pointers)});\n"
                     f"    for (int i = {ins}; i < {ins + outs}; ++i) std::fwrite(data[i].data(), 1, data[i].size(), stdout);\n"
                     f"    break;\n")
    parts.append("  }\n}\n")
    return "".join(parts)


class HostKernels:
    """A program's kernels compiled for the host with g++."""

    def __init__(self, program: Program, folder: Path):
        self.program = program
        self.kernels = json.loads(program.text)["kernels"]
        self.used = {}
        for function in json.loads(program.text)["functions"]:
            (call,) = [inst for inst in function["instructions"] if inst["op"] == "pointwise"]
            self.used[function["name"]] = call["kernel"]
        source, self.binary = folder / "kernels.cpp", folder / "kernels"
        source.write_text(host_program(program))
        subprocess.run(["g++", "-std=c++17", "-O1", "-w", "-o", str(self.binary), str(source)], check=True)

    def run(self, function: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Launches `function`'s kernel over `inputs` (each laid out as the
        kernel's layout says: its sizes and strides)."""
        index = self.used[function]
        kernel = self.kernels[index]
        packed = bytearray()
        for tensor, spec in zip(inputs, kernel["inputs"], strict=True):
            assert list(tensor.shape) == spec["shape"]
            assert all(size == 1 or stride == want
                       for size, stride, want in zip(tensor.shape, tensor.stride(), spec["strides"]))
            storage = bytes(tensor.untyped_storage())
            packed += struct.pack("<QQ", len(storage), tensor.storage_offset() * tensor.element_size()) + storage
        dtype = inputs[0].dtype
        sizes = []
        for spec in kernel["outputs"]:
            sizes.append(math.prod(spec["shape"]) * inputs[0].element_size())
            packed += struct.pack("<QQ", sizes[-1], 0)
        done = subprocess.run([str(self.binary), str(index)], input=bytes(packed), capture_output=True, check=True)
        outputs, at = [], 0
        for spec, size in zip(kernel["outputs"], sizes):
            flat = torch.frombuffer(bytearray(done.stdout[at:at + size]), dtype=dtype)
            outputs.append(flat.as_strided(spec["shape"], spec["strides"]))
            at += size
        assert at == len(done.stdout)
        return outputs


@pytest.fixture(scope="module", params=["f32", "bf16"])
def host_kernels(request, tmp_path_factory) -> HostKernels:
    if shutil.which("g++") is None:
        pytest.skip("no g++ to compile the kernels for the host")
    return HostKernels(translate(table_module(request.param)), tmp_path_factory.mktemp(f"host-{request.param}"))


def dtype_of(host: HostKernels) -> torch.dtype:
    return {"f32": torch.float32, "bf16": torch.bfloat16}[host.kernels[0]["element_type"]]


def check(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """f32 to float rounding; bf16 as ATen rounds the float result once."""
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)
    else:
        torch.testing.assert_close(got.float(), expected.to(dtype).float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name, callee, shapes, args, reference, positive", CASES, ids=[case[0] for case in CASES])
def test_each_operator_computes_what_aten_computes(host_kernels, name, callee, shapes, args, reference, positive):
    dtype = dtype_of(host_kernels)
    generator = torch.Generator().manual_seed(len(name))
    inputs = [torch.randn(shape, generator=generator) * 2 for shape in shapes]
    if positive:
        inputs = [tensor.abs() + 0.1 for tensor in inputs]
    inputs = [tensor.to(dtype) for tensor in inputs]
    (got,) = host_kernels.run(name, inputs)
    check(got, reference(*[tensor.float() for tensor in inputs]), dtype)


def test_a_broadcasting_chain_computes_what_aten_computes(host_kernels):
    dtype = dtype_of(host_kernels)
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 8, generator=generator).to(dtype), torch.randn(8, generator=generator).to(dtype)
    ms = x.float().pow(2).mean(-1, keepdim=True).to(dtype)
    (got,) = host_kernels.run("rmsnorm_tail", [x, ms, w])
    check(got, x.float() * torch.rsqrt(ms.float() + 1e-5) * w.float(), dtype)


def test_a_kernel_over_halves_computes_what_aten_computes(host_kernels):
    dtype = dtype_of(host_kernels)
    generator = torch.Generator().manual_seed(0)
    q, cos, sin = (torch.randn(shape, generator=generator).to(dtype) for shape in ([2, 4, 2, 8], [4, 8], [4, 8]))
    inputs, expected = rotary_halves_inputs(q.transpose(1, 2), cos, sin)
    # The runtime hands a function its batch row-major.
    (got,) = host_kernels.run("rotary_halves", [tensor.contiguous() for tensor in inputs])
    check(got, expected, dtype)


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_strided_inputs_compute_what_aten_computes(host_kernels, offset):
    """A transposed input read in vectors, a row-major one across them
    element by element and a broadcast column; a view one element into its
    storage takes the loop one element at a time."""
    dtype = dtype_of(host_kernels)
    kernel = host_kernels.kernels[host_kernels.used["strided"]]
    assert kernel["vector"] > 1 and [spec["steps"] for spec in kernel["inputs"]] == [[1, 8], [64, 1], [1, 0]]
    generator = torch.Generator().manual_seed(2)
    a = torch.randn(8 * 64 + offset, generator=generator).to(dtype)[offset:].view(8, 64)
    b, c = torch.randn(8, 1, generator=generator).to(dtype), torch.randn(64, 8, generator=generator).to(dtype)
    (got,) = host_kernels.run("strided", [c.t(), a, b])
    assert got.stride() == (1, 8)  # laid out like its first input, as TensorIterator lays it out
    check(got, c.t().float() * a.float() - b.float(), dtype)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["f32", "bf16"])
def test_the_runtime_launches_each_kernel_on_the_gpu(dtype, tolerance):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine: the kernels' launches run in make test-gpu")
    from fsdpc.program import runtime_extension

    program = translate(table_module("bf16" if dtype == torch.bfloat16 else "f32"))
    runtime = runtime_extension().Program(program.text, "cuda")
    generator = torch.Generator().manual_seed(1)
    for name, _, shapes, _, reference, positive in CASES:
        inputs = [torch.randn(shape, generator=generator) * 2 for shape in shapes]
        if positive:
            inputs = [tensor.abs() + 0.1 for tensor in inputs]
        inputs = [tensor.to(dtype).cuda() for tensor in inputs]
        (got,) = runtime.run(name, {}, {}, {}, inputs, {}, 60.0)["returned"]
        # ATen computes one call in float and rounds once, as the kernel does.
        expected = reference(*[tensor.float() for tensor in inputs]).to(dtype)
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance, msg=name)
    x = torch.randn(4, 8, device="cuda", dtype=dtype)
    ms, w = x.float().pow(2).mean(-1, keepdim=True).to(dtype), torch.randn(8, device="cuda", dtype=dtype)
    (got,) = runtime.run("rmsnorm_tail", {}, {}, {}, [x, ms, w], {}, 60.0)["returned"]
    expected = (x.float() * torch.rsqrt(ms.float() + 1e-5) * w.float()).to(dtype)
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    # Strided halves of a permuted query, and the half index in the query's dtype.
    q = torch.randn(2, 4, 2, 8, device="cuda", dtype=dtype).transpose(1, 2)
    cos, sin = torch.randn(4, 8, device="cuda", dtype=dtype), torch.randn(4, 8, device="cuda", dtype=dtype)
    inputs, expected = rotary_halves_inputs(q, cos, sin)
    (got,) = runtime.run("rotary_halves", {}, {}, {}, inputs, {}, 60.0)["returned"]
    torch.testing.assert_close(got, expected.to(dtype), rtol=tolerance, atol=tolerance)
    assert got.is_contiguous()  # the runtime hands a function its batch row-major
    a = torch.randn(8 * 64 + 1, device="cuda", dtype=dtype)[1:].view(8, 64)  # not 16-byte aligned
    b, c = torch.randn(8, 1, device="cuda", dtype=dtype), torch.randn(64, 8, device="cuda", dtype=dtype)
    for first in (a, a.clone()):
        (got,) = runtime.run("strided", {}, {}, {}, [first, b, c], {}, 60.0)["returned"]
        expected = (c.t().float() * first.float() - b.float()).to(dtype)
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
        assert got.stride() == (1, 8)

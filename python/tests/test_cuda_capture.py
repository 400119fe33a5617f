"""Capture for a CUDA target on a machine without a GPU: fused attention
stays whole (the kernel eager PyTorch picks), with its backward kernel; the
program records its device and passes the runtime's validation, which
refuses to load it for a CPU."""

import contextlib
import re

import pytest
import torch

from fsdpc.attention import AttentionKernel, CudaTarget, cuda_attention_kernel
from fsdpc.compiler import run_fsdp_opt
from fsdpc.program import Program, ProgramError, translate
from fsdpc.__main__ import main


def aten_calls(text: str) -> list[str]:
    return re.findall(r'fsdp\.aten "aten::([A-Za-z0-9_.]+)"', text)


@pytest.fixture(scope="module")
def llama_ir(tmp_path_factory):
    """The Llama example captured for each target and precision (in-process:
    test_cli runs `python -m fsdpc export` as a user does)."""
    folder = tmp_path_factory.mktemp("cuda-capture")
    captured = {}
    for device, precision in (("cuda", "bf16"), ("cuda", "f32"), ("cpu", "bf16")):
        out = folder / f"llama-{device}-{precision}.mlir"
        dtype = ["--param-dtype", "bf16", "--reduce-dtype", "f32"] if precision == "bf16" else []
        assert main(["export", "--model", "llama", "--device", device, *dtype, "--out", str(out)]) == 0
        captured[device, precision] = out.read_text()
    return captured


def test_bf16_for_cuda_keeps_cudnn_attention_and_its_backward(llama_ir):
    """An H100 with torch's cuDNN (> 9.15) runs cuDNN attention for bf16."""
    calls = aten_calls(llama_ir["cuda", "bf16"])
    layers = 2
    assert calls.count("_scaled_dot_product_cudnn_attention") == layers
    assert calls.count("_scaled_dot_product_cudnn_attention_backward") == layers
    # No math attention is left: no softmax over the scores, no batched matmuls.
    assert not {"_softmax", "_softmax_backward_data", "bmm"} & set(calls), sorted(set(calls))


def test_fp32_for_cuda_keeps_memory_efficient_attention(llama_ir):
    calls = aten_calls(llama_ir["cuda", "f32"])
    assert calls.count("_scaled_dot_product_efficient_attention") == 2
    assert calls.count("_scaled_dot_product_efficient_attention_backward") == 2
    assert "_softmax" not in calls


def test_a_cpu_target_keeps_the_cpus_fused_attention(llama_ir):
    """Eager's kernel on a CPU, kept whole with its backward (before
    2026-11-28 math attention)."""
    calls = aten_calls(llama_ir["cpu", "bf16"])
    assert calls.count("_scaled_dot_product_flash_attention_for_cpu") == 2
    assert calls.count("_scaled_dot_product_flash_attention_for_cpu_backward") == 2
    assert not {"_softmax", "_softmax_backward_data", "bmm"} & set(calls), sorted(set(calls))


def test_the_cuda_program_lowers_and_validates(llama_ir):
    """Sharded, lowered and loaded: the fused kernels' static sizes travel as
    literals, their absent outputs as undefined tensors."""
    for precision, kernel in (("bf16", "cudnn"), ("f32", "efficient")):
        sharded = run_fsdp_opt(llama_ir["cuda", precision], ["--fsdp-sharding-pipeline=ranks=2"])
        program = translate(sharded)
        assert program.functions["train_step"].instructions > 0
        assert program.device_kind == "cuda" and 'attributes {fsdp.device = "cuda"' in sharded
        with pytest.raises(ProgramError, match="compiled for cuda and cannot run on cpu"):
            Program.parse(program.text, "cpu")
        assert f'"aten::_scaled_dot_product_{kernel}_attention_backward"' in sharded


def test_flash_attention_where_cudnn_is_not_preferred(tmp_path, monkeypatch):
    """With TORCH_CUDNN_SDPA_DEPRIORITIZED (as in eager), flash attention and
    its backward, whose static sizes print as literals and whose absent
    cumulative lengths as `unit`; the program validates."""
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    out = tmp_path / "llama.mlir"
    assert main(["export", "--model", "llama", "--device", "cuda", "--param-dtype", "bf16", "--out", str(out)]) == 0
    text = out.read_text()
    calls = aten_calls(text)
    assert calls.count("_scaled_dot_product_flash_attention") == 2
    assert calls.count("_scaled_dot_product_flash_attention_backward") == 2
    backward = next(line for line in text.splitlines()
                    if '"aten::_scaled_dot_product_flash_attention_backward"' in line)
    assert "unit, unit, 16, 16" in backward  # cum_seq_q, cum_seq_k absent; max_q = max_k = seq
    sharded = run_fsdp_opt(text, ["--fsdp-sharding-pipeline=ranks=2"])
    assert translate(sharded).functions["train_step"].instructions > 0


class GroupedAttention(torch.nn.Module):
    """8 query heads over 2 key/value heads: `enable_gqa=True`, or the
    key/value heads repeated to the query's first (`repeat`: "heads", or
    another way that is not grouped-query attention)."""

    def __init__(self, repeat: str | None = None):
        super().__init__()
        self.repeat = repeat
        self.q, self.kv = torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 32, bias=False)

    def forward(self, x):
        batch, seq, _ = x.shape
        q = self.q(x).view(batch, seq, 8, 8).transpose(1, 2)
        k, v = (t.view(batch, seq, 2, 8).transpose(1, 2) for t in self.kv(x).chunk(2, dim=-1))
        attention = torch.nn.functional.scaled_dot_product_attention
        if self.repeat is None:
            return attention(q, k, v, is_causal=True, enable_gqa=True).sum()
        if self.repeat == "heads":
            k, v = k.repeat_interleave(4, dim=1), torch.repeat_interleave(v, 4, dim=-3)
        elif self.repeat == "keys and values unlike":
            k, v = k.repeat_interleave(4, dim=1), v.repeat(1, 4, 1, 1)
        elif self.repeat == "scaled after repeating":
            k, v = k.repeat_interleave(4, dim=1) * 2, v.repeat_interleave(4, dim=1)
        elif self.repeat == "along the sequence":
            k, v = (t.repeat_interleave(4, dim=2).reshape(batch, 8, seq, 8) for t in (k, v))
        return attention(q, k, v, is_causal=True).sum()


@pytest.mark.parametrize("repeat", [None, "heads"], ids=["enable_gqa", "repeated heads"])
@pytest.mark.parametrize("deprioritize_cudnn", [False, True], ids=["cudnn", "flash"])
def test_grouped_heads_reach_the_fused_kernel_unrepeated(deprioritize_cudnn, repeat, monkeypatch):
    """As eager with `enable_gqa` (cuDNN since torch 2.8, flash since 2.5):
    the kernels take 2 key/value heads for 8 query heads, with no repeated
    copies of them forward or summed gradients backward; key/value heads
    repeated with `repeat_interleave` before the call reach them alike."""
    from fsdpc.capture import MixedPrecision
    from fsdpc.export import export_training_step

    if deprioritize_cudnn:
        monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    kernel = "flash" if deprioritize_cudnn else "cudnn"
    text = export_training_step(GroupedAttention(repeat), (torch.randn(2, 16, 64),), lambda m, x: m(x),
                                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), device="cuda").mlir
    calls = aten_calls(text)
    assert calls.count(f"_scaled_dot_product_{kernel}_attention") == 1
    assert calls.count(f"_scaled_dot_product_{kernel}_attention_backward") == 1
    assert "repeat_interleave" not in " ".join(calls) and "index_select" not in calls
    assert "clone" not in calls, sorted(set(calls))
    forward = next(line for line in text.splitlines() if f'"aten::_scaled_dot_product_{kernel}_attention"' in line)
    assert "tensor<2x8x16x8xbf16>, tensor<2x2x16x8xbf16>, tensor<2x2x16x8xbf16>" in forward, forward
    sharded = run_fsdp_opt(text, ["--fsdp-sharding-pipeline=ranks=2 backend=nccl"])
    assert translate(sharded).device_kind == "cuda"


@pytest.mark.parametrize("repeat, precision", [("keys and values unlike", "bf16"), ("scaled after repeating", "bf16"),
                                               ("along the sequence", "bf16"), ("heads", "f32")])
def test_repeats_that_are_not_grouped_heads_stay(repeat, precision):
    """Keys repeated one way and values another, keys computed on after
    their repeat, a repeat along the sequence, and an fp32 call (grouped,
    only math attention would take it; repeated, memory-efficient attention
    does): the repeated tensors reach the kernel as written."""
    from fsdpc.capture import MixedPrecision
    from fsdpc.export import export_training_step

    policy = MixedPrecision(param_dtype=torch.bfloat16) if precision == "bf16" else None
    text = export_training_step(GroupedAttention(repeat), (torch.randn(2, 16, 64),), lambda m, x: m(x),
                                mixed_precision=policy, device="cuda").mlir
    forward = next(line for line in text.splitlines() if "_scaled_dot_product_" in line and "backward" not in line)
    query, key, value = re.search(r": \((tensor<[^>]*>), (tensor<[^>]*>), (tensor<[^>]*>)", forward).groups()
    assert query.split("x")[1] == key.split("x")[1] == value.split("x")[1], forward


def test_grouped_query_attention_is_the_repeated_heads():
    """The equivalence the capture relies on, as torch defines it: each
    query head h attends to key/value head h // (query heads / key heads),
    which is what repeat_interleave along the heads builds."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, 16, 8, generator=generator) for heads in (8, 2, 2))
    attention = torch.nn.functional.scaled_dot_product_attention
    torch.testing.assert_close(attention(q, k, v, is_causal=True, enable_gqa=True),
                               attention(q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1),
                                         is_causal=True), rtol=1e-6, atol=1e-6)


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


H100 = CudaTarget(capability=(9, 0), cudnn_version=91900)
A100 = CudaTarget(capability=(8, 0), cudnn_version=91900)


@pytest.mark.parametrize("case, gpu, expected", [
    ("bf16 causal", H100, AttentionKernel.CUDNN),
    ("bf16 causal", A100, AttentionKernel.FLASH),
    ("bf16 causal", CudaTarget((9, 0), cudnn_version=91400), AttentionKernel.FLASH),
    ("fp16 head dim 256", H100, AttentionKernel.CUDNN),  # sm90 with cuDNN >= 9.10: up to 256 (seen on an H100)
    ("fp16 head dim 256", CudaTarget((10, 0), cudnn_version=91900), AttentionKernel.FLASH),  # elsewhere 128
    ("bf16 head dim 512", H100, AttentionKernel.EFFICIENT),
    ("bf16 with a mask", H100, AttentionKernel.CUDNN),
    ("bf16 with a mask", A100, AttentionKernel.EFFICIENT),
    ("fp32", H100, AttentionKernel.EFFICIENT),
    ("fp32 head dim 6", H100, AttentionKernel.MATH),
    ("mixed dtypes", H100, AttentionKernel.MATH),
    ("bf16 causal, longer keys", A100, AttentionKernel.EFFICIENT),
    ("bf16 grouped heads", H100, AttentionKernel.CUDNN),
])
def test_the_kernel_eager_pytorch_would_pick(case, gpu, expected):
    q = k = v = meta(2, 4, 64, 64)
    mask, causal, grouped = None, False, False
    if case == "bf16 causal":
        causal = True
    elif case == "fp16 head dim 256":
        q = k = v = meta(2, 4, 64, 256, dtype=torch.float16)
    elif case == "bf16 head dim 512":
        q = k = v = meta(2, 4, 64, 512)
    elif case == "bf16 with a mask":
        mask = meta(64, 64)
    elif case == "fp32":
        q = k = v = meta(2, 4, 64, 64, dtype=torch.float32)
    elif case == "fp32 head dim 6":
        q = k = v = meta(2, 4, 64, 6, dtype=torch.float32)
    elif case == "mixed dtypes":
        k = meta(2, 4, 64, 64, dtype=torch.float32)
    elif case == "bf16 causal, longer keys":
        k = v = meta(2, 4, 128, 64)
        causal = True
    elif case == "bf16 grouped heads":
        k = v = meta(2, 2, 64, 64)
        grouped = True
    assert cuda_attention_kernel(q, k, v, mask, causal, grouped, gpu) is expected


SDPA = torch.nn.attention.SDPBackend


@pytest.mark.parametrize("case, gpu, backends, set_priority, expected", [
    ("bf16 causal", H100, [SDPA.EFFICIENT_ATTENTION], False, AttentionKernel.EFFICIENT),
    ("bf16 causal", H100, [SDPA.FLASH_ATTENTION, SDPA.MATH], False, AttentionKernel.FLASH),
    ("bf16 causal", H100, [SDPA.MATH], False, AttentionKernel.MATH),
    ("bf16 causal", H100, [SDPA.FLASH_ATTENTION, SDPA.CUDNN_ATTENTION], True, AttentionKernel.FLASH),
    ("bf16 causal", A100, [SDPA.EFFICIENT_ATTENTION, SDPA.FLASH_ATTENTION], True, AttentionKernel.EFFICIENT),
    # Not preferred, cuDNN comes after math in torch's order: only math off lets it run.
    ("bf16 with a mask", A100, [SDPA.FLASH_ATTENTION, SDPA.CUDNN_ATTENTION], False, AttentionKernel.CUDNN),
    ("bf16 with a mask", H100, [SDPA.FLASH_ATTENTION], False, None),
    ("fp32", H100, [SDPA.FLASH_ATTENTION, SDPA.CUDNN_ATTENTION], False, None),
])
def test_the_backend_switches_pick_as_in_eager(case, gpu, backends, set_priority, expected):
    """`sdpa_kernel` (the `torch.backends.cuda.enable_*_sdp` switches, and
    its priority order) rules capture's choice as it rules eager's: the
    first kernel in the order that is on and takes the call; none is
    refused, as eager refuses it ("No available kernel")."""
    from fsdpc.attention import NoAttentionKernel

    q = k = v = meta(2, 4, 64, 64, dtype=torch.float32 if case == "fp32" else torch.bfloat16)
    mask = meta(64, 64) if case == "bf16 with a mask" else None
    with torch.nn.attention.sdpa_kernel(backends, set_priority=set_priority):
        if expected is None:
            with pytest.raises(NoAttentionKernel, match="switched off: .*math"):
                cuda_attention_kernel(q, k, v, mask, case == "bf16 causal", False, gpu)
        else:
            assert cuda_attention_kernel(q, k, v, mask, case == "bf16 causal", False, gpu) is expected
    assert cuda_attention_kernel(q, k, v, None, False, False, H100) is not AttentionKernel.MATH  # restored


@pytest.mark.parametrize("warn_only, expected", [(True, AttentionKernel.CUDNN), (False, AttentionKernel.FLASH)])
def test_deterministic_algorithms_leave_cudnn_only_when_they_only_warn(warn_only, expected):
    """cuDNN attention is not deterministic: eager leaves it out under
    `torch.use_deterministic_algorithms(True)`, and keeps it where that only
    warns."""
    q = meta(2, 4, 64, 64)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        assert cuda_attention_kernel(q, q, q, None, True, False, H100) is expected
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_repeated_heads_stay_repeated_where_eager_runs_them_otherwise():
    """Keys and values repeated to the query's heads reach a grouped kernel
    only where eager's kernel for the repeated call is that one: with
    memory-efficient attention first in the priority order on an A100,
    eager runs the repeated call with it (flash would take the grouped
    one), so capture does too."""
    from fsdpc.attention import FusedAttentionFor

    q, kv = meta(2, 8, 64, 64), meta(2, 2, 64, 64)
    order = [SDPA.EFFICIENT_ATTENTION, SDPA.FLASH_ATTENTION]
    with torch.nn.attention.sdpa_kernel(order, set_priority=True), FusedAttentionFor("cuda", A100) as mode:
        torch.nn.functional.scaled_dot_product_attention(q, kv.repeat_interleave(4, dim=1),
                                                         kv.repeat_interleave(4, dim=1), is_causal=True)
    assert mode.chosen == [AttentionKernel.EFFICIENT]


def test_capture_under_sdpa_kernel_keeps_the_kernel_it_leaves_on():
    """The switches reach capture: a bf16 call captured for an H100 under
    `sdpa_kernel(EFFICIENT_ATTENTION)` is the memory-efficient kernel."""
    from fsdpc.attention import FusedAttentionFor

    q = meta(2, 4, 64, 64)
    with torch.nn.attention.sdpa_kernel(SDPA.EFFICIENT_ATTENTION), FusedAttentionFor("cuda", H100) as mode:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert mode.chosen == [AttentionKernel.EFFICIENT]


class _KernelsByMath(torch.utils._python_dispatch.TorchDispatchMode):
    """The CUDA attention kernels computed on the CPU by their definition
    (softmax(q k^T * scale + mask) v, grouped key/value heads read per
    group), from exactly the arguments capture hands them: a kernel adds
    the mask it is given, whatever its dtype, as the CUDA kernels do."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, torch.Tensor | None, int]] = []  # (kernel, its mask, its head width)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.removeprefix("aten::_scaled_dot_product_").removesuffix("_attention")
        if name not in ("cudnn", "flash", "efficient"):
            return func(*args, **kwargs)
        given = {argument.name: argument.default_value for argument in func._schema.arguments}
        given.update(zip(given, args), **kwargs)
        q, k, v, mask = given["query"], given["key"], given["value"], given.get("attn_bias", given.get("attn_mask"))
        self.calls.append((name, mask, q.shape[-1]))
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        scale = given["scale"] or q.shape[-1] ** -0.5
        scores = (q.float() @ k.float().transpose(-2, -1)) * scale
        if mask is not None:
            scores = scores + mask
        if given["is_causal"]:
            scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), -torch.inf)
        out = (scores.softmax(-1) @ v.float()).to(q.dtype)
        # Only the output is read: the rest (statistics, seeds) is filler of the schema's types.
        return (out, *(torch.empty(0) if isinstance(result.type, torch.TensorType) else 0
                       for result in func._schema.returns[1:]))


@pytest.mark.parametrize("mask_kind", ["boolean padding", "boolean 4-D", "float", "none"])
@pytest.mark.parametrize("case, gpu, dtype, head_dim, kernels", [
    ("H100 bf16", H100, torch.bfloat16, 16, {"": "cudnn"}),
    ("A100 bf16", A100, torch.bfloat16, 16, {"none": "flash", "": "efficient"}),
    ("fp32", H100, torch.float32, 16, {"": "efficient"}),
    ("A100 bf16, head dim 12", A100, torch.bfloat16, 12, {"none": "flash", "": "math"}),
])
def test_the_kernels_get_what_eager_hands_them(case, gpu, dtype, head_dim, kernels, mask_kind):
    """A boolean mask (True: attend) reaches every kernel as the additive
    mask eager's scaled_dot_product_attention makes of it (-inf where
    masked, -65504 for cuDNN), the memory-efficient kernel's mask aligned
    and expanded to (batch, heads, queries, keys), and flash attention's
    heads padded to a multiple of 8 with the unpadded width's scale: the
    kernels, computed by their definition from what capture hands them,
    give eager's attention; so does math attention, where no kernel takes
    the call. (Before 2026-11-28 a boolean mask was handed on as it was:
    added to the scores, 0 and 1, instead of masking them.)"""
    from fsdpc.attention import FusedAttentionFor

    kernel = kernels.get(mask_kind, kernels[""])
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, head_dim, generator=generator).to(dtype)
    k, v = (torch.randn(2, 2, 8, head_dim, generator=generator).to(dtype) for _ in range(2))
    k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
    lengths = torch.tensor([5, 8])
    padding = torch.arange(8) < lengths[:, None]  # keys each row attends to
    mask = {"boolean padding": padding[:, None, None, :],
            "boolean 4-D": (padding[:, None, None, :] & torch.ones(8, 8, dtype=torch.bool).tril()).expand(2, 1, 8, 8),
            "float": torch.randn(8, 8, generator=generator).to(dtype),
            "none": None}[mask_kind]
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                attn_mask=None if mask is None else
                                                                mask if mask.dtype == torch.bool else mask.float())
    with _KernelsByMath() as by_math, FusedAttentionFor("cuda", gpu):
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert [called for called, _, _ in by_math.calls] == ([] if kernel == "math" else [kernel])
    if kernel == "flash":
        assert by_math.calls[0][2] % 8 == 0, by_math.calls
    if by_math.calls and mask is not None:
        handed = by_math.calls[0][1]
        assert handed.dtype == dtype, handed.dtype
        if kernel == "efficient":
            assert handed.shape == (2, 4, 8, 8), handed.shape
        if mask.dtype == torch.bool:
            fill = torch.tensor(-65504.0 if kernel == "cudnn" else -torch.inf, dtype=dtype)
            assert handed.min() == fill, handed.min()
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got.float(), expected, **tolerance)


class NormedMLP(torch.nn.Module):
    """A linear layer into nn.RMSNorm (torchtitan's norm), as a block has it."""

    def __init__(self, affine: bool = True, weight_dtype: torch.dtype | None = None):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.norm = torch.nn.RMSNorm(64, eps=1e-5, elementwise_affine=affine)
        if weight_dtype is not None:
            self.norm.to(weight_dtype)

    def forward(self, x):
        return self.norm(self.lin(x)).float().square().mean()


def capture_normed(device: str, *, precision: bool = True, **model_options) -> str:
    from fsdpc.capture import MixedPrecision
    from fsdpc.export import export_training_step

    policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision else None
    return export_training_step(NormedMLP(**model_options), (torch.randn(4, 16, 64),), lambda m, x: m(x),
                                mixed_precision=policy, device=device).mlir


@pytest.mark.parametrize("precision", [True, False], ids=["bf16", "f32"])
def test_rms_norm_for_cuda_is_one_fused_call_each_way(precision):
    """As eager PyTorch on a GPU: `_fused_rms_norm` forward and
    `_fused_rms_norm_backward`, with the fp32 rstd between them; a CPU target
    keeps the composite; the CUDA program shards, reports and lowers."""
    cuda, cpu = (capture_normed(device, precision=precision) for device in ("cuda", "cpu"))
    calls = aten_calls(cuda)
    assert calls.count("_fused_rms_norm") == 1 and calls.count("_fused_rms_norm_backward") == 1
    assert "rsqrt" not in calls and len(calls) < len(aten_calls(cpu))
    assert "rsqrt" in aten_calls(cpu) and "_fused_rms_norm" not in aten_calls(cpu)
    assert re.search(r'"aten::_fused_rms_norm" .* -> \(tensor<4x16x64x(bf16|f32)>, tensor<4x16x1xf32>\)', cuda)
    sharded = run_fsdp_opt(cuda, ["--fsdp-sharding-pipeline=ranks=2 backend=nccl"])
    assert translate(sharded).device_kind == "cuda"


@pytest.mark.parametrize("options", [{"affine": False}, {"weight_dtype": torch.float64}],
                         ids=["no weight", "weight dtype differs"])
def test_rms_norm_eager_would_not_fuse_stays_composite(options):
    """Without a weight (the fused backward's weight gradient would be
    undefined) or with a weight of another dtype (ATen's rms_norm falls
    back), capture keeps the composite."""
    calls = aten_calls(capture_normed("cuda", precision=False, **options))
    assert "_fused_rms_norm" not in calls and "rsqrt" in calls


def rms_norm_grads(x, w, fused: bool):
    from fsdpc.rms_norm import FusedRmsNormFor

    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    if fused:
        with FusedRmsNormFor("cuda"):
            y = torch.nn.functional.rms_norm(x, [x.shape[-1]], w, 1e-5)
    else:
        y = torch.nn.functional.rms_norm(x, [x.shape[-1]], w, 1e-5)
    (y.float() * torch.linspace(-1, 1, y.numel(), device=y.device).view_as(y)).sum().backward()
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_stand_ins_compute_what_eager_computes(dtype, monkeypatch):
    """The custom operators capture records, run for real on the CPU: the
    forward is ATen's own `_fused_rms_norm`; the fused backward has no CPU
    kernel, so PyTorch's decomposition of it stands in here (on a GPU the
    next test runs the real one). Output and both gradients equal eager's
    composite, bf16 to the bit (the wiring: saved tensors, argument order,
    output mask)."""
    from torch._decomp import decomposition_table

    library = torch.library.Library("fsdpc", "IMPL")
    library.impl("fused_rms_norm_backward", decomposition_table[torch.ops.aten._fused_rms_norm_backward.default],
                 "CPU")
    try:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(3, 5, 64, generator=generator).to(dtype)
        w = (1 + 0.1 * torch.randn(64, generator=generator)).to(dtype)
        fused, eager = rms_norm_grads(x, w, fused=True), rms_norm_grads(x, w, fused=False)
    finally:
        library._destroy()
    for mine, theirs in zip(fused, eager):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape, normalized", [((3, 5, 64), [64]), ((2, 7, 4, 16), [4, 16]), ((9, 32), [32])])
def test_the_fake_kernels_allocate_what_pytorch_defines(dtype, shape, normalized):
    """Without a GPU: the fake kernels, which give the IR its types, against
    PyTorch's own definition of the fused pair (its decompositions, on the
    meta device): the same shape, dtype and strides for the output, `rstd`
    (one fp32 value per normalized row, [..., 1]) and both gradients."""
    from torch._decomp import decomposition_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    aten = torch.ops.aten
    x, w = torch.empty(shape, dtype=dtype, device="meta"), torch.empty(normalized, dtype=dtype, device="meta")
    defined = decomposition_table[aten._fused_rms_norm.default](x, normalized, w, 1e-5)
    defined_grads = decomposition_table[aten._fused_rms_norm_backward.default](
        defined[0], x, normalized, defined[1], w, [True, True])
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.ops.fsdpc.fused_rms_norm(x, normalized, w, 1e-5)
        fake_grads = torch.ops.fsdpc.fused_rms_norm_backward(defined[0], x, normalized, defined[1], w, [True, True])
    for mine, theirs in zip((*fake, *fake_grads), (*defined, *defined_grads)):
        assert (mine.shape, mine.dtype, mine.stride()) == (theirs.shape, theirs.dtype, theirs.stride())


class WrittenOutNorm(torch.nn.Module):
    """A linear layer into an RMSNorm written out by hand, as the project's
    Llama has it; `variant` bends one part of the pattern."""

    def __init__(self, variant: str = "plain"):
        super().__init__()
        self.variant = variant
        self.lin = torch.nn.Linear(64, 64)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(64, dtype=torch.float64 if variant ==
                                                                "float64 weight" else torch.float32))

    def norm(self, x):
        v = self.variant
        if v == "mean over rows":
            return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-5) * self.weight
        if v == "cubed":
            return x * torch.rsqrt(x.pow(3).abs().mean(-1, keepdim=True) + 1e-5) * self.weight
        if v == "normalized also read":
            normalized = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
            return normalized * self.weight + normalized
        if v == "another tensor scaled":
            return (x + 1) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight
        if v == "weight first, x times x":
            return self.weight * (torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * x)
        if v in ("hugging face", "in fp32, not cast back"):  # transformers' LlamaRMSNorm, T5LayerNorm
            wide = x.to(torch.float32)
            wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * (wide.to(x.dtype) if v == "hugging face" else wide)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight

    def forward(self, x):
        return self.norm(self.lin(x)).float().square().mean()


def capture_written_out(device: str, variant: str = "plain", precision: bool = True) -> str:
    from fsdpc.capture import MixedPrecision
    from fsdpc.export import export_training_step

    policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision else None
    return export_training_step(WrittenOutNorm(variant), (torch.randn(4, 16, 64),), lambda m, x: m(x),
                                mixed_precision=policy, device=device).mlir


@pytest.mark.parametrize("variant", ["plain", "weight first, x times x", "hugging face"])
@pytest.mark.parametrize("precision", [True, False], ids=["bf16", "f32"])
def test_a_written_out_rms_norm_for_cuda_is_one_fused_call_each_way(variant, precision):
    """`x * rsqrt(mean(x^2) + eps) * weight`, in either order or computed in
    fp32 and cast back (Hugging Face's), becomes the fused kernel each way
    for a CUDA target, as nn.RMSNorm does, and names the user's line; a CPU
    target keeps what the user wrote."""
    cuda, cpu = (capture_written_out(device, variant, precision) for device in ("cuda", "cpu"))
    calls = aten_calls(cuda)
    assert calls.count("_fused_rms_norm") == 1 and calls.count("_fused_rms_norm_backward") == 1
    assert "rsqrt" not in calls and "mean.dim" not in calls and len(calls) < len(aten_calls(cpu))
    assert re.search(r'"aten::_fused_rms_norm" \(%\w+, %\w+\) .* -> \(tensor<4x16x64x(bf16|f32)>', cuda)
    assert "rsqrt" in aten_calls(cpu) and "_fused_rms_norm" not in aten_calls(cpu)
    fused = re.search(r'"aten::_fused_rms_norm" .*\[64\], 1 : index, ([-+.e0-9]+)\].* (loc\(.*\))', cuda)
    assert fused and float(fused[1]) == pytest.approx(1e-5 if variant == "plain" else 1e-6, rel=1e-12)
    written = re.search(r'"aten::rsqrt" .* (loc\(.*\))', cpu)
    assert fused[2] == written[1] and "test_cuda_capture.py" in fused[2]  # where the user wrote the norm


class PerHeadNorm(torch.nn.Module):
    """Queries normed per head, Hugging Face's way (Qwen 3's and Gemma 3's
    `q_norm`): an RMSNorm of a 4-D input, [batch, sequence, heads, head
    dim], contiguous or laid out channels-last."""

    def __init__(self, channels_last: bool):
        super().__init__()
        self.channels_last = channels_last
        self.lin = torch.nn.Linear(64, 64)
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(16))

    def forward(self, x):
        heads = self.lin(x).view(4, 16, 4, 16)
        if self.channels_last:
            heads = heads.contiguous(memory_format=torch.channels_last)
        wide = heads.to(torch.float32)
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (self.weight * wide.to(heads.dtype)).float().square().mean()


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels-last"])
def test_a_norm_per_head_is_fused_where_eager_fuses_it(channels_last):
    """A 4-D input takes the fused kernel as in eager, unless laid out
    channels-last (eager's rms_norm falls back to the composite there).
    Before 2026-11-28 any 4-D input failed capture for CUDA (a Python
    tensor has no `suggest_memory_format`): Qwen 3, Gemma 3, Qwen3-MoE."""
    from fsdpc.capture import MixedPrecision
    from fsdpc.export import export_training_step

    text = export_training_step(PerHeadNorm(channels_last), (torch.randn(4, 16, 64),), lambda m, x: m(x),
                                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), device="cuda").mlir
    fused = aten_calls(text).count("_fused_rms_norm")
    assert fused == (0 if channels_last else 1), aten_calls(text)


@pytest.mark.parametrize("variant, precision", [("mean over rows", False), ("cubed", False),
                                                ("normalized also read", False), ("another tensor scaled", False),
                                                ("float64 weight", False), ("in fp32, not cast back", True)])
def test_what_is_not_an_rms_norm_stays_as_written(variant, precision):
    """A mean over another dimension, another power, the normalized tensor
    read again, a different tensor scaled than squared, a weight of another
    dtype (eager's rms_norm would not fuse it either), a bf16 input
    normalized in fp32 and left there (the fused kernel's result would be
    bf16): nothing is fused."""
    calls = aten_calls(capture_written_out("cuda", variant, precision=precision))
    assert "_fused_rms_norm" not in calls and "rsqrt" in calls


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU on this machine"))])
@pytest.mark.parametrize("variant", ["plain", "hugging face"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_fused_written_out_norm_computes_what_the_user_wrote(dtype, variant, device):
    """The rewritten forward, run for real (on the CPU the fused backward's
    stand-in is PyTorch's decomposition of it; on a GPU the CUDA kernels
    run), against the model as written: the loss and every gradient within
    what rounding once instead of after each op changes (fp32: 1e-5; bf16:
    2^-7)."""
    from torch._decomp import decomposition_table

    from fsdpc.capture import traced_forward
    from fsdpc.rms_norm import fuse_written_out_rms_norms

    torch.manual_seed(0)
    model = WrittenOutNorm(variant).to(device, dtype)
    x = torch.randn(4, 16, 64, dtype=dtype).to(device)
    loss_fn = lambda m, x: m(x)  # noqa: E731
    with traced_forward(model, (x,), loss_fn, device="cpu") as trace:  # the rewrite is the test's, below
        program = trace.program
    assert fuse_written_out_rms_norms(program.graph_module) == 1
    library = torch.library.Library("fsdpc", "IMPL")
    library.impl("fused_rms_norm_backward", decomposition_table[torch.ops.aten._fused_rms_norm_backward.default],
                 "CPU")
    try:
        fused = program.module()
        loss = fused(x)
        loss.backward()
    finally:
        library._destroy()
    expected = model(x)
    expected.backward()
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(loss, expected, **tolerance)
    for name, param in model.named_parameters():
        torch.testing.assert_close(fused.get_parameter("model." + name).grad, param.grad, **tolerance)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_stand_ins_are_eagers_kernels_on_the_gpu(dtype):
    """On a GPU the stand-ins call the fused kernels eager PyTorch calls:
    the same output and gradients, to the bit; their fake kernels allocate
    what the CUDA kernels allocate (shape, dtype, strides)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=generator).to("cuda", dtype)
    w = (1 + 0.1 * torch.randn(64, generator=generator)).to("cuda", dtype)
    for mine, theirs in zip(rms_norm_grads(x, w, fused=True), rms_norm_grads(x, w, fused=False)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    # The fake kernels, which give the IR its types, allocate as the CUDA kernels do.
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = torch.ops.aten._fused_rms_norm(x, [64], w, 1e-5)
    real_grads = torch.ops.aten._fused_rms_norm_backward(real[0], x, [64], real[1], w, [True, True])
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.ops.fsdpc.fused_rms_norm(x, [64], w, 1e-5)
        fake_grads = torch.ops.fsdpc.fused_rms_norm_backward(real[0], x, [64], real[1], w, [True, True])
    for mine, theirs in zip((*fake, *fake_grads), (*real, *real_grads)):
        assert (mine.shape, mine.dtype, mine.stride()) == (theirs.shape, theirs.dtype, theirs.stride())


class _FusedCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the fused attention operators eager dispatches, with the heads
    of the key they get."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name.startswith("aten::_scaled_dot_product_") and "backward" not in name:
            self.calls.append((name.removeprefix("aten::_scaled_dot_product_"), args[1].shape[1]))
        return func(*args, **(kwargs or {}))


def test_checkpointing_recomputes_attention_without_dropout(llama_ir):
    """Torch tags the fused attention kernels as seeded; at dropout 0 they
    draw nothing, so they are not `random` and `checkpoint=*` recomputes
    them (before 2026-11-28 each layer's attention output stayed saved)."""
    for key, kernel in ((("cuda", "bf16"), "cudnn"), (("cuda", "f32"), "efficient"),
                        (("cpu", "bf16"), "flash")):
        calls = re.findall(rf'"aten::_scaled_dot_product_{kernel}_attention[_a-z]*"[^\n]*', llama_ir[key])
        assert len(calls) == 4 and not any(" random" in call for call in calls), calls
        sharded = run_fsdp_opt(llama_ir[key], ["--fsdp-sharding-pipeline=ranks=2 checkpoint=*"])
        recomputed = re.findall(rf'"aten::_scaled_dot_product_{kernel}_attention[_a-z]*"[^\n]*fsdp\.recomputed',
                                sharded)
        assert len(recomputed) == 2, (key, recomputed)


def test_attention_with_dropout_draws_random_numbers():
    """With dropout the kernels draw: marked `random`, so never recomputed."""
    from fsdpc.attention import draws_random

    q = torch.empty(2, 4, 16, 8, device="meta")
    for op in (torch.ops.aten._scaled_dot_product_cudnn_attention.default,
               torch.ops.aten._scaled_dot_product_efficient_attention.default,
               torch.ops.aten._scaled_dot_product_flash_attention.default):
        assert not draws_random(op, (q, q, q), {})
        assert draws_random(op, (q, q, q), {"dropout_p": 0.1})
    assert draws_random(torch.ops.aten.native_dropout.default, (q, 0.0, True), {})
    assert not draws_random(torch.ops.aten.mm.default, (q, q), {})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("kernel", ["cudnn", "efficient", "flash"])
def test_fused_attention_without_dropout_leaves_the_generator_alone(kernel):
    """What `draws_random` relies on, on the GPU at hand: a fused attention
    call and its backward at dropout 0 leave the CUDA generator's state as
    it was (a recomputed call then changes no later draw)."""
    backends = {"cudnn": torch.nn.attention.SDPBackend.CUDNN_ATTENTION,
                "efficient": torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION,
                "flash": torch.nn.attention.SDPBackend.FLASH_ATTENTION}
    q, k, v = (torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    before = torch.cuda.get_rng_state()
    with torch.nn.attention.sdpa_kernel(backends[kernel]):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    torch.cuda.synchronize()
    assert torch.equal(torch.cuda.get_rng_state(), before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("case", ["bf16 causal", "bf16 grouped heads", "fp16 head dim 256", "bf16 with a mask", "fp32",
                                  "bf16 causal, efficient or math", "bf16 with a mask, flash or cudnn"])
def test_capture_picks_the_attention_kernel_eager_runs_on_this_gpu(case):
    """On the GPU at hand, eager's own dispatch (the operator it calls, and
    whether grouped keys reach it unrepeated) against what capture records
    for the same call, also under `sdpa_kernel`."""
    from fsdpc.attention import FusedAttentionFor

    switched = {"bf16 causal, efficient or math": [SDPA.EFFICIENT_ATTENTION, SDPA.MATH],
                "bf16 with a mask, flash or cudnn": [SDPA.FLASH_ATTENTION, SDPA.CUDNN_ATTENTION]}.get(case)
    case = case.split(",")[0]

    major, minor = torch.cuda.get_device_capability()
    dtype = {"fp16 head dim 256": torch.float16, "fp32": torch.float32}.get(case, torch.bfloat16)
    dim = 256 if case == "fp16 head dim 256" else 64
    q = torch.randn(2, 8, 128, dim, device="cuda", dtype=dtype)
    k = v = torch.randn(2, 2 if case == "bf16 grouped heads" else 8, 128, dim, device="cuda", dtype=dtype)
    mask = torch.randn(128, 128, device="cuda", dtype=dtype) if case == "bf16 with a mask" else None
    call = dict(attn_mask=mask, is_causal=case == "bf16 causal", enable_gqa=case == "bf16 grouped heads")
    backends = torch.nn.attention.sdpa_kernel(switched) if switched else contextlib.nullcontext()
    with backends, _FusedCalls() as eager:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, **call)
    metas = [t.to("meta") for t in (q, k, v)]
    backends = torch.nn.attention.sdpa_kernel(switched) if switched else contextlib.nullcontext()
    with backends, _FusedCalls() as captured, FusedAttentionFor("cuda", CudaTarget((major, minor))):
        torch.nn.functional.scaled_dot_product_attention(*metas, **{**call, "attn_mask": None if mask is None
                                                                    else mask.to("meta")})
    assert captured.calls == eager.calls, (case, captured.calls, eager.calls)


def test_a_selective_policy_saves_the_fused_attention_it_names():
    """torchtitan's op-level policy (its attention kernels and every other
    matrix product saved) on the Llama's blocks, captured for a CUDA target:
    the cuDNN attention call and the first, third, ... mm of each block stay
    out of the region, so the sharding pipeline recomputes neither."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from fsdpc.capture import MixedPrecision
    from fsdpc.export import build, export_training_step, load_factory

    saved_kernels = {torch.ops.aten._scaled_dot_product_cudnn_attention.default,
                     torch.ops.aten._scaled_dot_product_flash_attention.default,
                     torch.ops.aten._scaled_dot_product_efficient_attention.default}

    def op_level_policy():
        counts = {False: 0, True: 0}

        def policy(ctx, func, *args, **kwargs):
            if func is torch.ops.aten.mm.default:
                counts[ctx.is_recompute] += 1
                saved = counts[ctx.is_recompute] % 2 == 1
            else:
                saved = func in saved_kernels
            return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    model, batch, loss_fn = build(load_factory("llama"), meta=True)
    for index, layer in enumerate(model.layers):
        model.layers[index] = checkpoint_wrapper(layer, context_fn=op_level_policy)
    text = export_training_step(model, batch, loss_fn, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16),
                                device="cuda").mlir
    forward = text.split("fsdp.loss")[0]
    in_blocks = re.findall(r'"aten::(\w+)"[^\n]*module "layers\.(\d)[.\w]*"( checkpoint \d+)?', forward)
    kept = [(call, block) for call, block, region in in_blocks if not region]
    matmuls = {block: [region for call, b, region in in_blocks if b == block and call == "mm"]
               for _, block, _ in in_blocks}
    assert sorted(matmuls) == ["0", "1"] and all(len(regions) == 7 for regions in matmuls.values()), matmuls
    for block, regions in matmuls.items():
        assert regions[::2] == [""] * len(regions[::2]) and all(regions[1::2]), (block, regions)
        assert ("_scaled_dot_product_cudnn_attention", block) in kept, kept
    sharded = run_fsdp_opt(text, ["--fsdp-sharding-pipeline=ranks=2"])
    assert not re.search(r'"aten::_scaled_dot_product_cudnn_attention"[^\n]*\{fsdp\.recomputed\}', sharded)
    assert re.search(r'\{fsdp\.recomputed\}', sharded), "nothing of the blocks is recomputed"


def test_attention_under_autocast_is_chosen_for_the_dtype_autocast_gives_it():
    """Capture picks the attention kernel itself: under autocast q, k and v
    are cast as autocast casts them for scaled_dot_product_attention, and
    the kernel is the one eager picks for bf16, not for the fp32 they were
    computed in (rotary positions)."""
    from fsdpc.attention import FusedAttentionFor
    from fsdpc.autocast import recording_regions

    q = torch.empty(2, 4, 256, 64, device="meta")
    mode = FusedAttentionFor("cuda")
    with recording_regions("cuda"), torch.autocast("cuda", dtype=torch.bfloat16), mode:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    half = q.to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert mode.chosen == [cuda_attention_kernel(half, half, half, None, True, False, CudaTarget())]
    assert mode.chosen != [cuda_attention_kernel(q, q, q, None, True, False, CudaTarget())]


def test_rms_norm_under_autocast_is_fused_where_autocast_lists_it(monkeypatch):
    """Where this torch's autocast lists rms_norm for CUDA (in its fp32
    list: torch 2.15, not 2.11) the fused kernel takes fp32 inputs, as
    autocast casts them; where it does not, the call stays as written,
    since the dtypes it will see are not known on meta."""
    import fsdpc.rms_norm as rms_norm
    from fsdpc.autocast import recording_regions

    fused_inputs = []
    monkeypatch.setattr(rms_norm, "fused_rms_norm",
                        lambda input, *rest: (fused_inputs.append(input.dtype), (input, None))[1])
    x = torch.empty(4, 64, device="meta", dtype=torch.bfloat16)
    weight = torch.empty(64, device="meta", dtype=torch.bfloat16)
    with recording_regions("cuda"), torch.autocast("cuda", dtype=torch.bfloat16), rms_norm.FusedRmsNormFor("cuda"):
        torch.nn.functional.rms_norm(x, (64,), weight)
    listed = torch._C._dispatch_has_kernel_for_dispatch_key("aten::rms_norm", "AutocastCUDA")
    assert fused_inputs == ([torch.float32] if listed else []), (torch.__version__, fused_inputs)
    with rms_norm.FusedRmsNormFor("cuda"):  # outside autocast: fused as it comes
        torch.nn.functional.rms_norm(x, (64,), weight)
    assert fused_inputs[-1] == torch.bfloat16


def test_multihead_attention_reaches_the_fused_kernel():
    """nn.MultiheadAttention calls attention inside
    F.multi_head_attention_forward, which capture's mode sees whole: the
    call is routed all the same (before 2026-11-28 math attention there)."""
    from torch import nn

    from fsdpc.capture import MixedPrecision
    from fsdpc.export import export_training_step

    with torch.device("meta"):
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    text = export_training_step(layer, (torch.empty(2, 16, 64, device="meta"),), lambda m, x: m(x).float().sum(),
                                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), device="cuda").mlir
    calls = aten_calls(text)
    fused = [call for call in calls if re.fullmatch(r"_scaled_dot_product_(cudnn|flash|efficient)_attention", call)]
    assert len(fused) == 1 and calls.count(f"{fused[0]}_backward") == 1, sorted(set(calls))
    assert not {"_softmax", "_softmax_backward_data", "bmm"} & set(calls), sorted(set(calls))

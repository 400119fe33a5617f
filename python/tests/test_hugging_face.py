"""Hugging Face architectures as users load them train through fsdpc.shard
as in eager PyTorch: one rank (hf_models.py, one job for all of them) runs
each, and each test here reads its architecture's result. The scenario
`hugging_face` of api_train.py trains three of them on two ranks against
FSDP2."""

import json
from pathlib import Path

import pytest
import transformers

from hf_models import ARCHITECTURES
from launch import environment, free_port, run_ranks


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("hugging-face") / "results.json"
    done = run_ranks(1, [Path(__file__).with_name("hf_models.py"), "--out", out], env=environment(),
                     port=free_port(), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


# Before this transformers (5.17 seen, 5.24 not), these architectures' code
# reads tensors' values in Python on a CPU: OPT's and BART's LayerDrop compare
# a random draw even when layerdrop is 0, and the fp32 MoE grouped-matmul
# fallback's backward loops over token counts. fsdpc refuses them at that
# line there, which is the right answer; anything else refused fails.
DATA_DEPENDENT_BEFORE = (5, 24)
DATA_DEPENDENT_ON_CPU = {"opt", "bart", "mixtral", "qwen3-moe", "deepseek-v3", "gpt-oss"}


def result_of(results: dict, name: str, check: str) -> dict:
    result = results[f"{name} on {check}"]
    if "missing" in result:
        pytest.skip(result["missing"])
    older = tuple(int(part) for part in transformers.__version__.split(".")[:2]) < DATA_DEPENDENT_BEFORE
    if "refused" in result and older and check == "cpu" and name in DATA_DEPENDENT_ON_CPU:
        pytest.skip(f"transformers {transformers.__version__}: {result['refused']}")
    assert "refused" not in result and "error" not in result, result
    return result


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_trains_as_in_eager(name, results):
    """The first training call's loss and gradients equal eager's on the
    same batch, padded for decoders: the loss to 1e-5, each parameter's
    gradient to 1e-3 of its own largest element (or of a thousandth of the
    step's largest: a key bias's gradient is zero in exact arithmetic, so
    noise); fp32, the step's math attention summing in another order than
    eager's CPU flash attention."""
    result = result_of(results, name, "cpu")
    assert result["loss"] == pytest.approx(result["eager"], rel=1e-5), result
    assert result["gradient error"] < 1e-3, result


# Falcon's one key/value head for four query heads, without enable_gqa: eager's
# CUDA dispatch takes math attention there too.
MATH_ATTENTION_ON_GPUS = {"falcon"}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_lowers_for_a_cuda_target(name, results):
    """Captured for a CUDA GPU in bf16 without one, sharded and lowered to a
    program for "cuda"; where the model's attention is sdpa, with the fused
    attention kernel and its backward (the others write attention out:
    BLOOM's alibi, GPT-OSS's sinks, Mamba has none). Before 2026-11-28
    BLOOM's crashed fsdp-opt and per-head norms failed capture."""
    result = result_of(results, name, "cuda")
    assert result["device"] == "cuda"
    if result["attention implementation"] == "sdpa" and name not in MATH_ATTENTION_ON_GPUS:
        assert any(kernel.endswith("_backward") for kernel in result["attention"]), result
    else:
        assert not result["attention"], result

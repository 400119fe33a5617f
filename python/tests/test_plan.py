"""`fsdpc plan`: the memory of the compiled step for N GPUs against a GPU's
memory, with a verdict; bad input gets one clear line."""

import pytest

from fsdpc.__main__ import main
from fsdpc.plan import GPU_KINDS, Plan, PlanError, capture_for_plan, gpu_kind, plan_memory, what_would_fit
from test_cli import BAD_MODELS, fsdpc


@pytest.fixture(scope="module")
def gpt_ir():
    return capture_for_plan("gpt", batch=4, seq=32, mixed_precision=None)


def test_the_plan_is_the_sharded_step_and_shrinks_with_more_gpus(gpt_ir):
    two, four = (plan_memory(gpt_ir, gpus=n, gpu=GPU_KINDS["h100-sxm"], model="gpt") for n in (2, 4))
    # AdamW in fp32: gradients as large as the shards, two moments twice as large.
    for plan in (two, four):
        assert plan.memory.grads == plan.memory.params and plan.memory.optimizer == 2 * plan.memory.params
        assert plan.memory.peak > plan.memory.params + plan.memory.grads + plan.memory.optimizer
    # Shards halve up to padding (ceil(rows / N) rows per rank).
    assert four.memory.params < two.memory.params
    assert abs(2 * four.memory.params - two.memory.params) < 0.02 * two.memory.params
    assert two.verdict.startswith("fits: ") and two.headroom > 0


def test_the_verdict_says_by_how_much(gpt_ir):
    peak = plan_memory(gpt_ir, gpus=2, gpu=GPU_KINDS["h100-sxm"], model="gpt").memory.peak
    exact = plan_memory(gpt_ir, gpus=2, gpu=gpu_kind("custom", peak / 2**30), model="gpt")
    assert exact.headroom == pytest.approx(0, abs=1) and exact.verdict.startswith("fits: ")
    short = Plan(exact.model, exact.gpus, gpu_kind("custom", (peak - 3 * 2**20) / 2**30), exact.memory)
    assert short.verdict.startswith("does not fit: ") and "3.00 MiB more than" in short.verdict


def test_what_would_fit_names_only_settings_its_model_says_fit(gpt_ir):
    at_two = plan_memory(gpt_ir, gpus=2, gpu=GPU_KINDS["h100-sxm"], model="gpt")
    at_four = plan_memory(gpt_ir, gpus=4, gpu=GPU_KINDS["h100-sxm"], model="gpt")
    assert what_would_fit(gpt_ir, at_two) == []  # it fits: nothing to suggest
    between = gpu_kind("custom", (at_four.memory.peak + at_two.memory.peak) / 2 / 2**30)
    tight = plan_memory(gpt_ir, gpus=2, gpu=between, model="gpt")
    assert tight.verdict.startswith("does not fit")
    ways = what_would_fit(gpt_ir, tight)
    assert ways[0] == f"4 GPUs: {at_four.verdict.split(': ')[1].split(' per GPU')[0]} per GPU", ways
    for way in ways[1:]:  # each at 2 GPUs, re-planned with its option, fits
        option = way[way.index("(") + 1:way.index(")")]
        if option.startswith("offload-to-fit"):
            option = f"offload-to-fit={between.memory // 2**20}"
        assert plan_memory(gpt_ir, gpus=2, gpu=between, model="gpt", pipeline=option).headroom >= 0, way


def test_offload_to_fit_brings_the_peak_within_the_budget(gpt_ir):
    whole = plan_memory(gpt_ir, gpus=1, gpu=GPU_KINDS["h100-sxm"], model="gpt").memory
    budget_mib = (whole.peak - whole.params) // 2**20  # less than the peak: some units must go
    fitted = plan_memory(gpt_ir, gpus=1, gpu=GPU_KINDS["h100-sxm"], model="gpt",
                         pipeline=f"offload-to-fit={budget_mib}").memory
    assert fitted.host > 0 and fitted.peak <= budget_mib * 2**20 < whole.peak


def test_the_command_prints_the_table_and_the_verdict():
    done = fsdpc("plan", "--model", "mlp", "--gpus", "2", "--gpu", "custom", "--memory-gib", "1", "--batch", "4")
    assert done.returncode == 0, done.stderr
    assert "memory per rank (2 x custom GPU (1 GiB)):" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("fits: ")


@pytest.mark.parametrize("args, message", [
    (["--model", "mlp", "--gpus", "2", "--gpu", "b300"], "unknown GPU kind 'b300'; known: a100-80gb, h100-sxm"),
    (["--model", "mlp", "--gpus", "0"], "--gpus must be at least 1, got 0"),
    (["--model", "mlp", "--gpus", "2", "--gpu", "custom"], "--gpu custom needs --memory-gib"),
    (["--gpus", "2"], "give --model (a built-in name or file.py:factory) or --mlir"),
    (["--model", f"{BAD_MODELS}:batch_norm", "--gpus", "2"], "updates buffer"),
])
def test_bad_input_is_one_clear_line(args, message, capsys):
    assert main(["plan", *args]) == 1
    stderr = capsys.readouterr().err
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_a_step_captured_for_the_cpu_is_refused(tmp_path):
    ir = tmp_path / "mlp.mlir"
    assert main(["export", "--model", "mlp", "--batch", "4", "--out", str(ir)]) == 0
    with pytest.raises(PlanError, match="was captured for the CPU"):
        plan_memory(ir.read_text(), gpus=2, gpu=GPU_KINDS["h100-sxm"], model="mlp.mlir")

"""`fsdpc plan`: the memory of the compiled step for N GPUs against a GPU's
memory, its predicted time, a verdict; bad input gets one clear line."""

import pytest

from fsdpc.__main__ import main
import dataclasses
import json

from fsdpc.plan import Machine, PlanError, capture_for_plan, machine, plan_step, what_would_fit
from test_cli import BAD_MODELS, fsdpc


@pytest.fixture(scope="module")
def gpt_ir():
    return capture_for_plan("gpt", batch=4, seq=32, mixed_precision=None)


def test_the_plan_is_the_sharded_step_and_shrinks_with_more_gpus(gpt_ir):
    two, four = (plan_step(gpt_ir, gpus=n, model="gpt") for n in (2, 4))
    # AdamW in fp32: gradients as large as the shards, two moments twice as large.
    for plan in (two, four):
        assert plan.memory.grads == plan.memory.params and plan.memory.optimizer == 2 * plan.memory.params
        assert plan.memory.peak > plan.memory.params + plan.memory.grads + plan.memory.optimizer
    # Shards halve up to padding (ceil(rows / N) rows per rank).
    assert four.memory.params < two.memory.params
    assert abs(2 * four.memory.params - two.memory.params) < 0.02 * two.memory.params
    assert two.verdict.startswith("fits: ") and two.headroom > 0


def test_the_verdict_says_by_how_much(gpt_ir):
    peak = plan_step(gpt_ir, gpus=2, model="gpt").memory.peak
    exact = plan_step(gpt_ir, gpus=2, machine=machine("h100-sxm", memory_gib=peak / 2**30), model="gpt")
    assert exact.headroom == pytest.approx(0, abs=1) and exact.verdict.startswith("fits: ")
    short = dataclasses.replace(exact, gpu_memory=peak - 3 * 2**20)
    assert short.verdict.startswith("does not fit: ") and "3.00 MiB more than" in short.verdict


def test_what_would_fit_names_only_settings_its_model_says_fit(gpt_ir):
    at_two = plan_step(gpt_ir, gpus=2, model="gpt")
    at_four = plan_step(gpt_ir, gpus=4, model="gpt")
    assert what_would_fit(gpt_ir, at_two) == []  # it fits: nothing to suggest
    between = machine("h100-sxm", memory_gib=(at_four.memory.peak + at_two.memory.peak) / 2 / 2**30)
    tight = plan_step(gpt_ir, gpus=2, machine=between, model="gpt")
    assert tight.verdict.startswith("does not fit")
    ways = what_would_fit(gpt_ir, tight)
    assert ways[0].startswith(f"4 GPUs: {at_four.verdict.split(': ')[1].split(' per GPU')[0]} per GPU, "), ways
    for way in ways[1:]:  # each at 2 GPUs, re-planned with its option, fits
        option = way[way.index("(") + 1:way.index(")")]
        if option.startswith("offload-to-fit"):
            option = f"offload-to-fit={tight.gpu_memory // 2**20}"
        assert plan_step(gpt_ir, gpus=2, machine=between, model="gpt", pipeline=option).headroom >= 0, way


def test_offload_to_fit_brings_the_peak_within_the_budget(gpt_ir):
    whole = plan_step(gpt_ir, gpus=1, model="gpt")
    budget_mib = (whole.memory.peak - whole.memory.params) // 2**20  # less than the peak: some units must go
    fitted = plan_step(gpt_ir, gpus=1, model="gpt", pipeline=f"offload-to-fit={budget_mib}")
    assert fitted.memory.host > 0 and fitted.memory.peak <= budget_mib * 2**20 < whole.memory.peak
    # What leaves the device crosses the host link, and its optimizer steps on the host.
    assert fitted.time.transfer > 0 and whole.time.transfer == 0
    assert fitted.time.step > whole.time.step


def test_the_predicted_time_follows_the_schedule_and_the_links(gpt_ir, tmp_path):
    one_node = plan_step(gpt_ir, gpus=8, model="gpt")
    eight_nodes = plan_step(gpt_ir, gpus=8, machine=machine("h100-sxm", 1), model="gpt")
    slow_link = plan_step(gpt_ir, gpus=8, machine=machine("h100-sxm", intra_node_gbps=1), model="gpt")
    # The same schedule: the same kernels, whatever the links.
    assert one_node.time.compute == eight_nodes.time.compute == slow_link.time.compute
    # Across nodes, or over a slower link, the collectives take longer.
    assert one_node.time.communication < eight_nodes.time.communication < slow_link.time.communication
    assert one_node.time.step <= slow_link.time.step
    # The batch is 4 x 32 tokens; MFU counts the model's FLOPs over the bf16 peak.
    assert one_node.time.tokens == 4 * 32
    assert one_node.time.mfu == pytest.approx(
        one_node.time.model_flops / one_node.time.step / one_node.time.tensor_flops)
    # A faster GPU of the same kind is faster; recomputation adds FLOPs that MFU leaves out.
    faster = plan_step(gpt_ir, gpus=8, machine=machine("h200"), model="gpt")
    assert faster.time.compute < one_node.time.compute
    recomputed = plan_step(gpt_ir, gpus=8, model="gpt", pipeline="checkpoint=*")
    assert recomputed.time.model_flops == one_node.time.model_flops
    assert recomputed.time.compute > one_node.time.compute
    trace = tmp_path / "step.json"
    plan_step(gpt_ir, gpus=8, model="gpt", trace=str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {event["args"]["name"] for event in events if event["name"] == "thread_name"}
    assert tracks == {"compute", "collectives @fsdp_grid axes [0]"}
    ends = [event["ts"] + event["dur"] for event in events if event.get("ph") == "X"]
    assert max(ends) == pytest.approx(one_node.time.step * 1e6, rel=1e-6)


def test_the_command_prints_the_table_and_the_verdict():
    done = fsdpc("plan", "--model", "mlp", "--nodes", "2", "--gpus-per-node", "1", "--memory-gib", "1",
                 "--batch", "4")
    assert done.returncode == 0, done.stderr
    assert "memory per rank (2 x H100 SXM 80GB):" in done.stdout and "1.00 GiB (H100 SXM 80GB)" in done.stdout
    assert "time per rank (predicted, 1 GPUs per node):" in done.stdout and "tokens/s per GPU" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("fits: ")


@pytest.mark.parametrize("args, message", [
    (["--model", "mlp", "--gpus", "2", "--gpu", "b300"], "unknown GPU kind 'b300'; use h100-sxm, h100-96gb, h200"),
    (["--model", "mlp", "--gpus", "0"], "--gpus must be at least 1, got 0"),
    (["--model", "mlp", "--gpus", "12"], "12 GPUs do not fill nodes of 8; give a multiple of --gpus-per-node"),
    (["--model", "mlp", "--gpus", "4", "--nodes", "2"], "--gpus 4 is not --nodes 2 x --gpus-per-node 8"),
    (["--model", "mlp", "--gpus", "2", "--gpu", "custom", "--memory-gib", "80"],
     "time model: tensor-tflops must be > 0, got 0"),
    (["--model", "mlp", "--gpus", "2", "--memory-gbps", "-5"], "time model: memory-gbps must be > 0, got -5"),
    (["--model", "mlp"], "give --gpus, or --nodes (with --gpus-per-node)"),
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
        plan_step(ir.read_text(), gpus=2, model="mlp.mlir")

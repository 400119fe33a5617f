"""`fsdpc plan`: the memory of the compiled step for N GPUs against a GPU's
memory, its predicted time, a verdict; bad input gets one clear line."""

import pytest

from fsdpc.__main__ import main
import dataclasses
import json
import re

from fsdpc.compiler import run_fsdp_opt
from fsdpc.plan import (HOST_BOUND_SHARE, PlanError, Profile, calibrate, capture_for_plan, each_setting, intermediate_replicas, machine,
                         plan_step, search, search_space, size, what_would_fit, when_replayed)
from test_cli import BAD_MODELS


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
    # Just under the peak one block is enough, and of the equal blocks the
    # one the forward gathers last goes: its gradients land first in
    # backward, and the forward starts on units the host does not update.
    just_under = whole.memory.peak // 2**20
    sharded = run_fsdp_opt(gpt_ir, [f"--fsdp-sharding-pipeline=ranks=1 backend=nccl offload-to-fit={just_under}"])
    units = re.findall(r'fsdp\.unit @"?([\w.]+)"?([^\n]*)', sharded)
    offloaded = [name for name, rest in units if " offloaded" in rest]
    assert offloaded == [[name for name, _ in units if name.startswith("blocks.")][-1]], units


def test_an_overlapped_host_optimizer_runs_beside_the_next_forward(gpt_ir):
    """The same host work, but the host steps each offloaded unit during the
    next step, before its gather, instead of after the step."""
    after = plan_step(gpt_ir, gpus=1, model="gpt", pipeline="offload=*")
    beside = plan_step(gpt_ir, gpus=1, model="gpt", pipeline="offload=*",
                       machine=machine(host_optimizer="next-forward"))
    assert beside.time.host_optimizer == after.time.host_optimizer > 0
    assert beside.time.compute == after.time.compute
    assert beside.time.step < after.time.step
    # Every unit is gathered after its update: the step cannot end before
    # the host has stepped them all.
    assert beside.time.step > beside.time.host_optimizer


def test_a_host_optimizer_in_backward_starts_as_gradients_land(gpt_ir, tmp_path):
    """Where the host's optimizer work bounds the step (a slow host), steps
    that start as each unit's gradients land keep the host busy through the
    backward too: a shorter step than beside the next forward alone, and in
    the steady state never shorter than the host's work."""
    slow = {"host_optimizer_gbps": 0.5}
    beside = plan_step(gpt_ir, gpus=1, model="gpt", pipeline="offload=*",
                       machine=machine(host_optimizer="next-forward", **slow))
    trace = tmp_path / "in-backward.json"
    landed = plan_step(gpt_ir, gpus=1, model="gpt", pipeline="offload=*",
                       machine=machine(host_optimizer="in-backward", **slow), trace=str(trace))
    assert landed.time.host_optimizer == beside.time.host_optimizer > 0
    assert landed.time.compute == beside.time.compute
    assert landed.time.host_optimizer <= landed.time.step < beside.time.step
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("(in backward)" in event.get("name", "") for event in events)
    with pytest.raises(PlanError, match="unknown host optimizer timing 'sometimes'"):
        machine(host_optimizer="sometimes")


def test_offloaded_copies_cross_the_host_link_both_ways_at_once(gpt_ir, tmp_path):
    """The host link is full duplex and the runtime copies each way on a
    stream of its own: in backward a unit's gradients go out while the next
    unit's shards come in."""
    trace = tmp_path / "offloaded.json"
    plan_step(gpt_ir, gpus=1, model="gpt", pipeline="offload=*", machine=machine(host_link_gbps=0.05),
              trace=str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {event["tid"]: event["args"]["name"] for event in events if event["name"] == "thread_name"}
    copies = {way: [(event["ts"], event["ts"] + event["dur"]) for event in events
                    if event.get("ph") == "X" and tracks[event["tid"]] == way]
              for way in ("host to device", "device to host")}
    assert all(copies.values()), copies
    assert any(begin < other_end and other_begin < end
               for begin, end in copies["host to device"] for other_begin, other_end in copies["device to host"])


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


def test_a_step_the_host_bounds_is_planned_replayed_as_a_cuda_graph(gpt_ir):
    """A small step waits for the host to issue its calls: the plan says so,
    with its time replayed as a CUDA graph, which the time model predicts
    shorter; not for a step replayed already, one that offloads, or one the
    host does not bound."""
    plan = plan_step(gpt_ir, gpus=1, model="gpt")
    assert plan.time.host_bound > 0.5 * plan.time.step
    line = when_replayed(gpt_ir, plan)
    match = re.search(r"waits ([\d.]+) of its ([\d.]+) ms .*cuda-graph=true\): ([\d.]+) ms", line or "")
    assert match, line
    assert float(match.group(2)) == pytest.approx(plan.time.step * 1e3, abs=0.01)
    replayed = plan_step(gpt_ir, gpus=1, model="gpt", pipeline="cuda-graph=true")
    assert float(match.group(3)) == pytest.approx(replayed.time.step * 1e3, abs=0.01)
    assert line.endswith(f"its {size(replayed.memory.working)} of working memory kept reserved between calls")
    assert 0 < replayed.memory.working < replayed.memory.peak
    assert replayed.time.step < 0.5 * plan.time.step and replayed.time.host_bound < plan.time.host_bound
    assert when_replayed(gpt_ir, replayed, pipeline="cuda-graph=true") is None
    offloaded = plan_step(gpt_ir, gpus=1, model="gpt", pipeline="offload=*")
    assert offloaded.time.host_bound > 0.2 * offloaded.time.step and when_replayed(gpt_ir, offloaded) is None
    unbound = plan_step(gpt_ir, gpus=1, model="gpt", machine=machine(issue_us=0))
    assert when_replayed(gpt_ir, unbound) is None


def test_the_search_replays_a_step_the_host_bounds(gpt_ir):
    """Where the host bounds the default step, the search tries its fastest
    configurations replayed as CUDA graphs too; replayed, they come first.
    Offloading configurations are never replayed."""
    result = search(gpt_ir, gpus=1, model="gpt")
    assert result.default.time.host_bound > 0.5 * result.default.time.step
    best = result.fitting[0]
    assert "cuda-graph=true" in best.settings.split(), best.settings
    assert best.plan.time.step < 0.5 * result.default.time.step
    assert all("offload" not in c.settings for c in result.fitting if "cuda-graph=true" in c.settings)
    assert not any("cuda-graph=true" in c.settings for c in
                   search(gpt_ir, gpus=1, model="gpt", machine=machine(issue_us=0)).fitting)


def test_the_search_ranks_only_what_its_memory_model_says_fits(gpt_ir):
    default = plan_step(gpt_ir, gpus=8, model="gpt")
    smallest = plan_step(gpt_ir, gpus=8, model="gpt", pipeline="checkpoint=*")
    budget = (default.memory.peak + smallest.memory.peak) // 2  # the defaults do not fit
    space = search_space(gpt_ir, 8, machine())
    assert len(space) >= 50 and space[0] == ("", 1)
    some = space[::8]  # every knob varies across these (CI time)
    result = search(gpt_ir, gpus=8, model="gpt", budget=budget, space=some)
    # The fastest twelfth that fit and checkpoint are planned again with the
    # op-level policy, then the fastest sixth with units in pairs, and (the
    # host bounds this small step) the fastest sixth replayed as CUDA graphs.
    assert result.default.time.host_bound > HOST_BOUND_SHARE * result.default.time.step
    assert result.tried == len(some) + max(1, len(some) // 12) + 2 * (len(some) // 6)
    assert all(c.plan.memory.peak <= budget for c in result.fitting if "checkpoint-policy=ops" in c.settings)
    paired = [c for c in result.fitting if c.settings.endswith(" units-per-group=2")]
    assert paired and all(c.plan.memory.peak <= budget for c in paired)
    assert result.default.memory.peak == default.memory.peak > budget and result.fitting
    steps = [c.plan.time.step for c in result.fitting]
    assert steps == sorted(steps)
    for candidate in result.fitting[:5]:  # planned again alone, each still fits
        again = plan_step(gpt_ir, gpus=8, model="gpt", pipeline=candidate.settings, replicas=candidate.replicas)
        assert again.memory.peak == candidate.plan.memory.peak <= budget, candidate.settings
    # Each of the best's settings: its share of the step, or needed to fit.
    best = result.fitting[0]
    parts = each_setting(gpt_ir, best, budget=budget)
    assert [part.split(": ")[0] for part in parts] == best.settings.split()
    for part, setting in zip(parts, best.settings.split()):
        without = plan_step(gpt_ir, gpus=8, model="gpt", pipeline=best.settings.replace(setting, ""))
        assert part.endswith(f"needed to fit (without it {size(without.memory.peak)})") if without.memory.peak > budget \
            else part.endswith(f"{(best.plan.time.step - without.time.step) * 1e3:+.1f} ms"), part
    # Across two nodes the search also tries one replica per node (HSDP);
    # across eight, shard groups of two and four nodes as well.
    assert {replicas for _, replicas in search_space(gpt_ir, 16, machine())} == {1, 2}
    assert intermediate_replicas(16, machine()) == [] and intermediate_replicas(64, machine()) == [2, 4]
    across = search(gpt_ir, gpus=32, machine=machine("h100-sxm", 4), model="gpt", space=some[:12])
    assert across.tried == 12 + 2 * 1 + 1 + 2 * max(1, 12 // 6)
    assert {c.replicas for c in across.fitting} >= {2, 4}
    # Nothing fits a byte: the lowest peaks are retried offloading, and still nothing fits.
    nothing = search(gpt_ir, gpus=8, model="gpt", budget=1, space=some)
    assert nothing.fitting == [] and nothing.tried == len(some) + max(1, len(some) // 6)


def write_profile(path):
    """A profiler trace of one step as PyTorch writes it on a GPU: host calls
    (`cpu_op`, one nested in another, one a generated kernel's launch), the
    kernels each launched (linked by External id), a collective's kernel and
    an optimizer step."""
    def call(name, ident, ts, dur):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 7, "ts": ts, "dur": dur,
                "args": {"External id": ident}}

    def kernel(name, ident, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"External id": ident, "stream": 7}}
    events = [call("aten::mm", 1, 0, 10), call("aten::_scaled_dot_product_cudnn_attention", 2, 10, 10),
              call("aten::empty", 3, 12, 1), call("aten::mul.Tensor", 4, 20, 5), call("fsdp::pointwise", 6, 25, 5),
              call("aten::_fused_adamw_", 5, 40, 5),
              kernel("sm90_gemm", 1, 100, 100), kernel("sm90_gemm_splitk", 1, 200, 50), kernel("cudnn_sdpa", 2, 250, 200),
              kernel("fill", 3, 450, 5), kernel("elementwise", 4, 455, 20), kernel("fsdp_pointwise_0_kernel", 6, 475, 10),
              kernel("adamw", 5, 500, 30),
              kernel("ncclDevKernel_AllGather_RING", 0, 100, 500)]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def plan_command(capsys, *args):
    """`python -m fsdpc plan ARGS` in this process (torch is imported once): its stdout."""
    assert main(["plan", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_measured_profile_calibrates_the_time_model(gpt_ir, tmp_path, capsys):
    # The calls' classes are the time model's, from the step's report.
    classes = plan_step(gpt_ir, gpus=1, model="gpt").time.kernel_classes
    assert classes["aten::mm"] == "matmul" and classes["aten::view"] == "view"
    assert classes["aten::add"] == "memory" and "aten::add.Tensor" not in classes
    classes = {**classes, "aten::_scaled_dot_product_cudnn_attention": "attention"}
    profile = Profile.read(write_profile(tmp_path / "step.json"), classes)
    # Kernels count for the top-level call that launched them (the fill
    # inside attention, attention's); collectives and the optimizer do not count.
    assert profile.kernels == pytest.approx({"matmul": 150e-6, "attention": 205e-6, "memory": 30e-6})
    assert profile.ops == 4 and profile.host == pytest.approx(30e-6)
    plan = plan_step(gpt_ir, gpus=1, model="gpt")
    numbers = calibrate(profile, {"matmul": 75e-6, "attention": 102.5e-6, "memory": 30e-6})
    assert numbers == pytest.approx({"matmul-efficiency": 0.5, "attention-efficiency": 0.5,
                                     "memory-efficiency": 1.0, "issue-us": 7.5})
    # Calibrated numbers go to the model (this step's products are tiny: only a
    # far lower efficiency lifts them above the shortest kernel).
    calibrated = plan_step(gpt_ir, gpus=1, model="gpt", machine=machine("h100-sxm", matmul_efficiency=0.001))
    assert calibrated.time.compute > plan.time.compute + plan.time.ideal["matmul"] / 0.001 / 2
    out = plan_command(capsys, "--model", "mlp", "--gpus", "2", "--batch", "4", "--profile", str(tmp_path / "step.json"))
    assert out.startswith(f"calibrated from {tmp_path / 'step.json'} (4 calls): matmul-efficiency ")


def test_planning_a_step_again_reuses_its_capture(tmp_path, monkeypatch):
    """A second plan of the same step records its calls and takes its
    capture from the program cache without exporting; where the calls give
    no key, it exports the forward and takes the rest from the cache;
    another sequence length is another step."""
    import fsdpc.plan
    from fsdpc.export import ExportStage

    monkeypatch.setenv("FSDPC_CACHE", str(tmp_path / "cache"))
    first = capture_for_plan("llama", batch=2, seq=16, mixed_precision=None)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2  # under the calls and under export's trace

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    def no_joint_trace(stage):
        raise AssertionError("the joint trace ran again")

    with monkeypatch.context() as patched:
        patched.setattr(fsdpc.plan, "traced_forward", no_export)
        assert capture_for_plan("llama", batch=2, seq=16, mixed_precision=None) == first
        with pytest.raises(AssertionError, match="exported again"):
            capture_for_plan("llama", batch=2, seq=8, mixed_precision=None)
    with monkeypatch.context() as patched:
        patched.setattr(fsdpc.plan, "call_trace", lambda *args, **kwargs: None)
        patched.setattr(ExportStage, "export", no_joint_trace)
        assert capture_for_plan("llama", batch=2, seq=16, mixed_precision=None) == first
        with pytest.raises(AssertionError, match="joint trace ran again"):
            capture_for_plan("llama", batch=2, seq=4, mixed_precision=None)


def test_the_command_prints_the_table_and_the_verdict(capsys):
    out = plan_command(capsys, "--model", "mlp", "--nodes", "2", "--gpus-per-node", "1", "--memory-gib", "1",
                       "--batch", "4")
    assert "memory per rank (2 x H100 SXM 80GB):" in out and "1.00 GiB (H100 SXM 80GB)" in out
    assert "time per rank (predicted, 1 GPUs per node):" in out and "tokens/s per GPU" in out
    assert out.strip().splitlines()[-1].startswith("fits: ")


def test_a_conv_net_is_planned(capsys):
    """The conv net for a CUDA target: its first convolution's backward
    leaves the images' gradient out (`none`), which the time model crashed
    on, and its mean over pixels backward is an expand the pointwise fusion
    made a kernel its verifier refused (both before 2026-11-28)."""
    out = plan_command(capsys, "--model", "convnet", "--gpus", "2")
    assert out.strip().splitlines()[-1].startswith("fits: ")


def test_the_search_command_ranks_and_says_why(tmp_path, capsys):
    trace = tmp_path / "best.json"
    lines = plan_command(capsys, "--model", "mlp", "--gpus", "2", "--batch", "4", "--search", "--top", "3",
                         "--trace", str(trace)).strip().splitlines()
    assert "configurations planned in" in lines[0] and lines[1].split()[:2] == ["#", "step"]
    assert lines[2].split()[0] == "1" and lines[-1].startswith("fits: ") and trace.exists()
    assert any(line.startswith("why #1: against the defaults (") for line in lines)
    assert int(lines[0].split(": ")[-1].split()[0]) >= 50  # "N configurations planned in ..."


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
    (["--model", "mlp", "--gpus", "2", "--profile", "/nonexistent.json"],
     "--profile /nonexistent.json: not a Chrome trace with traceEvents"),
    (["--model", f"{BAD_MODELS}:buffer_reshape", "--gpus", "2"], "reshapes buffer 'table' in place"),
])
def test_bad_input_is_one_clear_line(args, message, capsys):
    assert main(["plan", *args]) == 1
    stderr = capsys.readouterr().err
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_a_shared_cache_directory_is_one_clear_line(tmp_path, monkeypatch, capsys):
    shared = tmp_path / "cache"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("FSDPC_CACHE", str(shared))
    assert main(["plan", "--model", "mlp", "--gpus", "2"]) == 1
    stderr = capsys.readouterr().err
    assert "must be owned by you and private (chmod 700)" in stderr and len(stderr.strip().splitlines()) == 1


def test_a_step_captured_for_the_cpu_is_refused(tmp_path):
    ir = tmp_path / "mlp.mlir"
    assert main(["export", "--model", "mlp", "--batch", "4", "--out", str(ir)]) == 0
    with pytest.raises(PlanError, match="was captured for the CPU"):
        plan_step(ir.read_text(), gpus=2, model="mlp.mlir")


def test_torchtitans_loss_holds_its_logits_in_fp32():
    """The example the README plans torchtitan's published runs with: its
    loss casts the logits to fp32, so the step's peak holds at least an fp32
    log-softmax where the built-in loss holds a bf16 one."""
    from pathlib import Path

    from fsdpc.capture import MixedPrecision
    from fsdpc.export import build, export_training_step, load_factory
    from fsdpc.models.language import next_token_loss
    from fsdpc.models.llama import LlamaConfig

    import torch

    example = Path(__file__).resolve().parents[2] / "examples" / "torchtitan_llama3_8b.py"
    config = LlamaConfig(vocab_size=8192)  # logits large enough to make the step's peak
    batch, seq = 8, 64
    model, tokens, titan_loss = build(load_factory(f"{example}:make"), meta=True, batch=batch, seq=seq, config=config)
    bf16 = MixedPrecision(torch.bfloat16, torch.float32)
    titan = export_training_step(model, tokens, titan_loss, mixed_precision=bf16, device="cuda").mlir
    model, tokens, _ = build(load_factory(f"{example}:make"), meta=True, batch=batch, seq=seq, config=config)
    ours = export_training_step(model, tokens, next_token_loss, mixed_precision=bf16, device="cuda").mlir
    assert f"tensor<{batch * seq}x{config.vocab_size}xbf16> to tensor<{batch * seq}x{config.vocab_size}xf32>" in titan
    titan_peak, our_peak = (plan_step(ir, gpus=1, model="llama").memory.peak for ir in (titan, ours))
    assert titan_peak - our_peak >= batch * seq * config.vocab_size * 2


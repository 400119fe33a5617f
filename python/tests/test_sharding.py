"""The sharding pipeline on the exported GPT: every strategy, 1 to 8 ranks,
with and without mixed precision. The reports must equal what the strategy
moves and stores, computed here independently from the model's parameters."""

import json
import math
import subprocess

import pytest
import torch
from torch import fx

from fsdpc import find_fsdp_opt
from fsdpc.capture import MixedPrecision
from fsdpc.export import build, export_training_step, load_factory

RANKS = [1, 2, 3, 4, 8]
STRATEGIES = ["full-shard", "shard-grad-op", "no-shard", "hybrid-shard"]
# Operators after which a value still shares a parameter's gathered buffer
# (views, and the dtype cast that the pipeline fuses into the gather).
ALIASING = {"view", "_unsafe_view", "permute", "t", "transpose", "expand", "alias", "slice", "select",
            "unsqueeze", "squeeze", "split", "split_with_sizes", "unbind", "_to_copy"}


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def exported(request):
    torch.manual_seed(0)
    policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if request.param == "bf16" else None
    model, batch, loss_fn = build(load_factory("gpt"), meta=True)
    result = export_training_step(model, batch, loss_fn, mixed_precision=policy)
    return request.param, result


def read_in_backward(result) -> set[str]:
    """Parameters the backward reads (directly or through views/casts)."""
    step = result.step
    order = {node: i for i, node in enumerate(step.graph.nodes)}
    loss_at = order[step.loss]
    placeholders = [n for n in step.graph.nodes if n.op == "placeholder"]
    read = set()
    for node, (kind, fqn) in zip(placeholders, step.inputs):
        if kind != "param":
            continue
        frontier = [node]
        while frontier:
            value = frontier.pop()
            for user in value.users:
                if order[user] > loss_at:
                    read.add(fqn)
                name = getattr(user.target, "__name__", "").split(".")[0]
                if name in ALIASING:
                    frontier.append(user)
    return read


def padded_elements(shape, ranks):
    rows = math.ceil(shape[0] / ranks) * ranks
    return rows * math.prod(shape[1:])


def shard_elements(shape, ranks):
    return math.ceil(shape[0] / ranks) * math.prod(shape[1:])


def run_pipeline(mlir, options, tmp_path):
    comm, memory = tmp_path / "comm.json", tmp_path / "memory.json"
    done = subprocess.run(
        [str(find_fsdp_opt()), "-", "-o", str(tmp_path / "out.mlir"),
         f"--fsdp-sharding-pipeline={options} report-format=json "
         f"comm-report={comm} memory-report={memory}"],
        input=mlir, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return (json.loads(comm.read_text())[0], json.loads(memory.read_text())[0],
            (tmp_path / "out.mlir").read_text())


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("ranks", RANKS)
def test_reports_equal_the_strategy(exported, strategy, ranks, backend, tmp_path):
    precision, result = exported
    replicas = 2 if strategy == "hybrid-shard" else 1
    options = f"ranks={ranks} strategy={strategy} replicas={replicas} backend={backend}"
    comm, memory, out = run_pipeline(result.mlir, options, tmp_path)
    assert 'fsdp.collective_hash = "' in out

    params = {p.fqn: p for p in result.step.params}
    root = {u.name for u in result.plan.units if u.is_root}
    units = {fqn: result.plan.owner([fqn, *p.aliases]) for fqn, p in params.items()}
    gather_bytes = 2 if precision == "bf16" else 4  # the cast rides in the gather
    reduce_bytes = 4                                 # reduce_dtype f32 either way
    collectives = comm["collectives"]
    factor = (ranks - 1) / ranks

    if strategy == "no-shard":
        assert collectives["all_gather"]["count"] == 0
        payload = sum(math.prod(p.shape) * reduce_bytes for p in params.values() if p.trainable)
        expected = 2 * factor * payload
        got = collectives["all_reduce"]
        assert got["payload_bytes"] == payload
        assert abs(got["bytes"] - expected) <= got["count"]
        local = {fqn: math.prod(p.shape) for fqn, p in params.items()}
    else:
        # Forward gathers every parameter once; backward gathers again what it
        # reads of non-root units, unless shard-grad-op keeps them.
        regathered = set()
        if strategy != "shard-grad-op":
            regathered = {f for f in read_in_backward(result) if units[f] not in root}
        gathered = sum(padded_elements(p.shape, ranks) for p in params.values())
        gathered += sum(padded_elements(params[f].shape, ranks) for f in regathered)
        assert collectives["all_gather"]["payload_bytes"] == gathered * gather_bytes
        # NCCL's ring moves (n-1)/n of each buffer; Gloo runs every
        # all-gather and reduce-scatter as an in-place all-reduce, 2(n-1)/n.
        per_rank = {"nccl": 1, "gloo": 2}[backend]
        assert collectives["all_gather"]["bytes"] == per_rank * gathered * gather_bytes * (ranks - 1) // ranks
        reduced = sum(padded_elements(p.shape, ranks) for p in params.values() if p.trainable)
        assert collectives["reduce_scatter"]["payload_bytes"] == reduced * reduce_bytes
        assert collectives["reduce_scatter"]["bytes"] == per_rank * reduced * reduce_bytes * (ranks - 1) // ranks
        if strategy == "hybrid-shard":
            shards = sum(shard_elements(p.shape, ranks) for p in params.values() if p.trainable)
            assert collectives["all_reduce"]["bytes"] == shards * reduce_bytes  # 2 x 1/2 across 2 rows
        else:
            assert collectives["all_reduce"]["count"] == 0
        local = {fqn: shard_elements(p.shape, ranks) for fqn, p in params.items()}

    # Persistent memory: fp32 master shards, gradient shards and AdamW's two
    # moments, i.e. 16 bytes per (padded, local) parameter element.
    persistent = memory["persistent"]
    assert persistent["params"] == 4 * sum(local.values())
    trainable_local = sum(local[f] for f, p in params.items() if p.trainable)
    assert persistent["grads"] == 4 * trainable_local
    assert persistent["optimizer"] == 8 * trainable_local
    assert persistent["params"] + persistent["grads"] + persistent["optimizer"] == 16 * trainable_local


def test_sharding_divides_the_persistent_memory(exported, tmp_path):
    _, result = exported
    totals = {}
    for ranks in (1, 8):
        _, memory, _ = run_pipeline(result.mlir, f"ranks={ranks}", tmp_path)
        persistent = memory["persistent"]
        totals[ranks] = persistent["params"] + persistent["grads"] + persistent["optimizer"]
    assert totals[8] * 8 >= totals[1] > totals[8] * 7  # 1/8 each, plus padding


def test_prefetch_and_checkpointing_trade_memory(exported, tmp_path):
    _, result = exported
    _, eager, _ = run_pipeline(result.mlir, "ranks=4 forward-prefetch=0 backward-prefetch=0", tmp_path)
    _, deep, _ = run_pipeline(result.mlir, "ranks=4 forward-prefetch=2 backward-prefetch=2", tmp_path)
    assert deep["most_gathered_params"] >= eager["most_gathered_params"]
    _, saved, _ = run_pipeline(result.mlir, "ranks=4", tmp_path)
    _, recomputed, _ = run_pipeline(result.mlir, "ranks=4 checkpoint=*", tmp_path)
    assert recomputed["saved_activations"] < saved["saved_activations"]
    budget = eager["most_gathered_params"] // (1024 * 1024) + 1
    _, bounded, _ = run_pipeline(result.mlir, f"ranks=4 forward-prefetch=4 memory-budget-mb={budget}",
                                 tmp_path)
    assert bounded["most_gathered_params"] <= budget * 1024 * 1024


def test_gradient_accumulation_adds_a_no_sync_step(exported, tmp_path):
    _, result = exported
    comm, _, out = run_pipeline(result.mlir, "ranks=4 gradient-accumulation=true", tmp_path)
    assert "func.func @train_step_no_sync" in out
    no_sync = out.split("func.func @train_step_no_sync")[1]
    assert "fsdp.reduce_scatter_start" not in no_sync and " unreduced " in no_sync
    assert out.count("fsdp.get_accumulated_grad") == len([p for p in result.step.params if p.trainable])

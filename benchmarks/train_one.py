"""One system, one torchrun job: trains the 23M-parameter GPT for a few steps
and reports, on rank 0, JSON with what `benchmarks/compare.py` tabulates.
Not meant to be run by hand (compare.py launches it), but it can be:

    OMP_NUM_THREADS=1 PYTHONPATH=python .venv/bin/python -m torch.distributed.run \\
        --nproc-per-node 2 benchmarks/train_one.py --system fsdpc --out result.json

Systems: fsdpc (compiled step), fsdp2 (fully_shard per block and the root,
eager), fsdp2-compile (the same under torch.compile), ddp. Every system
starts from the same initialization and sees the same batches.
`--checkpoint-blocks` wraps every block in `checkpoint_wrapper` first (the
model's own activation checkpointing, as torchtitan applies it before
fully_shard); `--checkpoint-blocks=ops` with torchtitan's op-level
selective policy (attention and every other matrix product saved).

Measured per rank: compile time (capture to the end of the first step),
median step time (forward + backward + AdamW), the step's peak allocated
bytes above its start from the profiler's memory events (forward + backward,
and the whole step with the optimizer), resident memory, the final loss, and
for fsdpc the memory report's prediction and a measured trace's exposed
communication.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from fsdpc.models.gpt import GPT, GPT_23M, Block
from fsdpc.models.language import next_token_loss, token_batch
from fsdpc.profiling import peak_allocated_above_start


def rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def batches(steps, global_batch, seq, rank, world):
    torch.manual_seed(1)
    local = global_batch // world
    out = []
    for _ in range(steps):
        tokens, targets = token_batch(GPT_23M.vocab_size, global_batch, seq)
        out.append((tokens[rank * local:(rank + 1) * local], targets[rank * local:(rank + 1) * local]))
    return out


def build(system: str, model: GPT, example, mesh_world: int, pipeline: str = ""):
    """Returns (forward_backward(batch) -> loss, trainable parameters, extras)."""
    extras = {}
    if system == "fsdpc":
        import fsdpc

        sharded = fsdpc.shard(model, example, next_token_loss, pipeline=pipeline)
        extras["compile_phases_s"] = sharded.compile_seconds
        extras["predicted_peak_mib"] = sharded.memory_report["train_step"]["peak"]["above_step_start"] / 2**20
        extras["step"] = sharded
        return (lambda batch: sharded(*batch)), list(sharded.parameters()), extras
    if system in ("fsdp2", "fsdp2-compile"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (mesh_world,))
        for module in model.modules():
            if isinstance(module, Block):
                fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        run = torch.compile(model) if system == "fsdp2-compile" else model
    elif system == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        run = DistributedDataParallel(model)
    else:
        raise SystemExit(f"unknown system '{system}'")

    def forward_backward(batch):
        loss = next_token_loss(run, *batch)
        loss.backward()
        return loss.detach()

    return forward_backward, list(model.parameters()), extras


MATRIX_PRODUCTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
ATTENTION = (torch.ops.aten._scaled_dot_product_flash_attention.default,
             torch.ops.aten._scaled_dot_product_efficient_attention.default,
             torch.ops.aten._scaled_dot_product_cudnn_attention.default,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def op_level_policy():
    """torchtitan's op-level selective checkpointing (a fresh count per
    checkpoint call): attention's results and every other matrix product's
    saved, the rest recomputed (the GPT's linears have biases: addmm counts
    as a matrix product)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts = {False: 0, True: 0}

    def policy(ctx, func, *args, **kwargs):
        if func in MATRIX_PRODUCTS:
            counts[ctx.is_recompute] += 1
            saved = counts[ctx.is_recompute] % 2 == 1
        else:
            saved = func in ATTENTION
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", required=True)
    parser.add_argument("--steps", type=int, default=6, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--local-batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--trace", default=None, help="fsdpc: write a measured Chrome trace here")
    parser.add_argument("--pipeline", default="", help="fsdpc: extra fsdp-sharding-pipeline options")
    parser.add_argument("--checkpoint-blocks", nargs="?", const="full", choices=["full", "ops"],
                        help="every block under checkpoint_wrapper (torch.utils.checkpoint, non-reentrant); "
                             "ops: with torchtitan's op-level selective policy")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rss_start = rss_mib()
    total = args.warmup + args.steps + 2  # + one profiled step, + one traced step
    data = batches(total, args.local_batch * world, args.seq, rank, world)

    torch.manual_seed(0)
    model = GPT(GPT_23M)
    if args.checkpoint_blocks:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        selective = {"context_fn": op_level_policy} if args.checkpoint_blocks == "ops" else {}
        for index, block in enumerate(model.blocks):
            model.blocks[index] = checkpoint_wrapper(block, **selective)
    start = time.perf_counter()
    forward_backward, params, extras = build(args.system, model, data[0], world, args.pipeline)
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)

    def train_step(batch):
        loss = forward_backward(batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    losses = [float(train_step(data[0]))]
    compile_s = time.perf_counter() - start  # capture/compile to the end of the first step
    for batch in data[1:args.warmup]:
        losses.append(float(train_step(batch)))
    times = []
    for batch in data[args.warmup:args.warmup + args.steps]:
        begin = time.perf_counter()
        losses.append(float(train_step(batch)))
        times.append(time.perf_counter() - begin)
    rss_after_warmup = rss_mib()
    # One step profiled: forward + backward alone, then the optimizer.
    profiled = data[args.warmup + args.steps]
    fb_peak, loss = peak_allocated_above_start(lambda: forward_backward(profiled))
    opt_peak, _ = peak_allocated_above_start(lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)))
    losses.append(float(loss))
    result = {"system": args.system, "ranks": world, "compile_s": compile_s,
              "step_s": statistics.median(times), "step_times_s": times,
              "peak_fwd_bwd_mib": fb_peak / 2**20, "peak_optimizer_mib": opt_peak / 2**20,
              "rss_after_warmup_mib": rss_after_warmup, "rss_growth_mib": rss_after_warmup - rss_start,
              "losses": losses}
    if args.system == "fsdpc":
        step = extras.pop("step")
        traced = data[-1]
        step(*traced, trace=True)
        optimizer.zero_grad(set_to_none=True)
        summary = step.write_trace(args.trace)
        result["exposed_comm_share"] = summary["exposed_comm_share"]
    result.update(extras)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, result)
    if rank == 0:
        with open(args.out, "w") as out:
            json.dump(everyone, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

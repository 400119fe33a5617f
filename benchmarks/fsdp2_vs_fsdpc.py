"""Step time and memory of the built-in GPT: PyTorch FSDP2 (`fully_shard`,
eager, Gloo on CPU) against fsdpc's compiled step, same ranks, batch and
initialization, run side by side in one job. Usage (repository root):

    PYTHONPATH=python .venv/bin/python -m torch.distributed.run --nproc-per-node 2 \\
        benchmarks/fsdp2_vs_fsdpc.py --steps 30 --repeats 3

Prints, on rank 0, the median step time of each (after warm-up steps), their
ratio, the final losses (they must agree) and each process's peak RSS
growth while training.
"""

import argparse
import resource
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fsdpc.models.gpt import GPT, Block, GPTConfig
from fsdpc.models.language import next_token_loss, token_batch
from fsdpc.runtime import compile_step


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def batches(steps, global_batch, seq, rank, world):
    torch.manual_seed(1)
    local = global_batch // world
    out = []
    for _ in range(steps):
        tokens, targets = token_batch(GPTConfig().vocab_size, global_batch, seq)
        out.append((tokens[rank * local:(rank + 1) * local], targets[rank * local:(rank + 1) * local]))
    return out


def time_steps(step_fn, optimizer, data, warmup):
    times, loss = [], None
    for i, batch in enumerate(data):
        start = time.perf_counter()
        loss = step_fn(batch)
        optimizer.step()
        optimizer.zero_grad()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times), float(loss)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    data = batches(args.steps, args.global_batch, args.seq, rank, world)

    # fsdpc: compile once (not timed), then train.
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    step = compile_step(model, data[0], next_token_loss)
    fsdpc_optimizer = torch.optim.AdamW(step.parameters(), lr=1e-3)

    # FSDP2: each block, then the root, as torchtitan does.
    torch.manual_seed(0)
    reference = GPT(GPTConfig())
    mesh = init_device_mesh("cpu", (world,))
    for module in reference.modules():
        if isinstance(module, Block):
            fully_shard(module, mesh=mesh)
    fully_shard(reference, mesh=mesh)
    fsdp2_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)

    def fsdp2_step(batch):
        loss = next_token_loss(reference, *batch)
        loss.backward()
        return loss.detach()

    results = {"FSDP2 (eager)": [], "fsdpc (compiled)": []}
    losses = {}
    for _ in range(args.repeats):  # alternate, so both see the same machine noise
        before = rss_mib()
        median, losses["FSDP2 (eager)"] = time_steps(fsdp2_step, fsdp2_optimizer, data, args.warmup)
        results["FSDP2 (eager)"].append((median, rss_mib() - before))
        before = rss_mib()
        median, losses["fsdpc (compiled)"] = time_steps(lambda b: step(*b), fsdpc_optimizer, data, args.warmup)
        results["fsdpc (compiled)"].append((median, rss_mib() - before))
    if rank == 0:
        print(f"GPT {sum(p.numel() for p in model.parameters()):,} parameters, {world} ranks (Gloo, CPU), "
              f"global batch {args.global_batch} x {args.seq} tokens, median of {args.repeats} repeats "
              f"of {args.steps - args.warmup} timed steps")
        print(f"{'':18} {'step time (ms)':>15} {'peak RSS growth (MiB)':>22} {'final loss':>11}")
        medians = {}
        for name, runs in results.items():
            medians[name] = statistics.median(t for t, _ in runs)
            growth = max(g for _, g in runs)
            print(f"{name:18} {medians[name] * 1e3:15.2f} {growth:22.1f} {losses[name]:11.4f}")
        print(f"fsdpc / FSDP2 step time: {medians['fsdpc (compiled)'] / medians['FSDP2 (eager)']:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Train the built-in GPT with a compiled, sharded step on CPU ranks.

    torchrun --nproc-per-node 2 examples/train_gpt.py --steps 200

The text (Lincoln's Gettysburg Address, public domain) is read as bytes;
every step each rank takes its share of a global batch of random windows.
Rank 0 prints one line per step: loss, tokens per second over all ranks, and
each rank's resident memory. The compiled step's memory report and a trace
of the last step as it ran on every rank are written to --out.
"""

import argparse
import json
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist

from fsdpc.models.gpt import GPT, GPTConfig
from fsdpc.models.language import next_token_loss
from fsdpc.runtime import compile_step

TEXT = Path(__file__).with_name("data") / "gettysburg.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", default="build/demo")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    data = torch.tensor(list(TEXT.read_bytes()), dtype=torch.long)
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    local = args.global_batch // world
    generator = torch.Generator().manual_seed(1)

    def next_batch():
        starts = torch.randint(0, len(data) - args.seq - 1, (args.global_batch,), generator=generator)
        windows = torch.stack([data[s:s + args.seq + 1] for s in starts.tolist()])
        mine = windows[rank * local:(rank + 1) * local]
        return mine[:, :-1].contiguous(), mine[:, 1:].contiguous()

    step = compile_step(model, next_batch(), next_token_loss, pipeline="strategy=full-shard")
    if rank == 0:
        (out / "memory.json").write_text(json.dumps(step.memory_report, indent=1))
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in step.compile_seconds.items())
        print(f"compiled: {phases}", flush=True)
    optimizer = torch.optim.AdamW(step.parameters(), lr=args.lr)
    tokens = args.global_batch * args.seq
    for i in range(1, args.steps + 1):
        start = time.perf_counter()
        loss = step(*next_batch(), trace=i == args.steps)
        optimizer.step()
        optimizer.zero_grad()
        elapsed = time.perf_counter() - start
        stats = torch.tensor([float(loss), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
        everyone = [torch.zeros(2) for _ in range(world)]
        dist.all_gather(everyone, stats)
        if rank == 0:
            mean_loss = sum(float(s[0]) for s in everyone) / world
            rss = ", ".join(f"{float(s[1]):.0f}" for s in everyone)
            print(f"step {i:4d}/{args.steps}  loss {mean_loss:7.4f}  tokens/s {tokens / elapsed:9.0f}  "
                  f"max RSS per rank (MiB) [{rss}]", flush=True)
    summary = step.write_trace(out / "trace.json")
    if rank == 0:
        predicted = step.memory_report["train_step"]["peak"]["above_step_start"] / 2**20
        print(f"memory report: {out}/memory.json (peak above the step's start: {predicted:.1f} MiB); "
              f"measured trace of the last step: {out}/trace.json "
              f"({summary['exposed_comm_share'] * 100:.0f}% of it waiting on communication)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Train the built-in GPT with fsdpc on CPU ranks, checkpoint, resume.

    torchrun --nproc-per-node 2 examples/train_gpt.py --steps 200 --save-at 100
    torchrun --nproc-per-node 2 examples/train_gpt.py --steps 200 --resume build/demo/checkpoint

The model is built on the meta device and each rank materializes only its
own shards. The text (Lincoln's Gettysburg Address, public domain) is read as
bytes; step i's global batch of random windows depends only on i, so a run
resumed from a checkpoint sees the batches an uninterrupted run would and
prints the same losses. Rank 0 prints one line per step: loss, gradient
norm (clipped to 1), tokens per second over all ranks, and each rank's
resident memory. The compiled step's memory report and a trace of the last
step as it ran on every rank are written to --out; --save-at N saves the
model and optimizer to --out/checkpoint after step N.
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
import fsdpc

TEXT = Path(__file__).with_name("data") / "gettysburg.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", default="build/demo")
    parser.add_argument("--save-at", type=int, default=0, help="save a checkpoint after this step")
    parser.add_argument("--resume", default=None, help="a checkpoint to continue from")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    data = torch.tensor(list(TEXT.read_bytes()), dtype=torch.long)
    local = args.global_batch // world

    def batch_of_step(i: int):
        generator = torch.Generator().manual_seed(1000 + i)
        starts = torch.randint(0, len(data) - args.seq - 1, (args.global_batch,), generator=generator)
        windows = torch.stack([data[s:s + args.seq + 1] for s in starts.tolist()])
        mine = windows[rank * local:(rank + 1) * local]
        return mine[:, :-1].contiguous(), mine[:, 1:].contiguous()

    with torch.device("meta"):
        model = GPT(GPTConfig())
    model = fsdpc.shard(model, batch_of_step(1), next_token_loss)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    torch.manual_seed(0)
    model.init_weights()  # also fills the buffers a checkpoint does not hold (the causal masks)
    first = 1
    if args.resume:
        first = fsdpc.checkpoint.load(args.resume, model, optimizer)["step"] + 1
    if rank == 0:
        (out / "memory.json").write_text(json.dumps(model.memory_report, indent=1))
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in model.compile_seconds.items())
        print(f"compiled: {phases}" + (f"; resumed from {args.resume} at step {first}" if args.resume else ""),
              flush=True)
    tokens = args.global_batch * args.seq
    for i in range(first, args.steps + 1):
        start = time.perf_counter()
        loss = model(*batch_of_step(i), trace=i == args.steps)
        norm = model.clip_grad_norm_(1.0)
        optimizer.step()
        optimizer.zero_grad()
        elapsed = time.perf_counter() - start
        stats = torch.tensor([float(loss), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
        everyone = [torch.zeros(2) for _ in range(world)]
        dist.all_gather(everyone, stats)
        if rank == 0:
            mean_loss = sum(float(s[0]) for s in everyone) / world
            rss = ", ".join(f"{float(s[1]):.0f}" for s in everyone)
            print(f"step {i:4d}/{args.steps}  loss {mean_loss:7.4f}  grad norm {float(norm):6.3f}  "
                  f"tokens/s {tokens / elapsed:9.0f}  max RSS per rank (MiB) [{rss}]", flush=True)
        if i == args.save_at:
            path = fsdpc.checkpoint.save(out / "checkpoint", model, optimizer, extra={"step": i})
            if rank == 0:
                print(f"saved {path} (resume: torchrun --nproc-per-node 2 examples/train_gpt.py "
                      f"--steps {args.steps} --resume {path})", flush=True)
    summary = model.write_trace(out / "trace.json")
    if rank == 0:
        predicted = model.memory_report["train_step"]["peak"]["above_step_start"] / 2**20
        print(f"memory report: {out}/memory.json (peak above the step's start: {predicted:.1f} MiB); "
              f"measured trace of the last step: {out}/trace.json "
              f"({summary['exposed_comm_share'] * 100:.0f}% of it waiting on communication)")
    dist.barrier()  # every rank tears down together: see "Interpreter shutdown" in docs/design.md
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Host time per step where the math is negligible: what bounds a small
model on a GPU (GPT 23M on an H100 runs out of host time, not of GPU time),
measured on CPU. The GPT 23M's graph (6 blocks, the same ops and
parameters per block) at d_model 16, vocab 64 and one 8-token sequence per
rank, so every kernel is a few microseconds and the step time is the host's
work: dispatching ATen calls, packing and unpacking buckets, Python.

    PYTHONPATH=python torchrun --nproc-per-node 2 benchmarks/host_overhead.py

Prints, per rank 0, the median over alternated rounds of: fsdpc's forward +
backward call, the whole training-loop iteration (call, fused AdamW step,
zero_grad), and the same for the unsharded model under eager autograd on one
rank (no communication: a floor that no sharded step reaches), plus the
number of instructions and collectives the runtime executed per call.
"""

import argparse
import copy
import statistics
import time

import torch
import torch.distributed as dist

import fsdpc
from fsdpc.models.gpt import GPT, GPTConfig
from fsdpc.models.language import next_token_loss

TINY_GPT_23M = GPTConfig(vocab_size=64, max_seq=16, d_model=16, n_heads=2, n_layers=6)


def per_call_ms(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    eager = GPT(TINY_GPT_23M)
    tokens = torch.randint(0, TINY_GPT_23M.vocab_size, (1, 9))
    batch = (tokens[:, :-1], tokens[:, 1:])
    sharded = fsdpc.shard(copy.deepcopy(eager), batch, next_token_loss)
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-3, fused=True)
    eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-3, fused=True)

    def fsdpc_call():
        sharded(*batch)

    def fsdpc_iteration():
        sharded(*batch)
        optimizer.step()
        optimizer.zero_grad()

    def eager_call():
        next_token_loss(eager, *batch).backward()

    def eager_iteration():
        next_token_loss(eager, *batch).backward()
        eager_optimizer.step()
        eager_optimizer.zero_grad()

    systems = {"fsdpc call": fsdpc_call, "fsdpc iteration": fsdpc_iteration,
               "eager call (1 rank, unsharded)": eager_call, "eager iteration (1 rank, unsharded)": eager_iteration}
    for fn in systems.values():  # warm-up: caches, allocator, optimizer state
        for _ in range(10):
            fn()
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.rounds):
        for name, fn in systems.items():
            dist.barrier()
            times[name].append(per_call_ms(fn, args.calls))
    sharded(*batch, trace=True)
    instructions = len(sharded.last_trace)
    collectives = len(sharded.last_collectives)
    if dist.get_rank() == 0:
        print(f"tiny GPT 23M graph ({TINY_GPT_23M}), 1 x 8 tokens per rank, {dist.get_world_size()} ranks, "
              f"median of {args.rounds} rounds x {args.calls} calls")
        print(f"runtime per call: {instructions} instructions traced, {collectives} collectives")
        for name, values in times.items():
            print(f"  {name:38s} {statistics.median(values):7.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Host time per step where the math is negligible: what bounds a small
model on a GPU (GPT 23M on an H100 runs out of host time, not of GPU time),
measured on CPU. The GPT 23M's graph (6 blocks, the same ops and
parameters per block) at d_model 16, vocab 64 and one 8-token sequence per
rank, so every kernel is a few microseconds and the step time is the host's
work: dispatching ATen calls, packing and unpacking buckets, Python.

    PYTHONPATH=python torchrun --nproc-per-node 2 benchmarks/host_overhead.py [--also OPTIONS]

Prints, on rank 0, the median over alternated rounds of, for fsdpc, FSDP2
(fully_shard per block and the root, eager, as benchmarks/compare.py builds
it) and the unsharded model under eager autograd (no communication): the
forward + backward call, the whole training-loop iteration (call, fused
AdamW step, zero_grad), and that iteration with the gradients clipped to
norm 1 before the step (fsdpc's clip_grad_norm_, torch's for the others);
and the number of instructions and collectives fsdpc's runtime executed per
call. One rank is the GPU benchmark's shape
(world size 1); more ranks on Gloo add its latency per collective.
"""

import argparse
import copy
import statistics
import time

import torch
import torch.distributed as dist

from fsdpc.models.gpt import GPT, GPTConfig
from fsdpc.models.language import next_token_loss
from train_one import build

TINY_GPT_23M = GPTConfig(vocab_size=64, max_seq=16, d_model=16, n_heads=2, n_layers=6)


def per_call_ms(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def iterations(name: str, forward_backward, optimizer, batch, clip) -> dict:
    def call():
        forward_backward(batch)

    def iteration():
        forward_backward(batch)
        optimizer.step()
        optimizer.zero_grad()

    def clipped_iteration():
        forward_backward(batch)
        clip(1.0)
        optimizer.step()
        optimizer.zero_grad()

    return {f"{name} call": call, f"{name} iteration": iteration, f"{name} iteration, clipped": clipped_iteration}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--also", default=None, metavar="OPTIONS",
                        help="also fsdpc compiled with these fsdp-sharding-pipeline options (fuse-pointwise=false), "
                             "alternated with the others")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    eager = GPT(TINY_GPT_23M)
    tokens = torch.randint(0, TINY_GPT_23M.vocab_size, (1, 9))
    batch = (tokens[:, :-1], tokens[:, 1:])
    built = {name: build(name, copy.deepcopy(eager), batch, dist.get_world_size()) for name in ("fsdpc", "fsdp2")}
    if args.also:
        built[f"fsdpc {args.also}"] = build("fsdpc", copy.deepcopy(eager), batch, dist.get_world_size(), args.also)
    systems = {}
    for name, (forward_backward, params, extras) in built.items():
        clip = extras["step"].clip_grad_norm_ if "step" in extras else (
            lambda limit, params=params: torch.nn.utils.clip_grad_norm_(params, limit))
        systems.update(iterations(name, forward_backward, torch.optim.AdamW(params, lr=1e-3, fused=True), batch,
                                  clip))

    def eager_call(batch):
        next_token_loss(eager, *batch).backward()

    systems.update(iterations("eager, unsharded", eager_call,
                              torch.optim.AdamW(eager.parameters(), lr=1e-3, fused=True), batch,
                              lambda limit: torch.nn.utils.clip_grad_norm_(eager.parameters(), limit)))
    for fn in systems.values():  # warm-up: caches, allocator, optimizer state
        for _ in range(10):
            fn()
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.rounds):
        for name, fn in systems.items():
            dist.barrier()
            times[name].append(per_call_ms(fn, args.calls))
    traced = {}
    for name in built:
        if name.startswith("fsdpc"):
            sharded = built[name][2]["step"]
            sharded(*batch, trace=True)
            traced[name] = (len(sharded.last_trace), len(sharded.last_collectives))
    if dist.get_rank() == 0:
        print(f"tiny GPT 23M graph ({TINY_GPT_23M}), 1 x 8 tokens per rank, {dist.get_world_size()} ranks, "
              f"median of {args.rounds} rounds x {args.calls} calls")
        for name, (instructions, collectives) in traced.items():
            print(f"{name} runtime per call: {instructions} instructions traced, {collectives} collectives")
        for name, values in times.items():
            print(f"  {name:30s} {statistics.median(values):7.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One rank of the communication check (launched by test_comm_report.py):
for each strategy, compiles the MLP step with its communication report,
runs one step, and compares the report's bytes per rank with the bytes of
the collectives the runtime issued (ring algorithms: an all-reduce sends
2(n-1)/n of its buffer, an all-gather or reduce-scatter (n-1)/n)."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import fsdpc
from fsdpc.export import load_factory

SENT_TIMES_N = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1}


def sent_bytes(issued: list[tuple[str, int, int]]) -> int:
    return sum(SENT_TIMES_N[op](ranks) * size // ranks for op, size, ranks in issued)


def main():
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    folder = Path(sys.argv[1])
    strategies = ["full-shard", "full-shard reshard-after-forward=false", "shard-grad-op", "no-shard"]
    if world % 2 == 0 and world > 2:
        strategies.append(f"hybrid-shard replicas={world // 2}")
    for number, strategy in enumerate(strategies):
        report = folder / f"comm-{number}.json"
        torch.manual_seed(0)
        model, _, loss_fn = load_factory("mlp")(batch=1)
        batch = load_factory("mlp")(batch=3)[1]
        sharded = fsdpc.shard(model, batch, loss_fn, pipeline=f"strategy={strategy} comm-report={report}")
        sharded(*batch)
        dist.barrier()  # rank 0 wrote the report before the program reached anyone
        (predicted,) = [entry for entry in json.loads(report.read_text()) if entry["function"] == "train_step"]
        counted = sent_bytes(sharded.last_collectives)
        if counted != predicted["total_bytes"] or not sharded.last_collectives:
            sys.exit(f"rank {dist.get_rank()}, {strategy} on {world} ranks: the report says "
                     f"{predicted['total_bytes']} B per rank, the runtime sent {counted} B "
                     f"({sharded.last_collectives})")
        if dist.get_rank() == 0:
            print(f"{strategy}: {counted} B per rank in {len(sharded.last_collectives)} collectives", flush=True)
    dist.barrier()  # every rank tears down together: see "Interpreter shutdown" in docs/design.md
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

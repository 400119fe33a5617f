"""One rank of an end-to-end run (launched by test_e2e.py):
trains a built-in model with a compiled, sharded step and AdamW, and rank 0
saves the per-step losses and the final full parameters. Several runs can
share one job (their arguments separated by `--and`): a job's start costs
seconds of CI."""

import argparse
import os
import sys

import torch
import torch.distributed as dist

from fsdpc.capture import MixedPrecision
from fsdpc.export import load_factory
from fsdpc.profiling import peak_allocated_above_start
import fsdpc

# Some gradients are zero up to rounding (a key bias cannot change a softmax);
# Adam's normalization would turn that rounding noise into full-size steps,
# so eps is large enough to keep noise from being amplified.
ADAM_EPS = 1e-4


def global_batches(name: str, global_batch: int, steps: int, seed: int):
    torch.manual_seed(seed + 1)
    factory = load_factory(name)
    return [factory(batch=global_batch)[1] for _ in range(steps)]


def micro_rows(rank: int, micro: int, world: int, global_batch: int, accumulate: int) -> slice:
    """Rank `rank`'s rows of microbatch `micro` within a global batch."""
    local = global_batch // world // accumulate
    start = rank * (global_batch // world) + micro * local
    return slice(start, start + local)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--pipeline", default="")
    parser.add_argument("--param-dtype", default="")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--freeze", default="")
    parser.add_argument("--rank1-pipeline", default=None,
                        help="a different pipeline on rank 1 (to test the schedule check)")
    parser.add_argument("--check-reshard-frees", action="store_true",
                        help="fail if a gathered parameter outlives its reshard")
    parser.add_argument("--trace", default=None, help="record the last step as a Chrome trace here")
    parser.add_argument("--measure-memory", action="store_true",
                        help="profile the last step's allocations (peak above its start, every rank)")
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model, _, loss_fn = load_factory(args.model)(batch=1)
    if args.freeze:
        model.get_parameter(args.freeze).requires_grad_(False)
    batches = global_batches(args.model, args.global_batch, args.steps, seed=0)
    local = args.global_batch // world // args.accumulate

    def my_part(batch, micro):
        rows = micro_rows(rank, micro, world, args.global_batch, args.accumulate)
        return tuple(t[rows] for t in batch)

    policy = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if args.param_dtype == "bf16" else None
    pipeline = args.pipeline + (" gradient-accumulation=true" if args.accumulate > 1 else "")
    if rank == 1 and args.rank1_pipeline is not None:
        pipeline = args.rank1_pipeline
    step = fsdpc.shard(model, my_part(batches[0], 0), loss_fn, pipeline=pipeline, mp_policy=policy,
                       check_reshard_frees=args.check_reshard_frees)
    optimizer = torch.optim.AdamW(step.parameters(), lr=1e-2, weight_decay=0.1, eps=ADAM_EPS)
    losses = []
    for i in range(args.steps):
        total = 0.0
        for micro in range(args.accumulate):
            batch = my_part(batches[i], micro)
            last = i == args.steps - 1
            traced = args.trace is not None and last
            if args.measure_memory and last:
                peak, loss = peak_allocated_above_start(lambda: step(*batch, sync=micro == args.accumulate - 1))
                measured_peaks = [None] * world
                dist.all_gather_object(measured_peaks, peak)
            else:
                loss = step(*batch, sync=micro == args.accumulate - 1, trace=traced)
            total += float(loss)
        optimizer.step()
        optimizer.zero_grad()
        reported = torch.tensor([total / args.accumulate])
        dist.all_reduce(reported)
        losses.append(float(reported) / world)
    summary = step.write_trace(args.trace) if args.trace else None
    full = step.full_state_dict()
    params = {name: full[name] for name, _ in step.named_parameters()}
    if rank == 0:
        torch.save({"losses": losses, "params": params, "trace_summary": summary,
                    "compile_phases": step.compile_seconds,
                    "units": sorted({spec.unit for spec in step.layout.values()}),
                    "measured_peaks": measured_peaks if args.measure_memory else None,
                    "predicted_peak": step.memory_report["train_step"]["peak"]["above_step_start"]},
                   args.out)


def main() -> None:
    runs, run = [], []
    for argument in sys.argv[1:] + ["--and"]:
        if argument == "--and":
            runs.append(parse(run))
            run = []
        else:
            run.append(argument)
    dist.init_process_group("gloo")
    for args in runs:
        train(args)
    dist.barrier()  # every rank tears down together: see "Interpreter shutdown" in docs/design.md
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

"""fsdpc against PyTorch FSDP2 (eager and torch.compile) and DDP on the
23M-parameter GPT (vocab 8191, seq 128, d 512, 8 heads, 6 layers; local
batch 4 x 128 tokens), Gloo on CPU, one thread per rank. Each system is a
separate torchrun job (benchmarks/train_one.py) from the same initialization
on the same batches; systems alternate within each repeat so that all see
the same machine drift. Usage (repository root):

    PYTHONPATH=python .venv/bin/python benchmarks/compare.py --ranks 2 4 --repeats 3

Repeat 0 starts with empty compile caches (cold compile: fsdpc's program
cache, torch.compile's inductor cache); later repeats reuse them (warm).
Prints a markdown table per rank count: medians over repeats of the step
time (forward + backward + AdamW), the peak allocated bytes of forward +
backward above the step's start (profiler memory events), resident memory
after warm-up, cold and warm compile (capture to the end of the first
step), the final loss, and for fsdpc its memory report's prediction and the
exposed-communication share of a measured trace. Ratios are against FSDP2
eager. --json writes every run. A system `fsdpc:<options>` is fsdpc with
those fsdp-sharding-pipeline options (`fsdpc:units-per-group=2`).
`--checkpoint-blocks` runs every system with each block under
`checkpoint_wrapper` (the model's own activation checkpointing);
`--checkpoint-blocks=ops` with torchtitan's op-level selective policy.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ["fsdpc", "fsdp2", "fsdp2-compile", "ddp"]


def run(system: str, ranks: int, caches: Path, steps: int, trace: Path | None, checkpoint_blocks: str | None
        ) -> dict:
    name, _, pipeline = system.partition(":")
    out = caches / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', system)}-{ranks}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "OMP_NUM_THREADS": "1",
           "FSDPC_CACHE": str(caches / "fsdpc"), "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor")}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-port", str(29700 + os.getpid() % 200), str(ROOT / "benchmarks" / "train_one.py"),
               "--system", name, "--steps", str(steps), "--out", str(out)]
    if pipeline:
        command += ["--pipeline", pipeline]
    if checkpoint_blocks:
        command.append(f"--checkpoint-blocks={checkpoint_blocks}")
    if trace is not None and system == "fsdpc":
        command += ["--trace", str(trace)]
    for attempt in range(2):
        out.unlink(missing_ok=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        if out.exists():  # rank 0 writes every rank's results before tearing down
            if done.returncode != 0:
                print(f"note: {system} on {ranks} ranks exited with {done.returncode} after reporting "
                      "(in teardown)", file=sys.stderr)
            return json.loads(out.read_text())
        print(f"note: {system} on {ranks} ranks failed (attempt {attempt + 1}):\n{done.stderr[-3000:]}",
              file=sys.stderr)
    raise SystemExit(f"{system} on {ranks} ranks failed twice")


def summarize(runs: dict[str, list[list[dict]]]) -> dict[str, dict]:
    """Per system: medians over repeats of each rank's worst value."""
    table = {}
    for system, repeats in runs.items():
        worst = lambda key, repeat: max(rank[key] for rank in repeat)  # noqa: E731
        row = {
            "step_s": statistics.median(worst("step_s", r) for r in repeats),
            "peak_mib": statistics.median(worst("peak_fwd_bwd_mib", r) for r in repeats),
            "rss_mib": statistics.median(worst("rss_after_warmup_mib", r) for r in repeats),
            "cold_s": worst("compile_s", repeats[0]),
            "warm_s": statistics.median(worst("compile_s", r) for r in repeats[1:]) if len(repeats) > 1 else None,
            "loss": repeats[-1][0]["losses"][-1],
        }
        if system.startswith("fsdpc"):
            row["predicted_mib"] = repeats[-1][0]["predicted_peak_mib"]
            row["exposed_comm"] = statistics.median(
                max(rank["exposed_comm_share"] for rank in r) for r in repeats)
        table[system] = row
    return table


def markdown(ranks: int, table: dict[str, dict]) -> str:
    base = table.get("fsdp2") or next(iter(table.values()))
    lines = [f"**{ranks} ranks**", "",
             "| system | step time | vs FSDP2 | peak allocated, fwd+bwd | vs FSDP2 | resident | "
             "cold compile | warm compile | final loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    for system, row in table.items():
        warm = f"{row['warm_s']:.1f} s" if row["warm_s"] is not None else "–"
        lines.append(
            f"| {system} | {row['step_s'] * 1e3:.0f} ms | {row['step_s'] / base['step_s']:.2f}x | "
            f"{row['peak_mib']:.1f} MiB | {row['peak_mib'] / base['peak_mib']:.2f}x | {row['rss_mib']:.0f} MiB | "
            f"{row['cold_s']:.1f} s | {warm} | {row['loss']:.4f} |")
    for system, fsdpc in table.items():
        if not system.startswith("fsdpc"):
            continue
        lines += ["", f"{system} memory report: {fsdpc['predicted_mib']:.1f} MiB predicted, "
                      f"{fsdpc['peak_mib']:.1f} MiB measured ({fsdpc['peak_mib'] / fsdpc['predicted_mib']:.2f}x); "
                      f"exposed communication {fsdpc['exposed_comm'] * 100:.0f}% of the step (measured trace)"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run")
    parser.add_argument("--systems", nargs="+", default=SYSTEMS)
    parser.add_argument("--json", default=None)
    parser.add_argument("--trace", default=None, help="write fsdpc's measured trace (last run) here")
    parser.add_argument("--checkpoint-blocks", nargs="?", const="full", choices=["full", "ops"],
                        help="every system with each block under checkpoint_wrapper (ops: with torchtitan's "
                             "op-level selective policy)")
    args = parser.parse_args()
    everything = {}
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory() as scratch:
            caches = Path(scratch)
            runs: dict[str, list[list[dict]]] = {system: [] for system in args.systems}
            for repeat in range(args.repeats):
                for system in args.systems:
                    trace = Path(args.trace) if args.trace else None
                    runs[system].append(run(system, ranks, caches, args.steps, trace, args.checkpoint_blocks))
                    print(f"[{ranks} ranks, repeat {repeat}] {system}: "
                          f"{runs[system][-1][0]['step_s'] * 1e3:.0f} ms/step", file=sys.stderr, flush=True)
        table = summarize(runs)
        everything[ranks] = {"summary": table, "runs": runs}
        print(markdown(ranks, table) + "\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()

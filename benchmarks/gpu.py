"""fsdpc against FSDP2 eager, FSDP2 with per-block torch.compile and the
unsharded model under torch.compile, on one GPU (world size 1 on NCCL),
bf16 compute with fp32 master weights. Each system is a separate process
(benchmarks/gpu_one.py); systems alternate within each repeat. Usage on the
GPU host (repository root, after `make runtime`):

    PYTHONPATH=python python3 benchmarks/gpu.py --models gpt-23m llama-0.9b --repeats 2 --json $OUT/gpu.json
    PYTHONPATH=python python3 benchmarks/gpu.py --models llama-2.6b --systems fsdpc-offload \
        fsdpc-offload-overlap fsdpc-fit-overlap fsdpc-fit-inbackward fsdp2-offload --repeats 1 --json $OUT/offload.json

Models (issue 16's sizes): llama-0.9b (dim 2048, 16 layers, 16/8 heads, ffn
5632, vocab 32000; 4 x 2048 tokens), gpt-23m (32 x 128 tokens), llama-2.6b
(dim 3072, 24 layers, 24/8 heads, ffn 8192; 2 x 2048 tokens). Repeat 0
starts with empty compile caches (cold compile: fsdpc's program cache,
Inductor's and Triton's, and the generated kernels' NVRTC cache), later
repeats reuse them
(warm). Prints a markdown table per model: medians over repeats of the step
time, tokens/s, MFU, peak allocated, and fsdpc's memory report against the
measured peak, fsdpc's predicted step (fsdp-step-time, and calibrated from
the run's own profile), the exposed-communication share of a profiled step,
cold and warm compile.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ["fsdpc", "fsdp2", "fsdp2-compile", "compile"]  # and the offload systems of gpu_one.py


def run(model: str, system: str, caches: Path, out: Path, steps: int, warmup: int, timeout: float) -> dict | None:
    """One system's run in its own process group; a run that fails or
    outlives `timeout` is reported, its processes are killed, and the
    benchmark goes on with the next (a GPU session is too short to lose).
    The one rank is started directly with the rendezvous environment:
    torchrun would start it in a session of its own, out of reach of the kill."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1",
           "FSDPC_CACHE": str(caches / "fsdpc"), "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
           "TRITON_CACHE_DIR": str(caches / "triton"), "PYTORCH_KERNEL_CACHE_PATH": str(caches / "kernels"),
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29800 + os.getpid() % 150)}
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_one.py"), "--model", model, "--system", system,
               "--steps", str(steps), "--warmup", str(warmup), "--out", str(out)]
    (caches / "kernels").mkdir(exist_ok=True)  # generated kernels' cache: torch disables one it cannot find
    out.unlink(missing_ok=True)
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        why = f"exit {process.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        why = f"still running after {timeout:.0f} s, killed"
    if not out.exists():
        print(f"{model} {system} failed ({why}):\n{stdout[-2000:]}\n{stderr[-4000:]}", file=sys.stderr, flush=True)
        return None
    return json.loads(out.read_text())


def markdown(model: str, runs: dict[str, list[dict]]) -> str:
    lines = [f"### {model}", "",
             "| system | step ms | tokens/s | MFU | peak allocated GiB | vs FSDP2 (step, peak) | "
             "report / measured fwd+bwd peak | predicted step ms (calibrated) | exposed comm | "
             "compile cold / warm s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    median = lambda system, key: statistics.median(r[key] for r in runs[system])  # noqa: E731
    baseline = "fsdp2" if runs.get("fsdp2") else "fsdp2-offload"
    base = runs.get(baseline)
    for system, results in runs.items():
        if not results:
            lines.append(f"| {system} | failed | | | | | | | | |")
            continue
        step, peak = median(system, "step_s"), median(system, "peak_allocated_gib")
        ratio = (f"{step / median(baseline, 'step_s'):.2f}x, {peak / median(baseline, 'peak_allocated_gib'):.2f}x"
                 if base else "")
        report = ""
        if "report_peak_above_start_gib" in results[0]:
            report = (f"{results[0]['report_peak_above_start_gib']:.2f} / "
                      f"{median(system, 'fwd_bwd_peak_above_start_gib'):.2f} GiB")
        exposed = f"{median(system, 'exposed_comm_share'):.1%}" if "exposed_comm_share" in results[0] else ""
        predicted = (f"{median(system, 'predicted_step_s') * 1e3:.1f} ({median(system, 'calibrated_step_s') * 1e3:.1f})"
                     if "predicted_step_s" in results[0] else "")
        compile_times = " / ".join(f"{r['compile_s']:.1f}" for r in results[:2])
        lines.append(f"| {system} | {step * 1e3:.1f} | {median(system, 'tokens_per_s'):,.0f} | "
                     f"{median(system, 'mfu'):.1%} | {peak:.2f} | {ratio} | {report} | {predicted} | {exposed} | "
                     f"{compile_times} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["gpt-23m", "llama-0.9b"])
    parser.add_argument("--systems", nargs="+", default=SYSTEMS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps first (the first one compiles)")
    parser.add_argument("--json", default=None, help="results so far, rewritten after every run")
    parser.add_argument("--run-timeout", type=float, default=240, help="seconds one system's run may take")
    args = parser.parse_args()
    everything = {}
    with tempfile.TemporaryDirectory() as scratch:
        caches = Path(scratch)
        for model in args.models:
            runs: dict[str, list[dict]] = {system: [] for system in args.systems}
            everything[model] = runs
            for repeat in range(args.repeats):
                order = args.systems[repeat % len(args.systems):] + args.systems[:repeat % len(args.systems)]
                for system in order:
                    result = run(model, system, caches, caches / f"{model}-{system}-{repeat}.json", args.steps,
                                 args.warmup, args.run_timeout)
                    if result is not None:
                        runs[system].append(result)
                        print(f"{model} {system} repeat {repeat}: {result['step_s'] * 1e3:.1f} ms, "
                              f"{result['peak_allocated_gib']:.2f} GiB, compile {result['compile_s']:.1f} s",
                              flush=True)
                    if args.json:
                        Path(args.json).write_text(json.dumps(everything, indent=1))
            print(markdown(model, runs), flush=True)


if __name__ == "__main__":
    main()

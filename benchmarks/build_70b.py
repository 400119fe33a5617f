"""From a captured Llama-3-70B-shaped step to what the runtime runs, at 64
ranks: the sharding pipeline (with lifetimes planned), the lowering to a
program, and the runtime loading it (every operator resolved, every literal
converted). Nothing is compiled by a C++ compiler. Usage (repository root):

    PYTHONPATH=python .venv/bin/python benchmarks/build_70b.py

Captures `llama3-70b` on the meta device first if build/bench/ has no copy
(about a minute; reported separately). Prints each stage's wall time and
peak resident memory (each stage in its own process, ru_maxrss).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

from fsdpc import find_fsdp_opt

ROOT = Path(__file__).resolve().parents[1]
LOAD = """
import sys, time, torch
from fsdpc.program import Program
text = open(sys.argv[1]).read()
start = time.perf_counter()
program = Program.parse(text)
print(time.perf_counter() - start, sum(f.instructions for f in program.functions.values()))
"""


# Runs a command in a fresh parent, so that ru_maxrss is that command's alone.
MEASURE = """
import resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stdout.write(done.stdout)
sys.stderr.write(done.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(done.returncode)
"""


def stage(name: str, command: list[str]) -> tuple[float, float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    peak_mib = int(done.stderr.strip().splitlines()[-1]) / 1024
    print(f"{name:38} {seconds:7.1f} s   {peak_mib:7.0f} MiB peak RSS", flush=True)
    return seconds, peak_mib, done.stdout


def main() -> int:
    bench = ROOT / "build" / "bench"
    bench.mkdir(parents=True, exist_ok=True)
    graph, sharded, program = bench / "llama3-70b.mlir", bench / "llama3-70b-64.mlir", bench / "llama3-70b-64.json"
    if not graph.exists():
        stage("capture (python -m fsdpc export)",
              [sys.executable, "-m", "fsdpc", "export", "--model", "llama3-70b", "--out", str(graph)])
    fsdp_opt = find_fsdp_opt()
    total = 0.0
    seconds, _, _ = stage("fsdp-opt: sharding pipeline, 64 ranks",
                          [str(fsdp_opt), str(graph), "--fsdp-sharding-pipeline=ranks=64",
                           "--mlir-print-debuginfo", "-o", str(sharded)])
    total += seconds
    seconds, _, _ = stage("fsdp-translate: program",
                          [str(fsdp_opt.with_name("fsdp-translate")), "--fsdp-to-program", str(sharded),
                           "-o", str(program)])
    total += seconds
    seconds, peak, out = stage("runtime: load the program", [sys.executable, "-c", LOAD, str(program)])
    load_s, instructions = out.split()
    total += seconds
    functions = json.loads(program.read_text())["functions"]
    print(f"{'total (pipeline + lowering + load)':38} {total:7.1f} s   "
          f"({int(instructions):,} instructions, {program.stat().st_size / 2**20:.1f} MiB program, "
          f"{len(functions)} function(s); load itself {float(load_s):.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

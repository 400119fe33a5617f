"""Meta-device init on the Llama-3-70B shape at 64 ranks: how much memory one
rank's shards take when it creates and initializes only its own (allocator
bytes, from the profiler's memory events), next to the whole model's size.
Usage (repository root):

    PYTHONPATH=python .venv/bin/python benchmarks/meta_init_70b.py [--rank 0]

Uses build/bench/llama3-70b-64.json, the program benchmarks/build_70b.py
makes (it runs that first if the file is missing: about 2 minutes).
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from fsdpc.emit import torch_dtype
from fsdpc.profiling import peak_allocated_above_start
from fsdpc.program import Program
from fsdpc.sharded import new_shard, shard_extent

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=0)
    args = parser.parse_args()
    path = ROOT / "build" / "bench" / "llama3-70b-64.json"
    if not path.exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "build_70b.py")], check=True)
    program = Program.parse(path.read_text())
    dtype_of = {spec.name: torch_dtype(spec.dtype) for spec in program.params}
    whole = sum(torch.Size(spec.shape).numel() * dtype_of[spec.name].itemsize for spec in program.params)

    def create():
        shards = {}
        for spec in program.params:
            shard = new_shard(spec, dtype_of[spec.name])
            _, real = shard_extent(program, spec, args.rank)
            torch.nn.init.normal_(shard[:real], std=0.02)
            shards[spec.name] = shard
        return shards

    start = time.perf_counter()
    peak, shards = peak_allocated_above_start(create)
    seconds = time.perf_counter() - start
    held = sum(s.numel() * s.element_size() for s in shards.values())
    print(f"model: {len(program.params)} parameters, {whole / 2**30:.1f} GiB; rank {args.rank} of 64 creates "
          f"and initializes its shards in {seconds:.1f} s: {held / 2**30:.3f} GiB held, "
          f"{peak / 2**30:.3f} GiB allocator peak = {peak * 64 / whole:.3f} x (model / 64)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

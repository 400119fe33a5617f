"""How long the sharding pipeline takes on a Llama-3-70B-shaped step.

Captures `llama3-70b` on the meta device once (cached under build/bench/),
then times `fsdp-opt --fsdp-sharding-pipeline` on it at 64 ranks, the median
of several runs, for a few configurations. Usage, from the repository root:

    PYTHONPATH=python .venv/bin/python benchmarks/pipeline_70b.py [--runs 5]
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fsdpc import find_fsdp_opt

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "full-shard": "ranks=64",
    "full-shard + reports": "ranks=64 memory-report=/dev/null comm-report=/dev/null",
    "hybrid-shard 8x8": "ranks=8 replicas=8 strategy=hybrid-shard",
    "full-shard + checkpoint=*": "ranks=64 checkpoint=*",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    graph = ROOT / "build" / "bench" / "llama3-70b.mlir"
    if not graph.exists():
        graph.parent.mkdir(parents=True, exist_ok=True)
        print(f"capturing llama3-70b into {graph} ...", flush=True)
        subprocess.run([sys.executable, "-m", "fsdpc", "export", "--model", "llama3-70b", "--out", str(graph)],
                       check=True)
    fsdp_opt = str(find_fsdp_opt())
    print(f"{'configuration':28} {'median':>8} {'min':>8} {'max':>8}   ({args.runs} runs, seconds)")
    for name, options in CONFIGS.items():
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([fsdp_opt, str(graph), f"--fsdp-sharding-pipeline={options}", "-o", "/dev/null"],
                           check=True)
            times.append(time.perf_counter() - start)
        print(f"{name:28} {statistics.median(times):8.2f} {min(times):8.2f} {max(times):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

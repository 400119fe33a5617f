"""How fast an optimizer steps offloaded state on the host: the number the
time model calls `host-optimizer-gbps` (fsdp-step-time; `fsdpc plan
--host-optimizer-gbps`). AdamW over fp32 parameters in host memory, as
fsdpc's and FSDP2's CPU offload step it, counted as the model counts it:
28 bytes per element (shard and both moments read and written, the gradient
read). Median of 5 steps after one that creates the state.

    PYTHONPATH=python .venv/bin/python benchmarks/host_optimizer.py --threads 1 2 --millions 50
"""

import argparse
import statistics
import time

import torch

BYTES_PER_ELEMENT = 28  # AdamW: 2 x 4 (shard) + 4 (gradient) + 2 x 2 x 4 (moments)


def rate(elements: int, *, fused: bool) -> float:
    """Bytes per second, as the time model counts them."""
    param = torch.nn.Parameter(torch.randn(elements))
    param.grad = torch.randn(elements)
    optimizer = torch.optim.AdamW([param], lr=1e-3, fused=fused, foreach=None if fused else True)
    optimizer.step()
    times = []
    for _ in range(5):
        begin = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - begin)
    return BYTES_PER_ELEMENT * elements / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, nargs="+", default=[1, torch.get_num_threads()])
    parser.add_argument("--millions", type=int, default=50, help="parameters stepped, in millions")
    args = parser.parse_args()
    print("| threads | AdamW | GB/s (28 B per element) |\n|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for fused in (True, False):
            print(f"| {threads} | {'fused' if fused else 'foreach'} | "
                  f"{rate(args.millions * 10**6, fused=fused) / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()

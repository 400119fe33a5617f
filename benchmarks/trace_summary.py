"""Where a profiled step's GPU time goes, from its Chrome trace (as
`gpu_one.py --trace` writes it): the step's span, each stream's busy time,
the compute stream's idle gaps, kernel time by kind and the longest kernels.

    python3 benchmarks/trace_summary.py fsdpc.trace.json fsdp2-compile.trace.json
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

KINDS = [  # the first match names a kernel's kind
    ("communication", ("nccl",)),
    ("attention", ("flash", "fmha", "attention", "cudnn")),
    ("matrix product", ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "cublas")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("triton / fused", ("triton",)),
    ("fsdpc generated", ("fsdp_pointwise",)),
    ("reduction", ("reduce",)),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "copy")),
]


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, keys in KINDS if any(key in lowered for key in keys)), "other")


def union_length(intervals):
    total, end = 0.0, float("-inf")
    for begin, finish in sorted(intervals):
        if finish > end:
            total += finish - max(begin, end)
            end = finish
    return total


def summarize(path: Path, top: int) -> str:
    events = json.loads(path.read_text())["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return f"{path.name}: no GPU events"
    begin = min(e["ts"] for e in gpu)
    span = max(e["ts"] + e["dur"] for e in gpu) - begin
    by_stream = defaultdict(list)
    for e in gpu:
        by_stream[e["args"].get("stream")].append((e["ts"], e["ts"] + e["dur"]))
    kernel_time = defaultdict(float)
    counts = defaultdict(int)
    by_kind = defaultdict(float)
    for e in gpu:
        name = e["name"] if e["cat"] == "kernel" else e["cat"]
        kernel_time[name] += e["dur"]
        counts[name] += 1
        by_kind[kind_of(name) if e["cat"] == "kernel" else e["cat"]] += e["dur"]
    compute = max(by_stream, key=lambda s: sum(b - a for a, b in by_stream[s]))
    lines = [f"== {path.name}: GPU span {span / 1e3:.1f} ms, {len(gpu)} GPU events"]
    for stream, intervals in sorted(by_stream.items(), key=lambda item: -union_length(item[1])):
        lines.append(f"  stream {stream}: busy {union_length(intervals) / 1e3:.1f} ms in {len(intervals)} events")
    busy_any = union_length([i for intervals in by_stream.values() for i in intervals])
    lines.append(f"  no GPU work at all for {(span - busy_any) / 1e3:.1f} ms; compute stream {compute} idle "
                 f"{(span - union_length(by_stream[compute])) / 1e3:.1f} ms")
    gaps = sorted(by_stream[compute])
    gap_sizes = [b[0] - a[1] for a, b in zip(gaps, gaps[1:]) if b[0] > a[1]]
    if gap_sizes:
        lines.append(f"  compute-stream gaps: {len(gap_sizes)}, over 50 us: {sum(g > 50 for g in gap_sizes)} "
                     f"({sum(g for g in gap_sizes if g > 50) / 1e3:.1f} ms), under 50 us total "
                     f"{sum(g for g in gap_sizes if g <= 50) / 1e3:.1f} ms")
    lines.append("  by kind (ms): " + ", ".join(f"{k} {t / 1e3:.1f}" for k, t in
                                                 sorted(by_kind.items(), key=lambda item: -item[1])))
    lines.append(f"  longest {top} kernels by total time:")
    for name, total in sorted(kernel_time.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"    {total / 1e3:8.2f} ms {counts[name]:5d}x  {name[:150]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    for trace in args.traces:
        print(summarize(trace, args.top))


if __name__ == "__main__":
    main()

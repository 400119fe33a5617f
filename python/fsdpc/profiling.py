"""Allocator and trace measurements shared by the tests and the benchmarks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, TypeVar

from torch.profiler import ProfilerActivity, profile

T = TypeVar("T")


def peak_allocated_above_start(fn: Callable[[], T]) -> tuple[int, T]:
    """(peak bytes allocated above the start of fn, fn's result): the
    running sum, in time order, of the profiler's memory events, which see
    every allocation through c10's allocator (also from C++ extensions and
    other threads)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                            if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    return peak, result


def device_stream_intervals(chrome_trace: Path) -> dict[int, list[tuple[float, float, str]]]:
    """From a profiler's Chrome trace: per CUDA stream, the (start us, end
    us, name) of every kernel, copy and memset that ran on it."""
    streams: dict[int, list[tuple[float, float, str]]] = {}
    for event in json.loads(Path(chrome_trace).read_text())["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in event:
            streams.setdefault(event["args"]["stream"], []).append(
                (event["ts"], event["ts"] + event["dur"], event["name"]))
    return streams

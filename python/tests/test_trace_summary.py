"""benchmarks/trace_summary.py, the reader that found where a profiled GPU
step's time went, on a trace whose answer is known: two streams, kernels of
each kind, gaps on the compute stream (a GPU trace's layout, as
torch.profiler writes it)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from trace_summary import kind_of, summarize, union_length  # noqa: E402


def kernel(name, ts, dur, stream=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream, "device": 0}}


def test_a_trace_is_read_as_its_streams_gaps_and_kinds(tmp_path):
    events = [
        kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", 0, 100),
        kernel("fsdp_pointwise_0_kernel", 150, 600),                     # a 50 us gap before it
        kernel("fsdp_pointwise_1_vectorized8_kernel", 760, 40),          # 10 us gap
        kernel("ncclDevKernel_AllGather_RING_LL", 100, 300, stream=20),  # overlaps the compute stream's gap
        kernel("Memcpy DtoD", 900, 100, stream=20, cat="gpu_memcpy"),    # alone: no GPU work on stream 7
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # host events are not read
    ]
    trace = tmp_path / "step.trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    lines = summarize(trace, top=3).splitlines()
    assert lines[0] == "== step.trace.json: GPU span 1.0 ms, 5 GPU events"
    assert lines[1] == "  stream 7: busy 0.7 ms in 3 events"       # 100 + 600 + 40 us
    assert lines[2] == "  stream 20: busy 0.4 ms in 2 events"
    # No stream busy 750-760 and 800-900 us; the compute stream idle 1000 - 740 us.
    assert lines[3] == "  no GPU work at all for 0.1 ms; compute stream 7 idle 0.3 ms"
    assert lines[4] == "  compute-stream gaps: 2, over 50 us: 0 (0.0 ms), under 50 us total 0.1 ms"
    assert lines[5].startswith("  by kind (ms): fsdpc generated 0.6, communication 0.3, matrix product 0.1, gpu_memcpy 0.1")
    assert [line.split()[-1] for line in lines[7:10]] == ["fsdp_pointwise_0_kernel", "ncclDevKernel_AllGather_RING_LL",
                                                         "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT"]


def test_overlapping_intervals_are_counted_once():
    assert union_length([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_length([]) == 0


@pytest.mark.parametrize("name, kind", [
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "communication"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matrix product"),
    ("void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>, FusedAdamMath>", "optimizer"),
    ("triton_poi_fused_mul_silu_0", "triton / fused"),
    ("void at::native::vectorized_elementwise_kernel<8, CUDAFunctor_add<c10::BFloat16>>", "elementwise"),
    ("fsdp_pointwise_4_kernel", "fsdpc generated"),
])
def test_kernels_are_classed_by_name(name, kind):
    assert kind_of(name) == kind


def test_a_trace_without_gpu_work_says_so(tmp_path):
    trace = tmp_path / "cpu.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}]}))
    assert summarize(trace, top=3) == "cpu.json: no GPU events"

"""One system on one GPU, one process (world size 1 on NCCL): trains a model
for a few steps and writes JSON with what `benchmarks/gpu.py` tabulates.
gpu.py launches it; by hand (repository root, on the GPU host):

    PYTHONPATH=python torchrun --nproc-per-node 1 benchmarks/gpu_one.py \\
        --model llama-0.9b --system fsdpc --out result.json

Systems, all bf16 compute with fp32 master weights and fused AdamW:
fsdpc (compiled step, MixedPrecision(bf16, fp32)); fsdp2 (fully_shard per
block and the root, MixedPrecisionPolicy(bf16, fp32), eager); fsdp2-compile
(the same with each block under torch.compile); compile (the unsharded
model under torch.compile and bf16 autocast); fsdpc-offload and
fsdp2-offload (fsdpc and fsdp2 with CPUOffloadPolicy(): shards, gradients
and AdamW state in pinned host memory, the optimizer on the host);
fsdpc-offload-overlap (the same, the host optimizer beside the next
forward: overlap_host_optimizer); fsdpc-fit-inbackward (the same fit, each
offloaded unit stepped on the host as soon as its gradients land, during
the backward: overlap_host_optimizer(in_backward=True)); fsdpc-fit-overlap (what `fsdpc plan
--search --budget-gib 12.9 --overlap-host-optimizer` picks for the 2.6B
Llama: every unit checkpointed and only what does not fit FSDP2 offload's
12.9 GiB peak offloaded, `checkpoint=* offload-to-fit=13209`, overlapped);
fsdpc-unfused (fsdpc without generated kernels, `fuse-pointwise=false`:
every elementwise call an ATen kernel, as before 2026-11-24);
fsdpc-staged (fsdpc with `gather-into-results=false`: NCCL gathers into a
receive buffer and copies out, as before gathering each parameter straight
into its tensor became NCCL's default on 2026-11-25); fsdpc-graph (fsdpc
with `cuda-graph=true`: the step captured on its second call and replayed
as one CUDA graph launch after); fsdpc-tuned (fsdpc with the settings
`fsdpc plan --search --budget-gib 20.1` ranks first for the 0.9B Llama on
one H100, within issue 16's peak: `forward-prefetch=2
selective-recompute=false units-per-group=2`, 95.5 ms and 19.20 GiB
predicted on 2026-11-25).

Measured: compile (model built to the end of the first step), median step
time over the timed steps (forward, backward and optimizer, synchronized),
tokens/s, MFU (6 x parameters + 12 x layers x dim x seq FLOPs per token
against 989 TFLOP/s dense bf16), peak allocated (torch.cuda.max_memory_allocated
over the timed steps), for fsdpc its memory report's step peak against the
measured peak of one forward + backward above its start, and its time
model's prediction of the measured program (fsdp-step-time), as it stands
and calibrated from the profiled step; from a profiled step the share of the
step during which collective-stream work ran while no compute kernel did
(exposed communication).
"""

import argparse
import dataclasses
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from fsdpc.models.gpt import GPT, GPT_23M, Block
from fsdpc.models.language import next_token_loss
from fsdpc.models.llama import LLAMA_0_9B, LLAMA_2_6B, Llama, TransformerBlock
from fsdpc.profiling import device_stream_intervals

H100_BF16_DENSE = 989e12
MODELS = {
    # name: (factory, config, local batch, seq, block class)
    "llama-0.9b": (Llama, LLAMA_0_9B, 4, 2048, TransformerBlock),
    # The same with nn.RMSNorm (torchtitan's norm): fused kernels in eager and in fsdpc alike.
    "llama-0.9b-torch-norm": (Llama, dataclasses.replace(LLAMA_0_9B, torch_norm=True), 4, 2048, TransformerBlock),
    "llama-2.6b": (Llama, LLAMA_2_6B, 2, 2048, TransformerBlock),
    "gpt-23m": (GPT, GPT_23M, 32, 128, Block),
}


def flops_per_token(model: torch.nn.Module, config, seq: int) -> float:
    params = sum(p.numel() for p in model.parameters())
    layers = getattr(config, "n_layers")
    dim = getattr(config, "dim", None) or getattr(config, "d_model")
    return 6 * params + 12 * layers * dim * seq


def exposed_communication(trace_path: Path) -> dict:
    """From a Chrome trace of one step: the compute stream is the one with
    the most kernels; every other stream's busy time not covered by a
    compute kernel is exposed communication."""
    streams = device_stream_intervals(trace_path)
    if not streams:
        return {}
    compute = max(streams, key=lambda stream: len(streams[stream]))

    def merged(intervals):
        out = []
        for begin, end, *_ in sorted(intervals):
            if out and begin <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([begin, end])
        return out

    busy = merged(streams[compute])
    other = merged([i for stream, intervals in streams.items() if stream != compute for i in intervals])
    uncovered = 0.0
    for begin, end in other:
        covered = sum(max(0.0, min(end, b) - max(begin, a)) for a, b in busy)
        uncovered += (end - begin) - covered
    everything = merged([i for intervals in streams.values() for i in intervals])
    span = everything[-1][1] - everything[0][0]
    return {"exposed_comm_share": uncovered / span if span else 0.0,
            "collective_busy_us": sum(e - b for b, e in other), "step_span_us": span}


def predicted_times(sharded_ir: str, device_name: str, trace: Path, host_optimizer: str) -> dict:
    """fsdpc's time model on the program this run measured: as it stands,
    and calibrated from this run's own profiled step (what is left between
    that and the measured step is what the model's structure misses:
    overlap, host, ordering). A program that offloads is predicted with the
    host optimizer's timing the run used and this host's measured rate."""
    from fsdpc.plan import Profile, calibrate, gpu_kind_of, machine, predict_program

    kind = gpu_kind_of(device_name)
    if kind is None:
        return {}
    host = {}
    if re.search(r"fsdp\.unit @\S+ .*\boffloaded\b", sharded_ir):
        from host_optimizer import rate  # benchmarks/host_optimizer.py: the number the model calls host-optimizer-gbps

        host = {"host_optimizer_gbps": rate(50 * 10**6, fused=True) / 1e9}
    before = predict_program(sharded_ir, machine(kind, host_optimizer=host_optimizer, **host))
    numbers = calibrate(Profile.read(trace, before["kernel_classes"]), before["ideal_s"])
    after = predict_program(sharded_ir, machine(kind, host_optimizer=host_optimizer, **host, **numbers))
    return {"predicted_step_s": before["step_s"], "calibrated_step_s": after["step_s"], "calibration": numbers,
            **host,
            "predicted_split_s": {key: before[key] for key in ("compute_s", "exposed_communication_s",
                                                                "host_bound_s", "transfer_s", "optimizer_s")}}


def build(system: str, model: torch.nn.Module, example, block_class):
    """(forward_backward(batch) -> loss, parameters, extras)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    overlap = system.endswith("-overlap")
    in_backward = system.endswith("-inbackward")
    unfused = system.endswith("-unfused")
    staged = system.endswith("-staged")
    graphed = system.endswith("-graph")
    tuned = system.endswith("-tuned")
    system = system.removesuffix("-overlap").removesuffix("-inbackward").removesuffix("-unfused") \
        .removesuffix("-staged").removesuffix("-graph").removesuffix("-tuned")
    fit = system.endswith("-fit")  # issue 16's budget: FSDP2 offload's 12.9 GiB peak
    offload = CPUOffloadPolicy() if system.endswith("-offload") else None  # pinned host memory
    system = system.removesuffix("-offload").removesuffix("-fit")
    extras = {}
    if system == "fsdpc":
        import fsdpc

        sharded = fsdpc.shard(model, example, next_token_loss, mp_policy=policy, offload_policy=offload,
                              pipeline="checkpoint=* offload-to-fit=13209" if fit
                              else "fuse-pointwise=false" if unfused
                              else "gather-into-results=false" if staged
                              else "cuda-graph=true" if graphed
                              else "forward-prefetch=2 selective-recompute=false units-per-group=2" if tuned
                              else "")
        if overlap or in_backward:
            extras["overlap"] = lambda optimizer: sharded.overlap_host_optimizer(optimizer, in_backward=in_backward)
        extras["host_optimizer"] = "in-backward" if in_backward else "next-forward" if overlap else "after-step"
        extras["compile_phases_s"] = sharded.compile_seconds
        extras["report_peak_above_start_gib"] = sharded.memory_report["train_step"]["peak"]["above_step_start"] / 2**30
        extras["sharded_ir"] = sharded.sharded_ir
        return (lambda batch: sharded(*batch)), list(sharded.parameters()), extras
    if system in ("fsdp2", "fsdp2-compile"):
        from torch.distributed.fsdp import OffloadPolicy, fully_shard

        if offload is None:  # offloaded, FSDP2 keeps the model's shards in host memory
            model.cuda()
        options = dict(mp_policy=policy, offload_policy=offload or OffloadPolicy())
        for module in model.modules():
            if isinstance(module, block_class):
                if system == "fsdp2-compile":
                    module.compile()
                fully_shard(module, **options)
        fully_shard(model, **options)
        run = model
    elif system == "compile":
        model.cuda()
        compiled = torch.compile(model)

        def run(*args):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return compiled(*args)
    else:
        raise SystemExit(f"unknown system '{system}'")

    def forward_backward(batch):
        loss = next_token_loss(run, *batch)
        loss.backward()
        return loss.detach()

    return forward_backward, list(model.parameters()), extras


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--system", required=True)
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--trace", default=None, help="write the profiled step's Chrome trace here")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    factory, config, local_batch, seq, block_class = MODELS[args.model]
    generator = torch.Generator().manual_seed(1)
    data = [tuple(torch.randint(0, config.vocab_size, (local_batch, seq), generator=generator).to(device)
                  for _ in range(2)) for _ in range(args.warmup + args.steps + 2)]

    torch.manual_seed(0)
    model = factory(config)  # on CPU, the same initialization for every system
    flops = flops_per_token(model, config, seq)
    start = time.perf_counter()
    forward_backward, params, extras = build(args.system, model, data[0], block_class)
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)
    if "overlap" in extras:
        extras.pop("overlap")(optimizer)

    def train_step(batch):
        loss = forward_backward(batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    losses = [float(train_step(data[0]))]
    compile_s = time.perf_counter() - start
    for batch in data[1:args.warmup]:
        losses.append(float(train_step(batch)))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for batch in data[args.warmup:args.warmup + args.steps]:
        begin = time.perf_counter()
        loss = train_step(batch)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
        losses.append(float(loss))
    peak = torch.cuda.max_memory_allocated()
    # One forward + backward: its peak above the allocated bytes at its start.
    torch.cuda.synchronize()
    at_start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = forward_backward(data[-2])
    torch.cuda.synchronize()
    fwd_bwd_peak_above_start = torch.cuda.max_memory_allocated() - at_start
    optimizer.step()  # the call's step (a host optimizer in backward has begun it)
    optimizer.zero_grad(set_to_none=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as profiled:
        train_step(data[-1])
        torch.cuda.synchronize()
    trace = Path(args.trace or f"{args.out}.trace.json")
    profiled.export_chrome_trace(str(trace))
    step = statistics.median(times)
    tokens = local_batch * seq
    sharded_ir = extras.pop("sharded_ir", None)
    host_optimizer = extras.pop("host_optimizer", "after-step")
    result = {"model": args.model, "system": args.system, "device": torch.cuda.get_device_name(device),
              "torch": torch.__version__, "compile_s": compile_s, "step_s": step, "step_times_s": times,
              "tokens_per_s": tokens / step, "mfu": flops * tokens / step / H100_BF16_DENSE,
              "peak_allocated_gib": peak / 2**30, "fwd_bwd_peak_above_start_gib": fwd_bwd_peak_above_start / 2**30,
              "losses": losses, **extras}
    # What is derived from the run must not lose the run: a failure here is recorded beside the measurements.
    analyses = [lambda: exposed_communication(trace)]
    if sharded_ir is not None:
        analyses.append(lambda: predicted_times(sharded_ir, torch.cuda.get_device_name(device), trace,
                                                host_optimizer))
    for analysis in analyses:
        try:
            result.update(analysis())
        except Exception as error:  # noqa: BLE001 (reported in the results)
            result.setdefault("analysis_errors", []).append(f"{type(error).__name__}: {str(error)[:500]}")
    Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

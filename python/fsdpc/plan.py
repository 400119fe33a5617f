"""Will it fit? `python -m fsdpc plan` answers from the compiled step before
any GPU is rented: the step is captured on the meta device for a CUDA target,
sharded by `fsdp-opt` for N GPUs, and the memory report of that schedule (the
model that equals the allocator's peak where fsdpc runs) is held against the
GPU's memory.

    python -m fsdpc plan --model llama3-70b --gpus 8 --gpu h100-sxm --batch 1 --seq 4096
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fsdpc.capture import MixedPrecision
from fsdpc.compiler import FsdpOptError, run_fsdp_opt
from fsdpc.export import build, export_training_step, load_factory

GIB = 2**30


@dataclass(frozen=True)
class GpuKind:
    """A GPU as the planner sees it. `memory` is the device's total as the
    driver reports it (nvidia-smi's MiB), before the CUDA context."""

    name: str
    memory: int  # bytes


# Totals as nvidia-smi reports them (H100 SXM 80GB: 81,559 MiB; A100 80GB:
# 81,920 MiB; seen in modal-labs/modal-client#2797 and NVIDIA/nccl#1264).
# Kinds whose total was not read from a device take `custom`.
GPU_KINDS = {
    "h100-sxm": GpuKind("H100 SXM 80GB", 81_559 * 2**20),
    "a100-80gb": GpuKind("A100 80GB", 81_920 * 2**20),
}


def size(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


class PlanError(ValueError):
    """Input the planner cannot answer for; the message is one line."""


@dataclass(frozen=True)
class MemoryPlan:
    """One rank's memory for one training step, in bytes, from the report."""

    params: int
    grads: int
    optimizer: int
    host: int
    activations: int
    gathered_params: int
    staging: int
    peak: int

    @classmethod
    def from_report(cls, report: dict) -> MemoryPlan:
        persistent, peak = report["persistent"], report["peak"]
        return cls(params=persistent["params"], grads=persistent["grads"], optimizer=persistent["optimizer"],
                   host=report["host"]["total"], activations=peak["activations"],
                   gathered_params=peak["gathered_params"], staging=peak["staging"], peak=peak["total"])


@dataclass(frozen=True)
class Plan:
    model: str
    gpus: int
    gpu: GpuKind
    memory: MemoryPlan

    @property
    def headroom(self) -> int:
        """Bytes left on each GPU at the step's peak; negative when it does not fit."""
        return self.gpu.memory - self.memory.peak

    @property
    def verdict(self) -> str:
        need, have = size(self.memory.peak), f"{size(self.gpu.memory)} ({self.gpu.name})"
        if self.headroom >= 0:
            return f"fits: {need} per GPU at the step's peak, {size(self.headroom)} to spare of {have}"
        return f"does not fit: {need} per GPU at the step's peak, {size(-self.headroom)} more than {have}"

    def table(self) -> str:
        m = self.memory
        rows = [("parameter shards", m.params), ("gradient shards", m.grads), ("optimizer state", m.optimizer),
                ("activations at the peak", m.activations), ("gathered parameters at the peak", m.gathered_params),
                ("collective staging at the peak", m.staging), ("step peak", m.peak)]
        if m.host:
            rows.insert(3, ("offloaded to host memory", m.host))
        lines = [f"memory per rank ({self.gpus} x {self.gpu.name}):"]
        lines += [f"  {name:<32} {size(value):>12}" for name, value in rows]
        lines.append(f"  {'headroom':<32} {size(self.headroom):>12}")
        return "\n".join(lines)


def gpu_kind(name: str, memory_gib: float | None = None) -> GpuKind:
    """A kind from the table, or `custom` with `memory_gib`."""
    if name == "custom":
        if not memory_gib or memory_gib <= 0:
            raise PlanError("--gpu custom needs --memory-gib, the GPU's memory in GiB")
        return GpuKind(f"custom GPU ({memory_gib:g} GiB)", int(memory_gib * GIB))
    if name not in GPU_KINDS:
        raise PlanError(f"unknown GPU kind '{name}'; known: {', '.join(sorted(GPU_KINDS))}, or custom "
                        "with --memory-gib")
    if memory_gib is not None:
        raise PlanError(f"--memory-gib is for --gpu custom; {name} has {GPU_KINDS[name].memory / GIB:.2f} GiB")
    return GPU_KINDS[name]


def plan_memory(ir: str, *, gpus: int, gpu: GpuKind, model: str, optimizer: str = "adamw",
                pipeline: str = "") -> Plan:
    """The plan of a captured step (`fsdp.device` "cuda") on `gpus` GPUs,
    every parameter sharded over all of them (FULL_SHARD) unless `pipeline`
    says otherwise."""
    if gpus < 1:
        raise PlanError(f"--gpus must be at least 1, got {gpus}")
    if not re.search(r'fsdp\.device = "cuda"', ir.split("\n", 1)[0]):
        raise PlanError(f"{model} was captured for the CPU (its fused kernels and memory differ on a GPU); "
                        "capture with `python -m fsdpc export --device cuda`")
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "memory.json"
        options = f"ranks={gpus} backend=nccl optimizer={optimizer} {pipeline} " \
                  f"memory-report={report_path} report-format=json"
        run_fsdp_opt(ir, [f"--fsdp-sharding-pipeline={options.strip()}", "-o", "/dev/null"])
        reports = json.loads(report_path.read_text())
    steps = [report for report in reports if report["function"] == "train_step"] or reports
    if not steps:
        raise PlanError(f"{model}: the captured IR has no training step to plan")
    return Plan(model=model, gpus=gpus, gpu=gpu, memory=MemoryPlan.from_report(steps[0]))


def capture_for_plan(model_spec: str, *, batch: int | None, seq: int | None,
                     mixed_precision: MixedPrecision | None) -> str:
    """The step of `model_spec` (a built-in name or file.py:factory) captured
    on meta for a CUDA target."""
    factory = load_factory(model_spec)
    options = {key: value for key, value in (("batch", batch), ("seq", seq)) if value is not None}
    model, example, loss_fn = build(factory, meta=True, **options)
    return export_training_step(model, example, loss_fn, mixed_precision=mixed_precision, device="cuda").mlir


MOST_GPUS = 1024


def what_would_fit(ir: str, plan: Plan, *, optimizer: str = "adamw", pipeline: str = "") -> list[str]:
    """For a plan that does not fit, what would, each a line: the fewest GPUs
    (doubling, up to 1024), recomputing every unit's activations
    (`checkpoint=*`), and offloading the fewest units to host memory
    (`offload-to-fit`), each at the plan's GPU count and alone."""
    if plan.headroom >= 0:
        return []
    ways = []
    gpus = plan.gpus * 2
    while gpus <= MOST_GPUS:
        bigger = plan_memory(ir, gpus=gpus, gpu=plan.gpu, model=plan.model, optimizer=optimizer, pipeline=pipeline)
        if bigger.headroom >= 0:
            ways.append(f"{gpus} GPUs: {size(bigger.memory.peak)} per GPU")
            break
        gpus *= 2
    else:
        ways.append(f"no GPU count up to {MOST_GPUS} fits with these settings")
    for option, what in (("checkpoint=*", "recomputing every unit's activations in backward (checkpoint=*)"),
                         (f"offload-to-fit={plan.gpu.memory // 2**20}",
                          "offloading the fewest units to host memory (offload-to-fit)")):
        try:
            changed = plan_memory(ir, gpus=plan.gpus, gpu=plan.gpu, model=plan.model, optimizer=optimizer,
                                  pipeline=f"{pipeline} {option}")
        except FsdpOptError:  # offload-to-fit says it cannot: nothing to suggest there
            continue
        if changed.headroom >= 0:
            host = f", {size(changed.memory.host)} in host memory" if changed.memory.host else ""
            ways.append(f"{plan.gpus} GPUs {what}: {size(changed.memory.peak)} per GPU{host}")
    return ways

"""Will it fit, and how fast? `python -m fsdpc plan` answers from the compiled
step before any GPU is rented: the step is captured on the meta device for a
CUDA target, sharded by `fsdp-opt` for N GPUs, and the memory report of that
schedule (the model that equals the allocator's peak where fsdpc runs) is
held against the GPU's memory, while fsdp-step-time replays the same schedule
on a model of the GPU and its links for the step's time.

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


def size(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


class PlanError(ValueError):
    """Input the planner cannot answer for; the message is one line."""


# The options of fsdp-step-time that describe a GPU's hardware, by the name
# `python -m fsdpc plan` gives them (--memory-gib, --tensor-tflops, ...).
HARDWARE_OPTIONS = ("memory-gib", "tensor-tflops", "fp32-tflops", "memory-gbps", "intra-node-gbps",
                    "inter-node-gbps", "host-link-gbps")


@dataclass(frozen=True)
class Machine:
    """The GPUs a plan is for: a kind from fsdp-opt's table
    (lib/Analysis/Time.cpp holds it: h100-sxm, h100-96gb, h200, a100-80gb)
    or `custom`, with any hardware number overridden, and how many GPUs
    share a node's NVLink."""

    kind: str = "h100-sxm"
    gpus_per_node: int = 8
    numbers: tuple[tuple[str, float], ...] = ()  # (fsdp-step-time option, value)

    def options(self) -> str:
        numbers = " ".join(f"{name}={value!r}" for name, value in self.numbers)
        return f"gpu={self.kind} gpus-per-node={self.gpus_per_node} {numbers}".strip()


def _one_line(error: FsdpOptError) -> str:
    """fsdp-opt's first error, without its location."""
    for line in error.diagnostics.splitlines():
        if "error: " in line:
            return line.split("error: ", 1)[1]
    return str(error).splitlines()[0]


def machine(kind: str = "h100-sxm", gpus_per_node: int = 8, **numbers: float | None) -> Machine:
    """A checked Machine; `numbers` by option name with `_` for `-`
    (memory_gib=80). fsdp-opt checks them, so a bad kind or number is caught
    before a long capture."""
    if gpus_per_node < 1:
        raise PlanError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    given = tuple((name.replace("_", "-"), float(value)) for name, value in numbers.items() if value is not None)
    unknown = [name for name, _ in given if name not in HARDWARE_OPTIONS]
    if unknown:
        raise PlanError(f"unknown GPU number {unknown[0]}; use {', '.join(HARDWARE_OPTIONS)}")
    chosen = Machine(kind, gpus_per_node, given)
    try:
        run_fsdp_opt("module {}", [f"--fsdp-step-time={chosen.options()} output=", "-o", "/dev/null"])
    except FsdpOptError as error:
        raise PlanError(_one_line(error)) from None
    return chosen


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
class TimePlan:
    """One rank's predicted step, in seconds, from fsdp-step-time."""

    step: float
    compute: float
    communication: float
    exposed_communication: float
    host_bound: float
    transfer: float
    optimizer: float
    model_flops: float
    tokens: int  # elements of the step's first input (batch x sequence for a language model)
    tensor_flops: float

    @classmethod
    def from_report(cls, report: dict) -> TimePlan:
        tokens = 1
        for dim in report["first_input_shape"]:
            tokens *= dim
        return cls(step=report["step_s"], compute=report["compute_s"], communication=report["communication_s"],
                   exposed_communication=report["exposed_communication_s"], host_bound=report["host_bound_s"],
                   transfer=report["transfer_s"], optimizer=report["optimizer_s"],
                   model_flops=report["model_flops"], tokens=tokens,
                   tensor_flops=report["machine"]["tensor_flops"])

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.step

    @property
    def mfu(self) -> float:
        """Model FLOPs (recomputation left out) per second over the dense bf16 peak."""
        return self.model_flops / self.step / self.tensor_flops


@dataclass(frozen=True)
class Plan:
    model: str
    gpus: int
    machine: Machine
    gpu_name: str
    gpu_memory: int  # bytes
    memory: MemoryPlan
    time: TimePlan

    @property
    def headroom(self) -> int:
        """Bytes left on each GPU at the step's peak; negative when it does not fit."""
        return self.gpu_memory - self.memory.peak

    @property
    def verdict(self) -> str:
        need, have = size(self.memory.peak), f"{size(self.gpu_memory)} ({self.gpu_name})"
        if self.headroom >= 0:
            return f"fits: {need} per GPU at the step's peak, {size(self.headroom)} to spare of {have}"
        return f"does not fit: {need} per GPU at the step's peak, {size(-self.headroom)} more than {have}"

    def table(self) -> str:
        m, t = self.memory, self.time
        rows = [("parameter shards", m.params), ("gradient shards", m.grads), ("optimizer state", m.optimizer),
                ("activations at the peak", m.activations), ("gathered parameters at the peak", m.gathered_params),
                ("collective staging at the peak", m.staging), ("step peak", m.peak)]
        if m.host:
            rows.insert(3, ("offloaded to host memory", m.host))
        lines = [f"memory per rank ({self.gpus} x {self.gpu_name}):"]
        lines += [f"  {name:<32} {size(value):>12}" for name, value in rows]
        lines.append(f"  {'headroom':<32} {size(self.headroom):>12}")
        lines.append(f"time per rank (predicted, {self.machine.gpus_per_node} GPUs per node):")
        times = [("step", t.step), ("compute kernels", t.compute), ("collectives (own streams)", t.communication),
                 ("exposed communication", t.exposed_communication), ("waiting for the host", t.host_bound),
                 ("optimizer step", t.optimizer)]
        if t.transfer:
            times.insert(4, ("host <-> device copies", t.transfer))
        lines += [f"  {name:<32} {value * 1e3:>9.2f} ms" for name, value in times]
        lines.append(f"  {'tokens/s per GPU':<32} {t.tokens_per_second:>12,.0f}")
        lines.append(f"  {'MFU':<32} {t.mfu * 100:>11.1f}%")
        return "\n".join(lines)


def plan_step(ir: str, *, gpus: int, machine: Machine = Machine(), model: str, optimizer: str = "adamw",
              pipeline: str = "", trace: str | None = None) -> Plan:
    """The plan of a captured step (`fsdp.device` "cuda") on `gpus` GPUs,
    every parameter sharded over all of them (FULL_SHARD) unless `pipeline`
    says otherwise: the memory report and the predicted time of that one
    schedule; `trace` writes the predicted step as a Perfetto trace."""
    if gpus < 1:
        raise PlanError(f"--gpus must be at least 1, got {gpus}")
    if gpus > machine.gpus_per_node and gpus % machine.gpus_per_node:
        raise PlanError(f"{gpus} GPUs do not fill nodes of {machine.gpus_per_node}; "
                        "give a multiple of --gpus-per-node")
    if not re.search(r'^module attributes \{[^\n]*fsdp\.device = "cuda"', ir, re.MULTILINE):
        raise PlanError(f"{model} was captured for the CPU (its fused kernels and memory differ on a GPU); "
                        "capture with `python -m fsdpc export --device cuda`")
    with tempfile.TemporaryDirectory() as scratch:
        memory_path, time_path = Path(scratch) / "memory.json", Path(scratch) / "time.json"
        options = f"ranks={gpus} backend=nccl optimizer={optimizer} {pipeline} " \
                  f"memory-report={memory_path} report-format=json"
        timing = f"{machine.options()} optimizer={optimizer} format=json output={time_path}"
        if trace:
            timing += f" trace={trace}"
        run_fsdp_opt(ir, [f"--fsdp-sharding-pipeline={options.strip()}", f"--fsdp-step-time={timing}",
                          "-o", "/dev/null"])
        memory_reports = json.loads(memory_path.read_text())
        time_reports = json.loads(time_path.read_text())
    steps = [index for index, report in enumerate(memory_reports) if report["function"] == "train_step"] or [0]
    if not memory_reports:
        raise PlanError(f"{model}: the captured IR has no training step to plan")
    memory, time = memory_reports[steps[0]], time_reports[steps[0]]
    gpu = time["machine"]
    return Plan(model=model, gpus=gpus, machine=machine, gpu_name=gpu["name"], gpu_memory=gpu["memory_bytes"],
                memory=MemoryPlan.from_report(memory), time=TimePlan.from_report(time))


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
    per_node = plan.machine.gpus_per_node
    gpus = plan.gpus * 2
    while gpus <= MOST_GPUS:
        if gpus > per_node and gpus % per_node:  # whole nodes only
            gpus *= 2
            continue
        bigger = plan_step(ir, gpus=gpus, machine=plan.machine, model=plan.model, optimizer=optimizer,
                           pipeline=pipeline)
        if bigger.headroom >= 0:
            ways.append(f"{gpus} GPUs: {size(bigger.memory.peak)} per GPU, {bigger.time.step * 1e3:.0f} ms per step")
            break
        gpus *= 2
    else:
        ways.append(f"no GPU count up to {MOST_GPUS} fits with these settings")
    for option, what in (("checkpoint=*", "recomputing every unit's activations in backward (checkpoint=*)"),
                         (f"offload-to-fit={plan.gpu_memory // 2**20}",
                          "offloading the fewest units to host memory (offload-to-fit)")):
        try:
            changed = plan_step(ir, gpus=plan.gpus, machine=plan.machine, model=plan.model, optimizer=optimizer,
                                pipeline=f"{pipeline} {option}")
        except FsdpOptError:  # offload-to-fit says it cannot: nothing to suggest there
            continue
        if changed.headroom >= 0:
            host = f", {size(changed.memory.host)} in host memory" if changed.memory.host else ""
            ways.append(f"{plan.gpus} GPUs {what}: {size(changed.memory.peak)} per GPU{host}, "
                        f"{changed.time.step * 1e3:.0f} ms per step")
    return ways

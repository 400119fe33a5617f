"""Will it fit, and how fast? `python -m fsdpc plan` answers from the compiled
step before any GPU is rented: the step is captured on the meta device for a
CUDA target, sharded by `fsdp-opt` for N GPUs, and the memory report of that
schedule (the model that equals the allocator's peak where fsdpc runs) is
held against the GPU's memory, while fsdp-step-time replays the same schedule
on a model of the GPU and its links for the step's time.

    python -m fsdpc plan --model llama3-70b --gpus 8 --gpu h100-sxm --batch 1 --seq 4096
"""

from __future__ import annotations

import itertools
import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from fsdpc.capture import MixedPrecision
from fsdpc.compiler import FsdpOptError, run_fsdp_opt
from fsdpc import cache
from fsdpc.export import build, call_trace, load_factory, traced_forward
from fsdpc.program import runtime_extension

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
                    "inter-node-gbps", "host-link-gbps", "host-optimizer-gbps")
# When the host steps offloaded units (ShardedModule.overlap_host_optimizer),
# as fsdp-step-time's options say it: after the step; beside the next step's
# forward; from when each unit's gradients land, in backward.
HOST_OPTIMIZER_TIMINGS = {"after-step": "", "next-forward": " overlap-host-optimizer=true",
                          "in-backward": " host-optimizer-in-backward=true"}
# The software's share of the hardware, which a measured profile calibrates.
CALIBRATED_OPTIONS = ("matmul-efficiency", "attention-efficiency", "memory-efficiency", "issue-us")


@dataclass(frozen=True)
class Machine:
    """The GPUs a plan is for: a kind from fsdp-opt's table
    (lib/Analysis/Time.cpp holds it: h100-sxm, h100-96gb, h200, a100-80gb)
    or `custom`, with any hardware number overridden, how many GPUs
    share a node's NVLink, and when offloaded units' optimizer steps run
    (HOST_OPTIMIZER_TIMINGS; ShardedModule.overlap_host_optimizer)."""

    kind: str = "h100-sxm"
    gpus_per_node: int = 8
    numbers: tuple[tuple[str, float], ...] = ()  # (fsdp-step-time option, value)
    host_optimizer: str = "after-step"

    def options(self) -> str:
        numbers = " ".join(f"{name}={value!r}" for name, value in self.numbers)
        return f"gpu={self.kind} gpus-per-node={self.gpus_per_node} {numbers}".strip() + \
            HOST_OPTIMIZER_TIMINGS[self.host_optimizer]

    def step_time(self, optimizer: str, output: Path) -> str:
        """The fsdp-step-time pass for this machine, its JSON report to `output`."""
        return f"--fsdp-step-time={self.options()} optimizer={optimizer} format=json output={output}"


def train_step_report(reports: list[dict], model: str) -> dict:
    """Of a report's steps, the training step (or the one step there is)."""
    if not reports:
        raise PlanError(f"{model}: the captured IR has no training step to plan")
    return next((report for report in reports if report["function"] == "train_step"), reports[0])


def _one_line(error: FsdpOptError) -> str:
    """fsdp-opt's first error, without its location."""
    for line in error.diagnostics.splitlines():
        if "error: " in line:
            return line.split("error: ", 1)[1]
    return str(error).splitlines()[0]


def machine(kind: str = "h100-sxm", gpus_per_node: int = 8, *, host_optimizer: str = "after-step",
            **numbers: float | None) -> Machine:
    """A checked Machine; `numbers` by option name with `_` for `-`
    (memory_gib=80). fsdp-opt checks them, so a bad kind or number is caught
    before a long capture."""
    if gpus_per_node < 1:
        raise PlanError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
    given = tuple((name.replace("_", "-"), float(value)) for name, value in numbers.items() if value is not None)
    unknown = [name for name, _ in given if name not in HARDWARE_OPTIONS + CALIBRATED_OPTIONS]
    if unknown:
        raise PlanError(f"unknown GPU number {unknown[0]}; use {', '.join(HARDWARE_OPTIONS + CALIBRATED_OPTIONS)}")
    if host_optimizer not in HOST_OPTIMIZER_TIMINGS:
        raise PlanError(f"unknown host optimizer timing {host_optimizer!r}; use {', '.join(HOST_OPTIMIZER_TIMINGS)}")
    chosen = Machine(kind, gpus_per_node, given, host_optimizer)
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
    working: int  # the peak above the step's start: what a CUDA graph keeps reserved between calls

    @classmethod
    def from_report(cls, report: dict) -> MemoryPlan:
        persistent, peak = report["persistent"], report["peak"]
        return cls(params=persistent["params"], grads=persistent["grads"], optimizer=persistent["optimizer"],
                   host=report["host"]["total"], activations=peak["activations"],
                   gathered_params=peak["gathered_params"], staging=peak["staging"], peak=peak["total"],
                   working=peak["above_step_start"])


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
    host_optimizer: float  # the host's share of `optimizer`
    model_flops: float
    tokens: int  # elements of the step's first input (batch x sequence for a language model)
    tensor_flops: float
    instructions: int
    ideal: dict  # kernel class -> seconds at the full peak or bandwidth
    kernel_classes: dict  # operator name as profilers print it -> its kernel class

    @classmethod
    def from_report(cls, report: dict) -> TimePlan:
        tokens = 1
        for dim in report["first_input_shape"]:
            tokens *= dim
        return cls(step=report["step_s"], compute=report["compute_s"], communication=report["communication_s"],
                   exposed_communication=report["exposed_communication_s"], host_bound=report["host_bound_s"],
                   transfer=report["transfer_s"], optimizer=report["optimizer_s"],
                   host_optimizer=report["host_optimizer_s"], model_flops=report["model_flops"], tokens=tokens,
                   tensor_flops=report["machine"]["tensor_flops"], instructions=report["instructions"],
                   ideal=report["ideal_s"], kernel_classes=report["kernel_classes"])

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


def check_gpu_step(ir: str, model: str) -> None:
    if not re.search(r'^module attributes \{[^\n]*fsdp\.device = "cuda"', ir, re.MULTILINE):
        raise PlanError(f"{model} was captured for the CPU (its fused kernels and memory differ on a GPU); "
                        "capture with `python -m fsdpc export --device cuda`")


@contextmanager
def parsed_once(ir: str, model: str) -> Iterator[Path]:
    """The captured step as MLIR bytecode in a scratch file, for planning
    many configurations of it: fsdp-opt reads bytecode several times faster
    than text (0.04 s against 0.2 s for the 70B step)."""
    check_gpu_step(ir, model)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "step.mlirbc"
        run_fsdp_opt(ir, ["--emit-bytecode", "-o", str(path)])
        yield path


def plan_step(ir: str | Path, *, gpus: int, machine: Machine = Machine(), model: str, optimizer: str = "adamw",
              pipeline: str = "", replicas: int = 1, trace: str | None = None) -> Plan:
    """The plan of a captured step (`fsdp.device` "cuda"; text, or a file
    from `parsed_once`) on `gpus` GPUs, every parameter sharded over all of
    them (FULL_SHARD), or over groups of gpus / `replicas` replicated
    `replicas` times (HSDP), unless `pipeline` says otherwise: the memory
    report and the predicted time of that one schedule; `trace` writes the
    predicted step as a Perfetto trace."""
    if gpus < 1:
        raise PlanError(f"--gpus must be at least 1, got {gpus}")
    if replicas < 1 or gpus % replicas:
        raise PlanError(f"{replicas} replicas do not divide {gpus} GPUs")
    if gpus > machine.gpus_per_node and gpus % machine.gpus_per_node:
        raise PlanError(f"{gpus} GPUs do not fill nodes of {machine.gpus_per_node}; "
                        "give a multiple of --gpus-per-node")
    if isinstance(ir, str):
        check_gpu_step(ir, model)
    with tempfile.TemporaryDirectory() as scratch:
        memory_path, time_path = Path(scratch) / "memory.json", Path(scratch) / "time.json"
        hybrid = f"strategy=hybrid-shard replicas={replicas} " if replicas > 1 else ""
        options = f"ranks={gpus // replicas} {hybrid}backend=nccl optimizer={optimizer} {pipeline} " \
                  f"memory-report={memory_path} report-format=json"
        timing = machine.step_time(optimizer, time_path) + (f" trace={trace}" if trace else "")
        run_fsdp_opt(ir, [f"--fsdp-sharding-pipeline={options.strip()}", timing, "--emit-bytecode", "-o", "/dev/null"])
        memory = train_step_report(json.loads(memory_path.read_text()), model)
        time = train_step_report(json.loads(time_path.read_text()), model)
    gpu = time["machine"]
    return Plan(model=model, gpus=gpus, machine=machine, gpu_name=gpu["name"], gpu_memory=gpu["memory_bytes"],
                memory=MemoryPlan.from_report(memory), time=TimePlan.from_report(time))


def capture_for_plan(model_spec: str, *, batch: int | None, seq: int | None,
                     mixed_precision: MixedPrecision | None) -> str:
    """The step of `model_spec` (a built-in name or file.py:factory) captured
    on meta for a CUDA target. The program cache keeps it under its
    recorded torch calls and its forward's trace (`cache.capture_key`):
    planning the same step again (other GPU counts, kinds, settings) records
    the calls and skips export and the joint trace."""
    factory = load_factory(model_spec)
    options = {key: value for key, value in (("batch", batch), ("seq", seq)) if value is not None}
    model, example, loss_fn = build(factory, meta=True, **options)
    # Without a reduce_dtype, reduced as fsdpc.shard reduces with this policy.
    mixed_precision = mixed_precision and mixed_precision.as_fsdp2_reduces(model)
    calls = call_trace(model, example, loss_fn, mixed_precision=mixed_precision, device="cuda")
    calls_key = calls and cache.capture_key(calls.fingerprint)
    entry = cache.load(calls_key) if calls_key else None
    if entry is not None:
        calls.echo()
        return entry["captured_ir"]
    with traced_forward(model, example, loss_fn, mixed_precision=mixed_precision, device="cuda") as stage:
        key = cache.capture_key(stage.fingerprint())
        entry = cache.load(key)
        captured = entry["captured_ir"] if entry is not None else stage.export().mlir
    for each_key in (key, calls_key):
        if each_key:
            cache.store(each_key, {"captured_ir": captured})
    return captured


MOST_GPUS = 1024


# The share of a step waiting for the host above which replaying it as a
# CUDA graph is worth a line of the plan.
HOST_BOUND_SHARE = 0.2


def _worth_replaying(plan: Plan, pipeline: str) -> bool:
    """Whether the host bounds `plan`'s step (over HOST_BOUND_SHARE of it
    waits for the host to issue its calls) and `pipeline` does not replay it
    already."""
    return plan.time.host_bound > HOST_BOUND_SHARE * plan.time.step and \
        not re.search(r"\bcuda-graph=true\b", pipeline)


def when_replayed(ir: str, plan: Plan, *, optimizer: str = "adamw", pipeline: str = "") -> str | None:
    """For a step that waits for the host to issue its calls, a line with its
    time replayed as a CUDA graph (`cuda-graph=true`), planned the same
    way; None where the host does not bound it, it is replayed already, or
    it offloads (which a graph cannot replay)."""
    if not _worth_replaying(plan, pipeline) or plan.memory.host:
        return None
    replayed = plan_step(ir, gpus=plan.gpus, machine=plan.machine, model=plan.model, optimizer=optimizer,
                         pipeline=f"{pipeline} cuda-graph=true")
    return (f"the step waits {plan.time.host_bound * 1e3:.2f} of its {plan.time.step * 1e3:.2f} ms for the host to "
            f"issue its calls; replayed as a CUDA graph (--pipeline cuda-graph=true): "
            f"{replayed.time.step * 1e3:.2f} ms, {replayed.time.tokens_per_second:,.0f} tokens/s per GPU, "
            f"its {size(replayed.memory.working)} of working memory kept reserved between calls")


def what_would_fit(ir: str, plan: Plan, *, optimizer: str = "adamw", pipeline: str = "") -> list[str]:
    """For a plan that does not fit, what would, each a line: the fewest GPUs
    (doubling, up to 1024), recomputing every unit's activations
    (`checkpoint=*`), and offloading the fewest units to host memory
    (`offload-to-fit`), each at the plan's GPU count and alone."""
    if plan.headroom >= 0:
        return []
    with parsed_once(ir, plan.model) as step_file:
        return _ways_to_fit(step_file, plan, optimizer, pipeline)


def _ways_to_fit(step_file: Path, plan: Plan, optimizer: str, pipeline: str) -> list[str]:
    ways = []
    per_node = plan.machine.gpus_per_node
    gpus = plan.gpus * 2
    while gpus <= MOST_GPUS:
        if gpus > per_node and gpus % per_node:  # whole nodes only
            gpus *= 2
            continue
        bigger = plan_step(step_file, gpus=gpus, machine=plan.machine, model=plan.model, optimizer=optimizer,
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
            changed = plan_step(step_file, gpus=plan.gpus, machine=plan.machine, model=plan.model,
                                optimizer=optimizer, pipeline=f"{pipeline} {option}")
        except FsdpOptError:  # offload-to-fit says it cannot: nothing to suggest there
            continue
        if changed.headroom >= 0:
            host = f", {size(changed.memory.host)} in host memory" if changed.memory.host else ""
            ways.append(f"{plan.gpus} GPUs {what}: {size(changed.memory.peak)} per GPU{host}, "
                        f"{changed.time.step * 1e3:.0f} ms per step")
    return ways


@dataclass(frozen=True)
class Candidate:
    """One configuration the search tried: its settings as sharding-pipeline
    options (only those that differ from the defaults) and its plan."""

    settings: str
    replicas: int
    plan: Plan

    @property
    def description(self) -> str:
        hybrid = [f"hybrid {self.replicas} x {self.plan.gpus // self.replicas}"] if self.replicas > 1 else []
        return " ".join(hybrid + [self.settings]).strip() or "the defaults"


def wrap_units(ir: str) -> list[str]:
    """The captured step's non-root wrap units, in order."""
    return [name for name, root in re.findall(r'^\s*fsdp\.unit @"?([^"\s]+)"?( root)?', ir, re.MULTILINE)
            if not root]


def search_space(ir: str, gpus: int, machine: Machine) -> list[tuple[str, int]]:
    """The knobs fsdpc has, combined: reshard after forward (true, false, or
    to a node's GPUs when the job spans nodes), forward and backward prefetch
    depth, reductions in flight, which units recompute their activations
    (none, every second, all), selective recompute, and HSDP with one
    replica per node when there are several nodes. Each as (pipeline
    options, replicas). `search` then tries the fastest of them with shard
    groups of several nodes (`intermediate_replicas`) and with units merged
    in pairs."""
    units = wrap_units(ir)
    nodes = gpus // machine.gpus_per_node if gpus > machine.gpus_per_node else 1
    reshard = ["", "reshard-after-forward=false"]
    if nodes > 1:
        reshard.append(f"reshard-after-forward={machine.gpus_per_node}")
    checkpoint = ["", f"checkpoint={','.join(units[::2])}", "checkpoint=*"] if units else [""]
    space = []
    for replicas in sorted({1, nodes}):
        for choice in itertools.product(
                reshard if replicas == 1 else reshard[:2], ["", "forward-prefetch=2"], ["", "backward-prefetch=2"],
                ["", "overlap-reductions=2"], checkpoint, ["", "selective-recompute=false"]):
            space.append((" ".join(option for option in choice if option), replicas))
    return space


@dataclass(frozen=True)
class SearchResult:
    fitting: list[Candidate]  # fastest first, one per distinct prediction
    tried: int                # plans computed
    default: Plan             # the defaults, for comparison
    budget: int               # bytes a configuration's peak had to fit


def search(ir: str, *, gpus: int, machine: Machine = Machine(), model: str, optimizer: str = "adamw",
           pipeline: str = "", budget: int | None = None,
           space: list[tuple[str, int]] | None = None) -> SearchResult:
    """Every configuration of `search_space` planned on `gpus` GPUs with
    `pipeline` added to each; keeps those whose peak fits `budget` bytes (the
    GPU's memory by default), fastest first. When none fits, the sixth with
    the lowest peaks are tried again offloading the fewest units that bring
    them within the budget (offload-to-fit). On more than two nodes the
    fastest twelfth are tried with shard groups of 2, 4, ... nodes; the
    fastest twelfth that fit and checkpoint, with `checkpoint-policy=ops`.
    The fastest sixth that fit are tried once more with units merged in pairs (`units-per-group=2`): a knob
    that moves the step by a percent or two refines the best instead of
    doubling the space. Where the host bounds the default step (over
    HOST_BOUND_SHARE of it), the fastest sixth that fit and offload nothing
    are tried replayed as a CUDA graph (`cuda-graph=true`). `space` replaces `search_space`'s configurations;
    its first must be the defaults."""
    space = space if space is not None else search_space(ir, gpus, machine)
    with parsed_once(ir, model) as step_file:
        return _search(step_file, space, gpus, machine, model, optimizer, pipeline, budget,
                       pair_units=len(wrap_units(ir)) > 1, wider_shards=intermediate_replicas(gpus, machine))


def intermediate_replicas(gpus: int, machine: Machine) -> list[int]:
    """HSDP shapes between full sharding (1 replica) and a shard group per
    node: replica counts that shard each parameter over 2, 4, ... nodes."""
    nodes = gpus // machine.gpus_per_node if gpus > machine.gpus_per_node else 1
    return [replicas for replicas in (2 ** k for k in range(1, nodes.bit_length()))
            if replicas < nodes and nodes % replicas == 0]


def _search(step_file: Path, space: list[tuple[str, int]], gpus: int, machine: Machine, model: str,
            optimizer: str, pipeline: str, budget: int | None, pair_units: bool,
            wider_shards: list[int]) -> SearchResult:
    def plan_one(config: tuple[str, int], extra: str = "") -> Candidate | None:
        settings, replicas = config
        settings = f"{settings} {extra}".strip()
        try:
            plan = plan_step(step_file, gpus=gpus, machine=machine, model=model, optimizer=optimizer,
                             pipeline=f"{pipeline} {settings}", replicas=replicas)
        except FsdpOptError:  # offload-to-fit that cannot fit says so
            return None
        return Candidate(settings, replicas, plan)

    def first(candidates, share: int, key=lambda c: c.plan.time.step) -> list[Candidate]:
        """The first `1/share` of the space's size of `candidates` by `key` (at least one)."""
        return sorted((c for c in candidates if c), key=key)[:max(1, len(space) // share)]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        def planned_again(configs: list[tuple[str, int]], extra: str = "") -> list[Candidate]:
            """`configs` planned with `extra` added: those that fit."""
            return [c for c in pool.map(lambda config: plan_one(config, extra), configs)
                    if c and c.plan.memory.peak <= limit]

        tried = list(pool.map(plan_one, space))
        default = tried[0].plan  # the first configuration sets no option
        limit = default.gpu_memory if budget is None else budget
        fitting = [c for c in tried if c and c.plan.memory.peak <= limit]
        runs = len(space)
        if not fitting:
            # Offloading costs what must move, the excess over the budget:
            # retry the sixth of the configurations with the lowest peaks.
            retried = [(c.settings, c.replicas) for c in first(tried, 6, key=lambda c: c.plan.memory.peak)]
            fitting = planned_again(retried, f"offload-to-fit={limit // 2**20}")
            runs += len(retried)
        if wider_shards:
            # Shard groups of several nodes sit between the two shapes the
            # space has: the settings of the fastest twelfth planned (fitting
            # or not: a wider shard group needs less memory than one per
            # node), with each of those replica counts.
            settings = list(dict.fromkeys(c.settings for c in first(tried, 12)
                                          if not re.search(r"reshard-after-forward=\d", c.settings)))
            wider = [(setting, replicas) for replicas in wider_shards for setting in settings]
            fitting += planned_again(wider)
            runs += len(wider)
        # Checkpointing that fits may fit with torchtitan's op-level policy
        # too, which recomputes half the matrix products.
        checkpointed = [(c.settings, c.replicas)
                        for c in first((c for c in fitting if "checkpoint=" in c.settings), 12)]
        fitting += planned_again(checkpointed, "checkpoint-policy=ops")
        runs += len(checkpointed)
        if pair_units:
            best = [(c.settings, c.replicas) for c in first(fitting, 6)]
            fitting += planned_again(best, "units-per-group=2")
            runs += len(best)
        # A step the host bounds is tried replayed as a CUDA graph: the
        # fastest sixth that fit and offload nothing (a graph cannot replay
        # host work); the memory model does not change.
        if _worth_replaying(default, pipeline):
            replayable = [(c.settings, c.replicas) for c in first((c for c in fitting if not c.plan.memory.host), 6)]
            fitting += planned_again(replayable, "cuda-graph=true")
            runs += len(replayable)
    # Fastest first. Steps within 0.2% of each other are more alike than the
    # model is exact: among them the fewest settings (HSDP counting as one),
    # then the lowest peak, come first, and of those with the same peak too
    # only the first is kept.
    quantum = 0.002 * min((c.plan.time.step for c in fitting), default=1.0)

    def rank(c: Candidate) -> tuple:
        return (round(c.plan.time.step / quantum), len(c.settings.split()) + (c.replicas > 1), c.plan.memory.peak)
    fitting.sort(key=rank)
    seen, distinct = set(), []
    for candidate in fitting:
        alike = (rank(candidate)[0], candidate.plan.memory.peak)
        if alike not in seen:
            seen.add(alike)
            distinct.append(candidate)
    return SearchResult(distinct, runs, default, limit)


def explain(best: Candidate, default: Plan) -> str:
    """Why the best configuration wins, against the defaults: where its time
    and memory differ."""
    b, d = best.plan, default
    changes = []
    for what, mine, theirs in (("exposed communication", b.time.exposed_communication, d.time.exposed_communication),
                               ("compute", b.time.compute, d.time.compute),
                               ("waiting for the host", b.time.host_bound, d.time.host_bound),
                               ("host <-> device copies", b.time.transfer, d.time.transfer),
                               ("optimizer", b.time.optimizer, d.time.optimizer)):
        if abs(mine - theirs) >= 0.0005:
            changes.append(f"{what} {(mine - theirs) * 1e3:+.1f} ms")
    changes.append(f"peak {'+' if b.memory.peak >= d.memory.peak else '-'}{size(abs(b.memory.peak - d.memory.peak))}")
    fits = "fits" if d.headroom >= 0 else "does not fit"
    return (f"against the defaults ({d.time.step * 1e3:.1f} ms, {size(d.memory.peak)}, {fits}): "
            + ", ".join(changes))


def each_setting(ir: str, best: Candidate, *, budget: int, optimizer: str = "adamw", pipeline: str = "") -> list[str]:
    """What each of the best configuration's settings contributes: the same
    configuration planned without it (one replica instead of HSDP), its
    step time against the best's, or that it is needed to fit `budget`."""
    plan = best.plan
    settings = best.settings.split()
    variants = [(" ".join(s for s in settings if s != setting), best.replicas, setting) for setting in settings]
    if best.replicas > 1:
        variants.append((best.settings, 1, f"hybrid {best.replicas} x {plan.gpus // best.replicas}"))
    lines = []
    with parsed_once(ir, plan.model) as step_file:
        for others, replicas, setting in variants:
            without = plan_step(step_file, gpus=plan.gpus, machine=plan.machine, model=plan.model,
                                optimizer=optimizer, pipeline=f"{pipeline} {others}", replicas=replicas)
            if without.memory.peak > budget:
                lines.append(f"{setting}: needed to fit (without it {size(without.memory.peak)})")
            else:
                lines.append(f"{setting}: {(plan.time.step - without.time.step) * 1e3:+.1f} ms")
    return lines


# The optimizer's own calls, which a profiled step holds and the kernel
# classes leave out (the time model counts the optimizer apart).
_OPTIMIZER_MARKS = ("_fused_adam", "_foreach_", "optimizer", "Optimizer")


@dataclass(frozen=True)
class Profile:
    """One measured step, from a PyTorch profiler Chrome trace (the GPU
    benchmark writes one per run): seconds of kernels by class, and the host
    time the runtime's ATen calls and generated kernels' launches spanned."""

    kernels: dict  # class -> seconds
    host: float
    ops: int       # top-level ATen calls on the host

    @classmethod
    def read(cls, path: str | Path, kernel_classes: dict[str, str]) -> Profile:
        """`kernel_classes` (`TimePlan.kernel_classes`: the time model's own
        class of each operator of the step) classes each top-level call; a
        kernel counts for the top-level call that launched it, and calls
        the step does not hold (the driver's copies) count as memory."""

        def kind(name: str) -> str | None:
            if any(mark in name for mark in _OPTIMIZER_MARKS):
                return None
            found = kernel_classes.get(name, "memory")
            return "memory" if found == "view" else found

        try:
            events = json.loads(Path(path).read_text())["traceEvents"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise PlanError(f"--profile {path}: not a Chrome trace with traceEvents ({error})") from None
        ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X" and "dur" in e),
                     key=lambda e: (e.get("tid"), e["ts"], -e["dur"]))
        # Top-level calls: not inside an earlier call of the same thread. A
        # kernel counts for the top-level call around the one that launched it.
        top, top_of_id, inside_until = [], {}, {}
        for op in ops:
            if op["ts"] >= inside_until.get(op.get("tid"), float("-inf")):
                top.append(op)
                inside_until[op.get("tid")] = op["ts"] + op["dur"]
            if "External id" in op.get("args", {}):
                top_of_id[op["args"]["External id"]] = top[-1]["name"]
        kernels = {"matmul": 0.0, "attention": 0.0, "memory": 0.0}
        device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e
                  and not e.get("name", "").startswith("nccl")]
        if device:
            for kernel in device:
                launched_by = top_of_id.get(kernel.get("args", {}).get("External id"))
                if found := (kind(launched_by) if launched_by is not None else "memory"):
                    kernels[found] += kernel["dur"] * 1e-6
        else:  # a CPU profile: each call is its own kernel
            for op in top:
                if found := kind(op["name"]):
                    kernels[found] += op["dur"] * 1e-6
        launch = runtime_extension().KERNEL_LAUNCH_RECORD  # a generated kernel's launch
        calls = [op for op in top if (op["name"].startswith("aten::") or op["name"] == launch) and kind(op["name"])]
        if not calls:
            raise PlanError(f"--profile {path}: no ATen calls in the trace")
        host = (max(op["ts"] + op["dur"] for op in calls) - min(op["ts"] for op in calls)) * 1e-6
        return cls(kernels=kernels, host=host, ops=len(calls))


def calibrate(profile: Profile, ideal: dict[str, float]) -> dict[str, float]:
    """fsdp-step-time's efficiencies and issue time that make its kernel
    classes take what `profile` measured, given the classes' `ideal` seconds
    (`TimePlan.ideal`, or a report's `ideal_s`) for the profiled step on the
    GPUs it ran on: a class's ideal time over its measured time, and the
    host's time per call."""
    numbers = {}
    for kind in ("matmul", "attention", "memory"):
        ideal_s, measured = ideal[kind], profile.kernels[kind]
        if ideal_s > 0 and measured > 0:
            numbers[f"{kind}-efficiency"] = min(1.0, ideal_s / measured)
    numbers["issue-us"] = profile.host / profile.ops * 1e6
    return numbers


def predict_program(sharded_ir: str, machine: Machine, optimizer: str = "adamw") -> dict:
    """fsdp-step-time's report (JSON, the training step's) on a step that is
    already sharded and scheduled: the program a job runs."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "time.json"
        run_fsdp_opt(sharded_ir, [machine.step_time(optimizer, report), "--emit-bytecode", "-o", "/dev/null"])
        return train_step_report(json.loads(report.read_text()), "the sharded step")


def gpu_kind_of(device_name: str) -> str | None:
    """The planner's kind for a CUDA device name, where the table has it."""
    for marks, kind in ((("H100", "80GB"), "h100-sxm"), (("H100", "96GB"), "h100-96gb"), (("H200",), "h200"),
                        (("A100", "80GB"), "a100-80gb")):
        if all(mark in device_name for mark in marks):
            return kind
    return None

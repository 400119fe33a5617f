"""Compile a training step once per job and load it into the runtime.

`compile_program` runs collectively on every rank of a `torch.distributed`
job: the ranks compare their set-up keys (model structure and code, batch
shapes, options), then rank 0 captures the step, finds the program compiled
from that captured IR in the program cache or runs fsdp-opt's sharding
pipeline for the job's world size and lowers it with fsdp-translate, and
hands the program to every rank, which
loads it into the prebuilt runtime (libfsdp_rt): no C++ is compiled per
model. `fsdpc.ShardedModule` (fsdpc/sharded.py) is what users hold; it
compiles one program per batch signature through this module.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from fsdpc import cache
from fsdpc.autocast import ambient_autocast
from fsdpc.capture import CaptureError, MixedPrecision
from fsdpc.compiler import FsdpOptError, run_fsdp_opt
from fsdpc.call_trace import CallTrace
from fsdpc.export import call_trace, traced_forward
from fsdpc.program import Program, translate
from fsdpc.units import WrapPolicy

STEP, NO_SYNC_STEP = "train_step", "train_step_no_sync"
T = TypeVar("T")


class StepError(RuntimeError):
    """A compiled step could not be built or run."""


def pipeline_options(pipeline: str, world: int) -> str:
    """The pipeline string for this job: the user's knobs plus `ranks=`
    (the world over the replica count), refusing the options whose output
    the driver owns."""
    for option in pipeline.split():
        name, _, value = option.partition("=")
        if name in ("memory-report", "report-format"):
            raise StepError(f"pipeline option '{option}': the driver keeps the memory report itself "
                            "(memory_report); leave it out")
        if name in ("comm-report", "trace") and value in ("", "-"):
            raise StepError(f"pipeline option '{option}': give a file; stdout carries the IR")
    if "ranks=" in pipeline:
        return pipeline.strip()
    match = re.search(r"replicas=(\d+)", pipeline)
    replicas = int(match.group(1)) if match else 1
    if world % replicas:
        raise StepError(f"replicas={replicas} does not divide the world size {world}")
    return f"ranks={world // replicas} {pipeline}".strip()


@dataclass
class CompiledProgram:
    """One compiled step, loaded into the runtime on this rank."""

    program: Program
    runtime: object
    sharded_ir: str
    memory_report: dict
    compile_seconds: dict[str, float] = field(default_factory=dict)
    # The plain module attributes the step read, as (module path, name): the
    # step holds their values, so a change calls for another program.
    attribute_reads: list[tuple[str, str]] = field(default_factory=list)
    # What loss_fn returns beside the loss (capture.aux_structure): the
    # step function returns those values after the loss.
    aux: dict | None = None
    # The buffers the step updates (running statistics), by FQN: the step
    # function returns their new values after aux's, for the caller to store.
    buffer_updates: list[str] = field(default_factory=list)


def compile_program(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *, options: str,
                    wrap: WrapPolicy, mixed_precision: MixedPrecision | None,
                    device: torch.device = torch.device("cpu"), scaled_loss: bool = False,
                    compare_calls: bool = True) -> CompiledProgram:
    """Collective: every rank calls it with the same step. `model` is what
    capture sees (shapes only: it may live on the meta device); the step is
    captured for `device`'s kind and loaded for `device`; with
    `scaled_loss`, it takes a loss scale after the batch (a GradScaler's).
    With `compare_calls`, every rank records the step's torch calls and
    compares them with rank 0's (`_check_same_calls`); else rank 0 alone
    records them, for its cache."""
    rank, world = dist.get_rank(), dist.get_world_size()
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[phase] = now - clock
        clock = now

    keys = on_every_rank("setting up the step", lambda: cache.setup_key(
        model, batch, loss_fn, world=world, options={"pipeline": options, "wrap": wrap, "device": device.type,
                                                     "mixed_precision": mixed_precision,
                                                     "autocast": ambient_autocast(device.type),
                                                     "scaled_loss": scaled_loss}),
        share_result=True)
    _check_same_step(keys, rank)
    lap("set-up check")
    calls = None
    if compare_calls or rank == 0:
        calls = call_trace(model, batch, loss_fn, wrap=wrap, mixed_precision=mixed_precision, device=device.type)
    if compare_calls:
        _check_same_calls(calls, rank)
    lap("call trace")
    entry = _compile_on_rank_0(rank, lambda: compile_recorded(model, batch, loss_fn, calls, options=options,
                                                              wrap=wrap, mixed_precision=mixed_precision, lap=lap,
                                                              device=device.type, scaled_loss=scaled_loss))

    def load() -> CompiledProgram:
        program = Program.parse(entry["program"], str(device))
        return CompiledProgram(program, program.loaded, entry["sharded_ir"], entry["memory_report"], seconds,
                               [tuple(read) for read in entry["attribute_reads"]], entry["aux"],
                               entry["buffer_updates"])

    compiled = on_every_rank("loading the program", load)
    lap("load")
    return compiled


def on_every_rank(stage: str, attempt: Callable[[], T], *, share_result: bool = False):
    """Collective: runs `attempt` on every rank, then every rank learns every
    outcome before anything else is communicated, so that a rank that fails
    makes all raise at once (with its error) instead of leaving the others
    in the next collective until it times out. Returns this rank's result,
    or every rank's with `share_result` (it must pickle)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failure = None
    try:
        result = attempt()
    except Exception as error:  # every rank must hear of it
        failure, result = error, None
    outcome = (f"{type(failure).__name__}: {failure}" if failure else None, result if share_result else None)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, outcome)
    failed = [(other, error) for other, (error, _) in enumerate(everyone) if error is not None]
    if failed:
        reasons = "; ".join(f"rank {other}: {error}" for other, error in failed)
        raise StepError(f"rank {rank}: {stage} failed on {len(failed)} of {world} ranks: {reasons}") from failure
    return [value for _, value in everyone] if share_result else result


def compile_entry(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *, options: str,
                  wrap: WrapPolicy = None, mixed_precision: MixedPrecision | None = None,
                  lap: Callable[[str], None] = lambda phase: None, device: str = "cpu",
                  scaled_loss: bool = False) -> dict:
    """Capture for the `device` kind, then shard and lower, in this process
    (no job needed): the cache entry of a step, its program for `ranks=` in
    `options`. The program cache serves what follows the step's recorded
    torch calls (`call_trace`), else what follows export's trace, else
    sharding and lowering (keyed by the captured IR)."""
    calls = call_trace(model, batch, loss_fn, wrap=wrap, mixed_precision=mixed_precision, device=device)
    lap("call trace")
    return compile_recorded(model, batch, loss_fn, calls, options=options, wrap=wrap,
                            mixed_precision=mixed_precision, lap=lap, device=device, scaled_loss=scaled_loss)


def compile_recorded(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, calls: CallTrace | None, *,
                     options: str, wrap: WrapPolicy, mixed_precision: MixedPrecision | None,
                     lap: Callable[[str], None], device: str, scaled_loss: bool) -> dict:
    """`compile_entry` of a step whose calls are recorded (`calls`)."""
    # The forward's record does not say how backward starts: the key does.
    calls_key = calls and cache.forward_key(f"{calls.fingerprint} scaled-loss={scaled_loss}", pipeline=options)
    entry = cache.load(calls_key) if calls_key else None
    if entry is not None:
        calls.echo()
        lap("cache hit")
        return entry
    with traced_forward(model, batch, loss_fn, wrap=wrap, mixed_precision=mixed_precision,
                        device=device, scaled_loss=scaled_loss) as stage:
        lap("export")
        forward_key = cache.forward_key(stage.fingerprint(), pipeline=options)
        entry = cache.load(forward_key)
        exported = stage.export() if entry is None else None
    if exported is None:
        lap("cache hit")
    else:
        lap("joint trace")
        entry = {**_shard_and_lower_cached(exported.mlir, options, lap), "attribute_reads": stage.attribute_reads,
                 "aux": stage.aux, "buffer_updates": [name for name, _ in exported.step.buffer_updates]}
        cache.store(forward_key, entry)
    if calls_key:
        cache.store(calls_key, entry)
    return entry


def _shard_and_lower_cached(captured_ir: str, options: str, lap: Callable[[str], None]) -> dict:
    key = cache.program_key(captured_ir, pipeline=options)
    entry = cache.load(key)
    if entry is not None:
        lap("cache hit")
        return entry
    entry = _shard_and_lower(captured_ir, options, lap)
    cache.store(key, entry)
    return entry


def _shard_and_lower(captured_ir: str, options: str, lap: Callable[[str], None]) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "memory.json"
        # Locations travel on, so that runtime errors name the user's line.
        sharded_ir = run_fsdp_opt(captured_ir, [
            f"--fsdp-sharding-pipeline={options} memory-report={report} report-format=json",
            "--mlir-print-debuginfo"])
        memory_report = {entry["function"]: entry for entry in json.loads(report.read_text())}
    lap("fsdp-opt")
    program = translate(sharded_ir)
    lap("fsdp-translate")
    return {"sharded_ir": sharded_ir, "memory_report": memory_report, "program": program.text}


def _check_same_step(everyone: list[str], rank: int) -> None:
    """Every rank must compile the same step: the set-up keys (model
    structure and code, batch shapes, options) agree, or nothing runs."""
    differing = [other for other, theirs in enumerate(everyone) if theirs != everyone[0]]
    if differing:
        raise StepError(
            f"rank {rank}: ranks {differing} set up a different step from rank 0 (model, batch "
            "shapes, options, grad_scaler or the torch.autocast it runs under differ) and would compile a different "
            "collective schedule; every rank must capture the same model, batch shapes and options, under "
            "the same autocast")


def _check_same_calls(calls: CallTrace | None, rank: int) -> None:
    """Collective: every rank's step makes the torch calls rank 0's does,
    with the same arguments, since rank 0's capture serves them all. A value
    the step reads that differs by rank (dist.get_rank(), an environment
    variable, a global set per rank) would otherwise run with rank 0's value
    everywhere, silently. Ranks whose record is incomplete (None) are not
    compared."""
    world = dist.get_world_size()
    digests: list = [None] * world
    computed = calls.computed() if calls is not None else None
    dist.all_gather_object(digests, computed and hashlib.sha256(repr(computed).encode()).hexdigest())
    differing = [other for other, digest in enumerate(digests)
                 if digests[0] is not None and digest is not None and digest != digests[0]]
    if not differing:
        return
    first = differing[0]
    records: list = [None] * world
    dist.all_gather_object(records, (computed, [calls.where(i) for i in range(len(computed))])
                           if rank in (0, first) else None)
    (ours, where), (theirs, _) = records[0], records[first]
    index = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    said = (f"call {index + 1}, at {where[index]}, is {ours[index]} on rank 0 and {theirs[index]} on rank {first}"
            if index < min(len(ours), len(theirs)) else
            f"rank 0 makes {len(ours)} torch calls, rank {first} {len(theirs)}")
    raise StepError(f"rank {rank}: ranks {differing} compute a different step from rank 0's: {said}. A value the "
                    "step reads differs by rank (dist.get_rank(), an environment variable, a global or attribute "
                    "set per rank); fsdpc compiles one step for every rank: hand rank-dependent values to the step "
                    "as tensors in the batch")


def _compile_on_rank_0(rank: int, build: Callable[[], dict]) -> dict:
    """Rank 0 captures the step and compiles it (or takes it from its cache),
    and hands the program to every rank (the program does not depend on the
    rank): one capture per job. A failure there reaches every rank as an
    error."""
    message: list = [None]
    failure = None
    if rank == 0:
        try:
            message[0] = ("ok", build())
        except Exception as error:  # every rank must hear of it, not hang
            failure = error
            message[0] = ("error", f"{type(error).__name__}: {error}{_raised_at(error)}")
    dist.broadcast_object_list(message, src=0)
    status, payload = message[0]
    if status == "error":
        if rank == 0:
            raise StepError(f"rank 0 could not compile the step: {payload}") from failure
        raise StepError(f"rank {rank}: rank 0 could not compile the step: {payload}")
    return payload


def _raised_at(error: Exception) -> str:
    """Where an unexpected error was raised (` (raised at file:line in
    function)`), for the ranks that get its message only; fsdpc's own
    errors name the user's line already."""
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, (CaptureError, StepError, FsdpOptError)) or not frames:
        return ""
    return f" (raised at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})"

"""Train with a compiled, sharded step: the Python driver.

On every rank of a `torch.distributed` job (launched by torchrun):

    step = fsdpc.runtime.compile_step(model, local_batch, loss_fn, pipeline="strategy=full-shard")
    optimizer = torch.optim.AdamW(step.parameters(), lr=1e-3)
    for batch in data:
        loss = step(*batch)          # forward + backward, gradients on the shards
        optimizer.step(); optimizer.zero_grad()

`compile_step` checks that every rank sets up the same step, then rank 0
captures it (or finds it in the program cache), runs fsdp-opt's sharding
pipeline for the job's world size, lowers it with fsdp-translate to a
program and hands the program to every rank, which loads it into the
prebuilt runtime (libfsdp_rt): no C++ is compiled per model. Every rank
creates the process groups the program lists and keeps its parameter shards
as plain tensors that any torch.optim optimizer can update.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from fsdpc import cache
from fsdpc.capture import MixedPrecision
from fsdpc.compiler import run_fsdp_opt
from fsdpc.export import export_training_step
from fsdpc.program import Program, ParamSpec, translate
from fsdpc.units import WrapPolicy

STEP, NO_SYNC_STEP = "train_step", "train_step_no_sync"


class StepError(RuntimeError):
    """A compiled step could not be built or run."""


class CompiledStep:
    """One rank's view of a compiled training step and its parameter shards."""

    def __init__(self, model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *,
                 pipeline: str = "", wrap: WrapPolicy = None,
                 mixed_precision: MixedPrecision | None = None, timeout: timedelta = timedelta(minutes=5),
                 check_reshard_frees: bool = False):
        if not dist.is_initialized():
            raise StepError("fsdpc.runtime needs torch.distributed initialized (run under torchrun)")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.timeout = timeout
        self.check_reshard_frees = check_reshard_frees
        self.compile_seconds: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(phase: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            self.compile_seconds[phase] = now - clock
            clock = now

        for option in pipeline.split():
            name, _, value = option.partition("=")
            if name in ("memory-report", "report-format"):
                raise StepError(f"pipeline option '{option}': the driver keeps the memory report itself "
                                "(step.memory_report); leave it out")
            if name in ("comm-report", "trace") and value in ("", "-"):
                raise StepError(f"pipeline option '{option}': give a file; stdout carries the IR")
        options = pipeline if "ranks=" in pipeline else f"ranks={self._shard_ranks(pipeline)} {pipeline}"
        key = cache.step_key(model, batch, loss_fn, world=self.world, options={
            "pipeline": options, "wrap": wrap, "mixed_precision": mixed_precision})
        self._check_same_step(key)
        lap("cache lookup")
        entry = self._compile_on_rank_0(key, lambda: self._compile(
            model, batch, loss_fn, options, wrap, mixed_precision, lap))
        self.sharded_ir = entry["sharded_ir"]
        self.memory_report = entry["memory_report"]
        self.program = Program.parse(entry["program"])
        self.runtime = self.program.load("cpu")
        lap("load")
        self.groups = self._make_groups()
        self.layout = {spec.name: spec for spec in self.program.params}
        self.shards = self._make_shards(model)
        self.buffers = {name: buffer for name, buffer in model.named_buffers()}
        self.accumulated: dict[str, torch.Tensor] = {}
        self.last_trace: list[tuple] = []
        lap("groups and shards")

    @staticmethod
    def _compile(model, batch, loss_fn, options, wrap, mixed_precision, lap) -> dict:
        """Capture, shard and lower: the cache entry of this step."""
        exported = export_training_step(model, batch, loss_fn, wrap=wrap, mixed_precision=mixed_precision)
        lap("capture")
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "memory.json"
            # Locations travel on, so that runtime errors name the user's line.
            sharded_ir = run_fsdp_opt(exported.mlir, [
                f"--fsdp-sharding-pipeline={options.strip()} memory-report={report} report-format=json",
                "--mlir-print-debuginfo"])
            memory_report = {entry["function"]: entry for entry in json.loads(report.read_text())}
        lap("fsdp-opt")
        program = translate(sharded_ir)
        lap("fsdp-translate")
        return {"sharded_ir": sharded_ir, "memory_report": memory_report, "program": program.text}

    def _shard_ranks(self, pipeline: str) -> int:
        match = re.search(r"replicas=(\d+)", pipeline)
        replicas = int(match.group(1)) if match else 1
        if self.world % replicas:
            raise StepError(f"replicas={replicas} does not divide the world size {self.world}")
        return self.world // replicas

    def _check_same_step(self, key: str) -> None:
        """Every rank must compile the same step: the cache keys (model
        structure and code, batch shapes, options) agree, or nothing runs."""
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, key)
        differing = [rank for rank, theirs in enumerate(everyone) if theirs != everyone[0]]
        if differing:
            raise StepError(
                f"rank {self.rank}: ranks {differing} set up a different step from rank 0 (model, batch "
                "shapes or options differ) and would compile a different collective schedule; every "
                "rank must capture the same model, batch shapes and options")

    def _compile_on_rank_0(self, key: str, compile_entry: Callable[[], dict]) -> dict:
        """Rank 0 loads the program from its cache or compiles it, and hands
        it to every rank (the program does not depend on the rank): one
        capture per job. A failure there reaches every rank as an error."""
        message: list = [None]
        if self.rank == 0:
            try:
                entry = cache.load(key)
                if entry is None:
                    entry = compile_entry()
                    cache.store(key, entry)
                message[0] = ("ok", entry)
            except Exception as error:  # every rank must hear of it, not hang
                message[0] = ("error", f"{type(error).__name__}: {error}")
        dist.broadcast_object_list(message, src=0)
        status, payload = message[0]
        if status == "error":
            if self.rank == 0:
                raise StepError(f"rank 0 could not compile the step: {payload}")
            raise StepError(f"rank {self.rank}: rank 0 could not compile the step: {payload}")
        return payload

    def _make_groups(self) -> dict:
        groups = {}
        for key, spec in self.program.groups.items():
            if len(spec.members) * spec.size != self.world:
                raise StepError(f"group '{key}' spans {len(spec.members) * spec.size} ranks, "
                                f"the job has {self.world}")
            for members in spec.members:  # every rank creates every group, in one order
                group = dist.new_group(list(members), timeout=self.timeout)
                if self.rank in members:
                    groups[key] = group
        return groups

    def _shard_of(self, spec: ParamSpec) -> tuple[int, int, int]:
        """(rank's index in its group, first logical row, real rows) of a sharded parameter."""
        index = self.program.groups[spec.group].members_of(self.rank).index(self.rank)
        begin = min(index * spec.shard_rows, spec.shape[0])
        return index, begin, min(begin + spec.shard_rows, spec.shape[0]) - begin

    def _make_shards(self, model: nn.Module) -> dict[str, torch.Tensor]:
        params = dict(model.named_parameters())
        if set(params) != set(self.layout):
            raise StepError(f"the compiled step's parameters {sorted(self.layout)} are not the model's "
                            f"{sorted(params)}")
        shards = {}
        for name, spec in self.layout.items():
            full = params[name].detach()
            if spec.group is None:
                shard = full.clone()
            else:
                _, begin, real = self._shard_of(spec)
                shard = full.new_zeros((spec.shard_rows, *full.shape[1:]))
                shard[:real] = full[begin:begin + real]
            shards[name] = shard.requires_grad_(spec.trainable)
        return shards

    def parameters(self) -> list[torch.Tensor]:
        """The trainable shards, for an optimizer."""
        return [shard for shard in self.shards.values() if shard.requires_grad]

    def __call__(self, *batch: torch.Tensor, sync: bool = True, trace: bool = False) -> torch.Tensor:
        """Forward and backward on this rank's batch. With `sync=False` (a
        gradient-accumulation microbatch) nothing is communicated for the
        gradients; the next synchronized call reduces everything. `trace`
        records every instruction as it ran (see `write_trace`)."""
        name = STEP if sync else NO_SYNC_STEP
        if name not in self.program.functions:
            raise StepError(f"the step was compiled without '{name}' (pipeline option gradient-accumulation=true)")
        params = {fqn: shard.detach() for fqn, shard in self.shards.items()}
        accumulated = {}
        if sync and NO_SYNC_STEP in self.program.functions:
            accumulated = {fqn: self.accumulated.get(fqn, torch.zeros(spec.shape)) for fqn, spec in
                           self.layout.items() if spec.trainable}
        out = self.runtime.run(name, params, self.buffers, accumulated, list(batch), self.groups,
                               self.timeout.total_seconds(), trace=trace,
                               check_reshard_frees=self.check_reshard_frees)
        del params, accumulated
        if out["reshard_leaks"]:
            raise StepError(f"rank {self.rank}: gathered parameters outlived their reshard: "
                            f"{', '.join(out['reshard_leaks'])}")
        if trace:
            self.last_trace = out["trace"]
        if not sync:
            for fqn, grad in out["grads"].items():
                self.accumulated[fqn] = self.accumulated[fqn] + grad if fqn in self.accumulated else grad
            return out["loss"]
        self.accumulated.clear()
        for fqn, grad in out["grads"].items():
            shard = self.shards[fqn]
            shard.grad = grad if shard.grad is None else shard.grad + grad
        return out["loss"]

    def write_trace(self, path: str | Path | None) -> dict:
        """Gathers the last traced call from every rank; rank 0 writes one
        Chrome/Perfetto trace (a process per rank) to `path`. Returns this
        rank's summary: step time, time blocked in waits (exposed
        communication) and its share of the step."""
        events = self.last_trace
        if not events:
            raise StepError("no traced call: call the step with trace=True first")
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, events)
        if self.rank == 0 and path is not None:
            origin = min(e[3] for rank_events in everyone for e in rank_events)
            trace = [{"name": name, "cat": category, "ph": "X", "pid": rank, "tid": 1 if category == "collective" else 0,
                      "ts": start - origin, "dur": duration, "args": {"where": detail} if detail else {}}
                     for rank, rank_events in enumerate(everyone)
                     for name, category, detail, start, duration in rank_events]
            trace += [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
                      for rank in range(self.world)]
            Path(path).write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}))
        begin = min(e[3] for e in events)
        end = max(e[3] + e[4] for e in events)
        waited = sum(e[4] for e in events if e[1] == "wait")
        return {"step_us": end - begin, "wait_us": waited, "exposed_comm_share": waited / max(end - begin, 1)}

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, gathered and unpadded (for checks and checkpoints)."""
        full = {}
        for name, spec in self.layout.items():
            shard = self.shards[name].detach()
            if spec.group is None:
                full[name] = shard.clone()
                continue
            members = self.program.groups[spec.group].members_of(self.rank)
            group = self.groups[spec.group] if len(members) < self.world else None
            pieces = [torch.empty_like(shard) for _ in members]
            dist.all_gather(pieces, shard.contiguous(), group=group)
            full[name] = torch.cat(pieces)[:spec.shape[0]]
        return full


def compile_step(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, **options) -> CompiledStep:
    return CompiledStep(model, batch, loss_fn, **options)

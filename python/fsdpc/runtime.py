"""Train with a compiled, sharded step: the Python driver.

On every rank of a `torch.distributed` job (launched by torchrun):

    step = fsdpc.runtime.compile_step(model, local_batch, loss_fn, pipeline="strategy=full-shard")
    optimizer = torch.optim.AdamW(step.parameters(), lr=1e-3)
    for batch in data:
        loss = step(*batch)          # forward + backward, gradients on the shards
        optimizer.step(); optimizer.zero_grad()

`compile_step` captures the step, runs fsdp-opt's sharding pipeline for the
job's world size, lowers it with fsdp-translate, builds the C++ against
LibTorch (cached by content hash), checks that every rank compiled the same
collective schedule, and keeps this rank's parameter shards as plain tensors
that any torch.optim optimizer can update.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from fsdpc.capture import MixedPrecision
from fsdpc.compiler import find_fsdp_opt, run_fsdp_opt
from fsdpc.export import export_training_step
from fsdpc.units import WrapPolicy

_REPO = Path(__file__).resolve().parents[2]
_RUNTIME = _REPO / "runtime"
_PARAM_RE = re.compile(
    r'fsdp\.param @("(?:[^"\\]|\\.)*"|[\w.$-]+) : tensor<([0-9x]*)(\w+)> unit @\S+'
    r'(?: frozen)?(?: tied \[[^\]]*\])?(?: sharded on @(\w+) axes = \[([0-9, ]*)\] padding = \d+)?')
_GRID_RE = re.compile(r"shard\.grid @(\w+)\(shape = ([0-9x]+)\)")


class StepError(RuntimeError):
    """A compiled step could not be built or run."""


def find_fsdp_translate() -> Path:
    return find_fsdp_opt().with_name("fsdp-translate")


def _symbol(text: str) -> str:
    return text[1:-1].encode().decode("unicode_escape") if text.startswith('"') else text


@dataclass
class _Shard:
    fqn: str
    logical: tuple[int, ...]
    group_key: str | None  # None: replicated
    rows: int               # rows of the padded shard (logical rows when replicated)
    row_begin: int
    real_rows: int


def _grid_coordinates(rank: int, shape: Sequence[int]) -> list[int]:
    coords = []
    for size in reversed(shape):
        coords.append(rank % size)
        rank //= size
    return list(reversed(coords))


def _group_members(rank: int, shape: Sequence[int], axes: Sequence[int]) -> list[int]:
    """Ranks that differ from `rank` only on `axes`, in group order (row-major on axes)."""
    coords = _grid_coordinates(rank, shape)
    members = []
    for world_rank in range(math.prod(shape)):
        other = _grid_coordinates(world_rank, shape)
        if all(other[i] == coords[i] for i in range(len(shape)) if i not in axes):
            members.append(world_rank)
    return members


def _build(source: str, verbose: bool = False):
    from torch.utils.cpp_extension import load

    runtime_sources = [_RUNTIME / "src" / "Step.cpp", _RUNTIME / "src" / "Bindings.cpp"]
    digest = hashlib.sha256()
    digest.update(source.encode())
    for path in sorted((_RUNTIME / "include").rglob("*.h")) + runtime_sources:
        digest.update(path.read_bytes())
    digest.update(torch.__version__.encode())
    name = "fsdpc_step_" + digest.hexdigest()[:16]
    cache = Path(os.environ.get("FSDPC_CACHE", Path.home() / ".cache" / "fsdpc")) / name
    cache.mkdir(parents=True, exist_ok=True)
    generated = cache / "step.cpp"
    if not generated.exists() or generated.read_text() != source:
        generated.write_text(source)
    return load(name=name, sources=[str(generated)] + [str(p) for p in runtime_sources],
                extra_include_paths=[str(_RUNTIME / "include")], build_directory=str(cache),
                extra_cflags=["-O2"], verbose=verbose)


class CompiledStep:
    """One rank's view of a compiled training step and its parameter shards."""

    def __init__(self, model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *,
                 pipeline: str = "", wrap: WrapPolicy = None,
                 mixed_precision: MixedPrecision | None = None, timeout: timedelta = timedelta(minutes=5)):
        if not dist.is_initialized():
            raise StepError("fsdpc.runtime needs torch.distributed initialized (run under torchrun)")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.timeout = timeout
        self.model = model
        options = pipeline if "ranks=" in pipeline else f"ranks={self._shard_ranks(pipeline)} {pipeline}"
        exported = export_training_step(model, batch, loss_fn, wrap=wrap, mixed_precision=mixed_precision)
        self.sharded_ir = run_fsdp_opt(exported.mlir, [f"--fsdp-sharding-pipeline={options.strip()}"])
        translated = subprocess.run([str(find_fsdp_translate()), "--fsdp-to-cpp", "-"],
                                    input=self.sharded_ir, capture_output=True, text=True, check=False)
        if translated.returncode != 0:
            raise StepError(f"fsdp-translate failed:\n{translated.stderr}")
        # Rank 0 builds first so that the others load from the cache.
        if self.rank == 0:
            self.module = _build(translated.stdout)
        dist.barrier()
        if self.rank != 0:
            self.module = _build(translated.stdout)
        self._check_same_schedule()
        self.groups = self._make_groups()
        self.layout = self._parameter_layout()
        self.shards = self._make_shards()
        self.buffers = {name: buffer for name, buffer in model.named_buffers()}
        self.accumulated: dict[str, torch.Tensor] = {}

    def _shard_ranks(self, pipeline: str) -> int:
        match = re.search(r"replicas=(\d+)", pipeline)
        replicas = int(match.group(1)) if match else 1
        if self.world % replicas:
            raise StepError(f"replicas={replicas} does not divide the world size {self.world}")
        return self.world // replicas

    def _check_same_schedule(self) -> None:
        mine = dict(self.module.steps())
        everyone: list = [None] * self.world
        dist.all_gather_object(everyone, mine)
        for rank, theirs in enumerate(everyone):
            if theirs != mine:
                raise StepError(
                    f"rank {self.rank}: rank {rank} compiled a different collective schedule "
                    f"({theirs} vs {mine}); every rank must capture the same model, batch shapes "
                    "and options, or the collectives would hang")

    def _make_groups(self) -> dict:
        groups = {}
        for key, shape, axes in self.module.groups():
            if math.prod(shape) != self.world:
                raise StepError(f"grid {shape} of group '{key}' does not match world size {self.world}")
            seen = set()
            for world_rank in range(self.world):  # every rank creates every group, in one order
                members = tuple(_group_members(world_rank, shape, axes))
                if members in seen:
                    continue
                seen.add(members)
                group = dist.new_group(list(members), timeout=self.timeout)
                if self.rank in members:
                    groups[key] = group
        return groups

    def _parameter_layout(self) -> dict[str, tuple[str, list[int]] | None]:
        """Per parameter FQN: its group key and this rank's group members, or
        None when it is replicated; read once from the sharded IR."""
        grids = {name: [int(d) for d in shape.split("x")] for name, shape in _GRID_RE.findall(self.sharded_ir)}
        layout = {}
        for name, _, _, grid, axes in _PARAM_RE.findall(self.sharded_ir):
            if not grid:
                layout[_symbol(name)] = None
                continue
            axis_list = [int(a) for a in axes.split(",")]
            key = f"{grid}:{','.join(str(a) for a in axis_list)}"
            layout[_symbol(name)] = (key, _group_members(self.rank, grids[grid], axis_list))
        return layout

    def _make_shards(self) -> dict[str, torch.Tensor]:
        params = dict(self.model.named_parameters())
        shards = {}
        for fqn, placement in self.layout.items():
            full = params[fqn].detach()
            if placement is None:
                shard = full.clone()
            else:
                members = placement[1]
                ranks, index = len(members), members.index(self.rank)
                rows = math.ceil(full.shape[0] / ranks)
                begin = min(index * rows, full.shape[0])
                end = min(begin + rows, full.shape[0])
                shard = full.new_zeros((rows, *full.shape[1:]))
                shard[: end - begin] = full[begin:end]
            shards[fqn] = shard.requires_grad_(params[fqn].requires_grad)
        return shards

    def parameters(self) -> list[torch.Tensor]:
        """The trainable shards, for an optimizer."""
        return [shard for shard in self.shards.values() if shard.requires_grad]

    def __call__(self, *batch: torch.Tensor, sync: bool = True) -> torch.Tensor:
        """Forward and backward on this rank's batch. With `sync=False` (a
        gradient-accumulation microbatch) nothing is communicated for the
        gradients; the next synchronized call reduces everything."""
        step = "train_step" if sync else "train_step_no_sync"
        params = {fqn: shard.detach() for fqn, shard in self.shards.items()}
        accumulated = {fqn: self.accumulated.get(fqn, torch.zeros_like(self.model.get_parameter(fqn)))
                       for fqn in self.shards} if sync and self._has_no_sync() else {}
        loss, grads = self.module.run(step, params, self.buffers, accumulated, list(batch), self.groups,
                                      self.timeout.total_seconds(), "cpu")
        if not sync:
            for fqn, grad in grads.items():
                self.accumulated[fqn] = self.accumulated[fqn] + grad if fqn in self.accumulated else grad
            return loss
        self.accumulated.clear()
        for fqn, grad in grads.items():
            shard = self.shards[fqn]
            shard.grad = grad if shard.grad is None else shard.grad + grad
        return loss

    def _has_no_sync(self) -> bool:
        return any(name == "train_step_no_sync" for name, _ in self.module.steps())

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, gathered and unpadded (for checks and checkpoints)."""
        full = {}
        for fqn, placement in self.layout.items():
            shard = self.shards[fqn].detach()
            if placement is None:
                full[fqn] = shard.clone()
                continue
            key, members = placement
            group = self.groups[key] if len(members) < self.world else None
            pieces = [torch.empty_like(shard) for _ in members]
            dist.all_gather(pieces, shard.contiguous(), group=group)
            rows = self.model.get_parameter(fqn).shape[0]
            full[fqn] = torch.cat(pieces)[:rows]
        return full


def compile_step(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, **options) -> CompiledStep:
    return CompiledStep(model, batch, loss_fn, **options)

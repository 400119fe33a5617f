"""Sharded checkpoints through torch.distributed.checkpoint (DCP).

    fsdpc.checkpoint.save("ckpt/step-200", sharded, optimizer, extra={"step": 200})
    extra = fsdpc.checkpoint.load("ckpt/step-200", sharded, optimizer)

A checkpoint is a DCP directory holding {"model": ..., "optim": ...} (and
`extra`, plain training state, in fsdpc_extra.pt), the model and optimizer state under the model's FQNs as
`torch.distributed.checkpoint.state_dict.get_state_dict` gives them: the
layout FSDP2 jobs save, so either loads the other's, and DCP reshards on
load (saved on N ranks, loaded on M). Padding never reaches it: the DTensors
have the parameters' true shapes.

Saves are atomic: every rank writes into a hidden `.<name>.partial-<id>`
directory beside the target, and rank 0 renames it into place only after
DCP has written its metadata (moving a previous checkpoint of the same name
aside first, and deleting it last). A process killed during a save leaves
the previous checkpoint (if the kill hit between the two renames, `load`
finds it under its `.<name>.previous-<id>` name) and a partial directory
that `load` refuses and the next save removes.

`save(..., asynchronous=True)` returns once the state is copied to host
memory; DCP writes it on a thread of its own (planning over a Gloo group of
fsdpc's, apart from the training's collectives) while training goes on, and
rank 0 renames it into place when every rank's part and the metadata are
written. The returned `PendingSave.wait()` returns once the checkpoint is
in place on every rank (it communicates nothing, so `done()` may be
polled); the next save or load waits for it first. Wait before destroying
the process group: a save cut off there is a partial directory, and the
previous checkpoint stays.

Loading never runs code from a checkpoint: `extra` is read with
`torch.load(weights_only=True)`, so it may hold tensors, numbers, strings,
bytes, None and dicts, lists and tuples of those (what a training loop
keeps: the step, RNG states, a scheduler's state_dict); `save` refuses
anything else up front instead of writing a checkpoint that `load` would
refuse.
"""

from __future__ import annotations

import gc
import glob
import io
import os
import pickle
import shutil
import threading
import uuid
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)
from torch.distributed.tensor import DTensor

from fsdpc.device import collective_backend

EXTRA_FILE = "fsdpc_extra.pt"


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded."""


def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _check_extra(extra: dict) -> bytes:
    """`extra` serialized now (an asynchronous save writes it later, while
    the loop may change it), once a weights-only load reads it back; else a
    CheckpointError naming what such a load refuses."""
    written = io.BytesIO()
    torch.save(extra, written)
    written.seek(0)
    try:
        torch.load(written, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"extra holds something other than tensors, numbers, strings and containers of "
                              f"them, which fsdpc does not load from checkpoints (they could run code): "
                              f"{_first_line(error)}") from None
    return written.getvalue()


def _first_line(error: Exception) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)


class PendingSave:
    """An asynchronous save under way (see the module's docstring)."""

    def __init__(self, written: Future, target: Path, partial: Path, extra: bytes, group: dist.ProcessGroup):
        self._target = target
        self._settled = threading.Event()  # in place on every rank, or failed
        self._failure: BaseException | None = None
        self._failed_elsewhere = False

        def finished(future: Future) -> None:
            # On DCP's thread, once every rank's part and the metadata are
            # written: rank 0 renames, then every rank learns whether all
            # went well (after DCP's own collectives on the group, in the
            # same order on every rank), so each settles with it in place.
            try:
                try:
                    future.result()
                    if dist.get_rank() == 0:
                        _put_in_place(partial, target, extra)
                except BaseException as error:
                    self._failure = error
                failed = torch.tensor([self._failure is not None], dtype=torch.int32)
                dist.all_reduce(failed, group=group)
                self._failed_elsewhere = bool(int(failed)) and self._failure is None
            except BaseException as error:
                self._failure = self._failure or error
            finally:
                self._settled.set()

        written.add_done_callback(finished)

    def done(self) -> bool:
        """Whether the save has settled: in place on every rank, or failed."""
        return self._settled.is_set()

    def wait(self) -> Path:
        """Returns the checkpoint's path once it is in place on every rank;
        raises CheckpointError if the save failed on any."""
        global _pending
        self._settled.wait()
        if _pending is self:
            _pending = None
        if self._failure is not None:
            raise CheckpointError(f"the asynchronous save to {self._target} failed: "
                                  f"{_first_line(self._failure)}") from self._failure
        if self._failed_elsewhere:
            raise CheckpointError(f"the asynchronous save to {self._target} failed on another rank; the previous "
                                  "checkpoint there is kept")
        return self._target


_pending: PendingSave | None = None
_save_group: dist.ProcessGroup | None = None


def _writing_group() -> dist.ProcessGroup:
    """Collective on first use: a Gloo group for DCP's planning on its own
    thread, so that it never interleaves with the training thread's
    collectives on the default group."""
    global _save_group
    if _save_group is None:
        _save_group = dist.new_group(backend="gloo")
    return _save_group


def wait_for_pending_save() -> None:
    """The asynchronous save under way, if any, settled."""
    if _pending is not None:
        _pending.wait()


def save(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
         extra: dict | None = None, asynchronous: bool = False) -> Path | PendingSave:
    """Collective: saves `model` (and `optimizer`, and the picklable
    `extra`) to the directory `path`, replacing a checkpoint there only
    once the new one is complete. `asynchronous`: returns a PendingSave
    once the state is copied to host memory, and writes it meanwhile."""
    global _pending
    wait_for_pending_save()
    target = Path(path).absolute()
    extra = _check_extra(dict(extra or {}))
    if ".partial-" in target.name or ".previous-" in target.name:
        raise CheckpointError(f"{target}: names with '.partial-' or '.previous-' are fsdpc's own temporaries")
    name: list = [None]
    if dist.get_rank() == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f".{glob.escape(target.name)}.partial-*"):  # left by a killed save
            shutil.rmtree(stale, ignore_errors=True)
        name[0] = f".{target.name}.partial-{uuid.uuid4().hex[:12]}"
    dist.broadcast_object_list(name, src=0)
    partial = target.parent / name[0]
    if asynchronous:
        group = _writing_group()
        written = dcp.async_save(_state(model, optimizer), checkpoint_id=partial, process_group=group)
        _pending = PendingSave(written, target, partial, extra, group)
        return _pending
    dcp.save(_state(model, optimizer), checkpoint_id=partial)
    dist.barrier()
    if dist.get_rank() == 0:
        _put_in_place(partial, target, extra)
    dist.barrier()
    return target


def _put_in_place(partial: Path, target: Path, extra: bytes) -> None:
    """Rank 0, once every rank's part and DCP's metadata are written: the
    extra state beside them, then the partial directory renamed into place
    (a previous checkpoint moved aside first and deleted last)."""
    (partial / EXTRA_FILE).write_bytes(extra)
    previous = None
    if target.exists():
        previous = target.parent / f".{target.name}.previous-{uuid.uuid4().hex[:12]}"
        target.rename(previous)
    partial.rename(target)
    _fsync_directory(target.parent)
    if previous is not None:
        shutil.rmtree(previous)


def _readable(target: Path) -> Path:
    if ".partial-" in target.name:
        raise CheckpointError(f"{target} is a save that did not finish; load a complete checkpoint")
    if (target / ".metadata").is_file():
        return target
    previous = sorted(target.parent.glob(f".{glob.escape(target.name)}.previous-*"), key=lambda p: p.stat().st_mtime)
    if not target.exists() and previous and (previous[-1] / ".metadata").is_file():
        return previous[-1]  # a save was killed between its two renames
    raise CheckpointError(f"{target} is not a checkpoint (no DCP metadata there)")


def load(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Collective: loads a checkpoint saved on any number of ranks (by fsdpc
    or by an FSDP2 job with the same layout) into `model` and `optimizer`;
    returns the saved `extra`."""
    wait_for_pending_save()
    source = _readable(Path(path).absolute())
    state = _state(model, optimizer)
    metadata = dcp.FileSystemReader(source).read_metadata()
    if optimizer is not None and not any(key.startswith("optim") for key in metadata.state_dict_metadata):
        raise CheckpointError(f"{source} holds no optimizer state; load it without the optimizer")
    dcp.load(state, checkpoint_id=source)
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra = source / EXTRA_FILE
    # DCP's load leaves reference cycles holding tensors that Gloo's workers
    # also reference; collected at interpreter shutdown, they made a worker
    # wait for the GIL while Python finalized, which aborts the process
    # ("terminate called without an active exception", 1 run in 6).
    gc.collect()
    if not extra.is_file():
        return {}
    try:
        return torch.load(extra, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"{extra}: refused to load: it holds objects that unpickling would construct by "
                              f"running code (fsdpc loads only tensors, numbers, strings and containers of "
                              f"them): {_first_line(error)}") from None


def full_state_dict(model: nn.Module, *, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """Collective: the model's state dict unsharded and unpadded (DTensors
    gathered one at a time) in host memory, on every rank or, with
    `rank0_only`, on rank 0 (the others get {} and hold one tensor at a
    time); a whole model seldom fits next to its shards on a GPU."""
    keep = not rank0_only or dist.get_rank() == 0
    full = {}
    host_meshes: dict[int, DeviceMesh | None] = {}
    for name, value in model.state_dict().items():
        if isinstance(value, DTensor):
            mesh = value.device_mesh
            if id(mesh) not in host_meshes:
                host_meshes[id(mesh)] = _host_mesh_for_gloo(mesh, torch.device(mesh.device_type))
            host_mesh = host_meshes[id(mesh)]
            if host_mesh is not None:
                value = DTensor.from_local(value.to_local().cpu(), host_mesh, value.placements, run_check=False,
                                           shape=value.shape, stride=value.stride())
            elif value.device.type != mesh.device_type:  # an offloaded shard gathers on the device
                value = DTensor.from_local(value.to_local().to(mesh.device_type), mesh, value.placements,
                                           run_check=False, shape=value.shape, stride=value.stride())
            value = value.full_tensor()
        if keep:
            full[name] = value.detach().to("cpu", copy=True)
    return full


def _host_mesh_for_gloo(mesh: DeviceMesh, device: torch.device) -> DeviceMesh | None:
    """Where Gloo moves `device`'s tensors, `mesh`'s groups as a host mesh to
    gather in: Gloo's all-gather reads device pointers as host memory and
    crashes (pytorch#152645), and the gathered tensor goes to host memory
    anyway. None where the mesh can gather itself."""
    if device.type == "cpu" or collective_backend(device) != "gloo":
        return None
    groups = mesh.get_all_groups()
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))  # from_group needs names
    return DeviceMesh.from_group(groups if mesh.ndim > 1 else groups[0], "cpu", mesh=mesh.mesh,
                                 mesh_dim_names=names)


def save_full(path: str | os.PathLike, model: nn.Module) -> None:
    """Collective: gathers the unsharded, unpadded model state and rank 0
    writes it with torch.save (for inference or a single-process load)."""
    wait_for_pending_save()
    full = full_state_dict(model, rank0_only=True)
    if dist.get_rank() == 0:
        target = Path(path)
        partial = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:12]}")
        torch.save(full, partial)
        os.replace(partial, target)
    dist.barrier()

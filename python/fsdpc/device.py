"""The job's device and collective backend: one rule, read everywhere.

A step runs where its batch is: the example batch handed to `fsdpc.shard`
names the device (CPU, or the CUDA device this process drives: under
torchrun, `torch.cuda.set_device(LOCAL_RANK)` and batches on "cuda"). An
example batch on the meta device (shapes only) leaves the choice to the
mesh's device type, else the current CUDA device where there is a GPU, else
the CPU, as FSDP2 chooses. Capture
targets that device's kind, the program is loaded for it, and the shards,
gradients, mesh and checkpoints live there. The collective backend is the
one the job's process group uses for that device (Gloo for CPU tensors, and
for CUDA tensors of ranks that share one GPU; NCCL otherwise); the sharding
pipeline's reports are computed for it.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.utils._pytree import tree_leaves

BACKENDS = ("gloo", "nccl")


class DeviceError(ValueError):
    """The batch, mesh or process group do not agree on a device."""


def job_device(example_batch: Sequence[torch.Tensor], mesh=None) -> torch.device:
    """The device every batch tensor is on (a CUDA device with its index)."""
    devices = {t.device for t in tree_leaves(tuple(example_batch)) if isinstance(t, torch.Tensor)}
    if not devices:
        raise DeviceError("the example batch holds no tensor: fsdpc takes the job's device from it")
    if len(devices) > 1:
        raise DeviceError(f"the example batch is on {sorted(map(str, devices))}: put every batch tensor on the "
                          "device this rank computes on")
    device = devices.pop()
    if device.type == "meta":
        kind = mesh.device_type if mesh is not None else "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(kind)
    if device.type not in ("cpu", "cuda"):
        raise DeviceError(f"the example batch is on {device}; fsdpc runs on cpu and cuda")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if mesh is not None and mesh.device_type != device.type:
        raise DeviceError(f"the mesh is on {mesh.device_type} and the batch on {device}: build the mesh with "
                          f"init_device_mesh('{device.type}', ...)")
    return device


def use_in_this_thread(device: torch.device | None) -> None:
    """Makes `device` current in a thread of fsdpc's own that touches its
    CUDA events. A new thread starts on GPU 0, and destroying an event
    restores the thread's device afterwards, which creates GPU 0's context
    (about 0.5 GB) in every other rank's process."""
    if device is not None and device.type == "cuda" and torch.cuda.current_device() != device.index:
        torch.cuda.set_device(device)


def collective_backend(device: torch.device, group=None) -> str:
    """The backend (`gloo` or `nccl`) `group` (default: the job's) uses for
    tensors on `device`."""
    group = group if group is not None else dist.group.WORLD
    try:
        name = group._get_backend(device).name()
    except RuntimeError as error:
        raise DeviceError(f"the job's process group has no backend for {device.type} tensors "
                          f"(torch.distributed.init_process_group(backend=...): gloo for cpu, nccl or gloo for "
                          f"cuda): {str(error).splitlines()[0]}") from error
    if name not in BACKENDS:
        raise DeviceError(f"the job's process group uses {name} for {device.type} tensors; fsdpc runs on "
                          f"{' and '.join(BACKENDS)}")
    return name


def seed_generators(device: torch.device) -> list[torch.device]:
    """The devices whose random state `torch.random.fork_rng` must save for
    an initialization on `device`."""
    return [device.index] if device.type == "cuda" else []


def dtensor_where_it_is(local: torch.Tensor, mesh, placements: Sequence, shape: Sequence[int],
                        stride: Sequence[int]) -> DTensor:
    """`local` as this rank's part of a DTensor of `shape` and `stride` on
    `mesh`, left where it is: `DTensor.from_local` moves it to the mesh's
    device type, and an offloaded shard (or its optimizer state) stays in
    host memory under a CUDA mesh, as FSDP2's do."""
    spec = DTensorSpec(mesh, tuple(placements), tensor_meta=TensorMeta(torch.Size(shape), tuple(stride), local.dtype))
    return DTensor(local, spec, requires_grad=False)

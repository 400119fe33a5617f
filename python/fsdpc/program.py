"""A compiled program as fsdpc's Python side sees it.

`fsdp-translate --fsdp-to-program` writes one JSON document (docs/program.md):
the manifest (communication groups with their member ranks, parameters with
their shard layout, buffers, functions) and the instruction lists that the
prebuilt runtime executes. The runtime extension (`_fsdp_rt`, built by CMake)
is the program's only reader: it parses and validates the whole program,
resolves every operator, and hands Python the manifest, which becomes the
dataclasses below. Python never parses the format itself.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fsdpc.compiler import find_fsdp_opt



class ProgramError(RuntimeError):
    """A program could not be made, read or loaded."""


@dataclass(frozen=True)
class GroupSpec:
    key: str
    grid_shape: tuple[int, ...]
    axes: tuple[int, ...]
    size: int
    members: tuple[tuple[int, ...], ...]  # every group of this key, as world ranks

    def members_of(self, rank: int) -> tuple[int, ...]:
        for group in self.members:
            if rank in group:
                return group
        raise ProgramError(f"rank {rank} is in no group of '{self.key}' (grid {self.grid_shape})")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    unit: str
    trainable: bool
    tied: tuple[str, ...]
    group: str | None     # None: replicated on every rank
    shard_rows: int       # rows of each rank's padded shard (logical rows when replicated)
    padding: int
    offloaded: bool = False  # shard, gradient and optimizer state in host memory
    ignored: bool = False  # FSDP2's ignored_params: whole on every rank, its gradient this rank's own


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    step: bool
    inputs: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each batch tensor
    instructions: int
    host_units: tuple[str, ...] = ()  # offloaded units, in the order the function gathers them
    cuda_graph: bool = False  # captured once and replayed as a CUDA graph (fsdp-cuda-graph)


@dataclass(frozen=True)
class Program:
    text: str
    groups: dict[str, GroupSpec]
    params: list[ParamSpec]
    buffers: list[BufferSpec]
    functions: dict[str, FunctionSpec]
    loaded: object  # the runtime's program, loaded for `device`
    device: str
    device_kind: str  # what the step was compiled for ("cpu", "cuda"); `device` is of this kind
    # A digest of every function's collectives in issue order (kind, group,
    # tensors, reduction, unit): ranks whose programs share it issue the
    # same collectives, whatever their batch shapes.
    collective_schedule: str = ""

    @staticmethod
    def parse(text: str, device: str | None = None) -> "Program":
        """Loads `text` into the runtime for `device` (default: the kind it
        was compiled for; the runtime validates all of it, and refuses a
        device of another kind) and reads the manifest from there."""
        try:
            loaded = runtime_extension().Program(text, device, kernel_cache(device))
        except RuntimeError as error:
            raise ProgramError(str(error)) from None
        doc = loaded.manifest()
        groups = {g["key"]: GroupSpec(g["key"], tuple(g["grid_shape"]), tuple(g["axes"]), g["size"],
                                      tuple(tuple(m) for m in g["members"])) for g in doc["groups"]}
        params = []
        for p in doc["params"]:
            replicated = p["group"] is None
            params.append(ParamSpec(p["name"], tuple(p["shape"]), p["dtype"], p["unit"], p["trainable"],
                                    tuple(p["tied"]), p["group"],
                                    (p["shape"][0] if p["shape"] else 1) if replicated else p["shard_rows"],
                                    0 if replicated else p["padding"], p["offloaded"], p["ignored"]))
        buffers = [BufferSpec(b["name"], tuple(b["shape"]), b["dtype"]) for b in doc["buffers"]]
        functions = {f["name"]: FunctionSpec(f["name"], f["step"],
                                             tuple((tuple(t["shape"]), t["dtype"]) for t in f["input_types"]),
                                             f["instructions"], tuple(f["host_units"]), f["cuda_graph"])
                     for f in doc["functions"]}
        return Program(text, groups, params, buffers, functions, loaded, device or doc["device"], doc["device"],
                       _collective_schedule(text))

    def load(self, device: str = "cpu"):
        """The runtime's loaded program (operators resolved, literals converted)."""
        if device == self.device:
            return self.loaded
        return runtime_extension().Program(self.text, device, kernel_cache(device))


def kernel_cache(device: str | None) -> str:
    """Where the runtime keeps the cubins of a GPU program's kernels: the
    fsdpc cache's `kernels` folder ("" with the cache off, or off a GPU)."""
    from fsdpc import cache

    folder = cache.directory() if device and device.startswith("cuda") else None
    return str(folder / "kernels") if folder else ""


def find_fsdp_translate() -> Path:
    return find_fsdp_opt().with_name("fsdp-translate")


def translate(sharded_ir: str, timeout: float = 300.0) -> Program:
    """Lowers sharded, scheduled IR to a program."""
    done = subprocess.run([str(find_fsdp_translate()), "--fsdp-to-program", "-"], input=sharded_ir,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ProgramError(f"fsdp-translate failed:\n{done.stderr.rstrip()}")
    return Program.parse(done.stdout)


def runtime_extension():
    """The `_fsdp_rt` extension: $FSDP_RT_PYTHON, else next to fsdp-opt's build."""
    try:
        return importlib.import_module("_fsdp_rt")
    except ImportError:
        pass
    directory = Path(os.environ.get("FSDP_RT_PYTHON") or find_fsdp_opt().parents[1] / "python")
    if not any(directory.glob("_fsdp_rt*.so")):
        raise ProgramError(f"the fsdpc runtime extension is not built in {directory}: run `make`")
    import torch  # noqa: F401  (the extension links against torch's libraries)

    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module("_fsdp_rt")
    finally:
        sys.path.remove(str(directory))


# What an instruction that names a group says about the collective it
# issues; its slots (inputs, results, futures) are numbered per program.
_COLLECTIVE_FIELDS = ("op", "group", "shapes", "dtypes", "reduction", "reduce_dtype", "pre_divide", "post_divide",
                      "host", "into_results", "unit")


def _collective_schedule(text: str) -> str:
    """Each collective's fields, and the parameters it reads by name (a
    gather's inputs), in issue order per function."""
    schedule = []
    for function in json.loads(text)["functions"]:
        names = {instruction["result"]: instruction["name"] for instruction in function["instructions"]
                 if instruction.get("op") == "param"}
        schedule.append((function["name"], [
            [*(instruction.get(key) for key in _COLLECTIVE_FIELDS),
             [names.get(slot) for slot in instruction.get("inputs", [])]]
            for instruction in function["instructions"] if "group" in instruction]))
    return hashlib.sha256(json.dumps(schedule).encode()).hexdigest()

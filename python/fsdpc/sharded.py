"""The torch.compile-style API: `fsdpc.shard` and the module it returns.

    sharded = fsdpc.shard(model, example_batch, loss_fn)        # on every rank
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    for batch in data:
        loss = sharded(*batch)                                   # forward + backward
        sharded.clip_grad_norm_(1.0)
        optimizer.step(); optimizer.zero_grad()

The returned `ShardedModule` takes over the model's module tree, so its
parameters keep the model's FQNs. Each is an `nn.Parameter` holding a
`DTensor` (placements `Shard(0)` on the mesh, `Replicate()` on a replica
dimension or for replicated parameters) whose local tensor is a view of this
rank's padded shard, the buffer the compiled program reads: optimizers,
parameter groups, LR schedulers, `state_dict` and
`torch.distributed.checkpoint` see what they see under FSDP2, padding never.

One program is compiled per kind of call (training, or forward only under
`torch.no_grad()`/`eval()`) and batch signature; a new shape compiles (or
loads from the cache) another program on every rank.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import itertools
import math
import os
import re
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from datetime import timedelta
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.nn.modules.module import (register_module_module_registration_hook,
                                      register_module_parameter_registration_hook)
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from fsdpc import clip, liveness
from fsdpc.attention import backend_switches
from fsdpc.autocast import ambient_autocast
from fsdpc.batch_norm import partly_synced
from fsdpc.capture import CaptureError, MixedPrecision, aux_count, batch_leaves, class_setting
from fsdpc.checkpoint import full_state_dict as gather_full_state_dict
from fsdpc.device import DeviceError, collective_backend, dtensor_where_it_is, job_device, seed_generators
from fsdpc.emit import MIXED_PRECISION_TYPES, torch_dtype
from fsdpc.host_optimizer import HostOptimizer, InBackward
from fsdpc.local_step import LocalStep
from fsdpc.program import ParamSpec, Program, runtime_extension
from fsdpc.runtime import (NO_SYNC_STEP, STEP, CompiledProgram, StepError, compile_program, on_every_rank,
                           pipeline_options)
from fsdpc.units import ROOT_UNIT, WrapPolicy, plan_units
from fsdpc.transformer import fast_path_reads
from fsdpc.watch import Marker, free_variable_reads, read_attribute, say_outside_assignments, user_stacklevel
from fsdpc.watchdog import DUMPS_OFF_BEFORE_FIRST_GROUP, WATCHDOG, interrupt

# Parameters of models handed to `shard`, by object: an optimizer that still
# holds one would train nothing, so its step raises (see _refuse_retired).
# Keyed by id with a weak reference (tensors compare elementwise, so they
# cannot be dictionary keys by value).
_RETIRED: dict[int, tuple[weakref.ref, str]] = {}
# Shards lent to an unsharded() block that writes back, by object, with their
# FQN: an optimizer step there would be overwritten by the write-back.
_LENT: dict[int, str] = {}
# Shards with gradients accumulated by calls without synchronization, held
# unreduced by their module until a synchronizing call, with their FQN: not
# in `.grad` yet, so an optimizer step would leave them out.
_UNREDUCED = WeakIdKeyDictionary()
_optimizer_hooks = None
_registration_hooks = None
_SERIALS = itertools.count()
# Batch shapes compiled for before a module says that each new one compiles a step.
MANY_SHAPES = 8

_GATHERED_IN_THE_STEP = ("the compiled step gathers and frees every unit's parameters itself; for whole parameters "
                         "outside it (inspecting, editing, generating), `with model.unsharded():` (per_unit=True "
                         "to gather unit by unit)")
_WHOLE_STEP = ("every call is a whole step (forward, backward and its reductions); to accumulate gradients, "
               "model(*batch, sync=False) or model.set_requires_gradient_sync(False) (with fsdpc.shard(..., "
               "gradient_accumulation=True)), then one synchronizing call")
_PREFETCH = ("the compiled step prefetches by its schedule: fsdpc.shard(..., pipeline=\"forward-prefetch=2 "
             "backward-prefetch=2\") sets how many units ahead (`python -m fsdpc plan` ranks settings by time "
             "and memory)")
_OWN_COLLECTIVES = ("fsdpc runs the collectives its compiled program holds, on its own groups and buffers; "
                    "custom collectives and hooks on them are not supported")
_PLACED_BY_THE_PROGRAM = ("the compiled program places its communication buffers, streams and groups itself "
                          "(the memory report shows them); there is nothing to set")
# FSDP2's FSDPModule methods that have no counterpart on the sharded module,
# with what to do instead (a loop ported from FSDP2 gets this, not "no attribute").
FSDP2_METHODS_INSTEAD = {
    "unshard": _GATHERED_IN_THE_STEP,
    "reshard": _GATHERED_IN_THE_STEP,
    "set_is_last_backward": _WHOLE_STEP,
    "set_requires_all_reduce": _WHOLE_STEP,
    "finalize_backward": _WHOLE_STEP,
    "set_manual_backward_finalization": _WHOLE_STEP,
    "reset_iter_state": _WHOLE_STEP,
    "set_reshard_after_backward": ("each call frees what it gathered by its end; set_reshard_after_forward(False) "
                                   "keeps a unit's gathered parameters from its forward to its backward"),
    "set_unshard_in_backward": "backward gathers only the parameters it reads, which the compiled step knows",
    "set_modules_to_forward_prefetch": _PREFETCH,
    "set_modules_to_backward_prefetch": _PREFETCH,
    "set_post_optim_event": ("the call's collectives start after the work queued on the current stream before it "
                             "(the optimizer's step included); no event is needed"),
    "set_all_reduce_hook": _OWN_COLLECTIVES,
    "set_custom_all_gather": _OWN_COLLECTIVES,
    "set_custom_reduce_scatter": _OWN_COLLECTIVES,
    "set_allocate_memory_from_process_group_for_comm": _PLACED_BY_THE_PROGRAM,
    "set_symm_mem_for_comm": _PLACED_BY_THE_PROGRAM,
    "set_reduce_scatter_max_input_buffers": _PLACED_BY_THE_PROGRAM,
    "set_separate_reduce_scatter_group": _PLACED_BY_THE_PROGRAM,
    "set_keep_unsharded_storage": _PLACED_BY_THE_PROGRAM,
    "set_reduce_scatter_unused_params": ("a parameter the step does not use gets no gradient and is not reduced, "
                                         "as in eager PyTorch"),
}


# Model methods (Hugging Face's) whose effect the sharded module offers
# otherwise: inside unsharded() they would add a forward hook (the inputs'
# gradients) the compiled step was not traced with.
_ENABLE_CHECKPOINTING = ("enable it on the model before fsdpc.shard (`model.gradient_checkpointing_enable()`, then "
                         "`fsdpc.shard(model, ...)`: each checkpointed layer is recomputed in backward), or shard "
                         "with pipeline=\"checkpoint=*\"")
_DISABLE_CHECKPOINTING = ("set the layers' flag instead, `for m in model.modules(): m.gradient_checkpointing = False` "
                          "where it is set (the next call compiles the step without recomputation)")
_MODEL_METHODS_INSTEAD = {"gradient_checkpointing_enable": _ENABLE_CHECKPOINTING,
                          "activation_checkpointing_enable": _ENABLE_CHECKPOINTING,
                          "gradient_checkpointing_disable": _DISABLE_CHECKPOINTING,
                          "activation_checkpointing_disable": _DISABLE_CHECKPOINTING}


# In a program's key: a read module attribute deleted since; a watched read
# shown not to reach the steps of a mode, in the keys of that mode's programs.
_ABSENT = Marker("(deleted)")
_UNREAD = Marker("(not read in this mode)")


def _retire(param: torch.Tensor, fqn: str) -> None:
    key = id(param)
    _RETIRED[key] = (weakref.ref(param, lambda _: _RETIRED.pop(key, None)), fqn)


def _refuse_retired(optimizer, args, kwargs) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            entry = _RETIRED.get(id(param))
            if entry is not None and entry[0]() is param:
                raise StepError(
                    f"this optimizer holds '{entry[1]}' of the model as it was before fsdpc.shard; "
                    "its shards live in the sharded module now: build the optimizer over "
                    "sharded.parameters()")
            if id(param) in _LENT:
                raise StepError(f"optimizer.step() inside unsharded(): '{_LENT[id(param)]}' is whole in the model "
                                "now, and leaving the block writes it back over what the step would do; step "
                                "after the block (or enter it with writeback=False)")


def _refuse_unreduced(optimizer, *_) -> None:
    """A step over shards whose accumulated gradients no synchronizing call
    has reduced yet (a global step hook, and the host optimizer's step,
    whose user step sees the device's parameters only)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param in _UNREDUCED:
                raise StepError(
                    f"optimizer.step() while '{_UNREDUCED[param]}' has gradients accumulated by calls without "
                    "synchronization (sync=False, no_sync, set_requires_gradient_sync(False)) and not reduced: "
                    "they reach .grad with the next synchronizing call, so this step would leave them out; end "
                    "the accumulation with a synchronizing call before step(), or drop them with "
                    "model.zero_grad()")


def _install_optimizer_hooks() -> None:
    """Global step hooks: refuse optimizers over retired parameters; step the
    elementwise optimizers on the shards' local tensors (local_step.py)."""
    global _optimizer_hooks
    if _optimizer_hooks is None:
        local_step = LocalStep(lambda param: getattr(param, "_fsdpc_shard", False))
        _optimizer_hooks = (register_optimizer_step_pre_hook(_refuse_retired),
                            register_optimizer_step_pre_hook(_refuse_unreduced),
                            register_optimizer_step_pre_hook(local_step.before),
                            register_optimizer_step_post_hook(local_step.after))
        local_step.hooks = {handle.id for handle in _optimizer_hooks}


class _TreeWatch:
    """The changes to a sharded model's structure since fsdpc.shard: a
    submodule or parameter assigned (replaced or added) outside capture and
    unsharded(), which lend the model out."""

    def __init__(self, lent: _Flag):
        self.lent = lent
        self.changes: list[str] = []


# The modules of sharded models, by object, with their watch and path.
_WATCHED_TREES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _noting(kind: str) -> Callable:
    def note(module, name, value) -> None:
        entry = _WATCHED_TREES.get(module)  # every registration in the process passes here: this first
        if entry is None or entry[0].lent.on:
            return
        slots = module._modules if kind == "submodule" else module._parameters
        if slots.get(name) is not value:  # not assigned again as it is (Hugging Face's tie_weights())
            entry[0].changes.append(f"{kind} '{entry[1]}{name}'")
    return note


def _install_registration_hooks() -> None:
    """Global hooks on nn.Module's registration of submodules and
    parameters: the compiled step reads the parameters of the tree as it
    was, so an assignment into a sharded tree (resize_token_embeddings,
    get_peft_model, load_state_dict(assign=True) after fsdpc.shard) would
    silently not be trained."""
    global _registration_hooks
    if _registration_hooks is None:
        _registration_hooks = (register_module_module_registration_hook(_noting("submodule")),
                               register_module_parameter_registration_hook(_noting("parameter")))


def _mixed_precision(policy, model: nn.Module, wrap: WrapPolicy, ignored: tuple[str, ...] = (),
                     pipeline_reduce: str | None = None) -> MixedPrecision | None:
    """fsdpc's MixedPrecision from ours or from FSDP2's MixedPrecisionPolicy,
    or from a dict of them by wrap unit (`_per_unit_precision`); the
    `ignored` parameters uncast, as FSDP2 leaves them. A policy without a
    reduce_dtype takes the pipeline's `reduce-dtype` (`pipeline_reduce`),
    else FSDP2's (`MixedPrecision.as_fsdp2_reduces`)."""
    if isinstance(policy, Mapping):
        policy = _per_unit_precision(policy, model, wrap, ignored)
    if policy is None:
        return None
    if not isinstance(policy, MixedPrecision):
        fields = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")
        if not all(hasattr(policy, name) for name in fields):
            raise StepError(f"mp_policy must be fsdpc.MixedPrecision or torch.distributed.fsdp.MixedPrecisionPolicy "
                            f"(or a dict of them by wrap unit), got {type(policy).__name__}")
        policy = MixedPrecision(*(getattr(policy, name) for name in fields))
    if pipeline_reduce is None:
        policy = policy.as_fsdp2_reduces(model, ignored)
    return dataclasses.replace(policy, uncast=ignored) if ignored else policy


def _per_unit_precision(policies: Mapping, model: nn.Module, wrap: WrapPolicy,
                        ignored: tuple[str, ...]) -> MixedPrecision:
    """FSDP2's mp_policy given per fully_shard call: `policies` by wrap unit
    module FQN, "" the model (the root unit, whose policy every unit not
    listed takes; without it, no casts). One reduce dtype for all: the
    reductions of every unit share it."""
    converted: dict[str, MixedPrecision] = {}
    for fqn, policy in policies.items():
        if not isinstance(fqn, str):
            raise StepError(f"mp_policy's keys are wrap units' module names (\"\" the model), got {fqn!r}")
        converted[fqn] = _mixed_precision(policy, model, wrap) if policy is not None else MixedPrecision()
        if converted[fqn].units:
            raise StepError(f"mp_policy[{fqn!r}] is itself a policy by unit")
    try:
        plan = plan_units(model, wrap)
    except ValueError as error:
        raise StepError(str(error)) from None
    units = ["" if unit.is_root else unit.name for unit in plan.units]
    unknown = sorted(set(converted) - set(units))
    if unknown:
        which = "is not a wrap unit" if len(unknown) == 1 else "are not wrap units"
        raise StepError(f"mp_policy names {', '.join(map(repr, unknown))}, which {which}; the units: "
                        f"{', '.join(map(repr, units))} (\"\" the model; wrap= chooses them)")
    root = converted.pop("", MixedPrecision())
    own = {fqn: policy for fqn, policy in converted.items() if policy != root}
    # Each unit with parameters it reduces does so where FSDP2 would (fsdp2_reduce_dtype). fsdpc's
    # reductions share one.
    names: dict[int, list[str]] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        if param.is_floating_point():
            names.setdefault(id(param), []).append(fqn)
    reduced_in: dict[str, torch.dtype] = {}
    for fqns in names.values():
        if set(fqns) & set(ignored):
            continue
        unit = plan.owner(fqns)
        policy = own.get(unit, root) if unit != ROOT_UNIT else root
        dtype = policy.fsdp2_reduce_dtype(model.get_parameter(fqns[0]).dtype)
        reduced_in.setdefault("" if unit == ROOT_UNIT else unit, dtype)
    if len(set(reduced_in.values())) > 1:
        raise StepError("mp_policy by unit: fsdpc reduces every unit's gradients in one dtype, and these would "
                        "reduce in " + ", ".join(f"{str(dtype).removeprefix('torch.')} ({unit or 'the model'})"
                                                 for unit, dtype in sorted(reduced_in.items())) +
                        "; give each policy the same reduce_dtype (torch.float32 keeps the full-precision units' "
                        "reductions exact)")
    common = next(iter(reduced_in.values()), root.reduce_dtype)
    return MixedPrecision(root.param_dtype, common, root.output_dtype, root.cast_forward_inputs,
                          units=tuple(sorted(own.items())))


def _divide_factor_option(factor) -> str:
    """A gradient divide factor as the pipeline option takes it."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
        raise StepError(f"the gradient divide factor must be a positive finite number (1: gradients summed over "
                        f"the ranks, for a loss normalized over the whole batch), got {factor!r}")
    return repr(float(factor))


def _spans_the_grid(group) -> bool:
    """Whether a program's group holds every rank of a grid of several axes."""
    return len(group.grid_shape) > 1 and len(group.axes) == len(group.grid_shape)


def _reshard_option(reshard_after_forward, shard_ranks: int) -> str:
    """FSDP2's reshard_after_forward as the pipeline option takes it, by
    FSDP2's rules: a group size divides the `shard_ranks`; 1 means False
    (said once), all of them True."""
    if isinstance(reshard_after_forward, bool):
        return str(reshard_after_forward).lower()
    if not isinstance(reshard_after_forward, int) or not 1 <= reshard_after_forward <= shard_ranks \
            or shard_ranks % reshard_after_forward:
        raise StepError(f"reshard_after_forward must be True, False or a group size that divides the "
                        f"{shard_ranks} ranks parameters are sharded over, got {reshard_after_forward!r}")
    if reshard_after_forward == 1:
        warnings.warn("reshard_after_forward=1 (int) keeps parameters whole after forward on each rank (a group "
                      "of 1), as reshard_after_forward=False does (FSDP2's reading too); True reshards them",
                      stacklevel=user_stacklevel())
        return "false"
    return "true" if reshard_after_forward == shard_ranks else str(reshard_after_forward)


def _with_overrides(options: str, overrides: dict[str, str]) -> str:
    """`options` with each of `overrides` in place of the option given."""
    kept = [option for option in options.split() if option.partition("=")[0] not in overrides]
    return " ".join(kept + [f"{name}={value}" for name, value in sorted(overrides.items())])


def _shard_ranks(mesh: DeviceMesh | None, options: dict[str, str], world: int) -> int:
    """How many ranks shard each parameter: the mesh's last dimension, the
    `ranks` of a hybrid pipeline (its world over `replicas`), or the world."""
    if mesh is not None:
        return mesh.size(mesh.ndim - 1)
    try:
        replicas = int(options.get("replicas", 1)) if options.get("strategy") == "hybrid-shard" else 1
        return int(options.get("ranks", world // max(replicas, 1)))
    except ValueError:  # the pipeline reports a bad number
        return world


def _given_options(pipeline: str) -> dict[str, str]:
    """The options a pipeline string gives, by name."""
    return dict(option.partition("=")[::2] for option in pipeline.split())


def _pipeline_for(given: dict[str, str], mesh: DeviceMesh | None, world: int, reshard_after_forward, offload: bool,
                  policy: MixedPrecision | None, gradient_accumulation: bool, backend: str,
                  gradient_divide_factor: float | None, ignored: tuple[str, ...]) -> str:
    """The sharding pipeline's options from fully_shard's vocabulary, over
    those the pipeline string `given`; the same knob given twice with
    different values is an error."""
    given = dict(given)
    if "ignored-params" in given:
        raise StepError("pipeline option 'ignored-params': pass the parameters as fsdpc.shard(..., ignored_params="
                        "{...}), which keeps them as the model's own, uncast, and checks them on every rank")
    if "gradient-divide-factor" in given:  # as the argument writes it, so that the two compare
        try:
            given["gradient-divide-factor"] = _divide_factor_option(float(given["gradient-divide-factor"]))
        except ValueError:
            raise StepError(f"pipeline option 'gradient-divide-factor={given['gradient-divide-factor']}' is not a "
                            "number") from None
    wanted: dict[str, str] = {}
    if mesh is not None:
        if mesh.ndim == 1:
            if mesh.size() != world:
                raise StepError(f"the mesh has {mesh.size()} ranks, the job {world}: fsdpc shards over "
                                "the whole job (a 2-D mesh (replicate, shard) for hybrid sharding)")
        elif mesh.ndim == 2:
            wanted.update(strategy="hybrid-shard", replicas=str(mesh.size(0)), ranks=str(mesh.size(1)))
        else:
            raise StepError(f"a {mesh.ndim}-D mesh: fsdpc takes a 1-D (shard) or 2-D (replicate, shard) mesh")
    if reshard_after_forward is not None:
        wanted["reshard-after-forward"] = _reshard_option(reshard_after_forward,
                                                          _shard_ranks(mesh, {**given, **wanted}, world))
    if gradient_accumulation:
        wanted["gradient-accumulation"] = "true"
    if gradient_divide_factor is not None:
        wanted["gradient-divide-factor"] = _divide_factor_option(gradient_divide_factor)
    if offload:
        wanted["offload"] = "*"
    if ignored:
        wanted["ignored-params"] = ",".join(ignored)
    wanted["backend"] = backend  # the reports count what this backend moves and allocates
    checked = dict(wanted)
    if policy is not None and policy.reduce_dtype is not None:  # capture applies it; the pipeline must agree
        reduce_types = {torch_dtype(name): name for name in MIXED_PRECISION_TYPES}
        if policy.reduce_dtype not in reduce_types:
            raise StepError(f"mp_policy.reduce_dtype {policy.reduce_dtype} is not a float type fsdpc reduces in")
        checked["reduce-dtype"] = reduce_types[policy.reduce_dtype]
        if policy.units:  # the IR's policy is the root unit's, which may have no param_dtype to carry it
            wanted["reduce-dtype"] = checked["reduce-dtype"]
    for name, value in checked.items():
        if name in given and given[name] != value:
            raise StepError(f"conflicting settings: pipeline option '{name}={given[name]}' and "
                            f"'{name}={value}' from shard()'s arguments; give it once")
    merged = {**given, **wanted}
    return pipeline_options(" ".join(f"{k}={v}" if v else k for k, v in merged.items()), world)


@contextlib.contextmanager
def _errors_left_to_fsdpc() -> Iterator[None]:
    """Process groups created here leave NCCL's errors and timeouts to
    fsdpc's watchdog (fsdpc/watchdog.py): ProcessGroupNCCL reads these
    variables when it is created. Without the first, its own watchdog tears
    the process down; without the second, it sleeps 60 s per failed
    collective (time for other ranks to dump their flight recorders) while
    holding its work list, which delays even the process's exit. The third
    keeps waits off the host (a blocking wait polls the collective's end,
    which ends all overlap, and a CUDA graph cannot capture)."""
    settings = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "1",
                "TORCH_NCCL_BLOCKING_WAIT": "0"}
    before = {variable: os.environ.get(variable) for variable in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for variable, value in before.items():
            if value is None:
                del os.environ[variable]
            else:
                os.environ[variable] = value


def _owner(root: nn.Module, fqn: str) -> tuple[nn.Module, str]:
    path, _, leaf = fqn.rpartition(".")
    return (root.get_submodule(path) if path else root), leaf


@dataclass
class _Watched:
    """A plain value some compiled step holds as a constant: its name (as
    the per-call agreement says it), how to read it now, and its value when
    first compiled."""

    name: str
    read: Callable[[], object]
    baseline: object


class ShardedModule(nn.Module):
    """A model whose training step fsdpc compiled; see `fsdpc.shard`."""

    def __init__(self, model: nn.Module, example_batch: Sequence[torch.Tensor], loss_fn: Callable, *,
                 mesh: DeviceMesh | None = None, reshard_after_forward: bool | int | None = None,
                 mp_policy=None, offload_policy=None, wrap: WrapPolicy = None,
                 gradient_accumulation: bool = False, gradient_divide_factor: float | None = None,
                 pipeline: str = "", timeout: timedelta = timedelta(minutes=5), check_reshard_frees: bool = False,
                 grad_scaler: torch.amp.GradScaler | None = None, ignored_params: Iterable[nn.Parameter] | None = None,
                 shard_placement_fn: Callable[[nn.Parameter], object] | None = None, dp_mesh_dims=None):
        if not dist.is_initialized():
            raise StepError("fsdpc.shard needs torch.distributed initialized (run under torchrun)")
        if isinstance(example_batch, (torch.Tensor, Mapping)):  # one item, as `model(batch)` will be called
            example_batch = (example_batch,)
        if isinstance(model, ShardedModule):
            raise StepError("this model is already sharded by fsdpc")
        model = _unwrapped(model)
        distributed = [name for name, param in model.named_parameters() if isinstance(param, DTensor)]
        if dp_mesh_dims is not None or distributed:
            what = (f"parameters {_listed(distributed, 3)} are DTensors already" if distributed
                    else "dp_mesh_dims names the data-parallel dims of a full mesh")
            raise StepError(f"{what}: fsdpc shards plain parameters over a data-parallel mesh (1-D, or 2-D "
                            "(replicate, shard)), and tensor or other model parallelism is not supported; hand "
                            "fsdpc.shard the model before parallelizing it")
        synced = partly_synced(model)
        if synced:
            raise StepError(f"{_modules_named(synced)} SyncBatchNorm over a process group that is not all "
                            f"{dist.get_world_size()} ranks: fsdpc sums batch statistics over every data-parallel "
                            "rank; construct it with process_group=None")
        renormed = [name for name, module in model.named_modules()
                    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.max_norm is not None]
        if renormed:  # capture would refuse the in-place update of a parameter, without saying whose
            raise StepError(f"{_modules_named(renormed)} an embedding with max_norm, which renormalizes the rows it "
                            "looks up in place in every forward: a change of a parameter outside the optimizer step, "
                            "which the compiled step does not make; set max_norm=None and renormalize after "
                            "optimizer.step() under torch.no_grad()")
        _refuse_module_backward_hooks(dict(model.named_modules()), "")
        super().__init__()
        world = dist.get_world_size()

        def check_arguments():
            if not isinstance(timeout, timedelta) or timeout < timedelta(milliseconds=1):
                # c10d reads a zero timeout (what a sub-millisecond one rounds to) as none at all.
                raise StepError(f"timeout must be a timedelta of at least 1 ms, got {timeout!r}")
            try:
                device = job_device(example_batch, mesh)
                backend = collective_backend(device)
            except DeviceError as error:
                raise StepError(str(error)) from None
            offload = self._check_offload(offload_policy, device)
            _check_grad_scaler(grad_scaler, world)
            ignored = _ignored_names(model, ignored_params, device)
            elsewhere = _placed_off_dim_0(model, shard_placement_fn, ignored)
            given = _given_options(pipeline)
            policy = _mixed_precision(mp_policy, model, wrap, ignored, given.get("reduce-dtype"))
            return device, policy, _pipeline_for(given, mesh, world, reshard_after_forward, offload is not None,
                                                 policy, gradient_accumulation, backend,
                                                 gradient_divide_factor, ignored), offload, ignored, elsewhere

        checked = on_every_rank("checking fsdpc.shard's arguments", check_arguments, share_result=True)
        device, policy, options, offload, ignored, elsewhere = checked[dist.get_rank()]
        ignored_by_rank = [result[4] for result in checked]
        if len(set(ignored_by_rank)) > 1:
            raise StepError("the ranks ignore different parameters (ignored_params): " + "; ".join(
                f"rank {rank}: {', '.join(names) or 'none'}" for rank, names in enumerate(ignored_by_rank)))

        self.device = device
        # Offloaded shards (CPUOffloadPolicy, or the pipeline's offload options)
        # and their gradients live in host memory, pinned for asynchronous
        # copies to and from a GPU unless CPUOffloadPolicy(pin_memory=False)
        # says otherwise.
        self._pin_shards = device.type != "cpu" and (offload is None or bool(offload.pin_memory))
        self._config = dict(loss_fn=loss_fn, options=options, wrap=wrap, mixed_precision=policy)
        # Training calls start backward from its scale, as scaler.scale(loss).backward() does.
        self._grad_scaler = grad_scaler if grad_scaler is not None and grad_scaler.is_enabled() else None
        # Pipeline options FSDP2's setters changed since (set_gradient_divide_factor,
        # set_reshard_after_forward), as the pipeline writes them: they key
        # the training programs and the per-call agreement.
        self._overrides: dict[str, str] = {}
        # Per-call agreement runs here, under the step's timeout (the default
        # group's may be 30 minutes).
        self._control = dist.new_group(backend="gloo", timeout=timeout)
        self._serial = next(_SERIALS)  # the same on every rank: modules are built collectively
        self._calls = 0
        self._heartbeat = liveness.start_heartbeat()  # tells the roll call after a failure who is alive
        self._timeout, self._check_reshard_frees = timeout, check_reshard_frees
        object.__setattr__(self, "_original", model)  # not a submodule: its FQNs are ours
        # On while the original model may run: capture traces it, unsharded() lends it.
        self._model_lent = _Flag()
        self._unsharded = None  # the unsharded() block the module is in
        # The example batch's tensors in order, and its structure (each item a
        # tensor, or a dict, list or tuple of them, as loss_fn takes it).
        try:
            example, self._batch_structure = batch_leaves(example_batch)
        except CaptureError as error:
            raise StepError(str(error)) from None
        self._example = tuple(example)
        self._programs: dict[tuple, CompiledProgram] = {}
        # The plain values the compiled steps hold as constants, whose current
        # values key the programs: what loss_fn and the model's forwards read
        # from outside themselves (found in their code), then each module
        # attribute a compiled step read (recorded by capture).
        self._watched = [_Watched(described, read, read())
                         for described, read in free_variable_reads(loss_fn, model) + fast_path_reads(model)]
        if dist.get_rank() == 0:
            say_outside_assignments(loss_fn, model)
        # Reads whose change compiled the same step, by mode (see _same_step_for_other_values): the
        # indices in `_watched` not watched in that mode, and every such read's name.
        self._unread: dict[tuple, frozenset[int]] = {}
        self._unwatched: set[str] = set()
        # Per mode (train, training): the program whose CUDA graphs the last
        # call used, and that call's batch shapes.
        self._replaying: dict[tuple, tuple[CompiledProgram, tuple]] = {}
        self._warned_replay_shapes = False
        self._warned_many_shapes = False
        self._warned_many_values = False
        self._warned_fp16 = False
        self._groups: dict[str, dist.ProcessGroup] = {}
        self._accumulated: dict[str, torch.Tensor] = {}
        self._gradient_sync = True
        self._failed: str | None = None
        self._failing = threading.Lock()
        self._host_optimizer: HostOptimizer | None = None
        self._warned_eval = False
        self._warned_all_frozen = False
        self.last_trace: list[tuple] = []
        # The last call's collectives as the runtime issued them: (c10d op,
        # buffer bytes, group size); the communication report predicts them.
        self.last_collectives: list[tuple[str, int, int]] = []
        # Adopt the model's tree: the same submodules, parameters and buffers
        # under the same names.
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, param in model.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in model.named_buffers(recurse=False):
            self.register_buffer(name, buffer, persistent=name not in model._non_persistent_buffers_set)
        # A training step is what is compiled: the model trains until .eval()
        # (Hugging Face's from_pretrained hands models over in eval mode); a
        # training model keeps the modes its modules were given (a frozen
        # encoder left in eval).
        if not model.training:
            model.train()
        self._hooked_modules = dict(model.named_modules())  # by name: their modes and forward hooks are checked

        # Each rank's example batch may have sizes of its own (its first
        # batch, padded to its own longest sequence): rank 0's sizes set the
        # layout, then every rank's are compiled as a call's would be.
        examples: list = [None] * world
        dist.all_gather_object(examples, (str(self._batch_structure), _kinds(self._example),
                                          tuple(tuple(t.shape) for t in self._example)))
        if len({(structure, kinds) for structure, kinds, _ in examples}) > 1:
            raise StepError("the ranks' example batches differ in more than sizes (" + "; ".join(
                f"rank {rank}: {kinds}{'' if structure == examples[0][0] else ', structured otherwise'}"
                for rank, (structure, kinds, _) in enumerate(examples)) + "): only sizes may differ between ranks")
        sizes_by_rank = [sizes for _, _, sizes in examples]
        # Where each call finds the buffers it hands the runtime (their types key the programs).
        self._buffer_slots = {name: _owner(self, name) for name, _ in self.named_buffers()}
        frozen = _frozen(dict(self.named_parameters()))
        first = self._program_for(_meta_batch(sizes_by_rank[0], self._example), train=True, frozen=frozen)
        self.layout: dict[str, ParamSpec] = {spec.name: spec for spec in first.program.params}
        # The ignored parameters, read in place, with the dtype each call checks.
        self._ignored = {spec.name: torch_dtype(spec.dtype) for spec in first.program.params if spec.ignored}
        if len(set(sizes_by_rank)) > 1:
            self._program_among(sizes_by_rank, self._example, train=True, frozen=frozen, read=None)
        self.mesh = mesh if mesh is not None else self._mesh_of(first.program)
        # Parameters (by the layout's names) and buffers that hold no values
        # yet: built on meta, and neither initialized nor loaded since.
        originals = dict(model.named_parameters(remove_duplicate=False))
        self._empty = ({name for name in self.layout if originals[name].is_meta} |
                       {name for name, buffer in self.named_buffers() if buffer.is_meta})
        self._filled: set[str] = set()  # what a load filled: init_weights() keeps it
        self._storage: dict[str, torch.Tensor] = {}
        on_every_rank("placing the parameter shards", lambda: self._place_shards(model))
        self._move_buffers()
        # Where each call finds the parameters it hands the runtime: a lookup
        # per tensor instead of a walk of the module tree.
        self._param_slots = {fqn: _owner(self, fqn) for fqn in self.layout}
        self._local_rows = {fqn: self._shard_rows(spec)[1] for fqn, spec in self.layout.items()}
        if elsewhere and dist.get_rank() == 0:
            _say_sharded_on_dim_0(elsewhere, self.layout)
        if not self._empty:  # every rank starts from rank 0's replicated state
            self._broadcast_replicated(ignored=False)
        # No hook refers to the module itself (each is handed it): a cycle
        # through it would keep it and its process groups alive until the
        # garbage collector runs, perhaps at interpreter shutdown, where
        # freeing a group kills the process (docs/design.md).
        refuse = model.register_forward_pre_hook(_refuse_call(self._model_lent))
        # The model's forward hooks are traced into the step: what they
        # compute is compiled in, once; hooks added or removed later would
        # silently not be, so a call after a change is refused.
        self._compiled_hooks = _forward_hook_ids(self._hooked_modules.values())
        traced = [name or "the model" for name, module in self._hooked_modules.items()
                  if set(module._forward_pre_hooks) - {refuse.id} or module._forward_hooks]
        if traced:
            warnings.warn(f"fsdpc traced the forward hooks on {', '.join(traced[:3])}"
                          f"{' and more' if len(traced) > 3 else ''} into the step, once, on meta tensors: what they "
                          "compute is compiled in; their side effects (logging, storing activations) do not repeat "
                          "per call (hooks on the sharded module itself run around every call)", stacklevel=user_stacklevel())
        self.register_load_state_dict_post_hook(ShardedModule._loaded)
        self.register_state_dict_pre_hook(ShardedModule._settle_state)
        self.register_load_state_dict_pre_hook(ShardedModule._settle_state)
        self.register_load_state_dict_pre_hook(ShardedModule._shard_whole_tensors)
        _install_optimizer_hooks()
        _install_registration_hooks()
        self._tree_watch = _TreeWatch(self._model_lent)
        for name, module in [("", self), *model.named_modules()]:
            _WATCHED_TREES[module] = (self._tree_watch, f"{name}." if name else "")
        self._built = True  # from now on a name the model's step probed for is the user's to set on the model

    # -- construction ------------------------------------------------------

    @staticmethod
    def _check_offload(offload_policy, device: torch.device):
        """The CPUOffloadPolicy to apply, or None. Every unit is offloaded
        (the pipeline option `offload=` picks units). On a CPU the program is
        the one a GPU runs; host memory is the device's own there."""
        if offload_policy is None or type(offload_policy).__name__ == "OffloadPolicy":
            return None
        if type(offload_policy).__name__ != "CPUOffloadPolicy":
            raise StepError(f"offload_policy must be torch.distributed.fsdp.CPUOffloadPolicy, "
                            f"got {type(offload_policy).__name__}")
        if getattr(offload_policy, "pin_memory", False) and not torch.cuda.is_available():
            raise StepError("CPUOffloadPolicy(pin_memory=True) pins host memory for copies to a GPU, and this "
                            "machine has none; use CPUOffloadPolicy(pin_memory=False)")
        return offload_policy

    def _mesh_of(self, program: Program) -> DeviceMesh:
        """The parameters' DTensor mesh: the program's grid, where a shard
        group spanning all of it (an integer reshard_after_forward splits
        the shard axis in two, for its collectives) is one dimension, as
        FSDP2's parameters keep a 1-D mesh there."""
        shapes = {spec.grid_shape for spec in program.groups.values()}
        shape = max(shapes, key=len) if shapes else (dist.get_world_size(),)
        if len(shape) > 1 and any(_spans_the_grid(program.groups[spec.group]) for spec in program.params
                                  if spec.group is not None):
            shape = (dist.get_world_size(),)
        return init_device_mesh(self.device.type, shape)

    def _placements(self, spec: ParamSpec) -> tuple:
        if spec.group is None:
            return tuple(Replicate() for _ in range(self.mesh.ndim))
        group = self._programs_any().program.groups[spec.group]
        if self.mesh.ndim == 1 and _spans_the_grid(group):  # one flat layout over the grid's ranks in order
            if tuple(self.mesh.mesh.flatten().tolist()) != group.members_of(dist.get_rank()):
                raise StepError(f"the mesh's ranks {self.mesh.mesh.flatten().tolist()} are not the program's group "
                                f"'{group.key}' {group.members_of(dist.get_rank())}: give the mesh in rank order")
            return (Shard(0),)
        if tuple(self.mesh.shape) != group.grid_shape:
            raise StepError(f"the mesh {tuple(self.mesh.shape)} is not the compiled grid {group.grid_shape}")
        if len(group.axes) == 1:  # the DTensor's shard dimension must hold the program's shard group
            ranks = dist.get_process_group_ranks(self.mesh.get_group(group.axes[0]))
            if tuple(ranks) != group.members_of(dist.get_rank()):
                raise StepError(f"mesh dimension {group.axes[0]} groups ranks {ranks}, the program's group "
                                f"'{group.key}' {group.members_of(dist.get_rank())}: give the mesh as "
                                "(replicate, shard) in row-major rank order")
        return tuple(Shard(0) if dim in group.axes else Replicate() for dim in range(self.mesh.ndim))

    def _programs_any(self) -> CompiledProgram:
        return next(iter(self._programs.values()))

    def _shard_rows(self, spec: ParamSpec) -> tuple[int, int]:
        return shard_extent(self._programs_any().program, spec, dist.get_rank())

    def _place_shards(self, model: nn.Module) -> None:
        originals = dict(model.named_parameters(remove_duplicate=False))
        missing = set(self.layout) - set(originals)
        if missing or {n for n in originals if n not in self.layout and
                       not any(n in spec.tied for spec in self.layout.values())}:
            raise StepError(f"the compiled step's parameters {sorted(self.layout)} are not the model's "
                            f"{sorted(originals)}")
        for name, spec in self.layout.items():
            original = originals[name]
            if spec.ignored:  # left alone, as FSDP2 leaves it: the model's own parameter, whole
                if original.is_meta:  # empty until init_weights() or a load, as the shards; the same object
                    torch.utils.swap_tensors(original, nn.Parameter(
                        torch.empty(spec.shape, dtype=original.dtype, device=self.device),
                        requires_grad=original.requires_grad))
                elif not original.is_contiguous():
                    original.data = original.data.contiguous()
                continue
            storage = new_shard(spec, original.dtype, "cpu" if spec.offloaded else self.device)
            if spec.offloaded and self._pin_shards:
                storage = storage.pin_memory()
            begin, real = self._shard_rows(spec)
            local = rows(storage, 0, real)
            if not original.is_meta:
                local.copy_(rows(original.detach(), begin, real))
            self._storage[name] = storage
            value = dtensor_where_it_is(local, self.mesh, self._placements(spec), spec.shape,
                                        _contiguous_strides(spec.shape))
            param = nn.Parameter(value, requires_grad=spec.trainable)
            param._fsdpc_shard = True
            for fqn in (name, *spec.tied):
                owner, leaf = _owner(self, fqn)
                setattr(owner, leaf, param)
                if owner is self:  # a parameter of the root: the model's own slot too
                    setattr(self._original, leaf, param)
                if fqn in originals:
                    _retire(originals[fqn], fqn)
            if not original.is_meta:  # the whole tensor is no longer needed
                original.data = torch.empty(0, dtype=original.dtype, device=original.device)

    def _move_buffers(self) -> None:
        """Buffers the step reads live on its device; meta ones become zeros
        there, empty until init_weights() or a load fills them (a copy into a
        meta tensor does nothing, and DCP would assign instead)."""
        moved: dict[int, torch.Tensor] = {}  # a buffer under two names stays one tensor
        for name, buffer in list(self.named_buffers(remove_duplicate=False)):
            if buffer.device == self.device:
                continue
            owner, leaf = _owner(self, name)
            placed = (torch.zeros(buffer.shape, dtype=buffer.dtype, device=self.device) if buffer.is_meta
                      else buffer.to(self.device))
            owner._buffers[leaf] = moved.setdefault(id(buffer), placed)
            if owner is self:
                self._original._buffers[leaf] = owner._buffers[leaf]

    def _apply(self, fn, recurse=True):
        """What `.to()`, `.half()`, `.cuda()`, `.to_empty()` and the like
        run: the compiled step fixes every parameter's and buffer's dtype and
        device, and the shards live in storage the step reads, so a
        conversion that changes nothing passes (`model.to(its device)`) and
        one that would change something is refused before anything changes
        (FSDP2 casts its shards; here the step would compute in the old
        dtype and fail when it hands back gradients). Buffers still on meta
        are left to init_weights()."""
        for kind, name, tensor in [*(("parameter", n, t) for n, t in self.named_parameters()),
                                   *(("buffer", n, t) for n, t in self.named_buffers())]:
            if tensor.is_meta:
                continue
            probe = fn(torch.empty(0, dtype=tensor.dtype, device=tensor.device))
            if probe.dtype != tensor.dtype or probe.device != tensor.device:
                raise StepError(
                    f"{kind} '{name}' would become {str(probe.dtype).removeprefix('torch.')} on {probe.device}; "
                    f"the sharded step was compiled for {str(tensor.dtype).removeprefix('torch.')} on "
                    f"{tensor.device}: convert the model before fsdpc.shard (model.to(...)), or pass "
                    "mp_policy=MixedPrecisionPolicy(param_dtype=...) for low-precision compute")
        return self

    def _loaded(self, incompatible_keys) -> None:
        """What a load filled holds values: every entry it had (a partial
        load's missing keys stay empty; non-persistent buffers are in no
        state dict)."""
        filled = set(self.state_dict()) - set(incompatible_keys.missing_keys)
        self._filled |= {name for name in [*self.layout, *(n for n, _ in self.named_buffers())]
                         if any(alias in filled for alias in (name, *self._aliases(name)))}
        self._empty -= self._filled

    def _aliases(self, name: str) -> tuple[str, ...]:
        spec = self.layout.get(name)
        return spec.tied if spec is not None else ()

    # -- programs ----------------------------------------------------------

    @contextlib.contextmanager
    def _capture_view(self, train: bool) -> Iterator[nn.Module]:
        """The original model with meta tensors of every parameter and buffer
        in place of the shards (capture needs shapes only), in the mode of
        the call: training, or forward only."""
        slots = []
        meta_of: dict[int, nn.Parameter] = {}
        for fqn, param in self.named_parameters(remove_duplicate=False):
            owner, leaf = _owner(self._original, fqn)
            shape, dtype = tuple(param.shape), param.dtype
            if id(param) not in meta_of:
                meta_of[id(param)] = nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"),
                                                  requires_grad=param.requires_grad and train)
            slots.append((owner, leaf, "param", param, meta_of[id(param)]))
        for fqn, buffer in self.named_buffers(remove_duplicate=False):
            owner, leaf = _owner(self._original, fqn)
            slots.append((owner, leaf, "buffer", buffer, torch.empty(buffer.shape, dtype=buffer.dtype, device="meta")))
        model = self._original
        mode = model.training
        try:
            for owner, leaf, kind, _, meta in slots:
                (owner._parameters if kind == "param" else owner._buffers)[leaf] = meta
            model.training = self.training  # the submodules are ours: each traces in its own mode, as in eager
            self._model_lent.on = True
            yield model
        finally:
            self._model_lent.on = False
            model.training = mode
            for owner, leaf, kind, real, _ in slots:
                (owner._parameters if kind == "param" else owner._buffers)[leaf] = real

    def _buffer_types(self) -> tuple:
        """Each buffer's shape and dtype: one replaced by a buffer of another
        (`model.scale = torch.ones(6)`) compiles the step for it, as eager
        computes with it."""
        return tuple(None if buffer is None else (tuple(buffer.shape), buffer.dtype)
                     for buffer in (owner._buffers[leaf] for owner, leaf in self._buffer_slots.values()))

    def _modes_apart(self) -> tuple[str, ...]:
        """The modules in the other mode than the sharded module (an encoder
        kept in eval while the rest trains): each is traced in its own mode,
        so they key the programs."""
        return tuple(name for name, module in self._hooked_modules.items()
                     if name and module.training != self.training)

    def _attribute_values(self) -> tuple:
        """The current values of the watched reads, in `_watched`'s order."""
        return tuple(watched.read() for watched in self._watched)

    def _in_mode(self, values: tuple, mode: tuple) -> tuple:
        """The watched reads' `values` as the programs of `mode` (train,
        training, the modules apart) are keyed by: `_UNREAD` for those not
        reaching its steps."""
        unread = self._unread.get(mode, ())
        return tuple(_UNREAD if index in unread else value for index, value in enumerate(values))

    def _attributes_changed(self, values: tuple) -> str:
        """The watched reads whose `values` (`_in_mode`) differ from those
        first compiled with, for the per-call agreement (usually nothing)."""
        changed = [f"{watched.name}={value!r}" for watched, value in zip(self._watched, values)
                   if value is not _UNREAD and value != watched.baseline]
        return f", attributes changed since compiling: {', '.join(changed)}" if changed else ""

    def _same_step_for_other_values(self, key: tuple, compiled: CompiledProgram) -> CompiledProgram | None:
        """Where a step compiled for changed read values is the step compiled
        for the earlier ones (the same IR), the values that differ do not
        reach the steps of this mode (a step counter that a logging helper
        reads, an untaken branch, a dropout's p in eval): they are watched
        no more in it, so that a loop changing them every call does not
        compile every call, and the earlier program serves. Other modes
        still watch them (p reaches the training step). Every rank decides
        alike: the same programs."""
        mode = key[:3]
        for other_key, other in self._programs.items():
            if other_key[:-1] != key[:-1] or len(other_key[-1]) != len(key[-1]) \
                    or other.sharded_ir != compiled.sharded_ir:
                continue
            differing = {index for index, (now, before) in enumerate(zip(key[-1], other_key[-1])) if now != before}
            self._unwatched.update(self._watched[index].name for index in differing)
            self._unread[mode] = self._unread.get(mode, frozenset()) | differing
            self._programs = {
                held_key[:-1] + (self._in_mode(held_key[-1], mode),) if held_key[:3] == mode else held_key: program
                for held_key, program in self._programs.items()
                if held_key[:3] != mode or len(held_key[-1]) == len(key[-1])}
            return other
        return None

    def _signature(self, batch: Sequence[torch.Tensor], train: bool, frozen: tuple[str, ...],
                   read: tuple[tuple[str, ...], tuple, torch.dtype | None] | None = None) -> tuple:
        """What picks a program: mode (and the modules in the other one),
        batch shapes, buffer shapes and dtypes, frozen parameters, the
        options set since fsdpc.shard, the autocast the call runs under, torch's default dtype (which
        factories without a dtype make), its deterministic-algorithms switch
        and attention backend switches (which pick kernels), and the values
        of the module attributes the steps read (`read`: the modes apart,
        the values and the autocast, where the call has them already)."""
        modes, values, autocast = read or (self._modes_apart(), self._attribute_values(),
                                           ambient_autocast(self.device.type))
        return (train, self.training, modes, tuple((tuple(t.shape), t.dtype) for t in batch), self._buffer_types(),
                frozen if train else (), tuple(sorted(self._overrides.items())) if train else (), autocast,
                (torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled(), backend_switches(self.device.type)),
                self._in_mode(values, (train, self.training, modes)))

    def _program_for(self, batch: Sequence[torch.Tensor], *, train: bool, frozen: tuple[str, ...],
                     read: tuple[tuple[str, ...], tuple, torch.dtype | None] | None = None) -> CompiledProgram:
        found = self._programs.get(self._signature(batch, train, frozen, read))
        if found is not None:
            return found
        config = self._config
        options = _with_overrides(config["options"], self._overrides)
        if not train:  # nothing to reduce, nothing to accumulate
            options = " ".join(o for o in options.split()
                               if not o.startswith(("gradient-accumulation", "gradient-divide-factor")))
        self.wait_for_host_optimizer()  # capture swaps the module's parameters, which the host thread steps
        try:
            with self._capture_view(train) as model:
                shapes = tree_unflatten([torch.empty(t.shape, dtype=t.dtype, device="meta") for t in batch],
                                        self._batch_structure)
                # The first step's calls are compared across ranks: the Python a later one runs (another
                # shape, mode or option) reads the same values.
                compiled = compile_program(model, shapes, config["loss_fn"], options=options, wrap=config["wrap"],
                                           mixed_precision=config["mixed_precision"], device=self.device,
                                           scaled_loss=train and self._grad_scaler is not None,
                                           compare_calls=not self._programs)
        except StepError as error:
            if not self._programs or _describe(batch) == _describe(self._example):
                raise
            raise StepError(f"{error}\n(the batch {_describe(batch)} is new: the step was compiled for "
                            f"{_describe(self._example)})") from error
        if self._programs:
            self._check_same_layout(compiled.program)
        self._make_groups(compiled.program)
        known = {watched.name for watched in self._watched}
        for path, name in compiled.attribute_reads:
            if f"{path or 'the model'}.{name}" not in known:
                read = functools.partial(read_attribute, self._original.get_submodule(path), name, _ABSENT)
                self._watched.append(_Watched(f"{path or 'the model'}.{name}", read, read()))
        # A function swapped in since (a global or closure naming another) reads values of its own, or the
        # same names in its own closure: each read is found again, read from what the step now calls.
        fresh = dict(free_variable_reads(config["loss_fn"], self._original))
        for index, watched in enumerate(self._watched):
            if watched.name in fresh:
                self._watched[index] = dataclasses.replace(watched, read=fresh.pop(watched.name))
        self._watched.extend(_Watched(described, read, read()) for described, read in fresh.items())
        key = self._signature(batch, train, frozen)  # the values the step now holds
        same = self._same_step_for_other_values(key, compiled)
        if same is not None:
            return same
        self._programs[key] = compiled
        self._say_if_many_shapes()
        self._say_if_many_values()
        if train:
            self._say_if_fp16(compiled)
        return compiled

    def _program_among(self, sizes_by_rank: list, batch: Sequence[torch.Tensor], *, train: bool,
                       frozen: tuple[str, ...], read: tuple) -> CompiledProgram:
        """This rank's program where the ranks' batches differ in size: every
        rank takes (or compiles, together, in rank order) the program of
        every size any rank has, so each holds them all and checks the same
        thing: that they issue the same collectives, which a mismatch would
        pair wrongly. FSDP2 lets each rank's batch be its own too."""
        programs: dict[tuple, CompiledProgram] = {}
        for sizes in sizes_by_rank:
            if sizes not in programs:
                programs[sizes] = self._program_for(_meta_batch(sizes, batch), train=train, frozen=frozen, read=read)
        if len({compiled.program.collective_schedule for compiled in programs.values()}) > 1:
            raise StepError("the ranks' batches differ in size (" + "; ".join(
                f"rank {rank}: {', '.join(str(s) for s in sizes)}" for rank, sizes in enumerate(sizes_by_rank)) +
                "), and the steps compiled for those sizes issue different collectives (their memory plans "
                "differ): nothing was communicated; pad every rank's batch to one size")
        return programs[tuple(tuple(t.shape) for t in batch)]

    def _say_if_many_shapes(self) -> None:
        """Warns once when steps were compiled for MANY_SHAPES batch shapes:
        variable-length batches compile a step per length (seconds cold, a
        cache hit warm) and keep each loaded."""
        shapes = {key[3] for key in self._programs}  # _signature's batch shapes
        if len(shapes) < MANY_SHAPES or self._warned_many_shapes:
            return
        self._warned_many_shapes = True
        warnings.warn(f"fsdpc compiled steps for {len(shapes)} batch shapes ({self._compile_seconds():.1f} s so far): "
                      "each new shape compiles one (or loads it from the cache) and keeps it loaded; pad batches to "
                      "a few fixed lengths (buckets), or to one", stacklevel=user_stacklevel())

    def _say_if_fp16(self, compiled: CompiledProgram) -> None:
        """Warns once (rank 0) when a training step computes in float16
        (autocast, mp_policy or the model's own dtype) without a
        `grad_scaler`: PyTorch pairs float16 with loss scaling."""
        if self._warned_fp16 or self._grad_scaler is not None or dist.get_rank() != 0 \
                or not re.search(r"[<x]f16>", compiled.sharded_ir):
            return
        self._warned_fp16 = True
        warnings.warn("fsdpc: the training step computes in float16 without loss scaling: gradients smaller than "
                      "float16's 6e-8 become zero; pass grad_scaler=ShardedGradScaler() to fsdpc.shard (then "
                      "scaler.unscale_, step and update as with FSDP2), or compute in bfloat16, which has "
                      "float32's range", stacklevel=user_stacklevel())

    def _compile_seconds(self) -> float:
        """Seconds spent compiling (or loading) the programs held."""
        return sum(sum(program.compile_seconds.values()) for program in self._programs.values())

    def _say_if_many_values(self) -> None:
        """Warns once when steps were compiled for MANY_SHAPES values of what
        they read (module attributes, loss_fn's variables): a value changed
        every step (a loss weight annealed by the loop) compiles a step each
        time, since the step holds it as a constant."""
        values = {key[-1] for key in self._programs}  # _signature's read values
        if len(values) < MANY_SHAPES or self._warned_many_values:
            return
        self._warned_many_values = True
        current = [read for read in values if len(read) == len(self._watched)]
        changing = [watched.name for index, watched in enumerate(self._watched)
                    if len({read[index] for read in current}) > 1]
        warnings.warn(f"fsdpc compiled steps for {len(values)} values of {', '.join(changing)} "
                      f"({self._compile_seconds():.1f} s so far): the step holds such plain values as constants, so "
                      "each new one compiles a step (or loads it from the cache); pass a value that changes every "
                      "step as a tensor in the batch", stacklevel=user_stacklevel())

    def _let_graphs_go(self) -> None:
        """Every step replayed as a CUDA graph lets its graph and the working
        memory it keeps reserved go (the next call captures again)."""
        for compiled, _ in self._replaying.values():
            compiled.runtime.release_replays()
        self._replaying.clear()

    def _replay_one_shape(self, compiled: CompiledProgram, train: bool, batch: Sequence[torch.Tensor]) -> None:
        """A call replayed as a CUDA graph on a batch of another shape than
        the last call in this mode lets that shape's graphs go: each graph
        keeps its step's working memory reserved, so one per shape would
        add up. Said once: alternating shapes capture again each time."""
        mode, shapes = (train, self.training), tuple(tuple(t.shape) for t in batch)
        previous = self._replaying.get(mode)
        self._replaying[mode] = (compiled, shapes)
        if previous is None or previous[0] is compiled:
            return
        previous[0].runtime.release_replays()
        # Another program for the same shapes (options, frozen parameters or
        # attributes changed) is a one-off; alternating shapes is what repeats.
        if previous[1] != shapes and not self._warned_replay_shapes:
            self._warned_replay_shapes = True
            warnings.warn(f"fsdpc: the step is replayed as a CUDA graph and the batch {_describe(batch)} has "
                          "another shape than the last call's: that shape's graph and its memory are let go, and "
                          "each change of shape captures anew (about an eager step more); pad batches to one "
                          "shape to replay one graph", stacklevel=user_stacklevel())

    def _check_same_layout(self, program: Program) -> None:
        def layout(spec: ParamSpec):
            return spec.shape, spec.dtype, spec.group, spec.shard_rows, spec.padding

        for spec in program.params:
            known = self.layout.get(spec.name)
            if known is None or layout(known) != layout(spec):
                raise StepError(f"parameter '{spec.name}' is laid out differently in the new step's program")

    def _make_groups(self, program: Program) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        if collective_backend(self.device) == "nccl" and not DUMPS_OFF_BEFORE_FIRST_GROUP:
            warnings.warn("the job's first process group was created with TORCH_NCCL_DUMP_ON_TIMEOUT on (fsdpc was "
                          "imported after init_process_group, or the job set it): after a collective fails, "
                          "PyTorch's NCCL monitor ends this process 8 minutes later, and its exit waits for that; "
                          "import fsdpc first, or set TORCH_NCCL_DUMP_ON_TIMEOUT=0 (fsdpc/watchdog.py)", stacklevel=user_stacklevel())
        for key, spec in program.groups.items():
            if key in self._groups:
                continue
            if len(spec.members) * spec.size != world:
                raise StepError(f"group '{key}' spans {len(spec.members) * spec.size} ranks, the job has {world}")
            for members in spec.members:  # every rank creates every group, in one order
                with _errors_left_to_fsdpc():
                    group = dist.new_group(list(members), timeout=self._timeout)
                if rank in members:
                    self._groups[key] = group

    # -- the step ----------------------------------------------------------

    @property
    def memory_report(self) -> dict:
        """The memory report of the first compiled training step."""
        return self._programs_any().memory_report

    @property
    def compile_seconds(self) -> dict[str, float]:
        return self._programs_any().compile_seconds

    @property
    def sharded_ir(self) -> str:
        return self._programs_any().sharded_ir

    def zero_grad(self, set_to_none: bool = True) -> None:
        """nn.Module's, also dropping gradients accumulated by calls without
        synchronization, as eager's zero_grad drops them from .grad (DDP's
        no_sync too; FSDP2's module keeps them); under overlap_host_optimizer
        an offloaded unit the host thread has yet to step keeps its
        gradients until it has (cleared before, it would step without them,
        or keep them for the next call)."""
        self._drop_accumulated()
        if self._host_optimizer is None:
            super().zero_grad(set_to_none)
        else:
            self._host_optimizer.zero_grad_of(list(self.parameters()), set_to_none)

    def overlap_host_optimizer(self, optimizer: torch.optim.Optimizer, *, in_backward: bool = False) -> None:
        """Runs `optimizer`'s steps of offloaded units on a host thread, beside
        the next call's forward: `optimizer.step()` steps the device's
        parameters and returns, and each offloaded unit's gather waits for
        its own update (python/fsdpc/host_optimizer.py says what else waits).
        Read offloaded parameters between `step()` and the next call only
        after `wait_for_host_optimizer()`.

        `in_backward=True` steps each offloaded unit as soon as a training
        call lands its gradients in host memory, during the call's backward:
        every training call must then be followed by `optimizer.step()`, with
        hyperparameters changed only after it, and without clipping."""
        if self._host_optimizer is not None:
            raise StepError("this module already overlaps an optimizer's host steps")
        if self._grad_scaler is not None and in_backward:
            raise StepError("overlap_host_optimizer(in_backward=True) with a grad_scaler: offloaded units would step "
                            "on scaled gradients before scaler.unscale_ and its overflow check (overlap_host_optimizer("
                            "optimizer) without in_backward steps after them)")
        if self._grad_scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
            raise StepError(f"overlap_host_optimizer with a grad_scaler and {type(optimizer).__name__}, which "
                            "unscales inside its own step (fused): the host thread's steps would not see the "
                            "scaler's overflow flag; use the optimizer without fused=True")
        step = self._programs_any().program.functions.get(STEP)
        named = self._params_by_layout_name()
        order = list(step.host_units) if step else []
        units = [(unit, [(fqn, named[fqn]) for fqn, spec in self.layout.items()
                         if spec.unit == unit and spec.offloaded and spec.trainable])
                 for unit in order]
        landing = None
        if in_backward:
            landing = InBackward(runtime_extension().GradientLandings, self._attach_grad,
                                 self._timeout.total_seconds())
        self._host_optimizer = HostOptimizer(optimizer, units, runtime_extension().HostUpdate, landing,
                                             device=self.device, before_step=_refuse_unreduced)

    @staticmethod
    def _settle_state(module: "ShardedModule", *_) -> None:
        """State dict hooks: state is read or replaced only outside
        unsharded() and once an overlapped optimizer step has finished with it."""
        module._refuse_inside_unsharded("state_dict() or load_state_dict()")
        module.wait_for_host_optimizer()

    def __getattr__(self, name: str):
        """Parameters, buffers and submodules are the sharded module's own;
        other attributes of the model (a Hugging Face `config`, its
        `generation_config`) are read from it. The model's methods are not
        offered: they would run its forward, which the compiled step
        replaced."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in FSDP2_METHODS_INSTEAD:
                raise AttributeError(f"the sharded module has no FSDP2 method '{name}': "
                                     f"{FSDP2_METHODS_INSTEAD[name]}") from None
            original = self.__dict__.get("_original")
            if original is None or name.startswith("__"):
                raise
            value = original.__dict__.get(name)  # the model's own attributes, not its tree (ours)
            if value is not None and not isinstance(value, (nn.Module, torch.Tensor)):
                return value
            if callable(getattr(type(original), name, None)):
                if name in _MODEL_METHODS_INSTEAD:
                    raise AttributeError(f"the sharded module has no '{name}': {_MODEL_METHODS_INSTEAD[name]}") from None
                raise AttributeError(
                    f"the sharded module has no '{name}': it is {type(original).__name__}'s own method, and the "
                    f"sharded module runs the compiled training step; call it on the model with whole "
                    f"parameters: `with sharded.unsharded(per_unit=True) as model: model.{name}(...)` on every "
                    "rank") from None
            raise

    def __setattr__(self, name: str, value) -> None:
        """A plain attribute of the model's own (or of its class, or one its
        step looked for and did not find) set on the sharded module
        (`model.scale = 0.5` after `model = fsdpc.shard(model, ...)`) is set
        on the model, whose forward and loss_fn read it, as on FSDP2's
        module, which is the model itself."""
        original = self.__dict__.get("_original")
        if original is not None and name not in self.__dict__ \
                and not isinstance(value, (nn.Module, torch.Tensor)) and not hasattr(type(self), name) \
                and (name in original.__dict__ or class_setting(type(original), name) or self._probed(name)):
            setattr(original, name, value)
            return
        super().__setattr__(name, value)

    def _probed(self, name: str) -> bool:
        """The model's step looked for `name` on the model and did not find it
        (the sharded module's own attributes, set while it is built, stay its own)."""
        return self.__dict__.get("_built", False) and \
            any(watched.name == f"the model.{name}" for watched in self.__dict__.get("_watched", ()))

    def __deepcopy__(self, memo):
        raise StepError("a sharded module cannot be copied: it holds this rank's shards, its process groups and "
                        "compiled steps; copy the model before fsdpc.shard (an EMA or reference copy), or copy the "
                        "tensors of model.state_dict()")

    def __getstate__(self):
        raise StepError("a sharded module cannot be pickled (torch.save(model)): it holds this rank's shards, its "
                        "process groups and compiled steps; save its state with fsdpc.checkpoint.save (or "
                        "model.full_state_dict())")

    @staticmethod
    def _shard_whole_tensors(module: "ShardedModule", state_dict: dict, prefix: str, *_) -> None:
        """load_state_dict of whole tensors (a pretrained checkpoint, or
        torch.load of what full_state_dict() returned): a parameter's entry
        that is a plain tensor of its full shape becomes this rank's rows of
        it, which the load copies into the shard (FSDP2 refuses such a dict,
        "mixed torch.Tensor and DTensor"; its set_model_state_dict with
        full_state_dict=True works here too)."""
        for fqn, spec in module.layout.items():
            if spec.ignored:  # a plain tensor, loaded as FSDP2 loads it
                continue
            param = module.get_parameter(fqn)
            for name in (fqn, *spec.tied):
                value = state_dict.get(prefix + name)
                if not isinstance(value, torch.Tensor) or isinstance(value, DTensor) \
                        or tuple(value.shape) != tuple(spec.shape):
                    continue  # a DTensor loads as is; a wrong shape gets torch's error, naming it
                local = value
                if spec.group is not None:
                    begin, real = module._shard_rows(spec)
                    local = rows(value, begin, real)
                state_dict[prefix + name] = dtensor_where_it_is(
                    local.to(param._local_tensor.device), param.device_mesh, param.placements, spec.shape,
                    _contiguous_strides(spec.shape))

    def unsharded(self, *, per_unit: bool = False, dtype: torch.dtype | None = None,
                  writeback: bool | None = None) -> contextlib.AbstractContextManager[nn.Module]:
        """A block (on every rank together) in which the model itself holds
        whole parameters and runs eagerly, for what the compiled step does
        not run: generation, evaluation through the model's methods,
        editing weights (FSDP1's summon_full_params, FSDP2's unshard()):

            with sharded.unsharded(per_unit=True) as model:
                tokens = model.generate(prompt, max_new_tokens=32)

        All at once (default): every parameter gathered on entry, and edits
        written back into the shards on a normal exit (`writeback`, default
        True where possible). `per_unit=True`: each wrap unit's parameters
        only while its forward runs (the root unit's throughout), so a rank
        never holds the whole model; every rank must run the same forwards
        (Hugging Face's generate keeps finished ranks in step by itself).
        `dtype`: gather in this floating dtype (bf16 for generation; no
        write-back then). Calls of the sharded module, clipping and state
        dicts are refused inside; gathered parameters require no gradient."""
        from fsdpc.unsharded import Unsharded  # it reads this module's helpers
        return Unsharded(self, per_unit=per_unit, dtype=dtype, writeback=writeback)

    def wait_for_host_optimizer(self) -> None:
        """Returns once an overlapped optimizer step has updated every
        offloaded parameter (raises what it raised, if it failed)."""
        if self._host_optimizer is not None:
            self._host_optimizer.wait()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """FSDP2's switch: False makes the next calls accumulate gradients
        locally, unreduced; the first call after setting True again reduces
        everything accumulated. Needs `gradient_accumulation=True`."""
        if not requires_gradient_sync and NO_SYNC_STEP not in self._programs_any().program.functions:
            raise StepError("set_requires_gradient_sync(False) needs a step compiled for it: "
                            "fsdpc.shard(..., gradient_accumulation=True)")
        self._gradient_sync = requires_gradient_sync

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's and FSDP1's context for gradient accumulation: calls inside
        accumulate their gradients unreduced (set_requires_gradient_sync
        (False) for the block); the first synchronizing call after it
        reduces everything accumulated. Needs `gradient_accumulation=True`."""
        before = self._gradient_sync
        self.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self._gradient_sync = before

    def set_gradient_divide_factor(self, factor: float) -> None:
        """FSDP2's knob: gradients are summed over the ranks and divided by
        `factor` instead of averaged (1: summed, for a loss already divided
        by the whole batch's size, as torchtitan's global token count is).
        The next training call compiles, or loads from the cache, a step that
        reduces so; every rank must set the same factor (a call where they
        differ is refused)."""
        self._overrides["gradient-divide-factor"] = _divide_factor_option(factor)

    def set_reduce_scatter_divide_factor(self, factor: float) -> None:
        """FSDP2's former name of set_gradient_divide_factor."""
        self.set_gradient_divide_factor(factor)

    def set_force_sum_reduction_for_comms(self, enable: bool) -> None:
        """FSDP2's knob for reducing with a sum and dividing after (instead
        of an average or pre-scaled sum): fsdpc's reductions always do, so
        either value leaves the step as it is."""
        if not isinstance(enable, bool):
            raise StepError(f"set_force_sum_reduction_for_comms takes True or False, got {enable!r}")

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        """FSDP2's knob on the root: whether the next training calls free
        each unit's gathered parameters after forward (and gather them again
        in backward) or keep them; `recurse=False` sets the root unit's
        alone. The next training call compiles, or loads, the step for it;
        every rank must set the same (a call where they differ is refused).
        An inner group size (an int) changes the grid: give it to
        fsdpc.shard."""
        if not isinstance(reshard_after_forward, bool):
            raise StepError(f"set_reshard_after_forward takes True or False, got {reshard_after_forward!r}; an "
                            "inner group size changes the grid the shards live on: pass it to "
                            "fsdpc.shard(..., reshard_after_forward=g)")
        self._overrides["reshard-after-forward" if recurse else "reshard-root"] = str(reshard_after_forward).lower()

    # The step is compiled already: torch.compile of the module (a loop ported
    # from FSDP2 + compile) runs the call as it is instead of tracing fsdpc's
    # driver (20 s of recompiles of its Python on the 23M GPT, to no gain).
    @torch.compiler.disable
    def forward(self, *batch, sync: bool | None = None, train: bool | None = None, trace: bool = False,
                **named):
        """Forward and backward on this rank's batch (structured as the
        example batch: tensors, or dicts, lists or tuples of them); returns the loss (or
        `(loss, aux)` where loss_fn returns that) and leaves the gradients on
        the parameters. Under `torch.no_grad()` or in
        eval mode, forward only: the loss, no gradients, no communication of
        gradients. `train` overrides that for one call: True trains with the
        modules in their modes (in eval mode: dropout off, batch norm on its
        running statistics, as eager's backward after `model.eval()`), False
        runs forward only. `sync` overrides set_requires_gradient_sync for one
        call; `trace` records every instruction as it ran (see `write_trace`)."""
        if named:  # `model(**batch)` from a Hugging Face loop; raised on every rank alike, before any collective
            raise StepError(f"the sharded module was called with keyword arguments {_listed(sorted(named))}; it "
                            "takes the batch as fsdpc.shard's example batch was given, positionally: for a dict "
                            "batch, fsdpc.shard(model, (batch,), lambda m, b: m(**b).loss) and then model(batch)")
        self._refuse_failed()
        self._refuse_inside_unsharded("the sharded module called")
        started, caller = time.monotonic(), threading.get_ident()
        said_train = train
        train = torch.is_grad_enabled() and self.training if train is None else bool(train)
        named = self._params_by_layout_name()
        given, structure = tree_flatten(batch)
        batch = given  # its tensors: the program takes them in order
        try:
            self._check_tree()
            self._check_ready()
            self._check_forward_hooks()
            _refuse_module_backward_hooks(self._hooked_modules, " since fsdpc.shard")
            self._check_batch(given, structure)
            self._check_ignored(named)
            if train:
                self._check_gradient_hooks(named, self._gradient_sync if sync is None else sync)
                self._check_accumulated_trainable(named)
            if train and self._host_optimizer is not None and self._host_optimizer.in_backward:
                self._host_optimizer.check_training_call()
            problem = None
        except StepError as error:
            problem = error
        if said_train is None and torch.is_grad_enabled() and not self.training and not self._warned_eval:
            self._warned_eval = True
            warnings.warn("the sharded module is in eval mode: calls run forward only and leave no gradients "
                          "(call .train() to train, or model(batch, train=True) to train with the modules in eval "
                          "mode: dropout off, batch norm on its running statistics)", stacklevel=user_stacklevel())
        sync = self._gradient_sync if sync is None else sync
        name = STEP if (sync or not train) else NO_SYNC_STEP
        kind = (f"a forward-only ({'training' if self.training else 'eval'} mode)" if not train else
                "a synchronizing" if sync else "an accumulating (no gradient sync)")
        frozen = _frozen(named) if train else ()
        if train and not self._warned_all_frozen and not any(p.requires_grad for p in self.parameters()):
            self._warned_all_frozen = True
            warnings.warn("every parameter of the model is frozen (requires_grad False): training calls compute "
                          "the loss and no gradients (eager's loss.backward() would raise); unfreeze parameters to "
                          "train, or call under torch.no_grad() for forward only", stacklevel=user_stacklevel())
        # Read once: they key the program too.
        read = (self._modes_apart(), self._attribute_values(), ambient_autocast(self.device.type))
        # A call that is wrong on one rank is refused on all, before any
        # collective. Batch sizes may differ by rank (each padded to its own
        # longest sequence): they are agreed apart from the rest.
        rest = (f"{_frozen_text(frozen)}{_overrides_text(self._overrides) if train else ''}"
                f"{self._attributes_changed(self._in_mode(read[1], (train, self.training, read[0])))}"
                f"{_modes_text(read[0], self.training)}"
                f"{f' under torch.autocast(dtype={read[2]})' if read[2] else ''}")
        sizes_by_rank = self._agree_on_call(
            f"a call refused with: {problem}" if problem else f"{kind} step on {_describe(batch)}{rest}",
            key=None if problem else f"{kind} step on {_kinds(batch)}{rest}",
            sizes=None if problem else tuple(tuple(t.shape) for t in batch))
        if problem:
            raise problem
        batch = tuple(t.contiguous() for t in batch)  # the program was compiled for dense row-major inputs
        if sizes_by_rank is None:
            compiled = self._program_for(batch, train=train, frozen=frozen, read=read)
        else:
            compiled = self._program_among(sizes_by_rank, batch, train=train, frozen=frozen, read=read)
        if name not in compiled.program.functions:
            raise StepError(f"the step was compiled without '{name}': fsdpc.shard(..., gradient_accumulation=True)")
        if compiled.program.functions[name].cuda_graph and not (trace or self._check_reshard_frees):
            self._replay_one_shape(compiled, train, batch)  # those two run the instructions
        params = {fqn: self._padded(fqn, named[fqn]) for fqn in self.layout}
        accumulated = {}
        if train and sync and NO_SYNC_STEP in compiled.program.functions:
            # Nothing accumulated reads as a zero broadcast to the gradient's
            # shape: one element, not a full-size unsharded gradient.
            accumulated = {spec.name: self._accumulated[spec.name] if spec.name in self._accumulated
                           else torch.zeros((), dtype=named[spec.name].dtype, device=self.device).expand(spec.shape)
                           for spec in compiled.program.params if spec.trainable}
        buffers = {name: owner._buffers[leaf] for name, (owner, leaf) in self._buffer_slots.items()}
        inputs = list(batch)
        if train and self._grad_scaler is not None:  # the loss scale, on the device, read without a sync
            inputs.append(self._grad_scaler.scale(torch.ones((), dtype=torch.float32, device=self.device)))
        updating = self._host_optimizer.pending() if self._host_optimizer else {}
        landings = None  # in backward: the host thread steps each offloaded unit as its gradients land
        if train and sync and self._host_optimizer is not None and self._host_optimizer.in_backward:
            landings = self._host_optimizer.begin_training_call()
        waits = None
        if self.device.type != "cpu":  # collectives may outlive the call (NCCL): the watchdog holds them
            waits = runtime_extension().DeviceWaits()
            WATCHDOG.watch(waits, started + self._timeout.total_seconds(),
                           lambda module, collective, group, function=name, call=self._calls:
                           module._collective_timed_out(function, call, caller, collective),
                           owner=self, device=self.device)
        try:
            out = compiled.runtime.run(name, params, buffers, accumulated, inputs, self._groups,
                                       self._timeout.total_seconds(), trace=trace,
                                       check_reshard_frees=self._check_reshard_frees, host_updates=updating,
                                       device_waits=waits, gradient_landings=landings,
                                       pin_host_results=self._pin_shards)
        except Exception as error:
            if landings is not None:
                landings.close(_first_line(error))
            if updating or landings is not None:
                self._host_optimizer.join()
            failure = self._failure(_first_line(error))
            if failure is None:
                raise  # the watchdog's error, raised in this thread: it named the collective and who is absent
            raise failure from error
        if waits is not None:
            waits.seal()
        if updating and landings is None:
            self._host_optimizer.wait()  # every unit's update is done: each gather waited for its own
        del params, accumulated
        if out["reshard_leaks"]:
            raise StepError(f"rank {dist.get_rank()}: gathered parameters outlived their reshard: "
                            f"{', '.join(out['reshard_leaks'])}")
        if out["replay_abandoned"]:
            cause, _, hints = out["replay_abandoned"].partition("\n")  # CUDA's errors go on with hints
            said = (f"fsdpc: {cause}; this step runs as instructions from now on (one launch per instruction, as "
                    "without cuda-graph=true)")
            warnings.warn(said + ("\n" + hints if hints else ""), stacklevel=user_stacklevel())
        if out["recaptured_for"]:
            warnings.warn(f"fsdpc: the step replayed as a CUDA graph was captured anew: its {out['recaptured_for']} "
                          "is another tensor than at the last capture (a capture costs about an eager step and "
                          "more; keep parameters and buffers in place, e.g. copy_ into them)", stacklevel=user_stacklevel())
        self.last_collectives = out["collectives"]
        if trace:
            self.last_trace = out["trace"]
        if compiled.buffer_updates:  # the step's new running statistics, stored as eager's in-place update would
            new_values = out["returned"][len(out["returned"]) - len(compiled.buffer_updates):]
            for name, value in zip(compiled.buffer_updates, new_values):
                owner, leaf = self._buffer_slots[name]
                owner._buffers[leaf].copy_(value)
        if not train:
            return _returned(compiled.aux, out, trained=False)
        if not sync:
            for fqn, grad in out["grads"].items():
                self._accumulated[fqn] = self._accumulated[fqn] + grad if fqn in self._accumulated else grad
                _UNREDUCED[named[fqn]] = fqn
            return _returned(compiled.aux, out, trained=True)
        self._drop_accumulated()
        stepping = self._host_optimizer.stepped_in_backward() if landings is not None else set()
        for fqn, grad in out["grads"].items():
            if fqn not in stepping:  # those the host thread attached as they landed
                self._attach_grad(fqn, named[fqn], grad)
        for fqn in out["grads"]:  # optimizer-in-backward recipes step here, as eager's backward would let them
            param = named[fqn]
            for hook in list((param._post_accumulate_grad_hooks or {}).values()):
                hook(param)
        return _returned(compiled.aux, out, trained=True)

    def _drop_accumulated(self) -> None:
        """Forgets the gradients accumulated since the last synchronizing
        call: that call reduced them, or zero_grad drops them."""
        if self._accumulated:
            named = self._params_by_layout_name()
            for fqn in self._accumulated:
                _UNREDUCED.pop(named[fqn], None)
            self._accumulated.clear()

    def _check_accumulated_trainable(self, named: dict[str, nn.Parameter]) -> None:
        """A parameter frozen since an accumulating call gathered a gradient
        for it: a training call's step neither reduces nor returns gradients
        of frozen parameters, so what accumulated would be lost, where eager
        keeps it in .grad for the optimizer."""
        frozen = sorted(fqn for fqn in self._accumulated if not named[fqn].requires_grad)
        if frozen:
            many = len(frozen) > 1
            raise StepError(f"parameter{'s' if many else ''} {_listed(frozen, 3)} {'were' if many else 'was'} frozen "
                            "(requires_grad False) after accumulating calls gathered gradients for "
                            f"{'them' if many else 'it'}, which training calls would drop (eager keeps them in "
                            ".grad): freeze before the first accumulating call or after the synchronizing one, "
                            "or drop them with model.zero_grad()")

    def _check_gradient_hooks(self, named: dict[str, nn.Parameter], sync: bool) -> None:
        """Gradient hooks on the parameters (`register_hook`,
        `register_post_accumulate_grad_hook`) run when a synchronizing call
        attaches the gradients; where they cannot, the call is refused
        instead of leaving them silently unrun."""
        hooked = [fqn for fqn, param in named.items() if param._backward_hooks or param._post_accumulate_grad_hooks]
        if not hooked:
            return
        where = f"parameter '{hooked[0]}'" + (f" (and {len(hooked) - 1} more)" if len(hooked) > 1 else "")
        if not sync:
            raise StepError(f"{where} has a gradient hook, and this call accumulates without syncing: fsdpc keeps a "
                            "microbatch's gradients inside the step, where no hook sees them (hooks run when a "
                            "synchronizing call attaches the gradients); remove the hooks or accumulate in the loop")
        if self._host_optimizer is not None and self._host_optimizer.in_backward:
            raise StepError(f"{where} has a gradient hook, and the host optimizer steps offloaded units as their "
                            "gradients land, on its own thread: use one or the other")

    def _attach_grad(self, fqn: str, param: nn.Parameter, grad: torch.Tensor) -> None:
        """A step's gradient (this rank's padded shard of `fqn`) onto the
        parameter's `.grad`, or added to the one there. The host thread
        passes the parameter it holds: compiling another program swaps the
        module's own for a while."""
        local = rows(grad, 0, self._local_rows[fqn])
        incoming = None
        if param._backward_hooks:  # register_hook: each sees this call's gradient first, as in autograd
            incoming = _gradient_of(param, local)
            for hook in list(param._backward_hooks.values()):
                changed = hook(incoming)
                incoming = incoming if changed is None else changed
            local = _local(incoming)
        if param.grad is None:
            param.grad = incoming if incoming is not None else _gradient_of(param, local)
        else:
            _local(param.grad).add_(local)

    def _fail(self, reason: str) -> bool:
        """Marks the module failed: it refuses further calls, and the
        watchdog forgets its steps. True for the first failure only."""
        with self._failing:
            if self._failed:
                return False
            self._failed = reason
        WATCHDOG.cancel(self)
        return True

    def _abort_collectives(self) -> None:
        """After a failure on a GPU, collectives may still be in flight,
        waited for by nothing: aborting their communicators ends them, so
        that neither the GPU nor a host thread synchronizing with it hangs."""
        if self.device.type != "cpu":
            for group in self._groups.values():
                try:
                    group.abort()
                except Exception as error:  # an abort that overran its timeout: the others still go
                    print(f"fsdpc: aborting a process group failed: {error}", file=sys.stderr, flush=True)

    def _failure(self, reason: str, message: str | None = None) -> StepError | None:
        """After a collective of a call, the agreement or the clipping
        failed: the module is failed for `reason`, its collectives aborted,
        and the error to raise is `message` (else `reason`) with the roll
        call's verdict. None where the module had failed already: the
        watchdog's error, raised in this thread, then passes unchanged."""
        if not self._fail(reason):
            return None
        self._abort_collectives()
        absent = liveness.roll_call(self._serial, self._calls)
        return StepError(f"{message or reason}{absent}; this module refuses further calls")

    def _collective_timed_out(self, function: str, call: int, caller: int, collective: str, *,
                              since: str | None = None) -> None:
        """The watchdog found `collective` of call `call` unfinished at the
        call's deadline: the same named error as a collective that timed out
        on the host, raised in the thread that made the call."""
        since = since or f"call {call}'s start"
        reason = (f"fsdp_rt: rank {dist.get_rank()}: @{function}: {collective} did not complete on "
                  f"{self.device} within {self._timeout.total_seconds():g} s of {since}")
        if not self._fail(reason):
            return
        message = f"{reason}{liveness.roll_call(self._serial, call)}; this module refuses further calls"
        print(f"fsdpc: {message}", file=sys.stderr, flush=True)
        # Raised before the abort: the caller's thread may be blocked on the
        # GPU, and must not go on with this call's results once it is not.
        interrupt(caller, StepError, message)
        self._abort_collectives()

    def _watch_stream(self, function: str, collective: str, group: str, started: float, caller: int, *,
                      since: str) -> None:
        """Collectives outside a step that the current device stream now
        waits for, and no host thread: the watchdog fails them, with the
        step's named error, if the stream has not passed them within the
        timeout of `started`."""
        WATCHDOG.watch(_StreamPoint(self.device, collective, group), started + self._timeout.total_seconds(),
                       lambda module, what, _, call=self._calls: module._collective_timed_out(
                           function, call, caller, what, since=since),
                       owner=self, device=self.device)

    def _agree_on_call(self, description: str, *, key: str | None = None,
                       sizes: tuple | None = None) -> list | None:
        """Before any collective of a call, every rank checks that all run the
        same kind of step (one small all-gather): `key` (default: the
        `description` the refusal shows) and, apart, the batch's `sizes`.
        Returns every rank's sizes where only those differ, else None."""
        self._calls += 1
        if self._heartbeat:
            self._heartbeat.entered_call(self._serial, self._calls)
        if dist.get_world_size() == 1:
            return None  # nobody to disagree with

        def digest(text: str) -> int:
            return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")

        mine = torch.tensor([digest(key or description), self._calls, digest(repr(sizes))], dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        try:
            dist.all_gather(everyone, mine, group=self._control)
        except Exception as error:
            failure = self._failure("the per-call agreement failed",
                                    f"rank {dist.get_rank()}: call {self._calls} could not agree with the other ranks "
                                    f"within {self._timeout.total_seconds():g} s (the per-call all-gather on group "
                                    f"'fsdpc control': {_first_line(error)})")
            if failure is None:
                raise  # the watchdog's error for the previous call, raised in this thread
            raise failure from error
        if all(torch.equal(other, mine) for other in everyone):
            return None
        if sizes is not None and all(torch.equal(other[:2], mine[:2]) for other in everyone):
            sizes_by_rank: list = [None] * dist.get_world_size()
            dist.all_gather_object(sizes_by_rank, sizes, group=self._control)
            return sizes_by_rank
        descriptions: list = [None] * dist.get_world_size()
        dist.all_gather_object(descriptions, f"call {self._calls}: {description}", group=self._control)
        raise StepError("the ranks disagree about this call, and nothing was communicated for it: " +
                        "; ".join(f"rank {rank} runs {text}" for rank, text in enumerate(descriptions)))

    def _refuse_failed(self) -> None:
        if self._failed:
            raise StepError(f"an earlier call failed mid-step ({self._failed}); collectives may be left "
                            "in flight: rebuild the sharded module (and load a checkpoint) to go on")

    def _refuse_inside_unsharded(self, what: str) -> None:
        """Inside unsharded() the model's slots hold whole parameters, so
        nothing that reads or replaces the shards runs."""
        if self._unsharded is not None:
            raise StepError(f"{what} inside {self._unsharded.describe()}: the model holds whole parameters "
                            "there, not the shards it reads; leave the block first (the model it yielded runs "
                            "eagerly inside)")

    def _check_forward_hooks(self) -> None:
        now = _forward_hook_ids(self._hooked_modules.values())
        if now == self._compiled_hooks:
            return
        changed = next(name or "the model" for name, hooks, compiled in
                       zip(self._hooked_modules, now, self._compiled_hooks) if hooks != compiled)
        raise StepError(f"the forward hooks on {changed} changed after fsdpc.shard compiled the step: a model's "
                        "hooks are traced into the step when it is compiled (once, on meta tensors), not run per "
                        "call; register them before fsdpc.shard (what they compute is compiled in, their side "
                        "effects happen once), or hook the sharded module itself, whose hooks run around every call")

    def _check_tree(self) -> None:
        changes = list(dict.fromkeys(self._tree_watch.changes))
        if changes:
            more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
            were = "was" if len(changes) == 1 else "were"
            raise StepError(f"{', '.join(changes[:3])}{more} of the model {were} assigned after fsdpc.shard compiled "
                            "the step, which reads the parameters of the model as it was sharded: change the model "
                            "before fsdpc.shard (resize_token_embeddings, get_peft_model, a new head; load_state_dict "
                            "without assign=True), then shard it")

    def _check_ready(self) -> None:
        if not self._empty:
            return
        params = sorted(name for name in self._empty if name in self.layout)
        if len(params) == len(self.layout):
            raise StepError("the parameters were created on the meta device and hold no values yet: call "
                            "init_weights() or load a checkpoint (fsdpc.checkpoint.load) first")
        buffers = sorted(self._empty - set(params))
        empty = " and ".join(f"{kind} {_listed(names)}" for kind, names in (("parameters", params),
                                                                            ("buffers", buffers)) if names)
        raise StepError(f"{empty} hold no values yet: built on the meta device, no load filled them (a partial "
                        "load's missing keys; non-persistent buffers are in no state dict); call init_weights(), "
                        "which initializes those and keeps every value loaded, or load a checkpoint that has them")

    def _check_batch(self, batch: Sequence[torch.Tensor], structure: TreeSpec) -> None:
        if structure != self._batch_structure and len(batch) == len(self._example):
            raise StepError(f"the batch is structured {structure}; the step was compiled for "
                            f"{self._batch_structure} (tensors in dicts, lists or tuples as in the example batch)")
        if len(batch) != len(self._example):
            raise StepError(f"the step takes {len(self._example)} batch tensors "
                            f"({_describe(self._example)}), got {len(batch)}")
        for index, (given, example) in enumerate(zip(batch, self._example)):
            if not isinstance(given, torch.Tensor):
                raise StepError(f"batch argument {index} is a {type(given).__name__}, not a tensor")
            if given.device != self.device:
                raise StepError(f"batch argument {index} is on {given.device}; the step runs on {self.device}, "
                                "where the example batch was")
            if given.dim() != example.dim() or given.dtype != example.dtype:
                raise StepError(f"batch argument {index} is {_describe([given])}, the step was compiled for "
                                f"{_describe([example])}: only sizes may change between calls")
            if given.requires_grad and torch.is_grad_enabled():
                raise StepError(f"batch argument {index} requires grad: the step computes the gradients of the "
                                "model's parameters only, so it would get none (eager PyTorch fills its .grad); a "
                                "tensor that learns belongs in the model as a parameter (a soft prompt: an "
                                "nn.Parameter of the model), and one that does not can be detach()ed")

    def _check_ignored(self, named: dict[str, nn.Parameter]) -> None:
        """The ignored parameters, which the step reads in place, are still
        what it was compiled for (`.data =` bypasses the module's checks)."""
        for fqn, dtype in self._ignored.items():
            value, spec = named[fqn], self.layout[fqn]
            if (tuple(value.shape) != spec.shape or value.dtype != dtype or value.device != self.device or
                    not value.is_contiguous()):
                raise StepError(f"ignored parameter '{fqn}' is now {_describe([value])} on {value.device}"
                                f"{'' if value.is_contiguous() else ', not contiguous'}; the step reads it in place "
                                f"and was compiled for {_describe([torch.empty(spec.shape, dtype=dtype, device='meta')])}"
                                f" on {self.device}, contiguous")

    def _padded(self, fqn: str, param: nn.Parameter) -> torch.Tensor:
        """The padded shard the program reads, holding the parameter's
        current values (a load that replaced the local tensor is copied in)."""
        storage = self._storage.get(fqn)
        if storage is None:  # an ignored parameter: the program reads it in place
            return param.detach()
        local = param._local_tensor  # not to_local(): an autograd function per parameter and call
        if local.numel() and local.data_ptr() != storage.data_ptr():
            self.wait_for_host_optimizer()  # it may still be stepping the tensor that replaced the shard
            rows(storage, 0, local.shape[0] if local.dim() else 1).copy_(local)
        return storage

    # -- initialization ----------------------------------------------------

    def init_weights(self, init: Callable[[nn.Module], None] | None = None, *, seed: int | None = None) -> None:
        """Fills the shards of a model built on the meta device, each rank
        only its own rows: `init(module)` for every module (default: its
        `reset_parameters()`, children before parents). Shards are drawn
        from a stream per shard index, so replicas of a shard agree;
        replicated parameters and buffers are broadcast from rank 0.

        What a load filled is kept: after a load that left some tensors
        empty (a new head missing from a pretrained checkpoint,
        non-persistent buffers such as rotary tables or masks) only those
        are initialized. Where nothing was loaded and every tensor holds
        values, all are initialized anew."""
        self._refuse_inside_unsharded("init_weights()")
        self.wait_for_host_optimizer()
        kept = self._values_held(lambda name: name not in self._empty if self._empty else name in self._filled)
        base = int(torch.randint(0, 2**31, (1,))) if seed is None else seed
        shard_index = self.mesh.get_local_rank(self.mesh.ndim - 1)
        with torch.random.fork_rng(devices=seed_generators(self.device)), torch.no_grad(), \
                _draws_from_each_ranks_generator(self.mesh):
            torch.manual_seed(base + shard_index)
            for module in reversed([self._original, *list(self.modules())[1:]]):
                if init is not None:
                    init(module)
                elif callable(getattr(type(module), "reset_parameters", None)):
                    module.reset_parameters()
            for name, value in kept.items():
                if name in self._param_slots:
                    owner, leaf = self._param_slots[name]
                    _local(owner._parameters[leaf]).copy_(value)
                else:
                    owner, leaf = _owner(self, name)
                    owner._buffers[leaf].copy_(value)
        self._broadcast_replicated(ignored=True)
        self._empty = set()

    def _params_by_layout_name(self) -> dict[str, nn.Parameter]:
        """The parameters by the layout's names (a tied parameter by the one
        capture chose, which need not be the first named_parameters gives)."""
        return {fqn: owner._parameters[leaf] for fqn, (owner, leaf) in self._param_slots.items()}

    def _values_held(self, kept: Callable[[str], bool]) -> dict[str, torch.Tensor]:
        """A copy in host memory (a pretrained model's shards may fill the
        device) of every local shard and buffer whose name is `kept`, for
        init_weights to put back after initializing the rest."""
        held = {fqn: _local(owner._parameters[leaf]).to("cpu", copy=True)
                for fqn, (owner, leaf) in self._param_slots.items() if kept(fqn)}
        held.update({name: buffer.to("cpu", copy=True) for name, buffer in self.named_buffers() if kept(name)})
        return held

    def _broadcast_replicated(self, *, ignored: bool) -> None:
        """Rank 0's replicated parameters (its first replica's shards on a
        2-D mesh) and buffers on every rank; with `ignored`, the ignored
        parameters too (init_weights: they start as one model's would; at
        fsdpc.shard each rank keeps its own, as FSDP2 leaves them)."""
        named = self._params_by_layout_name()
        for fqn, spec in self.layout.items():
            if spec.ignored and not ignored:
                continue
            tensor = self._padded(fqn, named[fqn])
            if spec.group is None:
                dist.broadcast(tensor, src=0)
                continue
            for dim, placement in enumerate(self._placements(spec)):
                if isinstance(placement, Replicate):  # replicas of a shard (hybrid): from the first replica
                    moved = tensor.to(self.device)  # an offloaded shard travels through the device
                    dist.broadcast(moved, group=self.mesh.get_group(dim), group_src=0)
                    if moved is not tensor:
                        tensor.copy_(moved)
        for _, buffer in self.named_buffers():
            dist.broadcast(buffer, src=0)

    # -- gradients ---------------------------------------------------------

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, *,
                        error_if_nonfinite: bool | None = None, foreach: bool | None = None) -> torch.Tensor:
        """Scales every gradient so that their global norm (over all ranks,
        padding excluded) is at most `max_norm`; returns the norm before
        clipping. A non-finite norm raises, and nothing is scaled. With
        `error_if_nonfinite=False` it is returned instead, nothing scaled
        either, and the host does not wait for the norm (clip.py: a fused
        norm and scale per device and dtype, one all-reduce per shard group).
        Unset, it is False with a `grad_scaler`, whose overflowed steps are
        expected (scaler.step skips them) and True otherwise. Ignored
        parameters' gradients (each rank's own) are neither counted nor
        scaled: the norm and the scale are the same on every rank.
        `foreach`, torch's, is taken and changes nothing: the launches are
        fused either way."""
        if error_if_nonfinite is None:
            error_if_nonfinite = self._grad_scaler is None
        if self._host_optimizer is not None and self._host_optimizer.in_backward:
            raise StepError("clip_grad_norm_ with the host optimizer stepping in backward: offloaded units step as "
                            "their gradients land, before the global norm is known (overlap_host_optimizer("
                            "optimizer) without in_backward steps after clipping)")
        self._refuse_inside_unsharded("clip_grad_norm_")
        self.wait_for_host_optimizer()
        started, caller = time.monotonic(), threading.get_ident()
        p = float(norm_type)
        grads: dict[str | None, list[torch.Tensor]] = {}  # local gradients by the group that shards them
        for fqn, (owner, leaf) in self._param_slots.items():
            grad = owner._parameters[leaf].grad
            if grad is not None and not self.layout[fqn].ignored:
                grads.setdefault(self.layout[fqn].group, []).append(grad._local_tensor)
        # Every rank reduces over every shard group, in one order, whichever gradients it holds.
        reduced = sorted({spec.group for spec in self.layout.values() if spec.group is not None})
        terms = {group: clip.norm_terms(grads.get(group, []), p, self.device) for group in [None, *reduced]}
        op = dist.ReduceOp.MAX if math.isinf(p) else dist.ReduceOp.SUM
        collective = f"the all-reduce of the gradients' norm on group '{reduced[0]}'" if reduced else ""
        try:
            works = [dist.all_reduce(terms[group], op=op, group=self._groups[group], async_op=True)
                     for group in reduced]
            for work in works:
                work.wait()  # NCCL: orders the stream after it; Gloo: within the group's timeout
        except Exception as error:
            what, first_line = f"clip_grad_norm_: {collective}", _first_line(error)
            failure = self._failure(f"{what}: {first_line}",
                                    f"rank {dist.get_rank()}: {what} failed after call {self._calls}: {first_line}")
            if failure is None:
                raise  # the watchdog's error, raised in this thread
            raise failure from error
        if reduced and self.device.type != "cpu":
            self._watch_stream("clip_grad_norm_", collective, reduced[0], started, caller,
                               since="the clipping's start")
        total = clip.global_norm(list(terms.values()), p)
        if error_if_nonfinite and not bool(torch.isfinite(total)):
            raise StepError(f"the gradients' global {norm_type}-norm is {float(total)}; nothing was clipped")
        clip.scale_([tensor for tensors in grads.values() for tensor in tensors], max_norm, total)
        return total

    # -- state -------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every entry of the state dict unsharded and unpadded (a collective;
        every rank gets the whole dict): for checks, export and inference."""
        self.wait_for_host_optimizer()
        return gather_full_state_dict(self)

    def write_trace(self, path: str | Path | None) -> dict:
        """Gathers the last traced call from every rank; rank 0 writes one
        Chrome/Perfetto trace (a process per rank) to `path`. Returns this
        rank's summary: step time, time blocked in waits (exposed
        communication) and its share of the step."""
        import json

        events = self.last_trace
        if not events:
            raise StepError("no traced call: call the step with trace=True first")
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, events)
        if dist.get_rank() == 0 and path is not None:
            origin = min(e[3] for rank_events in everyone for e in rank_events)
            trace = [{"name": name, "cat": category, "ph": "X", "pid": rank, "tid": 1 if category == "collective" else 0,
                      "ts": start - origin, "dur": duration, "args": {"where": detail} if detail else {}}
                     for rank, rank_events in enumerate(everyone)
                     for name, category, detail, start, duration in rank_events]
            trace += [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
                      for rank in range(len(everyone))]
            Path(path).write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}))
        begin = min(e[3] for e in events)
        end = max(e[3] + e[4] for e in events)
        waited = sum(e[4] for e in events if e[1] == "wait")
        return {"step_us": end - begin, "wait_us": waited, "exposed_comm_share": waited / max(end - begin, 1)}


def shard_extent(program: Program, spec: ParamSpec, rank: int) -> tuple[int, int]:
    """(first logical row, real rows) of `rank`'s shard of a parameter: the
    program's layout (ceil(rows / group size) rows per rank, the last ones
    padded)."""
    if spec.group is None:
        return 0, spec.shard_rows
    members = program.groups[spec.group].members_of(rank)
    begin = min(members.index(rank) * spec.shard_rows, spec.shape[0])
    return begin, min(begin + spec.shard_rows, spec.shape[0]) - begin


def new_shard(spec: ParamSpec, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A rank's padded shard of a parameter, zeroed (padding stays zero):
    the only memory a parameter takes on a rank. A scalar is never sharded."""
    if not spec.shape:
        return torch.zeros((), dtype=dtype, device=device)
    return torch.zeros((spec.shard_rows, *spec.shape[1:]), dtype=dtype, device=device)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter or gradient: a DTensor's local shard,
    an ignored parameter's (a plain tensor's) whole value."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor.detach()


def _gradient_of(param: nn.Parameter, local: torch.Tensor) -> torch.Tensor:
    """`local` as the gradient of `param`: a DTensor like a sharded one's;
    an ignored parameter's, which no reduction copied out of the step, a
    tensor of its own (as autograd's accumulation leaves it), not a view."""
    if isinstance(param, DTensor):
        return _gradient_dtensor(param, local)
    return local if local.is_contiguous() and not local._is_view() else local.clone(
        memory_format=torch.contiguous_format)


def _gradient_dtensor(param: nn.Parameter, local: torch.Tensor) -> DTensor:
    """`local` as the gradient of `param`, sharing the parameter's sharding
    spec (mesh, placements, global shape, stride and dtype), as FSDP2 builds
    its gradients: `from_local` would build a spec through an autograd
    function, per parameter and step. The program returns every gradient in
    its parameter's dtype (reduce_dtype is cast back inside the step)."""
    if local.dtype != param.dtype:
        raise StepError(f"the program returned a {local.dtype} gradient for a {param.dtype} parameter of shape "
                        f"{tuple(param.shape)}: the compiled step and this module disagree")
    return DTensor(local, param._spec, requires_grad=False)


def _refuse_module_backward_hooks(modules: Mapping[str, nn.Module], when: str) -> None:
    """Module backward hooks (register_full_backward_hook and its pre and
    old forms) fire at module boundaries of eager's autograd graph, which the
    compiled step's backward does not have: they would not run, and the
    gradients would differ from eager's silently. Global ones (a profiler's)
    are not the model's and are left out."""
    hooked = [name for name, module in modules.items() if module._backward_hooks or module._backward_pre_hooks]
    if hooked:
        raise StepError(f"{_modules_named(hooked)} hooked{when} with a module backward hook "
                        "(register_full_backward_hook, register_full_backward_pre_hook or register_backward_hook), "
                        "which the compiled step does not "
                        "run: its backward has no module boundaries; compute what the hook does in a custom "
                        "torch.autograd.Function called in forward (captured with its backward), or hook a parameter "
                        "(register_hook runs on its reduced gradient)")


def _forward_hook_ids(modules: Iterable[nn.Module]) -> tuple:
    """Each module's forward pre-hooks and hooks, by handle: a change is a
    hook added or removed. Global module hooks (profilers and FLOP counters
    add them around calls) are not the model's and are left out."""
    return tuple((tuple(module._forward_pre_hooks), tuple(module._forward_hooks)) for module in modules)


def _check_grad_scaler(scaler, world: int) -> None:
    """A GradScaler for fsdpc.shard's `grad_scaler`: on more than one rank,
    one that agrees across ranks on skipping a step (FSDP2's
    ShardedGradScaler all-reduces what each rank found in its shards)."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    if scaler is None:
        return
    if not isinstance(scaler, torch.amp.GradScaler):
        raise StepError(f"grad_scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    if world > 1 and scaler.is_enabled() and not isinstance(scaler, ShardedGradScaler):
        raise StepError("grad_scaler on more than one rank must be a torch.distributed.fsdp.sharded_grad_scaler."
                        "ShardedGradScaler, as under FSDP2: a GradScaler checks this rank's gradient shards only, "
                        "so ranks would skip optimizer steps apart and their parameters drift")
    group = getattr(scaler, "process_group", None)
    if world > 1 and scaler.is_enabled() and group is not None and dist.get_world_size(group) != world:
        raise StepError(f"grad_scaler's process_group spans {dist.get_world_size(group)} of the job's {world} ranks: "
                        "ranks outside it would skip optimizer steps apart; leave process_group the default "
                        "(every rank)")


def _frozen(named: dict[str, nn.Parameter]) -> tuple[str, ...]:
    """The parameters that take no gradient now (requires_grad False), by
    FQN, sorted: a training step is compiled for one such set, and freezing
    or unfreezing a parameter later (as fine-tuning does) compiles another,
    as eager PyTorch would stop or start computing its gradient."""
    return tuple(sorted(fqn for fqn, param in named.items() if not param.requires_grad))


class TrainedLoss(torch.Tensor):
    """The loss a training call returns: the call ran its backward already,
    so `loss.backward()` says so instead of torch's "element 0 of tensors
    does not require grad". What is computed from it is a plain tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def backward(self, *args, **kwargs):
        raise StepError("loss.backward() after a training call of the sharded module: the call ran backward "
                        "itself, and the gradients are in the parameters' .grad; call optimizer.step() next "
                        "(a loss scaled or summed with other terms belongs inside loss_fn)")

    def __repr__(self, *args, **kwargs):
        return repr(self.as_subclass(torch.Tensor))

    def __format__(self, format_spec):  # f"{loss:.4f}": Tensor formats a plain tensor's item only
        return self.as_subclass(torch.Tensor).__format__(format_spec)

    def __reduce_ex__(self, protocol):  # saved (torch.save, pickle) and copied as the plain tensor it is
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)

    def __deepcopy__(self, memo):
        return copy.deepcopy(self.as_subclass(torch.Tensor), memo)


def _returned(aux: dict | None, out: dict, *, trained: bool):
    """What a call returns: the loss (`trained`: a TrainedLoss), or
    (loss, aux) rebuilt as loss_fn returned it (the step function returns
    the loss, then aux's values, then the buffers' new values)."""
    loss = torch.Tensor._make_subclass(TrainedLoss, out["loss"]) if trained else out["loss"]
    if aux is None:
        return loss
    values = out["returned"][1:1 + aux_count(aux)]
    kind = aux["kind"]
    if kind == "tensor":
        rebuilt = values[0]
    elif kind == "dict":
        rebuilt = dict(zip(aux["keys"], values))
    else:
        rebuilt = tuple(values) if kind == "tuple" else list(values)
    return loss, rebuilt


def _overrides_text(overrides: dict[str, str]) -> str:
    """Options set since fsdpc.shard, for the per-call agreement."""
    return "".join(f", {name}={value}" for name, value in sorted(overrides.items()))


def _modes_text(apart: tuple[str, ...], training: bool) -> str:
    """Modules in the other mode, for the per-call agreement: the outermost
    of each such subtree (`apart` lists parents before children)."""
    outermost: list[str] = []
    for name in apart:
        if not any(name.startswith(parent + ".") for parent in outermost):
            outermost.append(name)
    return f", {', '.join(outermost)} in {'eval' if training else 'train'} mode" if apart else ""


def _frozen_text(frozen: tuple[str, ...]) -> str:
    """The frozen parameters in a call's description: every name counts
    (ranks that froze different ones must disagree), a few are shown."""
    if not frozen:
        return ""
    digest = hashlib.sha256("\0".join(frozen).encode()).hexdigest()[:12]
    shown = ", ".join(frozen[:3]) + (", ..." if len(frozen) > 3 else "")
    return f" with {len(frozen)} parameters frozen ({shown}; set {digest})"


@contextlib.contextmanager
def _draws_from_each_ranks_generator(mesh: DeviceMesh) -> Iterator[None]:
    """DTensor's random ops on a GPU mesh draw from one stream that its
    tracker first syncs from rank 0 (a broadcast on the default group,
    outside fsdpc's agreement and watchdog) at offsets per shard; init_weights
    seeds each shard's own generator instead, as on a CPU mesh, where
    DTensor has no tracker. A tracker made here is dropped after."""
    from torch.distributed.tensor import _random

    made = _random._rng_tracker is None and _random.is_rng_supported_mesh(mesh)
    if made:
        _random._rng_tracker = _random.OffsetBasedRNGTracker(mesh, run_state_sync=False)
    tracker = _random._rng_tracker
    enabled = tracker.distribute_region_enabled if tracker is not None else None
    if tracker is not None:
        tracker.distribute_region_enabled = False
    try:
        yield
    finally:
        if tracker is not None:
            tracker.distribute_region_enabled = enabled
        if made:
            _random._rng_tracker = None


def _ignored_names(model: nn.Module, ignored_params, device: torch.device) -> tuple[str, ...]:
    """FSDP2's `ignored_params` (a set of the model's parameters) as the
    FQNs the sharding pipeline takes: each parameter's first name, sorted.
    An ignored parameter is read where it is, so it must hold values on the
    job's device already, or be on meta (then it is placed there empty, for
    init_weights() or a load to fill)."""
    if ignored_params is None:
        return ()
    if isinstance(ignored_params, (torch.Tensor, Mapping)) or not isinstance(ignored_params, Iterable):
        raise StepError(f"ignored_params must be a set of the model's parameters, got "
                        f"{type(ignored_params).__name__}")
    first_names: dict[int, str] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        first_names.setdefault(id(param), fqn)
    names = set()
    for param in ignored_params:
        fqn = first_names.get(id(param))
        if fqn is None:
            what = (f"a tensor of shape {tuple(param.shape)}" if isinstance(param, torch.Tensor)
                    else f"a {type(param).__name__}")
            raise StepError(f"ignored_params holds {what} that is not a parameter of the model (pass the model's "
                            "own parameters, e.g. {model.head.bias})")
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", fqn):  # the sharding pipeline's options take the names
            raise StepError(f"ignored parameter {fqn!r}: only names of ASCII letters, digits, '_', '.' and '-' can be "
                            "ignored")
        if not param.is_meta and param.device != device:
            raise StepError(f"ignored parameter '{fqn}' is on {param.device}, the job computes on {device}: "
                            "the step reads ignored parameters where they are (FSDP2 leaves them there too); "
                            f"move the model to {device} before fsdpc.shard, or build it on meta")
        names.add(fqn)
    return tuple(sorted(names))


def _placed_off_dim_0(model: nn.Module, shard_placement_fn, ignored: tuple[str, ...]) -> dict[str, int]:
    """FSDP2's `shard_placement_fn` asked of every parameter (but the
    ignored): the dims other than 0 it names, by FQN. None and Shard(0) are
    fsdpc's own layout; a Shard of another dim is sharded on dim 0 all the
    same (fsdpc's one layout: the same values, state dict and checkpoints,
    other padding), which `_say_sharded_on_dim_0` tells; anything else
    (another mesh per parameter) is refused."""
    if shard_placement_fn is None:
        return {}
    if not callable(shard_placement_fn):
        raise StepError(f"shard_placement_fn must be callable (parameter -> Shard or None), got "
                        f"{type(shard_placement_fn).__name__}")
    elsewhere: dict[str, int] = {}
    for fqn, param in model.named_parameters():
        if fqn in ignored:
            continue
        placement = shard_placement_fn(param)
        if placement is None:
            continue
        if type(placement) is not Shard:  # not a subclass either (_StridedShard is tensor parallelism's)
            raise StepError(f"shard_placement_fn returned {placement!r} for '{fqn}': fsdpc shards every parameter "
                            "over fsdpc.shard's mesh (a parameter on a mesh of its own is not supported), so it takes "
                            "a Shard(dim) or None")
        dim = placement.dim + param.dim() if placement.dim < 0 else placement.dim
        if not 0 <= dim < max(param.dim(), 1):
            raise StepError(f"shard_placement_fn returned Shard({placement.dim}) for '{fqn}', which has "
                            f"{param.dim()} dims")
        if dim != 0:
            elsewhere[fqn] = dim
    return elsewhere


def _say_sharded_on_dim_0(elsewhere: dict[str, int], layout: dict[str, ParamSpec]) -> None:
    """Warns that the parameters shard_placement_fn placed on another dim
    are sharded on dim 0, with what that costs in padding."""
    padded = [(fqn, layout[fqn]) for fqn in elsewhere if fqn in layout and layout[fqn].padding]
    cost = "; ".join(f"'{fqn}' pads {spec.padding} rows to its {spec.shape[0]}" for fqn, spec in padded[:3])
    fqn, dim = next(iter(elsewhere.items()))
    warnings.warn(f"shard_placement_fn places {len(elsewhere)} parameter(s) on another dim (e.g. '{fqn}': "
                  f"Shard({dim})); fsdpc shards every parameter on dim 0, padded to a multiple of the ranks: the "
                  "values, gradients, state dict and DCP checkpoints (which reshard on load) are the same, the "
                  "DTensors are Shard(0)" + (f", and {cost}{' and more' if len(padded) > 3 else ''}" if padded else
                                             ", with no padding on this mesh"), stacklevel=user_stacklevel())


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model a torch.compile wrapper holds (fsdpc compiles the step
    itself, and the wrapper's `_orig_mod.` would prefix every name); a
    model another data-parallel wrapper holds is refused, naming what to
    pass (their hooks and parameters are not the model's own)."""
    if type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
        warnings.warn("fsdpc.shard was handed a torch.compile'd model: fsdpc compiles the training step itself, so it "
                      "shards the model inside (parameter names without '_orig_mod.'); the compiled wrapper is not "
                      "used", stacklevel=user_stacklevel())
        return _unwrapped(model._orig_mod)
    if isinstance(getattr(model, "module", None), nn.Module) and \
            type(model).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel"):
        raise StepError(f"fsdpc.shard was handed a {type(model).__name__}: fsdpc replaces it; hand fsdpc.shard the "
                        "model it wraps (build the model, then fsdpc.shard it, without the wrapper)")
    wrapped = [name for name, module in model.named_modules()
               if any(cls.__name__ in ("FSDPModule", "FullyShardedDataParallel") for cls in type(module).__mro__)]
    if wrapped:
        raise StepError(f"{_modules_named(wrapped)} already sharded by FSDP (fully_shard): fsdpc replaces it; hand "
                        "fsdpc.shard the model before fully_shard")
    return model


def _modules_named(names: Sequence[str]) -> str:
    """"the model is", "module 'a' is" or "modules 'a', 'b' are"."""
    if names == [""]:
        return "the model is"
    return f"module {_listed(names, 3)} is" if len(names) == 1 else f"modules {_listed(names, 3)} are"


def _listed(names: Sequence[str], shown: int = 6) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{', '.join(repr(name) for name in names[:shown])}{more}"


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def rows(tensor: torch.Tensor, begin: int, count: int) -> torch.Tensor:
    """Rows [begin, begin + count) of a shard or parameter; a scalar (never
    sharded) is its own only row, and all of a tensor's rows are the tensor
    (no view to build per parameter and call)."""
    if tensor.dim() == 0 or (begin == 0 and count == tensor.shape[0]):
        return tensor
    return tensor[begin:begin + count]


class _Flag:
    on = False


class _StreamPoint:
    """For the watchdog: one collective outside a step that no host thread
    waits for, done once the device stream reaches the point where it was
    waited for (an event recorded there)."""

    def __init__(self, device: torch.device, collective: str, group: str):
        self._done = torch.cuda.Event()
        self._done.record(torch.cuda.current_stream(device))
        self._collective = (collective, group)

    def first_unfinished(self) -> tuple[str, str] | None:
        return None if self._done.query() else self._collective

    def sealed(self) -> bool:
        return True


def _refuse_call(lent: _Flag) -> Callable:
    def refuse(module, args) -> None:
        if not lent.on:
            raise StepError(f"{type(module).__name__} was handed to fsdpc.shard, which took over its "
                            "parameters; call the sharded module it returned instead")
    return refuse


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _meta_batch(sizes: Sequence[tuple[int, ...]], batch: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`batch`'s tensors as meta tensors of `sizes` (another rank's): what compiling for them needs."""
    return [torch.empty(size, dtype=t.dtype, device="meta") for size, t in zip(sizes, batch)]


def _kinds(batch: Sequence[torch.Tensor]) -> str:
    """The batch as `_describe` says it but for its sizes, which may differ by rank."""
    return ", ".join(f"{t.dim()}-d {str(t.dtype).removeprefix('torch.')}" for t in batch)


def _describe(batch: Sequence[torch.Tensor]) -> str:
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in batch)


def shard(model: nn.Module, example_batch: Sequence[torch.Tensor], loss_fn: Callable, **options) -> ShardedModule:
    """Compiles `loss_fn(model, *batch)` with its backward into a sharded
    training step on every rank of the job and returns the module that runs
    it. `example_batch` is a tuple of the items loss_fn takes after the
    model (tensors, or dicts, lists or tuples of them); one tensor or dict
    alone is one item. Options (FSDP2's names where FSDP2 has the knob): `mesh` (1-D, or
    2-D (replicate, shard) for hybrid sharding), `reshard_after_forward`
    (bool or an inner group size), `mp_policy` (MixedPrecisionPolicy, or a
    dict of them by wrap unit module name, "" the model), `offload_policy` (CPUOffloadPolicy), `wrap` (a predicate
    `(fqn, module) -> bool` choosing the units), `gradient_accumulation`
    (compile the step set_requires_gradient_sync(False) uses),
    `gradient_divide_factor` (sum gradients over the ranks and divide by
    this instead of averaging; see set_gradient_divide_factor), `pipeline`
    (further fsdp-sharding-pipeline options, e.g. "strategy=shard-grad-op"),
    `timeout` (of every collective), `grad_scaler` (a ShardedGradScaler:
    training calls start backward from its scale, as
    `scaler.scale(loss).backward()` does, leaving scaled gradients for
    `scaler.unscale_`, `scaler.step` and `scaler.update`), `ignored_params`
    (a set of the model's parameters left alone, as FSDP2 leaves them: each
    rank keeps its own whole copy, on the job's device, in its own dtype
    under mp_policy, a plain tensor; its gradient is this rank's own, never
    reduced, and clip_grad_norm_ leaves it out; init_weights() gives every
    rank rank 0's values), `shard_placement_fn` (FSDP2's: None or Shard(0)
    per parameter; a Shard of another dim is sharded on dim 0 all the same,
    with a warning of the padding that costs; another mesh is refused)."""
    return ShardedModule(model, example_batch, loss_fn, **options)

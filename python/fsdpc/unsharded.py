"""The model itself on whole parameters, for code the compiled step does not
run: generation, evaluation through the model's own methods, editing weights
(FSDP1's `summon_full_params`, FSDP2's `unshard()` and
`register_fsdp_forward_method`).

    with sharded.unsharded() as model:                  # every rank
        model.lm_head.weight[unused_tokens] = 0         # written back into the shards on exit
    with sharded.unsharded(per_unit=True, dtype=torch.bfloat16) as model:
        tokens = model.generate(prompt, max_new_tokens=64)

All at once (the default), every parameter is gathered whole on entry into
the model's own slots and, on a normal exit, each rank copies its rows back
into its shard (`writeback`). Per unit, each wrap unit's parameters are
gathered when its module's forward begins and dropped when it returns (the
root unit's for the whole block): a rank holds what FSDP2's forward holds,
not the whole model. Each forward then gathers, so every rank must run the
same forwards: the model says it is FSDP-managed, which makes Hugging Face's
`generate` keep finished ranks stepping (`synced_gpus`).

Entry and exit are agreed among the ranks like a call, so a rank that runs
a step meanwhile is refused, not paired with another rank's gathers.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from fsdpc.device import collective_backend
from fsdpc.runtime import StepError
from fsdpc.sharded import _LENT, _first_line, _local, _owner, rows
from fsdpc.units import ROOT_UNIT

# Hugging Face's generate syncs finished ranks when the model carries it.
FSDP_MANAGED = "_is_fsdp_managed_module"


class Unsharded:
    """`ShardedModule.unsharded()`'s context; see the module's docstring."""

    def __init__(self, module, *, per_unit: bool, dtype: torch.dtype | None, writeback: bool | None):
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise StepError(f"unsharded(dtype=...) takes a floating-point torch.dtype, got {dtype!r}")
        narrowed = dtype is not None and any(param.is_floating_point() and param.dtype != dtype
                                             for param in module.parameters())
        if writeback is None:
            writeback = not per_unit and not narrowed
        elif writeback and per_unit:
            raise StepError("unsharded(per_unit=True, writeback=True): per unit, parameters are whole only while "
                            "their unit's forward runs, so there is nothing to write back; edit weights in "
                            "unsharded() (all at once)")
        elif writeback and narrowed:
            raise StepError(f"unsharded(dtype={dtype}, writeback=True): the shards are kept in the parameters' "
                            "dtype, and writing back a narrowed copy would round every weight; edit in the "
                            "parameters' dtype (dtype=None)")
        self._module = module
        self._per_unit, self._dtype, self._writeback = per_unit, dtype, writeback
        self._shards: dict[str, nn.Parameter] = {}
        self._gathered: set[str] = set()  # FQNs whole in the model now
        self._depth: dict[str, int] = {}  # per unit: forwards of it running now
        self._hooks: list = []
        self._saved_flag = None
        self._saved_training = True

    def describe(self) -> str:
        return f"unsharded(per_unit={self._per_unit}, dtype={self._dtype}, writeback={self._writeback})"

    # -- entry and exit ----------------------------------------------------

    def __enter__(self) -> nn.Module:
        module = self._module
        module._refuse_failed()
        if module._unsharded is not None:
            raise StepError(f"already inside {module._unsharded.describe()}: leave it before entering another")
        module._check_ready()
        module.wait_for_host_optimizer()
        module._agree_on_call(f"entering {self.describe()}")
        module._let_graphs_go()  # a replayed step's reserved memory would sit under the whole parameters
        model = module._original
        self._shards = {fqn: owner._parameters[leaf] for fqn, (owner, leaf) in module._param_slots.items()}
        self._saved_training, model.training = model.training, module.training
        self._saved_flag = model.__dict__.get(FSDP_MANAGED)
        module._unsharded = self
        module._model_lent.on = True
        try:
            if self._writeback:
                for fqn, param in self._shards.items():
                    _LENT[id(param)] = fqn
            units: dict[str, list[str]] = {}
            for fqn, spec in module.layout.items():
                units.setdefault(spec.unit if self._per_unit else ROOT_UNIT, []).append(fqn)
            self._install(self._gather(units.pop(ROOT_UNIT, [])))
            for unit, fqns in units.items():
                self._depth[unit] = 0
                block = model.get_submodule(unit)
                self._hooks.append(block.register_forward_pre_hook(self._unit_entered(unit, fqns)))
                self._hooks.append(block.register_forward_hook(self._unit_returned(unit, fqns), always_call=True))
            if self._per_unit:
                setattr(model, FSDP_MANAGED, True)
        except BaseException:
            self._restore()
            raise
        return model

    def __exit__(self, kind, error, traceback) -> None:
        module, written = self._module, "left"
        try:
            if self._writeback and kind is None:
                written = "write-back refused"
                self._write_back()
                written = "left"
        finally:
            self._restore()
            if not module._failed:  # the call count stays in step on every rank, whatever happened here
                module._agree_on_call(f"leaving {self.describe()}: {written}")

    def _restore(self) -> None:
        """Shards back in every slot, the model as it was; the module's mode
        is the model's (model.eval() inside the block sets both, as in eager)."""
        module, model = self._module, self._module._original
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self._install(self._shards)
        self._gathered.clear()
        for fqn in self._shards:
            _LENT.pop(id(self._shards[fqn]), None)
        if self._per_unit:
            if self._saved_flag is None:
                model.__dict__.pop(FSDP_MANAGED, None)
            else:
                setattr(model, FSDP_MANAGED, self._saved_flag)
        module.training = model.training
        model.training = self._saved_training
        module._model_lent.on = False
        module._unsharded = None

    def _write_back(self) -> None:
        """Each rank copies its rows of every parameter as the block left it
        (edited in place, or replaced by a tensor of the same shape) into
        its shard."""
        module = self._module
        for fqn in self._gathered:
            owner, leaf = _owner(module._original, fqn)
            now = owner._parameters[leaf]
            spec = module.layout[fqn]
            if now is None or tuple(now.shape) != spec.shape:
                raise StepError(f"parameter '{fqn}' was replaced inside unsharded() by "
                                f"{'None' if now is None else f'a tensor of shape {tuple(now.shape)}'}; the "
                                f"sharded step was compiled for shape {spec.shape}: nothing was written back")
            for alias in spec.tied:
                owner, leaf = _owner(module._original, alias)
                if owner._parameters.get(leaf) is not now:
                    raise StepError(f"'{alias}' was replaced inside unsharded() apart from '{fqn}', to which it "
                                    f"is tied: they are one parameter; edit or replace '{fqn}' (nothing was "
                                    "written back)")
        for fqn in self._gathered:
            owner, leaf = _owner(module._original, fqn)
            begin, real = module._shard_rows(module.layout[fqn])
            local = _local(self._shards[fqn])
            source = rows(owner._parameters[leaf].detach(), begin, real)
            if local.numel() and source.data_ptr() != local.data_ptr():
                local.copy_(source)

    # -- per unit ----------------------------------------------------------

    def _unit_entered(self, unit: str, fqns: list[str]):
        def entered(block, args) -> None:
            if self._depth[unit] == 0:
                self._install(self._gather(fqns))
            self._depth[unit] += 1
        return entered

    def _unit_returned(self, unit: str, fqns: list[str]):
        def returned(block, args, output) -> None:
            if self._depth[unit] == 0:  # its pre-hook raised (ours, or one before it): nothing was gathered
                return
            self._depth[unit] -= 1
            if self._depth[unit] == 0:
                self._install({fqn: self._shards[fqn] for fqn in fqns})
                self._gathered.difference_update(fqns)
        return returned

    # -- gathering ---------------------------------------------------------

    def _install(self, params: dict[str, nn.Parameter]) -> None:
        module, model = self._module, self._module._original
        for fqn, param in params.items():
            for name in (fqn, *module.layout[fqn].tied):
                owner, leaf = _owner(model, name)
                owner._parameters[leaf] = param

    def _gather(self, fqns: list[str]) -> dict[str, nn.Parameter]:
        """The whole parameters `fqns` on the module's device (in `dtype`),
        each from one all-gather of the padded shards, issued together. A
        replicated parameter written back in its own dtype is the shard itself."""
        module = self._module
        device = module.device
        # Gloo reads a CUDA tensor's pointer as host memory (pytorch#152645): its gathers go through the host.
        through_host = device.type == "cuda" and collective_backend(device) == "gloo"
        started, caller = time.monotonic(), threading.get_ident()
        pending = []
        try:
            for fqn in fqns:
                spec = module.layout[fqn]
                shard = module._padded(fqn, self._shards[fqn])
                if self._dtype is not None and shard.is_floating_point():
                    shard = shard.to(self._dtype)
                group = module._groups.get(spec.group) if spec.group is not None else None
                if group is None or dist.get_world_size(group) == 1:  # whole already: a copy, as a gather makes,
                    # so that a block left by an exception (or refused write-back) leaves the shard as it was.
                    pending.append((fqn, spec, shard.to(device, copy=True), None))
                    continue
                staged = shard.cpu() if through_host else shard.to(device)
                gathered = staged.new_empty((dist.get_world_size(group) * staged.shape[0], *staged.shape[1:]))
                work = dist.all_gather_into_tensor(gathered, staged, group=group, async_op=True)
                pending.append((fqn, spec, gathered, work))
            for fqn, spec, _, work in pending:
                if work is not None:
                    work.wait()  # NCCL: orders the stream after it; Gloo: within the group's timeout
        except Exception as error:
            what = f"unsharded(): the all-gather of '{fqn}'"
            failure = module._failure(
                f"{what}: {_first_line(error)}",
                f"rank {dist.get_rank()}: {what} failed after call {module._calls}: {_first_line(error)} (every "
                "rank gathers together: in unsharded(per_unit=True) each must run the same forwards; Hugging "
                "Face's generate does, a loop of your own must too)")
            if failure is None:
                raise
            raise failure from error
        watched = next((spec.group for _, spec, _, work in pending if work is not None), None)
        if watched is not None and device.type != "cpu":
            module._watch_stream("unsharded", f"the all-gather of unit '{module.layout[pending[0][0]].unit}'",
                                 watched, started, caller, since="the gather's start")
        whole = {}
        for fqn, spec, gathered, work in pending:
            if work is not None:
                gathered = rows(gathered, 0, spec.shape[0]).to(device)
            whole[fqn] = nn.Parameter(gathered, requires_grad=False)
        self._gathered.update(whole)
        return whole


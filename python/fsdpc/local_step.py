"""An optimizer step on the shards' local tensors.

A sharded module's parameters, their gradients and the optimizer state built
from them are DTensors. On DTensors, every `torch._foreach_*` or fused call of
a step goes through DTensor's sharding propagation, tens of microseconds per
parameter and call: on a small model that costs more than the step's math
(`benchmarks/host_overhead.py`). The elementwise optimizers of `torch.optim`
compute on a shard exactly what they compute on the whole tensor, so for
them a global step pre-hook hands the step the local tensors instead:

- each parameter group's `params` holds the parameters' local shards, each
  with its gradient's local shard as `.grad`;
- `optimizer.state` is a dictionary keyed by those local tensors whose
  values are the local tensors of the state's DTensors (the same storage, so
  the step updates the state in place).

The post-hook puts the DTensors back and carries over any state value the
step created or replaced (as a DTensor laid out like its parameter). The
first step, which creates the state, runs on the local tensors too: a
parameter group that mixes shards with plain tensors (ignored parameters)
would otherwise meet DTensor's refusal of mixed foreach calls on a GPU.

It applies only where the answer cannot change:
- the optimizer is exactly one of ELEMENTWISE (a subclass may override the
  math; Adafactor, LBFGS and the like are not elementwise);
- every DTensor among the parameters and state values is laid out like its
  parameter, with no pending reduction, and every other state tensor is a
  scalar (a step count);
- no scalar shard is about to get its first state: its moments and its step
  count would both be 0-dim local tensors, which only DTensor's own path
  tells apart (the moments a DTensor, the count plain);
- no other step hook would see the swapped tensors: the optimizer has no step
  hooks of its own and fsdpc's are the only global ones;
- the step has no closure (it would compute new gradients on the DTensors
  after the swap).

A step that raises leaves the swap in place until the optimizer's next step,
`state_dict` or `load_state_dict`, each of which puts the DTensors back first.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from fsdpc.device import dtensor_where_it_is

ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.Adamax,
               torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.ASGD)


@dataclass
class _Swap:
    params: list[list[torch.Tensor]]  # each group's own parameters, as the user gave them
    state: dict                        # the optimizer's own state dictionary
    pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]  # (parameter, local tensor, gradient)


def _layout_like(value: DTensor, param: DTensor) -> bool:
    mine, theirs = value._spec, param._spec
    return mine is theirs or (mine.placements == theirs.placements and mine.shape == theirs.shape and
                              (mine.mesh is theirs.mesh or mine.mesh == theirs.mesh))


def _local_state(param: torch.Tensor, entry: dict) -> dict | None:
    """`entry` (a parameter's state) with local tensors for DTensors; None
    where a value is laid out otherwise or is a full-size plain tensor."""
    local = {}
    for key, value in entry.items():
        if isinstance(value, DTensor):
            if not isinstance(param, DTensor) or not _layout_like(value, param):
                return None
            local[key] = value._local_tensor
        elif isinstance(value, torch.Tensor) and value.dim() > 0 and isinstance(param, DTensor):
            return None
        else:
            local[key] = value
    return local


class LocalStep:
    """The pre- and post-hook pair; `hooks` are fsdpc's own global step hooks,
    the only ones allowed beside it."""

    def __init__(self, owned: Callable[[torch.Tensor], bool]):
        self._owned = owned
        self.hooks: set[int] = set()

    def before(self, optimizer, args, kwargs) -> None:
        restore(optimizer)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        other_hooks = (set(_global_optimizer_pre_hooks) | set(_global_optimizer_post_hooks)) - self.hooks
        if type(optimizer) not in ELEMENTWISE or closure is not None or other_hooks or \
                optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks:
            return
        groups = optimizer.param_groups
        params = [group["params"] for group in groups]
        if not any(self._owned(p) for group_params in params for p in group_params):
            return
        state = optimizer.state
        local_state: dict = defaultdict(dict)
        pairs = []
        for group_params in params:
            for param in group_params:
                sharded = isinstance(param, DTensor)
                local = param._local_tensor if sharded else param
                if sharded and any(placement.is_partial() for placement in param._spec.placements):
                    return
                entry = state.get(param)
                grad = param.grad
                if grad is not None and (isinstance(grad, DTensor) != sharded or
                                         (sharded and not _layout_like(grad, param)) or
                                         (sharded and entry is None and param.dim() == 0)):
                    return
                if entry is not None:
                    local_entry = _local_state(param, entry)
                    if local_entry is None:
                        return
                    local_state[local] = local_entry
                pairs.append((param, local, grad))
        for param, local, grad in pairs:
            if local is not param:
                local.grad = None if grad is None else grad._local_tensor
        optimizer._fsdpc_local_step = _Swap(params, state, pairs)
        if not getattr(optimizer, "_fsdpc_local_step_guarded", False):
            optimizer.register_state_dict_pre_hook(restore)
            optimizer.register_load_state_dict_pre_hook(lambda opt, _: restore(opt))
            optimizer._fsdpc_local_step_guarded = True
        for group, group_params in zip(groups, params):
            group["params"] = [p._local_tensor if isinstance(p, DTensor) else p for p in group_params]
        optimizer.state = local_state

    def after(self, optimizer, args, kwargs) -> None:
        restore(optimizer)


def restore(optimizer) -> None:
    """Puts the DTensors back after a swapped step, carrying over state values
    the step replaced."""
    swap = getattr(optimizer, "_fsdpc_local_step", None)
    if swap is None:
        return
    optimizer._fsdpc_local_step = None
    stepped = optimizer.state
    for group, params in zip(optimizer.param_groups, swap.params):
        group["params"] = params
    optimizer.state = swap.state
    for param, local, _ in swap.pairs:
        sharded = local is not param
        if sharded:
            local.grad = None
        entry = stepped.get(local)
        if entry is None:
            continue
        own = swap.state[param]
        for key, value in entry.items():
            before = own.get(key)
            if value is before or (isinstance(before, DTensor) and value is before._local_tensor):
                continue
            if sharded and isinstance(value, torch.Tensor) and value.dim() > 0 and not isinstance(value, DTensor):
                value = dtensor_where_it_is(value, param.device_mesh, param.placements, param.shape, param.stride())
            own[key] = value

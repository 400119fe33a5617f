"""The host optimizer of offloaded units, overlapped with the next step.

An offloaded unit's shard, gradient and optimizer state live in host memory
and the optimizer steps them there, on the CPU; under FSDP2 the device waits
for that between steps. After `sharded.overlap_host_optimizer(optimizer)`,
`optimizer.step()` steps the device's parameters at once and hands the
offloaded units' to a host thread, unit by unit in the order the next step
gathers them (the program's `host_units`). Each unit's update is a
`_fsdp_rt.HostUpdate`: the runtime's host all-gather of the unit waits for
it before it reads the shards, so the next step's forward computes beside
the host optimizer instead of after it.

The thread steps a twin of the user's optimizer: the same class, defaults
and state dictionary (an optimizer's own pickling path builds it), with the
unit's parameters in groups whose hyperparameters were copied when `step()`
was called, so an LR scheduler stepped right after changes the next step, as
without overlap. `optimizer.zero_grad()` clears the device's gradients at
once and an offloaded unit's once its update is done.

What waits for the thread: the next call of the sharded module (each unit
at its gather, every unit before the call returns), `optimizer.step`,
`optimizer.state_dict` and `load_state_dict`, the module's `state_dict`,
`load_state_dict`, `full_state_dict`, `clip_grad_norm_` and `init_weights`,
and `sharded.wait_for_host_optimizer()`, which code that reads an offloaded
parameter's values between `step()` and the next call must call first. A
failed update fails its unit's gather (the call raises what the optimizer
raised) and every later wait: part of the model was not updated.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import types
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from fsdpc.runtime import StepError


@dataclass
class _UnitTask:
    unit: str
    params: list[nn.Parameter]
    groups: list[dict]  # the unit's parameters in the user's groups, hyperparameters as at step()
    update: object      # _fsdp_rt.HostUpdate
    stepped: bool = False
    clear: bool | None = None  # zero_grad came first: set_to_none, or zero in place


def _overlapped_step(optimizer: torch.optim.Optimizer, closure: Callable | None = None):
    # Bound to the optimizer (LR schedulers re-bind `step.__func__` to it).
    return optimizer._fsdpc_host_optimizer.step(closure)


def _overlapped_zero_grad(optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
    optimizer._fsdpc_host_optimizer.zero_grad(set_to_none)


class HostOptimizer:
    """Installed on one optimizer by `ShardedModule.overlap_host_optimizer`."""

    def __init__(self, optimizer: torch.optim.Optimizer, units: Sequence[tuple[str, Sequence[nn.Parameter]]],
                 host_update: Callable[[], object]):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise StepError(f"overlap_host_optimizer takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if getattr(optimizer, "_fsdpc_host_optimizer", None) is not None:
            raise StepError("this optimizer's host steps are already overlapped")
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.units = [(unit, [p for p in params if id(p) in held]) for unit, params in units]
        self.units = [(unit, params) for unit, params in self.units if params]
        if not self.units:
            raise StepError("the optimizer holds no parameter of an offloaded unit: nothing steps on the host "
                            "(offload units with offload_policy=CPUOffloadPolicy() or the pipeline's offload options)")
        self._on_host = {id(p) for _, params in self.units for p in params}
        self.optimizer = optimizer
        self._host_update = host_update
        self._twin = type(optimizer).__new__(type(optimizer))
        self._twin.__setstate__({"defaults": optimizer.defaults, "state": optimizer.state, "param_groups": []})
        self._user_step, self._user_zero_grad = optimizer.step, optimizer.zero_grad
        self._lock = threading.Lock()
        self._tasks: list[_UnitTask] = []
        self._thread: threading.Thread | None = None
        self._failure: str | None = None
        optimizer._fsdpc_host_optimizer = self
        optimizer.step = types.MethodType(_overlapped_step, optimizer)
        optimizer.zero_grad = types.MethodType(_overlapped_zero_grad, optimizer)
        optimizer.register_state_dict_pre_hook(lambda _: self.wait())
        optimizer.register_load_state_dict_pre_hook(lambda *_: self.wait())

    # -- the user's optimizer ----------------------------------------------

    def step(self, closure: Callable | None):
        if closure is not None:
            raise StepError("optimizer.step(closure) evaluates the loss again, which a host optimizer that runs "
                            "beside the next step cannot: call step() without a closure")
        self.wait()
        with self._device_params_only():
            result = self._user_step()
        groups = self.optimizer.param_groups
        hyperparameters = [copy.deepcopy({k: v for k, v in group.items() if k != "params"}) for group in groups]
        tasks = []
        for unit, params in self.units:
            members = {id(p) for p in params}
            unit_groups = [dict(settings, params=[p for p in group["params"] if id(p) in members])
                           for settings, group in zip(hyperparameters, groups)]
            tasks.append(_UnitTask(unit, params, [g for g in unit_groups if g["params"]], self._host_update()))
        self._tasks = tasks
        self._thread = threading.Thread(target=self._run, args=(tasks,), name="fsdpc host optimizer")
        self._thread.start()
        return result

    def zero_grad(self, set_to_none: bool) -> None:
        if self._thread is None:
            self._user_zero_grad(set_to_none)
            return
        with self._device_params_only():
            self._user_zero_grad(set_to_none)
        with self._lock:
            done = [task for task in self._tasks if task.stepped]
            for task in self._tasks:
                if not task.stepped:
                    task.clear = set_to_none
        for task in done:
            _clear(task.params, set_to_none)

    @contextlib.contextmanager
    def _device_params_only(self) -> Iterator[None]:
        """The user's optimizer sees only the parameters that stay on the device."""
        groups = self.optimizer.param_groups
        held = [group["params"] for group in groups]
        try:
            for group in groups:
                group["params"] = [p for p in group["params"] if id(p) not in self._on_host]
            yield
        finally:
            for group, params in zip(groups, held):
                group["params"] = params

    # -- the thread ----------------------------------------------------------

    def _run(self, tasks: list[_UnitTask]) -> None:
        failure = None
        for task in tasks:
            if failure is not None:
                task.update.fail(f"not stepped: the host optimizer failed earlier, at unit @{failure}")
                continue
            try:
                self._twin.state = self.optimizer.state  # load_state_dict replaces the dictionary
                self._twin.param_groups = task.groups
                self._twin.step()
            except BaseException as error:  # noqa: BLE001 (reported at the gather and every wait)
                failure = f"{task.unit}: {type(error).__name__}: {error}"
                task.update.fail(f"the optimizer step raised {type(error).__name__}: {error}")
                continue
            with self._lock:
                task.stepped = True
                clear = task.clear
            if clear is not None:
                _clear(task.params, clear)
            task.update.finish()
        self._twin.param_groups = []
        if failure is not None:
            self._failure = failure

    def pending(self) -> dict[str, object]:
        """The updates a call must wait for, by unit."""
        return {task.unit: task.update for task in self._tasks} if self._thread is not None else {}

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread, self._tasks = None, []

    def wait(self) -> None:
        """Joins the thread; raises if an update failed, now or before."""
        self.join()
        if self._failure is not None:
            raise StepError(f"the overlapped host optimizer failed at unit @{self._failure}; the offloaded "
                            "units after it were not updated either")


def _clear(params: Sequence[nn.Parameter], set_to_none: bool) -> None:
    """What Optimizer.zero_grad does to each of `params`."""
    for param in params:
        if param.grad is None:
            continue
        if set_to_none:
            param.grad = None
        else:
            if param.grad.grad_fn is not None:
                param.grad.detach_()
            else:
                param.grad.requires_grad_(False)
            param.grad.zero_()

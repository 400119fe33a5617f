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
without overlap. `optimizer.zero_grad()` (and the sharded module's
`zero_grad()`, which Hugging Face's Trainer calls) clears the device's
gradients at once and an offloaded unit's once its update is done.

What waits for the thread: the next call of the sharded module (each unit
at its gather, every unit before the call returns), `optimizer.step`,
`optimizer.state_dict` and `load_state_dict`, the module's `state_dict`,
`load_state_dict`, `full_state_dict`, `clip_grad_norm_` and `init_weights`,
and `sharded.wait_for_host_optimizer()`, which code that reads an offloaded
parameter's values between `step()` and the next call must call first. A
failed update fails its unit's gather (the call raises what the optimizer
raised) and every later wait: part of the model was not updated.

In backward (`overlap_host_optimizer(optimizer, in_backward=True)`), a unit
need not wait for `optimizer.step()`: each training call starts the thread,
which takes each offloaded unit as soon as the runtime lands its gradients in
host memory (`_fsdp_rt.GradientLandings`, at a host reduction's wait), first
the unit the next forward gathers first, attaches its gradients and steps
it, while the call's backward goes on and, for what is left when it
returns, beside the next call's forward. That is the step the user asks
for, taken early, so the contract is stricter: every training call is
followed by `optimizer.step()` before the next one (which then steps the
device's parameters and checks that no hyperparameter changed since the
call: they were read when it began), there is no clipping (the host
steps before the norm could be known), and offloaded gradients and
parameters are read only after `wait_for_host_optimizer()`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
import types
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from fsdpc.device import use_in_this_thread
from fsdpc.runtime import StepError


@dataclass
class _UnitTask:
    unit: str
    params: list[nn.Parameter]
    groups: list[dict]  # the unit's parameters in the user's groups, hyperparameters as at step()
    update: object      # _fsdp_rt.HostUpdate
    # The optimizer's state dictionary, taken when the task is made: while the
    # user's step runs (in backward, beside this thread) `optimizer.state` is
    # the local-tensor view of the device parameters' state (local_step.py).
    state: dict
    stepped: bool = False
    failed: bool = False
    clear: bool | None = None  # zero_grad came first: set_to_none, or zero in place


def _overlapped_step(optimizer: torch.optim.Optimizer, closure: Callable | None = None):
    # Bound to the optimizer (LR schedulers re-bind `step.__func__` to it).
    return optimizer._fsdpc_host_optimizer.step(closure)


def _overlapped_zero_grad(optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
    optimizer._fsdpc_host_optimizer.zero_grad(set_to_none)


# Parameters an optimizer steps in backward -> their names. Torch's clipping
# refuses them: they stepped before any norm of the call's gradients was known.
_STEPPED_IN_BACKWARD = WeakIdKeyDictionary()
_TORCH_CLIPPING = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_grads_with_norm_")


def _refusing_stepped(name: str, clipping: Callable) -> Callable:
    """`clipping` (one of torch.nn.utils' functions that scale gradients in
    place), refusing parameters stepped in backward and otherwise as it is."""
    @functools.wraps(clipping)
    def refusing(parameters, *args, **kwargs):
        listed = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        stepped = [_STEPPED_IN_BACKWARD[p] for p in listed if p in _STEPPED_IN_BACKWARD]
        if stepped:
            raise StepError(
                f"torch.nn.utils.{name} over parameters whose host optimizer steps in backward "
                f"({', '.join(stepped[:3])}{', ...' if len(stepped) > 3 else ''}): each offloaded unit steps as "
                "soon as its gradients land, before the clipping, which would scale gradients already used "
                "(overlap_host_optimizer(optimizer) without in_backward steps after clipping)")
        return clipping(listed, *args, **kwargs)
    refusing._fsdpc_refuses_stepped = True
    return refusing


def _guard_torch_clipping() -> None:
    """Torch's clipping functions refuse parameters stepped in backward
    (installed once, the first time an optimizer steps in backward; they
    are looked up by attribute, as Hugging Face's Trainer calls them)."""
    for module in (torch.nn.utils, torch.nn.utils.clip_grad):
        for name in _TORCH_CLIPPING:
            clipping = getattr(module, name, None)
            if clipping is not None and not getattr(clipping, "_fsdpc_refuses_stepped", False):
                setattr(module, name, _refusing_stepped(name, clipping))


@dataclass
class InBackward:
    """What stepping in backward needs from the sharded module."""
    landings: Callable[[list[tuple[str, list[str]]]], object]  # _fsdp_rt.GradientLandings
    attach_grad: Callable[[str, nn.Parameter, torch.Tensor], None]  # a landed gradient onto the parameter's .grad
    timeout_s: float  # the longest the thread waits for a landing


class HostOptimizer:
    """Installed on one optimizer by `ShardedModule.overlap_host_optimizer`."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 units: Sequence[tuple[str, Sequence[tuple[str, nn.Parameter]]]],
                 host_update: Callable[[], object], in_backward: InBackward | None = None,
                 device: torch.device | None = None,
                 before_step: Callable[[torch.optim.Optimizer], None] = lambda optimizer: None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise StepError(f"overlap_host_optimizer takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if getattr(optimizer, "_fsdpc_host_optimizer", None) is not None:
            raise StepError("this optimizer's host steps are already overlapped")
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        held_by_unit = [(unit, [(fqn, p) for fqn, p in named if id(p) in held]) for unit, named in units]
        self._names = [(unit, named) for unit, named in held_by_unit if named]
        if not self._names:
            raise StepError("the optimizer holds no parameter of an offloaded unit: nothing steps on the host "
                            "(offload units with offload_policy=CPUOffloadPolicy() or the pipeline's offload options)")
        self._on_host = {id(p) for _, named in self._names for _, p in named}
        self.optimizer = optimizer
        self._host_update = host_update
        self._in_backward = in_backward
        if in_backward is not None:
            _guard_torch_clipping()
            for _, named in self._names:
                for fqn, p in named:
                    _STEPPED_IN_BACKWARD[p] = fqn
        self._device = device  # the step's, made current in the thread (it waits for and drops its events)
        self._before_step = before_step  # refuses a step the sharded module knows to be wrong, before any unit steps
        self._uncommitted: list[dict] | None = None  # in backward: the hyperparameters a call began stepping with
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
        self._refuse_step_hooks()
        self._before_step(self.optimizer)
        if closure is not None:
            raise StepError("optimizer.step(closure) evaluates the loss again, which a host optimizer that runs "
                            "beside the next step cannot: call step() without a closure")
        if self._uncommitted is not None:  # in backward: the offloaded units are stepping already
            changed = [name for settings, group in zip(self._uncommitted, self.optimizer.param_groups)
                       for name, value in _hyperparameters(group).items() if not _same(settings.get(name), value)]
            if changed:
                raise StepError(f"the optimizer's {', '.join(sorted(set(changed)))} changed between the training call "
                                "and optimizer.step(): the host optimizer stepping in backward began with the values "
                                "of the call's start; change hyperparameters after step(), before the next call")
            self._uncommitted = None
            with self._device_params_only():
                return self._user_step()
        self.wait()
        with self._device_params_only():
            result = self._user_step()
        if self._in_backward is not None:  # no training call since the last step: gradients set by hand
            self._run(self._tasks_for(self.optimizer.param_groups))
            self.wait()
            return result
        tasks = self._tasks_for(self.optimizer.param_groups)
        self._tasks = tasks
        self._thread = threading.Thread(target=self._run, args=(tasks,), name="fsdpc host optimizer")
        self._thread.start()
        return result

    def _refuse_step_hooks(self) -> None:
        """The optimizer's own step hooks would see the device's parameters
        only, while the thread steps the offloaded units' apart (under FSDP2
        they see every parameter)."""
        if getattr(self.optimizer, "_optimizer_step_pre_hooks", None) \
                or getattr(self.optimizer, "_optimizer_step_post_hooks", None):
            raise StepError("the optimizer has step hooks (register_step_pre_hook or register_step_post_hook), which "
                            "would see only the parameters on the device while the host thread steps the offloaded "
                            "units' apart: remove them, or step without overlap_host_optimizer")

    def check_training_call(self) -> None:
        """In backward: the optimizer has no step hooks, and the last
        training call's step must have been taken."""
        self._refuse_step_hooks()
        if self._uncommitted is not None:
            raise StepError("the host optimizer steps offloaded units in backward, so every training call must be "
                            "followed by optimizer.step() before the next one (gradient accumulation: "
                            "set_requires_gradient_sync(False) for all but the last micro-batch)")

    def stepped_in_backward(self) -> set[str]:
        """The parameters whose gradients the thread attaches as they land."""
        return {fqn for _, named in self._names for fqn, _ in named}

    def begin_training_call(self) -> object:
        """In backward: a synchronizing training call begins. Starts the
        thread that steps each offloaded unit once the call lands its
        gradients; returns the GradientLandings the call passes to the
        runtime. The call has passed check_training_call."""
        groups = self.optimizer.param_groups
        self._uncommitted = [copy.deepcopy(_hyperparameters(group)) for group in groups]
        tasks = self._tasks_for(groups)
        landings = self._in_backward.landings([(unit, [fqn for fqn, _ in named]) for unit, named in self._names])
        previous, self._tasks = self._thread, tasks
        self._thread = threading.Thread(target=self._run_in_backward, args=(tasks, landings, previous),
                                        name="fsdpc host optimizer in backward")
        self._thread.start()
        return landings

    @property
    def in_backward(self) -> bool:
        return self._in_backward is not None

    def _tasks_for(self, groups: list[dict]) -> list[_UnitTask]:
        """A task per unit: its parameters in the user's groups, with the
        hyperparameters as they are now."""
        hyperparameters = [copy.deepcopy(_hyperparameters(group)) for group in groups]
        tasks = []
        for unit, named in self._names:
            params = [p for _, p in named]
            members = {id(p) for p in params}
            unit_groups = [dict(settings, params=[p for p in group["params"] if id(p) in members])
                           for settings, group in zip(hyperparameters, groups)]
            tasks.append(_UnitTask(unit, params, [g for g in unit_groups if g["params"]], self._host_update(),
                                   self.optimizer.state))
        return tasks

    def zero_grad(self, set_to_none: bool) -> None:
        if self._thread is None:
            self._user_zero_grad(set_to_none)
            return
        with self._device_params_only():
            self._user_zero_grad(set_to_none)
        pending = self._clear_when_stepped(set_to_none)
        _clear([p for task in self._tasks for p in task.params if id(p) not in pending], set_to_none)

    def zero_grad_of(self, params: Sequence[nn.Parameter], set_to_none: bool) -> None:
        """`params`' gradients cleared (the sharded module's zero_grad, which
        Hugging Face's Trainer calls) as `zero_grad` clears the optimizer's:
        a unit the thread has yet to step keeps its gradients until it has."""
        pending = self._clear_when_stepped(set_to_none) if self._thread is not None else set()
        _clear([p for p in params if id(p) not in pending], set_to_none)

    def _clear_when_stepped(self, set_to_none: bool) -> set[int]:
        """Has each unit the thread has yet to step clear its gradients once
        stepped; their parameters' ids."""
        with self._lock:
            pending = [task for task in self._tasks if not task.stepped]
            for task in pending:
                task.clear = set_to_none
        return {id(p) for task in pending for p in task.params}

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
        use_in_this_thread(self._device)
        failure = None
        for task in tasks:
            if failure is not None:
                task.update.fail(f"not stepped: the host optimizer failed earlier, at unit @{failure}")
                continue
            failure = self._step_unit(task)
        self._twin.param_groups = []
        if failure is not None:
            self._failure = failure

    def _run_in_backward(self, tasks: list[_UnitTask], landings, previous: threading.Thread | None) -> None:
        """Steps each unit as its gradients land, first the one the next
        forward gathers first (GradientLandings.next picks it)."""
        use_in_this_thread(self._device)
        if previous is not None:
            previous.join()  # the last call's units: its forward waited for each
        by_unit = {task.unit: task for task in tasks}
        names = dict(self._names)
        failure = self._failure
        while failure is None:
            try:
                landed = landings.next(self._in_backward.timeout_s)
            except BaseException as error:  # noqa: BLE001 (the step failed, and the call raises why)
                failure = f"(no gradients): {error}"
                break
            if landed is None:
                break
            unit, grads = landed
            task = by_unit[unit]
            try:
                for fqn, param in names[unit]:
                    self._in_backward.attach_grad(fqn, param, grads[fqn])
            except BaseException as error:  # noqa: BLE001 (reported at the gather and every wait)
                failure = f"{unit}: {type(error).__name__}: {error}"
                task.failed = True
                task.update.fail(f"its gradients could not be attached: {type(error).__name__}: {error}")
                break
            failure = self._step_unit(task)
        for task in tasks:
            if not task.stepped and not task.failed:
                task.update.fail(f"not stepped: the host optimizer failed at unit @{failure}")
        self._twin.param_groups = []
        if failure is not None:
            self._failure = failure

    def _step_unit(self, task: _UnitTask) -> str | None:
        """Steps one unit's parameters; returns the failure, if it raised."""
        try:
            self._twin.state = task.state  # load_state_dict replaces the dictionary (it waits for this thread)
            self._twin.param_groups = task.groups
            self._twin.step()
        except BaseException as error:  # noqa: BLE001 (reported at the gather and every wait)
            task.failed = True
            task.update.fail(f"the optimizer step raised {type(error).__name__}: {error}")
            return f"{task.unit}: {type(error).__name__}: {error}"
        with self._lock:
            task.stepped = True
            clear = task.clear
        if clear is not None:
            _clear(task.params, clear)
        task.update.finish()
        return None

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


def _hyperparameters(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


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

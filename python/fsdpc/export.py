"""The export entry point: model + batch + loss -> fsdp-dialect IR."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from fsdpc import capture
from fsdpc.call_trace import CallTrace, trace_calls
from fsdpc.capture import CapturedStep, ForwardTrace, MixedPrecision
from fsdpc.emit import emit_mlir
from fsdpc.units import UnitPlan, WrapPolicy, plan_units


@dataclass
class ExportResult:
    mlir: str
    step: CapturedStep
    plan: UnitPlan
    seconds: float

    def summary(self) -> str:
        params = self.step.params
        elements = sum(_numel(p.shape) for p in params)
        trainable = sum(p.trainable for p in params)
        tied = sum(len(p.aliases) for p in params)
        calls = [n for n in self.step.graph.nodes if n.op == "call_function"
                 and getattr(n.target, "__name__", "") != "getitem"]
        loss = self.step.loss
        while getattr(loss.target, "__name__", "") == "getitem":  # a result of a multi-result op
            loss = loss.args[0]
        loss_at = calls.index(loss) + 1 if loss in calls else len(calls)
        classes: dict[str, int] = {}
        for unit in self.plan.units[1:]:
            classes[unit.module_class] = classes.get(unit.module_class, 0) + 1
        by_class = ", ".join(f"{count} x {name}" for name, count in classes.items())
        return "\n".join([
            f"parameters: {len(params)} tensors, {elements:,} elements "
            f"({trainable} trainable, {len(params) - trainable} frozen, {tied} tied names)",
            f"buffers:    {len(self.step.buffers)}",
            f"wrap units: {len(self.plan.units)} (root{', ' + by_class if by_class else ''})",
            f"ops:        {len(calls)} ATen calls ({loss_at} forward + loss, {len(calls) - loss_at} backward)",
            f"time:       {self.seconds:.1f} s",
        ])


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _unit_modules(plan: UnitPlan) -> list[str]:
    return ["" if unit.is_root else unit.name for unit in plan.units]


def _with_units(fingerprint: str, plan: UnitPlan) -> str:
    units = [(unit.name, unit.module_class, unit.is_root) for unit in plan.units]
    return hashlib.sha256(f"{fingerprint} {units!r}".encode()).hexdigest()


def call_trace(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *,
               wrap: WrapPolicy = None, mixed_precision: MixedPrecision | None = None,
               device: str = "cpu") -> CallTrace | None:
    """The step's torch calls recorded without exporting (`fsdpc.call_trace`),
    its fingerprint joined with the wrap units like `ExportStage`'s; None
    where the record cannot be complete."""
    plan = plan_units(model, wrap)
    traced = trace_calls(model, batch, loss_fn, unit_modules=_unit_modules(plan),
                         mixed_precision=mixed_precision, device=device)
    if traced is not None:
        traced.fingerprint = _with_units(f"calls {traced.fingerprint}", plan)
    return traced


@dataclass
class ExportStage:
    """A step traced up to its forward (see `traced_forward`)."""

    forward: ForwardTrace
    plan: UnitPlan
    start: float

    def fingerprint(self) -> str:
        """The forward's fingerprint and the wrap units: what the IR is made of."""
        return _with_units(self.forward.fingerprint(), self.plan)

    @property
    def aux(self) -> dict | None:
        """What loss_fn returns beside the loss (`capture.aux_structure`)."""
        return self.forward.aux

    @property
    def attribute_reads(self) -> list[tuple[str, str]]:
        """The module attributes the step read (module path, name), sorted."""
        return sorted(self.forward.attribute_reads)

    def export(self, header: str = "") -> ExportResult:
        """The joint trace, printed as IR."""
        step = self.forward.joint()
        mlir = emit_mlir(step, self.plan, header=header)
        return ExportResult(mlir, step, self.plan, time.perf_counter() - self.start)


@contextlib.contextmanager
def traced_forward(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable,
                   *, wrap: WrapPolicy = None, mixed_precision: MixedPrecision | None = None,
                   device: str = "cpu", scaled_loss: bool = False) -> Iterator[ExportStage]:
    """Exports `loss_fn(model, *batch)` for the target `device`; inside,
    the stage's fingerprint is known, and `export()` finishes the capture.
    `scaled_loss`: see capture.traced_forward."""
    start = time.perf_counter()
    plan = plan_units(model, wrap)
    with capture.traced_forward(model, batch, loss_fn, mixed_precision=mixed_precision,
                                unit_modules=_unit_modules(plan), device=device, scaled_loss=scaled_loss) as forward:
        yield ExportStage(forward, plan, start)


def export_training_step(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable,
                         *, wrap: WrapPolicy = None, mixed_precision: MixedPrecision | None = None,
                         header: str = "", device: str = "cpu") -> ExportResult:
    """Captures `loss_fn(model, *batch)` with its backward for the target
    `device` and prints it as IR."""
    with traced_forward(model, batch, loss_fn, wrap=wrap, mixed_precision=mixed_precision,
                        device=device) as stage:
        return stage.export(header)


def load_factory(spec: str) -> Callable:
    """A built-in model name, or `path/to/file.py:factory`."""
    from fsdpc.models import BUILTIN_MODELS

    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec]
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise ValueError(f"unknown model '{spec}': use one of {', '.join(sorted(BUILTIN_MODELS))} "
                         "or path/to/file.py:factory")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"model file {file} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"fsdpc_user_model_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ValueError(f"{file} has no callable '{name}'")
    return factory


def build(factory: Callable, *, meta: bool, **options):
    """Runs a factory, on the meta device if asked, and checks its contract."""
    if meta:
        with torch.device("meta"):
            made = factory(**options)
    else:
        made = factory(**options)
    if not (isinstance(made, tuple) and len(made) == 3):
        raise ValueError("a model factory must return (model, batch, loss_fn)")
    model, batch, loss_fn = made
    if not isinstance(model, nn.Module):
        raise ValueError(f"the factory's model is a {type(model).__name__}, not an nn.Module")
    if isinstance(batch, torch.Tensor):
        batch = (batch,)
    if not callable(loss_fn):
        raise ValueError("the factory's loss_fn is not callable")
    return model, tuple(batch), loss_fn

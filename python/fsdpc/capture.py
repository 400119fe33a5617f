"""Capture a model's whole training step (forward, loss, backward) as one
core-ATen graph.

How, in two traces, both PyTorch's own:

1. ``torch.export`` traces forward + loss (non-strict), recording for every
   op the module that ran it (``nn_module_stack``) and the user's source line.
2. ``make_fx`` re-runs that graph node by node (an ``fx.Interpreter`` under
   ``preserve_node_meta``, so each new node inherits its source node's
   metadata) and then ``torch.autograd.grad`` of the loss with respect to the
   trainable parameters, under functionalization and core-ATen
   decompositions. AOTAutograd's stack-trace hooks stamp every backward
   node with the autograd sequence number of the forward op it
   differentiates; that number leads back to the forward op's module and line.

The result is functional: functionalization rewrites in-place ops and
autograd accumulates gradients out of place (checked, with a clear error
otherwise).

Everything runs on fake tensors, so the parameters can live on the meta
device and a 70B-parameter model captures in a few GiB.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import linecache
import logging
import os
import random
import re
import sys
import threading
import traceback
import types
import warnings
from collections.abc import ItemsView, KeysView, ValuesView
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

import torch
from torch import fx, nn
from torch._C import DispatchKey
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.traceback import preserve_node_meta
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.utils import checkpoint as torch_checkpoint
from torch.utils._pytree import TreeSpec, keystr, tree_flatten_with_path, tree_map_only, tree_unflatten
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import _disable_current_modes

from fsdpc import cache, functions
from fsdpc.autocast import ambient_autocast, casts_in, recording_regions
from fsdpc.batch_norm import batch_norms_traceable
from fsdpc.attention import FusedAttentionFor
from fsdpc.checkpointing import (REGION_KEY, CheckpointRegions, SavedCall, SavingSelectively, checkpoint_regions,
                                 patched, regions_of)
from fsdpc.rms_norm import FusedRmsNormFor, fuse_written_out_rms_norms
from fsdpc.transformer import nested_encoders_as_eager
from fsdpc.units import ROOT_UNIT, Unit, UnitPlan
from fsdpc.watch import (FSDPC_DIR, FSDPC_MODELS_DIR, MODULE_INTERNALS, TORCH_DIR, UNWATCHED, configurations,
                         free_variables, machinery_file, user_stacklevel, watched_value)

_MODEL_ATTR = "model"
_NOISY_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._dynamo", "torch.export",
                  "torch._export")


class CaptureError(RuntimeError):
    """What cannot be captured, naming the operation and the user's source line."""


@dataclass(frozen=True)
class SourceLocation:
    file: str
    line: int
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


# FSDP2's reduce_dtype=None: from torch 2.15 the gradients' own dtype, before it the param_dtype.
_FSDP2_REDUCES_IN_GRAD_DTYPE = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 15)


@dataclass(frozen=True)
class MixedPrecision:
    """FSDP2's MixedPrecisionPolicy. `param_dtype`: parameters are cast to it
    where they are used, so forward and backward compute in it (the fp32
    shards stay the master copy); `reduce_dtype`: gradients are reduced in it
    (None: fsdpc.shard and the command line reduce where the installed
    torch's FSDP2 does, `as_fsdp2_reduces`; the IR without it, in the compute
    dtype); `output_dtype`: floating outputs of each wrap unit are cast to
    it; `cast_forward_inputs`: floating inputs of each unit are cast to
    `param_dtype`."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True
    # Other policies for some wrap units, by the unit module's FQN (FSDP2's
    # mp_policy given per fully_shard call); the fields above are the root
    # unit's and every unit's not listed.
    units: tuple[tuple[str, "MixedPrecision"], ...] = ()
    # Parameters (FQNs) no policy casts: FSDP2's ignored_params keep their dtype.
    uncast: tuple[str, ...] = ()

    def fsdp2_reduce_dtype(self, own: torch.dtype) -> torch.dtype:
        """The dtype the installed torch's FSDP2 reduces the gradients of
        parameters of dtype `own` in under this policy: its reduce_dtype,
        else the parameters' own dtype (torch 2.15 on, their gradients'
        dtype; fp32 for fp32 parameters computing in bf16), or the
        param_dtype before 2.15."""
        if self.reduce_dtype is not None:
            return self.reduce_dtype
        return own if _FSDP2_REDUCES_IN_GRAD_DTYPE or self.param_dtype is None else self.param_dtype

    def as_fsdp2_reduces(self, model: nn.Module, ignored: tuple[str, ...] = ()) -> "MixedPrecision":
        """This policy with the reduce_dtype FSDP2 would take for `model`'s
        parameters (but the `ignored`), where it gives none and casts."""
        if self.reduce_dtype is not None or self.param_dtype is None:
            return self
        reduced = {p.dtype for name, p in model.named_parameters() if p.is_floating_point() and name not in ignored}
        own = max(reduced, key=lambda dtype: dtype.itemsize) if reduced else self.param_dtype
        return replace(self, reduce_dtype=self.fsdp2_reduce_dtype(own))

    def of_unit(self, fqn: str) -> "MixedPrecision":
        """The policy of the wrap unit whose module is `fqn` ("" the root)."""
        own = dict(self.units).get(fqn)
        return own if own is not None else MixedPrecision(self.param_dtype, self.reduce_dtype, self.output_dtype,
                                                          self.cast_forward_inputs)


@dataclass
class ParamInfo:
    fqn: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    trainable: bool
    aliases: list[str] = field(default_factory=list)  # tied: other FQNs, same tensor


@dataclass
class BufferInfo:
    fqn: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class CapturedStep:
    """The joint graph and what its placeholders and outputs mean."""

    graph: fx.Graph
    # Placeholders in order, each ("param", fqn) | ("buffer", fqn) | ("input", index).
    inputs: list[tuple[str, object]]
    params: list[ParamInfo]
    buffers: list[BufferInfo]
    batch: list[tuple[tuple[int, ...], torch.dtype]]
    loss: fx.Node
    # Gradient output node per trainable parameter FQN (None: unused parameter).
    gradients: dict[str, fx.Node | None]
    # Per call_function node: issuing module FQN ("" = the model) and source line.
    modules: dict[fx.Node, str]
    locations: dict[fx.Node, SourceLocation]
    # Forward calls in one of the model's activation-checkpoint regions: its number.
    regions: dict[fx.Node, int] = field(default_factory=dict)
    mixed_precision: MixedPrecision | None = None
    device: str = "cpu"  # the device kind the step was captured for
    # What loss_fn returned besides the loss (see `aux_structure`), and its output nodes in order.
    aux: dict | None = None
    aux_nodes: list[fx.Node] = field(default_factory=list)
    # Buffers the step updates in place (running statistics): each one's FQN
    # and its new value, which the step function returns after aux.
    buffer_updates: list[tuple[str, fx.Node]] = field(default_factory=list)


class _TrainingStep(nn.Module):
    """Wraps model + loss so that export sees one module computing the loss,
    under the autocast enabled for `device` where it is made (a call under
    `torch.autocast` computes as eager PyTorch would: see fsdpc.autocast)."""

    def __init__(self, model: nn.Module, loss_fn: Callable, device: str):
        super().__init__()
        setattr(self, _MODEL_ATTR, model)
        self._loss_fn = loss_fn
        self._device, self._autocast = device, ambient_autocast(device)

    def forward(self, *batch):
        with _casting_reads():
            if self._autocast is None:
                return self._loss_fn(getattr(self, _MODEL_ATTR), *batch)
            with torch.autocast(self._device, dtype=self._autocast):
                return self._loss_fn(getattr(self, _MODEL_ATTR), *batch)


def batch_leaves(batch: Sequence) -> tuple[list[torch.Tensor], TreeSpec]:
    """A batch's tensors in order, and its structure: each item a tensor,
    or a dict, list or tuple of them (nested), handed to loss_fn as given
    (`lambda model, batch: model(**batch).loss` for a Hugging Face batch)."""
    paths, structure = tree_flatten_with_path(tuple(batch))
    for path, leaf in paths:
        if not isinstance(leaf, torch.Tensor):
            raise CaptureError(f"batch item {keystr(path)} is a {type(leaf).__name__}; a batch holds tensors "
                               "(each item a tensor, or a dict, list or tuple of them)")
    return [leaf for _, leaf in paths], structure


def user_frame(frames, *, torch_fallback: bool = False) -> SourceLocation | None:
    """The innermost frame outside torch and fsdpc: the user's own code. With
    `torch_fallback`, a model made only of torch.nn modules gets the innermost
    torch frame instead (e.g. nn/modules/linear.py), which beats no location."""
    fallback = None
    for frame in reversed(list(frames)):
        path = os.path.abspath(frame.filename)
        internal = path.startswith(FSDPC_DIR) and not path.startswith(FSDPC_MODELS_DIR)
        if internal or frame.filename.startswith("<"):
            continue
        here = SourceLocation(frame.filename, frame.lineno, (frame.line or "").strip())
        if path.startswith(TORCH_DIR):
            fallback = fallback or here
            continue
        return here
    return fallback if torch_fallback else None


_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n?(?:[ \t]+([^\n]*))?')


def _location_from_stack_trace(stack_trace: str | None,
                               loss_location: SourceLocation | None = None) -> SourceLocation | None:
    """The user's line for a traced op. Torch records module forwards but not
    the frames of the loss function, so ops of the loss point at its `def`;
    ops inside torch.nn modules with no user code point at the torch line."""
    if not stack_trace:
        return None
    frames = [
        traceback.FrameSummary(m.group(1), int(m.group(2)), "", line=m.group(3) or "")
        for m in _FRAME_RE.finditer(stack_trace)
    ]
    found = user_frame(frames)
    if found:
        return found
    if any(os.sep + os.path.join("nn", "modules") + os.sep in f.filename for f in frames):
        return user_frame(frames, torch_fallback=True)
    return loss_location or user_frame(frames, torch_fallback=True)


def _definition_of(function: Callable) -> SourceLocation | None:
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    return SourceLocation(code.co_filename, code.co_firstlineno)


def _strip_model_prefix(path: str) -> str:
    """Export's path of a parameter, buffer or module -> the user's FQN."""
    path = _unparametrized(path)
    if path == _MODEL_ATTR:
        return ""
    return path[len(_MODEL_ATTR) + 1:] if path.startswith(_MODEL_ATTR + ".") else path


def _module_of(meta: dict) -> str | None:
    stack = meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return _strip_model_prefix(path)


@contextlib.contextmanager
def _quiet_torch_logs():
    """Torch logs graph dumps when tracing fails; our error says it better."""
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _torch_module_below(trace: types.TracebackType | None, model: nn.Module) -> str:
    """Where, below the user's innermost line, a torch.nn module of the
    model's failed (BatchNorm's `float(self.num_batches_tracked)` under
    `momentum=None`, a CTCLoss): " (in body.1, a BatchNorm1d, at
    nn/modules/batchnorm.py:193: `...`)"; "" where the user's line failed
    itself."""
    paths = {id(module): path for path, module in model.named_modules()}
    frames = list(traceback.walk_tb(trace))
    user = [index for index, (frame, line) in enumerate(frames)
            if user_frame([traceback.FrameSummary(frame.f_code.co_filename, line, frame.f_code.co_name)])]
    below = ""
    for frame, line in frames[user[-1] + 1 if user else 0:]:
        owner, filename = frame.f_locals.get("self"), os.path.abspath(frame.f_code.co_filename)
        if isinstance(owner, nn.Module) and id(owner) in paths and filename.startswith(os.path.join(TORCH_DIR, "nn")):
            code = linecache.getline(frame.f_code.co_filename, line).strip()
            below = (f" (in {paths[id(owner)] or 'the model'}, a {type(owner).__name__}, at "
                     f"{os.path.relpath(filename, TORCH_DIR)}:{line}: `{code}`)")
    return below


_DATA_DEPENDENT_SIGN = "data-dependent"  # in torch's errors of a trace that needed a tensor's value
_DATA_DEPENDENT = ("it reads a tensor's value in Python (aten::item, via bool(), .item() or .tolist()), so the "
                   "control flow depends on data, which a static training step cannot")


def _export(step: _TrainingStep, batch: tuple) -> ExportedProgram:
    # Torch prints the partial graph when tracing fails: keep what the model
    # printed only if tracing succeeds.
    printed, complained = io.StringIO(), io.StringIO()
    try:
        with _quiet_torch_logs(), contextlib.redirect_stdout(printed), \
                contextlib.redirect_stderr(complained):
            program = torch.export.export(step, batch, strict=False)
        sys.stdout.write(printed.getvalue())
        sys.stderr.write(complained.getvalue())
    except CaptureError:
        raise
    except Exception as error:  # torch raises many types; all mean "cannot capture"
        where = user_frame(traceback.extract_tb(error.__traceback__))
        text = str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        if _DATA_DEPENDENT_SIGN in text:
            reason = _DATA_DEPENDENT
        else:
            reason = f"{type(error).__name__}: {first_line}"
        if where:
            inside = _torch_module_below(error.__traceback__, getattr(step, _MODEL_ATTR))
            raise CaptureError(f"{where}: cannot capture `{where.code}`: {reason}{inside}") from error
        raise CaptureError(f"cannot capture the training step: {reason}") from error
    # Export's training IR is not yet functional nor in core ATen: the joint
    # trace makes it both in the same pass (run_decompositions would trace the
    # whole step once more: 6.6 of 14 s on the 0.9B Llama).
    return program


def _alias_groups(model: nn.Module) -> dict[int, list[str]]:
    """Every FQN of every parameter, grouped by tensor identity."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return groups


def aux_count(aux: dict | None) -> int:
    """How many tensors an `aux_structure` holds."""
    if aux is None:
        return 0
    if aux["kind"] == "tensor":
        return 1
    return len(aux["keys"]) if aux["kind"] == "dict" else aux["count"]


def aux_structure(program: ExportedProgram) -> dict | None:
    """What loss_fn returned besides the loss, checked: None (the loss
    alone), or for `(loss, aux)` the structure of aux as JSON, which the
    program cache keeps and every rank rebuilds: {"kind": "tensor"},
    {"kind": "tuple" or "list", "count": n}, or {"kind": "dict", "keys":
    [...]} (metrics: an accuracy, an MoE balancing loss, token counts)."""
    for spec in program.graph_signature.output_specs:
        if spec.kind not in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
            raise CaptureError(f"unsupported output of the training step: {spec.kind.name}")
    user_outputs = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    if len(user_outputs) == 1:
        return None
    returned = program.call_spec.out_spec
    usage = ("loss_fn must return the loss, or (loss, aux) with aux a tensor, a tuple or list of tensors or a dict "
             "of them by name")
    if returned.type not in (tuple, list) or len(returned.children()) != 2 \
            or not returned.children()[0].is_leaf():
        kind = returned.type.__name__ if returned.type is not None else "tensor"
        raise CaptureError(f"{usage}; it returned a {kind} of {len(user_outputs)} values"
                           + (" (a model's output object: return its .loss)"
                              if isinstance(returned.type, type) and issubclass(returned.type, dict) else ""))
    if not all(isinstance(spec.arg, TensorArgument) for spec in user_outputs):
        raise CaptureError(f"{usage}; aux holds a value that is not a tensor (torch.tensor(x) makes one)")
    aux = returned.children()[1]
    if aux.is_leaf():
        return {"kind": "tensor"}
    if all(child.is_leaf() for child in aux.children()):
        if aux.type in (tuple, list):
            return {"kind": aux.type.__name__, "count": len(aux.children())}
        if aux.type is dict and all(isinstance(key, str) for key in aux.context):
            return {"kind": "dict", "keys": list(aux.context)}
    raise CaptureError(f"{usage}; aux is a {aux.type.__name__} that holds {aux.num_leaves} values nested or under "
                       "keys other than strings")


def _cast_floats(value, dtype: torch.dtype):
    return torch.utils._pytree.tree_map(
        lambda v: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v, value)


class _TableView(dict):
    """A module's `_parameters` or `_buffers` as capture sees it: a view of
    `entries` (the table that holds the tensors) that nn.Module's code and
    the model's use as the table itself.

    - `safe_of` (real name -> name held): entries held under other names,
      as `_tracing_safe_names` holds names that are not identifiers; a read
      or write by either name finds the entry.
    - `dtypes` (name held -> dtype): mp_policy's casts. While the traced
      step runs (`_casting_reads`) each such parameter reads cast to its
      dtype, as FSDP2's unsharded parameters are in forward: by attribute
      (`self.weight`), as `self._parameters["weight"]`, or through
      `parameters()` (Hugging Face's `self.dtype`); the module's class stays
      its own. Outside the step (export's and fsdpc's own bookkeeping) the
      parameters read as themselves. One cast per parameter and version
      while a step runs (`_StepsRunning`): a parameter read twice, or tied,
      is one tensor, as FSDP2's unsharded one; a cast written back
      (`torch.func.functional_call` restoring what it read) stores the
      parameter it was made from."""

    def __init__(self, entries: dict, safe_of: dict[str, str] | None = None,
                 dtypes: dict[str, torch.dtype] | None = None):
        super().__init__()
        self.entries, self.safe_of, self.dtypes = entries, safe_of or {}, dtypes or {}

    def _key(self, name):
        return self.safe_of.get(name, name)

    def __getitem__(self, name):
        key = self._key(name)
        value = self.entries[key]
        dtype = self.dtypes.get(key)
        if value is None or dtype is None or not _CASTING_READS.depth:
            return value
        return _CASTING_READS.cast(value, dtype)

    def __setitem__(self, name, value):
        key = self._key(name)
        self.entries[key] = _CASTING_READS.parameter_of(value) if key in self.dtypes else value

    def get(self, name, default=None):
        return self[name] if name in self else default

    def __contains__(self, name):
        return self._key(name) in self.entries

    def __iter__(self):
        return iter(self.entries)

    def __reversed__(self):
        return reversed(self.entries)

    def __len__(self):
        return len(self.entries)

    def __delitem__(self, name):
        del self.entries[self._key(name)]

    def __eq__(self, other):
        return dict(self.items()) == (dict(other.items()) if isinstance(other, _TableView) else other)

    __hash__ = None

    def pop(self, name, *default):
        return self.entries.pop(self._key(name), *default)

    def popitem(self):
        return self.entries.popitem()

    def setdefault(self, name, default=None):
        if name not in self:
            self[name] = default
        return self[name]

    def update(self, *others, **entries):
        for name, value in dict(*others, **entries).items():
            self[name] = value

    def clear(self):
        self.entries.clear()

    def copy(self):
        return dict(self.items())

    def __or__(self, other):
        return dict(self.items()) | other

    def __ior__(self, other):
        self.update(other)
        return self

    def keys(self):
        return KeysView(self)

    def values(self):
        return ValuesView(self)

    def items(self):
        return ItemsView(self)

    def __repr__(self):
        return repr(dict(self.items()))


class _StepsRunning(threading.local):
    """The traced steps this thread runs (another thread, an async
    checkpoint's, reads the parameters themselves), and the casts made in
    them: one per parameter, version, dtype and grad mode (a cast made
    without grad carries none to its parameter), kept until the outermost
    step returns."""

    depth = 0

    def __init__(self):
        self.casts: dict[tuple, torch.Tensor] = {}  # (id(parameter), version, dtype, grad mode) -> its cast
        self.made_from: dict[int, torch.Tensor] = {}  # id(cast) -> its parameter (both held: ids stay unique)

    def cast(self, parameter: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if parameter.is_inference():  # has no version to key by
            return parameter.to(dtype)
        key = (id(parameter), parameter._version, dtype, torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        made = self.casts.get(key)
        if made is None:
            made = self.casts[key] = parameter.to(dtype)
            self.made_from[id(made)] = parameter
        return made

    def parameter_of(self, value):
        """`value`, or the parameter it is a cast of."""
        return self.made_from.get(id(value), value)

    def forget(self) -> None:
        self.casts, self.made_from = {}, {}


_CASTING_READS = _StepsRunning()


@contextlib.contextmanager
def _casting_reads() -> Iterator[None]:
    """mp_policy's casts read where the step's code reads parameters (the traced step runs)."""
    _CASTING_READS.depth += 1
    try:
        yield
    finally:
        _CASTING_READS.depth -= 1
        if not _CASTING_READS.depth:
            _CASTING_READS.forget()


_PARAMETRIZATION_MODULE = re.compile(r"(^|\.)parametrizations\.[^.]+\.\d+$")


def _unparametrized(path: str) -> str:
    """A module of a parametrization of the user's (torch.nn.utils.parametrize:
    weight norm, spectral norm) -> the module whose tensor it computes:
    `fc1.parametrizations.weight.0` -> `fc1`, the root's `parametrizations.scale.0`
    -> ``. Parameters and buffers keep their names (`fc1.parametrizations.weight.original0`),
    as named_parameters and state_dict name them."""
    return _PARAMETRIZATION_MODULE.sub("", path)


@contextlib.contextmanager
def _mixed_precision_casts(model: nn.Module, units: dict[str, nn.Module], policy: MixedPrecision | None, *,
                           everywhere: bool = False):
    """FSDP2's MixedPrecisionPolicy while export traces, each wrap unit's
    own (`units`: the unit modules by FQN, "" the model): parameters read in
    their unit's compute dtype inside the step (`_TableView`; with
    `everywhere`, anywhere this thread reads them inside the context: an
    eager reference, the joint trace's custom Functions; a parametrization of the user's computes
    from its originals cast, as FSDP2 gathers them), and casts of each
    unit's floating inputs and outputs (forward hooks). Undone afterwards."""
    handles, tables = [], []
    try:
        if policy is not None:
            _cast_where_read(model, units, policy, handles, tables)
        with _casting_reads() if everywhere else contextlib.nullcontext():
            yield
    finally:
        for handle in handles:
            handle.remove()
        for module, table in reversed(tables):
            module.__dict__["_parameters"] = table


def _cast_where_read(model: nn.Module, units: dict[str, nn.Module], policy: MixedPrecision, handles: list,
                     tables: list) -> None:
    """`_mixed_precision_casts`' casts, each recorded as it is made (its
    hook's handle in `handles`, a module's own parameter table in `tables`)
    for the caller to undo, after an error too."""
    plan = UnitPlan([Unit(ROOT_UNIT, "", is_root=True)] + [Unit(fqn, "") for fqn in units if fqn])
    names: dict[int, list[str]] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(fqn)
    for module in list(model.modules()):
        dtypes = {}
        for name, param in list(module._parameters.items()):
            if param is None or not param.is_floating_point() or set(names[id(param)]) & set(policy.uncast):
                continue
            unit = plan.owner(names[id(param)])  # tied across units: the root's, as FSDP2 rules
            dtype = policy.of_unit("" if unit == ROOT_UNIT else unit).param_dtype
            if dtype is not None and param.dtype != dtype:
                dtypes[name] = dtype
        if dtypes:
            table = module.__dict__["_parameters"]
            tables.append((module, table))
            module.__dict__["_parameters"] = (_TableView(table.entries, table.safe_of, dtypes)
                                              if isinstance(table, _TableView) else _TableView(table, dtypes=dtypes))
    for fqn, module in units.items():
        own = policy.of_unit(fqn)
        if own.cast_forward_inputs and own.param_dtype is not None:
            handles.append(module.register_forward_pre_hook(
                lambda _, args, kwargs, dtype=own.param_dtype: (_cast_floats(args, dtype),
                                                                _cast_floats(kwargs, dtype)),
                with_kwargs=True))
        if own.output_dtype is not None:
            handles.append(module.register_forward_hook(
                lambda _, args, output, dtype=own.output_dtype: _cast_floats(output, dtype)))


@contextlib.contextmanager
def _tracing_safe_names(model: nn.Module):
    """Renames parameters and buffers whose names are not identifiers for the
    duration of the capture; yields {safe FQN: real FQN} for every renamed one."""
    real_fqn: dict[str, str] = {}
    swapped: list[tuple[nn.Module, str, dict, _TableView]] = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        for table in ("_parameters", "_buffers"):
            entries = module.__dict__[table]
            hostile = [name for name in entries if not name.isidentifier()]
            if not hostile:
                continue
            renamed = {name: f"fsdpc_renamed_{len(real_fqn) + i}" for i, name in enumerate(hostile)}
            for name, safe in renamed.items():
                real_fqn[f"{prefix}.{safe}" if prefix else safe] = f"{prefix}.{name}" if prefix else name
            aliased = _TableView({renamed.get(name, name): value for name, value in entries.items()}, renamed)
            swapped.append((module, table, entries, aliased))
            module.__dict__[table] = aliased
    try:
        yield real_fqn
    finally:
        for module, table, entries, aliased in reversed(swapped):
            real_of = {safe: name for name, safe in aliased.safe_of.items()}
            entries.clear()
            entries.update({real_of.get(name, name): value for name, value in aliased.entries.items()})
            module.__dict__[table] = entries


_MOST_ELEMENTS_AS_OPS = 256  # Python data made into a tensor by ops; larger data stays a constant (refused)


def _numbers_only(data) -> bool:
    """Whether `data` is a number or a (nested) list or tuple of numbers only."""
    if type(data) in (bool, int, float):
        return True
    return isinstance(data, (list, tuple)) and all(_numbers_only(item) for item in data)


def _made_by_ops(data, dtype: torch.dtype | None, device) -> torch.Tensor | None:
    """`torch.tensor(data, dtype=dtype, device=device)` made by ops, whose
    values are then in the graph: one `full` per element, stacked and
    shaped (and one `empty` for no elements); None where `data` is not
    numbers or holds more than _MOST_ELEMENTS_AS_OPS of them."""
    if not _numbers_only(data):
        return None
    try:
        with _disable_current_modes():  # read on the host, untraced: its shape, dtype and values
            reference = torch.tensor(data, dtype=dtype, device="cpu")
            shape, dtype, values = tuple(reference.shape), reference.dtype, reference.flatten().tolist()
    except (TypeError, ValueError, RuntimeError):
        return None
    if len(values) > _MOST_ELEMENTS_AS_OPS:
        return None
    if not values:
        return torch.empty(shape, dtype=dtype, device=device)
    if not shape:
        return torch.full((), values[0], dtype=dtype, device=device)
    return torch.stack([torch.full((), value, dtype=dtype, device=device) for value in values]).reshape(shape)


_SEQUENCE_AS_TUPLE_BELOW = 32  # torch's treatSequenceAsTuple: a shorter list holding sequences is a tuple


def _index_as_ops(index, device, shape: Sequence[int]):
    """An index of a tensor of `shape` with its lists of numbers (advanced
    indexing: `x[..., [0, 2]]`) made by ops, as `_made_by_ops` makes them,
    and its lists of booleans, masks of known values, as the positions they
    select (`_mask_positions`: what torch indexes by, and a shape known
    before the data). A short list holding sequences, slices or None is a
    tuple of indices, as torch reads it at the top (treatSequenceAsTuple);
    inside a tuple a list is data."""
    if isinstance(index, list) and 0 < len(index) < _SEQUENCE_AS_TUPLE_BELOW and any(
            isinstance(item, (list, tuple, slice, torch.Tensor)) or item is None or item is Ellipsis
            for item in index):
        index = tuple(index)
    items = list(index) if isinstance(index, tuple) else [index]
    made = []
    for item, dim in zip(items, _dims_indexed(items, shape)):
        depth = _mask_depth(item)
        if depth:
            made.extend(_mask_positions(item, depth, device, shape, dim))
        elif isinstance(item, list) and item and _numbers_only(item):
            values = _made_by_ops(item, None, device)
            made.append(item if values is None else values)
        else:
            made.append(item)
    return tuple(made) if isinstance(index, tuple) or len(made) != 1 else made[0]


def _mask_depth(item) -> int | None:
    """How many dimensions a (nested, rectangular) list of booleans indexes;
    None for anything else."""
    if not isinstance(item, list) or not item:
        return None
    if all(type(entry) is bool for entry in item):
        return 1
    inner = [_mask_depth(entry) for entry in item]
    return inner[0] + 1 if inner[0] and all(depth == inner[0] for depth in inner) else None


def _mask_positions(mask: list, depth: int, device, shape: Sequence[int], dim: int) -> list:
    """The positions a mask of `depth` dimensions selects from dimensions
    `dim`... of a tensor of `shape`, one index made by ops per dimension,
    as torch turns a mask into indices; a mask of other sizes is refused as
    torch refuses it."""
    sizes, level = [], mask
    for _ in range(depth):
        sizes.append(len(level))
        level = level[0]
    wanted = list(shape[dim:dim + depth])
    if sizes != wanted:
        raise IndexError(f"the mask {mask} has {sizes[0]} entries and indexes dimension {dim} of a tensor of shape "
                         f"{list(shape)}, of size {wanted[0] if wanted else 0}" if depth == 1 else
                         f"the mask {mask} has shape {sizes} and indexes dimensions {dim} to {dim + depth - 1} of a "
                         f"tensor of shape {list(shape)}, sized {wanted} there")
    coordinates: list[tuple[int, ...]] = []

    def walk(level, at: tuple[int, ...]) -> None:
        if len(at) == depth:
            if level:
                coordinates.append(at)
            return
        if len(level) != sizes[len(at)]:
            raise IndexError(f"the mask {mask} is ragged")
        for i, entry in enumerate(level):
            walk(entry, (*at, i))

    walk(mask, ())
    made = [_made_by_ops([at[axis] for at in coordinates], torch.int64, device) for axis in range(depth)]
    return made if all(index is not None for index in made) else [mask]


def _dims_indexed(items: Sequence, shape: Sequence[int]) -> list[int]:
    """The dimension of a tensor of `shape` that each item of an index
    starts at (None and a boolean add one, `...` spans those the other items
    leave, a mask, a boolean or uint8 tensor or a list of booleans, indexes
    as many as it has)."""
    def spanned(item) -> int:
        if item is None or item is Ellipsis or type(item) is bool:
            return 0
        if isinstance(item, torch.Tensor) and item.dtype in (torch.bool, torch.uint8):
            return item.dim()
        return _mask_depth(item) or 1

    # torch counts a list as one dimension where it works out what `...` spans.
    left = len(shape) - sum(1 if isinstance(item, list) else spanned(item) for item in items)
    dims, dim = [], 0
    for item in items:
        dims.append(dim)
        dim += left if item is Ellipsis else spanned(item)
    return dims


class _PythonDataAsOps(torch.overrides.TorchFunctionMode):
    """Tensors made from Python numbers inside forward are made by ops
    (`_made_by_ops`): export lifts a tensor made from Python data to a
    constant input, and on the meta device (where capture runs) its value
    is lost; as ops, the numbers are in the graph. So are `torch.tensor`
    and `as_tensor` of numbers (Hugging Face's masks do
    `torch.tensor(0.0, device=...)`, its key/value cache starts from
    `torch.tensor([])`), `x.new_tensor(...)`, and the lists of an index
    (`qkv[..., [-2], :]`, Falcon's attention)."""

    _FACTORIES = (torch.tensor, torch.as_tensor)
    _INDEXING = (torch._C.TensorBase.__getitem__, torch._C.TensorBase.__setitem__)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        made = None
        if func in self._FACTORIES and len(args) == 1 and set(kwargs) <= {"dtype", "device", "requires_grad"}:
            made = _made_by_ops(args[0], kwargs.get("dtype"), kwargs.get("device"))
        elif func is torch.Tensor.new_tensor and len(args) == 2 and set(kwargs) <= {"dtype", "device",
                                                                                        "requires_grad"}:
            made = _made_by_ops(args[1], kwargs.get("dtype") or args[0].dtype, kwargs.get("device") or args[0].device)
        elif func in self._INDEXING and len(args) >= 2 and isinstance(args[0], torch.Tensor):
            args = (args[0], _index_as_ops(args[1], args[0].device, args[0].shape), *args[2:])
        if made is not None:
            return made.requires_grad_(True) if kwargs.get("requires_grad") else made
        return func(*args, **kwargs)


def _at_the_users_line(message: str) -> CaptureError:
    """`message` about a call the step's Python just made, at the user's
    line that made it (fsdpc's own frames, this one's too, are skipped)."""
    return CaptureError(f"{user_frame(traceback.extract_stack()) or 'the model'}: {message}")


@contextlib.contextmanager
def _refusing_untraceable_autocast(device: str) -> Iterator[None]:
    """Refused by line: `torch.autocast("cuda")` enabled in a step captured
    for CUDA on a machine without a GPU (autocast's casts are traced on CUDA
    tensors, fsdpc.autocast, whose backward needs a GPU), and autocast
    switched on or off by `torch.set_autocast_enabled` in the step's own
    code, which export does not record (the step would ignore it)."""
    autocast = torch.amp.autocast_mode.autocast
    enter, set_enabled = autocast.__enter__, torch.set_autocast_enabled

    def entered(self):
        if self._enabled and self.device == "cuda" == device and not torch.cuda.is_available():
            raise _at_the_users_line(
                f"torch.autocast('cuda', dtype={self.fast_dtype}) in a step captured for CUDA on a machine without "
                "a GPU: autocast's casts are traced on CUDA tensors, whose backward needs a GPU; capture on the GPU "
                "host (fsdpc.shard there does), or pass mp_policy=MixedPrecisionPolicy(param_dtype=...) instead")
        return enter(self)

    def switched(*args, **kwargs):
        if not machinery_file(sys._getframe(1).f_code.co_filename):  # torch.autocast's own switch passes
            raise _at_the_users_line(
                "torch.set_autocast_enabled(...) inside the step: capture keeps autocast regions entered with "
                "`with torch.autocast(...)` only; use that")
        return set_enabled(*args, **kwargs)

    with patched(autocast, __enter__=entered), patched(torch, set_autocast_enabled=switched):
        yield


@contextlib.contextmanager
def _refusing_inner_backward() -> Iterator[None]:
    """A backward the step's own Python runs (`loss.backward()` in
    loss_fn, `torch.autograd.grad` for a gradient penalty) is refused by
    line: fsdpc differentiates the loss once, itself, and capture's tensors
    do not require grad (torch's own error says only that)."""
    def refused(what: str, why: str):
        def call(*args, **kwargs):
            raise _at_the_users_line(f"{what} inside the step: {why}")
        return call

    with patched(torch.autograd, grad=refused(
            "torch.autograd.grad", "fsdpc differentiates the loss once, itself; gradients inside the step (a "
            "gradient penalty, double backward) are not supported")), \
            patched(torch.autograd, backward=refused(
                "backward()", "fsdpc runs the loss's backward itself: return the loss from loss_fn")):
        yield


def outside_tensor(loss_fn: Callable, model: nn.Module) -> str | None:
    """Why a step could not be captured when the loss function or a forward
    reads a tensor from outside itself, found in their code: one that is not
    the model's (class weights for cross entropy, a learnable temperature,
    a mask a model file keeps in a global), a module outside the model
    holding one (`nn.CrossEntropyLoss(weight=w)`), or the model's own read
    directly rather than through the model (capture swaps those). Capture
    meets such a tensor as a device mismatch or a constant; this names the
    variable and its line, and says how to bring it in. None where the code
    reads none (the failure was something else)."""
    owned = {id(tensor): (kind, fqn) for kind, named in (("parameter", model.named_parameters()),
                                                        ("buffer", model.named_buffers()))
             for fqn, tensor in named}
    inside = {id(module) for module in model.modules()}
    for described, read_now, _, where in free_variables(loss_fn, model):
        value = read_now()
        if isinstance(value, nn.Module) and id(value) not in inside:
            held = [name for name, tensor in (*value.named_parameters(), *value.named_buffers())
                    if id(tensor) not in owned]
            if held:
                name = described.rpartition(" ")[2].strip("'")
                name = name if name.isidentifier() else "loss_module"
                return (f"{where}: {described} is a {type(value).__name__} holding tensors that are not the "
                        f"model's ({', '.join(held)}; another model's weights, a teacher's?): the compiled step "
                        f"reads tensors from the model and the batch only; make it a submodule of the model "
                        f"(`model.{name} = {name}`, frozen with requires_grad_(False) if it does not train, called "
                        f"as `model.{name}(...)` in loss_fn), so that its tensors are the model's")
        if isinstance(value, torch.Tensor) and id(value) in owned:
            kind, fqn = owned[id(value)]
            return (f"{where}: {described} is the model's {kind} '{fqn}', read directly: read it through the model "
                    f"loss_fn is given (`m.{fqn}`) or through `self` in a forward, since the step works on the "
                    "model's tensors by their place in it (capture swaps them, and the step reads each rank's shard)")
        if isinstance(value, torch.Tensor):
            shape = "x".join(map(str, value.shape)) or "a scalar"
            return (f"{where}: {described} is a tensor ({shape}, {value.dtype}, on {value.device}) that is not the "
                    "model's: the compiled step reads tensors from the model and the batch only; "
                    + ("make it a parameter of the model (`model.register_parameter(\"temperature\", "
                       "nn.Parameter(t))`, read as `model.temperature` in loss_fn, or of the module whose forward "
                       "reads it), so that it is sharded, trained and saved" if value.requires_grad else
                       "make it a buffer of the model (`model.register_buffer(\"class_weights\", t)`, read as "
                       "`model.class_weights` in loss_fn, or of the module whose forward reads it; changes to it "
                       "are then seen), or pass it in the batch"))
    return None


# What meeting a tensor from outside the model looks like to capture.
_OUTSIDE_TENSOR_SIGNS = ("FakeTensorDeviceMismatchError", "neither the model's parameter or buffer nor a batch item",
                         "Unhandled FakeTensor Device Propagation")  # torch 2.11's words for it in a Function's forward


@contextlib.contextmanager
def _explaining_outside_tensors(loss_fn: Callable, model: nn.Module, device: str) -> Iterator[None]:
    """A capture that failed on a tensor from outside the model says which
    variable held it, and where (`outside_tensor`); one the step made on the
    CPU for a GPU target says so."""
    try:
        yield
    except CaptureError as error:
        text = str(error)
        if not any(sign in text for sign in _OUTSIDE_TENSOR_SIGNS):
            raise
        explained = outside_tensor(loss_fn, model)
        if explained is not None:
            raise CaptureError(explained) from error
        made_on_cpu = re.match(r"(.*?): (?:FakeTensorDeviceMismatchError|RuntimeError: Unhandled FakeTensor Device "
                               r"Propagation).*\bcpu\b", text, re.S)  # newer torch's words, or 2.11's
        if device == "cpu" or made_on_cpu is None:
            raise
        raise CaptureError(
            f"{made_on_cpu[1]}: a tensor made on the CPU (by a factory without device=, such as "
            f"torch.arange(n) or torch.ones(n, n)) meets the model's, which are on {device}; eager PyTorch "
            "refuses it there too: make it with device= of a tensor the step has (torch.arange(n, "
            f"device=x.device)), or make {device} the default device "
            f"(torch.set_default_device(\"{device}\"))") from error


# Python's and NumPy's functions that draw random numbers from their global generators.
_HOST_RANDOM = ("random", "uniform", "randint", "randrange", "choice", "choices", "sample", "shuffle", "gauss",
                "normalvariate", "lognormvariate", "expovariate", "vonmisesvariate", "gammavariate", "betavariate",
                "paretovariate", "weibullvariate", "triangular", "getrandbits", "binomialvariate")
_NUMPY_RANDOM = ("rand", "randn", "random", "random_sample", "ranf", "sample", "uniform", "randint", "choice",
                 "permutation", "shuffle", "normal", "standard_normal", "binomial", "poisson", "beta", "gamma",
                 "exponential", "bernoulli", "integers",
                 "default_rng", "Generator", "RandomState")  # a generator made in the step draws


def _refuse_host_generators(loss_fn: Callable, model: nn.Module) -> None:
    """A random generator object, or one of its methods, held by name where
    the loss function or a forward reads it (`rng = np.random.default_rng()`,
    `from random import uniform`): `_refusing_host_random` cannot catch its
    draws, so it is refused as read (CaptureError naming the line)."""
    numpy = sys.modules.get("numpy")
    generators = (random.Random, *((numpy.random.Generator, numpy.random.RandomState) if numpy else ()))
    for described, read_now, _, where in free_variables(loss_fn, model):
        value = read_now()
        if isinstance(value, generators) or isinstance(getattr(value, "__self__", None), generators):
            raise CaptureError(
                f"{where}: {described} is a host random number generator ({type(value).__name__}): the compiled "
                "step would hold the values it drew when the step was compiled, the same in every call; draw "
                "them with torch (torch.rand, torch.randint, torch.bernoulli: drawn anew in every call, from "
                "each rank's generator), or pass them in the batch")


@contextlib.contextmanager
def _refusing_host_random() -> Iterator[None]:
    """Random numbers drawn on the host while the step's Python runs
    (Python's `random`, a `random.Random`, NumPy's global generator: a mask
    ratio, LayerDrop) are refused by line: the compiled step would hold the
    value drawn at capture, the same in every call. Only draws that happen
    are refused: code that never runs (LayerDrop at 0) passes."""
    def refused(name: str, original: Callable):
        def draw(*args, **kwargs):
            if machinery_file(sys._getframe(1).f_code.co_filename):  # tempfile's names, torch's own
                return original(*args, **kwargs)
            raise _at_the_users_line(
                f"{name}() draws a random number on the host inside the step: the compiled "
                "step would hold the value drawn when it was compiled, the same in every call; draw it with torch "
                "(torch.rand, torch.randint, torch.bernoulli: drawn anew in every call, from each rank's "
                "generator), or pass it in the batch")
        return draw

    with contextlib.ExitStack() as stack:
        owners = [(random, "random"), (random.Random, "random.Random")]
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            owners.append((numpy.random, "numpy.random"))
        for owner, prefix in owners:
            names = _NUMPY_RANDOM if prefix == "numpy.random" else _HOST_RANDOM
            present = {name: refused(f"{prefix}.{name}", getattr(owner, name)) for name in names
                       if callable(getattr(owner, name, None))}
            stack.enter_context(patched(owner, **present))
        yield


@contextlib.contextmanager
def _attribute_reads(model: nn.Module) -> Iterator[set[tuple[str, str]]]:
    """The plain instance attributes of the model's modules (numbers,
    strings, flags, tuples of them) that the step reads, and the plain
    attributes it reads of configuration objects they hold (a Hugging Face
    `config`, a dataclass of the user's), as (module path, attribute path):
    a dropout's `p`, a norm's `eps`, a scale of the user's own,
    `config.use_cache`. The compiled step holds the values they
    had, so the sharded module compiles anew for a call after one of them
    changed. Public names read and found absent count too (`getattr(self,
    "shift", None)`, `hasattr(config, "scale")`): setting one later changes
    what the step computes."""
    paths: dict[int, str] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), path)
    held = configurations(model)
    reads: set[tuple[str, str]] = set()

    def read(self, name):
        try:
            value = object.__getattribute__(self, name)
        except AttributeError:
            if id(self) in paths and not name.startswith("_") and name not in MODULE_INTERNALS \
                    and not _module_member(self, name):
                reads.add((paths[id(self)], name))
            raise
        if name not in MODULE_INTERNALS and id(self) in paths and watched_value(value) is not UNWATCHED \
                and (name in object.__getattribute__(self, "__dict__") or class_setting(type(self), name)):
            reads.add((paths[id(self)], name))
        return value

    def reading(kind: type):
        inner = kind.__getattribute__

        def read_configuration(self, name):
            holder = held.get(id(self))
            try:
                value = inner(self, name)
            except AttributeError:
                if holder is not None and not name.startswith("_"):
                    reads.add((holder[1], f"{holder[2]}.{name}"))
                raise
            # Any plain value, properties and aliases included (`use_return_dict`, GPT-2's `hidden_size`):
            # reading it again after training began gives its value then.
            if holder is not None and not name.startswith("__") and watched_value(value) is not UNWATCHED:
                reads.add((holder[1], f"{holder[2]}.{name}"))
            return value
        return read_configuration

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(nn.Module, __getattribute__=read))
        for kind in {type(value): None for value, _, _ in held.values()}:
            stack.enter_context(patched(kind, __getattribute__=reading(kind)))
        yield reads


def _module_member(module: nn.Module, name: str) -> bool:
    """`name` is one of the module's parameters, buffers or submodules,
    which nn.Module's __getattr__ finds after plain lookup fails."""
    return any(name in object.__getattribute__(module, members)
               for members in ("_parameters", "_buffers", "_modules"))


def class_setting(kind: type, name: str) -> bool:
    """`name` is a plain value a module class below nn.Module holds
    (`class Block(nn.Module): scale = 1.0`), which a loop may change on the
    class or override on an instance; not a property or a dunder."""
    if name.startswith("__"):
        return False
    for cls in kind.__mro__:
        if cls is nn.Module:
            return False
        if name in cls.__dict__:
            return watched_value(cls.__dict__[name]) is not UNWATCHED
    return False


@contextlib.contextmanager
def _saved_tensors_hooks_entered() -> Iterator[list[str]]:
    """Where the step enters saved-tensor hooks of its own (`save_on_cpu`,
    torchtune's activation offloading): the joint trace saves what backward
    needs itself, so they do not apply (said by `say_ignored_hooks`).
    torch.utils.checkpoint's own hooks are its business (`checkpoint_regions`)."""
    hooks = torch.autograd.graph.saved_tensors_hooks
    enter = hooks.__enter__
    lines: list[str] = []

    def entered(self):
        where = user_frame(traceback.extract_stack()[:-1])
        if where is not None and type(self).__module__ != torch_checkpoint.__name__:  # not checkpoint's own
            lines.append(str(where))
        return enter(self)

    with patched(hooks, __enter__=entered):
        yield lines


def say_ignored_hooks(lines: Sequence[str]) -> None:
    """Warns that the step's saved-tensor hooks are not applied."""
    if lines:
        warnings.warn(f"fsdpc: {lines[0]}{f' (and {len(lines) - 1} more)' if len(lines) > 1 else ''}: saved-tensor "
                      "hooks (save_on_cpu, activation offloading) are not applied: the compiled step keeps its "
                      "activations on the device; checkpointing (the model's torch.utils.checkpoint, or the "
                      "pipeline's checkpoint=) trades compute for that memory, and the memory report shows the "
                      "peak", stacklevel=user_stacklevel())


@dataclass
class Observed:
    """What tracing saw besides the graph: the model's checkpoint regions,
    the module attributes the step read (`_attribute_reads`) and where it
    entered saved-tensor hooks (`_saved_tensors_hooks_entered`)."""

    regions: CheckpointRegions
    attribute_reads: set[tuple[str, str]]
    ignored_hooks: list[str]
    applied: list  # the custom autograd Functions' calls (functions.kept_whole)


def _factory_device(holding: torch.device, target: str) -> torch.device | None:
    """Where a tensor the step makes without device= (`torch.arange(T)`,
    `torch.ones(T, T)`) goes while capture holds the step's tensors on
    `holding` (meta): there, where eager would make it beside the model's,
    on the target's (the default device is the target's: a CPU job; a GPU
    job that set `torch.set_default_device`). None where it stays the
    default: eager's would be on another device than the model's, and
    capture says so as eager would."""
    if holding.type == target or torch.get_default_device().type != target:
        return None
    return holding


@contextlib.contextmanager
def capture_modes(model: nn.Module, units: dict[str, nn.Module], mixed_precision: MixedPrecision | None,
                  device: str) -> Iterator[Observed]:
    """What forward runs under while it is traced for `device`: the policy's
    casts, the fused attention, RMSNorm and scalar-tensor modes,
    nn.TransformerEncoder's nested path as eager takes it, BatchNorm's
    cumulative average and SyncBatchNorm's sums over ranks, the marks
    on the model's own checkpoint regions (fsdpc.checkpointing), the record
    of module attributes read, and autocast regions recorded
    (fsdpc.autocast)."""
    held = next(itertools.chain(model.parameters(), model.buffers()), None)
    factories = _factory_device(held.device, device) if held is not None else None
    # The model's own modules are named before the casts add theirs.
    with (_attribute_reads(model) as reads, _mixed_precision_casts(model, units, mixed_precision),
          _python_rewrites(device, factories), nested_encoders_as_eager(), batch_norms_traceable(),
          checkpoint_regions() as regions, recording_regions(device),
          _refusing_untraceable_autocast(device), _refusing_inner_backward(), _refusing_host_random(),
          functions.kept_whole(lambda: _python_rewrites(device, factories)) as applied,
          _saved_tensors_hooks_entered() as hooks):
        yield Observed(regions, reads, hooks, applied)


@dataclass
class ForwardTrace:
    """Export's trace of forward + loss, before the joint trace: what the
    joint trace reads, and a fingerprint of it."""

    program: ExportedProgram
    step: _TrainingStep
    batch: tuple
    aliases: dict[int, list[str]]
    real_fqn: dict[str, str]
    loss_fn: Callable
    mixed_precision: MixedPrecision | None
    device: str
    saved: set[SavedCall]  # the calls the model's selective checkpoint policies save
    attribute_reads: set[tuple[str, str]]  # (module path, name): see _attribute_reads
    aux: dict | None  # what loss_fn returned besides the loss: see aux_structure
    structure: str  # the batch's (batch_leaves); `batch` holds its tensors
    scaled_loss: bool = False  # backward seeded by a loss scale, the step's last input: see _joint_step
    applied: list = field(default_factory=list)  # custom autograd Functions' calls: see functions.kept_whole
    units: dict[str, nn.Module] = field(default_factory=dict)  # the wrap units' modules, by FQN ("" the model)

    def fingerprint(self) -> str:
        """Everything the joint trace and the IR are made from: every op of
        the forward with its literal arguments, result metadata, module and
        source stack (so whatever Python the trace ran is in it as the value
        it had), the contents of the source files in those stacks, the
        signature, the parameters', buffers' and batch's metadata, ties,
        names, the loss's definition, the policy, the target device, the
        model's checkpoint regions and what their selective policies save."""
        parts = [self.device, repr(self.mixed_precision), str(_definition_of(self.loss_fn)),
                 sorted(self.aliases.values()), sorted(self.real_fqn.items()), str(self.program.graph_signature),
                 [(name, tuple(t.shape), str(t.dtype), t.requires_grad)
                  for name, t in (*self.program.named_parameters(), *self.program.named_buffers())],
                 [(tuple(t.shape), str(t.dtype)) for t in self.batch], self.structure, sorted(self.saved),
                 repr(self.aux), self.scaled_loss]
        nodes = [node for module in self.program.graph_module.modules() if isinstance(module, fx.GraphModule)
                 for node in module.graph.nodes]  # with the regions' (autocast, no_grad)
        for node in nodes:
            value = node.meta.get("val")
            shape = ((tuple(value.shape), str(value.dtype), value.stride(), str(value.device))
                     if isinstance(value, torch.Tensor) else repr(value))
            parts.append((node.format_node(), shape, node.meta.get("stack_trace"),
                          repr(node.meta.get("nn_module_stack")), (node.meta.get("custom") or {}).get(REGION_KEY)))
        parts.append(cache.source_digests(match.group(1) for node in nodes
                                    for match in _FRAME_RE.finditer(node.meta.get("stack_trace") or "")))
        parts.append(functions.code_key(self.applied))
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    def joint(self) -> CapturedStep:
        return _joint_step(self.program, self.step, self.batch, self.aliases, self.real_fqn, self.loss_fn,
                           self.mixed_precision, self.device, self.saved, self.aux, self.scaled_loss, self.applied,
                           self.units)


@contextlib.contextmanager
def traced_forward(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *,
                   mixed_precision: MixedPrecision | None = None, unit_modules: Sequence[str] = (),
                   device: str = "cpu", scaled_loss: bool = False) -> Iterator[ForwardTrace]:
    """Exports ``loss_fn(model, *batch)`` for the target `device` ("cpu" or
    "cuda": which fused kernels stay whole); the joint trace must run inside
    (parameters are identified by the tensors the model holds, under safe
    names). `unit_modules` (FQNs; "" is the model) are where
    `mixed_precision` casts forward inputs and outputs. `scaled_loss`:
    backward starts from a loss scale the step takes after the batch (a
    GradScaler's), not from 1."""
    batch = tuple(batch)
    leaves, structure = batch_leaves(batch)
    step = _TrainingStep(model, loss_fn, device)
    units = {name: model.get_submodule(name) for name in unit_modules}
    _refuse_host_generators(loss_fn, model)
    on_device = False
    while True:
        with contextlib.ExitStack() as stack:
            traced = stack.enter_context(_on_fake_device(model, batch, device)) if on_device else batch
            stack.enter_context(_explaining_outside_tensors(loss_fn, model, device))
            real_fqn = stack.enter_context(_tracing_safe_names(model))
            with capture_modes(model, units, mixed_precision, device) as observed:
                program = _export(step, traced)
                aliases = {identity: [real_fqn.get(n, n) for n in names]
                           for identity, names in _alias_groups(model).items()}
            if not on_device and casts_in(program.graph_module, device):
                # The step's Python reads dtypes that autocast's casts change
                # (`x.to(h.dtype)`, `torch.finfo(scores.dtype).min`): traced
                # again where autocast casts, it reads eager's.
                on_device = True
                continue
            if device == "cuda":
                fuse_written_out_rms_norms(program.graph_module)
            aux = aux_structure(program)
            say_ignored_hooks(observed.ignored_hooks)
            yield ForwardTrace(program, step, tuple(batch_leaves(traced)[0]), aliases, real_fqn, loss_fn,
                               mixed_precision, device, observed.regions.saved, observed.attribute_reads, aux,
                               str(structure), scaled_loss, observed.applied, units)
            return


@contextlib.contextmanager
def _on_fake_device(model: nn.Module, batch: tuple, device: str) -> Iterator[tuple]:
    """The model's parameters and buffers (ties kept) and the batch as fake
    tensors of `device` while capture traces, where autocast casts as it
    does in eager (fsdpc.autocast); yields the batch."""
    mode = FakeTensorMode()
    fakes: dict[int, torch.Tensor] = {}

    def fake(tensor: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(tensor) not in fakes:
            with mode:
                made = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=device)
            fakes[id(tensor)] = nn.Parameter(made, requires_grad=tensor.requires_grad) if parameter else made
        return fakes[id(tensor)]

    faked = [(table, name, fake(tensor, isinstance(tensor, nn.Parameter))) for module in model.modules()
             for table in (module._parameters, module._buffers) for name, tensor in table.items() if tensor is not None]
    leaves, structure = batch_leaves(batch)
    with _holding(faked):
        yield tree_unflatten([fake(leaf, False) for leaf in leaves], structure)


def _joint_step(program, step, batch, aliases, real_fqn, loss_fn, mixed_precision, device,
                saved: set[SavedCall], aux: dict | None, scaled_loss: bool, applied: list,
                units: dict[str, nn.Module]) -> CapturedStep:
    """The joint forward + backward graph of an exported step (`applied`:
    the custom autograd Functions it calls; `units`: the wrap units'
    modules, where the policy casts); with
    `scaled_loss`, its last input is the loss scale backward starts from
    (what `GradScaler.scale(loss).backward()` starts from)."""

    state = {**dict(program.named_parameters()), **dict(program.named_buffers())}
    inputs: list[tuple[str, object]] = []
    params: list[ParamInfo] = []
    buffers: list[BufferInfo] = []
    flat_args: list[torch.Tensor] = []
    # Export lists a tied parameter once per name; the joint graph takes it once,
    # so autograd sums the gradient over all its uses.
    export_to_joint: list[int] = []
    joint_index: dict[int, int] = {}  # the model's parameters and buffers, by identity
    user_index = 0
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.PARAMETER:
            identity = id(getattr_path(step, spec.target))
            if identity in joint_index:
                export_to_joint.append(joint_index[identity])
                continue
            tensor = state[spec.target]
            fqn = real_fqn.get(_strip_model_prefix(spec.target), _strip_model_prefix(spec.target))
            names = aliases.get(identity, [fqn])
            params.append(ParamInfo(fqn, tuple(tensor.shape), tensor.dtype, tensor.requires_grad,
                                    [n for n in names if n != fqn]))
            joint_index[identity] = len(inputs)
            export_to_joint.append(len(inputs))
            inputs.append(("param", fqn))
            flat_args.append(tensor.detach().requires_grad_(tensor.requires_grad))
            continue
        export_to_joint.append(len(inputs))
        if spec.kind == InputKind.BUFFER:
            tensor = state[spec.target]
            fqn = real_fqn.get(_strip_model_prefix(spec.target), _strip_model_prefix(spec.target))
            joint_index[id(getattr_path(step, spec.target))] = len(inputs)
            buffers.append(BufferInfo(fqn, tuple(tensor.shape), tensor.dtype))
            inputs.append(("buffer", fqn))
            flat_args.append(tensor.detach())
        elif spec.kind == InputKind.USER_INPUT:
            inputs.append(("input", user_index))
            flat_args.append(batch[user_index].detach())
            user_index += 1
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
            where = _first_user_location(node) or "the model"
            raise CaptureError(
                f"{where}: the step reads a tensor that is neither the model's parameter or buffer nor a batch item "
                f"('{spec.target}': another model's weights, a teacher's? a plain tensor attribute, or one made from "
                "Python data inside forward); make its module a submodule of the model (frozen with "
                "requires_grad_(False)), register the tensor with register_buffer, or pass it in the batch")
        else:
            raise CaptureError(f"unsupported input of the training step: {spec.kind.name} {spec.target}")

    trainable = [i for i, (kind, _) in enumerate(inputs) if kind == "param" and flat_args[i].requires_grad]
    input_names = [f"batch item {key}" if kind == "input"
                   else f"buffer '{key}'" if kind == "buffer"
                   else f"parameter '{key}'" for kind, key in inputs]
    seed = None
    if scaled_loss:  # an input after the batch's
        seed = len(inputs)
        batch = (*batch, torch.empty((), dtype=torch.float32, device=batch[0].device if batch else "meta"))
        inputs.append(("input", user_index))
        input_names.append("the loss scale")
        flat_args.append(batch[-1])
    returned = 1 + aux_count(aux)
    updatable = {i for i, (kind, _) in enumerate(inputs) if kind == "buffer"}
    on_device = None
    if casts_in(program.graph_module, device):
        # Autocast casts only tensors of its own device type: fake tensors of the target's.
        with FakeTensorMode():
            flat_args = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
                         .requires_grad_(t.requires_grad) for t in flat_args]
        on_device = flat_args[0].device  # with its index, as fake tensors have it
    # A custom Function may read the model's tensors it is not passed
    # (checkpointing Functions run the module they close over, a unit among
    # them): there it reads the joint trace's, cast and hooked as export's.
    model_slots = [(table, name, joint_index[id(tensor)]) for module in step.modules()
                   for table in (module._parameters, module._buffers) for name, tensor in table.items()
                   if tensor is not None and id(tensor) in joint_index] if applied else []
    with recording_regions(device), (_mixed_precision_casts(getattr(step, _MODEL_ATTR), units, mixed_precision,
                                                            everywhere=True)
                                     if applied else contextlib.nullcontext()):
        joint, updated = _trace_joint(program.graph_module, flat_args, input_names, trainable, export_to_joint,
                                      saved, returned, updatable, device, on_device, seed, applied, model_slots)
    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    output = next(n for n in joint.graph.nodes if n.op == "output")
    results = list(output.args[0])
    loss = results[0]
    gradients = {inputs[i][1]: node for i, node in zip(trainable, results[returned:returned + len(trainable)])}
    updates = [(inputs[i][1], node) for i, node in zip(updated, results[returned + len(trainable):])]
    assert len(placeholders) == len(inputs)

    modules, locations = _attribute_nodes(joint.graph, _definition_of(loss_fn))
    reject_mutations(joint.graph, locations)
    reject_mixed_products(joint.graph, locations)
    return CapturedStep(
        graph=joint.graph,
        inputs=inputs,
        params=params,
        buffers=buffers,
        batch=[(tuple(t.shape), t.dtype) for t in batch],
        loss=loss,
        aux=aux,
        aux_nodes=results[1:returned],
        buffer_updates=updates,
        gradients=gradients,
        modules=modules,
        locations=locations,
        regions=regions_of(joint.graph, loss),
        mixed_precision=mixed_precision,
        device=device,
    )


def getattr_path(root: nn.Module, path: str):
    value = root
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _first_user_location(node: fx.Node) -> SourceLocation | None:
    for user in node.users:
        where = _location_from_stack_trace(user.meta.get("stack_trace"))
        if where:
            return where
    return None


class _Composites(fx.Interpreter):
    """Runs a graph, taking PyTorch's Python kernel for a composite operator
    where it has one, as export's decompositions do (dropout becomes
    native_dropout, the kernel eager PyTorch runs on GPUs). The regions
    export makes of `torch.autocast` and `torch.no_grad` blocks run the same
    way, node by node, so that what they trace keeps its modules and lines.
    Run on tensors of `device` (fsdpc.autocast), tensors the graph creates
    on meta, where export ran, are created there instead. An op the
    `target` device's kernels lack for the dtype export traced on meta
    (where code that reads `x.device.type` took another device's branch)
    runs as a call that target has (`_for_target`). `factories`: where the
    custom Functions (`applied`) make tensors without a device
    (`_factory_device`)."""

    def __init__(self, graph_module: fx.GraphModule, target: str, applied: list, device: torch.device | None = None,
                 factories: torch.device | None = None):
        super().__init__(graph_module)
        self.target, self.applied, self.device, self.factories = target, applied, device, factories

    def run_node(self, node: fx.Node):
        """An op that fails here (a check export's kernels skip: a dtype
        mismatch on meta) is named at the user's line export recorded."""
        try:
            return super().run_node(node)
        except CaptureError:
            raise
        except (RuntimeError, TypeError, ValueError) as error:  # torch's checks; fsdpc's own bugs pass as they are
            where = _location_from_stack_trace(node.meta.get("stack_trace"))
            if where is None:
                raise
            text = str(error).strip()
            reason = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
            raise CaptureError(f"{where}: cannot capture `{where.code}`: {reason}") from error

    def call_function(self, target, args, kwargs):
        if self.device is not None:
            if target in _STATIC_ASSERTIONS:  # export's dtypes, which autocast changes (the joint trace drops them)
                return None
            args, kwargs = tree_map_only(torch.device, lambda d: self.device if d.type == "meta" else d,
                                         (args, kwargs))
        if target is functions.OPAQUE:  # a custom autograd.Function: applied, its own backward recorded
            return functions.run_whole(self.applied, lambda: _python_rewrites(self.target, self.factories), *args)
        if target is torch.ops.higher_order.wrap_with_autocast:
            device_type, dtype, enabled, cache_enabled, body, *inputs = args
            with torch.autocast(device_type, dtype, enabled, cache_enabled):
                return _Composites(body, self.target, self.applied, self.device, self.factories).run(*inputs)
        if target is torch.ops.higher_order.wrap_with_set_grad_enabled:
            enabled, body, *inputs = args
            with torch.set_grad_enabled(enabled):
                return _Composites(body, self.target, self.applied, self.device, self.factories).run(*inputs)
        on_target = _for_target(self.target, target, args)
        if on_target is not None:
            return on_target(*args, **kwargs)
        python_kernel = getattr(target, "py_kernels", {}).get(DispatchKey.CompositeImplicitAutograd)
        # Where autocast casts, the composite runs as eager runs it: its C++
        # kernel, whose calls autocast sees (Python's of upsampling would
        # leave a bf16 result autocast makes fp32); dropout is not autocast's.
        autocast_on = self.device is not None and ambient_autocast(self.device.type) is not None
        if python_kernel is not None and (not autocast_on or target is torch.ops.aten.dropout.default):
            return python_kernel(*args, **kwargs)
        if target in _WITHOUT_GRADIENT:
            with torch.no_grad():
                return super().call_function(target, args, kwargs)
        return super().call_function(target, args, kwargs)


def _histc_of_integers_on_cpu(values: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """histc of integers as a CUDA GPU counts them, on a CPU, whose histc
    counts floating-point values only: the same counts (exact in float32
    below 2^24), in the integer dtype."""
    return torch.ops.aten.histc.default(values.float(), *args, **kwargs).to(values.dtype)


def _for_target(target: str, op, args: tuple) -> Callable | None:
    """What runs in place of `op(*args)` on the `target` device, where its
    kernel lacks the dtype export traced (Hugging Face's MoE routing counts
    tokens per expert with `histc` of integers unless the tensor is on a
    CPU, and on meta it is not); None where the op runs as it is."""
    if (target == "cpu" and op is torch.ops.aten.histc.default and isinstance(args[0], torch.Tensor)
            and not args[0].is_floating_point()):
        return _histc_of_integers_on_cpu
    return None


def _trace_joint(forward: fx.GraphModule, flat_args: list[torch.Tensor], input_names: list[str],
                 trainable: list[int], export_to_joint: list[int], saved: set[SavedCall],
                 returned: int, updatable: set[int], target: str, on_device: torch.device | None,
                 seed: int | None, applied: list,
                 model_slots: list[tuple[dict, str, int]]) -> tuple[fx.GraphModule, list[int]]:
    """The joint graph of `forward`, whose first `returned` outputs are the
    loss and what loss_fn returned beside it: its outputs are those, then
    the gradients of the `trainable` inputs, then the new values of the
    inputs among `updatable` (buffers) that the step updated in place, whose
    indices come with it. `on_device`: the device of `flat_args` where it
    is not meta (_Composites). `seed`: the input backward starts from,
    where not 1. `model_slots`: (table, name, input index) of the model's
    tensors that custom Functions (`applied`) may read without being passed
    them; they hold the joint trace's inputs while it runs. With custom
    Functions, backward runs as `loss.backward()` runs in eager, into the
    trainable inputs' `.grad` (checkpointing Functions refuse `.grad()`, and
    back-propagate into the parameters they recompute by themselves)."""
    # AOTAutograd's helper that stamps backward nodes with the sequence number of
    # the forward op they differentiate (the same one torch.compile relies on).
    from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks

    saving = SavingSelectively(saved)
    # The Functions' tensors made without a device go where the trace's are (meta, or the real model's device).
    factories = _factory_device(flat_args[0].device, target) if flat_args else None

    def joint(*args):
        if applied:  # leaves, as the model's parameters are in eager, for backward to accumulate into
            args = [arg.detach().requires_grad_() if i in trainable else arg for i, arg in enumerate(args)]
        with torch.enable_grad(), preserve_node_meta(), \
                _holding([(table, name, args[index]) for table, name, index in model_slots]), \
                functions.backward_in_capture(applied, lambda: _python_rewrites(target, factories)):
            with saving if saved else contextlib.nullcontext():
                loss, *aux = _Composites(forward, target, applied, on_device, factories).run(
                    *(args[i] for i in export_to_joint))
            if loss.dim() != 0 or not loss.is_floating_point():
                raise CaptureError(
                    f"loss_fn must return a scalar floating-point loss, got shape {tuple(loss.shape)} {loss.dtype}")
            wrt = [args[i] for i in trainable]
            if not wrt:
                return (loss, *aux)
            if loss.grad_fn is None:
                raise CaptureError("the loss does not depend on any trainable parameter")
            setup_stacktrace_preservation_hooks([loss.grad_fn])
            try:
                if applied:
                    torch.autograd.backward(loss, None if seed is None else args[seed])
                    grads = [arg.grad for arg in wrt]
                else:
                    grads = torch.autograd.grad(loss, wrt, None if seed is None else args[seed], allow_unused=True)
            except functions.RandomInBackward as error:
                where = user_frame(traceback.extract_tb(error.__traceback__))
                raise CaptureError(f"{where or 'the backward'}: {error}") from None
            except RuntimeError as error:  # a backward of the user's or a library's, run in Python
                if _DATA_DEPENDENT_SIGN not in str(error):
                    raise
                where = user_frame(traceback.extract_tb(error.__traceback__))
                raise CaptureError(f"{where or 'the backward'}: cannot capture the backward"
                                   f"{f' `{where.code}`' if where else ''}: {_DATA_DEPENDENT}") from error
        return (loss, *aux, *grads)

    updated: list[int] = []

    def functional_joint(*args):
        # In-place updates of intermediates become out-of-place ops, as
        # AOTAutograd's functionalization does. A buffer's new values (batch
        # norm's running statistics) are returned, for the caller to store,
        # as AOTAutograd returns mutated inputs; any other update of an
        # input would be lost, so it is refused.
        with FunctionalTensorMode():
            functional_args = [FunctionalTensor.to_functional(arg) for arg in args]
            results = joint(*functional_args)
            updates = []
            for index, (name, arg) in enumerate(zip(input_names, functional_args)):
                torch._sync(arg)
                changed = torch._functionalize_has_data_mutation(arg.elem)
                reshaped = torch._functionalize_has_metadata_mutation(arg.elem)
                if changed and not reshaped and index in updatable:
                    updated.append(index)
                    updates.append(arg)
                elif reshaped:
                    raise CaptureError(f"the training step reshapes {name} in place (an in-place view or "
                                       "resize); the compiled step keeps every input's shape: reshape a copy")
                elif changed:
                    raise CaptureError(f"the training step updates {name} in place; a compiled step changes "
                                       "nothing but gradients and buffers' values: update a copy")
        return tuple(r.from_functional() if isinstance(r, FunctionalTensor) else r for r in (*results, *updates))

    # Backward on this thread, as AOTAutograd traces it: autograd would run a
    # CUDA target's on its device thread, outside this thread's state (the
    # policy's casts for custom Functions' recomputes, the modes).
    with preserve_node_meta(), _quiet_torch_logs(), torch.autograd.set_multithreading_enabled(False):
        traced = make_fx(functional_joint, tracing_mode="fake", decomposition_table=_decompositions())(*flat_args)
    if saving.unfound:
        unfound = ", ".join(f"{name} #{index} in checkpoint region {region}"
                            for region, name, index in sorted(saving.unfound))
        warnings.warn(f"fsdpc: the joint trace does not make calls the model's selective checkpoint policy saves "
                      f"({unfound}); they are recomputed instead; please report this with your torch version "
                      f"({torch.__version__})", stacklevel=user_stacklevel())
    # Export guards `.to()` calls with metadata assertions; capture has already
    # fixed every shape and dtype, so they check nothing the IR does not say.
    for node in list(traced.graph.nodes):
        if node.op == "call_function" and node.target in _STATIC_ASSERTIONS and not node.users:
            traced.graph.erase_node(node)
    traced.graph.eliminate_dead_code()
    first_update = returned + len(trainable)
    _copy_handed_out(traced.graph, [*range(1, returned), *range(first_update, first_update + len(updated))])
    return traced, updated


_STATIC_ASSERTIONS = {torch.ops.aten._assert_tensor_metadata.default}
# Random integers drawn like a tensor: eager's `torch.randint_like` returns
# them without gradient, while the ATen operator's autograd kernel attaches
# a "not implemented" one, which backward would reach.
_WITHOUT_GRADIENT = {getattr(torch.ops.aten.randint_like, overload) for overload in ("default", "low_dtype", "Tensor")}


@contextlib.contextmanager
def _holding(assignments: Sequence[tuple[dict, str, torch.Tensor]]) -> Iterator[None]:
    """Each (table, name, tensor): that slot of a module's parameters or
    buffers holds `tensor` meanwhile."""
    held = [(table, name, table[name]) for table, name, _ in assignments]
    try:
        for table, name, tensor in assignments:
            table[name] = tensor
        yield
    finally:
        for table, name, tensor in held:
            table[name] = tensor


@contextlib.contextmanager
def _python_rewrites(target: str, factories: torch.device | None) -> Iterator[None]:
    """Capture's rewrites of what Python code calls (fused attention and
    RMSNorm for `target`, tensors made from Python data as ops, made
    without a device on `factories` where not None: `_factory_device`):
    forward's, and the code of the custom Functions the joint trace runs."""
    with FusedAttentionFor(target), FusedRmsNormFor(target), _PythonDataAsOps(), \
            (DeviceContext(factories) if factories is not None else contextlib.nullcontext()):
        yield


def _copy_handed_out(graph: fx.Graph, indices: Sequence[int]) -> None:
    """The results at `indices` go to the caller (what loss_fn returns beside
    the loss, buffers' new values): a parameter, a batch item, or a view of
    one would hand out the step's own storage (a gathered parameter the next
    step writes), so each of those becomes a copy, made where it is defined."""
    output = next(n for n in graph.nodes if n.op == "output")
    results = list(output.args[0])
    last_input = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for index in indices:
        node = results[index]
        if node.op != "placeholder" and not getattr(node.target, "is_view", False):
            continue
        with graph.inserting_after(last_input if node.op == "placeholder" else node):
            copy = graph.call_function(torch.ops.aten.clone.default, (node,))
        copy.meta = {key: node.meta[key] for key in ("val", "stack_trace", "nn_module_stack") if key in node.meta}
        results[index] = copy
    output.args = (tuple(results), *output.args[1:])


# Operators kept whole although core ATen decomposes them: their
# decompositions materialize extra full-size temporaries (nll_loss_forward
# becomes a gather whose gradient is zeros + scatter_add of the logits' size)
# and pass over memory several times (gelu_backward becomes eight pointwise
# ops: 7.9 ms against the kernel's 1.2 ms on a 512 x 2048 input), while their
# kernels, the ones eager PyTorch runs, allocate only the result in one pass.
_KEPT_WHOLE = ("nll_loss_forward", "nll_loss_backward", "_log_softmax_backward_data", "_softmax_backward_data",
               "native_layer_norm_backward", "embedding_dense_backward", "gelu_backward", "silu", "silu_backward",
               "sigmoid_backward", "tanh_backward", "threshold_backward")


# Operators kept whole because their decomposition computes something else
# once the joint trace decomposes below autograd: the CPU flash kernel's is
# exact in its first result only (no true logsumexp for the fused backward).
_DECOMPOSITION_INEXACT = ("_scaled_dot_product_flash_attention_for_cpu",)


_DECOMPOSITIONS: dict[int, dict] = {}  # by the count of registered operators: see _decompositions


def _decompositions() -> dict:
    """Core ATen's decompositions less the kernels kept whole, as a plain
    dict: torch's table gathers every namespace's composite kernels each
    time it is read (0.1 s, a tenth of a small model's capture), so it is
    built once per set of registered operators (a custom op registered
    later makes another)."""
    registered = len(torch._C._dispatch_get_all_op_names())
    if registered not in _DECOMPOSITIONS:
        from torch._decomp import core_aten_decompositions
        table = core_aten_decompositions()
        for name in _KEPT_WHOLE + _DECOMPOSITION_INEXACT:
            for overload in getattr(torch.ops.aten, name).overloads():
                table.pop(getattr(getattr(torch.ops.aten, name), overload), None)
        _DECOMPOSITIONS[registered] = {op: table[op] for op in table}
    return _DECOMPOSITIONS[registered]


def _is_mutating(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def reject_mutations(graph: fx.Graph, locations: dict[fx.Node, SourceLocation]) -> None:
    """The joint trace functionalizes and autograd accumulates out of place,
    so the joint graph is functional; if a torch version ever breaks that, say so
    instead of emitting IR the verifier rejects."""
    for node in graph.nodes:
        if _is_mutating(node):
            where = locations.get(node)
            raise CaptureError(f"{where or 'the captured graph'}: in-place operator "
                               f"{node.target._schema.name} survived capture; please report this "
                               f"with your torch version ({torch.__version__})")


# Products (matrix products, convolutions) whose CPU and CUDA kernels take
# operands of one dtype only, and whose meta kernels (capture's) do not check
# it: they would type the result from one operand, and the step would fail at
# its first run.
_PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
             torch.ops.aten.baddbmm.default, torch.ops.aten.mv.default, torch.ops.aten.addmv.default,
             torch.ops.aten.dot.default, torch.ops.aten.addbmm.default, torch.ops.aten.convolution.default}


def reject_mixed_products(graph: fx.Graph, locations: dict[fx.Node, SourceLocation]) -> None:
    """A product of two dtypes, refused at the user's line as eager PyTorch
    refuses it when it runs."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _PRODUCTS:
            continue
        dtypes = [arg.meta["val"].dtype for arg in node.args
                  if isinstance(arg, fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor)]
        if len(set(dtypes)) > 1:
            names = " and ".join(sorted({str(dtype).removeprefix("torch.") for dtype in dtypes}))
            raise CaptureError(f"{locations.get(node) or 'the captured graph'}: {node.target._schema.name} multiplies "
                               f"{names} tensors, which eager PyTorch refuses when it runs: a tensor kept in another "
                               "dtype (a parameter in ignored_params keeps its own under mp_policy, or a cast by "
                               "hand) meets one in the compute dtype; cast one of them")


def _attribute_nodes(graph: fx.Graph, loss_location: SourceLocation | None
                     ) -> tuple[dict[fx.Node, str], dict[fx.Node, SourceLocation]]:
    """Module and source line for every call: forward nodes carry their own,
    backward nodes borrow them from the forward op with their sequence number."""
    by_seq: dict[int, tuple[str | None, SourceLocation | None]] = {}
    modules: dict[fx.Node, str] = {}
    locations: dict[fx.Node, SourceLocation] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        module = _module_of(node.meta)
        where = _location_from_stack_trace(node.meta.get("stack_trace"), loss_location)
        seq = node.meta.get("seq_nr")
        if module is not None:
            if seq is not None:
                by_seq.setdefault(seq, (module, where))
        elif seq is not None and seq in by_seq:
            # A backward node's own stack (where torch records one, as 2.11
            # does) is the loss's line: the forward op's line says more.
            module, borrowed = by_seq[seq]
            where = borrowed or where
        if module is not None:
            modules[node] = module
        if where is not None:
            locations[node] = where
    return modules, locations

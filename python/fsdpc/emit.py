"""Write a captured training step as fsdp-dialect IR text.

Debian's MLIR has no Python bindings, so this is a printer: one line per
parameter, buffer and unit, then the step function with one `fsdp.aten` per
ATen call in graph order, each with its issuing module and source location.
"""

from __future__ import annotations

import math
import operator
from typing import Iterable

import torch
from torch import fx

from fsdpc.attention import draws_random
from fsdpc.batch_norm import DATA_PARALLEL_SUM
from fsdpc.capture import CaptureError, CapturedStep, SourceLocation
from fsdpc.rms_norm import STANDS_FOR
from fsdpc.units import UnitPlan

_ELEMENT_TYPES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint64: "ui64", torch.uint8: "ui8", torch.bool: "i1",
    torch.complex64: "complex<f32>", torch.complex128: "complex<f64>",
    torch.float8_e4m3fn: "f8E4M3FN", torch.float8_e5m2: "f8E5M2",
}
# The element types mixed precision policies and reductions may use.
MIXED_PRECISION_TYPES = ("f32", "bf16", "f16")
DEVICE_LITERAL = "<device>"  # the executing rank's device, whatever capture ran on


def element_type(dtype: torch.dtype, where: str) -> str:
    try:
        return _ELEMENT_TYPES[dtype]
    except KeyError:
        raise CaptureError(f"{where}: dtype {dtype} is not supported by fsdpc") from None


# c10's ScalarType numbers, which schemas give a default dtype as
# (`randint(..., ScalarType? dtype=4)`: int64).
_SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
                 6: torch.float32, 7: torch.float64, 9: torch.complex64, 10: torch.complex128, 11: torch.bool,
                 15: torch.bfloat16}


def scalar_type_dtype(number: int, where: str) -> torch.dtype:
    try:
        return _SCALAR_TYPES[number]
    except KeyError:
        raise CaptureError(f"{where}: a default dtype numbered {number} is not one fsdpc knows") from None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of an element type name (the table's inverse)."""
    for dtype, element in _ELEMENT_TYPES.items():
        if element == name:
            return dtype
    raise ValueError(f"'{name}' is not an element type fsdpc knows")


def tensor_type(shape: Iterable[int], dtype: torch.dtype, where: str) -> str:
    if any(isinstance(d, torch.SymInt) for d in shape):  # export's unbacked size: known only when it runs
        raise CaptureError(f"{where}: the result's shape depends on the data (a boolean mask, nonzero, unique, a "
                           "size read with .item()), and a compiled step has fixed shapes: keep the shape fixed "
                           "(torch.where, or multiply by the mask)")
    dims = [int(d) for d in shape]
    return "tensor<" + "".join(f"{d}x" for d in dims) + element_type(dtype, where) + ">"


def _quoted(text: str) -> str:
    """An MLIR string literal holding exactly `text`'s UTF-8 bytes: printable
    ASCII as is, quotes and backslashes escaped, every other byte (control
    characters, NUL, non-ASCII) as a two-digit hex escape."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:02X}")
    return '"' + "".join(out) + '"'


def symbol(name: str) -> str:
    return "@" + _quoted(name)


def string(text: str) -> str:
    return _quoted(text)


def float_literal(value: float) -> str:
    if math.isfinite(value):
        return f"{value:.17e}"
    bits = {math.inf: "0x7FF0000000000000", -math.inf: "0xFFF0000000000000"}.get(value, "0x7FF8000000000000")
    return f"{bits} : f64"


def location(where: SourceLocation | None) -> str:
    return f" loc({string(where.file)}:{where.line}:1)" if where else ""


def _is_static_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _StepPrinter:
    def __init__(self, step: CapturedStep):
        self.step = step
        self.lines: list[str] = []
        self.names: dict[fx.Node, str] = {}
        # Results that are no tensor: a fused kernel's static sizes (flash
        # attention's max_q) and the outputs it does not compute (None);
        # where they are passed on, they are printed as literals.
        self.literal_results: dict[fx.Node, int | None] = {}
        self.result_counts: dict[fx.Node, int] = {}
        self.placeholder_kind: dict[fx.Node, tuple[str, object]] = {}
        self.counter = 0

    def fresh(self) -> str:
        self.counter += 1
        return f"%v{self.counter}"

    def where(self, node: fx.Node) -> str:
        """`file:line (op)` for error messages."""
        loc = self.step.locations.get(node)
        op = (STANDS_FOR.get(node.target, node.target)._schema.name if isinstance(node.target, torch._ops.OpOverload)
              else str(node.target))
        return f"{loc} ({op})" if loc else f"{op} (graph node '{node.name}')"

    def value(self, node: fx.Node, user: fx.Node) -> str:
        """SSA name of `node`, reading a parameter or buffer at its first use."""
        if node in self.names:
            return self.names[node]
        kind, key = self.placeholder_kind[node]
        val = node.meta["val"]
        type_ = tensor_type(val.shape, val.dtype, self.where(user))
        name = self.fresh()
        op = "fsdp.get_param" if kind == "param" else "fsdp.get_buffer"
        self.lines.append(f"    {name} = {op} {symbol(key)} : {type_}"
                          f"{location(self.step.locations.get(user))}")
        self.names[node] = name
        return name

    def type_of(self, node: fx.Node) -> str:
        val = node.meta["val"]
        return tensor_type(val.shape, val.dtype, self.where(node))

    def encode(self, value, node: fx.Node, operands: list[str], operand_types: list[str]) -> str:
        if isinstance(value, fx.Node) and value in self.literal_results:
            return self.encode(self.literal_results[value], node, operands, operand_types)
        if isinstance(value, fx.Node):
            operands.append(self.value(value, node))
            operand_types.append(self.type_of(value))
            return f"{len(operands) - 1} : index"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(self.encode(v, node, operands, operand_types) for v in value) + "]"
        if value is None:
            return "unit"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            return float_literal(value)
        if isinstance(value, torch.dtype):
            return element_type(value, self.where(node))
        if isinstance(value, torch.device):
            return string(DEVICE_LITERAL)
        if isinstance(value, (torch.layout, torch.memory_format)):
            return string(str(value).replace("torch.", ""))
        if isinstance(value, str):
            return string(value)
        raise CaptureError(f"{self.where(node)}: argument {value!r} of {node.target} has "
                           f"unsupported type {type(value).__name__}")

    def dtype_cast(self, node: fx.Node) -> bool:
        """`_to_copy` that only changes the dtype prints as fsdp.cast, the op
        the sharding passes fuse into collectives."""
        if node.target is not torch.ops.aten._to_copy.default or len(node.args) != 1:
            return False
        if set(node.kwargs) - {"dtype", "layout", "device", "non_blocking", "memory_format"}:
            return False
        if node.kwargs.get("non_blocking") or node.kwargs.get("layout") not in (None, torch.strided):
            return False
        if node.kwargs.get("memory_format") not in (None, torch.preserve_format):
            return False
        source, val = node.args[0], node.meta["val"]
        if not isinstance(source, fx.Node) or tuple(source.meta["val"].shape) != tuple(val.shape):
            return False
        self.single(node, f"fsdp.cast {self.value(source, node)} : {self.type_of(source)} to {self.type_of(node)}")
        return True

    def data_parallel_sum(self, node: fx.Node) -> bool:
        """A sum over ranks the model makes (fsdpc.batch_norm): `fsdp.data_parallel_sum`."""
        if node.target is not DATA_PARALLEL_SUM:
            return False
        self.single(node, f"fsdp.data_parallel_sum {self.value(node.args[0], node)} : {self.type_of(node)}")
        return True

    def single(self, node: fx.Node, op: str) -> None:
        """`node` as one op of one result, written out as `op`."""
        name = self.fresh()
        self.lines.append(f"    {name} = {op}{location(self.step.locations.get(node))}")
        self.names[node] = name

    def call(self, node: fx.Node) -> None:
        target = node.target
        if self.dtype_cast(node) or self.data_parallel_sum(node):
            return
        if target is operator.getitem:
            source, index = node.args
            result = node.meta.get("val")
            if result is None or _is_static_int(result):
                self.literal_results[node] = None if result is None else int(result)
            else:
                self.names[node] = f"{self.names[source]}#{index}"
            return
        if not isinstance(target, torch._ops.OpOverload):
            raise CaptureError(f"{self.where(node)}: cannot capture call to {target}; "
                               "fsdpc compiles ATen operators only")
        schema = STANDS_FOR.get(target, target)._schema
        callee = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        operands: list[str] = []
        operand_types: list[str] = []
        args = []
        for index, argument in enumerate(schema.arguments):
            if index < len(node.args):
                value = node.args[index]
            elif argument.name in node.kwargs:
                value = node.kwargs[argument.name]
            elif argument.has_default_value():
                value = argument.default_value
                if isinstance(value, int) and "ScalarType" in str(argument.real_type):  # randint's dtype=4
                    value = scalar_type_dtype(value, self.where(node))
            else:
                value = None
            args.append(self.encode(value, node, operands, operand_types))
        plain = all(a == f"{i} : index" for i, a in enumerate(args))
        results = self.result_types(node)
        name = self.fresh()
        lhs = "" if not results else (f"{name} = " if len(results) == 1 else f"{name}:{len(results)} = ")
        attrs = "" if plain else " args [" + ", ".join(args) + "]"
        if draws_random(target, node.args, node.kwargs):
            attrs += " random"
        module = self.step.modules.get(node)
        if module is not None:
            attrs += f" module {string(module)}"
        region = self.step.regions.get(node)
        if region is not None:
            attrs += f" checkpoint {region}"
        self.lines.append(
            f"    {lhs}fsdp.aten {string(callee)} ({', '.join(operands)}){attrs} : "
            f"({', '.join(operand_types)}) -> ({', '.join(results)})"
            f"{location(self.step.locations.get(node))}")
        self.names[node] = name

    def result_types(self, node: fx.Node) -> list[str]:
        val = node.meta.get("val")
        values = val if isinstance(val, (list, tuple)) else [val]
        types = []
        for v in values:
            if v is None or _is_static_int(v):
                types.append("none")
            elif isinstance(v, torch.Tensor):
                types.append(tensor_type(v.shape, v.dtype, self.where(node)))
            else:
                raise CaptureError(f"{self.where(node)}: {node.target} returns a {type(v).__name__}; "
                                   "fsdpc needs tensor results (static shapes)")
        return types

    def body(self) -> tuple[list[str], list[str]]:
        """The function's lines and its argument types."""
        arg_types = []
        placeholders = [n for n in self.step.graph.nodes if n.op == "placeholder"]
        for node, (kind, key) in zip(placeholders, self.step.inputs):
            self.placeholder_kind[node] = (kind, key)
            if kind == "input":
                shape, dtype = self.step.batch[key]
                self.names[node] = f"%batch{key}"
                arg_types.append(tensor_type(shape, dtype, f"batch item {key}"))
        for node in self.step.graph.nodes:
            if node.op == "call_function":
                self.call(node)
                if node is self.step.loss:
                    self.lines.append(f"    fsdp.loss {self.names[node]} : {self.type_of(node)}")
        grads = [(fqn, g) for fqn, g in self.step.gradients.items() if g is not None]
        if grads:
            names = ", ".join(symbol(fqn) for fqn, _ in grads)
            values = ", ".join(self.value(g, g) if g.op == "placeholder" else self.names[g] for _, g in grads)
            types = ", ".join(self.type_of(g) for _, g in grads)
            self.lines.append(f"    fsdp.gradients [{names}] {values}\n        : {types}")
        returned = self.returned()
        if self.step.buffer_updates:
            self.lines.append(f"    // returned after the loss{' and aux' if self.step.aux_nodes else ''}: the new values "
                              f"of {', '.join(name for name, _ in self.step.buffer_updates)}")
        self.lines.append(f"    return {', '.join(self.names[node] for node in returned)} : "
                          f"{', '.join(self.type_of(node) for node in returned)}")
        return self.lines, arg_types

    def returned(self) -> list[fx.Node]:
        """What the step function returns: the loss, what loss_fn returned
        beside it, then the new values of the buffers the step updated."""
        return [self.step.loss, *self.step.aux_nodes, *(node for _, node in self.step.buffer_updates)]

    def function_results(self) -> str:
        """The step function's result types (see `returned`)."""
        types = [self.type_of(node) for node in self.returned()]
        return types[0] if len(types) == 1 else f"({', '.join(types)})"


def emit_mlir(step: CapturedStep, plan: UnitPlan, *, function: str = "train_step",
              header: str = "") -> str:
    out = []
    if header:
        out += [f"// {line}" for line in header.splitlines()]
    attributes = [f"fsdp.device = {string(step.device)}"]
    policy = step.mixed_precision
    if policy is not None and policy.param_dtype is not None:
        fields = [f"param_dtype = {element_type(policy.param_dtype, 'param_dtype')}"]
        if policy.reduce_dtype is not None:
            fields.append(f"reduce_dtype = {element_type(policy.reduce_dtype, 'reduce_dtype')}")
        if policy.output_dtype is not None:
            fields.append(f"output_dtype = {element_type(policy.output_dtype, 'output_dtype')}")
        fields.append(f"cast_forward_inputs = {'true' if policy.cast_forward_inputs else 'false'}")
        attributes.append(f"fsdp.mixed_precision = {{{', '.join(fields)}}}")
    out.append(f"module attributes {{{', '.join(attributes)}}} {{")
    for unit in plan.units:
        root = " root" if unit.is_root else ""
        out.append(f"  fsdp.unit {symbol(unit.name)}{root} class {string(unit.module_class)}")
    for param in step.params:
        where = f"parameter '{param.fqn}'"
        line = (f"  fsdp.param {symbol(param.fqn)} : {tensor_type(param.shape, param.dtype, where)} "
                f"unit {symbol(plan.owner([param.fqn, *param.aliases]))}")
        if not param.trainable:
            line += " frozen"
        if param.aliases:
            line += " tied [" + ", ".join(string(a) for a in param.aliases) + "]"
        out.append(line)
    for buffer in step.buffers:
        where = f"buffer '{buffer.fqn}'"
        out.append(f"  fsdp.buffer {symbol(buffer.fqn)} : {tensor_type(buffer.shape, buffer.dtype, where)}")
    lines, arg_types = _StepPrinter(step).body()
    args = ", ".join(f"%batch{i}: {t}" for i, t in enumerate(arg_types))
    out.append(f"  func.func @{function}({args}) -> {_StepPrinter(step).function_results()} {{")
    out += lines
    out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"

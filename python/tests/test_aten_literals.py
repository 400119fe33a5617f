"""Every literal kind of the ATen schemas runs: a table of operator calls,
each traced to an ATen graph, printed as fsdp IR by the capture's own
printer, lowered by fsdp-translate and run by the prebuilt runtime, must
equal the same call in eager PyTorch. The rows cover bool, int, float and
optional lists, scalar types, layouts, memory formats, devices, strings,
None, non-finite floats, wrapped numbers, tensor lists with holes, and
operators that return tensor lists."""

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fsdpc.capture import CapturedStep
from fsdpc.compiler import run_fsdp_opt
from fsdpc.emit import _StepPrinter
from fsdpc.program import translate

aten = torch.ops.aten
cpu = torch.device("cpu")


def randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


ROWS = {
    "bool[3] output mask, int lists, optional int list": (
        lambda g, x, w: aten.convolution_backward.default(
            g, x, w, [3], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, False, True]),
        (randn(2, 3, 4, 4), randn(2, 4, 8, 8), randn(3, 4, 3, 3))),
    "depthwise groups, bias-less output mask": (
        lambda g, x, w: aten.convolution_backward.default(
            g, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 4, [True, True, False]),
        (randn(2, 4, 5, 5), randn(2, 4, 5, 5), randn(4, 1, 3, 3))),
    "float list, optional int list None": (
        lambda x: aten.upsample_bilinear2d.vec(x, None, False, [2.0, 1.5]),
        (randn(1, 2, 4, 4),)),
    "dtype, layout, device, pin_memory, float scalar": (
        lambda: aten.full.default([2, 3], 1.5, dtype=torch.float16, layout=torch.strided, device=cpu,
                                  pin_memory=False),
        ()),
    "int start/end/step, int64 dtype": (
        lambda: aten.arange.start_step(2, 11, 3, dtype=torch.int64, layout=torch.strided, device=cpu),
        ()),
    "dtype conversion": (lambda x: aten._to_copy.default(x, dtype=torch.float64), (randn(3, 2),)),
    "memory format": (lambda x: aten.clone.default(x, memory_format=torch.channels_last),
                      (randn(2, 3, 4, 5),)),
    "string": (lambda x: aten.gelu.default(x, approximate="tanh"), (randn(4, 3),)),
    "optional string": (lambda x, y: aten.div.Tensor_mode(x, y, rounding_mode="floor"),
                        (randn(5), randn(5) + 3)),
    "Tensor?[] with a None hole": (
        lambda x, i: aten.index.Tensor(x, [None, i]), (randn(3, 5), torch.tensor([4, 0, 2]))),
    "Tensor[]": (lambda x, y: aten.cat.default([x, y], 1), (randn(2, 3), randn(2, 2))),
    "int list with -1, bool keepdim": (
        lambda x: (aten.view.default(x, [-1, 2]), aten.sum.dim_IntList(x, [0], True)), (randn(4, 3),)),
    "optional Scalar None and float": (lambda x: aten.clamp.default(x, None, 0.5), (randn(6),)),
    "non-finite floats": (
        lambda x: aten.nan_to_num.default(x, 0.0, math.inf, -math.inf),
        (torch.tensor([math.nan, math.inf, -math.inf, 1.0]),)),
    "int Scalar alpha": (lambda x, y: aten.add.Tensor(x, y, alpha=2), (randn(3), randn(3))),
    "bool Scalar": (lambda x: aten.fill.Scalar(x, True), (randn(3),)),
    "number where a Tensor is expected (wrapped, no promotion)": (
        lambda x: aten.mul.Tensor(x, 2.5), (randn(3).to(torch.bfloat16),)),
    "Tensor[] result": (lambda x: aten.split_with_sizes.default(x, [1, 3]), (randn(4, 2),)),
    "pooling int lists, bool ceil_mode": (
        lambda x: aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2], [0, 0], [1, 1], False),
        (randn(1, 2, 4, 4),)),
    "optional int divisor None": (
        lambda x: aten.avg_pool2d.default(x, [2, 2], [2, 2], [0, 0], False, True, None),
        (randn(1, 2, 4, 4),)),
    "optional tensors None": (
        lambda x: aten.native_layer_norm.default(x, [3], None, None, 1e-5), (randn(2, 3),)),
    "optional bool, negative dim": (
        lambda x: aten.sort.stable(x, stable=True, dim=-1, descending=True), (randn(2, 5),)),
    "optional Scalar correction, int list": (
        lambda x: aten.std.correction(x, [1], correction=0, keepdim=False), (randn(3, 4),)),
    "scalar_tensor": (lambda: aten.scalar_tensor.default(-3.25, dtype=torch.float32), ()),
    "bool tensor, int8": (lambda x: aten.ne.Scalar(x.to(torch.int8), 0), (randn(5),)),
}


def emit_function(graph, inputs) -> str:
    """The graph as one fsdp IR function of its placeholders returning its
    outputs, printed by the capture's printer."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    step = CapturedStep(graph=graph, inputs=[("input", i) for i in range(len(placeholders))], params=[],
                        buffers=[], batch=[(tuple(t.shape), t.dtype) for t in inputs], loss=None,
                        gradients={}, modules={}, locations={})
    printer = _StepPrinter(step)
    for index, node in enumerate(placeholders):
        printer.names[node] = f"%batch{index}"
    for node in graph.nodes:
        if node.op == "call_function":
            printer.call(node)
    (output,) = [n for n in graph.nodes if n.op == "output"]
    results = [r for r in torch.utils._pytree.tree_leaves(output.args[0]) if r is not None]
    types = [printer.type_of(r) for r in results]
    args = ", ".join(f"%batch{i}: {printer.type_of(p)}" for i, p in enumerate(placeholders))
    return "\n".join([f"func.func @check({args}) -> ({', '.join(types)}) {{", *printer.lines,
                      f"  return {', '.join(printer.names[r] for r in results)} : {', '.join(types)}",
                      "}"]) + "\n"


@pytest.mark.parametrize("row", ROWS, ids=list(ROWS))
def test_literal_kind_runs_like_eager(row):
    fn, inputs = ROWS[row]
    graph = make_fx(fn)(*inputs).graph
    ir = emit_function(graph, inputs)
    program = translate(run_fsdp_opt(ir, ["--fsdp-plan-lifetimes"]))
    out = program.load("cpu").run("check", {}, {}, {}, list(inputs), {}, 60.0)
    expected = [t for t in torch.utils._pytree.tree_leaves(fn(*inputs)) if t is not None]
    assert len(out["returned"]) == len(expected)
    for got, want in zip(out["returned"], expected):
        assert got.dtype == want.dtype and got.shape == want.shape, ir
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{row}: {m}\n{ir}")


def test_a_literal_that_does_not_fit_the_schema_names_the_argument():
    ir = ('func.func @check(%x: tensor<3xf32>) -> tensor<3xf32> {\n'
          '  %y = fsdp.aten "aten::gelu" (%x) args [0 : index, 7] : (tensor<3xf32>) -> tensor<3xf32> '
          'loc("model.py":12:1)\n  return %y : tensor<3xf32>\n}\n')
    sharded = run_fsdp_opt(ir, ["--mlir-print-debuginfo"])
    with pytest.raises(RuntimeError, match=r"aten::gelu \(model.py:12\).*argument 'approximate'"):
        translate(sharded)

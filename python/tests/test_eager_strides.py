"""The layout analysis fsdp-fuse-pointwise relies on, held against ATen.

A fused kernel's result gets the strides TensorIterator gives it from the
kernel's inputs; a later `view` of it is valid only if those are the
strides eager's calls would have given it. `fsdp-test-eager-strides` writes
what the compiler believes eager gives every value. Random chains of views
(permute, slice, select, transpose, unsqueeze, squeeze, expand, view,
reshape, alias) and calls (elementwise with broadcasting, comparisons,
concatenation, clones, dtype casts, sums) run in torch and go
through that pass, and every stride the pass states must be torch's. Where
the pass states none it must be a case it does not model: a view torch
refuses (it would need a copy), a `preserve_format` copy of a tensor that
is not dense, or a sum over a tensor that is not row-major.
"""

import random
import re

import pytest
import torch

from fsdpc.compiler import run_fsdp_opt

CASES = 400
STRIDES = re.compile(r"test\.eager_strides = \[(.*?)\]\}")


def mlir_type(shape, dtype: str = "f32") -> str:
    return "tensor<" + "".join(f"{size}x" for size in shape) + dtype + ">"


def ints(values) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def same_layout(shape, a, b) -> bool:
    return all(size == 1 or x == y for size, x, y in zip(shape, a, b))


def is_dense(tensor: torch.Tensor) -> bool:
    order = sorted((d for d in range(tensor.dim()) if tensor.size(d) > 1), key=tensor.stride)
    expected = 1
    for d in order:
        if tensor.stride(d) != expected:
            return False
        expected *= tensor.size(d)
    return True


class Chain:
    """One function: values made by random ops, in torch and as IR lines."""

    def __init__(self, rng: random.Random, name: str):
        self.rng, self.name = rng, name
        self.args: list[tuple[int, ...]] = []
        self.lines: list[str] = []
        self.values: list[torch.Tensor] = []  # torch's value of each IR value
        # Per IR op in order: (result, whether a missing stride is allowed).
        self.expected: list[tuple[torch.Tensor, bool]] = []

    def op(self, text: str, inputs: list[int], result: torch.Tensor, unknown_allowed: bool = False,
           dtype: str = "f32") -> int:
        index = len(self.values)
        # What is made from a value with no stated strides may have none either.
        unknown_allowed = unknown_allowed or any(self.expected[i][1] for i in inputs)
        operands = ", ".join(f"%v{i}" for i in inputs)
        names = {torch.bool: "i1", torch.float16: "f16", torch.float32: "f32"}
        types = ", ".join(mlir_type(self.values[i].shape, names[self.values[i].dtype]) for i in inputs)
        callee, _, args = text.partition(" args ")
        args = f" args {args}" if args else ""
        self.lines.append(f'  %v{index} = fsdp.aten "{callee}"({operands}){args} : ({types}) -> '
                          f"{mlir_type(result.shape, dtype)}")
        self.values.append(result)
        self.expected.append((result, unknown_allowed))
        return index

    def fresh(self) -> int:
        """A row-major tensor: a contiguous clone of a new argument."""
        rank = self.rng.randint(1, 4)
        shape = tuple(self.rng.choice([1, 2, 3, 4, 6]) for _ in range(rank))
        arg = len(self.args)
        self.args.append(shape)
        index = len(self.values)
        tensor = torch.randn(shape)
        self.lines.append(f'  %v{index} = fsdp.aten "aten::clone"(%a{arg}) args [0 : index, "contiguous_format"] : '
                          f"({mlir_type(shape)}) -> {mlir_type(shape)}")
        self.values.append(tensor)
        self.expected.append((tensor, False))
        return index

    def step(self, pool: list[int]) -> None:
        rng = self.rng
        i = rng.choice(pool)
        x = self.values[i]
        kind = rng.choice(["permute", "slice", "transpose", "unsqueeze", "squeeze", "expand", "view",
                           "reshape", "select", "alias", "unary", "compare", "binary", "binary", "cat", "clone",
                           "cast", "sum"])
        rank = x.dim()
        if kind == "permute" and rank >= 2:
            perm = list(range(rank))
            rng.shuffle(perm)
            pool.append(self.op(f"aten::permute args [0 : index, {ints(perm)}]", [i], x.permute(perm)))
        elif kind == "slice" and rank >= 1:
            dim = rng.randrange(rank)
            size = x.size(dim)
            start = rng.randrange(size)
            end = rng.randint(start + 1, size)
            step = rng.choice([1, 1, 2])
            result = x[(slice(None),) * dim + (slice(start, end, step),)]
            pool.append(self.op(f"aten::slice.Tensor args [0 : index, {dim}, {start}, {end}, {step}]", [i], result))
        elif kind == "transpose" and rank >= 2:
            a, b = rng.sample(range(rank), 2)
            pool.append(self.op(f"aten::transpose.int args [0 : index, {a}, {b}]", [i], x.transpose(a, b)))
        elif kind == "unsqueeze" and rank < 5:
            dim = rng.randint(0, rank)
            pool.append(self.op(f"aten::unsqueeze args [0 : index, {dim}]", [i], x.unsqueeze(dim)))
        elif kind == "squeeze" and 1 in x.shape:
            dims = [d for d in range(rank) if x.size(d) == 1]
            pool.append(self.op(f"aten::squeeze.dims args [0 : index, {ints(dims)}]", [i], x.squeeze(dims)))
        elif kind == "expand" and 1 in x.shape:
            sizes = [rng.choice([2, 3]) if s == 1 else s for s in x.shape]
            if rng.random() < 0.3 and rank < 4:
                sizes = [2] + sizes
            self.op(f"aten::expand args [0 : index, {ints(sizes)}, false]", [i], x.expand(sizes))
            # A broadcast is read, not kept: further views of it are not ATen's business here.
        elif kind == "view" and rank >= 1:
            shape = list(x.shape)
            if rng.random() < 0.5 and rank >= 2:
                d = rng.randrange(rank - 1)
                new = shape[:d] + [shape[d] * shape[d + 1]] + shape[d + 2:]
            else:
                d = rng.randrange(rank)
                factors = [f for f in (2, 3) if shape[d] % f == 0 and shape[d] > f]
                if not factors:
                    return
                f = rng.choice(factors)
                new = shape[:d] + [f, shape[d] // f] + shape[d + 1:]
            try:
                result = x.view(new)
            except RuntimeError:  # torch would copy: the analysis must not claim a view
                self.op(f"aten::view args [0 : index, {ints(new)}]", [i], torch.empty(new), unknown_allowed=True)
                self.expected[-1] = (None, True)
                return
            pool.append(self.op(f"aten::view args [0 : index, {ints(new)}]", [i], result))
        elif kind == "reshape" and rank >= 2:
            new = [x.numel()] if rng.random() < 0.5 else [x.size(0), -1]
            result = x.reshape(new)
            shape = list(result.shape)
            pool.append(self.op(f"aten::reshape args [0 : index, {ints(shape)}]", [i], result))
        elif kind == "select" and rank >= 2:
            dim = rng.randrange(rank)
            at = rng.randrange(x.size(dim))
            pool.append(self.op(f"aten::select.int args [0 : index, {dim}, {at}]", [i], x.select(dim, at)))
        elif kind == "alias":
            pool.append(self.op("aten::alias", [i], torch.ops.aten.alias(x)))
        elif kind == "cast":  # a dtype copy that keeps the layout where the tensor is dense
            self.op("aten::_to_copy args [0 : index, f16]", [i], x.to(torch.float16), dtype="f16",
                    unknown_allowed=not is_dense(x))
        elif kind == "sum" and rank >= 2:  # row-major from row-major input only: other layouts not stated
            dim = rng.randrange(rank)
            result = x.sum(dim, keepdim=True)
            pool.append(self.op(f"aten::sum.dim_IntList args [0 : index, [{dim}], true, unit]", [i], result,
                                unknown_allowed=not x.is_contiguous()))
        elif kind == "unary":
            pool.append(self.op("aten::neg", [i], torch.neg(x)))
        elif kind == "compare":  # bool results: read by nothing here, their strides still stated
            flags = self.op("aten::gt.Scalar args [0 : index, 0]", [i], torch.gt(x, 0), dtype="i1")
            self.op("aten::bitwise_not", [flags], torch.bitwise_not(self.values[flags]), dtype="i1")
        elif kind == "binary":
            j = rng.choice(pool)
            y = self.values[j]
            try:
                torch.broadcast_shapes(x.shape, y.shape)
            except RuntimeError:
                return
            if rng.random() < 0.5:
                pool.append(self.op("aten::mul.Tensor", [i, j], x * y))
            else:
                pool.append(self.op("aten::add.Tensor args [0 : index, 1 : index, 1]", [i, j], x + y))
        elif kind == "cat" and rank >= 1:
            j = rng.choice(pool)
            y = self.values[j]
            if y.shape != x.shape:
                return
            dim = rng.randrange(rank)
            pool.append(self.op(f"aten::cat args [[0 : index, 1 : index], {dim}]", [i, j], torch.cat([x, y], dim)))
        elif kind == "clone":
            if rng.random() < 0.5:
                pool.append(self.op('aten::clone args [0 : index, "contiguous_format"]', [i],
                                    x.clone(memory_format=torch.contiguous_format)))
            else:
                pool.append(self.op("aten::clone", [i], x.clone(), unknown_allowed=not is_dense(x)))

    def text(self) -> str:
        params = ", ".join(f"%a{k}: {mlir_type(shape)}" for k, shape in enumerate(self.args))
        return f"func.func @{self.name}({params}) {{\n" + "\n".join(self.lines) + "\n  return\n}\n"


def build_chains(seed: int) -> list[Chain]:
    rng = random.Random(seed)
    chains = []
    for case in range(CASES):
        chain = Chain(rng, f"case{case}")
        pool = [chain.fresh() for _ in range(rng.randint(1, 3))]
        for _ in range(rng.randint(2, 10)):
            chain.step(pool)
        chains.append(chain)
    return chains


def parse_strides(entry: str):
    entry = entry.strip()
    if entry == "unit":
        return None
    match = re.fullmatch(r"array<i64(?::\s*(.*))?>", entry)
    assert match, entry
    return [int(v) for v in match.group(1).split(",")] if match.group(1) else []


@pytest.mark.parametrize("seed", [0, 1])
def test_stated_strides_are_atens(seed):
    chains = build_chains(seed)
    module = "module {\n" + "".join(chain.text() for chain in chains) + "}\n"
    annotated = run_fsdp_opt(module, ["--fsdp-test-eager-strides"])
    bodies = re.split(r"func\.func @case\d+", annotated)[1:]
    assert len(bodies) == len(chains)
    checked = unknown = 0
    for chain, body in zip(chains, bodies):
        stated = [parse_strides(m.group(1)) for m in STRIDES.finditer(body)]
        assert len(stated) == len(chain.expected), chain.text()
        for number, ((tensor, unknown_allowed), strides) in enumerate(zip(chain.expected, stated)):
            where = f"{chain.name}, %v{number}:\n{chain.text()}"
            if strides is None:
                assert unknown_allowed, f"no strides stated where ATen's rules say them: {where}"
                unknown += 1
                continue
            assert tensor is not None, f"strides stated for a view torch refuses: {where}"
            assert same_layout(tensor.shape, strides, tensor.stride()), (
                f"stated {strides}, torch {tensor.stride()} for shape {list(tensor.shape)}: {where}")
            checked += 1
    assert checked > 5 * CASES and unknown > 0

"""Evaluates an fsdp function of ATen calls and fsdp.pointwise kernels with
torch on the CPU: the reference that tests hold the fusion pass's
rewrites against. Each fsdp.aten call runs as the ATen operator it names;
a kernel's body runs call by call in the kernel's dtype, and its results
take the strides TensorIterator gives a kernel over its inputs (torch's
own Python statement of that rule), so that a `view` of a result the
kernel lays out unlike eager fails here as it would on the GPU.

Handles the textual IR fsdp-opt prints for the calls, literals and types
the tests use; anything else raises.
"""

import re

import torch
from torch._prims_common import compute_elementwise_output_strides

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i1": torch.bool,
          "i64": torch.int64}
TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")
CALL = re.compile(r'^(%[\w#:]+) = fsdp\.aten "([\w:.]+)"\((.*?)\)(?: args (\[.*\]))?(?: module "[^"]*")?'
                  r'(?: \{[^}]*\})? : \(.*\) -> (.*)$')
KERNEL = re.compile(r"^(%[\w:]+) = fsdp\.pointwise\((.*?)\)(?: module \"[^\"]*\")? : \(.*\) -> (.*) \{$")


def tensor_type(text: str) -> tuple[list[int], torch.dtype]:
    match = TENSOR.fullmatch(text.strip())
    if not match:
        raise ValueError(f"not a tensor type: {text}")
    dims = [int(d) for d in match.group(1).split("x") if d]
    return dims, DTYPES[match.group(2)]


class Literal:
    """Parses one `args [...]` list."""

    def __init__(self, text: str):
        self.text, self.at = text, 0

    def parse(self):
        value = self.value()
        if self.at != len(self.text):
            raise ValueError(f"trailing text in {self.text!r}")
        return value

    def skip(self):
        while self.at < len(self.text) and self.text[self.at] == " ":
            self.at += 1

    def value(self):
        self.skip()
        char = self.text[self.at]
        if char == "[":
            self.at += 1
            items = []
            self.skip()
            if self.text[self.at] == "]":
                self.at += 1
                return items
            while True:
                items.append(self.value())
                self.skip()
                if self.text[self.at] == ",":
                    self.at += 1
                    continue
                if self.text[self.at] == "]":
                    self.at += 1
                    return items
                raise ValueError(f"bad list in {self.text!r}")
        if char == '"':
            end = self.text.index('"', self.at + 1)
            word = self.text[self.at + 1:end]
            self.at = end + 1
            return ("string", word)
        match = re.compile(r"-?[\d.e+-]+(?: : index)?|true|false|unit|\w+").match(self.text, self.at)
        token = match.group(0)
        self.at = match.end()
        if token.endswith(" : index"):
            return ("operand", int(token.split()[0]))
        if token in ("true", "false"):
            return token == "true"
        if token == "unit":
            return None
        if token in DTYPES:
            return DTYPES[token]
        return float(token) if any(c in token for c in ".e") else int(token)


def call_aten(callee: str, inputs: list[torch.Tensor], args) -> torch.Tensor:
    name, _, overload = callee.removeprefix("aten::").partition(".")
    op = getattr(getattr(torch.ops.aten, name), overload or "default")
    schema = op._schema.arguments
    if args is None:
        args = [("operand", i) for i in range(len(inputs))]
    positional, keywords = [], {}
    for argument, literal in zip(schema, args):
        if isinstance(literal, tuple) and literal[0] == "operand":
            value = inputs[literal[1]]
        elif isinstance(literal, list):
            value = [inputs[item[1]] if isinstance(item, tuple) and item[0] == "operand" else item
                     for item in literal]
        elif isinstance(literal, tuple) and literal[0] == "string":
            word = literal[1]
            value = {"<device>": torch.device("cpu"), "strided": torch.strided,
                     "contiguous_format": torch.contiguous_format,
                     "preserve_format": torch.preserve_format}.get(word, word)
        else:
            value = literal
        if argument.kwarg_only:
            keywords[argument.name] = value
        else:
            positional.append(value)
    return op(*positional, **keywords)


def run_function(text: str, name: str, arguments: list[torch.Tensor]) -> list[torch.Tensor]:
    """Runs function `name` of the IR `text` on `arguments`; its results."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(f"func.func @{name}("))
    header = lines[start]
    params = re.findall(r"(%\w+): tensor<", header[:header.index(")")])
    values = dict(zip(params, arguments))

    def run_block(body: list[str], values: dict) -> list[torch.Tensor]:
        i = 0
        while i < len(body):
            line = body[i]
            i += 1
            if not line or line.startswith("//"):
                continue
            if line.startswith("return") or line.startswith("fsdp.yield"):
                names = line.split(None, 1)[1].split(" : ")[0].split(", ") if " : " in line else []
                return [values[n.strip()] for n in names]
            if line.startswith("fsdp.release") or line.startswith("fsdp.reshard"):
                continue
            kernel = KERNEL.match(line)
            if kernel:
                depth, inner = 1, []
                while depth:
                    inner_line = body[i]
                    i += 1
                    depth += inner_line.endswith("{") - (inner_line == "}")
                    if depth:
                        inner.append(inner_line)
                block_args = re.findall(r"(%\w+):", inner[0])
                operands = [values[n.strip()] for n in kernel.group(2).split(",")]
                result_types = [tensor_type(t) for t in re.findall(r"tensor<[^>]*>", kernel.group(3))]
                shape = result_types[0][0]
                results = run_block(inner[1:], dict(zip(block_args, operands)))
                layout = compute_elementwise_output_strides(*[t.expand(shape) for t in operands])
                outs = [torch.empty_strided(shape, layout, dtype=dtype).copy_(result)
                        for (_, dtype), result in zip(result_types, results)]
                names = kernel.group(1).split(":")
                if len(outs) == 1:
                    values[names[0]] = outs[0]
                else:
                    for k, out in enumerate(outs):
                        values[f"{names[0]}#{k}"] = out
                continue
            match = CALL.match(line)
            if not match:
                raise ValueError(f"cannot evaluate: {line}")
            result_name, callee, operand_text, args_text, result_type = match.groups()
            inputs = [values[n.strip()] for n in operand_text.split(",") if n.strip()]
            args = Literal(args_text).parse() if args_text else None
            result = call_aten(callee, inputs, args)
            shape, dtype = tensor_type(result_type)
            if list(result.shape) != shape or result.dtype != dtype:
                raise ValueError(f"{line}: torch gives {list(result.shape)} {result.dtype}")
            values[result_name] = result
        raise ValueError("no return")

    end = start + 1
    depth = 1
    while depth:
        depth += lines[end].endswith("{") - (lines[end] == "}")
        end += 1
    return run_block(lines[start + 1:end - 1], values)

"""Mutated and truncated IR never crashes or hangs fsdp-opt.

Every mutant must end in a clean diagnostic (exit 1) or a successful run
(exit 0): never a signal, a stack dump, an LLVM fatal error or a time-out.
Mutants are built deterministically from the examples and the lit tests and
run in batches through -split-input-file; a crashing batch is split up to name
the exact mutant.
"""

import random
import re
import subprocess
from pathlib import Path

import pytest

from fsdpc import find_fsdp_opt

REPO = Path(__file__).resolve().parents[2]
SEPARATOR = "\n// -----\n"
CRASH_MARKERS = ("Stack dump", "PLEASE submit a bug report", "LLVM ERROR", "Assertion")
INTERESTING_INTS = ["0", "-1", "1", "2", "3", "7", "32767", "-32768", "65536",
                    "2147483648", "9223372036854775807", "9223372036854775808",
                    "99999999999999999999999"]
TOKEN_SWAPS = [
    ("fsdp.wait", "fsdp.reshard"), ("all_gather_start", "reduce_scatter_start"),
    ("reduce_scatter_start", "all_reduce_start"), ("all_gather_start", "all_slice"),
    ("f32", "i32"), ("bf16", "f16"), ("f32", "index"), ("tensor<", "memref<"),
    ("average", "max"), ("sum", "bitwise_or"), ("root", ""), ("frozen", ""),
    ("@dp", "@nowhere"), ("@root", "@dp"), ("index", "i64"), ("[0]", "[]"),
    ("[0]", "[0, 0]"), ("[0]", "[5]"), ("fsdp.loss", "fsdp.gradients"),
    ("func.func", "fsdp.unit"), ("!fsdp.future<", "!fsdp.future<i32, "),
]


def corpus():
    files = sorted((REPO / "examples").glob("*.mlir")) + sorted((REPO / "test").rglob("*.mlir"))
    chunks = []
    for path in files:
        for chunk in path.read_text().split("// -----"):
            body = "\n".join(line for line in chunk.splitlines() if not line.startswith("// RUN"))
            if "fsdp." in body or "shard." in body:
                chunks.append(body)
    assert chunks, "no IR found to mutate"
    return chunks


def mutate(text: str, rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 0:  # truncation
        return text[: rng.randrange(len(text) + 1)]
    if kind == 1:  # byte noise
        chars = list(text)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(chars) + 1)
            choice = rng.randrange(3)
            if choice == 0 and chars:
                del chars[min(pos, len(chars) - 1)]
            elif choice == 1:
                chars.insert(pos, rng.choice("{}()<>[]%@#:=,.x?-0123456789\"\\"))
            elif chars:
                chars[min(pos, len(chars) - 1)] = rng.choice("x0?<>")
        return "".join(chars)
    if kind == 2:  # integer literals
        numbers = list(re.finditer(r"(?<![\w%#])\d+", text))
        if numbers:
            m = rng.choice(numbers)
            return text[: m.start()] + rng.choice(INTERESTING_INTS) + text[m.end():]
    lines = text.splitlines()
    if kind == 3 and lines:  # drop a line
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines)
    if kind == 4 and lines:  # duplicate a line
        i = rng.randrange(len(lines))
        lines.insert(rng.randrange(len(lines) + 1), lines[i])
        return "\n".join(lines)
    if kind == 5 and len(lines) > 1:  # swap two lines
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    old, new = rng.choice(TOKEN_SWAPS)
    if rng.random() < 0.5:
        old, new = new, old
    if old and old in text:
        starts = [m.start() for m in re.finditer(re.escape(old), text)]
        at = rng.choice(starts)
        return text[:at] + new + text[at + len(old):]
    return text[: rng.randrange(len(text) + 1)]


def run_batch(mutants, extra_args):
    command = [str(find_fsdp_opt()), "-split-input-file", *extra_args, "-", "-o", "/dev/null"]
    try:
        done = subprocess.run(command, input=SEPARATOR.join(mutants), capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "hang (no answer in 120 s)"
    if done.returncode not in (0, 1) or any(m in done.stderr for m in CRASH_MARKERS):
        return f"exit {done.returncode}: {done.stderr[-2000:]}"
    return None


def first_crash(mutants, extra_args):
    """Splits a crashing batch until one mutant remains."""
    while len(mutants) > 1:
        half = mutants[: len(mutants) // 2]
        mutants = half if run_batch(half, extra_args) else mutants[len(mutants) // 2:]
    return mutants[0]


@pytest.mark.parametrize("pipeline", [[], ["-canonicalize", "-cse", "-symbol-dce"],
                                      ["--fsdp-sharding-pipeline=ranks=3 checkpoint=*",
                                       "--fsdp-memory-report=output=/dev/null",
                                       "--fsdp-comm-report=output=/dev/null"]],
                         ids=["parse-verify-print", "canonicalize-cse", "sharding-pipeline"])
def test_mutated_inputs_never_crash(pipeline):
    rng = random.Random(20261121)
    sources = corpus()
    mutants = [mutate(rng.choice(sources), rng) for _ in range(3000)]
    # Every prefix of each example at line granularity, too.
    for path in sorted((REPO / "examples").glob("*.mlir")):
        lines = path.read_text().splitlines()
        mutants += ["\n".join(lines[:n]) for n in range(len(lines))]
    mutants = [m for m in mutants if "// -----" not in m]
    for start in range(0, len(mutants), 250):
        batch = mutants[start:start + 250]
        failure = run_batch(batch, pipeline)
        if failure:
            culprit = first_crash(batch, pipeline)
            pytest.fail(f"fsdp-opt crashed ({run_batch([culprit], pipeline)}) on:\n{culprit}")

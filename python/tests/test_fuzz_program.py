"""The lowering and the program readers are fuzzed as fsdp-opt is
(test_robustness.py): mutated and truncated scheduled IR never crashes or
hangs fsdp-translate, and mutated programs never crash Python's manifest
reader or the runtime's loader: each ends in a clean error or a program."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpc import find_fsdp_opt
from fsdpc.program import ProgramError, find_fsdp_translate
from test_robustness import CRASH_MARKERS, INTERESTING_INTS, SEPARATOR, mutate

REPO = Path(__file__).resolve().parents[2]
PYTHON_DIR = REPO / "python"
HOSTILE = ["", "\\", "\"", "\n", "\u0000", "é", "a\\\nb", "aten::nonexistent", "x" * 5000, "🏖️"]


def scheduled_corpus() -> list[str]:
    """Sharded, scheduled IR the way the driver hands it to fsdp-translate."""
    step = REPO / "test" / "Transforms" / "Inputs" / "step.mlir"
    out = []
    for source, pipeline in [(step, "ranks=4"), (step, "ranks=2 replicas=2 strategy=hybrid-shard"),
                             (REPO / "examples" / "mlp_step.mlir", "ranks=3 gradient-accumulation=true")]:
        done = subprocess.run([str(find_fsdp_opt()), str(source), f"--fsdp-sharding-pipeline={pipeline}"],
                              capture_output=True, text=True, check=True)
        out.append(done.stdout)
    return out


def translate_batch(mutants: list[str]) -> str | None:
    command = [str(find_fsdp_translate()), "--fsdp-to-program", "-split-input-file", "-", "-o", "/dev/null"]
    try:
        done = subprocess.run(command, input=SEPARATOR.join(mutants), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "hang (no answer in 120 s)"
    if done.returncode not in (0, 1) or any(m in done.stderr for m in CRASH_MARKERS):
        return f"exit {done.returncode}: {done.stderr[-2000:]}"
    return None


def test_mutated_scheduled_ir_never_crashes_fsdp_translate():
    rng = random.Random(20261122)
    sources = scheduled_corpus()
    mutants = [m for m in (mutate(rng.choice(sources), rng) for _ in range(1500)) if "// -----" not in m]
    for start in range(0, len(mutants), 150):
        batch = mutants[start:start + 150]
        failure = translate_batch(batch)
        while failure and len(batch) > 1:  # narrow it down to one mutant
            half = batch[: len(batch) // 2]
            batch = half if translate_batch(half) else batch[len(batch) // 2:]
        if failure:
            pytest.fail(f"fsdp-translate failed ({translate_batch(batch)}) on:\n{batch[0][:5000]}")


def mutate_json(value, rng: random.Random):
    """One structural mutation somewhere in a decoded program."""
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        roll = rng.random()
        if roll < 0.15:
            return {k: v for k, v in value.items() if k != key}
        if roll < 0.3:
            return {**value, key: rng.choice([None, True, -1, 2**63, "x", [], {}, 1.5])}
        return {**value, key: mutate_json(value[key], rng)}
    if isinstance(value, list) and value:
        index = rng.randrange(len(value))
        roll = rng.random()
        if roll < 0.15:
            return value[:index] + value[index + 1:]
        if roll < 0.25:
            return value + [value[index]]
        return value[:index] + [mutate_json(value[index], rng)] + value[index + 1:]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return int(rng.choice(INTERESTING_INTS))
    if isinstance(value, float):
        return rng.choice([float("nan"), -0.0, 1e308, -1.0])
    if isinstance(value, str):
        return rng.choice(HOSTILE)
    return rng.choice([0, "", None])


READER = """
import sys, json
from fsdpc.program import Program, ProgramError
texts = json.load(open(sys.argv[1]))
for index, text in enumerate(texts):
    print(index, flush=True)
    try:
        Program.parse(text).load("cpu")
    except (ProgramError, RuntimeError, ValueError, TypeError, IndexError, KeyError):
        pass
print("done", flush=True)
"""


def test_mutated_programs_never_crash_the_readers(tmp_path):
    rng = random.Random(7)
    done = subprocess.run([str(find_fsdp_translate()), "--fsdp-to-program", "-"], input=scheduled_corpus()[0],
                          capture_output=True, text=True, check=True)
    original = done.stdout
    decoded = json.loads(original)
    texts = [original[: rng.randrange(len(original))] for _ in range(100)]
    for _ in range(600):
        mutant = decoded
        for _ in range(rng.randint(1, 3)):
            mutant = mutate_json(mutant, rng)
        texts.append(json.dumps(mutant))
    corpus = tmp_path / "programs.json"
    corpus.write_text(json.dumps(texts))
    env = {"PYTHONPATH": str(PYTHON_DIR), "FSDP_OPT": str(find_fsdp_opt()), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", READER, str(corpus)], capture_output=True, text=True,
                         timeout=600, env=env)
    lines = run.stdout.split()
    if run.returncode != 0 or not lines or lines[-1] != "done":
        culprit = texts[int(lines[-1])] if lines and lines[-1].isdigit() else "(before the first program)"
        pytest.fail(f"the readers crashed (exit {run.returncode}) on program:\n{culprit[:3000]}\n"
                    f"{run.stderr[-3000:]}")
    with pytest.raises(ProgramError):
        from fsdpc.program import Program

        Program.parse(original[:100])

"""The lowering and the runtime are fuzzed as fsdp-opt is
(test_robustness.py): mutated and truncated scheduled IR never crashes or
hangs fsdp-translate, and mutated programs, loaded and then run with the
runtime built under AddressSanitizer, never crash it and never make it touch
memory out of bounds: each ends in a clean error or a finished step."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fsdpc import find_fsdp_opt
from fsdpc.compiler import run_fsdp_opt
from fsdpc.export import export_training_step, load_factory
from fsdpc.program import find_fsdp_translate, translate
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


def mutate_plausibly(program: dict, rng: random.Random) -> dict:
    """A change that keeps the program well-formed, so that the loader may
    accept it and the executor must cope: instructions swapped, dropped or
    repeated, a slot or future renumbered within its table, a dimension of
    a shape changed."""
    program = json.loads(json.dumps(program))
    try:
        function = rng.choice(program["functions"])
        instructions = function["instructions"]
        index = rng.randrange(len(instructions))
        function["slots"] + function["futures"]
    except (KeyError, TypeError, IndexError, ValueError):  # an earlier mutation broke the structure
        return program
    roll = rng.random()
    if roll < 0.2 and index + 1 < len(instructions):
        instructions[index], instructions[index + 1] = instructions[index + 1], instructions[index]
    elif roll < 0.35:
        del instructions[index]
    elif roll < 0.45:
        instructions.insert(index, json.loads(json.dumps(instructions[index])))
    else:
        instruction = instructions[index]
        key = rng.choice(sorted(instruction))
        if key == "shapes":
            instruction[key] = _renumber(instruction[key], 12, rng)
        elif key != "op":
            limit = function["futures"] if key == "future" else function["slots"]
            instruction[key] = _renumber(instruction[key], limit if isinstance(limit, int) else 1, rng)
    return program


def _renumber(value, limit: int, rng: random.Random):
    """`value` with one integer somewhere in it replaced by one below `limit`."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return rng.randrange(max(limit, 1))
    if isinstance(value, list) and value:
        at = rng.randrange(len(value))
        return value[:at] + [_renumber(value[at], limit, rng)] + value[at + 1:]
    if isinstance(value, dict) and value:
        key = rng.choice(sorted(value))
        return {**value, key: _renumber(value[key], limit, rng)}
    return value


RUNNER = """
import json, sys
import torch
import torch.distributed as dist
from fsdpc.emit import torch_dtype
from fsdpc.program import Program, ProgramError

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
world = dist.new_group([0])
texts = json.load(open(sys.argv[1]))
loaded = finished = 0
for index, text in enumerate(texts):
    print(index, flush=True)
    try:
        program = Program.parse(text, "cpu")
    except ProgramError:
        continue
    loaded += 1
    # What the driver would pass: every listed parameter as its shard, every
    # buffer, every batch tensor, one group per key (a world of one rank).
    try:
        params = {p.name: torch.ones((p.shard_rows, *p.shape[1:]) if p.shape else (), dtype=torch_dtype(p.dtype))
                  for p in program.params}
        buffers = {b.name: torch.ones(b.shape, dtype=torch_dtype(b.dtype)) for b in program.buffers}
    except (RuntimeError, ValueError, KeyError):
        continue
    groups = {key: world for key in program.groups}
    for name, function in program.functions.items():
        try:
            batch = [torch.ones(shape, dtype=torch_dtype(dtype)) for shape, dtype in function.inputs]
            program.loaded.run(name, params, buffers, dict(params), batch, groups, 10.0)
            finished += 1
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError):
            pass
print("done", loaded, finished, flush=True)
"""


def seed_programs() -> list[str]:
    """Programs of captured models for a world of one rank (so that what
    loads can run): the MLP full-shard and no-shard with its no-sync
    microbatch function, the small GPT full-shard."""
    out = []
    for model, pipeline in [("mlp", "ranks=1"), ("mlp", "ranks=1 strategy=no-shard gradient-accumulation=true"),
                            ("gpt", "ranks=1")]:
        torch.manual_seed(0)
        module, batch, loss_fn = load_factory(model)()
        exported = export_training_step(module, batch, loss_fn)
        out.append(translate(run_fsdp_opt(exported.mlir, [f"--fsdp-sharding-pipeline={pipeline}"])).text)
    return out


def sanitized_environment() -> dict:
    """The runtime built with -fsanitize=address (build/python_asan), its
    libasan preloaded into Python; any report ends the process."""
    extension, libasan = os.environ.get("FSDP_RT_ASAN_PYTHON"), os.environ.get("FSDP_LIBASAN")
    if not extension or not libasan:  # outside ctest: the default build folder
        build = find_fsdp_opt().parents[1]
        extension = str(build / "python_asan")
        libasan = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True,
                                 check=True).stdout.strip()
    assert any(Path(extension).glob("_fsdp_rt*.so")), f"the AddressSanitizer runtime is not built in {extension}"
    return {"PYTHONPATH": str(PYTHON_DIR), "FSDP_OPT": str(find_fsdp_opt()), "PATH": "/usr/bin:/bin",
            "FSDP_RT_PYTHON": extension, "OMP_NUM_THREADS": "1",
            # libstdc++ too, before anything else: else ASan's __cxa_throw
            # interceptor finds no real __cxa_throw (Python links no C++).
            "LD_PRELOAD": f"{libasan} libstdc++.so.6",
            # Leaks are Python's business; allocations over 2 GiB fail as
            # they would on a full machine, instead of exhausting this one.
            "ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=2048"}


def test_mutated_programs_run_without_crashes_or_sanitizer_reports(tmp_path):
    rng = random.Random(7)
    seeds = seed_programs()
    decoded = [json.loads(seed) for seed in seeds]
    texts = list(seeds) + [rng.choice(seeds)[: rng.randrange(len(seeds[0]))] for _ in range(100)]
    while len(texts) < 2100:
        mutant = rng.choice(decoded)
        for _ in range(rng.randint(1, 3)):
            mutant = mutate_json(mutant, rng) if rng.random() < 0.4 else mutate_plausibly(mutant, rng)
        texts.append(json.dumps(mutant))
    corpus = tmp_path / "programs.json"
    corpus.write_text(json.dumps(texts))
    run = subprocess.run([sys.executable, "-c", RUNNER, str(corpus)], capture_output=True, text=True,
                         timeout=900, env=sanitized_environment())
    lines = run.stdout.split("\n")
    last = [line for line in lines if line][-1] if run.stdout.strip() else ""
    # A report is an ERROR; the WARNING that an allocation over the limit
    # failed (returned null, which torch raises as an error) is the limit working.
    if run.returncode != 0 or not last.startswith("done") or "ERROR: AddressSanitizer" in run.stderr:
        numbers = [line for line in lines if line.isdigit()]
        culprit = texts[int(numbers[-1])] if numbers else "(before the first program)"
        pytest.fail(f"the runtime crashed (exit {run.returncode}) on program:\n{culprit[:3000]}\n"
                    f"{run.stderr[-4000:]}")
    _, loaded, finished = last.split()
    # The unmutated seeds load and run; so do enough mutants to reach the
    # executor's paths, not only the loader's refusals.
    assert int(loaded) >= 400 and int(finished) >= 100, last

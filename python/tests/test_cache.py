"""The program cache: keys change with everything that changes the program,
whatever the code reads while it traces; the cache directory is private and
written atomically."""

import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from fsdpc import cache
from fsdpc.export import load_factory
from launch import environment, run_ranks

WORKER = Path(__file__).with_name("stale_worker.py")


def key(model=None, batch=None, loss_fn=None, options=None, world=2):
    torch.manual_seed(0)
    default_model, default_batch, default_loss = load_factory("gpt")()
    return cache.setup_key(model or default_model, batch or default_batch, loss_fn or default_loss,
                          options=options or {"pipeline": "ranks=2"}, world=world)


def test_the_key_is_stable_and_ignores_parameter_values():
    torch.manual_seed(0)
    model, batch, loss_fn = load_factory("gpt")()
    first = key(model, batch, loss_fn)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert key(model, batch, loss_fn) == first


def test_the_set_up_key_changes_with_what_ranks_must_agree_on():
    torch.manual_seed(0)
    model, batch, loss_fn = load_factory("gpt")()
    base = key(model, batch, loss_fn)
    assert key(model, batch, loss_fn, world=4) != base
    assert key(model, batch, loss_fn, options={"pipeline": "ranks=2 strategy=no-shard"}) != base
    assert key(model, tuple(t[:1] for t in batch), loss_fn) != base
    assert key(model, batch, lambda m, x, y: loss_fn(m, x, y) * 2) != base
    model.blocks[0].attn.n_heads = 2  # same shapes, different computation
    assert key(model, batch, loss_fn) != base
    model.blocks[0].attn.n_heads = 4
    model.blocks[0].ln1.weight.requires_grad_(False)
    assert key(model, batch, loss_fn) != base


def test_entries_are_written_whole_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDPC_CACHE", str(tmp_path / "cache"))
    assert cache.load("k" * 64) is None
    cache.store("k" * 64, {"program": "p", "memory_report": {}, "sharded_ir": "ir"})
    assert cache.load("k" * 64)["program"] == "p"
    directory = tmp_path / "cache"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert [p.name for p in directory.iterdir()] == ["k" * 64 + ".json"]  # no temporary left
    (directory / ("j" * 64 + ".json")).write_text('{"program": "trunc')  # a damaged entry
    assert cache.load("j" * 64) is None


def test_a_shared_cache_directory_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    monkeypatch.setenv("FSDPC_CACHE", str(shared))
    with pytest.raises(cache.CacheError, match="must be owned by you and private"):
        cache.load("k" * 64)


def test_the_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FSDPC_CACHE", "off")
    cache.store("k" * 64, {"program": "p"})
    assert cache.load("k" * 64) is None


FUNCTION = """import torch
{imports}

class {name}(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return {backward}
"""

NEGATION = """def negated(grad):
    return -{scale} * grad
"""


def job(setting: str, cache_dir: Path) -> dict[str, str]:
    """Runs stale_worker.py on 2 ranks, its Functions' backward scaled by
    1 + the setting (one's in its own file, the other's in a helper's
    file); what rank 0 says of each case."""
    functions = cache_dir.parent / "function"  # files edited between jobs as a user edits them
    functions.mkdir(exist_ok=True)
    scale = 1.0 + float(setting)
    (functions / "reversal.py").write_text(FUNCTION.format(imports="", name="Reversal", backward=f"-{scale} * grad"))
    (functions / "negation.py").write_text(NEGATION.format(scale=scale))
    (functions / "by_helper.py").write_text(FUNCTION.format(imports="\nimport negation\n", name="ReversalByHelper",
                                                            backward="negation.negated(grad)"))
    # No bytecode of the last job's files: an edit within the same second keeps their size and time, which
    # Python's check reads.
    shutil.rmtree(functions / "__pycache__", ignore_errors=True)
    env = environment(SETTING=setting, FSDPC_CACHE=str(cache_dir), FUNCTION_DIR=str(functions))
    done = run_ranks(2, [WORKER], env=env, port=29600 + os.getpid() % 200, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {line.split()[0]: line.split(maxsplit=1)[1] for line in done.stdout.splitlines() if line.strip()}


def test_a_value_read_while_tracing_is_never_served_from_a_stale_program(tmp_path):
    """The same code in three jobs: a global, a default argument, a closure
    over an object, a model attribute (none of them plain data in the
    model's structure), a custom Function's backward in a module of its
    own, and a helper another Function's backward calls, in a file of its
    own, change between the first two. The second job must compile anew and
    match eager (the worker checks); the third, with the second's setting,
    takes every program from the cache."""
    first = job("0.0", tmp_path / "cache")
    second = job("0.3", tmp_path / "cache")
    third = job("0.3", tmp_path / "cache")
    cases = ["global", "default", "closure", "attribute", "function", "helper"]
    assert sorted(first) == sorted(second) == sorted(third) == sorted(cases)
    for case in cases:
        assert first[case].startswith("compiled") and second[case].startswith("compiled"), (case, first, second)
        if case not in ("function", "helper"):  # their backward changed, not their loss
            assert first[case].split()[1] != second[case].split()[1], (case, first, second)
        assert third[case] == second[case].replace("compiled", "cache hit"), (case, second, third)


HELPERS = {
    "helpers.py": "import functools\n\n\nclass Scale:\n    @staticmethod\n    def grad(g):\n        return g * 2\n\n\n"
                  "@functools.lru_cache(None)\ndef factor():\n    return 2.0\n",
    "wrapping.py": "import functools\n\n\ndef logged(f):\n    @functools.wraps(f)\n    def wrapper(*args):\n"
                   "        return f(*args)\n    return wrapper\n",
    "pkg/__init__.py": "",
    "pkg/sub.py": "def scaled(g):\n    return g * 2\n",
    "deeper.py": "def inner(g):\n    return g * 2\n",
    "defaults.py": "def doubled(g):\n    return g * 2\n",
    "functions_file.py": """import functools

import torch

import pkg.sub
from deeper import inner
from defaults import doubled
from helpers import Scale, factor
from wrapping import logged


@logged
def decorated(g):
    return inner(g)


halved = functools.partial(decorated)


class Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g, twice=doubled):
        return Scale.grad(g) * factor() + pkg.sub.scaled(g) + halved(g) + twice(g)
""",
}


def test_a_functions_key_holds_the_files_of_the_code_its_methods_call(tmp_path, monkeypatch):
    """A helper class's method, a cached function, a decorated one (its
    wrapper's file and its own), a partial, `pkg.sub.f(...)`, a default
    argument, and what the helpers call in turn: each of their files keys
    the program, as the Function's own does."""
    from types import SimpleNamespace

    from fsdpc import functions

    for name, text in HELPERS.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    import functions_file

    digests, unknown = functions.code_key([SimpleNamespace(function=functions_file.Backward)])
    assert sorted(os.path.relpath(path, tmp_path) for path, _ in digests) == sorted(HELPERS)
    assert unknown == []

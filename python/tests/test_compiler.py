"""fsdpc.compiler drives the real fsdp-opt binary."""

import re
from pathlib import Path

import pytest

from fsdpc import FsdpOptError, find_fsdp_opt, run_fsdp_opt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_finds_the_built_driver():
    assert find_fsdp_opt().name == "fsdp-opt"


def test_fsdp_opt_env_var_must_point_at_a_binary(monkeypatch, tmp_path):
    monkeypatch.setenv("FSDP_OPT", str(tmp_path / "missing"))
    monkeypatch.setattr("shutil.which", lambda _: None)
    monkeypatch.setattr("fsdpc.compiler._REPO_ROOT", tmp_path)
    with pytest.raises(FileNotFoundError, match="fsdp-opt not found"):
        find_fsdp_opt()


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.mlir")), ids=lambda p: p.name)
def test_examples_round_trip(example):
    printed = run_fsdp_opt(example.read_text())
    assert run_fsdp_opt(printed) == printed
    generic = run_fsdp_opt(example.read_text(), ["--mlir-print-op-generic"])
    assert run_fsdp_opt(generic) == printed


def test_sharded_example_keeps_its_schedule_through_canonicalize():
    text = (EXAMPLES / "mlp_sharded.mlir").read_text()
    out = run_fsdp_opt(text, ["--canonicalize", "--cse"])
    ops = [m.group(1) for m in re.finditer(r"^\s*(?:%\S+ = )?(fsdp\.\w+)", out, re.MULTILINE)]
    collectives = [op for op in ops if op.endswith("_start") or op == "fsdp.wait" or op == "fsdp.reshard"]
    assert collectives == [
        "fsdp.all_gather_start", "fsdp.all_gather_start", "fsdp.wait", "fsdp.reshard",
        "fsdp.wait", "fsdp.reshard", "fsdp.reduce_scatter_start",
        "fsdp.reduce_scatter_start", "fsdp.wait", "fsdp.wait",
    ]


def test_invalid_ir_raises_with_location():
    bad = (EXAMPLES / "mlp_sharded.mlir").read_text().replace("padding = 2", "padding = 1", 1)
    with pytest.raises(FsdpOptError) as info:
        run_fsdp_opt(bad)
    assert info.value.returncode == 1
    assert "<stdin>:" in info.value.diagnostics
    assert "padding is 1, but 10 rows over 4 ranks pad 2" in info.value.diagnostics

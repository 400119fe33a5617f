"""`python -m fsdpc export`, as a user runs it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fsdpc import find_fsdp_opt
from fsdpc.__main__ import main

PYTHON_DIR = Path(__file__).resolve().parents[1]
BAD_MODELS = Path(__file__).with_name("bad_models.py")


def fsdpc(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR), "FSDP_OPT": str(find_fsdp_opt())}
    return subprocess.run([sys.executable, "-m", "fsdpc", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


def test_export_builtin_prints_a_summary(tmp_path):
    out = tmp_path / "mlp.mlir"
    done = fsdpc("export", "--model", "mlp", "--out", str(out), "--batch", "4")
    assert done.returncode == 0, done.stderr
    assert "fsdpc export: mlp (MLP) -> " in done.stdout and "(verified by fsdp-opt)" in done.stdout
    assert "parameters: 4 tensors, 874 elements (4 trainable, 0 frozen, 0 tied names)" in done.stdout
    assert "wrap units: 3 (root, 2 x Linear)" in done.stdout
    assert "func.func @train_step(%batch0: tensor<4x16xf32>, %batch1: tensor<4x10xf32>)" in out.read_text()


def test_a_param_dtype_alone_reduces_where_fsdpc_shard_would(tmp_path):
    """`--param-dtype bf16` without `--reduce-dtype` writes the reduce dtype
    fsdpc.shard takes for the same policy (the installed torch's FSDP2's:
    fp32 parameters' gradients in fp32 from torch 2.15, in bf16 before), so
    that a plan of it counts what the job moves; before 2026-11-28 the IR
    left it out, and the compiler reduced in bf16 on every torch."""
    from fsdpc.capture import _FSDP2_REDUCES_IN_GRAD_DTYPE

    out = tmp_path / "mlp.mlir"
    default = "f32" if _FSDP2_REDUCES_IN_GRAD_DTYPE else "bf16"
    for given, reduced in [((), default), (("--reduce-dtype", "bf16"), "bf16")]:
        assert main(["export", "--model", "mlp", "--param-dtype", "bf16", *given, "--out", str(out)]) == 0
        assert f"fsdp.mixed_precision = {{param_dtype = bf16, reduce_dtype = {reduced}," in out.read_text(), given


def test_the_commands_import_transformers_only_for_its_models():
    """Importing `transformers` costs a second (three on the GPU hosts): the
    commands pay it only when a Hugging Face model is built, and those
    models stay listed where it is installed."""
    probe = ("import sys; from fsdpc.__main__ import main; from fsdpc.models import BUILTIN_MODELS; "
             "assert 'transformers' not in sys.modules, 'imported with the commands'; "
             "assert {'hf-gpt2', 'hf-llama'} <= set(BUILTIN_MODELS); "
             "model, batch, loss = BUILTIN_MODELS['hf-gpt2'](); "
             "assert 'transformers' in sys.modules and type(model).__name__ == 'GPT2LMHeadModel'")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(PYTHON_DIR)})
    assert done.returncode == 0, done.stderr


def test_export_user_factory_with_wrap_option(tmp_path):
    factory = tmp_path / "my_model.py"
    factory.write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.inp, self.out = nn.Linear(6, 5), nn.Linear(5, 7)\n"
        "    def forward(self, x):\n"
        "        return self.out(torch.tanh(self.inp(x)))\n"
        "def make(batch=3, **_):\n"
        "    return Net(), (torch.randn(batch, 6),), lambda m, x: m(x).square().mean()\n")
    out = tmp_path / "net.mlir"
    done = fsdpc("export", "--model", f"{factory}:make", "--out", str(out), "--wrap", "Linear")
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert 'fsdp.unit @"inp" class "Linear"' in text and 'fsdp.unit @"out" class "Linear"' in text
    tanh = next(line for line in text.splitlines() if '"aten::tanh"' in line)
    assert tanh.endswith(f'loc("{factory}":8:1)')


def test_export_under_autocast_captures_its_casts(tmp_path, capsys):
    """`--autocast bf16`: the step as a call under torch.autocast makes it
    (its products in bf16 from fp32 parameters); for a CUDA target without
    a GPU, one clear line."""
    out = tmp_path / "gpt.mlir"
    assert main(["export", "--model", "gpt", "--autocast", "bf16", "--out", str(out)]) == 0
    text = out.read_text()
    products = [line for line in text.splitlines() if '"aten::addmm"' in line]
    assert products and all("xbf16>" in line and "xf32>" not in line for line in products), products[:2]
    assert "--autocast bf16`" in text and 'fsdp.param @"tok_emb.weight" : tensor<1021x64xf32>' in text
    if not torch.cuda.is_available():
        assert main(["export", "--model", "gpt", "--autocast", "bf16", "--device", "cuda",
                     "--out", str(tmp_path / "x.mlir")]) == 1
        said = capsys.readouterr().err
        assert "--autocast with --device cuda needs a GPU on this machine" in said and \
            len(said.strip().splitlines()) == 1, said


@pytest.mark.parametrize("args, message", [
    (["--model", "nosuch"], "unknown model 'nosuch'"),
    (["--model", "missing.py:make"], "model file missing.py does not exist"),
    (["--model", f"{BAD_MODELS}:nothing"], "has no callable 'nothing'"),
    (["--model", f"{BAD_MODELS}:branchy", "--no-meta"], "cannot capture `if y.sum() > 0:`"),
    (["--model", "gpt", "--seq", "999"], "gpt: seq must be in [1, 64], got 999"),
])
def test_export_errors_are_one_clear_line(tmp_path, capsys, args, message):
    # In-process (a Python start per case costs seconds in CI); an exception
    # that escaped main would fail the test with its traceback.
    assert main(["export", *args, "--out", str(tmp_path / "x.mlir")]) == 1
    said = capsys.readouterr().err
    assert message in said and len(said.strip().splitlines()) == 1, said
    assert not (tmp_path / "x.mlir").exists()


def test_installing_in_place_makes_fsdpc_importable_without_pythonpath(tmp_path):
    """`make runtime` on a GPU host ends with scripts/install-in-place.py."""
    python = tmp_path / "venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "venv"], check=True)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([python, PYTHON_DIR.parent / "scripts" / "install-in-place.py"], capture_output=True,
                          text=True, env=env, check=False)
    assert done.returncode == 0 and "fsdpc installed in place" in done.stdout, done.stderr
    found = subprocess.run([python, "-c", "import importlib.util; print(importlib.util.find_spec('fsdpc').origin)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert found.stdout.strip() == str(PYTHON_DIR / "fsdpc" / "__init__.py"), found.stderr

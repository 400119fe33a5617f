"""A Llama-3-70B-shaped model (80 layers) captures on the meta device, within
the build machine's memory, in about a minute."""

from test_cli import fsdpc


def test_llama3_70b_exports_on_the_meta_device(tmp_path):
    out = tmp_path / "llama3-70b.mlir"
    done = fsdpc("export", "--model", "llama3-70b", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "parameters: 723 tensors, 70,553,706,496 elements" in done.stdout
    assert "wrap units: 81 (root, 80 x TransformerBlock)" in done.stdout
    assert out.stat().st_size > 1_000_000

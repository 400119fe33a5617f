"""fsdpc.shard end to end: CPU ranks (launch.py) that run a scenario of
api_train.py, each of which checks itself against eager PyTorch, and the
README's loop and the examples under torchrun, as users launch them; the
checkpoint tests compare losses across jobs of different sizes."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch

from launch import Rank, environment, rank_environment, run_ranks, torchrun

SCRIPT = Path(__file__).with_name("api_train.py")
ROOT = Path(__file__).resolve().parents[2]


def port(offset: int = 0) -> int:
    return 29300 + (os.getpid() + offset) % 250


def run(ranks: int, scenario: str, *extra, port_offset: int = 0) -> subprocess.CompletedProcess:
    done = run_ranks(ranks, [SCRIPT, scenario, *extra], env=environment(), port=port(port_offset), timeout=600)
    # Each failed rank's reason first: the tails may hold only the other ranks' reactions.
    reasons = [line for line in (done.stdout + done.stderr).splitlines() if "RuntimeError: scenario '" in line]
    assert done.returncode == 0, "\n".join(reasons) + "\n" + done.stdout[-3000:] + done.stderr[-6000:]
    return done


def run_torchrun(script, *arguments, cwd=None, port_offset: int = 0) -> str:
    """`script` trained by 2 ranks under torchrun, as users launch the
    README's loop and the examples: fresh processes, whose exit is part of
    what is tested (launch.Rank's forks end without an interpreter's
    shutdown); its output."""
    done = subprocess.run(torchrun(2, script, *arguments, port=port(port_offset)), capture_output=True, text=True,
                          env=environment(), cwd=cwd, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


# Scenarios at one rank count share a job (each checks itself and names
# itself when it fails): a job's start costs seconds on the CI machine.
@pytest.mark.parametrize("scenarios, ranks", [
    ("train,meta,accumulate,shapes,fsdp2,misuse,offload,llama,into_results,cuda_graph,uncapturable,checkpointed,"
     "freezing,hooks,divide_factor,attributes,aux,modes,named_batch,reshard_setter,unsharded,batch_norm,sync_batch_norm,async_checkpoint,uneven_batches,"
     "mixed_by_unit,reduce_dtype_default,autocast,grad_scaler,ignored_params,shard_placement,hugging_face,parametrized", 2),
    ("hybrid,scalar,divide_factor,unsharded,uneven_batches,reshard_group", 4),
])
def test_scenarios(scenarios, ranks, tmp_path):
    run(ranks, scenarios, "--save", tmp_path)


def test_checkpoints_resume_on_other_rank_counts_with_the_same_losses(tmp_path):
    """Saved on 1 rank after step 2, resumed on 3 (uneven shards) and saved
    after step 3, resumed on 2. The 3-rank job also runs the `replicated`
    scenario (its only 3-rank check), saving a job's start-up."""
    whole, on_three, on_two = tmp_path / "whole.pt", tmp_path / "three.pt", tmp_path / "two.pt"
    run(1, "checkpoint", "--steps", 5, "--save", tmp_path / "ckpt1", "--save-at", 2, "--out", whole)
    run(3, "replicated,checkpoint", "--steps", 5, "--load", tmp_path / "ckpt1", "--save", tmp_path / "ckpt3",
        "--save-at", 3, "--out", on_three)
    run(2, "checkpoint", "--steps", 5, "--load", tmp_path / "ckpt3", "--out", on_two)
    whole = torch.load(whole)
    for resumed, start in ((torch.load(on_three), 2), (torch.load(on_two), 3)):
        assert resumed["start"] == start
        torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(whole["losses"][start:]),
                                   rtol=1e-5, atol=1e-6)
    assert not any(".partial-" in p.name for p in tmp_path.iterdir())
    # The checkpoints hold true shapes: padding never reaches them (257 rows do not divide by 2 or 3).
    import torch.distributed.checkpoint as dcp

    for saved in ("ckpt1", "ckpt3"):
        metadata = dcp.FileSystemReader(tmp_path / saved).read_metadata().state_dict_metadata
        assert tuple(metadata["model.tok_emb.weight"].size) == (257, 32)
        assert tuple(metadata["optim.state.tok_emb.weight.exp_avg"].size) == (257, 32)


def test_a_save_killed_half_way_leaves_the_previous_checkpoint(tmp_path):
    target, marker = tmp_path / "ckpt", tmp_path / "first-save-done"
    ranks = [Rank([SCRIPT, "slow_save", "--save", target, "--out", marker],
                  rank_environment(environment(), rank, 2, port())) for rank in range(2)]
    try:
        deadline = time.monotonic() + 300
        while not (marker.exists() and list(tmp_path.glob(".ckpt.partial-*/*.distcp"))):
            assert all(rank.poll() is None for rank in ranks), "the job ended before its second save began"
            assert time.monotonic() < deadline, "the second save never started"
            time.sleep(0.05)
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    assert (target / ".metadata").is_file()
    assert torch.load(target / "fsdpc_extra.pt")["step"] == 1
    partial = next(tmp_path.glob(".ckpt.partial-*"))
    assert not (partial / ".metadata").exists(), "the killed save looks complete"
    # The previous checkpoint loads and training goes on from it.
    resumed = tmp_path / "resumed.pt"
    run(2, "checkpoint", "--steps", 3, "--load", target, "--out", resumed, port_offset=7)
    assert torch.load(resumed)["start"] == 1


def test_the_readme_training_loop_runs_as_written(tmp_path):
    """The README's first Python block, extracted and run under torchrun."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Training with fsdpc\n.*?```python\n(.*?)```", readme, re.S)
    assert block, "README has no training example under '## Training with fsdpc'"
    script = tmp_path / "readme_train.py"
    script.write_text(block.group(1))
    assert "loss" in run_torchrun(script, cwd=tmp_path)


def demo_losses(output: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"step +(\d+)/\d+ +loss +(\S+)", output)}


def test_the_demo_resumes_from_its_checkpoint_with_the_same_losses(tmp_path):
    trainer = ROOT / "examples" / "train_gpt.py"
    first = run_torchrun(trainer, "--steps", 6, "--save-at", 3, "--out", tmp_path)
    second = run_torchrun(trainer, "--steps", 6, "--resume", tmp_path / "checkpoint", "--out", tmp_path / "resumed",
                          port_offset=3)
    whole, resumed = demo_losses(first), demo_losses(second)
    assert sorted(whole) == [1, 2, 3, 4, 5, 6] and sorted(resumed) == [4, 5, 6]
    assert all(resumed[i] == whole[i] for i in (4, 5, 6)), (whole, resumed)


def test_the_hugging_face_fine_tuning_example_trains_with_the_models_own_loss(tmp_path):
    pytest.importorskip("transformers")
    output = run_torchrun(ROOT / "examples" / "finetune_hf.py", "--steps", 8, "--out", tmp_path)
    losses = [float(m) for m in re.findall(r"loss (\d+\.\d+)\n", output)]
    assert len(losses) == 8 and losses[-1] < losses[0], losses
    assert "in a plain LlamaForCausalLM" in output
    assert "generated on whole parameters, unit by unit, as a plain LlamaForCausalLM generates" in output

"""Checkpoints from elsewhere run no code, and checkpoint names are names:
`extra` is read weights-only, and a name with glob characters neither
removes another save's temporaries nor misses its own."""

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from fsdpc import checkpoint


@pytest.fixture
def one_rank_job():
    if dist.is_initialized():  # another test of this process set one up
        assert dist.get_world_size() == 1
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Payload:
    """Unpickling this would run os.system: what a hostile checkpoint holds."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/fsdpc-checkpoint-ran-code",))


def test_plain_extra_state_round_trips(one_rank_job, tmp_path):
    model = nn.Linear(4, 3)
    extra = {"step": 7, "rng": torch.get_rng_state(), "schedule": {"lr": [1e-3, 5e-4]}, "name": "run", "x": None}
    checkpoint.save(tmp_path / "ckpt", model, extra=extra)
    loaded = checkpoint.load(tmp_path / "ckpt", nn.Linear(4, 3))
    assert loaded["step"] == 7 and loaded["schedule"] == {"lr": [1e-3, 5e-4]} and loaded["x"] is None
    assert torch.equal(loaded["rng"], extra["rng"])


def test_a_checkpoint_whose_extra_holds_a_callable_is_refused(one_rank_job, tmp_path):
    model = nn.Linear(4, 3)
    target = checkpoint.save(tmp_path / "ckpt", model, extra={"step": 1})
    torch.save({"step": 1, "hook": Payload()}, target / checkpoint.EXTRA_FILE)  # tampered with elsewhere
    marker = "/tmp/fsdpc-checkpoint-ran-code"
    if os.path.exists(marker):
        os.remove(marker)
    with pytest.raises(checkpoint.CheckpointError, match="refused to load.*running code"):
        checkpoint.load(target, model)
    assert not os.path.exists(marker)


def test_saving_extra_state_that_load_would_refuse_fails_before_writing(one_rank_job, tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="extra holds something other than tensors"):
        checkpoint.save(tmp_path / "ckpt", nn.Linear(4, 3), extra={"loss_fn": len})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["run[1]", "ckpt*", "step?", "[!a]"])
def test_glob_characters_in_a_name_touch_only_its_own_temporaries(one_rank_job, tmp_path, name):
    own_stale = tmp_path / f".{name}.partial-killed"  # left by a killed save of this name
    own_stale.mkdir()
    others = [tmp_path / f".{other}.partial-inflight" for other in ("run1", "ckpt-other", "stepX", "b")]
    for other in others:
        other.mkdir()
    checkpoint.save(tmp_path / name, nn.Linear(4, 3), extra={"step": 1})
    assert not own_stale.exists()
    assert all(other.exists() for other in others)
    assert checkpoint.load(tmp_path / name, nn.Linear(4, 3)) == {"step": 1}

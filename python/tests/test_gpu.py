"""fsdpc.shard on a GPU (`make test-gpu`): the api_train.py scenarios with
the sharded side on CUDA, each checked against eager PyTorch on CPU. One
process on NCCL; 2 and 4 ranks that share the GPU over Gloo (which moves
CUDA tensors between them); and 2 to 4 ranks sharing it over NCCL, each rank
claiming a host of its own (NCCL refuses two ranks of one host on one GPU),
talking over sockets: every strategy, accumulation, hybrid meshes, meta
initialization, CPU offload, the Llama with its generated kernels and with
nn.RMSNorm's fused kernels, steps replayed as CUDA graphs and one a graph
cannot capture, checkpoints GPU <-> CPU and fsdpc <-> FSDP2, a
dead or stalled rank on Gloo and on NCCL. Where there is no GPU every test
is skipped with that reason (make test-gpu prints it)."""

import subprocess
from pathlib import Path

import pytest
import torch

from launch import environment, free_port, run_ranks, torchrun
from test_api import SCRIPT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU on this machine: make test-gpu runs these on a GPU host")


def run(ranks: int, scenario: str, *extra, device: str = "cuda", backend: str | None = None) \
        -> subprocess.CompletedProcess:
    backend = backend or ("nccl" if ranks == 1 and device == "cuda" else "gloo")
    done = subprocess.run(torchrun(ranks, SCRIPT, scenario, "--device", device, "--backend", backend, *extra,
                                   port=free_port()),
                          capture_output=True, text=True, env=environment(), timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


@pytest.mark.parametrize("scenario", ["train", "accumulate", "shapes", "misuse", "scalar", "fsdp2", "meta",
                                      "offload", "llama", "llama_torch_norms", "into_results", "cuda_graph",
                                      "uncapturable", "checkpointed", "divide_factor", "attributes", "aux",
                                      "unsharded", "batch_norm", "hugging_face", "parametrized"])
def test_one_rank_on_nccl(scenario, tmp_path):
    run(1, scenario, "--save", tmp_path)


@pytest.mark.parametrize("scenario, ranks", [
    ("train", 2), ("hybrid", 4), ("replicated", 2), ("meta", 2), ("accumulate", 2), ("scalar", 4),
    ("offload", 2), ("llama", 2), ("llama_torch_norms", 2), ("into_results", 2), ("cuda_graph", 2),
    ("divide_factor", 2), ("freezing", 2), ("hooks", 2), ("attributes", 2), ("aux", 2), ("modes", 2),
    ("named_batch", 2), ("reshard_setter", 2), ("unsharded", 2), ("async_checkpoint", 2), ("uneven_batches", 2),
    ("ignored_params", 2), ("hugging_face", 2), ("parametrized", 2), ("sync_batch_norm", 2), ("sync_batch_norm", 4),
])
def test_ranks_sharing_the_gpu_over_gloo(scenario, ranks, tmp_path):
    run(ranks, scenario, "--save", tmp_path)


# Two NCCL ranks on this GPU, each claiming a host of its own, all-reduce.
PROBE = f"""
import os, sys, torch, torch.distributed as dist
sys.path.insert(0, {str(Path(__file__).parent)!r})
from launch import nccl_sharing_one_gpu
os.environ.update(nccl_sharing_one_gpu(int(os.environ["RANK"])))
torch.cuda.set_device(0)
dist.init_process_group("nccl")
ones = torch.ones(4, device="cuda")
dist.all_reduce(ones)
assert ones.tolist() == [2.0] * 4, ones
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def nccl_shares_the_gpu():
    """Skips the tests that need NCCL ranks sharing the GPU, with NCCL's
    error, where this NCCL cannot run them."""
    done = run_ranks(2, ["-c", PROBE], env=environment(), port=free_port(), timeout=120)
    if done.returncode != 0:
        pytest.skip("NCCL did not run two ranks on this one GPU, each claiming a host of its own: "
                    + (done.stderr or done.stdout)[-1500:])


@pytest.mark.parametrize("scenario, ranks", [
    ("train", 2), ("hybrid", 4), ("accumulate", 2), ("offload", 2), ("llama", 2), ("scalar", 4), ("into_results", 3),
    ("uncapturable", 2),
])
def test_ranks_sharing_the_gpu_over_nccl(scenario, ranks, nccl_shares_the_gpu, tmp_path):
    run(ranks, scenario, "--save", tmp_path, backend="nccl")


@pytest.mark.parametrize("saved_on, loaded_on", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_moves_between_gpu_and_cpu(saved_on, loaded_on, tmp_path):
    whole, resumed = tmp_path / "whole.pt", tmp_path / "resumed.pt"
    run(2, "checkpoint", "--steps", 4, "--save", tmp_path / "ckpt", "--save-at", 2, "--out", whole,
        device=saved_on)
    run(2, "checkpoint", "--steps", 4, "--load", tmp_path / "ckpt", "--out", resumed, device=loaded_on)
    whole, resumed = torch.load(whole), torch.load(resumed)
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(whole["losses"][2:]),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scenario", ["mixed_fsdp2", "llama_mixed_fsdp2", "mixed_by_unit", "autocast", "grad_scaler"])
def test_mixed_precision_equals_fsdp2(scenario, tmp_path):
    run(1, scenario, "--save", tmp_path)


def test_collectives_overlap_kernels(tmp_path):
    run(1, "overlap", "--save", tmp_path)


@pytest.mark.parametrize("scenario", ["die", "vanish", "stall", "die_clipping"])
def test_a_dead_or_stalled_rank_sharing_the_gpu_is_named_in_time(scenario):
    """test_failures.py's dead and stalled ranks with the step on the GPU
    (3 ranks sharing it over Gloo)."""
    from test_failures import dead_or_stalled

    dead_or_stalled(scenario, "cuda", free_port())


@pytest.mark.parametrize("scenario", ["die", "vanish", "stall", "die_clipping"])
def test_a_dead_or_stalled_rank_on_nccl_is_named_in_time(scenario, nccl_shares_the_gpu):
    """The same on NCCL (3 ranks sharing the GPU): the survivors' collectives
    hang on the GPU while their hosts wait in `loss.item()`; fsdpc's
    watchdog names the collective and the absent rank, and aborts the
    communicators, so every survivor ends in time."""
    from test_failures import dead_or_stalled

    dead_or_stalled(scenario, "cuda", free_port(), backend="nccl")

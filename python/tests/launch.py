"""Starts a CPU job's ranks directly, with the rendezvous environment torchrun
gives them, without torchrun's agent: the agent costs a Python and torch
start per job, seconds of CI each. The tests that show how users launch (the
README, the examples, the two hosts, the GPU runs) keep torchrun."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fsdpc import find_fsdp_opt

PYTHON_DIR = Path(__file__).resolve().parents[1]

# After a rank fails, the others get this long to fail in turn (fsdpc's
# failure protocol ends them itself) before they are killed, as torchrun's
# agent would.
GRACE_SECONDS = 60


def environment(**extra: str) -> dict:
    """A test job's environment: fsdpc importable, the compiler found, one
    thread per rank, and `extra`."""
    return {**os.environ, "PYTHONPATH": str(PYTHON_DIR), "FSDP_OPT": str(find_fsdp_opt()), "OMP_NUM_THREADS": "1",
            **extra}


def free_port() -> int:
    """A port nothing listens on now, for a job's rendezvous: tests that run
    in parallel workers (make test-gpu) cannot share a port rule by pid."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_environment(env: dict, rank: int, world: int, port: int) -> dict:
    """`env` with what torchrun tells rank `rank` of a one-host job."""
    return {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0"}


def nccl_sharing_one_gpu(rank: int) -> dict:
    """The environment that lets NCCL run several ranks on one GPU (it
    refuses two ranks of one host on one device): each rank claims a host of
    its own, and the ranks talk over sockets on the loopback, as hosts do."""
    return {"NCCL_HOSTID": f"fsdpc-test-rank-{rank}", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
            "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"}


def run_ranks(world: int, arguments: list, *, env: dict, port: int, timeout: float) -> subprocess.CompletedProcess:
    """Runs `python *arguments` as ranks 0..world-1 of one job on this host;
    returns the first failing rank's exit code (else 0) and every rank's
    stdout and stderr, in rank order."""
    outputs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(world)]
    ranks = [subprocess.Popen([sys.executable, *map(str, arguments)], stdout=stdout, stderr=stderr, text=True,
                              env=rank_environment(env, rank, world, port))
             for rank, (stdout, stderr) in enumerate(outputs)]
    deadline, code = time.monotonic() + timeout, 0
    try:
        while any(rank.poll() is None for rank in ranks) and time.monotonic() < deadline:
            failed = next((rank.returncode for rank in ranks if rank.returncode not in (None, 0)), 0)
            if failed and not code:
                code, deadline = failed, min(deadline, time.monotonic() + GRACE_SECONDS)
            time.sleep(0.05)
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.wait()
    code = code or next((rank.returncode for rank in ranks if rank.returncode != 0), 0)
    texts = []
    for files in outputs:
        for file in files:
            file.seek(0)
            texts.append(file.read())
            file.close()
    return subprocess.CompletedProcess(arguments, code, "".join(texts[0::2]), "".join(texts[1::2]))

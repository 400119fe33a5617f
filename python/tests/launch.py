"""Starts a CPU job's ranks directly, with the rendezvous environment torchrun
gives them, without torchrun's agent, each rank a process forked from a
server that imported torch once (forked_rank.py runs the script there): a
fresh Python spends 3 to 4 s of CPU importing torch, and CI starts about a
hundred ranks. A forked rank differs from a fresh one in what happens
before its script and after it: it shares the server's string-hash seed
and start-up variables (`read_at_start`; refused where they would differ)
and ends without an interpreter's shutdown. So the tests whose point is a
launch or an exit start fresh Pythons: the README's loop and the examples
(torchrun), the failure tests, the two hosts, the GPU runs."""

import atexit
import multiprocessing
import multiprocessing.util  # its exit handler registered before this module's
import os
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import forked_rank
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


def torchrun(ranks: int, *arguments, port: int) -> list[str]:
    """The command that runs `python *arguments` as `ranks` ranks under torchrun on this host."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", str(port),
            *map(str, arguments)]


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


class Rank:
    """A rank process forked from the fork server, its stdout and stderr in
    files."""

    def __init__(self, arguments: list, env: dict):
        server, outputs, server_env = _fork_server()
        fixed = sorted(name for name in {*env, *server_env}
                       if read_at_start(name) and env.get(name) != server_env.get(name))
        if fixed:
            raise ValueError(f"{', '.join(fixed)} take effect when a process starts or torch loads, and a forked rank "
                             f"has the fork server's: start this rank with subprocess")
        self._stdout, self._stderr = _output_file(outputs), _output_file(outputs)
        self._process = server.Process(target=forked_rank.run, args=(
            [str(a) for a in arguments], dict(env), self._stdout, self._stderr))
        self._process.start()
        _running.add(self)

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self) -> int:
        self._process.join()
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def output(self) -> tuple[str, str]:
        """stdout and stderr, once it ended."""
        self.wait()
        return Path(self._stdout).read_text(errors="replace"), Path(self._stderr).read_text(errors="replace")


# Imported once by the fork server: what every rank imports before its
# script runs (fsdpc itself is not: it reads its environment at import).
SERVER_PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint", "torch.distributed.tensor",
                  "torch.export", "torch._dynamo"]
_server = None
# Ranks started, killed at this process's exit where still running: each
# waits for this process to end before it ends itself, and multiprocessing's
# exit handler (registered before this module's) would wait for them.
_running: "weakref.WeakSet[Rank]" = weakref.WeakSet()


def read_at_start(variable: str) -> bool:
    """Whether the loader, the interpreter, or torch and the modules the
    fork server preloads read `variable` when they start, so that a rank
    asked to run with another value than the server's cannot have it."""
    return (variable in ("LD_PRELOAD", "LD_LIBRARY_PATH", "TORCH_LOGS", "TORCH_CPP_LOG_LEVEL",
                         "TORCH_COMPILE_DISABLE", "TORCH_SHOW_CPP_STACKTRACES")
            or variable.startswith("TORCHDYNAMO_") or (variable.startswith("PYTHON") and variable != "PYTHONPATH"))


def _output_file(folder: str) -> str:
    descriptor, path = tempfile.mkstemp(dir=folder)
    os.close(descriptor)
    return path


@atexit.register
def _kill_running() -> None:
    for rank in list(_running):
        if rank.poll() is None:
            rank.kill()
            rank.wait()


def _fork_server() -> tuple:
    """The fork server's context, the folder of the ranks' output files
    (removed when this process exits) and the environment the server
    starts with (this process's at the first rank)."""
    global _server
    if _server is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(SERVER_PRELOAD)
        _server = (context, tempfile.TemporaryDirectory(prefix="fsdpc-ranks-"), dict(os.environ))
    context, outputs, server_env = _server
    return context, outputs.name, server_env


def run_ranks(world: int, arguments: list, *, env: dict, port: int, timeout: float) -> subprocess.CompletedProcess:
    """Runs `python *arguments` as ranks 0..world-1 of one job on this host;
    returns the first failing rank's exit code (else 0) and every rank's
    stdout and stderr, in rank order."""
    ranks = []
    deadline, code = time.monotonic() + timeout, 0
    try:
        for rank in range(world):
            ranks.append(Rank(arguments, rank_environment(env, rank, world, port)))
        while any(rank.poll() is None for rank in ranks) and time.monotonic() < deadline:
            failed = next((rank.poll() for rank in ranks if rank.poll() not in (None, 0)), 0)
            if failed and not code:
                code, deadline = failed, min(deadline, time.monotonic() + GRACE_SECONDS)
            time.sleep(0.05)
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.wait()
    code = code or next((rank.poll() for rank in ranks if rank.poll() != 0), 0)
    outputs = [rank.output() for rank in ranks]
    return subprocess.CompletedProcess(arguments, code, "".join(out for out, _ in outputs),
                                       "".join(err for _, err in outputs))

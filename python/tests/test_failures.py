"""Failures across ranks: every rank ends, fast, with an error that names what
failed and where; no rank hangs and no process is left behind. Ranks are
started by hand (MASTER_ADDR/PORT, RANK, WORLD_SIZE) as separate processes,
without torchrun's agent, which would kill the survivors itself, each a
fresh Python (not launch.Rank's fork): how fast a rank ends includes its
interpreter's exit."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch import environment, nccl_sharing_one_gpu, rank_environment

WORKER = Path(__file__).with_name("failure_worker.py")
STEP_TIMEOUT = 5
# The dead/stalled tests run with a longer timeout so that a roll call that
# waited a second timeout (instead of reading heartbeats) would miss the bound.
LONG_STEP_TIMEOUT = 12


def start(scenario: str, world: int, victim: int, port: int, timeout: float = STEP_TIMEOUT,
          device: str = "cpu", backend: str = "gloo") -> list[subprocess.Popen]:
    ranks = []
    for rank in range(world):
        env = rank_environment(environment(STEP_TIMEOUT=str(timeout), DEVICE=device, BACKEND=backend), rank,
                               world, port)
        if backend == "nccl":
            env.update(nccl_sharing_one_gpu(rank))
        ranks.append(subprocess.Popen([sys.executable, str(WORKER), scenario, str(victim)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return ranks


def finish(ranks: list[subprocess.Popen], within: float, spare: set[int] = frozenset()) -> dict[int, tuple]:
    """Waits for every rank not in `spare` to exit within `within` seconds;
    returns {rank: (exit code, output, seconds)}; kills whatever is left."""
    began = time.monotonic()
    results = {}
    try:
        for rank, process in enumerate(ranks):
            if rank in spare:
                continue
            try:
                output, _ = process.communicate(timeout=max(0.1, within - (time.monotonic() - began)))
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
                pytest.fail(f"rank {rank} still ran {within:.0f} s after the job started:\n{output[-4000:]}")
            results[rank] = (process.returncode, output, time.monotonic() - began)
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return results


def port() -> int:
    return 29100 + os.getpid() % 150


def test_a_rank_that_cannot_set_up_its_step_stops_every_rank_with_its_reason():
    results = finish(start("arguments", 2, victim=1, port=port()), within=60)
    for rank, (code, output, _) in results.items():
        assert code != 0
        assert "checking fsdpc.shard's arguments failed on 1 of 2 ranks: rank 1: StepError: mp_policy must be" \
            in output, output[-3000:]


@pytest.mark.parametrize("scenario, says", [
    ("kinds", "rank 1 runs call 3: an accumulating (no gradient sync) step"),
    ("forward_only", "rank 1 runs call 3: a forward-only (training mode) step on (4, 64) int64"),
])
def test_ranks_that_disagree_about_a_call_stop_before_communicating(scenario, says):
    results = finish(start(scenario, 2, victim=1, port=port() + 1), within=90)
    for rank, (code, output, _) in results.items():
        assert code != 0
        assert "the ranks disagree about this call" in output and says in output, output[-3000:]
        assert "rank 0 runs call 3: a synchronizing step on (4, 64) int64" in output


def failure_times(output: str) -> tuple[float, float]:
    started = float(output.split("call 3 at ")[1].split()[0])
    failed = float(output.split("failed at ")[1].split(":")[0])
    return started, failed


def check_survivor(rank: int, code: int, output: str, timeout: float, absent: str = "[1]",
                   why: str = "") -> None:
    """A rank that outlived another's failure raised within the timeout plus
    10 s of the call's start, naming the absent rank and why."""
    assert code != 0, output[-3000:]
    started, failed = failure_times(output)
    assert failed - started <= timeout + 10, f"rank {rank} took {failed - started:.1f} s"
    assert f"rank(s) {absent} did not take part ({why}" in output, output[-3000:]


@pytest.mark.parametrize("scenario", ["die", "vanish", "stall", "die_clipping"])
def test_a_dead_or_stalled_rank_makes_the_others_raise_in_time_naming_it(scenario):
    dead_or_stalled(scenario, "cpu", port() + 2)


def dead_or_stalled(scenario: str, device: str, port: int, backend: str = "gloo") -> None:
    """3 ranks; rank 1 is killed mid-step ("die"), right after agreeing to
    a call ("vanish") or before clipping the gradients ("die_clipping"), or
    stops calling the step ("stall"); the others raise within the timeout,
    naming it and why (also on the GPU, test_gpu.py)."""
    ranks = start(scenario, 3, victim=1, port=port, timeout=LONG_STEP_TIMEOUT, device=device, backend=backend)
    results = finish(ranks, within=120, spare={1})
    killed = scenario in ("die", "vanish", "die_clipping")
    if killed:
        assert ranks[1].wait(timeout=10) == -9
    for rank in (0, 2):
        code, output, _ = results[rank]
        why = "dead or hung" if killed else "alive but stalled outside the step"
        check_survivor(rank, code, output, LONG_STEP_TIMEOUT, why=why)
        if killed:  # the collective it was in, and its group
            assert "on group '" in output, output[-3000:]
        assert f"rank {rank} second call: an earlier call failed mid-step" in output, output[-3000:]


def test_the_roll_call_tells_a_rank_that_exited_from_one_that_died():
    """Beats through a real TCPStore: rank 1 ends its process normally (its
    heartbeat stops the way atexit stops it), rank 2 beat once and froze (a
    killed process); rank 0's verdict names only rank 2 as dead."""
    import json
    from datetime import timedelta

    import torch.distributed as dist

    from fsdpc import liveness

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    address = ("127.0.0.1", store.port)
    store.set(f"{liveness.PREFIX}/2", json.dumps({"beat": 1, "calls": {"7": 3}}))
    observer, leaving = liveness.Heartbeat((address, 0, 3)), liveness.Heartbeat((address, 1, 3))
    try:
        for heartbeat in (observer, leaving):
            heartbeat.entered_call(7, 3)
        time.sleep(liveness.ROLL_CALL_SECONDS + 3 * liveness.BEAT_SECONDS)
        leaving.stop()
        time.sleep(liveness.ROLL_CALL_SECONDS + 2 * liveness.BEAT_SECONDS)  # its last beat is that old
        said = liveness.verdict(observer.history(), time.monotonic(), rank=0, world=3, module=7, call=3)
    finally:
        observer.stop()
        leaving.stop()
    assert "rank(s) [2] did not take part (dead or hung" in said, said
    assert "rank(s) [1] had exited by the roll call" in said, said

"""The communication report equals what runs: on Gloo, at 2 and 4 ranks and
for every strategy, the bytes it predicts per rank are the bytes of the
collectives the runtime issued in a real step (comm_worker.py)."""

import os
from pathlib import Path

import pytest

from launch import environment, run_ranks

WORKER = Path(__file__).with_name("comm_worker.py")


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_report_equals_the_bytes_the_runtime_sent(tmp_path, ranks):
    env = environment(FSDPC_CACHE="off")  # the report is written when fsdp-opt runs
    done = run_ranks(ranks, [WORKER, tmp_path], env=env, port=29850 + (os.getpid() + ranks) % 100, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reported = [line for line in done.stdout.splitlines() if "B per rank" in line]
    assert len(reported) == (5 if ranks == 4 else 4), done.stdout

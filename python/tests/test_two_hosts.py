"""Two hosts made of Linux network namespaces joined by a veth pair, on
addresses of our own (10.231.x.0/24): the rendezvous and Gloo cross a real
network interface. Training works across them; a rank killed on one host,
and the link dropped mid-step, end every rank in a named error, never a hang.
Skipped, with the reason, where namespaces cannot be made (not root, no
iproute2)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch import environment
from test_failures import STEP_TIMEOUT, WORKER, check_survivor, finish

SUBNET = 10 + os.getpid() % 200  # 10.231.<n>.0/24, one per test process


def ip(*arguments, namespace=None, check=True):
    command = (["ip", "netns", "exec", namespace] if namespace else []) + ["ip", *arguments]
    return subprocess.run(command, capture_output=True, text=True, check=check)


@pytest.fixture
def hosts():
    names = [f"fsdpc-{os.getpid()}-a", f"fsdpc-{os.getpid()}-b"]
    links = [f"fa{os.getpid() % 100000}", f"fb{os.getpid() % 100000}"]
    try:
        ip("netns", "add", names[0])
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"network namespaces are not available here: {error}")
    try:
        ip("netns", "add", names[1])
        ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for name, link, host in zip(names, links, (1, 2)):
            ip("link", "set", link, "netns", name)
            ip("addr", "add", f"10.231.{SUBNET}.{host}/24", "dev", link, namespace=name)
            ip("link", "set", link, "up", namespace=name)
            ip("link", "set", "lo", "up", namespace=name)
        yield [(name, link, f"10.231.{SUBNET}.{host}") for name, link, host in zip(names, links, (1, 2))]
    finally:
        for name in names:
            ip("netns", "del", name, check=False)


def start_on(host, rank: int, world: int, scenario: str, victim: int, master: str, calls: int = 5):
    name, link, _ = host
    env = environment(MASTER_ADDR=master, MASTER_PORT="29500", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                      GLOO_SOCKET_IFNAME=link, STEP_TIMEOUT=str(STEP_TIMEOUT), CALLS=str(calls))
    return subprocess.Popen(["ip", "netns", "exec", name, sys.executable, str(WORKER), scenario, str(victim)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_training_across_two_hosts_with_torchrun(hosts):
    master = hosts[0][2]
    jobs = []
    for node, host in enumerate(hosts):
        env = environment(GLOO_SOCKET_IFNAME=host[1])
        jobs.append(subprocess.Popen(
            ["ip", "netns", "exec", host[0], sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc-per-node", "1", "--node-rank", str(node), "--master-addr", master, "--master-port", "29400",
             str(WORKER), "train", "-1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = finish(jobs, within=300)
    for node, (code, output, _) in results.items():
        assert code == 0, output[-4000:]
    assert "rank 0 done" in results[0][1] and "rank 1 done" in results[1][1]


def test_a_rank_killed_on_the_other_host_is_named(hosts):
    master = hosts[0][2]
    ranks = [start_on(hosts[0], 0, 3, "die", 1, master), start_on(hosts[1], 1, 3, "die", 1, master),
             start_on(hosts[1], 2, 3, "die", 1, master)]
    results = finish(ranks, within=180, spare={1})
    for rank in (0, 2):
        code, output, _ = results[rank]
        check_survivor(rank, code, output, STEP_TIMEOUT, why="dead or hung")


def test_dropping_the_link_mid_step_ends_every_rank_in_a_named_error(hosts):
    master = hosts[0][2]
    ranks = [start_on(hosts[0], 0, 2, "train", -1, master, calls=100000),
             start_on(hosts[1], 1, 2, "train", -1, master, calls=100000)]
    deadline = time.monotonic() + 180
    seen = ""
    while "call 3 at" not in seen:  # rank 0 prints when the third call starts
        assert time.monotonic() < deadline and ranks[0].poll() is None, "the job never reached its third call"
        seen += ranks[0].stdout.readline()
    time.sleep(0.5)
    ip("link", "set", hosts[0][1], "down", namespace=hosts[0][0])
    results = finish(ranks, within=4 * STEP_TIMEOUT + 30)
    for rank, (code, output, _) in results.items():
        text = seen + output if rank == 0 else output
        assert code != 0, text[-3000:]
        assert f"rank {rank} failed at" in text, text[-3000:]
        assert "on group '" in text or "the per-call all-gather" in text, text[-3000:]

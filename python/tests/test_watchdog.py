"""fsdpc's watchdog (fsdpc/watchdog.py) on its own: which steps it lets go,
when it calls a step's timeout, and the error it raises in a blocked thread.
Steps with collectives in flight on NCCL need a GPU (test_gpu.py's dead
ranks on NCCL); here the watched steps are the runtime's own DeviceWaits
where a CPU can make them, and a stand-in with a collective that never ends
where it cannot."""

import gc
import threading
import time
import weakref

import pytest

from fsdpc.program import runtime_extension
from fsdpc.runtime import StepError
from fsdpc.watchdog import POLL_SECONDS, Watchdog, interrupt


class NeverEnds:
    """A step whose first collective never completes."""

    def first_unfinished(self):
        return ("fsdp.all_gather on group 'g' (unit @u)", "g")

    def sealed(self):
        return True


class Owner:
    """What owns watched steps (a sharded module): weakly referable."""


class Timeouts:
    def __init__(self):
        self.calls = []

    def __call__(self, owner, collective, group):
        self.calls.append((time.monotonic(), collective, group))


def settle(seconds: float = 4 * POLL_SECONDS) -> None:
    time.sleep(seconds)


def test_a_step_is_let_go_once_it_returned_and_its_collectives_completed():
    watchdog, timeouts = Watchdog(), Timeouts()
    waits = runtime_extension().DeviceWaits()
    watchdog.watch(waits, time.monotonic(), timeouts, owner=None)
    settle()
    # Past its deadline but still running, with nothing noted: the host is
    # not blocked on a collective, so there is nothing to name yet.
    assert not timeouts.calls and len(watchdog._watches) == 1
    waits.seal()
    settle()
    assert not timeouts.calls and not watchdog._watches


def test_a_watched_steps_owner_is_freed_when_dropped():
    """The watchdog holds a step's owner (the sharded module) weakly: a
    module dropped while its last step is still watched is freed at once,
    by reference counting, not at the next poll (seen on a GPU: api_train's
    check_freed_when_dropped failed before)."""
    watchdog, timeouts, module = Watchdog(), Timeouts(), Owner()
    watchdog.watch(NeverEnds(), time.monotonic() + 60, timeouts, owner=module)
    gone = weakref.ref(module)
    gc.disable()
    try:
        del module
        assert gone() is None
    finally:
        gc.enable()
    watchdog.cancel(Owner())  # another owner: the dropped one's watch stays until it ends
    assert len(watchdog._watches) == 1


def test_a_collective_unfinished_at_the_deadline_is_named_once():
    watchdog, timeouts = Watchdog(), Timeouts()
    deadline = time.monotonic() + 0.5
    watchdog.watch(NeverEnds(), deadline, timeouts, owner=None)
    settle(0.5 + 4 * POLL_SECONDS)
    assert len(timeouts.calls) == 1
    at, collective, group = timeouts.calls[0]
    assert deadline <= at <= deadline + 3 * POLL_SECONDS
    assert (collective, group) == ("fsdp.all_gather on group 'g' (unit @u)", "g")
    assert not watchdog._watches


class PollFails:
    """A step whose events cannot be polled (a sticky CUDA error after a
    communicator abort raises from every query)."""

    def first_unfinished(self):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def sealed(self):
        return True


def test_a_step_that_cannot_be_polled_is_dropped_and_the_others_still_watched(capfd):
    """The watchdog is one thread for every later step of the process: an
    error polling one step, or in a step's timeout, must not end it."""
    watchdog, timeouts = Watchdog(), Timeouts()

    def failing_timeout(owner, collective, group):
        raise RuntimeError("the roll call failed")

    watchdog.watch(PollFails(), time.monotonic(), timeouts, owner=None)
    watchdog.watch(NeverEnds(), time.monotonic(), failing_timeout, owner=None)
    settle()
    assert not watchdog._watches and not timeouts.calls
    said = capfd.readouterr().err
    assert "illegal memory access" in said and "the roll call failed" in said, said
    watchdog.watch(NeverEnds(), time.monotonic() + 0.3, timeouts, owner=None)
    settle(0.3 + 4 * POLL_SECONDS)
    assert len(timeouts.calls) == 1, "the watchdog thread died"


def test_a_cancelled_owner_is_not_called():
    watchdog, timeouts = Watchdog(), Timeouts()
    owner, other = Owner(), Owner()
    watchdog.watch(NeverEnds(), time.monotonic() + 0.3, timeouts, owner=owner)
    watchdog.watch(NeverEnds(), time.monotonic() + 0.3, timeouts, owner=other)
    watchdog.cancel(owner)
    settle(0.3 + 4 * POLL_SECONDS)
    assert len(timeouts.calls) == 1  # the other owner's step only


def test_the_error_reaches_a_thread_blocked_outside_python_once_it_returns():
    released, raised = threading.Event(), []

    def blocked():
        try:
            released.wait()  # blocks in C, as a CUDA synchronization does
            time.sleep(5)  # not reached: the error is raised first
            raised.append(None)
        except StepError as error:
            raised.append(error)

    thread = threading.Thread(target=blocked)
    thread.start()
    settle()
    interrupt(thread.ident, StepError, "rank 0: the all-gather did not complete")
    settle()
    assert thread.is_alive() and not raised  # still blocked: nothing runs until it returns
    released.set()  # what aborting the communicators does for a CUDA synchronization
    thread.join(timeout=2)
    assert not thread.is_alive()
    error = raised[0]
    assert isinstance(error, StepError) and str(error) == "rank 0: the all-gather did not complete"


@pytest.mark.parametrize("deadline_in, named", [(0.0, True), (0.4, False)])
def test_a_collective_is_named_only_if_unfinished_at_the_deadline(deadline_in, named):
    class CompletesLater:
        def __init__(self):
            self.done_at = time.monotonic() + 0.2

        def first_unfinished(self):
            return None if time.monotonic() >= self.done_at else ("fsdp.reduce_scatter on group 'g'", "g")

        def sealed(self):
            return True

    watchdog, timeouts = Watchdog(), Timeouts()
    watchdog.watch(CompletesLater(), time.monotonic() + deadline_in, timeouts, owner=None)
    settle(0.6)
    assert len(timeouts.calls) == named  # it completes 0.2 s in


IMPORT_ORDER = """
import os, sys
import torch.distributed as dist
if sys.argv[1] == "group first":
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
from fsdpc import watchdog
print(os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"], watchdog.DUMPS_OFF_BEFORE_FIRST_GROUP)
"""


@pytest.mark.parametrize("preset, order, says", [
    (None, "fsdpc first", "0 True"),           # set for the group init_process_group makes
    ("1", "fsdpc first", "1 False"),           # the job's own choice stands
    (None, "group first", "0 False"),          # too late for the job's first group: fsdpc warns
])
def test_importing_fsdpc_turns_pytorchs_dump_and_kill_off_unless_the_job_chose(preset, order, says):
    """PyTorch's NCCL monitor ends a process 8 minutes after any collective
    failed unless TORCH_NCCL_DUMP_ON_TIMEOUT=0 when the job's first group is
    made (fsdpc/watchdog.py)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TORCH_NCCL_DUMP_ON_TIMEOUT"}
    if preset is not None:
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = preset
    done = subprocess.run([sys.executable, "-c", IMPORT_ORDER, order], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == says, done.stdout

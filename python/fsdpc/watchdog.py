"""fsdpc's watchdog for the collectives no host thread waits for.

On NCCL a step's waits only order the compute stream after each collective,
so the host runs ahead and the step returns before its collectives end. If a
peer dies or stalls mid-step, the GPU waits forever and the host blocks at
its next synchronization (`loss.item()`, say) with nothing to say why. The
step notes an event per wait as it runs (the runtime's DeviceWaits); this
thread polls them, and when a collective is still unfinished at the step's
deadline it calls the step's `on_timeout` with it, which names it, aborts
the communicators (the GPU and the blocked host go on) and raises the error
in the thread that made the call (`interrupt`). Only collectives are
watched: a host that blocks on something else is not a device's hang.

ProcessGroupNCCL's own watchdog is left out of this: fsdpc creates its
device groups with TORCH_NCCL_ASYNC_ERROR_HANDLING=0, so that NCCL errors
and timeouts end here, in one named error, not in a torn-down process.

One more of PyTorch's reactions is process-wide: any NCCL group that sees a
collective fail (ours do, once aborted) raises a flag on which the monitor
thread of the job's first NCCL group (made by init_process_group) dumps its
flight recorder, sleeps 8 minutes, and ends the process; and exiting waits
for that sleep. A job whose process is to outlive fsdpc's named error, or
just exit promptly, needs TORCH_NCCL_DUMP_ON_TIMEOUT=0 when that group is
created: importing fsdpc sets it unless the job set it itself
(DUMPS_OFF_BEFORE_FIRST_GROUP says whether it came in time).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from fsdpc.device import use_in_this_thread

os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")
DUMPS_OFF_BEFORE_FIRST_GROUP = not (dist.is_available() and dist.is_initialized()) and \
    os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"].lower() in ("0", "false")

# How often unfinished steps are looked at: the deadline is kept to this,
# and a step's events are released this long after they complete.
POLL_SECONDS = 0.1


class Waits(Protocol):
    def first_unfinished(self) -> tuple[str, str] | None: ...

    def sealed(self) -> bool: ...


@dataclass(eq=False)
class _Watch:
    waits: Waits
    deadline: float  # time.monotonic()
    on_timeout: Callable[[object | None, str, str], None]
    owner: weakref.ref | None  # weak: a dropped module is freed at once, not at the next poll
    device: torch.device | None  # the events' device, made current before they are polled or dropped


class Watchdog:
    def __init__(self) -> None:
        self._watches: list[_Watch] = []
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, waits: Waits, deadline: float, on_timeout: Callable[[object | None, str, str], None],
              owner: object | None, device: torch.device | None = None) -> None:
        """Holds `waits` against `deadline` (time.monotonic()) until they are
        sealed and complete; past the deadline with a collective noted and
        unfinished, calls `on_timeout(owner, collective, group key)` on this
        watchdog's thread, once. `owner` is held weakly and handed to
        `on_timeout` then, which therefore need not hold it: a module its
        user drops is freed at once, by reference counting, not when this
        thread next looks, and its steps time out silently. `device`: the
        events' device, made current in this thread before it touches them."""
        with self._changed:
            owner_ref = weakref.ref(owner) if owner is not None else None
            self._watches.append(_Watch(waits, deadline, on_timeout, owner_ref, device))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fsdpc-watchdog", daemon=True)
                self._thread.start()
            self._changed.notify()

    def cancel(self, owner: object) -> None:
        """Forgets every step of `owner` (it failed another way)."""
        with self._changed:
            self._watches = [watch for watch in self._watches
                             if watch.owner is None or watch.owner() is not owner]

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._watches:
                    self._changed.wait()
                watches = list(self._watches)
            now = time.monotonic()
            for watch in watches:
                try:
                    self._check(watch, now)
                except Exception as error:  # this thread watches every later step too: it must not die
                    with self._changed:
                        if watch in self._watches:
                            self._watches.remove(watch)
                    print(f"fsdpc: the collective watchdog dropped a step it could not check: "
                          f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
            time.sleep(POLL_SECONDS)

    def _check(self, watch: _Watch, now: float) -> None:
        use_in_this_thread(watch.device)
        sealed = watch.waits.sealed()  # before the poll: nothing is noted after a seal
        unfinished = watch.waits.first_unfinished()
        if (unfinished is None and not sealed) or (unfinished is not None and now < watch.deadline):
            return
        with self._changed:
            if watch not in self._watches:
                return  # cancelled meanwhile
            self._watches.remove(watch)
        owner = watch.owner() if watch.owner is not None else None
        if unfinished is not None and (owner is not None or watch.owner is None):
            watch.on_timeout(owner, *unfinished)


WATCHDOG = Watchdog()


def interrupt(thread_id: int, error_type: type[BaseException], message: str) -> None:
    """Raises `error_type(message)` in the thread `thread_id` as soon as it
    runs Python again (a thread blocked in a CUDA synchronization does once
    the communicators are aborted)."""
    # The interpreter instantiates the type it is given without arguments.
    raised = type(error_type.__name__, (error_type,),
                  {"__init__": lambda self, *args: error_type.__init__(self, *(args or (message,))),
                   "__module__": error_type.__module__, "__qualname__": error_type.__qualname__})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(raised))

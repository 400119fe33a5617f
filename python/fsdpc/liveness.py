"""Who is alive, and where, when a collective fails.

Every rank's process beats into the job's rendezvous store twice a second
from a daemon thread (a counter and, per sharded module, how many calls it
has entered) and reads every rank's beat back, keeping the last seconds of
what it saw. After a failed collective the roll call waits
`ROLL_CALL_SECONDS` and compares the newest beats with those of that long
before: a rank whose counter did not move is dead (or hung hard); one whose
count for the module is below the failed call never entered it (stalled
outside the step); the others took part. The roll call so takes a fixed few
seconds, independent of the step's timeout: a live rank still blocked in a
collective is told apart by its beat, without waiting for its own timeout.
Because the history is kept locally, the verdict stands when the store's
host (rank 0's process) exits or the network drops before the roll call
ends: it is what was seen until then. A process that ends normally beats a
last time saying so, so that a rank which reported its own failure and
exited is not taken for dead by a slower survivor's roll call.
"""

import atexit
import collections
import json
import threading
import time
from datetime import timedelta

import torch.distributed as dist

BEAT_SECONDS = 0.5
ROLL_CALL_SECONDS = 2.5
STORE_TIMEOUT = timedelta(seconds=2)
LOST_AFTER_FAILURES = 4
PREFIX = "fsdpc/beat"


def _job_store_address() -> tuple[str, int] | None:
    """Host and port of the job's TCPStore, or None for another kind of store."""
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if not isinstance(store, dist.TCPStore):
        return None
    return store.host, store.port


class Heartbeat:
    """This process's beat and its record of everyone's; one per process."""

    def __init__(self, job: tuple[tuple[str, int], int, int]):
        self.job = job  # (store host and port, rank, world): which job it beats for
        _, rank, world = job
        self._keys = [f"{PREFIX}/{other}" for other in range(world)]
        self._key = self._keys[rank]
        self._calls: dict[int, int] = {}
        self._lock = threading.Lock()
        # (monotonic time, {rank: beat}) for enough beats to span a roll call.
        self._seen: collections.deque = collections.deque(
            maxlen=int((ROLL_CALL_SECONDS + 3 * BEAT_SECONDS) / BEAT_SECONDS) + 2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fsdpc-heartbeat", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def entered_call(self, module: int, call: int) -> None:
        with self._lock:
            self._calls[module] = call

    def stop(self) -> None:
        self._stop.set()
        # One beat's store operations, each bounded by the store timeout.
        self._thread.join(timeout=4 * STORE_TIMEOUT.total_seconds())

    def history(self) -> list[tuple[float, dict[int, dict]]]:
        with self._lock:
            return list(self._seen)

    def _beat(self, beat: int, ended: bool = False) -> str:
        with self._lock:
            return json.dumps({"beat": beat, "calls": self._calls, "ended": ended})

    def _run(self) -> None:
        store, beat, failures = None, 0, 0
        # A job's store does not come back once its host has gone: stop
        # beating then instead of retrying (and logging) forever.
        while not self._stop.is_set() and failures < LOST_AFTER_FAILURES:
            beat += 1
            value = self._beat(beat)
            try:
                # A client of its own: over a lost link the job's client
                # would block for the job's timeout.
                store = store or dist.TCPStore(*self.job[0], is_master=False, timeout=STORE_TIMEOUT)
                store.set(self._key, value)
                seen = _read_beats(store, self._keys)
                with self._lock:
                    self._seen.append((time.monotonic(), seen))
                failures = 0
            except Exception:  # the store's host is gone or unreachable: try again next beat
                store, failures = None, failures + 1
            self._stop.wait(BEAT_SECONDS)
        if store is not None:
            try:
                store.set(self._key, self._beat(beat + 1, ended=True))
            except Exception:  # the store went first: the survivors' verdict is what they saw
                pass


def _read_beats(store: dist.TCPStore, keys: list[str]) -> dict[int, dict]:
    if store.check(keys):  # one round trip once every rank has beaten
        return {index: json.loads(value) for index, value in enumerate(store.multi_get(keys))}
    return {index: json.loads(store.get(key)) for index, key in enumerate(keys) if store.check([key])}


_heartbeat: Heartbeat | None = None


def start_heartbeat() -> Heartbeat | None:
    """The process's heartbeat, started on first use; None where the job's
    store is not a TCPStore (no roll call is possible then)."""
    global _heartbeat
    job = (_job_store_address(), dist.get_rank(), dist.get_world_size())
    if _heartbeat is not None and _heartbeat.job != job:
        _heartbeat.stop()  # a new job in this process
        _heartbeat = None
    if _heartbeat is None and job[0] is not None:
        _heartbeat = Heartbeat(job)
    return _heartbeat


def roll_call(module: int, call: int) -> str:
    """After call `call` of module `module` failed on this rank: which other
    ranks did not take part and why, as text for the error ("" if all did)."""
    if _heartbeat is None:
        return "; no roll call: the job's rendezvous store is not a TCPStore"
    time.sleep(ROLL_CALL_SECONDS + BEAT_SECONDS)
    return verdict(_heartbeat.history(), time.monotonic(), dist.get_rank(), dist.get_world_size(), module, call)


def verdict(history: list[tuple[float, dict[int, dict]]], now: float, rank: int, world: int,
            module: int, call: int) -> str:
    """The roll call's text from the beats `rank` saw (`history`, oldest first)."""
    if not history:
        return "; no roll call: the rendezvous store could not be reached"
    latest_at, latest = history[-1]
    earlier = [beats for at, beats in history if at <= latest_at - ROLL_CALL_SECONDS]
    said = ""
    if now - latest_at > 3 * BEAT_SECONDS:
        said += (f"; the rendezvous store has been unreachable for {now - latest_at:.1f} s (its host, rank 0's "
                 "process, ended, or the network is down)")
    if not earlier:
        return said + "; no roll call: too few heartbeats were seen before the store was lost"
    dead, stalled, ended = [], [], []
    for other in range(world):
        if other == rank:
            continue
        before, last = earlier[-1].get(other), latest.get(other)
        if last is not None and last.get("ended"):
            ended.append(other)
        elif last is None or before is None or last["beat"] == before["beat"]:
            dead.append(other)
        elif last["calls"].get(str(module), 0) < call:
            stalled.append((other, last["calls"].get(str(module), 0)))
    if dead:
        said += (f"; rank(s) {dead} did not take part (dead or hung: no heartbeat for "
                 f"{ROLL_CALL_SECONDS:g} s)")
    if stalled:
        said += (f"; rank(s) {[other for other, _ in stalled]} did not take part (alive but stalled outside "
                 f"the step: last entered call(s) {[last for _, last in stalled]}, this was call {call})")
    if ended:
        said += f"; rank(s) {ended} had exited by the roll call (their processes ended; not hung)"
    return said

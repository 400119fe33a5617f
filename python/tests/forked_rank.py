"""A test job's rank, run in a process that launch.py's fork server forks
(torch already imported there) as `python script args...` would run it.
Only the standard library is imported at the top (torch is already in the
server): fsdpc and the script import themselves after the rank's
environment is in place, as they would at a fresh start."""

import atexit
import ctypes
import multiprocessing
import os
import runpy
import select
import signal
import sys
import threading
import time
import traceback


def end_with(requester: int) -> None:
    """Kills this rank when the test process that started it ends: one
    killed by ctest's timeout must not leave ranks blocked in a collective
    behind (the fork server outlives it while its ranks run)."""
    try:
        ended = os.pidfd_open(requester)
    except ProcessLookupError:
        os._exit(1)
    except OSError:  # no pidfds here: asked once a second instead
        ended = None

    def watch() -> None:
        if ended is not None:
            select.select([ended], [], [])
        else:
            while os.path.exists(f"/proc/{requester}"):
                time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="fsdpc-test-requester", daemon=True).start()


def fresh_search_path(arguments: list[str], env: dict) -> list[str]:
    """`sys.path` as `python *arguments` would start with: the script's
    folder (or "" for -c), PYTHONPATH, then the installation's own entries,
    without what the test process added."""
    search = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    own = [entry for entry in sys.path if entry.startswith(installed)]
    return ["" if arguments[0] == "-c" else os.path.dirname(os.path.abspath(arguments[0])), *search, *own]


def run(arguments: list[str], env: dict, stdout_path: str, stderr_path: str) -> None:
    """Runs `arguments` (a script and its arguments, or "-c" and code) with
    exactly `env` as the environment, stdout and stderr appended to the two
    files (one file for both where the paths are equal), and exits with its
    exit code."""
    end_with(multiprocessing.parent_process().pid)
    for path, fd in ((stdout_path, 1), (stderr_path, 2)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:] = fresh_search_path(arguments, env)
    # multiprocessing made this process's default start method the fork server's; a fresh one has none set.
    multiprocessing.set_start_method(None, force=True)
    import torch

    if torch.cuda.is_initialized():
        raise RuntimeError("the fork server initialized CUDA, which a forked process cannot use: a module it "
                           "preloads (launch.SERVER_PRELOAD) touched the GPU")
    # The server's OpenMP read its thread count when torch loaded, before this rank's environment existed.
    if "OMP_NUM_THREADS" in env:
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    code = 0
    try:
        if arguments[0] == "-c":
            sys.argv = ["-c", *arguments[2:]]
            exec(compile(arguments[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(arguments)
            runpy.run_path(arguments[0], run_name="__main__")
    except SystemExit as exit:
        if isinstance(exit.code, int) or exit.code is None:
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # What an interpreter's exit does that a test reads, which the fork server's child skips: join the script's
    # threads, run its exit handlers, flush. Not the rest (modules torn down, C++ static destructors): tests of how
    # a process ends start fresh Pythons (test_failures.py, the README's loop and the examples under torchrun).
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # what C and C++ code printed
    os._exit(code)

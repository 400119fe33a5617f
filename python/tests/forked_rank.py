"""A test job's rank, run in a process that launch.py's fork server forks
(torch already imported there) as `python script args...` would run it.
Only the standard library is imported here: fsdpc and the script import
themselves after the rank's environment is in place, as they would at a
fresh start."""

import atexit
import multiprocessing
import os
import runpy
import select
import signal
import sys
import threading
import traceback


def end_with(requester: int) -> None:
    """Kills this rank when the test process that started it ends: one
    killed by ctest's timeout must not leave ranks blocked in a collective
    behind (the fork server outlives it while its ranks run)."""
    try:
        ended = os.pidfd_open(requester)
    except ProcessLookupError:
        os._exit(1)

    def watch() -> None:
        select.select([ended], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="fsdpc-test-requester", daemon=True).start()


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
    search = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:0] = [os.path.dirname(os.path.abspath(arguments[0])) if arguments[0] != "-c" else "", *search]
    # The server's OpenMP read its thread count when torch loaded, before this rank's environment existed.
    if "OMP_NUM_THREADS" in env:
        import torch

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
    # What an interpreter's exit does, which the fork server's child skips: join the script's threads, run its
    # exit handlers, flush.
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""The processes a local run starts (the softswitch, the workers), and their end: however
the run ends, none of them outlives it.

* Each child runs in a process group of its own, so that `close()` ends it together with
  anything it started, and a Ctrl-C at the terminal reaches the run alone, which then ends
  its children in order instead of each child dying mid-write on its own.
* `close()` (a context manager's exit) asks every group still there to stop (SIGTERM),
  waits up to `grace` seconds, then kills what is left (SIGKILL).
* `signals_end_the_run()` turns SIGTERM and SIGHUP into SystemExit, so that the `with` and
  `finally` blocks of the run unwind as they do for Ctrl-C (KeyboardInterrupt), and raises
  either only where the main thread runs the run's own code, never inside grpc or a lock.
* A SIGKILL of the run runs none of that: each child is started through
  die_with_parent.py, which has the kernel kill it when the run ends. (Not what the child
  itself started: the softswitch and the workers start nothing.)

The kernel ties PR_SET_PDEATHSIG to the thread that started the child: start children from
the thread that lives as long as the run (the main thread).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

GUARD = Path(__file__).with_name("die_with_parent.py")


class Children:
    """Child processes that end with this process (see the module)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Popen(argv, **popen), in a new process group, guarded; argv[0] is a path."""
        guarded = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), *argv]
        proc = subprocess.Popen(guarded, process_group=0, **popen)
        self.procs.append(proc)
        return proc

    def close(self, grace: float = 10.0) -> None:
        """End every child still running: SIGTERM to its group, SIGKILL after `grace`."""
        live = [p for p in self.procs if p.poll() is None]
        for proc in live:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        # The group too: what a child started may outlive it. Only the groups of children
        # that were running here: the id of a group long gone may name another one now.
        for proc in live:
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def __enter__(self) -> Children:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(grace=10.0 if exc_type is None else 2.0)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the child leads its group: the group's id is its pid


# Code that an exception raised from a signal handler must not unwind through: grpc's
# channel and threading's Condition hold a lock across their waits, and an exception raised
# mid-wait leaves it held (the next caller hangs) or released twice ("cannot release
# un-acquired lock").
_GRPC = os.sep + "grpc" + os.sep
_RETRY_S = 0.05  # how soon a deferred signal is looked at again


def _inside_uninterruptible(frame: FrameType | None) -> bool:
    while frame is not None:
        code = frame.f_code
        if _GRPC in code.co_filename or (code.co_filename == threading.__file__ and
                                         code.co_qualname.startswith("Condition.")):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def signals_end_the_run() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise SystemExit(128 + signal) and SIGINT raises
    KeyboardInterrupt in the main thread, so that clean-up runs as for Ctrl-C; the previous
    handlers are restored after.

    The exception is raised where the main thread runs the run's own code: a signal that
    arrives inside grpc or a threading Condition is deferred (SIGALRM looks again every
    50 ms) until the call returns; grpc waits in short slices, so that is soon. The first
    signal decides the exit status; later ones change nothing (the run is already ending).
    """
    received: list[int] = []
    raised = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if signum != signal.SIGALRM and not received:
            received.append(signum)
        if raised or not received:
            return
        if _inside_uninterruptible(frame):
            signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
            return
        raised = True
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + received[0])

    watched = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGALRM)
    previous = {sig: signal.signal(sig, stop) for sig in watched}
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["Children", "signals_end_the_run"]

"""The processes a local run starts (the softswitch, the workers), and their end: however
the run ends, none of them outlives it.

* Each child runs in a process group of its own, so that `close()` ends it together with
  anything it started, and a Ctrl-C at the terminal reaches the run alone, which then ends
  its children in order instead of each child dying mid-write on its own.
* `close()` (a context manager's exit) asks every group still there to stop (SIGTERM),
  waits up to `grace` seconds, then kills what is left (SIGKILL).
* `signals_end_the_run()` turns SIGTERM and SIGHUP into SystemExit, so that the `with` and
  `finally` blocks of the run unwind as they do for Ctrl-C (KeyboardInterrupt).
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
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
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


@contextlib.contextmanager
def signals_end_the_run() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit(128 + signal) in the main thread while inside,
    so that clean-up runs as for Ctrl-C; the previous handlers are restored after."""
    received: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        received.append(signum)
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except Exception as err:
        # Raised inside library code (a threading.Condition's `with` in grpc), the SystemExit
        # can come out as another error ("cannot release un-acquired lock"): the signal still
        # decides how the run ends.
        if received:
            raise SystemExit(128 + received[0]) from err
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["Children", "signals_end_the_run"]

"""Run a command that dies with the process that started it: the guard of the demo's
children (hysync.topologies.children), so that even a SIGKILL of the demo, which runs none
of its clean-up, leaves no switch or worker behind.

    python -I -S die_with_parent.py PARENT_PID COMMAND [ARG ...]

It asks the kernel for SIGKILL when its parent ends (prctl PR_SET_PDEATHSIG, which lasts
across exec), checks that PARENT_PID is still its parent (it may have ended before the
request), then becomes COMMAND by exec: same process id, same pipes. It is run as a file,
with no site packages, so that it imports nothing of HySync and starts in milliseconds.
Linux only (prctl); elsewhere it runs COMMAND unguarded.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def main() -> None:
    parent, command = int(sys.argv[1]), sys.argv[2:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            sys.exit(f"die_with_parent: prctl: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:  # the parent ended before the request: end now
        sys.exit(1)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()

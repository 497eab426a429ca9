"""`python -m hysync.softswitch.reflect`: the zero-work servers the benches measure against.

    python -m hysync.softswitch.reflect [--udp HOST:PORT] [--threads N] [--answer echo|result]

Answers every datagram in batches (recvmmsg, then sendmmsg), on N SO_REUSEPORT
sockets with a thread each, as the native softswitch uses
(native/dataplane/reflector.cc). Two answers:

* echo (default): the datagram itself — the machine's UDP limit, which no switch on
  it can beat; the benches read the softswitch's rate as a share of it;
* result: each contribution as its own result (RESULT, count 1, the sender's bit; a
  repeated sequence number an ACK) — a switch that does no work, against which one
  worker reaches its own limit (bench/worker_bench.py).

Prints where it listens; SIGINT or SIGTERM stops it and prints how many datagrams
it answered. Bad arguments: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import NoReturn

from hysync import _core
from hysync.softswitch.__main__ import host_port, thread_count
from hysync.softswitch.native import default_threads

PROG = "python -m hysync.softswitch.reflect"
ANSWERS = {"echo": _core.dataplane.Answer.ECHO, "result": _core.dataplane.Answer.AS_RESULT}


def _fail(message: str) -> NoReturn:
    print(f"reflector: error: {message} (see {PROG} --help)", file=sys.stderr)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _fail(message)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--udp", type=host_port, default=("127.0.0.1", 0), metavar="HOST:PORT",
                        help="address to answer on (default 127.0.0.1 and any free port)")
    parser.add_argument("--threads", type=thread_count, default=default_threads(),
                        metavar="N", help="threads, one SO_REUSEPORT socket each "
                        "(default: one per core, at most 8)")
    parser.add_argument("--answer", choices=ANSWERS, default="echo",
                        help="echo: the datagram itself (default); result: each contribution "
                        "as its own result")
    args = parser.parse_args(argv)
    try:
        reflector = _core.dataplane.Reflector(*args.udp, args.threads, ANSWERS[args.answer])
    except OSError as err:
        _fail(err.strerror or str(err))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    reflector.start()
    print(f"reflector: UDP {args.udp[0]}:{reflector.port}, {args.threads} threads, "
          f"answer {args.answer}", flush=True)
    while not stop.wait(0.5):
        pass
    reflector.stop()
    print(f"reflector: answered {reflector.packets_out} of {reflector.packets_in} datagrams",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The sender process of the frame benches, run in a host namespace of
`hysync.controlplane.testbed.netns.NetnsStar`:

    ip netns exec hb<pid>-h1 .venv/bin/python -m bench.netns_hosts --worker 0 ...

runs `bench.senders.sender_main` bound to the host's address: it prints `ready` when its
socket is bound, starts on a line on stdin, and prints its result as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

from hysync.controlplane.testbed.addresses import SWITCH_IP


# ------------------------------------------------------------------ sender process
class _StdinStart:
    """The `start` event of sender_main: say ready, then wait for a line on stdin."""

    def wait(self) -> None:
        print("ready", flush=True)
        sys.stdin.readline()


class _StdoutOut:
    def __init__(self, tally: dict[str, int]) -> None:
        self.tally = tally

    def put(self, item: tuple[int, dict]) -> None:
        sent, _ = item
        print(json.dumps({"sent": sent, **self.tally}), flush=True)


def main(argv: list[str] | None = None) -> None:
    from bench.senders import sender_main

    parser = argparse.ArgumentParser(description="one windowed sender, bound to a host address")
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--job", type=int, default=1)
    parser.add_argument("--bind", required=True, help="this host's address")
    parser.add_argument("--switch", default=SWITCH_IP, help="the switch's address")
    parser.add_argument("--port", type=int, required=True, help="the switch's UDP port")
    parser.add_argument("--slots", type=int, nargs=2, metavar=("BASE", "COUNT"), required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    tally: dict[str, int] = {}
    sender_main(args.worker, args.job, args.port, tuple(args.slots), args.seconds, _StdinStart(),
                _StdoutOut(tally), bind=args.bind, switch_host=args.switch, tally=tally)


if __name__ == "__main__":
    main()

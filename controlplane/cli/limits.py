"""The ranges of `hysync`'s numeric options and addresses, checked where argparse parses
them: a value out of range is one line and exit status 2 before anything is sent, instead of
a traceback from deep inside protobuf or the socket layer.

Each function is an argparse `type=`: it returns the value or raises ArgumentTypeError with
what is wrong and the range to use.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from hysync import wire
from hysync.controlplane.testbed.serve_access import parse_listen

# Timeouts, intervals and durations: Python's waits overflow somewhere past 2^63 ns, and
# no deadline of a control-plane request needs more than this.
MAX_SECONDS = 30 * 24 * 3600.0
MAX_UINT64 = (1 << 64) - 1  # P4Runtime's device_id


def ranged(kind: type[int] | type[float], low: float, high: float,
           what: str) -> Callable[[str], int | float]:
    """An argparse type: a `kind` number in low..high (finite), named `what` when refused."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{what} {text!r} must be {'a whole number' if kind is int else 'a number'} "
                f"{low:g}..{high:g}")
        return value
    return parse


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_SECONDS:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number of seconds > 0 and at most {MAX_SECONDS:.0f} "
            "(30 days)")
    return value



def count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(text)


def device_id(text: str) -> int:
    """--device-id: P4Runtime's uint64."""
    if not text.strip().isdigit() or int(text) > MAX_UINT64:
        raise argparse.ArgumentTypeError(
            f"device id {text!r} must be a whole number 0..{MAX_UINT64} (P4Runtime's uint64)")
    return int(text)


def quorum(text: str) -> int:
    """--quorum: contributions that close a partial round, at most a job's members."""
    if not text.strip().isdigit() or not 1 <= int(text) <= wire.MAX_WORKERS:
        raise argparse.ArgumentTypeError(
            f"quorum {text!r} must be a whole number 1..{wire.MAX_WORKERS} (at most the job's "
            "active members)")
    return int(text)


def serve_address(text: str) -> str:
    """--serve (or $HYSYNC_SERVE): HOST:PORT or unix:PATH, kept as written."""
    try:
        kind, where = parse_listen(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--serve (or $HYSYNC_SERVE): {err}") from None
    if kind == "tcp" and where[1] == 0:
        raise argparse.ArgumentTypeError(
            f"--serve {text!r}: port 0 is no address to connect to; give the port `hysync "
            "serve` listens on, e.g. 127.0.0.1:9600")
    return text


__all__ = ["MAX_SECONDS", "MAX_UINT64", "count", "device_id", "quorum", "ranged", "seconds",
           "serve_address"]

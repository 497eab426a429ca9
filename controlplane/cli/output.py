"""What every `hysync` command shares: its output (text, or one JSON object per line
with --json), the errors that choose its exit status, and the report of a mode write
that waited for the slots to latch it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TextIO

from hysync.errors import HySyncError


class UsageError(Exception):
    """A command line that cannot be carried out as written (exit 2)."""


class NotLatchedError(HySyncError):
    """`mode set --wait`: the write landed, the range did not latch in time (exit 3)."""



class Output:
    """Where a command prints: its text, or with --json the same facts as JSON."""

    def __init__(self, as_json: bool, stream: TextIO) -> None:
        self.as_json = as_json
        self.stream = stream

    def emit(self, data: object, text: str) -> None:
        print(json.dumps(data, sort_keys=True) if self.as_json else text, file=self.stream,
              flush=True)


Handler = Callable[[argparse.Namespace, Output], None]


def emit_latch(out: Output, data: dict[str, object], text: str, args: argparse.Namespace,
               latched: float | None, pending: Exception | None) -> None:
    """The write's report with what --wait saw; a write not latched in time exits 3."""
    if latched is not None:
        text += f"; latched after {latched:.3f} s"
    elif pending is not None:
        text += f"; written, not latched within {args.wait:g} s"
    out.emit(dict(data, latched_after=latched,
                  latched=None if args.wait is None else pending is None), text)
    if pending is not None:
        raise NotLatchedError(f"the mode is written on the switch; {pending}")

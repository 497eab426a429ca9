"""What `hysync serve` accepts on its socket: one bounded line, parsed and checked.

Every request passes here before it reaches the serve's state, so that a handler sees
only values of the types and ranges it expects. Whatever a client sends - bytes that are
not UTF-8, JSON that is not an object, numbers too long for an integer or not finite,
lists of the wrong length, JSON nested deeper than a request ever is, a line longer than
`MAX_LINE` - is refused with one `ServeError` sentence naming the field and what it
may be. The handler answers that sentence as `{"ok": false, "error": ...}` and the
connection carries on.

    request = parse(line)      # a dict, or ServeError
    op, args = check(request)  # the op's fields with defaults filled in, or ServeError
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, BinaryIO

from hysync import wire
from hysync.controlplane.policy.policies import POLICIES
from hysync.controlplane.serve.client import ServeError

# A request is a few hundred bytes (an admit of 32 members ~3 KiB; a job file's table a
# little more): 64 KiB leaves room and bounds what one line can make the serve hold.
MAX_LINE = 64 * 1024
# The deepest request (job_add's job table: {job: {members: [{...}]}}) nests 4 levels.
MAX_DEPTH = 16
# Beyond a 64-bit id no field has a meaning; Python would otherwise parse 4,300 digits.
MAX_INT_DIGITS = 20
MAX_TEXT = 256  # names, hosts, modes, tokens
MODES = tuple(m.name.lower() for m in wire.Mode)


# ------------------------------------------------------------------ the line
def read_line(rfile: BinaryIO) -> bytes | None:
    """The next request line (with its newline), None at end of stream. A line longer
    than MAX_LINE is read in MAX_LINE pieces and thrown away up to its newline (memory
    stays bounded whatever a client sends), then ServeError; the next line is read
    normally. `LineTooLong.at_end` says whether the stream ended inside the long line."""
    line = rfile.readline(MAX_LINE + 1)
    if len(line) <= MAX_LINE or line.endswith(b"\n"):
        return line or None
    raise LineTooLong(rfile)


class LineTooLong(ServeError):
    """A request line over MAX_LINE bytes; `skip()` discards the rest of it."""

    def __init__(self, rfile: BinaryIO) -> None:
        super().__init__(f"request line longer than {MAX_LINE} bytes: a request is one JSON "
                         "object of at most 64 KiB ending in a newline")
        self._rfile = rfile

    def skip(self) -> bool:
        """Read up to the end of the long line; False if the stream ended first."""
        while True:
            chunk = self._rfile.readline(MAX_LINE)
            if not chunk:
                return False
            if chunk.endswith(b"\n"):
                return True


# A string (an unterminated one runs to the end of the line: a match never fails, so the
# scan is linear whatever the quotes and backslashes) or a bracket.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


def _depth(line: bytes) -> int:
    """How deep the line's arrays and objects nest (brackets inside strings don't count),
    computed without recursion so that any nesting is measured before json parses it."""
    depth = deepest = 0
    for token in _TOKENS.findall(line):
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ServeError(f"a number of {len(text.lstrip('-'))} digits: no field takes more "
                         f"than {MAX_INT_DIGITS}")
    return int(text)


def _parse_constant(text: str) -> float:
    raise ServeError(f"{text} is not a number a request may hold: send finite numbers")


def parse(line: bytes) -> dict[str, Any]:
    """One request line -> its JSON object; ServeError naming what is wrong."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ServeError(f"byte {err.start} of the request is not UTF-8: send one JSON "
                         "object per line") from None
    if _depth(line) > MAX_DEPTH:
        raise ServeError(f"the request nests deeper than {MAX_DEPTH} levels: a request is "
                         "a flat JSON object")
    try:
        value = json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant)
    except json.JSONDecodeError as err:
        raise ServeError(f"not JSON ({err.msg} at column {err.colno}): send one JSON object "
                         "per line, e.g. {\"op\": \"status\"}") from None
    except RecursionError:  # a bracket the depth scan mistook for a string's: still refused
        raise ServeError(f"the request nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise ServeError(f"a request is a JSON object, not {_kind(value)}: e.g. "
                         "{\"op\": \"status\"}")
    return value


# ------------------------------------------------------------------ fields
Check = Callable[[str, Any], Any]  # (field name, value) -> the value to use, or ServeError


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(value),
                                                                        type(value).__name__)


def _shown(value: object) -> str:
    text = (repr(value) if isinstance(value, str) else _kind(value)
            if isinstance(value, dict | list) else json.dumps(value))
    return text if len(text) <= 40 else text[:37] + "..."


def integer(lo: int, hi: int) -> Check:
    def check(name: str, value: Any) -> int:
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            value = int(value)  # 3.0 is 3; json writers differ
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ServeError(f"{name} = {_shown(value)}: give an integer {lo}..{hi}")
        return value
    return check


def text(choices: tuple[str, ...] | None = None, *, empty: bool = True) -> Check:
    def check(name: str, value: Any) -> str:
        ok = isinstance(value, str) and len(value) <= MAX_TEXT and (empty or value)
        if not ok or (choices is not None and value not in choices):
            want = f"one of {', '.join(choices)}" if choices else \
                f"a string of at most {MAX_TEXT} characters"
            raise ServeError(f"{name} = {_shown(value)}: give {want}")
        return value
    return check


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ServeError(f"{name} = {_shown(value)}: give true or false")
    return value


def optional(inner: Check) -> Check:
    def check(name: str, value: Any) -> Any:
        return None if value is None else inner(name, value)
    return check


def items(inner: Check, *, least: int, most: int, what: str) -> Check:
    def check(name: str, value: Any) -> list[Any]:
        if not isinstance(value, list) or not least <= len(value) <= most:
            count = f"{least}" if least == most else f"{least} to {most}"
            raise ServeError(f"{name} = {_shown(value)}: give a list of {count} {what}")
        return [inner(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return check


def record(fields: dict[str, tuple[Check, bool]], example: str) -> Check:
    """An object with these fields ((check, required)); unknown ones are refused."""
    def check(name: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ServeError(f"{name} = {_shown(value)}: give an object {example}")
        return _fields(name, value, fields)
    return check


def _fields(where: str, data: dict[str, Any],
            fields: dict[str, tuple[Check, bool]]) -> dict[str, Any]:
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ServeError(f"{where} has no field {_shown(unknown[0])[:40]}: its fields are "
                         f"{', '.join(fields) or 'none'}")
    out: dict[str, Any] = {}
    for key, (check, required) in fields.items():
        if key not in data:
            if required:
                raise ServeError(f"{where} needs {key}")
            out[key] = None
            continue
        out[key] = check(key if where.startswith("op ") else f"{where}.{key}", data[key])
    return out


def table(name: str, value: Any) -> dict[str, Any]:
    """A job file's table (JobConfig.from_dict checks its fields)."""
    if not isinstance(value, dict):
        raise ServeError(f"{name} = {_shown(value)}: give the job file's table as an object")
    return value


JOB = integer(1, wire.MAX_JOBS - 1)
WORKER = integer(0, wire.MAX_WORKERS - 1)
UDP_PORT = integer(1, 65535)
SLOT = integer(0, wire.NUM_SLOTS - 1)
QUORUM = integer(1, wire.MAX_WORKERS)
# A member speaks for the ranks of its host: one GPU server's, 64 at most.
MAX_RANKS_PER_MEMBER = 64
RANK = integer(0, 2**31 - 1)
MEMBER = record({"worker": (WORKER, True), "host": (text(empty=False), True),
                 "udp_port": (UDP_PORT, True), "avg_udp_port": (optional(UDP_PORT), False),
                 "ranks": (optional(items(RANK, least=1, most=MAX_RANKS_PER_MEMBER,
                                          what="ranks of the job")), False)},
                "{worker, host, udp_port[, avg_udp_port][, ranks]}")

# op -> its fields ((check, required)). `op` itself and nothing else is implied.
OPS: dict[str, dict[str, tuple[Check, bool]]] = {
    "hello": {"token": (optional(text()), False), "operator": (optional(boolean), False)},
    "status": {},
    "admit": {"members": (items(MEMBER, least=1, most=wire.MAX_WORKERS,
                                what="members {worker, host, udp_port}"), True),
              "mode": (optional(text(MODES)), False), "quorum": (optional(QUORUM), False),
              "name": (optional(text()), False),
              "policy": (optional(text((*POLICIES, "none"))), False)},
    "claim": {"jobs": (items(JOB, least=1, most=wire.MAX_JOBS - 1, what="job ids"), True),
              "key": (optional(text()), False)},
    "release": {},
    "leave": {"job": (JOB, True), "worker": (WORKER, True), "key": (optional(text()), False)},
    "mode_set": {"job": (JOB, True), "mode": (text(MODES), True),
                 "slots": (optional(items(SLOT, least=2, most=2, what="slots [first, last]")),
                           False),
                 "quorum": (optional(QUORUM), False), "key": (optional(text()), False),
                 "level": (optional(text(empty=False)), False)},
    "policy_resume": {"job": (JOB, True), "key": (optional(text()), False)},
    "exclude": {"job": (JOB, True), "worker": (WORKER, True), "key": (optional(text()), False)},
    "readmit": {"job": (JOB, True), "worker": (WORKER, True), "key": (optional(text()), False)},
    "job_add": {"job": (table, True), "replace": (optional(boolean), False)},
    "job_remove": {"job": (JOB, True), "key": (optional(text()), False)},
}


def check(request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(op, its fields) of a parsed request; absent optional fields are None."""
    op = request.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise ServeError(f"unknown op {_shown(op)}: one of {', '.join(sorted(OPS))}")
    args = _fields(f"op {op}", {k: v for k, v in request.items() if k != "op"}, OPS[op])
    slots = args.get("slots")
    if slots is not None and slots[0] > slots[1]:
        raise ServeError(f"slots = {slots}: the first slot is above the last; give "
                         f"[{slots[1]}, {slots[0]}]")
    return op, args

"""Reading a file the user names, within bounds: every loader of HySync reads through here.

A file is read to at most `limit` bytes (one more, to tell a file of exactly `limit` bytes
from a longer one), so /dev/zero, a FIFO that never ends or a multi-GB file by mistake is
refused after `limit` bytes, never read whole. Before a text is parsed, its nesting depth is
measured with a scan over its brackets, outside strings and comments: the parsers (tomllib,
protobuf's text format, json) recurse once per level, and a file nested thousands deep would
end in a RecursionError thousands of lines long. Every refusal is one line that names the
file and says what is wrong and what to pass instead; it is a `BadFileError` unless the
caller names its own error class.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hysync.errors import BadFileError

MiB = 1 << 20
TOML_LIMIT = 4 * MiB  # job files, scenarios, inventories: a few KB each
TEXT_LIMIT = 16 * MiB  # P4Info text, compiler JSON, logs: a few MB for large programs
BINARY_LIMIT = 256 * MiB  # device configs (a Tofino binary is tens of MB)
# Deeper than any file HySync reads (a P4Info nests 5 deep, a TOML file 3) and far below
# where the recursive parsers hit Python's recursion limit.
MAX_DEPTH = 64
MAX_DIGITS = 1000  # an integer's: far past 64 bits, and every field's range
_MAX_BITS = 3321  # an int of more bits is >= 2^3321, which has 1000 digits

ErrorType = Callable[[str], Exception]

# What the depth scan skips: strings (TOML's multi-line ones first, so that their quotes are
# not read as empty strings) and comments; what remains of a bracket is a real one.
_TOML_SKIP = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\''
                        r"|#[^\n]*")
_TEXTPROTO_SKIP = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*')
_JSON_SKIP = re.compile(r'"(?:[^"\\]|\\.)*"')
# A dotted key of more than {0} parts, from its first (possessive: no backtracking).
_DOTTED_RUN = r"(?<![\w-])(?:[\w-]++[ \t]*+\.[ \t]*+){{{0},}}"
_NEWLINE = b"\n"
_CHUNK = 1 * MiB  # the depth scan's step: bounded memory whatever the file's size


def _size_text(limit: int) -> str:
    if limit % MiB == 0:
        return f"{limit // MiB} MiB"
    return f"{limit // 1024} KiB" if limit % 1024 == 0 else f"{limit} bytes"


def read_bytes(path: str | Path, *, what: str, fix: str, limit: int | None = None,
               error: ErrorType = BadFileError) -> bytes:
    """The bytes of `path`, at most `limit` of them (default BINARY_LIMIT); `error` naming
    the file otherwise. `what` names the file's role ("the job file"), `fix` says what to
    pass instead."""
    path = Path(path)
    limit = BINARY_LIMIT if limit is None else limit
    try:
        # O_NONBLOCK: opening a FIFO that has no writer returns at once instead of waiting
        # forever; the reads below block again (a writer that is there is read to its end).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror or err}; {fix}") from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise error(f"cannot read {what} {path}: it is a directory; {fix}")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        chunks, size = [], 0
        while size <= limit:
            try:
                chunk = os.read(fd, min(limit + 1 - size, MiB))
            except BlockingIOError:  # a FIFO with no writer yet: nothing to read
                break
            except OSError as err:
                raise error(f"cannot read {what} {path}: {err.strerror or err}; {fix}") \
                    from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise error(f"{path} is larger than {_size_text(limit)} (reading stopped there): "
                    f"{what} is far smaller; {fix}")
    return b"".join(chunks)


def read_text(path: str | Path, *, what: str, fix: str, limit: int | None = None,
              error: ErrorType = BadFileError) -> str:
    """The UTF-8 text of `path`, at most `limit` bytes (default TEXT_LIMIT); `error` naming
    the file otherwise."""
    limit = TEXT_LIMIT if limit is None else limit
    data = read_bytes(path, what=what, fix=fix, limit=limit, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{path} is not UTF-8 text (byte {err.start}): {fix}") from None


def nesting_error(text: str, skip: re.Pattern[str], opening: bytes, closing: bytes,
                  max_depth: int = MAX_DEPTH, *, dotted: bool = False) -> str | None:
    """None if the brackets of `text` (outside what `skip` matches) nest at most
    `max_depth` deep, and with `dotted` no dotted key (TOML's a.b.c) has more than
    `max_depth` parts; else where that happens: 'line N'."""
    # Each skipped string or comment becomes one letter (a quoted key stays a key) and
    # keeps its newlines, so that line numbers stay right.
    masked_text = skip.sub(lambda m: "q" + "\n" * m.group().count("\n"), text)
    if dotted:
        # tomllib takes time quadratic in a dotted key's parts: 20,000 take minutes.
        run = re.search(_DOTTED_RUN.format(max_depth), masked_text)
        if run:
            return f"line {masked_text.count(chr(10), 0, run.start()) + 1}, a dotted key"
    masked = masked_text.encode("utf-8")
    data = np.frombuffer(masked, dtype=np.uint8)
    depth = 0
    for start in range(0, len(data), _CHUNK):
        chunk = data[start:start + _CHUNK]
        step = np.zeros(len(chunk), dtype=np.int32)
        for char in opening:
            step += chunk == char
        for char in closing:
            step -= chunk == char
        levels = np.cumsum(step, dtype=np.int32) + depth
        if levels.size and int(levels.max()) > max_depth:
            at = start + int(np.argmax(levels > max_depth))
            return f"line {masked.count(_NEWLINE, 0, at) + 1}"
        if levels.size:
            depth = int(levels[-1])
    return None


def check_nesting(path: str | Path, text: str, syntax: str, *, what: str, fix: str,
                  max_depth: int = MAX_DEPTH, error: ErrorType = BadFileError) -> None:
    """Refuse `text` (the contents of `path`, in `syntax`: toml, textproto or json) if its
    brackets nest deeper than `max_depth`, before a recursive parser sees it."""
    skip, opening, closing = {"toml": (_TOML_SKIP, b"[{", b"]}"),
                              "textproto": (_TEXTPROTO_SKIP, b"{<[", b"}>]"),
                              "json": (_JSON_SKIP, b"[{", b"]}")}[syntax]
    where = nesting_error(text, skip, opening, closing, max_depth, dotted=syntax == "toml")
    if where is not None:
        raise error(f"{path} nests more than {max_depth} levels deep ({where}): {what} "
                    f"never does; {fix}")


def data_problem(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """What no loader can take in parsed data, or None: nesting deeper than `max_depth`
    (TOML's dotted keys, a.b.c = 1, nest tables without a bracket, where the scan before
    parsing cannot see them), or an integer of MAX_DIGITS digits or more (no field takes
    one, and an error message quoting it would fail: int() and repr() refuse past 4300
    digits). Iterative, so that it is safe on any depth."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return f"nests tables more than {max_depth} levels deep (dotted keys)"
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, int) and item.bit_length() > _MAX_BITS:
            return f"has an integer of {MAX_DIGITS} digits or more"
    return None


def read_toml(path: str | Path, *, what: str, fix: str, limit: int | None = None,
              error: ErrorType = BadFileError) -> dict[str, Any]:
    """A TOML file as data, at most `limit` bytes (default TOML_LIMIT) and MAX_DEPTH deep;
    `error` naming the file otherwise."""
    limit = TOML_LIMIT if limit is None else limit
    text = read_text(path, what=what, fix=fix, limit=limit, error=error)
    check_nesting(path, text, "toml", what=what, fix=fix, error=error)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise error(f"{path} is not valid TOML: {err}") from None
    except (ValueError, RecursionError) as err:
        raise _unparsable(path, err, what=what, fix=fix, error=error) from None
    return _checked(path, data, what=what, fix=fix, error=error)


def read_json(path: str | Path, *, what: str, fix: str, limit: int | None = None,
              error: ErrorType = BadFileError) -> Any:
    """A JSON file as data, at most `limit` bytes (default TEXT_LIMIT) and MAX_DEPTH deep;
    `error` naming the file otherwise."""
    text = read_text(path, what=what, fix=fix, limit=limit, error=error)
    check_nesting(path, text, "json", what=what, fix=fix, error=error)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{path} is not JSON ({err}): {fix}") from None
    except (ValueError, RecursionError) as err:
        raise _unparsable(path, err, what=what, fix=fix, error=error) from None
    return _checked(path, data, what=what, fix=fix, error=error)


def _unparsable(path: str | Path, err: Exception, *, what: str, fix: str,
                error: ErrorType) -> Exception:
    """What a parser's ValueError or RecursionError means for the user, past its own
    syntax error (TOMLDecodeError and JSONDecodeError are caught before)."""
    if isinstance(err, RecursionError):  # the nesting scan leaves none: a last defence
        return error(f"{path} nests too deep to parse: {fix}")
    # int() refuses an integer of more than sys.get_int_max_str_digits()
    return error(f"{path} has an integer too long to read (thousands of digits): "
                 f"{what} takes none; {fix}")


def _checked(path: str | Path, data: Any, *, what: str, fix: str, error: ErrorType) -> Any:
    problem = data_problem(data)
    if problem:
        raise error(f"{path} {problem}: {what} never does; {fix}")
    return data


__all__ = ["BINARY_LIMIT", "MAX_DEPTH", "MAX_DIGITS", "TEXT_LIMIT", "TOML_LIMIT",
           "check_nesting", "data_problem", "nesting_error", "read_bytes", "read_json",
           "read_text", "read_toml"]

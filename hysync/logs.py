"""HySync's log lines: one formatter for every long-running part (serve, the softswitch, the
policy runner, the workers' transport), as text or as one JSON object per line.

`event(logger, name, text, job=..., **fields)` logs an operator-visible event (a mode swap,
an admission, an exclusion, a resync, a retransmission storm) with a stable name and its
fields; plain `log.info(...)` calls come out too, as event "message". A JSON line has the
keys, always all of them:

    {"time": "2026-01-01T12:00:00.123456Z", "level": "info", "component": "serve",
     "job": 1, "event": "mode_swap", "message": "job 1: ...", "fields": {...}}

`job` is null for what concerns no job; `fields` holds the event's values (`{}` if none).
Log shippers key on `event` and `fields`, not on `message`, whose wording may change.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

FORMATS = ("text", "json")
KEYS = ("time", "level", "component", "job", "event", "message", "fields")

# Logger name prefix -> component: the part of HySync a line comes from.
_COMPONENTS = (
    ("hysync.controlplane.serve", "serve"),
    ("hysync.controlplane.policy", "policy"),
    ("hysync.controlplane", "controlplane"),
    ("hysync.softswitch", "softswitch"),
    ("hysync.prometheus", "metrics"),  # the /metrics endpoint of either process
    ("hysync.worker", "worker"),
    ("hysync.torch", "worker"),
)


def component(logger_name: str) -> str:
    for prefix, name in _COMPONENTS:
        if logger_name == prefix or logger_name.startswith(prefix):
            return name
    return logger_name.rsplit(".", 1)[-1] or "hysync"


def event(logger: logging.Logger, name: str, message: str, /, *, job: int | None = None,
          level: int = logging.INFO, **fields: Any) -> None:
    """Log the event `name` (snake_case, stable) with a human `message` and its `fields`."""
    logger.log(level, message, extra={"hysync_event": name, "hysync_job": job,
                                      "hysync_fields": fields})


def record_dict(record: logging.LogRecord) -> dict[str, Any]:
    """The stable keys of one record (what the JSON format prints)."""
    when = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    fields: Mapping[str, Any] = getattr(record, "hysync_fields", None) or {}
    data = {"time": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname.lower(),
            "component": component(record.name),
            "job": getattr(record, "hysync_job", None),
            "event": getattr(record, "hysync_event", None) or "message",
            "message": record.getMessage(),
            "fields": dict(fields)}
    if record.exc_info:
        data["fields"]["exception"] = logging.Formatter().formatException(record.exc_info)
    return data


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_dict(record), default=str, sort_keys=False)


class TextFormatter(logging.Formatter):
    """`2026-01-01T12:00:00.123Z info serve: job 1: ...`, the event's name in brackets."""

    def format(self, record: logging.LogRecord) -> str:
        d = record_dict(record)
        name = f" [{d['event']}]" if d["event"] != "message" else ""
        line = f"{d['time'][:-4]}Z {d['level']} {d['component']}: {d['message']}{name}"
        if "exception" in d["fields"]:
            line += "\n" + d["fields"]["exception"]
        return line


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def setup(fmt: str = "text", level: int | str = logging.INFO,
          stream: TextIO | None = None) -> logging.Handler:
    """Route every `hysync.*` logger (and the root's) to `stream` (stderr) in `fmt`. Called
    once by each process's entry point; returns the handler (tests remove it)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "hysync", False)]:
        root.removeHandler(old)
    handler.hysync = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level if isinstance(level, int) else level.upper())
    return handler


@contextlib.contextmanager
def configured(fmt: str = "text", level: int | str = logging.INFO,
               stream: TextIO | None = None) -> Iterator[logging.Handler]:
    """`setup` for the duration of a command; the root logger is put back after it."""
    root = logging.getLogger()
    before = root.level
    handler = setup(fmt, level, stream)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(before)


def from_environment() -> logging.Handler | None:
    """For a process HySync runs inside but does not own (a training script calling
    hysync.torch.attach): set its logging up only when HYSYNC_LOG_FORMAT (text or json)
    asks, at HYSYNC_LOG_LEVEL (default info); else leave the script's logging alone."""
    fmt = os.environ.get("HYSYNC_LOG_FORMAT")
    if not fmt:
        return None
    level = os.environ.get("HYSYNC_LOG_LEVEL", "info").upper()
    if fmt not in FORMATS or level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"HYSYNC_LOG_FORMAT={fmt!r} HYSYNC_LOG_LEVEL={level.lower()!r}: the "
                         f"format is one of {', '.join(FORMATS)}, the level debug, info, "
                         "warning or error")
    return setup(fmt, level)

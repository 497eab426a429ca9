"""What launched processes wrote to their log files, read back once they ended."""

from __future__ import annotations

import json
from typing import IO


def read_back(logs: list[IO[str]]) -> list[str]:
    """Each log's whole text; the logs are closed."""
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    return outputs


def records(outputs: list[str], key: str) -> list[dict]:
    """Every JSON object printed that starts with `key` (`{"key": ...}`). Processes that
    share an output (the ranks of one launcher) can run one line into another: an
    unbuffered print writes a line and its newline apart, so objects are found where they
    start, not by line."""
    decoder = json.JSONDecoder()
    opening = '{"' + key + '"'
    found = []
    for out in outputs:
        start = out.find(opening)
        while start != -1:
            record, end = decoder.raw_decode(out, start)
            found.append(record)
            start = out.find(opening, end)
    return found

"""Nested test data (tables and arrays, as a TOML file holds them) with one field changed or
taken out: how the tests of bad input make each bad file from a good one."""

from __future__ import annotations

import copy
from typing import Any

DELETE = object()  # as the value: take the field out


def changed(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of `data` with the field at `path` (keys and list indices joined by dots,
    e.g. "members.1.ipv4") set to `value`, or taken out where `value` is DELETE."""
    data = copy.deepcopy(data)
    *parents, last = path.split(".")
    node: Any = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is DELETE:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return data

"""The control-plane-visible state of the softswitch: table entries, multicast
groups and counters, as plain Python objects.

The P4Runtime server (softswitch/server.py) validates every request against the
P4Info and then calls into this module; the pipeline (softswitch/pipeline.py)
reads the derived lookup indexes that every change rebuilds. Entries are keyed
the way P4Runtime identifies them: by match key (and priority for range
matches), so an INSERT of an existing key and a MODIFY/DELETE of a missing one
are errors the server reports as ALREADY_EXISTS / NOT_FOUND.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hysync import p4names

# A match value is an int (exact) or an (lo, hi) pair (range).
MatchValue = int | tuple[int, int]


class EntryError(Exception):
    """A request that conflicts with the switch's state; `code` is a grpc StatusCode name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Entry:
    table: str
    match: tuple[MatchValue, ...]  # in P4Info match-field order
    action: str
    params: tuple[int, ...] = ()  # in P4Info param order
    priority: int = 0

    @property
    def key(self) -> tuple[tuple[MatchValue, ...], int]:
        return self.match, self.priority


@dataclass(slots=True)
class Table:
    name: str
    size: int
    default_action: str = p4names.NO_ACTION
    default_params: tuple[int, ...] = ()
    entries: dict[tuple[tuple[MatchValue, ...], int], Entry] = field(default_factory=dict)

    def insert(self, entry: Entry) -> None:
        if entry.key in self.entries:
            raise EntryError("ALREADY_EXISTS", f"{self.name}: an entry with this match key exists")
        if len(self.entries) >= self.size:
            raise EntryError("RESOURCE_EXHAUSTED", f"{self.name} is full ({self.size} entries)")
        self.entries[entry.key] = entry

    def modify(self, entry: Entry) -> None:
        if entry.key not in self.entries:
            raise EntryError("NOT_FOUND", f"{self.name}: no entry with this match key to modify")
        self.entries[entry.key] = entry

    def delete(self, entry: Entry) -> None:
        if entry.key not in self.entries:
            raise EntryError("NOT_FOUND", f"{self.name}: no entry with this match key to delete")
        del self.entries[entry.key]


@dataclass(frozen=True, slots=True)
class Replica:
    port: int
    rid: int


class Counter:
    """An indexed packets-and-bytes counter array."""

    __slots__ = ("name", "size", "packets", "bytes")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.packets = [0] * size
        self.bytes = [0] * size

    def count(self, index: int, nbytes: int) -> None:
        self.packets[index] += 1
        self.bytes[index] += nbytes

    def clear(self) -> None:
        self.packets = [0] * self.size
        self.bytes = [0] * self.size

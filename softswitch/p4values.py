"""P4Runtime values <-> the pipeline's: match keys, actions, entries, counter indices.

Requests arrive as P4Info ids and bytestrings; the pipeline (hysync.softswitch.tables) holds
names and ints in the positions a `PipelineBinding` binds the ids to. Decoding checks what
P4Runtime requires (widths, match kinds, priorities, don't-care ranges) and raises
P4RuntimeError naming the field; encoding gives canonical bytestrings, through the
value codec that the control plane uses too (hysync.p4schema).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from p4.v1 import p4runtime_pb2 as p4r

from hysync import p4rt_codec
from hysync.p4schema import EncodeError, decode_int, encode_int
from hysync.softswitch.p4binding import (
    DEFAULT_ONLY,
    EXACT,
    RANGE,
    TABLE_ONLY,
    BoundCounter,
    BoundTable,
    PipelineBinding,
)
from hysync.softswitch.p4status import P4RuntimeError
from hysync.softswitch.tables import Entry


def decode_value(raw: bytes, bits: int, what: str) -> int:
    """A P4Runtime bytestring -> int; leading zero bytes are fine if the value fits `bits`."""
    if not raw:
        raise P4RuntimeError(grpc.StatusCode.OUT_OF_RANGE,
                             f"{what}: empty bytestring; send the value big-endian in at "
                             "least 1 byte")
    try:
        return decode_int(raw, bits, what)
    except EncodeError as err:
        raise P4RuntimeError(grpc.StatusCode.OUT_OF_RANGE, str(err)) from err


def encode_value(value: int) -> bytes:
    """The canonical (shortest) P4Runtime bytestring of a non-negative int."""
    return encode_int(value, 0, "value")


# A batch's decoded match fields and actions, by record (records of equal bytes are equal):
# the many entries of a batch that share a job, a port or an action decode them once.
DecodeCache = dict[tuple[int, Any], Any]


def decode_match(table: BoundTable, matches: Iterable[p4rt_codec.FieldMatch],
                 cache: DecodeCache | None = None) -> tuple[Any, ...]:
    values: list[Any] = [None] * len(table.fields)
    for fm in matches:
        if cache is None:
            pos, value = _decode_field(table, fm)
        else:
            found = cache.get((table.id, fm))
            if found is None:
                found = cache[(table.id, fm)] = _decode_field(table, fm)
            pos, value = found
        if values[pos] is not None:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{table.name} match field {table.fields[pos].name} given twice")
        values[pos] = value
    if None in values:
        for pos, f in enumerate(table.fields):
            if values[pos] is None:
                if f.kind == EXACT:
                    raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                         f"{table.name}: exact match field {f.name} (id {f.id}) "
                                         "is missing; exact fields cannot be omitted")
                values[pos] = (0, (1 << f.bitwidth) - 1)  # omitted range = don't care
    return tuple(values)


def _decode_field(table: BoundTable, fm: p4rt_codec.FieldMatch) -> tuple[int, Any]:
    """(position in Entry.match, value) of one match field."""
    pos = table.position.get(fm.field_id)
    if pos is None:
        known = ", ".join(f"{f.id} ({f.name})" for f in table.fields)
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{table.name} has no match field id {fm.field_id}; its "
                             f"fields are {known}")
    f = table.fields[pos]
    what = f"{table.name} match field {f.name}"
    if fm.kind != f.kind:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{what} is a {f.kind} match, got {fm.kind}")
    if f.kind == EXACT:
        return pos, decode_value(fm.value, f.bitwidth, what)
    lo = decode_value(fm.value, f.bitwidth, f"{what} low")
    hi = decode_value(fm.second, f.bitwidth, f"{what} high")
    if lo > hi:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: low {lo} > high {hi}")
    if (lo, hi) == (0, (1 << f.bitwidth) - 1):
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{what}: the full range is a don't-care match; omit "
                             "the field instead (spec §9.1.1)")
    return pos, (lo, hi)


def check_priority(table: BoundTable, priority: int) -> int:
    if table.needs_priority and priority <= 0:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{table.name} has a range match field: set a priority > 0 "
                             "(higher wins)")
    if not table.needs_priority and priority != 0:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{table.name} has only exact match fields: priority must be 0, "
                             f"got {priority}")
    return priority


def decode_action(binding: PipelineBinding, table: BoundTable, a: p4rt_codec.Action | str,
                  default: bool, cache: DecodeCache | None = None) -> tuple[str, tuple[int, ...]]:
    if cache is None:
        return _decode_action(binding, table, a, default)
    key = (table.id, (a, default))
    found = cache.get(key)
    if found is None:
        found = cache[key] = _decode_action(binding, table, a, default)
    return found  # type: ignore[no-any-return]


def _decode_action(binding: PipelineBinding, table: BoundTable, a: p4rt_codec.Action | str,
                   default: bool) -> tuple[str, tuple[int, ...]]:
    if isinstance(a, str):
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{table.name} is a direct table: set action.action, not {a}")
    action = binding.actions.get(a.action_id)
    scope = table.scopes.get(a.action_id)
    if action is None or scope is None:
        known = ", ".join(f"{i} ({binding.actions[i].name})" for i in table.scopes)
        what = f"action {action.name}" if action else f"action id {a.action_id}"
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{what} is not an action of {table.name}; its actions are "
                             f"{known}")
    if default and scope == TABLE_ONLY:
        raise P4RuntimeError(grpc.StatusCode.PERMISSION_DENIED,
                             f"{action.name} is @tableonly in {table.name}: not a default")
    if not default and scope == DEFAULT_ONLY:
        raise P4RuntimeError(grpc.StatusCode.PERMISSION_DENIED,
                             f"{action.name} is @defaultonly in {table.name}: entries need "
                             "another action")
    values: list[int | None] = [None] * len(action.params)
    for p in a.params:
        pos = action.position.get(p.param_id)
        if pos is None:
            known = ", ".join(f"{q.id} ({q.name})" for q in action.params) or "none"
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"action {action.name} has no param id {p.param_id}; its "
                                 f"params are {known}")
        param = action.params[pos]
        what = f"action {action.name} param {param.name}"
        if values[pos] is not None:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT, f"{what} given twice")
        values[pos] = decode_value(p.value, param.bitwidth, what)
    for pos, param in enumerate(action.params):
        if values[pos] is None:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"action {action.name} needs param {param.name} (id "
                                 f"{param.id}, {param.bitwidth} bits)")
    return action.name, tuple(v for v in values if v is not None)


def encode_entry(binding: PipelineBinding, table: BoundTable, entry: Entry,
                 meta: tuple[int, bytes]) -> p4r.TableEntry:
    out = p4r.TableEntry(table_id=table.id, priority=entry.priority,
                         controller_metadata=meta[0], metadata=meta[1])
    for f, value in sorted(zip(table.fields, entry.match, strict=True), key=lambda x: x[0].id):
        if isinstance(value, int):  # exact
            out.match.add(field_id=f.id).exact.value = encode_value(value)
        elif value != (0, (1 << f.bitwidth) - 1):  # a don't-care range is omitted
            fm = out.match.add(field_id=f.id)
            fm.range.low, fm.range.high = encode_value(value[0]), encode_value(value[1])
    encode_action(binding, out, entry.action, entry.params)
    return out


def encode_action(binding: PipelineBinding, out: p4r.TableEntry, name: str,
                  params: tuple[int, ...]) -> None:
    action_id = binding.action_ids.get(name)
    if action_id is None or action_id not in binding.actions:
        raise P4RuntimeError(grpc.StatusCode.INTERNAL,
                             f"{name} is not an action of the installed P4Info")
    action = binding.actions[action_id]
    a = out.action.action
    a.action_id = action_id
    for p, value in sorted(zip(action.params, params, strict=True), key=lambda x: x[0].id):
        a.params.add(param_id=p.id, value=encode_value(value))


def counter_index(info: BoundCounter, index: int | None) -> int | None:
    """The cell a CounterEntry's index names (None: every cell), checked."""
    if index is None:
        return None
    if index < 0:
        raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"{info.name}: index {index} is negative")
    if index >= info.size:
        raise P4RuntimeError(grpc.StatusCode.OUT_OF_RANGE,
                             f"{info.name}: index {index} is out of range (0..{info.size - 1})")
    return index


def describe_key(table: BoundTable, match: tuple[Any, ...], priority: int) -> str:
    parts = []
    for f, value in zip(table.fields, match, strict=True):
        parts.append(f"{f.name}={value[0]}..{value[1]}" if f.kind == RANGE else f"{f.name}={value}")
    if priority:
        parts.append(f"priority {priority}")
    return ", ".join(parts)

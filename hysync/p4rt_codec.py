"""The protobuf wire codec of a P4Runtime Write: WriteRequest bytes <-> light records.

p4runtime-shell pins protobuf<3.21, whose only implementation on Python 3.11 is the
pure-Python one: building, serializing and parsing a 20,000-update WriteRequest through
it takes tens of seconds. This codec reads and writes the same bytes without message
objects: the controller encodes its entities straight to bytes (controlplane/p4rt/switch.py)
and the softswitch decodes a Write into the records below, which its Writer plans from.
Every other RPC keeps the generic protobuf path.

Same wire format, no second meaning: field numbers and types are p4runtime.proto's, and
tests/test_p4rt_codec.py holds both directions to the protobuf library. As protobuf parses:
unknown fields, and known field numbers sent with another wire type, are skipped; a
singular scalar's last value wins; a singular message sent twice is merged; a oneof keeps
its last member. Malformed bytes (truncated, an overlong varint, wire type 6/7, field
number 0, an unbalanced group or groups nested deeper than protobuf's limit of 100, a
role that is not UTF-8) raise MalformedRequestError naming where. Records carry what the HySync
program can use; message fields it has no use for (meter_config, counter_data, ...) are
carried as "present" and entity kinds it has none of as `Unsupported(kind)`, after the
library has checked that they are well formed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from google.protobuf.message import DecodeError
from p4.v1 import p4runtime_pb2 as p4r

VARINT, FIXED64, LEN, START_GROUP, END_GROUP, FIXED32 = range(6)
_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1
_SMALL = [bytes((i,)) for i in range(128)]
# Decoding is a pure function of the bytes and records are immutable: a batch's many
# identical match fields and actions (same job, same port, ...) are decoded once.
_MEMO = 1 << 14
_MAX_DEPTH = 100  # protobuf's recursion limit


class MalformedRequestError(ValueError):
    """Bytes that are not a well-formed WriteRequest; the message says where."""


# ----------------------------------------------------------------- records
# Match fields and actions are shared between the updates of a batch (see _MEMO), so they
# are frozen; the rest are plain slotted records (a frozen dataclass is built 6x slower),
# never changed once decoded.
@dataclass(frozen=True, slots=True)
class FieldMatch:
    """`kind` is the field_match_type oneof's member (None: unset). `value` is the exact,
    optional, ternary or lpm value or the range's low; `second` the ternary mask or the
    range's high; `prefix_len` the lpm's. An `other` match is carried by name only."""

    field_id: int
    kind: str | None
    value: bytes = b""
    second: bytes = b""
    prefix_len: int = 0


@dataclass(frozen=True, slots=True)
class Param:
    param_id: int
    value: bytes


@dataclass(frozen=True, slots=True)
class Action:
    action_id: int
    params: tuple[Param, ...] = ()


# A TableAction that is not `action`: its oneof member's name, or this when none is set.
NO_ACTION_KIND = "unset"
# TableEntry message fields carried as present or not.
TABLE_RESOURCES = {6: "meter_config", 7: "counter_data", 10: "time_since_last_hit",
                   12: "meter_counter_data"}


@dataclass(slots=True)
class TableEntry:
    table_id: int = 0
    match: tuple[FieldMatch, ...] = ()
    action: Action | str | None = None  # None: the action field is absent
    priority: int = 0
    controller_metadata: int = 0
    is_default_action: bool = False
    idle_timeout_ns: int = 0
    metadata: bytes = b""
    is_const: bool = False
    resources: frozenset[str] = frozenset()  # the TABLE_RESOURCES present


@dataclass(slots=True)
class Replica:
    """`egress_port` or `port` is the port_kind oneof's member (both None: unset)."""

    instance: int = 0
    egress_port: int | None = None
    port: bytes | None = None


@dataclass(slots=True)
class MulticastGroupEntry:
    multicast_group_id: int = 0
    replicas: tuple[Replica, ...] = ()
    metadata: bytes = b""


@dataclass(slots=True)
class CounterData:
    byte_count: int = 0
    packet_count: int = 0


@dataclass(slots=True)
class CounterEntry:
    counter_id: int = 0
    index: int | None = None  # None: the index field is absent (every cell)
    data: CounterData | None = None


@dataclass(slots=True)
class Unsupported:
    """An entity the records do not decode: the name of its kind (Entity's oneof member,
    or "clone_session_entry", or "packet_replication_engine_entry" with neither set);
    None when the entity is empty or absent."""

    kind: str | None


Entity = TableEntry | MulticastGroupEntry | CounterEntry | Unsupported


@dataclass(slots=True)
class Update:
    type: int  # p4.v1.Update.Type; an open enum, so any int32
    entity: Entity


@dataclass(slots=True)
class WriteRequest:
    device_id: int = 0
    role_id: int = 0
    election_id: tuple[int, int] | None = None  # (high, low); None: absent
    updates: tuple[Update, ...] = ()
    atomicity: int = 0
    role: str = ""


# ----------------------------------------------------------------- reading
Fields = list[tuple[int, int, int]]  # (tag, value, 0) for a varint, (tag, start, end) for LEN


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise MalformedRequestError(f"truncated varint at byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 64:
            raise MalformedRequestError(f"varint longer than 10 bytes ending at byte {pos}")


def _fields(buf: bytes, pos: int, end: int) -> Fields:
    """The varint and length-delimited fields of one message; fixed-width fields and
    groups (none is a P4Runtime Write field) are checked and skipped."""
    out: Fields = []
    append = out.append
    while pos < end:
        tag = buf[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(buf, pos, end)
        if tag < 8:
            raise MalformedRequestError(f"field number 0 at byte {pos - 1}: protobuf field "
                                        "numbers start at 1")
        wire_type = tag & 7
        if wire_type == VARINT:
            if pos < end and buf[pos] < 0x80:
                append((tag, buf[pos], 0))
                pos += 1
            else:
                value, pos = _varint(buf, pos, end)
                append((tag, value, 0))
        elif wire_type == LEN:
            if pos < end and buf[pos] < 0x80:
                size = buf[pos]
                pos += 1
            else:
                size, pos = _varint(buf, pos, end)
            stop = pos + size
            if stop > end:
                raise MalformedRequestError(f"field {tag >> 3} at byte {pos} runs {stop - end} "
                                            "byte(s) past the end of its message")
            append((tag, pos, stop))
            pos = stop
        else:
            pos = _skip(buf, tag, pos, end)
    return out


def _skip(buf: bytes, tag: int, pos: int, end: int, depth: int = 0) -> int:
    wire_type = tag & 7
    if wire_type in (FIXED64, FIXED32):
        pos += 8 if wire_type == FIXED64 else 4
        if pos > end:
            raise MalformedRequestError(f"truncated fixed-width field {tag >> 3}")
        return pos
    if wire_type == START_GROUP:
        if depth >= _MAX_DEPTH:
            raise MalformedRequestError(f"groups nested deeper than {_MAX_DEPTH} at byte {pos}")
        while True:
            if pos >= end:
                raise MalformedRequestError(f"group {tag >> 3} has no end")
            inner, pos = _varint(buf, pos, end)
            if inner < 8:
                raise MalformedRequestError(f"field number 0 in group {tag >> 3}")
            kind = inner & 7
            if kind == END_GROUP:
                if inner >> 3 != tag >> 3:
                    raise MalformedRequestError(f"group {tag >> 3} closed as group {inner >> 3}")
                return pos
            if kind == VARINT:
                pos = _varint(buf, pos, end)[1]
            elif kind == LEN:
                size, pos = _varint(buf, pos, end)
                pos += size
                if pos > end:
                    raise MalformedRequestError(f"truncated field {inner >> 3} in group {tag >> 3}")
            else:
                pos = _skip(buf, inner, pos, end, depth + 1)
    if wire_type == END_GROUP:
        raise MalformedRequestError(f"end of group {tag >> 3} at byte {pos} without its start")
    raise MalformedRequestError(f"field {tag >> 3} has wire type {wire_type}, which protobuf "
                                "does not define")


def _well_formed(message: Any, data: bytes) -> None:
    """Parse, with the protobuf library, a message whose parts the records keep by name only
    (an entity kind, a meter config, ...): it is refused whole if any part is malformed, as
    the library refuses it. Such a message is rare and refused later anyway."""
    try:
        message.FromString(data)
    except (DecodeError, UnicodeDecodeError) as err:
        raise MalformedRequestError(f"{message.DESCRIPTOR.name}: {err}") from None


def _int32(value: int) -> int:
    value &= _MASK32
    return value - (1 << 32) if value >> 31 else value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


def _tag(number: int, wire_type: int) -> int:
    return number << 3 | wire_type


def _message(buf: bytes, spans: list[tuple[int, int]],
             decode: Callable[[bytes, int, int], Any]) -> Any:
    """A singular message field: sent more than once, its parts merge (as protobuf's)."""
    if len(spans) == 1:
        return decode(buf, *spans[0])
    joined = b"".join(buf[a:b] for a, b in spans)
    return decode(joined, 0, len(joined))


def _oneof(fields: Fields, members: dict[int, str]) -> tuple[str | None, list[tuple[int, int]]]:
    """The last oneof member (of message type) sent and the spans of its parts since."""
    kind: str | None = None
    spans: list[tuple[int, int]] = []
    for tag, a, b in fields:
        name = members.get(tag)
        if name is None:
            continue
        if name != kind:
            kind, spans = name, []
        spans.append((a, b))
    return kind, spans


def _pair_of_bytes(buf: bytes, pos: int, end: int) -> tuple[bytes, bytes]:
    """The bytes fields 1 and 2 of Exact, Optional, Ternary, Range (Exact has no 2)."""
    first = second = b""
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x0A:
            first = buf[a:b]
        elif tag == 0x12:
            second = buf[a:b]
    return first, second


def _lpm(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    value, prefix_len = b"", 0
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x0A:
            value = buf[a:b]
        elif tag == 0x10:
            prefix_len = _int32(a)
    return value, prefix_len


_MATCH_KINDS = {_tag(2, LEN): "exact", _tag(3, LEN): "ternary", _tag(4, LEN): "lpm",
                _tag(6, LEN): "range", _tag(7, LEN): "optional", _tag(100, LEN): "other"}


@lru_cache(maxsize=_MEMO)
def _field_match(buf: bytes) -> FieldMatch:
    pos, end = 0, len(buf)
    fields = _fields(buf, pos, end)
    field_id = 0
    for tag, a, _ in fields:
        if tag == 0x08:
            field_id = a & _MASK32
    kind, spans = _oneof(fields, _MATCH_KINDS)
    if kind == "other":
        _well_formed(p4r.FieldMatch, buf)
    if kind is None or kind == "other":
        return FieldMatch(field_id, kind)
    if kind == "lpm":
        value, prefix_len = _message(buf, spans, _lpm)
        return FieldMatch(field_id, kind, value, prefix_len=prefix_len)
    value, second = _message(buf, spans, _pair_of_bytes)
    if kind in ("exact", "optional"):
        second = b""
    return FieldMatch(field_id, kind, value, second)


def decode_field_match(data: bytes) -> FieldMatch:
    """The record of one serialized p4.v1.FieldMatch (a Read's filter)."""
    return _field_match(bytes(data))


def _param(buf: bytes, pos: int, end: int) -> Param:
    param_id, value = 0, b""
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x10:
            param_id = a & _MASK32
        elif tag == 0x1A:
            value = buf[a:b]
    return Param(param_id, value)


def _action(buf: bytes, pos: int, end: int) -> Action:
    action_id = 0
    params = []
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x08:
            action_id = a & _MASK32
        elif tag == 0x22:
            params.append(_param(buf, a, b))
    return Action(action_id, tuple(params))


_TABLE_ACTION_KINDS = {_tag(1, LEN): "action", _tag(2, VARINT): "action_profile_member_id",
                       _tag(3, VARINT): "action_profile_group_id",
                       _tag(4, LEN): "action_profile_action_set"}


@lru_cache(maxsize=_MEMO)
def _table_action(buf: bytes) -> Action | str:
    kind, spans = _oneof(_fields(buf, 0, len(buf)), _TABLE_ACTION_KINDS)
    if kind == "action":
        return _message(buf, spans, _action)  # type: ignore[no-any-return]
    return kind or NO_ACTION_KIND


_NO_RESOURCES: frozenset[str] = frozenset()
_RESOURCE_TAGS = {_tag(number, LEN): name for number, name in TABLE_RESOURCES.items()}


def _table_entry(buf: bytes, pos: int, end: int) -> TableEntry:
    table_id = priority = controller_metadata = idle_timeout_ns = 0
    is_default = is_const = False
    metadata = b""
    match = []
    actions: list[tuple[int, int]] = []
    resources: set[str] = set()
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x12:
            match.append(_field_match(buf[a:b]))
        elif tag == 0x08:
            table_id = a & _MASK32
        elif tag == 0x1A:
            actions.append((a, b))
        elif tag == 0x20:
            priority = _int32(a)
        elif tag == 0x28:
            controller_metadata = a
        elif tag == 0x40:
            is_default = a != 0
        elif tag == 0x48:
            idle_timeout_ns = _int64(a)
        elif tag == 0x5A:
            metadata = buf[a:b]
        elif tag == 0x68:
            is_const = a != 0
        elif tag in _RESOURCE_TAGS:
            resources.add(_RESOURCE_TAGS[tag])
    if len(actions) == 1:
        action = _table_action(buf[actions[0][0]:actions[0][1]])
    else:
        action = _table_action(b"".join(buf[a:b] for a, b in actions)) if actions else None
    if resources or action == "action_profile_action_set":
        _well_formed(p4r.TableEntry, buf[pos:end])
    return TableEntry(table_id, tuple(match), action, priority, controller_metadata, is_default,
                      idle_timeout_ns, metadata, is_const,
                      frozenset(resources) if resources else _NO_RESOURCES)


def _replica(buf: bytes, pos: int, end: int) -> Replica:
    instance = 0
    egress_port: int | None = None
    port: bytes | None = None
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x10:
            instance = a & _MASK32
        elif tag == 0x08:
            egress_port, port = a & _MASK32, None
        elif tag == 0x1A:
            egress_port, port = None, buf[a:b]
    return Replica(instance, egress_port, port)


def _group(buf: bytes, pos: int, end: int) -> MulticastGroupEntry:
    group_id, metadata = 0, b""
    replicas = []
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x12:
            replicas.append(_replica(buf, a, b))
        elif tag == 0x08:
            group_id = a & _MASK32
        elif tag == 0x1A:
            metadata = buf[a:b]
    return MulticastGroupEntry(group_id, tuple(replicas), metadata)


def _pre(buf: bytes, pos: int, end: int) -> Entity:
    kind, spans = _oneof(_fields(buf, pos, end), {_tag(1, LEN): "multicast_group_entry",
                                                   _tag(2, LEN): "clone_session_entry"})
    if kind == "multicast_group_entry":
        return _message(buf, spans, _group)  # type: ignore[no-any-return]
    _well_formed(p4r.PacketReplicationEngineEntry, buf[pos:end])
    return Unsupported(kind or "packet_replication_engine_entry")


def _index(buf: bytes, pos: int, end: int) -> int:
    index = 0
    for tag, a, _ in _fields(buf, pos, end):
        if tag == 0x08:
            index = _int64(a)
    return index


def _counter_data(buf: bytes, pos: int, end: int) -> CounterData:
    byte_count = packet_count = 0
    for tag, a, _ in _fields(buf, pos, end):
        if tag == 0x08:
            byte_count = _int64(a)
        elif tag == 0x10:
            packet_count = _int64(a)
    return CounterData(byte_count, packet_count)


def _counter(buf: bytes, pos: int, end: int) -> CounterEntry:
    counter_id = 0
    index: list[tuple[int, int]] = []
    data: list[tuple[int, int]] = []
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x08:
            counter_id = a & _MASK32
        elif tag == 0x12:
            index.append((a, b))
        elif tag == 0x1A:
            data.append((a, b))
    return CounterEntry(counter_id, _message(buf, index, _index) if index else None,
                        _message(buf, data, _counter_data) if data else None)


ENTITY_KINDS = ("extern_entry", "table_entry", "action_profile_member", "action_profile_group",
                "meter_entry", "direct_meter_entry", "counter_entry", "direct_counter_entry",
                "packet_replication_engine_entry", "value_set_entry", "register_entry",
                "digest_entry")  # Entity's oneof, field numbers 1..12
_ENTITY_TAGS = {_tag(i, LEN): name for i, name in enumerate(ENTITY_KINDS, 1)}
_ENTITY_DECODERS: dict[str, Callable[[bytes, int, int], Entity]] = {
    "table_entry": _table_entry, "counter_entry": _counter,
    "packet_replication_engine_entry": _pre}


def _entity(buf: bytes, pos: int, end: int) -> Entity:
    kind, spans = _oneof(_fields(buf, pos, end), _ENTITY_TAGS)
    decode = _ENTITY_DECODERS.get(kind or "")
    if decode is None:
        _well_formed(p4r.Entity, buf[pos:end])
        return Unsupported(kind)
    try:
        return _message(buf, spans, decode)  # type: ignore[no-any-return]
    except MalformedRequestError as err:
        raise MalformedRequestError(f"{kind}: {err}") from None


def _only(buf: bytes, pos: int, end: int, tag: int) -> tuple[int, int] | None:
    """The span of a message's field if the message is that one LEN field and nothing else
    (the canonical layout of Update.entity and of Entity's member): the fast path."""
    if pos + 2 >= end or buf[pos] != tag:
        return None
    size, start = _varint(buf, pos + 1, end)
    return (start, end) if start + size == end else None


def _update(buf: bytes, pos: int, end: int) -> Update:
    if pos + 2 < end and buf[pos] == 0x08 and buf[pos + 1] < 0x80:  # type, then the entity
        span = _only(buf, pos + 2, end, 0x12)
        if span is not None:
            inner = _only(buf, *span, 0x12)  # a table entry
            if inner is not None:
                return Update(buf[pos + 1], _table_entry(buf, *inner))
    utype = 0
    entity: list[tuple[int, int]] = []
    for tag, a, b in _fields(buf, pos, end):
        if tag == 0x08:
            utype = _int32(a)
        elif tag == 0x12:
            entity.append((a, b))
    return Update(utype, _message(buf, entity, _entity) if entity else Unsupported(None))


def _uint128(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    high = low = 0
    for tag, a, _ in _fields(buf, pos, end):
        if tag == 0x08:
            high = a
        elif tag == 0x10:
            low = a
    return high, low


def decode_write_request(data: bytes) -> WriteRequest:
    """The records of a serialized p4.v1.WriteRequest; MalformedRequestError if it is malformed."""
    buf = bytes(data)
    device_id = role_id = atomicity = 0
    role = ""
    elections: list[tuple[int, int]] = []
    updates = []
    try:
        fields = _fields(buf, 0, len(buf))
    except MalformedRequestError as err:
        raise MalformedRequestError(f"WriteRequest: {err}") from None
    for tag, a, b in fields:
        if tag == 0x22:
            try:
                updates.append(_update(buf, a, b))
            except MalformedRequestError as err:
                raise MalformedRequestError(f"updates[{len(updates)}]: {err}") from None
        elif tag == 0x08:
            device_id = a
        elif tag == 0x10:
            role_id = a
        elif tag == 0x1A:
            elections.append((a, b))
        elif tag == 0x28:
            atomicity = _int32(a)
        elif tag == 0x32:
            try:
                role = buf[a:b].decode()
            except UnicodeDecodeError:
                raise MalformedRequestError(
                    f"WriteRequest: role at byte {a} is not UTF-8") from None
    try:
        election = _message(buf, elections, _uint128) if elections else None
    except MalformedRequestError as err:
        raise MalformedRequestError(f"election_id: {err}") from None
    return WriteRequest(device_id, role_id, election, tuple(updates), atomicity, role)


# ----------------------------------------------------------------- writing
def _uvarint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]
    value &= _MASK64  # negative int32/int64: ten bytes, two's complement (as protobuf)
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len(tag: int, payload: bytes) -> bytes:
    return _SMALL[tag] + _uvarint(len(payload)) + payload if tag < 0x80 else \
        _uvarint(tag) + _uvarint(len(payload)) + payload


def _num(tag: int, value: int) -> bytes:
    """A varint field; omitted at its default 0, as proto3 does."""
    return _SMALL[tag] + _uvarint(value) if value else b""


_MATCH_TAGS = {name: tag for tag, name in _MATCH_KINDS.items()}
_TABLE_ACTION_TAGS = {name: tag for tag, name in _TABLE_ACTION_KINDS.items()}


@lru_cache(maxsize=_MEMO)
def _field_match_bytes(fm: FieldMatch) -> bytes:
    """A FieldMatch's bytes with their tag and length (a batch repeats many)."""
    kind = fm.kind
    if kind == "exact" or kind == "optional":
        inner = _len(0x0A, fm.value) if fm.value else b""
    elif kind == "range" or kind == "ternary":
        inner = (_len(0x0A, fm.value) if fm.value else b"") + \
            (_len(0x12, fm.second) if fm.second else b"")
    elif kind == "lpm":
        inner = (_len(0x0A, fm.value) if fm.value else b"") + _num(0x10, fm.prefix_len)
    else:
        inner = b""
    body = _num(0x08, fm.field_id)
    if kind is not None:
        body += _len(_MATCH_TAGS[kind], inner)
    return _len(0x12, body)


@lru_cache(maxsize=_MEMO)
def _action_bytes(action: Action | str) -> bytes:
    """A TableAction's bytes with their tag and length (a batch repeats many)."""
    if isinstance(action, str):
        if action == NO_ACTION_KIND:
            return _len(0x1A, b"")
        return _len(0x1A, _SMALL[_TABLE_ACTION_TAGS[action]] + b"\0")  # an empty message or a 0
    body = _num(0x08, action.action_id)
    for p in action.params:
        body += _len(0x22, _num(0x10, p.param_id) + (_len(0x1A, p.value) if p.value else b""))
    return _len(0x1A, _len(0x0A, body))


def _table_entry_bytes(te: TableEntry) -> bytes:
    parts = [_num(0x08, te.table_id)]
    parts += [_field_match_bytes(fm) for fm in te.match]
    if te.action is not None:
        parts.append(_action_bytes(te.action))
    if te.priority or te.controller_metadata:
        parts += [_num(0x20, te.priority), _num(0x28, te.controller_metadata)]
    if not (te.resources or te.is_default_action or te.idle_timeout_ns or te.metadata
            or te.is_const):
        return b"".join(parts)
    resources = {number: name in te.resources for number, name in TABLE_RESOURCES.items()}
    parts += [_len(_tag(n, LEN), b"") for n in (6, 7) if resources[n]]
    parts += [_num(0x40, te.is_default_action), _num(0x48, te.idle_timeout_ns)]
    if resources[10]:
        parts.append(_len(_tag(10, LEN), b""))
    if te.metadata:
        parts.append(_len(0x5A, te.metadata))
    if resources[12]:
        parts.append(_len(_tag(12, LEN), b""))
    parts.append(_num(0x68, te.is_const))
    return b"".join(parts)


def _group_bytes(group: MulticastGroupEntry) -> bytes:
    body = _num(0x08, group.multicast_group_id)
    for r in group.replicas:
        replica = b""
        if r.egress_port is not None:
            replica = _SMALL[0x08] + _uvarint(r.egress_port)  # a oneof member: sent even if 0
        replica += _num(0x10, r.instance)
        if r.port is not None:
            replica += _len(0x1A, r.port)
        body += _len(0x12, replica)
    if group.metadata:
        body += _len(0x1A, group.metadata)
    return _len(0x0A, body)


def _counter_bytes(ce: CounterEntry) -> bytes:
    body = _num(0x08, ce.counter_id)
    if ce.index is not None:
        body += _len(0x12, _num(0x08, ce.index))
    if ce.data is not None:
        body += _len(0x1A, _num(0x08, ce.data.byte_count) + _num(0x10, ce.data.packet_count))
    return body


def encode_entity(entity: Entity) -> bytes:
    """A serialized p4.v1.Entity."""
    if isinstance(entity, TableEntry):
        return _len(0x12, _table_entry_bytes(entity))
    if isinstance(entity, CounterEntry):
        return _len(0x3A, _counter_bytes(entity))
    if isinstance(entity, MulticastGroupEntry):
        return _len(0x4A, _group_bytes(entity))
    if entity.kind is None:
        return b""
    if entity.kind in ("clone_session_entry", "packet_replication_engine_entry"):
        inner = _len(0x12, b"") if entity.kind == "clone_session_entry" else b""
        return _len(0x4A, inner)
    return _len(_tag(ENTITY_KINDS.index(entity.kind) + 1, LEN), b"")


def encode_update(update: Update) -> bytes:
    """A serialized p4.v1.Update."""
    entity = b"" if update.entity == Unsupported(None) else \
        _len(0x12, encode_entity(update.entity))
    return _num(0x08, update.type) + entity


def encode_write_request(request: WriteRequest,
                         updates: Sequence[bytes] | None = None) -> bytes:
    """A serialized p4.v1.WriteRequest; `updates` (already encoded) replace request.updates."""
    parts = [_num(0x08, request.device_id), _num(0x10, request.role_id)]
    if request.election_id is not None:
        high, low = request.election_id
        parts.append(_len(0x1A, _num(0x08, high) + _num(0x10, low)))
    encoded = updates if updates is not None else [encode_update(u) for u in request.updates]
    parts += [_len(0x22, u) for u in encoded]
    parts.append(_num(0x28, request.atomicity))
    if request.role:
        parts.append(_len(0x32, request.role.encode()))
    return b"".join(parts)

"""hysync/p4rt_codec against the protobuf library: same bytes, same meaning, both ways.

The oracle is `records()`: the codec's records read off a message that the protobuf
library parsed. Any WriteRequest the library can express (within the fields the
records carry) must decode to the library's reading and encode to the library's bytes;
unknown fields must be skipped as the library skips them; and bytes the codec accepts
must be bytes the library reads the same way.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from p4.v1 import p4runtime_pb2 as p4r

from hysync import p4rt_codec

U32, U64 = (1 << 32) - 1, (1 << 64) - 1
I32 = st.integers(-(1 << 31), (1 << 31) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ the oracle
def records(msg: p4r.WriteRequest) -> p4rt_codec.WriteRequest:
    """What the codec must decode `msg`'s bytes to, read through the protobuf library."""
    election = ((msg.election_id.high, msg.election_id.low)
                if msg.HasField("election_id") else None)
    return p4rt_codec.WriteRequest(msg.device_id, msg.role_id, election,
                             tuple(p4rt_codec.Update(u.type, _entity(u)) for u in msg.updates),
                             msg.atomicity, msg.role)


def _entity(update: p4r.Update) -> p4rt_codec.Entity:
    if not update.HasField("entity"):
        return p4rt_codec.Unsupported(None)
    kind = update.entity.WhichOneof("entity")
    if kind == "table_entry":
        return _table_entry(update.entity.table_entry)
    if kind == "counter_entry":
        ce = update.entity.counter_entry
        return p4rt_codec.CounterEntry(
            ce.counter_id, ce.index.index if ce.HasField("index") else None,
            p4rt_codec.CounterData(ce.data.byte_count, ce.data.packet_count)
            if ce.HasField("data") else None)
    if kind == "packet_replication_engine_entry":
        pre = update.entity.packet_replication_engine_entry
        which = pre.WhichOneof("type")
        if which != "multicast_group_entry":
            return p4rt_codec.Unsupported(which or kind)
        g = pre.multicast_group_entry
        return p4rt_codec.MulticastGroupEntry(g.multicast_group_id, tuple(
            p4rt_codec.Replica(r.instance,
                         r.egress_port if r.WhichOneof("port_kind") == "egress_port" else None,
                         r.port if r.WhichOneof("port_kind") == "port" else None)
            for r in g.replicas), g.metadata)
    return p4rt_codec.Unsupported(kind)


def _table_entry(te: p4r.TableEntry) -> p4rt_codec.TableEntry:
    action: p4rt_codec.Action | str | None = None
    if te.HasField("action"):
        kind = te.action.WhichOneof("type")
        if kind == "action":
            a = te.action.action
            action = p4rt_codec.Action(a.action_id, tuple(p4rt_codec.Param(p.param_id, p.value)
                                                    for p in a.params))
        else:
            action = kind or p4rt_codec.NO_ACTION_KIND
    resources = frozenset(name for name in p4rt_codec.TABLE_RESOURCES.values() if te.HasField(name))
    return p4rt_codec.TableEntry(te.table_id, tuple(_match(fm) for fm in te.match), action,
                           te.priority, te.controller_metadata, te.is_default_action,
                           te.idle_timeout_ns, te.metadata, te.is_const, resources)


def _match(fm: p4r.FieldMatch) -> p4rt_codec.FieldMatch:
    kind = fm.WhichOneof("field_match_type")
    if kind in ("exact", "optional"):
        return p4rt_codec.FieldMatch(fm.field_id, kind, getattr(fm, kind).value)
    if kind == "ternary":
        return p4rt_codec.FieldMatch(fm.field_id, kind, fm.ternary.value, fm.ternary.mask)
    if kind == "range":
        return p4rt_codec.FieldMatch(fm.field_id, kind, fm.range.low, fm.range.high)
    if kind == "lpm":
        return p4rt_codec.FieldMatch(fm.field_id, kind, fm.lpm.value, prefix_len=fm.lpm.prefix_len)
    return p4rt_codec.FieldMatch(fm.field_id, kind)


# ------------------------------------------------------------------ messages
VALUES = st.binary(max_size=6)


@st.composite
def field_matches(draw: Any) -> p4r.FieldMatch:
    fm = p4r.FieldMatch(field_id=draw(st.integers(0, U32)))
    kind = draw(st.sampled_from(["exact", "ternary", "lpm", "range", "optional", "other",
                                 None]))
    if kind in ("exact", "optional"):
        getattr(fm, kind).value = draw(VALUES)
    elif kind == "ternary":
        fm.ternary.value, fm.ternary.mask = draw(VALUES), draw(VALUES)
    elif kind == "range":
        fm.range.low, fm.range.high = draw(VALUES), draw(VALUES)
    elif kind == "lpm":
        fm.lpm.value, fm.lpm.prefix_len = draw(VALUES), draw(I32)
    elif kind == "other":
        fm.other.SetInParent()
    return fm


@st.composite
def table_entries(draw: Any) -> p4r.TableEntry:
    te = p4r.TableEntry(table_id=draw(st.integers(0, U32)), priority=draw(I32),
                        controller_metadata=draw(st.integers(0, U64)),
                        is_default_action=draw(st.booleans()), idle_timeout_ns=draw(I64),
                        metadata=draw(VALUES), is_const=draw(st.booleans()))
    te.match.extend(draw(st.lists(field_matches(), max_size=4)))
    action = draw(st.sampled_from(["action", "member", "group", "set", "empty", None]))
    if action == "action":
        te.action.action.action_id = draw(st.integers(0, U32))
        for param_id, value in draw(st.lists(st.tuples(st.integers(0, U32), VALUES),
                                             max_size=3)):
            te.action.action.params.add(param_id=param_id, value=value)
    elif action == "member":
        te.action.action_profile_member_id = draw(st.integers(0, U32))
    elif action == "group":
        te.action.action_profile_group_id = draw(st.integers(0, U32))
    elif action == "set":
        te.action.action_profile_action_set.SetInParent()
    elif action == "empty":
        te.action.SetInParent()
    for name in draw(st.sets(st.sampled_from(sorted(p4rt_codec.TABLE_RESOURCES.values())))):
        getattr(te, name).SetInParent()
    return te


@st.composite
def entities(draw: Any) -> p4r.Entity | None:
    kind = draw(st.sampled_from(["table", "table", "counter", "group", "clone", "pre", "other",
                                 "empty", None]))
    entity = p4r.Entity()
    if kind == "table":
        entity.table_entry.CopyFrom(draw(table_entries()))
    elif kind == "counter":
        ce = entity.counter_entry
        ce.counter_id = draw(st.integers(0, U32))
        if draw(st.booleans()):
            ce.index.index = draw(I64)
        if draw(st.booleans()):
            ce.data.byte_count, ce.data.packet_count = draw(I64), draw(I64)
    elif kind == "group":
        g = entity.packet_replication_engine_entry.multicast_group_entry
        g.multicast_group_id, g.metadata = draw(st.integers(0, U32)), draw(VALUES)
        for port_kind, port, instance in draw(st.lists(st.tuples(
                st.sampled_from(["egress_port", "port", None]), st.integers(0, U32),
                st.integers(0, U32)), max_size=3)):
            r = g.replicas.add(instance=instance)
            if port_kind == "egress_port":
                r.egress_port = port
            elif port_kind == "port":
                r.port = port.to_bytes(4, "big")
    elif kind == "clone":
        entity.packet_replication_engine_entry.clone_session_entry.SetInParent()
    elif kind == "pre":
        entity.packet_replication_engine_entry.SetInParent()
    elif kind == "other":
        getattr(entity, draw(st.sampled_from([k for k in p4rt_codec.ENTITY_KINDS if k not in (
            "table_entry", "counter_entry", "packet_replication_engine_entry")]))).SetInParent()
    elif kind is None:
        return None
    return entity


@st.composite
def write_requests(draw: Any) -> p4r.WriteRequest:
    msg = p4r.WriteRequest(device_id=draw(st.integers(0, U64)),
                           role_id=draw(st.integers(0, U64)), role=draw(st.text(max_size=5)),
                           atomicity=draw(I32))
    if draw(st.booleans()):
        msg.election_id.high, msg.election_id.low = draw(st.integers(0, U64)), \
            draw(st.integers(0, U64))
    for utype, entity in draw(st.lists(st.tuples(I32, entities()), max_size=4)):
        update = msg.updates.add(type=utype)
        if entity is not None:
            update.entity.CopyFrom(entity)
    return msg


def unknown_fields(draw: Any) -> bytes:
    """Fields the messages do not define: new numbers with any wire type, and known numbers
    with a fixed-width wire type (no Write field is fixed-width: protobuf skips them)."""
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        number = draw(st.one_of(st.integers(1, 15), st.integers(1000, 5000)))
        kind = draw(st.sampled_from(
            [p4rt_codec.FIXED64, p4rt_codec.FIXED32] if number <= 15 else
            [p4rt_codec.VARINT, p4rt_codec.FIXED64, p4rt_codec.LEN, p4rt_codec.FIXED32,
             p4rt_codec.START_GROUP]))
        tag = p4rt_codec._uvarint(number << 3 | kind)
        if kind == p4rt_codec.VARINT:
            out += tag + p4rt_codec._uvarint(draw(st.integers(0, U64)))
        elif kind in (p4rt_codec.FIXED64, p4rt_codec.FIXED32):
            out += tag + draw(st.binary(min_size=8 if kind == p4rt_codec.FIXED64 else 4,
                                        max_size=8 if kind == p4rt_codec.FIXED64 else 4))
        elif kind == p4rt_codec.LEN:
            payload = draw(st.binary(max_size=5))
            out += tag + p4rt_codec._uvarint(len(payload)) + payload
        else:
            out += (tag + p4rt_codec._uvarint(7 << 3) + b"\x05"
                    + p4rt_codec._uvarint(number << 3 | 4))
    return out


# ------------------------------------------------------------------ properties
@SETTINGS
@given(write_requests())
def test_library_bytes_decode_to_the_library_records(msg: p4r.WriteRequest) -> None:
    assert p4rt_codec.decode_write_request(msg.SerializeToString()) == records(msg)


@SETTINGS
@given(write_requests())
def test_records_encode_to_the_library_bytes(msg: p4r.WriteRequest) -> None:
    data = p4rt_codec.encode_write_request(records(msg))
    assert records(p4r.WriteRequest.FromString(data)) == records(msg)
    if _carried_whole(msg):
        assert data == msg.SerializeToString()


def _carried_whole(msg: p4r.WriteRequest) -> bool:
    """Whether the records hold all of `msg`: not when an entity is empty (the records do not
    tell it from none) or an entry names an action profile (the records keep the kind)."""
    return all((u.entity.WhichOneof("entity") or not u.HasField("entity"))
               and u.entity.table_entry.action.WhichOneof("type") not in (
                   "action_profile_member_id", "action_profile_group_id")
               for u in msg.updates)


@SETTINGS
@given(write_requests(), st.data())
def test_unknown_fields_are_skipped_at_every_level(msg: p4r.WriteRequest, data: Any) -> None:
    # Unknown fields are merged into nested messages too: protobuf keeps and re-sends them.
    nested = [msg] + [u for u in msg.updates] + [u.entity for u in msg.updates] + \
        [u.entity.table_entry for u in msg.updates if u.entity.HasField("table_entry")] + \
        [fm for u in msg.updates for fm in u.entity.table_entry.match]
    for target in data.draw(st.lists(st.sampled_from(nested), max_size=3)):
        target.MergeFromString(unknown_fields(data.draw))
    raw = msg.SerializeToString()
    assert p4rt_codec.decode_write_request(raw) == records(p4r.WriteRequest.FromString(raw))


@SETTINGS
@given(write_requests(), write_requests())
def test_a_message_sent_in_two_parts_merges_as_protobuf_merges(
        first: p4r.WriteRequest, second: p4r.WriteRequest) -> None:
    # Concatenation is protobuf's merge: last scalar wins, repeated fields append, a singular
    # message merges, a oneof keeps its last member.
    raw = first.SerializeToString() + second.SerializeToString()
    assert p4rt_codec.decode_write_request(raw) == records(p4r.WriteRequest.FromString(raw))


def _library(raw: bytes) -> p4rt_codec.WriteRequest | None:
    try:
        return records(p4r.WriteRequest.FromString(raw))
    except (DecodeError, UnicodeDecodeError, RuntimeWarning):
        return None


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=64),
                 write_requests().map(lambda m: m.SerializeToString()).flatmap(
                     lambda raw: st.tuples(st.just(raw), st.integers(0, max(0, len(raw) - 1)),
                                           st.integers(0, 255)).map(
                         lambda t: t[0][:t[1]] + bytes([t[2]]) + t[0][t[1] + 1:]))))
@example(b"\x22\x05\x12\x03\x12\x01\x08")  # an update cut inside its table entry
@example(b"\x08" + b"\xff" * 10 + b"\x01")  # an 11-byte varint
@example(b"\x0f")  # wire type 7
@example(b'"\x05\x12\x03Z\x01\x00')  # a register entry, refused later, with field number 0
@example(b"\x00\x00")  # field number 0
@example(b"\x1c")  # an end-group with no start
@example(b"\x32\x01\xff")  # a role that is not UTF-8
def test_bytes_the_codec_accepts_the_library_reads_the_same(raw: bytes) -> None:
    try:
        decoded = p4rt_codec.decode_write_request(raw)
    except p4rt_codec.MalformedRequestError as err:
        assert str(err)  # refused, naming where; the library may be laxer (pure-Python)
        return
    assert decoded == _library(raw)


@pytest.mark.parametrize(("raw", "says"), [
    (b"\x22\x05\x12\x03\x12\x01\x08", "updates[0]: table_entry: truncated varint at byte 7"),
    (b"\x22\x05\x12\x03\x12\x01", "WriteRequest: field 4 at byte 2 runs 1 byte"),
    (b"\x08" + b"\xff" * 10 + b"\x01", "varint longer than 10 bytes"),
    (b"\x0f", "wire type 7"),
    (b"\x00\x00", "field number 0"),
    (b"\x1c", "end of group 3"),
    (b"\x32\x01\xff", "role at byte 2 is not UTF-8"),
    (b"\x1b\x08\x01", "group 3 has no end"),
    (b"\x22\x80", "truncated varint"),
    (b"\x0b" * 5000, "groups nested deeper than 100"),
])
def test_malformed_bytes_are_refused_naming_where(raw: bytes, says: str) -> None:
    pattern = says.replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(p4rt_codec.MalformedRequestError, match=pattern):
        p4rt_codec.decode_write_request(raw)

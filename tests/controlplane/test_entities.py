"""Entities encode to P4Runtime protobufs and decode back to equal values, with no switch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from p4.v1 import p4runtime_pb2 as p4r

from hysync import p4names
from hysync.controlplane.errors import EncodeError, SchemaError
from hysync.controlplane.p4rt import entities as ent
from hysync.controlplane.p4rt.entities import CounterCell, MulticastGroup, Replica, TableEntry
from hysync.p4schema import Schema

from .conftest import P4INFO

SCHEMA = Schema.from_file(P4INFO)  # hypothesis tests take no function-scoped fixture


@pytest.mark.parametrize(("value", "width", "expected"), [
    (0, 16, b"\x00"), (1, 16, b"\x01"), (255, 16, b"\xff"), (256, 16, b"\x01\x00"),
    (0xFFFF, 16, b"\xff\xff"), (511, 9, b"\x01\xff"), (2**48 - 1, 48, b"\xff" * 6),
])
def test_values_encode_as_canonical_bytestrings(value: int, width: int, expected: bytes) -> None:
    assert ent.encode_int(value, width, "x") == expected
    assert ent.decode_int(expected, width, "x") == value


def test_decoding_accepts_padding_but_not_overflow() -> None:
    assert ent.decode_int(b"\x00\x00\x05", 9, "x") == 5
    with pytest.raises(EncodeError, match="does not fit in 9 bits"):
        ent.decode_int(b"\x02\x00", 9, "x")


@pytest.mark.parametrize(("value", "message"), [
    (512, "port.* = 512 does not fit in 9 bits"), (-1, "negative"), (True, "integer"),
    ("1", "integer"),
])
def test_a_value_outside_its_field_is_refused_naming_the_field(schema: Schema, value: object,
                                                                message: str) -> None:
    entry = TableEntry(p4names.FORWARDING_L2, {"dst_addr": 1}, p4names.FORWARDING_SET_EGRESS_PORT,
                       {"port": value})  # type: ignore[dict-item]
    with pytest.raises(EncodeError, match=message):
        entry.encode(schema)


@given(st.integers(0, 2**16 - 1), st.integers(0, 2**8 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**16 - 1))
def test_members_entries_round_trip(job: int, worker: int, addr: int, port: int) -> None:
    schema = SCHEMA
    entry = TableEntry(p4names.ADMISSION_MEMBERS, {"job_id": job, "worker_id": worker,
                                                   "src_addr": addr, "src_port": port},
                       p4names.ADMISSION_ADMIT)
    msg = entry.encode(schema)
    for fm in msg.table_entry.match:  # canonical: no leading zero byte
        assert fm.exact.value == b"\x00" or fm.exact.value[0] != 0
    assert TableEntry.decode(msg, schema) == entry
    assert TableEntry.decode(p4r.Entity.FromString(msg.SerializeToString()), schema) == entry


@given(st.integers(0, 2**16 - 1), st.integers(0, 2**16 - 1), st.integers(1, 2**31 - 1),
       st.sampled_from([0, 1, 2]), st.integers(0, 255))
def test_range_entries_round_trip(low: int, high: int, priority: int, mode: int,
                                  quorum: int) -> None:
    schema = SCHEMA
    low, high = min(low, high), max(low, high)
    entry = TableEntry(p4names.SYNC_MODE_MODES, {"job_id": 3, "slot": (low, high)},
                       p4names.SYNC_MODE_SET_MODE, {"mode": mode, "quorum": quorum},
                       priority=priority)
    assert TableEntry.decode(entry.encode(schema), schema) == entry


def test_a_full_range_is_a_dont_care_and_is_omitted(schema: Schema) -> None:
    entry = TableEntry(p4names.SYNC_MODE_MODES, {"job_id": 1, "slot": (0, 0xFFFF)},
                       p4names.SYNC_MODE_SET_MODE, {"mode": 0, "quorum": 0}, priority=1)
    msg = entry.encode(schema)
    assert [fm.field_id for fm in msg.table_entry.match] == [1]
    assert TableEntry.decode(msg, schema) == entry


def test_range_tables_need_a_priority_and_exact_tables_refuse_one(schema: Schema) -> None:
    with pytest.raises(EncodeError, match="priority >= 1"):
        TableEntry(p4names.SYNC_MODE_MODES, {"job_id": 1, "slot": (0, 3)},
                   p4names.SYNC_MODE_SET_MODE,
                   {"mode": 0, "quorum": 0}).encode(schema)
    with pytest.raises(EncodeError, match="priority must be 0"):
        TableEntry(p4names.ADMISSION_JOBS, {"job_id": 1}, p4names.ADMISSION_SET_JOB,
                   {"slot_base": 0, "slot_count": 1, "members": 1, "mcast_grp": 1, "epoch": 1},
                   priority=5).encode(schema)


def test_malformed_entries_are_refused_before_anything_is_sent(schema: Schema) -> None:
    with pytest.raises(EncodeError, match="low 9 is above high 3"):
        TableEntry(p4names.SYNC_MODE_MODES, {"job_id": 1, "slot": (9, 3)},
                   p4names.SYNC_MODE_SET_MODE,
                   {"mode": 0, "quorum": 0}, priority=1).encode(schema)
    with pytest.raises(EncodeError, match="exact match field 'worker_id' is missing"):
        TableEntry(p4names.ADMISSION_MEMBERS, {"job_id": 1, "src_addr": 1, "src_port": 1},
                   p4names.ADMISSION_ADMIT).encode(schema)
    with pytest.raises(EncodeError, match="needs parameter.*mcast_grp"):
        TableEntry(p4names.ADMISSION_JOBS, {"job_id": 1}, p4names.ADMISSION_SET_JOB,
                   {"slot_base": 0, "slot_count": 1, "members": 1, "epoch": 1}).encode(schema)
    with pytest.raises(SchemaError, match="not an action of table"):
        TableEntry(p4names.ADMISSION_JOBS, {"job_id": 1}, p4names.ADMISSION_ADMIT).encode(schema)
    with pytest.raises(SchemaError, match="did you mean 'members'"):
        TableEntry(p4names.ADMISSION_JOBS, {"job_id": 1}, p4names.ADMISSION_SET_JOB,
                   {"slot_base": 0, "slot_count": 1, "member": 1, "mcast_grp": 1, "epoch": 1,
                    "members": 1}).encode(schema)


def test_entries_are_values(schema: Schema) -> None:
    match = {"job_id": 1}
    params = {"slot_base": 0, "slot_count": 8, "members": 4, "mcast_grp": 1, "epoch": 1}
    a = TableEntry(p4names.ADMISSION_JOBS, match, p4names.ADMISSION_SET_JOB, params)
    match["job_id"] = 2  # the entry holds its own copy
    b = TableEntry(p4names.ADMISSION_JOBS, {"job_id": 1}, p4names.ADMISSION_SET_JOB, dict(params))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.priority = 3  # type: ignore[misc]


def test_multicast_groups_round_trip_as_sets_of_replicas(schema: Schema) -> None:
    group = MulticastGroup(7, (Replica(2, 232), Replica(1, 225), Replica(1, 225)))
    assert group.replicas == (Replica(1, 225), Replica(2, 232))
    msg = group.encode(schema)
    replicas = msg.packet_replication_engine_entry.multicast_group_entry.replicas
    assert [(r.egress_port, r.instance) for r in replicas] == [(1, 225), (2, 232)]
    assert MulticastGroup.decode(msg, schema) == group
    # P4Runtime 1.4's bytes `port` decodes to the same value.
    msg2 = p4r.Entity()
    g = msg2.packet_replication_engine_entry.multicast_group_entry
    g.multicast_group_id = 7
    g.replicas.add(port=b"\x02", instance=232)
    g.replicas.add(port=b"\x01", instance=225)
    assert MulticastGroup.decode(msg2, schema) == group


def test_counter_cells_round_trip_and_check_the_index(schema: Schema) -> None:
    cell = CounterCell(p4names.STATS_LATE, 33, packets=5, bytes=1500)
    assert CounterCell.decode(cell.encode(schema), schema) == cell
    with pytest.raises(EncodeError, match="cells 0..4095"):
        ent.counter_query(schema, p4names.STATS_DROPS, 4096)
    assert not ent.counter_query(schema, "drops").counter_entry.HasField("index")


def test_updates_describe_themselves(schema: Schema) -> None:
    update = ent.insert(TableEntry(p4names.SYNC_MODE_MODES, {"job_id": 1, "slot": (0, 7)},
                                   p4names.SYNC_MODE_SET_MODE,
                                   {"mode": 1, "quorum": 3}, priority=2))
    assert str(update) == ("INSERT HySyncIngress.sync_mode.modes[job_id=1, slot=0..7] "
                           "priority 2 -> HySyncIngress.sync_mode.set_mode(mode=1, quorum=3)")
    assert update.encode(schema).type == p4r.Update.INSERT

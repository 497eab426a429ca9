"""The roles table (docs/protocol.md §8, §11) written over real P4Runtime gRPC on both engines:
an entry's insert, modify and delete set the job's level on the pipeline, a role written with
its job in one Write reaches packets with it, and a role no switch can run is refused."""

from __future__ import annotations

import numpy as np
import pytest
from p4.v1 import p4runtime_pb2 as p4r

from hysync import p4names, wire
from hysync.softswitch.levels import JobRole, Level, Uplink
from hysync.softswitch.pipeline import Pipeline
from hysync.wire import Op

from .conftest import DELETE, INSERT, MODIFY, Client, Names, group, p4_errors, table_entry, update

JOB = 3
SPINE_ADDR, SPINE_MAC, LEAF_ADDR, UPLINK_ID = 0x0A000001, 0x02000000A001, 0x0A010001, 5


def role_entry(names: Names, level: int, uplink_id: int = 0, spine_addr: int = 0,
               spine_mac: int = 0, leaf_addr: int = 0, job: int = JOB) -> p4r.TableEntry:
    return table_entry(names, p4names.ADMISSION_ROLES, {"job_id": job},
                       p4names.ADMISSION_SET_ROLE,
                       {"level": level, "uplink_id": uplink_id, "spine_addr": spine_addr,
                        "spine_mac": spine_mac, "leaf_addr": leaf_addr})


def leaf_entry(names: Names) -> p4r.TableEntry:
    return role_entry(names, Level.LEAF, UPLINK_ID, SPINE_ADDR, SPINE_MAC, LEAF_ADDR)


def refusal(controller: Client, te: p4r.TableEntry) -> str:
    with pytest.raises(Exception) as info:
        controller.write(update(INSERT, table_entry=te))
    (error,) = p4_errors(info.value)
    assert error.canonical_code == 3, error  # INVALID_ARGUMENT
    return error.message


def test_a_roles_entry_sets_the_level_and_its_delete_makes_the_job_single(
        controller: Client, names: Names, pipeline: Pipeline) -> None:
    assert pipeline.role(JOB).level == Level.SINGLE
    te = leaf_entry(names)
    controller.write(update(INSERT, table_entry=te))
    assert pipeline.role(JOB) == JobRole(Level.LEAF,
                                         Uplink(SPINE_ADDR, SPINE_MAC, UPLINK_ID, LEAF_ADDR))
    assert controller.read_table(names.table_id(p4names.ADMISSION_ROLES)) == [te]

    controller.write(update(MODIFY, table_entry=role_entry(names, Level.SPINE)))
    assert pipeline.role(JOB) == JobRole(Level.SPINE)

    controller.write(update(MODIFY, table_entry=role_entry(names, Level.SINGLE)))
    assert pipeline.role(JOB).level == Level.SINGLE

    controller.write(update(MODIFY, table_entry=role_entry(names, Level.SPINE)))
    controller.write(update(DELETE, table_entry=table_entry(names, p4names.ADMISSION_ROLES,
                                                            {"job_id": JOB})))
    assert pipeline.role(JOB).level == Level.SINGLE
    assert controller.read_table(names.table_id(p4names.ADMISSION_ROLES)) == []


def test_set_role_is_the_roles_entry_a_client_reads(controller: Client, names: Names,
                                                    pipeline: Pipeline) -> None:
    pipeline.set_role(JOB, JobRole(Level.LEAF, Uplink(SPINE_ADDR, SPINE_MAC, UPLINK_ID,
                                                      LEAF_ADDR)))
    assert controller.read_table(names.table_id(p4names.ADMISSION_ROLES)) == [leaf_entry(names)]
    pipeline.set_role(JOB, None)
    assert controller.read_table(names.table_id(p4names.ADMISSION_ROLES)) == []


@pytest.mark.parametrize(("params", "says"), [
    ({"level": 3}, "level 3 is not a level: use 0 (single), 1 (leaf) or 2 (spine)"),
    ({"level": Level.SPINE, "spine_addr": SPINE_ADDR}, "a spine job has no uplink"),
    ({"level": Level.SINGLE, "uplink_id": 1}, "a single job has no uplink"),
    ({"level": Level.LEAF, "uplink_id": 32, "spine_addr": SPINE_ADDR},
     "uplink_id 32 is out of range"),
])
def test_a_role_no_switch_can_run_is_refused_and_changes_nothing(
        controller: Client, names: Names, pipeline: Pipeline, params: dict[str, int],
        says: str) -> None:
    assert says in refusal(controller, role_entry(names, **params))
    assert pipeline.role(JOB).level == Level.SINGLE
    assert not pipeline.tables[p4names.ADMISSION_ROLES].entries


def test_a_role_written_with_its_job_reaches_packets_with_it(
        controller: Client, names: Names, pipeline: Pipeline) -> None:
    """One Write: two leaves as members, the spine role, then the job. The spine weighs each
    uplink by its count byte: the RESULT's count is the hosts (3 + 4), not the leaves (2)."""
    leaves = [(0, 0x0A010001), (1, 0x0A010101)]
    updates = [update(INSERT, group=group(1, [(1, wire.member_rid(JOB, w)) for w, _ in leaves]))]
    for w, addr in leaves:
        updates.append(update(INSERT, table_entry=table_entry(
            names, p4names.ADMISSION_MEMBERS,
            {"job_id": JOB, "worker_id": w, "src_addr": addr, "src_port": wire.HYSYNC_UDP_PORT},
            p4names.ADMISSION_ADMIT)))
        updates.append(update(INSERT, table_entry=table_entry(
            names, p4names.REPLICATION_REWRITE, {"egress_rid": wire.member_rid(JOB, w)},
            p4names.REPLICATION_REWRITE_DST,
            {"dst_mac": 1, "dst_addr": addr, "dst_port": wire.HYSYNC_UDP_PORT})))
    updates.append(update(INSERT, table_entry=role_entry(names, Level.SPINE)))
    updates.append(update(INSERT, table_entry=table_entry(
        names, p4names.ADMISSION_JOBS, {"job_id": JOB}, p4names.ADMISSION_SET_JOB,
        {"slot_base": 0, "slot_count": 4, "members": 2, "mcast_grp": 1, "epoch": 7})))
    controller.write(*updates)

    out = []
    for (w, addr), hosts in zip(leaves, (3, 4), strict=True):
        head = wire.Header(op=Op.CONTRIB, job_id=JOB, worker_id=w, count=hosts, slot=1,
                           round=0, chunk=0, flags=1 << wire.TX_SHIFT).pack()
        lanes = np.full(wire.LANES, w + 1, dtype=">i4").tobytes()
        out += pipeline.process_datagram(addr, wire.HYSYNC_UDP_PORT, head + lanes)
    assert len(out) == 2
    for _ip, _port, datagram in out:
        result = wire.Header.unpack(datagram)
        assert (result.op, result.count, result.bitmap) == (Op.RESULT, 7, 0b11)
        assert np.frombuffer(datagram, ">i4", wire.LANES, wire.HEADER_BYTES)[0] == 3


def test_a_p4info_without_the_roles_table_binds_and_has_no_role_to_write(
        connect, p4info, names: Names, pipeline: Pipeline) -> None:
    """The TNA program runs one level: its P4Info has no roles table, and a write naming the
    table is refused."""
    one_level = type(p4info)()
    one_level.CopyFrom(p4info)
    roles = names.table_id(p4names.ADMISSION_ROLES)
    kept = [t for t in one_level.tables if t.preamble.id != roles]
    del one_level.tables[:]
    one_level.tables.extend(kept)
    client = connect()
    assert client.arbitrate(10).status.code == 0
    client.set_pipeline(one_level)
    with pytest.raises(Exception) as info:
        client.write(update(INSERT, table_entry=leaf_entry(names)))
    (error,) = p4_errors(info.value)
    assert f"unknown table id {roles}" in error.message
    assert pipeline.role(JOB).level == Level.SINGLE

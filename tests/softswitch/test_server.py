"""The softswitch's P4Runtime server, over real gRPC on 127.0.0.1 (no mocks)."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import grpc
import numpy as np
import pytest
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4r
from p4.v1 import p4runtime_pb2_grpc

from hysync import p4names, wire
from hysync.softswitch import pipeline as pipeline_module
from hysync.softswitch.p4binding import BoundCounter
from hysync.softswitch.p4read import encode_counters
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.server import serve
from hysync.softswitch.tables import Entry, Replica
from hysync.softswitch.udp_dataplane import UdpDataPlane

from .conftest import (
    CONTROLLER_ELECTION_ID,
    DELETE,
    DEVICE_ID,
    INSERT,
    MODIFY,
    P4INFO_PATH,
    REPO,
    Client,
    Config,
    Names,
    enc,
    group,
    p4_errors,
    table_entry,
    uint128,
    update,
)

OK, ALREADY_EXISTS, NOT_FOUND = 0, 6, 5
CODE = grpc.StatusCode


def job_entry(names: Names, job: int = 1, slot_base: int = 0, slot_count: int = 16,
              members: int = 2, mcast_grp: int = 1, epoch: int = 1) -> p4r.TableEntry:
    return table_entry(names, p4names.ADMISSION_JOBS, {"job_id": job}, p4names.ADMISSION_SET_JOB,
                       {"slot_base": slot_base, "slot_count": slot_count, "members": members,
                        "mcast_grp": mcast_grp, "epoch": epoch})


def rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def batch_error(client: Client, *updates: p4r.Update) -> list[p4r.Error]:
    """Write a batch that must fail; return its per-update errors (and check the envelope)."""
    err = rpc_error(client.write, *updates)
    assert err.code() == CODE.UNKNOWN, err.details()
    errors = p4_errors(err)
    assert len(errors) == len(updates)
    return errors


def single_error(client: Client, u: p4r.Update) -> p4r.Error:
    (error,) = batch_error(client, u)
    return error


# ================================================================ capabilities
def test_capabilities_reports_p4runtime_1_4_1(connect):
    response = connect().stub.Capabilities(p4r.CapabilitiesRequest(), timeout=5)
    assert response.p4runtime_api_version == "1.4.1"


# ================================================================ arbitration
def test_first_controller_becomes_primary(connect):
    arb = connect().arbitrate(5)
    assert arb.status.code == OK
    assert arb.device_id == DEVICE_ID
    assert (arb.election_id.high, arb.election_id.low) == (0, 5)


def test_higher_election_id_takes_over_and_old_primary_is_told(connect):
    a, b = connect(), connect()
    assert a.arbitrate(5).status.code == OK
    arb_b = b.arbitrate(7)
    assert arb_b.status.code == OK
    arb_a = a.next_arbitration()
    assert arb_a.status.code == ALREADY_EXISTS
    assert arb_a.election_id.low == 7  # who the primary is now


def test_lower_election_id_joins_as_backup_without_disturbing_primary(connect):
    a, b = connect(), connect()
    a.arbitrate(7)
    arb_b = b.arbitrate(5)
    assert arb_b.status.code == ALREADY_EXISTS
    assert arb_b.election_id.low == 7
    assert a.no_message()


def test_backup_write_is_refused_naming_the_primary(connect, p4info, names):
    a, b = connect(), connect()
    a.arbitrate(5)
    b.arbitrate(7)
    b.set_pipeline(p4info)
    err = rpc_error(a.write, update(INSERT, table_entry=job_entry(names)))
    assert err.code() == CODE.PERMISSION_DENIED
    assert "primary" in err.details() and "7" in err.details()
    b.write(update(INSERT, table_entry=job_entry(names)))  # the primary may
    assert len(b.read_table(names.table_id(p4names.ADMISSION_JOBS))) == 1


def test_write_without_arbitration_is_permission_denied(connect, p4info, names):
    client = connect()
    err = rpc_error(client.set_pipeline, p4info, election_id=1)
    assert err.code() == CODE.PERMISSION_DENIED
    assert "MasterArbitrationUpdate" in err.details()


def test_primary_disconnect_notifies_backups_and_leaves_no_primary(connect, p4info):
    a, b = connect(), connect()
    a.arbitrate(7)
    b.arbitrate(5)
    a.close_stream()
    arb = b.next_arbitration()
    assert arb.status.code == NOT_FOUND  # no primary now
    assert arb.election_id.low == 7
    assert rpc_error(b.set_pipeline, p4info).code() == CODE.PERMISSION_DENIED
    # spec §5: a new primary needs an election id >= the highest ever seen
    assert b.arbitrate(8).status.code == OK
    b.set_pipeline(p4info)


def test_primary_that_reconnects_with_same_election_id_is_primary_again(connect):
    a = connect()
    a.arbitrate(7)
    a.close_stream()
    a2 = connect()
    assert a2.arbitrate(7).status.code == OK


def test_duplicate_election_id_terminates_the_stream(connect):
    a, b = connect(), connect()
    a.arbitrate(7)
    b.send_arbitration(7)
    err = b.next_message()
    assert isinstance(err, grpc.RpcError)
    assert err.code() == CODE.INVALID_ARGUMENT
    assert "already used" in err.details()


def test_unknown_device_id_terminates_the_stream(connect):
    client = connect()
    client.send_arbitration(3, device_id=99)
    err = client.next_message()
    assert isinstance(err, grpc.RpcError)
    assert err.code() == CODE.NOT_FOUND
    assert "device" in err.details()


def test_unset_election_id_is_a_backup_that_never_becomes_primary(connect):
    client = connect()
    arb = client.arbitrate(None)
    assert arb.status.code == NOT_FOUND  # no primary at all yet
    assert not arb.HasField("election_id")


def test_roles_are_arbitrated_independently(connect):
    a, b = connect(), connect()
    assert a.arbitrate(5, role="left").status.code == OK
    assert b.arbitrate(5, role="right").status.code == OK


def test_role_config_is_refused(connect):
    client = connect()
    msg = p4r.StreamMessageRequest()
    msg.arbitration.device_id = DEVICE_ID
    msg.arbitration.election_id.low = 1
    msg.arbitration.role.name = "r"
    msg.arbitration.role.config.type_url = "example.com/x"
    client.open_stream()
    client.send(msg)
    err = client.next_message()
    assert isinstance(err, grpc.RpcError) and err.code() == CODE.INVALID_ARGUMENT


def test_packet_out_is_answered_with_a_stream_error(connect):
    client = connect()
    client.arbitrate(3)
    msg = p4r.StreamMessageRequest()
    msg.packet.payload = b"\x00" * 20
    client.send(msg)
    response = client.next_message()
    assert response.WhichOneof("update") == "error"
    assert response.error.canonical_code == CODE.UNIMPLEMENTED.value[0]
    assert response.error.packet_out.packet_out.payload == b"\x00" * 20


def test_wrong_device_id_on_write_is_not_found(controller, names):
    err = rpc_error(controller.write, update(INSERT, table_entry=job_entry(names)), device_id=2)
    assert err.code() == CODE.NOT_FOUND


# ============================================================ pipeline config
def test_write_and_read_before_a_pipeline_config_fail_precondition(connect, names):
    client = connect()
    client.arbitrate(1)
    err = rpc_error(client.write, update(INSERT, table_entry=job_entry(names)))
    assert err.code() == CODE.FAILED_PRECONDITION
    assert "SetForwardingPipelineConfig" in err.details()
    err = rpc_error(client.read_table)
    assert err.code() == CODE.FAILED_PRECONDITION


def test_get_pipeline_config_is_empty_before_one_is_pushed(connect):
    assert not connect().get_pipeline().HasField("config")


def test_pushed_p4info_is_returned_by_get(connect, p4info):
    client = connect()
    client.arbitrate(1)
    client.set_pipeline(p4info, device_config=b"{bmv2 json}", cookie=42)
    all_ = client.get_pipeline(p4r.GetForwardingPipelineConfigRequest.ALL).config
    assert all_.p4info == p4info
    assert all_.p4_device_config == b"{bmv2 json}"
    assert all_.cookie.cookie == 42
    cookie = client.get_pipeline(p4r.GetForwardingPipelineConfigRequest.COOKIE_ONLY).config
    assert cookie.cookie.cookie == 42 and not cookie.HasField("p4info")
    info = client.get_pipeline(p4r.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE).config
    assert info.p4info == p4info and not info.p4_device_config


def _mutated(p4info: p4info_pb2.P4Info, how: str) -> p4info_pb2.P4Info:
    bad = p4info_pb2.P4Info()
    bad.CopyFrom(p4info)
    tables = {t.preamble.name: t for t in bad.tables}
    actions = {a.preamble.name: a for a in bad.actions}
    if how == "field width":
        tables[p4names.ADMISSION_MEMBERS].match_fields[1].bitwidth = 16
    elif how == "match kind":
        slot = next(f for f in tables[p4names.SYNC_MODE_MODES].match_fields if f.name == "slot")
        slot.match_type = p4info_pb2.MatchField.EXACT
    elif how == "missing table":
        bad.tables.remove(tables[p4names.REPLICATION_REWRITE])
    elif how == "missing counter":
        del bad.counters[0]
    elif how == "counter size":
        bad.counters[0].size = 1024
    elif how == "param width":
        actions[p4names.ADMISSION_SET_JOB].params[0].bitwidth = 32
    elif how == "extra field":
        tables[p4names.ADMISSION_JOBS].match_fields.add(id=9, name="vlan", bitwidth=12,
                                      match_type=p4info_pb2.MatchField.EXACT)
    elif how == "table size":
        tables[p4names.FORWARDING_L2].size = 16
    return bad


@pytest.mark.parametrize("how, named", [
    ("field width", "worker_id"), ("match kind", "slot"),
    ("missing table", p4names.REPLICATION_REWRITE),
    ("missing counter", p4names.STATS_CONTRIBUTIONS),
    ("counter size", p4names.STATS_CONTRIBUTIONS), ("param width", "slot_base"),
    ("extra field", "vlan"), ("table size", p4names.FORWARDING_L2),
])
def test_mismatching_p4info_is_rejected_naming_the_mismatch(controller, p4info, names, how,
                                                            named):
    controller.write(update(INSERT, table_entry=job_entry(names)))
    err = rpc_error(controller.set_pipeline, _mutated(p4info, how))
    assert err.code() == CODE.INVALID_ARGUMENT
    assert named in err.details()
    assert len(controller.read_table()) == 1  # the rejected push changed nothing
    assert controller.get_pipeline().config.p4info == p4info


def test_config_without_p4info_is_invalid(connect):
    client = connect()
    client.arbitrate(1)
    err = rpc_error(client.set_pipeline, None)
    assert err.code() == CODE.INVALID_ARGUMENT and "p4info" in err.details()


def test_verify_checks_without_changing_state(controller, p4info, names):
    controller.write(update(INSERT, table_entry=job_entry(names)))
    controller.set_pipeline(p4info, Config.VERIFY)
    assert len(controller.read_table()) == 1
    err = rpc_error(controller.set_pipeline, _mutated(p4info, "field width"), Config.VERIFY)
    assert err.code() == CODE.INVALID_ARGUMENT


def test_verify_and_commit_clears_tables_groups_and_counters(controller, p4info, names,
                                                             pipeline):
    controller.write(update(INSERT, table_entry=job_entry(names)),
                     update(INSERT, group=group(1, [(1, 33)])))
    pipeline.counters[p4names.STATS_CONTRIBUTIONS].count(5, 100)
    controller.set_pipeline(p4info, Config.VERIFY_AND_COMMIT)
    assert controller.read_table() == []
    assert not pipeline.groups
    assert pipeline.counters[p4names.STATS_CONTRIBUTIONS].packets[5] == 0


def test_reconcile_and_commit_keeps_state(controller, p4info, names):
    controller.write(update(INSERT, table_entry=job_entry(names)))
    controller.set_pipeline(p4info, Config.RECONCILE_AND_COMMIT)
    assert len(controller.read_table()) == 1


def test_verify_and_save_then_commit_keeps_the_writes_in_between(controller, p4info, names):
    controller.set_pipeline(p4info, Config.VERIFY_AND_SAVE)
    controller.write(update(INSERT, table_entry=job_entry(names)))
    controller.set_pipeline(None, Config.COMMIT)
    assert len(controller.read_table()) == 1


def test_commit_without_a_saved_config_is_not_found(controller):
    err = rpc_error(controller.set_pipeline, None, Config.COMMIT)
    assert err.code() == CODE.NOT_FOUND and "VERIFY_AND_SAVE" in err.details()


def test_preloaded_p4info_serves_without_a_push(pipeline, p4info, names):
    server, port = serve(pipeline, "127.0.0.1:0", p4info=p4info)
    client = Client(port)
    try:
        client.arbitrate(1)
        client.write(update(INSERT, table_entry=job_entry(names)))
        assert len(client.read_table()) == 1
    finally:
        client.close()
        server.stop(None)


# ============================================================= table entries
def test_insert_read_modify_delete_round_trip(controller, names, pipeline):
    te = job_entry(names, slot_base=16, slot_count=32, members=4, mcast_grp=3)
    controller.write(update(INSERT, table_entry=te))
    # read-write symmetry
    assert controller.read_table(names.table_id(p4names.ADMISSION_JOBS)) == [te]
    assert pipeline.tables[p4names.ADMISSION_JOBS].entries[((1,), 0)] == Entry(
        p4names.ADMISSION_JOBS, (1,), p4names.ADMISSION_SET_JOB, (16, 32, 4, 3, 1))

    changed = job_entry(names, slot_base=0, slot_count=8, members=3, mcast_grp=3)
    controller.write(update(MODIFY, table_entry=changed))
    assert controller.read_table(names.table_id(p4names.ADMISSION_JOBS)) == [changed]
    assert pipeline.tables[p4names.ADMISSION_JOBS].entries[((1,), 0)].params == (0, 8, 3, 3, 1)

    key_only = table_entry(names, p4names.ADMISSION_JOBS, {"job_id": 1})
    controller.write(update(DELETE, table_entry=key_only))
    assert controller.read_table() == []
    assert not pipeline.tables[p4names.ADMISSION_JOBS].entries


def test_members_key_is_stored_in_pipeline_order(controller, names, pipeline):
    te = table_entry(names, p4names.ADMISSION_MEMBERS, {"job_id": 2, "worker_id": 3,
                                      "src_addr": wire.ip_to_int("10.0.0.3"),
                                      "src_port": 5000}, p4names.ADMISSION_ADMIT)
    del te.match[:]  # send the fields in reverse order: the server maps them by id
    for name, value in reversed([("job_id", 2), ("worker_id", 3),
                                 ("src_addr", wire.ip_to_int("10.0.0.3")), ("src_port", 5000)]):
        field_id = names.field(p4names.ADMISSION_MEMBERS, name).id
        te.match.add(field_id=field_id).exact.value = enc(value)
    controller.write(update(INSERT, table_entry=te))
    (entry,) = pipeline.tables[p4names.ADMISSION_MEMBERS].entries.values()
    assert entry.match == (2, 3, wire.ip_to_int("10.0.0.3"), 5000)
    assert entry.action == p4names.ADMISSION_ADMIT


def test_non_canonical_bytestrings_are_accepted_and_read_back_canonical(controller, names):
    te = job_entry(names, slot_base=5)
    te.match[0].exact.value = enc(1, 2)  # b"\x00\x01"
    for p in te.action.action.params:
        p.value = b"\x00\x00" + p.value
    controller.write(update(INSERT, table_entry=te))
    assert controller.read_table() == [job_entry(names, slot_base=5)]


def test_duplicate_insert_is_already_exists(controller, names):
    controller.write(update(INSERT, table_entry=job_entry(names)))
    error = single_error(controller, update(INSERT, table_entry=job_entry(names)))
    assert error.canonical_code == CODE.ALREADY_EXISTS.value[0]
    assert "MODIFY" in error.message


def test_delete_or_modify_of_a_missing_entry_is_not_found(controller, names):
    error = single_error(controller, update(DELETE, table_entry=job_entry(names, job=9)))
    assert error.canonical_code == CODE.NOT_FOUND.value[0]
    assert "job_id=9" in error.message
    error = single_error(controller, update(MODIFY, table_entry=job_entry(names, job=9)))
    assert error.canonical_code == CODE.NOT_FOUND.value[0]


def test_modify_without_action_keeps_the_action(controller, names):
    controller.write(update(INSERT, table_entry=job_entry(names, members=3)))
    controller.write(update(MODIFY, table_entry=table_entry(names, p4names.ADMISSION_JOBS,
                                                            {"job_id": 1})))
    assert controller.read_table() == [job_entry(names, members=3)]


@pytest.mark.parametrize("what", ["table", "field", "action", "param"])
def test_unknown_ids_are_invalid_argument_naming_them(controller, names, what):
    te = job_entry(names)
    if what == "table":
        te.table_id = 12345
    elif what == "field":
        te.match[0].field_id = 77
    elif what == "action":
        te.action.action.action_id = 999
    else:
        te.action.action.params[0].param_id = 42
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.INVALID_ARGUMENT.value[0]
    assert {"table": "12345", "field": "77", "action": "999", "param": "42"}[what] in error.message


def test_action_of_another_table_is_invalid_argument(controller, names):
    te = table_entry(names, p4names.ADMISSION_JOBS, {"job_id": 1}, p4names.ADMISSION_ADMIT)
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.INVALID_ARGUMENT.value[0]
    assert p4names.ADMISSION_ADMIT in error.message and p4names.ADMISSION_JOBS in error.message


def test_default_only_action_on_an_entry_is_permission_denied(controller, names):
    te = table_entry(names, p4names.ADMISSION_JOBS, {"job_id": 1}, p4names.NO_ACTION)
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.PERMISSION_DENIED.value[0]


def test_missing_param_is_invalid_argument(controller, names):
    te = job_entry(names)
    del te.action.action.params[-1]
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.INVALID_ARGUMENT.value[0]
    assert "epoch" in error.message


@pytest.mark.parametrize("where", ["match", "param"])
def test_values_wider_than_the_p4info_bitwidth_are_out_of_range(controller, names, where):
    te = job_entry(names)
    if where == "match":
        te.match[0].exact.value = enc(1 << 16)  # job_id is 16 bits
    else:
        te.action.action.params[2].value = enc(256)  # members is 8 bits
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.OUT_OF_RANGE.value[0]
    assert "bits" in error.message


def test_empty_bytestring_is_rejected(controller, names):
    te = job_entry(names)
    te.match[0].exact.value = b""
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.OUT_OF_RANGE.value[0]


def test_range_table_needs_a_priority(controller, names):
    te = table_entry(names, p4names.SYNC_MODE_MODES, {"job_id": 1, "slot": (0, 7)},
                     p4names.SYNC_MODE_SET_MODE,
                     {"mode": 1, "quorum": 2})
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.INVALID_ARGUMENT.value[0]
    assert "priority" in error.message


def test_exact_table_refuses_a_priority(controller, names):
    te = job_entry(names)
    te.priority = 3
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.INVALID_ARGUMENT.value[0]
    assert "priority" in error.message


def test_range_entries_round_trip_and_omitted_range_is_dont_care(controller, names, pipeline):
    ranged = table_entry(names, p4names.SYNC_MODE_MODES, {"job_id": 1, "slot": (8, 15)},
                         p4names.SYNC_MODE_SET_MODE,
                         {"mode": 2, "quorum": 0}, priority=10)
    everything = table_entry(names, p4names.SYNC_MODE_MODES, {"job_id": 1},
                             p4names.SYNC_MODE_SET_MODE,
                             {"mode": 1, "quorum": 3}, priority=1)
    controller.write(update(INSERT, table_entry=ranged), update(INSERT, table_entry=everything))
    read = controller.read_table(names.table_id(p4names.SYNC_MODE_MODES))
    assert sorted(read, key=lambda t: t.priority) == [everything, ranged]
    assert pipeline._desired_mode(1, 9) == (2, 0)  # the higher priority range wins
    assert pipeline._desired_mode(1, 100) == (1, 3)


def test_explicit_full_range_must_be_omitted(controller, names):
    te = table_entry(names, p4names.SYNC_MODE_MODES, {"job_id": 1, "slot": (0, 0xFFFF)},
                     p4names.SYNC_MODE_SET_MODE,
                     {"mode": 1, "quorum": 0}, priority=1)
    error = single_error(controller, update(INSERT, table_entry=te))
    assert error.canonical_code == CODE.INVALID_ARGUMENT.value[0]
    assert "omit" in error.message


def test_invalid_batch_is_rejected_whole_and_changes_nothing(controller, names, pipeline):
    good = job_entry(names, job=1)
    bad = job_entry(names, job=2)
    bad.action.action.params[2].value = enc(300)
    errors = batch_error(controller, update(INSERT, table_entry=good),
                         update(INSERT, table_entry=bad),
                         update(INSERT, group=group(1, [(1, 33)])))
    assert [e.canonical_code for e in errors] == [
        CODE.ABORTED.value[0], CODE.OUT_OF_RANGE.value[0], CODE.ABORTED.value[0]]
    assert controller.read_table() == []
    assert not pipeline.groups and not pipeline.tables[p4names.ADMISSION_JOBS].entries


def _raw_write(client: Client, data: bytes) -> None:
    send = client.channel.unary_unary("/p4.v1.P4Runtime/Write", request_serializer=None,
                                      response_deserializer=p4r.WriteResponse.FromString)
    send(data, timeout=10)


@pytest.mark.parametrize("cut", ["last byte", "inside an entry", "garbage"])
def test_malformed_write_bytes_are_invalid_argument_and_change_nothing(controller, names,
                                                                       pipeline, cut):
    controller.write(update(INSERT, table_entry=job_entry(names, job=1)))
    before = controller.read_table()
    request = p4r.WriteRequest(device_id=DEVICE_ID)
    request.election_id.CopyFrom(uint128(CONTROLLER_ELECTION_ID))
    request.updates.extend([update(INSERT, table_entry=job_entry(names, job=j)) for j in (2, 3)])
    raw = request.SerializeToString()
    raw = {"last byte": raw[:-1], "inside an entry": raw + b"\x22\x05\x12\x03\x12\x01\x08",
           "garbage": b"\xff" * 7}[cut]
    err = rpc_error(_raw_write, controller, raw)
    assert err.code() == CODE.INVALID_ARGUMENT
    assert err.details().startswith("malformed WriteRequest: "), err.details()
    assert controller.read_table() == before
    assert len(pipeline.tables[p4names.ADMISSION_JOBS].entries) == 1


def test_unknown_fields_in_a_write_are_skipped_as_protobuf_skips_them(controller, names,
                                                                      pipeline):
    te = job_entry(names, job=4)
    te.MergeFromString(b"\xc8\x3e\x07" + b"\x7d\x01\x02\x03\x04")  # 1001: varint, 15: fixed32
    controller.write(update(INSERT, table_entry=te))
    (entry,) = pipeline.tables[p4names.ADMISSION_JOBS].entries.values()
    assert entry.match == (4,) and entry.action == p4names.ADMISSION_SET_JOB


def test_a_python_engine_batch_is_indexed_before_it_takes_the_pipeline_lock(
        p4info, names, monkeypatch):
    """The packet path (the reference model's, under pipeline.lock) waits only for the swap:
    a batch's lookup indexes are built while a packet batch still holds the lock."""
    model = Pipeline()
    server, port = serve(model, "127.0.0.1:0", DEVICE_ID, p4info=p4info)
    client = Client(port)
    indexed = threading.Event()
    index = pipeline_module._index

    def spy(name: str, entries: Any) -> tuple[str, Any]:
        built = index(name, entries)
        indexed.set()
        return built

    monkeypatch.setattr(pipeline_module, "_index", spy)
    members_before = model._members
    try:
        client.arbitrate(CONTROLLER_ELECTION_ID)
        updates = [update(INSERT, table_entry=table_entry(
            names, p4names.ADMISSION_MEMBERS,
            {"job_id": 1, "worker_id": i % 32, "src_addr": 0x7F000001, "src_port": 20000 + i},
            p4names.ADMISSION_ADMIT)) for i in range(2000)]
        with model.lock:  # a packet batch in progress
            writer = threading.Thread(target=client.write, args=updates)
            writer.start()
            assert indexed.wait(timeout=60), "the batch was not indexed while the lock was held"
            assert model._members is members_before  # nothing visible before the swap
        writer.join(timeout=60)
        assert len(model._members) == 2000
    finally:
        client.close()
        server.stop(None)


def test_large_rejected_batch_still_tells_a_default_client_why(controller, names, server_port):
    """Per-update details of a big batch would exceed gRPC's default 8 KB trailer limit."""
    updates = [update(INSERT, table_entry=job_entry(names, job=j)) for j in range(1, 250)]
    updates[200].entity.table_entry.action.action.params[0].value = enc(1 << 20)
    plain = Client(server_port)  # default channel options
    try:
        err = rpc_error(plain.write, *updates, election_id=CONTROLLER_ELECTION_ID)
    finally:
        plain.close()
    assert err.code() == CODE.UNKNOWN
    assert "update 200" in err.details() and "slot_base" in err.details()
    assert controller.read_table() == []


def test_batch_is_validated_in_order_against_its_own_updates(controller, names):
    te = job_entry(names)
    controller.write(update(INSERT, table_entry=te), update(DELETE, table_entry=te),
                     update(INSERT, table_entry=te))
    assert controller.read_table() == [te]
    errors = batch_error(controller, update(DELETE, table_entry=te),
                         update(MODIFY, table_entry=te))
    assert [e.canonical_code for e in errors] == [CODE.ABORTED.value[0], CODE.NOT_FOUND.value[0]]
    assert controller.read_table() == [te]


def test_full_table_is_resource_exhausted(controller, names):
    size = names.tables[p4names.ADMISSION_JOBS].size
    controller.write(*(update(INSERT, table_entry=job_entry(names, job=j)) for j in range(size)))
    error = single_error(controller, update(INSERT, table_entry=job_entry(names, job=size)))
    assert error.canonical_code == CODE.RESOURCE_EXHAUSTED.value[0]


def test_const_default_action_cannot_be_modified(controller, names):
    te = p4r.TableEntry(table_id=names.table_id(p4names.FORWARDING_L2), is_default_action=True)
    error = single_error(controller, update(MODIFY, table_entry=te))
    assert error.canonical_code == CODE.PERMISSION_DENIED.value[0]
    assert "const" in error.message


def test_default_entry_is_readable(controller, names):
    (entity,) = controller.read(p4r.Entity(table_entry=p4r.TableEntry(
        table_id=names.table_id(p4names.FORWARDING_L2), is_default_action=True)))
    assert entity.table_entry.is_default_action
    assert entity.table_entry.action.action.action_id == names.action_id(
        p4names.FORWARDING_FLOOD)


def test_metadata_is_returned_on_read(controller, names):
    te = job_entry(names)
    te.controller_metadata, te.metadata = 77, b"job one"
    controller.write(update(INSERT, table_entry=te))
    assert controller.read_table() == [te]


def test_read_filters_by_match_and_reads_every_table(controller, names):
    member = table_entry(names, p4names.ADMISSION_MEMBERS,
                         {"job_id": 1, "worker_id": 0, "src_addr": 1,
                          "src_port": 2}, p4names.ADMISSION_ADMIT)
    controller.write(update(INSERT, table_entry=job_entry(names, job=1)),
                     update(INSERT, table_entry=job_entry(names, job=2)),
                     update(INSERT, table_entry=member))
    assert len(controller.read_table()) == 3
    one = controller.read(p4r.Entity(table_entry=table_entry(names, p4names.ADMISSION_JOBS,
                                                             {"job_id": 2})))
    assert [e.table_entry for e in one] == [job_entry(names, job=2)]


def test_unknown_table_in_read_is_reported_per_entity(controller, names):
    controller.write(update(INSERT, table_entry=job_entry(names)))
    err = rpc_error(controller.read, p4r.Entity(table_entry=p4r.TableEntry(table_id=5)),
                    p4r.Entity(table_entry=p4r.TableEntry(table_id=names.table_id(p4names.ADMISSION_JOBS))))
    assert err.code() == CODE.UNKNOWN
    assert [e.canonical_code for e in p4_errors(err)] == [CODE.INVALID_ARGUMENT.value[0], 0]


def test_register_access_is_unimplemented(controller):
    err = rpc_error(controller.read, p4r.Entity(register_entry=p4r.RegisterEntry()))
    (error,) = p4_errors(err)
    assert error.canonical_code == CODE.UNIMPLEMENTED.value[0]
    assert "register" in error.message


def test_dataplane_atomic_is_unimplemented(controller, names):
    err = rpc_error(controller.write, update(INSERT, table_entry=job_entry(names)),
                    atomicity=p4r.WriteRequest.DATAPLANE_ATOMIC)
    assert err.code() == CODE.UNIMPLEMENTED


# =========================================================== multicast groups
def _read_groups(client: Client, gid: int = 0) -> list[p4r.MulticastGroupEntry]:
    entity = p4r.Entity()
    entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = gid
    return [e.packet_replication_engine_entry.multicast_group_entry
            for e in client.read(entity)]


def test_multicast_group_write_read_modify_delete(controller, pipeline):
    g1 = group(1, [(1, 33), (2, 34)])
    g1024 = group(1024, [(1, 0), (2, 0), (3, 0)])
    controller.write(update(INSERT, group=g1), update(INSERT, group=g1024))
    assert pipeline.groups[1] == [Replica(1, 33), Replica(2, 34)]
    assert _read_groups(controller) == [g1, g1024]
    assert _read_groups(controller, 1024) == [g1024]

    g1b = group(1, [(3, 35)])
    controller.write(update(MODIFY, group=g1b))
    assert _read_groups(controller, 1) == [g1b]
    controller.write(update(DELETE, group=group(1, [])))
    assert _read_groups(controller) == [g1024]
    assert 1 not in pipeline.groups


def test_multicast_group_errors(controller):
    controller.write(update(INSERT, group=group(1, [(1, 33)])))
    cases = [
        (update(INSERT, group=group(1, [(1, 33)])), CODE.ALREADY_EXISTS),
        (update(MODIFY, group=group(2, [(1, 33)])), CODE.NOT_FOUND),
        (update(DELETE, group=group(3, [])), CODE.NOT_FOUND),
        (update(INSERT, group=group(0, [(1, 1)])), CODE.INVALID_ARGUMENT),
        (update(INSERT, group=group(4, [(1, 1), (1, 1)])), CODE.INVALID_ARGUMENT),
        (update(INSERT, group=group(5, [(600, 1)])), CODE.INVALID_ARGUMENT),
    ]
    for u, code in cases:
        assert single_error(controller, u).canonical_code == code.value[0], u


def test_replica_port_bytes_are_read_back_as_written(controller):
    g = p4r.MulticastGroupEntry(multicast_group_id=7, metadata=b"m")
    g.replicas.add(port=b"\x03", instance=9)
    controller.write(update(INSERT, group=g))
    assert _read_groups(controller, 7) == [g]


# =================================================================== counters
def _counter(names: Names, name: str, index: int | None = None) -> p4r.Entity:
    entity = p4r.Entity()
    entity.counter_entry.counter_id = names.counter_id(name)
    if index is not None:
        entity.counter_entry.index.index = index
    return entity


def _count(client: Client, names: Names, name: str, index: int) -> tuple[int, int]:
    (entity,) = client.read(_counter(names, name, index))
    assert entity.counter_entry.index.index == index
    return entity.counter_entry.data.packet_count, entity.counter_entry.data.byte_count


def test_counter_cells_can_be_set_and_reset(controller, names, pipeline):
    ce = _counter(names, p4names.STATS_CONTRIBUTIONS, 33).counter_entry
    ce.data.packet_count, ce.data.byte_count = 5, 500
    controller.write(update(MODIFY, counter_entry=ce))
    assert _count(controller, names, p4names.STATS_CONTRIBUTIONS, 33) == (5, 500)
    assert pipeline.counters[p4names.STATS_CONTRIBUTIONS].packets[33] == 5

    reset = _counter(names, p4names.STATS_CONTRIBUTIONS).counter_entry
    reset.data.SetInParent()  # every cell to zero
    controller.write(update(MODIFY, counter_entry=reset))
    assert _count(controller, names, p4names.STATS_CONTRIBUTIONS, 33) == (0, 0)


def test_large_counter_values_survive_the_hand_encoded_read(controller, names):
    ce = _counter(names, p4names.REPLICATION_RESULTS, 8191).counter_entry
    ce.data.packet_count, ce.data.byte_count = 2**40 + 3, 2**62 + 1
    controller.write(update(MODIFY, counter_entry=ce))
    assert _count(controller, names, p4names.REPLICATION_RESULTS, 8191) == (2**40 + 3, 2**62 + 1)
    assert _count(controller, names, p4names.REPLICATION_RESULTS, 0) == (0, 0)


@pytest.mark.parametrize("unit", [p4info_pb2.CounterSpec.BOTH, p4info_pb2.CounterSpec.PACKETS,
                                  p4info_pb2.CounterSpec.BYTES])
def test_counter_encoding_matches_protobuf(unit):
    info = BoundCounter(id=316017724, name="c", size=4, unit=unit)
    packets, nbytes = [0, 1, 300, 2**35], [0, 64, 0, 2**50]
    raw = list(encode_counters([(info, 5, packets, nbytes)]))
    for i, blob in enumerate(raw):
        expected = p4r.Entity()
        ce = expected.counter_entry
        ce.counter_id, ce.index.index = info.id, 5 + i
        ce.data.SetInParent()
        if unit != p4info_pb2.CounterSpec.BYTES:
            ce.data.packet_count = packets[i]
        if unit != p4info_pb2.CounterSpec.PACKETS:
            ce.data.byte_count = nbytes[i]
        assert p4r.Entity.FromString(blob) == expected


def test_counter_errors(controller, names):
    out_of_range = _counter(names, p4names.STATS_CONTRIBUTIONS, 8192).counter_entry
    out_of_range.data.SetInParent()
    assert single_error(controller, update(MODIFY, counter_entry=out_of_range)).canonical_code \
        == CODE.OUT_OF_RANGE.value[0]
    insert = _counter(names, p4names.STATS_CONTRIBUTIONS, 1).counter_entry
    assert single_error(controller, update(INSERT, counter_entry=insert)).canonical_code \
        == CODE.INVALID_ARGUMENT.value[0]
    unknown = p4r.CounterEntry(counter_id=4242)
    assert single_error(controller, update(MODIFY, counter_entry=unknown)).canonical_code \
        == CODE.INVALID_ARGUMENT.value[0]


def test_reading_every_counter_streams_every_cell_in_chunks(controller, names):
    responses = controller.read_responses(p4r.Entity(counter_entry=p4r.CounterEntry()))
    cells = sum(len(r.entities) for r in responses)
    assert cells == sum(c.size for c in names.counters.values())
    assert len(responses) > 1


# ======================================================= UDP data plane, end to end
@pytest.fixture
def udp_plane(pipeline: Pipeline):
    plane = UdpDataPlane(pipeline, "127.0.0.1", 0).start()
    yield plane
    plane.stop()


def _worker_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    return sock


def _contribution(job: int, worker: int, lanes: np.ndarray) -> bytes:
    header = wire.Header(op=wire.Op.CONTRIB, job_id=job, worker_id=worker, slot=3, round=0,
                         chunk=11)
    return wire.Packet(header, lanes).encode()


def test_job_configured_over_p4runtime_aggregates_udp_contributions(controller, names,
                                                                   udp_plane):
    job, local = 1, wire.ip_to_int("127.0.0.1")
    workers = [_worker_socket(), _worker_socket()]
    try:
        updates = [update(INSERT, table_entry=job_entry(names, job=job, members=2, mcast_grp=job))]
        replicas = []
        for w, sock in enumerate(workers):
            port = sock.getsockname()[1]
            rid = wire.member_rid(job, w)
            updates.append(update(INSERT, table_entry=table_entry(
                names, p4names.ADMISSION_MEMBERS, {"job_id": job, "worker_id": w, "src_addr": local,
                                 "src_port": port}, p4names.ADMISSION_ADMIT)))
            updates.append(update(INSERT, table_entry=table_entry(
                names, p4names.REPLICATION_REWRITE, {"egress_rid": rid},
                p4names.REPLICATION_REWRITE_DST,
                {"dst_mac": 0x020000000001 + w, "dst_addr": local, "dst_port": port})))
            replicas.append((1, rid))
        updates.append(update(INSERT, group=group(job, replicas)))
        controller.write(*updates)

        lanes = [np.arange(wire.LANES, dtype=np.int32) * (w + 1) for w in range(2)]
        for w, sock in enumerate(workers):
            sock.sendto(_contribution(job, w, lanes[w]), udp_plane.address)
        for sock in workers:
            result = wire.Packet.decode(sock.recv(2048))
            assert result.header.op == wire.Op.RESULT
            assert (result.header.count, result.header.bitmap) == (2, 0b11)
            assert result.header.chunk == 11
            np.testing.assert_array_equal(result.lanes, lanes[0] + lanes[1])

        stranger = _worker_socket()
        stranger.sendto(_contribution(job, 0, lanes[0]), udp_plane.address)
        deadline = time.monotonic() + 5
        drops_cell = job * wire.NUM_DROP_REASONS + wire.DropReason.NOT_MEMBER
        while _count(controller, names, p4names.STATS_DROPS, drops_cell)[0] == 0:
            assert time.monotonic() < deadline, "the stranger's packet was not counted"
            time.sleep(0.02)
        stranger.close()

        frame = wire.HYSYNC_OFFSET + wire.PACKET_BYTES  # counters count frame bytes
        for w in range(2):
            cell = wire.member_index(job, w)
            assert _count(controller, names, p4names.STATS_CONTRIBUTIONS, cell) == (1, frame)
            assert _count(controller, names, p4names.REPLICATION_RESULTS, cell) == (1, frame)
        assert _count(controller, names, p4names.STATS_DROPS, drops_cell) == (1, frame)
    finally:
        for sock in workers:
            sock.close()


# ===================================================== python -m hysync.softswitch
def _softswitch(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "hysync.softswitch", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_line(proc: subprocess.Popen, timeout: float = 20) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "python -m hysync.softswitch printed nothing"
    return proc.stdout.readline()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_softswitch_process_listens_and_stops_cleanly(sig, names):
    proc = _softswitch("--grpc-addr", "127.0.0.1:0", "--udp", "127.0.0.1:0", "--p4info",
                       str(P4INFO_PATH), "--log-level", "warning")
    try:
        line = _first_line(proc)
        match = re.search(r"P4Runtime on 127\.0\.0\.1:(\d+)", line)
        assert match, line
        assert "UDP 127.0.0.1:" in line and "(native engine, " in line  # the default
        with grpc.insecure_channel(f"127.0.0.1:{match[1]}") as channel:
            stub = p4runtime_pb2_grpc.P4RuntimeStub(channel)
            assert stub.Capabilities(p4r.CapabilitiesRequest(), timeout=5) \
                .p4runtime_api_version == "1.4.1"
            config = stub.GetForwardingPipelineConfig(
                p4r.GetForwardingPipelineConfigRequest(device_id=1), timeout=5).config
            assert config.p4info == names.p4info  # --p4info preloaded it
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _fails(*args: str) -> str:
    proc = _softswitch(*args)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("args, says", [
    (["-i", "1-s1-eth1"], "PORT@IFACE"),
    (["-i", "x@s1-eth1"], "PORT@IFACE"),
    (["--udp", "127.0.0.1"], "HOST:PORT"),
    (["--grpc-addr", "nohost"], "HOST:PORT"),
    (["--udp", "127.0.0.1:0", "-i", "1@lo"], "not allowed with"),
    (["--device-id", "0"], "device id"),
    (["--p4info", "/nonexistent/x.txtpb"], "cannot read"),
    (["--threads", "0"], "thread count"),
    (["--engine", "python", "--threads", "2"], "needs the native engine"),
    (["--engine", "fast"], "invalid choice"),
])
def test_softswitch_bad_arguments_exit_2_with_one_line(args, says):
    assert says in _fails(*args)


@pytest.mark.slow
def test_softswitch_refuses_a_grpc_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _fails("--grpc-addr", f"127.0.0.1:{port}", "--udp", "127.0.0.1:0")
    assert f"127.0.0.1:{port}" in line and "in use" in line


@pytest.mark.slow
def test_softswitch_refuses_a_udp_port_in_use():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        line = _fails("--grpc-addr", "127.0.0.1:0", "--udp", f"127.0.0.1:{port}")
    assert str(port) in line


@pytest.mark.slow
def test_softswitch_names_a_missing_interface():
    line = _fails("--grpc-addr", "127.0.0.1:0", "-i", "1@hsnosuch0")
    assert "hsnosuch0" in line

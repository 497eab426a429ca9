"""The P4Runtime session against a real softswitch over gRPC."""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from hysync import p4names
from hysync.controlplane.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    NoPipelineError,
    NotFoundError,
    NotPrimaryError,
    P4RuntimeUnreachableError,
    SchemaError,
)
from hysync.controlplane.p4rt.entities import (
    CounterCell,
    MulticastGroup,
    Replica,
    TableEntry,
    insert,
    modify,
)
from hysync.controlplane.p4rt.switch import DeviceConfigError, Switch, parse_election_id
from hysync.p4schema import Schema
from hysync.softswitch.p4arbitration import Arbiter

from .conftest import P4INFO, Softswitch, read_table


def _job_entry(job: int) -> TableEntry:
    return TableEntry(p4names.ADMISSION_JOBS, {"job_id": job}, p4names.ADMISSION_SET_JOB,
                      {"slot_base": 0, "slot_count": 8, "members": 2, "mcast_grp": job,
                       "epoch": 1})


def test_a_fresh_switch_has_no_pipeline_until_one_is_pushed(softswitch: Softswitch) -> None:
    with Switch(softswitch.grpc_addr) as sw:
        assert sw.is_primary
        with pytest.raises(NoPipelineError, match="hysync pipeline push --p4info"):
            read_table(sw, p4names.ADMISSION_JOBS)
        schema = sw.push_pipeline(P4INFO)
        assert schema.table(p4names.ADMISSION_JOBS).size == 256 and sw.schema is schema
    # A new session learns the pipeline from the switch: no P4Info path needed.
    with Switch(softswitch.grpc_addr, election_id=(0, 7)) as sw:
        assert sw.schema.p4info == schema.p4info


def test_writes_and_reads_round_trip(switch: Switch) -> None:
    entry = _job_entry(3)
    switch.write([insert(entry), insert(MulticastGroup(3, (Replica(1, 97), Replica(2, 98))))])
    assert read_table(switch, p4names.ADMISSION_JOBS) == [entry]
    assert switch.read_groups() == [MulticastGroup(3, (Replica(1, 97), Replica(2, 98)))]
    assert switch.read_counter_cells([(p4names.STATS_LATE, 97)]) == [
        CounterCell(p4names.STATS_LATE, 97, 0, 0)]
    assert len(switch.read_counter_cells([(p4names.STATS_DROPS, None)])) == 4096


def test_a_refused_write_raises_a_typed_error_with_the_switch_message(switch: Switch) -> None:
    switch.write([insert(_job_entry(3))])
    with pytest.raises(AlreadyExistsError) as err:
        switch.write([insert(_job_entry(4)), insert(_job_entry(3))])
    message = str(err.value)
    assert "INSERT HySyncIngress.admission.jobs[job_id=3]" in message
    assert "ALREADY_EXISTS" in message and "job_id=4" not in message
    assert [i for i, code, _ in err.value.failures if code != "ABORTED"] == [1]
    with pytest.raises(NotFoundError, match="MODIFY .*job_id=5.*NOT_FOUND"):
        switch.write([modify(_job_entry(5))])


def test_a_big_batch_is_not_cut_off_by_the_session_timeout(switch: Switch,
                                                           softswitch: Softswitch) -> None:
    """The write deadline grows with the batch: 5,000 entries take longer than 50 ms."""
    members = [insert(TableEntry(p4names.ADMISSION_MEMBERS,
                                 {"job_id": 1 + i // 32, "worker_id": i % 32,
                                  "src_addr": 0x7F000001, "src_port": 20000 + i},
                                 p4names.ADMISSION_ADMIT)) for i in range(5000)]
    switch.timeout = 0.05
    switch.write(members)
    assert len(softswitch.pipeline.tables[p4names.ADMISSION_MEMBERS].entries) == 5000


def test_a_write_past_its_deadline_says_how_to_raise_it(schema: Schema) -> None:
    hung = threading.Event()

    def answer_late(request: bytes, context: grpc.ServicerContext) -> bytes:
        hung.wait(5)  # past the client's deadline
        return b""  # an empty WriteResponse

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("p4.v1.P4Runtime", {
        "Write": grpc.unary_unary_rpc_method_handler(answer_late)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        sw = Switch(f"127.0.0.1:{port}", schema=schema, timeout=0.2, arbitrate=False)
        with sw, pytest.raises(DeadlineExceededError,
                               match=r"write of 3 update\(s\) within 0.203 s .*raise --timeout"):
            sw.write([insert(_job_entry(j)) for j in (1, 2, 3)])
    finally:
        hung.set()
        server.stop(None)


def test_an_unknown_name_fails_before_anything_is_sent(switch: Switch) -> None:
    with pytest.raises(SchemaError, match="did you mean 'HySyncIngress.admission.jobs'"):
        read_table(switch, "HySyncIngress.admission.job")


def test_an_unreachable_switch_fails_fast_saying_how_to_start_one() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(P4RuntimeUnreachableError) as err:
        Switch(addr, connect_timeout=1.0)
    assert f"cannot reach the switch at {addr}" in str(err.value)
    assert f"python -m hysync.softswitch --grpc-addr {addr}" in str(err.value)


def test_a_lower_election_id_is_refused_naming_the_primary(softswitch: Softswitch) -> None:
    with Switch(softswitch.grpc_addr, election_id=(0, 5)):
        with pytest.raises(NotPrimaryError) as err:
            Switch(softswitch.grpc_addr, election_id=(0, 2))
        assert "election id 5 is primary" in str(err.value)
        assert err.value.primary == (0, 5)
        # A backup session may still read.
        with Switch(softswitch.grpc_addr, election_id=(0, 2), require_primary=False) as backup:
            assert not backup.is_primary


def test_a_higher_election_id_takes_over_and_the_old_primary_can_no_longer_write(
        softswitch: Softswitch) -> None:
    with Switch(softswitch.grpc_addr, election_id=(0, 1)) as old:
        old.push_pipeline(P4INFO)
        with Switch(softswitch.grpc_addr, election_id=(1, 0)) as new:
            assert new.is_primary
            deadline = time.monotonic() + 5
            while old.is_primary and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not old.is_primary and old.primary_election_id == (1, 0)
            with pytest.raises(NotPrimaryError, match="1,0"):
                old.write([insert(_job_entry(9))])
            new.write([insert(_job_entry(9))])


def test_read_only_sessions_do_not_disturb_the_primary(switch: Switch,
                                                      softswitch: Softswitch) -> None:
    switch.write([insert(_job_entry(2))])
    with Switch(softswitch.grpc_addr, election_id=(9, 9), arbitrate=False) as reader:
        assert read_table(reader, p4names.ADMISSION_JOBS) == [_job_entry(2)]
    assert switch.is_primary
    switch.write([insert(_job_entry(3))])


def test_pipeline_files_that_cannot_be_read_are_named(switch: Switch, tmp_path) -> None:
    with pytest.raises(SchemaError, match="cannot read the P4Info file"):
        switch.push_pipeline(tmp_path / "missing.txtpb")
    with pytest.raises(DeviceConfigError, match="cannot read the device config"):
        switch.push_pipeline(P4INFO, tmp_path / "missing.json")


def test_close_is_idempotent_and_frees_the_election_id(softswitch: Softswitch) -> None:
    sw = Switch(softswitch.grpc_addr, election_id=(0, 3))
    sw.close()
    sw.close()
    # close() returns once the switch has released the id: the next session with the same
    # id is primary at once, however late the switch's threads run (a script's `hysync`
    # commands one after another, each under the inventory's election id).
    for _ in range(20):
        with Switch(softswitch.grpc_addr, election_id=(0, 3)) as again:
            assert again.is_primary


def test_close_returns_once_a_slow_switch_has_released_the_election_id(
        softswitch: Softswitch, monkeypatch: pytest.MonkeyPatch) -> None:
    # A switch whose threads run late, as on a busy machine: it releases a closed stream's
    # election id well after the client let go of the stream.
    release = Arbiter.remove

    def late(self: Arbiter, stream: object) -> None:
        time.sleep(0.5)
        release(self, stream)

    monkeypatch.setattr(Arbiter, "remove", late)
    Switch(softswitch.grpc_addr, election_id=(0, 10)).close()
    with Switch(softswitch.grpc_addr, election_id=(0, 10)) as again:
        assert again.is_primary


@pytest.mark.parametrize(("text", "expected"), [("1", (0, 1)), ("7,9", (7, 9)),
                                                ("0x10", (0, 16))])
def test_election_ids_parse_like_p4runtime_shell(text: str, expected: tuple[int, int]) -> None:
    assert parse_election_id(text) == expected


@pytest.mark.parametrize("text", ["", "a", "1,2,3", "-1"])
def test_bad_election_ids_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="election id"):
        parse_election_id(text)

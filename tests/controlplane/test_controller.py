"""Jobs, hot swap and membership on a real softswitch, read back over P4Runtime."""

from __future__ import annotations

import pytest

from hysync import p4names, wire
from hysync.controlplane import controller as controller_module
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import (
    InvalidArgumentError,
    JobError,
    UnknownJobError,
    ValidationError,
)
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.entities import (
    MulticastGroup,
    Replica,
    TableEntry,
    Update,
    UpdateType,
    delete,
    insert,
)
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.tables import admission, replication
from hysync.controlplane.tables.sync_mode import ModeSetting
from hysync.wire import Mode

from .conftest import EXAMPLE_JOB, Softswitch, make_job, read_table

TABLES = (p4names.ADMISSION_MEMBERS, p4names.ADMISSION_JOBS,
          p4names.SYNC_MODE_MODES, p4names.FORWARDING_L2,
          p4names.REPLICATION_REWRITE)
LOCALHOST = 0x7F000001


def snapshot(switch: Switch) -> dict[str, object]:
    """Everything the controller programs, as comparable values."""
    state: dict[str, object] = {t.rsplit(".", 1)[1]: sorted(read_table(switch, t), key=repr)
                                for t in TABLES}
    state["groups"] = sorted(switch.read_groups(), key=lambda g: g.group_id)
    return state


def expected_loopback(epoch: int = 1) -> dict[str, object]:
    """What docs/protocol.md §6/§8 say the example job must install, written out by hand;
    `epoch` is the install's random epoch (§4 step 6), read back from the switch."""
    rid = [33 + w for w in range(4)]  # job*32 + worker + 1
    members = [TableEntry(p4names.ADMISSION_MEMBERS,
                          {"job_id": 1, "worker_id": w, "src_addr": LOCALHOST,
                           "src_port": 47001 + w}, p4names.ADMISSION_ADMIT)
               for w in range(4)]
    jobs = [TableEntry(p4names.ADMISSION_JOBS, {"job_id": 1},
                       p4names.ADMISSION_SET_JOB,
                       {"slot_base": 0, "slot_count": 256, "members": 4, "mcast_grp": 1,
                        "epoch": epoch})]
    modes = [TableEntry(p4names.SYNC_MODE_MODES, {"job_id": 1, "slot": (0, 255)},
                        p4names.SYNC_MODE_SET_MODE, {"mode": 0, "quorum": 0},
                        priority=1)]
    l2 = [TableEntry(p4names.FORWARDING_L2, {"dst_addr": 0x020000000001 + w},
                     p4names.FORWARDING_SET_EGRESS_PORT, {"port": 1}) for w in range(4)]
    rewrite = [TableEntry(p4names.REPLICATION_REWRITE, {"egress_rid": rid[w]},
                          p4names.REPLICATION_REWRITE_DST,
                          {"dst_mac": 0x020000000001 + w, "dst_addr": LOCALHOST,
                           "dst_port": 47001 + w}) for w in range(4)]
    groups = [MulticastGroup(1, tuple(Replica(1, r) for r in rid)),
              MulticastGroup(wire.FLOOD_MCAST_GROUP, (Replica(1, 0),))]
    return {"members": sorted(members, key=repr), "jobs": jobs, "modes": modes,
            "l2": sorted(l2, key=repr), "rewrite": sorted(rewrite, key=repr), "groups": groups}


def empty() -> dict[str, object]:
    return {"members": [], "jobs": [], "modes": [], "l2": [], "rewrite": [], "groups": []}


def test_adding_a_job_installs_exactly_the_protocol_entries(controller: Controller,
                                                            switch: Switch) -> None:
    report = controller.add_job(JobConfig.load(EXAMPLE_JOB))
    assert report.outcome == "installed"
    epoch = controller.job(1).epoch
    assert 0 < epoch < 2**32
    assert snapshot(switch) == expected_loopback(epoch)
    assert controller.problems == []


def test_removing_a_job_deletes_everything_it_installed(controller: Controller,
                                                        switch: Switch) -> None:
    controller.add_job(JobConfig.load(EXAMPLE_JOB))
    assert controller.remove_job(1) == 16
    assert snapshot(switch) == empty()
    assert controller.list_jobs() == []


def test_two_jobs_share_a_switch_and_their_hosts(controller: Controller,
                                                 switch: Switch) -> None:
    one = make_job(1, workers=4, base=0, count=64)
    # Job 2 runs on the hosts of job 1's workers 0 and 1 (other UDP ports) and a new host
    # behind port 2.
    data = {"job_id": 2, "slots": {"base": 64, "count": 32}, "mode": "partial", "quorum": 2,
            "members": [
                {"worker": 0, "ipv4": "127.0.0.1", "mac": one.members[0].mac,
                 "udp_port": 48000, "switch_port": 1},
                {"worker": 1, "ipv4": "127.0.0.1", "mac": one.members[1].mac,
                 "udp_port": 48001, "switch_port": 1},
                {"worker": 2, "ipv4": "127.0.0.2", "mac": "02:00:00:00:02:99",
                 "udp_port": 48002, "switch_port": 2}]}
    two = JobConfig.from_dict(data)
    controller.add_job(one)
    controller.add_job(two)
    state = snapshot(switch)
    assert len(state["members"]) == 7 and len(state["rewrite"]) == 7  # type: ignore[arg-type]
    assert len(state["l2"]) == 5  # type: ignore[arg-type]  # 4 hosts of job 1 + 1 new
    groups = {g.group_id: g for g in state["groups"]}  # type: ignore[attr-defined]
    assert groups[wire.FLOOD_MCAST_GROUP].ports() == {1, 2}
    assert {r.rid for r in groups[2].replicas} == {65, 66, 67}
    jobs = {j.job_id: j for j in controller.list_jobs()}
    assert jobs[1].slots == (0, 63) and jobs[2].slots == (64, 95)
    assert [(s.mode, s.quorum) for s in jobs[2].segments()] == [(Mode.PARTIAL, 2)]

    controller.remove_job(1)  # the hosts job 2 uses stay reachable
    state = snapshot(switch)
    macs = {e.match["dst_addr"] for e in state["l2"]}  # type: ignore[attr-defined]
    assert macs == {0x020000000001, 0x020000000002, 0x020000000299}
    groups = {g.group_id: g for g in state["groups"]}  # type: ignore[attr-defined]
    assert groups[wire.FLOOD_MCAST_GROUP].ports() == {1, 2} and 1 not in groups
    controller.remove_job(2)
    assert snapshot(switch) == empty()


def test_overlapping_slot_ranges_are_refused_naming_both_jobs(controller: Controller,
                                                              switch: Switch) -> None:
    controller.add_job(make_job(1, base=0, count=64))
    before = snapshot(switch)
    with pytest.raises(JobError, match="job 2 slots 32-95 overlap job 1 slots 0-63"):
        controller.add_job(make_job(2, base=32, count=64))
    assert snapshot(switch) == before


def test_a_member_address_of_another_job_is_refused(controller: Controller,
                                                    switch: Switch) -> None:
    """Two jobs sharing one member address would share its packets and
    its liveness; the second job is refused and nothing is written."""
    controller.add_job(make_job(1, workers=2, base=0, count=8, ports=[47001, 47002]))
    before = snapshot(switch)
    with pytest.raises(JobError, match="job 2 worker 1 uses 127.0.0.1:47002, the address of "
                                       "job 1 worker 1"):
        controller.add_job(make_job(2, workers=2, base=8, count=8, ports=[47003, 47002]))
    assert snapshot(switch) == before


def test_a_host_on_two_ports_is_refused(controller: Controller) -> None:
    controller.add_job(make_job(1, base=0, count=8))
    with pytest.raises(JobError, match="MAC 02:00:00:00:00:01 is on port 1 .*used by job 1"):
        controller.add_job(make_job(2, base=8, count=8, switch_port=3))


def test_adding_an_installed_job_again_is_a_no_op_and_a_different_one_needs_replace(
        controller: Controller, switch: Switch) -> None:
    job = JobConfig.load(EXAMPLE_JOB)
    controller.add_job(job)
    before = snapshot(switch)
    assert controller.add_job(job).outcome == "unchanged"
    assert snapshot(switch) == before
    bigger = make_job(1, workers=4, base=0, count=128, ports=[47001, 47002, 47003, 47004])
    with pytest.raises(JobError, match="already installed differently: slots 0-255 installed, "
                                       "0-127 in the file.*--replace"):
        controller.add_job(bigger)
    assert snapshot(switch) == before
    assert controller.add_job(bigger, replace=True).outcome == "replaced"
    assert controller.job(1).slots == (0, 127)


def test_a_failed_install_is_rolled_back(controller: Controller, switch: Switch,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = switch.write

    def failing_write(updates):  # type: ignore[no-untyped-def]
        updates = list(updates)
        if any(getattr(u.entity, "table", "") == p4names.ADMISSION_JOBS
               for u in updates):
            raise InvalidArgumentError("injected failure")
        real_write(updates)

    monkeypatch.setattr(switch, "write", failing_write)
    with pytest.raises(InvalidArgumentError, match="injected"):
        controller.add_job(JobConfig.load(EXAMPLE_JOB))
    assert snapshot(switch) == empty()


def test_a_restarted_controller_attaches_and_reconciles(softswitch: Softswitch,
                                                        switch: Switch) -> None:
    first = Controller(switch).attach()
    job = JobConfig.load(EXAMPLE_JOB)
    first.add_job(job)
    first.set_mode(1, slots=(0, 63), mode=Mode.PARTIAL, quorum=3)
    first.exclude(1, 2)
    before = snapshot(switch)
    installed = first.job(1)
    switch.close()  # the controller process ends; the switch keeps its state

    with Switch(softswitch.grpc_addr, election_id=(0, 2)) as again:
        second = Controller(again).attach()
        assert second.jobs == {1: installed} and second.problems == []
        assert installed.active == {0, 1, 3} and installed.member_count == 3
        assert installed.member(2) == job.member(2)  # the excluded member's address is kept
        assert second.add_job(job).outcome == "unchanged"
        assert snapshot(again) == before  # nothing duplicated, nothing reset
        second.readmit(1, 2)
        assert second.job(1).active == {0, 1, 2, 3}


def test_set_mode_is_one_modify_for_an_existing_range(controller: Controller,
                                                      switch: Switch) -> None:
    controller.add_job(JobConfig.load(EXAMPLE_JOB))
    report = controller.set_mode(1, slots=(0, 255), mode=Mode.PARTIAL, quorum=3)
    assert (report.strategy, report.deleted) == ("modify", 0)
    modes = read_table(switch, p4names.SYNC_MODE_MODES)
    assert [(e.match["slot"], e.params, e.priority) for e in modes] == [
        ((0, 255), {"mode": 1, "quorum": 3}, 1)]
    report = controller.set_mode(1, slots=(16, 31), mode=Mode.ASYNC)
    assert report.strategy == "insert"
    segments = [(s.low, s.high, s.mode, s.quorum) for s in controller.job(1).segments()]
    assert segments == [(0, 15, Mode.PARTIAL, 3), (16, 31, Mode.ASYNC, 0),
                        (32, 255, Mode.PARTIAL, 3)]
    report = controller.set_mode(1, slots=(0, 255), mode=Mode.SYNC)
    assert (report.strategy, report.deleted) == ("insert", 2)
    assert len(read_table(switch, p4names.SYNC_MODE_MODES)) == 1
    assert controller.set_mode(1, slots=(0, 255), mode=Mode.SYNC).strategy == "unchanged"


class SwitchCalls:
    """The full-state reads (`read_state`) and the modes-table writes a controller makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        self.mode_writes: list[Update] = []
        read_state, write = controller_module.read_state, Switch.write

        def counted_read(switch: Switch):  # type: ignore[no-untyped-def]
            self.reads += 1
            return read_state(switch)

        def recorded_write(switch: Switch, updates) -> None:  # type: ignore[no-untyped-def]
            updates = list(updates)
            self.mode_writes += [u for u in updates if u.type != UpdateType.DELETE and
                                 getattr(u.entity, "table", None) == p4names.SYNC_MODE_MODES]
            write(switch, updates)

        monkeypatch.setattr(controller_module, "read_state", counted_read)
        monkeypatch.setattr(Switch, "write", recorded_write)


@pytest.mark.parametrize(("slots", "strategy"), [((0, 255), "modify"), ((16, 31), "insert")])
def test_a_swap_reads_the_switch_once_and_writes_its_setting_once(
        switch: Switch, monkeypatch: pytest.MonkeyPatch, slots: tuple[int, int],
        strategy: str) -> None:
    Controller(switch).add_job(JobConfig.load(EXAMPLE_JOB))
    calls = SwitchCalls(monkeypatch)
    controller = Controller(switch)
    report = controller.set_mode(1, slots=slots, mode=Mode.PARTIAL, quorum=3)
    assert (calls.reads, report.strategy) == (1, strategy)
    assert [(u.entity.params, u.entity.match["slot"]) for u in calls.mode_writes] == [
        ({"mode": int(Mode.PARTIAL), "quorum": 3}, slots)]  # type: ignore[union-attr]
    assert report.setting == ModeSetting(Mode.PARTIAL, 3)
    # The registry holds what was written, without reading it back: the same as a read.
    assert controller.jobs[1] == Controller(switch).job(1)


@pytest.mark.parametrize(("slots", "mode", "quorum", "message"), [
    ((250, 300), Mode.SYNC, None, "slots 250-300 are outside job 1's slots 0-255"),
    ((9, 3), Mode.SYNC, None, "slot range 9-3 is empty"),
    ((0, 7), Mode.PARTIAL, 5, "quorum between 1 and 4 .* got 5"),
    ((0, 7), Mode.PARTIAL, None, "quorum between 1 and 4"),
    ((0, 7), Mode.SYNC, 2, "sync mode takes no quorum"),
])
def test_set_mode_validates_range_and_quorum(controller: Controller, slots: tuple[int, int],
                                             mode: Mode, quorum: int | None,
                                             message: str) -> None:
    controller.add_job(JobConfig.load(EXAMPLE_JOB))
    with pytest.raises(ValidationError, match=message):
        controller.set_mode(1, slots=slots, mode=mode, quorum=quorum)


def test_unknown_jobs_are_named(controller: Controller) -> None:
    controller.add_job(JobConfig.load(EXAMPLE_JOB))
    for call in (lambda: controller.remove_job(9), lambda: controller.exclude(9, 0),
                 lambda: controller.set_mode(9, slots=(0, 1), mode=Mode.SYNC),
                 lambda: controller.stats(9)):
        with pytest.raises(UnknownJobError, match="no job 9 on the switch .*installed jobs: 1"):
            call()


def test_exclude_and_readmit_rewrite_membership(controller: Controller, switch: Switch) -> None:
    controller.add_job(JobConfig.load(EXAMPLE_JOB))
    controller.set_mode(1, slots=(0, 127), mode=Mode.PARTIAL, quorum=4)
    report = controller.exclude(1, 3)
    assert report.members == 3 and report.quorums == ((0, 127, 4, 3),)
    state = snapshot(switch)
    assert {e.match["worker_id"] for e in state["members"]} == {0, 1, 2}  # type: ignore[attr-defined]
    assert state["jobs"][0].params["members"] == 3  # type: ignore[index]
    group = next(g for g in state["groups"] if g.group_id == 1)  # type: ignore[attr-defined]
    assert {r.rid for r in group.replicas} == {33, 34, 35}
    assert len(state["rewrite"]) == 4  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="already excluded"):
        controller.exclude(1, 3)
    with pytest.raises(ValidationError, match="no worker 7"):
        controller.exclude(1, 7)
    with pytest.raises(ValidationError, match="between 1 and 3"):
        controller.set_mode(1, slots=(0, 7), mode=Mode.PARTIAL, quorum=4)

    report = controller.readmit(1, 3)
    assert report.members == 4 and report.quorums == ((0, 127, 3, 4),)
    after = snapshot(switch)
    assert after["members"] == expected_loopback()["members"]
    assert after["groups"] == expected_loopback()["groups"]
    with pytest.raises(ValidationError, match="already an active member"):
        controller.readmit(1, 3)


def test_the_last_member_cannot_be_excluded(controller: Controller) -> None:
    controller.add_job(make_job(5, workers=2, base=0, count=4))
    controller.exclude(5, 0)
    with pytest.raises(ValidationError, match="last active member of job 5: remove the job"):
        controller.exclude(5, 1)


def test_stats_cover_every_member_and_every_drop_reason(controller: Controller) -> None:
    controller.add_job(JobConfig.load(EXAMPLE_JOB))
    controller.exclude(1, 1)
    stats = controller.stats(1)
    assert sorted(stats.workers) == [0, 1, 2, 3] and not stats.workers[1].active
    assert set(stats.drops) == {r.name for r in wire.DropReason}
    rates = controller.rates(1, 0.05)
    assert rates.workers[0].contributions == 0 and rates.interval > 0.04  # two reads apart


def test_traces_of_a_partial_install_are_reported_and_replace_cleans_them(
        controller: Controller, switch: Switch) -> None:
    job = JobConfig.load(EXAMPLE_JOB)
    # A controller died after writing the egress state of job 1, before its jobs entry.
    switch.write([insert(replication.rewrite_entry(1, m)) for m in job.members])
    controller.attach()
    assert any("job 1: entries without a jobs-table entry" in p for p in controller.problems)
    with pytest.raises(JobError, match="no jobs-table entry .*partial install"):
        controller.add_job(job)
    assert controller.add_job(job, replace=True).outcome == "replaced"
    assert snapshot(switch) == expected_loopback(controller.job(1).epoch)
    assert controller.problems == []


def test_inconsistent_state_is_reported_on_attach(controller: Controller,
                                                  switch: Switch) -> None:
    controller.add_job(JobConfig.load(EXAMPLE_JOB))
    switch.write([delete(admission.member_entry(1, JobConfig.load(EXAMPLE_JOB).member(2)))])
    controller.attach()
    assert controller.problems == [
        "job 1: jobs entry says 4 members, 3 are admitted",
        "job 1: multicast group 1 has rids [33, 34, 35, 36], the admitted members need "
        "[33, 34, 36]"]

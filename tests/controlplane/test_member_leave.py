"""A member of a job installed from a job file leaves it at every level
(controlplane/testbed/member_leave.py), over real P4Runtime on three softswitch
processes (a spine and two leaves) with hosts sending real HySync datagrams: a host that
leaves is excluded at its leaf and the rest of its rack sums without it; when a rack's
last host leaves, its leaf is excluded at the spine and the other rack's sync rounds
complete without it; a job's last member stays; a leave waits for a switch another
session holds; bad input is refused in one line with nothing written."""

from __future__ import annotations

import threading
import tomllib
from pathlib import Path

import numpy as np
import pytest

from hysync import p4names
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.testbed.inventory import Inventory
from hysync.controlplane.testbed.job_member import job_member
from hysync.controlplane.testbed.member_leave import LeaveError, LeaveReport, leave
from hysync.wire import Op
from tests.testbed.conftest import toml_text

from .conftest import P4INFO
from .test_two_level_job import (  # noqa: F401 (testbed: the fixture)
    HOSTS,
    JOB,
    LEAVES,
    TwoLevelTestbed,
    gradient,
    hysync,
    testbed,
)

WORLD = LEAVES * HOSTS


def leave_as(bed: TwoLevelTestbed, name: str, **kwargs: float) -> LeaveReport:
    inv, job = Inventory.load(bed.inventory), JobConfig.load(bed.job_file)
    return leave(inv, job, job_member(inv, job, 0, WORLD, name), **kwargs)


def active(bed: TwoLevelTestbed, switch: str) -> list[int]:
    return sorted(e.match["worker_id"]
                  for e in bed.tables(switch)[p4names.ADMISSION_MEMBERS])


def members_count(bed: TwoLevelTestbed, switch: str) -> int:
    (row,) = bed.tables(switch)[p4names.ADMISSION_JOBS]
    return row.params["members"]


def round_trip(bed: TwoLevelTestbed, r: int, hosts: list[tuple[int, int]]) -> None:
    """`hosts` send round `r` in sync: each gets the exact sum of theirs, count len(hosts)."""
    for leaf, host in hosts:
        bed.send(leaf, host, r)
    for leaf, host in hosts:
        hdr, lanes = bed.receive(leaf, host)
        assert (hdr.op, hdr.round, hdr.count) == (Op.RESULT, r, len(hosts)), (leaf, host, hdr)
        np.testing.assert_array_equal(lanes, sum(gradient(i, h, r) for i, h in hosts))


def test_a_member_leaves_at_its_leaf_and_a_gone_rack_at_the_spine(
        testbed: TwoLevelTestbed) -> None:  # noqa: F811 (the imported fixture)
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "add",
                            str(testbed.job_file))
    assert (code, err) == (0, ""), err
    everyone = [(i, h) for i in range(LEAVES) for h in range(HOSTS)]
    round_trip(testbed, 0, everyone)

    report = leave_as(testbed, "leaf-0:0")
    assert report.excluded_at == "leaf-0", report
    assert report.text(JOB) == f"member leaf-0:0 of job {JOB} left: excluded at leaf-0"
    assert active(testbed, "leaf-0") == [1, 2] and members_count(testbed, "leaf-0") == 2
    assert active(testbed, "spine") == [0, 1] and active(testbed, "leaf-1") == [0, 1, 2]
    round_trip(testbed, 1, everyone[1:])  # rack 0 sums its two hosts left, in sync

    assert leave_as(testbed, "leaf-0:1").excluded_at == "leaf-0"
    report = leave_as(testbed, "leaf-0:2")  # rack 0's last host: the spine lets rack 0 go
    assert report.excluded_at == "spine (its leaf leaf-0 was done)", report
    assert active(testbed, "leaf-0") == [2]  # a leaf's job keeps one member
    assert active(testbed, "spine") == [1] and members_count(testbed, "spine") == 1
    round_trip(testbed, 2, everyone[HOSTS:])  # the spine's sync rounds: rack 1 alone

    assert leave_as(testbed, "leaf-1:0").excluded_at == "leaf-1"
    assert leave_as(testbed, "leaf-1:1").excluded_at == "leaf-1"
    last = leave_as(testbed, "leaf-1:2")  # the job's last member: it holds nobody up
    assert last.excluded_at == "", last
    assert "was its last active member" in last.text(JOB)
    assert active(testbed, "leaf-1") == [2] and active(testbed, "spine") == [1]
    # a member that left already leaves again without a change
    assert leave_as(testbed, "leaf-0:0").excluded_at == "leaf-0"
    assert active(testbed, "leaf-0") == [2]

    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "remove", str(JOB))
    assert (code, err) == (0, ""), err


def test_a_leave_waits_for_the_session_that_holds_the_switch(
        testbed: TwoLevelTestbed) -> None:  # noqa: F811 (the imported fixture)
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "add",
                            str(testbed.job_file))
    assert (code, err) == (0, ""), err
    reports: list[LeaveReport] = []
    with Switch(testbed.grpc["leaf-1"]):  # an operator's command, as `hysync` opens it
        leaving = threading.Thread(target=lambda: reports.append(leave_as(testbed, "leaf-1:0")))
        leaving.start()
        leaving.join(1.0)
        assert leaving.is_alive() and active(testbed, "leaf-1") == [0, 1, 2]
    leaving.join(30)
    assert [r.excluded_at for r in reports] == ["leaf-1"]
    assert active(testbed, "leaf-1") == [1, 2]


def test_a_leave_that_cannot_be_made_says_why_in_one_line_and_writes_nothing(
        testbed: TwoLevelTestbed) -> None:  # noqa: F811 (the imported fixture)
    with pytest.raises(LeaveError, match=r"^job 1 is not installed on the switch at .*"
                       r"install it with `hysync --inventory FILE job add JOB_FILE`") as err:
        leave_as(testbed, "leaf-0:0")
    assert "\n" not in str(err.value)

    code, out, err2 = hysync("--inventory", str(testbed.inventory), "job", "add",
                             str(testbed.job_file))
    assert (code, err2) == (0, ""), err2
    before = {name: testbed.tables(name) for name in testbed.grpc}
    # Another session held the leaf with an election id above the inventory's (10): the
    # switch elects only ids that high from then on, so a leave is refused at once.
    with Switch(testbed.grpc["leaf-0"], election_id=(0, 11)):
        pass
    with pytest.raises(LeaveError, match=r"^cannot leave through the switch at .*: not the "
                       r"primary controller .*a `hysync serve` takes its jobs' leaves"):
        leave_as(testbed, "leaf-0:0", wait=30.0)
    assert {name: testbed.tables(name) for name in testbed.grpc} == before


def test_a_leave_after_a_serve_held_the_switches_takes_the_inventorys_election_id(
        testbed: TwoLevelTestbed) -> None:  # noqa: F811 (the imported fixture)
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "add",
                            str(testbed.job_file))
    assert (code, err) == (0, ""), err
    for addr in testbed.grpc.values():  # as a serve or deploy leaves them: id 10 seen
        with Switch(addr, election_id=(0, 10)):
            pass
    assert leave_as(testbed, "leaf-0:0").excluded_at == "leaf-0"
    assert active(testbed, "leaf-0") == [1, 2]
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "remove", str(JOB))
    assert (code, err) == (0, ""), err


def test_on_one_switch_a_member_leaves_there_and_the_last_one_stays(
        testbed: TwoLevelTestbed, tmp_path: Path) -> None:  # noqa: F811 (the imported fixture)
    # leaf-0's softswitch as a switch of its own: no roles entry, its hosts the job's members
    job = tomllib.loads(testbed.job_file.read_text())
    members = [{k: v for k, v in m.items() if k != "leaf"} for m in job["members"]
               if m["leaf"] == "leaf-0"]
    job_file = tmp_path / "one-job.toml"
    job_file.write_text(toml_text(dict(job, members=members)))
    inventory = tmp_path / "one.toml"
    inventory.write_text(toml_text({
        "name": "one", "pool": {"job_slots": 32, "averaging_slots": 8},
        "switch": {"grpc_addr": testbed.grpc["leaf-0"], "target": "softswitch",
                   "p4info": str(P4INFO), "data_ipv4": testbed.data["leaf-0"]},
        "hosts": [{"name": f"h{h}", "interface": "lo", "ipv4": members[h]["ipv4"],
                   "mac": f"02:00:00:00:10:{h + 1:02x}", "switch_port": h + 1}
                  for h in range(HOSTS)]}))
    code, out, err = hysync("--inventory", str(inventory), "job", "add", str(job_file))
    assert (code, err) == (0, ""), err
    one = TwoLevelTestbed(inventory, job_file, testbed.grpc, testbed.data, testbed.hosts)

    inv, config = Inventory.load(inventory), JobConfig.load(job_file)
    reports = [leave(inv, config, job_member(inv, config, 0, HOSTS, str(w))) for w in (0, 1)]
    assert [r.excluded_at for r in reports] == [testbed.grpc["leaf-0"]] * 2
    assert active(one, "leaf-0") == [2] and members_count(one, "leaf-0") == 1
    round_trip(one, 0, [(0, 2)])  # the member left alone sums by itself
    last = leave(inv, config, job_member(inv, config, 0, HOSTS, "2"))
    assert last.excluded_at == "" and active(one, "leaf-0") == [2]
    code, out, err = hysync("--inventory", str(inventory), "job", "remove", str(JOB))
    assert (code, err) == (0, ""), err

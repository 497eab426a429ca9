"""A job across a spine and two leaves, installed by `hysync --inventory ... job add` over
real P4Runtime on three softswitch processes, each with its UDP data plane on its own
loopback address, and six hosts sending real HySync datagrams from real sockets
(docs/protocol.md §11): a sync round gives every host the exact sum of six; the spine
swapped alone to partial(1) leaves the late rack out; async is refused; a switch that
refuses its part leaves no entry behind on the others; removal clears every switch."""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hysync import p4names, wire
from hysync.controlplane.cli.main import main
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ValidationError
from hysync.controlplane.p4rt.entities import insert
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.policy.levels import LevelPolicies
from hysync.controlplane.tables import forwarding, roles
from hysync.p4schema import Schema
from hysync.wire import Mode, Op
from tests.raw_host import follow_rounds
from tests.softswitch.switch_process import softswitch_fabric
from tests.softswitch.two_level_fabric import contrib, lanes_of
from tests.testbed.conftest import toml_text

from .conftest import P4INFO, ROOT

LEAVES, HOSTS, JOB, SLOTS = 2, 3, 1, 4
DEADLINE = 20.0  # seconds a host waits for an answer that must come
JOB_TABLES = [p4names.ADMISSION_MEMBERS, p4names.ADMISSION_JOBS, p4names.SYNC_MODE_MODES,
              p4names.REPLICATION_REWRITE, roles.ROLES_TABLE]


@dataclass
class TwoLevelTestbed:
    inventory: Path
    job_file: Path
    grpc: dict[str, str]  # switch name -> P4Runtime address
    data: dict[str, str]  # switch name -> data address
    hosts: dict[tuple[int, int], socket.socket]  # (leaf, host) -> its socket

    def send(self, leaf: int, host: int, r: int, tx: int = 1) -> None:
        self.hosts[leaf, host].sendto(contrib(host, r, gradient(leaf, host, r), tx=tx),
                                      (self.data[f"leaf-{leaf}"], wire.HYSYNC_UDP_PORT))

    def receive(self, leaf: int, host: int) -> tuple[wire.Header, np.ndarray]:
        datagram = self.hosts[leaf, host].recv(65536)
        return wire.Header.unpack(datagram), lanes_of(datagram)

    def tables(self, name: str) -> dict[str, list]:
        with Switch(self.grpc[name], arbitrate=False) as switch:
            found = switch.read_tables(JOB_TABLES + [p4names.FORWARDING_L2])
            found["groups"] = [g for g in switch.read_groups() if g.group_id == JOB]
        return found


def gradient(leaf: int, host: int, r: int) -> np.ndarray:
    """Lanes that tell whose contributions a sum holds."""
    return np.arange(1, wire.LANES + 1, dtype=np.int64) * (1 << (3 * leaf + host)) + 1000 * r


def total(r: int, racks: list[int]) -> np.ndarray:
    return sum(gradient(i, h, r) for i in racks for h in range(HOSTS))


def hysync(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(params=["native", "python"])
def testbed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TwoLevelTestbed]:
    with ExitStack() as stack:
        fabric = stack.enter_context(softswitch_fabric(tmp_path, leaves=LEAVES, hosts=HOSTS,
                                                       engine=request.param))
        net = fabric.net
        hosts = {}
        for leaf in range(LEAVES):
            for host in range(HOSTS):
                sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                sock.bind((f"{net}.10", 0))
                sock.settimeout(DEADLINE)
                hosts[leaf, host] = sock
        members = [{"worker": h, "leaf": f"leaf-{i}", "ipv4": f"{net}.10",
                    "mac": f"02:00:00:00:1{i}:{h + 1:02x}",
                    "udp_port": hosts[i, h].getsockname()[1], "switch_port": h + 1}
                   for i in range(LEAVES) for h in range(HOSTS)]
        job_file = tmp_path / "job.toml"
        job_file.write_text(toml_text({"job_id": JOB, "mode": "sync",
                                       "slots": {"base": 0, "count": SLOTS},
                                       "members": members}))
        yield TwoLevelTestbed(fabric.inventory, job_file, fabric.grpc, fabric.data, hosts)


def test_a_job_across_two_leaves_sums_six_hosts_and_a_partial_spine_leaves_a_rack_out(
        testbed: TwoLevelTestbed) -> None:
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "add",
                            str(testbed.job_file))
    assert (code, err) == (0, ""), err
    assert "job 1 across 3 switches" in out and "leaf-1: installed" in out
    # Each switch holds its part: the spine admits the leaves, each leaf its hosts.
    spine = testbed.tables("spine")
    assert [r.params["level"] for r in spine[roles.ROLES_TABLE]] == [roles.SPINE]
    assert sorted(e.match["worker_id"] for e in spine[p4names.ADMISSION_MEMBERS]) == [0, 1]
    assert {wire.int_to_ip(e.match["src_addr"]) for e in spine[p4names.ADMISSION_MEMBERS]} == \
        {testbed.data["leaf-0"], testbed.data["leaf-1"]}
    epochs = {spine[p4names.ADMISSION_JOBS][0].params["epoch"]}
    for i in range(LEAVES):
        leaf = testbed.tables(f"leaf-{i}")
        (role,) = leaf[roles.ROLES_TABLE]
        assert role.params == {"level": roles.LEAF, "uplink_id": i,
                               "spine_addr": wire.ip_to_int(testbed.data["spine"]),
                               "spine_mac": 0x0200000000F1,
                               "leaf_addr": wire.ip_to_int(testbed.data[f"leaf-{i}"])}
        assert len(leaf[p4names.ADMISSION_MEMBERS]) == HOSTS
        assert ("02:00:00:00:00:f1", 9) in map(forwarding.l2_of, leaf[p4names.FORWARDING_L2])
        epochs.add(leaf[p4names.ADMISSION_JOBS][0].params["epoch"])
    assert len(epochs) == 1  # one install epoch on every switch of the job
    code, out, _ = hysync("--grpc-addr", testbed.grpc["leaf-1"], "job", "list")
    assert code == 0 and "3/3 members active" in out and (
        f"leaf, member 1 of the spine at {testbed.data['spine']}") in out, out

    # A sync round: every host gets the exact sum of six, count 6, its leaf's bitmap.
    for i in range(LEAVES):
        for h in range(HOSTS):
            testbed.send(i, h, 0)
    for i in range(LEAVES):
        for h in range(HOSTS):
            hdr, lanes = testbed.receive(i, h)
            assert (hdr.op, hdr.round, hdr.count, hdr.bitmap) == (Op.RESULT, 0, 6, 0b111)
            np.testing.assert_array_equal(lanes, total(0, [0, 1]))

    # The spine alone goes partial(1): racks stay sync inside, the first rack closes a round.
    code, out, err = hysync("--inventory", str(testbed.inventory), "mode", "set", "1",
                            "--slots", f"0-{SLOTS - 1}", "--level", "spine", "partial",
                            "--quorum", "1")
    assert (code, err) == (0, ""), err
    assert "spine slots 0-3: partial(1)" in out and "leaf" not in out
    assert [e.params["mode"] for e in testbed.tables("leaf-0")[p4names.SYNC_MODE_MODES]] == \
        [Mode.SYNC]
    code, out, err = hysync("--inventory", str(testbed.inventory), "mode", "show", "1")
    assert (code, err) == (0, ""), err
    assert out.splitlines() == [
        "job 1 at spine, 2 active members (leaves)", "  slots 0-3: partial(1)",
        "job 1 at leaf:leaf-0, 3 active members (hosts)", "  slots 0-3: sync",
        "job 1 at leaf:leaf-1, 3 active members (hosts)", "  slots 0-3: sync"], out
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "list")
    assert (code, err) == (0, "") and out.startswith(f"spine spine ({testbed.grpc['spine']}):\n"
                                                     "  job 1: slots 0-3, 2/2 members"), out
    for h in range(HOSTS):
        testbed.send(0, h, 1)
    for h in range(HOSTS):  # rack 0's sum is the round: count 3, its hosts' bits set
        hdr, lanes = testbed.receive(0, h)
        assert (hdr.op, hdr.round, hdr.count, hdr.bitmap, hdr.mode) == \
            (Op.RESULT, 1, HOSTS, 0b111, Mode.PARTIAL)
        np.testing.assert_array_equal(lanes, total(1, [0]))
    for h in range(HOSTS):  # rack 1 is left out: the result reaches it with its bits clear
        hdr, lanes = testbed.receive(1, h)
        assert (hdr.op, hdr.round, hdr.count, hdr.bitmap) == (Op.RESULT, 1, HOSTS, 0)
        np.testing.assert_array_equal(lanes, total(1, [0]))
    testbed.send(1, 2, 1)  # a late host of rack 1 asks: not counted, so it carries its part
    hdr, _ = testbed.receive(1, 2)
    assert hdr.op in (Op.RESULT, Op.RESYNC) and not hdr.bitmap >> 2 & 1

    # A second job across the same switches: other slots, other host ports (below the
    # ephemeral range the hosts' sockets took theirs from); at the spine both jobs admit the
    # same leaf addresses, told apart by job id.
    ports = iter(range(1001, 1100))
    second = testbed.job_file.with_name("job2.toml")
    second.write_text(re.sub(r"udp_port = \d+", lambda _: f"udp_port = {next(ports)}",
                             testbed.job_file.read_text())
                      .replace("job_id = 1", "job_id = 2").replace("base = 0", "base = 4"))
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "add", str(second))
    assert (code, err) == (0, ""), err
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "remove", "2")
    assert (code, err) == (0, ""), err
    assert ("02:00:00:00:00:f1", 9) in map(  # job 1 still needs the uplink's l2 entry
        forwarding.l2_of, testbed.tables("leaf-0")[p4names.FORWARDING_L2])

    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "remove", "1")
    assert (code, err) == (0, ""), err
    for name in testbed.grpc:
        tables = testbed.tables(name)
        assert all(tables[t] == [] for t in JOB_TABLES) and tables["groups"] == [], name
        assert tables[p4names.FORWARDING_L2] == []  # the hosts' and the uplink's entries too


def test_async_a_bad_level_and_a_level_without_inventory_are_refused_in_one_line(
        testbed: TwoLevelTestbed) -> None:
    assert hysync("--inventory", str(testbed.inventory), "job", "add",
                  str(testbed.job_file))[0] == 0
    inv = ("--inventory", str(testbed.inventory))
    cases = [
        (["mode", "set", "1", "--slots", "0-3", "async", *inv], 1,
         "async is not offered across switches"),
        (["mode", "set", "1", "--slots", "0-3", "--level", "leaf:leaf-7", "sync", *inv], 2,
         "no leaf 'leaf-7': the leaves are leaf-0, leaf-1"),
        (["mode", "set", "1", "--slots", "0-3", "--level", "rack", "sync", *inv], 2,
         "write spine, leaf (every leaf) or leaf:NAME"),
        (["mode", "set", "1", "--slots", "0-3", "--level", "spine", "partial", "--quorum",
          "3", *inv], 1, "quorum 3 at spine spine: it has 2 members (leaves)"),
        (["mode", "set", "1", "--slots", "0-3", "--level", "spine", "sync"], 2,
         "--level spine needs --inventory FILE"),
    ]
    for argv, status, fragment in cases:
        code, out, err = hysync(*argv)
        assert (code, out) == (status, ""), (argv, err)
        assert err.count("\n") == 1 and fragment in err, (argv, err)
    # Nothing was written: every level still sync.
    for name in testbed.grpc:
        assert [e.params["mode"] for e in testbed.tables(name)[p4names.SYNC_MODE_MODES]] == \
            [Mode.SYNC], name
    # One leaf alone, by name.
    code, out, err = hysync("mode", "set", "1", "--slots", "0-3", "--level", "leaf:leaf-1",
                            "partial", "--quorum", "2", *inv)
    assert (code, err) == (0, "") and "leaf-1 slots 0-3: partial(2)" in out, err
    assert [e.params["mode"] for e in testbed.tables("leaf-1")[p4names.SYNC_MODE_MODES]] == \
        [Mode.PARTIAL]
    assert [e.params["mode"] for e in testbed.tables("leaf-0")[p4names.SYNC_MODE_MODES]] == \
        [Mode.SYNC]


def test_a_switch_that_refuses_its_part_leaves_no_entry_on_the_others(
        testbed: TwoLevelTestbed) -> None:
    # leaf-1 already forwards a host's MAC to another port: it refuses the job.
    with Switch(testbed.grpc["leaf-1"]) as switch:
        switch.write([insert(forwarding.l2_entry("02:00:00:00:11:01", 7))])
    code, out, err = hysync("--inventory", str(testbed.inventory), "job", "add",
                            str(testbed.job_file))
    assert (code, out) == (1, "") and err.count("\n") == 1, err
    assert "switch leaf-1" in err and "MAC 02:00:00:00:11:01 is on port 7" in err, err
    for name in testbed.grpc:
        tables = testbed.tables(name)
        assert all(tables[t] == [] for t in JOB_TABLES) and tables["groups"] == [], name
    assert [forwarding.l2_of(e) for e in testbed.tables("leaf-1")[p4names.FORWARDING_L2]] == \
        [("02:00:00:00:11:01", 7)]
    assert testbed.tables("spine")[p4names.FORWARDING_L2] == []
    assert testbed.tables("leaf-0")[p4names.FORWARDING_L2] == []


def test_a_program_without_the_roles_table_cannot_be_a_leaf_or_spine() -> None:
    tofino1 = Schema.from_file(ROOT / "p4src" / "tna" / "hysync.tofino.p4info.txtpb")
    assert not roles.has_roles(tofino1) and roles.has_roles(Schema.from_file(P4INFO))
    for level in (roles.LEAF, roles.SPINE):
        with pytest.raises(ValidationError) as caught:
            roles.check_roles(tofino1, "leaf-0 (10.1.0.10:9559)", level)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith("the program on the switch at leaf-0 (10.1.0.10:9559) (tna) "
                                  "has no table HySyncIngress.admission.roles: it cannot be a "
                                  "leaf or a spine")


def test_the_tofino_2_program_is_a_spine_and_never_a_leaf() -> None:
    tofino2 = Schema.from_file(ROOT / "p4src" / "tna" / "hysync.tofino2.p4info.txtpb")
    assert roles.has_roles(tofino2) and not roles.runs_leaves(tofino2)
    assert roles.runs_leaves(Schema.from_file(P4INFO))
    roles.check_roles(tofino2, "spine (10.0.0.1:9559)", roles.SPINE)
    roles.check_roles(Schema.from_file(P4INFO), "leaf-0 (10.1.0.10:9559)", roles.LEAF)
    with pytest.raises(ValidationError) as caught:
        roles.check_roles(tofino2, "leaf-0 (10.1.0.10:9559)", roles.LEAF)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("the program on the switch at leaf-0 (10.1.0.10:9559) (t2na) runs "
                              "a job as its spine or on one switch, not as a leaf"), message


def drive(testbed: TwoLevelTestbed, leaf: int, host: int, stop: threading.Event,
          delay: float) -> None:
    """A host's rounds until `stop` (after `delay`: a slow rack)."""
    sock = testbed.hosts[leaf, host]
    sock.settimeout(0.5)
    follow_rounds(sock, lambda r, tx: testbed.send(leaf, host, r, tx), stop, delay=delay)


@pytest.mark.parametrize("testbed", ["native"], indirect=True)
def test_the_spines_policy_reads_the_spines_counters_and_swaps_the_spine_only(
        testbed: TwoLevelTestbed, tmp_path: Path) -> None:
    assert hysync("--inventory", str(testbed.inventory), "job", "add",
                  str(testbed.job_file))[0] == 0
    code, out, err = hysync("--inventory", str(testbed.inventory), "policy", "run", "1",
                            "--level", "spine", "--dry-run", "--duration", "0.5")
    assert (code, err) == (0, ""), err
    assert "policy adaptive on job 1 (dry run) at spine: " in out
    stop = threading.Event()
    hosts = [threading.Thread(target=drive, args=(testbed, i, h, stop, 0.05 if i else 0.0),
                              daemon=True) for i in range(LEAVES) for h in range(HOSTS)]
    log = tmp_path / "policy.jsonl"
    with ExitStack() as stack:
        switches = {name: stack.enter_context(Switch(addr)) for name, addr in
                    testbed.grpc.items()}
        levels = [("spine", Controller(switches["spine"]).attach())]
        decided: list[tuple[str, object, str]] = []

        def echo(record: dict[str, object]) -> None:
            if record.get("action") == "set_mode":
                decided.append((str(record["level"]), record["mode"], str(record["reason"])))
                stop.set()

        for thread in hosts:
            thread.start()
        try:
            with LevelPolicies(levels, JOB, interval=0.25, log_path=log, echo=echo) as policy:
                policy.run(duration=90, stop=stop)
        finally:
            stop.set()
            for thread in hosts:
                thread.join(5)
    # The slow rack is the spine's member 1 (leaf-1's uplink): the spine's policy sees it
    # close every round and leaves it out, without async (not offered across switches).
    assert decided and decided[0][:2] == ("spine", "partial"), decided
    assert "worker 1 slow" in decided[0][2], decided
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["level"] for r in records} == {"spine"} and records[0]["action"] == "start"
    spine_modes = [e.params["mode"] for e in testbed.tables("spine")[p4names.SYNC_MODE_MODES]]
    assert Mode[str(decided[0][1]).upper()] in spine_modes  # the swap reached the spine
    for i in range(LEAVES):  # the leaves' modes are theirs: untouched
        assert [e.params["mode"] for e in testbed.tables(f"leaf-{i}")[
            p4names.SYNC_MODE_MODES]] == [Mode.SYNC]


@pytest.mark.parametrize("testbed", ["native"], indirect=True)
def test_with_every_level_run_the_spine_measures_each_leaf_by_its_hosts_pace(
        testbed: TwoLevelTestbed, tmp_path: Path) -> None:
    assert hysync("--inventory", str(testbed.inventory), "job", "add",
                  str(testbed.job_file))[0] == 0
    stop = threading.Event()
    # Rack 1's hosts take 5x longer a round than rack 0's.
    hosts = [threading.Thread(target=drive, args=(testbed, i, h, stop, 0.05 if i else 0.01),
                              daemon=True) for i in range(LEAVES) for h in range(HOSTS)]
    log = tmp_path / "policy.jsonl"
    with ExitStack() as stack:
        levels = [(name if name == "spine" else f"leaf:{name}",
                   Controller(stack.enter_context(Switch(addr))).attach())
                  for name, addr in testbed.grpc.items()]
        for thread in hosts:
            thread.start()
        try:
            with LevelPolicies(levels, JOB, interval=0.25, log_path=log) as policies:
                spine = next(r for r in policies.runners if r.level == "spine")
                assert spine.racks is not None and sorted(spine.racks.leaves) == [0, 1]
                # Until the spine has measured leaf 1 in partial(1), then 5 s more: the
                # cost model keeps partial(1) while the rack stays slow.
                deadline, measured_at = time.monotonic() + 60, None
                while time.monotonic() < deadline and (
                        measured_at is None or time.monotonic() < measured_at + 5):
                    time.sleep(0.25)
                    policies.step()
                    h = spine.policy.health.get(1)
                    if measured_at is None and h is not None and h.basis == "pace":
                        measured_at = time.monotonic()
                health = spine.policy.health
                mode = (spine.policy.mode, spine.policy.quorum)
        finally:
            stop.set()
            for thread in hosts:
                thread.join(5)
    assert measured_at is not None, [d.describe() for d in spine.policy.decisions]
    # Leaf 1's hosts send a round per 50 ms against rack 0's per 10 ms and a round trip:
    # measured by its hosts it is several times slower, and partial(1) holds.
    assert health[1].state.value == "slow" and health[1].slowdown is not None
    assert health[1].slowdown >= 2.0, health[1].describe()
    assert health[0].state.value == "healthy"
    assert mode == (Mode.PARTIAL, 1), [d.describe() for d in spine.policy.decisions]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    spine_records = [r for r in records if r["level"] == "spine"]
    assert spine_records[0]["action"] == "start" and spine_records[0]["pace"] == "hosts"
    assert all(r.get("pace") is None for r in records if r["level"] != "spine")

"""`hysync serve` across a spine and two leaves runs the adaptive policy of an admitted job
at every level (controlplane/serve/fabric_server.py, controlplane/policy/levels.py), over
real P4Runtime on three softswitch processes, each with its UDP data plane on its own
loopback address, and four hosts sending real HySync datagrams from real sockets: the
policy reads each switch's counters through the sessions serve holds, a counter read that
misses its deadline skips a tick and the policy goes on, a slow rack is left out at the
spine alone (the mode read back from the spine), an operator's mode set holds the policy
until it is handed back, and the policy stops when a member leaves or the job is removed.
Bad requests get one line and change nothing."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hysync import p4names, wire
from hysync.controlplane.cli.main import main
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.policy.levels import LevelPolicies
from hysync.controlplane.serve.client import ServeClient, ServeError
from hysync.controlplane.serve.fabric_server import FabricServer
from hysync.controlplane.serve.prometheus_collector import ServeCollector
from hysync.controlplane.serve.server import SERVE
from hysync.controlplane.testbed.inventory import Inventory
from hysync.wire import Mode, Op
from tests.raw_host import follow_rounds
from tests.softswitch.switch_process import softswitch_fabric

from .conftest import ANY_PORT, fabric_inventory, published, toml_text

LEAVES, HOSTS = 2, 2
WORLD = LEAVES * HOSTS
WAIT = 120.0  # seconds: a generous deadline for what must happen, on a busy machine
SLOW = 0.05  # seconds the slow rack's hosts wait before each contribution


@dataclass
class PolicyBed:
    inv: Inventory
    grpc: dict[str, str]  # switch name -> P4Runtime address
    data: dict[str, str]  # switch name -> data address
    server: FabricServer
    log: Path  # serve's policy log
    sockets: dict[int, socket.socket]  # the admit's worker id -> its host's socket

    def modes(self, name: str) -> list[tuple[int, int]]:
        """(mode, quorum) of each of the switch's mode entries, read in a session of its
        own that asks for no role (serve stays the primary)."""
        with Switch(self.grpc[name], arbitrate=False) as switch:
            rows = switch.read_tables([p4names.SYNC_MODE_MODES])[p4names.SYNC_MODE_MODES]
        return sorted((e.params["mode"], e.params.get("quorum", 0)) for e in rows)

    def records(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[PolicyBed]:
    with ExitStack() as stack:
        fabric = stack.enter_context(softswitch_fabric(tmp_path, leaves=LEAVES, hosts=HOSTS,
                                                       engine="native"))
        data = fabric_inventory(tuple(fabric.grpc.values()), net=fabric.net, hosts=HOSTS)
        data["serve"] = {"listen": ANY_PORT}
        fabric.inventory.write_text(toml_text(data))
        sockets = {}
        for rank in range(WORLD):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            sock.bind((f"{fabric.net}.10", 0))
            sock.settimeout(0.5)
            sockets[rank] = sock
        log = tmp_path / "policy.jsonl"
        # policy_scale: the policy's dwell and windows shortened, as for a short test run
        server = published(FabricServer(Inventory.load(fabric.inventory), policy="adaptive",
                                        policy_interval=0.25, policy_scale=0.5,
                                        policy_log=log).start())
        stack.callback(server.close)
        yield PolicyBed(Inventory.load(fabric.inventory), fabric.grpc, fabric.data, server,
                        log, sockets)


def host_of(rank: int) -> str:
    return f"h{rank // HOSTS}-{rank % HOSTS}"  # ranks 0, 1 behind leaf-0; 2, 3 behind leaf-1


def hysync(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def wait_for(what: str, ready: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {WAIT:g} s"
        time.sleep(0.1)


def missing_deadlines(bed: PolicyBed, switch: str, what: str,
                      ready: Callable[[], object]) -> None:
    """Serve's reads of `switch` miss their gRPC deadline until `ready`."""
    session = bed.server.switches[switch]
    with bed.server.lock:
        session.timeout = 1e-6
    wait_for(what, ready)
    with bed.server.lock:
        session.timeout = bed.server.timeout


def admit(bed: PolicyBed, client: ServeClient, **fields: object) -> dict:
    members = [{"worker": r, "host": host_of(r), "ranks": [r],
                "udp_port": bed.sockets[r].getsockname()[1]} for r in range(WORLD)]
    return client.request({"op": "admit", "members": members, **fields})


def drive(bed: PolicyBed, reply: dict, rank: int, stop: threading.Event, delay: float) -> None:
    """A host's rounds until `stop`, sent to its leaf as its worker id there (after `delay`:
    a slow rack)."""
    job = reply["jobs"][0]
    place = reply["placement"][str(rank)]
    sock, to = bed.sockets[rank], (place["ipv4"], place["udp_port"])
    lanes = np.full(wire.LANES, rank + 1, dtype=">i4").tobytes()

    def send(r: int, tx: int) -> None:
        sock.sendto(wire.Header(op=Op.CONTRIB, job_id=job["job_id"], worker_id=place["worker"],
                                slot=job["slot_base"], round=r, chunk=r,
                                flags=(tx << wire.TX_SHIFT) & wire.TX_MASK).pack() + lanes, to)

    follow_rounds(sock, send, stop, delay=delay)


def spine_partial(bed: PolicyBed) -> bool:
    return any(r.get("level") == "spine" and r.get("action") == "set_mode" and
               r.get("mode") == "partial" and r.get("applied") for r in bed.records())


def test_serve_runs_the_policy_at_every_level_and_leaves_a_slow_rack_out_at_the_spine(
        bed: PolicyBed, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    client = ServeClient(bed.server.address)
    stop = threading.Event()
    hosts: list[threading.Thread] = []
    try:
        reply = admit(bed, client, policy="adaptive", name="slow-rack")
        job_id, lo = reply["jobs"][0]["job_id"], reply["jobs"][0]["slot_base"]
        slots = f"{lo}-{lo + reply['jobs'][0]['slot_count'] - 1}"
        policies = bed.server.leases[job_id].policy
        assert isinstance(policies, LevelPolicies)
        # one policy per level, each on the controller (the primary session) serve holds
        assert [r.level for r in policies.runners] == ["spine", "leaf:leaf-0", "leaf:leaf-1"]
        for runner, name in zip(policies.runners, ["spine", "leaf-0", "leaf-1"], strict=True):
            assert runner.controller is bed.server.fabric.controllers[name]
        status = bed.server.handle(SERVE, {"op": "status"})
        assert [j["policy"] for j in status["jobs"]] == [True], status
        # status shows the spine's job: its members are the leaves, each named by the leaf
        # and the ranks behind it (not by the admit's worker of the same number)
        assert status["jobs"][0]["hosts"] == [
            {"member": 0, "host": None, "leaf": "leaf-0", "ranks": [0, 1]},
            {"member": 1, "host": None, "leaf": "leaf-1", "ranks": [2, 3]}], status
        starts = [r for r in bed.records() if r["action"] == "start"]
        assert sorted(r["level"] for r in starts) == ["leaf:leaf-0", "leaf:leaf-1", "spine"]

        # A counter read at the spine that misses its gRPC deadline: the spine's tick is
        # skipped and counted, the leaves' go on, the policy keeps running.
        missing_deadlines(bed, "spine", "skipped spine read", lambda: policies.skipped_reads >= 2)
        assert f"job {job_id} at spine: the counter read missed its deadline" in caplog.text
        assert bed.server.leases[job_id].policy is policies
        # serve's metrics count them (and show the spine's members: the leaves)
        metrics = {m.name: m for m in ServeCollector(bed.server).collect()}
        skipped = metrics["hysync_policy_skipped_reads"].samples
        assert [(s.labels, s.value >= 2) for s in skipped] == [({"job": str(job_id)}, True)]
        members = {s.labels["state"]: s.value for s in metrics["hysync_job_members"].samples}
        assert members["healthy"] == LEAVES, members
        named = {(s.labels["worker"], s.labels["host"], s.labels["ranks"])
                 for s in metrics["hysync_member_host_info"].samples}
        assert named == {("0", "", "0, 1"), ("1", "", "2, 3")}, named
        # A leaf's counters that miss their deadline: the spine's read of its hosts' pace
        # is counted too (that tick the spine measures by its own counters).
        racks = policies.runners[0].racks
        assert racks is not None and racks.missed_reads == 0
        missing_deadlines(bed, "leaf-1", "missed leaf read", lambda: racks.missed_reads >= 1)
        assert "the counters of leaf member" in caplog.text
        # (counters only grow: each total is read after its parts)
        parts = sum(r.skipped_reads for r in policies.runners) + racks.missed_reads
        metrics = {m.name: m for m in ServeCollector(bed.server).collect()}
        [sample] = metrics["hysync_policy_skipped_reads"].samples
        assert sample.value >= parts >= 2 + 1, (sample, parts)

        # leaf-1's hosts slow: at the spine, leaf-1 is the member that closes every round
        hosts = [threading.Thread(target=drive, daemon=True,
                                  args=(bed, reply, rank, stop, SLOW if rank >= HOSTS else 0.0))
                 for rank in range(WORLD)]
        for thread in hosts:
            thread.start()
        wait_for("spine partial decision", lambda: spine_partial(bed))
        decision = next(r for r in bed.records() if r.get("level") == "spine"
                        and r.get("action") == "set_mode")
        # leaf-1 is the spine's member 1: the spine's policy names it, and its record names
        # the leaf and the job's ranks behind it (the leaf in a field of its own)
        assert "worker 1 slow" in decision["reason"], decision
        measured = decision["inputs"]["workers"]
        assert {w: (m["leaf"], m["ranks"], m["host"]) for w, m in measured.items()} == {
            "0": ("leaf-0", [0, 1], None), "1": ("leaf-1", [2, 3], None)}, measured
        assert "leaf" not in decision  # a mode set names no one member
        # the swap reached the spine, written through serve's session (no other session is
        # primary: serve holds every switch)
        assert any(mode == Mode.PARTIAL for mode, _ in bed.modes("spine")), bed.modes("spine")
        # serve's log names the level each decision acted on
        assert f"job {job_id}: spine: mode partial(" in caplog.text, caplog.text[-3000:]
        # ... and the spine's event names the slow rack by its leaf and ranks
        swap = next(r for r in caplog.records if getattr(r, "hysync_event", None) == "mode_swap"
                    and r.hysync_fields.get("job_level") == "spine")  # type: ignore[attr-defined]
        assert swap.getMessage().endswith("; slow member 1 (leaf leaf-1, ranks 2, 3)"), swap
        assert swap.hysync_fields["leaves"] == [  # type: ignore[attr-defined]
            {"member": 1, "host": None, "leaf": "leaf-1", "ranks": [2, 3], "state": "slow"}]
        # the leaves' records name their hosts, as on one switch: no `leaf` field
        assert not any("leaf" in m for r in bed.records() if r.get("level", "").startswith(
            "leaf:") for m in r.get("inputs", {}).get("workers", {}).values()), bed.records()
        assert all(r.get("level") in ("spine", "leaf:leaf-0", "leaf:leaf-1")
                   for r in bed.records())

        # The operator's mode set at the spine holds the policy at every level; resume
        # hands it back.
        code, out, err = hysync("--serve", bed.server.address, "mode", "set", str(job_id),
                                "--slots", slots, "sync", "--level", "spine")
        assert (code, err) == (0, ""), err
        assert bed.server.leases[job_id].held
        assert {mode for mode, _ in bed.modes("spine")} == {Mode.SYNC}
        overrides = [r for r in bed.records() if r["action"] == "override"]
        assert sorted(r["level"] for r in overrides) == ["leaf:leaf-0", "leaf:leaf-1", "spine"]
        code, out, err = hysync("--serve", bed.server.address, "policy", "resume", str(job_id))
        assert (code, err) == (0, ""), err
        assert not bed.server.leases[job_id].held

        # a member that finishes stops the policy at every level
        stop.set()
        for thread in hosts:
            thread.join(10)
        client.request({"op": "leave", "job": job_id, "worker": 0, "key": reply["key"]})
        assert bed.server.leases[job_id].policy is None
        status = bed.server.handle(SERVE, {"op": "status"})
        assert [j["policy"] for j in status["jobs"]] == [False], status
        assert f"job {job_id}: worker 0 finished; policy stopped at every level" in caplog.text
        client.request({"op": "release"})
        assert job_id not in bed.server.leases
    finally:
        stop.set()
        for thread in hosts:
            thread.join(10)
        client.close()


def test_bad_requests_get_one_line_and_change_nothing_and_removal_stops_the_policy(
        bed: PolicyBed) -> None:
    with ServeClient(bed.server.address) as client:
        reply = admit(bed, client)  # serve's --policy: adaptive
        job_id, lo = reply["jobs"][0]["job_id"], reply["jobs"][0]["slot_base"]
        slots = f"{lo}-{lo + reply['jobs'][0]['slot_count'] - 1}"
        policies = bed.server.leases[job_id].policy
        assert isinstance(policies, LevelPolicies) and len(policies.runners) == 3
        before = {name: bed.modes(name) for name in bed.grpc}
        records = len(bed.records())
        for argv, said in (
                (("mode", "set", str(job_id), "--slots", slots, "partial", "--quorum", "1",
                  "--level", "rack"), "--level 'rack'"),
                (("mode", "set", str(job_id), "--slots", slots, "partial", "--level",
                  "leaf:leaf-9"), "no leaf 'leaf-9'"),
                (("mode", "set", "99", "--slots", slots, "partial", "--level", "spine"),
                 "job 99"),
                (("policy", "resume", "99"), "job 99 has no policy"),
                (("policy", "resume", str(job_id)), "is not held")):
            code, out, err = hysync("--serve", bed.server.address, *argv)
            assert code == 1 and err.count("\n") == 1 and said in err, (argv, err)
        for request, said in (
                ({"op": "admit", "members": [{"worker": 0, "host": "h0-0", "udp_port": 1}],
                  "policy": "fastest"}, "policy"),
                ({"op": "policy_resume", "job": 0}, "job")):
            with pytest.raises(ServeError, match=said) as refused:
                client.request(request)
            assert "\n" not in str(refused.value)
        # nothing changed: the modes on every switch, the policy running and not held
        assert {name: bed.modes(name) for name in bed.grpc} == before
        lease = bed.server.leases[job_id]
        assert lease.policy is policies and not lease.held
        assert not [r for r in bed.records()[records:] if r["action"] in ("override", "resume")]
        assert sorted(bed.server.leases) == [job_id]

        # the operator removes the job: its policy stops with it
        code, out, err = hysync("--serve", bed.server.address, "job", "remove", str(job_id))
        assert (code, err) == (0, ""), err
        assert job_id not in bed.server.leases  # serve's tick steps only its leases' policies
        for name in bed.grpc:
            assert bed.modes(name) == [], name

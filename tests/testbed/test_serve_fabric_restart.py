"""`hysync serve` across a spine and two leaves connects again to a switch that restarted
(controlplane/serve/fabric_server.py), over real P4Runtime on three softswitch processes,
each with its UDP data plane on its own loopback address, and four hosts sending real
HySync datagrams from real sockets. A leaf's process, then the spine's, is killed and
started again bare (no pipeline): while it is down requests fail naming it and serve logs
each new reason once; then serve pushes its pipeline and forwarding, installs the admitted
job again on every switch (same slots, members and modes, one new install epoch on all
three), and the hosts' rounds complete again with results under the new install tag. A
host excluded at a leaf and a leaf's own mode stay as they were, whether that leaf kept
its part or lost it, and the job's model-averaging job is installed again with it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from hysync import wire
from hysync.controlplane.controller import Controller
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.serve.client import ServeClient, ServeError
from hysync.controlplane.serve.fabric_server import FabricServer
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.testbed.inventory import Inventory
from hysync.wire import Op
from tests.raw_host import follow_rounds

from .conftest import ANY_PORT, P4INFO, fabric_inventory, published, toml_text
from .test_switch_restart import SwitchProcess

LEAVES, HOSTS = 2, 2
WORLD = LEAVES * HOSTS
NAMES = ["spine"] + [f"leaf-{i}" for i in range(LEAVES)]
WAIT = 120.0  # seconds: a generous deadline for what must happen, on a busy machine
TOTAL = sum(rank + 1 for rank in range(WORLD))  # each lane of a round's result
ROUNDS = 3  # rounds every host completes before a kill and after the job is back


@dataclass
class Host:
    """One member's host: sends its contribution to its leaf as its worker id there, waits
    for the round's answer (resends on a timeout), follows the round the answer names
    (back to a new install's first round too), and keeps each result's install tag and
    lanes."""

    rank: int
    sock: socket.socket
    results: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (tag, lanes)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, job: dict, place: dict, stop: threading.Event) -> None:
        to = (place["ipv4"], place["udp_port"])
        lanes = np.full(wire.LANES, self.rank + 1, dtype=">i4").tobytes()

        def send(r: int, tx: int) -> None:
            self.sock.sendto(wire.Header(op=Op.CONTRIB, job_id=job["job_id"],
                                         worker_id=place["worker"], slot=job["slot_base"],
                                         round=r, chunk=r,
                                         flags=(tx << wire.TX_SHIFT) & wire.TX_MASK).pack()
                             + lanes, to)

        def keep(hdr: wire.Header, data: bytes) -> None:
            with self.lock:
                self.results.append((hdr.reason, np.frombuffer(
                    data[wire.HEADER_BYTES:], dtype=">i4").copy()))

        # Back too: a new install's slot, whose rounds start again at 0 (docs/protocol.md §9,
        # "A switch that lost the job's state").
        follow_rounds(self.sock, send, stop, back=True, on_result=keep)

    def with_tag(self, tag: int) -> list[np.ndarray]:
        with self.lock:
            return [lanes for t, lanes in self.results if t == tag]


@dataclass
class RestartBed:
    inv: Inventory
    switches: dict[str, SwitchProcess]
    server: FabricServer
    said: list[str]
    hosts: dict[int, Host]

    def installed(self, job_id: int) -> dict[str, InstalledJob]:
        """The job as each switch holds it, read in a session of the test's own that asks
        for no role (serve stays the primary)."""
        parts = {}
        for name, sw in self.switches.items():
            with Switch(sw.grpc_addr, arbitrate=False) as session:
                parts[name] = Controller(session).job(job_id)
        return parts

    def lines(self, text: str) -> list[str]:
        return [line for line in list(self.said) if text in line]


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[RestartBed]:
    with ExitStack() as stack:
        net = f"127.{np.random.randint(100, 250)}.{np.random.randint(1, 250)}"
        switches = {}
        for i, name in enumerate(NAMES):
            sw = SwitchProcess(tmp_path / f"{name}.log")
            sw.udp = (f"{net}.{1 + i}", wire.HYSYNC_UDP_PORT)  # the spine .1, leaf i .(2 + i)
            stack.callback(sw.stop)
            sw.start()
            with Switch(sw.grpc_addr) as session:
                session.push_pipeline(P4INFO)
            switches[name] = sw
        data = fabric_inventory(tuple(sw.grpc_addr for sw in switches.values()), net=net,
                                hosts=HOSTS)
        data["serve"] = {"listen": ANY_PORT}
        path = tmp_path / "fabric.toml"
        path.write_text(toml_text(data))
        hosts = {}
        for rank in range(WORLD):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            sock.bind((f"{net}.10", 0))
            sock.settimeout(0.5)
            hosts[rank] = Host(rank, sock)
        said: list[str] = []
        server = published(FabricServer(Inventory.load(path), policy=None, policy_interval=0.2,
                                        say=said.append).start())
        stack.callback(server.close)
        yield RestartBed(Inventory.load(path), switches, server, said, hosts)


def wait_for(what: str, ready: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT
    while not ready():
        assert time.monotonic() < deadline, f"no {what} within {WAIT:g} s"
        time.sleep(0.05)


def host_of(rank: int) -> str:
    return f"h{rank // HOSTS}-{rank % HOSTS}"  # ranks 0, 1 behind leaf-0; 2, 3 behind leaf-1


def rounds_done(bed: RestartBed, tag: int) -> bool:
    """Every host completed ROUNDS rounds whose results carry install tag `tag`."""
    return all(len(h.with_tag(tag)) >= ROUNDS for h in bed.hosts.values())


def rounds_under(bed: RestartBed, tag: int, when: str) -> None:
    """Every host completes ROUNDS rounds under install tag `tag`, each the sum of all."""
    wait_for(f"rounds {when}", lambda: rounds_done(bed, tag))
    for host in bed.hosts.values():
        for lanes in host.with_tag(tag):
            assert (lanes == TOTAL).all(), (host.rank, lanes)


def restart(bed: RestartBed, client: ServeClient, restarted: str, job_id: int,
            before: dict[str, InstalledJob],
            also: dict[int, dict[str, InstalledJob]] | None = None,
            ) -> tuple[dict[str, InstalledJob], int]:
    """Kill switch `restarted`, check that serve refuses what needs it while it is down,
    start it again bare and check that serve installed the job again on every switch as
    it was under one new epoch: (the job on each switch now, its install tag). `also`:
    other jobs of the lease (an averaging job) and each switch's part of them, checked
    alike and updated in place."""
    sw = bed.switches[restarted]
    addr = sw.grpc_addr
    failed = f"switch {restarted} ({addr})"
    backs = len(bed.lines("is back"))
    sw.kill()
    wait_for(f"serve to see {restarted} gone", lambda: bed.lines(failed))
    # While it is down, a request that needs it fails with one line naming it.
    with pytest.raises(ServeError) as refused:
        client.request({"op": "admit", "members": [{"worker": 0, "host": "h1-0",
                                                    "udp_port": 1}]})
    assert str(refused.value).startswith(f"switch {restarted} ({addr}) restarted or its "
                                         "connection broke: serve connects again"), \
        str(refused.value)
    time.sleep(1.0)  # ticks go by: the same reason is not logged again
    failures = bed.lines(failed)
    assert len(failures) == len(set(failures)), failures
    assert any(f"switch(es) {restarted} ended" in line for line in bed.said), bed.said

    sw.start()  # bare: no pipeline, no forwarding, no job
    wait_for(f"serve to connect again to {restarted}",
             lambda: len(bed.lines("is back")) > backs)
    line = bed.lines("is back")[-1]
    assert line.startswith(f"switch {restarted} is back after"), line
    assert f"no pipeline on {restarted}: pipeline and forwarding pushed" in line, line
    also = also if also is not None else {}
    jobs = ", ".join(map(str, sorted([job_id, *also])))
    assert f"jobs {jobs} installed again on every switch" in line, line

    for other, parts in also.items():
        parts.update(installed_again(bed, other, parts))
    after = installed_again(bed, job_id, before)
    tag = wire.install_tag(after["spine"].epoch)
    assert tag != wire.install_tag(before["spine"].epoch)
    return after, tag


def installed_again(bed: RestartBed, job_id: int,
                    before: dict[str, InstalledJob]) -> dict[str, InstalledJob]:
    """The job on each switch now: as it was `before` at each level, under one new epoch."""
    after = bed.installed(job_id)
    epochs = {p.epoch for p in after.values()}
    assert len(epochs) == 1, after  # one new epoch on every switch
    assert epochs.isdisjoint({p.epoch for p in before.values()})
    for name in NAMES:  # the same job, at each level
        was, now = before[name], after[name]
        assert (now.slots, now.members, now.active, now.modes, now.role) == \
            (was.slots, was.members, was.active, was.modes, was.role), (job_id, name)
    return after


def test_serve_installs_the_job_again_on_every_switch_after_a_leaf_and_the_spine_restart(
        bed: RestartBed) -> None:
    client = ServeClient(bed.server.address)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        members = [{"worker": r, "host": host_of(r),
                    "udp_port": bed.hosts[r].sock.getsockname()[1]} for r in range(WORLD)]
        reply = client.request({"op": "admit", "members": members, "name": "restarts"})
        job = reply["jobs"][0]
        job_id = job["job_id"]
        for rank, host in bed.hosts.items():
            t = threading.Thread(target=host.run, args=(job, reply["placement"][str(rank)],
                                                        stop), daemon=True)
            t.start()
            threads.append(t)
        before = bed.installed(job_id)
        assert len({p.epoch for p in before.values()}) == 1, before
        tag = wire.install_tag(before["spine"].epoch)
        rounds_under(bed, tag, "through both levels")

        for restarted in ("leaf-0", "spine"):
            before, tag = restart(bed, client, restarted, job_id, before)
            # The hosts resynchronize with the new install and their rounds complete again.
            rounds_under(bed, tag, f"after {restarted} came back")

        status = client.request({"op": "status"})
        assert [j["job_id"] for j in status["jobs"]] == [job_id], status
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        client.close()


def test_exclusions_and_modes_of_each_level_are_installed_again_as_they_were(
        bed: RestartBed) -> None:
    """A host excluded at leaf-1 and leaf-1's own mode stay as they were, whether leaf-1
    kept its part (leaf-0 restarted: removed and installed again from what leaf-1 holds)
    or lost it (leaf-1 restarted: installed from what serve read before). The job's
    model-averaging job is installed again with it, as it was."""
    client = ServeClient(bed.server.address)
    try:
        members = [{"worker": r, "host": host_of(r), "udp_port": 43000 + r,
                    "avg_udp_port": 43100 + r} for r in range(WORLD)]
        job_id, avg_id = (j["job_id"] for j in
                          client.request({"op": "admit", "members": members})["jobs"])
        averaging = {avg_id: bed.installed(avg_id)}
        assert set(averaging[avg_id]) == set(NAMES), averaging
        excluded = client.request({"op": "exclude", "job": job_id, "worker": 3})
        assert (excluded["leaf"], excluded["leaf_worker"]) == ("leaf-1", 1), excluded
        client.request({"op": "mode_set", "job": job_id, "mode": "partial", "quorum": 1,
                        "level": "leaf:leaf-1"})
        before = bed.installed(job_id)
        assert set(before["leaf-1"].active) == {0}, before["leaf-1"]
        assert before["leaf-1"].modes != before["leaf-0"].modes, before
        for restarted in ("leaf-0", "leaf-1"):
            before, _ = restart(bed, client, restarted, job_id, before, also=averaging)
            assert set(before["leaf-1"].active) == {0}, before["leaf-1"]
        # release removes both jobs from every switch, the restarted ones too
        client.request({"op": "release"})
        for name, sw in bed.switches.items():
            with Switch(sw.grpc_addr, arbitrate=False) as session:
                assert Controller(session).list_jobs() == [], name
    finally:
        client.close()

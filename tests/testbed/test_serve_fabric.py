"""`hysync serve` across a spine and two leaves (controlplane/serve/fabric_server.py), over
real P4Runtime on three softswitch processes, each with its UDP data plane on its own
loopback address: four ranks admitted for real (`hysync.torch.admit`, two hosts behind each
leaf) get their leaf's address and worker id there, all-reduce through both levels, leave
through the serve (at their leaf, and the rack at the spine once its last host is done), a
mode set names a level, and the switches hold nothing once the job is released. Admitted
with background averaging, the model-averaging job is placed and installed on every switch
as the training job is, averages replicas that started apart into one model under torchrun,
and goes with the release. A leaf that refuses its part leaves no entry on any switch; bad
requests get one line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hysync import p4names
from hysync.controlplane.cli.main import main
from hysync.controlplane.controller import Controller
from hysync.controlplane.p4rt.entities import insert
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.serve.client import ServeClient, ServeError
from hysync.controlplane.serve.fabric_server import FabricServer
from hysync.controlplane.serve.server import SERVE
from hysync.controlplane.tables import forwarding, roles
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.testbed.inventory import Inventory
from hysync.topologies.rendezvous import torchrun_rendezvous
from hysync.torch import Admitted, admit
from hysync.wire import Mode
from tests.softswitch.switch_process import softswitch_fabric

from .conftest import (
    ANY_PORT,
    ROOT,
    fabric_inventory,
    kill_tree,
    published,
    rank_records,
    toml_text,
)
from .test_hosts import QUANTIZATION, together
from .test_torchrun import TARGET_ACCURACY

LEAVES, HOSTS = 2, 2
WORLD = LEAVES * HOSTS
WAIT = 60.0  # seconds: a generous deadline for a round on a busy machine
TRAIN_WAIT = 500  # seconds: four ranks training 150 steps through three switches, loaded
STEPS = 150
SCRIPT = Path(__file__).with_name("fabric_train.py")
JOB_TABLES = [p4names.ADMISSION_MEMBERS, p4names.ADMISSION_JOBS, p4names.SYNC_MODE_MODES,
              p4names.REPLICATION_REWRITE, roles.ROLES_TABLE]


@dataclass
class Served:
    inv: Inventory
    grpc: dict[str, str]  # switch name -> P4Runtime address
    data: dict[str, str]  # switch name -> data address
    server: FabricServer
    events: list[str]

    def tables(self, name: str) -> dict[str, list]:
        with Switch(self.grpc[name], arbitrate=False) as switch:
            return switch.read_tables(JOB_TABLES + [p4names.FORWARDING_L2])

    def job_entries(self, name: str) -> int:
        tables = self.tables(name)
        return sum(len(tables[t]) for t in JOB_TABLES)

    def installed(self, job_id: int) -> dict[str, InstalledJob]:
        """The job as each switch holds it (read back in a session of the test's own)."""
        parts = {}
        for name, addr in self.grpc.items():
            with Switch(addr, arbitrate=False) as session:
                parts[name] = Controller(session).job(job_id)
        return parts


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with softswitch_fabric(tmp_path, leaves=LEAVES, hosts=HOSTS, engine="native") as fabric:
        data = fabric_inventory(tuple(fabric.grpc.values()), net=fabric.net, hosts=HOSTS)
        data["serve"] = {"listen": ANY_PORT}
        fabric.inventory.write_text(toml_text(data))
        events: list[str] = []
        server = published(FabricServer(Inventory.load(fabric.inventory), policy=None,
                                        say=events.append).start())
        bed = Served(Inventory.load(fabric.inventory), fabric.grpc, fabric.data, server, events)
        try:
            yield bed
        finally:
            bed.server.close()  # the one running now (a test may have restarted it)


def hysync(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def host_of(rank: int) -> str:
    return f"h{rank // HOSTS}-{rank % HOSTS}"  # ranks 0, 1 behind leaf-0; 2, 3 behind leaf-1


def mean_of(admitted: dict[int, Admitted], ranks: list[int],
            job: str = "training") -> dict[int, float]:
    """One all-reduce of `ranks` (rank r gives r + 1 everywhere) through their `job`'s
    workers (training or averaging): each rank's mean."""
    def call(rank: int) -> float:
        worker = getattr(admitted[rank], job)
        assert worker is not None
        return float(worker.allreduce(torch.full((64,), float(rank + 1))).mean())
    return together(ranks, call, deadline=WAIT)


def test_four_ranks_admitted_across_two_leaves_reduce_leave_and_leave_nothing_behind(
        served: Served) -> None:
    store = dist.HashStore()
    admitted = together(list(range(WORLD)), lambda rank: admit(
        store, rank, WORLD, served.inv.path, host=host_of(rank), timeout=WAIT))
    try:
        job = admitted[0].job
        job_id, lo = job["job_id"], job["slot_base"]
        for rank, a in admitted.items():  # each rank sends to its leaf, as its worker id there
            assert a.training is not None
            c = a.training.config
            leaf = f"leaf-{rank // HOSTS}"
            assert (c.switch_host, c.worker_id, c.behind_leaf, c.members) == (
                served.data[leaf], rank % HOSTS, True, WORLD), (rank, c)
        # one slot range and one install epoch on every switch; the spine admits the leaves
        spine = served.tables("spine")
        assert sorted(e.match["worker_id"] for e in spine[p4names.ADMISSION_MEMBERS]) == [0, 1]
        epochs = {spine[p4names.ADMISSION_JOBS][0].params["epoch"]}
        for i in range(LEAVES):
            leaf = served.tables(f"leaf-{i}")
            assert sorted(e.match["worker_id"] for e in leaf[p4names.ADMISSION_MEMBERS]) == \
                list(range(HOSTS))
            epochs.add(leaf[p4names.ADMISSION_JOBS][0].params["epoch"])
        assert len(epochs) == 1
        assert served.events[0].startswith(f"admitted job {job_id} 'torchrun': 4 members, "
                                           f"slots {lo}-{lo + 31}"), served.events

        # the mean of 1, 2, 3, 4 through both leaves and the spine
        assert mean_of(admitted, list(range(WORLD))) == pytest.approx(
            dict.fromkeys(range(WORLD), 2.5), abs=QUANTIZATION)

        # an exclusion names the admit's member (rank 3: leaf-1's worker 1), made at its leaf
        code, out, err = hysync("--serve", served.server.address, "member", "exclude",
                                str(job_id), "3")
        assert (code, err) == (0, ""), err
        leaf1 = served.tables("leaf-1")[p4names.ADMISSION_MEMBERS]
        assert [e.match["worker_id"] for e in leaf1] == [0], leaf1
        code, out, err = hysync("--serve", served.server.address, "member", "readmit",
                                str(job_id), "3")
        assert (code, err) == (0, ""), err
        assert len(served.tables("leaf-1")[p4names.ADMISSION_MEMBERS]) == 2

        def leave(rank: int) -> str:
            assert admitted[rank].serve is not None
            return admitted[rank].serve.request({"op": "leave", "job": job_id, "worker": rank,
                                                 "key": job["key"]})["excluded_at"]
        assert leave(0) == "leaf-0"
        assert leave(1) == "spine (its leaf leaf-0 was done)"  # rack 0 is gone
        spine = served.tables("spine")
        assert [e.match["worker_id"] for e in spine[p4names.ADMISSION_MEMBERS]] == [1]
        # rack 1 alone: the spine's rounds no longer wait for leaf-0
        assert mean_of(admitted, [2, 3]) == pytest.approx({2: 3.5, 3: 3.5}, abs=QUANTIZATION)

        # a mode set that names a level goes through the serve: the spine alone is partial
        code, out, err = hysync("--serve", served.server.address, "mode", "set", str(job_id),
                                "--slots", f"{lo}-{lo + 31}", "partial", "--quorum", "1",
                                "--level", "spine")
        assert (code, err) == (0, ""), err
        assert "spine" in out, out
        modes = {name: {e.params.get("mode") for e in served.tables(name)[
            p4names.SYNC_MODE_MODES]} for name in served.grpc}
        assert modes["leaf-0"] == modes["leaf-1"] != modes["spine"], modes
        code, out, err = hysync("--serve", served.server.address, "mode", "set", str(job_id),
                                "--slots", f"{lo}-{lo + 31}", "partial", "--level", "rack")
        assert code == 1 and err.count("\n") == 1 and "--level 'rack'" in err, err

        assert admitted[0].serve is not None
        admitted[0].serve.request({"op": "release"})  # rank 0 holds the job's lease
        for name in served.grpc:
            assert served.job_entries(name) == 0, (name, served.tables(name))
    finally:
        for a in admitted.values():
            if a.training is not None:
                a.training.close()
            if a.serve is not None:
                a.serve.close()


def test_an_admit_with_averaging_installs_both_jobs_on_every_switch_and_release_removes_both(
        served: Served) -> None:
    store = dist.HashStore()
    admitted = together(list(range(WORLD)), lambda rank: admit(
        store, rank, WORLD, served.inv.path, host=host_of(rank), averaging=True, timeout=WAIT))
    try:
        train = admitted[0].job
        averaging = admitted[0].averaging
        assert averaging is not None
        avg_id = averaging.config.job_id
        assert avg_id != train["job_id"]
        # the averaging job's slots follow the training job's, in the pool's averaging share
        avg_slots = (train["slot_base"] + 32, train["slot_base"] + 32 + 7)
        assert served.events[0].startswith(
            f"admitted job {train['job_id']} 'torchrun': 4 members, slots "
            f"{train['slot_base']}-{train['slot_base'] + 31}, averaging job {avg_id} slots "
            f"{avg_slots[0]}-{avg_slots[1]}"), served.events
        # Each rank's averaging transport is placed as its training transport: its leaf,
        # its worker id there, the job's members over every leaf; from a port of its own.
        ports: dict[int, tuple[int, int]] = {}  # rank -> (training port, averaging port)
        for rank, a in admitted.items():
            assert a.training is not None and a.averaging is not None
            t, v = a.training.config, a.averaging.config
            assert (v.job_id, v.switch_host, v.switch_port, v.worker_id, v.behind_leaf,
                    v.members) == (avg_id, t.switch_host, t.switch_port, t.worker_id, True,
                                   WORLD), (rank, v)
            assert t.switch_host == served.data[f"leaf-{rank // HOSTS}"], (rank, t)
            assert (v.slot_base, v.slot_base + v.slot_count - 1) == avg_slots, (rank, v)
            assert v.bind_port != t.bind_port, (rank, v)
            ports[rank] = (t.bind_port, v.bind_port)

        # Both jobs on every switch, read back: one slot range and one install epoch per
        # job everywhere; the spine admits the leaves, each leaf its hosts at its ports.
        for job_id, slots, port in ((train["job_id"], None, 0), (avg_id, avg_slots, 1)):
            parts = served.installed(job_id)
            assert set(parts) == {"spine", "leaf-0", "leaf-1"}, parts
            assert len({p.epoch for p in parts.values()}) == 1, parts
            assert len({p.slots for p in parts.values()}) == 1, parts
            if slots is not None:
                assert parts["spine"].slots == slots, parts
            assert sorted(m.worker for m in parts["spine"].members) == [0, 1], parts["spine"]
            for i in range(LEAVES):
                leaf = parts[f"leaf-{i}"]
                assert sorted((m.worker, m.udp_port) for m in leaf.members) == [
                    (h, ports[i * HOSTS + h][port]) for h in range(HOSTS)], (job_id, leaf)
                assert leaf.active == frozenset(range(HOSTS)), (job_id, leaf)
        # the averaging job runs sync at every level
        modes = {name: {(m.low, m.high, m.mode) for m in p.modes}
                 for name, p in served.installed(avg_id).items()}
        assert modes == dict.fromkeys(served.grpc, {(*avg_slots, Mode.SYNC)}), modes

        # the averaging job's lease knows its placement: a member (the exclusion of a dead
        # rank) is named by the admit's worker id and excluded at its leaf, by a rank that
        # holds the admit's key
        other = admitted[3].serve
        assert other is not None
        excluded = other.request({"op": "exclude", "job": avg_id, "worker": 3,
                                  "key": train["key"]})
        assert (excluded["leaf"], excluded["leaf_worker"]) == ("leaf-1", 1), excluded
        assert served.installed(avg_id)["leaf-1"].active == frozenset({0})
        assert served.installed(train["job_id"])["leaf-1"].active == frozenset({0, 1})
        other.request({"op": "readmit", "job": avg_id, "worker": 3, "key": train["key"]})
        assert served.installed(avg_id)["leaf-1"].active == frozenset({0, 1})

        # a round of each job through both leaves and the spine: the mean of 1, 2, 3, 4
        for job in ("averaging", "training"):
            assert mean_of(admitted, list(range(WORLD)), job) == pytest.approx(
                dict.fromkeys(range(WORLD), 2.5), abs=QUANTIZATION), job

        assert admitted[0].serve is not None
        admitted[0].serve.request({"op": "release"})  # rank 0 holds both jobs' leases
        for name in served.grpc:
            assert served.job_entries(name) == 0, (name, served.tables(name))
        assert any(e.startswith(f"job {avg_id} removed: released") for e in served.events), \
            served.events
    finally:
        for a in admitted.values():
            for worker in (a.training, a.averaging):
                if worker is not None:
                    worker.close()
            if a.serve is not None:
                a.serve.close()


def test_a_leaf_that_refuses_its_part_leaves_nothing_on_any_switch(served: Served) -> None:
    # leaf-1 already forwards host h1-0's MAC to another port: it refuses the job. The
    # serve holds leaf-1, so the entry is written through the serve's own session.
    served.server.fabric.controllers["leaf-1"].switch.write(
        [insert(forwarding.l2_entry("02:00:00:00:11:01", 7))])
    members = [{"worker": r, "host": host_of(r), "udp_port": 42000 + r} for r in range(WORLD)]
    with ServeClient(served.server.address) as client:
        with pytest.raises(ServeError) as refused:
            client.request({"op": "admit", "members": members})
        message = str(refused.value)
        assert "\n" not in message and "switch leaf-1" in message, message
        assert "MAC 02:00:00:00:11:01 is on port 7" in message, message
        for name in served.grpc:
            assert served.job_entries(name) == 0, name
        # bad input, one line each, nothing written
        for request, said in (
                ({"op": "admit", "members": [{"worker": 0, "host": "h9", "udp_port": 1}]},
                 "no host 'h9'"),
                ({"op": "leave", "job": 9, "worker": 0}, "job 9 is not")):
            with pytest.raises(ServeError, match=said) as err:
                client.request(request)
            assert "\n" not in str(err.value)
        for name in served.grpc:
            assert served.job_entries(name) == 0, name
    status = served.server.handle(SERVE, {"op": "status"})
    assert status["jobs"] == [] and set(status["switches"]) == {"spine", "leaf-0", "leaf-1"}


def test_the_operator_adds_a_job_file_through_the_serve_and_a_restart_adopts_it(
        served: Served) -> None:
    members = [{"leaf": f"leaf-{i}", "worker": h, "ipv4": served.data["spine"].rsplit(".", 1)[0]
                + ".10", "mac": f"02:00:00:00:1{i}:{h + 1:02x}", "udp_port": 44000 + 10 * i + h,
                "switch_port": h + 1} for i in range(LEAVES) for h in range(HOSTS)]
    job = {"job_id": 9, "slots": {"base": 100, "count": 8}, "members": members}
    reply = served.server.handle(SERVE, {"op": "job_add", "job": job})
    assert [s["name"] for s in reply["switches"]] == ["spine", "leaf-0", "leaf-1"], reply
    assert all(served.job_entries(name) > 0 for name in served.grpc)
    # a job file's members are named by leaf: the serve leaves their exclusion to the
    # `hysync --inventory` commands (once it is stopped) and says so
    with pytest.raises(ServeError, match="added from a job file"):
        served.server.handle(SERVE, {"op": "exclude", "job": 9, "worker": 0})

    # a restarted serve finds the job on the spine, keeps it for a claim, then removes it
    # from every switch
    served.server.close()
    events: list[str] = []
    served.server = FabricServer(served.inv, policy=None, claim_grace=0.5,
                                 policy_interval=0.1, say=events.append).start()
    assert events[0].startswith("adopted jobs 9 from the switch"), events
    deadline = time.monotonic() + WAIT
    while any(served.job_entries(name) for name in served.grpc):
        assert time.monotonic() < deadline, events
        time.sleep(0.1)
    assert any(e.startswith("job 9 removed: nobody claimed it") for e in events), events


def test_a_second_serve_of_the_fabric_is_refused_in_one_line(served: Served) -> None:
    with pytest.raises(ServeError) as refused:
        FabricServer(served.inv, policy=None)
    message = str(refused.value)
    assert "\n" not in message and "one switch has one `hysync serve`" in message, message


def test_deploy_and_teardown_prepare_and_clear_every_switch(tmp_path: Path) -> None:
    with softswitch_fabric(tmp_path, leaves=LEAVES, hosts=HOSTS, engine="native") as fabric:
        inventory = str(fabric.inventory)
        code, out, err = hysync("deploy", inventory)
        assert (code, err) == (0, ""), err
        assert out.splitlines()[-1] == "deployed two-level on 3 switches: 6 writes", out
        inv = Inventory.load(inventory)
        for i in range(LEAVES):  # each leaf forwards to its own hosts; the spine has none
            with Switch(fabric.grpc[f"leaf-{i}"], arbitrate=False) as switch:
                l2 = switch.read_tables([p4names.FORWARDING_L2])[p4names.FORWARDING_L2]
            assert dict(map(forwarding.l2_of, l2)) == {
                h.mac: h.switch_port for h in inv.hosts_behind(f"leaf-{i}")}
        code, out, err = hysync("deploy", inventory)
        assert (code, out.split(":")[0]) == (0, "nothing to do"), (out, err)

        members = [{"leaf": f"leaf-{i}", "worker": h, "ipv4": f"{fabric.net}.10",
                    "mac": f"02:00:00:00:1{i}:{h + 1:02x}", "udp_port": 43000 + 10 * i + h,
                    "switch_port": h + 1} for i in range(LEAVES) for h in range(HOSTS)]
        job_file = tmp_path / "job.toml"
        job_file.write_text(toml_text({"job_id": 7, "slots": {"base": 0, "count": 8},
                                       "members": members}))
        # `hysync serve` holds every switch: a deploy now is refused in one line, and a job
        # file goes on through the serve
        data = fabric_inventory(tuple(fabric.grpc.values()), net=fabric.net, hosts=HOSTS)
        data["serve"] = {"listen": f"unix:{tmp_path / 'serve.sock'}"}
        fabric.inventory.write_text(toml_text(data))
        with ExitStack() as stack:
            serve = subprocess.Popen(
                [sys.executable, "-m", "hysync.controlplane.cli", "serve", inventory],
                cwd=ROOT, stdout=subprocess.PIPE,
                stderr=stack.enter_context(open(tmp_path / "serve.log", "w")), text=True)
            stack.callback(lambda: (serve.terminate(), serve.wait(timeout=30)))
            assert serve.stdout is not None
            said = serve.stdout.readline()
            assert said.startswith("serving two-level: spine 127."), (
                said, (tmp_path / "serve.log").read_text()[-2000:])
            code, out, err = hysync("deploy", inventory)
            assert code == 1 and err.count("\n") == 1, err
            assert "is `hysync serve" in err and "running? stop it first" in err, err
            address = f"unix:{tmp_path / 'serve.sock'}"
            code, out, err = hysync("--serve", address, "job", "add", str(job_file))
            assert (code, err) == (0, ""), err
            assert out.startswith("job 7 installed on 3 switches"), out

        code, out, err = hysync("teardown", "--dry-run", inventory)
        assert code == 0 and "would remove job 7" in out, (out, err)
        code, out, err = hysync("teardown", inventory)
        assert (code, err) == (0, ""), err
        assert "job 7 removed" in out, out
        for name, addr in fabric.grpc.items():
            with Switch(addr, arbitrate=False) as switch:
                tables = switch.read_tables(JOB_TABLES + [p4names.FORWARDING_L2])
            assert all(rows == [] for rows in tables.values()), (name, tables)


@pytest.mark.slow
def test_four_ranks_train_through_the_serve_to_equal_replicas_and_leave_nothing(
        served: Served) -> None:
    """Real torchrun: each rank attaches through the serve (no job file), trains to the
    one-switch tests' accuracy in sync at every level, leaves, and rank 0 releases."""
    with ExitStack() as stack:
        rendezvous = stack.enter_context(torchrun_rendezvous(1, timeout_s=TRAIN_WAIT))
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *rendezvous, "--nproc-per-node",
             str(WORLD), str(SCRIPT), "--inventory", str(served.inv.path), "--hosts-per-leaf",
             str(HOSTS), "--steps", str(STEPS)],
            cwd=ROOT, env=dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stack.callback(kill_tree, proc)
        out, _ = proc.communicate(timeout=TRAIN_WAIT)
    assert proc.returncode == 0, out[-3000:]
    done = [r for r in rank_records([out]) if "accuracy" in r]
    assert len(done) == WORLD, out[-3000:]
    for r in done:
        leaf, host = divmod(r["rank"], HOSTS)
        assert (r["switch"], r["worker_id"], r["behind_leaf"]) == (
            served.data[f"leaf-{leaf}"], host, True), r
        assert r["updates"] == r["steps"] == STEPS and set(r["modes"]) == {"sync"}, r
        assert r["accuracy"] >= TARGET_ACCURACY, r
    assert len({r["params"] for r in done}) == 1, done  # the same sums everywhere
    left = [e for e in served.events if " left: " in e or "was its last active member" in e]
    assert len(left) == WORLD, served.events
    for name in served.grpc:  # rank 0's release removed the job from every switch
        assert served.job_entries(name) == 0, name


AVG_STEPS = 30  # a short run: what is checked is the averaging, not the accuracy
PERTURB = 0.01  # rank r's parameters start r * PERTURB off the one model DDP made


@pytest.mark.slow
def test_replicas_that_start_apart_end_equal_by_averaging_through_both_levels(
        served: Served) -> None:
    """Real torchrun with `average_every`: each rank's replica starts moved apart from the
    others', so sync training alone keeps them apart; the model-averaging job, admitted
    by the serve and placed behind each rank's leaf, averages them through both levels
    and its final round makes them one model. Release leaves nothing on any switch."""
    with ExitStack() as stack:
        rendezvous = stack.enter_context(torchrun_rendezvous(1, timeout_s=TRAIN_WAIT))
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *rendezvous, "--nproc-per-node",
             str(WORLD), str(SCRIPT), "--inventory", str(served.inv.path), "--hosts-per-leaf",
             str(HOSTS), "--steps", str(AVG_STEPS), "--average-every", "0.5", "--perturb",
             str(PERTURB)],
            cwd=ROOT, env=dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stack.callback(kill_tree, proc)
        out, _ = proc.communicate(timeout=TRAIN_WAIT)
    assert proc.returncode == 0, out[-3000:]
    records = rank_records([out])
    start = [r for r in records if "start_params" in r]
    assert len({r["start_params"] for r in start}) == WORLD, start  # apart
    done = [r for r in records if "accuracy" in r]
    assert len(done) == WORLD, out[-3000:]
    avg_ids = {r["averaging"]["job_id"] for r in done}
    assert len(avg_ids) == 1, done
    admission = served.events[0]
    assert f", averaging job {avg_ids.pop()} slots" in admission, served.events
    for r in done:
        leaf, host = divmod(r["rank"], HOSTS)
        avg = r["averaging"]
        # the averaging transport sends to the rank's leaf as its worker id there
        assert (avg["switch"], avg["worker_id"], avg["behind_leaf"]) == (
            served.data[f"leaf-{leaf}"], host, True), r
        assert r["updates"] == r["steps"] == AVG_STEPS and set(r["modes"]) == {"sync"}, r
        # a round averaged the replicas that started apart (each moved by its distance
        # from the mean, at least PERTURB / 2), and the last round was the final one
        assert avg["full_rounds"] >= 2 and avg["final"], r
        assert avg["largest_move"] >= PERTURB / 4, r
    assert len({r["params"] for r in done}) == 1, done  # one model, bit for bit
    for name in served.grpc:  # rank 0's release removed both jobs from every switch
        assert served.job_entries(name) == 0, name

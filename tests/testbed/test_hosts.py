"""Hosts that run several ranks each, under real `torchrun` (one launcher per emulated
host), gloo on CPU, the softswitch and `hysync serve`: a host's ranks reduce there
first, its leader is the one switch member, and every rank ends where its leader is."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hysync.controlplane.cli.main import main
from hysync.controlplane.serve.server import SERVE, Server
from hysync.controlplane.testbed.deploy import deploy
from hysync.controlplane.testbed.inventory import Inventory
from hysync.host_group import HostLayout, HostLayoutError, host_layout, ranks_per_host_setting
from hysync.torch import AttachError, admit
from hysync.worker.ddp_hook import HySyncHookState, switch_call

from .conftest import (
    ROOT,
    Softswitch,
    kill_tree,
    loopback_inventory,
    published,
    rank_records,
    tree,
    write_inventory,
)
from .test_torchrun import jobs_on

SCRIPT = Path(__file__).with_name("host_job.py")
WAIT = 300  # seconds: a generous deadline for several launchers on a busy machine
QUANTIZATION = 1e-4  # HySync's parameters against gloo's after a few steps at 2**20


@pytest.fixture
def three_hosts_served(inventory_for, softswitch: Softswitch
                       ) -> Iterator[tuple[Inventory, list[str], Server]]:
    """A loopback inventory of three hosts, deployed, its serve (no policy) running, and
    the events serve said."""
    inv = Inventory.load(inventory_for(softswitch, hosts=3))
    deploy(inv)
    events: list[str] = []
    server = published(Server(inv, policy=None, say=events.append).start())
    yield inv, events, server
    server.close()


@pytest.fixture
def three_hosts(three_hosts_served: tuple[Inventory, list[str], Server]
                ) -> tuple[Inventory, list[str]]:
    return three_hosts_served[:2]


# What torchrun's launcher of node rank 0 says when its --master-port was taken between
# the choice and its bind (another run on a busy machine).
PORT_TAKEN = "EADDRINUSE"


def launch(hosts: list[int], *args: str, env: dict[str, str] | None = None,
           standalone: bool = False, script: Path = SCRIPT) -> list[tuple[int, str]]:
    """One `torchrun --nnodes H --nproc-per-node N --node-rank R script` per host (N from
    `hosts`), as on H servers; each launcher's (return code, output). The ranks follow the
    hosts (node rank R is host R + 1), so the master port is chosen here, and the launch
    is retried when node 0 found it taken."""
    for _ in range(3):
        runs = _launch(hosts, args, env, standalone, script)
        if not (runs[0][0] and PORT_TAKEN in runs[0][1]):
            return runs
    return runs


def _port_free_now() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _launch(hosts: list[int], args: tuple[str, ...], env: dict[str, str] | None,
            standalone: bool, script: Path) -> list[tuple[int, str]]:
    port = _port_free_now()
    logs = [tempfile.TemporaryFile("w+") for _ in hosts]  # noqa: SIM115 - closed below
    procs = []
    for node, ranks in enumerate(hosts):
        penv = dict(os.environ, HYSYNC_HOST=f"h{node + 1}", GLOO_SOCKET_IFNAME="lo",
                    PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                    **(env or {}))
        where = ["--standalone"] if standalone else [
            "--nnodes", str(len(hosts)), "--node-rank", str(node), "--master-addr",
            "127.0.0.1", "--master-port", port]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *where, "--nproc-per-node",
             str(ranks), str(script), *args],
            cwd=ROOT, env=penv, stdout=logs[node], stderr=subprocess.STDOUT, text=True))

    def outputs() -> list[str]:
        for log in logs:
            log.seek(0)
        return [log.read() for log in logs]

    deadline = time.monotonic() + WAIT
    try:
        while any(p.poll() is None for p in procs):
            if procs[0].poll() and PORT_TAKEN in outputs()[0]:
                break  # the others would wait for node 0's store: launch again
            if time.monotonic() > deadline:
                for p in procs:  # every rank's stack (PYTHONFAULTHANDLER), then they go
                    for pid in tree(p.pid)[1:]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGABRT)
                time.sleep(2)
                tails = [out[-6000:] for out in outputs()]
                pytest.fail(f"the ranks did not finish within {WAIT} s; their last output: "
                            f"{tails}")
            time.sleep(0.2)
    finally:
        for p in procs:
            kill_tree(p)
            p.wait()
    said = outputs()
    for log in logs:
        log.close()
    return [(p.returncode, out) for p, out in zip(procs, said, strict=True)]


def trained(hosts: list[int], *args: str, **kwargs: object) -> dict[int, dict]:
    """Each rank's result line of a run that must succeed, by rank."""
    runs = launch(hosts, *args, **kwargs)  # type: ignore[arg-type]
    for code, out in runs:
        assert code == 0, out[-4000:]
    lines = rank_records([out for _, out in runs])
    by_rank = {r["rank"]: r for r in lines}
    assert sorted(by_rank) == list(range(sum(hosts))), runs
    return by_rank


def farthest(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_three_hosts_of_two_ranks_train_as_gloo_does_with_three_members(
        three_hosts: tuple[Inventory, list[str]]) -> None:
    inv, events = three_hosts
    hysync = trained([2, 2, 2], "--inventory", str(inv.path), "--steps", "20")
    gloo = trained([2, 2, 2], "--backend", "gloo", "--steps", "20")
    # sync rounds: every rank applied its leader's result, every leader the same one
    assert len({tuple(r["params"]) for r in hysync.values()}) == 1
    assert len({tuple(r["params"]) for r in gloo.values()}) == 1
    error = farthest(hysync[0]["params"], gloo[0]["params"])
    assert 0 < error <= QUANTIZATION, error  # quantized, and within its bound
    for rank, r in hysync.items():
        assert r["host"] == rank // 2 and r["updates"] == pytest.approx(20), r
        if rank % 2 == 0:  # the host's leader: the switch member whose worker_id is the host
            assert (r["member"], r["members"]) == (r["host"], 3), r
        else:
            assert r["member"] is None, r
    assert events[0].startswith("admitted job 1 'torchrun': 3 members, slots 0-31")
    assert events[-1] == "job 1 removed: released by its training script"
    assert jobs_on(inv) == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["partial", "--quorum", "2"], ["async"]], ids=lambda m: m[0])
def test_a_partial_round_leaves_no_rank_behind_its_leader(
        three_hosts: tuple[Inventory, list[str]], mode: list[str]) -> None:
    inv, events = three_hosts
    out = trained([2, 2, 2], "--inventory", str(inv.path), "--steps", "30", "--mode", *mode,
                  "--slow-host", "2")
    leaders = {r["host"]: r for r in out.values() if r["member"] is not None}
    assert sorted(leaders) == [0, 1, 2]
    # rounds closed without the slow host: some leader applied uneven calls
    assert any(r["uneven_calls"] > 0 for r in leaders.values()), leaders
    for r in out.values():
        leader = leaders[r["host"]]
        assert r["params"] == leader["params"], (r["rank"], leader["rank"])
        assert r["updates"] == leader["updates"] and r["steps"] == leader["steps"], r
    assert events[0].startswith("admitted job 1 'torchrun': 3 members")
    assert jobs_on(inv) == []


@pytest.mark.slow
def test_a_host_of_four_ranks_is_one_member(three_hosts: tuple[Inventory, list[str]]) -> None:
    inv, events = three_hosts
    # one launcher, the host's size given as a number instead of torchrun's
    hysync = trained([4], "--inventory", str(inv.path), "--ranks-per-host", "4", standalone=True)
    gloo = trained([4], "--backend", "gloo", standalone=True)
    assert len({tuple(r["params"]) for r in hysync.values()}) == 1
    assert farthest(hysync[0]["params"], gloo[0]["params"]) <= QUANTIZATION
    assert [hysync[rank]["member"] for rank in range(4)] == [0, None, None, None]
    assert hysync[0]["members"] == 1
    assert events[0].startswith("admitted job 1 ") and ": 1 members, " in events[0], events


@pytest.mark.slow
def test_hosts_of_different_sizes_are_refused_in_one_line(
        three_hosts: tuple[Inventory, list[str]]) -> None:
    inv, events = three_hosts
    runs = launch([2, 1], "--inventory", str(inv.path))
    error = ("hysync.torch.AttachError: hosts run different numbers of ranks (node 0: 2, "
             "node 1: 1): HySync averages over hosts, so start the same --nproc-per-node on "
             "every host")
    for code, out in runs:
        assert code != 0 and error in out, out[-4000:]
    assert events == []  # refused before anything was asked of the serve


@pytest.mark.slow
def test_the_backend_reduces_on_the_host_first(
        three_hosts: tuple[Inventory, list[str]]) -> None:
    inv, events = three_hosts
    runs = launch_example([2, 2, 2], inv)
    lines = rank_records([out for _, out in runs])
    # examples/allreduce.py asserts every result against the exact sum itself
    assert sorted(r["rank"] for r in lines) == list(range(6)), runs
    assert all(r["ok"] and r["group"] == "hysync" for r in lines), lines
    assert events[0].startswith("admitted job 1 'torchrun': 3 members")
    assert events[-1] == "job 1 removed: released by its training script"


def launch_example(hosts: list[int], inv: Inventory) -> list[tuple[int, str]]:
    """examples/allreduce.py on the hysync backend, hosts as torchrun launched them."""
    runs = launch(hosts, env={"HYSYNC_INVENTORY": str(inv.path),
                              "HYSYNC_RANKS_PER_HOST": "local"},
                  script=ROOT / "examples" / "allreduce.py")
    for code, out in runs:
        assert code == 0, out[-4000:]
    return runs


def layouts(places: list[tuple[int, int]]) -> list[HostLayout | None | str]:
    """host_layout("local") of ranks at (GROUP_RANK, LOCAL_RANK) `places`, each in a
    thread of its own over one store: each rank's layout, or its error."""
    store = dist.HashStore()
    found: list[HostLayout | None | str] = [None] * len(places)

    def one(rank: int) -> None:
        node, local = places[rank]
        try:
            found[rank] = host_layout(store, rank, len(places), "local", timeout=30,
                                      env={"GROUP_RANK": str(node), "LOCAL_RANK": str(local)})
        except HostLayoutError as err:
            found[rank] = str(err)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(places))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return found


def test_torchruns_hosts_make_the_layout() -> None:
    assert layouts([(0, 0), (0, 1), (1, 0), (1, 1)]) == [
        HostLayout(2, 2, 0, 0), HostLayout(2, 2, 0, 1), HostLayout(2, 2, 1, 0),
        HostLayout(2, 2, 1, 1)]
    assert layouts([(0, 0), (1, 0), (2, 0)]) == [None, None, None]  # one rank per host
    refused = layouts([(0, 0), (0, 1), (1, 0)])
    assert refused == ["hosts run different numbers of ranks (node 0: 2, node 1: 1): HySync "
                       "averages over hosts, so start the same --nproc-per-node on every "
                       "host"] * 3


def test_a_number_of_ranks_per_host_groups_consecutive_ranks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYSYNC_RANKS_PER_HOST", raising=False)
    assert ranks_per_host_setting(None) == 1
    monkeypatch.setenv("HYSYNC_RANKS_PER_HOST", "local")
    assert ranks_per_host_setting(None) == "local"
    assert ranks_per_host_setting("4") == 4
    store = dist.HashStore()
    assert host_layout(store, 5, 8, 4, timeout=1) == HostLayout(2, 4, 1, 1)
    assert host_layout(store, 5, 8, 1, timeout=1) is None
    with pytest.raises(HostLayoutError, match="ranks_per_host=3 does not divide the job's 8 "
                                              "ranks: every host must run the same number"):
        host_layout(store, 5, 8, 3, timeout=1)
    for bad in ("two", 0, -1):
        with pytest.raises(HostLayoutError, match=r"ranks_per_host \(HYSYNC_RANKS_PER_HOST\) "
                                                  "is a number of ranks per host or 'local'"):
            ranks_per_host_setting(bad)
    with pytest.raises(HostLayoutError, match="reads torchrun's GROUP_RANK and LOCAL_RANK"):
        host_layout(store, 0, 2, "local", timeout=1, env={})


def test_a_job_of_more_hosts_than_the_bitmap_holds_is_refused() -> None:
    """64 ranks are 8 members at 8 per host, but 33 members are refused, whatever the
    ranks per host, with what to do about it."""
    store = dist.HashStore()
    assert host_layout(store, 63, 64, 8, timeout=1) == HostLayout(8, 8, 7, 7)
    assert host_layout(store, 127, 128, 4, timeout=1) == HostLayout(32, 4, 31, 3)
    for world, per_host in ((33, 1), (66, 2)):
        with pytest.raises(HostLayoutError, match=rf"the job has 33 switch members \({world} "
                                                  rf"ranks, {per_host} per host\) and one "
                                                  "switch aggregates at most 32 .* run more "
                                                  "ranks per host"):
            host_layout(store, 0, world, per_host, timeout=1)


def test_background_averaging_with_several_ranks_per_host_is_refused(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "rack.toml", loopback_inventory())
    with pytest.raises(AttachError, match=r"^background averaging \(average_every\) runs with "
                                          "one rank per host: leave it out, or set "
                                          "ranks_per_host to 1$"):
        admit(dist.HashStore(), 0, 4, inventory, averaging=True, ranks_per_host=2)


def cli(*args: str) -> str:
    """`hysync ARGS` in this process; its output (exit status 0, or the test fails)."""
    out, err = io.StringIO(), io.StringIO()
    assert main(list(args), stdout=out, stderr=err) == 0, err.getvalue()
    return out.getvalue()


def together(ranks: list[int], call: Callable[[int], object], deadline: float = WAIT) -> dict:
    """`call(rank)` for each rank in a thread of its own, as the ranks of a job run;
    each rank's result. A rank's exception fails the test, as does one still running at
    the deadline."""
    results: dict[int, object] = {}
    errors: dict[int, BaseException] = {}

    def one(rank: int) -> None:
        try:
            results[rank] = call(rank)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors[rank] = err

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=deadline)
    assert not any(t.is_alive() for t in threads), f"ranks still running after {deadline} s"
    assert not errors, errors
    return results


@pytest.mark.slow
def test_serve_learns_each_hosts_ranks_and_an_exclusion_leaves_out_all_of_them(
        three_hosts_served: tuple[Inventory, list[str], Server]) -> None:
    """Six ranks, two per host, admitted for real: serve's status and its answers to an
    exclusion and a readmission name the member's host and its ranks, and once a host is
    excluded the rounds sum the other hosts' ranks only, both ranks of the host out."""
    inv, events, server = three_hosts_served
    store = dist.HashStore()
    world = 6
    admitted = together(list(range(world)), lambda rank: admit(
        store, rank, world, inv.path, host=f"h{rank // 2 + 1}", ranks_per_host=2, timeout=60))
    try:
        status = server.handle(SERVE, {"op": "status"})
        (job,) = status["jobs"]
        assert job["hosts"] == [{"member": 0, "host": "h1", "ranks": [0, 1]},
                                {"member": 1, "host": "h2", "ranks": [2, 3]},
                                {"member": 2, "host": "h3", "ranks": [4, 5]}]
        assert events[0].endswith("; member 0 (host h1, ranks 0, 1); member 1 (host h2, "
                                  "ranks 2, 3); member 2 (host h3, ranks 4, 5)"), events
        # `hysync --serve ADDR stats JOB`: the switch's counters with each member's host
        text, data = (cli("--serve", server.address, *json_flag, "stats", str(job["job_id"]))
                      for json_flag in ([], ["--json"]))
        rows = text.splitlines()
        assert rows[1].split()[-2:] == ["host", "ranks"]
        assert [row.split()[0] + " " + " ".join(row.split()[-3:]) for row in rows[2:5]] == [
            "0 h1 0, 1", "1 h2 2, 3", "2 h3 4, 5"]
        assert json.loads(data)["hosts"] == job["hosts"]

        def round_of(ranks: list[int]) -> dict:
            def call(rank: int) -> float:
                a = admitted[rank]
                switch = None if a.training is None else switch_call(
                    HySyncHookState(a.training), "k")
                tensor = torch.full((64,), float(rank + 1))
                a.host.allreduce(tensor, switch).wait()
                return float(tensor.mean())
            return together(ranks, call, deadline=60)

        # host means 1.5, 3.5, 5.5: the job's mean is 3.5 at every rank
        assert round_of(list(range(world))) == pytest.approx(dict.fromkeys(range(world), 3.5),
                                                             abs=QUANTIZATION)
        out = server.handle(SERVE, {"op": "exclude", "job": job["job_id"], "worker": 2})
        assert (out["worker"], out["host"], out["ranks"], out["members"]) == (2, "h3", [4, 5], 2)
        assert events[-1] == f"job {job['job_id']}: worker 2 (host h3, ranks 4, 5) excluded on " \
            "request"
        # host h3 is out with both its ranks: the mean of h1's and h2's ranks, (1.5 + 3.5) / 2
        assert round_of([0, 1, 2, 3]) == pytest.approx(dict.fromkeys(range(4), 2.5),
                                                       abs=QUANTIZATION)
        back = server.handle(SERVE, {"op": "readmit", "job": job["job_id"], "worker": 2})
        assert (back["host"], back["ranks"], back["members"]) == ("h3", [4, 5], 3)
    finally:
        for rank in sorted(admitted, reverse=True):  # rank 0 last: it releases the job
            a = admitted[rank]
            if rank == 0:
                a.serve.request({"op": "release"})
            for part in (a.serve, a.training, a.host):
                if part is not None:
                    part.close()

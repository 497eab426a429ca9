"""examples/train_ddp.py under real `torchrun`, one launcher per emulated host on this
machine (no root): the job is admitted through `hysync serve`, trains to the target
accuracy through the softswitch, and is gone from the switch when the script ends - or
when it crashes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hysync.controlplane.controller import Controller
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.serve.server import Server
from hysync.controlplane.testbed.deploy import deploy
from hysync.controlplane.testbed.inventory import Inventory
from hysync.topologies.rendezvous import torchrun_rendezvous

from .conftest import ROOT, Softswitch, kill_tree, published, rank_records, tree

pytestmark = pytest.mark.slow
TARGET_ACCURACY = 0.9


@pytest.fixture
def served(inventory_for, softswitch: Softswitch) -> Iterator[tuple[Inventory, list[str]]]:
    inv = Inventory.load(inventory_for(softswitch))
    deploy(inv)
    events: list[str] = []
    server = published(Server(inv, policy=None, say=events.append).start())
    yield inv, events
    server.close()


@contextlib.contextmanager
def launch(inv: Inventory, *script_args: str) -> Iterator[list[subprocess.Popen]]:
    """One `torchrun --nnodes 2` per host, as on two servers, while inside (the rendezvous
    lives as long as the block)."""
    with torchrun_rendezvous(2) as rendezvous:
        procs = []
        for host in inv.hosts:
            env = dict(os.environ, HYSYNC_HOST=host.name, GLOO_SOCKET_IFNAME="lo",
                       OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", *rendezvous,
                 "--nproc-per-node", "1", str(ROOT / "examples" / "train_ddp.py"),
                 "--inventory", str(inv.path), *script_args],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        try:
            yield procs
        finally:
            for p in procs:
                kill_tree(p)
                p.wait()


def rank_zero(procs: list[subprocess.Popen]) -> subprocess.Popen:
    """The launcher whose worker is rank 0 (ranks go in the order the launchers join)."""
    for p in procs:
        for pid in tree(p.pid)[1:]:
            with contextlib.suppress(OSError):
                if b"\0RANK=0\0" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                    return p
    raise AssertionError("no launcher runs a worker of rank 0")


def jobs_on(inv: Inventory) -> list[int]:
    with Switch(inv.switch.grpc_addr, arbitrate=False) as sw:
        return [j.job_id for j in Controller(sw).list_jobs()]


def test_the_example_trains_under_torchrun_and_its_jobs_go_at_the_end(
        served: tuple[Inventory, list[str]]) -> None:
    inv, events = served
    with launch(inv, "--steps", "150", "--average-every", "0.5") as procs:
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    results = rank_records(outputs)
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["updates"] >= 150 and r["accuracy"] >= TARGET_ACCURACY, r
    # the final model-averaging round leaves every replica with the same parameters
    assert results[0]["accuracy"] == results[1]["accuracy"]
    assert events[0].startswith("admitted job 1 'torchrun': 2 members, slots 0-31, "
                                "averaging job 2 slots 32-39")
    assert events[-2:] == ["job 1 removed: released by its training script",
                           "job 2 removed: released by its training script"]
    assert jobs_on(inv) == []


def test_a_crashed_script_gives_its_slots_back(served: tuple[Inventory, list[str]]) -> None:
    inv, events = served
    with launch(inv, "--steps", "1000000", "--compute-ms", "20") as procs:
        deadline = time.monotonic() + 120
        while not any(e.startswith("admitted job 1") for e in events):
            assert time.monotonic() < deadline and procs[0].poll() is None, \
                procs[0].communicate()[0][-3000:]
            time.sleep(0.2)
        assert jobs_on(inv) == [1]
        kill_tree(rank_zero(procs))  # rank 0's server loses power
        deadline = time.monotonic() + 20
        while jobs_on(inv):
            assert time.monotonic() < deadline, events
            time.sleep(0.1)
        assert events[-1] == "job 1 removed: its training script's connection closed"

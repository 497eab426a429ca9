"""A job that ends the way torchrun jobs end - the script returns without closing its
HySync job, or one rank crashes and torchrun SIGTERMs the others - ends promptly and
cleanly: no rank waits on a call whose peers are gone before it can exit, none dies
with SIGABRT ("terminate called without an active exception": a thread still inside a
native call while the interpreter finalizes), and the serve removes the jobs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hysync.controlplane.serve.server import Server
from hysync.controlplane.testbed.deploy import deploy
from hysync.controlplane.testbed.inventory import Inventory

from .conftest import ROOT, Softswitch, kill_tree, published

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("exit_job.py")
CALL_TIMEOUT_S = 120  # exit_job.py's attach(timeout=...)


def torchrun(inventory: Path, end: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(SCRIPT), "--inventory", str(inventory), "--end", end],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=300)  # a generous deadline on a busy machine
    finally:
        kill_tree(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


@pytest.mark.parametrize("end", ["return", "crash"])
def test_a_job_ends_without_waiting_or_aborting(inventory_for, softswitch: Softswitch,
                                                end: str) -> None:
    inventory = inventory_for(softswitch, hosts=1)  # both ranks on h1, as --standalone
    inv = Inventory.load(inventory)
    deploy(inv)
    events: list[str] = []
    server = published(Server(inv, policy=None, say=events.append).start())
    try:
        done = torchrun(inventory, end)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum("removed" in e for e in events) < 2:
            time.sleep(0.1)
    finally:
        server.close()
    out = done.stdout
    assert "terminate called" not in out and "SIGABRT" not in out, out[-4000:]
    if end == "return":
        assert done.returncode == 0, out[-4000:]
    else:
        assert done.returncode != 0 and "rank 1 fails on purpose" in out, out[-4000:]
    ranks = [0, 1] if end == "return" else [1]  # rank 0 of a crash dies by SIGTERM
    for rank in ranks:
        ended, exited = (float(re.search(rf"rank {rank} {what} at ([0-9.]+)", out)[1])
                         for what in ("ends", "exits"))
        # the exit joined the executor and averaging threads without waiting on the switch
        # (a thread waiting there would wait for the calls' timeout)
        assert exited - ended < CALL_TIMEOUT_S / 2, \
            f"rank {rank} waited {exited - ended:.1f} s on threads"
    # the lease (rank 0's connection to the serve) closed with the process
    assert [e for e in events if "removed" in e] == [
        "job 1 removed: its training script's connection closed",
        "job 2 removed: its training script's connection closed"], events

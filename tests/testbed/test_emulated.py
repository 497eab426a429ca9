"""The testbed path end to end on an emulated rack (root), built by `hysync rack up 3`:
network namespaces as hosts with their own addresses and MACs, behind a switch namespace
running the softswitch on its raw data plane. The commands docs/testbed.md gives, the
torchrun lines exactly as `rack up` prints them: `hysync deploy` and `--check` (on h1: it
probes the others), `hysync serve`, examples/train_ddp.py in every host namespace with a
straggler the policy handles, `hysync teardown`, `hysync rack down`; afterwards the switch
holds nothing of the job and the machine nothing of the rack."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hysync import p4names
from hysync.controlplane.cli import rack
from hysync.controlplane.controller import Controller
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.testbed.addresses import host_ip
from hysync.controlplane.testbed.inventory import Inventory
from hysync.controlplane.testbed.netns import missing_netns_tools

from ..controlplane.conftest import read_table
from .conftest import RACK_HOSTS, ROOT, kill_tree, rank_records

pytestmark = [pytest.mark.slow, pytest.mark.root]
HOSTS = RACK_HOSTS
STRAGGLER = 2  # rank / host index of the slow host
TARGET_ACCURACY = 0.9


def hysync(*args: str, on: list[str] | None = None) -> subprocess.CompletedProcess:
    """`hysync ARGS` here, or `on` a host (`ip netns exec NS`)."""
    return subprocess.run([*(on or []), sys.executable, "-m", "hysync.controlplane.cli", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


@contextlib.contextmanager
def built_rack(tmp_path: Path, *options: str) -> Iterator[tuple[str, Path, list[str]]]:
    """(tag, inventory, the torchrun lines it printed) of `hysync rack up 3 OPTIONS`."""
    reason = missing_netns_tools("it builds network namespaces and veth links (run `.ci/run`)")
    if reason:
        pytest.skip(reason)
    tag = f"hye{os.getpid() % 10000}"
    inventory = tmp_path / "rack.toml"
    up = hysync("rack", "up", str(HOSTS), "--tag", tag, "--inventory", str(inventory), "--json",
                *options)
    assert up.returncode == 0, up.stderr
    try:
        commands = json.loads(up.stdout)["commands"]
        yield tag, inventory, [c for c in commands if "--node-rank" in c]
    finally:
        down = hysync("rack", "down", "--tag", tag)
        assert down.returncode == 0, down.stderr


def served_training(tmp_path: Path, inventory: Path, runs: list[list[str]],
                    *serve_options: str) -> tuple[list[dict], list[str], str]:
    """`hysync serve INVENTORY SERVE_OPTIONS` and one process per command of `runs`, each
    to its end: each rank's record, each command's output, and what serve said. A command
    that fails fails the test, with its output and serve's."""
    serve_out = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen(
        [sys.executable, "-m", "hysync.controlplane.cli", "serve", str(inventory),
         *serve_options], cwd=ROOT, stdout=serve_out, stderr=subprocess.STDOUT)
    procs: list[subprocess.Popen] = []
    try:
        time.sleep(2)
        assert serve.poll() is None, (tmp_path / "serve.log").read_text()
        procs = [subprocess.Popen(run, cwd=tmp_path, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for run in runs]
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            kill_tree(p)  # `ip netns exec` became torchrun; its ranks are children
        serve.terminate()
        serve.wait(timeout=10)
        serve_out.close()
    served = (tmp_path / "serve.log").read_text()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:] + served
    return rank_records(outputs), outputs, served


def printed(line: str) -> list[str]:
    """A torchrun line as `rack up` printed it, as a command."""
    return shlex.split(line.removesuffix(" &"))


@pytest.fixture
def rack_up(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    with built_rack(tmp_path) as rack_built:
        yield rack_built


def test_a_rack_from_inventory_to_trained_model_and_back(rack_up, tmp_path: Path) -> None:
    tag, inventory, runs = rack_up
    deployed = hysync("deploy", str(inventory))
    assert deployed.returncode == 0, deployed.stderr
    check = hysync("deploy", "--check", str(inventory), on=["ip", "netns", "exec", f"{tag}-h1"])
    assert check.returncode == 0, check.stdout + check.stderr
    assert len(check.stdout.splitlines()) == 4 + HOSTS
    assert f"ok    probe: from h1 ({tag}h1, {host_ip(0)}): {HOSTS - 1} of " \
        f"{HOSTS - 1} hosts answered" in check.stdout
    policy_log = tmp_path / "policy.jsonl"
    assert len(runs) == HOSTS
    # each printed line as it is, the test's pace after it (argparse: the last wins)
    records, outputs, served = served_training(
        tmp_path, inventory,
        [[*printed(line), "--compute-ms", "30", *(["--slowdown", "4"] if w == STRAGGLER else [])]
         for w, line in enumerate(runs)],
        "--policy-interval", "0.25", "--policy-scale", "0.5", "--policy-log", str(policy_log))
    results = {r["rank"]: r for r in records}
    assert sorted(results) == list(range(HOSTS))
    decisions = [json.loads(line) for line in policy_log.read_text().splitlines()]
    swaps = [(d["action"], d.get("mode"), d.get("quorum"), d.get("worker"))
             for d in decisions if d.get("applied")]
    # On a failure: the policy's path, and each rank's last lines (its progress, the
    # warnings of its transport and of model averaging).
    tails = {w: out.splitlines()[-8:] for w, out in enumerate(outputs)}
    for r in results.values():
        assert r["accuracy"] >= TARGET_ACCURACY, (results, swaps, tails)
    # partial rounds let the replicas drift; the final averaging round makes them one model
    assert len({r["accuracy"] for r in results.values()}) == 1, results
    assert "admitted job 1 'torchrun': 3 members" in served
    handled = [d for d in decisions if d.get("applied") and d["action"] != "start" and (
        d.get("worker") == STRAGGLER or f"worker {STRAGGLER} " in d.get("reason", ""))]
    assert handled, f"the policy never acted on the straggler: {decisions}"
    assert "job 1 removed: released by its training script" in served
    assert "job 2 removed: released by its training script" in served  # the averaging job

    torn = hysync("teardown", str(inventory))
    assert torn.returncode == 0, torn.stderr
    # The rack's switch serves mutual TLS: read it with the inventory's certificate.
    with Switch(f"{rack.MGMT_NET}.2:9559", arbitrate=False,
                tls=Inventory.load(inventory).switch.tls) as sw:
        assert Controller(sw).list_jobs() == []
        assert read_table(sw, p4names.FORWARDING_L2) == []
        assert [g.group_id for g in sw.read_groups()] == []


def test_hosts_of_two_ranks_train_with_one_member_each(tmp_path: Path) -> None:
    """`hysync rack up 3 --ranks-per-host 2` and its printed lines: six ranks train, the
    switch's job has three members, and both ranks of a host end with the same model."""
    with built_rack(tmp_path, "--ranks-per-host", "2") as (tag, inventory, runs):
        assert hysync("deploy", str(inventory)).returncode == 0
        records, _, served = served_training(tmp_path, inventory,
                                             [printed(line) for line in runs])
        assert hysync("teardown", str(inventory)).returncode == 0
    results = {r["rank"]: r for r in records}
    assert sorted(results) == list(range(2 * HOSTS))
    assert "admitted job 1 'torchrun': 3 members" in served
    for r in results.values():
        assert r["accuracy"] >= TARGET_ACCURACY, results
    for host in range(HOSTS):  # ranks 2h and 2h+1 share host h (torchrun's node rank)
        assert results[2 * host]["accuracy"] == results[2 * host + 1]["accuracy"], results

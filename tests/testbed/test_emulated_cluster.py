"""Two racks of three hosts behind two leaves and a spine, on one machine (root), built by
`hysync rack up 3 --racks 2`: host namespaces on veths to their leaf's namespace, the
leaves on veths to the spine's, a softswitch on its raw data plane in each switch
namespace. The job is installed across the switches with the command `up` printed, six
ranks train with the torchrun lines `up` printed (one rank per host namespace; the test's
script in place of the example, to print each replica's parameters), every replica ends
equal and at the one-switch tests' accuracy, every rank has left the job at its end;
`hysync rack down` leaves nothing."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hysync import resources
from hysync.controlplane.cli import rack
from hysync.controlplane.p4rt.switch import wait_for_server
from hysync.controlplane.testbed.inventory import Inventory
from hysync.controlplane.testbed.netns import missing_netns_tools
from hysync.controlplane.testbed.netns_fabric import leaf_ip

from .conftest import ROOT, kill_tree, rank_records

pytestmark = [pytest.mark.slow, pytest.mark.root]
RACKS, HOSTS, STEPS = 2, 3, 150
TARGET_ACCURACY = 0.9
WAIT = 420  # seconds: a generous deadline for six ranks and three switches on a busy machine
SCRIPT = Path(__file__).with_name("fabric_train.py")


def hysync(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hysync.controlplane.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def namespaces(tag: str) -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return {line.split()[0] for line in done.stdout.splitlines() if line.startswith(f"{tag}-")}


def offloads(ns: str, ifname: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-k", ifname],
                          capture_output=True, text=True).stdout


def as_test_run(line: str, tmp_path: Path) -> list[str]:
    """A printed torchrun line with the test's script in place of the example (same model,
    data and attach; it prints the replica's parameters digest) and STEPS updates."""
    argv = shlex.split(line.removesuffix(" &"))
    argv[argv.index(str(resources.path("examples/train_ddp.py")))] = str(SCRIPT)
    return [*argv, "--steps", str(STEPS), "--pause-at", str(10**9),
            "--resume-file", str(tmp_path / "never")]


def test_two_racks_behind_leaves_and_a_spine_train_to_equal_replicas(tmp_path: Path) -> None:
    reason = missing_netns_tools("it builds network namespaces and veth links (run `.ci/run`)")
    if reason:
        pytest.skip(reason)
    tag = f"hyc{os.getpid() % 10000}"
    inventory, job = tmp_path / "cluster.toml", tmp_path / "cluster-job.toml"
    up = hysync("rack", "up", str(HOSTS), "--racks", str(RACKS), "--tag", tag,
                "--inventory", str(inventory), "--json")
    assert up.returncode == 0, up.stderr
    procs: list[subprocess.Popen] = []
    try:
        made = json.loads(up.stdout)
        assert made["job"] == str(job) and job.exists() and inventory.exists()
        hosts = [f"{tag}-r{r}h{h}" for r in (1, 2) for h in (1, 2, 3)]
        assert namespaces(tag) == {f"{tag}-sp", f"{tag}-l1", f"{tag}-l2", f"{tag}-fe", *hosts}
        # offloads off on every end of the data veths: host <-> leaf, leaf <-> spine
        for ns, ifname in ((f"{tag}-r2h3", f"{tag}r2h3"), (f"{tag}-l2", f"{tag}r2s3"),
                           (f"{tag}-l1", f"{tag}r1u"), (f"{tag}-sp", f"{tag}r1d")):
            said = offloads(ns, ifname)
            assert "tx-checksumming: off" in said and "rx-checksumming: off" in said, (ns, said)
        commands = made["commands"]
        added = subprocess.run(shlex.split(commands[0]), cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
        assert added.returncode == 0, added.stderr
        assert "job 1 across 3 switches" in added.stdout, added.stdout
        runs = [c for c in commands if "--node-rank" in c]
        assert len(runs) == RACKS * HOSTS
        procs = [subprocess.Popen(as_test_run(line, tmp_path), cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for line in runs]
        outputs = [p.communicate(timeout=WAIT)[0] for p in procs]
        for p, out in zip(procs, outputs, strict=True):
            assert p.returncode == 0, out[-3000:]
        shown = hysync("--inventory", str(inventory), "mode", "show", "1")
        assert shown.returncode == 0, shown.stderr
        # every rank left the job when its training was done, over the front-end network:
        # each leaf keeps its last host, the spine its last leaf
        assert [line for line in shown.stdout.splitlines() if " at " in line] == [
            "job 1 at spine, 1 active members (leaves)",
            "job 1 at leaf:leaf-1, 1 active members (hosts)",
            "job 1 at leaf:leaf-2, 1 active members (hosts)"], shown.stdout
        removed = hysync("--inventory", str(inventory), "job", "remove", "1")
        assert removed.returncode == 0, removed.stderr
    finally:
        for p in procs:
            kill_tree(p)
        down = hysync("rack", "down", "--tag", tag)
    assert down.returncode == 0, down.stderr
    assert "3 softswitches stopped" in down.stdout, down.stdout
    records = {r["rank"]: r for r in rank_records(outputs) if "accuracy" in r}
    assert sorted(records) == list(range(RACKS * HOSTS)), outputs
    for k, r in records.items():
        rack_index, host = divmod(k, HOSTS)  # rank k: the k-th host, rack by rack
        assert (r["switch"], r["worker_id"], r["behind_leaf"]) == (
            leaf_ip(rack_index), host, True), r
        assert r["updates"] == r["steps"] == STEPS and set(r["modes"]) == {"sync"}, r
        assert r["accuracy"] >= TARGET_ACCURACY, r
    # in sync at every level every replica applies the same sums: the same parameters
    assert len({r["params"] for r in records.values()}) == 1, records
    # nothing of the cluster is left: namespaces, root-namespace links, record, keys, logs
    assert namespaces(tag) == set()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f" {tag}m0" not in links and f" {tag}m2" not in links
    assert not rack.state_file(tag).exists() and not rack.pki_dir(tag).exists()
    assert not list(rack.STATE_DIR.glob(f"{tag}-*softswitch.log"))


def test_two_clusters_side_by_side_answer_at_their_own_addresses(tmp_path: Path) -> None:
    """A second cluster while one is up: another management network, every switch of both
    answers P4Runtime (mutual TLS, the inventory's certificates), and each `down` removes
    its own cluster only."""
    reason = missing_netns_tools("it builds network namespaces and veth links (run `.ci/run`)")
    if reason:
        pytest.skip(reason)
    tags = [f"hy{c}{os.getpid() % 10000}" for c in "ab"]
    addrs: list[dict[str, str]] = []
    try:
        for tag in tags:
            up = hysync("rack", "up", "2", "--racks", "2", "--tag", tag,
                        "--inventory", str(tmp_path / f"{tag}.toml"), "--json")
            assert up.returncode == 0, up.stderr
            addrs.append(json.loads(up.stdout)["grpc_addrs"])
        assert set(addrs[0].values()).isdisjoint(addrs[1].values()), addrs
        for tag in tags:
            inv = Inventory.load(tmp_path / f"{tag}.toml")
            assert inv.fabric is not None
            for sw in inv.fabric.switches:
                wait_for_server(sw.switch.grpc_addr, 10, tls=sw.switch.tls)
    finally:
        downs = [hysync("rack", "down", "--tag", tag) for tag in tags]
    assert [d.returncode for d in downs] == [0, 0], [d.stderr for d in downs]
    assert namespaces(tags[0]) == set() and namespaces(tags[1]) == set()

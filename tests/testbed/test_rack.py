"""`hysync rack up N` / `hysync rack down`: the inventory it writes is the committed
examples/rack.toml; bad input is refused in one line with nothing built; as root, up
builds namespaces, veths and a softswitch that answers, and down removes exactly them."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from hysync import resources
from hysync.controlplane.cli import rack, rack_fabric
from hysync.controlplane.cli.main import main
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import wait_for_server
from hysync.controlplane.testbed import netns_fabric
from hysync.controlplane.testbed.inventory import Inventory
from hysync.controlplane.testbed.job_member import job_member
from hysync.controlplane.testbed.netns import missing_netns_tools
from hysync.tls import ClientTls

from .conftest import ROOT


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), stdout=out, stderr=err), out.getvalue(), err.getvalue()


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(rack, "STATE_DIR", tmp_path / "state")
    return tmp_path / "state"


def test_the_committed_rack_inventory_is_what_rack_up_3_writes(state_dir: Path) -> None:
    committed = ROOT / "examples" / "rack.toml"  # up's, with its state in /run/hysync
    assert rack.inventory_text(3).replace(str(state_dir), "/run/hysync") == \
        committed.read_text()
    # It names the certificates `up` makes (here under state_dir): with them, it loads.
    rack.rack_certificates(rack.pki_dir("hyr"), f"{rack.MGMT_NET}.2")
    path = state_dir / "rack.toml"
    path.write_text(rack.inventory_text(3))
    inv = Inventory.load(path)
    assert inv.switch.tls is not None and inv.switch.exposed() is None
    assert [h.name for h in inv.hosts] == ["h1", "h2", "h3"]
    assert [h.interface for h in inv.hosts] == ["hyrh1", "hyrh2", "hyrh3"]
    assert inv.switch.p4info == resources.path(resources.V1MODEL_P4INFO)


def test_the_loopback_example_loads_with_the_shipped_p4info() -> None:
    inv = Inventory.load(ROOT / "examples" / "loopback.toml")
    assert inv.switch.p4info.is_file() and inv.serve == "127.0.0.1:9600"
    assert [(h.name, h.ipv4) for h in inv.hosts] == [("h1", "127.0.0.1")]


def test_the_printed_commands_run_the_shipped_example_on_every_host(tmp_path: Path) -> None:
    lines = rack.next_steps(3, "hyr", tmp_path / "rack.toml")
    runs = [line for line in lines if "--node-rank" in line]
    assert len(runs) == 3
    for w, line in enumerate(runs):
        assert line.startswith(f"ip netns exec hyr-h{w + 1} env GLOO_SOCKET_IFNAME=hyrh{w + 1} ")
        assert "--nnodes 3 " in line and f"--node-rank {w} " in line
        assert "--master-addr 10.0.0.1 " in line
        assert str(resources.path("examples/train_ddp.py")) in line
    assert lines[-1].endswith("rack down")
    assert all("--nproc-per-node 1 " in line and "HYSYNC_RANKS_PER_HOST" not in line
               and line.endswith("--average-every 1 &") for line in runs)


def test_hosts_of_several_ranks_start_them_reduced_on_the_host(tmp_path: Path) -> None:
    """--ranks-per-host 2: torchrun starts two ranks per host, grouped by torchrun's own
    host numbering, and without background averaging (one rank per host only)."""
    lines = rack.next_steps(3, "hyr", tmp_path / "rack.toml", ranks_per_host=2)
    runs = [line for line in lines if "--node-rank" in line]
    assert len(runs) == 3
    for w, line in enumerate(runs):
        assert line.startswith(f"ip netns exec hyr-h{w + 1} env GLOO_SOCKET_IFNAME=hyrh{w + 1} "
                               "HYSYNC_RANKS_PER_HOST=local ")
        assert "--nnodes 3 --nproc-per-node 2 " in line and f"--node-rank {w} " in line
        assert "--average-every" not in line


@pytest.mark.parametrize("argv, says", [
    (["rack", "up", "1"], "N = '1': a rack has 2..16 hosts"),
    (["rack", "up", "three"], "N = 'three': a rack has 2..16 hosts"),
    (["rack", "up", "3", "--tag", "Rack-1"], "tag 'Rack-1' must be 1-8 lowercase"),
    (["rack", "down", "--tag", "toolongatag"], "tag 'toolongatag' must be 1-8 lowercase"),
    (["rack", "up", "3", "--ranks-per-host", "0"], "--ranks-per-host '0': a host runs 1..8 "
                                                    "ranks (one per GPU)"),
    (["rack", "up", "3", "--ranks-per-host", "9"], "--ranks-per-host '9': a host runs 1..8"),
])
def test_bad_arguments_are_one_line_and_build_nothing(state_dir: Path, argv: list[str],
                                                      says: str) -> None:
    code, _, err = run(*argv)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not state_dir.exists()


def test_down_without_a_rack_says_so(state_dir: Path) -> None:
    code, _, err = run("rack", "down", "--tag", "nosuch")
    assert code == 1
    assert err.strip() == (f"hysync: error: no rack 'nosuch' is up (no {state_dir}/"
                           "rack-nosuch.json): nothing to remove")


def test_up_twice_is_refused_before_anything_is_built(state_dir: Path, tmp_path: Path) -> None:
    state_dir.mkdir()
    (state_dir / "rack-twice.json").write_text("{}")
    code, _, err = run("rack", "up", "2", "--tag", "twice", "--inventory",
                       str(tmp_path / "rack.toml"))
    assert code == 1 and "rack 'twice' is up already" in err, err
    assert "hysync rack down --tag twice" in err
    assert not (tmp_path / "rack.toml").exists()


def _namespaces(tag: str) -> set[str]:
    """The rack's namespaces (other tests on this machine may make and remove theirs)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return {line.split()[0] for line in done.stdout.splitlines()
            if line.startswith(f"{tag}-")}


@pytest.mark.slow
@pytest.mark.root
def test_up_builds_a_rack_with_a_switch_and_down_removes_exactly_it(tmp_path: Path) -> None:
    reason = missing_netns_tools("hysync rack up builds network namespaces and veths")
    if reason:
        pytest.skip(reason)
    tag = f"hyt{os.getpid() % 10000}"
    inventory = tmp_path / "rack.toml"
    code, out, err = run("rack", "up", "2", "--tag", tag, "--inventory", str(inventory))
    try:
        assert code == 0, err
        assert inventory.read_text() == rack.inventory_text(2, tag)
        assert _namespaces(tag) == {f"{tag}-sw", f"{tag}-h1", f"{tag}-h2"}
        certs = rack.pki_dir(tag)  # the softswitch answers P4Runtime over mutual TLS
        wait_for_server(f"{rack.MGMT_NET}.2:9559", 10, tls=ClientTls(
            certs / "rack-ca.pem", certs / "hysync-serve.pem", certs / "hysync-serve.key"))
        for ifname, ns in ((f"{tag}h1", f"{tag}-h1"), (f"{tag}s1", f"{tag}-sw")):
            offloads = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-k", ifname],
                                      capture_output=True, text=True).stdout
            assert "tx-checksumming: off" in offloads and "rx-checksumming: off" in offloads
        assert "--nnodes 2 " in out and f"ip netns exec {tag}-h2 " in out
        again, _, err2 = run("rack", "up", "2", "--tag", tag, "--inventory", str(inventory))
        assert again == 1 and "is up already" in err2
    finally:
        down, said, err3 = run("rack", "down", "--tag", tag)
    assert down == 0, err3
    assert "the softswitch stopped" in said
    assert _namespaces(tag) == set()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f" {tag}m" not in links  # the management veth's root end went with it
    assert not rack.state_file(tag).exists() and not rack.pki_dir(tag).exists()
    assert inventory.exists()  # the inventory is the user's now


def test_a_cluster_of_two_racks_writes_an_inventory_and_a_job_that_fit(tmp_path: Path) -> None:
    """`rack up 3 --racks 2`'s inventory: a spine, a leaf per rack, three hosts behind each;
    its job file: every host a member behind its leaf, rank k the k-th host rack by rack,
    sending to its own leaf's data address."""
    pki = tmp_path / "pki"
    rack_fabric.fabric_certificates(pki, {"spine": "169.254.98.2"})
    inventory, job_file = tmp_path / "cluster.toml", tmp_path / "job.toml"
    inventory.write_text(rack_fabric.inventory_text(2, 3, "hyr", pki))
    job_file.write_text(rack_fabric.job_text(2, 3))
    inv, job = Inventory.load(inventory), JobConfig.load(job_file)
    assert inv.fabric is not None
    assert [(s.name, s.role) for s in inv.fabric.switches] == [
        ("spine", "spine"), ("leaf-1", "leaf"), ("leaf-2", "leaf")]
    assert all(s.switch.tls is not None for s in inv.fabric.switches)
    assert [(lf.uplink_port, lf.spine_port) for lf in inv.fabric.leaves] == [(4, 1), (4, 2)]
    assert [h.name for h in inv.hosts_behind("leaf-2")] == ["r2h1", "r2h2", "r2h3"]
    assert job.spans_switches and job.leaf_names() == ("leaf-1", "leaf-2")
    for k in range(6):
        r, h = divmod(k, 3)
        member = job_member(inv, job, k, 6)
        assert (member.leaf, member.member.worker) == (f"leaf-{r + 1}", h)
        assert member.member.ipv4 == netns_fabric.host_ip(r, h)
        assert member.switch.data_ipv4 == netns_fabric.leaf_ip(r)


def test_the_printed_cluster_commands_run_one_rank_per_host(tmp_path: Path) -> None:
    lines = rack_fabric.next_steps(2, 3, "hyr", tmp_path / "c.toml", tmp_path / "job.toml",
                                   default_tag="hyr", master_port=29500)
    assert lines[0].endswith(f"--inventory {tmp_path}/c.toml job add {tmp_path}/job.toml")
    runs = [line for line in lines if "--node-rank" in line]
    assert len(runs) == 6
    for k, line in enumerate(runs):
        r, h = divmod(k, 3)
        assert line.startswith(f"ip netns exec hyr-r{r + 1}h{h + 1} env "
                               f"GLOO_SOCKET_IFNAME=hyrr{r + 1}f{h + 1} ")
        assert f"--nnodes 6 --nproc-per-node 1 --node-rank {k} " in line
        assert "--master-addr 10.1.0.1 " in line and f"--job {tmp_path}/job.toml" in line
    assert lines[-2].endswith("job remove 1") and lines[-1].endswith("rack down")


@pytest.mark.parametrize("argv, says", [
    (["rack", "up", "3", "--racks", "9"], "--racks '9': give 1 (one switch) or 2..8"),
    (["rack", "up", "3", "--racks", "0"], "--racks '0': give 1 (one switch) or 2..8"),
    (["rack", "up", "3", "--racks", "2", "--ranks-per-host", "2"],
     "--ranks-per-host 2 with --racks 2: a job across leaves and a spine has one rank per host"),
    (["rack", "up", "3", "--job", "job.toml"], "--job FILE names the job file of a cluster"),
    (["rack", "up", "3", "--racks", "2", "--job", "/no/such/dir/job.toml"],
     "--job /no/such/dir/job.toml: /no/such/dir is not a directory"),
])
def test_bad_cluster_arguments_are_one_line_and_build_nothing(state_dir: Path, argv: list[str],
                                                              says: str) -> None:
    code, _, err = run(*argv)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not state_dir.exists()

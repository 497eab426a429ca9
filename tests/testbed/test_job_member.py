"""A rank joining an installed job from its job file: which member it is, where it sends
(its leaf, with its worker id there, behind_leaf on), and a one-line refusal for each bad
combination of job file, inventory and member name."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hysync.controlplane.job import JobConfig
from hysync.controlplane.testbed.inventory import Inventory, InventoryError
from hysync.controlplane.testbed.job_member import job_member, member_names
from hysync.torch import AttachError, join_installed

from .conftest import ROOT, fabric_inventory, loopback_inventory, toml_text, write_inventory

NET = "127.0.0"


def fabric_job(ports: list[int] | None = None) -> dict:
    """Two leaves, two hosts each, listed leaf-1 first (the job's order sorts them)."""
    ports = ports or [47001, 47002, 47003, 47004]
    return {"job_id": 5, "slots": {"base": 8, "count": 16}, "members": [
        {"leaf": f"leaf-{i}", "worker": h, "ipv4": f"{NET}.10",
         "mac": f"02:00:00:00:1{i}:{h + 1:02x}", "udp_port": ports[2 * (1 - i) + h],
         "switch_port": h + 1} for i in (1, 0) for h in range(2)]}


@pytest.fixture
def fabric(tmp_path: Path) -> Inventory:
    return Inventory.load(write_inventory(tmp_path / "fabric.toml", fabric_inventory(hosts=2)))


def test_rank_r_is_the_jobs_rth_member_by_leaf_then_worker(fabric: Inventory) -> None:
    job = JobConfig.from_dict(fabric_job())
    assert member_names(job) == ["leaf-0:0", "leaf-0:1", "leaf-1:0", "leaf-1:1"]
    me = job_member(fabric, job, 3, 4)
    assert (me.name, me.leaf, me.member.worker, me.member.udp_port) == \
        ("leaf-1:1", "leaf-1", 1, 47002)
    assert (me.switch.data_ipv4, me.behind_leaf, me.members) == (f"{NET}.3", True, 4)
    # a name picks the member whatever the rank
    assert job_member(fabric, job, 0, 4, "leaf-1:0").switch.data_ipv4 == f"{NET}.3"


@pytest.mark.parametrize(("world", "name", "fragment"), [
    (3, None, "job 5 has 4 members and the process group 3 ranks: run one rank per member"),
    (4, "leaf-2:0", "member 'leaf-2:0' is not in job 5: name one of leaf-0:0, leaf-0:1, "
                    "leaf-1:0, leaf-1:1 (LEAF:WORKER)"),
    (4, "1", "member '1' is not in job 5"),
])
def test_a_bad_member_or_world_is_refused_in_one_line(
        fabric: Inventory, world: int, name: str | None, fragment: str) -> None:
    with pytest.raises(InventoryError) as caught:
        job_member(fabric, JobConfig.from_dict(fabric_job()), 0, world, name)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_the_job_and_the_inventory_must_agree_on_leaves(fabric: Inventory,
                                                        tmp_path: Path) -> None:
    one = Inventory.load(write_inventory(tmp_path / "rack.toml", loopback_inventory()))
    with pytest.raises(InventoryError, match="job 5 spans leaves .leaf-0, leaf-1. but .* "
                                             "describes one switch"):
        job_member(one, JobConfig.from_dict(fabric_job()), 0, 4)
    flat = fabric_job()
    for m in flat["members"]:
        m.pop("leaf")
        m["worker"] += 2 * (m["mac"][-4] == "1")  # unique on one switch
    with pytest.raises(InventoryError, match="has leaves and a spine but job 5 names no "
                                             "member's leaf"):
        job_member(fabric, JobConfig.from_dict(flat), 0, 4)
    # one switch, one job without leaves: the switch's address, behind_leaf off
    me = job_member(one, JobConfig.from_dict(flat), 2, 4)
    assert (me.name, me.switch.data_ipv4, me.behind_leaf) == ("2", "127.0.0.1", False)
    other = fabric_inventory(hosts=2)
    other["switches"][2]["name"] = "leaf-9"
    for host in other["hosts"]:
        host["leaf"] = host["leaf"].replace("leaf-1", "leaf-9")
    renamed = Inventory.load(write_inventory(tmp_path / "renamed.toml", other))
    with pytest.raises(InventoryError, match="member leaf-1:0 of job 5: no leaf 'leaf-1': "
                                             "the leaves are leaf-0, leaf-9"):
        job_member(renamed, JobConfig.from_dict(fabric_job()), 2, 4)


def test_join_installed_binds_the_members_address_and_sends_to_its_leaf(
        fabric: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((f"{NET}.10", 0))
        port = probe.getsockname()[1]
    job_file = tmp_path / "job.toml"
    job_file.write_text(toml_text(fabric_job([port, port + 1, port + 2, port + 3])))
    monkeypatch.setenv("HYSYNC_MEMBER", "leaf-1:0")
    admitted = join_installed(0, 4, fabric, job_file)
    try:
        assert admitted.training is not None and admitted.serve is None
        config = admitted.training.config
        assert (config.job_id, config.worker_id, config.members, config.behind_leaf) == \
            (5, 0, 4, True)
        assert (config.switch_host, config.bind_host, config.bind_port) == \
            (f"{NET}.3", f"{NET}.10", port)
        assert (config.slot_base, config.slot_count) == (8, 16)
        assert admitted.job == {"job_id": 5, "slot_base": 8, "slot_count": 16, "key": None}
        # the member's address is taken now: a second process as that member is refused
        with pytest.raises(AttachError) as caught:
            join_installed(2, 4, fabric, job_file)
        message = str(caught.value)
        assert message.startswith(f"member leaf-1:0 of {job_file} cannot bind its address "
                                  f"{NET}.10:{port} (") and "\n" not in message
    finally:
        admitted.training.close()
    with pytest.raises(AttachError, match="job 5 has 4 members and the process group 2"):
        join_installed(0, 2, fabric, job_file)
    with pytest.raises(AttachError, match="the job file"):
        join_installed(0, 4, fabric, tmp_path / "missing.toml")


def test_the_shipped_loopback_fabric_and_its_job_pair_up() -> None:
    inv = Inventory.load(ROOT / "examples" / "fabric-loopback.toml")
    job = JobConfig.load(ROOT / "examples" / "job-fabric-loopback.toml")
    found = [job_member(inv, job, rank, 4) for rank in range(4)]
    assert [(m.name, m.switch.data_ipv4, m.member.udp_port) for m in found] == [
        ("leaf-0:0", "127.0.10.2", 47001), ("leaf-0:1", "127.0.10.2", 47002),
        ("leaf-1:0", "127.0.10.3", 47003), ("leaf-1:1", "127.0.10.3", 47004)]
    # each member is the inventory's host of its MAC, behind the same leaf
    hosts = {h.mac: h for h in inv.hosts}
    assert all(hosts[m.member.mac].leaf == m.leaf for m in found)

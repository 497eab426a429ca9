"""An inventory of leaves and a spine (docs/testbed.md): a valid one loads with each
switch's role, the leaves' member ids at the spine and the hosts behind each leaf; every
inconsistent one is refused with one line that names what is wrong and how to fix it."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest

from hysync.controlplane.cli.main import main
from hysync.controlplane.testbed.inventory import Inventory, InventoryError

from .conftest import fabric_inventory, loopback_inventory, write_inventory

VALID = fabric_inventory()


def _load(tmp_path: Path, data: dict[str, Any]) -> Inventory:
    return Inventory.load(write_inventory(tmp_path / "fabric.toml", data))


def test_a_spine_and_two_leaves_load_with_their_roles_links_and_hosts(tmp_path: Path) -> None:
    inv = _load(tmp_path, VALID)
    assert inv.fabric is not None
    assert inv.fabric.spine.name == "spine" and inv.switch == inv.fabric.spine.switch
    assert [(lf.name, lf.uplink_id, lf.uplink_port, lf.spine_port)
            for lf in inv.fabric.leaves] == [("leaf-0", 0, 9, 1), ("leaf-1", 1, 9, 2)]
    assert [h.name for h in inv.hosts_behind("leaf-1")] == ["h1-0", "h1-1", "h1-2"]
    assert inv.fabric.leaf("leaf-0").switch.data_ipv4 == "127.0.0.2"
    # Switch ports are a leaf's own: both leaves have hosts on ports 1..3.
    assert {h.switch_port for h in inv.hosts_behind("leaf-0")} == {1, 2, 3}


def test_one_switch_stays_todays_format(tmp_path: Path) -> None:
    inv = _load(tmp_path, loopback_inventory())
    assert inv.fabric is None and all(h.leaf == "" for h in inv.hosts)
    data = loopback_inventory()
    data["hosts"][0]["leaf"] = "leaf-0"  # a one-switch inventory has no leaves
    with pytest.raises(InventoryError, match=r"hosts\[0\]: unknown key\(s\) leaf"):
        _load(tmp_path, data)


def _changed(change) -> dict[str, Any]:
    data = copy.deepcopy(VALID)
    change(data)
    return data


def _leaves(n: int) -> dict[str, Any]:
    data = fabric_inventory(tuple(f"127.0.0.1:{9559 + i}" for i in range(n + 1)),
                            net="127.0.0", hosts=1)
    for i, sw in enumerate(data["switches"][1:]):
        sw["data_ipv4"] = f"127.0.{1 + i // 200}.{2 + i % 200}"
        sw["data_mac"] = f"02:00:00:00:{i:02x}:fe"
        sw["spine_port"] = i + 1
    for i, host in enumerate(data["hosts"]):
        host["mac"] = f"02:00:00:01:{i:02x}:01"
    return data


def _host_twice(data: dict[str, Any]) -> None:
    data["hosts"].append(dict(data["hosts"][0], leaf="leaf-1", switch_port=7,
                              mac="02:00:00:00:99:01"))


def _two_spines(data: dict[str, Any]) -> None:
    leaf = data["switches"][1]
    leaf["role"] = "spine"
    del leaf["uplink_port"], leaf["spine_port"]


INVALID = [
    ("unknown leaf", lambda d: d["hosts"][0].update(leaf="leaf-9"),
     ["hosts[0].leaf = 'leaf-9' is not a leaf of the testbed", "leaf-0, leaf-1"]),
    ("host without a leaf", lambda d: d["hosts"][0].pop("leaf"),
     ["hosts[0].leaf = None is not a leaf"]),
    ("host behind two leaves", _host_twice,
     ["host 'h0-0' is behind leaf 'leaf-0' and leaf 'leaf-1'", "list it once"]),
    ("a list of leaves", lambda d: d["hosts"][0].update(leaf=["leaf-0", "leaf-1"]),
     ["a host sits behind one leaf"]),
    ("spine missing", lambda d: d["switches"].pop(0),
     ["no switch has role = \"spine\""]),
    ("two spines", _two_spines, ["two spines ('spine' and 'leaf-0')", "one spine"]),
    ("no leaves", lambda d: d.update(switches=d["switches"][:1]),
     ["spine 'spine' has no leaves"]),
    ("bad role", lambda d: d["switches"][1].update(role="tor"),
     ["switches[1].role = 'tor': choose leaf or spine"]),
    ("switch and switches", lambda d: d.update(switch={"grpc_addr": "127.0.0.1:1"}),
     ["[switch] and [[switches]] together"]),
    ("same data address", lambda d: d["switches"][2].update(data_ipv4="127.0.0.2"),
     ["switches 'leaf-0' and 'leaf-1' have the same data_ipv4 '127.0.0.2'"]),
    ("same name", lambda d: d["switches"][2].update(name="leaf-0"),
     ["same name 'leaf-0'"]),
    ("same spine port", lambda d: d["switches"][2].update(spine_port=1),
     ["leaves 'leaf-0' and 'leaf-1' both have spine_port = 1"]),
    ("uplink port missing", lambda d: d["switches"][1].pop("uplink_port"),
     ["switches[leaf-0].uplink_port"]),
    ("uplink port on the spine", lambda d: d["switches"][0].update(uplink_port=3),
     ["switches[spine].uplink_port: only a leaf has one"]),
    ("bad switch field", lambda d: d["switches"][1].update(grpc_addr="leaf"),
     ["switches[leaf-0].grpc_addr = 'leaf' is not HOST:PORT"]),
    ("two hosts on a leaf's port", lambda d: d["hosts"][1].update(switch_port=1),
     ["hosts[1].switch_port = 1 is also hosts[0].switch_port"]),
    ("a host MAC twice", lambda d: d["hosts"][3].update(mac="02:00:00:00:10:01"),
     ["hosts 'h0-0' and 'h1-0' have the same mac"]),
    ("a host with a leaf's MAC", lambda d: d["hosts"][0].update(mac="02:00:00:00:01:fe"),
     ["hosts[h0-0] has switch 'leaf-1''s data address"]),
]


@pytest.mark.parametrize(("what", "change", "fragments"), INVALID, ids=[w for w, _, _ in INVALID])
def test_every_inconsistent_testbed_is_refused_in_one_line(tmp_path: Path, what: str, change,
                                                          fragments: list[str]) -> None:
    with pytest.raises(InventoryError) as caught:
        _load(tmp_path, _changed(change))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'fabric.toml'}: ") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_more_than_32_leaves_are_refused(tmp_path: Path) -> None:
    assert len(_load(tmp_path, _leaves(32)).fabric.leaves) == 32
    with pytest.raises(InventoryError, match="33 leaves: a spine admits at most 32"):
        _load(tmp_path, _leaves(33))


def test_more_than_32_hosts_behind_a_leaf_are_refused(tmp_path: Path) -> None:
    data = fabric_inventory(hosts=33)
    with pytest.raises(InventoryError, match="33 hosts behind leaf 'leaf-0'"):
        _load(tmp_path, data)
    assert len(_load(tmp_path, fabric_inventory(hosts=32)).hosts) == 64  # 32 + 32: allowed


def test_deploy_check_takes_a_one_switch_inventory_and_says_what_to_use(
        tmp_path: Path) -> None:
    path = write_inventory(tmp_path / "fabric.toml", VALID)
    out, err = io.StringIO(), io.StringIO()
    assert main(["deploy", "--check", str(path)], stdout=out, stderr=err) == 2
    assert out.getvalue() == "" and err.getvalue().count("\n") == 1
    assert "--check takes a one-switch inventory" in err.getvalue(), err.getvalue()
    assert "`hysync deploy --dry-run` reads every switch" in err.getvalue(), err.getvalue()


@pytest.mark.parametrize("section", ["switches", "hosts"])
def test_an_entry_that_is_not_a_table_is_refused(tmp_path: Path, section: str) -> None:
    data = copy.deepcopy(VALID)
    data[section][1] = "leaf-0"
    with pytest.raises(InventoryError,
                       match=rf"^{section}\[1\] must be a table \(\[\[{section}\]\]\)$"):
        Inventory.from_dict(data, base=tmp_path)

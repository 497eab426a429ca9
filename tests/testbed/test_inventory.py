"""The inventory: a valid one loads; every invalid field is refused with the file, the
field and what would be valid; nothing is pushed to a switch from an invalid one."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest

from hysync.controlplane.cli.main import main
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.testbed.inventory import Inventory, InventoryError
from tests.nested_data import DELETE, changed

from .conftest import P4INFO, Softswitch, loopback_inventory, write_inventory

VALID = loopback_inventory()


def _load(tmp_path: Path, data: dict[str, Any]) -> Inventory:
    return Inventory.load(write_inventory(tmp_path / "rack.toml", data))


def test_a_valid_inventory_loads_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    data = copy.deepcopy(VALID)
    (tmp_path / "p4").mkdir()
    (tmp_path / "p4" / "hysync.p4info.txtpb").write_text(P4INFO.read_text())
    data["switch"]["p4info"] = "p4/hysync.p4info.txtpb"
    data["hosts"][0]["mac"] = "02:00:00:00:01:AA"
    inv = _load(tmp_path, data)
    assert inv.switch.p4info == tmp_path / "p4" / "hysync.p4info.txtpb"
    assert inv.switch.election_id == (0, 10)
    assert inv.hosts[0].mac == "02:00:00:00:01:aa"  # one spelling
    assert inv.pool.slots == (0, 8191) and (inv.pool.job_slots, inv.pool.averaging_slots) == \
        (32, 8)
    assert inv.host("h2").switch_port == 2


def _set(path: str, value: Any) -> dict[str, Any]:
    return changed(VALID, path, value)

# (field path, bad value, fragments the one-line error must contain)
INVALID = [
    ("name", 5, ["name = 5", "string"]),
    ("colour", "red", ["unknown key(s) colour", "allowed keys"]),
    ("switch", DELETE, ["[switch] is missing"]),
    ("switch.grpc_addr", "switch-1", ["switch.grpc_addr", "HOST:PORT"]),
    ("switch.grpc_addr", DELETE, ["switch.grpc_addr is missing"]),
    ("switch.device_id", 0, ["switch.device_id = 0", "device id >= 1"]),
    ("switch.election_id", "ten", ["switch.election_id", "number or 'high,low'"]),
    ("switch.election_id", 0, ["switch.election_id", "use 1 or more"]),
    ("switch.target", "p4", ["switch.target = 'p4'", "softswitch, bmv2, tofino"]),
    ("switch.p4info", DELETE, ["switch.p4info is missing", "hysync.p4info.txtpb"]),
    ("switch.p4info", "nowhere.txtpb", ["switch.p4info = 'nowhere.txtpb'", "does not exist"]),
    ("switch.target", "bmv2", ["switch.device_config is missing", "make p4"]),
    ("switch.data_ipv4", "10.0.0", ["switch.data_ipv4 = '10.0.0'", "IPv4"]),
    ("switch.data_mac", "02:00", ["switch.data_mac = '02:00'", "six hex bytes"]),
    ("switch.data_udp_port", 70000, ["switch.data_udp_port = 70000", "1..65535"]),
    ("switch.speed", 100, ["[switch]: unknown key(s) speed"]),
    ("pool.slot_base", 9000, ["pool.slot_base = 9000", "0..8191"]),
    ("pool.slot_count", 0, ["pool.slot_count = 0", "1..8192"]),
    ("pool.job_slots", 40, ["pool.job_slots + pool.averaging_slots = 48", "exceed",
                            "pool.slot_count"]),
    ("pool.averaging_slots", "many", ["pool.averaging_slots = 'many'", "integer"]),
    ("serve.listen", "nowhere", ["serve.listen", "HOST:PORT nor unix:PATH"]),
    ("hosts", [], ["hosts is missing or empty"]),
    ("hosts.1.name", "h1", ["hosts[1].name = 'h1' is also hosts[0].name"]),
    ("hosts.0.interface", DELETE, ["hosts[0].interface is missing"]),
    ("hosts.0.ipv4", "10.0.0.300", ["hosts[0].ipv4 = '10.0.0.300'", "IPv4"]),
    ("hosts.0.mac", "zz:00:00:00:00:01", ["hosts[0].mac", "six hex bytes"]),
    ("hosts.1.mac", "02:00:00:00:01:01", ["hosts[1].mac", "also hosts[0].mac"]),
    ("hosts.0.switch_port", 511, ["hosts[0].switch_port = 511", "0..510"]),
    ("hosts.1.switch_port", 1, ["hosts[1].switch_port = 1 is also hosts[0].switch_port"]),
    ("hosts.0.mac", "02:00:00:00:00:fe", ["hosts[h1] has the switch's data address"]),
    ("hosts.0.rack", 3, ["hosts[0]: unknown key(s) rack"]),
]


@pytest.mark.parametrize(("field", "value", "fragments"), INVALID,
                         ids=[f"{f}={v!r}"[:40] for f, v, _ in INVALID])
def test_every_invalid_field_is_named_with_its_fix(tmp_path: Path, field: str, value: Any,
                                                  fragments: list[str]) -> None:
    data = _set(field, value)
    if field == "pool.job_slots":
        data["pool"]["slot_count"] = 47
    with pytest.raises(InventoryError) as caught:
        _load(tmp_path, data)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'rack.toml'}: "), message
    for fragment in fragments:
        assert fragment in message, message


def test_a_host_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    data = copy.deepcopy(VALID)
    data["hosts"].append("h3")
    with pytest.raises(InventoryError, match=r"^hosts\[2\] must be a table \(\[\[hosts\]\]\)$"):
        Inventory.from_dict(data, base=tmp_path)


def test_duplicate_ipv4_is_refused_except_on_loopback(tmp_path: Path) -> None:
    data = copy.deepcopy(VALID)
    for i, host in enumerate(data["hosts"]):
        host["ipv4"] = "10.0.0.7"
        host["interface"] = f"eth{i}"
    with pytest.raises(InventoryError, match=r"hosts\[1\].ipv4 = '10.0.0.7' is also"):
        _load(tmp_path, data)


def test_not_toml_and_missing_file_say_so(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[switch\n")
    with pytest.raises(InventoryError, match="is not valid TOML"):
        Inventory.load(bad)
    with pytest.raises(InventoryError, match="cannot read the inventory"):
        Inventory.load(tmp_path / "missing.toml")


def test_nothing_is_pushed_from_an_invalid_inventory(tmp_path: Path,
                                                     softswitch: Softswitch) -> None:
    data = loopback_inventory(softswitch.grpc_addr, softswitch.udp_addr[1])
    data["hosts"][1]["switch_port"] = 1  # two hosts on one port
    path = write_inventory(tmp_path / "rack.toml", data)
    err = io.StringIO()
    assert main(["deploy", str(path)], stdout=io.StringIO(), stderr=err) == 2  # bad input
    assert err.getvalue().count("\n") == 1 and "hosts[1].switch_port" in err.getvalue()
    with Switch(softswitch.grpc_addr, arbitrate=False) as switch:
        assert not switch.has_pipeline


def test_deploy_and_serve_refuse_a_plaintext_switch_off_loopback(tmp_path: Path) -> None:
    """Any machine that reaches such a switch can write past serve: refused before the
    switch is contacted, unless the inventory or the command line says it is meant."""
    data = loopback_inventory("192.0.2.10:9559")  # a documentation address: never dialled
    path = write_inventory(tmp_path / "exposed.toml", data)
    for command in (["deploy", str(path)], ["serve", str(path)]):
        out, err = io.StringIO(), io.StringIO()
        assert main(command, stdout=out, stderr=err) == 1
        assert out.getvalue() == "" and err.getvalue().count("\n") == 1
        assert ("the switch at 192.0.2.10:9559 speaks P4Runtime in the clear: any machine "
                "that reaches it can take the primary role and write past serve") in err.getvalue()
        assert "or accept it with --insecure (or insecure = true in [switch])" in err.getvalue()
    assert Inventory.load(path).switch.exposed() is not None
    data["switch"]["insecure"] = True
    assert _load(tmp_path, data).switch.exposed() is None
    assert _load(tmp_path, loopback_inventory("127.0.0.1:9559")).switch.exposed() is None
    data["switch"]["insecure"] = "yes"
    with pytest.raises(InventoryError, match="switch.insecure = 'yes': write true or false"):
        _load(tmp_path, data)

"""`hysync.torch.attach`'s refusals, before anything is admitted: each names the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from hysync.controlplane.testbed.inventory import Inventory
from hysync.torch import AttachError, attach, find_host

from .conftest import loopback_inventory, write_inventory


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    return Inventory.load(write_inventory(tmp_path / "rack.toml", loopback_inventory()))


def test_attach_needs_a_process_group(inventory: Inventory) -> None:
    assert not dist.is_initialized()
    with pytest.raises(AttachError, match="call torch.distributed.init_process_group before"):
        attach(None, inventory=inventory)  # type: ignore[arg-type] - never reached


def test_the_host_is_the_one_whose_address_binds_or_hysync_host(
        inventory: Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYSYNC_HOST", raising=False)
    with pytest.raises(AttachError, match=r"hosts with an address here: h1, h2\): set "
                                          "HYSYNC_HOST"):
        find_host(inventory)  # both emulated hosts are on 127.0.0.1
    monkeypatch.setenv("HYSYNC_HOST", "h2")
    assert find_host(inventory).switch_port == 2
    with pytest.raises(AttachError, match="no host 'h7'"):
        find_host(inventory, "h7")
    data = loopback_inventory()
    data["hosts"][0]["ipv4"] = "192.0.2.1"  # TEST-NET-1: on no machine
    data["hosts"][1]["interface"] = "nonexistent0"
    other = Inventory.load(write_inventory(tmp_path / "other.toml", data))
    with pytest.raises(AttachError, match="interface 'nonexistent0', which this machine "
                                          "lacks"):
        find_host(other, "h2")
    monkeypatch.delenv("HYSYNC_HOST")
    assert find_host(other).name == "h2"  # the only host whose address is here

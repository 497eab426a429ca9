"""The inventory's credential fields: [serve] token files and socket mode, [switch] TLS
files; each bad one refused in one sentence naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from hysync.controlplane.testbed.inventory import Inventory, InventoryError
from hysync.controlplane.testbed.serve_access import DEFAULT_SOCKET_MODE
from hysync.tls import ClientTls

from .conftest import loopback_inventory, write_inventory


def _load(tmp_path: Path, serve: dict[str, Any] | None = None,
          switch: dict[str, Any] | None = None) -> Inventory:
    data = copy.deepcopy(loopback_inventory())
    data["serve"].update(serve or {})
    data["switch"].update(switch or {})
    return Inventory.load(write_inventory(tmp_path / "rack.toml", data))


def test_the_fields_load_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    for name in ("ca.pem", "ctl.pem", "ctl.key"):
        (tmp_path / name).write_text("-----BEGIN X-----\n")
    inv = _load(tmp_path, {"token_file": "serve.token", "socket_mode": "0660"},
                {"cacert": "ca.pem", "cert": "ctl.pem", "private_key": "ctl.key"})
    assert inv.access.token_file == tmp_path / "serve.token"  # read when serve starts
    assert inv.access.operator_token_file is None and inv.access.socket_mode == 0o660
    assert inv.switch.tls == ClientTls(tmp_path / "ca.pem", tmp_path / "ctl.pem",
                                       tmp_path / "ctl.key")
    plain = _load(tmp_path)
    assert plain.switch.tls is None and plain.access.token_file is None
    assert plain.access.socket_mode == DEFAULT_SOCKET_MODE


@pytest.mark.parametrize(("serve", "switch", "error"), [
    ({"token_file": 7}, {}, r"serve.token_file = 7: give the path of a file holding the token"),
    ({"operator_token_file": "op.token"}, {},
     "serve.operator_token_file without serve.token_file: add token_file"),
    ({"socket_mode": "0666"}, {}, r"serve.socket_mode = '0666': .* without bits for others"),
    ({"socket_mode": 438}, {}, "serve.socket_mode = 438"),
    ({"tokens": "x"}, {}, "tokens"),
    ({}, {"cacert": "missing.pem"}, "switch.cacert = 'missing.pem': .* does not exist"),
    ({}, {"cert": "ca.pem"}, "switch.cert and switch.private_key go together"),
])
def test_bad_fields_are_refused(tmp_path: Path, serve: dict[str, Any], switch: dict[str, Any],
                                error: str) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN X-----\n")
    with pytest.raises(InventoryError, match=error):
        _load(tmp_path, serve, switch)

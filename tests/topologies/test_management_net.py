"""Every emulated switch of a process gets its own management address: a rack built
while another switch's management link is up must not answer at that switch's address
(root only: it builds namespaces)."""

from __future__ import annotations

import subprocess

import pytest

from hysync.controlplane.testbed.addresses import free_management_net
from hysync.controlplane.testbed.netns import NetnsStar, missing_netns_tools

pytestmark = pytest.mark.root


def _addresses() -> str:
    return subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                          check=True).stdout


def test_two_racks_of_one_process_get_different_management_links() -> None:
    if reason := missing_netns_tools("it builds network namespaces"):
        pytest.skip(reason)
    first = NetnsStar(1, tag="hmt1")
    try:
        second = NetnsStar(1, tag="hmt2")
        try:
            assert first.grpc_addr != second.grpc_addr
            shown = _addresses()
            assert f"inet {first.mgmt_root_ip}/30" in shown
            assert f"inet {second.mgmt_root_ip}/30" in shown
            # a prefix handed out next is neither, nor any address up in this namespace
            net = free_management_net()
            assert f"inet {net}." not in shown
        finally:
            second.close()
    finally:
        first.close()
    assert f"inet {first.mgmt_root_ip}/30" not in _addresses()

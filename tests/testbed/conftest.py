"""Fixtures of the testbed tests: a valid loopback inventory as data and as a file, and
the real in-process softswitch of the control-plane tests."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.launcher_logs import records
from hysync.controlplane.p4rt.switch import wait_for_server
from hysync.controlplane.serve.server import Server
from hysync.controlplane.testbed.addresses import SWITCH_IP, SWITCH_MAC, host_ip, host_mac
from hysync.controlplane.testbed.netns import missing_netns_tools
from tests.controlplane.conftest import P4INFO, ROOT, Softswitch, softswitch  # noqa: F401
from tests.p4tools import skip_unless_available

Data = dict[str, Any]
RACK_HOSTS = 3  # host namespaces of the emulated rack


def rank_records(outputs: list[str]) -> list[dict]:
    """Every `{"rank": ...}` object the ranks printed (bench.launcher_logs.records)."""
    return records(outputs, "rank")


def tree(pid: int) -> list[int]:
    """A process and its descendants (torchrun starts its workers in sessions of their own)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [pid] + [d for c in children for d in tree(int(c))]


def kill_tree(proc: subprocess.Popen) -> None:
    for pid in reversed(tree(proc.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def loopback_inventory(grpc_addr: str = "127.0.0.1:9559", udp_port: int = 48620,
                       listen: str = "127.0.0.1:9600", hosts: int = 2) -> Data:
    """Hosts emulated on this machine: all on 127.0.0.1, told apart by HYSYNC_HOST."""
    return {
        "name": "loopback",
        "switch": {"grpc_addr": grpc_addr, "target": "softswitch", "p4info": str(P4INFO),
                   "election_id": 10, "data_ipv4": "127.0.0.1", "data_udp_port": udp_port},
        "pool": {"job_slots": 32, "averaging_slots": 8},
        "serve": {"listen": listen},
        "hosts": [{"name": f"h{i + 1}", "interface": "lo", "ipv4": "127.0.0.1",
                   "mac": f"02:00:00:00:01:{i + 1:02x}", "switch_port": i + 1}
                  for i in range(hosts)],
    }


def fabric_inventory(grpc_addrs: tuple[str, ...] = ("127.0.0.1:9559", "127.0.0.1:9560",
                                                    "127.0.0.1:9561"),
                     net: str = "127.0.0", hosts: int = 3) -> Data:
    """A spine and len(grpc_addrs) - 1 leaves on loopback: the spine's data address is
    NET.1, leaf i's NET.(2 + i), the hosts' NET.10 (told apart by their UDP ports); each
    leaf has `hosts` hosts on its ports 1.., its uplink on port 9, the spine's port i + 1."""
    p4info = str(P4INFO)
    switches: list[Data] = [{
        "name": "spine", "role": "spine", "grpc_addr": grpc_addrs[0], "target": "softswitch",
        "p4info": p4info, "data_ipv4": f"{net}.1", "data_mac": "02:00:00:00:00:f1"}]
    for i, addr in enumerate(grpc_addrs[1:]):
        switches.append({
            "name": f"leaf-{i}", "role": "leaf", "uplink_port": 9, "spine_port": i + 1,
            "grpc_addr": addr, "target": "softswitch", "p4info": p4info,
            "data_ipv4": f"{net}.{2 + i}", "data_mac": f"02:00:00:00:0{i}:fe"})
    return {
        "name": "two-level",
        "switches": switches,
        "pool": {"job_slots": 32, "averaging_slots": 8},
        "hosts": [{"name": f"h{i}-{h}", "leaf": f"leaf-{i}", "interface": "lo",
                   "ipv4": f"{net}.10", "mac": f"02:00:00:00:1{i}:{h + 1:02x}",
                   "switch_port": h + 1}
                  for i in range(len(grpc_addrs) - 1) for h in range(hosts)],
    }


# serve.listen of the inventories here: the server binds a port the kernel chose, and
# `published` writes the bound address into the file for the clients that read it.
ANY_PORT = "127.0.0.1:0"


def published(server: Server) -> Server:
    """`server`, started on its inventory's ANY_PORT, with the inventory file naming the
    address it bound: the training scripts and `hysync` commands that read the file reach
    it, and no port is chosen before the server binds it."""
    if server.inv.serve == ANY_PORT:
        path = server.inv.path
        path.write_text(re.sub(r"^listen = .*$", f"listen = {json.dumps(server.address)}",
                               path.read_text(), count=1, flags=re.M))
    return server


def toml_text(data: Data) -> str:
    """Enough TOML for an inventory: scalars, tables, arrays of tables."""
    def scalar(v: object) -> str:
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()

    lines = [f"{k} = {scalar(v)}" for k, v in data.items() if not isinstance(v, dict | list)]
    for key, value in data.items():
        if isinstance(value, dict):
            lines += [f"[{key}]"] + [f"{k} = {scalar(v)}" for k, v in value.items()]
        elif isinstance(value, list):
            for item in value:
                lines += [f"[[{key}]]"] + [f"{k} = {scalar(v)}" for k, v in item.items()]
    return "\n".join(lines) + "\n"


def write_inventory(path: Path, data: Data) -> Path:
    path.write_text(toml_text(data))
    return path


@pytest.fixture
def inventory_for(tmp_path: Path):
    """inventory_for(softswitch, **changes) -> the path of a loopback inventory of it."""
    def make(switch: Softswitch, *, listen: str | None = None, hosts: int = 2) -> Path:
        data = loopback_inventory(switch.grpc_addr, switch.udp_addr[1],
                                  listen or ANY_PORT, hosts)
        return write_inventory(tmp_path / "testbed.toml", copy.deepcopy(data))
    return make


@pytest.fixture(params=["softswitch-raw", "bmv2"])
def rack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[object, Path]]:
    """(the namespaces, the inventory) of a rack whose switch is the softswitch on its raw
    data plane, or BMv2 where it is installed (root only). Each host namespace reaches the
    switch's P4Runtime address too, as a server on a rack's management network does."""
    reason = missing_netns_tools("it builds network namespaces and veth links (run `.ci/run`)")
    if reason:
        pytest.skip(reason)
    from bench.bmv2_bench import BMV2_JSON, _start_switch, bmv2_unavailable
    from hysync.controlplane.testbed.netns import NetnsStar

    kind = request.param
    if kind == "bmv2":
        skip_unless_available(bmv2_unavailable())
    star = NetnsStar(RACK_HOSTS, host_management=True)
    log = tmp_path / "switch.log"
    switch = _start_switch(star, kind, log)
    try:
        wait_for_server(star.grpc_addr, failed=lambda: None if switch.poll() is None else
                        f"the switch exited; see {log}")
        data = loopback_inventory(star.grpc_addr, listen=f"unix:/tmp/hysync-{os.getpid()}.sock")
        data["name"] = "emulated-rack"
        # in the clear on a veth inside this machine, as `hysync rack up`'s switch
        data["switch"].update(data_ipv4=SWITCH_IP, data_mac=SWITCH_MAC, data_udp_port=48620,
                              p4info=str(P4INFO), insecure=True)
        if kind == "bmv2":
            data["switch"].update(target="bmv2", device_config=str(BMV2_JSON))
        data["hosts"] = [{"name": f"h{w + 1}", "interface": star.host_ifs[w],
                          "ipv4": host_ip(w), "mac": host_mac(w), "switch_port": w + 1}
                         for w in range(RACK_HOSTS)]
        yield star, write_inventory(tmp_path / "rack.toml", data)
    finally:
        switch.terminate()
        switch.wait(timeout=10)
        star.close()

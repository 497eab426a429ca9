"""Mininet switch classes: the softswitch on raw interfaces, and BMv2 simple_switch_grpc.

Both serve P4Runtime, so one controller drives either. Both are user-space switches:
offloads are turned off on every veth end (`disable_offloads`), or TCP/UDP checksums
are never filled in and BMv2's capture ring overflows.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from mininet.node import Node, Switch

from hysync.controlplane.p4rt.switch import wait_for_server
from hysync.controlplane.testbed.addresses import free_management_net

REPO = Path(__file__).resolve().parents[1]


class SwitchStartError(RuntimeError):
    """The switch process did not come up; the message says where its log is."""


def disable_offloads(node: Node, ifname: str) -> None:
    node.cmd(f"ethtool -K {ifname} tx off tso off gso off rx off")


def _wait_for_grpc(addr: str, proc: subprocess.Popen, log: Path) -> None:
    wait_for_server(addr, failed=lambda: None if proc.poll() is None else
                    f"the switch exited with status {proc.returncode}; see {log}")


def _terminate(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class SoftswitchNode(Switch):
    """The HySync softswitch bound to the switch's veth interfaces, in the root namespace.

    grpc_addr: where its P4Runtime server listens (loopback).
    delays: {port: milliseconds} of emulated link delay per egress port (no netem here).
    log_dir: where softswitch-<name>.log goes.
    """

    def __init__(self, name: str, grpc_addr: str = "127.0.0.1:9559",
                 delays: dict[int, float] | None = None, log_dir: str | Path = "/tmp",
                 **params) -> None:
        super().__init__(name, **params)
        self.grpc_addr = grpc_addr
        self.delays = delays or {}
        self.log = Path(log_dir) / f"softswitch-{name}.log"
        self.proc: subprocess.Popen | None = None

    def port_map(self) -> list[str]:
        return [f"{self.ports[intf]}@{intf.name}" for intf in self.intfList()
                if intf.name != "lo"]

    def start(self, controllers) -> None:  # noqa: ARG002 (P4Runtime, not OpenFlow)
        for intf in self.intfList():
            if intf.name != "lo":
                disable_offloads(self, intf.name)
        cmd = [sys.executable, "-m", "hysync.softswitch", "--grpc-addr", self.grpc_addr]
        for port in self.port_map():
            cmd += ["-i", port]
        for port, ms in sorted(self.delays.items()):
            cmd += ["--delay", f"{port}:{ms:g}"]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        _wait_for_grpc(self.grpc_addr, self.proc, self.log)

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 (Mininet's signature)
        _terminate(self.proc)
        super().stop(deleteIntfs)


class Bmv2Node(Switch):
    """BMv2 simple_switch_grpc running the p4c-compiled HySync program.

    BMv2's thrift server binds 0.0.0.0:9090, so the switch runs in a network namespace
    of its own (inNamespace=True) and P4Runtime is reached over a management veth with
    link-local addresses (mgmt_ip/30 inside, the next-lower address in the root namespace).

    json_path: the BMv2 JSON that `make p4` writes.
    mgmt_ip: the switch's management address (default: a free link-local /30); gRPC
    listens on mgmt_ip:9559.
    """

    def __init__(self, name: str, json_path: str | Path = REPO / "build/p4/hysync.json",
                 mgmt_ip: str | None = None, log_dir: str | Path = "/tmp",
                 **params) -> None:
        params["inNamespace"] = True  # Mininet passes its own default; BMv2 needs a netns
        super().__init__(name, **params)
        self.json_path = Path(json_path)
        self.mgmt_ip = mgmt_ip or f"{free_management_net()}.2"
        self.grpc_addr = f"{self.mgmt_ip}:9559"
        self.log = Path(log_dir) / f"bmv2-{name}.log"
        self.proc: subprocess.Popen | None = None
        self.mgmt_root = f"{name}-mgmt"

    @staticmethod
    def unavailable() -> str | None:
        if shutil.which("simple_switch_grpc") is None:
            return "simple_switch_grpc is not on PATH: install BMv2 with P4Runtime (PI) support"
        if shutil.which("p4c") is None:
            return "p4c is not on PATH: `make p4` cannot build the BMv2 JSON"
        return None

    def start(self, controllers) -> None:  # noqa: ARG002
        reason = self.unavailable()
        if reason:
            raise SwitchStartError(reason)
        if not self.json_path.exists():
            raise SwitchStartError(f"{self.json_path} is missing: run `make p4` first")
        for intf in self.intfList():
            if intf.name != "lo":
                disable_offloads(self, intf.name)
        inside = f"{self.name}-mgmt0"
        prefix, last = self.mgmt_ip.rsplit(".", 1)
        root_ip = f"{prefix}.{int(last) - 1}"
        subprocess.run(["ip", "link", "add", self.mgmt_root, "type", "veth", "peer", "name",
                        inside], check=True)
        subprocess.run(["ip", "link", "set", inside, "netns", str(self.pid)], check=True)
        subprocess.run(["ip", "addr", "add", f"{root_ip}/30", "dev", self.mgmt_root], check=True)
        subprocess.run(["ip", "link", "set", self.mgmt_root, "up"], check=True)
        self.cmd(f"ip addr add {self.mgmt_ip}/30 dev {inside} && ip link set {inside} up "
                 "&& ip link set lo up")
        ports = [arg for intf in self.intfList() if intf.name != "lo"
                 for arg in ("-i", f"{self.ports[intf]}@{intf.name}")]
        cmd = ["simple_switch_grpc", "--device-id", "1", *ports, "--no-p4", "--",
               "--grpc-server-addr", self.grpc_addr]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = self.popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _wait_for_grpc(self.grpc_addr, self.proc, self.log)

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803
        _terminate(self.proc)
        subprocess.run(["ip", "link", "del", self.mgmt_root], capture_output=True)
        super().stop(deleteIntfs)


SWITCH_CLASSES = {"softswitch": SoftswitchNode, "bmv2": Bmv2Node}

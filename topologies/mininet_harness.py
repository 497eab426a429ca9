"""Mininet as a runner harness: a star of worker hosts behind a softswitch or BMv2.

Cleanup is `Mininet.stop()`, which removes exactly the hosts, links and switch
process this harness created (never `mn -c`, which kills processes machine-wide).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

from hysync import wire
from hysync.controlplane.job import Member
from hysync.controlplane.testbed.addresses import SWITCH_IP, SWITCH_MAC, host_ip, host_mac
from hysync.topologies.runner import SwitchJobs, switch_control
from hysync.topologies.scenario import Scenario
from hysync.topologies.switches import (
    REPO,
    SWITCH_CLASSES,
    Bmv2Node,
    SoftswitchNode,
    disable_offloads,
)
from hysync.topologies.topo import StarTopo

WORKER_UDP_BASE = 47000
AVERAGING_UDP_OFFSET = 100
RENDEZVOUS_PORT = 29500


class HarnessError(RuntimeError):
    """Mininet cannot run here; the message says why and what to install."""


def check_mininet() -> None:
    if os.geteuid() != 0:
        raise HarnessError("Mininet runs need root (network namespaces, veth links): run as "
                           "root, or use `make demo` for the no-root loopback run")
    for tool in ("mnexec", "ethtool", "ip"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            raise HarnessError(f"{tool} is not installed: apt-get install mininet ethtool "
                               "iproute2")


class MininetHarness:
    leaves: tuple[str, ...] = ()

    def __init__(self, scenario: Scenario, switch: str, log_dir: Path,
                 grpc_port: int = 9559) -> None:
        from mininet.link import Link, TCLink
        from mininet.net import Mininet

        check_mininet()
        if switch not in SWITCH_CLASSES:
            raise HarnessError(f"unknown switch {switch!r}: choose one of "
                               f"{', '.join(SWITCH_CLASSES)}")
        if switch == "bmv2" and Bmv2Node.unavailable():
            raise HarnessError(f"--switch bmv2: {Bmv2Node.unavailable()}")
        self.kind = switch
        # BMv2's default (logging) build aggregates ~500 contributions/s and loses what
        # overflows its queues (bench/results/bmv2.json), so fewer slots in flight; but
        # at least one per chunk of the model's step (57), or sync rounds of a slot's
        # later chunks can wait on a worker blocked on another slot (a cycle).
        self.window = 64 if switch == "bmv2" else 256
        log_dir.mkdir(parents=True, exist_ok=True)
        ports = range(1, scenario.workers + 1)
        if switch == "softswitch":
            delays = {p: scenario.delay_ms for p in ports} if scenario.delay_ms else {}
            node = partial(SoftswitchNode, grpc_addr=f"127.0.0.1:{grpc_port}", delays=delays,
                           log_dir=log_dir)
            self.device_config: Path | None = None
        else:
            if scenario.delay_ms:
                print(f"note: link delay {scenario.delay_ms:g} ms is emulated by the softswitch "
                      "only; BMv2 runs without it (this kernel has no netem)")
            node = partial(Bmv2Node, log_dir=log_dir)
            self.device_config = REPO / "build" / "p4" / "hysync.json"
        topo = StarTopo(n_workers=scenario.workers, bandwidth_mbit=scenario.bandwidth_mbit)
        self.net = Mininet(topo=topo, switch=node, controller=None, autoSetMacs=False,
                           link=TCLink if scenario.bandwidth_mbit else Link, build=True)
        try:
            self.net.start()
            for w, host in enumerate(self.hosts):
                ifname = host.defaultIntf().name
                disable_offloads(host, ifname)
                host.cmd("sysctl -q -w net.ipv6.conf.all.disable_ipv6=1")
                host.cmd(f"ip neigh replace {SWITCH_IP} lladdr {SWITCH_MAC} dev {ifname}")
                for peer in range(scenario.workers):
                    if peer != w:
                        host.cmd(f"ip neigh replace {host_ip(peer)} lladdr {host_mac(peer)} "
                                 f"dev {ifname}")
        except BaseException:
            self.net.stop()
            raise
        self.grpc_addr = self.net.switches[0].grpc_addr

    @property
    def hosts(self):
        return [self.net.get(f"h{w + 1}") for w in range(len(self.net.hosts))]

    def members(self, workers: int, *, averaging: bool = False) -> list[Member]:
        # Each host has an address of its own: fixed ports, the averaging job's above.
        base = WORKER_UDP_BASE + (AVERAGING_UDP_OFFSET if averaging else 0)
        return [Member(worker=w, ipv4=host_ip(w), mac=host_mac(w), udp_port=base + w,
                       switch_port=w + 1) for w in range(workers)]

    def bind_argv(self, flag: str, member: Member) -> list[str]:
        return [flag, f"{member.ipv4}:{member.udp_port}"]  # the host's own address and port

    def switch_data_addr(self) -> str:
        return f"{SWITCH_IP}:{wire.HYSYNC_UDP_PORT}"

    def switch_argv(self, worker: int) -> list[str]:
        return ["--switch", self.switch_data_addr()]

    def control(self) -> contextlib.AbstractContextManager[SwitchJobs]:
        return switch_control(self)

    def rendezvous(self) -> str:
        return f"{host_ip(0)}:{RENDEZVOUS_PORT}"

    def start_worker(self, worker: int, argv: list[str]) -> subprocess.Popen:
        host = self.hosts[worker]
        env = dict(os.environ, GLOO_SOCKET_IFNAME=host.defaultIntf().name)
        return host.popen([sys.executable, *argv], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=str(REPO), env=env)

    def close(self) -> None:
        self.net.stop()


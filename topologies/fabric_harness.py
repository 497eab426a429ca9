"""Racks of hosts behind leaves and a spine as a runner harness (a scenario with racks >= 2).

The network is `hysync rack up N --racks R`'s (controlplane/testbed/netns_fabric.py):
a namespace per host, per leaf and for the spine, the data veths host <-> leaf <-> spine,
a front-end bridge for what is not HySync's, and a management veth from this namespace to
each switch. Mininet is not used here: its switch nodes are one level of processes in the
root namespace, and a second level would need a second copy of the layout NetnsFabric
already builds, with every switch's P4Runtime reachable and torn down alike; on
NetnsFabric the run trains on the very cluster the testbed docs describe.

A softswitch runs on its raw data plane in each switch namespace (P4Runtime in the clear
on the management veth, which only this namespace reaches). Worker w is host
w % (workers / racks) of rack w // (workers / racks): it binds its host's data address
(UDP 47000, the averaging job's 47100), sends to its leaf with its id among that leaf's
hosts, and reaches the gloo rendezvous (worker 0's front-end address, TCP 29500) and the
other ranks over the front-end bridge, which is also where the gloo baseline's all-reduce
runs. Both jobs are installed across the spine and the leaves (`fabric_jobs.FabricJobs`).
`close()` ends every process the harness started and removes what NetnsFabric made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from hysync import wire
from hysync.controlplane.cli.rack_fabric import leaf_name, switch_names
from hysync.controlplane.controller import Controller
from hysync.controlplane.job import Member
from hysync.controlplane.p4rt.switch import Switch, wait_for_server
from hysync.controlplane.testbed.fabric import FabricController
from hysync.controlplane.testbed.inventory import Fabric, FabricSwitch, SwitchInfo
from hysync.controlplane.testbed.netns import missing_netns_tools
from hysync.controlplane.testbed.netns_fabric import (
    NetnsFabric,
    front_end_ip,
    grpc_addr,
    host_ip,
    host_mac,
    leaf_ip,
    management_net,
    switch_data,
)
from hysync.topologies.children import Children
from hysync.topologies.fabric_jobs import FabricJobs
from hysync.topologies.mininet_harness import (
    AVERAGING_UDP_OFFSET,
    RENDEZVOUS_PORT,
    WORKER_UDP_BASE,
    HarnessError,
)
from hysync.topologies.runner import P4INFO, REPO
from hysync.topologies.scenario import Scenario

# The training job's slots, as on the Mininet softswitch run: more than the 57 chunks of
# the MLP's step, few enough for three softswitch processes sharing the workers' cores.
WINDOW = 256
SWITCH_START_S = 60.0  # a generous deadline for a softswitch to listen on a busy machine


class FabricHarness:
    def __init__(self, scenario: Scenario, log_dir: Path, *, tag: str | None = None) -> None:
        reason = missing_netns_tools("racks behind leaves and a spine are network namespaces")
        if reason:
            raise HarnessError(f"{reason}; or use a one-switch scenario with `make demo`")
        self.tag = tag or f"hye{os.getpid() % 100000}"  # interface names: at most 15 bytes
        self.window = WINDOW
        self.device_config: Path | None = None
        per = scenario.per_rack
        self._rack_host = [divmod(w, per) for w in range(scenario.workers)]
        self.leaves = tuple(leaf_name(r) for r, _ in self._rack_host)
        self.ids = tuple(h for _, h in self._rack_host)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.children = Children()  # the softswitches and the workers: none outlives it
        self.net = management_net()
        self.fabric = NetnsFabric(scenario.racks, per, tag=self.tag, net=self.net)
        self.names = switch_names(scenario.racks)
        self.grpc_addrs = [grpc_addr(i, self.net) for i in range(len(self.names))]
        self.grpc_addr = self.grpc_addrs[0]  # the spine's
        self._ip = shutil.which("ip") or "/usr/sbin/ip"
        try:
            self._start_switches(log_dir)
        except BaseException:
            self.close()
            raise

    def _start_switches(self, log_dir: Path) -> None:
        started = []
        for name, ns, addr in zip(self.names, self.fabric.switch_namespaces, self.grpc_addrs,
                                  strict=True):
            log = log_dir / f"{name}-softswitch.log"
            with open(log, "w") as sink:
                proc = self.children.start(
                    [self._ip, "netns", "exec", ns, sys.executable, "-m", "hysync.softswitch",
                     "--grpc-addr", addr, *self.fabric.softswitch_ports(ns), "--log-level",
                     "warning"],
                    stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO)
            started.append((proc, addr, log))
        for proc, addr, log in started:
            wait_for_server(addr, SWITCH_START_S, lambda p=proc, lg=log: None
                            if p.poll() is None else f"the softswitch exited; see {lg}")

    def inventory(self) -> Fabric:
        """The switches as the fabric controller knows them (`rack up`'s inventory)."""
        def info(i: int) -> SwitchInfo:
            return SwitchInfo(self.grpc_addrs[i], 1, (0, 1), "softswitch", P4INFO, None,
                              *switch_data(i), wire.HYSYNC_UDP_PORT)

        uplink = self.fabric.uplink_port
        return Fabric(FabricSwitch("spine", "spine", info(0)),
                      tuple(FabricSwitch(leaf_name(r), "leaf", info(r + 1), r, uplink, r + 1)
                            for r in range(self.fabric.racks)))

    def members(self, workers: int, *, averaging: bool = False) -> list[Member]:
        port = WORKER_UDP_BASE + (AVERAGING_UDP_OFFSET if averaging else 0)
        return [Member(worker=h, ipv4=host_ip(r, h), mac=host_mac(r, h), udp_port=port,
                       switch_port=h + 1) for r, h in self._rack_host[:workers]]

    def bind_argv(self, flag: str, member: Member) -> list[str]:
        return [flag, f"{member.ipv4}:{member.udp_port}"]  # the host's own address and port

    def switch_argv(self, worker: int) -> list[str]:
        r, h = self._rack_host[worker]
        return ["--switch", f"{leaf_ip(r)}:{wire.HYSYNC_UDP_PORT}", "--member-id", str(h),
                "--behind-leaf"]

    def rendezvous(self) -> str:
        return f"{front_end_ip(0)}:{RENDEZVOUS_PORT}"

    def start_worker(self, worker: int, argv: list[str]) -> subprocess.Popen:
        r, h = self._rack_host[worker]
        env = dict(os.environ, GLOO_SOCKET_IFNAME=self.fabric.front_end_ifs[r][h])
        return self.children.start(
            [self._ip, "netns", "exec", self.fabric.host_ns[r][h], sys.executable, *argv],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)

    @contextlib.contextmanager
    def control(self) -> Iterator[FabricJobs]:
        """A primary session with every switch, pipeline pushed, under one fabric controller."""
        with contextlib.ExitStack() as stack:
            controllers = {}
            for name, addr in zip(self.names, self.grpc_addrs, strict=True):
                switch = stack.enter_context(Switch(addr, connect_timeout=5.0))
                switch.push_pipeline(P4INFO, None)
                controllers[name] = Controller(switch).attach()
            yield FabricJobs(FabricController(self.inventory(), controllers), self.leaves,
                             self.ids)

    def close(self) -> None:
        self.children.close()
        self.fabric.close()

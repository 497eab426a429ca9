"""BMv2 simple_switch_grpc as a conformance target: the p4c-compiled program, real
P4Runtime, real frames on veth ports.

Layout (all made here, all removed by close()):

    root namespace                     namespace hsc-<pid>
    hsc<pid>h1 ... h4  <-- veth -->    hsc<pid>s1 ... s4   (BMv2 ports 1..4)
    hsc<pid>m  169.254.X.1/30   <-->   hsc<pid>n 169.254.X.2/30   (P4Runtime on :9559)

BMv2 runs in its own namespace because its thrift server binds 0.0.0.0:9090. The
test reaches it only through the management veth's link-local addresses. Offloads
are off on every veth end (a user-space switch never fills in checksums) and IPv6
is off on the test-facing ends so the kernel sends nothing of its own on them.
"""

from __future__ import annotations

import atexit
import os
import select
import socket
import subprocess
import time
from pathlib import Path

from hysync.controlplane.p4rt import entities as ent
from hysync.controlplane.p4rt.switch import Switch, wait_for_server
from hysync.controlplane.testbed.addresses import free_management_net

from .targets import P4INFO, REPO, SoftswitchTarget, Write
from .topology import PORTS

# BMv2 answers a frame in well under a millisecond when idle, but on a busy machine its
# output can lag by seconds. The target waits for as many frames as the reference model
# emits for the same input (its shadow), up to DEADLINE_S, then EXTRA_S longer for frames
# beyond those; a frame that comes even later is caught before the next send.
DEADLINE_S = 20.0
EXTRA_S = 0.05
ETH_P_ALL = 0x0003


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Bmv2Target:
    name = "bmv2"
    _instance: Bmv2Target | None = None
    _made = 0  # switches this process made

    @classmethod
    def shared(cls) -> Bmv2Target:
        """One BMv2 process for the session; every test starts from a fresh pipeline push."""
        if cls._instance is None:
            cls._instance = cls()
            atexit.register(cls._instance.shutdown)
        cls._instance.reset()
        return cls._instance

    def __init__(self) -> None:
        # Several switches of one process (a two-level fabric) are told apart by a letter.
        n, Bmv2Target._made = Bmv2Target._made, Bmv2Target._made + 1
        other = "abcdefghijklmnopqrstuvwxyz"[n - 1] if n else ""
        tag = f"hsc{os.getpid() % 100000}{other}"
        self.netns = f"hsc-{os.getpid()}{other}"
        self.host_ifs = {p: f"{tag}h{p}" for p in PORTS}
        self.json = self._compile()
        # a link-local management /30 no other switch of this machine uses
        self.mgmt_net = free_management_net()
        self.grpc_addr = f"{self.mgmt_net}.2:9559"
        self.proc: subprocess.Popen | None = None
        self.switch: Switch | None = None
        try:
            self._build_network(tag)
            self.sockets = {p: self._raw_socket(ifname) for p, ifname in self.host_ifs.items()}
        except BaseException:
            self.shutdown()
            raise

    def _start_switch(self) -> None:
        log = open(REPO / "build" / "bmv2-conformance.log", "a")  # noqa: SIM115
        tag = self.host_ifs[1][:-2]
        ports = [arg for p in PORTS for arg in ("-i", f"{p}@{tag}s{p}")]
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "simple_switch_grpc", "--device-id", "1",
             *ports, "--no-p4", "--", "--grpc-server-addr", self.grpc_addr],
            stdout=log, stderr=subprocess.STDOUT)
        self.switch = self._connect()

    def _stop_switch(self) -> None:
        if self.switch is not None:
            self.switch.close()
            self.switch = None
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    @staticmethod
    def _compile() -> Path:
        out = REPO / "build" / "p4"
        subprocess.run(["make", "-s", "-C", str(REPO), "p4"], check=True, capture_output=True)
        return out / "hysync.json"

    def _build_network(self, tag: str) -> None:
        _sh("ip", "netns", "add", self.netns)
        inns = ["ip", "netns", "exec", self.netns]
        # No IPv6 inside (its interfaces would send router solicitations the switch floods).
        _sh(*inns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
        _sh(*inns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1")
        pairs = [(f"{tag}h{p}", f"{tag}s{p}") for p in PORTS] + [(f"{tag}m", f"{tag}n")]
        for outside, inside in pairs:
            _sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            _sh("ip", "link", "set", inside, "netns", self.netns)
            if outside != f"{tag}m":  # before link-up, or the kernel speaks IPv6 on it
                _sh("sysctl", "-q", "-w", f"net.ipv6.conf.{outside}.disable_ipv6=1")
            for where in ([], inns):
                ifname = outside if not where else inside
                _sh(*where, "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off",
                    "rx", "off")
                _sh(*where, "ip", "link", "set", ifname, "up")
        _sh("ip", "addr", "add", f"{self.mgmt_net}.1/30", "dev", f"{tag}m")
        _sh("ip", "netns", "exec", self.netns, "ip", "addr", "add", f"{self.mgmt_net}.2/30", "dev",
            f"{tag}n")
        _sh("ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up")

    def _connect(self) -> Switch:
        proc = self.proc
        wait_for_server(self.grpc_addr, failed=lambda: None if proc is None or proc.poll() is None
                        else "simple_switch_grpc exited; see build/bmv2-conformance.log")
        return Switch(self.grpc_addr, election_id=(0, 1), connect_timeout=5.0, timeout=10.0)

    @staticmethod
    def _raw_socket(ifname: str) -> socket.socket:
        # Protocol 0 until the bind: a socket opened for ETH_P_ALL takes every interface's
        # frames (the loopback's HySync traffic of other processes too) until it is bound.
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        sock.bind((ifname, ETH_P_ALL))
        sock.setblocking(False)
        return sock

    # ------------------------------------------------------------ Target
    def reset(self) -> None:
        # A fresh process per test: BMv2 keeps its packet replication engine across
        # pipeline pushes, so only a restart gives every test the same empty switch.
        self._stop_switch()
        self._start_switch()
        assert self.switch is not None
        self.switch.push_pipeline(P4INFO, self.json)
        self.shadow = SoftswitchTarget()  # holds the flood group already
        self.write_group("INSERT", 1024, [(p, 0) for p in PORTS], shadow=False)
        self._drain()

    def restart(self) -> None:
        self.reset()  # a new simple_switch_grpc process: its registers start at zero

    def write(self, update: str, w: Write) -> None:
        assert self.switch is not None
        info = self.switch.schema.table(w.table)
        match = {f.name: v for f, v in zip(info.match_fields, w.match, strict=True)}
        params = dict(zip((p.name for p in self.switch.schema.action(w.action).params), w.params,
                          strict=True))
        entry = ent.TableEntry(w.table, match, w.action, params, w.priority)
        self.switch.write([{"INSERT": ent.insert, "MODIFY": ent.modify,
                            "DELETE": ent.delete}[update](entry)])
        self.shadow.write(update, w)

    def write_group(self, update: str, group: int, replicas: list[tuple[int, int]],
                    shadow: bool = True) -> None:
        assert self.switch is not None
        g = ent.MulticastGroup(group, tuple(ent.Replica(p, r) for p, r in replicas))
        self.switch.write([{"INSERT": ent.insert, "MODIFY": ent.modify,
                            "DELETE": ent.delete}[update](g)])
        if shadow:
            self.shadow.write_group(update, group, replicas)

    def send(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        strays = self._drain()
        assert not strays, (f"BMv2 emitted {len(strays)} frame(s) more than {DEADLINE_S:.0f} s "
                            f"after the packet before, or beyond what it should: {strays[:2]}")
        expected = len(self.shadow.send(port, frame))
        self.sockets[port].send(frame)
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + DEADLINE_S
        while True:
            now = time.monotonic()
            if len(out) >= expected:  # all that should come: a short look for any beyond
                deadline = min(deadline, now + EXTRA_S)
            if now >= deadline:
                return sorted(out)
            out += self._receive(deadline - now)

    def _receive(self, timeout: float) -> list[tuple[int, bytes]]:
        """The frames the switch sent out of its ports within `timeout` (ours excluded)."""
        by_fd = {s.fileno(): p for p, s in self.sockets.items()}
        ready, _, _ = select.select(list(self.sockets.values()), [], [], max(timeout, 0.0))
        out = []
        for sock in ready:
            data, addr = sock.recvfrom(65535)
            if addr[2] != socket.PACKET_OUTGOING:  # not our own transmission
                out.append((by_fd[sock.fileno()], data))
        return out

    def _drain(self) -> list[tuple[int, bytes]]:
        """Frames already waiting: none should be, so each is returned to be reported."""
        out = []
        while received := self._receive(0.0) if hasattr(self, "sockets") else []:
            out += received
        return out

    def counter(self, name: str, index: int) -> int:
        """The cell's packet count. A packet that makes no frame (a drop) gives nothing to
        wait for in send(), and a busy BMv2 may count it later: wait up to DEADLINE_S for
        the count the reference model reached (counts only grow)."""
        assert self.switch is not None
        expected = self.shadow.counter(name, index)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            got = self.switch.read_counter_cells([(name, index)])[0].packets
            if got >= expected or time.monotonic() >= deadline:
                return got
            time.sleep(0.02)

    def close(self) -> None:
        """Per test: nothing (the next test pushes the pipeline afresh)."""

    def shutdown(self) -> None:
        self._stop_switch()
        for sock in getattr(self, "sockets", {}).values():
            sock.close()
        for ifname in self.host_ifs.values():
            subprocess.run(["ip", "link", "del", ifname], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{self.host_ifs[1][:-2]}m"], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)

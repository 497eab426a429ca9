"""The raw-interface data plane on real veth pairs in a network namespace made for the test.

Topology (all inside one namespace, deleted afterwards):

    h1-eth0 <-veth-> s1-eth1 [port 1]  softswitch  [port 2] s1-eth2 <-veth-> h2-eth0

The switch binds s1-eth1/s1-eth2 as `-i 1@s1-eth1 -i 2@s1-eth2`; the "hosts" are
AF_PACKET sockets on h1-eth0/h2-eth0 that send and receive whole Ethernet frames.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from hysync import p4names, wire
from hysync.controlplane.testbed.netns import missing_netns_tools
from hysync.softswitch.native import NativePipeline, NativeRawDataPlane
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.raw_dataplane import ETH_P_ALL, RawDataPlane, parse_port_map
from hysync.softswitch.tables import Entry, Replica

CLONE_NEWNET = 0x40000000
SWITCH_MAC = bytes.fromhex("020000000100")
SWITCH_IP = wire.ip_to_int("10.0.0.254")
HOSTS = {  # worker id -> (switch port, host interface, mac, ip, udp port)
    0: (1, "h1-eth0", bytes.fromhex("020000000001"), wire.ip_to_int("10.0.0.1"), 40001),
    1: (2, "h2-eth0", bytes.fromhex("020000000002"), wire.ip_to_int("10.0.0.2"), 40002),
}
JOB = 1


# ------------------------------------------------------------------ unprivileged
def test_port_map_parses_bmv2_style_specs():
    assert parse_port_map(["1@s1-eth1", "2@s1-eth2"]) == {1: "s1-eth1", 2: "s1-eth2"}


@pytest.mark.parametrize("specs, says", [
    (["1-s1-eth1"], "PORT@IFACE"), (["a@s1-eth1"], "PORT@IFACE"), (["1@"], "PORT@IFACE"),
    (["600@s1-eth1"], "9 bits"), (["1@s1-eth1", "1@s1-eth2"], "twice"),
    (["1@s1-eth1", "2@s1-eth1"], "two ports"), (["1@a-very-long-interface-name"], "interface"),
])
def test_port_map_errors_say_what_is_wrong(specs, says):
    with pytest.raises(ValueError, match=says):
        parse_port_map(specs)


# ---------------------------------------------------------------- the namespace

def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextmanager
def inside(netns: str) -> Iterator[None]:
    """Run this thread in `netns` (sockets opened here stay in it after we leave)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns} failed")
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "cannot return to the original namespace")
    finally:
        os.close(own)
        os.close(target)


@pytest.fixture
def netns() -> Iterator[str]:
    reason = missing_netns_tools("creates a network namespace with veth pairs and raw sockets")
    if reason:
        pytest.skip(reason)
    name = f"hsraw{os.getpid()}"
    try:
        _run("ip", "netns", "add", name)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"cannot create a network namespace: {err.stderr.strip()}")
    try:
        for sw, host in (("s1-eth1", "h1-eth0"), ("s1-eth2", "h2-eth0")):
            _run("ip", "-n", name, "link", "add", "name", sw, "type", "veth", "peer", "name",
                 host)
        # No IPv6 chatter (router solicitations, MLD) on the links: only the test's frames.
        _run("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        _run("ip", "netns", "exec", name, "sysctl", "-qw",
             "net.ipv6.conf.default.disable_ipv6=1")
        for iface in ("s1-eth1", "h1-eth0", "s1-eth2", "h2-eth0"):
            _run("ip", "netns", "exec", name, "sysctl", "-qw",
                 f"net.ipv6.conf.{iface}.disable_ipv6=1")
            # As Mininet's BMv2 setups do: the kernel must hand over frames as sent.
            _run("ip", "netns", "exec", name, "ethtool", "-K", iface, "tx", "off", "tso", "off",
                 "gso", "off", "rx", "off")
            _run("ip", "-n", name, "link", "set", iface, "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


class Host:
    """A raw socket on a host's veth end: whole frames in and out."""

    def __init__(self, iface: str) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((iface, ETH_P_ALL))

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def receive(self, accept: Callable[[bytes], bool], timeout: float = 3) -> bytes | None:
        """The first incoming frame `accept` takes, or None after `timeout`."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                frame, addr = self.sock.recvfrom(65536)
            except TimeoutError:
                return None
            if addr[2] != socket.PACKET_OUTGOING and accept(frame):
                return frame
        return None

    def close(self) -> None:
        self.sock.close()


def _configure(pipeline: Pipeline) -> None:
    """JOB with workers 0 and 1 behind ports 1 and 2, plus L2 flooding on both ports."""
    replicas = []
    for w, (port, _, mac, ip, udp) in HOSTS.items():
        rid = wire.member_rid(JOB, w)
        pipeline.write_entry("INSERT", Entry(p4names.ADMISSION_MEMBERS, (JOB, w, ip, udp),
                                             p4names.ADMISSION_ADMIT))
        pipeline.write_entry("INSERT", Entry(p4names.REPLICATION_REWRITE, (rid,),
                                             p4names.REPLICATION_REWRITE_DST,
                                             (int.from_bytes(mac, "big"), ip, udp)))
        replicas.append(Replica(port, rid))
    pipeline.write_entry("INSERT", Entry(p4names.ADMISSION_JOBS, (JOB,), p4names.ADMISSION_SET_JOB,
                                         (0, 16, 2, JOB, 1)))
    pipeline.write_group("INSERT", JOB, replicas)
    pipeline.write_group("INSERT", wire.FLOOD_MCAST_GROUP,
                         [Replica(port, 0) for port, *_ in HOSTS.values()])


# The reference model and the native engine behind the same raw data plane interface.
ENGINES = {"python": (Pipeline, RawDataPlane), "native": (NativePipeline, NativeRawDataPlane)}


@pytest.fixture(params=sorted(ENGINES))
def switch(request, netns: str) -> Iterator[tuple[Pipeline, RawDataPlane, dict[int, Host]]]:
    pipeline_class, plane_class = ENGINES[request.param]
    pipeline = pipeline_class()
    _configure(pipeline)
    with inside(netns):
        plane = plane_class(pipeline, parse_port_map(["1@s1-eth1", "2@s1-eth2"]))
        hosts = {w: Host(iface) for w, (_, iface, *_) in HOSTS.items()}
    plane.start()
    try:
        yield pipeline, plane, hosts
    finally:
        plane.stop()
        for host in hosts.values():
            host.close()


def _contribution_frame(w: int, lanes: np.ndarray) -> bytes:
    _, _, mac, ip, udp = HOSTS[w]
    header = wire.Header(op=wire.Op.CONTRIB, job_id=JOB, worker_id=w, slot=2, round=0, chunk=5)
    addr = wire.FrameAddress(src_mac=mac, dst_mac=SWITCH_MAC, src_ip=ip, dst_ip=SWITCH_IP,
                             src_port=udp)
    return wire.build_frame(addr, wire.Packet(header, lanes).encode())


def _is_hysync(frame: bytes) -> bool:
    return len(frame) > wire.HYSYNC_OFFSET and frame[12:14] == b"\x08\x00" \
        and int.from_bytes(frame[36:38], "big") in (wire.HYSYNC_UDP_PORT, 40001, 40002)


# ------------------------------------------------------------------- the tests
@pytest.mark.root
def test_results_reach_every_member_over_veths(switch):
    pipeline, plane, hosts = switch
    lanes = {w: np.full(wire.LANES, 10 * (w + 1), dtype=np.int32) for w in HOSTS}
    for w, host in hosts.items():
        host.send(_contribution_frame(w, lanes[w]))
    for w, host in hosts.items():
        frame = host.receive(_is_hysync)
        assert frame is not None, f"worker {w} got no result"
        addr, payload = wire.parse_frame(frame)
        _, _, mac, ip, udp = HOSTS[w]
        assert (addr.dst_mac, addr.dst_ip, addr.dst_port) == (mac, ip, udp)
        assert (addr.src_ip, addr.src_port) == (SWITCH_IP, wire.HYSYNC_UDP_PORT)
        result = wire.Packet.decode(payload)
        assert (result.header.op, result.header.count, result.header.bitmap) == \
            (wire.Op.RESULT, 2, 0b11)
        np.testing.assert_array_equal(result.lanes, lanes[0] + lanes[1])
    time.sleep(0.2)
    # The switch's own transmissions are not processed again (PACKET_OUTGOING copies).
    assert plane.packets_in == 2
    assert plane.packets_out == 2
    assert sum(pipeline.counters[p4names.STATS_DROPS].packets) == 0


@pytest.mark.root
def test_late_contribution_gets_a_unicast_resend_out_of_its_ingress_port(switch):
    pipeline, _, hosts = switch
    lanes = np.ones(wire.LANES, dtype=np.int32)
    for w, host in hosts.items():
        host.send(_contribution_frame(w, lanes))
    for host in hosts.values():
        assert host.receive(_is_hysync) is not None
    hosts[1].send(_contribution_frame(1, lanes))  # round 0 again: it closed already
    frame = hosts[1].receive(_is_hysync)
    assert frame is not None
    result = wire.Packet.decode(wire.parse_frame(frame)[1])
    assert result.header.flags == wire.Flag.RESEND
    assert hosts[0].receive(_is_hysync, timeout=0.5) is None


@pytest.mark.root
def test_l2_unicast_and_flooding_between_hosts(switch):
    pipeline, _, hosts = switch
    mac1, mac2 = HOSTS[0][2], HOSTS[1][2]
    pipeline.write_entry("INSERT", Entry(p4names.FORWARDING_L2, (int.from_bytes(mac2, "big"),),
                                         p4names.FORWARDING_SET_EGRESS_PORT, (2,)))
    unicast = mac2 + mac1 + b"\x88\xb5" + b"unicast to h2".ljust(46, b".")
    hosts[0].send(unicast)
    assert hosts[1].receive(lambda f: f == unicast) == unicast

    broadcast = b"\xff" * 6 + mac1 + b"\x88\xb5" + b"flooded".ljust(46, b".")
    hosts[0].send(broadcast)
    assert hosts[1].receive(lambda f: f == broadcast) == broadcast
    # never back out of the port it came in on
    assert hosts[0].receive(lambda f: f == broadcast, timeout=0.5) is None


@pytest.mark.root
def test_frames_others_send_out_of_a_switch_port_are_not_switched(switch, netns):
    """E.g. the kernel's IPv6 ND out of s1-eth1: a PACKET_OUTGOING copy, not an arrival."""
    _, plane, hosts = switch
    with inside(netns):
        other = Host("s1-eth1")
    try:
        frame = b"\xff" * 6 + SWITCH_MAC + b"\x88\xb5" + b"from the switch's own kernel".ljust(46)
        other.send(frame)
        assert hosts[0].receive(lambda f: f == frame) == frame  # it went out on the wire
        assert hosts[1].receive(lambda f: f == frame, timeout=0.5) is None  # and was not flooded
        assert plane.packets_in == 0
    finally:
        other.close()


@pytest.mark.root
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_missing_interface_is_named(netns, engine):
    pipeline_class, plane_class = ENGINES[engine]
    with inside(netns), pytest.raises(OSError, match="hsnosuch0 does not exist"):
        plane_class(pipeline_class(), {1: "s1-eth1", 2: "hsnosuch0"})

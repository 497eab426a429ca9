"""The port map's probe through the data plane: ARP and ICMP echo from one host of the
inventory to every other host, through the switch, answered by their kernels.

The P4 program has no CPU port for a P4Runtime packet-out, so the probe starts on a host:
`hysync deploy --check` run there (`--from HOST`, or the one host whose data interface and
address this machine has). From that host's data interface a raw socket sends, to every
other host, an ARP request for its IPv4 (broadcast: the switch floods it) and an ICMP
echo to its inventory MAC (unicast: the switch's l2 entry sends it to the inventory's
port). Raw frames rather than `ping`: the kernel's neighbour cache would hide the ARP
path, and the echo must go to the inventory's MAC, not to whatever ARP resolved.

What the two answers tell apart (`verdict`): a host that answers ARP but not the echo
is reachable by flooding but not on the port its l2 entry sends to (a wrong
switch_port in the inventory, or swapped cables); ARP from another MAC means a wrong
hosts.mac; neither answer means the host is down or its cable is on a port the flood
group lacks - or, when no host answers at all, that the source itself is cut off.
"""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hysync import wire
from hysync.controlplane.errors import ControlPlaneError
from hysync.controlplane.testbed.inventory import Host, Inventory

ETH_P_ALL = 0x0003
ETHERTYPE_ARP = 0x0806
ARP_STRUCT = struct.Struct("!HHBBH6s4s6s4s")  # htype ptype hlen plen op sha spa tha tpa
ICMP_STRUCT = struct.Struct("!BBHHH")  # type code checksum id seq
ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST = 0, 8
IPPROTO_ICMP = 1
MIN_FRAME = 60  # Ethernet's minimum without the FCS; a raw socket does not pad
RESEND_S = 0.25
ECHO_PAYLOAD = b"hysync-probe"  # even length: the RFC 1071 sum takes 16-bit words


class ProbeError(ControlPlaneError):
    """The probe cannot start from this machine (bad --from, no raw socket)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What one host answered: the MAC its ARP reply came from, the echo's round trip."""

    arp_mac: str | None = None
    echo_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Probe:
    """A probe's outcome: its source host, its interface's MAC, every other host's answer."""

    source: Host
    interface_mac: str
    answers: dict[str, Answer]

    def answered(self) -> int:
        return sum(a.echo_ms is not None or a.arp_mac is not None for a in self.answers.values())


def source_host(inv: Inventory, name: str | None) -> tuple[Host | None, str]:
    """(the host this machine is, why none) for the probe: `name` (--from), else the one
    host whose data interface and address are here. A bad `name` raises ProbeError."""
    if name is not None:
        host = inv.host(name)
        why = _not_here(host)
        if why:
            raise ProbeError(f"--from {name}: {why}; run the check on {name} itself")
        return host, ""
    here = [h for h in inv.hosts if not _not_here(h)]
    if len(here) == 1:
        return here[0], ""
    if here:
        return None, (f"hosts {', '.join(h.name for h in here)} all have their data interface "
                      "and address on this machine")
    return None, "this machine has no host's data interface and address"


def _not_here(host: Host) -> str:
    """Why `host` cannot be the probe's source on this machine ('' if it can)."""
    if ipaddress.IPv4Address(host.ipv4).is_loopback:
        return f"its address {host.ipv4} is a loopback address, which never reaches the switch"
    try:
        socket.if_nametoindex(host.interface)
    except OSError:
        return f"this machine has no interface {host.interface!r} (hosts.interface)"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((host.ipv4, 0))
        except OSError:
            return f"this machine has no address {host.ipv4} (hosts.ipv4)"
    return ""


def probe(source: Host, targets: Sequence[Host], timeout: float) -> Probe:
    """ARP and echo every target from `source`'s data interface, resending what is
    unanswered every RESEND_S, until all have answered both or `timeout` passes."""
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except PermissionError:
        raise ProbeError(f"a raw socket on {source.interface} needs root (CAP_NET_RAW): run "
                         "the check with sudo") from None
    try:
        with sock:
            return _exchange(sock, source, targets, timeout)
    except OSError as err:
        raise ProbeError(f"{source.interface}: {err.strerror or err}; is it up? (`ip link set "
                         f"{source.interface} up`)") from None


def _exchange(sock: socket.socket, source: Host, targets: Sequence[Host],
              timeout: float) -> Probe:
    """The probe's frames out of `sock` and the answers back, until `timeout`."""
    sock.bind((source.interface, ETH_P_ALL))
    own_mac = sock.getsockname()[4]
    ident = os.getpid() & 0xFFFF
    by_ip = {wire.ip_to_int(t.ipv4): i for i, t in enumerate(targets)}
    arp: dict[int, str] = {}
    echo: dict[int, float] = {}
    sent: dict[int, float] = {}  # echo sequence number -> when
    start = time.monotonic()
    deadline, resend = start + timeout, start
    while (len(arp) < len(targets) or len(echo) < len(targets)) and (
            now := time.monotonic()) < deadline:
        if now >= resend:
            for i, t in enumerate(targets):
                if i not in arp:
                    sock.send(_arp_request(own_mac, source.ipv4, t.ipv4))
                if i not in echo:
                    seq = len(sent) & 0xFFFF  # ICMP sequence numbers are 16 bits
                    sent[seq] = time.monotonic()
                    sock.send(_echo_request(own_mac, source.ipv4, t, ident, seq))
            resend = now + RESEND_S
        if not select.select([sock], [], [], max(0.0, min(resend, deadline) - now))[0]:
            continue
        frame, addr = sock.recvfrom(65536)
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        if (got := _arp_reply(frame, source.ipv4)) and got[0] in by_ip:
            arp.setdefault(by_ip[got[0]], got[1])
        elif (reply := _echo_reply(frame, ident)) and reply[0] in by_ip and reply[1] in sent:
            echo.setdefault(by_ip[reply[0]], (time.monotonic() - sent[reply[1]]) * 1e3)
    return Probe(source, wire.bytes_to_mac(own_mac),
                 {t.name: Answer(arp.get(i), echo.get(i)) for i, t in enumerate(targets)})


def _arp_request(own_mac: bytes, own_ip: str, target_ip: str) -> bytes:
    arp = ARP_STRUCT.pack(1, wire.ETHERTYPE_IPV4, 6, 4, 1, own_mac, socket.inet_aton(own_ip),
                          bytes(6), socket.inet_aton(target_ip))
    return _pad(wire.ETH_STRUCT.pack(b"\xff" * 6, own_mac, ETHERTYPE_ARP) + arp)


def _echo_request(own_mac: bytes, own_ip: str, target: Host, ident: int, seq: int) -> bytes:
    icmp = bytearray(ICMP_STRUCT.pack(ICMP_ECHO_REQUEST, 0, 0, ident, seq) + ECHO_PAYLOAD)
    icmp[2:4] = wire.ipv4_checksum(icmp).to_bytes(2, "big")
    ip = bytearray(wire.IPV4_STRUCT.pack(0x45, 0, wire.IPV4_BYTES + len(icmp), seq, 0, 64,
                                         IPPROTO_ICMP, 0, wire.ip_to_int(own_ip),
                                         wire.ip_to_int(target.ipv4)))
    ip[10:12] = wire.ipv4_checksum(ip).to_bytes(2, "big")
    eth = wire.ETH_STRUCT.pack(wire.mac_to_bytes(target.mac), own_mac, wire.ETHERTYPE_IPV4)
    return _pad(eth + bytes(ip) + bytes(icmp))


def _pad(frame: bytes) -> bytes:
    return frame + bytes(max(0, MIN_FRAME - len(frame)))


def _arp_reply(frame: bytes, own_ip: str) -> tuple[int, str] | None:
    """(sender IPv4, sender MAC) of an ARP reply to `own_ip`, else None."""
    if len(frame) < wire.ETH_BYTES + ARP_STRUCT.size:
        return None
    if wire.ETH_STRUCT.unpack_from(frame)[2] != ETHERTYPE_ARP:
        return None
    *_, op, sha, spa, _, tpa = ARP_STRUCT.unpack_from(frame, wire.ETH_BYTES)
    if op != 2 or tpa != socket.inet_aton(own_ip):
        return None
    return int.from_bytes(spa, "big"), wire.bytes_to_mac(sha)


def _echo_reply(frame: bytes, ident: int) -> tuple[int, int] | None:
    """(source IPv4, sequence) of an ICMP echo reply to this probe, else None."""
    icmp_at = wire.ETH_BYTES + wire.IPV4_BYTES
    if len(frame) < icmp_at + ICMP_STRUCT.size:
        return None
    if wire.ETH_STRUCT.unpack_from(frame)[2] != wire.ETHERTYPE_IPV4:
        return None
    ver_ihl, *_, proto, _, src, _ = wire.IPV4_STRUCT.unpack_from(frame, wire.ETH_BYTES)
    if ver_ihl != 0x45 or proto != IPPROTO_ICMP:
        return None
    kind, _, _, got_ident, seq = ICMP_STRUCT.unpack_from(frame, icmp_at)
    return (src, seq) if kind == ICMP_ECHO_REPLY and got_ident == ident else None


def verdict(host: Host, answer: Answer, result: Probe, *, flooded: bool) -> tuple[bool, str]:
    """(ok, what the probe says about `host`); `flooded`: the switch has no l2 entry for
    it, so an answered echo reached it by flooding."""
    src = result.source.name
    if answer.arp_mac is not None and answer.arp_mac != host.mac:
        return False, (f"{host.ipv4} answers ARP from {answer.arp_mac}, not the inventory's "
                       f"{host.mac}: fix hosts.mac of {host.name}, then `hysync deploy`")
    if answer.echo_ms is not None and answer.arp_mac is not None:
        how = " (by flooding)" if flooded else ""
        return True, f"answered ARP and a ping from {src}{how} in {answer.echo_ms:.1f} ms"
    if answer.echo_ms is not None:
        return False, (f"answered a ping from {src} but not ARP for {host.ipv4}, which the "
                       f"switch floods: is port {host.switch_port} in the flood group? run "
                       "`hysync deploy`")
    if answer.arp_mac is not None:
        return False, (f"answered ARP from {src} (flooded) but not a ping sent to {host.mac}, "
                       f"which the switch sends to port {host.switch_port}: {host.name} is not "
                       "on that port - fix hosts.switch_port (cables swapped?), then `hysync "
                       "deploy`; or it drops ICMP echo")
    if not result.answered():
        return False, f"no answer: no host answered {src}, see the probe line"
    return False, (f"no answer to ARP or a ping from {src}: {host.name} is down, or its cable "
                   f"is not on port {host.switch_port} (hosts.switch_port)")


def source_verdict(result: Probe) -> tuple[bool, str]:
    """(ok, what the probe says about its own source host)."""
    s = result.source
    where = f"from {s.name} ({s.interface}, {s.ipv4})"
    if result.interface_mac != s.mac:
        return False, (f"{where}: the interface's MAC is {result.interface_mac}, the "
                       f"inventory's {s.mac}: fix hosts.mac of {s.name}, then `hysync deploy`")
    n = len(result.answers)
    if n and not result.answered():
        return False, (f"{where}: no host answered; either all are down or {s.name} is cut off: "
                       f"its interface is down or its cable is not on port {s.switch_port} "
                       "(hosts.switch_port)")
    return True, f"{where}: {result.answered()} of {n} hosts answered"

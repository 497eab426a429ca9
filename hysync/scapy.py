"""A scapy layer for the HySync header, bound to UDP port 48620 (docs/protocol.md).

Craft, send and dissect HySync packets with scapy:

    from scapy.all import IP, UDP, Ether, sendp
    from hysync.scapy import HySync
    frame = (Ether(dst=switch_mac) / IP(dst="10.0.0.254") / UDP(sport=40001, chksum=0)
             / HySync(op="CONTRIB", job_id=1, worker_id=0, slot=3, round=7, lanes=[1] * 64))
    sendp(frame, iface="h1-eth0")
    Ether(raw_bytes)[HySync].round        # UDP to or from port 48620 dissects as HySync

The fields are made from `hysync.wire.HEADER_FIELDS` (the one owner of the layout), so
this layer cannot drift from the wire format. CONTRIB and RESULT carry `LANES` signed
32-bit lanes (`lanes`, zeros by default); RESYNC and ACK are header only. A lanes list
of another length crafts a malformed packet on purpose. `hysync sniff IFACE` prints the
headers this layer decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from scapy.fields import (
    ByteEnumField,
    ByteField,
    ConditionalField,
    Field,
    FieldListField,
    FlagsField,
    IntField,
    ShortField,
    SignedIntField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_bottom_up, bind_layers

from hysync import wire
from hysync.errors import HySyncError
from hysync.wire import DropReason, Flag, Mode, Op, ResyncReason

_ENUMS: dict[str, dict[int, str]] = {
    "op": {op.value: op.name for op in Op},
    "mode": {mode.value: mode.name for mode in Mode},
    "reason": {r.value: r.name for r in ResyncReason},
}
_FLAG_NAMES = [Flag(1 << bit).name or f"bit{bit}" for bit in range(8)]  # bit 0 first
_HAS_LANES = (Op.CONTRIB, Op.RESULT)


def _field(name: str, width: int) -> Field[Any, Any]:
    default = wire.VERSION if name == "version" else 0
    if name in _ENUMS:
        return ByteEnumField(name, default, _ENUMS[name])
    if name == "flags":
        return FlagsField(name, default, 8, _FLAG_NAMES)
    return {8: ByteField, 16: ShortField, 32: IntField}[width](name, default)


class HySync(Packet):  # type: ignore[misc]  # scapy is untyped
    """The HySync header and, for CONTRIB and RESULT, its lanes."""

    name = "HySync"
    fields_desc = [_field(name, width) for name, width in wire.HEADER_FIELDS] + [
        ConditionalField(
            FieldListField("lanes", [0] * wire.LANES, SignedIntField("lane", 0),
                           count_from=lambda pkt: wire.LANES),
            lambda pkt: pkt.op in _HAS_LANES),
    ]

    def mysummary(self) -> str:
        return self.sprintf("HySync %op% job %job_id% worker %worker_id% slot %slot% "
                            "round %round%")


def describe(pkt: Packet) -> str:
    """One tcpdump-style line for a frame with a HySync layer: addresses, then the header."""
    h = pkt[HySync]
    udp = h.underlayer
    where = ""
    if isinstance(udp, UDP) and udp.underlayer is not None and hasattr(udp.underlayer, "src"):
        where = f"{udp.underlayer.src}:{udp.sport} > {udp.underlayer.dst}:{udp.dport} "
    op = _ENUMS["op"].get(h.op, str(h.op))
    line = (f"{where}{op} job {h.job_id} worker {h.worker_id} slot {h.slot} round {h.round} "
            f"chunk {h.chunk}")
    if h.flags:
        line += f" flags {h.flags}"
    if h.op == Op.RESULT:
        line += (f" mode {_ENUMS['mode'].get(h.mode, h.mode)} quorum {h.quorum} "
                 f"count {h.count} bitmap 0x{h.bitmap:08x} tag {h.reason}")
    elif h.op == Op.ACK:
        line += f" tag {h.reason}"
    elif h.op == Op.RESYNC:
        line += (f" reason {_ENUMS['reason'].get(h.reason, h.reason)} count {h.count} "
                 f"bitmap 0x{h.bitmap:08x}")
    if h.version != wire.VERSION:
        line += f" [version {h.version}: {DropReason.BAD_VERSION.name}]"
    return line


def record(pkt: Packet) -> dict[str, object]:
    """What `describe` says, as data (`hysync sniff --json`): addresses, then every header
    field by its wire name, enums by name (the lanes left out, as in the text line)."""
    h = pkt[HySync]
    data: dict[str, object] = {}
    udp = h.underlayer
    if isinstance(udp, UDP) and udp.underlayer is not None and hasattr(udp.underlayer, "src"):
        ip = udp.underlayer
        data.update(src=f"{ip.src}:{udp.sport}", dst=f"{ip.dst}:{udp.dport}")
    for name, _ in wire.HEADER_FIELDS:
        value = int(getattr(h, name))  # flags come as scapy's FlagValue
        data[name] = _ENUMS[name].get(value, value) if name in _ENUMS else value
    return data


def _on_the_wire(pkt: Packet) -> bool:
    """A HySync packet itself, not one quoted in an ICMP error (UDPerror is a UDP too)."""
    return pkt.haslayer(HySync) and type(pkt[HySync].underlayer) is UDP


def _is_loopback(iface: str) -> bool:
    try:
        flags = int(Path(f"/sys/class/net/{iface}/flags").read_text(), 16)
    except (OSError, ValueError):
        return False  # unknown interface: opening the socket says so
    return bool(flags & 0x8)  # IFF_LOOPBACK


class SniffError(HySyncError):
    """A capture that cannot start: no such interface, or not allowed to capture."""


def sniff(iface: str, emit: Callable[[Any], None], *, count: int = 0,
          timeout: float | None = None, render: Callable[[Packet], Any] = describe) -> int:
    """Emit `render(packet)` (a `describe` line, or a `record`) per HySync packet seen on
    `iface`, until `count` packets (0: no limit) or `timeout` seconds. Returns how many
    were seen. Needs CAP_NET_RAW."""
    from scapy.sendrecv import sniff as capture  # here: it starts scapy's socket machinery

    seen = 0
    # A loopback interface shows every packet twice, as sent and at once as received:
    # like tcpdump, show it once.
    loopback = _is_loopback(iface)
    previous: bytes | None = None

    def show(pkt: Packet) -> None:
        nonlocal seen, previous
        frame = bytes(pkt)
        if loopback and frame == previous:
            previous = None
            return
        previous = frame
        seen += 1
        emit(render(pkt))

    try:
        capture(iface=iface, count=count, timeout=timeout, store=False, prn=show,
                lfilter=_on_the_wire)
    except PermissionError as err:
        raise SniffError(f"capturing on {iface} needs root (CAP_NET_RAW): run it as root, "
                         f"e.g. `sudo hysync sniff {iface}`") from err
    except (ValueError, OSError) as err:
        raise SniffError(f"cannot capture on {iface!r} ({err}): name an interface that "
                         "`ip link` lists") from err
    return seen


# Built packets go to the switch (dport); both directions dissect (results come from it).
bind_layers(UDP, HySync, dport=wire.HYSYNC_UDP_PORT)
bind_bottom_up(UDP, HySync, sport=wire.HYSYNC_UDP_PORT)

"""Entries of the L2 forwarding control (p4src: HySyncIngress.forwarding) and the
flood group: non-HySync frames go to the port of their destination MAC, or are
flooded to every port in multicast group FLOOD_MCAST_GROUP (replicas with rid 0).
"""

from __future__ import annotations

from collections.abc import Iterable

from hysync import p4names, wire
from hysync.controlplane.p4rt.entities import MulticastGroup, Replica, TableEntry

FLOOD_GROUP = wire.FLOOD_MCAST_GROUP


def mac_int(mac: str) -> int:
    return int.from_bytes(wire.mac_to_bytes(mac), "big")


def mac_str(value: int) -> str:
    return wire.bytes_to_mac(value.to_bytes(6, "big"))


def l2_entry(mac: str, port: int) -> TableEntry:
    return TableEntry(p4names.FORWARDING_L2, {"dst_addr": mac_int(mac)},
                      p4names.FORWARDING_SET_EGRESS_PORT, {"port": port})


def l2_of(entry: TableEntry) -> tuple[str, int]:
    """(MAC, port) of an l2 entry."""
    dst = entry.match["dst_addr"]
    assert isinstance(dst, int)
    return mac_str(dst), entry.params.get("port", -1)


def flood_group(ports: Iterable[int]) -> MulticastGroup:
    return MulticastGroup(FLOOD_GROUP, tuple(Replica(p, 0) for p in set(ports)))

"""The result replication of a job (p4src: HySyncEgress.replication): its multicast
group (group id = job id, one replica per active member, rid = member_rid) and the
egress rewrite that addresses each replica to its member (docs/protocol.md §6).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hysync import p4names, wire
from hysync.controlplane.job import Member
from hysync.controlplane.p4rt.entities import MulticastGroup, Replica, TableEntry
from hysync.controlplane.tables.forwarding import mac_int, mac_str


def job_group(job_id: int, members: Iterable[Member]) -> MulticastGroup:
    return MulticastGroup(job_id, tuple(replica(job_id, m) for m in members))


def replica(job_id: int, member: Member) -> Replica:
    return Replica(member.switch_port, wire.member_rid(job_id, member.worker))


def rewrite_entry(job_id: int, member: Member) -> TableEntry:
    return TableEntry(p4names.REPLICATION_REWRITE,
                      {"egress_rid": wire.member_rid(job_id, member.worker)},
                      p4names.REPLICATION_REWRITE_DST,
                      {"dst_mac": mac_int(member.mac), "dst_addr": member.ip_int,
                       "dst_port": member.udp_port})


def member_of_rid(rid: int) -> tuple[int, int]:
    """(job, worker) of a replica id; inverse of wire.member_rid."""
    return divmod(rid - 1, wire.MAX_WORKERS)


@dataclass(frozen=True, slots=True)
class Rewrite:
    """A rewrite entry, decoded: a member's address as the switch knows it."""

    job_id: int
    worker: int
    mac: str
    ipv4: str
    udp_port: int

    @classmethod
    def from_entry(cls, entry: TableEntry) -> Rewrite:
        rid = entry.match["egress_rid"]
        assert isinstance(rid, int)
        job_id, worker = member_of_rid(rid)
        p = entry.params
        return cls(job_id, worker, mac_str(p["dst_mac"]), wire.int_to_ip(p["dst_addr"]),
                   p["dst_port"])

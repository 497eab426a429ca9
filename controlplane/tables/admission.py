"""Entries of the admission control (p4src: HySyncIngress.admission).

`members` admits a (job, worker, source address, source port); `jobs` gives an
admitted job its slot range, active member count, multicast group and install epoch.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from hysync import p4names, wire
from hysync.controlplane.job import Member
from hysync.controlplane.p4rt.entities import TableEntry


def member_entry(job_id: int, member: Member) -> TableEntry:
    return member_entry_for(job_id, member.worker, member.ip_int, member.udp_port)


def member_entry_for(job_id: int, worker: int, ip: int, udp_port: int) -> TableEntry:
    return TableEntry(p4names.ADMISSION_MEMBERS, {"job_id": job_id, "worker_id": worker,
                                                  "src_addr": ip, "src_port": udp_port},
                      p4names.ADMISSION_ADMIT)


@dataclass(frozen=True, slots=True)
class Admitted:
    """A members-table entry, decoded."""

    job_id: int
    worker: int
    ipv4: str
    udp_port: int

    @classmethod
    def from_entry(cls, entry: TableEntry) -> Admitted:
        m = entry.match
        return cls(_int(m["job_id"]), _int(m["worker_id"]), wire.int_to_ip(_int(m["src_addr"])),
                   _int(m["src_port"]))

    def entry(self) -> TableEntry:
        return member_entry_for(self.job_id, self.worker, wire.ip_to_int(self.ipv4),
                                self.udp_port)


@dataclass(frozen=True, slots=True)
class JobRow:
    """A jobs-table entry, decoded: what the switch knows of a job."""

    job_id: int
    slot_base: int
    slot_count: int
    members: int  # active member count n
    mcast_grp: int
    epoch: int  # this install's epoch (docs/protocol.md §4 step 8); kept by every modify

    @classmethod
    def from_entry(cls, entry: TableEntry) -> JobRow:
        p = entry.params
        return cls(_int(entry.match["job_id"]), p["slot_base"], p["slot_count"], p["members"],
                   p["mcast_grp"], p["epoch"])

    def entry(self) -> TableEntry:
        return TableEntry(p4names.ADMISSION_JOBS, {"job_id": self.job_id},
                          p4names.ADMISSION_SET_JOB,
                          {"slot_base": self.slot_base, "slot_count": self.slot_count,
                           "members": self.members, "mcast_grp": self.mcast_grp,
                           "epoch": self.epoch})


def new_epoch(after: int | None = None) -> int:
    """A fresh install's epoch: random, 1..wire.MAX_EPOCH. The switch cannot tell the controller the
    epoch a slot holds (registers are not readable over P4Runtime), and the CLI keeps no
    state between runs, so a reused slot meets its previous epoch again with probability
    2^-32 per install. `after`: the epoch of the job's install before this one, when the
    controller knows it: the new one gets another install tag (its low byte, which RESULTs
    and ACKs carry: hysync/wire.py), so that the job's workers surely see the change."""
    while True:
        epoch = 1 + secrets.randbelow(wire.MAX_EPOCH)
        if after is None or wire.install_tag(epoch) != wire.install_tag(after):
            return epoch


def _int(value: object) -> int:
    assert isinstance(value, int), value
    return value

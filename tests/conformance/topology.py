"""The fixed test topology of the conformance suite and the frames it exchanges.

Expected outputs are built here from docs/protocol.md with hysync.wire, never by
asking an implementation, so the suite checks every target against the spec. Input
frames are crafted with the scapy layer (hysync.scapy), the way a user crafts them: a
second codec, so an input and its expected output never share one encoder's bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet

from hysync import wire
from hysync.scapy import HySync
from hysync.wire import FrameAddress, Header, Op

SWITCH_MAC = bytes.fromhex("0200000000fe")
SWITCH_IP = wire.ip_to_int("10.0.0.254")


@dataclass(frozen=True)
class Member:
    worker: int
    port: int  # switch port

    @property
    def mac(self) -> bytes:
        return bytes([2, 0, 0, 0, 0, self.port])

    @property
    def ip(self) -> int:
        return wire.ip_to_int(f"10.0.0.{self.port}")

    @property
    def udp_port(self) -> int:
        return 40000 + self.port


@dataclass(frozen=True)
class Job:
    job_id: int
    slot_base: int
    slot_count: int
    members: tuple[Member, ...]
    epoch: int = 1  # the install's epoch (docs/protocol.md §4 step 8)

    def member(self, worker: int) -> Member:
        return next(m for m in self.members if m.worker == worker)


JOB1 = Job(1, 0, 16, tuple(Member(w, w + 1) for w in range(4)))
# A second job on the same hosts, disjoint slots, its own worker ids.
JOB2 = Job(2, 16, 16, (Member(0, 1), Member(1, 2)))
PORTS = (1, 2, 3, 4)


def lanes_of(seed: int) -> np.ndarray:
    """Deterministic lanes for a test contribution, with negative values too."""
    return (np.arange(wire.LANES, dtype=np.int64) * 1000 + seed * 7 - 30000).astype(np.int32)


def contribution(job: Job, worker: int, slot: int, rnd: int, chunk: int = 0,
                 lanes: np.ndarray | None = None, *, flags: int = 0, ttl: int = 64,
                 ident: int = 0x1234) -> bytes:
    values = lanes_of(worker) if lanes is None else lanes
    return raw_frame(job, worker, HySync(op=Op.CONTRIB, job_id=job.job_id, worker_id=worker,
                                         slot=slot, round=rnd, chunk=chunk, flags=flags,
                                         lanes=[int(v) for v in values]),
                     ttl=ttl, ident=ident)


def raw_frame(job: Job, worker: int, payload: Packet | bytes, *, ttl: int = 64,
              ident: int = 0x1234) -> bytes:
    """`payload` (a HySync layer, or any bytes) from `worker` to the switch's HySync port."""
    m = job.member(worker)
    frame = (Ether(src=wire.bytes_to_mac(m.mac), dst=wire.bytes_to_mac(SWITCH_MAC))
             / IP(src=wire.int_to_ip(m.ip), dst=wire.int_to_ip(SWITCH_IP), id=ident, ttl=ttl)
             / UDP(sport=m.udp_port, dport=wire.HYSYNC_UDP_PORT, chksum=0) / payload)
    return bytes(frame)


def to_member(m: Member, datagram: bytes, *, ident: int = 0x1234, ttl: int = 64) -> bytes:
    """A switch-generated frame addressed to member m (docs/protocol.md §4 Replies, §6)."""
    return wire.build_frame(FrameAddress(SWITCH_MAC, m.mac, SWITCH_IP, m.ip,
                                         wire.HYSYNC_UDP_PORT, m.udp_port),
                            datagram, ttl=ttl, ident=ident)


def result(job: Job, closer: int, slot: int, rnd: int, chunk: int, bitmap: int,
           lanes: np.ndarray, *, mode: int = wire.Mode.SYNC, quorum: int = 0,
           flags: int = 0) -> bytes:
    return wire.Packet(Header(op=Op.RESULT, job_id=job.job_id, worker_id=closer, slot=slot,
                              round=rnd, chunk=chunk, flags=flags, mode=mode,
                              count=bin(bitmap).count("1"), quorum=quorum, bitmap=bitmap,
                              reason=wire.install_tag(job.epoch)),
                       lanes.astype(np.int32)).encode()


def ack(job: Job, worker: int, slot: int, seq: int, chunk: int, *, mode: int = wire.Mode.ASYNC,
        quorum: int = 0, flags: int = 0) -> bytes:
    """The ACK of a retransmitted async contribution (docs/protocol.md §4 step 10)."""
    return Header(op=Op.ACK, job_id=job.job_id, worker_id=worker, slot=slot, round=seq,
                  chunk=chunk, mode=mode, quorum=quorum, flags=flags,
                  reason=wire.install_tag(job.epoch)).pack()


def multicast(job: Job, datagram: bytes, *, members: tuple[int, ...] | None = None,
              ident: int = 0x1234) -> list[tuple[int, bytes]]:
    """The replicas of a result: one per (active) member, sorted by port."""
    chosen = [m for m in job.members if members is None or m.worker in members]
    return sorted((m.port, to_member(m, datagram, ident=ident)) for m in chosen)


def unicast(job: Job, worker: int, datagram: bytes) -> list[tuple[int, bytes]]:
    """A reply to one member (a resent result, a RESYNC, an ACK): on its port alone."""
    m = job.member(worker)
    return [(m.port, to_member(m, datagram))]


def resync(job: Job, worker: int, slot: int, *, open_round: int, chunk: int, count: int,
           bitmap: int, reason: int, mode: int = wire.Mode.SYNC, quorum: int = 0) -> bytes:
    return wire.Header(op=Op.RESYNC, job_id=job.job_id, worker_id=worker, slot=slot,
                       round=open_round, chunk=chunk, count=count, bitmap=bitmap, reason=reason,
                       mode=mode, quorum=quorum).pack()


def wrap_sum(*arrays: np.ndarray) -> np.ndarray:
    """Lane-wise sum modulo 2^32, as the switch's 32-bit adders compute it."""
    total = np.zeros(wire.LANES, dtype=np.int64)
    for a in arrays:
        total += a.astype(np.int64)
    return ((total + 2**31) % 2**32 - 2**31).astype(np.int32)

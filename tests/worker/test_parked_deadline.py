"""The packet deadline reaches a parked packet that a chunk of the call waits behind
(docs/protocol.md §9, Failures): parked while its slot ran partial, then sent again at a sync
round that waits for ever (a member who is gone), it holds the call's chunk that a reply
reporting the slot sync put back in the queue. The call fails `dead_after` after that packet
was launched there, though results on another slot keep the switch's silence from counting.

The member is the worker engine on its in-memory backend, the switch's replies written by
hand: one member of two, slots A and B, a call of three chunks (the first and third on A, the
second on B). A's open round is OPEN in partial, B's in sync. A's chunk meets silence and is
parked at its first timeout, the third chunk carried behind it. A STALE_ROUND of A, its open
round OPEN + 2 in sync, puts the third chunk back in the queue, and after its grace period the
parked packet goes again at OPEN + 2, where nothing answers it. B's round closes; then the other
member's async rounds on B come every HEARD_EVERY, so the switch is never silent for
`dead_after`."""

from __future__ import annotations

import numpy as np
import pytest

from hysync import wire
from hysync.wire import Mode, Op, ResyncReason
from hysync.worker.config import engine_config
from tests.worker.scripted_switch import (
    JOB,
    MINE,
    SCALE,
    SLOT,
    ScriptedMember,
    closed_with_both,
    engine_with_faults,
)

UNREACHABLE, PENDING = 1, 3  # Engine.step's statuses
RTO = 0.1  # every retransmission timeout, and the early look at a silent packet (none: equal)
DEAD_AFTER = 2.0
HEARD_EVERY = 0.5  # the other member's async results on B
TICK = 0.01
NEVER = 600.0  # no JOIN
OPEN = 5


class Member(ScriptedMember):
    """Member 0's engine, its call of key "g" under way, A's open round OPEN in partial and B's
    in sync."""

    def __init__(self, **faults: bool) -> None:
        config = engine_config(job_id=JOB, worker_id=0, slot_base=SLOT, slot_count=2, members=2,
                               scale=SCALE, rto_initial=RTO, rto_min=RTO, rto_max=RTO,
                               stall_after=RTO, join_after=NEVER, dead_after=DEAD_AFTER, seed=5)
        self.engine = engine_with_faults(config, **faults)
        self.engine.register("g", 3 * wire.LANES)
        self.first = self.engine.first_chunk("g")
        self.now = 0.0
        self.engine.set_time(self.now)
        self.engine.begin_call("g", np.full(3 * wire.LANES, MINE, np.float32))
        self.status = self.engine.step(self.now)
        self.latest: dict[int, wire.Packet] = {}
        self.log: list[tuple[float, wire.Packet]] = []  # what it sent, and when
        for probe in self.sent():  # first contact: each slot's open round is OPEN
            mode = Mode.PARTIAL if probe.header.slot == SLOT else Mode.SYNC
            self.hand(stale_round(probe, OPEN, mode))
        assert sorted(self.latest) == [SLOT, SLOT + 1], self.latest
        assert all(p.header.round == OPEN for p in self.latest.values())
        assert self.latest[SLOT].header.chunk == self.first
        assert self.latest[SLOT + 1].header.chunk == self.first + 1
        self.heard_at = self.now

    def sent(self) -> list[wire.Packet]:
        out = super().sent()
        for p in out:
            self.latest[p.header.slot] = p
            self.log.append((self.now, p))
        return out

    def hand(self, data: bytes, after: float = 0.001) -> None:
        super().hand(data, after)
        self.sent()

    def run_until(self, until: float) -> None:
        """Steps the engine every TICK to `until` or the call's end; the other member's async
        rounds on B come every HEARD_EVERY."""
        rnd = OPEN + 1
        while self.status == PENDING and self.now < until - 1e-9:
            if self.now - self.heard_at >= HEARD_EVERY and self.heard_at > 0:
                self.hand(others_async_result(self.first + 1, rnd), after=0.0)
                rnd += 1
                self.heard_at = self.now
                continue
            self.now += TICK
            self.engine.set_time(self.now)
            self.status = self.engine.step(self.now)
            self.sent()


def stale_round(packet: wire.Packet, rnd: int, mode: Mode) -> bytes:
    """The packet's round is stale: the slot's open round is `rnd`, in `mode`."""
    h = packet.header
    return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=h.slot, round=rnd,
                       chunk=h.chunk, mode=mode, reason=ResyncReason.STALE_ROUND,
                       flags=h.flags & wire.TX_MASK).pack()


def others_async_result(chunk: int, rnd: int) -> bytes:
    """An async round of the other member alone on slot B."""
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=1, slot=SLOT + 1,
                                   round=rnd, chunk=chunk, count=1, bitmap=0b10,
                                   mode=Mode.ASYNC),
                       np.full(wire.LANES, int(0.5 * SCALE), np.int64)).encode()


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_a_parked_packet_a_chunk_of_the_call_waits_behind_meets_the_deadline(rule: str) -> None:
    member = Member(**({"parked_flight_no_deadline": True} if rule == "taken out" else {}))
    held = member.latest[SLOT]
    member.run_until(member.now + 1.5 * RTO)  # A's first timeout: parked, sent again
    assert member.engine.stats()["parked"] == 1
    assert member.status == PENDING
    member.hand(stale_round(member.latest[SLOT], OPEN + 2, Mode.SYNC))
    member.hand(closed_with_both(member.latest[SLOT + 1], Mode.SYNC))
    assert member.status == PENDING, "the third chunk waits behind A's parked packet"
    member.heard_at = member.now
    member.run_until(member.now + 1.5 * RTO)  # the STALE reply's grace period: A's packet again
    launched, again = next((t, p) for t, p in member.log
                           if p.header.slot == SLOT and p.header.round == OPEN + 2)
    assert again.header.chunk == held.header.chunk
    member.run_until(launched + 2 * DEAD_AFTER)
    if rule == "in":
        assert member.status == UNREACHABLE, "the call outlived the parked packet's deadline"
        assert member.now == pytest.approx(launched + DEAD_AFTER, abs=2 * TICK)
    else:  # as before the rule: the other slot's results keep the call alive
        assert member.status == PENDING

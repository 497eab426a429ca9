"""A flight whose round closed with my bit on another chunk is sent again at once
(docs/protocol.md §9, "Sync / partial sending", a round closed on my other chunk): another
contribution of mine, one an aborted call forgot, held my place in that round, so the switch
dropped this packet there as my duplicate without a word and no answer to it will come. The
copy meets the closed round (RESEND) and the flight is carried. Left to its timer, it waited
out the RTO, up to rto_max after faults, its call that far behind the others' (seed 10036437:
0.5 s; the others' rounds of the next keys waited for it, and a member's chunks starved).

The member is the worker engine on its in-memory backend, the switch's replies written by
hand: one member of two, one partial slot, a call of one chunk, first contact made."""

from __future__ import annotations

import numpy as np
import pytest

from hysync import wire
from hysync.wire import Mode, Op, ResyncReason
from hysync.worker.config import engine_config
from tests.worker.scripted_switch import (
    JOB,
    MINE,
    OTHERS,
    SCALE,
    SLOT,
    ScriptedMember,
    engine_with_faults,
)

RTO = 0.32
NEVER = 600.0  # no JOIN, no dead timer
OPEN = 5
DONE, PENDING = 0, 3


class Member(ScriptedMember):
    """Member 0's engine: slot SLOT partial, its open round OPEN."""

    def __init__(self, **faults: bool) -> None:
        config = engine_config(job_id=JOB, worker_id=0, slot_base=SLOT, slot_count=1, members=2,
                               scale=SCALE, rto_initial=RTO, rto_max=5.0,
                               join_after=NEVER, dead_after=NEVER, seed=5)
        self.engine = engine_with_faults(config, **faults)
        self.engine.register("g", wire.LANES)
        self.now = 0.0

    def first_contact(self) -> wire.Packet:
        """A call of key "g": its probe answered at once with the open round OPEN; the chunk's
        packet, relaunched at that round."""
        self.engine.set_time(self.now)
        self.engine.begin_call("g", np.full(wire.LANES, MINE, np.float32))
        (probe,) = self.at(self.now)
        (packet,) = self.at(self.now + 0.001, wire.Header(
            op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, round=OPEN, mode=Mode.PARTIAL,
            reason=ResyncReason.STALE_ROUND, flags=probe.header.flags & wire.TX_MASK).pack())
        assert packet.header.round == OPEN
        return packet

    def until_sent(self, deadline: float) -> list[wire.Packet]:
        while (wake := self.engine.next_wake()) < deadline:
            out = self.at(max(self.now, wake))
            if out:
                return out
        return []


def closed_on_my_other(packet: wire.Packet, flags: int = 0, closer: int = 1) -> bytes:
    """The RESULT of the packet's round, closed with my bit and the other member's on another
    chunk than the packet's: my place there held by a contribution of mine of that chunk."""
    h = packet.header
    lanes = np.full(wire.LANES, int((MINE + OTHERS) * SCALE), np.int64)
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=closer, slot=h.slot,
                                   round=h.round, chunk=h.chunk + 1, count=2, bitmap=0b11,
                                   mode=Mode.PARTIAL, flags=flags), lanes).encode()


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_a_round_closed_on_my_other_chunk_resends_at_once(rule: str) -> None:
    member = Member(**({"closed_by_my_other_waits_rto": True} if rule == "taken out" else {}))
    packet = member.first_contact()
    sent_at = member.now
    # The switch drops it (my bit is in the round already) and says nothing; the round closes
    # with the other member's contribution, on my other chunk.
    closed_at = sent_at + 0.002
    out = member.at(closed_at, closed_on_my_other(packet))
    assert member.status == PENDING
    if rule == "in":  # sent again at once, at the round it was sent to
        (copy,) = out
    else:  # as before the rule: nothing until the RTO
        assert out == []
        (copy,) = member.until_sent(sent_at + 2 * RTO)
        assert member.now == pytest.approx(sent_at + RTO)
    assert copy.header.round == OPEN and copy.header.chunk == packet.header.chunk
    # The copy meets the closed round, the slot's last: RESEND, and the flight is carried.
    resend = closed_on_my_other(copy, flags=int(wire.Flag.RESEND) |
                                (copy.header.flags & wire.TX_MASK), closer=0)
    member.at(member.now + 0.002, resend)
    assert member.status == DONE
    assert member.now == pytest.approx(closed_at + 0.002 if rule == "in" else sent_at + RTO + 0.002)
    # A late answer to the first transmission (a RESEND too, were it not dropped) sends nothing.
    late = closed_on_my_other(packet, flags=int(wire.Flag.RESEND) |
                              (packet.header.flags & wire.TX_MASK), closer=0)
    assert member.at(member.now + 0.001, late) == []

"""A JOIN offered at once at the slot's next round - the RESEND of the round it named answered
the JOIN before it - and refused there (NOT_JOINED: no round open) is no progress of the call
(docs/protocol.md §9, "Swap storms", JOIN): the call's JOINs of its idle slots still come
`join_after` after its last progress, not `join_after` after that refusal, which a slow switch
sends a round trip later.

The member is the worker engine on its in-memory backend, the switch's replies written by
hand, so each case is exactly the datagram it names: one member of two, two sync slots A and
B, a call of two chunks, one on each. Round 5 closes B's chunk; A's is held without a word.
After `join_after` the call offers idle slot B a JOIN at round 6, which round 6's RESEND with
my bit on another chunk answers (another contribution of mine held my place there); the JOIN
goes at once to round 7, where no round is open, and is refused `REFUSED_AFTER` later. The
next JOIN on B must come `join_after` after the RESEND."""

from __future__ import annotations

import numpy as np
import pytest

from hysync import wire
from hysync.wire import Flag, Mode, Op, ResyncReason
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

JOIN_AFTER = 1.0
REFUSED_AFTER = 0.5 * JOIN_AFTER  # the refusal of the JOIN offered at once: a slow switch
NEVER = 600.0  # no retransmission, no dead timer: nothing but replies and join_after wake it
OPEN = 5


class Member(ScriptedMember):
    ASLEEP = NEVER
    """Member 0's engine, its call of key "g" (chunk `first` on slot A, `first + 1` on B) under
    way, each slot taught round OPEN."""

    def __init__(self, **faults: bool) -> None:
        config = engine_config(job_id=JOB, worker_id=0, slot_base=SLOT, slot_count=2, members=2,
                               scale=SCALE, rto_initial=NEVER, rto_min=NEVER, rto_max=NEVER,
                               join_after=JOIN_AFTER, dead_after=NEVER, seed=5)
        self.engine = engine_with_faults(config, **faults)
        self.engine.register("g", 2 * wire.LANES)
        self.first = self.engine.first_chunk("g")
        self.now = 0.0
        self.engine.set_time(self.now)
        self.engine.begin_call("g", np.full(2 * wire.LANES, MINE, np.float32))
        self.status = self.engine.step(self.now)
        for probe in self.sent():  # first contact: each slot's open round is OPEN
            self.hand(wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=probe.header.slot,
                                  round=OPEN, mode=Mode.SYNC, reason=ResyncReason.STALE_ROUND,
                                  flags=probe.header.flags & wire.TX_MASK).pack())
        sent = {p.header.slot: p for p in self.sent()}
        assert sorted(sent) == [SLOT, SLOT + 1], sent
        assert all(p.header.round == OPEN for p in sent.values())
        self.held, self.closing = sent[SLOT], sent[SLOT + 1]



def resend_with_me_on(join: wire.Packet, chunk: int) -> bytes:
    """The stored result of the round the JOIN named: closed with both members, my place held
    by a contribution of mine of `chunk`; unicast to the JOIN's sender, its number echoed."""
    h = join.header
    lanes = np.full(wire.LANES, int((MINE + MINE) * SCALE), np.int64)
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=h.slot,
                                   round=h.round, chunk=chunk, count=2, bitmap=0b11,
                                   mode=Mode.SYNC,
                                   flags=Flag.RESEND | (h.flags & wire.TX_MASK)),
                       lanes).encode()


def not_joined(join: wire.Packet) -> bytes:
    """No round open at the JOIN's round: the residual stays mine."""
    h = join.header
    return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=h.slot, round=h.round,
                       chunk=h.chunk, mode=Mode.SYNC, reason=ResyncReason.NOT_JOINED,
                       flags=h.flags & wire.TX_MASK).pack()


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_a_join_refused_at_the_next_round_puts_off_no_join(rule: str) -> None:
    member = Member(**({"refused_reoffer_is_progress": True} if rule == "taken out" else {}))
    member.hand(closed_with_both(member.closing, Mode.SYNC))
    progress = member.now

    join = member.next_packet()  # the call stuck for join_after: idle slot B
    assert join.header.slot == SLOT + 1 and join.header.flags & Flag.JOIN, join.header
    assert join.header.round == OPEN + 1
    assert member.now == pytest.approx(progress + JOIN_AFTER)

    member.hand(resend_with_me_on(join, member.held.header.chunk))
    resent = member.now
    again = member.sent()
    assert len(again) == 1, [p.header for p in again]
    again = again[0]
    assert again.header.slot == SLOT + 1 and again.header.flags & Flag.JOIN, again.header
    assert again.header.round == OPEN + 2, "the JOIN is offered at once at the next round"

    member.hand(not_joined(again), after=REFUSED_AFTER)
    refused = member.now
    following = member.next_packet()
    assert following.header.slot == SLOT + 1 and following.header.flags & Flag.JOIN
    assert following.header.round == OPEN + 2
    if rule == "in":
        assert member.now == pytest.approx(resent + JOIN_AFTER), (
            f"the next JOIN came {member.now - refused:.3f} s after the refusal, "
            f"{member.now - resent:.3f} s after the RESEND: the refusal was taken for progress")
    else:  # as before the rule: a refusal a round trip later puts the JOIN off as long
        assert member.now == pytest.approx(refused + JOIN_AFTER)
    assert member.engine.stats()["joins"] == 3

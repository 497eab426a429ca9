"""A slot reported async sends a contribution under a sequence number only once the last copy
of the packet before it, if that packet was sync-style and sent more than once, is one RTO
old (docs/protocol.md §9, "Async"): the switch refuses a late copy of that packet only while
my member cell holds its round field, and a newer contribution there, ahead of the copy on
an uplink out of order, replaces it; the copy's round field is not behind the new sequence
number (§4 step 10) and is counted a second time.

The member is the worker engine on its in-memory backend, the switch's replies written by
hand: one member of two, one slot in partial. The call's chunk, sent at round OPEN, meets
silence and is parked at its first timeout (its copy goes with it); the next call starts,
its chunk waits behind the parked packet, and the call hurries that packet (another copy,
the slot still reported partial). An async RESULT of my lanes alone then says a copy was
counted after the slot turned async: the parked packet is settled, and the call's chunk goes
out under a sequence number - one RTO after the hurried copy, not at once."""

from __future__ import annotations

from functools import partial

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
    closed_with_both,
    engine_with_faults,
)

RTO = 0.05
OPEN = 5
DONE = 0  # Engine.step's status


class Member(ScriptedMember):
    """Member 0's engine with its first call's chunk parked at round OPEN."""

    def __init__(self, **faults: bool) -> None:
        config = engine_config(job_id=JOB, worker_id=0, slot_base=SLOT, slot_count=1, members=2,
                               scale=SCALE, rto_initial=RTO, rto_min=RTO, rto_max=RTO,
                               stall_after=RTO, join_after=100.0, dead_after=100.0, seed=3)
        self.engine = engine_with_faults(config, **faults)
        self.engine.register("g", wire.LANES)
        self.now = 0.0
        self.call(MINE)
        probe = self.sent()[0]  # first contact: the slot's open round is OPEN, in partial
        self.hand(wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, round=OPEN,
                              mode=Mode.PARTIAL, reason=ResyncReason.STALE_ROUND,
                              flags=probe.header.flags & wire.TX_MASK).pack())
        [self.parked] = self.sent()
        assert self.parked.header.round == OPEN, self.parked.header
        self.wait_until(self.now + RTO)  # silence: parked at its first timeout, copy sent
        assert len(self.sent()) == 1, "parking sends the packet again"
        assert self.status == DONE, "the parked chunk counts as included: the call is done"

    def call(self, value: float) -> None:
        self.engine.set_time(self.now)
        self.engine.begin_call("g", np.full(wire.LANES, value, np.float32))
        self.status = self.engine.step(self.now)



def counted_in_async(packet: wire.Packet) -> bytes:
    """An async round of my contribution alone, after the slot's round the packet was sent at."""
    h = packet.header
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=SLOT, round=h.round,
                                   chunk=h.chunk, count=1, bitmap=0b01, mode=Mode.ASYNC),
                       packet.lanes.astype(np.int64)).encode()


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_an_async_contribution_waits_for_the_hurried_copy(rule: str) -> None:
    member = Member(**({"launch_past_sync_copy": True} if rule == "taken out" else {}))
    member.now += 0.01
    member.call(2 * MINE)  # the next call: its chunk waits behind the parked packet
    [hurried] = member.sent()
    assert hurried.header.round == OPEN and hurried.header.chunk == member.parked.header.chunk
    copy_at = member.now

    member.hand(counted_in_async(member.parked))  # a copy counted after a swap into async
    out = member.sent()
    if rule == "taken out":  # as before the rule: at once, ahead of the copy still on its way
        assert len(out) == 1, [p.header for p in out]
        assert member.now - copy_at < RTO / 2
        return
    assert not out, f"sent {member.now - copy_at:.3f} s after a copy still on its way"
    following = member.next_packet()
    assert member.now == pytest.approx(copy_at + RTO)
    assert following.header.chunk == member.parked.header.chunk
    assert following.header.round != OPEN + 1, "a sequence number, not a round"
    assert following.header.flags & wire.Flag.RETRANSMIT == 0


# The wait is one RTO of the path (Rto::path, seed 9125740): learned from answers the switch
# sent as my packet arrived, not from answers that also waited in open rounds for the other
# member's packet, which put the RTO that times packets out at rto_max.
WAITED, PATH, RTO_MAX = 0.2, 0.002, 0.5


def closed_by_me(packet: wire.Packet) -> bytes:
    """The RESULT of the packet's round, closed (in partial) by the packet itself."""
    h = packet.header
    lanes = packet.lanes.astype(np.int64) + int(OTHERS * SCALE)
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=SLOT,
                                   round=h.round, chunk=h.chunk, count=2, bitmap=0b11,
                                   mode=Mode.PARTIAL), lanes).encode()


class LearnedMember(ScriptedMember):
    """Member 0's engine after two calls: the first's round, in sync, waited WAITED for the
    other member's packet (a sync round's wait is a sample: it is due once every member has
    sent), the second's, in partial, closed as my packet arrived, PATH after it left. The RTO
    stands at rto_max (srtt 0.175 s), the path's at 4 x PATH; the third call's chunk, sent at
    round OPEN + 2, meets silence and is parked at its first timeout, as Member's."""

    def __init__(self, **faults: bool) -> None:
        config = engine_config(job_id=JOB, worker_id=0, slot_base=SLOT, slot_count=1, members=2,
                               scale=SCALE, rto_initial=RTO_MAX, rto_min=PATH, rto_max=RTO_MAX,
                               stall_after=RTO_MAX, join_after=100.0, dead_after=100.0,
                               seed=3)
        self.engine = engine_with_faults(config, **faults)
        self.engine.register("g", wire.LANES)
        self.now = 0.0
        self.call(MINE)
        probe = self.sent()[0]
        self.hand(wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, round=OPEN,
                              mode=Mode.PARTIAL, reason=ResyncReason.STALE_ROUND,
                              flags=probe.header.flags & wire.TX_MASK).pack())
        waited_in_sync = partial(closed_with_both, mode=Mode.SYNC)
        for n, (closed, after) in enumerate(((waited_in_sync, WAITED), (closed_by_me, PATH))):
            if n:
                self.call(MINE)
            [packet] = self.sent()
            assert packet.header.round == OPEN + n, packet.header
            self.hand(closed(packet), after=after)
            assert self.status == DONE, "the round included the call's chunk"
        self.call(MINE)
        [self.parked] = self.sent()
        assert self.parked.header.round == OPEN + 2, self.parked.header
        copy = self.next_packet()  # the RTO, rto_max by now: parked, its copy sent
        assert self.now == pytest.approx(self.parked_at + RTO_MAX)
        assert copy.header.round == OPEN + 2
        assert self.status == DONE, "the parked chunk counts as included: the call is done"

    def call(self, value: float) -> None:
        self.engine.set_time(self.now)
        self.engine.begin_call("g", np.full(wire.LANES, value, np.float32))
        self.parked_at = self.now
        self.status = self.engine.step(self.now)


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_the_wait_is_the_paths_rto(rule: str) -> None:
    member = LearnedMember(**({"hold_past_copy_by_rto": True} if rule == "taken out" else {}))
    member.now += 0.01
    member.call(2 * MINE)
    [hurried] = member.sent()
    assert hurried.header.round == OPEN + 2
    copy_at = member.now

    member.hand(counted_in_async(member.parked))
    assert not member.sent(), "the copy may still be on its way"
    following = member.next_packet()
    assert following.header.chunk == member.parked.header.chunk
    assert following.header.flags & wire.Flag.RETRANSMIT == 0
    # the rule: one RTO of the path (4 x PATH); taken out, the RTO of answers that waited
    assert member.now == pytest.approx(copy_at + (4 * PATH if rule == "in" else RTO_MAX))

"""The packet deadline counts from the last RESULT heard whose bitmap holds every member, if
later than the packet's launch (docs/protocol.md §9, Failures): that round closed with each
member alive and at work, so a round of the call still open waits for members out of step, not
gone, and closes by their JOINs once their own calls stall. Behind a slow switch that takes
join_after and two round trips after their last progress, later than dead_after from the
launch (seed 9132941). A member that dies sends nothing more: no such RESULT comes after its
last contribution, and the call fails dead_after after the later of that and the launch.

The member is the worker engine on its in-memory backend, the switch's replies written by
hand: one member of two, slots A and B in sync, a call of two chunks (the first on A, the
second on B). Nothing is retransmitted and no JOIN is offered (RTO and join_after too long to
matter), so only the packet deadline can end the call. A's round waits for the other member;
B's closes with both members HEARD_AFTER past the launch."""

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

DONE, UNREACHABLE, PENDING = 0, 1, 3  # Engine.step's statuses
NEVER = 600.0  # no retransmission, no JOIN
DEAD_AFTER = 2.0
HEARD_AFTER = 1.5  # B's round closes with both members this long after the launch
OPEN = 5


class Member(ScriptedMember):
    """Member 0's engine, its call of key "g" under way: first contact made, each slot's open
    round OPEN in sync, the chunks launched there at `launched`."""

    def __init__(self, **faults: bool) -> None:
        config = engine_config(job_id=JOB, worker_id=0, slot_base=SLOT, slot_count=2, members=2,
                               scale=SCALE, rto_initial=NEVER, rto_min=NEVER, rto_max=NEVER,
                               join_after=NEVER, dead_after=DEAD_AFTER, seed=5)
        self.engine = engine_with_faults(config, **faults)
        self.engine.register("g", 2 * wire.LANES)
        self.now = 0.0
        self.engine.set_time(self.now)
        self.engine.begin_call("g", np.full(2 * wire.LANES, MINE, np.float32))
        self.status = self.engine.step(self.now)
        probes = self.sent()
        assert sorted(p.header.slot for p in probes) == [SLOT, SLOT + 1]
        self.latest: dict[int, wire.Packet] = {}
        for probe in probes:  # the probes relaunched at the open round
            self.hand(wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=probe.header.slot,
                                  round=OPEN, chunk=probe.header.chunk, mode=Mode.SYNC,
                                  reason=ResyncReason.STALE_ROUND,
                                  flags=probe.header.flags & wire.TX_MASK).pack(), after=0.0)
            (packet,) = self.sent()
            self.latest[packet.header.slot] = packet
        assert all(p.header.round == OPEN for p in self.latest.values())
        self.launched = self.now
        assert self.status == PENDING


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_a_result_of_every_member_moves_the_packet_deadline(rule: str) -> None:
    member = Member(**({"flight_deadline_from_launch": True} if rule == "taken out" else {}))
    assert member.engine.next_wake() == pytest.approx(member.launched + DEAD_AFTER)

    # B's round closes with both members: the other member is alive and at work.
    member.hand(closed_with_both(member.latest[SLOT + 1], Mode.SYNC),
                after=HEARD_AFTER)
    heard = member.now
    assert member.status == PENDING and member.sent() == []
    deadline = heard + DEAD_AFTER if rule == "in" else member.launched + DEAD_AFTER
    assert member.engine.next_wake() == pytest.approx(deadline)

    # Past dead_after from the launch: with the rule, A's packet still waits.
    member.wait_until(member.launched + DEAD_AFTER)
    assert member.status == (PENDING if rule == "in" else UNREACHABLE)
    if rule == "taken out":
        return
    # No other word from the other member (gone, or its JOIN lost): the call fails
    # dead_after after the RESULT that showed it last, and not before.
    member.wait_until(deadline - 0.01)
    assert member.status == PENDING
    member.wait_until(member.engine.next_wake())
    assert member.now == pytest.approx(heard + DEAD_AFTER)
    assert member.status == UNREACHABLE


def test_a_round_out_of_step_closes_before_the_moved_deadline() -> None:
    """With the rule, A's round, closed by the other member after dead_after from the launch
    but within dead_after of B's RESULT, ends the call done."""
    member = Member()
    member.hand(closed_with_both(member.latest[SLOT + 1], Mode.SYNC), after=HEARD_AFTER)
    member.wait_until(member.launched + DEAD_AFTER + 0.5)
    assert member.status == PENDING
    member.hand(closed_with_both(member.latest[SLOT], Mode.SYNC))
    assert member.status == DONE


@pytest.mark.parametrize("bitmap", [0b01, 0b10])
def test_a_result_without_every_member_leaves_the_deadline(bitmap: int) -> None:
    """A RESULT of a round some member is missing from (a partial quorum, an async round)
    shows nothing of that member: the deadline stays dead_after from the launch."""
    member = Member()
    b = member.latest[SLOT + 1].header
    lone = wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=1, slot=b.slot,
                                   round=OPEN - 1, chunk=b.chunk, count=1, bitmap=bitmap,
                                   mode=Mode.SYNC),
                       np.zeros(wire.LANES, np.int64)).encode()
    member.hand(lone, after=HEARD_AFTER)
    assert member.status == PENDING
    assert member.engine.next_wake() == pytest.approx(member.launched + DEAD_AFTER)
    member.wait_until(member.launched + DEAD_AFTER)
    assert member.status == UNREACHABLE


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_a_resend_of_every_member_leaves_the_deadline(rule: str) -> None:
    """A RESEND is the stored RESULT of a round closed before: its bitmap of every member
    shows nothing of the members now, and the deadline stays dead_after from the launch (seed
    10055420: a retransmission into an old round, answered so, moved the deadline of a call
    stuck on other slots past the job's liveness bound)."""
    member = Member(**({"everyone_heard_in_resend": True} if rule == "taken out" else {}))
    b = member.latest[SLOT + 1].header
    stored = wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=b.slot,
                                     round=OPEN - 1, chunk=b.chunk, count=2, bitmap=0b11,
                                     mode=Mode.SYNC, flags=wire.Flag.RESEND),
                         np.zeros(wire.LANES, np.int64)).encode()
    member.hand(stored, after=HEARD_AFTER)
    assert member.status == PENDING
    assert member.engine.next_wake() == pytest.approx(
        member.launched + DEAD_AFTER if rule == "in" else member.now + DEAD_AFTER)

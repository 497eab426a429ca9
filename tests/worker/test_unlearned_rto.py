"""A partial packet parked at its first timeout before any RTT sample backs the RTO off
(docs/protocol.md §9, "Sync / partial sending", partial liveness): the RTO is still the initial
guess, and the park's copy and every answer after it are retransmissions, which give no sample
(Karn), so nothing else would correct it. Behind a switch slower than that guess each call's
packet would time out and park before its answer came, call after call.

The member is the worker engine on its in-memory backend, the switch's replies written by
hand: one member of two, one partial slot, a call of one chunk. The first-contact probe is
answered at once (a RESYNC: the probe is relaunched, no sample); the switch then takes
`ROUND_TRIP`, a little longer than the initial RTO, to answer each contribution.

And what the RTO learns in partial: a RESULT that the other member's contribution closed held
my packet in its round until that one came, and gives no sample."""

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

RTO_INITIAL = 0.32
ROUND_TRIP = 0.33  # the slow switch: a round's RESULT comes this long after the packet
NEVER = 600.0  # no JOIN, no dead timer
OPEN = 5
DONE, PENDING = 0, 3


class Member(ScriptedMember):
    """Member 0's engine, first contact made: slot SLOT partial, its open round OPEN."""

    def __init__(self, **faults: bool) -> None:
        config = engine_config(job_id=JOB, worker_id=0, slot_base=SLOT, slot_count=1, members=2,
                               scale=SCALE, rto_initial=RTO_INITIAL, rto_max=5.0,
                               join_after=NEVER, dead_after=NEVER, seed=5)
        self.engine = engine_with_faults(config, **faults)
        self.engine.register("g", wire.LANES)
        self.now = 0.0
        self.values = np.full(wire.LANES, MINE, np.float32)

    def call(self) -> wire.Packet:
        """A call of key "g" begun now; its one packet."""
        self.engine.set_time(self.now)
        self.engine.begin_call("g", self.values)
        (packet,) = self.at(self.now)
        return packet

    def first_contact(self) -> wire.Packet:
        """The first call: its probe answered at once with slot SLOT's open round OPEN; the
        chunk's packet, relaunched at that round."""
        probe = self.call()
        (packet,) = self.at(self.now + 0.001, wire.Header(
            op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, round=OPEN, mode=Mode.PARTIAL,
            reason=ResyncReason.STALE_ROUND, flags=probe.header.flags & wire.TX_MASK).pack())
        assert packet.header.round == OPEN
        return packet

    def until_sent(self, deadline: float) -> list[wire.Packet]:
        """Wakes at each of the engine's timers before `deadline` until it sends."""
        while (wake := self.engine.next_wake()) < deadline:
            out = self.at(max(self.now, wake))
            if out:
                return out
        return []


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_a_park_before_any_rtt_sample_backs_the_rto_off(rule: str) -> None:
    member = Member(**({"park_keeps_unlearned_rto": True} if rule == "taken out" else {}))
    packet = member.first_contact()
    sent_at = member.now
    assert member.engine.srtt is None, "a relaunched probe gives no sample"

    # Silence past the initial RTO: the packet parks (the call done) and is sent again.
    (copy,) = member.until_sent(sent_at + ROUND_TRIP)
    assert member.now == pytest.approx(sent_at + RTO_INITIAL)
    assert copy.header.round == OPEN and member.status == DONE
    assert member.engine.parked() == [(0, packet.header.chunk)]
    assert member.engine.rto == pytest.approx(
        2 * RTO_INITIAL if rule == "in" else RTO_INITIAL)

    # Its round's RESULT, a round trip after the first transmission: an answer to a
    # retransmission, no sample.
    member.at(sent_at + ROUND_TRIP, closed_with_both(packet))
    assert member.engine.parked() == []
    assert member.engine.srtt is None

    # The next call's packet, answered a round trip later too.
    member.now += 0.01
    packet = member.call()
    sent_at = member.now
    assert packet.header.round == OPEN + 1
    parked_before_answer = member.until_sent(sent_at + ROUND_TRIP)
    # (The other member's contribution there first, this packet closes the round: its RESULT
    # is a round trip, not a wait for the other: test_a_round_another_member_closed_teaches_no_
    # round_trip.)
    member.at(sent_at + ROUND_TRIP, closed_with_both(packet, closer=0))
    if rule == "in":  # it waits the RTO backed off; its answer teaches the round trip
        assert parked_before_answer == []
        assert member.status == DONE
        assert member.engine.stats()["parked"] == 1
        assert member.engine.srtt == pytest.approx(ROUND_TRIP)
    else:  # as before the rule: parked again before its answer, which teaches nothing
        assert [p.header.round for p in parked_before_answer] == [OPEN + 1]
        assert member.engine.stats()["parked"] == 2
        assert member.engine.srtt is None
        assert member.engine.rto == pytest.approx(RTO_INITIAL)


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_a_park_after_the_switch_answered_keeps_the_rto(rule: str) -> None:
    """Where the switch answered since the packet left, its silence is a round held open for
    the others, not a round trip longer than the RTO: the park leaves the RTO as it was (seed
    9110370: a member's RTO doubled by a held round while the switch answered its other slots
    within milliseconds, and its first sample, one such wait, pinned it at rto_max)."""
    member = Member(**({"unlearned_park_backs_off_heard": True} if rule == "taken out" else {}))
    packet = member.first_contact()
    sent_at = member.now
    # The early look finds nothing heard since it left: the packet waits out the RTO.
    assert member.at(sent_at + 0.05) == [] and member.status == PENDING
    # Then the switch at work: the RESULT of a round before, of another chunk, closed by the
    # other member without me.
    earlier = wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=1, slot=SLOT,
                                      round=OPEN - 1, chunk=packet.header.chunk + 1, count=1,
                                      bitmap=0b10, mode=Mode.PARTIAL),
                          np.zeros(wire.LANES, np.int64)).encode()
    assert member.at(sent_at + 0.1, earlier) == [] and member.status == PENDING

    (copy,) = member.until_sent(sent_at + ROUND_TRIP)
    assert member.now == pytest.approx(sent_at + RTO_INITIAL)
    assert copy.header.round == OPEN and member.engine.parked() == [(0, packet.header.chunk)]
    assert member.engine.srtt is None
    assert member.engine.rto == pytest.approx(
        RTO_INITIAL if rule == "in" else 2 * RTO_INITIAL)


HELD = 0.25  # a round held open for the other member this long, shorter than the RTO


@pytest.mark.parametrize("rule", ["in", "taken out"])
def test_a_round_another_member_closed_teaches_no_round_trip(rule: str) -> None:
    """A partial RESULT that the other member's contribution closed held my packet in the round
    until that one came: the delay is the other's, not a round trip, and gives no RTT sample
    (docs/protocol.md §9, "Sync / partial sending", timeout). Taken for one, a wait before any
    other sample sets the RTO to four times that wait (seed 9009951 on the TNA model: a wait
    of 0.33 s pinned a member's RTO at rto_max, and 3 s later a packet of its waited out 0.23 s
    in a round held for others, its call far behind the others'). A RESULT of a round my own
    packet closed teaches the round trip."""
    member = Member(**({"held_result_samples_rtt": True} if rule == "taken out" else {}))
    packet = member.first_contact()
    sent_at = member.now
    # The early look finds nothing heard since it left, and the RTO is longer than the hold:
    # the packet waits in the open round, unparked, its first transmission.
    assert member.until_sent(sent_at + HELD) == [] and member.status == PENDING
    member.at(sent_at + HELD, closed_with_both(packet))  # closed by member 1's contribution
    assert member.status == DONE and member.engine.stats()["parked"] == 0
    if rule == "in":
        assert member.engine.srtt is None
        assert member.engine.rto == pytest.approx(RTO_INITIAL)
    else:  # the hold taken for a round trip
        assert member.engine.srtt == pytest.approx(HELD)
        assert member.engine.rto == pytest.approx(4 * HELD)

    # The next call's packet closes its round itself, a round trip after it left.
    member.now += 0.01
    packet = member.call()
    sent_at = member.now
    member.at(sent_at + 0.01, closed_with_both(packet, closer=0))
    assert member.status == DONE
    if rule == "in":
        assert member.engine.srtt == pytest.approx(0.01)

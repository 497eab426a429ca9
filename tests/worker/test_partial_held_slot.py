"""Partial: a call that starts on a slot held by a parked packet of the call before sends that
packet again at once and waits one RTO for its answer before it carries its chunks there, even
where the parked packet's own timer fell due between the calls (docs/protocol.md §9, "Sync /
partial sending", partial liveness; Flights::start_call).

Played against a switch scripted by hand: one slot, partial with a quorum of 2, a key of one
chunk. The first call's chunk 0 meets silence (the round waits for the other member), is
parked and settled; the worker then stays out of a call for longer than the parked packet's
period, so its timer falls due between the calls. The second call's resend of it is answered
by the round's RESULT at once, and the call sends its own chunk 0 at the next round: run before
the resend, the due timer carried that chunk at once and the call ended without sending it."""

from __future__ import annotations

import threading
import time

import numpy as np

from hysync import wire
from hysync.wire import Op, ResyncReason
from tests.worker.scripted_switch import (
    BACKSTOP,
    MINE,
    closed_with_both,
    member,
    receive,
    reply,
)

RTO = 1.0          # every RTO and the parked packet's period (rto_max)
STALL = 0.005      # the early look at a packet the switch is silent about
SLOW = 30.0        # no JOIN, no dead timer within the test


def test_a_call_on_a_held_slot_waits_for_the_parked_packets_answer():
    switch, tr = member(rto=RTO, stall=STALL, quiet=SLOW)
    worker = ("127.0.0.1", tr.address[1])
    outcomes: list = []

    def call() -> threading.Thread:
        caller = threading.Thread(target=lambda: outcomes.append(
            tr.allreduce("g", np.full(wire.LANES, MINE, dtype=np.float32))))
        caller.start()
        return caller

    caller = call()
    try:
        probe = receive(switch)
        # First contact: the slot is partial, its open round 0; chunk 0 is sent there.
        switch.sendto(reply(probe, op=Op.RESYNC, round=0, reason=ResyncReason.STALE_ROUND),
                      worker)
        sent = receive(switch)
        assert (sent.header.round, sent.header.chunk) == (0, 0)
        # Silence: the round waits for the other member. After one RTO the packet is parked
        # (sent again) and settled, and the call ends.
        parked = receive(switch)
        assert parked.header.flags & wire.Flag.RETRANSMIT
        caller.join(BACKSTOP)
        assert not caller.is_alive() and outcomes[0].stats.carried == 0
        # Out of a call for longer than the parked packet's period: its timer falls due.
        time.sleep(1.5 * RTO)
        caller = call()
        resent = receive(switch)
        assert (resent.header.round, resent.header.chunk) == (0, 0)
        # The other member came: round 0 closes, and the call's own chunk 0 goes out at the
        # slot's next round, not carried.
        switch.sendto(closed_with_both(resent), worker)
        while True:
            try:
                own = receive(switch, timeout=2 * RTO)
            except TimeoutError:
                raise AssertionError("chunk 0 never went out at round 1: the call carried it "
                                     "without waiting for the held packet's answer") from None
            if own.header.round != 0:  # (a copy of the held packet sent before the answer)
                break
        assert (own.header.round, own.header.chunk) == (1, 0)
        switch.sendto(closed_with_both(own), worker)
        caller.join(BACKSTOP)
        assert not caller.is_alive()
    finally:
        caller.join(BACKSTOP)
        tr.close()
        switch.close()
    stats = outcomes[1].stats
    assert (stats.included, stats.carried) == (1, 0), stats.summary()

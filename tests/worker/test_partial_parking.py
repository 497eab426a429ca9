"""Partial mode: a contribution the switch holds in an open round (waiting for the others'
next call) is parked, without waiting out an RTO when the switch has shown it is at work.

partial(2) of 3 members on 16 slots; key "x" lies on slots 0-7 and key "y" on slots 8-15.
The timers are stretched (RTO 2 s, stall_after 0.5 s) so that which rule parked a packet
shows in the counters, not in a timing."""

from __future__ import annotations

import threading

import numpy as np

from hysync import wire
from hysync.worker.transport import Transport
from tests.worker.partial_members import (
    CALL_WAIT_S,
    MEMBERS,
    install_partial,
    partial_member,
    together,
)

JOB, BASE, SLOTS = 12, 200, 16
HALF = SLOTS // 2 * wire.LANES  # a key of 8 chunks


def transport(switch, worker: int) -> Transport:
    return partial_member(switch, JOB, BASE, SLOTS, worker, rto=2.0, rto_max=4.0,
                          stall_after=0.5)


def test_a_held_contribution_is_parked_early_once_the_switch_answers_others(switch):
    a, b, c = (transport(switch, w) for w in range(MEMBERS))
    ones = np.ones(HALF, dtype=np.float32)
    try:
        install_partial(switch, JOB, BASE, SLOTS, (a, b, c))
        # a and b close every round of both keys: a learns that its slots are partial
        together(lambda: a.allreduce("x", ones), lambda: b.allreduce("x", ones))
        together(lambda: a.allreduce("y", ones), lambda: b.allreduce("y", ones))
        a.poll_results(0.2)

        # a's "y" waits alone; b and c close rounds of "x" meanwhile, which reach a too
        calls = {}
        waiting = threading.Thread(target=lambda: calls.update(y=a.allreduce("y", ones)))
        waiting.start()
        together(lambda: b.allreduce("x", ones), lambda: c.allreduce("x", ones))
        waiting.join(timeout=CALL_WAIT_S)
        held = calls["y"].stats
        # parked at stall_after on the evidence, with nothing sent again (no retransmission:
        # before the RTO)
        assert (held.parked, held.resent, held.retransmits) == (8, 0, 0), held.summary()

        # b's "y" closes the rounds holding a's parked packets: their results settle them
        b.allreduce("y", ones)
        assert a.finish(timeout=60.0).in_flight == 0

        # no answer from the switch meanwhile: parked at the first timeout, with one copy
        # each (it covers a loss)
        alone = a.allreduce("x", ones).stats
        assert (alone.parked, alone.resent, alone.retransmits) == (8, 8, 0), alone.summary()
    finally:
        for t in (a, b, c):
            t.close()

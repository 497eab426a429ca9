"""Partial mode: a contribution the switch holds in an open round (waiting for the others'
next call) is parked, without waiting out an RTO when the switch has shown it is at work.

partial(2) of 3 members on 16 slots; key "x" lies on slots 0-7 and key "y" on slots 8-15.
The timers are stretched (RTO 2 s, stall_after 0.5 s) so that which rule parked a packet
shows in the counters, not in a timing."""

from __future__ import annotations

import threading

import numpy as np

from hysync import wire
from hysync.wire import Mode
from hysync.worker.config import TransportConfig
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport
from tests.worker.conftest import Job

JOB, BASE, SLOTS, MEMBERS = 12, 200, 16, 3
HALF = SLOTS // 2 * wire.LANES  # a key of 8 chunks


def transport(switch, worker: int) -> Transport:
    config = TransportConfig(job_id=JOB, worker_id=worker, switch_host="127.0.0.1",
                             switch_port=switch.address[1], bind_host="127.0.0.1",
                             slot_base=BASE, slot_count=SLOTS, members=MEMBERS,
                             rto_initial=2.0, rto_min=2.0, rto_max=4.0, stall_after=0.5,
                             dead_after=20.0, seed=worker)
    return Transport(config, FixedPointQuantizer(2.0**20, MEMBERS))


def together(*calls) -> None:
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)


def test_a_held_contribution_is_parked_early_once_the_switch_answers_others(switch):
    a, b, c = (transport(switch, w) for w in range(MEMBERS))
    ones = np.ones(HALF, dtype=np.float32)
    try:
        switch.install(Job(JOB, BASE, SLOTS, [(w, *t.address) for w, t in
                                              enumerate((a, b, c))]), Mode.PARTIAL, quorum=2)
        # a and b close every round of both keys: a learns that its slots are partial
        together(lambda: a.allreduce("x", ones), lambda: b.allreduce("x", ones))
        together(lambda: a.allreduce("y", ones), lambda: b.allreduce("y", ones))
        a.poll_results(0.2)

        # a's "y" waits alone; b and c close rounds of "x" meanwhile, which reach a too
        calls = {}
        waiting = threading.Thread(target=lambda: calls.update(y=a.allreduce("y", ones)))
        waiting.start()
        together(lambda: b.allreduce("x", ones), lambda: c.allreduce("x", ones))
        waiting.join(timeout=20)
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

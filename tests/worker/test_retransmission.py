"""Retransmission when the switch is silent because the job waits, not because packets were
lost: a sync round cannot close before its late member contributes, and the early member's
window does not go out again packet by packet while it waits, nor, once it has seen the job
wait that long, at all."""

from __future__ import annotations

import threading
import time

import numpy as np

from hysync import wire
from tests.worker.conftest import Job
from tests.worker.test_failures import BASE, JOB, make_transport

SLOTS = 16
LATE_S = 0.4


def warm_pair(switch):
    """Two members of a sync job whose slots have all been heard from."""
    early = make_transport(switch.address[1], worker=0, members=2, slots=SLOTS)
    late = make_transport(switch.address[1], worker=1, members=2, slots=SLOTS)
    switch.install(Job(JOB, BASE, SLOTS, [(0, *early.address), (1, *late.address)]))
    warm = np.ones(SLOTS * wire.LANES, dtype=np.float32)  # every slot heard from: sync
    both = threading.Thread(target=late.allreduce, args=("w", warm))
    both.start()
    early.allreduce("w", warm)
    both.join(timeout=10)
    return early, late


def call_with_late_member(early, late, key: str, late_s: float, chunks_per_slot: int = 1):
    """One call of both; the late member starts `late_s` after the early one. Returns the
    early member's result."""
    # (within the quantizer's range for two members at its scale: +-341)
    values = np.arange(SLOTS * chunks_per_slot * wire.LANES, dtype=np.float32) % 300
    results = {}
    thread = threading.Thread(target=lambda: results.update(early=early.allreduce(key, values)))
    thread.start()
    time.sleep(late_s)  # every slot's round waits for the late member
    results["late"] = late.allreduce(key, values)
    thread.join(timeout=10)
    for r in results.values():
        np.testing.assert_allclose(r.output, values, atol=1e-4)
    return results["early"]


def test_a_window_waiting_on_a_late_member_is_probed_not_resent(switch):
    early, late = warm_pair(switch)
    try:
        stats = call_with_late_member(early, late, "g", LATE_S).stats
        # Over LATE_S, with timeouts from rto_initial (20 ms) up, resending every packet of the
        # window on its own timer resent each packet at least once; probing sends about one
        # packet per RTO, and the RTO doubles with each timeout.
        assert 0 < stats.retransmits <= SLOTS // 2, stats.retransmits
    finally:
        early.close()
        late.close()


def test_a_wait_the_job_has_just_been_through_is_not_probed_again(switch):
    """The early member's answers after a wait tell it the job waited (no loss). Hundreds of
    prompt answers later, which bring its RTO back to a few milliseconds, the same wait
    again within the second sends nothing; a longer one is probed."""
    early, late = warm_pair(switch)
    try:
        first = call_with_late_member(early, late, "g", 0.08).stats
        assert first.retransmits > 0  # the RTO was a few milliseconds: it probed
        prompt = call_with_late_member(early, late, "p", 0.0, chunks_per_slot=40).stats
        assert prompt.rto_s < 0.04, prompt.rto_s
        again = call_with_late_member(early, late, "g", 0.05).stats
        assert again.retransmits == 0, again.retransmits
        # 1.5 x the waits seen, but never over 0.1 s beyond the RTO (a lost last packet)
        longer = call_with_late_member(early, late, "g", 0.4).stats
        assert longer.retransmits > 0, "a wait longer than any seen was never probed"
    finally:
        early.close()
        late.close()

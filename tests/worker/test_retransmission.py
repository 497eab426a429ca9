"""Retransmission when the switch is silent because the job waits, not because packets were
lost: a sync round cannot close before its late member contributes, and the early member's
window does not go out again packet by packet while it waits."""

from __future__ import annotations

import threading
import time

import numpy as np

from hysync import wire
from tests.worker.conftest import Job
from tests.worker.test_failures import BASE, JOB, make_transport

SLOTS = 16
LATE_S = 0.4


def test_a_window_waiting_on_a_late_member_is_probed_not_resent(switch):
    early = make_transport(switch.address[1], worker=0, members=2, slots=SLOTS)
    late = make_transport(switch.address[1], worker=1, members=2, slots=SLOTS)
    try:
        switch.install(Job(JOB, BASE, SLOTS, [(0, *early.address), (1, *late.address)]))
        warm = np.ones(SLOTS * wire.LANES, dtype=np.float32)  # every slot heard from: sync
        both = threading.Thread(target=late.allreduce, args=("w", warm))
        both.start()
        early.allreduce("w", warm)
        both.join(timeout=10)
        values = np.arange(SLOTS * wire.LANES, dtype=np.float32)
        results = {}
        thread = threading.Thread(target=lambda: results.update(
            early=early.allreduce("g", values)))
        thread.start()
        time.sleep(LATE_S)  # every slot's round waits for the late member
        results["late"] = late.allreduce("g", values)
        thread.join(timeout=10)
        stats = results["early"].stats
        # Over LATE_S, with timeouts from rto_initial (20 ms) up, resending every packet of the
        # window on its own timer resent each packet at least once; probing sends about one
        # packet per RTO, and the RTO doubles with each timeout.
        assert 0 < stats.retransmits <= SLOTS // 2, stats.retransmits
        for r in results.values():
            np.testing.assert_allclose(r.output, values, atol=1e-4)
    finally:
        early.close()
        late.close()

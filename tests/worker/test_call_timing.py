"""A call's time split: how long the transport sat waiting for the switch (`waited_s`)."""

from __future__ import annotations

import threading
import time

import numpy as np

from tests.worker.conftest import Job
from tests.worker.test_failures import BASE, JOB, make_transport

LATE_S = 0.4


def test_the_early_member_of_a_sync_round_waits_for_the_late_one(switch):
    early = make_transport(switch.address[1], worker=0, members=2)
    late = make_transport(switch.address[1], worker=1, members=2)
    try:
        switch.install(Job(JOB, BASE, 4, [(0, *early.address), (1, *late.address)]))
        values = np.ones(200, dtype=np.float32)
        results = {}
        thread = threading.Thread(target=lambda: results.update(
            early=early.allreduce("g", values)))
        thread.start()
        time.sleep(LATE_S)  # the round cannot close before the late member contributes
        results["late"] = late.allreduce("g", values)
        thread.join(timeout=10)
        first, second = results["early"].stats, results["late"].stats
        # the early member spent the late one's delay blocked on the switch: waiting
        assert LATE_S * 0.8 <= first.waited_s <= first.elapsed_s
        # the late member found its round ready to close: it hardly waited
        assert second.waited_s <= second.elapsed_s < LATE_S / 2
        np.testing.assert_allclose(results["early"].output, values, atol=1e-5)
    finally:
        early.close()
        late.close()

"""A call's time split: how long the transport sat waiting for the switch (`waited_s`)."""

from __future__ import annotations

import threading
import time

import numpy as np

from tests.worker.conftest import Job
from tests.worker.test_failures import BASE, JOB, make_transport

LATE_S = 0.4


def test_the_early_member_of_a_sync_round_waits_for_the_late_one(switch):
    """The split says who waited: the early member's call, blocked on the switch until the
    late one contributed, not the late one's, which closed the round. (How long each took
    is timed by `bench.worker_bench --late`, docs/performance.md, "A straggler's call".)"""
    early = make_transport(switch.address[1], worker=0, members=2)
    late = make_transport(switch.address[1], worker=1, members=2)
    try:
        switch.install(Job(JOB, BASE, 4, [(0, *early.address), (1, *late.address)]))
        values = np.ones(200, dtype=np.float32)
        results, returned = {}, {}

        def early_call() -> None:
            results["early"] = early.allreduce("g", values)
            returned["early"] = time.monotonic()

        thread = threading.Thread(target=early_call)
        thread.start()
        time.sleep(LATE_S)  # the round cannot close before the late member contributes
        late_began = time.monotonic()
        results["late"] = late.allreduce("g", values)
        thread.join(timeout=60)
        assert not thread.is_alive(), "the early member's call never returned"
        first, second = results["early"].stats, results["late"].stats
        assert returned["early"] >= late_began  # its round waited for the late member
        assert 0 < first.waited_s <= first.elapsed_s
        assert second.waited_s <= second.elapsed_s
        assert first.waited_s > second.waited_s  # the wait is the early member's
        np.testing.assert_allclose(results["early"].output, values, atol=1e-5)
    finally:
        early.close()
        late.close()

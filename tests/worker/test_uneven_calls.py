"""HySyncWorker.uneven_calls: what model averaging asks before it averages (a job in
sync with every member keeps its replicas one model, so averaging skips its rounds)."""

from __future__ import annotations

import torch

from hysync.wire import Mode
from hysync.worker.api import HySyncWorker
from hysync.worker.config import TransportConfig
from tests.worker.conftest import Job


def worker(switch, job_id: int, slot_base: int) -> HySyncWorker:
    return HySyncWorker(TransportConfig(job_id=job_id, worker_id=0, switch_host="127.0.0.1",
                                        switch_port=switch.address[1], bind_host="127.0.0.1",
                                        slot_base=slot_base, slot_count=8, members=1, seed=0))


def test_sync_calls_are_even_and_an_async_call_is_not(switch):
    with worker(switch, 7, 40) as sync, worker(switch, 8, 60) as solo:
        switch.install(Job(7, 40, 8, [(0, *sync.address)]), Mode.SYNC)
        switch.install(Job(8, 60, 8, [(0, *solo.address)]), Mode.ASYNC)
        for _ in range(3):
            sync.allreduce(torch.ones(1000), key="g")
        assert sync.uneven_calls == 0
        solo.allreduce(torch.ones(1000), key="g")
        # its results are async rounds, applied as a member's share of the mean
        assert solo.uneven_calls == 1
        assert solo.last_stats().modes == {"async": 16}

"""HySyncJob.finish behind a leaf: the rank's flights keep retrying until settled before it
leaves the job (docs/protocol.md §11, "What a host does"), so the leave never strands a
contribution its leaf still holds. On one switch (not behind a leaf) the rank leaves at once.
A softswitch in partial(2) of 3 members parks the rank's contribution in an open round."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch.distributed as dist

from hysync import wire
from hysync.torch import HySyncJob
from hysync.wire import Mode
from hysync.worker.api import HySyncWorker
from tests.worker.conftest import Job
from tests.worker.test_finish import BASE, JOB, MEMBERS, SLOTS, together, transport


@pytest.fixture()
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


class Left:
    def text(self, job_id: int) -> str:
        return f"job {job_id}: left"


def rank_job(worker: HySyncWorker, left_with: dict) -> HySyncJob:
    """A one-rank job whose leave records what the rank still had in flight when it left."""
    def leave() -> Left:
        left_with["in_flight"] = worker.transport.finish(timeout=0).in_flight
        return Left()
    job = {"job_id": JOB, "slot_base": BASE, "slot_count": SLOTS}
    return HySyncJob(0, 1, job, worker, state=None, serve=None, averaging=None,  # type: ignore[arg-type]
                     leave=leave)


@pytest.mark.parametrize("behind_leaf", [True, False], ids=["behind-a-leaf", "one-switch"])
def test_a_rank_behind_a_leaf_settles_its_flights_before_it_leaves(switch, one_rank_group,
                                                                   behind_leaf):
    a0, b, c = (transport(switch, w) for w in range(MEMBERS))
    config = dataclasses.replace(a0.config, behind_leaf=behind_leaf)
    a0.close()
    worker = HySyncWorker(config, scale=2.0**20)
    a = worker.transport
    ones = np.ones(SLOTS * wire.LANES, dtype=np.float32)
    left_with: dict = {}
    try:
        switch.install(Job(JOB, BASE, SLOTS, [(w, *t.address) for w, t in
                                              enumerate((a, b, c))]), Mode.PARTIAL, quorum=2)
        together(lambda: a.allreduce("x", ones), lambda: b.allreduce("x", ones))
        # a's next contribution waits alone in open rounds: the call returns with it parked
        assert a.allreduce("x", ones).stats.in_flight == SLOTS

        job = rank_job(worker, left_with)
        finishing = threading.Thread(target=job.finish)
        finishing.start()
        if behind_leaf:
            b.allreduce("x", ones)  # closes the rounds that hold a's packets
        finishing.join(timeout=60)
        assert not finishing.is_alive()
        assert left_with["in_flight"] == (0 if behind_leaf else SLOTS)
    finally:
        for t in (b, c):
            t.close()
        worker.close()

"""Transport.finish: after its last call a worker keeps what it has in flight retrying until
each packet is settled (docs/protocol.md §11, "What a host does": behind a leaf these retries
are what move the leaf's pending sum). A softswitch in partial(2) of 3 members parks a
worker's contribution in an open round; finish waits for the round another member closes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hysync import wire
from hysync.wire import Mode
from hysync.worker.config import TransportConfig
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport
from tests.worker.conftest import Job

JOB, BASE, SLOTS, MEMBERS = 14, 300, 2, 3
N = SLOTS * wire.LANES


def transport(switch, worker: int) -> Transport:
    config = TransportConfig(job_id=JOB, worker_id=worker, switch_host="127.0.0.1",
                             switch_port=switch.address[1], bind_host="127.0.0.1",
                             slot_base=BASE, slot_count=SLOTS, members=MEMBERS,
                             rto_initial=0.2, rto_min=0.2, rto_max=0.4, stall_after=0.1,
                             dead_after=20.0, seed=worker)
    return Transport(config, FixedPointQuantizer(2.0**20, MEMBERS))


def together(*calls) -> None:
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)


def test_finish_keeps_a_parked_contribution_retrying_until_its_round_closes(switch):
    a, b, c = (transport(switch, w) for w in range(MEMBERS))
    ones = np.ones(N, dtype=np.float32)
    try:
        switch.install(Job(JOB, BASE, SLOTS, [(w, *t.address) for w, t in
                                              enumerate((a, b, c))]), Mode.PARTIAL, quorum=2)
        together(lambda: a.allreduce("x", ones), lambda: b.allreduce("x", ones))
        # a's next contribution waits alone in open rounds: the call returns with it parked
        assert a.allreduce("x", ones).stats.in_flight == SLOTS

        finished = {}
        finishing = threading.Thread(target=lambda: finished.update(stats=a.finish()))
        finishing.start()
        b.allreduce("x", ones)  # closes the rounds that hold a's packets
        finishing.join(timeout=30)
        assert finished["stats"].in_flight == 0
        assert a.finish().in_flight == 0  # nothing left: returns at once
    finally:
        for t in (a, b, c):
            t.close()


def test_finish_gives_up_after_its_timeout_with_what_is_unsettled(switch):
    a, b, c = (transport(switch, w) for w in range(MEMBERS))
    ones = np.ones(N, dtype=np.float32)
    try:
        switch.install(Job(JOB, BASE, SLOTS, [(w, *t.address) for w, t in
                                              enumerate((a, b, c))]), Mode.PARTIAL, quorum=2)
        together(lambda: a.allreduce("x", ones), lambda: b.allreduce("x", ones))
        assert a.allreduce("x", ones).stats.in_flight == SLOTS
        # no other member sends: the rounds stay open and finish reports the packets it held
        assert a.finish(timeout=0.5).in_flight == SLOTS
        with pytest.raises(ValueError, match="negative"):
            a.finish(timeout=-1)
    finally:
        for t in (a, b, c):
            t.close()

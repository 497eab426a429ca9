"""Transport.finish: after its last call a worker keeps what it has in flight retrying until
each packet is settled (docs/protocol.md §11, "What a host does": behind a leaf these retries
are what move the leaf's pending sum). A softswitch in partial(2) of 3 members parks a
worker's contribution in an open round; finish waits for the round another member closes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from hysync import wire
from hysync.worker.transport import Transport
from tests.worker.partial_members import (
    CALL_WAIT_S,
    MEMBERS,
    install_partial,
    partial_member,
    together,
)

JOB, BASE, SLOTS = 14, 300, 2
N = SLOTS * wire.LANES


def transport(switch, worker: int) -> Transport:
    return partial_member(switch, JOB, BASE, SLOTS, worker, rto=0.2, rto_max=0.4,
                          stall_after=0.1)


@contextmanager
def parked(switch) -> Iterator[tuple[Transport, Transport]]:
    """Members a and b after a's second call returned with its contributions parked,
    waiting alone in open rounds."""
    a, b, c = (transport(switch, w) for w in range(MEMBERS))
    ones = np.ones(N, dtype=np.float32)
    try:
        install_partial(switch, JOB, BASE, SLOTS, (a, b, c))
        together(lambda: a.allreduce("x", ones), lambda: b.allreduce("x", ones))
        assert a.allreduce("x", ones).stats.in_flight == SLOTS
        yield a, b
    finally:
        for t in (a, b, c):
            t.close()


def test_finish_keeps_a_parked_contribution_retrying_until_its_round_closes(switch):
    with parked(switch) as (a, b):
        finished = {}
        finishing = threading.Thread(target=lambda: finished.update(stats=a.finish()))
        finishing.start()
        b.allreduce("x", np.ones(N, dtype=np.float32))  # closes the rounds holding a's packets
        finishing.join(timeout=CALL_WAIT_S)
        assert finished["stats"].in_flight == 0
        assert a.finish().in_flight == 0  # nothing left: returns at once


def test_finish_gives_up_after_its_timeout_with_what_is_unsettled(switch):
    with parked(switch) as (a, _b):
        # no other member sends: the rounds stay open and finish reports the packets it held
        assert a.finish(timeout=0.5).in_flight == SLOTS
        with pytest.raises(ValueError, match="negative"):
            a.finish(timeout=-1)

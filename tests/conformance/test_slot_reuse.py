"""A job that reuses a removed job's slots starts them clean (docs/protocol.md §4 step 8).

Each case leaves a removed job's traces in a slot (a stored result and a half-full round in
sync/partial, counted sequence numbers in async), installs another job with a new epoch on
the same slots, and checks that the new job meets the slot as if it had never been used:
round 0, nothing open, nothing to resend, nobody counted.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hysync import wire
from hysync.wire import Flag, Mode, ResyncReason

from .conftest import install, uninstall
from .topology import (
    Job,
    Member,
    ack,
    contribution,
    lanes_of,
    multicast,
    result,
    resync,
    unicast,
    wrap_sum,
)

SLOT, CHUNK = 5, 9
HOSTS = (Member(0, 1), Member(1, 2), Member(2, 3))
OLD = Job(1, 0, 16, HOSTS, epoch=0x1111)
NEW = Job(5, 0, 16, HOSTS, epoch=0x2222)
QUORUM = {Mode.SYNC: 0, Mode.PARTIAL: 2, Mode.ASYNC: 0}
OLD_LANES = np.full(wire.LANES, 7, dtype=np.int32)
COUNTED = 1  # the round (or async sequence number) the old job last counted worker 0 in
MODES = (Mode.SYNC, Mode.PARTIAL, Mode.ASYNC)


def send(target, job: Job, w: int, rnd: int, lanes: np.ndarray | None = None, **kw):
    return target.send(job.member(w).port, contribution(job, w, SLOT, rnd, CHUNK, lanes, **kw))


def leave_traces(target, mode: int) -> None:
    """Run the old job in `mode` until it leaves state behind, then remove it."""
    install(target, OLD, mode, QUORUM[mode])
    if mode == Mode.ASYNC:
        assert send(target, OLD, 1, 0x77, OLD_LANES) != []
        assert send(target, OLD, 0, COUNTED, OLD_LANES) != []
    else:
        for w in (0, 1, 2):  # round 0 closes (partial: at worker 1) and is stored
            send(target, OLD, w, 0, OLD_LANES)
        assert send(target, OLD, 0, COUNTED, OLD_LANES) == []  # round 1: open, worker 0 in
    uninstall(target, OLD, mode, QUORUM[mode])


@pytest.mark.parametrize("old_mode,new_mode", list(itertools.product(MODES, MODES)),
                         ids=lambda m: Mode(m).name.lower())
def test_a_reused_slot_starts_clean(bare_target, old_mode, new_mode):
    t = bare_target
    leave_traces(t, old_mode)
    q = QUORUM[new_mode]
    install(t, NEW, new_mode, q)
    if new_mode == Mode.ASYNC:
        # The old job's worker 0 was counted with this sequence number; the new one is not.
        out = send(t, NEW, 0, COUNTED)
        assert out == multicast(NEW, result(NEW, 0, SLOT, 0, CHUNK, 0b001, lanes_of(0),
                                            mode=Mode.ASYNC))
        assert send(t, NEW, 0, COUNTED, flags=Flag.RETRANSMIT) == unicast(
            NEW, 0, ack(NEW, 0, SLOT, COUNTED, CHUNK))
        return

    def fresh(reason: int) -> bytes:
        return resync(NEW, 0, SLOT, open_round=0, chunk=0, count=0, bitmap=0, reason=reason,
                      mode=new_mode, quorum=q)

    # Nothing to resend: the round before round 0 is not the old job's last result.
    assert send(t, NEW, 0, 0xFFFFFFFF) == unicast(NEW, 0, fresh(ResyncReason.STALE_ROUND))
    # Worker 0 of the old job was counted in round 1; this worker 0 was not.
    assert send(t, NEW, 0, COUNTED) == unicast(NEW, 0, fresh(ResyncReason.STALE_ROUND))
    # Round 0 opens empty: the old job's half-full round and its latched mode are gone.
    assert send(t, NEW, 1, 0) == []
    last = send(t, NEW, 2, 0)
    if new_mode == Mode.SYNC:
        assert last == []
        last = send(t, NEW, 0, 0)
        bitmap, summed = 0b111, wrap_sum(lanes_of(0), lanes_of(1), lanes_of(2))
        closer = 0
    else:
        bitmap, summed, closer = 0b110, wrap_sum(lanes_of(1), lanes_of(2)), 2
    assert last == multicast(NEW, result(NEW, closer, SLOT, 0, CHUNK, bitmap, summed,
                                         mode=new_mode, quorum=q))


def test_a_membership_change_keeps_the_epoch_and_the_open_round(bare_target):
    """Only a new epoch starts a slot afresh: an exclusion (same epoch) keeps the round."""
    t = bare_target
    install(t, NEW)
    assert send(t, NEW, 0, 0) == []
    assert send(t, NEW, 1, 0) == []
    uninstall(t, NEW)
    install(t, NEW, active=(0, 1))  # worker 2 excluded: n = 2, the open round is complete
    out = send(t, NEW, 1, 0, flags=Flag.RETRANSMIT)
    assert out == multicast(NEW, result(NEW, 1, SLOT, 0, CHUNK, 0b011,
                                        wrap_sum(lanes_of(0), lanes_of(1))), members=(0, 1))

"""A switch restart mid-round (docs/protocol.md §9, "A switch that lost the job's state").

The job runs until a round is under way, the switch restarts (every register, entry and
group gone) and the job is installed again under a new epoch. The old round's packets then
meet the new state: round 0 (a STALE_ROUND whose open round is behind the worker's, which
the worker's round rule reads as new state), and every RESULT and ACK of the new install
carries the new install tag, which the worker tells from the old one.
"""

from __future__ import annotations

import pytest

from hysync import wire
from hysync.wire import Flag, Mode, ResyncReason

from .conftest import install
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

SLOT, CHUNK = 3, 4
HOSTS = tuple(Member(w, w + 1) for w in range(3))
BEFORE = Job(2, 0, 16, HOSTS, epoch=0x5A01)
AFTER = Job(2, 0, 16, HOSTS, epoch=0x5A02)  # the same job, installed again
QUORUM = {Mode.SYNC: 0, Mode.PARTIAL: 2, Mode.ASYNC: 0}
SEQ = 0x40  # an async sequence number


def send(target, job: Job, w: int, rnd: int, **kw) -> list[tuple[int, bytes]]:
    return target.send(job.member(w).port, contribution(job, w, SLOT, rnd, CHUNK, **kw))


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.PARTIAL, Mode.ASYNC],
                         ids=["sync", "partial", "async"])
def test_a_restart_mid_round_meets_round_0_and_a_new_install_tag(bare_target, mode):
    t, q = bare_target, QUORUM[mode]
    assert wire.install_tag(BEFORE.epoch) != wire.install_tag(AFTER.epoch)
    install(t, BEFORE, mode, q)
    if mode == Mode.ASYNC:
        assert send(t, BEFORE, 0, SEQ) == multicast(BEFORE, result(
            BEFORE, 0, SLOT, 0, CHUNK, 0b001, lanes_of(0), mode=mode))
    else:
        for w in (0, 1, 2):  # round 0 closes; round 1 opens with worker 0 in it
            send(t, BEFORE, w, 0)
        assert send(t, BEFORE, 0, 1) == []
    t.restart()
    install(t, AFTER, mode, q)
    if mode == Mode.ASYNC:
        # Not counted in this install: counted again, in round 0, under the new tag; its
        # retransmission is acknowledged under the new tag too.
        assert send(t, AFTER, 0, SEQ) == multicast(AFTER, result(
            AFTER, 0, SLOT, 0, CHUNK, 0b001, lanes_of(0), mode=mode))
        assert send(t, AFTER, 0, SEQ, flags=Flag.RETRANSMIT) == unicast(
            AFTER, 0, ack(AFTER, 0, SLOT, SEQ, CHUNK))
        return
    # Worker 1's packet for the old open round: the new state's open round is 0, behind it.
    assert send(t, AFTER, 1, 1) == unicast(AFTER, 1, resync(
        AFTER, 1, SLOT, open_round=0, chunk=0, count=0, bitmap=0,
        reason=ResyncReason.STALE_ROUND, mode=mode, quorum=q))
    # Round 0 of the new install closes, tagged with its epoch.
    needed = (0, 1, 2) if mode == Mode.SYNC else (0, 1)
    for w in needed[:-1]:
        assert send(t, AFTER, w, 0) == []
    last = needed[-1]
    summed = wrap_sum(*(lanes_of(w) for w in needed))
    bitmap = sum(1 << w for w in needed)
    assert send(t, AFTER, last, 0) == multicast(AFTER, result(
        AFTER, last, SLOT, 0, CHUNK, bitmap, summed, mode=mode, quorum=q))

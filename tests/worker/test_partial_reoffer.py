"""Partial: a chunk of the call that a round of another chunk of its key displaced
(CHUNK_MISMATCH) is offered again within the call once that round closes, as a residual-only
contribution of exactly the amount it carried (docs/protocol.md §9, "Displaced chunks").

Played against a switch scripted by hand: one slot, partial with a quorum of 2, a key of
three chunks. The call's chunk 0 meets the other member's round of chunk 2, joins it with its
own chunk 2 and carries chunk 0; once that round's RESULT arrives, chunk 0 goes out again at
the next round, before chunk 1 (no round has closed with either; the fixed order breaks the
tie), carrying the lanes of the packet that was displaced."""

from __future__ import annotations

import threading

import numpy as np

from hysync import wire
from hysync.wire import Op, ResyncReason
from tests.worker.scripted_switch import (
    BACKSTOP,
    MINE,
    OTHERS,
    SCALE,
    closed_with_both,
    member,
    receive,
    reply,
)

SLOW = 30.0  # no retransmission, no parking, no JOIN within the test: only replies move it


def test_a_displaced_chunk_is_offered_again_once_the_round_that_displaced_it_closes():
    switch, tr = member(rto=SLOW, stall=SLOW, quiet=SLOW)
    worker = ("127.0.0.1", tr.address[1])
    outcome: dict = {}
    caller = threading.Thread(target=lambda: outcome.update(
        result=tr.allreduce("g", np.full(3 * wire.LANES, MINE, dtype=np.float32))))
    caller.start()
    try:
        probe = receive(switch)
        assert (probe.header.op, probe.header.chunk) == (Op.CONTRIB, 0)
        # First contact: the slot is partial, its open round 0; chunk 0 is sent there.
        switch.sendto(reply(probe, op=Op.RESYNC, round=0, reason=ResyncReason.STALE_ROUND),
                      worker)
        displaced = receive(switch)
        assert (displaced.header.round, displaced.header.chunk) == (0, 0)
        # The other member opened round 0 with chunk 2: the worker joins it with its own.
        switch.sendto(reply(displaced, op=Op.RESYNC, round=0, chunk=2,
                            reason=ResyncReason.CHUNK_MISMATCH), worker)
        joined = receive(switch)
        assert (joined.header.round, joined.header.chunk) == (0, 2)
        # Round 0 closes: chunk 0 is offered again at round 1, before chunk 1, with what the
        # displaced packet carried (its amount, back in the residual, moves into this one).
        switch.sendto(closed_with_both(joined), worker)
        again = receive(switch)
        assert (again.header.round, again.header.chunk) == (1, 0)
        np.testing.assert_array_equal(again.lanes, displaced.lanes)
        switch.sendto(closed_with_both(again), worker)
        last = receive(switch)
        assert (last.header.round, last.header.chunk) == (2, 1)
        switch.sendto(closed_with_both(last), worker)
        caller.join(BACKSTOP)
        assert not caller.is_alive()
    finally:
        caller.join(BACKSTOP)
        tr.close()
        switch.close()
    result = outcome["result"]
    # chunk 0 was carried by the call's own packet, then counted through the re-offer: every
    # chunk's output is its round's mean, and nothing was sent twice.
    assert (result.stats.included, result.stats.carried) == (2, 1), result.stats.summary()
    assert result.stats.residual_contribs == 1
    np.testing.assert_allclose(result.output, (MINE + OTHERS) / 2, atol=1.0 / SCALE)

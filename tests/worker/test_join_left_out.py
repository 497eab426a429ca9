"""A JOIN behind its slot whose named round closed without me (docs/protocol.md §9, "Swap
storms", JOIN): the switch answers it with that round's stored result, a RESEND without my
bit (here a peer's async round, another chunk's), and the slot's open round is the next one,
which may be waiting for me. The JOIN's residual is carried, and the JOIN goes to that next
round at once, not after another `join_after`.

Played against a switch scripted by hand: one member of two, two slots. The call's chunk on
slot A is held without a word (the call makes no progress); its chunk on slot B closes round
5 with both members. After `join_after` the worker offers idle slot B a JOIN at round 6; the
switch answers it with round 6's RESEND, and the next packet on slot B must be a JOIN at
round 7, well within `join_after` of that answer."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from hysync import wire
from hysync.wire import Flag, Mode, Op, ResyncReason
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport, TransportConfig
from tests.worker.scripted_switch import (
    BACKSTOP,
    JOB,
    MINE,
    OTHERS,
    SCALE,
    SLOT,
    closed_with_both,
    receive,
)

JOIN_AFTER = 2.0
NEVER = 600.0  # no retransmission: nothing but replies and the JOIN period wakes it
PEER_ASYNC = 0.125


def stale_round(probe: wire.Packet) -> bytes:
    """First contact: the slot runs sync and its open round is 5 (the worker sends again there)."""
    h = probe.header
    return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=h.slot, mode=Mode.SYNC,
                       round=5, reason=ResyncReason.STALE_ROUND,
                       flags=h.flags & wire.TX_MASK).pack()


def resend_without_me(join: wire.Packet, chunk: int) -> bytes:
    """The stored result of the round the JOIN named: member 1's async round of `chunk`,
    unicast back to the JOIN's sender with its transmission number echoed."""
    h = join.header
    lanes = np.full(wire.LANES, int(PEER_ASYNC * SCALE), np.int64)
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=h.slot,
                                   round=h.round, chunk=chunk, count=1, bitmap=0b10,
                                   mode=Mode.ASYNC,
                                   flags=Flag.RESEND | (h.flags & wire.TX_MASK)),
                       lanes).encode()


def test_a_join_answered_by_a_resend_without_its_bit_goes_to_the_next_round_at_once():
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             switch_port=switch.getsockname()[1], bind_host="127.0.0.1",
                             slot_base=SLOT, slot_count=2, members=2, rto_initial=NEVER,
                             rto_min=NEVER, rto_max=NEVER, join_after=JOIN_AFTER,
                             dead_after=BACKSTOP, seed=5)
    tr = Transport(config, FixedPointQuantizer(SCALE, 2))
    outcome: dict[str, object] = {}

    def call() -> None:
        outcome["result"] = tr.allreduce("g", np.full(2 * wire.LANES, MINE, np.float32))

    caller = threading.Thread(target=call, daemon=True)
    try:
        caller.start()
        for probe in (receive(switch), receive(switch)):
            switch.sendto(stale_round(probe), tr.address)
        sent = {p.header.slot: p for p in (receive(switch), receive(switch))}
        assert set(sent) == {SLOT, SLOT + 1}
        assert all(p.header.round == 5 for p in sent.values())
        held, closing = sent[SLOT], sent[SLOT + 1]
        switch.sendto(closed_with_both(closing, Mode.SYNC), tr.address)

        join = receive(switch)  # after join_after without progress: idle slot B
        assert join.header.slot == SLOT + 1 and join.header.flags & Flag.JOIN
        assert join.header.round == 6, join.header
        switch.sendto(resend_without_me(join, held.header.chunk), tr.address)
        answered = time.monotonic()

        again = receive(switch)
        waited = time.monotonic() - answered
        assert again.header.slot == SLOT + 1 and again.header.flags & Flag.JOIN, again.header
        assert again.header.round == 7, (
            f"the JOIN went to round {again.header.round}, not the round after the one the "
            f"RESEND answered")
        assert waited < JOIN_AFTER / 2, (
            f"the JOIN came {waited:.2f} s after the RESEND that carried it: it waited for "
            f"another join_after ({JOIN_AFTER:g} s) while round 7 may wait for it")
        # The re-offered JOIN carries what the first one did: the residual of chunk 1, which
        # round 5 left at its quantization error (nothing), so it holds no gradient.
        np.testing.assert_array_equal(again.lanes, join.lanes)

        switch.sendto(closed_with_both(held, Mode.SYNC), tr.address)
        caller.join(BACKSTOP)
        assert not caller.is_alive(), "the call never ended"
        result = outcome["result"]
        assert result.stats.joins == 2, result.stats.summary()  # the one re-offer, no more
        out = result.output.reshape(2, wire.LANES)
        first = tr.first_chunk("g")
        # Slot B's chunk: round 5's mean. Slot A's: its round's mean, and the peer's async
        # round the RESEND brought (applied once, as its share of the mean: / members).
        np.testing.assert_allclose(out[closing.header.chunk - first], (MINE + OTHERS) / 2)
        np.testing.assert_allclose(out[held.header.chunk - first],
                                   (MINE + OTHERS) / 2 + PEER_ASYNC / 2)
    finally:
        caller.join(BACKSTOP)
        tr.close()
        switch.close()

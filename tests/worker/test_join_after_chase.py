"""A displaced chunk that the call before chased is not the call's progress (docs/protocol.md
§9, "Swap storms", JOIN, and "Displaced chunks"): when its round closes during the next call,
that call's `join_after` still counts from its start, so its idle slots are offered a JOIN
on time, not `join_after` after that result.

Played against a switch scripted by hand: one member of two, two sync slots A and B. Call 1
(key "g": chunk 0 on A, chunk 1 on B) meets on A the open round of chunk 2 (CHUNK_MISMATCH),
joins it, and once that round closes chases chunk 0 at A's next round, which the switch holds
without a word; then B's round closes and the call ends. Call 2 (key "h": chunk 2 on A)
waits on A behind that packet; B is idle. Part of `join_after` into call 2 the chased chunk's
round closes, and the call's own chunk is held in the next round: the JOIN on B must come
`join_after` after the call's start."""

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
    SCALE,
    SLOT,
    closed_with_both,
    receive,
)

JOIN_AFTER = 2.0
CHASE_CLOSES = 0.6 * JOIN_AFTER  # into call 2: the chased chunk's round closes
NEVER = 600.0  # no retransmission: nothing but replies and the JOIN period wakes it


def resync(packet: wire.Packet, reason: ResyncReason, *, chunk: int = 0, count: int = 0,
           bitmap: int = 0) -> bytes:
    """A RESYNC of the packet's slot, sync with round 5 open, its transmission echoed."""
    h = packet.header
    return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=h.slot, mode=Mode.SYNC,
                       round=5, chunk=chunk, count=count, bitmap=bitmap, reason=reason,
                       flags=h.flags & wire.TX_MASK).pack()


def test_a_chased_chunk_of_the_call_before_does_not_put_off_the_join():
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             switch_port=switch.getsockname()[1], bind_host="127.0.0.1",
                             slot_base=SLOT, slot_count=2, members=2, rto_initial=NEVER,
                             rto_min=NEVER, rto_max=NEVER, join_after=JOIN_AFTER,
                             dead_after=BACKSTOP, seed=5)
    tr = Transport(config, FixedPointQuantizer(SCALE, 2))
    outcome: dict[str, object] = {}

    def calls() -> None:
        tr.allreduce("g", np.full(2 * wire.LANES, MINE, np.float32))
        outcome["second_started"] = time.monotonic()
        outcome["result"] = tr.allreduce("h", np.full(wire.LANES, MINE, np.float32))

    caller = threading.Thread(target=calls, daemon=True)
    try:
        caller.start()
        for probe in (receive(switch), receive(switch)):
            switch.sendto(resync(probe, ResyncReason.STALE_ROUND), tr.address)
        sent = {p.header.slot: p for p in (receive(switch), receive(switch))}
        assert set(sent) == {SLOT, SLOT + 1} and all(p.header.round == 5 for p in sent.values())
        displaced = sent[SLOT].header.chunk
        # A's round 5 aggregates chunk 2 (the peer's): call 1's chunk on A joins it.
        switch.sendto(resync(sent[SLOT], ResyncReason.CHUNK_MISMATCH, chunk=2, count=1,
                             bitmap=0b10), tr.address)
        joined = receive(switch)
        assert joined.header.slot == SLOT and joined.header.chunk == 2, joined.header
        switch.sendto(closed_with_both(joined, Mode.SYNC), tr.address)
        chased = receive(switch)  # held without a word: its round waits for the peer
        assert chased.header.slot == SLOT and chased.header.chunk == displaced, chased.header
        assert chased.header.round == 6, chased.header
        switch.sendto(closed_with_both(sent[SLOT + 1], Mode.SYNC), tr.address)  # call 1 ends
        deadline = time.monotonic() + BACKSTOP
        while "second_started" not in outcome and time.monotonic() < deadline:
            time.sleep(0.01)
        started = outcome["second_started"]

        time.sleep(max(0.0, started + CHASE_CLOSES - time.monotonic()))
        switch.sendto(closed_with_both(chased, Mode.SYNC), tr.address)
        own = receive(switch)  # call 2's chunk, held in round 7
        assert own.header.slot == SLOT and own.header.chunk == 2, own.header
        assert own.header.round == 7 and not own.header.flags & Flag.JOIN, own.header

        join = receive(switch)
        waited = time.monotonic() - started
        assert join.header.slot == SLOT + 1 and join.header.flags & Flag.JOIN, join.header
        assert waited < JOIN_AFTER + (CHASE_CLOSES / 2), (
            f"the JOIN of idle slot B came {waited:.2f} s into the call: the chased chunk of "
            f"the call before, settled {CHASE_CLOSES:.2f} s in, was taken for the call's "
            f"progress (join_after {JOIN_AFTER:g} s)")
        assert waited >= JOIN_AFTER * 0.9, f"the JOIN came {waited:.2f} s into the call"

        switch.sendto(resync(join, ResyncReason.NOT_JOINED), tr.address)
        switch.sendto(closed_with_both(own, Mode.SYNC), tr.address)
        caller.join(BACKSTOP)
        assert not caller.is_alive(), "the call never ended"
        assert outcome["result"].stats.joins == 1, outcome["result"].stats.summary()
    finally:
        caller.join(BACKSTOP)
        tr.close()
        switch.close()

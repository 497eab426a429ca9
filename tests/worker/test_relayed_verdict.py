"""A host behind a leaf switch (docs/protocol.md §11, "What a host does"): the spine's verdict
on the leaf's sum that holds the host's contribution, relayed by the leaf (RESYNC, flag
RELAYED), settles the host's flight whatever transmission it echoes; and the leaf's STALE
answer for the round it just closed (its sum still at the spine) is a refusal, not a new
switch state.

The host is the worker engine on its in-memory backend, the leaf's replies written by hand,
so each case is exactly the datagram it names.
"""

from __future__ import annotations

import numpy as np
import pytest

from hysync import wire
from hysync.wire import Flag, Mode, Op, ResyncReason
from hysync.worker.config import engine_config
from tests.worker.scripted_switch import engine_with_faults

JOB, ME, UPLINK_ID = 1, 1, 0  # the host is worker 1 of its leaf; the leaf is member 0 upstairs
OPEN = 5                       # the round the leaf teaches the host first
DONE, PENDING, RESET = 0, 3, 4


class Host:
    """One host's engine in a call of two chunks on one slot, taught round OPEN."""

    def __init__(self, mode: Mode, behind_leaf: bool = True, **faults: bool) -> None:
        config = engine_config(job_id=JOB, worker_id=ME, slot_base=0, slot_count=1, members=6,
                               scale=2.0**20, rto_initial=0.02, rto_min=0.02, seed=5,
                               behind_leaf=behind_leaf)
        self.engine = engine_with_faults(config, **faults)
        self.engine.register("g", 2 * wire.LANES)
        self.first = self.engine.first_chunk("g")
        self.now = 0.0
        self.values = np.full(2 * wire.LANES, 0.25, dtype=np.float32)
        self.engine.set_time(self.now)
        self.engine.begin_call("g", self.values)
        self.status = self.engine.step(self.now)
        probe = self.sent_one()
        # The leaf answers the first contact with its open round (a probe is decided at once).
        self.hand(self.resync(ResyncReason.STALE_ROUND, OPEN, self.first, mode,
                              echo=self.tx(probe)))
        self.flight = self.sent_one()
        assert (self.flight.round, self.flight.chunk) == (OPEN, self.first)

    def sent(self) -> list[wire.Header]:
        return [wire.Header.unpack(d) for d in self.engine.take_sent()]

    def sent_one(self) -> wire.Header:
        out = self.sent()
        assert len(out) == 1, out
        return out[0]

    @staticmethod
    def tx(h: wire.Header) -> int:
        return (h.flags & wire.TX_MASK) >> wire.TX_SHIFT

    @staticmethod
    def resync(reason: ResyncReason, rnd: int, chunk: int, mode: Mode, echo: int = 0,
               flags: int = 0, bitmap: int = 0, worker: int = ME) -> bytes:
        return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=worker, slot=0, round=rnd,
                           chunk=chunk, mode=mode, reason=reason, bitmap=bitmap,
                           flags=flags | echo << wire.TX_SHIFT).pack()

    def relayed(self, reason: ResyncReason, rnd: int, chunk: int, mode: Mode,
                bitmap: int = 1 << ME | 1 << 3) -> bytes:
        """The leaf's relay: the leaf's member id upstairs, no echo of mine."""
        return self.resync(reason, rnd, chunk, mode, flags=Flag.RELAYED, bitmap=bitmap,
                           worker=UPLINK_ID)

    def hand(self, data: bytes) -> None:
        self.now += 0.001
        self.engine.set_time(self.now)
        self.engine.on_datagram(data, self.now)
        self.status = self.engine.step(self.now)

    def stats(self) -> dict:
        return self.engine.stats()


def test_relayed_stale_round_in_sync_sends_again_at_the_spines_round() -> None:
    host = Host(Mode.SYNC)
    host.hand(host.relayed(ResyncReason.STALE_ROUND, OPEN + 3, host.first, Mode.SYNC))
    again = host.sent_one()
    assert (again.op, again.round, again.chunk) == (Op.CONTRIB, OPEN + 3, host.first)
    stats = host.stats()
    assert stats["relayed"] == 1 and stats["stray_replies"] == 0


def test_relayed_stale_round_in_partial_carries_the_chunk() -> None:
    host = Host(Mode.PARTIAL)
    host.hand(host.relayed(ResyncReason.STALE_ROUND, OPEN + 3, host.first, Mode.PARTIAL))
    following = host.sent_one()  # the slot's next chunk, at the spine's round
    assert (following.round, following.chunk) == (OPEN + 3, host.first + 1)
    residual = np.asarray(host.engine.residual("g"))
    assert np.all(residual[:wire.LANES] == np.float32(0.25))  # carried in full


def test_relayed_chunk_mismatch_contributes_the_spines_chunk_at_the_round() -> None:
    host = Host(Mode.SYNC)
    host.hand(host.relayed(ResyncReason.CHUNK_MISMATCH, OPEN, host.first + 1, Mode.SYNC))
    instead = host.sent_one()
    assert (instead.round, instead.chunk) == (OPEN, host.first + 1)
    assert host.stats()["relayed"] == 1


@pytest.mark.parametrize("case", ["not my bit", "another chunk", "mismatch of another round"])
def test_a_relayed_resync_about_another_flight_is_stray(case: str) -> None:
    host = Host(Mode.SYNC)
    reason, rnd, chunk, bitmap = {
        "not my bit": (ResyncReason.STALE_ROUND, OPEN + 3, host.first, 1 << 3),
        "another chunk": (ResyncReason.STALE_ROUND, OPEN + 3, host.first + 1, 1 << ME),
        "mismatch of another round": (ResyncReason.CHUNK_MISMATCH, OPEN - 1, host.first + 1,
                                      1 << ME),
    }[case]
    host.hand(host.relayed(reason, rnd, chunk, Mode.SYNC, bitmap=bitmap))
    assert host.sent() == []
    assert host.stats()["stray_replies"] == 1
    assert host.status == PENDING


def test_without_the_rule_a_relayed_verdict_is_ignored() -> None:
    host = Host(Mode.SYNC, ignore_relayed=True)
    host.hand(host.relayed(ResyncReason.STALE_ROUND, OPEN + 3, host.first, Mode.SYNC))
    assert host.sent() == []
    assert host.stats()["stray_replies"] == 1


@pytest.mark.parametrize("behind_leaf", [True, False])
def test_stale_for_the_round_just_closed_is_a_refusal_behind_a_leaf(behind_leaf: bool) -> None:
    """A leaf in partial closed round OPEN without me and sent its sum up: it keeps no result
    of OPEN yet, so it answers my contribution STALE_ROUND with open round OPEN + 1. A single
    switch would have answered with the kept result: there that reply shows a new state."""
    host = Host(Mode.PARTIAL, behind_leaf=behind_leaf)
    host.hand(host.resync(ResyncReason.STALE_ROUND, OPEN + 1, host.first, Mode.PARTIAL,
                          echo=host.tx(host.flight)))
    if not behind_leaf:
        assert host.status == RESET
        assert "is new" in host.engine.reset_why
        return
    assert host.status == PENDING and not host.engine.reset_why
    # decided after the grace period: carried (partial), the next chunk at round OPEN + 1
    host.now += 0.2
    host.engine.set_time(host.now)
    host.engine.tick(host.now)
    host.status = host.engine.step(host.now)
    following = [h for h in host.sent() if h.chunk == host.first + 1]
    assert following and following[0].round == OPEN + 1
    residual = np.asarray(host.engine.residual("g"))
    assert np.all(residual[:wire.LANES] == np.float32(0.25))  # carried in full


def _result(rnd: int, chunk: int, mode: Mode, bitmap: int) -> bytes:
    """A spine result as a leaf relays it: its hosts' bits translated (none of mine here)."""
    head = wire.Header(op=Op.RESULT, job_id=JOB, worker_id=UPLINK_ID, slot=0, round=rnd,
                       chunk=chunk, mode=mode, count=3, bitmap=bitmap).pack()
    return head + np.full(wire.LANES, 7, ">i4").tobytes()


def test_a_relayed_result_of_my_round_without_my_bit_carries_the_flight_at_once() -> None:
    """The spine's round OPEN closed without my leaf's sum (partial at the spine): the leaf
    relays its result with my bit clear. The flight is carried now, not an RTO later, and the
    result is applied as every relayed result is."""
    host = Host(Mode.PARTIAL)
    host.hand(_result(OPEN, host.first, Mode.PARTIAL, bitmap=0))
    following = host.sent_one()  # the slot's next chunk, at the next round
    assert (following.op, following.round, following.chunk) == (Op.CONTRIB, OPEN + 1,
                                                                host.first + 1)
    residual = np.asarray(host.engine.residual("g"))
    assert np.all(residual[:wire.LANES] == np.float32(0.25))  # carried in full
    stats = host.stats()
    assert stats["stray_replies"] == 0
    assert len(bytes(stats["results"])) == wire.HEADER_BYTES  # applied once


@pytest.mark.parametrize("case", ["rule out", "sync", "another round", "another chunk",
                                  "not behind a leaf"])
def test_a_relayed_result_without_my_bit_waits_otherwise(case: str) -> None:
    """Only a result in partial for my flight's round and chunk, behind a leaf, settles it:
    anything else waits for the answer to my own packet (its retransmission)."""
    mode = Mode.SYNC if case == "sync" else Mode.PARTIAL
    host = Host(mode, behind_leaf=case != "not behind a leaf",
                leaf_verdict_waits=case == "rule out")
    rnd = OPEN - 1 if case == "another round" else OPEN
    chunk = host.first + 1 if case == "another chunk" else host.first
    host.hand(_result(rnd, chunk, mode, bitmap=0))
    assert host.sent() == []
    assert host.status == PENDING
    assert not np.asarray(host.engine.residual("g"))[:wire.LANES].any()  # still in flight

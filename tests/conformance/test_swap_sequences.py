"""The packet sequences behind swap storms (hot swaps between async and sync/partial under
traffic), and the rules that settle them (docs/protocol.md §4 step 9 "JOIN", §4 "Replies",
§9), on every target.

1. Cross-slot deadlock: members had chunk c counted in async rounds of a slot, then the slot
   latched sync for c; the round waits for them while they wait elsewhere. A JOIN from each
   of them completes it, and a JOIN never opens a round or makes an async round of its own.
2. Double count: a worker's contribution was answered "not counted" (STALE, a RESEND
   without its bit, CHUNK_MISMATCH) while a copy of it was still on its way (a retransmission,
   a duplicate); the slot turned async and counted the copy, and the worker relaunched the
   same lanes at the open round. The switch marks what it refused and never counts it later
   (§4 step 8), and every reply echoes the transmission number it answers (§9). A JOIN
   answered NOT_JOINED leaves a mark of its own, which refuses a copy of it in the round
   opened since (§4 step 9).
"""

from __future__ import annotations

import pytest

from hysync import p4names, wire
from hysync.wire import DropReason, Flag, Mode, ResyncReason

from .conftest import install
from .targets import mode_write
from .topology import JOB1, contribution, lanes_of, multicast, result, unicast, wrap_sum

SLOT, CHUNK, OTHER_CHUNK = 12, 3, 19


@pytest.fixture
def job(bare_target):
    install(bare_target, JOB1, Mode.ASYNC)
    return bare_target


def send(target, w: int, rnd: int, chunk: int = CHUNK, *, seed: int | None = None,
         tx: int = 1, flags: int = 0):
    lanes = lanes_of(w if seed is None else seed)
    frame = contribution(JOB1, w, SLOT, rnd, chunk, lanes,
                         flags=flags | tx << wire.TX_SHIFT)
    return target.send(JOB1.member(w).port, frame)


def reply(w: int, **header: int) -> list[tuple[int, bytes]]:
    datagram = wire.Header(job_id=JOB1.job_id, worker_id=w, slot=SLOT, **header).pack()
    return unicast(JOB1, w, datagram)


def swap(target, mode: Mode, quorum: int = 0) -> None:
    target.write("MODIFY", mode_write(JOB1, mode, quorum))


def refusal_marked(target) -> None:
    if target.name == "tna-model":
        pytest.skip("the TNA program keeps no refusal mark (docs/tofino.md, difference 14)")


def drops(target, reason: DropReason) -> int:
    return target.counter(p4names.STATS_DROPS, JOB1.job_id * wire.NUM_DROP_REASONS + reason)


def test_members_counted_in_async_rounds_join_the_sync_round_of_the_same_chunk(job):
    t = job
    # Async: workers 0 and 1 have chunk 3 counted in rounds of their own (0 and 1) ...
    assert send(t, 0, 0x1000) == multicast(JOB1, result(JOB1, 0, SLOT, 0, CHUNK, 0b0001,
                                                        lanes_of(0), mode=Mode.ASYNC))
    assert send(t, 1, 0x2000) != []
    # ... the slot latches sync at the next contribution, and workers 2 and 3 open round 2
    # for the same chunk: it waits for 0 and 1, who are done with chunk 3 for this call.
    swap(t, Mode.SYNC)
    assert send(t, 2, 2) == []
    assert send(t, 3, 2) == []
    # Their JOINs (residual-only contributions) are counted into it and close it.
    assert send(t, 0, 2, seed=10, flags=Flag.JOIN) == []
    out = send(t, 1, 2, seed=11, flags=Flag.JOIN)
    summed = wrap_sum(lanes_of(2), lanes_of(3), lanes_of(10), lanes_of(11))
    assert out == multicast(JOB1, result(JOB1, 1, SLOT, 2, CHUNK, 0b1111, summed))
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 0)) == 2


def test_a_join_never_opens_a_round(job):
    t = job
    swap(t, Mode.SYNC)
    out = send(t, 0, 0, flags=Flag.JOIN, tx=5)
    assert out == reply(0, op=wire.Op.RESYNC, flags=5 << wire.TX_SHIFT, round=0, chunk=0,
                        reason=ResyncReason.NOT_JOINED)
    assert drops(t, DropReason.NOT_JOINED) == 1
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 0)) == 0
    # Nothing was opened: worker 1 opens round 0 as on a fresh slot.
    assert send(t, 1, 0) == []
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 1)) == 1


def test_a_join_learns_the_chunk_of_the_open_round(job):
    t = job
    swap(t, Mode.SYNC)
    assert send(t, 1, 0) == []
    out = send(t, 0, 0, OTHER_CHUNK, flags=Flag.JOIN, tx=6)
    assert out == reply(0, op=wire.Op.RESYNC, flags=6 << wire.TX_SHIFT, round=0, chunk=CHUNK,
                        count=1, bitmap=0b0010, reason=ResyncReason.CHUNK_MISMATCH)
    assert send(t, 0, 0, CHUNK, flags=Flag.JOIN, tx=7) == []  # joined: the round waits on
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 0)) == 1


def test_a_copy_of_a_join_refused_with_no_round_open_is_refused_in_the_round_opened_since(job):
    """A JOIN answered NOT_JOINED had a duplicate on its way that met the round opened since:
    counting it would count the residual the worker took back (§4 step 9, the JOIN mark)."""
    t = job
    refusal_marked(t)
    swap(t, Mode.SYNC)
    assert send(t, 0, 0, seed=10, flags=Flag.JOIN, tx=5) == reply(
        0, op=wire.Op.RESYNC, flags=5 << wire.TX_SHIFT, round=0, chunk=0,
        reason=ResyncReason.NOT_JOINED)
    assert send(t, 1, 0) == []  # round 0 opens
    out = send(t, 0, 0, seed=10, flags=Flag.JOIN, tx=5)  # the copy
    assert out == reply(0, op=wire.Op.RESYNC, flags=5 << wire.TX_SHIFT, round=0, chunk=CHUNK,
                        count=1, bitmap=0b0010, reason=ResyncReason.NOT_JOINED)
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 0)) == 0
    # The copy spent the mark: the worker's next JOIN is counted.
    assert send(t, 0, 0, seed=11, flags=Flag.JOIN, tx=6) == []
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 0)) == 1
    assert drops(t, DropReason.NOT_JOINED) == 2


def test_a_join_never_makes_an_async_round_of_its_own(job):
    t = job
    out = send(t, 2, 0x3000, flags=Flag.JOIN, tx=7)
    assert out == reply(2, op=wire.Op.RESYNC, flags=7 << wire.TX_SHIFT, mode=Mode.ASYNC,
                        round=0, chunk=0, reason=ResyncReason.NOT_JOINED)
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 2)) == 0
    # The slot is untouched: the next async contribution is round 0.
    assert send(t, 2, 0x3001) == multicast(JOB1, result(JOB1, 2, SLOT, 0, CHUNK, 0b0100,
                                                        lanes_of(2), mode=Mode.ASYNC))


def test_a_refused_contribution_stays_refused_in_every_mode(job):
    t = job
    refusal_marked(t)
    swap(t, Mode.PARTIAL, 3)
    for w in (0, 1, 2):  # partial round 0 closes at quorum
        send(t, w, 0, tx=1)
    # Worker 3's first transmission of sequence number S (async-style: it last heard async)
    # meets the partial slot: STALE_ROUND, echoing transmission 1.
    seq = 0x4000
    out = send(t, 3, seq, tx=1)
    assert out == reply(3, op=wire.Op.RESYNC, flags=1 << wire.TX_SHIFT, mode=Mode.PARTIAL,
                        quorum=3, round=1, chunk=CHUNK, reason=ResyncReason.STALE_ROUND)
    # A copy of S (its retransmission 2 crossed that reply, or the network duplicated 1)
    # meets the slot after a swap to async, which counts any new sequence number: S stays
    # refused (§4 step 8). Counting it would count the lanes twice once the worker relaunches
    # them after the reply to 1, as it may (§9).
    swap(t, Mode.ASYNC)
    out = send(t, 3, seq, tx=2, flags=Flag.RETRANSMIT)
    assert out == reply(3, op=wire.Op.RESYNC, flags=2 << wire.TX_SHIFT, mode=Mode.ASYNC,
                        round=1, chunk=CHUNK, reason=ResyncReason.STALE_ROUND)
    assert drops(t, DropReason.STALE) == 2
    # The relaunch, under its next sequence number, is counted once ...
    out = send(t, 3, seq + 1, tx=3)
    assert out == multicast(JOB1, result(JOB1, 3, SLOT, 1, CHUNK, 0b1000, lanes_of(3),
                                         mode=Mode.ASYNC))
    # ... and every later reply says so, whatever the mode: an ACK in async ...
    out = send(t, 3, seq + 1, tx=4, flags=Flag.RETRANSMIT)
    assert out == reply(3, op=wire.Op.ACK, flags=4 << wire.TX_SHIFT, mode=Mode.ASYNC,
                        round=seq + 1, chunk=CHUNK, reason=wire.install_tag(JOB1.epoch))
    # ... STALE_COUNTED in partial ...
    swap(t, Mode.PARTIAL, 3)
    out = send(t, 3, seq + 1, tx=5, flags=Flag.RETRANSMIT)
    assert out == reply(3, op=wire.Op.RESYNC, flags=5 << wire.TX_SHIFT, mode=Mode.PARTIAL,
                        quorum=3, round=2, chunk=CHUNK, reason=ResyncReason.STALE_COUNTED)
    # ... and a RESEND of the round that closed last keeps its RESEND flag beside the echo.
    out = send(t, 3, 1, tx=6, flags=Flag.RETRANSMIT)
    resent = result(JOB1, 3, SLOT, 1, CHUNK, 0b1000, lanes_of(3), mode=Mode.ASYNC,
                    flags=Flag.RESEND | 6 << wire.TX_SHIFT)
    assert out == unicast(JOB1, 3, resent)
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 3)) == 1


def test_a_late_contribution_resent_the_round_stays_refused_in_async(job):
    t = job
    refusal_marked(t)
    swap(t, Mode.PARTIAL, 3)
    for w in (0, 1, 2):  # partial round 0 closes at quorum, without worker 3
        send(t, w, 0)
    # Worker 3 arrives late: the round's result without its bit (it keeps its lanes).
    out = send(t, 3, 0, tx=1)
    late = result(JOB1, 3, SLOT, 0, CHUNK, 0b0111, wrap_sum(*map(lanes_of, (0, 1, 2))),
                  mode=Mode.PARTIAL,
                  quorum=3, flags=Flag.RESEND | 1 << wire.TX_SHIFT)
    assert out == unicast(JOB1, 3, late)
    # A duplicate of it behind a swap to async is not counted either.
    swap(t, Mode.ASYNC)
    out = send(t, 3, 0, tx=1)
    assert out == reply(3, op=wire.Op.RESYNC, flags=1 << wire.TX_SHIFT, mode=Mode.ASYNC,
                        round=1, chunk=CHUNK, reason=ResyncReason.STALE_ROUND)
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 3)) == 0


def test_a_probe_refused_beside_another_chunk_of_the_member_marks_its_cell(job):
    t = job
    refusal_marked(t)
    swap(t, Mode.PARTIAL, 3)
    # Worker 3's packet of another chunk (one an aborted call forgot) opens round 0; its
    # next call's probe, of this chunk, is refused there: the mark replaces round 0's record,
    # so the probe's sequence number stays refused in every mode ...
    assert send(t, 3, 0, OTHER_CHUNK) == []
    seq = 0x4000
    head = _answer(send(t, 3, seq, tx=1), 3)
    assert (head.reason, head.chunk, head.bitmap) == (
        ResyncReason.STALE_ROUND, OTHER_CHUNK, 0b1000)
    for w in (0, 1):  # round 0 closes (of the other chunk, worker 3 in it)
        send(t, w, 0, OTHER_CHUNK)
    swap(t, Mode.ASYNC)
    assert _answer(send(t, 3, seq, tx=1), 3).reason == ResyncReason.STALE_ROUND
    # ... and round 0 no longer reads as counted: the relaunch, sent at round 0 and met by
    # the slot in async, is counted as a sequence number of its own (the worker takes its
    # ACK for its own count, docs/protocol.md §9).
    out = send(t, 3, 0, tx=2)
    assert out == multicast(JOB1, result(JOB1, 3, SLOT, 1, CHUNK, 0b1000, lanes_of(3),
                                         mode=Mode.ASYNC))


def test_a_chunk_mismatch_refuses_the_chunk_not_the_round(job):
    t = job
    swap(t, Mode.SYNC)
    send(t, 0, 0, OTHER_CHUNK)  # sync round 0 aggregates OTHER_CHUNK
    out = send(t, 1, 0, tx=1)
    assert out == reply(1, op=wire.Op.RESYNC, flags=1 << wire.TX_SHIFT, round=0,
                        chunk=OTHER_CHUNK, count=1, bitmap=0b0001,
                        reason=ResyncReason.CHUNK_MISMATCH)
    # The worker contributes to the round's chunk at the same round: counted.
    assert send(t, 1, 0, OTHER_CHUNK, seed=5, tx=2) == []
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 1)) == 1


# ------------------------------------------------- the async window (§4 step 10)
def _answer(out: list[tuple[int, bytes]], w: int) -> wire.Header:
    """The one reply to worker w: its HySync header."""
    assert [port for port, _ in out] == [JOB1.member(w).port], out
    return wire.Header.unpack(out[0][1], wire.HYSYNC_OFFSET)


def _assert_not_counted(out: list[tuple[int, bytes]], w: int, tx: int) -> None:
    head = _answer(out, w)
    assert (head.op, head.mode, head.reason, head.flags) == (
        wire.Op.RESYNC, Mode.ASYNC, ResyncReason.STALE_ROUND, tx << wire.TX_SHIFT), head


def test_a_copy_behind_the_members_next_async_contribution_is_not_counted(job):
    t = job
    seq = 0x7FFFFFFE  # the numbers cross 2^31: the window is serial arithmetic
    assert send(t, 2, seq, tx=1) == multicast(JOB1, result(JOB1, 2, SLOT, 0, CHUNK, 0b0100,
                                                           lanes_of(2), mode=Mode.ASYNC))
    assert send(t, 2, seq + 1, seed=20, tx=2) == multicast(
        JOB1, result(JOB1, 2, SLOT, 1, CHUNK, 0b0100, lanes_of(20), mode=Mode.ASYNC))
    # The network's copy of the first, delivered behind the second: answered "not counted"
    # (its owner moved on: the answer echoes a transmission it no longer waits for).
    _assert_not_counted(send(t, 2, seq, tx=1), 2, tx=1)
    assert drops(t, DropReason.STALE) == 1
    assert t.counter(p4names.STATS_STALE, wire.member_index(1, 2)) == 1
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 2)) == 2
    # The cell still holds the newer number: its retransmission is ACKed, not counted ...
    out = send(t, 2, seq + 1, seed=20, tx=3, flags=Flag.RETRANSMIT)
    assert out == reply(2, op=wire.Op.ACK, flags=3 << wire.TX_SHIFT, mode=Mode.ASYNC,
                        round=seq + 1, chunk=CHUNK, reason=wire.install_tag(JOB1.epoch))
    # ... and the next contribution is round 2, with its own lanes alone.
    assert send(t, 2, seq + 2, seed=21, tx=4) == multicast(
        JOB1, result(JOB1, 2, SLOT, 2, CHUNK, 0b0100, lanes_of(21), mode=Mode.ASYNC))
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 2)) == 3


def test_a_given_up_async_contribution_that_arrives_after_its_relaunch_is_not_counted(job):
    t = job
    seq = 0x1234
    # The first transmission of seq is delayed; the worker gave it up and relaunched its
    # lanes (and more) under seq + 1, which counts. The delayed packet arrives behind it, one
    # and then 200 numbers back: its lanes are in seq + 1's sum already.
    assert send(t, 1, seq + 1, seed=30, tx=2) == multicast(
        JOB1, result(JOB1, 1, SLOT, 0, CHUNK, 0b0010, lanes_of(30), mode=Mode.ASYNC))
    _assert_not_counted(send(t, 1, seq, tx=1), 1, tx=1)
    _assert_not_counted(send(t, 1, seq + 1 - 200, tx=5), 1, tx=5)
    assert t.counter(p4names.STATS_CONTRIBUTIONS, wire.member_index(1, 1)) == 1
    # Another member's numbers are its own: worker 0's seq counts.
    assert send(t, 0, seq, tx=1) == multicast(JOB1, result(JOB1, 0, SLOT, 1, CHUNK, 0b0001,
                                                           lanes_of(0), mode=Mode.ASYNC))


def test_the_async_window_ends_ASYNC_WINDOW_numbers_back(job):
    """A number ASYNC_WINDOW or more behind is outside the fault model (a copy delayed behind
    that many of its owner's contributions on the slot), and is not told from a new one."""
    t = job
    seq = 0x9000
    send(t, 3, seq + wire.ASYNC_WINDOW, tx=1)
    _assert_not_counted(send(t, 3, seq + 1, tx=2), 3, tx=2)
    out = send(t, 3, seq, seed=40, tx=3)
    assert out == multicast(JOB1, result(JOB1, 3, SLOT, 1, CHUNK, 0b1000, lanes_of(40),
                                         mode=Mode.ASYNC))

"""What the TNA design does between a close's two passes (docs/tofino.md, differences 2
and 3), which the shared suite cannot see: there, a second pass runs at once."""

from __future__ import annotations

from hysync import p4names, wire
from hysync.wire import DropReason, Flag, Mode

from . import test_slot_reuse as reuse
from .conftest import install, uninstall
from .targets import mode_write
from .test_state_machine import drop, member, send
from .tna_model import TnaModelTarget
from .topology import JOB1, contribution, lanes_of, multicast, result, unicast, wrap_sum


def test_a_contribution_between_a_close_and_its_second_pass_is_refused_then_late():
    t = TnaModelTarget(hold=True)
    install(t, JOB1, Mode.PARTIAL, 3)
    for w in (2, 0, 1):
        assert send(t, JOB1, w, 8, 0, chunk=4) == []   # a new install: reset pass, held
    assert t.release() == []                           # the resets; the retries held
    assert t.release() == []                           # the retries: the third one closes
    assert send(t, JOB1, 3, 8, 0, chunk=4) == []       # arrives in the window
    assert t.counter(p4names.STATS_LATE, member(JOB1, 3)) == 1
    assert t.counter(p4names.STATS_DROPS, drop(1, DropReason.STALE)) == 1
    assert t.counter(p4names.STATS_CONTRIBUTIONS, member(JOB1, 3)) == 0

    summed = wrap_sum(lanes_of(0), lanes_of(1), lanes_of(2))
    assert t.release() == multicast(JOB1, result(JOB1, 1, 8, 0, 4, 0b0111, summed,
                                                 mode=Mode.PARTIAL, quorum=3))
    # Its retransmission meets the stored result, without its bit: it keeps a residual.
    # (A resend takes a second pass too on Tofino 1, which the model follows.)
    resent = result(JOB1, 3, 8, 0, 4, 0b0111, summed, mode=Mode.PARTIAL, quorum=3,
                    flags=Flag.RESEND)
    assert send(t, JOB1, 3, 8, 0, chunk=4) == []
    assert t.release() == unicast(JOB1, 3, resent)


def test_async_rounds_in_flight_together_take_distinct_round_numbers():
    t = TnaModelTarget(hold=True)
    install(t, JOB1, Mode.ASYNC)
    frames = [(JOB1.member(w).port, contribution(JOB1, w, 3, 1000 + w, 7 + w)) for w in (0, 1)]
    for port, frame in frames:
        assert t.send(port, frame) == []
    assert t.release() == []   # the new install's reset passes; their retries held
    assert t.release() == []   # the retries: each an async round, its second pass held
    rounds = sorted(wire.Header.unpack(frame, wire.HYSYNC_OFFSET).round
                    for _, frame in t.release())
    assert rounds == [0, 0, 0, 0, 1, 1, 1, 1]   # 4 replicas of each of the two rounds


def test_a_swap_out_of_async_inside_an_async_window_would_count_twice_so_tofino_refuses_it():
    """Why the controller never swaps a slot out of async on the Tofino program
    (docs/tofino.md, difference 3; tests/controlplane/test_tofino_swaps.py): worker 0's
    sync-style contribution arrives while its slot is async (an async round of its own,
    its ASYNC pass pending); a swap to partial(2) lands inside that window; worker 0's
    retransmission opens round 0 again and worker 1 closes it. Two different results for
    round 0 follow, and worker 0 is in both. If this test fails, the TNA design has closed
    the window and `sync_mode.NO_ASYNC_SWAP_ARCHS` can let async swaps through again."""
    t = TnaModelTarget(hold=True)
    install(t, JOB1, Mode.ASYNC)
    held = [(JOB1.member(0).port, contribution(JOB1, 0, 1, 0, 0))]
    assert t.send(*held[0]) == []                     # a new install: reset pass, held
    assert t.release() == []                          # its retry held
    assert t.release() == []                          # async: second pass pending
    t.write("MODIFY", mode_write(JOB1, Mode.PARTIAL, 2))
    for w in (0, 1):                                  # sync-style, round 0
        assert t.send(JOB1.member(w).port, contribution(JOB1, w, 1, 0, 0)) == []
    results: dict[int, set[int]] = {}
    for _, frame in t.release():
        h = wire.Header.unpack(frame, wire.HYSYNC_OFFSET)
        results.setdefault(h.round, set()).add(h.bitmap)
    assert results[0] == {0b01, 0b11}, results        # round 0 twice; worker 0 in both


def test_a_new_install_resets_a_used_slot_once_with_its_packets_in_flight():
    """The reset pass (docs/tofino.md, "The install epoch"): two contributions of the new
    install meet the old one's slot before either reset pass has run; a third arrives
    between the resets and the retries. The slot is reset once, every contribution is
    counted once, and the old job's half-full round is not in the sum."""
    t = TnaModelTarget(hold=True)
    install(t, reuse.OLD, Mode.SYNC)
    for w in (0, 1, 2):                               # round 0 closes and is stored ...
        reuse.send(t, reuse.OLD, w, 0, reuse.OLD_LANES)
        t.release()
        t.release()
    assert reuse.send(t, reuse.OLD, 0, 1, reuse.OLD_LANES) == []   # ... round 1 half full
    assert t.release() == []
    uninstall(t, reuse.OLD, Mode.SYNC)
    install(t, reuse.NEW, Mode.SYNC)
    assert reuse.send(t, reuse.NEW, 0, 0) == []       # both meet the old epoch: reset passes
    assert reuse.send(t, reuse.NEW, 1, 0) == []
    assert t.release() == []                          # the resets (the second finds it done)
    assert reuse.send(t, reuse.NEW, 2, 0) == []       # the new epoch: opens round 0
    assert t.release() == []                          # the retries: 0 and 1 join, 1 closes
    summed = wrap_sum(lanes_of(0), lanes_of(1), lanes_of(2))
    assert t.release() == multicast(reuse.NEW, result(reuse.NEW, 1, reuse.SLOT, 0, reuse.CHUNK,
                                                      0b111, summed))
    for w in (0, 1, 2):
        assert t.counter(p4names.STATS_CONTRIBUTIONS, member(reuse.NEW, w)) == 1

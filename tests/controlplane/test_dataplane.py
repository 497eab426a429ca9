"""The controller against live traffic: 4 sender threads on real UDP sockets contribute
through the softswitch's UDP data plane while the controller hot-swaps modes and
changes membership. The RESULTs and the counters must account for every contribution."""

from __future__ import annotations

import socket
import time
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import pytest

from hysync import wire
from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig
from hysync.wire import Mode

from .conftest import Softswitch, free_udp_socket, make_job, running_softswitch
from .senders import Sender, Shared, lanes_of

SLOTS = range(16)


@pytest.fixture(params=["python", "native"])
def softswitch(request) -> Iterator[Softswitch]:
    """Every test here on the reference model and on the native data plane."""
    yield from running_softswitch(request.param)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    socks = [free_udp_socket() for _ in range(4)]
    yield socks
    for s in socks:
        s.close()


def job_for(sockets: list[socket.socket], count: int = len(SLOTS)) -> JobConfig:
    return make_job(1, workers=len(sockets), base=0, count=count,
                    ports=[s.getsockname()[1] for s in sockets])


def start(softswitch: Softswitch, sockets: list[socket.socket], workers: list[int],
          shared: Shared, first_round: int = 0) -> list[Sender]:
    senders = [Sender(1, w, sockets[w], softswitch.udp_addr, SLOTS, shared,
                      first_round=first_round) for w in workers]
    for s in senders:
        s.start()
    return senders


def wait_progress(senders: list[Sender], rounds: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while min(s.round for s in senders) < rounds:
        for s in senders:
            assert s.error is None, s.error
        assert time.monotonic() < deadline, f"senders at {[s.round for s in senders]}"
        time.sleep(0.01)


def finish(senders: list[Sender], shared: Shared, extra: int = 2) -> int:
    shared.final_round = max(s.round for s in senders) + extra
    for s in senders:
        s.join(timeout=60)
        assert not s.is_alive() and s.error is None, s.error
    return shared.final_round


def merged_results(senders: list[Sender]) -> dict[tuple[int, int], wire.Header]:
    """Every multicast result by (slot, round); all recipients must have seen the same one."""
    merged: dict[tuple[int, int], wire.Header] = {}
    for s in senders:
        for key, got in s.results().items():
            expected = sum(lanes_of(w, key[0], key[1]).astype(np.int64)
                           for w in range(32) if got.header.bitmap >> w & 1)
            assert got.lanes is not None and np.array_equal(got.lanes, expected), key
            assert got.header.count == bin(got.header.bitmap).count("1"), key
            if key in merged:
                assert merged[key] == got.header, key
            merged[key] = got.header
    return merged


def assert_every_contribution_accounted(controller: Controller, senders: list[Sender],
                                        merged: dict[tuple[int, int], wire.Header]) -> None:
    stats = controller.stats(1)
    for s in senders:
        counters = stats.workers[s.worker]
        in_sums = sum(1 for h in merged.values() if h.bitmap >> s.worker & 1)
        # Counted exactly once: the switch's counter equals the worker's bits in the sums.
        assert counters.contributions == in_sums, s.worker
        # Every packet sent lands in exactly one per-worker bucket (lossless loopback).
        assert s.packets_sent == (counters.contributions + counters.late + counters.duplicates
                                  + counters.stale), s.worker
        assert counters.results == sum(1 for r in s.replies if r.header.op == wire.Op.RESULT)
        # Not lost: a contribution outside every sum was reported to its worker.
        not_counted = {k for k in s.sent if not (k in merged and merged[k].bitmap >> s.worker
                                                 & 1)}
        assert not_counted <= s.told_not_counted(), sorted(not_counted - s.told_not_counted())
    assert stats.drops["NOT_MEMBER"] == stats.drops["SLOT_RANGE"] == 0
    assert stats.drops["CHUNK_MISMATCH"] == 0


def test_hot_swap_under_load_loses_and_doubles_no_contribution(
        softswitch: Softswitch, controller: Controller, sockets: list[socket.socket]) -> None:
    controller.add_job(job_for(sockets))
    shared = Shared()
    senders = start(softswitch, sockets, [0, 1, 2, 3], shared)
    try:
        wait_progress(senders, 5)
        swap = controller.set_mode(1, slots=(0, 15), mode=Mode.PARTIAL, quorum=3)
        assert swap.strategy == "modify"
        latched_partial = controller.wait_latched(1, (0, 15), Mode.PARTIAL, timeout=30)
        partial_latched_at = time.monotonic()
        wait_progress(senders, max(s.round for s in senders) + 15)
        sync_set_at = time.monotonic()
        assert controller.set_mode(1, slots=(0, 15), mode=Mode.SYNC).strategy == "modify"
        latched_sync = controller.wait_latched(1, (0, 15), Mode.SYNC, timeout=30)
        sync_latched_at = time.monotonic()
        final = finish(senders, shared, extra=5)
    finally:
        shared.stop.set()
    assert latched_partial > 0 and latched_sync > 0

    merged = merged_results(senders)
    assert set(merged) == {(s, r) for s in SLOTS for r in range(final + 1)}
    first_seen: dict[tuple[int, int], float] = defaultdict(lambda: float("inf"))
    for s in senders:
        for key, got in s.results().items():
            first_seen[key] = min(first_seen[key], got.at)
    slack = 0.25  # a result's delivery to the first of its recipients
    for slot in SLOTS:
        modes = [merged[(slot, r)].mode for r in range(final + 1)]
        for r, mode in enumerate(modes):  # each round under exactly one mode
            header = merged[(slot, r)]
            expected = (4, 0) if mode == Mode.SYNC else (3, 3)
            assert mode in (Mode.SYNC, Mode.PARTIAL), (slot, r)
            assert (header.count, header.quorum) == expected, (slot, r)
            # Once wait_latched returned, every round closing is of the new mode.
            seen = first_seen[(slot, r)]
            if partial_latched_at + slack < seen < sync_set_at:
                assert mode == Mode.PARTIAL, (slot, r)
            if seen > sync_latched_at + slack:
                assert mode == Mode.SYNC, (slot, r)
        runs = [m for i, m in enumerate(modes) if i == 0 or modes[i - 1] != m]
        assert runs == [Mode.SYNC, Mode.PARTIAL, Mode.SYNC], (slot, modes)
    assert_every_contribution_accounted(controller, senders, merged)
    stats = controller.stats(1)
    # Partial rounds really left a fourth contribution out, and its worker was told.
    assert sum(w.late + w.stale for w in stats.workers.values()) > 0


def test_an_excluded_member_stops_holding_up_sync_rounds_and_can_come_back(
        softswitch: Softswitch, controller: Controller, sockets: list[socket.socket]) -> None:
    controller.add_job(job_for(sockets))
    everyone = Shared()
    phase1 = start(softswitch, sockets, [0, 1, 2, 3], everyone)
    wait_progress(phase1, 5)
    end1 = finish(phase1, everyone, extra=0)

    controller.exclude(1, 3)
    three = Shared()
    phase2 = start(softswitch, sockets, [0, 1, 2], three, first_round=end1 + 1)
    wait_progress(phase2, end1 + 6)
    end2 = finish(phase2, three, extra=0)
    # The excluded worker is no longer admitted: its packets are dropped and counted.
    outsider = Sender(1, 3, sockets[3], softswitch.udp_addr, range(1), Shared(final_round=0))
    outsider._send(0, end2 + 1, retransmit=False)
    deadline = time.monotonic() + 5
    while controller.stats(1).drops["NOT_MEMBER"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)

    controller.readmit(1, 3)
    again = Shared()
    phase3 = start(softswitch, sockets, [0, 1, 2, 3], again, first_round=end2 + 1)
    wait_progress(phase3, end2 + 6)
    end3 = finish(phase3, again, extra=0)

    for phase, workers, first, last in ((phase1, 4, 0, end1), (phase2, 3, end1 + 1, end2),
                                        (phase3, 4, end2 + 1, end3)):
        merged = merged_results(phase)
        assert set(merged) == {(s, r) for s in SLOTS for r in range(first, last + 1)}
        for header in merged.values():
            assert header.count == workers and header.bitmap == (1 << workers) - 1
            assert header.mode == Mode.SYNC
    # The excluded worker received no result of phase 2 (its replica was removed): what
    # reached its socket meanwhile is read by its phase-3 sender.
    assert not any(end1 < r.header.round <= end2 for r in phase3[3].replies)


def test_excluding_a_silent_member_frees_the_rounds_waiting_for_it(
        softswitch: Softswitch, controller: Controller, sockets: list[socket.socket]) -> None:
    controller.add_job(job_for(sockets))
    shared, straggler = Shared(), Shared()
    senders = start(softswitch, sockets, [0, 1, 2], shared)
    senders += start(softswitch, sockets, [3], straggler)
    wait_progress(senders, 3)
    straggler.stop.set()  # worker 3 falls silent mid-run; the others wait for it
    senders[3].join(timeout=5)
    time.sleep(0.3)
    stuck_at = max(s.round for s in senders[:3])
    controller.exclude(1, 3)
    try:
        wait_progress(senders[:3], stuck_at + 3, timeout=2)
    finally:
        shared.stop.set()


def test_a_job_on_a_removed_jobs_slots_starts_them_clean(
        controller: Controller, softswitch: Softswitch,
        sockets: list[socket.socket]) -> None:
    """Slot reuse through the controller: job 1's worker 0 leaves a half-finished
    round; job 5 on the same slots must neither close it nor drop its own worker 0."""
    ports = [s.getsockname()[1] for s in sockets[:2]]

    def contribute(job: int, w: int, value: int) -> None:
        packet = wire.Packet(wire.Header(op=wire.Op.CONTRIB, job_id=job, worker_id=w, slot=2,
                                         round=0, chunk=0),
                             np.full(wire.LANES, value, dtype=np.int32))
        sockets[w].sendto(packet.encode(), softswitch.udp_addr)

    def receive(w: int, timeout: float) -> wire.Packet | None:
        sockets[w].settimeout(timeout)
        try:
            return wire.Packet.decode(sockets[w].recv(2048))
        except TimeoutError:
            return None

    controller.add_job(make_job(1, workers=2, base=0, count=4, ports=ports))
    epoch = controller.job(1).epoch
    contribute(1, 0, 7)
    # Counted before the exclusion: counted after it, on a busy machine, the round closed
    # alone, and its RESULT (bitmap 0b01, count 1) was what worker 0 read below.
    deadline = time.monotonic() + 60.0
    while softswitch.pipeline.count[2] != 1:
        assert time.monotonic() < deadline, "job 1's contribution was never counted"
        time.sleep(0.005)
    controller.exclude(1, 1)  # a membership change keeps the install's epoch...
    assert controller.job(1).epoch == epoch
    controller.readmit(1, 1)
    controller.remove_job(1)
    controller.add_job(make_job(5, workers=2, base=0, count=4, ports=ports))
    assert controller.job(5).epoch not in (0, epoch)  # ...a new install draws a new one
    contribute(5, 1, 1)
    assert receive(1, 0.3) is None  # job 1's 7s are not in job 5's round
    contribute(5, 0, 2)
    got = receive(0, 5.0)
    assert got is not None and got.header.op == wire.Op.RESULT
    assert (got.header.bitmap, got.header.count) == (0b11, 2)
    assert np.array_equal(got.lanes, np.full(wire.LANES, 3, dtype=np.int32))

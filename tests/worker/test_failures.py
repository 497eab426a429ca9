"""What a worker does when things go wrong: no switch, no job, not a member, garbage on
its socket; how CHUNK_MISMATCH re-aligns it with a peer, and how a packet parked in
partial mode gives its slot back when the job turns sync (peers played here by hand)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

from hysync import p4names, wire
from hysync.softswitch.tables import Entry, Replica
from hysync.wire import DropReason, Mode, Op
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import NoReplyError, Transport, TransportConfig
from tests.worker.conftest import Job

SCALE = 2.0**20
JOB = 9
BASE = 100


def make_transport(switch_port: int, *, worker: int = 0, members: int = 1, slots: int = 4,
                   dead_after: float = 5.0) -> Transport:
    config = TransportConfig(job_id=JOB, worker_id=worker, switch_host="127.0.0.1",
                             switch_port=switch_port, bind_host="127.0.0.1", slot_base=BASE,
                             slot_count=slots, members=members, dead_after=dead_after,
                             seed=worker)
    return Transport(config, FixedPointQuantizer(SCALE, members))


def assert_unreachable_within(tr: Transport, deadline: float, address: tuple[str, int]) -> None:
    start = time.monotonic()
    with pytest.raises(NoReplyError) as info:
        tr.allreduce("g", np.ones(100, dtype=np.float32))
    # it gave up no sooner than dead_after (and did give up: the call returned)
    assert time.monotonic() - start >= deadline
    message = str(info.value)
    assert f"{address[0]}:{address[1]}" in message
    for cause in ("not running", "not installed", "not a member", "member readmit"):
        assert cause in message
    assert tr.needs_resync  # the call's outcome is unknown


def test_switch_not_running_raises_within_the_deadline(dead_port):
    tr = make_transport(dead_port, dead_after=0.5)
    try:
        assert_unreachable_within(tr, 0.5, ("127.0.0.1", dead_port))
    finally:
        tr.close()


def test_job_not_installed_raises_the_same_clear_error(switch):
    tr = make_transport(switch.address[1], dead_after=0.5)
    try:
        assert_unreachable_within(tr, 0.5, switch.address)
    finally:
        tr.close()


def test_worker_that_is_not_a_member_raises_and_the_switch_counts_it(switch):
    tr = make_transport(switch.address[1], dead_after=0.5)
    try:
        # the job admits worker 0 from another port only
        switch.install(Job(JOB, BASE, 4, [(0, "127.0.0.1", tr.address[1] + 1)]))
        assert_unreachable_within(tr, 0.5, switch.address)
        drops = switch.pipeline.counters[p4names.STATS_DROPS].packets
        assert drops[JOB * wire.NUM_DROP_REASONS + DropReason.NOT_MEMBER] > 0
    finally:
        tr.close()


class Interrupted(Exception):
    pass


def test_a_signal_ends_a_long_native_call_at_once(dead_port):
    """The engine waits with the GIL released; a signal's Python handler still runs within
    about 0.1 s, its exception ends the call (contributions kept, resync flagged)."""
    tr = make_transport(dead_port, dead_after=30.0)

    def interrupt(*_: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        # Interrupted, not the SwitchUnreachableError that ends the call after dead_after:
        # the signal's exception ended it.
        with pytest.raises(Interrupted):
            tr.allreduce("g", np.ones(100, dtype=np.float32))
        assert tr.needs_resync
        np.testing.assert_allclose(tr.residual("g")[:100], 1.0)  # nothing lost
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
        tr.close()


def test_a_switch_host_that_does_not_resolve_is_refused_naming_the_field():
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="no-such-host.invalid")
    with pytest.raises(ValueError, match="switch_host 'no-such-host.invalid' does not resolve"):
        Transport(config, FixedPointQuantizer(SCALE, 1))


def garbage(tr: Transport) -> list[bytes]:
    mine = tr.config
    other_job = wire.Packet(wire.Header(op=Op.RESULT, job_id=mine.job_id + 1, worker_id=0,
                                        slot=BASE, round=0, count=1, bitmap=1),
                            np.zeros(wire.LANES, dtype=np.int32)).encode()
    contrib = wire.Packet(wire.Header(op=Op.CONTRIB, job_id=mine.job_id, worker_id=0,
                                      slot=BASE, round=0),
                          np.zeros(wire.LANES, dtype=np.int32)).encode()
    bad_version = b"\x09" + wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=BASE,
                                        round=0).pack()[1:]
    return [b"hello", bad_version, other_job, contrib, b"\x01" * (wire.PACKET_BYTES + 20),
            bytes(range(200))]


def test_garbage_datagrams_are_logged_counted_and_ignored(switch, caplog):
    tr = make_transport(switch.address[1])
    try:
        switch.install(Job(JOB, BASE, 4, [(0, *tr.address)]))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for datagram in garbage(tr):
                sock.sendto(datagram, tr.address)
        time.sleep(0.05)
        values = np.arange(300, dtype=np.float32) / 7
        with caplog.at_level(logging.WARNING, logger="hysync.worker.transport"):
            result = tr.allreduce("g", values)
        np.testing.assert_allclose(result.output, values, atol=0.5 / SCALE + 1e-7)
        assert result.stats.bad_datagrams == len(garbage(tr))
        assert tr.bad_datagrams == len(garbage(tr))
        logged = [r.getMessage() for r in caplog.records if "ignored a datagram" in r.getMessage()]
        assert len(logged) == len(garbage(tr))
        assert any("version 9" in m for m in logged)
        assert any("not a RESULT" in m for m in logged)
    finally:
        tr.close()


def test_a_transport_takes_over_a_socket_reserved_before_it(switch):
    """The launcher binds the member's port when it picks it and hands the descriptor over:
    the transport uses that socket (its address, its datagrams), binding nothing."""
    reserved = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    reserved.bind(("127.0.0.1", 0))
    port = reserved.getsockname()[1]
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             switch_port=switch.address[1], bind_host="127.0.0.1",
                             bind_port=port, bind_fd=reserved.detach(), slot_base=BASE,
                             slot_count=4)
    tr = Transport(config, FixedPointQuantizer(SCALE, 1))
    try:
        assert tr.address == ("127.0.0.1", port)
        switch.install(Job(JOB, BASE, 4, [(0, "127.0.0.1", port)]))
        values = np.arange(300, dtype=np.float32) / 7
        np.testing.assert_allclose(tr.allreduce("g", values).output, values,
                                   atol=0.5 / SCALE + 1e-7)
    finally:
        tr.close()
    with pytest.raises(OSError):  # closing the transport closed the descriptor
        os.fstat(config.bind_fd)


def test_a_reserved_socket_of_another_address_or_kind_is_refused_and_left_open():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, \
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        udp.bind(("127.0.0.1", 0))
        tcp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
        for fd, bound_port, what in [(udp.fileno(), port + 1, "SOCK_DGRAM socket bound to"),
                                     (tcp.fileno(), tcp.getsockname()[1], "SOCK_STREAM")]:
            config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                                     bind_host="127.0.0.1", bind_port=bound_port, bind_fd=fd)
            with pytest.raises(OSError, match=f"bind_fd {fd} is a {what}.*pass the descriptor"):
                Transport(config, FixedPointQuantizer(SCALE, 1))
            os.fstat(fd)  # still open: not the transport's to close
        closed = os.dup(udp.fileno())
        os.close(closed)
        config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                                 bind_host="127.0.0.1", bind_port=port, bind_fd=closed)
        with pytest.raises(OSError, match=f"bind_fd {closed} is not an open socket"):
            Transport(config, FixedPointQuantizer(SCALE, 1))


class Peer:
    """Worker 1 of a two-member job, played with raw packets."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(5)
        self.address = self.sock.getsockname()

    def contribute(self, switch: tuple[str, int], rnd: int, chunk: int,
                   lanes: np.ndarray) -> None:
        header = wire.Header(op=Op.CONTRIB, job_id=JOB, worker_id=1, slot=BASE, round=rnd,
                             chunk=chunk)
        self.sock.sendto(wire.Packet(header, lanes).encode(), switch)

    def result(self) -> wire.Packet:
        while True:
            packet = wire.Packet.decode(self.sock.recv(2048))
            if packet.header.op == Op.RESULT:
                return packet


def lanes_of(value: float) -> np.ndarray:
    return np.full(wire.LANES, round(value * SCALE), dtype=np.int32)


@pytest.mark.parametrize("peer_chunk", ["other-key", "pending-in-call", "unknown"])
def test_a_chunk_that_meets_a_sync_round_of_another_chunk_is_carried(switch, peer_chunk):
    """The peer's calls do not pair with the worker's: it opens round 0 with a chunk the worker
    does not send first. The worker contributes to that round (its own chunk if pending, else
    the chunk's residual, or zeros if no key owns it: the round is sync) and carries its own
    chunk (RULE B: kept as residual, not chased into a round of its own at once, which the
    peer would open only on coming back to that key); its next chunk meets the peer's next
    round. Once the slot has nothing else to send, the carried chunk goes out again as
    residual (docs/protocol.md §9, "Displaced chunks"), and the peer's contribution to that
    round brings its sum back."""
    tr = make_transport(switch.address[1], members=2, slots=1)
    peer = Peer()
    try:
        switch.install(Job(JOB, BASE, 1, [(0, *tr.address), (1, *peer.address)]))
        tr.register("a", 64)  # chunk 0
        tr.register("b", 128)  # chunks 1 and 2, both on the one slot
        first = {"other-key": 0, "pending-in-call": 2, "unknown": 99}[peer_chunk]
        rounds = [first] if first == 2 else [first, 2]
        peer_values = {0: 0.25, 2: 2.0, 99: 4.0}

        def play() -> None:
            for rnd, chunk in enumerate(rounds):
                peer.contribute(switch.address, rnd, chunk, lanes_of(peer_values[chunk]))
                peer.result()

        thread = threading.Thread(target=play)
        thread.start()
        time.sleep(0.05)  # round 0 is open with the peer's chunk
        mine = np.concatenate([np.full(64, 3.0), np.full(64, 5.0)]).astype(np.float32)
        result = tr.allreduce("b", mine)
        thread.join(5)
        assert not thread.is_alive()
        assert result.stats.resyncs["CHUNK_MISMATCH"] == 1
        assert result.stats.carried == 1
        np.testing.assert_allclose(result.output[:64], 0.0)  # chunk 1 carried ...
        np.testing.assert_allclose(result.output[64:], (2.0 + 5.0) / 2, atol=1e-6)
        if peer_chunk == "other-key":
            np.testing.assert_allclose(tr.take("a"), 0.25 / 2, atol=1e-6)  # applied, kept
        if peer_chunk == "unknown":
            assert result.stats.null_contribs == 1
        # ... and chased: its residual (3.0) went out at the slot's next round, which the
        # peer's chunk 1 closes.
        assert result.stats.residual_contribs == (2 if peer_chunk == "other-key" else 1)
        np.testing.assert_allclose(tr.residual("b")[:64], 0.0, atol=1e-6)  # in flight
        peer.contribute(switch.address, len(rounds), 1, lanes_of(1.0))
        assert peer.result().header.chunk == 1
        assert tr.finish(timeout=60.0).in_flight == 0
        np.testing.assert_allclose(tr.take("b")[:64], (3.0 + 1.0) / 2, atol=1e-6)
        np.testing.assert_allclose(tr.residual("b")[:64], 0.0, atol=1e-6)
        assert not tr.needs_resync
    finally:
        tr.close()
        peer.sock.close()


def test_a_parked_packet_does_not_keep_its_slot_out_of_a_sync_call(switch):
    """Partial: the worker's contribution waits in an open round for the peer's next call
    and is parked; that round's result never reaches the worker (lost), and the job turns
    async (a peer's result tells the worker so), then sync. Its next call must still
    contribute on that slot - a sync round needs every member, and carrying the slot's
    chunks as in partial mode left the peer's rounds waiting forever (a cross-worker
    deadlock in a job with more slots)."""
    tr = make_transport(switch.address[1], members=2, slots=1)
    peer = Peer()
    try:
        job = Job(JOB, BASE, 1, [(0, *tr.address), (1, *peer.address)])
        switch.install(job, Mode.PARTIAL, 2)
        first = tr.allreduce("g", np.zeros(128, dtype=np.float32))  # chunks 0, 1
        assert first.stats.parked == 1  # round 0 holds it, waiting for the peer
        both = [Replica(port=1, rid=wire.member_rid(JOB, w)) for w in (0, 1)]
        switch.pipeline.write_group("MODIFY", JOB, both[1:])  # round 0's result is lost
        peer.contribute(switch.address, 0, tr.first_chunk("g"), lanes_of(0.25))
        assert peer.result().header.bitmap == 0b11
        switch.pipeline.write_group("MODIFY", JOB, both)
        switch.set_mode(job, Mode.ASYNC)
        peer.contribute(switch.address, 777, 99, lanes_of(0.5))  # a chunk of no key
        assert peer.result().header.mode == Mode.ASYNC
        switch.set_mode(job, Mode.SYNC)  # the open round is 2
        time.sleep(0.05)  # the async result is on the worker's socket

        def play() -> None:
            for step, value in enumerate((1.0, 2.0)):
                peer.contribute(switch.address, 2 + step, step, lanes_of(value))
                peer.result()

        thread = threading.Thread(target=play)
        thread.start()
        mine = np.concatenate([np.full(64, 3.0), np.full(64, 5.0)]).astype(np.float32)
        result = tr.allreduce("g", mine)
        thread.join(5)
        assert not thread.is_alive(), "the peer's sync rounds never closed"
        np.testing.assert_allclose(result.output[:64], (1.0 + 3.0) / 2, atol=1e-6)
        np.testing.assert_allclose(result.output[64:], (2.0 + 5.0) / 2, atol=1e-6)
        assert result.stats.carried == 0 and result.stats.included == 2
        assert result.stats.in_flight == 0
        assert np.abs(tr.residual("g")).max() <= 0.5 / SCALE
    finally:
        tr.close()
        peer.sock.close()


def test_a_parked_packet_answered_between_calls_settles_and_the_worker_contributes_again(
        switch):
    """Partial: an excluded worker's contribution meets silence and is parked; the slot
    moves on without it; once readmitted, the parked packet's retransmission is answered
    STALE while no call runs. Every later call starts with that slot held, so it carries
    its chunk at once and never waits: the STALE reply's grace period must still end at
    a call's start, the packet settle, and the worker contribute again (it fell silent,
    and a policy's probation measured it as infinitely slow)."""
    tr = make_transport(switch.address[1], members=2, slots=1)
    peer = Peer()
    member = Entry(p4names.ADMISSION_MEMBERS,
                   (JOB, 0, wire.ip_to_int(tr.address[0]), tr.address[1]),
                   p4names.ADMISSION_ADMIT)
    try:
        job = Job(JOB, BASE, 1, [(0, *tr.address), (1, *peer.address)])
        switch.install(job, Mode.PARTIAL, 1)
        one = np.ones(64, dtype=np.float32)
        tr.allreduce("g", one)  # first contact: learns the mode and the open round
        assert tr.allreduce("g", one).stats.included == 1
        switch.pipeline.write_entry("DELETE", member)  # excluded: dropped as NOT_MEMBER
        switch.set_mode(job, Mode.PARTIAL, 2)
        assert tr.allreduce("g", one).stats.parked == 1
        open_round = switch.pipeline.round[BASE]  # the round that holds the parked packet
        switch.set_mode(job, Mode.PARTIAL, 1)
        for step in range(3):  # the peer alone closes three rounds
            peer.contribute(switch.address, open_round + step, tr.first_chunk("g"),
                            lanes_of(1.0))
            peer.result()
        switch.pipeline.write_entry("INSERT", member)  # readmitted
        included = 0
        for _ in range(8):
            included += tr.allreduce("g", one).stats.included
            time.sleep(0.1)  # > one RTO: the STALE reply's grace period ends between calls
        assert included > 0, "the readmitted worker never contributed again"
    finally:
        tr.close()
        peer.sock.close()

"""Coalesced receives (UDP GRO) in the native core, over real loopback sockets.

A sender's UDP GSO message of N segments crosses loopback as one buffer to a socket with
UDP_GRO; the core's receive batch splits it back into the N datagrams (the last one may be
shorter), so every native server answers each as if it had arrived alone, and an echo sends
the run back as one run.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from hysync import _core, p4names, wire
from hysync.softswitch.native import NativePipeline, NativeUdpDataPlane
from hysync.softswitch.tables import Entry, Replica
from hysync.wire import Header, Mode, Op, Packet

UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)  # linux/udp.h
UDP_GRO = getattr(socket, "UDP_GRO", 104)
JOB = 2


def send_run(sock: socket.socket, segments: list[bytes], to: tuple[str, int]) -> None:
    """One sendmsg of the segments' bytes with UDP_SEGMENT: all but the last must be of one
    size, the last one no longer."""
    size = len(segments[0])
    assert all(len(s) == size for s in segments[:-1]) and len(segments[-1]) <= size
    payload = b"".join(segments)
    sent = sock.sendmsg([payload], [(socket.IPPROTO_UDP, UDP_SEGMENT, struct.pack("H", size))],
                       0, to)
    assert sent == len(payload)


def segments_of(seed: int, count: int, size: int, last: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(size) for _ in range(count - 1)] + [rng.bytes(last)]


@pytest.fixture
def echo() -> Iterator[_core.dataplane.Reflector]:
    server = _core.dataplane.Reflector("127.0.0.1", 0, 1)
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize(("count", "last"), [(5, 100), (64, wire.PACKET_BYTES), (2, 1)])
def test_a_gso_run_is_split_into_its_datagrams_short_last_one_included(
        echo: _core.dataplane.Reflector, count: int, last: int) -> None:
    run = segments_of(count, count, wire.PACKET_BYTES, last)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5)
        send_run(sock, run, ("127.0.0.1", echo.port))
        # this socket has no UDP_GRO: the kernel hands it the echoed run datagram by datagram
        got = [sock.recv(65536) for _ in run]
    assert got == run
    echo.stop()  # its counters are updated after its sends
    assert echo.packets_in == echo.packets_out == count  # datagrams, not buffers


def test_an_echoed_run_comes_back_as_one_run(echo: _core.dataplane.Reflector) -> None:
    """The reflector received the run as one buffer and sends it back as one segmented
    message: a receiver with UDP_GRO gets it whole, with the segment size."""
    run = segments_of(7, 10, wire.PACKET_BYTES, 40)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setsockopt(socket.IPPROTO_UDP, UDP_GRO, 1)
        sock.settimeout(5)
        send_run(sock, run, ("127.0.0.1", echo.port))
        data, control, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(4))
    assert data == b"".join(run)
    assert [(level, kind, struct.unpack("i", value)[0]) for level, kind, value in control] == [
        (socket.IPPROTO_UDP, UDP_GRO, wire.PACKET_BYTES)]


def contribution(worker: int, slot: int, round_: int, lanes: np.ndarray,
                 op: Op = Op.CONTRIB) -> bytes:
    return Packet(Header(op=op, job_id=JOB, worker_id=worker, slot=slot, round=round_,
                         chunk=100 + slot, mode=Mode.SYNC), lanes).encode()


def test_each_contribution_of_a_run_gets_its_own_result() -> None:
    server = _core.dataplane.Reflector("127.0.0.1", 0, 1, _core.dataplane.Answer.AS_RESULT)
    server.start()
    lanes = [np.arange(wire.LANES, dtype=np.int32) * (s + 1) for s in range(40)]
    run = [contribution(3, s, 0, lanes[s]) for s in range(40)]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.settimeout(5)
            send_run(sock, [*run, b"\x01" * 24], ("127.0.0.1", server.port))  # + a short one
            replies = [Packet.decode(sock.recv(65536)) for _ in run]
    finally:
        server.stop()
    assert [(p.header.op, p.header.slot, p.header.chunk) for p in replies] == [
        (Op.RESULT, s, 100 + s) for s in range(40)]
    for p in replies:
        assert np.array_equal(p.lanes, lanes[p.header.slot])
    assert server.packets_in == 41 and server.packets_out == 40  # the short one: no answer


def test_the_switch_aggregates_a_members_run_with_anothers_datagrams() -> None:
    """Member 0 sends its contributions to 30 slots as one GSO run, member 1 one by one:
    every slot's round closes with the sum, and each member gets every result."""
    pipeline = NativePipeline()
    plane = NativeUdpDataPlane(pipeline, "127.0.0.1", 0, threads=1).start()
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        for sock in socks:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sock.bind(("127.0.0.1", 0))
            sock.settimeout(5)
        install(pipeline, [sock.getsockname()[1] for sock in socks], slots=32)
        slots = range(30)
        lanes = {(w, s): np.full(wire.LANES, 10 * s + w + 1, np.int32)
                 for w in (0, 1) for s in slots}
        send_run(socks[0], [contribution(0, s, 0, lanes[0, s]) for s in slots], plane.address)
        for s in slots:
            socks[1].sendto(contribution(1, s, 0, lanes[1, s]), plane.address)
        for sock in socks:
            results = sorted((Packet.decode(sock.recv(65536)) for _ in slots),
                             key=lambda p: p.header.slot)
            assert [(p.header.op, p.header.slot, p.header.count) for p in results] == [
                (Op.RESULT, s, 2) for s in slots]
            for p in results:
                s = p.header.slot
                assert np.array_equal(p.lanes, lanes[0, s] + lanes[1, s])
    finally:
        plane.stop()
        for sock in socks:
            sock.close()


def install(pipeline: NativePipeline, ports: list[int], slots: int) -> None:
    """Job JOB in sync mode over `slots` slots, its members on 127.0.0.1:ports[w]."""
    ip = wire.ip_to_int("127.0.0.1")
    with pipeline.batch():
        for w, port in enumerate(ports):
            pipeline.write_entry("INSERT", Entry(p4names.ADMISSION_MEMBERS, (JOB, w, ip, port),
                                                 p4names.ADMISSION_ADMIT))
            pipeline.write_entry("INSERT", Entry(
                p4names.REPLICATION_REWRITE, (wire.member_rid(JOB, w),),
                p4names.REPLICATION_REWRITE_DST, (0, ip, port)))
        pipeline.write_group("INSERT", JOB, [Replica(1, wire.member_rid(JOB, w))
                                             for w in range(len(ports))])
        pipeline.write_entry("INSERT", Entry(p4names.ADMISSION_JOBS, (JOB,),
                                             p4names.ADMISSION_SET_JOB,
                                             (0, slots, len(ports), JOB, 1)))
        pipeline.write_entry("INSERT", Entry(p4names.SYNC_MODE_MODES, (JOB, (0, slots - 1)),
                                             p4names.SYNC_MODE_SET_MODE, (int(Mode.SYNC), 0),
                                             1))

"""`python -m hysync.softswitch.reflect` as a user runs it, with each of its two answers: echo
(every datagram back as sent) and result (each contribution back as its own result)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from hysync import _core, wire
from hysync.wire import Header, Mode, Op, Packet

PROG = [sys.executable, "-m", "hysync.softswitch.reflect"]


@contextmanager
def reflector(answer: str) -> Iterator[tuple[int, list[str]]]:
    """The reflector on a free port with 2 threads; yields (port, [its last line, once
    stopped by SIGTERM])."""
    proc = subprocess.Popen([*PROG, "--udp", "127.0.0.1:0", "--threads", "2", "--answer", answer],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last: list[str] = []
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        found = re.match(rf"reflector: UDP 127\.0\.0\.1:(\d+), 2 threads, answer {answer}$",
                         line.strip())
        assert found, line + proc.stderr.read()  # type: ignore[union-attr]
        yield int(found.group(1)), last
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    last.append(out.strip())


def test_echo_answers_every_datagram_unchanged_to_its_sender() -> None:
    sent = 0
    with reflector("echo") as (port, last):
        for i in range(3):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.settimeout(5)
                for size in (1, 280, 1400):
                    payload = bytes([i]) * size
                    sock.sendto(payload, ("127.0.0.1", port))
                    assert sock.recvfrom(2048) == (payload, ("127.0.0.1", port))
                    sent += 1
    assert last == [f"reflector: answered {sent} of {sent} datagrams"]


def test_echo_of_a_queued_burst_keeps_every_datagram_and_each_senders_order() -> None:
    """The reflector sends a batch as runs of one peer's equal-size datagrams (UDP GSO, a
    shorter one ending a run, at most 64 per run): each datagram still arrives as sent."""
    sizes = [wire.PACKET_BYTES] * 70 + [16, *[wire.PACKET_BYTES] * 3, 300, 1, 0, 1, 1, 1400]
    server = _core.dataplane.Reflector("127.0.0.1", 0, 1)
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        sent: list[list[bytes]] = [[], []]
        for s, sock in enumerate(senders):  # queued before the reflector reads: one batch
            sock.settimeout(5)
            for i, size in enumerate(sizes):
                payload = bytes([s, i % 256]) * (size // 2) + bytes(size % 2)
                sock.sendto(payload, ("127.0.0.1", server.port))
                sent[s].append(payload)
        server.start()
        for s, sock in enumerate(senders):
            assert [sock.recv(2048) for _ in sizes] == sent[s]
    finally:
        server.stop()
        for sock in senders:
            sock.close()
    assert server.packets_out == server.packets_in == 2 * len(sizes)


def contribution(worker: int, slot: int, seq: int, chunk: int) -> bytes:
    lanes = np.arange(wire.LANES, dtype=np.int32) * (seq + 1) - 7
    return Packet(Header(op=Op.CONTRIB, job_id=3, worker_id=worker, slot=slot, round=seq,
                         chunk=chunk, mode=Mode.SYNC), lanes).encode()


def test_result_answers_each_contribution_as_its_own_result() -> None:
    with reflector("result") as (port, last), \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)

        def ask(datagram: bytes) -> Packet:
            sock.sendto(datagram, ("127.0.0.1", port))
            return Packet.decode(sock.recvfrom(2048)[0])

        # Sequence numbers 0, 1, 2 on slot 9 from worker 5: three results, rounds 0, 1, 2.
        for seq in range(3):
            sent = contribution(5, 9, seq, chunk=100 + seq)
            got = ask(sent)
            assert got.header == Header(op=Op.RESULT, job_id=3, worker_id=5, slot=9, round=seq,
                                        chunk=100 + seq, mode=Mode.ASYNC, count=1,
                                        bitmap=1 << 5)
            assert np.array_equal(got.lanes, Packet.decode(sent).lanes)
        # The same sequence number again is a retransmission: an ACK, not a fourth result.
        again = ask(contribution(5, 9, 2, chunk=102))
        assert again.lanes is None
        assert again.header == Header(op=Op.ACK, job_id=3, worker_id=5, slot=9, round=2,
                                      chunk=102, mode=Mode.ASYNC)
        # Not a whole contribution (garbage, a truncated one, a RESULT): no answer; the next
        # contribution is answered as the slot's next round.
        for bad in (b"\xff" * 7, contribution(5, 9, 3, 0)[:-1],
                    Packet(Header(op=Op.RESULT, job_id=3, worker_id=5, slot=9, round=3),
                           np.zeros(wire.LANES, np.int32)).encode()):
            sock.sendto(bad, ("127.0.0.1", port))
        got = ask(contribution(5, 9, 3, chunk=103))
        assert (got.header.op, got.header.round, got.header.chunk) == (Op.RESULT, 3, 103)
    assert last == ["reflector: answered 5 of 8 datagrams"]


def test_a_bad_address_is_one_line_and_exit_2() -> None:
    done = subprocess.run([*PROG, "--udp", "nohost.invalid:1"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("reflector: error: cannot bind UDP nohost.invalid:1")


def test_an_unknown_answer_is_one_line_and_exit_2() -> None:
    done = subprocess.run([*PROG, "--answer", "sum"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "--answer: invalid choice: 'sum' (choose from 'echo', 'result')" in done.stderr


def test_threads_take_workers_by_id_whatever_port_they_send_from() -> None:
    """With 2 threads, one worker's contributions reach one thread's state from any source
    port: the same sequence number from 8 sockets is one RESULT and 7 ACKs (by the kernel's
    4-tuple hash alone, the sockets would split over both threads and get 2 RESULTs)."""
    server = _core.dataplane.Reflector("127.0.0.1", 0, 2, _core.dataplane.Answer.AS_RESULT)
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(8)]
    server.start()
    try:
        ops = []
        for sock in socks:
            sock.settimeout(5)
            sock.sendto(contribution(5, 9, 7, chunk=1), ("127.0.0.1", server.port))
            ops.append(Packet.decode(sock.recv(2048)).header.op)
    finally:
        server.stop()
        for sock in socks:
            sock.close()
    assert ops == [Op.RESULT] + [Op.ACK] * 7

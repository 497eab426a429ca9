"""A worker acts on "not counted" only when the reply answers its latest transmission
(docs/protocol.md §9, "Swap storms", rule 2), played against a switch scripted by hand.

The sequence of a swap storm's double count: transmission 1 meets a partial slot and is
answered STALE_ROUND; transmission 2 has already left and may be counted by an async round
after a swap. Acting on the reply to 1 (sending the same lanes again at the open round)
would count the gradient twice; the worker must wait for the answer to its latest one.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from hysync import wire
from hysync.wire import Flag, Mode, Op, ResyncReason
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport, TransportConfig

SCALE = 2.0**20
JOB, SLOT, OPEN_ROUND = 9, 100, 5


def receive(sock: socket.socket, timeout: float) -> wire.Packet | None:
    """The next datagram within `timeout` seconds, or None (a timeout of 0: only one
    already queued; a socket with timeout 0 is non-blocking and raises BlockingIOError)."""
    sock.settimeout(timeout)
    try:
        data, _ = sock.recvfrom(2048)
    except (TimeoutError, BlockingIOError):
        return None
    return wire.Packet.decode(data)


def tx_of(packet: wire.Packet) -> int:
    return (packet.header.flags & wire.TX_MASK) >> wire.TX_SHIFT


def answer_latest(switch: socket.socket, worker: tuple[str, int], latest: wire.Packet,
                  reply: Callable[[int], bytes]) -> wire.Packet:
    """Send `reply` (made for a transmission number) to the worker's latest transmission
    until its next packet is not another transmission of the same round, and return that
    packet. A retransmission that left before the reply arrived makes the reply stale
    (rule 2), so it is answered again: the worker's RTO runs on its own clock, the test's
    replies as fast as the machine lets them."""
    for _ in range(50):
        switch.sendto(reply(tx_of(latest)), worker)
        packet = receive(switch, 10.0)
        assert packet is not None, "the worker sent nothing after the reply"
        if packet.header.round != latest.header.round:
            return packet
        latest = packet
    raise AssertionError("every reply crossed a retransmission")


def acknowledge_latest(call: ScriptedCall, latest: wire.Packet,
                       ack: Callable[[int], bytes]) -> None:
    """Send `ack` to the worker's latest transmission until its call ends, answering each
    retransmission that crossed it (see answer_latest)."""
    for _ in range(50):
        call.switch.sendto(ack(tx_of(latest)), call.worker)
        packet = None
        while call.caller.is_alive() and (packet := receive(call.switch, 0.1)) is None:
            pass
        if not call.caller.is_alive():
            return
        assert packet is not None and packet.header.round == latest.header.round, \
            "the worker sent its gradient again under another round"
        latest = packet
    raise AssertionError("every ACK crossed a retransmission")


@dataclass
class ScriptedCall:
    """One worker's allreduce of a chunk of 0.25s under way, against a socket the test
    answers by hand (the switch)."""

    switch: socket.socket
    transport: Transport
    worker: tuple[str, int]
    caller: threading.Thread
    outcome: dict


@contextmanager
def scripted_call(rto: float) -> Iterator[ScriptedCall]:
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             switch_port=switch.getsockname()[1], bind_host="127.0.0.1",
                             slot_base=SLOT, slot_count=1, members=2, rto_initial=rto,
                             rto_min=rto, seed=3, dead_after=120.0)
    tr = Transport(config, FixedPointQuantizer(SCALE, 2))
    outcome: dict = {}
    caller = threading.Thread(target=lambda: outcome.update(
        result=tr.allreduce("g", np.full(wire.LANES, 0.25, dtype=np.float32))))
    caller.start()
    try:
        yield ScriptedCall(switch, tr, (config.bind_host, tr.address[1]), caller, outcome)
    finally:
        caller.join(60.0)
        tr.close()
        switch.close()


def stale_round(tx: int, mode: Mode) -> bytes:
    return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, mode=mode,
                       round=OPEN_ROUND, reason=ResyncReason.STALE_ROUND,
                       flags=tx << wire.TX_SHIFT).pack()


def test_a_stale_reply_to_an_earlier_transmission_never_resends_the_gradient_elsewhere():
    with scripted_call(rto=0.02) as call:
        switch, worker, caller = call.switch, call.worker, call.caller
        first = receive(switch, 10.0)
        assert first is not None and first.header.op == Op.CONTRIB
        seq = first.header.round  # first contact: the worker's own sequence number
        second = receive(switch, 10.0)  # its retransmission, after one RTO
        assert second is not None and second.header.flags & Flag.RETRANSMIT
        assert (second.header.round, tx_of(second)) == (seq, tx_of(first) + 1)
        # The reply to transmission 1 arrives after transmission 2 left: ignored.
        switch.sendto(stale_round(tx_of(first), Mode.PARTIAL), worker)
        deadline = time.monotonic() + 0.3
        latest = second
        while (packet := receive(switch, max(0.0, deadline - time.monotonic()))) is not None:
            assert packet.header.round == seq, "sent the gradient again under another round"
            latest = packet
        # The reply to the latest transmission is acted on: sent again at the open round.
        relaunched = answer_latest(switch, worker, latest,
                                   lambda tx: stale_round(tx, Mode.SYNC))
        assert relaunched.header.round == OPEN_ROUND
        assert np.array_equal(relaunched.lanes, first.lanes)
        closed = wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=SLOT,
                                         round=OPEN_ROUND, chunk=relaunched.header.chunk,
                                         count=1, bitmap=0b1, mode=Mode.SYNC),
                             relaunched.lanes).encode()
        switch.sendto(closed, worker)
        caller.join(60.0)
        assert not caller.is_alive()
    result = call.outcome["result"]
    assert result.stats.included == 1 and result.stats.stray_replies >= 1
    np.testing.assert_allclose(result.output, 0.25, atol=1.0 / SCALE)


def test_an_ack_for_a_round_0_contribution_whose_partial_round_closed_without_me_is_counted():
    """Round 0 is no exception to "an ACK means counted" (docs/protocol.md §9): the slot
    turned async before the retransmission arrived and counted it with round 0 for a
    sequence number. Taken for "not counted", the gradient would be carried and sent again."""
    with scripted_call(rto=0.3) as call:
        switch, worker = call.switch, call.worker
        probe = receive(switch, 10.0)
        assert probe is not None and probe.header.op == Op.CONTRIB
        # First contact meets a partial slot whose open round is 0: sent again at round 0.
        sent = answer_latest(switch, worker, probe, lambda tx: wire.Header(
            op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, mode=Mode.PARTIAL, round=0,
            reason=ResyncReason.STALE_ROUND, flags=tx << wire.TX_SHIFT).pack())
        assert sent.header.round == 0
        # Round 0 closes without me (partial), then the slot turns async and counts my
        # retransmission; the result of that async round is lost, its ACK arrives.
        other = np.full(wire.LANES, int(0.5 * SCALE), dtype=np.int64)
        switch.sendto(wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=1, slot=SLOT,
                                              round=0, chunk=sent.header.chunk, count=1,
                                              bitmap=0b10, mode=Mode.PARTIAL),
                                  other).encode(), worker)
        again = receive(switch, 10.0)
        assert again is not None and again.header.round == 0
        acknowledge_latest(call, again, lambda tx: wire.Header(
            op=Op.ACK, job_id=JOB, worker_id=0, slot=SLOT, mode=Mode.ASYNC, round=0,
            chunk=sent.header.chunk, flags=tx << wire.TX_SHIFT).pack())
    result = call.outcome["result"]
    assert result.stats.included == 1 and result.stats.carried == 0
    # Round 0's result (partial: its sum / count) and my own async round's, the ACK's: my
    # lanes as their share of the mean, / members (2).
    np.testing.assert_allclose(result.output, 0.5 + 0.25 / 2, atol=1.0 / SCALE)


def test_a_stale_counted_for_a_round_closed_with_my_bit_on_another_chunk_is_not_counted():
    """A round that closed with my bit on another chunk counted another packet of mine (one
    an aborted call forgot), and the switch's record of my round is that packet's: a
    STALE_COUNTED for the round answers its count, not my flight's (docs/protocol.md §9).
    Settled as counted, the gradient would leave the residual and reach no round; in
    partial it is carried."""
    with scripted_call(rto=0.3) as call:
        switch, worker = call.switch, call.worker
        probe = receive(switch, 10.0)
        assert probe is not None and probe.header.op == Op.CONTRIB
        sent = answer_latest(switch, worker, probe, lambda tx: wire.Header(
            op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, mode=Mode.PARTIAL, round=0,
            reason=ResyncReason.STALE_ROUND, flags=tx << wire.TX_SHIFT).pack())
        assert sent.header.round == 0
        other = np.full(wire.LANES, int(0.5 * SCALE), dtype=np.int64)
        switch.sendto(wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=1, slot=SLOT,
                                              round=0, chunk=sent.header.chunk + 1, count=1,
                                              bitmap=0b1, mode=Mode.PARTIAL),
                                  other).encode(), worker)
        again = receive(switch, 10.0)
        assert again is not None and again.header.round == 0
        # (round 0 is neither the open round nor the one just closed: a round since closed)
        acknowledge_latest(call, again, lambda tx: wire.Header(
            op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, mode=Mode.PARTIAL, round=2,
            chunk=sent.header.chunk, reason=ResyncReason.STALE_COUNTED,
            flags=tx << wire.TX_SHIFT).pack())
    result = call.outcome["result"]
    assert result.stats.included == 0 and result.stats.carried == 1

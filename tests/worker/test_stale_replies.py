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
from collections.abc import Iterator
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
    sock.settimeout(timeout)
    try:
        data, _ = sock.recvfrom(2048)
    except TimeoutError:
        return None
    return wire.Packet.decode(data)


def tx_of(packet: wire.Packet) -> int:
    return (packet.header.flags & wire.TX_MASK) >> wire.TX_SHIFT


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
                             rto_min=rto, seed=3)
    tr = Transport(config, FixedPointQuantizer(SCALE, 2))
    outcome: dict = {}
    caller = threading.Thread(target=lambda: outcome.update(
        result=tr.allreduce("g", np.full(wire.LANES, 0.25, dtype=np.float32))))
    caller.start()
    try:
        yield ScriptedCall(switch, tr, (config.bind_host, tr.address[1]), caller, outcome)
    finally:
        caller.join(10.0)
        tr.close()
        switch.close()


def stale_round(tx: int, mode: Mode) -> bytes:
    return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT, mode=mode,
                       round=OPEN_ROUND, reason=ResyncReason.STALE_ROUND,
                       flags=tx << wire.TX_SHIFT).pack()


def test_a_stale_reply_to_an_earlier_transmission_never_resends_the_gradient_elsewhere():
    with scripted_call(rto=0.02) as call:
        switch, worker, caller = call.switch, call.worker, call.caller
        first = receive(switch, 2.0)
        assert first is not None and first.header.op == Op.CONTRIB
        seq = first.header.round  # first contact: the worker's own sequence number
        second = receive(switch, 2.0)  # its retransmission, after one RTO
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
        relaunched = None
        for _ in range(20):
            switch.sendto(stale_round(tx_of(latest), Mode.SYNC), worker)
            packet = receive(switch, 1.0)
            assert packet is not None
            if packet.header.round == seq:  # a retransmission crossed the reply: answer it
                latest = packet
                continue
            relaunched = packet
            break
        assert relaunched is not None and relaunched.header.round == OPEN_ROUND
        assert np.array_equal(relaunched.lanes, first.lanes)
        closed = wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=SLOT,
                                         round=OPEN_ROUND, chunk=relaunched.header.chunk,
                                         count=1, bitmap=0b1, mode=Mode.SYNC),
                             relaunched.lanes).encode()
        switch.sendto(closed, worker)
        caller.join(5.0)
        assert not caller.is_alive()
    result = call.outcome["result"]
    assert result.stats.included == 1 and result.stats.stray_replies >= 1
    np.testing.assert_allclose(result.output, 0.25, atol=1.0 / SCALE)


def test_an_ack_for_a_round_0_contribution_whose_partial_round_closed_without_me_is_counted():
    """Round 0 is no exception to "an ACK means counted" (docs/protocol.md §9): the slot
    turned async before the retransmission arrived and counted it with round 0 for a
    sequence number. Taken for "not counted", the gradient would be carried and sent again."""
    with scripted_call(rto=0.3) as call:
        switch, worker, caller = call.switch, call.worker, call.caller
        probe = receive(switch, 2.0)
        assert probe is not None and probe.header.op == Op.CONTRIB
        # First contact meets a partial slot whose open round is 0: sent again at round 0.
        switch.sendto(wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=SLOT,
                                  mode=Mode.PARTIAL, round=0, reason=ResyncReason.STALE_ROUND,
                                  flags=tx_of(probe) << wire.TX_SHIFT).pack(), worker)
        sent = receive(switch, 2.0)
        assert sent is not None and sent.header.round == 0
        # Round 0 closes without me (partial), then the slot turns async and counts my
        # retransmission; the result of that async round is lost, its ACK arrives.
        other = np.full(wire.LANES, int(0.5 * SCALE), dtype=np.int64)
        switch.sendto(wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=1, slot=SLOT,
                                              round=0, chunk=sent.header.chunk, count=1,
                                              bitmap=0b10, mode=Mode.PARTIAL),
                                  other).encode(), worker)
        again = receive(switch, 2.0)
        assert again is not None and again.header.round == 0
        switch.sendto(wire.Header(op=Op.ACK, job_id=JOB, worker_id=0, slot=SLOT,
                                  mode=Mode.ASYNC, round=0, chunk=sent.header.chunk,
                                  flags=tx_of(again) << wire.TX_SHIFT).pack(), worker)
        caller.join(5.0)
        assert not caller.is_alive()
    result = call.outcome["result"]
    assert result.stats.included == 1 and result.stats.carried == 0
    # Round 0's result (partial: its sum / count) and my own async round's, the ACK's: my
    # lanes as their share of the mean, / members (2).
    np.testing.assert_allclose(result.output, 0.5 + 0.25 / 2, atol=1.0 / SCALE)

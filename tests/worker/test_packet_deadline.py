"""The packet deadline (docs/protocol.md §9, Failures): a packet of the call that has waited
`dead_after` since it was launched fails the call, though a reply to another slot came in
meanwhile and kept the switch's silence from counting. The deadline is a timer of its own:
the call gives up at it, not at whatever wakes the engine next.

Played against a switch scripted by hand: the call's two chunks leave on two slots; the
switch answers one at half the deadline and holds the other until a quarter of the deadline
past it. A call that looked at its deadline only when something else woke it would wake next
for that late result and end done; on time, it has given up before the result arrives."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from hysync import wire
from hysync.wire import Mode, Op, ResyncReason
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import NoReplyError, Transport, TransportConfig

SCALE = 2.0**20
JOB, SLOT = 9, 100
DEAD_AFTER = 4.0
NEVER = 600.0  # no retransmission, no JOIN: nothing but replies and the deadline wakes it
BACKSTOP = 120.0  # seconds: only ends a hung test


def receive(sock: socket.socket) -> wire.Packet:
    sock.settimeout(BACKSTOP)
    data, _ = sock.recvfrom(2048)
    return wire.Packet.decode(data)


def stale_round(probe: wire.Packet) -> bytes:
    """First contact: the slot runs sync and its open round is 0 (the worker sends again there)."""
    h = probe.header
    return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=h.slot, mode=Mode.SYNC,
                       round=0, reason=ResyncReason.STALE_ROUND,
                       flags=h.flags & wire.TX_MASK).pack()


def result_for(packet: wire.Packet) -> bytes:
    """The RESULT of a sync round of one member: the packet's own lanes."""
    h = packet.header
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=h.slot,
                                   round=h.round, chunk=h.chunk, count=1, bitmap=0b1,
                                   mode=Mode.SYNC), packet.lanes).encode()


def test_a_packet_past_its_deadline_fails_the_call_though_another_slot_was_answered():
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             switch_port=switch.getsockname()[1], bind_host="127.0.0.1",
                             slot_base=SLOT, slot_count=2, members=1, rto_initial=NEVER,
                             rto_min=NEVER, rto_max=NEVER, join_after=NEVER,
                             dead_after=DEAD_AFTER, seed=5)
    tr = Transport(config, FixedPointQuantizer(SCALE, 1))
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["result"] = tr.allreduce("g", np.full(2 * wire.LANES, 0.25, np.float32))
        except NoReplyError as err:
            outcome["error"] = err

    caller = threading.Thread(target=call, daemon=True)
    try:
        caller.start()
        for probe in (receive(switch), receive(switch)):
            switch.sendto(stale_round(probe), tr.address)
        first, second = receive(switch), receive(switch)
        assert {first.header.slot, second.header.slot} == {SLOT, SLOT + 1}
        assert first.header.round == second.header.round == 0
        answered, held = sorted((first, second), key=lambda p: p.header.chunk, reverse=True)
        launched = time.monotonic()
        time.sleep(DEAD_AFTER / 2)
        switch.sendto(result_for(answered), tr.address)
        time.sleep(DEAD_AFTER * 3 / 4)  # the held packet is now a quarter deadline past due
        switch.sendto(result_for(held), tr.address)
        caller.join(BACKSTOP)
        assert not caller.is_alive(), "the call never ended"
        assert "result" not in outcome, (
            f"the call ended done {time.monotonic() - launched:.1f} s after its packets left: "
            f"the held packet's result, sent {DEAD_AFTER * 1.25:g} s after, found it still "
            f"waiting past its {DEAD_AFTER:g} s deadline")
        assert isinstance(outcome["error"], NoReplyError)
        assert tr.needs_resync
        # the answered chunk was applied; the held one is kept whole as residual
        residual = tr.residual("g")
        held_local = held.header.chunk - tr.first_chunk("g")
        np.testing.assert_allclose(residual[held_local * wire.LANES:][:wire.LANES], 0.25)
    finally:
        caller.join(BACKSTOP)
        tr.close()
        switch.close()


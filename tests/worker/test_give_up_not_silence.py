"""A call given up on its packet deadline is no sign of a silent switch (docs/protocol.md §9,
Failures): the next call, ending by parking its chunk in a partial slot's round, ends done,
since the switch answered less than `dead_after` before. (A give-up on silence is another
matter: every such call after it fails until the switch is heard.)

Played against a switch scripted by hand, one member, two slots: S0 sync, S1 partial. Call 1
(key "g": chunks 0 and 2 on S0, chunk 1 on S1) has its chunk 1 answered at half the deadline
and chunk 0 held: it fails at chunk 0's deadline with the switch heard half a deadline
before. Call 2 (key "h": chunk 3 on S1) meets silence, parks its chunk at its first timeout
and ends done."""

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
RTO = 0.3
JOIN_AFTER = 600.0
BACKSTOP = 60.0  # seconds: only ends a hung test


def stale_round(probe: wire.Packet, mode: Mode) -> bytes:
    """First contact: the slot's open round is 0 in `mode` (the worker sends again there)."""
    h = probe.header
    return wire.Header(op=Op.RESYNC, job_id=JOB, worker_id=0, slot=h.slot, mode=mode,
                       round=0, reason=ResyncReason.STALE_ROUND,
                       flags=h.flags & wire.TX_MASK).pack()


def partial_result(packet: wire.Packet) -> bytes:
    """The RESULT of a partial round of one member: the packet's own lanes."""
    h = packet.header
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=0, slot=h.slot,
                                   round=h.round, chunk=h.chunk, count=1, bitmap=0b1,
                                   mode=Mode.PARTIAL), packet.lanes).encode()


def test_a_call_after_a_packet_deadline_give_up_ends_done_by_parking():
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    switch.settimeout(BACKSTOP)
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             switch_port=switch.getsockname()[1], bind_host="127.0.0.1",
                             slot_base=SLOT, slot_count=2, members=1, rto_initial=RTO,
                             rto_min=RTO, rto_max=RTO, join_after=JOIN_AFTER,
                             dead_after=DEAD_AFTER, seed=5)
    tr = Transport(config, FixedPointQuantizer(SCALE, 1))
    outcome: dict[str, object] = {}

    def calls() -> None:
        try:
            tr.allreduce("g", np.full(3 * wire.LANES, 0.25, np.float32))
        except NoReplyError as err:
            outcome["first"] = err
        else:
            outcome["first"] = "done"
        try:
            outcome["second"] = tr.allreduce("h", np.full(wire.LANES, 0.5, np.float32))
        except NoReplyError as err:
            outcome["second"] = err

    caller = threading.Thread(target=calls, daemon=True)
    try:
        caller.start()
        probes = {}
        while len(probes) < 2:
            p = wire.Packet.decode(switch.recvfrom(2048)[0])
            probes.setdefault(p.header.slot, p)
        switch.sendto(stale_round(probes[SLOT], Mode.SYNC), tr.address)
        switch.sendto(stale_round(probes[SLOT + 1], Mode.PARTIAL), tr.address)
        on_s1 = None
        while on_s1 is None:  # S0's chunk 0 at round 0 is held without a word
            p = wire.Packet.decode(switch.recvfrom(2048)[0])
            if p.header.slot == SLOT + 1 and p.header.round == 0 and p.header.chunk == 1:
                on_s1 = p
        time.sleep(DEAD_AFTER / 2)
        switch.sendto(partial_result(on_s1), tr.address)
        caller.join(BACKSTOP)  # the switch answers nothing more
        assert not caller.is_alive(), "the calls never ended"
        assert isinstance(outcome["first"], NoReplyError), outcome["first"]
        assert not isinstance(outcome["second"], NoReplyError), (
            f"call 2 failed though the switch answered {DEAD_AFTER / 2:g} s before call 1's "
            f"packet deadline: {outcome['second']}")
    finally:
        caller.join(BACKSTOP)
        tr.close()
        switch.close()

"""A switch scripted by hand for one member's transport: one job, one slot in partial, the
other member's contribution OTHERS. Its tests send each reply themselves."""

from __future__ import annotations

import socket
from collections.abc import Callable

import numpy as np

from hysync import _core, wire
from hysync.wire import Mode, Op
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport, TransportConfig

SCALE = 2.0**20
JOB, SLOT = 9, 100
BACKSTOP = 60.0  # seconds: only ends a hung test
MINE, OTHERS = 0.25, 0.5


def engine_with_faults(config: object, **faults: bool) -> _core.worker.Engine:
    """A worker engine of `config` with the named rules taken out (native/worker/faults.h)."""
    fault_set = _core.worker.Faults()
    for name, on in faults.items():
        setattr(fault_set, name, on)
    return _core.worker.Engine(config, faults=fault_set)


def stepper(e: _core.worker.Engine
            ) -> Callable[[float, bytes | None], tuple[int, list[wire.Header]]]:
    """`step(now, data=None)` for an in-memory engine `e`: at `now`, take `data` (a reply) if
    any, run the engine, and return its status and the headers it sent."""
    def step(now: float, data: bytes | None = None) -> tuple[int, list[wire.Header]]:
        e.set_time(now)
        if data is not None:
            e.on_datagram(data, now)
        status = e.step(now)
        return status, [wire.Header.unpack(d) for d in e.take_sent()]
    return step


class ScriptedMember:
    """One member's in-memory engine (`self.engine`) driven by a test at its own time
    `self.now`; `self.status` is the last step's. Subclasses build the engine."""

    engine: _core.worker.Engine
    now: float
    status: int
    ASLEEP = 100.0  # seconds: a wake-up this late means the engine waits on nothing

    def sent(self) -> list[wire.Packet]:
        return [wire.Packet.decode(d) for d in self.engine.take_sent()]

    def at(self, now: float, data: bytes | None = None) -> list[wire.Packet]:
        """The engine at `now`, handed `data` (a reply) if any; what it sent."""
        self.now = now
        self.engine.set_time(now)
        if data is not None:
            self.engine.on_datagram(data, now, now)
        self.status = self.engine.step(now)
        return self.sent()

    def hand(self, data: bytes, after: float = 0.001) -> None:
        self.now += after
        self.engine.set_time(self.now)
        self.engine.on_datagram(data, self.now, self.now)
        self.status = self.engine.step(self.now)

    def wait_until(self, at: float) -> None:
        self.now = at
        self.engine.set_time(self.now)
        self.status = self.engine.step(self.now)

    def next_packet(self) -> wire.Packet:
        """Wakes at each of the engine's timers until it sends; the time is self.now."""
        for _ in range(100):
            wake = self.engine.next_wake()
            assert wake < self.ASLEEP, "the engine sleeps with nothing left to wake it"
            self.wait_until(max(self.now, wake))
            out = self.sent()
            if out:
                assert len(out) == 1, [p.header for p in out]
                return out[0]
        raise AssertionError("no packet after 100 wake-ups")


def receive(sock: socket.socket, timeout: float = BACKSTOP) -> wire.Packet:
    sock.settimeout(timeout)
    data, _ = sock.recvfrom(2048)
    return wire.Packet.decode(data)


def reply(packet: wire.Packet, **fields) -> bytes:
    """A header-only answer to the packet's latest transmission (its number echoed)."""
    h = packet.header
    return wire.Header(job_id=JOB, worker_id=0, slot=SLOT, mode=Mode.PARTIAL,
                       flags=h.flags & wire.TX_MASK, **fields).pack()


def closed_with_both(packet: wire.Packet, mode: Mode = Mode.PARTIAL, closer: int = 1) -> bytes:
    """The RESULT of the packet's round, closed in `mode` with it and the other member's
    OTHERS; `closer`: the member whose contribution closed it (the header's worker_id)."""
    h = packet.header
    lanes = packet.lanes.astype(np.int64) + int(OTHERS * SCALE)
    return wire.Packet(wire.Header(op=Op.RESULT, job_id=JOB, worker_id=closer, slot=h.slot,
                                   round=h.round, chunk=h.chunk, count=2, bitmap=0b11,
                                   mode=mode), lanes).encode()


def member(*, rto: float, stall: float, quiet: float) -> tuple[socket.socket, Transport]:
    """The scripted switch's socket and member 0's transport, one slot of a job of two members:
    `rto` every retransmission timeout, `stall` the early look at a silent packet, `quiet`
    the JOIN period (the dead timer twice that)."""
    switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    switch.bind(("127.0.0.1", 0))
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             switch_port=switch.getsockname()[1], bind_host="127.0.0.1",
                             slot_base=SLOT, slot_count=1, members=2, rto_initial=rto,
                             rto_min=rto, rto_max=rto, stall_after=stall, join_after=quiet,
                             dead_after=2 * quiet, seed=7)
    return switch, Transport(config, FixedPointQuantizer(SCALE, 2))

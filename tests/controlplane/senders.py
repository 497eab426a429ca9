"""Test workers: threads that contribute to every slot of a job round after round over
real UDP sockets (packets built with hysync.wire), and record every reply.

A sender contributes round r to every slot, then waits until each slot has moved past
r (a RESULT for round >= r, or a RESYNC saying the slot is at r+2 or later),
retransmitting after a timeout, then goes on with r+1. It never runs ahead of the
switch, so a slow sender catches up through RESEND/RESYNC replies.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from hysync import wire
from hysync.wire import Flag, Op

LANE_INDEX = np.arange(1, wire.LANES + 1, dtype=np.int64)


def lanes_of(worker: int, slot: int, rnd: int) -> np.ndarray:
    """Worker `worker`'s contribution to (slot, round): distinct per worker, slot, round, lane."""
    return ((worker + 1) * LANE_INDEX + 100 * slot + 10_000 * rnd).astype(np.int32)


def chunk_of(slot: int, rnd: int) -> int:
    return slot * 1_000_000 + rnd


@dataclass
class Received:
    header: wire.Header
    lanes: np.ndarray | None
    at: float


@dataclass
class Shared:
    """Set by the test to end the run: senders stop after this round."""

    final_round: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)


class Sender(threading.Thread):
    def __init__(self, job_id: int, worker: int, sock: socket.socket,
                 switch: tuple[str, int], slots: range, shared: Shared, *,
                 first_round: int = 0, retransmit_after: float = 0.5,
                 give_up_after: float = 60.0) -> None:
        super().__init__(name=f"sender-{job_id}-{worker}", daemon=True)
        self.job_id, self.worker, self.sock = job_id, worker, sock
        self.switch, self.slots, self.shared = switch, slots, shared
        self.round = first_round
        self.retransmit_after = retransmit_after
        self.give_up_after = give_up_after
        self.packets_sent = 0
        self.retransmissions = 0
        self.sent: set[tuple[int, int]] = set()
        self.replies: list[Received] = []
        self.error: BaseException | None = None

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        try:
            self._run()
        except BaseException as err:  # reported by the test
            self.error = err

    def _run(self) -> None:
        deadline = time.monotonic() + self.give_up_after
        while not self.shared.stop.is_set():
            final = self.shared.final_round
            if final is not None and self.round > final:
                return
            pending = set(self.slots)
            for s in self.slots:
                self._send(s, self.round, retransmit=False)
            last = time.monotonic()
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {self.worker} stuck in round {self.round} on "
                                       f"slots {sorted(pending)}")
                if self.shared.stop.is_set():
                    return
                ready, _, _ = select.select([self.sock], [], [], 0.05)
                if ready:
                    self._receive(pending)
                elif time.monotonic() - last > self.retransmit_after:
                    for s in pending:
                        self._send(s, self.round, retransmit=True)
                    last = time.monotonic()
            self.round += 1

    def _send(self, slot: int, rnd: int, *, retransmit: bool) -> None:
        header = wire.Header(op=Op.CONTRIB, job_id=self.job_id, worker_id=self.worker,
                             slot=slot, round=rnd, chunk=chunk_of(slot, rnd),
                             flags=Flag.RETRANSMIT if retransmit else 0)
        self.sock.sendto(wire.Packet(header, lanes_of(self.worker, slot, rnd)).encode(),
                         self.switch)
        self.packets_sent += 1
        self.retransmissions += retransmit
        self.sent.add((slot, rnd))

    def _receive(self, pending: set[int]) -> None:
        while True:
            try:
                data = self.sock.recv(2048, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            packet = wire.Packet.decode(data)
            h = packet.header
            self.replies.append(Received(h, packet.lanes, time.monotonic()))
            moved_on = ((h.op == Op.RESULT and h.round >= self.round)
                        or (h.op == Op.RESYNC and h.round >= self.round + 2))
            if moved_on:
                pending.discard(h.slot)

    # ------------------------------------------------------------ views
    def results(self) -> dict[tuple[int, int], Received]:
        """Multicast results (not resends) by (slot, round)."""
        return {(r.header.slot, r.header.round): r for r in self.replies
                if r.header.op == Op.RESULT and not r.header.flags & Flag.RESEND}

    def told_not_counted(self) -> set[tuple[int, int]]:
        """(slot, round) this worker was told its contribution is not in the sum of."""
        told = {(r.header.slot, r.header.round) for r in self.replies
                if r.header.op == Op.RESULT and r.header.flags & Flag.RESEND
                and not r.header.bitmap >> self.worker & 1}
        for r in self.replies:
            if r.header.op == Op.RESYNC and r.header.reason == wire.ResyncReason.STALE_ROUND:
                told |= {(r.header.slot, rnd) for rnd in range(r.header.round - 1)}
        return told

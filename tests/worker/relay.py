"""A lossy UDP relay between HySync workers and the switch, for the worker tests.

Workers send to `relay.address` as if it were the switch. For each worker the
relay owns an upstream socket (`add_worker` returns its address: the address the
switch must admit for that worker), so the switch still tells members apart by
source address, and its results for that member come back through the same
socket to the worker. In both directions a seeded RNG drops, duplicates (the copy
follows at once) and delays (reorders) datagrams.

Reordering worker -> switch traffic breaks async mode in the protocol itself: the
switch remembers only a worker's last async sequence number per slot, so an old
contribution overtaken by the next one is counted twice. Tests therefore reorder
upstream only in sync/partial-only runs (see the worker tests and the report).

The relay also records every RESULT the switch emits, before impairment:
`results` maps (slot, round) to (chunk, count, lanes) - the ground truth of what
the switch aggregated, to check "every gradient applied exactly once".
"""

from __future__ import annotations

import heapq
import random
import select
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from hysync import wire
from hysync.softswitch.serving import ServingThread


@dataclass
class Impairment:
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0  # probability that a datagram is held back
    max_delay: float = 0.002  # seconds a held-back datagram waits at most


@dataclass
class RelayCounters:
    forwarded: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0
    unknown_source: int = 0


class LossyRelay(ServingThread):
    thread_name = "lossy-relay"

    def __init__(self, switch: tuple[str, int], *, seed: int, up: Impairment,
                 down: Impairment, host: str = "127.0.0.1") -> None:
        super().__init__()
        self.switch = switch
        self.up, self.down = up, down
        self.host = host
        self._rng = random.Random(seed)
        self.down_sock = self._socket()
        self.address: tuple[str, int] = self.down_sock.getsockname()
        self._upstream: dict[tuple[str, int], socket.socket] = {}  # worker addr -> socket
        self._worker_of: dict[int, tuple[str, int]] = {}  # upstream fileno -> worker addr
        self._delayed: list[tuple[float, int, socket.socket, bytes, tuple[str, int]]] = []
        self._tiebreak = 0
        # (slot, round) -> (chunk, count, mode, lanes), every distinct result sent
        self.results: dict[tuple[int, int], tuple[int, int, wire.Mode, np.ndarray]] = {}
        self.counters = RelayCounters()
        self._lock = threading.Lock()

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        sock.bind((self.host, 0))
        sock.setblocking(False)
        return sock

    def add_worker(self, worker: tuple[str, int]) -> tuple[str, int]:
        """Route `worker` through its own upstream socket; return that socket's address."""
        with self._lock:
            sock = self._socket()
            self._upstream[worker] = sock
            self._worker_of[sock.fileno()] = worker
            return sock.getsockname()

    def close(self) -> None:
        for sock in [self.down_sock, *self._upstream.values()]:
            sock.close()

    def ground_truth(self, slots: range | None = None) -> dict[int, np.ndarray]:
        """Sum of every distinct result's lanes (of `slots`' results), per chunk id (int64)."""
        totals: dict[int, np.ndarray] = {}
        for (slot, _), (chunk, _, _, lanes) in self.results.items():
            if slots is not None and slot not in slots:
                continue
            totals.setdefault(chunk, np.zeros(wire.LANES, dtype=np.int64))
            totals[chunk] += lanes
        return totals

    def averages(self, members: int, slots: range | None = None) -> dict[int, np.ndarray]:
        """Sum of every distinct result's lanes / its count (an async result's / `members`,
        docs/protocol.md §9), per chunk id (float64): what a replica that applied every
        result exactly once outputs, in fixed-point units."""
        totals: dict[int, np.ndarray] = {}
        for (slot, _), (chunk, count, mode, lanes) in self.results.items():
            if slots is not None and slot not in slots:
                continue
            totals.setdefault(chunk, np.zeros(wire.LANES))
            totals[chunk] += lanes / (members if mode == wire.Mode.ASYNC else count)
        return totals

    # ------------------------------------------------------------ the loop
    def serve(self) -> None:
        poller = select.poll()
        registered: set[int] = set()
        while not self._stop.is_set():
            with self._lock:
                socks = {s.fileno(): s for s in [self.down_sock, *self._upstream.values()]}
            for fd in socks.keys() - registered:
                poller.register(fd, select.POLLIN)
                registered.add(fd)
            timeout = 50.0
            if self._delayed:
                timeout = max(0.0, (self._delayed[0][0] - time.monotonic()) * 1e3)
            for fd, _ in poller.poll(timeout):
                self._read(socks[fd])
            self._release(time.monotonic())

    def _read(self, sock: socket.socket) -> None:
        for _ in range(256):
            try:
                data, src = sock.recvfrom(2048)
            except BlockingIOError:
                return
            if sock is self.down_sock:
                upstream = self._upstream.get(src)
                if upstream is None:
                    self.counters.unknown_source += 1
                    continue
                self._impair(self.up, upstream, data, self.switch)
            else:
                self._record(data)
                self._impair(self.down, self.down_sock, data, self._worker_of[sock.fileno()])

    def _record(self, data: bytes) -> None:
        try:
            packet = wire.Packet.decode(data)
        except wire.WireError:
            return
        h = packet.header
        if h.op == wire.Op.RESULT and packet.lanes is not None:
            self.results.setdefault((h.slot, h.round),
                                    (h.chunk, h.count, wire.Mode(h.mode),
                                     packet.lanes.astype(np.int64)))

    def _impair(self, imp: Impairment, sock: socket.socket, data: bytes,
                dst: tuple[str, int]) -> None:
        rng = self._rng
        if rng.random() < imp.drop:
            self.counters.dropped += 1
            return
        copies = 2 if rng.random() < imp.duplicate else 1
        self.counters.duplicated += copies - 1
        if rng.random() < imp.reorder:  # both copies are held back together
            self.counters.delayed += 1
            due = time.monotonic() + rng.uniform(0, imp.max_delay)
            for _ in range(copies):
                self._tiebreak += 1
                heapq.heappush(self._delayed, (due, self._tiebreak, sock, data, dst))
        else:
            for _ in range(copies):
                self._send(sock, data, dst)

    def _release(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            _, _, sock, data, dst = heapq.heappop(self._delayed)
            self._send(sock, data, dst)

    def _send(self, sock: socket.socket, data: bytes, dst: tuple[str, int]) -> None:
        try:
            sock.sendto(data, dst)
            self.counters.forwarded += 1
        except OSError:
            self.counters.dropped += 1

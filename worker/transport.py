"""The worker's reliable, windowed HySync transport over one UDP socket.

One non-blocking kernel UDP socket, one single-threaded event loop (`select.poll`):
the same code runs on loopback against the softswitch and inside Mininet hosts.
The algorithm (docs/protocol.md §4 and §9 describe the switch it talks to):

Chunks and slots
    A tensor registered under a key gets a contiguous range of global chunk ids
    (a chunk is `wire.LANES` int32 lanes; the last one is zero-padded). Every
    worker of a job must register the same keys, with the same sizes, in the
    same order (DDP does). Chunk `c` is always aggregated on slot
    `slot_base + c % W` (`W = slot_count`, the window). Each slot works through
    its own queue of pending chunks; all W slots are in flight at once.

Per-slot state
    `next_round[s]`: the slot's open round as far as this worker knows.
    `seq[s]`: for async, a random non-zero 32-bit start, +1 per new contribution,
    unchanged on retransmission. The mode is never configured here: the switch
    reports the latched mode in every RESULT/RESYNC/ACK and the worker follows it.
    Until a slot has been heard from, its first contribution carries `seq[s]`:
    an async switch counts it, a sync/partial switch answers STALE_ROUND with the
    open round (a zero round would collide with the switch's zero-initialized
    `member_seq` and be ACKed without being counted).

RULE A - every RESULT of the job is applied exactly once at every replica
    Results are identified by (slot, round) and deduplicated (a lossy relay may
    duplicate). Each new one adds `sum / count` (float64) into the accumulator of
    its chunk id; `next_round[s] = max(next_round[s], round + 1)`. Results for
    chunks of other keys are kept and handed over at that key's next call
    (results for chunk ids no key owns yet wait until that key is registered).
    Rounds that were skipped (a later round of the slot arrived first, or a RESYNC
    reported a later open round) are *suspected*, and still applied whenever they
    arrive. A round suspected for longer than `missed_after` seconds (judged at the
    start of each call) is a result this replica missed: `needs_resync` is set and
    the worker logs once that it fell out of the switch's retransmission window.
    Own async contributions applied on an ACK (below) cover their unknown round.
    `clear_resync()` (after the replica was re-synchronized) forgets them all.

RULE B - no gradient is ever lost (error feedback)
    A contribution for chunk c is `quantize(grad_c + residual_c)`. If the round
    it was sent to includes this worker (its bit in the result, an ACK, or a
    RESYNC STALE_COUNTED), `residual_c` becomes the quantization error; otherwise
    (a partial round closed without it, a RESEND without its bit) `residual_c` is
    `grad_c + residual_c` in full. Residuals are float32 per element, per key.
    Staleness weighting (P-Reduce): a residual that was not counted is multiplied
    by `staleness_decay` for every call it is carried (default 1.0 = off; any
    other value deliberately drops part of stale gradients).

Sync / partial sending
    A call first drains the socket (results may have arrived while the model
    computed). Each slot sends its first pending chunk as CONTRIB(slot,
    round=next_round[s], chunk). Replies, per slot:
    * RESULT for (s, the round I sent) with my bit: included (RULE B), the chunk is
      done, the slot sends its next pending chunk at the new next_round.
      Without my bit (a partial round closed without me), only the switch's answer
      to my own packet settles it - a RESEND, a RESYNC, or an async RESULT if the
      slot turned async before my packet arrived (the switch then counts it after
      all): a RESEND without my bit = carried, whatever chunk the round had.
    * RESYNC CHUNK_MISMATCH (the open round aggregates chunk c'): if c' is pending
      in this call, send c' now instead (same round); else, if c' belongs to a
      known key, contribute a residual-only CONTRIB for c' (its residual moved into
      the packet, quantized; the result is applied via RULE A). If no key owns c',
      a sync round gets a zero contribution (it cannot close without every
      member); a partial one is left to close. My chunk waits for a later round in
      sync; in partial mode it is carried (RULE B): the others have passed it, and
      chasing it into a round of its own would wait for their next call.
      Residual-only packets do not hold up the end of a call.
    * RESYNC STALE_ROUND: not counted. Sync: send the chunk again at the reply's
      round. Partial: carried (never chased, as above).
      RESYNC STALE_COUNTED: counted, its result is gone: the residual is the
      quantization error and the missing round is suspected (RULE A).
      Either way next_round[s] = max(next_round[s], reply's round). A RESYNC does
      not say which packet it answers: one that cannot answer the contribution in
      flight is ignored, a plausible one is acted on after a grace period (one RTO)
      in which the round's own result, if it is only late, takes precedence.
      (Round 0: the switch's member_seq starts at 0, so a round-0 contribution
      seen closed without me is not counted, whatever STALE_COUNTED/ACK says.)
    * Timeout: retransmit the same packet with flag RETRANSMIT. The timeout adapts:
      4 x the EWMA of the RTT (Karn: first transmissions only) - or srtt + 4 x the
      RTT's mean deviation when that is larger - clamped to [rto_min, rto_max],
      doubled on every consecutive timeout of a packet (and the timer itself at most
      once per RTO until the next sample, as TCP backs off).
    * Partial liveness: a contribution met with silence for `stall_after` (the
      switch drops duplicates of a contribution it holds without a word) is most
      likely counted in an open round waiting for the others' next call. The call
      settles it as included and carries its remaining chunks on that slot; the
      packet stays in flight until the switch answers for certain, and if it was
      not counted after all its amount returns to the residual (see `_park`).
      Without this, calls that each wait for another worker's next call can
      deadlock across slots. A parked packet keeps its own copy of its bytes (the
      next call of its key re-encodes the key's rows), and it may hold its slot
      into later calls: their chunks on that slot are carried too, but only while
      the slot reports partial mode. In sync every round needs every member, so a
      slot left idle for a call deadlocks the job just the same (the others' call
      waits for my next one, mine for theirs on the other slots). So a call that
      starts on a slot held by a parked packet retransmits that packet at once (its
      answer settles it and reports the mode); on a slot that does not report
      partial, the call's chunks wait for that answer and then go out, and chunks
      carried because of the park become pending again as soon as a reply reports
      that the slot is no longer partial. Timers that fell due between calls (a STALE
      reply's grace period above all) run when a call starts: a call that carries all
      its chunks at once never waits, and a parked packet would never settle.
    The call finishes when every pending chunk is done.

Async (the mode comes back in the replies)
    CONTRIB carries round = seq[s]. My own RESULT (my bit, my chunk, my lanes) =
    included. ACK = counted, but its result was lost: my own contribution's value
    (lanes / 1) is applied to my accumulator - RULE A's equivalent - and
    remembered, so the result is not applied twice should it arrive after all.
    Others' results are applied per RULE A. A contribution sent in sync/partial
    that is answered by an async RESULT or ACK, or an async one answered by a
    RESYNC, follows the reply that arrives.

Failures
    If nothing at all arrives from the switch for `dead_after` seconds while a
    call waits, `SwitchUnreachableError` names the switch address and the likely
    causes. (In sync mode a worker waiting for a straggler hears nothing either:
    `dead_after` must exceed the longest straggler delay.) A datagram that does not
    decode (`wire.WireError`) or is not for this worker is logged with the reason
    and counted; it never stops the loop.

Output of a call for key k
    float32 per element: the sum of `sum / count` of every result applied for k's
    chunks during this call, plus anything buffered for k since its last call,
    divided by the quantizer's scale; with `CallStats` (rounds applied, their
    contributors and modes, retransmissions, resyncs, ...).
"""

from __future__ import annotations

import bisect
import heapq
import logging
import random
import select
import socket
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from hysync import wire
from hysync.wire import Flag, Mode, Op, ResyncReason
from worker.quantize import FixedPointQuantizer
from worker.stats import CallStats

log = logging.getLogger(__name__)

LANES = wire.LANES
P = wire.PACKET_BYTES
MASK32 = 0xFFFFFFFF
HALF32 = 1 << 31
RECV_BATCH = 256  # datagrams read per poll wake-up
_STRIDE = P + 1  # one spare byte per receive slot: a longer datagram shows up as P + 1
SUSPECT_MEMORY = 60.0  # seconds a suspected round may still arrive and be applied
MAX_SUSPECT_GAP = 4096  # more skipped rounds than this on one slot: don't enumerate them
ACK_MEMORY = 64  # own ACKed contributions remembered per slot (late result dedup)
_LOG_EVERY = 1000  # after the first few, log one bad datagram in this many

# outcome of a chunk in the current call
PENDING, INCLUDED, CARRIED, SETTLED = 0, 1, 2, 3  # SETTLED: residual already written

OWN, RESIDUAL, NULL = 0, 1, 2  # what a packet in flight carries: my chunk, a residual, zeros


class SwitchUnreachableError(ConnectionError):
    """No reply from the switch within `dead_after` seconds while contributions waited."""


@dataclass
class TransportConfig:
    job_id: int
    worker_id: int
    switch_host: str
    switch_port: int = wire.HYSYNC_UDP_PORT
    bind_host: str = "0.0.0.0"
    bind_port: int = 0
    slot_base: int = 0
    slot_count: int = 64  # the window W: slots this job owns, all in flight at once
    members: int = 1  # n: sizes the quantizer's clipping bound
    rto_initial: float = 0.02
    rto_min: float = 0.002
    rto_max: float = 0.5
    dead_after: float = 5.0
    stall_after: float = 0.05  # partial: park a contribution that met only silence
    missed_after: float = 0.25  # a skipped round not here after this long was missed
    staleness_decay: float = 1.0
    recv_buffer: int = 32 * 1024 * 1024
    track_sums: bool = False  # also accumulate raw sums (sum, not sum/count): for tests
    seed: int | None = None  # seeds the async sequence starts

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.job_id < wire.MAX_JOBS, "job_id", f"1..{wire.MAX_JOBS - 1}"),
            (0 <= self.worker_id < wire.MAX_WORKERS, "worker_id", f"0..{wire.MAX_WORKERS - 1}"),
            (1 <= self.members <= wire.MAX_WORKERS, "members", f"1..{wire.MAX_WORKERS}"),
            (self.slot_base >= 0 and self.slot_count >= 1
             and self.slot_base + self.slot_count <= wire.NUM_SLOTS, "slot_base/slot_count",
             f"a range inside 0..{wire.NUM_SLOTS - 1}"),
            (0 < self.rto_min <= self.rto_initial <= self.rto_max, "rto_min/rto_initial/rto_max",
             "0 < rto_min <= rto_initial <= rto_max"),
            (self.dead_after > 0, "dead_after", "a positive number of seconds"),
            (self.missed_after > 0, "missed_after", "a positive number of seconds"),
            (self.stall_after > 0, "stall_after", "a positive number of seconds"),
            (0.0 <= self.staleness_decay <= 1.0, "staleness_decay", "0.0..1.0 (1.0 = off)"),
            (0 <= self.switch_port < 65536 and 0 <= self.bind_port < 65536, "switch_port/bind_port",
             "0..65535"),
        ]
        for ok, name, fix in checks:
            if not ok:
                raise ValueError(f"TransportConfig.{name} is invalid: must be {fix}")

    @property
    def switch_address(self) -> tuple[str, int]:
        return self.switch_host, self.switch_port


@dataclass(frozen=True, slots=True)
class CallResult:
    output: np.ndarray  # float32, one element per input element
    stats: CallStats


class _Key:
    """A registered tensor: its chunk range, residual, and a reusable encoded batch."""

    __slots__ = ("name", "numel", "first", "chunks", "residual", "enc", "rounds", "flags",
                 "lanes", "raw")

    def __init__(self, name: Hashable, numel: int, first: int, config: TransportConfig) -> None:
        self.name, self.numel, self.first = name, numel, first
        self.chunks = max(1, -(-numel // LANES))
        self.residual = np.zeros(self.chunks * LANES, dtype=np.float32)
        ids = np.arange(first, first + self.chunks, dtype=np.int64)
        enc = wire.empty_batch(self.chunks)
        enc["op"] = Op.CONTRIB
        enc["job_id"] = config.job_id
        enc["worker_id"] = config.worker_id
        enc["slot"] = config.slot_base + ids % config.slot_count
        enc["chunk"] = ids
        self.enc = enc
        # Field views: per send only the round and flags of one row change.
        self.rounds, self.flags, self.lanes = enc["round"], enc["flags"], enc["lanes"]
        self.raw = enc.view(np.uint8)


class _Flight:
    """The one packet in flight on a slot."""

    __slots__ = ("kind", "key", "local", "chunk", "index", "rounds", "flags", "data", "lanes",
                 "err", "amount", "round", "async_style", "probe", "tries", "sent_at", "backoff",
                 "gen", "stale", "closed", "launched", "parked")

    def __init__(self, kind: int, key: _Key | None, local: int, chunk: int) -> None:
        self.kind, self.key, self.local, self.chunk = kind, key, local, chunk
        self.err: np.ndarray | None = None
        self.amount: np.ndarray | None = None  # the residual a residual-only packet carries
        self.round = 0
        self.async_style = False
        self.probe = False
        self.launched = 0.0  # when it was (re)launched at its round
        self.parked = False  # settled for the call as counted, still awaiting the switch
        self.tries = 0
        self.sent_at = 0.0
        self.backoff = 0.0
        self.gen = 0
        self.stale: tuple[int, int] | None = None  # (ResyncReason, latched mode) under grace
        self.closed: int | None = None  # chunk of the round `round`, seen closed without me

    def bind(self, rows: np.ndarray, index: int) -> None:
        """Point the flight at row `index` of an encoded PACKET_DTYPE batch."""
        self.index = index
        self.rounds, self.flags, self.lanes = rows["round"], rows["flags"], rows["lanes"][index]
        self.data = rows.view(np.uint8)[index * P:(index + 1) * P]


class _Call:
    __slots__ = ("key", "value", "err", "outcome", "queues", "remaining", "held")

    def __init__(self, key: _Key, value: np.ndarray, err: np.ndarray, window: int) -> None:
        self.key, self.value, self.err = key, value, err
        self.outcome = np.zeros(key.chunks, dtype=np.int8)
        first = key.first
        # Local chunk l goes to slot index (first + l) % W: every W-th chunk from its start.
        self.queues = [deque(range((i - first) % window, key.chunks, window))
                       for i in range(window)]
        self.remaining = key.chunks
        # Per slot: chunks carried because a parked packet held the slot (partial mode
        # only: they are sent after all if the slot turns out not to be partial).
        self.held: list[list[int]] = [[] for _ in range(window)]

    def pending(self, chunk: int, i: int) -> int:
        """Local index of `chunk` if it is waiting in slot i's queue, else -1."""
        local = chunk - self.key.first
        if 0 <= local < self.key.chunks and self.outcome[local] == PENDING \
                and local in self.queues[i]:
            return local
        return -1


class Transport:
    def __init__(self, config: TransportConfig, quantizer: FixedPointQuantizer) -> None:
        self.config = config
        self.quantizer = quantizer
        self.address: tuple[str, int] = ("", 0)
        self._open_socket()
        w = config.slot_count
        self._w = w
        self._bit = 1 << config.worker_id
        rng = random.Random(config.seed)
        self._next_round = [0] * w
        self._known = [False] * w
        self._mode = [-1] * w
        self._seq = [rng.randrange(1, HALF32) for _ in range(w)]
        self._suspect: list[dict[int, float]] = [{} for _ in range(w)]  # round -> since
        self._suspect_slots: set[int] = set()
        self._acked: list[deque[tuple[int, np.ndarray]]] = [deque(maxlen=ACK_MEMORY)
                                                            for _ in range(w)]
        self._flight: list[_Flight | None] = [None] * w
        self._inflight = 0
        self._timers: list[tuple[float, int, int]] = []
        self._gen = 0
        # keys and the accumulators (rows = global chunk ids)
        self._keys: dict[Hashable, _Key] = {}
        self._starts: list[int] = []
        self._regs: list[_Key] = []
        self._next_chunk = 0
        self._acc = np.zeros((0, LANES), dtype=np.float64)
        self._sums = np.zeros((0, LANES), dtype=np.float64) if config.track_sums else None
        self._orphans: dict[int, list[np.ndarray]] = {}
        # round-trip time
        self._srtt: float | None = None
        self._rttvar = 0.0
        self._rto = config.rto_initial
        self._backed_off = 0.0
        # health
        self.missed_results = 0  # suspected rounds older than missed_after, beyond ACK credits
        self._resync_why: str | None = None  # set by what cannot heal: aborts, huge gaps
        self.bad_datagrams = 0
        self._call: _Call | None = None
        self._stats = CallStats()
        self._results: list[np.ndarray] = []
        self._last_rx = time.monotonic()
        # receive ring: RECV_BATCH slots of P + 1 bytes, read as a strided PACKET_DTYPE array
        self._ring_buf = bytearray(RECV_BATCH * _STRIDE)
        ring_mv = memoryview(self._ring_buf)
        self._views = [ring_mv[j * _STRIDE:(j + 1) * _STRIDE] for j in range(RECV_BATCH)]
        self._ring = np.ndarray((RECV_BATCH,), dtype=wire.PACKET_DTYPE, buffer=self._ring_buf,
                                strides=(_STRIDE,))
        self._sizes = [0] * RECV_BATCH
        self._scale = quantizer.scale

    # ------------------------------------------------------------ socket
    def _open_socket(self) -> None:
        cfg = self.config
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, cfg.recv_buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.recv_buffer)
        try:
            sock.bind((cfg.bind_host, cfg.bind_port))
        except OSError as err:
            sock.close()
            raise OSError(f"worker {cfg.worker_id} cannot bind its HySync socket to "
                          f"{cfg.bind_host}:{cfg.bind_port}: {err}. The switch admits members "
                          "by source address and port: pick the port the job file lists for "
                          "this worker, and make sure no other process holds it.") from err
        sock.setblocking(False)
        self._sock = sock
        self.address = sock.getsockname()
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def close(self) -> None:
        self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    # ------------------------------------------------------------ keys
    def register(self, key: Hashable, numel: int) -> None:
        """Give `key` its chunk range now (otherwise its first call does)."""
        self._register(key, numel)

    def _register(self, key: Hashable, numel: int) -> _Key:
        reg = self._keys.get(key)
        if reg is not None and reg.numel == numel:
            return reg
        if reg is not None:
            # Every worker sees the same change (e.g. DDP rebuilding its buckets after
            # the first step), so a new range keeps chunk ids consistent across the job.
            log.info("key %r changed size %d -> %d: new chunk range; its residual "
                     "(at most the last quantization error in sync) is dropped",
                     key, reg.numel, numel)
        reg = _Key(key, numel, self._next_chunk, self.config)
        self._next_chunk += reg.chunks
        self._grow(self._next_chunk)
        for chunk in [c for c in self._orphans if reg.first <= c < self._next_chunk]:
            acc, raw = self._orphans.pop(chunk)
            self._acc[chunk] += acc
            if self._sums is not None:
                self._sums[chunk] += raw
        self._keys[key] = reg
        self._starts.append(reg.first)
        self._regs.append(reg)
        return reg

    def _grow(self, rows: int) -> None:
        if rows <= len(self._acc):
            return
        cap = max(rows, 2 * len(self._acc))
        for name in ("_acc", "_sums"):
            old = getattr(self, name)
            if old is None:
                continue
            new = np.zeros((cap, LANES), dtype=np.float64)
            new[:len(old)] = old
            setattr(self, name, new)

    def _key_of(self, chunk: int) -> _Key | None:
        pos = bisect.bisect_right(self._starts, chunk) - 1
        if pos < 0:
            return None
        reg = self._regs[pos]
        if chunk >= reg.first + reg.chunks or self._keys.get(reg.name) is not reg:
            return None
        return reg

    def slot_modes(self) -> list[int]:
        """The mode each slot last reported (wire.Mode value; -1 = not heard from yet)."""
        return list(self._mode)

    def slot_rounds(self) -> list[int]:
        """Each slot's open round as far as this worker knows (its next contribution's)."""
        return list(self._next_round)

    def first_chunk(self, key: Hashable) -> int:
        """The global id of `key`'s first chunk."""
        return self._keys[key].first

    def residual(self, key: Hashable) -> np.ndarray:
        """The float32 residual carried for `key` (padded to whole chunks)."""
        return self._keys[key].residual

    def applied_sums(self, key: Hashable) -> np.ndarray:
        """With track_sums: the raw sums (not divided by count) applied for `key` so far."""
        if self._sums is None:
            raise RuntimeError("applied_sums needs TransportConfig(track_sums=True)")
        reg = self._keys[key]
        rows = self._sums[reg.first:reg.first + reg.chunks]
        return rows.reshape(-1)[:reg.numel] / self._scale

    def take(self, key: Hashable) -> np.ndarray:
        """Hand over what has been applied for `key` since its last call, without contributing."""
        return self._take_output(self._keys[key])

    def _take_output(self, reg: _Key) -> np.ndarray:
        rows = self._acc[reg.first:reg.first + reg.chunks]
        out = (rows.reshape(-1)[:reg.numel] / self._scale).astype(np.float32)
        rows[:] = 0.0
        return out

    # ------------------------------------------------------------ the call
    def allreduce(self, key: Hashable, values: np.ndarray) -> CallResult:
        """Contribute `values` under `key`; return what was applied for it (see module doc)."""
        if self._call is not None:
            raise RuntimeError("Transport.allreduce is not reentrant: one call at a time")
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        start = time.monotonic()
        stats = self._stats = CallStats(key=key, elements=values.size)
        self._results = []
        reg = self._register(key, values.size)
        stats.chunks = reg.chunks
        self._drain()
        self._check_suspects()
        call = self._prepare(reg, values)
        self._call = call
        try:
            self._run(call, start)
        except BaseException:
            self._abort(call)
            raise
        finally:
            self._call = None
        self._finish(call)
        stats.elapsed_s = time.monotonic() - start
        stats.results = (np.concatenate(self._results) if self._results
                         else np.empty(0, wire.HEADER_DTYPE))
        stats.srtt_s, stats.rto_s, stats.needs_resync = self._srtt, self._rto, self.needs_resync
        return CallResult(self._take_output(reg), stats)

    def _prepare(self, reg: _Key, values: np.ndarray) -> _Call:
        value = np.zeros(reg.chunks * LANES, dtype=np.float32)
        value[:values.size] = values
        value += reg.residual
        reg.residual[:] = 0.0  # moved into this call; outcomes add back (RULE B)
        fixed, err, qstats = self.quantizer.quantize_with_error(value)
        self._stats.quant = qstats
        if qstats.clipped or qstats.nonfinite:
            log.warning("key %r: %d of %d elements clipped to the int32 bound, %d not finite "
                        "(max error %.3g): lower the quantizer scale", reg.name, qstats.clipped,
                        qstats.elements, qstats.nonfinite, qstats.max_abs_error)
        reg.lanes[:] = fixed.reshape(reg.chunks, LANES)  # exact: fixed holds int32 values
        return _Call(reg, value, err, self._w)

    def _run(self, call: _Call, start: float) -> None:
        # Timers that fell due between calls first: a call whose every slot is held by a
        # parked packet carries all its chunks at once and never enters the loop below,
        # so a STALE reply's grace period would otherwise never end (the packet never
        # settles, and is not retransmitted while it waits: the worker falls silent).
        self._expire(time.monotonic())
        for i, f in enumerate(self._flight):
            if f is None:
                self._send_next(i, time.monotonic())  # a window takes a while to send
            elif f.parked:
                self._hold_queue(i, f, time.monotonic())
        dead_after = self.config.dead_after
        while call.remaining:  # residual-only packets may stay in flight into the next call
            now = time.monotonic()
            self._expire(now)
            if not call.remaining:
                break
            delay = self._timers[0][0] - now if self._timers else dead_after
            blocked = time.monotonic()
            ready = self._poll.poll(max(0.0, delay) * 1e3)
            self._stats.waited_s += time.monotonic() - blocked  # nothing to do but wait
            if ready:
                self._receive()
            elif time.monotonic() - max(self._last_rx, start) > dead_after:
                raise self._unreachable()

    def _finish(self, call: _Call) -> None:
        """RULE B for the whole key at once: the error where counted, the full value where
        not. Additive: residual-only packets resolving meanwhile add their part too."""
        reg, out = call.key, call.outcome
        res = reg.residual.reshape(reg.chunks, LANES)
        inc = out == INCLUDED
        car = out == CARRIED
        np.add(res, call.err.reshape(reg.chunks, LANES), out=res, where=inc[:, None])
        carried = call.value.reshape(reg.chunks, LANES)
        if self.config.staleness_decay != 1.0:
            carried = carried * np.float32(self.config.staleness_decay)
        np.add(res, carried, out=res, where=car[:, None])
        self._stats.included += int(np.count_nonzero(inc))
        self._stats.carried += int(np.count_nonzero(car))

    def _abort(self, call: _Call) -> None:
        """The call failed: forget what is in flight. Its outcome is unknown, so the
        chunks keep their full value as residual and the replica must resynchronize."""
        for i, f in enumerate(self._flight):
            if f is not None and f.kind == OWN and f.key is call.key:
                call.outcome[f.local] = CARRIED
            elif f is not None and f.kind == RESIDUAL:
                self._return_residual(f, included=False)
            elif f is not None and f.parked:
                self._restore(f)
            self._flight[i] = None
        self._inflight = 0
        self._timers.clear()
        call.outcome[call.outcome == PENDING] = CARRIED
        self._finish(call)
        self._flag_resync("a call was aborted with contributions in flight")

    def describe_flights(self) -> str:
        """What is in flight, slot by slot (for logs when a call hangs)."""
        kinds = {OWN: "own", RESIDUAL: "residual", NULL: "null"}
        rows = [f"slot {self.config.slot_base + i}: {kinds[f.kind]} chunk {f.chunk} "
                f"{'seq' if f.async_style else 'round'} {f.round} tries {f.tries}"
                f"{' stale' if f.stale else ''}{' closed' if f.closed is not None else ''}"
                f"{' parked' if f.parked else ''} "
                f"(next_round {self._next_round[i]}, mode {self._mode[i]})"
                for i, f in enumerate(self._flight) if f is not None]
        if len(rows) > 8:
            rows = rows[:8] + [f"... {len(rows) - 8} more"]
        return "; ".join(rows) or "nothing in flight"

    def _unreachable(self) -> SwitchUnreachableError:
        log.error("worker %d gives up waiting: %s", self.config.worker_id,
                  self.describe_flights())
        cfg = self.config
        host, port = cfg.switch_address
        return SwitchUnreachableError(
            f"no reply from the HySync switch at {host}:{port} for {cfg.dead_after:g} s "
            f"(job {cfg.job_id}, worker {cfg.worker_id}, bound to "
            f"{self.address[0]}:{self.address[1]}). Likely causes: the switch is not running "
            f"or not at that address; job {cfg.job_id} is not installed on it; this worker is "
            f"not a member of the job with this source address and port, or was excluded "
            f"(readmit it: `hysync member readmit {cfg.job_id} {cfg.worker_id}`). In sync mode "
            f"a straggler slower than dead_after={cfg.dead_after:g} s looks the same: raise "
            f"dead_after.")

    # ------------------------------------------------------------ sending
    def _send_next(self, i: int, now: float) -> None:
        call = self._call
        if call is None:
            return
        queue = call.queues[i]
        while queue:
            local = queue.popleft()
            if call.outcome[local] == PENDING:
                self._send_own(i, local, None, now)
                return

    def _send_own(self, i: int, local: int, rnd: int | None, now: float) -> None:
        reg = self._call.key  # type: ignore[union-attr]
        f = _Flight(OWN, reg, local, reg.first + local)
        f.index = local
        f.rounds, f.flags, f.data = reg.rounds, reg.flags, reg.raw[local * P:(local + 1) * P]
        f.lanes = reg.lanes[local]
        self._flight[i] = f
        self._inflight += 1
        self._launch(i, f, rnd, now)

    def _send_extra(self, i: int, kind: int, reg: _Key | None, chunk: int, rnd: int,
                    now: float) -> None:
        """A residual-only (or, with no key, zero) contribution for `chunk` at round `rnd`."""
        row = wire.empty_batch(1)
        row["op"], row["job_id"], row["worker_id"] = Op.CONTRIB, self.config.job_id, \
            self.config.worker_id
        row["slot"], row["chunk"] = self.config.slot_base + i, chunk
        f = _Flight(kind, reg, -1, chunk)
        if reg is not None:
            f.local = chunk - reg.first
            f.amount = self._take_residual(reg, f.local)
            fixed, f.err, _ = self.quantizer.quantize_with_error(f.amount)
            row["lanes"][0] = fixed
            self._stats.residual_contribs += 1
        else:
            self._stats.null_contribs += 1
        f.bind(row, 0)
        self._flight[i] = f
        self._inflight += 1
        self._launch(i, f, rnd, now)

    def _take_residual(self, reg: _Key, local: int) -> np.ndarray:
        """Move one chunk's residual into a residual-only packet (settling the current
        call's outcome for it first); `_return_residual` adds back what stays due."""
        call = self._call
        sl = slice(local * LANES, (local + 1) * LANES)
        if call is not None and call.key is reg:
            outcome = call.outcome[local]
            if outcome == PENDING:  # its residual rides on its own contribution
                return np.zeros(LANES, dtype=np.float32)
            if outcome == INCLUDED:
                reg.residual[sl] += call.err[sl]
                self._stats.included += 1
            elif outcome == CARRIED:
                reg.residual[sl] += call.value[sl] * np.float32(self.config.staleness_decay)
                self._stats.carried += 1
            call.outcome[local] = SETTLED
        amount = reg.residual[sl].copy()
        reg.residual[sl] = 0.0
        return amount

    def _return_residual(self, f: _Flight, included: bool) -> None:
        """RULE B for a residual-only packet: its quantization error, or all of it."""
        if f.key is not None and f.err is not None:
            part = f.err if included else f.amount
            f.key.residual[f.local * LANES:(f.local + 1) * LANES] += part

    def _launch(self, i: int, f: _Flight, rnd: int | None, now: float) -> None:
        """First transmission of f at round `rnd` (None: the slot's next round or seq)."""
        f.probe = not self._known[i]
        if rnd is None and (f.probe or self._mode[i] == Mode.ASYNC):
            f.round, f.async_style = self._next_seq(i), True
        else:
            f.round, f.async_style = (self._next_round[i] if rnd is None else rnd), False
        f.rounds[f.index] = f.round
        f.tries = 0
        f.stale = None
        f.closed = None
        f.launched = now
        f.backoff = self._rto
        self._transmit(i, f, now, retransmit=False)

    def _transmit(self, i: int, f: _Flight, now: float, retransmit: bool,
                  timeout: bool = True) -> None:
        if retransmit:
            f.flags[f.index] = Flag.RETRANSMIT
            self._stats.retransmits += 1
        if retransmit and timeout:
            f.backoff = min(2.0 * f.backoff, self.config.rto_max)
            if now - self._backed_off >= self._rto:
                # Back the timer off too (at most once per RTO, as TCP does): replies that
                # only retransmitted packets get carry no RTT sample (Karn), so without
                # this a queue longer than the RTO would keep every packet retransmitting.
                self._rto = min(2.0 * self._rto, self.config.rto_max)
                self._backed_off = now
        elif not retransmit:
            f.flags[f.index] = 0
        f.tries += 1
        f.sent_at = now
        try:
            self._sock.sendto(f.data, self.config.switch_address)
        except BlockingIOError:
            select.select([], [self._sock], [], 0.05)  # send buffer full: the timer retries
        except OSError as err:
            log.warning("cannot send to the switch at %s:%d: %s", *self.config.switch_address,
                        err)
        self._gen += 1
        f.gen = self._gen
        heapq.heappush(self._timers, (now + f.backoff, f.gen, i))

    def _next_seq(self, i: int) -> int:
        seq = (self._seq[i] + 1) & MASK32 or 1
        self._seq[i] = seq
        return seq

    # ------------------------------------------------------------ timers
    def _expire(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, gen, i = heapq.heappop(timers)
            f = self._flight[i]
            if f is None or f.gen != gen:
                continue
            if f.stale is not None:
                self._decide_stale(i, f, now)
                continue
            if (not f.parked and not f.async_style and f.kind != NULL
                    and self._mode[i] == Mode.PARTIAL and f.closed is None
                    and self._next_round[i] == f.round and f.tries >= 2
                    and now - f.launched >= self.config.stall_after):
                self._park(i, f)
            self._transmit(i, f, now, retransmit=True)

    def _park(self, i: int, f: _Flight) -> None:
        """Partial mode: f has met only silence for stall_after, and its round is, as far
        as this worker knows, still the slot's open round. The switch is silent about a
        contribution it holds in an open round (duplicates are dropped without a word),
        so f is most likely counted in a round that waits for the others' next call.
        The call settles it as included and carries its remaining chunks on this slot,
        so that no call of mine waits for another worker's next call - which, across
        slots, could wait forever. f itself stays in flight (retransmitted, backing off)
        until the switch says for certain; if it was not counted after all, its amount
        goes back into the residual (see _done). It may outlive the call, so it gets its
        own copy of the packet: the next call of its key re-encodes the key's rows."""
        call = self._call
        f.parked = True
        self._stats.parked += 1
        if f.kind == OWN and f.key is not None:
            f.bind(f.key.enc[f.local:f.local + 1].copy(), 0)
        if f.kind == OWN and call is not None and f.key is call.key \
                and call.outcome[f.local] == PENDING:
            sl = slice(f.local * LANES, (f.local + 1) * LANES)
            f.amount = call.value[sl] - call.err[sl]
            call.outcome[f.local] = INCLUDED
            call.remaining -= 1
        self._carry_queue(i)

    def _hold_queue(self, i: int, f: _Flight, now: float) -> None:
        """A call starts while a parked packet still holds slot i: it is retransmitted
        at once (its answer settles it and reports the slot's mode). Carrying the
        slot's chunks meanwhile is for partial mode only: in sync every round needs
        every member, so a slot left idle for a call would make the others' call wait
        for my next one, and mine for theirs on the other slots - a deadlock. In any
        other mode the chunks wait for the parked packet's fate (_done sends them)."""
        if self._mode[i] == Mode.PARTIAL:
            self._carry_queue(i)  # pending again if a reply says otherwise (_follow_mode)
        self._hurry(i, f, now)

    def _hurry(self, i: int, f: _Flight, now: float) -> None:
        """Retransmit a parked packet now (its backoff may have grown to rto_max): chunks
        wait for its fate. Not a timeout: neither its backoff nor the RTO grows."""
        if f.stale is None:  # else its grace timer decides it within one RTO anyway
            f.backoff = self._rto
            self._transmit(i, f, now, retransmit=True, timeout=False)

    def _follow_mode(self, i: int, now: float) -> None:
        """A reply reported slot i's mode. If it is no longer partial while this call's
        chunks there were carried because a parked packet held the slot, they are
        pending again (see _hold_queue): sent once the parked packet is settled."""
        call = self._call
        if call is None or not call.held[i] or self._mode[i] == Mode.PARTIAL:
            return
        queue = call.queues[i]
        for local in call.held[i]:
            if call.outcome[local] == CARRIED:  # not SETTLED by a residual-only packet
                call.outcome[local] = PENDING
                call.remaining += 1
                queue.append(local)
        call.held[i].clear()
        f = self._flight[i]
        if f is None:
            self._send_next(i, now)
        elif f.parked:
            self._hurry(i, f, now)

    def _carry_queue(self, i: int) -> None:
        """The slot is held by a parked packet: this call's chunks there are carried."""
        call = self._call
        if call is None:
            return
        for local in call.queues[i]:
            if call.outcome[local] == PENDING:
                call.outcome[local] = CARRIED
                call.remaining -= 1
                call.held[i].append(local)
        call.queues[i].clear()

    def _restore(self, f: _Flight) -> None:
        """A parked contribution was not counted after all: back into the residual."""
        if f.key is not None and f.amount is not None:
            f.key.residual[f.local * LANES:(f.local + 1) * LANES] += f.amount
            self._stats.parked_missed += 1

    def _rtt_sample(self, f: _Flight, now: float) -> None:
        if f.tries != 1:
            return  # Karn: an answer to a retransmitted packet says nothing about the RTT
        sample = now - f.sent_at
        srtt = self._srtt
        if srtt is None:
            srtt, self._rttvar = sample, sample / 2
        else:
            self._rttvar = 0.75 * self._rttvar + 0.25 * abs(sample - srtt)
            srtt = 0.875 * srtt + 0.125 * sample
        self._srtt = srtt
        # 4 x srtt as specified, or srtt + 4 x rttvar (Jacobson) when the RTT jitters
        # more than that: on a loaded host spurious retransmissions otherwise feed back.
        rto = max(4.0 * srtt, srtt + 4.0 * self._rttvar)
        cfg = self.config
        self._rto = cfg.rto_min if rto < cfg.rto_min else cfg.rto_max if rto > cfg.rto_max \
            else rto

    # ------------------------------------------------------------ outcomes
    def _done(self, i: int, f: _Flight, included: bool, now: float,
              send_next: bool = True) -> None:
        """The fate of f is known (RULE B); the slot moves on to its next chunk."""
        self._rtt_sample(f, now)
        call = self._call
        if f.kind == OWN and f.parked:
            if not included:
                self._restore(f)
        elif f.kind == OWN:
            if call is not None and call.key is f.key and call.outcome[f.local] == PENDING:
                call.outcome[f.local] = INCLUDED if included else CARRIED
                call.remaining -= 1
        elif f.kind == RESIDUAL:
            self._return_residual(f, included)
        self._flight[i] = None
        self._inflight -= 1
        if send_next:
            self._send_next(i, now)

    def _relaunch(self, i: int, f: _Flight, now: float) -> None:
        """f was not counted and can still be: send it again at the slot's next round."""
        self._launch(i, f, None, now)

    def _apply_own(self, i: int, f: _Flight) -> None:
        """ACK: counted, result lost; an async round's result is exactly my lanes / 1."""
        lanes = np.asarray(f.lanes, dtype=np.float64)
        self._add(f.chunk, lanes, lanes)
        self._acked[i].append((f.chunk, np.array(f.lanes, dtype=np.int32)))
        self._stats.own_applied += 1

    def _add(self, chunk: int, avg: np.ndarray, raw: np.ndarray) -> None:
        if chunk < self._next_chunk:
            self._acc[chunk] += avg
            if self._sums is not None:
                self._sums[chunk] += raw
            return
        held = self._orphans.setdefault(chunk, [np.zeros(LANES), np.zeros(LANES)])
        held[0] += avg
        held[1] += raw

    # ------------------------------------------------------------ rounds (RULE A)
    def _advance(self, i: int, upto: int) -> None:
        """The slot's rounds before `upto` are closed: suspect those not seen yet."""
        nr = self._next_round[i]
        self._known[i] = True
        gap = (upto - nr) & MASK32
        if gap == 0 or gap >= HALF32:
            return
        if gap > MAX_SUSPECT_GAP:
            self._flag_resync(f"slot {self.config.slot_base + i} jumped {gap} rounds ahead")
        else:
            suspect, now = self._suspect[i], time.monotonic()
            for r in range(nr, nr + gap):
                suspect[r & MASK32] = now
            self._suspect_slots.add(i)
        self._next_round[i] = upto

    def _is_new(self, i: int, rnd: int) -> bool:
        if (rnd - self._next_round[i]) & MASK32 < HALF32:
            self._advance(i, rnd)
            self._next_round[i] = (rnd + 1) & MASK32
            return True
        suspect = self._suspect[i]
        if rnd in suspect:
            del suspect[rnd]
            return True
        return False

    def _check_suspects(self) -> None:
        """Count suspected rounds older than missed_after (minus one per own ACKed
        contribution, whose round is unknown); forget those older than SUSPECT_MEMORY."""
        now = time.monotonic()
        judge, forget = now - self.config.missed_after, now - SUSPECT_MEMORY
        missed = 0
        for i in list(self._suspect_slots):
            suspect, acked = self._suspect[i], self._acked[i]
            gone = [r for r, since in suspect.items() if since < forget]
            for r in gone:
                del suspect[r]
            if len(gone) > len(acked):
                self._flag_resync(f"results of slot {self.config.slot_base + i} never arrived")
            for _ in range(min(len(gone), len(acked))):
                acked.popleft()
            if not suspect:
                self._suspect_slots.discard(i)
            old = sum(1 for since in suspect.values() if since < judge)
            missed += max(0, old - len(acked))
        was = self.needs_resync
        self.missed_results = missed
        if missed and not was:
            self._log_resync(f"{missed} result(s) did not arrive within "
                             f"{self.config.missed_after:g} s")

    @property
    def needs_resync(self) -> bool:
        """True when this replica missed results it cannot get back: re-synchronize it
        (e.g. at the next model-averaging round), then call clear_resync()."""
        return self._resync_why is not None or self.missed_results > 0

    def _flag_resync(self, why: str) -> None:
        if not self.needs_resync:
            self._log_resync(why)
        self._resync_why = self._resync_why or why

    def _log_resync(self, why: str) -> None:
        log.warning("worker %d fell out of the switch's retransmission window (%s): its "
                    "replica missed updates and must be resynchronized at the next "
                    "averaging round", self.config.worker_id, why)

    def clear_resync(self) -> None:
        """The replica was re-synchronized: forget missed and suspected rounds (results
        of those rounds that still arrive are dropped as duplicates)."""
        self._resync_why = None
        self.missed_results = 0
        for i in self._suspect_slots:
            self._suspect[i].clear()
            self._acked[i].clear()
        self._suspect_slots.clear()

    # ------------------------------------------------------------ receiving
    def _drain(self) -> None:
        while self._poll.poll(0):
            if not self._receive():
                break

    def poll_results(self, duration: float) -> None:
        """Between calls: apply whatever arrives for `duration` seconds (and keep
        retrying packets in flight), then judge suspected rounds."""
        if self._call is not None:
            raise RuntimeError("poll_results during a call")
        self._stats = CallStats()
        end = time.monotonic() + duration
        while (left := end - (now := time.monotonic())) > 0:
            self._expire(now)  # residual-only packets still in flight keep retrying
            wait = min(left, self._timers[0][0] - now) if self._timers else left
            if self._poll.poll(max(0.0, wait) * 1e3):
                self._receive()
        self._check_suspects()

    @property
    def in_flight(self) -> int:
        """Packets still awaiting their fate (residual-only ones outlive their call)."""
        return self._inflight

    def _receive(self) -> int:
        recv_into, sizes, n = self._sock.recv_into, self._sizes, 0
        for view in self._views:
            try:
                sizes[n] = recv_into(view)
            except BlockingIOError:
                break
            except OSError as err:  # e.g. an ICMP error reported on the socket
                self._bad(f"socket error {err}")
                break
            n += 1
        if n == 0:
            return 0
        full = [j for j in range(n) if sizes[j] == P]
        rows = self._ring[full] if full else None
        cols = None
        if rows is not None:
            cols = [rows[name].tolist() for name in
                    ("version", "op", "flags", "job_id", "worker_id", "slot", "round", "chunk",
                     "count", "bitmap", "mode")]
            cols = list(zip(*cols, strict=True))
        now = time.monotonic()
        apply: list[int] = []
        k = 0
        for j in range(n):
            if sizes[j] == P:
                if self._on_full(rows, k, cols[k], now):  # type: ignore[index]
                    apply.append(k)
                k += 1
            else:
                self._on_short(self._views[j], sizes[j], now)
        if apply:
            self._apply(rows, apply)  # type: ignore[arg-type]
        return n

    def _bad(self, reason: str) -> None:
        self.bad_datagrams += 1
        self._stats.bad_datagrams += 1
        if self.bad_datagrams <= 10 or self.bad_datagrams % _LOG_EVERY == 0:
            log.warning("worker %d ignored a datagram (%d so far): %s", self.config.worker_id,
                        self.bad_datagrams, reason)

    def _slot_index(self, job: int, slot: int) -> int:
        i = slot - self.config.slot_base
        if job != self.config.job_id or not 0 <= i < self._w:
            return -1
        return i

    def _on_full(self, rows: np.ndarray, k: int, h: tuple, now: float) -> bool:
        """A full-size datagram: a RESULT, or garbage. True = apply it (RULE A)."""
        version, op, flags, job, trigger, slot, rnd, chunk, count, bitmap, mode = h
        i = slot - self.config.slot_base
        if (version != wire.VERSION or op != Op.RESULT or job != self.config.job_id
                or not 0 <= i < self._w or count == 0):
            try:
                wire.Packet.decode(rows[k:k + 1].tobytes())
                reason = (f"op {op} job {job} slot {slot} count {count}: not a RESULT of job "
                          f"{self.config.job_id} slots {self.config.slot_base}.."
                          f"{self.config.slot_base + self._w - 1}")
            except wire.WireError as err:
                reason = str(err)
            self._bad(reason)
            return False
        self._last_rx = now
        self._mode[i] = mode
        mine = bitmap & self._bit
        new = self._is_new(i, rnd)
        f = self._flight[i]
        if f is not None and mine and f.chunk == chunk and (
                rnd == f.round if mode != Mode.ASYNC
                else count == 1 and np.array_equal(rows["lanes"][k], f.lanes)):
            self._done(i, f, True, now)
        elif f is not None and not mine and mode != Mode.ASYNC and rnd == f.round \
                and not f.async_style:
            # The round I sent to closed without me. Only the switch's answer to my own
            # packet (a RESEND, a RESYNC) settles it: if the slot turns async before my
            # packet arrives, the switch counts it in an async round instead.
            if flags & Flag.RESEND and trigger == self.config.worker_id:
                self._done(i, f, False, now)  # carried as residual (whatever chunk it had)
            else:
                f.closed = chunk
        if mode != Mode.PARTIAL:
            self._follow_mode(i, now)
        if not new:
            self._stats.duplicate_results += 1
            return False
        if mine and mode == Mode.ASYNC and count == 1 and self._acked[i]:
            lanes = rows["lanes"][k]
            acked = self._acked[i]
            for pos, (acked_chunk, acked_lanes) in enumerate(acked):
                if acked_chunk == chunk and np.array_equal(acked_lanes, lanes):
                    del acked[pos]  # its ACK applied it already
                    return False
        return True

    def _apply(self, rows: np.ndarray, apply: list[int]) -> None:
        sel = rows[apply]
        hdr = np.empty(len(sel), dtype=wire.HEADER_DTYPE)
        for name in wire.HEADER_DTYPE.names:  # type: ignore[union-attr]
            hdr[name] = sel[name]
        self._results.append(hdr)
        raw = sel["lanes"].astype(np.float64)
        avg = raw / sel["count"].astype(np.float64)[:, None]
        chunks = sel["chunk"].astype(np.int64)
        known = chunks < self._next_chunk
        if not known.all():
            for j in np.flatnonzero(~known).tolist():
                self._add(int(chunks[j]), avg[j], raw[j])
            chunks, avg, raw = chunks[known], avg[known], raw[known]
        if len(np.unique(chunks)) == len(chunks):
            self._acc[chunks] += avg
            if self._sums is not None:
                self._sums[chunks] += raw
        else:
            np.add.at(self._acc, chunks, avg)
            if self._sums is not None:
                np.add.at(self._sums, chunks, raw)

    def _on_short(self, view: memoryview, size: int, now: float) -> None:
        """A header-only datagram: RESYNC or ACK, or garbage."""
        try:
            if size != wire.HEADER_BYTES:
                if size > P:
                    raise wire.WireError(f"datagram longer than a {P}-byte HySync packet")
                wire.Packet.decode(bytes(view[:size]))
                raise wire.WireError(f"{size}-byte datagram")
            h = wire.Packet.decode(bytes(view[:size])).header
        except wire.WireError as err:
            self._bad(str(err))
            return
        i = self._slot_index(h.job_id, h.slot)
        if i < 0 or h.worker_id != self.config.worker_id or h.op not in (Op.RESYNC, Op.ACK):
            self._bad(f"{Op(h.op).name} for job {h.job_id} worker {h.worker_id} slot {h.slot} "
                      f"is not a reply to worker {self.config.worker_id} of job "
                      f"{self.config.job_id}")
            return
        self._last_rx = now
        self._mode[i] = h.mode
        if h.op == Op.ACK:
            self._on_ack(i, h, now)
        else:
            self._on_resync(i, h, now)
        if h.mode != Mode.PARTIAL:
            self._follow_mode(i, now)

    def _on_ack(self, i: int, h: wire.Header, now: float) -> None:
        self._stats.acks += 1
        f = self._flight[i]
        if f is None or h.round != f.round or h.chunk != f.chunk:
            self._stats.stray_replies += 1
            return
        self._counted_without_result(i, f, now)

    def _on_resync(self, i: int, h: wire.Header, now: float) -> None:
        reason = h.reason
        try:
            self._stats.resyncs[ResyncReason(reason).name] += 1
        except ValueError:
            self._bad(f"RESYNC with unknown reason {reason}")
            return
        self._advance(i, h.round)
        f = self._flight[i]
        if reason == ResyncReason.CHUNK_MISMATCH:
            # Only a contribution for the open round (h.round) with another chunk gets this.
            if f is None or f.async_style or h.round != f.round or h.chunk == f.chunk:
                self._stats.stray_replies += 1
                return
            self._retarget(i, f, h.chunk, h.round, h.mode, now)
            return
        # STALE_*: the contribution's round was neither open nor just closed, so the
        # open round is at least two ahead of a sync-style round in flight.
        if f is None or (not f.async_style
                         and not 2 <= (h.round - f.round) & MASK32 < HALF32):
            self._stats.stray_replies += 1  # cannot be about the packet in flight
            return
        if f.probe:  # first contact: no older packet of mine exists to confuse it with
            f.stale = (reason, h.mode)
            self._decide_stale(i, f, now)
            return
        if f.stale is None:
            self._gen += 1
            f.gen = self._gen
            heapq.heappush(self._timers, (now + self._rto, f.gen, i))
        f.stale = (reason, h.mode)  # the latest plausible reply wins

    def _decide_stale(self, i: int, f: _Flight, now: float) -> None:
        """A STALE reply stood for a grace period without the round's result arriving."""
        reason, mode = f.stale  # type: ignore[misc]
        f.stale = None
        if reason == ResyncReason.STALE_COUNTED:
            self._counted_without_result(i, f, now)
        elif f.async_style or mode == Mode.SYNC:
            self._relaunch(i, f, now)  # not counted: again at the open round
        else:
            self._done(i, f, False, now)  # partial: its round is gone, carried (not chased)

    def _counted_without_result(self, i: int, f: _Flight, now: float) -> None:
        """ACK / STALE_COUNTED: the switch's member_seq holds f's round field, so f was
        counted, and its result did not reach me."""
        if not f.async_style and f.round == 0 and f.closed is not None:
            # member_seq starts at 0: a round-0 contribution whose round closed without
            # me matches it without ever having been counted.
            self._done(i, f, False, now)
            return
        if f.async_style or f.closed is not None:
            # Counted in an async round (a sync-style packet whose round had closed
            # without me can only have been counted after the slot turned async): the
            # result of an async round is exactly my lanes / 1.
            self._apply_own(i, f)
        else:
            # Counted in sync round f.round; its result is late or lost: suspect it.
            self._advance(i, (f.round + 1) & MASK32)
        self._done(i, f, True, now)

    def _retarget(self, i: int, f: _Flight, chunk: int, rnd: int, mode: int,
                  now: float) -> None:
        """CHUNK_MISMATCH: the open round `rnd` aggregates `chunk`; contribute to it:
        my own `chunk` if it is pending in this call, else its residual (a zero
        contribution if no key owns it and the round is sync).

        f's chunk waits for a later round in sync, where every round needs every
        member anyway. In partial mode the others have passed it: it is carried
        (RULE B) rather than chased into a round of its own, which would wait for the
        others' next call (and, across slots, could wait forever)."""
        call = self._call
        local = call.pending(chunk, i) if call is not None else -1
        reg = self._key_of(chunk) if local < 0 else None
        if local < 0 and reg is None and mode != Mode.SYNC:
            return  # a partial round closes without me: its result settles f
        if mode != Mode.SYNC or f.parked:
            self._done(i, f, False, now, send_next=False)
        else:
            self._flight[i] = None
            self._inflight -= 1
            if f.kind == OWN and call is not None:
                call.queues[i].appendleft(f.local)
            elif f.kind == RESIDUAL:
                self._return_residual(f, included=False)
        if local >= 0:
            call.queues[i].remove(local)  # type: ignore[union-attr]
            self._send_own(i, local, rnd, now)
        elif reg is not None:
            self._send_extra(i, RESIDUAL, reg, chunk, rnd, now)
        else:
            self._send_extra(i, NULL, None, chunk, rnd, now)

"""The worker's reliable, windowed HySync transport over one UDP socket.

The protocol (docs/protocol.md §9: chunks and slots, RULE A / RULE B, sync / partial /
async, parking, timers, failures) runs in the compiled core, `hysync._core.worker.Engine`
(native/worker/), with the GIL released for a whole call. This module keeps the meaning:
the socket and its bind error, keys by name, the no-reply error, logs and
`CallStats`.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from hysync import _core, logs, wire
from hysync.wire import ResyncReason
from hysync.worker.call_stats import CallStats
from hysync.worker.config import TransportConfig
from hysync.worker.quantize import FixedPointQuantizer, QuantStats

__all__ = ["CallAbortedError", "CallResult", "NoReplyError", "SwitchRestartedError", "Transport",
           "TransportClosedError", "TransportConfig", "check_key"]

log = logging.getLogger(__name__)
# A call that retransmitted more than once per chunk, and at least this often, is a storm.
STORM_RETRANSMITS = 16
# Transport.finish looks at what is still in flight this often (seconds).
FINISH_POLL = 0.05


class CallAbortedError(ConnectionError):
    """A call the switch did not complete, for one of the two reasons below: catch this for
    either."""


class NoReplyError(CallAbortedError):
    """No reply from the switch within `dead_after` seconds while contributions waited.
    (The controller's `P4RuntimeUnreachableError` is another thing: its gRPC channel.)"""


class SwitchRestartedError(CallAbortedError):
    """The switch answered from state that is new for the job (it restarted, or the job was
    removed and added again): the call's contributions in flight have unknown fate. They stay
    as residual, the replica needs a resync, and the next call learns the switch's new rounds."""


class TransportClosedError(RuntimeError):
    """The transport was closed: before the call, or during it (from another thread), which
    ended the call at once. Not a CallAbortedError: nothing is wrong with the switch, and
    retrying on this transport cannot help."""


def check_key(key: object) -> str:
    """`key` itself if it is a str (what a key is); else a TypeError that names the fix."""
    if type(key) is not str:
        raise TypeError(f"a HySync key is a str (its name from the caller to the wire), got "
                        f"{type(key).__name__} {key!r}: name it, e.g. 'layer1' or "
                        f"bucket_key(index)")
    return key


@dataclass(frozen=True, slots=True)
class CallResult:
    output: np.ndarray  # float32, one element per input element
    stats: CallStats


class Transport:
    def __init__(self, config: TransportConfig, quantizer: FixedPointQuantizer) -> None:
        self.config = config
        self.quantizer = quantizer
        try:
            switch_ip = socket.gethostbyname(config.switch_host)
        except OSError as err:
            raise ValueError(f"TransportConfig.switch_host {config.switch_host!r} does not "
                             f"resolve ({err}): give the switch's IPv4 address") from None
        self._sock = _bound_socket(config)
        self.address: tuple[str, int] = self._sock.getsockname()
        seed = config.seed if config.seed is not None else random.getrandbits(63)
        self._engine = _core.worker.Engine(
            config.engine_config(switch_ip, quantizer.scale, seed), fd=self._sock.fileno())
        # Held by the one call in the engine (allreduce, poll_results, finish's polls); close()
        # waits for it before it closes the socket.
        self._calling = threading.Lock()
        self._caller: int | None = None  # the thread of the call in the engine

    def close(self) -> None:
        """Close the transport. Safe from any thread at any time, more than once.

        A call in progress on another thread (allreduce, poll_results, finish) is ended at
        once, as a failed call ends: its contributions stay as residual and the replica needs
        a resync; it raises TransportClosedError. close() returns once that call has left
        the engine and the socket is closed, and every later call raises
        TransportClosedError. Ending the call, rather than refusing to close, is what the
        callers that close during a call need: a DDP hook's teardown or a test's cleanup
        must not wait out `dead_after` (up to a minute) for a call whose peers are gone, and
        the engine must never use the socket's descriptor after it is closed (the number is
        reused by the next socket the process opens, whose datagrams it would read)."""
        self._engine.close()  # the call in progress, if any, returns at once
        if self._caller == threading.get_ident():
            # close() from a signal handler that runs inside this thread's own call (the
            # engine checks for signals while it waits): that call closes the socket as it
            # leaves the engine.
            return
        with self._calling:
            self._sock.close()

    # ------------------------------------------------------------ keys
    # A key is a str, its name from the caller to the wire: the engine keeps each key, and its
    # residual from call to call, under it (native/worker/keys.h, "the key's path").
    def register(self, key: str, numel: int) -> None:
        """Give `key` its chunk range now (otherwise its first call does). Every worker of a
        job must register the same keys, with the same sizes, in the same order (DDP does).
        A key registered again with another size gets a new chunk range, and its residual
        (at most the last quantization error in sync) is dropped: every worker sees the same
        change, e.g. DDP rebuilding its buckets after the first step."""
        self._engine.register(check_key(key), numel)
        self._emit_logs()

    def first_chunk(self, key: str) -> int:
        """The global id of `key`'s first chunk."""
        return self._engine.first_chunk(check_key(key))

    def residual(self, key: str) -> np.ndarray:
        """The float32 residual the engine keeps for `key` from call to call: a live, writable
        view, padded to whole chunks. The one way Python sees it - to checkpoint or restore
        it (between calls: a call's thread writes it), or to inspect it."""
        return self._engine.residual(check_key(key))

    def take(self, key: str) -> np.ndarray:
        """Hand over what has been applied for `key` since its last call, without contributing."""
        out = np.empty(self._engine.size(check_key(key)), dtype=np.float32)
        self._engine.take(key, out)
        return out

    # ------------------------------------------------------------ health
    @property
    def needs_resync(self) -> bool:
        """True when this replica missed results it cannot get back: re-synchronize it
        (e.g. at the next model-averaging round), then call clear_resync()."""
        return self._engine.needs_resync

    def clear_resync(self) -> None:
        """The replica was re-synchronized: forget missed and suspected rounds."""
        self._engine.clear_resync()

    @property
    def missed_results(self) -> int:
        """Suspected rounds older than missed_after, beyond own ACKed contributions."""
        return self._engine.missed_results

    @property
    def bad_datagrams(self) -> int:
        return self._engine.bad_datagrams

    # ------------------------------------------------------------ the call
    def allreduce(self, key: str, values: np.ndarray, *, in_place: bool = False) -> CallResult:
        """Contribute `values` under `key`; return what was applied for it: float32 per
        element, the sum of `sum / count` (an async result's `sum / members`) of every result
        applied for the key's chunks since its last call, divided by the quantizer's scale.
        With `in_place`, `values` (float32, contiguous) receives the output: no copy of a
        large tensor. The key's residual (error feedback) stays in the engine from call to
        call, a failed call's included (see `residual`)."""
        values = np.asarray(values)
        check_key(key)
        if in_place:
            if values.dtype != np.float32 or not values.flags.c_contiguous \
                    or not values.flags.writeable:
                raise ValueError("allreduce(in_place=True) needs a writable contiguous float32 "
                                 f"array, got a {'' if values.flags.c_contiguous else 'strided '}"
                                 f"{values.dtype} one: convert it first or drop in_place")
            out = values.reshape(-1)  # a view: the output lands in the caller's buffer
        else:
            out = np.array(values, dtype=np.float32, copy=True).reshape(-1)
        self._enter("allreduce", key)
        try:
            self._engine.reset_stats()
            start = time.monotonic()
            done = self._engine.allreduce(key, out)
        finally:
            self._leave()
            self._emit_logs()
        if not done and self._engine.closed:  # (a call that ended done keeps its output)
            raise self._closed_error("allreduce", key)
        stats = self._stats(key=key, elements=out.size, chunks=max(1, -(-out.size // wire.LANES)),
                            elapsed_s=time.monotonic() - start)
        self._log_events(stats)
        if stats.quant.clipped:
            # Sent as overflow (non-finite on every member, as fp16's): a loss scaler backs
            # off; a job without one must lower the scale.
            q = stats.quant
            limit = self.quantizer.bound / self.quantizer.scale
            log.warning("key %r: %d of %d elements beyond the quantizer's range (+-%.4g) were "
                        "sent as overflow: every member gets them as NaN; lower the quantizer "
                        "scale if no loss scaler backs off", key, q.clipped, q.elements, limit)
        if not done:
            if self._engine.reset_why:
                cfg = self.config
                host, port = cfg.switch_address
                raise SwitchRestartedError(
                    f"HySync switch at {host}:{port}, job {cfg.job_id}, worker "
                    f"{cfg.worker_id}: {self._engine.reset_why}. The "
                    f"call's contributions in flight are kept as residual and the replica must "
                    f"be resynchronized; the next call goes on with the switch's new state.")
            raise self._no_reply()
        return CallResult(out, stats)

    def poll_results(self, duration: float) -> CallStats:
        """Between calls (while the model computes): apply whatever arrives for `duration`
        seconds and keep retrying packets in flight - parked ones too, so that an excluded
        worker keeps its heartbeat - then judge suspected rounds."""
        self._enter("poll_results")
        try:
            self._engine.reset_stats()
            self._engine.poll(duration)
        finally:
            self._leave()
            self._emit_logs()
        if self._engine.closed:
            raise self._closed_error("poll_results")
        return self._stats()

    def _enter(self, what: str, key: str | None = None) -> None:
        """Take the engine for one call: refused while another call runs, or once closed."""
        if self._engine.closed:
            raise self._closed_error(what, key)
        if not self._calling.acquire(blocking=False):
            raise RuntimeError(f"Transport.{what} during another call: the transport runs one "
                               "call at a time (allreduce, poll_results, finish); wait for it "
                               "to return, or queue calls (HySyncWorker does)")
        self._caller = threading.get_ident()

    def _leave(self) -> None:
        self._caller = None
        if self._engine.closed:
            self._sock.close()  # close() ran meanwhile, maybe in this thread (see close)
        self._calling.release()

    def _closed_error(self, what: str, key: str | None = None) -> TransportClosedError:
        cfg = self.config
        call = f"Transport.{what}" + ("" if key is None else f" of key {key!r}")
        return TransportClosedError(
            f"{call} (job {cfg.job_id}, worker {cfg.worker_id}): the transport is closed - "
            f"close() ended or refused the call; open a new Transport to go on")

    def finish(self, timeout: float | None = None) -> CallStats:
        """After the last call: keep the packets in flight retrying until every one is
        settled, or `timeout` seconds (default `dead_after`) have passed; what comes in is
        applied as poll_results applies it. Behind a leaf a host's retries are what move its
        leaf's pending sum and held round (docs/protocol.md §11, "What a host does"); the
        returned stats' `in_flight` is what was still unsettled."""
        limit = self.config.dead_after if timeout is None else timeout
        if limit < 0:
            raise ValueError(f"finish timeout {limit} s is negative: give seconds >= 0")
        if self._engine.closed:
            raise self._closed_error("finish")
        end = time.monotonic() + limit
        stats = self._stats()
        while stats.in_flight and time.monotonic() < end:
            stats = self.poll_results(min(FINISH_POLL, max(0.0, end - time.monotonic())))
        return stats

    def _stats(self, **fields: object) -> CallStats:
        raw = self._engine.stats()
        resyncs = Counter({ResyncReason(r).name: n for r, n in enumerate(raw.pop("resyncs"))
                           if n})
        elements, clipped, nonfinite, max_err = raw.pop("quant")
        absorbed = len(raw.pop("absorbed"))
        results = raw.pop("results").view(wire.HEADER_DTYPE)
        engine = self._engine
        return CallStats(**fields, **raw, resyncs=resyncs, results=results,  # type: ignore[arg-type]
                         absorbed=absorbed,
                         quant=QuantStats(elements, clipped, nonfinite, max_err),
                         srtt_s=engine.srtt, rto_s=engine.rto, needs_resync=engine.needs_resync,
                         in_flight=engine.in_flight, slot_modes=tuple(engine.slot_modes()))

    def _log_events(self, stats: CallStats) -> None:
        """A call's resyncs and retransmission storm as events (hysync/logs.py)."""
        cfg = self.config
        who = {"job": cfg.job_id, "worker": cfg.worker_id}
        if stats.resyncs:
            reasons = dict(stats.resyncs)
            logs.event(log, "resync", f"worker {cfg.worker_id}: key {stats.key!r} resynced "
                       f"({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))})",
                       job=cfg.job_id, worker=cfg.worker_id, key=str(stats.key), reasons=reasons)
        if stats.retransmits >= STORM_RETRANSMITS and stats.retransmits > stats.chunks:
            logs.event(log, "retransmission_storm", f"worker {cfg.worker_id}: key "
                       f"{stats.key!r} retransmitted {stats.retransmits} times for "
                       f"{stats.chunks} chunks (rto {stats.rto_s * 1e3:.1f} ms): packets are "
                       "being lost or the switch is slow to answer", level=logging.WARNING,
                       key=str(stats.key), retransmits=stats.retransmits, chunks=stats.chunks,
                       rto_s=stats.rto_s, **who)

    def _emit_logs(self) -> None:
        for level, message in self._engine.take_logs():
            log.log(level, "%s", message)

    def _no_reply(self) -> NoReplyError:
        cfg = self.config
        host, port = cfg.switch_address
        return NoReplyError(
            f"no reply from the HySync switch at {host}:{port} for {cfg.dead_after:g} s "
            f"(job {cfg.job_id}, worker {cfg.worker_id}, bound to "
            f"{self.address[0]}:{self.address[1]}). Likely causes: the switch is not running "
            f"or not at that address; job {cfg.job_id} is not installed on it; this worker is "
            f"not a member of the job with this source address and port, or was excluded "
            f"(readmit it: `hysync member readmit {cfg.job_id} {cfg.worker_id}`). In sync mode "
            f"a straggler slower than dead_after={cfg.dead_after:g} s looks the same: raise "
            f"dead_after.")


def _bound_socket(cfg: TransportConfig) -> socket.socket:
    if cfg.bind_fd is not None:
        return _inherited_socket(cfg)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((cfg.bind_host, cfg.bind_port))
    except OSError as err:
        sock.close()
        raise OSError(f"worker {cfg.worker_id} cannot bind its HySync socket to "
                      f"{cfg.bind_host}:{cfg.bind_port}: {err}. The switch admits members "
                      "by source address and port: pick the port the job file lists for "
                      "this worker, and make sure no other process holds it.") from err
    return _tuned(sock, cfg)


def _inherited_socket(cfg: TransportConfig) -> socket.socket:
    """The socket of `cfg.bind_fd`, taken over (closing the transport closes it), once it is
    known to be a UDP socket bound to the configured address."""
    try:
        sock = socket.socket(fileno=cfg.bind_fd)
    except OSError as err:
        raise OSError(f"worker {cfg.worker_id}: bind_fd {cfg.bind_fd} is not an open socket "
                      f"({err}): pass the descriptor of a UDP socket bound to "
                      f"{cfg.bind_host}:{cfg.bind_port}, inherited by this process") from err
    address = sock.getsockname() if sock.family == socket.AF_INET else None
    if sock.type != socket.SOCK_DGRAM or address != (cfg.bind_host, cfg.bind_port):
        sock.detach()  # not ours to close
        raise OSError(f"worker {cfg.worker_id}: bind_fd {cfg.bind_fd} is a {sock.type.name} "
                      f"socket bound to {address}, not UDP on "
                      f"{cfg.bind_host}:{cfg.bind_port}: pass the descriptor reserved for "
                      "this worker's address")
    return _tuned(sock, cfg)


def _tuned(sock: socket.socket, cfg: TransportConfig) -> socket.socket:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, cfg.recv_buffer)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.recv_buffer)
    sock.setblocking(False)
    return sock

"""Worker processes and process plumbing of tests/e2e/test_adaptive_membership.py.

Each worker (a multiprocessing "spawn" target) holds two transports, one per job:
the training job, whose mode and membership the adaptive policy changes, and an
averaging job on a slot range and UDP port of its own that always stays sync. The
worker follows the phases the test process signals with events and reports back on
a queue as `(worker, kind, payload)`. Gradients come from a seeded RNG, so the test
process can recompute everything every worker contributed.

Phases of `member_worker`:

1. train: sleep (compute), all-reduce `gradient(spec, w, t)`, until `stop_train`. The
   straggler computes `straggler_factor` times as long as a whole healthy iteration
   would take it (see `straggler_pause`) until `recover` is set.
2. release: zero-gradient calls until every slot reports async (so no partial round
   stays open), and on until `stop_serve`.
3. flush: `flush_calls` zero-gradient calls in sync, a barrier, a final drain: only
   quantization errors remain as residuals, nothing is in flight.
4. average: the replica (the sum of every training output: the "model") is
   all-reduced on the averaging job and the average adopted.

A worker "computes" inside `Transport.poll_results` (the transport's between-calls
service: it applies what arrives and keeps retransmitting packets in flight), not in
`time.sleep`. With a bare sleep an excluded worker goes silent in partial mode: once
every slot holds a parked packet, `allreduce` carries all chunks and returns before
its event loop runs, so the parked packets are never retransmitted again - no
NOT_MEMBER heartbeat, no readmission, and once readmitted no contribution
(`test_an_excluded_worker_keeps_its_heartbeat_between_calls` reproduces it).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from hysync.wire import Mode
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport, TransportConfig

KEY = "g"
MODEL_KEY = "model"
WAIT = 120.0  # a worker waiting for the test process's next signal
EVENTS = ("go", "recover", "stop_train", "stop_serve", "flush", "average")


@dataclass(frozen=True)
class Spec:
    switch: tuple[str, int]  # the softswitch's UDP data plane
    members: int = 4
    train_job: int = 11
    train_base: int = 0
    train_slots: int = 16
    avg_job: int = 12
    avg_base: int = 16
    avg_slots: int = 16
    size: int = 1000  # 16 chunks: one per slot and call
    scale: float = 2.0**20
    straggler: int = 3
    compute_s: float = 0.03  # a healthy worker's compute time per call
    # The straggler's compute time per call, until it recovers: `straggler_pause`.
    straggler_factor: float = 10.0
    straggler_s: float = 0.3  # at least this
    straggler_max_s: float = 1.5  # at most: well below the detector's gone_after_s
    flush_calls: int = 3
    max_train_s: float = 150.0  # bound of the training loop (stop_train never came)
    dead_after: float = 120.0  # an excluded worker's call waits until it is readmitted
    seed: int = 2024


def gradient(spec: Spec, worker: int, call: int) -> np.ndarray:
    rng = np.random.default_rng((spec.seed, worker, call))
    return rng.standard_normal(spec.size).astype(np.float32)


def straggler_pause(spec: Spec, overhead: float) -> float:
    """The straggler's compute time per call: `straggler_factor` times a healthy
    iteration, which is `compute_s` plus `overhead`, what the rest of an iteration costs
    on this machine now (the all-reduce's round trips through the relay and the
    softswitch, and the time a loaded machine adds to every sleep).

    A fixed compute time is not a fixed slowdown: the policy measures paces, whole
    iterations, and on a loaded machine the overhead grows to several times `compute_s`,
    so a fixed 10x compute time shrinks to a slowdown near 1. Bounded by
    `straggler_max_s`: a worker that sends nothing for the detector's `gone_after_s`
    is gone, not slow."""
    pause = spec.straggler_factor * (spec.compute_s + overhead)
    return min(spec.straggler_max_s, max(spec.straggler_s, pause))


def _config(spec: Spec, worker: int, job: int, base: int, slots: int,
            **extra: Any) -> TransportConfig:
    return TransportConfig(job_id=job, worker_id=worker, switch_host=spec.switch[0],
                           switch_port=spec.switch[1], bind_host="127.0.0.1", slot_base=base,
                           slot_count=slots, members=spec.members, dead_after=spec.dead_after,
                           seed=spec.seed * 100 + job * 10 + worker, **extra)


def _wait(event: Any, what: str) -> None:
    if not event.wait(WAIT):
        raise TimeoutError(f"the test process did not signal '{what}' within {WAIT:g} s")


def member_worker(worker: int, spec: Spec, out: Any, events: dict[str, Any],
                  barrier: Any) -> None:
    logging.basicConfig(level=logging.WARNING)
    try:
        quantizer = FixedPointQuantizer(spec.scale, spec.members)
        train = Transport(_config(spec, worker, spec.train_job, spec.train_base,
                                  spec.train_slots), quantizer)
        avg = Transport(_config(spec, worker, spec.avg_job, spec.avg_base, spec.avg_slots),
                        FixedPointQuantizer(spec.scale, spec.members))
        out.put((worker, "bound", {"train": train.address, "avg": avg.address}))
        _wait(events["go"], "go")
        zeros = np.zeros(spec.size, dtype=np.float32)
        model = np.zeros(spec.size)  # the replica: every training output applied
        totals = defaultdict(int)
        recovered_at: int | None = None
        overhead = 0.0  # smoothed: an iteration's time besides the compute asked for

        def call(values: np.ndarray) -> tuple[int, ...]:
            nonlocal model
            result = train.allreduce(KEY, values)
            model += result.output
            st = result.stats
            totals["carried"] += st.carried
            totals["parked"] += st.parked
            totals["retransmits"] += st.retransmits
            totals["stale"] += st.resyncs["STALE_ROUND"] + st.resyncs["STALE_COUNTED"]
            totals["slowest_call_s"] = max(totals["slowest_call_s"], st.elapsed_s)
            for mode, rounds in st.modes.items():
                totals[f"rounds_{mode}"] += rounds
            return st.slot_modes

        # 1. train
        deadline = time.monotonic() + spec.max_train_s
        calls = 0
        while not events["stop_train"].is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"still training after {spec.max_train_s:g} s")
            slow = worker == spec.straggler and not events["recover"].is_set()
            if worker == spec.straggler and not slow and recovered_at is None:
                recovered_at = calls
            pause = straggler_pause(spec, overhead) if slow else spec.compute_s
            began = time.monotonic()
            # "Compute" while the transport serves: see the module docstring.
            train.poll_results(pause)
            call(gradient(spec, worker, calls))
            calls += 1
            overhead += 0.5 * (time.monotonic() - began - pause - overhead)
        out.put((worker, "trained", {"calls": calls, "recovered_at": recovered_at}))
        # 2. release: async closes every open partial round
        seen_async = False
        while not events["stop_serve"].is_set():
            if time.monotonic() > deadline + WAIT:
                raise TimeoutError("still releasing: stop_serve never came")
            modes = call(zeros)
            if not seen_async and all(m == Mode.ASYNC for m in modes):
                seen_async = True
                out.put((worker, "async", None))
            train.poll_results(0.005)
        out.put((worker, "served", None))
        # 3. flush in sync
        _wait(events["flush"], "flush")
        for _ in range(spec.flush_calls):
            call(zeros)
        barrier.wait(WAIT)
        drained = train.finish(timeout=60.0)
        model += train.take(KEY)
        out.put((worker, "result", {
            "model": model.copy(),
            "residual": train.residual(KEY)[:spec.size].astype(np.float64),
            "needs_resync": train.needs_resync, "missed": train.missed_results,
            "in_flight": drained.in_flight, **totals}))
        # 4. the final averaging round, on the averaging job
        _wait(events["average"], "average")
        result = avg.allreduce(MODEL_KEY, model.astype(np.float32))
        model = result.output.astype(np.float64)  # adopted
        if train.needs_resync:
            train.clear_resync()  # the replica is the job's average again
        out.put((worker, "averaged", {
            "model": model, "avg_needs_resync": avg.needs_resync,
            "avg_in_flight": result.stats.in_flight, "avg_modes": dict(result.stats.modes),
            "avg_contributors": dict(result.stats.contributors),
            "train_needs_resync": train.needs_resync}))
        train.close()
        avg.close()
    except BaseException:  # noqa: BLE001 - reported to the test process
        out.put((worker, "error", traceback.format_exc()))


# ------------------------------------------------------------------ test-process side
class WorkerFailed(AssertionError):
    pass


class Cluster:
    """The worker processes, their events and the queue they report on."""

    def __init__(self, spec: Spec, timeout: float = 90.0) -> None:
        ctx = mp.get_context("spawn")
        self.spec, self.timeout = spec, timeout
        self.out = ctx.Queue()
        self.events = {name: ctx.Event() for name in EVENTS}
        self.barrier = ctx.Barrier(spec.members)
        self.procs = [ctx.Process(target=member_worker, daemon=True, name=f"e2emem-w{w}",
                                  args=(w, spec, self.out, self.events, self.barrier))
                      for w in range(spec.members)]
        self._got: dict[str, dict[int, Any]] = defaultdict(dict)

    def __enter__(self) -> Cluster:
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        for p in self.procs:
            p.join(timeout=10 if exc_type is None else 0.1)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def _take(self, timeout: float) -> bool:
        try:
            worker, kind, payload = self.out.get(timeout=timeout)
        except queue.Empty:
            return False
        if kind == "error":
            raise WorkerFailed(f"worker {worker} failed:\n{payload}")
        self._got[kind][worker] = payload
        return True

    def check(self) -> None:
        """Raise if a worker reported an error or died; file every other message."""
        while self._take(0.0):
            pass
        self._check_alive()

    def _check_alive(self) -> None:
        done = set(self._got["averaged"])  # the last message: a worker may exit after it
        dead = [w for w, p in enumerate(self.procs) if not p.is_alive() and w not in done]
        if dead:
            while self._take(0.5):  # its last words may still be in the queue
                pass
            raise WorkerFailed(f"worker process(es) {dead} exited without a word (exit "
                               f"codes {[p.exitcode for p in self.procs]})")

    def collect(self, tag: str, timeout: float | None = None) -> dict[int, Any]:
        """Wait for message `tag` from every worker (bounded); raise if one failed."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self._got[tag]) < self.spec.members:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(self.spec.members)) - set(self._got[tag]))
                raise WorkerFailed(f"timed out waiting for '{tag}' from workers {missing}")
            if not self._take(min(left, 1.0)):
                self._check_alive()
        return dict(self._got[tag])

"""Runs the worker processes of tests/worker/procs.py against a switch (optionally
through a lossy relay) and drives their phases from the test process."""

from __future__ import annotations

import multiprocessing as mp
import queue
from collections import defaultdict
from typing import Any

from hysync.wire import Mode
from tests.worker import procs
from tests.worker.conftest import Job, Switch
from tests.worker.relay import LossyRelay

# How long the test process waits for a worker's next message. A worker's phase takes as
# long as the machine lets it (seconds when idle, minutes beside other jobs on two cores),
# so the wait is not a bound on that: it ends at once when a worker process dies, and
# this backstop only ends a worker that hangs while alive.
HUNG_AFTER = 1200.0
POLL = 0.5  # how often the wait looks at the workers' processes
EVENTS = ("go", "phase", "stop_serve", "flush")


class WorkerFailed(AssertionError):
    pass


class Cluster:
    def __init__(self, target: Any, spec: procs.Spec) -> None:
        ctx = mp.get_context("spawn")
        self.spec = spec
        self.out = ctx.Queue()
        self.events = {name: ctx.Event() for name in EVENTS}
        self.barrier = ctx.Barrier(spec.members)  # referenced here: start() drops args
        self.procs = [ctx.Process(target=target, daemon=True,
                                  args=(w, spec, self.out, self.events, self.barrier))
                      for w in range(spec.members)]
        self._early: dict[str, dict[int, Any]] = defaultdict(dict)

    def __enter__(self) -> Cluster:
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()

    def collect(self, tag: str) -> dict[int, Any]:
        """Wait for message `tag` from every worker; raise at once if one failed."""
        got = self._early.pop(tag, {})
        waited = 0.0
        while len(got) < self.spec.members:
            try:
                worker, kind, payload = self.out.get(timeout=POLL)
            except queue.Empty:
                waited += POLL
                self._check_alive(tag, set(got), waited)
                continue
            waited = 0.0
            if kind == "error":
                raise WorkerFailed(f"worker {worker} failed:\n{payload}")
            if kind == tag:
                got[worker] = payload
            else:
                self._early[kind][worker] = payload
        return got

    def _check_alive(self, tag: str, got: set[int], waited: float) -> None:
        missing = sorted(set(range(self.spec.members)) - got)
        dead = {w: self.procs[w].exitcode for w in missing if self.procs[w].exitcode is not None}
        if dead:
            # A worker that caught its failure put it on the queue before it exited.
            while not self.out.empty():
                worker, kind, payload = self.out.get()
                if kind == "error":
                    raise WorkerFailed(f"worker {worker} failed:\n{payload}")
            raise WorkerFailed(f"workers {dead} (exit codes) ended without sending '{tag}'")
        if waited >= HUNG_AFTER:
            raise WorkerFailed(f"workers {missing} alive but silent for {waited:.0f} s "
                               f"waiting for '{tag}': hung")

    def install(self, switch: Switch, relay: LossyRelay | None, mode: Mode = Mode.SYNC,
                quorum: int = 0) -> Job:
        bound = self.collect("bound")
        members = []
        for w in range(self.spec.members):
            host, port = relay.add_worker(bound[w]) if relay else bound[w]
            members.append((w, host, port))
        job = Job(self.spec.job_id, self.spec.slot_base, self.spec.slot_count, members)
        switch.install(job, mode, quorum)
        self.events["go"].set()
        return job

    def run_phased(self, switch: Switch, relay: LossyRelay | None, mode: Mode,
                   quorum: int = 0) -> dict[int, dict[str, Any]]:
        """Drive procs.phased_worker: sync warm-up, `mode`, async release, sync flush."""
        job = self.install(switch, relay)
        self.collect("warm")
        switch.set_mode(job, mode, quorum)
        self.events["phase"].set()
        self.collect("done")
        return self.finish_phased(switch, job)

    def finish_phased(self, switch: Switch, job: Job) -> dict[int, dict[str, Any]]:
        """After "done": async release, sync flush, the results."""
        switch.set_mode(job, Mode.ASYNC)
        self.collect("async")
        self.events["stop_serve"].set()
        self.collect("served")
        switch.set_mode(job, Mode.SYNC)
        self.events["flush"].set()
        return self.collect("result")

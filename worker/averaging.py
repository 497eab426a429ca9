"""Background model averaging through the switch (ShadowSync).

Partial and async rounds, and momentum over rounds applied late, let replicas drift
apart; a replica that was excluded, or fell out of the switch's retransmission
window, misses results for good. ShadowSync's answer: besides the gradient
all-reduce, the replicas average their *parameters* now and then, in the background,
off the training's critical path. Here that average runs through the switch too, as a
second HySync job with a slot range (and a UDP port per worker) of its own that always
stays `sync` - so it never meets the training job's mode swaps, membership changes or
counters - on its own transport thread (`HySyncWorker`).

The training loop calls `at_step(progress)` between steps (no tensor is touched while
forward/backward/optimizer run) and `finish(progress)` once at the end:

* Averaging round k starts when the job clock (`progress`, the updates applied, the
  same on every replica) first reaches k * `every`: the parameters are copied (the
  snapshot) and all-reduced in the background while training goes on. Every replica
  starts the same rounds in the same order - what pairs them at the switch (sync,
  same key) - so the number of rounds is fixed by the clock: every multiple of
  `every` below `steps`.
  A replica that needs resynchronizing starts its next round at once instead of
  waiting for its clock (the others, ahead of it, are already waiting in that round).
* When a round's average arrives, the replica moves by `average - snapshot` (the
  local progress made since the snapshot is kept). A replica that needed resync before
  the snapshot also adopts the job clock of the replicas that did not (carried in the
  same vector, so the run ends together), and its training transport's resync flag is
  cleared.
* `finish` completes the owed rounds, then runs the *final* round: every replica
  adopts the average itself, so all replicas are bit-identical (they apply the same
  integer results).

The averaged vector is the flat parameters plus two entries: `clock / steps * healthy`
and `healthy` (1 for a replica that did not need resync), so the mean clock of the
healthy replicas is `mean(clock * healthy) / mean(healthy)` - sync rounds of the
averaging job include every active member, so the results are means.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import torch

from worker.api import HySyncWorker

log = logging.getLogger(__name__)

KEY = "model-average"


class BackgroundAverager:
    """Averages `params` every `every` updates of the job clock, through `worker`."""

    def __init__(self, worker: HySyncWorker, params: Sequence[torch.Tensor], *, every: float,
                 steps: int, needs_resync: Callable[[], bool] = lambda: False,
                 clear_resync: Callable[[], None] = lambda: None) -> None:
        if not every > 0:
            raise ValueError(f"the averaging period must be > 0 updates, got {every}")
        self.worker = worker
        self.params = list(params)
        self.every, self.steps = float(every), steps
        # Background rounds of the whole run: at every, 2 every, ... before the end (the
        # final round takes the place of one at `steps`).
        self.rounds = max(0, math.ceil(steps / every - 1e-9) - 1)
        self._needs_resync, self._clear_resync = needs_resync, clear_resync
        self.started = 0
        self.history: list[dict[str, float]] = []  # one record per finished round
        self._pending: tuple[torch.futures.Future, torch.Tensor, bool, float] | None = None

    # -------------------------------------------------------------- training-loop calls
    def at_step(self, progress: float) -> float:
        """Between two steps: apply a finished round, start a due one. Returns the job
        clock to continue from (a resynchronized replica adopts the group's)."""
        if self._pending is not None and self._pending[0].done():
            progress = self._apply(progress, final=False)
        if self._pending is None and self.started < self.rounds and (
                progress >= (self.started + 1) * self.every - 1e-9 or self._needs_resync()):
            self._start(progress)
        return progress

    def finish(self, progress: float) -> float:
        """End of training: the owed background rounds, then the final averaging round
        after which every replica holds the same parameters."""
        while True:
            if self._pending is not None:
                self._pending[0].wait()
                progress = self._apply(progress, final=False)
            if self.started >= self.rounds:
                break
            self._start(progress)
        self._start(progress)
        self._pending[0].wait()
        return self._apply(progress, final=True)

    # -------------------------------------------------------------- one round
    def _flat(self) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in self.params])

    def _start(self, progress: float) -> None:
        snapshot = self._flat()
        healthy = not self._needs_resync()
        clock = min(progress, self.steps) / self.steps
        vector = torch.cat([snapshot, torch.tensor([clock * healthy, float(healthy)])])
        self._pending = (self.worker.allreduce_async(vector, key=KEY), snapshot, healthy,
                         progress)
        self.started += 1

    def _apply(self, progress: float, *, final: bool) -> float:
        assert self._pending is not None
        future, snapshot, healthy, started_at = self._pending
        self._pending = None
        average = future.value()  # raises the transport's error, if any
        n = snapshot.numel()
        clock_sum, healthy_share = float(average[n]), float(average[n + 1])
        with torch.no_grad():
            offset = 0
            for p in self.params:
                new = average[offset:offset + p.numel()].reshape(p.shape).to(p.dtype)
                if final:
                    p.copy_(new)
                else:
                    old = snapshot[offset:offset + p.numel()].reshape(p.shape).to(p.dtype)
                    p.add_(new - old)
                offset += p.numel()
        drift = float((average[:n] - snapshot).abs().max())
        if not healthy:
            if healthy_share > 0.5 / max(1, self.worker.config.members):
                group = clock_sum / healthy_share * self.steps
                if group > progress:
                    log.warning("worker %d resynchronized by model averaging: replica moved "
                                "by up to %.4g, job clock %.1f -> %.1f",
                                self.worker.config.worker_id, drift, progress, group)
                    progress = group
            self._clear_resync()
        self.history.append({"round": len(self.history), "final": final,
                             "started_at": round(started_at, 3), "applied_at": round(progress, 3),
                             "healthy": healthy, "max_drift": drift})
        return progress

    def close(self) -> None:
        self.worker.close()

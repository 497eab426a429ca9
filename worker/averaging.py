"""Background model averaging through the switch (ShadowSync).

Partial and async rounds, and momentum over rounds applied late, let replicas drift
apart; a replica that was excluded, or fell out of the switch's retransmission
window, misses results for good. ShadowSync's answer: besides the gradient
all-reduce, a background thread averages the replicas' *parameters* over and over,
off the training's critical path. Here that average runs through the switch too, as a
second HySync job with a slot range (and a UDP port per worker) of its own that always
stays `sync` - so it never meets the training job's mode swaps, membership changes or
counters - on its own transport (`HySyncWorker`).

A round, on the averaging thread, every `period_s` seconds:

* snapshot = the parameters, plus the moves of earlier rounds not applied yet (taken
  under the step lock, which the training loop holds while the optimizer writes them,
  so the snapshot is one consistent model; a loop the averager cannot see into holds
  it through `optimizer_steps_hold_lock`, never across a whole step: a step blocked in
  a gradient call, as an excluded member's is until readmission, must not hold every
  replica's averaging up); all-reduce it (sync: every active member's
  round-k snapshot meets the others' round k - a collective, so the rounds pair up by
  themselves, whatever each replica's pace);
* the move `average - snapshot` waits for the training loop, which applies it between
  two steps (`at_step`; never while forward/backward hold the parameters), keeping the
  local progress made since the snapshot. A training thread blocked in a call (an
  excluded member waits until it is readmitted) applies the moves when it resumes.

A round is two all-reduces. The first, of five numbers, decides: `clock / steps *
healthy`, its square, `healthy` (1 for a replica whose training transport did not need
resynchronizing), `done` (1 once this replica has finished training) and `uneven` (1 if
the training transport made an uneven call since this replica's last parameter round,
`HySyncWorker.uneven_calls`: a partial or async round, a round without every member...).
The second, of the parameters, runs only if some replica is uneven or unhealthy, or in
the final round. While a job runs sync with every member, every replica applies the same
sums step by step, so averaging would move nothing - and, its snapshots taken a step
apart, would shift replicas that were one model - at the cost of a gradient all-reduce
a period. Every replica sees the same first sums, so all make the same choice and the
rounds stay paired. (`uneven_calls` not given: every round averages.)

*Snapshots of one clock.* Replicas that apply the same results are one model at the
same job clock, and differ only by the progress between their clocks. A move
`average - snapshot` added to a replica's current parameters replaces its snapshot by
the average, so snapshots taken at different clocks leave each replica off by its own
share of that progress: differences the next even rounds (sync with every member)
never average away. On a starved machine the averaging threads wake far apart (a
replica several steps ahead of another at its snapshot), and a run that went back to
sync ended with replicas drifted apart. So the voters move only when their snapshots'
clocks spread by at most `max_clock_spread` steps (the standard deviation, from the
clocks' sum and sum of squares in the first sums); a wider round still averages, for
the replicas that resynchronize by it, and the voters keep their parameters and average
at a later round (their uneven calls stay unaveraged until one has a narrow spread).

A replica behind the mean clock of the healthy ones, `mean(clock * healthy) /
mean(healthy)` (it missed results, or was excluded), adopts it, so the run ends
together; a replica that needed resync has its transport's flag cleared. Only the
healthy replicas *vote* in the parameter average: one that missed results holds a model
the job never had, which would pull every replica towards it, so it adds zeros and
adopts the voters' average (the parameter all-reduce carries the vote as one more
element, the divisor; with no healthy replica, all vote). The first
round whose first sums say every active member is done (`mean(done) == 1`) is the
*final* round: every replica sees the same average, stops there and adopts it, so all
replicas end bit-identical (they apply the same integer results). A member that dies
must be excluded from the averaging job (the runner does it when its process ends).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from hysync.worker.api import HySyncWorker

log = logging.getLogger(__name__)

KEY = "model-average"
KEY_HEADER = "model-average-header"  # the round's first all-reduce: whether to average

_running: weakref.WeakSet[BackgroundAverager] = weakref.WeakSet()


def _stop_at_exit() -> None:
    """The main thread has ended (a script that never called close, or finish): stop
    every averaging thread. Their calls end too (worker/api.py abandons them), so
    threading joins the threads before the interpreter finalizes; none is left inside
    a native wait."""
    for averager in list(_running):
        averager._final.set()


threading._register_atexit(_stop_at_exit)  # type: ignore[attr-defined]


class BackgroundAverager:
    """Averages `params` through `worker` every `period_s` seconds on a thread of its own."""

    def __init__(self, worker: HySyncWorker, params: Sequence[torch.Tensor], *,
                 period_s: float, steps: int, needs_resync: Callable[[], bool] = lambda: False,
                 clear_resync: Callable[[], None] = lambda: None,
                 uneven_calls: Callable[[], int] | None = None,
                 max_clock_spread: float = 2.0) -> None:
        if not period_s > 0:
            raise ValueError(f"the averaging period must be > 0 s, got {period_s}")
        if not max_clock_spread >= 0:
            raise ValueError(f"the averaging max_clock_spread must be >= 0 steps, got "
                             f"{max_clock_spread}")
        self.worker = worker
        self.params = list(params)
        self.period_s = period_s
        self.steps = steps  # the clock travels as clock / steps: within the quantizer's range
        self.max_clock_spread = max_clock_spread  # voters' snapshots, in steps (module doc)
        self._needs_resync, self._clear_resync = needs_resync, clear_resync
        # The training transport's HySyncWorker.uneven_calls; None: every round averages.
        self._uneven_calls = uneven_calls
        self._even_since: int | None = None  # its value at the last parameter round
        self.step_lock = threading.Lock()  # held by the training loop around optimizer.step
        self._optimizer_depth = 0  # optimizer steps under way (optimizer_steps_hold_lock)
        self._lock = threading.Lock()  # the fields below
        # The averaging state lives where the parameters do (a CUDA model: on its GPU).
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self._pending = torch.zeros(sum(p.numel() for p in self.params), dtype=torch.float32,
                                    device=self.device)
        self._clock = 0.0  # the job clock as the training loop last reported it
        self._adopt: float | None = None  # a job clock to adopt (after a resync)
        self._resynced = False  # clear the training transport's flag at the next step
        self._done = False
        self._final = threading.Event()
        self._error: BaseException | None = None
        self.history: list[dict[str, object]] = []  # one record per round
        # Not a daemon: a daemon thread may still wait in a native call (a torch future)
        # while the interpreter finalizes, and dies there with SIGABRT; at exit this one
        # is stopped (_stop_at_exit) and joined.
        self._thread = threading.Thread(target=self._loop,
                                        name=f"hysync-averaging-w{worker.config.worker_id}")
        _running.add(self)
        self._thread.start()

    # -------------------------------------------------------------- training-loop calls
    def at_step(self, clock: float) -> float:
        """Between two steps: apply the moves of finished rounds. Returns the job clock
        to go on from (a resynchronized replica adopts the group's)."""
        self._raise()
        with self._lock:
            self._clock = clock
            if self._adopt is not None and self._adopt > clock:
                clock = self._clock = self._adopt
            self._adopt = None
            if self._resynced:  # here: the training transport runs no call between steps
                self._clear_resync()
                self._resynced = False
            if self._pending.any():
                self._write(self._pending, add=True)
                self._pending.zero_()
        return clock

    @contextlib.contextmanager
    def optimizer_steps_hold_lock(self) -> Iterator[None]:
        """While inside, every optimizer step in this process holds the step lock (torch's
        global step hooks), for a training loop whose optimizer the caller does not know
        (hysync.torch). A step that wraps another (ZeroRedundancyOptimizer) takes it once;
        one that raised leaves it held until the context ends."""
        def before(*_: object) -> None:
            if self._optimizer_depth == 0:
                self.step_lock.acquire()
            self._optimizer_depth += 1

        def after(*_: object) -> None:
            self._optimizer_depth -= 1
            if self._optimizer_depth == 0:
                self.step_lock.release()

        hooks = [register_optimizer_step_pre_hook(before),
                 register_optimizer_step_post_hook(after)]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
            if self._optimizer_depth:
                self._optimizer_depth = 0
                self.step_lock.release()

    def finish(self, clock: float, timeout: float = 600.0) -> None:
        """End of training: keep averaging until every active member is done; the final
        round's average replaces the parameters (every replica holds the same model)."""
        with self._lock:
            self._clock, self._done = clock, True
        if not self._final.wait(timeout):
            raise TimeoutError(f"no final model-averaging round within {timeout:g} s: a "
                               "member neither finished nor was excluded from the "
                               "averaging job")
        self._raise()

    def close(self) -> None:
        self._final.set()
        self._thread.join(timeout=10)
        self.worker.close()

    # -------------------------------------------------------------- the averaging thread
    def _loop(self) -> None:
        try:
            while not self._final.is_set():
                started = time.monotonic()
                self._round()
                if not self._final.is_set():
                    with self._lock:
                        done = self._done
                    if not done:  # a finished replica only waits for the others
                        self._final.wait(max(0.0, self.period_s - (time.monotonic() - started)))
        except BaseException as err:  # noqa: BLE001 - raised on the training thread
            self._error = err
            self._final.set()

    def _round(self) -> None:
        # Not a plain acquire: a training loop that died inside an optimizer step holds
        # the lock, and the interpreter's exit must still be able to stop this thread.
        while not self.step_lock.acquire(timeout=0.1):
            if self._final.is_set():
                return
        try:
            with self._lock:
                snapshot = self._flat() + self._pending
                healthy = not self._needs_resync()
                clock, done = self._clock, self._done
                uneven_calls = self._uneven_calls() if self._uneven_calls is not None else None
        finally:
            self.step_lock.release()
        uneven = uneven_calls is None or uneven_calls != self._even_since
        position = clock / self.steps * healthy
        header = torch.tensor([position, position * position, float(healthy), float(done),
                               float(uneven)])
        clock_sum, square_sum, healthy_share, done_share, uneven_share = self.worker.allreduce(
            header, key=KEY_HEADER).tolist()
        members = self.worker.config.members
        final = done_share > 1 - 0.5 / members  # every active member is done
        full = final or uneven_share > 0.5 / members or healthy_share < 1 - 0.5 / members
        # (an unhealthy replica makes the round full: its move is what resynchronizes it)
        some_healthy = healthy_share > 0.5 / members
        # The vote (module doc). Not by clock: healthy replicas in partial rounds are several
        # updates apart, each a model of the job.
        votes = healthy or not some_healthy
        spread = _spread(clock_sum, square_sum, healthy_share) * self.steps if some_healthy else 0
        # Snapshots of different clocks (module doc): the voters do not move; the final
        # round's clocks are all the end of the job.
        narrow = final or spread <= self.max_clock_spread + 1e-6
        moved = 0.0
        if full:
            weighted = torch.cat([snapshot, snapshot.new_ones(1)])  # the vote: the divisor
            if not votes:
                weighted.zero_()
            summed = self.worker.allreduce(weighted, key=KEY)  # each element: sum / count
            params = summed[:-1] / summed[-1]  # the voters' mean, whatever the count
            move = params - snapshot
            if votes and not narrow:
                move.zero_()
            else:
                self._even_since = uneven_calls
            moved = float(move.abs().max())
        with self._lock:
            if final:
                # the training loop has stopped: nobody else writes
                self._write(params, add=False)
                self._pending.zero_()
            elif full:
                self._pending += move
            if some_healthy:
                # A replica behind the job clock (it missed results, or was excluded)
                # goes on from the healthy replicas' clock.
                self._adopt = clock_sum / healthy_share * self.steps
            if not healthy:
                log.warning("worker %d resynchronized by model averaging (moved by up to "
                            "%.3g)", self.worker.config.worker_id, moved)
                self._resynced = True
        self.history.append({"round": len(self.history), "final": final, "full": full,
                             "healthy": healthy, "votes": votes, "clock": round(clock, 3),
                             "done_share": round(done_share, 3),
                             "clock_spread": round(spread, 3), "max_move": moved})
        if final:
            self._final.set()

    # -------------------------------------------------------------- parameters
    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).to(device=self.device, dtype=torch.float32)
                          for p in self.params])

    def _write(self, flat: torch.Tensor, *, add: bool) -> None:
        with torch.no_grad():
            offset = 0
            for p in self.params:
                part = flat[offset:offset + p.numel()].reshape(p.shape).to(device=p.device,
                                                                            dtype=p.dtype)
                p.add_(part) if add else p.copy_(part)
                offset += p.numel()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"model averaging failed: {self._error}") from self._error


def _spread(clock_sum: float, square_sum: float, count: float) -> float:
    """The standard deviation of `count` values from their sum and sum of squares (the
    all-reduce gives each as a mean over the members: the ratios are what count)."""
    mean = clock_sum / count
    return max(square_sum / count - mean * mean, 0.0) ** 0.5

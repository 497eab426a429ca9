"""Background model averaging (worker/averaging.py) through a softswitch on loopback:
three replicas in this process, each with its own averaging transport and thread."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from hysync.torch import HySyncJob
from hysync.wire import Mode
from hysync.worker.api import HySyncWorker
from hysync.worker.averaging import BackgroundAverager
from hysync.worker.transport import TransportConfig
from tests.worker.conftest import Job

N = 3
JOB = 21
STEPS = 100
SCALE = 2.0**20


class FakeResync:
    """Stands in for a training transport's resync flag (the training job is not run)."""

    def __init__(self, flagged: bool) -> None:
        self.flagged = flagged
        self.cleared = 0

    def clear(self) -> None:
        self.flagged = False
        self.cleared += 1


def averaging_workers(switch) -> list[HySyncWorker]:
    """N averaging transports, members of one sync job on the switch."""
    workers = [HySyncWorker(TransportConfig(job_id=JOB, worker_id=w, switch_host="127.0.0.1",
                                            switch_port=switch.address[1],
                                            bind_host="127.0.0.1", slot_base=100,
                                            slot_count=4, members=N, dead_after=20.0),
                            scale=SCALE) for w in range(N)]
    switch.install(Job(JOB, 100, 4, [(w, *workers[w].address) for w in range(N)]), Mode.SYNC)
    return workers


def replica_params(w: int) -> list[torch.Tensor]:
    return [torch.full((3, 5), float(w)), torch.arange(4, dtype=torch.float32) * (w + 1)]


def replicas(switch, flags: list[bool], period_s: float = 0.05,
             uneven: list[list[int]] | None = None):
    """N replicas; `uneven[w][0]`, when given, is replica w's training transport's count
    of uneven calls (HySyncWorker.uneven_calls), which the test moves."""
    params = [replica_params(w) for w in range(N)]
    workers = averaging_workers(switch)
    resync = [FakeResync(f) for f in flags]
    averagers = [BackgroundAverager(workers[w], params[w], period_s=period_s, steps=STEPS,
                                    needs_resync=lambda r=resync[w]: r.flagged,
                                    clear_resync=resync[w].clear,
                                    uneven_calls=None if uneven is None else
                                    (lambda u=uneven[w]: u[0])) for w in range(N)]
    return params, averagers, resync


def flat(ps: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for p in ps])


def wait_for(condition, timeout: float = 120.0, averagers=()) -> None:
    """Wait for `condition`; the deadline only ends a hung test (rounds take as long as a
    loaded machine lets them). An averaging thread that failed ends the wait at once, and
    the message says why, with each replica's last rounds."""
    end = time.monotonic() + timeout
    while not condition():
        failed = [f"replica {w}: {a._error!r}" for w, a in enumerate(averagers)
                  if a._error is not None]
        late = time.monotonic() >= end
        if failed or late:
            rounds = [(len(a.history), a.history[-2:]) for a in averagers]
            within = f"within {timeout:g} s" if late else "(a thread failed)"
            pytest.fail(f"the condition did not hold {within}"
                        f"; averaging threads failed: {failed or 'none'}; rounds (count, last "
                        f"two) per replica: {rounds}")
        time.sleep(0.01)


def test_replicas_converge_keep_local_progress_and_end_identical(switch):
    params, averagers, _ = replicas(switch, [False] * N)
    try:
        mean = torch.stack([flat(p) for p in params]).mean(dim=0)
        wait_for(lambda: all(len(a.history) >= 2 for a in averagers), averagers=averagers)
        # A local step on replica 0 between rounds (as an optimizer would make it):
        # the averaging moves are added to it, not written over it.
        with averagers[0].step_lock:
            params[0][0].add_(10.0)
        for w, a in enumerate(averagers):
            assert a.at_step(5.0) == pytest.approx(5.0, abs=0.02)
            if w:
                assert torch.allclose(flat(params[w]), mean, atol=1e-5), w
        moved = flat(params[0]) - mean
        assert torch.allclose(moved[:15], torch.full((15,), 10.0), atol=1e-5)
        assert torch.allclose(moved[15:], torch.zeros(4), atol=1e-5)
        # The final round: only once every replica is done, and then all are one model.
        done = [threading.Thread(target=a.finish, args=(float(STEPS),)) for a in averagers]
        for t in done[:-1]:
            t.start()
        time.sleep(0.3)
        assert not any(r["final"] for a in averagers for r in a.history), \
            "a final round happened before every replica was done"
        done[-1].start()
        for t in done:
            t.join(120)
        assert not any(t.is_alive() for t in done), "a replica's finish did not return"
        finals = [flat(p) for p in params]
        assert all(torch.equal(finals[0], f) for f in finals[1:])
        # the local step of replica 0 is in the average, a third of it
        expected = mean.clone()
        expected[:15] += 10.0 / N
        assert torch.allclose(finals[0], expected, atol=1e-5)
        assert all(sum(r["final"] for r in a.history) == 1 for a in averagers)
        assert len({len(a.history) for a in averagers}) == 1, "the rounds did not pair up"
    finally:
        for a in averagers:
            a.close()


def test_even_replicas_skip_the_parameter_round_until_one_is_uneven(switch):
    """While every replica's training calls are even (sync with every member), a round
    averages only its four numbers; one replica's uneven call makes the next round average
    the parameters on every replica, and the rounds stay paired."""
    uneven = [[0] for _ in range(N)]
    params, averagers, _ = replicas(switch, [False] * N, uneven=uneven)
    try:
        mean = torch.stack([flat(p) for p in params]).mean(dim=0)
        wait_for(lambda: all(len(a.history) >= 4 for a in averagers), averagers=averagers)
        for a in averagers:
            a.at_step(1.0)
        # The first round averages (nothing is known yet); the even ones after it do not.
        assert all(a.history[0]["full"] for a in averagers)
        assert not any(r["full"] for a in averagers for r in a.history[1:4])
        for p in params:
            assert torch.allclose(flat(p), mean, atol=1e-5)
        with averagers[0].step_lock:
            params[0][0].add_(10.0)  # replica 0 drifts ...
        # (a round under way may hold a snapshot from before: let it end, skipped)
        after = [len(a.history) + 2 for a in averagers]
        wait_for(lambda: all(len(a.history) >= n for a, n in zip(averagers, after, strict=True)),
                 averagers=averagers)
        assert not any(r["full"] for a in averagers for r in a.history[1:])
        seen = [len(a.history) for a in averagers]
        uneven[1][0] += 1  # ... and replica 1 (not 0) reports an uneven call
        wait_for(lambda: all(any(r["full"] for r in a.history[n:])
                             for a, n in zip(averagers, seen, strict=True)), averagers=averagers)
        wait_for(lambda: all(len(a.history) >= max(seen) + 4 for a in averagers),
                 averagers=averagers)
        fulls = [[r["round"] for r in a.history if r["full"]] for a in averagers]
        assert fulls[0][:2] == fulls[1][:2] == fulls[2][:2] and len(fulls[0]) >= 2, fulls
        for a in averagers:
            a.at_step(2.0)
        expected = mean.clone()
        expected[:15] += 10.0 / N
        for w, p in enumerate(params):
            assert torch.allclose(flat(p), expected, atol=1e-4), w
    finally:
        for a in averagers:
            a.close()


def test_a_replica_that_missed_results_adopts_the_healthy_clock_and_is_cleared(switch):
    params, averagers, resync = replicas(switch, [False, False, True])
    try:
        healthy_mean = torch.stack([flat(p) for p in params[:2]]).mean(dim=0)
        for w, a in enumerate(averagers):
            a.at_step(80.0 if w < 2 else 20.0)  # the third is behind by 60 updates
        # (a round whose voters' clocks spread, one at 80 and one not yet, moves no voter)
        wait_for(lambda: all(any(r["clock"] > 0 and r["clock_spread"] == 0 for r in a.history)
                             for a in averagers), averagers=averagers)
        # Cleared between steps, never from the averaging thread (the training
        # transport may be in a call then).
        assert resync[2].cleared == 0
        clock = averagers[2].at_step(20.0)
        assert clock == pytest.approx(80.0, abs=0.01)
        assert resync[2].cleared == 1 and not resync[2].flagged
        assert averagers[0].at_step(80.0) == pytest.approx(80.0, abs=0.01)
        assert resync[0].cleared == 0
        # Its parameters did not count: every replica holds the healthy ones' average.
        averagers[1].at_step(80.0)
        for w, p in enumerate(params):
            assert torch.allclose(flat(p), healthy_mean, atol=1e-5), w
    finally:
        for a in averagers:
            a.close()


def add_flat(params: list[torch.Tensor], vector: torch.Tensor) -> None:
    offset = 0
    for p in params:
        p.add_(vector[offset:offset + p.numel()].reshape(p.shape))
        offset += p.numel()


def test_snapshots_of_different_clocks_move_no_voter_and_replicas_stay_one_model(switch):
    """Replicas that apply the same results differ only by the progress between their
    clocks. Averaging snapshots of clocks 10, 10 and 30 would leave each replica off by
    its own share of that progress, for good once the rounds are even again (sync with
    every member): the voters keep their parameters, and at one clock they are one model."""
    uneven = [[0] for _ in range(N)]
    params, averagers, _ = replicas(switch, [False] * N, uneven=uneven)
    step = torch.linspace(0.5, 2.0, 19)  # one step's results, the same on every replica
    clocks = [10.0, 10.0, 30.0]
    try:
        wait_for(lambda: all(len(a.history) >= 2 for a in averagers), averagers=averagers)
        for a in averagers:
            a.at_step(0.0)  # the first round's average: one model from here
        start = flat(params[0]).clone()
        for w, a in enumerate(averagers):
            with a.step_lock:
                add_flat(params[w], clocks[w] * step)
            a.at_step(clocks[w])
        seen = [len(a.history) for a in averagers]
        for u in uneven:
            u[0] += 1  # a partial spell: the next rounds average the parameters
        wait_for(lambda: all(len(a.history) >= n + 3 for a, n in zip(averagers, seen,
                                                                       strict=True)),
                 averagers=averagers)
        wide = [r for a, n in zip(averagers, seen, strict=True) for r in a.history[n:]
                if r["full"]]
        assert any(r["clock_spread"] == pytest.approx(9.43, abs=0.05) for r in wide), wide
        assert all(r["max_move"] == 0 for r in wide), wide
        for w, a in enumerate(averagers):  # back in sync: every replica to clock 40
            a.at_step(clocks[w])
            with a.step_lock:
                add_flat(params[w], (40.0 - clocks[w]) * step)
            a.at_step(40.0)
        seen = [len(a.history) for a in averagers]
        wait_for(lambda: all(len(a.history) >= n + 3 for a, n in zip(averagers, seen,
                                                                       strict=True)),
                 averagers=averagers)
        for a in averagers:
            a.at_step(40.0)
        for w, p in enumerate(params):
            assert torch.allclose(flat(p), start + 40.0 * step, atol=1e-4), w
    finally:
        for a in averagers:
            a.close()


class GatedSGD(torch.optim.SGD):
    """An optimizer whose step waits for the test: a step under way, seen from outside."""

    def __init__(self, params, gate: threading.Event, fail: bool = False) -> None:
        super().__init__(params, lr=1.0)
        self.gate, self.fail, self.entered = gate, fail, threading.Event()

    def step(self, closure=None):
        self.entered.set()
        assert self.gate.wait(120)
        if self.fail:
            raise RuntimeError("this step fails")
        return super().step(closure)


def rounds_advance(averagers, by: int = 3) -> None:
    """Wait until every averager completes `by` more rounds."""
    seen = [len(a.history) for a in averagers]
    wait_for(lambda: all(len(a.history) >= n + by for a, n in zip(averagers, seen, strict=True)),
             averagers=averagers)


def rounds_held(averagers, by: int = 3, window_s: float = 1.0) -> bool:
    """Whether no averager completes `by` more rounds while the test watches for
    `window_s` (one round already past its snapshot may still end: `by` allows it)."""
    seen = [len(a.history) for a in averagers]
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        if any(len(a.history) >= n + by for a, n in zip(averagers, seen, strict=True)):
            return False
        time.sleep(0.01)
    return True


def test_a_step_blocked_outside_the_optimizer_does_not_hold_the_averaging_up(switch):
    """hysync.torch's loop: a step blocked in its gradient call (an excluded member's waits
    until it is readmitted) lets every replica's rounds go on; an optimizer step under way
    holds them off (its snapshot waits) until it ends, and one that raised until the
    loop ends."""
    params = [replica_params(w) for w in range(N)]
    workers = averaging_workers(switch)
    averagers = [BackgroundAverager(workers[w], params[w], period_s=0.02, steps=STEPS)
                 for w in range(1, N)]
    training = SimpleNamespace(needs_resync=False, uneven_calls=0,
                               transport=SimpleNamespace(clear_resync=lambda: None))
    state = SimpleNamespace(stats=SimpleNamespace(calls=0), updates_applied=lambda: 1.0)
    job = HySyncJob(0, N, {"job_id": 1, "slot_base": 0, "slot_count": 1}, training, state,
                    serve=None, averaging=(workers[0], params[0], 0.02))
    steps = job.steps(STEPS)
    try:
        next(steps)  # inside step 0, as a backward waiting on the switch is
        averagers.insert(0, job.averager)
        rounds_advance(averagers)  # a step outside the optimizer holds no round up
        gate = threading.Event()
        optimizer = GatedSGD(params[0], gate)
        params[0][0].grad = torch.ones(3, 5)
        stepping = threading.Thread(target=optimizer.step)
        stepping.start()
        assert optimizer.entered.wait(120)
        assert rounds_held(averagers), "a round ran during an optimizer step"
        gate.set()
        stepping.join(120)
        assert not stepping.is_alive()
        rounds_advance(averagers)
        failing = GatedSGD(params[0], gate, fail=True)
        with pytest.raises(RuntimeError, match="this step fails"):
            failing.step()
        assert rounds_held(averagers), "a failed optimizer step let go of the lock"
        steps.close()  # the training loop ends (its exception)
        rounds_advance(averagers)
    finally:
        steps.close()
        for a in averagers:
            a.close()


def test_an_averaging_failure_surfaces_on_the_training_thread(dead_port):
    worker = HySyncWorker(TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                                          switch_port=dead_port, bind_host="127.0.0.1",
                                          slot_base=0, slot_count=4, members=2,
                                          dead_after=0.3), scale=SCALE)
    averager = BackgroundAverager(worker, [torch.zeros(10)], period_s=0.05, steps=STEPS)
    try:
        wait_for(lambda: averager._error is not None)
        with pytest.raises(RuntimeError, match="model averaging failed: no reply"):
            averager.at_step(1.0)
        with pytest.raises(RuntimeError, match="model averaging failed"):
            averager.finish(1.0, timeout=5)
    finally:
        averager.close()

"""The straggler policy on a busy machine: a slow member is told from a slow machine, and
the job's mode does not flap (controlplane/policy/detect.py, controlplane/policy/policies.py).

The counter series are synthetic: `SeriesJob` turns per-interval paces (gradients a
second, per member) into the counters the switch keeps in the job's current mode, and
reacts to the policy's decisions. A busy machine is modelled as it shows on two cores
shared with CPU hogs: every member slower together, and the scheduler stalling the
members in turns (each of them for one interval in every four, in a random order).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from hysync.controlplane.policy.detect import DetectorConfig, Health, Interval, JobView
from hysync.controlplane.policy.policies import (
    EXCLUDE,
    EXPLORE,
    MINUTE_S,
    SET_MODE,
    AdaptivePolicy,
    PolicyConfig,
)
from hysync.controlplane.tables.counters import JobStats, WorkerStats
from hysync.wire import Mode

INTERVAL = 0.5
MEMBERS = 4
# pace(interval index, worker) -> gradients a second the member would send if nobody waited
Pace = Callable[[int, int], float]


class SeriesJob:
    """A job of four members whose counters follow `pace`, in the mode the policy set:
    in sync every member contributes at the slowest one's pace and the slowest closes
    most rounds; in partial(q) and async every member sends at its own pace."""

    def __init__(self, pace: Pace, seed: int) -> None:
        self.pace = pace
        self.rng = random.Random(seed)
        self.cum = {w: [0, 0, 0, 0, 0] for w in range(MEMBERS)}  # contributions .. closes
        self.time = 0.0

    def stats(self) -> JobStats:
        return JobStats(1, self.time, {w: WorkerStats(w, True, *c) for w, c in self.cum.items()},
                        {"NOT_MEMBER": 0})

    def step(self, k: int, mode: Mode, quorum: int) -> None:
        own = {w: self.pace(k, w) * INTERVAL * self.rng.uniform(0.9, 1.1)
               for w in range(MEMBERS)}
        slowest = min(own, key=lambda w: own[w])
        if mode == Mode.SYNC:
            rounds = round(min(own.values()))
            for w in range(MEMBERS):
                self.cum[w][0] += rounds
                share = 0.7 if w == slowest else 0.1
                self.cum[w][4] += round(share * rounds)
        else:
            order = sorted(own, key=lambda w: -own[w])
            q = quorum if mode == Mode.PARTIAL else 1
            for w in range(MEMBERS):
                sent = round(own[w])
                inside = mode == Mode.ASYNC or order.index(w) < q
                self.cum[w][0 if inside else 1] += sent
                closes = sent if mode == Mode.ASYNC else (sent if w == order[q - 1] else 0)
                self.cum[w][4] += closes
        self.time = (k + 1) * INTERVAL


def run(pace: Pace, seconds: float, seed: int = 1,
        config: PolicyConfig | None = None) -> tuple[AdaptivePolicy, list[set[int]]]:
    """The policy driving the job for `seconds`; the members it held slow, per interval."""
    job = SeriesJob(pace, seed)
    policy = AdaptivePolicy(config)
    view = JobView(Mode.SYNC, 0, frozenset(range(MEMBERS)))
    policy.start(view, 0.0)
    before = job.stats()
    slow: list[set[int]] = []
    for k in range(int(round(seconds / INTERVAL))):
        mode, quorum = policy.mode or Mode.SYNC, policy.quorum
        job.step(k, mode, quorum)
        after = job.stats()
        now = JobView(mode, quorum, frozenset(range(MEMBERS)))
        policy.observe(Interval.between(before, after, now, now))
        slow.append({w for w, h in policy.health.items() if h.state == Health.SLOW})
        before = after
    return policy, slow


def busy_machine(seed: int, *, from_interval: int = 20, base: float = 100.0,
                 own: dict[int, float] | None = None) -> Pace:
    """Every member at `base` (times its `own` factor), and from `from_interval` on a busy
    machine: every pace halved, and in each interval one member stalled (a third of its
    pace), the members taking turns in a random order every four intervals."""
    rng = random.Random(seed)
    turns: list[int] = []
    for _ in range(10_000 // MEMBERS):
        cycle = list(range(MEMBERS))
        rng.shuffle(cycle)
        turns += cycle
    factors = own or {}

    def pace(k: int, w: int) -> float:
        p = base * factors.get(w, 1.0)
        if k < from_interval:
            return p
        return p * 0.5 * (0.3 if turns[k] == w else 1.0)

    return pace


def explorations_only(policy: AdaptivePolicy) -> bool:
    """Every mode change is an exploration that found nobody, or the return to sync."""
    changes = [d for d in policy.decisions if d.action == SET_MODE]
    return all(d.reason.startswith(EXPLORE) or d.mode == "sync" for d in changes)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_member_slower_together_is_no_straggler(seed: int) -> None:
    policy, slow = run(busy_machine(seed), 180, seed)
    assert all(not s for s in slow), [(k * INTERVAL, s) for k, s in enumerate(slow) if s]
    assert [d for d in policy.decisions if d.action == EXCLUDE] == []
    assert explorations_only(policy), [d.describe() for d in policy.decisions]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_slow_member_on_a_busy_machine_is_named_and_nobody_else(seed: int) -> None:
    policy, slow = run(busy_machine(seed, own={2: 0.5}), 60, seed)
    partial = [d for d in policy.decisions if d.action == SET_MODE and d.mode == "partial"]
    assert partial and partial[0].quorum == 3, [d.describe() for d in policy.decisions]
    assert "worker 2 slow" in partial[0].reason
    assert all(s <= {2} for s in slow), [(k * INTERVAL, s) for k, s in enumerate(slow) if s]
    assert policy.mode == Mode.PARTIAL and policy.health[2].state == Health.SLOW


def noisy(seed: int) -> Pace:
    """Paces that jump: each member's own factor drawn anew every few seconds (0.3x to
    1x), machine-wide slow spells, and stalls of any member at any interval."""
    rng = random.Random(seed)
    spells = [rng.uniform(0.4, 1.0) for _ in range(400)]
    own = [[rng.uniform(0.3, 1.0) for _ in range(MEMBERS)] for _ in range(400)]
    stalls = [[rng.random() < 0.3 for _ in range(MEMBERS)] for _ in range(4000)]

    def pace(k: int, w: int) -> float:
        spell = k // 6
        return 100.0 * spells[spell] * own[k // 10][w] * (0.2 if stalls[k][w] else 1.0)

    return pace


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_noisy_series_changes_the_mode_at_most_the_bound_in_any_minute(seed: int) -> None:
    config = PolicyConfig()
    policy, _ = run(noisy(seed), 600, seed, config)
    changes = [d.time for d in policy.decisions if d.action == SET_MODE]
    assert len(changes) >= 2 * config.mode_changes_per_min  # the noise does provoke them
    for start in changes:
        within = [t for t in changes if start <= t < start + MINUTE_S]
        assert len(within) <= config.mode_changes_per_min, (start, within)


def test_the_bound_is_checked() -> None:
    with pytest.raises(ValueError, match="mode_changes_per_min must be >= 2"):
        PolicyConfig(mode_changes_per_min=1)
    with pytest.raises(ValueError, match=r"steady_share must be in \[0, 1\]"):
        DetectorConfig(steady_share=1.5)

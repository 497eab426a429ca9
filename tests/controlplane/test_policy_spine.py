"""The spine's policy measures each leaf by the pace of the hosts behind it
(controlplane/policy/rack_pace.py, detect.py's `Interval.behind`).

`TwoRacks` is a job of 2 racks x 3 hosts as the counters show it, the spine's (a member per
leaf: its sums, its closes) and each leaf's (a member per host), with rack 1's hosts
computing 2x longer, as docs/performance.md "Two levels" measured it: in sync at the
spine every rack runs at the slow rack's pace and leaf 1 closes 92% of the spine's rounds;
in partial(1) each rack's hosts run at their own pace, while the spine counts leaf 1's sums
at only 1/1.3 of leaf 0's (the fast rack's sums close the rounds, the slow leaf is moved on
to rounds it took no part in). The policy is driven one interval at a time, the spine's
counters through `Interval.between` and the leaves' through `rack_pace.standing_pace`, as
`PolicyRunner` does against switches.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from hysync.controlplane.policy.detect import Health, Interval, JobView
from hysync.controlplane.policy.policies import EXPLORE, MINUTE_S, AdaptivePolicy, PolicyConfig
from hysync.controlplane.policy.rack_pace import standing_pace
from hysync.controlplane.tables.counters import JobStats, WorkerStats
from hysync.wire import Mode

INTERVAL = 0.25  # `hysync policy run --interval 0.25`, as the two-level bench runs it
FAST = 400.0  # a healthy host's packets a second when nothing holds it back
HOSTS = 3


class TwoRacks:
    """Counters of a job across a spine and two leaves; rack 1 is `slowdown` times slower
    until `recovers_at`, then at pace."""

    def __init__(self, slowdown: float = 2.0, sums_look: float = 1.3,
                 recovers_at: float = float("inf"), seed: int = 1, counted: float = 0.2) -> None:
        """`counted`: the share of the slow leaf's sums the spine's partial rounds count
        (the rest arrive late)."""
        self.slowdown, self.sums_look, self.recovers_at = slowdown, sums_look, recovers_at
        self.counted = counted
        self.rng = random.Random(seed)
        self.spine = {leaf: [0, 0, 0, 0, 0] for leaf in (0, 1)}  # contributions .. closes
        self.hosts = {leaf: {h: [0, 0, 0, 0, 0] for h in range(HOSTS)} for leaf in (0, 1)}

    def advance(self, t: float, mode: Mode) -> None:
        """One interval ending at `t` with the spine in `mode`."""
        slow = self.slowdown if t <= self.recovers_at else 1.0
        own = {0: FAST, 1: FAST / slow}  # each rack's hosts at their own pace
        if mode == Mode.SYNC:
            rounds = FAST / slow * INTERVAL * self.noise()
            for leaf in (0, 1):  # every rack waits for the slowest: the same rounds
                for cells in self.hosts[leaf].values():
                    cells[0] += round(rounds * self.noise())
                share = 0.5 if slow == 1.0 else (0.08 if leaf == 0 else 0.92)
                self.spine[leaf][0] += round(rounds)
                self.spine[leaf][4] += round(share * rounds)
            return
        for leaf in (0, 1):  # partial(1): each rack's hosts at their own pace
            for cells in self.hosts[leaf].values():
                cells[0] += round(own[leaf] * INTERVAL * self.noise())
        fast_sums = FAST * INTERVAL * self.noise()
        self.spine[0][0] += round(fast_sums)
        self.spine[0][4] += round(fast_sums * (0.95 if slow > 1 else 0.5))
        # The slow leaf's sums as the spine counts them: 1/sums_look of the fast leaf's,
        # most of them late (the fast rack closed the round first).
        slow_sums = fast_sums / (self.sums_look if slow > 1 else 1.0)
        counted = self.counted if slow > 1 else 0.5
        self.spine[1][0] += round(counted * slow_sums)
        self.spine[1][1] += round((1 - counted) * slow_sums)
        self.spine[1][4] += round(fast_sums * (0.05 if slow > 1 else 0.5))

    def noise(self) -> float:
        return self.rng.uniform(0.93, 1.07)

    def spine_stats(self, t: float) -> JobStats:
        return _stats(t, self.spine)

    def leaf_stats(self, leaf: int, t: float) -> JobStats:
        return _stats(t, self.hosts[leaf])


def _stats(t: float, cells: dict[int, list[int]]) -> JobStats:
    return JobStats(1, t, {w: WorkerStats(w, True, *c) for w, c in cells.items()},
                    {"NOT_MEMBER": 0})


def spine_config() -> PolicyConfig:
    """What PolicyRunner makes of the default config at a spine of 2 leaves: no async
    across switches, and no leaf ever excluded."""
    return PolicyConfig(allow_async=False, min_members=2)


def run(job: TwoRacks, seconds: float, *, by_hosts: bool = True,
        ) -> tuple[AdaptivePolicy, list[tuple[float, Mode | None, int]]]:
    """The spine's policy on `job` for `seconds`; (the policy, its mode after each
    interval). `by_hosts`: each leaf measured by its hosts, else by the spine's counters."""
    config = spine_config()
    policy = AdaptivePolicy(config)
    view = JobView(Mode.SYNC, 0, frozenset({0, 1}))
    policy.start(view, 0.0)
    spine = job.spine_stats(0.0)
    leaves = {leaf: job.leaf_stats(leaf, 0.0) for leaf in (0, 1)}
    timeline = []
    for k in range(1, int(round(seconds / INTERVAL)) + 1):
        t = k * INTERVAL
        now = JobView(policy.mode or Mode.SYNC, policy.quorum, frozenset({0, 1}))
        job.advance(t, now.mode or Mode.SYNC)
        after = job.spine_stats(t)
        interval = Interval.between(spine, after, now, now)
        if by_hosts:
            after_leaves = {leaf: job.leaf_stats(leaf, t) for leaf in (0, 1)}
            interval = replace(interval, behind={
                leaf: standing_pace(leaves[leaf], after_leaves[leaf],
                                    config.min_quorum_fraction) * interval.duration
                for leaf in (0, 1)})
            leaves = after_leaves
        spine = after
        policy.observe(interval)
        timeline.append((t, policy.mode, policy.quorum))
    return policy, timeline


def test_a_rack_of_hosts_2x_slow_reads_2x_and_the_spine_stays_partial() -> None:
    policy, timeline = run(TwoRacks(slowdown=2.0, sums_look=1.3), 120)
    modes = [(d.time, d.mode, d.quorum, d.reason) for d in policy.decisions]
    # Leaf 1 closes the spine's rounds in sync: a probe in partial(1) measures it.
    assert modes[0][1:3] == ("partial", 1) and modes[0][3].startswith("probe"), modes
    health = policy.health[1]
    assert health.state == Health.SLOW and health.basis == "pace"
    assert health.slowdown == pytest.approx(2.0, rel=0.12)  # its hosts' pace, not its sums'
    assert policy.health[0].state == Health.HEALTHY
    # From the probe on, partial(1) holds for the rest of the run: no return to sync.
    assert len(modes) == 1, modes
    assert all((mode, q) == (Mode.PARTIAL, 1) for t, mode, q in timeline if t >= modes[0][0])


def test_by_the_spines_own_counters_the_same_rack_reads_13x_and_goes_back_to_sync() -> None:
    # What the hosts' pace is for: the same job measured by the leaves' sums at the spine.
    policy, _ = run(TwoRacks(slowdown=2.0, sums_look=1.3), 120, by_hosts=False)
    modes = [(d.mode, d.reason) for d in policy.decisions]
    assert modes[0][0] == "partial" and modes[1][0] == "sync", modes
    assert any("cost model" in reason or "healthy" in reason for _, reason in modes[1:2]), modes


def test_when_the_slow_rack_recovers_the_spine_returns_to_sync_and_stays() -> None:
    recovers_at = 40.0
    policy, timeline = run(TwoRacks(slowdown=2.0, sums_look=1.3, recovers_at=recovers_at),
                           150)
    changes = [(d.time, d.mode, d.quorum, d.reason) for d in policy.decisions]
    assert changes[0][1:3] == ("partial", 1), changes
    before = [c for c in changes if c[0] < recovers_at]
    assert before == changes[:1], changes  # partial(1) held while the rack was slow
    back = next(c for c in changes if c[0] >= recovers_at)
    assert back[1] == "sync" and recovers_at < back[0] <= recovers_at + 6.0, changes
    # Back as soon as the pace window shows the rack faster than partial(1) is worth.
    assert "no straggler" in back[3] or "cost model: sync" in back[3], back
    # After that, the spine leaves sync only to explore (and comes back: every rack is at
    # pace), and every mode change keeps to the budget of changes a minute.
    for t, mode, _, reason in changes:
        if t > back[0] and mode == "partial":
            assert reason.startswith(EXPLORE), changes
    assert timeline[-1][1] == Mode.SYNC or any(
        c[3].startswith(EXPLORE) for c in changes if c[0] > timeline[-1][0] - 4.0)
    times = [c[0] for c in changes]
    budget = spine_config().mode_changes_per_min
    assert all(sum(1 for u in times if t <= u < t + MINUTE_S) <= budget for t in times)
    assert policy.health[1].state == Health.HEALTHY


def test_a_rack_of_hosts_at_pace_never_leaves_sync_but_to_explore() -> None:
    policy, _ = run(TwoRacks(slowdown=1.0, sums_look=1.0), 90)
    for d in policy.decisions:
        assert d.mode == "sync" or d.reason.startswith(EXPLORE), d.describe()
    assert len(policy.decisions) <= 6  # explorations, spaced by a doubling gap


@pytest.mark.parametrize(("counted", "stays"), [(0.8, True), (0.0, False)])
def test_a_rack_whose_sums_still_make_the_spines_rounds_keeps_partial_at_a_smaller_slowdown(
        counted: float, stays: bool) -> None:
    # The two-level bench's racks: a step is compute and communication, so hosts that
    # compute 2x longer send at 1.55x; the slow leaf's sums still win many of the spine's
    # rounds in partial(1). Valued as late, its work is worth less than sync's wait
    # (sync 1.29, partial(1) 1.19); valued as what the rounds counted, more.
    policy, timeline = run(TwoRacks(slowdown=1.55, sums_look=1.3, counted=counted), 90)
    modes = [(d.time, d.mode, d.reason) for d in policy.decisions]
    assert modes[0][1] == "partial" and modes[0][2].startswith("probe"), modes
    assert policy.health[1].slowdown == pytest.approx(1.55, rel=0.1)
    if stays:
        assert len(modes) == 1, modes
        assert policy.health[1].counted == pytest.approx(counted, abs=0.05)
    else:
        assert modes[1][1] == "sync" and "cost model" in modes[1][2], modes


def test_a_leaf_is_paced_by_its_median_host_and_an_excluded_host_does_not_count() -> None:
    def leaf(t: float, paces: dict[int, int], excluded: frozenset[int] = frozenset()
             ) -> JobStats:
        return JobStats(1, t, {h: WorkerStats(h, h not in excluded, p) for h, p in paces.items()})

    before = leaf(0.0, {0: 0, 1: 0, 2: 0})
    # One slow host in three: the leaf's own partial(2) leaves it out; the rack is fast.
    assert standing_pace(before, leaf(0.5, {0: 200, 1: 190, 2: 60}), 0.5) == pytest.approx(380)
    # Every host slow: the rack is slow.
    assert standing_pace(before, leaf(0.5, {0: 100, 1: 95, 2: 90}), 0.5) == pytest.approx(190)
    # Two hosts (one excluded at its leaf): the faster of the two.
    after = leaf(0.5, {0: 200, 1: 60, 2: 0}, excluded=frozenset({2}))
    assert standing_pace(before, after, 0.5) == pytest.approx(400)
    assert standing_pace(before, leaf(0.5, {0: 5, 1: 5, 2: 5}, frozenset({0, 1, 2})), 0.5) == 0

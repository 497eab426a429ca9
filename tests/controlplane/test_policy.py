"""The straggler policy (controlplane/policy/detect.py, controlplane/policy/policies.py).

Most tests run the policy on counter traces of a simulated job: `Simulation` is the
switch state machine of docs/protocol.md §4 for one slot, reduced to what the counters
see, with workers that compute for `base * slowdown * jitter` seconds (a step of
`waves` rounds: the rounds after the first follow the network's pace, `comm`) and behave
as the worker engine does (docs/protocol.md §9: wait for the round's result, send a stale
contribution again at the open round, retransmit on a timer). It is deterministic
(seeded) and reacts to the policy's decisions, so every JobStats sequence it produces
is a reproducible recorded trace. One test runs the PolicyRunner against a real
softswitch with real UDP senders, and one runs the `hysync policy` command.
"""

from __future__ import annotations

import datetime
import heapq
import io
import json
import math
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from hysync import wire
from hysync.controlplane.cli.main import main
from hysync.controlplane.cli.switch_commands import decision_text
from hysync.controlplane.controller import Controller
from hysync.controlplane.policy.detect import Detector, DetectorConfig, Health, Interval, JobView
from hysync.controlplane.policy.levels import spine_members
from hysync.controlplane.policy.member_hosts import MemberHost, describe, member_fields
from hysync.controlplane.policy.policies import (
    EXCLUDE,
    EXPLORE,
    READMIT,
    SET_MODE,
    AdaptivePolicy,
    Decision,
    PolicyConfig,
    candidates,
    value,
)
from hysync.controlplane.policy.runner import (
    PolicyRunner,
    _log_decision,
    describe_decision,
    latest_decision,
)
from hysync.controlplane.tables.counters import JobStats, WorkerStats
from hysync.protocol_spec.decision import Emit, decide, facts_of
from hysync.wire import Mode, Op

from .conftest import P4INFO, Softswitch
from .senders import Sender, Shared
from .test_dataplane import (  # sockets: the fixture of four bound UDP sockets
    finish,
    job_for,
    merged_results,
    sockets,  # noqa: F401
    start,
    wait_progress,
)

INTERVAL = 0.5
Slowdown = Callable[[float], float]


def constant(s: float) -> Slowdown:
    return lambda t: s


def until(t_end: float, s: float, then: float = 1.0) -> Slowdown:
    return lambda t: s if t < t_end else then


def alternating(period: float, s: float) -> Slowdown:
    return lambda t: s if int(t // period) % 2 == 0 else 1.0


# ------------------------------------------------------------------ simulated job
@dataclass
class SimWorker:
    worker: int
    slowdown: Slowdown = constant(1.0)
    dies_at: float = math.inf
    resends: bool = True  # a stale contribution is sent again at the open round
    target: int = 0  # the round it computes for / waits on
    wave: int = -1  # the round of its step it is at (0: the one after the compute)
    waiting: bool = False
    epoch: int = 0  # invalidates retransmission timers of an earlier wait


@dataclass
class Simulation:
    """One slot of one job; counters as the switch keeps them (docs/protocol.md §4, §8)."""

    workers: list[SimWorker]
    seed: int = 1
    base: float = 0.02  # a healthy worker's compute time per round
    jitter: float = 0.2  # per round, uniform +-
    wobble: float = 0.0  # per worker and interval, uniform +- (slow drifts)
    waves: int = 1  # rounds a step: a model of more chunks than the job has slots
    comm: float = 0.001  # between the rounds of a step: the network's pace
    rto: float = 0.2
    now: float = 0.0
    mode: Mode = Mode.SYNC  # desired (the modes table)
    quorum: int = 0
    active: set[int] = field(default_factory=set)
    counters: dict[int, dict[str, int]] = field(default_factory=dict)
    not_member: int = 0
    _round: int = 0
    _count: int = 0
    _bitmap: set[int] = field(default_factory=set)
    _res_bitmap: set[int] = field(default_factory=set)
    _latched: tuple[Mode, int] = (Mode.SYNC, 0)
    _events: list[tuple[float, int, str, int, int]] = field(default_factory=list)
    _seq: int = 0

    def __post_init__(self) -> None:
        self.active = {w.worker for w in self.workers}
        names = ("contributions", "late", "duplicates", "stale", "closes", "results")
        self.counters = {w.worker: dict.fromkeys(names, 0) for w in self.workers}
        self._rng = {w.worker: random.Random(self.seed * 1000 + w.worker) for w in self.workers}
        for w in self.workers:
            self._compute(w)

    # ---------------------------------------------------------- the policy's view
    def stats(self) -> JobStats:
        return JobStats(1, self.now, {w: WorkerStats(w, w in self.active, **c)
                                      for w, c in self.counters.items()},
                        {"NOT_MEMBER": self.not_member})

    def view(self) -> JobView:
        return JobView(self.mode, self.quorum, frozenset(self.active), (0, 0))

    def apply(self, d: Decision) -> None:
        if d.action == SET_MODE:
            self.mode, self.quorum = Mode[d.mode.upper()], d.quorum
        elif d.action == EXCLUDE:
            assert d.worker is not None and d.worker in self.active
            self.active.discard(d.worker)
        elif d.action == READMIT:
            assert d.worker is not None and d.worker not in self.active
            self.active.add(d.worker)

    # ---------------------------------------------------------- events
    def run_until(self, t: float) -> None:
        while self._events and self._events[0][0] <= t:
            at, _, kind, w, epoch = heapq.heappop(self._events)
            self.now = at
            worker = self.workers[w]
            if at >= worker.dies_at or epoch != worker.epoch:
                continue  # dead, or a timer of an earlier wait
            if kind == "done" or worker.waiting:  # computed, or retransmission timer
                self._send(worker, worker.target)
        self.now = t

    def _push(self, at: float, kind: str, w: SimWorker) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, w.worker, w.epoch))

    def _compute(self, w: SimWorker) -> None:
        """The worker's next round: a compute at the start of a step, else the network."""
        w.waiting, w.target = False, self._round
        w.epoch += 1
        w.wave = (w.wave + 1) % self.waves
        jitter = self._rng[w.worker].uniform(-1, 1) * self.jitter
        if w.wave:
            self._push(self.now + self.comm * (1 + jitter), "done", w)
            return
        k = int(self.now // INTERVAL)
        drift = random.Random(hash((self.seed, w.worker, k))).uniform(-1, 1) * self.wobble
        self._push(self.now + self.base * w.slowdown(self.now) * (1 + drift) * (1 + jitter),
                   "done", w)

    def _wait(self, w: SimWorker) -> None:
        w.waiting = True
        w.epoch += 1
        self._push(self.now + self.rto, "rto", w)

    def _send(self, w: SimWorker, rnd: int) -> None:
        outcome = self._packet(w.worker, rnd)
        if outcome == "stale":
            if not w.resends:
                self._compute(w)
                return
            w.target = self._round
            outcome = self._packet(w.worker, w.target)
        if outcome in ("absorbed", "dropped", "duplicate"):
            if not w.waiting or outcome != "duplicate":
                self._wait(w)
            else:
                self._push(self.now + self.rto, "rto", w)
        elif outcome in ("late", "async"):
            self._compute(w)
        # "closed": _close restarted every waiting member, this one included

    # ---------------------------------------------------------- the switch (§4)
    def _packet(self, w: int, rnd: int) -> str:
        """The switch's decision table (hysync/protocol_spec/decision.py) for one slot, without the
        member cells (no JOINs, one chunk a round: those facts never hold here)."""
        if w not in self.active:
            self.not_member += 1
            return "dropped"
        if self._count == 0:
            self._latched = (self.mode, self.quorum)
        mode, quorum = self._latched
        n = len(self.active)
        o = decide(facts_of(
            asynchronous=mode == Mode.ASYNC, counted=False, refused=False, join_marked=False,
            join=False, open_round=rnd == self._round, prev=rnd == self._round - 1 >= 0,
            count=self._count, has_bit=w in self._bitmap,
            q=n if quorum == 0 else min(quorum, n), chunk_differs=False,
            res_has_bit=w in self._res_bitmap, behind=False))
        if o.counter:
            self.counters[w][o.counter.name.lower()] += 1
        if o.emit == Emit.CLOSE and mode == Mode.ASYNC:  # a round of its own
            self.counters[w]["closes"] += 1
            self._round += 1
            return "async"
        if o.emit in (Emit.ABSORB, Emit.CLOSE):
            self._bitmap.add(w)
            self._count += 1
        if o.emit in (Emit.CLOSE, Emit.CLOSE_AS_IS):
            self._close(w)
            return "closed"
        return {Emit.ABSORB: "absorbed", Emit.NONE: "duplicate", Emit.RESEND: "late",
                Emit.RESYNC: "stale"}[o.emit]

    def _close(self, closer: int) -> None:
        self.counters[closer]["closes"] += 1
        closed = self._round
        self._res_bitmap, self._bitmap = self._bitmap, set()
        self._round, self._count = closed + 1, 0
        for w in self.workers:
            if w.worker in self.active and self.now < w.dies_at and (
                    w.waiting and w.target == closed or w.worker == closer):
                self._compute(w)


@dataclass
class Run:
    policy: AdaptivePolicy
    sim: Simulation
    intervals: list[Interval]
    timeline: list[tuple[float, Mode | None, int, frozenset[int]]]  # after each interval

    def actions(self, action: str, worker: int | None = None) -> list[Decision]:
        return [d for d in self.policy.decisions
                if d.action == action and (worker is None or d.worker == worker)]

    def mode_changes(self) -> list[Decision]:
        """The mode changes, less the explorations that found nobody slow (the probe and
        the return to sync it ended with)."""
        found_nobody = self.explorations()
        return [d for d in self.actions(SET_MODE)
                if not any(d in pair for pair in found_nobody)]

    def explorations(self) -> list[tuple[Decision, Decision | None]]:
        """(the exploration, the return to sync after it: None while it lasts) for each
        exploration of sync that found nobody slow."""
        changes = self.actions(SET_MODE)
        out: list[tuple[Decision, Decision | None]] = []
        for i, d in enumerate(changes):
            if d.reason.startswith(EXPLORE):
                after = changes[i + 1] if i + 1 < len(changes) else None
                if after is None or after.mode == "sync":
                    out.append((d, after))
        return out

    def exploring(self, t: float) -> bool:
        return any(d.time <= t and (end is None or t < end.time)
                   for d, end in self.explorations())

    def first(self, action: str, mode: str | None = None, quorum: int | None = None,
              worker: int | None = None) -> Decision:
        for d in self.policy.decisions:
            if (d.action == action and mode in (None, d.mode) and quorum in (None, d.quorum)
                    and worker in (None, d.worker)):
                return d
        raise AssertionError(f"no {action} {mode} {quorum} {worker} in "
                             f"{[x.describe() for x in self.policy.decisions]}")


def simulate(workers: list[SimWorker], seconds: float, config: PolicyConfig | None = None,
             **sim: object) -> Run:
    """The policy driving a simulated job for `seconds`, one interval at a time."""
    s = Simulation(workers, **sim)  # type: ignore[arg-type]
    policy = AdaptivePolicy(config)
    prev = (s.stats(), s.view())
    policy.start(prev[1], 0.0)
    intervals, timeline = [], []
    for k in range(1, int(round(seconds / INTERVAL)) + 1):
        s.run_until(k * INTERVAL)
        now = (s.stats(), s.view())
        interval = Interval.between(prev[0], now[0], prev[1], now[1])
        intervals.append(interval)
        prev = now
        for d in policy.observe(interval):
            s.apply(d)
        timeline.append((s.now, policy.mode, policy.quorum, frozenset(policy.active)))
    return Run(policy, s, intervals, timeline)


def four(**slow: object) -> list[SimWorker]:
    """Workers 0-2 healthy, worker 3 with the given attributes."""
    return [SimWorker(0), SimWorker(1), SimWorker(2), SimWorker(3, **slow)]  # type: ignore[arg-type]


# ------------------------------------------------------------------ cost model
def test_the_cost_model_prefers_sync_partial_and_async_where_expected() -> None:
    c = PolicyConfig()

    def best(slowdowns: list[float], slow: int) -> tuple[Mode, int]:
        options = candidates(len(slowdowns), slow, c)
        return max(options, key=lambda o: value(*o, slowdowns, c))

    assert best([1, 1, 1, 1], 0) == (Mode.SYNC, 0)
    assert best([1, 1, 1, 1.2], 1) == (Mode.SYNC, 0)  # waiting 20% beats leaving one out
    assert best([1, 1, 1, 2], 1) == (Mode.PARTIAL, 3)
    assert best([1, 1, 1, 4], 1) == (Mode.PARTIAL, 3)
    assert best([1, 1, 3, 3], 2) == (Mode.PARTIAL, 2)
    assert best([1, 3, 3, 3], 3) == (Mode.ASYNC, 0)  # more than half slow
    assert best([1, 1, 1, 1, 1.5, 6, 8, 8], 3) == (Mode.ASYNC, 0)  # a wide spread
    assert c.exclusion_slowdown == pytest.approx(3.0)
    # A member left out whose contributions the rounds still count is worth more than one
    # whose contributions all arrive late; unknown counts as late.
    late = value(Mode.PARTIAL, 1, [1.0, 1.6], c)
    assert value(Mode.PARTIAL, 1, [1.6, 1.0], c, counted=[None, None]) == pytest.approx(late)
    assert late == pytest.approx(1 + 0.6 / 1.6 - 0.2)
    half = value(Mode.PARTIAL, 1, [1.6, 1.0], c, counted=[0.5, 1.0])
    assert half == pytest.approx(1 + (0.5 + 0.5 * 0.6) / 1.6 - 0.2)
    assert late < value(Mode.SYNC, 0, [1.0, 1.6], c) < half
    # Excluding a straggler pays once it is worth less than it costs.
    for s, exclude in ((2.0, False), (2.9, False), (3.5, True), (4.0, True)):
        kept = value(Mode.PARTIAL, 3, [1, 1, 1, s], c)
        assert (value(Mode.SYNC, 0, [1, 1, 1], c) > kept) == exclude, s


# ------------------------------------------------------------------ detector on fixed traces
def stats_at(t: float, **per_worker: tuple[int, int, int, int, int]) -> JobStats:
    """JobStats with cumulative (contributions, late, duplicates, stale, closes) per worker."""
    return JobStats(1, t, {int(w[1:]): WorkerStats(int(w[1:]), True, *v)
                           for w, v in per_worker.items()}, {"NOT_MEMBER": 0})


def intervals_of(trace: list[JobStats], view: JobView) -> list[Interval]:
    return [Interval.between(a, b, view, view) for a, b in zip(trace, trace[1:], strict=False)]


def test_sync_the_last_arrival_is_the_straggler_after_the_dwell_and_leaves_with_hysteresis(
) -> None:
    view = JobView(Mode.SYNC, 0, frozenset(range(4)))
    detector = Detector(DetectorConfig(dwell_s=1.0))
    cum = [0, 0, 0, 0]
    trace = [stats_at(0.0, w0=(0, 0, 0, 0, 0), w1=(0, 0, 0, 0, 0), w2=(0, 0, 0, 0, 0),
                      w3=(0, 0, 0, 0, 0))]
    # Per interval, 20 rounds; the share of closes of worker 3, then 0-2 share the rest.
    shares = [0.25] * 4 + [1.0] * 10 + [0.5] * 6 + [0.3] * 8
    states = []
    for k, share in enumerate(shares, start=1):
        mine = round(20 * share)
        for w in range(3):
            cum[w] += (20 - mine) // 3 + (1 if w < (20 - mine) % 3 else 0)
        cum[3] += mine
        trace.append(stats_at(k * 0.5, **{f"w{w}": (20 * k, 0, 0, 0, cum[w]) for w in range(4)}))
        h = detector.update(intervals_of(trace[-2:], view)[0])[3]
        states.append(h.state)
    first_slow = states.index(Health.SLOW)
    # The share over the 4 s window must pass 0.7 (n = 4), then hold for the 1 s dwell.
    assert 5 <= first_slow <= 11
    h = detector.health[3]
    assert h.slowdown is None and h.basis == "closes"  # sync: slowdown unknown
    # A share of 0.5 is below the entry threshold (0.7) but above the exit (0.4375): slow.
    assert all(s == Health.SLOW for s in states[first_slow:20])
    assert states[-1] == Health.HEALTHY
    assert all(s == Health.HEALTHY for s in states[:first_slow])


def test_partial_the_pace_ratio_measures_the_slowdown() -> None:
    view = JobView(Mode.PARTIAL, 3, frozenset(range(4)))
    detector = Detector()
    trace = [stats_at(0.0, w0=(0,) * 5, w1=(0,) * 5, w2=(0,) * 5, w3=(0,) * 5)]
    for k in range(1, 9):
        # 3 fast members: 40 gradients per interval, a few late; worker 3: 10, all late or
        # stale (it resends the stale ones: they show up as late or accepted).
        trace.append(stats_at(k * 0.5, w0=(38 * k, 2 * k, 0, 0, 13 * k),
                              w1=(39 * k, k, 0, 0, 13 * k), w2=(40 * k, 0, 0, 0, 14 * k),
                              w3=(2 * k, 8 * k, 0, 10 * k, 0)))
    for interval in intervals_of(trace, view):
        health = detector.update(interval)
    assert health[3].state == Health.SLOW and health[3].slowdown == pytest.approx(4.0)
    assert health[3].included == pytest.approx(2 / 40)
    assert all(health[w].state == Health.HEALTHY for w in range(3))


def stalled_sync_trace(w3_stale_per_interval: int = 0) -> list[JobStats]:
    """Rounds stop at 2 s: worker 3 sends nothing valid any more (only stale packets, if
    any: a spoofer's), the others only retransmit."""
    trace = [stats_at(0.0, w0=(0,) * 5, w1=(0,) * 5, w2=(0,) * 5, w3=(0,) * 5)]
    for k in range(1, 12):
        done = min(k, 4) * 20
        dup = max(0, k - 4) * 3
        trace.append(stats_at(k * 0.5, w0=(done, 0, dup, 0, 5 * min(k, 4)),
                              w1=(done, 0, dup, 0, 5 * min(k, 4)),
                              w2=(done, 0, dup, 0, 5 * min(k, 4)),
                              w3=(done, 0, 0, w3_stale_per_interval * k, 5 * min(k, 4))))
    return trace


def test_a_silent_member_of_a_stalled_sync_job_is_gone_and_the_waiting_ones_are_not() -> None:
    view = JobView(Mode.SYNC, 0, frozenset(range(4)))
    detector = Detector(DetectorConfig(gone_after_s=1.5))
    gone_at = None
    for interval in intervals_of(stalled_sync_trace(), view):
        health = detector.update(interval)
        if gone_at is None and health[3].state == Health.GONE:
            gone_at = interval.end
        assert all(health[w].state != Health.GONE for w in range(3))
    assert gone_at == pytest.approx(2.0 + 1.5)


# ------------------------------------------------------------------ policy on traces
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_homogeneous_job_stays_sync_under_noise(seed: int) -> None:
    run = simulate(four(), 120, seed=seed, jitter=0.2, wobble=0.2)
    # Only explorations, each back to sync; nothing else decided.
    assert run.mode_changes() == [] and run.actions(EXCLUDE) == []
    assert all(mode == Mode.SYNC and len(active) == 4 for t, mode, _, active in run.timeline
               if not run.exploring(t))
    # The gap between explorations doubles while they find nobody: few of them, and the
    # job spends most of its time in sync.
    c = run.policy.config
    starts = [d.time for d, _ in run.explorations()]
    assert starts and starts[0] <= c.explore_after_s + 2 * INTERVAL
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert all(later > 1.5 * earlier for earlier, later in zip(gaps, gaps[1:], strict=False))
    assert len(starts) <= math.log2(120 / c.explore_after_s) + 1
    in_sync = sum(1 for _, mode, _, _ in run.timeline if mode == Mode.SYNC)
    assert in_sync >= 0.85 * len(run.timeline)


def test_a_straggler_hidden_by_a_step_of_many_rounds_is_found_by_exploring() -> None:
    # Seven rounds a step: the straggler is last only in the first, so its closes share
    # stays near the others' and sync alone never flags it ...
    hidden = simulate(four(slowdown=constant(2.0)), 30, PolicyConfig(explore_after_s=math.inf),
                      seed=3, wobble=0.2, waves=7)
    assert hidden.policy.decisions == []
    share = hidden.policy.health[3].closes_share
    assert share is not None and share < PolicyConfig().detector.closes_threshold(4,
                                                                                  leaving=False)
    # ... exploring measures every member's pace in async and finds it.
    run = simulate(four(slowdown=constant(2.0)), 30, seed=3, wobble=0.2, waves=7)
    first = run.policy.decisions[0]
    assert (first.action, first.mode) == (SET_MODE, "async")
    assert first.reason.startswith(EXPLORE) and first.time <= 3.0
    partial = run.first(SET_MODE, "partial", 3)
    assert partial.time <= first.time + 4.0 and "worker 3 slow" in partial.reason
    assert all(mode == Mode.PARTIAL for t, mode, _, _ in run.timeline if t >= partial.time)


class ModalJob:
    """A job whose members' paces (contributions a second) depend on the mode alone, as
    the counters of a job show them when the cost model's premise fails: the CNN on two
    shared cores, where partial(3) is no faster than sync. In sync every member keeps the
    sync pace and worker 3 closes 35% of the rounds (hidden: the others close 22% each)."""

    def __init__(self, paces: dict[tuple[Mode, int], list[float]]) -> None:
        self.paces = paces
        self.cum = [[0, 0, 0, 0, 0] for _ in range(4)]  # contributions .. closes

    def run(self, seconds: float) -> AdaptivePolicy:
        policy = AdaptivePolicy()
        view = JobView(Mode.SYNC, 0, frozenset(range(4)))
        policy.start(view, 0.0)
        before = self.stats(0.0)
        for k in range(1, int(round(seconds / INTERVAL)) + 1):
            mode = (policy.mode or Mode.SYNC, policy.quorum)
            for w, pace in enumerate(self.paces[mode]):
                n = round(pace * INTERVAL)
                self.cum[w][0] += n
                share = (0.35 if w == 3 else 0.65 / 3) if mode[0] == Mode.SYNC else (
                    1.0 if mode[0] == Mode.ASYNC else (0.0 if w == 3 else 1 / 3))
                self.cum[w][4] += round(share * n) if mode[0] != Mode.ASYNC else n
            now = JobView(*mode, frozenset(range(4)))
            after = self.stats(k * INTERVAL)
            policy.observe(Interval.between(before, after, now, now))
            before = after
        return policy

    def stats(self, t: float) -> JobStats:
        return stats_at(t, **{f"w{w}": tuple(c) for w, c in enumerate(self.cum)})


def test_a_mode_the_cost_model_chose_goes_back_to_sync_if_it_is_no_faster() -> None:
    # Async measures worker 3 1.7x slower, so the cost model picks partial(3); but in
    # partial the fast members make 90 contributions a second against 100 in sync.
    policy = ModalJob({(Mode.SYNC, 0): [100.0] * 4, (Mode.ASYNC, 0): [150, 150, 150, 90],
                       (Mode.PARTIAL, 3): [90, 90, 90, 70]}).run(60)
    changes = [(d.time, d.mode, d.reason) for d in policy.decisions]
    partial = [c for c in changes if c[1] == "partial"]
    assert partial, changes
    for when, _, _ in partial:  # each partial spell ends, refuted, within a few intervals
        back = next(c for c in changes if c[0] > when)
        assert back[1] == "sync" and "measured no faster than sync" in back[2], changes
        assert back[0] - when <= policy.config.min_dwell_s + 4 * INTERVAL
    # After a refutation only the next exploration may leave sync: explorations are
    # spaced by the doubling gap, so the job is in sync most of the time.
    starts = [c[0] for c in changes if c[2].startswith(EXPLORE)]
    assert len(partial) <= len(starts) <= math.log2(60 / policy.config.explore_after_s) + 1
    assert all(c[2].startswith(EXPLORE) for c in changes if c[1] == "async"), changes


def test_a_mode_the_cost_model_chose_stays_when_it_is_faster() -> None:
    policy = ModalJob({(Mode.SYNC, 0): [50.0] * 4, (Mode.ASYNC, 0): [100, 100, 100, 50],
                       (Mode.PARTIAL, 3): [100, 100, 100, 50]}).run(30)
    assert [d.mode for d in policy.decisions] == ["async", "partial"], \
        [d.describe() for d in policy.decisions]
    assert policy.mode == Mode.PARTIAL


def test_exploring_is_off_with_an_infinite_gap_and_a_bad_gap_is_refused() -> None:
    run = simulate(four(), 60, PolicyConfig(explore_after_s=math.inf), seed=1, wobble=0.2)
    assert run.policy.decisions == []
    with pytest.raises(ValueError, match="explore_after_s <= explore_max_s"):
        PolicyConfig(explore_after_s=10.0, explore_max_s=5.0)
    with pytest.raises(ValueError, match="0 < explore_after_s"):
        PolicyConfig(explore_after_s=0.0)


@pytest.mark.parametrize("slowdown", [2.0, 4.0])
def test_a_constant_straggler_makes_the_job_partial_within_a_few_intervals(
        slowdown: float) -> None:
    run = simulate(four(slowdown=constant(slowdown)), 60, seed=7, wobble=0.2)
    # Sync shows only who closes the rounds: probe in async to measure...
    # (or the exploration at the start finds it first: the same probe).
    probe = run.policy.decisions[0]
    assert (probe.action, probe.mode) == (SET_MODE, "async")
    assert ("probe: worker 3 slow" in probe.reason or probe.reason.startswith(EXPLORE))
    assert probe.time <= 3.0
    # ... then partial(n-1) around it, 12 intervals after the start at most.
    partial = run.first(SET_MODE, "partial", 3)
    assert partial.time <= 6.0 and "cost model" in partial.reason
    h = run.policy.health.get(3)
    if slowdown == 2.0:  # stays partial, measured, never excluded
        assert run.actions(EXCLUDE) == []
        assert [(d.mode, d.quorum) for d in run.mode_changes()] == [("async", 0), ("partial", 3)]
        assert h is not None and h.slowdown == pytest.approx(2.0, rel=0.2)
    else:  # worth less than it costs: excluded after the dwell time
        excluded = run.first(EXCLUDE, worker=3)
        assert "persistent straggler" in excluded.reason
        c = run.policy.config
        assert partial.time + c.exclude_after_s <= excluded.time
        assert excluded.time <= partial.time + c.exclude_after_s + 4.0
        # Without it the job is homogeneous again: sync among the other three.
        after = [d for d in run.mode_changes() if d.time >= excluded.time]
        assert after[0].mode == "sync" and after[0].time == excluded.time


def test_two_stragglers_both_show_in_the_probe_and_make_the_job_partial_around_them() -> None:
    workers = [SimWorker(0), SimWorker(1), SimWorker(2, constant(2.5)), SimWorker(3, constant(2.5))]
    run = simulate(workers, 40, seed=1, wobble=0.2)
    # Two stragglers share the closes: sync shows them over the crowd window.
    assert run.first(SET_MODE, "partial", 2).time <= run.policy.config.detector.crowd_window_s + 6
    assert [(d.mode, d.quorum) for d in run.mode_changes()] == [("async", 0), ("partial", 2)]
    assert {w for w, h in run.policy.health.items() if h.state == Health.SLOW} == {2, 3}


@pytest.mark.parametrize("speeds", [[1, 4, 4, 4], [1, 1, 4, 4, 4]])
def test_more_than_half_slow_makes_the_job_async(speeds: list[float]) -> None:
    workers = [SimWorker(w, constant(s)) for w, s in enumerate(speeds)]
    run = simulate(workers, 40, seed=1, wobble=0.2)
    # Sync shows a crowd of stragglers as members that close no round, over a longer
    # window (a homogeneous job shows that for a few seconds by chance).
    first = run.mode_changes()[0]
    assert first.mode == "async" and first.time <= run.policy.config.detector.crowd_window_s + 6
    assert "probe" in first.reason
    assert all(mode == Mode.ASYNC for t, mode, _, _ in run.timeline if t >= first.time)
    assert run.actions(EXCLUDE) == []  # async waits for nobody: nothing to exclude
    slow = {w for w, h in run.policy.health.items() if h.state == Health.SLOW}
    assert slow == {w for w, s in enumerate(speeds) if s > 1}
    assert all(run.policy.health[w].slowdown == pytest.approx(4.0, rel=0.25) for w in slow)


def test_a_slight_straggler_is_never_excluded_nor_kept_in_partial() -> None:
    run = simulate(four(slowdown=constant(1.2)), 120, seed=3, wobble=0.2)
    assert run.actions(EXCLUDE) == []
    # It is the one closing most rounds in sync, so it may be probed now and then (async,
    # to measure it), at most once per probe_ttl_s, and the job is back in sync soon.
    probes = [d for d in run.mode_changes() if d.reason.startswith("probe")]
    assert len(probes) <= 120 / run.policy.config.probe_ttl_s + 1
    left: float | None = None
    for d in run.mode_changes():
        if d.mode != "sync" and left is None:
            left = d.time
        elif d.mode == "sync":
            assert left is not None and d.time - left <= 10.0, d
            left = None
    in_sync = sum(1 for _, mode, _, _ in run.timeline if mode == Mode.SYNC)
    assert in_sync >= 0.75 * len(run.timeline)


def test_an_intermittent_straggler_does_not_flap_with_its_period() -> None:
    run = simulate(four(slowdown=alternating(1.0, 4.0)), 90, seed=5, wobble=0.2)
    changes = run.mode_changes()
    assert len(changes) <= 4, [d.describe() for d in changes]  # 45 periods
    assert run.actions(EXCLUDE) == []


def test_a_recovering_straggler_goes_partial_then_back_to_sync() -> None:
    run = simulate(four(slowdown=until(20.0, 2.5)), 60, seed=11, wobble=0.2)
    partial = run.first(SET_MODE, "partial", 3)
    assert partial.time < 20.0
    back = run.first(SET_MODE, "sync")
    assert 20.0 < back.time <= 20.0 + 6.0
    assert run.actions(EXCLUDE) == []
    assert all(mode == Mode.SYNC for t, mode, _, _ in run.timeline
               if t > back.time and not run.exploring(t))


def test_an_excluded_straggler_is_readmitted_on_probation_when_it_recovers() -> None:
    config = PolicyConfig(readmit_after_s=10.0, max_excluded_s=20.0)
    run = simulate(four(slowdown=until(30.0, 5.0)), 90, config, seed=2, wobble=0.2)
    excluded = run.first(EXCLUDE, worker=3)
    assert excluded.time < 20.0
    readmits = run.actions(READMIT, 3)
    assert readmits and all("heartbeat" in d.reason for d in readmits)
    last = readmits[-1]
    assert 30.0 < last.time <= 30.0 + config.max_excluded_s + INTERVAL
    # The probation passed: nobody excluded since, all four active in sync at the end.
    assert not [d for d in run.actions(EXCLUDE) if d.time > last.time]
    t, mode, _, active = run.timeline[-1]
    assert mode == Mode.SYNC and active == {0, 1, 2, 3}
    back = [d for d in run.mode_changes() if d.time > last.time]
    assert back and back[-1].mode == "sync"
    assert back[-1].time <= last.time + config.probation_s + 2.0


def test_a_dying_worker_is_excluded_quickly_and_not_readmitted_while_gone() -> None:
    config = PolicyConfig(readmit_after_s=5.0, max_excluded_s=10.0)
    run = simulate(four(dies_at=10.0), 80, config, seed=4, wobble=0.2)
    excluded = run.first(EXCLUDE, worker=3)
    assert "gone" in excluded.reason
    assert 10.0 < excluded.time <= 10.0 + config.detector.gone_after_s + 2 * INTERVAL
    assert run.actions(READMIT) == []
    assert run.mode_changes() == []  # it stalled sync; without it sync runs again
    # The three others made progress all along after the exclusion.
    after = [iv for iv in run.intervals if iv.start >= excluded.time]
    assert all(sum(iv.delta(w).contributions for w in range(3)) > 0 for iv in after)


def test_the_starvation_guard_probes_an_excluded_live_member_within_max_excluded_s() -> None:
    config = PolicyConfig(readmit_after_s=4.0, max_excluded_s=12.0)
    run = simulate(four(slowdown=constant(5.0)), 120, config, seed=9)
    events = [d for d in run.policy.decisions if d.action in (EXCLUDE, READMIT)]
    assert len(events) >= 6
    for excluded, readmitted in zip(events[::2], events[1::2], strict=False):
        assert (excluded.action, readmitted.action) == (EXCLUDE, READMIT)
        assert readmitted.time - excluded.time <= config.max_excluded_s + INTERVAL
    # Each failed probation doubles the back-off, up to max_excluded_s.
    gaps = [r.time - e.time for e, r in zip(events[::2], events[1::2], strict=False)]
    assert gaps[0] == pytest.approx(config.readmit_after_s, abs=INTERVAL)
    assert gaps[-1] == pytest.approx(config.max_excluded_s, abs=INTERVAL)
    capped = [r for e, r in zip(events[::2], events[1::2], strict=False)
              if r.time - e.time >= config.max_excluded_s - INTERVAL]
    assert capped and all("starvation guard" in r.reason for r in capped)


def test_the_starvation_guard_refreshes_sync_for_a_member_left_out_of_every_round() -> None:
    # Worker 3 does not resend a stale contribution: in partial it is in no sum at all.
    # Exclusion is off, so only the guard can bring its gradients in. Its packets are all
    # stale, which is not liveness (docs/protocol.md §8): the gone detector is kept out.
    config = PolicyConfig(exclude_slowdown=math.inf, max_starved_s=8.0, refresh_s=1.0,
                          detector=DetectorConfig(gone_after_s=1e6))
    run = simulate(four(slowdown=constant(2.5), resends=False), 60, config, seed=6)
    refreshes = [d for d in run.mode_changes() if "starvation guard" in d.reason]
    assert len(refreshes) >= 3
    for d in refreshes[:-1]:  # the last may end after the run
        during = [iv for iv in run.intervals if d.time <= iv.start < d.time + 1.0]
        assert sum(iv.delta(3).contributions for iv in during) > 0  # included at last
        back = next(x for x in run.mode_changes() if x.time > d.time)
        assert back.mode == "partial" and back.time - d.time <= 1.0 + INTERVAL


def test_replaying_a_recorded_trace_gives_the_same_decisions() -> None:
    run = simulate(four(slowdown=constant(4.0)), 40, seed=8, wobble=0.2)
    replay = AdaptivePolicy()
    replay.start(JobView(Mode.SYNC, 0, frozenset(range(4))), 0.0)
    for interval in run.intervals:
        replay.observe(interval)
    assert replay.decisions == run.policy.decisions
    assert json.loads(json.dumps([d.to_dict() for d in replay.decisions]))


# ------------------------------------------------------------------ a real softswitch
class PacedSender(Sender):
    """A sender that computes for `delay` seconds per round and, told by RESYNCs that
    every slot has moved on, adopts the open round as a worker does."""

    def __init__(self, *args: object, delay: float = 0.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.delay = delay
        self._seen = 0

    def _send(self, slot: int, rnd: int, *, retransmit: bool) -> None:
        if not retransmit and slot == self.slots[0]:
            self.shared.stop.wait(self.delay)
            rnd = self.round = self._resync_round()
        super()._send(slot, rnd, retransmit=retransmit)

    def _resync_round(self) -> int:
        """The lowest open round over the slots, if every slot told one above ours."""
        told: dict[int, int] = {}
        for r in self.replies[self._seen:]:
            h = r.header
            if h.op == Op.RESULT:
                told[h.slot] = max(told.get(h.slot, 0), h.round + 1)
            elif h.op == Op.RESYNC and h.reason != wire.ResyncReason.CHUNK_MISMATCH:
                told[h.slot] = max(told.get(h.slot, 0), h.round)
        self._seen = len(self.replies)
        final = self.shared.final_round
        if len(told) == len(self.slots) and min(told.values()) > self.round and (
                final is None or min(told.values()) <= final):
            return min(told.values())
        return self.round


def integration_config() -> PolicyConfig:
    detector = DetectorConfig(window_s=1.0, closes_window_s=1.0, min_evidence_s=0.4,
                              dwell_s=0.4, gone_after_s=2.0, min_closes=4)
    # No async probe: the test senders number rounds as sync/partial workers do.
    return PolicyConfig(min_dwell_s=0.6, exclude_after_s=1.0, readmit_after_s=1.0,
                        max_excluded_s=3.0, probation_s=1.0, heartbeat_window_s=1.0,
                        allow_async=False, detector=detector)


def wait_for(runner_decisions: list[dict[str, object]], what: Callable[[dict[str, object]], bool],
             senders: list[Sender], timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        for s in senders:
            assert s.error is None, s.error
        found = [r for r in list(runner_decisions) if what(r)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, [r["reason"] for r in runner_decisions]
        time.sleep(0.05)


def test_the_runner_takes_a_slow_worker_out_and_back_in_on_a_real_switch(
        softswitch: Softswitch, controller: Controller,
        sockets: list[socket.socket],  # noqa: F811 (the imported fixture)
        tmp_path: Path) -> None:
    """...and its records name the slow member's host and the ranks it speaks for: each
    member here is a host of two ranks (member w: host h<w+1>, ranks 2w and 2w+1)."""
    controller.add_job(job_for(sockets))
    hosts = {w: MemberHost(f"h{w + 1}", (2 * w, 2 * w + 1)) for w in range(4)}
    shared = Shared()
    senders = start(softswitch, sockets, [0, 1, 2], shared)
    slow = PacedSender(1, 3, sockets[3], softswitch.udp_addr, range(16), shared, delay=0.1)
    slow.start()
    senders.append(slow)
    log_file = tmp_path / "decisions.jsonl"
    records: list[dict[str, object]] = []
    runner = PolicyRunner(controller, 1, AdaptivePolicy(integration_config()), interval=0.2,
                          log_path=log_file, echo=records.append, hosts=hosts)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, kwargs={"stop": stop}, daemon=True)
    try:
        wait_progress(senders, 3)
        thread.start()
        partial = wait_for(records, lambda r: r["mode"] == "partial", senders, 15)
        assert partial["applied"] and "worker 3 slow" in str(partial["reason"])
        slow_entry = partial["inputs"]["workers"]["3"]  # type: ignore[index]
        assert (slow_entry["state"], slow_entry["host"], slow_entry["ranks"]) == (
            "slow", "h4", [6, 7])
        excluded = wait_for(records, lambda r: r["action"] == EXCLUDE, senders, 15)
        assert excluded["worker"] == 3 and excluded["applied"]
        assert (excluded["member"], excluded["host"], excluded["ranks"]) == (3, "h4", [6, 7])
        assert 3 not in controller.job(1).active
        slow.delay = 0.0  # it recovers
        readmitted = wait_for(records, lambda r: r["action"] == READMIT, senders, 15)
        assert readmitted["worker"] == 3 and readmitted["applied"]
        assert (readmitted["member"], readmitted["host"], readmitted["ranks"]) == (
            3, "h4", [6, 7])
        wait_for(records, lambda r: r["action"] == SET_MODE and r["mode"] == "sync"
                 and float(r["time"]) > float(readmitted["time"]), senders, 15)  # type: ignore[arg-type]
        stop.set()
        thread.join(timeout=10)
        assert not thread.is_alive()
        runner.close()
        assert controller.job(1).active == {0, 1, 2, 3}
        wait_progress(senders, max(s.round for s in senders) + 3)
        finish(senders, shared, extra=2)
    finally:
        stop.set()
        shared.stop.set()
    # Every sum is the sum of the contributions its bitmap names (checked by
    # merged_results), each contribution was counted at most once, and every packet a
    # sender sent is in exactly one counter bucket (dropped ones as NOT_MEMBER).
    merged = merged_results(senders)
    stats = controller.stats(1)
    for s in senders:
        c = stats.workers[s.worker]
        assert c.contributions == sum(1 for h in merged.values() if h.bitmap >> s.worker & 1)
    sent = sum(s.packets_sent for s in senders)
    counted = sum(c.contributions + c.late + c.duplicates + c.stale
                  for c in stats.workers.values())
    assert sent == counted + stats.drops["NOT_MEMBER"]
    assert stats.drops["NOT_MEMBER"] > 0  # its heartbeat while it was excluded
    modes = {h.mode for h in merged.values()}
    assert {Mode.SYNC, Mode.PARTIAL} <= modes
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert lines[0]["action"] == "start" and lines[1:] == records


def test_a_counter_read_that_misses_its_deadline_skips_a_tick_and_the_policy_goes_on(
        softswitch: Softswitch, controller: Controller,
        sockets: list[socket.socket],  # noqa: F811 (the imported fixture)
        caplog: pytest.LogCaptureFixture) -> None:
    controller.add_job(job_for(sockets))
    runner = PolicyRunner(controller, 1, AdaptivePolicy(integration_config()), interval=0.2)
    runner.step()  # the start: the first reading
    controller.switch.timeout = 0.5
    # A busy switch: the softswitch snapshots counters under its pipeline's lock, so while
    # the lock is held the read waits on the switch, past its gRPC deadline.
    with softswitch.pipeline.lock, caplog.at_level("WARNING"):
        assert runner.step() == []
    assert runner.skipped_reads == 1
    assert "job 1: the counter read missed its deadline, tick skipped" in caplog.text
    controller.switch.timeout = 30.0
    runner.step()  # the switch answers again: the policy reads and decides as before
    assert runner.skipped_reads == 1 and runner.policy.active == {0, 1, 2, 3}
    runner.close()


# ------------------------------------------------------------------ the command line
def test_policy_run_dry_run_and_stats_show_the_latest_decision(
        softswitch: Softswitch, tmp_path: Path) -> None:
    def hysync(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--grpc-addr", softswitch.grpc_addr, *args], stdout=out, stderr=err)
        return code, out.getvalue(), err.getvalue()

    assert hysync("pipeline", "push", "--p4info", str(P4INFO))[0] == 0
    log_file = tmp_path / "policy.jsonl"
    code, out, err = hysync("policy", "run", "1", "--policy", "adaptive", "--dry-run",
                            "--duration", "0.5")
    assert code == 1 and out == "" and err.startswith("hysync: error: no job 1")
    assert len(err.splitlines()) == 1
    job = tmp_path / "job.toml"
    job.write_text('job_id = 1\nmode = "sync"\n[slots]\nbase = 0\ncount = 16\n' + "".join(
        f'[[members]]\nworker = {w}\nipv4 = "127.0.0.1"\nmac = "02:00:00:00:00:0{w + 1}"\n'
        f"udp_port = {47001 + w}\nswitch_port = 1\n" for w in range(4)))
    assert hysync("job", "add", str(job))[0] == 0
    code, out, err = hysync("policy", "run", "1", "--policy", "adaptive", "--dry-run",
                            "--interval", "0.1", "--duration", "0.5", "--log", str(log_file))
    assert (code, err) == (0, ""), err
    assert out.splitlines()[-1].startswith("policy adaptive on job 1 (dry run): 0 decisions")
    assert json.loads(log_file.read_text().splitlines()[0])["action"] == "start"
    code, out, _ = hysync("stats", "1", "--policy-log", str(log_file))
    assert code == 0 and "policy: started (dry run), sync" in out
    # A decision appended by a run shows up in stats, text and JSON, at its wall-clock time
    # (its `time`, 12.5, is the monotonic clock's: seconds since boot).
    wall = datetime.datetime(2026, 3, 1, 14, 5, 9, 250000).timestamp()
    record = dict(Decision(12.5, SET_MODE, "partial", 3, None, "worker 3 slow (2.00x)").to_dict(),
                  job_id=1, applied=True, error=None, dry_run=False, wall=wall)
    with log_file.open("a") as f:
        f.write(json.dumps(record) + "\n")
    code, out, _ = hysync("stats", "1", "--policy-log", str(log_file))
    assert "policy: mode partial(3): worker 3 slow (2.00x) (at 14:05:09.2)" in out
    code, out, _ = hysync("--json", "stats", "1", "--policy-log", str(log_file))
    assert json.loads(out)["policy"]["quorum"] == 3
    code, out, err = hysync("stats", "1", "--policy-log", str(tmp_path / "missing"))
    assert code == 2 and "cannot read the policy log" in err and len(err.splitlines()) == 1


def test_a_member_is_named_by_its_host_and_ranks() -> None:
    hosts = {1: MemberHost("h2", (2, 3)), 2: MemberHost("h3", (8, 9, 10, 11, 13)),
             3: MemberHost("h4", (5,)), 4: MemberHost(None, None)}
    assert describe(1, hosts) == "member 1 (host h2, ranks 2, 3)"
    assert describe(2, hosts) == "member 2 (host h3, ranks 8-11, 13)"
    assert describe(3, hosts) == "member 3 (host h4, rank 5)"
    assert (describe(4, hosts), describe(5, hosts)) == ("member 4", "member 5")
    assert member_fields(1, hosts) == {"member": 1, "host": "h2", "ranks": [2, 3]}
    assert member_fields(5, hosts) == {"member": 5, "host": None, "ranks": None}
    record = dict(Decision(1.0, EXCLUDE, "sync", 0, 1, "slow").to_dict(),
                  **member_fields(1, hosts))
    assert decision_text(record) == "exclude member 1 (host h2, ranks 2, 3): slow"
    record = Decision(1.0, EXCLUDE, "sync", 0, 1, "slow").to_dict()  # no host known
    assert decision_text(record) == "exclude worker 1: slow"


def test_a_spine_member_is_named_by_its_leaf_and_the_ranks_behind_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """At the spine the members are the leaves: describe, the record's fields, the event
    and `policy status` name each by its leaf (a field of its own, not `host`) and the
    job's ranks behind it; a member below the spine is named as before."""
    spine = {0: MemberHost.of_leaf("leaf-0", [MemberHost("h1", (1,)), MemberHost("h0", (0,))]),
             1: MemberHost.of_leaf("leaf-1", [MemberHost("h2", (2, 3))])}
    assert spine[0] == MemberHost(None, (0, 1), "leaf-0")
    assert describe(1, spine) == "member 1 (leaf leaf-1, ranks 2, 3)"
    unknown = MemberHost.of_leaf("leaf-0", [MemberHost("h0", (0,)), None])  # h1 not told
    assert describe(0, {0: unknown}) == "member 0 (leaf leaf-0)"
    assert member_fields(1, spine) == {"member": 1, "host": None, "leaf": "leaf-1",
                                       "ranks": [2, 3]}
    assert "leaf" not in member_fields(1, {1: MemberHost("h2", (2, 3))})
    assert describe_decision(Decision(1.0, EXCLUDE, "sync", 0, 1, "gone"), spine) == (
        "exclude member 1 (leaf leaf-1, ranks 2, 3): gone")
    # A mode set that leaves out the slow rack: its reason names leaf 1 by its member id.
    health = {"0": {"state": "healthy"}, "1": {"state": "slow"}}
    d = Decision(2.0, SET_MODE, "partial", 1, None, "worker 1 slow (closes 100% of rounds)",
                 {"workers": health})
    said = ("mode partial(1): worker 1 slow (closes 100% of rounds); "
            "slow member 1 (leaf leaf-1, ranks 2, 3)")
    assert describe_decision(d, spine) == said
    assert describe_decision(d, {1: MemberHost("h2", (2, 3))}) == d.describe()  # one switch
    runner = PolicyRunner(SimpleNamespace(jobs={}, hot_swaps_async=True),  # type: ignore[arg-type]
                          1, AdaptivePolicy(), hosts=spine, level="spine")
    record = json.loads(json.dumps(runner.record(d, applied=True, error=None)))
    assert record["inputs"]["workers"]["1"] == {"state": "slow", "host": None,
                                                "leaf": "leaf-1", "ranks": [2, 3]}
    assert decision_text(record) == said  # `policy status` reads the record back
    with caplog.at_level("INFO", logger="hysync.controlplane.policy.runner"):
        _log_decision(7, d, spine, "spine")
    [event] = [r for r in caplog.records if getattr(r, "hysync_event", None) == "mode_swap"]
    assert event.getMessage() == f"job 7: spine: {said}"
    assert event.hysync_fields["leaves"] == [  # type: ignore[attr-defined]
        {"member": 1, "host": None, "leaf": "leaf-1", "ranks": [2, 3], "state": "slow"}]


def test_the_spines_members_are_its_leaves_with_the_ranks_of_their_hosts() -> None:
    """levels.spine_members: each leaf's uplink id (its member id at the spine) -> the leaf
    and the ranks of its hosts; ranks unknown where any host's are."""
    def switch(role: str, uplink_id: int, members: int) -> SimpleNamespace:
        job = SimpleNamespace(role=SimpleNamespace(name=role, uplink_id=uplink_id),
                              members=[SimpleNamespace(worker=w) for w in range(members)])
        return SimpleNamespace(jobs={5: job})

    held = [("spine", switch("spine", -1, 2)), ("leaf:rack-a", switch("leaf", 1, 2)),
            ("leaf:rack-b", switch("leaf", 0, 2))]
    hosts = {"leaf:rack-a": {0: MemberHost("a0", (2,)), 1: MemberHost("a1", (3, 4))},
             "leaf:rack-b": {0: MemberHost("b0", (0,)), 1: MemberHost("b1", None)}}
    assert spine_members(5, held, hosts) == {  # type: ignore[arg-type]
        1: MemberHost(None, (2, 3, 4), "rack-a"), 0: MemberHost(None, None, "rack-b")}
    assert spine_members(5, held, {}) == {  # type: ignore[arg-type]
        1: MemberHost(None, None, "rack-a"), 0: MemberHost(None, None, "rack-b")}


def test_a_decision_log_record_reads_back_as_the_decision() -> None:
    d = Decision(12.5, SET_MODE, "partial", 3, None, "worker 2 is 2.0x slow", {"n": 4})
    record = dict(d.to_dict(), job_id=1, applied=True, error=None, wall=1.0)
    assert Decision.from_dict(record) == d
    assert d.describe() == "mode partial(3): worker 2 is 2.0x slow"


def test_latest_decision_reads_the_last_record_of_the_job(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_text("\n".join(json.dumps({"job_id": j, "n": n})
                              for j, n in ((1, 1), (2, 2), (1, 3), (2, 4))) + "\n")
    assert latest_decision(path, 1) == {"job_id": 1, "n": 3}
    assert latest_decision(path, 3) is None


def test_stale_packets_alone_do_not_keep_a_dead_member_alive() -> None:
    """A spoofer sending from worker 3's address with random rounds
    raises only its `stale` counter; worker 3 still goes gone after gone_after_s."""
    view = JobView(Mode.SYNC, 0, frozenset(range(4)))
    detector = Detector(DetectorConfig(gone_after_s=1.5))
    states = [detector.update(interval)[3].state
              for interval in intervals_of(stalled_sync_trace(50), view)]
    assert states[-1] == Health.GONE

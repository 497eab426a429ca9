"""Straggler detection from a job's per-worker counters (docs/protocol.md §8).

The switch counts, per (job, worker), contributions accepted, `late` (arrived after
the round closed), `duplicates`, `stale` (older rounds) and `closes` (the contribution
that closed a round). Which of them shows a straggler depends on the mode:

* `sync`: every round waits for the slowest member, so every member contributes at
  its pace and the rates show nothing. The straggler is the *last arrival*, the one
  whose packet closes the rounds: its share of `closes` is ~1, the others' ~0. Several
  stragglers share the closes, and the members faster than all of them close none:
  over a longer window (`crowd_window_s`), a member that closes at least its fair
  share while another closes almost none is slow too. Slowdowns cannot be measured
  in sync; the policy probes (switches mode for a few intervals and measures).
* `partial(q)` and `async`: nobody waits, so a slow worker contributes (accepted or
  late) less often than the others: its *pace* is lower.

*Pace* is `contributions + late` per second: every gradient a worker sends ends as
exactly one of them, because a `stale` contribution is sent again at the open round
(docs/protocol.md §9, native/worker/results.cc) and duplicates are retransmissions. The
*slowdown* of a worker is the pace of the fast members (the mean of those within 20%
of the fastest) over its own. (A worker that moves on after a RESYNC instead of
sending its gradient again shows a pace near zero while it is always behind: a larger
slowdown, which is what its contribution is worth.)

*A member that stands for a rack* (the spine of a job across switches: its members are
the leaves) is paced by the hosts behind it, not by its own counters: an interval may
carry `behind`, each member's pace measured at its leaf (policy/rack_pace.py says which
and why), and the pace signals use it in place of the member's contributions and late
ones. The closes (sync), liveness and `included` stay the member's own: they are about
the member's sums at this switch.

A worker that showed no *liveness* for `gone_after_s` while others did is *gone*.
Liveness (docs/protocol.md §8) is what the switch validated against the slot's state:
contributions it counted, `late` ones (the round that just closed) and `duplicates`
(a round it holds the worker's bit in, or the async sequence number it counted last).
In a sync round stalled by a dead worker the live members' retransmissions show up as
duplicates, and they are not gone. `stale` packets are not liveness: any packet from
a member's address with an arbitrary round is counted stale, so a spoofer could keep
a dead worker looking alive with them.

*A slow member, not a slow machine.* Every member slower together (a busy host, the
switch's own slowness) moves every pace and no ratio: the slowdown is relative to the
fast members of the same window, so it stays near 1. What a busy host adds is noise in
turns: the scheduler stalls one process for an interval, then another, and a window's
sums then call whoever was stalled last "slow" (on two cores shared with CPU hogs, a
healthy worker measured 1.67x). A straggler is slow in every interval, a stalled member
in a few: entering `slow` by pace needs the member behind the interval's fast members
(its slowdown in that interval at least `slow_exit`) in `steady_share` of the window's
intervals, besides the window's slowdown passing `slow_enter`.

Robustness: signals are sums over a sliding window of intervals (not one interval);
only *stable* intervals count (the mode and the membership did not change in them:
rounds latched under the old mode still close in the interval after a swap); the
thresholds to enter and to leave `slow` differ (hysteresis); and a new state is
adopted only after it has been indicated continuously for `dwell_s`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hysync.controlplane.tables.counters import JobStats, WorkerStats
from hysync.controlplane.tables.installed import InstalledJob
from hysync.wire import Mode

RATE_MODES = (Mode.PARTIAL, Mode.ASYNC)


class Health(enum.Enum):
    HEALTHY = "healthy"
    SLOW = "slow"
    GONE = "gone"


# ------------------------------------------------------------------ observations
@dataclass(frozen=True, slots=True)
class JobView:
    """What detection and policy need to know of a job's configuration at one moment."""

    mode: Mode | None  # None: the job's slots are not all in one mode
    quorum: int
    active: frozenset[int]
    slots: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, job: InstalledJob) -> JobView:
        modes = {(s.mode, s.quorum) for s in job.segments()}
        if len(modes) != 1:
            return cls(None, 0, job.active, job.slots)
        mode, quorum = next(iter(modes))
        return cls(Mode(mode), quorum, job.active, job.slots)


@dataclass(frozen=True, slots=True)
class Delta:
    """A worker's counter increments over one interval."""

    contributions: int = 0
    late: int = 0
    duplicates: int = 0
    stale: int = 0
    closes: int = 0

    @property
    def pace(self) -> int:
        """Gradients sent: each ends accepted or late exactly once."""
        return self.contributions + self.late

    @property
    def activity(self) -> int:
        """Liveness: packets the switch matched against the slot's state (not `stale`,
        which any packet from the member's address with a random round produces)."""
        return self.contributions + self.late + self.duplicates

    @classmethod
    def between(cls, before: WorkerStats | None, after: WorkerStats) -> Delta:
        def d(name: str) -> int:
            # A counter that went backwards (pipeline pushed again) restarts from zero.
            now, then = getattr(after, name), getattr(before, name) if before else 0
            return now - then if now >= then else now
        return cls(d("contributions"), d("late"), d("duplicates"), d("stale"), d("closes"))


@dataclass(frozen=True, slots=True)
class Interval:
    """The counters of a job between two reads, and its configuration over that time."""

    start: float
    end: float
    mode: Mode | None  # None: mixed modes, or the mode changed during the interval
    quorum: int
    active: frozenset[int]  # members active at both ends
    workers: Mapping[int, Delta]
    not_member: int  # NOT_MEMBER drops: packets of excluded members (or strangers)
    stable: bool  # mode and membership the same at both ends
    # The pace of the hosts behind each member over the interval (a spine's leaves: their
    # hosts' contributions and late ones, rack_pace.py); None: each member's own pace.
    behind: Mapping[int, float] | None = None

    @property
    def duration(self) -> float:
        return max(self.end - self.start, 1e-9)

    @classmethod
    def between(cls, before: JobStats, after: JobStats, was: JobView,
                now: JobView) -> Interval:
        stable = (was.mode, was.quorum, was.active) == (now.mode, now.quorum, now.active)
        workers = {w: Delta.between(before.workers.get(w), s) for w, s in after.workers.items()}
        nm_before, nm_after = before.drops.get("NOT_MEMBER", 0), after.drops.get("NOT_MEMBER", 0)
        not_member = nm_after - nm_before if nm_after >= nm_before else nm_after
        return cls(before.time, after.time, now.mode if stable else None,
                   now.quorum if stable else 0, was.active & now.active, workers, not_member,
                   stable and now.mode is not None)

    def delta(self, worker: int) -> Delta:
        return self.workers.get(worker, Delta())

    def pace(self, worker: int) -> float:
        """The member's pace over the interval: that of the hosts behind it where the
        interval says (`behind`), else its own gradients sent (`Delta.pace`)."""
        if self.behind is not None:
            return self.behind.get(worker, 0.0)
        return self.delta(worker).pace


# ------------------------------------------------------------------ configuration
@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Thresholds of the detector; the defaults suit a 0.5 s read interval."""

    window_s: float = 2.0  # pace window (partial/async intervals)
    closes_window_s: float = 4.0  # closes window (sync): noisier, so longer
    min_evidence_s: float = 1.0  # a window spanning less says nothing yet
    slow_enter: float = 1.3  # slowdown to become slow (partial(n-1) pays from ~1.3x) ...
    slow_exit: float = 1.15  # ... and below which a slow worker is healthy again
    # Closes share to become slow / to leave slow, as a fraction of the way from 1/n (a
    # homogeneous job: every member closes its share) to 1 (one member closes them all):
    # n = 4 enters at 0.7 and leaves below 0.4375.
    closes_enter: float = 0.6
    closes_exit: float = 0.25
    # A member closing less than this fraction of its fair share (1/n) is faster than
    # the members that do close: with several stragglers, they share the closes.
    closes_low: float = 0.25
    crowd_window_s: float = 8.0  # ... judged over this longer window (x n/4 above 4), full
    min_closes: int = 8  # fewer closes in the window: no evidence (idle or stalled job)
    min_packets: int = 8  # the fastest pace in the window below this: no evidence
    gone_after_s: float = 1.5  # no packet at all this long while others send: gone
    dwell_s: float = 1.0  # a new state must be indicated this long before it is adopted
    # Entering slow by pace: behind the fast members in this share of the window's
    # intervals (a busy machine stalls members in turns; a straggler is behind in each).
    steady_share: float = 0.75

    def __post_init__(self) -> None:
        positive = ("window_s", "closes_window_s", "min_evidence_s", "gone_after_s")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"detector {name} must be > 0, got {getattr(self, name)}")
        if not 1 < self.slow_exit <= self.slow_enter:
            raise ValueError(f"detector thresholds need 1 < slow_exit <= slow_enter, got "
                             f"{self.slow_exit} and {self.slow_enter}")
        if not 0 < self.closes_exit <= self.closes_enter < 1:
            raise ValueError(f"detector thresholds need 0 < closes_exit <= closes_enter < 1, "
                             f"got {self.closes_exit} and {self.closes_enter}")
        if self.dwell_s < 0:
            raise ValueError(f"detector dwell_s must be >= 0, got {self.dwell_s}")
        if not 0 <= self.steady_share <= 1:
            raise ValueError(f"detector steady_share must be in [0, 1], got {self.steady_share}")

    def closes_threshold(self, n: int, *, leaving: bool) -> float:
        frac = self.closes_exit if leaving else self.closes_enter
        return 1 / n + frac * (1 - 1 / n)


# ------------------------------------------------------------------ results
@dataclass(frozen=True, slots=True)
class WorkerHealth:
    worker: int
    state: Health
    since: float  # when the state was adopted
    slowdown: float | None = None  # last pace-based estimate (None: never measured)
    measured_at: float | None = None  # end of the interval that estimate is from
    closes_share: float | None = None  # sync: its share of the window's closes
    included: float | None = None  # partial/async: its accepted contributions / the top's
    basis: str = "none"  # what the state rests on: pace, closes, silence, none
    pending: Health | None = None  # a different state indicated, not yet for dwell_s
    # partial/async: the share of what it sent that the rounds counted (contributions over
    # contributions, late and stale ones), at this switch
    counted: float | None = None

    def fresh(self, now: float) -> bool:
        """The slowdown was measured in the interval that ended at `now`."""
        return self.measured_at is not None and self.measured_at >= now

    def describe(self) -> str:
        text = f"worker {self.worker} {self.state.value}"
        if self.state == Health.GONE:
            return text
        parts = []
        if self.basis == "closes" and self.closes_share is not None:
            parts.append(f"closes {self.closes_share:.0%} of rounds")
        if self.slowdown is not None:
            measured = "" if self.basis == "pace" else "last measured "
            parts.append(f"{measured}{self.slowdown:.2f}x")
        elif self.state == Health.SLOW:
            parts.append("slowdown unknown")
        return f"{text} ({'; '.join(parts)})" if parts else text

    def to_dict(self) -> dict[str, object]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)
        return {"state": self.state.value, "since": r(self.since), "slowdown": r(self.slowdown),
                "measured_at": r(self.measured_at), "closes_share": r(self.closes_share),
                "included": r(self.included), "counted": r(self.counted), "basis": self.basis,
                "pending": self.pending.value if self.pending else None}


@dataclass(slots=True)
class _Track:
    """Detector state of one member."""

    joined: float  # intervals before this say nothing about it (readmitted, reset)
    state: Health = Health.HEALTHY
    since: float = 0.0
    candidate: Health | None = None
    candidate_since: float = 0.0
    slowdown: float | None = None
    measured_at: float | None = None
    closes_share: float | None = None
    included: float | None = None
    counted: float | None = None
    steady: float | None = None  # share of the pace window's intervals it was behind in
    basis: str = "none"

    def health(self, worker: int) -> WorkerHealth:
        return WorkerHealth(worker, self.state, self.since, self.slowdown, self.measured_at,
                            self.closes_share, self.included, self.basis, self.candidate,
                            self.counted)


@dataclass(slots=True)
class _Evidence:
    state: Health | None  # None: nothing new, hold
    basis: str


# ------------------------------------------------------------------ detector
@dataclass(slots=True)
class Detector:
    """Classifies every active member healthy / slow / gone, interval by interval."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    _history: deque[Interval] = field(default_factory=deque)
    _tracks: dict[int, _Track] = field(default_factory=dict)

    @property
    def health(self) -> dict[int, WorkerHealth]:
        return {w: t.health(w) for w, t in sorted(self._tracks.items())}

    def reset(self, worker: int, time: float) -> None:
        """Forget what is known of `worker` (readmitted: its past says nothing now)."""
        self._tracks[worker] = _Track(joined=time, since=time)

    def update(self, interval: Interval) -> dict[int, WorkerHealth]:
        self._remember(interval)
        for w in list(self._tracks):
            if w not in interval.active:
                del self._tracks[w]  # excluded: the policy watches its heartbeat instead
        for w in sorted(interval.active):
            track = self._tracks.get(w)
            if track is None:
                track = self._tracks[w] = _Track(joined=interval.start, since=interval.start)
            self._classify(w, track, interval)
        return self.health

    def _remember(self, interval: Interval) -> None:
        self._history.append(interval)
        c = self.config
        crowd = c.crowd_window_s * max(1.0, len(interval.active) / 4)
        keep = max(c.window_s, c.closes_window_s, crowd, c.gone_after_s)
        while self._history and self._history[0].end <= interval.end - keep - 1e-9:
            self._history.popleft()

    def _recent(self, seconds: float, worker: int, joined: float) -> list[Interval]:
        end = self._history[-1].end
        return [iv for iv in self._history
                if iv.start >= end - seconds - 1e-9 and iv.start >= joined - 1e-9
                and worker in iv.active]

    def _classify(self, w: int, track: _Track, interval: Interval) -> None:
        evidence = self._evidence(w, track, interval)
        now = interval.end
        raw = evidence.state if evidence.state is not None else track.state
        if raw == track.state:
            track.candidate = None
            if evidence.state is not None:
                track.basis = evidence.basis
            return
        if track.candidate != raw:
            track.candidate, track.candidate_since = raw, now
        dwell = 0.0 if raw == Health.GONE else self.config.dwell_s
        if now - track.candidate_since >= dwell - 1e-9:
            track.state, track.since, track.candidate = raw, now, None
            track.basis = evidence.basis

    def _evidence(self, w: int, track: _Track, interval: Interval) -> _Evidence:
        if self._silent(w, track):
            return _Evidence(Health.GONE, "silence")
        if track.state == Health.GONE:  # back once it sends again; the signals then decide
            return _Evidence(Health.HEALTHY if interval.delta(w).activity else None, "none")
        if not interval.stable:
            return _Evidence(None, "none")
        slow = track.state == Health.SLOW
        if interval.mode in RATE_MODES:
            slowdown = self._pace(w, track)
            if slowdown is not None:
                # Slow by closes means "the slowest", not "slow by so much": its first
                # pace measurement has to clear the entry threshold.
                measured_slow = slow and track.basis == "pace"
                if measured_slow:
                    behind = slowdown >= self.config.slow_exit
                else:
                    behind = (slowdown >= self.config.slow_enter and track.steady is not None
                              and track.steady >= self.config.steady_share - 1e-9)
                return _Evidence(Health.SLOW if behind else Health.HEALTHY, "pace")
        elif interval.mode == Mode.SYNC:
            state = self._closes(w, track, slow)
            if state is not None:
                return _Evidence(state, "closes")
        return _Evidence(None, "none")

    def _silent(self, w: int, track: _Track) -> bool:
        gone_after = self.config.gone_after_s
        window = self._recent(gone_after, w, track.joined)
        if not window or window[-1].end - window[0].start < gone_after - 1e-9:
            return False
        mine = sum(iv.delta(w).activity for iv in window)
        others = sum(iv.delta(v).activity for iv in window for v in iv.active if v != w)
        return mine == 0 and others > 0

    def _pace(self, w: int, track: _Track) -> float | None:
        """Update and return the slowdown from the pace window (None: not enough data)."""
        window = [iv for iv in self._recent(self.config.window_s, w, track.joined)
                  if iv.stable and iv.mode in RATE_MODES]
        if sum(iv.duration for iv in window) < self.config.min_evidence_s - 1e-9:
            return None
        paces = _paces(window)
        accepted = _sums(window, lambda d: d.contributions)
        top = max(paces.values(), default=0)
        if top < self.config.min_packets:
            return None
        reference = fast_pace(paces)
        # A worker with no accepted or late contribution at all is at least `reference`
        # times slower: count it as one packet so the estimate stays finite (a bound).
        track.slowdown = max(reference / max(paces.get(w, 0), 1), 1.0)
        track.measured_at = window[-1].end
        top_accepted = max(accepted.values(), default=0)
        track.included = accepted.get(w, 0) / top_accepted if top_accepted else 0.0
        sent = sum(iv.delta(w).contributions + iv.delta(w).late + iv.delta(w).stale
                   for iv in window if w in iv.active)
        track.counted = accepted.get(w, 0) / sent if sent else None
        track.closes_share = None
        track.steady = self._behind_share(window, w)
        return track.slowdown

    def _behind_share(self, window: list[Interval], w: int) -> float:
        """The share of the window's intervals (those with traffic) in which `w` was
        behind that interval's fast members by at least `slow_exit`."""
        behind = counted = 0
        for iv in window:
            paces = {v: iv.pace(v) for v in iv.active}
            reference = fast_pace(paces)
            if reference <= 0:
                continue
            counted += 1
            behind += reference / max(paces.get(w, 0), 1) >= self.config.slow_exit - 1e-9
        return behind / counted if counted else 0.0

    def _closes(self, w: int, track: _Track, slow: bool) -> Health | None:
        """Sync: slow if `w` closes most rounds (one straggler), or if some member almost
        never closes while `w` closes at least its fair share (a crowd of stragglers
        shares the closes, and the members faster than all of them close none)."""
        c = self.config
        window = self._sync_window(c.closes_window_s, w, track)
        if sum(iv.duration for iv in window) < c.min_evidence_s - 1e-9:
            return None
        closes = _sums(window, lambda d: d.closes)
        total = sum(closes.values())
        n = len(window[-1].active)
        if total < c.min_closes or n < 2:
            return None
        share = track.closes_share = closes.get(w, 0) / total
        if share >= c.closes_threshold(n, leaving=slow):
            return Health.SLOW
        return Health.SLOW if self._in_crowd(w, track, slow) else Health.HEALTHY

    def _in_crowd(self, w: int, track: _Track, slow: bool) -> bool:
        """Judged over a full `crowd_window_s`: in a homogeneous job one member can close
        few rounds for a few seconds by chance (its speed drifts), not for long."""
        # A member escapes closing for a while by chance more easily among many: the
        # chance of closing none of k intervals falls as exp(-k/n).
        seconds = self.config.crowd_window_s * max(1.0, len(self._history[-1].active) / 4)
        window = self._sync_window(seconds, w, track)
        if not window or window[-1].end - window[0].start < seconds - 1e-6:
            return False
        closes = _sums(window, lambda d: d.closes)
        total = sum(closes.values())
        members = window[-1].active
        if total < 8 * len(members):  # a fair share is not ~0 by chance
            return False
        fair = 1 / len(members)
        low = self.config.closes_low * fair
        fewest = min(closes.get(v, 0) for v in members) / total
        share = closes.get(w, 0) / total
        if slow:
            return fewest < 2 * low and share >= fair / 2
        return fewest < low and share >= fair

    def _sync_window(self, seconds: float, w: int, track: _Track) -> list[Interval]:
        return [iv for iv in self._recent(seconds, w, track.joined)
                if iv.stable and iv.mode == Mode.SYNC]


def fast_pace(paces: Mapping[int, float]) -> float:
    """The mean pace of the fast cluster (within 20% of the fastest): not the fastest
    alone, because the maximum of several noisy paces is biased upwards."""
    top = max(paces.values(), default=0)
    fast = [p for p in paces.values() if p >= 0.8 * top]
    return sum(fast) / len(fast) if fast else 0.0


def fast_rate(window: Iterable[Interval]) -> tuple[float, float]:
    """(the fast cluster's pace per second, the seconds it spans) over `window`."""
    window = list(window)
    seconds = sum(iv.duration for iv in window)
    return fast_pace(_paces(window)) / max(seconds, 1e-9), seconds


def _sums(window: Iterable[Interval], key: Callable[[Delta], int]) -> dict[int, int]:
    """Per member, `key` of its deltas summed over the window."""
    out: dict[int, int] = {}
    for iv in window:
        for v in iv.active:
            out[v] = out.get(v, 0) + key(iv.delta(v))
    return out


def _paces(window: Iterable[Interval]) -> dict[int, float]:
    """Per member, its pace (`Interval.pace`) summed over the window."""
    out: dict[int, float] = {}
    for iv in window:
        for v in iv.active:
            out[v] = out.get(v, 0.0) + iv.pace(v)
    return out

"""The adaptive straggler policy: which sync mode a job runs in, and who is in it.

`AdaptivePolicy.observe(interval)` is a pure function of the counter intervals it has
been given (`detect.Interval`) and of its own state: it can be tested on recorded or
synthetic traces without a switch. `runner.PolicyRunner` feeds it from a switch
and applies its decisions through the `Controller`.

**Modes, by a cost model.** Each member has a slowdown `s` (1 for the healthy ones,
the detector's measurement for the slow ones). In units of "one healthy worker's
contributions per round time", a configuration is worth

| configuration | value |
|---|---|
| `sync` | `n / max(s)`: every round waits for the slowest |
| `partial(q)` | `q / s_(q)` (the q fastest set the pace) + `(f+(1-f)rho)/s - kappa` per one out |
| `async` | `e_async * sum(1 / s)`: nobody waits, every contribution is stale |

`rho` (`stale_value`) is what a late contribution is worth (it reaches the model one
or more rounds late, as a residual), `f` the share of a left-out member's contributions
that rounds still count fresh (0 unless measured in the partial(q) in force: the
detector's `counted`; a slow rack's leaf at the spine, whose sums race the other racks'
for each round, had 54% as many sums counted as the fast leaf at 1.54x in the two-level
bench, where a straggler at one switch is in few rounds), `kappa` (`straggler_cost`) what
a member left out of the rounds costs the job (its replica must be resynchronized, its
residuals pile up), `e_async` (`async_efficiency`) the discount of staleness everywhere. The policy
runs `sync` while nobody is slow, and otherwise the best of `sync`, `partial(q)` with
q = the non-slow members (q >= `min_quorum_fraction` of n, >= 1) and `async`, switching
only for a gain of `switch_margin`, and only once the mode has held `min_dwell_s` and
the detector has settled on it. With the defaults and n = 4, partial(3) beats sync from
a ~1.3x straggler on, and async wins when more than half the members are slow or the
slowdowns spread widely.

A straggler found in `sync` (it closes the rounds) has no measured slowdown: the policy
*probes*, switching to async for a few intervals, where every member contributes at its
own pace, and trusts a measurement for `probe_ttl_s` (a 1.2x closer is not probed again
at every interval). A partial probe would be gentler but biased: a straggler inside the
quorum sets everyone's pace and hides (a second straggler, or a crowd of them, which
sync shows as members that never close a round). Without async (`allow_async=False`)
the probe is partial with the smallest allowed quorum; and whenever partial(q) has more
slow members than it leaves out, the policy measures again in async.

**Exploration.** The closes show a straggler only when it arrives last at most rounds.
A step of many rounds (a model of more chunks than the job has slots: the CNN's 1,847
packets on a 256-slot window are ~7 rounds a slot a step) waits for the straggler in its
first round only; the later rounds are paced by the network, their closes fall to whoever
answers last, and the straggler's share stays near the others' (35% against 20-30% on
the CNN, docs/performance.md; on a 2,048-slot window it closes ~90%). So sync is never
taken as proof that nobody is slow: after `explore_after_s` of sync with traffic and no
measurement, the policy probes as above with nobody flagged. The gap doubles after each
exploration (up to `explore_max_s`). The first probe calibrates the job at its start; a
homogeneous job spends about probe_s / explore_max_s of its time in probes once the gap
has grown.

**Measured, not modelled, gain.** The cost model assumes a member's slowdown is the same
in every mode. It is not when the workers share the CPU (faster members then compete for
it) or when a step is many rounds (in partial, a straggler a few chunks behind opens
rounds of its own chunks, which the others must fill: on the CNN a slot closed about two
rounds a step instead of one, docs/performance.md). So a mode the cost model chose must
show it: once it has held `min_dwell_s`, the fast members' pace (contributions and late
ones per second, the mean of those within 20% of the fastest) must beat their pace in
the last sync window by `switch_margin`. If not, the job goes back to sync, and the cost
model may leave sync again only after the next exploration (the gap doubles).

**Exclusion** (Dynamic Partial All-Reduce). A member left out of partial rounds
contributes `rho / s` and costs `kappa`: once `rho / s < kappa`, i.e. its slowdown is at
least `rho / kappa` (3.0 by default), its compute is worth less than it costs. It is
excluded when that has held for `exclude_after_s` in partial while it was in fewer
than `exclude_max_included` of the rounds. (In async nobody waits and every
contribution counts: nobody is excluded for being slow.) A *gone* member is excluded at
once (a sync job would stall on it).

**Readmission.** An excluded member's packets are dropped as NOT_MEMBER, so its
recovery is invisible in the per-worker counters. The per-job NOT_MEMBER drop rate is
used as a *heartbeat* only (a worker that gets no answer retransmits on its timer, so
the rate says it is alive, not how fast it computes): after a back-off
(`readmit_after_s`, doubled after each failed probation, capped at `max_excluded_s`)
a live member is readmitted *on probation*: the job goes partial without it in the
quorum, its pace is measured for `probation_s`, and it stays if it is no longer a
persistent straggler or is excluded again. A member with no heartbeat (gone) is never
readmitted; one excluded as gone is readmitted only when it is the only excluded
member, so that another member's heartbeat cannot be taken for its own.

**A bounded number of mode changes.** A busy machine makes every measurement noisy,
and noise that crosses a threshold now and then would flip the job between modes.
Besides the hysteresis of the detector and `min_dwell_s` between mode changes, the job's
mode changes at most `mode_changes_per_min` times in any minute (4 by default; a minute
of the clock, whatever `PolicyConfig.scaled` does to the policy's own durations: it is
the rate an operator sees): a probe, an exploration, a cost-model choice or a return to
sync wanted while the budget is spent waits until the minute has room, and leaving sync
needs room for the way back too (a probe is never stranded). What the job needs is never
held back, and counts all the same: the mode that keeps a member on probation out of the
quorum, the starvation guard's refresh (at most one per `max_starved_s`), and the
decisions that end a probation's mode or a refresh. Membership decisions have their own bounds (an
exclusion for slowness needs `exclude_after_s` of evidence, readmissions back off), and
a gone member is excluded at once.

**Starvation guard** (P-Reduce's concern that every member keeps being included):
an excluded live member is probed within `max_excluded_s`; in partial, a member that
has been in no round's sum for `max_starved_s` gets a sync refresh of `refresh_s` (every
round waits for it once), after which the policy decides again.

(This file is over 500 lines for a reason: the policy is one state machine whose rules
read best side by side. What runs it against a switch is runner.py.)
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace

from hysync.controlplane.policy.detect import (
    RATE_MODES,
    Detector,
    DetectorConfig,
    Health,
    Interval,
    JobView,
    WorkerHealth,
    fast_rate,
)
from hysync.controlplane.tables import sync_mode
from hysync.wire import Mode

log = logging.getLogger(__name__)

POLICIES = ("adaptive",)
SET_MODE, EXCLUDE, READMIT = "set_mode", "exclude", "readmit"
# How a probe's reason starts: a flagged member to measure, or an exploration of sync.
PROBE, EXPLORE = "probe", "explore"
MINUTE_S = 60.0  # the window of the mode-change budget (PolicyConfig.mode_changes_per_min)


# ------------------------------------------------------------------ configuration
@dataclass(frozen=True, slots=True)
class PolicyConfig:
    min_quorum_fraction: float = 0.5  # partial(q) needs q >= this fraction of n (and >= 1)
    allow_async: bool = True
    stale_value: float = 0.6  # rho: a late contribution's worth, in fresh ones
    straggler_cost: float = 0.2  # kappa: cost of a member left out of the rounds
    async_efficiency: float = 0.7
    switch_margin: float = 0.05  # a mode change must gain this fraction
    min_dwell_s: float = 2.0  # between mode changes the policy chooses
    probe_s: float = 3.0  # a probe lasts at least this long (a full pace window)
    probe_ttl_s: float = 20.0  # a closer's measured slowdown is trusted this long
    explore_after_s: float = 2.0  # busy sync without a measurement: probe (inf: never)
    explore_max_s: float = 120.0  # the gap doubles up to this while probes find nobody
    exclude_slowdown: float | None = None  # default rho / kappa
    exclude_after_s: float = 5.0
    exclude_max_included: float = 0.5  # in fewer than this share of the rounds
    readmit_after_s: float = 10.0  # first probation after an exclusion
    max_excluded_s: float = 30.0  # starvation guard: back-off cap
    probation_s: float = 3.0
    heartbeat_window_s: float = 2.0
    heartbeat_min_rate: float = 0.5  # NOT_MEMBER packets per second
    max_starved_s: float = 20.0  # partial: in no sum this long -> sync refresh
    refresh_s: float = 1.0
    min_members: int = 1  # never exclude below this many active members
    mode_changes_per_min: int = 4  # in any minute of the clock (the probation mode aside)
    detector: DetectorConfig = field(default_factory=DetectorConfig)

    def __post_init__(self) -> None:
        if not 0 < self.min_quorum_fraction <= 1:
            raise ValueError(f"min_quorum_fraction must be in (0, 1], got "
                             f"{self.min_quorum_fraction}")
        if not (self.stale_value > 0 and self.straggler_cost > 0):
            raise ValueError("stale_value and straggler_cost must be > 0")
        for name in ("probation_s", "refresh_s", "max_excluded_s", "heartbeat_window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.readmit_after_s > self.max_excluded_s:
            raise ValueError(f"readmit_after_s ({self.readmit_after_s}) must not exceed "
                             f"max_excluded_s ({self.max_excluded_s})")
        if self.mode_changes_per_min < 2:
            raise ValueError(f"mode_changes_per_min must be >= 2 (a probe and the return "
                             f"from it), got {self.mode_changes_per_min}")
        if self.min_members < 1:
            raise ValueError(f"min_members must be >= 1, got {self.min_members}")
        if not (0 < self.explore_after_s <= self.explore_max_s
                or self.explore_after_s == math.inf):
            raise ValueError(f"exploration needs 0 < explore_after_s <= explore_max_s (or "
                             f"explore_after_s = inf: never), got {self.explore_after_s} and "
                             f"{self.explore_max_s}")

    def scaled(self, factor: float) -> PolicyConfig:
        """The same policy on a faster (factor < 1) or slower clock: every duration,
        the detector's too, times `factor`; thresholds and counts unchanged (the mode
        changes a minute too: a rate of the wall clock)."""
        if not factor > 0:
            raise ValueError(f"time scale factor must be > 0, got {factor}")
        detector = replace(self.detector, **_scaled_durations(self.detector, factor))
        return replace(self, detector=detector, **_scaled_durations(self, factor))

    @property
    def exclusion_slowdown(self) -> float:
        """The slowdown above which a left-out member is worth less than it costs."""
        if self.exclude_slowdown is not None:
            return self.exclude_slowdown
        return self.stale_value / self.straggler_cost

    def quorum_floor(self, n: int) -> int:
        return max(1, math.ceil(self.min_quorum_fraction * n - 1e-9))


def _scaled_durations(config: PolicyConfig | DetectorConfig, factor: float) -> dict[str, float]:
    return {f.name: getattr(config, f.name) * factor for f in fields(config)
            if f.name.endswith("_s")}


# ------------------------------------------------------------------ cost model
def value(mode: Mode, quorum: int, slowdowns: list[float], config: PolicyConfig, *,
          counted: list[float | None] | None = None) -> float:
    """What a configuration is worth, in healthy-worker contributions per round time.
    `counted`, beside `slowdowns`: the share of each member's contributions the rounds of
    this partial(q) counted (measured in it; None: unknown, taken as none)."""
    pairs = sorted(zip(slowdowns, counted or [None] * len(slowdowns), strict=True),
                   key=lambda p: p[0])
    s = [x for x, _ in pairs]
    n = len(s)
    if n == 0:
        return 0.0
    if mode == Mode.SYNC or (mode == Mode.PARTIAL and quorum >= n):
        return n / s[-1]
    if mode == Mode.PARTIAL:
        rho = config.stale_value
        left_out = sum((f + (1 - f) * rho) / x - config.straggler_cost
                       for x, f in ((x, min(max(f or 0.0, 0.0), 1.0)) for x, f in pairs[quorum:]))
        return quorum / s[quorum - 1] + left_out
    return config.async_efficiency * sum(1 / x for x in s)


def candidates(n: int, slow: int, config: PolicyConfig) -> list[tuple[Mode, int]]:
    """sync, partial(the non-slow members) if the quorum is allowed, async."""
    out: list[tuple[Mode, int]] = [(Mode.SYNC, 0)]
    q = n - slow
    if config.quorum_floor(n) <= q < n:
        out.append((Mode.PARTIAL, q))
    if config.allow_async and n > 1:
        out.append((Mode.ASYNC, 0))
    return out


def mode_text(mode: Mode | None, quorum: int) -> str:
    return "mixed" if mode is None else sync_mode.format_mode(mode, quorum)


# ------------------------------------------------------------------ decisions
@dataclass(frozen=True, slots=True)
class Decision:
    """One action of the policy. `mode`/`quorum` are the job's mode after it."""

    time: float  # end of the interval the decision was taken on (time.monotonic())
    action: str  # set_mode | exclude | readmit
    mode: str  # sync | partial | async
    quorum: int
    worker: int | None
    reason: str
    inputs: Mapping[str, object] = field(default_factory=dict)

    def describe(self) -> str:
        what = (f"mode {self.mode if self.mode != 'partial' else f'partial({self.quorum})'}"
                if self.action == SET_MODE else f"{self.action} worker {self.worker}")
        return f"{what}: {self.reason}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: Mapping[str, object]) -> Decision:
        """A decision back from its to_dict() (a decision-log record: extra keys ignored)."""
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


@dataclass(slots=True)
class _Exclusion:
    at: float
    reason: str  # slow | gone
    backoff: float


# ------------------------------------------------------------------ the policy
class AdaptivePolicy:
    """sync / partial(q) / async, exclusion and readmission, from the job's counters."""

    name = "adaptive"

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self.detector = Detector(self.config.detector)
        self.decisions: list[Decision] = []
        self.health: dict[int, WorkerHealth] = {}
        # The job as the policy means it to be (its decisions applied).
        self.mode: Mode | None = Mode.SYNC
        self.quorum = 0
        self.active: set[int] = set()
        self._started = False
        self._mode_since = -math.inf
        self._excluded: dict[int, _Exclusion] = {}  # by this policy; others are left alone
        self._backoff: dict[int, float] = {}
        self._probation: dict[int, float] = {}
        self._heavy_since: dict[int, float] = {}
        self._included_at: dict[int, float] = {}
        self._refresh_until: float | None = None
        self._probe_until = -math.inf
        self._busy_sync_s = 0.0  # sync with traffic since the last pace measurement
        self._explore_gap = self.config.explore_after_s
        self._unproven = False  # the mode in force was chosen by the cost model, not checked
        self._refuted = False  # the cost model's last choice was no faster: sync stays
        self._recent: deque[Interval] = deque()  # stable intervals, probe_ttl_s of them
        self._heard: deque[tuple[float, float, int]] = deque()  # (start, end, NOT_MEMBER)
        self._activity: dict[int, float] = {}  # last time a member sent anything
        self._admitted: frozenset[int] = frozenset()  # active on the switch, last interval
        self._noted: set[tuple[str, int]] = set()
        self._changed: deque[float] = deque()  # when each mode change of the window was made
        # The job is in a mode taken for a member's sake (probation, a starvation refresh)
        # that has ended: the decision that leaves it is not held back by the budget.
        self._way_back = False

    # ---------------------------------------------------------- state
    @property
    def on_probation(self) -> frozenset[int]:
        """Readmitted members still on probation (metrics and `hysync top` show them)."""
        return frozenset(self._probation)

    def start(self, view: JobView, time: float) -> None:
        """Adopt the job's current mode and membership."""
        self._started = True
        self.resync(view, time)

    def resync(self, view: JobView, time: float) -> None:
        """The job is not as the policy meant it (a failed write, a manual change): take
        it as it is. Members readmitted by someone else are no longer ours to manage."""
        if (view.mode, view.quorum) != (self.mode, self.quorum):
            self._mode_since = time
        self.mode, self.quorum = view.mode, view.quorum
        self.active = set(view.active)
        for w in [w for w in self._excluded if w in view.active]:
            del self._excluded[w]
        for w in [w for w in self._probation if w not in view.active]:
            del self._probation[w]

    # ---------------------------------------------------------- one interval
    def observe(self, interval: Interval) -> list[Decision]:
        if not self._started:
            self.start(JobView(interval.mode or Mode.SYNC, interval.quorum, interval.active),
                       interval.start)
        t = interval.end
        self.health = self.detector.update(interval)
        self._record(interval)
        out: list[Decision] = []
        self._membership(t, out)
        self._choose_mode(t, out)
        self.decisions += out
        return out

    def _record(self, interval: Interval) -> None:
        self._admitted = interval.active
        if interval.stable:
            self._recent.append(interval)
        while self._recent and self._recent[0].end < interval.end - self.config.probe_ttl_s:
            self._recent.popleft()
        if interval.stable and interval.mode in RATE_MODES:
            self._busy_sync_s = 0.0  # every member's pace is measured in these modes
        elif interval.stable and interval.mode == Mode.SYNC and max(
                (d.contributions for d in interval.workers.values()), default=0
        ) >= self.config.detector.min_packets:
            self._busy_sync_s += interval.duration
        self._heard.append((interval.start, interval.end, interval.not_member))
        while self._heard and self._heard[0][1] < interval.end - self.config.heartbeat_window_s:
            self._heard.popleft()
        for w in interval.active:
            d = interval.delta(w)
            self._included_at.setdefault(w, interval.start)
            if d.contributions:
                self._included_at[w] = interval.end
            if d.activity:
                self._activity[w] = interval.end

    def heartbeat(self) -> float:
        """NOT_MEMBER drops per second over the heartbeat window."""
        if not self._heard:
            return 0.0
        span = self._heard[-1][1] - self._heard[0][0]
        return sum(n for _, _, n in self._heard) / max(span, 1e-9)

    def _alive(self, worker: int, t: float) -> bool:
        if worker in self._admitted:  # a dry run: it was never excluded, it still counts
            return t - self._activity.get(worker, -math.inf) <= self.config.heartbeat_window_s
        return self.heartbeat() >= self.config.heartbeat_min_rate

    # ---------------------------------------------------------- membership
    def _membership(self, t: float, out: list[Decision]) -> None:
        self._exclude_gone(t, out)
        self._end_probations(t, out)
        self._exclude_persistent(t, out)
        self._readmit(t, out)

    def _can_exclude(self) -> bool:
        return len(self.active) - 1 >= self.config.min_members

    def _exclude_gone(self, t: float, out: list[Decision]) -> None:
        for w in sorted(self.active):
            h = self.health.get(w)
            if h is None or h.state != Health.GONE or not self._can_exclude():
                continue
            silent = self.config.detector.gone_after_s
            self._exclude(t, out, w, "gone", f"gone: no packet for {silent:g} s while the "
                          "others sent (a sync job would stall on it)")

    def _end_probations(self, t: float, out: list[Decision]) -> None:
        x = self.config.exclusion_slowdown
        for w, since in sorted(self._probation.items()):
            h = self.health.get(w)
            if t - since < self.config.probation_s - 1e-9:
                continue
            measured = h is not None and h.measured_at is not None and h.measured_at > since
            if (measured and h is not None and h.slowdown is not None and h.slowdown >= x
                    and self._can_exclude()):
                self._exclude(t, out, w, "slow", f"probation failed: {h.slowdown:.1f}x "
                              f"(>= {x:.1f}x) after {t - since:.1f} s")
            elif measured or t - since >= 3 * self.config.probation_s:
                del self._probation[w]  # passed, or nothing measurable: a member again
                self._way_back = True
                self._backoff.pop(w, None)
                self._heavy_since.pop(w, None)
                log.info("worker %d passed probation (%s)", w,
                         h.describe() if h else "not measured")

    def _exclude_persistent(self, t: float, out: list[Decision]) -> None:
        c = self.config
        x = c.exclusion_slowdown
        for w in sorted(self.active - set(self._probation)):
            h = self.health.get(w)
            if h is None:
                continue
            # Once it qualifies, 10% less keeps it qualified: noise must not restart the clock.
            bar = 0.9 * x if w in self._heavy_since else x
            heavy = (h.state == Health.SLOW and h.fresh(t) and self.mode == Mode.PARTIAL
                     and h.slowdown is not None and h.slowdown >= bar
                     and h.included is not None and h.included < c.exclude_max_included)
            if not heavy:
                if h.state != Health.SLOW or h.fresh(t):
                    self._heavy_since.pop(w, None)
                continue
            since = self._heavy_since.setdefault(w, t)
            if t - since >= c.exclude_after_s - 1e-9 and self._can_exclude():
                assert h.slowdown is not None and h.included is not None
                self._exclude(t, out, w, "slow", (
                    f"persistent straggler: {h.slowdown:.1f}x for {t - since:.1f} s, in "
                    f"{h.included:.0%} of the rounds; its late compute is worth "
                    f"{c.stale_value / h.slowdown:.2f} of a worker, less than the "
                    f"{c.straggler_cost:.2f} it costs"))
                return  # one at a time: the others' measurements change without it

    def _exclude(self, t: float, out: list[Decision], w: int, why: str, reason: str) -> None:
        backoff = self.config.readmit_after_s
        if w in self._probation:
            del self._probation[w]
            backoff = min(2 * self._backoff.get(w, backoff), self.config.max_excluded_s)
        self._backoff[w] = backoff
        self._excluded[w] = _Exclusion(t, why, backoff)
        self._heavy_since.pop(w, None)
        self.active.discard(w)
        self._emit(out, t, EXCLUDE, w, reason)

    def _readmit(self, t: float, out: list[Decision]) -> None:
        if self._probation or not self._excluded:
            return
        order = sorted(self._excluded.items(), key=lambda kv: (kv[1].reason != "slow", kv[1].at))
        for w, ex in order:
            waited = t - ex.at
            if waited < ex.backoff - 1e-9:
                continue
            if ex.reason == "gone" and len(self._excluded) > 1:
                continue  # the heartbeat could be another excluded member's
            if not self._alive(w, t):
                if waited >= self.config.max_excluded_s and ("no heartbeat", w) not in self._noted:
                    self._noted.add(("no heartbeat", w))
                    log.info("worker %d excluded %.0f s, no heartbeat (NOT_MEMBER %.1f/s): "
                             "not readmitted", w, waited, self.heartbeat())
                continue
            self._noted.discard(("no heartbeat", w))
            if self.mode == Mode.SYNC or (self.mode == Mode.PARTIAL
                                          and self.quorum > len(self.active)):
                self._set_mode(t, out, Mode.PARTIAL, max(1, len(self.active)),
                               f"probation of worker {w}: rounds must not wait for it")
            guard = " (starvation guard)" if ex.backoff >= self.config.max_excluded_s else ""
            del self._excluded[w]
            self._probation[w] = t
            self._included_at[w] = t
            self.active.add(w)
            self.detector.reset(w, t)
            self._emit(out, t, READMIT, w, (
                f"on probation after {waited:.1f} s excluded{guard}; heartbeat "
                f"NOT_MEMBER {self.heartbeat():.1f}/s"))
            return

    # ---------------------------------------------------------- mode
    def _choose_mode(self, t: float, out: list[Decision]) -> None:
        n = len(self.active)
        if n == 0:
            return
        if self._probation:
            self._probation_mode(t, out, n)
            return
        if self._refresh_until is not None:
            if t < self._refresh_until - 1e-9:
                return
            self._refresh_until = None
            self._mode_since = -math.inf  # the refresh was planned: decide afresh now
            self._way_back = True
        estimates, unknown = self._estimates(t)
        slow = [w for w, s in estimates.items() if s > 1.0] + unknown
        valid = self.mode is not None and not (
            self.mode == Mode.PARTIAL and not 1 <= self.quorum < n)
        settled = not valid or self._dwelt(t)
        # The mode-change budget: leaving sync keeps room for the way back. The way back
        # from a mode taken for a member's sake, and a job found in no valid mode, are not
        # held back.
        room = self._way_back or self._budget(t, 2 if self.mode == Mode.SYNC else 1)
        dwelt = not valid or (settled and room)
        if unknown:
            if self.mode == Mode.SYNC and dwelt:
                self._probe(t, out, n, slow,
                            ", ".join(self.health[w].describe() for w in unknown), kind=PROBE)
            return
        if self._starving(t, out, settled):
            return
        if self._no_faster(t, out, dwelt):
            return
        if (self.mode == Mode.SYNC and (not slow or self._refuted) and dwelt
                and self._can_probe(n) and self._busy_sync_s >= self._explore_gap - 1e-9):
            why = (f"{self._busy_sync_s:.1f} s of sync since the cost model's last choice "
                   "measured no faster" if self._refuted else
                   f"{self._busy_sync_s:.1f} s of sync with nobody measured slow (sync hides "
                   "a straggler when a step is many rounds)")
            self._refuted = False
            # Double the sync time that passed (more than the gap when the mode-change
            # budget held the exploration back), so that the gaps keep growing.
            self._explore_gap = min(2 * max(self._explore_gap, self._busy_sync_s),
                                    self.config.explore_max_s)
            self._probe(t, out, n, slow, why, kind=EXPLORE)
            return
        if (self.mode == Mode.PARTIAL and len(slow) > n - self.quorum and dwelt
                and self.config.allow_async):
            # Some straggler is inside the quorum: everyone waits for it, so the paces
            # (and every slowdown measured against them) are too low. Measure in async.
            who = ", ".join(self.health[w].describe() for w in sorted(slow))
            self._probe_until = t + self.config.probe_s
            self._set_mode(t, out, Mode.ASYNC, 0, (
                f"probe: {who}: {len(slow)} slow, partial({self.quorum}) leaves out "
                f"{n - self.quorum}; async to measure"))
            return
        options = candidates(n, len(slow), self.config)
        if self._refuted:  # until the next exploration
            options = [(m, q) for m, q in options if (m, q) == (Mode.SYNC, 0)
                       or (m, q) == (self.mode, self.quorum)]
        # The partial(q) in force is valued with the share of each member's contributions
        # its rounds counted; any other by the model alone.
        counted = [h.counted if (h := self.health.get(w)) is not None and h.fresh(t) else None
                   for w in estimates]
        in_force = (self.mode, self.quorum) if self.mode == Mode.PARTIAL else None

        def worth(m: Mode, q: int) -> float:
            return value(m, q, list(estimates.values()), self.config,
                         counted=counted if (m, q) == in_force else None)

        values = {(m, q): worth(m, q) for m, q in options}
        best = max(values, key=lambda k: values[k])
        sync = (Mode.SYNC, 0)
        if not slow or values[best] < values[sync] * (1 + self.config.switch_margin):
            best = sync  # the default: leaving it has to pay the margin
        if valid and best == (self.mode, self.quorum):
            self._way_back = False
            return
        current = (worth(self.mode, self.quorum) if valid and self.mode is not None else 0.0)
        if valid and slow and values[best] < current * (1 + self.config.switch_margin):
            return
        if not dwelt:
            return
        table = ", ".join(f"{mode_text(m, q)} {v:.2f}" for (m, q), v in values.items())
        if not slow:
            reason = "no straggler: every member healthy"
        else:
            who = ", ".join(self.health[w].describe() for w in sorted(slow))
            reason = f"{who}; cost model: {table}"
        self._set_mode(t, out, *best, reason, values={mode_text(m, q): round(v, 3)
                                                      for (m, q), v in values.items()})
        self._unproven = best != (Mode.SYNC, 0)

    def _no_faster(self, t: float, out: list[Decision], dwelt: bool) -> bool:
        """Back to sync when the mode the cost model chose has not made the fast members
        faster than they were in sync (see the module doc)."""
        if not (self._unproven and dwelt) or self._probation or self.mode in (None, Mode.SYNC):
            return False
        c = self.config
        window = c.detector.window_s
        now, seconds = fast_rate(iv for iv in self._recent if iv.end > t - window + 1e-9
                                 and iv.start >= self._mode_since - 1e-9
                                 and (iv.mode, iv.quorum) == (self.mode, self.quorum))
        synced = [iv for iv in self._recent if iv.mode == Mode.SYNC]
        if seconds < c.detector.min_evidence_s - 1e-9:
            return False
        self._unproven = False
        if not synced:
            return False  # nothing to compare with: the cost model stands
        last = synced[-1].end
        before, _ = fast_rate(iv for iv in synced if iv.end > last - window + 1e-9)
        if now >= before * (1 + c.switch_margin):
            return False
        self._refuted = True
        self._set_mode(t, out, Mode.SYNC, 0, (
            f"{mode_text(self.mode, self.quorum)} measured no faster than sync: the fast "
            f"members' pace {now:.0f}/s against {before:.0f}/s in sync; sync until the next "
            "exploration"))
        return True

    def _dwelt(self, t: float) -> bool:
        """The mode has been in force for min_dwell_s, and the detector has settled on it
        (no member's state is about to change; bounded by 3 x min_dwell_s): a decision
        taken on half-measured slowdowns would hide a second straggler in the quorum."""
        held = t - self._mode_since
        if held < self.config.min_dwell_s - 1e-9 or t < self._probe_until - 1e-9:
            return False
        settled = not any(self.health[w].pending for w in self.active if w in self.health)
        return settled or held >= 3 * self.config.min_dwell_s - 1e-9

    def _estimates(self, t: float) -> tuple[dict[int, float], list[int]]:
        """Slowdown of every active member (1.0 when healthy), and the slow members
        whose slowdown is unknown or too old to trust (to be probed)."""
        estimates: dict[int, float] = {}
        unknown: list[int] = []
        for w in sorted(self.active):
            h = self.health.get(w)
            if h is None or h.state == Health.HEALTHY:
                estimates[w] = 1.0
            elif h.state == Health.GONE:
                estimates[w] = math.inf  # not excludable (min_members): as slow as can be
            elif h.slowdown is not None and h.measured_at is not None and (
                    h.fresh(t) or t - h.measured_at <= self.config.probe_ttl_s):
                # Slow by its pace: its slowdown. Slow by closes (the slowest) but measured
                # below the detector's entry threshold: healthy, as far as the cost goes.
                confirmed = h.basis == "pace" or h.slowdown >= self.config.detector.slow_enter
                estimates[w] = max(h.slowdown, 1.0) if confirmed else 1.0
            else:
                unknown.append(w)
        return estimates, unknown

    def _can_probe(self, n: int) -> bool:
        return n > 1 and (self.config.allow_async or self.config.quorum_floor(n) < n)

    def _probe(self, t: float, out: list[Decision], n: int, slow: list[int], why: str, *,
               kind: str) -> None:
        """Measure the slowdowns sync hides. Async measures every member's own pace. A
        partial probe (without async) uses the smallest allowed quorum, so that the
        stragglers are left out and show their pace: one inside the quorum would set
        everyone's pace and hide itself."""
        q = self.config.quorum_floor(n)
        self._probe_until = t + self.config.probe_s
        if self.config.allow_async and n > 1:
            self._set_mode(t, out, Mode.ASYNC, 0, f"{kind}: {why}; async to measure")
        elif len(slow) <= n - q and q < n:
            self._set_mode(t, out, Mode.PARTIAL, q, f"{kind}: {why}; partial({q}) to measure")

    def _probation_mode(self, t: float, out: list[Decision], n: int) -> None:
        q = max(1, n - len(self._probation))
        if self.mode == Mode.ASYNC or (self.mode == Mode.PARTIAL and self.quorum <= q):
            return
        workers = ", ".join(map(str, sorted(self._probation)))
        self._set_mode(t, out, Mode.PARTIAL, q,
                       f"probation of worker {workers}: rounds must not wait for it")

    def _starving(self, t: float, out: list[Decision], dwelt: bool) -> bool:
        """Starvation guard: a sync refresh when a member has been in no sum too long."""
        if self.mode != Mode.PARTIAL or not dwelt:
            return False
        starved = [w for w in sorted(self.active)
                   if t - self._included_at.get(w, t) >= self.config.max_starved_s - 1e-9]
        if not starved:
            return False
        who = ", ".join(map(str, starved))
        for w in starved:
            self._included_at[w] = t
        self._set_mode(t, out, Mode.SYNC, 0, (
            f"starvation guard: worker {who} in no sum for {self.config.max_starved_s:g} s; "
            f"sync for {self.config.refresh_s:g} s"))
        self._refresh_until = t + self.config.refresh_s
        return True

    def _budget(self, t: float, needed: int) -> bool:
        """Room for `needed` more mode changes in the window that ends at `t`."""
        while self._changed and self._changed[0] <= t - MINUTE_S + 1e-9:
            self._changed.popleft()
        return len(self._changed) + needed <= self.config.mode_changes_per_min

    def _set_mode(self, t: float, out: list[Decision], mode: Mode, quorum: int, reason: str,
                  **extra: object) -> None:
        self.mode, self.quorum = mode, quorum if mode == Mode.PARTIAL else 0
        self._mode_since = t
        self._changed.append(t)
        self._way_back = False
        self._unproven = False  # the cost model's choice sets it after this
        self._emit(out, t, SET_MODE, None, reason, **extra)

    def _emit(self, out: list[Decision], t: float, action: str, worker: int | None,
              reason: str, **extra: object) -> None:
        inputs: dict[str, object] = {
            "workers": {str(w): h.to_dict() for w, h in self.health.items()},
            "active": sorted(self.active), "excluded": sorted(self._excluded),
            "probation": sorted(self._probation), "heartbeat": round(self.heartbeat(), 3),
            **extra}
        mode = self.mode if self.mode is not None else Mode.SYNC
        d = Decision(round(t, 6), action, mode.name.lower(), self.quorum, worker, reason,
                     inputs)
        log.info("policy %s: %s", self.name, d.describe())
        out.append(d)


def make_policy(name: str, config: PolicyConfig | None = None) -> AdaptivePolicy:
    if name != "adaptive":
        raise ValueError(f"unknown policy {name!r}: choose one of {', '.join(POLICIES)}")
    return AdaptivePolicy(config)

"""The counters of a job (p4src: HySyncIngress.stats, HySyncEgress.replication.results):
per (job, worker) contributions, late, duplicates, stale, closes and results sent; per job
drops by reason (docs/protocol.md §8). All counts are packets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from hysync import p4names, wire
from hysync.controlplane.p4rt.entities import CounterCell
from hysync.wire import DropReason

PER_WORKER = {"contributions": p4names.STATS_CONTRIBUTIONS, "late": p4names.STATS_LATE,
              "duplicates": p4names.STATS_DUPLICATES, "stale": p4names.STATS_STALE,
              "closes": p4names.STATS_CLOSES, "results": p4names.REPLICATION_RESULTS}


@dataclass(frozen=True, slots=True)
class WorkerStats:
    worker: int
    active: bool
    contributions: int = 0
    late: int = 0
    duplicates: int = 0
    stale: int = 0
    closes: int = 0  # rounds this worker's contribution closed (the last arrival in sync)
    results: int = 0


@dataclass(frozen=True, slots=True)
class JobStats:
    job_id: int
    time: float  # time.monotonic() of the read
    workers: dict[int, WorkerStats] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)  # DropReason name -> packets

    @property
    def contributions(self) -> int:
        return sum(w.contributions for w in self.workers.values())

    def to_dict(self) -> dict[str, object]:
        return {"job_id": self.job_id, "workers": [asdict(w) for w in self.workers.values()],
                "drops": dict(self.drops)}


@dataclass(frozen=True, slots=True)
class WorkerRates:
    """Packets per second over an interval."""

    worker: int
    contributions: float
    late: float
    duplicates: float
    stale: float
    closes: float
    results: float


@dataclass(frozen=True, slots=True)
class JobRates:
    job_id: int
    interval: float
    workers: dict[int, WorkerRates]
    drops: dict[str, float]

    def to_dict(self) -> dict[str, object]:
        return {"job_id": self.job_id, "interval": self.interval,
                "workers": [asdict(w) for w in self.workers.values()], "drops": dict(self.drops)}


@dataclass(frozen=True, slots=True)
class SwitchStats:
    """Every drop of the switch by reason (DropReason name -> packets), whatever job id a
    dropped packet's bytes carried."""

    drops: dict[str, int]

    @classmethod
    def collect(cls, read: Sequence[CounterCell]) -> SwitchStats:
        packets = {c.index: c.packets for c in read if c.counter == p4names.STATS_SWITCH_DROPS}
        return cls({r.name: packets.get(r, 0) for r in DropReason})

    def to_dict(self) -> dict[str, object]:
        return {"drops": dict(self.drops), "total": sum(self.drops.values())}


SWITCH_CELLS: list[tuple[str, int | None]] = [(p4names.STATS_SWITCH_DROPS, r)
                                              for r in DropReason]


def cells(job_id: int, workers: Iterable[int]) -> list[tuple[str, int | None]]:
    """Every counter cell of the job's stats, for one Read RPC."""
    wanted: list[tuple[str, int | None]] = [
        (counter, wire.member_index(job_id, w)) for w in workers for counter in PER_WORKER.values()]
    wanted += [(p4names.STATS_DROPS, job_id * wire.NUM_DROP_REASONS + r) for r in DropReason]
    return wanted


def collect(job_id: int, workers: Iterable[int], active: Iterable[int],
            read: Sequence[CounterCell], time: float) -> JobStats:
    packets = {(c.counter, c.index): c.packets for c in read}
    active = set(active)
    per_worker = {}
    for w in sorted(workers):
        index = wire.member_index(job_id, w)
        values = {key: packets.get((name, index), 0) for key, name in PER_WORKER.items()}
        per_worker[w] = WorkerStats(w, w in active, **values)
    drops = {r.name: packets.get((p4names.STATS_DROPS, job_id * wire.NUM_DROP_REASONS + r), 0)
             for r in DropReason}
    return JobStats(job_id, time, per_worker, drops)


def rates_between(before: JobStats, after: JobStats) -> JobRates:
    dt = max(after.time - before.time, 1e-9)
    workers = {}
    for w, now in after.workers.items():
        then = before.workers.get(w, WorkerStats(w, now.active))
        workers[w] = WorkerRates(w, *((getattr(now, k) - getattr(then, k)) / dt
                                      for k in PER_WORKER))
    drops = {k: (v - before.drops.get(k, 0)) / dt for k, v in after.drops.items()}
    return JobRates(after.job_id, dt, workers, drops)

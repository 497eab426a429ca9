"""`hysync serve --metrics-addr HOST:PORT`: its jobs and its switch as Prometheus metrics.

Every scrape reads the switch (one Read of the jobs' tables, one of their counters, one
of the switch's drops) under serve's lock and reports what it finds: the counters are the
switch's own, monotonic for as long as the pipeline stays, so a restarted serve goes on
with them. The members' health and the last decision come from each job's policy, and
each member's host and the job's ranks it speaks for from its admission.
Metric names: hysync/prometheus.py (EXPORTED).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hysync.controlplane.errors import ControlPlaneError
from hysync.controlplane.policy.detect import Health, WorkerHealth
from hysync.controlplane.policy.levels import LevelPolicies
from hysync.controlplane.policy.member_hosts import MemberHost, ranks_text
from hysync.controlplane.policy.policies import SET_MODE, Decision
from hysync.controlplane.policy.runner import PolicyRunner
from hysync.controlplane.tables.counters import PER_WORKER
from hysync.prometheus import MEMBER_STATES, Endpoint, WriteMetrics
from hysync.wire import Mode

if TYPE_CHECKING:
    from hysync.controlplane.serve.server import Server


def member_state(active: bool, policy_state: str | None) -> str:
    """One of MEMBER_STATES: excluded wins, then the policy's view (healthy by default)."""
    return "excluded" if not active else policy_state or "healthy"


class ServeCollector(Collector):
    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        g, c = GaugeMetricFamily, CounterMetricFamily
        jobs = g("hysync_jobs", "jobs installed on the switch", labels=[])
        rounds = c("hysync_job_rounds_closed", "rounds the switch closed (a result multicast)",
                   labels=["job"])
        members = g("hysync_job_members", "members of a job by state", labels=["job", "state"])
        slot_mode = g("hysync_job_slot_mode", "1 for the mode in force on a slot range",
                      labels=["job", "slots", "mode"])
        slot_value = g("hysync_job_slot_mode_value", "the mode in force on a slot range "
                       "(0 sync, 1 partial, 2 async)", labels=["job", "slots"])
        quorum = g("hysync_job_slot_quorum", "partial's quorum on a slot range (0: not partial)",
                   labels=["job", "slots"])
        job_drops = c("hysync_job_drops", "packets of a job the switch dropped, by reason",
                      labels=["job", "reason"])
        per_worker = {key: c(f"hysync_worker_{key}", f"per-worker {key} counter of the switch "
                             "(docs/protocol.md, counters)", labels=["job", "worker"])
                      for key in PER_WORKER}
        state = g("hysync_member_state", "1 for a member's state (healthy, slow, gone, "
                  "probation, excluded)", labels=["job", "worker", "state"])
        host_info = g("hysync_member_host_info", "1, labelled with a member's inventory host "
                      "and the job's ranks it speaks for (a host of several ranks is one "
                      "member)", labels=["job", "worker", "host", "ranks"])
        slowdown = g("hysync_member_slowdown_ratio", "a member's pace behind the fast members "
                     "(1: as fast)", labels=["job", "worker"])
        decisions = c("hysync_policy_decisions", "decisions of a job's policy, by action",
                      labels=["job", "action"])
        last = g("hysync_policy_last_decision_info", "the last decision of a job's policy and "
                 "its reason", labels=["job", "action", "mode", "worker", "reason"])
        skipped = c("hysync_policy_skipped_reads", "counter reads of a job's policy that missed "
                    "their deadline (each skipped a tick)", labels=["job"])
        last_time = g("hysync_policy_last_decision_timestamp_seconds", "when a job's policy "
                      "last decided (Unix time)", labels=["job"])
        switch_drops = c("hysync_switch_drops", "packets the switch dropped, by reason",
                         labels=["reason"])
        try:
            with server.lock:  # the policies change on serve's tick: copy them under it
                read = server.controller.all_stats()
                sw = server.controller.switch_stats()
                policies = {j: _PolicyView.of(lease.policy) for j, lease in server.leases.items()
                            if lease.policy is not None}
                hosts = {job.job_id: server.members_of(job.job_id) for job, _ in read}
        except ControlPlaneError:
            return  # the switch is gone: no samples rather than stale ones
        jobs.add_metric([], len(read))
        for job, s in read:
            label = str(job.job_id)
            rounds.add_metric([label], sum(w.closes for w in s.workers.values()))
            for seg in job.segments():
                slots = f"{seg.low}-{seg.high}"
                for m in Mode:
                    slot_mode.add_metric([label, slots, m.name.lower()], float(seg.mode == m))
                slot_value.add_metric([label, slots], int(seg.mode))
                quorum.add_metric([label, slots], seg.quorum if seg.mode == Mode.PARTIAL else 0)
            for reason, n in s.drops.items():
                job_drops.add_metric([label, reason.lower()], n)
            policy = policies.get(job.job_id)
            counts = dict.fromkeys(MEMBER_STATES, 0)
            for w in s.workers.values():
                wl = [label, str(w.worker)]
                for key, family in per_worker.items():
                    family.add_metric(wl, getattr(w, key))
                place = hosts.get(job.job_id, {}).get(w.worker, MemberHost(None))
                host_info.add_metric(wl + [place.host or "",
                                           "" if place.ranks is None else ranks_text(place.ranks)],
                                     1)
                health = policy.health.get(w.worker) if policy is not None else None
                view = None
                if policy is not None and w.worker in policy.on_probation:
                    view = "probation"
                elif health is not None and health.state != Health.HEALTHY:
                    view = health.state.value
                st = member_state(w.active, view)
                counts[st] += 1
                for name in MEMBER_STATES:
                    state.add_metric(wl + [name], float(name == st))
                if health is not None and health.slowdown is not None:
                    slowdown.add_metric(wl, health.slowdown)
            for name, n in counts.items():
                members.add_metric([label, name], n)
            if policy is not None:
                skipped.add_metric([label], policy.skipped_reads)
                made: dict[str, int] = {}
                for d in policy.decisions:
                    made[d.action] = made.get(d.action, 0) + 1
                for action, n in made.items():
                    decisions.add_metric([label, action], n)
                if policy.decisions:
                    d = policy.decisions[-1]
                    mode = d.mode if d.action == SET_MODE else ""
                    last.add_metric([label, d.action, mode, "" if d.worker is None
                                     else str(d.worker), d.reason], 1)
                    last_time.add_metric([label], PolicyRunner.wall_time(d.time))
        for reason, n in sw.drops.items():
            switch_drops.add_metric([reason.lower()], n)
        yield from (jobs, rounds, members, slot_mode, slot_value, quorum, job_drops,
                    *per_worker.values(), state, host_info, slowdown, decisions, skipped, last,
                    last_time, switch_drops)


@dataclass(frozen=True, slots=True)
class _PolicyView:
    """What a scrape shows of a job's policy, copied while serve's lock is held."""

    health: dict[int, WorkerHealth]
    on_probation: frozenset[int]
    decisions: list[Decision]
    skipped_reads: int

    @classmethod
    def of(cls, policy: PolicyRunner | LevelPolicies) -> _PolicyView:
        """Across switches the members shown are the spine's (its counters are the ones
        read): their health and the decisions are its policy's; the skipped reads are
        every level's."""
        runner = policy.runner("spine") if isinstance(policy, LevelPolicies) else policy
        if runner is None:
            return cls({}, frozenset(), [], policy.skipped_reads)
        p = runner.policy
        return cls(dict(p.health), p.on_probation, list(p.decisions), policy.skipped_reads)


def serve_metrics(server: Server, addr: str) -> Endpoint:
    """Serve `server`'s metrics on `addr` (HOST:PORT); its switch's writes are timed."""
    registry = CollectorRegistry()
    registry.register(ServeCollector(server))
    server.switch.on_write = WriteMetrics(registry, "controller").observe
    return Endpoint(registry, addr)

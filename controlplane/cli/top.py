"""`hysync top`: a live terminal view of a testbed, for one without Grafana.

What the Grafana dashboard (docs/grafana/hysync.json) shows, from the same metrics: per
job the mode in force on each slot range, rounds per second, the policy's last decision
and reason, and per member its state, slowdown and pace (contributions per second); per
switch the drops by reason per second. The source is `hysync serve`'s /metrics
(--metrics HOST:PORT), or without serve the switch itself, read without arbitrating
(--grpc-addr; no policy there, so members show as healthy or excluded).
"""

from __future__ import annotations

import argparse
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from hysync.controlplane.cli.limits import count, seconds
from hysync.controlplane.errors import ControlPlaneError

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class TopError(ControlPlaneError):
    """The metrics endpoint cannot be read."""


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(addr: str, timeout: float) -> Samples:
    url = addr if addr.startswith("http") else f"http://{addr}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return parse(reply.read().decode())
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TopError(f"cannot read metrics at {url} ({reason}): is `hysync serve "
                       "--metrics-addr HOST:PORT` running there?") from None


def collect(collector: Collector) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in collector.collect() for s in family.samples}


@dataclass
class Member:
    worker: int
    state: str = "healthy"
    slowdown: float | None = None
    contributions: float = 0.0
    stale: float = 0.0
    pace: float | None = None  # contributions per second since the last frame
    host: str = ""  # its inventory host and the job's ranks it speaks for, where serve knows
    ranks: str = ""


@dataclass
class Job:
    job_id: int
    modes: list[tuple[str, str, int]] = field(default_factory=list)  # slots, mode, quorum
    rounds: float = 0.0
    rounds_per_s: float | None = None
    swaps: float = 0.0
    decision: str = ""
    members: dict[int, Member] = field(default_factory=dict)


@dataclass
class Frame:
    jobs: dict[int, Job]
    drops: dict[str, float]
    drops_per_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": [{"job_id": j.job_id, "rounds_per_s": j.rounds_per_s,
                          "modes": [{"slots": s, "mode": m, "quorum": q} for s, m, q in j.modes],
                          "swaps": j.swaps, "last_decision": j.decision,
                          "members": [vars(m) for m in j.members.values()]}
                         for j in self.jobs.values()],
                "drops": self.drops, "drops_per_s": self.drops_per_s}


def frame(samples: Samples, before: Frame | None, dt: float) -> Frame:
    jobs: dict[int, Job] = {}

    def job(labels: dict[str, str]) -> Job:
        j = int(labels["job"])
        return jobs.setdefault(j, Job(j))

    for (name, label_items), v in sorted(samples.items()):
        labels = dict(label_items)
        if name == "hysync_job_rounds_closed_total":
            job(labels).rounds = v
        elif name == "hysync_job_slot_mode" and v == 1:
            quorum = samples.get(("hysync_job_slot_quorum", tuple(sorted(
                {"job": labels["job"], "slots": labels["slots"]}.items()))), 0)
            job(labels).modes.append((labels["slots"], labels["mode"], int(quorum)))
        elif name == "hysync_job_mode_swaps_total" and labels.get("job"):
            job(labels).swaps += v
        elif name == "hysync_policy_last_decision_info":
            who = f" worker {labels['worker']}" if labels.get("worker") else ""
            what = labels["mode"] or labels["action"]
            job(labels).decision = f"{labels['action']}{who} {what}: {labels['reason']}"
        elif name.startswith(("hysync_worker_", "hysync_member_")) and "worker" in labels:
            w = int(labels["worker"])
            m = job(labels).members.setdefault(w, Member(w))
            if name == "hysync_worker_contributions_total":
                m.contributions = v
            elif name == "hysync_worker_stale_total":
                m.stale = v
            elif name == "hysync_member_state" and v == 1:
                m.state = labels["state"]
            elif name == "hysync_member_slowdown_ratio":
                m.slowdown = v
            elif name == "hysync_member_host_info" and v == 1:
                m.host, m.ranks = labels.get("host", ""), labels.get("ranks", "")
    drops = {dict(k)["reason"]: v for (n, k), v in samples.items()
             if n == "hysync_switch_drops_total"}
    now = Frame(jobs, drops)
    if before is not None and dt > 0:
        for j in jobs.values():
            old = before.jobs.get(j.job_id)
            if old is None:
                continue
            j.rounds_per_s = (j.rounds - old.rounds) / dt
            for m in j.members.values():
                if m.worker in old.members:
                    m.pace = (m.contributions - old.members[m.worker].contributions) / dt
        now.drops_per_s = {r: (v - before.drops.get(r, 0)) / dt for r, v in drops.items()}
    return now


def render(f: Frame) -> Any:
    """The frame as rich renderables (one table per job, one for the drops)."""
    from rich.console import Group
    from rich.table import Table

    parts: list[Any] = []
    if not f.jobs:
        parts.append("no jobs on the switch")
    for j in f.jobs.values():
        modes = ", ".join(f"{s} {m}" + (f"({q})" if m == "partial" else "")
                          for s, m, q in j.modes) or "?"
        rate = "-" if j.rounds_per_s is None else f"{j.rounds_per_s:.1f}"
        table = Table(title=f"job {j.job_id}: {modes}; rounds/s {rate}; swaps {j.swaps:g}",
                      caption=f"policy: {j.decision}" if j.decision else None,
                      title_justify="left", caption_justify="left")
        hosts = any(m.host or m.ranks for m in j.members.values())
        for col in ("worker", *(("host", "ranks") if hosts else ()), "state", "slowdown",
                    "contrib/s", "contributions", "stale"):
            table.add_column(col, justify="left" if col in ("state", "host", "ranks")
                             else "right")
        for m in sorted(j.members.values(), key=lambda m: m.worker):
            table.add_row(str(m.worker), *((m.host or "-", m.ranks or "-") if hosts else ()),
                          m.state, "-" if m.slowdown is None else f"{m.slowdown:.2f}x",
                          "-" if m.pace is None else f"{m.pace:.1f}", f"{m.contributions:g}",
                          f"{m.stale:g}")
        parts.append(table)
    drops = Table(title="switch drops", title_justify="left")
    drops.add_column("reason")
    drops.add_column("total", justify="right")
    drops.add_column("per s", justify="right")
    for reason, total in sorted(f.drops.items()):
        if total:
            per_s = f.drops_per_s.get(reason)
            drops.add_row(reason, f"{total:g}", "-" if per_s is None else f"{per_s:.1f}")
    parts.append(drops)
    return Group(*parts)


def source(args: argparse.Namespace) -> tuple[Callable[[], Samples], Callable[[], None]]:
    """(read one snapshot, close) for --metrics or the switch at --grpc-addr."""
    if args.metrics:
        return (lambda: scrape(args.metrics, args.timeout)), (lambda: None)
    import threading

    from hysync.controlplane.controller import Controller
    from hysync.controlplane.p4rt.switch import Switch
    from hysync.controlplane.serve.prometheus_collector import ServeCollector

    switch = Switch(args.grpc_addr, device_id=args.device_id, timeout=args.timeout,
                    arbitrate=False)

    class Direct:  # what ServeCollector reads of a serve: no leases, no policies, no hosts
        lock = threading.RLock()
        controller = Controller(switch)
        leases: dict[int, Any] = {}

        def members_of(self, job_id: int) -> dict[int, Any]:
            return {}

    collector = ServeCollector(Direct())  # type: ignore[arg-type]
    return (lambda: collect(collector)), switch.close


def cmd_top(args: argparse.Namespace, out: Any) -> None:
    """A live view of the jobs and the switch: modes, rounds/s, members' state and pace,
    the policy's last decision, drops (Ctrl-C ends it).

    Reads `hysync serve`'s metrics with --metrics HOST:PORT (its --metrics-addr), else the
    switch at --grpc-addr directly (no policy information then). --count N stops after N
    refreshes (and prints each, for logs and scripts); --json prints each as an object.
    """
    read, close = source(args)
    try:
        before, then = None, time.monotonic()
        shown = 0
        live = out.stream.isatty() and not out.as_json and args.count is None
        from rich.console import Console

        console = Console(file=out.stream, force_terminal=live or None,
                          width=None if live else 100)
        while args.count is None or shown < args.count:
            now = time.monotonic()
            current = frame(read(), before, now - then)
            before, then = current, now
            shown += 1
            if out.as_json:
                out.emit(current.to_dict(), "")
            else:
                if live:
                    console.clear()
                console.print(render(current))
            if args.count is not None and shown >= args.count:
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        close()


def add_command(groups: argparse._SubParsersAction,  # type: ignore[type-arg]
                command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command(groups, "top", cmd_top)
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="read `hysync serve --metrics-addr`'s metrics (default: the switch)")
    p.add_argument("--interval", type=seconds, default=1.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 1)")
    p.add_argument("--count", type=count, metavar="N", help="stop after N refreshes")

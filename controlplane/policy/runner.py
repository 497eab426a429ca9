"""Runs a policy on a live job: counters in, decisions applied, every decision logged.

`PolicyRunner` reads a job's counters from the switch every interval, feeds the pure
policy of policies.py (`AdaptivePolicy.observe`), applies its decisions through the
`Controller`, and appends each one, applied or failed, to a JSON-lines decision log
that `latest_decision` (the CLI's `hysync policy status`) reads back. Given the job's
`hosts` (serve learns them at admission), a record names the host of the member it acts
on and the ranks that member speaks for (`"member": 1, "host": "h2", "ranks": [2, 3]`),
and so does each member's entry of its inputs; at the spine of a job across switches a
member is a leaf (`"member": 1, "host": null, "leaf": "leaf-1", "ranks": [2, 3]`). There,
given its leaves (`racks`), it measures each leaf by the pace of the hosts behind it
(rack_pace.py), and its records say so (`"pace": "hosts"`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time as _time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO

from hysync import files, logs
from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ControlPlaneError, DeadlineExceededError
from hysync.controlplane.policy.detect import Health, Interval, JobView
from hysync.controlplane.policy.member_hosts import Hosts, MemberHost, describe, member_fields
from hysync.controlplane.policy.policies import (
    EXCLUDE,
    READMIT,
    SET_MODE,
    AdaptivePolicy,
    Decision,
    mode_text,
)
from hysync.controlplane.policy.rack_pace import RackPace
from hysync.controlplane.tables.counters import JobStats
from hysync.errors import BadFileError, HySyncError
from hysync.wire import Mode

log = logging.getLogger(__name__)


class PolicyLogError(ControlPlaneError, BadFileError):
    """A policy decision log that cannot be read."""


class PolicyRunner:
    """Reads a job's counters every `interval` seconds, feeds the policy, and applies its
    decisions through the controller (`dry_run`: only reports them). With `log_path`,
    every decision is appended to that file as a JSON line (plus one `start` line)."""

    def __init__(self, controller: Controller, job_id: int, policy: AdaptivePolicy, *,
                 interval: float = 0.5, dry_run: bool = False, log_path: Path | None = None,
                 echo: Callable[[dict[str, object]], None] | None = None,
                 hosts: Hosts | None = None, level: str | None = None,
                 racks: RackPace | None = None) -> None:
        """`level`: the level of a job across switches this runner acts on (`spine`,
        `leaf:NAME`), named in every record it writes (policy/levels.py). `racks`: at the
        spine, the leaves whose hosts' pace measures each member."""
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.controller, self.job_id, self.policy = controller, job_id, policy
        self.level, self.racks = level, racks
        job = controller.jobs.get(job_id)
        if job is not None and job.role is not None:
            # Across switches async is not offered (docs/protocol.md §11), and a leaf left
            # out of the spine's group would leave its whole rack without results.
            keep = len(job.members) if job.role.name == "spine" else policy.config.min_members
            policy.config = replace(policy.config, allow_async=False,
                                    min_members=max(policy.config.min_members, keep))
        if policy.config.allow_async and not controller.hot_swaps_async:
            # The Tofino program cannot hot-swap async (sync_mode.async_swap_refusal): the
            # policy probes and adapts with partial instead.
            policy.config = replace(policy.config, allow_async=False)
            log.info("job %d: %s switch, the policy runs without async", job_id,
                     controller.arch)
        self.interval, self.dry_run = interval, dry_run
        self.echo = echo
        self.hosts: Hosts = dict(hosts or {})
        self._log: IO[str] | None = log_path.open("a") if log_path is not None else None
        self._prev: tuple[JobStats, JobView] | None = None
        # Counter reads that missed their deadline (a busy switch or controller host):
        # each skipped one tick; the next interval spans the skipped one too.
        self.skipped_reads = 0

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> PolicyRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> tuple[JobStats, JobView]:
        stats = self.controller.stats(self.job_id)  # also refreshes controller.jobs
        return stats, JobView.of(self.controller.jobs[self.job_id])

    def start(self) -> None:
        stats, view = self._read()
        if self.racks is not None:
            self.racks.sample()  # the first read of each leaf: paces from the next one on
        self._prev = (stats, view)
        self.policy.start(view, stats.time)
        self._write({"time": round(stats.time, 6), "action": "start", "job_id": self.job_id,
                     "policy": self.policy.name, "mode": mode_text(view.mode, view.quorum),
                     "quorum": view.quorum, "active": sorted(view.active),
                     "dry_run": self.dry_run, "wall": _time.time(), **self._pace_field()})

    def step(self) -> list[Decision]:
        """One interval: read, decide, apply."""
        if self._prev is None:  # the first reading (or the retry of one that was late)
            try:
                self.start()
            except DeadlineExceededError as err:
                self._skipped(err)
            return []
        try:
            stats, view = self._read()
        except DeadlineExceededError as err:
            self._skipped(err)
            return []
        interval = Interval.between(self._prev[0], stats, self._prev[1], view)
        behind = self.racks.sample() if self.racks is not None else None
        if behind is not None:  # packets a second at each leaf -> over the spine's interval
            interval = replace(interval, behind={
                w: pace * interval.duration for w, pace in behind.items()})
        self._prev = (stats, view)
        p = self.policy
        if not self.dry_run and (view.mode, view.quorum, view.active) != (
                p.mode, p.quorum, frozenset(p.active)):
            logs.event(log, "policy_resync", f"job {self.job_id} changed outside the policy: "
                       f"{mode_text(view.mode, view.quorum)}, active {sorted(view.active)}",
                       job=self.job_id, mode=mode_text(view.mode, view.quorum),
                       active=sorted(view.active))
            p.resync(view, stats.time)
        decisions = p.observe(interval)
        failed: str | None = None
        for d in decisions:
            error = None
            if failed is not None:
                error = f"not applied: an earlier decision failed ({failed})"
            elif not self.dry_run:
                try:
                    self._apply(d, view)
                except HySyncError as err:
                    error = failed = " ".join(str(err).split())
                    log.warning("policy decision %s failed: %s", d.describe(), error)
            record = self.record(d, applied=not self.dry_run and error is None, error=error)
            if record["applied"]:
                _log_decision(self.job_id, d, self.hosts, self.level)
            self._write(record)
            if self.echo is not None:
                self.echo(record)
        if failed is not None:
            _, now = self._read()
            self.policy.resync(now, stats.time)
        return decisions

    def _skipped(self, err: DeadlineExceededError) -> None:
        self.skipped_reads += 1
        at, fields = "", {}
        if self.level is not None:  # `level` is the logging level of logs.event
            at, fields = f" at {self.level}", {"job_level": self.level}
        logs.event(log, "policy_read_skipped", f"job {self.job_id}{at}: the counter read "
                   f"missed its deadline, tick skipped ({' '.join(str(err).split())})",
                   job=self.job_id, level=logging.WARNING, skipped=self.skipped_reads,
                   **fields)

    def record(self, d: Decision, *, applied: bool, error: str | None) -> dict[str, object]:
        """The decision-log record of `d`: the decision, whether it was applied, and the
        hosts and ranks of the members it names."""
        record: dict[str, object] = dict(d.to_dict(), job_id=self.job_id, applied=applied,
                                         error=error, dry_run=self.dry_run, wall=_time.time(),
                                         **self._pace_field())
        if self.level is not None:
            record["level"] = self.level
        if d.worker is not None:
            record.update(member_fields(d.worker, self.hosts))
        inputs = record["inputs"]  # to_dict()'s own copy: annotated in place
        workers = inputs.get("workers") if isinstance(inputs, dict) else None
        for w, entry in (workers or {}).items():  # member index (a string) -> its health
            place = self.hosts.get(int(w))
            if place is not None and isinstance(entry, dict):
                entry.update(place.named())
        return record

    def _pace_field(self) -> dict[str, str]:
        """What a record says the members' paces are: the hosts' behind each leaf."""
        return {"pace": "hosts"} if self.racks is not None else {}

    def _apply(self, d: Decision, view: JobView) -> None:
        c = self.controller
        if d.action == SET_MODE:
            mode = Mode[d.mode.upper()]
            c.set_mode(self.job_id, slots=view.slots, mode=mode,
                       quorum=d.quorum if mode == Mode.PARTIAL else None)
        elif d.action == EXCLUDE:
            assert d.worker is not None
            c.exclude(self.job_id, d.worker)
        elif d.action == READMIT:
            assert d.worker is not None
            report = c.readmit(self.job_id, d.worker)
            if report.quorums and self.policy.mode is not None:
                # readmit() raised quorums an earlier exclude() had lowered: put back the
                # mode the policy wants (a probation quorum that leaves the member out).
                q = self.policy.quorum
                c.set_mode(self.job_id, slots=view.slots, mode=self.policy.mode,
                           quorum=q if self.policy.mode == Mode.PARTIAL else None)

    def run(self, *, duration: float | None = None,
            stop: threading.Event | None = None) -> list[Decision]:
        """Step every `interval` until `duration` has passed or `stop` is set."""
        stop = stop or threading.Event()
        made: list[Decision] = []
        if self._prev is None:
            self.start()
        begin = _time.monotonic()
        end = math.inf if duration is None else begin + duration
        next_at = begin + self.interval
        while not stop.is_set():
            if next_at > end + 1e-6:
                stop.wait(max(0.0, end - _time.monotonic()))
                break
            if stop.wait(max(0.0, next_at - _time.monotonic())):
                break
            made += self.step()
            next_at += self.interval
            if next_at < _time.monotonic():  # a slow step: no burst to catch up
                next_at = _time.monotonic() + self.interval
        return made

    @staticmethod
    def wall_time(monotonic: float) -> float:
        """The Unix time of a decision's `time` (time.monotonic())."""
        return _time.time() - (_time.monotonic() - monotonic)

    def note(self, record: Mapping[str, object]) -> None:
        """Log a change the policy did not decide (an operator's override)."""
        self._write(record)

    def _write(self, record: Mapping[str, object]) -> None:
        if self.level is not None:
            record = dict(record, level=self.level)
        if self._log is not None:
            self._log.write(json.dumps(record, sort_keys=True) + "\n")
            self._log.flush()


_EVENTS = {SET_MODE: "mode_swap", EXCLUDE: "exclusion", READMIT: "readmission"}


def _log_decision(job_id: int, d: Decision, hosts: Hosts, level: str | None = None) -> None:
    """An applied decision as the event it is (serve's metrics count the swaps); an
    exclusion or readmission names the member's host (at the spine its leaf) and ranks
    where they are known, a mode set at the spine the leaves it measured slow or gone, a
    decision at one level of a job across switches names the level."""
    fields: dict[str, object] = {"by": "policy", "reason": d.reason}
    text = describe_decision(d, hosts)
    if level is not None:
        fields["job_level"] = level  # `level` is the logging level of logs.event
        text = f"{level}: {text}"
    if d.action == SET_MODE:
        fields.update(mode=d.mode, quorum=d.quorum)
        named = unhealthy_leaves(d, hosts)
        if named:
            fields["leaves"] = [dict(member_fields(w, hosts), state=state)
                                for w, state in named]
    else:
        assert d.worker is not None
        fields.update(worker=d.worker, **hosts.get(d.worker, MemberHost(None)).named())
    logs.event(log, _EVENTS.get(d.action, d.action), f"job {job_id}: {text}", job=job_id,
               **fields)


def unhealthy_leaves(d: Decision, hosts: Hosts) -> list[tuple[int, str]]:
    """(member, its state) of each of the spine's members (leaves) that a mode set
    measured slow or gone: its reason names each only by its member id there."""
    workers = d.inputs.get("workers") if d.action == SET_MODE else None
    if not isinstance(workers, dict):
        return []
    named = []
    for w, health in workers.items():
        place = hosts.get(int(w))
        state = health.get("state") if isinstance(health, dict) else None
        if (place is not None and place.leaf is not None
                and state in (Health.SLOW.value, Health.GONE.value)):
            named.append((int(w), str(state)))
    return sorted(named)


def describe_decision(d: Decision, hosts: Hosts) -> str:
    """One line for `d`: Decision.describe, its member named by host (at the spine by leaf)
    and ranks where `hosts` knows them, and a mode set at the spine followed by the leaves
    it measured slow or gone (`...; slow member 1 (leaf leaf-1, ranks 2, 3)`)."""
    if d.action != SET_MODE and d.worker is not None and d.worker in hosts:
        return f"{d.action} {describe(d.worker, hosts)}: {d.reason}"
    return d.describe() + "".join(f"; {state} {describe(w, hosts)}"
                                  for w, state in unhealthy_leaves(d, hosts))


def recorded_hosts(record: Mapping[str, object]) -> dict[int, MemberHost]:
    """The members a decision record names (its member, each member of its inputs), as
    `PolicyRunner.record` wrote them: what `describe_decision` needs to say it again."""
    def named(entry: object) -> bool:
        return isinstance(entry, Mapping) and any(
            entry.get(key) is not None for key in ("host", "ranks", "leaf"))

    inputs = record.get("inputs")
    workers = inputs.get("workers") if isinstance(inputs, Mapping) else None
    hosts = {int(w): MemberHost.of_record(entry) for w, entry in (workers or {}).items()
             if named(entry)}
    member = record.get("worker")
    if isinstance(member, int) and named(record):
        hosts[member] = MemberHost.of_record(record)
    return hosts


def latest_decision(path: Path, job_id: int) -> dict[str, object] | None:
    """The last record of `job_id` in a decision log (None: the log has none for it)."""
    fix = f"it is written by `hysync policy run {job_id} --log {path}`"
    text = files.read_text(path, what="the policy log", error=PolicyLogError, fix=fix)
    files.check_nesting(path, text, "json", what="a decision record", fix=fix,
                        error=PolicyLogError)
    lines = text.splitlines()
    for number in range(len(lines), 0, -1):
        line = lines[number - 1].strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise PolicyLogError(f"{path} line {number} is not JSON ({err.msg}): is it a "
                                 "policy log written by `hysync policy run --log`?") from None
        except ValueError:  # an integer past int()'s digit limit
            raise PolicyLogError(f"{path} line {number} has an integer of thousands of "
                                 "digits: is it a policy log written by `hysync policy run "
                                 "--log`?") from None
        except RecursionError:  # json's decoder stops safely at its recursion limit
            raise PolicyLogError(f"{path} line {number} nests too deep for a decision "
                                 "record: is it a policy log written by `hysync policy run "
                                 "--log`?") from None
        if isinstance(record, dict) and record.get("job_id") == job_id:
            return record
    return None

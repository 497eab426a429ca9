"""The adaptive policy at each level of a job across switches (docs/protocol.md §11): one
`PolicyRunner` per switch that holds the job, each reading that switch's counters and
swapping that switch's modes only. At the spine the members are the leaves, so a slow
rack is a slow member there and the spine's policy leaves it out (`partial`); inside a
rack the members are its hosts, so a slow host moves only its leaf. Every record names
the level it acted on (`"level": "spine"` or `"leaf:NAME"`).

Across switches the policies run without async (not offered there), and the spine's never
excludes a leaf: a leaf out of the spine's multicast group would leave its whole rack
without results. A leaf's policy may exclude a host, as on one switch.

Two callers run them: `hysync --inventory FILE policy run` (its own sessions, `run`) and
`hysync serve` across switches (controlplane/serve/fabric_server.py: serve's sessions,
stepped on serve's tick like a one-switch job's `PolicyRunner`, hence `start`, `step`,
`note`, `close` and `skipped_reads` here too).

When the levels run include every leaf of the job, the spine's policy measures each leaf
by the pace of the hosts behind it, read from that leaf's counters (rack_pace.py says
why: the spine's own counters of a leaf's sums depend on the spine's mode); run at the
spine alone, it measures the leaves by its own counters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ValidationError
from hysync.controlplane.policy.member_hosts import Hosts, MemberHost
from hysync.controlplane.policy.policies import Decision, PolicyConfig, make_policy
from hysync.controlplane.policy.rack_pace import RackPace
from hysync.controlplane.policy.runner import PolicyRunner

log = logging.getLogger(__name__)


def level_name(role: str, name: str) -> str:
    """How a policy record names a level: `spine` or `leaf:NAME`."""
    return "spine" if role == "spine" else f"leaf:{name}"


class LevelPolicies:
    """A policy per level of `job_id`, stepped together every `interval` seconds: `levels`
    is (level name, the attached controller of its switch) for each level to run, e.g.
    [("spine", ...), ("leaf:rack-a", ...)]; a switch that does not hold the job is
    skipped. `hosts`: per level, the host and ranks of each of its members, where known
    (a leaf's members are hosts; the records of its policy name them). The spine's members
    are the leaves: its records name each by the leaf and the ranks behind it
    (`spine_members`)."""

    def __init__(self, levels: Sequence[tuple[str, Controller]], job_id: int, *,
                 policy: str = "adaptive", interval: float = 0.5, dry_run: bool = False,
                 log_path: Path | None = None, config: PolicyConfig | None = None,
                 echo: Callable[[dict[str, object]], None] | None = None,
                 hosts: Mapping[str, Hosts] | None = None) -> None:
        self.interval = interval
        self.runners: list[PolicyRunner] = []
        held = []
        for level, controller in levels:
            if job_id in controller.jobs:
                held.append((level, controller))
        fraction = (config or PolicyConfig()).min_quorum_fraction
        hosts = {"spine": spine_members(job_id, held, hosts or {}), **(hosts or {})}
        for level, controller in held:
            self.runners.append(PolicyRunner(
                controller, job_id, make_policy(policy, config), interval=interval, dry_run=dry_run,
                log_path=log_path, echo=echo, level=level, hosts=hosts.get(level),
                racks=_racks(job_id, controller, held, fraction)))
        if not self.runners:
            raise ValidationError(f"job {job_id} is not on {', '.join(n for n, _ in levels)}: "
                                  "add it with `hysync --inventory FILE job add`")

    def close(self) -> None:
        for runner in self.runners:
            runner.close()

    def __enter__(self) -> LevelPolicies:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def skipped_reads(self) -> int:
        """Counter reads that missed their deadline, at every level: a level's own (each
        skipped its tick) and the spine's reads of its leaves' hosts (rack_pace.py)."""
        return sum(r.skipped_reads + (r.racks.missed_reads if r.racks is not None else 0)
                   for r in self.runners)

    def runner(self, level: str) -> PolicyRunner | None:
        """The policy of `level` (`spine`, `leaf:NAME`); None where it runs none."""
        return next((r for r in self.runners if r.level == level), None)

    def start(self) -> None:
        """Every level's first reading, its policy's starting point."""
        for runner in self.runners:
            runner.start()

    def note(self, record: Mapping[str, object]) -> None:
        """Log a change no policy decided (an operator's override) at every level."""
        for runner in self.runners:
            runner.note(record)

    def step(self) -> list[tuple[str, Decision]]:
        """One step of every level's policy: the decisions made, each with its level."""
        made: list[tuple[str, Decision]] = []
        for runner in self.runners:
            assert runner.level is not None
            made += [(runner.level, d) for d in runner.step()]
        return made

    def run(self, *, duration: float | None = None,
            stop: threading.Event | None = None) -> list[tuple[str, Decision]]:
        """Step every level's policy each interval until `duration` or `stop`; the
        decisions made, each with its level."""
        stop = stop or threading.Event()
        made: list[tuple[str, Decision]] = []
        self.start()
        end = float("inf") if duration is None else time.monotonic() + duration
        next_at = time.monotonic() + self.interval
        while not stop.wait(max(0.0, min(next_at, end) - time.monotonic())):
            if time.monotonic() >= end:
                break
            made += self.step()
            next_at = max(next_at + self.interval, time.monotonic())
        return made


def spine_members(job_id: int, held: Sequence[tuple[str, Controller]],
                  hosts: Mapping[str, Hosts]) -> dict[int, MemberHost]:
    """The spine's member of each leaf among `held` (its member id there is the leaf's
    uplink id, as fabric.py installs it), named by the leaf and the job's ranks behind it:
    the ranks of the leaf's members in `hosts` (None unless every one's are known)."""
    members: dict[int, MemberHost] = {}
    for level, leaf in held:
        role = leaf.jobs[job_id].role
        if role is None or role.name != "leaf":
            continue
        behind = hosts.get(level, {})
        members[role.uplink_id] = MemberHost.of_leaf(
            level.removeprefix("leaf:"), [behind.get(m.worker) for m in leaf.jobs[job_id].members])
    return members


def _racks(job_id: int, controller: Controller, held: Sequence[tuple[str, Controller]],
           quorum_fraction: float) -> RackPace | None:
    """At the spine, its leaves' counters when every member of the job there is a leaf
    among `held`; None elsewhere (a leaf's members are its hosts)."""
    role = controller.jobs[job_id].role
    if role is None or role.name != "spine":
        return None
    leaves = {}
    for _, leaf in held:
        leaf_role = leaf.jobs[job_id].role
        if leaf_role is not None and leaf_role.name == "leaf":
            leaves[leaf_role.uplink_id] = leaf
    members = {m.worker for m in controller.jobs[job_id].members} or set(
        controller.jobs[job_id].active)
    missing = sorted(members - set(leaves))
    if missing:
        log.info("job %d: the spine's members %s have no leaf among the levels run: the "
                 "spine measures every leaf by its own counters", job_id, missing)
        return None
    return RackPace(job_id, {m: leaves[m] for m in sorted(members)},
                    quorum_fraction=quorum_fraction)

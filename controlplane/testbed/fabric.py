"""A job across switches: aggregated at each leaf (top-of-rack) switch over its hosts and
again at the spine over the leaves (docs/protocol.md §11), programmed on every switch it
spans, one `Controller` per switch.

What each switch holds of the job:

| switch | members | role | multicast group and rewrites reach |
|---|---|---|---|
| leaf | its hosts (the job file's members behind it) | leaf, with its uplink | its hosts |
| spine | each leaf, as member `uplink_id` at (leaf data address, UDP 48620) | spine | the leaves |

The job id and slot range are the same on every switch (a packet's slot needs no
translation between levels) and so is the install epoch: a spine RESULT whose install tag
is not the leaf's is dropped as stale. The spine is installed first, so that a leaf's
first sum finds its admission there, then the leaves; a switch that fails mid-install has
rolled its own writes back (p4rt/transaction.py), and the switches installed before it
are cleared again, so a failed install leaves no entry behind. Removal goes leaves first,
then the spine.

Modes are per level: `set_mode(..., level="spine" | "leaf" | "leaf:NAME")`, or every
level when no level is named. async is refused on a job across switches.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from hysync import wire
from hysync.controlplane.controller import AddReport, Controller, SwapReport
from hysync.controlplane.errors import ControlPlaneError, JobError, ValidationError
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.tables import admission, roles
from hysync.controlplane.tables.installed import InstalledJob
from hysync.controlplane.tables.roles import RoleRow
from hysync.controlplane.testbed.inventory import Fabric, FabricSwitch
from hysync.errors import HySyncError
from hysync.wire import Mode

log = logging.getLogger(__name__)

LEVEL_HELP = "spine, leaf (every leaf) or leaf:NAME (one leaf)"


@dataclass(frozen=True, slots=True)
class FabricAddReport:
    job_id: int
    epoch: int
    switches: tuple[tuple[str, AddReport], ...]  # (switch name, its report), spine first

    @property
    def updates(self) -> int:
        return sum(r.updates for _, r in self.switches)


def parse_level(text: str, fabric: Fabric) -> tuple[FabricSwitch, ...]:
    """The switches a `--level` names: `spine`, `leaf` (every leaf) or `leaf:NAME`."""
    kind, sep, name = text.partition(":")
    if kind == "spine" and not sep:
        return (fabric.spine,)
    if kind == "leaf" and not sep:
        return fabric.leaves
    if kind == "leaf" and name:
        try:
            return (fabric.leaf(name),)
        except HySyncError as err:
            raise ValidationError(f"--level {text}: {err}") from None
    raise ValidationError(f"--level {text!r}: write {LEVEL_HELP}")


class FabricController:
    """Programs jobs that span the switches of `fabric`; `controllers` holds one attached
    `Controller` per switch name, each a primary session with that switch."""

    def __init__(self, fabric: Fabric, controllers: Mapping[str, Controller]) -> None:
        missing = [s.name for s in fabric.switches if s.name not in controllers]
        if missing:
            raise ValueError(f"no controller for switch(es) {', '.join(missing)}")
        self.fabric = fabric
        self.controllers = dict(controllers)

    def controller(self, switch: FabricSwitch) -> Controller:
        return self.controllers[switch.name]

    # ---------------------------------------------------------- the job on each switch
    def parts(self, job: JobConfig) -> list[tuple[FabricSwitch, JobConfig, RoleRow, int | None]]:
        """(switch, its part of the job, its role, a leaf's uplink port), spine first."""
        if not job.spans_switches:
            raise ValidationError(f"job {job.job_id} names no leaf for its members: give each "
                                  "[[members]] its leaf = \"NAME\" to run it across switches")
        spine = self.fabric.spine
        leaves = [self.fabric.leaf(name) for name in job.leaf_names()]
        parts: list[tuple[FabricSwitch, JobConfig, RoleRow, int | None]] = []
        uplinks = tuple(Member(leaf.uplink_id, leaf.switch.data_ipv4, leaf.switch.data_mac,
                               wire.HYSYNC_UDP_PORT, leaf.spine_port)
                        for leaf in sorted(leaves, key=lambda lf: lf.uplink_id))
        quorum = min(job.quorum, len(uplinks)) if job.mode == Mode.PARTIAL else 0
        spine_job = JobConfig(job.job_id, uplinks, job.slot_base, job.slot_count, job.lanes,
                              job.scale, job.mode, quorum, job.name)
        parts.append((spine, spine_job, RoleRow.spine(job.job_id), None))
        for leaf in leaves:
            role = RoleRow.leaf(job.job_id, leaf.uplink_id, spine.switch.data_ipv4,
                                spine.switch.data_mac, leaf.switch.data_ipv4)
            parts.append((leaf, job.on_leaf(leaf.name), role, leaf.uplink_port))
        return parts

    def add_job(self, job: JobConfig, *, replace: bool = False) -> FabricAddReport:
        """Install `job` on the spine and on every leaf its members sit behind, under one
        install epoch. Refused before anything is written when a switch's program has no
        roles table or the slots are taken on any switch."""
        parts = self.parts(job)
        for switch, part, role, _ in parts:
            controller = self.controller(switch)
            roles.check_roles(controller.switch.schema,
                              f"{switch.name} ({controller.switch.grpc_addr})", role.level)
            if job.job_id not in controller.jobs:
                controller.check_overlap(part, role)
        # Another install tag than the job's last install that these controllers removed
        # (or hold, for a --replace), so that its workers surely see the change.
        before = [c.jobs[job.job_id].epoch if job.job_id in c.jobs
                  else c.removed_epoch(job.job_id) for c in self.controllers.values()]
        epoch = admission.new_epoch(next((e for e in before if e), None))
        done: list[tuple[str, AddReport]] = []
        for switch, part, role, uplink_port in parts:
            controller = self.controller(switch)
            try:
                report = controller.add_job(part, replace=replace, role=role,
                                            uplink_port=uplink_port, epoch=epoch)
            except HySyncError as err:
                self._roll_back(job.job_id, [name for name, r in done
                                             if r.outcome in ("installed", "replaced")])
                raise JobError(f"job {job.job_id} not installed: switch {switch.name} "
                               f"({controller.switch.grpc_addr}) refused its part: {err}; "
                               "the switches installed before it were cleared") from None
            done.append((switch.name, report))
        epochs = {self.controllers[name].jobs[job.job_id].epoch for name, _ in done}
        if len(epochs) > 1:  # a switch kept an earlier install: its epoch is not the others'
            log.warning("job %d: the switches hold install epochs %s: re-add it with "
                        "--replace to give them one", job.job_id, sorted(epochs))
        log.info("job %d installed across %d switches", job.job_id, len(done))
        return FabricAddReport(job.job_id, epoch, tuple(done))

    def restore_job(self, job_id: int, lost: Mapping[str, InstalledJob]) -> FabricAddReport:
        """Install job `job_id` again on every switch it spans, after some of them restarted
        (docs/protocol.md §11: a switch restart, at either level, is a restart of the job):
        `lost` holds the part each restarted switch held (its controller's last reading
        before the restart); a switch that still holds its part (read now) has it removed
        and installed again. Every switch gets its part as it was
        (members, exclusions, modes) under one new install epoch, spine first, then the
        leaves, so that the job's workers see a new install tag and resynchronize (§9)."""
        parts: list[tuple[FabricSwitch, InstalledJob, bool]] = []  # (switch, part, held now)
        for switch in self.fabric.switches:
            controller = self.controller(switch)
            controller._read()
            if job_id in controller.jobs:  # kept (a session that broke, not a restart)
                parts.append((switch, controller.jobs[job_id], True))
            elif switch.name in lost:
                parts.append((switch, lost[switch.name], False))
        if not parts:
            raise JobError(f"no switch of the testbed held job {job_id}: nothing to install "
                           "again")
        epoch = admission.new_epoch(parts[0][1].epoch or None)
        done: list[tuple[str, AddReport]] = []
        for switch, part, held in parts:
            controller = self.controller(switch)
            try:
                if held:
                    controller.remove_job(job_id)
                report = controller.restore_job(
                    part, epoch=epoch,
                    uplink_port=switch.uplink_port if switch.role == "leaf" else None)
            except HySyncError as err:
                raise JobError(f"job {job_id} not installed again: switch {switch.name} "
                               f"({controller.switch.grpc_addr}) refused its part: {err}; "
                               f"installed again on {', '.join(n for n, _ in done) or 'none'}"
                               ": remove the job and admit it again") from None
            done.append((switch.name, report))
        log.info("job %d installed again across %d switches, epoch %d", job_id, len(done),
                 epoch)
        return FabricAddReport(job_id, epoch, tuple(done))

    def _roll_back(self, job_id: int, names: list[str]) -> None:
        for name in reversed(names):
            try:
                self.controllers[name].remove_job(job_id)
            except HySyncError as err:
                log.error("job %d: rolling back switch %s failed: %s", job_id, name, err)

    def remove_job(self, job_id: int) -> tuple[tuple[str, int], ...]:
        """Delete the job from every switch that holds it, leaves first; (switch, updates)."""
        removed: list[tuple[str, int]] = []
        for switch in (*self.fabric.leaves, self.fabric.spine):
            controller = self.controller(switch)
            controller._read()
            if job_id in controller.jobs:
                removed.append((switch.name, controller.remove_job(job_id)))
        if not removed:
            raise ControlPlaneError(f"no switch of the testbed holds job {job_id}: "
                                    "`hysync job list` on each shows what they hold")
        return tuple(removed)

    # ---------------------------------------------------------- modes per level
    def set_mode(self, job_id: int, *, level: str | None = None,
                 slots: tuple[int, int] | None = None, mode: Mode,
                 quorum: int | None = None) -> list[tuple[str, SwapReport]]:
        """Set the mode of `slots` at one level (`parse_level`) or, with no level, at every
        switch that holds the job. Each switch's quorum counts its own members: leaves at
        the spine, hosts at a leaf."""
        if mode == Mode.ASYNC:
            raise ValidationError(f"job {job_id} spans switches: async is not offered across "
                                  "switches (docs/protocol.md §11 \"Modes per level\"); set sync "
                                  "or partial at each level")
        targets = parse_level(level, self.fabric) if level else self.fabric.switches
        holding = []
        for switch in targets:
            controller = self.controller(switch)
            controller._read()
            if job_id in controller.jobs:
                holding.append(switch)
        if not holding:
            raise ValidationError(f"job {job_id} is not on {level or 'any switch'} of the "
                                  "testbed: `hysync job list` shows what each holds")
        for switch in holding:  # every check before the first write
            job = self.controller(switch).jobs[job_id]
            if mode == Mode.PARTIAL and quorum is not None and quorum > len(job.active):
                raise ValidationError(
                    f"quorum {quorum} at {switch.role} {switch.name}: it has {len(job.active)} "
                    f"members ({'leaves' if switch.role == 'spine' else 'hosts'}); give "
                    f"--quorum 1..{len(job.active)} or name the level with --level")
        return [(switch.name, self.controller(switch).set_mode(job_id, slots=slots, mode=mode,
                                                                quorum=quorum))
                for switch in holding]

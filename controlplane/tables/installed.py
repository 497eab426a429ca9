"""What the switch says is installed: the jobs it holds, read back from its tables.

The switch is the source of truth (controller.py explains what a job looks like on
it): `read_state` reads everything the controller programs, and `SwitchState`
derives each `InstalledJob` from it and records what is inconsistent. Kept apart
from the controller so that readers of installed jobs (policy/detect.py, the CLI) need not
import the code that writes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from hysync import p4names, wire
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.entities import MulticastGroup
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.tables import admission, forwarding, replication, roles, sync_mode
from hysync.controlplane.tables.roles import RoleRow
from hysync.controlplane.tables.sync_mode import ModeRange, Segment
from hysync.wire import Mode


@dataclass(frozen=True, slots=True)
class InstalledJob:
    """A job as the switch's tables describe it."""

    job_id: int
    slot_base: int
    slot_count: int
    member_count: int  # the jobs entry's `members` (active count n)
    mcast_grp: int
    members: tuple[Member, ...]  # every member with a rewrite entry, active or excluded
    active: frozenset[int]  # workers with an admission entry
    modes: tuple[ModeRange, ...]
    complete: bool = True  # False: traces of the job without a jobs entry
    epoch: int = 0  # the jobs entry's install epoch (0: no jobs entry)
    role: RoleRow | None = None  # its level in a job across switches; None: single

    @property
    def slots(self) -> tuple[int, int]:
        return self.slot_base, self.slot_base + self.slot_count - 1

    def member(self, worker: int) -> Member | None:
        return next((m for m in self.members if m.worker == worker), None)

    def segments(self) -> list[Segment]:
        return sync_mode.effective(self.modes, *self.slots)

    def differences(self, job: JobConfig) -> list[str]:
        """How `job`'s definition (slots, members) differs from what is installed."""
        diffs = []
        if not self.complete:
            diffs.append("the installed job has no jobs-table entry (a partial install)")
        elif (self.slot_base, self.slot_count) != (job.slot_base, job.slot_count):
            diffs.append(f"slots {_fmt_range(self.slots)} installed, {_fmt_range(job.slots)} "
                         "in the file")
        if set(self.members) != set(job.members):
            diffs.append(f"members {_fmt_members(self.members)} installed, "
                         f"{_fmt_members(job.members)} in the file")
        return diffs

    def to_dict(self) -> dict[str, object]:
        return {
            "job_id": self.job_id, "slots": list(self.slots), "members": self.member_count,
            "mcast_grp": self.mcast_grp, "epoch": self.epoch, "complete": self.complete,
            "workers": [dict(asdict(m), active=m.worker in self.active) for m in self.members],
            "modes": [{"slots": [s.low, s.high], "mode": Mode(s.mode).name.lower(),
                       "quorum": s.quorum} for s in self.segments()],
            "mode_entries": [{"slots": [r.low, r.high], "mode": Mode(r.mode).name.lower(),
                              "quorum": r.quorum, "priority": r.priority} for r in self.modes],
            **({"role": self.role.name, "uplink_id": self.role.uplink_id}
               if self.role is not None else {}),
        }


@dataclass(slots=True)
class SwitchState:
    """One read of everything the controller programs."""

    admitted: list[admission.Admitted]
    jobs: dict[int, admission.JobRow]
    modes: dict[int, list[ModeRange]]
    l2: dict[str, int]
    rewrites: dict[tuple[int, int], replication.Rewrite]
    groups: dict[int, MulticastGroup]
    problems: list[str] = field(default_factory=list)
    roles: dict[int, RoleRow] = field(default_factory=dict)

    def job_ids(self) -> set[int]:
        ids = set(self.jobs) | set(self.modes) | {a.job_id for a in self.admitted}
        ids |= set(self.roles)
        ids |= {job for job, _ in self.rewrites}
        ids |= {g for g in self.groups if 0 < g < wire.MAX_JOBS}
        return ids

    def installed(self, job_id: int) -> InstalledJob:
        row = self.jobs.get(job_id)
        group = self.groups.get(job_id)
        port_of_rid = {r.rid: r.port for r in group.replicas} if group else {}
        members = []
        for (job, worker), rw in sorted(self.rewrites.items()):
            if job != job_id:
                continue
            port = port_of_rid.get(wire.member_rid(job, worker), self.l2.get(rw.mac, -1))
            members.append(Member(worker, rw.ipv4, rw.mac, rw.udp_port, port))
        active = frozenset(a.worker for a in self.admitted if a.job_id == job_id)
        role = self.roles.get(job_id)
        if row is None:
            return InstalledJob(job_id, 0, 0, 0, job_id, tuple(members), active,
                                tuple(self.modes.get(job_id, ())), complete=False, role=role)
        return InstalledJob(job_id, row.slot_base, row.slot_count, row.members, row.mcast_grp,
                            tuple(members), active, tuple(self.modes.get(job_id, ())),
                            epoch=row.epoch, role=role)

    def check(self, job: InstalledJob) -> None:
        """Record inconsistencies of an installed job in `problems`."""
        where = f"job {job.job_id}"
        known = {m.worker for m in job.members}
        if not job.complete:
            self.problems.append(f"{where}: entries without a jobs-table entry (partial "
                                 "install); `hysync job remove` cleans it")
            return
        for w in sorted(job.active - known):
            self.problems.append(f"{where}: worker {w} is admitted but has no rewrite entry")
        if job.member_count != len(job.active):
            self.problems.append(f"{where}: jobs entry says {job.member_count} members, "
                                 f"{len(job.active)} are admitted")
        group = self.groups.get(job.mcast_grp)
        replicas = {r.rid for r in group.replicas} if group else set()
        wanted = {wire.member_rid(job.job_id, w) for w in job.active}
        if replicas != wanted:
            self.problems.append(f"{where}: multicast group {job.mcast_grp} has rids "
                                 f"{sorted(replicas)}, the admitted members need {sorted(wanted)}")


def read_state(switch: Switch) -> SwitchState:
    """One read of everything the controller programs: five tables (six with the roles
    table, where the program has one) in one Read RPC, and the multicast groups."""
    with_roles = roles.has_roles(switch.schema)
    tables = switch.read_tables([p4names.ADMISSION_MEMBERS, p4names.ADMISSION_JOBS,
                                 p4names.SYNC_MODE_MODES, p4names.FORWARDING_L2,
                                 p4names.REPLICATION_REWRITE,
                                 *([roles.ROLES_TABLE] if with_roles else [])])
    state = SwitchState(
        admitted=[admission.Admitted.from_entry(e) for e in tables[p4names.ADMISSION_MEMBERS]],
        jobs={r.job_id: r
              for r in map(admission.JobRow.from_entry, tables[p4names.ADMISSION_JOBS])},
        modes={}, l2=dict(map(forwarding.l2_of, tables[p4names.FORWARDING_L2])),
        rewrites={}, groups={g.group_id: g for g in switch.read_groups()})
    for entry in tables[p4names.SYNC_MODE_MODES]:
        try:
            r = ModeRange.from_entry(entry)
        except ValueError:
            state.problems.append(f"modes entry {entry.match} has unknown mode "
                                  f"{entry.params.get('mode')}")
            continue
        state.modes.setdefault(r.job_id, []).append(r)
    for entry in tables[p4names.REPLICATION_REWRITE]:
        rw = replication.Rewrite.from_entry(entry)
        state.rewrites[(rw.job_id, rw.worker)] = rw
    for entry in tables.get(roles.ROLES_TABLE, ()):
        role = RoleRow.from_entry(entry)
        state.roles[role.job_id] = role
    return state


def _fmt_range(r: tuple[int, int]) -> str:
    return f"{r[0]}-{r[1]}"


def _fmt_members(members: Iterable[Member]) -> str:
    return "[" + ", ".join(f"{m.worker}@{m.ipv4}:{m.udp_port}/{m.mac}/port{m.switch_port}"
                           for m in sorted(members)) + "]"

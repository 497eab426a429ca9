"""The HySync controller: jobs, membership, mode hot swap and counters on one switch.

The switch is the source of truth. Every operation reads what is installed (five
tables and the multicast groups, one Read RPC), derives the job registry from it,
and writes the difference, so a controller restarted against a running switch, or
a new CLI process, picks up where the last one stopped (`attach`) instead of
failing or duplicating entries. What a job looks like on the switch:

| entity | per |
|---|---|
| `admission.members` entry | active member |
| `admission.jobs` entry (slot range, active count n, group = job id) | job |
| `sync_mode.modes` entries (base entry: the whole range, priority 1) | job, swap |
| multicast group `job id`, replica (switch_port, job*32+worker+1) | active member |
| `replication.rewrite` entry on rid job*32+worker+1 | member, excluded ones too |
| `forwarding.l2` entry MAC -> switch_port | host, shared by the jobs on it |
| flood group 1024 replica (switch_port, 0) | port, shared by the jobs on it |

An excluded member keeps its rewrite entry (no replica refers to it): that is how
a fresh process knows the member's address to readmit it. Shared l2 entries and
flood ports are reference counted over the installed jobs' members: a job removal
deletes only those no other job uses.

Writes are ordered so that traffic never meets a half-installed job: egress and
forwarding state first, then the jobs entry, then admission (removal: the reverse).
A failed write rolls back the updates that had succeeded (best effort, logged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from controlplane import admission, forwarding, replication, sync_mode
from controlplane import stats as counters
from controlplane.entities import (
    MulticastGroup,
    TableEntry,
    Update,
    UpdateType,
    delete,
    insert,
    modify,
)
from controlplane.errors import (
    ControlPlaneError,
    JobError,
    P4RuntimeError,
    UnknownJobError,
    ValidationError,
)
from controlplane.job import JobConfig, Member
from controlplane.switch import Switch
from controlplane.sync_mode import ModeRange, Segment
from hysync import p4names, wire
from hysync.errors import HySyncError
from hysync.wire import Mode

log = logging.getLogger(__name__)


class LatchTimeoutError(ControlPlaneError, TimeoutError):
    """The counters did not show every slot of a range latching the new mode in time."""


# ------------------------------------------------------------------ registry
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
            "mcast_grp": self.mcast_grp, "complete": self.complete,
            "workers": [dict(asdict(m), active=m.worker in self.active) for m in self.members],
            "modes": [{"slots": [s.low, s.high], "mode": Mode(s.mode).name.lower(),
                       "quorum": s.quorum} for s in self.segments()],
            "mode_entries": [{"slots": [r.low, r.high], "mode": Mode(r.mode).name.lower(),
                              "quorum": r.quorum, "priority": r.priority} for r in self.modes],
        }


@dataclass(slots=True)
class _State:
    """One read of everything the controller programs."""

    admitted: list[admission.Admitted]
    jobs: dict[int, admission.JobRow]
    modes: dict[int, list[ModeRange]]
    l2: dict[str, int]
    rewrites: dict[tuple[int, int], replication.Rewrite]
    groups: dict[int, MulticastGroup]
    problems: list[str] = field(default_factory=list)

    def job_ids(self) -> set[int]:
        ids = set(self.jobs) | set(self.modes) | {a.job_id for a in self.admitted}
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
        if row is None:
            return InstalledJob(job_id, 0, 0, 0, job_id, tuple(members), active,
                                tuple(self.modes.get(job_id, ())), complete=False)
        return InstalledJob(job_id, row.slot_base, row.slot_count, row.members, row.mcast_grp,
                            tuple(members), active, tuple(self.modes.get(job_id, ())))

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


@dataclass(frozen=True, slots=True)
class _Step:
    """An update and the update that undoes it (for rollback)."""

    update: Update
    undo: Update | None


def _steps_insert(entities: Iterable[TableEntry | MulticastGroup]) -> list[_Step]:
    return [_Step(insert(e), delete(e)) for e in entities]


def _steps_delete(entities: Iterable[TableEntry | MulticastGroup]) -> list[_Step]:
    return [_Step(delete(e), insert(e)) for e in entities]


def _step_modify(new: TableEntry | MulticastGroup, old: TableEntry | MulticastGroup) -> _Step:
    return _Step(modify(new), modify(old))


# ------------------------------------------------------------------ reports
@dataclass(frozen=True, slots=True)
class AddReport:
    job_id: int
    outcome: str  # installed | unchanged | replaced | repaired
    updates: int


@dataclass(frozen=True, slots=True)
class SwapReport:
    job_id: int
    slots: tuple[int, int]
    mode: Mode
    quorum: int
    strategy: str  # modify | insert | unchanged
    deleted: int  # entries made unreachable and removed


@dataclass(frozen=True, slots=True)
class MembershipReport:
    job_id: int
    worker: int
    members: int  # active count after the change
    quorums: tuple[tuple[int, int, int, int], ...] = ()  # (low, high, old, new) changed


@dataclass(slots=True)
class _Swap:
    mode: Mode
    quorum: int
    start: float
    baseline: int
    members: int


# ------------------------------------------------------------------ controller
class Controller:
    """Programs HySync jobs on one switch through a primary `Switch` session."""

    def __init__(self, switch: Switch) -> None:
        self.switch = switch
        self.jobs: dict[int, InstalledJob] = {}
        self.problems: list[str] = []
        self._swaps: dict[tuple[int, int, int], _Swap] = {}
        # Quorums lowered by exclude(), restored by readmit() in the same process.
        self._lowered: dict[tuple[int, int, int, int], int] = {}

    # ---------------------------------------------------------- state
    def attach(self) -> Controller:
        """Build the job registry from the switch's tables and groups (restart, new CLI)."""
        state = self._read()
        for problem in state.problems:
            log.warning("switch %s: %s", self.switch.grpc_addr, problem)
        return self

    def _read(self) -> _State:
        sw = self.switch
        tables = sw.read_tables([p4names.ADMISSION_MEMBERS, p4names.ADMISSION_JOBS,
                                 p4names.SYNC_MODE_MODES, p4names.FORWARDING_L2,
                                 p4names.REPLICATION_REWRITE])
        state = _State(
            admitted=[admission.Admitted.from_entry(e) for e in tables[p4names.ADMISSION_MEMBERS]],
            jobs={r.job_id: r
                  for r in map(admission.JobRow.from_entry, tables[p4names.ADMISSION_JOBS])},
            modes={}, l2=dict(map(forwarding.l2_of, tables[p4names.FORWARDING_L2])),
            rewrites={}, groups={g.group_id: g for g in sw.read_groups()})
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
        self.jobs = {}
        for job_id in sorted(state.job_ids()):
            job = state.installed(job_id)
            state.check(job)
            self.jobs[job_id] = job
        self.problems = state.problems
        return state

    def _job(self, state: _State, job_id: int) -> InstalledJob:
        job = self.jobs.get(job_id)
        if job is None or not job.complete:
            known = ", ".join(str(j) for j, v in self.jobs.items() if v.complete) or "none"
            raise UnknownJobError(
                f"no job {job_id} on the switch at {self.switch.grpc_addr} (installed jobs: "
                f"{known}); add it with `hysync job add FILE`")
        return job

    def job(self, job_id: int) -> InstalledJob:
        """The job as installed now (fresh read)."""
        return self._job(self._read(), job_id)

    def list_jobs(self) -> list[InstalledJob]:
        self._read()
        return list(self.jobs.values())

    # ---------------------------------------------------------- writes
    def _execute(self, phases: Sequence[Sequence[_Step]]) -> int:
        """Write each phase in one request, in order; on failure undo what succeeded."""
        done: list[_Step] = []
        written = 0
        for phase in phases:
            if not phase:
                continue
            try:
                self.switch.write([s.update for s in phase])
            except P4RuntimeError as err:
                failed = {i for i, _, _ in err.failures}
                if err.failures:  # the others in this request were applied
                    done += [s for i, s in enumerate(phase) if i not in failed]
                self._rollback(done)
                raise
            done += phase
            written += len(phase)
        return written

    def _rollback(self, done: list[_Step]) -> None:
        for step in reversed(done):
            if step.undo is None:
                continue
            try:
                self.switch.write([step.undo])
            except HySyncError as err:
                log.error("rollback of %s failed: %s", step.update, err)

    # ---------------------------------------------------------- jobs
    def add_job(self, job: JobConfig, *, replace: bool = False) -> AddReport:
        """Install a job: admission, jobs entry, base modes entry, multicast group, rewrite
        entries, l2 entries and flood ports. A job already installed with the same
        definition (slots, members) is left as it is (its modes and exclusions kept);
        installed differently it is an error unless `replace`."""
        state = self._read()
        outcome = "installed"
        if job.job_id in self.jobs:
            installed = self.jobs[job.job_id]
            diffs = installed.differences(job)
            if not diffs:
                repair = self._forwarding_steps(state, job.members, job.job_id)
                written = self._execute([repair])
                return AddReport(job.job_id, "repaired" if written else "unchanged", written)
            if not replace:
                raise JobError(
                    f"job {job.job_id} is already installed differently: {'; '.join(diffs)}; "
                    f"remove it first (`hysync job remove {job.job_id}`) or add it with "
                    "--replace")
            self.remove_job(job.job_id)
            state = self._read()
            outcome = "replaced"
        self._check_overlap(job)
        phase1 = self._forwarding_steps(state, job.members, job.job_id)
        phase1 += _steps_insert(replication.rewrite_entry(job.job_id, m) for m in job.members)
        phase1 += _steps_insert([replication.job_group(job.job_id, job.members)])
        phase1 += _steps_insert([ModeRange(job.job_id, *job.slots, job.mode, job.quorum).entry()])
        row = admission.JobRow(job.job_id, job.slot_base, job.slot_count, len(job.members),
                               job.job_id)
        phase2 = _steps_insert([row.entry()])
        phase3 = _steps_insert(admission.member_entry(job.job_id, m) for m in job.members)
        written = self._execute([phase1, phase2, phase3])
        self._read()
        log.info("job %d %s: %d updates", job.job_id, outcome, written)
        return AddReport(job.job_id, outcome, written)

    def _check_overlap(self, job: JobConfig) -> None:
        lo, hi = job.slots
        for other in self.jobs.values():
            if other.job_id == job.job_id or not other.complete:
                continue
            o_lo, o_hi = other.slots
            if lo <= o_hi and o_lo <= hi:
                raise JobError(
                    f"job {job.job_id} slots {lo}-{hi} overlap job {other.job_id} slots "
                    f"{o_lo}-{o_hi}: give job {job.job_id} a slot range outside {o_lo}-{o_hi}")

    def _forwarding_steps(self, state: _State, members: Iterable[Member],
                          job_id: int) -> list[_Step]:
        """l2 entries and flood ports the members need and the switch lacks."""
        steps: list[_Step] = []
        for mac, port in sorted({(m.mac, m.switch_port) for m in members}):
            have = state.l2.get(mac)
            if have is None:
                steps += _steps_insert([forwarding.l2_entry(mac, port)])
            elif have != port:
                users = [j.job_id for j in self.jobs.values()
                         if j.job_id != job_id and any(m.mac == mac for m in j.members)]
                by = f" (used by job {', '.join(map(str, users))})" if users else ""
                raise JobError(
                    f"MAC {mac} is on port {have} in the l2 table{by} but job {job_id} puts it "
                    f"on switch_port {port}: fix the job file's switch_port or the other job")
        ports = {m.switch_port for m in members}
        flood = state.groups.get(forwarding.FLOOD_GROUP)
        if flood is None:
            steps += _steps_insert([forwarding.flood_group(ports)])
        elif not ports <= flood.ports():
            steps.append(_step_modify(forwarding.flood_group(flood.ports() | ports), flood))
        return steps

    def remove_job(self, job_id: int) -> int:
        """Delete every entry of the job (also the traces of a partial install), and the
        l2 entries and flood ports no other job uses. Returns the number of updates."""
        state = self._read()
        if job_id not in self.jobs:
            known = ", ".join(map(str, self.jobs)) or "none"
            raise UnknownJobError(
                f"no job {job_id} on the switch at {self.switch.grpc_addr} (installed jobs: "
                f"{known}); `hysync job list` shows them")
        job = self.jobs[job_id]
        others = [j for j in self.jobs.values() if j.job_id != job_id]
        phase1 = _steps_delete(a.entry() for a in state.admitted if a.job_id == job_id)
        row = state.jobs.get(job_id)
        phase2 = _steps_delete([row.entry()] if row else [])
        phase3 = _steps_delete(r.entry() for r in state.modes.get(job_id, ()))
        group = state.groups.get(job_id)
        phase3 += _steps_delete([group] if group else [])
        phase3 += _steps_delete(replication.rewrite_entry(job_id, m) for m in job.members)
        other_macs = {m.mac for j in others for m in j.members}
        other_ports = {m.switch_port for j in others for m in j.members}
        for mac in sorted({m.mac for m in job.members} - other_macs):
            if mac in state.l2:
                phase3 += _steps_delete([forwarding.l2_entry(mac, state.l2[mac])])
        flood = state.groups.get(forwarding.FLOOD_GROUP)
        unused = {m.switch_port for m in job.members} - other_ports
        if flood is not None and unused & flood.ports():
            keep = flood.ports() - unused
            phase3.append(_step_modify(forwarding.flood_group(keep), flood) if keep
                          else _Step(delete(flood), insert(flood)))
        written = self._execute([phase1, phase2, phase3])
        self._swaps = {k: v for k, v in self._swaps.items() if k[0] != job_id}
        self._read()
        log.info("job %d removed: %d updates", job_id, written)
        return written

    # ---------------------------------------------------------- hot swap
    def set_mode(self, job_id: int, *, slots: tuple[int, int], mode: Mode,
                 quorum: int | None = None) -> SwapReport:
        """Set the desired mode of slots [a, b] (inclusive) of a job: one MODIFY when the
        range is exactly an existing entry's, else a higher-priority range entry (see
        `sync_mode.plan_set_mode`). Each slot latches it when its next round starts."""
        state = self._read()
        job = self._job(state, job_id)
        low, high = self._check_slots(job, slots)
        mode = Mode(mode)
        n = len(job.active)
        if mode == Mode.PARTIAL:
            if quorum is None or not 1 <= quorum <= n:
                raise ValidationError(
                    f"partial mode needs a quorum between 1 and {n} (job {job_id}'s active "
                    f"members), got {quorum}; pass --quorum Q with 1 <= Q <= {n}")
        elif quorum not in (None, 0):
            raise ValidationError(f"{mode.name.lower()} mode takes no quorum (it closes a round "
                                  "on every member / every contribution); leave it out")
        q = quorum if mode == Mode.PARTIAL and quorum is not None else 0
        first, then = sync_mode.plan_set_mode(job.modes, job_id, low, high, mode, q)
        self.switch.write(first)
        self.switch.write(then)
        strategy = ("unchanged" if not first
                    else "modify" if first[0].type == UpdateType.MODIFY else "insert")
        if first:
            self._swaps[(job_id, low, high)] = _Swap(mode, q, time.monotonic(),
                                                     self._contributions(job), n)
        self._read()
        log.info("job %d slots %d-%d -> %s (%s, %d unreachable entries deleted)", job_id, low,
                 high, sync_mode.format_mode(mode, q), strategy, len(then))
        return SwapReport(job_id, (low, high), mode, q, strategy, len(then))

    def wait_latched(self, job_id: int, slots: tuple[int, int], mode: Mode,
                     timeout: float = 30.0, poll: float = 0.05) -> float:
        """Wait until every slot of `slots` has latched `mode`; return the seconds since the
        swap was written (or since this call, for a swap another process made).

        The P4 program exposes no register reads, so latching is inferred from counters:
        a slot latches the desired mode when a round starts, so once every round that
        was open at the swap has closed, every later round of the range runs under the
        new mode. Rounds per slot are not observable through P4Runtime either, so this
        uses a conservative bound on the job's total contributions counter: the range
        is latched once it has advanced by at least (slots in the range x active
        members) since the modify. An open round needs at most `members` accepted
        contributions to close, so the bound holds when the contributions counted went
        to the range's slots, i.e. when the range is the job's whole slot range or the
        workers' traffic is confined to it. For a sub-range while the workers also use
        the job's other slots it is an estimate, not a proof: the slots outside the
        range take part of the contributions counted.
        """
        low, high = slots
        state = self._read()
        job = self._job(state, job_id)
        mode = Mode(mode)
        wrong = [s for s in sync_mode.effective(job.modes, low, high) if s.mode != mode]
        if wrong:
            s = wrong[0]
            raise ValidationError(
                f"slots {s.low}-{s.high} of job {job_id} are set to "
                f"{sync_mode.format_mode(s.mode, s.quorum)}, not {mode.name.lower()}: run "
                f"`hysync mode set {job_id} --slots {low}-{high} {mode.name.lower()}` first")
        swap = self._swaps.get((job_id, low, high))
        if swap is None or swap.mode != mode:
            swap = _Swap(mode, 0, time.monotonic(), self._contributions(job), len(job.active))
        needed = (high - low + 1) * swap.members
        deadline = time.monotonic() + timeout
        while True:
            advanced = self._contributions(job) - swap.baseline
            if advanced >= needed:
                return time.monotonic() - swap.start
            if time.monotonic() >= deadline:
                raise LatchTimeoutError(
                    f"slots {low}-{high} of job {job_id} have not all latched "
                    f"{mode.name.lower()} after {timeout:g} s: the job's contributions "
                    f"advanced {advanced} of the {needed} needed; are its workers sending?")
            time.sleep(poll)

    def _contributions(self, job: InstalledJob) -> int:
        cells = [(p4names.STATS_CONTRIBUTIONS, wire.member_index(job.job_id, m.worker))
                 for m in job.members]
        return sum(c.packets for c in self.switch.read_counter_cells(cells))

    def _check_slots(self, job: InstalledJob, slots: tuple[int, int]) -> tuple[int, int]:
        low, high = slots
        first, last = job.slots
        if low > high:
            raise ValidationError(f"slot range {low}-{high} is empty: write it low-high, "
                                  f"e.g. {high}-{low}")
        if low < first or high > last:
            raise ValidationError(f"slots {low}-{high} are outside job {job.job_id}'s slots "
                                  f"{first}-{last}: pick a range inside {first}-{last}")
        return low, high

    # ---------------------------------------------------------- membership
    def exclude(self, job_id: int, worker: int) -> MembershipReport:
        """Take a member out of the job: its admission entry goes (its packets are dropped
        as NOT_MEMBER), the job's member count drops to n-1 (open rounds stop waiting for
        it), its replica leaves the multicast group, and partial quorums above n-1 are
        lowered to n-1. Its rewrite entry stays, so a later readmit knows its address."""
        state = self._read()
        job = self._job(state, job_id)
        member = self._member(job, worker)
        if worker not in job.active:
            raise ValidationError(f"worker {worker} of job {job_id} is already excluded; "
                                  f"`hysync member readmit {job_id} {worker}` brings it back")
        n = len(job.active) - 1
        if n < 1:
            raise ValidationError(f"worker {worker} is the last active member of job {job_id}: "
                                  f"remove the job instead (`hysync job remove {job_id}`)")
        row = state.jobs[job_id]
        new_row = admission.JobRow(job_id, row.slot_base, row.slot_count, n, row.mcast_grp)
        group = state.groups.get(row.mcast_grp, MulticastGroup(row.mcast_grp))
        rid = wire.member_rid(job_id, worker)
        new_group = MulticastGroup(group.group_id,
                                   tuple(r for r in group.replicas if r.rid != rid))
        quorum_steps, changed = [], []
        for r in job.modes:
            if r.mode == Mode.PARTIAL and r.quorum > n:
                lowered = ModeRange(r.job_id, r.low, r.high, r.mode, n, r.priority)
                quorum_steps.append(_step_modify(lowered.entry(), r.entry()))
                changed.append((r.low, r.high, r.quorum, n))
                self._lowered[(job_id, r.low, r.high, r.priority)] = r.quorum
        self._execute([
            _steps_delete([admission.member_entry(job_id, member)]),
            [_step_modify(new_row.entry(), row.entry())],
            [_step_modify(new_group, group)],
            quorum_steps,
        ])
        self._read()
        log.info("job %d: worker %d excluded, %d active", job_id, worker, n)
        return MembershipReport(job_id, worker, n, tuple(changed))

    def readmit(self, job_id: int, worker: int) -> MembershipReport:
        """Reverse `exclude`: replica back in the group, member count n+1, then admission;
        quorums this process lowered at the exclusion are raised back."""
        state = self._read()
        job = self._job(state, job_id)
        member = self._member(job, worker)
        if worker in job.active:
            raise ValidationError(f"worker {worker} of job {job_id} is already an active "
                                  "member; nothing to readmit")
        if member.switch_port < 0:
            raise JobError(f"the switch port of worker {worker} of job {job_id} is unknown "
                           f"(no l2 entry for {member.mac}); re-add the job with --replace")
        n = len(job.active) + 1
        row = state.jobs[job_id]
        new_row = admission.JobRow(job_id, row.slot_base, row.slot_count, n, row.mcast_grp)
        group = state.groups.get(row.mcast_grp)
        replica = replication.replica(job_id, member)
        group_step = (_step_modify(MulticastGroup(group.group_id, (*group.replicas, replica)),
                                   group) if group is not None
                      else _steps_insert([MulticastGroup(row.mcast_grp, (replica,))])[0])
        quorum_steps, changed = [], []
        for r in job.modes:
            original = self._lowered.get((job_id, r.low, r.high, r.priority))
            if original is not None and r.mode == Mode.PARTIAL and r.quorum < original:
                q = min(original, n)
                raised = ModeRange(r.job_id, r.low, r.high, r.mode, q, r.priority)
                quorum_steps.append(_step_modify(raised.entry(), r.entry()))
                changed.append((r.low, r.high, r.quorum, q))
        self._execute([
            [group_step],
            [_step_modify(new_row.entry(), row.entry())],
            _steps_insert([admission.member_entry(job_id, member)]),
            quorum_steps,
        ])
        for low, high, _, q in changed:
            for key in [k for k in self._lowered if k[:3] == (job_id, low, high)]:
                if self._lowered[key] <= q:
                    del self._lowered[key]
        self._read()
        log.info("job %d: worker %d readmitted, %d active", job_id, worker, n)
        return MembershipReport(job_id, worker, n, tuple(changed))

    def _member(self, job: InstalledJob, worker: int) -> Member:
        member = job.member(worker)
        if member is None:
            workers = ", ".join(str(m.worker) for m in job.members) or "none"
            raise ValidationError(f"job {job.job_id} has no worker {worker} (its workers: "
                                  f"{workers})")
        return member

    # ---------------------------------------------------------- counters
    def stats(self, job_id: int) -> counters.JobStats:
        """Per-worker counters (every known member, excluded ones too) and drops by reason."""
        job = self._job(self._read(), job_id)
        return self._stats(job)

    def _stats(self, job: InstalledJob) -> counters.JobStats:
        workers = [m.worker for m in job.members] or sorted(job.active)
        read = self.switch.read_counter_cells(counters.cells(job.job_id, workers))
        return counters.collect(job.job_id, workers, job.active, read, time.monotonic())

    def rates(self, job_id: int, interval: float = 1.0) -> counters.JobRates:
        """Packets per second of every counter of the job, from two reads `interval` apart."""
        job = self._job(self._read(), job_id)
        before = self._stats(job)
        time.sleep(interval)
        return counters.rates_between(before, self._stats(job))


def _fmt_range(r: tuple[int, int]) -> str:
    return f"{r[0]}-{r[1]}"


def _fmt_members(members: Iterable[Member]) -> str:
    return "[" + ", ".join(f"{m.worker}@{m.ipv4}:{m.udp_port}/{m.mac}/port{m.switch_port}"
                           for m in sorted(members)) + "]"

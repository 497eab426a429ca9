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
| `admission.roles` entry (leaf with its uplink, or spine) | job spanning switches, per switch |
| `forwarding.l2` entry spine MAC -> uplink port | leaf, shared by the jobs on it |

A job that spans switches is installed on each of them by controlplane/testbed/fabric.py, one
`Controller` per switch: this one writes a switch's part, its role among them.

An excluded member keeps its rewrite entry (no replica refers to it): that is how
a fresh process knows the member's address to readmit it. Shared l2 entries and
flood ports are reference counted over the installed jobs' members: a job removal
deletes only those no other job uses.

Writes are ordered so that traffic never meets a half-installed job: egress and
forwarding state first, then the jobs entry, then admission (removal: the reverse).
A failed write rolls back the updates that had succeeded (best effort, logged; see
p4rt/transaction.py). What is installed is read back by tables/installed.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from hysync import p4names, wire
from hysync.controlplane.errors import (
    ControlPlaneError,
    JobError,
    UnknownJobError,
    ValidationError,
)
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.entities import (
    MulticastGroup,
    delete,
    insert,
)
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.p4rt.transaction import (
    Step,
    execute,
    step_modify,
    steps_delete,
    steps_insert,
)
from hysync.controlplane.tables import (
    admission,
    counters,
    forwarding,
    replication,
    roles,
    sync_mode,
)
from hysync.controlplane.tables.installed import InstalledJob, SwitchState, read_state
from hysync.controlplane.tables.roles import RoleRow
from hysync.controlplane.tables.sync_mode import ModeRange, ModeSetting
from hysync.wire import Mode

log = logging.getLogger(__name__)


class LatchTimeoutError(ControlPlaneError, TimeoutError):
    """The counters did not show every slot of a range latching the new mode in time."""


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
    setting: ModeSetting
    strategy: str  # modify | insert | unchanged
    deleted: int  # entries made unreachable and removed

    @property
    def mode(self) -> Mode:
        return self.setting.mode

    @property
    def quorum(self) -> int:
        return self.setting.quorum


@dataclass(frozen=True, slots=True)
class MembershipReport:
    job_id: int
    worker: int
    members: int  # active count after the change
    quorums: tuple[tuple[int, int, int, int], ...] = ()  # (low, high, old, new) changed


@dataclass(slots=True)
class _Swap:
    mode: Mode
    start: float
    baseline: int
    members: int


# ------------------------------------------------------------------ controller
class Controller:
    """Programs HySync jobs on one switch through a primary `Switch` session."""

    def __init__(self, switch: Switch, *, keep_macs: Iterable[str] = (),
                 keep_ports: Iterable[int] = ()) -> None:
        """`keep_macs` / `keep_ports`: l2 entries and flood ports that a deployment owns
        (controlplane/testbed/deploy.py); removing a job never deletes them."""
        self.switch = switch
        self.keep_macs = frozenset(keep_macs)
        self.keep_ports = frozenset(keep_ports)
        self.jobs: dict[int, InstalledJob] = {}
        self.problems: list[str] = []
        self._swaps: dict[tuple[int, int, int], _Swap] = {}
        # Quorums lowered by exclude(), restored by readmit() in the same process.
        self._lowered: dict[tuple[int, int, int, int], int] = {}
        # The epoch of each job's last install that this process removed: the next install
        # gets another install tag (admission.new_epoch).
        self._removed_epochs: dict[int, int] = {}

    # ---------------------------------------------------------- state
    @property
    def arch(self) -> str:
        """The architecture the switch's P4Info names (`v1model`, `tna`, `t2na`)."""
        return self.switch.schema.p4info.pkg_info.arch

    @property
    def hot_swaps_async(self) -> bool:
        """Whether a slot can enter or leave async by a hot swap on this switch
        (`sync_mode.async_swap_refusal`)."""
        return self.arch not in sync_mode.NO_ASYNC_SWAP_ARCHS

    def attach(self) -> Controller:
        """Build the job registry from the switch's tables and groups (restart, new CLI)."""
        state = self._read()
        for problem in state.problems:
            log.warning("switch %s: %s", self.switch.grpc_addr, problem)
        return self

    def _read(self) -> SwitchState:
        state = read_state(self.switch)
        self.jobs = {}
        for job_id in sorted(state.job_ids()):
            job = state.installed(job_id)
            state.check(job)
            self.jobs[job_id] = job
        self.problems = state.problems
        return state

    def _job(self, state: SwitchState, job_id: int) -> InstalledJob:
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

    # ---------------------------------------------------------- jobs
    def add_job(self, job: JobConfig, *, replace: bool = False, role: RoleRow | None = None,
                uplink_port: int | None = None, epoch: int | None = None) -> AddReport:
        """Install a job: admission, jobs entry, base modes entry, multicast group, rewrite
        entries, l2 entries and flood ports. A job already installed with the same
        definition (slots, members, role) is left as it is (its modes and exclusions kept);
        installed differently it is an error unless `replace`.

        A switch's part of a job across switches (controlplane/testbed/fabric.py) adds its `role`
        (written before the jobs entry), a leaf's l2 entry for the spine's MAC on
        `uplink_port`, and the install `epoch` that every switch of the job shares."""
        state = self._read()
        if role is not None:
            roles.check_roles(self.switch.schema, self.switch.grpc_addr, role.level)
        outcome = "installed"
        if job.job_id in self.jobs:
            installed = self.jobs[job.job_id]
            diffs = installed.differences(job)
            if installed.role != role:
                diffs.append(f"role {_role_text(installed.role)} installed, "
                             f"{_role_text(role)} asked")
            if not diffs:
                repair = self._forwarding_steps(state, job.members, job.job_id)
                written = execute(self.switch, [repair])
                return AddReport(job.job_id, "repaired" if written else "unchanged", written)
            if not replace:
                raise JobError(
                    f"job {job.job_id} is already installed differently: {'; '.join(diffs)}; "
                    f"remove it first (`hysync job remove {job.job_id}`) or add it with "
                    "--replace")
            self.remove_job(job.job_id)
            state = self._read()
            outcome = "replaced"
        self.check_overlap(job, role)
        phase1 = self._forwarding_steps(state, job.members, job.job_id)
        if role is not None and role.level == roles.LEAF and uplink_port is not None:
            phase1 += self._uplink_steps(state, role, uplink_port)
        phase1 += steps_insert(replication.rewrite_entry(job.job_id, m) for m in job.members)
        phase1 += steps_insert([replication.job_group(job.job_id, job.members)])
        phase1 += steps_insert([ModeRange(job.job_id, *job.slots, job.mode, job.quorum).entry()])
        if epoch is None:
            epoch = admission.new_epoch(self._removed_epochs.get(job.job_id))
        row = admission.JobRow(job.job_id, job.slot_base, job.slot_count, len(job.members),
                               job.job_id, epoch)
        # The role goes in the jobs entry's Write, before it (docs/protocol.md §11).
        phase2 = steps_insert([role.entry()] if role is not None else [])
        phase2 += steps_insert([row.entry()])
        phase3 = steps_insert(admission.member_entry(job.job_id, m) for m in job.members)
        written = execute(self.switch, [phase1, phase2, phase3])
        self._read()
        log.info("job %d %s: %d updates", job.job_id, outcome, written)
        return AddReport(job.job_id, outcome, written)

    def restore_job(self, job: InstalledJob, *, epoch: int | None = None,
                    uplink_port: int | None = None) -> AddReport:
        """Install `job` again as it was read from a switch that has since lost it (a
        restart): its members, the active ones admitted, every modes entry, under a new
        install epoch (`epoch`, the one every switch of a job across switches shares, else
        a fresh one). A leaf's part gets its l2 entry toward the spine on `uplink_port` as
        `add_job` gives it. A job installed now is left as it is ("unchanged")."""
        state = self._read()
        if job.job_id in self.jobs:
            return AddReport(job.job_id, "unchanged", 0)
        active = [m for m in job.members if m.worker in job.active]
        phase1 = self._forwarding_steps(state, job.members, job.job_id)
        if job.role is not None and job.role.level == roles.LEAF and uplink_port is not None:
            phase1 += self._uplink_steps(state, job.role, uplink_port)
        phase1 += steps_insert(replication.rewrite_entry(job.job_id, m) for m in job.members)
        phase1 += steps_insert([replication.job_group(job.job_id, active)])
        phase1 += steps_insert(r.entry() for r in job.modes)
        row = admission.JobRow(job.job_id, job.slot_base, job.slot_count, len(active),
                               job.mcast_grp, epoch or admission.new_epoch(job.epoch))
        phase2 = steps_insert([job.role.entry()] if job.role is not None else [])
        phase2 += steps_insert([row.entry()])
        phase3 = steps_insert(admission.member_entry(job.job_id, m) for m in active)
        written = execute(self.switch, [phase1, phase2, phase3])
        self._read()
        log.info("job %d restored: %d updates", job.job_id, written)
        return AddReport(job.job_id, "restored", written)

    def check_overlap(self, job: JobConfig, role: RoleRow | None = None) -> None:
        """Refuse a job whose slots or member addresses another installed job has. At a
        spine the members are leaves, whose one address every job across them shares (the
        members table tells their uplinks apart by job id)."""
        lo, hi = job.slots
        for other in self.jobs.values():
            if other.job_id == job.job_id or not other.complete:
                continue
            o_lo, o_hi = other.slots
            if lo <= o_hi and o_lo <= hi:
                raise JobError(
                    f"job {job.job_id} slots {lo}-{hi} overlap job {other.job_id} slots "
                    f"{o_lo}-{o_hi}: give job {job.job_id} a slot range outside {o_lo}-{o_hi}")
            # One address, one member: the switch attributes a member's packets (and its
            # liveness) by source address, so two jobs must not share one.
            if role is not None and role.level == roles.SPINE:
                continue
            taken = {(m.ipv4, m.udp_port): m.worker for m in other.members}
            for m in job.members:
                if (m.ipv4, m.udp_port) in taken:
                    raise JobError(
                        f"job {job.job_id} worker {m.worker} uses {m.ipv4}:{m.udp_port}, the "
                        f"address of job {other.job_id} worker {taken[m.ipv4, m.udp_port]}: "
                        "give each member of every job its own UDP port")

    def _forwarding_steps(self, state: SwitchState, members: Iterable[Member],
                          job_id: int) -> list[Step]:
        """l2 entries and flood ports the members need and the switch lacks."""
        steps: list[Step] = []
        for mac, port in sorted({(m.mac, m.switch_port) for m in members}):
            have = state.l2.get(mac)
            if have is None:
                steps += steps_insert([forwarding.l2_entry(mac, port)])
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
            steps += steps_insert([forwarding.flood_group(ports)])
        elif not ports <= flood.ports():
            steps.append(step_modify(forwarding.flood_group(flood.ports() | ports), flood))
        return steps

    def removed_epoch(self, job_id: int) -> int | None:
        """The epoch of the job's last install that this controller removed, if any."""
        return self._removed_epochs.get(job_id)

    def _uplink_steps(self, state: SwitchState, role: RoleRow, port: int) -> list[Step]:
        """A leaf's l2 entry toward its spine, where the switch lacks it."""
        mac = wire.bytes_to_mac(role.spine_mac.to_bytes(6, "big"))
        have = state.l2.get(mac)
        if have is None:
            return steps_insert([forwarding.l2_entry(mac, port)])
        if have != port:
            raise JobError(f"the spine's MAC {mac} is on port {have} in the l2 table of the "
                           f"switch at {self.switch.grpc_addr}, but the inventory puts the "
                           f"uplink on port {port}: fix the leaf's uplink_port or that entry")
        return []

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
        if job.epoch:
            self._removed_epochs[job_id] = job.epoch
        others = [j for j in self.jobs.values() if j.job_id != job_id]
        phase1 = steps_delete(a.entry() for a in state.admitted if a.job_id == job_id)
        row = state.jobs.get(job_id)
        phase2 = steps_delete([row.entry()] if row else [])
        phase3 = steps_delete(r.entry() for r in state.modes.get(job_id, ()))
        role = state.roles.get(job_id)
        phase3 += steps_delete([role.entry()] if role is not None else [])
        group = state.groups.get(job_id)
        phase3 += steps_delete([group] if group else [])
        phase3 += steps_delete(replication.rewrite_entry(job_id, m) for m in job.members)
        other_macs = {m.mac for j in others for m in j.members} | self.keep_macs
        other_ports = {m.switch_port for j in others for m in j.members} | self.keep_ports
        other_macs |= {_spine_mac(r) for j, r in state.roles.items()
                       if j != job_id and r.level == roles.LEAF}
        job_macs = {m.mac for m in job.members}
        if role is not None and role.level == roles.LEAF:
            job_macs.add(_spine_mac(role))
        for mac in sorted(job_macs - other_macs):
            if mac in state.l2:
                phase3 += steps_delete([forwarding.l2_entry(mac, state.l2[mac])])
        flood = state.groups.get(forwarding.FLOOD_GROUP)
        unused = {m.switch_port for m in job.members} - other_ports
        if flood is not None and unused & flood.ports():
            keep = flood.ports() - unused
            phase3.append(step_modify(forwarding.flood_group(keep), flood) if keep
                          else Step(delete(flood), insert(flood)))
        written = execute(self.switch, [phase1, phase2, phase3])
        self._swaps = {k: v for k, v in self._swaps.items() if k[0] != job_id}
        self._read()
        log.info("job %d removed: %d updates", job_id, written)
        return written

    # ---------------------------------------------------------- hot swap
    def set_mode(self, job_id: int, *, slots: tuple[int, int] | None = None, mode: Mode,
                 quorum: int | None = None) -> SwapReport:
        """Set the desired mode of slots [a, b] (inclusive; None: the job's whole range) of a
        job: one MODIFY when the range is exactly an existing entry's, else a
        higher-priority range entry (see `sync_mode.plan_set_mode`). Each slot latches it
        when its next round starts.

        One read of the switch; the setting is written once (the unreachable entries'
        deletions follow in a second write), and the registry takes the plan's entries
        instead of reading them back."""
        job = self._job(self._read(), job_id)
        low, high = self._check_slots(job, slots or job.slots)
        n = len(job.active)
        setting = ModeSetting.checked(mode, quorum, n, job_id)
        if setting.mode == Mode.ASYNC and job.role is not None:
            raise ValidationError(
                f"job {job_id} spans switches (this one is its {job.role.name}): async is not "
                "offered across switches (docs/protocol.md §11 \"Modes per level\"); set sync "
                "or partial at each level")
        refusal = sync_mode.async_swap_refusal(self.arch, job.modes, job_id, low, high,
                                               setting.mode)
        if refusal is not None:
            raise ValidationError(refusal)
        plan = sync_mode.plan_set_mode(job.modes, job_id, low, high, setting)
        self.switch.write(plan.first)
        self.switch.write(plan.then)
        self.jobs[job_id] = replace(job, modes=plan.modes)
        if plan.first:
            self._swaps[(job_id, low, high)] = _Swap(setting.mode, time.monotonic(),
                                                     self._contributions(job), n)
        log.info("job %d slots %d-%d -> %s (%s, %d unreachable entries deleted)", job_id, low,
                 high, setting, plan.strategy, len(plan.then))
        return SwapReport(job_id, (low, high), setting, plan.strategy, len(plan.then))

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
        mode = Mode(mode)
        swap = self._swaps.get((job_id, low, high))
        if swap is not None and swap.mode == mode and job_id in self.jobs:
            job = self.jobs[job_id]  # this controller's own swap: the registry holds it
        else:  # a swap another process made: what the switch holds now
            job = self._job(self._read(), job_id)
        wrong = [s for s in sync_mode.effective(job.modes, low, high) if s.mode != mode]
        if wrong:
            s = wrong[0]
            raise ValidationError(
                f"slots {s.low}-{s.high} of job {job_id} are set to "
                f"{sync_mode.format_mode(s.mode, s.quorum)}, not {mode.name.lower()}: run "
                f"`hysync mode set {job_id} --slots {low}-{high} {mode.name.lower()}` first")
        if swap is None or swap.mode != mode:
            swap = _Swap(mode, time.monotonic(), self._contributions(job), len(job.active))
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
        new_row = admission.JobRow(job_id, row.slot_base, row.slot_count, n, row.mcast_grp,
                                   row.epoch)
        group = state.groups.get(row.mcast_grp, MulticastGroup(row.mcast_grp))
        rid = wire.member_rid(job_id, worker)
        new_group = MulticastGroup(group.group_id,
                                   tuple(r for r in group.replicas if r.rid != rid))
        quorum_steps, changed = [], []
        for r in job.modes:
            if r.mode == Mode.PARTIAL and r.quorum > n:
                lowered = ModeRange(r.job_id, r.low, r.high, r.mode, n, r.priority)
                quorum_steps.append(step_modify(lowered.entry(), r.entry()))
                changed.append((r.low, r.high, r.quorum, n))
                self._lowered[(job_id, r.low, r.high, r.priority)] = r.quorum
        execute(self.switch, [
            steps_delete([admission.member_entry(job_id, member)]),
            [step_modify(new_row.entry(), row.entry())],
            [step_modify(new_group, group)],
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
        new_row = admission.JobRow(job_id, row.slot_base, row.slot_count, n, row.mcast_grp,
                                   row.epoch)
        group = state.groups.get(row.mcast_grp)
        replica = replication.replica(job_id, member)
        group_step = (step_modify(MulticastGroup(group.group_id, (*group.replicas, replica)),
                                   group) if group is not None
                      else steps_insert([MulticastGroup(row.mcast_grp, (replica,))])[0])
        quorum_steps, changed = [], []
        for r in job.modes:
            original = self._lowered.get((job_id, r.low, r.high, r.priority))
            if original is not None and r.mode == Mode.PARTIAL and r.quorum < original:
                q = min(original, n)
                raised = ModeRange(r.job_id, r.low, r.high, r.mode, q, r.priority)
                quorum_steps.append(step_modify(raised.entry(), r.entry()))
                changed.append((r.low, r.high, r.quorum, q))
        execute(self.switch, [
            [group_step],
            [step_modify(new_row.entry(), row.entry())],
            steps_insert([admission.member_entry(job_id, member)]),
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

    def all_stats(self) -> list[tuple[InstalledJob, counters.JobStats]]:
        """Every installed job with its counters, from one read of the tables."""
        self._read()
        return [(job, self._stats(job)) for job in self.jobs.values() if job.complete]

    def switch_stats(self) -> counters.SwitchStats:
        """Switch-wide drops by reason, whatever job id the dropped packets named."""
        return counters.SwitchStats.collect(self.switch.read_counter_cells(counters.SWITCH_CELLS))

    def rates(self, job_id: int, interval: float = 1.0) -> counters.JobRates:
        """Packets per second of every counter of the job, from two reads `interval` apart."""
        job = self._job(self._read(), job_id)
        before = self._stats(job)
        time.sleep(interval)
        return counters.rates_between(before, self._stats(job))



def _spine_mac(role: RoleRow) -> str:
    return wire.bytes_to_mac(role.spine_mac.to_bytes(6, "big"))


def _role_text(role: RoleRow | None) -> str:
    return "single" if role is None else role.describe()

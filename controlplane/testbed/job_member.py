"""Which member of an installed job a training process is, and where it sends.

A job installed from a job file (`hysync job add`, or across leaves and a spine
`hysync --inventory FILE job add`) fixes every member's address, its worker id and, across
switches, the leaf it sits behind. A process that joins such a job needs no serve: it reads
its member entry from the job file and its switch's data address from the inventory:
its leaf's (a host behind a leaf sends to its leaf, with its worker id there, docs/protocol.md
§11), or the one switch's.

A member is named `LEAF:WORKER` across switches (`leaf-1:0`) and `WORKER` on one switch;
without a name, rank r is the job's r-th member in the job's order (by leaf, then worker id).
"""

from __future__ import annotations

from dataclasses import dataclass

from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.testbed.inventory import Inventory, InventoryError, SwitchInfo

MEMBER_ENV = "HYSYNC_MEMBER"


@dataclass(frozen=True, slots=True)
class JobMember:
    """One member of an installed job, as its worker needs it."""

    member: Member
    leaf: str  # the leaf it sits behind; "" on one switch
    switch: SwitchInfo  # where it sends: its leaf, or the one switch
    members: int  # every member of the job (across switches: every host behind every leaf)

    @property
    def behind_leaf(self) -> bool:
        return bool(self.leaf)

    @property
    def name(self) -> str:
        return f"{self.leaf}:{self.member.worker}" if self.leaf else str(self.member.worker)


def member_names(job: JobConfig) -> list[str]:
    """The job's members by name, in the job's order (rank r is the r-th by default)."""
    if job.spans_switches:
        return [f"{lf}:{m.worker}" for m, lf in zip(job.members, job.leaves, strict=True)]
    return [str(m.worker) for m in job.members]


def job_member(inv: Inventory, job: JobConfig, rank: int, world: int,
               name: str | None = None) -> JobMember:
    """The member `name` of `job` (or the rank-th), with its switch from `inv`; every error
    is an `InventoryError` saying what to fix."""
    names = member_names(job)
    if world != len(names):
        raise InventoryError(
            f"job {job.job_id} has {len(names)} members and the process group {world} ranks: "
            f"run one rank per member of the job file")
    if name is None:
        name = names[rank]
    if name not in names:
        form = "LEAF:WORKER" if job.spans_switches else "WORKER"
        raise InventoryError(f"member {name!r} is not in job {job.job_id}: name one of "
                             f"{', '.join(names)} ({form})")
    index = names.index(name)
    member = job.members[index]
    if not job.spans_switches:
        if inv.fabric is not None:
            raise InventoryError(
                f"{inv.path} has leaves and a spine but job {job.job_id} names no member's "
                "leaf: give every [[members]] entry leaf = \"NAME\"")
        return JobMember(member, "", inv.switch, len(names))
    leaf = job.leaves[index]
    if inv.fabric is None:
        raise InventoryError(
            f"job {job.job_id} spans leaves ({', '.join(job.leaf_names())}) but {inv.path} "
            "describes one switch: use the inventory with their [[switches]]")
    try:
        switch = inv.fabric.leaf(leaf).switch
    except InventoryError as err:
        raise InventoryError(f"member {name} of job {job.job_id}: {err} in {inv.path}") from None
    return JobMember(member, leaf, switch, len(names))

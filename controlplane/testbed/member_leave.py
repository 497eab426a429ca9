"""A member of a job installed from a job file leaves it when its training is done, at
every level, so that the members still finishing their last steps never wait for it.

On one switch, as serve's leave does for an admitted job: the member is excluded (its
admission goes, the job's member count drops, its replica leaves the multicast group),
unless it is the job's last active member, which has nobody left to hold up.

Across switches (docs/protocol.md §11) the member is excluded at its leaf; when it is its
leaf's last active host, its rack is gone and the leaf is excluded at the spine instead,
so that the spine's rounds stop waiting for that leaf (unless it is the spine's last
active leaf). A leaf keeps its last host as a member: a job's member count never drops
to 0, and nothing sends to that leaf any more.

`leave_levels` is that rule, whatever session carries it out: a member of a job
installed from its job file (`leave`) opens a primary P4Runtime session with one switch
for each step, under the election id that `hysync` commands use by default (1), and
closes it when the exclusion is written; `hysync serve` across switches takes the same
steps through the sessions it holds.

The members of a job finish close together and the operator's `hysync` commands take
the same sessions: a switch that another live session holds is asked again until `wait`
seconds have passed. A switch that a `hysync serve` or `hysync deploy` held is left under
the inventory's election id where nobody holds it now (controlplane/testbed/election.py);
while a serve holds it the leave is refused: the serve's jobs leave through the serve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ControlPlaneError, NotPrimaryError
from hysync.controlplane.job import JobConfig
from hysync.controlplane.p4rt.switch import ElectionId, Switch
from hysync.controlplane.testbed.election import open_session
from hysync.controlplane.testbed.inventory import Inventory, SwitchInfo
from hysync.controlplane.testbed.job_member import JobMember

log = logging.getLogger(__name__)

DEFAULT_ELECTION_ID: ElectionId = (0, 1)  # `hysync`'s --election-id default
RETRY_S = 0.2  # between two arbitrations while another session holds the switch


class LeaveError(ControlPlaneError):
    """A member could not leave its job."""


@dataclass(frozen=True, slots=True)
class LeaveReport:
    member: str
    excluded_at: str  # the switch that excluded it: its leaf, the spine (with its leaf), or ""

    def text(self, job_id: int) -> str:
        if not self.excluded_at:
            return f"member {self.member} of job {job_id} was its last active member: it stays"
        return f"member {self.member} of job {job_id} left: excluded at {self.excluded_at}"


def leave(inv: Inventory, job: JobConfig, me: JobMember, *,
          election_id: ElectionId = DEFAULT_ELECTION_ID, timeout: float = 5.0,
          wait: float = 60.0) -> LeaveReport:
    """Take `me` out of `job` (installed from its job file on the switches of `inv`) at
    every level it holds others up, one session per switch; LeaveError says why it could
    not."""
    deadline = time.monotonic() + wait

    def exclude_at(info: SwitchInfo, worker: int) -> int | None:
        with _primary(info, election_id, timeout, deadline) as switch:
            return exclude_member(Controller(switch).attach(), job.job_id, worker)
    return leave_levels(inv, me, exclude_at)


def leave_levels(inv: Inventory, me: JobMember,
                 exclude_at: Callable[[SwitchInfo, int], int | None]) -> LeaveReport:
    """The leave's rule: `me` is excluded at its switch; behind a leaf where it was the
    leaf's last active host, the leaf is excluded at the spine instead. `exclude_at(switch,
    worker)` excludes `worker` on that switch (`exclude_member` through some session) and
    returns the members left active there, or None when it was the last one."""
    if exclude_at(me.switch, me.member.worker) is not None:
        return LeaveReport(me.name, me.leaf or me.switch.grpc_addr)
    if not me.behind_leaf:
        return LeaveReport(me.name, "")
    assert inv.fabric is not None  # job_member found its leaf there
    spine, leaf = inv.fabric.spine, inv.fabric.leaf(me.leaf)
    if exclude_at(spine.switch, leaf.uplink_id) is None:
        return LeaveReport(me.name, "")
    return LeaveReport(me.name, f"{spine.name} (its leaf {leaf.name} was done)")


def exclude_member(controller: Controller, job_id: int, worker: int) -> int | None:
    """Exclude `worker` from `job_id` through `controller` (a primary session with one
    switch); the members left active there, or None when it was the last active one (it
    stays; nothing is written)."""
    where = controller.switch.grpc_addr
    job = controller.jobs.get(job_id)
    if job is None or not job.complete:
        raise LeaveError(f"job {job_id} is not installed on the switch at {where}: "
                         "install it with `hysync --inventory FILE job add JOB_FILE` "
                         "before training")
    if worker not in {m.worker for m in job.members}:
        raise LeaveError(f"worker {worker} is not a member of job {job_id} on the switch "
                         f"at {where}: the job file does not match what is installed; "
                         "re-add it with --replace")
    if worker not in job.active:  # the operator excluded it: it holds nobody up
        return len(job.active)
    if len(job.active) == 1:
        return None
    report = controller.exclude(job_id, worker)
    log.info("job %d: worker %d excluded at %s, %d active", job_id, worker, where,
             report.members)
    return report.members


def _primary(info: SwitchInfo, election_id: ElectionId, timeout: float,
             deadline: float) -> Switch:
    """A primary session with the switch of `info`, asked again while another live
    session holds it."""
    while True:
        try:
            return open_session(info, election_id, timeout=timeout)
        except NotPrimaryError as err:
            if err.live is False or time.monotonic() >= deadline:
                raise LeaveError(f"cannot leave through the switch at {info.grpc_addr}: {err}; "
                                 "stop the session that holds it (a `hysync serve` takes "
                                 "its jobs' leaves itself)") from None
            time.sleep(RETRY_S)

"""A run's jobs across leaves and a spine (`runner.JobControl`), through the fabric
controller: each job installed on the spine and every leaf, modes swapped per level, the
adaptive policy run at every level, and members taken out as they finish.

The run names its workers 0..n-1 (their ranks); across switches a worker is member
`ids[w]` of leaf `leaves[w]` (its id among that leaf's hosts), and a leaf is member
`uplink_id` of the spine. A finished worker leaves as `hysync.torch`'s members of an
installed job do (controlplane/testbed/member_leave.py): excluded at its leaf; when it is
its leaf's last active host, its leaf is excluded at the spine instead, so that the
spine's rounds stop waiting for that rack.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig
from hysync.controlplane.policy.levels import LevelPolicies
from hysync.controlplane.policy.policies import Decision, PolicyConfig
from hysync.controlplane.testbed.fabric import FabricController
from hysync.topologies.runner import POLICY_INTERVAL_S, POLICY_TIME_SCALE
from hysync.wire import Mode


class _Levels:
    """The adaptive policy at every level; a leaf's decisions name the worker by rank."""

    def __init__(self, policies: LevelPolicies, ranks: dict[tuple[str, int], int]) -> None:
        self.policies, self.ranks = policies, ranks

    def step(self) -> list[tuple[str, Decision]]:
        made = []
        for level, d in self.policies.step():
            leaf = level.removeprefix("leaf:")
            if level != leaf and d.worker is not None:
                d = replace(d, worker=self.ranks[(leaf, d.worker)])
            made.append((level, d))
        return made

    def close(self) -> None:
        self.policies.close()


class FabricJobs:
    """`runner.JobControl` across switches: worker w is member `ids[w]` of leaf `leaves[w]`."""

    def __init__(self, fabric: FabricController, leaves: tuple[str, ...],
                 ids: tuple[int, ...]) -> None:
        self.fabric, self.leaves, self.ids = fabric, leaves, ids

    def _leaf(self, worker: int) -> Controller:
        return self.fabric.controller(self.fabric.fabric.leaf(self.leaves[worker]))

    def add_job(self, job: JobConfig) -> None:
        self.fabric.add_job(job)

    def remove_job(self, job_id: int) -> None:
        self.fabric.remove_job(job_id)

    def set_mode(self, job_id: int, *, slots: tuple[int, int], mode: Mode,
                 quorum: int | None, level: str = "") -> None:
        self.fabric.set_mode(job_id, level=level or None, slots=slots, mode=mode, quorum=quorum)

    def active(self, job_id: int) -> set[int]:
        """The workers active at their leaf (the spine's policy never excludes a leaf)."""
        return {w for w in range(len(self.leaves))
                if self.ids[w] in self._leaf(w).job(job_id).active}

    def exclude(self, job_id: int, worker: int) -> str | None:
        leaf = self._leaf(worker)
        active = leaf.job(job_id).active
        if self.ids[worker] not in active:
            return None
        if len(active) > 1:
            leaf.exclude(job_id, self.ids[worker])
            return f"leaf {self.leaves[worker]}"
        uplink = self.fabric.fabric.leaf(self.leaves[worker]).uplink_id
        spine = self.fabric.controller(self.fabric.fabric.spine)
        at_spine = spine.job(job_id).active
        if uplink not in at_spine or len(at_spine) == 1:
            return None  # the job's last active member: nobody left to hold up
        spine.exclude(job_id, uplink)
        return f"the spine (its leaf {self.leaves[worker]} was done)"

    def readmit(self, job_id: int, worker: int) -> None:
        self._leaf(worker).readmit(job_id, self.ids[worker])

    def policy(self, job_id: int, log_path: Path) -> _Levels:
        fabric = self.fabric.fabric
        levels = [("spine", self.fabric.controller(fabric.spine)),
                  *((f"leaf:{leaf.name}", self.fabric.controller(leaf)) for leaf in fabric.leaves)]
        policies = LevelPolicies(levels, job_id, interval=POLICY_INTERVAL_S, log_path=log_path,
                                 config=PolicyConfig().scaled(POLICY_TIME_SCALE))
        ranks = {(leaf, i): w for w, (leaf, i) in enumerate(zip(self.leaves, self.ids,
                                                                strict=True))}
        return _Levels(policies, ranks)

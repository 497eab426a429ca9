"""The runner's control of a job across a spine and two leaves (topologies/fabric_jobs.py),
over real P4Runtime on three softswitch processes on loopback (no root): a mode swap at one
level, finished workers leaving at their leaf and then their leaf at the spine, the last
member staying, readmission at the leaf, and the adaptive policy at every level."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from hysync.controlplane.controller import Controller
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.testbed.fabric import FabricController
from hysync.controlplane.testbed.inventory import Inventory
from hysync.topologies.fabric_jobs import FabricJobs
from hysync.wire import Mode
from tests.softswitch.switch_process import softswitch_fabric

JOB, SLOTS = 1, (0, 3)
LEAVES = ("leaf-0", "leaf-0", "leaf-1", "leaf-1")  # workers 0-1 behind leaf-0, 2-3 leaf-1
IDS = (0, 1, 0, 1)


def modes(controller: Controller) -> set[tuple[Mode, int]]:
    controller._read()  # what the switch holds now
    return {(m.mode, m.quorum) for m in controller.job(JOB).modes}


def test_fabric_jobs_swap_a_level_and_take_finished_workers_out_level_by_level(
        tmp_path: Path) -> None:
    with ExitStack() as stack:
        fab = stack.enter_context(softswitch_fabric(tmp_path, leaves=2, hosts=2,
                                                    engine="native"))
        fabric = Inventory.load(fab.inventory).fabric
        assert fabric is not None
        controllers = {sw.name: Controller(stack.enter_context(Switch(sw.switch.grpc_addr)))
                       .attach() for sw in fabric.switches}
        jobs = FabricJobs(FabricController(fabric, controllers), LEAVES, IDS)
        members = tuple(Member(i, f"{fab.net}.10", f"02:00:00:00:1{w // 2}:{i + 1:02x}",
                               40000 + w, i + 1) for w, i in enumerate(IDS))
        jobs.add_job(JobConfig(JOB, members, SLOTS[0], SLOTS[1] + 1, leaves=LEAVES))
        assert jobs.active(JOB) == {0, 1, 2, 3}

        jobs.set_mode(JOB, slots=SLOTS, mode=Mode.PARTIAL, quorum=1, level="spine")
        spine, leaf0, leaf1 = (controllers[n] for n in ("spine", "leaf-0", "leaf-1"))
        assert modes(spine) == {(Mode.PARTIAL, 1)}
        assert modes(leaf0) == modes(leaf1) == {(Mode.SYNC, 0)}

        levels = jobs.policy(JOB, tmp_path / "policy.jsonl")
        try:
            assert [r.level for r in levels.policies.runners] == [
                "spine", "leaf:leaf-0", "leaf:leaf-1"]
            for level, decision in levels.step():  # a leaf's decision names a rank
                assert level in ("spine", "leaf:leaf-0", "leaf:leaf-1"), level
                assert decision.worker is None or 0 <= decision.worker < len(LEAVES)
        finally:
            levels.close()

        assert jobs.exclude(JOB, 0) == "leaf leaf-0"
        assert jobs.active(JOB) == {1, 2, 3} and leaf0.job(JOB).active == {1}
        # leaf-0's last host: its rack is done, so leaf-0 leaves the spine instead
        assert jobs.exclude(JOB, 1) == "the spine (its leaf leaf-0 was done)"
        assert leaf0.job(JOB).active == {1} and spine.job(JOB).active == {1}
        assert jobs.exclude(JOB, 0) is None  # already out
        assert jobs.exclude(JOB, 2) == "leaf leaf-1"
        assert jobs.exclude(JOB, 3) is None  # the job's last active member stays
        assert spine.job(JOB).active == {1} and leaf1.job(JOB).active == {1}
        jobs.readmit(JOB, 2)
        assert leaf1.job(JOB).active == {0, 1} and 2 in jobs.active(JOB)

        jobs.remove_job(JOB)
        assert all(JOB not in c.jobs for c in controllers.values())

"""`hysync deploy` and `teardown` of a testbed of leaves and a spine: each switch as the
one-switch testbed `Inventory.of_switch` makes of it (controlplane/testbed/deploy.py does
the work on each).

Deploy gives every switch the inventory's pipeline, and each leaf the forwarding of the
hosts on its ports; the spine gets no forwarding of its own (its ports are the leaves',
which a job across switches programs when it is installed). Spine first, then the leaves.

Teardown first removes the jobs across switches (those the spine holds with the
inventory's leaves as members) from every switch, leaves first, then what deploy and the
leaves' own jobs wrote on each leaf. Entries of anything else stay.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hysync.controlplane.controller import Controller
from hysync.controlplane.testbed import deploy
from hysync.controlplane.testbed.fabric import FabricController
from hysync.controlplane.testbed.inventory import Inventory


def deploy_fabric(inv: Inventory, *, dry_run: bool = False, replace_pipeline: bool = False,
                  timeout: float = 5.0) -> list[tuple[str, Inventory, deploy.DeployReport]]:
    """Deploy every switch of the fabric: (switch name, its one-switch view, its report)."""
    assert inv.fabric is not None
    done = []
    for sw in inv.fabric.switches:
        view = inv.of_switch(sw)
        done.append((sw.name, view, deploy.deploy(view, dry_run=dry_run,
                                                  replace_pipeline=replace_pipeline,
                                                  timeout=timeout)))
    return done


def teardown_fabric(inv: Inventory, *, dry_run: bool = False, timeout: float = 5.0,
                    say: Callable[[str], None] = lambda _: None) -> int:
    """Remove the jobs across the fabric, then each leaf's deployment and jobs; the number
    of updates (dry run: that would be made)."""
    assert inv.fabric is not None
    fabric = inv.fabric
    written = 0
    with contextlib.ExitStack() as stack:
        controllers: dict[str, Controller] = {}
        for sw in fabric.switches:
            switch = stack.enter_context(deploy.connect(inv.of_switch(sw), read_only=dry_run,
                                                        timeout=timeout))
            if not switch.has_pipeline:
                say(f"{sw.name}: the switch has no pipeline: nothing to remove there")
                continue
            controllers[sw.name] = Controller(switch).attach()
        spine = controllers.get(fabric.spine.name)
        leaf_macs = {leaf.switch.data_mac.lower() for leaf in fabric.leaves}
        across = [] if spine is None else [
            j for j in spine.list_jobs()
            if j.members and all(m.mac.lower() in leaf_macs for m in j.members)]
        for job in across:
            if dry_run:
                say(f"would remove job {job.job_id} (slots {job.slots[0]}-{job.slots[1]}) "
                    "from every switch")
                continue
            if len(controllers) == len(fabric.switches):
                removed = FabricController(fabric, controllers).remove_job(job.job_id)
            else:  # a leaf without a pipeline holds nothing
                removed = ((fabric.spine.name, controllers[fabric.spine.name].remove_job(
                    job.job_id)),)
            for name, n in removed:
                say(f"{name}: job {job.job_id} removed ({n} updates)")
                written += n
    for leaf in fabric.leaves:
        written += deploy.teardown(inv.of_switch(leaf), dry_run=dry_run, timeout=timeout,
                                   say=lambda line, name=leaf.name: say(f"{name}: {line}"))
    return written

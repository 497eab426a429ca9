"""HySync control plane: P4Runtime client, jobs, membership, mode hot swap, counters, CLI.

    from hysync.controlplane import Controller, JobConfig, Switch

    with Switch("127.0.0.1:9559") as switch:
        controller = Controller(switch).attach()
        controller.add_job(JobConfig.load("controlplane/examples/job-loopback.toml"))
"""

from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import ControlPlaneError
from hysync.controlplane.job import JobConfig, Member
from hysync.controlplane.p4rt.switch import Switch
from hysync.controlplane.tables.installed import InstalledJob
from hysync.p4schema import Schema

__all__ = ["ControlPlaneError", "Controller", "InstalledJob", "JobConfig", "Member", "Schema",
           "Switch"]

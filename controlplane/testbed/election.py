"""The election id of a short session with a switch of an inventory: an operator's
`hysync --inventory FILE` command, or a job-file member's leave (member_leave.py).

They take the id they are given (`hysync`'s default, 1), so that they queue behind each
other and never take a switch from a live `hysync serve`. A switch that a serve or `hysync
deploy` held remembers the inventory's higher id and elects nothing lower until it
restarts (P4Runtime election ids only go up): where no controller is primary there now,
the session takes the inventory's id instead, which takes the switch from nobody.
"""

from __future__ import annotations

from hysync.controlplane.errors import NotPrimaryError
from hysync.controlplane.p4rt.switch import ElectionId, Switch
from hysync.controlplane.testbed.inventory import SwitchInfo


def open_session(info: SwitchInfo, election_id: ElectionId, *, timeout: float,
                 arbitrate: bool = True) -> Switch:
    """A session with the switch of `info` under `election_id`, or under the inventory's
    where the switch elects no lower id and no controller holds it; NotPrimaryError else."""
    try:
        return Switch(info.grpc_addr, device_id=info.device_id, election_id=election_id,
                      timeout=timeout, arbitrate=arbitrate, tls=info.tls)
    except NotPrimaryError as err:
        seen = err.primary
        if (err.live is not False or info.election_id <= election_id
                or (seen is not None and seen > info.election_id)):
            raise
    return Switch(info.grpc_addr, device_id=info.device_id, election_id=info.election_id,
                  timeout=timeout, arbitrate=arbitrate, tls=info.tls)

"""Three transports on loopback, members of one job a softswitch runs in partial(2): the
setting of the tests of a contribution held in an open round (parking, Transport.finish)."""

from __future__ import annotations

import threading

from hysync.wire import Mode
from hysync.worker.config import TransportConfig
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport
from tests.worker.conftest import Job

MEMBERS = 3
QUORUM = 2
# Generous: a call ends when the switch lets it, however long a loaded machine takes.
CALL_WAIT_S = 120.0


def partial_member(switch, job: int, base: int, slots: int, worker: int, *, rto: float,
                   rto_max: float, stall_after: float) -> Transport:
    """Worker `worker`'s transport, its timers as given (the first RTO is the minimum)."""
    config = TransportConfig(job_id=job, worker_id=worker, switch_host="127.0.0.1",
                             switch_port=switch.address[1], bind_host="127.0.0.1",
                             slot_base=base, slot_count=slots, members=MEMBERS,
                             rto_initial=rto, rto_min=rto, rto_max=rto_max,
                             stall_after=stall_after, dead_after=20.0, seed=worker)
    return Transport(config, FixedPointQuantizer(2.0**20, MEMBERS))


def install_partial(switch, job: int, base: int, slots: int,
                    members: tuple[Transport, ...]) -> None:
    switch.install(Job(job, base, slots, [(w, *t.address) for w, t in enumerate(members)]),
                   Mode.PARTIAL, quorum=QUORUM)


def together(*calls) -> None:
    """Run `calls` at once, each on its own thread, and wait until every one has ended."""
    threads = [threading.Thread(target=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=CALL_WAIT_S)
    assert not any(t.is_alive() for t in threads), f"a call did not end in {CALL_WAIT_S:g} s"

"""Fixtures of the worker tests: an in-process softswitch served over UDP.

`Switch.install` and `Switch.set_mode` are the only code here that knows table
entries: when the team moves these tests onto the real controller, they are the
two functions to replace.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from hysync import p4names, wire
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.tables import Entry, Replica
from hysync.softswitch.udp_dataplane import UdpDataPlane
from hysync.wire import Mode

MODE_PRIORITY = 10


@dataclass
class Job:
    job_id: int
    slot_base: int
    slot_count: int
    members: list[tuple[int, str, int]]  # (worker id, ip, udp port) as the switch sees them


@dataclass
class Switch:
    pipeline: Pipeline
    dataplane: UdpDataPlane

    @property
    def address(self) -> tuple[str, int]:
        return self.dataplane.address

    def install(self, job: Job, mode: Mode = Mode.SYNC, quorum: int = 0) -> None:
        """Admit every member; configure the job, its mode, the rewrites and the group."""
        p = self.pipeline
        group = job.job_id  # job groups are below FLOOD_MCAST_GROUP
        replicas = []
        for worker_id, ip, port in job.members:
            p.write_entry("INSERT", Entry(p4names.ADMISSION_MEMBERS,
                                          (job.job_id, worker_id, wire.ip_to_int(ip), port),
                                          p4names.ADMISSION_ADMIT))
            rid = wire.member_rid(job.job_id, worker_id)
            p.write_entry("INSERT", Entry(p4names.REPLICATION_REWRITE, (rid,),
                                          p4names.REPLICATION_REWRITE_DST,
                                          (0, wire.ip_to_int(ip), port)))
            replicas.append(Replica(port=1, rid=rid))
        p.write_group("INSERT", group, replicas)
        p.write_entry("INSERT", Entry(p4names.ADMISSION_JOBS, (job.job_id,),
                                      p4names.ADMISSION_SET_JOB,
                                      (job.slot_base, job.slot_count, len(job.members), group,
                                       1)))
        p.write_entry("INSERT", _mode_entry(job, mode, quorum))

    def set_mode(self, job: Job, mode: Mode, quorum: int = 0) -> None:
        """Hot-swap the job's desired mode: one MODIFY of its modes entry."""
        self.pipeline.write_entry("MODIFY", _mode_entry(job, mode, quorum))


def _mode_entry(job: Job, mode: Mode, quorum: int) -> Entry:
    last = job.slot_base + job.slot_count - 1
    return Entry(p4names.SYNC_MODE_MODES, (job.job_id, (job.slot_base, last)),
                 p4names.SYNC_MODE_SET_MODE,
                 (int(mode), quorum), priority=MODE_PRIORITY)


@pytest.fixture
def switch() -> Iterator[Switch]:
    pipeline = Pipeline()
    dataplane = UdpDataPlane(pipeline, "127.0.0.1", 0).start()
    try:
        yield Switch(pipeline, dataplane)
    finally:
        dataplane.stop()


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A UDP port on 127.0.0.1 that never answers: bound here for the whole test and never
    read, so no other process on the machine can take it and reply."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]

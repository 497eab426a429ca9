"""The targets the conformance suite runs on, behind one small interface.

A target takes table writes (as plain tuples, the P4Info names of
docs/protocol.md §8), multicast groups and frames on numbered ports, and returns
the frames it emits. Configuration is written directly, not through the
controller, so the suite pins the data plane alone.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hysync import p4names, wire
from hysync.softswitch.native import NativePipeline
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.tables import Entry, Replica

from .topology import PORTS, Job

REPO = Path(__file__).resolve().parents[2]
P4INFO = REPO / "p4src" / "v1model" / "hysync.p4info.txtpb"


@dataclass(frozen=True)
class Write:
    table: str
    match: tuple
    action: str
    params: tuple = ()
    priority: int = 0


def job_writes(job: Job, mode: int = wire.Mode.SYNC, quorum: int = 0,
               active: tuple[int, ...] | None = None) -> list[Write]:
    """Table entries for a job: admission, job config, one mode range, replica rewrites."""
    members = [m for m in job.members if active is None or m.worker in active]
    writes = [Write(p4names.ADMISSION_MEMBERS, (job.job_id, m.worker, m.ip, m.udp_port),
                    p4names.ADMISSION_ADMIT) for m in members]
    writes.append(Write(p4names.ADMISSION_JOBS, (job.job_id,), p4names.ADMISSION_SET_JOB,
                        (job.slot_base, job.slot_count, len(members), job.job_id,
                         job.epoch)))
    writes.append(mode_write(job, mode, quorum))
    writes += [Write(p4names.REPLICATION_REWRITE, (wire.member_rid(job.job_id, m.worker),),
                     p4names.REPLICATION_REWRITE_DST,
                     (int.from_bytes(m.mac, "big"), m.ip, m.udp_port)) for m in job.members]
    return writes


def mode_write(job: Job, mode: int, quorum: int, lo: int | None = None, hi: int | None = None,
               priority: int = 1) -> Write:
    lo = job.slot_base if lo is None else lo
    hi = job.slot_base + job.slot_count - 1 if hi is None else hi
    return Write(p4names.SYNC_MODE_MODES, (job.job_id, (lo, hi)), p4names.SYNC_MODE_SET_MODE,
                 (mode, quorum), priority)


def job_group(job: Job, active: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
    return [(m.port, wire.member_rid(job.job_id, m.worker)) for m in job.members
            if active is None or m.worker in active]


class SoftswitchTarget:
    """The reference model, in process: frames in, frames out."""

    name = "softswitch"
    engine: type[Pipeline] = Pipeline

    def __init__(self, num_slots: int = wire.NUM_SLOTS) -> None:
        self.pipeline = self.engine(num_slots)
        self.write_group("INSERT", wire.FLOOD_MCAST_GROUP, [(p, 0) for p in PORTS])

    def restart(self) -> None:
        """A power cycle: every register, entry and group is gone; the pipeline and the flood
        group come back (what `hysync deploy` gives a restarted switch), no job."""
        self.__init__(self.pipeline.num_slots)  # type: ignore[misc]

    def write(self, update: str, w: Write) -> None:
        self.pipeline.write_entry(update, Entry(w.table, w.match, w.action, w.params, w.priority))

    def write_group(self, update: str, group: int, replicas: list[tuple[int, int]]) -> None:
        self.pipeline.write_group(update, group, [Replica(p, r) for p, r in replicas])

    def send(self, port: int, frame: bytes) -> list[tuple[int, bytes]]:
        return sorted(self.pipeline.process_frame(port, frame))

    def counter(self, name: str, index: int) -> int:
        return self.pipeline.counters[name].packets[index]

    def close(self) -> None:
        pass


class NativeTarget(SoftswitchTarget):
    """The compiled data plane (native/dataplane/), in process: the softswitch's default."""

    name = "native"
    engine = NativePipeline


def bmv2_unavailable() -> str | None:
    """Why the BMv2 target cannot run here, or None if it can."""
    if shutil.which("simple_switch_grpc") is None:
        return "simple_switch_grpc is not on PATH (install BMv2 with PI/P4Runtime support)"
    if shutil.which("p4c") is None:
        return "p4c is not on PATH: the BMv2 JSON of p4src/v1model/hysync.p4 cannot be built"
    if os.geteuid() != 0:
        return "the BMv2 target needs root to create its network namespace and veth ports"
    return None

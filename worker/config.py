"""`TransportConfig`: what a worker's transport needs to know, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from hysync import wire


@dataclass
class TransportConfig:
    job_id: int
    worker_id: int
    switch_host: str
    switch_port: int = wire.HYSYNC_UDP_PORT
    bind_host: str = "0.0.0.0"
    bind_port: int = 0
    # A UDP socket already bound to bind_host:bind_port, passed by whoever reserved the
    # address (a launcher's inherited descriptor): the transport takes it over instead of
    # binding, so no other process can take the port between its choice and the bind.
    bind_fd: int | None = None
    slot_base: int = 0
    slot_count: int = 64  # the window W: slots this job owns, all in flight at once
    members: int = 1  # n: sizes the quantizer's clipping bound
    rto_initial: float = 0.02
    rto_min: float = 0.002
    rto_max: float = 0.5
    dead_after: float = 5.0
    # partial: park a silent contribution this long after it left if the switch answered
    # others meanwhile (else at its first timeout); docs/protocol.md, partial liveness
    stall_after: float = 0.005
    missed_after: float = 0.25  # a skipped round not here after this long was missed
    # A call stuck this long offers its idle slots' rounds a JOIN. Longer than rto_max: a call
    # waiting out a retransmission back-off is repairing a loss, not deadlocked, and a JOIN
    # then shifts which calls' chunks meet on a slot (a dangling round after a job's last call).
    join_after: float = 1.0
    staleness_decay: float = 1.0
    recv_buffer: int = 32 * 1024 * 1024
    seed: int | None = None  # seeds the async sequence starts

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.job_id < wire.MAX_JOBS, "job_id", f"1..{wire.MAX_JOBS - 1}"),
            (0 <= self.worker_id < wire.MAX_WORKERS, "worker_id", f"0..{wire.MAX_WORKERS - 1}"),
            (1 <= self.members <= wire.MAX_WORKERS, "members", f"1..{wire.MAX_WORKERS}"),
            (self.slot_base >= 0 and self.slot_count >= 1
             and self.slot_base + self.slot_count <= wire.NUM_SLOTS, "slot_base/slot_count",
             f"a range inside 0..{wire.NUM_SLOTS - 1}"),
            (0 < self.rto_min <= self.rto_initial <= self.rto_max, "rto_min/rto_initial/rto_max",
             "0 < rto_min <= rto_initial <= rto_max"),
            (self.dead_after > 0, "dead_after", "a positive number of seconds"),
            (self.missed_after > 0, "missed_after", "a positive number of seconds"),
            (self.stall_after > 0, "stall_after", "a positive number of seconds"),
            (self.join_after > 0, "join_after", "a positive number of seconds"),
            (0.0 <= self.staleness_decay <= 1.0, "staleness_decay", "0.0..1.0 (1.0 = off)"),
            (0 <= self.switch_port < 65536 and 0 <= self.bind_port < 65536, "switch_port/bind_port",
             "0..65535"),
        ]
        for ok, name, fix in checks:
            if not ok:
                raise ValueError(f"TransportConfig.{name} is invalid: must be {fix}")

    @property
    def switch_address(self) -> tuple[str, int]:
        return self.switch_host, self.switch_port

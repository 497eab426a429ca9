"""`TransportConfig`: what a worker's transport needs to know, validated on construction.

The engine's settings take their defaults from the engine's own configuration
(native/worker/config.h, `hysync._core.worker.EngineConfig`), the one place they are written:
what each means is said there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hysync import _core, wire

_DEFAULTS = _core.worker.EngineConfig()
# The fields TransportConfig hands the engine as they are (engine_config adds the switch's
# address, the quantizer's scale and the seed).
ENGINE_FIELDS = ("job_id", "worker_id", "slot_base", "slot_count", "members", "rto_initial",
                 "rto_min", "rto_max", "dead_after", "stall_after", "missed_after", "join_after",
                 "staleness_decay", "install_tag", "behind_leaf")


def engine_config(**fields: Any) -> Any:
    """A `hysync._core.worker.EngineConfig`: the engine's defaults, with `fields` set."""
    config = _core.worker.EngineConfig()
    for name, value in fields.items():
        if not hasattr(config, name):
            raise TypeError(f"engine_config: no engine setting {name!r}")
        setattr(config, name, value)
    return config


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
    slot_base: int = _DEFAULTS.slot_base
    slot_count: int = _DEFAULTS.slot_count  # the window W
    members: int = _DEFAULTS.members
    rto_initial: float = _DEFAULTS.rto_initial
    rto_min: float = _DEFAULTS.rto_min
    rto_max: float = _DEFAULTS.rto_max
    dead_after: float = _DEFAULTS.dead_after
    stall_after: float = _DEFAULTS.stall_after
    missed_after: float = _DEFAULTS.missed_after
    join_after: float = _DEFAULTS.join_after
    staleness_decay: float = _DEFAULTS.staleness_decay
    # The low byte of the job's install epoch, as serve's admit gives it (wire.install_tag):
    # a reply of a newer state of the switch is told apart from the first. -1: unknown.
    install_tag: int = _DEFAULTS.install_tag
    # The switch is a leaf of a job that spans switches (docs/protocol.md §11).
    behind_leaf: bool = _DEFAULTS.behind_leaf
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
            (-1 <= self.install_tag <= 255, "install_tag",
             "the low byte of the job's install epoch, 0..255 (-1: unknown)"),
            (0 <= self.switch_port < 65536 and 0 <= self.bind_port < 65536, "switch_port/bind_port",
             "0..65535"),
        ]
        for ok, name, fix in checks:
            if not ok:
                raise ValueError(f"TransportConfig.{name} is invalid: must be {fix}")

    @property
    def switch_address(self) -> tuple[str, int]:
        return self.switch_host, self.switch_port

    def engine_config(self, switch_ip: str, scale: float, seed: int) -> Any:
        """The engine's configuration for this transport: the switch at `switch_ip` (resolved
        from switch_host), the quantizer's `scale`, `seed` for the async sequence starts."""
        return engine_config(switch_ip=switch_ip, switch_port=self.switch_port, scale=scale,
                             seed=seed, **{name: getattr(self, name) for name in ENGINE_FIELDS})

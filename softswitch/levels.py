"""A switch's level in a job that spans switches (docs/protocol.md §11): what the controller
sets per job on the reference pipeline, and the checks that keep a bad setting out.

`single` is §4 as it stands (a job with no role set); a `leaf` closes rounds over its hosts
and sends each closed sum up to its spine over its `Uplink`; a `spine` aggregates leaves and
weighs each uplink by the hosts in it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hysync import wire


class Level(enum.IntEnum):
    SINGLE = 0
    LEAF = 1
    SPINE = 2


@dataclass(frozen=True, slots=True)
class Uplink:
    """Where a leaf sends its sums: the spine's address and MAC, the leaf's member id at the
    spine and the leaf's own address (the uplink's source, which the spine admits)."""

    spine_addr: int
    spine_mac: int
    uplink_id: int
    leaf_addr: int

    def __post_init__(self) -> None:
        if not 0 <= self.uplink_id < wire.MAX_WORKERS:
            raise ValueError(f"uplink_id {self.uplink_id} is out of range: a leaf's member id "
                             f"at the spine is 0..{wire.MAX_WORKERS - 1}")
        for name, value, bits in (("spine_addr", self.spine_addr, 32),
                                  ("leaf_addr", self.leaf_addr, 32),
                                  ("spine_mac", self.spine_mac, 48)):
            if not 0 <= value < 1 << bits:
                raise ValueError(f"{name} {value} does not fit {bits} bits: pass an "
                                 f"{'IPv4 address' if bits == 32 else 'MAC'} as an integer")


@dataclass(frozen=True, slots=True)
class JobRole:
    level: Level
    uplink: Uplink | None = None

    def __post_init__(self) -> None:
        if (self.level == Level.LEAF) != (self.uplink is not None):
            raise ValueError("a leaf needs its uplink (the spine's address, its member id "
                             "there) and only a leaf has one: pass uplink= with level=LEAF")

    @property
    def leaf(self) -> bool:
        return self.level == Level.LEAF

    @property
    def spine(self) -> bool:
        return self.level == Level.SPINE


def role_params(role: JobRole) -> tuple[int, ...]:
    """The parameters of the roles table's set_role action (docs/protocol.md §8) for `role`, in
    P4Info order: level, uplink_id, spine_addr, spine_mac, leaf_addr (zeros without an uplink)."""
    u = role.uplink
    return (int(role.level), *((u.uplink_id, u.spine_addr, u.spine_mac, u.leaf_addr)
                               if u is not None else (0, 0, 0, 0)))


def role_of_params(params: tuple[int, ...]) -> JobRole:
    """The role a roles-table entry sets; ValueError, saying what to change, for one that no
    switch can run."""
    level, uplink_id, spine_addr, spine_mac, leaf_addr = params
    if level not in tuple(Level):
        raise ValueError(f"set_role level {level} is not a level: use 0 (single), 1 (leaf) or "
                         "2 (spine)")
    if level != Level.LEAF:
        if any((uplink_id, spine_addr, spine_mac, leaf_addr)):
            raise ValueError(f"a {Level(level).name.lower()} job has no uplink: set uplink_id, "
                             "spine_addr, spine_mac and leaf_addr to 0")
        return JobRole(Level(level))
    return JobRole(Level.LEAF, Uplink(spine_addr, spine_mac, uplink_id, leaf_addr))


def serial_after(a: int, b: int) -> bool:
    """a is later than b, as 32-bit serial numbers (rounds wrap)."""
    return 0 < (a - b) & 0xFFFFFFFF < 1 << 31

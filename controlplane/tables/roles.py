"""Entries of the roles table (p4src: HySyncIngress.admission.roles): a switch's level in a
job that spans switches (docs/protocol.md §11). A job without an entry is `single`.

A leaf's entry carries its uplink: its member id at the spine, the spine's data address
and MAC, and its own data address (the uplink's source, which the spine admits). The
entry is written before the job's entry and deleted after it, so that no packet meets a
job whose level is not yet the controller's.
"""

from __future__ import annotations

from dataclasses import dataclass

from hysync import p4names, wire
from hysync.controlplane.errors import ValidationError
from hysync.controlplane.p4rt.entities import TableEntry
from hysync.p4schema import Schema, SchemaError

ROLES_TABLE = p4names.ADMISSION_ROLES
SET_ROLE = p4names.ADMISSION_SET_ROLE
LEVELS = {0: "single", 1: "leaf", 2: "spine"}
LEAF, SPINE = 1, 2


@dataclass(frozen=True, slots=True)
class RoleRow:
    """A roles-table entry, decoded."""

    job_id: int
    level: int  # 1 leaf, 2 spine
    uplink_id: int = 0  # a leaf: its member id at the spine
    spine_addr: int = 0
    spine_mac: int = 0
    leaf_addr: int = 0

    @property
    def name(self) -> str:
        return LEVELS.get(self.level, f"level {self.level}")

    @classmethod
    def leaf(cls, job_id: int, uplink_id: int, spine_ipv4: str, spine_mac: str,
             leaf_ipv4: str) -> RoleRow:
        return cls(job_id, LEAF, uplink_id, wire.ip_to_int(spine_ipv4),
                   int.from_bytes(wire.mac_to_bytes(spine_mac), "big"), wire.ip_to_int(leaf_ipv4))

    @classmethod
    def spine(cls, job_id: int) -> RoleRow:
        return cls(job_id, SPINE)

    @classmethod
    def from_entry(cls, entry: TableEntry) -> RoleRow:
        p = entry.params
        job_id = entry.match["job_id"]
        assert isinstance(job_id, int), job_id
        return cls(job_id, p["level"], p["uplink_id"], p["spine_addr"], p["spine_mac"],
                   p["leaf_addr"])

    def entry(self) -> TableEntry:
        return TableEntry(ROLES_TABLE, {"job_id": self.job_id}, SET_ROLE,
                          {"level": self.level, "uplink_id": self.uplink_id,
                           "spine_addr": self.spine_addr, "spine_mac": self.spine_mac,
                           "leaf_addr": self.leaf_addr})

    def describe(self) -> str:
        if self.level != LEAF:
            return self.name
        return (f"leaf, member {self.uplink_id} of the spine at "
                f"{wire.int_to_ip(self.spine_addr)}")


def has_roles(schema: Schema) -> bool:
    """Whether the program's P4Info declares the roles table."""
    try:
        schema.table(ROLES_TABLE)
    except SchemaError:
        return False
    return True


# Programs that declare the roles table and run a job as its spine, never as a leaf: the TNA
# program (docs/tofino.md, "Two levels"), by its P4Info's architecture.
SPINE_ONLY_ARCHS = ("tna", "t2na")


def runs_leaves(schema: Schema) -> bool:
    """Whether the program can be a job's leaf (has the roles table and runs the uplink)."""
    return has_roles(schema) and schema.p4info.pkg_info.arch not in SPINE_ONLY_ARCHS


def check_roles(schema: Schema, where: str, level: int) -> None:
    """Refuse, in one line, a leaf or spine (`level`) on a program that cannot be one."""
    arch = schema.p4info.pkg_info.arch or "its P4Info"
    if not has_roles(schema):
        raise ValidationError(
            f"the program on the switch at {where} ({arch}) has no table {ROLES_TABLE}: it "
            "cannot be a leaf or a spine; run a job across switches on the softswitch or the "
            "v1model program, or on one switch")
    if level == LEAF and not runs_leaves(schema):
        raise ValidationError(
            f"the program on the switch at {where} ({arch}) runs a job as its spine or on one "
            "switch, not as a leaf: put the job's leaves on the softswitch or the v1model "
            "program")

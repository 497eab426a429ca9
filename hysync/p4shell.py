"""Names for p4runtime-shell sessions: the modes table with its modes by name.

The P4Info names the modes (type_info.serializable_enums["sync_mode_t"], from the P4
enum of the modes table's `mode` parameter), but p4runtime-shell 0.0.6 prints every
action parameter as bytes (`value: "\\x01"`). Inside a shell opened without disturbing
the primary (docs/operations.md, Looking at the switch with p4runtime-shell):

    >>> from hysync.p4shell import show_modes
    >>> show_modes()
    job 1 slots 0-31 priority 1: PARTIAL quorum 2

`enum_names` maps any P4Info's modes the same way for other tools.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from p4.config.v1 import p4info_pb2

from hysync import p4names

MODE_ENUM = "sync_mode_t"


def enum_names(p4info: p4info_pb2.P4Info, enum: str = MODE_ENUM) -> dict[int, str]:
    """Value -> member name of a serializable enum of the P4Info ({} if it has none)."""
    enums = p4info.type_info.serializable_enums
    if enum not in enums:
        return {}
    return {int.from_bytes(m.value, "big"): m.name for m in enums[enum].members}


def mode_name(p4info: p4info_pb2.P4Info, value: bytes) -> str:
    """A `mode` parameter's bytes by name (the number where the P4Info names none)."""
    number = int.from_bytes(value, "big")
    return enum_names(p4info).get(number, str(number))


def describe(p4info: p4info_pb2.P4Info, entries: Iterable[Any]) -> list[str]:
    """One line per modes-table entry (p4runtime-shell TableEntry objects)."""
    lines = []
    for te in entries:
        job = int.from_bytes(te.match["job_id"].exact.value, "big")
        slot = te.match["slot"].range
        low, high = int.from_bytes(slot.low, "big"), int.from_bytes(slot.high, "big")
        mode = mode_name(p4info, te.action["mode"].value)
        quorum = int.from_bytes(te.action["quorum"].value, "big")
        lines.append(f"job {job} slots {low}-{high} priority {te.priority}: {mode}"
                     + (f" quorum {quorum}" if quorum else ""))
    return lines


def show_modes() -> list[str]:
    """Print (and return) the modes table of the switch p4runtime-shell is connected to."""
    from p4runtime_sh import shell

    p4info = shell.context.p4info
    lines = describe(p4info, shell.TableEntry(p4names.SYNC_MODE_MODES).read())
    for line in lines:
        print(line)
    return lines

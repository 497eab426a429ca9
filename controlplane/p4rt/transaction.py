"""Multi-update changes of the switch as transactions: each step knows its undo.

A change is phases of steps; each phase is one Write request, written in order. When
a write fails, the steps that had succeeded (earlier phases, and the updates of the
failing request that the switch reports as applied) are undone in reverse order:
best effort, a failed undo is logged. The controller orders its phases so that
traffic never meets a half-installed job (controller.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hysync.controlplane.errors import P4RuntimeError
from hysync.controlplane.p4rt.entities import (
    MulticastGroup,
    TableEntry,
    Update,
    delete,
    insert,
    modify,
)
from hysync.controlplane.p4rt.switch import Switch
from hysync.errors import HySyncError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Step:
    """An update and the update that undoes it (for rollback)."""

    update: Update
    undo: Update | None


def steps_insert(entities: Iterable[TableEntry | MulticastGroup]) -> list[Step]:
    return [Step(insert(e), delete(e)) for e in entities]


def steps_delete(entities: Iterable[TableEntry | MulticastGroup]) -> list[Step]:
    return [Step(delete(e), insert(e)) for e in entities]


def step_modify(new: TableEntry | MulticastGroup, old: TableEntry | MulticastGroup) -> Step:
    return Step(modify(new), modify(old))


def execute(switch: Switch, phases: Sequence[Sequence[Step]]) -> int:
    """Write each phase in one request, in order; on failure undo what succeeded."""
    done: list[Step] = []
    written = 0
    for phase in phases:
        if not phase:
            continue
        try:
            switch.write([s.update for s in phase])
        except P4RuntimeError as err:
            failed = {i for i, _, _ in err.failures}
            if err.failures:  # the others in this request were applied
                done += [s for i, s in enumerate(phase) if i not in failed]
            _rollback(switch, done)
            raise
        done += phase
        written += len(phase)
    return written


def _rollback(switch: Switch, done: list[Step]) -> None:
    for step in reversed(done):
        if step.undo is None:
            continue
        try:
            switch.write([step.undo])
        except HySyncError as err:
            log.error("rollback of %s failed: %s", step.update, err)

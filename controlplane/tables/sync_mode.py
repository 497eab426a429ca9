"""The desired-mode control (p4src: HySyncIngress.sync_mode): a range table keyed by
(job, slot) giving mode and quorum; the highest-priority matching entry wins and a
miss means `sync, quorum 0`. The switch latches it per slot when a round starts.

Range strategy of a hot swap of slots [a, b] (`plan_set_mode`), "newest wins":

* If an entry has exactly the range [a, b] and no entry of higher priority overlaps
  it, that entry decides every slot of [a, b]: the swap is **one MODIFY** of it.
* Otherwise a new entry for [a, b] is INSERTed with a priority above every entry of
  the job, so it wins on every slot of [a, b] and nowhere else. This one write puts
  the new mode in force on the whole range at once.
* Then every entry the insert made unreachable (all its slots covered by entries of
  higher priority, the replaced exact-range entry among them) is DELETEd in a
  second write: pure cleanup, no slot's desired mode changes.

So every entry left decides at least one slot: a job never holds more entries than
it has distinct runs of swapped slots. Priorities only grow; 2^31 swaps would be
needed to exhaust them.

**What a pipeline can hot-swap** (`async_swap_refusal`). The Tofino program numbers an
async round in a later pass than the one that decides it, so a swap away from async
inside that pass's window could let a round opened after the swap take the same number
and count a contribution twice (docs/tofino.md, difference 3). On a pipeline whose P4Info
says it is the TNA program, a slot therefore never enters or leaves async by a hot swap:
async is a job's install-time mode there, and hot swaps move between sync and partial.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hysync import p4names
from hysync.controlplane.errors import ValidationError
from hysync.controlplane.p4rt.entities import (
    TableEntry,
    Update,
    UpdateType,
    delete,
    insert,
    modify,
)
from hysync.wire import Mode

BASE_PRIORITY = 1
DEFAULT = (Mode.SYNC, 0)  # what a miss in the modes table means
# P4Info architectures (pkg_info.arch) that cannot hot-swap a slot into or out of async:
# the TNA program for Tofino 1 and Tofino 2 (see the module doc).
NO_ASYNC_SWAP_ARCHS = frozenset({"tna", "t2na"})


@dataclass(frozen=True, slots=True)
class ModeRange:
    """One modes-table entry: slots low..high (inclusive) of a job."""

    job_id: int
    low: int
    high: int
    mode: Mode
    quorum: int
    priority: int = BASE_PRIORITY

    def entry(self) -> TableEntry:
        return TableEntry(p4names.SYNC_MODE_MODES,
                          {"job_id": self.job_id, "slot": (self.low, self.high)},
                          p4names.SYNC_MODE_SET_MODE,
                          {"mode": int(self.mode), "quorum": self.quorum},
                          priority=self.priority)

    @classmethod
    def from_entry(cls, entry: TableEntry) -> ModeRange:
        job_id, slot = entry.match["job_id"], entry.match["slot"]
        assert isinstance(job_id, int) and isinstance(slot, tuple)
        # ValueError for a mode number this controller does not know.
        return cls(job_id, slot[0], slot[1], Mode(entry.params.get("mode", 0)),
                   entry.params.get("quorum", 0), entry.priority)

    def covers(self, low: int, high: int) -> bool:
        return self.low <= low and high <= self.high

    def overlaps(self, low: int, high: int) -> bool:
        return self.low <= high and low <= self.high


@dataclass(frozen=True, slots=True)
class ModeSetting:
    """A desired mode with its quorum: partial closes a round at the first `quorum`
    contributions; sync and async take none (0). `checked` is the one place a requested
    quorum is judged, for every caller (CLI, serve, policy, the Python API)."""

    mode: Mode
    quorum: int = 0

    @classmethod
    def checked(cls, mode: Mode, quorum: int | None, members: int, job_id: int) -> ModeSetting:
        """The setting a swap of job `job_id` (`members` active members) to `mode` with
        `quorum` writes; ValidationError saying what to pass instead."""
        mode = Mode(mode)
        if mode == Mode.PARTIAL:
            if quorum is None:
                raise ValidationError(
                    f"partial needs --quorum Q: a quorum between 1 and {members} (job "
                    f"{job_id}'s active members); pass --quorum Q with 1 <= Q <= {members}")
            if not 1 <= quorum <= members:
                raise ValidationError(
                    f"partial mode needs a quorum between 1 and {members} (job {job_id}'s "
                    f"active members), got {quorum}; pass --quorum Q with 1 <= Q <= {members}")
            return cls(mode, quorum)
        if quorum not in (None, 0):
            raise ValidationError(
                f"--quorum is for partial only: {mode.name.lower()} mode takes no quorum (it "
                "closes a round on every member / every contribution); leave it out")
        return cls(mode, 0)

    def __str__(self) -> str:
        return format_mode(self.mode, self.quorum)


@dataclass(frozen=True, slots=True)
class SwapPlan:
    """A hot swap of slots [low, high] as writes: `first` puts the setting in force on the
    whole range at once, `then` deletes the entries it made unreachable; `modes` is the
    job's modes table once both are written."""

    first: list[Update]
    then: list[Update]
    modes: tuple[ModeRange, ...]

    @property
    def strategy(self) -> str:
        """modify (one entry rewritten), insert (a new range entry), or unchanged."""
        if not self.first:
            return "unchanged"
        return "insert" if self.first[0].type == UpdateType.INSERT else "modify"


def plan_set_mode(existing: Sequence[ModeRange], job_id: int, low: int, high: int,
                  setting: ModeSetting) -> SwapPlan:
    """The writes that set [low, high] to `setting` over the job's `existing` entries.
    See the module doc."""
    target = next((r for r in existing if (r.low, r.high) == (low, high)), None)
    if target is not None and not any(r.priority > target.priority and r.overlaps(low, high)
                                      for r in existing):
        new = replace(target, mode=setting.mode, quorum=setting.quorum)
        if new == target:
            return SwapPlan([], [], tuple(existing))
        return SwapPlan([modify(new.entry())], [],
                        tuple(new if r is target else r for r in existing))
    top = max((r.priority for r in existing), default=0)
    new = ModeRange(job_id, low, high, setting.mode, setting.quorum, top + 1)
    dead = unreachable([*existing, new])
    return SwapPlan([insert(new.entry())], [delete(r.entry()) for r in dead],
                    tuple(r for r in [*existing, new] if r not in dead))


def unreachable(ranges: Sequence[ModeRange]) -> list[ModeRange]:
    """The entries that decide no slot: every slot of theirs is covered by entries of
    higher priority (one of them, or several together)."""
    dead = []
    for r in ranges:
        above = sorted((o.low, o.high) for o in ranges if o.priority > r.priority
                       and o.overlaps(r.low, r.high))
        reach = r.low  # first slot of r not yet known to be covered
        for lo, hi in above:
            if lo > reach:
                break
            reach = max(reach, hi + 1)
        if reach > r.high:
            dead.append(r)
    return dead


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of slots with one effective desired mode."""

    low: int
    high: int
    mode: Mode
    quorum: int


def effective(ranges: Iterable[ModeRange], low: int, high: int) -> list[Segment]:
    """The desired mode of every slot of [low, high] (highest priority wins; a miss is
    sync/0), as maximal runs of equal (mode, quorum)."""
    ranges = sorted(ranges, key=lambda r: -r.priority)
    cuts = {low, high + 1}
    for r in ranges:
        for edge in (r.low, r.high + 1):
            if low < edge <= high:
                cuts.add(edge)
    edges = sorted(cuts)
    segments: list[Segment] = []
    for start, stop in zip(edges, edges[1:], strict=False):
        top = next((r for r in ranges if r.covers(start, stop - 1)), None)
        mode, quorum = (top.mode, top.quorum) if top is not None else DEFAULT
        if segments and (segments[-1].mode, segments[-1].quorum) == (mode, quorum):
            segments[-1] = replace(segments[-1], high=stop - 1)
        else:
            segments.append(Segment(start, stop - 1, Mode(mode), quorum))
    return segments


def async_swap_refusal(arch: str, ranges: Iterable[ModeRange], job_id: int, low: int,
                       high: int, mode: Mode) -> str | None:
    """Why a pipeline of P4Info architecture `arch` cannot set slots [low, high] to `mode`,
    or None when it can: on the TNA program, a swap that moves a slot into or out of async
    (see the module doc). Slots already in `mode` do not count: setting async on slots that
    are async changes nothing."""
    if arch not in NO_ASYNC_SWAP_ARCHS:
        return None
    moved = [s for s in effective(ranges, low, high)
             if s.mode != mode and Mode.ASYNC in (s.mode, mode)]
    if not moved:
        return None
    s = moved[0]
    way = "into" if mode == Mode.ASYNC else "out of"
    return (f"slots {s.low}-{s.high} of job {job_id} are {format_mode(s.mode, s.quorum)} and "
            f"this switch runs the Tofino program ({arch}), which cannot hot-swap a slot {way} "
            "async (an async round is numbered in a later pass, so a round opened right after "
            "the swap could take its number: docs/tofino.md, difference 3); swap between sync "
            "and partial, or remove the job and add it again with the mode you want")


def format_mode(mode: Mode, quorum: int) -> str:
    if mode == Mode.PARTIAL:
        return f"partial({quorum})"
    return Mode(mode).name.lower()

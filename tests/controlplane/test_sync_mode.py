"""The range strategy of a hot swap, checked against a last-write-wins model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hysync.controlplane.errors import ValidationError
from hysync.controlplane.p4rt.entities import Update, UpdateType
from hysync.controlplane.tables.sync_mode import (
    ModeRange,
    ModeSetting,
    Segment,
    effective,
    plan_set_mode,
)
from hysync.wire import Mode

JOB = 4
FIRST, LAST = 100, 163  # the job's slots


def base() -> list[ModeRange]:
    return [ModeRange(JOB, FIRST, LAST, Mode.SYNC, 0, 1)]


def apply(table: list[ModeRange], updates: list[Update]) -> list[ModeRange]:
    """What a switch holds after the updates (entries keyed by range and priority)."""
    rows = {(r.low, r.high, r.priority): r for r in table}
    for u in updates:
        r = ModeRange.from_entry(u.entity)  # type: ignore[arg-type]
        key = (r.low, r.high, r.priority)
        if u.type == UpdateType.INSERT:
            assert key not in rows
            rows[key] = r
        elif u.type == UpdateType.MODIFY:
            assert key in rows
            rows[key] = r
        else:
            assert key in rows
            del rows[key]
    return list(rows.values())


def plan(table: list[ModeRange], low: int, high: int, mode: Mode,
         quorum: int) -> tuple[list[Update], list[Update]]:
    """(first, then) of a swap, after checking that the plan's own idea of the table once
    both are written is what a switch would hold."""
    swap = plan_set_mode(table, JOB, low, high, ModeSetting(mode, quorum))
    key = lambda r: (r.low, r.high, r.priority)  # noqa: E731
    assert sorted(swap.modes, key=key) == sorted(apply(apply(table, swap.first), swap.then),
                                                 key=key)
    return swap.first, swap.then


def test_swapping_an_existing_range_is_one_modify() -> None:
    first, then = plan(base(), FIRST, LAST, Mode.PARTIAL, 3)
    assert [u.type for u in first] == [UpdateType.MODIFY] and then == []
    assert ModeRange.from_entry(first[0].entity) == ModeRange(  # type: ignore[arg-type]
        JOB, FIRST, LAST, Mode.PARTIAL, 3, 1)


def test_a_sub_range_gets_a_higher_priority_entry_and_only_it_changes() -> None:
    first, then = plan(base(), 110, 119, Mode.ASYNC, 0)
    assert [u.type for u in first] == [UpdateType.INSERT] and then == []
    table = apply(base(), first)
    assert effective(table, FIRST, LAST) == [
        Segment(100, 109, Mode.SYNC, 0), Segment(110, 119, Mode.ASYNC, 0),
        Segment(120, 163, Mode.SYNC, 0)]


def test_a_swap_covering_older_ones_replaces_them_then_deletes_them() -> None:
    table = base()
    for lo, hi in ((110, 119), (130, 139)):
        first, then = plan(table, lo, hi, Mode.ASYNC, 0)
        table = apply(apply(table, first), then)
    first, then = plan(table, FIRST, LAST, Mode.PARTIAL, 2)
    assert [u.type for u in first] == [UpdateType.INSERT]
    assert [u.type for u in then] == [UpdateType.DELETE] * 3
    table = apply(apply(table, first), then)
    assert table == [ModeRange(JOB, FIRST, LAST, Mode.PARTIAL, 2, 4)]
    # From then on the whole range is one entry: a swap of it is one MODIFY.
    first, then = plan(table, FIRST, LAST, Mode.SYNC, 0)
    assert [u.type for u in first] == [UpdateType.MODIFY] and then == []


def test_an_exact_range_shadowed_by_a_partial_overlap_is_not_modified_in_place() -> None:
    table = base()
    for lo, hi, mode in ((110, 119, Mode.ASYNC), (115, 125, Mode.PARTIAL)):
        first, then = plan(table, lo, hi, mode, 2 if mode == Mode.PARTIAL else 0)
        table = apply(apply(table, first), then)
    # 110-119 exists, but 115-125 (newer) overlaps it: a MODIFY of 110-119 would
    # leave 115-119 partial. The plan inserts a new top entry instead.
    first, then = plan(table, 110, 119, Mode.SYNC, 0)
    assert [u.type for u in first] == [UpdateType.INSERT]
    table = apply(apply(table, first), then)
    assert effective(table, 110, 125) == [Segment(110, 119, Mode.SYNC, 0),
                                          Segment(120, 125, Mode.PARTIAL, 2)]


def test_setting_the_mode_a_range_already_has_writes_nothing() -> None:
    assert plan(base(), FIRST, LAST, Mode.SYNC, 0) == ([], [])
    assert plan_set_mode(base(), JOB, FIRST, LAST,
                         ModeSetting(Mode.SYNC)).strategy == "unchanged"


@pytest.mark.parametrize(("mode", "quorum", "message"), [
    (Mode.PARTIAL, None, "partial needs --quorum Q: a quorum between 1 and 4"),
    (Mode.PARTIAL, 0, "quorum between 1 and 4 .* got 0"),
    (Mode.PARTIAL, 5, "quorum between 1 and 4 .* got 5"),
    (Mode.SYNC, 2, "--quorum is for partial only: sync mode takes no quorum"),
    (Mode.ASYNC, 1, "--quorum is for partial only: async mode takes no quorum"),
])
def test_a_quorum_is_judged_in_one_place(mode: Mode, quorum: int | None, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModeSetting.checked(mode, quorum, members=4, job_id=JOB)


def test_a_checked_setting_is_what_a_swap_writes() -> None:
    assert ModeSetting.checked(Mode.PARTIAL, 3, members=4, job_id=JOB) == ModeSetting(
        Mode.PARTIAL, 3)
    assert ModeSetting.checked(Mode.ASYNC, None, members=4, job_id=JOB) == ModeSetting(
        Mode.ASYNC, 0)
    assert str(ModeSetting(Mode.PARTIAL, 3)) == "partial(3)"


def test_a_miss_is_sync_quorum_zero() -> None:
    assert effective([], 0, 9) == [Segment(0, 9, Mode.SYNC, 0)]


swaps = st.lists(
    st.tuples(st.integers(FIRST, LAST), st.integers(FIRST, LAST),
              st.sampled_from([(Mode.SYNC, 0), (Mode.PARTIAL, 2), (Mode.PARTIAL, 3),
                               (Mode.ASYNC, 0)])),
    min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(swaps)
def test_every_slot_gets_the_mode_of_the_last_swap_covering_it(ops) -> None:
    table = base()
    model = {s: (Mode.SYNC, 0) for s in range(FIRST, LAST + 1)}
    for a, b, (mode, quorum) in ops:
        lo, hi = min(a, b), max(a, b)
        first, then = plan(table, lo, hi, mode, quorum)
        assert len(first) <= 1 and all(u.type == UpdateType.DELETE for u in then)
        table = apply(table, first)
        # In force after the first write, before the deletions.
        for s in range(lo, hi + 1):
            model[s] = (mode, quorum)
        assert _per_slot(table) == model
        table = apply(table, then)
        assert _per_slot(table) == model
        # No entry is unreachable: each one decides at least one slot.
        assert all(any(_top(table, s) == r for s in range(r.low, r.high + 1)) for r in table)


def _top(table: list[ModeRange], slot: int) -> ModeRange | None:
    covering = [r for r in table if r.low <= slot <= r.high]
    return max(covering, key=lambda r: r.priority) if covering else None


def _per_slot(table: list[ModeRange]) -> dict[int, tuple[Mode, int]]:
    out = {}
    for seg in effective(table, FIRST, LAST):
        for s in range(seg.low, seg.high + 1):
            out[s] = (seg.mode, seg.quorum)
    return out

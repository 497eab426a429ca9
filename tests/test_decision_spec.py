"""The decision table (hysync/protocol_spec/decision.py) is well formed (docs/protocol.md's copy
of it is held to the table by tests/test_codegen.py)."""

from __future__ import annotations

from pathlib import Path

from hysync.protocol_spec import render
from hysync.protocol_spec.decision import (
    ALL_FACTS,
    ROWS,
    Counter,
    Emit,
    Fact,
    LaneOp,
    SeqOp,
    decide,
)
from hysync.wire import ResyncReason

PROTOCOL = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def first_match(facts: int) -> int:
    return next(i for i, row in enumerate(ROWS) if row.matches(facts))


def test_every_row_decides_some_contribution_and_the_last_catches_the_rest() -> None:
    """A row that no combination of facts reaches first is dead: a rule nobody follows."""
    reached = {first_match(facts) for facts in range(ALL_FACTS + 1)}
    assert reached == set(range(len(ROWS)))
    assert ROWS[-1].when == 0 and ROWS[-1].unless == 0


def test_an_outcome_is_consistent_with_itself() -> None:
    for row in ROWS:
        o = row.outcome
        counts_me = o.seq == SeqOp.RECORD
        # Only a contribution that is counted writes the lanes, and it always does.
        assert (o.lanes != LaneOp.NONE) == counts_me, row.why
        # A round opens with WRITE_OPEN only where nobody was counted yet.
        if o.lanes == LaneOp.WRITE_OPEN:
            assert row.when & Fact.EMPTY, row.why
        if o.emit in (Emit.ABSORB, Emit.CLOSE):
            assert counts_me, row.why
        assert (o.emit == Emit.RESYNC) == (o.reason != ResyncReason.NONE), row.why
        # Step 8's refusal mark: outside async (where r is refused already), every answer
        # "not counted" marks r so that no copy of it counts later.
        not_counted = (o.reason in (ResyncReason.STALE_ROUND, ResyncReason.CHUNK_MISMATCH)
                       or (o.emit == Emit.RESEND and o.counter == Counter.LATE))
        if not row.when & Fact.ASYNC:
            assert (o.seq == SeqOp.REFUSE) == (not_counted or
                                               o.reason == ResyncReason.STALE_COUNTED), row.why


def test_a_contribution_is_never_counted_twice_by_the_table() -> None:
    """Whatever else holds, a contribution the cell says was counted is never recorded,
    and one whose bit is in the open round's bitmap is never added to it."""
    for facts in range(ALL_FACTS + 1):
        o = decide(facts)
        if facts & Fact.COUNTED and facts & Fact.ASYNC:
            assert o.seq != SeqOp.RECORD
        if facts & Fact.OPEN and facts & Fact.HAS_BIT and not facts & Fact.ASYNC:
            assert o.lanes == LaneOp.NONE and o.emit in (Emit.NONE, Emit.CLOSE_AS_IS)
        # A JOIN never opens a round nor makes one of its own: it only joins one under way.
        if facts & Fact.JOIN and (facts & Fact.ASYNC or not facts & Fact.OPEN
                                  or facts & Fact.EMPTY):
            assert o.seq != SeqOp.RECORD and o.emit not in (Emit.ABSORB, Emit.CLOSE)


def test_the_cpp_header_names_every_row() -> None:
    header = render.cpp()
    assert header.count("    // ") == len(ROWS)
    for row in ROWS:
        assert row.why in header

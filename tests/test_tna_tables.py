"""The TNA program's `verdict` rows, generated from the decision table
(hysync/protocol_spec/tna_tables.py, hysync/protocol_spec/decision.py).

On every combination of flags and register answers the TNA passes can produce, the
generated rows give the action the generator derived, and what that action sends, drops and
answers (its emit, drop reason and RESYNC reason, read back from the action as the Replies
control carries it out) is the decision table's for the facts the combination stands for,
except where docs/tofino.md lists a difference. A rule changed in decision.py changes the
generated rows with it; one the TNA program cannot carry out is a one-line error.
"""

from __future__ import annotations

import dataclasses

import pytest

from hysync import gen_p4
from hysync.protocol_spec import decision, tna_tables
from hysync.protocol_spec.decision import Emit, Fact, Verdict
from hysync.protocol_spec.tna_tables import Action
from hysync.wire import DropReason, ResyncReason

ANSWERS = list(tna_tables.answers())


def _ids(value):
    return ",".join(f"{k}={x}" for k, x in value.items()) if isinstance(value, dict) else value


def _facts(keys: dict[str, int], meaning: str) -> int:
    """The facts a combination means, as v1model would know them (w's bit by member_seq,
    difference 4, but no other difference applied; RES_HAS_BIT left out: the two RESEND
    rows send the same)."""
    is_open = keys["open_sync"] or keys["fresh"] or keys["not_joined"]
    empty = keys["fresh"] or keys["not_joined"]  # nobody's bit is in an empty round
    facts = 0
    for fact, holds in [
        (Fact.ASYNC, keys["async_path"]), (Fact.COUNTED, keys["counted"]),
        (Fact.JOIN, keys["join"]), (Fact.OPEN, is_open), (Fact.PREV, keys["prev"]),
        (Fact.EMPTY, empty), (Fact.HAS_BIT, is_open and keys["counted"] and not empty),
        (Fact.FULL, meaning == "duplicate, full"), (Fact.CLOSES, "closes" in meaning),
        (Fact.CHUNK_DIFFERS, not keys["chunk_ok"]), (Fact.BEHIND, keys["behind"]),
    ]:
        if holds:
            facts |= fact
    return facts


def _emit(o: tna_tables.Outcome) -> Emit:
    """What the TNA program does with the slot and the packet for an outcome (Replies)."""
    by_action = {Action.RESYNC: Emit.RESYNC, Action.RESYNC_ROUND: Emit.RESYNC,
                 Action.ACK: Emit.ACK, Action.ASYNC_ROUND: Emit.CLOSE,
                 Action.CLOSING: Emit.NONE, Action.RESEND: Emit.RESEND}
    if o.action in by_action:
        return by_action[o.action]
    if o.action == Action.DUPLICATE:
        return Emit.CLOSE_AS_IS if o.verdict == Verdict.CLOSE else Emit.NONE
    return Emit.CLOSE if o.verdict == Verdict.CLOSE else Emit.ABSORB


def _drop(o: tna_tables.Outcome):
    if o.action in (Action.ACK, Action.DUPLICATE):
        return DropReason.DUPLICATE
    return DropReason.STALE if o.action == Action.CLOSING else o.drop


def _difference(meaning: str, tna: tna_tables.Outcome, spec: decision.Outcome) -> str | None:
    """The docs/tofino.md difference that explains a disagreement, or None."""
    if tna.action == Action.CLOSING and meaning == "close under way":
        return "2: refused while its round's close is under way"
    if tna.verdict == Verdict.CHUNK_MISMATCH and spec.verdict == Verdict.DUPLICATE:
        return "5: the chunk is checked before the duplicate test"
    return None


@pytest.mark.parametrize(("keys", "meaning"), ANSWERS, ids=_ids)
def test_a_tna_verdict_is_the_decision_tables(keys: dict[str, int], meaning: str) -> None:
    tna = tna_tables.decide(keys)
    assert tna == tna_tables.outcome(keys, meaning)[0], "the rows lost a combination's action"
    spec = decision.decide(_facts(keys, meaning))
    # (A resend's member counter, DUPLICATES or LATE as in the spec's two RESEND rows, is
    # the Resent pass's; the RESYNC reason of an outcome that sends none is not compared.)
    same = (_emit(tna) == spec.emit and _drop(tna) == spec.drop
            and (spec.emit != Emit.RESYNC or tna.reason == spec.reason))
    assert same or _difference(meaning, tna, spec), (
        f"{meaning}: TNA {tna} where the decision table says {spec}")


def test_every_tna_verdict_row_is_reached_and_the_last_is_the_default() -> None:
    rows = tna_tables.verdict_rows()
    reached = {next(i for i, row in enumerate(rows) if row.matches(keys)) for keys, _ in ANSWERS}
    assert reached == set(range(len(rows)))
    assert rows[-1].match == {}
    assert rows[-1].outcome.reason == ResyncReason.STALE_ROUND, (
        "a combination the passes were thought unable to produce must meet a stale answer")


def test_rows_follow_the_decision_tables_order() -> None:
    """Each row cites the decision table's rows it stands for, in the table's order (the
    refusal of difference 2 sits before the row that would have counted it)."""
    whys = [row.why for row in decision.ROWS]
    cited = [min(whys.index(part) for part in row.why.split(" / "))
             for row in tna_tables.verdict_rows() if row.why != tna_tables.CLOSE_UNDER_WAY]
    assert cited == sorted(cited)


@pytest.fixture
def spec_rows(monkeypatch):
    """Replace decision rows by index for one test; the generated rows are recomputed."""
    tna_tables.verdict_rows.cache_clear()

    def change(index: int, **outcome) -> None:
        rows = list(decision.ROWS)
        rows[index] = dataclasses.replace(
            rows[index], outcome=dataclasses.replace(rows[index].outcome, **outcome))
        monkeypatch.setattr(decision, "ROWS", tuple(rows))
        tna_tables.verdict_rows.cache_clear()

    yield change
    tna_tables.verdict_rows.cache_clear()


def _row_index(why_start: str) -> int:
    return next(i for i, row in enumerate(decision.ROWS) if row.why.startswith(why_start))


def test_a_rule_changed_in_the_decision_table_changes_the_tna_verdict(spec_rows) -> None:
    before = gen_p4.tna_verdict_p4()
    stale_counted = dict(not_joined=0, async_path=0, join=0, open_sync=0, fresh=0, chunk_ok=1,
                         prev=0, latched=1, counted=1, behind=0, count_out=2, closes=0)
    assert tna_tables.decide(stale_counted).reason == ResyncReason.STALE_COUNTED
    spec_rows(_row_index("stale, but r was counted"), reason=ResyncReason.STALE_ROUND)
    assert tna_tables.decide(stale_counted).reason == ResyncReason.STALE_ROUND
    assert gen_p4.tna_verdict_p4() != before


def test_an_outcome_no_counting_action_carries_out_is_a_clear_error(spec_rows) -> None:
    spec_rows(_row_index("counted; the round stays open"), emit=Emit.NONE)
    with pytest.raises(ValueError, match="no Counting action carries out"):
        tna_tables.verdict_rows()


def test_a_fact_the_tna_verdict_cannot_see_is_a_clear_error(spec_rows) -> None:
    """The verdict does not know w's bit in the resent round: the two RESEND rows must send
    the same, or the generator says which rows it cannot tell apart."""
    spec_rows(_row_index("the sender's result was lost"), emit=Emit.ACK)
    with pytest.raises(ValueError, match="cannot tell apart"):
        tna_tables.verdict_rows()


def test_a_combination_the_passes_cannot_produce_is_not_an_answer() -> None:
    """The TNA model asserts `is_answer` of what it decides; count_out counts only as zero
    or not, as the rows see it."""
    keys = dict(ANSWERS[0][0])
    assert tna_tables.is_answer(keys)
    assert tna_tables.is_answer({**keys, "count_out": keys["count_out"] + 7 if keys["count_out"]
                                 else 0})
    assert not tna_tables.is_answer({**keys, "fresh": 1, "prev": 1})

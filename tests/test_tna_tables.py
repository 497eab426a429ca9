"""The TNA program's verdict rows (hysync/spec/tna_tables.py) against the decision table
(hysync/spec/decision.py): on every combination of flags and register answers the TNA
passes can produce, what the TNA row sends, drops and answers (its emit, drop reason and
RESYNC reason) is the decision table's for the facts that combination stands for, except
where docs/tofino.md lists a difference. A rule changed in decision.py fails here until
the TNA rows follow it or the difference is listed (and documented)."""

from __future__ import annotations

import itertools

import pytest

from hysync.spec import decision, tna_tables
from hysync.spec.decision import Emit, Fact, Verdict
from hysync.spec.tna_tables import Action
from hysync.wire import DropReason

CLOSING = 1 << 31

# What classify can tell Counting (its rows' flags), with the round's relation it implies:
# (fresh, open_sync, async_path, not_joined, latched), open round?
CLASSIFIED = sorted({(r.flags.fresh, r.flags.open_sync, r.flags.async_path, r.flags.not_joined,
                      r.flags.latched) for r in tna_tables.CLASSIFY_ROWS if not r.flags.stale})


def _count_outs(fresh: int, open_sync: int, chunk_ok: int, counted: int) -> list[tuple[str, int]]:
    """What Count can answer on that path (slot_registers.p4): (what it means, count_out)."""
    if open_sync and fresh:
        return [("opens", 1), ("opens and closes", CLOSING | 1)]
    if open_sync and chunk_ok and counted:
        return [("duplicate, not full", 0), ("duplicate, full", CLOSING | 2)]
    if open_sync and chunk_ok:
        return [("close under way", 0), ("joins", 2), ("joins and closes", CLOSING | 2)]
    return [("read, idle", 0), ("read", 2), ("read, close under way", CLOSING | 2)]


def _facts(keys: dict[str, int], meaning: str) -> int:
    """The decision table's facts for a TNA combination (docs/tofino.md, differences 4 and
    14: duplicates by member_seq, no refusal or JOIN marks)."""
    is_open = keys["open_sync"] or keys["fresh"] or keys["not_joined"]
    empty = keys["fresh"] or keys["not_joined"]
    facts = 0
    for fact, holds in [
        (Fact.ASYNC, keys["async_path"]), (Fact.COUNTED, keys["counted"]),
        (Fact.JOIN, keys["join"]), (Fact.OPEN, is_open), (Fact.PREV, keys["prev"]),
        (Fact.EMPTY, empty), (Fact.HAS_BIT, is_open and keys["counted"]),
        (Fact.FULL, meaning == "duplicate, full"),
        (Fact.CLOSES, "closes" in meaning),
        (Fact.CHUNK_DIFFERS, not keys["chunk_ok"]),
    ]:
        if holds:
            facts |= fact
    return facts


def combinations():
    for (fresh, open_sync, async_path, not_joined, latched), join, prev, chunk_ok, counted in \
            itertools.product(CLASSIFIED, (0, 1), (0, 1), (0, 1), (0, 1)):
        if (fresh and (join or not chunk_ok)) or (not_joined and not join):
            continue  # a JOIN never opens a round; the opener latched its own chunk
        if prev and (fresh or open_sync or not_joined):
            continue  # the round before the open one is not the open one
        if (fresh or not_joined) and counted:
            continue  # nobody counted in a round nothing latched (a 2^-32 hash collision)
        for meaning, count_out in _count_outs(fresh, open_sync, chunk_ok, counted):
            keys = dict(not_joined=not_joined, async_path=async_path, join=join,
                        open_sync=open_sync, fresh=fresh, chunk_ok=chunk_ok, prev=prev,
                        latched=latched, counted=counted, count_out=count_out,
                        closes=count_out >> 31)
            yield keys, meaning


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


def _difference(keys: dict[str, int], meaning: str, tna: tna_tables.Outcome,
                spec: decision.Outcome) -> str | None:
    """The docs/tofino.md difference that explains a disagreement, or None."""
    if tna.action == Action.CLOSING and meaning == "close under way":
        return "2: refused while its round's close is under way"
    if tna.verdict == Verdict.CHUNK_MISMATCH and spec.verdict == Verdict.DUPLICATE:
        return "5: the chunk is checked before the duplicate test"
    return None


@pytest.mark.parametrize(("keys", "meaning"), list(combinations()),
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items())
                         if isinstance(v, dict) else v)
def test_a_tna_verdict_is_the_decision_tables(keys: dict[str, int], meaning: str) -> None:
    tna = tna_tables.decide(keys)
    spec = decision.decide(_facts(keys, meaning))
    # (A resend's member counter, DUPLICATES or LATE as in the spec's two RESEND rows, is
    # the Resent pass's; the RESYNC reason of an outcome that sends none is not compared.)
    same = (_emit(tna) == spec.emit and _drop(tna) == spec.drop
            and (spec.emit != Emit.RESYNC or tna.reason == spec.reason))
    assert same or _difference(keys, meaning, tna, spec), (
        f"{meaning}: TNA {tna} where the decision table says {spec}")


def test_every_tna_verdict_row_is_reached() -> None:
    reached = {next(i for i, row in enumerate(tna_tables.ROWS) if row.matches(keys))
               for keys, _ in combinations()}
    assert reached == set(range(len(tna_tables.ROWS)))

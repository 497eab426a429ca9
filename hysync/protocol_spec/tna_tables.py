"""The TNA program's decision tables (p4src/tna, aggregation.p4): `classify` (Latching: the
facts its latches' answers give a contribution) and `verdict` (Counting: what an admitted
contribution of the slot's install is), each as rows over what the TNA registers answer,
first match wins.

The TNA program cannot evaluate the decision table (`decision.py`) as v1model does: its
registers are split over stages, each touched once per pass, so what it knows when it
decides is the answers of those registers (the latches, `member_seq`, `Count` with its close
guard), and its register updates happen before the verdict rather than after it
(docs/tofino.md, "Differences from v1model"). So `verdict` is generated: `answers` lists
every combination of keys the passes can produce, `facts` says which of the decision
table's facts each stands for, the decision table decides, `_action` names the Counting
action that carries the outcome out, and `_first_match_rows` writes the fewest ternary rows
a greedy search finds that give every combination its action, in the decision table's
order, each citing the decision table's rows. A rule changed in decision.py is a changed
`verdict` after `python -m hysync.codegen`; an outcome no action carries out, or facts the
keys cannot tell apart, is an error that says so. `classify` is the TNA's own (how its
latches become facts, as each target computes its facts its own way) and written here.

`python -m hysync.codegen` writes both as const entries (p4src/tna/include/control/
classify.p4, verdict.p4), and the TNA model (tests/conformance/tna_model.py) evaluates
these rows, so the conformance suite checks the rows the program runs.
tests/test_tna_tables.py reads every action back as the Replies control carries it out
and holds it to the decision table, allowing only the differences docs/tofino.md lists.
"""

from __future__ import annotations

import enum
import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from hysync.protocol_spec import decision
from hysync.protocol_spec.decision import Counter, Emit, Fact, Verdict
from hysync.wire import DropReason, Flag, Mode, ResyncReason

# ------------------------------------------------------------------ classify (Latching)
# Keys: (name, the P4 expression). `latched` is the mode latch's answer for the open round
# (0: nothing latched), `diff` the contribution's round minus the open one (32 bits).
CLASSIFY_KEYS: tuple[tuple[str, str], ...] = (
    ("epoch_differs", "meta.tf.epoch_differs"),
    ("latched", "meta.tf.latched"),
    ("desired_mode", "meta.hs.desired_mode"),
    ("diff", "meta.tf.diff"),
    ("flags", "hdr.hysync.flags"),
)


@dataclass(frozen=True)
class Flags:
    """`flags`: what Counting is told (the bridge header); `stale`: another install's slot
    (nothing counts: Replies takes the reset pass)."""

    stale: bool = False
    fresh: int = 0       # opens its round
    open_sync: int = 0   # to the open round, not async, not a refused JOIN
    async_path: int = 0  # async desired and no round latched: a round of its own
    not_joined: int = 0  # a JOIN that found no round latched
    latched: int = 0     # a round is latched (under way)

    def p4_call(self) -> str:
        if self.stale:
            return "stale()"
        return (f"flags({self.fresh}, {self.open_sync}, {self.async_path}, {self.not_joined}, "
                f"{self.latched})")


@dataclass(frozen=True)
class ClassifyRow:
    match: dict[str, int | tuple[int, int]]  # key -> value, or (value, mask); others: any
    flags: Flags
    why: str

    def matches(self, keys: dict[str, int]) -> bool:
        for name, want in self.match.items():
            value, mask = want if isinstance(want, tuple) else (want, -1)
            if keys[name] & mask != value:
                return False
        return True

    def p4_value(self, name: str) -> str:
        """The key's pattern as the P4 program spells it."""
        if name not in self.match:
            return "_"
        want = self.match[name]
        spell = {"desired_mode": lambda v: f"MODE_{Mode(v).name}",
                 "flags": lambda v: f"FLAG_{Flag(v).name}"}.get(name, str)
        if isinstance(want, tuple):
            return f"{spell(want[0])} &&& {spell(want[1])}"
        return spell(want)


CLASSIFY_ROWS: tuple[ClassifyRow, ...] = (
    ClassifyRow({"epoch_differs": 1}, Flags(stale=True),
                "another install used the slot last: nothing counts, the reset pass follows"),
    ClassifyRow({"latched": 0, "desired_mode": int(Mode.ASYNC)}, Flags(async_path=1),
                "nothing latched and async desired: a round of its own"),
    ClassifyRow({"latched": 0, "diff": 0, "flags": (int(Flag.JOIN), int(Flag.JOIN))},
                Flags(not_joined=1), "a JOIN never opens a round"),
    ClassifyRow({"latched": 0, "diff": 0}, Flags(fresh=1, open_sync=1), "opens the open round"),
    ClassifyRow({"latched": 0}, Flags(), "nothing latched, not the open round: stale"),
    ClassifyRow({"diff": 0}, Flags(open_sync=1, latched=1), "counts in the latched open round"),
    ClassifyRow({}, Flags(latched=1), "not the open round, which is latched"),
)


def classify(keys: dict[str, int]) -> Flags:
    """The flags of the first row whose keys match (the last row matches every packet)."""
    return next(row.flags for row in CLASSIFY_ROWS if row.matches(keys))


# ------------------------------------------------------------------ verdict (Counting)

# Keys, in order: (name, the P4 expression). `count_out` is Count's answer (the
# count after this packet, bit 31 CLOSING set if it closes the round; 0 if the close guard
# refused it); `closes` is its bit 31.
KEYS: tuple[tuple[str, str], ...] = (
    ("not_joined", "meta.bridge.not_joined"),
    ("async_path", "meta.bridge.async_path"),
    ("join", "meta.bridge.join"),
    ("open_sync", "meta.bridge.open_sync"),
    ("fresh", "meta.bridge.fresh"),
    ("chunk_ok", "meta.bridge.chunk_ok"),
    ("prev", "meta.bridge.prev"),
    ("latched", "meta.bridge.latched"),
    ("counted", "meta.tf.counted[0:0]"),
    ("behind", "meta.tf.counted[1:1]"),
    ("count_out", "meta.tf.count_out"),
    ("closes", "meta.tf.count_out[31:31]"),
)
KEY_NAMES = tuple(name for name, _ in KEYS)


class Action(enum.Enum):
    """The Counting control's verdict actions (aggregation.p4)."""

    RESYNC = "resync"              # a RESYNC with no round state
    RESYNC_ROUND = "resync_round"  # a RESYNC with the open round's contributors and count
    ACK = "ack"                    # async: a copy of a counted contribution
    ASYNC_ROUND = "async_round"    # async: a round of its own
    OPEN_ROUND = "open_round"      # opens the round (bank write)
    JOIN_ROUND = "join_round"      # joins the round (bank add)
    DUPLICATE = "duplicate"        # counted before
    CLOSING = "closing"            # the round's close is under way: refused, no reply
    RESEND = "resend"              # the round that closed last: its stored result


class ResultOp(enum.Enum):
    """result_op_t: what Results does with the stored result header."""

    NONE = 0
    READ = 1
    WRITE = 2


class LaneOp(enum.Enum):
    """tna_lane_op_t: what the lane passes do with the bank."""

    NONE = 0
    WRITE = 1
    ADD = 2
    READ = 3


@dataclass(frozen=True)
class Outcome:
    action: Action
    verdict: Verdict | None = None
    drop: DropReason | None = None
    reason: ResyncReason | None = None
    counter: Counter | None = None
    result_op: ResultOp | None = None
    lane_op: LaneOp | None = None

    def p4_args(self) -> str:
        """The action's arguments, as the P4 program spells them."""
        args: list[str] = []
        if self.verdict is not None:
            args.append(f"verdict_t.{self.verdict.name}")
        if self.drop is not None:
            args += [f"DROP_{self.drop.name}", f"RESYNC_{self.reason.name}",
                     f"member_counter_t.{self.counter.name}"]
        if self.lane_op is not None:
            args.append(f"tna_lane_op_t.{self.lane_op.name}")
        if self.result_op is not None:
            args.append(f"result_op_t.{self.result_op.name}")
        return ", ".join(args)


@dataclass(frozen=True)
class Row:
    match: dict[str, int]  # key -> value; the others: any
    outcome: Outcome
    why: str

    def matches(self, keys: dict[str, int]) -> bool:
        return all(keys[name] == value for name, value in self.match.items())


# What the TNA passes can give `verdict`: classify's flags, the header's JOIN flag, the
# chunk and resend latches, member_seq's answer, and what Count answers on that path.
CLOSING = 1 << 31


def _count_answers(fresh: int, open_sync: int, chunk_ok: int,
                   counted: int) -> list[tuple[str, int]]:
    """What Count can answer on that path (slot_registers.p4): (what it means, count_out)."""
    if open_sync and fresh:
        return [("opens", 1), ("opens and closes", CLOSING | 1)]
    if open_sync and chunk_ok and counted:
        return [("duplicate, not full", 0), ("duplicate, full", CLOSING | 2)]
    if open_sync and chunk_ok:
        return [("close under way", 0), ("joins", 2), ("joins and closes", CLOSING | 2)]
    return [("read, idle", 0), ("read", 2), ("read, close under way", CLOSING | 2)]


def answers() -> Iterator[tuple[dict[str, int], str]]:
    """Every combination of keys the passes can produce, with what Count's answer means."""
    classified = sorted({(r.flags.fresh, r.flags.open_sync, r.flags.async_path,
                          r.flags.not_joined, r.flags.latched)
                         for r in CLASSIFY_ROWS if not r.flags.stale})
    for (fresh, open_sync, async_path, not_joined, latched), join, prev, chunk_ok, counted, \
            behind in itertools.product(classified, (0, 1), (0, 1), (0, 1), (0, 1), (0, 1)):
        if (fresh and (join or not chunk_ok)) or (not_joined and not join):
            continue  # a JOIN never opens a round; the opener latched its own chunk
        if behind and (counted or not async_path or join):
            continue  # only the async path's swap asks whether r is behind what was counted
        if prev and (fresh or open_sync or not_joined):
            continue  # the round before the open one is not the open one
        for meaning, count_out in _count_answers(fresh, open_sync, chunk_ok, counted):
            yield dict(not_joined=not_joined, async_path=async_path, join=join,
                       open_sync=open_sync, fresh=fresh, chunk_ok=chunk_ok, prev=prev,
                       latched=latched, counted=counted, behind=behind, count_out=count_out,
                       closes=count_out >> 31), meaning


def _what_rows_see(keys: dict[str, int]) -> tuple[int, ...]:
    """The keys as the rows can tell them apart (count_out: zero or not)."""
    return tuple(int(keys[name] != 0) if name == "count_out" else keys[name]
                 for name in KEY_NAMES)


@functools.cache
def _answer_set() -> frozenset[tuple[int, ...]]:
    return frozenset(_what_rows_see(keys) for keys, _ in answers())


def is_answer(keys: dict[str, int]) -> bool:
    """Whether `answers` lists the combination (count_out as the rows see it): the TNA
    model asserts it of every contribution it decides, so that a combination the generator
    left out (whose action no test derived) fails the conformance suite and the
    simulation."""
    return _what_rows_see(keys) in _answer_set()


def facts(keys: dict[str, int], meaning: str) -> list[int]:
    """The decision table's facts a combination stands for. Every fact set it may stand
    for: the verdict does not know w's bit in the resent round's bitmap (the Resent pass
    reads it), so a resend stands for both. The program has no refusal or JOIN marks
    (docs/tofino.md, difference 14), tells duplicates by member_seq (difference 4), and
    checks the chunk before the duplicate test (difference 5: on another chunk it does
    not ask whether w was counted). member_seq may say "counted" in a round nobody has
    joined yet (a number an async round recorded that the next sync round takes,
    difference 4): the round is empty, so w's bit is not in it."""
    is_open = keys["open_sync"] or keys["fresh"] or keys["not_joined"]
    empty = keys["fresh"] or keys["not_joined"]
    known = 0
    for fact, holds in [
        (Fact.ASYNC, keys["async_path"]), (Fact.COUNTED, keys["counted"]),
        (Fact.JOIN, keys["join"]), (Fact.OPEN, is_open), (Fact.PREV, keys["prev"]),
        (Fact.EMPTY, empty),
        (Fact.HAS_BIT, is_open and keys["counted"] and keys["chunk_ok"] and not empty),
        (Fact.FULL, meaning == "duplicate, full"),
        (Fact.CLOSES, "closes" in meaning),
        (Fact.CHUNK_DIFFERS, not keys["chunk_ok"]), (Fact.BEHIND, keys["behind"]),
    ]:
        if holds:
            known |= fact
    return [known, known | Fact.RES_HAS_BIT] if keys["prev"] else [known]


def _action(o: decision.Outcome, latched: int) -> Outcome:
    """The Counting action that carries out a decision table outcome (the member cell, the
    counters and the RESEND's member counter are other passes' work)."""
    result = ResultOp.WRITE if o.emit == Emit.CLOSE else ResultOp.NONE
    if o.emit == Emit.RESYNC:
        return Outcome(Action.RESYNC_ROUND if latched else Action.RESYNC, o.verdict, o.drop,
                       o.reason, o.counter)
    if o.emit == Emit.ACK:
        return Outcome(Action.ACK)
    if o.emit == Emit.RESEND:
        return Outcome(Action.RESEND)
    if o.emit == Emit.CLOSE_AS_IS:
        return Outcome(Action.DUPLICATE, Verdict.CLOSE, result_op=ResultOp.WRITE,
                       lane_op=LaneOp.READ)
    if o.emit == Emit.NONE and o.verdict == Verdict.DUPLICATE:
        return Outcome(Action.DUPLICATE, Verdict.DUPLICATE, result_op=ResultOp.NONE,
                       lane_op=LaneOp.NONE)
    if o.emit == Emit.CLOSE and o.lanes == decision.LaneOp.WRITE:
        return Outcome(Action.ASYNC_ROUND)
    if o.emit in (Emit.ABSORB, Emit.CLOSE) and o.lanes == decision.LaneOp.WRITE_OPEN:
        return Outcome(Action.OPEN_ROUND, o.verdict, result_op=result)
    if o.emit in (Emit.ABSORB, Emit.CLOSE) and o.lanes == decision.LaneOp.ADD:
        return Outcome(Action.JOIN_ROUND, o.verdict, result_op=result)
    raise ValueError(f"no Counting action carries out {o}: add one to aggregation.p4 and here")


CLOSE_UNDER_WAY = ("the round's close is under way: Count refused it, no reply "
                   "(docs/tofino.md, difference 2)")


def _derive(keys: dict[str, int], meaning: str) -> tuple[Outcome, str, float]:
    """What `verdict` must do with a combination, why (the decision table's rows), and
    where that stands in the decision table: the index of its first row, a refusal of
    difference 2 just before the row that would have counted it (so that `verdict` lists
    its rows in the decision table's order and ends with its last row)."""
    rows = list(dict.fromkeys(decision.first_row(f) for f in facts(keys, meaning)))
    index = min(decision.ROWS.index(row) for row in rows)
    if meaning == "close under way":
        return Outcome(Action.CLOSING), CLOSE_UNDER_WAY, index - 0.5
    actions = {_action(row.outcome, keys["latched"]) for row in rows}
    if len(actions) > 1:
        raise ValueError(f"the TNA verdict cannot tell apart {[r.why for r in rows]} on "
                         f"{keys}: give it a key that does, or list the difference")
    return actions.pop(), " / ".join(row.why for row in rows), index


def outcome(keys: dict[str, int], meaning: str) -> tuple[Outcome, str]:
    """What `verdict` must do with a combination, and why (the decision table's rows)."""
    action, why, _ = _derive(keys, meaning)
    return action, why


# Each key's patterns a row may use besides "any": count_out is matched only as 0 (Count
# refused or found nobody); every other key is a bit.
_PATTERNS = {name: (0,) if name == "count_out" else (0, 1) for name in KEY_NAMES}


def _widest_pattern(todo: int, later: int, matching: dict[tuple[int, int], int],
                    everything: int) -> tuple[dict[int, int], int]:
    """The pattern (key index -> value) that matches the most points of `todo` and none of
    `later`, and those points (point sets as bit masks; the fewest keys on a tie): a
    depth-first search that fixes keys in order and stops narrowing a pattern once it
    matches nothing of `later`."""
    best: tuple[int, int, dict[int, int], int] = (0, 0, {}, 0)

    def search(pattern: dict[int, int], covered: int, after: int) -> None:
        nonlocal best
        if not covered & todo:
            return
        if not covered & later:
            score = ((covered & todo).bit_count(), -len(pattern))
            if score > best[:2]:
                best = (*score, dict(pattern), covered & todo)
            return  # a narrower pattern matches no more
        for k in range(after, len(KEY_NAMES)):
            for v in _PATTERNS[KEY_NAMES[k]]:
                search({**pattern, k: v}, covered & matching[k, v], k + 1)

    search({}, everything, 0)
    if not best[3]:
        raise ValueError("no pattern over the keys separates a combination from those of a "
                         "later action: the rows cannot be written")
    return best[2], best[3]


def _first_match_rows(points: list[tuple[tuple[int, ...], tuple[Outcome, str]]]) -> list[Row]:
    """Rows, first match wins, that give every point (key values as the rows see them) its
    label, one label after another in the order of `points`' first appearances: each row
    is the pattern that matches the most points of its label no earlier row took, and none
    of a later label's (the fewest keys on a tie). The last label's row matches everything:
    the default. Combinations the passes cannot produce may match any row."""
    labels = list(dict.fromkeys(label for _, label in points))
    of_label = [sum(1 << i for i, (_, lab) in enumerate(points) if lab == label)
                for label in labels]
    matching = {(k, v): sum(1 << i for i, (values, _) in enumerate(points) if values[k] == v)
                for k, name in enumerate(KEY_NAMES) for v in _PATTERNS[name]}
    everything = (1 << len(points)) - 1
    rows: list[Row] = []
    for n, (out, why) in enumerate(labels):
        todo, later = of_label[n], sum(of_label[n + 1:])
        while todo:
            pattern, covered = _widest_pattern(todo, later, matching, everything)
            todo &= ~covered
            rows.append(Row({KEY_NAMES[k]: v for k, v in sorted(pattern.items())}, out, why))
    return rows


@functools.cache
def verdict_rows() -> tuple[Row, ...]:
    """`verdict`, generated from the decision table: every combination the passes can
    produce gets the action of the decision table's outcome for the facts it stands for."""
    points: dict[tuple[int, ...], tuple[Outcome, str]] = {}
    order: dict[tuple[Outcome, str], float] = {}
    for keys, meaning in answers():
        values = _what_rows_see(keys)
        action, why, index = _derive(keys, meaning)
        label = (action, why)
        if points.setdefault(values, label) != label:
            raise ValueError(f"{keys} stands for both {points[values]} and {label}: the "
                             "rows cannot tell them apart")
        order[label] = min(order.get(label, index), index)
    ranked = sorted(points.items(), key=lambda point: order[point[1]])
    return tuple(_first_match_rows(ranked))


def decide(keys: dict[str, int]) -> Outcome:
    """The outcome of the first row whose keys match (the last row matches every packet)."""
    return next(row.outcome for row in verdict_rows() if row.matches(keys))

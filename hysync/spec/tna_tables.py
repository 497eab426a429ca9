"""The TNA program's decision tables (p4src/tna, aggregation.p4): `classify` (Latching: what
the latches' answers make of a contribution) and `verdict` (Counting: what an admitted
contribution of the slot's install is), each as rows over what the TNA registers answer,
first match wins.

The TNA program cannot evaluate the decision table (`decision.py`) as v1model does: its
registers are split over stages, each touched once per pass, so what it knows when it
decides is the answers of those registers (the latches, `member_seq`, `Count` with its close
guard), and its register updates happen before the verdict rather than after it
(docs/tofino.md, "Differences from v1model"). These tables are its decision, written once:
`python -m hysync.gen_p4` writes them as the const entries of `classify` and `verdict`
(p4src/tna/include/control/classify.p4, verdict.p4), and the TNA model
(tests/conformance/tna_model.py) evaluates these rows, so the conformance suite checks the
rows the program runs. tests/test_tna_tables.py holds `verdict` to the decision table on
every combination of flags and register answers the TNA passes can produce: a rule changed
there fails it until these rows follow, or the difference is listed in docs/tofino.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hysync.spec.decision import Counter, Verdict
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
    ("counted", "meta.tf.counted"),
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


def _resync(verdict: Verdict, drop: DropReason, reason: ResyncReason, counter: Counter, *,
            with_round: bool = False) -> Outcome:
    return Outcome(Action.RESYNC_ROUND if with_round else Action.RESYNC, verdict, drop, reason,
                   counter)


_NOT_JOINED = _resync(Verdict.NOT_JOINED, DropReason.NOT_JOINED, ResyncReason.NOT_JOINED,
                      Counter.NONE)

ROWS: tuple[Row, ...] = (
    Row({"not_joined": 1}, _NOT_JOINED, "a JOIN with no round to join"),
    Row({"async_path": 1, "counted": 1}, Outcome(Action.ACK),
        "async: a copy of a counted contribution is acknowledged"),
    Row({"async_path": 1, "join": 1}, _NOT_JOINED,
        "async: a JOIN never makes a round of its own"),
    Row({"async_path": 1}, Outcome(Action.ASYNC_ROUND), "async: a round of its own"),
    Row({"open_sync": 1, "fresh": 0, "chunk_ok": 0},
        _resync(Verdict.CHUNK_MISMATCH, DropReason.CHUNK_MISMATCH,
                ResyncReason.CHUNK_MISMATCH, Counter.NONE, with_round=True),
        "the open round aggregates another chunk"),
    Row({"open_sync": 1, "fresh": 1, "closes": 1},
        Outcome(Action.OPEN_ROUND, Verdict.CLOSE, result_op=ResultOp.WRITE),
        "opens the round and closes it (a quorum of one)"),
    Row({"open_sync": 1, "fresh": 1}, Outcome(Action.OPEN_ROUND, Verdict.ABSORB,
                                              result_op=ResultOp.NONE),
        "opens the round"),
    Row({"open_sync": 1, "counted": 1, "closes": 1},
        Outcome(Action.DUPLICATE, Verdict.CLOSE, result_op=ResultOp.WRITE,
                lane_op=LaneOp.READ),
        "a duplicate closes a round the shrunk membership has filled"),
    Row({"open_sync": 1, "counted": 1},
        Outcome(Action.DUPLICATE, Verdict.DUPLICATE, result_op=ResultOp.NONE,
                lane_op=LaneOp.NONE),
        "a duplicate: the round's result will answer it"),
    Row({"open_sync": 1, "count_out": 0}, Outcome(Action.CLOSING),
        "the round's close is under way (Count refused it)"),
    Row({"open_sync": 1, "closes": 1}, Outcome(Action.JOIN_ROUND, Verdict.CLOSE,
                                               result_op=ResultOp.WRITE),
        "counted, and the quorum is reached: the round closes"),
    Row({"open_sync": 1}, Outcome(Action.JOIN_ROUND, Verdict.ABSORB, result_op=ResultOp.NONE),
        "counted; the round stays open"),
    Row({"prev": 1}, Outcome(Action.RESEND), "the round that closed last: its stored result"),
    Row({"latched": 1, "counted": 1},
        _resync(Verdict.STALE, DropReason.STALE, ResyncReason.STALE_COUNTED, Counter.STALE,
                with_round=True),
        "stale, but r was counted: its result is gone (a round is under way)"),
    Row({"latched": 1},
        _resync(Verdict.STALE, DropReason.STALE, ResyncReason.STALE_ROUND, Counter.STALE,
                with_round=True),
        "stale: r was not counted (a round is under way)"),
    Row({"counted": 1},
        _resync(Verdict.STALE, DropReason.STALE, ResyncReason.STALE_COUNTED, Counter.STALE),
        "stale, but r was counted: its result is gone"),
    Row({}, _resync(Verdict.STALE, DropReason.STALE, ResyncReason.STALE_ROUND, Counter.STALE),
        "stale: r was not counted"),
)


def decide(keys: dict[str, int]) -> Outcome:
    """The outcome of the first row whose keys match (the last row matches every packet)."""
    return next(row.outcome for row in ROWS if row.matches(keys))

"""The TNA program's verdict (p4src/tna, `Counting`): what an admitted contribution of the
slot's install is, as rows over the flags the TNA registers answer, first match wins.

The TNA program cannot evaluate the decision table (`decision.py`) as v1model does: its
registers are split over stages, each touched once per pass, so what it knows when it
decides is the answers of those registers (the latches, `member_seq`, `Count` with its close
guard), and its register updates happen before the verdict rather than after it
(docs/tofino.md, "Differences from v1model"). This table is its decision, written once:
`python -m hysync.gen_p4` writes it as the const entries of the `verdict` table
(p4src/tna/include/control/verdict.p4), and the TNA model (tests/conformance/tna_model.py)
evaluates these rows to decide, so the conformance suite checks the rows the program runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from hysync.spec.decision import Counter, Verdict
from hysync.wire import DropReason, ResyncReason

# The table's keys, in order: (name, the P4 expression). `count_out` is Count's answer (the
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
    match: dict[str, int] = field(default_factory=dict)  # key -> value; the others: any
    outcome: Outcome = Outcome(Action.RESYNC)
    why: str = ""

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

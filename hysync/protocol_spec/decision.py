"""What the switch does with an admitted contribution (docs/protocol.md §4 steps 9-10): one
decision table, first match wins, over facts every target computes from its registers.

The table is the spec. The reference model (softswitch/pipeline.py) evaluates it; the native
data plane looks it up in the C++ header generated from it (`render_cpp`, at build time);
docs/protocol.md §4 prints it (`render_markdown`, kept in step by a test). What each target
does with an outcome's register ops (how it stores a round, a lane bank, a member cell) is
its own; what the outcome is, is decided here alone.

A fact is a bit of `Fact`; a row names the facts that must hold and those that must not, and
any other fact may be either. Step 8 (the install epoch, the mode latch) runs before the
table; the outcome's effects are applied after it, in this order: the member cell
(`SeqOp`), the drop and member counters, the lanes (`LaneOp`), then the slot and the packet
out (`Emit`).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from hysync.wire import DropReason, ResyncReason


class Fact(enum.IntFlag):
    """What a target knows about the contribution and its slot once step 8 has run (`r`: the
    round field, `w`: the sender, `q`: the effective quorum, the cell: member_seq and
    member_epoch of (slot, w))."""

    ASYNC = 1 << 0          # the slot's latched mode is async
    COUNTED = 1 << 1        # the cell says r was counted in this install
    REFUSED = 1 << 2        # the cell holds r under the refusal mark (answered "not counted")
    JOIN_MARKED = 1 << 3    # the cell holds ~r under the refusal mark (a JOIN's mark)
    JOIN = 1 << 4           # the contribution carries FLAG_JOIN
    OPEN = 1 << 5           # r is the open round (r == round[s])
    PREV = 1 << 6           # r is the round that closed last (r == round[s] - 1, res_valid)
    EMPTY = 1 << 7          # count[s] == 0: nobody counted in the open round yet
    HAS_BIT = 1 << 8        # w's bit is in bitmap[s]
    FULL = 1 << 9           # count[s] >= q (the membership shrank under the round)
    CLOSES = 1 << 10        # count[s] + 1 >= q: counting w closes the round
    CHUNK_DIFFERS = 1 << 11  # the contribution's chunk is not chunk[s]
    RES_HAS_BIT = 1 << 12   # w's bit is in res_bitmap[s]
    BEHIND = 1 << 13        # the cell says a number 1 .. ASYNC_WINDOW - 1 after r was counted


ALL_FACTS = functools.reduce(lambda a, b: a | b, Fact)


class Verdict(enum.IntEnum):
    """What the packet was (verdict_t in the generated p4src/shared/decision.p4)."""

    NONE = 0
    ABSORB = 1
    CLOSE = 2
    DUPLICATE = 3
    CHUNK_MISMATCH = 4
    RESEND = 5
    STALE = 6
    ACK = 7
    NOT_JOINED = 8


class Counter(enum.IntEnum):
    """The per-member counter the packet increments (p4src member_counter_t); a close also
    counts closes[job, w]."""

    NONE = 0
    CONTRIBUTIONS = 1
    LATE = 2
    DUPLICATES = 3
    STALE = 4


class SeqOp(enum.IntEnum):
    """What the member cell (member_seq, member_epoch of (slot, w)) takes."""

    NONE = 0
    RECORD = 1      # r, epoch: counted
    REFUSE = 2      # r, ~epoch, unless the cell says r was counted: the refusal mark
    JOIN_MARK = 3   # ~r, ~epoch, unless the cell says r was counted: the JOIN mark
    JOIN_SPEND = 4  # member_epoch = 0: the JOIN mark is spent


class LaneOp(enum.IntEnum):
    """What the open bank (round[s] & 1) takes."""

    NONE = 0
    WRITE = 1        # the contribution's lanes (an async round of its own)
    WRITE_OPEN = 2   # the contribution's lanes, and chunk[s] latches its chunk
    ADD = 3          # += the contribution's lanes (wrapping int32)


class Emit(enum.IntEnum):
    """What happens to the slot and what goes out."""

    NONE = 0         # nothing: the packet is dropped
    ABSORB = 1       # count[s] += 1, w's bit set; nothing out
    CLOSE = 2        # the round closes with w counted: RESULT multicast, round[s] += 1
    CLOSE_AS_IS = 3  # the round closes with what it holds (w was counted before)
    RESEND = 4       # the stored result of round r, unicast back, flag RESEND
    ACK = 5          # header only: r was counted before (async)
    RESYNC = 6       # header only, with the slot's state and `reason`


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    emit: Emit
    drop: DropReason | None = None
    counter: Counter = Counter.NONE
    seq: SeqOp = SeqOp.NONE
    lanes: LaneOp = LaneOp.NONE
    reason: ResyncReason = ResyncReason.NONE  # a RESYNC's


@dataclass(frozen=True, slots=True)
class Row:
    when: Fact          # must hold
    unless: Fact        # must not hold
    outcome: Outcome
    why: str

    def matches(self, facts: int) -> bool:
        return facts & self.when == self.when and not facts & self.unless


def _row(when: Fact, outcome: Outcome, why: str, unless: int = 0) -> Row:
    return Row(Fact(when), Fact(unless), outcome, why)


F = Fact
_DUPLICATE = dict(drop=DropReason.DUPLICATE, counter=Counter.DUPLICATES)
_STALE = dict(drop=DropReason.STALE, counter=Counter.STALE, seq=SeqOp.REFUSE)
_COUNT_ME = dict(counter=Counter.CONTRIBUTIONS, seq=SeqOp.RECORD)
_NOT_JOINED = dict(drop=DropReason.NOT_JOINED, reason=ResyncReason.NOT_JOINED)

ROWS: tuple[Row, ...] = (
    # ---- step 10: async, every new contribution a round of its own
    _row(F.ASYNC | F.COUNTED, Outcome(Verdict.ACK, Emit.ACK, **_DUPLICATE),
         "async: a copy of a counted contribution is acknowledged, not counted again"),
    _row(F.ASYNC | F.JOIN, Outcome(Verdict.NOT_JOINED, Emit.RESYNC, **_NOT_JOINED),
         "async: a JOIN never makes a round of its own"),
    _row(F.ASYNC | F.REFUSED,
         Outcome(Verdict.STALE, Emit.RESYNC, drop=DropReason.STALE, counter=Counter.STALE,
                 reason=ResyncReason.STALE_ROUND),
         "async: r was answered 'not counted' before (a copy behind a swap into async)"),
    _row(F.ASYNC | F.BEHIND,
         Outcome(Verdict.STALE, Emit.RESYNC, drop=DropReason.STALE, counter=Counter.STALE,
                 reason=ResyncReason.STALE_ROUND),
         "async: an older copy behind the member's newer contribution (counted, or given up): "
         "not counted"),
    _row(F.ASYNC, Outcome(Verdict.CLOSE, Emit.CLOSE, lanes=LaneOp.WRITE, **_COUNT_ME),
         "async: counted, and closes a round of its own"),
    # ---- step 9: sync and partial, the open round
    _row(F.OPEN | F.HAS_BIT | F.FULL, Outcome(Verdict.DUPLICATE, Emit.CLOSE_AS_IS, **_DUPLICATE),
         "a duplicate closes a round the shrunk membership has filled"),
    _row(F.OPEN | F.HAS_BIT, Outcome(Verdict.DUPLICATE, Emit.NONE, **_DUPLICATE),
         "a duplicate: the round's result will answer it"),
    _row(F.OPEN | F.JOIN | F.EMPTY,
         Outcome(Verdict.NOT_JOINED, Emit.RESYNC, seq=SeqOp.JOIN_MARK, **_NOT_JOINED),
         "a JOIN never opens a round; it leaves the JOIN mark"),
    _row(F.OPEN | F.JOIN | F.JOIN_MARKED,
         Outcome(Verdict.NOT_JOINED, Emit.RESYNC, seq=SeqOp.JOIN_SPEND, **_NOT_JOINED),
         "a JOIN that meets the JOIN mark (a copy of one refused) is refused and spends it"),
    _row(F.OPEN | F.CHUNK_DIFFERS,
         Outcome(Verdict.CHUNK_MISMATCH, Emit.RESYNC, drop=DropReason.CHUNK_MISMATCH,
                 seq=SeqOp.REFUSE, reason=ResyncReason.CHUNK_MISMATCH),
         "the open round aggregates another chunk", unless=F.EMPTY),
    _row(F.OPEN | F.EMPTY | F.CLOSES,
         Outcome(Verdict.CLOSE, Emit.CLOSE, lanes=LaneOp.WRITE_OPEN, **_COUNT_ME),
         "opens the round and closes it (a quorum of one)"),
    _row(F.OPEN | F.EMPTY, Outcome(Verdict.ABSORB, Emit.ABSORB, lanes=LaneOp.WRITE_OPEN,
                                   **_COUNT_ME),
         "opens the round"),
    _row(F.OPEN | F.CLOSES, Outcome(Verdict.CLOSE, Emit.CLOSE, lanes=LaneOp.ADD, **_COUNT_ME),
         "counted, and the quorum is reached: the round closes"),
    _row(F.OPEN, Outcome(Verdict.ABSORB, Emit.ABSORB, lanes=LaneOp.ADD, **_COUNT_ME),
         "counted; the round stays open"),
    # ---- step 9: the round that closed last
    _row(F.PREV | F.RES_HAS_BIT,
         Outcome(Verdict.RESEND, Emit.RESEND, counter=Counter.DUPLICATES),
         "the sender's result was lost: the stored result again"),
    _row(F.PREV, Outcome(Verdict.RESEND, Emit.RESEND, counter=Counter.LATE, seq=SeqOp.REFUSE),
         "the sender came after the quorum: the stored result, without its bit"),
    # ---- step 9: anything else
    _row(F.COUNTED, Outcome(Verdict.STALE, Emit.RESYNC, reason=ResyncReason.STALE_COUNTED,
                            **_STALE),
         "stale, but r was counted: its result is gone"),
    _row(F(0), Outcome(Verdict.STALE, Emit.RESYNC, reason=ResyncReason.STALE_ROUND, **_STALE),
         "stale: r was not counted"),
)


def first_row(facts: int) -> Row:
    """The first row that `facts` match (the last row matches every one)."""
    return next(row for row in ROWS if row.matches(facts))


@functools.cache
def decide(facts: int) -> Outcome:
    """The outcome of the first row that `facts` match."""
    return first_row(facts).outcome


def facts_of(*, asynchronous: bool, counted: bool, refused: bool, join_marked: bool,
             join: bool, open_round: bool, prev: bool, count: int, has_bit: bool, q: int,
             chunk_differs: bool, res_has_bit: bool, behind: bool) -> int:
    """The facts, from the values a target reads (the reference model's way of saying it)."""
    return ((F.ASYNC if asynchronous else 0) | (F.COUNTED if counted else 0)
            | (F.REFUSED if refused else 0) | (F.JOIN_MARKED if join_marked else 0)
            | (F.JOIN if join else 0) | (F.OPEN if open_round else 0)
            | (F.PREV if prev else 0) | (F.EMPTY if count == 0 else 0)
            | (F.HAS_BIT if has_bit else 0) | (F.FULL if count >= q else 0)
            | (F.CLOSES if count + 1 >= q else 0) | (F.CHUNK_DIFFERS if chunk_differs else 0)
            | (F.RES_HAS_BIT if res_has_bit else 0) | (F.BEHIND if behind else 0))

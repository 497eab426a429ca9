"""What one `Transport.allreduce` call (or `poll_results`) did, for logs and tests.

`results` holds the wire header (`hysync.wire.HEADER_DTYPE`) of every result the
call applied, whatever key it belonged to: round, chunk, contributor count and
bitmap, and the mode the round was aggregated under.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hysync import wire
from hysync.worker.quantize import QuantStats


@dataclass(slots=True)
class CallStats:
    key: Any = None
    elements: int = 0
    chunks: int = 0
    elapsed_s: float = 0.0
    waited_s: float = 0.0  # of elapsed_s: blocked until the switch replied (or a timer fell due)
    results: np.ndarray = field(default_factory=lambda: np.empty(0, wire.HEADER_DTYPE))
    included: int = 0  # my contributions counted in a round (result bitmap, ACK or STALE_COUNTED)
    carried: int = 0  # my chunks whose round closed without me: kept as residual
    residual_contribs: int = 0  # residual-only contributions made to re-align a slot
    null_contribs: int = 0  # zero contributions for a sync round of a chunk no key of mine owns
    own_applied: int = 0  # own contributions applied locally because their result was lost (ACK)
    uneven_results: int = 0  # results applied that were not a sync round of every member
    retransmits: int = 0  # sent again because a timer ran out: lost, or late
    resent: int = 0  # parked packets sent again without a timeout (a call's hurry, parking)
    state_resets: int = 0  # replies that showed the switch's state for the job to be new
    parked: int = 0  # partial: silent contributions settled as counted (see Transport._park)
    parked_missed: int = 0  # ... whose round then closed without them: back to residual
    resyncs: Counter = field(default_factory=Counter)  # ResyncReason name -> replies
    relayed: int = 0  # RESYNCs a leaf relayed from the spine (flag RELAYED, docs/protocol.md §11)
    acks: int = 0
    duplicate_results: int = 0  # results already applied (a relay duplicated, or a RESEND)
    stray_replies: int = 0  # replies that answer an older packet, not the one in flight
    bad_datagrams: int = 0  # did not decode, or not for this worker/job/slot range
    joins: int = 0  # JOINs offered to rounds on idle slots while the call was stuck
    # non-finite elements of mine not sent again: a round of their chunk that every member
    # applies is non-finite there already (docs/protocol.md §9, "Non-finite values")
    absorbed: int = 0
    quant: QuantStats = field(default_factory=QuantStats)
    srtt_s: float | None = None
    rto_s: float = 0.0
    needs_resync: bool = False
    in_flight: int = 0  # packets still awaiting their fate after the call (parked, residual-only)
    slot_modes: tuple[int, ...] = ()  # the mode each slot last reported (-1: not heard from)

    @property
    def modes(self) -> Counter:
        """Rounds applied in this call, by the mode they were aggregated under."""
        # Counted in numpy: a training loop reads this every step, over a few thousand
        # results, and one enum lookup per result cost milliseconds a step.
        return Counter({_MODE_NAMES[m]: int(n) for m, n in _tally(self.results["mode"])})

    @property
    def contributors(self) -> Counter:
        """Rounds applied in this call, by number of contributors."""
        return Counter({int(c): int(n) for c, n in _tally(self.results["count"])})

    def summary(self) -> str:
        modes = ",".join(f"{k}:{v}" for k, v in sorted(self.modes.items())) or "-"
        counts = ",".join(f"{k}:{v}" for k, v in sorted(self.contributors.items())) or "-"
        resyncs = ",".join(f"{k}:{v}" for k, v in sorted(self.resyncs.items())) or "-"
        return (f"key={self.key!r} elements={self.elements} chunks={self.chunks} "
                f"time={self.elapsed_s * 1e3:.1f}ms rounds={len(self.results)} modes={modes} "
                f"contributors={counts} included={self.included} carried={self.carried} "
                f"retransmits={self.retransmits} resent={self.resent} resyncs={resyncs} "
                f"acks={self.acks} parked={self.parked} "
                f"dup_results={self.duplicate_results} stray={self.stray_replies} "
                f"bad={self.bad_datagrams} clipped={self.quant.clipped} "
                f"max_err={self.quant.max_abs_error:.3g} needs_resync={self.needs_resync}")


_MODE_NAMES = {int(m): m.name.lower() for m in wire.Mode}


def _tally(values: np.ndarray) -> list[tuple[int, int]]:
    """(value, occurrences) of each distinct value."""
    distinct, counts = np.unique(values, return_counts=True)
    return list(zip(distinct.tolist(), counts.tolist(), strict=True))

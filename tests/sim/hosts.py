"""A simulated member that is a host of several ranks, as hysync/host_group.py runs one.

Each member of a plan with `ranks_per_host` R > 1 is a host: R ranks compute a gradient
each, gloo reduces them (ReduceOp.SUM, float32) onto local rank 0, the *leader*, which
divides the sum by R in float32 (`tensor.div_(size)`) and makes the host's one switch call
with that mean: the member's engine in the simulation. What the leader's call ends with is
broadcast to the host's ranks: first (ok, updates applied, needs resync), then, where ok,
the leader's output tensor; where the leader's call failed, every other rank raises.

The simulation keeps each rank's books apart from its host's (Rank), so the checker
(check_hosts.py) holds every rank to exactly-once and agreement, not only the member.

Gradients: each rank's are whole multiples of 1/scale, |x| <= 1000/scale, drawn per call,
and the last rank's is moved by less than R units so that the host's sum is a multiple of
R: float32 holds every partial sum exactly (in any order, so gloo's order of summation
does not matter) and the division by R is exact, so the leader's books balance bit for
bit, as a one-rank member's do.

Faults inside a host (plan.HOST_KINDS):
* a rank that stalls: the host's next reduce waits for it, so the leader starts its next
  switch call no earlier than the stall's end; a switch call under way goes on (its reduce
  is done). The host is a straggler for a while.
* a rank that dies: on the real system its peers' gloo collectives fail at once (the
  dead process's TCP connections close; NCCL would instead hang until the group's
  timeout), the leader's all-reduce raises, and torchrun's agent stops the host's other
  ranks. The simulation kills the host at that moment: the member dies, as plan's
  `death` kills one, with its documented consequences (docs/protocol.md §9 Failures,
  rules dead_member and died_with_member).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hysync import wire

GRADIENT_BOUND = 1000  # a rank's gradient elements, in units of 1/scale


@dataclass
class Rank:
    """One rank of a host: what it was given and what it applied."""
    host: int
    local: int                     # its local rank; 0 is the leader
    given: list[np.ndarray]        # per key: every gradient given, in fixed point (int64)
    # per call its leader ended: (call index, ok, updates, needs resync, output or None)
    outputs: list[tuple[int, bool, float, bool, np.ndarray | None]] = field(
        default_factory=list)

    @property
    def leader(self) -> bool:
        return self.local == 0


def ranks_of(host: int, ranks: int, sizes: tuple[int, ...], lanes: int) -> list[Rank]:
    return [Rank(host, r, [np.zeros(-(-n // lanes) * lanes, np.int64) for n in sizes])
            for r in range(ranks)]


def draw_gradients(rng: np.random.Generator, ranks: int, n: int) -> np.ndarray:
    """(ranks, n) gradients in units of 1/scale whose column sums are multiples of `ranks`
    (see the module's doc)."""
    fixed = rng.integers(-GRADIENT_BOUND, GRADIENT_BOUND + 1, (ranks, n))
    fixed[-1] -= fixed.sum(axis=0) % ranks
    return fixed


def reduce_mean(grads: np.ndarray) -> np.ndarray:
    """What the leader hands the switch: gloo's float32 SUM of the ranks' rows onto local
    rank 0, then `div_(ranks)` in float32 (hysync/host_group.py HostGroup.allreduce)."""
    total = grads[0].astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as in gloo
        for row in grads[1:]:
            total = total + row.astype(np.float32)
        return (total / np.float32(len(grads))).astype(np.float32)


def updates(results: list[bytes], first_chunk: int, members: int) -> float:
    """HySyncWorker.updates_applied of one call: over the result headers it applied to its
    key's first chunk, the sum of their contributor counts / members."""
    total = 0
    for head in results:
        (_v, _op, _fl, _mode, _job, _w, count, _slot, _r, _q, _rnd, chunk,
         _bitmap) = wire.HEADER_STRUCT.unpack_from(head)
        if chunk == first_chunk:
            total += count
    return total / members

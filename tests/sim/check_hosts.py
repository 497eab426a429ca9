"""The invariants of a member that is a host of several ranks (tests/sim/hosts.py), for
every rank (docs/protocol.md §10, "Hosts of several ranks"). check.check adds them to the
member's own; a plan of one rank per host has nothing here.

* exactly-once, per rank: check.py holds the leader's books (what its engine was given ==
  counted + carried); here every rank's gradient must be in what its leader was given,
  whole: per element, the sum of what the host's ranks were given == R x what the leader
  was given (the leader sends the host's mean). Together: each rank's contribution is
  counted exactly once or carried whole by its host's leader.
* agreement, per rank: every rank of a host ends every call its leader ended, in order,
  with what the leader's call ended with (ok, updates applied, needs resync) and, where
  ok, the leader's output, bit for bit: no rank applies another result, and none is
  behind its leader.
"""

from __future__ import annotations

import numpy as np

from .run import Record, Sim


def check_hosts(rec: Record, sim: Sim) -> list[str]:
    out: list[str] = []
    for wk in sim.workers:
        if wk.ranks:
            out += _rank_books(rec, wk) + _rank_agreement(wk)
    return out


def _rank_books(rec: Record, wk) -> list[str]:
    ranks = len(wk.ranks)
    for index, (k, n) in enumerate(zip(wk.keys, rec.plan.sizes, strict=True)):
        skip = np.zeros(len(wk.grads[index]), bool)
        skip[n:] = True
        for key, element in wk.injected:  # non-finite: their books are check.py's
            if key == index:
                skip[element] = True
        given = sum(r.given[index] for r in wk.ranks)
        carried = ranks * wk.grads[index]
        diff = np.where(skip, 0, given - carried)
        if diff.any():
            j = int(np.flatnonzero(diff)[0])
            each = ", ".join(f"rank {r.local}: {int(r.given[index][j])}" for r in wk.ranks)
            return [f"exactly-once: host {wk.w} key {k} element {j}: its {ranks} ranks were "
                    f"given {int(given[j])} in all ({each}), its leader carried {ranks} x "
                    f"{int(wk.grads[index][j])} = {int(carried[j])} for them "
                    f"({'doubled' if diff[j] < 0 else 'lost'} {abs(int(diff[j]))})"]
    return []


def _rank_agreement(wk) -> list[str]:
    leader = wk.ranks[0].outputs
    ended = [(c.index, c.status == "done") for c in wk.calls if c.end >= 0]
    out = []
    if [(i, ok) for i, ok, *_ in leader] != ended:
        out.append(f"agreement: host {wk.w}'s leader ended calls "
                   f"{[(i, ok) for i, ok, *_ in leader][:6]}, its engine "
                   f"{ended[:6]} ((call, ok) each)")
    for rank in wk.ranks[1:]:
        if len(rank.outputs) < len(leader):
            out.append(f"agreement: host {wk.w} rank {rank.local} is behind its leader: it "
                       f"ended {len(rank.outputs)} of the leader's {len(leader)} calls")
        for mine, its in zip(rank.outputs, leader, strict=False):
            if mine[:4] != its[:4]:
                out.append(f"agreement: host {wk.w} rank {rank.local} ended call {mine[0]} "
                           f"with (call, ok, updates, needs resync) {mine[:4]}, its leader "
                           f"with {its[:4]}")
                break
            if mine[4] is not None and not _same_bits(mine[4], its[4]):
                j = int(np.flatnonzero(mine[4].view(np.uint32) != its[4].view(np.uint32))[0])
                out.append(f"agreement: host {wk.w} rank {rank.local} applied {mine[4][j]!r} "
                           f"at element {j} of call {mine[0]}, its leader {its[4][j]!r}: "
                           "not the leader's result")
                break
    return out


def _same_bits(a: np.ndarray, b: np.ndarray | None) -> bool:
    return b is not None and a.shape == b.shape and bool(
        np.array_equal(a.view(np.uint32), b.view(np.uint32)))

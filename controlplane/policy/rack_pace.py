"""The pace of the hosts behind each leaf of a job across switches: what the spine's
policy measures its members (the leaves) by.

*Why not the spine's own counters.* At the spine a leaf's contributions are its closed
sums, and when a sum reaches the spine depends on the spine's mode as much as on the
rack: in partial the fast rack's sums close the spine's rounds, the slow rack's leaf is
moved on to rounds it took no part in, and its hosts' gradients are carried into later
sums. With 2 racks x 3 hosts and one rack computing 2x longer, the spine's counters put
the slow leaf anywhere from 1.11x to 1.62x (docs/performance.md, "Two levels"). A host's
own counters at its leaf do not depend on what the spine did with the sums: every
gradient a host sends ends as one contribution or one late packet at its leaf (detect.py,
*pace*), so in partial at the spine each rack's hosts count at the pace they send. (That
pace is compute and communication: hosts computing 2x longer sent 1.5-1.95x slower in
that bench. What keeps partial(1) worth it at such a slowdown is that the slow leaf's
sums still make many of the spine's rounds, which the cost model counts: policies.py.)

*Which host stands for the rack.* The `ceil(f * n)`-th fastest of the leaf's n active
hosts, f the policy's `min_quorum_fraction` (the median of 3 hosts, the faster of 2): the
pace the leaf's own policy can give its rack by leaving out its slower hosts, down to
its smallest quorum. A rack with one slow host is the leaf's to handle (partial at the
leaf), not a slow member of the spine; a rack whose hosts are all slow reads slow
whatever mode either level is in. (In sync at the spine every rack waits for the
slowest, so the paces are equal there: the spine finds a slow leaf by the closes of its
own counters, as at one switch, and measures it in partial.)

A leaf's pace is read as packets a second over the time between its own two reads; the
runner scales it to the spine's interval.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from hysync.controlplane.controller import Controller
from hysync.controlplane.errors import DeadlineExceededError
from hysync.controlplane.policy.detect import Delta
from hysync.controlplane.tables.counters import JobStats

log = logging.getLogger(__name__)


class RackPace:
    """Reads the hosts' counters at every leaf of `job_id` (`leaves`: the leaf's member id
    at the spine -> the attached controller of that leaf) and gives each leaf's pace."""

    def __init__(self, job_id: int, leaves: Mapping[int, Controller], *,
                 quorum_fraction: float) -> None:
        if not 0 < quorum_fraction <= 1:
            raise ValueError(f"quorum_fraction must be in (0, 1], got {quorum_fraction}")
        self.job_id, self.leaves = job_id, dict(leaves)
        self.quorum_fraction = quorum_fraction
        self._prev: dict[int, JobStats] = {}
        # Leaf reads that missed their deadline: no tick is skipped for them (the spine
        # measures by its own counters that interval), but serve's metrics count them.
        self.missed_reads = 0

    def sample(self) -> dict[int, float] | None:
        """Each leaf's pace (its standing host's packets a second) since the last sample;
        None when some leaf has no earlier read to compare with or its read missed its
        deadline (the spine then measures by its own counters for that interval)."""
        paces: dict[int, float] = {}
        complete = True
        for member, leaf in self.leaves.items():
            try:
                stats = leaf.stats(self.job_id)
            except DeadlineExceededError as err:
                self.missed_reads += 1
                log.warning("job %d: the counters of leaf member %d missed their deadline "
                            "(%s): the spine measures it by its own counters this tick",
                            self.job_id, member, " ".join(str(err).split()))
                complete = False
                continue
            before = self._prev.get(member)
            self._prev[member] = stats
            if before is None:
                complete = False
                continue
            paces[member] = standing_pace(before, stats, self.quorum_fraction)
        return paces if complete else None


def standing_pace(before: JobStats, after: JobStats, quorum_fraction: float) -> float:
    """A leaf's pace between two reads of its counters: packets a second of the host that
    stands for the rack, the `ceil(quorum_fraction * n)`-th fastest of the n hosts active
    at both reads (0 without any)."""
    counts = sorted((Delta.between(before.workers.get(w), s).pace
                     for w, s in after.workers.items()
                     if s.active and w in before.workers and before.workers[w].active),
                    reverse=True)
    if not counts:
        return 0.0
    standing = counts[max(1, math.ceil(quorum_fraction * len(counts) - 1e-9)) - 1]
    return standing / max(after.time - before.time, 1e-9)

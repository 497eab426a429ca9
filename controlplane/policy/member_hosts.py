"""Which host each switch member of a job is, and which of the job's ranks it speaks for.

The switch counts, the policy decides, and serve excludes and readmits by member index
(a worker id). With hosts of several ranks (hysync/host_group.py) a member is a host: its
leader sends the host's mean, and every rank of the host applies what the leader applied.
A straggler found at a member is therefore a slow host, and an exclusion leaves all its
ranks out of the rounds together. Serve learns each member's host and ranks at admission
(`hysync.torch.admit` sends them); the policy's decision records, serve's status and
stats, and the metrics name them with this module's `MemberHost`.

At the spine of a job across switches the members are the leaves: a spine member is named
by its leaf (the inventory's switch name, in a field of its own, never `host`) and the
job's ranks behind it (policy/levels.py builds these from the leaves' hosts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MemberHost:
    """A member's inventory host and the job's ranks it speaks for (each None where serve
    was not told: a job added from a job file, or read back after a restart). `leaf`: at
    the spine, the leaf the member is (its host then None); None below the spine."""

    host: str | None
    ranks: tuple[int, ...] | None = None
    leaf: str | None = None

    @classmethod
    def of_leaf(cls, leaf: str, behind: Iterable[MemberHost | None]) -> MemberHost:
        """A spine member: leaf `leaf`, and the job's ranks behind it, those of its members
        `behind` (its hosts; unknown unless every one's are known)."""
        hosts = list(behind)
        if not hosts or any(h is None or h.ranks is None for h in hosts):
            return cls(None, None, leaf)
        return cls(None, tuple(sorted(r for h in hosts if h is not None and h.ranks is not None
                                      for r in h.ranks)), leaf)

    @classmethod
    def of_record(cls, record: Mapping[str, object]) -> MemberHost:
        """The member a JSON record (`fields`, serve's replies) names."""
        host, ranks, leaf = record.get("host"), record.get("ranks"), record.get("leaf")
        return cls(host if isinstance(host, str) else None,
                   tuple(ranks) if isinstance(ranks, list) else None,
                   leaf if isinstance(leaf, str) else None)

    def named(self) -> dict[str, object]:
        """What a JSON record says of the member: its host and ranks, and at the spine
        its leaf (a key only there, so that records below the spine stay as they were)."""
        said: dict[str, object] = {"host": self.host,
                                   "ranks": None if self.ranks is None else list(self.ranks)}
        if self.leaf is not None:
            said["leaf"] = self.leaf
        return said

    def fields(self, member: int) -> dict[str, object]:
        """What a JSON record says of member `member`."""
        return {"member": member, **self.named()}


Hosts = Mapping[int, MemberHost]  # member index (worker id) -> its host


def ranks_text(ranks: Iterable[int]) -> str:
    """`2, 3` / `0-7` / `0-3, 8`: the ranks in runs of consecutive ones."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}"
                     for a, b in runs)


def describe(member: int, hosts: Hosts) -> str:
    """`member 1 (host h2, ranks 2, 3)`, at the spine `member 1 (leaf leaf-1, ranks 2, 3)`;
    what is not known is left out."""
    place = hosts.get(member)
    said = []
    if place is not None and place.leaf is not None:
        said.append(f"leaf {place.leaf}")
    if place is not None and place.host is not None:
        said.append(f"host {place.host}")
    if place is not None and place.ranks is not None:
        said.append(f"rank{'s' if len(place.ranks) != 1 else ''} {ranks_text(place.ranks)}")
    return f"member {member}" + (f" ({', '.join(said)})" if said else "")


def member_fields(member: int, hosts: Hosts) -> dict[str, object]:
    """MemberHost.fields of `member`, with host and ranks None where not known."""
    return hosts.get(member, MemberHost(None)).fields(member)

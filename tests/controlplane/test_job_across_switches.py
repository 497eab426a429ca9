"""A job file whose members name their leaves (a job across switches, docs/protocol.md
§11): worker ids unique per leaf, each leaf's part of the job, and the one-line errors
of a file that mixes the forms or asks for async."""

from __future__ import annotations

from typing import Any

import pytest

from hysync.controlplane.errors import JobConfigError
from hysync.controlplane.job import JobConfig
from hysync.wire import Mode


def member(leaf: str | None, worker: int, port: int) -> dict[str, Any]:
    m = {"worker": worker, "ipv4": "127.0.0.10", "mac": f"02:00:00:00:{port >> 8 & 0xFF:02x}:"
         f"{port & 0xFF:02x}", "udp_port": port, "switch_port": worker + 1}
    if leaf is not None:
        m["leaf"] = leaf
    return m


def job(members: list[dict[str, Any]], **top: Any) -> JobConfig:
    return JobConfig.from_dict({"job_id": 3, "slots": {"base": 0, "count": 8},
                                "members": members, **top})


RACKS = [member("leaf-b", w, 41000 + w) for w in range(3)] + \
        [member("leaf-a", w, 42000 + w) for w in range(2)]


def test_members_behind_leaves_reuse_worker_ids_and_split_per_leaf() -> None:
    j = job(RACKS)
    assert j.spans_switches and j.leaf_names() == ("leaf-a", "leaf-b")
    a, b = j.on_leaf("leaf-a"), j.on_leaf("leaf-b")
    assert [m.worker for m in a.members] == [0, 1] and [m.worker for m in b.members] == [0, 1, 2]
    assert {m.udp_port for m in b.members} == {41000, 41001, 41002}
    assert not a.spans_switches and (a.slots, a.job_id) == ((0, 7), 3)
    one = job([member(None, w, 43000 + w) for w in range(2)])
    assert not one.spans_switches and one.leaves == ()


def test_partial_quorum_fits_every_level() -> None:
    """The file's mode starts every level: its quorum must fit the spine's leaves and the
    smallest leaf's hosts."""
    assert job(RACKS, mode="partial", quorum=2).quorum == 2
    with pytest.raises(JobConfigError, match="quorum = 3.*1..2 .it starts every level"):
        job(RACKS, mode="partial", quorum=3)


@pytest.mark.parametrize(("members", "top", "fragment"), [
    (RACKS, {"mode": "async"}, 'mode = "async" on a job across switches'),
    (RACKS[:3] + [member(None, 5, 44000)], {}, "members[3].leaf is missing"),
    (RACKS + [member("leaf-a", 1, 45000)], {},
     "behind leaf 'leaf-a': members[2].worker = 1 is also members[1].worker"),
    (RACKS + [member("leaf-a", 4, 41000)], {},
     "members behind leaves 'leaf-a' and 'leaf-b' share 127.0.0.10:41000"),
    ([member("leaf-a", w % 32, 40000 + w) | {"leaf": f"leaf-{w // 32}"} for w in range(256)],
     {}, "256 members: a job across switches has at most 255"),
])
def test_bad_members_across_switches_are_refused_in_one_line(members, top, fragment) -> None:
    with pytest.raises(JobConfigError) as caught:
        job(members, **top)
    assert fragment in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_one_switch_job_file_is_read_as_before() -> None:
    j = job([member(None, w, 46000 + w) for w in range(4)], mode="partial", quorum=4)
    assert (j.mode, j.quorum, len(j.members)) == (Mode.PARTIAL, 4, 4)

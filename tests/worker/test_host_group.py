"""A host's ranks reduce through real gloo groups (hysync/host_group.py): when the
leader's switch call fails, the leader raises that error, every other rank of the host
learns it failed instead of waiting for a broadcast that never comes, and the host's
next all-reduce works."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from hysync.host_group import Applied, HostGroup, HostLayout

RANKS = 3
WAIT = 120  # seconds: a generous deadline for gloo's rendezvous on a busy machine


class SwitchDown(RuntimeError):
    pass


def host_of(ranks: int) -> list[HostGroup]:
    """One host's HostGroups, one per rank, made together as the ranks make them."""
    store = dist.HashStore()
    made: dict[int, HostGroup] = {}

    def make(local: int) -> None:
        made[local] = HostGroup(store, HostLayout(hosts=1, ranks_per_host=ranks, host=0,
                                                  local_rank=local), timeout=WAIT)

    threads = [threading.Thread(target=make, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT)
    assert len(made) == ranks, "the host's gloo groups did not form"
    return [made[r] for r in range(ranks)]


def reduce_all(host: list[HostGroup], switch: Callable[[torch.Tensor], Applied]
               ) -> tuple[list[torch.Tensor], list[torch.futures.Future]]:
    """Every rank's all-reduce of the tensor full of (its local rank + 1)."""
    tensors = [torch.full((8,), float(r + 1)) for r in range(len(host))]
    futures = [g.allreduce(t, switch if g.layout.leader else None)
               for g, t in zip(host, tensors, strict=True)]
    return tensors, futures


def outcome(future: torch.futures.Future) -> BaseException | Applied:
    try:
        return future.wait()
    except BaseException as err:  # noqa: BLE001 - the outcome under test
        return err


def test_a_failed_leader_call_fails_every_rank_of_the_host_and_the_next_call_works() -> None:
    host = host_of(RANKS)
    try:
        def down(mean: torch.Tensor) -> Applied:
            raise SwitchDown("the switch at 10.0.0.1:9000 did not answer for 5.0 s")

        _, futures = reduce_all(host, down)
        leader, *others = (outcome(f) for f in futures)
        # the leader raises the switch's own error; a DDP hook's caller sees why
        assert isinstance(leader, SwitchDown), leader
        for err in others:
            assert isinstance(err, RuntimeError) and not isinstance(err, SwitchDown), err
            assert "host 0's local rank 0" in str(err) and "failed its all-reduce" in str(err)

        seen: list[torch.Tensor] = []

        def up(mean: torch.Tensor) -> Applied:
            seen.append(mean.clone())
            mean.mul_(10)  # what the switch applied: the host's mean, times ten
            return Applied(updates=1.0, needs_resync=False)

        tensors, futures = reduce_all(host, up)
        applied = [f.wait() for f in futures]
        # the host's mean of 1, 2, 3 reached the switch; every rank holds what it applied
        assert torch.equal(seen[0], torch.full((8,), 2.0))
        for t, a in zip(tensors, applied, strict=True):
            assert torch.equal(t, torch.full((8,), 20.0))
            assert (a.updates, a.needs_resync) == (1.0, False)
    finally:
        for g in host:
            g.close()


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_host_of_one_or_two_ranks_hands_the_leaders_outcome_to_every_rank(
        ranks: int) -> None:
    host = host_of(ranks)
    try:
        def resync(mean: torch.Tensor) -> Applied:
            return Applied(updates=3.0, needs_resync=True)

        tensors, futures = reduce_all(host, resync)
        for f in futures:
            assert (f.wait().updates, f.wait().needs_resync) == (3.0, True)
        mean = sum(range(1, ranks + 1)) / ranks
        for t in tensors:
            assert torch.equal(t, torch.full((8,), mean))
    finally:
        for g in host:
            g.close()

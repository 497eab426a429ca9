"""The PyTorch DDP communication hook: gradient buckets averaged through the switch.

    state = HySyncHookState(HySyncWorker(config, scale=2**20))
    ddp_model.register_comm_hook(state, hysync_hook)

As torch/distributed/algorithms/ddp_comm_hooks: the second parameter is named
`bucket`, the future holds one tensor shaped like the bucket's buffer, and the
averaged result is copied into that buffer in place. The future carries the bucket's
device, so on CUDA DDP's streams wait for the copy back, not the host. DDP still needs a process
group (it broadcasts parameters with it); the hook replaces only the gradient
all-reduce. Error feedback is per bucket and the state owns it, as PowerSGD's state
owns `error_dict`: `state.residuals[bucket.index()]` is lent to the transport for
that bucket's call and handed back when the call ends (docs/design.md, worker/).

The state pickles, e.g. in a checkpoint with `torch.save`, between steps: the
residuals and the stats travel, the worker (socket, transport thread) does not.
After unpickling, attach a worker before the next step:

    state = torch.load(path, weights_only=False)
    state.attach(HySyncWorker(config, scale=2**20))
    ddp_model.register_comm_hook(state, hysync_hook)

On hosts that run several ranks each (hysync/host_group.py), `hysync.torch.attach`
registers `hysync_host_hook` with a `HostHookState` instead: the bucket is reduced onto
the host's leader, whose `HySyncHookState` (`state.member`) sends the host's mean through
the switch, and the leader's result and clock are broadcast to the host's ranks.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run
# time and needs `bucket: dist.GradBucket` as a type, not a string.
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from hysync.host_group import Applied, HostGroup
from hysync.worker.api import HySyncWorker
from hysync.worker.call_stats import CallStats

log = logging.getLogger(__name__)


@dataclass(slots=True)
class HookStats:
    calls: int = 0  # buckets all-reduced
    needs_resync: bool = False  # the replica missed results (see Transport.needs_resync)


class HySyncHookState:
    __slots__ = ("worker", "residuals", "stats", "_lent")

    def __init__(self, worker: HySyncWorker) -> None:
        self.worker: HySyncWorker | None = worker  # None after unpickling, until attach()
        # bucket.index() -> its float32 residual, one element per bucket element. Only the
        # buckets between calls are here: a bucket's call takes its array and gives it back
        # when it ends, so no array here is ever written by the worker's thread.
        self.residuals: dict[int, np.ndarray] = {}
        self.stats = HookStats()
        self._lent: set[int] = set()  # buckets whose call holds their residual

    def attach(self, worker: HySyncWorker) -> None:
        """Give an unpickled state the worker its next steps all-reduce through."""
        self.worker = worker

    def __getstate__(self) -> dict[str, object]:
        if self._lent:
            raise RuntimeError(f"HySyncHookState pickled while buckets {sorted(self._lent)} "
                               "are being all-reduced: pickle it between steps (after "
                               "backward() returns)")
        return {"residuals": {i: r.copy() for i, r in self.residuals.items()},
                "stats": self.stats}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.worker = None
        self.residuals = state["residuals"]  # type: ignore[assignment]
        self.stats = state["stats"]  # type: ignore[assignment]
        self._lent = set()

    def attached(self) -> HySyncWorker:
        if self.worker is None:
            raise RuntimeError("HySyncHookState has no worker (it was unpickled): call "
                               "state.attach(HySyncWorker(...)) before the next step")
        return self.worker

    def lend(self, index: int, numel: int) -> np.ndarray:
        """Bucket `index`'s residual for its call (zeros for a new bucket)."""
        residual = self.residuals.pop(index, None)
        if residual is not None and residual.size != numel:
            # DDP rebuilds its buckets after the first step; the transport starts the key
            # afresh too (Transport._index).
            log.info("bucket %d changed size %d -> %d: its residual (at most the last "
                     "quantization error in sync) is dropped", index, residual.size, numel)
            residual = None
        self._lent.add(index)
        return np.zeros(numel, dtype=np.float32) if residual is None else residual

    def give_back(self, index: int, residual: np.ndarray) -> None:
        self.residuals[index] = residual
        self._lent.discard(index)

    def last_stats(self) -> "CallStats | None":
        return self.attached().last_stats()

    def updates_applied(self) -> float:
        """Updates the latest call applied (see HySyncWorker.updates_applied)."""
        worker = self.attached()
        stats = worker.last_stats()
        return 0.0 if stats is None else worker.updates_applied(stats)


def bucket_key(index: int) -> tuple[str, int]:
    return ("bucket", index)


def hysync_hook(state: HySyncHookState,
                bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce one bucket through HySync; the future holds the averaged buffer."""
    worker = state.attached()
    buffer = bucket.buffer()
    index = bucket.index()
    # A float32 bucket gets the result in its own memory: a CPU one is reduced there, a
    # CUDA one through the worker's pinned staging and copy stream (HySyncWorker). Other
    # dtypes are reduced as a float32 copy and copied back below.
    in_place = buffer.device.type in ("cpu", "cuda") and buffer.dtype == torch.float32 \
        and buffer.is_contiguous()
    residual = state.lend(index, buffer.numel())
    try:
        # The last bucket of the pass: DDP waits for it next, so it may run on this thread
        # (HySyncWorker.allreduce_async, `blocking`).
        future = worker.allreduce_async(buffer, key=bucket_key(index), in_place=in_place,
                                        residual=residual, blocking=bucket.is_last())
    except BaseException:
        state.give_back(index, residual)
        raise

    def copy_back(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        state.give_back(index, residual)  # the call has ended, failed or not
        result = fut.value()  # a failed call raises here
        if not in_place:
            buffer.copy_(result)
        state.stats.calls += 1
        state.stats.needs_resync = worker.needs_resync
        return buffer

    return future.then(copy_back)


class HostHookState:
    """The hook state of a rank on a host that runs several ranks (hysync/host_group.py):
    the host's collectives, and at the leader the switch member's state. Every rank's
    clock and resync flag are its leader's, as the leader's broadcast tells them."""

    __slots__ = ("host", "member", "stats", "_updates")

    def __init__(self, host: HostGroup, member: HySyncHookState | None) -> None:
        if host.layout.leader != (member is not None):
            raise ValueError("a host's leader, and only it, holds the switch member's state")
        self.host = host
        self.member = member  # the leader's: its worker and residuals
        self.stats = HookStats()
        self._updates = 0.0

    def __getstate__(self) -> dict[str, object]:
        raise TypeError("a host-level hook state does not pickle: checkpoint the leader's "
                        "state.member (a HySyncHookState) instead")

    def updates_applied(self) -> float:
        """Updates the latest call applied at the leader (see HySyncWorker.updates_applied)."""
        return self._updates

    def applied(self, applied: Applied) -> None:
        self.stats.calls += 1
        self.stats.needs_resync = applied.needs_resync
        self._updates = applied.updates


def switch_call(member: HySyncHookState, key: Hashable, index: int | None = None
                ) -> Callable[[torch.Tensor], Applied]:
    """The leader's share of a host-level all-reduce: the host's mean through the switch,
    in place, with the residual of bucket `index` where given (the hook's) or the
    transport's own for `key` (the backend's)."""
    worker = member.attached()

    def call(host_mean: torch.Tensor) -> Applied:
        in_place = host_mean.dtype == torch.float32 and host_mean.is_contiguous()
        residual = None if index is None else member.lend(index, host_mean.numel())
        try:
            result = worker.allreduce(host_mean, key=key, in_place=in_place, residual=residual)
        finally:
            if residual is not None:
                member.give_back(index, residual)
        if not in_place:
            host_mean.copy_(result)
        stats = worker.last_stats(key)
        updates = 0.0 if stats is None else worker.updates_applied(stats)
        return Applied(updates, worker.needs_resync)

    return call


def hysync_host_hook(state: HostHookState,
                     bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce one bucket on the host, then (its leader) through HySync; the future
    holds the averaged buffer, the same at every rank of the host."""
    buffer = bucket.buffer()
    index = bucket.index()
    switch = None if state.member is None else switch_call(state.member, bucket_key(index),
                                                             index)
    future = state.host.allreduce(buffer, switch)

    def copy_back(fut: torch.futures.Future[Applied]) -> torch.Tensor:
        state.applied(fut.value())  # a failed call raises here
        return buffer

    return future.then(copy_back)

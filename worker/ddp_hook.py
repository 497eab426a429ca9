"""The PyTorch DDP communication hook: gradient buckets averaged through the switch.

    state = HySyncHookState(HySyncWorker(config, scale=2**20))
    ddp_model.register_comm_hook(state, hysync_hook)

As torch/distributed/algorithms/ddp_comm_hooks: the second parameter is named
`bucket`, the future holds one tensor shaped like the bucket's buffer, and the
averaged result is copied into that buffer in place. The future carries the bucket's
device, so on CUDA DDP's streams wait for the copy back, not the host. DDP still needs a process
group (it broadcasts parameters with it); the hook replaces only the gradient
all-reduce. Error feedback is per bucket, and one thing owns it, as PowerSGD's state owns
`error_dict`: the worker's engine keeps bucket i's residual under `bucket_key(i)` from
call to call; `state.residuals()` reads them (docs/design.md, worker/).

The state pickles, e.g. in a checkpoint with `torch.save`, between steps: the
residuals (read from the engine) and the stats travel, the worker (socket, transport
thread) does not; each bucket's next call hands its residual to the new worker's engine.
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
from collections.abc import Callable
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
    __slots__ = ("worker", "stats", "_buckets", "_calling", "_restored")

    def __init__(self, worker: HySyncWorker) -> None:
        self.worker: HySyncWorker | None = worker  # None after unpickling, until attach()
        self.stats = HookStats()
        self._buckets: dict[int, int] = {}  # bucket.index() -> its size, for residuals()
        self._calling: set[int] = set()  # buckets whose call is under way
        # bucket.index() -> the residual a pickle brought, until the bucket's next call hands
        # it to the worker's engine
        self._restored: dict[int, np.ndarray] = {}

    def attach(self, worker: HySyncWorker) -> None:
        """Give an unpickled state the worker its next steps all-reduce through."""
        self.worker = worker

    def residuals(self) -> dict[int, np.ndarray]:
        """bucket.index() -> a copy of its float32 residual, one element per bucket element:
        what the worker's engine keeps (and what a pickle brought for buckets not called
        since). Between steps: a bucket's call writes its residual."""
        out = {i: r.copy() for i, r in self._restored.items()}
        if self.worker is not None:
            transport = self.worker.transport
            for index, numel in self._buckets.items():
                if index not in out:
                    out[index] = transport.residual(bucket_key(index))[:numel].copy()
        return out

    def __getstate__(self) -> dict[str, object]:
        if self._calling:
            raise RuntimeError(f"HySyncHookState pickled while buckets {sorted(self._calling)} "
                               "are being all-reduced: pickle it between steps (after "
                               "backward() returns)")
        return {"residuals": self.residuals(), "stats": self.stats}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.worker = None
        self.stats = state["stats"]  # type: ignore[assignment]
        self._restored = state["residuals"]  # type: ignore[assignment]
        self._buckets = {}
        self._calling = set()

    def attached(self) -> HySyncWorker:
        if self.worker is None:
            raise RuntimeError("HySyncHookState has no worker (it was unpickled): call "
                               "state.attach(HySyncWorker(...)) before the next step")
        return self.worker

    def begin(self, index: int, numel: int) -> None:
        """Bucket `index`'s call of `numel` elements starts: a residual restored from a pickle
        goes into the engine first (where the bucket kept its size: the engine starts a
        bucket whose size changed afresh, as DDP's rebuild after the first step does)."""
        worker = self.attached()
        restored = self._restored.pop(index, None)
        if restored is not None:
            if restored.size == numel:
                worker.restore_residual(bucket_key(index), restored)
            else:
                log.info("bucket %d changed size %d -> %d: its residual (at most the last "
                         "quantization error in sync) is dropped", index, restored.size, numel)
        self._buckets[index] = numel
        self._calling.add(index)

    def end(self, index: int) -> None:
        self._calling.discard(index)

    def last_stats(self) -> "CallStats | None":
        return self.attached().last_stats()

    def updates_applied(self) -> float:
        """Updates the latest call applied (see HySyncWorker.updates_applied)."""
        worker = self.attached()
        stats = worker.last_stats()
        return 0.0 if stats is None else worker.updates_applied(stats)


def bucket_key(index: int) -> str:
    """The key of DDP bucket `index`: its one name from the hook to the wire."""
    return f"bucket/{index}"


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
    state.begin(index, buffer.numel())
    try:
        # The last bucket of the pass: DDP waits for it next, so it may run on this thread
        # (HySyncWorker.allreduce_async, `blocking`).
        future = worker.allreduce_async(buffer, key=bucket_key(index), in_place=in_place,
                                        blocking=bucket.is_last())
    except BaseException:
        state.end(index)
        raise

    def copy_back(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        state.end(index)  # the call has ended, failed or not
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


def switch_call(member: HySyncHookState, key: str, index: int | None = None
                ) -> Callable[[torch.Tensor], Applied]:
    """The leader's share of a host-level all-reduce: the host's mean through the switch,
    in place, under `key`; `index`: the hook's bucket (`key` is its bucket_key), which the
    state then counts as its own."""
    worker = member.attached()

    def call(host_mean: torch.Tensor) -> Applied:
        in_place = host_mean.dtype == torch.float32 and host_mean.is_contiguous()
        if index is not None:
            member.begin(index, host_mean.numel())
        try:
            result = worker.allreduce(host_mean, key=key, in_place=in_place)
        finally:
            if index is not None:
                member.end(index)
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

"""The PyTorch DDP communication hook: gradient buckets averaged through the switch.

    state = HySyncHookState(HySyncWorker(config, scale=2**20))
    ddp_model.register_comm_hook(state, hysync_hook)

As torch/distributed/algorithms/ddp_comm_hooks: the second parameter is named
`bucket`, the future holds one tensor shaped like the bucket's buffer, and the
averaged result is copied into that buffer in place. DDP still needs a process
group (it broadcasts parameters with it); the hook replaces only the gradient
all-reduce. Error feedback is per bucket, as PowerSGD's `error_dict`: the transport
carries each bucket's residual into that bucket's next contribution, and
`state.residuals()` gives them by `bucket.index()` (docs/design.md, worker/).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run
# time and needs `bucket: dist.GradBucket` as a type, not a string.
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from worker.api import HySyncWorker
from worker.stats import CallStats


@dataclass(slots=True)
class HookStats:
    calls: int = 0  # buckets all-reduced
    needs_resync: bool = False  # the replica missed results (see Transport.needs_resync)


class HySyncHookState:
    __slots__ = ("worker", "buckets", "stats")

    def __init__(self, worker: HySyncWorker) -> None:
        self.worker = worker
        self.buckets: set[int] = set()  # bucket.index() of every bucket all-reduced
        self.stats = HookStats()

    def residuals(self) -> dict[int, np.ndarray]:
        """bucket.index() -> the float32 residual carried for it (padded to whole chunks).

        Copies taken between calls, on the worker's thread: the transport mutates the
        live arrays while a call runs."""
        return {index: self.worker.residual(bucket_key(index)) for index in sorted(self.buckets)}

    def last_stats(self) -> "CallStats | None":
        return self.worker.last_stats()

    def updates_applied(self) -> float:
        """Updates the latest call applied (see HySyncWorker.updates_applied)."""
        stats = self.worker.last_stats()
        return 0.0 if stats is None else self.worker.updates_applied(stats)


def bucket_key(index: int) -> tuple[str, int]:
    return ("bucket", index)


def hysync_hook(state: HySyncHookState,
                bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce one bucket through HySync; the future holds the averaged buffer."""
    buffer = bucket.buffer()
    index = bucket.index()
    key = bucket_key(index)
    state.buckets.add(index)
    # A CPU float32 bucket is reduced in its own memory (no copy); others (CUDA) are copied.
    in_place = buffer.device.type == "cpu" and buffer.dtype == torch.float32 \
        and buffer.is_contiguous()
    future = state.worker.allreduce_async(buffer, key=key, in_place=in_place)

    def copy_back(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        if not in_place:
            buffer.copy_(fut.value())
        state.stats.calls += 1
        state.stats.needs_resync = state.worker.needs_resync
        return buffer

    return future.then(copy_back)

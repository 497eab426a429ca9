"""The PyTorch DDP communication hook: gradient buckets averaged through the switch.

    state = HySyncHookState(HySyncWorker(config, scale))
    model.register_comm_hook(state, hysync_hook)

As torch/distributed/algorithms/ddp_comm_hooks: the second parameter is named
`bucket`, the future holds one tensor shaped like the bucket's buffer, and the
averaged result is copied into that buffer in place. Residuals (error feedback) live
in the transport, keyed by `bucket.index()`, as PowerSGD keeps its `error_dict`.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run
# time and needs `bucket: dist.GradBucket` as a type, not a string.
import torch
import torch.distributed as dist

from worker.api import HySyncWorker
from worker.stats import CallStats


class HySyncHookState:
    __slots__ = ("worker", "calls")

    def __init__(self, worker: HySyncWorker) -> None:
        self.worker = worker
        self.calls = 0

    def last_stats(self) -> "CallStats | None":
        return self.worker.last_stats()

    def updates_applied(self) -> float:
        """Updates the latest call applied (see HySyncWorker.updates_applied)."""
        stats = self.worker.last_stats()
        return 0.0 if stats is None else self.worker.updates_applied(stats)


def hysync_hook(state: HySyncHookState,
                bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    state.calls += 1
    future = state.worker.allreduce_async(buffer, key=("bucket", bucket.index()))

    def copy_back(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        buffer.copy_(fut.value())
        return buffer

    return future.then(copy_back)

"""Where a training step's time goes: compute, waiting for the switch, communication.

A DDP communication hook wrapped by `StepSplit.wrap` records, per step, the interval
from the first bucket's hook call to the last bucket's result (the all-reduce: DDP waits
for it at the end of backward). With HySync the transport also reports how long it sat
blocked with nothing to do until the switch answered (`CallStats.waited_s`: slower
members in sync, the switch's own time, the network); the rest of the all-reduce is
communication (quantize, send, receive, apply). gloo's all-reduce cannot tell waiting
from communication: all of it counts as communication. Compute is the rest of the step.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time
# and needs `bucket: dist.GradBucket` as a type, not a string.
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


class StepSplit:
    """Accumulates the all-reduce interval and the waiting of the current step."""

    def __init__(self, waited: Callable[[int], float] | None = None) -> None:
        # waited(bucket index): seconds the latest call for that bucket spent waiting.
        self._waited = waited
        self._lock = threading.Lock()  # results complete on the transport's thread
        self._first_call: float | None = None
        self._last_result = 0.0
        self._waiting_s = 0.0

    def wrap(self, hook: Hook) -> Hook:
        def timed_hook(state: Any,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            index = bucket.index()
            with self._lock:
                if self._first_call is None:
                    self._first_call = time.perf_counter()

            def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                with self._lock:
                    self._last_result = time.perf_counter()
                    if self._waited is not None:
                        self._waiting_s += self._waited(index)
                return fut.value()

            return hook(state, bucket).then(done)

        return timed_hook

    def take(self) -> tuple[float, float]:
        """(waiting, communication) seconds of the step since the last take."""
        with self._lock:
            allreduce = (max(0.0, self._last_result - self._first_call)
                         if self._first_call is not None else 0.0)
            waiting = min(self._waiting_s, allreduce)
            self._first_call, self._waiting_s = None, 0.0
        return waiting, allreduce - waiting

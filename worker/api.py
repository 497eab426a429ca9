"""What a training script imports: `HySyncWorker.allreduce(tensor)` and its async twin.

One worker owns one quantizer and one transport (one UDP socket). Calls are served
in order by a single background thread that owns the socket, so `allreduce_async`
returns at once with a `torch.futures.Future` and blocking `allreduce` calls queue
behind pending ones: the transport is never entered twice.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from worker.quantize import FixedPointQuantizer
from worker.stats import CallStats
from worker.transport import Transport, TransportConfig


class HySyncWorker:
    """A member of a HySync job: average tensors with the other members through the switch."""

    def __init__(self, config: TransportConfig, scale: float) -> None:
        self.config = config
        self.quantizer = FixedPointQuantizer(scale, config.members)
        self.transport = Transport(config, self.quantizer)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hysync-worker")
        self._stats_lock = threading.Lock()
        self._last: dict[Hashable, CallStats] = {}

    def allreduce(self, tensor: torch.Tensor, key: Hashable = "default") -> torch.Tensor:
        """The members' average of `tensor` as this replica applies it (see worker/transport.py:
        in sync the exact mean within the quantization bound; in partial and async the
        average of the rounds applied, the rest carried as a residual)."""
        return self.allreduce_async(tensor, key).wait()

    def allreduce_async(self, tensor: torch.Tensor,
                        key: Hashable = "default") -> torch.futures.Future[torch.Tensor]:
        values = tensor.detach().reshape(-1).to(torch.float32).cpu().numpy().copy()
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

        def run() -> None:
            try:
                result = self.transport.allreduce(key, values)
                with self._stats_lock:
                    self._last[key] = result.stats
                out = torch.from_numpy(np.asarray(result.output)).reshape(tensor.shape)
                future.set_result(out.to(dtype=tensor.dtype, device=tensor.device))
            except BaseException as err:  # noqa: BLE001 - handed to the caller's wait()
                future.set_exception(err)

        self._executor.submit(run)
        return future

    def last_stats(self, key: Hashable | None = None) -> CallStats | None:
        """Stats of the latest finished call (for `key`, or any key)."""
        with self._stats_lock:
            if key is not None:
                return self._last.get(key)
            return next(reversed(self._last.values()), None)

    def updates_applied(self, stats: CallStats) -> float:
        """How many all-member updates a call applied, in units of one sync round: the sum,
        over the results applied to the key's first chunk, of contributors / members.
        1.0 per call in sync; more for a straggler catching up on buffered partial rounds;
        1/n per own contribution in async. Every replica that applies the same results
        counts the same, so it is the job's clock for ending training together."""
        first = self.transport._keys[stats.key].first  # noqa: SLF001 (same package)
        results = stats.results
        counts = results["count"][results["chunk"] == first]
        return float(counts.sum()) / self.config.members

    @property
    def needs_resync(self) -> bool:
        return self.transport.needs_resync

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.transport.close()

    def __enter__(self) -> HySyncWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

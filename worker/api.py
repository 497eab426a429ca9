"""`HySyncWorker`: all-reduce of torch tensors through a HySync switch.

    worker = HySyncWorker(TransportConfig(job_id=1, worker_id=0, switch_host="10.0.0.254",
                                          members=4, slot_base=0, slot_count=256))
    grad = worker.allreduce(grad, key="layer1")          # blocks
    fut = worker.allreduce_async(grad, key="layer1")     # torch.futures.Future[Tensor]

One background thread owns the transport's socket; calls run on it one at a time,
in the order they were made. The result is the applied average: in sync mode the
mean over the members (within the quantization bound), in partial/async mode
the sum of `sum / count` of every round applied for the key (see
docs/protocol.md §9 for what exactly that covers).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from hysync.worker.config import TransportConfig
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.stats import CallStats
from hysync.worker.transport import Transport

log = logging.getLogger(__name__)

DEFAULT_SCALE = 2.0**20


class HySyncWorker:
    """Owns a fixed-point quantizer and a transport; serializes calls on one thread."""

    def __init__(self, config: TransportConfig, *, scale: float = DEFAULT_SCALE) -> None:
        self.config = config
        self.quantizer = FixedPointQuantizer(scale, config.members)
        self.transport = Transport(config, self.quantizer)
        self._executor = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix=f"hysync-w{config.worker_id}")
        self._stats_lock = threading.Lock()
        self._last: dict[Hashable, CallStats] = {}

    @property
    def address(self) -> tuple[str, int]:
        """The UDP address this worker sends from (what the switch admits)."""
        return self.transport.address

    @property
    def needs_resync(self) -> bool:
        return self.transport.needs_resync

    def allreduce(self, tensor: torch.Tensor, key: Hashable = "default", *,
                  in_place: bool = False, residual: np.ndarray | None = None) -> torch.Tensor:
        """All-reduce `tensor` under `key`; returns a new tensor (same shape, dtype, device),
        or with `in_place` the tensor itself, overwritten (see allreduce_async)."""
        return self.allreduce_async(tensor, key, in_place=in_place, residual=residual).wait()

    def allreduce_async(self, tensor: torch.Tensor, key: Hashable = "default", *,
                        in_place: bool = False,
                        residual: np.ndarray | None = None) -> torch.futures.Future:
        """Start an all-reduce; the future holds the result tensor.

        The tensor is copied now, so the caller may reuse it at once. With `in_place` (a
        contiguous float32 CPU tensor, e.g. a DDP bucket) nothing is copied: the transport
        works on the tensor's memory and writes the result over it, so the caller must not
        touch it until the future completes. With `residual`, the caller owns the key's
        residual (see Transport.allreduce): the call, on the worker's thread, adds it in and
        writes the new one over it, so the caller must not touch it until the future
        completes either."""
        if in_place:
            if tensor.dtype != torch.float32 or tensor.device.type != "cpu" \
                    or not tensor.is_contiguous():
                raise ValueError(f"allreduce(in_place=True) needs a contiguous float32 CPU "
                                 f"tensor, got {tensor.dtype} on {tensor.device}")
            values = tensor.detach().reshape(-1).numpy()
        else:
            values = tensor.detach().reshape(-1).to(device="cpu", dtype=torch.float32,
                                                    copy=True).numpy()
        shape, dtype, device = tensor.shape, tensor.dtype, tensor.device
        future: torch.futures.Future = torch.futures.Future()

        def run() -> None:
            try:
                # values: our copy, or with in_place the caller's tensor
                result = self.transport.allreduce(key, values, in_place=True, residual=residual)
                with self._stats_lock:
                    self._last.pop(key, None)  # keep insertion order = finishing order
                    self._last[key] = result.stats
                if log.isEnabledFor(logging.DEBUG):  # summary() walks every result's header
                    log.debug("allreduce %s", result.stats.summary())
                out = tensor if in_place else torch.from_numpy(result.output).reshape(
                    shape).to(dtype=dtype, device=device)
                future.set_result(out)
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
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
        first = self.transport.first_chunk(stats.key)
        results = stats.results
        counts = results["count"][results["chunk"] == first]
        return float(counts.sum()) / self.config.members

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.transport.close()

    def __enter__(self) -> HySyncWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

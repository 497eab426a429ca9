"""`HySyncWorker`: all-reduce of torch tensors through a HySync switch.

    worker = HySyncWorker(TransportConfig(job_id=1, worker_id=0, switch_host="10.0.0.254",
                                          members=4, slot_base=0, slot_count=256))
    grad = worker.allreduce(grad, key="layer1")          # blocks
    fut = worker.allreduce_async(grad, key="layer1")     # torch.futures.Future[Tensor]

Calls run one at a time, in the order they were made, on a background thread of the
worker's; a call its caller waits for at once (`allreduce`, `allreduce_async(blocking=True)`)
runs on the caller's thread instead when nothing is queued before it. The result is
the applied average: in sync mode the mean over the members (within the quantization
bound), in partial/async mode the sum of `sum / count` of every round applied for the key
(see docs/protocol.md §9 for what exactly that covers).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from hysync import _core
from hysync.worker.call_stats import CallStats
from hysync.worker.config import TransportConfig
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport, check_key

log = logging.getLogger(__name__)

DEFAULT_SCALE = 2.0**20


def _abandon_calls_at_exit() -> None:
    """When the main thread has ended: calls still in flight (their peers are gone, or
    going) end now instead of at `dead_after`, so the executor threads that run them are
    joined before the interpreter finalizes (see native/worker/bind.cc, abandon_calls)."""
    _core.worker.abandon_calls()


# threading's exit callbacks run before it joins threads, the last registered first:
# this one runs before concurrent.futures' (registered when it was imported above), which
# joins the executors' threads.
threading._register_atexit(_abandon_calls_at_exit)  # type: ignore[attr-defined]


class HySyncWorker:
    """Owns a fixed-point quantizer and a transport; runs its calls one at a time, in order."""

    def __init__(self, config: TransportConfig, *, scale: float = DEFAULT_SCALE) -> None:
        self.config = config
        self.quantizer = FixedPointQuantizer(scale, config.members)
        self.transport = Transport(config, self.quantizer)
        self._executor = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix=f"hysync-w{config.worker_id}")
        self._stats_lock = threading.Lock()
        # One transport call at a time, in the order they were made: the worker's thread
        # runs them, or the caller's own thread when nothing is queued (allreduce_async's
        # `blocking`). `_queued` (under _stats_lock): calls handed to the worker's thread
        # that have not finished.
        self._calling = threading.Lock()
        self._queued = 0
        self._last: dict[str, CallStats] = {}
        self._uneven_calls = 0  # see uneven_calls
        # the CUDA path: a copy stream per device, pinned staging buffers per key
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._staging: dict[tuple[str, torch.device], list[torch.Tensor]] = {}

    @property
    def address(self) -> tuple[str, int]:
        """The UDP address this worker sends from (what the switch admits)."""
        return self.transport.address

    @property
    def needs_resync(self) -> bool:
        return self.transport.needs_resync

    @property
    def uneven_calls(self) -> int:
        """Calls so far after which this replica's model may differ from the others': one
        that applied anything but one full sync round per chunk (a partial or async round,
        a round without every member, an own contribution applied for a lost result, a
        chunk carried). 0 for as long as a job runs sync with every member: every replica
        then applies the same sums, step by step (worker/averaging.py skips its rounds)."""
        with self._stats_lock:
            return self._uneven_calls

    def allreduce(self, tensor: torch.Tensor, key: str = "default", *,
                  in_place: bool = False) -> torch.Tensor:
        """All-reduce `tensor` under `key`; returns a new tensor (same shape, dtype, device),
        or with `in_place` the tensor itself, overwritten (see allreduce_async)."""
        return self.allreduce_async(tensor, key, in_place=in_place, blocking=True).wait()

    def allreduce_async(self, tensor: torch.Tensor, key: str = "default", *,
                        in_place: bool = False, blocking: bool = False) -> torch.futures.Future:
        """Start an all-reduce; the future holds the result tensor, on the tensor's device.

        The tensor is copied now, so the caller may reuse it at once. With `in_place` (a
        contiguous float32 tensor, e.g. a DDP bucket) the result is written over the tensor,
        so the caller must not touch it until the future completes: a CPU tensor is reduced
        in its own memory; a CUDA tensor through a pinned staging buffer, copied on a
        stream of the worker's own, so backward goes on computing meanwhile. The future
        carries the tensor's device (a CUDA-aware future: who waits on it, waits on the
        copy back too). The key's residual stays in the worker's engine from call to call
        (Transport.residual reads it).

        `blocking`: the caller waits for this result next (a synchronous call, the last
        bucket of a backward pass). A CPU tensor's call then runs on the caller's thread
        when no earlier call is queued, and the future comes back completed: the hand-off
        to the worker's thread and the wake-up back cost 0.4 ms on idle cores and over
        1 ms on busy ones, on a straggler's critical path (docs/performance.md)."""
        if not isinstance(tensor, torch.Tensor):
            kind = type(tensor)
            name = kind.__qualname__ if kind.__module__ == "builtins" else \
                f"{kind.__module__}.{kind.__qualname__}"
            raise TypeError(f"HySyncWorker.allreduce takes a torch.Tensor (CPU or CUDA), got "
                            f"{name}: convert it first, e.g. torch.as_tensor(x)")
        check_key(key)
        if in_place and (tensor.dtype != torch.float32 or not tensor.is_contiguous()
                         or tensor.device.type not in ("cpu", "cuda")):
            raise ValueError(f"allreduce(in_place=True) needs a contiguous float32 CPU or "
                             f"CUDA tensor, got {tensor.dtype} on {tensor.device}")
        if tensor.device.type == "cuda":
            return self._allreduce_cuda(tensor, key, in_place)
        if in_place:
            values = tensor.detach().reshape(-1).numpy()
        else:
            values = tensor.detach().reshape(-1).to(device="cpu", dtype=torch.float32,
                                                    copy=True).numpy()
        shape, dtype, device = tensor.shape, tensor.dtype, tensor.device
        future: torch.futures.Future = torch.futures.Future()

        def run() -> None:
            try:
                # values: our copy, or with in_place the caller's tensor
                self._reduce(key, values)
                out = tensor if in_place else torch.from_numpy(values).reshape(
                    shape).to(dtype=dtype, device=device)
                future.set_result(out)
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(err)

        if blocking and self._run_here(run):
            return future
        self._submit(run)
        return future

    def restore_residual(self, key: str, residual: np.ndarray) -> None:
        """Add `residual` (float32, one element per element of `key`) into the residual the
        engine keeps for `key`, registering the key with that size if it is new: a
        checkpoint's residual handed back. It runs in order with the calls: after those
        started before it, before those started after it."""
        check_key(key)
        residual = np.asarray(residual, dtype=np.float32).reshape(-1)

        def run() -> None:
            self.transport.register(key, residual.size)
            self.transport.residual(key)[:residual.size] += residual

        if not self._run_here(run):
            self._submit(run)

    def _submit(self, call: Callable[[], None]) -> None:
        """Queue `call` on the worker's thread, after the calls queued before it."""
        def queued() -> None:
            try:
                with self._calling:
                    call()
            finally:
                with self._stats_lock:
                    self._queued -= 1

        with self._stats_lock:
            self._queued += 1
        self._executor.submit(queued)

    def _run_here(self, call: Callable[[], None]) -> bool:
        """Run `call` on this thread if no call is queued or running; False if one is."""
        with self._stats_lock:
            if self._queued or not self._calling.acquire(blocking=False):
                return False
        try:
            call()
        finally:
            self._calling.release()
        return True

    def _allreduce_cuda(self, tensor: torch.Tensor, key: str,
                        in_place: bool) -> torch.futures.Future:
        """The CUDA path: device -> pinned staging (on our stream, after the caller's work
        on the tensor), the transport on the staging memory (the worker's thread, once
        that copy is done), staging -> device (on our stream), then the future."""
        device = tensor.device
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        staging = self._take_staging(key, device, tensor.numel())
        caller = torch.cuda.current_stream(device)
        stream.wait_stream(caller)  # the tensor's producers (backward) first
        with torch.cuda.stream(stream):
            staging.copy_(tensor.detach().reshape(-1), non_blocking=True)
            copied = torch.cuda.Event(blocking=True)  # its waiter sleeps, not spins
            copied.record(stream)
        tensor.record_stream(stream)  # the allocator must not reuse it under our copies
        if not in_place:
            caller.wait_event(copied)  # "copied now": the caller's later writes wait for it
        future: torch.futures.Future = torch.futures.Future(devices=[device])

        def run() -> None:
            try:
                copied.synchronize()
                self._reduce(key, staging.numpy())
                with torch.cuda.stream(stream):
                    out = tensor if in_place else torch.empty_like(tensor)
                    out.view(-1).copy_(staging, non_blocking=True)
                    # recorded on `stream`: the future's waiters wait for the copy back
                    future.set_result(out)
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(err)
            finally:
                # the next copy into it is on the same stream, so after this one
                self._give_staging(key, device, staging)

        self._submit(run)
        return future

    def _take_staging(self, key: str, device: torch.device, numel: int) -> torch.Tensor:
        """A pinned float32 buffer of `numel` for `key`: reused call after call (pinning is
        slow), one per call in flight."""
        with self._stats_lock:
            free = self._staging.get((key, device), [])
            while free:
                buffer = free.pop()
                if buffer.numel() == numel:
                    return buffer
        return torch.empty(numel, dtype=torch.float32, pin_memory=True)

    def _give_staging(self, key: str, device: torch.device, buffer: torch.Tensor) -> None:
        with self._stats_lock:
            self._staging.setdefault((key, device), []).append(buffer)

    def _reduce(self, key: str, values: np.ndarray) -> None:
        """One transport call on `values`, in place (the worker's thread, or a blocking
        caller's)."""
        result = self.transport.allreduce(key, values, in_place=True)
        even = _even(result.stats)
        with self._stats_lock:
            self._last.pop(key, None)  # keep insertion order = finishing order
            self._last[key] = result.stats
            self._uneven_calls += not even
        if log.isEnabledFor(logging.DEBUG):  # summary() walks every result's header
            log.debug("allreduce %s", result.stats.summary())

    def last_stats(self, key: str | None = None) -> CallStats | None:
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
        """Close the worker at once: the call in progress ends with TransportClosedError
        (aborted as a failed call ends: its contributions kept as residual, the replica
        flagged for a resync), so does every call queued behind it, and then the worker's
        thread is joined. Closing after the queued calls instead could wait out `dead_after`
        for each of them when the job's peers are gone (a teardown after an error)."""
        self.transport.close()
        self._executor.shutdown(wait=True)

    def __enter__(self) -> HySyncWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _even(stats: CallStats) -> bool:
    """The call applied exactly one sync round of every member per chunk, and nothing else."""
    return (len(stats.results) == stats.chunks
            and not (stats.uneven_results or stats.own_applied or stats.carried))

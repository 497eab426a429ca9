"""Worker processes of the multi-process tests (multiprocessing "spawn" targets).

Each one binds its transport, reports its address, and then follows the phases the
test process signals with events, reporting back on a queue. Gradients come from
a seeded RNG, so the test process can recompute every worker's contributions.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from hysync.wire import Mode
from hysync.worker.quantize import FixedPointQuantizer
from hysync.worker.transport import Transport, TransportConfig

KEY = "g"
POLL = 1.0  # how often a waiting worker checks that the test process is still there
HUNG_AFTER = 1200.0  # backstop of a wait on the other workers (cluster.py says why)
# At the end every flight settles (a lost result is recovered or its round is judged);
# on a busy machine that can take seconds, so the drain waits for it, not for a fixed time.
SETTLE_WITHIN = 60.0


@dataclass(frozen=True)
class Spec:
    job_id: int
    members: int
    slot_base: int
    slot_count: int
    switch: tuple[str, int]
    size: int = 2000
    calls: int = 6
    flush_calls: int = 3
    scale: float = 2.0**20
    straggler: int = -1
    straggler_sleep: float = 0.03
    seed: int = 7
    rto_min: float = 0.002
    rendezvous: str = ""  # ddp_worker: gloo's init_method


def gradient(spec: Spec, worker: int, call: int) -> np.ndarray:
    rng = np.random.default_rng((spec.seed, worker, call))
    return rng.standard_normal(spec.size).astype(np.float32)


def transport_config(spec: Spec, worker: int, **extra: Any) -> TransportConfig:
    return TransportConfig(job_id=spec.job_id, worker_id=worker, switch_host=spec.switch[0],
                           switch_port=spec.switch[1], bind_host="127.0.0.1",
                           slot_base=spec.slot_base, slot_count=spec.slot_count,
                           members=spec.members, rto_min=spec.rto_min,
                           rto_initial=max(spec.rto_min, 0.02), seed=spec.seed * 100 + worker,
                           **extra)


def _wait(event: Any) -> None:
    """Wait for the test process's next signal, however long its other workers take to get
    there on a busy machine; end if the test process is gone (nobody will signal)."""
    parent = os.getppid()
    while not event.wait(POLL):
        if os.getppid() != parent:
            raise RuntimeError("the test process exited")


def phased_worker(worker: int, spec: Spec, out: Any, events: dict[str, Any],
                  barrier: Any) -> None:
    """Warm-up call in sync; `calls` calls in the mode under test (the straggler sleeps
    before each); zero-gradient calls until every slot runs async (so that no partial
    round stays open); `flush_calls` zero-gradient calls in sync; a final drain."""
    logging.basicConfig(level=logging.WARNING)
    try:
        tr = Transport(transport_config(spec, worker),
                       FixedPointQuantizer(spec.scale, spec.members))
        out.put((worker, "bound", tr.address))
        _wait(events["go"])
        zeros = np.zeros(spec.size, dtype=np.float32)
        total_out = np.zeros(spec.size)
        totals = {"carried": 0, "parked": 0, "retransmits": 0, "residual_contribs": 0,
                  "mismatch": 0, "stale": 0, "acks": 0, "joins": 0}

        def call(values: np.ndarray) -> tuple[int, ...]:
            nonlocal total_out
            result = tr.allreduce(KEY, values)
            total_out += result.output
            st = result.stats
            totals["carried"] += st.carried
            totals["parked"] += st.parked
            totals["retransmits"] += st.retransmits
            totals["residual_contribs"] += st.residual_contribs
            totals["mismatch"] += st.resyncs["CHUNK_MISMATCH"]
            totals["stale"] += st.resyncs["STALE_ROUND"] + st.resyncs["STALE_COUNTED"]
            totals["acks"] += st.acks
            totals["joins"] += st.joins
            return st.slot_modes

        call(zeros)
        out.put((worker, "warm", None))
        _wait(events["phase"])
        for t in range(spec.calls):
            if worker == spec.straggler:
                time.sleep(spec.straggler_sleep)
            call(gradient(spec, worker, t))
        out.put((worker, "done", None))
        seen_async = False
        while not events["stop_serve"].is_set():
            modes = call(zeros)
            if not seen_async and all(m == Mode.ASYNC for m in modes):
                seen_async = True
                out.put((worker, "async", None))
        out.put((worker, "served", None))
        _wait(events["flush"])
        for _ in range(spec.flush_calls):
            call(zeros)
        barrier.wait(HUNG_AFTER)  # the test process ends us at once if a peer fails
        drained = tr.finish(timeout=SETTLE_WITHIN)
        total_out += tr.take(KEY)
        out.put((worker, "result", {
            "output": total_out, "first_chunk": tr.first_chunk(KEY),
            "residual": tr.residual(KEY)[:spec.size].astype(np.float64),
            "needs_resync": tr.needs_resync, "in_flight": drained.in_flight, **totals}))
        tr.close()
    except BaseException:  # noqa: BLE001 - reported to the test process
        out.put((worker, "error", traceback.format_exc()))


def torch_sync_worker(worker: int, spec: Spec, out: Any, events: dict[str, Any],
                      barrier: Any) -> None:
    """`calls` HySyncWorker.allreduce calls of torch tensors; reports every output."""
    logging.basicConfig(level=logging.WARNING)
    try:
        import torch

        from hysync.worker.api import HySyncWorker

        with HySyncWorker(transport_config(spec, worker), scale=spec.scale) as hw:
            out.put((worker, "bound", hw.address))
            _wait(events["go"])
            outputs = []
            for t in range(spec.calls):
                grad = torch.from_numpy(gradient(spec, worker, t)).reshape(-1, 10)
                result = hw.allreduce(grad, key="layer")
                assert result.shape == grad.shape and result.dtype == grad.dtype
                outputs.append(result.reshape(-1).numpy().astype(np.float64))
            out.put((worker, "result", {"outputs": outputs, "needs_resync": hw.needs_resync}))
    except BaseException:  # noqa: BLE001 - reported to the test process
        out.put((worker, "error", traceback.format_exc()))


def record_calls(hw: Any) -> list[tuple[Any, threading.Thread, float, float]]:
    """(key, thread, start, end) of every transport call the HySyncWorker `hw` makes."""
    calls: list[tuple[Any, threading.Thread, float, float]] = []
    transport_call = hw.transport.allreduce

    def recorded(key: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return transport_call(key, *args, **kwargs)
        finally:
            calls.append((key, threading.current_thread(), start, time.monotonic()))

    hw.transport.allreduce = recorded
    return calls


def ddp_worker(rank: int, spec: Spec, out: Any, events: dict[str, Any], barrier: Any) -> None:
    """Train a tiny MLP with DDP twice from the same start: gloo's all-reduce, then the
    HySync hook (gloo only broadcasts); report both loss curves."""
    logging.basicConfig(level=logging.WARNING)
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from hysync.worker.api import HySyncWorker
        from hysync.worker.ddp_hook import HySyncHookState, hysync_hook

        hw = HySyncWorker(transport_config(spec, rank), scale=spec.scale)
        out.put((rank, "bound", hw.address))
        _wait(events["go"])
        dist.init_process_group("gloo", init_method=spec.rendezvous,
                                rank=rank, world_size=spec.members)
        torch.manual_seed(1000 + rank)
        inputs = torch.randn(64, 16)
        targets = torch.randn(64, 4)

        def train(hook: bool) -> list[float]:
            torch.manual_seed(0)
            # Over 1 MB of parameters: DDP's first bucket holds 1 MB, and with a tiny cap
            # every other parameter gets a bucket of its own - several keys (DDP rebuilds
            # them after the first step).
            model = torch.nn.Sequential(torch.nn.Linear(16, 4096), torch.nn.ReLU(),
                                        torch.nn.Linear(4096, 64), torch.nn.ReLU(),
                                        torch.nn.Linear(64, 4))
            ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
            if hook:
                ddp.register_comm_hook(state, hysync_hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
            losses = []
            for _ in range(spec.calls):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(ddp(inputs), targets)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses

        state = HySyncHookState(hw)
        gloo = train(hook=False)
        calls = record_calls(hw)
        hysync = train(hook=True)
        residuals = state.residuals()
        # (bucket, on the training thread, start, end) of each call
        calls_made = [(int(key.rpartition("/")[2]), thread is threading.main_thread(), start, end)
                      for key, thread, start, end in calls]
        out.put((rank, "result", {"gloo": gloo, "hysync": hysync, "calls": calls_made,
                                  "needs_resync": hw.needs_resync,
                                  "buckets": sorted(residuals),
                                  "max_residual": max(float(np.abs(r).max())
                                                      for r in residuals.values())}))
        dist.destroy_process_group()
        hw.close()
    except BaseException:  # noqa: BLE001 - reported to the test process
        out.put((rank, "error", traceback.format_exc()))

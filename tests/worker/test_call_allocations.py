"""A call's Python work does not grow with the tensor: nothing is allocated per chunk.

The engine runs a whole call without the GIL and hands its results' headers over without a
copy; what Python adds per call (the future, CallStats, the worker's bookkeeping) must be
the same for 64 chunks as for 4,096. Measured with tracemalloc (numpy's buffers included)
over calls in place against the native switch, so that only the worker's Python is traced.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest
import torch

from hysync import wire
from hysync.softswitch.native import NativePipeline, NativeUdpDataPlane
from hysync.worker.api import HySyncWorker
from hysync.worker.config import TransportConfig
from tests.worker.conftest import Job, Switch

JOB, BASE, SLOTS = 1, 0, 64
CHUNKS = (64, 4096)


@pytest.fixture
def native_switch() -> Iterator[Switch]:
    pipeline = NativePipeline()
    dataplane = NativeUdpDataPlane(pipeline, "127.0.0.1", 0, threads=1).start()
    try:
        yield Switch(pipeline, dataplane)  # type: ignore[arg-type]
    finally:
        dataplane.stop()


def peak_bytes(worker: HySyncWorker, tensor: torch.Tensor, key: str) -> int:
    """The most Python-traced memory one call held above what was there before it."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    worker.allreduce(tensor, key=key, in_place=True)
    return tracemalloc.get_traced_memory()[1] - before


def test_a_calls_python_allocations_do_not_grow_with_its_chunks(
        native_switch: Switch) -> None:
    config = TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                             switch_port=native_switch.address[1], bind_host="127.0.0.1",
                             slot_base=BASE, slot_count=SLOTS, members=1, seed=0)
    with HySyncWorker(config) as worker:
        native_switch.install(Job(JOB, BASE, SLOTS, [(0, *worker.address)]))
        tensors = {n: torch.full((n * wire.LANES,), 0.5) for n in CHUNKS}
        for n in CHUNKS:  # keys registered, every slot heard from
            worker.allreduce(tensors[n], key=f"k{n}", in_place=True)
        tracemalloc.start()
        try:
            peaks = {n: min(peak_bytes(worker, tensors[n], f"k{n}") for _ in range(3))
                     for n in CHUNKS}
        finally:
            tracemalloc.stop()
        stats = worker.last_stats(f"k{CHUNKS[-1]}")
        assert stats is not None and stats.chunks == CHUNKS[-1]
        assert len(stats.results) == CHUNKS[-1]  # every chunk's round came back
    torch.testing.assert_close(tensors[CHUNKS[-1]], torch.full_like(tensors[CHUNKS[-1]], 0.5))
    # One pointer per chunk would be 32 KiB more for the larger call.
    extra_chunks = CHUNKS[-1] - CHUNKS[0]
    assert peaks[CHUNKS[-1]] - peaks[CHUNKS[0]] < extra_chunks, peaks

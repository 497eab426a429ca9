"""A call the caller waits for at once (`blocking`) runs on the caller's thread when no
other call is queued, and behind the queued ones when some are: calls never overlap and
keep their order."""

from __future__ import annotations

import threading

import torch

from hysync.worker.api import HySyncWorker
from hysync.worker.config import TransportConfig
from tests.worker.conftest import Job
from tests.worker.procs import record_calls

SCALE = 2.0**20
JOB = 6


def config(switch_port: int, worker: int, members: int) -> TransportConfig:
    return TransportConfig(job_id=JOB, worker_id=worker, switch_host="127.0.0.1",
                           switch_port=switch_port, bind_host="127.0.0.1", slot_base=0,
                           slot_count=8, members=members, seed=worker, dead_after=20.0)


def test_a_blocking_call_with_nothing_queued_runs_on_the_callers_thread(switch):
    with HySyncWorker(config(switch.address[1], 0, 1), scale=SCALE) as hw:
        switch.install(Job(JOB, 0, 8, [(0, *hw.address)]))
        calls = record_calls(hw)
        grad = torch.linspace(-1, 1, 700)
        future = hw.allreduce_async(grad.clone(), key="k", blocking=True)
        assert future.done()  # completed before it was returned
        torch.testing.assert_close(future.value(), grad, atol=1.0 / SCALE, rtol=0)
        queued = hw.allreduce_async(grad.clone(), key="k")  # not blocking: the worker's thread
        torch.testing.assert_close(queued.wait(), grad, atol=1.0 / SCALE, rtol=0)
        (_, here, _, _), (_, there, _, _) = calls
        assert here is threading.current_thread()
        assert there.name.startswith("hysync-w0")  # the worker's thread


def test_a_blocking_call_behind_a_queued_one_waits_its_turn_on_the_workers_thread(switch):
    with HySyncWorker(config(switch.address[1], 0, 2), scale=SCALE) as a, \
            HySyncWorker(config(switch.address[1], 1, 2), scale=SCALE) as b:
        switch.install(Job(JOB, 0, 8, [(0, *a.address), (1, *b.address)]))
        calls = record_calls(a)
        first = a.allreduce_async(torch.full((300,), 1.0), key="first")  # waits for b
        second = a.allreduce_async(torch.full((300,), 3.0), key="second", blocking=True)
        assert not first.done() and not second.done()  # queued: b has not contributed
        b.allreduce(torch.full((300,), 5.0), key="first")
        b.allreduce(torch.full((300,), 7.0), key="second")
        torch.testing.assert_close(first.wait(), torch.full((300,), 3.0))
        torch.testing.assert_close(second.wait(), torch.full((300,), 5.0))
        assert [key for key, _, _, _ in calls] == ["first", "second"]
        (_, t1, _, end1), (_, t2, start2, _) = calls
        assert t1 is t2 and t1.name.startswith("hysync-w0")  # the worker's thread, in order
        assert start2 >= end1  # never overlapping

"""A NaN, an infinity or a value beyond the quantizer's range in one member's gradient is
non-finite in every member's result, in sync, partial and async (docs/protocol.md §9,
"Non-finite values"), and it is delivered once: later calls of finite gradients are finite
again, and no residual keeps it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from hysync.wire import Mode
from hysync.worker.api import HySyncWorker
from hysync.worker.config import TransportConfig
from tests.worker.conftest import Job

SCALE = 2.0**20
JOB = 9
N = 2
SIZE = 300  # five chunks: the bad elements sit in different ones
BAD = {0: {3: float("nan"), 130: 1e30}, 1: {200: float("inf"), 201: float("-inf")}}
WAIT = 60.0


def config(switch_port: int, worker: int) -> TransportConfig:
    return TransportConfig(job_id=JOB, worker_id=worker, switch_host="127.0.0.1",
                           switch_port=switch_port, bind_host="127.0.0.1", slot_base=0,
                           slot_count=8, members=N, seed=worker)


def gradient(worker: int, call: int) -> torch.Tensor:
    g = torch.from_numpy(np.random.default_rng((worker, call)).standard_normal(SIZE)
                         .astype(np.float32))
    return g


def run_calls(workers: list[HySyncWorker], grads: dict[int, list[torch.Tensor]]
              ) -> dict[int, list[torch.Tensor]]:
    """Every worker makes its calls in order on a thread of its own (as separate processes
    would), the members' calls in step (a barrier before each: in partial and async a member
    left out of rounds would otherwise run calls ahead, and back in sync its rounds would pair
    other calls than its peer's, docs/protocol.md §10, "Drift at a job's end"); returns every
    output."""
    outs: dict[int, list[torch.Tensor]] = {w: [] for w in range(N)}
    errors: list[BaseException] = []
    step = threading.Barrier(N, timeout=WAIT)

    def run(w: int) -> None:
        try:
            for g in grads[w]:
                step.wait()
                outs[w].append(workers[w].allreduce(g, key="g"))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a call did not end"
    assert not errors, errors
    return outs


@pytest.mark.parametrize("mode,quorum", [(Mode.SYNC, 0), (Mode.PARTIAL, 1), (Mode.ASYNC, 0)],
                         ids=["sync", "partial", "async"])
def test_a_non_finite_element_of_one_member_is_non_finite_at_every_member(switch, mode,
                                                                         quorum):
    workers = [HySyncWorker(config(switch.address[1], w), scale=SCALE) for w in range(N)]
    try:
        job = Job(JOB, 0, 8, [(w, *workers[w].address) for w in range(N)])
        switch.install(job, mode, quorum)
        calls = 3
        grads = {w: [gradient(w, t) for t in range(calls)] for w in range(N)}
        for w, bad in BAD.items():
            for j, value in bad.items():
                grads[w][0][j] = value
        outs = run_calls(workers, grads)
        # Back in sync: a flush of finite gradients ends finite everywhere, and nothing
        # non-finite or out of range is left behind in a residual to be sent again.
        switch.set_mode(job, Mode.SYNC)
        flush = run_calls(workers, {w: [gradient(w, t) for t in range(10, 13)]
                                    for w in range(N)})
        bad_elements = sorted(j for bad in BAD.values() for j in bad)
        for w in range(N):
            seen = torch.stack(outs[w] + flush[w])
            # Every bad element reached this member as non-finite in some call (in partial
            # and async a round may be applied a call later, or carried once); nothing else
            # is non-finite.
            nonfinite = ~torch.isfinite(seen)
            assert sorted(torch.nonzero(nonfinite.any(0)).flatten().tolist()) == \
                bad_elements, (w, torch.nonzero(nonfinite).tolist())
            assert torch.isfinite(flush[w][-1]).all(), w
            residual = workers[w].transport.residual("g")
            assert np.isfinite(residual).all() and np.abs(residual).max() <= 0.5 / SCALE * 1.01
        if mode == Mode.SYNC:  # one round per call: the bad call itself, at both
            for w in range(N):
                assert (~torch.isfinite(outs[w][0])).sum() == len(bad_elements)
                assert all(torch.isfinite(o).all() for o in outs[w][1:])
                mean = (grads[0][1] + grads[1][1]) / N
                assert torch.abs(outs[w][1] - mean).max() <= 1.0 / SCALE + 1e-6
    finally:
        for hw in workers:
            hw.close()


def test_a_value_beyond_the_range_is_overflow_once_not_a_pin_at_the_bound(switch):
    """1e30 once pinned its output at the clip bound for every later call (the residual
    re-sent it); now it is NaN in its call, and the next call is the plain mean."""
    workers = [HySyncWorker(config(switch.address[1], w), scale=SCALE) for w in range(N)]
    try:
        switch.install(Job(JOB, 0, 8, [(w, *workers[w].address) for w in range(N)]))
        ones = torch.ones(SIZE)
        first = ones.clone()
        first[7] = 1e30
        outs = run_calls(workers, {0: [first, ones, ones], 1: [ones, ones, ones]})
        for w in range(N):
            assert torch.isnan(outs[w][0][7]) and torch.isfinite(outs[w][0][:7]).all()
            assert torch.equal(outs[w][1], ones) and torch.equal(outs[w][2], ones)
        stats = workers[0].last_stats("g")
        assert stats is not None and stats.quant.clipped == 0
    finally:
        for hw in workers:
            hw.close()

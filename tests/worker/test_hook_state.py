"""The DDP hook's state owns each bucket's residual, as PowerSGD's state owns `error_dict`: the
engine holds none between calls, and the state pickles with its residuals and comes back to
work on another worker - the next step then applies them, so no gradient is lost. Built on the
transport's caller-owned residual (the engine's give_residual / export_residual)."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hysync.worker.api import HySyncWorker
from hysync.worker.config import TransportConfig
from hysync.worker.ddp_hook import HySyncHookState, bucket_key, hysync_hook
from tests.worker.conftest import Job, Switch

SCALE = 16.0  # a coarse grid (1/16): residuals as large as the gradients here
N = 8  # one Linear(N, 1) weight: one bucket, index 0, whose gradient is the input


@pytest.fixture
def process_group() -> Iterator[None]:
    """A one-rank gloo group, in this process: DDP needs one, the hook replaces its all-reduce."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def worker(switch_port: int, job_id: int, slot_base: int, **settings: float) -> HySyncWorker:
    return HySyncWorker(TransportConfig(job_id=job_id, worker_id=0, switch_host="127.0.0.1",
                                        switch_port=switch_port, bind_host="127.0.0.1",
                                        slot_base=slot_base, slot_count=4, members=1, seed=0,
                                        **settings), scale=SCALE)


def joined(switch: Switch, hw: HySyncWorker) -> HySyncWorker:
    cfg = hw.config
    switch.install(Job(cfg.job_id, cfg.slot_base, cfg.slot_count, [(0, *hw.address)]))
    return hw


def step(model: torch.nn.Module, state: HySyncHookState, grad: torch.Tensor) -> torch.Tensor:
    """One backward through a fresh DDP with the hook; returns the averaged gradient."""
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(state, hysync_hook)
    model.zero_grad()
    ddp(grad.unsqueeze(0)).sum().backward()  # d/dw (w . grad) = grad
    return model.weight.grad.reshape(-1).clone()


def test_residuals_survive_a_pickle_round_trip_and_the_next_step_applies_them(
        switch, process_group):
    model = torch.nn.Linear(N, 1, bias=False)
    grad = torch.full((N,), 0.03)  # 0.48 grid steps: rounds to 0, all of it is residual
    with joined(switch, worker(switch.address[1], 5, 0)) as first:
        state = HySyncHookState(first)
        out1 = step(model, state, grad)
        assert torch.equal(out1, torch.zeros(N))
        np.testing.assert_allclose(state.residuals[0], 0.03, rtol=1e-6)
        # the state owns it: the engine keeps none between calls
        assert not first.transport.residual(bucket_key(0)).any()
        blob = pickle.dumps(state)

    restored = pickle.loads(blob)
    assert restored.worker is None and restored.stats.calls == 1
    np.testing.assert_array_equal(restored.residuals[0], state.residuals[0])
    with pytest.raises(RuntimeError, match=r"state\.attach\(HySyncWorker"):
        restored.last_stats()

    with joined(switch, worker(switch.address[1], 6, 4)) as second:  # a new socket, a new job
        restored.attach(second)
        out2 = step(model, restored, grad)
    # 0.03 + 0.03 = 0.96 grid steps: one step (1/16) goes out, without the restored residual
    # it would have been 0 again
    assert torch.equal(out2, torch.full((N,), 1 / SCALE))
    # nothing lost across the pickle: sent + still held = every gradient contributed
    torch.testing.assert_close(out1 + out2 + torch.from_numpy(restored.residuals[0]), 2 * grad,
                               atol=1e-6, rtol=0)
    assert restored.stats.calls == 2


def test_a_state_mid_call_refuses_to_pickle_and_a_failed_call_gives_the_residual_back(
        dead_port, process_group):
    """Pickling is for between steps; a call that fails (no switch) still hands the bucket's
    residual back to the state, holding the whole gradient (RULE B keeps it)."""
    model = torch.nn.Linear(N, 1, bias=False)
    grad = torch.linspace(-1, 1, N)
    with worker(dead_port, 7, 0, dead_after=1.5) as hw:
        state = HySyncHookState(hw)
        failures: list[BaseException] = []

        def backward() -> None:
            try:
                step(model, state, grad)
            except BaseException as err:  # noqa: BLE001 - asserted below
                failures.append(err)

        thread = threading.Thread(target=backward)
        thread.start()
        deadline = time.monotonic() + 1.0
        refused = None
        while refused is None and time.monotonic() < deadline:
            try:
                pickle.dumps(state)
                time.sleep(0.01)  # the hook has not lent the residual yet
            except RuntimeError as err:
                refused = err
        thread.join(timeout=30)
        assert refused is not None and "pickle it between steps" in str(refused)
        assert failures and "no reply from the HySync switch" in str(failures[0])
        np.testing.assert_allclose(state.residuals[0], grad.numpy(), atol=1e-6)
        assert not hw.transport.residual(bucket_key(0)).any()
        assert pickle.loads(pickle.dumps(state)).residuals.keys() == {0}


def test_a_caller_owned_residual_goes_in_before_the_call_and_comes_back_after(switch):
    """Transport.allreduce(residual=...), what the hook is built on; a residual that does not
    fit is refused naming the fix, before anything is registered."""
    with joined(switch, worker(switch.address[1], 8, 0)) as hw:
        tr = hw.transport
        residual = np.full(N, 0.03, dtype=np.float32)
        out = tr.allreduce("k", np.full(N, 0.03, dtype=np.float32), residual=residual).output
        np.testing.assert_array_equal(out, 1 / SCALE)
        np.testing.assert_allclose(residual, 0.06 - 1 / SCALE, atol=1e-7)
        assert not tr.residual("k").any()
        for bad in (np.zeros(N), np.zeros(N + 1, dtype=np.float32)):
            with pytest.raises(ValueError, match=f"contiguous 1-d float32 array of {N} "):
                tr.allreduce("other", np.zeros(N, dtype=np.float32), residual=bad)
        with pytest.raises(KeyError):
            tr.residual("other")

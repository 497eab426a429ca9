"""Each bucket's residual has one owner, as PowerSGD's `error_dict` has: the worker's engine
keeps it under the bucket's key from call to call. The hook state pickles with the residuals
read from the engine and comes back to work on another worker - the bucket's next call hands
them to that worker's engine and applies them, so no gradient is lost."""

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
from hysync.worker.ddp_hook import HookStats, HySyncHookState, bucket_key, hysync_hook
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
        np.testing.assert_allclose(state.residuals()[0], 0.03, rtol=1e-6)
        # the engine owns it: the state reads the engine's, it keeps no copy
        kept = first.transport.residual(bucket_key(0))
        np.testing.assert_array_equal(kept[:N], state.residuals()[0])
        assert not kept[N:].any()  # the padding to a whole chunk
        blob = pickle.dumps(state)

    restored = pickle.loads(blob)
    assert restored.worker is None and restored.stats.calls == 1
    np.testing.assert_array_equal(restored.residuals()[0], state.residuals()[0])
    with pytest.raises(RuntimeError, match=r"state\.attach\(HySyncWorker"):
        restored.last_stats()

    with joined(switch, worker(switch.address[1], 6, 4)) as second:  # a new socket, a new job
        restored.attach(second)
        out2 = step(model, restored, grad)
        left = restored.residuals()[0]
        np.testing.assert_array_equal(second.transport.residual(bucket_key(0))[:N], left)
    # 0.03 + 0.03 = 0.96 grid steps: one step (1/16) goes out, without the restored residual
    # it would have been 0 again
    assert torch.equal(out2, torch.full((N,), 1 / SCALE))
    # nothing lost across the pickle: sent + still held = every gradient contributed
    torch.testing.assert_close(out1 + out2 + torch.from_numpy(left), 2 * grad,
                               atol=1e-6, rtol=0)
    assert restored.stats.calls == 2


def test_a_state_mid_call_refuses_to_pickle_and_a_failed_call_keeps_the_residual(
        dead_port, process_group):
    """Pickling is for between steps; a call that fails (no switch) leaves the whole
    gradient as the bucket's residual in the engine (RULE B keeps it), which the state
    pickles."""
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
                time.sleep(0.01)  # the hook has not started the bucket's call yet
            except RuntimeError as err:
                refused = err
        thread.join(timeout=30)
        assert refused is not None and "pickle it between steps" in str(refused)
        assert failures and "no reply from the HySync switch" in str(failures[0])
        np.testing.assert_allclose(hw.transport.residual(bucket_key(0))[:N], grad.numpy(),
                                   atol=1e-6)
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(state)).residuals()[0],
                                      hw.transport.residual(bucket_key(0))[:N])


def test_the_engine_keeps_a_keys_residual_from_call_to_call(switch, caplog):
    """The residual stays in the engine between calls and rides on the key's next one; a
    key that comes back with another size starts afresh (its residual dropped, logged); a
    key that is not a str is refused naming the fix, before anything is registered."""
    with joined(switch, worker(switch.address[1], 8, 0)) as hw:
        tr = hw.transport
        out = tr.allreduce("k", np.full(N, 0.03, dtype=np.float32)).output
        np.testing.assert_array_equal(out, 0.0)  # 0.48 grid steps: all of it is residual
        np.testing.assert_allclose(tr.residual("k")[:N], 0.03, rtol=1e-6)
        out = tr.allreduce("k", np.full(N, 0.03, dtype=np.float32)).output
        np.testing.assert_array_equal(out, 1 / SCALE)
        np.testing.assert_allclose(tr.residual("k")[:N], 0.06 - 1 / SCALE, atol=1e-7)
        first = tr.first_chunk("k")
        with caplog.at_level("INFO", logger="hysync.worker.transport"):
            out = tr.allreduce("k", np.zeros(2 * N, dtype=np.float32)).output
        np.testing.assert_array_equal(out, 0.0)  # the old residual did not ride along
        assert not tr.residual("k").any() and tr.first_chunk("k") == first + 1
        assert "key 'k' changed size 8 -> 16" in caplog.text
        for bad in (("bucket", 0), 0):
            with pytest.raises(TypeError, match="a HySync key is a str"):
                tr.allreduce(bad, np.zeros(N, dtype=np.float32))  # type: ignore[arg-type]
        with pytest.raises(KeyError, match="register it, or make a call under it"):
            tr.residual("other")


def test_a_restored_residual_of_a_bucket_that_changed_size_is_dropped(switch, process_group,
                                                                       caplog):
    """A checkpoint's residual reaches the engine only for a bucket of the same size: DDP
    rebuilding its buckets starts them afresh, as the engine does for a key."""
    model = torch.nn.Linear(N, 1, bias=False)
    saved = HySyncHookState.__new__(HySyncHookState)
    saved.__setstate__({"residuals": {0: np.full(N // 2, 0.5, dtype=np.float32)},
                        "stats": HookStats()})
    restored = pickle.loads(pickle.dumps(saved))
    with joined(switch, worker(switch.address[1], 9, 0)) as hw:
        restored.attach(hw)
        with caplog.at_level("INFO", logger="hysync.worker.ddp_hook"):
            out = step(model, restored, torch.full((N,), 0.03))
        assert torch.equal(out, torch.zeros(N))  # 0.5 would have sent 8 grid steps
        np.testing.assert_allclose(restored.residuals()[0], 0.03, rtol=1e-6)
    assert f"bucket 0 changed size {N // 2} -> {N}" in caplog.text

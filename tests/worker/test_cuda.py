"""All-reduce of CUDA tensors: the result lands on the tensor's device through pinned
staging and the worker's copy stream, the future carries the device, the DDP hook
reduces a CUDA bucket, and model averaging keeps its state on the
parameters' GPU. Needs a CUDA device; the CPU side of each path is in test_in_place.py,
test_ddp.py and test_averaging.py."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hysync.worker.api import HySyncWorker
from hysync.worker.averaging import BackgroundAverager
from hysync.worker.ddp_hook import HySyncHookState, hysync_hook
from tests.worker.conftest import Job
from tests.worker.test_in_place import JOB, SCALE, config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_a_cuda_tensor_is_reduced_onto_its_device(switch):
    with HySyncWorker(config(switch.address[1]), scale=SCALE) as hw:
        switch.install(Job(JOB, 10, 8, [(0, *hw.address)]))
        grad = torch.linspace(-3, 3, 1000, device="cuda").reshape(10, 100)
        future = hw.allreduce_async(grad.clone(), key="k")
        assert future.devices() == [grad.device]
        out = future.wait()
        assert out.device == grad.device and out.shape == grad.shape
        assert torch.abs(out - grad).max().item() <= 0.5 / SCALE + 1e-7
        work = grad.clone()
        assert hw.allreduce(work, key="k", in_place=True) is work  # written over, on the GPU
        assert torch.abs(work - grad).max().item() <= 0.5 / SCALE + 1e-6


def test_a_copy_leaves_the_callers_tensor_free_at_once(switch):
    with HySyncWorker(config(switch.address[1]), scale=SCALE) as hw:
        switch.install(Job(JOB, 10, 8, [(0, *hw.address)]))
        grad = torch.ones(4096, device="cuda")
        future = hw.allreduce_async(grad, key="k")
        grad.zero_()  # on the caller's stream, after the copy out
        assert torch.allclose(future.wait(), torch.ones(4096, device="cuda"))


def test_averaging_state_lives_on_the_parameters_device(switch):
    worker = HySyncWorker(config(switch.address[1]), scale=SCALE)
    switch.install(Job(JOB, 10, 8, [(0, *worker.address)]))
    params = [torch.randn(10, 10, device="cuda"), torch.randn(10, device="cuda")]
    averager = BackgroundAverager(worker, params, period_s=0.01, steps=10)
    try:
        assert averager.at_step(0.0) == 0.0
        averager.finish(10.0, timeout=30)  # one member: the average is the model itself
        assert all(p.device.type == "cuda" for p in params)
        assert averager.history and averager.history[-1]["final"]
    finally:
        averager.close()


def test_the_ddp_hook_reduces_a_cuda_bucket_in_its_own_memory(switch, tmp_path: Path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    worker = HySyncWorker(config(switch.address[1]), scale=SCALE)
    try:
        switch.install(Job(JOB, 10, 8, [(0, *worker.address)]))
        net = nn.Linear(32, 4).cuda()
        alone = copy.deepcopy(net)
        model = DistributedDataParallel(net)
        state = HySyncHookState(worker)
        model.register_comm_hook(state, hysync_hook)
        x = torch.randn(8, 32, device="cuda")
        model(x).sum().backward()
        alone(x).sum().backward()
        assert state.stats.calls >= 1
        for mine, reference in zip(net.parameters(), alone.parameters(), strict=True):
            assert mine.grad.device == reference.grad.device
            assert torch.abs(mine.grad - reference.grad).max().item() <= 1e-5
    finally:
        worker.close()
        dist.destroy_process_group()

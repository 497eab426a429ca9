"""All-reduce in place: the transport writes the output over the caller's float32 buffer
(no copy of a large tensor), and refuses, changing nothing, a buffer it cannot use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hysync.worker.api import HySyncWorker
from hysync.worker.config import TransportConfig
from tests.worker.conftest import Job

SCALE = 2.0**20
JOB = 5


def config(switch_port: int) -> TransportConfig:
    return TransportConfig(job_id=JOB, worker_id=0, switch_host="127.0.0.1",
                           switch_port=switch_port, bind_host="127.0.0.1", slot_base=10,
                           slot_count=8, members=1, seed=0)


def test_the_output_replaces_the_tensor_and_the_residual_is_the_quantization_error(switch):
    with HySyncWorker(config(switch.address[1]), scale=SCALE) as hw:
        switch.install(Job(JOB, 10, 8, [(0, *hw.address)]))
        grad = torch.linspace(-3, 3, 1000).reshape(10, 100)
        work = grad.clone()
        out = hw.allreduce(work, key="k", in_place=True)
        assert out is work
        assert torch.abs(work - grad).max() <= 0.5 / SCALE + 1e-7
        # error feedback: what was sent plus what is kept is exactly the gradient
        kept = torch.from_numpy(hw.transport.residual("k")[:1000].copy()).reshape(10, 100)
        torch.testing.assert_close(work + kept, grad, atol=1e-7, rtol=0)
        copied = hw.allreduce(grad, key="k")  # the default copies: grad is left alone
        assert copied is not grad and torch.equal(grad, torch.linspace(-3, 3, 1000)
                                                  .reshape(10, 100))


@pytest.mark.parametrize("tensor", [torch.zeros(100, dtype=torch.float64),
                                    torch.zeros(10, 20).t()], ids=["float64", "strided"])
def test_a_buffer_that_cannot_take_the_output_is_refused_naming_the_fix(switch, tensor):
    with HySyncWorker(config(switch.address[1]), scale=SCALE) as hw:
        with pytest.raises(ValueError, match="contiguous float32 CPU or CUDA tensor"):
            hw.allreduce(tensor, key="k", in_place=True)
        with pytest.raises(ValueError, match="convert it first or drop in_place"):
            hw.transport.allreduce("k", tensor.numpy(), in_place=True)
        with pytest.raises(KeyError):
            hw.transport.residual("k")  # nothing was registered: no state changed
    assert not np.any(tensor.numpy())

"""A value of the wrong type given to the worker API is one TypeError that names what it
takes, before anything is sent, not an AttributeError from deep inside."""

from __future__ import annotations

import numpy as np
import pytest

from hysync.worker.api import HySyncWorker
from hysync.worker.config import TransportConfig


@pytest.mark.parametrize("value,name", [([1.0, 2.0], "list"),
                                        (np.ones(3, np.float32), "numpy.ndarray"),
                                        (2.0, "float"), ((1, 2), "tuple")],
                         ids=["list", "ndarray", "float", "tuple"])
@pytest.mark.parametrize("call", ["allreduce", "allreduce_async"])
def test_a_tensor_that_is_not_a_torch_tensor_is_a_type_error_naming_it(dead_port, value,
                                                                         name, call):
    config = TransportConfig(job_id=1, worker_id=0, switch_host="127.0.0.1",
                             switch_port=dead_port, bind_host="127.0.0.1", members=1,
                             dead_after=1.0)
    with HySyncWorker(config) as hw:
        with pytest.raises(TypeError) as err:
            getattr(hw, call)(value, key="k")
        message = str(err.value)
        assert "\n" not in message
        assert f"takes a torch.Tensor (CPU or CUDA), got {name}:" in message
        assert "torch.as_tensor" in message
        with pytest.raises(KeyError):
            hw.transport.residual("k")  # refused before the key was registered

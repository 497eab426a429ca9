"""The HySync worker: quantize, packetize, reliable windowed UDP transport, residuals,
and the PyTorch integration (plain all-reduce and a DDP communication hook).

`worker.transport` and `worker.quantize` need numpy and the compiled core only; `worker.api` and
`worker.ddp_hook` import torch, so they are loaded on first use.
"""

from __future__ import annotations

from typing import Any

from worker.config import TransportConfig
from worker.quantize import FixedPointQuantizer, QuantStats
from worker.stats import CallStats
from worker.transport import CallResult, SwitchUnreachableError, Transport

__all__ = [
    "CallResult", "CallStats", "FixedPointQuantizer", "HySyncHookState", "HySyncWorker",
    "QuantStats", "SwitchUnreachableError", "Transport", "TransportConfig", "hysync_hook",
]

_LAZY = {"HySyncWorker": "worker.api", "HySyncHookState": "worker.ddp_hook",
         "hysync_hook": "worker.ddp_hook"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'worker' has no attribute {name!r}")

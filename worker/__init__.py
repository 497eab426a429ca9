"""The HySync worker: quantize, packetize, reliable windowed UDP transport, residuals,
and the PyTorch integration (plain all-reduce and a DDP communication hook).

`hysync.worker.transport` and `hysync.worker.quantize` need numpy and the compiled core only;
`hysync.worker.api` and `hysync.worker.ddp_hook` import torch, so they are loaded on first use.
"""

from __future__ import annotations

from typing import Any

from hysync.worker.call_stats import CallStats
from hysync.worker.config import TransportConfig
from hysync.worker.quantize import FixedPointQuantizer, QuantStats
from hysync.worker.transport import (
    CallAbortedError,
    CallResult,
    NoReplyError,
    SwitchRestartedError,
    Transport,
)

__all__ = [
    "CallAbortedError", "CallResult", "CallStats", "FixedPointQuantizer", "HySyncHookState",
    "HySyncWorker", "NoReplyError", "QuantStats", "SwitchRestartedError", "Transport",
    "TransportConfig", "hysync_hook",
]

_LAZY = {"HySyncWorker": "hysync.worker.api", "HySyncHookState": "hysync.worker.ddp_hook",
         "hysync_hook": "hysync.worker.ddp_hook"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'worker' has no attribute {name!r}")

"""Fixed-point quantization of gradients for the switch's 32-bit integer adders.

`FixedPointQuantizer(scale, members)` maps a float to `round(x * scale)` clipped to
`±floor((2**31 - 1) / members)`: the switch adds the contributions of up to
`members` workers in wrapping int32 arithmetic, and with this bound their sum can
never wrap:

    payload, stats = quantizer.quantize(values)   # float32 array -> int32 payload
    values = quantizer.dequantize(payload)        # payload may be a sum of payloads

`stats` reports what quantization did: how many elements were clipped, how many
were not finite (NaN/inf are sent as 0 / the bound), and the largest absolute error.
Clipping happens in float32, so a clipped element is sent as `clip_limit`, the largest
float32 not above the bound (at most 128 below it).
The arithmetic runs in the compiled core (native/worker/quantize.cc, one vectorized
pass, the same code the transport engine quantizes with); torch tensors are accepted
without a torch import here, so the transport stays importable (and fast to spawn)
without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hysync import _core

INT32_MAX = 2**31 - 1


@dataclass(slots=True)
class QuantStats:
    """What one quantization did; `merge` folds several together."""

    elements: int = 0
    clipped: int = 0  # |x * scale| > bound: sent as ±bound, the rest is error
    nonfinite: int = 0  # NaN sent as 0, ±inf counted as clipped too
    max_abs_error: float = 0.0  # max |x - q / scale| over the finite elements

    def merge(self, other: QuantStats) -> None:
        self.elements += other.elements
        self.clipped += other.clipped
        self.nonfinite += other.nonfinite
        self.max_abs_error = max(self.max_abs_error, other.max_abs_error)


class FixedPointQuantizer:
    """Job-wide fixed-point format: `scale` units per 1.0, `members` contributors per sum."""

    def __init__(self, scale: float, members: int) -> None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"quantizer scale must be a positive finite number, got {scale!r}; "
                             "HySync uses 2**20 by default")
        if not 1 <= members <= 32:
            raise ValueError(f"members must be 1..32 (the contributor bitmap is 32 bits), "
                             f"got {members}")
        self.scale = float(scale)
        self.members = members
        self.bound = INT32_MAX // members
        # The largest float32 not above `bound`: clipping in float32 must never round up
        # past it, or the int32 sum of `members` contributions could wrap.
        b = np.float32(self.bound)
        self._bound_f32 = b if int(b) <= self.bound else np.nextafter(b, np.float32(0))
        self.clip_limit = int(self._bound_f32)  # what a clipped element is sent as (<= bound)

    def __repr__(self) -> str:
        return f"FixedPointQuantizer(scale={self.scale!r}, members={self.members})"

    # ------------------------------------------------------------ numpy core
    def quantize_with_error(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, QuantStats]:
        """float32 values -> (fixed, error, stats).

        `fixed` is float32 holding integers within ±bound (cast it to int32 exactly,
        e.g. by assigning it to a wire lanes field); `error = values - fixed / scale`
        is what error feedback carries as the residual.
        """
        values = np.ascontiguousarray(values, dtype=np.float32)
        flat = values.reshape(-1)
        fixed, error = np.empty_like(flat), np.empty_like(flat)
        clipped, nonfinite, max_err = _core.worker.quantize(flat, fixed, error, self.scale,
                                                            self.members)
        stats = QuantStats(int(flat.size), clipped, nonfinite, float(max_err))
        return fixed.reshape(values.shape), error.reshape(values.shape), stats

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, QuantStats]:
        """float values -> (int32 payload, stats)."""
        fixed, _, stats = self.quantize_with_error(values)
        return fixed.astype(np.int32), stats

    def dequantize(self, payload: np.ndarray) -> np.ndarray:
        """A payload (or a sum of payloads, any integer/float dtype) -> float32 values."""
        return (np.asarray(payload, dtype=np.float64) / self.scale).astype(np.float32)

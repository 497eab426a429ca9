"""Fixed-point quantization of gradients for the switch's 32-bit integer adders.

`FixedPointQuantizer(scale, members)` maps a float to `round(x * scale)` within
`±bound`; an element that is NaN, an infinity, or beyond the bound is sent as the
*overflow sentinel* instead, a lane value so far above any sum of in-range contributions
that every sum holding one is recognisable (docs/protocol.md §9, "Non-finite values"):

    sentinel = the largest float32 <= (2**31 - 1) // members   (members of them cannot wrap)
    bound    = the largest float32 <= (sentinel - 1) // (2 * members - 1)

so one sentinel beside `members - 1` contributions of `-bound` still sums above
`members * bound`, the most a sum without one reaches. `dequantize` turns a sum beyond
`±members * bound` into NaN: a non-finite gradient on any member is non-finite on every
member, as under gloo, and a value beyond the range is an overflow (as fp16's), never a
silent pin at the bound:

    payload, stats = quantizer.quantize(values)   # float32 array -> int32 payload
    values = quantizer.dequantize(payload)        # payload may be a sum of payloads

`stats` reports what quantization did: how many finite elements were beyond the bound
(`clipped`: sent as overflow), how many were not finite, and the largest absolute error of
the rest. The arithmetic runs in the compiled core (native/worker/quantize.cc, one
vectorized pass, the same code the transport engine quantizes with); torch tensors are
accepted without a torch import here, so the transport stays importable (and fast to
spawn) without torch.
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
    clipped: int = 0  # finite, |x * scale| > bound: sent as the overflow sentinel
    nonfinite: int = 0  # NaN or ±inf: sent as the overflow sentinel
    max_abs_error: float = 0.0  # max |x - q / scale| over the elements in range

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
        # One definition, the core's (native/worker/quantize.cc).
        self.sentinel, self.bound = _core.worker.quantizer_limits(members)
        self.max_sum = members * self.bound  # the most a sum without a sentinel reaches

    def __repr__(self) -> str:
        return f"FixedPointQuantizer(scale={self.scale!r}, members={self.members})"

    # ------------------------------------------------------------ numpy core
    def quantize_with_error(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, QuantStats]:
        """float32 values -> (fixed, error, stats).

        `fixed` is float32 holding integers within ±bound, or the sentinel (cast it to
        int32 exactly, e.g. by assigning it to a wire lanes field); `error = values - fixed
        / scale` is what error feedback carries as the residual (0 for a sentinel: the
        element is spent as overflow).
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
        """A payload (or a sum of up to `members` payloads, any integer/float dtype) ->
        float32 values; NaN where a sentinel is in the sum."""
        sums = np.asarray(payload, dtype=np.float64)
        out = sums / self.scale
        out[np.abs(sums) > self.max_sum] = np.nan
        return out.astype(np.float32)

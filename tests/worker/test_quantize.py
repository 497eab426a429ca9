"""FixedPointQuantizer: round trip within half a quantization step; a non-finite or
out-of-range element sent as the overflow sentinel, which no sum of up to `members`
payloads loses or wraps; honest statistics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hysync.worker.quantize import INT32_MAX, FixedPointQuantizer

scales = st.sampled_from([1.0, 3.0, 2.0**10, 2.0**20, 1e6, 2.0**24])
members = st.integers(min_value=1, max_value=32)
floats = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(scale=scales, n=members, x=arrays(np.float32, st.integers(1, 300), elements=floats))
def test_round_trip_error_is_at_most_half_a_step_unless_clipped(scale, n, x):
    q = FixedPointQuantizer(scale, n)
    payload, stats = q.quantize(x)
    assert payload.dtype == np.int32 and payload.shape == x.shape
    back = q.dequantize(payload)
    inside = np.abs(x.astype(np.float64) * scale) < q.bound - 1
    # half a step, plus float32 rounding of x * scale and of the division
    tol = 0.5 / scale + np.abs(x.astype(np.float64)) * 2**-22
    assert np.all(np.abs(back.astype(np.float64) - x)[inside] <= tol[inside])
    assert stats.clipped == int(np.count_nonzero(~inside)) or \
        stats.clipped >= int(np.count_nonzero(np.abs(x.astype(np.float64) * scale)
                                                  > q.bound + 1))


@settings(max_examples=200, deadline=None)
@given(scale=scales, n=members,
       x=arrays(np.float32, st.integers(1, 200),
                elements=st.floats(allow_nan=True, allow_infinity=True, width=32)))
def test_the_sum_of_every_members_payload_never_wraps(scale, n, x):
    q = FixedPointQuantizer(scale, n)
    payload, stats = q.quantize(x)
    assert q.sentinel * n <= INT32_MAX
    sent = payload.astype(np.int64)
    assert np.all((np.abs(sent) <= q.bound) | (sent == q.sentinel))
    worst = np.abs(sent) * n  # every member sends this payload
    assert np.all(worst <= INT32_MAX)
    assert stats.nonfinite == int(np.count_nonzero(~np.isfinite(x)))
    assert np.all(payload[~np.isfinite(x)] == q.sentinel)


@settings(max_examples=300, deadline=None)
@given(n=members, data=st.data())
def test_any_sum_holding_a_sentinel_decodes_as_nan_and_no_other_does(n, data):
    """Up to `members` payloads, any of them sentinels, the rest anywhere in +-bound: the
    sum (wrapping int32, as the switch adds) is NaN exactly when a sentinel is in it."""
    q = FixedPointQuantizer(2.0**20, n)
    count = data.draw(st.integers(1, n))
    sentinels = data.draw(st.integers(0, count))
    rest = data.draw(st.lists(st.sampled_from([-q.bound, q.bound, 0, -1, 1]) |
                              st.integers(-q.bound, q.bound),
                              min_size=count - sentinels, max_size=count - sentinels))
    total = sentinels * q.sentinel + sum(rest)
    wrapped = (total + 2**31) % 2**32 - 2**31
    assert wrapped == total  # no wrap: the switch's int32 sum is the true sum
    back = q.dequantize(np.array([wrapped], np.int32))[0]
    assert np.isnan(back) == (sentinels > 0)


@given(scale=scales, n=members)
def test_a_value_beyond_the_range_is_overflow_not_a_pin_at_the_bound(scale, n):
    """Beyond +-bound an element is sent as the sentinel, with error 0: it reaches the job
    once, as overflow (NaN on every member), and nothing of it stays in the residual to
    be sent again (a finite 1e30 once pinned its output at the bound for every call)."""
    q = FixedPointQuantizer(scale, n)
    limit = q.bound / scale
    x = np.array([0.0, limit * 4, -limit * 4, limit * 0.25, 1e30], dtype=np.float32)
    fixed, error, stats = q.quantize_with_error(x)
    assert stats.clipped == 3 and stats.nonfinite == 0
    assert list(fixed[[1, 2, 4]]) == [q.sentinel] * 3
    assert list(error[[1, 2, 4]]) == [0.0] * 3
    assert np.isnan(q.dequantize(fixed.astype(np.int32))[[1, 2, 4]]).all()
    assert np.isfinite(q.dequantize(fixed.astype(np.int32))[[0, 3]]).all()


def test_quantize_with_error_gives_the_residual_of_error_feedback():
    q = FixedPointQuantizer(2.0**20, 4)
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    fixed, err, stats = q.quantize_with_error(x)
    np.testing.assert_array_equal(fixed, np.rint(fixed))
    np.testing.assert_allclose(fixed / 2.0**20 + err, x, atol=1e-7)
    assert stats.max_abs_error <= 0.5 / 2**20 * 1.001


def test_dequantize_of_a_sum_of_payloads_is_the_sum_of_the_values():
    q = FixedPointQuantizer(2.0**16, 2)
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    payload, _ = q.quantize(x)
    # the switch adds two members' payloads (int32 adds: the bound keeps them from wrapping)
    back = q.dequantize(payload + payload)
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, 2 * x, atol=1.0 / 2**16, rtol=0)


@pytest.mark.parametrize("scale,n", [(0.0, 4), (float("nan"), 4), (1.0, 0), (1.0, 33)])
def test_bad_parameters_are_refused_with_a_reason(scale, n):
    with pytest.raises(ValueError, match="scale|members"):
        FixedPointQuantizer(scale, n)


def numpy_reference(q: FixedPointQuantizer, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule in numpy: x * scale in float32, rounded half to even where it is within
    +-bound; the sentinel where it is not (NaN, an infinity, beyond the bound). The error
    is x - fixed / scale, 0 for a sentinel."""
    with np.errstate(over="ignore", invalid="ignore"):
        fixed = np.multiply(x, np.float32(q.scale), dtype=np.float32)
        inside = np.abs(fixed) <= np.float32(q.bound)  # False for NaN
        fixed = np.where(inside, np.rint(fixed), np.float32(q.sentinel)).astype(np.float32)
        error = np.subtract(x, fixed / np.float32(q.scale), dtype=np.float32)
    error[~inside] = 0.0
    return fixed, error


@settings(max_examples=200, deadline=None)
@given(scale=scales, n=members,
       x=arrays(np.float32, st.integers(1, 700),
                elements=st.floats(allow_nan=True, allow_infinity=True, width=32)))
def test_the_compiled_quantizer_is_the_numpy_rule_bit_for_bit(scale, n, x):
    """The core quantizes in blocks, with a fast path for blocks inside the bound: every
    block shape (all inside, one NaN, one beyond the bound) gives the same bits."""
    q = FixedPointQuantizer(scale, n)
    fixed, error, stats = q.quantize_with_error(x)
    want_fixed, want_error = numpy_reference(q, x)
    np.testing.assert_array_equal(fixed, want_fixed)
    np.testing.assert_array_equal(error, want_error)
    assert stats.max_abs_error == float(np.abs(want_error).max())

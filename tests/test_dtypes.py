"""Element types and conversions: the numeric conventions everything else relies on."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nxsat import dtypes as dt


def test_names_round_trip():
    for t in dt.ALL:
        assert dt.by_name(t.name) is t and dt.by_relay(t.relay) is t and dt.from_numpy(t.np) is t
    assert dt.by_name("tf32") is dt.TF32 and not dt.TF32.storage


def test_round_tf32_is_nearest_even_on_10_mantissa_bits():
    one_ulp = 2.0 ** -10
    x = np.array([1 + one_ulp / 2, 1 + 3 * one_ulp / 2, 1 + one_ulp / 4, np.inf, -2.5, 3.4e38], np.float32)
    out = dt.round_tf32(x)
    np.testing.assert_array_equal(out[:3], [1.0, 1 + 2 * one_ulp, 1.0])
    assert out[3] == np.inf and out[4] == -2.5
    # every result has its 13 low mantissa bits clear
    assert not np.any(out[np.isfinite(out)].view(np.uint32) & 0x1FFF)


@pytest.mark.parametrize("target", [dt.BF16, dt.F16, dt.F8E4M3FN, dt.F8E5M2])
def test_cast_to_low_precision_matches_ml_dtypes(target):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 50
    np.testing.assert_array_equal(dt.cast(x, target).astype(np.float32), x.astype(target.np).astype(np.float32))


def test_cast_float_to_int_saturates_for_64_bit():
    x = np.array([1e30, -1e30, np.nan, 2.0**63, -(2.0**63)], np.float64)
    np.testing.assert_array_equal(dt.cast(x, dt.S64), [2**63 - 1, -(2**63), 0, 2**63 - 1, -(2**63)])
    np.testing.assert_array_equal(dt.cast(x, dt.U64)[:3], [2**64 - 1, 0, 0])


def test_bf16_to_fp8_goes_through_fp32_once():
    x = np.array([0.3, 448.0, -17.5], ml_dtypes.bfloat16)
    out = dt.cast(x, dt.F8E4M3FN)
    np.testing.assert_array_equal(out.astype(np.float32),
                                  x.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))

"""Elementwise operators against independent numpy / Python computations (XLA's semantics)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module


def run(op: str, *arrays: np.ndarray, **attrs) -> np.ndarray:
    b = Builder()
    params = [b.param(dt.from_numpy(a.dtype), a.shape) for a in arrays]
    m = b.module(b.op(op, params, **attrs))
    (out,) = run_module(m, list(arrays))
    return out


def f32(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float32)


X = f32(-2.5, -1.0, -0.5, -0.0, 0.0, 0.3, 1.0, 2.5, 100.0)


@pytest.mark.parametrize("op,ref", [
    ("exponential", math.exp), ("log", lambda v: math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan)),
    ("sqrt", lambda v: math.sqrt(v) if v >= 0 else math.nan), ("tanh", math.tanh), ("sine", math.sin),
    ("cosine", math.cos), ("exponential-minus-one", math.expm1), ("erf", math.erf),
    ("logistic", lambda v: 1 / (1 + math.exp(-v))), ("abs", abs), ("negate", lambda v: -v),
    ("floor", math.floor), ("ceil", math.ceil),
])
def test_unary_float_matches_python_math(op, ref):
    out = run(op, X)
    with np.errstate(all="ignore"):
        expect = np.array([ref(float(v)) if not (op == "log" and v < 0) else math.nan for v in X], np.float64)
    # The exact value rounded once to fp32 (overflow to inf included).
    with np.errstate(over="ignore"):
        expect32 = expect.astype(np.float32)
    np.testing.assert_allclose(out, expect32, rtol=2e-7, atol=0, equal_nan=True)
    assert out.dtype == np.float32


def test_rsqrt_and_cbrt():
    x = f32(0.25, 4.0, 9.0, 1e-30, 8.0, -27.0)
    np.testing.assert_allclose(run("rsqrt", x[:4]), [2.0, 0.5, 1 / 3, 1e15], rtol=1e-7)
    np.testing.assert_allclose(run("cbrt", x[4:]), [2.0, -3.0], rtol=1e-7)


def test_round_modes():
    x = f32(-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997)
    np.testing.assert_array_equal(run("round-nearest-afz", x), f32(-3, -2, -1, 1, 2, 3, 0))
    np.testing.assert_array_equal(run("round-nearest-even", x), f32(-2, -2, -0, 0, 2, 2, 0))


def test_sign_keeps_nan_and_is_finite():
    x = f32(-3, 0, 5, np.nan, np.inf, -np.inf)
    out = run("sign", x)
    np.testing.assert_array_equal(out[:3], f32(-1, 0, 1))
    assert np.isnan(out[3]) and out[4] == 1 and out[5] == -1
    np.testing.assert_array_equal(run("is-finite", x), [True, True, True, False, False, False])


def test_bf16_computes_in_f32_and_rounds_once():
    x = np.array([1.0, 3.0, 1.0 / 3.0], dtype=ml_dtypes.bfloat16)
    y = np.array([2.0 ** -9, 2.0 ** -8, 3.0], dtype=ml_dtypes.bfloat16)
    out = run("add", x, y)
    expect = (x.astype(np.float32) + y.astype(np.float32)).astype(ml_dtypes.bfloat16)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), expect.astype(np.float32))


def test_integer_arithmetic_wraps():
    a = np.array([2**31 - 1, -(2**31), 7], np.int32)
    b = np.array([1, -1, 3], np.int32)
    np.testing.assert_array_equal(run("add", a, b), np.array([-(2**31), 2**31 - 1, 10], np.int32))
    np.testing.assert_array_equal(run("multiply", a, b), np.array([2**31 - 1, -(2**31), 21], np.int32))
    np.testing.assert_array_equal(run("negate", a), np.array([-(2**31 - 1), -(2**31), -7], np.int32))
    np.testing.assert_array_equal(run("abs", a), np.array([2**31 - 1, -(2**31), 7], np.int32))


def test_integer_division_semantics():
    a = np.array([7, -7, 7, -7, 5, -(2**31), 0], np.int32)
    b = np.array([2, 2, -2, -2, 0, -1, 0], np.int32)
    # Truncation toward zero; x/0 = -1; INT_MIN/-1 = INT_MIN.
    np.testing.assert_array_equal(run("divide", a, b), np.array([3, -3, -3, 3, -1, -(2**31), -1], np.int32))
    # Sign of the dividend; x%0 = x; INT_MIN%-1 = 0.
    np.testing.assert_array_equal(run("remainder", a, b), np.array([1, -1, 1, -1, 5, 0, 0], np.int32))
    u = np.array([7, 5], np.uint32)
    np.testing.assert_array_equal(run("divide", u, np.array([2, 0], np.uint32)), np.array([3, 2**32 - 1], np.uint32))


def test_float_remainder_is_fmod():
    np.testing.assert_allclose(run("remainder", f32(5.5, -5.5, 5.5), f32(2, 2, -2)), f32(1.5, -1.5, 1.5))


def test_shifts_at_and_beyond_width():
    x = np.array([1, -8, 0x40000000, -1, 5], np.int32)
    s = np.array([3, 1, 1, 32, 40], np.int32)
    np.testing.assert_array_equal(run("shift-left", x, s), np.array([8, -16, -(2**31), 0, 0], np.int32))
    np.testing.assert_array_equal(run("shift-right-arithmetic", x, s), np.array([0, -4, 0x20000000, -1, 0], np.int32))
    np.testing.assert_array_equal(run("shift-right-logical", x, s),
                                  np.array([0, 0x7FFFFFFC, 0x20000000, 0, 0], np.int32))
    neg_amount = np.array([-1], np.int32)  # read as unsigned: huge, so 0
    np.testing.assert_array_equal(run("shift-left", np.array([3], np.int32), neg_amount), np.array([0], np.int32))


def test_integer_power_including_negative_exponents():
    base = np.array([2, 3, 1, -1, -1, 2, 0], np.int32)
    exp = np.array([10, 3, -5, -3, -2, -1, 0], np.int32)
    np.testing.assert_array_equal(run("power", base, exp), np.array([1024, 27, 1, -1, 1, 0, 1], np.int32))


def test_float_power_and_atan2():
    np.testing.assert_allclose(run("power", f32(2, 4, 9), f32(0.5, -1, 1.5)), [math.sqrt(2), 0.25, 27.0], rtol=1e-7)
    y, x = f32(1, -1, 0, 1), f32(1, -1, -1, 0)
    np.testing.assert_allclose(run("atan2", y, x), [math.atan2(a, b) for a, b in zip(y, x)], rtol=1e-7)


def test_max_min_propagate_nan():
    a, b = f32(1, np.nan, 3), f32(2, 0, np.nan)
    out = run("maximum", a, b)
    assert out[0] == 2 and np.isnan(out[1]) and np.isnan(out[2])
    out = run("minimum", a, b)
    assert out[0] == 1 and np.isnan(out[1]) and np.isnan(out[2])


def test_logic_on_pred_and_ints():
    p, q = np.array([True, True, False, False]), np.array([True, False, True, False])
    np.testing.assert_array_equal(run("and", p, q), [True, False, False, False])
    np.testing.assert_array_equal(run("or", p, q), [True, True, True, False])
    np.testing.assert_array_equal(run("xor", p, q), [False, True, True, False])
    np.testing.assert_array_equal(run("not", p), [False, False, True, True])
    a, b = np.array([0b1100, -1], np.int32), np.array([0b1010, 5], np.int32)
    np.testing.assert_array_equal(run("and", a, b), [0b1000, 5])
    np.testing.assert_array_equal(run("xor", a, b), [0b0110, -6])
    np.testing.assert_array_equal(run("not", a), [~0b1100, 0])


def test_popcnt_and_clz():
    x = np.array([0, 1, 0xFF, -1, 0x00010000], np.int32)
    np.testing.assert_array_equal(run("popcnt", x), [0, 1, 8, 32, 1])
    np.testing.assert_array_equal(run("count-leading-zeros", x), [32, 31, 24, 0, 15])
    u8 = np.array([0, 1, 0x80], np.uint8)
    np.testing.assert_array_equal(run("count-leading-zeros", u8), [8, 7, 0])


@pytest.mark.parametrize("direction,fn", [("EQ", np.equal), ("NE", np.not_equal), ("LT", np.less),
                                          ("LE", np.less_equal), ("GT", np.greater), ("GE", np.greater_equal)])
def test_compare_float_directions_with_nan(direction, fn):
    a, b = f32(1, 2, np.nan, -0.0, 3), f32(2, 2, 1, 0.0, np.nan)
    np.testing.assert_array_equal(run("compare", a, b, direction=direction, type=None), fn(a, b))


def test_compare_total_order():
    # totalOrder: -NaN < -inf < -1 < -0 < +0 < 1 < inf < NaN
    vals = f32(-np.nan, -np.inf, -1, -0.0, 0.0, 1, np.inf, np.nan)
    vals[0] = -np.abs(vals[0])  # make sure the sign bit of the first NaN is set
    a = np.repeat(vals, len(vals))
    b = np.tile(vals, len(vals))
    rank = np.repeat(np.arange(len(vals)), len(vals)), np.tile(np.arange(len(vals)), len(vals))
    np.testing.assert_array_equal(run("compare", a, b, direction="LT", type="TOTALORDER"), rank[0] < rank[1])
    np.testing.assert_array_equal(run("compare", a, b, direction="EQ", type="TOTALORDER"), rank[0] == rank[1])


def test_compare_unsigned_and_signed():
    a, b = np.array([0, 2**32 - 1], np.uint32), np.array([1, 1], np.uint32)
    np.testing.assert_array_equal(run("compare", a, b, direction="GT", type="UNSIGNED"), [False, True])


def test_select_with_scalar_and_full_predicates():
    a, b = f32(1, 2, 3), f32(-1, -2, -3)
    np.testing.assert_array_equal(run("select", np.array([True, False, True]), a, b), f32(1, -2, 3))
    np.testing.assert_array_equal(run("select", np.array(False), a, b), b)


def test_clamp_with_scalar_bounds():
    x = f32(-5, 0.5, 5)
    np.testing.assert_array_equal(run("clamp", np.float32(0), x, np.float32(1)), f32(0, 0.5, 1))
    np.testing.assert_array_equal(run("clamp", f32(-1, 1, 2), x, f32(0, 2, 3)), f32(-1, 1, 3))


def test_reduce_precision_to_bf16_format():
    # bf16 keeps f32's exponent field, so XLA leaves the exponent (and denormals) alone: the
    # result is exactly the bf16 rounding, a denormal included.
    x = f32(1.0 + 2.0 ** -9, 1.0 + 3 * 2.0 ** -9, 3.0e38, 1e-40)
    out = run("reduce-precision", x, exponent_bits=8, mantissa_bits=7)
    expect = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert expect[3] != 0
    np.testing.assert_array_equal(out, expect)


def test_reduce_precision_works_on_the_operands_own_bits():
    # A narrower exponent sends what it cannot hold to signed zero / infinity (denormals too).
    x = f32(1e-40, -1e-6, 65504.0, -7e4, 1.5)
    np.testing.assert_array_equal(run("reduce-precision", x, exponent_bits=5, mantissa_bits=10),
                                  f32(0.0, -0.0, 65504.0, -np.inf, 1.5))
    # NaNs come back as they were, or as +inf when no mantissa bit is left (XLA's rule).
    nan = np.array([0x7FC00001, 0xFF800001], np.uint32).view(np.float32)
    assert run("reduce-precision", nan, exponent_bits=5, mantissa_bits=2).view(np.uint32).tolist() == \
        [0x7FC00001, 0xFF800001]
    np.testing.assert_array_equal(run("reduce-precision", nan, exponent_bits=5, mantissa_bits=0), f32(np.inf, np.inf))
    for bits in ({"exponent_bits": 0, "mantissa_bits": 2}, {"exponent_bits": 5, "mantissa_bits": -1}):
        with pytest.raises(NxsatError, match="NCC_EVRF064"):
            run("reduce-precision", x, **bits)


@pytest.mark.parametrize("op,args,msg", [
    ("add", [(dt.F32, (2,)), (dt.F32, (3,))], "shapes differ"),
    ("add", [(dt.F32, (2,)), (dt.S32, (2,))], "element types differ"),
    ("and", [(dt.F32, (2,)), (dt.F32, (2,))], "not defined on f32"),
    ("sqrt", [(dt.S32, (2,))], "not defined on s32"),
    ("select", [(dt.S32, (2,)), (dt.F32, (2,)), (dt.F32, (2,))], "must be pred"),
    ("select", [(dt.PRED, (3,)), (dt.F32, (2,)), (dt.F32, (2,))], "does not match"),
])
def test_shape_rule_failures_are_coded(op, args, msg):
    b = Builder()
    params = [b.param(d, s) for d, s in args]
    with pytest.raises(NxsatError) as exc:
        b.op(op, params)
    assert exc.value.code == "NCC_EVRF064" and msg in exc.value.message


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=8),
       st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=8))
def test_int32_division_matches_c_semantics(xs, ys):
    n = min(len(xs), len(ys))
    a, b = np.array(xs[:n], np.int32), np.array(ys[:n], np.int32)
    q, r = run("divide", a, b), run("remainder", a, b)
    for x, y, qq, rr in zip(xs, ys, q, r):
        if y == 0:
            assert qq == -1 and rr == x
        elif x == -(2**31) and y == -1:
            assert qq == x and rr == 0
        else:
            t = abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1)
            assert qq == t and rr == x - t * y

"""Data-movement operators and conversions against independent numpy computations."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.attrs import PadDim, SliceDim
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module
from nxsat.ir import TensorType


def run(op: str, *arrays: np.ndarray, **attrs) -> np.ndarray:
    b = Builder()
    params = [b.param(dt.from_numpy(a.dtype), a.shape) for a in arrays]
    outs = run_module(b.module(b.op(op, params, **attrs)), list(arrays))
    return outs[0] if len(outs) == 1 else outs


A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def test_broadcast_with_permuted_dims_and_exact_sizes():
    v = np.array([1, 2, 3], np.int32)
    out = run("broadcast", v, shape=(2, 3), dimensions=(1,))
    np.testing.assert_array_equal(out, [[1, 2, 3], [1, 2, 3]])
    # XLA's verifier wants each operand dimension to equal its result dimension: a size-1
    # dimension does not expand (that is broadcast_in_dim's degenerate form, not HLO).
    with pytest.raises(NxsatError, match="NCC_EVRF064.*operand dimension 1 \\(1\\)"):
        run("broadcast", np.array([[5], [6]], np.int32), shape=(2, 4), dimensions=(0, 1))
    m = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = run("broadcast", m, shape=(3, 5, 2), dimensions=(2, 0))
    for i in range(3):
        for j in range(5):
            for k in range(2):
                assert out[i, j, k] == m[k, i]


def test_reshape_transpose_reverse():
    np.testing.assert_array_equal(run("reshape", A, shape=(6, 4)), A.ravel().reshape(6, 4))
    out = run("transpose", A, dimensions=(2, 0, 1))
    assert out.shape == (4, 2, 3) and out[3, 1, 2] == A[1, 2, 3]
    out = run("reverse", A, dimensions=(0, 2))
    assert out[0, 0, 0] == A[1, 0, 3]


def test_slice_with_strides():
    out = run("slice", A, slice=(SliceDim(0, 2), SliceDim(1, 3), SliceDim(0, 4, 3)))
    np.testing.assert_array_equal(out, A[:, 1:3, ::3])


def test_dynamic_slice_clamps_out_of_range_starts():
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    out = run("dynamic-slice", x, np.int32(4), np.int32(-3), sizes=(2, 3))
    np.testing.assert_array_equal(out, x[3:5, 0:3])  # 4 -> 3 (5-2), -3 -> 0


def test_dynamic_update_slice_clamps():
    x = np.zeros((5, 6), np.float32)
    u = np.ones((2, 3), np.float32)
    out = run("dynamic-update-slice", x, u, np.int32(1), np.int32(10))
    expect = x.copy()
    expect[1:3, 3:6] = 1
    np.testing.assert_array_equal(out, expect)


def test_concatenate():
    a, b = np.ones((2, 1), np.int32), np.zeros((2, 3), np.int32)
    np.testing.assert_array_equal(run("concatenate", a, b, dimension=1), np.concatenate([a, b], 1))


def test_pad_edges_interior_and_negative():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    out = run("pad", x, np.float32(0), padding=(PadDim(1, 0, 1), PadDim(-1, 2, 0)))
    # rows: 1 low, interior 1 between the two rows -> [0, r0, 0, r1]; cols: drop first, 2 high.
    expect = np.array([[0, 0, 0, 0], [2, 3, 0, 0], [0, 0, 0, 0], [5, 6, 0, 0]], np.float32)
    np.testing.assert_array_equal(out, expect)
    out = run("pad", x, np.float32(9), padding=(PadDim(0, 0, 0), PadDim(-2, -1, 2)))
    # interior 2 in cols: [1,9,9,2,9,9,3] then crop 2 low and 1 high -> [9,2,9,9]
    np.testing.assert_array_equal(out, [[9, 2, 9, 9], [9, 5, 9, 9]])


def test_iota_all_dims_and_types():
    b = Builder()
    m = b.module([b.op("iota", type=TensorType(dt.S32, (2, 3)), iota_dimension=1),
                  b.op("iota", type=TensorType(dt.BF16, (300,)), iota_dimension=0)])
    i, f = run_module(m, [])
    np.testing.assert_array_equal(i, [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(f.astype(np.float32), np.arange(300).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_convert_float_to_int_saturates_and_nan_is_zero():
    x = np.array([1.9, -1.9, 3e9, -3e9, np.nan, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(run("convert", x, dtype=dt.S32),
                                  [1, -1, 2**31 - 1, -(2**31), 0, 2**31 - 1, -(2**31)])
    np.testing.assert_array_equal(run("convert", np.array([-1.0, 300.0], np.float32), dtype=dt.U8), [0, 255])


def test_convert_to_low_precision_rounds_nearest_even():
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 448.0, 500.0, 1e6], np.float32)
    out = run("convert", x, dtype=dt.BF16)
    np.testing.assert_array_equal(out.astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    out = run("convert", x, dtype=dt.F8E4M3FN)
    assert out.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(out.astype(np.float32)[:3], [1.0, 1.0, 448.0])


def test_convert_int_wraps_and_pred():
    np.testing.assert_array_equal(run("convert", np.array([300, -1], np.int32), dtype=dt.U8), [44, 255])
    np.testing.assert_array_equal(run("convert", np.array([0.0, -0.5, 2.0], np.float32), dtype=dt.PRED),
                                  [False, True, True])


def test_bitcast_convert_same_and_changing_width():
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(run("bitcast-convert", x, dtype=dt.U32), x.view(np.uint32))
    out = run("bitcast-convert", x, dtype=dt.U8)
    assert out.shape == (2, 4)
    np.testing.assert_array_equal(out.ravel(), x.view(np.uint8))
    back = run("bitcast-convert", out, dtype=dt.F32)
    np.testing.assert_array_equal(back, x)


def test_tuple_and_get_tuple_element():
    b = Builder()
    x = b.param(dt.F32, (2,))
    y = b.param(dt.S32, ())
    t = b.op("tuple", [x, y])
    m = b.module(b.op("get-tuple-element", [t], index=1))
    assert run_module(m, [np.zeros(2, np.float32), np.int32(7)])[0] == 7


def test_elided_constant_loads_but_refuses_to_run():
    b = Builder()
    t = TensorType(dt.F32, (3,))
    from nxsat.ir import Node

    n = Node("constant", (), {"value": None, "type": t}, t, "big")
    b.nodes.append(n)
    m = b.module(n)
    with pytest.raises(NxsatError) as exc:
        run_module(m, [])
    assert exc.value.code == "NCC_ECON001"


@pytest.mark.parametrize("op,shape,attrs,msg", [
    ("reshape", (2, 3), {"shape": (4, 2)}, "cannot reshape"),
    ("transpose", (2, 3), {"dimensions": (0, 0)}, "not a permutation"),
    ("broadcast", (3,), {"shape": (2, 4), "dimensions": (1,)}, "does not match"),
    ("slice", (4,), {"slice": (SliceDim(1, 6),)}, "out of range"),
    ("reverse", (4,), {"dimensions": (1,)}, "out of range"),
    ("bitcast-convert", (3,), {"dtype": dt.F64}, "minor dimension"),
])
def test_shape_rule_failures(op, shape, attrs, msg):
    b = Builder()
    x = b.param(dt.F32, shape)
    with pytest.raises(NxsatError) as exc:
        b.op(op, [x], **attrs)
    assert exc.value.code == "NCC_EVRF064" and msg in exc.value.message


def test_scalar_operands_keep_rank_zero():
    # 0-d values stay 0-d through bitcast-convert and shifts (mobilenet bitcasts a scalar).
    out = run("bitcast-convert", np.float32(1.0), dtype=dt.S32)
    assert out.shape == () and int(out) == 0x3F800000
    b = Builder()
    x = b.param(dt.U32, ())
    m = b.module(b.op("shift-left", [x, x]))
    assert run_module(m, [np.uint32(3)])[0].shape == ()

"""Relay tensor operators (elementwise, shapes, slicing, reductions, indexing, creation), checked
against numpy computations written here, and Relay's own shape rules."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.special
from relay_testkit import relay

from nxsat.diagnostics import NxsatError


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- elementwise and broadcasting ------------------------------------------------------------


@pytest.mark.parametrize(
    "op,fn",
    [
        ("add", np.add),
        ("subtract", np.subtract),
        ("multiply", np.multiply),
        ("divide", np.divide),
        ("maximum", np.maximum),
        ("minimum", np.minimum),
        ("power", np.power),
    ],
)
def test_binary_broadcasting(op, fn):
    rng = np.random.default_rng(1234)
    a = np.abs(f32(rng, 2, 1, 4)) + 0.5
    b = f32(rng, 3, 1)
    np.testing.assert_allclose(relay.op(f"{op}(%i0, %i1)", a, b), fn(a, b), rtol=2e-6)


def test_broadcast_becomes_reshape_and_broadcast():
    """Implicit broadcasting is explicit in the IR: size-1 dimensions that expand are reshaped
    away, then one broadcast places the rest."""
    a, b = np.zeros((8, 1, 1), np.float32), np.zeros((2, 1, 5, 5), np.float32)
    m = relay.load(relay.program("add(%i0, %i1)", a, b))
    ops = [n.op for n in m.entry.post_order()]
    assert ops.count("broadcast") == 2 and "reshape" in ops
    bcast = [n for n in m.entry.post_order() if n.op == "broadcast"]
    assert sorted(n.attrs["dimensions"] for n in bcast) == [(0, 2, 3), (1,)]
    assert all(n.shape == (2, 8, 5, 5) for n in bcast)
    with pytest.raises(NxsatError, match="do not broadcast") as e:
        relay.op("add(%i0, %i1)", np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32))
    assert e.value.code == "NCC_EVRF064"


def test_dtype_mismatch_is_an_error_at_the_binding():
    text = (
        '#[version = "0.0.5"]\ndef @main(%x: Tensor[(2), float32], %y: Tensor[(2), int32]) {\n'
        "  %0 = add(%x, %y);\n  %0\n}\n"
    )
    with pytest.raises(NxsatError) as e:
        relay.load(text)
    assert e.value.code == "NCC_EVRF064" and (e.value.loc.line, e.value.loc.column) == (3, 8)
    assert "float32" in e.value.message and "int32" in e.value.message


@pytest.mark.parametrize(
    "op,fn",
    [
        ("exp", np.exp),
        ("log", np.log),
        ("sqrt", np.sqrt),
        ("rsqrt", lambda x: 1 / np.sqrt(x)),
        ("tanh", np.tanh),
        ("erf", scipy.special.erf),
        ("sigmoid", lambda x: 1 / (1 + np.exp(-x))),
        ("negative", np.negative),
        ("abs", np.abs),
        ("floor", np.floor),
        ("ceil", np.ceil),
        ("round", lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5)),
        ("trunc", np.trunc),
        ("log2", np.log2),
        ("log10", np.log10),
        ("fast_exp", np.exp),
        ("fast_tanh", np.tanh),
    ],
)
def test_unary(op, fn):
    rng = np.random.default_rng(1234)
    x = np.abs(f32(rng, 3, 4)) * 3 + 0.1
    x[0] = [-2.5, -0.5, 0.5, 2.5]
    if op in ("log", "sqrt", "rsqrt", "log2", "log10"):
        x = np.abs(x) + 0.1
    np.testing.assert_allclose(
        relay.op(f"{op}(%i0)", x), fn(x.astype(np.float64)).astype(np.float32), rtol=2e-6, atol=1e-7
    )


def test_registry_spellings():
    """Relay names the registry declares 1:1 (sin, mod, bitwise_*, ...) lower to their operator."""
    rng = np.random.default_rng(1234)
    x = f32(rng, 2, 3)
    for op, fn in [("sin", np.sin), ("cos", np.cos), ("tan", np.tan), ("sign", np.sign)]:
        np.testing.assert_allclose(relay.op(f"{op}(%i0)", x), fn(x), rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(relay.op("mod(%i0, %i1)", x, np.float32(0.7)), np.fmod(x, np.float32(0.7)), rtol=1e-6)
    a, b = np.array([12, -7, 5], np.int32), np.array([10, 3, 1], np.int32)
    for op, fn in [
        ("bitwise_and", np.bitwise_and),
        ("bitwise_or", np.bitwise_or),
        ("bitwise_xor", np.bitwise_xor),
        ("left_shift", np.left_shift),
        ("mod", np.fmod),
    ]:
        np.testing.assert_array_equal(relay.op(f"{op}(%i0, %i1)", a, b), fn(a, b))
    np.testing.assert_array_equal(relay.op("bitwise_not(%i0)", a), ~a)
    p, q = a > 0, b > 2
    for op, fn in [
        ("logical_and", np.logical_and),
        ("logical_or", np.logical_or),
        ("logical_xor", np.logical_xor),
    ]:
        np.testing.assert_array_equal(relay.op(f"{op}(%i0, %i1)", p, q), fn(p, q))
    with pytest.raises(NxsatError) as e:
        relay.op("TupleGetItem(%i0)", x)
    assert e.value.code == "NCC_EUOC002"


def test_compare_logic_where():
    rng = np.random.default_rng(1234)
    a, b = f32(rng, 3, 4), f32(rng, 4)
    for op, fn in [
        ("equal", np.equal),
        ("not_equal", np.not_equal),
        ("less", np.less),
        ("less_equal", np.less_equal),
        ("greater", np.greater),
        ("greater_equal", np.greater_equal),
    ]:
        np.testing.assert_array_equal(relay.op(f"{op}(%i0, %i1)", a, b), fn(a, b))
    c = a > 0
    np.testing.assert_array_equal(relay.op("where(%i0, %i1, %i2)", c, a, b), np.where(c, a, b))
    np.testing.assert_array_equal(relay.op("logical_and(%i0, logical_not(%i1))", c, b > 0), c & ~(b > 0))
    np.testing.assert_array_equal(relay.op("where(%i0, %i1, 0f)", c, a), np.where(c, a, 0))
    x = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(relay.op("isnan(%i0)", x), np.isnan(x))
    np.testing.assert_array_equal(relay.op("isinf(%i0)", x), np.isinf(x))
    np.testing.assert_array_equal(relay.op("isfinite(%i0)", x), np.isfinite(x))


def test_integer_division_forms():
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    np.testing.assert_array_equal(relay.op("floor_divide(%i0, %i1)", a, b), a // b)
    np.testing.assert_array_equal(relay.op("floor_mod(%i0, %i1)", a, b), np.mod(a, b))
    np.testing.assert_array_equal(relay.op("trunc_divide(%i0, %i1)", a, b), np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(relay.op("trunc_mod(%i0, %i1)", a, b), np.fmod(a, b))
    np.testing.assert_array_equal(relay.op("divide(%i0, %i1)", a, b), np.trunc(a / b).astype(np.int32))
    x, y = np.array([7.5, -7.5], np.float32), np.array([2.0, 2.0], np.float32)
    np.testing.assert_array_equal(relay.op("floor_mod(%i0, %i1)", x, y), np.mod(x, y))
    u = np.array([200, 16], np.uint8)
    np.testing.assert_array_equal(relay.op("right_shift(%i0, %i1)", u, np.array([3, 1], np.uint8)), u >> [3, 1])
    s = np.array([-16, 16], np.int32)
    np.testing.assert_array_equal(relay.op("right_shift(%i0, 2)", s), s >> 2)


def test_cast_clip():
    x = np.array([-3.7, -0.2, 0.6, 2.5, 9.9], np.float32)
    np.testing.assert_array_equal(relay.op('cast(%i0, dtype="int32")', x), np.trunc(x).astype(np.int32))
    np.testing.assert_array_equal(relay.op("clip(%i0, a_min=-1f, a_max=2f)", x), np.clip(x, -1, 2))
    i = np.array([-5, 0, 5, 300], np.int32)
    np.testing.assert_array_equal(relay.op("clip(%i0, a_min=-1.5f, a_max=4.5f)", i), np.clip(i, -1, 4))
    np.testing.assert_array_equal(relay.op("cast_like(%i0, %i1)", x, i), np.trunc(x).astype(np.int32))
    bits = relay.op('reinterpret(%i0, dtype="int32")', x)
    np.testing.assert_array_equal(bits, x.view(np.int32))


# --- shapes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,newshape,want",
    [
        ((2, 3, 4), [-1, 4], (6, 4)),
        ((2, 3, 4), [0, -1], (2, 12)),
        ((2, 3, 4), [4, 0, 2], (4, 3, 2)),
        ((2, 3, 4), [-2], (2, 3, 4)),
        ((2, 3, 4, 5), [0, -2], (2, 3, 4, 5)),
        ((2, 3, 4), [-3, 4], (6, 4)),
        ((2, 3, 4), [2, -3], (2, 12)),
        ((2, 12, 5), [0, -4, 3, -1, 5], (2, 3, 4, 5)),
        ((2, 12, 5), [0, -4, -1, 6, 0], (2, 2, 6, 5)),
        ((1, 2048, 1, 1), [0, -1], (1, 2048)),
        ((2, 3, 4), [-1, 0, 2], (4, 3, 2)),
        ((3, 0), [-1, 0], (3, 0)),
        ((0, 3, 4), [0, -1], (0, 12)),
    ],
)
def test_reshape_special_values(shape, newshape, want):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal(shape).astype(np.float32)
    got = relay.op(f"reshape(%i0, newshape={newshape})", x)
    assert got.shape == want
    np.testing.assert_array_equal(got, x.reshape(want))


def test_reshape_errors():
    x = np.zeros((2, 3, 4), np.float32)
    for newshape in ([-1, -1], [5, -1], [7], [0, 0, 0, 0]):
        with pytest.raises(NxsatError) as e:
            relay.op(f"reshape(%i0, newshape={newshape})", x)
        assert e.value.code == "NCC_EVRF064", newshape
    with pytest.raises(NxsatError) as e:
        relay.op("reshape(%i0, newshape=[-7])", x)
    assert e.value.code == "NCC_EPRS003"


def test_reverse_reshape():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((10, 5, 4)).astype(np.float32)
    # Special values are resolved from the right: (10, 5, 4) with [-1, 0] is (50, 4).
    got = relay.op("reverse_reshape(%i0, newshape=[-1, 0])", x)
    np.testing.assert_array_equal(got, x.reshape(50, 4))
    y = rng.standard_normal((2, 3, 4)).astype(np.float32)
    # reshape [0, -1] copies the first dimension (2, 12); reverse_reshape copies the last: (3, 8).
    np.testing.assert_array_equal(relay.op("reverse_reshape(%i0, newshape=[0, -1])", y), y.reshape(3, 8))


def test_transpose_squeeze_expand():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 1, 3, 1)).astype(np.float32)
    np.testing.assert_array_equal(relay.op("transpose(%i0, axes=[2, 0, 3, 1])", x), x.transpose(2, 0, 3, 1))
    np.testing.assert_array_equal(relay.op("transpose(%i0)", x), x.transpose())
    np.testing.assert_array_equal(relay.op("transpose(%i0, axes=[-1, 0, 1, 2])", x), x.transpose(3, 0, 1, 2))
    np.testing.assert_array_equal(relay.op("squeeze(%i0)", x), x.reshape(2, 3))
    np.testing.assert_array_equal(relay.op("squeeze(%i0, axis=[-1])", x), x.reshape(2, 1, 3))
    np.testing.assert_array_equal(relay.op("expand_dims(%i0, axis=-1, num_newaxis=2)", x), x[..., None, None])
    np.testing.assert_array_equal(relay.op("expand_dims(%i0, axis=1)", x), x[:, None])
    with pytest.raises(NxsatError, match="size 3"):
        relay.op("squeeze(%i0, axis=[2])", x)


def test_concatenate_stack_split():
    rng = np.random.default_rng(1234)
    a, b = f32(rng, 2, 3), f32(rng, 2, 5)
    np.testing.assert_array_equal(relay.op("concatenate((%i0, %i1), axis=-1)", a, b), np.concatenate([a, b], -1))
    np.testing.assert_array_equal(relay.op("%0 = (%i0, %i0);\n  stack(%0, axis=1)", a), np.stack([a, a], 1))
    x = f32(rng, 2, 9)
    parts = relay.op("split(%i0, indices_or_sections=3, axis=1)", x)
    for p, w in zip(parts, np.split(x, 3, axis=1)):
        np.testing.assert_array_equal(p, w)
    parts = relay.op("split(%i0, indices_or_sections=[2, 7], axis=-1)", x)
    assert [p.shape for p in parts] == [(2, 2), (2, 5), (2, 2)]
    np.testing.assert_array_equal(
        relay.op("%0 = split(%i0, indices_or_sections=[2, 7], axis=1);\n  %0.1", x), x[:, 2:7]
    )
    with pytest.raises(NxsatError, match="divide"):
        relay.op("split(%i0, indices_or_sections=4, axis=1)", x)


@pytest.mark.parametrize(
    "args,index",
    [
        ("begin=[1, 0], end=[3, 4]", np.s_[1:3, 0:4]),
        ("begin=[0, 1], end=[4, 5], strides=[2, 2]", np.s_[0:4:2, 1:5:2]),
        ("begin=[-2], end=[4]", np.s_[-2:4]),
        ("begin=[3, 4], end=[0, 0], strides=[-1, -2]", np.s_[3:0:-1, 4:0:-2]),
        ("begin=[-1], end=[-5], strides=[-1]", np.s_[-1:-5:-1]),
        ("begin=[1], end=[100]", np.s_[1:100]),
        ('begin=[1, 2], end=[2, -1], slice_mode="size"', np.s_[1:3, 2:]),
        ("begin=[1], end=[3], axes=[1]", np.s_[:, 1:3]),
        # Without axes TVM pads strides with 1 (not the first stride) and begin/end with the
        # whole extent, up to the rank.
        ("begin=[0, 0], end=[4, 5], strides=[2]", np.s_[0:4:2, 0:5]),
        ("begin=[1], end=[3], strides=[1, 2]", np.s_[1:3, 0:6:2]),
        ("begin=[0, 1], end=[2]", np.s_[0:2, 1:6]),
        ("begin=[None, 1], end=[3, None]", np.s_[0:3, 1:6]),
        # A negative stride with no end stops before index 0 (TVM's end 0, exclusive).
        ("begin=[None], end=[None], strides=[-1]", np.s_[:0:-1]),
        ('begin=[-3], end=[2], slice_mode="size"', np.s_[1:3]),
        ("begin=[1, 0], end=[3, 4], strides=[1, 2], axes=[1, 0]", np.s_[0:4:2, 1:3]),
        ("begin=[1i64, 1i64], end=[3i64, 4i64], strides=[1i64], axes=None", np.s_[1:3, 1:4]),
    ],
)
def test_strided_slice(args, index):
    rng = np.random.default_rng(1234)
    x = f32(rng, 4, 6)
    np.testing.assert_array_equal(relay.op(f"strided_slice(%i0, {args})", x), x[index])


def test_strided_slice_rejects_backwards_range():
    with pytest.raises(NxsatError) as e:
        relay.op("strided_slice(%i0, begin=[3], end=[1])", np.zeros(5, np.float32))
    assert e.value.code == "NCC_EVRF064"


@pytest.mark.parametrize(
    "args,words",
    [
        ("begin=[0, 0], end=[2, 2], strides=[1], axes=[0, 1]", "one value for each of the 2 axes"),
        ("begin=[0], end=[2, 2], axes=[1]", "one value for each of the 1 axes"),
        ("begin=[0], end=[2], strides=[0]", "stride of 0"),
        ("begin=[0, 0], end=[2, 2], axes=[1, -1]", "repeated axis"),
        ('begin=[0], end=["x"]', "list of integers (or None)"),
    ],
)
def test_strided_slice_errors(args, words):
    with pytest.raises(NxsatError, match=re.escape(words)) as e:
        relay.op(f"strided_slice(%i0, {args})", np.zeros((4, 6), np.float32))
    assert e.value.code in ("NCC_EVRF064", "NCC_EPRS003")


def test_tile_repeat_reverse_broadcast_to():
    rng = np.random.default_rng(1234)
    x = f32(rng, 2, 3)
    np.testing.assert_array_equal(relay.op("tile(%i0, reps=[2, 1, 3])", x), np.tile(x, (2, 1, 3)))
    np.testing.assert_array_equal(relay.op("repeat(%i0, repeats=3, axis=1)", x), np.repeat(x, 3, 1))
    np.testing.assert_array_equal(relay.op("reverse(%i0, axis=-1)", x), x[:, ::-1])
    np.testing.assert_array_equal(relay.op("broadcast_to(%i0, shape=[4, 2, 3])", x), np.broadcast_to(x, (4, 2, 3)))
    np.testing.assert_array_equal(relay.op('layout_transform(%i0, src_layout="NC", dst_layout="CN")', x), x.T)
    with pytest.raises(NxsatError):
        relay.op("broadcast_to(%i0, shape=[2, 4])", x)


# --- reductions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op,fn", [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min), ("prod", np.prod)]
)
@pytest.mark.parametrize(
    "attrs,axis,keep",
    [
        ("", None, False),
        ("axis=[1]", (1,), False),
        ("axis=[-1], keepdims=True", (2,), True),
        ("axis=[0, 2]", (0, 2), False),
        ("axis=[1], exclude=True", (0, 2), False),
        ("axis=[1], exclude=True, keepdims=True", (0, 2), True),
    ],
)
def test_reductions(op, fn, attrs, axis, keep):
    rng = np.random.default_rng(1234)
    x = f32(rng, 2, 3, 4)
    got = relay.op(f"{op}(%i0{', ' + attrs if attrs else ''})", x)
    want = fn(x.astype(np.float64), axis=axis, keepdims=keep)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_variance():
    rng = np.random.default_rng(1234)
    x = f32(rng, 3, 4, 5)
    np.testing.assert_allclose(relay.op("variance(%i0, axis=[1])", x), x.var(1), rtol=1e-5)
    np.testing.assert_allclose(
        relay.op("variance(%i0, axis=[1], exclude=True, keepdims=True, unbiased=True)", x),
        x.var((0, 2), keepdims=True, ddof=1),
        rtol=1e-5,
    )
    # Relay's IR form takes the mean as a second argument.
    np.testing.assert_allclose(
        relay.op("%0 = mean(%i0, axis=[2], keepdims=True);\n  variance(%i0, %0, axis=[2])", x),
        x.var(2),
        rtol=1e-5,
    )


def test_all_any():
    rng = np.random.default_rng(1234)
    b = f32(rng, 3, 4) > 0
    np.testing.assert_array_equal(relay.op("all(%i0, axis=[1])", b), b.all(1))
    np.testing.assert_array_equal(relay.op("any(%i0, axis=[0], keepdims=True)", b), b.any(0, keepdims=True))


def test_argmax_argmin():
    x = np.array([[1, 5, 5, 2], [7, 0, 7, -1], [3, 3, 3, 3]], np.float32)
    np.testing.assert_array_equal(relay.op("argmax(%i0, axis=[1])", x), [1, 0, 0])
    np.testing.assert_array_equal(relay.op("argmax(%i0, axis=[1], select_last_index=True)", x), [2, 2, 3])
    np.testing.assert_array_equal(relay.op("argmin(%i0, axis=[0], keepdims=True)", x), [[0, 1, 2, 1]])
    np.testing.assert_array_equal(relay.op("argmax(%i0)", x), np.argmax(x))
    assert relay.op("argmax(%i0, axis=[1])", x).dtype == np.int32


# --- indexing and creation -------------------------------------------------------------------


def test_take():
    rng = np.random.default_rng(1234)
    data = f32(rng, 5, 3, 2)
    idx = np.array([[4, 0], [2, 2]], np.int32)
    np.testing.assert_array_equal(relay.op("take(%i0, %i1, axis=0)", data, idx), np.take(data, idx, axis=0))
    np.testing.assert_array_equal(relay.op("take(%i0, %i1, axis=1)", data, idx % 3), np.take(data, idx % 3, axis=1))
    np.testing.assert_array_equal(relay.op("take(%i0, %i1)", data, idx * 7), np.take(data, idx * 7))
    wild = np.array([-1, 7, 2], np.int64)
    np.testing.assert_array_equal(relay.op("take(%i0, %i1, axis=0)", data, wild), np.take(data, wild, 0, mode="clip"))
    np.testing.assert_array_equal(
        relay.op('take(%i0, %i1, axis=0, mode="wrap")', data, wild), np.take(data, wild, 0, mode="wrap")
    )
    with pytest.raises(NxsatError):
        relay.op("take(%i0, %i1)", data, idx.astype(np.float32))


def test_one_hot():
    idx = np.array([[0, 2], [3, 1]], np.int32)
    got = relay.op('one_hot(%i0, 5f, -1f, depth=4, axis=-1, dtype="float32")', idx)
    np.testing.assert_array_equal(got, np.where(np.eye(4)[idx] > 0, 5, -1))
    got = relay.op('one_hot(%i0, 1, 0, depth=4, axis=0, dtype="int32")', idx)
    np.testing.assert_array_equal(got, np.moveaxis(np.eye(4, dtype=np.int32)[idx], -1, 0))


def test_creation():
    rng = np.random.default_rng(1234)
    x = f32(rng, 2, 3)
    np.testing.assert_array_equal(relay.op("zeros_like(%i0)", x), np.zeros_like(x))
    np.testing.assert_array_equal(relay.op("ones_like(%i0)", x), np.ones_like(x))
    np.testing.assert_array_equal(relay.op("full_like(%i0, 2.5f)", x), np.full_like(x, 2.5))
    np.testing.assert_array_equal(relay.op('add(%i0, zeros(shape=[2, 3], dtype="float32"))', x), x)
    got = relay.op('full(3i64, shape=[2], dtype="int64")', x)
    assert got.dtype == np.int64 and got.tolist() == [3, 3]
    got = relay.op('ones(shape=[1, 2], dtype="int8")', x)
    assert got.dtype == np.int8 and got.tolist() == [[1, 1]]
    np.testing.assert_allclose(relay.op('arange(1f, 2f, 0.25f, dtype="float32")', x), np.arange(1, 2, 0.25))
    np.testing.assert_array_equal(relay.op('arange(5, dtype="int32")', x), np.arange(5))
    np.testing.assert_array_equal(relay.op("shape_of(%i0)", x), [2, 3])

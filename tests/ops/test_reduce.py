"""reduce, reduce-window and select-and-scatter against independent numpy / loop references."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nxsat import dtypes as dt
from nxsat.attrs import WindowDim
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module
from nxsat.ops import get

RNG = np.random.default_rng(1234)


# --- graph helpers ---------------------------------------------------------------------------

def binop(op: str, d: dt.DType):
    b = Builder(f"{op}_{d.name}")
    x, y = b.param(d, ()), b.param(d, ())
    return b.build(b.op(op, [x, y]))


def slow_add(d: dt.DType):
    """x - (-y): an add the fast path does not recognise, so it runs the body pairwise."""
    b = Builder(f"slow_add_{d.name}")
    x, y = b.param(d, ()), b.param(d, ())
    return b.build(b.op("subtract", [x, b.op("negate", [y])]))


def slow_max(d: dt.DType):
    b = Builder(f"slow_max_{d.name}")
    x, y = b.param(d, ()), b.param(d, ())
    return b.build(b.op("select", [b.op("compare", [x, y], direction="GE"), x, y]))


def argmax_body(vd: dt.DType, idd: dt.DType = dt.S32):
    """JAX's argmax reducer: the larger value (NaN wins), ties to the lower index."""
    b = Builder("argmax")
    v0, i0, v1, i1 = b.param(vd, ()), b.param(idd, ()), b.param(vd, ()), b.param(idd, ())
    gt = b.op("compare", [v0, v1], direction="GT")
    nan0 = b.op("compare", [v0, v0], direction="NE")
    eq = b.op("compare", [v0, v1], direction="EQ")
    lower = b.op("compare", [i0, i1], direction="LT")
    pick0 = b.op("or", [b.op("or", [gt, nan0]), b.op("and", [eq, lower])])
    return b.build([b.op("select", [pick0, v0, v1]), b.op("select", [pick0, i0, i1])])


def run(build, inputs):
    """``build(builder, params) -> root``; params typed after the inputs."""
    b = Builder("main")
    ps = [b.param(dt.from_numpy(x.dtype), x.shape) for x in inputs]
    return run_module(b.module(build(b, ps)), inputs)


def reduce(x, init, dims, body, init_dtype=None):
    def build(b, ps):
        c = b.constant(init, init_dtype or dt.from_numpy(x.dtype))
        return b.op("reduce", [ps[0], c], dimensions=tuple(dims), to_apply=body)

    return run(build, [x])[0]


def rand(shape, d: dt.DType, lo=-4, hi=5):
    if d is dt.PRED:
        return RNG.integers(0, 2, shape).astype(bool)
    if d.is_float:
        return dt.cast(RNG.standard_normal(shape) * 3, d)
    return RNG.integers(lo, hi, shape).astype(d.np)


def expect_code(code, fn):
    with pytest.raises(NxsatError) as exc:
        fn()
    assert exc.value.code == code, exc.value
    return exc.value.message


# --- reduce ----------------------------------------------------------------------------------

CASES = [
    ("add", dt.F32, 0.0, lambda x, a: np.sum(x.astype(np.float64), axis=a)),
    ("multiply", dt.S32, 1, lambda x, a: np.prod(x.astype(np.int64), axis=a)),
    ("maximum", dt.F32, -np.inf, lambda x, a: np.max(x, axis=a)),
    ("minimum", dt.S32, np.iinfo(np.int32).max, lambda x, a: np.min(x, axis=a)),
    ("and", dt.PRED, True, lambda x, a: np.all(x, axis=a)),
    ("or", dt.S32, 0, lambda x, a: np.bitwise_or.reduce(x, axis=a)),
    ("xor", dt.U8, 0, lambda x, a: np.bitwise_xor.reduce(x, axis=a)),
    ("maximum", dt.BF16, -np.inf, lambda x, a: np.max(x.astype(np.float32), axis=a)),
]


@pytest.mark.parametrize("op,d,init,ref", CASES, ids=[f"{c[0]}-{c[1].name}" for c in CASES])
@pytest.mark.parametrize("dims", [(1,), (0, 2), (), (0, 1, 2)])
@pytest.mark.parametrize("fast", [True, False])
def test_reduce_matches_numpy(op, d, init, ref, dims, fast):
    x = rand((3, 5, 4), d)
    body = binop(op, d)
    if not fast:  # the same operator, evaluated pairwise through the interpreter
        b = Builder("wrapped")
        p, q = b.param(d, ()), b.param(d, ())
        body = b.build(b.op("select", [b.constant(True), b.op(op, [p, q]), b.op(op, [q, p])]))
    got = reduce(x, init, dims, body)
    want = dt.cast(np.asarray(ref(x, dims)), d)
    assert got.dtype == d.np and got.shape == want.shape
    if d.is_float:
        # fp32 summation order differs from the fp64 reference: allow for cancellation
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6,
                                   atol=1e-6 * float(np.abs(x.astype(np.float64)).sum()))
    else:
        np.testing.assert_array_equal(got, want)


def test_reduce_includes_init_once():
    x = rand((4, 6), dt.S32)
    for body in (binop("add", dt.S32), slow_add(dt.S32)):
        got = reduce(x, 100, (0, 1), body)
        assert got == x.sum() + 100
        got = reduce(x, 7, (1,), body)
        np.testing.assert_array_equal(got, x.sum(axis=1) + 7)


def test_reduce_bf16_accumulates_in_fp32_and_rounds_once():
    # 1024 ones: a bf16 accumulator sticks at 256 (256 + 1 rounds back to 256).
    x = np.ones(1024, dtype=ml_dtypes.bfloat16)
    assert float(reduce(x, 0.0, (0,), binop("add", dt.BF16))) == 1024.0
    # Values whose fp32 sum differs from any bf16 running sum.
    y = dt.cast(RNG.uniform(0, 1, 4096), dt.BF16)
    got = reduce(y, 0.0, (0,), binop("add", dt.BF16))
    want = dt.cast(np.asarray(y.astype(np.float64).sum()), dt.BF16)
    assert abs(float(got) - float(want)) <= abs(float(want)) * 2 ** -8


def test_reduce_converts_inputs_to_the_body_type():
    # f32 inputs, bf16 body: XLA rounds each input to bf16 first, so 1 + 2^-8 - 2^-20 becomes 1.
    x = np.array([1 + 2.0 ** -8 - 2.0 ** -20, -1.0], np.float32)
    for body in (binop("add", dt.BF16), slow_add(dt.BF16)):
        got = reduce(x, 0.0, (0,), body, init_dtype=dt.BF16)
        assert got.dtype == dt.BF16.np and float(got) == 0.0


def test_reduce_wraps_integers():
    x = np.full(10, 2 ** 30, dtype=np.int32)
    assert int(reduce(x, 0, (0,), binop("add", dt.S32))) == np.int32(np.int64(10 * 2 ** 30) - 2 ** 33)
    assert int(reduce(x, 0, (0,), slow_add(dt.S32))) == np.int32(np.int64(10 * 2 ** 30) - 2 ** 33)


def test_reduce_over_empty_dimension_gives_init():
    x = np.zeros((3, 0), np.float32)
    for body in (binop("maximum", dt.F32), slow_max(dt.F32)):
        np.testing.assert_array_equal(reduce(x, -5.0, (1,), body), np.full(3, -5.0, np.float32))


def test_reduce_nan_propagates_through_max():
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 3.0]], np.float32)
    got = reduce(x, -np.inf, (1,), binop("maximum", dt.F32))
    assert np.isnan(got[0]) and got[1] == 3.0


@pytest.mark.parametrize("n", [1, 2, 7, 64, 101])
def test_variadic_argmax(n):
    vals = RNG.integers(0, 4, (5, n)).astype(np.float32)  # many ties
    vals[1, n // 2] = np.nan
    if n > 2:
        vals[2, [1, n - 1]] = np.nan
    idx = np.broadcast_to(np.arange(n, dtype=np.int32), vals.shape).copy()

    def build(b, ps):
        return b.op("reduce", [ps[0], ps[1], b.constant(np.float32(-np.inf)), b.constant(np.int32(0))],
                    dimensions=(1,), to_apply=argmax_body(dt.F32))

    got_v, got_i = run(build, [vals, idx])
    np.testing.assert_array_equal(got_i, np.argmax(vals, axis=1))
    np.testing.assert_array_equal(got_v, np.max(vals, axis=1))


def test_variadic_sum_and_max_over_two_dims():
    b = Builder("summax")
    a0, m0, a1, m1 = (b.param(dt.S32, ()) for _ in range(4))
    body = b.build([b.op("add", [a0, a1]), b.op("maximum", [m0, m1])])
    x, y = rand((4, 3, 5), dt.S32), rand((4, 3, 5), dt.S32)

    def build(bb, ps):
        return bb.op("reduce", [ps[0], ps[1], bb.constant(np.int32(0)), bb.constant(np.int32(-100))],
                     dimensions=(0, 2), to_apply=body)

    s, m = run(build, [x, y])
    np.testing.assert_array_equal(s, x.sum(axis=(0, 2)))
    np.testing.assert_array_equal(m, y.max(axis=(0, 2)))


def test_mixed_precision_body_sees_every_input_as_an_input():
    b = Builder("acc32")
    acc, v = b.param(dt.F32, ()), b.param(dt.BF16, ())
    body = b.build(b.op("add", [acc, b.op("convert", [v], dtype=dt.F32)]))
    x = dt.cast(RNG.standard_normal((3, 300)), dt.BF16)
    got = reduce(x, 0.0, (1,), body, init_dtype=dt.F32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=1), rtol=1e-5)


def test_reduce_body_on_arrays_is_refused_with_a_code():
    b = Builder("vector_body")
    p, q = b.param(dt.F32, ()), b.param(dt.F32, ())
    pair = b.op("broadcast", [p], shape=(2,), dimensions=())
    total = b.op("reduce", [pair, q], dimensions=(0,), to_apply=binop("add", dt.F32))
    body = b.build(b.op("add", [total, q]))
    x = rand((3, 4), dt.F32)
    msg = expect_code("NCC_EUOC002", lambda: reduce(x, 0.0, (1,), body))
    assert "only scalar computations are supported" in msg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=3), data=st.data())
def test_reduce_property(shape, data):
    dims = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1)))))
    x = rand(tuple(shape), dt.S32)
    want = x.sum(axis=dims, dtype=np.int64).astype(np.int32) + 3
    for body in (binop("add", dt.S32), slow_add(dt.S32)):
        np.testing.assert_array_equal(reduce(x, 3, dims, body), want)


def _reduce_node(x_types, init_types, body, dims):
    b = Builder("bad")
    ps = [b.param(t[0], t[1]) for t in x_types]
    cs = [b.param(t, ()) for t in init_types]
    return b.op("reduce", ps + cs, dimensions=dims, to_apply=body)


@pytest.mark.parametrize("make,needle", [
    (lambda: _reduce_node([(dt.F32, (2, 3))], [], binop("add", dt.F32), (0,)), "takes 2 to any operands"),
    (lambda: _reduce_node([(dt.F32, (2, 3))] * 2, [dt.F32], binop("add", dt.F32), (0,)),
     "N inputs followed by N init values, got 3"),
    (lambda: _reduce_node([(dt.F32, (2, 3))], [dt.F32], binop("add", dt.F32), (2,)), "out of range"),
    (lambda: _reduce_node([(dt.F32, (2, 3))], [dt.F32], binop("add", dt.F32), (1, 1)), "repeated"),
    (lambda: _reduce_node([(dt.F32, (2, 3))], [dt.S32], binop("add", dt.F32), (0,)), "init value 0"),
    (lambda: _reduce_node([(dt.S32, (2, 3))], [dt.F32], binop("add", dt.F32), (0,)),
     "input 0 has element type s32"),
    (lambda: _reduce_node([(dt.F32, (2, 3)), (dt.S32, (3, 2))], [dt.F32, dt.S32], argmax_body(dt.F32), (0,)),
     "one shape"),
    (lambda: _reduce_node([(dt.F32, (2, 3)), (dt.S32, (2, 3))], [dt.F32, dt.S32], binop("add", dt.F32), (0,)),
     "must take 4 parameters"),
    (lambda: _reduce_node([(dt.F32, (2, 3))], [dt.F32], argmax_body(dt.F32), (0,)), "must take 2 parameters"),
])
def test_reduce_shape_errors(make, needle):
    assert needle in expect_code("NCC_EVRF064", make)


def test_reduce_result_types():
    n = _reduce_node([(dt.F32, (2, 3, 4)), (dt.S32, (2, 3, 4))], [dt.F32, dt.S32], argmax_body(dt.F32), (1,))
    assert str(n.type) == "(f32[2,4], s32[2,4])"
    assert str(_reduce_node([(dt.BF16, (2, 3))], [dt.BF16], binop("add", dt.BF16), (0, 1)).type) == "bf16[]"


# --- reduce-window ---------------------------------------------------------------------------

def ref_reduce_window(xs, inits, window, fn):
    """Loop reference: XLA's window semantics written out index by index (padding and dilation
    holes are skipped); ``fn(accs, values) -> accs`` on Python scalars."""
    x0 = xs[0]
    out_shape = []
    for n, w in zip(x0.shape, window):
        base = 0 if n == 0 else (n - 1) * w.lhs_dilation + 1
        span = (w.size - 1) * w.rhs_dilation + 1
        padded = base + w.pad_lo + w.pad_hi
        out_shape.append(0 if padded < span else (padded - span) // w.stride + 1)
    outs = [np.empty(out_shape, dtype=object) for _ in xs]
    for o in itertools.product(*map(range, out_shape)):
        accs = list(inits)
        for k in itertools.product(*(range(w.size) for w in window)):
            idx = []
            for oi, ki, w, n in zip(o, k, window, x0.shape):
                u = oi * w.stride + ki * w.rhs_dilation - w.pad_lo
                if u % w.lhs_dilation or not 0 <= u // w.lhs_dilation < n:
                    break
                idx.append(u // w.lhs_dilation)
            else:
                accs = fn(accs, [x[tuple(idx)] for x in xs])
        for out, a in zip(outs, accs):
            out[o] = a
    return outs


def reduce_window(xs, inits, window, body, init_dtypes=None):
    def build(b, ps):
        cs = [b.constant(v, d) for v, d in zip(inits, init_dtypes or [dt.from_numpy(x.dtype) for x in xs])]
        return b.op("reduce-window", ps + cs, window=tuple(window), to_apply=body)

    out = run(build, list(xs))
    return out


def W(size, stride=1, lo=0, hi=0, ld=1, rd=1):
    return WindowDim(size=size, stride=stride, pad_lo=lo, pad_hi=hi, lhs_dilation=ld, rhs_dilation=rd)


def test_cumsum_as_jax_writes_it():
    x = rand((3, 7), dt.F32)
    for body in (binop("add", dt.F32), slow_add(dt.F32)):
        (got,) = reduce_window([x], [0.0], [W(1), W(7, lo=6)], body)
        np.testing.assert_allclose(got, np.cumsum(x, axis=1), rtol=1e-6, atol=1e-6)
    # reverse cumsum: padding on the high side
    (got,) = reduce_window([x], [0.0], [W(1), W(7, hi=6)], binop("add", dt.F32))
    np.testing.assert_allclose(got, np.cumsum(x[:, ::-1], axis=1)[:, ::-1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("d", [dt.F32, dt.BF16, dt.S32])
def test_max_pool_nhwc(d):
    x = rand((2, 7, 6, 3), d)
    window = [W(1), W(3, 2, 1, 1), W(3, 2, 0, 1), W(1)]
    init = -np.inf if d.is_float else np.iinfo(np.int32).min
    for body in (binop("maximum", d), slow_max(d)):
        (got,) = reduce_window([x], [init], window, body)
        (want,) = ref_reduce_window([x.astype(np.float64)], [float(init)], window,
                                    lambda a, v: [max(a[0], v[0])])
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_avg_pool_sum_then_divide():
    x = rand((1, 2, 6, 6), dt.F32)  # NCHW, SAME padding: padded zeros count in the sum
    window = [W(1), W(1), W(3, 2, 1, 1), W(3, 2, 1, 1)]
    (got,) = reduce_window([x], [0.0], window, binop("add", dt.F32))
    (want,) = ref_reduce_window([x.astype(np.float64)], [0.0], window, lambda a, v: [a[0] + v[0]])
    np.testing.assert_allclose(got, want.astype(np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [
    [W(2, 1, 0, 0, ld=2), W(2, 2, 1, 1, rd=2)],
    [W(3, 2, -1, 2, ld=3), W(1, 1, -2, -1)],
    [W(4, 3, 2, 2, ld=2, rd=2), W(2, 1, 3, 0, rd=3)],
    [W(5), W(1, 5, 0, 4)],
])
def test_reduce_window_dilations_and_negative_padding(window):
    x = rand((5, 4), dt.S32)
    # init 1000 is not an identity: skipped positions must not be counted (XLA CPU skips them)
    for body in (binop("add", dt.S32), slow_add(dt.S32)):
        (got,) = reduce_window([x], [1000], window, body)
        (want,) = ref_reduce_window([x.astype(np.int64)], [1000], window, lambda a, v: [a[0] + v[0]])
        np.testing.assert_array_equal(got, want.astype(np.int64))


def test_variadic_reduce_window_argmax_pool():
    vals = RNG.integers(0, 5, (6, 5)).astype(np.float32)
    idx = np.arange(vals.size, dtype=np.int32).reshape(vals.shape)
    window = [W(3, 2, 1, 1), W(2, 1, 0, 1)]
    got_v, got_i = reduce_window([vals, idx], [-np.inf, 0], window, argmax_body(dt.F32),
                                 init_dtypes=[dt.F32, dt.S32])

    def pick(a, v):
        if v[0] > a[0] or (v[0] == a[0] and v[1] < a[1]):
            return list(v)
        return a

    want_v, want_i = ref_reduce_window([vals, idx], [-np.inf, 0], window, pick)
    np.testing.assert_array_equal(got_v, want_v.astype(np.float32))
    np.testing.assert_array_equal(got_i, want_i.astype(np.int32))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reduce_window_property(data):
    rank = data.draw(st.integers(1, 2))
    shape = tuple(data.draw(st.integers(0, 5)) for _ in range(rank))
    window = []
    for n in shape:
        w = W(data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.integers(-1, 2)),
              data.draw(st.integers(-1, 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
        base = 0 if n == 0 else (n - 1) * w.lhs_dilation + 1
        if base + w.pad_lo + w.pad_hi < 0:
            w = W(w.size, w.stride, 0, 0, w.lhs_dilation, w.rhs_dilation)
        window.append(w)
    x = rand(shape, dt.S32)
    (want,) = ref_reduce_window([x.astype(np.int64)], [-7], window, lambda a, v: [max(a[0], v[0])])
    for body in (binop("maximum", dt.S32), slow_max(dt.S32)):
        (got,) = reduce_window([x], [-7], window, body)
        np.testing.assert_array_equal(got, want.astype(np.int64).reshape(got.shape))


def _rw_node(shape, window, body=None):
    b = Builder("bad")
    return b.op("reduce-window", [b.param(dt.F32, shape), b.param(dt.F32, ())], window=tuple(window),
                to_apply=body or binop("add", dt.F32))


@pytest.mark.parametrize("make,needle", [
    (lambda: _rw_node((4, 4), [W(2)]), "window has 1 dimensions, the operand has 2"),
    (lambda: _rw_node((4,), [W(0)]), "non-positive size"),
    (lambda: _rw_node((4,), [W(2, 0)]), "non-positive stride"),
    (lambda: _rw_node((4,), [W(2, ld=0)]), "dilation below 1"),
    (lambda: _rw_node((4,), [WindowDim(2, reversal=True)]), "reversal"),
    (lambda: _rw_node((4,), [W(1, 1, -3, -2)]), "removes more"),
    (lambda: _rw_node((4,), [W(2)], binop("add", dt.S32)), "init value 0"),
])
def test_reduce_window_shape_errors(make, needle):
    assert needle in expect_code("NCC_EVRF064", make)


def test_absurd_windows_end_with_a_diagnostic():
    x = rand((4,), dt.S32)
    for body in (binop("add", dt.S32), slow_add(dt.S32)):
        msg = expect_code("NCC_EEXE001", lambda b=body: reduce_window([x], [0], [W(1, 1, 0, 10 ** 9)], b))
        assert "window elements" in msg


def test_reduce_window_output_shapes():
    assert _rw_node((1, 112, 112, 64), [W(1), W(3, 2, 0, 1), W(3, 2, 0, 1), W(1)]).shape == (1, 56, 56, 64)
    assert _rw_node((4,), [W(5)]).shape == (0,)
    assert _rw_node((3,), [W(2, 1, 0, 0, ld=2)]).shape == (4,)


# --- select-and-scatter ----------------------------------------------------------------------

def ref_select_and_scatter(operand, source, init, window, better):
    """Loop reference: for each window, the first in-bounds element in row-major window order,
    replaced whenever ``better(candidate, current)``; source values added into the picks."""
    out = np.full(operand.shape, init, dtype=np.float64)
    for o in itertools.product(*map(range, source.shape)):
        pick = None
        for k in itertools.product(*(range(w.size) for w in window)):
            idx = tuple(oi * w.stride + ki * w.rhs_dilation - w.pad_lo for oi, ki, w in zip(o, k, window))
            if not all(0 <= i < n for i, n in zip(idx, operand.shape)):
                continue
            if pick is None or better(operand[idx], operand[pick]):
                pick = idx
        if pick is not None:
            out[pick] += float(source[o])
    return out


def select_and_scatter(operand, source, init, window, direction="GE"):
    d = dt.from_numpy(operand.dtype)
    b = Builder("select")
    p, q = b.param(d, ()), b.param(d, ())
    select = b.build(b.op("compare", [p, q], direction=direction))

    def build(bb, ps):
        return bb.op("select-and-scatter", [ps[0], ps[1], bb.constant(init, d)], window=tuple(window),
                     select=select, scatter=binop("add", d))

    return run(build, [operand, source])[0]


@pytest.mark.parametrize("d", [dt.F32, dt.S32, dt.BF16])
@pytest.mark.parametrize("window,direction", [
    ([W(1), W(2, 2), W(2, 2), W(1)], "GE"),  # max-pool gradient, no overlap
    ([W(1), W(3, 1, 1, 1), W(3, 1, 1, 1), W(1)], "GE"),  # overlapping windows, padding
    ([W(1), W(3, 2, 0, 1), W(2, 1, 1, 0), W(1)], "LE"),  # min-pool, uneven padding
])
def test_select_and_scatter_matches_loops(d, window, direction):
    operand = rand((2, 5, 4, 2), d, lo=0, hi=4)  # small integers: many ties
    if d.is_float:
        operand = dt.cast(np.round(operand.astype(np.float32)), d)
    shape = _rw_node(operand.shape, window).shape
    source = rand(shape, d, lo=1, hi=9)
    if d.is_float:  # small integers: every partial sum is exact, even in bf16
        source = dt.cast(np.round(source.astype(np.float32)), d)
    got = select_and_scatter(operand, source, 0, window, direction)
    ge = direction == "GE"
    # select(current, candidate) false replaces: with GE a strictly greater candidate wins.
    want = ref_select_and_scatter(operand.astype(np.float64), source.astype(np.float64), 0.0, window,
                                  (lambda c, cur: c > cur) if ge else (lambda c, cur: c < cur))
    assert got.dtype == d.np
    np.testing.assert_array_equal(got.astype(np.float64), want)


def test_select_and_scatter_init_fills_unselected():
    operand = np.arange(16, dtype=np.float32).reshape(4, 4)
    source = np.ones((2, 2), np.float32)
    got = select_and_scatter(operand, source, 0.5, [W(2, 2), W(2, 2)])
    want = np.full((4, 4), 0.5, np.float32)
    want[[1, 1, 3, 3], [1, 3, 1, 3]] = 1.5
    np.testing.assert_array_equal(got, want)


def test_select_and_scatter_shape_errors():
    b = Builder("bad")
    x, s, i = b.param(dt.F32, (4, 4)), b.param(dt.F32, (3, 3)), b.param(dt.F32, ())
    sel = binop("maximum", dt.F32)  # returns f32, not pred
    bb = Builder("ge")
    p, q = bb.param(dt.F32, ()), bb.param(dt.F32, ())
    ge = bb.build(bb.op("compare", [p, q], direction="GE"))
    msg = expect_code("NCC_EVRF064", lambda: b.op("select-and-scatter", [x, s, i], window=(W(2, 2), W(2, 2)),
                                                  select=ge, scatter=binop("add", dt.F32)))
    assert "source is f32[3,3]" in msg and "f32[2,2]" in msg
    msg = expect_code("NCC_EVRF064", lambda: b.op("select-and-scatter", [x, s, i], window=(W(2, 1), W(2, 1)),
                                                  select=sel, scatter=binop("add", dt.F32)))
    assert "must return pred[]" in msg


def test_registry_entries():
    for name, neuron in (("reduce", "Reduce"), ("reduce-window", "ReduceWindow"),
                         ("select-and-scatter", "SelectAndScatter")):
        opdef = get(name)
        assert opdef is not None and neuron in opdef.neuron and opdef.engine == "VectorE"
    n = _rw_node((1, 8, 8, 3), [W(1), W(3, 2, 1, 1), W(3, 2, 1, 1), W(1)])
    assert get("reduce-window").flops([p.type for p in n.operands], n.type, n.attrs) == math.prod(n.shape) * 9

"""sort (fast and general comparators) and topk against numpy's stable sorts, np.lexsort and
results observed on XLA CPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module
from nxsat.ir import Computation

RNG = np.random.default_rng(11)
NAN = np.float32(np.nan)
X9 = np.array([np.nan, 1, -0.0, 0.0, np.inf, -np.inf, -np.nan, 1, 0.0], np.float32)


# --- comparators -----------------------------------------------------------------------------

def simple(types: list[dt.DType], direction: str = "LT", kind: str | None = None,
           swap: bool = False) -> Computation:
    """compare(p0, p1) (or compare(p1, p0)): the fast path."""
    b = Builder("cmp")
    ps = [b.param(t, ()) for t in types for _ in range(2)]
    a, c = (ps[1], ps[0]) if swap else (ps[0], ps[1])
    return b.build(b.op("compare", [a, c], direction=direction, type=kind))


def jax_lexicographic(types: list[dt.DType], num_keys: int, descending: bool = False) -> Computation:
    """What JAX lowers lax.sort(..., num_keys) to: per key, -0 -> 0 and NaN -> NaN, then
    lt(k0) or (eq(k0) and (lt(k1) or ...)) with TOTALORDER compares (NaN last, -0 == 0)."""
    b = Builder("jax_cmp")
    ps = [b.param(t, ()) for t in types for _ in range(2)]

    def canon(p, t):
        if not t.is_float:
            return p
        zero = b.constant(np.asarray(0, t.np), t)
        nan = b.constant(np.asarray(np.nan, t.np), t)
        x = b.op("select", [b.op("compare", [p, zero], direction="EQ"), zero, p])
        return b.op("select", [b.op("compare", [p, p], direction="NE"), nan, x])

    result = None
    for k in reversed(range(num_keys)):
        t = types[k]
        x, y = canon(ps[2 * k], t), canon(ps[2 * k + 1], t)
        kind = "TOTALORDER" if t.is_float else None
        lt = b.op("compare", [x, y], direction="GT" if descending else "LT", type=kind)
        if result is None:
            result = lt
        else:
            eq = b.op("compare", [x, y], direction="EQ", type=kind)
            result = b.op("or", [lt, b.op("and", [eq, result])])
    return b.build(result)


def sort(operands: list[np.ndarray], comp: Computation, dimension: int = 0, stable: bool = True):
    b = Builder("s")
    ps = [b.param(dt.from_numpy(x.dtype), x.shape) for x in operands]
    n = b.op("sort", ps, dimension=dimension, is_stable=stable, to_apply=comp)
    return run_module(b.module(n), operands)


def sort_with_index(x: np.ndarray, comp: Computation, stable: bool = True) -> tuple[np.ndarray, np.ndarray]:
    vals, idx = sort([x, np.arange(len(x), dtype=np.int32)], comp, stable=stable)
    return vals, idx


# --- the fast path ---------------------------------------------------------------------------

@pytest.mark.parametrize("d", [np.float32, np.int32, np.uint8, np.int64, np.float64])
@pytest.mark.parametrize("direction", ["LT", "GT"])
def test_single_compare_is_a_stable_argsort(d, direction):
    x = RNG.integers(0, 6, (3, 40)).astype(d)  # many ties
    vals, idx = sort([x, np.broadcast_to(np.arange(40, dtype=np.int32), (3, 40)).copy()],
                     simple([dt.from_numpy(np.dtype(d)), dt.S32], direction), dimension=1)
    key = x.astype(np.float64)
    want = np.argsort(-key if direction == "GT" else key, axis=1, kind="stable")
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, want, axis=1))


def test_swapped_operands_reverse_the_direction():
    x = RNG.integers(0, 5, 30).astype(np.int32)
    _, idx = sort_with_index(x, simple([dt.S32, dt.S32], "LT", swap=True))
    np.testing.assert_array_equal(idx, np.argsort(-x, kind="stable"))


def test_total_order_places_nan_and_signed_zeros():
    # -NaN < -inf < ... < -0 < +0 < ... < inf < +NaN; equal values keep their order.
    vals, idx = sort_with_index(X9, simple([dt.F32, dt.S32], "LT", "TOTALORDER"))
    np.testing.assert_array_equal(idx, [6, 5, 2, 3, 8, 1, 7, 4, 0])
    vals, idx = sort_with_index(X9, simple([dt.F32, dt.S32], "GT", "TOTALORDER"))
    np.testing.assert_array_equal(idx, [0, 4, 1, 7, 3, 8, 2, 5, 6])
    assert np.signbit(vals[6]) and not np.signbit(vals[4])


def test_float_compare_treats_signed_zeros_as_equal():
    x = np.array([0.0, -0.0, 1.0, -0.0, 0.0, -1.0], np.float32)
    _, idx = sort_with_index(x, simple([dt.F32, dt.S32], "LT"))
    np.testing.assert_array_equal(idx, [5, 0, 1, 3, 4, 2])


@pytest.mark.parametrize("d", [dt.BF16, dt.F16, dt.F8E4M3FN])
def test_low_precision_keys(d):
    x = (RNG.standard_normal(50) * 3).astype(d.np)
    vals, idx = sort_with_index(x, simple([d, dt.S32], "LT"))
    np.testing.assert_array_equal(idx, np.argsort(x.astype(np.float32), kind="stable"))
    assert vals.dtype == d.np


def test_single_operand_result_is_an_array():
    (out,) = sort([np.array([[3, 1, 2], [0, 5, 4]], np.int32)], simple([dt.S32]), dimension=0)
    np.testing.assert_array_equal(out, [[0, 1, 2], [3, 5, 4]])


# --- general comparators ---------------------------------------------------------------------

def test_jax_sort_matches_xla():
    """jnp.sort / jnp.argsort of X9, as XLA CPU computed them (NaN last, -0 == 0, stable)."""
    vals, idx = sort_with_index(X9, jax_lexicographic([dt.F32, dt.S32], 1))
    np.testing.assert_array_equal(idx, [5, 2, 3, 8, 1, 7, 4, 0, 6])
    np.testing.assert_array_equal(vals, [-np.inf, -0.0, 0.0, 0.0, 1, 1, np.inf, np.nan, np.nan])


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 129, 300])
def test_two_keys_match_lexsort(n):
    k0 = RNG.integers(0, 4, (5, n)).astype(np.int32)
    k1 = RNG.standard_normal((5, n)).round(1).astype(np.float32)
    payload = RNG.integers(0, 1000, (5, n)).astype(np.int32)
    out = sort([k0, k1, payload], jax_lexicographic([dt.S32, dt.F32, dt.S32], 2), dimension=1)
    order = np.stack([np.lexsort((k1[r], k0[r])) for r in range(5)])
    for got, x in zip(out, [k0, k1, payload]):
        np.testing.assert_array_equal(got, np.take_along_axis(x, order, axis=1))


def test_descending_multi_key_along_a_middle_dimension():
    k0 = RNG.integers(0, 3, (4, 33, 2)).astype(np.int32)
    k1 = RNG.integers(0, 3, (4, 33, 2)).astype(np.int32)
    out0, out1 = sort([k0, k1], jax_lexicographic([dt.S32, dt.S32], 2, descending=True), dimension=1)
    for i in range(4):
        for j in range(2):
            order = np.lexsort((-k1[i, :, j], -k0[i, :, j]))  # stable: ties keep index order
            np.testing.assert_array_equal(out0[i, :, j], k0[i, order, j])
            np.testing.assert_array_equal(out1[i, :, j], k1[i, order, j])


def test_second_key_breaks_ties_only():
    """A comparator that is not one compare goes through the general path even for one key."""
    x = np.array([2, 1, 2, 1, 0], np.int32)
    y = np.array([0, 9, -1, 3, 5], np.int32)
    out = sort([x, y], jax_lexicographic([dt.S32, dt.S32], 2))
    np.testing.assert_array_equal(out[0], [0, 1, 1, 2, 2])
    np.testing.assert_array_equal(out[1], [5, 3, 9, -1, 0])


def test_unstable_request_still_sorts_stably():
    x = RNG.integers(0, 3, 50).astype(np.int32)
    _, idx = sort_with_index(x, jax_lexicographic([dt.S32, dt.S32], 1), stable=False)
    np.testing.assert_array_equal(idx, np.argsort(x, kind="stable"))


def _always(value: bool) -> Computation:
    b = Builder("always")
    b.param(dt.S32, ())
    b.param(dt.S32, ())
    return b.build(b.constant(np.asarray(value), dt.PRED))


@pytest.mark.parametrize("value", [True, False])
def test_inconsistent_comparators_still_give_a_permutation(value):
    x = np.arange(37, dtype=np.int32)[::-1].copy()
    (out,) = sort([x], _always(value))
    np.testing.assert_array_equal(np.sort(out), np.arange(37))


X12 = np.array([np.nan, 1, -0.0, 0.0, np.inf, -np.inf, -np.nan, 1, 0.0, 2, np.nan, -1], np.float32)


@pytest.mark.parametrize("stable", [True, False])
def test_float_compare_with_nan_as_xla_cpu(stable):
    """NaN is unordered under FLOAT compares; XLA CPU (insertion sort for short rows) leaves each NaN
    in place and sorts the runs between them. Indices as XLA CPU computed them."""
    _, idx = sort_with_index(X12, simple([dt.F32, dt.S32], "LT"), stable=stable)
    np.testing.assert_array_equal(idx, [0, 5, 2, 3, 1, 4, 6, 8, 7, 9, 10, 11])
    _, idx = sort_with_index(X12, simple([dt.F32, dt.S32], "GT"), stable=stable)
    np.testing.assert_array_equal(idx, [0, 4, 1, 2, 3, 5, 6, 9, 7, 8, 10, 11])


def test_unordered_nan_in_a_general_comparator_still_gives_a_permutation():
    b = Builder("float_lt_twice")
    x, y = b.param(dt.F32, ()), b.param(dt.F32, ())
    b.param(dt.S32, ())
    b.param(dt.S32, ())
    lt = b.op("compare", [x, y], direction="LT")
    comp = b.build(b.op("and", [lt, lt]))  # x < y under FLOAT, not recognised as a single compare
    x20 = np.where(RNG.random(20) < 0.3, np.nan, RNG.standard_normal(20)).astype(np.float32)
    vals, idx = sort_with_index(x20, comp)
    np.testing.assert_array_equal(np.sort(idx), np.arange(20))
    np.testing.assert_array_equal(vals, x20[idx])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=9),
                  elements=st.integers(-3, 3)), st.data())
def test_random_arrays_general_path_matches_lexsort(k0, data):
    dim = data.draw(st.integers(0, k0.ndim - 1))
    k1 = data.draw(hnp.arrays(np.int32, k0.shape, elements=st.integers(-2, 2)))
    out0, out1 = sort([k0, k1], jax_lexicographic([dt.S32, dt.S32], 2), dimension=dim)
    m0, m1 = np.moveaxis(k0, dim, -1), np.moveaxis(k1, dim, -1)
    w0, w1 = np.empty_like(m0), np.empty_like(m1)
    for index in np.ndindex(m0.shape[:-1]):
        order = np.lexsort((m1[index], m0[index]))
        w0[index], w1[index] = m0[index][order], m1[index][order]
    np.testing.assert_array_equal(out0, np.moveaxis(w0, -1, dim))
    np.testing.assert_array_equal(out1, np.moveaxis(w1, -1, dim))


def test_general_path_on_a_long_row_is_bounded(monkeypatch):
    """50,000 floats with JAX's comparator: O(log^2 n) whole-array comparator calls (counted: at most
    one per halving step of each merge level, each on all 50,000 elements at once)."""
    from nxsat.interpreter import Interpreter

    n = 50_000
    x = RNG.standard_normal(n).astype(np.float32)
    comp = jax_lexicographic([dt.F32, dt.S32], 1)
    sizes: list[int] = []
    call = Interpreter.call

    def counting(self, c, args, *rest, **kw):
        if c is comp:
            sizes.append(max(np.size(a) for a in args))
        return call(self, c, args, *rest, **kw)

    monkeypatch.setattr(Interpreter, "call", counting)
    vals, idx = sort_with_index(x, comp)
    np.testing.assert_array_equal(idx, np.argsort(x, kind="stable"))
    levels = int(np.ceil(np.log2(n)))
    assert 0 < len(sizes) <= levels * (levels + 1), len(sizes)  # log2(n) levels, log2(n) + 1 steps each
    assert set(sizes) == {n}  # whole arrays, never one element at a time


# --- sort shape rules ------------------------------------------------------------------------

def _sort_error(shapes, comp, dimension, match):
    b = Builder("s")
    ps = [b.param(d, s) for d, s in shapes]
    with pytest.raises(NxsatError, match=match) as e:
        b.op("sort", ps, dimension=dimension, is_stable=True, to_apply=comp)
    assert e.value.code == "NCC_EVRF064"


@pytest.mark.parametrize("shapes,comp,dimension,match", [
    ([(dt.F32, (4, 5))], simple([dt.F32]), 2, "dimension 2 out of range"),
    ([(dt.F32, (4, 5))], simple([dt.F32]), -1, "dimension -1 out of range"),
    ([(dt.F32, (4, 5)), (dt.S32, (4, 6))], simple([dt.F32, dt.S32]), 0, "dimensions must match"),
    ([(dt.F32, (4, 5))], simple([dt.F32, dt.S32]), 0, "must take 2 parameters"),
    ([(dt.F32, (4, 5)), (dt.S32, (4, 5))], simple([dt.F32, dt.F32]), 0, "parameter 2 is f32"),
    ([(dt.F32, (4, 5))], simple([dt.S32]), 0, r"parameter 0 is s32\[\], expected f32\[\]"),
])
def test_sort_shape_rule_failures(shapes, comp, dimension, match):
    _sort_error(shapes, comp, dimension, match)


def test_comparator_must_return_pred():
    b = Builder("bad")
    x, y = b.param(dt.F32, ()), b.param(dt.F32, ())
    _sort_error([(dt.F32, (3,))], b.build(b.op("add", [x, y])), 0, "must return pred")


# --- topk ------------------------------------------------------------------------------------

def topk(x: np.ndarray, k: int, largest: bool = True):
    b = Builder("t")
    p = b.param(dt.from_numpy(x.dtype), x.shape)
    return run_module(b.module(b.op("topk", [p], k=k, largest=largest)), [x])


def topk_loops(x: np.ndarray, k: int, largest: bool):
    """Per row: indices by (value, index) with value descending (or ascending), lower index first."""
    vals, idx = [], []
    for row in x.reshape(-1, x.shape[-1]):
        order = sorted(range(len(row)), key=lambda i: ((-int(row[i]) if largest else int(row[i])), i))[:k]
        idx.append(order)
        vals.append(row[order])
    shape = x.shape[:-1] + (k,)
    return np.array(vals, x.dtype).reshape(shape), np.array(idx, np.int32).reshape(shape)


def test_topk_matches_the_jax_corpus(data_dir):
    with np.load(data_dir / "jax" / "topk.npz") as z:
        vals, idx = topk(z["in0"], 3)
        np.testing.assert_array_equal(vals, z["out0"])
        np.testing.assert_array_equal(idx, z["out1"])


def test_topk_nan_and_signed_zeros_as_xla():
    """jax.lax.top_k(X9, 9) and an HLO topk with largest=false, as XLA CPU computed them."""
    vals, idx = topk(X9, 9)
    np.testing.assert_array_equal(idx, [0, 4, 1, 7, 3, 8, 2, 5, 6])
    assert not np.signbit(vals[0]) and np.signbit(vals[8]) and np.signbit(vals[6])
    vals, idx = topk(X9, 3, largest=False)
    np.testing.assert_array_equal(idx, [6, 5, 2])
    vals, idx = topk(X9.astype(ml_dtypes.bfloat16), 9)
    np.testing.assert_array_equal(idx, [0, 4, 1, 7, 3, 8, 2, 5, 6])


@pytest.mark.parametrize("d", [np.int32, np.uint8, np.int8, np.int64])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_integers_ties_to_the_lower_index(d, largest):
    info = np.iinfo(d)
    x = RNG.integers(max(info.min, -4), min(info.max, 4), (3, 2, 17), endpoint=True).astype(d)
    vals, idx = topk(x, 6, largest)
    want_vals, want_idx = topk_loops(x, 6, largest)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(vals, want_vals)
    assert idx.dtype == np.int32 and vals.dtype == d


@pytest.mark.parametrize("k", [0, 17])
def test_topk_k_extremes(k):
    x = RNG.integers(0, 5, (2, 17)).astype(np.int32)
    vals, idx = topk(x, k)
    assert vals.shape == (2, k) and idx.shape == (2, k)
    if k:
        np.testing.assert_array_equal(idx, topk_loops(x, k, True)[1])


@pytest.mark.parametrize("shape,k,largest,match", [
    ((4, 5), 6, True, r"k = 6 must be within \[0, 5\]"),
    ((4, 5), -1, True, r"k = -1 must be within"),
    ((), 1, True, "must have rank >= 1"),
    ((4, 5), 2, "yes", "largest must be true or false"),
])
def test_topk_shape_rule_failures(shape, k, largest, match):
    b = Builder("t")
    p = b.param(dt.F32, shape)
    with pytest.raises(NxsatError, match=match) as e:
        b.op("topk", [p], k=k, largest=largest)
    assert e.value.code == "NCC_EVRF064"


def test_topk_result_type():
    b = Builder("t")
    n = b.op("topk", [b.param(dt.BF16, (1, 50000))], k=10, largest=True)
    assert str(n.type) == "(bf16[1,10], s32[1,10])"

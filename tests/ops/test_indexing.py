"""gather and scatter against loop references written from the StableHLO/XLA definitions, numpy
equivalents (take, take_along_axis, add.at), random dimension numbers, and the shape rules."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nxsat import dtypes as dt
from nxsat.attrs import GatherDims, ScatterDims
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module

RNG = np.random.default_rng(7)


# --- loop references (one output / update element at a time) --------------------------------

def _start_vector(indices: np.ndarray, batch_index: tuple[int, ...], ivd: int) -> list[int]:
    if ivd == indices.ndim:
        return [int(indices[batch_index])]
    sl: list = list(batch_index)
    sl.insert(ivd, slice(None))
    return [int(v) for v in indices[tuple(sl)]]


def gather_ref(operand, indices, d: GatherDims, slice_sizes):
    rank = operand.ndim
    ivd = d.index_vector_dim
    expanded = indices.shape + (1,) if ivd == indices.ndim else indices.shape
    batch_shape = [s for i, s in enumerate(expanded) if i != ivd]
    windowed = [i for i in range(rank)
                if i not in d.collapsed_slice_dims and i not in d.operand_batching_dims]
    out_rank = len(batch_shape) + len(d.offset_dims)
    batch_dims = [i for i in range(out_rank) if i not in d.offset_dims]
    out_shape = [0] * out_rank
    for i, s in zip(batch_dims, batch_shape):
        out_shape[i] = s
    for i, w in zip(d.offset_dims, windowed):
        out_shape[i] = slice_sizes[w]
    out = np.zeros(out_shape, operand.dtype)
    for out_index in itertools.product(*map(range, out_shape)):
        batch_index = tuple(out_index[i] for i in batch_dims)
        start = _start_vector(indices, batch_index, ivd)
        full = [0] * rank
        for k, d_op in enumerate(d.start_index_map):
            full[d_op] = min(max(start[k], 0), operand.shape[d_op] - slice_sizes[d_op])
        for d_op, d_ix in zip(d.operand_batching_dims, d.start_indices_batching_dims):
            full[d_op] += batch_index[d_ix - (d_ix > ivd)]
        for i, w in zip(d.offset_dims, windowed):
            full[w] += out_index[i]
        out[out_index] = operand[tuple(full)]
    return out


def scatter_ref(operands, indices, updates, d: ScatterDims, fn):
    """Apply ``fn(current tuple, update tuple) -> tuple`` in update order, skipping any update whose
    whole window is not in bounds (XLA)."""
    results = [o.copy() for o in operands]
    rank = operands[0].ndim
    ivd = d.index_vector_dim
    uwd = list(d.update_window_dims)
    scatter_dims = [i for i in range(updates[0].ndim) if i not in uwd]
    windowed = [i for i in range(rank) if i not in d.inserted_window_dims and i not in d.input_batching_dims]
    size = [1] * rank
    for u, w in zip(uwd, windowed):
        size[w] = updates[0].shape[u]
    for si in itertools.product(*(range(updates[0].shape[i]) for i in scatter_dims)):
        start = _start_vector(indices, si, ivd)
        full = [0] * rank
        for k, d_op in enumerate(d.scatter_dims_to_operand_dims):
            full[d_op] = start[k]
        for d_op, d_ix in zip(d.input_batching_dims, d.scatter_indices_batching_dims):
            full[d_op] = si[d_ix - (d_ix > ivd)]
        if not all(0 <= full[i] and full[i] + size[i] <= rank_size for i, rank_size in
                   enumerate(operands[0].shape)):
            continue
        for wi in itertools.product(*(range(updates[0].shape[u]) for u in uwd)):
            update_index = [0] * updates[0].ndim
            for i, v in zip(scatter_dims, si):
                update_index[i] = v
            for i, v in zip(uwd, wi):
                update_index[i] = v
            target = list(full)
            for w, v in zip(windowed, wi):
                target[w] += v
            cur = tuple(r[tuple(target)] for r in results)
            with np.errstate(over="ignore"):  # integer arithmetic wraps
                new = fn(cur, tuple(u[tuple(update_index)] for u in updates))
            for r, v in zip(results, new):
                r[tuple(target)] = v
    return results


# --- graph helpers ---------------------------------------------------------------------------

def gather(operand, indices, dims: GatherDims, slice_sizes):
    b = Builder("g")
    o = b.param(dt.from_numpy(operand.dtype), operand.shape)
    i = b.param(dt.from_numpy(indices.dtype), indices.shape)
    n = b.op("gather", [o, i], dims=dims, slice_sizes=tuple(slice_sizes), indices_are_sorted=False)
    return run_module(b.module(n), [operand, indices])[0]


def body(kind: str, d: dt.DType, n: int = 1):
    """Scatter bodies: "add" & co. (fast path), "replace", "twice_plus" (2a + b, order-sensitive),
    "slow_add" (a - (-b): an add the fast path does not recognise), "argmax" (variadic)."""
    b = Builder(kind)
    if kind == "argmax":
        v0, i0, v1, i1 = b.param(d, ()), b.param(dt.S32, ()), b.param(d, ()), b.param(dt.S32, ())
        gt = b.op("compare", [v1, v0], direction="GT")
        return b.build([b.op("select", [gt, v1, v0]), b.op("select", [gt, i1, i0])])
    ps = [b.param(d, ()) for _ in range(2 * n)]
    outs = []
    for k in range(n):
        x, y = ps[k], ps[n + k]
        if kind == "replace":
            outs.append(y)
        elif kind == "twice_plus":
            outs.append(b.op("add", [b.op("multiply", [x, b.constant(np.asarray(2, d.np), d)]), y]))
        elif kind == "slow_add":
            outs.append(b.op("subtract", [x, b.op("negate", [y])]))
        elif kind == "reversed_add":
            outs.append(b.op("add", [y, x]))
        else:
            outs.append(b.op(kind, [x, y]))
    return b.build(outs[0] if n == 1 else outs)


def scatter(operands, indices, updates, dims: ScatterDims, to_apply):
    b = Builder("s")
    ps = [b.param(dt.from_numpy(a.dtype), a.shape) for a in [*operands, indices, *updates]]
    n = b.op("scatter", ps, dims=dims, to_apply=to_apply, indices_are_sorted=False, unique_indices=False)
    return run_module(b.module(n), [*operands, indices, *updates])


def fn_of(kind: str):
    return {
        "add": lambda c, u: (c[0] + u[0],),
        "multiply": lambda c, u: (c[0] * u[0],),
        "maximum": lambda c, u: (max(c[0], u[0]),),
        "minimum": lambda c, u: (min(c[0], u[0]),),
        "replace": lambda c, u: (u[0],),
        "twice_plus": lambda c, u: (c[0] * c[0].dtype.type(2) + u[0],),
        "slow_add": lambda c, u: (c[0] + u[0],),
    }[kind]


# --- gather ----------------------------------------------------------------------------------

EMBED = GatherDims(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,), index_vector_dim=2)


def test_embedding_lookup_is_take_with_clamped_indices():
    table = RNG.standard_normal((10, 4)).astype(np.float32)
    ids = np.array([[0, 12], [-3, 9], [5, 5]], np.int32)
    out = gather(table, ids, EMBED, (1, 4))
    np.testing.assert_array_equal(out, np.take(table, np.clip(ids, 0, 9), axis=0))


def test_take_along_axis_with_batching_dims():
    x = RNG.standard_normal((3, 7)).astype(np.float32)
    idx = RNG.integers(0, 7, (3, 5, 1)).astype(np.int32)
    dims = GatherDims(offset_dims=(), collapsed_slice_dims=(1,), start_index_map=(1,), index_vector_dim=2,
                      operand_batching_dims=(0,), start_indices_batching_dims=(0,))
    out = gather(x, idx, dims, (1, 1))
    np.testing.assert_array_equal(out, np.take_along_axis(x, idx[..., 0], axis=1))


def test_stablehlo_spec_example():
    operand = np.arange(1, 49, dtype=np.int32).reshape(2, 3, 4, 2)
    idx = np.array([[[[0, 0], [1, 0], [2, 1]], [[0, 1], [1, 1], [0, 9]]],
                    [[[0, 0], [2, 1], [2, 2]], [[1, 2], [0, 1], [1, 0]]]], np.int64)
    dims = GatherDims(offset_dims=(3, 4), collapsed_slice_dims=(1,), start_index_map=(2, 1),
                      index_vector_dim=3, operand_batching_dims=(0,), start_indices_batching_dims=(1,))
    out = gather(operand, idx, dims, (1, 1, 2, 2))
    assert out.shape == (2, 2, 3, 2, 2)
    # The result printed in the specification.
    np.testing.assert_array_equal(out[0], [
        [[[1, 2], [3, 4]], [[3, 4], [5, 6]], [[13, 14], [15, 16]]],
        [[[33, 34], [35, 36]], [[35, 36], [37, 38]], [[41, 42], [43, 44]]]])
    np.testing.assert_array_equal(out, gather_ref(operand, idx, dims, (1, 1, 2, 2)))


def test_slices_are_clamped_into_bounds():
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    dims = GatherDims(offset_dims=(1, 2), start_index_map=(0, 1), index_vector_dim=1)
    out = gather(x, np.array([[4, 5], [-7, 2]], np.int32), dims, (2, 3))
    np.testing.assert_array_equal(out[0], x[3:5, 3:6])
    np.testing.assert_array_equal(out[1], x[0:2, 2:5])


def test_index_vector_dim_first():
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    idx = np.array([[0, 5, -2], [4, 1, 3]], np.int32)
    dims = GatherDims(offset_dims=(0, 2), start_index_map=(1, 0), index_vector_dim=0)
    out = gather(x, idx, dims, (2, 3))
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out, gather_ref(x, idx, dims, (2, 3)))


@pytest.mark.parametrize("idt", [np.uint8, np.uint64, np.int8, np.int64])
def test_extreme_index_values_clamp(idt):
    x = np.arange(12, dtype=np.int32).reshape(6, 2)
    info = np.iinfo(idt)
    ids = np.array([info.min, info.max, 3], idt)
    out = gather(x, ids, GatherDims(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,),
                                    index_vector_dim=1), (1, 2))
    rows = np.clip(np.array([int(v) for v in ids], dtype=object), 0, 5).astype(np.int64)
    np.testing.assert_array_equal(out, x[rows])


def test_scalar_operand_and_zero_sized_slices():
    dims = GatherDims(offset_dims=(), start_index_map=(), index_vector_dim=1)
    out = gather(np.array(7.0, np.float32), np.zeros((3, 0), np.int32), dims, ())
    np.testing.assert_array_equal(out, [7.0, 7.0, 7.0])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = gather(x, np.array([[1]], np.int32), GatherDims(offset_dims=(1, 2), start_index_map=(0,),
                                                             index_vector_dim=1), (2, 0))
    assert out.shape == (1, 2, 0)


@st.composite
def gather_cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    dims_ = list(range(rank))
    operand_batching = sorted(draw(st.lists(st.sampled_from(dims_), unique=True, max_size=min(2, rank))))
    rest = [d for d in dims_ if d not in operand_batching]
    index_map = list(draw(st.permutations(rest)))[:draw(st.integers(0, len(rest)) | st.just(len(rest)))]
    collapsed = sorted(draw(st.lists(st.sampled_from(rest), unique=True, max_size=1)) if rest else [])
    sizes = [1 if d in collapsed or d in operand_batching
             else draw(st.integers(0, shape[d]) | st.just(shape[d] - 1)) for d in dims_]
    n_other = draw(st.integers(0, 2))
    other = draw(st.lists(st.integers(1, 3), min_size=n_other, max_size=n_other))
    # Batch dims of the indices: the batching ones (sizes from the operand) and others, shuffled.
    batch = [("b", k) for k in range(len(operand_batching))] + [("o", k) for k in range(n_other)]
    batch = draw(st.permutations(batch))
    implicit = len(index_map) == 1 and draw(st.booleans())
    ivd = len(batch) if implicit else draw(st.integers(0, len(batch)))
    ishape = [shape[operand_batching[k]] if kind == "b" else other[k] for kind, k in batch]
    ibatch_pos = {k: p for p, (kind, k) in enumerate(batch) if kind == "b"}
    if not implicit:
        ishape.insert(ivd, len(index_map))
    index_batching = [ibatch_pos[k] + (0 if implicit or ibatch_pos[k] < ivd else 1)
                      for k in range(len(operand_batching))]
    hi = max(shape) + 2
    indices = np.array(draw(st.lists(st.integers(-2, hi), min_size=int(np.prod(ishape)),
                                     max_size=int(np.prod(ishape)))), np.int32).reshape(ishape)
    out_rank = len(batch) + len(rest) - len(collapsed)
    offset = sorted(draw(st.permutations(list(range(out_rank))))[:len(rest) - len(collapsed)])
    dims = GatherDims(offset_dims=tuple(offset), collapsed_slice_dims=tuple(collapsed),
                      start_index_map=tuple(index_map), index_vector_dim=ivd,
                      operand_batching_dims=tuple(operand_batching),
                      start_indices_batching_dims=tuple(index_batching))
    operand = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    return operand, indices, dims, tuple(sizes)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gather_cases())
def test_random_dimension_numbers_match_the_loop_reference(case):
    operand, indices, dims, sizes = case
    np.testing.assert_array_equal(gather(operand, indices, dims, sizes),
                                  gather_ref(operand, indices, dims, sizes))


GOOD = dict(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,), index_vector_dim=1)


@pytest.mark.parametrize("change,sizes,idx_shape,idx_dtype,match", [
    ({}, (1, 4), (3,), np.float32, "must be an integer array"),
    ({"index_vector_dim": 3}, (1, 4), (3,), np.int32, r"index_vector_dim 3 must be within \[0, 1\]"),
    ({"start_index_map": (0, 1)}, (1, 4), (3,), np.int32, "has 2 entries but the index vector"),
    ({"start_index_map": (2,)}, (1, 4), (3,), np.int32, "has dimension 2, out of range"),
    ({"collapsed_slice_dims": (1, 0), "offset_dims": ()}, (1, 1), (3,), np.int32,
     "must be sorted and unique"),
    ({"collapsed_slice_dims": (0, 1)}, (1, 1), (3,), np.int32,
     "1 offset_dims . 2 collapsed_slice_dims . 0 operand_batching_dims must add up to the operand's rank 2"),
    ({}, (2, 4), (3,), np.int32, "slice size must be 0 or 1, got 2"),
    ({}, (1, 5), (3,), np.int32, r"slice size 5 of dimension 1 must be within \[0, 4\]"),
    ({}, (1,), (3,), np.int32, "one entry per operand dimension"),
    ({"offset_dims": (2,)}, (1, 4), (3,), np.int32, "out of range for a result of rank 2"),
    ({"offset_dims": (0, 1, 2), "collapsed_slice_dims": ()}, (1, 4), (3,), np.int32,
     "3 offset_dims . 0 collapsed_slice_dims"),
    ({"operand_batching_dims": (0,), "start_indices_batching_dims": (0,)}, (1, 4), (3,), np.int32,
     "in both collapsed_slice_dims and operand_batching_dims"),
    ({"operand_batching_dims": (1,), "start_indices_batching_dims": (0,), "offset_dims": ()}, (1, 1), (3,),
     np.int32, "batching dimension 1 of the operand has size 4 but dimension 0 of start indices has 3"),
    ({"operand_batching_dims": (1,), "start_indices_batching_dims": (1,), "offset_dims": ()}, (1, 1), (3,),
     np.int32, "start_indices_batching_dims entry 1 is the index_vector_dim"),
    ({"operand_batching_dims": (1,), "start_indices_batching_dims": (), "offset_dims": ()}, (1, 1), (3,),
     np.int32, "differ in length"),
    ({"start_index_map": (0,), "operand_batching_dims": (0,), "start_indices_batching_dims": (0,),
      "collapsed_slice_dims": ()}, (1, 4), (5,), np.int32,
     "in both start_index_map and operand_batching_dims"),
])
def test_gather_shape_rule_failures(change, sizes, idx_shape, idx_dtype, match):
    b = Builder("g")
    o = b.param(dt.F32, (5, 4))
    i = b.param(dt.from_numpy(np.dtype(idx_dtype)), idx_shape)
    with pytest.raises(NxsatError, match=match) as e:
        b.op("gather", [o, i], dims=GatherDims(**{**GOOD, **change}), slice_sizes=sizes)
    assert e.value.code == "NCC_EVRF064"


def test_gather_result_shape():
    b = Builder("g")
    o, i = b.param(dt.BF16, (2, 3, 4, 2)), b.param(dt.S64, (2, 2, 3, 2))
    n = b.op("gather", [o, i], slice_sizes=(1, 1, 2, 2),
             dims=GatherDims(offset_dims=(3, 4), collapsed_slice_dims=(1,), start_index_map=(2, 1),
                             index_vector_dim=3, operand_batching_dims=(0,),
                             start_indices_batching_dims=(1,)))
    assert str(n.type) == "bf16[2,2,3,2,2]"


# --- scatter ---------------------------------------------------------------------------------

ROWS = ScatterDims(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,),
                   index_vector_dim=1)
POINTS = ScatterDims(update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,),
                     index_vector_dim=1)


def test_embedding_gradient_is_add_at():
    grad = RNG.standard_normal((40, 8)).astype(np.float32)
    ids = RNG.integers(0, 6, (40, 1)).astype(np.int32)
    (out,) = scatter([np.zeros((6, 8), np.float32)], ids, [grad], ROWS, body("add", dt.F32))
    want = np.zeros((6, 8), np.float32)
    np.add.at(want, ids[:, 0], grad)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("kind", ["add", "multiply", "maximum", "minimum", "replace", "reversed_add"])
@pytest.mark.parametrize("d", [np.float32, np.int32, np.uint8])
def test_combiners_match_the_loop_reference(kind, d):
    operand = (RNG.standard_normal(5) * 4).astype(d) if d == np.float32 else RNG.integers(0, 9, 5).astype(d)
    ids = np.array([[1], [3], [1], [7], [1], [-1], [4], [3]], np.int32)
    upd = (RNG.standard_normal(8) * 4).astype(d) if d == np.float32 else RNG.integers(0, 9, 8).astype(d)
    (out,) = scatter([operand], ids, [upd], POINTS, body(kind, dt.from_numpy(np.dtype(d))))
    fn = fn_of("add" if kind == "reversed_add" else kind)
    np.testing.assert_array_equal(out, scatter_ref([operand], ids, [upd], POINTS, fn)[0])


def test_replace_keeps_the_last_update():
    (out,) = scatter([np.zeros(5, np.int32)], np.array([[1], [3], [1], [1], [9], [3]], np.int32),
                     [np.array([10, 20, 30, 40, 50, 60], np.int32)], POINTS, body("replace", dt.S32))
    np.testing.assert_array_equal(out, [0, 40, 0, 60, 0])


def test_a_window_partly_out_of_bounds_is_skipped_whole():
    dims = ScatterDims(update_window_dims=(1, 2), scatter_dims_to_operand_dims=(0,), index_vector_dim=1)
    upd = np.arange(1, 41, dtype=np.float32).reshape(5, 2, 4)
    ids = np.array([[1], [5], [1], [-1], [4]], np.int32)
    (out,) = scatter([np.zeros((6, 4), np.float32)], ids, [upd], dims, body("add", dt.F32))
    want = np.zeros((6, 4), np.float32)
    want[1:3] += upd[0] + upd[2]  # start 5 (rows 5-6) and -1 are out of bounds: skipped entirely
    want[4:6] += upd[4]
    np.testing.assert_array_equal(out, want)


def test_general_body_runs_in_update_order():
    operand = np.array([1, 2, 3, 4], np.float32)
    ids = np.array([[2], [0], [2], [7], [2], [0]], np.int32)
    upd = np.array([1, 10, 100, 1000, 10000, 5], np.float32)
    (out,) = scatter([operand], ids, [upd], POINTS, body("twice_plus", dt.F32))
    # 2a + b in update order: index 2: 3 -> 7 -> 114 -> 10228; index 0: 1 -> 12 -> 29; 7 is skipped.
    np.testing.assert_array_equal(out, [29, 2, 10228, 4])


def test_window_elements_follow_their_scatter_index():
    # XLA applies each scatter index's whole window before the next index (checked on XLA CPU).
    dims = ScatterDims(update_window_dims=(1,), scatter_dims_to_operand_dims=(0,), index_vector_dim=1)
    operand = np.array([1, 2, 3, 4, 5], np.float32)
    upd = np.array([[1, 2, 3], [10, 20, 30], [100, 200, 300]], np.float32)
    (out,) = scatter([operand], np.array([[0], [1], [2]], np.int32), [upd], dims, body("twice_plus", dt.F32))
    # 2a + b: index 0 gives [3, 6, 9, 4, 5], index 1 [3, 22, 38, 38, 5], index 2 [3, 22, 176, 276, 310].
    np.testing.assert_array_equal(out, [3, 22, 176, 276, 310])


def test_variadic_argmax_body():
    ops = [np.full(4, -1e9, np.float32), np.full(4, -1, np.int32)]
    ids = np.array([[2], [0], [2], [3], [2], [0]], np.int32)
    ups = [np.array([5, 1, 7, 2, 7, 3], np.float32), np.arange(6, dtype=np.int32)]
    out = scatter(ops, ids, ups, POINTS, body("argmax", dt.F32))
    np.testing.assert_array_equal(out[0], [3, -1e9, 7, 2])
    np.testing.assert_array_equal(out[1], [5, -1, 2, 3])


def test_variadic_fast_path_per_result():
    ops = [np.zeros(4, np.int32), np.zeros(4, np.int32)]
    ids = np.array([[1], [1], [3]], np.int32)
    ups = [np.array([1, 2, 3], np.int32), np.array([4, 5, 6], np.int32)]
    b = Builder("add_and_max")
    x0, x1, y0, y1 = (b.param(dt.S32, ()) for _ in range(4))
    comp = b.build([b.op("add", [x0, y0]), b.op("maximum", [y1, x1])])
    out = scatter(ops, ids, ups, POINTS, comp)
    np.testing.assert_array_equal(out[0], [0, 3, 0, 3])
    np.testing.assert_array_equal(out[1], [0, 5, 0, 6])


def test_batching_dims():
    dims = ScatterDims(update_window_dims=(), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(1,),
                       index_vector_dim=2, input_batching_dims=(0,), scatter_indices_batching_dims=(0,))
    ids = np.array([[[1], [1], [4]], [[0], [7], [3]]], np.int32)
    upd = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    (out,) = scatter([np.zeros((2, 5), np.float32)], ids, [upd], dims, body("add", dt.F32))
    np.testing.assert_array_equal(out, [[0, 3, 0, 0, 3], [4, 0, 0, 6, 0]])


def test_bf16_add_rounds_after_every_update():
    rng = np.random.default_rng(5)  # its own: the module's RNG depends on which tests ran first in a worker
    ids = rng.integers(0, 3, (60, 1)).astype(np.int32)
    upd = (rng.standard_normal(60) * 10).astype(ml_dtypes.bfloat16)
    operand = np.zeros(3, ml_dtypes.bfloat16)
    (out,) = scatter([operand], ids, [upd], POINTS, body("add", dt.BF16))
    want = scatter_ref([operand], ids, [upd], POINTS, fn_of("add"))[0]
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), want.astype(np.float32))
    # Accumulating in fp32 and rounding once would differ: the steps really round.
    wide = np.zeros(3, np.float32)
    np.add.at(wide, ids[:, 0], upd.astype(np.float32))
    assert not np.array_equal(wide.astype(ml_dtypes.bfloat16), out)


def test_general_path_agrees_with_the_fast_path():
    ids = RNG.integers(-1, 9, (200, 2)).astype(np.int32)
    upd = RNG.integers(-100, 100, (200, 2, 2)).astype(np.int32)
    dims = ScatterDims(update_window_dims=(1, 2), scatter_dims_to_operand_dims=(0, 1), index_vector_dim=1)
    operand = RNG.integers(-5, 5, (8, 9)).astype(np.int32)
    fast = scatter([operand], ids, [upd], dims, body("add", dt.S32))[0]
    slow = scatter([operand], ids, [upd], dims, body("slow_add", dt.S32))[0]
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(fast, scatter_ref([operand], ids, [upd], dims, fn_of("add"))[0])


def test_empty_updates_and_scalar_operand():
    (out,) = scatter([np.arange(4, dtype=np.float32)], np.zeros((0, 1), np.int32), [np.zeros(0, np.float32)],
                     POINTS, body("add", dt.F32))
    np.testing.assert_array_equal(out, np.arange(4))
    dims = ScatterDims(update_window_dims=(), scatter_dims_to_operand_dims=(), index_vector_dim=1)
    (out,) = scatter([np.array(1.0, np.float32)], np.zeros((3, 0), np.int32),
                     [np.array([1, 2, 3], np.float32)], dims, body("add", dt.F32))
    assert out.shape == () and out == 7.0


@st.composite
def scatter_cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    dims_ = list(range(rank))
    batching = sorted(draw(st.lists(st.sampled_from(dims_), unique=True, max_size=min(2, rank))))
    rest = [d for d in dims_ if d not in batching]
    index_map = list(draw(st.permutations(rest)))[:draw(st.integers(0, len(rest)))] if rest else []
    inserted = sorted(draw(st.lists(st.sampled_from(rest), unique=True)) if rest else [])
    windowed = [d for d in rest if d not in inserted]
    wsizes = [draw(st.integers(0, shape[d])) for d in windowed]
    n_other = draw(st.integers(0, 2))
    other = draw(st.lists(st.integers(1, 3), min_size=n_other, max_size=n_other))
    batch = draw(st.permutations([("b", k) for k in range(len(batching))]
                                 + [("o", k) for k in range(n_other)]))
    implicit = len(index_map) == 1 and draw(st.booleans())
    ivd = len(batch) if implicit else draw(st.integers(0, len(batch)))
    bshape = [shape[batching[k]] if kind == "b" else other[k] for kind, k in batch]
    ishape = list(bshape) if implicit else bshape[:ivd] + [len(index_map)] + bshape[ivd:]
    pos = {k: p for p, (kind, k) in enumerate(batch) if kind == "b"}
    index_batching = [pos[k] + (0 if implicit or pos[k] < ivd else 1) for k in range(len(batching))]
    indices = np.array(draw(st.lists(st.integers(-1, max(shape)), min_size=int(np.prod(ishape)),
                                     max_size=int(np.prod(ishape)))), np.int32).reshape(ishape)
    urank = len(bshape) + len(windowed)
    uwd = sorted(list(draw(st.permutations(list(range(urank)))))[:len(windowed)])
    ushape, b_it, w_it = [], iter(bshape), iter(wsizes)
    for u in range(urank):
        ushape.append(next(w_it) if u in uwd else next(b_it))
    dims = ScatterDims(update_window_dims=tuple(uwd), inserted_window_dims=tuple(inserted),
                       scatter_dims_to_operand_dims=tuple(index_map), index_vector_dim=ivd,
                       input_batching_dims=tuple(batching),
                       scatter_indices_batching_dims=tuple(index_batching))
    operand = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    updates = (np.arange(int(np.prod(ushape)), dtype=np.int32) * 7 + 1).reshape(ushape)
    kind = draw(st.sampled_from(["add", "replace", "twice_plus", "maximum"]))
    return operand, indices, updates, dims, kind


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scatter_cases())
def test_random_scatter_dimension_numbers_match_the_loop_reference(case):
    operand, indices, updates, dims, kind = case
    (out,) = scatter([operand], indices, [updates], dims, body(kind, dt.S32))
    np.testing.assert_array_equal(out, scatter_ref([operand], indices, [updates], dims, fn_of(kind))[0])


def _scatter_error(types, dims, to_apply, match):
    b = Builder("s")
    ps = [b.param(d, s) for d, s in types]
    with pytest.raises(NxsatError, match=match) as e:
        b.op("scatter", ps, dims=dims, to_apply=to_apply)
    assert e.value.code == "NCC_EVRF064"


F, I = dt.F32, dt.S32
ADD = body("add", dt.F32)


@pytest.mark.parametrize("types,dims,to_apply,match", [
    ([(F, (5, 4)), (F, (5, 4)), (I, (3, 1)), (F, (3, 4))], ROWS, ADD, "odd count"),
    ([(F, (5, 4)), (I, (3, 1)), (F, (3, 4, 1))], ROWS, ADD, "updates must have rank 2"),
    ([(F, (5, 4)), (I, (3, 1)), (F, (3, 5))], ROWS, ADD, "has size 5, larger than operand dimension 1"),
    ([(F, (5, 4)), (I, (3, 1)), (F, (2, 4))], ROWS, ADD, "scatter dimension 0 of updates has size 2"),
    ([(F, (5, 4)), (I, (3, 1)), (I, (3, 4))], ROWS, ADD, "updates 0 is s32 but add takes f32"),
    ([(I, (5, 4)), (I, (3, 1)), (I, (3, 4))], ROWS, ADD, "operand 0 is s32 but add takes f32"),
    ([(F, (5, 4)), (F, (3, 1)), (F, (3, 4))], ROWS, ADD, "scatter indices must be an integer array"),
    ([(F, (5, 4)), (I, (3, 1)), (F, (3, 4))],
     ScatterDims(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0, 1),
                 index_vector_dim=1), ADD, "has 2 entries but the index vector"),
    ([(F, (5, 4)), (I, (3, 1)), (F, (3, 4))],
     ScatterDims(update_window_dims=(1,), inserted_window_dims=(), scatter_dims_to_operand_dims=(0,),
                 index_vector_dim=1), ADD,
     "1 update_window_dims . 0 inserted_window_dims . 0 input_batching_dims must add up"),
    ([(F, (5, 4)), (I, (3, 1)), (F, (3, 4))], ROWS, body("add", dt.S32),
     "operand 0 is f32 but add takes s32"),
    ([(F, (5, 4)), (I, (3, 1)), (F, (3, 4))], ROWS, body("add", dt.F32, n=2), "must take 2 parameters"),
    ([(F, (5, 4)), (F, (5, 4)), (I, (3, 1)), (F, (3, 4)), (F, (3, 4))], ROWS, ADD, "must take 4 parameters"),
    ([(F, (5, 4)), (F, (5, 3)), (I, (3, 1)), (F, (3, 4)), (F, (3, 4))], ROWS, body("add", dt.F32, n=2),
     "operands must share one shape"),
])
def test_scatter_shape_rule_failures(types, dims, to_apply, match):
    _scatter_error(types, dims, to_apply, match)


def test_body_result_must_have_its_parameter_type():
    b = Builder("mixed")
    x, y = b.param(dt.F32, ()), b.param(dt.F16, ())
    comp = b.build(b.op("convert", [b.op("add", [b.op("convert", [x], dtype=dt.F16), y])], dtype=dt.F16))
    _scatter_error([(F, (5, 4)), (I, (3, 1)), (dt.F16, (3, 4))], ROWS, comp,
                   "result 0 of mixed is f16.. but its parameter 0 is f32")


def test_floating_point_precisions_may_differ_as_in_xla():
    """XLA checks a scatter body up to floating-point precision: bf16 updates may feed an f32 body
    over an f32 operand; each update is widened, combined in f32 and stored."""
    b = Builder("mixed_add")
    x, y = b.param(dt.F32, ()), b.param(dt.BF16, ())
    comp = b.build(b.op("add", [x, b.op("convert", [y], dtype=dt.F32)]))
    ids = RNG.integers(0, 3, (30, 1)).astype(np.int32)
    upd = (RNG.standard_normal(30) * 10).astype(ml_dtypes.bfloat16)
    operand = RNG.standard_normal(3).astype(np.float32)
    (out,) = scatter([operand], ids, [upd], POINTS, comp)
    want = scatter_ref([operand], ids, [upd.astype(np.float32)], POINTS, fn_of("add"))[0]
    np.testing.assert_array_equal(out, want)
    assert out.dtype == np.float32


def test_scatter_body_must_return_a_tuple_for_two_operands():
    b = Builder("bad")
    ps = [b.param(dt.F32, ()) for _ in range(4)]
    comp = b.build(b.op("add", [ps[0], ps[2]]))
    _scatter_error([(F, (5, 4)), (F, (5, 4)), (I, (3, 1)), (F, (3, 4)), (F, (3, 4))], ROWS, comp,
                   "must return a 2-tuple of scalars")

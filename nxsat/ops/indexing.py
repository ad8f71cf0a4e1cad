"""Indexing operators: gather and scatter, with XLA's full dimension numbers (batching dims too).

Both operators pair an index array with windows of the operand; one shared plan validates the
dimension numbers (each failure a precise ShapeError, as XLA's shape inference words it) and
turns the index array into full operand start positions. Semantics as XLA CPU runs them:

* gather clamps each start index so that the whole slice is in bounds;
* scatter skips an update whose whole window would not be in bounds (XLA's ScatterExpander);
  updates apply in update order (row-major over the scatter indices, then over the window).

Scatter bodies that combine with one elementwise operator (add, multiply, maximum, minimum) or
replace (return the update) run with numpy's unbuffered ``ufunc.at``; any other body runs through
the interpreter on whole arrays, one round per repetition of a target index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.attrs import GatherDims, ScatterDims
from nxsat.dtypes import DType
from nxsat.ir import Computation, Node, TensorType, TupleType, Type
from nxsat.ops.common import tensors
from nxsat.ops.registry import GPSIMD, Ctx, ShapeError, op

# --- the shared index plan -------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """How an index array addresses an operand (gather and scatter read the same way)."""

    operand_shape: tuple[int, ...]
    index_vector_dim: int
    index_map: tuple[int, ...]  # start_index_map / scatter_dims_to_operand_dims
    operand_batching: tuple[int, ...]
    index_batching: tuple[int, ...]  # dims of the (expanded) index array
    batch_shape: tuple[int, ...]  # index array shape without index_vector_dim
    window_dims: tuple[int, ...]  # operand dims that carry a window (offset) in the result/updates


def _is_sorted_unique(dims: tuple[int, ...]) -> bool:
    return all(a < b for a, b in zip(dims, dims[1:]))


def _plan(name: str, operand: TensorType, indices: TensorType, index_vector_dim: int,
          index_map: tuple[int, ...], collapsed: tuple[int, ...], operand_batching: tuple[int, ...],
          index_batching: tuple[int, ...], words: dict[str, str]) -> _Plan:
    """Check the dimension numbers both operators share (StableHLO C2-C3, C6-C8, C10-C11, C13-C19
    for gather; the scatter counterparts) and describe the addressing."""
    rank = operand.rank
    if not indices.dtype.is_int:
        raise ShapeError(f"{name}: {words['indices']} must be an integer array, got {indices}")
    if not 0 <= index_vector_dim <= indices.rank:
        raise ShapeError(f"{name}: index_vector_dim {index_vector_dim} must be within [0, "
                         f"{indices.rank}] (the rank of {words['indices']} {indices})")
    expanded = indices.shape + (1,) if index_vector_dim == indices.rank else indices.shape
    vector_size = expanded[index_vector_dim]
    if len(index_map) != vector_size:
        raise ShapeError(f"{name}: {words['index_map']} has {len(index_map)} entries but the index vector "
                         f"(dimension {index_vector_dim} of {indices}) has {vector_size}")
    for field, dims in ((words["collapsed"], collapsed), (words["operand_batching"], operand_batching),
                        (words["index_map"], index_map)):
        for d in dims:
            if not 0 <= d < rank:
                raise ShapeError(f"{name}: {field} {list(dims)} has dimension {d}, out of range for "
                                 f"the operand {operand}")
    if not _is_sorted_unique(collapsed):
        raise ShapeError(f"{name}: {words['collapsed']} {list(collapsed)} must be sorted and unique")
    if not _is_sorted_unique(operand_batching):
        raise ShapeError(f"{name}: {words['operand_batching']} {list(operand_batching)} must be sorted "
                         "and unique")
    both = set(collapsed) & set(operand_batching)
    if both:
        raise ShapeError(f"{name}: dimension {min(both)} is in both {words['collapsed']} and "
                         f"{words['operand_batching']}")
    if len(set(index_map)) != len(index_map):
        raise ShapeError(f"{name}: {words['index_map']} {list(index_map)} repeats a dimension")
    both = set(index_map) & set(operand_batching)
    if both:
        raise ShapeError(f"{name}: dimension {min(both)} is in both {words['index_map']} and "
                         f"{words['operand_batching']}")
    if len(index_batching) != len(operand_batching):
        raise ShapeError(f"{name}: {words['operand_batching']} {list(operand_batching)} and "
                         f"{words['index_batching']} {list(index_batching)} differ in length")
    if len(set(index_batching)) != len(index_batching):
        raise ShapeError(f"{name}: {words['index_batching']} {list(index_batching)} repeats a dimension")
    for d_op, d_ix in zip(operand_batching, index_batching):
        if not 0 <= d_ix < len(expanded) or d_ix == index_vector_dim:
            why = "is the index_vector_dim" if d_ix == index_vector_dim else \
                f"is out of range for {words['indices']} {indices}"
            raise ShapeError(f"{name}: {words['index_batching']} entry {d_ix} {why}")
        if operand.shape[d_op] != expanded[d_ix]:
            raise ShapeError(f"{name}: batching dimension {d_op} of the operand has size "
                             f"{operand.shape[d_op]} but dimension {d_ix} of {words['indices']} has "
                             f"{expanded[d_ix]}")
    batch_shape = tuple(s for d, s in enumerate(expanded) if d != index_vector_dim)
    window = tuple(d for d in range(rank) if d not in collapsed and d not in operand_batching)
    return _Plan(operand.shape, index_vector_dim, tuple(index_map), tuple(operand_batching),
                 tuple(index_batching), batch_shape, window)


def _as_index(a: np.ndarray) -> np.ndarray:
    """Indices as int64; u64 values beyond int64 saturate (they are out of range either way)."""
    if a.dtype == np.uint64:
        return np.minimum(a, np.uint64(np.iinfo(np.int64).max)).astype(np.int64)
    return a.astype(np.int64)


def _starts(plan: _Plan, indices: np.ndarray) -> np.ndarray:
    """Full operand start positions, shape ``batch_shape + (operand rank,)``: the index vector
    scattered through the index map, plus the batch position on batching dimensions."""
    idx = _as_index(np.asarray(indices))
    if plan.index_vector_dim == idx.ndim:
        idx = idx[..., None]
    vectors = np.moveaxis(idx, plan.index_vector_dim, -1)
    starts = np.zeros(plan.batch_shape + (len(plan.operand_shape),), dtype=np.int64)
    if plan.index_map:
        starts[..., list(plan.index_map)] = vectors
    for d_op, d_ix in zip(plan.operand_batching, plan.index_batching):
        axis = d_ix - (d_ix > plan.index_vector_dim)
        ramp = np.arange(plan.batch_shape[axis], dtype=np.int64)
        starts[..., d_op] = ramp.reshape([-1 if a == axis else 1 for a in range(len(plan.batch_shape))])
    return starts


def _linear(starts: np.ndarray, sizes: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Row-major flat operand positions of every window element, shape ``batch_shape + sizes``
    (``starts`` must keep each window in bounds wherever the result is used)."""
    strides = np.ones(len(shape), np.int64)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    offsets = np.zeros(sizes, np.int64)
    for d, n in enumerate(sizes):
        offsets = offsets + (np.arange(n, dtype=np.int64) * strides[d]).reshape(
            [n if a == d else 1 for a in range(len(sizes))])
    base = starts @ strides if len(shape) else np.zeros(starts.shape[:-1], np.int64)
    return base.reshape(base.shape + (1,) * len(sizes)) + offsets


def _ttype(a: np.ndarray) -> TensorType:
    return TensorType(dt.from_numpy(a.dtype), tuple(a.shape))


# --- gather ----------------------------------------------------------------------------------

_GATHER_WORDS = {"indices": "start indices", "index_map": "start_index_map",
                 "collapsed": "collapsed_slice_dims", "operand_batching": "operand_batching_dims",
                 "index_batching": "start_indices_batching_dims"}


def _gather_plan(operand: TensorType, indices: TensorType, attrs: dict) -> tuple[_Plan, GatherDims,
                                                                                 tuple[int, ...]]:
    dims = attrs.get("dims")
    if not isinstance(dims, GatherDims):
        raise ShapeError("gather needs its dimension numbers (dims: GatherDims)")
    plan = _plan("gather", operand, indices, dims.index_vector_dim, dims.start_index_map,
                 dims.collapsed_slice_dims, dims.operand_batching_dims, dims.start_indices_batching_dims,
                 _GATHER_WORDS)
    sizes = tuple(attrs.get("slice_sizes", ()))
    if len(sizes) != operand.rank:
        raise ShapeError(f"gather: slice_sizes {list(sizes)} must have one entry per operand dimension "
                         f"({operand.rank})")
    for d, (s, n) in enumerate(zip(sizes, operand.shape)):
        if not 0 <= s <= n:
            raise ShapeError(f"gather: slice size {s} of dimension {d} must be within [0, {n}] "
                             f"(the operand {operand})")
    for field, group in (("collapsed_slice_dims", dims.collapsed_slice_dims),
                         ("operand_batching_dims", dims.operand_batching_dims)):
        for d in group:
            if sizes[d] > 1:
                raise ShapeError(f"gather: dimension {d} is in {field} so its slice size must be 0 or 1, "
                                 f"got {sizes[d]}")
    return plan, dims, sizes


def _gather_impl(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
    operand, indices = args
    plan, dims, sizes = _gather_plan(_ttype(operand), _ttype(indices), attrs)
    out_shape = ctx.node.shape
    if any(sizes[d] == 0 for d in range(operand.ndim) if d not in plan.window_dims):
        # A collapsed slice of size 0 reads nothing, yet the result has elements: XLA leaves them
        # undefined; nxsat gives zeros.
        return np.zeros(out_shape, operand.dtype)
    starts = _starts(plan, indices)
    for d in plan.index_map:
        np.clip(starts[..., d], 0, operand.shape[d] - sizes[d], out=starts[..., d])
    values = operand.reshape(-1)[_linear(starts, sizes, operand.shape)]  # batch_shape + slice_sizes
    values = values.reshape(plan.batch_shape + tuple(sizes[d] for d in plan.window_dims))
    # Batch dimensions fill the result's non-offset dimensions in order.
    nb = len(plan.batch_shape)
    batch_axes = [d for d in range(len(out_shape)) if d not in dims.offset_dims]
    perm = [0] * len(out_shape)
    for i, d in enumerate(batch_axes):
        perm[d] = i
    for k, d in enumerate(dims.offset_dims):
        perm[d] = nb + k
    return np.transpose(values, perm).copy()  # (ascontiguousarray would make a scalar 1-D)


@op("gather", engine=GPSIMD, arity=(2, 2), neuron=("Gather",), impl=_gather_impl,
    notes="XLA dimension numbers incl. batching dims; start indices are clamped so each slice is in "
          "bounds (the device reports out-of-bound indices at run time instead)")
def _gather(types: list[Type], attrs: dict) -> Type:
    operand, indices = tensors(types)
    plan, dims, sizes = _gather_plan(operand, indices, attrs)
    offset_dims = tuple(dims.offset_dims)
    out_rank = len(plan.batch_shape) + len(offset_dims)
    if not _is_sorted_unique(offset_dims):
        raise ShapeError(f"gather: offset_dims {list(offset_dims)} must be sorted and unique")
    if offset_dims and not 0 <= offset_dims[0] <= offset_dims[-1] < out_rank:
        raise ShapeError(f"gather: offset_dims {list(offset_dims)} out of range for a result of rank "
                         f"{out_rank}")
    if len(offset_dims) != len(plan.window_dims):
        raise ShapeError(f"gather: {len(offset_dims)} offset_dims + {len(dims.collapsed_slice_dims)} "
                         f"collapsed_slice_dims + {len(dims.operand_batching_dims)} operand_batching_dims "
                         f"must add up to the operand's rank {operand.rank}")
    batch = iter(plan.batch_shape)
    window = iter(sizes[d] for d in plan.window_dims)
    shape = tuple(next(window) if d in offset_dims else next(batch) for d in range(out_rank))
    return TensorType(operand.dtype, shape)


# --- scatter ---------------------------------------------------------------------------------

_SCATTER_WORDS = {"indices": "scatter indices", "index_map": "scatter_dims_to_operand_dims",
                  "collapsed": "inserted_window_dims", "operand_batching": "input_batching_dims",
                  "index_batching": "scatter_indices_batching_dims"}


def _scatter_parts(types: list[Type]) -> tuple[list[TensorType], TensorType, list[TensorType]]:
    if len(types) < 3 or len(types) % 2 == 0:
        raise ShapeError(f"scatter takes N operands, the indices and N updates (an odd count >= 3), "
                         f"got {len(types)} operands")
    n = len(types) // 2
    ts = tensors(types)
    return ts[:n], ts[n], ts[n + 1:]


def _scatter_plan(operand: TensorType, indices: TensorType, update: TensorType, attrs: dict) -> tuple[
        _Plan, ScatterDims, tuple[int, ...]]:
    """Validate; return the plan, the dims and the update's scatter dimensions."""
    dims = attrs.get("dims")
    if not isinstance(dims, ScatterDims):
        raise ShapeError("scatter needs its dimension numbers (dims: ScatterDims)")
    plan = _plan("scatter", operand, indices, dims.index_vector_dim, dims.scatter_dims_to_operand_dims,
                 dims.inserted_window_dims, dims.input_batching_dims, dims.scatter_indices_batching_dims,
                 _SCATTER_WORDS)
    uwd = tuple(dims.update_window_dims)
    want_rank = len(plan.batch_shape) + len(uwd)
    if update.rank != want_rank:
        raise ShapeError(f"scatter: updates must have rank {want_rank} ({len(plan.batch_shape)} scatter "
                         f"dimensions + {len(uwd)} update_window_dims), got {update}")
    if not _is_sorted_unique(uwd):
        raise ShapeError(f"scatter: update_window_dims {list(uwd)} must be sorted and unique")
    if uwd and not 0 <= uwd[0] <= uwd[-1] < update.rank:
        raise ShapeError(f"scatter: update_window_dims {list(uwd)} out of range for updates {update}")
    if len(uwd) != len(plan.window_dims):
        raise ShapeError(f"scatter: {len(uwd)} update_window_dims + {len(dims.inserted_window_dims)} "
                         f"inserted_window_dims + {len(dims.input_batching_dims)} input_batching_dims must "
                         f"add up to the operand's rank {operand.rank}")
    for u, d in zip(uwd, plan.window_dims):
        if update.shape[u] > operand.shape[d]:
            raise ShapeError(f"scatter: update window dimension {u} has size {update.shape[u]}, larger than "
                             f"operand dimension {d} ({operand.shape[d]})")
    scatter_dims = tuple(d for d in range(update.rank) if d not in uwd)
    for k, (u, s) in enumerate(zip(scatter_dims, plan.batch_shape)):
        if update.shape[u] != s:
            raise ShapeError(f"scatter: scatter dimension {u} of updates has size {update.shape[u]} but "
                             f"the scatter indices give {s} (their dimension "
                             f"{k + (k >= dims.index_vector_dim)})")
    return plan, dims, scatter_dims


def _same_ignoring_fp_precision(a: DType, b: DType) -> bool:
    return a is b or (a.is_float and b.is_float)


def _check_body(body: Any, operands: list[TensorType], updates: list[TensorType]) -> Computation:
    """The update computation, checked as XLA checks a reducer: 2N scalar parameters (N current
    values, N updates) returning a scalar (N = 1) or an N-tuple; result i has parameter i's type;
    the operands, the updates and parameters N+i match it up to floating-point precision."""
    if not isinstance(body, Computation):
        raise ShapeError("scatter needs an update computation (to_apply)")
    n = len(operands)
    if len(body.params) != 2 * n:
        raise ShapeError(f"scatter: update computation {body.name} must take {2 * n} parameters, "
                         f"takes {len(body.params)}")
    result = body.result_type
    results = result.elements if isinstance(result, TupleType) else (result,)
    if len(results) != n or (n > 1 and not isinstance(result, TupleType)):
        raise ShapeError(f"scatter: update computation {body.name} must return "
                         f"{'a scalar' if n == 1 else f'a {n}-tuple of scalars'}, returns {result}")
    for i, p in enumerate(body.params):
        if not isinstance(p.type, TensorType) or p.type.shape != ():
            raise ShapeError(f"scatter: parameter {i} of {body.name} must be a scalar, is {p.type}")
    for i, r in enumerate(results):
        if not isinstance(r, TensorType) or r.shape != ():
            raise ShapeError(f"scatter: {body.name} must return scalars, result {i} is {r}")
        acc, upd = body.params[i].type, body.params[n + i].type
        if r != acc:
            raise ShapeError(f"scatter: result {i} of {body.name} is {r} but its parameter {i} is {acc}")
        for what, t, d in (("operand", operands[i], acc.dtype), ("updates", updates[i], upd.dtype),
                           (f"result {i} of {body.name}", r, upd.dtype)):
            if not _same_ignoring_fp_precision(t.dtype, d):
                raise ShapeError(f"scatter: {what} {i} is {t.dtype.name} but {body.name} takes "
                                 f"{d.name} (parameter {i if what == 'operand' else n + i})")
    return body


# Bodies whose every result combines its operand and update with one of these (either argument
# order; all are commutative) run with numpy's unbuffered ufunc.at, which applies repeated targets
# one after another in update order, rounding after each step as the body would (ml_dtypes' low
# floats compute in fp32 and round, like the elementwise operators).
_UFUNCS = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum}
_REPLACE = "replace"


def _combiners(body: Computation, n: int) -> list[str] | None:
    """Per result, the combining operator's name (or "replace"); None when any result is something else."""
    root = body.root
    outs: tuple[Node, ...] = root.operands if root.op == "tuple" else (root,)
    if len(outs) != n:
        return None
    kinds = []
    for i, out in enumerate(outs):
        cur, upd = body.params[i], body.params[n + i]
        if out is upd:
            kinds.append(_REPLACE)
        elif out.op in _UFUNCS and sorted(o.id for o in out.operands) == sorted((cur.id, upd.id)):
            kinds.append(out.op)
        else:
            return None
    return kinds


def _scatter_impl(args: list[Any], attrs: dict, ctx: Ctx) -> Any:
    n = len(args) // 2
    operands, indices, updates = args[:n], args[n], args[n + 1:]
    plan, dims, scatter_dims = _scatter_plan(_ttype(operands[0]), _ttype(indices), _ttype(updates[0]), attrs)
    body: Computation = attrs["to_apply"]
    outs = [np.array(o, copy=True) for o in operands]
    shape = plan.operand_shape
    if updates[0].size == 0 or math.prod(shape) == 0:
        return outs[0] if n == 1 else tuple(outs)
    # The window per operand dimension: the update's extent on window dims, 1 elsewhere.
    window = [1] * len(shape)
    for u, d in zip(dims.update_window_dims, plan.window_dims):
        window[d] = updates[0].shape[u]
    full = plan.batch_shape + tuple(window)
    starts = _starts(plan, indices)
    limit = np.asarray(shape, np.int64) - np.asarray(window, np.int64)
    valid = np.all((starts >= 0) & (starts <= limit), axis=-1)  # the whole window is in bounds
    keep = np.broadcast_to(valid.reshape(valid.shape + (1,) * len(shape)), full).ravel()
    # Updates in update order (scatter dims, then window dims), with the inserted and batching
    # operand dimensions as size-1 axes so that they line up with the targets.
    order = list(scatter_dims) + list(dims.update_window_dims)
    ups = [np.transpose(u, order).reshape(full).ravel()[keep] for u in updates]
    target = np.broadcast_to(_linear(starts, tuple(window), shape), full).ravel()[keep]
    if not len(target):
        return outs[0] if n == 1 else tuple(outs)
    flats = [o.reshape(-1) for o in outs]
    kinds = _combiners(body, n)
    same_types = all(p.type.dtype.np == a.dtype for p, a in zip(body.params, [*operands, *updates]))
    if kinds is not None and same_types:
        for k, f, u in zip(kinds, flats, ups):
            if k == _REPLACE:
                # The last update of a target wins, as applying them in order would give.
                last = len(target) - 1 - np.unique(target[::-1], return_index=True)[1]
                f[target[last]] = u[last]
            else:
                _UFUNCS[k].at(f, target, u)
    else:
        _apply_in_rounds(ctx, body, flats, target, ups)
    return outs[0] if n == 1 else tuple(outs)


@op("scatter", engine=GPSIMD, arity=(3, None), neuron=("Scatter",), impl=_scatter_impl,
    notes="variadic; XLA dimension numbers incl. batching dims; an update whose window is out of "
          "bounds is skipped; add/mul/max/min/replace bodies run vectorized, any other body exactly")
def _scatter(types: list[Type], attrs: dict) -> Type:
    operands, indices, updates = _scatter_parts(types)
    for o in operands[1:]:
        if o.shape != operands[0].shape:
            raise ShapeError(f"scatter: operands must share one shape: {operands[0]} vs {o}")
    for u in updates[1:]:
        if u.shape != updates[0].shape:
            raise ShapeError(f"scatter: updates must share one shape: {updates[0]} vs {u}")
    _scatter_plan(operands[0], indices, updates[0], attrs)
    _check_body(attrs.get("to_apply"), operands, updates)
    return operands[0] if len(operands) == 1 else TupleType(tuple(operands))


def _apply_in_rounds(ctx: Ctx, body: Computation, flats: list[np.ndarray], target: np.ndarray,
                     ups: list[np.ndarray]) -> None:
    """Apply an arbitrary body in update order: round r applies every target's r-th update, so each
    round has distinct targets and runs as one whole-array call of the body."""
    m = len(target)
    by_target = np.argsort(target, kind="stable")  # update order kept within a target
    sorted_t = target[by_target]
    first = np.r_[True, sorted_t[1:] != sorted_t[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(m), 0))
    rank = np.arange(m) - group_start  # how many earlier updates hit the same target
    by_round = by_target[np.argsort(rank, kind="stable")]
    bounds = np.r_[0, np.cumsum(np.bincount(rank))]
    for r in range(len(bounds) - 1):
        sel = by_round[bounds[r]:bounds[r + 1]]
        t = target[sel]
        args = [f[t] for f in flats] + [u[sel] for u in ups]
        result = ctx.call(body, [dt.cast(a, p.type.dtype) for a, p in zip(args, body.params)])
        results = result if isinstance(result, tuple) else (result,)
        for f, v in zip(flats, results):
            f[t] = np.broadcast_to(dt.cast(np.asarray(v), dt.from_numpy(f.dtype)), t.shape)


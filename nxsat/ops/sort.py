"""Sorting operators: sort (variadic, with a comparator computation) and topk.

sort orders 1-D slices along ``dimension`` by a comparator ``to_apply(lhs0, rhs0, lhs1, rhs1, ...)``
that says whether lhs goes strictly before rhs; all operands move together. nxsat always sorts
stably (a valid result for ``is_stable=false`` too). A comparator that is one LT/GT compare of
parameters 0 and 1 sorts with numpy's stable argsort; any other comparator (multi-key, as JAX
lowers lexicographic sorts; compare chains with select, as JAX canonicalises NaN and -0) runs a
bottom-up merge sort whose merges are vectorised binary searches: each step evaluates the
comparator once over whole arrays, O(log^2 n) interpreter calls in all.

NaN placement: TOTALORDER compares (which JAX emits, after mapping -0 to 0 and every NaN to one
NaN) order -NaN < -inf < -0 < +0 < inf < +NaN. Under FLOAT compares NaN is unordered, so the result
depends on the sort routine: with a single compare nxsat does what XLA CPU does for rows of up to
128 elements (each NaN stays in place, the runs between NaNs are sorted); longer rows, where XLA
switches to merging, and general comparators that leave NaN unordered get a valid permutation that
may differ from XLA's.

topk returns the k largest (or smallest) values along the last dimension and their s32 indices,
in the order XLA CPU gives: IEEE totalOrder (-NaN < -inf < -0 < +0 < inf < +NaN), ties broken by
the lower index first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.ir import Computation, TensorType, TupleType, Type
from nxsat.ops.common import tensor, tensors
from nxsat.ops.elementwise import total_order_key
from nxsat.ops.registry import GPSIMD, VECTOR, Ctx, ShapeError, op

# --- sort ------------------------------------------------------------------------------------


def _check_comparator(comp: Any, operands: list[TensorType], name: str) -> Computation:
    """XLA's rule: 2N scalar parameters, the pair (2i, 2i+1) of operand i's type; returns pred[]."""
    if not isinstance(comp, Computation):
        raise ShapeError(f"{name} needs a comparator computation (to_apply)")
    if len(comp.params) != 2 * len(operands):
        raise ShapeError(f"{name}: comparator {comp.name} must take {2 * len(operands)} parameters "
                         f"(two per operand), takes {len(comp.params)}")
    for i, p in enumerate(comp.params):
        want = TensorType(operands[i // 2].dtype, ())
        if p.type != want:
            raise ShapeError(f"{name}: comparator parameter {i} is {p.type}, expected {want} "
                             f"(operand {i // 2})")
    if comp.result_type != TensorType(dt.PRED, ()):
        raise ShapeError(f"{name}: comparator {comp.name} must return pred[], returns {comp.result_type}")
    return comp


def _sort_infer(types: list[Type], attrs: dict) -> Type:
    ts = tensors(types)
    if not ts:
        raise ShapeError("sort needs at least one operand")
    for i, t in enumerate(ts[1:], 1):
        if t.shape != ts[0].shape:
            raise ShapeError(f"sort: operand {i} is {t}, operand 0 is {ts[0]}: dimensions must match")
    d = attrs.get("dimension")
    if not isinstance(d, int) or not 0 <= d < ts[0].rank:
        raise ShapeError(f"sort: dimension {d} out of range for {ts[0]}")
    _check_comparator(attrs.get("to_apply"), ts, "sort")
    return ts[0] if len(ts) == 1 else TupleType(tuple(ts))


def _simple_order(comp: Computation, keys: np.ndarray) -> np.ndarray | None:
    """When the comparator is one strict compare of parameters 0 and 1, the sorting permutation of
    ``keys`` ((B, n) rows) without running it; else None."""
    root = comp.root
    if root.op != "compare" or root.attrs.get("direction") not in ("LT", "GT"):
        return None
    a, b = root.operands
    p0, p1 = comp.params[0], comp.params[1]
    if (a, b) == (p0, p1):
        descending = root.attrs["direction"] == "GT"
    elif (a, b) == (p1, p0):
        descending = root.attrs["direction"] == "LT"
    else:
        return None
    if not dt.from_numpy(keys.dtype).is_float:
        return stable_argsort(keys, descending)
    if root.attrs.get("type") == "TOTALORDER":
        return stable_argsort(total_order_key(keys), descending)
    f = keys.astype(np.float32) if keys.itemsize < 4 else keys
    nan = np.isnan(f)
    if not nan.any():
        return stable_argsort(f, descending)  # -0 == +0: they keep their order
    # NaN is unordered under FLOAT compares (no strict weak order). XLA CPU sorts rows of up to 128
    # elements by insertion (libc++): every NaN stays where it is and the runs between NaNs are
    # sorted, stably. nxsat does that for any row length.
    run = np.cumsum(nan, axis=-1)
    key = np.where(nan, 0, -f if descending else f)
    return np.lexsort((key, ~nan, run), axis=-1)


def stable_argsort(key: np.ndarray, descending: bool) -> np.ndarray:
    """Stable argsort along the last axis; equal keys keep index order in both directions."""
    if not descending:
        return np.argsort(key, axis=-1, kind="stable")
    n = key.shape[-1]
    # Sorting the reversed row ascending puts equal keys in falling index order; reversing that
    # result gives a descending order with equal keys in rising index order.
    order = np.argsort(key[..., ::-1], axis=-1, kind="stable")
    return (n - 1 - order)[..., ::-1]


def _merge_sort(rows: list[np.ndarray], comp: Computation, ctx: Ctx) -> np.ndarray:
    """Stable bottom-up merge sort of ``rows`` ((B, n) arrays sorted together) by ``comp``.

    Merging runs L and R of width w: an element of L moves forward by the number of R elements
    that go strictly before it, an element of R by the number of L elements that do not go after
    it. Both counts are binary searches in a sorted run, done for every element at once: each
    halving step is one comparator call on whole arrays. Returns the permutation, (B, n)."""
    b, n = rows[0].shape
    perm = np.broadcast_to(np.arange(n), (b, n)).copy()
    pos = np.arange(n)
    width = 1
    while width < n:
        cur = [np.take_along_axis(r, perm, axis=1) for r in rows]
        block = pos // (2 * width) * (2 * width)
        mid = np.minimum(block + width, n)
        end = np.minimum(block + 2 * width, n)
        left = pos < mid
        other = np.where(left, mid, block)
        lo = np.zeros((b, n), np.int64)
        hi = np.broadcast_to(np.where(left, end - mid, mid - block), (b, n)).copy()
        while True:
            active = lo < hi
            if not active.any():
                break
            m = (lo + hi) // 2
            probe = np.minimum(other + m, n - 1)
            args: list[np.ndarray] = []
            for c in cur:
                pv = np.take_along_axis(c, probe, axis=1)
                args += [np.where(left, pv, c), np.where(left, c, pv)]
            before = np.broadcast_to(np.asarray(ctx.call(comp, args), dtype=bool), (b, n))
            forward = active & np.where(left, before, ~before)
            lo = np.where(forward, m + 1, lo)
            hi = np.where(active & ~forward, m, hi)
        target = block + (pos - np.where(left, block, mid)) + lo
        # A consistent comparator makes ``target`` a permutation; ordering by (target, position)
        # keeps the result a permutation for any comparator.
        perm = np.take_along_axis(perm, np.argsort(target * n + pos, axis=1, kind="stable"), axis=1)
        width *= 2
    return perm


def _sort_impl(args: list[Any], attrs: dict, ctx: Ctx) -> Any:
    d = attrs["dimension"]
    comp: Computation = attrs["to_apply"]
    moved = [np.moveaxis(np.asarray(a), d, -1) for a in args]
    shape = moved[0].shape
    n = shape[-1]
    rows = [m.reshape(-1, n) for m in moved]
    perm = np.broadcast_to(np.arange(n), rows[0].shape) if rows[0].size == 0 or n <= 1 else \
        _simple_order(comp, rows[0])
    if perm is None:
        perm = _merge_sort(rows, comp, ctx)
    outs = [np.ascontiguousarray(np.moveaxis(np.take_along_axis(r, perm, axis=1).reshape(shape), -1, d))
            for r in rows]
    return outs[0] if len(outs) == 1 else tuple(outs)


op("sort", engine=GPSIMD, arity=(1, None), impl=_sort_impl, neuron=("Sort",),
   notes="variadic, any comparator computation; always stable. GpSimd: a data-dependent permutation "
         "needs general-purpose cores (VectorE has no cross-element sort)")(_sort_infer)


# --- topk ------------------------------------------------------------------------------------

def _topk_infer(types: list[Type], attrs: dict) -> Type:
    if len(types) != 1:
        raise ShapeError(f"topk takes one operand, got {len(types)}")
    x = tensor(types[0])
    k = attrs.get("k")
    if x.rank < 1:
        raise ShapeError(f"topk: the operand must have rank >= 1, got {x}")
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= x.shape[-1]:
        raise ShapeError(f"topk: k = {k} must be within [0, {x.shape[-1]}] (the last dimension of {x})")
    if not isinstance(attrs.get("largest", True), bool):
        raise ShapeError("topk: largest must be true or false")
    out = x.shape[:-1] + (k,)
    return TupleType((TensorType(x.dtype, out), TensorType(dt.S32, out)))


def topk_order(x: np.ndarray, largest: bool) -> np.ndarray:
    """Indices ordering the last axis as XLA's TopK does (totalOrder, lower index first on ties)."""
    key = total_order_key(x) if dt.from_numpy(x.dtype).is_float else x
    return stable_argsort(key, descending=largest)


def _topk_impl(args: list[Any], attrs: dict, ctx: Ctx) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(args[0])
    k = attrs["k"]
    idx = topk_order(x, attrs.get("largest", True))[..., :k]
    return np.ascontiguousarray(np.take_along_axis(x, idx, axis=-1)), idx.astype(np.int32)


op("topk", engine=VECTOR, arity=(1, 1), impl=_topk_impl, neuron=("TopK",),
   notes="k largest (or smallest) along the last dimension, with s32 indices; totalOrder, ties to the "
         "lower index. VectorE: its max8/find-index8 instructions take the 8 largest per partition per "
         "pass (computing in fp32); the device refuses integer input (NCC_EVRF013)")(_topk_infer)

"""Reductions: reduce, reduce-window and select-and-scatter.

XLA leaves the order of a reduction unspecified (its bodies are meant to be associative and
commutative), so the reference picks the most accurate cheap order. A body that is one binary
operator of its two parameters (add, multiply, maximum, minimum, and, or, xor) runs as a numpy
ufunc reduction; floats below 32 bits accumulate in fp32 (as XLA CPU does) and round once. Any
other body (variadic argmax, ...) runs through the interpreter on whole arrays, pairing neighbours
in a tree: log2(n) body calls, each over every lane at once. The init value enters exactly once.
Window positions that fall into padding or between base-dilated elements are skipped, as XLA CPU
skips them (for an identity init this equals padding with the init value).

The window helpers here (:func:`window_output_shape`, :func:`windows`) are shared with
convolution (:mod:`nxsat.ops.linalg`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from nxsat import dtypes as dt
from nxsat.attrs import WindowDim
from nxsat.diagnostics import error
from nxsat.dtypes import DType
from nxsat.ir import Computation, TensorType, TupleType, Type
from nxsat.ops.common import check_dims, compute_float, dims_attr, tensor, tensors, to_dtype
from nxsat.ops.registry import VECTOR, Ctx, ShapeError, op

# The general (body-interpreting) paths materialise every window element; refuse beyond this many
# so that a pathological window ends with a diagnostic instead of exhausting memory.
MAX_WINDOW_ELEMENTS = 1 << 28


# --- shared checks ---------------------------------------------------------------------------

def similar(a: DType, b: DType) -> bool:
    """XLA's "compatible ignoring floating-point precision" for element types."""
    return a is b or (a.is_float and b.is_float)


def body_attr(attrs: dict, key: str, name: str) -> Computation:
    c = attrs.get(key)
    if not isinstance(c, Computation):
        raise ShapeError(f"{name} needs a computation for {key}")
    return c


def check_reducer(body: Computation, inits: Sequence[Type], input_dtypes: Sequence[DType],
                  name: str) -> list[TensorType]:
    """XLA's checks of a reduction body ``(acc..., x...) -> acc...``; returns the accumulator
    types, which are the result element types."""
    n = len(inits)
    if len(body.params) != 2 * n:
        raise ShapeError(f"{name}: reduction computation {body.name} must take {2 * n} parameters, "
                         f"takes {len(body.params)}")
    result = body.result_type
    if isinstance(result, TupleType):
        if len(result.elements) != n:
            raise ShapeError(f"{name}: reduction computation {body.name} must produce {n} values, "
                             f"produces {len(result.elements)}")
        accs = list(result.elements)
    elif n != 1:
        raise ShapeError(f"{name}: reduction computation {body.name} must produce a tuple of {n} scalars, "
                         f"produces {result}")
    else:
        accs = [result]
    for acc in accs:
        if not isinstance(acc, TensorType) or acc.shape != ():
            raise ShapeError(f"{name}: reduction computation {body.name} must return scalars, "
                             f"returns {result}")
    for i, acc in enumerate(accs):
        p_acc, p_x, init = body.params[i].type, body.params[n + i].type, inits[i]
        if p_acc != acc:
            raise ShapeError(f"{name}: parameter {i} of {body.name} is {p_acc}, its result {i} is {acc}")
        if not isinstance(init, TensorType) or init.shape != () or not similar(init.dtype, acc.dtype):
            raise ShapeError(f"{name}: init value {i} is {init}, the accumulator of {body.name} is {acc}")
        if not isinstance(p_x, TensorType) or p_x.shape != () or not similar(p_x.dtype, acc.dtype):
            raise ShapeError(f"{name}: parameter {n + i} of {body.name} is {p_x}, "
                             f"must match its result {acc}")
        if not similar(input_dtypes[i], p_x.dtype):
            raise ShapeError(f"{name}: input {i} has element type {input_dtypes[i].name}, "
                             f"parameter {n + i} of {body.name} is {p_x}")
    return [acc for acc in accs if isinstance(acc, TensorType)]


def split_variadic(types: list[Type], name: str) -> tuple[list[TensorType], list[Type]]:
    """``N inputs, N init values``: the inputs (arrays of one shape) and the inits."""
    if not types or len(types) % 2:
        raise ShapeError(f"{name} needs N inputs followed by N init values, got {len(types)} operands")
    n = len(types) // 2
    xs = tensors(types[:n])
    for i, x in enumerate(xs[1:], 1):
        if x.shape != xs[0].shape:
            raise ShapeError(f"{name}: all inputs must have one shape; input 0 is {xs[0]}, input {i} is {x}")
    return xs, list(types[n:])


def window_output_shape(shape: Sequence[int], window: Any, name: str, *,
                        reversal: bool = False) -> tuple[int, ...]:
    """XLA's window arithmetic: dilate the base, pad it (negative padding crops), slide a dilated
    window with a stride; one output per position that fits."""
    if not isinstance(window, tuple) or not all(isinstance(w, WindowDim) for w in window):
        raise ShapeError(f"{name} needs a window")
    if len(window) != len(shape):
        raise ShapeError(f"{name}: window has {len(window)} dimensions, the operand has {len(shape)}")
    out = []
    for i, (n, w) in enumerate(zip(shape, window)):
        if w.size <= 0:
            raise ShapeError(f"{name}: window dimension {i} has non-positive size {w.size}")
        if w.stride <= 0:
            raise ShapeError(f"{name}: window dimension {i} has non-positive stride {w.stride}")
        if w.lhs_dilation < 1 or w.rhs_dilation < 1:
            raise ShapeError(f"{name}: window dimension {i} has a dilation below 1 "
                             f"(lhs {w.lhs_dilation}, rhs {w.rhs_dilation})")
        if w.reversal and not reversal:
            raise ShapeError(f"{name}: window reversal applies to convolution only")
        base = 0 if n == 0 else (n - 1) * w.lhs_dilation + 1
        if base + w.pad_lo + w.pad_hi < 0:
            raise ShapeError(f"{name}: padding {w.pad_lo}_{w.pad_hi} of window dimension {i} removes more "
                             f"than its {base} (dilated) elements")
        out.append(w.output_size(n))
    return tuple(out)


# --- windows ---------------------------------------------------------------------------------

def windows(x: np.ndarray, window: Sequence[WindowDim], fill: Any, ctx: Ctx) -> np.ndarray:
    """Every window of ``x`` over its last ``len(window)`` axes, as a strided view of shape
    ``leading axes + output positions + window sizes`` (window elements in row-major order).

    Base-dilation holes and padding hold ``fill``; negative padding crops. Only the dilated,
    padded base is materialised; the windows themselves are a view of it.
    """
    r = len(window)
    if r == 0:
        return x
    lead = x.shape[: x.ndim - r]
    spatial = x.shape[x.ndim - r:]
    padded = [(0 if n == 0 else (n - 1) * w.lhs_dilation + 1) + w.pad_lo + w.pad_hi
              for n, w in zip(spatial, window)]
    guard(math.prod(lead) * math.prod(padded), ctx)
    buf = np.full((*lead, *padded), fill, dtype=x.dtype)
    src, dst = [], []
    for n, w, p in zip(spatial, window, padded):
        d, lo = w.lhs_dilation, w.pad_lo
        first = max(0, -(lo // d))  # first element whose dilated, padded position is >= 0
        last = min(n, (p - 1 - lo) // d + 1)  # one past the last element that lands before p
        if last <= first:
            src.append(slice(0, 0))
            dst.append(slice(0, 0))
        else:
            src.append(slice(first, last))
            dst.append(slice(lo + first * d, lo + (last - 1) * d + 1, d))
    ell = (slice(None),) * len(lead)
    buf[ell + tuple(dst)] = x[ell + tuple(src)]
    sizes = tuple(w.size for w in window)
    out = tuple(w.output_size(n) for n, w in zip(spatial, window))
    if 0 in out:
        return np.empty((*lead, *out, *sizes), dtype=x.dtype)
    view = sliding_window_view(buf, tuple(w.dilated_size for w in window),
                               axis=tuple(range(len(lead), x.ndim)))
    return view[ell + tuple(slice(None, None, w.stride) for w in window)
                + tuple(slice(None, None, w.rhs_dilation) for w in window)]


def window_valid(shape: Sequence[int], window: Sequence[WindowDim], ctx: Ctx) -> np.ndarray:
    """Which window elements are real operand elements (not padding, not dilation holes)."""
    return windows(np.ones(tuple(shape), dtype=bool), window, False, ctx)


def guard(elements: int, ctx: Ctx) -> None:
    """Refuse to materialise absurd windows (huge padding or dilation) with a diagnostic."""
    if elements > MAX_WINDOW_ELEMENTS:
        raise error("NCC_EEXE001", f"{ctx.node.op} {ctx.node.name} would materialise {elements} window "
                    f"elements (limit {MAX_WINDOW_ELEMENTS}) in the reference interpreter", ctx.node.loc)


# --- folding with a body ---------------------------------------------------------------------

def _ufunc_for(op_name: str, d: DType) -> np.ufunc | None:
    logic = d.is_pred
    return {
        "add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
        "and": np.logical_and if logic else np.bitwise_and,
        "or": np.logical_or if logic else np.bitwise_or,
        "xor": np.logical_xor if logic else np.bitwise_xor,
    }.get(op_name)


def binary_ufunc(body: Computation) -> np.ufunc | None:
    """The numpy ufunc when ``body`` is ``op(p0, p1)`` of its two parameters (either order)."""
    if len(body.params) != 2:
        return None
    p0, p1 = body.params
    root = body.root
    if len(root.operands) != 2 or {o.id for o in root.operands} != {p0.id, p1.id}:
        return None
    if p0.type != p1.type or root.type != p0.type or not isinstance(p0.type, TensorType):
        return None
    return _ufunc_for(root.op, p0.type.dtype)


def _identity(ufunc: np.ufunc, dtype: np.dtype) -> np.ndarray:
    """The element that leaves ``ufunc`` unchanged: what skipped window positions hold."""
    if ufunc in (np.maximum, np.minimum):
        low = ufunc is np.maximum
        if dtype == np.bool_:
            return np.array(not low)
        if dtype.kind == "f":
            return np.array(-np.inf if low else np.inf, dtype)
        info = np.iinfo(dtype)
        return np.array(info.min if low else info.max, dtype)
    return np.array(ufunc.identity).astype(dtype)


def _ufunc_reduce(ufunc: np.ufunc, x: np.ndarray, axes: tuple[int, ...], init: np.ndarray,
                  out: DType) -> np.ndarray:
    cx, ci = compute_float(x), compute_float(np.asarray(init))
    if any(x.shape[a] == 0 for a in axes):
        shape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
        return to_dtype(np.broadcast_to(ci, shape), out)
    return to_dtype(ufunc(ufunc.reduce(cx, axis=axes), ci), out)


def _check_scalar_body(body: Computation, ctx: Ctx) -> None:
    for node in body.post_order():
        if any(t.shape != () for t in node.type.leaves()):
            raise error("NCC_EUOC002", f"{ctx.node.op} {ctx.node.name}: its computation {body.name} computes "
                        f"on arrays ({node.name} is {node.type}); only scalar computations are supported",
                        ctx.node.loc)


def apply_body(ctx: Ctx, body: Computation, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a scalar computation once over whole arrays (every lane at once); its results, as a
    list, broadcast to the arguments' shape."""
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    out = ctx.call(body, list(args))
    leaves = list(out) if isinstance(out, tuple) else [out]
    return [np.broadcast_to(np.asarray(v), shape) for v in leaves]


def _tree(ctx: Ctx, body: Computation, xs: list[np.ndarray],
          valid: np.ndarray | None) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Combine neighbours along the last axis until one element is left; skipped elements
    (``valid`` False) pass their partner through."""
    k = xs[0].shape[-1]
    while k > 1:
        h = k // 2
        left = [x[..., 0:2 * h:2] for x in xs]
        right = [x[..., 1:2 * h:2] for x in xs]
        both = apply_body(ctx, body, left + right)
        if valid is not None:
            lv, rv = valid[..., 0:2 * h:2], valid[..., 1:2 * h:2]
            both = [np.where(lv & rv, c, np.where(lv, a, b)) for c, a, b in zip(both, left, right)]
            merged = lv | rv
        if k % 2:
            both = [np.concatenate([c, x[..., -1:]], axis=-1) for c, x in zip(both, xs)]
            if valid is not None:
                merged = np.concatenate([merged, valid[..., -1:]], axis=-1)
        xs = both
        if valid is not None:
            valid = merged
        k = h + k % 2
    return [x[..., 0] for x in xs], (None if valid is None else valid[..., 0])


def fold(ctx: Ctx, body: Computation, inits: Sequence[np.ndarray], xs: Sequence[np.ndarray],
         valid: np.ndarray | None = None) -> list[np.ndarray]:
    """Reduce the last axis of each of ``xs`` with ``body``, starting once from ``inits``.

    Where ``valid`` is False an element is skipped. When the body's accumulators and inputs share
    types the combination is a pairwise tree; a mixed-precision body (f32 accumulator, bf16 inputs)
    must see every input through its input parameters, so it folds left to right.
    """
    _check_scalar_body(body, ctx)
    n = len(xs)
    acc_t = [p.type.dtype for p in body.params[:n]]
    x_t = [p.type.dtype for p in body.params[n:]]
    xs = [to_dtype(x, t) for x, t in zip(xs, x_t)]
    shape = xs[0].shape[:-1]
    accs = [np.broadcast_to(to_dtype(i, t), shape) for i, t in zip(inits, acc_t)]
    k = xs[0].shape[-1]
    if k == 0:
        return [np.array(a) for a in accs]
    if all(a is b for a, b in zip(acc_t, x_t)):
        parts, any_valid = _tree(ctx, body, list(xs), valid)
        out = apply_body(ctx, body, accs + parts)
        if any_valid is not None:
            out = [np.where(any_valid, o, a) for o, a in zip(out, accs)]
        return [np.array(o) for o in out]
    for j in range(k):
        step = apply_body(ctx, body, accs + [x[..., j] for x in xs])
        accs = step if valid is None else [np.where(valid[..., j], s, a) for s, a in zip(step, accs)]
    return [np.array(a) for a in accs]


def _result(outs: list[np.ndarray], body: Computation) -> Any:
    return outs[0] if not isinstance(body.result_type, TupleType) else tuple(outs)


# --- reduce ----------------------------------------------------------------------------------

def _reduce_impl(args: list[Any], attrs: dict, ctx: Ctx) -> Any:
    n = len(args) // 2
    xs, inits = args[:n], args[n:]
    body: Computation = attrs["to_apply"]
    dims = tuple(sorted(attrs["dimensions"]))
    ufunc = binary_ufunc(body) if n == 1 else None
    if ufunc is not None:
        d = body.root.type.dtype  # inputs enter the body in its type (XLA converts them)
        return _ufunc_reduce(ufunc, to_dtype(xs[0], d), dims, inits[0], d)
    x0 = xs[0]
    keep = [d for d in range(x0.ndim) if d not in dims]
    shape = tuple(x0.shape[d] for d in keep)
    k = math.prod(x0.shape[d] for d in dims)
    flat = [np.transpose(x, keep + list(dims)).reshape((*shape, k)) for x in xs]
    return _result(fold(ctx, body, inits, flat), body)


def _reduce_flops(types: list[Type], out: Type, attrs: dict) -> int:
    n = len(types) // 2
    return sum(tensor(t).size for t in types[:n])


@op("reduce", engine=VECTOR, impl=_reduce_impl, flops=_reduce_flops, arity=(2, None), neuron=("Reduce",),
    notes="variadic (N inputs, N init values; argmax-style bodies); add/mul/min/max/and/or/xor bodies "
          "run as one VectorE reduction; other bodies are evaluated pairwise")
def _reduce(types: list[Type], attrs: dict) -> Type:
    xs, inits = split_variadic(types, "reduce")
    body = body_attr(attrs, "to_apply", "reduce")
    dims = dims_attr(attrs)
    check_dims(dims, xs[0].rank, "reduce")
    accs = check_reducer(body, inits, [x.dtype for x in xs], "reduce")
    shape = tuple(n for i, n in enumerate(xs[0].shape) if i not in dims)
    outs = [TensorType(a.dtype, shape) for a in accs]
    return outs[0] if not isinstance(body.result_type, TupleType) else TupleType(tuple(outs))


# --- reduce-window ---------------------------------------------------------------------------

def _reduce_window_impl(args: list[Any], attrs: dict, ctx: Ctx) -> Any:
    n = len(args) // 2
    xs, inits = args[:n], args[n:]
    body: Computation = attrs["to_apply"]
    window: tuple[WindowDim, ...] = attrs["window"]
    r = xs[0].ndim
    ufunc = binary_ufunc(body) if n == 1 else None
    if ufunc is not None:
        d = body.root.type.dtype
        cx = compute_float(to_dtype(xs[0], d))
        view = windows(cx, window, _identity(ufunc, cx.dtype), ctx)
        red = ufunc.reduce(view, axis=tuple(range(r, 2 * r))) if r else view
        return to_dtype(ufunc(red, compute_float(np.asarray(inits[0]))), d)
    out = window_output_shape(xs[0].shape, window, "reduce-window")
    k = math.prod(w.size for w in window)
    guard(math.prod(out) * k * n, ctx)
    vals = [np.reshape(windows(x, window, np.zeros((), x.dtype), ctx), (*out, k)) for x in xs]
    valid = np.reshape(window_valid(xs[0].shape, window, ctx), (*out, k))
    return _result(fold(ctx, body, inits, vals, None if valid.all() else valid), body)


def _reduce_window_flops(types: list[Type], out: Type, attrs: dict) -> int:
    window = attrs.get("window", ())
    return sum(leaf.size for leaf in out.leaves()) * math.prod(w.size for w in window)


@op("reduce-window", engine=VECTOR, impl=_reduce_window_impl, flops=_reduce_window_flops, arity=(2, None),
    neuron=("ReduceWindow",),
    notes="pooling, cumulative sums: window with strides, padding (negative crops), base and window "
          "dilation; variadic; padding and dilation holes are skipped")
def _reduce_window(types: list[Type], attrs: dict) -> Type:
    xs, inits = split_variadic(types, "reduce-window")
    body = body_attr(attrs, "to_apply", "reduce-window")
    accs = check_reducer(body, inits, [x.dtype for x in xs], "reduce-window")
    shape = window_output_shape(xs[0].shape, attrs.get("window"), "reduce-window")
    outs = [TensorType(a.dtype, shape) for a in accs]
    return outs[0] if not isinstance(body.result_type, TupleType) else TupleType(tuple(outs))


# --- select-and-scatter ----------------------------------------------------------------------

def _select_and_scatter_impl(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
    operand, source, init = args
    window: tuple[WindowDim, ...] = attrs["window"]
    select: Computation = attrs["select"]
    scatter: Computation = attrs["scatter"]
    _check_scalar_body(select, ctx)
    _check_scalar_body(scatter, ctx)
    out_shape, k = source.shape, math.prod(w.size for w in window)
    guard(source.size * k, ctx)
    # Each window selects one operand element: the first in row-major window order, replaced by a
    # later one whenever select(current, later) is false (XLA's rule); padding is never selected.
    vals = np.reshape(windows(to_dtype(operand, select.params[0].type.dtype), window,
                              np.zeros((), operand.dtype), ctx), (*out_shape, k))
    where = np.arange(operand.size, dtype=np.int64).reshape(operand.shape)
    idx = np.reshape(windows(where, window, np.int64(-1), ctx), (*out_shape, k))
    chosen, chosen_at, seen = vals[..., 0], idx[..., 0], idx[..., 0] >= 0
    for j in range(1, k):
        cur, at = vals[..., j], idx[..., j]
        keep = apply_body(ctx, select, [chosen, cur])[0].astype(bool)
        take = (at >= 0) & ~(seen & keep)
        chosen, chosen_at, seen = np.where(take, cur, chosen), np.where(take, at, chosen_at), seen | (at >= 0)
    # Scatter: out[chosen] = scatter(out[chosen], source) in source row-major order. Targets that
    # several windows chose are updated in rounds (the r-th update of every target in round r).
    acc_t, src_t = scatter.params[0].type.dtype, scatter.params[1].type.dtype
    out = np.full(operand.size, to_dtype(init, acc_t), dtype=acc_t.np)
    targets = chosen_at.reshape(-1)[seen.reshape(-1)]
    values = to_dtype(source, src_t).reshape(-1)[seen.reshape(-1)]
    order = np.argsort(targets, kind="stable")
    targets, values = targets[order], values[order]
    pos = np.arange(targets.size)
    first = np.ones(targets.size, dtype=bool)
    first[1:] = targets[1:] != targets[:-1]
    rank = pos - np.maximum.accumulate(np.where(first, pos, 0))
    for r in range(int(rank.max()) + 1 if rank.size else 0):
        m = rank == r
        t = targets[m]
        out[t] = apply_body(ctx, scatter, [out[t], values[m]])[0]
    return to_dtype(out.reshape(operand.shape), ctx.node.tensor.dtype)


def _select_and_scatter_flops(types: list[Type], out: Type, attrs: dict) -> int:
    src = tensor(types[1]) if len(types) > 1 else tensor(out)
    return src.size * (math.prod(w.size for w in attrs.get("window", ())) + 1)


@op("select-and-scatter", engine=VECTOR, impl=_select_and_scatter_impl, flops=_select_and_scatter_flops,
    arity=(3, 3), neuron=("SelectAndScatter",),
    notes="max-pool gradient: select picks one element per window, scatter combines source values into "
          "the picks; the init value fills the rest")
def _select_and_scatter(types: list[Type], attrs: dict) -> Type:
    operand, source, init = tensors(types)
    select = body_attr(attrs, "select", "select-and-scatter")
    scatter = body_attr(attrs, "scatter", "select-and-scatter")
    if len(select.params) != 2:
        raise ShapeError(f"select-and-scatter: select computation {select.name} must take 2 parameters, "
                         f"takes {len(select.params)}")
    if select.result_type != TensorType(dt.PRED, ()):
        raise ShapeError(f"select-and-scatter: select computation {select.name} must return pred[], "
                         f"returns {select.result_type}")
    for i, p in enumerate(select.params):
        t = p.type
        if not (isinstance(t, TensorType) and t.shape == () and similar(t.dtype, operand.dtype)):
            raise ShapeError(f"select-and-scatter: parameter {i} of {select.name} is {t}, "
                             f"the operand's elements are {operand.dtype.name}")
    check_reducer(scatter, [init], [source.dtype], "select-and-scatter")
    shape = window_output_shape(operand.shape, attrs.get("window"), "select-and-scatter")
    if source.shape != shape or not similar(source.dtype, operand.dtype):
        raise ShapeError(f"select-and-scatter: source is {source}, the windows of {operand} give "
                         f"{TensorType(operand.dtype, shape)}")
    return operand

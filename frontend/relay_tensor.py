"""Lowerings of Relay's tensor operators: elementwise beyond the registry's 1:1 spellings,
comparisons, shapes and layouts, slicing, reductions, indexing and tensor creation.

Shape rules follow TVM's type relations (reshape's 0/-1/-2/-3/-4, strided_slice's clamping,
split sections, reductions with ``axis``/``keepdims``/``exclude``); each lowers to registry
operators, so the IR's reference semantics are the only semantics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nxsat import dtypes as dt
from nxsat.attrs import GatherDims, SliceDim
from nxsat.builder import Builder
from nxsat.frontend.relay_lower import Call, Emitter, Value, lowering, normalize_axis
from nxsat.ir import Node, TensorType

# --- elementwise -----------------------------------------------------------------------------

_COMPARE = {
    "equal": "EQ",
    "not_equal": "NE",
    "less": "LT",
    "less_equal": "LE",
    "greater": "GT",
    "greater_equal": "GE",
}


@lowering(*_COMPARE, notes="compare (broadcast operands)")
def _compare(em: Emitter, call: Call) -> Value:
    a, b = call.tensors(2)
    return em.compare(_COMPARE[call.op], a, b)


@lowering("where", notes="select (cond, x, y broadcast to one shape)")
def _where(em: Emitter, call: Call) -> Value:
    c, a, b = call.tensors(3)
    return em.select(c, a, b)


@lowering("right_shift", notes="shift-right-arithmetic; shift-right-logical for unsigned")
def _right_shift(em: Emitter, call: Call) -> Value:
    a, b = call.tensors(2)
    op = "shift-right-logical" if a.dtype.kind == "uint" else "shift-right-arithmetic"
    return em.binary(op, a, b)


@lowering("bitwise_not", notes="not (integers)")
def _bitwise_not(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    if not x.dtype.is_int:
        raise em.fail("NCC_EVRF064", f"bitwise_not is defined on integers, not {x.dtype.relay}")
    return em.op("not", [x])


@lowering("fast_exp", notes="exponential (exact, not TVM's approximation)")
@lowering("fast_tanh", notes="tanh (exact, not TVM's approximation)")
@lowering("fast_erf", notes="erf (exact, not TVM's approximation)")
def _fast(em: Emitter, call: Call) -> Value:
    # TVM's fast_* approximate their exact counterparts; nxsat computes the exact function.
    (x,) = call.tensors(1)
    return em.op({"fast_exp": "exponential", "fast_tanh": "tanh", "fast_erf": "erf"}[call.op], [x])


@lowering("log2", "log10", notes="log times a constant")
def _log_base(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return em.scalar_binary("multiply", em.op("log", [x]), 1.0 / math.log(2.0 if call.op == "log2" else 10.0))


def _trunc_node(em: Emitter, x: Node) -> Node:
    if not x.dtype.is_float:
        return x
    neg = em.compare("LT", x, em.full(0, x.dtype, x.shape))
    return em.op("select", [neg, em.op("ceil", [x]), em.op("floor", [x])])


@lowering("trunc", notes="select of ceil and floor")
def _trunc(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return _trunc_node(em, x)


@lowering("isnan", notes="compare NE of x with itself")
def _isnan(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return em.compare("NE", x, x)


@lowering("isinf", notes="compare of abs with inf")
def _isinf(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    if not x.dtype.is_float:
        return em.full(False, dt.PRED, x.shape)
    return em.compare("EQ", em.op("abs", [x]), em.full(np.inf, x.dtype, x.shape))


@lowering("copy", notes="copy")
def _copy(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return em.op("copy", [x])


@lowering("stop_gradient", "annotation.stop_fusion", notes="identity (inference)")
def _identity(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return x


def _floor_div(em: Emitter, a: Node, b: Node) -> Node:
    if a.dtype.is_float:
        return em.op("floor", [em.op("divide", [a, b])])
    q = em.op("divide", [a, b])
    if a.dtype.kind != "int":
        return q
    # Truncating quotient, one less where the remainder is non-zero and the signs differ.
    r = em.op("remainder", [a, b])
    zero = em.full(0, a.dtype, a.shape)
    fix = em.op(
        "and",
        [em.compare("NE", r, zero), em.compare("NE", em.compare("LT", r, zero), em.compare("LT", b, zero))],
    )
    return em.op("subtract", [q, em.convert(fix, a.dtype)])


@lowering(
    "floor_divide",
    "floor_mod",
    "trunc_divide",
    "trunc_mod",
    notes="divide / remainder with floor or trunc correction",
)
def _div_mod(em: Emitter, call: Call) -> Value:
    a, b = call.tensors(2)
    em.same_dtype(call.op, a, b)
    shape = em.broadcast_shape(a.shape, b.shape)
    a, b = em.broadcast_to(a, shape), em.broadcast_to(b, shape)
    if call.op == "trunc_divide":
        q = em.op("divide", [a, b])
        return _trunc_node(em, q)
    if call.op == "trunc_mod":
        return em.op("remainder", [a, b])
    q = _floor_div(em, a, b)
    if call.op == "floor_divide":
        return q
    return em.op("subtract", [a, em.op("multiply", [q, b])])


@lowering("clip", notes="clamp with scalar bounds")
def _clip(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    lo, hi = call.attrs.float("a_min"), call.attrs.float("a_max")
    if x.dtype.is_int:
        # Integer tensors clip to the integers inside [a_min, a_max], within the type's range.
        info = np.iinfo(x.dtype.np)
        lo = info.min if lo < info.min else min(math.ceil(lo), info.max)
        hi = info.max if hi > info.max else max(math.floor(hi), info.min)
    return em.op("clamp", [em.const(lo, x.dtype), x, em.const(hi, x.dtype)])


@lowering("cast", notes="convert")
def _cast(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return em.convert(x, call.attrs.dtype("dtype", x.dtype) or x.dtype)


@lowering("cast_like", notes="convert")
def _cast_like(em: Emitter, call: Call) -> Value:
    x, like = call.tensors(2)
    return em.convert(x, like.dtype)


@lowering("reinterpret", notes="bitcast-convert (same width)")
def _reinterpret(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    d = call.attrs.dtype("dtype", x.dtype) or x.dtype
    if d.bits != x.dtype.bits:
        raise em.fail("NCC_EVRF064", f"reinterpret from {x.dtype.relay} to {d.relay} changes the bit width")
    return x if d is x.dtype else em.op("bitcast-convert", [x], dtype=d)


# --- creation --------------------------------------------------------------------------------


def _scalar_value(em: Emitter, v: Value, what: str) -> Node:
    if isinstance(v, tuple) or v.shape != ():
        raise em.fail("NCC_EVRF064", f"{what} must be a scalar")
    return v


def _shape_attr(em: Emitter, call: Call, key: str = "shape") -> tuple[int, ...]:
    shape = call.attrs.ints(key)
    if any(s < 0 for s in shape):
        raise em.fail("NCC_EPRS003", f"{call.op}: {key} {list(shape)} has a negative dimension")
    return shape


@lowering("zeros", "ones", notes="broadcast of a scalar constant")
def _zeros(em: Emitter, call: Call) -> Value:
    call.arity(0)
    shape = _shape_attr(em, call)
    d = call.attrs.dtype("dtype", dt.F32) or dt.F32
    return em.full(0 if call.op == "zeros" else 1, d, shape)


@lowering("full", notes="broadcast of the fill value")
def _full(em: Emitter, call: Call) -> Value:
    call.arity(1)
    v = _scalar_value(em, call.tensor(0), "full's fill value")
    shape = _shape_attr(em, call)
    d = call.attrs.dtype("dtype", v.dtype) or v.dtype
    return em.broadcast_in_dim(em.convert(v, d), shape, ())


@lowering("zeros_like", "ones_like", notes="broadcast of a scalar constant")
def _zeros_like(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return em.full(0 if call.op == "zeros_like" else 1, x.dtype, x.shape)


@lowering("full_like", notes="broadcast of the fill value")
def _full_like(em: Emitter, call: Call) -> Value:
    x, v = call.tensors(2)
    v = _scalar_value(em, v, "full_like's fill value")
    return em.broadcast_in_dim(em.convert(v, x.dtype), x.shape, ())


def _literal(em: Emitter, v: Node, what: str) -> float:
    if v.op != "constant" or v.attrs.get("value") is None or v.shape != ():
        raise em.fail(
            "NCC_EMOD025",
            f"arange: {what} must be a literal scalar (a computed value would make the shape dynamic)",
        )
    return float(np.asarray(v.attrs["value"], dtype=np.float64))


@lowering("arange", notes="iota, scaled and shifted (literal bounds)")
def _arange(em: Emitter, call: Call) -> Value:
    args = call.tensors(1, 3)
    d = call.attrs.dtype("dtype", dt.F32) or dt.F32
    vals = [_literal(em, a, w) for a, w in zip(args, ("start", "stop", "step"))]
    start, stop, step = (0.0, vals[0], 1.0) if len(vals) == 1 else (vals + [1.0])[:3]
    if step == 0 or not all(math.isfinite(v) for v in (start, stop, step)):
        raise em.fail("NCC_EVRF064", "arange needs finite bounds and a non-zero step")
    n = max(int(math.ceil((stop - start) / step)), 0)
    if n > 2**31 - 1:
        raise em.fail("NCC_EVRF064", f"arange would have {n} elements")
    ramp_type = dt.F32 if d.is_float else d
    ramp = em.op("iota", [], type=TensorType(ramp_type, (n,)), iota_dimension=0)
    if step != 1:
        ramp = em.scalar_binary("multiply", ramp, step)
    if start != 0:
        ramp = em.scalar_binary("add", ramp, start)
    return em.convert(ramp, d)


# --- shapes ----------------------------------------------------------------------------------


def infer_reshape(
    em: Emitter,
    shape: tuple[int, ...],
    newshape: Sequence[int],
    allowzero: bool = False,
    reverse: bool = False,
) -> tuple[int, ...]:
    """Relay's ``newshape`` with its special values: 0 copies a dimension, -1 infers one, -2 copies
    the rest, -3 merges two, -4 splits one into the next two values (TVM's InferNewShape)."""
    ishape = list(reversed(shape)) if reverse else list(shape)
    spec = list(reversed(newshape)) if reverse else list(newshape)
    out: list[int] = []
    used_in: set[int] = set()  # input dimensions copied, merged or split into the output
    used_out: set[int] = set()  # output dimensions that came from them
    src = 0
    infer = -1
    i = 0

    def need(n: int, what: str) -> None:
        if src + n > len(ishape):
            raise em.fail(
                "NCC_EVRF064",
                f"reshape: {what} in {list(newshape)} runs past the input's {len(shape)} dimensions",
            )

    while i < len(spec):
        v = spec[i]
        if v > 0:
            out.append(v)
            src += 1
        elif v == 0:
            if allowzero:
                out.append(0)
            else:
                need(1, "0")
                used_in.add(src)
                used_out.add(len(out))
                out.append(ishape[src])
            src += 1
        elif v == -1:
            if infer >= 0:
                raise em.fail("NCC_EVRF064", f"reshape: more than one -1 in {list(newshape)}")
            infer = len(out)
            out.append(1)
            src += 1
        elif v == -2:
            used_in.update(range(src, len(ishape)))
            used_out.update(range(len(out), len(out) + len(ishape) - src))
            out.extend(ishape[src:])
            src = len(ishape)
        elif v == -3:
            need(2, "-3")
            used_in.update((src, src + 1))
            used_out.add(len(out))
            out.append(ishape[src] * ishape[src + 1])
            src += 2
        elif v == -4:
            if i + 2 >= len(spec):
                raise em.fail("NCC_EVRF064", f"reshape: -4 in {list(newshape)} needs two values after it")
            need(1, "-4")
            d0, d1, d2 = ishape[src], spec[i + 1], spec[i + 2]
            if d1 == -1 and d2 == -1:
                raise em.fail("NCC_EVRF064", "reshape: -4 cannot split into -1 and -1")
            if d1 == -1:
                d1 = d0 // d2 if d2 > 0 else -1
            elif d2 == -1:
                d2 = d0 // d1 if d1 > 0 else -1
            if d1 <= 0 or d2 <= 0 or d1 * d2 != d0:
                raise em.fail("NCC_EVRF064", f"reshape: -4 cannot split {d0} into {spec[i + 1]} x {spec[i + 2]}")
            used_in.add(src)
            used_out.update((len(out), len(out) + 1))
            out.extend([d1, d2])
            src += 1
            i += 2
        else:
            raise em.fail("NCC_EPRS003", f"reshape: unknown special value {v} in {list(newshape)}")
        i += 1
    total = math.prod(shape)
    if infer >= 0:
        # TVM's rule: the input dimensions nothing copied, divided by the output dimensions that
        # did not come from the input (so zero-size dimensions that were copied do not matter).
        free = math.prod(n for j, n in enumerate(ishape) if j not in used_in)
        rest = math.prod(n for j, n in enumerate(out) if j not in used_out and j != infer)
        if rest == 0 or free % rest:
            raise em.fail("NCC_EVRF064", f"reshape: cannot infer -1 to turn {list(shape)} into {list(newshape)}")
        out[infer] = free // rest
    if reverse:
        out.reverse()
    if math.prod(out) != total:
        raise em.fail(
            "NCC_EVRF064",
            f"reshape: {list(shape)} ({total} elements) cannot become {out} ({math.prod(out)} elements)",
        )
    return tuple(out)


@lowering("reshape", notes="reshape (0, -1, -2, -3, -4 resolved)")
def _reshape(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    newshape = call.attrs.ints("newshape")
    allowzero = call.attrs.bool("allowzero", False)
    return em.reshape(x, infer_reshape(em, x.shape, newshape, allowzero))


@lowering("contrib_reverse_reshape", "reverse_reshape", notes="reshape (special values from the right)")
def _reverse_reshape(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    newshape = call.attrs.ints("newshape")
    call.attrs.bool("allowzero", False)
    return em.reshape(x, infer_reshape(em, x.shape, newshape, reverse=True))


@lowering("reshape_like", notes="reshape")
def _reshape_like(em: Emitter, call: Call) -> Value:
    x, like = call.tensors(2)
    a = call.attrs

    def span(rank: int, begin_key: str, end_key: str) -> tuple[int, int]:
        b = a.int(begin_key, 0)
        e = a.opt_int(end_key)
        b = b + rank if b < 0 else b
        e = rank if e is None else (e + rank if e < 0 else e)
        if not 0 <= b <= e <= rank:
            raise em.fail("NCC_EPRS003", f"reshape_like: {begin_key}/{end_key} out of range")
        return b, e

    lb, le = span(len(x.shape), "lhs_begin", "lhs_end")
    rb, re_ = span(len(like.shape), "rhs_begin", "rhs_end")
    shape = x.shape[:lb] + like.shape[rb:re_] + x.shape[le:]
    if math.prod(shape) != math.prod(x.shape):
        raise em.fail("NCC_EVRF064", f"reshape_like: {list(x.shape)} cannot become {list(shape)}")
    return em.reshape(x, shape)


@lowering("transpose", notes="transpose")
def _transpose(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    rank = len(x.shape)
    axes = call.attrs.opt_ints("axes")
    perm = tuple(range(rank - 1, -1, -1)) if not axes else tuple(normalize_axis(a, rank, em.loc) for a in axes)
    if sorted(perm) != list(range(rank)):
        raise em.fail("NCC_EVRF064", f"transpose: axes {list(axes or ())} are not a permutation of rank {rank}")
    return em.transpose(x, perm)


@lowering("squeeze", notes="reshape")
def _squeeze(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    axes = call.attrs.opt_ints("axis")
    if axes is None:
        drop = {i for i, n in enumerate(x.shape) if n == 1}
    else:
        drop = {normalize_axis(a, len(x.shape), em.loc) for a in axes}
        for a in drop:
            if x.shape[a] != 1:
                raise em.fail("NCC_EVRF064", f"squeeze: axis {a} has size {x.shape[a]}, not 1")
    return em.reshape(x, [n for i, n in enumerate(x.shape) if i not in drop])


@lowering("expand_dims", notes="reshape")
def _expand_dims(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    num = call.attrs.int("num_newaxis", 1)
    if num < 0:
        raise em.fail("NCC_EPRS003", "expand_dims: num_newaxis must be non-negative")
    axis = normalize_axis(call.attrs.int("axis"), len(x.shape), em.loc, extra=1)
    return em.reshape(x, x.shape[:axis] + (1,) * num + x.shape[axis:])


def _broadcast_exactly(em: Emitter, x: Node, shape: tuple[int, ...]) -> Node:
    if len(shape) < len(x.shape) or em.broadcast_shape(x.shape, shape) != shape:
        raise em.fail("NCC_EVRF064", f"{list(x.shape)} cannot broadcast to {list(shape)}")
    return em.broadcast_to(x, shape)


@lowering("broadcast_to", notes="reshape + broadcast")
def _broadcast_to(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return _broadcast_exactly(em, x, _shape_attr(em, call))


@lowering("broadcast_to_like", notes="reshape + broadcast")
def _broadcast_to_like(em: Emitter, call: Call) -> Value:
    x, like = call.tensors(2)
    return _broadcast_exactly(em, x, like.shape)


@lowering("concatenate", notes="concatenate")
def _concatenate(em: Emitter, call: Call) -> Value:
    call.arity(1)
    xs = call.tensor_list(0)
    axis = normalize_axis(call.attrs.int("axis", 0), len(xs[0].shape), em.loc)
    em.same_dtype("concatenate", *xs)
    return xs[0] if len(xs) == 1 else em.op("concatenate", xs, dimension=axis)


@lowering("stack", notes="reshape + concatenate")
def _stack(em: Emitter, call: Call) -> Value:
    call.arity(1)
    xs = call.tensor_list(0)
    axis = normalize_axis(call.attrs.int("axis", 0), len(xs[0].shape), em.loc, extra=1)
    for x in xs[1:]:
        if x.shape != xs[0].shape:
            raise em.fail("NCC_EVRF064", f"stack: shapes differ ({list(xs[0].shape)} vs {list(x.shape)})")
    em.same_dtype("stack", *xs)
    parts = [em.reshape(x, x.shape[:axis] + (1,) + x.shape[axis:]) for x in xs]
    return parts[0] if len(parts) == 1 else em.op("concatenate", parts, dimension=axis)


def slice_dim(em: Emitter, x: Node, axis: int, start: int, stop: int, stride: int = 1) -> Node:
    spec = tuple(SliceDim(start, stop, stride) if d == axis else SliceDim(0, n, 1) for d, n in enumerate(x.shape))
    if start == 0 and stop == x.shape[axis] and stride == 1:
        return x
    return em.op("slice", [x], slice=spec)


@lowering("split", notes="slice per section (a tuple)")
def _split(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    axis = normalize_axis(call.attrs.int("axis", 0), len(x.shape), em.loc)
    sections = call.attrs.raw("indices_or_sections", None)
    n = x.shape[axis]
    if isinstance(sections, int) and not isinstance(sections, bool):
        if sections <= 0 or n % sections or sections > max(n, 1):
            raise em.fail(
                "NCC_EVRF064", f"split: {n} elements along axis {axis} do not divide into {sections} sections"
            )
        size = n // sections
        bounds = [(i * size, (i + 1) * size) for i in range(sections)]
    elif isinstance(sections, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in sections):
        points = [0, *sections, n]
        if any(b < a for a, b in zip(points, points[1:])) or points[-2] > n:
            raise em.fail("NCC_EVRF064", f"split: indices {sections} must increase within 0..{n}")
        bounds = list(zip(points, points[1:]))
    else:
        raise em.fail("NCC_EPRS003", "split: indices_or_sections must be an integer or a list of integers")
    return tuple(slice_dim(em, x, axis, a, b) for a, b in bounds)


_MAX_INDEX = 2**63 - 1  # TVM's "to the end" for an absent begin/end


def _canonical(index: int, extent: int, stride: int) -> int:
    """TVM's CanonicalizeIndex: negative counts from the end, then clamp to the valid range."""
    lo, hi = (-1, extent - 1) if stride < 0 else (0, extent)
    if index < 0:
        index += extent
    return min(max(index, lo), hi)


@lowering("strided_slice", notes="slice (+ reverse for negative strides)")
def _strided_slice(em: Emitter, call: Call) -> Value:
    """TVM's rules: without ``axes``, strides are padded with 1 and begin/end with the whole
    extent up to the rank (entries past the rank are ignored); with ``axes``, begin, end and
    strides give one value per axis. ``None`` in begin/end means the whole extent (for a
    negative stride TVM's end is then index 0, exclusive). ``slice_mode="size"`` reads end as a
    size from the canonical begin (negative: to the end) and ignores strides."""
    (x,) = call.tensors(1)
    a = call.attrs
    rank = len(x.shape)
    begin = a.ints_or_none("begin")
    end = a.ints_or_none("end")
    strides = a.opt_ints("strides")
    mode = a.str("slice_mode", "end")
    axes = a.opt_ints("axes")
    if mode not in ("end", "size"):
        raise em.fail("NCC_EPRS003", f"strided_slice: slice_mode must be end or size, got {mode!r}")
    if axes is None:
        axes = tuple(range(rank))
        strides = tuple(strides or ()) + (1,) * rank
        begin = begin + (None,) * rank
        end = end + (None,) * rank
    else:
        axes = tuple(normalize_axis(ax, rank, em.loc) for ax in axes)
        if len(set(axes)) != len(axes):
            raise em.fail("NCC_EVRF064", f"strided_slice: repeated axis in {list(axes)}")
        strides = (1,) * len(axes) if strides is None else strides
        if not len(begin) == len(end) == len(strides) == len(axes):
            raise em.fail(
                "NCC_EVRF064",
                f"strided_slice: begin {list(begin)}, end {list(end)} and strides {list(strides)} "
                f"need one value for each of the {len(axes)} axes {list(axes)}",
            )
    spec = [SliceDim(0, n, 1) for n in x.shape]
    flip = []
    for i, ax in enumerate(axes):
        n = x.shape[ax]
        s = 1 if mode == "size" else strides[i]
        if s == 0:
            raise em.fail("NCC_EVRF064", "strided_slice: a stride of 0")
        b = _canonical((0 if s > 0 else _MAX_INDEX) if begin[i] is None else begin[i], n, s)
        if end[i] is None:
            e = _MAX_INDEX if s > 0 else 0
        elif mode == "size":
            e = _MAX_INDEX if end[i] < 0 else b + end[i]
        else:
            e = end[i]
        e = _canonical(e, n, s)
        if (s > 0 and b > e) or (s < 0 and e > b):
            raise em.fail(
                "NCC_EVRF064",
                f"strided_slice: [begin={begin[i]}, end={end[i]}] with stride {s} is "
                f"empty in the wrong direction for axis {ax} (size {n})",
            )
        if s > 0:
            spec[ax] = SliceDim(b, e, s)
        else:
            count = (b - e + (-s) - 1) // (-s)
            last = b + (count - 1) * s
            spec[ax] = SliceDim(last, b + 1, -s) if count else SliceDim(0, 0, 1)
            if count:
                flip.append(ax)
    out = x if all(sd == SliceDim(0, n, 1) for sd, n in zip(spec, x.shape)) else em.op("slice", [x], slice=tuple(spec))
    return em.op("reverse", [out], dimensions=tuple(sorted(flip))) if flip else out


@lowering("reverse", notes="reverse")
def _reverse(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    axis = normalize_axis(call.attrs.int("axis"), len(x.shape), em.loc)
    return em.op("reverse", [x], dimensions=(axis,))


@lowering("tile", notes="reshape + broadcast + reshape")
def _tile(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    reps = call.attrs.ints("reps")
    if any(r < 0 for r in reps):
        raise em.fail("NCC_EPRS003", f"tile: negative repetition in {list(reps)}")
    rank = max(len(reps), len(x.shape))
    shape = (1,) * (rank - len(x.shape)) + x.shape
    reps = (1,) * (rank - len(reps)) + tuple(reps)
    # [d0, d1, ...] -> [r0, d0, r1, d1, ...] by one broadcast, then merge each pair.
    x = em.reshape(x, shape)
    wide = tuple(v for r, n in zip(reps, shape) for v in (r, n))
    b = em.broadcast_in_dim(x, wide, tuple(2 * i + 1 for i in range(rank)))
    return em.reshape(b, [r * n for r, n in zip(reps, shape)])


@lowering("repeat", notes="broadcast + reshape")
def _repeat(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    r = call.attrs.int("repeats")
    if r < 0:
        raise em.fail("NCC_EPRS003", "repeat: repeats must be non-negative")
    axis = normalize_axis(call.attrs.int("axis"), len(x.shape), em.loc)
    wide = x.shape[: axis + 1] + (r,) + x.shape[axis + 1 :]
    b = em.broadcast_in_dim(x, wide, tuple(i if i <= axis else i + 1 for i in range(len(x.shape))))
    return em.reshape(b, x.shape[:axis] + (x.shape[axis] * r,) + x.shape[axis + 1 :])


@lowering("layout_transform", notes="transpose (plain layouts)")
def _layout_transform(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    src, dst = call.attrs.str("src_layout"), call.attrs.str("dst_layout")
    if sorted(src) != sorted(dst) or len(set(src)) != len(src) or not src.isalpha() or not src.isupper():
        raise em.fail(
            "NCC_EVRF001",
            f"layout_transform {src} -> {dst}: only permutations of plain layouts "
            "(no split axes such as NCHW4c) are supported",
        )
    if len(src) != len(x.shape):
        raise em.fail("NCC_EVRF064", f"layout_transform: layout {src} does not fit rank {len(x.shape)}")
    return em.transpose(x, [src.index(c) for c in dst])


@lowering("shape_of", notes="constant")
def _shape_of(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    d = call.attrs.dtype("dtype", dt.S32) or dt.S32
    return em.const(np.array(x.shape, dtype=np.int64), d)


@lowering("ndarray_size", notes="constant")
def _ndarray_size(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    d = call.attrs.dtype("dtype", dt.S32) or dt.S32
    return em.const(math.prod(x.shape), d)


# --- reductions ------------------------------------------------------------------------------


def reduce_axes(em: Emitter, call: Call, rank: int) -> tuple[int, ...]:
    """``axis`` (None: all) with ``exclude`` (reduce the others), normalized and sorted."""
    axes = call.attrs.opt_ints("axis")
    exclude = call.attrs.bool("exclude", False)
    chosen = set(range(rank)) if axes is None else {normalize_axis(a, rank, em.loc) for a in axes}
    if axes is not None and len(chosen) != len(axes):
        raise em.fail("NCC_EVRF064", f"{call.op}: repeated axis in {list(axes)}")
    if exclude:
        chosen = set(range(rank)) - chosen
    return tuple(sorted(chosen))


_REDUCE_KIND = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "all": "and", "any": "or"}


@lowering("mean", notes="reduce add, divide by the count (axis, keepdims, exclude)")
@lowering(*_REDUCE_KIND, notes="reduce (axis, keepdims, exclude)")
def _reduce(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    axes = reduce_axes(em, call, len(x.shape))
    keepdims = call.attrs.bool("keepdims", False)
    if call.op in ("all", "any") and not x.dtype.is_pred:
        raise em.fail("NCC_EVRF064", f"{call.op} needs a bool tensor, got {x.dtype.relay}")
    if call.op == "mean":
        return em.mean(x, axes, keepdims)
    r = em.reduce(x, axes, _REDUCE_KIND[call.op])
    return em.keep_dims(r, x.shape, axes) if keepdims else r


@lowering("variance", notes="reduce of squared deviations (unbiased option)")
def _variance(em: Emitter, call: Call) -> Value:
    args = call.tensors(1, 2)
    x = args[0]
    axes = reduce_axes(em, call, len(x.shape))
    keepdims = call.attrs.bool("keepdims", False)
    unbiased = call.attrs.bool("unbiased", False)
    mean = args[1] if len(args) == 2 else em.mean(x, axes, keepdims=True)
    d = em.binary("subtract", x, mean)
    r = em.reduce(em.op("multiply", [d, d]), axes, "add")
    count = math.prod(x.shape[a] for a in axes) - (1 if unbiased else 0)
    r = em.scalar_binary("divide", r, count) if count != 1 else r
    return em.keep_dims(r, x.shape, axes) if keepdims else r


@lowering("argmax", "argmin", notes="variadic reduce over (value, iota index); one axis or all")
def _argreduce(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    axes = reduce_axes(em, call, len(x.shape))
    keepdims = call.attrs.bool("keepdims", False)
    last = call.attrs.bool("select_last_index", False)
    if len(axes) != 1:
        if len(axes) == len(x.shape) and x.shape:
            # Over everything: flatten (indices are then positions in the flattened tensor).
            flat = em.reshape(x, (math.prod(x.shape),))
            r = _argreduce_axis(em, flat, 0, call.op == "argmax", last)
            return em.reshape(r, (1,) * len(x.shape)) if keepdims else r
        raise em.fail("NCC_EVRF001", f"{call.op} over {len(axes)} axes: give one axis or all of them")
    r = _argreduce_axis(em, x, axes[0], call.op == "argmax", last)
    return em.keep_dims(r, x.shape, axes) if keepdims else r


def _argreduce_axis(em: Emitter, x: Node, axis: int, is_max: bool, last: bool) -> Node:
    """A variadic reduce over (value, index) pairs keeping the better value, and on ties the
    first index (the last with ``select_last_index``)."""
    d = x.dtype

    def make(sub: Builder) -> Node:
        av, ai = sub.param(d, (), "acc_value"), sub.param(dt.S32, (), "acc_index")
        bv, bi = sub.param(d, (), "value"), sub.param(dt.S32, (), "index")
        better = sub.op("compare", [av, bv], direction="GT" if is_max else "LT")
        same = sub.op("compare", [av, bv], direction="EQ")
        earlier = sub.op("compare", [ai, bi], direction="GT" if last else "LT")
        take_a = sub.op("or", [better, sub.op("and", [same, earlier])])
        return sub.op("tuple", [sub.op("select", [take_a, av, bv]), sub.op("select", [take_a, ai, bi])])

    kind = ("argmax" if is_max else "argmin") + ("_last" if last else "")
    comp = em.body(kind, d, make)
    idx = em.op("iota", [], type=TensorType(dt.S32, x.shape), iota_dimension=axis)
    init_v = em.const(em.identity("max" if is_max else "min", d), d)
    init_i = em.const(0, dt.S32)
    r = em.op("reduce", [x, idx, init_v, init_i], dimensions=(axis,), to_apply=comp)
    return em.op("get-tuple-element", [r], index=1)


# --- indexing --------------------------------------------------------------------------------


def gather_axis(em: Emitter, data: Node, indices: Node, axis: int) -> Node:
    """``data`` indexed along ``axis`` by every element of ``indices`` (numpy's take, clamped)."""
    rank, irank = len(data.shape), len(indices.shape)
    offset = tuple(range(axis)) + tuple(range(axis + irank, rank - 1 + irank))
    dims = GatherDims(offset_dims=offset, collapsed_slice_dims=(axis,), start_index_map=(axis,), index_vector_dim=irank)
    sizes = tuple(1 if d == axis else n for d, n in enumerate(data.shape))
    return em.op("gather", [data, indices], dims=dims, slice_sizes=sizes, indices_are_sorted=False)


@lowering("take", notes="gather (clip, wrap or fast mode)")
def _take(em: Emitter, call: Call) -> Value:
    data, indices = call.tensors(2)
    if not indices.dtype.is_int:
        raise em.fail("NCC_EVRF064", f"take: indices must be integers, got {indices.dtype.relay}")
    axis = call.attrs.opt_int("axis")
    batch_dims = call.attrs.int("batch_dims", 0)
    mode = call.attrs.str("mode", "clip")
    if batch_dims != 0:
        raise em.fail("NCC_EVRF001", "take with batch_dims is not supported")
    if mode not in ("clip", "wrap", "fast"):
        raise em.fail("NCC_EPRS003", f"take: mode must be clip, wrap or fast, got {mode!r}")
    if axis is None:
        data = em.reshape(data, (math.prod(data.shape),))
        axis = 0
    axis = normalize_axis(axis, len(data.shape), em.loc)
    n = data.shape[axis]
    if n == 0:
        raise em.fail("NCC_EVRF064", "take from an empty axis")
    if mode == "wrap":
        # Indices modulo n, in 0..n-1 also for negative ones.
        size = em.full(n, indices.dtype, indices.shape)
        r = em.op("remainder", [indices, size])
        neg = em.compare("LT", r, em.full(0, indices.dtype, indices.shape))
        indices = em.op("select", [neg, em.op("add", [r, size]), r])
    # clip and fast: gather clamps each start index into range, which is what clip means.
    return gather_axis(em, data, indices, axis)


@lowering("one_hot", notes="compare with iota + select")
def _one_hot(em: Emitter, call: Call) -> Value:
    indices, on, off = call.tensors(3)
    depth = call.attrs.int("depth")
    axis = call.attrs.int("axis", -1)
    d = call.attrs.dtype("dtype", on.dtype) or on.dtype
    if depth < 0 or not indices.dtype.is_int:
        raise em.fail("NCC_EVRF064", "one_hot needs integer indices and a non-negative depth")
    on, off = _scalar_value(em, on, "on_value"), _scalar_value(em, off, "off_value")
    rank = len(indices.shape)
    axis = rank if axis == -1 else normalize_axis(axis, rank, em.loc, extra=1)
    shape = indices.shape[:axis] + (depth,) + indices.shape[axis:]
    spread = em.broadcast_in_dim(indices, shape, tuple(i if i < axis else i + 1 for i in range(rank)))
    ramp = em.op("iota", [], type=TensorType(indices.dtype, shape), iota_dimension=axis)
    hit = em.compare("EQ", spread, ramp)
    return em.op(
        "select",
        [
            hit,
            em.broadcast_in_dim(em.convert(on, d), shape, ()),
            em.broadcast_in_dim(em.convert(off, d), shape, ()),
        ],
    )

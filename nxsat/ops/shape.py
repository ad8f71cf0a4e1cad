"""Data-movement operators: parameters and constants, iota, broadcast, reshape, transpose, slices,
concatenate, pad, reverse, conversions, tuples.

Where the result type cannot be inferred from the operands (parameter, constant, iota, reshape,
broadcast, convert), the front end supplies it as an attribute (``type``, ``shape`` or ``dtype``)
and the rule checks it against what the operands allow.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.attrs import PadDim, SliceDim
from nxsat.diagnostics import error
from nxsat.ir import TensorType, TupleType, Type
from nxsat.ops.common import check_dims, check_perm, count, same_dtypes, tensor, tensors
from nxsat.ops.registry import DMA, GPSIMD, NONE, TENSOR, VECTOR, ShapeError, op

# --- leaves ----------------------------------------------------------------------------------


def _type_attr(attrs: dict, name: str) -> Type:
    t = attrs.get("type")
    if not isinstance(t, TensorType | TupleType):
        raise ShapeError(f"{name} needs its result type")
    return t


def _parameter_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    raise AssertionError("parameters are bound by the interpreter")


@op("parameter", engine=NONE, arity=(0, 0), impl=_parameter_impl, neuron=(),
    notes="an input of the computation (index = position)")
def _parameter(types: list[Type], attrs: dict) -> Type:
    if not isinstance(attrs.get("index"), int) or attrs["index"] < 0:
        raise ShapeError("parameter needs a non-negative index")
    return _type_attr(attrs, "parameter")


def _constant_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    value = attrs.get("value")
    if value is None:
        raise error("NCC_ECON001", f"constant {ctx.node.name} was elided from the model text ({{...}}); "
                    "its value is needed to run", ctx.node.loc,
                    "dump the HLO with large constants printed (e.g. XLA_FLAGS=--xla_dump_large_constants)")
    return value


@op("constant", engine=NONE, arity=(0, 0), impl=_constant_impl, neuron=("Constant", "ConstantLiteral"),
    notes="literal values are kept in the graph; elided literals load for inspection only")
def _constant(types: list[Type], attrs: dict) -> Type:
    t = _type_attr(attrs, "constant")
    v = attrs.get("value")
    if v is not None and isinstance(t, TensorType) and tuple(v.shape) != t.shape:
        raise ShapeError(f"constant literal has shape {list(v.shape)}, declared {t}")
    return t


def _iota_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    t: TensorType = attrs["type"]
    d = attrs["iota_dimension"]
    ramp = np.arange(t.shape[d], dtype=np.float64 if t.dtype.is_float else np.int64)
    shape = [1] * t.rank
    shape[d] = t.shape[d]
    return np.broadcast_to(dt.cast(ramp, t.dtype).reshape(shape), t.shape).copy()


@op("iota", engine=GPSIMD, arity=(0, 0), impl=_iota_impl, neuron=("Iota",), relay=("arange",),
    notes="0, 1, 2, ... along iota_dimension")
def _iota(types: list[Type], attrs: dict) -> Type:
    t = tensor(_type_attr(attrs, "iota"), "result")
    d = attrs.get("iota_dimension")
    if not isinstance(d, int) or not 0 <= d < t.rank:
        raise ShapeError(f"iota: iota_dimension {d} out of range for {t}")
    if t.dtype.is_pred:
        raise ShapeError("iota: the element type must be an integer or float type, not pred")
    return t


# --- broadcast / reshape / transpose ---------------------------------------------------------

def _broadcast_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    (x,) = args
    shape = tuple(attrs["shape"])
    dims = tuple(attrs["dimensions"])
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    x = np.transpose(x, order) if order != list(range(len(dims))) else x
    view = [1] * len(shape)
    for i in order:
        view[dims[i]] = x.shape[order.index(i)]
    return np.broadcast_to(x.reshape(view), shape).copy()


@op("broadcast", engine=VECTOR, arity=(1, 1), impl=_broadcast_impl, neuron=("Broadcast", "BroadcastInDim"),
    relay=("broadcast_to",), notes="operand dimension i becomes result dimension dimensions[i]")
def _broadcast(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "broadcast")
    x = tensor(types[0])
    shape = tuple(attrs.get("shape", ()))
    dims = tuple(attrs.get("dimensions", ()))
    if len(dims) != x.rank:
        raise ShapeError(f"broadcast: {len(dims)} dimensions given for an operand of rank {x.rank}")
    check_dims(dims, len(shape), "broadcast")
    for i, d in enumerate(dims):
        # Exactly equal, as XLA's verifier demands: a size-1 dimension that should expand is
        # reshaped away first (broadcast_in_dim's degenerate form is not HLO).
        if x.shape[i] != shape[d]:
            raise ShapeError(f"broadcast: operand dimension {i} ({x.shape[i]}) does not match "
                             f"result dimension {d} ({shape[d]})")
    return x.with_shape(shape)


def _reshape_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    return np.reshape(args[0], tuple(attrs["shape"]))


def _reshape_rule(name: str) -> Any:
    def infer(types: list[Type], attrs: dict) -> Type:
        count(types, 1, name)
        x = tensor(types[0])
        shape = tuple(attrs.get("shape", ()))
        if any(s < 0 for s in shape) or math.prod(shape) != x.size:
            raise ShapeError(f"{name}: cannot reshape {x} ({x.size} elements) to {list(shape)}")
        return x.with_shape(shape)

    return infer


op("reshape", engine=NONE, arity=(1, 1), impl=_reshape_impl, neuron=("Reshape",), relay=("reshape",),
   notes="row-major; free when the layout allows, else a copy")(_reshape_rule("reshape"))
op("bitcast", engine=NONE, arity=(1, 1), impl=_reshape_impl,
   notes="layout-only reinterpretation; with default layouts the same as reshape")(_reshape_rule("bitcast"))


def _transpose_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    return np.asarray(np.transpose(args[0], tuple(attrs["dimensions"])), order="C")


@op("transpose", engine=TENSOR, arity=(1, 1), impl=_transpose_impl, neuron=("Transpose",),
    relay=("transpose",), notes="result dimension i is operand dimension dimensions[i]")
def _transpose(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "transpose")
    x = tensor(types[0])
    perm = tuple(attrs.get("dimensions", ()))
    check_perm(perm, x.rank, "transpose")
    return x.with_shape(x.shape[p] for p in perm)


# --- slicing ---------------------------------------------------------------------------------

def _slice_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    spec: tuple[SliceDim, ...] = attrs["slice"]
    return np.asarray(args[0][tuple(slice(s.start, s.limit, s.stride) for s in spec)], order="C")


@op("slice", engine=DMA, arity=(1, 1), impl=_slice_impl, neuron=("Slice",), relay=("strided_slice",),
    notes="static start:limit:stride per dimension")
def _slice(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "slice")
    x = tensor(types[0])
    spec = attrs.get("slice")
    if spec is None or len(spec) != x.rank:
        raise ShapeError(f"slice: need {x.rank} start:limit:stride ranges")
    out = []
    for d, s in enumerate(spec):
        if s.stride <= 0 or not 0 <= s.start <= s.limit <= x.shape[d]:
            raise ShapeError(f"slice: [{s.start}:{s.limit}:{s.stride}] is out of range for dimension {d} "
                             f"of size {x.shape[d]}")
        out.append(-(-(s.limit - s.start) // s.stride))
    return x.with_shape(out)


def _clamped_starts(x_shape: tuple[int, ...], starts: list[Any], sizes: tuple[int, ...]) -> list[int]:
    return [int(min(max(int(np.asarray(s)), 0), dim - size)) for s, dim, size in zip(starts, x_shape, sizes)]


def _dynamic_slice_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    x, *starts = args
    sizes = tuple(attrs["sizes"])
    st = _clamped_starts(x.shape, starts, sizes)
    return np.asarray(x[tuple(slice(s, s + n) for s, n in zip(st, sizes))], order="C")


def _check_start_indices(starts: list[TensorType], rank: int, name: str) -> None:
    if len(starts) != rank:
        raise ShapeError(f"{name}: needs {rank} scalar start indices, got {len(starts)}")
    for s in starts:
        if s.shape != () or not s.dtype.is_int:
            raise ShapeError(f"{name}: start indices must be integer scalars, got {s}")
        if s.dtype is not starts[0].dtype:
            raise ShapeError(f"{name}: start indices must all have one type, got {starts[0]} and {s}")


@op("dynamic-slice", engine=DMA, arity=(1, None), impl=_dynamic_slice_impl, relay=("dynamic_strided_slice",),
    notes="start indices are clamped so the slice stays in bounds")
def _dynamic_slice(types: list[Type], attrs: dict) -> Type:
    x, *starts = tensors(types)
    sizes = tuple(attrs.get("sizes", ()))
    _check_start_indices(starts, x.rank, "dynamic-slice")
    if len(sizes) != x.rank or any(not 0 <= n <= d for n, d in zip(sizes, x.shape)):
        raise ShapeError(f"dynamic-slice: sizes {list(sizes)} do not fit {x}")
    return x.with_shape(sizes)


def _dus_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    x, upd, *starts = args
    st = _clamped_starts(x.shape, starts, upd.shape)
    out = x.copy()
    out[tuple(slice(s, s + n) for s, n in zip(st, upd.shape))] = upd
    return out


@op("dynamic-update-slice", engine=DMA, arity=(2, None), impl=_dus_impl, neuron=("DynamicUpdateSlice",),
    notes="start indices are clamped so the update stays in bounds")
def _dynamic_update_slice(types: list[Type], attrs: dict) -> Type:
    x, upd, *starts = tensors(types)
    same_dtypes([x, upd], "dynamic-update-slice")
    _check_start_indices(starts, x.rank, "dynamic-update-slice")
    if upd.rank != x.rank or any(u > d for u, d in zip(upd.shape, x.shape)):
        raise ShapeError(f"dynamic-update-slice: update {upd} does not fit in {x}")
    return x


def _concatenate_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    return np.concatenate(args, axis=attrs["dimension"])


@op("concatenate", engine=DMA, arity=(1, None), impl=_concatenate_impl, neuron=("Concatenate",),
    relay=("concatenate",), notes="along one dimension")
def _concatenate(types: list[Type], attrs: dict) -> Type:
    ts = tensors(types)
    if not ts:
        raise ShapeError("concatenate needs at least one operand")
    d = attrs.get("dimension")
    rank = ts[0].rank
    if not isinstance(d, int) or not 0 <= d < rank:
        raise ShapeError(f"concatenate: dimension {d} out of range for rank {rank}")
    same_dtypes(ts, "concatenate")
    for t in ts[1:]:
        if t.rank != rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, ts[0].shape)) if i != d):
            raise ShapeError(f"concatenate: {t} does not match {ts[0]} outside dimension {d}")
    shape = list(ts[0].shape)
    shape[d] = sum(t.shape[d] for t in ts)
    return ts[0].with_shape(shape)


def _pad_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    x, value = args
    cfg: tuple[PadDim, ...] = attrs["padding"]
    # Interior padding first (holes between elements), then edges; negative edges crop.
    shape = [n + max(n - 1, 0) * p.interior for n, p in zip(x.shape, cfg)]
    body = np.full(shape, value, dtype=x.dtype)
    body[tuple(slice(None, None, p.interior + 1) for p in cfg)] = x
    widths = [(max(p.lo, 0), max(p.hi, 0)) for p in cfg]
    out = np.pad(body, widths, mode="constant", constant_values=np.asarray(value, dtype=x.dtype)) \
        if any(w != (0, 0) for w in widths) else body
    crop = tuple(slice(-min(p.lo, 0), out.shape[i] + min(p.hi, 0)) for i, p in enumerate(cfg))
    return np.asarray(out[crop], order="C")


@op("pad", engine=DMA, arity=(2, 2), impl=_pad_impl, neuron=("Pad",), relay=("nn.pad",),
    notes="edge padding (negative crops) and interior padding")
def _pad(types: list[Type], attrs: dict) -> Type:
    count(types, 2, "pad")
    x, v = tensors(types)
    same_dtypes([x, v], "pad")
    if v.shape != ():
        raise ShapeError(f"pad: padding value must be a scalar, got {v}")
    cfg = attrs.get("padding")
    if cfg is None or len(cfg) != x.rank:
        raise ShapeError(f"pad: need {x.rank} lo_hi_interior entries")
    out = []
    for n, p in zip(x.shape, cfg):
        if p.interior < 0:
            raise ShapeError("pad: interior padding must be non-negative")
        size = n + max(n - 1, 0) * p.interior + p.lo + p.hi
        if size < 0:
            raise ShapeError(f"pad: negative padding {p.lo}_{p.hi} removes more than dimension {n} has")
        out.append(size)
    return x.with_shape(out)


def _reverse_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    return np.asarray(np.flip(args[0], axis=tuple(attrs["dimensions"])), order="C")


@op("reverse", engine=DMA, arity=(1, 1), impl=_reverse_impl, neuron=("Rev",), relay=("reverse",),
    notes="reverses the listed dimensions")
def _reverse(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "reverse")
    x = tensor(types[0])
    check_dims(tuple(attrs.get("dimensions", ())), x.rank, "reverse")
    return x


# --- conversions -----------------------------------------------------------------------------

def _convert_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    return dt.cast(args[0], attrs["dtype"])


@op("convert", engine=VECTOR, arity=(1, 1), impl=_convert_impl, neuron=("ConvertElementType",),
    relay=("cast",), notes="float to int truncates and saturates (NaN -> 0); round-to-nearest-even")
def _convert(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "convert")
    x = tensor(types[0])
    d = attrs.get("dtype")
    if not isinstance(d, dt.DType):
        raise ShapeError("convert needs its result element type")
    return x.with_dtype(d)


def _bitcast_convert_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    x = np.asarray(args[0], order="C")
    d: dt.DType = attrs["dtype"]
    out = x.view(d.np)
    src, dst = x.dtype.itemsize, d.np.itemsize
    if src > dst:
        return out.reshape(*x.shape, src // dst)
    if src < dst:
        return out.reshape(x.shape[:-1])
    return out


@op("bitcast-convert", engine=NONE, arity=(1, 1), impl=_bitcast_convert_impl, neuron=("BitcastConvertType",),
    relay=("reinterpret",), notes="reinterprets bits; a width change adds or drops a minor dimension")
def _bitcast_convert(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "bitcast-convert")
    x = tensor(types[0])
    d = attrs.get("dtype")
    if not isinstance(d, dt.DType):
        raise ShapeError("bitcast-convert needs its result element type")
    src, dst = x.dtype.itemsize, d.itemsize
    if x.dtype.is_pred or d.is_pred:
        if src != dst:
            raise ShapeError("bitcast-convert: pred converts only to 8-bit types")
        return x.with_dtype(d)
    if src == dst:
        return x.with_dtype(d)
    if src > dst:
        return TensorType(d, (*x.shape, src // dst))
    if not x.shape or x.shape[-1] != dst // src:
        raise ShapeError(f"bitcast-convert: {x} to {d.name} needs a minor dimension of {dst // src}")
    return TensorType(d, x.shape[:-1])


# --- tuples ----------------------------------------------------------------------------------

def _tuple_impl(args: list[Any], attrs: dict, ctx: Any) -> tuple:
    return tuple(args)


@op("tuple", engine=NONE, arity=(0, None), impl=_tuple_impl, neuron=("Tuple",), relay=("Tuple",),
    notes="groups values; free")
def _tuple(types: list[Type], attrs: dict) -> Type:
    return TupleType(tuple(types))


def _gte_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    return args[0][attrs["index"]]


@op("get-tuple-element", engine=NONE, arity=(1, 1), impl=_gte_impl, neuron=("GetTupleElement",),
    relay=("TupleGetItem",), notes="free")
def _get_tuple_element(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "get-tuple-element")
    t = types[0]
    if not isinstance(t, TupleType):
        raise ShapeError(f"get-tuple-element: operand is not a tuple ({t})")
    i = attrs.get("index")
    if not isinstance(i, int) or not 0 <= i < len(t.elements):
        raise ShapeError(f"get-tuple-element: index {i} out of range for a {len(t.elements)}-tuple")
    return t.elements[i]


def _identity_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    return args[0] if len(args) == 1 else tuple(args)


@op("opt-barrier", engine=NONE, arity=(1, 1), impl=_identity_impl, neuron=("OptimizationBarrier",),
    notes="identity; only orders scheduling")
def _optimization_barrier(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "opt-barrier")
    return types[0]

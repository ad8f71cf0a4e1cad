"""Contractions on TensorE: dot (general, with batch and contracting dimensions) and XLA's general
convolution.

Numerics: integer operands are multiplied and summed exactly in int64, then wrapped to the result
type; floating-point operands are widened to fp64, accumulated there and rounded once to the
result type (XLA CPU accumulates in fp32; the difference is far below any tolerance a test uses
and the reference stays independent of summation order). The result element type is the
``dtype`` attribute (``preferred_element_type``) when given, else the wider operand type.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nxsat.attrs import ConvDims, DotDims
from nxsat.dtypes import DType
from nxsat.ir import TensorType, Type
from nxsat.ops.common import LOW_FLOATS, count, tensor, tensors, to_dtype
from nxsat.ops.reduce import similar, window_output_shape, windows
from nxsat.ops.registry import TENSOR, Ctx, ShapeError, op

# --- element types ---------------------------------------------------------------------------


def operand_dtype(a: DType, b: DType, name: str) -> DType:
    """The type a contraction of ``a`` and ``b`` produces by default (XLA: the higher precision)."""
    if not similar(a, b):
        raise ShapeError(f"{name}: operand element types differ: {a.name} and {b.name}")
    return b if b.bits > a.bits else a


def result_type(attrs: dict, default: DType, name: str) -> DType:
    """The ``dtype`` attribute (preferred element type) when given, checked as XLA does."""
    want = attrs.get("dtype")
    if want is None or want is default:
        return default
    if not isinstance(want, DType):
        raise ShapeError(f"{name}: result element type must be a type, got {want!r}")
    if default.is_float != want.is_float:
        raise ShapeError(f"{name}: result element type {want.name} is not of the kind of the operands "
                         f"({default.name})")
    if not default.is_float and want.bits < default.bits:
        raise ShapeError(f"{name}: result element type {want.name} is narrower than the operands' "
                         f"{default.name}")
    return want


# Operands are widened (to fp64 / int64) a block at a time, at most this many elements per block,
# so a 300M-parameter weight never becomes a 2.4 GB temporary and blocks stay cache-friendly.
BLOCK = 1 << 21


def _wide(x: np.ndarray) -> np.ndarray:
    """Exact arithmetic for integers (int64 wraps modulo 2^64, so wrapping the result to a
    narrower type afterwards is exact); fp64 for floats."""
    if x.dtype.kind in "biu":
        return x.astype(np.int64)
    if x.dtype in LOW_FLOATS:  # ml_dtypes converts to fp32 much faster than to fp64; both exact
        x = x.astype(np.float32)
    return x.astype(np.float64)


def matmul(a: np.ndarray, c: np.ndarray, out: DType) -> np.ndarray:
    """``a (B, M, K) @ c (B, K, N)`` accumulated wide, each block rounded once to ``out``."""
    b, m, k = a.shape
    n = c.shape[2]
    result = np.empty((b, m, n), dtype=out.np)
    bm = max(1, m if m * k <= BLOCK else BLOCK // max(k, 1))
    bn = max(1, n if k * n <= BLOCK else BLOCK // max(k, 1))
    bb = max(1, BLOCK // max(bm * k, k * bn, 1))
    for p in range(0, b, bb):
        for i in range(0, m, bm):
            aw = _wide(a[p:p + bb, i:i + bm])
            for j in range(0, n, bn):
                block = np.matmul(aw, _wide(c[p:p + bb, :, j:j + bn]))
                result[p:p + bb, i:i + bm, j:j + bn] = to_dtype(block, out)
    return result


# --- dot -------------------------------------------------------------------------------------

def _free(rank: int, *used: tuple[int, ...]) -> list[int]:
    taken = {d for u in used for d in u}
    return [d for d in range(rank) if d not in taken]


def _dot_impl(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
    lhs, rhs = args
    d: DotDims = attrs.get("dims") or DotDims()
    lb, lc, rb, rc = list(d.lhs_batch), list(d.lhs_contracting), list(d.rhs_batch), list(d.rhs_contracting)
    lf, rf = _free(lhs.ndim, d.lhs_batch, d.lhs_contracting), _free(rhs.ndim, d.rhs_batch, d.rhs_contracting)
    batch = [lhs.shape[i] for i in lb]
    m_shape, n_shape = [lhs.shape[i] for i in lf], [rhs.shape[i] for i in rf]
    b, m, n = math.prod(batch), math.prod(m_shape), math.prod(n_shape)
    k = math.prod(lhs.shape[i] for i in lc)
    a = np.transpose(lhs, lb + lf + lc).reshape(b, m, k)
    c = np.transpose(rhs, rb + rc + rf).reshape(b, k, n)
    return matmul(a, c, ctx.node.tensor.dtype).reshape((*batch, *m_shape, *n_shape))


def _dot_flops(types: list[Type], out: Type, attrs: dict) -> int:
    lhs = tensor(types[0])
    d: DotDims = attrs.get("dims") or DotDims()
    return 2 * tensor(out).size * math.prod(lhs.shape[i] for i in d.lhs_contracting)


def _check_dot_dims(rank: int, batch: tuple[int, ...], contracting: tuple[int, ...], side: str) -> None:
    for what, dims in (("batch", batch), ("contracting", contracting)):
        for i in dims:
            if not 0 <= i < rank:
                raise ShapeError(f"dot: {side} {what} dimension {i} is out of range for rank {rank}")
    both = list(batch) + list(contracting)
    if len(set(both)) != len(both):
        raise ShapeError(f"dot: {side} dimensions repeat (batch {list(batch)}, "
                         f"contracting {list(contracting)})")


@op("dot", engine=TENSOR, arity=(2, 2), impl=_dot_impl, flops=_dot_flops, neuron=("Dot", "DotGeneral"),
    relay=("nn.dense", "nn.matmul", "nn.batch_matmul"),
    notes="general dot: any number of batch and contracting dimensions; result = batch, lhs free, rhs free; "
          "preferred element type; fp32 accumulation on the device")
def _dot(types: list[Type], attrs: dict) -> Type:
    count(types, 2, "dot")
    lhs, rhs = tensors(types)
    d = attrs.get("dims") or DotDims()
    if not isinstance(d, DotDims):
        raise ShapeError("dot needs dot dimension numbers")
    _check_dot_dims(lhs.rank, d.lhs_batch, d.lhs_contracting, "lhs")
    _check_dot_dims(rhs.rank, d.rhs_batch, d.rhs_contracting, "rhs")
    if len(d.lhs_contracting) != len(d.rhs_contracting):
        raise ShapeError(f"dot: {len(d.lhs_contracting)} lhs and {len(d.rhs_contracting)} rhs contracting "
                         "dimensions; they must pair up")
    if len(d.lhs_batch) != len(d.rhs_batch):
        raise ShapeError(f"dot: {len(d.lhs_batch)} lhs and {len(d.rhs_batch)} rhs batch dimensions; "
                         "they must pair up")
    for what, ls, rs in (("contracting", d.lhs_contracting, d.rhs_contracting),
                         ("batch", d.lhs_batch, d.rhs_batch)):
        for i, j in zip(ls, rs):
            if lhs.shape[i] != rhs.shape[j]:
                raise ShapeError(f"dot: {what} dimension sizes differ: lhs dimension {i} is {lhs.shape[i]}, "
                                 f"rhs dimension {j} is {rhs.shape[j]} ({lhs} x {rhs})")
    dtype = result_type(attrs, operand_dtype(lhs.dtype, rhs.dtype, "dot"), "dot")
    shape = ([lhs.shape[i] for i in d.lhs_batch]
             + [lhs.shape[i] for i in _free(lhs.rank, d.lhs_batch, d.lhs_contracting)]
             + [rhs.shape[i] for i in _free(rhs.rank, d.rhs_batch, d.rhs_contracting)])
    return TensorType(dtype, tuple(shape))


# --- convolution -----------------------------------------------------------------------------

def _conv_impl(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
    """Dilate and pad the input, then contract its windows with the kernel in fp64, rounding once:
    kernel offset by kernel offset (one batched matmul over the groups each), or output position by
    position where the window is the larger (a weight gradient's), or as a multiply-add per offset
    for a depthwise convolution. The ways sum in different orders, in fp64: far below fp32's rounding."""
    lhs, rhs = args
    d: ConvDims = attrs["dims"]
    window = attrs["window"]
    fgc, bgc = attrs.get("feature_group_count", 1), attrs.get("batch_group_count", 1)
    x = _wide(np.transpose(lhs, (d.input_batch, d.input_feature, *d.input_spatial)))
    w = _wide(np.transpose(rhs, (d.kernel_output_feature, d.kernel_input_feature, *d.kernel_spatial)))
    flip = tuple(2 + i for i, wd in enumerate(window) if wd.reversal)
    if flip:
        w = np.flip(w, flip)
    view = windows(x, window, 0, ctx)  # (N, C, output spatial..., kernel spatial...)
    nsp = len(window)
    n, (o, i) = x.shape[0], w.shape[:2]
    out_sp = view.shape[2:2 + nsp]
    s = math.prod(out_sp)
    groups, bg, og = fgc * bgc, n // bgc, o // (fgc * bgc)
    k = math.prod(wd.size for wd in window)
    if bgc == 1 and i == 1 and groups > 1:
        # Depthwise: each output feature reads one input feature. Multiply-add tap by tap in the
        # operand's own layout (a matmul over one input feature would transpose every slab).
        taps = w.reshape(groups, og, k)
        acc = np.zeros((n, groups, og, *out_sp), dtype=x.dtype)
        part = np.empty_like(acc)
        for t, at in enumerate(np.ndindex(*(wd.size for wd in window))):
            np.multiply(view[(..., *at)][:, :, None], taps[:, :, t].reshape(groups, og, *(1,) * nsp), out=part)
            acc += part
        out = acc.reshape(n, o, *out_sp)
    elif k <= s:
        taps = w.reshape(groups, og, i, k).transpose(0, 3, 2, 1)  # G,K,I,Og
        acc = np.zeros((groups, bg * s, og), dtype=x.dtype)
        for t, at in enumerate(np.ndindex(*(wd.size for wd in window))):
            slab = view[(..., *at)].reshape(bgc, bg, fgc, i, s)  # batch groups split N, feature groups split C
            acc += np.matmul(slab.transpose(0, 2, 1, 4, 3).reshape(groups, bg * s, i), taps[:, t])
        out = acc.reshape(groups, bg, s, og).transpose(1, 0, 3, 2).reshape((bg, o, *out_sp))
    else:
        # A weight gradient's window is the whole image and its output a few taps: loop over the
        # outputs, each one matmul contracting the input features and the window together.
        taps = w.reshape(groups, og, i * k).transpose(0, 2, 1)  # G,I*K,Og
        out = np.empty((groups, bg, s, og), dtype=x.dtype)
        for q, at in enumerate(np.ndindex(*out_sp)):
            slab = view[(slice(None), slice(None), *at)].reshape(bgc, bg, fgc, i * k)
            out[:, :, q] = np.matmul(slab.transpose(0, 2, 1, 3).reshape(groups, bg, i * k), taps)
        out = out.transpose(1, 0, 3, 2).reshape((bg, o, *out_sp))
    canonical = (d.output_batch, d.output_feature, *d.output_spatial)
    return to_dtype(np.transpose(out, np.argsort(canonical)), ctx.node.tensor.dtype)


def _conv_flops(types: list[Type], out: Type, attrs: dict) -> int:
    rhs = tensor(types[1])
    d: ConvDims = attrs["dims"]
    taps = math.prod(rhs.shape[k] for k in d.kernel_spatial)
    return 2 * tensor(out).size * taps * rhs.shape[d.kernel_input_feature]


def _check_roles(rank: int, roles: list[int], what: str, labels: str) -> None:
    if any(not 0 <= r < rank for r in roles):
        raise ShapeError(f"convolution: a {what} dimension number is out of range for rank {rank} ({labels})")
    if sorted(roles) != list(range(rank)):
        raise ShapeError(f"convolution: {what} dimensions must name each dimension exactly once ({labels})")


@op("convolution", engine=TENSOR, arity=(2, 2), impl=_conv_impl, flops=_conv_flops, neuron=("Convolution",),
    relay=("nn.conv1d", "nn.conv2d", "nn.conv3d"),
    notes="general convolution: any layout (dim_labels), strides, padding (negative crops), lhs/rhs "
          "dilation, window reversal, feature_group_count (grouped, depthwise), batch_group_count")
def _convolution(types: list[Type], attrs: dict) -> Type:
    count(types, 2, "convolution")
    lhs, rhs = tensors(types)
    d = attrs.get("dims")
    if not isinstance(d, ConvDims):
        raise ShapeError("convolution needs dimension numbers (dim_labels)")
    fgc, bgc = attrs.get("feature_group_count", 1), attrs.get("batch_group_count", 1)
    if not isinstance(fgc, int) or fgc <= 0:
        raise ShapeError(f"convolution: feature_group_count must be a positive number, got {fgc}")
    if not isinstance(bgc, int) or bgc <= 0:
        raise ShapeError(f"convolution: batch_group_count must be a positive number, got {bgc}")
    if fgc > 1 and bgc > 1:
        raise ShapeError(f"convolution: batch_group_count {bgc} and feature_group_count {fgc} cannot both "
                         "be greater than 1")
    nsp = len(d.input_spatial)
    labels = d.labels() if len(d.kernel_spatial) == len(d.output_spatial) == nsp else str(d)
    if len(d.kernel_spatial) != nsp or len(d.output_spatial) != nsp:
        raise ShapeError(f"convolution: input, kernel and output must have the same number of spatial "
                         f"dimensions ({labels})")
    window = attrs.get("window")
    if not isinstance(window, tuple) or len(window) != nsp:
        raise ShapeError(f"convolution: window has {len(window) if isinstance(window, tuple) else 'no'} "
                         f"dimensions, dim_labels {labels} have {nsp} spatial dimensions")
    for t, side in ((lhs, "lhs"), (rhs, "rhs")):
        if t.rank != nsp + 2:
            raise ShapeError(f"convolution: {side} must have rank {nsp + 2} for {labels}, got {t}")
    for what, roles in (("input", [d.input_batch, d.input_feature, *d.input_spatial]),
                        ("kernel", [d.kernel_input_feature, d.kernel_output_feature, *d.kernel_spatial]),
                        ("output", [d.output_batch, d.output_feature, *d.output_spatial])):
        _check_roles(nsp + 2, roles, what, labels)
    batch, features = lhs.shape[d.input_batch], lhs.shape[d.input_feature]
    k_in, k_out = rhs.shape[d.kernel_input_feature], rhs.shape[d.kernel_output_feature]
    if k_out % bgc:
        raise ShapeError(f"convolution: output feature dimension {k_out} is not a multiple of "
                         f"batch_group_count {bgc} ({lhs}, {rhs}, {labels})")
    if features % fgc or features // fgc != k_in:
        raise ShapeError(f"convolution: input feature dimension {features} must equal kernel input feature "
                         f"dimension {k_in} x feature_group_count {fgc} ({lhs}, {rhs}, {labels})")
    if k_out % fgc:
        raise ShapeError(f"convolution: output feature dimension {k_out} is not divisible by "
                         f"feature_group_count {fgc} ({lhs}, {rhs}, {labels})")
    if batch % bgc:
        raise ShapeError(f"convolution: input batch dimension {batch} is not divisible by "
                         f"batch_group_count {bgc} ({lhs}, {rhs}, {labels})")
    kernel = [rhs.shape[k] for k in d.kernel_spatial]
    if kernel != [w.size for w in window]:
        raise ShapeError(f"convolution: window sizes {'x'.join(str(w.size) for w in window)} do not match "
                         f"the kernel's spatial dimensions {'x'.join(map(str, kernel))} ({rhs}, {labels})")
    spatial = window_output_shape([lhs.shape[k] for k in d.input_spatial], window, "convolution",
                                  reversal=True)
    dtype = result_type(attrs, operand_dtype(lhs.dtype, rhs.dtype, "convolution"), "convolution")
    shape = [0] * (nsp + 2)
    shape[d.output_batch], shape[d.output_feature] = batch // bgc, k_out
    for k, size in zip(d.output_spatial, spatial):
        shape[k] = size
    return TensorType(dtype, tuple(shape))

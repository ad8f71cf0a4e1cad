"""Lowerings of Relay's ``nn.*`` operators: convolutions, dense and batched matmuls, pooling,
padding, normalizations, softmax and activations.

Layout strings (``NCHW``, ``NHWC``, ``OIHW``, ``HWIO``, ...) become the dimension numbers of the IR's
convolution and the window of reduce-window, so any layout lowers without transposes. Relay's
padding lists (1, n or 2n values) and pooling rules (``ceil_mode``, ``count_include_pad``) follow
TVM's type relations and TOPI's definitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nxsat import dtypes as dt
from nxsat.attrs import ConvDims, DotDims, PadDim, WindowDim
from nxsat.frontend.relay_lower import Call, Emitter, Value, lowering, normalize_axis
from nxsat.frontend.relay_tensor import slice_dim
from nxsat.ir import Node

_SPATIAL = {1: "W", 2: "HW", 3: "DHW"}
MAX_POOL_OUTPUT = 1 << 24  # average pools build one divisor vector per spatial dimension
_DEFAULT_LAYOUT = {1: ("NCW", "OIW"), 2: ("NCHW", "OIHW"), 3: ("NCDHW", "OIDHW")}


def _layout(em: Emitter, layout: str, roles: str, nsp: int, what: str) -> tuple[int, int, tuple[int, ...]]:
    """Positions of the two role letters (``NC`` or ``OI``) and the spatial letters in ``layout``."""
    letters = roles + _SPATIAL[nsp]
    if any(c.islower() or c.isdigit() for c in layout):
        raise em.fail(
            "NCC_EVRF001",
            f"{what} {layout}: packed layouts (split axes) are not supported",
            f"use a plain layout such as {letters}",
        )
    if sorted(layout) != sorted(letters):
        raise em.fail("NCC_EPRS003", f"{what} {layout!r} must arrange the letters {letters}")
    return layout.index(roles[0]), layout.index(roles[1]), tuple(layout.index(c) for c in _SPATIAL[nsp])


def _padding(em: Emitter, pad: tuple[int, ...], nsp: int, what: str = "padding") -> tuple[tuple[int, int], ...]:
    """Relay padding: one value for all sides, one per spatial dimension, or all befores then afters."""
    if len(pad) == 1:
        pairs = [(pad[0], pad[0])] * nsp
    elif len(pad) == nsp:
        pairs = [(p, p) for p in pad]
    elif len(pad) == 2 * nsp:
        pairs = list(zip(pad[:nsp], pad[nsp:]))
    else:
        raise em.fail("NCC_EPRS003", f"{what} needs 1, {nsp} or {2 * nsp} values, got {len(pad)}")
    if any(p < 0 for pair in pairs for p in pair):
        raise em.fail("NCC_EPRS003", f"{what} {list(pad)} has a negative value")
    return tuple(pairs)


def _spatial_ints(em: Emitter, call: Call, key: str, nsp: int, default: int) -> tuple[int, ...]:
    v = call.attrs.ints(key, (default,) * nsp)
    if len(v) == 1 and nsp > 1:
        v = v * nsp
    if len(v) != nsp:
        raise em.fail("NCC_EPRS003", f"{call.op}: {key} needs {nsp} values, got {len(v)}")
    if any(x < 1 for x in v):
        raise em.fail("NCC_EPRS003", f"{call.op}: {key} {list(v)} must be positive")
    return v


# --- convolution -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _ConvCall:
    """What nn.convNd and nn.convNd_transpose share: attributes, layouts decoded to roles."""

    strides: tuple[int, ...]
    dilation: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    groups: int
    channels: int | None
    kernel_size: tuple[int, ...] | None
    kernel_layout: str
    out_dtype: dt.DType | None
    data_roles: tuple[int, int, tuple[int, ...]]  # batch, feature, spatial
    kernel_roles: tuple[int, int, tuple[int, ...]]  # output, input, spatial
    out_roles: tuple[int, int, tuple[int, ...]]


def _conv_call(em: Emitter, call: Call, nsp: int, data: Node, weight: Node, kernel_layout: str) -> _ConvCall:
    a = call.attrs
    strides = _spatial_ints(em, call, "strides", nsp, 1)
    dilation = _spatial_ints(em, call, "dilation", nsp, 1)
    pads = _padding(em, a.ints("padding", (0,)), nsp)
    data_layout = a.str("data_layout", _DEFAULT_LAYOUT[nsp][0])
    kernel_layout = a.str("kernel_layout", kernel_layout)
    out_layout = a.str("out_layout", "") or data_layout
    if len(data.shape) != nsp + 2 or len(weight.shape) != nsp + 2:
        raise em.fail(
            "NCC_EVRF064",
            f"{call.op} needs rank-{nsp + 2} data and weight, got {list(data.shape)} and {list(weight.shape)}",
        )
    return _ConvCall(
        strides, dilation, pads, a.int("groups", 1), a.opt_int("channels"), a.opt_ints("kernel_size"),
        kernel_layout, a.dtype("out_dtype", None),
        data_roles=_layout(em, data_layout, "NC", nsp, "data_layout"),
        kernel_roles=_layout(em, kernel_layout, "OI", nsp, "kernel_layout"),
        out_roles=_layout(em, out_layout, "NC", nsp, "out_layout"),
    )


def _check_kernel_size(em: Emitter, call: Call, conv: _ConvCall, ksizes: tuple[int, ...]) -> None:
    if conv.kernel_size is not None and tuple(conv.kernel_size) != ksizes:
        raise em.fail(
            "NCC_EVRF064",
            f"{call.op}: kernel_size={list(conv.kernel_size)} but the weight's window is {list(ksizes)}",
        )


def _emit_conv(em: Emitter, conv: _ConvCall, data: Node, weight: Node, window: tuple[WindowDim, ...],
               kernel_roles: tuple[int, int, tuple[int, ...]]) -> Value:
    ib, if_, isp = conv.data_roles
    ko, ki, ksp = kernel_roles
    ob, of, osp = conv.out_roles
    out = conv.out_dtype if conv.out_dtype is not None and conv.out_dtype is not data.dtype else None
    return em.op(
        "convolution",
        [data, weight],
        window=window,
        dims=ConvDims(ib, if_, isp, ki, ko, ksp, ob, of, osp),
        feature_group_count=conv.groups,
        batch_group_count=1,
        dtype=out,
    )


def _conv(em: Emitter, call: Call, nsp: int) -> Value:
    data, weight = call.tensors(2)
    conv = _conv_call(em, call, nsp, data, weight, _DEFAULT_LAYOUT[nsp][1])
    groups, channels = conv.groups, conv.channels
    _, if_, _ = conv.data_roles
    ko, ki, ksp = conv.kernel_roles
    if groups < 1 or data.shape[if_] % groups:
        raise em.fail("NCC_EVRF064", f"{call.op}: groups={groups} does not divide the {data.shape[if_]} input channels")
    cin = data.shape[if_]
    if (
        groups > 1
        and groups == cin
        and weight.shape[ko] == cin
        and weight.shape[ki] > 1
        and channels == cin * weight.shape[ki]
    ):
        # TVM's depthwise form with a channel multiplier M: weight [C, M, ...] in OIHW terms means
        # output channel c*M + m, the same elements as the grouped form [C*M, 1, ...].
        perm = (ko, ki, *ksp)
        weight = em.reshape(
            em.transpose(weight, perm), (cin * weight.shape[ki], 1) + tuple(weight.shape[d] for d in ksp)
        )
        ko, ki, ksp = 0, 1, tuple(range(2, nsp + 2))
    if weight.shape[ki] * groups != cin:
        raise em.fail(
            "NCC_EVRF064",
            f"{call.op}: weight {list(weight.shape)} ({conv.kernel_layout}) has "
            f"{weight.shape[ki]} input channels per group; data has {cin} channels in {groups} group(s)",
        )
    if channels is not None and weight.shape[ko] != channels:
        raise em.fail(
            "NCC_EVRF064",
            f"{call.op}: channels={channels} but the weight has {weight.shape[ko]} output channels",
        )
    ksizes = tuple(weight.shape[d] for d in ksp)
    _check_kernel_size(em, call, conv, ksizes)
    window = tuple(
        WindowDim(size=k, stride=s, pad_lo=lo, pad_hi=hi, rhs_dilation=d)
        for k, s, (lo, hi), d in zip(ksizes, conv.strides, conv.pads, conv.dilation)
    )
    return _emit_conv(em, conv, data, weight, window, (ko, ki, ksp))


@lowering("nn.conv1d", notes="convolution (layouts, groups, strides, padding, dilation)")
def _conv1d(em: Emitter, call: Call) -> Value:
    return _conv(em, call, 1)


@lowering("nn.conv2d", notes="convolution (layouts, groups, strides, padding, dilation)")
def _conv2d(em: Emitter, call: Call) -> Value:
    return _conv(em, call, 2)


@lowering("nn.conv3d", notes="convolution (layouts, groups, strides, padding, dilation)")
def _conv3d(em: Emitter, call: Call) -> Value:
    return _conv(em, call, 3)


def _conv_transpose(em: Emitter, call: Call, nsp: int) -> Value:
    """A transposed convolution is a convolution of the input dilated by the strides with the
    spatially reversed kernel, its channel roles swapped (TVM's kernel layout default IOHW)."""
    data, weight = call.tensors(2)
    out_pad = call.attrs.ints("output_padding", (0,) * nsp)
    out_pad = out_pad * nsp if len(out_pad) == 1 else out_pad
    conv = _conv_call(em, call, nsp, data, weight, "IO" + _SPATIAL[nsp])
    groups, channels = conv.groups, conv.channels
    if len(out_pad) != nsp or any(p < 0 or p >= max(s, d) for p, s, d in zip(out_pad, conv.strides, conv.dilation)):
        raise em.fail("NCC_EPRS003", f"{call.op}: output_padding {list(out_pad)} must be below the stride")
    _, if_, _ = conv.data_roles
    ko, ki, ksp = conv.kernel_roles
    cin = data.shape[if_]
    if groups < 1 or cin % groups or weight.shape[ki] != cin:
        raise em.fail(
            "NCC_EVRF064",
            f"{call.op}: weight {list(weight.shape)} ({conv.kernel_layout}) does not take "
            f"{cin} input channels in {groups} group(s)",
        )
    cout = weight.shape[ko] * groups
    if channels is not None and channels != cout:
        raise em.fail("NCC_EVRF064", f"{call.op}: channels={channels} but the weight gives {cout}")
    ksizes = tuple(weight.shape[d] for d in ksp)
    _check_kernel_size(em, call, conv, ksizes)
    # Canonical kernel [I, O/g, spatial...] -> forward kernel [O, I/g, spatial...] per group.
    w = em.transpose(weight, (ki, ko, *ksp))
    if groups > 1:
        w = em.reshape(w, (groups, cin // groups, weight.shape[ko]) + ksizes)
        w = em.transpose(w, (0, 2, 1) + tuple(range(3, nsp + 3)))
        w = em.reshape(w, (cout, cin // groups) + ksizes)
    else:
        w = em.transpose(w, (1, 0) + tuple(range(2, nsp + 2)))
    w = em.op("reverse", [w], dimensions=tuple(range(2, nsp + 2)))
    window = tuple(
        WindowDim(size=k, stride=1, pad_lo=(k - 1) * d - lo, pad_hi=(k - 1) * d - hi + op, lhs_dilation=s,
                  rhs_dilation=d)
        for k, s, (lo, hi), d, op in zip(ksizes, conv.strides, conv.pads, conv.dilation, out_pad)
    )
    return _emit_conv(em, conv, data, w, window, (0, 1, tuple(range(2, nsp + 2))))


@lowering("nn.conv1d_transpose", notes="convolution with lhs dilation and a reversed kernel")
def _conv1d_transpose(em: Emitter, call: Call) -> Value:
    return _conv_transpose(em, call, 1)


@lowering("nn.conv2d_transpose", notes="convolution with lhs dilation and a reversed kernel")
def _conv2d_transpose(em: Emitter, call: Call) -> Value:
    return _conv_transpose(em, call, 2)


# --- matrix products -------------------------------------------------------------------------


def _dot(em: Emitter, a: Node, b: Node, dims: DotDims, out_dtype: dt.DType | None) -> Node:
    em.same_dtype("dot", a, b)
    d = out_dtype if out_dtype is not None and out_dtype is not a.dtype else None
    return em.op("dot", [a, b], dims=dims, dtype=d, precision=())


@lowering("nn.dense", notes="dot")
def _dense(em: Emitter, call: Call) -> Value:
    x, w = call.tensors(2)
    units = call.attrs.opt_int("units")
    out_dtype = call.attrs.dtype("out_dtype", None)
    if len(w.shape) != 2 or not x.shape:
        raise em.fail(
            "NCC_EVRF064",
            f"nn.dense: weight must be [units, k] and data [..., k], got {list(w.shape)} and {list(x.shape)}",
        )
    if x.shape[-1] != w.shape[1]:
        raise em.fail("NCC_EVRF064", f"nn.dense: data {list(x.shape)} and weight {list(w.shape)} disagree on k")
    if units is not None and units != w.shape[0]:
        raise em.fail("NCC_EVRF064", f"nn.dense: units={units} but the weight has {w.shape[0]} rows")
    return _dot(em, x, w, DotDims((len(x.shape) - 1,), (1,)), out_dtype)


@lowering("nn.matmul", notes="dot")
def _matmul(em: Emitter, call: Call) -> Value:
    x, w = call.tensors(2)
    units = call.attrs.opt_int("units")
    out_dtype = call.attrs.dtype("out_dtype", None)
    ta, tb = call.attrs.bool("transpose_a", False), call.attrs.bool("transpose_b", False)
    if len(w.shape) != 2 or not x.shape:
        raise em.fail("NCC_EVRF064", f"nn.matmul: unsupported shapes {list(x.shape)} and {list(w.shape)}")
    if ta and len(x.shape) != 2:
        raise em.fail("NCC_EVRF064", "nn.matmul with transpose_a needs 2-D data")
    k_x = 0 if ta else len(x.shape) - 1
    k_w = 1 if tb else 0
    if x.shape[k_x] != w.shape[k_w]:
        raise em.fail("NCC_EVRF064", f"nn.matmul: {list(x.shape)} and {list(w.shape)} disagree on k")
    if units is not None and units != w.shape[1 - k_w]:
        raise em.fail("NCC_EVRF064", f"nn.matmul: units={units} but the weight gives {w.shape[1 - k_w]}")
    return _dot(em, x, w, DotDims((k_x,), (k_w,)), out_dtype)


@lowering("nn.batch_matmul", notes="dot with a batch dimension (broadcast batch)")
def _batch_matmul(em: Emitter, call: Call) -> Value:
    x, y = call.tensors(2)
    out_dtype = call.attrs.dtype("out_dtype", None)
    ta, tb = call.attrs.bool("transpose_a", False), call.attrs.bool("transpose_b", True)
    if len(x.shape) != 3 or len(y.shape) != 3:
        raise em.fail("NCC_EVRF064", f"nn.batch_matmul needs rank-3 operands, got {list(x.shape)} and {list(y.shape)}")
    kx, ky = (1 if ta else 2), (2 if tb else 1)
    if x.shape[kx] != y.shape[ky]:
        raise em.fail("NCC_EVRF064", f"nn.batch_matmul: {list(x.shape)} and {list(y.shape)} disagree on k")
    batch = em.broadcast_shape((x.shape[0],), (y.shape[0],))[0]
    x = em.broadcast_to(x, (batch,) + x.shape[1:])
    y = em.broadcast_to(y, (batch,) + y.shape[1:])
    # The dot's result is ordered batch, x's free dimension, y's free dimension: [B, M, N].
    return _dot(em, x, y, DotDims((kx,), (ky,), (0,), (0,)), out_dtype)


@lowering("nn.bias_add", notes="broadcast + add")
def _bias_add(em: Emitter, call: Call) -> Value:
    x, b = call.tensors(2)
    axis = normalize_axis(call.attrs.int("axis", 1), len(x.shape), em.loc)
    em.same_dtype("nn.bias_add", x, b)
    return em.op("add", [x, em.along(b, x.shape, axis)])


# --- activations -----------------------------------------------------------------------------


@lowering("nn.relu", notes="maximum with 0")
def _relu(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    return em.op("maximum", [x, em.full(0, x.dtype, x.shape)])


@lowering("nn.leaky_relu", notes="compare + select")
def _leaky_relu(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    alpha = call.attrs.float("alpha", 0.25)
    pos = em.compare("GT", x, em.full(0, x.dtype, x.shape))
    return em.op("select", [pos, x, em.scalar_binary("multiply", x, alpha)])


@lowering("nn.prelu", notes="compare + select")
def _prelu(em: Emitter, call: Call) -> Value:
    x, alpha = call.tensors(2)
    axis = normalize_axis(call.attrs.int("axis", 1), len(x.shape), em.loc)
    em.same_dtype("nn.prelu", x, alpha)
    pos = em.compare("GT", x, em.full(0, x.dtype, x.shape))
    return em.op("select", [pos, x, em.op("multiply", [x, em.along(alpha, x.shape, axis)])])


@lowering("nn.softmax", "nn.fast_softmax", notes="reduce max, subtract, exponential, reduce add, divide")
@lowering("nn.log_softmax", notes="reduce max, subtract, exponential, reduce add, log, subtract")
def _softmax(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    if not x.dtype.is_float:
        raise em.fail("NCC_EVRF064", f"{call.op} needs a float tensor, got {x.dtype.relay}")
    axis = normalize_axis(call.attrs.int("axis", -1), len(x.shape), em.loc)
    top = em.broadcast_in_dim(em.reduce(x, (axis,), "max"), x.shape, tuple(i for i in range(len(x.shape)) if i != axis))
    shifted = em.op("subtract", [x, top])
    e = em.op("exponential", [shifted])
    total = em.broadcast_in_dim(
        em.reduce(e, (axis,), "add"), x.shape, tuple(i for i in range(len(x.shape)) if i != axis)
    )
    if call.op == "nn.log_softmax":
        return em.op("subtract", [shifted, em.op("log", [total])])
    return em.op("divide", [e, total])


@lowering("nn.dropout", notes="identity and an all-ones mask (inference)")
def _dropout(em: Emitter, call: Call) -> Value:
    # Inference: the identity, and the mask Relay also returns is all ones.
    (x,) = call.tensors(1)
    rate = call.attrs.float("rate", 0.5)
    if not 0 <= rate < 1:
        raise em.fail("NCC_EPRS003", f"nn.dropout: rate {rate} must be in [0, 1)")
    return (x, em.full(1, x.dtype, x.shape))


@lowering("nn.batch_flatten", notes="reshape")
def _batch_flatten(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    if not x.shape:
        raise em.fail("NCC_EVRF064", "nn.batch_flatten needs a batch dimension")
    return em.reshape(x, (x.shape[0], math.prod(x.shape[1:])))


# --- normalization ---------------------------------------------------------------------------


@lowering("nn.batch_norm", notes="batch-norm-inference; (result, mean, var) tuple")
def _batch_norm(em: Emitter, call: Call) -> Value:
    x, gamma, beta, mean, var = call.tensors(5)
    axis = normalize_axis(call.attrs.int("axis", 1), len(x.shape), em.loc)
    eps = call.attrs.float("epsilon", 1e-5)
    center, scale = call.attrs.bool("center", True), call.attrs.bool("scale", True)
    c = x.shape[axis]
    for name, v in (("gamma", gamma), ("beta", beta), ("moving_mean", mean), ("moving_var", var)):
        if v.shape != (c,):
            raise em.fail(
                "NCC_EVRF064",
                f"nn.batch_norm: {name} is {list(v.shape)}, expected [{c}] for axis {axis} of {list(x.shape)}",
            )
    em.same_dtype("nn.batch_norm", x, gamma, beta, mean, var)
    if not scale:
        gamma = em.full(1, x.dtype, (c,))
    if not center:
        beta = em.full(0, x.dtype, (c,))
    out = em.op("batch-norm-inference", [x, gamma, beta, mean, var], epsilon=eps, feature_index=axis)
    # Relay returns (result, moving_mean, moving_var); inference leaves the statistics unchanged.
    return (out, mean, var)


def _normalize(em: Emitter, x: Node, axes: tuple[int, ...], eps: float) -> Node:
    """(x - mean) / sqrt(var + eps) over ``axes``."""
    mean = em.mean(x, axes, keepdims=True)
    d = em.binary("subtract", x, mean)
    var = em.mean(em.op("multiply", [d, d]), axes, keepdims=True)
    denom = em.op("rsqrt", [em.scalar_binary("add", var, eps)])
    return em.binary("multiply", d, denom)


def _affine(em: Emitter, call: Call, y: Node, gamma: Node, beta: Node, axis: int) -> Node:
    if call.attrs.bool("scale", True):
        y = em.op("multiply", [y, em.along(gamma, y.shape, axis)])
    if call.attrs.bool("center", True):
        y = em.op("add", [y, em.along(beta, y.shape, axis)])
    return y


@lowering("nn.layer_norm", notes="reduce-based mean/variance, rsqrt, scale, shift")
def _layer_norm(em: Emitter, call: Call) -> Value:
    x, gamma, beta = call.tensors(3)
    em.same_dtype(call.op, x, gamma, beta)
    axis = normalize_axis(call.attrs.int("axis", -1), len(x.shape), em.loc)
    y = _normalize(em, x, (axis,), call.attrs.float("epsilon", 1e-5))
    return _affine(em, call, y, gamma, beta, axis)


@lowering("nn.instance_norm", notes="reduce-based mean/variance, rsqrt, scale, shift")
def _instance_norm(em: Emitter, call: Call) -> Value:
    x, gamma, beta = call.tensors(3)
    em.same_dtype(call.op, x, gamma, beta)
    axis = normalize_axis(call.attrs.int("axis", 1), len(x.shape), em.loc)
    spatial = tuple(i for i in range(1, len(x.shape)) if i != axis)
    y = _normalize(em, x, spatial, call.attrs.float("epsilon", 1e-5))
    return _affine(em, call, y, gamma, beta, axis)


@lowering("nn.group_norm", notes="reshape to groups + reduce-based normalization")
def _group_norm(em: Emitter, call: Call) -> Value:
    x, gamma, beta = call.tensors(3)
    em.same_dtype(call.op, x, gamma, beta)
    groups = call.attrs.int("num_groups")
    axis = normalize_axis(call.attrs.int("axis", 1), len(x.shape), em.loc)
    c = x.shape[axis]
    if groups < 1 or c % groups:
        raise em.fail("NCC_EVRF064", f"nn.group_norm: {groups} groups do not divide {c} channels")
    # [.., C, ..] -> [.., G, C/G, ..]; normalize each group over its channels and everything after.
    split = x.shape[:axis] + (groups, c // groups) + x.shape[axis + 1 :]
    g = em.reshape(x, split)
    y = _normalize(em, g, tuple(range(axis + 1, len(split))), call.attrs.float("epsilon", 1e-5))
    return _affine(em, call, em.reshape(y, x.shape), gamma, beta, axis)


@lowering("nn.l2_normalize", notes="reduce add of squares, maximum with eps, rsqrt")
def _l2_normalize(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    eps = call.attrs.float("eps")
    axes = call.attrs.opt_ints("axis")
    axes = tuple(range(len(x.shape))) if not axes else tuple(normalize_axis(a, len(x.shape), em.loc) for a in axes)
    ss = em.keep_dims(em.reduce(em.op("multiply", [x, x]), axes, "add"), x.shape, axes)
    ss = em.binary("maximum", ss, em.const(eps, x.dtype))
    return em.binary("multiply", x, em.op("rsqrt", [ss]))


# --- pooling ---------------------------------------------------------------------------------


def _pool_layout(em: Emitter, call: Call, nsp: int) -> tuple[int, ...]:
    layout = call.attrs.str("layout", _DEFAULT_LAYOUT[nsp][0])
    out_layout = call.attrs.str("out_layout", "")
    if out_layout and out_layout != layout:
        raise em.fail("NCC_EVRF001", f"{call.op}: out_layout {out_layout} differs from layout {layout}")
    return _layout(em, layout, "NC", nsp, "layout")[2]


def _pool(em: Emitter, call: Call, nsp: int, kind: str) -> Value:
    (x,) = call.tensors(1)
    sp = _pool_layout(em, call, nsp)
    if len(x.shape) != nsp + 2:
        raise em.fail("NCC_EVRF064", f"{call.op} needs a rank-{nsp + 2} tensor, got {list(x.shape)}")
    size = _spatial_ints(em, call, "pool_size", nsp, 1) if "pool_size" in call.attrs else None
    if size is None:
        raise em.fail("NCC_EPRS003", f"{call.op} needs the attribute pool_size")
    strides = _spatial_ints(em, call, "strides", nsp, 1)
    dilation = _spatial_ints(em, call, "dilation", nsp, 1)
    pads = _padding(em, call.attrs.ints("padding", (0,)), nsp)
    ceil_mode = call.attrs.bool("ceil_mode", False)
    include_pad = call.attrs.bool("count_include_pad", False) if kind == "avg" else False
    window = [WindowDim() for _ in x.shape]
    for j, d in enumerate(sp):
        lo, hi = pads[j]
        extra = strides[j] - 1 if ceil_mode else 0  # TOPI pads the tail by stride-1 for ceil_mode
        window[d] = WindowDim(size=size[j], stride=strides[j], pad_lo=lo, pad_hi=hi + extra, rhs_dilation=dilation[j])
        if window[d].output_size(x.shape[d]) < 1:
            raise em.fail(
                "NCC_EVRF064",
                f"{call.op}: the window {size[j]} (dilation {dilation[j]}) does not fit "
                f"dimension {d} of {list(x.shape)} with padding {lo}+{hi}",
            )
    if kind == "max":
        return _reduce_window(em, x, tuple(window), "max")
    summed = _reduce_window(em, x, tuple(window), "add")
    if any(window[d].output_size(x.shape[d]) > MAX_POOL_OUTPUT for d in sp):
        raise em.fail("NCC_EVRF001", f"{call.op}: more than {MAX_POOL_OUTPUT} outputs along one dimension")
    counts = [_window_counts(x.shape[d], window[d], pads[j][1], include_pad) for j, d in enumerate(sp)]
    return _divide_by_counts(em, summed, sp, counts)


def _reduce_window(em: Emitter, x: Node, window: tuple[WindowDim, ...], kind: str) -> Node:
    init = em.const(em.identity(kind, x.dtype), x.dtype)
    return em.op("reduce-window", [x, init], window=window, to_apply=em.reducer(kind, x.dtype))


def _window_counts(n: int, w: WindowDim, pad_hi: int, include_pad: bool) -> np.ndarray:
    """How many elements each output position of an average pool divides by (TOPI's rule)."""
    out = w.output_size(n)
    start = np.arange(out) * w.stride - w.pad_lo
    last = start + (w.size - 1) * w.rhs_dilation
    d = w.rhs_dilation
    if include_pad:
        last = np.minimum(last, n + pad_hi - 1)
        return (last - start) // d + 1
    jumps = np.maximum((d - 1 - start) // d, 0)  # steps until the window reaches real data
    last = np.minimum(last, n - 1)
    return np.maximum((last - (start + d * jumps)) // d + 1, 1)


def _divide_by_counts(em: Emitter, summed: Node, sp: tuple[int, ...], counts: list[np.ndarray]) -> Node:
    """Divide by the window sizes: one scalar when they are all equal, else the product of one
    count vector per spatial dimension (exact in floating point: small integers)."""
    if all(np.all(c == c[0]) for c in counts if c.size):
        total = math.prod(int(c[0]) if c.size else 1 for c in counts)
        return summed if total == 1 else em.scalar_binary("divide", summed, total)
    div = None
    for d, c in zip(sp, counts):
        v = em.broadcast_in_dim(em.const(c, summed.dtype), summed.shape, (d,))
        div = v if div is None else em.op("multiply", [div, v])
    return em.op("divide", [summed, div])


for _n in (1, 2, 3):
    for _kind in ("max", "avg"):
        lowering(f"nn.{_kind}_pool{_n}d", notes=f"reduce-window ({_kind}); ceil_mode, count_include_pad")(
            lambda em, call, n=_n, k=_kind: _pool(em, call, n, k)
        )


def _global_pool(em: Emitter, call: Call, kind: str) -> Value:
    (x,) = call.tensors(1)
    sp = _pool_layout(em, call, 2)
    if len(x.shape) != 4:
        raise em.fail("NCC_EVRF064", f"{call.op} needs a rank-4 tensor, got {list(x.shape)}")
    if kind == "avg":
        return em.mean(x, sp, keepdims=True)
    return em.keep_dims(em.reduce(x, sp, "max"), x.shape, sp)


@lowering("nn.global_avg_pool2d", notes="reduce add / count")
def _global_avg_pool2d(em: Emitter, call: Call) -> Value:
    return _global_pool(em, call, "avg")


@lowering("nn.global_max_pool2d", notes="reduce max")
def _global_max_pool2d(em: Emitter, call: Call) -> Value:
    return _global_pool(em, call, "max")


def _adaptive_pool(em: Emitter, call: Call, nsp: int, kind: str) -> Value:
    """Output cell i covers input [floor(i*n/m), ceil((i+1)*n/m)); pooling is separable, so each
    spatial dimension is pooled on its own: a strided window when m divides n, else one slice per
    output cell."""
    (x,) = call.tensors(1)
    sp = _pool_layout(em, call, nsp)
    if len(x.shape) != nsp + 2:
        raise em.fail("NCC_EVRF064", f"{call.op} needs a rank-{nsp + 2} tensor, got {list(x.shape)}")
    size = call.attrs.opt_ints("output_size")
    if size is None:
        size = tuple(x.shape[d] for d in sp)
    elif len(size) == 1:
        size = size * nsp
    if len(size) != nsp or any(m < 1 for m in size):
        raise em.fail("NCC_EPRS003", f"{call.op}: output_size needs {nsp} positive values")
    op = "max" if kind == "max" else "add"
    for d, m in zip(sp, size):
        n = x.shape[d]
        if n == m:
            continue
        if n % m == 0:
            k = n // m
            window = tuple(WindowDim(size=k, stride=k) if i == d else WindowDim() for i in range(len(x.shape)))
            x = _reduce_window(em, x, window, op)
            if kind == "avg":
                x = em.scalar_binary("divide", x, k)
            continue
        if m > 4096:
            raise em.fail(
                "NCC_EVRF001",
                f"{call.op}: {m} output cells from {n} inputs (at most 4096 when the size does not divide)",
            )
        cells = []
        for i in range(m):
            lo, hi = (i * n) // m, -((-(i + 1) * n) // m)
            part = em.keep_dims(
                em.reduce(slice_dim(em, x, d, lo, hi), (d,), op),
                x.shape[:d] + (hi - lo,) + x.shape[d + 1 :],
                (d,),
            )
            if kind == "avg" and hi - lo != 1:
                part = em.scalar_binary("divide", part, hi - lo)
            cells.append(part)
        x = em.op("concatenate", cells, dimension=d)
    return x


for _n in (1, 2, 3):
    for _kind in ("max", "avg"):
        lowering(f"nn.adaptive_{_kind}_pool{_n}d", notes="reduce-window, or slices + reduce + concatenate")(
            lambda em, call, n=_n, k=_kind: _adaptive_pool(em, call, n, k)
        )


# --- padding ---------------------------------------------------------------------------------


@lowering("nn.pad", notes="pad (constant); slices + reverse/broadcast + concatenate (edge, reflect)")
def _pad(em: Emitter, call: Call) -> Value:
    call.arity(1, 2)
    x = call.tensor(0)
    if len(call.args) == 2:
        value = call.tensor(1)
        if value.shape != ():
            raise em.fail("NCC_EVRF064", f"nn.pad: the pad value must be a scalar, got {list(value.shape)}")
        value = em.convert(value, x.dtype) if value.dtype is not x.dtype else value
    else:
        value = em.const(call.attrs.float("pad_value", 0.0), x.dtype)
    widths = call.attrs.nested_ints("pad_width")
    mode = call.attrs.str("pad_mode", "constant")
    if len(widths) != len(x.shape) or any(len(w) != 2 or min(w) < 0 for w in widths):
        raise em.fail(
            "NCC_EPRS003",
            f"nn.pad: pad_width needs one [before, after] pair of non-negative values per dimension ({len(x.shape)})",
        )
    if mode == "constant":
        return em.op("pad", [x, value], padding=tuple(PadDim(lo, hi) for lo, hi in widths))
    if mode not in ("edge", "reflect"):
        raise em.fail("NCC_EPRS003", f"nn.pad: pad_mode must be constant, edge or reflect, got {mode!r}")
    for d, (lo, hi) in enumerate(widths):
        n = x.shape[d]
        if not lo and not hi:
            continue
        if mode == "reflect" and (lo >= n or hi >= n):
            raise em.fail("NCC_EVRF064", f"nn.pad: reflect padding {lo}+{hi} needs more than {n} elements")
        if n == 0:
            raise em.fail("NCC_EVRF064", "nn.pad: edge padding of an empty dimension")
        parts = []
        if lo:
            parts.append(
                _edge(em, x, d, 0, lo)
                if mode == "edge"
                else em.op("reverse", [slice_dim(em, x, d, 1, lo + 1)], dimensions=(d,))
            )
        parts.append(x)
        if hi:
            parts.append(
                _edge(em, x, d, n - 1, hi)
                if mode == "edge"
                else em.op("reverse", [slice_dim(em, x, d, n - 1 - hi, n - 1)], dimensions=(d,))
            )
        x = em.op("concatenate", parts, dimension=d)
    return x


def _edge(em: Emitter, x: Node, d: int, at: int, count: int) -> Node:
    row = slice_dim(em, x, d, at, at + 1)
    shape = x.shape[:d] + (count,) + x.shape[d + 1 :]
    return em.broadcast_to(row, shape)


@lowering("nn.upsampling", notes="broadcast + reshape (nearest, integer scales)")
def _upsampling(em: Emitter, call: Call) -> Value:
    (x,) = call.tensors(1)
    sh, sw = call.attrs.float("scale_h"), call.attrs.float("scale_w")
    method = call.attrs.str("method", "nearest_neighbor")
    call.attrs.bool("align_corners", False)
    sp = _layout(em, call.attrs.str("layout", "NCHW"), "NC", 2, "layout")[2]
    if method != "nearest_neighbor" or sh != int(sh) or sw != int(sw) or sh < 1 or sw < 1:
        raise em.fail("NCC_EVRF001", "nn.upsampling: only nearest_neighbor with integer scales is supported")
    for d, s in zip(sp, (int(sh), int(sw))):
        if s == 1:
            continue
        wide = x.shape[: d + 1] + (s,) + x.shape[d + 1 :]
        b = em.broadcast_in_dim(x, wide, tuple(i if i <= d else i + 1 for i in range(len(x.shape))))
        x = em.reshape(b, x.shape[:d] + (x.shape[d] * s,) + x.shape[d + 1 :])
    return x

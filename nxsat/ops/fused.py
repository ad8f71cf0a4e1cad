"""Fused operators: what the model-type rule sets (rules/sets/transformer.egg, ...) rewrite whole HLO
patterns into. No source graph spells them (the HLO front end refuses their names); a rule introduces
one only where the e-graph proves it equal to the pattern, and the extraction keeps it only where the
cost model says it pays.

layer-norm(x, epsilon): ``(x - mean) / sqrt(var + epsilon)`` over the last dimension (biased variance),
in fp32; a layer norm's scale and shift stay elementwise (the kernel runs them as its epilogue).

rms-norm(x, epsilon): ``x / sqrt(mean(x^2) + epsilon)`` over the last dimension (no centring: Gemma's
and Llama's RMSNorm), in fp32; its scale stays elementwise.

group-norm(x, groups, epsilon): channels last (``x`` is ``[N, spatial..., C]``), the ``C`` channels in
``groups`` groups of consecutive channels; each (batch, group) normalized over its spatial positions and
channels as layer-norm normalizes a row. Instance norm is ``groups = C``. Its scale and shift stay
elementwise too.

gelu(x), gelu-tanh(x), silu(x): activation chains ScalarE computes as one function (``ACTIVATIONS``).

softmax(x, dimension, scale): the softmax of ``scale * x`` along ``dimension`` (``exp(y - max(y)) /
sum(exp(y - max(y)))``, ``y = scale * x``; scale 1 unless a rule folded a multiply in), computed in fp32
(fp64 here) and rounded once to x's type. The patterns it replaces round at every step (a bf16
model's exp, sum and division each in bf16): equal over the reals, and closer to them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nxsat.ir import TensorType, Type
from nxsat.ops.common import check_kind, count, tensors, to_dtype
from nxsat.ops.registry import SCALAR, VECTOR, Ctx, ShapeError, op


def _float_operand(types: list[Type], name: str) -> TensorType:
    """The one float array every fused operator takes (its result has its type)."""
    count(types, 1, name)
    (x,) = tensors(types)
    check_kind(x.dtype, "f", name)
    return x


def _finite(attrs: dict[str, Any], key: str, default: float, name: str) -> None:
    v = attrs.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ShapeError(f"{name}: {key} {v!r} is not a finite number")


def _dimension(attrs: dict[str, Any], rank: int, name: str) -> int:
    d = attrs.get("dimension")
    if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < rank:
        raise ShapeError(f"{name}: dimension {d!r} is not a dimension of a rank-{rank} operand")
    return d


def _in_fp64(fn: Any) -> Any:
    """The reference implementation of a fused operator: ``fn(x, attrs)`` on its operand in fp64 (overflow,
    0/0 and -inf rows give what the pattern gives), rounded once to the result's type."""
    def impl(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            y = fn(np.asarray(args[0]).astype(np.float64), attrs)
        return to_dtype(y, ctx.node.tensor.dtype)
    return impl


@_in_fp64
def _softmax_impl(x: np.ndarray, attrs: dict) -> np.ndarray:
    d = int(attrs["dimension"])
    xw = x * float(attrs.get("scale", 1.0))
    e = np.exp(xw - xw.max(axis=d, keepdims=True))
    return e / e.sum(axis=d, keepdims=True)


@op("softmax", engine=SCALAR, arity=(1, 1), impl=_softmax_impl, neuron=("Softmax",),
    flops=lambda types, out, attrs: 5 * tensors(types)[0].size,
    notes="fused (transformer rule set): softmax of scale * x along dimension, in fp32; never in a source "
          "graph")
def _softmax(types: list[Type], attrs: dict) -> Type:
    x = _float_operand(types, "softmax")
    _dimension(attrs, x.rank, "softmax")
    _finite(attrs, "scale", 1.0, "softmax")
    return x


@_in_fp64
def _layer_norm_impl(x: np.ndarray, attrs: dict) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + float(attrs.get("epsilon", 0.0)))


@op("layer-norm", engine=VECTOR, arity=(1, 1), impl=_layer_norm_impl, neuron=("LayerNorm",),
    flops=lambda types, out, attrs: 7 * tensors(types)[0].size,
    notes="fused (transformer rule set): (x - mean) / sqrt(variance + epsilon) over the last dimension "
          "(biased variance), in fp32; the scale and shift stay elementwise; never in a source graph")
def _layer_norm(types: list[Type], attrs: dict) -> Type:
    return _row_norm(types, attrs, "layer-norm")


def _row_norm(types: list[Type], attrs: dict, name: str) -> TensorType:
    """A normalization over the last dimension: a float operand of rank >= 1 and a finite epsilon."""
    x = _float_operand(types, name)
    if x.rank == 0:
        raise ShapeError(f"{name}: the operand has no dimension to normalize")
    _finite(attrs, "epsilon", 0.0, name)
    return x


@_in_fp64
def _rms_norm_impl(x: np.ndarray, attrs: dict) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(attrs.get("epsilon", 0.0)))


@op("rms-norm", engine=SCALAR, arity=(1, 1), impl=_rms_norm_impl, neuron=("RmsNorm",),
    flops=lambda types, out, attrs: 4 * tensors(types)[0].size,
    notes="fused (transformer rule set): x / sqrt(mean(x^2) + epsilon) over the last dimension, in fp32; the "
          "scale stays elementwise; never in a source graph")
def _rms_norm(types: list[Type], attrs: dict) -> Type:
    return _row_norm(types, attrs, "rms-norm")


@_in_fp64
def _group_norm_impl(x: np.ndarray, attrs: dict) -> np.ndarray:
    g = int(attrs["groups"])
    xr = x.reshape(x.shape[0], -1, g, x.shape[-1] // g)
    mean = xr.mean(axis=(1, 3), keepdims=True)
    var = ((xr - mean) ** 2).mean(axis=(1, 3), keepdims=True)
    return ((xr - mean) / np.sqrt(var + float(attrs.get("epsilon", 0.0)))).reshape(x.shape)


@op("group-norm", engine=VECTOR, arity=(1, 1), impl=_group_norm_impl, neuron=("GroupNorm",),
    flops=lambda types, out, attrs: 7 * tensors(types)[0].size,
    notes="fused (unet-inference rule set): channels last, each (batch, group of consecutive channels) "
          "normalized over its positions and channels (biased variance), in fp32; the scale and shift stay "
          "elementwise; never in a source graph")
def _group_norm(types: list[Type], attrs: dict) -> Type:
    x = _float_operand(types, "group-norm")
    if x.rank < 2:
        raise ShapeError(f"group-norm: the operand is {x}; it needs a batch and a channel dimension")
    g = attrs.get("groups")
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or x.shape[-1] % g:
        raise ShapeError(f"group-norm: groups {g!r} does not divide the {x.shape[-1]} channels")
    _finite(attrs, "epsilon", 0.0, "group-norm")
    return x


# --- activation functions ScalarE computes in one instruction --------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _gelu(x: np.ndarray) -> np.ndarray:
    from scipy import special

    return x * special.ndtr(x)  # the normal CDF: no cancellation for x << 0


def _silu(x: np.ndarray) -> np.ndarray:
    from scipy import special

    return x * special.expit(x)


# name -> (reference, ScalarE's function, description, neuronx-cc's name)
ACTIVATIONS = {
    "gelu": (_gelu, "gelu", "x Phi(x) = 0.5 x erfc(-x / sqrt 2): GELU's erf form", "Gelu"),
    "gelu-tanh": (_gelu_tanh, "gelu_tanh", "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GELU's tanh form",
                  "Gelu_apprx_tanh"),
    "silu": (_silu, "silu", "x * logistic(x): SiLU (Swish)", "Silu"),
}


def _activation_impl(fn: Any) -> Any:
    return _in_fp64(lambda x, attrs: fn(x))


def _activation_type(name: str) -> Any:
    def infer(types: list[Type], attrs: dict) -> Type:
        return _float_operand(types, name)
    return infer


for _name, (_fn, _func, _doc, _neuron) in ACTIVATIONS.items():
    op(_name, engine=SCALAR, arity=(1, 1), impl=_activation_impl(_fn), neuron=(_neuron,),
       flops=lambda types, out, attrs: 8 * tensors(types)[0].size,
       notes=f"fused (transformer rule set): {_doc}, in fp32 on ScalarE; never in a source graph")(
        _activation_type(_name))


# the operators of this module: the front ends refuse these names
FUSED = frozenset({"softmax", "layer-norm", "rms-norm", "group-norm", *ACTIVATIONS})

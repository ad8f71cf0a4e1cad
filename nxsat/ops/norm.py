"""Batch normalization: batch-norm-inference, batch-norm-training and batch-norm-grad.

Per XLA: statistics are per feature (dimension ``feature_index``) over every other dimension, the
variance is biased (divided by the element count), and ``epsilon`` is added to the variance before
the square root. The reference computes in fp64 and rounds each result once to the operand type;
on the device these run on VectorE (bn_stats / bn_aggr, fp32 internally).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nxsat.ir import TensorType, TupleType, Type
from nxsat.ops.common import count, tensor, tensors, to_dtype
from nxsat.ops.reduce import similar
from nxsat.ops.registry import VECTOR, Ctx, ShapeError, op


def _feature_index(attrs: dict, x: TensorType, name: str) -> int:
    fi = attrs.get("feature_index")
    if not isinstance(fi, int) or isinstance(fi, bool):
        raise ShapeError(f"{name} needs an integer feature_index")
    if x.rank < 1:
        raise ShapeError(f"{name}: the operand must have rank at least 1, got {x}")
    if not 0 <= fi < x.rank:
        raise ShapeError(f"{name}: feature_index {fi} is out of range for {x}")
    return fi


def _check(name: str, x: TensorType, fi: int, **features: TensorType) -> TensorType:
    """The operand must be floating point; every per-feature input a vector of its features."""
    if not x.dtype.is_float:
        raise ShapeError(f"{name}: the operand must be floating point, got {x}")
    count_ = x.shape[fi]
    for what, t in features.items():
        if t.rank != 1:
            raise ShapeError(f"{name}: {what} must have rank 1, got {t}")
        if not similar(t.dtype, x.dtype):
            raise ShapeError(f"{name}: {what} is {t}, the operand is {x}")
        if t.shape[0] != count_:
            raise ShapeError(f"{name}: {what} has {t.shape[0]} elements, the operand has {count_} features "
                             f"(dimension {fi} of {x})")
    return TensorType(x.dtype, (count_,))


def _epsilon(attrs: dict, name: str) -> None:
    eps = attrs.get("epsilon")
    if not isinstance(eps, int | float) or isinstance(eps, bool):
        raise ShapeError(f"{name} needs a numeric epsilon")


def _per_feature(v: np.ndarray, rank: int, fi: int) -> np.ndarray:
    """A feature vector shaped to broadcast along dimension ``fi``."""
    shape = [1] * rank
    shape[fi] = -1
    return np.asarray(v, dtype=np.float64).reshape(shape)


def _other_axes(rank: int, fi: int) -> tuple[int, ...]:
    return tuple(a for a in range(rank) if a != fi)


def _norm_flops(per_element: int) -> Any:
    def flops(types: list[Type], out: Type, attrs: dict) -> int:
        return per_element * tensor(types[0]).size

    return flops


# --- inference -------------------------------------------------------------------------------

def _inference_impl(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
    x, scale, offset, mean, var = args
    fi, eps = attrs["feature_index"], float(attrs["epsilon"])
    f = [_per_feature(v, x.ndim, fi) for v in (scale, offset, mean, var)]
    y = (x.astype(np.float64) - f[2]) / np.sqrt(f[3] + eps) * f[0] + f[1]
    return to_dtype(y, ctx.node.tensor.dtype)


@op("batch-norm-inference", engine=VECTOR, arity=(5, 5), impl=_inference_impl, flops=_norm_flops(4),
    neuron=("Batchnorminference",),
    notes="(x - mean) / sqrt(variance + epsilon) * scale + offset along feature_index")
def _batch_norm_inference(types: list[Type], attrs: dict) -> Type:
    count(types, 5, "batch-norm-inference")
    x, scale, offset, mean, var = tensors(types)
    fi = _feature_index(attrs, x, "batch-norm-inference")
    _epsilon(attrs, "batch-norm-inference")
    _check("batch-norm-inference", x, fi, scale=scale, offset=offset, mean=mean, variance=var)
    return x


# --- training --------------------------------------------------------------------------------

def _training_impl(args: list[Any], attrs: dict, ctx: Ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, scale, offset = args
    fi, eps = attrs["feature_index"], float(attrs["epsilon"])
    axes = _other_axes(x.ndim, fi)
    xw = x.astype(np.float64)
    mean = xw.mean(axis=axes, keepdims=True)
    centred = xw - mean
    var = (centred * centred).mean(axis=axes, keepdims=True)
    y = centred / np.sqrt(var + eps) * _per_feature(scale, x.ndim, fi) + _per_feature(offset, x.ndim, fi)
    d = ctx.node.type.elements[0].dtype
    return to_dtype(y, d), to_dtype(mean.reshape(-1), d), to_dtype(var.reshape(-1), d)


@op("batch-norm-training", engine=VECTOR, arity=(3, 3), impl=_training_impl, flops=_norm_flops(8),
    neuron=("Batchnorm",),
    notes="normalizes with the batch statistics; returns (output, batch mean, biased batch variance)")
def _batch_norm_training(types: list[Type], attrs: dict) -> Type:
    count(types, 3, "batch-norm-training")
    x, scale, offset = tensors(types)
    fi = _feature_index(attrs, x, "batch-norm-training")
    _epsilon(attrs, "batch-norm-training")
    stats = _check("batch-norm-training", x, fi, scale=scale, offset=offset)
    return TupleType((x, stats, stats))


# --- grad ------------------------------------------------------------------------------------

def _grad_impl(args: list[Any], attrs: dict, ctx: Ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, scale, mean, var, grad = args
    fi, eps = attrs["feature_index"], float(attrs["epsilon"])
    axes = _other_axes(x.ndim, fi)
    g = grad.astype(np.float64)
    centred = x.astype(np.float64) - _per_feature(mean, x.ndim, fi)
    inv_std = 1.0 / np.sqrt(_per_feature(var, x.ndim, fi) + eps)
    sum_g = g.sum(axis=axes, keepdims=True)
    sum_gc = (g * centred).sum(axis=axes, keepdims=True)
    n = x.size // x.shape[fi] if x.shape[fi] else 0  # elements per feature
    # d/dx of scale * (x - mean) * inv_std + offset, with mean and variance functions of x.
    grad_x = _per_feature(scale, x.ndim, fi) * inv_std * (g - sum_g / n - centred * inv_std**2 * sum_gc / n)
    grad_scale = sum_gc * inv_std
    d = ctx.node.type.elements[0].dtype
    return to_dtype(grad_x, d), to_dtype(grad_scale.reshape(-1), d), to_dtype(sum_g.reshape(-1), d)


@op("batch-norm-grad", engine=VECTOR, arity=(5, 5), impl=_grad_impl, flops=_norm_flops(10),
    neuron=("Batchnormgrad",),
    notes="returns (grad operand, grad scale, grad offset) given the batch mean and variance")
def _batch_norm_grad(types: list[Type], attrs: dict) -> Type:
    count(types, 5, "batch-norm-grad")
    x, scale, mean, var, grad = tensors(types)
    fi = _feature_index(attrs, x, "batch-norm-grad")
    _epsilon(attrs, "batch-norm-grad")
    if grad.shape != x.shape or not similar(grad.dtype, x.dtype):
        raise ShapeError(f"batch-norm-grad: the output gradient is {grad}, the operand is {x}")
    stats = _check("batch-norm-grad", x, fi, scale=scale, mean=mean, variance=var)
    return TupleType((x, stats, stats))

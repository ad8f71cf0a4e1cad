"""Helpers the operator declarations share: shape checks and numeric conversions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.dtypes import DType
from nxsat.ir import TensorType, TupleType, Type
from nxsat.ops.registry import ShapeError


def tensor(t: Type, what: str = "operand") -> TensorType:
    if not isinstance(t, TensorType):
        raise ShapeError(f"{what} must be an array, got tuple {t}")
    return t


def tensors(types: Sequence[Type]) -> list[TensorType]:
    return [tensor(t, f"operand {i}") for i, t in enumerate(types)]


def count(types: Sequence[Type], n: int, name: str) -> None:
    if len(types) != n:
        raise ShapeError(f"{name} takes {n} operand{'s' if n != 1 else ''}, got {len(types)}")


def same_shapes(ts: Sequence[TensorType], name: str) -> tuple[int, ...]:
    shape = ts[0].shape
    for t in ts[1:]:
        if t.shape != shape:
            raise ShapeError(f"{name}: operand shapes differ: {' vs '.join(str(x) for x in ts)}")
    return shape


def same_dtypes(ts: Sequence[TensorType], name: str) -> DType:
    d = ts[0].dtype
    for t in ts[1:]:
        if t.dtype is not d:
            raise ShapeError(f"{name}: operand element types differ: {' vs '.join(str(x) for x in ts)}")
    return d


def check_kind(d: DType, kinds: str, name: str) -> None:
    """``kinds`` is a string of letters: p(red) i(nt) u(int) f(loat)."""
    letter = {"pred": "p", "int": "i", "uint": "u", "float": "f"}[d.kind]
    if letter not in kinds:
        raise ShapeError(f"{name} is not defined on {d.name}")


def dims_attr(attrs: dict[str, Any], key: str = "dimensions") -> tuple[int, ...]:
    v = attrs.get(key)
    if v is None:
        raise ShapeError(f"missing attribute {key}")
    return tuple(v)


def check_dims(dims: Sequence[int], rank: int, name: str, *, unique: bool = True) -> None:
    for d in dims:
        if not 0 <= d < rank:
            raise ShapeError(f"{name}: dimension {d} out of range for rank {rank}")
    if unique and len(set(dims)) != len(dims):
        raise ShapeError(f"{name}: repeated dimension in {list(dims)}")


def check_perm(perm: Sequence[int], rank: int, name: str) -> None:
    if sorted(perm) != list(range(rank)):
        raise ShapeError(f"{name}: {list(perm)} is not a permutation of 0..{rank - 1}")


def result_dtype(attrs: dict[str, Any], default: DType) -> DType:
    d = attrs.get("dtype")
    return d if isinstance(d, DType) else default


def tuple_of(*types: Type) -> TupleType:
    return TupleType(tuple(types))


# --- numerics -------------------------------------------------------------------------------

LOW_FLOATS = frozenset({dt.BF16.np, dt.F16.np, dt.F8E4M3FN.np, dt.F8E5M2.np})


def is_float_array(x: np.ndarray) -> bool:
    return x.dtype.kind == "f" or x.dtype in LOW_FLOATS


def compute_float(x: np.ndarray, wide: bool = False) -> np.ndarray:
    """Widen a float array for computing: sub-32-bit floats to fp32 (as XLA CPU does), and to
    fp64 when ``wide`` (for transcendental functions, so fp32 results are correctly rounded)."""
    if wide:
        return x.astype(np.float64)
    if x.dtype in LOW_FLOATS:
        return x.astype(np.float32)
    return x


def to_dtype(x: Any, d: DType) -> np.ndarray:
    """Round a computed result to the result type (float rounding is nearest-even)."""
    a = np.asarray(x)
    if a.dtype == d.np:
        return a
    if d.is_float:
        return dt.cast(a, d)
    return a.astype(d.np)


def int_info(d: np.dtype) -> np.iinfo:
    return np.iinfo(d)


def np_dtype(d: DType) -> np.dtype:
    return d.np

"""Element types: one table that names every type the way HLO, Relay and numpy spell it.

Low-precision floats come from ml_dtypes so that values are rounded exactly where a real device
(or XLA) rounds them. tf32 is a compute precision, not a storage type: it is stored as fp32 and
rounded to a 10-bit mantissa by :func:`round_tf32`.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True, eq=False)
class DType:
    """An element type. Compared by identity: there is exactly one object per type."""

    name: str  # HLO spelling
    np: np.dtype
    kind: str  # "pred" | "int" | "uint" | "float"
    bits: int
    relay: str
    storage: bool = True  # False for compute-only precisions (tf32)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int" or self.kind == "float"

    @property
    def is_pred(self) -> bool:
        return self.kind == "pred"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple:
        return (by_name, (self.name,))


def _t(name: str, npdt: type | np.dtype, kind: str, bits: int, relay: str, storage: bool = True) -> DType:
    return DType(name, np.dtype(npdt), kind, bits, relay, storage)


PRED = _t("pred", np.bool_, "pred", 8, "bool")
S8 = _t("s8", np.int8, "int", 8, "int8")
S16 = _t("s16", np.int16, "int", 16, "int16")
S32 = _t("s32", np.int32, "int", 32, "int32")
S64 = _t("s64", np.int64, "int", 64, "int64")
U8 = _t("u8", np.uint8, "uint", 8, "uint8")
U16 = _t("u16", np.uint16, "uint", 16, "uint16")
U32 = _t("u32", np.uint32, "uint", 32, "uint32")
U64 = _t("u64", np.uint64, "uint", 64, "uint64")
F16 = _t("f16", np.float16, "float", 16, "float16")
BF16 = _t("bf16", ml_dtypes.bfloat16, "float", 16, "bfloat16")
F32 = _t("f32", np.float32, "float", 32, "float32")
F64 = _t("f64", np.float64, "float", 64, "float64")
F8E4M3FN = _t("f8e4m3fn", ml_dtypes.float8_e4m3fn, "float", 8, "float8_e4m3fn")
F8E5M2 = _t("f8e5m2", ml_dtypes.float8_e5m2, "float", 8, "float8_e5m2")
TF32 = _t("tf32", np.float32, "float", 32, "tfloat32", storage=False)

ALL: tuple[DType, ...] = (PRED, S8, S16, S32, S64, U8, U16, U32, U64, F16, BF16, F32, F64, F8E4M3FN, F8E5M2)
FLOATS = tuple(t for t in ALL if t.is_float)
INTS = tuple(t for t in ALL if t.is_int)

_BY_NAME = {t.name: t for t in (*ALL, TF32)}
_BY_RELAY = {t.relay: t for t in (*ALL, TF32)}
_BY_NP = {t.np: t for t in ALL}

# Types XLA knows that nxsat does not run, each with the error code neuronx-cc gives.
COMPLEX_TYPES = frozenset({"c64", "c128"})
OTHER_FP8 = frozenset({"f8e4m3", "f8e4m3fnuz", "f8e4m3b11fnuz", "f8e5m2fnuz", "f8e3m4", "f8e8m0fnu"})
UNSUPPORTED_TYPES = frozenset({"s2", "s4", "u2", "u4", "f4e2m1fn", "s1", "u1"})


def by_name(name: str) -> DType:
    """The DType for an HLO spelling (``f32``); KeyError when unknown."""
    return _BY_NAME[name]


def by_relay(name: str) -> DType:
    """The DType for a Relay spelling (``float32``); KeyError when unknown."""
    return _BY_RELAY[name]


def from_numpy(dt: np.dtype) -> DType:
    """The DType of a numpy dtype; KeyError when it has no counterpart."""
    return _BY_NP[np.dtype(dt)]


def round_tf32(x: np.ndarray) -> np.ndarray:
    """Round fp32 values to tf32 (10 explicit mantissa bits), round-to-nearest-even, kept as fp32."""
    a = np.asarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0xFFF + lsb) & ~np.uint64(0x1FFF)).astype(np.uint32)
    finite = np.isfinite(a)
    out = np.where(finite, rounded.view(np.float32), a)
    return out.astype(np.float32)


def cast(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Convert with XLA's convert semantics.

    Float to integer truncates toward zero and saturates at the integer range, NaN gives 0
    (XLA's documented behaviour since 2023); anything to pred is ``x != 0``; float to float
    rounds to nearest even (ml_dtypes), overflowing to inf for types that have one.
    """
    a = np.asarray(x)
    if dtype is TF32:
        return round_tf32(a.astype(np.float32))
    if dtype.is_pred:
        return a != 0
    src_float = a.dtype.kind == "f" or a.dtype in (BF16.np, F8E4M3FN.np, F8E5M2.np)
    if dtype.is_int and src_float:
        info = np.iinfo(dtype.np)
        f = a.astype(np.float64)
        f = np.where(np.isnan(f), 0.0, np.trunc(f))
        # Saturate: compare in float64, where the bounds of int32 are exact; int64/uint64 bounds
        # round up in float64, so clip one step inside and fix the top explicitly.
        too_big = f >= float(info.max)
        too_small = f <= float(info.min)
        safe = np.clip(f, float(info.min), float(info.max))
        safe = np.where(too_big | too_small, 0.0, safe)
        out = safe.astype(dtype.np)
        out = np.where(too_big, info.max, out)
        out = np.where(too_small, info.min, out)
        return out.astype(dtype.np)
    if dtype.is_int and a.dtype.kind in "iub":
        # Integer to integer wraps (two's complement), as XLA does.
        return a.astype(dtype.np)
    with np.errstate(over="ignore", invalid="ignore"):
        if a.dtype in (BF16.np, F8E4M3FN.np, F8E5M2.np) and dtype.np not in (np.float32, np.float64):
            a = a.astype(np.float32)
        return a.astype(dtype.np)

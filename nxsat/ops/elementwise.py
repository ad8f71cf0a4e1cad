"""Elementwise operators: unary and binary arithmetic, logic, shifts, compare, select, clamp.

Semantics follow XLA's operation semantics: integer arithmetic wraps; integer division truncates
toward zero with ``x / 0 = -1`` (all ones) and ``INT_MIN / -1 = INT_MIN``; ``x % 0 = x``; shifts by
at least the bit width give 0 (logical) or the sign fill (arithmetic); max/min propagate NaN.
Sub-32-bit floats compute in fp32 and round back (as XLA CPU does); transcendental functions
compute in fp64 and round once, so fp32 results are correctly rounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from nxsat import dtypes as dt
from nxsat.ir import Type
from nxsat.ops.common import (
    check_kind,
    compute_float,
    count,
    same_dtypes,
    same_shapes,
    tensor,
    tensors,
    to_dtype,
)
from nxsat.ops.registry import SCALAR, VECTOR, ShapeError, op

ALL = "piuf"
NUM = "iuf"
INT = "iu"
FLOAT = "f"
LOGIC = "piu"


def _elem_flops(_in: list[Type], out: Type, _a: dict) -> int:
    return tensor(out).size


def _unary_infer(name: str, kinds: str, out_pred: bool = False) -> Callable[[list[Type], dict], Type]:
    def infer(types: list[Type], attrs: dict) -> Type:
        count(types, 1, name)
        (x,) = tensors(types)
        check_kind(x.dtype, kinds, name)
        return x.with_dtype(dt.PRED) if out_pred else x

    return infer


def _binary_infer(name: str, kinds: str) -> Callable[[list[Type], dict], Type]:
    def infer(types: list[Type], attrs: dict) -> Type:
        count(types, 2, name)
        ts = tensors(types)
        same_shapes(ts, name)
        d = same_dtypes(ts, name)
        check_kind(d, kinds, name)
        return ts[0]

    return infer


# Operators computed element by element (a computation of them on scalars can run on whole tensors:
# nxsat/passes.py lifts `map` bodies with it).
ELEMENTWISE: set[str] = {"reduce-precision", "compare", "select", "clamp"}


def unary(name: str, fn: Callable[[np.ndarray], Any], *, kinds: str = FLOAT, engine: str = SCALAR,
          neuron: tuple[str, ...] = (), relay: tuple[str, ...] = (), notes: str = "", wide: bool = True,
          int_fn: Callable[[np.ndarray], Any] | None = None, out_pred: bool = False) -> None:
    """Declare a one-operand elementwise operator. ``fn`` sees floats widened; ``int_fn`` ints."""

    def impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
        x = args[0]
        out_dtype = dt.PRED if out_pred else dt.from_numpy(x.dtype)
        if x.dtype.kind == "f" or x.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np):
            return to_dtype(fn(compute_float(x, wide)), out_dtype)
        return to_dtype((int_fn or fn)(x), out_dtype)

    ELEMENTWISE.add(name)
    op(name, engine=engine, neuron=neuron, relay=relay, notes=notes, flops=_elem_flops, arity=(1, 1),
       impl=impl)(_unary_infer(name, kinds, out_pred))


def binary(name: str, fn: Callable[[np.ndarray, np.ndarray], Any], *, kinds: str = NUM, engine: str = VECTOR,
           neuron: tuple[str, ...] = (), relay: tuple[str, ...] = (), notes: str = "", wide: bool = False,
           int_fn: Callable[[np.ndarray, np.ndarray], Any] | None = None) -> None:
    """Declare a two-operand elementwise operator of one element type."""

    def impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
        x, y = args
        d = dt.from_numpy(x.dtype)
        if d.is_float:
            return to_dtype(fn(compute_float(x, wide), compute_float(y, wide)), d)
        return to_dtype((int_fn or fn)(x, y), d)

    ELEMENTWISE.add(name)
    op(name, engine=engine, neuron=neuron, relay=relay, notes=notes, flops=_elem_flops, arity=(2, 2),
       impl=impl)(_binary_infer(name, kinds))


# --- integer helpers -------------------------------------------------------------------------

def _int_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_:
        return x
    zero = y == 0
    safe_y = np.where(zero, 1, y).astype(x.dtype)
    if x.dtype.kind == "i":
        info = np.iinfo(x.dtype)
        overflow = (x == info.min) & (safe_y == -1)
        safe_y = np.where(overflow, 1, safe_y).astype(x.dtype)
        # Truncating division: numpy's floor division corrected toward zero.
        fq = np.floor_divide(x, safe_y)
        rem = x - fq * safe_y
        fix = (rem != 0) & ((x < 0) != (safe_y < 0))
        q = (fq + fix).astype(x.dtype)
        q = np.where(overflow, x, q)
        return np.where(zero, np.array(-1, x.dtype), q).astype(x.dtype)
    q = np.floor_divide(x, safe_y)
    return np.where(zero, np.array(np.iinfo(x.dtype).max, x.dtype), q).astype(x.dtype)


def _int_rem(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_:
        return np.zeros_like(x)
    zero = y == 0
    safe_y = np.where(zero, 1, y).astype(x.dtype)
    if x.dtype.kind == "i":
        info = np.iinfo(x.dtype)
        overflow = (x == info.min) & (safe_y == -1)
        safe_y = np.where(overflow, 1, safe_y).astype(x.dtype)
        r = np.fmod(x, safe_y)
        r = np.where(overflow, 0, r)
    else:
        r = np.fmod(x, safe_y)
    return np.where(zero, x, r).astype(x.dtype)


def _bits(x: np.ndarray) -> int:
    return x.dtype.itemsize * 8


def _unsigned(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _shift_left(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    amount = _unsigned(np.asarray(y, order="C"))
    big = amount >= _bits(x)
    r = np.left_shift(_unsigned(np.asarray(x, order="C")), np.where(big, 0, amount).astype(amount.dtype))
    return np.where(big, 0, r).astype(r.dtype).view(x.dtype)


def _shift_right_logical(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    amount = _unsigned(np.asarray(y, order="C"))
    big = amount >= _bits(x)
    r = np.right_shift(_unsigned(np.asarray(x, order="C")), np.where(big, 0, amount).astype(amount.dtype))
    return np.where(big, 0, r).astype(r.dtype).view(x.dtype)


def _shift_right_arithmetic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    amount = _unsigned(np.asarray(y, order="C"))
    signed = np.asarray(x, order="C").view(np.dtype(f"i{x.dtype.itemsize}"))
    clipped = np.minimum(amount, _bits(x) - 1).astype(amount.dtype)
    r = np.right_shift(signed, clipped.view(signed.dtype))
    return r.view(x.dtype)


def _int_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_:
        return x | ~y
    neg = y < 0 if y.dtype.kind == "i" else np.zeros(y.shape, bool)
    e = np.where(neg, 0, y)
    r = np.power(x, e.astype(x.dtype))
    if neg.any():
        odd = (y % 2) != 0
        special = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0)).astype(x.dtype)
        r = np.where(neg, special, r)
    return r.astype(x.dtype)


def _int_abs(x: np.ndarray) -> np.ndarray:
    return np.where(x < 0, (0 - x.astype(x.dtype)), x).astype(x.dtype) if x.dtype.kind == "i" else x


def _float_sign(x: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(x), x, np.sign(x))


def _round_afz(x: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5)) if x.size else x


def _clz(x: np.ndarray) -> np.ndarray:
    u = _unsigned(np.asarray(x, order="C")).astype(np.uint64)
    bits = _bits(x)
    out = np.full(x.shape, bits, dtype=np.int64)
    for b in range(bits):
        hit = ((u >> np.uint64(bits - 1 - b)) & np.uint64(1)).astype(bool) & (out == bits)
        out[hit] = b
    return out.astype(x.dtype)


def _popcnt(x: np.ndarray) -> np.ndarray:
    u = _unsigned(np.asarray(x, order="C"))
    return np.bitwise_count(u).astype(x.dtype)


def _logistic(x: np.ndarray) -> np.ndarray:
    from scipy.special import expit  # scipy.special costs a compile 0.2 s to import: only where used

    return expit(x)


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


def _reduce_precision_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    """XLA's bit-level algorithm on the operand's own encoding: round the mantissa to
    ``mantissa_bits`` (nearest even), then send exponents the narrower format cannot hold to
    signed infinity or zero (denormals included); a field at least as wide as the operand's is left
    alone. NaNs come back unchanged, or as +inf when no mantissa bit is left."""
    x = np.asarray(args[0])
    ebits, mbits = int(attrs["exponent_bits"]), int(attrs["mantissa_bits"])
    info = ml_dtypes.finfo(x.dtype)
    src_m, src_e, width = int(info.nmant), int(info.nexp), x.dtype.itemsize * 8
    u = np.dtype(f"u{x.dtype.itemsize}")
    full = np.uint64((1 << width) - 1)
    v = np.ascontiguousarray(x).view(u).astype(np.uint64)
    sign = np.uint64(1 << (width - 1))
    exp_mask = np.uint64(((1 << src_e) - 1) << src_m)
    is_nan = (v & ~sign & full) > exp_mask
    if mbits < src_m:
        shift = src_m - mbits
        last = np.uint64(1 << shift)
        bias = (last >> np.uint64(1)) - np.uint64(1)
        lsb = (v & last) >> np.uint64(shift)
        v = ((v + lsb + bias) & ~(last - np.uint64(1))) & full
    if ebits < src_e:
        bias_src = (1 << (src_e - 1)) - 1
        bias_dst = (1 << (ebits - 1)) - 1
        exponent = v & exp_mask
        signed_zero = v & sign
        v = np.where(exponent > np.uint64((bias_src + bias_dst) << src_m), signed_zero | exp_mask, v)
        v = np.where(exponent <= np.uint64((bias_src - bias_dst) << src_m), signed_zero, v)
    out = v.astype(u).view(x.dtype)
    if mbits > 0:
        return np.where(is_nan, x, out)
    return np.where(is_nan, np.array(np.inf, x.dtype), out)


# --- unary -----------------------------------------------------------------------------------

unary("abs", np.abs, kinds="iuf", engine=VECTOR, neuron=("Abs",), relay=("abs",), wide=False, int_fn=_int_abs)
unary("negate", np.negative, kinds="iuf", engine=VECTOR, neuron=("Neg",), relay=("negative",), wide=False,
      int_fn=lambda x: (np.zeros_like(x) - x).astype(x.dtype))
unary("sign", _float_sign, kinds="iuf", engine=VECTOR, neuron=("Sign",), relay=("sign",), wide=False,
      int_fn=lambda x: np.sign(x).astype(x.dtype))
unary("ceil", np.ceil, engine=VECTOR, neuron=("Ceil",), relay=("ceil",), wide=False)
unary("floor", np.floor, engine=VECTOR, neuron=("Floor",), relay=("floor",), wide=False)
unary("round-nearest-afz", _round_afz, engine=VECTOR, relay=("round",), wide=True,
      notes="round half away from zero")
unary("round-nearest-even", np.rint, engine=VECTOR, wide=False)
unary("exponential", np.exp, neuron=("Exp",), relay=("exp",))
unary("exponential-minus-one", np.expm1)
unary("log", np.log, neuron=("Log",), relay=("log",))
unary("log-plus-one", np.log1p)
unary("logistic", _logistic, relay=("sigmoid",))
unary("sqrt", np.sqrt, neuron=("Sqrt",), relay=("sqrt",))
unary("rsqrt", lambda x: 1.0 / np.sqrt(x), neuron=("Rsqrt",), relay=("rsqrt",))
unary("cbrt", np.cbrt)
unary("tanh", np.tanh, neuron=("Tanh",), relay=("tanh",))
unary("sine", np.sin, neuron=("Sin",), relay=("sin",))
unary("cosine", np.cos, neuron=("Cos",), relay=("cos",))
unary("tan", np.tan, relay=("tan",))
unary("erf", _erf, relay=("erf",))
unary("is-finite", np.isfinite, engine=VECTOR, out_pred=True, relay=("isfinite",), wide=False)
unary("not", np.logical_not, kinds=LOGIC, engine=VECTOR, neuron=("LogicalNot",), relay=("logical_not",),
      int_fn=lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.invert(x))
unary("popcnt", _popcnt, kinds=INT, engine=VECTOR)
unary("count-leading-zeros", _clz, kinds=INT, engine=VECTOR)
unary("copy", lambda x: x.copy(), kinds=ALL, engine=VECTOR, wide=False, notes="a DMA or VectorE copy")


@op("reduce-precision", engine=VECTOR, arity=(1, 1), impl=_reduce_precision_impl, flops=_elem_flops,
    notes="rounds to a narrower float format, kept in the operand's type")
def _reduce_precision(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "reduce-precision")
    x = tensor(types[0])
    check_kind(x.dtype, FLOAT, "reduce-precision")
    if "exponent_bits" not in attrs or "mantissa_bits" not in attrs:
        raise ShapeError("reduce-precision needs exponent_bits and mantissa_bits")
    if attrs["exponent_bits"] < 1 or attrs["mantissa_bits"] < 0:
        raise ShapeError(f"reduce-precision needs at least 1 exponent bit and 0 mantissa bits, got "
                         f"exponent_bits={attrs['exponent_bits']} mantissa_bits={attrs['mantissa_bits']}")
    return x


# --- binary ----------------------------------------------------------------------------------

binary("add", np.add, neuron=("Add",), relay=("add",))
binary("subtract", np.subtract, neuron=("Sub",), relay=("subtract",))
binary("multiply", np.multiply, neuron=("Mul",), relay=("multiply",))
binary("divide", np.divide, neuron=("Div",), relay=("divide",), int_fn=_int_div,
       notes="integer division truncates; x/0 = -1")
binary("remainder", np.fmod, relay=("mod",), int_fn=_int_rem, notes="sign of the dividend (fmod)")
binary("maximum", np.maximum, neuron=("Max",), relay=("maximum",), kinds="piuf", notes="propagates NaN")
binary("minimum", np.minimum, neuron=("Min",), relay=("minimum",), kinds="piuf", notes="propagates NaN")
binary("power", np.power, neuron=("Pow",), relay=("power",), engine=SCALAR, int_fn=_int_pow, wide=True,
       notes="integer and floating exponents")
binary("atan2", np.arctan2, kinds=FLOAT, neuron=("Atan2",), engine=SCALAR, wide=True)
binary("and", np.logical_and, kinds=LOGIC, neuron=("LogicalAnd",), relay=("logical_and", "bitwise_and"),
       int_fn=lambda x, y: np.logical_and(x, y) if x.dtype == np.bool_ else np.bitwise_and(x, y))
binary("or", np.logical_or, kinds=LOGIC, relay=("logical_or", "bitwise_or"),
       int_fn=lambda x, y: np.logical_or(x, y) if x.dtype == np.bool_ else np.bitwise_or(x, y))
binary("xor", np.logical_xor, kinds=LOGIC, relay=("logical_xor", "bitwise_xor"),
       int_fn=lambda x, y: np.logical_xor(x, y) if x.dtype == np.bool_ else np.bitwise_xor(x, y))
binary("shift-left", np.left_shift, kinds=INT, int_fn=_shift_left, relay=("left_shift",))
binary("shift-right-logical", np.right_shift, kinds=INT, neuron=("ShiftRightLogical",),
       int_fn=_shift_right_logical)
binary("shift-right-arithmetic", np.right_shift, kinds=INT, int_fn=_shift_right_arithmetic,
       relay=("right_shift",), notes="neuronx-cc takes only 32-bit operands (NCC_EVRF022); nxsat runs every width")


# --- compare ---------------------------------------------------------------------------------

DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")
_CMP = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
        "GE": np.greater_equal}


def total_order_key(x: np.ndarray) -> np.ndarray:
    """Map floats to signed integers ordered as IEEE totalOrder (-NaN < -inf < -0 < +0 < inf < NaN)."""
    width = x.dtype.itemsize
    bits = np.asarray(x, order="C").view(np.dtype(f"i{width}")).astype(np.int64)
    mask = (1 << (8 * width - 1)) - 1
    return np.where(bits < 0, bits ^ mask, bits)


def _compare_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    x, y = args
    direction = attrs["direction"]
    kind = attrs.get("type")
    if kind == "TOTALORDER" and (x.dtype.kind == "f" or x.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np)):
        x, y = total_order_key(x), total_order_key(y)
    elif x.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np, np.dtype(np.float16)):
        x, y = x.astype(np.float32), y.astype(np.float32)
    return np.asarray(_CMP[direction](x, y), dtype=np.bool_)


@op("compare", engine=VECTOR, arity=(2, 2), impl=_compare_impl, flops=_elem_flops,
    neuron=("Compare", "Eq", "Ne", "Lt", "Le", "Gt", "Ge"),
    relay=("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"),
    notes="directions EQ NE LT LE GT GE; types FLOAT, TOTALORDER, SIGNED, UNSIGNED")
def _compare(types: list[Type], attrs: dict) -> Type:
    count(types, 2, "compare")
    ts = tensors(types)
    same_shapes(ts, "compare")
    same_dtypes(ts, "compare")
    if attrs.get("direction") not in DIRECTIONS:
        raise ShapeError(f"compare: direction must be one of {', '.join(DIRECTIONS)}")
    return ts[0].with_dtype(dt.PRED)


# --- select / clamp --------------------------------------------------------------------------

def _select_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    p, a, b = args
    return np.where(p, a, b).astype(a.dtype)


@op("select", engine=VECTOR, arity=(3, 3), impl=_select_impl, flops=_elem_flops, neuron=("Select",),
    relay=("where",), notes="pred may be a scalar")
def _select(types: list[Type], attrs: dict) -> Type:
    count(types, 3, "select")
    p, a, b = tensors(types)
    if p.dtype is not dt.PRED:
        raise ShapeError(f"select: predicate must be pred, got {p}")
    same_shapes([a, b], "select")
    same_dtypes([a, b], "select")
    if p.shape not in ((), a.shape):
        raise ShapeError(f"select: predicate shape {p} does not match {a}")
    return a


def _clamp_impl(args: list[Any], attrs: dict, ctx: Any) -> np.ndarray:
    lo, x, hi = args
    d = dt.from_numpy(x.dtype)
    if d.is_float:
        lo, x, hi = compute_float(lo), compute_float(x), compute_float(hi)
    return to_dtype(np.minimum(np.maximum(x, lo), hi), d)


@op("clamp", engine=VECTOR, arity=(3, 3), impl=_clamp_impl, flops=_elem_flops, neuron=("Clamp",),
    relay=("clip",), notes="min(max(x, lo), hi); lo and hi may be scalars")
def _clamp(types: list[Type], attrs: dict) -> Type:
    count(types, 3, "clamp")
    lo, x, hi = tensors(types)
    same_dtypes([lo, x, hi], "clamp")
    for bound in (lo, hi):
        if bound.shape not in ((), x.shape):
            raise ShapeError(f"clamp: bound {bound} must be a scalar or match {x}")
    return x

"""Elementwise operators exactly as XLA defines them, on every element type the device holds.

The device's engines compute floats in fp32 and round once on writing; VectorE and ScalarE compute
integers in fp32 too (exact below 2**24 only), bitwise operators act on bits, and GpSimd computes
32-bit integers exactly, wrapping on writing (docs/device-model.md). So, operator by operator:

* **Integers** compute in 32 bits on GpSimd: an 8- or 16-bit operand is widened (sign- or
  zero-extended by a bitwise copy), the 32-bit result is narrowed back by wrapping (a bitwise copy
  keeps its low bits), which is XLA's wrapping arithmetic. 32-bit operands are computed where they
  are; the signed and unsigned readings of the same bits are views of one tile (no instruction).
  XLA's edge cases are explicit selects (``x / 0 = -1``), or follow from wrapping
  (``INT_MIN / -1 = INT_MIN``, ``x % 0 = x``). 64-bit integers are 32-bit on the device.
* **Float bits** (sign, exponent, mantissa) are integer views of the same tile: abs, negate,
  copysign, totalorder keys, reduce-precision, is-finite and the exact remainder work on them.
* **Roundings** (floor, ceil, round-to-even and away-from-zero) add and subtract 2**23 in fp32 (one
  correctly rounded step) and fix up the tie, the direction and the sign of zero; beyond 2**23 every
  float is an integer already.
* **Multi-instruction functions** and their error bounds (docs/backend.md states them, tests/backend/
  test_elementwise.py asserts them): expm1 and log1p from correctly rounded exp/log with the rounding
  error of u = exp(x) or u = 1 + x corrected (<= 2 ulp), cbrt as a Newton step on pow(|x|, 1/3)
  (<= 1.5 ulp), tan as sin/cos (<= 2 ulp), atan2 on ISA 1.1's arctan (<= 2 ulp), remainder exactly
  (integer long division of the mantissas, 8 bits per step).
* **Conversions** go through one engine copy (round to nearest even, float to integer truncating
  and saturating), except that XLA's f8e4m3fn has no saturation: what rounds beyond 448 is NaN.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.elementwise import EMITTERS, MAX_COLS, Kernel, _split, elementwise, emits
from nxsat.backend.graph import Ref
from nxsat.backend.lower import LOWERINGS, Lowering, device_dtype, lowers, onchip_dtype
from nxsat.backend.tiles import Operand, Tiles, is_num
from nxsat.diagnostics import error
from nxsat.ir import Node

U8, U16, U32, S8, S16, S32 = dt.U8, dt.U16, dt.U32, dt.S8, dt.S16, dt.S32
F32 = dt.F32
UINT = {1: U8, 2: U16, 4: U32}
SINT = {1: S8, 2: S16, 4: S32}
TWO23 = float(2**23)

OPS = ("floor", "ceil", "round-nearest-even", "round-nearest-afz", "exponential-minus-one", "log-plus-one",
       "cbrt", "tan", "is-finite", "remainder", "atan2", "shift-right-logical", "shift-right-arithmetic", "popcnt",
       "count-leading-zeros", "reduce-precision")


def _out(node: Node) -> dt.DType:
    """The on-chip type of a node's result."""
    return onchip_dtype(device_dtype(node.dtype))


def _src(node: Node, i: int = 0) -> dt.DType:
    """The on-chip type of operand ``i``."""
    return onchip_dtype(device_dtype(node.operands[i].dtype))


def _tile(k: Kernel, x: Operand, d: dt.DType) -> Ref:
    """An operand as a tile of type ``d`` (a number is set into a new tile)."""
    return k.t.memset(x, d) if is_num(x) else x  # type: ignore[return-value]


def _f32(k: Kernel, x: Operand) -> Ref:
    """A float operand as an fp32 tile: narrower floats widen exactly; results narrow once at the end."""
    if is_num(x):
        return k.t.memset(float(x), F32)
    assert isinstance(x, Ref)
    return x if x.dtype is F32 else k.t.copy(x, F32)


def _sign_bit(d: dt.DType) -> int:
    return 1 << (8 * d.itemsize - 1)


def _ubits(k: Kernel, x: Ref) -> Ref:
    """The unsigned integer view of a tile's elements (no instruction)."""
    return k.t.view(x, UINT[x.dtype.itemsize])


def _bitop(k: Kernel, x: Ref, op: str, mask: int) -> Ref:
    """``bits(x) op mask``, seen as ``x``'s type again."""
    return k.t.view(k.t.binary(op, _ubits(k, x), mask, UINT[x.dtype.itemsize]), x.dtype)


def _with_sign(k: Kernel, mag: Ref, sign: Ref) -> Ref:
    """``mag`` (a non-negative float, or NaN) with the sign bit ``sign`` (the sign bits of a same-type tile
    masked by :func:`_sign_bit`): copysign."""
    u = k.t.binary("or", _ubits(k, mag), sign, UINT[mag.dtype.itemsize])
    return k.t.view(u, mag.dtype)


# --- integers -------------------------------------------------------------------------------------

def _ct(d: dt.DType) -> dt.DType:
    """The 32-bit type an integer of type ``d`` computes in (exactly, on GpSimd)."""
    return U32 if d is U32 else S32


def _wide(k: Kernel, x: Operand, d: dt.DType, signed: bool | None = None) -> Operand:
    """An integer operand of type ``d`` as 32 bits: sign-extended (``signed``) or zero-extended. A
    32-bit tile is only viewed; a narrower one is copied by GpSimd (a bitwise ``or 0``: exact)."""
    signed = d.is_signed if signed is None else signed
    n = 8 * d.itemsize
    if is_num(x):
        v = int(x) & ((1 << n) - 1)
        return v - (1 << n) if signed and v >= 1 << (n - 1) else v
    assert isinstance(x, Ref)
    if x.dtype.itemsize == 4:  # 32 bits already (also a value widened before)
        return k.t.view(x, S32 if signed else U32)
    src = k.t.view(x, (SINT if signed else UINT)[x.dtype.itemsize])
    out = k.t.tile(S32)
    k.g.add("pool", "tensor_scalar", out, src, op0="or", scalar0=0)
    return out


def _ibin(k: Kernel, op: str, a: Operand, b: Operand, d: dt.DType) -> Ref:
    """``a op b`` on integers of type ``d``, exactly, in 32 bits (the caller's narrowing wraps)."""
    return k.t.binary(op, _wide(k, a, d), _wide(k, b, d), _ct(d))


# --- arithmetic, compare, select, clamp -------------------------------------------------------

ARITH = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "maximum": "max", "minimum": "min",
         "power": "pow"}
BITWISE = {"and": "and", "or": "or", "xor": "xor"}
COMPARE = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}


@emits(*ARITH)
def _arith(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    a, b = ops
    d = _out(node)
    op = ARITH[node.op]
    if node.id in k.on_act and d.is_float and is_num(a) != is_num(b) and not (op == "sub" and is_num(a)):
        # ScalarE's share of the pass (elementwise.act_share)
        x, c = (b, a) if is_num(a) else (a, b)
        if node.op == "multiply":
            return k.t.act("identity", x, d, scale=float(c))
        return k.t.act("identity", x, d, bias=float(c) if node.op == "add" else -float(c))
    if d.is_float:
        return k.t.binary(op, a, b, F32 if d is dt.F8E4M3FN else d)  # e4m3fn: narrowed with XLA's overflow
    if d is U8 and node.dtype.is_pred:
        return k.t.binary(op, a, b, d)  # max/min of predicates: exact on bytes
    if op == "div":
        return _int_div(k, a, b, d)
    if op == "pow":
        return _int_pow(k, a, b, d)
    return _ibin(k, op, a, b, d)


def _int_div(k: Kernel, a: Operand, b: Operand, d: dt.DType) -> Operand:
    """XLA's integer division: truncating, ``x / 0 = -1`` (all ones), ``INT_MIN / -1 = INT_MIN`` (the
    quotient 2**31 wraps on writing)."""
    ct = _ct(d)
    A, B = _wide(k, a, d), _wide(k, b, d)
    ones = -1 if ct is S32 else 0xFFFFFFFF
    if is_num(B):
        return ones if B == 0 else k.t.binary("div", A, B, ct)
    q = k.t.binary("div", A, B, ct)
    zero = k.t.binary("eq", B, 0, ct)
    return k.t.select(zero, ones, q, ct)


def _int_rem(k: Kernel, a: Operand, b: Operand, d: dt.DType) -> Operand:
    """XLA's integer remainder ``x - (x / y) * y`` (sign of the dividend): ``x % 0 = x`` whatever the
    quotient of a division by zero is, ``INT_MIN % -1 = 0`` by wrapping."""
    ct = _ct(d)
    A, B = _wide(k, a, d), _wide(k, b, d)
    if is_num(B) and B == 0:
        return A
    q = k.t.binary("div", A, B, ct)
    return k.t.binary("sub", A, k.t.binary("mul", q, B, ct), ct)


def _int_pow(k: Kernel, a: Operand, b: Operand, d: dt.DType) -> Operand:
    """XLA's integer power: square and multiply over the exponent's bits (wrapping); a negative
    exponent gives 1 for x = 1, +-1 for x = -1 and 0 otherwise."""
    ct = _ct(d)
    A, B = _wide(k, a, d), _wide(k, b, d)
    t = k.t
    if is_num(B):
        e = int(B)
        if e < 0:
            if is_num(A):
                return 1 if A == 1 else (-1 if e % 2 else 1) if A == -1 else 0
            one = t.binary("eq", A, 1, ct)
            mone = t.binary("eq", A, -1, ct)
            return t.select(one, 1, t.select(mone, -1 if e % 2 else 1, 0, ct), ct)
        acc: Operand = 1
        base = A
        while e:
            if e & 1:
                acc = base if is_num(acc) else t.binary("mul", acc, base, ct)
            e >>= 1
            if e:
                base = t.binary("mul", base, base, ct)
        return acc
    base = _tile(k, A, ct)
    one = t.memset(1, ct)
    acc = one
    nbits = 8 * d.itemsize - (1 if ct is S32 and d.is_signed else 0)
    for i in range(nbits):
        bit = t.scalar2(B, "shr", i, "and", 1, ct)  # type: ignore[arg-type]
        acc = t.binary("mul", acc, t.select(bit, base, one, ct), ct)
        if i < nbits - 1:
            base = t.binary("mul", base, base, ct)
    if not d.is_signed:
        return acc
    neg = t.binary("lt", B, 0, ct)
    odd = t.binary("and", B, 1, ct)
    sgn = t.scalar2(odd, "mul", -2, "add", 1, ct)  # -1 for an odd exponent, else 1
    special = t.select(t.binary("eq", base if is_num(A) else A, -1, ct), sgn, 0, ct)
    special = t.select(t.binary("eq", base if is_num(A) else A, 1, ct), one, special, ct)
    return t.select(neg, special, acc, ct)


@emits("remainder")
def _remainder(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    d = _out(node)
    if d.is_int:
        return _int_rem(k, ops[0], ops[1], d)
    return _fmod(k, node, ops)


@emits(*BITWISE)
def _bitwise(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """On the bits (VectorE): any integer width, predicates as bytes of 0 and 1."""
    a, b = ops
    d = _out(node)
    if is_num(a):
        a, b = b, a
    return k.t.binary(BITWISE[node.op], _tile(k, a, d), _wide(k, b, d) if is_num(b) else b, d)


@emits("not")
def _not(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    d = _out(node)
    x = _tile(k, ops[0], d)
    if node.dtype.is_pred:
        return k.t.binary("eq", x, 0, d)
    return k.t.binary("xor", x, (1 << 8 * d.itemsize) - 1 if not d.is_signed else -1, d)


@emits("compare")
def _compare(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """Floats in fp32 (``TOTALORDER`` on integer keys of their bits); integers of up to 16 bits exactly
    in fp32 on VectorE, 32-bit ones on GpSimd (signed or unsigned as their type)."""
    a, b = ops
    d = _src(node)
    op = COMPARE[node.attrs["direction"]]
    if d.is_float and node.attrs.get("type") == "TOTALORDER":
        a, b = _total_order_key(k, a, d), _total_order_key(k, b, d)
        d = SINT[d.itemsize]
    if d.is_int and d.itemsize == 4:
        return k.t.binary(op, _wide(k, a, d), _wide(k, b, d), U32)
    if is_num(a) and is_num(b):
        a = k.t.memset(a, d)
    return k.t.binary(op, a, b, U8)


def _total_order_key(k: Kernel, x: Operand, d: dt.DType) -> Operand:
    """A signed integer of the float's width ordered as IEEE totalOrder (-NaN < -inf < -0 < +0 < inf
    < NaN): the bits, with the magnitude bits flipped when the sign is set."""
    n = 8 * d.itemsize
    s = SINT[d.itemsize]
    if is_num(x):
        v = int(np.array(x, d.np).view(s.np))
        return v ^ ((1 << (n - 1)) - 1) if v < 0 else v
    assert isinstance(x, Ref)
    bits = k.t.view(x, s)
    flip = k.t.scalar2(bits, "shr", n - 1, "and", (1 << (n - 1)) - 1, s)  # all magnitude bits when negative
    return k.t.binary("xor", bits, flip, s)


@emits("select")
def _select(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    p, a, b = ops
    if is_num(p):
        return a if p else b
    assert isinstance(p, Ref)
    return k.t.select(p, a, b, _out(node))


@emits("clamp")
def _clamp(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """``min(max(x, lo), hi)``: NaN propagates (floats), exact on integers."""
    lo, x, hi = ops
    d = _out(node)
    if d.is_float:
        return k.t.binary("min", k.t.binary("max", _tile(k, x, d), lo, d), hi, d)
    return _ibin(k, "min", _ibin(k, "max", x, lo, d), hi, d)


# --- sign, abs, negate ----------------------------------------------------------------------------

@emits("negate")
def _negate(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    d = _out(node)
    x = _tile(k, ops[0], d)
    if d.is_float:
        return _bitop(k, x, "xor", _sign_bit(d))  # exact, NaN payloads kept
    return k.t.binary("rsub", _wide(k, x, d), 0, _ct(d))


@emits("abs")
def _abs(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    d = _out(node)
    x = _tile(k, ops[0], d)
    if d.is_float:
        return _bitop(k, x, "and", _sign_bit(d) - 1)
    if not d.is_signed:
        return x
    return k.t.binary("abs_max", _wide(k, x, d), 0, S32)  # |INT_MIN| wraps to INT_MIN, as XLA's


@emits("sign")
def _sign(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """Integers: -1, 0 or 1. Floats (XLA): +-1 with x's sign, x itself for +-0 and NaN."""
    d = _out(node)
    t = k.t
    if d.is_int:
        x = _wide(k, _tile(k, ops[0], d), d)
        pos = t.binary("gt", x, 0, S32)
        return pos if not d.is_signed else t.binary("sub", pos, t.binary("lt", x, 0, S32), S32)
    x = _f32(k, ops[0])
    one = t.view(t.scalar2(t.view(x, U32), "and", 0x80000000, "or", 0x3F800000, U32), F32)  # copysign(1, x)
    nonzero = t.scalar2(x, "abs_max", 0.0, "gt", 0.0, U8)  # false for +-0 and NaN
    return t.select(nonzero, one, x, F32)


# --- rounding ---------------------------------------------------------------------------------------

@emits("floor", "ceil", "round-nearest-even", "round-nearest-afz")
def _round(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """Exact: ``(|x| + 2**23) - 2**23`` is |x| rounded to the nearest even integer (one fp32 step
    rounds); ties away from zero add what the tie lost; floor and ceil correct toward their side. The
    result has x's sign in every case (ceil(-0.5) = -0), and |x| >= 2**23, infinities and NaN are x."""
    t = k.t
    x = _f32(k, ops[0])
    xb = t.view(x, U32)
    a = t.view(t.binary("and", xb, 0x7FFFFFFF, U32), F32)
    s = t.binary("and", xb, 0x80000000, U32)
    r = t.scalar2(a, "add", TWO23, "sub", TWO23, F32)
    if node.op == "round-nearest-afz":
        tie = t.binary("eq", t.binary("sub", a, r, F32), 0.5, F32)  # |x| - r = 0.5 (exact): a tie rounded down
        r = t.binary("add", r, tie, F32)
    if node.op in ("floor", "ceil"):
        rx = _with_sign(k, r, s)
        fix = t.binary("gt" if node.op == "floor" else "lt", rx, x, F32)
        r = t.view(t.binary("and", t.view(t.binary("sub" if node.op == "floor" else "add", rx, fix, F32), U32),
                            0x7FFFFFFF, U32), F32)
    y = _with_sign(k, r, s)
    return t.select(t.binary("lt", a, TWO23, U8), y, x, F32)


# --- functions of several instructions ----------------------------------------------------------------

@emits("is-finite")
def _is_finite(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    x = _tile(k, ops[0], _src(node))
    return k.t.scalar2(x, "abs_max", 0.0, "lt", math.inf, U8)  # NaN and +-inf compare false


@emits("exponential-minus-one")
def _expm1(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """u = exp(x) correctly rounded is e**x (1 + d), and d is log(u) - x to within log's rounding (an
    exact subtraction): ``expm1(x) = (u - 1) - u (log(u) - x)`` (u - 1 exact) for |x| < 1, where u - 1
    alone cancels; u - 1 beyond; x itself where u rounds to 1 (tiny x, signed zeros)."""
    t = k.t
    x = _f32(k, ops[0])
    u = t.act("exp", x, F32)
    um1 = t.binary("add", u, -1.0, F32)
    d = t.binary("sub", t.act("log", u, F32), x, F32)
    r = t.binary("sub", um1, t.binary("mul", u, d, F32), F32)
    r = t.select(t.scalar2(x, "abs_max", 0.0, "lt", 1.0, U8), r, um1, F32)
    return t.select(t.binary("eq", u, 1.0, U8), x, r, F32)


@emits("log-plus-one")
def _log1p(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """u = 1 + x rounded misses 1 + x by e = (u - 1) - x (exact when |x| <= 1: the rounding error of the
    sum), so ``log1p(x) = log(u) - e / u`` to first order (e / u is below half an ulp of u); x itself
    where u rounds to 1; where u is 0 or inf (x = -1, inf) or NaN, log(u) itself."""
    t = k.t
    x = _f32(k, ops[0])
    u = t.binary("add", x, 1.0, F32)
    lu = t.act("log", u, F32)
    e = t.binary("sub", t.binary("add", u, -1.0, F32), x, F32)
    r = t.binary("sub", lu, t.binary("div", e, u, F32), F32)
    r = t.select(t.binary("eq", u, 1.0, U8), x, r, F32)  # x itself: the sign of a zero
    r = t.select(t.binary("lt", u, math.inf, U8), r, lu, F32)
    return t.select(t.binary("gt", u, 0.0, U8), r, lu, F32)


@emits("cbrt")
def _cbrt(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """c = |x| ** (1/3) (fp32 pow, ~1e-6 relative), one Newton step ``c + c (|x| / c**3 - 1) / 3`` (the
    division done as three, so nothing overflows), x's sign; 0, inf and NaN are x."""
    t = k.t
    x = _f32(k, ops[0])
    xb = t.view(x, U32)
    a = t.view(t.binary("and", xb, 0x7FFFFFFF, U32), F32)
    s = t.binary("and", xb, 0x80000000, U32)
    c = t.binary("pow", a, float(np.float32(1.0 / 3.0)), F32)
    q = t.binary("div", t.binary("div", t.binary("div", a, c, F32), c, F32), c, F32)
    corr = t.binary("mul", c, t.binary("add", q, -1.0, F32), F32)
    c1 = t.binary("add", c, t.binary("mul", corr, float(np.float32(1.0 / 3.0)), F32), F32)
    ok = t.binary("eq", c1, c1, U8)  # NaN for 0, inf and NaN (0/0, inf/inf)
    return _with_sign(k, t.select(ok, c1, a, F32), s)


@emits("tan")
def _tan(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """sin(x) / cos(x), each correctly rounded: within 2 ulp."""
    x = _f32(k, ops[0])
    return k.t.binary("div", k.t.act("sin", x, F32), k.t.act("cos", x, F32), F32)


PI = (float(np.float32(np.pi)), float(np.pi - float(np.float32(np.pi))))  # pi as fp32 and what it misses
HALF_PI = (float(np.float32(np.pi / 2)), float(np.pi / 2 - float(np.float32(np.pi / 2))))


@emits("atan2")
def _atan2(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """atan2(y, x) = r in the first octant, arctan(min/max) (ISA 1.1's arctan), then pi/2 - r when
    |y| > |x|, pi - r when x's sign is set, y's sign. 0/0 is taken as 0 (atan2(+-0, -0) = +-pi) and
    inf/inf as 1 (atan2(inf, -inf) = 3 pi / 4); NaN propagates."""
    t = k.t
    y, x = _f32(k, ops[0]), _f32(k, ops[1])
    yb, xb = t.view(y, U32), t.view(x, U32)
    ay = t.view(t.binary("and", yb, 0x7FFFFFFF, U32), F32)
    ax = t.view(t.binary("and", xb, 0x7FFFFFFF, U32), F32)
    hi, lo = t.binary("max", ay, ax, F32), t.binary("min", ay, ax, F32)
    q = t.binary("div", lo, hi, F32)
    q = t.select(t.binary("eq", hi, 0.0, U8), 0.0, q, F32)
    q = t.select(t.binary("eq", lo, math.inf, U8), 1.0, q, F32)
    r = t.act("arctan", q, F32)
    r = t.select(t.binary("gt", ay, ax, U8), t.scalar2(r, "rsub", HALF_PI[0], "add", HALF_PI[1], F32), r, F32)
    r = t.select(t.binary("shr", xb, 31, U32), t.scalar2(r, "rsub", PI[0], "add", PI[1], F32), r, F32)
    return _with_sign(k, r, t.binary("and", yb, 0x80000000, U32))


def _fmod(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """fmod exactly: |x| = mx 2**ex, |y| = my 2**ey (integer mantissas), then
    ``r = mx 2**(ex - ey) mod my`` by long division on GpSimd, 8 bits a step (r < 2**24, so r << 8 fits
    32 bits), and the result is ``r 2**ey`` with x's sign. |x| < |y| gives x; y = 0, x = +-inf or a NaN
    give NaN. The steps cover the widest exponent range of the operands' type (32 for fp32 and bf16,
    5 for f16, 3-4 for fp8)."""
    t = k.t
    x, y = _f32(k, ops[0]), _f32(k, ops[1])
    xb, yb = t.view(x, U32), t.view(y, U32)
    ab, bb = t.binary("and", xb, 0x7FFFFFFF, U32), t.binary("and", yb, 0x7FFFFFFF, U32)
    a, b = t.view(ab, F32), t.view(bb, F32)

    def split(v: Ref) -> tuple[Ref, Ref]:
        e = t.binary("shr", v, 23, U32)
        m = t.binary("or", t.binary("and", v, 0x7FFFFF, U32), t.scalar2(e, "min", 1, "shl", 23, U32), U32)
        return m, t.binary("max", e, 1, U32)  # a subnormal: no implicit bit, exponent 1

    ma, ea = split(ab)
    mb, eb = split(bb)
    n = t.binary("max", t.binary("sub", t.view(ea, S32), t.view(eb, S32), S32), 0, S32)
    r = t.binary("sub", ma, t.binary("mul", t.binary("div", ma, mb, U32), mb, U32), U32)
    info = ml_dtypes.finfo(_src(node).np)
    # The largest ex - ey: x's top exponent less y's lowest (a subnormal of the type; fp32's own
    # subnormals count from exponent -126, where their mantissa has no implicit bit).
    span = int(info.maxexp) - 1 - max(int(info.minexp) - int(info.nmant), -126)
    for _ in range(-(-span // 8)):
        step = t.binary("min", n, 8, S32)
        v = t.binary("shl", r, step, U32)
        r = t.binary("sub", v, t.binary("mul", t.binary("div", v, mb, U32), mb, U32), U32)
        n = t.binary("sub", n, step, S32)
    scale = t.view(t.binary("shl", eb, 23, U32), F32)  # 2**(ey' - 127), ey' >= 1: a normal number
    m = t.binary("mul", t.binary("mul", t.copy(r, F32), 2.0**-23, F32), scale, F32)  # r < 2**24: exact
    res = _with_sign(k, m, t.binary("and", xb, 0x80000000, U32))
    res = t.select(t.binary("lt", a, b, U8), x, res, F32)
    ok = t.binary("mul", t.binary("lt", a, math.inf, F32), t.binary("gt", b, 0.0, F32), U8)
    return t.select(ok, res, math.nan, F32)


# --- shifts and bit counts ----------------------------------------------------------------------------

@emits("shift-left", "shift-right-logical", "shift-right-arithmetic")
def _shift(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """XLA: the amount is read unsigned; at least the bit width gives 0 (left, logical) or the sign
    fill (arithmetic). Computed in 32 bits on the value zero- or sign-extended to them."""
    x, y = ops
    d = _out(node)
    t = k.t
    n = 8 * d.itemsize
    amount = _wide(k, y, d, signed=False)
    if node.op == "shift-right-arithmetic":
        v = _wide(k, x, d, signed=True)
        amt = min(int(amount), n - 1) if is_num(amount) else t.binary("min", amount, n - 1, U32)
        return t.binary("shr", _tile(k, v, S32), amt, S32)
    v = _wide(k, x, d, signed=False)
    op = "shl" if node.op == "shift-left" else "shr"
    if is_num(amount):
        return 0 if amount >= n else t.binary(op, _tile(k, v, U32), amount, U32)
    shifted = t.binary(op, _tile(k, v, U32), amount, U32)
    return t.select(t.binary("ge", amount, n, U32), 0, shifted, U32)


def _popcount32(k: Kernel, v: Ref) -> Ref:
    """Bits set in each u32 (the classic SWAR sum; every step exact on GpSimd)."""
    t = k.t
    v = t.binary("sub", v, t.scalar2(v, "shr", 1, "and", 0x55555555, U32), U32)
    v = t.binary("add", t.binary("and", v, 0x33333333, U32), t.scalar2(v, "shr", 2, "and", 0x33333333, U32), U32)
    v = t.binary("and", t.binary("add", v, t.binary("shr", v, 4, U32), U32), 0x0F0F0F0F, U32)
    v = t.binary("add", v, t.binary("shr", v, 8, U32), U32)
    v = t.binary("add", v, t.binary("shr", v, 16, U32), U32)
    return t.binary("and", v, 0x3F, U32)


@emits("popcnt", "count-leading-zeros")
def _bitcount(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    d = _out(node)
    n = 8 * d.itemsize
    v = _tile(k, _wide(k, _tile(k, ops[0], d), d, signed=False), U32)
    if node.op == "popcnt":
        return _popcount32(k, v)
    for s in (1, 2, 4, 8, 16):  # smear the highest set bit down: the count of ones is 32 - clz
        v = k.t.binary("or", v, k.t.binary("shr", v, s, U32), U32)
    return k.t.binary("rsub", _popcount32(k, v), n, S32)


# --- reduce-precision -----------------------------------------------------------------------------------

@emits("reduce-precision")
def _reduce_precision(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """XLA's bit-level algorithm on the operand's own encoding, exactly (integer views, GpSimd): round
    the mantissa to nearest even, then send exponents the narrower format cannot hold to +-inf or
    +-0; NaN stays (or is inf with no mantissa bit left)."""
    d = _out(node)
    t = k.t
    x = _tile(k, ops[0], d)
    ebits, mbits = int(node.attrs["exponent_bits"]), int(node.attrs["mantissa_bits"])
    info = ml_dtypes.finfo(d.np)
    src_m, src_e, width = int(info.nmant), int(info.nexp), 8 * d.itemsize
    sign = 1 << (width - 1)
    exp_mask = ((1 << src_e) - 1) << src_m
    v0 = k.t.view(_wide(k, x, UINT[d.itemsize], signed=False), U32)  # type: ignore[arg-type]
    nan = t.binary("gt", t.binary("and", v0, sign - 1, U32), exp_mask, U32)
    v = v0
    if mbits < src_m:
        shift = src_m - mbits
        last = 1 << shift
        lsb = t.scalar2(v, "and", last, "shr", shift, U32)
        v = t.scalar2(t.binary("add", v, lsb, U32), "add", (last >> 1) - 1, "and", ~(last - 1) & 0xFFFFFFFF, U32)
        if width < 32:
            v = t.binary("and", v, (1 << width) - 1, U32)
    if ebits < src_e:
        bias_src = (1 << (src_e - 1)) - 1
        bias_dst = (1 << (ebits - 1)) - 1
        exponent = t.binary("and", v, exp_mask, U32)
        zero = t.binary("and", v, sign, U32)
        v = t.select(t.binary("gt", exponent, (bias_src + bias_dst) << src_m, U32),
                     t.binary("or", zero, exp_mask, U32), v, U32)
        v = t.select(t.binary("le", exponent, (bias_src - bias_dst) << src_m, U32), zero, v, U32)
    v = t.select(nan, v0 if mbits > 0 else t.memset(exp_mask, U32), v, U32)
    u = UINT[d.itemsize]
    return t.view(v if u is U32 else t.copy(v, u), d)


# --- conversions ----------------------------------------------------------------------------------

@emits("convert")
def _convert(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """One engine copy, made by the cluster's narrowing (round to nearest even; float to integer
    truncates, saturates, NaN is 0; integers wrap; f8e4m3fn as XLA); to pred: ``x != 0``."""
    x = _tile(k, ops[0], _src(node))
    if node.dtype.is_pred:
        return k.t.binary("ne", x, 0, U8)
    return x


@emits("bitcast-convert")
def _bitcast(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """Same width: the same tile seen as the other type (no instruction)."""
    d = _out(node)
    x = ops[0]
    if is_num(x):
        return _num(np.array(x, _src(node).np).view(d.np))
    assert isinstance(x, Ref)
    return k.t.view(x, d)


def _num(v: np.ndarray) -> float | int:
    return float(v) if v.dtype.kind == "f" or v.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np) else int(v)


def _iota(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    """The index along ``iota_dimension`` from the flat element index (GpSimd's iota over the tile, then
    exact integer division and remainder)."""
    shape = node.shape
    d = int(node.attrs["iota_dimension"])
    stride, size = math.prod(shape[d + 1:]), shape[d]
    rows, cols = k.grid
    r0, c0 = k.at
    t = k.t
    flat = t.tile(S32)
    k.g.add("pool", "iota", flat, base=r0 * cols + c0, channel_multiplier=cols, steps=(1,))
    q = flat if stride == 1 else t.binary("div", flat, stride, S32)
    if d == 0:
        return q
    return t.binary("sub", q, t.binary("mul", t.binary("div", q, size, S32), size, S32), S32)


lowers(*OPS)(elementwise)


def fuse_iota() -> None:
    """iota as an elementwise operator of its consumers' pass (no HBM round trip), unless another family
    lowers it (backend/families.py calls this after importing every family)."""
    if "iota" not in LOWERINGS:
        EMITTERS["iota"] = _iota
        lowers("iota")(elementwise)


# --- bitcast-convert that changes the width, and bitcast ------------------------------------------------

@lowers("bitcast-convert")
def bitcast_convert(lw: Lowering, node: Node) -> None:
    """Same width: fused with its cluster (a view of the tile). Another width adds or drops a minor
    dimension: tiles of the wider type's elements, seen as the narrower type's (the same bytes, little
    endian as XLA's CPU). A 64-bit integer is one 32-bit word on the device: its low word, and for the
    high word its sign fill (s64) or zero (u64)."""
    if node.id in lw.cluster_of:
        elementwise(lw, node)
        return
    src = node.operands[0]
    sd, od = device_dtype(src.dtype, node), device_dtype(node.dtype, node)
    x = lw.ref(src)
    wide_in = src.dtype.bits > node.dtype.bits
    if 64 in (src.dtype.bits, node.dtype.bits):
        if (src.dtype.bits, node.dtype.bits) == (32, 64):  # 32-bit words [..., 2] -> the value: its low word
            lw.set(node, lw.view(x, lambda r: r[..., 0], node))
            return
        if (src.dtype.bits, node.dtype.bits) == (64, 32):
            _split64(lw, node, x, sd, od)
            return
        raise error("NCC_EUOC002", f"bitcast-convert of {src.dtype.name} to {node.dtype.name} ({node.name}): a "
                    "64-bit integer is one 32-bit word on the device, so its bytes cannot be split further", node.loc)
    out = lw.result(node)
    big = src.shape if wide_in else node.shape  # the shape in elements of the wider type
    ratio = max(sd.itemsize, od.itemsize) // min(sd.itemsize, od.itemsize)
    rows, cols = _split(big)
    wide_t, narrow_t = (sd, od) if wide_in else (od, sd)
    src_v = lw.view(x, lambda r: r.reshape(rows, cols * (1 if wide_in else ratio)), node)
    out_v = lw.view(out, lambda r: r.reshape(rows, cols * (ratio if wide_in else 1)), node)
    g = lw.graph
    for r0 in range(0, rows, lw.target.partitions):
        rn = min(lw.target.partitions, rows - r0)
        for c0 in range(0, cols, MAX_COLS):
            cn = min(MAX_COLS, cols - c0)
            t = Tiles(g, (rn, cn), "bc")
            wide = t.tile(wide_t)
            narrow = t.view(wide, narrow_t)
            if wide_in:
                g.add("dma", "dma", wide, src_v[r0:r0 + rn, c0:c0 + cn])
                g.add("dma", "dma", out_v[r0:r0 + rn, c0 * ratio:(c0 + cn) * ratio], narrow)
            else:
                g.add("dma", "dma", narrow, src_v[r0:r0 + rn, c0 * ratio:(c0 + cn) * ratio])
                g.add("dma", "dma", out_v[r0:r0 + rn, c0:c0 + cn], wide)


def _split64(lw: Lowering, node: Node, x: Ref, sd: dt.DType, od: dt.DType) -> None:
    """A 64-bit integer (one 32-bit word on the device) as two 32-bit words: low, then high."""
    out = lw.result(node)
    rows, cols = _split(node.operands[0].shape)
    src_v = lw.view(x, lambda r: r.reshape(rows, cols), node)
    out_v = lw.view(out, lambda r: r.reshape(rows, cols * 2), node)
    g = lw.graph
    signed = node.operands[0].dtype.is_signed
    for r0 in range(0, rows, lw.target.partitions):
        rn = min(lw.target.partitions, rows - r0)
        for c0 in range(0, cols, MAX_COLS):
            cn = min(MAX_COLS, cols - c0)
            t = Tiles(g, (rn, cn), "bc")
            v = t.tile(sd)
            g.add("dma", "dma", v, src_v[r0:r0 + rn, c0:c0 + cn])
            words = g.tile((rn, cn, 2), od, "sbuf", "words").ref()
            g.add("pool", "tensor_scalar", words[:, :, 0], t.view(v, od), op0="or", scalar0=0)
            if signed:
                g.add("pool", "tensor_scalar", words[:, :, 1], t.view(v, dt.S32), op0="shr", scalar0=31)
            else:
                g.add("pool", "memset", words[:, :, 1], value=0)
            g.add("dma", "dma", out_v[r0:r0 + rn, 2 * c0:2 * (c0 + cn)], words.reshape(rn, 2 * cn))


@lowers("bitcast")
def bitcast(lw: Lowering, node: Node) -> None:
    """XLA's layout bitcast with the default layout: a reshape (an access pattern, no data moved)."""
    src = node.operands[0]
    if src.dtype is not node.dtype:
        raise error("NCC_EUOC002", f"bitcast {node.name} changes the element type ({src.dtype.name} to "
                    f"{node.dtype.name}): use bitcast-convert", node.loc)
    shape = node.shape
    lw.set(node, lw.view(lw.ref(src), lambda r: r.reshape(*shape), node))


def fold(node: Node, ops: list[Any]) -> float | int:
    """An elementwise operator of numbers only, computed now (the reference semantics), as the device
    type holds it."""
    from nxsat.ops.registry import get

    args = [np.array(v, onchip_dtype(device_dtype(o.dtype)).np if not o.dtype.is_pred else np.bool_)
            for v, o in zip(ops, node.operands)]
    opdef = get(node.op)
    assert opdef is not None and opdef.impl is not None
    v = np.asarray(opdef.impl(args, dict(node.attrs), None))
    d = onchip_dtype(device_dtype(node.dtype))
    return _num(v.astype(d.np) if v.dtype != d.np else v)

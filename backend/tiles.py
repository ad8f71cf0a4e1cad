"""Instructions on tiles: the building blocks every lowering uses.

A :class:`Tiles` makes SBUF tiles of one shape (``[rows, cols]``, rows on partitions) and emits the
instruction for an operation on them, choosing the engine: ScalarE for activation functions,
VectorE for float arithmetic, GpSimd where integers must stay exact (32-bit integer arithmetic: the
NKI ISA reference documents that VectorE and ScalarE compute integers in fp32). An operand is a
tile (:class:`Ref`) or a number (an immediate).
"""

from __future__ import annotations

import math
from typing import Any

from nxsat import dtypes as dt
from nxsat.backend.graph import Graph, Ref

Operand = Ref | float | int
EXACT_INT = ("s32", "u32")
BITWISE = ("and", "or", "xor", "shl", "shr")
COMMUTATIVE = ("add", "mul", "max", "min", "eq", "ne", "and", "or", "xor", "abs_max")
SCALAR_FLOAT_OPS = ("add", "sub", "rsub", "mul", "div", "rdiv", "max", "min")  # ScalarE's tensor_scalar steps on floats
SWAPPED = {"sub": "rsub", "div": "rdiv", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Tiles:
    """Tiles of one shape and the instructions on them."""

    def __init__(self, graph: Graph, shape: tuple[int, ...], name: str = "t") -> None:
        self.g = graph
        self.shape = shape
        self.name = name

    def tile(self, dtype: dt.DType, shape: tuple[int, ...] | None = None) -> Ref:
        d = dt.U8 if dtype.is_pred else dtype
        return self.g.tile(shape or self.shape, d, "sbuf", self.name).ref()

    def engine(self, op: str, *tiles: Ref) -> str:
        """GpSimd when every tile is a 32-bit integer (exact arithmetic), VectorE otherwise."""
        if tiles and all(t.dtype.name in EXACT_INT for t in tiles) and op not in BITWISE:
            return "pool"
        return "dve"

    def scalar_engine(self, op: str, out: Ref, *tiles: Ref) -> str:
        """The engine of a ``tensor_scalar``: on floats, VectorE or ScalarE, whichever has had less work
        lately (both compute it in fp32; a convolution's batch norms leave ScalarE idle while VectorE
        is the critical path); else as :meth:`engine`."""
        if all(t.dtype.is_float for t in (out, *tiles)) and op in SCALAR_FLOAT_OPS:
            return self.g.lighter(("dve", "act"), math.prod(out.shape[1:]))
        return self.engine(op, out, *tiles)

    def view(self, a: Ref, dtype: dt.DType) -> Ref:
        """Tile ``a``'s bytes as ``dtype`` (no instruction): ``[rows, row bytes / dtype's size]``. Bit
        operations on floats (sign, exponent, mantissa) run on an integer view of the same tile."""
        if a.dtype is dtype:
            return a
        if a.ops:  # a view of a tile (an input repeated along the row): its elements, or a whole copy
            if dtype.itemsize == a.dtype.itemsize:
                return a.bitcast(dtype)
            whole = self.tile(a.dtype)
            self.g.add("dve", "tensor_copy", whole, a)
            a = whole
        b = a.buf
        n, rem = divmod(b.row_bytes, dtype.itemsize)
        assert rem == 0, f"{b} does not hold whole {dtype.name} elements"
        return self.g.alias(b, dtype, (b.shape[0], n)).ref()

    def memset(self, value: float | int, dtype: dt.DType, shape: tuple[int, ...] | None = None) -> Ref:
        t = self.tile(dtype, shape)
        self.g.add("pool" if dtype.is_int else "dve", "memset", t, value=value)
        return t

    def binary(self, op: str, a: Operand, b: Operand, dtype: dt.DType) -> Ref:
        """``a op b`` into a new tile of ``dtype``."""
        out = self.tile(dtype)
        self.binary_into(out, op, a, b)
        return out

    def binary_into(self, out: Ref, op: str, a: Operand, b: Operand) -> None:
        if is_num(a) and is_num(b):
            a = self.memset(a, out.dtype)
        ca, cb = column(a), column(b)
        if ca is not None and cb is None and isinstance(b, Ref) and (op in COMMUTATIVE or op in SWAPPED):
            a, b, op, ca, cb = b, a, op if op in COMMUTATIVE else SWAPPED[op], None, ca
        if cb is not None and ca is None and isinstance(a, Ref) and all(t.dtype.is_float for t in (out, a, cb)):
            # one value per partition (a per-channel scale, a per-row statistic): the scalar operand of
            # tensor_scalar, one pass over the tile where tensor_tensor reading the repeated column makes two
            self.g.add(self.scalar_engine(op, out, a, cb), "tensor_scalar", out, a, op0=op, scalar0=cb)
            return
        if is_num(a):
            if op in COMMUTATIVE:
                a, b = b, a
            elif op in SWAPPED:
                a, b, op = b, a, SWAPPED[op]
            else:
                a = self.memset(a, out.dtype)
        if is_num(b):
            self.g.add(self.scalar_engine(op, out, a), "tensor_scalar", out, a, op0=op, scalar0=_imm(b, out, a))
            return
        self.g.add(self.engine(op, out, a, b), "tensor_tensor", out, a, b, op=op)

    def scalar2(self, a: Ref, op0: str, s0: Operand, op1: str, s1: Operand, dtype: dt.DType) -> Ref:
        """``(a op0 s0) op1 s1`` in one instruction; a scalar is a number or a ``[rows, 1]`` column."""
        out = self.tile(dtype)
        cols = [s for s in (s0, s1) if isinstance(s, Ref)]
        eng = self.scalar_engine(op0, out, a, *cols) if op1 in SCALAR_FLOAT_OPS or op1 == "none" \
            else self.engine(op0, out, a, *cols)
        self.g.add(eng, "tensor_scalar", out, a, op0=op0,
                   scalar0=s0 if isinstance(s0, Ref) else _imm(s0, out, a), op1=op1,
                   scalar1=s1 if isinstance(s1, Ref) else _imm(s1, out, a))
        return out

    def act(self, func: str, a: Ref, dtype: dt.DType, scale: float = 1.0, bias: float = -0.0) -> Ref:
        """``func(scale * a + bias)`` on ScalarE. The default bias is -0.0, the identity of addition
        (``x + -0.0`` is ``x`` for every x; ``-0.0 + 0.0`` would be +0.0): functions keep the sign of a
        zero (``sqrt(-0) = -0``, ``rsqrt(-0) = -inf``), as XLA computes them."""
        out = self.tile(dtype)
        self.g.add("act", "activation", out, a, func=func, scale=float(scale), bias=float(bias))
        return out

    def copy(self, a: Ref, dtype: dt.DType) -> Ref:
        """``a`` converted to ``dtype`` (rounding to nearest even; float to integer truncates)."""
        out = self.tile(dtype)
        self.copy_into(out, a)
        return out

    def copy_into(self, out: Ref, a: Ref) -> None:
        if a.dtype.is_int and out.dtype.is_int and a.dtype is not out.dtype:
            # integers change width by wrapping (XLA); GpSimd computes them exactly
            self.g.add("pool", "tensor_scalar", out, a, op0="or", scalar0=0)
            return
        self.g.add("pool" if a.dtype.is_int and out.dtype.is_int else "dve", "tensor_copy", out, a)

    def filled(self, value: float | int, dtype: dt.DType) -> Ref:
        """A number as a whole-tile operand: one column set and read through a stride-0 view (a memset of
        the whole tile costs VectorE as much as the instruction reading it: a masked attention's select
        with -3.4e38, 117 of 351 us)."""
        if len(self.shape) != 2:
            return self.memset(value, dtype)
        return self.memset(value, dtype, (self.shape[0], 1)).broadcast(1, self.shape[1])

    def select(self, pred: Ref, a: Operand, b: Operand, dtype: dt.DType) -> Ref:
        out = self.tile(dtype)
        a = self.filled(a, dtype) if is_num(a) else a
        b = self.filled(b, dtype) if is_num(b) else b
        self.g.add("dve" if not (pred.dtype.is_int and a.dtype.name in EXACT_INT) else "pool", "select", out, pred,
                   a, b)
        return out


def column(x: Operand) -> Ref | None:
    """The ``[rows, 1]`` tile a ``[rows, n]`` operand repeats along its row (one value per partition), if it
    is one."""
    if not isinstance(x, Ref) or not x.ops or x.ops[-1][0] != "broadcast" or len(x.shape) != 2:
        return None
    src = x._up()
    return src if len(src.shape) == 2 and src.shape[1] == 1 and x.ops[-1][1][0] == 1 and src.buf.onchip else None


def _imm(v: float | int, *tiles: Ref) -> float | int:
    """An immediate in the domain its instruction computes in: exact integers for integer tiles."""
    if all(t.dtype.is_int for t in tiles) and float(v) == int(v):
        return int(v)
    return float(v)

"""Masks that are affine functions of the position: a causal mask ``q >= k`` built from iotas, compared,
reshaped and broadcast. An epilogue computes such a predicate where it applies it, with GpSimd's
``affine_select`` (``dst = src where base + cm * partition + step * column >= 0 else fill``), instead of
loading a mask tensor tile by tile and selecting on VectorE.

:func:`affine_predicate` reads the predicate off the IR as ``sum(coef[d] * i[d]) + const  cmp  0`` over
the node's shape; :func:`tile_params` gives the instruction's ``base``, ``channel_multiplier`` and
``steps`` for one tile of it, from the tile's place in the value (None where the tile's rows or columns
wrap around a dimension: then the mask is loaded as before).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.graph import Buf, Ref
from nxsat.ir import Node

# compare direction -> the instruction's comparison of (a - b) with 0
_CMP = {"GE": "ge", "GT": "gt", "LE": "le", "LT": "lt", "EQ": "eq", "NE": "ne"}
_NOT = {"ge": "lt", "gt": "le", "le": "gt", "lt": "ge", "eq": "ne", "ne": "eq"}
EXACT = 1 << 24  # index values an fp32 comparison still tells apart


@dataclass(frozen=True)
class Affine:
    """``sum(coef[d] * i[d]) + const`` over a value of ``shape``."""

    shape: tuple[int, ...]
    coef: tuple[int, ...]
    const: int

    def bound(self) -> int:
        return abs(self.const) + sum(abs(c) * (n - 1) for c, n in zip(self.coef, self.shape))


@dataclass(frozen=True)
class AffinePredicate:
    """``form cmp 0`` (cmp one of ge, gt, le, lt, eq, ne)."""

    form: Affine
    cmp: str


def _moved(form: Affine, node: Node) -> Affine | None:
    """``form`` (of ``node``'s operand) seen through ``node``, a broadcast or a reshape that only adds or
    drops dimensions of one."""
    x = node.operands[0]
    if node.op == "broadcast":
        coef = [0] * len(node.shape)
        for i, d in enumerate(node.attrs["dimensions"]):
            if x.shape[i] != node.shape[d]:
                return None
            coef[d] = form.coef[i]
        return Affine(tuple(node.shape), tuple(coef), form.const)
    if node.op in ("reshape", "bitcast") and [n for n in x.shape if n != 1] == [n for n in node.shape if n != 1]:
        kept = iter(c for c, n in zip(form.coef, x.shape) if n != 1)
        return Affine(tuple(node.shape), tuple(next(kept) if n != 1 else 0 for n in node.shape), form.const)
    return None


def index_form(node: Node, depth: int = 12) -> Affine | None:
    """``node``'s values as an affine function of its position, when it is one (iotas, broadcasts,
    reshapes, integer constants, sums, differences and integer multiples)."""
    if depth == 0 or not (node.dtype.is_int or node.dtype.is_float):
        return None
    shape = tuple(node.shape)
    if node.op == "iota":
        d = int(node.attrs["iota_dimension"])
        return Affine(shape, tuple(int(i == d) for i in range(len(shape))), 0)
    if node.op == "constant":
        v = np.asarray(node.attrs["value"])
        if v.size and (v == v.flat[0]).all() and float(v.flat[0]).is_integer():
            return Affine(shape, (0,) * len(shape), int(v.flat[0]))
        return None
    if node.op in ("broadcast", "reshape", "bitcast", "convert"):
        inner = index_form(node.operands[0], depth - 1)
        if inner is None:
            return None
        if node.op == "convert":
            return inner if node.dtype.is_int or inner.bound() < EXACT else None
        return _moved(inner, node)
    if node.op in ("add", "subtract", "multiply"):
        a, b = (index_form(o, depth - 1) for o in node.operands)
        if a is None or b is None:
            return None
        if node.op == "multiply":
            if any(a.coef) and any(b.coef):
                return None
            k, f = (a.const, b) if not any(a.coef) else (b.const, a)
            return Affine(shape, tuple(k * c for c in f.coef), k * f.const)
        sign = 1 if node.op == "add" else -1
        return Affine(shape, tuple(x + sign * y for x, y in zip(a.coef, b.coef)), a.const + sign * b.const)
    return None


def affine_predicate(node: Node, depth: int = 12) -> AffinePredicate | None:
    """``node`` (pred) as an affine comparison of its position with 0, when it is one."""
    if depth == 0 or not node.dtype.is_pred:
        return None
    if node.op == "compare" and node.attrs.get("direction") in _CMP:
        a, b = (index_form(o) for o in node.operands)
        if a is None or b is None or max(a.bound(), b.bound()) >= EXACT:
            return None
        form = Affine(tuple(node.shape), tuple(x - y for x, y in zip(a.coef, b.coef)), a.const - b.const)
        return AffinePredicate(form, _CMP[node.attrs["direction"]])
    if node.op == "not":
        p = affine_predicate(node.operands[0], depth - 1)
        return None if p is None else AffinePredicate(p.form, _NOT[p.cmp])
    if node.op in ("broadcast", "reshape", "bitcast"):
        p = affine_predicate(node.operands[0], depth - 1)
        moved = None if p is None else _moved(p.form, node)
        return None if moved is None else AffinePredicate(moved, p.cmp)
    return None


def tile_params(pred: AffinePredicate, framed: Ref) -> tuple[int, int, tuple[int, ...]] | None:
    """``affine_select``'s ``(base, channel_multiplier, steps)`` for the tile ``framed`` (a view of a
    row-major value of the predicate's shape, as the producer places its tiles), or None when one of
    the tile's dimensions crosses a dimension of the value."""
    shape = pred.form.shape
    ap = framed.ap
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    origin = [(ap.offset // s) % n for s, n in zip(strides, shape)]
    base = pred.form.const + sum(c * i for c, i in zip(pred.form.coef, origin))
    per_dim = []
    for size, stride in ap.dims:
        if size == 1 or stride == 0:
            per_dim.append(0)
            continue
        d = next((d for d, s in enumerate(strides) if s == stride and shape[d] > 1), None)
        if d is None or origin[d] + size > shape[d]:
            return None
        per_dim.append(pred.form.coef[d])
    if not per_dim:
        return None
    return base, per_dim[0], tuple(per_dim[1:])


def whole_tile(cmp: str, base: int, cm: int, steps: tuple[int, ...], shape: tuple[int, ...]) -> bool | None:
    """Whether ``base + cm * p + sum(steps[k] * i_k)  cmp  0`` holds at every position of a tile of
    ``shape`` (True: a causal mask's tile below the diagonal) or at none (False: one above it, all
    fill); None where it holds at some. The form is affine, so its extremes lie at the tile's corners:
    exact for the order comparisons; for (in)equality None also where the extremes do not decide."""
    reach = [c * (n - 1) for c, n in zip((cm, *steps), shape)]
    lo = base + sum(min(0, r) for r in reach)
    hi = base + sum(max(0, r) for r in reach)
    holds = {"ge": (lo >= 0, hi < 0), "gt": (lo > 0, hi <= 0), "le": (hi <= 0, lo > 0), "lt": (hi < 0, lo >= 0),
             "eq": (lo == hi == 0, lo > 0 or hi < 0), "ne": (lo > 0 or hi < 0, lo == hi == 0)}[cmp]
    return True if holds[0] else False if holds[1] else None


def rows_keep(cmp: str, base: int, cm: int, steps: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Does every row (partition) of a tile of ``shape`` have a position where the predicate holds (a
    causal mask's rows each keep their first key)? Only the order comparisons are answered (else False)."""
    down = base + min(0, cm * (shape[0] - 1))  # the form's least value at a row's start, over the rows
    up = base + max(0, cm * (shape[0] - 1))
    far = [s * (n - 1) for s, n in zip(steps, shape[1:])]
    best_hi = down + sum(max(0, r) for r in far)  # the least, over the rows, of a row's largest value
    best_lo = up + sum(min(0, r) for r in far)  # the largest, over the rows, of a row's least value
    return {"ge": best_hi >= 0, "gt": best_hi > 0, "le": best_lo <= 0, "lt": best_lo < 0}.get(cmp, False)


def virtual(node: Node) -> Ref:
    """A view of a value of ``node``'s shape that no program holds: where a tile of it would lie."""
    return Buf(f"affine_{node.name}", "scratch", dt.S32, tuple(node.shape)).ref()

"""Random instances of a rule's left-hand side, for the rule checker.

A pattern (egglog terms over the term language, with variables) becomes an IR graph: variables of
sort T become parameters or constants, attribute variables get values, all at random but biased
toward what guards look for: identity and inverse permutations, the shape a reshape came from,
slices inside a pad or a concatenate, splat constants 0, 1, -1, 2, 0.5. Ill-typed draws raise
Reject (the checker draws again); patterns it cannot build raise Untestable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from nxsat import dtypes as dt
from nxsat.builder import infer_type
from nxsat.diagnostics import NxsatError
from nxsat.ir import Node, TensorType, TupleType
from nxsat.rules import terms
from nxsat.rules.catalog import Rule
from nxsat.rules.egraph import splat_array
from nxsat.rules.sexp import Atom, SExp, SList
from nxsat.rules.terms import REDUCERS

SHAPES: tuple[tuple[int, ...], ...] = ((), (3,), (2, 3), (3, 2), (2, 2), (2, 3, 4), (4, 1, 3), (1, 3), (3, 3),
                                       (2, 2, 3, 4))
DTYPES = (dt.F32, dt.F32, dt.S32, dt.BF16, dt.PRED, dt.F16, dt.U8)
SPLATS = (0, 1, -1, 2, 0.5)
MANY_GUARDS = 8  # above this many guarded splats a rule's instances take them by _Env.guard_odds
CONVERT_TYPES = (dt.F32, dt.BF16, dt.F16, dt.F64, dt.S32, dt.S8, dt.U8, dt.PRED, dt.S64)
MIXED_FLOATS = (dt.F16, dt.BF16, dt.F32)  # the other operand's type of a mixed-precision dot


class Reject(Exception):
    """This random instance is not well-typed; try another."""


class Untestable(Exception):
    """The pattern uses something the generator cannot instantiate (an opaque operator, ...)."""



@dataclass
class _Env:
    rng: np.random.Generator
    base: TensorType
    params: list[Node]
    nodes: list[Node]
    t_vars: dict[str, Node] = field(default_factory=dict)
    list_vars: dict[str, list[Node]] = field(default_factory=dict)
    attr_vars: dict[str, Any] = field(default_factory=dict)
    bindings: dict[str, SExp] = field(default_factory=dict)  # var -> pattern it stands for
    splats: tuple[Any, ...] = SPLATS  # constants leaves take: SPLATS and the ones the rule's guards name
    var_splats: dict[str, float] = field(default_factory=dict)  # var -> the splat its guard asks for
    var_ranks: dict[str, int] = field(default_factory=dict)  # var -> the rank its guard asks for
    channel_rank: int = 0  # the rank of this instance's per-channel values (1: [C], 2: [1, C]; 0: not drawn)

    @property
    def guard_odds(self) -> float:
        """How often a guarded leaf takes its guard's splat (0: the usual mix). With many guards (an
        expansion's dozens of coefficients: gelu-erf-xla's 35), half the instances meet them all."""
        n = len(self.var_splats)
        return 0.5 ** (1 / n) if n > MANY_GUARDS else 0.0


def _is_var(x: SExp) -> bool:
    return isinstance(x, Atom) and x.kind == "sym" and not x.text.startswith(":")


def _is_pattern(x: SExp) -> bool:
    return isinstance(x, SList) and x.head is not None and (x.head in terms.BY_CTOR or x.head in ("TCons", "TNil"))


def _literal(x: SExp, sort: str) -> tuple[bool, Any]:
    """(True, value) when ``x`` is a literal of ``sort`` the generator can read."""
    if isinstance(x, Atom) and x.kind in ("int", "str"):
        return True, x.value
    if isinstance(x, SList) and x.head in ("vec-of", "vec-empty") and \
            all(isinstance(i, Atom) and i.kind == "int" for i in x.items[1:]):
        return True, tuple(int(i.value) for i in x.items[1:])  # type: ignore[union-attr]
    if isinstance(x, SList) and x.head in ("+", "-") and len(x.items) == 3:
        ok_a, a = _literal(x.items[1], sort)
        ok_b, b = _literal(x.items[2], sort)
        if ok_a and ok_b and isinstance(a, int) and isinstance(b, int):
            return True, a + b if x.head == "+" else a - b
    return False, None


def _leaf(env: _Env, t: TensorType, guard: float | None = None) -> Node:
    """A parameter, or (sometimes) a constant, of type t; mostly the constant ``guard`` when the rule's
    guard asks this variable to be that splat."""
    rng = env.rng
    if guard is not None and env.guard_odds and t.dtype.is_float and rng.random() < env.guard_odds:
        n = Node("constant", (), {"value": splat_array(str(guard), t.dtype, t.shape), "type": t}, t)
        env.nodes.append(n)
        return n
    if t.dtype.storage and (rng.random() < 0.3 or (guard is not None and rng.random() < 0.85)):
        pick = guard is not None and rng.random() < 0.9
        if pick or rng.random() < 0.7:
            v = guard if pick else env.splats[rng.integers(len(env.splats))]
            if not t.dtype.is_float and not math.isfinite(float(v)):  # type: ignore[arg-type]
                v = 1
            if t.dtype.is_pred:
                v = int(v == 1)
            elif not t.dtype.is_float:
                v = int(v) if float(v).is_integer() else 1
                if t.dtype.kind == "uint" and v < 0:
                    v = 1
            value = splat_array(str(v), t.dtype, t.shape)
        else:
            value = random_array(rng, t)
        n = Node("constant", (), {"value": value, "type": t}, t)
    else:
        n = Node("parameter", (), {"index": len(env.params), "type": t}, t, f"p{len(env.params)}")
        env.params.append(n)
    env.nodes.append(n)
    return n


# Trial 1 and later sprinkle these among the values (a fifth of the elements): a rule that is only
# right for ordinary numbers (x * 0 = 0 breaks on NaN and inf, x - x = 0 on inf, a narrowing integer
# conversion on the extremes) meets them. Trial 2 (RANGE_TRIAL) adds each float type's extremes: its
# largest finite values, huge ones, its smallest normal and subnormal values (bf16 -> f16 -> bf16 = x
# passed without them: 1e5 is inf in f16). Rules that regroup sums or products (:reassociates) skip it.
FLOAT_SPECIALS = (np.nan, np.inf, -np.inf, 0.0, -0.0)
SPECIAL_FRACTION = 0.2
RANGE_TRIAL = 2


def float_extremes(d: dt.DType) -> np.ndarray:
    """A float type's edges: +-largest finite, huge values below it, +-smallest normal and subnormal."""
    info = ml_dtypes.finfo(d.np)
    top, tiny, sub = float(info.max), float(info.smallest_normal), float(info.smallest_subnormal)
    edges = [top, top / 2, top ** 0.75, top ** 0.5, tiny, tiny * 3, sub, sub * 5]
    return np.array(edges + [-e for e in edges], np.float64)


def random_array(rng: np.random.Generator, t: TensorType, salt: int = 0, infinities: bool = True) -> np.ndarray:
    """Random values of type ``t``: small numbers for trial (``salt``) 0, wider ones and special
    values (NaN, infinities, signed zeros, the integer type's extremes) for trial 1, and the float
    type's extremes for trial 2 on. Without ``infinities`` (a narrowing rule: values beyond the narrow
    type's range may change, and fp8 e4m3 has no infinity) the specials are NaN and the zeros."""
    d = t.dtype
    if d.is_pred:
        return rng.random(t.shape) < 0.5
    special = np.asarray(rng.random(t.shape) < SPECIAL_FRACTION) if salt else np.zeros(t.shape, bool)
    if d.is_int:
        lo, hi = (0, 8) if d.kind == "uint" else (-4, 6)
        info = np.iinfo(d.np)
        extremes = np.array([info.min, info.max, info.min + 1, info.max - 1], d.np)
        return np.where(special, extremes[rng.integers(len(extremes), size=t.shape)],
                        rng.integers(lo, hi, t.shape)).astype(d.np)
    pool = np.array([v for v in FLOAT_SPECIALS if infinities or not np.isinf(v)]) if salt < RANGE_TRIAL \
        else float_extremes(d)
    v = np.where(special, pool[rng.integers(len(pool), size=t.shape)], rng.standard_normal(t.shape) * (1.0 + 2 * salt))
    return dt.cast(v, d)


def _random_type(env: _Env) -> TensorType:
    rng = env.rng
    if rng.random() < 0.6:
        return env.base
    shape = SHAPES[rng.integers(len(SHAPES))]
    return TensorType(env.base.dtype if rng.random() < 0.7 else DTYPES[rng.integers(len(DTYPES))], shape)


def _perm(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    return tuple(int(i) for i in rng.permutation(n))


def _inverse(p: Sequence[int]) -> tuple[int, ...]:
    out = [0] * len(p)
    for i, j in enumerate(p):
        out[j] = i
    return tuple(out)


def _factor_shapes(size: int) -> list[tuple[int, ...]]:
    divs = [d for d in range(1, size + 1) if size % d == 0]
    out = [(size,)]
    out += [(d, size // d) for d in divs]
    out += [(a, b, size // (a * b)) for a in divs for b in divs if size % (a * b) == 0]
    return out


# Planners: given the node being built (its operands so far, what the pattern fixed), choose types
# of operands the pattern leaves free and values of attribute slots. Keys are slot names.
Plan = dict[str, Any]


def _plan(ctor: str, ops: list[Node | None], want: TensorType | None, env: _Env) -> Plan:
    rng = env.rng
    known = [o.type for o in ops if o is not None and isinstance(o.type, TensorType)]
    first = known[0] if known else (want or _random_type(env))
    plan: Plan = {"types": [first] * len(ops)}
    x = ops[0] if ops else None
    xt = x.type if x is not None and isinstance(x.type, TensorType) else first
    if ctor == "Select":
        a = ops[1].type if ops[1] is not None else ops[2].type if ops[2] is not None else first
        plan["types"] = [TensorType(dt.PRED, a.shape if rng.random() < 0.7 else ()), a, a]
    elif ctor == "Pad":
        plan["types"] = [xt, TensorType(xt.dtype, ())]
        r = xt.rank
        if rng.random() < 0.5 and r:
            d = int(rng.integers(r))
            lo, hi = [0] * r, [0] * r
            lo[d], hi[d] = int(rng.integers(-1, 3)), int(rng.integers(-1, 3))
            plan.update(lo=tuple(lo), hi=tuple(hi), interior=(0,) * r)
        else:
            plan.update(lo=tuple(int(v) for v in rng.integers(-1, 3, r)),
                        hi=tuple(int(v) for v in rng.integers(-1, 3, r)),
                        interior=tuple(int(v) for v in rng.integers(0, 2, r)) if rng.random() < 0.3 else (0,) * r)
    elif ctor == "Transpose":
        r = xt.rank
        if x is not None and x.op == "transpose" and rng.random() < 0.4:
            plan["dimensions"] = _inverse(x.attrs["dimensions"])
        elif rng.random() < 0.25:
            plan["dimensions"] = tuple(range(r))
        elif r >= 3 and rng.random() < 0.4:  # a channels-first value seen channels-last, or back (the layout set)
            plan["dimensions"] = _CHANNELS_LAST(r) if rng.random() < 0.6 else _inverse(_CHANNELS_LAST(r))
        else:
            plan["dimensions"] = _perm(rng, r)
    elif ctor in ("Reshape", "Bitcast"):
        below = _under(x, lambda n: n.op in ("reshape", "bitcast"))  # a reshape back, maybe across a chain
        split = _split_last(xt.shape)
        if below is not None and rng.random() < 0.4 and math.prod(below.operands[0].shape) == xt.size:
            plan["shape"] = below.operands[0].shape
        elif xt.rank >= 2 and rng.random() < (0.7 if _grouped(x) else 0.3):
            # the last two dimensions merged (a group's statistic broadcast over its channels, back to channels)
            plan["shape"] = (*xt.shape[:-2], xt.shape[-2] * xt.shape[-1])
        elif split is not None and rng.random() < 0.35:  # the last dimension split (channels into groups)
            plan["shape"] = split
        elif rng.random() < 0.25:
            plan["shape"] = xt.shape
        else:
            cands = _factor_shapes(xt.size) if xt.size else [xt.shape]
            plan["shape"] = cands[int(rng.integers(len(cands)))]
    elif ctor == "Reduce":
        r = xt.rank
        plan["types"] = [xt, TensorType(xt.dtype, ())]
        if _splits_last(x) and r >= 3 and rng.random() < 0.8:  # a group norm's: all but the batch and group
            plan["dimensions"] = tuple(i for i in range(1, r) if i != r - 2)
        elif x is not None and x.op == "transpose" and r >= 3 and x.attrs["dimensions"] == _CHANNELS_LAST(r) \
                and rng.random() < 0.7:  # global pooling, or per-channel statistics, of a channels-last view
            plan["dimensions"] = tuple(range(1, r - 1)) if rng.random() < 0.5 else tuple(range(r - 1))
        elif r and rng.random() < 0.6:  # the last dimension: what softmax and the norms reduce
            plan["dimensions"] = (r - 1,)
        else:
            plan["dimensions"] = tuple(i for i in range(r) if rng.random() < 0.5)
        plan.update(reducer=REDUCERS[int(rng.integers(len(REDUCERS)))], reducer_dtype=xt.dtype.name)
    elif ctor == "Softmax":
        r = max(1, xt.rank)
        plan.update(dimension=r - 1 if rng.random() < 0.7 else int(rng.integers(r)),
                    scale=SPLATS[int(rng.integers(len(SPLATS)))])
    elif ctor == "Broadcast":
        r = xt.rank
        conv = _convolution_of(env, want) if x is None else None
        if conv is not None and rng.random() < 0.8:
            plan.update(_per_channel(conv, env))
            return plan
        red = _under(x, lambda n: n.op == "reduce")
        kept = () if red is None else \
            tuple(i for i in range(red.operands[0].type.rank) if i not in red.attrs["dimensions"])
        src = None if red is None else red.operands[0]
        per_channel = src is not None and _splits_last(src) and xt.shape == (src.operands[0].shape[0],
                                                                            src.operands[0].shape[-1])
        if per_channel and rng.random() < 0.8:
            # a per-(batch, channel) value broadcast over the positions of what a group norm reduced
            y = src.operands[0].shape  # type: ignore[union-attr]
            plan.update(shape=y, dimensions=(0, len(y) - 1))
        elif red is not None and rng.random() < 0.6 and tuple(red.operands[0].shape[i] for i in kept) == xt.shape:
            # a reduction (or a value computed from one) broadcast back over what it reduced; when the kept
            # dimensions are not leading (a group norm's batch and group), maybe only over the dimensions
            # after the last kept one (a group's channels)
            s = red.operands[0].shape
            if kept and kept != tuple(range(len(kept))) and rng.random() < 0.7:
                plan.update(shape=(*xt.shape, *s[kept[-1] + 1:]), dimensions=tuple(range(len(kept))))
            else:
                plan.update(shape=s, dimensions=kept)
        elif rng.random() < 0.25:
            plan.update(shape=xt.shape, dimensions=tuple(range(r)))
        elif rng.random() < 0.2 and r > 1:  # a broadcast that only permutes (same shape when x is square)
            dims = _perm(rng, r)
            shape = [0] * r
            for i, d in enumerate(dims):
                shape[d] = xt.shape[i]
            plan.update(shape=tuple(shape), dimensions=dims)
        else:
            extra = int(rng.integers(0, 3))
            out_rank = r + extra
            dims = sorted(int(i) for i in rng.choice(out_rank, r, replace=False)) if r else []
            if rng.random() < 0.3:
                dims = [int(i) for i in rng.permutation(dims)] if dims else dims
            shape = [int(rng.integers(1, 4)) for _ in range(out_rank)]
            for i, d in enumerate(dims):
                shape[d] = xt.shape[i] if xt.shape[i] != 1 or rng.random() < 0.5 else shape[d]
            plan.update(shape=tuple(shape), dimensions=tuple(dims))
    elif ctor == "Slice":
        plan.update(_slice_plan(x, xt, rng))
    elif ctor == "Concatenate":
        plan["dimension"] = int(rng.integers(xt.rank)) if xt.rank else 0
    elif ctor in ("Convert", "BitcastConvert"):
        plan["dtype"] = _convert_type(ctor, x, xt.dtype, rng).name
    elif ctor == "Dot":
        plan.update(_dot_plan(ops, first, env))
    elif ctor == "Convolution":
        plan.update(_conv_plan(ops, env))
    elif ctor == "ReduceWindow":
        plan["types"] = [xt, TensorType(xt.dtype, ())]
        plan.update(_window(xt.shape, range(xt.rank), rng))
        plan.update(reducer=("maximum", "add")[int(rng.integers(2))], reducer_dtype=xt.dtype.name)
    elif ctor == "Compare":
        plan.update(direction=("EQ", "NE", "LT", "LE", "GT", "GE")[int(rng.integers(6))], type="")
    elif ctor == "Reverse":
        plan["dimensions"] = tuple(i for i in range(xt.rank) if rng.random() < 0.5)
    elif ctor == "ReducePrecision":
        plan.update(exponent_bits=8, mantissa_bits=7)
    elif ctor == "Iota":
        t = want or _random_type(env)
        if not t.rank:
            t = TensorType(t.dtype, (3,))
        plan.update(dtype=t.dtype.name, shape=t.shape, iota_dimension=int(rng.integers(t.rank)))
    elif ctor == "Fill":
        t = want or _random_type(env)
        v = SPLATS[int(rng.integers(len(SPLATS)))]
        plan.update(value=str(v), dtype=t.dtype.name, shape=t.shape)
    elif ctor == "DynamicSlice":
        plan["sizes"] = tuple(int(rng.integers(0, n + 1)) for n in xt.shape)
    elif ctor == "GetTupleElement":
        n = len(x.type.elements) if x is not None and isinstance(x.type, TupleType) else 1
        plan["index"] = int(rng.integers(n))
    return plan


def _CHANNELS_LAST(r: int) -> tuple[int, ...]:
    """The transpose that shows a channels-first value channels-last: [0, 2, ..., r-1, 1]."""
    return (0, *range(2, r), 1)


def _window(shape: Sequence[int], dims: Sequence[int], rng: np.random.Generator, spatial: Sequence[int] = ()
            ) -> Plan:
    """Window slots over ``dims`` of ``shape`` (sizes given by ``spatial`` when the kernel fixes them):
    sizes within the dimension, strides 1-2, padding 0-1, now and then a dilation."""
    sizes = list(spatial) or [int(rng.integers(1, min(3, max(1, shape[d])) + 1)) for d in dims]
    n = len(sizes)
    pick = lambda lo, hi, p: tuple(int(rng.integers(lo, hi + 1)) if rng.random() < p else lo for _ in range(n))  # noqa: E731
    return {"window_sizes": tuple(sizes), "strides": pick(1, 2, 0.4), "pad_lo": pick(0, 1, 0.4),
            "pad_hi": pick(0, 1, 0.4), "lhs_dilation": pick(1, 2, 0.1), "rhs_dilation": pick(1, 2, 0.1),
            "reversal": pick(0, 1, 0.1)}


def _convolution_of(env: _Env, want: TensorType | None) -> Node | None:
    """The convolution (of type ``want``, when known) the instance built last: what a batch norm's
    per-channel scale and shift are broadcast onto. None when it has none."""
    return next((n for n in reversed(env.nodes) if n.op == "convolution" and want in (None, n.type)), None)


def _per_channel(conv: Node, env: _Env) -> Plan:
    """A value per output channel of ``conv`` broadcast onto its result: [C] onto the feature dimension,
    or (one image) [1, C] onto the batch and feature dimensions, as JAX writes it. One form per instance,
    so that every per-channel value of a pattern broadcasts alike."""
    t, dims = conv.type, conv.attrs["dims"]
    ob, of = dims.output_batch, dims.output_feature
    if not env.channel_rank:
        env.channel_rank = 2 if t.shape[ob] == 1 and env.rng.random() < 0.5 else 1
    c = t.shape[of]
    if env.channel_rank == 2:
        return {"types": [TensorType(t.dtype, (1, c))], "shape": t.shape, "dimensions": (ob, of)}
    return {"types": [TensorType(t.dtype, (c,))], "shape": t.shape, "dimensions": (of,)}


def _conv_plan(ops: list[Node | None], env: _Env) -> Plan:
    """Labels, window and (where the pattern leaves them free) operand types for a valid convolution:
    channels-last (JAX's b01f) or channels-first labels most of the time, random ones otherwise."""
    rng = env.rng

    def labels(r: int) -> tuple[int, ...]:
        u = rng.random()
        if u < 0.4:
            return (0, r - 1, *range(1, r - 1))  # b01f: batch first, feature last
        if u < 0.7:
            return tuple(range(r))  # bf01
        return tuple(int(i) for i in rng.permutation(r))

    x = ops[0].type if ops[0] is not None and isinstance(ops[0].type, TensorType) else None
    w = ops[1].type if ops[1] is not None and isinstance(ops[1].type, TensorType) else None
    if x is not None and w is not None and x.rank != w.rank:
        raise Reject()
    r = x.rank if x is not None else w.rank if w is not None else int(rng.integers(3, 5))
    if r < 3:
        raise Reject()
    il, kl, ol = labels(r), labels(r), labels(r)
    if w is not None:  # the kernel fixes the channels and the window
        ki, ko, ks = w.shape[kl[0]], w.shape[kl[1]], tuple(w.shape[d] for d in kl[2:])
    else:
        ki = x.shape[il[1]] if x is not None else int(rng.integers(1, 4))
        ko, ks = int(rng.integers(1, 4)), ()
    if x is None:
        shape = [0] * r
        shape[il[0]], shape[il[1]] = int(rng.integers(1, 3)), ki
        for d, k in zip(il[2:], ks or [3] * (r - 2)):
            shape[d] = int(rng.integers(max(1, k), max(1, k) + 3))
        x = TensorType(dt.F32 if w is None else w.dtype, tuple(shape))
    if x.shape[il[1]] != ki:
        raise Reject()
    plan: Plan = _window(x.shape, il[2:], rng, ks)
    if w is None:
        shape = [0] * r
        shape[kl[0]], shape[kl[1]] = ki, ko
        for d, k in zip(kl[2:], plan["window_sizes"]):
            shape[d] = k
        w = TensorType(x.dtype, tuple(shape))
    plan.update(types=[x, w], input_labels=il, kernel_labels=kl, output_labels=ol, feature_group_count=1,
                batch_group_count=1, dtype="", lhs_precision="", rhs_precision="")
    return plan


def _under(x: Node | None, want: Callable[[Node], bool], depth: int = 8) -> Node | None:
    """The first node ``want`` accepts down ``x``'s first operands (a chain of elementwise operators,
    conversions and reshapes: what a statistic goes through before it is broadcast back)."""
    while x is not None and depth:
        if want(x):
            return x
        x = x.operands[0] if x.operands else None
        depth -= 1
    return None


def _split_last(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """``shape`` with its last dimension split into two factors (channels into groups), if it has any."""
    if not shape:
        return None
    c = shape[-1]
    f = next((d for d in range(2, c) if c % d == 0), None)
    return None if f is None else (*shape[:-1], f, c // f)


def _grouped(x: Node | None) -> bool:
    """``x`` broadcasts a statistic of a group-split reshape over the group's channels (its last dimension)."""
    red = _under(x, lambda n: n.op == "reduce") if x is not None and x.op == "broadcast" else None
    return red is not None and _splits_last(red.operands[0])


def _splits_last(x: Node | None) -> bool:
    """``x`` is a reshape that split its operand's last dimension in two."""
    if x is None or x.op != "reshape" or not x.operands:
        return False
    y = x.operands[0].shape
    return bool(y) and x.shape[:-2] == y[:-1] and len(x.shape) == len(y) + 1


def _family(d: dt.DType) -> str:
    return "float" if d.is_float else "int" if d.is_int else "pred"


def _convert_type(ctor: str, x: Node | None, src: dt.DType, rng: np.random.Generator) -> dt.DType:
    """The target type of a conversion, biased toward what the guards of conversion chains are
    about: conversions that lose something (f32 -> bf16, s32 -> s8), ones that keep every value but
    change family (s32 -> f64), and, as the second of a chain, a round trip back to the first type
    or a type the first one does not fit in (s32 -> f64 -> s8 saturates where s32 -> s8 wraps)."""
    def pick(pool: Sequence[dt.DType]) -> dt.DType:
        return pool[int(rng.integers(len(pool)))]

    def lossy(a: dt.DType) -> list[dt.DType]:
        out = [d for d in CONVERT_TYPES if not terms.lossless(a, d)]
        return [d for d in out if _family(d) == _family(a)] or out

    first = x.operands[0].type if x is not None and x.op == terms.BY_CTOR[ctor].op else None
    if isinstance(first, TensorType) and rng.random() < 0.5:
        return pick((rng.random() < 0.5 and lossy(first.dtype)) or [first.dtype])
    u = rng.random()
    if u < 0.15:
        return src
    if u < 0.5 and lossy(src):
        return pick(lossy(src))
    crossing = [d for d in CONVERT_TYPES if _family(d) != _family(src) and terms.lossless(src, d)]
    if u < 0.7 and crossing:
        return pick(crossing)
    return pick(CONVERT_TYPES)


def _slice_plan(x: Node | None, xt: TensorType, rng: np.random.Generator) -> Plan:
    r = xt.rank
    full = (tuple([0] * r), xt.shape, tuple([1] * r))
    u = rng.random()
    if x is not None and x.op == "pad" and r:
        pad = x.attrs["padding"]
        inner = x.operands[0].shape
        if u < 0.35:
            return dict(zip(("starts", "limits", "strides"),
                            (tuple(p.lo for p in pad), tuple(p.lo + n for p, n in zip(pad, inner)), (1,) * r)))
        if u < 0.7:
            d = int(rng.integers(r))
            starts, limits, strides = list(full[0]), list(full[1]), list(full[2])
            lo = max(pad[d].lo, 0)
            hi = min(pad[d].lo + inner[d], xt.shape[d])
            if hi > lo:
                a = int(rng.integers(lo, hi))
                b = int(rng.integers(a + 1, hi + 1))
                starts[d], limits[d] = a, b
                return {"starts": tuple(starts), "limits": tuple(limits), "strides": tuple(strides)}
    if x is not None and x.op == "concatenate" and r and u < 0.7:
        d = x.attrs["dimension"]
        first = x.operands[0].shape[d]
        starts, limits = list(full[0]), list(full[1])
        if rng.random() < 0.5 and first:
            a = int(rng.integers(0, first))
            starts[d], limits[d] = a, int(rng.integers(a + 1, first + 1))
        elif xt.shape[d] > first:
            a = int(rng.integers(first, xt.shape[d]))
            starts[d], limits[d] = a, int(rng.integers(a + 1, xt.shape[d] + 1))
        return {"starts": tuple(starts), "limits": tuple(limits), "strides": (1,) * r}
    if u < 0.25:
        return dict(zip(("starts", "limits", "strides"), full))
    starts, limits, strides = [], [], []
    for n in xt.shape:
        a = int(rng.integers(0, n)) if n else 0
        b = int(rng.integers(a + 1, n + 1)) if n else 0
        starts.append(a)
        limits.append(b)
        strides.append(int(rng.integers(1, 3)))
    return {"starts": tuple(starts), "limits": tuple(limits), "strides": tuple(strides)}


def _dot_plan(ops: list[Node | None], first: TensorType, env: _Env) -> Plan:
    """Dimension numbers (and, when one operand is free, its type) for a valid dot."""
    rng = env.rng
    lhs = ops[0].type if ops[0] is not None else None
    rhs = ops[1].type if ops[1] is not None else None
    if lhs is None and rhs is None:
        lhs = first
    if lhs is not None and rhs is not None:
        pairs = [(i, j) for i in range(lhs.rank) for j in range(rhs.rank) if lhs.shape[i] == rhs.shape[j]]
        rng.shuffle(pairs)
        used_l, used_r, chosen = set(), set(), []
        for i, j in pairs:
            if i not in used_l and j not in used_r and rng.random() < 0.6:
                chosen.append((i, j))
                used_l.add(i)
                used_r.add(j)
        nb = int(rng.integers(0, len(chosen) + 1)) if chosen else 0
        batch, contract = chosen[:nb], chosen[nb:]
        return {"types": [lhs, rhs], "lhs_contracting": tuple(i for i, _ in contract),
                "rhs_contracting": tuple(j for _, j in contract), "lhs_batch": tuple(i for i, _ in batch),
                "rhs_batch": tuple(j for _, j in batch), "dtype": "", "lhs_precision": "", "rhs_precision": ""}
    known = lhs if lhs is not None else rhs
    assert known is not None
    dims = list(range(known.rank))
    rng.shuffle(dims)
    nb = int(rng.integers(0, len(dims) + 1))
    nc = int(rng.integers(0, len(dims) - nb + 1))
    kb, kc = dims[:nb], dims[nb:nb + nc]
    free = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 3)))]
    other_shape = [known.shape[d] for d in kb] + [known.shape[d] for d in kc] + free
    order = list(range(len(other_shape)))
    if rng.random() < 0.5:
        rng.shuffle(order)
    pos = {k: order.index(k) for k in range(len(other_shape))}
    other_dtype = known.dtype
    if known.dtype.is_float and rng.random() < 0.3:  # mixed precision: f16 x bf16 defaults to the lhs type
        other_dtype = MIXED_FLOATS[int(rng.integers(len(MIXED_FLOATS)))]
    other = TensorType(other_dtype, tuple(other_shape[order[i]] for i in range(len(order))))
    ob = tuple(pos[k] for k in range(nb))
    oc = tuple(pos[nb + k] for k in range(nc))
    if lhs is not None:
        return {"types": [lhs, other], "lhs_contracting": tuple(kc), "rhs_contracting": oc, "lhs_batch": tuple(kb),
                "rhs_batch": ob, "dtype": "", "lhs_precision": "", "rhs_precision": ""}
    return {"types": [other, rhs], "lhs_contracting": oc, "rhs_contracting": tuple(kc), "lhs_batch": ob,
            "rhs_batch": tuple(kb), "dtype": "", "lhs_precision": "", "rhs_precision": ""}


def _gen(p: SExp, env: _Env, want: TensorType | None) -> Node:
    """Instantiate a T-sorted pattern (or variable)."""
    if _is_var(p):
        name = p.text  # type: ignore[union-attr]
        if name in env.t_vars:
            return env.t_vars[name]
        if name in env.bindings:
            node = _gen(env.bindings[name], env, want)
        else:
            t = want or _random_type(env)
            if want is None and name in env.var_ranks:  # a guard asks for this rank (a group norm's NHWC)
                t = TensorType(t.dtype, next(s for s in SHAPES if len(s) == env.var_ranks[name]))
            node = _leaf(env, t, env.var_splats.get(name))
        env.t_vars[name] = node
        return node
    if not _is_pattern(p):
        raise Untestable(f"cannot instantiate {p}")
    assert isinstance(p, SList)
    ctor = p.head
    assert ctor is not None
    if ctor in ("Opaque", "Constant", "Parameter"):
        raise Untestable(f"patterns over {ctor} are not generated")
    sorts = terms.ctor_sorts(ctor)
    args = list(p.items[1:])
    if len(args) != len(sorts):
        raise Untestable(f"{ctor} takes {len(sorts)} arguments")
    term = terms.BY_CTOR[ctor]
    t_pos = [i for i, s in enumerate(sorts) if s == terms.T]
    l_pos = [i for i, s in enumerate(sorts) if s == terms.TLIST]
    # Operands the pattern determines (sub-patterns, bound variables) first.
    ops: list[Node | None] = [None] * len(t_pos)
    for k, i in enumerate(t_pos):
        a = args[i]
        if _is_pattern(a) or (_is_var(a) and (a.text in env.t_vars or a.text in env.bindings)):  # type: ignore
            ops[k] = _gen(a, env, None)
    items: list[Node] | None = None
    if l_pos:
        items = _gen_list(args[l_pos[0]], env, next((o.type for o in ops if o is not None), None))
    if ctor == "Divide" and ops[0] is not None and ops[1] is None and _is_var(args[1]):
        # a mean: the reduction's element count is what a guard compares the divisor with
        red = _under(ops[0], lambda n: n.op == "reduce")
        if red is not None:
            count = math.prod(red.operands[0].shape[d] for d in red.attrs["dimensions"])
            env.var_splats.setdefault(args[1].text, float(count))  # type: ignore[union-attr]
    plan_ops = ops if ctor != "Concatenate" else ([items[0]] if items else [None])
    plan = _plan(ctor, list(plan_ops), want, env)
    types = plan.get("types", [])
    for k, i in enumerate(t_pos):
        if ops[k] is None:
            t = types[k] if k < len(types) and isinstance(types[k], TensorType) else (want or _random_type(env))
            ops[k] = _gen(args[i], env, t)
    slots: list[Any] = []
    slot_names = term.slot_names
    slot_sorts = [s for s in sorts if s not in (terms.T, terms.TLIST)]
    slot_args = [a for a, s in zip(args, sorts) if s not in (terms.T, terms.TLIST)]
    for name, sort, a in zip(slot_names, slot_sorts, slot_args):
        ok, value = _literal(a, sort)
        if not ok:
            if _is_var(a) and a.text in env.attr_vars:  # type: ignore[union-attr]
                value = env.attr_vars[a.text]  # type: ignore[union-attr]
            elif name in plan:
                value = plan[name]
            else:
                raise Untestable(f"no value for {ctor} {name}")
            if _is_var(a):
                env.attr_vars[a.text] = value  # type: ignore[union-attr]
        slots.append(value)
    operands: list[Node] = [o for o in ops if o is not None]
    if items is not None:
        operands += items
    if ctor == "Fill":
        v, d, shape = slots
        try:
            value = splat_array(str(v), dt.by_name(d), shape)
        except (KeyError, ValueError):
            raise Reject() from None
        t = TensorType(dt.by_name(d), tuple(shape))
        node = Node("constant", (), {"value": value, "type": t}, t)
        env.nodes.append(node)
        return node
    try:
        attrs = term.decode(tuple(slots))
        t = infer_type(term.op, operands, attrs)
    except (NxsatError, KeyError, ValueError, TypeError, IndexError):
        raise Reject() from None
    node = Node(term.op, operands, attrs, t)
    env.nodes.append(node)
    return node


def _gen_list(p: SExp, env: _Env, hint: TensorType | None) -> list[Node]:
    if _is_var(p):
        name = p.text  # type: ignore[union-attr]
        if name in env.list_vars:
            return env.list_vars[name]
        if name in env.bindings:
            out = _gen_list(env.bindings[name], env, hint)
        else:
            t = hint or _random_type(env)
            out = [_leaf(env, t) for _ in range(int(env.rng.integers(1, 4)))]
        env.list_vars[name] = out
        return out
    if isinstance(p, SList) and p.head == "TNil":
        return []
    if isinstance(p, SList) and p.head == "TCons" and len(p.items) == 3:
        head = _gen(p.items[1], env, hint)
        hint = hint or (head.type if isinstance(head.type, TensorType) else None)
        if hint is not None and env.rng.random() < 0.5 and hint.rank:  # vary one dimension: concat-friendly
            d = int(env.rng.integers(hint.rank))
            shape = list(hint.shape)
            shape[d] = int(env.rng.integers(1, 4))
            hint = TensorType(hint.dtype, tuple(shape))
        return [head, *_gen_list(p.items[2], env, hint)]
    raise Untestable(f"cannot instantiate the list {p}")


def rule_patterns(rule: Rule) -> tuple[list[SExp], dict[str, SExp]]:
    """The left-hand side patterns of a rule and the variables its facts bind to patterns."""
    bindings: dict[str, SExp] = {}
    for f in rule.facts:
        if isinstance(f, SList) and f.head == "=" and len(f.items) == 3:
            a, b = f.items[1], f.items[2]
            if _is_var(a) and _is_pattern(b):
                bindings.setdefault(a.text, b)  # type: ignore[union-attr]
            elif _is_var(b) and _is_pattern(a):
                bindings.setdefault(b.text, a)  # type: ignore[union-attr]
    roots: list[SExp] = []
    if rule.lhs is not None:
        roots.append(rule.lhs)
    else:
        used: set[str] = set()
        for pat in bindings.values():
            used |= _vars(pat)
        roots += [pat for var, pat in bindings.items() if var not in used]
        roots += [f for f in rule.facts if _is_pattern(f)]
    return roots, bindings


def _guard_splats(rule: Rule) -> dict[str, float]:
    """The splat values the rule's guards ask of its variables (``(= (splat z) "-inf")``); a variable whose
    splat a guard only reads (``(= ev (splat e))``: an epsilon) is mostly the splat 0.5."""
    out: dict[str, float] = {}
    for f in rule.facts:
        if isinstance(f, SList) and f.head == "=" and len(f.items) == 3:
            a, b = f.items[1], f.items[2]
            if _is_var(a) and isinstance(b, SList) and b.head == "splat" and len(b.items) == 2 and _is_var(b.items[1]):
                out.setdefault(b.items[1].text, 0.5)  # type: ignore[union-attr]
            if isinstance(a, SList) and a.head == "splat" and len(a.items) == 2 and _is_var(a.items[1]) \
                    and isinstance(b, Atom) and b.kind == "str":
                try:
                    out[a.items[1].text] = float(str(b.value))  # type: ignore[union-attr]
                except ValueError:
                    continue
    return out


def _guard_ranks(rule: Rule) -> dict[str, int]:
    """The ranks the rule's guards ask of its variables: ``(= s (shape x))`` with ``(= 4 (vec-length s))``."""
    shape_of: dict[str, str] = {}
    rank_of: dict[str, int] = {}
    for f in rule.facts:
        if not (isinstance(f, SList) and f.head == "=" and len(f.items) == 3):
            continue
        for a, b in ((f.items[1], f.items[2]), (f.items[2], f.items[1])):
            if _is_var(a) and isinstance(b, SList) and b.head == "shape" and len(b.items) == 2 and _is_var(b.items[1]):
                shape_of[a.text] = b.items[1].text  # type: ignore[union-attr]
            if isinstance(a, Atom) and a.kind == "int" and isinstance(b, SList) and b.head == "vec-length" \
                    and len(b.items) == 2 and _is_var(b.items[1]):
                rank_of[b.items[1].text] = int(a.text)  # type: ignore[union-attr]
    return {x: rank_of[s] for s, x in shape_of.items() if s in rank_of and rank_of[s] in {len(s) for s in SHAPES}}


def _among(v: float, pool: Sequence[Any]) -> bool:
    return any(v == w or (math.isnan(v) and math.isnan(float(w))) for w in pool)


def _vars(x: SExp) -> set[str]:
    if _is_var(x):
        return {x.text}  # type: ignore[union-attr]
    if isinstance(x, SList):
        out: set[str] = set()
        for i in x.items[1:]:
            out |= _vars(i)
        return out
    return set()


def instantiate(rule: Rule, rng: np.random.Generator, pattern: tuple[list[SExp], dict[str, SExp]] | None = None,
                ) -> tuple[list[Node], list[Node], list[Node]]:
    """One random instance: (roots, parameters, nodes). Reject when ill-typed, Untestable when impossible."""
    roots, bindings = pattern or rule_patterns(rule)
    if not roots:
        raise Untestable("the rule has no operator pattern to instantiate")
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    env = _Env(rng, TensorType(DTYPES[int(rng.integers(len(DTYPES)))], shape), [], [], bindings=dict(bindings),
               splats=SPLATS + tuple(v for v in _guard_splats(rule).values() if not _among(v, SPLATS)),
               var_splats=_guard_splats(rule), var_ranks=_guard_ranks(rule))
    out = [_gen(r, env, None) for r in roots]
    return out, env.params, env.nodes


# --- checking ------------------------------------------------------------------------------------------


__all__ = ["Reject", "Untestable", "instantiate", "random_array", "rule_patterns"]

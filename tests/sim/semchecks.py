"""Semantic checks of the device model: every instruction, activation function and ALU operation run
through the public API (text form -> ``sim.assemble`` -> ``sim.load`` -> ``Model.run``) and compared
with references written here from docs/device-program.md and docs/device-model.md.

The references never call the executor's helpers (``nxsat.sim.numerics``, ``nxsat.dtypes.cast``):
functions are evaluated with Python's ``math`` in float64 (stable formulations: gelu through erfc,
sigmoid through exp of -|x|) and rounded once to fp32 by numpy's IEEE conversion; fp32 arithmetic is
float64 arithmetic rounded once (exact for + - * /: double rounding is innocuous at 53 bits);
integer arithmetic is done on Python integers; storage roundings are those of ``refnum``.

Each ``check_*`` function raises AssertionError naming what differs. test_semantics.py runs them in
every dtype and engine; test_mutations.py plants bugs in the executor and shows the checks fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from refnum import FLOATS, NP, assert_ulps, cast, f32, f32_of, same_bits, tf32, to_int, widen, wrap

from nxsat import sim
from nxsat.diagnostics import Warnings

P, F = 32, 32  # the elementwise tests' tile: 1024 values
ALU_OPS = ("add", "sub", "rsub", "mul", "div", "rdiv", "max", "min", "pow", "abs_max", "eq", "ne", "lt", "le",
           "gt", "ge", "and", "or", "xor", "shl", "shr")
BITWISE = ("and", "or", "xor", "shl", "shr")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
ACTIVATIONS = ("identity", "exp", "log", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "softplus",
               "sqrt", "rsqrt", "reciprocal", "square", "abs", "sign", "sin", "cos", "erf")
DVE_FUNCTIONS = ("identity", "relu", "abs", "square", "sign", "reciprocal")
_NAME_OF = {np.dtype(v): k for k, v in NP.items()} | {np.dtype(np.bool_): "pred"}


def dtype_name(a: np.ndarray) -> str:
    return _NAME_OF[np.asarray(a).dtype]


def typed(values: object, name: str) -> np.ndarray:
    """Test input values stored in type ``name`` (floats rounded by numpy/ml_dtypes: any valid value will do)."""
    if name in FLOATS:
        v = np.asarray(values, np.float64)
        if name == "f8e4m3fn":
            v = np.clip(v, -448.0, 448.0)  # this type has no infinity: keep overflow from making NaNs
        with np.errstate(over="ignore", invalid="ignore"):
            return v.astype(np.float32).astype(NP[name])
    return np.asarray(values, dtype=object).astype(np.int64).astype(NP[name])


def imm(v: float) -> str:
    """An immediate in the text form: fp32 values print exactly."""
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return repr(float(np.float32(v)))


# --- running a program ----------------------------------------------------------------------------------

def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def run(body: Sequence[str], ins: dict[str, np.ndarray], outs: dict[str, tuple[str, Sequence[int]]], *,
        tiles: Iterable[str] = (), hbm_ins: Iterable[str] = (), hbm_outs: Iterable[str] = (),
        target: str = "trn1", header: Iterable[str] = (), shard: dict[str, int] | None = None, ranks: int = 1,
        warnings: Warnings | None = None, consts: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Build and run one program; returns the outputs by name.

    Every input NAME is an HBM input ``NAME_in``, copied by DMA into an SBUF tile NAME of the same shape
    (unless in ``hbm_ins``); every output NAME is an SBUF tile NAME stored by DMA to ``NAME_out`` (unless
    in ``hbm_outs``: then the body writes ``NAME_out`` itself). ``body`` runs one instruction after
    another (one semaphore chains them); ``tiles`` declares anything else. With ``shard``, inputs and
    outputs named there are split over ``ranks`` along that axis (shapes here are the host's; each
    rank's tensors and tiles hold its part).
    """
    shard = shard or {}
    hbm_ins, hbm_outs = set(hbm_ins), set(hbm_outs)
    lines = [f".isa {sim.ISA_VERSION[0]}.{sim.ISA_VERSION[1]}", f".target {target}", *header]
    loads, stores = [], []

    def part(name: str, shape: Sequence[int]) -> list[int]:
        s = list(shape)
        if name in shard:
            s[shard[name]] //= ranks
        return s

    for name, a in ins.items():
        sh = f"  shard={shard[name]}" if name in shard else ""
        lines.append(f"input   {name}_in: {dtype_name(a)}{_shape(part(name, a.shape))}{sh}")
        if name not in hbm_ins:
            lines.append(f"sbuf    {name}: {dtype_name(a)}{_shape(part(name, a.shape))}")
            loads.append(f"q0    dma  {name}, {name}_in, signal=ld")
    for name in consts or {}:
        a = consts[name]
        lines.append(f"const   {name}: {dtype_name(a)}{_shape(a.shape)}")
    for name, (dt, shape) in outs.items():
        sh = f"  shard={shard[name]}" if name in shard else ""
        lines.append(f"output  {name}_out: {dt}{_shape(part(name, shape))}{sh}")
        if name not in hbm_outs:
            lines.append(f"sbuf    {name}: {dt}{_shape(part(name, shape))}")
            stores.append(f"q1    dma  {name}_out, {name}")
    lines += list(tiles)
    lines += ["sem     ld", "sem     c"]
    lines += loads
    n = 0
    for i, instr in enumerate(body):
        waits = []
        if i == 0 and loads:
            waits.append(f"wait=ld>={len(loads)}")
        if i:
            waits.append(f"wait=c>={i}")
        lines.append(", ".join([instr, *waits, "signal=c"]))
        n = i + 1
    first_wait = f", wait=c>={n}" if n else (f", wait=ld>={len(loads)}" if loads else "")
    lines += [s + (first_wait if j == 0 else "") for j, s in enumerate(stores)]
    text = "\n".join(lines) + "\n"
    model = sim.load(sim.assemble(text, "semantics.nxs", consts))
    outputs = model.run({f"{k}_in": v for k, v in ins.items()}, warnings=warnings)
    return dict(zip(outs, outputs))


class Failures:
    """Collects the failures of one check so that one run reports every wrong case."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def check(self, what: str, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)``; an AssertionError is recorded under ``what``."""
        try:
            fn(*args)
        except AssertionError as exc:
            self.items.append(f"{what}: {exc}"[:1500])

    def raise_any(self) -> None:
        if self.items:
            raise AssertionError(f"{len(self.items)} case(s) wrong:\n" + "\n".join(self.items))


def compare(actual: np.ndarray, ref: np.ndarray, name: str, max_ulps: int = 0, max_inexact: float = 1.0,
            what: str = "", inputs: np.ndarray | None = None) -> None:
    """Float outputs within ``max_ulps`` of the reference (0: bit for bit, except the sign of zero);
    integer outputs within ``max_ulps`` (0: exactly)."""
    a, r = np.asarray(actual), np.asarray(ref)
    assert a.dtype == r.dtype and a.shape == r.shape, (what, a.dtype, r.dtype, a.shape, r.shape)
    if name in FLOATS:
        assert_ulps(a, r, max_ulps, max_inexact, what, inputs)
        return
    d = np.abs(a.astype(np.int64) - r.astype(np.int64))
    bad = d > max_ulps
    if bad.any():
        at = np.flatnonzero(bad.reshape(-1))[:6]
        ins = "" if inputs is None else f" inputs {np.asarray(inputs).reshape(-1)[at].tolist()}"
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values wrong: got "
                             f"{a.reshape(-1)[at].tolist()} want {r.reshape(-1)[at].tolist()}{ins}")
    assert float((d != 0).mean()) <= max_inexact, f"{what}: {(d != 0).mean():.1%} of values not exact"


# --- activation functions -------------------------------------------------------------------------------

def _exp(t: float) -> float:
    try:
        return math.exp(t)
    except OverflowError:
        return math.inf


def _sigmoid(t: float) -> float:
    if t >= 0:
        return 1.0 / (1.0 + _exp(-t))
    e = _exp(t)
    return e / (1.0 + e)


def _log(t: float) -> float:
    if t > 0:
        return math.log(t)
    return -math.inf if t == 0 else math.nan


def _sqrt(t: float) -> float:
    return math.sqrt(t) if t >= 0 else math.nan  # sqrt(-0) = -0


def _rsqrt(t: float) -> float:
    if t < 0:
        return math.nan
    if t == 0:
        return math.copysign(math.inf, t)
    return 1.0 / math.sqrt(t)


def _recip(t: float) -> float:
    return math.copysign(math.inf, t) if t == 0 else 1.0 / t


def _gelu_tanh(t: float) -> float:
    # 0.5 t (1 + tanh(y)) = t * sigmoid(2y): no cancellation for negative t
    return t * _sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (t + 0.044715 * t**3))


def _periodic(fn: Callable[[float], float]) -> Callable[[float], float]:
    return lambda t: fn(t) if math.isfinite(t) else math.nan


REF_FUNCS: dict[str, Callable[[float], float]] = {
    "identity": lambda t: t,
    "exp": _exp,
    "log": _log,
    "tanh": math.tanh,
    "sigmoid": _sigmoid,
    "relu": lambda t: t if t > 0 else 0.0,
    "gelu": lambda t: 0.5 * t * math.erfc(-t / math.sqrt(2.0)),
    "gelu_tanh": _gelu_tanh,
    "silu": lambda t: t * _sigmoid(t),
    "softplus": lambda t: max(t, 0.0) + math.log1p(_exp(-abs(t))),
    "sqrt": _sqrt,
    "rsqrt": _rsqrt,
    "reciprocal": _recip,
    "square": lambda t: t * t,
    "abs": abs,
    "sign": lambda t: float((t > 0) - (t < 0)),
    "sin": _periodic(math.sin),
    "cos": _periodic(math.cos),
    "erf": math.erf,
}


def ref_function(func: str, t: np.ndarray) -> np.ndarray:
    """func of fp32 values t, in float64 (Python's math), rounded once to fp32."""
    fn = REF_FUNCS[func]
    flat = [math.nan if math.isnan(v) else fn(v) for v in np.asarray(t, np.float64).reshape(-1).tolist()]
    return f32(np.array(flat, np.float64).reshape(np.shape(t)))


# Where each function is checked to be correctly rounded. gelu and gelu_tanh of t below about -4.4
# are not (see test_gelu_tail_is_correctly_rounded); relu of NaN and gelu/silu of infinities are not
# specified by the documents, so those inputs are left out.
DOMAIN = {"gelu": (-4.25, math.inf), "gelu_tanh": (-4.25, math.inf)}
NO_NAN = {"relu"}
NO_INF = {"gelu", "gelu_tanh", "silu"}
# A typical range of each function, for the accum check (finite results in every row).
NICE = {"identity": (-10, 10), "exp": (-20, 20), "log": (1, 100), "tanh": (-5, 5), "sigmoid": (-20, 20),
        "relu": (-10, 10), "gelu": (-2, 10), "gelu_tanh": (-2, 10), "silu": (-20, 20), "softplus": (-20, 20),
        "sqrt": (1, 100), "rsqrt": (1, 100), "reciprocal": (1, 100), "square": (-100, 100), "abs": (-10, 10),
        "sign": (-10, 10), "sin": (-10, 10), "cos": (-10, 10), "erf": (-4, 4)}
# The immediate scale and bias of the second variant (t stays inside DOMAIN).
SCALE_BIAS = {"gelu": (0.75, -0.25), "gelu_tanh": (0.75, -0.25)}


def activation_inputs(func: str, rng: np.random.Generator, n: int = P * F) -> np.ndarray:
    """Values covering a function's whole domain: a grid, magnitudes 1e-30..1e30 of both signs, values
    near where the function overflows or saturates, and the IEEE specials."""
    lo, hi = DOMAIN.get(func, (-math.inf, math.inf))
    specials = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 88.0, 88.75, 89.0, -87.0, -88.0, -103.0, -104.0, 1e-7,
                -1e-7, 1e-38, 1e-45, 3e38, -3e38, math.pi, -math.pi, 1e4, -1e4, 1e8, -1e8]
    if func not in NO_INF:
        specials += [math.inf, -math.inf]
    if func not in NO_NAN:
        specials += [math.nan]
    mags = np.logspace(-30, 30, 96)
    grid = np.linspace(-12, 12, 289)
    rand = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 3, n)
    v = np.concatenate([specials, mags, -mags, grid, rng.uniform(-5, 5, 160), rand])[:n]
    v = f32(v).astype(np.float64)
    keep = np.isnan(v) | ((v >= lo) & (v <= hi))
    v = np.where(keep, v, rng.uniform(max(lo, -50), min(hi, 50), n))
    return v


def check_activation(engine: str, src: str, dst: str, funcs: Sequence[str] = ACTIVATIONS, seed: int = 0,
                     max_inexact: float = 0.01) -> None:
    """dst = func(scale * src + bias) for each function: with scale 1 and bias 0, with immediates, and with
    per-partition [P, 1] scale and bias tiles and the accum output (fp32 sum of the fp32 results, before
    their rounding to dst's type). The reference rounds func's exact value once to fp32, then to dst:
    at most 1 ulp of dst apart and nearly always identical (the functions are correctly rounded)."""
    rng = np.random.default_rng(seed)
    ins: dict[str, np.ndarray] = {}
    outs: dict[str, tuple[str, Sequence[int]]] = {}
    body: list[str] = []
    scale_t = f32(rng.uniform(0.5, 1.25, (P, 1)))
    bias_t = f32(rng.uniform(-0.25, 0.25, (P, 1)))
    ins["sc"], ins["bi"] = typed(scale_t, "f32"), typed(bias_t, "f32")
    for k, func in enumerate(funcs):
        full = activation_inputs(func, rng)
        lo, hi = NICE[func]
        nice = rng.uniform(lo, hi, P * F)
        if src not in FLOATS:
            info = np.iinfo(NP[src])
            full = np.clip(np.nan_to_num(np.trunc(full)), max(info.min, -2**40), min(info.max, 2**40))
            nice = np.clip(np.round(nice), info.min, info.max)
        ins[f"x{k}"] = typed(full.reshape(P, F), src)
        ins[f"n{k}"] = typed(nice.reshape(P, F), src)
        s, b = SCALE_BIAS.get(func, (-0.75, 0.25))
        outs[f"y{k}"] = outs[f"z{k}"] = outs[f"w{k}"] = (dst, (P, F))
        outs[f"a{k}"] = ("f32", (P, 1))
        body += [f"{engine} activation y{k}, x{k}, func={func}",
                 f"{engine} activation z{k}, x{k}, func={func}, scale={imm(s)}, bias={imm(b)}",
                 f"{engine} activation w{k}, n{k}, func={func}, scale=sc, bias=bi, accum=a{k}"]
    got = run(body, ins, outs)
    fails = Failures()
    for k, func in enumerate(funcs):
        s, b = SCALE_BIAS.get(func, (-0.75, 0.25))
        x = f32_of(ins[f"x{k}"]).astype(np.float64)
        nx = f32_of(ins[f"n{k}"]).astype(np.float64)
        for name, xin, sc, bi in ((f"y{k}", x, 1.0, 0.0), (f"z{k}", x, s, b),
                                  (f"w{k}", nx, scale_t.astype(np.float64), bias_t.astype(np.float64))):
            t = f32(f32(xin * sc) + bi)  # two fp32 roundings: scale * src, then + bias
            y = ref_function(func, t)
            fails.check(f"{engine} {func} {src}->{dst} {name[0]}", compare, got[name], cast(y, dst), dst, 1,
                        max_inexact, "values", t)
            if name.startswith("w"):
                acc = got[f"a{k}"].astype(np.float64).reshape(-1)
                y64 = y.astype(np.float64)
                exact = y64.sum(axis=1)
                bound = F * 2.0**-23 * np.abs(y64).sum(axis=1) + 2.0**-149
                fails.check(f"{engine} {func} {src}->{dst} accum", _within, acc, exact, bound)
    fails.raise_any()


def _within(actual: np.ndarray, exact: np.ndarray, bound: np.ndarray) -> None:
    err = np.abs(actual - exact)
    bad = ~(err <= bound) & ~(np.isnan(actual) & np.isnan(exact)) & ~(actual == exact)
    assert not bad.any(), f"{int(bad.sum())} values outside the bound: got {actual[bad][:4]} want {exact[bad][:4]}"


def _between(actual: np.ndarray, lo: np.ndarray, hi: np.ndarray, name: str) -> None:
    """An fp32 result known to lie in [lo, hi], then rounded to ``name``: rounding is monotonic, so the
    stored value lies between the roundings of the two ends."""
    a = widen(actual)
    lo_r, hi_r = widen(cast(f32(lo), name)), widen(cast(f32(hi), name))
    bad = ~((a >= lo_r) & (a <= hi_r))
    assert not bad.any(), f"{int(bad.sum())} values outside [{lo_r[bad][:3]}, {hi_r[bad][:3]}]: got {a[bad][:3]}"


def check_activation_tail(func: str) -> None:
    """gelu and gelu_tanh of t in [-20, -4.25] against their exact values, as the documents promise."""
    rng = np.random.default_rng(5)
    t = f32(rng.uniform(-20, -4.25, (P, F)))
    got = run([f"act activation y, x, func={func}"], {"x": t}, {"y": ("f32", (P, F))})
    compare(got["y"], ref_function(func, t.astype(np.float64)), "f32", 1, 0.01, f"{func} tail", t)


# --- ALU operations -------------------------------------------------------------------------------------

def domain_of(engine: str, op: str, types: Sequence[str]) -> str:
    """docs/device-program.md: integer tiles compute in fp32 on VectorE and ScalarE, bitwise operators act
    on the bits, GpSimd computes exactly when every tile is s32 or u32; anything with a float tile is fp32."""
    if not all(t not in FLOATS for t in types):
        return "f32"
    if op in BITWISE:
        return "int"
    if engine == "pool" and all(t in ("s32", "u32") for t in types):
        return "int"
    return "f32"


def alu_f32(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One fp32 ALU step on fp32 values (given as float64): exact in float64, rounded once."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    with np.errstate(all="ignore"):
        r = {
            "add": lambda: a + b, "sub": lambda: a - b, "rsub": lambda: b - a, "mul": lambda: a * b,
            "div": lambda: a / b, "rdiv": lambda: b / a, "max": lambda: np.where(a >= b, a, b),
            "min": lambda: np.where(a <= b, a, b), "pow": lambda: np.power(a, b),
            "abs_max": lambda: np.where(np.abs(a) >= np.abs(b), np.abs(a), np.abs(b)),
            "eq": lambda: (a == b) * 1.0, "ne": lambda: (a != b) * 1.0, "lt": lambda: (a < b) * 1.0,
            "le": lambda: (a <= b) * 1.0, "gt": lambda: (a > b) * 1.0, "ge": lambda: (a >= b) * 1.0,
        }[op]()
    return f32(r)


def _idiv(a: int, b: int) -> int:
    b = b or 1  # integer division by zero divides by one (documented)
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _clamp_shift(b: int) -> int:
    return min(max(b, 0), 63)


INT_OPS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "rsub": lambda a, b: b - a, "mul": lambda a, b: a * b,
    "div": _idiv, "rdiv": lambda a, b: _idiv(b, a), "max": max, "min": min,
    "pow": lambda a, b: pow(a, max(b, 0), 1 << 64),  # a negative exponent counts as 0 (documented)
    "abs_max": lambda a, b: max(abs(a), abs(b)),
    "eq": lambda a, b: int(a == b), "ne": lambda a, b: int(a != b), "lt": lambda a, b: int(a < b),
    "le": lambda a, b: int(a <= b), "gt": lambda a, b: int(a > b), "ge": lambda a, b: int(a >= b),
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: a << _clamp_shift(b), "shr": lambda a, b: a >> _clamp_shift(b),
}


def alu_int(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One exact integer ALU step on Python integers (object arrays)."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
    fn = INT_OPS[op]
    return np.array([fn(int(x), int(y)) for x, y in zip(a.reshape(-1), b.reshape(-1))],
                    dtype=object).reshape(a.shape)


def ints_of(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.int64).astype(object)


def step(op: str, dom: str, v: tuple[str, np.ndarray], s: np.ndarray, wide: str = "s32") -> tuple[str, np.ndarray]:
    """One ALU step in domain ``dom`` on the carried value ``v`` = (its domain, values) and an operand
    already in ``dom``; a value crossing from fp32 to the integer domain is truncated and saturated
    to ``wide`` (the 32-bit type of the destination tile's signedness)."""
    vd, vals = v
    if dom == "int":
        if vd == "f32":
            vals = to_int(vals, wide).astype(np.int64).astype(object)
        return "int", alu_int(op, vals, s)
    if vd == "int":
        vals = f32(np.asarray(vals, dtype=np.float64))
    return "f32", alu_f32(op, vals, s)


def store(v: tuple[str, np.ndarray], dst: str) -> np.ndarray:
    """A result written to dst: exact integers wrap, fp32 values round (or truncate and saturate)."""
    dom, vals = v
    if dom == "int":
        return wrap(vals, dst)
    return cast(vals, dst)


def operand(a: np.ndarray, dom: str) -> np.ndarray:
    """A stored operand as a domain reads it: exact integers, or fp32 values (as float64)."""
    return ints_of(a) if dom == "int" else f32_of(a).astype(np.float64)


def float_operands(op: str, rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Operand values for a float ALU test: mixed magnitudes and signs, equal and opposite pairs, zeros,
    and (where IEEE defines the result) infinities and NaN."""
    n = math.prod(shape)
    a = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
    b = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
    if op == "pow":
        a = np.abs(a)
        b = np.where(rng.random(n) < 0.5, rng.integers(-4, 5, n), rng.uniform(-4, 4, n))
        neg = rng.random(n) < 0.2
        a = np.where(neg, -a, a)
        b = np.where(neg, np.round(b), b)
    idx = rng.permutation(n)
    eq, opp, zero = idx[: n // 8], idx[n // 8: n // 8 + n // 16], idx[n // 8 + n // 16: n // 8 + n // 16 + 8]
    b[eq] = a[eq]
    b[opp] = -a[opp]
    a[zero[:4]], b[zero[:4]] = 0.0, -0.0
    a[zero[4:]], b[zero[4:]] = -0.0, 0.0
    if op not in ("max", "min", "abs_max", "pow"):
        sp = idx[-12:]
        a[sp] = [math.inf, -math.inf, math.nan, 1.0, math.inf, 0.0, -math.inf, 2.0, math.nan, 3e38, -3e38, 1e-45]
        b[sp] = [1.0, 2.0, 1.0, math.nan, math.inf, math.inf, -math.inf, -math.inf, math.nan, 3e38, 3e38, 1e-45]
    return a.reshape(shape), b.reshape(shape)


def int_operands(op: str, name: str, dom: str, rng: np.random.Generator,
                 shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Operand values for an integer ALU test in type ``name``: small and large values (around 2^24,
    where fp32 stops being exact, and the type's limits), equal pairs; divisors non-zero and exponents
    non-negative in the fp32 domain (the integer rules for those apply to the exact domain)."""
    n = math.prod(shape)
    info = np.iinfo(NP[name])
    lo, hi = int(info.min), int(info.max)

    def draw() -> np.ndarray:
        small = rng.integers(max(lo, -60), min(hi, 60) + 1, n)
        big = rng.integers(lo, hi, n, endpoint=True)
        out = np.where(rng.random(n) < 0.5, small, big).astype(object)
        edges = [e for e in (0, 1, lo, hi, 2**24, 2**24 + 1, 2**24 + 3, -(2**24) - 1, 2**31 - 1) if lo <= e <= hi]
        out[: len(edges)] = edges
        return out

    a, b = draw(), draw()
    idx = rng.permutation(n)
    b[idx[: n // 8]] = a[idx[: n // 8]]
    if dom == "f32" and hi >= 2**24 + 1:  # pairs fp32 cannot tell apart
        a[idx[-4:]] = 2**24 + 1
        b[idx[-4:]] = 2**24
    if op in ("shl", "shr"):
        b = rng.integers(-3, 71, n).astype(object)
    if op == "pow":
        a = rng.integers(max(lo, -12), min(hi, 12) + 1, n).astype(object)
        b = rng.integers(0 if dom == "f32" else -3, 12, n).astype(object)
        b = np.array([min(max(int(x), lo), hi) for x in b], dtype=object)
    if dom == "f32" and op in ("div", "rdiv"):
        a = np.array([x if x != 0 else 1 for x in a], dtype=object)
        b = np.array([x if x != 0 else 1 for x in b], dtype=object)
    return a.reshape(shape), b.reshape(shape)


def ops_for(types: Sequence[str], engine: str) -> list[str]:
    """The ALU operations an engine accepts on these tiles (bitwise: integer tiles, not ScalarE)."""
    ints = all(t not in FLOATS for t in types)
    return [op for op in ALU_OPS if op not in BITWISE or (ints and engine != "act")]


def check_tensor_tensor(engine: str, a_dt: str, b_dt: str, dst: str, ops: Sequence[str] | None = None,
                        seed: int = 1) -> None:
    """dst = a op b for each operation, against the reference of its compute domain."""
    rng = np.random.default_rng(seed)
    ops = list(ops or ops_for((a_dt, b_dt, dst), engine))
    ins: dict[str, np.ndarray] = {}
    body, outs = [], {}
    doms = {}
    for k, op in enumerate(ops):
        dom = domain_of(engine, op, (a_dt, b_dt, dst))
        doms[op] = dom
        if a_dt in FLOATS or b_dt in FLOATS:
            a, b = float_operands(op, rng, (P, F))
        else:
            a, _ = int_operands(op, a_dt, dom, rng, (P, F))
            _, b = int_operands(op, b_dt, dom, rng, (P, F))
        ins[f"a{k}"], ins[f"b{k}"] = _to_type(a, a_dt), _to_type(b, b_dt)
        outs[f"y{k}"] = (dst, (P, F))
        body.append(f"{engine} tensor_tensor y{k}, a{k}, b{k}, op={op}")
    got = run(body, ins, outs)
    fails = Failures()
    for k, op in enumerate(ops):
        dom = doms[op]
        r = store(step(op, dom, (dom, operand(ins[f"a{k}"], dom)), operand(ins[f"b{k}"], dom)), dst)
        # every fp32 ALU step is exact or correctly rounded (pow too: evaluated in fp64, rounded once)
        fails.check(f"{engine} tensor_tensor {op} {a_dt},{b_dt}->{dst} ({dom})", compare, got[f"y{k}"], r, dst,
                    0, 0.0, "values")
    fails.raise_any()


def _to_type(values: np.ndarray, name: str) -> np.ndarray:
    if name in FLOATS:
        return typed(values, name)
    info = np.iinfo(NP[name])
    if np.asarray(values).dtype.kind == "f":
        values = np.clip(np.nan_to_num(np.trunc(values)), info.min, info.max)
    return typed(np.array([min(max(int(v), int(info.min)), int(info.max)) for v in np.asarray(values).reshape(-1)],
                          dtype=object).reshape(np.shape(values)), name)


# Immediates of tensor_scalar's chains: (op0 before op, c0) and op's own immediate.
def _imms(op: str, ints: bool, dom: str) -> tuple[float, float]:
    if ints:
        c1 = {"div": 3, "rdiv": 3, "pow": 2, "shl": 3, "shr": 3, "and": 0x5A5A, "or": 0x5A5A, "xor": 0x5A5A}.get(op, 7)
        return 2, c1
    return 1.5, {"pow": 3.0}.get(op, -0.375)


def check_tensor_scalar(engine: str, src: str, dst: str, ops: Sequence[str] | None = None, scalar: str | None = None,
                        seed: int = 2) -> None:
    """dst = (src op0 scalar0) op1 scalar1 for each operation in three forms: op with a per-partition
    [P, 1] scalar tile; op as op1 after op0=add (immediates); op as op0 followed by op1=add of the tile.
    Each step computes in its own domain (fp32: rounded; integers: exact) and dst is written once."""
    rng = np.random.default_rng(seed)
    scalar = scalar or src
    ints = src not in FLOATS
    ops = list(ops or ops_for((src, dst), engine))
    ins: dict[str, np.ndarray] = {}
    body, outs = [], {}
    for k, op in enumerate(ops):
        dom = domain_of(engine, op, (src, dst, scalar))
        if ints:
            x, _ = int_operands(op, src, dom, rng, (P, F))
            if op in ("div", "rdiv") and domain_of(engine, "add", (src, dst)) == "f32":
                x = np.array([2 * (int(v) // 2) + 1 for v in x.reshape(-1)], dtype=object).reshape(x.shape)
        else:
            x, _ = float_operands(op, rng, (P, F))
        if scalar in FLOATS:
            _, s = float_operands(op, rng, (P, 1))
        else:
            _, s = int_operands(op, scalar, dom, rng, (P, 1))
            if op == "pow" and dom == "f32":
                s = np.abs(s) % 4
        if not ints and scalar in FLOATS:
            x[:, :4] = s  # elements equal to their partition's scalar
        ins[f"x{k}"], ins[f"s{k}"] = _to_type(x, src), _to_type(s, scalar)
        c0, c1 = _imms(op, ints, dom)
        outs[f"a{k}"] = outs[f"b{k}"] = outs[f"c{k}"] = (dst, (P, F))
        body += [f"{engine} tensor_scalar a{k}, x{k}, op0={op}, scalar0=s{k}",
                 f"{engine} tensor_scalar b{k}, x{k}, op0=add, scalar0={imm(c0)}, op1={op}, scalar1={imm(c1)}",
                 f"{engine} tensor_scalar c{k}, x{k}, op0={op}, scalar0={imm(c1)}, op1=add, scalar1=s{k}"]
    got = run(body, ins, outs)
    fails = Failures()
    for k, op in enumerate(ops):
        x, s = ins[f"x{k}"], ins[f"s{k}"]
        c0, c1 = _imms(op, ints, domain_of(engine, op, (src, dst)))

        def imm_in(c: float, dom: str) -> np.ndarray:
            return np.array(int(c), dtype=object) if dom == "int" else f32(c).astype(np.float64)

        d_a = domain_of(engine, op, (src, dst, scalar))
        ra = step(op, d_a, (d_a, operand(x, d_a)), operand(s, d_a))
        d0, d1 = domain_of(engine, "add", (src, dst)), domain_of(engine, op, (src, dst))
        wide = "u32" if dst.startswith("u") else "s32"
        rb = step(op, d1, step("add", d0, (d0, operand(x, d0)), imm_in(c0, d0)), imm_in(c1, d1), wide)
        d2 = domain_of(engine, "add", (src, dst, scalar))
        rc = step("add", d2, step(op, d1, (d1, operand(x, d1)), imm_in(c1, d1)), operand(s, d2))
        for name, r in (("a", ra), ("b", rb), ("c", rc)):
            fails.check(f"{engine} tensor_scalar {op} form {name} {src}->{dst}", compare, got[f"{name}{k}"],
                        store(r, dst), dst, 0, 0.0, "values")
    fails.raise_any()


# --- TensorE --------------------------------------------------------------------------------------------

def representable_ints(name: str, limit: int) -> np.ndarray:
    """The integers in [-limit, limit] that type ``name`` holds exactly."""
    v = np.arange(-limit, limit + 1)
    if name in FLOATS:
        back = widen(typed(v, name))
        return v[back == v]
    info = np.iinfo(NP[name])
    return v[(v >= info.min) & (v <= info.max)]


def check_matmul(dtype: str, precision: str = "fp32", k_tiles: int = 2, m: int = 96, n: int = 160,
                 target: str = "trn1", seed: int = 3) -> None:
    """An accumulation group of k_tiles matmuls (start ... stop), then a second group of one matmul on the
    same region (start=true discards the first), both evacuated; products exact, sums in fp32 (PSUM).

    Two data sets: integers whose every partial sum is exact in fp32, in any order (bit for bit:
    proves exact products, fp32 accumulation and, for tf32, the rounding of the operands to 10
    mantissa bits), and random values within the error bound of any fp32 summation order."""
    rng = np.random.default_rng(seed)
    k = 128 * k_tiles
    fails = Failures()
    limit = {"f32": 256, "bf16": 200, "f16": 200}.get(dtype, 64)
    for kind in ("exact", "random"):
        if kind == "exact":
            if precision == "tf32":  # 12 significant bits: tf32 keeps 11
                a = rng.integers(0, 4096, (k, m)).astype(np.float64)
                b = rng.integers(-8, 9, (k, n)).astype(np.float64)
            else:
                vals = representable_ints(dtype, limit)
                a, b = rng.choice(vals, (k, m)).astype(np.float64), rng.choice(vals, (k, n)).astype(np.float64)
        else:
            a, b = rng.standard_normal((k, m)) * 4, rng.standard_normal((k, n)) * 4
        ins = {"a": typed(a, dtype), "b": typed(b, dtype)}
        prec = ", precision=tf32" if precision == "tf32" else ""
        tiles = [f"sbuf    as: {dtype}[128, {k_tiles}, {m}]", f"sbuf    bs: {dtype}[128, {k_tiles}, {n}]",
                 f"psum    acc: f32[{m}, {n}]"]
        body = [f"q0 dma as, a_in.reshape({k_tiles}, 128, {m}).permute(1, 0, 2)",
                f"q0 dma bs, b_in.reshape({k_tiles}, 128, {n}).permute(1, 0, 2)"]
        for t in range(k_tiles):
            flags = (", start=true" if t == 0 else "") + (", stop=true" if t == k_tiles - 1 else "")
            body.append(f"pe matmul acc, as[:, {t}, :], bs[:, {t}, :]{flags}{prec}")
        body += ["dve tensor_copy y1, acc",
                 f"pe matmul acc, as[:, {k_tiles - 1}, :], bs[:, 0, :], start=true, stop=true{prec}",
                 "dve tensor_copy y2, acc"]
        got = run(body, ins, {"y1": ("f32", (m, n)), "y2": ("f32", (m, n))}, tiles=tiles, hbm_ins=("a", "b"),
                  target=target)
        av, bv = widen(ins["a"]), widen(ins["b"])
        if precision == "tf32":
            av, bv = tf32(av).astype(np.float64), tf32(bv).astype(np.float64)
        ref1 = av.T @ bv
        ref2 = av[-128:].T @ bv[:128]
        for name, ref, terms in (("y1", ref1, np.abs(av).T @ np.abs(bv)),
                                 ("y2", ref2, np.abs(av[-128:]).T @ np.abs(bv[:128]))):
            if kind == "exact":
                # the sign of a zero sum is not modeled: +0 == -0
                fails.check(f"matmul {dtype}/{precision} {name} exact", same_bits, got[name] + np.float32(0),
                            f32(ref) + np.float32(0))
            else:
                bound = (k + k_tiles) * 2.0**-24 * terms
                fails.check(f"matmul {dtype}/{precision} {name} random", _within, got[name].astype(np.float64),
                            ref, bound)
    fails.raise_any()


def check_matmul_double_row(dtype: str, target: str = "trn2", seed: int = 15) -> None:
    """perf=double_row (NeuronCore-v3 fp8): stationary [K, 2, M] and moving [K, 2, N] contract over the 2K
    (partition, row) pairs; an accumulation group of two such matmuls sums 4K products, exactly for
    integers (bit for bit) and within the fp32 summation bound for random values."""
    rng = np.random.default_rng(seed)
    m, n, k = 64, 96, 512
    fails = Failures()
    for kind in ("exact", "random"):
        if kind == "exact":
            vals = representable_ints(dtype, 64)
            a, b = rng.choice(vals, (k, m)).astype(np.float64), rng.choice(vals, (k, n)).astype(np.float64)
        else:
            a, b = rng.standard_normal((k, m)) * 4, rng.standard_normal((k, n)) * 4
        ins = {"a": typed(a, dtype), "b": typed(b, dtype)}
        tiles = [f"sbuf    as: {dtype}[128, 2, 2, {m}]", f"sbuf    bs: {dtype}[128, 2, 2, {n}]",
                 f"psum    acc: f32[{m}, {n}]"]
        body = [f"q0 dma as, a_in.reshape(2, 128, 2, {m}).permute(1, 0, 2, 3)",
                f"q0 dma bs, b_in.reshape(2, 128, 2, {n}).permute(1, 0, 2, 3)",
                "pe matmul acc, as[:, 0, :, :], bs[:, 0, :, :], start=true, perf=double_row",
                "pe matmul acc, as[:, 1, :, :], bs[:, 1, :, :], stop=true, perf=double_row",
                "dve tensor_copy y, acc"]
        got = run(body, ins, {"y": ("f32", (m, n))}, tiles=tiles, hbm_ins=("a", "b"), target=target,
                  header=(".lnc 1",))
        av, bv = widen(ins["a"]), widen(ins["b"])
        ref = av.T @ bv
        if kind == "exact":
            fails.check(f"matmul double_row {dtype} exact", same_bits, got["y"] + np.float32(0),
                        f32(ref) + np.float32(0))
        else:
            bound = (k + 2) * 2.0**-24 * (np.abs(av).T @ np.abs(bv))
            fails.check(f"matmul double_row {dtype} random", _within, got["y"].astype(np.float64), ref, bound)
    fails.raise_any()


def check_dma_transpose(dtype: str, seed: int = 16) -> None:
    """dma_transpose (NeuronCore-v3): dst[P, F] (SBUF) = src[F, P].T, bit-exact, from HBM and from SBUF."""
    rng = np.random.default_rng(seed)
    f, p = 48, 64
    x = random_bits(dtype, rng, (f, p))
    got = run(["q0 dma_transpose t1, x_in", "q1 dma s, x_in", "q2 dma_transpose t2, s"], {"x": x},
              {"t1": (dtype, (p, f)), "t2": (dtype, (p, f))}, hbm_ins=("x",), target="trn2", header=(".lnc 1",),
              tiles=[f"sbuf    s: {dtype}[{f}, {p}]"])
    fails = Failures()
    for k in ("t1", "t2"):
        fails.check(f"dma_transpose {dtype} {k}", _same_bytes, got[k], np.ascontiguousarray(x.T))
    fails.raise_any()


def check_transpose(src: str, dst: str, target: str = "trn1", seed: int = 4, finite: bool = False) -> None:
    """dst[F, P] (PSUM) = src[P, F].T. NeuronCore-v2 (trn1): a matmul against the identity in fp32, so
    dst[f, p] = sum over q of src[q, f] * (q == p): a NaN or infinity anywhere in source column f makes
    every other element of output row f NaN (0 x inf), the sign of a zero is not kept. NeuronCore-v3
    (trn2): a bit-exact transpose mode, the source's bits for a 16-bit result of its type, its value
    converted to fp32 otherwise."""
    rng = np.random.default_rng(seed)
    p, f = 64, 48
    x = _values(src, rng, (p, f))
    if finite:
        xv = widen(x)
        x = typed(np.where(np.isfinite(xv), xv, 1.0), src)
    header = (".lnc 1",) if target == "trn2" else ()
    got = run(["pe transpose tp, x", "dve tensor_copy y, tp"], {"x": x}, {"y": (dst, (f, p))},
              tiles=[f"psum    tp: {dst}[{f}, {p}]"], target=target, header=header)
    what = f"transpose {src}->{dst} on {target}"
    if target != "trn1":
        if src == dst:
            _same_bytes(got["y"], np.ascontiguousarray(x.T))
        else:
            same_bits(got["y"], cast(f32_of(x).T, dst), what)
        return
    v = f32_of(x).astype(np.float64).T  # [F, P]
    bad = ~np.isfinite(v)
    others_bad = bad.sum(axis=1, keepdims=True) - bad > 0  # a non-finite value elsewhere in the row
    ref = np.where(others_bad, np.nan, v)
    compare(got["y"], cast(f32(ref), dst), dst, 0, 0.0, what)


def _values(name: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values of every kind a type holds: mixed magnitudes, the extremes, zeros, specials (floats), and for
    integers the limits and values around 2^24."""
    n = math.prod(shape)
    if name in FLOATS:
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 9, n)
        special = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 65504, 65520, 448,
                   464, 57344, 61440, 3e38, -3e38, 1e-40, -1e-45, 2.0**31, -(2.0**31) - 512, 4.3e9, 255.9, 256, -0.9,
                   -1.5, 2.5, 16777217.0, -129.0]
        v[: len(special)] = special
        a = typed(v, name)
        payloads = {"f32": [0x7FC00001, 0xFFA00005], "bf16": [0x7FC1, 0xFF81], "f16": [0x7E01, 0xFC05],
                    "f8e4m3fn": [0x7F, 0xFF], "f8e5m2": [0x7E, 0xFD]}[name]  # NaNs with payloads and signs
        a.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.itemsize])[n - 2:] = payloads
        return a.reshape(shape)
    info = np.iinfo(NP[name])
    v = rng.integers(int(info.min), int(info.max), n, endpoint=True).astype(object)
    edges = [e for e in (0, 1, -1, int(info.min), int(info.max), 2**24, 2**24 + 1, -(2**24) - 1, 255, 256, -129)
             if info.min <= e <= info.max]
    v[: len(edges)] = edges
    small = rng.random(n) < 0.3
    v[small] = rng.integers(max(int(info.min), -300), min(int(info.max), 300), int(small.sum()))
    return typed(v, name).reshape(shape)


# --- VectorE / GpSimd -----------------------------------------------------------------------------------

REDUCE_AXES = ((), (1,), (2,), (3,), (1, 3), (2, 3), (1, 2))
RSHAPE = (16, 4, 6, 8)


def _reduce_inputs(op: str, name: str, rng: np.random.Generator, exact: bool) -> np.ndarray:
    n = math.prod(RSHAPE)
    if op in ("max", "min"):
        return _values(name, rng, RSHAPE) if not exact else _values(name, rng, RSHAPE)
    if op == "add":
        if exact:
            vals = representable_ints(name, 8)
            return typed(rng.choice(vals, n), name).reshape(RSHAPE)
        return typed(rng.standard_normal(n) * 10.0 ** rng.integers(-2, 3, n), name).reshape(RSHAPE)
    # mul: +-1, +-2, +-0.5 (exact products); unsigned types: 1 and some 2
    if name in FLOATS:
        vals = np.array([1.0, -1.0, 2.0, -2.0, 0.5, -0.5])
        return typed(rng.choice(vals, n, p=[0.35, 0.35, 0.075, 0.075, 0.075, 0.075]), name).reshape(RSHAPE)
    signed = name.startswith("s")
    vals = np.array([1, -1, 2, -2] if signed else [1, 1, 2, 1])
    return typed(rng.choice(vals, n, p=[0.45, 0.45, 0.05, 0.05]), name).reshape(RSHAPE)


def check_tensor_reduce(engine: str, src: str, dst: str, ops: Sequence[str] = ("add", "mul", "max", "min"),
                        seed: int = 6) -> None:
    """dst = reduction of src over each set of free axes: add and mul on values whose every partial result
    is exact in fp32 (any order; bit for bit), add on random values within the fp32 summation bound,
    max and min on every kind of value (NaN left out: its propagation is not specified)."""
    rng = np.random.default_rng(seed)
    ins: dict[str, np.ndarray] = {}
    outs: dict[str, tuple[str, Sequence[int]]] = {}
    body: list[str] = []
    cases = []
    for op in ops:
        for exact in (True, False) if op == "add" and src in FLOATS else (True,):
            x = _reduce_inputs(op, src, rng, exact)
            if src in FLOATS and op in ("max", "min"):
                xv = widen(x)
                x = typed(np.where(np.isnan(xv), 0.0, xv), src)
            key = f"x{len(cases)}"
            ins[key] = x
            for axes in REDUCE_AXES:
                kept = [s for i, s in enumerate(RSHAPE) if i not in (axes or (1, 2, 3))]
                if len(kept) == 1:
                    kept.append(1)
                out = f"y{len(outs)}"
                outs[out] = (dst, kept)
                ax = f", axes=({', '.join(map(str, axes))})" if axes else ""
                body.append(f"{engine} tensor_reduce {out}, {key}, op={op}{ax}")
                cases.append((op, exact, key, axes, out))
    got = run(body, ins, outs)
    fails = Failures()
    for op, exact, key, axes, out in cases:
        dom = domain_of(engine, op, (src, dst))
        ax = tuple(axes or (1, 2, 3))
        x = ins[key]
        shape = outs[out][1]
        what = f"{engine} tensor_reduce {op} axes={ax} {src}->{dst} ({dom}{'' if exact else ', random'})"
        if dom == "int":
            vals = ints_of(x)
            fn: Callable[..., int] = {"add": sum, "mul": math.prod, "max": max, "min": min}[op]
            rows = np.moveaxis(vals, ax, tuple(range(-len(ax), 0))).reshape(vals.shape[0], -1,
                                                                            math.prod(vals.shape[i] for i in ax))
            r = np.array([[fn(int(t) for t in row) for row in part] for part in rows], dtype=object)
            ref = wrap(r.reshape(shape), dst)
            fails.check(what, compare, got[out], ref, dst, 0, 0.0, what)
            continue
        v = f32_of(x).astype(np.float64)
        with np.errstate(all="ignore"):
            r = {"add": np.sum, "mul": np.prod, "max": np.max, "min": np.min}[op](v, axis=ax)
        r = r.reshape(shape)
        if exact:
            ref = cast(f32(r), dst)
            fails.check(what, compare, got[out], ref, dst, 0, 0.0, what)
        else:
            count = math.prod(RSHAPE[i] for i in ax)
            bound = count * 2.0**-24 * np.sum(np.abs(v), axis=ax).reshape(shape)
            fails.check(what, _between, got[out], r - bound, r + bound, dst)
    fails.raise_any()


def check_tensor_copy(engine: str, src: str, dsts: Sequence[str] = tuple(NP), seed: int = 7) -> None:
    """dst = src converted to dst's type: the bits themselves for a same-type copy on VectorE and GpSimd;
    otherwise through fp32 (integers above 2^24 round), then one rounding (floats; e4m3 saturating) or
    truncation with saturation (integers; NaN gives 0)."""
    rng = np.random.default_rng(seed)
    x = _values(src, rng, (P, F))
    outs = {f"y{k}": (d, (P, F)) for k, d in enumerate(dsts)}
    got = run([f"{engine} tensor_copy y{k}, x" for k in range(len(dsts))], {"x": x}, outs)
    fails = Failures()
    for k, d in enumerate(dsts):
        raw = d == src and engine != "act"
        if raw:
            fails.check(f"{engine} tensor_copy {src}->{d} (bits)", _same_bytes, got[f"y{k}"], x)
        else:
            fails.check(f"{engine} tensor_copy {src}->{d}", same_bits, got[f"y{k}"], cast(f32_of(x), d))
    fails.raise_any()


SELECT_CASES = (("f32", "f32", "f32", "f32"), ("s32", "s32", "s32", "s32"), ("u8", "bf16", "f32", "f16"),
                ("bf16", "f8e4m3fn", "f8e4m3fn", "f8e4m3fn"), ("f32", "s32", "s32", "f32"),
                ("f16", "u32", "u32", "u32"), ("s8", "f32", "f32", "bf16"))


def check_select(engine: str, cases: Sequence[tuple[str, str, str, str]] = SELECT_CASES, seed: int = 8) -> None:
    """dst = pred != 0 ? on_true : on_false (NaN is non-zero, -0 is zero): the bits when on_true, on_false
    and dst share a type, else through fp32 and rounded once."""
    rng = np.random.default_rng(seed)
    ins, outs, body = {}, {}, []
    for k, (pd, td, fd, dd) in enumerate(cases):
        pv = rng.choice([0.0, 1.0, -2.0, 0.5, -0.0, math.nan, math.inf], (P, F)) if pd in FLOATS else \
            rng.choice([0, 1, 3, 0, 0, 2], (P, F))
        ins[f"p{k}"] = typed(pv, pd)
        ins[f"t{k}"], ins[f"f{k}"] = _values(td, rng, (P, F)), _values(fd, rng, (P, F))
        outs[f"y{k}"] = (dd, (P, F))
        body.append(f"{engine} select y{k}, p{k}, t{k}, f{k}")
    got = run(body, ins, outs)
    fails = Failures()
    for k, (pd, td, fd, dd) in enumerate(cases):
        cond = widen(ins[f"p{k}"]) != 0
        if td == fd == dd:
            fails.check(f"{engine} select {pd}?{td}:{fd}->{dd} (bits)", _same_bytes, got[f"y{k}"],
                        np.where(cond, ins[f"t{k}"], ins[f"f{k}"]))
        else:
            ref = cast(np.where(cond, f32_of(ins[f"t{k}"]), f32_of(ins[f"f{k}"])), dd)
            fails.check(f"{engine} select {pd}?{td}:{fd}->{dd}", same_bits, got[f"y{k}"], ref)
    fails.raise_any()


IOTA_CASES = ((0, 0, ()), (5, 3, ()), (100, -1, (-2, 7)), (7, 0, (0, 1)), (1000, 2, (11, 1)), (-20, 1, (3, -2)))


def check_iota(engine: str, dst: str, cases: Sequence[tuple[int, int, tuple[int, ...]]] = IOTA_CASES) -> None:
    """dst[p, i, j] = base + channel_multiplier * p + steps[0] i + steps[1] j (default steps: the
    row-major index), written to dst's type (integers exactly, floats rounded once)."""
    shape = (16, 3, 5)
    outs, body, refs = {}, [], []
    info = np.iinfo(NP[dst]) if dst not in FLOATS else None
    for k, (base, cm, steps) in enumerate(cases):
        st_ = steps or (shape[2], 1)
        p, i, j = np.meshgrid(*[np.arange(s) for s in shape], indexing="ij")
        v = base + cm * p + st_[0] * i + st_[1] * j
        if info is not None and (v.min() < info.min or v.max() > info.max):
            continue  # out of the type's range: not specified
        outs[f"y{k}"] = (dst, shape)
        args = f", base={base}" * (base != 0) + f", channel_multiplier={cm}" * (cm != 0)
        args += f", steps=({', '.join(map(str, steps))})" if steps else ""
        body.append(f"{engine} iota y{k}{args}")
        refs.append((k, wrap(v.astype(object), dst) if info is not None else cast(f32(v), dst), (base, cm, steps)))
    got = run(body, {}, outs)
    fails = Failures()
    for k, ref, case in refs:
        fails.check(f"{engine} iota {dst} base,cm,steps={case}", same_bits, got[f"y{k}"], ref)
    fails.raise_any()


AFFINE_CASES = ((0, 1, (-1,), "ge", -3.4e38), (-5, 1, (-1,), "gt", -math.inf), (3, -2, (1,), "le", 0.0),
                (0, 0, (1,), "eq", 7.0), (10, 1, (-3,), "ne", 2.5), (0, 1, (-1,), "lt", 1.0))


def check_affine_select(dtype: str, cases: Sequence[tuple[int, int, tuple[int, ...], str, float]] = AFFINE_CASES
                        ) -> None:
    """dst[p, j] = src[p, j] where (base + channel_multiplier p + step j) cmp 0, else the fill rounded once to
    the type: the kept elements' bits unchanged (NaN, -0 and infinities included)."""
    rng = np.random.default_rng(11)
    shape = (16, 24)
    ins, outs, body = {}, {}, []
    for k, (base, cm, steps, cmp, fill) in enumerate(cases):
        ins[f"x{k}"] = _values(dtype, rng, shape)
        outs[f"y{k}"] = (dtype, shape)
        body.append(f"pool affine_select y{k}, x{k}, base={base}, channel_multiplier={cm}, "
                    f"steps=({', '.join(map(str, steps))}), cmp={cmp}, fill={fill!r}")
    got = run(body, ins, outs)
    fails = Failures()
    p, j = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    ops = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal, "lt": np.less, "eq": np.equal,
           "ne": np.not_equal}
    for k, (base, cm, steps, cmp, fill) in enumerate(cases):
        keep = ops[cmp](base + cm * p + steps[0] * j, 0)
        ref = np.where(keep, ins[f"x{k}"], cast(f32(np.full(shape, fill)), dtype))
        fails.check(f"affine_select {dtype} {cmp} base={base}", _same_bytes, got[f"y{k}"], ref)
    fails.raise_any()


MEMSET_FLOATS = (0.1, -0.0, 1e10, -1e10, 65520.0, 3.5, math.nan, math.inf, 1e-40, 465.0, 1.0 + 2.0**-8)


def check_memset(engine: str, dsts: Sequence[str] = tuple(NP)) -> None:
    """dst = value: a float tile gets the fp32 value rounded once to its type; an integer tile the exact
    integer (16777217 too: not passed through fp32)."""
    outs, body, refs = {}, [], []
    for d in dsts:
        if d in FLOATS:
            values: list[float] = list(MEMSET_FLOATS)
        else:
            info = np.iinfo(NP[d])
            values = [int(info.min), int(info.max), 0, 1] + [v for v in (2**24 + 1, -(2**24) - 1, 255, -7)
                                                              if info.min <= v <= info.max]
        for v in values:
            k = len(outs)
            outs[f"y{k}"] = (d, (P, 4))
            text = "nan" if isinstance(v, float) and math.isnan(v) else ("inf" if v == math.inf else imm(v))
            body.append(f"{engine} memset y{k}, value={text}")
            ref = cast(np.full((P, 4), f32(v)), d) if d in FLOATS else np.full((P, 4), v, NP[d])
            refs.append((k, d, v, ref))
    got = run(body, {}, outs)
    fails = Failures()
    for k, d, v, ref in refs:
        fails.check(f"{engine} memset {d} value={v}", same_bits, got[f"y{k}"], ref)
    fails.raise_any()


def check_bn(src: str = "f32", chunks: Sequence[int] = (300, 301, 64), seed: int = 9) -> None:
    """bn_stats of each chunk: per partition (count, mean, M2) of the even- and the odd-indexed elements;
    bn_aggr of all chunks: the mean and the population variance of the whole row (numpy, float64)."""
    rng = np.random.default_rng(seed)
    p = 16
    n = sum(chunks)
    x = typed(3.0 + rng.standard_normal((p, n)) * rng.uniform(0.5, 2, (p, 1)), src)
    k = len(chunks)
    body, at = [], 0
    for c, size in enumerate(chunks):
        body.append(f"dve bn_stats st[:, {c}, :], x[:, {at}:{at + size}]")
        at += size
    body += ["dve tensor_copy s, st", f"dve bn_aggr mv, st.reshape({p}, {6 * k})"]
    got = run(body, {"x": x}, {"s": ("f32", (p, k, 6)), "mv": ("f32", (p, 2))},
              tiles=[f"sbuf    st: f32[{p}, {k}, 6]"])
    v = f32_of(x).astype(np.float64)
    fails = Failures()
    at = 0
    for c, size in enumerate(chunks):
        part = v[:, at:at + size]
        at += size
        ref = []
        for h in (0, 1):
            half = part[:, h::2]
            if not half.shape[1]:  # an empty half (a chunk of one element) summarises nothing: zeros
                ref += [np.zeros(p)] * 3
                continue
            ref += [np.full(p, half.shape[1], np.float64), half.mean(axis=1),
                    ((half - half.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)]
        ref = f32(np.stack(ref, axis=1))
        fails.check(f"bn_stats {src} chunk {c} ({size})", compare, got["s"][:, c, :], ref, "f32", 2, 1.0, "stats")
    mean, var = v.mean(axis=1), v.var(axis=1)
    fails.check(f"bn_aggr {src} mean", _within, got["mv"][:, 0].astype(np.float64), mean,
                2.0**-21 * (np.abs(mean) + np.sqrt(var)))
    fails.check(f"bn_aggr {src} variance", _within, got["mv"][:, 1].astype(np.float64), var,
                2.0**-19 * (var + mean**2))
    fails.raise_any()


# --- GpSimd indirect copies -----------------------------------------------------------------------------

def _oob_warnings(w: Warnings) -> list[str]:
    return [x.message for x in w if x.code == "NCC_WRUN001"]


def _one_warning_if(expected: bool, msgs: list[str], what: str) -> None:
    """One NCC_WRUN001 warning, naming the instruction, when an index was out of range; none otherwise."""
    if not expected:
        assert not msgs, msgs
    else:
        assert len(msgs) == 1 and "out-of-bound access" in msgs[0] and what in msgs[0], msgs


def check_gather(dtype: str, idx_dt: str = "s32", oob: bool = False, seed: int = 10, mode: str = "error") -> None:
    """dst[p, j] = table[idx[p, j]] (whole rows, bits); a row whose index is outside [0, V) is left
    unwritten (the tile keeps what a memset put there), with one NCC_WRUN001 warning ("... out-of-bound
    access") under oob=error, the default, and silently under oob=skip; the run goes on."""
    rng = np.random.default_rng(seed)
    v, p, n, row = 50, 16, 5, (3, 4)
    table = _values(dtype, rng, (v, *row))
    hi = min(v - 1, int(np.iinfo(NP[idx_dt]).max))
    idx = rng.integers(0, hi + 1, (p, n)).astype(np.int64)
    if oob:
        bad = [b for b in [v, v + 7, 1000] + ([-1, -50] if idx_dt.startswith("s") else [])
               if b <= np.iinfo(NP[idx_dt]).max]
        idx.reshape(-1)[rng.choice(p * n, len(bad), replace=False)] = bad
    ids = typed(idx, idx_dt)
    w = Warnings()
    attr = "" if mode == "error" else f", oob={mode}"
    got = run(["pool memset g, value=3", f"pool gather g, table_in, ix{attr}"], {"table": table, "ix": ids},
              {"g": (dtype, (p, n, *row))}, hbm_ins=("table",), warnings=w)
    ok = (idx >= 0) & (idx < v)
    ref = np.full((p, n, *row), 3, table.dtype)
    ref[ok] = table[idx[ok]]
    fails = Failures()
    fails.check(f"gather {dtype} idx {idx_dt}{' oob=' + mode if oob else ''}", _same_bytes, got["g"], ref)
    fails.check("gather warning", _one_warning_if, not ok.all() and mode == "error", _oob_warnings(w), "gather")
    fails.raise_any()


def check_scatter(dtype: str, mode: str, oob: bool = False, seed: int = 11, oob_mode: str = "error") -> None:
    """table[idx[p, j]] = src[p, j] (set: bits, for repeated indices the last in (p, j) order wins) or
    += (add: in fp32, rounded once to the table's type); out-of-range indices are skipped, with
    NCC_WRUN001 under oob=error (the default), silently under oob=skip."""
    rng = np.random.default_rng(seed)
    v, p, n, row = 40, 16, 6, (3,)
    if mode == "add":
        vals = representable_ints(dtype, 16) / (1 if dtype not in FLOATS else 2)
        table = typed(rng.choice(vals, (v, *row)), dtype)
        src = typed(rng.choice(vals, (p, n, *row)), dtype)
        if dtype in ("s32", "u32"):
            table.reshape(-1)[:6] = 2**24 + 1  # fp32 cannot hold these: the sum rounds
    else:
        table = _values(dtype, rng, (v, *row))
        src = _values(dtype, rng, (p, n, *row))
    idx = rng.integers(0, v, (p, n)).astype(np.int64)
    idx[1, :3] = idx[0, 0]  # repeated indices
    if oob:
        idx.reshape(-1)[[5, 17, 40]] = [-1, v, 999]
    ids = typed(idx, "s32")
    w = Warnings()
    attr = "" if oob_mode == "error" else f", oob={oob_mode}"
    got = run(["q0 dma t_out, t_in", f"pool scatter t_out, ix, s, mode={mode}{attr}"],
              {"t": table, "ix": ids, "s": src}, {"t": (dtype, (v, *row))}, hbm_ins=("t",), hbm_outs=("t",),
              warnings=w)
    ok = (idx >= 0) & (idx < v)
    if mode == "set":
        ref = table.copy()
        for (pp, j), i in np.ndenumerate(idx):
            if ok[pp, j]:
                ref[i] = src[pp, j]
    else:
        acc = f32_of(table).astype(np.float64)
        sv = f32_of(src).astype(np.float64)
        for (pp, j), i in np.ndenumerate(idx):
            if ok[pp, j]:
                acc[i] = f32(f32(acc[i]) + sv[pp, j])
        ref = cast(f32(acc), dtype)
    fails = Failures()
    fails.check(f"scatter {dtype} {mode}{' oob' if oob else ''}", _same_bytes if mode == "set" else same_bits,
                got["t"], ref)
    msgs = _oob_warnings(w)
    fails.check("scatter warning", _one_warning_if, not ok.all() and oob_mode == "error", msgs, "scatter")
    fails.raise_any()


# --- DMA ------------------------------------------------------------------------------------------------

def random_bits(name: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Arbitrary bit patterns of a type (NaN payloads, subnormals, -0 included)."""
    size = np.dtype(NP[name]).itemsize
    return rng.integers(0, 256, math.prod(shape) * size, dtype=np.uint8).view(NP[name]).reshape(shape)


def check_dma(dtype: str, seed: int = 12) -> None:
    """dma copies bytes through any access pattern: strided and permuted sources, broadcasts, strided
    destinations, SBUF to SBUF across partitions, HBM to HBM through a reshape; pred and u8 mix."""
    rng = np.random.default_rng(seed)
    x = random_bits(dtype, rng, (8, 16))
    vrow = random_bits(dtype, rng, (1, 16))
    body = ["q0 dma s1, x_in[0:8:2, 1:13:3]",
            "q2 dma s2, x_in.permute(1, 0)",
            "q3 dma s3, x_in.T",
            "q0 dma s4, v_in.broadcast(0, 8)",
            "q2 dma s5[8:16, :], s4",
            "q3 dma s5[0:8, :], x_in",
            "q0 dma h_out, x_in.reshape(4, 32)",
            "q2 dma s6[:, 0:16:2], x_in[:, 0:8]",
            "q3 dma s6[:, 1:16:2], x_in[:, 8:16]",
            "q0 dma s7, x_in.reshape(2, 4, 16).permute(1, 0, 2)",
            "q2 dma s8, s7[1:3, :, 2:10:4]"]
    outs = {"s1": (dtype, (4, 4)), "s2": (dtype, (16, 8)), "s3": (dtype, (16, 8)), "s4": (dtype, (8, 16)),
            "s5": (dtype, (16, 16)), "h": (dtype, (4, 32)), "s6": (dtype, (8, 16)), "s7": (dtype, (4, 2, 16)),
            "s8": (dtype, (2, 2, 2))}
    got = run(body, {"x": x, "v": vrow}, outs, hbm_ins=("x", "v"), hbm_outs=("h",))
    refs = {"s1": x[0:8:2, 1:13:3], "s2": x.T, "s3": x.T, "s4": np.broadcast_to(vrow, (8, 16)),
            "s5": np.concatenate([x, np.broadcast_to(vrow, (8, 16))]), "h": x.reshape(4, 32),
            "s6": np.stack([x[:, :8], x[:, 8:]], axis=-1).reshape(8, 16),
            "s7": x.reshape(2, 4, 16).transpose(1, 0, 2), "s8": x.reshape(2, 4, 16).transpose(1, 0, 2)[1:3, :, 2:10:4]}
    fails = Failures()
    for k, ref in refs.items():
        fails.check(f"dma {dtype} {k}", _same_bytes, got[k], np.ascontiguousarray(ref))
    fails.raise_any()


def check_dma_cast(src: str, dst: str, seed: int = 14) -> None:
    """A DMA between two float types converts as it copies (nki.isa.dma_copy): each element rounded once to
    the nearest even of ``dst``, through a strided source and on the way back to HBM; NaN stays NaN."""
    rng = np.random.default_rng(seed)
    x = cast(rng.standard_normal((8, 16)).astype(np.float32) * np.float32(3.0), src)
    x[0, :4] = cast(np.array([np.inf, -np.inf, np.nan, 1 + 2.0 ** -8], np.float32), src)
    got = run(["q0 dma s, x_in[:, 0:16:2]", "q2 dma h_out, x_in"], {"x": x},
              {"s": (dst, (8, 8)), "h": (dst, (8, 16))}, hbm_ins=("x",), hbm_outs=("h",))
    fails = Failures()
    for k, ref in {"s": x[:, 0:16:2], "h": x}.items():
        fails.check(f"dma {src}->{dst} {k}", same_bits, got[k], cast(f32_of(np.ascontiguousarray(ref)), dst))
    fails.raise_any()


def _same_bytes(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert a.tobytes() == b.tobytes(), "bytes differ"


def check_dma_pred() -> None:
    """A pred tensor travels through a u8 tile and back, byte for byte."""
    rng = np.random.default_rng(13)
    pr = rng.random((4, 8)) < 0.5
    got = run(["q0 dma u, p_in", "q1 dma q_out, u"], {"p": pr}, {"u": ("u8", (4, 8)), "q": ("pred", (4, 8))},
              hbm_ins=("p",), hbm_outs=("q",), tiles=[])
    assert got["u"].tolist() == pr.astype(np.uint8).tolist()
    assert got["q"].dtype == np.bool_ and (got["q"] == pr).all()


# --- collectives ----------------------------------------------------------------------------------------

def _collective_inputs(dtype: str, op: str, ranks: int, rng: np.random.Generator,
                       shape: tuple[int, int]) -> np.ndarray:
    h = (ranks * shape[0], shape[1])
    if op == "mul":
        vals = [1.0, -1.0, 2.0, 0.5] if dtype in FLOATS else ([1, -1, 2] if dtype.startswith("s") else [1, 2])
        return typed(rng.choice(vals, h), dtype)
    if op == "add" and dtype in FLOATS:
        return typed(rng.choice(representable_ints(dtype, 16), h) / 4, dtype)
    if op == "add" and ranks == 2:
        return _values(dtype, rng, h)  # one fp32 rounding per element: the order does not matter
    if op == "add":
        return typed(rng.integers(-1000 if dtype.startswith("s") else 0, 1000, h), dtype)
    x = _values(dtype, rng, h)
    if dtype in FLOATS:
        xv = widen(x)
        x = typed(np.where(np.isnan(xv), 1.0, xv), dtype)
    return x


def _reduce_ranks(parts: list[np.ndarray], op: str, dtype: str) -> np.ndarray:
    """op over the ranks' values in fp32 (collectives compute in fp32), rounded to dtype."""
    vals = [f32_of(v).astype(np.float64) for v in parts]
    acc = vals[0]
    for v in vals[1:]:
        acc = alu_f32({"add": "add", "mul": "mul", "max": "max", "min": "min"}[op], acc, v).astype(np.float64)
    return cast(f32(acc), dtype)


def check_collective(kind: str, dtype: str, op: str = "add", axis: int = 0, ranks: int = 2, seed: int = 14) -> None:
    """trn2, lnc=2 (two physical cores per logical core), ``ranks`` SPMD ranks, each with its shard:
    all_reduce gives every rank op of all ranks' src (in fp32); all_gather concatenates the ranks' src
    along axis in rank order; reduce_scatter gives rank r part r of the reduction."""
    rng = np.random.default_rng(seed)
    p, f = 16, 8
    header = [f".ranks {ranks}"] if ranks != 2 else []
    x = _collective_inputs(dtype, op, ranks, rng, (p, f))
    parts = np.split(x, ranks, axis=0)
    if kind == "all_reduce":
        body = [f"cc all_reduce y, x, op={op}"]
        outs = {"y": (dtype, x.shape)}
        ref = np.concatenate([_reduce_ranks(parts, op, dtype)] * ranks)
        shard = {"x": 0, "y": 0}
    elif kind == "all_gather":
        body = [f"cc all_gather y, x, axis={axis}"]
        shape = (p * ranks, f) if axis == 0 else (p, f * ranks)
        outs = {"y": (dtype, shape)}  # not sharded: rank 0's copy
        ref = np.concatenate(parts, axis=axis)
        shard = {"x": 0}
    else:
        body = [f"cc reduce_scatter y, x, op={op}, axis={axis}"]
        outs = {"y": (dtype, (p, f))}  # sharded along axis: the host sees the ranks' parts assembled
        ref = _reduce_ranks(parts, op, dtype)
        shard = {"x": 0, "y": axis}
    got = run(body, {"x": x}, outs, target="trn2", header=header, shard=shard, ranks=ranks)
    what = f"{kind} {dtype} op={op} axis={axis} ranks={ranks}"
    if kind == "all_gather":
        same_bits(got["y"], ref, what)
    else:  # the sign of a zero max/min is not specified
        compare(got["y"], ref, dtype, 0, 0.0, what)

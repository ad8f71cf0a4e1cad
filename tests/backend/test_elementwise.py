"""Elementwise operators on the device exactly as XLA defines them (backend/elementwise*.py, rng.py).

Every per-operator case of tests/data/xla_ops in the elementwise families compiles for trn1 and trn2
and matches the reference interpreter on the simulator (and XLA's own outputs), or is refused with
the code docs/backend.md gives. Beyond the fixtures, each operator runs on every element type with
special and random values: exact operators bit for bit (NaN as NaN, signed zeros), the functions
computed by several instructions within the error bounds docs/backend.md states.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from harness import DATA, assert_device_matches, device_run, input_loads, module_of, random_inputs, reference_run

from nxsat import dtypes as dt
from nxsat.backend import compile_graph
from nxsat.backend.graph import Graph
from nxsat.backend.schedule import schedule
from nxsat.diagnostics import NxsatError
from nxsat.io import read_npz
from nxsat.sim import load_target

XLA = DATA / "xla_ops"
FAMILIES = re.compile(r"^(unary|binary|convert|bitcast|compare|clamp|select|shift|integer|logic|rng|random|"
                      r"reduce_precision)_")
# select_and_scatter_* is the windowed operator select-and-scatter (reductions), not select.
CASES = sorted(p.stem for p in XLA.glob("*.hlo") if FAMILIES.match(p.stem) and not p.stem.startswith(
    "select_and_scatter"))
TARGETS = ["trn1", "trn2"]

# Refused at compile time (docs/backend.md, "Elementwise operators"): the device has no f64
# (NCC_ESPP004), and runs rng-bit-generator's default algorithm only (NCC_EVRF006, as neuronx-cc).
F64 = ["binary_atan2_f64", "binary_div_f64", "binary_pow_f64", "binary_rem_f64", "bitcast_64bit",
       "bitcast_u32_pairs_to_f64", "convert_f32_to_f64", "convert_f64_to_ints", "convert_f64_to_narrow_floats",
       "convert_s64_to_floats", "convert_u64_to_floats", "reduce_precision_f64", "unary_cbrt_f64", "unary_exp_f64",
       "unary_expm1_f64", "unary_log1p_f64", "unary_sin_f64", "unary_tanh_f64"]
NOT_DEFAULT_RNG = ["rng_bit_generator_philox", "rng_bit_generator_philox_u64_output",
                   "rng_bit_generator_philox_u64_state3", "rng_bit_generator_three_fry",
                   "rng_bit_generator_three_fry_u64_output"]
REFUSED = {**{c: "NCC_ESPP004" for c in F64}, **{c: "NCC_EVRF006" for c in NOT_DEFAULT_RNG}}

# 64-bit integers are 32-bit on the device (NCC_WTYP001). Inputs are wrapped to 32 bits (the device
# refuses values that do not fit) and outputs compared after wrapping the interpreter's to 32 bits. These
# outputs follow the 32-bit meaning instead (the interpreter on the module with s64/u64 read as
# s32/u32): bit counts (popcnt, clz), right shifts that bring in the high word, and float-to-int
# saturation at the 32-bit bounds.
WIDE = {"binary_int_s64": set(), "binary_int_u64": set(), "compare_s64": set(), "compare_u64": set(),
        "convert_64bit_to_ints": set(), "convert_f32_to_64bit_ints": {0, 1}, "shift_s64": {1}, "shift_u64": {2},
        "unary_int_s64": {4, 5}, "unary_int_u64": {1, 2}, "random_uniform_threefry": set(),
        "rng_bit_generator_default_odd_shape": set(), "rng_bit_generator_default_u16_odd": set(),
        "rng_bit_generator_default_u32": set(), "rng_bit_generator_default_u8_u64": set()}
# u32 words that a module bitcasts to a u64 state: their high words are dropped on the device.
HIGH_WORDS = {"rng_bit_generator_default_odd_shape", "rng_bit_generator_default_u32",
              "rng_bit_generator_default_u8_u64"}
STATISTICAL = {"rng_uniform_stat", "rng_uniform_s32_stat", "rng_normal_stat"}


def _npz(name: str) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    arrays = read_npz(XLA / f"{name}.npz")
    ins = {k: v for k, v in arrays.items() if k.startswith("in")}
    outs = [arrays[f"out{i}"] for i in range(sum(k.startswith("out") for k in arrays))]
    return ins, outs


def _wrap32(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.int64:
        return a.astype(np.int32)
    if a.dtype == np.uint64:
        return a.astype(np.uint32)
    return a


def _narrowed(name: str) -> str:
    text = (XLA / f"{name}.hlo").read_text()
    return re.sub(r"\bu64\[", "u32[", re.sub(r"\bs64\[", "s32[", text))


def _ulp(ref: np.ndarray, d: dt.DType) -> np.ndarray:
    info = ml_dtypes.finfo(d.np)
    mag = np.abs(ref.astype(np.float64))
    e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    return np.exp2(np.maximum(e, math.log2(float(info.smallest_normal))) - int(info.nmant))


def assert_same(got: np.ndarray, want: np.ndarray, d: dt.DType, ulps: float = 0.0, what: str = "",
                signed_zeros: bool = True) -> None:
    """Equal as values of ``d``: integers exactly; floats NaN where NaN, infinities equal, zeros of the
    same sign, the rest within ``ulps`` units in the last place of ``d`` (0: equal)."""
    got = np.asarray(got)
    want = np.asarray(want).astype(d.np if not d.is_pred else np.bool_)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if not d.is_float:
        bad = got.astype(want.dtype) != want
        assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} differ: got {got[bad][:8]} want {want[bad][:8]}"
        return
    with np.errstate(invalid="ignore"):  # NaN payloads widen with a warning
        g, w = got.astype(np.float64), want.astype(np.float64)
        bad = np.isnan(g) != np.isnan(w)
        inf = np.isinf(g) | np.isinf(w)
        bad |= inf & (g != w)
        both = ~np.isnan(g) & ~np.isnan(w) & ~inf
        bad |= both & (np.abs(g - w) > ulps * _ulp(w, d))
        if signed_zeros:
            bad |= both & (g == 0) & (w == 0) & (np.signbit(g) != np.signbit(w))
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} differ: got {g[bad][:8]} want {w[bad][:8]}"
                           f" (inputs at {np.argwhere(bad)[:4].tolist()})")


# --- the fixtures ----------------------------------------------------------------------------------

def test_every_fixture_is_classified() -> None:
    """Each case of the families is run below; the refused and 64-bit lists name real cases."""
    assert len(CASES) == 171
    assert set(REFUSED) <= set(CASES) and set(WIDE) <= set(CASES) and STATISTICAL <= set(CASES)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", CASES)
def test_xla_case(name: str, target: str) -> None:
    module = module_of(XLA / f"{name}.hlo")
    ins, xla = _npz(name)
    if name in REFUSED:
        with pytest.raises(NxsatError) as e:
            compile_graph(module, load_target(target))
        assert e.value.code == REFUSED[name]
        return
    types = [t.dtype for t in module.outputs]
    if name in STATISTICAL:
        (got,), _ = device_run(module, ins, target)
        _check_distribution(name, got, ins)
        return
    if name in WIDE:
        _check_wide(name, module, ins, target)
        return
    assert_device_matches(module, ins, target)
    got, _ = device_run(module, ins, target)
    for k, (g, w, d) in enumerate(zip(got, xla, types)):
        # XLA CPU's transcendental functions are not correctly rounded (the interpreter's are): f32 within
        # 4 ulp; narrow floats within 1 ulp (XLA also computes them in f32 and rounds once).
        ulps = 0.0 if name.split("_")[0] not in ("unary", "binary") or "_int_" in name else (
            4.0 if d is dt.F32 else 1.0)
        assert_same(g, w, d, ulps, f"{name} out{k} vs XLA", signed_zeros=not name.startswith(("binary_m", "clamp")))


def _check_wide(name: str, module, ins: dict[str, np.ndarray], target: str) -> None:
    wrapped = {k: v.astype(np.int32).astype(np.int64) if v.dtype == np.int64 else
               v.astype(np.uint32).astype(np.uint64) if v.dtype == np.uint64 else v.copy() for k, v in ins.items()}
    if name in HIGH_WORDS:
        for v in wrapped.values():
            v.reshape(-1, 2)[:, 1] = 0
    got, _ = device_run(module, wrapped, target)
    want = reference_run(module, wrapped)
    narrow = None
    for k, (g, w) in enumerate(zip(got, want)):
        if k in WIDE[name]:
            if narrow is None:
                m32 = module_of(_narrowed(name))
                narrow = reference_run(m32, {key: _wrap32(v) for key, v in wrapped.items()})
            w = narrow[k]
        w = _wrap32(w)
        assert g.dtype == w.dtype or w.dtype == np.bool_, f"out{k}: {g.dtype} vs {w.dtype}"
        assert_same(g, w, dt.from_numpy(w.dtype), 0.0, f"{name} out{k}")


def _check_distribution(name: str, got: np.ndarray, ins: dict[str, np.ndarray]) -> None:
    """rng is implementation-defined in XLA: range and moments (as tests/test_xla_ops.py checks)."""
    lo, hi = float(ins["in0"]), float(ins["in1"])
    if name == "rng_normal_stat":
        assert np.isfinite(got).all()
        assert abs(got.mean() - lo) < 0.05 * hi * 4 and abs(got.std() - hi) < 0.05 * hi
        assert 0.64 < np.mean(np.abs(got - lo) < hi) < 0.72
        return
    assert (got >= lo).all() and (got < hi).all()
    integer = got.dtype.kind == "i"
    span = hi - lo
    if integer:
        assert set(np.unique(got).tolist()) == set(range(int(lo), int(hi)))
    ideal = span / np.sqrt(12) if not integer else np.sqrt((span**2 - 1) / 12)
    assert abs(got.mean() - (lo + hi - (1 if integer else 0)) / 2) < 0.05 * span
    assert abs(got.std() - ideal) < 0.05 * ideal


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("optimized", [False, True])
def test_random_dropout_reproduces_xla(target: str, optimized: bool) -> None:
    """JAX's threefry (u32 shifts, xors and adds; u64 counters that fit 32 bits) and dropout, bit-exact."""
    ref = np.load(DATA / "jax" / "random_dropout.npz")
    ins = {k: ref[k] for k in ref.files if k.startswith("in")}
    outs = [ref[f"out{i}"] for i in range(sum(1 for k in ref.files if k.startswith("out")))]
    got, _ = device_run(module_of(DATA / "jax" / "random_dropout.hlo", optimized=optimized), ins, target)
    for g, w in zip(got, outs):
        np.testing.assert_array_equal(g, w)


# --- every operator on every type ------------------------------------------------------------------

FLOATS = [dt.F32, dt.BF16, dt.F16, dt.F8E4M3FN, dt.F8E5M2]
INTS = [dt.S8, dt.S16, dt.S32, dt.U8, dt.U16, dt.U32]
RNG = np.random.default_rng(2026)


def float_values(d: dt.DType, n: int = 700) -> np.ndarray:
    """Special values (NaN of both signs, infinities, signed zeros, ties, extremes, subnormals) and
    random bit patterns of ``d``."""
    info = ml_dtypes.finfo(d.np)
    specials = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5,
                0.49999997, -0.49999997, 0.50000006, 7.0, -8.0, 1e-3, -2e-4, 3.0e38, -3.0e38,
                float(info.max), -float(info.max), float(info.smallest_normal), float(info.smallest_subnormal),
                8388607.5, -8388608.5, 4194303.5, 16777215.0, 2.0**23, 2.0**23 + 2, 100.0, -1e6]
    if d.itemsize == 1:
        v = np.arange(256, dtype=np.uint8).view(d.np)
    else:
        bits = RNG.integers(0, 2 ** (8 * d.itemsize), n, dtype=np.uint64).astype(UNSIGNED[d.itemsize])
        v = np.concatenate([bits.view(d.np), (RNG.standard_normal(n) * 4).astype(d.np)])
    with np.errstate(over="ignore"):
        s = np.array(specials, np.float64).astype(np.float32).astype(d.np)
    return np.concatenate([s, v]).astype(d.np)


UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def int_values(d: dt.DType, n: int = 700) -> np.ndarray:
    info = np.iinfo(d.np)
    specials = [0, 1, -1, 2, -2, 3, 7, -7, 8, 31, 32, 33, 63, 64, 100, info.min, info.max, info.min + 1,
                info.max - 1, info.max // 2, info.min // 2]
    s = np.array([v for v in specials if info.min <= v <= info.max], np.int64).astype(d.np)
    r = RNG.integers(int(info.min), int(info.max) + 1, n, dtype=np.int64).astype(d.np)
    small = RNG.integers(max(int(info.min), -40), min(int(info.max), 40) + 1, n, dtype=np.int64).astype(d.np)
    return np.concatenate([s, r, small])


def _hlo(op: str, ins: list[dt.DType], out: dt.DType, n: int, attrs: str = "", out_shape: str | None = None,
         in_shapes: list[str] | None = None) -> str:
    shapes = in_shapes or [f"[{n}]"] * len(ins)
    params = "\n".join(f"  p{i} = {d.name}{s} parameter({i})" for i, (d, s) in enumerate(zip(ins, shapes)))
    args = ", ".join(f"p{i}" for i in range(len(ins)))
    return (f"HloModule m\nENTRY main {{\n{params}\n  ROOT r = {out.name}{out_shape or f'[{n}]'} {op}({args})"
            f"{attrs}\n}}\n")


def _pairs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every special value against every other (the first 40 of each), then random pairs."""
    k = 40
    a = np.repeat(x[:k], k)
    b = np.tile(y[:k], k)
    return np.concatenate([a, x[k:]]), np.concatenate([b, np.resize(y[k:], x[k:].size)])


def run_both(text: str, inputs: list[np.ndarray], target: str = "trn1") -> tuple[list, list]:
    module = module_of(text)
    feed = {f"p{i}": v for i, v in enumerate(inputs)}
    got, _ = device_run(module, feed, target)
    return got, reference_run(module, feed)


EXACT_UNARY = ["floor", "ceil", "round-nearest-even", "round-nearest-afz", "abs", "negate", "is-finite"]


@pytest.mark.parametrize("d", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", EXACT_UNARY)
def test_exact_float_unary(op: str, d: dt.DType) -> None:
    x = float_values(d)
    out = dt.PRED if op == "is-finite" else d
    (got,), (want,) = run_both(_hlo(op, [d], out, x.size), [x])
    if op == "round-nearest-afz":  # XLA rounds -0 to -0 (C's round); the interpreter's floor(x + 0.5) gives +0
        with np.errstate(invalid="ignore"):  # NaN compared with 0 (bf16's comparison warns; it is False)
            want = np.where(x == 0, x, want)
    assert_same(got, want, out, 0.0, f"{op} {d.name}")


@pytest.mark.parametrize("d", FLOATS, ids=lambda d: d.name)
def test_sign_is_xlas(d: dt.DType) -> None:
    """XLA's sign: +-1 with x's sign, x for +-0 and NaN (sign(-0) = -0, which numpy's sign loses)."""
    x = float_values(d)
    (got,), _ = run_both(_hlo("sign", [d], d, x.size), [x])
    with np.errstate(invalid="ignore"):
        xf = x.astype(np.float64)
    want = np.where(np.isnan(xf) | (xf == 0), xf, np.copysign(1.0, xf)).astype(d.np)
    assert_same(got, want, d, 0.0, f"sign {d.name}")


def _truth_ulps(got: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """|got - truth| in fp32 ulps of the truth (an f64 value; beyond fp32's range it is infinity)."""
    with np.errstate(over="ignore", invalid="ignore"):
        t = np.where(np.isinf(truth.astype(np.float32)), np.sign(truth) * np.inf, truth)
        g = got.astype(np.float64)
        err = np.abs(g - t) / _ulp(t, dt.F32)
        err[(np.isnan(g) & np.isnan(t)) | (g == t)] = 0.0
        err[np.isnan(g) != np.isnan(t)] = np.inf
    return err


# Error bounds of the functions computed by several instructions (f32 ulps, docs/backend.md).
BOUNDS = {"exponential-minus-one": (np.expm1, 2.0), "log-plus-one": (np.log1p, 2.0), "cbrt": (np.cbrt, 1.5),
          "tan": (np.tan, 2.0)}


def _spread(n: int, lo: int, hi: int, signed: bool = True) -> np.ndarray:
    m = RNG.uniform(1, 2, n) * np.exp2(RNG.integers(lo, hi, n))
    return (m * (RNG.choice([-1, 1], n) if signed else 1)).astype(np.float32)


@pytest.mark.parametrize("op", sorted(BOUNDS))
def test_function_error_bound_f32(op: str) -> None:
    fn, bound = BOUNDS[op]
    x = np.concatenate([float_values(dt.F32), _spread(3000, -40, 8), RNG.uniform(-1.5, 1.5, 3000).astype(
        np.float32), _spread(1000, -126, 127)])
    (got,), (want,) = run_both(_hlo(op, [dt.F32], dt.F32, x.size), [x])
    with np.errstate(all="ignore"):
        err = _truth_ulps(got, fn(x.astype(np.float64)))
    assert err.max() <= bound, f"{op}: {err.max():.3f} ulp at x = {x[np.argmax(err)]!r}"
    zeros = x == 0
    assert_same(got[zeros], want[zeros], dt.F32, 0.0, f"{op} of +-0")  # signed zeros kept


@pytest.mark.parametrize("d", [dt.BF16, dt.F16], ids=lambda d: d.name)
@pytest.mark.parametrize("op", sorted(BOUNDS))
def test_function_narrow_floats(op: str, d: dt.DType) -> None:
    """Computed in fp32, rounded once to the type: within one unit of its last place of the interpreter."""
    x = float_values(d)
    (got,), (want,) = run_both(_hlo(op, [d], d, x.size), [x])
    assert_same(got, want, d, 1.0, f"{op} {d.name}")


def test_atan2_error_bound_and_quadrants() -> None:
    x = float_values(dt.F32)
    a, b = _pairs(x, x[::-1].copy())
    a = np.concatenate([a, _spread(4000, -60, 60), RNG.uniform(-3, 3, 2000).astype(np.float32)])
    b = np.concatenate([b, _spread(4000, -60, 60), RNG.uniform(-3, 3, 2000).astype(np.float32)])
    (got,), _ = run_both(_hlo("atan2", [dt.F32, dt.F32], dt.F32, a.size), [a, b])
    with np.errstate(invalid="ignore"):
        truth = np.arctan2(a.astype(np.float64), b.astype(np.float64))  # the signed zeros and infinities of C
    err = _truth_ulps(got, truth)
    assert err.max() <= 2.0, f"atan2: {err.max():.3f} ulp at {a[np.argmax(err)]!r}, {b[np.argmax(err)]!r}"
    zero = truth == 0
    assert (np.signbit(got[zero]) == np.signbit(truth[zero])).all()


@pytest.mark.parametrize("d", FLOATS, ids=lambda d: d.name)
def test_float_remainder_is_exact(d: dt.DType) -> None:
    x = float_values(d)
    a, b = _pairs(x, x[::-1].copy())
    if d is dt.F32:  # far-apart exponents: the long division's every step
        a = np.concatenate([a, _spread(2000, -126, 127), np.float32([3e38, 1e30, -1e30, 1.17e-38])])
        b = np.concatenate([b, _spread(2000, -149, 127), np.float32([1.4e-45, 0.7, 3.0, 1e-45])])
    (got,), (want,) = run_both(_hlo("remainder", [d, d], d, a.size), [a.astype(d.np), b.astype(d.np)])
    assert_same(got, want, d, 0.0, f"fmod {d.name}")


@pytest.mark.parametrize("d", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["maximum", "minimum", "add", "subtract", "multiply", "divide", "power", "atan2"])
def test_float_binary(op: str, d: dt.DType) -> None:
    """One fp32 step and one rounding (as XLA CPU computes narrow floats); NaN propagates through max/min.
    atan2 and power on narrow floats: within one unit of the type's last place (the interpreter rounds
    from f64); f32 power: numpy's powf, within 1 ulp of the interpreter's f64 pow."""
    x = float_values(d)
    a, b = _pairs(x, x[::-1].copy())
    (got,), (want,) = run_both(_hlo(op, [d, d], d, a.size), [a, b])
    ulps = 1.0 if op in ("atan2", "power") else 0.0
    if op == "atan2" and d is dt.F32:
        ulps = 2.0
    assert_same(got, want, d, ulps, f"{op} {d.name}", signed_zeros=op not in ("maximum", "minimum"))


@pytest.mark.parametrize("d", [dt.F32, dt.BF16, dt.F16], ids=lambda d: d.name)
@pytest.mark.parametrize("fmt", [(5, 10), (8, 7), (4, 3), (2, 1), (8, 23), (1, 0), (5, 2), (11, 52)])
def test_reduce_precision_bit_exact(d: dt.DType, fmt: tuple[int, int]) -> None:
    x = float_values(d)
    attrs = f", exponent_bits={fmt[0]}, mantissa_bits={fmt[1]}"
    (got,), (want,) = run_both(_hlo("reduce-precision", [d], d, x.size, attrs), [x])
    np.testing.assert_array_equal(got.view(UNSIGNED[d.itemsize]), want.view(UNSIGNED[d.itemsize]))


@pytest.mark.parametrize("d", FLOATS + INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_compare(d: dt.DType, direction: str) -> None:
    x = float_values(d) if d.is_float else int_values(d)
    a, b = _pairs(x, x[::-1].copy())
    kinds = ["FLOAT", "TOTALORDER"] if d.is_float else ["SIGNED" if d.is_signed else "UNSIGNED"]
    for kind in kinds:
        (got,), (want,) = run_both(_hlo("compare", [d, d], dt.PRED, a.size, f", direction={direction}, type={kind}"),
                                   [a, b])
        np.testing.assert_array_equal(got, want, err_msg=f"{d.name} {direction} {kind}")


INT_BINARY = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "and", "or", "xor",
              "shift-left", "shift-right-logical", "shift-right-arithmetic", "power"]


@pytest.mark.parametrize("d", INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", INT_BINARY)
def test_integer_binary_wraps_as_xla(op: str, d: dt.DType) -> None:
    """x / 0 = -1, INT_MIN / -1 = INT_MIN, x % 0 = x, shifts past the width, wrapping everywhere."""
    x = int_values(d)
    a, b = _pairs(x, x[::-1].copy())
    if op == "power":  # exponents worth computing (every bit of a 32-bit exponent is still looked at)
        b = np.concatenate([b[:1600], int_values(d)[:200] % 40 - (0 if not d.is_signed else 5)]).astype(d.np)
        a = np.resize(a, b.size)
    (got,), (want,) = run_both(_hlo(op, [d, d], d, a.size), [a, b])
    np.testing.assert_array_equal(got, want, err_msg=f"{op} {d.name}")


@pytest.mark.parametrize("d", INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", ["abs", "negate", "sign", "not", "popcnt", "count-leading-zeros"])
def test_integer_unary(op: str, d: dt.DType) -> None:
    x = int_values(d)
    (got,), (want,) = run_both(_hlo(op, [d], d, x.size), [x])
    np.testing.assert_array_equal(got, want, err_msg=f"{op} {d.name}")


@pytest.mark.parametrize("d", [dt.F32, dt.BF16, dt.S8, dt.S32, dt.U32, dt.U16], ids=lambda d: d.name)
def test_clamp_array_and_scalar_bounds_and_select_scalar_pred(d: dt.DType) -> None:
    x = float_values(d) if d.is_float else int_values(d)
    n = x.size
    lo, hi = np.sort(np.stack([RNG.permutation(x), RNG.permutation(x)]), axis=0)
    (got,), (want,) = run_both(_hlo("clamp", [d, d, d], d, n), [lo, x, hi])
    assert_same(got, want, d, 0.0, "clamp arrays", signed_zeros=False)
    s = _hlo("clamp", [d, d, d], d, n, in_shapes=["[]", f"[{n}]", "[]"])
    (got,), (want,) = run_both(s, [np.array(x[7], d.np), x, np.array(x[6], d.np)])
    assert_same(got, want, d, 0.0, "clamp scalars", signed_zeros=False)
    for p in (True, False):
        s = _hlo("select", [dt.PRED, d, d], d, n, in_shapes=["[]", f"[{n}]", f"[{n}]"])
        (got,), (want,) = run_both(s, [np.array(p), x, x[::-1].copy()])
        assert_same(got, want, d, 0.0, "select scalar pred")


CONVERT_TYPES = [dt.PRED, *FLOATS, *INTS]


@pytest.mark.parametrize("src", CONVERT_TYPES, ids=lambda d: d.name)
def test_convert_every_pair(src: dt.DType) -> None:
    """To every type: floats round to nearest even (f8e4m3fn: NaN beyond its range, as XLA), floats to
    integers truncate and saturate (NaN is 0), integers wrap, anything to pred is x != 0."""
    if src.is_pred:
        x = np.array([True, False] * 20)
    elif src.is_float:
        x = float_values(src)
    else:
        x = int_values(src)
    for d in CONVERT_TYPES:
        (got,), (want,) = run_both(_hlo("convert", [src], d, x.size), [x])
        assert_same(got, want, d, 0.0, f"convert {src.name} -> {d.name}")


SAME_WIDTH = {1: [dt.U8, dt.S8, dt.F8E4M3FN, dt.F8E5M2], 2: [dt.U16, dt.S16, dt.F16, dt.BF16],
              4: [dt.U32, dt.S32, dt.F32]}


@pytest.mark.parametrize("width", [1, 2, 4])
def test_bitcast_convert_same_width(width: int) -> None:
    types = SAME_WIDTH[width]
    bits = RNG.integers(0, 2 ** (8 * width), 300, dtype=np.uint64).astype(UNSIGNED[width])
    for src in types:
        for d in types:
            x = bits.view(src.np)
            # fused with arithmetic on both sides: the view is of a tile the cluster computes
            text = (f"HloModule m\nENTRY main {{\n  p0 = {src.name}[300] parameter(0)\n"
                    f"  c = {d.name}[300] bitcast-convert(p0)\n  ROOT r = ({d.name}[300], {src.name}[300]) "
                    f"tuple(c, p0)\n}}\n")
            got, _ = run_both(text, [x])
            np.testing.assert_array_equal(got[0].view(UNSIGNED[width]), bits, err_msg=f"{src.name} -> {d.name}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pair", [(dt.F32, dt.BF16), (dt.F32, dt.U8), (dt.S32, dt.F16), (dt.U16, dt.S8),
                                  (dt.F16, dt.F8E5M2)], ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("shape", [(3, 5), (2, 700), (130, 3), (1100,)])
def test_bitcast_convert_changes_width(pair: tuple[dt.DType, dt.DType], shape: tuple[int, ...], target: str
                                       ) -> None:
    """Wide to narrow adds a minor dimension (little endian), narrow to wide drops it: through a tile seen
    as both types."""
    wide, narrow = pair
    r = wide.itemsize // narrow.itemsize
    n = math.prod(shape)
    bits = RNG.integers(0, 2 ** (8 * wide.itemsize), n, dtype=np.uint64).astype(UNSIGNED[wide.itemsize])
    x = bits.view(wide.np).reshape(shape)
    s, sn = ",".join(map(str, shape)), ",".join(map(str, (*shape, r)))
    down = f"HloModule m\nENTRY main {{\n  p0 = {wide.name}[{s}] parameter(0)\n  ROOT r = {narrow.name}[{sn}] " \
           f"bitcast-convert(p0)\n}}\n"
    (got,), (want,) = run_both(down, [x], target)
    np.testing.assert_array_equal(got.view(UNSIGNED[narrow.itemsize]), want.view(UNSIGNED[narrow.itemsize]))
    up = f"HloModule m\nENTRY main {{\n  p0 = {narrow.name}[{sn}] parameter(0)\n  ROOT r = {wide.name}[{s}] " \
         f"bitcast-convert(p0)\n}}\n"
    (back,), _ = run_both(up, [want], target)
    np.testing.assert_array_equal(back.view(UNSIGNED[wide.itemsize]), bits.reshape(shape))


@pytest.mark.parametrize("shape,dim,d", [((5, 7), 1, dt.S32), ((300, 3), 0, dt.F32), ((4, 3, 500), 1, dt.U32),
                                         ((2, 1500), 1, dt.BF16), ((260, 2, 3), 2, dt.S8)])
def test_iota(shape: tuple[int, ...], dim: int, d: dt.DType) -> None:
    s = ",".join(map(str, shape))
    text = (f"HloModule m\nENTRY main {{\n  i = {d.name}[{s}] iota(), iota_dimension={dim}\n"
            f"  ROOT r = {d.name}[{s}] add(i, i)\n}}\n")
    (got,), (want,) = run_both(text, [])
    np.testing.assert_array_equal(got, want)


# --- random numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("state,out", [(2, "u32[4,8]"), (3, "u32[5,3]"), (2, "u16[3,5]"), (3, "u8[7,3,3]"),
                                       (2, "u64[7]"), (3, "s32[1]"), (2, "u32[200000]"), (3, "u64[3,70001]")])
def test_rng_bit_generator_is_philox_bit_exact(state: int, out: str, target: str) -> None:
    """rng_default is XLA's Philox-4x32-10 bit for bit (states whose words fit 32 bits, as the device holds
    them; the counter's carry into its high word included), odd shapes, every output width; multi-tile."""
    text = (f"HloModule m\nENTRY main {{\n  p0 = u64[{state}] parameter(0)\n  ROOT r = (u64[{state}], {out}) "
            f"rng-bit-generator(p0), algorithm=rng_default\n}}\n")
    seeds = np.array([0xDEADBEEF, 0xFFFFFFF0, 7][:state], np.uint64)
    got, want = run_both(text, [seeds], target)
    np.testing.assert_array_equal(got[0], want[0].astype(np.uint32))
    np.testing.assert_array_equal(got[1], _wrap32(want[1]))


def test_rng_bit_generator_other_algorithms_are_refused() -> None:
    for alg in ("rng_philox", "rng_three_fry"):
        text = (f"HloModule m\nENTRY main {{\n  s = u64[2] parameter(0)\n  ROOT r = (u64[2], u32[8]) "
                f"rng-bit-generator(s), algorithm={alg}\n}}\n")
        with pytest.raises(NxsatError) as e:
            compile_graph(module_of(text), load_target("trn1"))
        assert e.value.code == "NCC_EVRF006" and "rng_default" in str(e.value)


@pytest.mark.parametrize("d,dist,a,b", [(dt.F32, "rng_uniform", -2.0, 3.0), (dt.BF16, "rng_uniform", 0.0, 1.0),
                                        (dt.S32, "rng_uniform", -5, 7), (dt.U8, "rng_uniform", 3, 250),
                                        (dt.S32, "rng_uniform", -2**31, 2**31 - 1),
                                        (dt.F32, "rng_normal", 1.5, 0.5), (dt.F16, "rng_normal", -3.0, 2.0)])
def test_rng_distributions(d: dt.DType, dist: str, a: float, b: float) -> None:
    text = (f"HloModule m\nENTRY main {{\n  a = {d.name}[] parameter(0)\n  b = {d.name}[] parameter(1)\n"
            f"  ROOT r = {d.name}[20000] rng(a, b), distribution={dist}\n}}\n")
    (got,), _ = device_run(module_of(text), {"a": np.array(a, d.np), "b": np.array(b, d.np)})
    g = got.astype(np.float64)
    if dist == "rng_normal":
        assert abs(g.mean() - a) < 0.03 * b and abs(g.std() - b) < 0.03 * b
        assert 0.66 < np.mean(np.abs(g - a) < b) < 0.70
        return
    assert (g >= a).all() and (g < b).all()
    span = b - a
    mean, std = ((a + b) / 2, span / np.sqrt(12)) if d.is_float else ((a + b - 1) / 2, np.sqrt((span**2 - 1) / 12))
    assert abs(g.mean() - mean) < 0.02 * span and abs(g.std() - std) < 0.02 * span
    assert len(np.unique(got)) >= min(100, span)


# --- the allocator's views -----------------------------------------------------------------------------

def test_a_view_is_placed_with_its_base_and_keeps_it_alive() -> None:
    """A tile seen as another type shares its base's bytes; the base's memory is not reused while a view
    is still to be read, even after the base's own last use."""
    g = Graph()
    x = g.buf("x", "input", dt.F32, (128, 512)).ref()
    out = g.buf("out", "output", dt.U32, (128, 512)).ref()
    other = g.buf("o", "output", dt.F32, (128, 512)).ref()
    base = g.tile((128, 512), dt.F32, "sbuf", "base")
    view = g.alias(base, dt.U32, (128, 512))
    g.add("dma", "dma", base.ref(), x)
    t2 = g.tile((128, 512), dt.F32, "sbuf", "t2")
    g.add("dve", "tensor_scalar", t2.ref(), base.ref(), op0="add", scalar0=1.0)  # the base's last direct use
    t3 = g.tile((128, 512), dt.F32, "sbuf", "t3")  # placed while the view is still to be read
    g.add("dve", "tensor_scalar", t3.ref(), t2.ref(), op0="mul", scalar0=2.0)
    g.add("dma", "dma", other, t3.ref())
    g.add("dma", "dma", out, view.ref())
    t = load_target("trn1")
    sch = schedule(g, t, [x.buf], [out.buf, other.buf])
    decl = sch.program.tensors
    places = {(v.dtype.name, v.offset) for v in decl.values() if v.kind == "sbuf"}
    assert ("u32", base.offset) in places and view.offset == base.offset
    lo, hi = base.offset, base.offset + base.row_bytes
    assert not (t3.offset < hi and lo < t3.offset + t3.row_bytes), "the base's bytes were reused too early"
    from nxsat import sim

    m = sim.load(sim.build_neff(sch.program, t, sch.constants), verify=True)
    xs = RNG.standard_normal((128, 512)).astype(np.float32)
    got = m.run({"x": xs})
    np.testing.assert_array_equal(got[0], xs.view(np.uint32))


def test_layout_keeps_a_value_per_row_as_a_column() -> None:
    """An operand repeated along the innermost dimension (softmax's max, broadcast over a row) is read as
    one column per tile: the free axis is that dimension alone, although a wider one makes fewer tiles
    (mha_block: 150 us per tile when the repeated value was loaded element by element)."""
    from nxsat.backend.elementwise import plan_layout

    rowwise = ((32, 768), (6, 128), (128, 1))
    repeated = ((32, 6), (6, 1), (128, 0))
    assert plan_layout((32, 6, 128), [rowwise, repeated], 128).free == (128,)  # two tiles of 128 rows
    assert plan_layout((32, 6, 128), [rowwise, rowwise], 128).cols > 128  # otherwise: one tile, wider


def _contiguous(shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((n, math.prod(shape[d + 1:])) for d, n in enumerate(shape))


@pytest.mark.parametrize("shape,cap,cols", [((32, 128, 1024), 2048, 2048), ((96, 16, 112, 112), 2048, 2048),
                                            ((1, 112, 112, 64), 1024, 896), ((31, 128, 1024), 1024, 1024)])
def test_large_clusters_take_wide_tiles(shape: tuple[int, ...], cap: int, cols: int) -> None:
    """A cluster that still makes 16 tiles of 2048 columns takes tiles up to that wide (half the
    instructions of 1024); a smaller one keeps 1024-column tiles, so enough tiles remain to overlap loads,
    compute and stores."""
    from nxsat.backend.elementwise import plan_layout

    lay = plan_layout(shape, [_contiguous(shape)], 128)
    assert (lay.cols_max, lay.cols, lay.chunk) == (cap, cols, False)


def test_a_wide_tiled_cluster_matches_the_interpreter() -> None:
    text = """HloModule wide
ENTRY main {
  a = f32[32,128,1024] parameter(0)
  b = f32[32,128,1024] parameter(1)
  s = f32[32,128,1024] multiply(a, b)
  ROOT r = f32[32,128,1024] add(s, a)
}
"""
    m = module_of(text)
    insts = compile_graph(m, load_target("trn1")).program.instrs
    # 4M elements in 2048-column tiles over 128 partitions: 16 tiles, two loads, two ops and a store each
    assert sum(1 for i in insts if i.opcode == "dma") == 16 * 3
    assert_device_matches(m, target="trn1")


NARROWED = """HloModule narrowed
ENTRY main {
  x = f32[256,512] parameter(0)
  c = f32[] constant(0.1)
  cb = f32[256,512] broadcast(c), dimensions={}
  s = f32[256,512] multiply(x, cb)
  z = f32[] constant(0)
  zb = f32[256,512] broadcast(z), dimensions={}
  r = f32[256,512] maximum(s, zb)
  ROOT y = bf16[256,512] convert(r)
}
"""


@pytest.mark.parametrize("kept", [False, True])
def test_a_convert_is_written_by_its_operand(kept: bool) -> None:
    """An fp32 value read only by its conversion to bf16 is written in bf16 by the instruction computing
    it (the engines compute in fp32 and round once as they write): no separate copy, the same bits. When
    the fp32 value is returned too, that instruction is made twice, once written in bf16 (no copy)."""
    both = "y = bf16[256,512] convert(r)\n  ROOT t = (f32[256,512], bf16[256,512]) tuple(r, y)"
    text = NARROWED if not kept else NARROWED.replace("ROOT y = bf16[256,512] convert(r)", both)
    m = module_of(text)
    prog = compile_graph(m, load_target("trn1")).program
    assert not [i for i in prog.instrs if i.opcode == "tensor_copy"]
    relus = [i for i in prog.instrs if i.opcode in ("tensor_scalar", "activation") and i.attrs.get("op0") == "max"]
    assert sorted(prog.tensors[i.operands[0].tensor].dtype.name for i in relus) == \
        (["bf16", "f32"] if kept else ["bf16"])
    inputs = {"x": (RNG.standard_normal((256, 512)) * 1e3).astype(np.float32)}
    assert_device_matches(m, inputs, target="trn1")


def test_tensor_scalar_steps_share_vectore_and_scalare() -> None:
    """A batch norm's per-channel steps (one value per partition: tensor_scalar) go to whichever of
    VectorE and ScalarE has had less work lately, so a chain of them uses both; the results are VectorE's
    (both compute in fp32)."""
    text = """HloModule bn
ENTRY main {
  x = f32[4,128,1024] parameter(0)
  a = f32[128] parameter(1)
  b = f32[128] parameter(2)
  ab = f32[4,128,1024] broadcast(a), dimensions={1}
  bb = f32[4,128,1024] broadcast(b), dimensions={1}
  s = f32[4,128,1024] add(x, ab)
  t = f32[4,128,1024] multiply(s, bb)
  u = f32[4,128,1024] subtract(t, ab)
  ROOT v = f32[4,128,1024] divide(u, bb)
}
"""
    m = module_of(text)
    insts = compile_graph(m, load_target("trn1")).program.instrs
    engines = {i.stream for i in insts if i.opcode == "tensor_scalar"}
    assert engines == {"dve", "act"}
    assert_device_matches(m, target="trn1")


@pytest.mark.parametrize("n,rows", [(64, 4), (256, 16), (1024, 64), (2048, 128)])
def test_a_small_vector_of_the_parameters_takes_rows_of_16(n: int, rows: int) -> None:
    """A batch norm's per-channel vectors, computed from the parameters for elementwise readers, go on
    fewer partitions in rows of 16 (a DMA descriptor per partition row); a vector another operator made
    or reads keeps the most partitions, the layout that forwards it in SBUF (a decoder's token)."""
    from nxsat.backend.elementwise import plan_layout

    flat = [((n, 1),)]
    assert plan_layout((n,), flat, 128, of_params=True).axes[-2:] == (rows, n // rows)
    assert plan_layout((n,), flat, 128).axes[-2:] == (min(n, 128), max(1, n // 128))



def test_a_small_cluster_reads_its_input_in_the_producers_partitions() -> None:
    """A small cluster whose input another tile stored 128 elements a partition (an [11, 128] tile) reads
    it so, 11 partitions of 128, instead of the most partitions (128 of 11 elements, each gathering from
    two of the producer's partitions): the forwarding pass then copies it on chip, where a store and a
    load through HBM cost ~3 us (gemma3_1b's rotary embeddings: 8,493.3 -> 8,331.0 us). A large cluster
    weighs the round trip against its engine time: of one step it follows too (8 tiles rather than 1), of
    40 steps it keeps the one wide tile."""
    from nxsat.backend.elementwise import FOLLOW_ELEMS, plan_layout

    flat = [((1408, 1),), ((1408, 1),)]
    assert plan_layout((1408,), flat, 128).axes[-2:] == (128, 11)
    assert plan_layout((1408,), flat, 128, stored=((0, 128),)).axes[-2:] == (11, 128)
    big = 128 * FOLLOW_ELEMS // 16
    assert plan_layout((big,), [((big, 1),)], 128, stored=((0, 128),)).axes[-2:] == (big // 128, 128)
    assert plan_layout((big,), [((big, 1),)], 128, stored=((0, 128),), steps=40).axes[-2] == 128


def test_a_small_cluster_follows_its_producer_even_in_a_few_more_tiles() -> None:
    """resnet_small's pooled features, [1, 256], held by the reduction as channel ``j * 128 + p`` on partition
    ``p``: the mean's cluster reads them so, in two [128, 1] tiles (an instruction more per operator), where
    one [128, 2] tile read them across partitions, through HBM (two round trips before the dense, 5.7 us).
    ResNet-50's [1, 2048] mean, divided and converted (two steps), follows in 16 tiles. Where following
    takes more steps than FOLLOW_STEPS (an operator's step per tile), the fewest tiles win."""
    from nxsat.backend.elementwise import FOLLOW_STEPS, plan_layout

    flat = [((256, 1),), ((256, 1),)]
    assert plan_layout((256,), flat, 128).axes == (128, 2)
    assert plan_layout((256,), flat, 128, stored=((0, 1),)).axes == (256, 1)
    assert plan_layout((2048,), [((2048, 1),)], 128, stored=((0, 1),), steps=2).axes == (2048, 1)
    n = 128 * (FOLLOW_STEPS // 2 + 1)
    assert plan_layout((n,), [((n, 1),)], 128, stored=((0, 1),), steps=2).axes == (128, FOLLOW_STEPS // 2 + 1)


def test_following_the_producers_partitions_forwards_more_and_runs_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on a JAX model: with the producers' partitions followed, more loads read SBUF and the
    simulated run is shorter (values still compared with XLA's by the corpus tests)."""
    from nxsat import driver
    from nxsat.backend import elementwise

    path = str(DATA / "jax" / "transformer_layer.hlo")
    opts = driver.CompileOptions(target="trn1", optlevel=1, auto_cast="matmult")
    follow = driver.compile_model(path, opts).report
    monkeypatch.setattr(elementwise, "FOLLOW_ELEMS", 0)
    monkeypatch.setattr(elementwise, "ROUND_TRIP", 0)
    most = driver.compile_model(path, opts).report
    assert follow["forwarded"]["loads"] > most["forwarded"]["loads"]
    assert follow["latency_us"] < most["latency_us"]

BN_PARAMS = """HloModule bn

ENTRY main {
  x = f32[1,512,6,6] parameter(0)
  w = f32[512,512,1,1] parameter(1)
  gamma = f32[512] parameter(2)
  var = f32[512] parameter(3)
  mean = f32[512] parameter(4)
  beta = f32[512] parameter(5)
  c = f32[1,512,6,6] convolution(x, w), window={size=1x1}, dim_labels=bf01_oi01->bf01
  eps = f32[] constant(0.001)
  epsb = f32[512] broadcast(eps), dimensions={}
  ve = f32[512] add(var, epsb)
  rs = f32[512] rsqrt(ve)
  sc = f32[512] multiply(rs, gamma)
  ms = f32[512] multiply(mean, sc)
  sh = f32[512] subtract(beta, ms)
  scb = f32[1,512,6,6] broadcast(sc), dimensions={1}
  shb = f32[1,512,6,6] broadcast(sh), dimensions={1}
  m = f32[1,512,6,6] multiply(c, scb)
  ROOT a = f32[1,512,6,6] add(m, shb)
}
"""


def test_a_batch_norm_from_the_parameters_loads_rows_not_channels() -> None:
    """ResNet-50's inference batch norms: scale and shift computed from four parameter vectors. Every
    vector moves in rows of 16 values (64-byte descriptors), none a descriptor per channel."""
    module = module_of(BN_PARAMS)
    inputs = random_inputs(module)
    inputs["in3"] = np.abs(inputs["in3"]) + 0.5  # a variance
    model = assert_device_matches(module, inputs, rtol=2e-5, atol_scale=2e-5)
    _, tl = model.profile()
    ins = model.program.instrs
    small = {ins[k].operands[1].tensor for k, tr in tl.transfers.items() if tr.descriptor_bytes < 64}
    assert not small & {"gamma", "var", "mean", "beta", "sc", "sh"}


TWO_SCALES = """HloModule two_scales
ENTRY main {
  x = f32[1,64,8,8] parameter(0)
  v1 = f32[64] parameter(1)
  v2 = f32[64] parameter(2)
  eps = f32[] constant(0.001)
  e = f32[64] broadcast(eps), dimensions={}
  a1 = f32[64] add(v1, e)
  r1 = f32[64] rsqrt(a1)
  a2 = f32[64] add(v2, e)
  r2 = f32[64] rsqrt(a2)
  b1 = f32[1,64,8,8] broadcast(r1), dimensions={1}
  m1 = f32[1,64,8,8] multiply(x, b1)
  b2 = f32[1,64,8,8] broadcast(r2), dimensions={1}
  ROOT m2 = f32[1,64,8,8] multiply(m1, b2)
}
"""


LATE_SCALE = """HloModule late_scale
ENTRY main {
  x = f32[64,8] parameter(0)
  w = f32[8,8] parameter(1)
  v1 = f32[64] parameter(2)
  v2 = f32[64] parameter(3)
  r1 = f32[64] rsqrt(v1)
  b1 = f32[64,8] broadcast(r1), dimensions={0}
  m1 = f32[64,8] multiply(x, b1)
  d1 = f32[64,8] dot(m1, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d2 = f32[64,8] dot(d1, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d3 = f32[64,8] dot(d2, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  r2 = f32[64] rsqrt(v2)
  b2 = f32[64,8] broadcast(r2), dimensions={0}
  ROOT m2 = f32[64,8] multiply(d3, b2)
}
"""


def test_a_value_from_the_parameters_is_computed_ahead_of_its_reader_not_first(monkeypatch) -> None:
    """A scale goes ``HOIST`` places ahead of its first reader, not to the front: ResNet-50's 53 batch
    norms' scales and shifts, all computed first, held its stem's image rows behind ~380 parameter loads
    (636.0 -> 604.0 us under unet-inference). With ``HOIST`` 3 here, the second scale goes just ahead of
    the last dot (three places before the product reading it: the dot, the scale, its broadcast)."""
    from nxsat.backend import elementwise, families  # noqa: F401 - registers every operator's tile form

    module = module_of(LATE_SCALE)
    monkeypatch.setattr(elementwise, "HOIST", 3)
    ops = [n.op for n in elementwise.lowering_order(module.entry.post_order()) if n.op in ("dot", "rsqrt")]
    assert ops == ["rsqrt", "dot", "dot", "rsqrt", "dot"]
    monkeypatch.setattr(elementwise, "HOIST", 10_000)  # far ahead: at the front
    ops = [n.op for n in elementwise.lowering_order(module.entry.post_order()) if n.op in ("dot", "rsqrt")]
    assert ops == ["rsqrt", "rsqrt", "dot", "dot", "dot"]
    monkeypatch.undo()
    inputs = random_inputs(module)
    inputs["in2"] = np.abs(inputs["in2"]) + 0.5
    inputs["in3"] = np.abs(inputs["in3"]) + 0.5
    assert_device_matches(module, inputs, rtol=2e-5, atol_scale=2e-5)


def test_values_from_the_parameters_are_computed_level_by_level() -> None:
    """Two batch norms' scales go to the front, both first steps before either second step: computed
    scale by scale they alternated two engines a step at a time (ResNet-50: 53 of them ahead of its
    stem, 6.4 us of its latency)."""
    from nxsat.backend import families  # noqa: F401 - registers every operator's tile form
    from nxsat.backend.elementwise import lowering_order

    module = module_of(TWO_SCALES)
    ops = [n.op for n in lowering_order(module.entry.post_order()) if n.op in ("add", "rsqrt")]
    assert ops == ["add", "add", "rsqrt", "rsqrt"]
    assert_device_matches(module, {"in0": np.ones((1, 64, 8, 8), np.float32),
                                   "in1": np.full(64, 3.0, np.float32), "in2": np.full(64, 0.5, np.float32)})


BIAS_OVER_WINDOWS = """HloModule bias
ENTRY e {
  s = f32[64,3,49,49] parameter(0)
  table = f32[2401,3] parameter(1)
  r = f32[49,49,3] reshape(table)
  t = f32[3,49,49] transpose(r), dimensions={2,0,1}
  b = f32[64,3,49,49] broadcast(t), dimensions={1,2,3}
  ROOT y = f32[64,3,49,49] add(s, b)
}
"""


def test_a_scattered_value_broadcast_over_the_tiles_is_compacted_once() -> None:
    """Swin's relative-position bias: a [3, 49, 49] view (stride 3) of a gathered table, broadcast over 64
    windows. Read through its view, each tile loaded it four bytes a descriptor, for every window (a Swin
    attention block 589.3 -> 248.9 us on trn1). The table's distinct elements are now copied once into a
    row-major scratch and the tiles read that: the table is read once, the copy in long runs."""
    m = module_of(BIAS_OVER_WINDOWS)
    table = input_loads(m, (2401, 3))
    assert sum(math.prod(i.reads[0].shape) for i in table) == 2401 * 3  # once, not once a window
    assert_device_matches(m, random_inputs(m))


BIASED = """HloModule biased
ENTRY main {
  v = f32[64] parameter(0)
  x = f32[128,256] parameter(1)
  e = f32[] constant(1e-05)
  eb = f32[64] broadcast(e), dimensions={}
  a = f32[64] add(v, eb)
  r = f32[64] rsqrt(a)
  c = f32[] constant(2.5)
  cb = f32[128,256] broadcast(c), dimensions={}
  p = f32[128,256] add(cb, x)
  t = f32[128,256] tanh(p)
  q = f32[128,256] subtract(x, cb)
  u = f32[128,256] exponential(q)
  s = f32[128,256] subtract(cb, x)
  w = f32[128,256] exponential(s)
  ROOT y = (f32[64], f32[128,256], f32[128,256], f32[128,256]) tuple(r, t, u, w)
}
"""


def test_a_number_added_before_an_activation_is_its_bias() -> None:
    """``rsqrt(v + eps)`` (a batch norm's), ``tanh(c + x)``, ``exp(x - c)`` and ``exp(c - x)``: ScalarE's
    ``func(scale * x + bias)`` adds the number itself, one instruction each, bit for bit as the two
    steps (``1 * x + b`` is ``x + b``, ``-1 * x + b`` is ``b - x``)."""
    m = module_of(BIASED)
    prog = compile_graph(m, load_target("trn1")).program
    acts = [i for i in prog.instrs if i.opcode == "activation"]
    assert sorted((i.attrs["func"], i.attrs["scale"], i.attrs["bias"]) for i in acts) == \
        [("exp", -1.0, 2.5), ("exp", 1.0, -2.5), ("rsqrt", 1.0, float(np.float32(1e-05))), ("tanh", 1.0, 2.5)]
    assert [i.opcode for i in prog.instrs if i.opcode != "dma"] == ["activation"] * 4
    inputs = {"v": np.abs(RNG.standard_normal(64)).astype(np.float32),
              "x": RNG.standard_normal((128, 256)).astype(np.float32)}
    assert_device_matches(m, inputs, target="trn1", rtol=0, atol_scale=0)

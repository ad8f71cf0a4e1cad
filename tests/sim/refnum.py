"""Reference numerics for the device-model tests, independent of the executor's casts.

Nothing here calls ``nxsat.sim.numerics`` or ``nxsat.dtypes.cast``: bf16 and tf32 round by integer
arithmetic on the fp32 bits, fp16 by numpy's IEEE conversion, fp8 by a search of the type's 256 codes
(nearest, ties to the even code; e4m3 saturating at +-448, e5m2 overflowing to infinity), float to
integer by truncation and saturation written out here, and fp32 from float64 by numpy's IEEE
conversion. ml_dtypes only names the storage types (and makes test inputs).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

FLOATS = ("f32", "bf16", "f16", "f8e4m3fn", "f8e5m2")
INTS = ("s32", "u32", "s16", "u16", "s8", "u8")
NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16, "f8e4m3fn": ml_dtypes.float8_e4m3fn,
      "f8e5m2": ml_dtypes.float8_e5m2, "s32": np.int32, "u32": np.uint32, "s16": np.int16, "u16": np.uint16,
      "s8": np.int8, "u8": np.uint8}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def f32(x: object) -> np.ndarray:
    """float64 (or exact) values rounded once to fp32 (numpy's IEEE round to nearest even)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float32)


def bf16(x: np.ndarray) -> np.ndarray:
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    out = rounded.view(ml_dtypes.bfloat16)
    return np.where(np.isnan(x), np.float32(np.nan), out.astype(np.float32)).astype(ml_dtypes.bfloat16)


_FP8: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}


def _fp8_table(name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(finite codes, their values, the NaN code) of an fp8 type."""
    if name not in _FP8:
        np_type = NP[name]
        codes = np.arange(256, dtype=np.uint8)
        vals = codes.view(np_type).astype(np.float64)
        ok = np.isfinite(vals)
        nan_code = int(np.array([np.nan], np.float32).astype(np_type).view(np.uint8)[0])
        _FP8[name] = (codes[ok], vals[ok], nan_code)
    return _FP8[name]


def fp8(x: np.ndarray, name: str) -> np.ndarray:
    codes, vals, nan_code = _fp8_table(name)
    x = np.asarray(x, np.float64).reshape(-1)
    top = float(vals.max())
    v = x.copy()
    if name == "f8e4m3fn":
        v = np.clip(v, -top, top)  # saturate (infinities too); NaN stays NaN
    d = np.abs(vals[None, :] - np.nan_to_num(v)[:, None])
    is_min = d == d.min(axis=1, keepdims=True)
    even = (codes % 2 == 0)[None, :]
    same_sign = np.signbit(vals)[None, :] == np.signbit(v)[:, None]
    # Nearest; a tie goes to the even code (+0 and -0 tie only at zero: keep the sign).
    best = np.argmax(is_min * 4 + even * 2 + same_sign, axis=1)
    out = codes[best].copy()
    if name == "f8e5m2":
        # Past max + half an ulp (a tie goes to the even code, infinity's side) is infinity.
        ulp = top - float(np.sort(vals)[-2])
        big = np.abs(v) >= top + ulp / 2
        inf = np.array([np.inf, -np.inf], np.float32).astype(NP[name]).view(np.uint8)
        out[big] = np.where(v[big] > 0, inf[0], inf[1])
    out[np.isnan(v)] = nan_code
    return out.view(NP[name])


def tf32(x: np.ndarray) -> np.ndarray:
    """10 explicit mantissa bits and fp32's exponent range: subnormals are spaced 2^-136."""
    x = np.asarray(x, np.float64)
    m, e = np.frexp(x)
    normal = np.ldexp(np.round(m * 2.0**11) / 2.0**11, e)  # np.round: half to even
    sub = np.round(x / 2.0**-136) * 2.0**-136
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(np.abs(x) < 2.0**-126, sub, normal).astype(np.float32)


def to_int(x: np.ndarray, name: str) -> np.ndarray:
    """Float to integer: truncate toward zero, saturate at the type's range, NaN gives 0."""
    info = np.iinfo(NP[name])
    flat = np.asarray(x, np.float64).reshape(-1)
    out = []
    for v in flat.tolist():
        if math.isnan(v):
            out.append(0)
        elif v >= info.max:
            out.append(int(info.max))
        elif v <= info.min:
            out.append(int(info.min))
        else:
            out.append(int(math.trunc(v)))
    return np.array(out, dtype=NP[name]).reshape(np.shape(x))


def wrap(values: object, name: str) -> np.ndarray:
    """Exact integers (Python ints) written to an integer type: two's complement wrap."""
    bits = np.iinfo(NP[name]).bits
    signed = name.startswith("s")
    flat = np.asarray(values, dtype=object).reshape(-1)
    out = []
    for v in flat.tolist():
        v = int(v) % (1 << bits)
        if signed and v >= 1 << (bits - 1):
            v -= 1 << bits
        out.append(v)
    return np.array(out, dtype=NP[name]).reshape(np.shape(values))


def cast(x: np.ndarray, name: str) -> np.ndarray:
    """fp32 values as the device stores them in ``name`` (one rounding, or truncation for integers)."""
    x = np.asarray(x, np.float32)
    if name == "f32":
        return x
    if name == "bf16":
        return bf16(x)
    if name == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if name in ("f8e4m3fn", "f8e5m2"):
        return fp8(x, name).reshape(x.shape)
    return to_int(x, name)


def widen(a: np.ndarray) -> np.ndarray:
    """A stored value read exactly as float64 (every storage type fits)."""
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return a.astype(np.int64).astype(np.float64)  # exact below 2^53
    with np.errstate(invalid="ignore"):  # signalling NaNs
        return a.astype(np.float64)


def f32_of(a: np.ndarray) -> np.ndarray:
    """An engine's input conversion: any stored value to fp32 (integers above 2^24 round)."""
    return f32(widen(a))


def same_bits(actual: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    """Identical values bit for bit (any NaN matches any NaN)."""
    a = np.asarray(actual)
    r = np.asarray(ref)
    assert a.dtype == r.dtype and a.shape == r.shape, (what, a.dtype, r.dtype, a.shape, r.shape)
    if a.dtype.kind in "iub":
        bad = a != r
        assert not bad.any(), (what, a[bad][:6], r[bad][:6], np.flatnonzero(bad)[:6])
        return
    an = np.isnan(a.astype(np.float32))
    rn = np.isnan(r.astype(np.float32))
    width = _UINT[a.dtype.itemsize]
    bad = ((a.view(width) != r.view(width)) & ~an) | (an != rn)
    assert not bad.any(), (what, a[bad][:6], r[bad][:6], np.flatnonzero(bad)[:6])


def _key(a: np.ndarray) -> np.ndarray:
    """A float's bits as an integer that counts ulps: consecutive values differ by one (+0 == -0)."""
    w = a.dtype.itemsize
    bits = a.view(_UINT[w]).astype(np.int64)
    sign = 1 << (8 * w - 1)
    mag = bits & (sign - 1)
    return np.where(bits & sign, -mag, mag)


def ulps(actual: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Distance in units in the last place of the (common) storage type; NaN positions must agree."""
    a = np.asarray(actual)
    r = np.asarray(ref)
    assert a.dtype == r.dtype and a.shape == r.shape, (a.dtype, r.dtype, a.shape, r.shape)
    an = np.isnan(a.astype(np.float32))
    rn = np.isnan(r.astype(np.float32))
    d = np.abs(_key(a) - _key(r))
    d = np.where(an | rn, np.where(an == rn, 0, 1 << 40), d)
    return d


def assert_ulps(actual: np.ndarray, ref: np.ndarray, max_ulps: int = 1, max_inexact: float = 1.0,
                what: str = "", inputs: np.ndarray | None = None) -> None:
    """Every value within ``max_ulps`` of ``ref`` in its storage type, NaN where ref is NaN, the same
    infinities, and at most a fraction ``max_inexact`` of values not bit-exact (a correctly rounded
    function matches an independent reference nearly everywhere)."""
    a = np.asarray(actual)
    r = np.asarray(ref)
    d = ulps(a, r)
    rf = r.astype(np.float32)
    inf = np.isinf(rf) | np.isinf(a.astype(np.float32))
    bad = (d > max_ulps) | (inf & (d != 0))
    if bad.any():
        at = np.flatnonzero(bad.reshape(-1))[:6]
        ins = "" if inputs is None else f" inputs {np.asarray(inputs).reshape(-1)[at].tolist()}"
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values off by more than {max_ulps} "
                             f"ulp: got {a.reshape(-1)[at].tolist()} want {r.reshape(-1)[at].tolist()}{ins}")
    inexact = float((d != 0).mean()) if d.size else 0.0
    assert inexact <= max_inexact, f"{what}: {inexact:.1%} of values not exact (allowed {max_inexact:.1%})"


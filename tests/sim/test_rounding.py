"""Where the device rounds, bit for bit (hypothesis): each engine computes in fp32 and rounds once, on
writing, to the destination type; TensorE products are exact and PSUM accumulates in fp32.

The references here do not use the executor's cast (tests/sim/refnum.py): bf16 and tf32 round by
integer arithmetic on the fp32 bits, fp16 by numpy's IEEE conversion, and fp8 by a search of the 256
codes of the type (nearest, ties to the even code; e4m3 saturating at +-448, e5m2 overflowing to
infinity).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nxsim_progs import build
from refnum import bf16 as _bf16
from refnum import cast, same_bits
from refnum import fp8 as _fp8
from refnum import tf32 as _tf32

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
N = 32
F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
FINITE = st.floats(-1e30, 1e30, width=32)
ROWS = st.lists(F32, min_size=N, max_size=N)


def test_reference_casts_agree_with_the_documented_corner_cases() -> None:
    """The references themselves: e4m3 saturates, e5m2 overflows, ties go to even."""
    x = np.array([448, 464, 480, 1e6, -np.inf, 57344, 61439, 61440, 1.0 + 2.0**-4], np.float32)
    e4 = _fp8(x, "f8e4m3fn").astype(np.float32)
    assert list(e4[:5]) == [448, 448, 448, 448, -448]
    e5 = _fp8(x, "f8e5m2").astype(np.float32)
    assert e5[5] == 57344 and e5[6] == 57344 and np.isinf(e5[7])
    assert e4[8] == 1.0  # 1 + 2^-4 lies halfway between 1 and 1.125: the even code
    assert _bf16(np.array([1.0 + 2.0**-8], np.float32)).astype(np.float32)[0] == 1.0
    assert _tf32(np.array([1.0 + 2.0**-11], np.float32))[0] == 1.0
    assert _tf32(np.array([2.0**-149, 3 * 2.0**-137], np.float32)).tolist() == [0.0, 2 * 2.0**-136]


ENGINES = """
.isa 1.0
.target trn1
input   x: f32[1, {n}]
input   w: f32[1, {n}]
output  y: {dt}[1, {n}]
output  z: {dt}[1, {n}]
output  e: {dt}[1, {n}]
output  c: {dt}[1, {n}]
output  s: {dt}[1, 1]
sbuf    xs: f32[1, {n}]
sbuf    ws: f32[1, {n}]
sbuf    ys: {dt}[1, {n}]
sbuf    zs: {dt}[1, {n}]
sbuf    es: {dt}[1, {n}]
sbuf    cs: {dt}[1, {n}]
sbuf    ss: {dt}[1, 1]
sem     ld
sem     done
q0    dma            xs, x, signal=ld
q1    dma            ws, w, signal=ld
dve   tensor_scalar  ys, xs, op0=mul, scalar0={s0}, op1=add, scalar1={s1}, wait=ld>=2, signal=done
pool  tensor_tensor  zs, xs, ws, op=mul, wait=ld>=2, signal=done
act   activation     es, xs, func=exp, scale={scale}, bias={bias}, accum=ss, wait=ld>=2, signal=done
act   tensor_copy    cs, xs, signal=done
q2    dma            y, ys, wait=done>=4
q2    dma            z, zs
q2    dma            e, es
q2    dma            c, cs
q2    dma            s, ss
"""


@SETTINGS
@given(dtype=st.sampled_from(["f32", "bf16", "f16", "f8e4m3fn", "f8e5m2"]), x=ROWS, w=ROWS,
       s0=F32, s1=F32, scale=st.floats(-4, 4, width=32), bias=st.floats(-8, 8, width=32))
def test_engines_compute_in_fp32_and_round_once(dtype: str, x: list[float], w: list[float], s0: float,
                                                 s1: float, scale: float, bias: float) -> None:
    m = build(ENGINES.format(n=N, dt=dtype, s0=repr(s0), s1=repr(s1), scale=repr(scale), bias=repr(bias)))
    xa = np.array([x], np.float32)
    wa = np.array([w], np.float32)
    y, z, e, c, s = m.run({"x": xa, "w": wa})
    f = np.float32
    with np.errstate(all="ignore"):
        ts = (xa * f(s0)) + f(s1)  # two fp32 roundings, none to the output type in between
        t = xa * f(scale) + f(bias)
        ex = np.exp(t.astype(np.float64)).astype(np.float32)
        acc = np.add.reduce(ex, axis=1, keepdims=True, dtype=np.float32)
        prod = xa * wa
    same_bits(y, cast(ts, dtype))
    same_bits(z, cast(prod, dtype))
    same_bits(e, cast(ex, dtype))
    same_bits(c, cast(xa, dtype))
    # The accumulated sum is of the fp32 results (before their rounding to the output type).
    np.testing.assert_allclose(s.astype(np.float64), cast(acc, dtype).astype(np.float64), rtol=2.0**-20,
                               equal_nan=True)


PSUM = """
.isa 1.0
.target trn1
input   a: {dt}[2, {n}]
input   b: {dt}[2, {n}]
output  lo: {out}[1, {n}]
output  hi: f32[1, {n}]
sbuf    as: {dt}[1, 2, {n}]
sbuf    bs: {dt}[1, 2, {n}]
sbuf    los: {out}[1, {n}]
sbuf    his: f32[1, {n}]
psum    acc: f32[{n}, {n}]
sem     ld
sem     mm
sem     ev
q0    dma          as, a.reshape(1, 2, {n}), signal=ld
q1    dma          bs, b.reshape(1, 2, {n}), signal=ld
pe    matmul       acc, as[:, 0, :], bs[:, 0, :], start=true{prec}, wait=ld>=2
pe    matmul       acc, as[:, 1, :], bs[:, 1, :], stop=true{prec}, signal=mm
act   tensor_copy  los, acc[0:1, :], wait=mm>=1, signal=ev
act   tensor_copy  his, acc[0:1, :], signal=ev
q2    dma          lo, los, wait=ev>=2
q2    dma          hi, his
"""


@SETTINGS
@given(dtype=st.sampled_from(["bf16", "f16", "f8e4m3fn", "f8e5m2", "tf32"]),
       out=st.sampled_from(["bf16", "f16", "f8e4m3fn"]),
       a=st.lists(st.floats(-1e4, 1e4, width=32), min_size=2 * N, max_size=2 * N),
       b=st.lists(st.floats(-1e4, 1e4, width=32), min_size=2 * N, max_size=2 * N))
def test_psum_accumulates_exact_products_in_fp32(dtype: str, out: str, a: list[float], b: list[float]) -> None:
    """K = 1 per matmul: each product is exact (operands of at most 11 significant bits), the two
    accumulate with one fp32 rounding in PSUM, and evacuation rounds once to the output type."""
    storage = "f32" if dtype == "tf32" else dtype
    prec = ", precision=tf32" if dtype == "tf32" else ""
    m = build(PSUM.format(n=N, dt=storage, out=out, prec=prec))
    av = np.array(a, np.float32).reshape(2, N)
    bv = np.array(b, np.float32).reshape(2, N)
    if dtype == "tf32":
        ar, br = _tf32(av), _tf32(bv)
        feed_a, feed_b = av, bv  # the device rounds the fp32 operands itself
    else:
        ar, br = cast(av, dtype).astype(np.float32), cast(bv, dtype).astype(np.float32)
        feed_a, feed_b = cast(av, dtype), cast(bv, dtype)
    lo, hi = m.run({"a": feed_a, "b": feed_b})
    # acc[0, j] = a[0, 0] * b[0, j] + a[1, 0] * b[1, j]: exact products, one fp32 addition.
    with np.errstate(all="ignore"):
        p0 = (ar[0, 0].astype(np.float64) * br[0].astype(np.float64)).astype(np.float32)
        p1 = (ar[1, 0].astype(np.float64) * br[1].astype(np.float64)).astype(np.float32)
        ref = (p0 + p1).reshape(1, N)
    # The sign of a zero sum is not modeled (the array's accumulator start is not published): +0 == -0.
    same_bits(hi + np.float32(0), ref + np.float32(0))
    same_bits(lo.astype(np.float32) + np.float32(0), cast(ref, out).astype(np.float32) + np.float32(0))


PRODUCT = """
.isa 1.0
.target trn1
input   a: f32[128, 2]
input   b: f32[128, 3]
output  y: f32[2, 3]
sbuf    as: f32[128, 2]
sbuf    bs: f32[128, 3]
sbuf    ys: f32[2, 3]
psum    acc: f32[2, 3]
sem     ld
sem     mm
q0    dma          as, a, signal=ld
q1    dma          bs, b, signal=ld
pe    matmul       acc, as, bs, start=true, stop=true, wait=ld>=2, signal=mm
act   tensor_copy  ys, acc, wait=mm>=1, signal=mm
q2    dma          y, ys, wait=mm>=2
"""


def test_one_matmul_rounds_its_product_once() -> None:
    """A matmul's product over 128 partitions is exact and rounded once to fp32, whatever the host's
    BLAS does: 2^30, 126 ones and -2^30 sum to 126, where fp32 summation loses every one added to a
    partial sum of 2^30 (half its ulp is 64), in any order in which the two do not meet first; and
    128 terms of 1 + 2^-23 with one of 2^-24 round once."""
    a = np.ones((128, 2), np.float32)
    b = np.zeros((128, 3), np.float32)
    b[:, 0] = 1.0
    b[0, 0], b[127, 0] = 2.0**30, -(2.0**30)
    b[:, 1] = np.float32(1 + 2.0**-23)
    b[0, 1] = np.float32(2.0**-24)
    b[:, 2] = np.arange(128, dtype=np.float32) * np.float32(0.1)
    (y,) = build(PRODUCT).run({"a": a, "b": b})
    want = (a.T.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    same_bits(y, want)
    assert y[0, 0] == 126.0 and y[1, 0] == 126.0


def test_tensor_reduce_of_bf16_accumulates_in_fp32() -> None:
    """256 copies of 1 and one 2^-8 sum to 256 + 2^-8 in fp32 (a bf16 accumulator would stop at
    256, where 1 is half an ulp); the single rounding to bf16 then gives 256."""
    text = """
.isa 1.0
.target trn1
input   x: bf16[1, 257]
output  y: f32[1, 1]
sbuf    xs: bf16[1, 257]
sbuf    ys: f32[1, 1]
sem     s
q0    dma            xs, x, signal=s
dve   tensor_reduce  ys, xs, op=add, wait=s>=1, signal=s
q0    dma            y, ys, wait=s>=2
"""
    x = np.ones((1, 257), np.float32)
    x[0, 0] = 2.0**-8
    (y,) = build(text).run({"x": x.astype(ml_dtypes.bfloat16)})
    assert y[0, 0] == np.float32(256 + 2.0**-8)

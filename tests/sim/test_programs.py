"""Hand-written device programs (text form) against numpy, in fp32 and each low-precision type."""

from __future__ import annotations

import numpy as np
import pytest
from nxsim_progs import EXAMPLES, assert_close_dtype, build, rounded

from nxsat import dtypes as dt
from nxsat import sim
from nxsat.diagnostics import NxsatError, Warnings

FLOATS = ["f32", "bf16", "f16", "f8e4m3fn", "f8e5m2"]
# Spacing of the smallest subnormals: below it a relative tolerance means nothing.
TINY = {"f32": 2.0**-149, "bf16": 2.0**-133, "f16": 2.0**-24, "f8e4m3fn": 2.0**-9, "f8e5m2": 2.0**-16}

MATMUL = """
# C[128, 256] = A[128, 384] @ B[384, 256]: three K tiles accumulate in one PSUM bank.
.isa 1.0
.target trn1
input   a: {dt}[128, 384]
input   b: {dt}[384, 256]
output  c: f32[128, 256]
sbuf    as: {dt}[128, 384]
sbuf    at: {dt}[128, 3, 128]
sbuf    bs: {dt}[128, 3, 256]
sbuf    cs: f32[128, 256]
psum    tp: f32[128, 3, 128]
psum    acc: f32[128, 256]
sem     ld_a
sem     ld_b
sem     tr
sem     cp
sem     mm
sem     ev

q0    dma          as, a, signal=ld_a
q1    dma          bs[:, 0, :], b[0:128, :], signal=ld_b
q2    dma          bs[:, 1, :], b[128:256, :], signal=ld_b
q3    dma          bs[:, 2, :], b[256:384, :], signal=ld_b
pe    transpose    tp[:, 0, :], as[:, 0:128], wait=ld_a>=1
pe    transpose    tp[:, 1, :], as[:, 128:256]
pe    transpose    tp[:, 2, :], as[:, 256:384], signal=tr
dve   tensor_copy  at, tp, wait=tr>=1, signal=cp
pe    matmul       acc, at[:, 0, :], bs[:, 0, :], start=true{prec}, wait=cp>=1, wait=ld_b>=3
pe    matmul       acc, at[:, 1, :], bs[:, 1, :]{prec}
pe    matmul       acc, at[:, 2, :], bs[:, 2, :], stop=true{prec}, signal=mm
act   tensor_copy  cs, acc, wait=mm>=1, signal=ev
q0    dma          c, cs, wait=ev>=1
"""

SOFTMAX = """
.isa 1.0
.target trn1
input   x: {dt}[128, 512]
output  y: {dt}[128, 512]
sbuf    xs: {dt}[128, 512]
sbuf    mx: f32[128, 1]
sbuf    nmx: f32[128, 1]
sbuf    ex: f32[128, 512]
sbuf    sm: f32[128, 1]
sbuf    rs: f32[128, 1]
sbuf    ys: {dt}[128, 512]
sem     ld
sem     neg
sem     out
q0    dma            xs, x, signal=ld
dve   tensor_reduce  mx, xs, op=max, wait=ld>=1
dve   tensor_scalar  nmx, mx, op0=mul, scalar0=-1.0, signal=neg
act   activation     ex, xs, func=exp, bias=nmx, accum=sm, wait=neg>=1
act   activation     rs, sm, func=reciprocal
act   tensor_scalar  ys, ex, op0=mul, scalar0=rs, signal=out
q0    dma            y, ys, wait=out>=1
"""

LAYERNORM = """
.isa 1.0
.target trn1
input   x: {dt}[128, 768]
const   gamma: {dt}[1, 768]
const   beta: {dt}[1, 768]
output  y: {dt}[128, 768]
sbuf    xs: {dt}[128, 768]
sbuf    g: {dt}[128, 768]
sbuf    bt: {dt}[128, 768]
sbuf    st: f32[128, 2, 6]
sbuf    mv: f32[128, 2]
sbuf    rstd: f32[128, 1]
sbuf    xn: f32[128, 768]
sbuf    ys: {dt}[128, 768]
sem     ld
sem     stat
sem     norm
sem     done
q0    dma            xs, x, signal=ld
q1    dma            g, gamma.broadcast(0, 128), signal=ld
q2    dma            bt, beta.broadcast(0, 128), signal=ld
dve   bn_stats       st[:, 0, :], xs[:, 0:384], wait=ld>=3
dve   bn_stats       st[:, 1, :], xs[:, 384:768]
dve   bn_aggr        mv, st.reshape(128, 12), signal=stat
act   activation     rstd, mv[:, 1:2], func=rsqrt, bias=1e-05, wait=stat>=1, signal=norm
dve   tensor_scalar  xn, xs, op0=sub, scalar0=mv[:, 0:1], op1=mul, scalar1=rstd, wait=norm>=1
dve   tensor_tensor  xn, xn, g, op=mul
dve   tensor_tensor  ys, xn, bt, op=add, signal=done
q0    dma            y, ys, wait=done>=1
"""

GATHER = """
.isa 1.0
.target trn1
input   table: {dt}[1000, 64]
input   ids: s32[128, 1]
output  rows: {dt}[128, 64]
sbuf    idx: s32[128, 1]
sbuf    g: {dt}[128, 64]
sem     ld
sem     got
q0    dma            idx, ids, signal=ld
pool  gather         g, table, idx, wait=ld>=1, signal=got
q0    dma            rows, g, wait=got>=1
"""


def _inputs(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
    return rounded(rng.standard_normal(shape) * scale, dtype)


@pytest.mark.parametrize("dtype", [*FLOATS, "tf32"])
def test_tiled_matmul_with_k_accumulation(dtype: str) -> None:
    rng = np.random.default_rng(1)
    storage = "f32" if dtype == "tf32" else dtype
    prec = ", precision=tf32" if dtype == "tf32" else ""
    m = build(MATMUL.format(dt=storage, prec=prec))
    a = _inputs(rng, (128, 384), storage)
    b = _inputs(rng, (384, 256), storage)
    (c,) = m.run({"in0": a, "in1": b})
    assert c.dtype == np.float32
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if dtype == "tf32":
        a64, b64 = dt.round_tf32(a.astype(np.float32)).astype(np.float64), dt.round_tf32(b).astype(np.float64)
    ref = a64 @ b64
    bound = 384 * 2.0**-24 * (np.abs(a64) @ np.abs(b64))  # fp32 accumulation over K
    assert np.all(np.abs(c - ref) <= bound)
    if dtype == "tf32":
        exact = a.astype(np.float64) @ b.astype(np.float64)
        # tf32 really rounded the operands: much nearer the tf32 product than the fp32 one, and
        # as near the fp32 one as 10-bit mantissas allow.
        assert np.max(np.abs(c - exact)) > 20 * np.max(np.abs(c - ref))
        assert np.max(np.abs(c - exact) / (np.abs(a) @ np.abs(b))) < 2.0**-10


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax(dtype: str) -> None:
    rng = np.random.default_rng(2)
    m = build(SOFTMAX.format(dt=dtype))
    x = _inputs(rng, (128, 512), dtype, 2.0)
    (y,) = m.run({"x": x})
    assert y.dtype == dt.by_name(dtype).np
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    if dtype == "f32":
        np.testing.assert_allclose(y, ref, rtol=2e-6, atol=0)
    else:
        assert_close_dtype(y, ref, dtype, ulps=1.0, atol=TINY[dtype])
        # ... and most values are exactly the correctly rounded reference.
        assert np.mean(y.astype(np.float64) == rounded(ref, dtype).astype(np.float64)) > 0.95


@pytest.mark.parametrize("dtype", FLOATS)
def test_layernorm_via_bn_stats(dtype: str) -> None:
    rng = np.random.default_rng(3)
    if dtype == "f32":
        x = (rng.standard_normal((128, 768)) * 3 + 1).astype(np.float32)
    else:
        x = _inputs(rng, (128, 768), dtype, 1.5)
    gamma = _inputs(rng, (1, 768), dtype, 0.5)
    beta = _inputs(rng, (1, 768), dtype, 0.5)
    m = build(LAYERNORM.format(dt=dtype), {"gamma": gamma, "beta": beta})
    (y,) = m.run({"in0": x})
    x64 = x.astype(np.float64)
    xn = (x64 - x64.mean(axis=1, keepdims=True)) / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5)
    ref = xn * gamma.astype(np.float64) + beta.astype(np.float64)
    scale = np.max(np.abs(ref))
    if dtype == "f32":
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * scale)
    else:
        # fp32 inside (about 1e-6 relative to the products), one rounding to the output type.
        assert_close_dtype(y, ref, dtype, ulps=1.0, atol=max(TINY[dtype], 2e-6 * scale))


@pytest.mark.parametrize("dtype", FLOATS)
def test_gather(dtype: str) -> None:
    rng = np.random.default_rng(4)
    m = build(GATHER.format(dt=dtype))
    table = _inputs(rng, (1000, 64), dtype)
    ids = rng.integers(0, 1000, (128, 1)).astype(np.int32)
    w = Warnings()
    (rows,) = m.run({"table": table, "ids": ids}, warnings=w)
    assert len(w) == 0
    np.testing.assert_array_equal(rows.view(np.uint8), table[ids[:, 0]].view(np.uint8))


def test_gather_out_of_bounds_keeps_running_with_neuron_warning() -> None:
    m = build(GATHER.format(dt="f32"))
    table = np.arange(64000, dtype=np.float32).reshape(1000, 64) + 1
    ids = np.arange(128, dtype=np.int32).reshape(128, 1)
    ids[5, 0] = 1000
    ids[9, 0] = -3
    w = Warnings()
    (rows,) = m.run({"table": table, "ids": ids}, warnings=w)
    msgs = [x.format() for x in w]
    assert len(msgs) == 1 and "NCC_WRUN001" in msgs[0]
    assert "failed to run scatter/gather (indirect memory copy" in msgs[0]
    assert "due to out-of-bound access" in msgs[0]
    assert "2 index(es)" in msgs[0]
    ok = np.ones(128, bool)
    ok[[5, 9]] = False
    np.testing.assert_array_equal(rows[ok], table[ids[ok, 0]])
    assert not rows[5].any() and not rows[9].any()  # the defined result: zero rows


SCATTER = """
.isa 1.0
.target trn1
input   upd: f32[128, 8]
input   ids: s32[128, 1]
output  t: f32[16, 8]
sbuf    u: f32[128, 8]
sbuf    idx: s32[128, 1]
sbuf    z: f32[16, 8]
sem     ld
sem     zs
sem     zero
sem     done
q0    dma      u, upd, signal=ld
q1    dma      idx, ids, signal=ld
dve   memset   z, value=0.0, signal=zs
q2    dma      t, z, wait=zs>=1, signal=zero
pool  scatter  t, idx, u, mode={mode}, wait=ld>=2, wait=zero>=1, signal=done
"""


@pytest.mark.parametrize("mode", ["add", "set"])
def test_scatter(mode: str) -> None:
    rng = np.random.default_rng(5)
    m = build(SCATTER.format(mode=mode))
    upd = rng.standard_normal((128, 8)).astype(np.float32)
    ids = rng.integers(0, 17, (128, 1)).astype(np.int32)  # 16 is out of range
    w = Warnings()
    (t,) = m.run({"upd": upd, "ids": ids}, warnings=w)
    valid = ids[:, 0] < 16
    ref = np.zeros((16, 8), np.float32)
    if mode == "add":
        np.add.at(ref, ids[valid, 0], upd[valid])
        np.testing.assert_allclose(t, ref, rtol=1e-6, atol=1e-6)
    else:
        for p in np.flatnonzero(valid):  # the last write in (partition, index) order wins
            ref[ids[p, 0]] = upd[p]
        np.testing.assert_array_equal(t, ref)
    assert (len(w) == 1) == (not valid.all())


ELEMENTWISE = """
.isa 1.0
.target trn1
input   a: f32[128, 64]
input   b: f32[128, 64]
output  y: f32[5, 128, 64]
output  k: s32[128, 64]
sbuf    as: f32[128, 64]
sbuf    bs: f32[128, 64]
sbuf    r: f32[128, 5, 64]
sbuf    i: s32[128, 64]
sbuf    m: f32[128, 64]
sem     ld
sem     io
sem     done
q0    dma            as, a, signal=ld
q1    dma            bs, b, signal=ld
pool  iota           i, base=3, channel_multiplier=64, steps=(1), signal=io
dve   tensor_tensor  r[:, 0, :], as, bs, op=max, wait=ld>=2
dve   tensor_tensor  r[:, 1, :], as, bs, op=gt
dve   select         r[:, 2, :], r[:, 1, :], as, bs
dve   tensor_copy    m, i, wait=io>=1
dve   tensor_scalar  r[:, 4, :], m, op0=rsub, scalar0=1.0, op1=pow, scalar1=2.0, signal=done
act   activation     r[:, 3, :], as, func=gelu, scale=2.0, bias=-0.5, wait=ld>=2, signal=done
pool  tensor_scalar  i, i, op0=shl, scalar0=1.0, op1=xor, scalar1=5.0, wait=done>=2, signal=done
q2    dma            y.permute(1, 0, 2), r, wait=done>=3
q3    dma            k, i, wait=done>=3
"""


def test_elementwise_and_integer_ops() -> None:
    m = build(ELEMENTWISE)
    rng = np.random.default_rng(6)
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32)
    y, k = m.run({"a": a, "b": b})
    np.testing.assert_array_equal(y[0], np.maximum(a, b))
    np.testing.assert_array_equal(y[1], (a > b).astype(np.float32))
    np.testing.assert_array_equal(y[2], np.where(a > b, a, b))
    from scipy.special import erf

    t = 2.0 * a.astype(np.float64) - 0.5
    np.testing.assert_allclose(y[3], 0.5 * t * (1 + erf(t / np.sqrt(2))), rtol=1e-6, atol=1e-7)
    iota = 3 + 64 * np.arange(128)[:, None] + np.arange(64)[None, :]
    np.testing.assert_allclose(y[4], (1.0 - iota) ** 2, rtol=1e-7)
    np.testing.assert_array_equal(k, ((iota << 1) ^ 5).astype(np.int32))


def test_fp8_e4m3_saturates_on_output_and_bf16_rounds_to_nearest_even() -> None:
    text = """
.isa 1.0
.target trn1
input   x: f32[1, 8]
output  e4: f8e4m3fn[1, 8]
output  e5: f8e5m2[1, 8]
output  h: bf16[1, 8]
sbuf    xs: f32[1, 8]
sbuf    a: f8e4m3fn[1, 8]
sbuf    b: f8e5m2[1, 8]
sbuf    c: bf16[1, 8]
sem     ld
sem     done
q0    dma          xs, x, signal=ld
act   tensor_copy  a, xs, wait=ld>=1
act   tensor_copy  b, xs
act   tensor_copy  c, xs, signal=done
q0    dma          e4, a, wait=done>=1
q1    dma          e5, b, wait=done>=1
q2    dma          h, c, wait=done>=1
"""
    m = build(text)
    x = np.array([[1000.0, -1000.0, 448.0, 470.0, 1e6, np.nan, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8]], np.float32)
    e4, e5, h = m.run({"x": x})
    e4 = e4.astype(np.float32)
    np.testing.assert_array_equal(e4[0, :5], [448, -448, 448, 448, 448])  # saturated, not NaN
    assert np.isnan(e4[0, 5])
    assert np.isinf(e5.astype(np.float32)[0, 4])  # e5m2 has infinities and overflows to them
    # bf16 round to nearest even: 1 + 2^-8 is a tie -> 1.0; 1 + 3*2^-8 -> 1 + 2^-6... up to 1 + 2^-7 * 2
    hf = h.astype(np.float32)[0]
    assert hf[6] == 1.0 and hf[7] == np.float32(1.0 + 2.0**-6)


@pytest.mark.parametrize("name", ["matmul", "softmax", "layernorm", "gather"])
def test_examples_assemble_and_run(name: str) -> None:
    """The shipped examples assemble and compute what their comments say."""
    text = (EXAMPLES / f"{name}.nxs").read_text()
    rng = np.random.default_rng(7)
    consts = {}
    if name == "layernorm":
        consts = {"gamma": rng.standard_normal((1, 768)).astype(np.float32),
                  "beta": rng.standard_normal((1, 768)).astype(np.float32)}
    m = sim.load(sim.assemble(text, f"{name}.nxs", consts))
    inputs = {}
    for i, t in enumerate(m.program.inputs()):
        if t.dtype.is_int:
            inputs[f"in{i}"] = rng.integers(0, 1000, t.shape).astype(t.dtype.np)
        else:
            inputs[f"in{i}"] = rounded(rng.standard_normal(t.shape), t.dtype.name)
    (out,) = m.run(inputs)
    v = [inputs[f"in{i}"].astype(np.float64) for i in range(len(inputs))]
    if name == "matmul":
        ref = v[0] @ v[1]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    elif name == "softmax":
        e = np.exp(v[0] - v[0].max(1, keepdims=True))
        assert_close_dtype(out, e / e.sum(1, keepdims=True), "bf16")
    elif name == "layernorm":
        x = v[0]
        xn = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
        ref = xn * consts["gamma"] + consts["beta"]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(out, inputs["in0"][inputs["in1"][:, 0]])


ARCTAN = """
.isa {v}
.target trn1
input   x: f32[128, 64]
output  y: f32[128, 64]
sbuf    xs: f32[128, 64]
sbuf    ys: f32[128, 64]
sem     ld
sem     done
q0    dma         xs, x, signal=ld
act   activation  ys, xs, func=arctan, scale=2.0, bias=-0.0, wait=ld>=1, signal=done
q1    dma         y, ys, wait=done>=1
"""


def test_arctan_is_correctly_rounded_and_needs_isa_1_1() -> None:
    """ISA 1.1's arctan (NKI's ScalarE has it): the fp32 result of arctan(scale * x + bias) correctly
    rounded, signed zeros and infinities as IEEE; a 1.0 program that names it is refused."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((128, 64)) * np.exp2(rng.integers(-30, 30, (128, 64)))).astype(np.float32)
    x[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e38]
    y = build(ARCTAN.format(v="1.1")).run({"x": x})[0]
    t = (np.float32(2.0) * x).astype(np.float64)
    want = np.arctan(t).astype(np.float32)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    assert np.signbit(y[0, 1]) and y[0, 2] == np.float32(np.pi / 2) and np.isnan(y[0, 4])
    with pytest.raises(NxsatError) as e:
        build(ARCTAN.format(v="1.0"))
    assert e.value.code == "NCC_EASM002" and "func=arctan is ISA 1.1" in e.value.message

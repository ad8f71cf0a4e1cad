"""The device model against the published hardware: one test per documented behaviour, each naming the
document (the target spec's ``sources`` list them) and checking what the model does with it."""

from __future__ import annotations

import numpy as np
import pytest
from nxsim_progs import build

from nxsat import sim
from nxsat.diagnostics import NxsatError, Warnings


def _busy(text: str, stream: str) -> float:
    s, _ = build(text).profile()
    return s["engines"][stream]["busy_ns"]


def _dur(text: str, opcode: str) -> float:
    """Nanoseconds the (last) instruction with this opcode occupies its engine."""
    m = build(text)
    _, tl = m.profile()
    return [x.end - x.start for x in tl.slices if m.linked.instrs[x.instr].op.name == opcode][-1]


def _refused(text: str) -> NxsatError:
    with pytest.raises(NxsatError) as e:
        build(text)
    return e.value


# --- trn2 (NeuronCore-v3): trainium2_arch ---------------------------------------------------------------

def test_trn2_engine_clocks() -> None:
    """trainium2_arch, Compute Engine Specifications: TensorE 2.4, VectorE 0.96, ScalarE and GpSimd 1.2 GHz."""
    t = sim.load_target("trn2")
    assert {k: t.engines[k].clock_ghz for k in ("pe", "dve", "act", "pool")} == \
        {"pe": 2.4, "dve": 0.96, "act": 1.2, "pool": 1.2}
    assert not any(a.key.startswith("engines.") and a.key != "engines.cc" and a.source == "neuroncore-v3.json"
                   and a.key != "engines.pe.idle_restart_cycles" for a in t.assumptions)


COPY = """.isa 1.1
.target {t}
.lnc 1
sbuf a: {dt}[128, 4096]
sbuf b: {dt}[128, 2048]
sem s
dve memset a, value=1.0, signal=s
dve tensor_copy b, {src}, wait=s>=1
"""


@pytest.mark.parametrize("dt,src,speedup", [("bf16", "a[:, 0:2048]", 4), ("f16", "a[:, 0:2048]", 4),
                                            ("f32", "a[:, 0:2048]", 1), ("bf16", "a[:, 0:4096:2]", 2)])
def test_trn2_vector_engine_performance_mode(dt: str, src: str, speedup: int) -> None:
    """trainium2_arch, Vector Engine Performance Mode: tensor_copy of bf16/fp16 in SBUF runs 4x faster with a
    contiguous inner dimension, 2x without; fp32 at v2's rate. trn1 has no such mode."""
    n = 2048
    assert _dur(COPY.format(t="trn2", dt=dt, src=src), "tensor_copy") == pytest.approx(n / speedup / 0.96, abs=0.002)
    assert _dur(COPY.format(t="trn1", dt=dt, src=src), "tensor_copy") == pytest.approx(n / 1.12, abs=0.002)


PORTS = """.isa 1.1
.target {t}
.lnc 1
sbuf a: f32[128, 512]
sbuf b: f32[128, 512]
psum p: f32[128, 512]
psum q: f32[128, 512]
sem s
act memset p, signal=s
dve memset q, signal=s
act activation a, p, func=exp, wait=s>=2
dve tensor_copy b, q, wait=s>=2
"""


def test_trn2_lifts_the_psum_port_conflict() -> None:
    """trainium2_arch, Data Movement Updates: VectorE and ScalarE access PSUM in parallel on v3 (not on v2)."""
    def overlap(t: str) -> bool:
        m = build(PORTS.format(t=t))
        _, tl = m.profile()
        spans = {s: [(x.start, x.end) for x in tl.slices if x.stream == s][-1] for s in ("act", "dve")}
        (a0, a1), (b0, b1) = spans["act"], spans["dve"]
        return a0 < b1 and b0 < a1

    assert overlap("trn2") and not overlap("trn1")
    assert sim.load_target("trn2").spec["port_conflicts"] == []


TRANSPOSE = """.isa 1.1
.target {t}
.lnc 1
input x: {dt}[64, 32]
output y: {out}[32, 64]
sbuf a: {dt}[64, 32]
psum p: {out}[32, 64]
sbuf b: {out}[32, 64]
sem s
q0 dma a, x, signal=s
pe transpose p, a, wait=s>=1, signal=s
dve tensor_copy b, p, wait=s>=2, signal=s
q1 dma y, b, wait=s>=3
"""


def test_tensor_engine_transpose_writes_fp32_on_v2_and_16_bit_on_v3() -> None:
    """trainium2_arch, Built-in Transpose Support: v3's transpose mode writes bf16/fp16 to PSUM for a bf16/fp16
    source; v2 transposes by a matmul against the identity, fp32 out."""
    e = _refused(TRANSPOSE.format(t="trn1", dt="bf16", out="bf16"))
    assert e.code == "NCC_EASM004" and "NeuronCore-v2" in e.message and "f32" in e.message
    x = (np.arange(64 * 32) % 200).astype(np.float32).reshape(64, 32)  # exact in bf16
    m = build(TRANSPOSE.format(t="trn2", dt="bf16", out="bf16"))
    np.testing.assert_array_equal(m.run({"x": x.astype(m.program.inputs()[0].dtype.np)})[0].astype(np.float32), x.T)


def test_v2_transpose_spreads_nan_along_the_row_v3_does_not() -> None:
    """trainium2_arch: before v3 a NaN/Inf in the transposed tile propagates through the identity matmul's
    accumulation and spreads across the output; v3's transpose mode is bit-accurate."""
    x = np.ones((64, 32), np.float32)
    x[5, 7] = np.nan
    v2 = build(TRANSPOSE.format(t="trn1", dt="f32", out="f32")).run({"x": x})[0]
    v3 = build(TRANSPOSE.format(t="trn2", dt="f32", out="f32")).run({"x": x})[0]
    assert np.isnan(v2[7]).all() and not np.isnan(np.delete(v2, 7, axis=0)).any()
    assert np.isnan(v3[7, 5]) and np.isnan(v3).sum() == 1


def test_fp32_transpose_costs() -> None:
    """v2: a transpose is an fp32 matmul against the identity (4x the bf16 cycles); v3's transpose mode runs
    fp32 at 2x (trainium2_arch)."""
    def pe(t: str) -> float:
        s, _ = build(TRANSPOSE.format(t=t, dt="f32", out="f32")).profile()
        return s["engines"]["pe"]["busy_ns"]
    clock = {"trn1": 2.8, "trn2": 2.4}
    assert pe("trn1") == pytest.approx((64 * 4 + 64) / clock["trn1"], abs=0.01)  # + the idle restart of 64
    assert pe("trn2") == pytest.approx((64 * 2 + 64) / clock["trn2"], abs=0.01)


DOUBLE = """.isa 1.1
.target {t}
.lnc 1
input xs: f8e4m3fn[128, {k}, 128]
input xm: f8e4m3fn[128, {k}, 512]
output y: f32[128, 512]
sbuf s8: f8e4m3fn[128, {k}, 128]
sbuf m8: f8e4m3fn[128, {k}, 512]
psum p: f32[128, 512]
sbuf o: f32[128, 512]
sem s
q0 dma s8, xs, signal=s
q1 dma m8, xm, signal=s
pe matmul p, s8{sl}, m8{sl}, start=true, stop=true{perf}, wait=s>=2, signal=s
act activation o, p, wait=s>=3, signal=s
q2 dma y, o, wait=s>=4
"""


def test_fp8_double_rate_needs_the_double_row_form() -> None:
    """trainium2_arch, Double FP8 Matmul Performance: K=256 as [128, 2, M] x [128, 2, N] in the time of a
    K=128 bf16 matmul; a K=128 fp8 matmul runs at the bf16 rate; trn1 has no double-row mode."""
    rng = np.random.default_rng(0)
    import ml_dtypes

    xs = rng.standard_normal((128, 2, 128)).astype(ml_dtypes.float8_e4m3fn)
    xm = rng.standard_normal((128, 2, 512)).astype(ml_dtypes.float8_e4m3fn)
    m = build(DOUBLE.format(t="trn2", k=2, sl="", perf=", perf=double_row"))
    y = m.run({"xs": xs, "xm": xm})[0]
    ref = np.einsum("khm,khn->mn", xs.astype(np.float64), xm.astype(np.float64))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-3)
    s2, _ = m.profile()
    s1, _ = build(DOUBLE.format(t="trn2", k=1, sl="", perf="")).profile()
    assert s2["engines"]["pe"]["busy_ns"] == pytest.approx(s1["engines"]["pe"]["busy_ns"], abs=0.002)
    assert s2["flops"]["f8e4m3fn"] == 2 * s1["flops"]["f8e4m3fn"] == 2 * 2 * 256 * 128 * 512 / 2
    t = sim.load_target("trn2")
    assert t.peak_flops("f8e4m3fn") == pytest.approx(2 * t.peak_flops("bf16"))
    e = _refused(DOUBLE.format(t="trn1", k=2, sl="", perf=", perf=double_row"))
    assert e.code == "NCC_ESPP004" and "double_row" in e.message


DMA_T = """.isa 1.1
.target {t}
.lnc 1
input x: bf16[512, 128]
output y: bf16[128, 512]
sbuf a: bf16[128, 512]
sem s
q0 dma_transpose a, x, signal=s
q1 dma y, a, wait=s>=1
"""


def test_dma_transpose_on_trn2_at_90_percent_of_the_dma_rate() -> None:
    """trainium2_arch, DMA Transpose: HBM to SBUF transposes at up to 90% of a copy's throughput; trn1 has none."""
    x = np.arange(512 * 128, dtype=np.float32).reshape(512, 128)
    m = build(DMA_T.format(t="trn2"))
    import ml_dtypes

    xb = x.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(m.run({"x": xb})[0], xb.T)
    _, tl = m.profile()
    tr = next(x for x in tl.slices if x.stream == "q0")
    t = m.target
    full = 16 * t.dma["engine_gbps"] * 4096 / (4096 + t.dma["engine_gbps"] * t.dma["descriptor_overhead_ns"])
    assert 512 * 128 * 2 / (tr.end - tr.start) == pytest.approx(0.9 * full, rel=1e-3)
    e = _refused(DMA_T.format(t="trn1"))
    assert e.code == "NCC_EASM004" and "NeuronCore-v3" in e.message and e.loc.line == 8


def test_isa_1_1_features_need_isa_1_1() -> None:
    e = _refused(DMA_T.format(t="trn2").replace(".isa 1.1", ".isa 1.0"))
    assert e.code == "NCC_EASM002" and "1.1" in e.message


# --- constraints the hardware enforces: trainium_inferentia2_arch, NKI ISA reference --------------------

BASE = """.isa 1.1
.target trn1
sbuf a: f32[128, 512]
sbuf b: f32[128, 512]
psum p: f32[128, 512]
psum q: f32[128, 512]
sbuf st: f32[128, 6]
sbuf big: f32[128, 1024]
sbuf c: f32[32, 512] partition=16
sbuf d: f32[64, 512] partition=32
sbuf e: s32[128, 512]
sbuf f: f32[128, 3, 3, 3, 3, 32]
sem s
dve memset a, signal=s
dve memset p, signal=s
dve memset q, signal=s
"""


@pytest.mark.parametrize("line,code,words", [
    ("dve tensor_tensor b, p, q, op=add, wait=s>=3", "NCC_EASM004", "both inputs from PSUM"),
    ("dve bn_stats st, big, wait=s>=3", "NCC_EASM004", "at most 512"),
    ("dve memset c, wait=s>=3", "NCC_EASM005", "starts at partition 0, 32, 64, 96"),
    ("dve memset d, wait=s>=3", "NCC_EASM005", "starts at partition 0, 64"),
    ("act tensor_copy b[0:32, :], a[16:48, :], wait=s>=3", "NCC_EASM005", "starts at partition"),
    ("dve tensor_copy b[:, 0:256].reshape(128, 2, 2, 2, 2, 16), f[:, 0:2, 0:2, 0:2, 0:2, 0:16], wait=s>=3",
     "NCC_EASM004",
     "at most 4 free dimensions"),
    ("act tensor_scalar e, e, op0=and, scalar0=3", "NCC_EASM004", "ScalarE has no bitwise"),
])
def test_the_verifier_refuses_what_the_hardware_refuses(line: str, code: str, words: str) -> None:
    """trainium_inferentia2_arch: start partitions by partition count (0 / 0, 64 / multiples of 32), at most
    four free dimensions; NKI ISA: bn_stats reads at most 512 elements per partition, no bitwise operators
    on ScalarE, one PSUM input for tensor_tensor. Refused at the line."""
    text = BASE + line + "\n"
    e = _refused(text)
    assert e.code == code and words in e.message, e.format()
    assert e.loc.line == text.count("\n"), e.format()


def test_moves_across_whole_halves_and_quadrants_are_allowed() -> None:
    ok = BASE + "act tensor_copy b[64:96, :], a[32:64, :], wait=s>=3\n"
    build(ok.replace("sbuf c: f32[32, 512] partition=16\n", "").replace("sbuf d: f32[64, 512] partition=32\n", ""),
          verify=True)


# --- out-of-range indirect copies: nki.isa.dma_copy oob_mode ----------------------------------------------

GATHER = """.isa 1.1
.target trn1
input t: f32[10, 4]
input i: s32[4, 1]
output y: f32[4, 4]
sbuf ix: s32[4, 1]
sbuf g: f32[4, 1, 4]
sem s
q0 dma ix, i, signal=s
pool memset g, value=7.0, signal=s
pool gather g, t, ix{oob}, wait=s>=2, signal=s
q1 dma y, g.reshape(4, 4), wait=s>=3
"""


@pytest.mark.parametrize("oob,warned", [("", True), (", oob=skip", False)])
def test_out_of_range_gather_leaves_the_row_unwritten(oob: str, warned: bool) -> None:
    """nki.isa.dma_copy: oob_mode=error (default) raises a runtime error, skip skips silently. The model (an
    assumption, dma.oob) reports the runtime's message as NCC_WRUN001 and leaves the row unwritten."""
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    w = Warnings()
    y = build(GATHER.format(oob=oob)).run({"t": table, "i": np.array([[1], [12], [3], [-1]], np.int32)}, warnings=w)[0]
    np.testing.assert_array_equal(y[[0, 2]], table[[1, 3]])
    assert (y[[1, 3]] == 7.0).all()
    assert bool(list(w)) == warned and all(x.code == "NCC_WRUN001" for x in w)
    assert any(a.key == "dma.oob" for a in sim.load_target("trn1").assumptions)


# --- cost details: ISA cost notes, trainium_inferentia2_arch ------------------------------------------------

def test_strided_engine_access_runs_at_half_rate() -> None:
    """trainium_inferentia2_arch: an innermost stride over 16 bytes halves an engine's SBUF bandwidth."""
    text = """.isa 1.1
.target trn1
sbuf a: f32[128, 4096]
sbuf b: f32[128, 512]
sem s
act memset a, signal=s
act tensor_copy b, {src}, wait=s>=1
"""
    dense = _dur(text.format(src="a[:, 0:512]"), "tensor_copy")
    assert dense == pytest.approx(512 / 1.4, abs=0.002)
    assert _dur(text.format(src="a[:, 0:2048:4]"), "tensor_copy") == pytest.approx(dense, abs=0.002)  # 16 bytes
    assert _dur(text.format(src="a[:, 0:4096:8]"), "tensor_copy") == pytest.approx(2 * dense, abs=0.002)


def test_tensor_reduce_halves_only_with_a_bf16_result() -> None:
    text = """.isa 1.1
.target trn1
sbuf a: bf16[128, 1024]
sbuf r: {out}[128, 1]
sem s
dve memset a, value=1.0, signal=s
dve tensor_reduce r, a, op=add, wait=s>=1
"""
    assert _dur(text.format(out="bf16"), "tensor_reduce") == pytest.approx(512 / 1.12, abs=0.002)
    assert _dur(text.format(out="f32"), "tensor_reduce") == pytest.approx(1024 / 1.12, abs=0.002)


def test_bf16_memset_of_zero_runs_at_half_cost() -> None:
    text = """.isa 1.1
.target trn1
sbuf a: {dt}[128, 2048]
dve memset a, value={v}
"""
    assert _busy(text.format(dt="bf16", v="0.0"), "dve") == pytest.approx(1024 / 1.12, abs=0.002)
    assert _busy(text.format(dt="bf16", v="1.0"), "dve") == pytest.approx(2048 / 1.12, abs=0.002)
    assert _busy(text.format(dt="f32", v="0.0"), "dve") == pytest.approx(2048 / 1.12, abs=0.002)


# --- long programs: exact time ------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_half_second_program_profiles() -> None:
    """17,600 DMAs of 8 MiB (16 queues storing one SBUF tile 1,100 times each: ~0.54 s at 272 GB/s). Time is
    integer picoseconds, so a replay of any length finishes (float nanoseconds stalled past ~67 ms)."""
    lines = [".isa 1.1", ".target trn1", "sbuf t: f32[128, 16384]", "sem s"]
    lines += [f"scratch h{q}: f32[128, 16384]" for q in range(16)]
    lines += ["dve memset t, signal=s"]
    lines += [f"q{q} dma h{q}, t" + (", wait=s>=1" if k == 0 else "") for k in range(1100) for q in range(16)]
    m = sim.load(sim.assemble("\n".join(lines) + "\n", "long.nxs"))
    s, _ = m.profile()
    assert s["latency_ns"] > 5e8
    assert s["hbm"]["bytes"] == 17600 * 128 * 16384 * 4
    assert s["latency_ns"] >= s["roofline"]["bound_ns"] >= 0.9 * s["latency_ns"]

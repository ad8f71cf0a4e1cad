"""rng-bit-generator against XLA's own outputs (tests/data/rng) and published test vectors; rng's
distribution properties and determinism."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module
from nxsat.ir import TensorType, TupleType
from nxsat.ops.random import philox4x32, threefry2x32

RNG_DATA = Path(__file__).resolve().parent.parent / "data" / "rng"
CASES = sorted(p.stem for p in RNG_DATA.glob("*.hlo"))


def reference(name: str) -> tuple[str, dict[str, np.ndarray]]:
    text = (RNG_DATA / f"{name}.hlo").read_text()
    algorithm = re.search(r"algorithm=(\w+)", text).group(1)
    with np.load(RNG_DATA / f"{name}.npz") as z:
        return algorithm, {k: z[k] for k in z.files}


def rbg(algorithm: str, state: np.ndarray, out: TensorType) -> list[np.ndarray]:
    """One rng-bit-generator built with the Builder, run by the interpreter: [new state, bits]."""
    b = Builder("rbg")
    s = b.param(dt.from_numpy(state.dtype), state.shape)
    st_t = TensorType(dt.from_numpy(state.dtype), state.shape)
    n = b.op("rng-bit-generator", [s], algorithm=algorithm, type=TupleType((st_t, out)))
    return run_module(b.module(n), [state])


def test_the_corpus_covers_every_algorithm():
    algorithms = {reference(c)[0] for c in CASES}
    assert algorithms == {"rng_default", "rng_philox", "rng_three_fry"}
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", [c for c in CASES if reference(c)[1]["in0"].dtype == np.uint64])
def test_bit_exact_with_xla_through_the_builder(name):
    algorithm, z = reference(name)
    ref_state, ref_bits = z["out0"], z["out1"]
    state, bits = rbg(algorithm, z["in0"], TensorType(dt.from_numpy(ref_bits.dtype), ref_bits.shape))
    assert state.dtype == np.uint64 and bits.dtype == ref_bits.dtype and bits.shape == ref_bits.shape
    np.testing.assert_array_equal(state, ref_state)
    np.testing.assert_array_equal(bits, ref_bits)


@pytest.mark.parametrize("name", CASES)
def test_bit_exact_with_xla_from_the_hlo_text(name):
    from nxsat.frontend import load

    _, z = reference(name)
    outs = run_module(load(RNG_DATA / f"{name}.hlo"), [z["in0"]])
    assert len(outs) == 2
    for i, o in enumerate(outs):
        ref = z[f"out{i}"]
        assert o.dtype == ref.dtype and o.shape == ref.shape
        np.testing.assert_array_equal(o, ref)


def test_default_is_philox():
    _, z = reference("default_u32_3x5")
    state, bits = rbg("rng_philox", z["in0"], TensorType(dt.U32, (3, 5)))
    np.testing.assert_array_equal(bits, z["out1"])
    np.testing.assert_array_equal(state, z["out0"])


def test_stablehlo_spec_example():
    """The rng_bit_generator example of the StableHLO specification (Threefry, state [1, 2])."""
    state, bits = rbg("rng_three_fry", np.array([1, 2], np.uint64), TensorType(dt.U64, (2, 2)))
    np.testing.assert_array_equal(state, [1, 6])
    np.testing.assert_array_equal(bits, np.array([[9236835810183407956, 16087790271692313299],
                                                  [18212823393184779219, 2658481902456610144]], np.uint64))


# Known-answer vectors of Random123 (Salmon et al.), the reference implementation of both ciphers.
THREEFRY_KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]
PHILOX_KAT = [
    ((0x00000000, 0x00000000), (0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF,) * 4, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0xA4093822, 0x299F31D0), (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("key,counter,expected", THREEFRY_KAT)
def test_threefry_known_answers(key, counter, expected):
    out = threefry2x32(tuple(np.uint32(k) for k in key), tuple(np.array([c], np.uint32) for c in counter))
    assert tuple(int(o[0]) for o in out) == expected


@pytest.mark.parametrize("key,counter,expected", PHILOX_KAT)
def test_philox_known_answers(key, counter, expected):
    out = philox4x32(tuple(np.uint32(k) for k in key), tuple(np.array([c], np.uint32) for c in counter))
    assert tuple(int(o[0]) for o in out) == expected


def test_signed_output_is_the_unsigned_bits():
    state = np.array([3, 4], np.uint64)
    _, u = rbg("rng_default", state, TensorType(dt.U16, (4, 3)))
    _, s = rbg("rng_default", state, TensorType(dt.S16, (4, 3)))
    np.testing.assert_array_equal(s, u.view(np.int16))


def test_chained_generators_continue_the_stream():
    """Two draws of 8 from one state = one draw of 16 (Philox blocks of four, counters consecutive)."""
    state = np.array([42, 1000], np.uint64)
    s1, a = rbg("rng_philox", state, TensorType(dt.U32, (8,)))
    _, b = rbg("rng_philox", s1, TensorType(dt.U32, (8,)))
    _, ab = rbg("rng_philox", state, TensorType(dt.U32, (16,)))
    np.testing.assert_array_equal(np.concatenate([a, b]), ab)


@pytest.mark.parametrize("algorithm,state,out,match", [
    ("rng_three_fry", np.zeros(3, np.uint64), TensorType(dt.U32, (4,)), r"takes a state of u64\[2\],"),
    ("rng_philox", np.zeros(4, np.uint64), TensorType(dt.U32, (4,)), r"u64\[2\] or u64\[3\]"),
    ("rng_default", np.zeros(2, np.uint32), TensorType(dt.U32, (4,)), "must be a u64 vector"),
    ("rng_default", np.zeros((2, 1), np.uint64), TensorType(dt.U32, (4,)), "must be a u64 vector"),
    ("rng_default", np.zeros(2, np.uint64), TensorType(dt.F32, (4,)), "must be an integer array"),
    ("rng_default", np.zeros(2, np.uint64), TensorType(dt.PRED, (4,)), "must be an integer array"),
    ("rng_mersenne", np.zeros(2, np.uint64), TensorType(dt.U32, (4,)), "is not one of"),
])
def test_shape_rule_failures(algorithm, state, out, match):
    with pytest.raises(NxsatError, match=match) as e:
        rbg(algorithm, state, out)
    assert e.value.code == "NCC_EVRF064"


def test_output_state_type_must_match():
    b = Builder("rbg")
    s = b.param(dt.U64, (2,))
    with pytest.raises(NxsatError, match="output state") as e:
        b.op("rng-bit-generator", [s], algorithm="rng_default",
             type=TupleType((TensorType(dt.U64, (3,)), TensorType(dt.U32, (4,)))))
    assert e.value.code == "NCC_EVRF064"


# --- rng -------------------------------------------------------------------------------------

def rng(distribution: str, a, b, d: dt.DType, shape, name: str = "r") -> np.ndarray:
    bld = Builder("rng")
    pa, pb = bld.param(d, ()), bld.param(d, ())
    n = bld.op("rng", [pa, pb], distribution=distribution, type=TensorType(d, tuple(shape)), name=name)
    return run_module(bld.module(n), [np.asarray(a, d.np), np.asarray(b, d.np)])[0]


@pytest.mark.parametrize("d", [dt.F32, dt.F64, dt.F16, dt.BF16])
def test_uniform_float_range_and_moments(d):
    x = rng("rng_uniform", -2.0, 6.0, d, (200, 100))
    assert x.dtype == d.np and x.shape == (200, 100)
    f = x.astype(np.float64)
    assert f.min() >= -2.0 and f.max() < 6.0
    # U(-2, 6): mean 2, variance 64/12; 20,000 samples: standard errors 0.016 and 0.03.
    assert abs(f.mean() - 2.0) < 0.1
    assert abs(f.var() - 64 / 12) < 0.2
    assert len(np.unique(f)) > 100


def test_uniform_never_reaches_b_after_rounding():
    # b = 1 + 2^-7 is the bf16 value after 1: half the draws from [1, b) round up to b.
    b = 1.0078125
    x = rng("rng_uniform", 1.0, b, dt.BF16, (1000,))
    assert (x.astype(np.float32) < np.float32(b)).all()
    assert (x == ml_dtypes.bfloat16(1.0)).all()


@pytest.mark.parametrize("d,lo,hi", [(dt.S32, -5, 5), (dt.U8, 250, 256 - 1), (dt.S64, -(2 ** 62), 2 ** 62),
                                     (dt.U64, 0, 2 ** 64 - 1)])
def test_uniform_int_range_and_moments(d, lo, hi):
    x = rng("rng_uniform", lo, hi, d, (20000,))
    assert x.dtype == d.np
    assert int(x.min()) >= lo and int(x.max()) < hi
    f = x.astype(np.float64)
    mean, var = (lo + hi - 1) / 2, ((hi - lo) ** 2 - 1) / 12
    assert abs(f.mean() - mean) < 0.05 * (hi - lo)
    assert abs(f.var() - var) < 0.05 * var + 1e-9
    if hi - lo <= 10:
        assert set(np.unique(x).tolist()) == set(range(lo, hi))


def test_uniform_pred_and_empty_interval():
    assert not rng("rng_uniform", False, True, dt.PRED, (50,)).any()
    np.testing.assert_array_equal(rng("rng_uniform", 3, 3, dt.S32, (4,)), np.full(4, 3, np.int32))


@pytest.mark.parametrize("d", [dt.F32, dt.F64, dt.BF16])
def test_normal_moments(d):
    x = rng("rng_normal", 3.0, 0.5, d, (40000,)).astype(np.float64)
    assert abs(x.mean() - 3.0) < 0.02
    assert abs(x.std() - 0.5) < 0.02
    # About 68.3% within one deviation, 95.4% within two.
    assert abs(np.mean(np.abs(x - 3.0) < 0.5) - 0.683) < 0.02
    assert abs(np.mean(np.abs(x - 3.0) < 1.0) - 0.954) < 0.01


def test_rng_is_deterministic_per_node_name():
    a = rng("rng_uniform", 0.0, 1.0, dt.F32, (64,), name="dropout.1")
    b = rng("rng_uniform", 0.0, 1.0, dt.F32, (64,), name="dropout.1")
    c = rng("rng_uniform", 0.0, 1.0, dt.F32, (64,), name="dropout.2")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("distribution,da,db,shape_t,match", [
    ("rng_normal", dt.S32, dt.S32, TensorType(dt.S32, (3,)), "rng_normal needs floating-point"),
    ("rng_uniform", dt.F32, dt.F16, TensorType(dt.F32, (3,)), "differ in type"),
    ("rng_uniform", dt.F32, dt.F32, TensorType(dt.F16, (3,)), "must have the parameters' type"),
    ("rng_poisson", dt.F32, dt.F32, TensorType(dt.F32, (3,)), "is not one of"),
])
def test_rng_shape_rule_failures(distribution, da, db, shape_t, match):
    bld = Builder("rng")
    pa, pb = bld.param(da, ()), bld.param(db, ())
    with pytest.raises(NxsatError, match=match) as e:
        bld.op("rng", [pa, pb], distribution=distribution, type=shape_t)
    assert e.value.code == "NCC_EVRF064"


def test_rng_parameters_must_be_scalars():
    bld = Builder("rng")
    pa, pb = bld.param(dt.F32, (2,)), bld.param(dt.F32, ())
    with pytest.raises(NxsatError, match="must be scalars"):
        bld.op("rng", [pa, pb], distribution="rng_uniform", type=TensorType(dt.F32, (3,)))

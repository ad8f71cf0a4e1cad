"""Integer arithmetic as the NeuronCore does it (NKI ISA reference, nki.isa.tensor_tensor and
tensor_copy): VectorE and ScalarE compute arithmetic in fp32 (an int32 above 2**24 loses its low
bits), bitwise operators work on the bits, GpSimd computes 32-bit integers natively, and a memset
of an integer tile is exact."""

from __future__ import annotations

import numpy as np
import pytest
from nxsim_progs import build

from nxsat.diagnostics import NxsatError

BIG = 2**24 + 1  # 16777217: not representable in fp32


def _run(engine: str, body: str, dtype: str = "s32", x: np.ndarray | None = None) -> np.ndarray:
    text = f""".isa 1.0
.target trn1
input  x: {dtype}[4, 8]
output y: {dtype}[4, 8]
sbuf   a: {dtype}[4, 8]
sbuf   b: {dtype}[4, 8]
sem    s
q0 dma a, x, signal=s
{engine} {body}, wait=s>=1, signal=s
q1 dma y, b, wait=s>=2
"""
    x = np.full((4, 8), BIG, dtype=np.int64) if x is None else x
    return build(text).run({"in0": x.astype(np.dtype({"s32": "int32", "u32": "uint32", "s16": "int16"}[dtype]))})[0]


@pytest.mark.parametrize("engine", ["dve", "pool"])
def test_integer_add_goes_through_fp32_except_on_gpsimd(engine):
    y = _run(engine, "tensor_scalar b, a, op0=add, scalar0=1")
    # (2**24 + 1) + 1: fp32 holds 2**24 for the input and for the sum.
    assert int(y[0, 0]) == (BIG + 1 if engine == "pool" else 2**24)


def test_tensor_tensor_integer_exact_on_gpsimd_only():
    text_body = "tensor_tensor b, a, a, op=add"
    assert int(_run("pool", text_body)[0, 0]) == 2 * BIG
    assert int(_run("dve", text_body)[0, 0]) == 2 * 2**24


@pytest.mark.parametrize("engine", ["dve", "pool"])
def test_bitwise_operators_work_on_bits(engine):
    x = np.full((4, 8), 0x7FFFFFFF, dtype=np.int64)
    y = _run(engine, "tensor_scalar b, a, op0=xor, scalar0=1431655765", x=x)
    assert int(y[0, 0]) == 0x7FFFFFFF ^ 1431655765


def test_bitwise_on_scalar_engine_is_refused():
    with pytest.raises(NxsatError) as e:
        _run("act", "tensor_scalar b, a, op0=and, scalar0=3")
    assert e.value.code == "NCC_EASM004" and "ScalarE" in e.value.message


def test_gpsimd_native_only_for_32_bit_tiles():
    # s16 on GpSimd goes through fp32: 32767 + 1 saturates on the cast back instead of wrapping.
    x = np.full((4, 8), 32767, dtype=np.int64)
    assert int(_run("pool", "tensor_scalar b, a, op0=add, scalar0=1", dtype="s16", x=x)[0, 0]) == 32767


@pytest.mark.parametrize("engine", ["dve", "pool", "act"])
def test_integer_memset_is_exact(engine):
    text = f""".isa 1.0
.target trn1
output y: s32[4, 8]
sbuf   b: s32[4, 8]
sem    s
{engine} memset b, value={BIG}, signal=s
q1 dma y, b, wait=s>=1
"""
    assert int(build(text).run({})[0][0, 0]) == BIG


def test_memset_of_a_non_integer_into_an_integer_tile_is_refused():
    text = """.isa 1.0
.target trn1
sbuf   b: s32[4, 8]
dve memset b, value=0.5
"""
    with pytest.raises(NxsatError) as e:
        build(text)
    assert e.value.code == "NCC_EASM004"


@pytest.mark.parametrize("engine,exact", [("dve", True), ("pool", True), ("act", False)])
def test_same_type_copy_is_bit_exact_except_on_scalar_engine(engine, exact):
    y = _run(engine, "tensor_copy b, a")
    assert int(y[0, 0]) == (BIG if exact else 2**24)


def test_integer_immediates_are_not_rounded_to_fp32():
    assert int(_run("pool", "tensor_scalar b, a, op0=sub, scalar0=16777217")[0, 0]) == 0

"""What the functional model computes, instruction by instruction, against independent references
(semchecks.py): every activation function, every ALU operation in tensor_tensor and tensor_scalar,
and every other instruction, in each storage type and on each engine that runs it.

test_mutations.py plants bugs in the executor and shows these checks catch them.
"""

from __future__ import annotations

import numpy as np
import pytest
import semchecks as sc
from nxsim_progs import build
from refnum import FLOATS, INTS

from nxsat.diagnostics import NxsatError

TYPES = FLOATS + INTS

# --- activation -----------------------------------------------------------------------------------------

# (src, dst): each float type to itself, and conversions on the way in and out (integers too).
ACT_TYPES = [(t, t) for t in FLOATS] + [("bf16", "f32"), ("f32", "bf16"), ("s32", "f32"), ("f32", "s32"),
                                        ("u8", "f16"), ("f16", "f8e4m3fn")]


@pytest.mark.parametrize("src,dst", ACT_TYPES)
def test_every_activation_function_on_scalar_engine(src: str, dst: str) -> None:
    sc.check_activation("act", src, dst, sc.ACTIVATIONS)


@pytest.mark.parametrize("src,dst", ACT_TYPES)
def test_vector_engine_activation_functions(src: str, dst: str) -> None:
    sc.check_activation("dve", src, dst, sc.DVE_FUNCTIONS)


@pytest.mark.parametrize("func", [f for f in sc.ACTIVATIONS if f not in sc.DVE_FUNCTIONS])
def test_vector_engine_refuses_other_functions(func: str) -> None:
    text = f""".isa 1.0
.target trn1
sbuf a: f32[4, 8]
sbuf b: f32[4, 8]
sem s
dve memset a, value=1.0, signal=s
dve activation b, a, func={func}, wait=s>=1
"""
    with pytest.raises(NxsatError) as e:
        build(text)
    assert e.value.code == "NCC_EASM004" and "VectorE" in e.value.message


@pytest.mark.parametrize("func", ["gelu", "gelu_tanh"])
def test_gelu_tail_is_correctly_rounded(func: str) -> None:
    sc.check_activation_tail(func)


# --- ALU operations -------------------------------------------------------------------------------------

MIXED_TT = [("bf16", "f32", "f16"), ("f32", "s32", "f32"), ("s32", "u8", "s16"), ("s32", "u32", "s32"),
            ("u8", "f8e5m2", "bf16"), ("u16", "s8", "u8")]


@pytest.mark.parametrize("engine", ["dve", "pool"])
@pytest.mark.parametrize("dtype", TYPES)
def test_tensor_tensor_every_op(engine: str, dtype: str) -> None:
    sc.check_tensor_tensor(engine, dtype, dtype, dtype)


@pytest.mark.parametrize("engine", ["dve", "pool"])
@pytest.mark.parametrize("a,b,dst", MIXED_TT)
def test_tensor_tensor_mixed_types(engine: str, a: str, b: str, dst: str) -> None:
    sc.check_tensor_tensor(engine, a, b, dst)


@pytest.mark.parametrize("engine", ["dve", "pool", "act"])
@pytest.mark.parametrize("dtype", TYPES)
def test_tensor_scalar_every_op(engine: str, dtype: str) -> None:
    sc.check_tensor_scalar(engine, dtype, dtype)


MIXED_TS = [("s32", "f32", "f32"), ("bf16", "s32", "bf16"), ("s32", "s32", "u8"), ("u32", "s32", "s32"),
            ("f16", "f8e4m3fn", "f32")]


@pytest.mark.parametrize("engine", ["dve", "pool", "act"])
@pytest.mark.parametrize("src,dst,scalar", MIXED_TS)
def test_tensor_scalar_mixed_types(engine: str, src: str, dst: str, scalar: str) -> None:
    sc.check_tensor_scalar(engine, src, dst, scalar=scalar)


def test_u32_carried_from_fp32_into_a_bitwise_step() -> None:
    """The fp32 intermediate enters the integer step in the tile's (unsigned) 32-bit range."""
    x = np.full((4, 8), 3_000_000_000, np.uint32)
    got = sc.run(["dve tensor_scalar y, x, op0=add, scalar0=2, op1=xor, scalar1=23130"], {"x": x},
                 {"y": ("u32", (4, 8))})["y"]
    # fp32 holds 3000000000 exactly and rounds 3000000002 to it; the bits of that u32 then meet the xor
    assert int(got[0, 0]) == 3_000_000_000 ^ 23130


@pytest.mark.parametrize("op", sc.BITWISE)
@pytest.mark.parametrize("stream,dtype,message", [("act", "s32", "ScalarE"), ("dve", "f32", "integer tiles"),
                                                  ("pool", "bf16", "integer tiles")])
def test_bitwise_operators_refused_on_scalar_engine_and_floats(op: str, stream: str, dtype: str, message: str) -> None:
    text = f""".isa 1.0
.target trn1
sbuf a: {dtype}[4, 8]
sbuf b: {dtype}[4, 8]
sem s
{stream} memset a, value=1, signal=s
{stream} tensor_scalar b, a, op0={op}, scalar0=1, wait=s>=1
"""
    with pytest.raises(NxsatError) as e:
        build(text)
    assert e.value.code == "NCC_EASM004" and message in e.value.message


# --- TensorE --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,precision,target", [
    ("bf16", "fp32", "trn1"), ("f16", "fp32", "trn1"), ("f8e4m3fn", "fp32", "trn1"), ("f8e5m2", "fp32", "trn1"),
    ("f32", "fp32", "trn1"), ("f32", "tf32", "trn1"), ("bf16", "fp32", "trn2"), ("f8e4m3fn", "fp32", "trn2"),
    ("f32", "tf32", "inf2")])
def test_matmul(dtype: str, precision: str, target: str) -> None:
    sc.check_matmul(dtype, precision, target=target)


@pytest.mark.parametrize("dtype", ["f32", "f8e4m3fn", "f8e5m2"])
def test_matmul_types_inf1_cannot_multiply_are_refused(dtype: str) -> None:
    with pytest.raises(NxsatError) as e:
        sc.check_matmul(dtype, target="inf1")
    assert e.value.code == "NCC_ESPP004"


@pytest.mark.parametrize("dtype", ["f8e4m3fn", "f8e5m2"])
def test_matmul_double_row(dtype: str) -> None:
    sc.check_matmul_double_row(dtype)


@pytest.mark.parametrize("dtype,target", [("f8e4m3fn", "trn1"), ("bf16", "trn2"), ("f32", "trn2")])
def test_matmul_double_row_refused_off_v3_fp8(dtype: str, target: str) -> None:
    with pytest.raises(NxsatError) as e:
        sc.check_matmul_double_row(dtype, target)
    assert e.value.code == "NCC_ESPP004"


@pytest.mark.parametrize("src,dst,target", [
    ("f32", "f32", "trn1"), ("bf16", "f32", "trn1"), ("f16", "f32", "trn1"), ("f8e4m3fn", "f32", "trn1"),
    ("f8e5m2", "f32", "trn1"), ("s32", "f32", "trn1"), ("u8", "f32", "trn1"), ("s16", "f32", "trn1"),
    ("bf16", "bf16", "trn2"), ("f16", "f16", "trn2"), ("f32", "f32", "trn2"), ("bf16", "f32", "trn2"),
    ("f8e4m3fn", "f32", "trn2"), ("s32", "f32", "trn2")])
def test_transpose(src: str, dst: str, target: str) -> None:
    sc.check_transpose(src, dst, target)


def test_transpose_of_finite_values_on_trn1_keeps_every_value() -> None:
    sc.check_transpose("bf16", "f32", "trn1", finite=True)


@pytest.mark.parametrize("src,dst,target", [("bf16", "bf16", "trn1"), ("s32", "s32", "trn2"),
                                            ("bf16", "f16", "trn2")])
def test_transpose_results_the_generation_cannot_write_are_refused(src: str, dst: str, target: str) -> None:
    with pytest.raises(NxsatError) as e:
        sc.check_transpose(src, dst, target)
    assert e.value.code == "NCC_EASM004"


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "s32", "u32", "s16", "u16"])
def test_dma_transpose(dtype: str) -> None:
    sc.check_dma_transpose(dtype)


@pytest.mark.parametrize("dtype,target", [("bf16", "trn1"), ("u8", "trn2"), ("f8e4m3fn", "trn2")])
def test_dma_transpose_refused_off_v3_and_for_bytes(dtype: str, target: str) -> None:
    text = f""".isa 1.1
.target {target}
{'.lnc 1' if target == 'trn2' else ''}
input x: {dtype}[8, 16]
sbuf t: {dtype}[16, 8]
q0 dma_transpose t, x
"""
    with pytest.raises(NxsatError) as e:
        build(text)
    assert e.value.code == "NCC_EASM004"


# --- VectorE / GpSimd -----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["dve", "pool"])
@pytest.mark.parametrize("src,dst", [(t, t) for t in TYPES] + [("bf16", "f32"), ("s32", "f32"), ("f32", "bf16"),
                                                                 ("u32", "s32"), ("f32", "s16")])
def test_tensor_reduce(engine: str, src: str, dst: str) -> None:
    sc.check_tensor_reduce(engine, src, dst)


@pytest.mark.parametrize("engine", ["dve", "pool", "act"])
@pytest.mark.parametrize("src", TYPES)
def test_tensor_copy_to_every_type(engine: str, src: str) -> None:
    sc.check_tensor_copy(engine, src)


@pytest.mark.parametrize("engine", ["dve", "pool"])
def test_select(engine: str) -> None:
    sc.check_select(engine)


@pytest.mark.parametrize("engine", ["dve", "pool"])
@pytest.mark.parametrize("dst", ["s32", "u32", "s16", "u16", "s8", "u8", "f32", "bf16", "f16", "f8e5m2"])
def test_iota(engine: str, dst: str) -> None:
    sc.check_iota(engine, dst)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_affine_select(dtype: str) -> None:
    sc.check_affine_select(dtype)


@pytest.mark.parametrize("engine", ["dve", "pool", "act"])
def test_memset_every_type(engine: str) -> None:
    sc.check_memset(engine)


@pytest.mark.parametrize("dtype,value", [("u8", "256"), ("u8", "-1"), ("s8", "128"), ("s32", "2147483648"),
                                         ("u32", "-1"), ("s16", "1.5")])
def test_memset_of_a_value_the_integer_type_cannot_hold_is_refused(dtype: str, value: str) -> None:
    text = f""".isa 1.0
.target trn1
sbuf b: {dtype}[4, 8]
dve memset b, value={value}
"""
    with pytest.raises(NxsatError) as e:
        build(text)
    assert e.value.code == "NCC_EASM004"


@pytest.mark.parametrize("src,chunks", [("f32", (300, 301, 64)), ("bf16", (300, 301, 64)), ("f32", (512,)),
                                        ("f16", (1, 2, 3, 255))])
def test_bn_stats_and_bn_aggr(src: str, chunks: tuple[int, ...]) -> None:
    sc.check_bn(src, chunks)


# --- GpSimd indirect copies -----------------------------------------------------------------------------

@pytest.mark.parametrize("oob", [False, True])
@pytest.mark.parametrize("dtype,idx", [("f32", "s32"), ("bf16", "s32"), ("s32", "s32"), ("u8", "u16"),
                                       ("f8e5m2", "s16"), ("f16", "u32"), ("f32", "u8")])
def test_gather(dtype: str, idx: str, oob: bool) -> None:
    sc.check_gather(dtype, idx, oob)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_gather_oob_skip_is_silent(dtype: str) -> None:
    sc.check_gather(dtype, "s32", True, mode="skip")


@pytest.mark.parametrize("oob", [False, True])
@pytest.mark.parametrize("mode", ["set", "add"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "s32", "f8e4m3fn", "u8"])
def test_scatter(dtype: str, mode: str, oob: bool) -> None:
    sc.check_scatter(dtype, mode, oob)


@pytest.mark.parametrize("mode", ["set", "add"])
def test_scatter_oob_skip_is_silent(mode: str) -> None:
    sc.check_scatter("f32", mode, True, oob_mode="skip")


# --- DMA and collectives --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", TYPES)
def test_dma_access_patterns(dtype: str) -> None:
    sc.check_dma(dtype)


@pytest.mark.parametrize("src,dst", [("f32", "bf16"), ("f32", "f16"), ("bf16", "f32"), ("f16", "bf16")])
def test_dma_converts_between_float_types(src: str, dst: str) -> None:
    sc.check_dma_cast(src, dst)


def test_dma_moves_pred_through_u8() -> None:
    sc.check_dma_pred()


COLLECTIVES = ([("all_reduce", op, 0) for op in ("add", "max", "min", "mul")]
               + [("reduce_scatter", op, axis) for op in ("add", "max", "min", "mul") for axis in (0, 1)]
               + [("all_gather", "add", axis) for axis in (0, 1)])


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "s32", "f8e4m3fn", "u8"])
@pytest.mark.parametrize("kind,op,axis", COLLECTIVES)
def test_collectives_on_trn2(kind: str, op: str, axis: int, dtype: str, ranks: int) -> None:
    sc.check_collective(kind, dtype, op, axis, ranks)

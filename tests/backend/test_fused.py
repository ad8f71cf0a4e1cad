"""The fused operators' kernels (backend/fused.py) on the simulator against the reference interpreter:
softmax over shapes that exercise its tiling (several rows per partition, a remainder of rows, fewer
rows than partitions, an 8,192-element row), a negative scale (the minimum's path), a transposed
operand, rows of -inf (NaN, as the pattern gives), on trn1 and trn2."""

from __future__ import annotations

import numpy as np
import pytest
from harness import assert_device_matches, device_run, reference_run

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.ir import Module

F32, BF16 = dt.F32, dt.BF16


def _softmax(shape: tuple[int, ...], d: dt.DType, scale: float = 1.0, transposed: bool = False,
             dimension: int | None = None) -> Module:
    b = Builder("e")
    x = b.param(d, shape[::-1] if transposed else shape)
    if transposed:
        x = b.op("transpose", [x], dimensions=tuple(range(len(shape) - 1, -1, -1)))
    dim = len(shape) - 1 if dimension is None else dimension
    return Module("m", b.build(b.op("softmax", [x], dimension=dim, scale=scale)))


CASES = [((12, 128, 128), BF16, 0.125), ((4096, 64), F32, 1.0), ((1000, 33), F32, 1.0), ((5, 3), F32, -0.5),
         ((2, 8192), BF16, 1.0), ((3, 7, 40), F32, 2.0)]


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("shape,d,scale", CASES, ids=[f"{'x'.join(map(str, s))}-{d.name}-{c}" for s, d, c in CASES])
def test_softmax_matches_the_interpreter(shape, d, scale, target):
    rng = np.random.default_rng(1)
    x = dt.cast(rng.standard_normal(shape) * 4, d)
    tol = 2 ** -7 if d is BF16 else 1e-5
    assert_device_matches(_softmax(shape, d, scale), {"p0": x}, target, rtol=tol, atol_scale=tol)


def test_softmax_of_a_transposed_operand():
    x = np.random.default_rng(2).standard_normal((40, 24)).astype(np.float32)
    assert_device_matches(_softmax((24, 40), F32, transposed=True), {"p0": x}, "trn1")


def test_a_row_of_minus_infinity_is_nan_as_the_pattern_gives():
    x = np.random.default_rng(3).standard_normal((130, 16)).astype(np.float32)
    x[7] = -np.inf
    x[129, 3] = -np.inf
    m = _softmax((130, 16), F32)
    (got,), _ = device_run(m, {"p0": x})
    (want,) = reference_run(m, {"p0": x})
    assert np.isnan(got[7]).all() and np.isnan(want[7]).all()
    assert got[129, 3] == 0 and np.isfinite(got[129]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_a_softmax_over_another_dimension_is_refused_cleanly():
    with pytest.raises(NxsatError) as e:
        device_run(_softmax((4, 6), F32, dimension=0), {"p0": np.zeros((4, 6), np.float32)})
    assert e.value.code == "NCC_EUOC002" and "last dimension" in e.value.message


def _attention(scale: float, d: dt.DType = BF16, extra_reader: bool = False, seq: int = 128) -> Module:
    """softmax(scale * q k^T) v per head, as mha_block's extracted form: reshapes around the softmax."""
    from nxsat.attrs import DotDims

    b = Builder("e")
    q, k, v = (b.param(d, (4, seq, 32)) for _ in range(3))
    s = b.op("dot", [q, k], dims=DotDims((2,), (2,), (0,), (0,)))  # [4, seq, seq]
    s4 = b.op("reshape", [s], shape=(1, 4, seq, seq))
    p = b.op("softmax", [s4], dimension=3, scale=scale)
    p3 = b.op("reshape", [p], shape=(4, seq, seq))
    o = b.op("dot", [p3, v], dims=DotDims((2,), (1,), (0,), (0,)))
    return Module("m", b.build([o, s] if extra_reader else o))


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("scale", [0.125, -0.5])
def test_a_softmax_reading_a_dot_is_computed_as_the_dot_leaves_psum(scale, target):
    """The scores never go to HBM, nor do the probabilities: the second dot is computed on their tiles
    (the program has no scratch tensor)."""
    from nxsat import sim
    from nxsat.backend import compile_graph

    m = _attention(scale)
    rng = np.random.default_rng(4)
    inputs = {f"p{i}": dt.cast(rng.standard_normal((4, 128, 32)), BF16) for i in range(3)}
    assert_device_matches(m, inputs, target, rtol=2 ** -6, atol_scale=2 ** -6)
    program = compile_graph(m, sim.load_target(target)).program
    assert not [tn for tn in program.tensors.values() if tn.kind == "scratch"]


@pytest.mark.parametrize("seq", [1024, 1300])
def test_rows_longer_than_one_psum_tile_stay_on_chip_too(seq):
    """1,024 keys are two 512-column tiles of each row (1,300: three, the last partial, and a partial
    M tile): the dot keeps a row block's tiles on chip and computes the softmax after the last, and the
    second dot reads the block's probabilities there (1,300 keys: a last K tile of 20)."""
    from nxsat import sim
    from nxsat.backend import compile_graph

    m = _attention(0.125, seq=seq)
    rng = np.random.default_rng(7)
    inputs = {f"p{i}": dt.cast(rng.standard_normal((4, seq, 32)), BF16) for i in range(3)}
    assert_device_matches(m, inputs, "trn1", rtol=2 ** -6, atol_scale=2 ** -6)
    program = compile_graph(m, sim.load_target("trn1")).program
    assert not [tn for tn in program.tensors.values() if tn.kind == "scratch"]  # neither scores nor probabilities


@pytest.mark.parametrize("returned", [False, True])
@pytest.mark.parametrize("seq", [128, 1024])
def test_probabilities_a_bf16_dot_reads_are_made_in_bf16(seq, returned):
    """fp32 attention under --auto-cast matmult's casts: the softmax rounds its result to the cast's type
    (the cast that alone reads it is its own). The second dot reads them on chip; returned as well, they
    are written once, in bf16, to the output."""
    from nxsat import sim
    from nxsat.attrs import DotDims
    from nxsat.backend import compile_graph

    b = Builder("e")
    q, k, v = (b.param(F32, (4, seq, 32)) for _ in range(3))
    s = b.op("dot", [q, k], dims=DotDims((2,), (2,), (0,), (0,)))
    p = b.op("softmax", [s], dimension=2, scale=0.125)
    pb, vb = (b.op("convert", [x], dtype=BF16) for x in (p, v))
    o = b.op("dot", [pb, vb], dims=DotDims((2,), (1,), (0,), (0,)))
    m = Module("m", b.build([o, pb] if returned else o))
    rng = np.random.default_rng(8)
    inputs = {f"p{i}": rng.standard_normal((4, seq, 32)).astype(np.float32) for i in range(3)}
    assert_device_matches(m, inputs, "trn1", rtol=2 ** -6, atol_scale=2 ** -6)
    program = compile_graph(m, sim.load_target("trn1")).program
    assert not [tn for tn in program.tensors.values() if tn.kind == "scratch"]
    outs = [(tuple(tn.shape), tn.dtype) for tn in program.tensors.values() if tn.kind == "output"]
    assert ((4, seq, seq), BF16) in outs if returned else outs == [((4, seq, 32), BF16)]


@pytest.mark.parametrize("seq", [128, 1024])
def test_a_cast_of_the_probabilities_readers_result_is_written_by_its_evacuation(seq):
    """Attention's output in fp32 cast to bf16 (and transposed) for the output projection, as -O2's casts
    leave it: the dot reading the probabilities rounds its result as it leaves PSUM and stores the cast's
    value; the fp32 result never exists (it had been stored, loaded back and cast by a pass of its own:
    attention_s2048 under transformer 798.6 -> 782.7 us)."""
    from nxsat import sim
    from nxsat.attrs import DotDims
    from nxsat.backend import compile_graph

    b = Builder("e")
    q, k, v = (b.param(BF16, (4, seq, 32)) for _ in range(3))
    w = b.param(BF16, (4, 32, 64))
    s = b.op("dot", [q, k], dims=DotDims((2,), (2,), (0,), (0,)), dtype=F32)
    p = b.op("convert", [b.op("softmax", [s], dimension=2, scale=0.125)], dtype=BF16)
    o = b.op("dot", [v, p], dims=DotDims((1,), (2,), (0,), (0,)), dtype=F32)  # [4, 32, seq]
    ob = b.op("transpose", [b.op("convert", [o], dtype=BF16)], dimensions=(2, 0, 1))  # [seq, 4, 32]
    y = b.op("dot", [ob, w], dims=DotDims((1, 2), (0, 1)), dtype=F32)
    m = Module("m", b.build(y))
    rng = np.random.default_rng(9)
    inputs = {f"p{i}": dt.cast(rng.standard_normal((4, seq, 32)), BF16) for i in range(3)}
    inputs["p3"] = dt.cast(rng.standard_normal((4, 32, 64)) * 0.2, BF16)
    assert_device_matches(m, inputs, "trn1", rtol=2 ** -6, atol_scale=2 ** -6)
    program = compile_graph(m, sim.load_target("trn1")).program
    scratch = [(tuple(tn.shape), tn.dtype) for tn in program.tensors.values() if tn.kind == "scratch"]
    assert scratch == [((4, 32, seq), BF16)]


def test_scores_another_operator_reads_are_stored_and_the_softmax_runs_alone():
    from nxsat import sim
    from nxsat.backend import compile_graph

    m = _attention(0.125, extra_reader=True)
    rng = np.random.default_rng(5)
    inputs = {f"p{i}": dt.cast(rng.standard_normal((4, 128, 32)), BF16) for i in range(3)}
    assert_device_matches(m, inputs, "trn1", rtol=2 ** -6, atol_scale=2 ** -6)
    program = compile_graph(m, sim.load_target("trn1")).program
    assert sum(1 for tn in program.tensors.values() if tn.kind == "scratch") == 1  # the probabilities
    assert any(tn.kind == "output" and tuple(tn.shape) == (4, 128, 128) for tn in program.tensors.values())


def _masked_attention(return_probs: bool) -> Module:
    """BERT's form: the scores divided by 8 and a mask added (the dot's epilogue cluster), the softmax read
    straight by the second dot (no reshape, no cast: --auto-cast none)."""
    from nxsat.attrs import DotDims

    b = Builder("e")
    q, k, v = (b.param(F32, (2, 128, 64)) for _ in range(3))
    mask = b.param(F32, (128,))
    s = b.op("dot", [q, k], dims=DotDims((2,), (2,), (0,), (0,)))
    scaled = b.op("divide", [s, b.op("broadcast", [b.constant(8.0, F32)], shape=(2, 128, 128), dimensions=())])
    masked = b.op("add", [scaled, b.op("broadcast", [mask], shape=(2, 128, 128), dimensions=(2,))])
    p = b.op("softmax", [masked], dimension=2, scale=1.0)
    o = b.op("dot", [p, v], dims=DotDims((2,), (1,), (0,), (0,)))
    return Module("m", b.build([o, p] if return_probs else o))


@pytest.mark.parametrize("return_probs", [False, True])
def test_a_softmax_of_the_dots_epilogue_is_computed_there_too(return_probs):
    from nxsat import sim
    from nxsat.backend import compile_graph

    m = _masked_attention(return_probs)
    rng = np.random.default_rng(6)
    inputs = {f"p{i}": rng.standard_normal((2, 128, 64)).astype(np.float32) for i in range(3)}
    inputs["p3"] = np.where(rng.random(128) < 0.2, -1e4, 0.0).astype(np.float32)
    assert_device_matches(m, inputs, "trn1", rtol=1e-5, atol_scale=1e-5)
    program = compile_graph(m, sim.load_target("trn1")).program
    assert not [tn for tn in program.tensors.values() if tn.kind == "scratch"]  # the probabilities: chip or output


@pytest.mark.parametrize("name", ["gelu", "gelu-tanh", "silu"])
def test_activations_run_in_a_dense_layers_epilogue(name):
    """dense + bias + activation: the activation is one ScalarE instruction on each result tile; nothing
    but the output goes to HBM."""
    from nxsat import sim
    from nxsat.attrs import DotDims
    from nxsat.backend import compile_graph

    b = Builder("e")
    x, w, bias = b.param(F32, (128, 256)), b.param(F32, (256, 384)), b.param(F32, (384,))
    y = b.op("dot", [x, w], dims=DotDims((1,), (0,), (), ()))
    z = b.op("add", [y, b.op("broadcast", [bias], shape=(128, 384), dimensions=(1,))])
    m = Module("m", b.build(b.op(name, [z])))
    rng = np.random.default_rng(7)
    inputs = {"p0": rng.standard_normal((128, 256)).astype(np.float32),
              "p1": (rng.standard_normal((256, 384)) / 16).astype(np.float32),
              "p2": rng.standard_normal(384).astype(np.float32)}
    assert_device_matches(m, inputs, "trn1", rtol=1e-5, atol_scale=1e-5)
    program = compile_graph(m, sim.load_target("trn1")).program
    assert not any(tn.kind == "scratch" for tn in program.tensors.values())


def _layer_norm(shape: tuple[int, ...], d: dt.DType, affine: bool) -> Module:
    b = Builder("e")
    x = b.param(d, shape)
    y = b.op("layer-norm", [x], epsilon=1e-5)
    if affine:  # the scale and shift: the kernel's epilogue
        n = len(shape)
        g, c = b.param(d, shape[-1:]), b.param(d, shape[-1:])
        y = b.op("add", [b.op("multiply", [y, b.op("broadcast", [g], shape=shape, dimensions=(n - 1,))]),
                         b.op("broadcast", [c], shape=shape, dimensions=(n - 1,))])
    return Module("m", b.build(y))


LN_CASES = [((128, 768), F32, True), ((300, 1100), F32, False), ((5, 3), F32, True), ((2, 64, 96), BF16, True),
            ((4096, 64), F32, False)]


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("shape,d,affine", LN_CASES,
                         ids=[f"{'x'.join(map(str, s))}-{d.name}-{'affine' if a else 'plain'}" for s, d, a in LN_CASES])
def test_layer_norm_matches_the_interpreter_and_keeps_nothing_in_hbm(shape, d, affine, target):
    from nxsat import sim
    from nxsat.backend import compile_graph

    m = _layer_norm(shape, d, affine)
    rng = np.random.default_rng(8)
    inputs = {p.name: dt.cast(rng.standard_normal(p.type.shape) * 2 + 0.5, d) for p in m.entry.params}
    inputs = {f"p{i}": v for i, v in enumerate(inputs.values())}
    tol = 2 ** -6 if d is BF16 else 1e-5
    assert_device_matches(m, inputs, target, rtol=tol, atol_scale=tol)
    program = compile_graph(m, sim.load_target(target)).program
    assert not any(tn.kind == "scratch" for tn in program.tensors.values())


def _group_norm(shape: tuple[int, ...], groups: int, d: dt.DType, affine: bool) -> Module:
    """group-norm of NHWC ``x``; with ``affine`` its per-channel scale and shift and a SiLU (a UNet's
    GroupNorm + SiLU: the kernel's epilogue)."""
    b = Builder("e")
    x = b.param(d, shape)
    y = b.op("group-norm", [x], groups=groups, epsilon=1e-6)
    if affine:
        n = len(shape)
        g, c = b.param(d, shape[-1:]), b.param(d, shape[-1:])
        y = b.op("add", [b.op("multiply", [y, b.op("broadcast", [g], shape=shape, dimensions=(n - 1,))]),
                         b.op("broadcast", [c], shape=shape, dimensions=(n - 1,))])
        y = b.op("silu", [y])
    return Module("m", b.build(y))


# (rows per batch over 128 and not, several batches, instance norm (groups = C), bf16, a batch over
# GROUP_NORM_RESIDENT that is loaded twice, rank 3)
GN_CASES = [((1, 32, 32, 32), 8, F32, True), ((2, 5, 7, 12), 3, F32, False), ((2, 16, 16, 6), 6, F32, True),
            ((1, 16, 16, 64), 8, BF16, True), ((1, 64, 64, 800), 32, F32, False), ((3, 40, 10), 2, F32, True)]


@pytest.mark.parametrize("shape,groups,d,affine", GN_CASES,
                         ids=[f"{'x'.join(map(str, s))}-g{g}-{d.name}-{'affine' if a else 'plain'}"
                              for s, g, d, a in GN_CASES])
def test_group_norm_matches_the_interpreter_and_keeps_nothing_in_hbm(shape, groups, d, affine):
    from nxsat import sim
    from nxsat.backend import compile_graph

    m = _group_norm(shape, groups, d, affine)
    rng = np.random.default_rng(9)
    inputs = {f"p{i}": dt.cast(rng.standard_normal(p.type.shape) * 2 + 0.5, d) for i, p in enumerate(m.entry.params)}
    tol = 2 ** -6 if d is BF16 else 1e-5
    assert_device_matches(m, inputs, "trn1", rtol=tol, atol_scale=tol)
    program = compile_graph(m, sim.load_target("trn1")).program
    assert not any(tn.kind == "scratch" for tn in program.tensors.values())


def _rms_norm(shape: tuple[int, ...], d: dt.DType, scaled: bool) -> Module:
    """rms-norm with Gemma's ``* (1 + scale)`` as its epilogue when ``scaled``."""
    b = Builder("e")
    x = b.param(d, shape)
    y = b.op("rms-norm", [x], epsilon=1e-6)
    if scaled:
        n = len(shape)
        w = b.op("add", [b.param(d, shape[-1:]), b.op("broadcast", [b.constant(1.0, d)], shape=shape[-1:],
                                                                  dimensions=())])
        y = b.op("multiply", [y, b.op("broadcast", [w], shape=shape, dimensions=(n - 1,))])
    return Module("m", b.build(y))


RMS_CASES = [((1, 11, 1152), BF16, True), ((300, 1100), F32, False), ((5, 3), F32, True), ((4096, 64), F32, True)]


@pytest.mark.parametrize("shape,d,scaled", RMS_CASES,
                         ids=[f"{'x'.join(map(str, s))}-{d.name}-{'scaled' if a else 'plain'}"
                              for s, d, a in RMS_CASES])
def test_rms_norm_matches_the_interpreter_and_keeps_nothing_in_hbm(shape, d, scaled):
    from nxsat import sim
    from nxsat.backend import compile_graph

    m = _rms_norm(shape, d, scaled)
    rng = np.random.default_rng(13)
    inputs = {f"p{i}": dt.cast(rng.standard_normal(p.type.shape) * 2 + 0.5, d) for i, p in enumerate(m.entry.params)}
    tol = 2 ** -6 if d is BF16 else 1e-5
    assert_device_matches(m, inputs, "trn1", rtol=tol, atol_scale=tol)
    program = compile_graph(m, sim.load_target("trn1")).program
    scratch = {tuple(tn.shape) for tn in program.tensors.values() if tn.kind == "scratch"}
    assert scratch <= {shape[-1:]}  # at most the 1 + scale: the normalized rows never reach HBM

"""Causal masks applied where they are computed (backend/affine.py): the predicate read off the IR as an
affine comparison of the position, the parameters of one tile's ``affine_select``, and a masked attention
whose mask is never loaded, against the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from harness import assert_device_matches

from nxsat import dtypes as dt
from nxsat.attrs import DotDims
from nxsat.backend.affine import Affine, AffinePredicate, affine_predicate, index_form, tile_params, virtual
from nxsat.builder import Builder
from nxsat.ir import Module, Node, TensorType

F32, S32, PRED = dt.F32, dt.S32, dt.PRED


def _causal(b: Builder, heads: int, seq: int, offset: int = 0, direction: str = "GE") -> Node:
    """Flax's causal mask: an iota of positions broadcast along rows and columns, compared, reshaped to
    ``[1, seq, seq]`` and broadcast over the heads (``offset`` shifts the diagonal)."""
    iota = b.op("iota", [], iota_dimension=0, type=TensorType(S32, (seq,)))
    rows = b.op("broadcast", [iota], shape=(seq, seq), dimensions=(0,))
    cols = b.op("broadcast", [iota], shape=(seq, seq), dimensions=(1,))
    if offset:
        cols = b.op("add", [cols, b.op("broadcast", [b.constant(offset, S32)], shape=(seq, seq), dimensions=())])
    m = b.op("compare", [rows, cols], direction=direction)
    m3 = b.op("reshape", [m], shape=(1, seq, seq))
    return b.op("broadcast", [m3], shape=(1, heads, seq, seq), dimensions=(0, 2, 3))


def test_a_causal_mask_is_an_affine_predicate():
    b = Builder("m")
    p = _causal(b, 4, 16, offset=2, direction="GT")
    pred = affine_predicate(p)
    assert pred == AffinePredicate(Affine((1, 4, 16, 16), (0, 0, 1, -1), -2), "gt")
    assert index_form(p.operands[0].operands[0].operands[0]) == Affine((16, 16), (1, 0), 0)


def test_what_is_not_affine_is_left_alone():
    b = Builder("m")
    x = b.param(S32, (8, 8))
    iota = b.op("iota", [], iota_dimension=1, type=TensorType(S32, (8, 8)))
    assert affine_predicate(b.op("compare", [x, iota], direction="GE")) is None  # a parameter
    sq = b.op("multiply", [iota, iota])
    assert affine_predicate(b.op("compare", [sq, iota], direction="GE")) is None  # a square
    fiota = b.op("iota", [], iota_dimension=0, type=TensorType(F32, (1 << 25,)))
    assert affine_predicate(b.op("compare", [fiota, fiota], direction="EQ")) is None  # past fp32's integers


def test_tile_parameters_follow_the_tiles_place():
    b = Builder("m")
    pred = affine_predicate(_causal(b, 4, 2048))
    node = _causal(Builder("n"), 4, 2048)
    framed = virtual(node).reshape(4, 2048, 2048)
    # head 2, rows 256..383, columns 512..1023: q - k = (256 - 512) + p - j
    assert tile_params(pred, framed[2, 256:384, 512:1024]) == (-256, 1, (-1,))
    # a tile whose columns wrap into the next row is not affine
    assert tile_params(pred, virtual(node).reshape(4 * 2048 * 2048)[0:4096].reshape(1, 4096)) is None


def _masked_attention(seq: int, offset: int, direction: str) -> Module:
    """scores = q k^T, masked causally with -3.4e38 (a select against the mask, as flax writes it), then
    softmax over the keys: the mask is an epilogue input of the scores' dot."""
    b = Builder("e")
    q, k = (b.param(F32, (1, 4, seq, 32)) for _ in range(2))
    s = b.op("dot", [q, k], dims=DotDims((3,), (3,), (0, 1), (0, 1)))  # [1, 4, seq, seq]
    fill = b.op("broadcast", [b.constant(-3.4e38, F32)], shape=(1, 4, seq, seq), dimensions=())
    masked = b.op("select", [_causal(b, 4, seq, offset, direction), s, fill])
    return Module("m", b.build(b.op("softmax", [masked], dimension=3, scale=0.125)))


def _tiles(seq: int, offset: int, direction: str) -> tuple[int, int]:
    """Of the scores' [128, 512] tiles (per head), those the mask keeps only in part (an ``affine_select``
    each) and those it fills whole in rows that each keep some score (left out: no matmul, no select)."""
    cmp = {"GE": np.greater_equal, "GT": np.greater, "LE": np.less_equal}[direction]
    keep = cmp(np.arange(seq)[:, None], np.arange(seq)[None, :] + offset)
    part = skipped = 0
    for r0 in range(0, seq, 128):
        rows = keep[r0:r0 + 128]
        for c0 in range(0, seq, 512):
            t = rows[:, c0:c0 + 512]
            if not t.any() and rows.any(axis=1).all():
                skipped += 1
            elif not t.all():
                part += 1
    return 4 * part, 4 * skipped


@pytest.mark.parametrize("seq,offset,direction", [(128, 0, "GE"), (1024, 0, "GE"), (300, 3, "GT"), (640, -5, "LE"),
                                                  (2048, 0, "GE")])
def test_a_causal_mask_is_applied_by_gpsimd_and_never_loaded(seq, offset, direction):
    """One ``affine_select`` per tile the mask keeps in part; none on a tile it keeps whole; a tile it fills
    whole, in rows that each keep some score, is not computed (its probabilities stored as zeros). The
    last rows of the LE case keep nothing (uniform probabilities): their tiles are all computed."""
    from nxsat import sim
    from nxsat.backend import compile_graph

    m = _masked_attention(seq, offset, direction)
    rng = np.random.default_rng(12)
    inputs = {f"p{i}": rng.standard_normal((1, 4, seq, 32)).astype(np.float32) for i in range(2)}
    if seq <= 1024:
        assert_device_matches(m, inputs, "trn1", rtol=1e-5, atol_scale=1e-5)
    program = compile_graph(m, sim.load_target("trn1")).program
    ops = [i.opcode for i in program.instrs]
    part, skipped = _tiles(seq, offset, direction)
    assert ops.count("affine_select") == part and "select" not in ops
    assert "iota" not in ops  # the mask is never computed (Graph.drop_dead)
    tiles = 4 * -(-seq // 128) * -(-seq // 512)
    assert ops.count("matmul") == tiles - skipped  # K = 32: one matmul a tile
    assert skipped > 0 or direction != "GE" or seq <= 512  # the causal cases over several key tiles skip some


def test_whole_tiles_and_rows_of_an_affine_predicate():
    """``whole_tile`` and ``rows_keep`` against the predicate evaluated at every position."""
    from nxsat.backend.affine import rows_keep, whole_tile

    rng = np.random.default_rng(3)
    ops = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal, "lt": np.less, "eq": np.equal,
           "ne": np.not_equal}
    for _ in range(400):
        shape = (int(rng.integers(1, 6)), int(rng.integers(1, 6)), int(rng.integers(1, 4)))
        base, cm = int(rng.integers(-8, 9)), int(rng.integers(-2, 3))
        steps = tuple(int(s) for s in rng.integers(-2, 3, size=2))
        form = (base + cm * np.arange(shape[0])[:, None, None] + steps[0] * np.arange(shape[1])[None, :, None]
                + steps[1] * np.arange(shape[2])[None, None, :])
        for cmp, f in ops.items():
            held = f(form, 0)
            want = True if held.all() else False if not held.any() else None
            got = whole_tile(cmp, base, cm, steps, shape)
            assert got is want or (got is None and cmp in ("eq", "ne"))  # (in)equality: from the bounds only
            keeps = rows_keep(cmp, base, cm, steps, shape)
            assert keeps == held.reshape(shape[0], -1).any(axis=1).all() or (not keeps and cmp in ("eq", "ne"))

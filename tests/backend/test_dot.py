"""dot on the device: operand layouts read the way their bytes lie, casts done on the loaded tiles,
and integer dots computed exactly (wrapping as XLA's do), against the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from harness import assert_device_matches, module_of

from nxsat import sim
from nxsat.backend import compile_graph


def _dot(lhs: str, rhs: str, out: str, dims: str, pre: str = "", a: str = "a", b: str = "b") -> str:
    return f"""HloModule d

ENTRY main {{
  a = {lhs} parameter(0)
  b = {rhs} parameter(1)
{pre}  ROOT d = {out} dot({a}, {b}), {dims}
}}
"""


INT_CASES = {
    "s32_wraps": _dot("s32[5,300]", "s32[300,7]", "s32[5,7]", "lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    "s8_to_s32": _dot("s8[130,40]", "s8[40,3]", "s32[130,3]", "lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    "u32": _dot("u32[4,9]", "u32[9,5]", "u32[4,5]", "lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    "s16_result": _dot("s16[3,50]", "s16[50,4]", "s16[3,4]", "lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    "batched_long_k": _dot("s32[2,3,2100]", "s32[2,2100,2]", "s32[2,3,2]",
                           "lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, "
                           "rhs_contracting_dims={1}"),
}


def _int_inputs(text: str, seed: int = 0) -> dict[str, np.ndarray]:
    m = module_of(text)
    rng = np.random.default_rng(seed)
    out = {}
    for p in m.entry.params:
        info = np.iinfo(p.dtype.np)
        out[p.name] = rng.integers(info.min, info.max, p.shape, dtype=p.dtype.np, endpoint=True)
    return out


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("case", sorted(INT_CASES))
def test_integer_dot_is_exact_and_wraps(case: str, target: str) -> None:
    text = INT_CASES[case]
    m = module_of(text)
    inputs = _int_inputs(text)
    # full-range operands: products and sums overflow 32 bits (and fp32's 24) everywhere
    assert_device_matches(m, inputs, target)


FLOAT_LAYOUTS = {
    "k_major_both": _dot("f32[96,200]", "f32[200,300]", "f32[96,300]",
                         "lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    "weight_n_by_k": _dot("f32[96,200]", "f32[300,200]", "f32[96,300]",
                          "lhs_contracting_dims={1}, rhs_contracting_dims={1}"),
    "lhs_k_by_m": _dot("f32[200,96]", "f32[200,300]", "f32[96,300]",
                       "lhs_contracting_dims={0}, rhs_contracting_dims={0}"),
    "both_transposed": _dot("f32[200,96]", "f32[300,200]", "f32[96,300]",
                            "lhs_contracting_dims={0}, rhs_contracting_dims={1}"),
    "bf16_casts": _dot("f32[96,200]", "f32[200,300]", "f32[96,300]",
                       "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
                       pre="  ac = bf16[96,200] convert(a)\n  bc = bf16[200,300] convert(b)\n", a="ac", b="bc"),
}


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("case", sorted(FLOAT_LAYOUTS))
def test_operand_layouts(case: str, target: str) -> None:
    assert_device_matches(module_of(FLOAT_LAYOUTS[case]), target=target)


def test_a_weight_stored_n_by_k_is_read_by_dma_transpose_on_trn2() -> None:
    """No element-by-element copy: the [N, K] weight's tiles are transposed by the DMA engines."""
    m = module_of(FLOAT_LAYOUTS["weight_n_by_k"])
    t = sim.load_target("trn2")
    text = sim.load(sim.build_neff((c := compile_graph(m, t)).program, t, c.constants)).text
    # every K tile of both operands (K = 200: two tiles; N = 300: one moving tile)
    assert text.count("dma_transpose") == 4


def test_a_weight_stored_n_by_k_is_transposed_on_tensore_on_trn1() -> None:
    """trn1 has no DMA transpose: an operand with K contiguous (here both) is loaded as it lies, 128 rows
    at a time, and transposed on TensorE, not moved one element per DMA descriptor; same values."""
    m = module_of(FLOAT_LAYOUTS["weight_n_by_k"])
    assert_device_matches(m, target="trn1")
    c = compile_graph(m, sim.load_target("trn1"))
    insts = c.program.instrs
    # both operands have K contiguous: per K tile (200 = 128 + 72), one block of the [96, K] input and
    # three of the [300, K] weight (128 + 128 + 44 rows)
    assert sum(1 for i in insts if i.opcode == "transpose") == 2 * (1 + 3)
    assert sum(1 for i in insts if i.opcode == "matmul") == 2


@pytest.mark.parametrize("m,n,transposes,matmuls", [(40, 24, 3, 3), (144, 24, 6, 6), (24, 144, 6, 3)])
def test_k_contiguous_operands_are_transposed_together_on_trn1(m: int, n: int, transposes: int, matmuls: int
                                                                ) -> None:
    """Weight gradients' shapes: [M, K] and [N, K], both K-contiguous (K = 300: 128 + 128 + 44). Each K
    block of both is transposed by TensorE with their rows stacked, 128 at a time (MatmulPlan.joint):
    40 + 24 rows in one transpose where each operand alone took one; 144 + 24 rows in two where the two
    M tiles took two each. Same values."""
    text = _dot(f"f32[{m},300]", f"f32[{n},300]", f"f32[{m},{n}]", "lhs_contracting_dims={1}, rhs_contracting_dims={1}")
    mod = module_of(text)
    assert_device_matches(mod, target="trn1")
    insts = compile_graph(mod, sim.load_target("trn1")).program.instrs
    assert sum(1 for i in insts if i.opcode == "transpose") == transposes
    assert sum(1 for i in insts if i.opcode == "matmul") == matmuls


def test_operand_casts_are_done_on_chip() -> None:
    """The bf16 casts --auto-cast puts on a dot's operands are conversions of the loaded tiles: no
    bf16 tensor in HBM, and the same rounding (the test above compares the values)."""
    m = module_of(FLOAT_LAYOUTS["bf16_casts"])
    t = sim.load_target("trn1")
    c = compile_graph(m, t)
    assert not [n for n, ten in c.program.tensors.items() if ten.kind == "scratch"]
    assert "bf16" in sim.load(sim.build_neff(c.program, t, c.constants)).text


def test_a_long_contraction_streams_its_stationary_operand() -> None:
    """K = 6400 (50 tiles of 128 rows): the stationary operand's tiles (25 KB per partition) are more
    than the plan keeps resident, so each is loaded beside the moving tile it meets, once per N tile
    (two here), instead of all 50 being held in SBUF first; same values."""
    from nxsat.extract.plan import STATIONARY_SBUF_SHARE, matmul_plan

    t = sim.load_target("trn1")
    assert 50 * 128 * 4 > STATIONARY_SBUF_SHARE * t.sbuf_bytes
    plan = matmul_plan(128, 6400, 600, "f32", t)
    assert not plan.resident
    m = module_of(_dot("f32[128,6400]", "f32[6400,600]", "f32[128,600]",
                       "lhs_contracting_dims={1}, rhs_contracting_dims={0}"))
    assert_device_matches(m, target="trn1")
    c = compile_graph(m, t)
    loads = [i for i in c.program.instrs if i.opcode == "dma" and i.operands[0].tensor.startswith("sb")]
    per_operand = -(-50 // plan.k_group)  # runs of K tiles, one load each
    assert len(loads) == 2 * per_operand * 2  # per N tile, both operands' 50 K tiles
    # the first multiply does not wait for the whole stationary operand to arrive
    first_mm = next(k for k, i in enumerate(c.program.instrs) if i.opcode == "matmul")
    assert first_mm < c.program.instrs.index(loads[per_operand - 1])


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_a_long_contraction_loads_its_k_tiles_in_runs(target: str) -> None:
    """A weight gradient's shape (M = 24, N = 144, K = 3,000: 23 whole K tiles and a partial one):
    the moving operand's K tiles (576 bytes per partition each) are loaded seven to a DMA, the
    K-contiguous stationary operand's too, transposed on TensorE into one PSUM bank per run on trn1
    (DMA transposes on trn2, one per tile); same values."""
    from nxsat.extract.plan import LOAD_BYTES, matmul_plan

    t = sim.load_target(target)
    plan = matmul_plan(24, 3000, 144, "f32", t)
    assert plan.k_group == LOAD_BYTES // (144 * 4) == 7
    m = module_of(_dot("f32[24,3000]", "f32[3000,144]", "f32[24,144]",
                       "lhs_contracting_dims={1}, rhs_contracting_dims={0}"))
    assert_device_matches(m, target=target)
    c = compile_graph(m, t)
    ops = [i.opcode for i in c.program.instrs]
    loads = [i for i in c.program.instrs if i.opcode.startswith("dma") and i.operands[0].tensor.startswith("sb")]
    runs = -(-23 // 7) + 1  # runs of whole tiles, and the partial tile
    assert ops.count("matmul") == 24
    if target == "trn1":
        assert len(loads) == 2 * runs
        assert ops.count("transpose") == 24 and ops.count("tensor_copy") == runs
    else:
        assert len(loads) == runs + 24


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_a_contraction_over_batch_and_positions_runs_in_segments(target: str) -> None:
    """A weight gradient's dot: ``x[b, c, h, w]`` and ``dy[b, o, h, w]`` contracted over (b, h, w).
    Batch and positions do not merge into one stride, so the contraction runs as two segments of
    3,136 positions (25 K tiles each, the last of 64 rows) accumulating into one PSUM group, reading
    both activations where they lie: no copy into a merged layout (that copy was an element-by-element
    DMA of the whole activation); same values."""
    text = """HloModule wg

ENTRY main {
  x = f32[2,8,56,56] parameter(0)
  dy = f32[2,24,56,56] parameter(1)
  ROOT d = f32[8,24] dot(x, dy), lhs_contracting_dims={0,2,3}, rhs_contracting_dims={0,2,3}
}
"""
    m = module_of(text)
    assert_device_matches(m, target=target)
    c = compile_graph(m, sim.load_target(target))
    assert not [n for n, t in c.program.tensors.items() if t.kind == "scratch"]
    ops = [i.opcode for i in c.program.instrs]
    assert ops.count("matmul") == 2 * 25


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_an_operand_that_must_be_copied_is_copied_in_its_sources_order(target: str) -> None:
    """A 3x3 weight gradient's per-position dot (backend/conv.py ``weight_gradients``): ``x`` is read
    through a window slice, so (b, h, w) do not merge into segments that pay, and both operands are
    copied. ``dy[b, o, h, w]`` was copied in the ``[K, N]`` order, ``o`` innermost: a 4-byte descriptor
    per element (160 us for each batch's 100 KB on trn1); it is now copied as it lies, ``[o, (b, h, w)]``,
    in runs of a whole image row, and read back K-contiguous. Same values."""
    text = """HloModule wg

ENTRY main {
  x = f32[8,16,30,30] parameter(0)
  dy = f32[8,32,28,28] parameter(1)
  xt = f32[16,8,30,30] transpose(x), dimensions={1,0,2,3}
  xs = f32[16,8,28,28] slice(xt), slice={[0:16], [0:8], [1:29], [2:30]}
  dyt = f32[32,8,28,28] transpose(dy), dimensions={1,0,2,3}
  ROOT d = f32[16,32] dot(xs, dyt), lhs_contracting_dims={1,2,3}, rhs_contracting_dims={1,2,3}
}
"""
    m = module_of(text)
    assert_device_matches(m, target=target, rtol=1e-4, atol_scale=1e-4)
    from nxsat.backend import device_forms, lower_graph

    t = sim.load_target(target)
    insts = lower_graph(device_forms(m, t), t).graph.insts
    copies = [i for i in insts if i.engine == "dma" and i.writes[0].buf.kind == "scratch"]
    assert len({i.writes[0].buf.name for i in copies}) == 2
    assert all(i.reads[0].ap.contiguous_run() >= 28 for i in copies)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_many_m_tiles_read_the_moving_operand_once(target: str) -> None:
    """[640, 256] @ [256, 1200] (5 M tiles, 3 N tiles): the moving operand's tiles are kept for every M
    tile (MatmulPlan.n_block) instead of being loaded again for each, so each operand is read from HBM
    once; same values. (A 2048^3 bf16 dot re-read its moving operand 16 times: 151 MB of DMA for 25 MB
    of operands, TensorE busy 30%; now 34 MB and 82%.)"""
    from nxsat.extract.plan import matmul_plan

    t = sim.load_target(target)
    plan = matmul_plan(640, 256, 1200, "f32", t)
    assert plan.resident and plan.n_block == 3
    m = module_of(_dot("f32[640,256]", "f32[256,1200]", "f32[640,1200]",
                       "lhs_contracting_dims={1}, rhs_contracting_dims={0}"))
    model = assert_device_matches(m, target=target)
    s, _ = model.profile()
    operands = (640 * 256 + 256 * 1200 + 640 * 1200) * 4
    assert s["hbm"]["bytes"] == operands
    # without the kept tiles: the moving operand once per M tile
    assert matmul_plan(128, 256, 1200, "f32", t).n_block == 0


def test_the_moving_operand_is_kept_only_where_it_fits() -> None:
    """Blocks of N tiles whose moving tiles fit MOVING_SBUF_SHARE: none when one N tile's do not (a
    long fp32 contraction), three of a bf16 one's."""
    from nxsat.extract.plan import MOVING_SBUF_SHARE, matmul_plan

    t = sim.load_target("trn1")
    assert 32 * 512 * 4 > MOVING_SBUF_SHARE * t.sbuf_bytes  # K = 4096: 32 K tiles of 512 fp32 columns
    assert matmul_plan(256, 4096, 4096, "f32", t).n_block == 0
    assert 3 * 16 * 512 * 2 <= MOVING_SBUF_SHARE * t.sbuf_bytes < 4 * 16 * 512 * 2
    assert matmul_plan(1024, 2048, 4096, "bf16", t).n_block == 3


def test_kept_moving_tiles_are_loaded_where_the_first_m_tile_needs_them() -> None:
    """[640, 256] @ [256, 1200] f32 keeps its 3 N tiles' moving tiles for every M tile. Each N tile's are
    loaded (in the lowering's order) after the matmuls of the N tile before it, one K tile per load: loaded
    all at once they shared the DMA engines with each other and the first matmul waited for the last
    (a 2048^3 bf16 dot: TensorE's first matmul at 29 us; its utilization 82.5% -> 85.0%)."""
    from nxsat.backend import lower_graph

    lw = lower_graph(module_of(_dot("f32[640,256]", "f32[256,1200]", "f32[640,1200]",
                                    "lhs_contracting_dims={1}, rhs_contracting_dims={0}")), sim.load_target("trn1"))
    insts = lw.graph.insts
    loads = [k for k, i in enumerate(insts) if i.opcode == "dma" and any(r.buf.name == "b" for r in i.reads)]
    first_mm = [next(k for k, i in enumerate(insts) if i.opcode == "matmul" and i.writes[0].buf is acc)
                for acc in dict.fromkeys(i.writes[0].buf for i in insts if i.opcode == "matmul")]
    assert len(loads) == 3 * 2  # 2 K tiles per N tile, one load each
    # N tile j's loads come after N tile j-1's first matmuls and before its own
    for j in range(3):
        assert all(k < first_mm[j] for k in loads[2 * j:2 * j + 2])
        if j:
            assert all(k > first_mm[j - 1] for k in loads[2 * j:2 * j + 2])


def test_a_constant_weight_is_stored_k_major() -> None:
    """A constant ``[out, in]`` weight (Relay's dense) is K-contiguous: on trn1 each of its tiles would go
    through a TensorE transpose and a PSUM copy. device-forms stores it transposed (backend/matmul.py
    kmajor_constants), read through a transpose (a view): plain loads, no transposes of it; same values."""
    from nxsat.backend import device_forms
    from nxsat.passes import fill_elided_constants

    rng = np.random.default_rng(0)
    text = _dot("f32[128,256]", "f32[384,256]", "f32[128,384]", "lhs_contracting_dims={1}, rhs_contracting_dims={1}")
    m = fill_elided_constants(module_of(text.replace("b = f32[384,256] parameter(1)",
                                                     "b = f32[384,256] constant({...})")), 0)
    w = m.entry.root.operands[1].attrs["value"]
    formed = device_forms(m, sim.load_target("trn1"))
    rhs = formed.entry.root.operands[1]
    assert rhs.op == "transpose" and rhs.operands[0].op == "constant"
    np.testing.assert_array_equal(rhs.operands[0].attrs["value"], w.T)
    c = compile_graph(m, sim.load_target("trn1"))
    # the transposes left are the activations' (x is K-contiguous too): 1 row block x 2 K tiles
    assert [i.opcode for i in c.program.instrs].count("transpose") == 2
    assert_device_matches(m, {"a": rng.standard_normal((128, 256)).astype(np.float32)})


def test_a_few_tokens_against_a_long_contraction_are_transposed_on_tensore() -> None:
    """gemma's MLP down-projection at 11 tokens: ``[11, 6912] @ [6912, 1152]`` with the tokens' K contiguous.
    An element-wise DMA would move one element per descriptor (76,032 of them); the rows load as they lie
    and TensorE transposes them, 128 of K at a time (extract/plan.py ``pe_transpose_pays``)."""
    from nxsat.extract.plan import pe_transpose_pays

    assert pe_transpose_pays(11, 6912) and not pe_transpose_pays(4, 32) and pe_transpose_pays(16, 16)
    assert pe_transpose_pays(44, 11)  # an attention's probabilities for its values' dot (gemma3: 11 tokens)
    text = _dot("bf16[11,6912]", "bf16[6912,1152]", "f32[11,1152]",
                "lhs_contracting_dims={1}, rhs_contracting_dims={0}")
    m = module_of(text)
    from nxsat.backend import lower_graph

    lw = lower_graph(m, sim.load_target("trn1"))
    loads = [i for i in lw.graph.insts if i.engine == "dma" and i.reads[0].buf.name == "a"]
    assert loads and all(i.reads[0].ap.dims[-1][1] == 1 for i in loads)  # rows, K contiguous
    assert sum(1 for i in lw.graph.insts if i.opcode == "transpose") >= 6912 // 128 - 4
    rng = np.random.default_rng(6)
    import ml_dtypes

    assert_device_matches(m, {"a": rng.standard_normal((11, 6912)).astype(ml_dtypes.bfloat16),
                              "b": (rng.standard_normal((6912, 1152)) / 80).astype(ml_dtypes.bfloat16)})


def test_a_k_contiguous_weight_streams_in_long_rows_one_group_ahead() -> None:
    """gemma's projections: 11 tokens against a [N, K] bf16 weight stored K-innermost. Each load moves
    rows of 2,048 K elements (4 KB per partition, extract/plan.py LOAD_BYTES) rather than 512, and a
    group's TensorE transposes are emitted before the previous group's matmuls, so TensorE transposes the
    next weights while the last ones are copied out of PSUM. Same values as the interpreter."""
    from nxsat.backend import lower_graph

    m = module_of(_dot("bf16[11,4096]", "bf16[1024,4096]", "f32[11,1024]",
                       "lhs_contracting_dims={1}, rhs_contracting_dims={1}"))
    insts = lower_graph(m, sim.load_target("trn1")).graph.insts
    loads = [i for i in insts if i.opcode == "dma" and any(r.buf.name == "b" for r in i.reads)]
    assert loads and all(i.operands[0].shape[-1] == 2048 for i in loads)
    kinds = [i.opcode for i in insts if i.engine == "pe"]
    # before the first matmul: the tokens' 32 K tiles, then both groups' weights (4 blocks of 128 N rows
    # x 16 K tiles each), where one group ahead of the matmuls would be one
    assert kinds[:kinds.index("matmul")].count("transpose") == 32 + 2 * 4 * 16
    assert_device_matches(m, target="trn1")


HEADS = {  # gemma's attention projections: a weight whose free or contracted dimensions are split in heads
    # q = x @ W, W [heads, d_model, head_dim]: N = heads x head_dim does not merge into one stride
    "q_projection": _dot("bf16[11,256]", "bf16[4,256,64]", "f32[11,4,64]",
                         "lhs_contracting_dims={1}, rhs_contracting_dims={1}"),
    # out = h @ W, W [heads, head_dim, d_model] contracted over (head_dim, heads): in memory order it merges
    "out_projection": _dot("bf16[11,4,64]", "bf16[4,64,256]", "f32[11,256]",
                           "lhs_contracting_dims={2,1}, rhs_contracting_dims={1,0}"),
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_weight_split_in_heads_is_read_as_it_lies(name: str) -> None:
    """No copy of the weight into a contiguous scratch (gemma3: 153 MB of its 2.35 GB of HBM traffic):
    the heads of a free dimension are batches of their own (the left operand repeated through a stride-0
    view), and a contraction is taken in the weight's memory order (a sum of the same terms)."""
    from nxsat.backend import lower_graph

    m = module_of(HEADS[name])
    lw = lower_graph(m, sim.load_target("trn1"))
    assert not any(b.kind == "scratch" for b in lw.graph.bufs)
    assert_device_matches(m, target="trn1")


def _descriptors(model: sim.Model, tensor: str) -> set[int]:
    """The descriptor sizes of the DMAs that read or write ``tensor``."""
    _, tl = model.profile()
    ins = model.program.instrs
    return {int(tr.descriptor_bytes) for k, tr in tl.transfers.items()
            if tensor in (ins[k].operands[0].tensor, ins[k].operands[1].tensor)}


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_a_few_tokens_read_a_wide_weight_in_whole_rows(target: str) -> None:
    """Eleven tokens against a [1024, 1152] bf16 weight (gemma's output projection): three N tiles of one
    M tile, so each K tile of the weight loads in rows of all 1,152 columns (2,304-byte descriptors,
    where 512-column tiles made 1 KiB ones and a 256-byte tail), the N tiles' matmuls reading its
    columns into three PSUM banks; same values."""
    from nxsat.extract.plan import matmul_plan

    plan = matmul_plan(11, 1024, 1152, "bf16", sim.load_target(target))
    assert plan.wide and plan.group(wide=True) == 1
    model = assert_device_matches(module_of(_dot("bf16[11,1024]", "bf16[1024,1152]", "bf16[11,1152]",
                                                 "lhs_contracting_dims={1}, rhs_contracting_dims={0}")),
                                  target=target, rtol=1e-2, atol_scale=1e-2)
    assert _descriptors(model, "b") == {1152 * 2}
    assert [i.opcode for i in model.program.instrs].count("matmul") == 8 * 3


def test_k_contiguous_weights_load_several_rows_to_a_partition() -> None:
    """Weights lying K-contiguous in whole rows of 1,152 bf16 (2,304 bytes: gemma's gating weights and LM
    head), transposed on TensorE: four adjacent rows a partition, 9,216-byte descriptors, each row's K
    blocks transposed apart and put back in order by the copy out of PSUM. Moving (``x @ W.T``, one N
    tile of 512 rows a load) and stationary (``W @ x``, four M tiles a load, when it streams through 64 M
    tiles or more: with fewer, TensorE waits longer for the first load); a 640-row weight ends in a
    block of 128 rows loaded one to a partition. Same values as the interpreter, the same descriptors
    in the cost model's plan."""
    from nxsat.extract.plan import matmul_plan

    t = sim.load_target("trn1")
    dims = "lhs_contracting_dims={1}, rhs_contracting_dims={1}"
    plan = matmul_plan(11, 1152, 640, "bf16", t)
    assert plan.moving_rows(1152, 640, 2) == 4
    model = assert_device_matches(module_of(_dot("bf16[11,1152]", "bf16[640,1152]", "bf16[11,640]", dims)),
                                  target="trn1", rtol=1e-2, atol_scale=1e-2)
    assert _descriptors(model, "b") == {4 * 2304, 2304}
    plan = matmul_plan(8192, 1152, 11, "bf16", t)
    assert plan.stationary_rows(8192, 1152, 2, plan.group(rows=True)) == 4
    assert plan.stationary_rows(1024, 1152, 2, plan.group(rows=True)) == 1  # eight M tiles: not a stream
    model = assert_device_matches(module_of(_dot("bf16[8192,1152]", "bf16[11,1152]", "bf16[8192,11]", dims)),
                                  target="trn1", rtol=1e-2, atol_scale=1e-2)
    assert _descriptors(model, "a") == {4 * 2304}


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_a_one_column_result_is_stored_in_rows(target: str) -> None:
    """An LM head for one token (``W @ x``: the weight stationary, the 1,000 results on the partitions, 128
    per tile): the tiles are gathered as columns, transposed on TensorE and stored as rows of 128, not
    a descriptor per value; the partial last tile is stored as it is. Same values."""
    model = assert_device_matches(module_of(_dot("f32[1000,64]", "f32[64,1]", "f32[1000,1]",
                                                 "lhs_contracting_dims={1}, rhs_contracting_dims={0}")),
                                  target=target, rtol=2e-5, atol_scale=2e-5)
    assert _descriptors(model, "out0_d") == {128 * 4, 4}  # seven tiles as rows; the last 104 results one by one


def test_a_weight_on_the_left_split_in_heads_is_read_as_it_lies() -> None:
    """``dot(W, x)`` with the weight on the left and its free dimensions (k/v, heads, head_dim) not merging
    into one stride (-O1 extracted gemma's k/v projection so): each of the outer free dimensions a batch
    against the same right operand, no copy of W (it was a copy of 2-byte descriptors)."""
    text = _dot("f32[2,1,64,32]", "f32[1,5,64]", "f32[2,1,32,1,5]",
                "lhs_contracting_dims={2}, rhs_contracting_dims={2}")
    assert_device_matches(module_of(text), rtol=2e-5, atol_scale=2e-5)
    c = compile_graph(module_of(text), sim.load_target("trn1"))
    assert not [n for n, t in c.program.tensors.items() if t.kind == "scratch"]


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_batch_dimensions_that_do_not_merge_are_read_batch_by_batch(target: str, dtype: str) -> None:
    """Attention's scores from ``[b, s, h, d]`` projections, batched over (b, h): the two batch dimensions
    lie apart (positions between them) and do not merge into one stride. Each batch is read through its
    own view; no permuted copy of either operand through HBM (transformer_layer: two 7.5 us copies on its
    critical path, generic -O2 57.5 -> 42.3 us)."""
    from nxsat.backend import lower_graph

    m = module_of(_dot(f"{dtype}[2,8,3,16]", f"{dtype}[2,8,3,16]", "f32[2,3,8,8]",
                       "lhs_batch_dims={0,2}, lhs_contracting_dims={3}, rhs_batch_dims={0,2}, "
                       "rhs_contracting_dims={3}"))
    lw = lower_graph(m, sim.load_target(target))
    assert not any(b.kind == "scratch" for b in lw.graph.bufs)
    assert_device_matches(m, target=target)


def test_a_result_turned_back_through_dimensions_of_one_is_written_in_place() -> None:
    """A swapped one-token P.V product (``dot(p, v)`` then a transpose that moves only dimensions of size
    1, the layout set's swap turned back) is the same bytes in the same order: the dot writes the output
    itself, where the transpose was a copy through HBM after it (1.3 us more on 4 us)."""
    text = """HloModule pv

ENTRY main {
  v = f32[1,128,4,32] parameter(0)
  p = f32[1,4,1,128] parameter(1)
  d = f32[1,4,1,32] dot(p, v), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,2},
    rhs_contracting_dims={1}
  ROOT r = f32[1,4,32,1] transpose(d), dimensions={0,1,3,2}
}
"""
    m = module_of(text)
    assert_device_matches(m)
    c = compile_graph(m, sim.load_target("trn1"))
    assert not [n for n, t in c.program.tensors.items() if t.kind == "scratch"]


INTERACTION = ("HloModule interaction\n\nENTRY main {\n  x = f32[300,6,8] parameter(0)\n"
               "  xc = bf16[300,6,8] convert(x)\n"
               "  ROOT z = f32[300,6,6] dot(xc, xc), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
               "rhs_batch_dims={0}, rhs_contracting_dims={2}\n}\n")


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("cast", [False, True])
def test_many_tiny_products_run_on_vectore_with_batches_on_the_partitions(cast: bool, target: str) -> None:
    """DLRM's feature interaction, ``X @ X.T`` for each of many batches of [6, 8]: VectorE with the batches
    on the partitions, one multiply of stride-0 views and one reduction per tile of 128 batches, no
    TensorE instruction; each operand loaded as it lies (the transposed one too: a row per batch, not a
    descriptor per element); rounded to bf16 first where the dot multiplies a cast (as TensorE would).
    The values match the reference's (the sums of eight exact products in another order)."""
    from nxsat.extract.plan import vector_dot

    text = INTERACTION if cast else INTERACTION.replace("  xc = bf16[300,6,8] convert(x)\n", "").replace(
        "dot(xc, xc)", "dot(x, x)")
    m = module_of(text)
    assert vector_dot(300, 6, 8, 6) and not vector_dot(16, 6, 8, 6) and not vector_dot(300, 64, 64, 64)
    prog = compile_graph(m, sim.load_target(target)).program
    ops = [(i.stream, i.opcode) for i in prog.instrs]
    assert ("pe", "matmul") not in ops and ops.count(("dve", "tensor_reduce")) == 3
    loads = [i for i in prog.instrs if i.opcode == "dma" and prog.tensors[i.operands[1].tensor].kind == "input"]
    assert len(loads) == 6  # two per tile of batches, each a row of 48 elements a partition
    assert ops.count(("dve", "tensor_copy")) == (6 if cast else 0)
    assert_device_matches(m, target=target)


def test_many_tiny_products_whose_batches_do_not_merge_take_tensore() -> None:
    """Batch dimensions with a free dimension between them (64 batches of [8, 6] @ [6, 5], the batches
    ``(0, 2)`` of ``[4, 8, 16, 6]``) do not merge into one stride: the vector path does not apply, and the
    dot runs on TensorE batch by batch (it was an internal error); same values."""
    text = _dot("f32[4,8,16,6]", "f32[4,6,16,5]", "f32[4,16,8,5]",
                "lhs_batch_dims={0,2}, lhs_contracting_dims={3}, rhs_batch_dims={0,2}, rhs_contracting_dims={1}")
    m = module_of(text)
    prog = compile_graph(m, sim.load_target("trn1")).program
    assert any(i.opcode == "matmul" for i in prog.instrs)
    assert_device_matches(m, target="trn1")

"""The convolution family (backend/conv.py): convolution, reduce-window and select-and-scatter compiled,
simulated on trn1 and trn2 and compared with the reference interpreter (or XLA's outputs).

Besides the corpus cases (tests/data/xla_ops), synthetic cases reach the paths the small cases do not:
several channel tiles and output-channel tiles, several PSUM banks of outputs, channels-last layouts
wider than one transpose, group packing, transposed convolutions, and plans forced to their limits
(tiny budgets: chunks shrunk, taps split over tiles, weights reloaded, blocks of windows meeting in
HBM). Their inputs are small integers, so every summation order gives the same result exactly.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from harness import (
    DATA,
    assert_device_matches,
    device_run,
    input_loads,
    lowered,
    module_of,
    random_inputs,
    reference_run,
)

from nxsat import sim
from nxsat.attrs import WindowDim
from nxsat.backend import compile_graph, device_forms, lower_graph
from nxsat.backend import conv as conv_module
from nxsat.diagnostics import NxsatError
from nxsat.extract import plan as plans
from nxsat.ir import Module

TARGETS = ["trn1", "trn2"]
XLA_CASES = sorted(p.stem for p in (DATA / "xla_ops").glob("*.hlo")
                   if p.stem.startswith(("conv_", "reduce_window_", "select_and_scatter_", "avgpool_grad")))


def _npz_inputs(path) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:  # noqa: ANN001
    ref = np.load(path)
    inputs = {k: ref[k] for k in ref.files if k.startswith("in")}
    outs = [ref[f"out{i}"] for i in range(sum(1 for k in ref.files if k.startswith("out")))]
    return inputs, outs


def small_ints(module: Module, seed: int = 0, lo: int = -3, hi: int = 4) -> dict[str, np.ndarray]:
    """Integer-valued inputs (exact sums in any order, in any float type)."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, p in enumerate(module.entry.params):
        t = p.type
        a = rng.integers(lo, hi, t.shape)
        out[f"in{i}"] = a.astype(np.float32) if t.dtype.is_float else a.astype(t.dtype.np)
    return out


def test_xla_cases_found() -> None:
    assert len(XLA_CASES) == 36  # 21 convolution, 8 reduce-window, 6 select-and-scatter, avgpool_grad


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", XLA_CASES)
def test_xla_op_case(name: str, target: str) -> None:
    inputs, _ = _npz_inputs(DATA / "xla_ops" / f"{name}.npz")
    assert_device_matches(module_of(DATA / "xla_ops" / f"{name}.hlo"), inputs, target)


# --- synthetic convolutions ------------------------------------------------------------------------

def conv_hlo(x: str, w: str, out: str, attrs: str, dtype: str = "f32", out_dtype: str | None = None) -> str:
    od = out_dtype or dtype
    return f"""HloModule conv
ENTRY main {{
  x = {dtype}[{x}] parameter(0)
  w = {dtype}[{w}] parameter(1)
  ROOT c = {od}[{out}] convolution(x, w), {attrs}
}}
"""


CONVS = {
    # two channel tiles (128 + 32), two output-channel tiles (128 + 64), several PSUM banks
    "nchw_tiles": conv_hlo("2,160,12,30", "192,160,3,3", "2,192,12,30", "window={size=3x3 pad=1_1x1_1}, "
                           "dim_labels=bf01_oi01->bf01"),
    # channels-last both ways, strided, asymmetric padding, a channel tile of 2 after 128
    "nhwc_strided": conv_hlo("2,13,11,130", "3,3,130,40", "2,7,5,40", "window={size=3x3 stride=2x2 "
                             "pad=1_1x0_0}, dim_labels=b01f_01io->b01f"),
    # a stem: 3 channels, 7x7 taps folded into the partitions, input rows wider than one transpose
    "stem_wide": conv_hlo("1,20,150,3", "7,7,3,16", "1,10,75,16", "window={size=7x7 stride=2x2 pad=3_3x3_3}, "
                          "dim_labels=b01f_01io->b01f"),
    # results wider than one transpose
    "nhwc_wide_out": conv_hlo("1,4,200,8", "3,3,8,12", "1,4,200,12", "window={size=3x3 pad=1_1x1_1}, "
                              "dim_labels=b01f_01io->b01f"),
    # depthwise over two packs of channels (128 + 32), bf16, weights a parameter
    "depthwise_bf16": conv_hlo("1,160,10,10", "160,1,3,3", "1,160,10,10", "window={size=3x3 pad=1_1x1_1}, "
                               "dim_labels=bf01_oi01->bf01, feature_group_count=160", "bf16"),
    # groups of 8 inputs and 16 outputs, four to a matmul
    "groups_packed": conv_hlo("1,32,9,9", "64,8,3,3", "1,64,7,7", "window={size=3x3}, dim_labels=bf01_oi01->bf01, "
                              "feature_group_count=4"),
    # the same groups channels-last, weights HWIO: each group's block loaded with its outputs innermost
    "groups_packed_hwio": conv_hlo("1,9,9,32", "3,3,8,64", "1,7,7,64", "window={size=3x3}, "
                                   "dim_labels=b01f_01io->b01f, feature_group_count=4"),
    # depthwise with a channel multiplier, channels-last
    "depthwise_multiplier": conv_hlo("1,6,6,4", "3,3,1,8", "1,6,6,8", "window={size=3x3 pad=1_1x1_1}, "
                                     "dim_labels=b01f_01io->b01f, feature_group_count=4"),
    # transposed convolution: base dilation 3 with stride 2 (three classes of outputs), reversed window
    "transposed": conv_hlo("1,16,5,6", "8,16,3,4", "1,8,8,8", "window={size=3x4 stride=2x2 pad=2_2x1_2 "
                           "lhs_dilate=3x3 rhs_reversal=1x1}, dim_labels=bf01_oi01->bf01"),
    # channels-last transposed convolution: results at every other position (stored row by row)
    "transposed_nhwc": conv_hlo("1,5,6,8", "3,3,8,12", "1,11,13,12", "window={size=3x3 pad=2_2x2_2 lhs_dilate=2x2}, "
                                "dim_labels=b01f_01io->b01f"),
    # channels-last, a prime number of positions: a last, partial transpose block
    "nhwc_prime": conv_hlo("1,1,131,8", "1,1,8,6", "1,1,131,6", "window={size=1x1}, dim_labels=b01f_01io->b01f"),
    # classes of outputs no tap reaches (their results are zero)
    "holes": conv_hlo("1,2,4", "3,2,1", "1,3,10", "window={size=1 lhs_dilate=3}, dim_labels=bf0_oi0->bf0"),
    # a 1-d convolution with the batch in the PSUM block, window dilation
    "batched_1d": conv_hlo("6,5,40", "4,5,3", "6,4,36", "window={size=3 rhs_dilate=2}, dim_labels=bf0_oi0->bf0"),
    # bf16 operands, f32 result (preferred element type)
    "bf16_to_f32_nhwc": conv_hlo("2,9,9,24", "3,3,24,40", "2,9,9,40", "window={size=3x3 pad=1_1x1_1}, "
                                 "dim_labels=b01f_01io->b01f", "bf16", "f32"),
    # weight gradient: batch groups over a channels-last input
    "weight_grad": conv_hlo("6,8,8,4", "6,6,6,6", "3,3,2,6", "window={size=6x6}, dim_labels=f01b_i01o->01bf, "
                            "batch_group_count=2"),
    # four PSUM banks a chunk with a shorter last piece (rows 24 + 24 + 22), and pieces along the batch
    "banks_ragged": conv_hlo("1,8,70,20", "16,8,3,3", "1,16,70,20", "window={size=3x3 pad=1_1x1_1}, "
                             "dim_labels=bf01_oi01->bf01"),
    "banks_batch": conv_hlo("12,8,7,7", "16,8,3,3", "12,16,7,7", "window={size=3x3 pad=1_1x1_1}, "
                            "dim_labels=bf01_oi01->bf01"),
    # integers: s32 sums exact below 2^24
    "s32_nhwc": conv_hlo("1,7,7,20", "3,3,20,9", "1,5,5,9", "window={size=3x3}, dim_labels=b01f_01io->b01f", "s32"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(CONVS))
def test_conv_paths(name: str, target: str) -> None:
    m = module_of(CONVS[name])
    assert_device_matches(m, small_ints(m), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name,budget", [("nchw_tiles", 256), ("stem_wide", 256), ("nhwc_strided", 16),
                                         ("groups_packed", 16), ("transposed", 16), ("weight_grad", 16)])
def test_conv_tight_budgets(name: str, budget: int, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Budgets far below the real ones: chunks shrink (to single positions), taps split over several
    input tiles, weights reload per block and output-channel tiles move outside the blocks."""
    monkeypatch.setattr(plans, "TILE_BUDGET", budget)
    # the implicit GEMM, which a weight gradient would otherwise not take
    monkeypatch.setattr(conv_module, "weight_gradients", lambda m: m)
    monkeypatch.setattr(plans, "WEIGHT_BUDGET", 64)
    m = module_of(CONVS[name])
    geo_plans = []
    orig = plans.conv_plan

    def spy(geo: plans.ConvGeometry, t: sim.Target) -> plans.ConvPlan:
        geo_plans.append((geo, orig(geo, t)))
        return geo_plans[-1][1]

    monkeypatch.setattr(conv_module, "conv_plan", spy)
    assert_device_matches(m, small_ints(m), target)
    geo, p = geo_plans[0]
    assert not p.cache_weights
    assert math.prod(p.chunk) < math.prod(plans.chunk_of(
        (geo.batch, *(max(c.count for c in cl) for cl in geo.classes())), 512))
    if budget == 16 and name != "transposed":  # (its taps are one per class, or folded)
        taps = [len(c[0].taps) for c in geo.classes()]
        assert any(b < n for d, (b, n) in enumerate(zip(p.tap_block, taps)) if not (p.fold > 1 and d == p.fold_dim))


def _geo(**kw) -> plans.ConvGeometry:  # noqa: ANN003
    base = dict(batch=1, in_channels=64, out_channels=64, groups=1, batch_groups=1, in_spatial=(56, 56),
                out_spatial=(56, 56), window=(WindowDim(3, 1, 1, 1),) * 2, dtype="f32", itemsize=4)
    base.update(kw)
    return plans.ConvGeometry(**base)


def test_conv_plan_decisions() -> None:
    t1, t2 = sim.load_target("trn1"), sim.load_target("trn2")
    p = plans.conv_plan(_geo(), t1)
    # 64 channels: two taps of a row on the partitions; 8 rows of 56 outputs per PSUM bank, four banks
    # (32 rows) per input tile, evacuation and store
    assert (p.pack, p.c_tile, p.fold, p.o_tile) == (1, 64, 2, 64)
    assert p.chunk == (1, 32, 56) and p.piece == (1, 8, 56) and p.transpose_in == "dma"
    assert p.matmuls(_geo()) == 7 * 2 * 3
    rag = plans.conv_plan(_geo(in_channels=8, out_channels=16, in_spatial=(70, 20), out_spatial=(70, 20)), t1)
    assert (rag.chunk, rag.bank_dim, rag.bank_len) == ((1, 70, 20), 1, 24)
    bat = plans.conv_plan(_geo(batch=12, in_channels=8, out_channels=16, in_spatial=(7, 7), out_spatial=(7, 7)), t1)
    assert (bat.chunk, bat.piece) == ((12, 7, 7), (6, 7, 7))
    # channels-last results keep one bank a chunk
    assert not plans.conv_plan(_geo(channels_last_out=True), t1).bank_len
    stem = _geo(in_channels=3, in_spatial=(230, 230), out_spatial=(112, 112),
                window=(WindowDim(7, 2),) * 2, channels_last_in=True, channels_last_out=True)
    ps = plans.conv_plan(stem, t1)
    assert (ps.fold, ps.c_tile) == (7, 3) and ps.transpose_in == "pe" and ps.transpose_out == "pe"
    assert plans.conv_plan(stem, t2).transpose_in == "dma_transpose"
    dw = _geo(in_channels=1, out_channels=1, groups=256)
    pd = plans.conv_plan(dw, t1)
    assert (pd.pack, pd.fold) == (128, 1) and pd.matmuls(dw) == 2 * 7 * 9
    big = _geo(in_channels=512, out_channels=512, in_spatial=(7, 7), out_spatial=(7, 7))
    pb = plans.conv_plan(big, t1)
    assert pb.chunk_outer and pb.matmuls(big) == 4 * 4 * 9  # one block: inputs and weights loaded once
    # a window too wide for one tile: taps split over tiles
    wide = _geo(in_channels=128, out_channels=8, in_spatial=(120, 120), out_spatial=(5, 5),
                window=(WindowDim(116, 1),) * 2)
    pw = plans.conv_plan(wide, t1)
    assert pw.tap_block[0] < 116 and pw.fold == 1


# --- depthwise on the vector engines ---------------------------------------------------------------

DEPTHWISE = {
    # (hlo, tile budget or None, activations expected)
    # a budget of two planes a partition: chunks of 48 channels stacked two deep (96 partitions), then
    # a last tile of one group (48 partitions); 2 tiles x 9 taps
    "stacked": (conv_hlo("6,48,20,20", "48,1,3,3", "6,48,20,20", "window={size=3x3 pad=1_1x1_1}, "
                         "dim_labels=bf01_oi01->bf01, feature_group_count=48"), 3200, 18),
    # strided, asymmetric padding, window dilation and reversal, the kernel in 01io order
    "strided_dilated": (conv_hlo("2,40,17,23", "3,3,1,40", "2,40,8,10", "window={size=3x3 stride=2x2 pad=1_0x0_1 "
                                 "rhs_dilate=1x2 rhs_reversal=1x1}, dim_labels=bf01_01io->bf01, "
                                 "feature_group_count=40"), None, 9),
    # 1-d, and no tap meets the input at every output (the sum starts from a memset)
    "no_whole_tap": (conv_hlo("3,50,4", "50,1,3", "3,50,6", "window={size=3 pad=2_2}, dim_labels=bf0_oi0->bf0, "
                              "feature_group_count=50"), None, 3),
    # bf16 operands and result: weights and sums widened to fp32, the result rounded once (one more pass)
    "bf16": (conv_hlo("4,64,12,12", "64,1,3,3", "4,64,12,12", "window={size=3x3 pad=1_1x1_1}, "
                      "dim_labels=bf01_oi01->bf01, feature_group_count=64", "bf16"), None, 10),
    # one plane in blocks of 3 rows (a tiny budget), each loading only the input rows it reads: 2 batch
    # elements x 5 blocks, 9 taps each
    "row_blocks": (conv_hlo("2,70,15,20", "70,1,3,3", "2,70,15,20", "window={size=3x3 pad=1_1x1_1}, "
                            "dim_labels=bf01_oi01->bf01, feature_group_count=70"), 256, 90),
    # channels innermost: rows are not contiguous, TensorE takes it
    "channels_last": (conv_hlo("2,9,9,40", "3,3,1,40", "2,9,9,40", "window={size=3x3 pad=1_1x1_1}, "
                               "dim_labels=b01f_01io->b01f, feature_group_count=40"), None, None),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(DEPTHWISE))
def test_depthwise_on_the_vector_engines(name: str, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forced onto the vector engines whatever the cost: the values, the tiles (one ScalarE product per
    tap and tile), and no matmul left (except where the layout sends the convolution back to TensorE)."""
    text, budget, acts = DEPTHWISE[name]
    monkeypatch.setattr(plans.DepthwisePlan, "pays", property(lambda self: True))
    if budget:
        monkeypatch.setattr(plans, "DEPTHWISE_TILE", budget)
    m = module_of(text)
    model = assert_device_matches(m, small_ints(m), target)
    ops = [(i.stream, i.opcode) for i in model.program.instrs]
    assert (("pe", "matmul") in ops) == (acts is None)
    if acts is not None:
        assert ops.count(("act", "activation")) == acts
    if name == "stacked":  # the adds alternate between VectorE and GpSimd by tile
        assert ops.count(("dve", "tensor_tensor")) == 8 and ops.count(("pool", "tensor_tensor")) == 8


def test_grouped_hwio_weights_load_in_runs_of_a_groups_outputs() -> None:
    """resnext's grouped 3x3 written channels-last (HWIO weights, 32 groups of 8): each group's block of
    the block-diagonal stationaries is loaded with its 8 output channels innermost, where they lie
    together in HBM (4-byte descriptors before: 7 us for each group's 2.3 KB, 41.4 -> 28.8 us for the
    layer on trn1). Same values."""
    m = module_of(conv_hlo("1,28,28,256", "3,3,8,256", "1,28,28,256", "window={size=3x3 pad=1_1x1_1}, "
                           "dim_labels=b01f_01io->b01f, feature_group_count=32"))
    weights = input_loads(m, (3, 3, 8, 256))
    assert len(weights) == 32 and all(i.reads[0].ap.contiguous_run() == 8 for i in weights)
    assert_device_matches(m, random_inputs(m), "trn1", rtol=1e-4, atol_scale=1e-4)


def test_patch_embedding_windows_copy_whole_rows_of_the_image() -> None:
    """A ViT's patch embedding (8x8 patches, stride 8, of an NHWC image: more taps than outputs, so one
    dot over the stacked windows, backend/conv.py ``weight_gradients``): each window is copied in rows of
    ``kw * C`` elements, as the image lies in HBM. Seen channels-first, the copies and the dot's loads
    moved one element per descriptor (the block's latency 62.2 -> 39.7 us). Same values."""
    m = module_of(conv_hlo("2,32,32,3", "8,8,3,64", "2,4,4,64", "window={size=8x8 stride=8x8}, "
                           "dim_labels=b01f_01io->b01f"))
    image = input_loads(m, (2, 32, 32, 3))
    assert image and all(i.reads[0].ap.contiguous_run() == 8 * 3 for i in image)
    assert_device_matches(m, random_inputs(m), "trn1", rtol=1e-4, atol_scale=1e-4)


@pytest.mark.parametrize("shapes", [
    ("1,128,14,14", "128,128,3,3", "1,128,14,14", "size=3x3 pad=1_1x1_1", ""),
    ("1,192,9,9", "160,192,3,3", "1,160,9,9", "size=3x3 pad=1_1x1_1", ""),  # two channel tiles, 160 outputs
    ("1,64,8,8", "256,64,1,1", "1,256,8,8", "size=1x1", ""),  # two output blocks of 128
])
def test_pytorch_layout_weights_load_as_rows_and_transpose_on_tensore(shapes: tuple[str, ...]) -> None:
    """PyTorch's OIHW weights (each output channel's ``I * K`` values together): an ``[I, K..., O]`` load
    moved one element per descriptor (114 us for a 3x3 convolution of 128 channels on trn1: 119.2 -> 9.4 us
    with its epilogue); now each output channel's row loads whole and each tap's ``[O, I]`` block is
    transposed on TensorE (``extract.plan.weights_by_rows``). Same values."""
    x, w, y, window, extra = shapes
    m = module_of(conv_hlo(x, w, y, f"window={{{window}}}, dim_labels=bf01_oi01->bf01{extra}"))
    wshape = tuple(int(v) for v in w.split(","))
    loads = [i.reads[0] for i in input_loads(m, wshape)]
    assert loads and all(r.ap.contiguous_run() >= math.prod(r.shape[1:]) for r in loads)  # whole rows
    transposes = [i for i in lowered(m) if i.opcode == "transpose"]
    assert len(transposes) >= math.prod(wshape[2:])
    assert_device_matches(m, random_inputs(m), "trn1", rtol=1e-4, atol_scale=1e-4)


def test_plane_tiling() -> None:
    # mobilenet_v2's first depthwise layer: 32 channels stacked 4 deep, one plane in four blocks of 28 rows
    t = plans.plane_tiling(96, 32, 112, 4 * 112, 128)
    assert (t.chunk, t.stack(32, 96), t.batch, t.block) == (32, 4, 1, 28) and t.tiles(32, 96, 112) == 96
    # its last (960 channels of 7x7): 48 images a partition, chunks of 64 channels stacked two deep
    t = plans.plane_tiling(96, 960, 7, 4 * 7, 128)
    assert (t.chunk, t.stack(64, 96), t.batch, t.block) == (64, 2, 48, 7) and t.tiles(960, 96, 7) == 15
    # 96 channels: three chunks of 32 stacked four deep use every lane
    t = plans.plane_tiling(96, 96, 56, 4 * 56, 128)
    assert t.chunk == 32 and t.stack(32, 96) == 4
    assert plans.plane_tiling(1, 8, 4, plans.DEPTHWISE_TILE + 1, 128) is None  # one row too large


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_vector_path_with_rounding(target: str) -> None:
    """Random floats (sums that round): mobilenet_v2's first depthwise layer in miniature, by cost."""
    m = module_of(conv_hlo("8,32,24,24", "32,1,3,3", "8,32,24,24", "window={size=3x3 pad=1_1x1_1}, "
                           "dim_labels=bf01_oi01->bf01, feature_group_count=32"))
    model = assert_device_matches(m, random_inputs(m), target)
    assert not any(i.opcode == "matmul" for i in model.program.instrs)


def test_depthwise_plan_decisions() -> None:
    t1 = sim.load_target("trn1")
    # mobilenet_v2's first depthwise layer (fp32, 32 channels): TensorE would use 32 rows at a quarter rate
    mb = _geo(batch=96, in_channels=1, out_channels=1, groups=32, in_spatial=(112, 112), out_spatial=(112, 112))
    d = plans.depthwise_plan(mb, plans.conv_plan(mb, t1), t1)
    assert d is not None and d.pays and d.tiling.block == 28 and d.tensor_ns > 4 * d.vector_ns
    # the corpus's bf16 depthwise layer (256 channels, batch 1): 128 channels to a matmul, TensorE wins
    bf = _geo(in_channels=1, out_channels=1, groups=256, dtype="bf16", itemsize=2)
    assert not plans.depthwise_plan(bf, plans.conv_plan(bf, t1), t1).pays
    # one tile: its eight adds all run on VectorE, its nine products on ScalarE
    one = _geo(in_channels=1, out_channels=1, groups=32, in_spatial=(8, 8), out_spatial=(8, 8))
    d1 = plans.depthwise_plan(one, plans.conv_plan(one, t1), t1)
    assert d1.tiling.tiles(32, 1, 8) == 1
    add = plans.op_ns(t1, "tensor_tensor", "dve", N=64, P=128, **plans._VECTOR_VARS)
    act = plans.op_ns(t1, "activation", "act", N=64, P=128, **plans._VECTOR_VARS)
    assert d1.vector_ns == pytest.approx(max(8 * add, 9 * act))
    # not depthwise: a plain convolution, a channel multiplier, a transposed convolution
    assert plans.depthwise_plan(_geo(), plans.conv_plan(_geo(), t1), t1) is None
    mult = _geo(in_channels=1, out_channels=2, groups=32)
    assert plans.depthwise_plan(mult, plans.conv_plan(mult, t1), t1) is None
    tr = _geo(in_channels=1, out_channels=1, groups=32, window=(WindowDim(3, 1, 1, 1, lhs_dilation=2),) * 2)
    assert plans.depthwise_plan(tr, plans.conv_plan(tr, t1), t1) is None


def test_window_classes() -> None:
    # base dilation 3, stride 2: outputs fall in 3 classes, each tap meets real elements in one of them
    cls = plans.window_classes(5, 3, 2, 2, 3, 1, 7)
    assert [(c.first, c.step, c.count, c.istep) for c in cls] == [(0, 3, 3, 2), (1, 3, 2, 2), (2, 3, 2, 2)]
    assert [t for c in cls for t, _ in c.taps] == [2, 0, 1]


# --- synthetic windows -----------------------------------------------------------------------------

def window_hlo(x: str, out: str, op: str, init: str, attrs: str, dtype: str = "f32") -> str:
    return f"""HloModule rw
body {{
  a = {dtype}[] parameter(0)
  b = {dtype}[] parameter(1)
  ROOT r = {dtype}[] {op}(a, b)
}}
ENTRY main {{
  x = {dtype}[{x}] parameter(0)
  i = {dtype}[] constant({init})
  ROOT y = {dtype}[{out}] reduce-window(x, i), window={{{attrs}}}, to_apply=body
}}
"""


WINDOWS = {
    "maxpool_nhwc": window_hlo("2,30,30,64", "2,15,15,64", "maximum", "-inf",
                               "size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0"),
    "avgpool_nchw_tiles": window_hlo("1,130,9,9", "1,130,4,4", "add", "0", "size=1x1x2x2 stride=1x1x2x2"),
    "cumsum_long": window_hlo("4,300", "4,300", "add", "0", "size=1x300 pad=0_0x299_0"),
    "bf16_max_dilated": window_hlo("3,20,20", "3,9,20", "maximum", "-inf",
                                   "size=1x3x2 stride=1x2x1 pad=0_0x1_0x1_0 lhs_dilate=1x1x1 rhs_dilate=1x2x1",
                                   "bf16"),
    "s32_min_base_dilated": window_hlo("6,7", "6,13", "minimum", "2147483647", "size=1x3 lhs_dilate=1x2 pad=0_0x1_1",
                                       "s32"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(WINDOWS))
def test_reduce_window_paths(name: str, target: str) -> None:
    m = module_of(WINDOWS[name])
    assert_device_matches(m, small_ints(m, lo=-50, hi=50), target)


def test_a_max_pooling_window_runs_in_two_passes() -> None:
    """A 3x3 max pooling's nine taps reduce in two passes (``WinBlock.separable``): the three taps of one
    dimension over every element of the other's box, then the other's three over that: four steps, not
    eight (the same maximum in any order), on VectorE, with no step for XLA's -inf init; a NaN anywhere in
    a window still gives NaN. (With the rows on the partitions, each row tap a copy of its own, two passes
    take as many element-steps as one step per tap: the window is reduced as before.)"""
    from nxsat.backend import compile_graph

    m = module_of(window_hlo("1,32,30,30", "1,32,15,15", "maximum", "-inf",
                             "size=1x1x3x3 stride=1x1x2x2 pad=0_0x0_0x1_1x1_1"))  # resnet_small's, channels first
    prog = compile_graph(m, sim.load_target("trn1")).program
    steps = [i for i in prog.instrs if i.opcode == "tensor_tensor"]
    assert len(steps) == 4 and {i.stream for i in steps} == {"dve"}
    assert not any(i.opcode == "tensor_scalar" for i in prog.instrs)
    inputs = small_ints(m, lo=-50, hi=50)
    x = next(iter(inputs.values()))
    x.reshape(-1)[::97] = np.nan
    assert_device_matches(m, inputs, "trn1")


def test_a_window_along_three_dimensions_runs_in_two_chains() -> None:
    """A max window with taps along three dimensions is not separable in two passes: its taps reduce in
    two chains, on VectorE and on GpSimd, joined by one step."""
    from nxsat.backend import compile_graph

    m = module_of(window_hlo("4,9,9", "2,4,4", "maximum", "-inf", "size=2x3x3 stride=2x2x2"))
    prog = compile_graph(m, sim.load_target("trn1")).program
    steps = Counter(i.stream for i in prog.instrs if i.opcode == "tensor_tensor")
    assert steps["pool"] > 0 and steps["dve"] > steps["pool"]
    assert_device_matches(m, small_ints(m, lo=-50, hi=50), "trn1")


def test_pooling_blocks_of_half_the_partitions_are_stacked() -> None:
    """ResNet-50's max pooling: four blocks of 64 channels (14 output rows each), two by two in tiles of
    128 partitions, so every step of the window is one instruction for two blocks, each block loaded into
    and stored from its half (and the first pack runs while the layer before still writes the rows of the
    second); padding and NaNs as before."""
    from nxsat.backend import compile_graph

    m = module_of(window_hlo("1,64,112,112", "1,64,56,56", "maximum", "-inf",
                             "size=1x1x3x3 stride=1x1x2x2 pad=0_0x0_0x1_1x1_1"))
    prog = compile_graph(m, sim.load_target("trn1")).program
    steps = [i for i in prog.instrs if i.opcode == "tensor_tensor"]
    assert len(steps) == 8  # the window's two passes of two steps, once per pack of two blocks
    assert all(prog.tensors[i.operands[0].tensor].shape[0] == 128 and not i.operands[0].index for i in steps)
    inputs = small_ints(m, lo=-50, hi=50)
    x = next(iter(inputs.values()))
    x.reshape(-1)[::97] = np.nan
    assert_device_matches(m, inputs, "trn1")


def test_a_max_pooling_read_only_by_a_cast_writes_the_cast() -> None:
    """ResNet-50's max pooling feeds its first convolutions through a cast to bf16: the pooling writes the
    cast's value itself (its fp32 maxima rounded once as they are written, which is what the cast does), so
    no pass of the cast's own goes through HBM; the same bits as the interpreter's, NaNs too."""
    from nxsat.backend import compile_graph

    src = window_hlo("1,64,112,112", "1,64,56,56", "maximum", "-inf",
                     "size=1x1x3x3 stride=1x1x2x2 pad=0_0x0_0x1_1x1_1")
    src = src.replace("ROOT y = f32[1,64,56,56]", "y = f32[1,64,56,56]").replace(
        "to_apply=body\n}", "to_apply=body\n  ROOT c = bf16[1,64,56,56] convert(y)\n}")
    m = module_of(src)
    prog = compile_graph(m, sim.load_target("trn1")).program
    assert not any("convert" in (i.origin or "") for i in prog.instrs)
    steps = [i for i in prog.instrs if i.opcode == "tensor_tensor"]
    assert len(steps) == 8 and prog.tensors[steps[-1].operands[0].tensor].dtype.name == "bf16"
    inputs = {k: v * 1.001 for k, v in small_ints(m, lo=-50, hi=50).items()}  # values bf16 rounds
    x = next(iter(inputs.values()))
    x.reshape(-1)[::97] = np.nan
    assert_device_matches(m, inputs, "trn1")


def relu_then_3x3(cin: int, c: int, hw: int) -> str:
    """A 1x1 convolution of ``cin`` to ``c`` channels, a ReLU, and a 3x3 of ``c`` channels (NCHW, OIHW):
    the 3x3's input tiles are the ReLU's, still on chip."""
    return f"""HloModule fold
ENTRY main {{
  x = f32[1,{cin},{hw},{hw}] parameter(0)
  w1 = f32[{c},{cin},1,1] parameter(1)
  w2 = f32[{c},{c},3,3] parameter(2)
  a = f32[1,{c},{hw},{hw}] convolution(x, w1), window={{size=1x1}}, dim_labels=bf01_oi01->bf01
  z = f32[] constant(0)
  zb = f32[1,{c},{hw},{hw}] broadcast(z), dimensions={{}}
  r = f32[1,{c},{hw},{hw}] maximum(a, zb)
  ROOT y = f32[1,{c},{hw},{hw}] convolution(r, w2), window={{size=3x3 pad=1_1x1_1}}, dim_labels=bf01_oi01->bf01
}}
"""


def test_fold_blocks_of_few_channels_start_at_quadrants(tmp_path: Path) -> None:
    """A 3x3 convolution of 16 channels stacks its three row taps on the partitions: at 0, 32 and 64 rather
    than 0, 16 and 32, so each block of the input computed just before (the ReLU's tiles, still in SBUF)
    is copied there by an engine (which starts at partitions 0, 32, 64 or 96), where the block at 16 took
    an SBUF-to-SBUF DMA. The rows between blocks are zeros in both operands: the same values."""
    from nxsat.driver import CompileOptions, compile_model

    src = relu_then_3x3(32, 16, 16)
    path = tmp_path / "fold.hlo"
    path.write_text(src)
    report = compile_model(str(path), CompileOptions(target="trn1", optlevel=1)).report
    assert report["forwarded"]["loads"] > 0
    assert report["forwarded"]["copies"] == report["forwarded"]["loads"]  # no SBUF-to-SBUF DMA
    lw = lower_graph(module_of(src), sim.load_target("trn1"))
    fills = [i for i in lw.graph.insts if i.opcode == "dma" and i.operands[0].buf.name.startswith("cvin")
             and i.operands[0].buf.shape[0] == 2 * 32 + 16]  # the 3x3's tile: three blocks 32 apart
    starts = {i.operands[0].ops[0][1][0].start for i in fills}  # the partition each block's load starts at
    assert starts == {0, 32, 64}
    m = module_of(src)
    assert_device_matches(m, small_ints(m), "trn1")


@pytest.mark.parametrize("target", TARGETS)
def test_a_folds_last_tap_reads_the_first_groups_tile(target: str) -> None:
    """A 3x3 convolution of 64 channels folds row taps 0 and 1 onto the partitions; tap 2 is block 0 two rows
    on, so it reads that tile, grown by two rows, rather than a 64-partition tile of its own
    (``extract.plan.fold_homes``: ResNet-50's stage 1 copied each input row into three places, now two).
    Only the tiles' padding is zeroed. Same values."""
    t = sim.load_target(target)
    m = module_of(relu_then_3x3(64, 64, 20))
    insts = lower_graph(m, t).graph.insts
    taps = [i.operands[2] for i in insts if i.opcode == "matmul" and i.operands[2].buf.shape[-1] == 22]
    assert sorted(r.shape[0] for r in taps) == [64] * 3 + [128] * 3  # taps 0 and 1 folded, then tap 2
    assert {r.buf.shape for r in taps} == {(128, 1, 22, 22)}  # one tile: 20 rows, 2 more for tap 2
    zeroed = [i.operands[0] for i in insts if i.opcode == "memset" and i.operands[0].buf.name.startswith("cvin")]
    assert zeroed and all(math.prod(r.shape[1:]) < math.prod(r.buf.shape[1:]) for r in zeroed)
    assert_device_matches(m, small_ints(m), target)


@pytest.mark.parametrize("target", TARGETS)
def test_reduce_window_tight_budget(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plans, "WINDOW_TILE_BUDGET", 512)
    monkeypatch.setattr(plans, "WINDOW_FREE", 16)
    m = module_of(WINDOWS["maxpool_nhwc"])
    assert_device_matches(m, small_ints(m, lo=-50, hi=50), target)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_stem_loads_its_image_as_rows(dtype: str) -> None:
    """A 3-channel channels-last image: its channel vectors are 6 or 12 bytes, one DMA descriptor each
    (ResNet-50's stem: 85 us of its critical path). It loads as whole rows instead and TensorE transposes
    each channel into the positions-on-partitions tile the fold's transposes read; same values. The folded
    tile's padding columns are zeroed, not the whole tile the transposes write."""
    from nxsat.backend import lower_graph

    m = module_of(CONVS["stem_wide"].replace("f32[", f"{dtype}["))
    lw = lower_graph(m, sim.load_target("trn1"))
    loads = [i for i in lw.graph.insts if i.opcode == "dma" and any(r.buf.name == "x" for r in i.reads)]
    assert loads and all(i.operands[0].buf.name.startswith("cvrows") for i in loads)
    # the folded tiles' padding is three columns each side (pad 3): only those are zeroed, not whole tiles
    zeroed = [i.operands[0] for i in lw.graph.insts
              if i.opcode == "memset" and i.operands[0].buf.name.startswith("cvin")]
    assert zeroed and all(r.shape[-1] <= 3 < r.buf.shape[-1] for r in zeroed)
    assert_device_matches(m, small_ints(m), "trn1")


def padded_window_hlo(op: str, init: str, value: str, pool: str = "size=1x3x3x1 stride=1x2x2x1") -> str:
    return f"""HloModule rwpad
body {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] {op}(a, b)
}}
ENTRY main {{
  x = f32[1,12,12,16] parameter(0)
  v = f32[] constant({value})
  p = f32[1,14,14,16] pad(x, v), padding=0_0x1_1x1_1x0_0
  i = f32[] constant({init})
  ROOT y = f32[1,6,6,16] reduce-window(p, i), window={{{pool} pad=0_0x0_0x0_0x0_0}}, to_apply=body
}}
"""


PADDED_WINDOWS = {  # Keras's ZeroPadding2D + MaxPooling2D; a value that is not the identity; one that is
    "max_zero_pad": padded_window_hlo("maximum", "-inf", "0"),
    "min_seven_pad": padded_window_hlo("minimum", "inf", "7"),
    "add_zero_pad": padded_window_hlo("add", "0", "0"),
}


@pytest.mark.parametrize("tight", [False, True])
@pytest.mark.parametrize("name", list(PADDED_WINDOWS))
def test_pooling_reads_through_its_pad(name: str, tight: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pad is claimed by the pooling (no HBM-to-HBM copy of the activation) and the edges still see its
    value: inputs mostly below it (max) or above it (min), and tiles so small that a block's taps meet only
    padding."""
    if tight:
        monkeypatch.setattr(plans, "WINDOW_TILE_BUDGET", 256)
        monkeypatch.setattr(plans, "WINDOW_FREE", 2)
    m = module_of(PADDED_WINDOWS[name])
    lw = lower_graph(m, sim.load_target("trn1"))
    pad = next(n for n in m.entry.post_order() if n.op == "pad")
    assert pad.id in lw.absorbed
    assert not any(i.engine == "dma" and all(not r.buf.onchip for r in (*i.reads, *i.writes)) for i in lw.graph.insts)
    lo, hi = (-50, 3) if name.startswith("max") else (5, 60)
    assert_device_matches(m, small_ints(m, lo=lo, hi=hi), "trn1")


SAS = """HloModule sas
sel {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY main {
  x = f32[2,12,12,16] parameter(0)
  s = f32[2,6,6,16] parameter(1)
  init = f32[] constant(0)
  ROOT r = f32[2,12,12,16] select-and-scatter(x, s, init), window={size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0},
    select=sel, scatter=add
}
"""


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("tight", [False, True])
def test_select_and_scatter_paths(target: str, tight: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlapping windows with ties (first maximum wins); with a tight budget the blocks' targets
    overlap and meet through HBM."""
    if tight:
        monkeypatch.setattr(plans, "WINDOW_TILE_BUDGET", 256)
        monkeypatch.setattr(plans, "WINDOW_FREE", 8)
    m = module_of(SAS)
    assert_device_matches(m, small_ints(m, lo=0, hi=4), target)


def test_window_body_outside_the_device_is_refused() -> None:
    """A body with an operator that has no elementwise form (a scalar dot) is refused, naming it."""
    text = WINDOWS["cumsum_long"].replace(
        "ROOT r = f32[] add(a, b)", "ROOT r = f32[] dot(a, b), lhs_contracting_dims={}, rhs_contracting_dims={}")
    m = module_of(text)
    with pytest.raises(NxsatError) as e:
        compile_graph(m, sim.load_target("trn1"))
    assert e.value.code == "NCC_EUOC002" and "operator dot" in str(e.value) and e.value.loc is not None


WEIGHT_GRADS = {
    # mobilenet_v2's forms, on smaller images: 1x1 kernels over whole images, a stride-2 3x3 layer's
    # gradient (window dilation 2, padding on one side), a depthwise layer's (a batch group per
    # channel), a grouped one with two channels per group, and a reversed window
    "1x1": ("6,40,12,12", "6,24,12,12", "1,1,40,24", "window={size=12x12}, dim_labels=fb01_io01->01bf"),
    "3x3_stride2": ("5,3,16,16", "5,8,8,8", "3,3,3,8",
                    "window={size=8x8 pad=1_0x1_0 rhs_dilate=2x2}, dim_labels=fb01_io01->01bf"),
    # (a reversed window: the planes path below does not take it)
    "depthwise_reversed": ("4,144,10,10", "4,144,10,10", "3,3,1,144", "window={size=10x10 pad=1_1x1_1 "
                           "rhs_reversal=1x0}, dim_labels=fb01_io01->01bf, batch_group_count=144"),
    "grouped": ("4,12,9,9", "4,12,9,9", "3,3,2,12",
                "window={size=9x9 pad=1_1x1_1}, dim_labels=fb01_io01->01bf, batch_group_count=6"),
    "reversed": ("3,4,7,7", "3,5,5,5", "3,3,4,5", "window={size=5x5 rhs_reversal=1x0}, dim_labels=fb01_io01->01bf"),
    # many output channels: the positions' windows stacked into one dot (gradient_stacking_pays)
    "3x3_stride2_stacked": ("5,3,16,16", "5,32,8,8", "3,3,3,32",
                            "window={size=8x8 pad=1_0x1_0 rhs_dilate=2x2}, dim_labels=fb01_io01->01bf"),
    "reversed_stacked": ("3,4,7,7", "3,32,5,5", "3,3,4,32",
                         "window={size=5x5 pad=0_0x1_-1 rhs_reversal=1x0}, dim_labels=fb01_io01->01bf"),
    # bf16 activations, an fp32 gradient (the padded windows stay bf16; the dot accumulates in fp32)
    "bf16_stacked": ("5,3,16,16", "5,32,8,8", "3,3,3,32",
                     "window={size=8x8 pad=1_0x1_0 rhs_dilate=2x2}, dim_labels=fb01_io01->01bf", "bf16", "f32"),
    "bf16_per_position": ("5,3,16,16", "5,8,8,8", "3,3,3,8",
                          "window={size=8x8 pad=1_0x1_0 rhs_dilate=2x2}, dim_labels=fb01_io01->01bf", "bf16", "f32"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(WEIGHT_GRADS))
def test_weight_gradients_are_contractions_per_output_position(case: str, target: str) -> None:
    """A convolution with more taps than outputs becomes one contraction per output position (over the
    batch and the image) instead of millions of one-tap matmuls, and computes the same values."""
    m = module_of(conv_hlo(*WEIGHT_GRADS[case]))
    (conv,) = [n for n in m.entry.post_order() if n.op == "convolution"]
    assert conv_module.is_weight_gradient(conv)
    rewritten = conv_module.weight_gradients(m)
    ops = [n.op for n in rewritten.entry.post_order()]
    assert "convolution" not in ops and ("dot" in ops or "reduce" in ops)
    assert (ops.count("dot") == 1 and "concatenate" in ops) == case.endswith("_stacked"), ops.count("dot")
    assert_device_matches(m, None, target)


PLANE_GRADS = {
    # mobilenet_v2's depthwise gradients in miniature: the features (the training batch) outermost, 144
    # groups, so a tile's planes wrap around the groups and the groups take two chunks (128 + 16)
    "features_outer": ("4,144,10,10", "4,144,10,10", "3,3,1,144", "window={size=10x10 pad=1_1x1_1}, "
                       "dim_labels=fb01_io01->01bf, batch_group_count=144"),
    # a stride-2 layer's: window dilation 2, padding on one side
    "stride2": ("6,40,12,12", "6,40,6,6", "3,3,1,40", "window={size=6x6 pad=1_0x1_0 rhs_dilate=2x2}, "
                "dim_labels=fb01_io01->01bf, batch_group_count=40"),
    # the groups outermost (an interval of planes per group), 1-d
    "groups_outer": ("50,3,40", "50,3,40", "1,50,3", "window={size=40 pad=1_1}, dim_labels=bf0_oi0->bf0, "
                     "batch_group_count=50"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("blocks", [False, True])
@pytest.mark.parametrize("case", sorted(PLANE_GRADS))
def test_depthwise_weight_gradients_on_planes(case: str, blocks: bool, target: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A depthwise layer's weight gradient stays a convolution (no multiply and reduce per position) and
    runs on the planes; with a tiny tile budget the kernel rows come one or a few at a time, some blocks
    reaching only some output positions."""
    if blocks:
        monkeypatch.setattr(plans, "DEPTHWISE_TILE", 192)  # 1-2 kernel rows of 2-d cases, 24 of the 1-d one
    m = module_of(conv_hlo(*PLANE_GRADS[case]))
    (conv,) = [n for n in m.entry.post_order() if n.op == "convolution"]
    assert conv_module.plane_weight_gradient(conv) and conv_module.is_weight_gradient(conv)
    assert device_forms(m, sim.load_target("trn1")) is m
    model = assert_device_matches(m, small_ints(m), target)
    ops = [(i.stream, i.opcode) for i in model.program.instrs]
    d = conv.attrs["dims"]
    x, k = conv.operands
    G, F = x.shape[d.input_batch], x.shape[d.input_feature]
    tl = plans.depthwise_gradient_tiling(F, G, tuple(x.shape[i] for i in d.input_spatial),
                                         tuple(k.shape[i] for i in d.kernel_spatial), tuple(conv.attrs["window"]), 128)
    positions = math.prod(conv.shape[i] for i in d.output_spatial)
    assert ops.count(("act", "activation")) >= positions  # a sum per position and tile at least
    # batch groups stacked on the partitions are summed by a selection matmul
    assert (("pe", "matmul") in ops) == any(tl.stack(cn, F) > 1 for _, cn in tl.chunks(G))


def test_the_driver_rewrites_weight_gradients_in_a_stage_of_their_own(tmp_path: Path) -> None:
    """The device-forms stage is named, timed and dumped: its HLO has the dots, not the convolution."""
    from nxsat.driver import CompileOptions, compile_model

    src = tmp_path / "wgrad.hlo"
    src.write_text(conv_hlo(*WEIGHT_GRADS["1x1"][:3], WEIGHT_GRADS["1x1"][3]))
    r = compile_model(str(src), CompileOptions(workdir=str(tmp_path / "wd"))).report
    assert "device-forms" in r["stages"]
    formed = (tmp_path / "wd" / "05-device-forms.hlo").read_text()
    assert "convolution(" not in formed and " dot(" in formed
    assert "convolution(" in (tmp_path / "wd" / "05-precision.hlo").read_text()


def test_first_layer_gradient_is_one_contraction_over_stacked_windows() -> None:
    """mobilenet_v2's first weight gradient (here 4 images of 224x224; 3x3 kernel, stride 2, 32 output
    channels): the nine kernel positions' input windows stacked into one operand (27 rows), so one dot
    with K = 4x112x112 on partitions reads and transposes the output gradient once: about 4x112x112/128
    matmuls, where a dot per position takes nine times as many (and the implicit GEMM one matmul per
    tap and position, more than 100,000)."""
    m = module_of(conv_hlo("4,3,224,224", "4,32,112,112", "3,3,3,32",
                           "window={size=112x112 pad=1_0x1_0 rhs_dilate=2x2}, dim_labels=fb01_io01->01bf"))
    lw = lower_graph(device_forms(m, sim.load_target("trn1")), sim.load_target("trn1"))
    count = Counter(i.opcode for i in lw.graph.insts)
    ideal = 4 * 112 * 112 / 128
    assert 0.95 * ideal <= count["matmul"] <= 1.15 * ideal, count
    assert count["transpose"] <= 1.1 * ideal, count  # one block of both operands per K tile (MatmulPlan.joint)


# --- models ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("optimized", [False, True])
def test_convnet_matches_xla(target: str, optimized: bool) -> None:
    inputs, expected = _npz_inputs(DATA / "jax" / "convnet.npz")
    assert_device_matches(module_of(DATA / "jax" / "convnet.hlo", optimized=optimized), inputs, target,
                          expected=expected)


@pytest.mark.parametrize("target", TARGETS)
def test_unet_tiny_matches_xla(target: str) -> None:
    inputs, expected = _npz_inputs(DATA / "jax" / "unet_tiny.npz")
    m = module_of(DATA / "jax" / "unet_tiny.hlo", optimized=True)
    try:
        compile_graph(m, sim.load_target(target))
    except NxsatError as e:
        if e.code == "NCC_EUOC002" and any(op in str(e) for op in ("gather", "iota")):
            pytest.skip(f"unet_tiny needs the indexing family: {e}")
        raise
    assert_device_matches(m, inputs, target, expected=expected)


UNET_CONVS = """HloModule unet_convs
ENTRY main {
  x = f32[1,8,8,2] parameter(0)
  w1 = f32[3,3,2,8] parameter(1)
  w2 = f32[3,3,8,16] parameter(2)
  w3 = f32[3,3,16,16] parameter(3)
  w4 = f32[3,3,24,8] parameter(4)
  w5 = f32[1,1,8,2] parameter(5)
  up = f32[1,8,8,16] parameter(6)
  c1 = f32[1,8,8,8] convolution(x, w1), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  c2 = f32[1,4,4,16] convolution(c1, w2), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  c3 = f32[1,4,4,16] convolution(c2, w3), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  cat = f32[1,8,8,24] concatenate(c1, up), dimensions={3}
  c4 = f32[1,8,8,8] convolution(cat, w4), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  c5 = f32[1,8,8,2] convolution(c4, w5), window={size=1x1}, dim_labels=b01f_01io->b01f
  ROOT t = (f32[1,4,4,16], f32[1,8,8,2]) tuple(c3, c5)
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_unet_convolutions(target: str) -> None:
    """unet_tiny's convolutions (its upsampling needs gather): channels-last, strided, after a concat."""
    m = module_of(UNET_CONVS)
    assert_device_matches(m, small_ints(m, lo=-2, hi=3), target)


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_model(target: str) -> None:
    m = module_of(DATA / "hlo" / "depthwise_conv_3x3_1x256x56x56_bf16.hlo")
    model = assert_device_matches(m, random_inputs(m), target)
    prof = model.profile()[0]
    assert prof["latency_ns"] >= prof["roofline"]["bound_ns"]


def resnet_inputs(module: Module, seed: int = 0) -> dict[str, np.ndarray]:
    """The harness's seeded inputs, scaled like a trained network's: raw standard normals make the
    batch-norm variances negative (every output NaN) and the activations overflow after a few layers.
    Convolution and dense weights get a 1/sqrt(fan-in) scale, per-channel parameters 0.5..1.5."""
    base = random_inputs(module, seed)
    out = {}
    for i, p in enumerate(module.entry.params):
        a = base[f"in{i}"].astype(np.float64)
        shape = p.type.shape
        if p.name.startswith("state") and len(shape) == 4:
            a = a / np.sqrt(np.prod(shape[:3]))
        elif len(shape) == 2:
            a = a / np.sqrt(shape[0])
        elif len(shape) == 1:
            a = 1.0 + 0.5 * np.tanh(a)
        out[f"in{i}"] = a.astype(np.float32)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_resnet50(target: str) -> None:
    m = module_of(DATA / "hlo" / "resnet50_keras_jax_f32.hlo", optimized=True)
    inputs = resnet_inputs(m)
    t0 = time.time()
    got, model = device_run(m, inputs, target)
    t1 = time.time()
    want = reference_run(m, inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5 * float(np.abs(want[0]).max()))
    for k in range(1, len(want)):  # the state passes through
        np.testing.assert_array_equal(got[k], want[k])
    prof = model.profile()[0]
    assert prof["latency_ns"] >= prof["roofline"]["bound_ns"]
    print(f"resnet50 {target}: compile+simulate {t1 - t0:.0f} s, latency {prof['latency_ns'] / 1e6:.2f} ms")


@pytest.mark.slow
def test_resnet50_under_unet_inference_loads_its_weights_in_bf16() -> None:
    """-O2 with bf16 matmuls: every fp32 weight is loaded into a bf16 tile, the DMA converting it (no engine
    pass over 25M weights), and the converted weights stream through a ring of SBUF of their own at one of
    -O2's shares (60%: 473.4 us, against 497.9 without a ring; backend/schedule.py ``ScheduleOptions.ring``,
    nxsat/driver.py ``RING_SHARES``). It computes what the reference does: the class scores within bf16's
    error, the state passed through unchanged."""
    from nxsat.driver import RING_SHARES, CompileOptions, compile_model

    path = DATA / "hlo" / "resnet50_keras_jax_f32.hlo"
    result = compile_model(str(path), CompileOptions(model_type="unet-inference", auto_cast="matmult"))
    search = result.report["search"]
    assert search["tried"][search["chosen"]].get("ring") in RING_SHARES
    model = sim.load(result.neff)
    prog = model.program
    weights = {n for n, t in prog.tensors.items() if t.kind == "input" and n.startswith("state") and len(t.shape) == 4}
    loads = [i for i in prog.instrs if i.opcode == "dma" and i.operands[1].tensor in weights]
    assert len({i.operands[1].tensor for i in loads}) == 53
    assert {prog.tensors[i.operands[0].tensor].dtype.name for i in loads} == {"bf16"}
    m = module_of(path, optimized=True)
    inputs = resnet_inputs(m)
    got = model.run(inputs)
    want = reference_run(m, inputs)
    err = np.linalg.norm(got[0].astype(np.float64) - want[0]) / np.linalg.norm(want[0].astype(np.float64))
    assert err <= 1.6e-2, err
    for k in range(1, len(want)):
        np.testing.assert_array_equal(got[k], want[k])


def test_an_input_channel_tiles_weights_load_in_one_dma_for_every_output_channel_tile() -> None:
    """A 1x1 HWIO weight of 512 output channels: each input-channel tile's weights are one DMA of whole
    rows (512 fp32, 2 KB) sliced into the four output-channel tiles on chip, not four DMAs of 512-byte
    runs (extract/plan.py ``ConvPlan.weight_group``)."""
    from nxsat.backend import lower_graph

    text = """HloModule c
ENTRY main {
  x = bf16[1,28,28,128]{3,2,1,0} parameter(0)
  w = f32[1,1,128,512]{3,2,1,0} parameter(1)
  wb = bf16[1,1,128,512]{3,2,1,0} convert(w)
  ROOT y = f32[1,28,28,512]{3,2,1,0} convolution(x, wb), window={size=1x1}, dim_labels=b01f_01io->b01f
}
"""
    m = module_of(text)
    lw = lower_graph(m, sim.load_target("trn1"))
    loads = [i for i in lw.graph.insts if i.engine == "dma" and i.reads[0].buf.name == "w"]
    assert len(loads) == 1 and loads[0].reads[0].ap.dims[-1] == (512, 1)
    rng = np.random.default_rng(7)
    import ml_dtypes

    assert_device_matches(m, {"x": rng.standard_normal((1, 28, 28, 128)).astype(ml_dtypes.bfloat16),
                              "w": (rng.standard_normal((1, 1, 128, 512)) / 12).astype(np.float32)},
                          rtol=2e-2, atol_scale=2e-2)


PADDED_POOL = window_hlo("1,64,20,20", "1,64,10,10", "maximum", "-inf",
                         "size=1x1x3x3 stride=1x1x2x2 pad=0_0x0_0x1_1x1_1")


def test_a_padded_pooling_fills_only_the_padding() -> None:
    """A max-pool's padding is written with the identity only where the window meets it, on GpSimd: no
    memset of the whole input tile for its loads to wait on, none on VectorE (which pools)."""
    model = assert_device_matches(module_of(PADDED_POOL))
    sets = [i for i in model.program.instrs if i.opcode == "memset"]
    assert sets and all(i.stream == "pool" and i.operands[0].index for i in sets)

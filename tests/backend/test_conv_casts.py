"""A cast of a convolution's weights, or of an image it convolves (a model input of a few channels), into the
TensorE type (what --auto-cast matmult inserts) is absorbed: the implicit GEMM loads the fp32 values and converts
the tiles on chip (or the DMA converts them as it loads them), so no cast is written to HBM; the depthwise path,
which multiplies in the weights' type on the vector engines, computes the casts first. Both match the reference
interpreter (the same rounding)."""

from __future__ import annotations

import pytest
from harness import assert_device_matches, module_of

from nxsat import sim
from nxsat.backend import compile_graph


def _conv(x: str, w: str, y: str, extra: str = "", window: str = "size=3x3 pad=1_1x1_1",
          labels: str = "b01f_01io->b01f") -> str:
    return f"""HloModule c

ENTRY main {{
  x = f32{x} parameter(0)
  w = f32{w} parameter(1)
  xb = bf16{x} convert(x)
  wb = bf16{w} convert(w)
  ROOT c = f32{y} convolution(xb, wb), window={{{window}}}, dim_labels={labels}{extra}
}}
"""


GEMM = _conv("[1,14,14,64]", "[3,3,64,96]", "[1,14,14,96]")
# grouped: the packed path's block-diagonal select converts the fp32 weights
GROUPED = _conv("[2,16,16,32]", "[3,3,1,32]", "[2,16,16,32]", ", feature_group_count=32")
# a depthwise layer's weight gradient, on the vector engines in the "weights'" (output gradient's) type:
# the cast is computed first
PLANE = """HloModule g

ENTRY main {
  x = f32[4,40,12,12] parameter(0)
  w = f32[4,40,6,6] parameter(1)
  xb = bf16[4,40,12,12] convert(x)
  wb = bf16[4,40,6,6] convert(w)
  ROOT c = f32[3,3,1,40] convolution(xb, wb), window={size=6x6 pad=1_0x1_0 rhs_dilate=2x2},
    dim_labels=fb01_io01->01bf, batch_group_count=40
}
"""
# a stem: a 3-channel image, its 7 taps of a row stacked on the partitions (the fold's loads convert)
STEM = _conv("[1,32,32,3]", "[7,7,3,16]", "[1,16,16,16]", window="size=7x7 stride=2x2 pad=2_3x2_3")
# the image's cast is absorbed (3 channels); a wide input's is a pass of its own (backend/lower.py IMAGE_CHANNELS)
CASES = {"stem": (STEM, []), "gemm": (GEMM, ["xb"]), "grouped": (GROUPED, ["xb"]),
         "plane_gradient": (PLANE, ["wb", "xb"])}


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_weight_cast(case: str, target: str) -> None:
    text, scratch = CASES[case]
    assert_device_matches(module_of(text), target=target, rtol=1e-5, atol_scale=1e-5)
    c = compile_graph(module_of(text), sim.load_target(target))
    assert sorted(n for n, t in c.program.tensors.items() if t.kind == "scratch") == scratch


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_the_stem_loads_the_image_in_bf16(target: str) -> None:
    """The stem's fp32 rows are converted to bf16 by the DMA that loads them, before TensorE transposes them
    (a GpSimd pass over every chunk of the image before; before that, another over every window made
    ResNet-50's stem 16.5 us longer): no engine converts an fp32 tile, and the positions the transposes give
    are copied out of PSUM in bf16 already."""
    prog = compile_graph(module_of(STEM), sim.load_target(target)).program
    loads = [i for i in prog.instrs if i.opcode == "dma" and i.operands[1].tensor == "x"]
    assert loads and {prog.tensors[i.operands[0].tensor].dtype.name for i in loads} == {"bf16"}
    fp32 = {n for n, t in prog.tensors.items() if t.kind == "sbuf" and t.dtype.name == "f32"}
    assert not [i for i in prog.instrs if i.opcode == "tensor_copy" and i.operands[1].tensor in fp32]


def test_a_stem_transposes_the_next_rows_while_the_last_ones_are_copied_out() -> None:
    """A stem's banks are prepared in two stages (its rows transposed, then windows of those rows) and
    software-pipelined two deep: bank k's rows, bank k-1's windows, bank k-2's matmuls, so TensorE has
    transposes to do while ScalarE copies the last ones out of PSUM (ResNet-50's stem 107 -> 80 us)."""
    import gc
    import itertools

    from nxsat.backend import lower_graph

    text = _conv("[1,128,128,3]", "[7,7,3,16]", "[1,64,64,16]", window="size=7x7 stride=2x2 pad=2_3x2_3")
    gc.collect()
    gc.disable()  # as compiles run: the staged steps must leave no cycle behind (one kept the whole graph)
    try:
        probe = lower_graph(module_of(text), sim.load_target("trn1"))
        probe.graph.release()
        del probe
        assert gc.collect() == 0
    finally:
        gc.enable()
    lw = lower_graph(module_of(text), sim.load_target("trn1"))
    pe = [i.opcode if i.opcode == "matmul" else i.operands[1].buf.root.name.rstrip("_0123456789")
          for i in lw.graph.insts if i.engine == "pe"]
    runs = [(k, len(list(g))) for k, g in itertools.groupby(pe)]
    rows = dict(runs[4:8]).get("cvrows")  # a bank's rows, once the pipeline is full
    assert rows and sum(n for k, n in runs[:runs.index(("matmul", 7))] if k == "cvrows") == 3 * rows, runs[:6]
    assert_device_matches(module_of(text), rtol=1e-5, atol_scale=1e-5)


def test_gemm_weight_tiles_are_converted_by_the_dma_that_loads_them() -> None:
    """The implicit GEMM's fp32 weights are loaded straight into bf16 tiles, the DMA converting as it copies
    (the target's ``dma.cast_dtypes``): no engine reads them in fp32, and they take half the SBUF (ResNet-50
    under unet-inference 532.7 -> 502.6 us, its 25M weights no longer converted on ScalarE and VectorE).
    The values are the ones the engines' conversion gave (test_weight_cast: the same rounding)."""
    prog = compile_graph(module_of(GEMM), sim.load_target("trn1")).program
    loads = [i for i in prog.instrs if i.opcode == "dma" and i.operands[1].tensor == "w"]
    assert loads and {prog.tensors[i.operands[0].tensor].dtype.name for i in loads} == {"bf16"}
    fp32 = {n for n, t in prog.tensors.items() if t.kind == "sbuf" and t.dtype.name == "f32"}
    assert not [i for i in prog.instrs if i.opcode in ("activation", "tensor_copy")
                and i.operands[1].tensor in fp32 and prog.tensors[i.operands[0].tensor].dtype.name == "bf16"
                and any(i.operands[1].tensor == ld.operands[0].tensor for ld in loads)]


def _gradient(x: str, g: str, y: str, window: str) -> str:
    return _conv(x, g, y, window=window, labels="fb01_io01->01bf")


GRADIENTS = {
    # one output position (a 1x1 kernel), a stride-2 3x3 layer's (sliced windows, padding), and the same
    # with its windows stacked into one dot (many output channels)
    "1x1": _gradient("[6,40,12,12]", "[6,24,12,12]", "[1,1,40,24]", "size=12x12"),
    "3x3_stride2": _gradient("[5,3,16,16]", "[5,8,8,8]", "[3,3,3,8]", "size=8x8 pad=1_0x1_0 rhs_dilate=2x2"),
    "3x3_stacked": _gradient("[5,3,16,16]", "[5,32,8,8]", "[3,3,3,32]", "size=8x8 pad=1_0x1_0 rhs_dilate=2x2"),
}


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("case", sorted(GRADIENTS))
def test_a_weight_gradients_casts_are_absorbed_by_its_dots(case: str, target: str) -> None:
    """Under --auto-cast matmult a weight gradient's operands are cast to bf16. device-forms' per-position
    dots take the casts with them: each loads its fp32 slices and converts the tiles, multiplying in bf16
    and accumulating in fp32 (the same rounding as casting first). Cast whole, each operand went through
    HBM in bf16 and was widened back to fp32 there, so the dots multiplied in fp32: 48.7 -> 16.3 us for a
    1x1 layer's gradient over 8 x 28 x 28 (trn1). No cast is written to HBM."""
    from nxsat.backend import device_forms

    m = module_of(GRADIENTS[case])
    assert_device_matches(m, target=target, rtol=1e-5, atol_scale=1e-5)
    t = sim.load_target(target)
    dots = [n for n in device_forms(m, t).entry.post_order() if n.op == "dot"]
    assert dots and all(o.op == "convert" and o.dtype.name == "bf16" for n in dots for o in n.operands)
    c = compile_graph(m, t)
    inputs = {p.type.shape for p in m.entry.params}
    assert not [n for n, tt in c.program.tensors.items() if tt.kind == "scratch" and tt.dtype.name == "bf16"
                and tt.shape in inputs]


def test_a_long_weight_conversion_is_shared_by_scalare_and_vectore() -> None:
    """A 3x3 kernel of 128 channels converted to bf16 is 1,152 elements a partition: ScalarE converts its
    share of the output channels and VectorE the rest, in proportion to their speeds (extract.plan.cast_split),
    so that loads waiting for SBUF room wait half as long. A 1x1 kernel's 128 stay on ScalarE. Same values.
    (On inf1, whose DMA copies bytes: trn1's DMA converts the weights as it loads them.)"""
    from nxsat.backend import device_forms, lower_graph
    from nxsat.extract.plan import cast_split

    t = sim.load_target("inf1")
    for w, split in (("[3,3,128,128]", True), ("[1,1,128,128]", False)):
        text = _conv("[1,8,8,128]", w, "[1,8,8,128]", window="size=3x3 pad=1_1x1_1" if split else "size=1x1")
        insts = lower_graph(device_forms(module_of(text), t), t).graph.insts
        casts = [i for i in insts if i.reads and i.reads[0].buf.name.startswith("cvw")
                 and i.opcode in ("activation", "tensor_copy")]
        engines = sorted(i.engine for i in casts)
        assert engines == (["act", "dve"] if split else ["act"])
        if split:
            act = next(i for i in casts if i.engine == "act")
            assert act.operands[0].shape[-1] == cast_split(t, 9 * 128, 128) == 71  # 1.25 : 1
        assert_device_matches(module_of(text), target="inf1", rtol=1e-5, atol_scale=1e-5)
    assert cast_split(t, 256, 128) == 128 and cast_split(t, 4096, 1) == 1

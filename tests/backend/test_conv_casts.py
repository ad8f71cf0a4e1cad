"""A cast of a convolution's weights, or of an image it convolves (a model input of a few channels), into the
TensorE type (what --auto-cast matmult inserts) is absorbed: the implicit GEMM loads the fp32 values and converts the
tiles on chip, so no cast is written to HBM; the depthwise path, which multiplies in the weights' type on
the vector engines, computes the casts first. Both match the reference interpreter (the same rounding)."""

from __future__ import annotations

import pytest
from harness import assert_device_matches, module_of

from nxsat import sim
from nxsat.backend import compile_graph


def _conv(x: str, w: str, y: str, extra: str = "", window: str = "size=3x3 pad=1_1x1_1") -> str:
    return f"""HloModule c

ENTRY main {{
  x = f32{x} parameter(0)
  w = f32{w} parameter(1)
  xb = bf16{x} convert(x)
  wb = bf16{w} convert(w)
  ROOT c = f32{y} convolution(xb, wb), window={{{window}}}, dim_labels=b01f_01io->b01f{extra}
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


def test_gemm_weight_tiles_convert_on_scalare() -> None:
    """The implicit GEMM's weight tiles are converted on ScalarE, which a convolution otherwise only uses to
    evacuate PSUM, and not on VectorE, which runs the layers' elementwise work (the same rounding)."""
    c = compile_graph(module_of(GEMM), sim.load_target("trn1"))
    weights = {i.operands[0].tensor for i in c.program.instrs if i.opcode == "dma" and i.operands[1].tensor == "w"}
    casts = [i for i in c.program.instrs if i.operands and len(i.operands) > 1 and i.operands[1].tensor in weights
             and i.opcode in ("activation", "tensor_copy")]
    assert casts and {i.stream for i in casts} == {"act"}

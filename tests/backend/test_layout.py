"""Where values live in HBM and how they get there: convolution regions stored channels-first where the
cost model says it pays (the layout rule set, rules/sets/layout.egg, chosen by the extraction), a strided
window read as whole rows (backend/conv.py), a pad's value written around the operand from an SBUF tile
(backend/movement.py), and a model's inputs returned unchanged copied under the run
(backend/schedule.py). Each checked on the program and against the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from harness import assert_device_matches, module_of

from nxsat.attrs import ConvDims
from nxsat.backend import compile_graph, device_forms
from nxsat.ir import Module
from nxsat.sim import load_target


def _extracted(text: str, layout: bool = True) -> Module:
    """The module as -O2 extracts it (generic rules, with or without the layout set), trn1's cost model."""
    from nxsat.extract import extract
    from nxsat.extract.cost import CostModel
    from nxsat.rules import saturate_module
    from nxsat.rules.catalog import catalog

    m = module_of(text)
    without = () if layout else tuple(r.name for r in catalog().set_rules(("layout",)))
    sat = saturate_module(m, "generic", 2, without=without)
    return extract(sat.egraph, sat.loaded, "dag", CostModel(load_target("trn1"), "f32", in_program=True)).module


def _channels_first(m: Module) -> set[str]:
    """The operators of ``m`` computed on a channels-first value: convolutions writing [N, C, ...] and the
    elementwise operators of their shape."""
    out = set()
    for n in m.entry.post_order():
        if n.op == "convolution" and n.attrs["dims"].output_feature == 1:
            out.add(n.op)
            shape = n.shape
            out |= {r.op for r in m.entry.post_order() if r.shape == shape and r.op not in ("broadcast", "parameter")}
    return out


def _block(h: int, c: int, o: int, tail: str = "") -> str:
    """JAX's NHWC conv -> inference batch norm -> ReLU -> 1x1 conv, at ``h x h`` positions, ``c`` channels
    in and ``o`` out (``tail``: more lines, the root among them, after ``y``)."""
    t = f"f32[1,{h},{h},{o}]{{3,2,1,0}}"
    nhwc = "dim_labels=b01f_01io->b01f"
    return f"""HloModule block
ENTRY main {{
  x = bf16[1,{h},{h},{c}]{{3,2,1,0}} parameter(0)
  w1 = bf16[3,3,{c},{o}]{{3,2,1,0}} parameter(1)
  mean = f32[{o}]{{0}} parameter(2)
  scale = f32[{o}]{{0}} parameter(3)
  beta = f32[{o}]{{0}} parameter(4)
  w2 = bf16[1,1,{o},{o}]{{3,2,1,0}} parameter(5)
  c1 = {t} convolution(x, w1), window={{size=3x3 pad=1_1x1_1}}, {nhwc}
  bm = {t} broadcast(mean), dimensions={{3}}
  s = {t} subtract(c1, bm)
  bs = {t} broadcast(scale), dimensions={{3}}
  m = {t} multiply(s, bs)
  bb = {t} broadcast(beta), dimensions={{3}}
  a = {t} add(m, bb)
  zero = f32[] constant(0)
  bz = {t} broadcast(zero), dimensions={{}}
  r = {t} maximum(a, bz)
  rb = bf16[1,{h},{h},{o}]{{3,2,1,0}} convert(r)
  {"ROOT " if not tail else ""}y = {t} convolution(rb, w2), window={{size=1x1}}, {nhwc}
{tail}}}
"""


def _inputs(h: int, c: int, o: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    import ml_dtypes

    return {"x": rng.standard_normal((1, h, h, c)).astype(ml_dtypes.bfloat16),
            "w1": (rng.standard_normal((3, 3, c, o)) / np.sqrt(9 * c)).astype(ml_dtypes.bfloat16),
            "mean": rng.standard_normal(o).astype(np.float32),
            "scale": rng.uniform(0.5, 1.5, o).astype(np.float32),
            "beta": rng.standard_normal(o).astype(np.float32),
            "w2": (rng.standard_normal((1, 1, o, o)) / np.sqrt(o)).astype(ml_dtypes.bfloat16)}


def _pe_transposes(module: object, formed: bool) -> int:
    """TensorE transposes in the lowering of ``module``, with or without the device forms."""
    from nxsat.backend import lower_graph

    t = load_target("trn1")
    lw = lower_graph(device_forms(module, t) if formed else module, t)  # type: ignore[arg-type]
    return sum(1 for i in lw.graph.insts if i.opcode == "transpose")


def test_a_large_image_is_stored_channels_first() -> None:
    """56x56 positions of 64 channels: the first convolution's result and its batch norm are stored
    [N, C, H, W] and the second convolution reads them as they lie (its input labels permuted): the middle
    value is no longer transposed on TensorE on its way out of the first convolution and into the second."""
    m = _extracted(_block(56, 64, 64))
    assert _channels_first(m) == {"add", "convert", "convolution", "maximum", "multiply", "subtract"}
    root = m.entry.root
    assert root.op == "convolution" and root.operands[0].shape == (1, 64, 56, 56)
    assert root.attrs["dims"].input_feature == 1
    first = next(n for n in m.entry.post_order() if n.op == "convolution" and n is not root)
    d: ConvDims = first.attrs["dims"]
    assert (d.output_batch, d.output_feature, d.output_spatial) == (0, 1, (2, 3))
    assert first.shape == (1, 64, 56, 56)
    kept = _extracted(_block(56, 64, 64), layout=False)
    assert _pe_transposes(m, formed=True) <= 0.7 * _pe_transposes(kept, formed=True)  # measured: 140 of 224
    assert_device_matches(m, _inputs(56, 64, 64), rtol=2e-2, atol_scale=2e-2)


def test_the_layout_is_chosen_by_the_convolutions_price() -> None:
    """Each region is flipped where the cost model prices its convolutions faster so. At 7x7 positions and
    512 channels the flip pays (simulated: 35.0 us against 39.5 kept). With 2,048 output channels it is
    close (132.0 us flipped against 136.5 kept, since the weights load in 2 KB runs, extract/plan.py
    WEIGHT_BUDGET): whatever the model chooses is within 2% of the faster layout."""
    from nxsat import sim

    t = load_target("trn1")

    def latency(module: Module) -> float:
        c = compile_graph(module, t)
        return sim.load(sim.build_neff(c.program, t, c.constants), verify=False).timeline().latency

    flipped = _extracted(_block(7, 512, 512))
    assert "convolution" in _channels_first(flipped)
    assert latency(flipped) < 0.95 * latency(_extracted(_block(7, 512, 512), layout=False))
    assert latency(_extracted(_block(7, 512, 2048))) <= 1.02 * latency(_extracted(_block(7, 512, 2048), layout=False))


def test_a_value_something_else_reads_keeps_its_layout() -> None:
    """The batch norm's result is also returned: it stays NHWC (the model's output keeps its layout), and
    so does everything computed up to it (a transpose moving it back would cost more than the flip saves)."""
    text = _block(56, 64, 64, tail="  ROOT out = (f32[1,56,56,64]{3,2,1,0}, f32[1,56,56,64]{3,2,1,0}) tuple(y, r)\n")
    m = _extracted(text)
    out = m.entry.root.operands[1]
    assert out.op == "maximum" and out.shape == (1, 56, 56, 64)
    assert not {"maximum", "subtract"} & _channels_first(m)
    assert_device_matches(m, _inputs(56, 64, 64), rtol=2e-2, atol_scale=2e-2)


def test_a_strided_window_over_channels_first_rows_loads_whole_rows() -> None:
    """A stride-2 convolution reading a channels-first value: its input box loads as whole rows and is
    read every second element on chip (one element per descriptor before). The values match."""
    text = _block(56, 64, 64, tail="  ROOT out = f32[1,28,28,64]{3,2,1,0} add(y, y)\n")
    text = text.replace("window={size=1x1}", "window={size=1x1 stride=2x2}").replace(
        "y = f32[1,56,56,64]{3,2,1,0} convolution(rb", "y = f32[1,28,28,64]{3,2,1,0} convolution(rb")
    m = _extracted(text)
    t = load_target("trn1")
    y = next(n for n in m.entry.post_order() if n.op == "convolution" and n.attrs["window"][0].stride == 2)
    assert y.attrs["dims"].input_feature == 1 and y.operands[0].op == "convert"
    from nxsat.backend import lower_graph

    lw = lower_graph(device_forms(m, t), t)
    loads = [i for i in lw.graph.insts if i.engine == "dma" and (i.origin or "").split(" ")[0] == y.name
             and i.writes[0].buf.onchip and i.reads[0].buf.kind == "scratch"]
    assert loads and all(i.reads[0].ap.dims[-1][1] == 1 for i in loads)
    assert_device_matches(m, _inputs(56, 64, 64), rtol=2e-2, atol_scale=2e-2)


PAD = """HloModule pad
ENTRY main {
  x = f32[1,20,24,16]{3,2,1,0} parameter(0)
  v = f32[] parameter(1)
  ROOT p = f32[1,23,27,16]{3,2,1,0} pad(x, v), padding=0_0x1_2x2_1x0_0
}
"""


@pytest.mark.parametrize("value", ["parameter", "constant"])
def test_a_pads_value_is_written_around_the_operand_from_sbuf(value: str) -> None:
    """The value goes only where the operand does not (the border's slabs), from one SBUF tile: no DMA
    reads HBM through a stride-0 pattern (a descriptor per element)."""
    text = PAD if value == "parameter" else PAD.replace("v = f32[] parameter(1)", "v = f32[] constant(-1.5)")
    m = module_of(text)
    c = compile_graph(m, load_target("trn1"))
    dmas = [i for i in c.program.instrs if i.opcode == "dma"]
    hbm_writes = [i for i in dmas if i.operands[0].tensor == "out0_p"]
    from_sbuf = [i for i in hbm_writes if i.operands[1].tensor.startswith("sb")]
    assert len(from_sbuf) == 4 and len(hbm_writes) == 5  # four slabs (H before/after, W before/after), the interior
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((1, 20, 24, 16)).astype(np.float32)}
    if value == "parameter":
        inputs["v"] = np.array(2.25, np.float32)
    assert_device_matches(m, inputs)


PASSTHROUGH = """HloModule step
ENTRY main {
  w = f32[512,1024]{1,0} parameter(0)
  x = f32[128,512]{1,0} parameter(1)
  d = f32[128,1024]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT out = (f32[128,1024]{1,0}, f32[512,1024]{1,0}) tuple(d, w)
}
"""


def test_a_returned_input_is_copied_first_on_a_queue_of_its_own() -> None:
    """A step that returns its weights unchanged: the copy waits for nothing, so it is the program's
    first instruction, alone on the last queue, and flows under the dot instead of after it."""
    m = module_of(PASSTHROUGH)
    c = compile_graph(m, load_target("trn1"))
    instrs = c.program.instrs
    first = instrs[0]
    assert (first.opcode, first.operands[0].tensor, first.operands[1].tensor) == ("dma", "out1_w", "w")
    assert [i for i in instrs if i.stream == first.stream] == [first]
    rng = np.random.default_rng(2)
    assert_device_matches(m, {"w": rng.standard_normal((512, 1024)).astype(np.float32),
                              "x": rng.standard_normal((128, 512)).astype(np.float32)})


KV_UPDATE = """HloModule kv
ENTRY main {
  cache = bf16[1,64,4,128]{3,2,1,0} parameter(0)
  new = bf16[1,1,4,128]{3,2,1,0} parameter(1)
  pos = s32[] parameter(2)
  zero = s32[] constant(0)
  ROOT u = bf16[1,64,4,128]{3,2,1,0} dynamic-update-slice(cache, new, zero, pos, zero, zero)
}
"""


def test_an_input_copied_then_updated_keeps_its_place() -> None:
    """A KV cache copied into the output and then updated in place: the update waits for the copy, so the
    copy is not moved to a queue of its own (a queue of 52 such copies held gemma's updates 148 us); it
    goes with the loads, as a copy that waits for nothing does."""
    m = module_of(KV_UPDATE)
    c = compile_graph(m, load_target("trn1"))
    dmas = [i for i in c.program.instrs if i.opcode == "dma"]
    copy = next(i for i in dmas if i.operands[1].tensor == "cache")
    # with the loads (q0-q11: it waits for nothing), not on q15, the returned inputs' own
    assert copy.stream in {f"q{k}" for k in range(12)}
    rng = np.random.default_rng(5)
    import ml_dtypes

    assert_device_matches(m, {"cache": rng.standard_normal((1, 64, 4, 128)).astype(ml_dtypes.bfloat16),
                              "new": rng.standard_normal((1, 1, 4, 128)).astype(ml_dtypes.bfloat16),
                              "pos": np.array(7, np.int32)})


RELAY_CONV = """HloModule relay_conv
ENTRY main {
  x = f32[1,64,28,28]{3,2,1,0} parameter(0)
  w = f32[128,64,3,3]{3,2,1,0} constant({...})
  xb = bf16[1,64,28,28]{3,2,1,0} convert(x)
  wb = bf16[128,64,3,3]{3,2,1,0} convert(w)
  ROOT y = f32[1,128,28,28]{3,2,1,0} convolution(xb, wb), window={size=3x3 pad=1_1x1_1}, dim_labels=bf01_oi01->bf01
}
"""


def test_a_constant_kernel_is_cast_at_compile_time_and_stored_hwio() -> None:
    """A Relay convolution's OIHW constant kernel under --auto-cast: the cast is done at compile time (the
    NEFF holds bf16: half the bytes, no pass converting it at run time) and the kernel is stored with its
    output channels innermost, read through a transpose (a view), so its [C, O] tap tiles load as rows
    (from OIHW they were one element per descriptor: the Relay ResNet-50 took 20.0 ms, now 1.85)."""
    from nxsat import dtypes as dt
    from nxsat.passes import fill_elided_constants

    m = fill_elided_constants(module_of(RELAY_CONV), 0)
    w = next(n for n in m.entry.post_order() if n.op == "constant").attrs["value"]
    formed = device_forms(m, load_target("trn1"))
    kernel = formed.entry.root.operands[1]
    assert kernel.op == "transpose" and kernel.operands[0].op == "constant"
    stored = kernel.operands[0].attrs["value"]
    assert stored.dtype == dt.BF16.np and stored.shape == (3, 3, 64, 128)
    np.testing.assert_array_equal(stored, np.transpose(w, (2, 3, 1, 0)).astype(dt.BF16.np))
    assert not any(n.op == "convert" and n.operands[0].op == "constant" for n in formed.entry.post_order())
    from nxsat.backend import lower_graph

    lw = lower_graph(formed, load_target("trn1"))
    loads = [i for i in lw.graph.insts if i.engine == "dma" and i.reads[0].buf.kind == "const"]
    assert loads and all(i.reads[0].ap.dims[-1][1] == 1 for i in loads)  # rows of output channels
    rng = np.random.default_rng(3)
    assert_device_matches(m, {"x": rng.standard_normal((1, 64, 28, 28)).astype(np.float32)}, rtol=1e-2,
                          atol_scale=1e-2)


STRIDED_CONCAT = """HloModule stacked
ENTRY main {
  x = f32[2,8,33,33]{3,2,1,0} parameter(0)
  a = f32[2,8,16,16]{3,2,1,0} slice(x), slice={[0:2], [0:8], [0:31:2], [0:31:2]}
  b = f32[2,8,16,16]{3,2,1,0} slice(x), slice={[0:2], [0:8], [1:32:2], [2:33:2]}
  ra = f32[1,2,8,16,16]{4,3,2,1,0} reshape(a)
  rb = f32[1,2,8,16,16]{4,3,2,1,0} reshape(b)
  ROOT c = f32[2,2,8,16,16]{4,3,2,1,0} concatenate(ra, rb), dimensions={0}
}
"""


def test_strided_windows_are_stacked_through_sbuf() -> None:
    """A weight gradient's stacked windows of a stride-2 layer (concatenated strided slices): the rows
    they take every second element of are loaded whole and the elements picked on chip, so no DMA moves
    one element per descriptor (a [2, 3, 96, 112, 112] stack: 5,526.6 -> 415.9 us)."""
    from nxsat.backend import lower_graph

    m = module_of(STRIDED_CONCAT)
    lw = lower_graph(m, load_target("trn1"))
    dmas = [i for i in lw.graph.insts if i.engine == "dma"]
    assert dmas and all(i.reads[0].ap.dims[-1][1] == 1 and i.writes[0].ap.dims[-1][1] == 1 for i in dmas)
    rng = np.random.default_rng(5)
    assert_device_matches(m, {"x": rng.standard_normal((2, 8, 33, 33)).astype(np.float32)})


def _concat_hlo(shared: bool, returned: bool) -> str:
    """exp(a) and -b concatenated along their last dimension; ``shared``: exp(a) is read again, by a sum;
    ``returned``: the model returns the concatenation (else its square)."""
    root = "c" if returned else "sq"
    lines = ["HloModule cat", "ENTRY main {", "  a = f32[4,6,8] parameter(0)", "  b = f32[4,6,5] parameter(1)",
             "  ea = f32[4,6,8] exponential(a)", "  nb = f32[4,6,5] negate(b)",
             "  c = f32[4,6,13] concatenate(ea, nb), dimensions={2}", "  sq = f32[4,6,13] multiply(c, c)"]
    if shared:
        lines += ["  s = f32[4,6,8] add(ea, ea)", f"  ROOT t = (f32[4,6,13], f32[4,6,8]) tuple({root}, s)"]
    else:
        lines += [f"  ROOT r = f32[4,6,13] copy({root})"]
    return "\n".join([*lines, "}", ""])


@pytest.mark.parametrize("returned", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_a_concatenation_s_operands_are_written_in_place(shared: bool, returned: bool) -> None:
    """An operand the concatenation alone reads is computed straight into its slice of the result: no buffer
    of its own and no copy (a UNet's skip concatenation). One read elsewhere too keeps its buffer and is
    copied. Either way the reference's values."""
    m = module_of(_concat_hlo(shared, returned))
    prog = compile_graph(m, load_target("trn1")).program
    own = {name for name in prog.tensors if name.startswith(("ea", "nb"))}
    assert own == ({"ea"} if shared else set()), own
    rng = np.random.default_rng(7)
    assert_device_matches(m, {"a": rng.standard_normal((4, 6, 8)).astype(np.float32),
                              "b": rng.standard_normal((4, 6, 5)).astype(np.float32)})

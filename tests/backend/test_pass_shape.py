"""What one fused elementwise pass holds and which engine runs each step (backend/elementwise.py):
a parameter's views join a pass that has started, a value's two readers share a pass, a product by a
number becomes the scale of the activation that alone reads it, and ScalarE takes products and sums
with numbers while VectorE has more of the pass. Each checked on the instructions and against the
interpreter."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from harness import assert_device_matches, module_of

from nxsat.backend import compile_graph
from nxsat.sim import load_target

# inference batch norm's parameter chain, as JAX writes it: gamma * rsqrt(var + eps), gamma a later parameter
BN_SCALE = """HloModule bn
ENTRY main {
  var = f32[64]{0} parameter(0)
  eps = f32[] constant(1e-05)
  e = f32[64]{0} broadcast(eps), dimensions={}
  a = f32[64]{0} add(var, e)
  r = f32[64]{0} rsqrt(a)
  gamma = f32[64]{0} parameter(1)
  g = f32[1,64]{1,0} reshape(gamma)
  gr = f32[64]{0} reshape(g)
  ROOT m = f32[64]{0} multiply(r, gr)
}
"""

def _gelu(x: str, t: str) -> str:
    """TVM's GELU of ``x`` (type ``t``), as gpt2_extract.relay writes it: ``x ** 3`` and ``0.5 * x`` both read x."""
    lines = [("three", "constant(3)"), ("t3", "broadcast(three)"), ("p", f"power({x}, t3)"),
             ("c1", "constant(0.044715)"), ("b1", "broadcast(c1)"), ("q", "multiply(p, b1)"), ("u", f"add({x}, q)"),
             ("c2", "constant(0.797885)"), ("b2", "broadcast(c2)"), ("v", "multiply(u, b2)"), ("th", "tanh(v)"),
             ("half", "constant(0.5)"), ("bh", "broadcast(half)"), ("h", f"multiply({x}, bh)"),
             ("one", "constant(1)"), ("bo", "broadcast(one)"), ("w1", "add(th, bo)"), ("ROOT y", "multiply(h, w1)")]
    return "".join(f"  {n} = {'f32[]' if e.startswith('constant') else t} {e}"
                   f"{', dimensions={}' if e.startswith('broadcast') else ''}\n" for n, e in lines)


GELU = f"""HloModule gelu
ENTRY main {{
  x = f32[256,1024]{{1,0}} parameter(0)
{_gelu("x", "f32[256,1024]{1,0}")}}}
"""


def _insts(text: str) -> list:
    c = compile_graph(module_of(text), load_target("trn1"))
    return c.program.instrs


def _evacuations(module: object) -> list[str]:
    """The engines that copy a dot's PSUM accumulators out, in the lowering's order."""
    from nxsat.backend import lower_graph

    lw = lower_graph(module, load_target("trn1"))  # type: ignore[arg-type]
    return [i.engine for i in lw.graph.insts if i.opcode in ("activation", "tensor_copy") and i.reads
            and i.reads[0].buf.kind == "psum" and i.reads[0].buf.name.startswith("acc")]


def _stores(instrs: list) -> int:
    """DMAs that write HBM (their first operand is not an on-chip tile)."""
    return sum(1 for i in instrs if i.opcode == "dma" and not i.operands[0].tensor.startswith(("sb", "ps")))


def test_a_parameters_views_join_the_pass_that_reads_them() -> None:
    """gamma's reshapes come after ``rsqrt(var + eps)`` in the order, yet nothing computes them: the product
    is in the same pass, so nothing is stored but the result (before: rsqrt went to HBM and came back)."""
    instrs = _insts(BN_SCALE)
    assert _stores(instrs) == 1
    # rsqrt(var + eps) one ScalarE step (eps its bias), the product on VectorE
    assert [(i.stream, i.opcode) for i in instrs if i.stream in ("act", "dve")] == [
        ("act", "activation"), ("dve", "tensor_tensor")]
    rng = np.random.default_rng(0)
    assert_device_matches(module_of(BN_SCALE), {"var": rng.uniform(0.1, 2, 64).astype(np.float32),
                                                "gamma": rng.standard_normal(64).astype(np.float32)})


@pytest.fixture(scope="module")
def gelu() -> list:
    return _insts(GELU)


def test_two_readers_of_one_value_share_its_pass(gelu: list) -> None:
    """``0.5 * x`` reads only x, as the ``x ** 3`` chain does: one pass, x loaded once per tile and only y
    stored (before: 0.5 * x was a pass of its own, stored and loaded back by the last multiply)."""
    loads = sum(1 for i in gelu if i.opcode == "dma" and i.operands[0].tensor.startswith("sb"))
    tiles = _stores(gelu)
    assert loads == tiles  # one load of x per stored tile of y
    assert tiles == 2  # 128 rows of 1024 columns each


def test_a_product_by_a_number_is_the_activations_scale(gelu: list) -> None:
    tanh = [i for i in gelu if i.opcode == "activation" and i.attrs["func"] == "tanh"]
    assert tanh and all(i.attrs["scale"] == pytest.approx(0.797885) for i in tanh)


def test_scalar_engine_takes_a_share_of_the_pass(gelu: list) -> None:
    """Of the pass's steps, ScalarE runs tanh and the products and sums with numbers while VectorE has
    more work (a two-tile step counting double): VectorE keeps x ** 3, the two-tile add and multiply (4
    of 8 before), ScalarE takes 0.044715 * x ** 3, 0.5 * x and th + 1."""
    per_tile = Counter((i.stream, i.opcode, i.attrs.get("func") or i.attrs.get("op") or i.attrs.get("op0"))
                       for i in gelu if i.stream in ("act", "dve"))
    n = _stores(gelu)
    assert per_tile[("act", "activation", "tanh")] == n
    assert per_tile[("act", "activation", "identity")] == 3 * n
    assert per_tile[("dve", "tensor_scalar", "pow")] == n
    assert sum(per_tile.values()) == 7 * n
    assert per_tile[("dve", "tensor_tensor", "add")] == per_tile[("dve", "tensor_tensor", "mul")] == n


def test_the_shared_pass_matches_the_interpreter() -> None:
    assert_device_matches(module_of(GELU))


# a dense, its bias and TVM's GELU read through a reshape (gpt2_extract.relay's tail, smaller)
DENSE_GELU = f"""HloModule dense_gelu
ENTRY main {{
  x = f32[256,128]{{1,0}} parameter(0)
  w = f32[128,512]{{1,0}} parameter(1)
  b = f32[512]{{0}} parameter(2)
  d = f32[256,512]{{1,0}} dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  bb = f32[256,512]{{1,0}} broadcast(b), dimensions={{1}}
  db = f32[256,512]{{1,0}} add(d, bb)
  r = f32[8,32,512]{{2,1,0}} reshape(db)
{_gelu("r", "f32[8,32,512]{2,1,0}")}}}
"""


def test_a_chain_read_through_a_reshape_runs_as_the_dense_epilogue() -> None:
    """The GELU chain is computed in the dense's [256, 512] (backend/elementwise.py sink_reshapes), joins
    the bias's pass and runs on the dot's result tiles: nothing goes to HBM but the output, written
    through the reshape (no copy into it afterwards); the bias add reads each PSUM accumulator itself
    (Epilogue.reads_psum: no copy out first); same values."""
    from nxsat.backend import device_forms
    from nxsat.backend.elementwise import sinkable_reshapes

    m = module_of(DENSE_GELU)
    assert sorted(sinkable_reshapes(m).values()) == [(256, 512)] * 8  # p, q, u, v, th, h, w1, y
    formed = device_forms(m, load_target("trn1"))
    assert formed.entry.root.op == "reshape" and formed.entry.root.operands[0].shape == (256, 512)
    c = compile_graph(m, load_target("trn1"))
    instrs = c.program.instrs
    assert not [t for t in c.program.tensors.values() if t.kind == "scratch"]
    assert not [i for i in instrs if i.opcode == "dma" and all(
        c.program.tensors[a.tensor].kind not in ("sbuf", "psum") for a in i.operands)]  # no HBM-to-HBM copy
    assert _evacuations(formed) == []
    adds = [i for i in instrs if i.opcode == "tensor_tensor" and i.attrs["op"] == "add"
            and c.program.tensors[i.operands[1].tensor].kind == "psum"]
    assert len(adds) == 2  # 2 M tiles of one N tile
    rng = np.random.default_rng(0)
    assert_device_matches(m, {"x": rng.standard_normal((256, 128)).astype(np.float32),
                              "w": (rng.standard_normal((128, 512)) / 11).astype(np.float32),
                              "b": rng.standard_normal(512).astype(np.float32)})


def test_a_reshape_stays_where_a_reader_would_stay_in_the_other_shape() -> None:
    """``2 * reshape(x)`` alone could be computed before the reshape, but its reader adds a [8, 32] input:
    computing it in [256] would split one pass in two, so nothing moves."""
    from nxsat.backend.elementwise import sinkable_reshapes

    m = module_of("""HloModule keep
ENTRY main {
  x = f32[256]{0} parameter(0)
  z = f32[8,32]{1,0} parameter(1)
  r = f32[8,32]{1,0} reshape(x)
  two = f32[] constant(2)
  t = f32[8,32]{1,0} broadcast(two), dimensions={}
  n = f32[8,32]{1,0} multiply(r, t)
  ROOT m = f32[8,32]{1,0} add(n, z)
}
""")
    assert sinkable_reshapes(m) == {}
    assert_device_matches(m)


def test_psum_is_copied_out_by_the_engine_with_less_of_the_epilogue() -> None:
    """Without the bias the chain reads the dot's result three times, so each accumulator is copied out
    first, by ScalarE, which has less of that epilogue's work (Epilogue.evacuate_on_act: before, the
    engines took turns and VectorE, with most of the chain, was the bottleneck)."""
    from nxsat.backend import device_forms

    text = DENSE_GELU.replace("  bb = f32[256,512]{1,0} broadcast(b), dimensions={1}\n", "").replace(
        "  db = f32[256,512]{1,0} add(d, bb)\n", "").replace("reshape(db)", "reshape(d)").replace(
        "  b = f32[512]{0} parameter(2)\n", "")
    assert _evacuations(device_forms(module_of(text), load_target("trn1"))) == ["act", "act"]


def test_without_an_epilogue_the_engines_take_turns_copying_psum_out() -> None:
    assert _evacuations(module_of("""HloModule d
ENTRY main {
  x = f32[512,128]{1,0} parameter(0)
  w = f32[128,512]{1,0} parameter(1)
  ROOT d = f32[512,512]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
""")) == ["act", "dve", "act", "dve"]  # 4 M tiles, in the lowering's order


def test_a_lone_cast_after_a_reshape_stays_for_the_dot_that_reads_it() -> None:
    """BERT's ``convert(reshape(q), bf16)`` feeding the scores' dot: the dot converts the tiles it loads (one
    HBM read, no cast pass), so the cast is not moved before the reshape (moved, it was a pass of its own
    and BERT-12 went from 2,270 to 3,233 us)."""
    from nxsat.backend.elementwise import sinkable_reshapes

    m = module_of("""HloModule q
ENTRY main {
  x = f32[128,64]{1,0} parameter(0)
  w = f32[64,768]{1,0} parameter(1)
  q = f32[128,768]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  r = f32[128,12,64]{2,1,0} reshape(q)
  c = bf16[128,12,64]{2,1,0} convert(r)
  k = bf16[12,64,128]{2,1,0} parameter(2)
  ROOT s = f32[12,128,128]{2,1,0} dot(c, k), lhs_batch_dims={1}, lhs_contracting_dims={2},
    rhs_batch_dims={0}, rhs_contracting_dims={1}
}
""")
    assert sinkable_reshapes(m) == {}


# inference batch norm and ReLU on a [channels, positions] value (a channels-first convolution's result):
# every parameter is one value per row of the tile
ROW_BN = """HloModule bn
ENTRY main {
  x = f32[128,1024]{1,0} parameter(0)
  mean = f32[128]{0} parameter(1)
  scale = f32[128]{0} parameter(2)
  beta = f32[128]{0} parameter(3)
  bm = f32[128,1024]{1,0} broadcast(mean), dimensions={0}
  s = f32[128,1024]{1,0} subtract(x, bm)
  bs = f32[128,1024]{1,0} broadcast(scale), dimensions={0}
  m = f32[128,1024]{1,0} multiply(s, bs)
  bb = f32[128,1024]{1,0} broadcast(beta), dimensions={0}
  a = f32[128,1024]{1,0} add(m, bb)
  zero = f32[] constant(0)
  bz = f32[128,1024]{1,0} broadcast(zero), dimensions={}
  ROOT r = f32[128,1024]{1,0} maximum(a, bz)
}
"""


def test_values_per_row_are_scalar_operands_and_two_steps_share_an_instruction() -> None:
    """``(x - mean) * scale`` and ``+ beta`` then the ReLU: each parameter is a ``[rows, 1]`` column, the
    scalar operand of ``tensor_scalar`` (one pass over the tile; ``tensor_tensor`` reading the repeated
    column made two), and each pair of steps is one instruction (its first result carried in fp32): two
    VectorE instructions per tile where there were four. The values are the interpreter's, bit for bit."""
    from nxsat.backend.tiles import column

    instrs = _insts(ROW_BN)
    # (on VectorE or ScalarE, whichever had less work: tiles.Tiles.scalar_engine)
    steps = [(i.opcode, i.attrs.get("op0"), i.attrs.get("op1")) for i in instrs if i.stream in ("dve", "act")]
    assert steps == [("tensor_scalar", "sub", "mul"), ("tensor_scalar", "add", "max")]  # one [128, 1024] tile
    assert all(not isinstance(i.attrs.get("scalar0"), (int, float)) for i in instrs
               if i.stream in ("dve", "act") and i.attrs.get("op0") != "add")
    assert column(3.0) is None
    rng = np.random.default_rng(3)
    assert_device_matches(module_of(ROW_BN), {
        "x": rng.standard_normal((128, 1024)).astype(np.float32), "mean": rng.standard_normal(128).astype(np.float32),
        "scale": rng.uniform(0.5, 2, 128).astype(np.float32), "beta": rng.standard_normal(128).astype(np.float32)},
        rtol=0, atol_scale=0)


def test_a_step_whose_result_is_kept_is_not_chained() -> None:
    """The normalized value is also returned: ``x - mean`` is stored, so it is an instruction of its own;
    ``* scale + beta`` and the ReLU are then one ScalarE activation, the two columns its scale and bias."""
    text = ROW_BN.replace("ROOT r = f32[128,1024]{1,0} maximum(a, bz)", "r = f32[128,1024]{1,0} maximum(a, bz)") \
        .replace("\n}\n", "\n  ROOT t = (f32[128,1024]{1,0}, f32[128,1024]{1,0}) tuple(r, s)\n}\n")
    instrs = _insts(text)
    steps = [(i.attrs.get("op0"), i.attrs.get("op1", "none")) for i in instrs if i.opcode == "tensor_scalar"]
    assert steps == [("sub", "none")]
    (act,) = [i for i in instrs if i.opcode == "activation"]
    assert act.stream == "act" and act.attrs["func"] == "relu"
    assert not isinstance(act.attrs["scale"], float) and not isinstance(act.attrs["bias"], float)
    rng = np.random.default_rng(4)
    assert_device_matches(module_of(text), {
        "x": rng.standard_normal((128, 1024)).astype(np.float32), "mean": rng.standard_normal(128).astype(np.float32),
        "scale": rng.uniform(0.5, 2, 128).astype(np.float32), "beta": rng.standard_normal(128).astype(np.float32)})


# a dense's result reshaped and added to an input broadcast over the sequences (gpt2_extract.relay's residual)
DENSE_RESIDUAL = """HloModule dense_residual
ENTRY main {
  x = f32[256,128]{1,0} parameter(0)
  w = f32[128,512]{1,0} parameter(1)
  c = f32[32,512]{1,0} parameter(2)
  d = f32[256,512]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  r = f32[8,32,512]{2,1,0} reshape(d)
  cb = f32[8,32,512]{2,1,0} broadcast(c), dimensions={1,2}
  ROOT y = f32[8,32,512]{2,1,0} add(cb, r)
}
"""


def test_an_input_operand_is_read_reshaped_so_the_chain_runs_as_the_dense_epilogue() -> None:
    """sink_reshapes computes ``cb + reshape(d)`` in the dense's [256, 512]: the broadcast input is read
    through a reshape (a view) and the add runs on the dot's tiles; same values."""
    from nxsat.backend.elementwise import sinkable_reshapes

    m = module_of(DENSE_RESIDUAL)
    assert list(sinkable_reshapes(m).values()) == [(256, 512)]
    rng = np.random.default_rng(0)
    assert_device_matches(m, {"x": rng.standard_normal((256, 128)).astype(np.float32),
                              "w": (rng.standard_normal((128, 512)) / 11).astype(np.float32),
                              "c": rng.standard_normal((32, 512)).astype(np.float32)})


def test_a_copy_a_view_needs_is_made_in_pieces_each_reader_waits_for_its_own() -> None:
    """A broadcast residual of 8 rows read as [256, 512] rows is no access pattern, and 16 runs of its rows a
    tile are more than the epilogue reads run by run (``epilogue.ROW_RUNS``; DENSE_RESIDUAL's 32 rows are
    read in four): lowering copies it, in pieces along its outermost dimension, so that the dense's first
    tiles wait for the piece holding their rows, not for the whole copy; same values."""
    from nxsat import sim
    from nxsat.backend import device_forms, lower_graph
    from nxsat.backend.lower import COPY_PIECE_BYTES

    m = module_of(DENSE_RESIDUAL.replace("f32[32,512]", "f32[8,512]").replace("f32[8,32,512]", "f32[32,8,512]"))
    t = sim.load_target("trn1")
    g = lower_graph(device_forms(m, t), t).graph
    (copy,) = [b for b in g.bufs if b.kind == "scratch" and b.name.endswith("_c")]
    pieces = [i for i in g.insts if i.engine == "dma" and any(w.buf is copy for w in i.writes)]
    assert len(pieces) == copy.nbytes // COPY_PIECE_BYTES == 8
    readers = [i for i in g.insts if any(r.buf is copy for r in i.reads)]
    assert readers and all(len([d for d in i.deps if d in pieces]) < len(pieces) for i in readers)
    rng = np.random.default_rng(1)
    assert_device_matches(m, {"x": rng.standard_normal((256, 128)).astype(np.float32),
                              "w": (rng.standard_normal((128, 512)) / 11).astype(np.float32),
                              "c": rng.standard_normal((8, 512)).astype(np.float32)})

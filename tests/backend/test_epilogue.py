"""Epilogues (backend/epilogue.py): the elementwise cluster reading a dot's or a convolution's result runs
on the result's tiles as they leave PSUM; a reduction computes the cluster that makes its source on its
own tiles (a prologue). Each case matches the reference interpreter on the simulator, and the ones that
fuse write no intermediate to HBM (no scratch tensor holds the producer's result or the source)."""

from __future__ import annotations

import numpy as np
import pytest
from harness import assert_device_matches, device_run, module_of, random_inputs

from nxsat import sim
from nxsat.backend import compile_graph

DENSE = """HloModule dense

ENTRY main {
  x = f32[256,384] parameter(0)
  w = f32[384,640] parameter(1)
  bias = f32[640] parameter(2)
  r = f32[256,640] parameter(3)
  d = f32[256,640] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  b = f32[256,640] broadcast(bias), dimensions={1}
  a = f32[256,640] add(d, b)
  t = f32[256,640] tanh(a)
  m = f32[256,640] multiply(t, a)
  ROOT out = f32[256,640] add(m, r)
}
"""

# the sum of two dots: the cluster can run only once both are computed (on the second's tiles)
TWO_DOTS = """HloModule two

ENTRY main {
  x = f32[128,256] parameter(0)
  w1 = f32[256,300] parameter(1)
  w2 = f32[256,300] parameter(2)
  d1 = f32[128,300] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  d2 = f32[128,300] dot(x, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT s = f32[128,300] add(d1, d2)
}
"""

# the dot is read by a reduction too (softmax's max) and returned: it is stored as well
READ_TWICE = """HloModule twice

max_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

ENTRY main {
  q = f32[2,128,64] parameter(0)
  k = f32[2,64,200] parameter(1)
  s = f32[2,128,200] dot(q, k), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0},
    rhs_contracting_dims={1}
  c = f32[] constant(0.125)
  cb = f32[2,128,200] broadcast(c), dimensions={}
  sc = f32[2,128,200] multiply(s, cb)
  ninf = f32[] constant(-inf)
  mx = f32[2,128] reduce(s, ninf), dimensions={2}, to_apply=max_f32
  e = f32[2,128,200] exponential(sc)
  ROOT t = (f32[2,128,200], f32[2,128], f32[2,128,200]) tuple(e, mx, s)
}
"""

# a causal mask (iotas computed on their own, the comparison on the dot's tiles) selected on the dot's tiles
MASKED = """HloModule masked

ENTRY main {
  q = f32[160,64] parameter(0)
  k = f32[64,160] parameter(1)
  s = f32[160,160] dot(q, k), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  i = s32[160,160] iota(), iota_dimension=0
  j = s32[160,160] iota(), iota_dimension=1
  keep = pred[160,160] compare(j, i), direction=LE
  lo = f32[] constant(-1e9)
  lob = f32[160,160] broadcast(lo), dimensions={}
  ROOT m = f32[160,160] select(keep, s, lob)
}
"""


# layernorm: the variance's reduction computes (x - mean)^2 on its own tiles; x - mean is stored for the
# normalization, the square never is
LAYERNORM = """HloModule ln

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[3,200,96] parameter(0)
  zero = f32[] constant(0)
  s1 = f32[3,200] reduce(x, zero), dimensions={2}, to_apply=add_f32
  n = f32[] constant(96)
  nb = f32[3,200] broadcast(n), dimensions={}
  mean = f32[3,200] divide(s1, nb)
  mb = f32[3,200,96] broadcast(mean), dimensions={0,1}
  d = f32[3,200,96] subtract(x, mb)
  sq = f32[3,200,96] multiply(d, d)
  s2 = f32[3,200] reduce(sq, zero), dimensions={2}, to_apply=add_f32
  var = f32[3,200] divide(s2, nb)
  eps = f32[] constant(1e-5)
  eb = f32[3,200] broadcast(eps), dimensions={}
  ve = f32[3,200] add(var, eb)
  r = f32[3,200] rsqrt(ve)
  rb = f32[3,200,96] broadcast(r), dimensions={0,1}
  ROOT y = f32[3,200,96] multiply(d, rb)
}
"""


def _conv(labels: str, x: str, w: str, y: str, channels: str) -> str:
    return f"""HloModule conv

ENTRY main {{
  x = f32{x} parameter(0)
  w = f32{w} parameter(1)
  bias = f32[24] parameter(2)
  gamma = f32[24] parameter(3)
  var = f32[24] parameter(4)
  c = f32{y} convolution(x, w), window={{size=3x3 pad=1_1x1_1}}, dim_labels={labels}
  bb = f32{y} broadcast(bias), dimensions={{{channels}}}
  a = f32{y} add(c, bb)
  eps = f32[] constant(0.001)
  epsb = f32[24] broadcast(eps), dimensions={{}}
  ve = f32[24] add(var, epsb)
  rs = f32[24] rsqrt(ve)
  sc = f32[24] multiply(rs, gamma)
  scb = f32{y} broadcast(sc), dimensions={{{channels}}}
  m = f32{y} multiply(a, scb)
  z = f32[] constant(0)
  zb = f32{y} broadcast(z), dimensions={{}}
  ROOT r = f32{y} maximum(m, zb)
}}
"""


# a batch-norm scale computed after the convolution in post-order, from the parameters alone: hoisted,
# so the whole bias / scale / relu cluster is the convolution's epilogue
CONV_NHWC = _conv("b01f_01io->b01f", "[1,20,20,16]", "[3,3,16,24]", "[1,20,20,24]", "3")
CONV_NCHW = _conv("bf01_oi01->bf01", "[2,16,12,12]", "[24,16,3,3]", "[2,24,12,12]", "1")

# the scratch tensors each program keeps: the convolutions' small batch-norm scale (its own pass), the
# mask's iotas, the first of two dots; never the producer the epilogue runs on
FUSED = {"dense": (DENSE, []), "masked": (MASKED, ["i", "j"]), "conv_nhwc": (CONV_NHWC, ["sc"]),
         "conv_nchw": (CONV_NCHW, ["sc"]), "two_dots": (TWO_DOTS, ["d1"]),
         "layernorm": (LAYERNORM, ["d", "mean", "r", "s1", "s2"])}


def _scratch(text: str, target: str) -> list[str]:
    t = sim.load_target(target)
    c = compile_graph(module_of(text), t)
    return sorted(n for n, tn in c.program.tensors.items() if tn.kind == "scratch")


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("case", sorted(FUSED))
def test_epilogue_matches_and_keeps_the_result_on_chip(case: str, target: str) -> None:
    text, scratch = FUSED[case]
    assert_device_matches(module_of(text), target=target, rtol=2e-5, atol_scale=2e-5)
    assert _scratch(text, target) == scratch


def test_a_result_read_outside_the_cluster_is_stored_too() -> None:
    assert_device_matches(module_of(READ_TWICE), rtol=2e-5, atol_scale=2e-5)
    t = sim.load_target("trn1")
    c = compile_graph(module_of(READ_TWICE), t)
    # the scaled exponential runs on the dot's tiles: nothing holds the product sc in HBM
    assert not any(n.startswith("sc") for n, tn in c.program.tensors.items() if tn.kind == "scratch")


def _columns_by_descriptor(model: sim.Model) -> set[str]:
    """The HBM tensors some DMA reads a value per descriptor of four bytes or fewer."""
    _, tl = model.profile()
    ins = model.program.instrs
    return {ins[k].operands[1].tensor for k, tr in tl.transfers.items() if tr.descriptor_bytes <= 4}


def test_a_per_channel_column_loads_as_a_row_and_a_transpose(monkeypatch: pytest.MonkeyPatch) -> None:
    """A convolution's per-channel bias and scale (channels on partitions, values side by side in HBM), when
    long, load as one row each and a TensorE transpose, not a descriptor per channel; a one-row transpose multiplies
    by 1 only, so infinities, NaN and the extremes come through exactly."""
    from nxsat.backend import epilogue

    monkeypatch.setattr(epilogue, "COLUMN_ROW_VALUES", 16)  # the model's 24 channels are enough
    module = module_of(CONV_NCHW)
    inputs = random_inputs(module)
    bias = inputs["in2"].copy()
    bias[:6] = [np.inf, -np.inf, np.nan, 3e38, -1e-40, 0.0]
    inputs["in2"] = bias
    model = assert_device_matches(module, inputs, rtol=2e-5, atol_scale=2e-5)
    assert not _columns_by_descriptor(model) & {"bias", "sc"}
    assert any(i.opcode == "transpose" for i in model.program.instrs)
    monkeypatch.setattr(epilogue, "COLUMN_ROW_VALUES", 10**6)  # the short vector's way: a descriptor a channel
    _, old = device_run(module, inputs)
    assert _columns_by_descriptor(old) & {"bias", "sc"}


def _bytes_read(model: sim.Model, tensor: str) -> int:
    _, tl = model.profile()
    ins = model.program.instrs
    return sum(int(tr.nbytes) for k, tr in tl.transfers.items() if ins[k].operands[1].tensor == tensor)


def test_a_bias_repeated_on_the_partitions_is_loaded_once_and_spread_by_tensore(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense layer's bias (along N, the same for every row on the partitions) is loaded as one row per N
    tile and repeated on the partitions by a ones-matmul, exact for every value (one contraction row),
    instead of read once per partition: 2.5 KB of DMA, not 128 times that."""
    from nxsat.backend import epilogue

    module = module_of(DENSE)
    inputs = random_inputs(module)
    bias = inputs["in2"].copy()
    bias[:4] = [np.inf, -np.inf, np.nan, -3e38]
    inputs["in2"] = bias
    model = assert_device_matches(module, inputs, rtol=2e-5, atol_scale=2e-5)
    assert _bytes_read(model, "bias") == 640 * 4
    monkeypatch.setattr(epilogue, "SPREAD_BYTES", 10**9)  # read on every partition
    _, old = device_run(module, inputs)
    assert _bytes_read(old, "bias") == 128 * 640 * 4


def test_a_convolutions_epilogue_reads_each_psum_bank_itself() -> None:
    """A convolution whose output chunk spans several PSUM banks (1,600 positions) and whose result only its
    epilogue reads: the epilogue's first step (bias and scale, one ``tensor_scalar``) reads each bank
    itself, as for a one-bank chunk; no copy out of PSUM comes first. The banks are pipelined: each
    bank's first step comes before the previous bank's ReLU, so an engine's in-order stream does not hold
    the next bank behind the other engine's work on this one."""
    text = _conv("bf01_01io->bf01", "[1,16,40,40]", "[3,3,16,24]", "[1,24,40,40]", "1")
    assert_device_matches(module_of(text), rtol=2e-5, atol_scale=2e-5)
    prog = compile_graph(module_of(text), sim.load_target("trn1")).program
    reads = [k for k, i in enumerate(prog.instrs) if i.stream in ("act", "dve", "pool")
             and any(prog.tensors[o.tensor].kind == "psum" for o in i.operands[1:])]
    assert len(reads) == 4 and all(prog.instrs[k].opcode == "tensor_scalar" for k in reads)
    relus = [k for k, i in enumerate(prog.instrs) if i.opcode == "tensor_scalar" and i.attrs.get("op0") == "max"]
    assert len(relus) == 4 and all(reads[b + 1] < relus[b] < reads[b + 2] if b + 2 < 4 else reads[b + 1] < relus[b]
                                   for b in range(3))


BN_RELU = """HloModule bn_relu
ENTRY main {
  x = bf16[1,64,16,16]{3,2,1,0} parameter(0)
  w = bf16[3,3,64,96]{3,2,1,0} parameter(1)
  s = f32[96]{0} parameter(2)
  b = f32[96]{0} parameter(3)
  c = f32[1,96,16,16]{3,2,1,0} convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=bf01_01io->bf01
  sb = f32[1,96,16,16]{3,2,1,0} broadcast(s), dimensions={1}
  bb = f32[1,96,16,16]{3,2,1,0} broadcast(b), dimensions={1}
  m = f32[1,96,16,16]{3,2,1,0} multiply(c, sb)
  a = f32[1,96,16,16]{3,2,1,0} add(m, bb)
  z = f32[] constant(0)
  zb = f32[1,96,16,16]{3,2,1,0} broadcast(z), dimensions={}
  r = f32[1,96,16,16]{3,2,1,0} maximum(a, zb)
  ROOT o = bf16[1,96,16,16]{3,2,1,0} convert(r)
}
"""


def test_a_batch_norm_and_relu_are_one_activation_of_the_accumulator() -> None:
    """``relu(conv * s + b)`` with a scale and a shift per channel (a merged inference batch norm), cast to
    bf16 for the next convolution: one ScalarE activation reads the PSUM bank, the scale and shift as
    its per-partition scale and bias, and writes the bf16 value; the same values as the interpreter's."""
    model = assert_device_matches(module_of(BN_RELU), rtol=1e-2, atol_scale=1e-2)
    prog = model.program
    steps = [i for i in prog.instrs if i.stream in ("act", "dve", "pool") and i.opcode != "memset"
             and any(prog.tensors[o.tensor].kind == "psum" for o in i.operands[1:])]
    assert len(steps) == 1
    (act,) = steps
    assert act.opcode == "activation" and act.attrs["func"] == "relu"
    assert not isinstance(act.attrs["scale"], float) and not isinstance(act.attrs["bias"], float)
    assert prog.tensors[act.operands[0].tensor].dtype.name == "bf16"
    assert not [i for i in prog.instrs if i.opcode in ("tensor_scalar", "tensor_copy")]


# gpt2_extract's embedding: a [32, 64] positional table broadcast over 12 sequences, read as [384, 64] rows by
# the dense layer whose epilogue adds it (the rows of the broadcast do not merge into one stride)
POSITIONS = """HloModule positions

ENTRY main {
  x = f32[384,96] parameter(0)
  w = f32[96,64] parameter(1)
  pos = f32[32,64] parameter(2)
  d = f32[384,64] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  b = f32[12,32,64] broadcast(pos), dimensions={1,2}
  r = f32[384,64] reshape(b)
  ROOT a = f32[384,64] add(d, r)
}
"""


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_a_broadcast_read_as_rows_loads_in_runs_not_as_a_copy(target: str) -> None:
    """The epilogue loads each tile of the reshaped broadcast as runs of 32 rows of the table (four DMAs into
    one tile, which every row tile then shares: 128 is a multiple of 32), where the reshape's copy of the
    broadcast in HBM (an HBM-to-HBM DMA of the whole [384, 64]) went first: it is left unread and dropped
    (``backend.epilogue._row_runs``; gpt2_extract 244.2 -> 217.0 us under transformer). Same values."""
    model = assert_device_matches(module_of(POSITIONS), target=target, rtol=2e-5, atol_scale=2e-5)
    tensors = model.program.tensors
    assert not [n for n, t in tensors.items() if t.kind == "scratch"]  # no copy of the broadcast
    assert _bytes_read(model, "pos") == 128 * 64 * 4  # one tile's four runs, for all three row tiles

"""Reductions and batch normalization on the device (backend/reduce.py, backend/norm.py): the per-operator
cases of tests/data/xla_ops and the models that use them match the reference interpreter on trn1 and
trn2; synthesized cases reach every layout (a kept or a reduced group on the partitions), every
cross-partition combine (ones-matmul, transposes, v2's infinity fix, the HBM regroup), every body kind
and the integer, predicate and low-precision types."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from harness import DATA, assert_device_matches, module_of, reference_run

from nxsat import dtypes as dt
from nxsat import sim
from nxsat.backend import Options, compile_graph, lower_graph
from nxsat.diagnostics import NxsatError

TARGETS = ["trn1", "trn2"]
# The cases this module owns (tests/backend/test_xla_ops_device.py runs the others): reduce-window's are the
# pooling family's, reduce-precision's the elementwise family's.
CASES = sorted(p.stem for p in (DATA / "xla_ops").glob("*.hlo") if p.stem.startswith(("reduce_", "batch_norm_"))
               and not p.stem.startswith(("reduce_window", "reduce_precision")))
REFUSED = {  # name -> (code, why)
    "reduce_empty_dim": ("NCC_EUOC002", "without elements"),  # f32[4,0] input: the program has no empty tensors
}
WRAPPED = {"reduce_s64_u64"}  # 64-bit: computed as 32-bit on the device


def case_inputs(name: str) -> dict[str, np.ndarray]:
    z = np.load(DATA / "xla_ops" / f"{name}.npz")
    return {k: z[k] for k in z.files if k.startswith("in")}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", [n for n in CASES if n not in REFUSED and n not in WRAPPED])
def test_xla_op_case_matches_the_interpreter(name: str, target: str) -> None:
    assert_device_matches(module_of(DATA / "xla_ops" / f"{name}.hlo"), case_inputs(name), target)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_cases_say_why(name: str) -> None:
    with pytest.raises(NxsatError) as e:
        compile_graph(module_of(DATA / "xla_ops" / f"{name}.hlo"), sim.load_target("trn1"))
    code, why = REFUSED[name]
    assert e.value.code == code and why in str(e.value) and e.value.loc is not None
    assert why in (DATA.parents[1] / "docs" / "backend.md").read_text()


@pytest.mark.parametrize("target", TARGETS)
def test_64_bit_reductions_compute_as_32_bit(target: str) -> None:
    """s64/u64 reduce as s32/u32 (NCC_WTYP001): the inputs wrapped to 32 bits (what the device holds), the
    interpreter's 64-bit results on them wrapped too; the sum also equals the wrapped 64-bit sum of the
    original inputs (addition commutes with wrapping; max does not)."""
    m = module_of(DATA / "xla_ops" / "reduce_s64_u64.hlo")
    full = case_inputs("reduce_s64_u64")
    wrapped = {"in0": full["in0"].astype(np.int32), "in1": full["in1"].astype(np.uint32)}
    t = sim.load_target(target)
    c = compile_graph(m, t)
    assert "NCC_WTYP001" in {w.code for w in c.warnings}
    got = sim.load(sim.build_neff(c.program, t, c.constants), verify=True).run(wrapped)
    want = reference_run(m, {"in0": wrapped["in0"].astype(np.int64), "in1": wrapped["in1"].astype(np.uint64)})
    np.testing.assert_array_equal(got[0], want[0].astype(np.int32))
    np.testing.assert_array_equal(got[1], want[1].astype(np.uint32))
    np.testing.assert_array_equal(got[0], reference_run(m, full)[0].astype(np.int32))


# --- synthesized reductions ------------------------------------------------------------------------------

BODY = {"add": "add", "max": "maximum", "min": "minimum", "mul": "multiply", "and": "and", "or": "or", "xor": "xor"}


def reduce_hlo(shape: tuple[int, ...], dims: tuple[int, ...], dtype: str, op: str, init: str,
               acc: str | None = None, perm: tuple[int, ...] | None = None, init_param: bool = False) -> str:
    """A reduce of ``x`` (transposed by ``perm`` first, if given; through a convert to ``acc`` if given)."""
    acc = acc or dtype
    src_shape = shape if perm is None else tuple(shape[perm.index(i)] for i in range(len(shape)))
    kept = [d for d in range(len(shape)) if d not in dims]
    lines = [f"  x = {dtype}[{','.join(map(str, src_shape))}] parameter(0)"]
    v = "x"
    if perm is not None:
        dims_attr = ",".join(map(str, perm))
        lines.append(f"  t = {dtype}[{','.join(map(str, shape))}] transpose(x), dimensions={{{dims_attr}}}")
        v = "t"
    if acc != dtype:
        lines.append(f"  c = {acc}[{','.join(map(str, shape))}] convert({v})")
        v = "c"
    lines.append(f"  i = {acc}[] parameter(1)" if init_param else f"  i = {acc}[] constant({init})")
    lines.append(f"  ROOT r = {acc}[{','.join(str(shape[d]) for d in kept)}] reduce({v}, i), "
                 f"dimensions={{{','.join(map(str, dims))}}}, to_apply=body")
    return (f"HloModule m\nbody {{\n  a = {acc}[] parameter(0)\n  b = {acc}[] parameter(1)\n"
            f"  ROOT c = {acc}[] {BODY[op]}(a, b)\n}}\nENTRY main {{\n" + "\n".join(lines) + "\n}\n")


def counts(text: str, target: str = "trn1") -> Counter[str]:
    lw = lower_graph(module_of(text), sim.load_target(target))
    return Counter(i.opcode for i in lw.graph.insts)


def normal(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,dims,op,init,combine", [
    ((1, 65536), (1,), "add", "0", "matmul"),  # a full sum: 128 partitions, then a ones-vector matmul
    ((3, 7, 4099), (0, 2), "add", "1.5", "matmul"),  # two reduced dims apart, a remainder piece, an init
    ((2048, 300), (0,), "add", "0", "matmul"),  # column sums: the reduced outer dim on the partitions
    ((4, 50000), (1,), "max", "-inf", "transpose"),
    ((1000, 300), (0,), "min", "inf", "transpose"),  # several chunks of kept columns
    ((6, 40000), (1,), "max", "-3", "transpose"),
    ((300, 2, 700), (1,), "max", "-inf", None),  # kept groups on both sides: rows on the partitions
])
def test_float_reductions_in_every_layout(shape: tuple[int, ...], dims: tuple[int, ...], op: str, init: str,
                                          combine: str | None, target: str) -> None:
    text = reduce_hlo(shape, dims, "f32", op, init)
    c = counts(text, target)
    if combine:
        assert c[combine] >= 1, c
    else:
        assert not c["matmul"] and not c["transpose"], c
    assert_device_matches(module_of(text), {"in0": normal(shape)}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", ["max", "min"])
def test_cross_partition_max_min_keep_nan_and_infinities(op: str, target: str) -> None:
    """Rows with +inf, -inf, a NaN, only the losing infinity, the largest finite value: NeuronCore-v2's
    transpose spreads non-finite values along its rows, the fix restores them."""
    shape = (8, 40000)
    x = normal(shape, 1)
    big = np.float32(np.finfo(np.float32).max)
    win, lose = (np.inf, -np.inf) if op == "max" else (-np.inf, np.inf)
    x[0, 123] = win
    x[1, :] = lose
    x[2, 77] = np.nan
    x[3, 5] = win
    x[3, 30000] = np.nan
    x[4, 999] = big if op == "max" else -big
    x[5, 17] = lose
    x[6, :] = lose
    x[6, 39999] = 2.0
    text = reduce_hlo(shape, (1,), "f32", op, "-inf" if op == "max" else "inf")
    assert counts(text, target)["transpose"]
    assert_device_matches(module_of(text), {"in0": x}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_full_product_spreads_over_the_partitions(target: str) -> None:
    """mul across partitions: transposed on v3, through the HBM regroup on v2. fp32 products of 20000
    factors drift (the interpreter multiplies sequentially): tolerance 1e-4."""
    shape = (2, 20000)
    x = (1 + 1e-4 * normal(shape)).astype(np.float32)
    text = reduce_hlo(shape, (1,), "f32", "mul", "1")
    assert counts(text, target)["transpose" if target == "trn2" else "tensor_reduce"]
    assert_device_matches(module_of(text), {"in0": x}, target, rtol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_bf16_reads_through_the_convert_and_accumulates_in_fp32(target: str) -> None:
    shape = (256, 3000)
    text = reduce_hlo(shape, (1,), "bf16", "add", "0", acc="f32")
    lw = lower_graph(module_of(text), sim.load_target(target))
    assert not any(i.opcode == "tensor_copy" and i.operands[0].buf.kind == "scratch" for i in lw.graph.insts)
    assert all(b.dtype.name == "bf16" for b in lw.graph.bufs if b.name.startswith("redin"))
    assert_device_matches(module_of(text), {"in0": normal(shape).astype("bfloat16")}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_bf16_body_mixed_precision_on_and_off(target: str) -> None:
    """A bf16 body: with mixed-precision accumulation (the default) the sum is fp32 and rounds once (the
    interpreter's result exactly); without it the partials accumulate in bf16 (within bf16's error)."""
    shape = (64, 4096)
    text = reduce_hlo(shape, (1,), "bf16", "add", "0")
    x = (np.abs(normal(shape)) + 1).astype("bfloat16")
    assert_device_matches(module_of(text), {"in0": x}, target)
    m = module_of(text)
    t = sim.load_target(target)
    c = compile_graph(m, t, Options(mixed_precision_accumulation=False))
    got = sim.load(sim.build_neff(c.program, t, c.constants), verify=True).run({"in0": x})[0].astype(np.float64)
    want = reference_run(m, {"in0": x})[0].astype(np.float64)
    err = np.abs(got - want) / want
    assert err.max() < 2 ** -6 and err.max() > 0  # not fp32 accumulation: bf16 partials


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype,op,init,dims", [
    ("s32", "add", "0", (1,)), ("s32", "mul", "1", (0,)), ("s32", "max", "-2147483648", (1,)),
    ("u32", "min", "4294967295", (0,)), ("s8", "add", "0", (1,)), ("u16", "mul", "1", (1,)),
    ("u32", "xor", "0", (1,)), ("s32", "and", "-1", (0,)), ("u8", "or", "0", (1,)), ("s32", "add", "7", (0, 1)),
])
def test_integer_reductions_are_exact_and_wrap(dtype: str, op: str, init: str, dims: tuple[int, ...],
                                               target: str) -> None:
    shape = (40, 3001)
    info = np.iinfo(np.dtype({"s32": "int32", "u32": "uint32", "s8": "int8", "u16": "uint16", "u8": "uint8"}[dtype]))
    rng = np.random.default_rng(2)
    x = rng.integers(info.min, int(info.max) + 1, size=shape, dtype=np.int64).astype(info.dtype)
    assert_device_matches(module_of(reduce_hlo(shape, dims, dtype, op, init)), {"in0": x}, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op,init", [("and", "true"), ("or", "false"), ("xor", "false"), ("max", "false"),
                                     ("min", "true")])
def test_predicate_reductions(op: str, init: str, target: str) -> None:
    shape = (70, 33)
    x = np.random.default_rng(3).random(shape) < (0.98 if op in ("and", "min") else 0.02)
    for dims in ((1,), (0,), (0, 1)):
        assert_device_matches(module_of(reduce_hlo(shape, dims, "pred", op, init)), {"in0": x}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_init_from_a_parameter_and_a_transposed_operand(target: str) -> None:
    shape = (50, 6, 130)
    text = reduce_hlo(shape, (0, 2), "f32", "max", "", perm=(2, 0, 1), init_param=True)
    x = normal((6, 130, 50))
    assert_device_matches(module_of(text), {"in0": x, "in1": np.float32(2.5)}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_f16_and_bf16_max_min(target: str) -> None:
    for dtype in ("f16", "bf16"):
        for op, init in (("max", "-inf"), ("min", "inf")):
            shape = (3, 20000)
            x = normal(shape).astype(np.float16 if dtype == "f16" else "bfloat16")
            x[1, 5] = np.nan
            assert_device_matches(module_of(reduce_hlo(shape, (1,), dtype, op, init)), {"in0": x}, target)


ARGMAX = """HloModule argmax
cmp {
  a = f32[] parameter(0)
  ai = s32[] parameter(1)
  b = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  isnan = pred[] compare(a, a), direction=NE
  take = pred[] or(gt, isnan)
  v = f32[] select(take, a, b)
  eq = pred[] compare(a, b), direction=EQ
  lt = pred[] compare(ai, bi), direction=LT
  tie = pred[] and(eq, lt)
  first = pred[] or(take, tie)
  i = s32[] select(first, ai, bi)
  ROOT r = (f32[], s32[]) tuple(v, i)
}
ENTRY main {
  x = f32[@R,@K] parameter(0)
  io = s32[@K] iota(), iota_dimension=0
  idx = s32[@R,@K] broadcast(io), dimensions={1}
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  red = (f32[@R], s32[@R]) reduce(x, idx, ninf, zero), dimensions={1}, to_apply=cmp
  v = f32[@R] get-tuple-element(red), index=0
  i = s32[@R] get-tuple-element(red), index=1
  ROOT t = (f32[@R], s32[@R]) tuple(v, i)
}
"""


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rows,k", [(200, 37), (2, 30000)])
def test_argmax_evaluates_its_comparator_on_tiles(rows: int, k: int, target: str) -> None:
    """The comparator body runs elementwise, pairwise over the row (ties: the first index; NaN wins); the
    indices are an iota made on chip; a long row is spread over the partitions and regrouped."""
    text = ARGMAX.replace("@R", str(rows)).replace("@K", str(k))
    x = np.round(normal((rows, k), 4) * 3).astype(np.float32)  # many ties
    x[1, k // 2] = np.nan
    c = counts(text, target)
    assert c["iota"] >= 1 and "broadcast" not in c
    assert_device_matches(module_of(text), {"in0": x}, target)


HEADS = """HloModule heads
mx {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  q = f32[12,128,64] parameter(0)
  k = f32[12,128,64] parameter(1)
  s = f32[12,128,128] dot(q, k), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2},
    rhs_contracting_dims={2}
  ninf = f32[] constant(-inf)
  ROOT m = f32[12,128] reduce(s, ninf), dimensions={2}, to_apply=mx
}
"""


ROWS = """HloModule rows
both {
  a = f32[] parameter(0)
  ai = s32[] parameter(1)
  b = f32[] parameter(2)
  bi = s32[] parameter(3)
  m = f32[] maximum(a, b)
  mi = s32[] maximum(ai, bi)
  ROOT r = (f32[], s32[]) tuple(m, mi)
}
ENTRY main {
  x = f32[1536,64] parameter(0)
  w = f32[64,128] parameter(1)
  s = f32[1536,128] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  io = s32[1536] iota(), iota_dimension=0
  idx = s32[1536,128] broadcast(io), dimensions={0}
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT red = (f32[1536], s32[1536]) reduce(s, idx, ninf, zero), dimensions={1}, to_apply=both
}
"""


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", ["heads", "rows"])
def test_rows_a_producer_left_on_the_partitions_are_reduced_there(monkeypatch: pytest.MonkeyPatch, target: str,
                                                                  model: str) -> None:
    """Rows a dot stored 128 at a time with a row per partition (attention's scores, head by head) are
    reduced with the rows interleaved over the partitions as the dot left them (partition a: rows a,
    a + 128, ...), not in blocks of 12 consecutive rows, so that the forwarding pass reads them in SBUF
    (BERT-base: 2,001 -> 1,777 us); an on-chip iota along those rows counts them the same way."""
    from nxsat.backend import reduce as rd

    chosen = []
    real = rd.choose_layout
    monkeypatch.setattr(rd, "choose_layout", lambda *a, **k: chosen.append(real(*a, **k)) or chosen[-1])
    if model == "heads":
        text, inputs = HEADS, {"in0": normal((12, 128, 64), 1), "in1": normal((12, 128, 64), 2)}
    else:  # a comparator body is compute-bound: priced alike, interleaved only when told to prefer it
        monkeypatch.setattr(rd, "INTERLEAVE_MARGIN", 100.0)
        text, inputs = ROWS, {"in0": normal((1536, 64), 1), "in1": normal((64, 128), 2)}
    assert_device_matches(module_of(text), inputs, target)
    assert chosen and all(lay.interleave and lay.A == 128 and lay.B == 12 for lay in chosen), chosen


def test_without_a_producer_in_sbuf_rows_go_in_blocks() -> None:
    """A model's input has no partitions to keep: each partition reads 12 consecutive rows (long runs); short
    rows too, unless their producer holds them interleaved."""
    from nxsat.backend import reduce as rd

    groups = [rd.Group((0, 1), 1536, 128, True), rd.Group((2,), 128, 1, False)]
    red = rd.Reducer(None, None, alu="max", acc=[dt.F32])  # type: ignore[arg-type] - layout pricing reads no graph
    assert not rd.choose_layout(groups, red, 4, True).interleave
    assert rd.choose_layout(groups, red, 4, True, [([128, 1], 128)], 1).interleave
    # ResNet-50's average pool over the tiles its last convolution left (channel j * 128 + p on partition
    # p): interleaved so, its readers (the mean's division, FOLLOW_STEPS) following, no round trip
    short = [rd.Group((0,), 2048, 49, True), rd.Group((1,), 49, 1, False)]
    assert not rd.choose_layout(short, red, 4, True).interleave
    assert rd.choose_layout(short, red, 4, True, [([49, 1], 49)], 1).interleave
    assert not rd.choose_layout(groups, red, 4, True, [([128, 1], 1536)], 1).interleave


def test_a_body_without_a_tile_form_is_refused() -> None:
    text = ARGMAX.replace("@R", "4").replace("@K", "6").replace(
        "  ROOT r = (f32[], s32[]) tuple(v, i)", '  w = f32[] custom-call(v), custom_call_target="my_kernel"\n'
        "  ROOT r = (f32[], s32[]) tuple(w, i)")
    with pytest.raises(NxsatError) as e:
        compile_graph(module_of(text), sim.load_target("trn1"))
    assert e.value.code == "NCC_EUOC002" and "custom-call" in str(e.value) and "no tile form" in str(e.value)


def test_layout_prices_descriptors_and_partitions() -> None:
    """A full reduction spreads over the partitions; a reduction of the inner dimension keeps rows on
    them; column sums put the reduced outer dimension there (long contiguous runs)."""
    for shape, dims, want in (((1, 65536), (1,), "matmul"), ((4096, 64), (1,), None), ((4096, 512), (0,), "matmul")):
        c = counts(reduce_hlo(shape, dims, "f32", "add", "0"))
        assert (c["matmul"] > 0) == (want == "matmul"), (shape, c)


# --- batch normalization ----------------------------------------------------------------------------------

def bn_hlo(kind: str, shape: tuple[int, ...], fi: int, dtype: str = "f32", eps: float = 1e-3) -> str:
    s = ",".join(map(str, shape))
    c = shape[fi]
    vec = f"{dtype}[{c}]"
    if kind == "training":
        return (f"HloModule bn\nENTRY main {{\n  x = {dtype}[{s}] parameter(0)\n  sc = {vec} parameter(1)\n"
                f"  of = {vec} parameter(2)\n  ROOT y = ({dtype}[{s}], {vec}, {vec}) batch-norm-training(x, sc, of), "
                f"epsilon={eps}, feature_index={fi}\n}}\n")
    if kind == "inference":
        return (f"HloModule bn\nENTRY main {{\n  x = {dtype}[{s}] parameter(0)\n  sc = {vec} parameter(1)\n"
                f"  of = {vec} parameter(2)\n  m = {vec} parameter(3)\n  v = {vec} parameter(4)\n"
                f"  ROOT y = {dtype}[{s}] batch-norm-inference(x, sc, of, m, v), epsilon={eps}, "
                f"feature_index={fi}\n}}\n")
    return (f"HloModule bn\nENTRY main {{\n  x = {dtype}[{s}] parameter(0)\n  sc = {vec} parameter(1)\n"
            f"  m = {vec} parameter(2)\n  v = {vec} parameter(3)\n  dy = {dtype}[{s}] parameter(4)\n"
            f"  g = ({dtype}[{s}], {vec}, {vec}) batch-norm-grad(x, sc, m, v, dy), epsilon={eps}, feature_index={fi}\n"
            f"  a = {dtype}[{s}] get-tuple-element(g), index=0\n  b = {vec} get-tuple-element(g), index=1\n"
            f"  ROOT t = ({dtype}[{s}], {vec}) tuple(a, b)\n}}\n")


def bn_inputs(kind: str, shape: tuple[int, ...], fi: int, dtype: str = "f32") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    c = shape[fi]
    npd = np.float32 if dtype == "f32" else np.dtype("bfloat16")
    x = (rng.standard_normal(shape) * 2 + 3).astype(npd)
    vec = [rng.standard_normal(c).astype(npd) for _ in range(3)]
    var = (rng.random(c) + 0.5).astype(npd)
    if kind == "training":
        return {"in0": x, "in1": vec[0], "in2": vec[1]}
    if kind == "inference":
        return {"in0": x, "in1": vec[0], "in2": vec[1], "in3": vec[2], "in4": var}
    return {"in0": x, "in1": vec[0], "in2": vec[2], "in3": var, "in4": rng.standard_normal(shape).astype(npd)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["training", "inference", "grad"])
@pytest.mark.parametrize("shape,fi,layout", [
    ((4, 200, 7, 9), 1, "rows"),  # NCHW, C over 128: two feature blocks
    ((2, 3, 1100, 40), 2, "rows"),  # more than 64 bn_stats groups per feature: merged in two levels
    ((6, 13, 17, 24), 3, "cols"),  # NHWC: features on the free axis, the rest over the partitions
    ((1300, 600), 1, "cols"),  # more than 512 features: two column blocks; a remainder piece
    ((5, 9), 0, "rows"),
    ((1, 32, 20, 20), 1, "rows"),  # a dimension of one element
    ((8, 16, 24, 24), 1, "segments"),  # few features, much data: 8 partitions per feature
    ((6, 40, 30, 30), 1, "segments"),  # 3 partitions per feature (what divides the batch)
])
def test_batch_norm_in_both_layouts(kind: str, shape: tuple[int, ...], fi: int, layout: str, target: str) -> None:
    text = bn_hlo(kind, shape, fi)
    c = counts(text, target)
    if layout == "cols":
        assert c["matmul"] and not c["bn_stats"], c
    elif layout == "segments":
        assert c["matmul"] and (c["bn_stats"] > 0) == (kind == "training"), c
    else:
        assert not c["matmul"] and (c["bn_stats"] > 0) == (kind == "training"), c
    assert_device_matches(module_of(text), bn_inputs(kind, shape, fi), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["training", "grad", "inference"])
def test_batch_norm_bf16_rounds_once(kind: str, target: str) -> None:
    for shape, fi in (((8, 16, 6, 6), 1), ((8, 6, 6, 16), 3)):
        assert_device_matches(module_of(bn_hlo(kind, shape, fi, "bf16")), bn_inputs(kind, shape, fi, "bf16"),
                              target, rtol=1e-2, atol_scale=1e-2)


def test_an_fp32_batch_norm_in_inference_becomes_its_elementwise_steps() -> None:
    """device-forms: an fp32 batch-norm-inference is ``(x - mean) * (scale * rsqrt(var + eps)) + offset``, the
    kernel's steps as operators, which then fuse with the elementwise pass around them (a ReLU after it: one
    pass, no store of the batch norm's result); a bf16 one keeps the kernel (it rounds once). The values
    match the reference's."""
    from nxsat.backend import compile_graph, device_forms

    shape, fi = (2, 40, 9, 9), 1
    text = bn_hlo("inference", shape, fi).replace("ROOT y = f32", "y = f32")
    text = text.replace("\n}", f"\n  z = f32[] constant(0)\n  zb = f32[{','.join(map(str, shape))}] broadcast(z), "
                        f"dimensions={{}}\n  ROOT r = f32[{','.join(map(str, shape))}] maximum(y, zb)\n}}")
    m = module_of(text)
    formed = device_forms(m, sim.load_target("trn1"))
    ops = [n.op for n in formed.entry.post_order()]
    assert "batch-norm-inference" not in ops and {"rsqrt", "subtract", "multiply", "add", "maximum"} <= set(ops)
    prog = compile_graph(m, sim.load_target("trn1")).program
    big = [t for t in prog.tensors.values() if t.kind == "scratch" and tuple(t.shape) == shape]
    assert not big  # x loaded, one pass, the result stored (only the [40] factor goes through scratch)
    assert_device_matches(m, bn_inputs("inference", shape, fi), "trn1")
    bf = module_of(bn_hlo("inference", shape, fi, "bf16"))
    assert "batch-norm-inference" in [n.op for n in device_forms(bf, sim.load_target("trn1")).entry.post_order()]


MOBILENET_BN = [("training", (96, 32, 112, 112), "trn1"), ("grad", (96, 32, 112, 112), "trn1"),
                ("training", (96, 1280, 7, 7), "trn2"), ("grad", (96, 144, 56, 56), "trn2")]


@pytest.mark.slow
@pytest.mark.parametrize("kind,shape,target", MOBILENET_BN)
def test_mobilenet_v2_batch_norms(kind: str, shape: tuple[int, ...], target: str) -> None:
    """mobilenet_v2's batch norms at their shapes (NCHW, feature_index 1, epsilon 1e-5; the model as a whole
    also needs convolution): 154 MB per operand at the largest, streamed through SBUF."""
    assert f"batch-norm-{kind}(f32[{','.join(map(str, shape))}]" in (DATA / "hlo" / "mobilenet_v2.hlo").read_text()
    assert_device_matches(module_of(bn_hlo(kind, shape, 1, eps=1e-5)), bn_inputs(kind, shape, 1), target)


# --- models -----------------------------------------------------------------------------------------------

MODELS = ["jax/layernorm.hlo", "jax/softmax.hlo", "hlo/sum_axis_1x4096x1024_bf16.hlo",
          "hlo/mean_axis_1x4096x1024_bf16.hlo", "hlo/layer_norm_1x4096x768_bf16.hlo",
          "hlo/xnn.parallel_dots.optimized.hlo"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", MODELS)
def test_models_with_reductions_match(model: str, target: str) -> None:
    path = DATA / model
    if model.startswith("jax/"):
        ref = np.load(path.with_suffix(".npz"))
        inputs = {k: ref[k] for k in ref.files if k.startswith("in")}
        expected = [ref[f"out{i}"] for i in range(sum(1 for k in ref.files if k.startswith("out")))]
        assert_device_matches(module_of(path, optimized=True), inputs, target, expected=expected)
    else:
        assert_device_matches(module_of(path), None, target)


def test_sum_axis_reads_bf16_once_and_spills_nothing() -> None:
    """reduce(convert(bf16 -> f32)) then convert(-> bf16): both converts fused, no HBM scratch."""
    lw = lower_graph(module_of(DATA / "hlo" / "sum_axis_1x4096x1024_bf16.hlo"), sim.load_target("trn1"))
    assert not [b for b in lw.graph.bufs if b.kind == "scratch" and b.users]

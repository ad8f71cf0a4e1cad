"""The indexing family on the device (backend/indexing.py): iota, dynamic slices, gather, scatter, sort and
topk compile, pass the verifier and match the reference interpreter (or XLA) on trn1 and trn2."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
from harness import DATA, assert_device_matches, device_run, module_of, random_inputs

from nxsat import sim
from nxsat.backend import compile_graph
from nxsat.diagnostics import NxsatError

TARGETS = ["trn1", "trn2"]
FAMILY = re.compile(r"(gather|scatter|dynamic_slice|dynamic_update_slice|sort|argsort|topk|iota)_")
CASES = sorted(p.stem for p in (DATA / "xla_ops").glob("*.hlo") if FAMILY.match(p.stem))
# Cases whose inputs need 64 bits: the device holds s64 as s32 (NCC_WTYP001), so they run on the inputs
# wrapped to 32 bits and are compared with the interpreter on those same wrapped inputs.
WRAPPED = {"dynamic_slice_s64_index", "sort_s64"}


def _wrapped(a: np.ndarray) -> np.ndarray:
    return a.astype(np.int32).astype(a.dtype) if a.dtype in (np.int64, np.uint64) else a


def test_every_case_of_the_family_is_listed() -> None:
    assert len(CASES) == 59
    assert WRAPPED <= set(CASES)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", CASES)
def test_xla_op_case(name: str, target: str) -> None:
    ref = np.load(DATA / "xla_ops" / f"{name}.npz")
    inputs = {k: ref[k] for k in ref.files if k.startswith("in")}
    if name in WRAPPED:
        assert any(not np.array_equal(_wrapped(a), a) for a in inputs.values())  # the case needs the wrap
        inputs = {k: _wrapped(a) for k, a in inputs.items()}
    assert_device_matches(module_of(DATA / "xla_ops" / f"{name}.hlo"), inputs, target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["embedding", "update_slice", "topk"])
@pytest.mark.parametrize("optimized", [False, True])
def test_jax_model_matches_xla(name: str, target: str, optimized: bool) -> None:
    ref = np.load(DATA / "jax" / f"{name}.npz")
    inputs = {k: ref[k] for k in ref.files if k.startswith("in")}
    expected = [ref[f"out{i}"] for i in range(sum(1 for k in ref.files if k.startswith("out")))]
    assert_device_matches(module_of(DATA / "jax" / f"{name}.hlo", optimized=optimized), inputs, target,
                          expected=expected)


@pytest.mark.parametrize("target", TARGETS)
def test_topk_logits_50000(target: str) -> None:
    m = module_of(DATA / "hlo" / "topk_logits_k10_1x50000_bf16.hlo")
    inputs = random_inputs(m, seed=3)
    x = inputs[next(iter(inputs))]
    x[0, [7, 49_999, 31_000]] = np.float32(100.0)  # ties at the top, across the partitions a row spreads over
    assert_device_matches(m, inputs, target)


# --- beyond the corpus: tiling paths, duplicates, long rows -----------------------------------------

def _ints(rng: np.random.Generator, lo: int, hi: int, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(lo, hi, shape).astype(np.int32)


ADD = "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT r = f32[] add(a, b) }\n"
Make = Callable[[np.random.Generator], dict[str, np.ndarray]]
SYNTHETIC: dict[str, tuple[str, Make]] = {}


def _case(name: str, text: str, make: Make) -> None:
    SYNTHETIC[name] = (text, make)


# rows of 10 KB (copied in column chunks), more index vectors than partitions, clamped indices
_case("gather_wide_rows", """HloModule m
ENTRY e {
  t = f32[300,2500] parameter(0)
  i = s32[260,1] parameter(1)
  ROOT g = f32[260,2500] gather(t, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0},
      index_vector_dim=1, slice_sizes={1,2500}
}""", lambda r: {"in0": r.standard_normal((300, 2500)).astype(np.float32), "in1": _ints(r, -5, 310, (260, 1))})

# windows of 120 rows: the row indices go through HBM (more rows per index vector than a tile takes)
_case("gather_big_windows", """HloModule m
ENTRY e {
  t = f32[40,50,30] parameter(0)
  i = s32[5,2] parameter(1)
  ROOT g = f32[5,3,40,30] gather(t, i), offset_dims={1,2,3}, collapsed_slice_dims={}, start_index_map={0,1},
      index_vector_dim=1, slice_sizes={3,40,30}
}""", lambda r: {"in0": r.standard_normal((40, 50, 30)).astype(np.float32), "in1": _ints(r, -3, 52, (5, 2))})

# a predicate table goes through bytes
_case("gather_pred", """HloModule m
ENTRY e {
  t = pred[7,3] parameter(0)
  i = s32[4,1] parameter(1)
  ROOT g = pred[4,3] gather(t, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0},
      index_vector_dim=1, slice_sizes={1,3}
}""", lambda r: {"in0": r.random((7, 3)) < 0.5, "in1": _ints(r, -2, 9, (4, 1))})

# minimum with many duplicates and dropped updates, over more index vectors than partitions (in order)
_case("scatter_min_rounds", """HloModule m
mn { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT r = f32[] minimum(a, b) }
ENTRY e {
  x = f32[20,3] parameter(0)
  i = s32[150,1] parameter(1)
  u = f32[150,3] parameter(2)
  ROOT s = f32[20,3] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=mn
}""", lambda r: {"in0": r.standard_normal((20, 3)).astype(np.float32), "in1": _ints(r, -2, 22, (150, 1)),
                 "in2": r.standard_normal((150, 3)).astype(np.float32)})

# bf16 add rounds after each update (XLA's order): not the fp32 scatter-add
_case("scatter_add_bf16_duplicates", """HloModule m
add { a = bf16[] parameter(0)
 b = bf16[] parameter(1)
 ROOT r = bf16[] add(a, b) }
ENTRY e {
  x = bf16[6,4] parameter(0)
  i = s32[40,1] parameter(1)
  u = bf16[40,4] parameter(2)
  ROOT s = bf16[6,4] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
}""", lambda r: {"in0": r.standard_normal((6, 4)).astype(np.float32), "in1": _ints(r, 0, 6, (40, 1)),
                 "in2": r.standard_normal((40, 4)).astype(np.float32)})

# replace with duplicates: the last update in update order wins, over several tiles
_case("scatter_set_duplicates", """HloModule m
set { a = f32[] parameter(0)
 ROOT b = f32[] parameter(1) }
ENTRY e {
  x = f32[50,5] parameter(0)
  i = s32[300,1] parameter(1)
  u = f32[300,5] parameter(2)
  ROOT s = f32[50,5] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=set
}""", lambda r: {"in0": r.standard_normal((50, 5)).astype(np.float32), "in1": _ints(r, -3, 53, (300, 1)),
                 "in2": r.standard_normal((300, 5)).astype(np.float32)})

# fp32 scatter-add of wide rows (the device's scatter-add, in update order)
_case("scatter_add_wide", ADD + """ENTRY e {
  x = f32[64,600] parameter(0)
  i = s32[200,1] parameter(1)
  u = f32[200,600] parameter(2)
  ROOT s = f32[64,600] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
}""", lambda r: {"in0": r.standard_normal((64, 600)).astype(np.float32), "in1": _ints(r, -1, 66, (200, 1)),
                 "in2": r.standard_normal((200, 600)).astype(np.float32)})

# an update computation that is no single operator: evaluated on tiles, round by round
_case("scatter_body", """HloModule m
body { a = f32[] parameter(0)
 b = f32[] parameter(1)
 h = f32[] constant(0.5)
 m = f32[] multiply(a, h)
 ROOT r = f32[] add(m, b) }
ENTRY e {
  x = f32[8,2] parameter(0)
  i = s32[12,1] parameter(1)
  u = f32[12,2] parameter(2)
  ROOT s = f32[8,2] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=body
}""", lambda r: {"in0": r.standard_normal((8, 2)).astype(np.float32), "in1": _ints(r, 0, 8, (12, 1)),
                 "in2": r.standard_normal((12, 2)).astype(np.float32)})

# updates of another float type than the operand (XLA allows it): the body converts
_case("scatter_mixed_types", """HloModule m
body { a = f32[] parameter(0)
 b = bf16[] parameter(1)
 c = f32[] convert(b)
 ROOT r = f32[] add(a, c) }
ENTRY e {
  x = f32[8,2] parameter(0)
  i = s32[12,1] parameter(1)
  u = bf16[12,2] parameter(2)
  ROOT s = f32[8,2] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0},
      scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=body
}""", lambda r: {"in0": r.standard_normal((8, 2)).astype(np.float32), "in1": _ints(r, 0, 8, (12, 1)),
                 "in2": r.standard_normal((12, 2)).astype(np.float32)})

# a key-value cache: a time step read and written at a runtime position
_case("kv_cache_step", """HloModule m
ENTRY e {
  c = f32[2,64,4,32] parameter(0)
  t = s32[] parameter(1)
  u = f32[2,1,4,32] parameter(2)
  z = s32[] constant(0)
  w = f32[2,64,4,32] dynamic-update-slice(c, u, z, t, z, z)
  s = f32[2,16,4,32] dynamic-slice(w, z, t, z, z), dynamic_slice_sizes={2,16,4,32}
  ROOT r = (f32[2,64,4,32], f32[2,16,4,32]) tuple(w, s)
}""", lambda r: {"in0": r.standard_normal((2, 64, 4, 32)).astype(np.float32), "in1": np.int32(57),
                 "in2": r.standard_normal((2, 1, 4, 32)).astype(np.float32)})

# constant starts clamped at compile time (a plain slice), runtime ones on a transposed operand
_case("dynamic_slice_constants_and_views", """HloModule m
ENTRY e {
  x = f32[6,7] parameter(0)
  i = s32[] parameter(1)
  xt = f32[7,6] transpose(x), dimensions={1,0}
  c = s32[] constant(100)
  n = s32[] constant(-4)
  a = f32[3,2] dynamic-slice(xt, i, c), dynamic_slice_sizes={3,2}
  b = f32[2,2] dynamic-slice(x, c, n), dynamic_slice_sizes={2,2}
  u = f32[7,6] dynamic-update-slice(xt, b, c, i)
  v = f32[6,7] dynamic-update-slice(x, b, n, c)
  ROOT r = (f32[3,2], f32[2,2], f32[7,6], f32[6,7]) tuple(a, b, u, v)
}""", lambda r: {"in0": r.standard_normal((6, 7)).astype(np.float32), "in1": np.int32(3)})

# more rows than partitions, rows padded to a power of two, an index payload (argsort)
_case("sort_rows_payload", """HloModule m
lt { a = f32[] parameter(0)
 b = f32[] parameter(1)
 i = s32[] parameter(2)
 j = s32[] parameter(3)
 ROOT c = pred[] compare(a, b), direction=LT }
ENTRY e {
  x = f32[200,100] parameter(0)
  io = s32[200,100] iota(), iota_dimension=1
  s = (f32[200,100], s32[200,100]) sort(x, io), dimensions={1}, is_stable=true, to_apply=lt
  ROOT r = s32[200,100] get-tuple-element(s), index=1
}""", lambda r: {"in0": np.round(r.standard_normal((200, 100)) * 4).astype(np.float32)})

# s32 keys beyond 2^24 (exact on GpSimd), along dimension 0, descending and stable
_case("sort_big_ints_dim0", """HloModule m
gt { a = s32[] parameter(0)
 b = s32[] parameter(1)
 ROOT c = pred[] compare(a, b), direction=GT }
ENTRY e {
  x = s32[33,3] parameter(0)
  ROOT s = s32[33,3] sort(x), dimensions={0}, to_apply=gt
}""", lambda r: {"in0": (r.integers(-3, 3, (33, 3)) + (1 << 24)).astype(np.int32)})

# a row over 20 partitions per row, three rows at once, ties
_case("topk_long_rows", """HloModule m
ENTRY e {
  x = f32[3,5000] parameter(0)
  ROOT t = (f32[3,5], s32[3,5]) topk(x), k=5, largest=true
}""", lambda r: {"in0": np.round(r.standard_normal((3, 5000)) * 8).astype(np.float32)})

# the k smallest of u32 values (unsigned order)
_case("topk_smallest_u32", """HloModule m
ENTRY e {
  x = u32[4,37] parameter(0)
  ROOT t = (u32[4,3], s32[4,3]) topk(x), k=3, largest=false
}""", lambda r: {"in0": r.integers(0, 1 << 32, (4, 37), dtype=np.uint64).astype(np.uint32)})

# every iota layout: partitions along the ramp or along the outer dimensions, several dimensions
_case("iota_layouts", """HloModule m
ENTRY e {
  a = s32[300,7] iota(), iota_dimension=0
  b = f32[5,3000] iota(), iota_dimension=1
  c = bf16[4,50,6] iota(), iota_dimension=1
  d = u16[3,400,2] iota(), iota_dimension=2
  f = s8[700,3] iota(), iota_dimension=1
  ROOT r = (s32[300,7], f32[5,3000], bf16[4,50,6], u16[3,400,2], s8[700,3]) tuple(a, b, c, d, f)
}""", lambda r: {})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_case(name: str, target: str) -> None:
    text, make = SYNTHETIC[name]
    assert_device_matches(module_of(text), make(np.random.default_rng(7)), target)


def test_scatter_rounds_follow_update_order() -> None:
    """Duplicate bf16 adds round after each update, as XLA applies them: one fp32 scatter-add would not."""
    text, make = SYNTHETIC["scatter_add_bf16_duplicates"]
    inputs = make(np.random.default_rng(1))
    got, _ = device_run(module_of(text), inputs, "trn1")
    x = inputs["in0"].astype(np.float64)
    once = x.copy()  # what adding in fp32 and rounding once would give
    for k, i in enumerate(inputs["in1"][:, 0]):
        once[i] += inputs["in2"][k]
    import ml_dtypes

    assert not np.array_equal(got[0].astype(np.float32), once.astype(np.float32).astype(ml_dtypes.bfloat16)
                              .astype(np.float32))


def test_too_long_sort_is_refused() -> None:
    m = module_of("""HloModule m
lt { a = f32[] parameter(0)
 b = f32[] parameter(1)
 ROOT c = pred[] compare(a, b), direction=LT }
ENTRY e {
  x = f32[2,9000] parameter(0)
  ROOT s = f32[2,9000] sort(x), dimensions={1}, to_apply=lt
}""")
    with pytest.raises(NxsatError) as e:
        compile_graph(m, sim.load_target("trn1"))
    assert e.value.code == "NCC_EUOC002" and "sort" in str(e.value)


COLUMNS = """HloModule take
ENTRY main {
  a = f32[300,36] parameter(0)
  i = s32[15,1] parameter(1)
  ROOT g = f32[300,15] gather(a, i), offset_dims={0}, collapsed_slice_dims={1}, start_index_map={1}, \
index_vector_dim=1, slice_sizes={300,1}
}
""".replace("\\\n", "")


@pytest.mark.parametrize("target", TARGETS)
def test_a_gather_of_whole_columns_selects_them_on_chip(target: str) -> None:
    """DLRM's take of 15 of 36 columns: a row of the gather's table is one element, so the general path
    made 4,500 four-byte indirect copies here. The matrix loads as it lies and each tile's columns are
    selected on chip (a select against the clamped indices, -inf elsewhere, and a maximum): no indirect
    copy, and bit for bit the reference's values, NaN, infinities and -0.0 included, indices clamped."""
    from harness import reference_run

    m = module_of(COLUMNS)
    prog = compile_graph(m, sim.load_target(target)).program
    assert not any(i.opcode == "gather" for i in prog.instrs)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((300, 36)).astype(np.float32)
    a[::7, 5] = np.nan
    a[::5, 0] = -0.0
    a[1::9, 35] = np.inf
    idx = np.array([0, 5, 35, 40, -3, 7, 7, 12, 0, 1, 2, 3, 34, 33, 100], np.int32).reshape(15, 1)
    got, _ = device_run(m, {"in0": a, "in1": idx}, target)
    want = reference_run(m, {"in0": a, "in1": idx})
    np.testing.assert_array_equal(got[0].view(np.uint32), want[0].view(np.uint32))


def _resize_hlo(indices: list[int], dim: int) -> str:
    """A gather along ``dim`` of a [1, 6, 5, 16] value by constant start indices, as jax.image.resize's
    nearest method lowers (once generic has folded its index arithmetic to a constant)."""
    n = len(indices)
    shape = [1, 6, 5, 16]
    sizes = list(shape)
    sizes[dim] = 1
    out = list(shape)
    out[dim] = n
    const = ", ".join(f"{{{i}}}" for i in indices)
    offset = ",".join(str(e) for e in range(4) if e != dim)
    return (f"HloModule resize\nENTRY main {{\n  x = f32[{','.join(map(str, shape))}] parameter(0)\n"
            f"  i = s32[{n},1] constant({{ {const} }})\n"
            f"  ROOT g = f32[{','.join(map(str, out))}] gather(x, i), offset_dims={{{offset}}}, "
            f"collapsed_slice_dims={{{dim}}}, start_index_map={{{dim}}}, index_vector_dim=1, "
            f"slice_sizes={{{','.join(map(str, sizes))}}}\n}}\n")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("indices", "dim", "repeats"), [
    ([i // 2 for i in range(12)], 1, True),  # nearest up-sampling of the rows by 2
    ([i // 3 for i in range(15)], 2, True),  # of the columns by 3
    ([1 + 2 * (i // 2) for i in range(4)], 1, True),  # every other row from the second, each twice
    ([4, 4, 4], 2, True),  # one column repeated
    ([0, 0, 1, 2, 2, 3], 1, False),  # uneven: the general path
    ([5, 3, 1], 1, False),  # backwards: the general path
    ([i // 2 for i in range(12)][:11] + [9], 1, True),  # clamped: 9 is the last row, 5, as the gather clamps
])
def test_a_gather_repeating_constant_indices_is_one_dma(indices: list[int], dim: int, repeats: bool,
                                                        target: str) -> None:
    """Nearest-neighbour up-sampling (jax.image.resize's gathers by i // k) and strided takes: the rows are
    one DMA whose source repeats through a stride-0 dimension, no indirect copy; other constant indices
    take the general path. Either way, bit for bit the reference's values."""
    from harness import reference_run

    from nxsat.backend.indexing import repeat_pattern

    m = module_of(_resize_hlo(indices, dim))
    prog = compile_graph(m, sim.load_target(target)).program
    assert any(i.opcode == "gather" for i in prog.instrs) is not repeats
    clamped = np.clip(np.array(indices), 0, [1, 6, 5, 16][dim] - 1)
    assert (repeat_pattern(clamped) is not None) is repeats
    x = np.random.default_rng(5).standard_normal((1, 6, 5, 16)).astype(np.float32)
    got, _ = device_run(m, {"in0": x}, target)
    want = reference_run(m, {"in0": x})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(want[0], np.take(x, clamped, axis=dim))


def test_repeat_pattern() -> None:
    from nxsat.backend.indexing import repeat_pattern

    assert repeat_pattern(np.array([0, 0, 1, 1, 2, 2])) == (0, 1, 2)
    assert repeat_pattern(np.array([3, 5, 7])) == (3, 2, 1)
    assert repeat_pattern(np.array([2, 2, 2])) == (2, 1, 3)
    assert repeat_pattern(np.array([0, 0, 1])) is None  # the last run is short
    assert repeat_pattern(np.array([0, 1, 1])) is None
    assert repeat_pattern(np.array([4, 2])) is None  # backwards
    assert repeat_pattern(np.array([], np.int64)) is None


RESIZE_2D = """HloModule resize2d
ENTRY main {
  x = f32[1,4,3,8] parameter(0)
  e = f32[1,4,3,8] exponential(x)
  r = s32[8,1] constant({ {0}, {0}, {1}, {1}, {2}, {2}, {3}, {3} })
  c = s32[6,1] constant({ {0}, {0}, {1}, {1}, {2}, {2} })
  g1 = f32[1,8,3,8] gather(e, r), offset_dims={0,2,3}, collapsed_slice_dims={1}, start_index_map={1}, \
index_vector_dim=1, slice_sizes={1,1,3,8}
  ROOT g2 = f32[1,8,6,8] gather(g1, c), offset_dims={0,1,3}, collapsed_slice_dims={2}, start_index_map={2}, \
index_vector_dim=1, slice_sizes={1,8,1,8}
}
""".replace("\\\n", "")


@pytest.mark.parametrize("target", TARGETS)
def test_a_two_dimensional_up_sampling_is_one_dma(target: str) -> None:
    """jax.image.resize's nearest up-sampling of rows and columns, two gathers: one DMA from the value up-sampled
    (the first gather's result is never written), bit for bit the reference's values (np.repeat's of exp)."""
    from harness import reference_run

    m = module_of(RESIZE_2D)
    prog = compile_graph(m, sim.load_target(target)).program
    assert not any(i.opcode == "gather" for i in prog.instrs)
    assert not any("g1" in t for t in prog.tensors)
    x = np.random.default_rng(6).standard_normal((1, 4, 3, 8)).astype(np.float32)
    got, _ = device_run(m, {"in0": x}, target)
    want = reference_run(m, {"in0": x})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(want[0], np.repeat(np.repeat(np.exp(x), 2, axis=1), 2, axis=2), rtol=1e-6)

"""Loading IR into the e-graph: flat, one e-node per value, linear, analyses present, and operators no
rule touches round-trip with all their attributes."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import DATA, count_calls
from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.extract.smallest import extract
from nxsat.frontend import load, loads
from nxsat.interpreter import run_module
from nxsat.ir import Computation
from nxsat.passes import canonicalize
from nxsat.rules.catalog import catalog
from nxsat.rules.egraph import EGraph, splat_text

OPAQUE_HLO = """HloModule opaque
add_f32 { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b) }
less { a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT l = pred[] compare(a, b), direction=LT }
body { s = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[3] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  v2 = f32[3] multiply(v, v)
  ROOT r = (s32[], f32[3]) tuple(i2, v2) }
cond { s = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT c = pred[] compare(i, n), direction=LT }
ENTRY main {
  x = f32[2,3] parameter(0)
  k = s32[] parameter(1)
  zero = f32[] constant(0)
  r = f32[2] reduce(x, zero), dimensions={1}, to_apply=add_f32
  idx = s32[2,3] iota(), iota_dimension=1
  sorted = (f32[2,3], s32[2,3]) sort(x, idx), dimensions={1}, is_stable=true, to_apply=less
  sv = f32[2,3] get-tuple-element(sorted), index=0
  row = f32[1,3] slice(sv), slice={[0:1], [0:3]}
  row1 = f32[3] reshape(row)
  t = (s32[], f32[3]) tuple(k, row1)
  w = (s32[], f32[3]) while(t), condition=cond, body=body
  wv = f32[3] get-tuple-element(w), index=1
  ROOT out = (f32[2], f32[3], s32[2,3]) tuple(r, wv, idx)
}
"""


def _chain(n: int):
    b = Builder("chain")
    x = b.param(dt.F32, (4,))
    for i in range(n):
        x = b.op("negate" if i % 2 else "exponential", [x])
    return b.module(x)


def test_one_e_node_per_value_and_a_handle_for_each():
    m = canonicalize(load(DATA / "jax" / "transformer_layer.hlo"))
    eg = EGraph([], catalog())
    loaded = eg.load(m)
    nodes = m.entry.post_order()
    sizes = eg.sizes()
    assert sizes.nodes == len(nodes) - loaded.cse_merged
    assert sizes.classes == sizes.nodes
    view = eg.view()
    assert set(view.handles) == set(loaded.nodes) and len(loaded.nodes) == len(nodes)


def test_shape_dtype_and_splat_are_analyses_of_every_loaded_value():
    b = Builder("a")
    x = b.param(dt.BF16, (2, 3))
    c = b.op("broadcast", [b.constant(0.5, dt.BF16)], shape=(2, 3), dimensions=())
    m = b.module(b.op("add", [x, c]))
    eg = EGraph([], catalog())
    loaded = eg.load(m)
    eg.run_analysis()
    view = eg.view()
    for lid, node in loaded.nodes.items():
        cls = view.handles[lid]
        assert view.shape[cls] == node.shape and view.dtype[cls] == node.dtype.name
    assert view.splat[view.handles[loaded.ids[c.id]]] == "0.5"  # a broadcast splat, via the analysis


def test_splat_spelling():
    assert [splat_text(v, dt.F32) for v in (0.0, -0.0, 1.0, -1.0, 0.5, float("inf"), float("nan"))] == \
        ["0", "-0", "1", "-1", "0.5", "inf", "nan"]
    assert splat_text(True, dt.PRED) == "1" and splat_text(np.int32(-3), dt.S32) == "-3"


def test_opaque_operators_round_trip_with_their_attributes():
    m = canonicalize(loads(OPAQUE_HLO, "opaque.hlo"))
    assert "while" in [n.op for n in m.entry.post_order()]  # a dynamic trip count stays a loop
    eg = EGraph(catalog().select(level=2), catalog())
    loaded = eg.load(m)
    out = extract(eg, loaded)
    before = {n.name: n for n in m.entry.post_order()}
    after = {n.name: n for n in out.entry.post_order()}
    for name in ("r", "sorted", "w"):
        a, b = before[name], after[name]
        assert a.op == b.op and a.type == b.type and a.attrs.keys() == b.attrs.keys()
        for key, value in a.attrs.items():
            assert b.attrs[key] is value or b.attrs[key] == value
            if isinstance(value, Computation):
                assert b.attrs[key] is value  # the same body, not a copy
    inputs = [np.array([[3, 1, 2], [0.5, -1, 4]], np.float32), np.int32(1)]
    for a, b in zip(run_module(m, inputs), run_module(out, inputs)):
        np.testing.assert_array_equal(a, b)


def test_nondeterministic_operators_are_never_merged():
    b = Builder("rng")
    lo, hi = b.constant(0.0, dt.F32), b.constant(1.0, dt.F32)
    t = b.module([b.op("rng", [lo, hi], distribution="rng_uniform", type=b.nodes[0].type.with_shape((3,)))
                  for _ in range(2)])
    eg = EGraph([], catalog())
    loaded = eg.load(t)
    assert loaded.cse_merged == 0
    view = eg.view()
    r1, r2 = [n for n in t.entry.post_order() if n.op == "rng"]
    assert view.handles[loaded.ids[r1.id]] != view.handles[loaded.ids[r2.id]]


def test_a_long_chain_loads_flat_without_recursion():
    m = _chain(20_000)
    eg = EGraph([], catalog())
    loaded = eg.load(m)
    assert eg.sizes().nodes == 20_001
    out = extract(eg, loaded)
    assert len(out.entry.post_order()) == 20_001


def _load_work(m, rules=()) -> tuple[int, list[int], int, int]:
    """(Python and C function calls of eg.load, egglog commands per run_program, load-pass iterations,
    rule matches of the load pass): the work of loading, counted rather than timed."""
    eg = EGraph(rules, catalog())
    runs: list[tuple[tuple, list]] = []
    run = eg._run

    def recording(*commands):
        out = run(*commands)
        runs.append((commands, out))
        return out

    eg._run = recording
    calls = count_calls(eg.load, m)
    reports = [o.report for _, outs in runs for o in outs if type(o).__name__ == "RunScheduleOutput"]
    iterations = sum(len(r.iterations) for r in reports)
    matches = sum(sum(r.num_matches_per_rule.values()) for r in reports)
    return calls, [len(c) for c, _ in runs], iterations, matches


def test_loading_is_linear_in_graph_size():
    """8x the nodes, 8x the work: Python calls grow linearly (a quadratic load would make 64x), and
    egglog gets the same commands (one table per kind of row, then one pass of the load rules) whose
    rule matches are exactly the rows (3 per value of the chain: its term, shape and dtype)."""
    small, big = _load_work(_chain(2_000)), _load_work(_chain(16_000))
    assert big[0] < 8 * small[0] * 1.25, (small[0], big[0])
    assert small[1] == big[1]  # the same egglog commands, whatever the size
    assert small[2] == big[2] == 1  # one iteration of the load ruleset
    assert (small[3], big[3]) == (3 * 2_000 + 3, 3 * 16_000 + 3)


@pytest.mark.parametrize("name", ["resnet50_keras_jax_f32.hlo",
                                  pytest.param("gemma3_1b_flax_call.hlo", marks=pytest.mark.slow)])
def test_corpus_models_load_in_work_linear_in_their_instructions(name):
    """A real model loads like the chain: a bounded number of calls per instruction, the load pass once,
    one match per row. (Seconds per thousand instructions: bench/egraph_load.py.)"""
    m = canonicalize(load(DATA / "hlo" / name))
    n = len(m.entry.post_order())
    calls, _, iterations, matches = _load_work(m, catalog().select(level=2))
    assert calls < 100 * n, f"{name}: {calls / n:.0f} calls per instruction"
    assert iterations == 1
    assert n <= matches < 8 * n, (n, matches)

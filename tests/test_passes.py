"""Canonicalization passes: inline-calls, if-convert, unroll-loops keep values and remove control flow."""

from __future__ import annotations

import numpy as np
import pytest

from nxsat.frontend.hlo import parse_hlo
from nxsat.interpreter import run_module
from nxsat.passes import PASSES, canonicalize, has_control_flow, static_trip_count

CALLS = """HloModule m
inner { a = f32[3] parameter(0)
  ROOT n = f32[3] negate(a) }
outer { a = f32[3] parameter(0)
  b = f32[3] call(a), to_apply=inner
  ROOT s = f32[3] add(a, b) }
ENTRY e {
  x = f32[3] parameter(0)
  c1 = f32[3] call(x), to_apply=outer
  ROOT c2 = f32[3] call(c1), to_apply=inner
}
"""

SWITCH = """HloModule m
b0 { a = f32[2] parameter(0)
  ROOT r = (f32[2], f32[2]) tuple(a, a) }
b1 { a = f32[2] parameter(0)
  n = f32[2] negate(a)
  ROOT r = (f32[2], f32[2]) tuple(n, a) }
b2 { a = f32[2] parameter(0)
  e = f32[2] exponential(a)
  ROOT r = (f32[2], f32[2]) tuple(e, e) }
ENTRY e {
  i = s32[] parameter(0)
  x = f32[2] parameter(1)
  ROOT c = (f32[2], f32[2]) conditional(i, x, x, x), branch_computations={b0, b1, b2}
}
"""

PRED_COND = """HloModule m
t { a = f32[2] parameter(0)
  ROOT n = f32[2] negate(a) }
f { a = f32[2] parameter(0)
  ROOT n = f32[2] abs(a) }
ENTRY e {
  p = pred[] parameter(0)
  x = f32[2] parameter(1)
  ROOT c = f32[2] conditional(p, x, x), true_computation=t, false_computation=f
}
"""


def loop(init: str, limit: str, direction: str = "LT", step: str = "1") -> str:
    return f"""HloModule m
body {{ s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[2] get-tuple-element(s), index=1
  k = s32[] constant({step})
  i2 = s32[] add(i, k)
  two = f32[2] constant({{2, 2}})
  v2 = f32[2] multiply(v, two)
  ROOT r = (s32[], f32[2]) tuple(i2, v2) }}
cond {{ s = (s32[], f32[2]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] {limit}
  ROOT c = pred[] compare(i, n), direction={direction} }}
ENTRY e {{
  x = f32[2] parameter(0)
  z = s32[] {init}
  t = (s32[], f32[2]) tuple(z, x)
  w = (s32[], f32[2]) while(t), condition=cond, body=body
  ROOT v = f32[2] get-tuple-element(w), index=1
}}
"""


def same_values(m, inputs):
    c = canonicalize(m)
    a, b = run_module(m, inputs), run_module(c, inputs)
    assert len(a) == len(b) == len(m.outputs)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    return c


def ops(module):
    return [n.op for n in module.entry.post_order()]


def test_inline_calls_nested():
    m = parse_hlo(CALLS)
    c = same_values(m, [np.array([1, 2, 3], np.float32)])
    assert "call" not in ops(c) and not has_control_flow(c.entry)
    assert PASSES["inline-calls"].run(m).entry.root.op == "negate"


@pytest.mark.parametrize("index,expect", [(0, (1.0, 1.0)), (1, (-1.0, 1.0)), (2, (np.e, np.e)), (7, (np.e, np.e)),
                                          (-1, (np.e, np.e))])
def test_if_convert_switch_including_out_of_range_index(index, expect):
    m = parse_hlo(SWITCH)
    x = np.ones(2, np.float32)
    c = same_values(m, [np.int32(index), x])
    assert "conditional" not in ops(c)
    a, b = run_module(c, [np.int32(index), x])
    np.testing.assert_allclose([a[0], b[0]], expect, rtol=1e-6)


@pytest.mark.parametrize("p", [True, False])
def test_if_convert_pred(p):
    m = parse_hlo(PRED_COND)
    c = same_values(m, [np.bool_(p), np.array([-3, 4], np.float32)])
    assert "conditional" not in ops(c) and "select" in ops(c)


@pytest.mark.parametrize("init,limit,direction,step,trips", [
    ("constant(0)", "constant(5)", "LT", "1", 5),
    ("constant(3)", "constant(3)", "LT", "1", 0),
    ("constant(10)", "constant(0)", "GT", "-2", 5),
    ("constant(0)", "constant(7)", "NE", "1", 7),
])
def test_static_loops_unroll(init, limit, direction, step, trips):
    m = parse_hlo(loop(init, limit, direction, step))
    w = next(n for n in m.entry.post_order() if n.op == "while")
    assert static_trip_count(w) == trips
    c = same_values(m, [np.array([1, 3], np.float32)])
    assert "while" not in ops(c)
    assert ops(c).count("multiply") == trips


def test_dynamic_trip_count_keeps_the_loop():
    text = loop("constant(0)", "constant(4)").replace("n = s32[] constant(4)", "n = s32[] constant(4)")
    text = text.replace("  x = f32[2] parameter(0)\n  z = s32[] constant(0)",
                        "  x = f32[2] parameter(0)\n  z = s32[] parameter(1)")
    m = parse_hlo(text)
    c = same_values(m, [np.array([1, 3], np.float32), np.int32(1)])
    assert "while" in ops(c)


def test_runaway_loop_is_not_unrolled():
    m = parse_hlo(loop("constant(0)", "constant(100000000)"))
    w = next(n for n in m.entry.post_order() if n.op == "while")
    assert static_trip_count(w) is None
    assert "while" in ops(canonicalize(m))


MAP = """HloModule m
hyp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  two = f32[] constant(2)
  aa = f32[] multiply(a, a)
  s = f32[] add(aa, b)
  c = pred[] compare(s, two), direction=GT
  ROOT r = f32[] select(c, s, two)
}
ENTRY main {
  x = f32[2,3] parameter(0)
  y = f32[2,3] parameter(1)
  ROOT h = f32[2,3] map(x, y), dimensions={0,1}, to_apply=hyp
}
"""


def test_elementwise_map_becomes_its_body_on_tensors():
    m = parse_hlo(MAP, "m.hlo")
    c = canonicalize(m)
    ops = [n.op for n in c.entry.post_order()]
    assert "map" not in ops and {"multiply", "add", "compare", "select", "broadcast"} <= set(ops)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    y = np.full((2, 3), 0.5, np.float32)
    np.testing.assert_array_equal(run_module(c, [x, y]), run_module(m, [x, y]))
    assert PASSES["inline-maps"].run(m).entry.root.op == "select"

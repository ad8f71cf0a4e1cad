"""The reference interpreter's own behaviour: limits and how failures are reported."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import Loc, NxsatError
from nxsat.interpreter import Interpreter
from nxsat.ops import registry


def _negate_module():
    b = Builder(loc=Loc("m.hlo", 3, 5))
    x = b.param(dt.F32, (1024,))
    return b.module(b.op("negate", [x]))


def test_values_over_the_limit_are_refused_before_they_are_computed():
    m = _negate_module()
    with pytest.raises(NxsatError) as exc:
        Interpreter(max_value_bytes=1000).call(m.entry, [np.zeros(1024, np.float32)])
    assert exc.value.code == "NCC_EOOM002" and "f32[1024]" in exc.value.message
    assert exc.value.loc == Loc("m.hlo", 3, 5)
    out = Interpreter(max_value_bytes=4096).call(m.entry, [np.ones(1024, np.float32)])
    assert out.tolist() == [-1.0] * 1024


def test_the_host_running_out_of_memory_is_a_coded_error_not_an_internal_one(monkeypatch):
    def exhausted(args, attrs, ctx):
        raise MemoryError

    negate = registry.get("negate")
    monkeypatch.setitem(registry._REGISTRY, "negate", dataclasses.replace(negate, impl=exhausted))
    m = _negate_module()
    with pytest.raises(NxsatError) as exc:
        Interpreter().call(m.entry, [np.zeros(1024, np.float32)])
    assert exc.value.code == "NCC_EOOM002" and "negate" in exc.value.message


def test_a_reducer_that_is_not_elementwise_runs_lane_by_lane():
    """A reduce body is run once over whole arrays of lanes, which assumes its operators are elementwise.
    A ``dot`` of two scalars is not (on arrays it is an outer product): it runs lane by lane and gives
    what ``multiply`` gives. (Found by tests/test_fuzz_hlo.py: a mutated argmax reducer.)"""
    from nxsat.frontend.hlo import parse_hlo

    text = """HloModule r
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] OP(a, b)
}
ENTRY main {
  x = f32[6,5]{1,0} parameter(0)
  one = f32[] constant(1)
  ROOT p = f32[6]{0} reduce(x, one), dimensions={1}, to_apply=add
}
"""
    x = np.random.default_rng(0).uniform(0.5, 1.5, (6, 5)).astype(np.float32)
    got, want = (Interpreter().call(parse_hlo(text.replace("OP", op), "r.hlo").entry, [x])
                 for op in ("dot", "multiply"))
    np.testing.assert_array_equal(got, want)

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

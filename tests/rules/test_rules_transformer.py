"""Every rule of the transformer set, shown firing on a small graph, with the e-graph still sound (the
generic set's test, tests/rules/test_rules_generic.py, does the same for its rules); and the set firing
on the corpus's transformers, where `--model-type transformer` extracts the fused operators."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.extract.smallest import extract
from nxsat.interpreter import run_module
from nxsat.ir import Module, Node
from nxsat.rules.catalog import catalog
from nxsat.rules.checker import verify
from nxsat.rules.egraph import EGraph
from nxsat.rules.saturate import Budget, saturate
from nxsat.rules.terms import reducer_body

F32, BF16 = dt.F32, dt.BF16
DATA = Path(__file__).resolve().parents[1] / "data"


def _splat(b: Builder, v: float, d: dt.DType, shape: tuple[int, ...]) -> Node:
    return b.op("broadcast", [b.constant(v, d)], shape=shape, dimensions=())


def _softmax_pattern(d: dt.DType, f32_sum: bool) -> Callable[[], Module]:
    """exp(x - max) / sum(exp(x - max)) over the last dimension, as JAX writes it (the sum in f32 for a
    narrow type when ``f32_sum``)."""
    def make() -> Module:
        b = Builder("sm")
        shape = (2, 3, 5)
        x = b.param(d, shape)
        keep = (0, 1)
        m = b.op("reduce", [x, b.constant(-np.inf, d)], dimensions=(2,), to_apply=reducer_body("maximum", d.name))
        e = b.op("exponential", [b.op("subtract", [x, b.op("broadcast", [m], shape=shape, dimensions=keep)])])
        if f32_sum:
            s32 = b.op("reduce", [b.op("convert", [e], dtype=F32), b.constant(0.0, F32)], dimensions=(2,),
                       to_apply=reducer_body("add", "f32"))
            s = b.op("convert", [s32], dtype=d)
        else:
            s = b.op("reduce", [e, b.constant(0.0, d)], dimensions=(2,), to_apply=reducer_body("add", d.name))
        return b.module(b.op("divide", [e, b.op("broadcast", [s], shape=shape, dimensions=keep)]))
    return make


def _scaled(left: bool) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder("ss")
        x = b.param(F32, (4, 6))
        c = _splat(b, 0.125, F32, (4, 6))
        y = b.op("multiply", [c, x] if left else [x, c])
        return b.module(b.op("softmax", [y], dimension=1, scale=1.0))
    return make


CASES: dict[str, Callable[[], Module]] = {
    "softmax": _softmax_pattern(F32, False),
    "softmax-f32-sum": _softmax_pattern(BF16, True),
    "softmax-scale": _scaled(False),
    "softmax-scale-left": _scaled(True),
}


def test_every_transformer_rule_has_a_case():
    assert {r.name for r in catalog().set_rules(["transformer"])} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_and_stays_equivalent(name):
    cat = catalog()
    (rule,) = cat.find([name])
    module = CASES[name]()
    eg = EGraph([rule], cat)
    loaded = eg.load(module)
    report = saturate(eg, Budget(3, 30.0, 10_000), rules=[rule])
    assert report.matches.get(name, 0) > 0, report.format(all_rules=True)
    rng = np.random.default_rng(0)
    inputs = [dt.cast(rng.standard_normal(p.type.shape) * 3, p.type.dtype) for p in module.entry.params]
    assert verify(eg, loaded, inputs) is None
    out = extract(eg, loaded)
    assert [n.op for n in out.entry.post_order()].count("softmax") == 1
    for a, b in zip(run_module(module, inputs), run_module(out, inputs), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        tol = 2 ** -7 if a.dtype == BF16.np else 1e-6
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


def _extracted(path: Path, model_type: str, level: int = 2) -> Module:
    """The module the compile driver's extract stage hands the backend (same saturation, extractor, costs)."""
    from nxsat import sim
    from nxsat.driver import CompileOptions, _cost_model
    from nxsat.extract import LEVEL_EXTRACTOR, extract
    from nxsat.frontend import load
    from nxsat.passes import canonicalize
    from nxsat.rules import saturate_module

    opts = CompileOptions(model_type=model_type, optlevel=level, auto_cast="matmult")
    sat = saturate_module(canonicalize(load(str(path))), model_type, level, canonical=True)
    cost = _cost_model(sim.load_target("trn1"), opts, ())
    return extract(sat.egraph, sat.loaded, LEVEL_EXTRACTOR[level], cost).module


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("path,scale", [(DATA / "jax" / "softmax.hlo", 1.0),
                                        (DATA / "jax" / "transformer_layer.hlo", 1.0),
                                        (DATA / "hlo" / "mha_block_1x12x128x64_bf16.hlo", 0.125)],
                         ids=["softmax", "transformer_layer", "mha_block"])
def test_the_corpus_softmaxes_become_one_operator(path, scale, level):
    """Under --model-type transformer every softmax of these models is extracted as one fused operator
    (with mha_block's 1/sqrt(64) folded in); under generic none is."""
    fused = [n for n in _extracted(path, "transformer", level).entry.post_order() if n.op == "softmax"]
    assert fused and all(n.attrs["scale"] == scale for n in fused)
    assert not any(n.op == "softmax" for n in _extracted(path, "generic", level).entry.post_order())

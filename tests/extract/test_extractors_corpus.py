"""The extractors on every model of tests/data: each returns an acyclic program with the model's
outputs, the ILP finishes on each (but those in OPEN) and is never beaten, and the DAG greedy never loses
to the tree greedy: cost(ilp) <= cost(dag) <= cost(greedy) in what they minimise."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from nxsat import sim
from nxsat.extract import extract
from nxsat.extract.cost import CostModel
from nxsat.frontend import load
from nxsat.passes import canonicalize
from nxsat.rules import saturate_module

DATA = Path(__file__).resolve().parents[1] / "data"
SLOW = {"gemma3_1b_flax_call", "mobilenet_v2"}  # seconds each; the rest take under one
# Where the ILP does not prove its optimum within ILP_SECONDS: ResNet-50's channels-first twins and the
# reassociations inside them leave the relaxation far below the optimum (it closes in 47 s alone, 84 s
# beside other work). Its answer is then the better of the incumbent and the DAG greedy's, as -O3's is.
OPEN = {"resnet50_keras_jax_f32"}
ILP_SECONDS = 20


def _models() -> list[Path]:
    out = sorted(p for d in ("hlo", "jax", "relay", "bert") for p in (DATA / d).glob("*") if p.suffix in
                 (".hlo", ".relay"))
    return [p for p in out if p.stem != "bert_base_l24"]  # the 12-layer one covers it; 24 is the benchmark's


def _consts(p: Path) -> dict[str, str]:
    for suffix in (".consts.tvm.json", ".consts.json"):
        c = p.with_name(p.stem.replace(".printed", "") + suffix)
        if p.suffix == ".relay" and c.exists():
            return {"relay_constants": str(c)}
    return {}


@cache
def _model() -> CostModel:
    return CostModel(sim.load_target("trn1"), "bf16")


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else [])
                                  for p in _models()])
def test_ilp_dag_greedy_ordering_on_the_corpus(path):
    module = canonicalize(load(str(path), **_consts(path)))
    sat = saturate_module(module, "generic", 2, canonical=True)
    got = {ex: extract(sat.egraph, sat.loaded, ex, _model(), ilp_seconds=ILP_SECONDS)
           for ex in ("greedy", "dag", "ilp")}
    assert got["ilp"].ilp is not None
    if path.stem not in OPEN:
        assert got["ilp"].ilp.status == "optimal", got["ilp"].ilp.to_json()
    g, d, i = (got[k].objective_ns for k in ("greedy", "dag", "ilp"))
    assert i <= d * (1 + 1e-6) and d <= g * (1 + 1e-9), (i, d, g)
    n_out = len(module.entry.root.operands) if module.entry.root.op == "tuple" else 1
    for ex in got.values():  # built (an acyclic choice; every type checked against the loaded graph)
        root = ex.module.entry.root
        assert (len(root.operands) if root.op == "tuple" else 1) == n_out
        assert ex.cost_ns <= ex.input_cost_ns * (1 + 1e-9)  # the input is kept when a choice costs more

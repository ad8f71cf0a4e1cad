"""Bounded saturation: budgets per -O level, stop reasons, the back-off scheduler, the report, and an
explosive rule set that stops at its limit with bounded memory."""

from __future__ import annotations

import json
import resource

import numpy as np
import pytest

from conftest import DATA
from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.extract import optimize
from nxsat.extract.smallest import extract
from nxsat.frontend import load
from nxsat.interpreter import run_module
from nxsat.rules.catalog import catalog
from nxsat.rules.checker import verify
from nxsat.rules.egraph import EGraph
from nxsat.rules.saturate import ITERATION_LIMIT, NODE_LIMIT, SATURATED, TIME_LIMIT, Budget, saturate


def long_sum(n: int):
    b = Builder("sum")
    xs = [b.param(dt.F32, (4,)) for _ in range(n)]
    acc = xs[0]
    for x in xs[1:]:
        acc = b.op("add", [acc, x])
    return b.module(acc)


def explosive():
    return catalog().find(["add-commute", "add-associate"])


def test_explosive_rules_stop_at_the_node_limit_with_bounded_memory():
    module = long_sum(40)
    eg = EGraph(explosive(), catalog())
    loaded = eg.load(module)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    budget = Budget(iterations=1000, seconds=60.0, node_limit=20_000, match_limit=1000, ban_length=2)
    report = saturate(eg, budget)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert report.stop_reason == NODE_LIMIT, report.format()
    # No iteration overshoots: each explosive rule may add at most its share of the nodes left.
    assert all(it.enodes <= budget.node_limit for it in report.iterations)
    assert report.iterations[-1].enodes > budget.node_limit // 4 and "add-" in report.stop_detail
    assert report.bans and set(report.bans) <= {"add-commute", "add-associate"}
    assert grown_mb < 400, f"peak memory grew by {grown_mb:.0f} MB"
    inputs = [np.full(4, i, np.float32) for i in range(40)]
    assert verify(eg, loaded, inputs) is None
    np.testing.assert_allclose(run_module(extract(eg, loaded), inputs)[0], run_module(module, inputs)[0])


def test_time_limit_is_a_normal_stop():
    eg = EGraph(explosive(), catalog())
    eg.load(long_sum(60))
    report = saturate(eg, Budget(iterations=10_000, seconds=0.3, node_limit=10**9, match_limit=100_000))
    assert report.stop_reason == TIME_LIMIT and report.iterations
    assert report.seconds < 10


def test_iteration_limit_and_saturation():
    eg = EGraph(explosive(), catalog())
    eg.load(long_sum(30))
    assert saturate(eg, Budget(2, 60.0, 10**9)).stop_reason == ITERATION_LIMIT
    b = Builder("small")
    x = b.param(dt.F32, (3,))
    m = b.module(b.op("negate", [b.op("negate", [x])]))
    eg = EGraph(catalog().select(level=2), catalog())
    eg.load(m)
    report = saturate(eg, Budget(50, 60.0, 10**6))
    assert report.stop_reason == SATURATED and len(report.iterations) < 50
    assert report.matches["negate-negate"] >= 1


def test_report_has_per_iteration_sizes_matches_and_per_rule_time():
    o = optimize(load(DATA / "jax" / "transformer_layer.hlo"), level=2)
    r = o.report
    assert r.level == 2 and r.sets == ("generic", "layout") and r.stop_reason
    assert r.initial.nodes > 100 and r.load_seconds > 0
    for it in r.iterations:
        assert it.enodes > 0 and it.eclasses > 0 and it.seconds >= 0
    assert sum(r.matches.values()) == sum(sum(it.matches.values()) for it in r.iterations)
    assert set(r.seconds_per_rule) <= set(r.rules)
    text = r.format()
    for word in ("stopped:", "e-nodes", "e-classes", "matches", "transpose-transpose"):
        assert word in text
    data = json.loads(json.dumps(r.to_json()))
    assert data["stop_reason"] == r.stop_reason and len(data["iterations"]) == len(r.iterations)
    assert data["rules"]["transpose-transpose"]["matches"] == r.matches["transpose-transpose"]
    assert not r.timed and data["rules"]["transpose-transpose"]["seconds"] is None


def test_rules_stats_measures_time_per_rule():
    # egglog 13.2 reports zero seconds per rule; with time_rules each rule is timed as its own step.
    o = optimize(load(DATA / "jax" / "transformer_layer.hlo"), level=2, time_rules=True)
    r = o.report
    assert r.timed
    fired = [name for name, m in r.matches.items() if m and name != "constant-fold"]
    assert fired and all(r.seconds_per_rule[name] > 0 for name in fired)
    assert sum(r.seconds_per_rule.values()) <= r.seconds
    assert "(time per rule:" not in r.format() and "--as-compiled" in r.format()


def test_levels_give_growing_budgets_on_a_model():
    m = load(DATA / "jax" / "transformer_layer.hlo")
    r1, r2 = optimize(m, level=1).report, optimize(m, level=2).report
    assert r1.budget.iterations < r2.budget.iterations
    assert not any(n in r1.matches for n in ("add-commute", "multiply-associate"))
    assert any(n in r2.matches for n in ("add-commute", "multiply-commute"))


def commuted_pairs(n: int):
    """n independent add, multiply and maximum nodes: commutativity saturates after one step."""
    b = Builder("pairs")
    outs = []
    for _ in range(n):
        x, y = b.param(dt.F32, (2,)), b.param(dt.F32, (2,))
        outs += [b.op(op, [x, y]) for op in ("add", "multiply", "maximum")]
    return b.module(outs)


def test_rules_held_back_by_the_node_limit_run_alone_before_it_is_claimed():
    # After one step every commutativity match is old, but three rules with 800 matches each cannot
    # share the 899 e-nodes left: each runs alone, adds nothing, and the report says saturated.
    rules = catalog().find(["add-commute", "multiply-commute", "maximum-commute"])
    eg = EGraph(rules, catalog())
    eg.load(commuted_pairs(400))
    report = saturate(eg, Budget(50, 60.0, 4100, match_limit=10**6))
    assert report.stop_reason == SATURATED, report.format()
    assert any(it.held for it in report.iterations)  # the cap did hold them back at first
    assert all(it.enodes <= 4100 for it in report.iterations)
    assert "(add-commute)" in report.format()


def test_a_rule_that_cannot_fit_even_alone_stops_at_the_node_limit_and_says_why():
    eg = EGraph(explosive(), catalog())
    eg.load(long_sum(7))
    report = saturate(eg, Budget(200, 60.0, 3000, match_limit=10**6))
    assert report.stop_reason == NODE_LIMIT and "may add up to" in report.stop_detail
    assert all(it.enodes <= 3000 for it in report.iterations)


@pytest.mark.parametrize("name", ["transformer_layer", "unet_tiny", "convnet"])
def test_saturated_means_every_rule_ran_and_changed_nothing(name):
    from nxsat.passes import canonicalize
    from nxsat.rules.fold import fold

    cat = catalog()
    eg = EGraph(cat.select(None, 2), cat)
    eg.load(canonicalize(load(DATA / "jax" / f"{name}.hlo")))
    report = saturate(eg, Budget(50, 60.0, 10**6))
    assert report.stop_reason == SATURATED, report.format()
    before = eg.sizes()
    eg.run_iteration([], [(10**9, eg.rules)])  # every rule once more, no limit
    fold(eg, eg.freeze(), cat.config.fold_max_elements, cat.config.fold_max_input_elements)
    assert eg.sizes() == before


def test_budgets_scale_with_the_model_so_each_layer_explores_as_much():
    """BERT-base with 2, 12 and 24 layers: what each added layer grows the e-graph by is the same at
    every level (an absolute match limit, and held rules set aside for a ban, made the 24-layer model
    explore less per layer than the 12-layer one at -O2), and the match limit grows with the model."""
    from pathlib import Path

    from nxsat.frontend import load
    from nxsat.passes import canonicalize
    from nxsat.rules import saturate_module

    data = Path(__file__).resolve().parents[1] / "data" / "bert"
    for level in (1, 2, 3):
        nodes, limits = {}, {}
        for n in (2, 12, 24):
            sat = saturate_module(canonicalize(load(str(data / f"bert_base_l{n}.hlo"))), "generic", level,
                                  canonical=True)
            nodes[n], limits[n] = sat.egraph.sizes().nodes, sat.report.budget.match_limit
        per_layer_12 = (nodes[12] - nodes[2]) / 10
        per_layer_24 = (nodes[24] - nodes[12]) / 12
        assert per_layer_24 >= 0.99 * per_layer_12, (level, nodes)
        assert limits[2] <= limits[12] < limits[24]

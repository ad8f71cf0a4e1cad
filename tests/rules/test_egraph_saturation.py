"""Bounded saturation: budgets per -O level, stop reasons, the back-off scheduler, the report, and an
explosive rule set that stops at its limit with bounded memory."""

from __future__ import annotations

import json
import resource

import numpy as np

from conftest import DATA
from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.frontend import load
from nxsat.interpreter import run_module
from nxsat.rules import optimize
from nxsat.rules.catalog import catalog
from nxsat.rules.checker import verify
from nxsat.rules.egraph import EGraph
from nxsat.rules.extract import extract
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
    assert r.level == 2 and r.sets == ("generic",) and r.stop_reason
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
    assert "(time per rule is measured" not in r.format()


def test_levels_give_growing_budgets_on_a_model():
    m = load(DATA / "jax" / "transformer_layer.hlo")
    r1, r2 = optimize(m, level=1).report, optimize(m, level=2).report
    assert r1.budget.iterations < r2.budget.iterations
    assert not any(n in r1.matches for n in ("add-commute", "multiply-associate"))
    assert any(n in r2.matches for n in ("add-commute", "multiply-commute"))

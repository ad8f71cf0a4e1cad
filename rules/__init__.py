"""Equality saturation: IR graphs into an egglog e-graph, declarative rules, bounded saturation,
extraction back to IR, rule checking and equivalence checking.

Where things are: the term language (terms.py), rule files and configuration (catalog.py,
config.toml, prelude.egg, analysis.egg, sets/*.egg), the engine (egraph.py), the saturation loop
and its report (saturate.py), constant folding (fold.py), chosen nodes back to IR (extract.py; the
extractors that choose them are in extract/), the rule
checker (checker.py, with random instances from instances.py) and equivalence checking
(equiv.py). docs/rules.md is the guide.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nxsat.ir import Module

if TYPE_CHECKING:
    from nxsat.rules.catalog import Catalog
    from nxsat.rules.egraph import EGraph, Loaded
    from nxsat.rules.saturate import Report


@dataclass
class Saturated:
    """A saturated e-graph and what loading recorded: what the compile driver hands an extractor."""

    egraph: EGraph
    loaded: Loaded
    report: Report


def saturate_module(module: Module, model_type: str | None = None, level: int = 2, allow_approximate: bool = False,
                    canonical: bool = False, cat: Catalog | None = None, extra_sets: Sequence[str] = (),
                    time_rules: bool = False, without: Collection[str] = ()) -> Saturated:
    """Load ``module`` (canonicalized unless ``canonical``) and saturate it with the model type's rules at
    ``level`` (plus the sets ``extra_sets`` of ``cat``, less the rules named in ``without``: what a rule
    buys is measured by leaving it out); ``time_rules`` measures each rule's time (each rule runs as its
    own step: slower). Extraction is the caller's (rules/ never imports extract/)."""
    from nxsat.rules.catalog import catalog
    from nxsat.rules.egraph import EGraph
    from nxsat.rules.saturate import Budget, saturate

    if not canonical:
        from nxsat.passes import canonicalize

        module = canonicalize(module)
    cat = cat or catalog()
    rules = cat.select(model_type, level, allow_approximate)
    for r in cat.set_rules(extra_sets):
        if r not in rules and (allow_approximate or r.tag != "approximate"):
            rules.append(r)
    left_out = {r.name for r in cat.find(without)}  # an unknown name is an error, not a no-op
    rules = [r for r in rules if r.name not in left_out]
    eg = EGraph(rules, cat)
    t0 = time.perf_counter()
    loaded = eg.load(module)
    load_seconds = time.perf_counter() - t0
    initial = eg.sizes()
    budget = Budget.for_model(cat, level, initial.nodes, time_rules=time_rules)
    report = saturate(eg, budget, initial=initial)
    report.load_seconds = load_seconds
    report.cse_merged = loaded.cse_merged
    report.level = level
    report.sets = tuple(dict.fromkeys((*cat.sets_for(model_type), *extra_sets)))
    return Saturated(eg, loaded, report)


__all__ = ["Saturated", "saturate_module"]

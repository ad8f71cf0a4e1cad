"""Extraction: which equivalent program to take out of a saturated e-graph.

- cost.py prices every e-node in nanoseconds on the target (the device cost model), from the tiling
  plans (plan.py) the backend emits;
- greedy.py has the tree-cost and DAG-aware greedy extractors, ilp.py the exact one (HiGHS);
- smallest.py the smallest-term extractor (e-classes counted, no device), the rule tooling's.

:func:`extract` runs one of them by name (``--extractor``; each -O level has a default,
:data:`LEVEL_EXTRACTOR`). ``optimize`` is saturation and extraction in one call, the path of the
rule tooling and the tests; the compile driver runs the two stages itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nxsat.ir import Module

if TYPE_CHECKING:
    from nxsat.extract.cost import CostModel
    from nxsat.extract.ilp import IlpResult
    from nxsat.rules.catalog import Catalog
    from nxsat.rules.egraph import EGraph, Loaded
    from nxsat.rules.saturate import Report

EXTRACTORS = ("greedy", "dag", "ilp", "smallest")
LEVEL_EXTRACTOR = {1: "greedy", 2: "dag", 3: "ilp"}
ILP_SECONDS = 60.0  # the exact extractor's time limit before it settles for the greedy choice
# What an operator the input program does not have must save before the extractors take it: the cost
# model's own error bound (tests/extract/test_cost_model.py holds it to 15% per operator). Below that a
# "gain" is as likely the model's error: BERT's attention, extracted on bare prices, took a P.V product
# the model found 1.5 us cheaper that the simulator runs 5 us slower (the layout it leaves the output
# projection is not a price of the product itself); ResNet-50's channels-first regions, their batch norms
# reassociated at bare prices, ran 8% slower (a shift added to the residual before the convolution's
# result: a pass of its own, where the model sees an epilogue). Exempt are the variants that are the
# input's own operators priced by the same formulas: a dot's precision variants, every convolution (each
# layout of one is priced by the same conv plan) and the channels-first twin of a loaded operator (the
# layout set's: the same operator on the twins of its operands). With the margin on those twins every
# elementwise operator of a region paid 15% of its whole price, and no region of resnet_small was flipped.
CONFIDENCE = 0.15


@dataclass
class Extraction:
    """What an extractor chose and what it costs (the compile report's ``extraction``)."""

    module: Module
    extractor: str
    cost_ns: float  # the cost model's price of the chosen program (each e-class paid once; no CONFIDENCE)
    input_cost_ns: float  # the same model's price of the program the e-graph was loaded with
    seconds: float
    nodes: int  # e-nodes and e-classes the extractor chose from
    classes: int
    ilp: IlpResult | None = None
    kept_input: bool = False  # the extractor's choice cost no less than the loaded program (cast as the
    # policy would under precision by cost), which was kept (improved a class at a time but for the ILP)
    objective_ns: float = 0.0  # what the extractors minimise: the price with CONFIDENCE on new nodes
    # every dot and convolution offered in two precisions: which one was chosen, and both prices (us)
    casts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        def us(ns: float) -> float | None:
            return round(ns / 1000, 3) if math.isfinite(ns) else None

        out: dict[str, Any] = {"extractor": self.extractor, "cost_us": us(self.cost_ns),
                               "input_cost_us": us(self.input_cost_ns),
                               "seconds": round(self.seconds, 3), "enodes": self.nodes, "eclasses": self.classes,
                               "kept_input": self.kept_input}
        if self.ilp is not None:
            out["ilp"] = self.ilp.to_json()
        if self.casts:
            out["casts"] = self.casts
        return out


def extract(eg: EGraph, loaded: Loaded, extractor: str, model: CostModel, ilp_seconds: float = ILP_SECONDS
            ) -> Extraction:
    """The program ``extractor`` chooses from the e-graph, priced by ``model``."""
    from nxsat.extract.cost import node_costs
    from nxsat.extract.greedy import dag, dag_cost, improve, tree
    from nxsat.extract.ilp import ilp
    from nxsat.extract.layout import into_channels_first, labels, margined
    from nxsat.extract.smallest import choose
    from nxsat.rules.extract import build_module, original_nodes

    t0 = time.perf_counter()
    view = eg.view()
    originals = original_nodes(view, loaded)
    preferred = frozenset(originals)
    prices = node_costs(eg, view, model)
    # what the extractors minimise: a node the input does not have pays the model's error bound on top
    variants = _precision_variants(view, preferred)
    margins = margined(view, preferred, variants)
    costs = [p * (1 + CONFIDENCE) if m else p for p, m in zip(prices, margins)]
    for i in into_channels_first(view, preferred):
        costs[i] = math.inf
    root = view.handles[loaded.root]
    result = None
    if extractor == "greedy":
        best = tree(view, costs, preferred)
    elif extractor == "dag":
        best = dag(view, costs, root, preferred)
    elif extractor == "ilp":
        result = ilp(view, costs, root, preferred, ilp_seconds)
        best = result.best
    elif extractor == "smallest":
        best = choose(view, preferred)
    else:
        raise ValueError(f"unknown extractor {extractor!r}")
    input_best = _input_choice(view, originals)
    # the input program, with every dot and convolution in the narrow type where the precision rules
    # offered one (what the policy would make of it): the baseline no extractor may do worse than
    baseline = _cast_input_choice(view, input_best, variants) if variants else input_best
    objective, input_objective = dag_cost(view, best, root, costs), dag_cost(view, baseline, root, costs)
    kept_input = extractor != "smallest" and input_objective <= objective and best != baseline
    if kept_input:  # a greedy misjudgement (tree costs on a shared subterm): never worse than the input,
        # and the input improved a class at a time, as the greedy's own choice is (its reshapes tidied: on
        # unet_diffusers the bare input simulated 287.0 us where the greedy's choice without layout rules
        # ran 286.6, the policy's program)
        best = improve(view, costs, baseline, root) if extractor != "ilp" else baseline
        objective = dag_cost(view, best, root, costs)
    named = labels(view, best, originals)
    module = build_module(eg, loaded, view, best, originals, named)
    casts = _precision_choices(view, best, root, prices, originals)
    return Extraction(module, extractor, dag_cost(view, best, root, prices), dag_cost(view, input_best, root, prices),
                      time.perf_counter() - t0, view.term_nodes(), view.term_classes(), result, kept_input,
                      objective, casts)


_TENSOR_CTORS = ("Dot", "Convolution")


def _precision_variants(view: Any, preferred: frozenset[int]) -> set[int]:
    """The dots (and convolutions) the precision rules added beside a loaded one: the same product of
    the same operands, each cast to a narrower type. Both are priced by the same plan, so the model's
    error is common to them and such a variant pays no :data:`CONFIDENCE` margin (with it, BERT-base kept
    its 12 attention-score products in fp32, priced 1% dearer, and ran 3% slower than with all of them
    cast)."""
    out: set[int] = set()
    for nodes in view.class_nodes:
        loaded = [view.nodes[i].children for i in nodes if i in preferred and view.nodes[i].ctor in _TENSOR_CTORS]
        if not loaded:
            continue
        for i in nodes:
            node = view.nodes[i]
            if node.ctor not in _TENSOR_CTORS or i in preferred:
                continue
            casts = [{view.nodes[j].children[0] for j in view.class_nodes[k] if view.nodes[j].ctor == "Convert"}
                     for k in node.children]
            if any(all(src in cast for src, cast in zip(kids, casts)) for kids in loaded):
                out.add(i)
    return out


def _precision_choices(view: Any, best: list[int], root: int, prices: list[float],
                       originals: dict[int, Any]) -> list[dict[str, Any]]:
    """Per dot or convolution of the chosen program that the precision rules offered in a narrower type:
    the type its operands were chosen in and the price of each variant (a variant's casts, absorbed by
    the operation, are in its price)."""
    from nxsat.extract.greedy import reachable

    out = []
    for c in reachable(view, best, root) or ():
        dots = [i for i in view.class_nodes[c] if view.nodes[i].ctor in _TENSOR_CTORS]
        by_type: dict[str, int] = {}
        for i in dots:
            t = view.dtype.get(view.nodes[i].children[0], "")
            if t not in by_type or prices[i] < prices[by_type[t]]:
                by_type[t] = i
        if len(by_type) < 2:
            continue
        chosen = best[c]
        name = next((originals[i].name for i in view.class_nodes[c] if i in originals), f"class{c}")
        out.append({"op": name, "chosen": view.dtype.get(view.nodes[chosen].children[0], "") if chosen in dots
                    else view.nodes[chosen].ctor, **{f"{t}_us": round(prices[i] / 1000, 3) for t, i in
                                                       sorted(by_type.items())}})
    return sorted(out, key=lambda d: d["op"])


def _cast_input_choice(view: Any, input_best: list[int], variants: set[int]) -> list[int]:
    """The input choice with each loaded dot or convolution replaced by its precision variant (its casts
    chosen too). On unet_diffusers the DAG greedy's own choice cost 0.05% more than this by its model and
    simulated 0.5% slower than the policy's program (one convolution computed in both layouts)."""
    best = list(input_best)
    for i in sorted(variants):
        c = view.node_class[i]
        if view.nodes[best[c]].ctor not in _TENSOR_CTORS:
            continue
        best[c] = i
        for k in view.nodes[i].children:
            casts = [j for j in view.class_nodes[k] if view.nodes[j].ctor == "Convert"]
            if best[k] < 0 or view.nodes[best[k]].ctor != "Convert" and casts:
                best[k] = casts[0] if casts else best[k]
    return best


def _input_choice(view: Any, originals: dict[int, Any]) -> list[int]:
    """The choice that rebuilds the loaded program (its nodes; list cells as they were loaded)."""
    best = [-1] * view.n_classes
    for i in originals:
        c = view.node_class[i]
        if best[c] < 0:
            best[c] = i
    for c, is_list in enumerate(view.class_is_list):
        if is_list and best[c] < 0:
            best[c] = view.class_nodes[c][0]
    return best


@dataclass
class Optimized:
    module: Module
    report: Report


def optimize(module: Module, model_type: str | None = None, level: int = 2, allow_approximate: bool = False,
             canonical: bool = False, cat: Catalog | None = None, extra_sets: Sequence[str] = (),
             time_rules: bool = False) -> Optimized:
    """Saturate (:func:`nxsat.rules.saturate_module`) and extract the smallest equivalent program."""
    from nxsat.extract.smallest import extract as smallest
    from nxsat.rules import saturate_module

    sat = saturate_module(module, model_type, level, allow_approximate, canonical, cat, extra_sets, time_rules)
    return Optimized(smallest(sat.egraph, sat.loaded), sat.report)


__all__ = ["EXTRACTORS", "LEVEL_EXTRACTOR", "Extraction", "Optimized", "extract", "optimize"]

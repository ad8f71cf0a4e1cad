"""The smallest-term extractor: the smallest program in the e-graph, back as IR.

"Smallest" counts e-classes of the extracted DAG, so a subterm shared by several users costs
once: the DAG greedy of greedy.py with every operator costing one. Ties go to the node the graph was
loaded with, so an e-graph that found nothing better gives the input back unchanged, names and
locations included. It is the rule tooling's extractor (and `--extractor smallest`); compiling
extracts by the device cost model (docs/extraction.md).
"""

from __future__ import annotations

from nxsat.extract.greedy import dag
from nxsat.ir import Module
from nxsat.rules.egraph import EGraph, Loaded, View
from nxsat.rules.extract import build_module, original_nodes


def choose(view: View, preferred: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """The best node of every class (-1 where a class has no finite term): the DAG greedy
    (:func:`nxsat.extract.greedy.dag`) with every operator costing one and list cells nothing."""
    costs = [0.0 if view.class_is_list[c] else 1.0 for c in view.node_class]
    return dag(view, costs, None, preferred)


def extract(eg: EGraph, loaded: Loaded, view: View | None = None, best: list[int] | None = None) -> Module:
    """The smallest equivalent of ``loaded``'s module, as a new Module."""
    view = view or eg.view(analyses=False)
    originals = original_nodes(view, loaded)
    if best is None:
        best = choose(view, frozenset(originals))
    return build_module(eg, loaded, view, best, originals)


__all__ = ["choose", "extract"]

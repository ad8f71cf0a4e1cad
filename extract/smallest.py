"""The smallest-term extractor: the smallest program in the e-graph, back as IR.

"Smallest" counts e-classes of the extracted DAG, so a subterm shared by several users costs
once (greedy DAG extraction: a node's cost is the size of the union of its children's class
sets plus itself; sets are Python integers used as bitsets). Ties go to the node the graph was
loaded with, so an e-graph that found nothing better gives the input back unchanged, names and
locations included. It is today's only extractor (`--extractor smallest`); the device-cost
extractors of the cost-model issue join it here.
"""

from __future__ import annotations

from collections import deque

from nxsat.ir import Module
from nxsat.rules.egraph import EGraph, Loaded, View
from nxsat.rules.extract import build_module, original_nodes

MAX_PASSES = 64  # re-evaluations per node before greedy extraction settles for what it has


def choose(view: View, preferred: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """The best node of every class (-1 where a class has no finite term)."""
    n_cls = view.n_classes
    parents: list[list[int]] = [[] for _ in range(n_cls)]
    for i, node in enumerate(view.nodes):
        for c in set(node.children):
            parents[c].append(i)
    term_mask = 0
    for c, is_list in enumerate(view.class_is_list):
        if not is_list:
            term_mask |= 1 << c
    best = [-1] * n_cls
    best_key: list[tuple[int, int, int] | None] = [None] * n_cls
    bits = [0] * n_cls
    evaluations = [0] * len(view.nodes)
    queue = deque(i for i, n in enumerate(view.nodes) if not n.children)
    queued = bytearray(len(view.nodes))
    for i in queue:
        queued[i] = 1
    while queue:
        i = queue.popleft()
        queued[i] = 0
        evaluations[i] += 1
        if evaluations[i] > MAX_PASSES:
            continue
        node = view.nodes[i]
        c = view.node_class[i]
        if any(best[k] < 0 for k in node.children):
            continue
        b = 0
        for k in node.children:
            b |= bits[k]
        if b >> c & 1:
            continue  # the node needs its own class: a cycle
        b |= 1 << c
        key = ((b & term_mask).bit_count(), 0 if i in preferred else 1, i)
        old = best_key[c]
        if old is None or key < old or (best[c] == i and b != bits[c]):
            best[c], best_key[c], bits[c] = i, key, b
            for p in parents[c]:
                if not queued[p]:
                    queued[p] = 1
                    queue.append(p)
    return best


def extract(eg: EGraph, loaded: Loaded, view: View | None = None, best: list[int] | None = None) -> Module:
    """The smallest equivalent of ``loaded``'s module, as a new Module."""
    view = view or eg.view(analyses=False)
    originals = original_nodes(view, loaded)
    if best is None:
        best = choose(view, frozenset(originals))
    return build_module(eg, loaded, view, best, originals)


__all__ = ["choose", "extract"]

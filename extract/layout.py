"""The layout set's channels-first twins (rules/sets/layout.egg) as the extractors see them.

The layout set gives each channels-last convolution a twin written channels-first and carries twins
through the operators computed from it: the original class holds ``transpose(twin, [0, 2, ..., 1])``.
Three things about those twins are decided here, from the e-graph alone:

- which new e-nodes pay the extraction's confidence margin (:func:`margined`): a twin of a loaded node
  is the input's own operator in another layout, priced by the same formulas, and pays none (so do the
  bias, scale and cast carried into a swapped dot's orientation by the layout set's transpose-* rules,
  and the swapped dot itself where they read it);
- which are never extracted (:func:`into_channels_first`): a twin is computed from its operands' twins
  or not at all;
- whose name and line a chosen node takes (:func:`labels`), so profiles still point at the model.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any


def channels_last(r: int) -> tuple[int, ...]:
    """The transpose that shows a channels-first value of rank ``r`` channels-last: [0, 2, ..., r-1, 1]."""
    return (0, *range(2, r), 1)


def channels_first(r: int) -> tuple[int, ...]:
    """Its inverse, [0, r-1, 1, ..., r-2] (a channels-last convolution's output labels)."""
    return (0, r - 1, *range(1, r - 1))


def margined(view: Any, preferred: frozenset[int], variants: set[int]) -> list[bool]:
    """Per e-node: does it pay the confidence margin (:data:`nxsat.extract.CONFIDENCE`) when choosing? Every
    new node does but a precision variant, a convolution and a channels-first twin of a loaded node."""
    from nxsat.rules import terms

    exempt = set(preferred) | variants | set(_layout_twins(view, preferred))
    return [i not in exempt and node.ctor in terms.BY_CTOR and terms.BY_CTOR[node.ctor].op != "convolution"
            for i, node in enumerate(view.nodes)]


def into_channels_first(view: Any, preferred: frozenset[int]) -> list[int]:
    """The transposes into channels-first order the layout set made (the other operand of an elementwise
    operator seen channels-first): not for extraction. A channels-first twin is computed natively from
    its operands' twins or not at all, as a region is flipped whole or not at all; a transpose that
    moves a channels-last value into channels-first order is a pass reading one element per descriptor.
    Available, they gave a value and its twin transposes of each other, whose alternating halves made
    the ILP's relaxation worthless (resnet_small: 30 s to prove what the DAG greedy found, 60 s and no
    proof on ResNet-50); an operand that has no twin (a broadcast becomes one) leaves its reader's twin
    without a term, and the region as written."""
    out = []
    for i, node in enumerate(view.nodes):
        if node.ctor == "Transpose" and i not in preferred:
            p = tuple(node.slots[0])
            if len(p) >= 3 and p == channels_first(len(p)):
                out.append(i)
    return out


# Operators whose attributes the layout set permutes with the dimensions (their twins' slots differ).
_PERMUTED_SLOTS = frozenset({"Pad", "ReduceWindow", "Reduce", "Broadcast", "Fill"})


def labels(view: Any, best: list[int], originals: dict[int, Any]) -> dict[int, Any]:
    """The IR node whose name and line a chosen node the input does not have takes: its class's loaded
    node (a precision variant, a convolution reading its input as it lies), or that of the class holding
    its class's channels-last view (a channels-first twin), so the profile still points at the model."""
    loaded_of = {view.node_class[i]: n for i, n in originals.items()}
    for a, bs in _channels_last_views(view)[0].items():
        for b in bs:
            if a in loaded_of:
                loaded_of.setdefault(b, loaded_of[a])
    return {best[c]: loaded_of[c] for c in range(view.n_classes)
            if best[c] >= 0 and best[c] not in originals and c in loaded_of}


def _channels_last_views(view: Any) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """Per class, the classes of which it holds a channels-last view, and those it holds a channels-first
    view of (the layout set's transposes)."""
    views: dict[int, set[int]] = {}
    seen_cf: dict[int, set[int]] = {}
    for i, node in enumerate(view.nodes):
        if node.ctor != "Transpose" or not node.children:
            continue
        p = tuple(node.slots[0])
        if len(p) < 3:
            continue
        if p == channels_last(len(p)):
            views.setdefault(view.node_class[i], set()).add(node.children[0])
        elif p == channels_first(len(p)):
            seen_cf.setdefault(view.node_class[i], set()).add(node.children[0])
    return views, seen_cf


def _layout_twins(view: Any, preferred: Collection[int]) -> dict[int, int]:
    """The twins of loaded e-nodes in another orientation, each with the loaded node it is the twin of: a
    node of the operator of a loaded node L, in a class B whose transpose is in L's class, each of whose
    operands is L's operand, its twin (L's operand class holds a transpose of it), its channels-first view
    (it holds L's operand seen channels-first) or the same value broadcast into the other orientation. A
    dot's twin is its swap (the operands traded, their dimension numbers with them), where it is a product
    of matrices and a twin reads it."""
    _, seen_cf = _channels_last_views(view)
    views: dict[int, set[int]] = {}  # per class, the classes it holds a transpose of
    spread: dict[int, set[int]] = {}  # per class, the values it holds broadcasts of
    for i, node in enumerate(view.nodes):
        if node.ctor == "Transpose" and node.children and len(node.slots[0]) >= 2:
            views.setdefault(view.node_class[i], set()).add(node.children[0])
        elif node.ctor == "Broadcast" and node.children:
            spread.setdefault(view.node_class[i], set()).add(node.children[0])

    def same(c: int, lc: int) -> bool:
        return c == lc or c in views.get(lc, ()) or lc in seen_cf.get(c, ()) \
            or bool(spread.get(c, set()) & spread.get(lc, set()))

    out: dict[int, int] = {}
    for i in preferred:
        loaded = view.nodes[i]
        for b in views.get(view.node_class[i], ()):
            for j in view.class_nodes[b]:
                n = view.nodes[j]
                if n.ctor != loaded.ctor or len(n.children) != len(loaded.children):
                    continue
                kids = loaded.children
                if n.ctor == "Dot":
                    if _vector_product(view, j):
                        continue
                    kids = (kids[1], kids[0], *kids[2:])  # dot(b, a): the swap
                elif n.ctor not in _PERMUTED_SLOTS and n.slots != loaded.slots:
                    continue
                if all(same(c, lc) for c, lc in zip(n.children, kids)):
                    out.setdefault(j, i)
    # A swapped dot is a twin only where an operator carried into its orientation reads it (its bias, its
    # scale): the orientation then reaches the next dot through those twins. Read only through the
    # transpose back, it is the loaded dot's result in another layout, which the reader's price does not
    # see: BERT's P.V product swapped on bare prices, 1.5 us cheaper by the model, ran 5 us slower a layer
    # and made BERT-2 -O1 333.7 -> 380.1 us.
    carried = {c for j, i in out.items() if view.nodes[j].ctor != "Dot" for c in view.nodes[j].children}
    return {j: i for j, i in out.items() if view.nodes[j].ctor != "Dot" or view.node_class[j] in carried}


def _vector_product(view: Any, i: int) -> bool:
    """Is dot e-node ``i`` a matrix-vector product (one operand without free elements: one token, one
    column)? Its swap leaves a single row or column on the partitions, a layout its elementwise readers
    (a bias, a layer norm) cannot take as it lies, which a dot's local price does not see: gpt_decoder's
    one-token projections swapped on bare prices ran 80.2 -> 95.8 us at -O1."""
    node = view.nodes[i]
    lc, rc, lb, rb = (tuple(x) for x in node.slots[:4])
    for k, (c, b) in zip(node.children[:2], ((lc, lb), (rc, rb))):
        shape = view.shape.get(k)
        if shape is None or math.prod(n for d, n in enumerate(shape) if d not in c and d not in b) <= 1:
            return True
    return False

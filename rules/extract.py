"""Simple extraction: the smallest program in the e-graph, back as IR.

"Smallest" counts e-classes of the extracted DAG, so a subterm shared by several users costs
once (greedy DAG extraction: a node's cost is the size of the union of its children's class
sets plus itself; sets are Python integers used as bitsets). Ties go to the node the graph was
loaded with, so an e-graph that found nothing better gives the input back unchanged, names and
locations included. The device-cost extractor lives in extract/; this one exists so every stage
and test can run the e-graph's contents.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from nxsat import dtypes as dt
from nxsat.builder import infer_type
from nxsat.diagnostics import NxsatError, error
from nxsat.ir import Computation, Module, Node, TensorType
from nxsat.rules import terms
from nxsat.rules.egraph import EGraph, ENode, Loaded, View, splat_array

MAX_PASSES = 64  # re-evaluations per node before greedy extraction settles for what it has


def original_nodes(view: View, loaded: Loaded) -> dict[int, Node]:
    """View node index -> the IR node it was loaded from."""
    index = {(n.ctor, n.children, n.slots): i for i, n in enumerate(view.nodes)}
    out: dict[int, Node] = {}
    for lid, (ctor, fixed, variadic, slots) in loaded.encodings.items():
        node = loaded.nodes[lid]
        kids = [view.handles[loaded.ids[o.id]] for o in node.operands[:fixed]]
        if variadic:
            kids.append(view.list_handles[(lid, 0)])
        i = index.get((ctor, tuple(kids), tuple(slots)))
        if i is not None and i not in out:
            out[i] = node
    return out


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


def build_module(eg: EGraph, loaded: Loaded, view: View, best: list[int],
                 originals: dict[int, Node] | None = None) -> Module:
    """IR for the chosen nodes, from the module's root class down."""
    originals = originals if originals is not None else original_nodes(view, loaded)
    src = loaded.module
    params = [Node("parameter", (), dict(p.attrs), p.type, p.name, p.loc) for p in src.entry.params]
    by_index = {int(p.attrs["index"]): p for p in params}
    built: dict[int, Node] = {}
    list_items: dict[int, list[int]] = {}
    open_: set[int] = set()  # classes whose operands are being built: meeting one again is a cycle

    def children_of(c: int) -> list[int]:
        if best[c] < 0:
            raise error("NCC_IINT001", f"extraction: e-class {c} has no finite term")
        return list(view.nodes[best[c]].children)

    root = view.handles[loaded.root]
    stack: list[tuple[int, bool]] = [(root, False)]
    while stack:
        c, ready = stack.pop()
        if c in built or c in list_items:
            continue
        kids = children_of(c)
        if not ready:
            if c in open_:
                raise error("NCC_IINT001", f"extraction: the chosen terms form a cycle through e-class {c}",
                            hint="rerun with --debug and report it")
            open_.add(c)
            stack.append((c, True))
            for k in reversed(kids):
                if k not in built and k not in list_items:
                    stack.append((k, False))
            continue
        open_.discard(c)
        i = best[c]
        node = view.nodes[i]
        if view.class_is_list[c]:
            list_items[c] = [] if node.ctor == "TNil" else [node.children[0], *list_items[node.children[1]]]
            continue
        built[c] = _make(eg, node, [built[k] if not view.class_is_list[k] else None for k in node.children],
                         [list_items.get(k) for k in node.children], built, by_index, originals.get(i))
    comp = Computation(src.entry.name, params, built[root], None, src.entry.loc)
    out = Module(src.name, comp, attrs=dict(src.attrs), source=src.source, framework=src.framework)
    out.warnings.extend(src.warnings)
    return out


def _make(eg: EGraph, node: ENode, kids: list[Node | None], lists: list[list[int] | None], built: dict[int, Node],
          params: dict[int, Node], original: Node | None) -> Node:
    name = original.name if original is not None else ""
    loc = original.loc if original is not None else None
    ctor = node.ctor
    if ctor == "Parameter":
        p = params.get(node.slots[0])
        if p is None:
            raise error("NCC_IINT001", f"extraction: parameter {node.slots[0]} is not in this module")
        return p
    if ctor == "Constant":
        value, t = eg.constants[node.slots[0]]
        return Node("constant", (), {"value": value, "type": t}, t, name, loc)
    if ctor == "Fill":
        v, d, shape = node.slots
        dtype = dt.by_name(d)
        scalar = splat_array(v, dtype, ())
        st = TensorType(dtype, ())
        c = Node("constant", (), {"value": np.asarray(scalar), "type": st}, st)
        if not shape:
            return c
        t = TensorType(dtype, tuple(shape))
        return Node("broadcast", (c,), {"shape": tuple(shape), "dimensions": ()}, t, name, loc)
    if ctor == "Opaque":
        op, key = node.slots
        attrs = dict(eg.opaque[key][1])
        operands = [built[k] for k in (lists[0] or [])]
    else:
        term = terms.BY_CTOR[ctor]
        op = term.op
        attrs = term.decode(node.slots)
        if original is not None:
            attrs = {**{k: v for k, v in original.attrs.items() if k not in attrs}, **attrs}
        operands = [k for k in kids[:term.operands] if k is not None]
        if term.variadic:
            operands += [built[k] for k in (lists[term.operands] or [])]
    try:
        t = infer_type(op, operands, attrs)
    except NxsatError as exc:
        raise error("NCC_IINT001", f"extraction built an ill-typed {op}: {exc.message}",
                    hint="a rule is unsound; run nxsat rules check") from exc
    if original is not None and original.type != t:
        raise error("NCC_IINT001", f"extraction: {op} has type {t}, the graph's node {original.name} {original.type}",
                    hint="a rule is unsound; run nxsat rules check")
    return Node(op, operands, attrs, t, name, loc)


def extract_all(eg: EGraph) -> list[Module]:
    """Every loaded module, extracted from one shared view."""
    view = eg.view(analyses=False)
    prefer: set[int] = set()
    originals: list[dict[int, Node]] = []
    for ld in eg.loaded:
        o = original_nodes(view, ld)
        originals.append(o)
        prefer |= set(o)
    best = choose(view, frozenset(prefer))
    return [build_module(eg, ld, view, best, o) for ld, o in zip(eg.loaded, originals)]


__all__ = ["choose", "extract", "extract_all", "original_nodes"]

"""From an e-graph back to IR: the chosen node of every class built into a Module, with the names,
locations and types of the nodes the graph was loaded with. Which node each class gets is the
extractor's choice, in extract/ (rules/ never imports it)."""

from __future__ import annotations

import numpy as np

from nxsat import dtypes as dt
from nxsat.builder import infer_type
from nxsat.diagnostics import NxsatError, error
from nxsat.ir import Computation, Module, Node, TensorType
from nxsat.rules import terms
from nxsat.rules.egraph import EGraph, ENode, Loaded, View, operand_layout, splat_array


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


def build_module(eg: EGraph, loaded: Loaded, view: View, best: list[int],
                 originals: dict[int, Node] | None = None, named: dict[int, Node] | None = None) -> Module:
    """IR for the chosen nodes, from the module's root class down. ``named``: nodes that take another
    node's name and location only (a value computed in another layout, so the profile and the errors
    still point at the model's line)."""
    named = named or {}
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
                         [list_items.get(k) for k in node.children], built, by_index, originals.get(i),
                         named.get(i))
    comp = Computation(src.entry.name, params, built[root], None, src.entry.loc)
    out = Module(src.name, comp, attrs=dict(src.attrs), source=src.source, framework=src.framework)
    out.warnings.extend(src.warnings)
    return out


def _make(eg: EGraph, node: ENode, kids: list[Node | None], lists: list[list[int] | None], built: dict[int, Node],
          params: dict[int, Node], original: Node | None, named: Node | None = None) -> Node:
    label = original if original is not None else named
    name = label.name if label is not None else ""
    loc = label.loc if label is not None else None
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
    op, attrs = eg.operator(node)
    fixed, variadic = operand_layout(node)
    if original is not None and ctor != "Opaque":  # attributes the term language does not carry
        attrs = {**{k: v for k, v in original.attrs.items() if k not in attrs}, **attrs}
        if "to_apply" in attrs and _same_slots(ctor, original.attrs, node.slots):
            attrs["to_apply"] = original.attrs["to_apply"]  # the model's own reduction body, not the canonical one
    operands = [k for k in kids[:fixed] if k is not None]
    if variadic:
        operands += [built[k] for k in (lists[fixed] or [])]
    try:
        t = infer_type(op, operands, attrs)
    except NxsatError as exc:
        raise error("NCC_IINT001", f"extraction built an ill-typed {op}: {exc.message}",
                    hint="a rule is unsound; run nxsat rules check") from exc
    if original is not None and original.type != t:
        raise error("NCC_IINT001", f"extraction: {op} has type {t}, the graph's node {original.name} {original.type}",
                    hint="a rule is unsound; run nxsat rules check")
    return Node(op, operands, attrs, t, name, loc)


def _same_slots(ctor: str, attrs: dict, slots: tuple) -> bool:
    """Do ``attrs`` spell the e-node's attribute slots (so the original node's values may stand for them)?"""
    try:
        return tuple(terms.BY_CTOR[ctor].encode(attrs)) == tuple(slots)
    except terms.NotRepresentable:
        return False


__all__ = ["build_module", "original_nodes"]

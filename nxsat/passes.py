"""Graph passes that run before the e-graph: each is a named step with a contract.

``canonicalize`` = inline-calls -> if-convert -> unroll-loops -> inline-maps. Its contract: the
result computes the same values; its entry computation (and every body it refers to) has no
``call``, ``fusion`` or ``conditional``; a ``map`` remains only where its computation is not
elementwise; a ``while`` remains only where the trip count is not static or unrolling would
exceed the budget; ``get-tuple-element`` of a ``tuple`` is forwarded; dead nodes are gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import Interpreter
from nxsat.ir import Computation, Module, Node, TensorType, TupleType, Type, subcomputations

# Unroll a static loop only while the unrolled body stays below this many nodes in total.
UNROLL_NODE_BUDGET = 100_000
UNROLL_MAX_TRIPS = 4096


@dataclass(frozen=True)
class Pass:
    name: str
    contract: str
    run: Callable[[Module], Module]


def _node(op: str, operands: list[Node], attrs: dict[str, Any], t: Type, like: Node | None = None,
          name: str = "") -> Node:
    """A node whose type is already known (the rewrites here preserve types by construction)."""
    if op == "get-tuple-element" and operands[0].op == "tuple":
        return operands[0].operands[attrs["index"]]
    return Node(op, operands, attrs, t, name or (like.name if like else ""), like.loc if like else None)


class Rewriter:
    """Rebuilds computations bottom-up; ``expand`` decides what a node becomes."""

    def __init__(self, expand: Callable[[Rewriter, Node, list[Node], dict[str, Any]], Node | None]) -> None:
        self.expand = expand
        self.memo: dict[int, Computation] = {}

    def computation(self, comp: Computation) -> Computation:
        key = id(comp)
        if key not in self.memo:
            params = [Node("parameter", (), dict(p.attrs), p.type, p.name, p.loc) for p in comp.params]
            root = self.apply(comp, params)
            self.memo[key] = Computation(comp.name, params, root, None, comp.loc)
        return self.memo[key]

    def apply(self, comp: Computation, args: list[Node]) -> Node:
        """Rewrite ``comp``'s body with its parameters bound to ``args``; returns the new root."""
        mapping: dict[int, Node] = {p.id: a for p, a in zip(comp.params, args)}
        for node in comp.post_order():
            if node.id in mapping:
                continue
            ops = [mapping[o.id] for o in node.operands]
            attrs = {k: self._attr(v) for k, v in node.attrs.items()}
            new = self.expand(self, node, ops, attrs)
            mapping[node.id] = new if new is not None else _node(node.op, ops, attrs, node.type, node)
        return mapping[comp.root.id]

    def _attr(self, v: Any) -> Any:
        if isinstance(v, Computation):
            return self.computation(v)
        if isinstance(v, tuple) and v and isinstance(v[0], Computation):
            return tuple(self.computation(c) for c in v)
        return v


def rewrite_module(module: Module, expand: Callable[..., Node | None]) -> Module:
    """``module`` rebuilt bottom-up, each node replaced by what ``expand(rw, node, operands, attrs)``
    returns (None: the node itself, on the rewritten operands)."""
    rw = Rewriter(expand)
    entry = rw.computation(module.entry)
    out = Module(module.name, entry, attrs=dict(module.attrs), source=module.source, framework=module.framework)
    out.warnings.extend(module.warnings)
    return out


# --- inline-calls ----------------------------------------------------------------------------

def _inline(rw: Rewriter, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
    if node.op in ("call", "fusion"):
        return rw.apply(attrs["to_apply"], ops)
    return None


def inline_calls(module: Module) -> Module:
    """Replace every call and fusion by a copy of its callee's body."""
    return rewrite_module(module, _inline)


# --- if-convert ------------------------------------------------------------------------------

def _select_values(pred: Node, a: Node, b: Node, like: Node) -> Node:
    """select(pred, a, b) for values of any (tuple) type, pred a pred[] scalar."""
    if isinstance(a.type, TupleType):
        parts = [_select_values(pred,
                                _node("get-tuple-element", [a], {"index": i}, e, like),
                                _node("get-tuple-element", [b], {"index": i}, e, like), like)
                 for i, e in enumerate(a.type.elements)]
        return _node("tuple", parts, {}, a.type, like)
    return _node("select", [pred, a, b], {}, a.type, like)


def _if_convert(rw: Rewriter, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
    if node.op in ("call", "fusion"):
        return rw.apply(attrs["to_apply"], ops)
    if node.op != "conditional":
        return None
    selector, *operands = ops
    branches: tuple[Computation, ...] = attrs["branches"]
    results = [rw.apply(b, [o]) for b, o in zip(branches, operands)]
    if selector.tensor.dtype is dt.PRED:
        return _select_values(selector, results[0], results[1], node)
    acc = results[-1]  # XLA: an out-of-range index runs the last branch
    for i in range(len(results) - 2, -1, -1):
        k = _node("constant", [], {"value": np.array(i, np.int32), "type": TensorType(dt.S32, ())},
                  TensorType(dt.S32, ()), node)
        eq = _node("compare", [selector, k], {"direction": "EQ", "type": None}, TensorType(dt.PRED, ()), node)
        acc = _select_values(eq, results[i], acc, node)
    return acc


def if_convert(module: Module) -> Module:
    """Run every branch of a conditional and select the result (branches are side-effect free)."""
    return rewrite_module(module, _if_convert)


# --- unroll-loops ----------------------------------------------------------------------------

def static_trip_count(node: Node, limit: int = UNROLL_MAX_TRIPS) -> int | None:
    """The trip count of a while loop if it is known at compile time (else None).

    Known means: the condition reads only loop-state elements whose initial values are constants
    and whose updates in the body read only such elements and constants. Those elements are then
    iterated alone (with the reference interpreter) until the condition fails, at most ``limit``.
    """
    init = node.operands[0]
    cond: Computation = node.attrs["condition"]
    body: Computation = node.attrs["body"]
    if init.op != "tuple" or body.root.op != "tuple":
        return None
    needed = _state_reads(cond)
    if needed is None:
        return None
    closed: set[int] = set()
    pending = list(needed)
    while pending:
        k = pending.pop()
        if k in closed:
            continue
        closed.add(k)
        reads = _cone_reads(body, body.root.operands[k])
        if reads is None:
            return None
        pending.extend(reads - closed)
    values: dict[int, np.ndarray] = {}
    for k in closed:
        src = init.operands[k]
        if src.op != "constant" or src.attrs.get("value") is None:
            return None
        values[k] = src.attrs["value"]
    interp = Interpreter()
    try:
        for trips in range(limit + 1):
            if not bool(_eval_cone(interp, cond, cond.root, values)):
                return trips
            values = {k: _eval_cone(interp, body, body.root.operands[k], values) for k in closed}
    except NxsatError:
        return None
    return None


def _state_reads(comp: Computation) -> set[int] | None:
    return _cone_reads(comp, comp.root)


def _cone_reads(comp: Computation, target: Node) -> set[int] | None:
    """Which state elements ``target`` reads (via get-tuple-element of the parameter); None if it
    reads the state any other way or reads anything that is not a constant."""
    (param,) = comp.params
    reads: set[int] = set()
    stack, seen = [target], set()
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        if n.op == "get-tuple-element" and n.operands[0] is param:
            reads.add(n.attrs["index"])
            continue
        if n is param or n.op in ("rng", "rng-bit-generator", "custom-call", "while"):
            return None
        stack.extend(n.operands)
    return reads


def _eval_cone(interp: Interpreter, comp: Computation, target: Node, state: dict[int, np.ndarray]) -> Any:
    """Evaluate ``target`` with the loop state's elements bound to ``state`` (nothing else runs)."""
    (param,) = comp.params
    results: dict[int, Any] = {}
    stack: list[tuple[Node, bool]] = [(target, False)]
    while stack:
        n, expanded = stack.pop()
        if n.id in results:
            continue
        if n.op == "get-tuple-element" and n.operands[0] is param:
            results[n.id] = state[n.attrs["index"]]
        elif not expanded:
            stack.append((n, True))
            stack.extend((o, False) for o in n.operands if o.id not in results)
        else:
            results[n.id] = interp.run_node(n, [results[o.id] for o in n.operands])
    return results[target.id]


def _unroll(rw: Rewriter, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
    if node.op in ("call", "fusion"):
        return rw.apply(attrs["to_apply"], ops)
    if node.op != "while":
        return None
    probe = Node("while", ops, attrs, node.type, node.name, node.loc)
    trips = static_trip_count(probe)
    if trips is None:
        return None
    body: Computation = attrs["body"]
    if trips * max(len(body.post_order()), 1) > UNROLL_NODE_BUDGET:
        return None
    state = ops[0]
    for _ in range(trips):
        state = rw.apply(body, [state])
    return state


def unroll_loops(module: Module) -> Module:
    """Unroll while loops whose trip count is static (within the node budget)."""
    return rewrite_module(module, _unroll)


# --- inline-maps -----------------------------------------------------------------------------

def _lift(body: Computation, args: list[Node], shape: tuple[int, ...], like: Node) -> Node | None:
    """``body`` (a computation on scalars) applied to whole tensors of ``shape``: each operator of it
    on tensors, each scalar constant broadcast. None when some operator is not elementwise."""
    from nxsat.ops.elementwise import ELEMENTWISE

    liftable = ELEMENTWISE | {"convert", "bitcast-convert"}
    out: dict[int, Node] = {p.id: a for p, a in zip(body.params, args)}
    for n in body.post_order():
        if n.id in out:
            continue
        if not isinstance(n.type, TensorType) or n.shape != ():
            return None
        t = n.tensor.with_shape(shape)
        if n.op == "constant" and n.attrs.get("value") is not None:
            out[n.id] = _node("broadcast", [n], {"dimensions": (), "shape": shape}, t, like, n.name)
        elif n.op in liftable and all(isinstance(o.type, TensorType) and o.shape == () for o in n.operands):
            attrs = {**n.attrs, "shape": shape} if "shape" in n.attrs else dict(n.attrs)
            out[n.id] = _node(n.op, [out[o.id] for o in n.operands], attrs, t, like, n.name)
        else:
            return None
    return out[body.root.id]


def _inline_map(rw: Rewriter, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
    if node.op != "map" or tuple(attrs.get("dimensions") or range(len(node.shape))) != tuple(range(len(node.shape))):
        return None
    return _lift(attrs["to_apply"], ops, node.shape, node)


def inline_maps(module: Module) -> Module:
    """A map whose computation is elementwise becomes that computation on whole tensors."""
    return rewrite_module(module, _inline_map)


def _canonical(rw: Rewriter, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
    if node.op in ("call", "fusion"):
        return rw.apply(attrs["to_apply"], ops)
    if node.op == "map":
        return _inline_map(rw, node, ops, attrs)
    if node.op == "conditional":
        return _if_convert(rw, node, ops, attrs)
    if node.op == "while":
        return _unroll(rw, node, ops, attrs)
    return None


PASSES: dict[str, Pass] = {p.name: p for p in (
    Pass("inline-calls", "no call or fusion remains; values unchanged", inline_calls),
    Pass("if-convert", "no conditional remains: every branch runs and select picks the result", if_convert),
    Pass("unroll-loops", "while loops with a static trip count become straight-line code", unroll_loops),
    Pass("inline-maps", "a map of an elementwise computation becomes it on whole tensors", inline_maps),
)}


def canonicalize(module: Module) -> Module:
    """All the passes in one rewrite (one traversal; each body is rewritten once)."""
    return rewrite_module(module, _canonical)


def has_control_flow(comp: Computation) -> bool:
    """True if ``comp`` or any body it refers to still has call, fusion or conditional."""
    seen: set[int] = set()
    stack = [comp]
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        for n in c.post_order():
            if n.op in ("call", "fusion", "conditional"):
                return True
            stack.extend(subcomputations(n))
    return False


def fill_elided_constants(module: Module, seed: int = 0) -> Module:
    """Constants the model text elided (``constant({...})``) get seeded random values, as XLA's own
    tools fill them to run a model dumped without its literals: floats from a standard normal,
    integers in [0, 16) (small and non-negative: they are often indices or shift counts), predicates
    at random. The values are meaningless; the model's cost is real. Deterministic per constant name
    and seed."""
    import zlib

    def value(node: Node) -> np.ndarray:
        t = node.tensor
        rng = np.random.default_rng([seed, zlib.crc32(node.name.encode())])
        if t.dtype.is_float:
            return dt.cast(rng.standard_normal(t.shape).astype(np.float32), t.dtype)
        if t.dtype.is_pred:
            return rng.integers(0, 2, t.shape).astype(bool)
        return rng.integers(0, 16, t.shape).astype(t.dtype.np)

    def expand(rw: Rewriter, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
        if node.op == "constant" and attrs.get("value") is None and isinstance(node.type, TensorType):
            return Node("constant", (), dict(attrs, value=value(node)), node.type, node.name, node.loc)
        return None

    return rewrite_module(module, expand)

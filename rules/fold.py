"""Constant folding, the built-in rule ``constant-fold``: an operator whose operands are all small
constants is evaluated with the reference implementation and its e-class gains the result.

It runs on the host between rewrite iterations because egglog cannot run nxsat's numerics. The
e-class to extend is named by its own term (its operands are constants, which are terms), so no
handle is needed; a class that already holds a constant is skipped, which makes folding
idempotent. Limits (config.toml [fold]) keep it to small constants: the result and every input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nxsat.builder import infer_type
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import Interpreter
from nxsat.ir import Computation, Node, TensorType
from nxsat.ops import registry
from nxsat.rules import terms
from nxsat.rules.egraph import EGraph, ENode, call, lit, splat_text, uniform_value, vec_expr

# Operators folding never evaluates: control flow (could run long), effects and random numbers.
NO_FOLD = frozenset({"while", "call", "conditional", "map", "fusion", "custom-call", "rng", "rng-bit-generator",
                     "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                     "partition-id", "replica-id", "infeed", "outfeed", "opt-barrier", "parameter",
                     "tuple", "get-tuple-element"})
CONST_CTORS = ("Constant", "Fill", "Iota")


def _expr(eg: EGraph, node: ENode) -> Any:
    if node.ctor == "Constant":
        return call("Constant", lit(node.slots[0]))
    v, d, shape = node.slots
    return call("Fill", lit(v), lit(d), vec_expr(shape))


def fold(eg: EGraph, frozen: Any, max_elements: int, max_input_elements: int) -> int:
    """Fold every foldable e-node of the frozen e-graph; returns how many classes gained a constant.

    Only the rows that matter are decoded: constants first, then lists of constants, then the
    nodes whose operands are all among them."""
    funcs = frozen.functions
    const: dict[Any, tuple[ENode, TensorType]] = {}
    for name in ("Constant", "Fill"):
        fn = funcs.get(name)
        for row in fn.rows if fn is not None else ():
            node = ENode(name, (), eg.decode_slots(fn.input_sorts, row.inputs))
            t = eg.constant_type(node)
            if row.output not in const and t is not None:
                const[row.output] = (node, t)
    if not const:
        return 0
    lists: dict[Any, list[Any]] = {}
    nil, cons = funcs.get("TNil"), funcs.get("TCons")
    for row in nil.rows if nil is not None else ():
        lists[row.output] = []
    cells = [(r.inputs[0], r.inputs[1], r.output) for r in cons.rows] if cons is not None else []
    for _ in range(64):  # lists of constants, innermost cell first
        grew = False
        for head, tail, out in cells:
            if out not in lists and head in const and tail in lists:
                lists[out] = [head, *lists[tail]]
                grew = True
        if not grew:
            break
    folded: set[Any] = set()
    unions: list[tuple[Any, Any]] = []
    for name in sorted(terms.BY_CTOR):
        fn = funcs.get(name)
        if fn is None or name in ("Constant", "Fill", "Parameter"):
            continue
        sorts = fn.input_sorts
        for row in fn.rows:
            if row.output in const or row.output in folded:
                continue
            operands: list[Any] = []
            list_value = None
            ok = True
            for value, sort in zip(row.inputs, sorts):
                if sort == terms.T:
                    if value not in const:
                        ok = False
                        break
                    operands.append(value)
                elif sort == terms.TLIST:
                    if value not in lists:
                        ok = False
                        break
                    list_value = value
                    operands.extend(lists[value])
            if not ok:
                continue
            node = ENode(name, (), eg.decode_slots(sorts, row.inputs))
            result = _evaluate(eg, node, [const[k] for k in operands], max_elements, max_input_elements)
            if result is None:
                continue
            value, t = result
            u = uniform_value(value)
            # One value everywhere: a Fill (extracted as a broadcast scalar), not a dense literal.
            target = (call("Fill", lit(splat_text(u, t.dtype)), lit(t.dtype.name), vec_expr(t.shape))
                      if u is not None else call("Constant", lit(eg.constant_key(value, t))))
            kids = [_expr(eg, const[v][0]) for v, sort in zip(row.inputs, sorts) if sort == terms.T]
            if list_value is not None:
                lst = call("TNil")
                for k in reversed(lists[list_value]):
                    lst = call("TCons", _expr(eg, const[k][0]), lst)
                kids.append(lst)
            unions.append((eg.node_expr(node, kids), target))
            folded.add(row.output)
    eg.union(unions)
    return len(unions)


def _evaluate(eg: EGraph, node: ENode, inputs: list[tuple[ENode, TensorType]], max_elements: int,
              max_input_elements: int) -> tuple[np.ndarray, TensorType] | None:
    if any(t.size > max_input_elements for _n, t in inputs):
        return None
    op, attrs = eg.operator(node)
    opdef = registry.get(op)
    if not op or op in NO_FOLD or opdef is None or opdef.impl is None or opdef.status == registry.UNSUPPORTED:
        return None
    operands = [Node("constant", (), {"value": eg.constant_value(n), "type": t}, t) for n, t in inputs]
    try:
        t = infer_type(op, operands, attrs)
    except NxsatError:
        return None
    if not isinstance(t, TensorType) or t.size > max_elements or math.prod(t.shape) > max_elements:
        return None
    n = Node(op, operands, attrs, t)
    try:
        out = Interpreter().call(Computation("fold", [], n, [*operands, n]), [])
    except NxsatError:
        return None
    return np.asarray(out), t

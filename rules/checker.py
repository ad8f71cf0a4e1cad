"""``nxsat rules check``: is each rule sound? Tested by running it, not by reading it.

For a rule, the checker instantiates its left-hand side many times at random shapes, element
types and attributes (biased toward the values guards look for: identity permutations, inverse
transposes, slices inside a pad, constants 0 and 1, ...), loads the instances into an e-graph
together with the real analyses, runs that one rule once, and then checks the whole e-graph: every
e-node of every e-class, evaluated with the reference interpreter on random inputs, must give its
class's value and type. So the guard is egglog's own (instances where it is false simply do not
fire) and the right-hand side is what egglog really built. An unsound rule is reported with a
concrete counterexample: the instance, the inputs, and both results. A rule that never fired in
any instance is reported as untested.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.attrs import DotDims
from nxsat.builder import infer_type
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import Interpreter
from nxsat.ir import Computation, Module, Node, TupleType, Type
from nxsat.rules.catalog import APPROXIMATE, Catalog, Rule, catalog
from nxsat.rules.egraph import EGraph, ENode, View, operand_layout
from nxsat.rules.extract import original_nodes
from nxsat.rules.instances import RANGE_TRIAL, Reject, Untestable, instantiate, random_array, rule_patterns


@dataclass
class Counterexample:
    instance: str  # the left-hand side as instantiated
    rhs: str  # the e-node that disagrees
    inputs: dict[str, np.ndarray]
    expected: Any  # the class's value (left-hand side)
    got: Any  # the e-node's value, or a message when it is ill-typed
    why: str

    def format(self, limit: int = 12) -> str:
        lines = [f"    instance: {self.instance}", f"    rewrites to: {self.rhs}", f"    why: {self.why}"]
        for k, v in self.inputs.items():
            lines.append(f"    input {k}: {_short(v, limit)}")
        lines.append(f"    left-hand side gives:  {_short(self.expected, limit)}")
        lines.append(f"    right-hand side gives: {_short(self.got, limit)}")
        return "\n".join(lines)


@dataclass
class RuleResult:
    rule: Rule
    status: str  # "sound" | "unsound" | "untested" | "error" | "built-in"
    fired: int = 0  # instances in which the rule fired and every e-node agreed
    tried: int = 0
    types: list[str] = field(default_factory=list)  # instance signatures that fired
    counterexample: Counterexample | None = None
    message: str = ""

    def format(self) -> str:
        head = f"{self.rule.name:<28} {self.status:<9}"
        if self.status == "sound":
            kinds = ", ".join(self.types[:4]) + (", ..." if len(self.types) > 4 else "")
            return f"{head} fired in {self.fired} of {self.tried} instances ({kinds})"
        if self.status == "unsound":
            return f"{head} {self.message}\n{self.counterexample.format() if self.counterexample else ''}".rstrip()
        return f"{head} {self.message}"


def _short(v: Any, limit: int) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, tuple):
        return "(" + ", ".join(_short(x, limit) for x in v) + ")"
    a = np.asarray(v)
    name = dt.from_numpy(a.dtype).name if a.dtype in [d.np for d in dt.ALL] else str(a.dtype)
    flat = a.reshape(-1)
    body = np.array2string(flat[:limit].astype(np.float64) if a.dtype in (dt.BF16.np,) else flat[:limit],
                           precision=6, separator=", ", max_line_width=10**6)
    more = f" ... ({a.size} values)" if a.size > limit else ""
    return f"{name}{list(a.shape)} {body}{more}"


# --- tolerances -----------------------------------------------------------------------------------

_EPS = {dt.BF16.np: 2.0 ** -7, dt.F8E4M3FN.np: 2.0 ** -3, dt.F8E5M2.np: 2.0 ** -2}


def eps(d: np.dtype) -> float:
    """Machine epsilon of a float element type (ml_dtypes types included)."""
    return _EPS[d] if d in _EPS else float(np.finfo(d).eps)


def agree(expected: Any, got: Any, bound: float | None, scale: float) -> str | None:
    """None when equal (exact rules: within a few ulps of the magnitudes involved, as equal over the
    reals allows; approximate rules: within ``bound``); else what differs."""
    if isinstance(expected, tuple) or isinstance(got, tuple):
        if not (isinstance(expected, tuple) and isinstance(got, tuple)) or len(expected) != len(got):
            return "tuple structure differs"
        for i, (a, b) in enumerate(zip(expected, got)):
            why = agree(a, b, bound, scale)
            if why:
                return f"element {i}: {why}"
        return None
    a, b = np.asarray(expected), np.asarray(got)
    if a.shape != b.shape:
        return f"shape {list(b.shape)} instead of {list(a.shape)}"
    if a.dtype != b.dtype:
        return f"element type {b.dtype} instead of {a.dtype}"
    is_float = a.dtype.kind == "f" or a.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np)
    if not is_float:
        bad = a != b
        return f"{int(bad.sum())} of {a.size} values differ" if bad.any() else None
    x, y = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(x) | np.isnan(y)
    both_nan = np.isnan(x) & np.isnan(y)
    rel = bound if bound is not None else 8 * eps(a.dtype)
    with np.errstate(invalid="ignore"):  # an infinity is close only to itself
        close = (x == y) | (np.isfinite(x) & np.isfinite(y) & (np.abs(x - y) <= rel * (np.abs(x) + scale)))
    bad = (~close & ~nan) | (nan & ~both_nan)
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        return (f"{int(bad.sum())} of {a.size} values differ (first at flat index {i}: "
                f"{float(x.reshape(-1)[i]):.8g} vs {float(y.reshape(-1)[i]):.8g})")
    return None


# --- evaluation of single nodes ---------------------------------------------------------------------

def run_node(op: str, operand_types: Sequence[Type], attrs: dict[str, Any], values: Sequence[Any]) -> tuple[Any, Type]:
    """Infer the type of ``op`` and run it on ``values``; NxsatError when ill-typed."""
    params = [Node("parameter", (), {"index": i, "type": t}, t) for i, t in enumerate(operand_types)]
    t = infer_type(op, params, attrs)
    node = Node(op, params, attrs, t)
    out = Interpreter().call(Computation("check", params, node, [*params, node]), list(values))
    return out, t


# --- instance generation ------------------------------------------------------------------------------

@dataclass
class _Instance:
    roots: list[Node]
    params: list[Node]  # in the batch module: indices renumbered
    nodes: list[Node]
    signature: str


def _batch_module(instances: list[_Instance], first_param: int = 0) -> Module:
    """All instances side by side in one module, roots in one tuple. Parameters are renumbered from
    ``first_param``: batches loaded into one e-graph must not share a parameter (its e-node)."""
    params: list[Node] = []
    mapping: dict[int, Node] = {}
    roots: list[Node] = []
    for inst in instances:
        for node in inst.nodes:
            if node.op == "parameter":
                k = first_param + len(params)
                new = Node("parameter", (), {"index": k, "type": node.type}, node.type, f"p{k}")
                params.append(new)
            else:
                new = Node(node.op, [mapping[o.id] for o in node.operands], node.attrs, node.type, node.name)
            mapping[node.id] = new
        inst.params = [mapping[p.id] for p in inst.params]
        inst.roots = [mapping[r.id] for r in inst.roots]
        inst.nodes = [mapping[n.id] for n in inst.nodes]
        roots.extend(inst.roots)
    root = Node("tuple", roots, {}, TupleType(tuple(r.type for r in roots)))
    return Module("rule_check", Computation("rule_check", params, root))


class _Evaluator:
    """Values of e-classes and e-nodes of one view, on one set of inputs."""

    def __init__(self, eg: EGraph, view: View, loaded_values: dict[int, Any], loaded_types: dict[int, Type]) -> None:
        self.eg, self.view = eg, view
        self.cls_value: dict[int, Any] = {}
        self.cls_type: dict[int, Type] = {}
        for lid, c in view.handles.items():
            if lid in loaded_values and c not in self.cls_value:
                self.cls_value[c] = loaded_values[lid]
                self.cls_type[c] = loaded_types[lid]
        self._busy: set[int] = set()
        self.param_values: dict[int, tuple[Any, Type]] = {}

    def class_value(self, c: int) -> tuple[Any, Type] | None:
        if c in self.cls_value:
            return self.cls_value[c], self.cls_type[c]
        if c in self._busy or self.view.class_is_list[c]:
            return None
        self._busy.add(c)
        try:
            for i in self.view.class_nodes[c]:
                try:
                    v = self.node_value(self.view.nodes[i])
                except NxsatError:
                    continue
                if v is not None:
                    self.cls_value[c], self.cls_type[c] = v
                    return v
            return None
        finally:
            self._busy.discard(c)

    def node_value(self, node: ENode) -> tuple[Any, Type] | None:
        """(value, type) of an e-node from its children's class values; None when a child has none.
        NxsatError when the node is ill-typed."""
        eg, view = self.eg, self.view
        ctor = node.ctor
        if ctor == "Parameter":
            return self.param_values.get(node.slots[0])
        if ctor in ("TNil", "TCons"):
            return None
        if ctor in ("Constant", "Fill"):
            t = eg.constant_type(node)
            return (eg.constant_value(node), t) if t is not None else None
        op, attrs = eg.operator(node)
        fixed, variadic = operand_layout(node)
        kids = list(node.children[:fixed])
        if variadic:
            items = view.list_items(node.children[-1])
            if items is None:
                return None
            kids += items
        vals = []
        for k in kids:
            v = self.class_value(k)
            if v is None:
                return None
            vals.append(v)
        return run_node(op, [t for _v, t in vals], attrs, [v for v, _t in vals])


def _term_text(view: View, i: int, names: dict[int, str], depth: int = 0) -> str:
    node = view.nodes[i]
    if node.ctor == "TNil":
        return "(TNil)"
    parts = [node.ctor]
    for c in node.children:
        if c in names:
            parts.append(names[c])
        elif depth < 4 and view.class_nodes[c]:
            parts.append(_term_text(view, view.class_nodes[c][0], names, depth + 1))
        else:
            parts.append("...")
    for s in node.slots:
        parts.append(repr(s) if isinstance(s, str) else
                     "(vec-of " + " ".join(map(str, s)) + ")" if isinstance(s, tuple) else str(s))
    return "(" + " ".join(parts).replace("(vec-of )", "(vec-empty)") + ")"


def _ir_text(node: Node, depth: int = 0) -> str:
    if node.op == "parameter":
        return f"{node.name}:{node.type}"
    if node.op == "constant":
        v = node.attrs.get("value")
        return f"constant({_short(v, 4)})"
    if depth > 6:
        return "..."
    attrs = ", ".join(f"{k}={_attr_text(v)}" for k, v in node.attrs.items() if k != "type")
    inner = ", ".join(_ir_text(o, depth + 1) for o in node.operands)
    return f"{node.op}({inner}{'; ' + attrs if attrs else ''})"


def _attr_text(v: Any) -> str:
    if isinstance(v, dt.DType):
        return v.name
    if isinstance(v, DotDims):
        return (f"lc={list(v.lhs_contracting)} rc={list(v.rhs_contracting)} lb={list(v.lhs_batch)} "
                f"rb={list(v.rhs_batch)}")
    if isinstance(v, tuple) and v and hasattr(v[0], "__dataclass_fields__"):
        return "[" + " ".join(",".join(str(getattr(x, f)) for f in x.__dataclass_fields__) for x in v) + "]"
    return str(list(v)) if isinstance(v, tuple) else str(v)


def check_rule(rule: Rule, cat: Catalog | None = None, *, seed: int = 0, wanted: int = 4, batch: int = 48,
               min_batches: int = 4, max_batches: int = 8, inputs: int = 3) -> RuleResult:
    """Test one rule; see the module docstring. At least ``min_batches`` batches of ``batch`` random
    instances run (a counterexample can be rare: a permutation pair that does not commute, a
    broadcast that permutes a square operand), and more, up to ``max_batches``, until the rule has
    fired in ``wanted`` instances."""
    cat = cat or catalog()
    if rule.builtin:
        return RuleResult(rule, "built-in", message="implemented in the engine; tested by tests/rules")
    rng = np.random.default_rng(seed)
    try:
        pattern = rule_patterns(rule)
        eg = EGraph([rule], cat)  # egglog parses and type-checks the rule
    except NxsatError as exc:
        return RuleResult(rule, "error", message=f"{exc.loc}: {exc.message}" if exc.loc else exc.message)
    result = RuleResult(rule, "untested")
    seen_types: set[str] = set()
    for done in range(1, max(min_batches, max_batches) + 1):
        instances: list[_Instance] = []
        attempts = 0
        while len(instances) < batch and attempts < batch * 8:
            attempts += 1
            try:
                roots, params, nodes = instantiate(rule, rng, pattern)
            except Reject:
                continue
            except Untestable as exc:
                result.message = str(exc)
                return result
            instances.append(_Instance(roots, params, nodes, str(roots[0].type)))
        if not instances:
            continue
        result.tried += len(instances)
        # Every batch goes into the same e-graph (building one costs more than checking a batch);
        # only the new batch's instances are judged.
        bad = _check_batch(rule, eg, instances, rng, inputs, result, seen_types)
        if bad is not None:
            result.status = "unsound"
            result.counterexample, result.message = bad
            return result
        if done >= min_batches and result.fired >= wanted and len(seen_types) >= min(2, wanted):
            break
    result.types = sorted(seen_types)
    if result.fired:
        result.status = "sound"
    elif not result.message:
        result.message = f"did not fire in any of {result.tried} random instances (its guard was never true)"
    return result


def _check_batch(rule: Rule, eg: EGraph, instances: list[_Instance], rng: np.random.Generator, n_inputs: int,
                 result: RuleResult, seen_types: set[str]) -> tuple[Counterexample | None, str] | None:
    """None when every instance the rule fired on agrees; else (counterexample, what is wrong) (no
    counterexample when egglog itself fails running the rule)."""
    module = _batch_module(instances, first_param=len(eg.params))
    loaded = eg.load(module)
    eg.run_analysis()
    before = eg.view(analyses=False)
    try:
        eg.run_iteration([rule])
    except NxsatError as exc:
        return None, f"running the rule fails: {exc.message}"
    view = eg.view(analyses=False)
    # Which instances did the rule touch? Those whose root class gained e-nodes or merged with
    # another loaded value.
    def members(v: View) -> dict[int, int]:
        out: dict[int, int] = {}
        for c in v.handles.values():
            out[c] = out.get(c, 0) + 1
        return out

    m0, m1 = members(before), members(view)
    fired = []
    for k, inst in enumerate(instances):
        for r in inst.roots:
            lid = loaded.ids[r.id]
            c0, c1 = before.handles[lid], view.handles[lid]
            if len(view.class_nodes[c1]) > len(before.class_nodes[c0]) or m1[c1] > m0[c0]:
                fired.append(k)
                break
    if not fired:
        return None
    names: dict[int, str] = {}
    for lid, c in sorted(view.handles.items()):
        node = loaded.nodes.get(lid)  # this batch's values (earlier batches share the e-graph)
        if node is not None and node.op in ("parameter", "constant"):
            names.setdefault(c, _ir_text(node))
    originals = original_nodes(view, loaded)
    bound = rule.bound if rule.tag == APPROXIMATE else None
    for trial in range(n_inputs):
        if trial >= RANGE_TRIAL and rule.skips_extremes:
            break
        values: dict[int, Any] = {}
        # An approximate rule's error follows the magnitudes its operations sum, not their result (a
        # narrowed convolution whose products cancel): each value also computed on the inputs' absolute
        # values (a contraction's sum of |x| |w|), which the tolerance scales with.
        mags: dict[int, Any] = {}
        types: dict[int, Type] = {}
        inputs: dict[str, np.ndarray] = {}
        failed: set[int] = set()  # load ids the reference interpreter cannot run
        for lid, node in sorted(loaded.nodes.items()):
            m = None
            if node.op == "parameter":
                v = random_array(rng, node.type, trial, infinities=not rule.finite_only)  # type: ignore[arg-type]
                inputs[node.name] = v
                m = _absolute(v)
            elif node.op == "constant":
                v = node.attrs["value"]
                m = _absolute(v)
            elif node.op == "tuple":
                if any(loaded.ids[o.id] in failed for o in node.operands):
                    failed.add(lid)
                    continue
                v = tuple(values[loaded.ids[o.id]] for o in node.operands)
            else:
                args = [loaded.ids[o.id] for o in node.operands]
                if any(a in failed for a in args):
                    failed.add(lid)
                    continue
                try:
                    v, _t = run_node(node.op, [o.type for o in node.operands], node.attrs, [values[a] for a in args])
                except NxsatError:
                    failed.add(lid)
                    continue
                if bound is not None and all(a in mags for a in args):
                    try:
                        m = run_node(node.op, [o.type for o in node.operands], node.attrs, [mags[a] for a in args])[0]
                    except NxsatError:
                        m = None
            values[lid] = v
            if m is not None:
                mags[lid] = m
            types[lid] = node.type
        ev = _Evaluator(eg, view, values, types)
        for lid, node in loaded.nodes.items():
            if node.op == "parameter":
                ev.param_values[node.attrs["index"]] = (values[lid], node.type)
        fired = [k for k in fired if not any(loaded.ids[n.id] in failed for n in instances[k].nodes)]
        for k in fired:
            inst = instances[k]
            ids = [loaded.ids[n.id] for n in inst.nodes]
            for r in inst.roots:  # the left-hand side is the reference of its class
                lid = loaded.ids[r.id]
                ev.cls_value[view.handles[lid]], ev.cls_type[view.handles[lid]] = values[lid], r.type
            classes = sorted({view.handles[i] for i in ids})
            scale = max((_magnitude(values[i]) for i in ids if i in values), default=0.0)
            if bound is not None:
                scale = max([scale, *(_magnitude(mags[i]) for i in ids if i in mags)])
            for c in classes:
                ref = ev.class_value(c)
                if ref is None:
                    continue
                for i in sorted(view.class_nodes[c], key=lambda j: (len(view.nodes[j].children), j)):
                    node = view.nodes[i]
                    if node.ctor in ("TNil", "TCons"):
                        continue
                    try:
                        got = ev.node_value(node)
                    except NxsatError as exc:
                        return _counter(inst, view, i, names, originals, inputs, ref[0], exc.message,
                                        "the rewritten term is ill-typed"), "builds an ill-typed term"
                    if got is None:
                        continue
                    if got[1] != ref[1]:
                        return _counter(inst, view, i, names, originals, inputs, ref[0], got[0],
                                        f"type {got[1]} instead of {ref[1]}"), "changes the type"
                    why = agree(ref[0], got[0], bound, scale)
                    if why:
                        return _counter(inst, view, i, names, originals, inputs, ref[0], got[0],
                                        why), "changes the value"
    for k in fired:
        seen_types.add(instances[k].signature)
    result.fired += len(fired)
    return None


def _absolute(v: Any) -> Any:
    """A float value's absolute values (others as they are)."""
    a = np.asarray(v)
    return np.abs(a) if a.dtype.kind == "f" or a.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np) else v


def _magnitude(v: Any) -> float:
    """The largest finite |element| of a value (tuples included): the scale rounding errors follow."""
    if isinstance(v, tuple):
        return max((_magnitude(x) for x in v), default=0.0)
    a = np.asarray(v).astype(np.float64)
    finite = a[np.isfinite(a)]
    return float(np.max(np.abs(finite), initial=0.0))


def _counter(inst: _Instance, view: View, node_index: int, names: dict[int, str], originals: dict[int, Node],
             inputs: dict[str, np.ndarray], expected: Any, got: Any, why: str) -> Counterexample:
    mine = {p.name for p in inst.params}
    rhs = (_ir_text(originals[node_index]) if node_index in originals
           else _term_text(view, node_index, names))
    return Counterexample(", ".join(_ir_text(r) for r in inst.roots), rhs,
                          {k: v for k, v in inputs.items() if k in mine}, expected, got, why)


def verify(eg: EGraph, loaded: Any, inputs: Sequence[np.ndarray], bound: float | None = None) -> str | None:
    """Evaluate every e-node of ``eg`` on ``inputs`` (given to ``loaded``'s parameters) and compare it
    with its e-class's value; None when all agree, else what disagrees. Tests use it to show that a
    saturated e-graph is still sound, whatever extraction would pick."""
    view = eg.view(analyses=False)
    values: dict[int, Any] = {}
    types: dict[int, Type] = {}
    by_index = {int(p.attrs["index"]): x for p, x in zip(loaded.module.entry.params, inputs)}
    for lid, node in sorted(loaded.nodes.items()):
        if node.op == "parameter":
            v: Any = by_index[int(node.attrs["index"])]
        elif node.op == "constant":
            v = node.attrs["value"]
        elif node.op == "tuple":
            v = tuple(values[loaded.ids[o.id]] for o in node.operands)
        else:
            v, _t = run_node(node.op, [o.type for o in node.operands], node.attrs,
                             [values[loaded.ids[o.id]] for o in node.operands])
        values[lid], types[lid] = v, node.type
    ev = _Evaluator(eg, view, values, types)
    for lid, node in loaded.nodes.items():
        if node.op == "parameter":
            ev.param_values[int(node.attrs["index"])] = (values[lid], node.type)
    scale = max((_magnitude(v) for v in values.values()), default=0.0)
    for c in range(view.n_classes):
        if view.class_is_list[c]:
            continue
        ref = ev.class_value(c)
        if ref is None:
            continue
        for i in view.class_nodes[c]:
            try:
                got = ev.node_value(view.nodes[i])
            except NxsatError as exc:
                return f"{_term_text(view, i, {})} is ill-typed: {exc.message}"
            if got is None:
                continue
            if got[1] != ref[1]:
                return f"{_term_text(view, i, {})} has type {got[1]}, its class {ref[1]}"
            why = agree(ref[0], got[0], bound, scale)
            if why:
                return f"{_term_text(view, i, {})} disagrees with its class: {why}"
    return None


def check_rules(rules: Sequence[Rule], cat: Catalog | None = None, seed: int = 0,
                progress: Callable[[RuleResult], None] | None = None, **kw: Any) -> list[RuleResult]:
    out = []
    for rule in rules:
        # a rule's instances depend on its name, not on where it sits among the others: adding a rule
        # does not change what every later one is tried on
        r = check_rule(rule, cat, seed=seed + zlib.crc32(rule.name.encode()), **kw)
        out.append(r)
        if progress is not None:
            progress(r)
    return out


__all__ = ["Counterexample", "RuleResult", "agree", "check_rule", "check_rules", "verify"]

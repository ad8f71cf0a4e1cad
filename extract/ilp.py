"""Exact extraction: the cheapest acyclic choice as an integer program (scipy's HiGHS, ``milp``).

One binary per e-node: the root class picks one node, a picked node needs a picked node in each of
its child classes, a class picks at most one, and the objective is the sum of the picked nodes'
costs (each class paid once: the DAG cost). Before the solve the problem is pruned:

- only classes reachable from the root through nodes that have a finite term are kept;
- a node that has its own class as a child (a self-loop) can never be part of a finite term;
- a node is dropped when another node of its class needs a subset of its child classes at no more
  cost (commutative variants ``a + b`` / ``b + a`` need the same classes: one is kept);
- a class with one node left gets no "at most one" row.

No ordering constraints are written up front (they would double the variables): a solution is
checked for cycles and every cycle found is forbidden (its nodes cannot all be picked) before solving
again; only the two-node cycles (``transpose(transpose(x))`` with ``x`` in the outer class, the
commonest in these e-graphs) are forbidden from the start, pairwise. The solver stops at a relative
gap of :data:`GAP` (far below what the cost model can tell apart). A time limit bounds all of it;
when it runs out, the best of the solver's incumbent (if acyclic) and the DAG-greedy choice is
returned, and :class:`IlpResult` says which.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from nxsat.extract.greedy import dag, dag_cost, tree
from nxsat.rules.egraph import View

TIE_NS = 1e-3  # what a node not loaded with the graph pays extra: ties go to the input program
MAX_ROUNDS = 50  # re-solves after forbidding cycles before giving up on exactness
GAP = 1e-6  # relative optimality gap at which the solver stops


@dataclass
class IlpResult:
    best: list[int]
    status: str  # "optimal", "time limit (incumbent)", "time limit (greedy)", "cycles (greedy)", "trivial"
    variables: int = 0
    constraints: int = 0
    classes: int = 0
    cycle_cuts: int = 0
    rounds: int = 0
    seconds: float = 0.0
    pruned: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "variables": self.variables, "constraints": self.constraints,
                "classes": self.classes, "cycle_cuts": self.cycle_cuts, "solves": self.rounds + 1,
                "seconds": round(self.seconds, 3),
                "pruned": self.pruned}


def ilp(view: View, costs: Sequence[float], root: int, preferred: Collection[int] = (),
        time_limit: float = 60.0) -> IlpResult:
    """The cheapest choice from ``root``; on a timeout the incumbent or the DAG greedy's choice."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_array

    t0 = time.perf_counter()
    greedy = dag(view, costs, root, preferred)
    feasible_class = [b >= 0 for b in tree(view, costs, preferred)]
    nodes, classes, pruned = _prune(view, costs, root, preferred, feasible_class)
    if not nodes:
        return IlpResult(greedy, "trivial", seconds=time.perf_counter() - t0)
    col = {i: j for j, i in enumerate(nodes)}
    members: dict[int, list[int]] = {c: [] for c in classes}
    for i in nodes:
        members[view.node_class[i]].append(col[i])
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(lo)
        for j, v in entries:
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    row([(j, 1.0) for j in members[root]], 1.0, 1.0)
    for c, js in members.items():
        if c != root and len(js) > 1:
            row([(j, 1.0) for j in js], 0.0, 1.0)
    c_of = view.node_class
    # A class's picked node needs a picked node in each of its child classes that does not need the class
    # back (one that does would close a cycle). One row per (class, child class), summing the class's
    # nodes that need the child: at most one of them is picked, so the sum is what the child must cover.
    # Row per node, alternatives that share a child (a + b and b + a, a dot and its swapped twin) each
    # asked it for half in the LP relaxation, and halves of halves down a chain of them: resnet_small's
    # bound was 4% of the optimum and HiGHS did not close in 60 s. And a value and its channels-first
    # twin, which hold transposes of each other, no longer support each other.
    needs: dict[tuple[int, int], list[int]] = {}
    for i in nodes:
        for k in set(view.nodes[i].children):
            needs.setdefault((c_of[i], k), []).append(col[i])
    for (a, k), parents in sorted(needs.items()):
        row([(j, -1.0) for j in parents] + [(col[j], 1.0) for j in view.class_nodes[k]
                                             if j in col and a not in view.nodes[j].children], 0.0, math.inf)
    obj = np.array([costs[i] + (0.0 if i in preferred else TIE_NS) for i in nodes])
    n = len(nodes)
    result = IlpResult(greedy, "", n, len(lo), len(classes), pruned=pruned)
    greedy_cost = dag_cost(view, greedy, root, costs)
    while True:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            result.status = "time limit (greedy)"
            break
        A = coo_array((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
        res = milp(obj, constraints=LinearConstraint(A, lo, hi), integrality=np.ones(n), bounds=Bounds(0, 1),
                   options={"time_limit": left, "mip_rel_gap": GAP, "disp": False})
        if res.x is None:
            result.status = "time limit (greedy)" if res.status == 1 else f"solver: {res.message} (greedy)"
            break
        best = list(greedy)
        for c in classes:
            best[c] = -1
        for j in np.flatnonzero(res.x > 0.5):
            i = nodes[j]
            best[view.node_class[i]] = i
        cycles = _cycles(view, best, root)
        if not cycles:
            if res.status == 0:
                result.best, result.status = best, "optimal"
            elif dag_cost(view, best, root, costs) < greedy_cost:
                result.best, result.status = best, "time limit (incumbent)"
            else:
                result.status = "time limit (greedy)"
            break
        result.rounds += 1
        if result.rounds >= MAX_ROUNDS:
            result.status = "cycles (greedy)"
            break
        for cycle in cycles:
            result.cycle_cuts += 1
            row([(col[i], 1.0) for i in cycle], 0.0, len(cycle) - 1.0)
    result.constraints = len(lo)
    result.seconds = time.perf_counter() - t0
    return result


def _prune(view: View, costs: Sequence[float], root: int, preferred: Collection[int],
           feasible_class: list[bool]) -> tuple[list[int], list[int], dict[str, int]]:
    """The nodes and classes the program needs (see the module's docstring)."""
    counts = {"self_loops": 0, "infeasible": 0, "dominated": 0, "unreachable_classes": 0}
    keep: dict[int, list[int]] = {}
    seen = {root}
    stack = [root]
    while stack:
        c = stack.pop()
        cand = []
        for i in view.class_nodes[c]:
            kids = view.nodes[i].children
            if c in kids:
                counts["self_loops"] += 1
            elif math.isinf(costs[i]):
                counts["infeasible"] += 1
            elif not all(feasible_class[k] for k in kids):
                counts["infeasible"] += 1
            else:
                cand.append(i)
        kept: list[int] = []
        # cheapest first (ties: the loaded node), so a dominated node meets its dominator first
        for i in sorted(cand, key=lambda i: (costs[i], 0 if i in preferred else 1, i)):
            ks = frozenset(view.nodes[i].children)
            if any(frozenset(view.nodes[j].children) <= ks for j in kept):
                counts["dominated"] += 1
                continue
            kept.append(i)
        keep[c] = kept
        for i in kept:
            for k in view.nodes[i].children:
                if k not in seen:
                    seen.add(k)
                    stack.append(k)
    counts["unreachable_classes"] = view.n_classes - len(seen)
    classes = sorted(keep)
    return [i for c in classes for i in keep[c]], classes, counts


def _cycles(view: View, best: list[int], root: int) -> list[list[int]]:
    """The chosen nodes of every strongly connected part (of more than one class, or a class using
    itself) of the choice reachable from ``root``: each holds a cycle, so not all of them can be
    picked together (empty: the choice is acyclic)."""
    import networkx as nx

    g = nx.DiGraph()
    seen = {root}
    stack = [root]
    while stack:
        c = stack.pop()
        g.add_node(c)
        for k in view.nodes[best[c]].children if best[c] >= 0 else ():
            g.add_edge(c, k)
            if k not in seen:
                seen.add(k)
                stack.append(k)
    out = []
    for comp in nx.strongly_connected_components(g):
        if len(comp) > 1 or any(g.has_edge(c, c) for c in comp):
            out.append(sorted(best[c] for c in comp))
    return sorted(out)


__all__ = ["IlpResult", "ilp"]

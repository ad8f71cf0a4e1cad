"""Extraction: the smallest DAG (shared subterms count once), back to IR that runs."""

from __future__ import annotations

from nxsat.extract.smallest import choose
from nxsat.rules.egraph import ENode, View


def _view(spec: list[list[tuple[str, tuple[int, ...], tuple]]]) -> View:
    v = View()
    for c, nodes in enumerate(spec):
        v.class_nodes.append([])
        v.class_is_list.append(False)
        for ctor, kids, slots in nodes:
            v.class_nodes[c].append(len(v.nodes))
            v.node_class.append(c)
            v.nodes.append(ENode(ctor, kids, slots))
    return v


def _dag_vs_tree_egraph() -> tuple[View, int, int]:
    """Class C holds N1 = add(abs(T), exp(T)) with T a chain of 5 negates (shared), and N2 = tanh of a
    chain of 8 square roots. Tree size: N1 15, N2 10. DAG size: N1 9, N2 10."""
    spec: list[list] = [[("Parameter", (), (0,))]]
    for _ in range(5):
        spec.append([("Negate", (len(spec) - 1,), ())])
    t = len(spec) - 1
    spec.append([("Abs", (t,), ())])
    spec.append([("Exponential", (t,), ())])
    s1, s2 = t + 1, t + 2
    prev = 0
    for _ in range(8):
        spec.append([("Sqrt", (prev,), ())])
        prev = len(spec) - 1
    spec.append([("Add", (s1, s2), ()), ("Tanh", (prev,), ())])
    view = _view(spec)
    c = len(spec) - 1
    n1, n2 = view.class_nodes[c]
    return view, n1, n2


def _tree_cost(view: View, c: int, memo: dict[int, int]) -> int:
    if c not in memo:
        memo[c] = min(1 + sum(_tree_cost(view, k, memo) for k in view.nodes[i].children) for i in view.class_nodes[c])
    return memo[c]


def test_shared_subterms_count_once():
    view, n1, n2 = _dag_vs_tree_egraph()
    c = view.node_class[n1]
    tree = {i: 1 + sum(_tree_cost(view, k, {}) for k in view.nodes[i].children) for i in (n1, n2)}
    assert tree[n2] < tree[n1]  # a tree extractor would pick the chain of square roots
    best = choose(view)
    assert best[c] == n1  # the DAG of N1 is smaller: T counts once


def test_ties_prefer_the_loaded_node_and_cycles_are_skipped():
    # class 1 = {neg(neg(x)) written as Negate(2), x itself (Parameter)}; class 2 = Negate(1): a cycle.
    view = _view([[("Parameter", (), (0,))], [("Negate", (2,), ()), ("Copy", (0,), ())], [("Negate", (1,), ())]])
    best = choose(view)
    assert view.nodes[best[1]].ctor == "Copy" and view.nodes[best[2]].ctor == "Negate"
    view = _view([[("Parameter", (), (0,))], [("Abs", (0,), ()), ("Sign", (0,), ())]])
    assert view.nodes[choose(view)[1]].ctor == "Abs"
    assert view.nodes[choose(view, frozenset({2}))[1]].ctor == "Sign"


def test_a_cyclic_choice_is_an_internal_error_not_a_hang():
    import pytest

    from nxsat import dtypes as dt
    from nxsat.builder import Builder
    from nxsat.diagnostics import NxsatError
    from nxsat.rules.catalog import catalog
    from nxsat.rules.egraph import EGraph
    from nxsat.rules.extract import build_module
    from nxsat.rules.saturate import Budget, saturate

    b = Builder("nn")
    x = b.param(dt.F32, (3,))
    m = b.module(b.op("exponential", [b.op("negate", [b.op("negate", [x])])]))
    cat = catalog()
    eg = EGraph(cat.find(["negate-negate"]), cat)
    loaded = eg.load(m)
    saturate(eg, Budget(3, 30.0, 10_000))
    view = eg.view(analyses=False)
    best = choose(view)
    px = view.handles[loaded.ids[x.id]]  # its class now also holds negate(negate(x))
    best[px] = next(i for i in view.class_nodes[px] if view.nodes[i].ctor == "Negate")
    nx = view.nodes[best[px]].children[0]
    best[nx] = next(i for i in view.class_nodes[nx] if view.nodes[i].ctor == "Negate")
    with pytest.raises(NxsatError, match="cycle"):
        build_module(eg, loaded, view, best)


def _chosen_acyclic(v: View, best: list[int]) -> bool:
    """Does following the chosen node of every class never come back to a class on the path?"""
    state: dict[int, int] = {}  # 1: on the path, 2: done
    for root in range(len(best)):
        if best[root] < 0 or root in state:
            continue
        stack = [(root, iter(v.nodes[best[root]].children))]
        state[root] = 1
        while stack:
            top, kids = stack[-1]
            k = next(kids, None)
            if k is None:
                state[top] = 2
                stack.pop()
            elif best[k] < 0 or state.get(k) == 1:
                return False
            elif k not in state:
                state[k] = 1
                stack.append((k, iter(v.nodes[best[k]].children)))
    return True


def _extractable(v: View) -> list[bool]:
    """Which classes have a finite term at all: a node whose children all have one (a fixpoint)."""
    ok = [False] * len(v.class_nodes)
    changed = True
    while changed:
        changed = False
        for c, nodes in enumerate(v.class_nodes):
            if not ok[c] and any(all(ok[k] for k in v.nodes[i].children) for i in nodes):
                ok[c] = changed = True
    return ok


def test_greedy_choice_is_always_acyclic_on_random_egraphs():
    """Every class that has a finite term gets a node (a choice of nothing is not acyclic by default),
    every other class none, and following the choices never comes back to a class."""
    import random

    for seed in range(300):
        r = random.Random(seed)
        n_cls = r.randint(3, 15)
        spec: list[list] = [[] for _ in range(n_cls)]
        spec[0].append(("Parameter", (), (0,)))
        for k in range(r.randint(n_cls, 4 * n_cls)):
            c = r.randrange(n_cls)
            spec[c].append(("Add", tuple(r.randrange(n_cls) for _ in range(r.choice((0, 1, 2, 2)))), (k,)))
        v = _view(spec)
        best = choose(v, frozenset(r.sample(range(len(v.nodes)), len(v.nodes) // 2)))
        assert [b >= 0 for b in best] == _extractable(v), seed
        assert all(b < 0 or v.node_class[b] == c for c, b in enumerate(best)), seed
        assert _chosen_acyclic(v, best), seed


def test_rules_never_import_the_extractors():
    """rules/ hands the saturated e-graph over; extract/ (which comes after it) chooses."""
    import subprocess
    import sys

    code = ("import sys, importlib\n"
            "for m in ('nxsat.rules', 'nxsat.rules.extract', 'nxsat.rules.checker', 'nxsat.rules.equiv',\n"
            "          'nxsat.rules.saturate', 'nxsat.rules.catalog', 'nxsat.cli.rules'):\n"
            "    importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.startswith('nxsat.extract')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"

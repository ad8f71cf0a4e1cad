"""Greedy extractors over node costs: tree cost and DAG-aware.

Both choose one e-node per e-class bottom-up, re-evaluating a class's users whenever its choice gets
cheaper (a worklist; every operator costs more than zero, so the choices settle and never form a
cycle through the tree cost). They differ in what a node costs:

- ``tree``: its own cost plus its children's costs, so a subterm used twice is paid twice. Fast, and
  blind to sharing: it may pick two private copies of a value over one shared one;
- ``dag`` (extraction-gym's faster-greedy-dag): its own cost plus the cost of the *set* of classes
  its children's terms use, each paid once. Sets are Python integers used as bitsets, with the sum of
  each set kept beside it: a union adds only the classes it brings.

:func:`dag_cost` is the true cost of any choice (the chosen classes reachable from the root, each
paid once): what the extractors are compared by. ``dag`` returns the better of its choice and the
tree's, so it is never worse than ``tree``.

Ties go to the node the graph was loaded with (``preferred``), then to the lower index, so an e-graph
in which nothing is cheaper gives the input back unchanged.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Collection, Iterator, Sequence

from nxsat.rules.egraph import View

MAX_PASSES = 64  # re-evaluations per node before greedy extraction settles for what it has


class _Worklist:
    """Nodes to (re)evaluate, leaves first: a class whose choice changed queues the nodes that use it.
    A node is evaluated at most :data:`MAX_PASSES` times."""

    def __init__(self, view: View) -> None:
        self.parents: list[list[int]] = [[] for _ in range(view.n_classes)]
        for i, node in enumerate(view.nodes):
            for c in set(node.children):
                self.parents[c].append(i)
        self.queue = deque(i for i, n in enumerate(view.nodes) if not n.children)
        self.queued = bytearray(len(view.nodes))
        for i in self.queue:
            self.queued[i] = 1
        self.evaluations = [0] * len(view.nodes)

    def __iter__(self) -> Iterator[int]:
        while self.queue:
            i = self.queue.popleft()
            self.queued[i] = 0
            self.evaluations[i] += 1
            if self.evaluations[i] <= MAX_PASSES:
                yield i

    def changed(self, c: int) -> None:
        for p in self.parents[c]:
            if not self.queued[p]:
                self.queued[p] = 1
                self.queue.append(p)


def _better(cost: float, pref: int, i: int, old: tuple[float, int, int] | None) -> bool:
    """Costs compare exactly: sums are taken in an order that does not depend on operand order
    (``a + b`` and ``b + a`` cost the same to the last bit), and a tolerance would swallow real
    differences next to the huge totals tree costs reach on deep DAGs."""
    return old is None or (cost, pref, i) < old


def tree(view: View, costs: Sequence[float], preferred: Collection[int] = ()) -> list[int]:
    """The node of every class whose tree cost is least (-1 where a class has no finite term).

    Two nodes of a class are compared on what they do not share: on a deep DAG tree costs count a
    shared subterm once per path and reach 1e24 ns and more, where a whole-sum comparison cannot see
    a 200 ms difference (gemma3's logits ``dot`` with and without a transposed embedding)."""
    work = _Worklist(view)
    best = [-1] * view.n_classes
    total = [math.inf] * view.n_classes
    for i in work:
        node = view.nodes[i]
        c = view.node_class[i]
        if c in node.children:
            continue
        cost = costs[i] + math.fsum(total[k] for k in node.children)
        if cost == math.inf:
            continue
        b = best[c]
        if b >= 0 and b != i:
            mine, theirs = Counter(node.children), Counter(view.nodes[b].children)
            delta = (costs[i] + math.fsum(total[k] * n for k, n in (mine - theirs).items())) - (
                costs[b] + math.fsum(total[k] * n for k, n in (theirs - mine).items()))
            if delta > 0 or (delta == 0 and (i not in preferred, i) > (b not in preferred, b)):
                continue
        if b != i or cost != total[c]:
            best[c], total[c] = i, cost
            work.changed(c)
    return best


def dag(view: View, costs: Sequence[float], root: int | None, preferred: Collection[int] = ()) -> list[int]:
    """The node of every class whose DAG cost (shared classes paid once) is least, greedily; with a
    ``root``, the better (by :func:`dag_cost` from it) of that choice and :func:`tree`'s."""
    n_cls = view.n_classes
    work = _Worklist(view)
    best = [-1] * n_cls
    key: list[tuple[float, int, int] | None] = [None] * n_cls
    bits = [0] * n_cls
    total = [0.0] * n_cls
    own = [0.0] * n_cls  # the cost of each class's chosen node alone (what a set containing it adds)
    for i in work:
        node = view.nodes[i]
        c = view.node_class[i]
        kids = set(node.children)
        if any(best[k] < 0 for k in kids):
            continue
        ordered = sorted(kids, key=lambda k: (-total[k], k))
        b, cost = 0, 0.0
        for n, k in enumerate(ordered):
            if n == 0:
                b, cost = bits[k], total[k]
                continue
            new = bits[k] & ~b
            if new:
                cost += _sum_bits(new, own)
                b |= new
        if b >> c & 1:
            continue  # the node needs its own class: a cycle
        b |= 1 << c
        cost += costs[i]
        pref = 0 if i in preferred else 1
        if best[c] == i or _better(cost, pref, i, key[c]):
            changed = best[c] != i or b != bits[c] or cost != total[c]
            best[c], key[c], bits[c], total[c], own[c] = i, (cost, pref, i), b, cost, costs[i]
            if changed:
                work.changed(c)
    if root is None:
        return best
    other = tree(view, costs, preferred)
    best = best if dag_cost(view, best, root, costs) <= dag_cost(view, other, root, costs) else other
    return improve(view, costs, best, root)


IMPROVE_ROUNDS = 4  # passes of :func:`improve` over the used classes (it stops at the first that gains nothing)
IMPROVE_VISITS = 2_000_000  # classes :func:`improve` may visit in all, trials and re-orderings together


def improve(view: View, costs: Sequence[float], best: Sequence[int], root: int) -> list[int]:
    """The choice, improved one class at a time: a used class takes another of its nodes when that lowers
    the true cost (:func:`dag_cost`), counted exactly with how many chosen nodes use each class (what
    the switch brings in, what it leaves unused). The greedy's own blind spot: it compares a class's
    nodes on the sets their children use, not knowing which of those the rest of the program pays for
    anyway (gemma3's residual sums, reassociated by the greedy into private copies of a sum the next
    layer's norm reads too: 8 adds more than the input). A switch whose new classes may reach the class
    itself (a cycle) is not taken; a pass whose switches together close one is undone and redone a
    switch at a time; the visits are bounded (:data:`IMPROVE_VISITS`)."""
    best = list(best)
    budget = [IMPROVE_VISITS]
    single = False
    for _ in range(IMPROVE_ROUNDS):
        before = list(best)
        switched = _improve_pass(view, costs, best, root, single, budget)
        if switched and reachable(view, best, root) is None:  # positions went stale within the pass
            best = before
            if single:
                return best
            single = True
            continue
        if not switched or budget[0] <= 0:
            return best
    return best


def _improve_pass(view: View, costs: Sequence[float], best: list[int], root: int, single: bool,
                  budget: list[int]) -> int:
    """One pass of :func:`improve` from the root down, switching ``best`` in place; how many switches
    (with ``single``, it stops at the first)."""
    used = reachable(view, best, root)
    if used is None:
        return 0
    budget[0] -= len(used)
    pos = [-1] * view.n_classes  # children before parents: a class reaches only lower positions
    for n, c in enumerate(used):
        pos[c] = n
    refs = [0] * view.n_classes
    refs[root] = 1
    for c in used:
        for k in set(view.nodes[best[c]].children):
            refs[k] += 1
    switched = 0
    for c in reversed(used):  # from the root down: a switch high up decides what is used below
        if refs[c] == 0 or len(view.class_nodes[c]) < 2:
            continue
        for j in view.class_nodes[c]:
            if j == best[c] or costs[j] == math.inf or any(best[k] < 0 for k in view.nodes[j].children):
                continue
            delta, log, ok, seen = _switch(view, costs, best, refs, pos, c, j)
            budget[0] -= seen
            if ok and delta < -1e-9 * max(1.0, abs(costs[best[c]])):
                best[c] = j
                switched += 1
                break
            for k, r in reversed(log):
                refs[k] = r
            if budget[0] <= 0:
                return switched
        if switched and single:
            return switched
    return switched


def _switch(view: View, costs: Sequence[float], best: Sequence[int], refs: list[int], pos: list[int], c: int,
            j: int) -> tuple[float, list[tuple[int, int]], bool, int]:
    """The change in true cost when class ``c`` takes node ``j``, with ``refs`` updated (the log of old
    counts undoes it); not ok when a class the new node uses may reach ``c`` (a cycle)."""
    log: list[tuple[int, int]] = []
    delta = costs[j] - costs[best[c]]
    seen = 0
    stack = list(set(view.nodes[j].children))
    while stack:  # what the new node uses: a class used for the first time brings its own children
        k = stack.pop()
        seen += 1
        if k == c:
            return delta, log, False, seen
        log.append((k, refs[k]))
        refs[k] += 1
        if refs[k] == 1:  # new to the program: what it uses is traversed here
            delta += costs[best[k]]
            stack.extend(set(view.nodes[best[k]].children))
        elif pos[k] > pos[c]:
            reaches, n = _reaches(view, best, pos, k, c)
            seen += n
            if reaches:
                return delta, log, False, seen
    stack = list(set(view.nodes[best[c]].children))
    while stack:  # what the old node no longer uses
        k = stack.pop()
        seen += 1
        log.append((k, refs[k]))
        refs[k] -= 1
        if refs[k] == 0:
            delta -= costs[best[k]]
            stack.extend(set(view.nodes[best[k]].children))
    return delta, log, True, seen


def _reaches(view: View, best: Sequence[int], pos: Sequence[int], k: int, c: int) -> tuple[bool, int]:
    """Does class ``k`` use class ``c`` through the choice? Only classes after ``c`` in the pass's order
    (or new to it) may; how many classes were visited."""
    stack, seen = [k], {k}
    while stack:
        x = stack.pop()
        for y in set(view.nodes[best[x]].children):
            if y == c:
                return True, len(seen)
            if y not in seen and (pos[y] > pos[c] or pos[y] < 0):
                seen.add(y)
                stack.append(y)
    return False, len(seen)


def _sum_bits(b: int, own: Sequence[float]) -> float:
    s = 0.0
    while b:
        low = b & -b
        s += own[low.bit_length() - 1]
        b ^= low
    return s


def reachable(view: View, best: Sequence[int], root: int) -> list[int] | None:
    """The classes the choice uses from ``root`` (None: a class without a choice, or a cycle)."""
    order: list[int] = []
    state = bytearray(view.n_classes)  # 0 new, 1 open, 2 done
    stack: list[tuple[int, bool]] = [(root, False)]
    while stack:
        c, done = stack.pop()
        if done:
            state[c] = 2
            order.append(c)
            continue
        if state[c] == 2:
            continue
        if state[c] == 1 or best[c] < 0:
            return None
        state[c] = 1
        stack.append((c, True))
        for k in set(view.nodes[best[c]].children):
            if state[k] == 1:
                return None
            if state[k] == 0:
                stack.append((k, False))
    return order


def dag_cost(view: View, best: Sequence[int], root: int, costs: Sequence[float]) -> float:
    """The cost of a choice: every class it uses from ``root`` paid once (inf if it is cyclic or
    incomplete)."""
    used = reachable(view, best, root)
    if used is None:
        return math.inf
    return math.fsum(costs[best[c]] for c in used)


__all__ = ["dag", "dag_cost", "improve", "reachable", "tree"]

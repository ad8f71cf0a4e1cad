"""Bounded saturation: iterations, e-node limit and seconds per -O level, a back-off scheduler, and
a report of every run.

Each iteration runs the analyses to saturation, then every rule that is not banned, once, then
constant folding. Rules marked :explosive (associativity, commutativity) run under egg's back-off
scheduler: a rule that finds more than its match limit in an iteration has those matches dropped
and is banned for ban-length iterations, and each ban doubles its limit and its ban. egglog's own
back-off scheduler drops the matches within the iteration; the bans are kept here on the host,
because egglog's scheduler lives for one command. Each explosive rule's limit is also capped at
its share of the e-nodes left under the node limit, so no iteration overshoots the budget; a rule
held back by that cap is set aside like a banned rule, and when only such rules have work left
saturation stops with "node limit". egglog's scheduler re-finds every match each time (no
seminaive evaluation: measured 3-10x slower on resnet50), so the other rules run seminaively and
unscheduled: they add at most a few e-nodes per e-node of the graph. The matches counted for an
explosive rule include matches found again.

The loop stops when nothing changes (saturated), at the iteration limit, at the node limit, or
when the time is up (checked between iterations); hitting a limit is a normal outcome, recorded
in the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nxsat.rules.catalog import Level, Rule
from nxsat.rules.egraph import EGraph, Sizes

SATURATED, NODE_LIMIT, ITERATION_LIMIT, TIME_LIMIT, PROVED = (
    "saturated", "node limit", "iteration limit", "time limit", "proved")


@dataclass
class Budget:
    iterations: int
    seconds: float
    node_limit: int
    match_limit: int = 1000
    ban_length: int = 2
    fold: bool = True
    fold_max_elements: int = 256
    fold_max_input_elements: int = 4096
    # Time every rule: run each one as its own step (egglog 13.2 reports zero time per rule). Slower,
    # so `nxsat rules stats` asks for it and compilation does not.
    time_rules: bool = False

    @staticmethod
    def for_level(level: Level, initial_nodes: int, match_limit: int, ban_length: int, **kw: Any) -> Budget:
        return Budget(level.iterations, level.seconds, max(level.node_min, int(level.node_factor * initial_nodes)),
                      match_limit, ban_length, **kw)


@dataclass
class IterationStats:
    index: int
    enodes: int
    eclasses: int
    seconds: float
    matches: dict[str, int] = field(default_factory=dict)
    banned: list[str] = field(default_factory=list)


@dataclass
class Report:
    """What one saturation did."""

    rules: list[str]
    budget: Budget
    initial: Sizes
    iterations: list[IterationStats] = field(default_factory=list)
    stop_reason: str = ""
    stop_detail: str = ""
    matches: dict[str, int] = field(default_factory=dict)
    seconds_per_rule: dict[str, float] = field(default_factory=dict)
    bans: dict[str, int] = field(default_factory=dict)
    load_seconds: float = 0.0
    seconds: float = 0.0
    cse_merged: int = 0
    level: int | None = None
    sets: tuple[str, ...] = ()
    timed: bool = False  # whether seconds_per_rule holds measurements (Budget.time_rules)

    @property
    def final(self) -> tuple[int, int]:
        if self.iterations:
            return self.iterations[-1].enodes, self.iterations[-1].eclasses
        return self.initial.nodes, self.initial.classes

    def fired(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.matches.items(), key=lambda kv: (-kv[1], kv[0])) if v}

    def format(self, all_rules: bool = False) -> str:
        lines = []
        head = f"-O{self.level} " if self.level is not None else ""
        lines.append(f"saturation {head}({', '.join(self.sets) or 'rules'}: {len(self.rules)} rules): "
                     f"stopped: {self.stop_reason}{f' ({self.stop_detail})' if self.stop_detail else ''} after "
                     f"{len(self.iterations)} iteration(s), {self.seconds:.3f} s")
        lines.append(f"  budget: {self.budget.iterations} iterations, {self.budget.node_limit} e-nodes, "
                     f"{self.budget.seconds:g} s; back-off match limit {self.budget.match_limit}")
        lines.append(f"  loaded: {self.initial.nodes} e-nodes, {self.initial.classes} e-classes in "
                     f"{self.load_seconds:.3f} s ({self.cse_merged} values merged as common subexpressions)")
        lines.append("  iter   e-nodes  e-classes   seconds  matches  banned")
        for it in self.iterations:
            lines.append(f"  {it.index:>4} {it.enodes:>9} {it.eclasses:>10} {it.seconds:>9.3f} "
                         f"{sum(it.matches.values()):>8}  {', '.join(it.banned)}".rstrip())
        rows = [(name, self.matches.get(name, 0), self.seconds_per_rule.get(name, 0.0), self.bans.get(name, 0))
                for name in self.rules]
        rows = [r for r in rows if all_rules or r[1] or r[3]]
        rows.sort(key=lambda r: (-r[1], -r[2], r[0]) if self.timed else (-r[1], r[0]))
        if rows:
            width = max(len(r[0]) for r in rows)
            lines.append(f"  {'rule':<{width}}  matches        ms  bans")
            for name, m, s, b in rows:
                ms = f"{s * 1000:>9.3f}" if self.timed or name == "constant-fold" else f"{'-':>9}"
                lines.append(f"  {name:<{width}} {m:>8} {ms} {b:>5}")
            if not self.timed:
                lines.append("  (time per rule is measured by `nxsat rules stats`)")
        else:
            lines.append("  no rule fired")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level, "sets": list(self.sets), "stop_reason": self.stop_reason,
            "stop_detail": self.stop_detail,
            "seconds": round(self.seconds, 6), "load_seconds": round(self.load_seconds, 6),
            "budget": {"iterations": self.budget.iterations, "seconds": self.budget.seconds,
                       "node_limit": self.budget.node_limit, "match_limit": self.budget.match_limit},
            "initial": {"enodes": self.initial.nodes, "eclasses": self.initial.classes},
            "cse_merged": self.cse_merged,
            "iterations": [{"index": it.index, "enodes": it.enodes, "eclasses": it.eclasses,
                            "seconds": round(it.seconds, 6), "matches": dict(sorted(it.matches.items())),
                            "banned": it.banned} for it in self.iterations],
            "rules": {name: {"matches": self.matches.get(name, 0),
                             "seconds": (round(self.seconds_per_rule.get(name, 0.0), 6)
                                         if self.timed or name == "constant-fold" else None),
                             "bans": self.bans.get(name, 0)} for name in sorted(self.rules)},
        }


@dataclass
class _RuleState:
    limit: int
    ban_length: int
    banned_until: int = 0
    bans: int = 0
    last_found: int = 0  # matches found in the rule's last run
    capped: bool = False  # set aside because its matches would not fit under the node limit


def saturate(eg: EGraph, budget: Budget, rules: Sequence[Rule] | None = None,
             stop_when: Callable[[], bool] | None = None, initial: Sizes | None = None) -> Report:
    """Run the e-graph's rules (or ``rules``, a subset) under ``budget``."""
    active = [r for r in (rules if rules is not None else eg.rules) if not r.builtin]
    fold_on = budget.fold and any(r.name == "constant-fold" for r in (rules or eg.rules + eg.builtins))
    names = [r.name for r in active] + (["constant-fold"] if fold_on else [])
    start = time.perf_counter()
    report = Report(names, budget, initial or eg.sizes(), timed=budget.time_rules)
    state = {r.name: _RuleState(budget.match_limit, budget.ban_length) for r in active}
    prev = report.initial
    report.stop_reason = ITERATION_LIMIT
    held_back = ""
    for it in range(budget.iterations):
        if time.perf_counter() - start >= budget.seconds:
            report.stop_reason = TIME_LIMIT
            break
        t0 = time.perf_counter()
        runnable = [r for r in active if state[r.name].banned_until <= it]
        # An explosive rule may add at most its match limit, and never more than its share of the
        # e-nodes left under the node limit: one iteration cannot overshoot the budget.
        explosive = [r for r in runnable if r.explosive]
        busy = sum(1 for r in explosive if state[r.name].last_found) or len(explosive)
        share = max(1, (budget.node_limit - prev.nodes) // max(1, busy))
        limited: dict[int, list[Rule]] = {}
        for r in explosive:
            limited.setdefault(min(state[r.name].limit, share), []).append(r)
        plain = [r for r in runnable if not r.explosive]
        if budget.time_rules:
            applied, searched, seconds = _run_timed(eg, plain, sorted(limited.items()))
        else:
            applied, searched, _ = _read_report(eg.run_iteration(plain, sorted(limited.items())))
            seconds = {}
        stats = IterationStats(it + 1, 0, 0, 0.0)
        for r in runnable:
            st = state[r.name]
            m = applied.get(r.name, 0)
            found = max(m, searched.get(r.name, 0))
            st.last_found = found
            st.capped = False
            if r.explosive and found > st.limit:
                st.bans += 1
                st.banned_until = it + 1 + st.ban_length
                st.limit *= 2
                st.ban_length *= 2
                stats.banned.append(r.name)
                report.bans[r.name] = st.bans
            elif r.explosive and found > share:
                # Its matches would not fit under the node limit: set it aside while others work.
                st.capped = True
                st.banned_until = it + 1 + st.ban_length
                stats.banned.append(r.name)
                held_back = (f"{r.name} found {found} matches with {budget.node_limit - prev.nodes} "
                             "e-nodes left under the limit")
            if m:
                stats.matches[r.name] = m
                report.matches[r.name] = report.matches.get(r.name, 0) + m
            report.seconds_per_rule[r.name] = report.seconds_per_rule.get(r.name, 0.0) + seconds.get(r.name, 0.0)
        frozen = eg.freeze()
        folded = 0
        if fold_on:
            from nxsat.rules.fold import fold

            tf = time.perf_counter()
            folded = fold(eg, frozen, budget.fold_max_elements, budget.fold_max_input_elements)
            report.seconds_per_rule["constant-fold"] = (report.seconds_per_rule.get("constant-fold", 0.0)
                                                       + time.perf_counter() - tf)
            if folded:
                stats.matches["constant-fold"] = folded
                report.matches["constant-fold"] = report.matches.get("constant-fold", 0) + folded
                frozen = eg.freeze()
        sizes = eg.sizes(frozen)
        stats.enodes, stats.eclasses = sizes.nodes, sizes.classes
        stats.seconds = time.perf_counter() - t0
        report.iterations.append(stats)
        if stop_when is not None and stop_when():
            report.stop_reason = PROVED
            break
        if sizes.nodes > budget.node_limit:
            report.stop_reason, report.stop_detail = NODE_LIMIT, f"{sizes.nodes} e-nodes"
            break
        if sizes == prev and not stats.banned:
            banned = [s for s in state.values() if s.banned_until > it + 1]
            if not banned:
                report.stop_reason, report.stop_detail = SATURATED, ""
                break
            if all(s.capped for s in banned):  # only rules the node limit holds back have work left
                report.stop_reason, report.stop_detail = NODE_LIMIT, held_back
                break
            for s in banned:  # nothing else to do: let the banned rules run now (egg's rule)
                s.banned_until = it + 1
        prev = sizes
    report.seconds = time.perf_counter() - start
    return report


def _run_timed(eg: EGraph, plain: Sequence[Rule], limited: Sequence[tuple[int, Sequence[Rule]]]
               ) -> tuple[dict[str, int], dict[str, int], dict[str, float]]:
    """One iteration with every rule run (and timed) as its own step, the analyses it triggers
    included. Later rules see what earlier ones added: a different order of the same sound
    rewrites, not a different result at saturation."""
    applied: dict[str, int] = {}
    searched: dict[str, int] = {}
    seconds: dict[str, float] = {}
    steps = [(r, eg.run_iteration, ([r],)) for r in plain]
    steps += [(r, eg.run_iteration, ([], [(limit, [r])])) for limit, group in limited for r in group]
    for rule, run, args in steps:
        t0 = time.perf_counter()
        a, s, _ = _read_report(run(*args))
        seconds[rule.name] = time.perf_counter() - t0
        applied.update(a)
        searched.update(s)
    return applied, searched, seconds


def _read_report(run: Any) -> tuple[dict[str, int], dict[str, int], dict[str, float]]:
    """(applied matches, searched matches, seconds) per rule from egglog's RunReport. A rule the
    back-off scheduler cut off shows its search count in the per-iteration reports only."""
    if run is None:
        return {}, {}, {}
    applied = {k: int(v) for k, v in run.num_matches_per_rule.items() if not k.startswith("analysis-")}
    seconds = {k: v.total_seconds() for k, v in run.search_and_apply_time_per_rule.items()
               if not k.startswith("analysis-")}
    searched: dict[str, int] = {}
    for iteration in run.iterations:
        for name, reports in iteration.rule_set_report.rule_reports.items():
            n = max((r.num_matches for r in reports), default=0)
            if n > searched.get(name, 0):
                searched[name] = n
    return applied, searched, seconds

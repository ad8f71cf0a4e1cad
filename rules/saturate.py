"""Bounded saturation: iterations, e-node limit and seconds per -O level, a back-off scheduler, and
a report of every run.

Each iteration runs the analyses to saturation, then every rule that is not banned, once, then
constant folding. Rules marked :explosive (associativity, commutativity) run under egg's back-off
scheduler: a rule that finds more than its match limit in an iteration has those matches dropped
and is banned for ban-length iterations, and each ban doubles its limit and its ban. egglog's own
back-off scheduler drops the matches within the iteration; the bans are kept here on the host,
because egglog's scheduler lives for one command. Each explosive rule's limit is also capped at
its share of the e-nodes left under the node limit (divided by the e-nodes one match can add), so
no iteration overshoots the budget; a rule held back by that cap is set aside for a while. When
nothing else changes the e-graph, held-back rules run one at a time, alone, with all the e-nodes
left (most of their matches are usually old ones: commutativity matches every sum it already
commuted); saturation stops with "node limit" only when even that might not fit. egglog's
scheduler re-finds every match each time (no seminaive evaluation: measured 3-10x slower on
resnet50), so the other rules run seminaively and unscheduled: they add at most a few e-nodes per
e-node of the graph. The matches counted for a rule include matches found again.

The loop stops when every rule ran and nothing changed (saturated), at the iteration limit, at the
node limit, or when the time is up (checked between iterations, so a run can exceed its seconds by
one iteration); hitting a limit is a normal outcome, recorded in the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nxsat.rules.catalog import Catalog, Level, Rule
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
    def for_level(level: Level, initial_nodes: int, match_limit: int, ban_length: int, match_limit_nodes: int = 0,
                  **kw: Any) -> Budget:
        """The level's budget for a model of ``initial_nodes`` e-nodes: the node limit and (with
        ``match_limit_nodes``) the back-off match limit grow with it."""
        if match_limit_nodes:
            match_limit = max(match_limit, match_limit * initial_nodes // match_limit_nodes)
        return Budget(level.iterations, level.seconds, max(level.node_min, int(level.node_factor * initial_nodes)),
                      match_limit, ban_length, **kw)

    @staticmethod
    def for_model(cat: Catalog, level: int, initial_nodes: int, **kw: Any) -> Budget:
        """The budget rules/config.toml gives -O``level`` for a model of ``initial_nodes`` e-nodes."""
        cfg = cat.config
        return Budget.for_level(cat.level(level), initial_nodes, cfg.match_limit, cfg.ban_length,
                                cfg.match_limit_nodes, fold_max_elements=cfg.fold_max_elements,
                                fold_max_input_elements=cfg.fold_max_input_elements, **kw)


@dataclass
class IterationStats:
    index: int
    enodes: int
    eclasses: int
    seconds: float
    matches: dict[str, int] = field(default_factory=dict)
    banned: list[str] = field(default_factory=list)  # by the back-off scheduler
    held: list[str] = field(default_factory=list)  # set aside: their matches might not fit under the node limit


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
        lines.append("  iter   e-nodes  e-classes   seconds  matches  banned (held back: might not fit)")
        for it in self.iterations:
            aside = ", ".join([*it.banned, *(f"({name})" for name in it.held)])
            lines.append(f"  {it.index:>4} {it.enodes:>9} {it.eclasses:>10} {it.seconds:>9.3f} "
                         f"{sum(it.matches.values()):>8}  {aside}".rstrip())
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
                lines.append("  (time per rule: `nxsat rules stats` without --as-compiled)")
            else:
                lines.append("  (each rule ran as its own step to be timed; a compilation runs them together,")
                lines.append("   so its e-graph can grow differently: `nxsat rules stats --as-compiled`)")
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
                            "banned": it.banned, "held": it.held} for it in self.iterations],
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
    seen: int = 0  # matches found when it last ran in full (all applied then: they add nothing again)
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
    solo: Rule | None = None  # a rule the node limit held back, run alone while the others rest
    clean: set[str] = set()  # rules that ran in full on the e-graph as it is now and changed nothing
    for it in range(budget.iterations):
        if time.perf_counter() - start >= budget.seconds:
            report.stop_reason = TIME_LIMIT
            break
        t0 = time.perf_counter()
        runnable = [solo] if solo is not None else [r for r in active if state[r.name].banned_until <= it]
        # An explosive rule may apply at most its match limit, and never more matches than its
        # share of the e-nodes left under the node limit can hold (a match adds at most rhs_nodes
        # e-nodes): one iteration cannot overshoot the budget.
        explosive = [r for r in runnable if r.explosive]
        busy = sum(1 for r in explosive if state[r.name].last_found) or len(explosive)
        left = budget.node_limit - prev.nodes
        share = max(1, left // max(1, busy))
        # A match adds at most rhs_nodes e-nodes; the matches a rule found when it last ran in full
        # were applied then and add nothing now (commutativity finds every sum it already commuted),
        # so a rule may find those again plus the new ones that fit under the node limit.
        fits = {r.name: max(1, share // r.rhs_nodes) for r in explosive}
        caps = {r.name: min(state[r.name].limit, state[r.name].seen + fits[r.name]) for r in explosive}
        limited: dict[int, list[Rule]] = {}
        for r in explosive:
            limited.setdefault(caps[r.name], []).append(r)
        plain = [r for r in runnable if not r.explosive]
        if budget.time_rules:
            applied, searched, seconds = _run_timed(eg, plain, sorted(limited.items()))
        else:
            applied, searched, _ = _read_report(eg.run_iteration(plain, sorted(limited.items())))
            seconds = {}
        stats = IterationStats(it + 1, 0, 0, 0.0)
        too_big = ""  # a rule that cannot fit under the node limit even when it runs alone
        ran_in_full: set[str] = set()
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
            elif r.explosive and found > caps[r.name]:
                # Its matches might not fit under the node limit: set it aside while others work.
                st.capped = True
                st.banned_until = it + 1 + st.ban_length
                stats.held.append(r.name)
                if solo is not None:
                    new = found - st.seen
                    too_big = (f"{r.name} has {new} new matches, which may add up to {new * r.rhs_nodes} "
                               f"e-nodes; {left} are left under the limit")
            else:
                ran_in_full.add(r.name)
                st.seen = found
            if m:
                stats.matches[r.name] = m
                report.matches[r.name] = report.matches.get(r.name, 0) + m
            report.seconds_per_rule[r.name] = report.seconds_per_rule.get(r.name, 0.0) + seconds.get(r.name, 0.0)
        solo = None
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
        if too_big:
            report.stop_reason, report.stop_detail = NODE_LIMIT, too_big
            break
        if sizes != prev:
            clean = set()
        else:
            # Saturated when every rule has run in full on this e-graph and changed nothing.
            clean |= ran_in_full
            waiting = [r for r in active if r.name not in clean]
            if not waiting:
                report.stop_reason, report.stop_detail = SATURATED, ""
                break
            backed_off = [r for r in waiting if not state[r.name].capped]
            if backed_off:  # nothing else to do: let the banned rules run now (egg's rule)
                for r in backed_off:
                    state[r.name].banned_until = min(state[r.name].banned_until, it + 1)
            else:
                # Only rules the node limit held back have work left, and the others are at a
                # fixpoint: run one of them alone, with all the e-nodes left. (Their matches are
                # often mostly old: commutativity matches every sum it already commuted.)
                solo = waiting[0]
                state[solo.name].banned_until = it + 1
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

"""Rule files, rule sets and their configuration: everything about rules that is data.

A rule set is a file ``rules/sets/NAME.egg`` of egglog ``rewrite`` and ``rule`` commands, each
carrying its own metadata as keywords::

    (rewrite (Negate (Negate x)) x
      :name negate-negate :tag exact :doc "-(-x) = x")

``rules/config.toml`` lists the sets, maps ``--model-type`` to sets, and holds the saturation
budget of every ``-O`` level. ``rules/prelude.egg`` holds shared helper relations and macros
(``defmacro``) and ``rules/analysis.egg`` the shape/dtype/splat analyses. This module reads
them, expands macros and compiles each rule to the egglog command the engine runs, recording
where every rule came from so errors point at file:line.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from nxsat.diagnostics import Loc, error
from nxsat.io import read_text
from nxsat.rules import terms
from nxsat.rules.sexp import Atom, SExp, SList, is_sym, read, substitute, sym

HERE = Path(__file__).parent
CONFIG = HERE / "config.toml"
PRELUDE = HERE / "prelude.egg"
ANALYSIS = HERE / "analysis.egg"

EXACT, APPROXIMATE, BUILTIN = "exact", "approximate", "builtin"
TAGS = (EXACT, APPROXIMATE)
NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
MAX_MACRO_DEPTH = 64

# Rule options: keyword -> takes a value?
_OPTIONS = {":name": True, ":tag": True, ":doc": True, ":when": True, ":bound": True, ":explosive": False,
            ":reassociates": False, ":narrows": False, ":distributes": False}


@dataclass(frozen=True)
class Rule:
    """One named rule. ``egglog`` is the compiled command (empty for built-in rules)."""

    name: str
    set: str
    tag: str
    doc: str
    kind: str  # "rewrite" | "rule" | "builtin"
    loc: Loc | None = None
    egglog: str = ""
    lhs: SExp | None = None  # rewrite: the left-hand side (macros expanded)
    facts: tuple[SExp, ...] = ()  # rewrite: the :when facts; rule: the query
    bound: float | None = None  # approximate rules: the largest relative error allowed
    explosive: bool = False  # may grow the e-graph without end (associativity, commutativity)
    source: str = ""
    rhs_nodes: int = 1  # most e-nodes one match can add (constructor calls on the right / in the actions)
    # regroups a floating-point sum or product: equal over the reals, but huge values may overflow in one
    # grouping and not the other, so the checker's trial at the types' extremes leaves it out
    reassociates: bool = False
    # computes in a narrower type, as --auto-cast permits (precision sets): values beyond that type's range
    # overflow there, which the permission accepts, so the checker's extremes trial leaves it out too
    narrows: bool = False
    # moves a product across a sum (a batch norm's scale into a convolution's kernel): equal over the reals,
    # but an infinite factor times a vanishing sum is NaN on one side and infinite on the other, so the
    # checker draws no infinities for it and leaves out the extremes trial
    distributes: bool = False

    @property
    def skips_extremes(self) -> bool:
        return self.reassociates or self.narrows or self.distributes

    @property
    def finite_only(self) -> bool:
        """Inputs drawn without infinities (NaN stays among the special values)."""
        return self.narrows or self.distributes

    @property
    def ruleset(self) -> str:
        return f"rs-{self.name}"

    @property
    def builtin(self) -> bool:
        return self.kind == BUILTIN


@dataclass(frozen=True)
class Level:
    """The saturation budget of one -O level."""

    level: int
    iterations: int
    seconds: float
    node_factor: float  # e-node limit = max(node_min, node_factor * e-nodes after loading)
    node_min: int
    explosive: bool  # run rules tagged :explosive at this level


@dataclass(frozen=True)
class Config:
    sets: dict[str, dict]  # name -> {"file": Path, "description": str}
    model_types: dict[str, tuple[str, ...]]
    levels: dict[int, Level]
    match_limit: int
    ban_length: int
    fold_max_elements: int
    fold_max_input_elements: int
    builtins: dict[str, dict]
    default_model_type: str = "generic"
    match_limit_nodes: int = 1000  # the match limit is per this many e-nodes after loading (at least one)


@dataclass
class Catalog:
    """All rules of all configured sets, in file order, plus the shared prelude and analysis."""

    config: Config
    rules: list[Rule] = field(default_factory=list)
    macros: dict[str, tuple[tuple[str, ...], SExp, Loc | None]] = field(default_factory=dict)
    prelude: list[str] = field(default_factory=list)  # egglog commands (declarations)
    analysis: list[str] = field(default_factory=list)  # egglog rule commands (ruleset "analysis")

    def by_name(self) -> dict[str, Rule]:
        return {r.name: r for r in self.rules}

    def set_rules(self, names: Iterable[str]) -> list[Rule]:
        wanted = list(names)
        for s in wanted:
            if s not in self.config.sets:
                raise error("NCC_ERUL003", f"unknown rule set {s!r}",
                            hint=f"sets: {', '.join(sorted(self.config.sets))}")
        return [r for r in self.rules if r.set in wanted]

    def sets_for(self, model_type: str | None) -> tuple[str, ...]:
        mt = model_type or self.config.default_model_type
        if mt not in self.config.model_types:
            raise error("NCC_ERUL003", f"unknown model type {mt!r}",
                        hint=f"model types: {', '.join(sorted(self.config.model_types))}")
        return self.config.model_types[mt]

    def select(self, model_type: str | None = None, level: int = 2, allow_approximate: bool = False,
               exact_only: bool = False) -> list[Rule]:
        """The rules a compilation runs: the model type's sets, filtered by tag and -O level."""
        lv = self.level(level)
        out = []
        for r in self.set_rules(self.sets_for(model_type)):
            if r.tag == APPROXIMATE and (exact_only or not allow_approximate):
                continue
            if r.explosive and not lv.explosive:
                continue
            out.append(r)
        return out

    def level(self, level: int) -> Level:
        if level not in self.config.levels:
            raise error("NCC_EARG002", f"unknown optimization level -O{level}",
                        hint=f"levels: {', '.join(f'-O{k}' for k in sorted(self.config.levels))}")
        return self.config.levels[level]

    def find(self, names: Iterable[str]) -> list[Rule]:
        table = self.by_name()
        out = []
        for n in names:
            if n not in table:
                close = difflib.get_close_matches(n, list(table), n=3) or [k for k in table if n in k][:3]
                raise error("NCC_ERUL003", f"unknown rule {n!r}",
                            hint=f"did you mean {', '.join(close)}?" if close else "see nxsat rules list")
            out.append(table[n])
        return out


# --- reading files -----------------------------------------------------------------------------

def _loc(x: SExp, fallback: Loc | None = None) -> Loc | None:
    return x.loc or fallback


def _parse_defmacro(form: SList, macros: dict) -> None:
    items = form.items
    if len(items) != 3 or not isinstance(items[1], SList) or not items[1].items or \
            not all(is_sym(p) for p in items[1].items):
        raise error("NCC_ERUL001", "defmacro is (defmacro (NAME PARAM ...) BODY)", form.loc)
    name = items[1].items[0].text  # type: ignore[union-attr]
    params = tuple(p.text for p in items[1].items[1:])  # type: ignore[union-attr]
    if name in macros:
        raise error("NCC_ERUL002", f"macro {name} is defined twice (first at {macros[name][2]})", form.loc)
    if len(set(params)) != len(params):
        raise error("NCC_ERUL002", f"macro {name} repeats a parameter", form.loc)
    macros[name] = (params, items[2], form.loc)


def expand(x: SExp, macros: dict, depth: int = 0) -> SExp:
    """Expand macro calls everywhere in ``x`` (inner calls after substitution)."""
    if isinstance(x, Atom):
        return x
    if depth > MAX_MACRO_DEPTH:
        raise error("NCC_ERUL002", f"macro expansion deeper than {MAX_MACRO_DEPTH} (a macro that calls itself?)",
                    x.loc)
    head = x.head
    if head in macros and isinstance(x.items[0], Atom) and x.items[0].kind == "sym":
        params, body, _where = macros[head]
        args = x.items[1:]
        if len(args) != len(params):
            raise error("NCC_ERUL002", f"macro {head} takes {len(params)} argument(s), got {len(args)}", x.loc)
        body = substitute(body, dict(zip(params, (expand(a, macros, depth + 1) for a in args))))
        return expand(_relocate(body, x.loc), macros, depth + 1)
    return SList(tuple(expand(i, macros, depth + 1) for i in x.items), x.loc)


def _relocate(x: SExp, loc: Loc | None) -> SExp:
    """A macro's body reports errors at the call site."""
    if isinstance(x, Atom):
        return x if x.loc is None else Atom(x.text, x.kind, loc)
    return SList(tuple(_relocate(i, loc) for i in x.items), loc)


def _options(form: SList, start: int) -> dict[str, SExp | None]:
    opts: dict[str, SExp | None] = {}
    items = form.items
    i = start
    while i < len(items):
        key = items[i]
        if not is_sym(key) or not key.text.startswith(":"):  # type: ignore[union-attr]
            raise error("NCC_ERUL001", f"expected a :keyword, found {key}", _loc(key, form.loc))
        k = key.text  # type: ignore[union-attr]
        if k not in _OPTIONS:
            raise error("NCC_ERUL002", f"unknown rule option {k}",
                        _loc(key, form.loc), f"options: {' '.join(sorted(_OPTIONS))}")
        if k in opts:
            raise error("NCC_ERUL002", f"option {k} given twice", _loc(key, form.loc))
        if _OPTIONS[k]:
            if i + 1 >= len(items):
                raise error("NCC_ERUL001", f"option {k} needs a value", _loc(key, form.loc))
            opts[k] = items[i + 1]
            i += 2
        else:
            opts[k] = None
            i += 1
    return opts


def _compile_rule(form: SList, set_name: str, macros: dict) -> Rule:
    kind = form.head
    assert kind in ("rewrite", "rule")
    if len(form.items) < 3:
        raise error("NCC_ERUL001", f"({kind} ...) needs two parts before its options", form.loc)
    opts = _options(form, 3)
    name_x = opts.get(":name")
    if name_x is None:
        raise error("NCC_ERUL002", f"this {kind} has no :name", form.loc, "every rule needs :name :tag :doc")
    name = name_x.text if isinstance(name_x, Atom) else ""
    if not NAME_RE.match(name):
        raise error("NCC_ERUL002", f"rule name {name_x} must be lowercase words joined by '-'", _loc(name_x, form.loc))
    tag_x = opts.get(":tag")
    if tag_x is None or not isinstance(tag_x, Atom) or tag_x.text not in TAGS:
        raise error("NCC_ERUL002", f"rule {name}: :tag must be exact or approximate", form.loc)
    doc_x = opts.get(":doc")
    if doc_x is None or not isinstance(doc_x, Atom) or doc_x.kind != "str" or not doc_x.text.strip() \
            or "\n" in doc_x.text:
        raise error("NCC_ERUL002", f"rule {name}: :doc must be a one-line string", form.loc)
    bound = None
    if ":bound" in opts:
        b = opts[":bound"]
        if not isinstance(b, Atom) or b.kind not in ("int", "float") or not 0 < float(b.text) < 1:
            raise error("NCC_ERUL002", f"rule {name}: :bound must be a relative error between 0 and 1", form.loc)
        bound = float(b.text)
    if tag_x.text == APPROXIMATE and bound is None:
        raise error("NCC_ERUL002", f"approximate rule {name} needs :bound (its largest relative error)", form.loc)
    if tag_x.text == EXACT and bound is not None:
        raise error("NCC_ERUL002", f"exact rule {name} cannot have a :bound", form.loc)
    ruleset = f"rs-{name}"
    a, b = expand(form.items[1], macros), expand(form.items[2], macros)
    tail = [sym(":ruleset"), sym(ruleset), sym(":name"), Atom(name, "str")]
    lhs: SExp | None = None
    if kind == "rewrite":
        lhs = a
        when = opts.get(":when")
        facts: tuple[SExp, ...] = ()
        if when is not None:
            if not isinstance(when, SList):
                raise error("NCC_ERUL001", f"rule {name}: :when takes a list of facts", form.loc)
            facts = tuple(expand(f, macros) for f in when.items)
            tail = [sym(":when"), SList(facts), *tail]
        command = SList((sym("rewrite"), a, b, *tail), form.loc)
    else:
        if not isinstance(a, SList) or not isinstance(b, SList):
            raise error("NCC_ERUL001", f"rule {name}: (rule (FACTS) (ACTIONS) ...)", form.loc)
        facts = a.items
        command = SList((sym("rule"), a, b, *tail), form.loc)
    return Rule(name, set_name, tag_x.text, doc_x.text.strip(), kind, form.loc, str(command), lhs, facts,
                bound, ":explosive" in opts, str(form), max(1, _constructor_calls(b)), ":reassociates" in opts,
                ":narrows" in opts, ":distributes" in opts)


def _constructor_calls(x: SExp) -> int:
    """How many term constructors (e-nodes) an expression builds: the saturation budget's unit."""
    if isinstance(x, Atom):
        return 0
    own = 1 if x.head in terms.BY_CTOR or x.head in ("TCons", "TNil") else 0
    return own + sum(_constructor_calls(i) for i in x.items)


def parse_set(text: str, filename: str, set_name: str, macros: dict) -> tuple[list[Rule], list[str]]:
    """Rules and declarations (relations, functions) of one rule-set file."""
    rules: list[Rule] = []
    decls: list[str] = []
    local = dict(macros)
    for form in read(text, filename):
        if not isinstance(form, SList) or form.head is None:
            raise error("NCC_ERUL001", f"expected a (form), found {form}", form.loc)
        head = form.head
        if head == "defmacro":
            _parse_defmacro(form, local)
        elif head in ("rewrite", "rule"):
            rules.append(_compile_rule(form, set_name, local))
        elif head in ("relation", "function"):
            decls.append(str(expand(form, local)))
        elif head == "birewrite":
            raise error("NCC_ERUL002", "birewrite is not used here: write the two directions as two named rewrites",
                        form.loc)
        else:
            raise error("NCC_ERUL002", f"({head} ...) cannot appear in a rule set",
                        form.loc, "a set holds rewrite, rule, defmacro, relation and function forms")
    return rules, decls


def parse_prelude(text: str, filename: str) -> tuple[list[str], dict]:
    macros: dict = {}
    decls: list[str] = []
    for form in read(text, filename):
        if isinstance(form, SList) and form.head == "defmacro":
            _parse_defmacro(form, macros)
        elif isinstance(form, SList):
            decls.append(str(expand(form, macros)))
        else:
            raise error("NCC_ERUL001", f"expected a (form), found {form}", form.loc)
    return decls, macros


def parse_analysis(text: str, filename: str, macros: dict) -> list[str]:
    out = []
    for i, form in enumerate(read(text, filename)):
        if not isinstance(form, SList) or form.head != "rule" or len(form.items) != 3:
            raise error("NCC_ERUL001", "analysis.egg holds (rule (FACTS) (ACTIONS)) forms only",
                        getattr(form, "loc", None))
        body = expand(form, macros)
        assert isinstance(body, SList)
        out.append(str(SList((*body.items, sym(":ruleset"), sym("analysis"), sym(":name"),
                              Atom(f"analysis-{i}", "str")), form.loc)))
    return out


# --- configuration -----------------------------------------------------------------------------

def _cfg_error(msg: str) -> Exception:
    return error("NCC_ERUL004", f"{CONFIG.name}: {msg}", Loc(str(CONFIG)))


def parse_config(text: str, base: Path = HERE) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _cfg_error(str(exc)) from None
    sets: dict[str, dict] = {}
    for name, spec in sorted(raw.get("sets", {}).items()):
        if not isinstance(spec, dict) or "file" not in spec:
            raise _cfg_error(f"[sets.{name}] needs file = \"sets/{name}.egg\"")
        if not NAME_RE.match(name):
            raise _cfg_error(f"set name {name!r} must be lowercase words joined by '-'")
        sets[name] = {"file": base / spec["file"], "description": str(spec.get("description", ""))}
    model_types: dict[str, tuple[str, ...]] = {}
    for mt, names in sorted(raw.get("model-types", {}).items()):
        if not isinstance(names, list) or not all(n in sets for n in names):
            raise _cfg_error(f"model type {mt}: {names!r} must be a list of configured sets")
        model_types[mt] = tuple(names)
    levels: dict[int, Level] = {}
    for key, spec in raw.get("levels", {}).items():
        try:
            lv = Level(int(key), int(spec["iterations"]), float(spec["seconds"]), float(spec["node-factor"]),
                       int(spec["node-min"]), bool(spec.get("explosive", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise _cfg_error(f"[levels.{key}]: {exc}") from None
        if lv.iterations < 0 or lv.seconds <= 0 or lv.node_factor < 1 or lv.node_min < 1:
            raise _cfg_error(f"[levels.{key}]: budgets must be positive")
        levels[lv.level] = lv
    sched = raw.get("backoff", {})
    fold = raw.get("fold", {})
    default_mt = str(raw.get("default-model-type", "generic"))
    if default_mt not in model_types:
        raise _cfg_error(f"default-model-type {default_mt!r} is not a model type")
    builtins = raw.get("builtin", {})
    for name, spec in builtins.items():
        if spec.get("set") not in sets:
            raise _cfg_error(f"[builtin.{name}] needs set = one of the configured sets")
    return Config(sets, model_types, levels, int(sched.get("match-limit", 1000)), int(sched.get("ban-length", 2)),
                  int(fold.get("max-elements", 256)), int(fold.get("max-input-elements", 4096)), builtins,
                  default_mt, int(sched.get("match-limit-nodes", 1000)))


def build_catalog(config_text: str | None = None, extra_files: Iterable[tuple[str, str, str]] = (),
                  base: Path = HERE) -> Catalog:
    """Read config, prelude, analysis and every set; ``extra_files`` = (set, filename, text) to add.
    An extra file of a configured set replaces that set's file (an edited copy of a shipped set)."""
    extra_files = list(extra_files)
    config = parse_config(config_text if config_text is not None else read_text(CONFIG), base)
    prelude, macros = parse_prelude(read_text(PRELUDE), _shown(PRELUDE))
    cat = Catalog(config, macros=macros, prelude=prelude)
    cat.analysis = parse_analysis(read_text(ANALYSIS), _shown(ANALYSIS), macros)
    seen: dict[str, Rule] = {}

    def add(rules: list[Rule]) -> None:
        for r in rules:
            if r.name in seen:
                raise error("NCC_ERUL002", f"rule name {r.name} is used twice (first at {seen[r.name].loc})", r.loc)
            seen[r.name] = r
            cat.rules.append(r)

    replaced = {set_name for set_name, _f, _t in extra_files if set_name in config.sets}
    for name, spec in config.sets.items():
        if name in replaced:
            continue
        path = spec["file"]
        rules, decls = parse_set(read_text(path), _shown(path), name, macros)
        cat.prelude.extend(decls)
        add(rules)
    for name, spec in sorted(config.builtins.items()):
        add([Rule(name, spec["set"], EXACT, str(spec.get("doc", "")), BUILTIN)])
    for set_name, filename, text in extra_files:
        if set_name in replaced:
            config.sets[set_name] = {**config.sets[set_name], "file": Path(filename)}
        else:
            config.sets[set_name] = {"file": Path(filename), "description": "(from --file)"}
        rules, decls = parse_set(text, filename, set_name, macros)
        cat.prelude.extend(decls)
        add(rules)
    return cat


def _shown(path: Path) -> str:
    """How diagnostics name a shipped file: rules/sets/generic.egg, wherever nxsat is installed."""
    try:
        return str(Path("rules") / Path(path).resolve().relative_to(HERE.resolve()))
    except ValueError:
        return str(path)


@cache
def catalog() -> Catalog:
    """The shipped rules (read once per process)."""
    return build_catalog()


def rule_file_set(path: str) -> str:
    """The set a rule file given with --file belongs to: its file name without .egg (so a copy of
    rules/sets/generic.egg named generic.egg stands in for the shipped generic set)."""
    stem = Path(path).stem
    return stem if NAME_RE.match(stem) else "file"


__all__ = ["Catalog", "Config", "Level", "Rule", "build_catalog", "catalog", "expand", "SExp"]

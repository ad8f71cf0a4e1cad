"""Rule authoring and equivalence: ``nxsat rules list|check|stats|terms`` and ``nxsat check A B``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nxsat.diagnostics import NxsatError, error


def _catalog(files: list[str] | None = None) -> Any:
    from nxsat.io import read_text
    from nxsat.rules.catalog import build_catalog, catalog, rule_file_set

    if not files:
        return catalog()
    return build_catalog(extra_files=[(rule_file_set(f), f, read_text(f)) for f in files])


def _level(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"-O takes 1, 2 or 3, not {value!r}") from None
    if n not in (1, 2, 3):
        raise argparse.ArgumentTypeError(f"-O takes 1, 2 or 3, not {n}")
    return n


# --- rules list --------------------------------------------------------------------------------

def cmd_list(args: argparse.Namespace) -> int:
    cat = _catalog(args.file)
    if args.model_type:
        rules = cat.set_rules(cat.sets_for(args.model_type))
    elif args.set:
        rules = cat.set_rules(args.set)
    else:
        rules = list(cat.rules)
    if args.json:
        print(json.dumps([{"name": r.name, "set": r.set, "tag": r.tag, "kind": r.kind, "explosive": r.explosive,
                           "bound": r.bound, "description": r.doc, "where": str(r.loc) if r.loc else "built in"}
                          for r in rules], indent=2))
        return 0
    if not rules:
        print("no rules")
        return 0
    wn = max(len(r.name) for r in rules)
    ws = max(len(r.set) for r in rules)
    for r in rules:
        tag = r.tag + ("*" if r.explosive else "")
        kind = " (built in)" if r.builtin else ""
        print(f"{r.name:<{wn}}  {r.set:<{ws}}  {tag:<12} {r.doc}{kind}")
    if any(r.explosive for r in rules):
        print("* explosive: runs from -O2 under the back-off scheduler", file=sys.stderr)
    return 0


# --- rules check -------------------------------------------------------------------------------

def cmd_check_rules(args: argparse.Namespace) -> int:
    from nxsat.rules.checker import check_rules

    cat = _catalog(args.file)
    if args.names:
        rules = cat.find(args.names)
    elif args.file:
        from nxsat.rules.catalog import rule_file_set

        sets = {rule_file_set(f) for f in args.file}
        rules = [r for r in cat.rules if r.set in sets and r.loc is not None and str(r.loc.file) in args.file]
        if not rules:
            raise error("NCC_ERUL003", f"no rules in {', '.join(args.file)}")
    else:
        rules = list(cat.rules)
    results = check_rules(rules, cat, seed=args.seed, wanted=args.instances,
                          progress=None if args.json else lambda r: print(r.format(), flush=True))
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    if args.json:
        print(json.dumps([{"name": r.rule.name, "status": r.status, "fired": r.fired, "tried": r.tried,
                           "types": r.types, "message": r.message,
                           "counterexample": r.counterexample.format() if r.counterexample else None}
                          for r in results], indent=2))
    else:
        print(f"{len(results)} rule(s): " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    failed = counts.get("unsound", 0) + counts.get("error", 0)
    if counts.get("untested", 0) and not args.allow_untested:
        failed += counts["untested"]
    return 1 if failed else 0


# --- rules stats -------------------------------------------------------------------------------

def cmd_stats(args: argparse.Namespace) -> int:
    from nxsat.cli.model import load_model, print_warnings
    from nxsat.rules import optimize

    module = load_model(args)
    n_in = len(module.entry.post_order())
    extra: tuple[str, ...] = ()
    cat = None
    if args.file:
        from nxsat.rules.catalog import rule_file_set

        cat = _catalog(args.file)
        extra = tuple(dict.fromkeys(rule_file_set(f) for f in args.file))
    result = optimize(module, args.model_type, args.O, allow_approximate=args.allow_approximate, cat=cat,
                      extra_sets=extra, time_rules=True)
    n_out = len(result.module.entry.post_order())
    print_warnings(module)
    if args.json:
        data = result.report.to_json()
        data["extracted_nodes"] = n_out
        print(json.dumps(data, indent=2))
        return 0
    print(f"{module.name}: {n_in} instructions")
    print(result.report.format(all_rules=args.all))
    print(f"extracted (smallest): {n_out} instructions in the entry computation")
    return 0


# --- rules terms -------------------------------------------------------------------------------

def cmd_terms(args: argparse.Namespace) -> int:
    from nxsat.rules import terms

    rows = [(t.signature(), t.op or "-", t.doc) for t in terms.TERMS.values() if t.op != "constant"]
    rows.append(("(Constant i64:key)", "constant", terms.TERMS["constant"].doc))
    rows.append(("(Fill String:value String:dtype IVec:shape)", "-", terms.FILL.doc))
    rows.append(("(Opaque String:op i64:key TList:operands)", "-", terms.OPAQUE.doc))
    width = min(48, max(len(r[0]) for r in rows))
    for sig, op, doc in sorted(set(rows)):
        if len(sig) > width:
            print(f"{sig}\n{'':<{width}}  {op}: {doc}")
        else:
            print(f"{sig:<{width}}  {op}: {doc}")
    print("lists: (TNil) (TCons T TList); analyses: (shape T) -> IVec, (dtype T) -> String, "
          "(splat T) -> String")
    return 0


# --- check A B ---------------------------------------------------------------------------------

def cmd_equiv(args: argparse.Namespace) -> int:
    """Exit 0 equivalent, 1 not equivalent, 2 unknown; 3 when a graph cannot be read."""
    from nxsat.frontend import load
    from nxsat.rules.equiv import check_equivalence

    try:
        a = load(args.a, args.framework)
        b = load(args.b, args.framework)
        result = check_equivalence(a, b, model_type=args.model_type, level=args.O, trials=args.trials,
                                   seed=args.seed)
    except NxsatError as exc:
        if args.debug:
            raise
        print(exc.format(), file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(result.format())
        if args.verbose and result.report is not None:
            print(result.report.format())
    return result.exit_code


def register(sub: Any) -> None:
    from nxsat.cli.model import add_model_arguments

    rules = sub.add_parser("rules", help="list, check and measure rewrite rules",
                           description="The rule-authoring workflow: list the rules, check that they are "
                           "sound, and see how they behave on a model. Guide: docs/rules.md.")
    rsub = rules.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", required=True,
                                parser_class=rules.__class__)

    p = rsub.add_parser("list", help="name, set, tag and description of every rule")
    p.add_argument("--model-type", metavar="T", help="only the sets this model type runs")
    p.add_argument("--set", action="append", metavar="S", help="only this rule set (repeatable)")
    p.add_argument("--file", action="append", metavar="F", help="also read rules from this file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)

    p = rsub.add_parser("check", help="test rules for soundness on random instances",
                        description="Parse and type-check rules, then run each on random instances of its "
                        "left-hand side (several shapes and element types) and compare every rewritten term "
                        "with the reference interpreter. An unsound rule is shown with a counterexample. "
                        "Exit status 1 if any rule is unsound, rejected, or never fired (untested).")
    p.add_argument("names", nargs="*", metavar="NAME", help="rules to check (default: all, or those of --file)")
    p.add_argument("--file", action="append", metavar="F", help="check the rules of this file")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--instances", type=int, default=4, metavar="N",
                   help="stop once a rule has fired in N instances (default 4)")
    p.add_argument("--allow-untested", action="store_true", help="a rule that never fired does not fail")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_check_rules)

    p = rsub.add_parser("stats", help="saturate a model and report what the rules did",
                        description="Load MODEL, saturate it with the rules of its model type at -O N, and "
                        "report which rules fired and how often, the e-graph's growth per iteration, time, "
                        "and why saturation stopped.")
    add_model_arguments(p)
    p.add_argument("--model-type", metavar="T", help="generic (default), transformer, unet-inference")
    p.add_argument("-O", type=_level, default=2, metavar="N", help="optimization level 1, 2, 3 (default 2)")
    p.add_argument("--allow-approximate", action="store_true", help="also run approximate rules")
    p.add_argument("--file", action="append", metavar="F", help="also run the rules of this file")
    p.add_argument("--all", action="store_true", help="list every rule, fired or not")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_stats)

    p = rsub.add_parser("terms", help="the term language rules are written in")
    p.set_defaults(func=cmd_terms)

    p = sub.add_parser("check", help="are two graphs equivalent? proof or counterexample",
                       description="Load A and B (same inputs and outputs) into one e-graph and saturate with "
                       "the exact rules. Prints 'equivalent (proved)' when every output shares an e-class, "
                       "else searches for a counterexample with the reference interpreter: 'not equivalent' "
                       "with the inputs and both results, or 'unknown'. Exit status 0 / 1 / 2 for the three "
                       "answers, 3 when a graph cannot be read.")
    p.add_argument("a", metavar="A", help="first graph (.hlo or .relay)")
    p.add_argument("b", metavar="B", help="second graph")
    p.add_argument("--framework", choices=["XLA", "RELAY"], type=str.upper, help="input format of both")
    p.add_argument("--model-type", metavar="T", help="which rule sets to use (default generic)")
    p.add_argument("-O", type=_level, default=2, metavar="N", help="saturation budget level (default 2)")
    p.add_argument("--trials", type=int, default=20, metavar="N", help="random trials for a counterexample")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verbose", "-v", action="store_true", help="also print the saturation report")
    p.set_defaults(func=cmd_equiv)

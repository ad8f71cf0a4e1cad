"""Rule authoring and equivalence: ``nxsat rules list|check|stats|terms`` and ``nxsat check A B``."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Any

from nxsat.cli.common import count_arg
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
    from nxsat.extract import optimize

    module = load_model(args)
    n_in = len(module.entry.post_order())
    extra: tuple[str, ...] = ()
    cat = None
    if args.file:
        from nxsat.rules.catalog import rule_file_set

        cat = _catalog(args.file)
        extra = tuple(dict.fromkeys(rule_file_set(f) for f in args.file))
    result = optimize(module, args.model_type, args.O, allow_approximate=args.allow_approximate, cat=cat,
                      extra_sets=extra, time_rules=not args.as_compiled)
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
    if args.savings:
        print(_savings(args))
    return 0


def _savings(args: argparse.Namespace) -> str:
    """What each rule of the model type's own sets buys: the model compiled (as `nxsat compile` does) with
    every rule, then once per rule that matched with that rule left out; the simulated latency each
    removal adds. Rules overlap (a scale folded into a softmax needs the softmax), so the savings do not
    add up to the whole."""
    from dataclasses import replace

    from nxsat.driver import CompileOptions, compile_model

    opts = CompileOptions(framework=args.framework, target=args.target, model_type=args.model_type or "generic",
                          auto_cast=args.auto_cast, optlevel=args.O, relay_constants=args.relay_constants)
    full = compile_model(args.model, opts).report
    fired = full["egraph"]["model_type_rules"]
    lines = [f"savings ({opts.target}, -O{opts.optlevel}, --auto-cast {opts.auto_cast}; simulated): "
             f"{full['latency_us']:,.1f} us with every rule, roofline {full['roofline_us']:,.2f} us"]
    if not fired:
        lines.append("  no rule of the model type's own sets matched" if opts.model_type != "generic"
                     else "  measured for the rules a --model-type adds to generic; give one")
    for name, matches in fired.items():
        without = compile_model(args.model, replace(opts, disabled_rules=(name,))).report["latency_us"]
        saved = without - full["latency_us"]
        lines.append(f"  {name:<24} matched {matches:>4}  without it {without:>12,.1f} us  saves {saved:>10,.1f} us "
                     f"({saved / without:.1%})" if without else f"  {name:<24} matched {matches:>4}")
    return "\n".join(lines)


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

def _load_graph(path: str, framework: str | None, constants: str | None, seed: int) -> Any:
    """One graph of ``nxsat check``; Relay graphs take their constants and the seed."""
    from nxsat.frontend import load

    if framework == "RELAY" or (framework is None and str(path).endswith(".relay")):
        options: dict[str, Any] = {"seed": seed}
        if constants:
            options["relay_constants"] = constants
        return load(path, framework, **options)
    return load(path, framework)


def cmd_equiv(args: argparse.Namespace) -> int:
    """Exit 0 equivalent, 1 not equivalent, 2 unknown; 3 when a graph cannot be read."""
    from nxsat.rules.equiv import check_equivalence

    try:
        a = _load_graph(args.a, args.framework, args.relay_constants, args.seed)
        b = _load_graph(args.b, args.framework, args.relay_constants_b or args.relay_constants, args.seed)
        result = check_equivalence(a, b, model_type=args.model_type, level=args.O, trials=args.trials,
                                   seed=args.seed)
    except NxsatError as exc:
        if exc.code.startswith("NCC_I"):
            raise  # a bug in nxsat, not an unreadable graph: exit 70 as every command does
        if args.debug:
            traceback.print_exc()
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
    p.add_argument("--instances", type=count_arg(1), default=4, metavar="N",
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
    p.add_argument("--as-compiled", action="store_true",
                   help="run the rules together, as a compilation does (its exact e-graph growth; no time "
                        "per rule: by default each rule runs as its own step to be timed)")
    p.add_argument("--savings", action="store_true",
                   help="also compile MODEL once with every rule and once without each rule of the model type's "
                        "own sets that matched, and print the simulated time each saves (slow: a compile each)")
    p.add_argument("--target", default="trn1", help="with --savings: the device (default trn1)")
    p.add_argument("--auto-cast", default="none", choices=["none", "matmult", "all"],
                   help="with --savings: as nxsat compile's (default none)")
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
    p.add_argument("--trials", type=count_arg(0), default=20, metavar="N",
                   help="random trials for a counterexample (default 20)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed of the trials and of Relay constants given as [shape, dtype] (default 0)")
    p.add_argument("--relay-constants", metavar="FILE",
                   help="Relay: values of meta[relay.Constant][i] (.npz or JSON), for A and B")
    p.add_argument("--relay-constants-b", metavar="FILE", help="Relay: B's constants, when not the same as A's")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verbose", "-v", action="store_true", help="also print the saturation report")
    p.set_defaults(func=cmd_equiv)
    _usage_error_exits(p, 3)  # 2 means "unknown" here


def _usage_error_exits(parser: argparse.ArgumentParser, status: int) -> None:
    """Make every usage error of ``parser`` (unknown options included, which argparse otherwise
    leaves to the top-level parser) exit with ``status``; the message stays the shared one."""
    report, parse_known = parser.error, parser.parse_known_args

    def error(message: str) -> None:
        try:
            report(message)
        except SystemExit:
            raise SystemExit(status) from None

    def parse_known_args(args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = parse_known(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]

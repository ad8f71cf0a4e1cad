"""``nxsat compile``: a model in, a NEFF and a report out, with neuronx-cc's flags (docs/compiling.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from nxsat.diagnostics import NxsatError, Warnings

VERBOSE = ("debug", "info", "warning", "error", "critical")


def cmd_compile(args: argparse.Namespace) -> int:
    from nxsat.driver import CompileOptions, compile_model, format_report
    from nxsat.io import atomic_write, check_output
    from nxsat.progress import Progress

    warnings = Warnings()
    if args.enable_experimental_o1:
        warnings.warn("NCC_WARG001", "--enable-experimental-O1 is deprecated: use -O1 (compiling at -O1)")
        args.O = 1
    outputs = [args.output, args.report, args.logfile]
    for k, path in enumerate(outputs):
        if path:
            check_output(path, inputs=[args.model, args.relay_constants], outputs=outputs[:k])
    opts = CompileOptions(
        framework=args.framework, target=args.target, model_type=args.model_type, auto_cast=args.auto_cast,
        auto_cast_type=args.auto_cast_type, mixed_precision_accumulation=args.mixed_precision_accumulation,
        saturate_infinity=args.enable_saturate_infinity, optlevel=args.O,
        distribution_strategy=args.distribution_strategy, lnc=args.lnc, num_parallel_jobs=args.num_parallel_jobs,
        extractor=args.extractor, precision=args.precision, layout=args.layout, forward=not args.disable_forwarding,
        workdir=args.workdir,
        disabled_rules=tuple(args.disable_rule or ()),
        relay_constants=args.relay_constants,
        fill_elided_constants=args.seed if args.fill_elided_constants else None, flags=tuple(args.flags_given))
    log: list[str] = [f"nxsat compile {' '.join(args.flags_given)}"]
    t0 = time.perf_counter()
    try:
        with Progress() as progress:
            result = compile_model(args.model, opts, progress)
    except NxsatError as exc:
        log.append(exc.format())
        _write_log(args.logfile, log, atomic_write)
        raise
    warnings.extend(result.warnings)
    atomic_write(args.output, result.neff)
    rep = result.report
    if args.report:
        atomic_write(args.report, json.dumps(rep, indent=2, sort_keys=True) + "\n")
    level = VERBOSE.index(args.verbose)
    if level <= VERBOSE.index("warning"):
        warnings.print(sys.stderr)
    text = format_report(rep)
    if level <= VERBOSE.index("info"):
        print(text)
        print(f"wrote {args.output} ({len(result.neff):,} bytes) in {time.perf_counter() - t0:.2f} s"
              + (f"; report in {args.report}" if args.report else ""))
    log += [w.format() for w in warnings] + [text, f"wrote {args.output}"]
    _write_log(args.logfile, log, atomic_write)
    return 0


def _write_log(path: str | None, lines: list[str], write: Any) -> None:
    if path:
        write(path, "\n".join(lines) + "\n")


class _Flags(argparse.Action):
    """``--enable-X`` / ``--disable-X`` pairs: the right-most one wins, as neuronx-cc's flags do."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(ns, self.dest, bool(option_string and option_string.startswith("--enable")))


def register(sub: Any) -> None:
    """Add ``compile`` to the CLI's subparsers."""
    from nxsat.cli.model import add_elided_argument
    from nxsat.driver import AUTO_CAST, AUTO_CAST_TYPES, EXTRACTORS, LAYOUT_MODES, PRECISION_MODES

    p = sub.add_parser(
        "compile", help="compile a model to a NEFF: the device program, checked, with a report of its cost",
        description="Compile an HLO or Relay model for a Neuron device: front end, e-graph saturation with the "
        "model type's rules, extraction, the --auto-cast policy, lowering to NeuronCore instructions, scheduling "
        "and placement, a verified NEFF, and the simulated latency beside the roofline. Flags are also read "
        "from NEURON_CC_FLAGS (before the command line's: the right-most flag wins). See docs/compiling.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="HLO text (.hlo) or Relay text (.relay)")
    p.add_argument("--framework", choices=["XLA", "RELAY"], type=str.upper,
                   help="input format (default: from the file name and its first line)")
    p.add_argument("--target", default="trn1", metavar="T",
                   help="instance family: trn1, trn1n, inf2 or trn2 (default trn1)")
    p.add_argument("--model-type", default="generic", choices=["generic", "transformer", "unet-inference"],
                   help="model-specific rule sets on top of generic (default generic)")
    p.add_argument("--auto-cast", default="none", choices=AUTO_CAST,
                   help="which fp32 operations may run in a lower precision: none (default), matmult (TensorE "
                   "operations), all (every fp32 operation); inputs and outputs keep their types")
    p.add_argument("--auto-cast-type", default="bf16", choices=AUTO_CAST_TYPES,
                   help="the lower precision (default bf16); fp8_e4m3 saturates at +-448: values must fit")
    p.add_argument("--enable-mixed-precision-accumulation", "--disable-mixed-precision-accumulation",
                   dest="mixed_precision_accumulation", nargs=0, action=_Flags, default=True,
                   help="reductions accumulate in fp32 and cast the result (enabled by default)")
    p.add_argument("--enable-saturate-infinity", action="store_true",
                   help="turn +-inf into the largest finite values before operations that would make NaN")
    p.add_argument("-O", "--optlevel", dest="O", type=int, default=2, choices=[1, 2, 3],
                   help="1: shortest compile; 2 (default): balanced; 3: most exploration, longest compile")
    p.add_argument("--enable-experimental-O1", dest="enable_experimental_o1", action="store_true",
                   help="deprecated: means -O1 (with a warning)")
    p.add_argument("--distribution-strategy", choices=["llm-training", "NEMO"],
                   help="accepted and recorded in the report (parameter sharding across data-parallel workers)")
    p.add_argument("--logical-nc-config", "-lnc", dest="lnc", type=int, metavar="N",
                   help="trn2: 1 or 2 physical cores per logical core (default 2); trn1, trn1n and inf2 take only 1")
    p.add_argument("--num-parallel-jobs", type=int, default=8, metavar="N",
                   help="schedules of one program built and simulated at once at -O2/-O3 (default 8; at most one "
                        "per CPU; the output is the same whatever N); above 1, the race check runs beside the "
                        "simulation")
    p.add_argument("--enable-fast-loading-neuron-binaries", action="store_true",
                   help="accepted for compatibility: nxsat's NEFF is never compressed")
    p.add_argument("--precision", choices=PRECISION_MODES, default="cost",
                   help="nxsat's own: who picks the precision of dots and convolutions within --auto-cast at -O2/-O3: "
                        "cost (default: the extraction, by the device cost model; the report lists every choice) "
                        "or policy (cast every one, as -O1 does)")
    p.add_argument("--precision-by-cost", dest="precision", action="store_const", const="cost",
                   help=argparse.SUPPRESS)  # the flag of the time this was opt-in: now the default
    p.add_argument("--layout", choices=LAYOUT_MODES, default="cost",
                   help="nxsat's own: cost (default: convolution regions stored channels-first where the cost "
                        "model prices it faster; at -O2/-O3 weighed against every convolution channels-first, "
                        "both simulated), input (the model's own layout) or channels-first (every convolution "
                        "that has such a form)")
    p.add_argument("--disable-forwarding", action="store_true",
                   help="nxsat's own: every value goes to HBM and back between operators, as lowered (by default a "
                        "load of a value still in SBUF reads it there); to see what forwarding buys")
    p.add_argument("--extractor", choices=EXTRACTORS,
                   help="how the program is chosen from the e-graph by the device cost model: greedy (tree cost, "
                        "-O1's), dag (shared values paid once, -O2's), ilp (exact, -O3's); smallest: fewest "
                        "operators, no cost model")
    p.add_argument("--disable-rule", action="append", metavar="NAME",
                   help="nxsat's own: leave this rewrite rule out (repeatable; `nxsat rules list` names them), "
                        "to see what it buys")
    p.add_argument("--output", "-o", default="file.neff", metavar="FILE.neff", help="where to write the NEFF "
                   "(default file.neff; written atomically, nothing on failure)")
    p.add_argument("--report", metavar="FILE.json", help="also write the compile report as JSON")
    p.add_argument("--logfile", default="log-neuron-cc.txt", metavar="FILE",
                   help="the compile log (default log-neuron-cc.txt; '' for none)")
    p.add_argument("--verbose", default="info", choices=VERBOSE,
                   help="what to print: info (default) prints the report, warning only warnings, error nothing")
    p.add_argument("--workdir", metavar="DIR", help="dump what each stage made (docs/compiling.md)")
    p.add_argument("--relay-constants", metavar="FILE", help="Relay only: values of meta[relay.Constant][i]")
    p.add_argument("--seed", type=int, default=0, help="seed for --fill-elided-constants (default 0)")
    add_elided_argument(p)
    p.set_defaults(func=cmd_compile)

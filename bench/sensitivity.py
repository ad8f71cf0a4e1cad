"""A compiled model against the reference interpreter, output by output, each measured against how far
rounding alone moves it: the check for a training step, whose gradients no element-wise tolerance
judges (docs/compiling.md, "Checking a training step").

    python bench/sensitivity.py tests/data/hlo/mobilenet_v2.hlo \\
        --set p12.42=6 --set p317.2351=49 --set p314.2029=96 --set p315.2045=0.8 [--target trn2]

The inputs are seeded draws (seed 0, as `nxsat run --random-inputs` and the corpus test make them),
scalars given their meaning with --set. The interpreter runs twice: on those inputs, and with the
largest floating-point input (the images) moved up by one ulp; each output is then judged as
nxsat/sensitivity.py describes (exact, rounding or noise). `--write-table FILE` keeps the measured
sensitivities (tests/data/hlo/mobilenet_v2.sensitivity.json was made so, for the corpus test);
`--table FILE` takes them from such a file and runs the interpreter once. Exit status 1 when an output
fails.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np

from nxsat.sensitivity import EXACT_TOL, Table, judge


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="HLO or Relay model")
    ap.add_argument("--target", default="trn1")
    ap.add_argument("-O", type=int, default=2, choices=(1, 2, 3))
    ap.add_argument("--auto-cast", default="none", choices=("none", "matmult", "all"))
    ap.add_argument("--set", action="append", default=[], metavar="PARAM=VALUE",
                    help="a scalar parameter's value instead of a random draw (by its HLO name)")
    ap.add_argument("--fill-elided-constants", action="store_true", help="seeded values for elided literals")
    ap.add_argument("--all", action="store_true", help="print every output, not only the worst of each class")
    ap.add_argument("--table", metavar="FILE", help="stored sensitivities: the interpreter runs once")
    ap.add_argument("--write-table", metavar="FILE", help="keep the measured sensitivities in FILE")
    ap.add_argument("--skip-device", action="store_true", help="measure the sensitivities only (with --write-table)")
    args = ap.parse_args()
    if args.table and (args.write_table or args.skip_device):
        ap.error("--table reads the sensitivities; --write-table and --skip-device measure them")
    if args.skip_device and not args.write_table:
        ap.error("--skip-device measures the sensitivities only: give --write-table")

    from nxsat import sim
    from nxsat.cli.model import random_inputs
    from nxsat.diagnostics import NxsatError
    from nxsat.driver import CompileOptions, compile_model
    from nxsat.frontend import load
    from nxsat.interpreter import run_module
    from nxsat.io import match_inputs
    from nxsat.passes import fill_elided_constants

    module = load(args.model)
    if args.fill_elided_constants:
        module = fill_elided_constants(module, 0)
    try:
        fixed = {k: float(v) for k, v in (s.split("=", 1) for s in args.set)}
    except ValueError:
        ap.error("--set takes PARAM=NUMBER")
    try:
        inputs = random_inputs(module, 0, fixed=fixed)
    except NxsatError as exc:
        ap.error(exc.format())
    big = max((k for k, v in inputs.items() if v.dtype.kind == "f" or "float" in str(v.dtype)),
              key=lambda k: inputs[k].size)

    seconds: dict[str, float] = {}
    got: list[np.ndarray] | None = None
    rep: dict | None = None
    if not args.skip_device:
        t = time.perf_counter()
        result = compile_model(args.model, CompileOptions(
            target=args.target, optlevel=args.O, auto_cast=args.auto_cast,
            fill_elided_constants=0 if args.fill_elided_constants else None))
        seconds["compile"] = time.perf_counter() - t
        rep = result.report
        t = time.perf_counter()
        model = sim.load(result.neff)
        seconds["load"] = time.perf_counter() - t
        t = time.perf_counter()
        got = model.run(dict(inputs))
        seconds["run"] = time.perf_counter() - t
        del model, result
    t = time.perf_counter()
    want = [np.asarray(o) for o in run_module(module, match_inputs(module, inputs))]
    if args.table:
        table = Table.load(args.table)
        why = table.stale(want)
        if why:
            print(f"FAIL: {args.table} does not fit this model, its inputs or this interpreter: {why}")
            return 1
        seconds["interpreter"] = time.perf_counter() - t
    else:
        moved_inputs = dict(inputs)
        moved_inputs[big] = np.nextafter(inputs[big], np.inf).astype(inputs[big].dtype)
        moved = [np.asarray(o) for o in run_module(module, match_inputs(module, moved_inputs))]
        seconds["interpreter x2"] = time.perf_counter() - t
        table = Table.measure(Path(args.model).name, 0, fixed, big, want, moved)
        if args.write_table:
            table.save(args.write_table)
            print(f"wrote {args.write_table}: {len(want)} outputs' sensitivities to one ulp of {big}")
    if got is None:
        return 0
    if len(got) != len(want):
        print(f"FAIL: the device gives {len(got)} outputs, the interpreter {len(want)}")
        return 1

    rows = [(k, cls, sens, dev, bound) for k, (w, g, sens) in enumerate(zip(want, got, table.sensitivities))
            for cls, dev, bound in [judge(w, g, sens)]]
    assert rep is not None
    print(f"{Path(args.model).name} on {args.target}, -O{args.O}, --auto-cast {args.auto_cast}: "
          f"{rep['instructions']:,} instructions, latency {rep['latency_us']:,.1f} us against a roofline of "
          f"{rep['roofline_us']:,.2f} us")
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()) +
          f"; peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GB")
    print(f"perturbed input: {table.perturbed} {list(inputs[table.perturbed].shape)}, one ulp up")
    failed = [r for r in rows if r[3] > r[4]]
    for cls in ("exact", "rounding", "noise"):
        mine = [r for r in rows if r[1] == cls]
        if not mine:
            continue
        devs = [r[3] for r in mine]
        line = f"{cls:<9} {len(mine):>4} outputs  deviation {min(devs):.2g} .. {max(devs):.2g}"
        if cls != "exact":
            line += f"  sensitivity {min(r[2] for r in mine):.2g} .. {max(r[2] for r in mine):.2g}"
        # deviation / sensitivity where the bound is the sensitivity's (not the fp32 floor's)
        ratios = [r[3] / r[2] for r in mine if r[2] and r[4] > EXACT_TOL]
        if ratios:
            line += f"  deviation/sensitivity {min(ratios):.2f} .. {max(ratios):.2f} (median {np.median(ratios):.2f})"
        print(line)
        worst = sorted(mine, key=lambda r: -(r[3] / r[4] if 0 < r[4] < math.inf else r[3] / r[2] if r[2] else r[3]))
        for k, _, sens, dev, bound in mine if args.all else worst[:5]:
            text = f"    out{k:<4} {str(want[k].dtype):<8} {str(list(want[k].shape)):<22} sensitivity {sens:<9.3g} " \
                   f"deviation {dev:<9.3g} " + (f"bound {bound:<9.3g}" if math.isfinite(bound) else "(not judged)")
            print((text + ("  FAIL" if dev > bound else "")).rstrip())
    print(f"{'FAIL' if failed else 'PASS'}: {len(rows) - len(failed)} of {len(rows)} outputs within their bounds")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Decisions benchmark (issue: cost-model extraction): what the extraction's choice of precision and layout
buys over the precision policy with the model's own layout, and whether each -O level is at least as fast
as the one below it, on every model of tests/data (HLO, JAX, Relay, the generated models, BERT).

For each model, on trn1 with --auto-cast matmult (bf16), simulated us:

    policy   -O2 --precision policy --layout input: every TensorE operand cast, the model's layout
             (its convolutions' channel order and its dots' operand order as written)
    prec     -O2 --layout input: precision chosen by cost, the model's layout      (with --split)
    layout   -O2 --precision policy: layout chosen by cost, every operand cast     (with --split)
    O2       -O2: both chosen by cost (the default)
    O1, O3   the other levels' defaults (-O1 is the policy's precision, layout by cost)

and the checks: O2 <= policy everywhere, strictly better on resnet50, gemma3_1b and transformer_layer;
O3 <= O2 <= O1. A check that fails is printed and the exit status is 1.

    python bench/decisions.py                      # every model (mobilenet_v2's training step included)
    python bench/decisions.py --models resnet50_keras_jax_f32,gemma3_1b_flax_call --split

Each compile runs in a fresh process (``nxsat compile --report``), as bench/compile_bench.py does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_bench import ROOT, compile_one  # noqa: E402

DATA = ROOT / "tests" / "data"
STRICT = ("resnet50_keras_jax_f32", "gemma3_1b_flax_call", "transformer_layer")  # the three
TOLERANCE = 1e-4  # simulated latencies are deterministic; this only absorbs printing


def models() -> dict[str, Path]:
    out = {}
    for d in ("hlo", "jax", "relay", "models", "bert"):
        for p in sorted((DATA / d).glob("*")):
            if p.suffix in (".hlo", ".relay") and not p.name.endswith(".printed.relay"):
                out[p.stem] = p
    return out


def relay_constants(p: Path) -> list[str]:
    for suffix in (".consts.tvm.json", ".consts.json"):
        c = p.with_name(p.stem + suffix)
        if p.suffix == ".relay" and c.exists():
            return ["--relay-constants", str(c)]
    return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="model names (file stems), comma-separated (default: all)")
    ap.add_argument("--target", default="trn1")
    ap.add_argument("--auto-cast", default="matmult")
    ap.add_argument("--auto-cast-type", default="bf16")
    ap.add_argument("--split", action="store_true", help="also precision alone and layout alone")
    ap.add_argument("--levels", default="1,3", help="the other levels to compare with -O2 (default 1,3; '' none)")
    ap.add_argument("--model-type", default="generic", help="generic (default), transformer, unet-inference")
    args = ap.parse_args()
    table = models()
    names = args.models.split(",") if args.models else list(table)
    variants: list[tuple[str, int, list[str]]] = [("policy", 2, ["--precision", "policy", "--layout", "input"])]
    if args.split:
        variants += [("prec", 2, ["--layout", "input"]), ("layout", 2, ["--precision", "policy"])]
    variants.append(("O2", 2, []))
    variants += [(f"O{lv}", int(lv), []) for lv in args.levels.split(",") if lv]
    print(f"target {args.target}, --model-type {args.model_type}, --auto-cast {args.auto_cast} "
          f"({args.auto_cast_type}); simulated us")
    print(f"{'model':<34}" + "".join(f"{v[0]:>11}" for v in variants)
          + f" {'O2/policy':>9} {'roofline':>10}  checks")
    failed: list[str] = []
    better = set()
    for name in names:
        path = table.get(name)
        if path is None:
            print(f"{name:<34} no such model in tests/data")
            failed.append(name)
            continue
        got: dict[str, float] = {}
        roof = 0.0
        error = ""
        for label, level, extra in variants:
            r = compile_one(path, args, level, model_type=args.model_type, extra=relay_constants(path) + extra)
            if "error" in r:
                error = f"{label}: {r['error'][:120]}"
                break
            got[label] = r["latency_us"]
            roof = r["roofline_us"]
        if error:
            print(f"{name:<34} failed: {error}")
            failed.append(f"{name}: {error}")
            continue
        notes = []
        o2, pol = got["O2"], got["policy"]
        if o2 > pol * (1 + TOLERANCE):
            notes.append("O2 > policy")
        elif o2 < pol * (1 - TOLERANCE):
            better.add(name)
        for lo, hi in (("O3", "O2"), ("O2", "O1")):
            if lo in got and hi in got and got[lo] > got[hi] * (1 + TOLERANCE):
                notes.append(f"{lo} > {hi}")
        failed += [f"{name}: {n}" for n in notes]
        print(f"{name:<34}" + "".join(f"{got[v[0]]:11.1f}" for v in variants)
              + f" {o2 / pol:9.4f} {roof:10.2f}  {', '.join(notes) or 'ok'}", flush=True)
    missing = [m for m in STRICT if m in names and m not in better]
    failed += [f"{m}: not strictly faster than the policy" for m in missing]
    print(f"\nstrictly faster than the policy at -O2: {len(better)} of {len(names)}"
          + (f" ({', '.join(sorted(better))})" if better else ""))
    if failed:
        print("checks that failed:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print("every check holds")


if __name__ == "__main__":
    main()

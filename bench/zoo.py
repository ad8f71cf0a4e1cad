"""Zoo benchmark: the models of tests/data/zoo (a ViT block, Swin window attention, an EfficientNet block, a
CLIP text layer, BERT attention with a padding mask, a bf16 dense layer, a CNN on a batch of 4), each
compiled under generic and both model types on trn1 at -O2 with --auto-cast matmult (bf16). Prints the
simulated latency of each beside the roofline: what a user bringing such a model gets, and which type
suits it.

    python bench/zoo.py
    python bench/zoo.py --models clip_causal,swin_window

Each compile runs in a fresh process (`nxsat compile --report`), as bench/compile_bench.py does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_bench import ROOT, compile_args, compile_one  # noqa: E402

ZOO = ROOT / "tests/data/zoo"
TYPES = ("generic", "transformer", "unet-inference")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="names of the zoo's models, comma-separated (default: all)")
    compile_args(ap)
    args = ap.parse_args()
    names = args.models.split(",") if args.models else sorted(p.stem for p in ZOO.glob("*.hlo"))
    print(f"target {args.target}, -O{args.O}, --auto-cast {args.auto_cast} ({args.auto_cast_type}); us")
    print(f"{'model':<14} " + " ".join(f"{t:>15}" for t in TYPES) + f" {'roofline':>10} {'best/roof':>9}")
    for name in names:
        reports = [compile_one(ZOO / f"{name}.hlo", args, args.O, model_type=t) for t in TYPES]
        bad = next((r["error"] for r in reports if "error" in r), None)
        if bad:
            print(f"{name:<14} error: {bad}")
            continue
        lat = [r["latency_us"] for r in reports]
        roof = min(r["roofline_us"] for r in reports)
        print(f"{name:<14} " + " ".join(f"{x:>15.1f}" for x in lat) + f" {roof:>10.2f} {min(lat) / roof:>9.2f}")


if __name__ == "__main__":
    main()

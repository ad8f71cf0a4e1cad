"""Extraction benchmark: per model and -O level, the e-graph's size, and per extractor the time it
takes, the cost model's price of what it chose (us), and for the ILP its size and how it ended.

    python bench/extraction_bench.py                          # resnet50, gemma3_1b, BERT-base, -O1..-O3
    python bench/extraction_bench.py --models mha_block --levels 2 --ilp-seconds 30

Costs are the device cost model's (trn1, TensorE in bf16 as under --auto-cast matmult): the sum over
the chosen e-classes, each paid once. The ILP is optimal when it says so; ``cost(ilp) <= cost(dag)
<= cost(greedy)`` is checked and a violation printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from compile_bench import MODELS  # one table of the benchmarks' models (this folder is on the path)

DEFAULT = "resnet50,gemma3_1b,bert_base_l12"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT, help="names (see MODELS) or paths, comma-separated")
    ap.add_argument("--levels", default="1,2,3")
    ap.add_argument("--extractors", default="smallest,greedy,dag,ilp")
    ap.add_argument("--ilp-seconds", type=float, default=60.0)
    ap.add_argument("--target", default="trn1")
    ap.add_argument("--matmul-dtype", default="bf16")
    args = ap.parse_args()

    from nxsat import sim
    from nxsat.extract import extract
    from nxsat.extract.cost import CostModel
    from nxsat.frontend import load
    from nxsat.passes import canonicalize
    from nxsat.rules import saturate_module

    model = CostModel(sim.load_target(args.target), args.matmul_dtype)
    print(f"{'model':18} {'-O':>2} {'e-nodes':>8} {'classes':>8} {'sat s':>6} {'extractor':>9} {'seconds':>8} "
          f"{'cost us':>12} {'vs input':>8}  ilp")
    bad = 0
    for name in args.models.split(","):
        path = MODELS.get(name, Path(name))
        if not path.exists():
            print(f"{name:18} missing: {path}")
            continue
        module = canonicalize(load(str(path)))
        for level in map(int, args.levels.split(",")):
            t0 = time.perf_counter()
            sat = saturate_module(module, "generic", level, canonical=True)
            sat_s = time.perf_counter() - t0
            sizes = sat.egraph.sizes()
            costs = {}
            for ex in args.extractors.split(","):
                r = extract(sat.egraph, sat.loaded, ex, model, args.ilp_seconds)
                costs[ex] = r.cost_ns
                ilp = ""
                if r.ilp is not None:
                    j = r.ilp.to_json()
                    ilp = (f"{j['status']}: {j['variables']} binaries, {j['constraints']} rows, "
                           f"{j['solves']} solves, {j['cycle_cuts']} cycle cuts")
                print(f"{Path(name).stem[:18]:18} {level:>2} {sizes.nodes:>8,} {sizes.classes:>8,} {sat_s:>6.2f} "
                      f"{ex:>9} {r.seconds:>8.3f} {r.cost_ns / 1000:>12.3f} {r.cost_ns / r.input_cost_ns:>8.4f}  {ilp}",
                      flush=True)
            order = [costs[k] for k in ("ilp", "dag", "greedy") if k in costs]
            if any(a > b * (1 + 1e-9) for a, b in zip(order, order[1:])):
                bad += 1
                print(f"  ! cost(ilp) <= cost(dag) <= cost(greedy) does not hold: {order}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

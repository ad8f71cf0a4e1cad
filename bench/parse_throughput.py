"""Parse + validate throughput of the HLO front end on the corpus' largest modules.

    python bench/parse_throughput.py [--repeat N]

Prints, per module: size, instructions, best and median wall time of `nxsat.frontend.load`
(lark parse, attribute decoding, name resolution, shape check of every instruction), and the
instructions per second. Target (issue 2): each under 5 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from nxsat.frontend import load

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "hlo"
MODULES = ["gemma3_1b_flax_call.hlo", "mobilenet_v2.hlo", "resnet50_keras_jax_f32.hlo"]
TARGET_S = 5.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    load(DATA / MODULES[-1])  # warm up: grammar tables, registry import
    print(f"{'module':<30} {'MB':>6} {'instrs':>7} {'best s':>8} {'median s':>9} {'instr/s':>9}  target")
    for name in MODULES:
        path = DATA / name
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            m = load(path)
            times.append(time.perf_counter() - t0)
        n = sum(len(c.instructions) for c in m.computations.values())
        best, med = min(times), statistics.median(times)
        ok = "ok" if med < TARGET_S else "MISSED"
        print(f"{name:<30} {path.stat().st_size / 1e6:>6.2f} {n:>7} {best:>8.2f} {med:>9.2f} {n / med:>9.0f}  "
              f"< {TARGET_S:.0f} s {ok}")


if __name__ == "__main__":
    main()

"""E-graph benchmark: load and generic saturation time at -O1 and -O2, and e-graph sizes.

    python bench/egraph_saturation.py [MODEL.hlo ...]

Defaults to resnet50_keras_jax_f32.hlo and gemma3_1b_flax_call.hlo from tests/data/hlo. For each
model and level: instructions after canonicalization, load time (and per 1000 instructions),
e-graph size after loading, saturation time, iterations and stop reason, final e-graph size,
extraction time and the extracted instruction count.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from nxsat.extract.smallest import extract
from nxsat.frontend import load
from nxsat.passes import canonicalize
from nxsat.rules.catalog import catalog
from nxsat.rules.egraph import EGraph
from nxsat.rules.saturate import Budget, saturate

DEFAULT = [Path(__file__).parent.parent / "tests" / "data" / "hlo" / name
           for name in ("resnet50_keras_jax_f32.hlo", "gemma3_1b_flax_call.hlo")]


def run(path: Path, level: int) -> str:
    cat = catalog()
    module = canonicalize(load(path))
    n = len(module.entry.post_order())
    eg = EGraph(cat.select(None, level), cat)
    t0 = time.perf_counter()
    loaded = eg.load(module)
    t_load = time.perf_counter() - t0
    initial = eg.sizes()
    budget = Budget.for_model(cat, level, initial.nodes)
    report = saturate(eg, budget, initial=initial)
    t1 = time.perf_counter()
    out = extract(eg, loaded)
    t_extract = time.perf_counter() - t1
    final_nodes, final_classes = report.final
    return (f"{path.name:<32} -O{level} {n:>6} instr  load {t_load:6.3f} s ({t_load / n * 1000:.3f} s/1000)  "
            f"e-graph {initial.nodes}/{initial.classes} -> {final_nodes}/{final_classes} (nodes/classes)  "
            f"saturate {report.seconds:6.3f} s, {len(report.iterations)} it, {report.stop_reason}  "
            f"extract {t_extract:5.3f} s -> {len(out.entry.post_order())} instr")


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or DEFAULT
    for path in paths:
        for level in (1, 2):
            print(run(path, level), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

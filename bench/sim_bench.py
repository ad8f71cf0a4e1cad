"""Device-model benchmark: how fast nxsat assembles, loads, runs and profiles device programs, and the
timing model's headline numbers on them.

    python bench/sim_bench.py            # the default sizes (about a minute on one core)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sim"))

from nxsim_progs import big_matmul, dma_copy  # noqa: E402

from nxsat import sim  # noqa: E402


def bench(name: str, text: str, run: bool) -> None:
    t0 = time.perf_counter()
    data = sim.assemble(text, name)
    t1 = time.perf_counter()
    m = sim.load(data, name)
    t2 = time.perf_counter()
    rep, tl = m.profile()
    t3 = time.perf_counter()
    run_s = float("nan")
    if run:
        rng = np.random.default_rng(0)
        inputs = {f"in{i}": rng.standard_normal(m.program.global_shape(t)).astype(t.dtype.np)
                  for i, t in enumerate(m.program.inputs())}
        t4 = time.perf_counter()
        m.run(inputs)
        run_s = time.perf_counter() - t4
    n = rep["instructions"]
    print(f"{name:<28} {n:>7} instr  assemble {t1 - t0:6.2f} s  load {t2 - t1:6.2f} s  profile {t3 - t2:6.2f} s  "
          f"run {run_s:6.2f} s | latency {rep['latency_ns'] / 1000:9.1f} us  MFU {rep['mfu']:6.1%}  "
          f"HBM {rep['hbm']['utilization']:6.1%}  roofline {rep['roofline']['bound_ns'] / rep['latency_ns']:6.1%}")


def main() -> None:
    bench("matmul 1024x2048x4096 bf16", big_matmul(8, 16, 8), run=True)
    bench("matmul 1024x2048x16384 bf16", big_matmul(8, 16, 32), run=False)
    bench("dma copy 32 MiB", dma_copy(8, 8), run=True)


if __name__ == "__main__":
    main()

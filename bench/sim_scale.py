"""Device model at compiler scale: build, load, timing replay and functional run of generated programs.

    python bench/sim_scale.py                              # 10k, 100k and 1M instructions
    python bench/sim_scale.py --sizes 10000 --run-max 10000

Each size runs in a fresh process (so its peak memory is its own) on ``pipeline_program`` from
tests/sim/nxsim_progs.py: a software-pipelined layer of 128x512 bf16 tiles built through the Python
API, 8 instructions per step (a DMA load, a 4-matmul accumulation group, an activation evacuating
PSUM, a VectorE add, a DMA store). Columns, per instruction:
  build    build_neff: link, check (happens-before, races, groups), canonical text, NEFF bytes
  load     loading the NEFF this nxsat wrote (integrity and structure; no race analysis)
  verify   loading with --verify (everything redone)
  replay   the timing model (profile)
  run      the functional model on random inputs (only up to --run-max instructions), on every core of
           this machine: BLAS's threads for the matmul groups, NXSAT_SIM_THREADS for transcendental
           functions over large tiles (how `nxsat run` runs by default)
  run/core the same on one core (OPENBLAS_NUM_THREADS=1, NXSAT_SIM_THREADS=1), in a process of its own
  memory   peak resident memory of the process over its starting size (the first process)
The generated program shares equal index and access records, as a code generator does.
Targets (issue: device model at compiler scale): build <= 20 us, replay <= 20 us, run <= 200 us per
instruction, memory <= 2 KB per instruction, linear in size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure_run(steps: int) -> dict:
    """Build, load, and time the functional run only."""
    sys.path.insert(0, str(HERE.parent / "tests" / "sim"))
    import numpy as np
    from nxsim_progs import pipeline_program

    from nxsat import sim

    m = sim.load(sim.build_neff(pipeline_program(steps), sim.load_target("trn1")), "scale.neff")
    rng = np.random.default_rng(0)
    inputs = {f"in{i}": rng.standard_normal(m.program.global_shape(t)).astype(t.dtype.np)
              for i, t in enumerate(m.program.inputs())}
    t0 = time.perf_counter()
    m.run(inputs)
    return {"run_s": time.perf_counter() - t0}


def measure(steps: int, run: bool) -> dict:
    sys.path.insert(0, str(HERE.parent / "tests" / "sim"))
    import numpy as np
    from nxsim_progs import pipeline_program, pipeline_reference

    from nxsat import sim

    base = _rss_kb()
    t0 = time.perf_counter()
    prog = pipeline_program(steps)
    t1 = time.perf_counter()
    data = sim.build_neff(prog, sim.load_target("trn1"))
    t2 = time.perf_counter()
    del prog
    m = sim.load(data, "scale.neff")
    t3 = time.perf_counter()
    rep, tl = m.profile()
    t4 = time.perf_counter()
    out = {"instructions": rep["instructions"], "generate_s": t1 - t0, "build_s": t2 - t1, "load_s": t3 - t2,
           "replay_s": t4 - t3, "latency_us": rep["latency_ns"] / 1000,
           "roofline_us": rep["roofline"]["bound_ns"] / 1000, "neff_bytes": len(data)}
    del tl
    if run:
        rng = np.random.default_rng(0)
        inputs = {f"in{i}": rng.standard_normal(m.program.global_shape(t)).astype(t.dtype.np)
                  for i, t in enumerate(m.program.inputs())}
        t5 = time.perf_counter()
        y = m.run(inputs)[0]
        out["run_s"] = time.perf_counter() - t5
        ref = pipeline_reference(m, inputs, steps)
        out["run_matches_numpy"] = bool(np.array_equal(y.astype(np.float32), ref))
    del m
    t6 = time.perf_counter()
    sim.load(data, "scale.neff", verify=True)
    out["verify_s"] = time.perf_counter() - t6
    out["memory_kb"] = _rss_kb() - base
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="instruction counts (comma-separated)")
    ap.add_argument("--run-max", type=int, default=1_000_000, help="largest size also run functionally")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(measure_run(args.child) if args.run_only else measure(args.child, args.run)))
        return
    print(f"{'instr':>9} {'build':>8} {'load':>8} {'verify':>8} {'replay':>8} {'run':>8} {'run/core':>8} "
          f"{'memory':>9} {'latency':>12} {'roofline':>12}  (us per instruction; memory KB per instruction)")

    def child(args: list[str], env: dict[str, str]) -> dict:
        cmd = [sys.executable, __file__, "--child", *args]
        return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)

    one_core = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", NXSAT_SIM_THREADS="1")
    for size in (int(s) for s in args.sizes.split(",")):
        steps = max(1, (size - 2) // 8)
        run = size <= args.run_max
        r = child([str(steps)] + (["--run"] if run else []), dict(os.environ))
        if run:
            r["run1_s"] = child([str(steps), "--run-only"], one_core)["run_s"]
        n = r["instructions"]

        def us(key: str, r: dict = r, n: int = n) -> str:
            return f"{r[key] / n * 1e6:8.1f}" if key in r else f"{'-':>8}"

        print(f"{n:>9} {us('build_s')} {us('load_s')} {us('verify_s')} {us('replay_s')} {us('run_s')} {us('run1_s')} "
              f"{r['memory_kb'] / n:9.2f} {r['latency_us']:10.1f}us {r['roofline_us']:10.1f}us"
              + ("" if r.get("run_matches_numpy", True) else "  RUN DIFFERS FROM NUMPY"))


if __name__ == "__main__":
    main()

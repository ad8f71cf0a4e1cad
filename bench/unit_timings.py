"""The seconds the unit tests no longer assert: each figure the tests used to bound with a wall clock
(flaky on a loaded machine), printed beside the bound they had. The tests now assert counts (calls,
iterations, rule matches) that prove the same scaling; this script shows the time it takes here.

    python bench/unit_timings.py            # every figure (about a minute)
    python bench/unit_timings.py egraph sort # some of them: egraph verify formula neff relay sort
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
for sub in ("", "sim", "rules", "relay", "ops"):
    sys.path.insert(0, str(TESTS / sub))


def seconds(fn: Callable[[], object], repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def egraph() -> None:
    from test_egraph_load import _chain

    from nxsat.frontend import load
    from nxsat.passes import canonicalize
    from nxsat.rules.catalog import catalog
    from nxsat.rules.egraph import EGraph

    def load_chain(n: int) -> float:
        m = _chain(n)
        return seconds(lambda: EGraph([], catalog()).load(m), repeat=2)

    load_chain(500)
    small, big = load_chain(2_000), load_chain(16_000)
    print(f"egraph  chain load 2,000: {small:.3f} s  16,000: {big:.3f} s  ratio {big / small:.1f} (was: < 20)  "
          f"{big / 16:.3f} s per 1000 values (was: < 0.5)")
    for name in ("resnet50_keras_jax_f32.hlo", "gemma3_1b_flax_call.hlo"):
        m = canonicalize(load(TESTS / "data" / "hlo" / name))
        n = len(m.entry.post_order())
        s = seconds(lambda m=m: EGraph(catalog().select(level=2), catalog()).load(m))
        print(f"egraph  {name}: {n} instructions, load {s:.3f} s, {s / n * 1000:.3f} s per 1000 (was: < 0.5)")


def verify() -> None:
    from test_robustness import _many_small_accesses

    from nxsat import sim

    for n in (1000, 4000):
        text = _many_small_accesses(n)
        s = seconds(lambda text=text: sim.load(sim.assemble(text, "many.nxs"), verify=True))
        print(f"verify  {n} small accesses on 3 streams: assemble + load {s:.2f} s" + (" (was: < 20)" if n == 4000
                                                                                         else ""))


def formula() -> None:
    from nxsat.diagnostics import NxsatError
    from nxsat.sim.expr import Formula

    def huge() -> None:
        for text, names in (("9 ** 9 ** 9", {}), ("ceil(N) ** ceil(N) ** ceil(N)", {"N": 1e6}),
                            ("N // 0", {"N": 1})):
            try:
                Formula(text)(names)
            except NxsatError:
                pass

    print(f"formula huge powers refused in {seconds(huge) * 1000:.2f} ms (was: < 1 s)")


def neff() -> None:
    import test_fuzz

    rng = np.random.default_rng(0)
    worst, total, count = 0.0, 0.0, 0
    for data in test_fuzz.SAMPLES.values():
        for _ in range(50):
            b = bytearray(data)
            b[int(rng.integers(0, len(b)))] ^= int(rng.integers(1, 256))
            s = seconds(lambda b=b: test_fuzz._load(bytes(b)))
            worst, total, count = max(worst, s), total + s, count + 1
    print(f"neff    damaged NEFF refused: mean {total / count * 1000:.1f} ms, worst {worst * 1000:.1f} ms "
          f"over {count} (was: < 5 s each)")


def relay() -> None:
    import test_relay_corpus as corpus
    import test_relay_fuzz as fuzz

    from nxsat.frontend.relay import parse_relay

    for name in corpus.MODELS:
        _, module = corpus.load(name)
        print(f"relay   {name}: runs in {seconds(lambda module=module: corpus.run_seeded(module)):.2f} s "
              "(was: < 60)")
    for name in fuzz.MODELS:
        s = seconds(lambda name=name: parse_relay(fuzz.TEXTS[name], f"{name}.relay", fuzz.SPECS[name], seed=1))
        print(f"relay   {name}: parses in {s:.3f} s (mutants were: < 20 s, hypothesis deadline 10 s)")


def sort() -> None:
    from test_sort import RNG, jax_lexicographic, sort_with_index

    from nxsat import dtypes as dt

    x = RNG.standard_normal(50_000).astype(np.float32)
    comp = jax_lexicographic([dt.F32, dt.S32], 1)
    print(f"sort    50,000 floats, JAX's comparator: {seconds(lambda: sort_with_index(x, comp)):.2f} s (was: < 60)")


FIGURES = {"egraph": egraph, "verify": verify, "formula": formula, "neff": neff, "relay": relay, "sort": sort}


def main(argv: list[str]) -> None:
    for name in argv or list(FIGURES):
        FIGURES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])

"""Every operator against XLA itself: each case in tests/data/xla_ops is a small HLO module with
XLA CPU's outputs; the reference interpreter must reproduce them.

Floats (f32, f64) within rtol 1e-5 and atol 1e-6 x max|reference| (1e-6 x min(1, max|reference|) when
no operator of the module accumulates); bf16, f16 and fp8 within one unit in the last place of their
type; integers and booleans exactly; NaN and infinities where XLA has them. ``rng`` is
implementation-defined in XLA, so those cases check range and moments.
See tests/data/xla_ops/README.md for how the fixtures were made.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.diagnostics import NxsatError
from nxsat.frontend import load
from nxsat.interpreter import run_module
from nxsat.io import match_inputs, read_npz
from nxsat.ir import Module, TensorType
from nxsat.ops import all_ops
from nxsat.ops.fused import FUSED
from nxsat.ops.registry import UNSUPPORTED

DATA = Path(__file__).parent / "data" / "xla_ops"
CASES = sorted(p.stem for p in DATA.glob("*.hlo"))
LOW_PRECISION = (dt.BF16, dt.F16, dt.F8E4M3FN, dt.F8E5M2)
# Operators whose results sum (or otherwise combine) many values, so rounding order matters.
ACCUMULATING = frozenset({"dot", "convolution", "reduce", "reduce-window", "select-and-scatter", "scatter",
                          "batch-norm-inference", "batch-norm-training", "batch-norm-grad", "all-reduce",
                          "reduce-scatter", "while"})


def _uniform(low: float, high: float, integer: bool) -> Callable[[np.ndarray], None]:
    def check(got: np.ndarray) -> None:
        assert np.all(got >= low) and np.all(got < high), f"values outside [{low}, {high})"
        if integer:
            assert set(np.unique(got).tolist()) == set(range(int(low), int(high))), "not every value drawn"
        mean, std = float(got.mean()), float(got.std())
        span = high - low
        ideal_std = span / np.sqrt(12) if not integer else np.sqrt((span**2 - 1) / 12)
        assert abs(mean - (low + high - (1 if integer else 0)) / 2) < 0.05 * span, f"mean {mean}"
        assert abs(std - ideal_std) < 0.05 * ideal_std, f"std {std}, expected {ideal_std}"

    return check


def _normal(mu: float, sigma: float) -> Callable[[np.ndarray], None]:
    def check(got: np.ndarray) -> None:
        assert np.all(np.isfinite(got))
        assert abs(float(got.mean()) - mu) < 0.05 * sigma * 4, f"mean {got.mean()}"
        assert abs(float(got.std()) - sigma) < 0.05 * sigma, f"std {got.std()}"
        # Roughly normal, not uniform: about 68% within one sigma.
        inside = float(np.mean(np.abs(got - mu) < sigma))
        assert 0.64 < inside < 0.72, f"{inside:.3f} of the samples within one sigma"

    return check


# XLA leaves the values of `rng` to the implementation: check the distribution, not the sample.
STATISTICAL: dict[str, Callable[[np.ndarray], None]] = {
    "rng_uniform_stat": _uniform(-2.0, 3.0, integer=False),
    "rng_uniform_s32_stat": _uniform(-5, 7, integer=True),
    "rng_normal_stat": _normal(1.5, 0.5),
}


def _ulp(ref: np.ndarray, dtype: dt.DType) -> np.ndarray:
    """One unit in the last place of ``dtype`` at each (finite) reference value."""
    info = ml_dtypes.finfo(dtype.np)
    min_exp = int(np.log2(float(info.smallest_normal)))
    mag = np.abs(ref)
    exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    return np.exp2(np.maximum(exp, min_exp) - int(info.nmant))


def _describe(bad: np.ndarray, got: np.ndarray, ref: np.ndarray) -> str:
    where = np.argwhere(bad)[:8]
    shown = ", ".join(f"{tuple(int(i) for i in w)}: got {got[tuple(w)]!r} want {ref[tuple(w)]!r}"
                      for w in where)
    return f"{int(bad.sum())} of {bad.size} differ; {shown}"


def accumulates(module: Module) -> bool:
    """Whether any value sums over many others (where cancellation makes the max|ref| term fair)."""
    return any(node.op in ACCUMULATING for comp in module.computations.values() for node in comp.instructions)


def assert_output(got: np.ndarray, ref: np.ndarray, t: TensorType, what: str, *,
                  accumulated: bool = True) -> None:
    """Compare one output with XLA's. ``accumulated=False`` (no op of the module sums anything)
    holds each element to its own magnitude: atol 1e-6 x min(1, max|ref|), since an output with
    +-3e38 beside 1.0 would otherwise tolerate any error in the 1.0."""
    got = np.asarray(got)
    assert got.shape == t.shape == ref.shape, f"{what}: shape {got.shape}, XLA {ref.shape}, declared {t}"
    assert got.dtype == t.dtype.np, f"{what}: element type {got.dtype}, declared {t}"
    if not t.dtype.is_float:
        want = ref.astype(t.dtype.np)
        bad = got != want
        assert not bad.any(), f"{what} ({t}): {_describe(bad, got, want)}"
        return
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    inf_g, inf_r = np.isinf(g), np.isinf(r)
    bad = (nan_g != nan_r) | (inf_r & (g != r)) | (inf_g & ~inf_r)
    finite = ~(nan_r | inf_r | nan_g | inf_g)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf are judged above
        if t.dtype in LOW_PRECISION:
            tol = _ulp(r, t.dtype)
        else:
            scale = float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0))
            tol = 1e-5 * np.abs(r) + 1e-6 * (scale if accumulated else min(scale, 1.0))
        bad |= finite & (np.abs(g - r) > tol)
    assert not bad.any(), f"{what} ({t}): {_describe(bad, g, r)}"


def _run(name: str) -> tuple[Module, dict[str, np.ndarray], list[np.ndarray]]:
    module = load(DATA / f"{name}.hlo")
    arrays = read_npz(DATA / f"{name}.npz")
    inputs = match_inputs(module, {k: v for k, v in arrays.items() if k.startswith("in")}, f"{name}.npz")
    return module, arrays, run_module(module, inputs)


@pytest.mark.parametrize("name", CASES)
def test_matches_xla(name):
    module, arrays, outs = _run(name)
    refs = [arrays[f"out{i}"] for i in range(sum(k.startswith("out") for k in arrays))]
    types = module.outputs
    accumulated = accumulates(module)
    assert len(outs) == len(refs) == len(types), (
        f"{name}: {len(outs)} outputs, XLA gave {len(refs)}, the module declares {len(types)}")
    for i, (got, ref, t) in enumerate(zip(outs, refs, types)):
        if name in STATISTICAL:
            assert got.shape == t.shape and got.dtype == t.dtype.np
            STATISTICAL[name](got)
        else:
            assert_output(got, ref, t, f"{name} out{i}", accumulated=accumulated)


def test_fixtures_are_complete():
    hlo = {p.stem for p in DATA.glob("*.hlo")}
    npz = {p.stem for p in DATA.glob("*.npz")}
    assert hlo == npz and len(hlo) > 250
    assert set(STATISTICAL) <= hlo
    total = sum(p.stat().st_size for p in DATA.iterdir() if p.suffix in (".hlo", ".npz"))
    assert total < 2_000_000


def test_every_runnable_operator_has_a_case():
    """Each operator the registry can run appears in at least one fixture (so it is checked against XLA)."""
    seen: set[str] = set()
    unreadable: list[str] = []
    for name in CASES:
        try:
            module = load(DATA / f"{name}.hlo")
        except NxsatError as exc:  # reported case by case by test_matches_xla
            unreadable.append(f"{name} ({exc.code})")
            continue
        for comp in module.computations.values():
            seen.update(node.op for node in comp.instructions)
    # custom-call never runs as such: the front end lowers each known target (TopK -> topk, sharding
    # annotations -> copy), and those operators need their own fixtures.
    # nxsat's fused operators (nxsat/ops/fused.py) are not HLO: tests/ops/test_fused_ops.py checks them
    # against numpy, and the JAX models compiled under --model-type reproduce XLA's outputs through them.
    runnable = {o.name for o in all_ops() if o.status != UNSUPPORTED and o.impl is not None} - {"custom-call"} \
        - FUSED
    missing = sorted(runnable - seen)
    assert not missing, (f"operators without a loadable XLA fixture: {', '.join(missing)}"
                         + (f"; fixtures that do not load: {', '.join(unreadable)}" if unreadable else ""))


def test_comparison_is_strict():
    """The comparison itself: one ulp passes in bf16, two do not; a NaN mismatch fails."""
    t = TensorType(dt.BF16, (3,))
    ref = np.array([1.0, 256.0, -0.5], np.float32)
    one_up = np.array([1.0078125, 258.0, -0.50390625], np.float32).astype(dt.BF16.np)
    assert_output(one_up, ref, t, "ok")
    with pytest.raises(AssertionError):
        assert_output(np.array([1.015625, 256.0, -0.5], np.float32).astype(dt.BF16.np), ref, t, "two ulp")
    f = TensorType(dt.F32, (2,))
    with pytest.raises(AssertionError):
        assert_output(np.array([np.nan, 1.0], np.float32), np.array([0.0, 1.0], np.float32), f, "nan")
    with pytest.raises(AssertionError):
        assert_output(np.array([1.0, 1.0001], np.float32), np.array([1.0, 1.0], np.float32), f, "rtol")

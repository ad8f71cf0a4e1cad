"""``nxsat check A B``: are two graphs equivalent?

Both graphs go into one e-graph (parameters are shared by position, so equal inputs are one
e-class), saturate under the exact rules, and if every output of A shares an e-class with the
same output of B the answer is ``equivalent (proved)``: the rules are exact, so the proof holds
over the reals. Otherwise the reference interpreter runs both on random inputs of several
distributions; a differing output gives ``not equivalent`` with the inputs and both results, and
no difference in N trials gives ``unknown``. Exit status 0, 1, 2 for the three answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import NxsatError, error
from nxsat.interpreter import run_module
from nxsat.ir import Module, TensorType
from nxsat.rules.catalog import catalog
from nxsat.rules.checker import _magnitude, _short, eps
from nxsat.rules.egraph import EGraph
from nxsat.rules.saturate import Budget, Report, saturate

EQUIVALENT, NOT_EQUIVALENT, UNKNOWN = "equivalent", "not equivalent", "unknown"
EXIT = {EQUIVALENT: 0, NOT_EQUIVALENT: 1, UNKNOWN: 2}


@dataclass
class EquivResult:
    answer: str
    detail: str
    report: Report | None = None
    trials: int = 0
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    output: int | None = None  # the differing output
    a_value: Any = None
    b_value: Any = None

    @property
    def exit_code(self) -> int:
        return EXIT[self.answer]

    def format(self) -> str:
        head = f"{self.answer} (proved)" if self.answer == EQUIVALENT else self.answer
        lines = [f"{head}: {self.detail}"]
        if self.answer == NOT_EQUIVALENT and self.output is not None:
            lines.append("  inputs:")
            for k, v in self.inputs.items():
                lines.append(f"    {k} = {_short(v, 16)}")
            lines.append(f"  A out{self.output} = {_short(self.a_value, 16)}")
            lines.append(f"  B out{self.output} = {_short(self.b_value, 16)}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"answer": self.answer, "detail": self.detail, "trials": self.trials}
        if self.report is not None:
            out["saturation"] = self.report.to_json()
        if self.output is not None:
            out["output"] = self.output
            out["inputs"] = {k: np.asarray(v, np.float64).tolist() if np.asarray(v).dtype.kind != "b"
                             else np.asarray(v).tolist() for k, v in self.inputs.items()}
            out["a"] = np.asarray(self.a_value, np.float64).tolist()
            out["b"] = np.asarray(self.b_value, np.float64).tolist()
        return out


def signature_difference(a: Module, b: Module) -> str | None:
    pa, pb = [p.type for p in a.entry.params], [p.type for p in b.entry.params]
    if len(pa) != len(pb):
        return f"A takes {len(pa)} inputs, B takes {len(pb)}"
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x != y:
            return f"input {i} is {x} in A and {y} in B"
    oa, ob = a.outputs, b.outputs
    if len(oa) != len(ob):
        return f"A has {len(oa)} outputs, B has {len(ob)}"
    for i, (x, y) in enumerate(zip(oa, ob)):
        if x != y:
            return f"output {i} is {x} in A and {y} in B"
    return None


def random_inputs(module: Module, rng: np.random.Generator, trial: int) -> list[np.ndarray]:
    """Inputs of a trial: each trial draws from a different distribution (normal, wide uniform,
    small integers as floats, tiny values) so that differences hidden by one show in another."""
    out = []
    for p in module.entry.params:
        t = p.type
        if not isinstance(t, TensorType):
            raise error("NCC_EINP001", f"parameter {p.name} is a tuple: random inputs are drawn for arrays only",
                        p.loc)
        d = t.dtype
        if d.is_pred:
            out.append(rng.random(t.shape) < 0.5)
        elif d.is_int:
            lo, hi = ((0, 8) if d.kind == "uint" else (-5, 6)) if trial % 2 == 0 else (0, 3)
            out.append(rng.integers(lo, hi, t.shape).astype(d.np))
        else:
            style = trial % 4
            if style == 0:
                v = rng.standard_normal(t.shape)
            elif style == 1:
                v = rng.uniform(-10, 10, t.shape)
            elif style == 2:
                v = rng.integers(-4, 5, t.shape).astype(np.float64)
            else:
                v = rng.standard_normal(t.shape) * 1e-3
            out.append(dt.cast(v, d))
    return out


def _differs(a: np.ndarray, b: np.ndarray) -> str | None:
    """A difference beyond rounding: floats off by more than max(1e-4, 64 ulps) relative to the
    output's scale, or NaN in one only; anything else must match exactly."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shapes {list(a.shape)} and {list(b.shape)}"
    is_float = a.dtype.kind == "f" or a.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np)
    if not is_float:
        bad = a != b
    else:
        x, y = a.astype(np.float64), b.astype(np.float64)
        rel = max(1e-4, 64 * eps(a.dtype))
        scale = max(_magnitude(x), _magnitude(y))
        with np.errstate(invalid="ignore"):
            close = (x == y) | (np.abs(x - y) <= rel * (np.abs(x) + scale))
        nan_x, nan_y = np.isnan(x), np.isnan(y)
        bad = (~close & ~(nan_x & nan_y)) | (nan_x != nan_y)
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad.reshape(-1))[0])
    return (f"{int(bad.sum())} of {a.size} values differ; first at flat index {i}: "
            f"{_scalar(a.reshape(-1)[i])} vs {_scalar(b.reshape(-1)[i])}")


def _scalar(v: Any) -> str:
    x = np.asarray(v)
    if x.dtype.kind in "biu":
        return str(x.item())
    return f"{float(x.astype(np.float64)):.8g}"


def check_equivalence(a: Module, b: Module, *, model_type: str | None = None, level: int = 2, trials: int = 20,
                      seed: int = 0, canonical: bool = False) -> EquivResult:
    """Prove, refute, or give up; see the module docstring."""
    if not canonical:
        from nxsat.passes import canonicalize

        a, b = canonicalize(a), canonicalize(b)
    why = signature_difference(a, b)
    if why:
        return EquivResult(NOT_EQUIVALENT, f"the signatures differ: {why}")
    cat = catalog()
    rules = cat.select(model_type, level, exact_only=True)
    eg = EGraph(rules, cat)
    t0 = time.perf_counter()
    la, lb = eg.load(a), eg.load(b)
    load_seconds = time.perf_counter() - t0
    pairs = list(zip(la.outputs, lb.outputs))

    def proved() -> bool:
        return all(eg.same_class(x, y) for x, y in pairs)

    initial = eg.sizes()
    budget = Budget.for_model(cat, level, initial.nodes)
    if proved():
        report = Report([r.name for r in rules], budget, initial, stop_reason="proved")
    else:
        report = saturate(eg, budget, stop_when=proved, initial=initial)
    report.load_seconds = load_seconds
    report.level = level
    report.sets = cat.sets_for(model_type)
    if report.stop_reason == "proved" or proved():
        n = len(report.iterations)
        return EquivResult(EQUIVALENT, f"every output of A shares an e-class with B's after {n} iteration(s) of "
                           f"{len(rules)} exact rules ({', '.join(report.sets)}, -O{level})", report)
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        try:
            inputs = random_inputs(a, rng, trial)
            out_a, out_b = run_module(a, inputs), run_module(b, inputs)
        except NxsatError as exc:
            n = len(report.iterations)
            return EquivResult(UNKNOWN, f"not proved (saturation stopped: {report.stop_reason} after {n} "
                               f"iteration(s)), and no counterexample can be searched: {exc.message}", report, trial)
        for i, (x, y) in enumerate(zip(out_a, out_b)):
            diff = _differs(x, y)
            if diff:
                names = {f"in{k}": v for k, v in enumerate(inputs)}
                return EquivResult(NOT_EQUIVALENT, f"output {i} differs on random inputs (trial {trial + 1}, "
                                   f"seed {seed}): {diff}", report, trial + 1, names, i, x, y)
    n = len(report.iterations)
    return EquivResult(UNKNOWN, f"not proved (saturation stopped: {report.stop_reason} after {n} iteration(s)) "
                       f"and no counterexample in {trials} random trials", report, trials)


__all__ = ["EquivResult", "check_equivalence", "signature_difference"]

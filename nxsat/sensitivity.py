"""Judging a compiled training step against the reference interpreter by the interpreter's own rounding.

A training step's gradients are long sums: summing them in another order moves them as much as
rounding the inputs does, so no element-wise tolerance judges them. Each output's *sensitivity* is how
far moving the largest floating-point input (the images) up by one ulp moves it in the interpreter,
normwise, relative to its norm; the device's *deviation* is how far it is from the interpreter on the
unmoved inputs. Each output is then one of:

- exact: the ulp does not move it (forward outputs, statistics, counters): the device must agree within
  ``EXACT_TOL`` of its norm (two fp32 units; integers exactly);
- rounding: moved by less than ``NOISE`` of its norm: the device must be within ``ROUNDING_FACTOR``
  sensitivities, or within ``EXACT_TOL`` (an output the ulp barely moves still rounds in fp32);
- noise: moved by ``NOISE`` of its norm or more, a sum that cancels to about zero (a batch norm's
  offset gradient under a 1x1 convolution): reported, not judged.

Measuring the sensitivities runs the interpreter a second time; a :class:`Table` keeps them (with the
reference outputs' norms, which tell when the table no longer fits the interpreter), so that a check
can run the interpreter once. docs/compiling.md, "Checking a training step", has the measured figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nxsat.io import atomic_write

EXACT_TOL = 2e-5
ROUNDING_FACTOR = 4.0  # mobilenet_v2 measures at most 1.6 on trn1 and trn2
NOISE = 0.1
NORM_MATCH = 1e-6  # a stored reference norm and the interpreter's today agree this closely


def norm(a: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64).ravel()))


def relative(d: np.ndarray, ref: np.ndarray) -> float:
    """``|d| / |ref|`` (``|d|`` where the reference is zero)."""
    n = norm(ref)
    return norm(d) / n if n else norm(d)


def sensitivity(want: np.ndarray, moved: np.ndarray) -> float:
    """How far the one-ulp move of the input moved an output, relative to its norm (0 for integers)."""
    if want.dtype.kind in "iub":
        return 0.0
    return relative(moved.astype(np.float64) - want.astype(np.float64), want)


def judge(want: np.ndarray, got: np.ndarray, sens: float) -> tuple[str, float, float]:
    """(class, deviation, bound) of one output with the given sensitivity; it passes when the deviation
    is within the bound (an integer output's deviation counts differing elements)."""
    if want.dtype.kind in "iub":
        return "exact", float(np.count_nonzero(got != want)), 0.0
    dev = relative(got.astype(np.float64) - want.astype(np.float64), want)
    if sens == 0.0:
        return "exact", dev, EXACT_TOL
    if sens < NOISE:
        return "rounding", dev, max(ROUNDING_FACTOR * sens, EXACT_TOL)
    return "noise", dev, math.inf


@dataclass
class Table:
    """The sensitivities of one model's outputs on seeded inputs, and the reference outputs' norms."""

    model: str
    seed: int
    scalars: dict[str, float]
    perturbed: str  # the input moved by one ulp
    sensitivities: list[float]
    norms: list[float]

    @classmethod
    def measure(cls, model: str, seed: int, scalars: dict[str, float], perturbed: str,
                want: list[np.ndarray], moved: list[np.ndarray]) -> Table:
        return cls(model, seed, dict(scalars), perturbed, [sensitivity(w, m) for w, m in zip(want, moved)],
                   [norm(w) for w in want])

    def save(self, path: str | Path) -> None:
        atomic_write(Path(path), json.dumps(self.__dict__, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Table:
        return cls(**json.loads(Path(path).read_text()))

    def stale(self, want: list[np.ndarray]) -> str | None:
        """Why the table does not fit these reference outputs (other model, inputs or interpreter), or None."""
        if len(want) != len(self.norms):
            return f"{len(want)} outputs, the table has {len(self.norms)}"
        for k, (w, n, s) in enumerate(zip(want, self.norms, self.sensitivities)):
            # a noise output is a sum that cancels: its norm is rounding, free to move
            if s < NOISE and abs(norm(w) - n) > NORM_MATCH * max(abs(n), 1e-30):
                return f"out{k}'s norm is {norm(w)!r}, the table's {n!r}"
        return None

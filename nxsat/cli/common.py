"""What several command groups print or generate the same way."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np

from nxsat import dtypes as dt


def count_arg(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (argparse then says what is wrong, with a code)."""
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, not {value!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {n}")
        return n
    return parse


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: dt.DType) -> np.ndarray:
    """Seeded stand-in input: normal floats, small non-negative integers, fair booleans."""
    if dtype.is_float:
        return dt.cast(rng.standard_normal(shape), dtype)
    if dtype.is_pred:
        return rng.random(shape) < 0.5
    return rng.integers(0, 8, shape).astype(dtype.np)


def array_summary(name: str, a: np.ndarray) -> str:
    """One line per output: its type as HLO spells it and its range."""
    kind = dt.from_numpy(a.dtype).name if a.dtype in (x.np for x in dt.ALL) else str(a.dtype)
    t = f"{kind}[{','.join(map(str, a.shape))}]"
    if a.size == 0:
        return f"  {name:<6} {t} (empty)"
    if a.dtype.kind == "f" or a.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np):
        f = a.astype(np.float64)
        finite = np.isfinite(f)
        stats = (f"min {np.min(f[finite]):.6g} max {np.max(f[finite]):.6g} mean {np.mean(f[finite]):.6g}"
                 if finite.any() else "no finite values")
        bad = f.size - int(finite.sum())
        return f"  {name:<6} {t:<24} {stats}" + (f"  ({bad} non-finite)" if bad else "")
    return f"  {name:<6} {t:<24} min {a.min()} max {a.max()}"


def input_arrays(path: str | None, seed: int, make_random: Callable[[int], dict[str, np.ndarray]]
                 ) -> tuple[dict[str, np.ndarray], str]:
    """The arrays of ``--inputs``, or seeded random ones (said on stderr); and where they came from."""
    from nxsat.io import read_npz

    if path:
        return read_npz(path), path
    source = f"random inputs (seed {seed})"
    print(f"no --inputs: running on {source}", file=sys.stderr)
    return make_random(seed), source

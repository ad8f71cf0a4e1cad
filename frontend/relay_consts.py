"""Values for ``meta[relay.Constant][i]``: Relay text names its large constants by index and keeps
the values elsewhere (TVM's metadata table). nxsat takes them from ``--relay-constants FILE``:

* ``.npz``: arrays under keys ``0``, ``1``, ... or ``c0``, ``c1``, ... (one form per file);
* ``.json``: a list with ``[shape, dtype]`` per index (the corpus's ``NAME.consts.json``); values
  are generated from ``--seed``: float vectors and scalars uniform in [0, 1) (as TVM's own tests
  fill them, which keeps batch-norm variances positive), float tensors of rank 2 or more zero-mean
  uniform with variance 1/fan_in (fan_in = size / first dimension: OIHW and dense weights), so
  deep models stay finite; integers 0..9; bool at random. Each index has its own generator
  (seeded with ``(seed, index)``), so a constant's values do not depend on the others.

Or from the program's own ``#[metadata]`` section (see :mod:`relay_meta`) when no file is given.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import Loc, error
from nxsat.io import read_npz, read_text
from nxsat.ir import SHAPE_LIMITS_HINT, TensorType, shape_limit_problem

# Generated and loaded constants together may not exceed this (a malformed spec must not exhaust
# the host's memory); the largest corpus model needs 0.1 GB.
MAX_CONSTANT_BYTES = 4 << 30
_KEY = re.compile(r"(c?)([0-9]+)")
HINT = "pass --relay-constants FILE (.npz with keys 0, 1, ... or a JSON list of [shape, dtype])"


class RelayConstants:
    """Index -> array, loaded from a file, a mapping, or the metadata section; values are made
    (or converted) on first use and cached."""

    def __init__(
        self,
        source: str | os.PathLike | Mapping[Any, Any] | None,
        seed: int = 0,
        fallback: dict[int, np.ndarray] | None = None,
        fallback_name: str = "#[metadata]",
    ) -> None:
        self.seed = int(seed)
        self.name = ""
        self._arrays: dict[int, np.ndarray] = {}
        self._specs: dict[int, TensorType] = {}
        self._cache: dict[int, np.ndarray] = {}
        if source is None:
            if fallback is not None:
                self._arrays = dict(fallback)
                self.name = fallback_name
        elif isinstance(source, Mapping):
            self.name = "<constants>"
            self._arrays = self._from_mapping({str(k): v for k, v in source.items()}, self.name)
        else:
            path = Path(source)
            self.name = str(path)
            suffix = path.suffix.lower()
            if suffix == ".json":
                self._specs = self._read_spec(path)
            elif suffix == ".npz":
                self._arrays = self._from_mapping(read_npz(path), self.name)
            else:
                raise error(
                    "NCC_ERLY001",
                    f"{path}: constants are read from an .npz or a .json spec, not {suffix or 'a file without suffix'}",
                    hint=HINT,
                )
        self._check_budget()

    @property
    def given(self) -> bool:
        return bool(self.name)

    # loading
    def _from_mapping(self, arrays: Mapping[str, Any], where: str) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        styles = set()
        for key in sorted(arrays):
            m = _KEY.fullmatch(key)
            if not m:
                raise error(
                    "NCC_ERLY001",
                    f"{where}: key {key!r} does not name a constant",
                    hint="use keys 0, 1, ... or c0, c1, ...",
                )
            styles.add(m.group(1))
            i = int(m.group(2))
            if i in out:
                raise error("NCC_ERLY001", f"{where}: constant {i} is given twice")
            a = np.asarray(arrays[key])
            try:
                dt.from_numpy(a.dtype)
            except KeyError:
                raise error(
                    "NCC_ERLY003",
                    f"{where}: constant {i} has unsupported element type {a.dtype}",
                    hint="store numeric or bool arrays",
                ) from None
            out[i] = a
        if len(styles) > 1:
            raise error("NCC_ERLY001", f"{where}: mixes keys N and cN", hint="use one form for every key")
        return out

    def _read_spec(self, path: Path) -> dict[int, TensorType]:
        try:
            spec = json.loads(read_text(path))
        except json.JSONDecodeError as exc:
            raise error("NCC_ERLY001", f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        except (ValueError, RecursionError) as exc:  # a number too long to convert, nesting too deep
            raise error("NCC_ERLY001", f"{path}: unreadable JSON ({str(exc)[:80]})") from None
        if not isinstance(spec, list):
            raise error("NCC_ERLY001", f"{path}: expected a JSON list of [shape, dtype] entries")
        out: dict[int, TensorType] = {}
        for i, entry in enumerate(spec):
            if (
                not isinstance(entry, list)
                or len(entry) != 2
                or not isinstance(entry[0], list)
                or not isinstance(entry[1], str)
            ):
                raise error("NCC_ERLY001", f"{path}: entry {i} must be [shape, dtype], got {entry!r}"[:300])
            shape, name = entry
            if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape):
                raise error(
                    "NCC_ERLY003",
                    f"{path}: constant {i} has shape {shape!r}: dimensions must be integers in 0..2^31-1"[:300],
                )
            problem = shape_limit_problem(shape)
            if problem:  # e.g. a rank over 64, which numpy cannot make
                raise error("NCC_ERLY003", f"{path}: constant {i} has an unusable shape: {problem}",
                            hint=SHAPE_LIMITS_HINT)
            try:
                d = dt.by_relay(name)
            except KeyError:
                raise error("NCC_ERLY003", f"{path}: constant {i} has unknown dtype {name!r}") from None
            out[i] = TensorType(d, tuple(shape))
        return out

    def _check_budget(self) -> None:
        total = sum(a.nbytes for a in self._arrays.values()) + sum(
            math.prod(t.shape) * t.dtype.itemsize for t in self._specs.values()
        )
        if total > MAX_CONSTANT_BYTES:
            raise error(
                "NCC_ERLY003",
                f"{self.name}: the constants need {total / 2**30:.1f} GiB, over the "
                f"{MAX_CONSTANT_BYTES >> 30} GiB limit",
            )

    # access
    def indices(self) -> list[int]:
        return sorted(set(self._arrays) | set(self._specs))

    def get(self, index: int, loc: Loc | None) -> np.ndarray:
        """The value of constant ``index``; NCC_ERLY002 when there is none."""
        if index in self._cache:
            return self._cache[index]
        if index in self._arrays:
            a = self._arrays[index]
        elif index in self._specs:
            a = self._generate(index, self._specs[index])
        elif not self.given:
            raise error(
                "NCC_ERLY002",
                f"meta[relay.Constant][{index}] has no value: the model's constants are not in its text",
                loc,
                HINT,
            )
        else:
            have = self.indices()
            span = f"{have[0]}..{have[-1]}" if have else "none"
            raise error(
                "NCC_ERLY002",
                f"meta[relay.Constant][{index}] is not in {self.name} (it has {len(have)} constants: {span})",
                loc,
                HINT,
            )
        self._cache[index] = a
        return a

    def _generate(self, index: int, t: TensorType) -> np.ndarray:
        """Seeded values for one constant (in place where possible: a large constant costs its
        float64 draw and its result, nothing more)."""
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, index])
        d = t.dtype
        if d.is_float:
            u = rng.random(t.shape, dtype=np.float64)
            if len(t.shape) >= 2 and t.shape[0]:
                # Weights: zero-mean with variance 1/fan_in (LeCun uniform), so a deep network's
                # activations neither overflow nor vanish.
                fan_in = max(1, math.prod(t.shape) // t.shape[0])
                u *= 2.0
                u -= 1.0
                u *= math.sqrt(3.0 / fan_in)
            return dt.cast(u, d)
        if d.is_pred:
            return rng.integers(0, 2, size=t.shape, dtype=np.uint8).astype(bool)
        return rng.integers(0, 10, size=t.shape, dtype=d.np)

"""Judging outputs by the interpreter's own rounding (nxsat/sensitivity.py): the classes and their bounds,
and a stored table that tells when it no longer fits."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nxsat.sensitivity import EXACT_TOL, NOISE, ROUNDING_FACTOR, Table, judge, sensitivity


def _classify(want: np.ndarray, moved: np.ndarray, got: np.ndarray) -> tuple[str, bool]:
    cls, dev, bound = judge(want, got, sensitivity(want, moved))
    return cls, dev <= bound


def test_each_class_is_judged_by_its_own_bound() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal(1000).astype(np.float32)
    # unmoved by the ulp: fp32 units pass, a wrong value fails
    assert _classify(w, w, w * np.float32(1 + 2**-23)) == ("exact", True)
    assert _classify(w, w, w + np.float32(1e-3)) == ("exact", False)
    # moved by rounding: within 4 sensitivities passes, 20 fails; a tiny sensitivity still allows fp32 units
    moved = w + np.float32(1e-4) * rng.standard_normal(1000).astype(np.float32)
    near = w + np.float32(3e-4) * rng.standard_normal(1000).astype(np.float32)
    far = w + np.float32(2e-3) * rng.standard_normal(1000).astype(np.float32)
    assert _classify(w, moved, near) == ("rounding", True)
    assert _classify(w, moved, far) == ("rounding", False)
    assert _classify(w, w * np.float32(1 + 2**-23), w * np.float32(1 - 2**-22)) == ("rounding", True)
    # noise (a sum that cancels): reported, not judged
    z = np.float32(1e-7) * rng.standard_normal(16).astype(np.float32)
    assert sensitivity(z, -z) >= NOISE
    assert _classify(z, -z, 30 * z) == ("noise", True)
    # integers exactly, the deviation counting the elements that differ
    i = np.arange(10, dtype=np.int32)
    assert judge(i, i, 0.0) == ("exact", 0.0, 0.0)
    assert judge(i, i[::-1], 0.0)[1] == 10.0
    assert ROUNDING_FACTOR * 1e-4 > EXACT_TOL  # the rounding class above is judged by its sensitivity


def test_a_stored_table_round_trips_and_says_when_it_is_stale(tmp_path: Path) -> None:
    want = [np.ones(4, dtype=np.float32), np.array([1e-7, -1e-7], dtype=np.float32)]
    moved = [want[0] + np.float32(1e-3), want[1] * 3]
    table = Table.measure("m.hlo", 0, {"p": 1.0}, "in0", want, moved)
    table.save(tmp_path / "t.json")
    again = Table.load(tmp_path / "t.json")
    assert again == table
    assert again.stale(want) is None
    assert "out0" in (again.stale([want[0] * 2, want[1]]) or "")
    assert again.stale([want[0], want[1] * 2]) is None  # a noise output's norm is rounding: not compared
    assert "outputs" in (again.stale(want[:1]) or "")

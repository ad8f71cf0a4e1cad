"""bench/sensitivity.py, the check of a training step's outputs against the interpreter's own rounding
(docs/compiling.md): its verdict per output class, and a whole run on a small model."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("sensitivity", ROOT / "bench" / "sensitivity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_class_is_judged_by_its_own_bound() -> None:
    bench = _bench()

    def classify(want: np.ndarray, moved: np.ndarray, got: np.ndarray) -> tuple[str, bool]:
        cls, _, dev, bound = bench.classify(want, moved, got)
        return cls, dev <= bound
    rng = np.random.default_rng(0)
    w = rng.standard_normal(1000).astype(np.float32)
    # unmoved by the ulp: fp32 units pass, a wrong value fails
    assert classify(w, w, w * np.float32(1 + 2**-23)) == ("exact", True)
    assert classify(w, w, w + np.float32(1e-3)) == ("exact", False)
    # moved by rounding: within 4 sensitivities passes, 20 fails; a tiny sensitivity still allows fp32 units
    moved = w + np.float32(1e-4) * rng.standard_normal(1000).astype(np.float32)
    near = w + np.float32(3e-4) * rng.standard_normal(1000).astype(np.float32)
    far = w + np.float32(2e-3) * rng.standard_normal(1000).astype(np.float32)
    assert classify(w, moved, near) == ("rounding", True)
    assert classify(w, moved, far) == ("rounding", False)
    assert classify(w, w * np.float32(1 + 2**-23), w * np.float32(1 - 2**-22)) == ("rounding", True)
    # noise (a sum that cancels): printed, not judged
    z = np.float32(1e-7) * rng.standard_normal(16).astype(np.float32)
    assert classify(z, -z, 30 * z) == ("noise", True)
    # integers exactly
    i = np.arange(10, dtype=np.int32)
    assert classify(i, i, i) == ("exact", True)
    assert classify(i, i, i[::-1]) == ("exact", False)


def test_a_compiled_convnet_passes() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "sensitivity.py"), str(ROOT / "tests/data/jax/convnet.hlo")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS: 1 of 1 outputs within their bounds" in out.stdout

"""Shared fixtures: where the test data lives and how outputs are compared with references."""

from __future__ import annotations

import os

# The suite runs in parallel workers (pytest -n 2): a BLAS that also starts a thread per core in each
# worker oversubscribes the cores and its spinning threads make every matmul of the simulator many
# times slower. One BLAS thread per worker (set before numpy loads).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

DATA = Path(__file__).parent / "data"
HLO_CORPUS = sorted((DATA / "hlo").glob("*.hlo"))
JAX_CORPUS = sorted((DATA / "jax").glob("*.hlo"))


def assert_matches_reference(actual: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    """The corpus tolerance: floats within rtol 1e-5 and atol 1e-6 * max|ref|; others exactly."""
    actual = np.asarray(actual)
    ref = np.asarray(ref)
    assert actual.shape == ref.shape, f"{what}: shape {actual.shape} != {ref.shape}"
    if ref.dtype.kind == "f":
        a = actual.astype(np.float64)
        r = ref.astype(np.float64)
        scale = float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0))
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6 * scale, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, ref, err_msg=what)


@pytest.fixture
def data_dir() -> Path:
    return DATA

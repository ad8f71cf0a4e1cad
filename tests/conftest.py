"""Shared fixtures: where the test data lives, how outputs are compared with references, and how much
work (function calls) a piece of code does."""

from __future__ import annotations

import os
import sys

# The suite runs in parallel workers (pytest -n 2): a BLAS that also starts a thread per core in each
# worker oversubscribes the cores and its spinning threads make every matmul of the simulator many
# times slower. One BLAS thread per worker (set before numpy loads).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The backend tests share tests/backend/harness.py (imported as ``harness``): one conftest only, so that
# ``from conftest import ...`` always finds this module.
sys.path.insert(0, str(Path(__file__).parent / "backend"))

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


class CallBudgetExceeded(BaseException):
    """More Python and C function calls than a ``call_budget`` allows (a BaseException, so that code
    under test that turns ``Exception`` into coded errors cannot swallow it)."""


class CallCounter:
    """Counts function calls (Python and C) while active: the measure of work tests assert on instead of
    seconds, which depend on the machine and its load. With a ``limit`` the count raises
    CallBudgetExceeded as soon as it passes the limit, so runaway work fails the test instead of hanging."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.calls = 0
        self._previous = None

    def _profile(self, frame, event, arg):  # noqa: ANN001, ANN202 - sys.setprofile's signature
        if event == "call" or event == "c_call":
            self.calls += 1
            if self.limit is not None and self.calls > self.limit:
                raise CallBudgetExceeded(f"more than {self.limit} calls")

    def __enter__(self) -> CallCounter:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        sys.setprofile(self._previous)
        if self.limit is not None and exc_type is None:  # the budget was exceeded and the error swallowed
            assert self.calls <= self.limit, f"{self.calls} calls, the budget is {self.limit}"


def count_calls(fn, *args, **kwargs) -> int:  # noqa: ANN001
    """How many function calls ``fn(*args, **kwargs)`` makes (deterministic for a given input)."""
    with CallCounter() as c:
        fn(*args, **kwargs)
    return c.calls

"""The fused operators' kernels (backend/fused.py) on the simulator against the reference interpreter:
softmax over shapes that exercise its tiling (several rows per partition, a remainder of rows, fewer
rows than partitions, an 8,192-element row), a negative scale (the minimum's path), a transposed
operand, rows of -inf (NaN, as the pattern gives), on trn1 and trn2."""

from __future__ import annotations

import numpy as np
import pytest
from harness import assert_device_matches, device_run, reference_run

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.ir import Module

F32, BF16 = dt.F32, dt.BF16


def _softmax(shape: tuple[int, ...], d: dt.DType, scale: float = 1.0, transposed: bool = False,
             dimension: int | None = None) -> Module:
    b = Builder("e")
    x = b.param(d, shape[::-1] if transposed else shape)
    if transposed:
        x = b.op("transpose", [x], dimensions=tuple(range(len(shape) - 1, -1, -1)))
    dim = len(shape) - 1 if dimension is None else dimension
    return Module("m", b.build(b.op("softmax", [x], dimension=dim, scale=scale)))


CASES = [((12, 128, 128), BF16, 0.125), ((4096, 64), F32, 1.0), ((1000, 33), F32, 1.0), ((5, 3), F32, -0.5),
         ((2, 8192), BF16, 1.0), ((3, 7, 40), F32, 2.0)]


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("shape,d,scale", CASES, ids=[f"{'x'.join(map(str, s))}-{d.name}-{c}" for s, d, c in CASES])
def test_softmax_matches_the_interpreter(shape, d, scale, target):
    rng = np.random.default_rng(1)
    x = dt.cast(rng.standard_normal(shape) * 4, d)
    tol = 2 ** -7 if d is BF16 else 1e-5
    assert_device_matches(_softmax(shape, d, scale), {"p0": x}, target, rtol=tol, atol_scale=tol)


def test_softmax_of_a_transposed_operand():
    x = np.random.default_rng(2).standard_normal((40, 24)).astype(np.float32)
    assert_device_matches(_softmax((24, 40), F32, transposed=True), {"p0": x}, "trn1")


def test_a_row_of_minus_infinity_is_nan_as_the_pattern_gives():
    x = np.random.default_rng(3).standard_normal((130, 16)).astype(np.float32)
    x[7] = -np.inf
    x[129, 3] = -np.inf
    m = _softmax((130, 16), F32)
    (got,), _ = device_run(m, {"p0": x})
    (want,) = reference_run(m, {"p0": x})
    assert np.isnan(got[7]).all() and np.isnan(want[7]).all()
    assert got[129, 3] == 0 and np.isfinite(got[129]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_a_softmax_over_another_dimension_is_refused_cleanly():
    with pytest.raises(NxsatError) as e:
        device_run(_softmax((4, 6), F32, dimension=0), {"p0": np.zeros((4, 6), np.float32)})
    assert e.value.code == "NCC_EUOC002" and "last dimension" in e.value.message

"""batch-norm-inference, -training and -grad against numpy formulas and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module
from nxsat.ops import get

RNG = np.random.default_rng(7)


def run_op(op, xs, **attrs):
    b = Builder("main")
    ps = [b.param(dt.from_numpy(x.dtype), x.shape) for x in xs]
    return run_module(b.module(b.op(op, ps, **attrs)), xs)


def along(v, rank, fi):
    shape = [1] * rank
    shape[fi] = -1
    return np.asarray(v, np.float64).reshape(shape)


def expect_code(code, fn):
    with pytest.raises(NxsatError) as exc:
        fn()
    assert exc.value.code == code, exc.value
    return exc.value.message


@pytest.mark.parametrize("shape,fi", [((2, 3, 4, 5), 1), ((2, 4, 5, 3), 3), ((6, 3), 1), ((5,), 0)])
@pytest.mark.parametrize("d", [dt.F32, dt.BF16])
def test_batch_norm_inference(shape, fi, d):
    c = shape[fi]
    x = dt.cast(RNG.standard_normal(shape) * 2 + 1, d)
    scale, offset, mean = (dt.cast(RNG.standard_normal(c), d) for _ in range(3))
    var = dt.cast(RNG.uniform(0.5, 2.0, c), d)
    (got,) = run_op("batch-norm-inference", [x, scale, offset, mean, var], epsilon=1e-3, feature_index=fi)
    r = x.ndim
    want = ((x.astype(np.float64) - along(mean, r, fi)) / np.sqrt(along(var, r, fi) + 1e-3)
            * along(scale, r, fi) + along(offset, r, fi))
    assert got.dtype == d.np
    np.testing.assert_array_equal(got, dt.cast(want, d))


@pytest.mark.parametrize("shape,fi", [((4, 3, 5, 2), 1), ((3, 4, 4, 6), 3), ((7, 2), 0)])
def test_batch_norm_training(shape, fi):
    x = (RNG.standard_normal(shape) * 3 + 2).astype(np.float32)
    c = shape[fi]
    scale, offset = RNG.standard_normal(c).astype(np.float32), RNG.standard_normal(c).astype(np.float32)
    y, mean, var = run_op("batch-norm-training", [x, scale, offset], epsilon=1e-5, feature_index=fi)
    axes = tuple(a for a in range(x.ndim) if a != fi)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(mean, x64.mean(axis=axes), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(var, x64.var(axis=axes, ddof=0), rtol=1e-6)  # biased variance
    r = x.ndim
    want = (x64 - along(x64.mean(axis=axes), r, fi)) / np.sqrt(along(x64.var(axis=axes), r, fi) + 1e-5)
    np.testing.assert_allclose(y, want * along(scale, r, fi) + along(offset, r, fi), rtol=1e-5, atol=1e-5)
    assert y.dtype == mean.dtype == var.dtype == np.float32


def _training_forward(x, scale, offset, fi, eps):
    axes = tuple(a for a in range(x.ndim) if a != fi)
    m = x.mean(axis=axes, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * along(scale, x.ndim, fi) + along(offset, x.ndim, fi)


@pytest.mark.parametrize("shape,fi", [((3, 2, 4), 1), ((2, 3, 2, 3), 3)])
def test_batch_norm_grad_is_the_gradient_of_training(shape, fi):
    """Central finite differences of L = sum(g * batch_norm_training(x)) in fp64."""
    eps = 1e-3
    x = RNG.standard_normal(shape)
    c = shape[fi]
    scale, offset = RNG.standard_normal(c), RNG.standard_normal(c)
    g = RNG.standard_normal(shape)
    axes = tuple(a for a in range(x.ndim) if a != fi)
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    gx, gs, go = run_op("batch-norm-grad", [x, scale, mean, var, g], epsilon=eps, feature_index=fi)

    def loss(xx, ss, oo):
        return float((g * _training_forward(xx, ss, oo, fi, eps)).sum())

    h = 1e-6
    num_x = np.zeros_like(x)
    for i in np.ndindex(*shape):
        e = np.zeros_like(x)
        e[i] = h
        num_x[i] = (loss(x + e, scale, offset) - loss(x - e, scale, offset)) / (2 * h)
    num_s = np.array([(loss(x, scale + h * np.eye(c)[k], offset) - loss(x, scale - h * np.eye(c)[k], offset))
                      / (2 * h) for k in range(c)])
    num_o = np.array([(loss(x, scale, offset + h * np.eye(c)[k]) - loss(x, scale, offset - h * np.eye(c)[k]))
                      / (2 * h) for k in range(c)])
    np.testing.assert_allclose(gx, num_x, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(gs, num_s, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(go, num_o, rtol=1e-5, atol=1e-7)


def test_batch_norm_grad_types():
    b = Builder("t")
    ps = [b.param(dt.BF16, s) for s in ((2, 3, 4), (3,), (3,), (3,), (2, 3, 4))]
    n = b.op("batch-norm-grad", ps, epsilon=0.1, feature_index=1)
    assert str(n.type) == "(bf16[2,3,4], bf16[3], bf16[3])"


def _bn(op, shapes, fi=1, dtypes=None, **attrs):
    b = Builder("bad")
    ps = [b.param((dtypes or {}).get(i, dt.F32), s) for i, s in enumerate(shapes)]
    return b.op(op, ps, feature_index=fi, **({"epsilon": 1e-3} | attrs))


@pytest.mark.parametrize("make,needle", [
    (lambda: _bn("batch-norm-inference", [(2, 3), (3,), (3,), (3,), (3,)], fi=2),
     "feature_index 2 is out of range"),
    (lambda: _bn("batch-norm-inference", [(2, 3), (3,), (4,), (3,), (3,)]), "offset has 4 elements"),
    (lambda: _bn("batch-norm-inference", [(2, 3), (3,), (3,), (1, 3), (3,)]), "mean must have rank 1"),
    (lambda: _bn("batch-norm-inference", [(2, 3), (3,), (3,), (3,), (3,)], dtypes={0: dt.S32, 1: dt.S32}),
     "must be floating point"),
    (lambda: _bn("batch-norm-training", [(2, 3), (3,), (3,)], dtypes={2: dt.S32}), "offset is s32[3]"),
    (lambda: _bn("batch-norm-training", [(2, 3), (3,), (3,)], epsilon=None), "numeric epsilon"),
    (lambda: _bn("batch-norm-grad", [(2, 3), (3,), (3,), (3,), (3, 2)]), "output gradient is f32[3,2]"),
    (lambda: _bn("batch-norm-grad", [(2, 3), (2,), (3,), (3,), (2, 3)]), "scale has 2 elements"),
])
def test_batch_norm_shape_errors(make, needle):
    assert needle in expect_code("NCC_EVRF064", make)


def test_registry_entries():
    for name, neuron in (("batch-norm-inference", "Batchnorminference"), ("batch-norm-training", "Batchnorm"),
                         ("batch-norm-grad", "Batchnormgrad")):
        opdef = get(name)
        assert neuron in opdef.neuron and opdef.engine == "VectorE"

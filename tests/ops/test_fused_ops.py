"""The fused operators' declarations (nxsat/ops/fused.py): shape rules and reference semantics against
numpy/scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module
from nxsat.ir import Module


def _run(x: np.ndarray, d: dt.DType, **attrs) -> np.ndarray:
    b = Builder("e")
    p = b.param(d, x.shape)
    (out,) = run_module(Module("m", b.build(b.op("softmax", [p], **attrs))), [x])
    return out


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("scale", [1.0, 0.125, -2.0])
def test_softmax_is_scipys_softmax_of_the_scaled_operand(axis, scale):
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32) * 5
    got = _run(x, dt.F32, dimension=axis, scale=scale)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, special.softmax(x.astype(np.float64) * scale, axis=axis), rtol=1e-6, atol=1e-7)


def test_softmax_rounds_once_to_the_operand_type():
    x = dt.cast(np.random.default_rng(1).standard_normal((4, 9)), dt.BF16)
    got = _run(x, dt.BF16, dimension=1)
    want = dt.cast(special.softmax(x.astype(np.float64), axis=1), dt.BF16)
    np.testing.assert_array_equal(got, want)


def test_softmax_of_a_row_of_minus_infinity_is_nan():
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]], np.float32)
    got = _run(x, dt.F32, dimension=1)
    assert np.isnan(got[0]).all() and got[1].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("d,attrs,words", [
    (dt.S32, {"dimension": 0}, "not defined on s32"),
    (dt.F32, {"dimension": 2}, "not a dimension"),
    (dt.F32, {"dimension": 0, "scale": float("inf")}, "not a finite number"),
])
def test_softmax_shape_rule_refuses(d, attrs, words):
    b = Builder("e")
    p = b.param(d, (2, 3))
    with pytest.raises(NxsatError) as e:
        b.op("softmax", [p], **attrs)
    assert e.value.code == "NCC_EVRF064" and words in e.value.message


@pytest.mark.parametrize("name", ["gelu", "gelu-tanh", "silu"])
@pytest.mark.parametrize("d", [dt.F32, dt.BF16])
def test_activations_against_their_formulas(name, d):
    x = dt.cast(np.linspace(-12, 12, 97), d)
    xw = x.astype(np.float64)
    want = {"gelu": 0.5 * xw * special.erfc(-xw / np.sqrt(2)),
            "gelu-tanh": 0.5 * xw * (1 + np.tanh(np.sqrt(2 / np.pi) * (xw + 0.044715 * xw**3))),
            "silu": xw * special.expit(xw)}[name]
    got = _act(name, x, d)
    np.testing.assert_array_equal(got, dt.cast(want, d))


def _act(name: str, x: np.ndarray, d: dt.DType) -> np.ndarray:
    b = Builder("e")
    p = b.param(d, x.shape)
    (out,) = run_module(Module("m", b.build(b.op(name, [p]))), [x])
    return out


def test_activations_refuse_integers():
    b = Builder("e")
    with pytest.raises(NxsatError) as e:
        b.op("silu", [b.param(dt.S32, (2,))])
    assert e.value.code == "NCC_EVRF064"


# the row norms over the last dimension in fp64 (x: float64), with their epsilon and data seed
ROW_NORMS = {
    "layer-norm": (1e-5, 2, lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)),
    "rms-norm": (1e-6, 3, lambda x: x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6)),
}


@pytest.mark.parametrize("d", [dt.F32, dt.BF16])
@pytest.mark.parametrize("name", sorted(ROW_NORMS))
def test_row_norm_against_numpy(name, d):
    eps, seed, ref = ROW_NORMS[name]
    x = dt.cast(np.random.default_rng(seed).standard_normal((3, 5, 40)) * 3 + 1, d)
    b = Builder("e")
    p = b.param(d, x.shape)
    (got,) = run_module(Module("m", b.build(b.op(name, [p], epsilon=eps))), [x])
    np.testing.assert_array_equal(got, dt.cast(ref(x.astype(np.float64)), d))


def test_layer_norm_refuses_a_scalar_and_a_non_finite_epsilon():
    b = Builder("e")
    with pytest.raises(NxsatError):
        b.op("layer-norm", [b.param(dt.F32, ())], epsilon=1e-5)
    with pytest.raises(NxsatError) as e:
        b.op("layer-norm", [b.param(dt.F32, (2, 3))], epsilon=float("nan"))
    assert "not a finite number" in e.value.message


@pytest.mark.parametrize("shape,groups", [((2, 4, 5, 12), 3), ((1, 7, 6), 6), ((3, 8), 2)])
def test_group_norm_against_numpy(shape, groups):
    """Each (batch, group of consecutive channels) normalized over its positions and channels (rank 2: over
    the group's channels alone; groups = C: instance norm)."""
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32) * 2 + 0.5
    b = Builder("e")
    p = b.param(dt.F32, shape)
    (got,) = run_module(Module("m", b.build(b.op("group-norm", [p], groups=groups, epsilon=1e-6))), [x])
    xw = x.astype(np.float64)
    want = np.empty_like(xw)
    cg = shape[-1] // groups
    for n in range(shape[0]):
        for g in range(groups):
            part = xw[n][..., g * cg:(g + 1) * cg]
            want[n][..., g * cg:(g + 1) * cg] = (part - part.mean()) / np.sqrt(part.var() + 1e-6)
    np.testing.assert_array_equal(got, dt.cast(want, dt.F32))


def test_norms_refuse_what_they_cannot_normalize():
    b = Builder("e")
    with pytest.raises(NxsatError):
        b.op("rms-norm", [b.param(dt.F32, ())], epsilon=1e-5)
    with pytest.raises(NxsatError) as e:
        b.op("group-norm", [b.param(dt.F32, (2, 3, 10))], groups=4, epsilon=1e-5)
    assert "does not divide the 10 channels" in e.value.message
    with pytest.raises(NxsatError) as e:
        b.op("group-norm", [b.param(dt.F32, (10,))], groups=2, epsilon=1e-5)
    assert "batch and a channel" in e.value.message
    with pytest.raises(NxsatError):
        b.op("group-norm", [b.param(dt.S32, (2, 4))], groups=2, epsilon=1e-5)

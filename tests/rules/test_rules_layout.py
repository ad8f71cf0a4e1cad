"""Every rule of the layout set, shown firing on a small graph, with the e-graph still sound.

As tests/rules/test_rules_generic.py does for the generic set: each rule alone on a graph holding its
left-hand side must match, leave every e-node equal to its class's value, and extract a graph that
reproduces the original outputs. The layout rules only add alternatives (a channels-first twin, a
swapped dot); the cost model decides whether they are taken, so the smallest extraction is only
checked for its values here. A new layout rule without a case fails test_every_layout_rule_has_a_case.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from firing import fire_alone

from nxsat import dtypes as dt
from nxsat.attrs import ConvDims, DotDims, PadDim, WindowDim
from nxsat.builder import Builder
from nxsat.interpreter import run_module
from nxsat.ir import Module
from nxsat.rules.catalog import catalog
from nxsat.rules.terms import reducer_body

F32 = dt.F32
NCHW = (1, 4, 5, 6)  # a channels-first value; its channels-last view is [1, 5, 6, 4]
TO_NHWC = (0, 2, 3, 1)


def _view(b: Builder):  # noqa: ANN202
    """A channels-last view of a channels-first parameter: what the layout rules look through."""
    return b.op("transpose", [b.param(F32, NCHW)], dimensions=TO_NHWC)


def _binary(op: str, view_first: bool) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder(op)
        v, other = _view(b), b.param(F32, (1, 5, 6, 4))
        return b.module(b.op(op, [v, other] if view_first else [other, v]))
    return make


def _unary(op: str, **attrs) -> Callable[[], Module]:  # noqa: ANN003
    def make() -> Module:
        b = Builder(op)
        return b.module(b.op(op, [_view(b)], **attrs))
    return make


def _binary_with(op: str, view_first: bool, **attrs) -> Callable[[], Module]:  # noqa: ANN003
    def make() -> Module:
        b = Builder(op)
        v, other = _view(b), b.param(F32, (1, 5, 6, 4))
        return b.module(b.op(op, [v, other] if view_first else [other, v], **attrs))
    return make


def _select(which: int) -> Callable[[], Module]:
    """select(pred, on_true, on_false) with operand ``which`` a channels-last view (of a predicate: what
    layout-compare-* make of a compare of a view)."""
    def make() -> Module:
        b = Builder("select")
        ops = [b.param(dt.PRED, (1, 5, 6, 4)), b.param(F32, (1, 5, 6, 4)), b.param(F32, (1, 5, 6, 4))]
        ops[which] = b.op("transpose", [b.param(dt.PRED if which == 0 else F32, NCHW)], dimensions=TO_NHWC)
        return b.module(b.op("select", ops))
    return make


def _conv() -> Module:
    b = Builder("conv")  # a Keras-style NHWC convolution: its output channels-last
    x, w = b.param(F32, (1, 5, 5, 4)), b.param(F32, (3, 3, 4, 6))
    window = (WindowDim(3, 1, 1, 1), WindowDim(3, 1, 1, 1))
    return b.module(b.op("convolution", [x, w], window=window, dims=ConvDims.from_labels("b01f_01io->b01f"),
                         feature_group_count=1, batch_group_count=1))


def _broadcast() -> Module:
    b = Builder("bcast")  # a per-channel value broadcast channels-last, then seen channels-first
    y = b.op("broadcast", [b.param(F32, (4,))], shape=(1, 5, 6, 4), dimensions=(3,))
    return b.module(b.op("transpose", [y], dimensions=(0, 3, 1, 2)))


def _pad() -> Module:
    b = Builder("pad")
    return b.module(b.op("pad", [_view(b), b.constant(0.0, F32)],
                         padding=(PadDim(0, 0), PadDim(1, 1), PadDim(0, 2), PadDim(0, 0))))


def _reduce_window() -> Module:
    b = Builder("pool")  # a 3x3 max pooling, stride 2, of a channels-last view
    window = (WindowDim(1, 1, 0, 0), WindowDim(3, 2, 1, 1), WindowDim(3, 2, 1, 1), WindowDim(1, 1, 0, 0))
    return b.module(b.op("reduce-window", [_view(b), b.constant(-np.inf, F32)], window=window,
                         to_apply=reducer_body("maximum", "f32")))


def _reduce(dims: tuple[int, ...]) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder("reduce")
        return b.module(b.op("reduce", [_view(b), b.constant(0.0, F32)], dimensions=dims,
                             to_apply=reducer_body("add", "f32")))
    return make


def _dot_swap() -> Module:
    b = Builder("dswap")  # a batched dot: the swap trades its free dimensions
    a, c = b.param(F32, (5, 2, 3)), b.param(F32, (5, 3, 4))
    return b.module(b.op("dot", [a, c], dims=DotDims((2,), (1,), (0,), (0,))))


def _oriented(op: str, view_first: bool) -> Callable[[], Module]:
    """A swapped dot's result seen in the written orientation, combined with a broadcast value: what the
    transpose-* rules carry into the dot's own orientation."""
    def make() -> Module:
        b = Builder(op)
        v = b.op("transpose", [b.param(F32, (2, 3, 4))], dimensions=(2, 0, 1))  # [4, 2, 3]
        other = b.op("broadcast", [b.param(F32, (3,))], shape=(4, 2, 3), dimensions=(2,))
        return b.module(b.op(op, [v, other] if view_first else [other, v]))
    return make


def _oriented_convert() -> Module:
    b = Builder("tconvert")
    v = b.op("transpose", [b.param(F32, (2, 3, 4))], dimensions=(2, 0, 1))
    return b.module(b.op("convert", [v], dtype=dt.BF16))


CASES: dict[str, Callable[[], Module]] = {
    "transpose-add-broadcast-lhs": _oriented("add", True),
    "transpose-add-broadcast-rhs": _oriented("add", False),
    "transpose-multiply-broadcast-lhs": _oriented("multiply", True),
    "transpose-multiply-broadcast-rhs": _oriented("multiply", False),
    "transpose-divide-broadcast": _oriented("divide", True),
    "transpose-convert": _oriented_convert,
    "dot-swap-operands": _dot_swap,
    "conv-channels-first": _conv,
    **{f"layout-{op}-{side}": _binary(op, side == "lhs")
       for op in ("add", "subtract", "multiply", "divide", "maximum", "minimum") for side in ("lhs", "rhs")},
    "layout-convert": _unary("convert", dtype=dt.BF16),
    "layout-negate": _unary("negate"),
    "layout-logistic": _unary("logistic"),
    "layout-silu": _unary("silu"),
    **{f"layout-{op}": _unary(op) for op in (
        "abs", "sign", "floor", "ceil", "round-nearest-even", "exponential", "exponential-minus-one", "log",
        "log-plus-one", "sqrt", "rsqrt", "tanh", "erf", "sine", "cosine")},
    **{f"layout-{op}-{side}": _binary(op, side == "lhs")
       for op in ("power", "remainder", "atan2") for side in ("lhs", "rhs")},
    "layout-compare-lhs": _binary_with("compare", True, direction="LT"),
    "layout-compare-rhs": _binary_with("compare", False, direction="GE"),
    "layout-select-pred": _select(0),
    "layout-select-true": _select(1),
    "layout-select-false": _select(2),
    "layout-broadcast": _broadcast,
    "layout-pad": _pad,
    "layout-reduce-window": _reduce_window,
    "layout-reduce-spatial": _reduce((1, 2)),
    "layout-reduce-per-channel": _reduce((0, 1, 2)),
}


def test_every_layout_rule_has_a_case() -> None:
    assert {r.name for r in catalog().set_rules(["layout"])} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_and_stays_equivalent(name: str) -> None:
    module = CASES[name]()
    rng = np.random.default_rng(0)
    inputs = [dt.cast(rng.standard_normal(p.type.shape), p.type.dtype) for p in module.entry.params]
    out = fire_alone(name, module, inputs)
    for a, b in zip(run_module(module, inputs), run_module(out, inputs), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-6, atol=1e-6)

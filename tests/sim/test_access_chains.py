"""Accesses as chains: an index after a view (``x.reshape(400, 64)[0:128, :]``), with exact footprints for
the race, read-before-write and coverage checks even when the element set is no box of the declared
dimensions (a row range of a reshaped tensor spans rows)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nxsat import dtypes as dt
from nxsat import sim
from nxsat.diagnostics import NxsatError
from nxsat.sim.program import AP, Access, Idx, Tensor, ap_runs, index_box, resolve, runs_overlap

BASE = """.isa 1.1
.target trn1
input x: f32[4, 100, 64]
output y: f32[4, 100, 64]
sbuf a: f32[128, 64]
sem s
q0 dma a, x.reshape(400, 64)[0:128, :], signal=s
q1 dma y.reshape(400, 64)[0:128, :], a, wait=s>=1
"""


def test_tiles_of_a_reshaped_tensor_move_the_right_rows() -> None:
    text = BASE + "q4 dma y.reshape(400, 64)[128:400, :], x[1:4, :, :].reshape(300, 64)[28:300, :]\n"
    m = sim.load(sim.assemble(text, "t.nxs"), verify=True)
    x = np.random.default_rng(0).standard_normal((4, 100, 64)).astype(np.float32)
    np.testing.assert_array_equal(m.run({"x": x})[0], x)
    assert sim.assemble(m.text, "again.nxs") == sim.assemble(text, "t.nxs")


@pytest.mark.parametrize("extra,code", [
    ("q2 dma y.reshape(400, 64)[100:400, :], x.reshape(400, 64)[100:400, :]\n", "NCC_EASM008"),  # rows 100..127
    ("q2 dma y.reshape(400, 64)[129:400, :], x.reshape(400, 64)[129:400, :]\n", "NCC_EASM007"),  # row 128 unwritten
])
def test_footprints_are_exact(extra: str, code: str) -> None:
    with pytest.raises(NxsatError) as e:
        sim.assemble(BASE + extra, "t.nxs")
    assert e.value.code == code


def test_a_row_range_that_spans_rows_is_not_a_box() -> None:
    t = Tensor("x", "input", dt.F32, (4, 100, 64))
    acc = Access("x", (), (("reshape", (400, 64)), ("index", (Idx(90, 210), Idx(0, 64)))))
    assert index_box(acc, t) is None
    whole = Access("x", (), (("reshape", (400, 64)), ("index", (Idx(100, 200), Idx(0, 64)))))
    assert index_box(whole, t) == ((1, 2, 1), (0, 100, 1), (0, 64, 1))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.integers(0, 39), st.integers(1, 40), st.integers(0, 39), st.integers(1, 40), st.integers(1, 3))
def test_run_overlap_agrees_with_element_sets(a0: int, an: int, b0: int, bn: int, step: int) -> None:
    """Flat intervals of two strided row ranges of a [40, 6] matrix meet exactly when their elements do."""
    def elems(r0: int, n: int) -> tuple[set[int], AP]:
        n = min(n, (40 - r0 + step - 1) // step)
        ap = AP(r0 * 6, ((n, 6 * step), (3, 2)))
        return {r0 * 6 + i * 6 * step + j * 2 for i in range(n) for j in range(3)}, ap
    ea, pa = elems(a0, an)
    eb, pb = elems(b0, bn)
    assert runs_overlap(ap_runs(pa), ap_runs(pb)) == bool(ea & eb)
    assert resolve(Access("m", (Idx(0, 40), Idx(0, 6))), Tensor("m", "input", dt.F32, (40, 6))).shape == (40, 6)


@pytest.mark.parametrize("seed", range(40))
def test_run_overlap_of_few_intervals_against_many(seed: int) -> None:
    """The few-interval path (bisection per interval) and the vectorised one agree with element sets."""
    rng = np.random.default_rng(seed)

    def runs(n: int) -> tuple[tuple[np.ndarray, np.ndarray], set[int]]:
        cuts = np.sort(rng.choice(400, 2 * n, replace=False)).astype(np.int64)
        s, e = cuts[0::2], cuts[1::2]
        return (s, e), {x for a, b in zip(s.tolist(), e.tolist()) for x in range(a, b)}

    few, fe = runs(int(rng.integers(1, 7)))
    many, me = runs(int(rng.integers(1, 60)))
    assert runs_overlap(few, many) == runs_overlap(many, few) == bool(fe & me)

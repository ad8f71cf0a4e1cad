"""Round trip: load -> saturate (-O1, -O2, -O3) -> extract -> reference interpreter reproduces XLA's
outputs for every JAX case; the large corpus models round-trip at -O1 and -O2 (slow)."""

from __future__ import annotations

import numpy as np
import pytest
from test_xla_ops import STATISTICAL, accumulates, assert_output

from conftest import DATA, JAX_CORPUS, assert_matches_reference
from nxsat.diagnostics import NxsatError
from nxsat.extract import optimize
from nxsat.frontend import load
from nxsat.interpreter import run_module
from nxsat.io import match_inputs, read_npz
from nxsat.passes import canonicalize


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in JAX_CORPUS])
def test_saturated_and_extracted_graph_reproduces_xla(path, level):
    m = load(path)
    ref = read_npz(path.with_suffix(".npz"))
    result = optimize(m, level=level)
    assert result.report.stop_reason in ("saturated", "iteration limit", "node limit", "time limit")
    outs = run_module(result.module, match_inputs(result.module, ref))
    assert len(outs) == len([k for k in ref if k.startswith("out")])
    for i, o in enumerate(outs):
        assert_matches_reference(o, ref[f"out{i}"], f"{path.stem} out{i}")


def test_extraction_keeps_names_when_nothing_changes():
    m = load(DATA / "jax" / "topk.hlo")
    out = optimize(m, level=2).module
    names = [n.name for n in canonicalize(m).entry.post_order()]
    assert [n.name for n in out.entry.post_order()] == names


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50_keras_jax_f32.hlo", "gemma3_1b_flax_call.hlo"])
@pytest.mark.parametrize("level", [1, 2])
def test_large_models_round_trip(name, level):
    m = load(DATA / "hlo" / name)
    result = optimize(m, level=level)
    out = result.module
    assert [p.type for p in out.entry.params] == [p.type for p in m.entry.params]
    assert out.outputs == m.outputs
    assert len(out.entry.post_order()) <= len(canonicalize(m).entry.post_order())  # smallest: never bigger
    if name.startswith("resnet"):
        rng = np.random.default_rng(0)
        inputs = [(rng.standard_normal(p.type.shape) * 0.1).astype(p.type.dtype.np) for p in m.entry.params]
        for a, b in zip(run_module(m, inputs), run_module(out, inputs)):
            scale = float(np.max(np.abs(a.astype(np.float64))))
            np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=1e-4, atol=1e-5 * scale)


XLA_OPS = sorted((DATA / "xla_ops").glob("*.hlo"))


def _op_case(i: int, path):  # noqa: ANN202
    return pytest.param(path, id=path.stem, marks=[] if i % 10 == 0 else [pytest.mark.slow])


@pytest.mark.parametrize("path", [_op_case(i, p) for i, p in enumerate(XLA_OPS)])
def test_every_operator_case_round_trips(path):
    """Per-operator fixtures exercise every attribute spelling: after -O2 and extraction the graph
    computes what XLA computed, output for output, with test_xla_ops's comparison (a rule that breaks a
    convolution's window reversal is caught against XLA, not only against the interpreter, which might
    share the mistake; and a dropped output is counted)."""
    m = load(path)
    ref = read_npz(path.with_suffix(".npz"))
    try:
        run_module(m, match_inputs(m, ref))
    except NxsatError:
        pytest.skip("the interpreter does not run this case")
    out = optimize(m, level=2).module
    got = run_module(out, match_inputs(out, ref))
    want = [ref[f"out{i}"] for i in range(sum(k.startswith("out") for k in ref))]
    assert len(got) == len(want) == len(out.outputs), f"{len(got)} outputs, XLA gave {len(want)}"
    for i, (g, w, t) in enumerate(zip(got, want, out.outputs)):
        if path.stem in STATISTICAL:
            STATISTICAL[path.stem](g)
        else:
            assert_output(g, w, t, f"{path.stem} out{i}", accumulated=accumulates(m))

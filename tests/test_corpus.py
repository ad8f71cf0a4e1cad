"""The real corpus: every module parses and validates, inspects, survives passes and printing, and
the JAX cases reproduce XLA's outputs in the reference interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import HLO_CORPUS, JAX_CORPUS, assert_matches_reference
from nxsat.frontend import load, loads
from nxsat.interpreter import run_module
from nxsat.io import match_inputs, read_npz
from nxsat.modelinfo import model_info
from nxsat.passes import canonicalize, has_control_flow
from nxsat.printer import to_hlo_text

ALL = JAX_CORPUS + HLO_CORPUS
BIG = {"gemma3_1b_flax_call.hlo", "mobilenet_v2.hlo", "resnet50_keras_jax_f32.hlo"}


def _mark(path: Path):  # noqa: ANN202
    return pytest.param(path, id=path.name, marks=[pytest.mark.slow] if path.name in BIG else [])


@pytest.mark.parametrize("path", [_mark(p) for p in ALL])
def test_parses_validates_and_inspects(path):
    m = load(path)
    info = model_info(m)
    assert info.instructions > 0 and info.parameters is not None
    if any(n.op in ("dot", "convolution") for c in m.computations.values() for n in c.instructions):
        assert info.flops["matmul"] > 0


@pytest.mark.slow
def test_gemma_inspects_with_exact_dot_flops():
    m = load(Path(HLO_CORPUS[0]).parent / "gemma3_1b_flax_call.hlo")
    info = model_info(m)
    assert info.instructions > 9000 and len(info.parameters) > 300
    # Every dot's FLOPs: 2 * prod(result dims) * prod(contracting dims), summed over the canonical graph.
    canon = canonicalize(m)
    expect = 0
    for n in canon.entry.post_order():
        if n.op == "dot":
            lhs = n.operands[0].shape
            k = int(np.prod([lhs[d] for d in n.attrs["dims"].lhs_contracting]))
            expect += 2 * int(np.prod(n.shape)) * k
    assert info.flops["dot"] == expect > 1e9


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in JAX_CORPUS])
def test_interpreter_reproduces_xla_outputs(path):
    m = load(path)
    ref = read_npz(path.with_suffix(".npz"))
    outs = run_module(m, match_inputs(m, ref))
    n_ref = len([k for k in ref if k.startswith("out")])
    assert len(outs) == n_ref
    for i, o in enumerate(outs):
        assert_matches_reference(o, ref[f"out{i}"], f"{path.stem} out{i}")


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in JAX_CORPUS])
def test_canonical_form_is_flat_and_equivalent(path):
    m = load(path)
    c = canonicalize(m)
    assert not has_control_flow(c.entry)
    assert not any(n.op == "while" for n in c.entry.post_order())  # every JAX loop here is static
    ref = read_npz(path.with_suffix(".npz"))
    for i, o in enumerate(run_module(c, match_inputs(c, ref))):
        assert_matches_reference(o, ref[f"out{i}"], f"{path.stem} out{i}")


@pytest.mark.parametrize("path", [_mark(p) for p in ALL])
def test_printed_text_parses_back_to_the_same_text(path):
    m = load(path)
    text = to_hlo_text(m)
    again = loads(text, "printed.hlo")
    assert to_hlo_text(again) == text

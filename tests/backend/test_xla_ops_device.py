"""Every per-operator case of tests/data/xla_ops on the device: each is compiled for trn1 and trn2,
run on the simulator and compared with the reference interpreter on the case's inputs, or refused
with the code and reason the docs give. The operator families test their own cases (with their own
input handling: 64-bit values, distributions) in their modules; this module tests the rest and
checks that no case is left out."""

from __future__ import annotations

import pytest
import test_conv
import test_elementwise
import test_indexing_lowering
import test_reduce_lowering
from harness import DATA, assert_device_matches

from nxsat.diagnostics import NxsatError
from nxsat.frontend import load
from nxsat.io import match_inputs, read_npz
from nxsat.passes import canonicalize

XLA = DATA / "xla_ops"
ALL = sorted(p.stem for p in XLA.glob("*.hlo"))
FAMILY_TESTS = {"test_conv": set(test_conv.XLA_CASES), "test_elementwise": set(test_elementwise.CASES),
                "test_indexing_lowering": set(test_indexing_lowering.CASES),
                "test_reduce_lowering": set(test_reduce_lowering.CASES)}
OWNED = set().union(*FAMILY_TESTS.values())
CASES = [c for c in ALL if c not in OWNED]

# docs/compiling.md, "What runs on the device": the device program has no branches, so a loop runs
# only once canonicalize has unrolled it (a static trip count within the budget).
REFUSED = {
    "while_data_dependent": ("NCC_EUOC002", "while"),
    "while_fori_dynamic": ("NCC_EUOC002", "while"),
    "while_fori_dynamic_zero_trips": ("NCC_EUOC002", "while"),
    # the NeuronCore has no 64-bit floats (docs/compiling.md)
    **{c: ("NCC_ESPP004", "f64") for c in CASES if "f64" in c},
    # an output f32[8,0,7]: the device program declares no empty tensors (docs/compiling.md)
    "slice_strided": ("NCC_EUOC002", "without elements"),
}


def test_every_case_is_tested() -> None:
    assert set(ALL) == OWNED | set(CASES) and len(ALL) > 300
    assert set(REFUSED) <= set(CASES)


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("name", CASES)
def test_case_on_the_device(name: str, target: str) -> None:
    module = canonicalize(load(XLA / f"{name}.hlo"))
    arrays = read_npz(XLA / f"{name}.npz")
    ins = match_inputs(module, {k: v for k, v in arrays.items() if k.startswith("in")}, f"{name}.npz")
    inputs = {f"in{i}": v for i, v in enumerate(ins)}
    if name in REFUSED:
        code, what = REFUSED[name]
        with pytest.raises(NxsatError) as e:
            assert_device_matches(module, inputs, target)
        assert e.value.code == code and what in e.value.message and e.value.loc is not None
        return
    assert_device_matches(module, inputs, target)


def test_refusals_are_documented() -> None:
    text = (DATA.parents[1] / "docs" / "compiling.md").read_text()
    assert "data-dependent trip count" in text and "`f64` is refused (NCC_ESPP004)" in text
    assert "input or output without elements" in text
    assert all(c.startswith("while_") or "f64" in c or c == "slice_strided" for c in REFUSED)

"""Compiled JAX models (tests/data/jax) reproduce XLA's outputs on the simulator."""

from __future__ import annotations

import numpy as np
import pytest
from harness import DATA, assert_device_matches, module_of

CASES = ["batched_matmul", "layernorm", "mlp", "power", "slicing", "softmax", "transformer_layer", "where_mask"]


@pytest.mark.parametrize("target", ["trn1", "trn2"])
@pytest.mark.parametrize("name", CASES)
def test_jax_case_matches_xla(name: str, target: str) -> None:
    ref = np.load(DATA / "jax" / f"{name}.npz")
    inputs = {k: ref[k] for k in ref.files if k.startswith("in")}
    expected = [ref[f"out{i}"] for i in range(sum(1 for k in ref.files if k.startswith("out")))]
    assert_device_matches(module_of(DATA / "jax" / f"{name}.hlo", optimized=True), inputs, target,
                          expected=expected)

"""The zoo of tests/data/zoo (models as users write them: a ViT's patches, Swin's relative-position bias,
an EfficientNet block, CLIP's and BERT's additive masks, bf16 inputs, a CNN on a batch), compiled for trn1 under generic
and each model type, run on the simulator, reproduce XLA's outputs: fp32 within rtol 1e-5 and
atol 1e-5 x max|reference| (the bf16 model too: its results are bf16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from harness import DATA

from nxsat import sim
from nxsat.driver import CompileOptions, compile_model
from nxsat.frontend import load
from nxsat.io import match_inputs, read_npz

ZOO = DATA / "zoo"
CASES = sorted(p.stem for p in ZOO.glob("*.hlo"))


def test_every_zoo_model_is_here() -> None:
    assert CASES == ["bert_padding", "bf16_mlp", "clip_causal", "cnn_batch4", "mbconv", "swin_window", "vit_patch"]
    assert all((ZOO / f"{c}.npz").exists() for c in CASES)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["generic", "transformer", "unet-inference"])
@pytest.mark.parametrize("name", CASES)
def test_zoo_model_matches_xla(name: str, model_type: str) -> None:
    path = str(ZOO / f"{name}.hlo")
    result = compile_model(path, CompileOptions(target="trn1", optlevel=2, model_type=model_type))
    ref = read_npz(ZOO / f"{name}.npz")
    inputs = match_inputs(load(path), ref)  # bf16 inputs saved raw (|V2) are read as bf16
    got = sim.load(result.neff, verify=True).run({f"in{i}": v for i, v in enumerate(inputs)})
    expected = [ref[f"out{i}"] for i in range(sum(1 for k in ref if k.startswith("out")))]
    assert len(got) == len(expected)
    for k, (g, w) in enumerate(zip(got, expected)):
        if w.dtype.kind == "V":  # a bf16 result, saved raw
            w = w.view(ml_dtypes.bfloat16)
        assert g.shape == w.shape, f"out{k}"
        wf = w.astype(np.float64)
        scale = float(np.abs(wf).max(initial=0.0))
        assert np.isfinite(wf).all()
        np.testing.assert_allclose(g.astype(np.float64), wf, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{name} out{k}")

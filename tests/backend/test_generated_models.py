"""The generated models of tests/data/models (a 2,048-position causal attention, a GPT decoding step with
a KV cache, a diffusers-style UNet, a ResNet with inference BatchNorm), compiled at -O2 for trn1 under
generic and under each model type, run on the simulator, reproduce XLA's outputs: with --auto-cast none
within rtol 1e-5 and atol 1e-5 x max|reference| (the JAX models' bound), and the fused operators each
type is meant to extract are extracted."""

from __future__ import annotations

import numpy as np
import pytest
from harness import DATA

from nxsat import sim
from nxsat.driver import CompileOptions, compile_model

MODELS = DATA / "models"
CASES = sorted(p.stem for p in MODELS.glob("*.hlo"))
# what each model type extracts (fused operator -> count); generic extracts none. Both types run the
# activations and attention sets; only transformer has the layer norms, only unet-inference the group norms.
FUSED = {
    ("attention_s2048", "transformer"): {"softmax": 1},
    ("attention_s2048", "unet-inference"): {"softmax": 1},
    ("gpt_decoder", "transformer"): {"gelu-tanh": 2, "layer-norm": 5, "softmax": 2},
    ("gpt_decoder", "unet-inference"): {"gelu-tanh": 2, "softmax": 2},
    ("unet_diffusers", "transformer"): {"silu": 7, "softmax": 1},
    ("unet_diffusers", "unet-inference"): {"group-norm": 8, "silu": 7, "softmax": 1},
}


def test_every_generated_model_is_here() -> None:
    assert CASES == ["attention_s2048", "gpt_decoder", "resnet_small", "unet_diffusers"]
    assert all((MODELS / f"{c}.npz").exists() for c in CASES)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["generic", "transformer", "unet-inference"])
@pytest.mark.parametrize("name", CASES)
def test_generated_model_matches_xla(name: str, model_type: str) -> None:
    result = compile_model(str(MODELS / f"{name}.hlo"), CompileOptions(target="trn1", optlevel=2,
                                                                      model_type=model_type))
    assert result.report["fused"] == FUSED.get((name, model_type), {})
    ref = np.load(MODELS / f"{name}.npz")
    got = sim.load(result.neff, verify=True).run({k: ref[k] for k in ref.files if k.startswith("in")})
    expected = [ref[f"out{i}"] for i in range(sum(1 for k in ref.files if k.startswith("out")))]
    assert len(got) == len(expected)
    for k, (g, w) in enumerate(zip(got, expected)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"out{k}"
        wf = w.astype(np.float64)
        scale = float(np.abs(wf).max(initial=0.0))
        assert np.isfinite(wf).all()
        np.testing.assert_allclose(g.astype(np.float64), wf, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{name} out{k}")

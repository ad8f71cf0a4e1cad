"""Every JAX model of tests/data/jax, compiled by `nxsat compile`'s driver at -O1, -O2 and -O3 (each
level's extractor: tree greedy, DAG greedy, ILP) with --auto-cast none for trn1 (and trn2 at -O2), run
on the simulator, reproduces XLA's outputs: floats
within rtol 1e-5 and atol 1e-5 x max|reference| (the issue's bound), everything else exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from harness import DATA

from nxsat import sim
from nxsat.driver import CompileOptions, compile_model

CASES = sorted(p.stem for p in (DATA / "jax").glob("*.hlo"))


def _xla(name: str) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    ref = np.load(DATA / "jax" / f"{name}.npz")
    inputs = {k: ref[k] for k in ref.files if k.startswith("in")}
    return inputs, [ref[f"out{i}"] for i in range(sum(1 for k in ref.files if k.startswith("out")))]


def test_every_jax_model_is_here() -> None:
    assert len(CASES) == 14 and all((DATA / "jax" / f"{c}.npz").exists() for c in CASES)


@pytest.mark.parametrize("target,opt", [("trn1", 1), ("trn1", 2), ("trn1", 3), ("trn2", 2)])
@pytest.mark.parametrize("name", CASES)
def test_jax_model_matches_xla(name: str, target: str, opt: int) -> None:
    _matches_xla(name, CompileOptions(target=target, optlevel=opt))


@pytest.mark.parametrize("model_type", ["transformer", "unet-inference"])
@pytest.mark.parametrize("name", CASES)
def test_jax_model_matches_xla_under_each_model_type(name: str, model_type: str) -> None:
    _matches_xla(name, CompileOptions(target="trn1", optlevel=2, model_type=model_type))


def _matches_xla(name: str, opts: CompileOptions) -> None:
    result = compile_model(str(DATA / "jax" / f"{name}.hlo"), opts)
    model = sim.load(result.neff, verify=True)
    inputs, expected = _xla(name)
    got = model.run(inputs)
    assert len(got) == len(expected)
    for k, (g, w) in enumerate(zip(got, expected)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"out{k}"
        if w.dtype.kind == "f" or "float" in str(w.dtype):
            wf = w.astype(np.float64)
            scale = float(np.abs(wf[np.isfinite(wf)]).max(initial=0.0))
            np.testing.assert_allclose(g.astype(np.float64), wf, rtol=1e-5, atol=1e-5 * scale, equal_nan=True,
                                       err_msg=f"{name} out{k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{name} out{k}")


def test_nxsat_run_reproduces_xla_from_the_command_line(tmp_path: Path) -> None:
    """The user's path: `nxsat compile`, then `nxsat run` on the XLA inputs."""
    from nxsat.cli import main

    neff = tmp_path / "mlp.neff"
    assert main(["compile", str(DATA / "jax" / "mlp.hlo"), "-o", str(neff), "--logfile", ""]) == 0
    out = tmp_path / "out.npz"
    assert main(["run", str(neff), "--inputs", str(DATA / "jax" / "mlp.npz"), "-o", str(out)]) == 0
    got = np.load(out)
    _, expected = _xla("mlp")
    np.testing.assert_allclose(got["out0"], expected[0], rtol=1e-5, atol=1e-5 * float(np.abs(expected[0]).max()))

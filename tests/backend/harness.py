"""Helpers of the backend tests: compile a model (text or file) for a target, run it on the simulator
and compare with the reference interpreter (or with XLA's outputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nxsat import sim
from nxsat.backend import compile_graph
from nxsat.extract import optimize
from nxsat.frontend import load, loads
from nxsat.interpreter import run_module
from nxsat.io import match_inputs
from nxsat.ir import Module
from nxsat.passes import canonicalize

DATA = Path(__file__).resolve().parents[1] / "data"


def module_of(source: str | Path, optimized: bool = False) -> Module:
    """A model from a path or from HLO text."""
    m = load(str(source)) if isinstance(source, Path) or str(source).endswith((".hlo", ".relay")) else \
        loads(str(source), "test.hlo")
    return optimize(m).module if optimized else canonicalize(m)


def device_run(module: Module, inputs: dict[str, np.ndarray], target: str = "trn1", verify: bool = True
               ) -> tuple[list[np.ndarray], sim.Model]:
    """Compile for ``target``, build and load the NEFF (checked), run it: the outputs and the model."""
    t = sim.load_target(target)
    c = compile_graph(module, t)
    model = sim.load(sim.build_neff(c.program, t, c.constants), verify=verify)
    return model.run(inputs), model


def lowered(module: Module, target: str = "trn1") -> list:
    """The module's instructions as lowering made them (before forwarding and scheduling)."""
    from nxsat.backend import device_forms, lower_graph

    t = sim.load_target(target)
    return lower_graph(device_forms(module, t), t).graph.insts


def input_loads(module: Module, shape: tuple[int, ...], target: str = "trn1") -> list:
    """The lowered DMAs that read the model input of ``shape``: how a test sees an operand loaded."""
    return [i for i in lowered(module, target) if i.engine == "dma" and i.reads[0].buf.kind == "input"
            and i.reads[0].buf.shape == shape]


def reference_run(module: Module, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    out = run_module(module, match_inputs(module, inputs))
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def random_inputs(module: Module, seed: int = 0) -> dict[str, np.ndarray]:
    from nxsat.cli.model import random_inputs as cli_random

    return cli_random(module, seed)


def assert_device_matches(module: Module, inputs: dict[str, np.ndarray] | None = None, target: str = "trn1",
                          rtol: float = 1e-5, atol_scale: float = 1e-5, expected: list[np.ndarray] | None = None
                          ) -> sim.Model:
    """Compiled on ``target`` and simulated, the model gives the interpreter's outputs (or ``expected``):
    floats within ``rtol`` and ``atol_scale * max|reference|``, everything else exactly. Counts outputs."""
    inputs = random_inputs(module) if inputs is None else inputs
    got, model = device_run(module, inputs, target)
    want = reference_run(module, inputs) if expected is None else expected
    assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        w = np.asarray(w)
        assert g.shape == w.shape, f"out{k}: shape {g.shape}, expected {w.shape}"
        if w.dtype.kind == "f" or str(w.dtype) in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            gf, wf = g.astype(np.float64), w.astype(np.float64)
            finite = np.isfinite(wf)
            scale = float(np.abs(wf[finite]).max()) if finite.any() else 0.0
            np.testing.assert_allclose(gf, wf, rtol=rtol, atol=atol_scale * scale, equal_nan=True,
                                       err_msg=f"out{k}")
        else:
            np.testing.assert_array_equal(g.astype(w.dtype), w, err_msg=f"out{k}")
    return model

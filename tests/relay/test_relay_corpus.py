"""The TVM v0.19 Relay corpus (tests/data/relay): every model loads with its constants spec,
type-checks against its declared return type, and runs in the reference interpreter with finite
outputs; the small ones are also checked against numpy implementations written here."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from relay_numpy_ref import ref_conv2d, ref_pool2d
from relay_testkit import DATA

from nxsat.diagnostics import NxsatError
from nxsat.frontend.relay import parse_relay
from nxsat.interpreter import run_module

MODELS = {  # name: (output shapes, slow)
    "mnist": ([(1, 10)], False),
    "batch_norm_extract": ([(1, 32, 112, 112)], False),
    "gpt2_extract": ([(50, 32, 3072)], False),
    "resnet50": ([(1, 1000)], True),
    "resnext50_32x4d": ([(1, 2048, 7, 7)], True),
}


def consts_path(name):
    fixed = DATA / f"{name}.consts.tvm.json"
    return fixed if fixed.exists() else DATA / f"{name}.consts.json"


def declared_return(text):
    """The `-> Tensor[(...), dtype]` of @main, read with a regex (independent of the grammar)."""
    m = re.search(r"def @main\(.*?\)\s*->\s*Tensor\[\(([0-9, ]*)\), (\w+)\]", text, re.S)
    return None if m is None else (tuple(int(d) for d in m.group(1).split(",") if d.strip()), m.group(2))


def load(name, seed=0):
    text = (DATA / f"{name}.relay").read_text()
    return text, parse_relay(text, f"{name}.relay", consts_path(name), seed)


def run_seeded(module, seed=0):
    rng = np.random.default_rng(seed)
    inputs = [rng.random(p.type.shape).astype(p.type.dtype.np) for p in module.params]
    return run_module(module, inputs)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if slow else n for n, (_, slow) in MODELS.items()]
)
def test_corpus_model_loads_checks_and_runs(name, monkeypatch):
    """... and runs each operator of the model exactly once (its running time: bench/unit_timings.py)."""
    from nxsat.interpreter import Interpreter

    text, module = load(name)
    assert module.framework == "RELAY"
    declared = declared_return(text)
    if declared is not None:
        assert module.entry.result_type.shape == declared[0]
        assert module.entry.result_type.dtype.relay == declared[1]
    entry = [n for n in module.entry.post_order() if n.op != "parameter"]
    ids = {n.id for n in entry}
    runs: dict[int, int] = {}
    run_node = Interpreter.run_node

    def counting(self, node, *rest, **kw):
        if node.id in ids:
            runs[node.id] = runs.get(node.id, 0) + 1
        return run_node(self, node, *rest, **kw)

    monkeypatch.setattr(Interpreter, "run_node", counting)
    outputs = run_seeded(module)
    assert len(runs) == len(entry) and set(runs.values()) == {1}
    assert [o.shape for o in outputs] == MODELS[name][0]
    for o in outputs:
        assert np.all(np.isfinite(o)) and np.std(o) > 0
    assert not list(module.warnings)


def test_corpus_structure():
    _, resnet = load("resnet50")
    ops = [n.op for n in resnet.entry.post_order()]
    text = (DATA / "resnet50.relay").read_text()
    assert ops.count("convolution") == text.count("nn.conv2d(") == 53
    assert ops.count("batch-norm-inference") == text.count("nn.batch_norm(")
    assert ops.count("dot") == 1 and ops.count("reduce-window") == 1
    _, resnext = load("resnext50_32x4d")
    groups = [n.attrs["feature_group_count"] for n in resnext.entry.post_order() if n.op == "convolution"]
    assert groups.count(32) == 16 and len(groups) == 52


def test_corpus_batch_norm_consts_json_is_incomplete():
    """The corpus's batch_norm_extract.consts.json is `[]` although the program uses four
    constants: that is the missing-constant error, at the first use."""
    text = (DATA / "batch_norm_extract.relay").read_text()
    assert json.loads((DATA / "batch_norm_extract.consts.json").read_text()) == []
    with pytest.raises(NxsatError) as e:
        parse_relay(text, "batch_norm_extract.relay", DATA / "batch_norm_extract.consts.json")
    assert e.value.code == "NCC_ERLY002" and "meta[relay.Constant][0]" in e.value.message
    assert (e.value.loc.line, e.value.loc.column) == (3, 38)


def spec_arrays(name, rng):
    spec = json.loads(consts_path(name).read_text())
    return {i: rng.standard_normal(shape).astype(dtype) for i, (shape, dtype) in enumerate(spec)}


def test_mnist_matches_numpy():
    rng = np.random.default_rng(1234)
    c = spec_arrays("mnist", rng)
    module = parse_relay((DATA / "mnist.relay").read_text(), "mnist.relay", c)
    x = rng.standard_normal((1, 1, 28, 28)).astype(np.float32)
    (got,) = run_module(module, [x])

    def stage(h, w, b, pool):
        h = ref_conv2d(np.pad(h, ((0, 0), (0, 0), (2, 2), (2, 2))), w) + b
        return ref_pool2d(np.maximum(h, 0), (pool, pool), (pool, pool), (0, 0, 0, 0), "max")

    h = stage(stage(x, c[0], c[1], 2), c[2], c[3], 3)
    want = h.reshape(1, 256) @ c[4].T + c[5]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_batch_norm_extract_matches_numpy():
    rng = np.random.default_rng(1234)
    c = spec_arrays("batch_norm_extract", rng)
    c[3] = np.abs(c[3])
    module = parse_relay((DATA / "batch_norm_extract.relay").read_text(), "bn.relay", c)
    x = rng.standard_normal((1, 32, 112, 112)).astype(np.float32)
    (got,) = run_module(module, [x])
    g, b, m, v = (c[i][:, None, None] for i in range(4))
    np.testing.assert_allclose(got, (x - m) / np.sqrt(v + 1e-5) * g + b, rtol=1e-4, atol=1e-4)


def test_gpt2_extract_matches_numpy():
    rng = np.random.default_rng(1234)
    c = spec_arrays("gpt2_extract", rng)
    module = parse_relay((DATA / "gpt2_extract.relay").read_text(), "gpt2.relay", c)
    x = rng.standard_normal((1600, 768)).astype(np.float32)
    (got,) = run_module(module, [x])
    x64 = x.astype(np.float64)
    h = c[6] + (x64 @ c[0].T + c[1]).reshape(50, 32, 768)
    d = h - h.mean(-1, keepdims=True)
    n = d / np.sqrt((d**2).mean(-1, keepdims=True) + 1e-5) * c[2] + c[3]
    f = (n.reshape(-1, 768) @ c[4].T + c[5]).reshape(50, 32, 3072)
    want = f * 0.5 * (1 + np.tanh((f + f**3 * 0.044715) * 0.797885))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)

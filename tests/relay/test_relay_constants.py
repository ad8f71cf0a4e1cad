"""meta[relay.Constant] values: .npz files, JSON [shape, dtype] specs with seeded values, mappings,
and the program's own #[metadata] section; missing and misshapen constants are coded errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from relay_testkit import metadata, relay

from nxsat.diagnostics import NxsatError
from nxsat.io import write_npz

HEAD = '#[version = "0.0.5"]\n'
PROGRAM = (
    HEAD
    + """def @main(%x: Tensor[(2, 3), float32]) -> Tensor[(2, 4), float32] {
  %0 = nn.dense(%x, meta[relay.Constant][0], units=4);
  add(%0, meta[relay.Constant][1])
}
"""
)


def expected(x, w, b):
    return x @ w.T + b


@pytest.fixture
def weights():
    rng = np.random.default_rng(1234)
    return rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)


@pytest.mark.parametrize("style", ["", "c"])
def test_npz_keys(tmp_path, weights, style):
    rng = np.random.default_rng(1234)
    path = tmp_path / "w.npz"
    write_npz(path, {f"{style}0": weights[0], f"{style}1": weights[1]})
    x = rng.standard_normal((2, 3)).astype(np.float32)
    (out,) = relay.run(PROGRAM, x, consts=path)
    np.testing.assert_allclose(out, expected(x, *weights), rtol=1e-5, atol=1e-6)


def test_mapping(weights):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    (out,) = relay.run(PROGRAM, x, consts={0: weights[0], "1": weights[1]})
    np.testing.assert_allclose(out, expected(x, *weights), rtol=1e-5, atol=1e-6)


def test_json_spec_is_seeded_and_per_index(tmp_path):
    spec = tmp_path / "c.json"
    spec.write_text(json.dumps([[[4, 3], "float32"], [[4], "float32"]]))
    m1, m2, m3 = (relay.load(PROGRAM, consts=spec, seed=s) for s in (5, 5, 6))

    def consts(m):
        return [n.attrs["value"] for n in m.entry.instructions if n.name.startswith("meta_constant_")]

    a, b, c = consts(m1), consts(m2), consts(m3)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not np.array_equal(a[0], c[0])
    # Vectors are uniform in [0, 1); weights zero-mean with variance 1/fan_in (fan_in 3 here).
    assert a[1].dtype == np.float32 and np.all((a[1] >= 0) & (a[1] < 1))
    assert np.all(np.abs(a[0]) <= 1.0) and a[0].min() < 0 < a[0].max()
    # A constant's values do not depend on the other entries of the spec.
    spec2 = tmp_path / "c2.json"
    spec2.write_text(json.dumps([[[9], "int32"], [[4], "float32"]]))
    text = HEAD + "def @main() { meta[relay.Constant][1] }"
    np.testing.assert_array_equal(relay.load(text, consts=spec2, seed=5).entry.root.attrs["value"], a[1])
    ints = relay.load(HEAD + "def @main() { meta[relay.Constant][0] }", consts=spec2).entry.root.attrs["value"]
    assert ints.dtype == np.int32 and ints.min() >= 0 and ints.max() <= 9


def test_missing_constants(tmp_path, weights):
    e = pytest.raises(NxsatError, relay.load, PROGRAM).value
    assert e.code == "NCC_ERLY002" and "--relay-constants" in e.format() and e.loc.line == 3
    path = tmp_path / "one.npz"
    write_npz(path, {"0": weights[0]})
    e = pytest.raises(NxsatError, relay.load, PROGRAM, consts=path).value
    assert e.code == "NCC_ERLY002" and "meta[relay.Constant][1]" in e.message and e.loc.line == 4


def test_misshapen_constant_names_itself(tmp_path):
    path = tmp_path / "bad.npz"
    write_npz(path, {"0": np.zeros((4, 5), np.float32), "1": np.zeros(4, np.float32)})
    e = pytest.raises(NxsatError, relay.load, PROGRAM, consts=path).value
    assert e.code == "NCC_EVRF064" and e.loc.line == 3
    assert "meta[relay.Constant][0] is Tensor[(4, 5), float32]" in e.hint and "bad.npz" in e.hint


@pytest.mark.parametrize(
    "content,code",
    [
        ("{not json", "NCC_ERLY001"),
        ('{"0": [[2], "float32"]}', "NCC_ERLY001"),
        ('[[[2], "float32"], [2, "float32"]]', "NCC_ERLY001"),
        ('[[[-1], "float32"]]', "NCC_ERLY003"),
        ('[[[2.5], "float32"]]', "NCC_ERLY003"),
        ('[[[2], "float31"]]', "NCC_ERLY003"),
        ('[[[100000, 100000, 100000], "float32"]]', "NCC_ERLY003"),
        ("[[[" + "1" * 5000 + '], "float32"]]', "NCC_ERLY001"),
        ("[" * 100_000 + "]" * 100_000, "NCC_ERLY001"),
    ],
)
def test_malformed_specs(tmp_path, content, code):
    spec = tmp_path / "c.json"
    spec.write_text(content)
    assert pytest.raises(NxsatError, relay.load, PROGRAM, consts=spec).value.code == code


def test_malformed_npz(tmp_path, weights):
    path = tmp_path / "w.npz"
    write_npz(path, {"0": weights[0], "c1": weights[1]})
    assert pytest.raises(NxsatError, relay.load, PROGRAM, consts=path).value.code == "NCC_ERLY001"
    write_npz(path, {"weight": weights[0]})
    assert pytest.raises(NxsatError, relay.load, PROGRAM, consts=path).value.code == "NCC_ERLY001"
    path.write_bytes(b"not a zip")
    assert pytest.raises(NxsatError, relay.load, PROGRAM, consts=path).value.code == "NCC_EFIL001"
    np.save(tmp_path / "w.npy", weights[0])
    e = pytest.raises(NxsatError, relay.load, PROGRAM, consts=tmp_path / "w.npy").value
    assert e.code == "NCC_ERLY001" and ".npy" in e.message
    assert pytest.raises(NxsatError, relay.load, PROGRAM, consts=tmp_path / "nope.npz").value.code == "NCC_EFIL001"


# --- the #[metadata] section -----------------------------------------------------------------


def test_metadata_section_supplies_constants(weights):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    text = PROGRAM + metadata(*weights)
    (out,) = relay.run(text, x)
    np.testing.assert_allclose(out, expected(x, *weights), rtol=1e-5, atol=1e-6)
    # An explicit file wins over the metadata.
    other = {0: np.ones((4, 3), np.float32), 1: np.zeros(4, np.float32)}
    (out,) = relay.run(text, x, consts=other)
    np.testing.assert_allclose(out, x.sum(1, keepdims=True).repeat(4, 1), rtol=1e-6)
    flags = np.array([True, False, True])
    m = relay.load(HEAD + "def @main() { meta[relay.Constant][0] }\n" + metadata(flags))
    np.testing.assert_array_equal(m.entry.root.attrs["value"], flags)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda s: s.replace('"root": 1', '"root": 99'),
        lambda s: s.replace('relay.Constant"]', 'relay.Other"]').replace('"relay.Constant", "attrs"', '"x", "attrs"'),
        lambda s: s[: s.index("b64ndarrays")] + 'b64ndarrays": ["@@@"]}',
        lambda s: s.replace("P6G0lvBA", "QQG0lvBA"),
        lambda s: s + "garbage",
        lambda s: s[: s.index("#[metadata]")] + "#[metadata]\n" + "[" * 100_000 + "]" * 100_000,
        lambda s: s.replace('"root": 1', '"root": 1' + "0" * 5000),
    ],
)
def test_malformed_metadata(weights, mangle):
    text = mangle(PROGRAM + metadata(*weights, indent=None))
    assert text != PROGRAM + metadata(*weights, indent=None)
    with pytest.raises(NxsatError) as e:
        relay.load(text)
    assert e.value.code in ("NCC_ERLY001", "NCC_ERLY002")

"""The commands take Relay models: --framework RELAY or detection from the file, constants from
--relay-constants with --seed, one coded line on failure."""

from __future__ import annotations

import shutil

import numpy as np
from relay_testkit import DATA

from nxsat.cli import main
from nxsat.io import read_npz, write_npz


def test_interpret_relay_with_constants_and_inputs(tmp_path, capsys):
    model = tmp_path / "mnist.txt"  # not .relay: detected from the version header
    shutil.copy(DATA / "mnist.relay", model)
    x = np.random.default_rng(0).standard_normal((1, 1, 28, 28)).astype(np.float32)
    write_npz(tmp_path / "in.npz", {"x": x})
    args = [
        "interpret",
        str(model),
        "--relay-constants",
        str(DATA / "mnist.consts.json"),
        "--inputs",
        str(tmp_path / "in.npz"),
    ]
    assert main([*args, "--seed", "7", "--output", str(tmp_path / "a.npz")]) == 0
    assert main([*args, "--seed", "7", "--output", str(tmp_path / "b.npz")]) == 0
    assert main([*args, "--seed", "8", "--framework", "RELAY", "--output", str(tmp_path / "c.npz")]) == 0
    a, b, c = (read_npz(tmp_path / f"{k}.npz")["out0"] for k in "abc")
    assert a.shape == (1, 10) and np.all(np.isfinite(a))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_missing_constants_is_one_coded_line(capsys):
    assert main(["inspect", str(DATA / "mnist.relay")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NCC_ERLY002" in err[0] and "--relay-constants" in err[0]
    assert err[0].startswith(f"{DATA / 'mnist.relay'}:4:")

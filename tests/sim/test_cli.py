"""The device commands: assemble, disassemble, run, profile (one coded line on errors)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
from nxsim_progs import EXAMPLES

from nxsat.cli import main
from nxsat.io import read_npz, write_npz


def _assemble(tmp_path, name: str = "softmax") -> str:
    out = str(tmp_path / f"{name}.neff")
    assert main(["assemble", str(EXAMPLES / f"{name}.nxs"), "--output", out]) == 0
    return out


def test_assemble_run_profile_disassemble(tmp_path, capsys) -> None:
    neff = _assemble(tmp_path)
    x = np.random.default_rng(0).standard_normal((128, 512)).astype(np.float32)
    write_npz(tmp_path / "in.npz", {"in0": x})
    capsys.readouterr()
    assert main(["run", neff, "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz")]) == 0
    out = capsys.readouterr().out
    assert "latency:" in out and " us on trn1" in out
    y = read_npz(tmp_path / "out.npz")["out0"]
    x = x.astype(ml_dtypes.bfloat16).astype(np.float64)  # the model's input is bf16
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=2**-7, atol=1e-6)

    assert main(["profile", neff, "--json", "--trace", str(tmp_path / "t.json")]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["latency_ns"] > 0 and "engines" in rep
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])

    assert main(["profile", neff]) == 0
    assert "latency" in capsys.readouterr().out

    prog = tmp_path / "back.nxs"
    assert main(["disassemble", neff, "--output", str(prog), "--constants", str(tmp_path / "c.npz")]) == 0
    again = str(tmp_path / "again.neff")
    assert main(["assemble", str(prog), "--constants", str(tmp_path / "c.npz"), "-o", again]) == 0
    assert open(again, "rb").read() == open(neff, "rb").read()
    capsys.readouterr()
    assert main(["disassemble", neff]) == 0
    assert capsys.readouterr().out == prog.read_text()


def test_layernorm_with_constants(tmp_path) -> None:
    rng = np.random.default_rng(1)
    write_npz(tmp_path / "c.npz", {"gamma": rng.standard_normal((1, 768)).astype(np.float32),
                                   "beta": rng.standard_normal((1, 768)).astype(np.float32)})
    out = str(tmp_path / "ln.neff")
    assert main(["assemble", str(EXAMPLES / "layernorm.nxs"), "--constants", str(tmp_path / "c.npz"), "-o", out]) == 0
    assert main(["run", out, "--output", str(tmp_path / "o.npz")]) == 0  # seeded random inputs
    assert read_npz(tmp_path / "o.npz")["out0"].shape == (128, 768)


def test_errors_are_one_coded_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.nxs"
    bad.write_text(".isa 1.0\n.target trn1\nsbuf t: f32[200, 4]\n")
    assert main(["assemble", str(bad), "-o", str(tmp_path / "x.neff")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{bad}:3: error NCC_EASM005")
    assert not (tmp_path / "x.neff").exists()

    neff = _assemble(tmp_path)
    data = bytearray(open(neff, "rb").read())
    data[-3] ^= 0xFF
    (tmp_path / "broken.neff").write_bytes(bytes(data))
    assert main(["run", str(tmp_path / "broken.neff")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error NCC_ENEF002")

    assert main(["profile", str(tmp_path / "missing.neff")]) == 1
    assert "NCC_EFIL001" in capsys.readouterr().err

    assert main(["run", neff, "--target", "inf2"]) == 1
    assert "NCC_ENEF005" in capsys.readouterr().err

    write_npz(tmp_path / "wrong.npz", {"in0": np.zeros((3, 3), np.float32)})
    assert main(["run", neff, "--inputs", str(tmp_path / "wrong.npz")]) == 1
    assert "NCC_EINP001" in capsys.readouterr().err


def test_out_of_bounds_gather_warns_and_finishes(tmp_path, capsys) -> None:
    neff = _assemble(tmp_path, "gather")
    ids = np.arange(128, dtype=np.int32).reshape(128, 1)
    ids[3] = 5000
    write_npz(tmp_path / "in.npz", {"table": np.ones((1000, 64), np.float32), "ids": ids})
    capsys.readouterr()
    assert main(["run", neff, "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]) == 0
    captured = capsys.readouterr()
    assert "warning NCC_WRUN001: failed to run scatter/gather (indirect memory copy" in captured.err
    assert "due to out-of-bound access" in captured.err
    rows = read_npz(tmp_path / "o.npz")["out0"]
    assert not rows[3].any() and rows[4].all()

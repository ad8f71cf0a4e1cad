"""Absurd shapes are the user's error at load (NCC_ESHP001 at FILE:LINE:COL), in HLO, Relay and device
program text alike, never a numpy failure (NCC_IINT001) later or a size of 10^17 GiB from inspect."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nxsat.cli import main
from nxsat.ir import DIM_LIMIT, MAX_ELEMENTS, MAX_RANK, shape_limit_problem

DOCS = Path(__file__).resolve().parent.parent / "docs"
ONES_70 = ",".join(["1"] * 70)
E26 = "1" + "0" * 26


def test_the_limits_and_their_edges():
    assert (MAX_RANK, DIM_LIMIT, MAX_ELEMENTS) == (64, 2**40, 2**48)
    assert shape_limit_problem((1,) * 64) is None
    assert "rank 65" in shape_limit_problem((1,) * 65)
    assert shape_limit_problem((2**40 - 1,)) is None
    assert "not below 2^40" in shape_limit_problem((2**40,))
    assert "not below 2^40" in shape_limit_problem((0, 10**26))  # no elements, still absurd
    assert shape_limit_problem((2**24, 2**24)) is None
    assert "over 2^48" in shape_limit_problem((2**24, 2**24, 2))


def _refused(capsys, tmp_path, name: str, text: str, where: str, *argv: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    for command in ("inspect", "interpret"):
        code = main([command, str(path), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1, err
        assert err[-1].startswith(f"{path}:{where}: error NCC_ESHP001: "), err
        assert "(hint: nxsat takes tensors of rank <= 64" in err[-1] and "Traceback" not in "".join(err)
    return err[-1]


def hlo(decl: str) -> str:
    return f"HloModule m\nENTRY e {{\n  p = {decl} parameter(0)\n  ROOT n = {decl} negate(p)\n}}\n"


@pytest.mark.parametrize("decl,where,says", [
    (f"f32[{E26}]", "3:7", f"dimension {E26} is not below 2^40"),
    (f"f32[{ONES_70}]", "3:7", "rank 70 is over 64"),
    ("f32[4294967296,4294967296]", "3:7", "1.84e+19 elements are over 2^48"),
    ("f32[0,100000000000000]", "3:7", "dimension 100000000000000 is not below 2^40"),
    ("f32[" + "9" * 5000 + "]", "3:7", "(5000 digits) is too large"),
], ids=["dim-1e26", "rank-70", "elements-overflow", "zero-size", "5000-digits"])
def test_hlo(capsys, tmp_path, decl, where, says):
    assert says in _refused(capsys, tmp_path, "m.hlo", hlo(decl), where)


def test_hlo_tuple_elements_are_checked(capsys, tmp_path):
    text = ("HloModule m\nENTRY e {\n  p = (f32[2], f32[4294967296,4294967296]) parameter(0)\n"
            "  ROOT g = f32[2] get-tuple-element(p), index=0\n}\n")
    assert "elements are over 2^48" in _refused(capsys, tmp_path, "t.hlo", text, "3:16")


def test_hlo_within_the_limits_loads(capsys, tmp_path):
    path = tmp_path / "edge.hlo"
    path.write_text(hlo(f"f32[{2**40 - 1}]"))
    assert main(["inspect", str(path)]) == 0
    assert "f32[1099511627775]" in capsys.readouterr().out


def relay(params: str, body: str) -> str:
    return f'#[version = "0.0.5"]\ndef @main({params}) {{\n  {body}\n}}\n'


@pytest.mark.parametrize("text,where,says", [
    (relay(f"%x: Tensor[({E26}), float32]", "negative(%x)"), "2:23", f"dimension {E26} is not below 2^40"),
    (relay(f"%x: Tensor[({ONES_70}), float32]", "negative(%x)"), "2:15", "rank 70 is over 64"),
    (relay("%x: Tensor[(2147483647, 2147483647, 2147483647), float32]", "negative(%x)"), "2:15",
     "9.9e+27 elements are over 2^48"),
    (relay("", 'zeros(shape=[2147483647, 2147483647, 2147483647], dtype="float32")'), "3:3",
     "this call makes f32[2147483647,2147483647,2147483647]"),
    (relay("%x: Tensor[(1), float32]", f"reshape(%x, newshape=[{ONES_70}])"), "3:3", "rank 70 is over 64"),
    (relay("%x: Tensor[(1000000), float32]", "tile(%x, reps=[2147483647, 2147483647])"), "3:3",
     "elements are over 2^48"),
    (relay("%x: Tensor[(4), int32]", 'one_hot(%x, 1f, 0f, depth=100000000000000, axis=-1, dtype="float32")'),
     "3:3", "dimension 100000000000000 is not below 2^40"),
], ids=["dim-1e26", "rank-70", "elements-overflow", "zeros", "reshape-rank-70", "tile", "one-hot"])
def test_relay(capsys, tmp_path, text, where, says):
    assert says in _refused(capsys, tmp_path, "m.relay", text, where)


def test_relay_constants_spec(capsys, tmp_path):
    spec = tmp_path / "c.json"
    spec.write_text("[[[" + ", ".join(["1"] * 70) + '], "float32"]]')
    model = tmp_path / "m.relay"
    model.write_text(relay("", "meta[relay.Constant][0]"))
    assert main(["inspect", str(model), "--relay-constants", str(spec)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error NCC_ERLY003: {spec}: constant 0 has an unusable shape: rank 70 is over 64")


def program(decl: str) -> str:
    return f".isa 1.0\n.target trn1\ninput a: {decl}\noutput c: f32[128, 4]\nq0 dma c, a\n"


@pytest.mark.parametrize("decl,where,says", [
    (f"f32[{E26}, 1]", "3:14", f"dimension {E26} is not below 2^40"),
    ("f32[999999999999999999, 1]", "3:14", "dimension 999999999999999999 is not below 2^40"),
    (f"f32[{', '.join(['1'] * 70)}]", "3:13", "a: rank 70 is over 64"),
    ("f32[4294967296, 4294967296, 4294967296]", "3:13", "a: 7.92e+28 elements are over 2^48"),
], ids=["dim-1e26", "dim-18-digits", "rank-70", "elements-overflow"])
def test_device_program(capsys, tmp_path, decl, where, says):
    path = tmp_path / "p.nxs"
    path.write_text(program(decl))
    assert main(["assemble", str(path), "-o", str(tmp_path / "x.neff")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{path}:{where}: error NCC_ESHP001: ") and says in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.neff").exists()


def test_the_docs_state_the_limits_the_code_uses():
    for doc in ("hlo.md", "relay.md", "device-program.md", "error-codes.md"):
        text = " ".join((DOCS / doc).read_text().split())
        assert "NCC_ESHP001" in text, doc
        assert re.search(r"rank (at most|over) 64", text) and "2^40" in text and "2^48" in text, doc

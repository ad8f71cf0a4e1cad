"""The model commands: inspect, interpret, list-operators, --version; errors are one coded line."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA
from nxsat import __version__
from nxsat.cli import main

MLP = str(DATA / "jax" / "mlp.hlo")
MINIMUM_XLA_OPERATORS = """Abs, Add, Allgather, Allreduce, Atan2, Batchnorm, Batchnormgrad, Batchnorminference,
BitcastConvertType, Broadcast, BroadcastInDim, Ceil, Clamp, Compare, Concatenate, Constant, ConstantLiteral,
ConvertElementType, Cos, Customcall, Div, Dot, DotGeneral, DynamicUpdateSlice, Eq, Exp, Floor, Gather, Ge,
GetTupleElement, Gt, Iota, Le, Log, LogicalAnd, LogicalNot, Lt, Max, Min, Mul, Ne, Neg, Pad, Pow, Reduce, Reshape,
Rev, RngBitGenerator, RngUniform, Rsqrt, Scatter, Select, SelectAndScatter, ShiftRightLogical, Sign, Sin, Slice,
Sqrt, Sub, Tanh, Transpose, Tuple, TopK"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"nxsat {__version__}"


def test_inspect_text_and_json(capsys):
    code, out, _ = run(capsys, "inspect", MLP)
    assert code == 0
    assert "parameters: 5" in out and "dot 6,144" in out and "out0   f32[4,8]" in out
    code, out, _ = run(capsys, "inspect", MLP, "--json")
    info = json.loads(out)
    assert info["flops"]["dot"] == 2 * 4 * 32 * 16 + 2 * 4 * 8 * 32
    assert [p["type"] for p in info["parameters"]] == ["f32[4,16]", "f32[16,32]", "f32[32]", "f32[32,8]", "f32[8]"]
    assert info["parameter_bytes"] == 4 * (64 + 512 + 32 + 256 + 8)


def test_interpret_writes_outputs_matching_xla(capsys, tmp_path):
    out_path = tmp_path / "out.npz"
    code, out, _ = run(capsys, "interpret", MLP, "--inputs", str(DATA / "jax" / "mlp.npz"), "--output", str(out_path))
    assert code == 0 and re.search(r"^\s+out0\s+f32\[4,8\]\s+min ", out, re.M), out
    ref = np.load(DATA / "jax" / "mlp.npz")
    got = np.load(out_path)
    np.testing.assert_allclose(got["out0"], ref["out0"], rtol=1e-5, atol=1e-6)


def test_interpret_by_parameter_name_and_random_inputs(capsys, tmp_path):
    ref = np.load(DATA / "jax" / "mlp.npz")
    named = tmp_path / "named.npz"
    np.savez(named, **{"x.1": ref["in0"], "w1.1": ref["in1"], "b1.1": ref["in2"], "w2.1": ref["in3"],
                       "b2.1": ref["in4"]})
    out_path = tmp_path / "o.npz"
    assert run(capsys, "interpret", MLP, "--inputs", str(named), "-o", str(out_path))[0] == 0
    np.testing.assert_allclose(np.load(out_path)["out0"], ref["out0"], rtol=1e-5, atol=1e-6)
    code, out, err = run(capsys, "interpret", MLP, "--seed", "3")
    assert code == 0 and "random inputs (seed 3)" in err


def test_interpret_output_is_deterministic(capsys, tmp_path):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    run(capsys, "interpret", MLP, "-o", str(a))
    run(capsys, "interpret", MLP, "-o", str(b))
    assert a.read_bytes() == b.read_bytes()


def test_outputs_get_ordinary_file_permissions(capsys, tmp_path):
    # Written atomically through a private temporary file, but the result is what open() gives.
    import os

    mask = os.umask(0o022)
    try:
        out_path = tmp_path / "o.npz"
        assert run(capsys, "interpret", MLP, "-o", str(out_path))[0] == 0
        assert out_path.stat().st_mode & 0o777 == 0o644
        out_path.chmod(0o600)  # an existing file keeps its mode
        assert run(capsys, "interpret", MLP, "-o", str(out_path))[0] == 0
        assert out_path.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(mask)


def test_a_value_larger_than_the_host_is_refused_before_it_is_made(capsys, tmp_path):
    huge = tmp_path / "huge.hlo"
    # 10^14 elements: within nxsat's shape limits (docs/hlo.md), beyond any host's memory.
    huge.write_text("HloModule m\nENTRY e {\n  ROOT i = s32[1000000,100000000] iota(), iota_dimension=0\n}\n")
    code, _, err = run(capsys, "interpret", str(huge))
    assert code == 1 and len(err.strip().splitlines()) == 2  # the random-input note, then the error
    assert f"{huge}:3:8: error NCC_EOOM002: iota at i makes a s32[1000000,100000000] value" in err


def test_list_operators_covers_the_documented_minimum(capsys):
    code, out, _ = run(capsys, "list-operators", "--framework", "XLA")
    assert code == 0
    names = {line.split()[0] for line in out.splitlines()}
    missing = [n.strip() for n in MINIMUM_XLA_OPERATORS.replace("\n", " ").split(",") if n.strip() not in names]
    assert not missing, missing
    code, out, _ = run(capsys, "list-operators", "--all")
    assert "[unsupported]" in out and "cholesky" in out


@pytest.mark.parametrize("argv,code_re", [
    (["inspect", "no/such/file.hlo"], r"NCC_EFIL001"),
    (["interpret", MLP, "--inputs", "missing.npz"], r"NCC_EFIL001"),
    (["inspect", MLP, "--framework", "TENSORFLOW"], r"NCC_EARG002"),
    (["compile-everything"], r"NCC_EARG002"),
])
def test_bad_invocations_are_one_coded_line(capsys, argv, code_re):
    with pytest.raises(SystemExit) if argv[0] == "compile-everything" or "TENSORFLOW" in argv else _nothing():
        code = main(argv)
        assert code != 0
    err = capsys.readouterr().err.strip()
    assert re.search(code_re, err) and len(err.splitlines()) == 1 and "Traceback" not in err


def test_bad_inputs_are_refused(capsys, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, in0=np.zeros((3, 3), np.float32))
    code, _, err = run(capsys, "interpret", MLP, "--inputs", str(bad))
    assert code == 1 and "NCC_EINP001" in err
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    code, _, err = run(capsys, "interpret", MLP, "--inputs", str(garbage))
    assert code == 1 and "NCC_EFIL001" in err


BF16_MODEL = """HloModule m
ENTRY e {
  x = bf16[2,3] parameter(0)
  ROOT y = bf16[2,3] add(x, x)
}
"""


def test_bf16_inputs_saved_by_numpy_as_raw_bytes_are_read_as_their_bits(capsys, tmp_path):
    """numpy.savez stores ml_dtypes' bfloat16 (what JAX returns) as 2-byte void, |V2: those are the bits."""
    import ml_dtypes

    model = tmp_path / "m.hlo"
    model.write_text(BF16_MODEL)
    x = np.array([[1.5, -2.25, 3.0], [0.5, 1e-3, -7.0]], ml_dtypes.bfloat16)
    raw = tmp_path / "raw.npz"
    np.savez(raw, in0=x)
    assert np.load(raw)["in0"].dtype == np.dtype("V2")  # what the user's file holds
    out = tmp_path / "out.npz"
    code, _, err = run(capsys, "interpret", str(model), "--inputs", str(raw), "-o", str(out))
    assert code == 0, err
    np.testing.assert_array_equal(np.load(out)["out0"], (x.astype(np.float32) * 2))
    # raw bytes of another width are still refused
    np.savez(raw, in0=np.zeros((2, 3), "V4"))
    code, _, err = run(capsys, "interpret", str(model), "--inputs", str(raw))
    assert code == 1 and "NCC_EINP001" in err


def test_console_script_has_no_traceback_for_bad_model(tmp_path):
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  ROOT x = f32[?] parameter(0)\n}\n")
    proc = subprocess.run([sys.executable, "-m", "nxsat", "inspect", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith("(hint: export the model with static shapes (pad to a fixed size, "
                                        "bucket by length))")
    assert "NCC_EMOD025" in proc.stderr and "Traceback" not in proc.stderr and f"{bad}:3:12" in proc.stderr


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_npy_inputs_and_relay_constants_on_hlo_are_refused(capsys, tmp_path):
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros(3, np.float32))
    code, _, err = run(capsys, "interpret", MLP, "--inputs", str(npy))
    assert code == 1 and "NCC_EFIL001" in err and "single .npy" in err
    code, _, err = run(capsys, "inspect", MLP, "--relay-constants", str(npy))
    assert code == 2 and "NCC_EARG002" in err and "Relay models only" in err


def test_random_inputs_give_scalars_their_meaning_by_name():
    """A training step's scalars (a hardtanh bound, a batch size) take given values; every other input
    is the draw it would be without them; a name the model lacks, or a non-scalar, is refused."""
    from nxsat.cli.model import random_inputs
    from nxsat.diagnostics import NxsatError
    from nxsat.frontend import loads

    m = loads("HloModule s\nENTRY e {\n  x = f32[4] parameter(0)\n  k = f32[] parameter(1)\n"
              "  b = f32[4] broadcast(k), dimensions={}\n  ROOT r = f32[4] minimum(x, b)\n}\n", "s.hlo")
    plain, fixed = random_inputs(m, 0), random_inputs(m, 0, fixed={"k": 6.0})
    np.testing.assert_array_equal(fixed["in0"], plain["in0"])
    assert fixed["in1"].shape == () and fixed["in1"] == np.float32(6.0) != plain["in1"]
    for bad, words in (({"q": 1.0}, "no parameters named q"), ({"x": 1.0}, "x is not a scalar")):
        with pytest.raises(NxsatError, match=words):
            random_inputs(m, 0, fixed=bad)

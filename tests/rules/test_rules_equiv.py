"""nxsat check A B: proofs, refutations with counterexamples, unknown, and exit status 0/1/2/3."""

from __future__ import annotations

import numpy as np
import pytest

from nxsat.cli import main
from nxsat.frontend import loads
from nxsat.rules.equiv import EQUIVALENT, NOT_EQUIVALENT, UNKNOWN, check_equivalence

REDUCERS = """max_f32 { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b) }
add_f32 { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b) }
"""


def softmax(axis: int) -> str:
    keep = 1 - axis
    return f"""HloModule softmax{axis}
{REDUCERS}
ENTRY main {{
  x = f32[4,4] parameter(0)
  ninf = f32[] constant(-inf)
  m = f32[4] reduce(x, ninf), dimensions={{{axis}}}, to_apply=max_f32
  mb = f32[4,4] broadcast(m), dimensions={{{keep}}}
  d = f32[4,4] subtract(x, mb)
  e = f32[4,4] exponential(d)
  zero = f32[] constant(0)
  s = f32[4] reduce(e, zero), dimensions={{{axis}}}, to_apply=add_f32
  sb = f32[4,4] broadcast(s), dimensions={{{keep}}}
  ROOT r = f32[4,4] divide(e, sb)
}}
"""


def entry(body: str, params: str = "x = f32[2,3] parameter(0)") -> str:
    lines = "\n  ".join([params, *body.strip().splitlines()])
    return f"HloModule m\n\nENTRY main {{\n  {lines}\n}}\n"


IDENTITY = entry("ROOT y = f32[2,3] copy(x)")
DOUBLE_TRANSPOSE = entry("t = f32[3,2] transpose(x), dimensions={1,0}\n"
                         "ROOT r = f32[2,3] transpose(t), dimensions={1,0}")
TWO = "a = f32[2,3] parameter(0)\n  b = f32[3,4] parameter(1)"
DOT_OF_TRANSPOSES = entry("bt = f32[4,3] transpose(b), dimensions={1,0}\nat = f32[3,2] transpose(a), dimensions={1,0}\n"
                          "ROOT d = f32[4,2] dot(bt, at), lhs_contracting_dims={1}, rhs_contracting_dims={0}", TWO)
TRANSPOSE_OF_DOT = entry("d = f32[2,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
                         "ROOT t = f32[4,2] transpose(d), dimensions={1,0}", TWO)
RESHAPES = entry("r = f32[6] reshape(x)\nq = f32[3,2] reshape(r)\nROOT s = f32[2,3] reshape(q)")
XY = "x = f32[2,3] parameter(0)\n  y = f32[2,3] parameter(1)"
SUB_XY = entry("ROOT d = f32[2,3] subtract(x, y)", XY)
SUB_YX = entry("ROOT d = f32[2,3] subtract(y, x)", XY)
TRANSPOSED = entry("ROOT t = f32[3,2] transpose(x), dimensions={1,0}")
RESHAPED = entry("ROOT t = f32[3,2] reshape(x)")
TIMES_TWO = entry("two = f32[] constant(2)\nb = f32[2,3] broadcast(two), dimensions={}\n"
                  "ROOT m = f32[2,3] multiply(x, b)")
PLUS_SELF = entry("ROOT s = f32[2,3] add(x, x)")
IXY = "x = s32[2,3] parameter(0)\n  y = s32[2,3] parameter(1)"
ADD_SUB = entry("s = s32[2,3] add(x, y)\nROOT d = s32[2,3] subtract(s, y)", IXY)  # x, wrapping included
COPY_X = entry("ROOT c = s32[2,3] copy(x)", IXY)


def check(a: str, b: str, **kw):
    return check_equivalence(loads(a, "a.hlo"), loads(b, "b.hlo"), **kw)


@pytest.mark.parametrize("a, b", [(DOUBLE_TRANSPOSE, IDENTITY), (DOT_OF_TRANSPOSES, TRANSPOSE_OF_DOT),
                                  (RESHAPES, IDENTITY), (softmax(1), softmax(1)), (TIMES_TWO, PLUS_SELF)],
                         ids=["double-transpose", "dot-swapped-transposed", "reshape-round-trip", "same-softmax",
                              "times-two-is-plus-self"])
def test_proves(a, b):
    r = check(a, b)
    assert r.answer == EQUIVALENT and r.exit_code == 0, r.format()
    assert "proved" in r.format()


@pytest.mark.parametrize("a, b", [(SUB_XY, SUB_YX), (softmax(1), softmax(0)), (TRANSPOSED, RESHAPED)],
                         ids=["subtract-swapped", "softmax-wrong-axis", "transpose-vs-reshape"])
def test_refutes_with_a_counterexample(a, b):
    r = check(a, b)
    assert r.answer == NOT_EQUIVALENT and r.exit_code == 1, r.format()
    ma, mb = loads(a, "a.hlo"), loads(b, "b.hlo")
    from nxsat.interpreter import run_module

    inputs = [r.inputs[f"in{i}"] for i in range(len(ma.entry.params))]
    x, y = run_module(ma, inputs)[r.output], run_module(mb, inputs)[r.output]
    np.testing.assert_array_equal(x, r.a_value)
    np.testing.assert_array_equal(y, r.b_value)
    assert not np.allclose(x, y)
    text = r.format()
    assert "inputs:" in text and "A out0" in text and "B out0" in text


def test_unprovable_but_equal_is_unknown():
    r = check(ADD_SUB, COPY_X, trials=5)  # no rule cancels (x + y) - y; random inputs agree
    assert r.answer == UNKNOWN and r.exit_code == 2 and r.trials == 5


def test_different_signatures_are_not_equivalent():
    r = check(IDENTITY, SUB_XY)
    assert r.answer == NOT_EQUIVALENT and "signatures differ" in r.detail


def test_cli_exit_status(tmp_path, capsys):
    files = {}
    for name, text in {"tt": DOUBLE_TRANSPOSE, "id": IDENTITY, "xy": SUB_XY, "yx": SUB_YX, "addsub": ADD_SUB,
                       "copy": COPY_X}.items():
        files[name] = tmp_path / f"{name}.hlo"
        files[name].write_text(text)
    assert main(["check", str(files["tt"]), str(files["id"])]) == 0
    assert "equivalent (proved)" in capsys.readouterr().out
    assert main(["check", str(files["xy"]), str(files["yx"])]) == 1
    assert "not equivalent" in capsys.readouterr().out
    assert main(["check", str(files["addsub"]), str(files["copy"]), "--trials", "3"]) == 2
    assert "unknown" in capsys.readouterr().out
    assert main(["check", str(files["tt"]), str(tmp_path / "missing.hlo")]) == 3
    assert "NCC_EFIL001" in capsys.readouterr().err


def test_graphs_the_interpreter_cannot_run_are_unknown_not_an_error():
    a = entry('c = f32[2,3] custom-call(x), custom_call_target="mystery"\nROOT n = f32[2,3] negate(c)')
    b = entry('n = f32[2,3] negate(x)\nROOT c = f32[2,3] custom-call(n), custom_call_target="mystery"')
    r = check(a, b)
    assert r.answer == UNKNOWN and "mystery" in r.detail


@pytest.mark.parametrize("argv", [["-O", "7"], ["--trials", "-1"], ["--bogus"], ["extra.hlo"]],
                         ids=["bad-level", "negative-trials", "unknown-option", "third-graph"])
def test_cli_usage_errors_exit_3_not_2_which_means_unknown(tmp_path, capsys, argv):
    a = tmp_path / "a.hlo"
    a.write_text(IDENTITY)
    with pytest.raises(SystemExit) as info:
        main(["check", str(a), str(a), *argv])
    assert info.value.code == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NCC_EARG002" in err


def test_cli_checks_relay_graphs_with_their_constants(capsys):
    from conftest import DATA

    relay = DATA / "relay"
    argv = ["check", str(relay / "mnist.relay"), str(relay / "mnist.printed.relay")]
    assert main(argv) == 3  # the constants are not in the text
    assert "NCC_ERLY002" in capsys.readouterr().err
    assert main([*argv, "--relay-constants", str(relay / "mnist.consts.json")]) == 0
    assert "equivalent (proved)" in capsys.readouterr().out

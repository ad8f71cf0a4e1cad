"""Exit statuses follow docs/error-codes.md: 0 success, 1 an error in the input, 2 a bad command line
(NCC_EARG*), 70 an internal error (NCC_I*), whichever command raises it; `nxsat check` keeps its own."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from conftest import DATA
from nxsat.cli import exit_status, main
from nxsat.diagnostics import CODES
from nxsat.ops import registry

MLP = str(DATA / "jax" / "mlp.hlo")
NEGATE = "HloModule m\nENTRY e {\n  x = f32[3] parameter(0)\n  ROOT n = f32[3] negate(x)\n}\n"
PROGRAM = ".isa 1.0\n.target trn1\ninput a: f32[128, 4]\noutput c: f32[128, 4]\nq0 dma c, a\n"


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_has_the_status_of_its_class(code):
    want = 70 if code.startswith("NCC_I") else 2 if code.startswith("NCC_EARG") else 1
    assert exit_status(code) == want


def test_success_is_0_and_an_input_error_is_1(capsys, tmp_path):
    assert run(capsys, "inspect", MLP)[0] == 0
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  ROOT x = f32[2] parameter(0\n}\n")
    code, err = run(capsys, "inspect", str(bad))
    assert code == 1 and "NCC_EPRS001" in err


def test_earg002_raised_by_a_command_exits_2(capsys, tmp_path):
    npy = tmp_path / "c.npy"
    np.save(npy, np.zeros(3, np.float32))
    code, err = run(capsys, "inspect", MLP, "--relay-constants", str(npy))
    assert code == 2 and "NCC_EARG002" in err and len(err.strip().splitlines()) == 1
    prog = tmp_path / "p.nxs"
    prog.write_text(PROGRAM)
    code, err = run(capsys, "assemble", str(prog), "--target", "trn9", "-o", str(tmp_path / "x.neff"))
    assert code == 2 and "NCC_EARG002" in err and "trn9" in err


def test_earg001_exits_2(capsys, tmp_path):
    prog = tmp_path / "p.nxs"
    prog.write_text(PROGRAM)
    code, err = run(capsys, "assemble", str(prog), "--lnc", "2", "-o", str(tmp_path / "x.neff"))
    assert code == 2 and "NCC_EARG001" in err


def test_argparse_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["interpret"])
    assert info.value.code == 2 and "NCC_EARG002" in capsys.readouterr().err


def test_internal_error_through_interpret_exits_70(capsys, tmp_path, monkeypatch):
    def broken(args, attrs, ctx):
        raise ZeroDivisionError("a bug")

    negate = registry.get("negate")
    monkeypatch.setitem(registry._REGISTRY, "negate", dataclasses.replace(negate, impl=broken))
    model = tmp_path / "neg.hlo"
    model.write_text(NEGATE)
    code, err = run(capsys, "interpret", str(model))
    lines = err.strip().splitlines()
    assert code == 70 and "error NCC_IINT001" in lines[-1] and "ZeroDivisionError: a bug" in lines[-1]
    assert "Traceback" not in err


def test_an_unexpected_exception_exits_70(capsys, monkeypatch):
    import nxsat.modelinfo

    def boom(module):
        raise KeyError("oops")

    monkeypatch.setattr(nxsat.modelinfo, "model_info", boom)
    code, err = run(capsys, "inspect", MLP)
    assert code == 70 and err.startswith("error NCC_IINT001: internal compiler error: KeyError")


def test_host_out_of_memory_exits_1(capsys, monkeypatch):
    import nxsat.modelinfo

    def boom(module):
        raise MemoryError

    monkeypatch.setattr(nxsat.modelinfo, "model_info", boom)
    code, err = run(capsys, "inspect", MLP)
    assert code == 1 and "NCC_EOOM002" in err


def test_check_keeps_its_own_statuses(capsys):
    # 2 means "unknown" for `nxsat check`: a graph it cannot read or a bad option is 3 there
    # (0, 1, 2 and argparse's usage errors: tests/rules/test_rules_equiv.py).
    code, err = run(capsys, "check", MLP, "no/such/model.hlo")
    assert code == 3 and "NCC_EFIL001" in err
    code, err = run(capsys, "check", MLP, MLP, "--model-type", "no-such-type")
    assert code == 3 and "NCC_ERUL003" in err
    code, err = run(capsys, "--debug", "check", MLP, "no/such/model.hlo")  # a traceback, the same status
    assert code == 3 and "Traceback" in err and err.strip().splitlines()[-1].startswith("error NCC_EFIL001")


def test_an_internal_error_in_check_exits_70(capsys, monkeypatch):
    import nxsat.rules.equiv
    from nxsat.diagnostics import error

    def broken(*args, **kwargs):
        raise error("NCC_IINT001", "egglog: a bug")

    monkeypatch.setattr(nxsat.rules.equiv, "check_equivalence", broken)
    code, err = run(capsys, "check", MLP, MLP)
    assert code == 70 and err.strip() == "error NCC_IINT001: egglog: a bug"


@pytest.mark.parametrize("argv,status,code", [
    (["inspect", "no/such/model.hlo"], 1, "NCC_EFIL001"),
    (["inspect", MLP, "--relay-constants", MLP], 2, "NCC_EARG002"),
    (["no-such-command"], 2, "NCC_EARG002"),
])
def test_the_console_entry_point_exits_with_the_same_status(argv, status, code):
    proc = subprocess.run([sys.executable, "-m", "nxsat", *argv], capture_output=True, text=True)
    assert proc.returncode == status and code in proc.stderr and "Traceback" not in proc.stderr

"""Outputs are checked before a command does any work: never an input (however spelt), never a
directory, a directory that exists and takes files (NCC_EFIL002, one line, exit 1)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import DATA
from nxsat.cli import main
from nxsat.diagnostics import NxsatError
from nxsat.io import check_output

MLP = DATA / "jax" / "mlp.hlo"
PROGRAM = Path(__file__).resolve().parent.parent / "examples" / "programs" / "matmul.nxs"


def refused(path, **kw) -> str:
    with pytest.raises(NxsatError) as info:
        check_output(path, **kw)
    assert info.value.code == "NCC_EFIL002"
    return info.value.format()


def test_the_same_file_however_spelt_is_refused(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    model = tmp_path / "d" / "x.hlo"
    model.write_text("text")
    monkeypatch.chdir(tmp_path / "d")
    assert "would overwrite the input x.hlo" in refused("x.hlo", inputs=["x.hlo"])
    assert "would overwrite the input" in refused("./x.hlo", inputs=["../d/x.hlo"])
    assert "would overwrite the input" in refused(str(model), inputs=["x.hlo"])
    os.symlink("x.hlo", "link.hlo")
    assert "link.hlo: this output would overwrite the input x.hlo" in refused("link.hlo", inputs=["x.hlo"])
    os.link("x.hlo", "hard.hlo")
    assert "would overwrite" in refused("hard.hlo", inputs=[None, "x.hlo"])
    check_output("other.hlo", inputs=["x.hlo", None, "missing.npz"])  # another file: fine
    (tmp_path / "d" / "copy.hlo").write_text("text")  # same name elsewhere or same content: fine
    check_output("copy.hlo", inputs=["x.hlo"])


def test_two_outputs_in_one_file_are_refused(tmp_path):
    out = tmp_path / "o.json"
    assert "the same file as the other output" in refused(out, outputs=[str(out)])
    assert "the same file as the other output" in refused(tmp_path / "." / "o.json", outputs=[None, out])
    check_output(tmp_path / "t.json", outputs=[out, None])


def test_directories_missing_or_not_directories_are_refused(tmp_path):
    assert "is a directory" in refused(tmp_path)
    msg = refused(tmp_path / "no" / "such" / "o.npz")
    assert "directory" in msg and "does not exist" in msg and "mkdir -p" in msg
    (tmp_path / "f").write_text("")
    assert "is not a directory" in refused(tmp_path / "f" / "o.npz")
    assert not (tmp_path / "no").exists()  # nothing is created


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert "cannot write in" in refused(ro / "o.npz")
    finally:
        ro.chmod(0o755)


def test_a_failing_probe_is_refused(tmp_path, monkeypatch):
    # The probe is what catches permissions whoever runs the tests (root passes chmod 555).
    import tempfile

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    assert "cannot write in" in refused(tmp_path / "o.npz") and "Permission denied" in refused(tmp_path / "o.npz")


def test_a_writable_output_leaves_nothing_behind(tmp_path):
    check_output(tmp_path / "o.npz", inputs=[MLP])
    assert list(tmp_path.iterdir()) == []


# --- every command that writes a file --------------------------------------------------------------

def _run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return code, err


def test_interpret_refuses_to_overwrite_its_model_or_inputs(tmp_path, capsys):
    model = tmp_path / "mlp.hlo"
    shutil.copy(MLP, model)
    inputs = tmp_path / "mlp.npz"
    shutil.copy(DATA / "jax" / "mlp.npz", inputs)
    before = model.read_bytes(), inputs.read_bytes()
    code, err = _run(capsys, "interpret", model, "--output", model)
    assert code == 1 and "error NCC_EFIL002" in err
    code, err = _run(capsys, "interpret", model, "--inputs", inputs, "-o", tmp_path / "." / "mlp.npz")
    assert code == 1 and "error NCC_EFIL002" in err and "would overwrite the input" in err
    assert (model.read_bytes(), inputs.read_bytes()) == before


def test_interpret_checks_its_output_before_the_run(tmp_path, capsys, monkeypatch):
    import nxsat.interpreter

    def never(*args, **kwargs):
        raise AssertionError("the model ran before the output was checked")

    monkeypatch.setattr(nxsat.interpreter, "run_module", never)
    code, err = _run(capsys, "interpret", MLP, "--inputs", DATA / "jax" / "mlp.npz",
                     "-o", tmp_path / "missing" / "out.npz")
    assert code == 1 and "error NCC_EFIL002" in err and "does not exist" in err
    code, err = _run(capsys, "interpret", MLP, "--inputs", DATA / "jax" / "mlp.npz", "-o", tmp_path)
    assert code == 1 and "is a directory" in err


def test_assemble_and_disassemble_refuse_to_overwrite_their_input(tmp_path, capsys):
    prog = tmp_path / "prog.nxs"
    shutil.copy(PROGRAM, prog)
    text = prog.read_text()
    code, err = _run(capsys, "assemble", prog, "-o", prog)
    assert code == 1 and f"error NCC_EFIL002: {prog}: this output would overwrite the input" in err
    assert prog.read_text() == text
    neff = tmp_path / "x.neff"
    assert main(["assemble", str(prog), "-o", str(neff)]) == 0
    capsys.readouterr()
    data = neff.read_bytes()
    code, err = _run(capsys, "disassemble", neff, "-o", neff)
    assert code == 1 and "NCC_EFIL002" in err and neff.read_bytes() == data
    code, err = _run(capsys, "disassemble", neff, "-o", tmp_path / "p.nxs", "--constants", tmp_path / "p.nxs")
    assert code == 1 and "the same file as the other output" in err


def test_run_and_profile_check_their_outputs(tmp_path, capsys):
    neff = tmp_path / "x.neff"
    assert main(["assemble", str(PROGRAM), "-o", str(neff)]) == 0
    capsys.readouterr()
    data = neff.read_bytes()
    for argv in (["run", neff, "-o", neff], ["run", neff, "--trace", neff], ["profile", neff, "--trace", neff],
                 ["run", neff, "-o", tmp_path / "t", "--trace", tmp_path / "t"]):
        code, err = _run(capsys, *argv)
        assert code == 1 and "NCC_EFIL002" in err, argv
    assert neff.read_bytes() == data

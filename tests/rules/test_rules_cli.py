"""nxsat rules list | check | stats | terms."""

from __future__ import annotations

import json

import pytest

from conftest import DATA
from nxsat.cli import main


def test_list(capsys):
    assert main(["rules", "list"]) == 0
    out = capsys.readouterr().out
    assert "transpose-transpose" in out and "generic" in out and "exact" in out
    assert main(["rules", "list", "--model-type", "transformer", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"name", "set", "tag", "description"} <= set(rows[0])
    assert any(r["name"] == "constant-fold" and r["where"] == "built in" for r in rows)
    assert {r["name"] for r in rows if r["set"] == "attention"} >= {"softmax", "softmax-scale"}
    assert {r["name"] for r in rows if r["set"] == "transformer"} >= {"layer-norm-flax"}
    assert main(["rules", "list", "--model-type", "generic", "--json"]) == 0
    assert not any(r["set"] == "transformer" for r in json.loads(capsys.readouterr().out))
    assert main(["rules", "list", "--model-type", "no-such-type"]) == 1
    assert "NCC_ERUL003" in capsys.readouterr().err


def test_check_named_rules(capsys):
    assert main(["rules", "check", "negate-negate", "slice-pad-inverse"]) == 0
    out = capsys.readouterr().out
    assert "negate-negate" in out and "sound" in out and "2 rule(s): 2 sound" in out
    assert main(["rules", "check", "negate-negat"]) == 1
    assert "did you mean negate-negate" in capsys.readouterr().err


def test_check_a_file_with_an_unsound_rule(tmp_path, capsys):
    f = tmp_path / "mine.egg"
    f.write_text('(rewrite (Subtract x y) (Subtract y x) :name my-swap :tag exact :doc "wrong")\n'
                 '(rewrite (Negate (Negate x)) x :name my-double-negate :tag exact :doc "right")\n')
    assert main(["rules", "check", "--file", str(f)]) == 1
    out = capsys.readouterr().out
    assert "my-swap" in out and "unsound" in out and "left-hand side gives" in out
    assert "my-double-negate" in out and "1 sound, 1 unsound" in out


def test_check_reports_file_and_line_of_a_syntax_error(tmp_path, capsys):
    f = tmp_path / "broken.egg"
    f.write_text("; a comment\n(rewrite (Negate (Negate x)) x\n")
    assert main(["rules", "check", "--file", str(f)]) == 1
    err = capsys.readouterr().err
    assert f"{f}:2:1: error NCC_ERUL001" in err


def test_stats(capsys):
    assert main(["rules", "stats", str(DATA / "jax" / "mlp.hlo"), "-O1"]) == 0
    out = capsys.readouterr().out
    assert "stopped:" in out and "e-nodes" in out and "transpose-transpose" in out and "extracted" in out
    assert main(["rules", "stats", str(DATA / "jax" / "mlp.hlo"), "-O2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["level"] == 2 and data["iterations"] and data["stop_reason"]
    with pytest.raises(SystemExit) as info:
        main(["rules", "stats", str(DATA / "jax" / "mlp.hlo"), "-O5"])
    assert info.value.code == 2 and "NCC_EARG002" in capsys.readouterr().err


def test_terms(capsys):
    assert main(["rules", "terms"]) == 0
    out = capsys.readouterr().out
    assert "(Transpose T IVec:dimensions)" in out and "(Opaque String:op i64:key TList:operands)" in out


def test_check_needs_at_least_one_instance(capsys):
    with pytest.raises(SystemExit) as info:
        main(["rules", "check", "negate-negate", "--instances", "0"])
    assert info.value.code == 2 and "at least 1" in capsys.readouterr().err


def test_stats_as_compiled_reproduces_the_compilation_run(capsys):
    from nxsat.extract import optimize
    from nxsat.frontend import load

    path = DATA / "jax" / "random_dropout.hlo"
    assert main(["rules", "stats", str(path), "-O2", "--json", "--as-compiled"]) == 0
    data = json.loads(capsys.readouterr().out)
    compiled = optimize(load(path), level=2).report
    assert [it["enodes"] for it in data["iterations"]] == [it.enodes for it in compiled.iterations]
    assert data["stop_reason"] == compiled.stop_reason
    assert all(v["seconds"] is None for k, v in data["rules"].items() if k != "constant-fold")
    assert main(["rules", "stats", str(path), "-O2"]) == 0
    assert "each rule ran as its own step" in capsys.readouterr().out


def test_an_edited_copy_of_a_shipped_set_stands_in_for_it(tmp_path, capsys):
    from nxsat.rules.catalog import HERE

    copy = tmp_path / "generic.egg"
    text = (HERE / "sets" / "generic.egg").read_text()
    guarded = '(rewrite (Multiply x z) z :when ((= (splat z) "0") (int-type (dtype x)))'
    assert guarded in text
    copy.write_text(text.replace(guarded, '(rewrite (Multiply x z) z :when ((= (splat z) "0"))'))
    assert main(["rules", "check", "--file", str(copy), "multiply-zero-int"]) == 1  # the guard is gone
    out = capsys.readouterr().out
    assert "unsound" in out and "nan" in out
    assert main(["rules", "list", "--file", str(copy), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len({r["name"] for r in rows}) == len(rows)
    assert all(r["where"].startswith(str(copy)) for r in rows if r["set"] == "generic" and r["where"] != "built in")


def test_stats_savings_measure_each_model_type_rule(capsys):
    """`--savings` compiles the model with every rule and without each rule of the model type that matched;
    a GPT decoding step's layer norms, softmaxes and GELUs each save simulated time."""
    path = str(DATA / "models" / "gpt_decoder.hlo")
    assert main(["rules", "stats", path, "--model-type", "transformer", "--savings", "--auto-cast", "matmult"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if "without it" in line}
    assert set(rows) == {"gelu-tanh", "layer-norm-flax", "softmax"}
    for line in rows.values():
        assert float(line.split("saves")[1].split()[0].replace(",", "")) > 0
    assert main(["rules", "stats", path, "--savings"]) == 0
    assert "give one" in capsys.readouterr().out


def test_compile_disable_rule(tmp_path, capsys):
    """`nxsat compile --disable-rule NAME` leaves the rule out (its fused operator is not extracted); an
    unknown name is refused with a suggestion."""
    path = str(DATA / "models" / "gpt_decoder.hlo")
    out = tmp_path / "m.neff"
    assert main(["compile", path, "--model-type", "transformer", "--disable-rule", "layer-norm-flax", "-o", str(out),
                 "--logfile", ""]) == 0
    text = capsys.readouterr().out
    assert "layer-norm" not in text.split("model type")[1].split("extracted")[0]
    assert main(["compile", path, "--disable-rule", "layer-norm-flx", "-o", str(out), "--logfile", ""]) == 1
    err = capsys.readouterr().err
    assert "NCC_ERUL003" in err and "layer-norm-flax" in err and "Traceback" not in err

"""docs/rules.md's tutorial stays true: its commands run and print what the doc quotes (times aside),
and the rule counts it states are the catalog's."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from nxsat.cli import main
from nxsat.rules.catalog import catalog

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "rules.md").read_text()


def block(starting: str) -> str:
    """The fenced code block whose text starts with ``starting``."""
    for body in re.findall(r"```[a-z]*\n(.*?)```", DOC, re.S):
        if body.startswith(starting):
            return body
    raise AssertionError(f"docs/rules.md has no code block starting {starting!r}")


def command_and_output(starting: str) -> tuple[list[str], str]:
    text = block(f"$ nxsat {starting}")
    first, _, rest = text.partition("\n")
    return first.removeprefix("$ nxsat ").split(), rest


def untimed(text: str) -> list[str]:
    """Lines with every decimal number (seconds, milliseconds) masked and spacing collapsed:
    what is deterministic in the saturation report."""
    return [" ".join(re.sub(r"\d+\.\d+", "#", line).split()) for line in text.strip().splitlines()]


def test_the_tutorial_rule_checks_as_quoted(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-rules.egg").write_text(block(";; my-rules.egg"))
    argv, quoted = command_and_output("rules check --file my-rules.egg")
    assert main(argv) == 0
    assert capsys.readouterr().out == quoted


def test_the_tutorials_wrong_rule_fails_as_quoted(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    right = re.search(r"\(rewrite (\(Reverse \(Reverse x d\) d\)) x", block(";; my-rules.egg")).group(1)
    wrong = re.search(r"Had you written `(\(Reverse \(Reverse x d\) e\)) x`", DOC).group(1)
    (tmp_path / "my-rules.egg").write_text(block(";; my-rules.egg").replace(right, wrong))
    argv, _ = command_and_output("rules check --file my-rules.egg")
    assert main(argv) == 1
    assert capsys.readouterr().out == block("reverse-reverse              unsound")


def test_the_tutorial_stats_as_quoted(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-rules.egg").write_text(block(";; my-rules.egg"))
    (tmp_path / "model.hlo").write_text(block("HloModule flip"))
    argv, quoted = command_and_output("rules stats model.hlo --file my-rules.egg")
    assert main(argv) == 0
    assert untimed(capsys.readouterr().out) == untimed(quoted)


def test_the_rule_counts_the_doc_states_are_the_catalogs():
    rules = catalog().rules
    generic_files = [r for r in rules if r.set == "generic" and not r.builtin]
    layout = [r for r in rules if r.set == "layout"]
    m = re.search(r"The (\d+) rules are the (\d+) of the generic set, the (\d+) of the layout set \(every model "
                  r"type runs it\), yours, and the built-in `constant-fold` \(`nxsat rules list` shows (\d+):",
                  " ".join(DOC.split()))
    assert m, "docs/rules.md no longer explains the tutorial's rule count"
    in_stats, in_generic, in_layout, in_list = map(int, m.groups())
    assert in_generic == len(generic_files) and in_layout == len(layout)
    assert in_stats == len(generic_files) + len(layout) + 2  # yours and constant-fold
    assert in_list == len(rules)
    assert f"(generic, layout, my-rules: {in_stats} rules)" in block("$ nxsat rules stats")


def test_working_on_a_copy_of_a_shipped_set_runs(tmp_path, capsys):
    assert "$ cp rules/sets/generic.egg /tmp/generic.egg" in DOC
    copy = tmp_path / "generic.egg"
    shutil.copy(ROOT / "rules" / "sets" / "generic.egg", copy)
    assert main(["rules", "check", "--file", str(copy), "transpose-transpose"]) == 0
    assert "1 rule(s): 1 sound" in capsys.readouterr().out

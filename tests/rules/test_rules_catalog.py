"""Rule files and configuration: metadata, diagnostics with file:line, macros, sets and model types."""

from __future__ import annotations

import pytest

from nxsat.diagnostics import NxsatError
from nxsat.io import read_text
from nxsat.rules.catalog import CONFIG, build_catalog, catalog, expand, parse_set
from nxsat.rules.egraph import EGraph
from nxsat.rules.sexp import read


def _error(text: str, code: str) -> NxsatError:
    with pytest.raises(NxsatError) as info:
        build_catalog(extra_files=[("extra", "extra.egg", text)])
    assert info.value.code == code, info.value.format()
    return info.value


def test_every_rule_has_a_unique_name_a_tag_and_a_one_line_description():
    cat = catalog()
    names = [r.name for r in cat.rules]
    assert len(names) == len(set(names)) and len(names) > 40
    for r in cat.rules:
        assert r.tag in ("exact", "approximate") and r.doc and "\n" not in r.doc
        assert r.builtin or (r.loc is not None and r.loc.file == f"rules/sets/{r.set}.egg" and r.loc.line > 0)


def test_shipped_rules_are_accepted_by_egglog():
    EGraph(catalog().rules, catalog())  # raises NCC_ERUL002 at the rule's line otherwise


def test_syntax_errors_point_at_file_and_line():
    e = _error("\n\n(rewrite (Negate (Negate x)) x\n  :name n :tag exact :doc \"-(-x)\"", "NCC_ERUL001")
    assert e.loc.file == "extra.egg" and e.loc.line == 3
    e = _error('(rewrite (Negate x) x :name a :tag exact :doc "no end)', "NCC_ERUL001")
    assert "string" in e.message


@pytest.mark.parametrize("text, words", [
    ("(rewrite (Negate x) x :tag exact :doc \"d\")", "no :name"),
    ("(rewrite (Negate x) x :name n :tag maybe :doc \"d\")", "exact or approximate"),
    ("(rewrite (Negate x) x :name n :tag exact)", "one-line string"),
    ("(rewrite (Negate x) x :name n :tag approximate :doc \"d\")", "needs :bound"),
    ("(rewrite (Negate x) x :name n :tag exact :bound 0.1 :doc \"d\")", "cannot have a :bound"),
    ("(rewrite (Negate x) x :name Bad_Name :tag exact :doc \"d\")", "lowercase"),
    ("(rewrite (Negate x) x :name n :tag exact :doc \"d\" :colour red)", "unknown rule option"),
    ("(rewrite (Negate x) x :name add-zero-right :tag exact :doc \"d\")", "used twice"),
    ("(datatype Foo)", "cannot appear in a rule set"),
    ("(birewrite (Negate x) x :name n :tag exact :doc \"d\")", "two named rewrites"),
])
def test_bad_rules_are_rejected_with_a_reason(text, words):
    e = _error(text, "NCC_ERUL002")
    assert words in e.message and e.loc is not None and e.loc.file == "extra.egg"


def test_macros_expand_and_recursion_is_caught():
    macros = {}
    rules, _ = parse_set('(defmacro (twice f x) (f (f x)))\n'
                         '(rewrite (twice Negate x) x :name nn :tag exact :doc "d")', "m.egg", "s", macros)
    assert str(rules[0].lhs) == "(Negate (Negate x))"
    prelude = catalog().macros
    assert str(expand(read("(compose p q)", "t")[0], prelude)) == '(unstable-vec-map (unstable-fn "vec-get" p) q)'
    with pytest.raises(NxsatError) as info:
        parse_set("(defmacro (loop x) (loop x))\n(rewrite (loop y) y :name l :tag exact :doc \"d\")", "m.egg", "s", {})
    assert info.value.code == "NCC_ERUL002" and "deeper" in info.value.message


def test_unknown_names_are_diagnosed():
    cat = catalog()
    for call in (lambda: cat.find(["add-zero-rigth"]), lambda: cat.sets_for("diffusion"),
                 lambda: cat.set_rules(["nope"])):
        with pytest.raises(NxsatError) as info:
            call()
        assert info.value.code == "NCC_ERUL003"
    with pytest.raises(NxsatError) as info:
        cat.find(["add-zero-rigth"])
    assert "add-zero-right" in (info.value.hint or "")


def test_adding_a_set_and_a_model_type_is_configuration(tmp_path):
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "demo.egg").write_text(
        '(rewrite (Exponential (Log x)) x :name exp-log :tag approximate :bound 0.001 :doc "exp(log x) = x")\n')
    config = read_text(CONFIG).replace('[model-types]', '[sets.demo]\nfile = "sets/demo.egg"\n\n[model-types]\n'
                                       'demo-model = ["generic", "demo"]')
    for shipped in (p.stem for p in (CONFIG.parent / "sets").glob("*.egg")):
        config = config.replace(f'file = "sets/{shipped}.egg"', f'file = "{(CONFIG.parent / "sets" / shipped)}.egg"')
    cat = build_catalog(config, base=tmp_path)
    assert cat.sets_for("demo-model") == ("generic", "demo")
    names = {r.name for r in cat.select("demo-model", 2, allow_approximate=True)}
    assert "exp-log" in names and "add-zero-right" in names
    assert "exp-log" not in {r.name for r in cat.select("demo-model", 2)}  # approximate needs permission
    assert "exp-log" not in {r.name for r in cat.select("generic", 2, allow_approximate=True)}


def test_levels_gate_explosive_rules_and_budgets_grow():
    cat = catalog()
    o1, o2, o3 = (cat.level(n) for n in (1, 2, 3))
    assert o1.iterations < o2.iterations < o3.iterations and o1.seconds < o2.seconds < o3.seconds
    assert not any(r.explosive for r in cat.select(None, 1))
    assert any(r.name == "add-associate" for r in cat.select(None, 2))
    with pytest.raises(NxsatError):
        cat.level(7)


@pytest.mark.parametrize("edit, words", [
    (lambda c: c + "\n[levels.9]\niterations = -1\nseconds = 1.0\nnode-factor = 2.0\nnode-min = 10\n", "positive"),
    (lambda c: c.replace('generic = ["generic", "layout"]', 'generic = ["missing"]'), "configured sets"),
    (lambda c: c + "\n[[[", ""),
])
def test_bad_configuration_is_diagnosed(edit, words):
    with pytest.raises(NxsatError) as info:
        build_catalog(edit(read_text(CONFIG)))
    assert info.value.code == "NCC_ERUL004" and words in info.value.message

"""Diagnostics: the code table and docs/error-codes.md agree; messages are always one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nxsat.diagnostics import CODES, Loc, NxsatError, Warnings, error

DOC = (Path(__file__).parent.parent / "docs" / "error-codes.md").read_text()


def test_every_code_is_documented_and_every_documented_code_exists():
    documented = set(re.findall(r"NCC_[EWI][A-Z]{3}\d{3}", DOC))
    # ranges written "NCC_EVRF017, 018, 019" document the codes after the first too
    for first, rest in re.findall(r"(NCC_[EWI][A-Z]{3})\d{3}((?:, \d{3})+)", DOC):
        documented |= {first + n for n in re.findall(r"\d{3}", rest)}
    missing = sorted(set(CODES) - documented)
    unknown = sorted(documented - set(CODES))
    assert not missing, f"codes missing from docs/error-codes.md: {missing}"
    assert not unknown, f"docs/error-codes.md names codes nxsat does not have: {unknown}"


def test_format_is_one_line_with_location_origin_and_hint():
    e = error("NCC_EVRF064", "bad\nshape", Loc("m.hlo", 3, 7, "model.py:9"), "fix\nit")
    assert e.format() == "m.hlo:3:7: error NCC_EVRF064: bad shape [from model.py:9] (hint: fix it)"


def test_undocumented_codes_cannot_be_raised():
    with pytest.raises(AssertionError):
        NxsatError("NCC_EXXX999", "nope")


def test_warnings_are_kept_once():
    w = Warnings()
    w.warn("NCC_WTYP001", "int64", Loc("a", 1, 1))
    w.warn("NCC_WTYP001", "int64", Loc("a", 2, 1))
    assert len(w) == 1 and next(iter(w)).loc.line == 1

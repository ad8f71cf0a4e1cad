"""docs/relay.md lists exactly the operators the front end lowers, and the Relay error codes are
declared and documented."""

from __future__ import annotations

import re
from pathlib import Path

from nxsat.diagnostics import CODES
from nxsat.frontend.relay import supported_operators

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_operator_table_matches_the_front_end():
    text = (DOCS / "relay.md").read_text()
    table = text[text.index("| group | operators |") : text.index("Semantics follow TVM")]
    documented = set(re.findall(r"`([a-z_.0-9]+)`", table))
    assert documented == set(supported_operators())
    assert all(notes for notes in supported_operators().values())


def test_relay_codes_are_declared_and_documented():
    text = (DOCS / "error-codes.md").read_text()
    section = text[text.index("## Relay front end") :]
    for code in ("NCC_ERLY001", "NCC_ERLY002", "NCC_ERLY003"):
        assert code in CODES and f"| {code} |" in section

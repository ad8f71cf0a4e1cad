"""Damage aimed at every region of a NEFF, and every check of the container shown to be the one that
catches its damage.

1. Each region (each header field, the manifest, the padding after it, each member, the padding
   between members, the tail) damaged on its own is refused with that region's code and message.
2. Each check of ``neff.unpack`` and ``neff.npy_array`` is disabled in turn (the function recompiled
   from its source with that one ``if`` made false, or that one ``except`` re-raising) and its
   damage then loads, or is refused by another check: the check is necessary, not decoration.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import json
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import neffmap as nm
import numpy as np
import pytest

from nxsat import sim
from nxsat.diagnostics import NxsatError
from nxsat.sim import neff

SAMPLE, CONSTS = nm.odd_sample()
LAYOUT = nm.layout(SAMPLE)
X = np.ones((3, 5), np.float32)


def outcome(data: bytes) -> tuple[str, str]:
    """("ok", "") when the NEFF loads and runs, (code, message) when refused, ("uncoded", type) otherwise."""
    try:
        m = sim.load(data, "f.neff")
        m.run({"x": X})
    except NxsatError as exc:
        return exc.code, exc.message
    except Exception as exc:  # noqa: BLE001 - a check disabled on purpose lets raw errors through
        return "uncoded", type(exc).__name__
    return "ok", ""


def refused(data: bytes, code: str, fragment: str = "") -> None:
    got = outcome(data)
    assert got[0] == code and fragment in got[1], got


def test_the_sample_has_every_region() -> None:
    names = [r[0] for r in LAYOUT.regions()]
    assert outcome(SAMPLE) == ("ok", "")
    assert "manifest_padding" in names
    assert [n for n, _, _ in LAYOUT.members] == ["program.nxs", "const/a.npy", "const/b.npy", "const/c.npy"]
    assert [n for n, _, _ in LAYOUT.paddings] == ["const/a.npy", "const/b.npy", "const/c.npy"]
    assert LAYOUT.members[-1][2] == len(SAMPLE) == LAYOUT.total


# --- 1. damage aimed at each region ------------------------------------------------------------------

REGIONS = LAYOUT.regions()


@pytest.mark.parametrize("region,start,end", REGIONS, ids=[r[0] for r in REGIONS])
def test_a_flipped_byte_in_each_region_has_its_code(region: str, start: int, end: int) -> None:
    code, fragment = nm.flip_code(region)
    for at in sorted({start, (start + end) // 2, end - 1}):
        for mask in (0x01, 0x80, 0xFF):
            refused(nm.flip(SAMPLE, at, mask), code, fragment)


@pytest.mark.parametrize("region,start,end", REGIONS, ids=[r[0] for r in REGIONS])
def test_truncation_inside_each_region_is_truncated(region: str, start: int, end: int) -> None:
    for cut in sorted({start, (start + end) // 2, end - 1} - {0}):
        refused(SAMPLE[:cut], "NCC_ENEF001", "truncated")


@pytest.mark.parametrize("tail", [b"\x00", b"\x00" * 64, b"junk", SAMPLE[:100]])
def test_bytes_after_the_last_member_are_refused(tail: bytes) -> None:
    refused(SAMPLE + tail, "NCC_ENEF002", "after the end")


def test_an_empty_file_is_not_a_neff() -> None:
    refused(b"", "NCC_ENEF006", "not an nxsat NEFF")


F = nm.fields(SAMPLE)
HEADER_EDITS = {  # a header field changed, the header CRC fixed: the field's own check catches it
    "magic": ({"magic": b"NXSNEFG\x00"}, "NCC_ENEF006", "not an nxsat NEFF"),
    "major": ({"major": 2}, "NCC_ENEF004", "format 2.0"),
    "minor": ({"minor": 1}, "NCC_ENEF003", "disagrees with the header"),
    "crc": ({"crc": F["crc"] ^ 1}, "NCC_ENEF002", "header fails its checksum"),
    "total+64": ({"total": F["total"] + 64}, "NCC_ENEF001", f"{F['total']} of {F['total'] + 64} bytes"),
    "total-1": ({"total": F["total"] - 1}, "NCC_ENEF002", "1 unexpected byte(s) after the end"),
    "manifest_size+1": ({"manifest_size": F["manifest_size"] + 1}, "NCC_ENEF003", "does not match its checksum"),
    "manifest_size=total": ({"manifest_size": F["total"]}, "NCC_ENEF002", "does not fit the file"),
    "manifest_size=2^40": ({"manifest_size": 1 << 40}, "NCC_ENEF002", "does not fit the file"),
    "manifest_sha": ({"manifest_sha": bytes(32)}, "NCC_ENEF003", "does not match its checksum"),
}


@pytest.mark.parametrize("edit", sorted(HEADER_EDITS))
def test_each_header_field_edited_with_a_valid_crc_has_its_code(edit: str) -> None:
    changes, code, fragment = HEADER_EDITS[edit]
    refused(nm.with_header(SAMPLE, **changes), code, fragment)


# --- 2. each check is the one that catches its damage -----------------------------------------------------

def _raises(stmt: ast.stmt, code: str, fragment: str) -> bool:
    """``raise error(CODE, <message containing fragment>)``."""
    if not isinstance(stmt, ast.Raise) or not isinstance(stmt.exc, ast.Call):
        return False
    call = stmt.exc
    return (isinstance(call.func, ast.Name) and call.func.id == "error" and len(call.args) >= 2
            and isinstance(call.args[0], ast.Constant) and call.args[0].value == code
            and fragment in ast.unparse(call.args[1]))


def without_check(func: Callable[..., Any], code: str, fragment: str) -> Callable[..., Any]:
    """``func`` recompiled from its source with one check disabled: the ``if`` whose body is only
    ``raise error(code, "...fragment...")`` never taken, or the ``except`` handler that raises it
    re-raising the original exception. Exactly one check must match."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    hits: list[int] = []

    class Off(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST:
            self.generic_visit(node)
            if len(node.body) == 1 and _raises(node.body[0], code, fragment):
                node.test = ast.Constant(False)
                hits.append(node.lineno)
            return node

        def visit_Try(self, node: ast.Try) -> ast.AST:
            self.generic_visit(node)
            for h in node.handlers:
                if len(h.body) == 1 and _raises(h.body[0], code, fragment):
                    h.body = [ast.Raise(exc=None, cause=None)]
                    hits.append(h.lineno)
            return node

    tree = ast.fix_missing_locations(Off().visit(tree))
    assert len(hits) == 1, f"{func.__name__}: {len(hits)} checks raise {code} with {fragment!r}"
    namespace = dict(func.__globals__)
    exec(compile(tree, inspect.getsourcefile(func) or "<neff>", "exec"), namespace)  # noqa: S102 - our own source
    return namespace[func.__name__]


def _patch(monkeypatch: pytest.MonkeyPatch, original: Callable[..., Any], replacement: Callable[..., Any]) -> None:
    """Replace a function in every nxsat module that holds it."""
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("nxsat"):
            for k, v in list(vars(mod).items()):
                if v is original:
                    monkeypatch.setattr(mod, k, replacement)


def _manifest_edit(edit: Callable[[dict[str, Any]], Any]) -> bytes:
    """The sample with its manifest edited (the manifest's checksum, size and the header CRC fixed)."""
    man = nm.manifest(SAMPLE)
    edit(man)
    return nm.with_manifest(SAMPLE, nm.canonical_json(man))


def _member(name: str) -> bytes:
    return dict(nm.members_of(SAMPLE))[name]


def _set_entry(man: dict[str, Any], name: str, **changes: Any) -> None:
    for e in man["members"]:
        if e["name"] == name:
            e.update(changes)


def _npy(a: np.ndarray, version: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=version, allow_pickle=False)
    return buf.getvalue()


def _bad_json() -> bytes:
    mbytes = nm.canonical_json(nm.manifest(SAMPLE))
    return nm.with_manifest(SAMPLE, mbytes[:-1] + b",}")


def _odd_member_name() -> bytes:
    man = nm.manifest(SAMPLE)
    members = [(n, b) for n, b in nm.members_of(SAMPLE)] + [("notes.txt", b"hello")]
    return nm.rebuild(man, members)


def _duplicate_program() -> bytes:
    man = nm.manifest(SAMPLE)
    members = nm.members_of(SAMPLE)
    return nm.rebuild(man, members + [members[0]])


def _no_program() -> bytes:
    man = nm.manifest(SAMPLE)
    return nm.rebuild(man, nm.members_of(SAMPLE)[1:])


def _zeros_after_last_member() -> bytes:
    data = SAMPLE + bytes(64)
    return nm.with_header(data, total=len(data))


def _data_flip(name: str) -> bytes:
    """A flipped byte in a constant's data: the member's last byte."""
    return nm.flip(SAMPLE, dict((n, e) for n, _, e in LAYOUT.members)[name] - 1, 0x04)


C = CONSTS["c"]
# (check: the code and a fragment of the message it raises) -> (damage, what happens when it is disabled:
# "ok" the damage gets through; or the code (and message fragment) of the check that catches it instead)
CHECKS: dict[str, tuple[str, str, Callable[[], bytes], tuple[str, str]]] = {
    "short prefix": ("NCC_ENEF001", "truncated NEFF ({n} bytes)", lambda: SAMPLE[:5],
                     ("NCC_ENEF006", "not an nxsat NEFF")),
    "magic": ("NCC_ENEF006", "not an nxsat NEFF (no NXSNEFF header)",
              lambda: nm.with_header(SAMPLE, magic=b"NXSNEFG\x00"), ("ok", "")),
    "header length": ("NCC_ENEF001", "the header alone is", lambda: SAMPLE[:40], ("uncoded", "error")),
    "header crc": ("NCC_ENEF002", "header fails its checksum",
                   lambda: nm.put(SAMPLE, 32, b"\x00" * 4), ("NCC_ENEF003", "does not match its checksum")),
    "major version": ("NCC_ENEF004", "but this nxsat reads format", lambda: nm.with_header(SAMPLE, major=2),
                      ("NCC_ENEF003", "disagrees with the header")),
    "shorter than total": ("NCC_ENEF001", "{n} of {total} bytes", lambda: SAMPLE[:-3],
                           ("NCC_ENEF002", "member const/c.npy fails its checksum")),
    "longer than total": ("NCC_ENEF002", "after the end", lambda: SAMPLE + b"\x00" * 3, ("ok", "")),
    "manifest size": ("NCC_ENEF002", "does not fit the file",
                      lambda: nm.with_header(SAMPLE, manifest_size=nm.fields(SAMPLE)["total"]),
                      ("NCC_ENEF003", "does not match its checksum")),
    "manifest checksum": ("NCC_ENEF003", "does not match its checksum",
                          lambda: nm.put(SAMPLE, SAMPLE.index(hashlib.sha256(_member("const/c.npy")).hexdigest()
                                                              .encode()), b"0" * 8),
                          ("NCC_ENEF002", "member const/c.npy fails its checksum")),
    "manifest json": ("NCC_ENEF003", "malformed NEFF manifest ({exc})", _bad_json, ("uncoded", "JSONDecodeError")),
    "manifest format": ("NCC_ENEF003", "not an nxsat-neff manifest",
                        lambda: _manifest_edit(lambda m: m.update(format="nxsat-neff-2")), ("ok", "")),
    "format version": ("NCC_ENEF003", "disagrees with the header",
                       lambda: _manifest_edit(lambda m: m.update(format_version="1.7")), ("ok", "")),
    "member list": ("NCC_ENEF003", "(member list)", lambda: _manifest_edit(lambda m: m.update(members=[])),
                    ("NCC_ENEF003", "do not end where the file ends")),
    "manifest padding": ("NCC_ENEF002", "padding after the manifest",
                         lambda: nm.flip(SAMPLE, LAYOUT.manifest_padding[1] - 1), ("ok", "")),
    "member entry": ("NCC_ENEF003", "(member entry", lambda: _manifest_edit(
        lambda m: m["members"][1].update(note="x")), ("ok", "")),
    "member name": ("NCC_ENEF003", "unexpected NEFF member", _odd_member_name,
                    ("NCC_ENEF003", "do not match the program's constants")),
    "duplicate member": ("NCC_ENEF003", "duplicate NEFF member", _duplicate_program, ("ok", "")),
    "member offset": ("NCC_ENEF003", "is not where the layout puts it",
                      lambda: _manifest_edit(lambda m: _set_entry(m, "const/b.npy",
                                                                  offset=m["members"][2]["offset"] + 64)),
                      ("ok", "")),  # the loader reads each member where the layout puts it, not at the offset
    "padding between members": ("NCC_ENEF002", "padding before {name}",
                                lambda: nm.flip(SAMPLE, LAYOUT.paddings[1][1]), ("ok", "")),
    "member checksum": ("NCC_ENEF002", "member {name} fails its checksum", lambda: _data_flip("const/c.npy"),
                        ("ok", "")),
    "members end at the end": ("NCC_ENEF003", "do not end where the file ends", _zeros_after_last_member,
                               ("ok", "")),
    "program member": ("NCC_ENEF003", "has no {PROGRAM_MEMBER}", _no_program, ("uncoded", "KeyError")),
}
NPY_CHECKS: dict[str, tuple[str, str, Callable[[], bytes], tuple[str, str]]] = {
    "npy header": ("NCC_ENEF002", "is not a readable .npy array",
                   lambda: nm.with_member(SAMPLE, "const/c.npy", b"\x93NUMPX" + _member("const/c.npy")[6:]),
                   ("uncoded", "ValueError")),
    "npy type and shape": ("NCC_ENEF003", "the manifest says",
                           lambda: nm.with_member(SAMPLE, "const/c.npy",
                                                  _member("const/c.npy").replace(b"(5, 3)", b"(3, 5)")),
                           ("NCC_ENEF003", "not in the canonical form")),
    "npy data size": ("NCC_ENEF002", "data bytes, its header says",
                      lambda: nm.with_member(SAMPLE, "const/c.npy", _member("const/c.npy")[:-1]),
                      ("uncoded", "ValueError")),
    "npy canonical": ("NCC_ENEF003", "not in the canonical form",
                      lambda: nm.with_member(SAMPLE, "const/c.npy", _npy(C, (2, 0))), ("ok", "")),
}


@pytest.mark.parametrize("check", sorted(CHECKS) + sorted(NPY_CHECKS))
def test_each_check_is_the_one_that_catches_its_damage(monkeypatch: pytest.MonkeyPatch, check: str) -> None:
    func = neff.npy_array if check in NPY_CHECKS else neff.unpack
    code, fragment, damage, without = (NPY_CHECKS | CHECKS)[check]
    data = damage()
    got = outcome(data)
    assert got[0] == code, (check, got)
    _patch(monkeypatch, func, without_check(func, code, fragment))
    after = outcome(data)
    assert after[0] == without[0] and without[1] in after[1], (check, "disabled:", after)
    assert after != got


def test_a_constant_whose_checksum_is_not_checked_loads_the_damaged_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the member checksum protects: with it disabled, a flipped data byte reaches the output."""
    data = _data_flip("const/c.npy")
    _patch(monkeypatch, neff.unpack, without_check(neff.unpack, "NCC_ENEF002", "member {name} fails its checksum"))
    y, z, w = sim.load(data).run({"x": X})
    assert (w != C).sum() == 1 and w[-1, -1] == C[-1, -1] ^ 0x04
    np.testing.assert_array_equal(z, CONSTS["b"])


def test_every_check_of_the_container_is_covered() -> None:
    """Every ``raise error(...)`` in unpack and npy_array that a check guards is in CHECKS/NPY_CHECKS
    (the fallthrough raise of a file shorter than the magic is the only unconditional one)."""
    for func, table in ((neff.unpack, CHECKS), (neff.npy_array, NPY_CHECKS)):
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
        guarded = []
        for node in ast.walk(tree):
            bodies = [node.body] if isinstance(node, ast.If) else (
                [h.body for h in node.handlers] if isinstance(node, ast.Try) else [])
            for body in bodies:
                if len(body) == 1 and isinstance(body[0], ast.Raise):
                    guarded.append(ast.unparse(body[0].exc))
        covered = [g for g in guarded if any(c in g and f in g for c, f, _, _ in table.values())]
        assert sorted(covered) == sorted(guarded), set(guarded) - set(covered)
        assert len(guarded) == len(table), (func.__name__, len(guarded), len(table))


def test_the_neff_map_reads_what_the_writer_wrote() -> None:
    """The test's own reading of the layout agrees with the loader on the sample (members, sizes)."""
    box = neff.unpack(SAMPLE)
    assert [n for n, _ in nm.members_of(SAMPLE)] == [e["name"] for e in box.manifest["members"]]
    assert dict(nm.members_of(SAMPLE)) == box.members
    assert json.loads(nm.canonical_json(nm.manifest(SAMPLE))) == box.manifest

"""NEFF: deterministic bytes, assemble(disassemble(x)) == x, and every refusal with its own code."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib

import numpy as np
import pytest
from nxsim_progs import EXAMPLES

from nxsat import dtypes as dt
from nxsat import sim
from nxsat.diagnostics import NxsatError
from nxsat.sim import neff

RNG = np.random.default_rng(11)
LN_CONSTS = {"gamma": RNG.standard_normal((1, 768)).astype(np.float32),
             "beta": RNG.standard_normal((1, 768)).astype(np.float32)}

BF16_CONST = """
.isa 1.0
.target trn2
.flags ["--auto-cast", "matmult", "-O2"]
input   x: bf16[128, 8]
const   w: bf16[128, 8]
const   e: f8e4m3fn[128, 8]
output  y: bf16[128, 8]
sbuf    a: bf16[128, 8]
sbuf    b: bf16[128, 8]
sem     s
q0    dma            a, x, signal=s
q1    dma            b, w, signal=s
dve   tensor_tensor  a, a, b, op=add, wait=s>=2, signal=s
q0    dma            y, a, wait=s>=3
"""


def _examples() -> list[tuple[str, str, dict]]:
    return [(n, (EXAMPLES / f"{n}.nxs").read_text(), LN_CONSTS if n == "layernorm" else {})
            for n in ("matmul", "softmax", "layernorm", "gather")]


def _bf16_consts() -> dict[str, np.ndarray]:
    import ml_dtypes

    return {"w": (np.arange(1024).reshape(128, 8) / 7).astype(ml_dtypes.bfloat16),
            "e": np.linspace(-400, 400, 1024).reshape(128, 8).astype(ml_dtypes.float8_e4m3fn)}


@pytest.mark.parametrize(("name", "text", "consts"), _examples())
def test_same_program_gives_same_bytes(name: str, text: str, consts: dict) -> None:
    a = sim.assemble(text, name, consts)
    b = sim.assemble(text, name, {k: v.copy() for k, v in consts.items()})
    assert a == b


@pytest.mark.parametrize(("name", "text", "consts"), _examples())
def test_assemble_of_disassemble_is_identity(name: str, text: str, consts: dict) -> None:
    data = sim.assemble(text, name, consts)
    program, constants = sim.disassemble(data)
    assert sim.assemble(program, "again.nxs", constants) == data


def test_low_precision_constants_flags_and_target_round_trip() -> None:
    data = sim.assemble(BF16_CONST, "c.nxs", _bf16_consts())
    m = sim.load(data)
    assert m.manifest["target"] == "trn2" and m.manifest["lnc"] == 2 and m.program.ranks == 2
    assert m.manifest["compile_flags"] == ["--auto-cast", "matmult", "-O2"]
    program, constants = sim.disassemble(data)
    assert constants["w"].dtype == _bf16_consts()["w"].dtype
    np.testing.assert_array_equal(constants["e"].view(np.uint8), _bf16_consts()["e"].view(np.uint8))
    assert sim.assemble(program, "again.nxs", constants) == data
    # Constants given widened to fp32 (as an .npz stores bf16) assemble to the same bytes.
    wide = {k: v.astype(np.float32) for k, v in constants.items()}
    assert sim.assemble(program, "again.nxs", wide) == data


def test_manifest_contents() -> None:
    data = sim.assemble((EXAMPLES / "layernorm.nxs").read_text(), "ln", LN_CONSTS)
    m = sim.load(data)
    man = m.manifest
    assert man["format_version"] == "1.0" and man["isa_version"] == "1.0"
    assert man["nxsat_version"] == sim.runtime.__version__
    assert man["inputs"] == [{"name": "x", "dtype": "f32", "shape": [128, 768], "shard": None}]
    assert man["outputs"] == [{"name": "y", "dtype": "f32", "shape": [128, 768], "shard": None}]
    assert [c["name"] for c in man["constants"]] == ["gamma", "beta"]
    for entry in man["members"]:
        blob = neff.unpack(data).members[entry["name"]]
        assert hashlib.sha256(blob).hexdigest() == entry["sha256"]
    assert b"pickle" not in data.lower()


def _sample() -> bytes:
    return sim.assemble((EXAMPLES / "layernorm.nxs").read_text(), "ln", LN_CONSTS)


def _code(data: bytes, **kw: object) -> NxsatError:
    with pytest.raises(NxsatError) as e:
        sim.load(data, "x.neff", **kw)
    return e.value


def _reheader(data: bytes, major: int | None = None, manifest: bytes | None = None) -> bytes:
    """Rewrite the header (and manifest) consistently, as a deliberate editor would."""
    magic, ma, mi, _, total, msize, msha = neff.HEADER.unpack_from(data, 0)
    body = data[neff.HEADER_SIZE:]
    if manifest is not None:
        old = data[neff.HEADER_SIZE:neff.HEADER_SIZE + msize]
        assert len(manifest) == len(old)
        body = manifest + data[neff.HEADER_SIZE + msize:]
        msha = hashlib.sha256(manifest).digest()
    ma = ma if major is None else major
    zero = neff.HEADER.pack(magic, ma, mi, 0, total, msize, msha)
    return neff.HEADER.pack(magic, ma, mi, zlib.crc32(zero), total, msize, msha) + body


def test_truncated_is_refused() -> None:
    data = _sample()
    for cut in (len(data) - 1, len(data) // 2, 100, 40, 5):
        e = _code(data[:cut])
        assert e.code == "NCC_ENEF001", (cut, str(e))
        assert "truncated" in e.message


def test_flipped_byte_is_refused() -> None:
    data = bytearray(_sample())
    man_end = neff.HEADER_SIZE + struct.unpack_from("<Q", data, 24)[0]
    for pos in (len(data) - 10, man_end + 200, 30):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        e = _code(bytes(bad))
        assert e.code == "NCC_ENEF002", (pos, str(e))
        assert "corrupted" in e.message


def test_edited_manifest_is_refused() -> None:
    data = _sample()
    msize = struct.unpack_from("<Q", data, 24)[0]
    man = data[neff.HEADER_SIZE:neff.HEADER_SIZE + msize]
    edited = man.replace(b'"shape":[128,768]', b'"shape":[128,769]', 1)
    assert edited != man
    bad = data[:neff.HEADER_SIZE] + edited + data[neff.HEADER_SIZE + msize:]
    e = _code(bad)
    assert e.code == "NCC_ENEF003" and "edited" in e.message
    # An editor who also fixes the checksums is caught by the manifest/program cross-check.
    e = _code(_reheader(data, manifest=edited))
    assert e.code == "NCC_ENEF003" and "disagree" in e.message


def test_changed_major_version_is_refused() -> None:
    e = _code(_reheader(_sample(), major=2))
    assert e.code == "NCC_ENEF004"
    assert "recompile with this nxsat" in str(e)


def test_wrong_target_is_refused() -> None:
    data = _sample()
    e = _code(data, target="trn2")
    assert e.code == "NCC_ENEF005" and "trn1" in e.message and "trn2" in e.message
    e = _code(sim.assemble(BF16_CONST, "c", _bf16_consts()), lnc=1)
    assert e.code == "NCC_ENEF005"
    assert sim.load(data, "x.neff", target="trn1").target.name == "trn1"


def test_refusal_codes_are_distinct() -> None:
    data = _sample()
    codes = {
        _code(data[:-1]).code,
        _code(bytes([data[0]]) + data[1:-1] + bytes([data[-1] ^ 1])).code,
        _code(_reheader(data, major=9)).code,
        _code(data, target="inf2").code,
        _code(b"\x7fELF" + bytes(100)).code,
    }
    msize = struct.unpack_from("<Q", data, 24)[0]
    man = bytearray(data[neff.HEADER_SIZE:neff.HEADER_SIZE + msize])
    man[5] ^= 0x20
    codes.add(_code(data[:neff.HEADER_SIZE] + bytes(man) + data[neff.HEADER_SIZE + msize:]).code)
    assert codes == {"NCC_ENEF001", "NCC_ENEF002", "NCC_ENEF003", "NCC_ENEF004", "NCC_ENEF005", "NCC_ENEF006"}


def _repack(data: bytes, replace: dict[str, bytes]) -> bytes:
    """The NEFF with some members replaced and every checksum fixed, as a deliberate editor would."""
    c = neff.unpack(data)
    man = dict(c.manifest)
    members = [(e["name"], replace.get(e["name"], c.members[e["name"]])) for e in man.pop("members")]
    return neff.pack(man, members)


def test_pickled_constant_cannot_load(monkeypatch) -> None:
    """A member holding a pickled object array is refused, never unpickled."""
    import io
    import pickle

    def never(*a: object, **k: object) -> None:
        raise AssertionError("the loader unpickled something")

    data = _sample()
    for shape in ((1,), (1, 768)):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.full(shape, None, dtype=object), allow_pickle=True)
        evil = buf.getvalue()
        assert pickle.PROTO in evil or b"\x80" in evil
        monkeypatch.setattr(pickle, "load", never)
        monkeypatch.setattr(pickle, "loads", never)
        e = _code(_repack(data, {"const/gamma.npy": evil}))
        assert e.code == "NCC_ENEF003" and "object" in e.message


def test_constant_header_is_checked_before_any_allocation() -> None:
    """A constant whose .npy header claims a huge shape is refused from the header (no allocation)."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
    e = _code(_repack(_sample(), {"const/gamma.npy": buf.getvalue()}))
    assert e.code == "NCC_ENEF003" and "float32[1000000000000]" in e.message


def test_constant_members_must_be_canonical() -> None:
    """Same values in another .npy layout (version 2.0, Fortran order, short data) are refused, so a
    NEFF that loads always disassembles and reassembles to its own bytes."""
    import io

    gamma = LN_CONSTS["gamma"]
    cases = {}
    buf = io.BytesIO()
    np.lib.format.write_array(buf, gamma, version=(2, 0))
    cases["version 2.0"] = buf.getvalue()
    buf = io.BytesIO()
    np.lib.format.write_array(buf, gamma, version=(1, 0))
    cases["fortran"] = buf.getvalue().replace(b"'fortran_order': False", b"'fortran_order': True ")
    cases["short"] = neff.npy_bytes(gamma, dt.F32)[:-4]
    cases["not npy"] = b"\x93NUMPY\x03\x00garbage"
    good = neff.npy_bytes(gamma, dt.F32)
    cases["unterminated header string"] = good.replace(b"'shape': (", b"'shape", 1)  # numpy: tokenize error
    for what, blob in cases.items():
        e = _code(_repack(_sample(), {"const/gamma.npy": blob}))
        assert e.code in ("NCC_ENEF002", "NCC_ENEF003"), (what, str(e))


def test_deeply_nested_or_huge_manifest_values_are_coded() -> None:
    """JSON nesting past Python's recursion limit and integers past its digit limit: coded errors."""
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"format":"nxsat-neff","x":' + b"9" * 5000 + b"}"):
        mbytes = body
        data_start = -(-(neff.HEADER_SIZE + len(mbytes)) // neff.ALIGN) * neff.ALIGN
        sha = hashlib.sha256(mbytes).digest()
        zero = neff.HEADER.pack(neff.MAGIC, 1, 0, 0, data_start, len(mbytes), sha)
        blob = neff.HEADER.pack(neff.MAGIC, 1, 0, zlib.crc32(zero), data_start, len(mbytes), sha) + mbytes
        blob += bytes(data_start - len(blob))
        e = _code(blob)
        assert e.code == "NCC_ENEF003", str(e)


def test_tampered_program_with_fixed_checksums_is_checked_like_source() -> None:
    data = _sample()
    c = neff.unpack(data)
    man = dict(c.manifest)
    members = [(e["name"], c.members[e["name"]]) for e in man.pop("members")]
    prog = members[0][1].replace(b"func=rsqrt", b"func=system")
    e = _code(neff.pack(man, [(members[0][0], prog), *members[1:]]))
    assert e.code == "NCC_EASM004" and e.loc is not None and e.loc.file == "x.neff:program.nxs"


def test_manifest_is_canonical_json() -> None:
    data = _sample()
    msize = struct.unpack_from("<Q", data, 24)[0]
    man = data[neff.HEADER_SIZE:neff.HEADER_SIZE + msize]
    obj = json.loads(man)
    assert json.dumps(obj, sort_keys=True, separators=(",", ":")).encode() == man


def test_build_neff_from_program_objects() -> None:
    """The backend's path: a Program built in Python gives the same NEFF as its text form."""
    from nxsat import dtypes as dt
    from nxsat.sim import Access, Idx, Instr, Program, Tensor, Wait

    p = Program()
    p.tensors = {
        "x": Tensor("x", "input", dt.F32, (256, 64)),
        "y": Tensor("y", "output", dt.F32, (256, 64)),
        "t": Tensor("t", "sbuf", dt.F32, (128, 2, 64)),
    }
    p.semaphores = {"ld": 0, "ex": 0}
    whole_x = Access("x", (), (("reshape", (2, 128, 64)), ("permute", (1, 0, 2))))
    whole_y = Access("y", (), (("reshape", (2, 128, 64)), ("permute", (1, 0, 2))))
    p.instrs = [
        Instr("q0", "dma", (Access("t"), whole_x), {}, (), ("ld",)),
        Instr("act", "activation", (Access("t"), Access("t")),
              {"func": "exp", "scale": 1.0, "bias": 0.0, "accum": None}, (Wait("ld", 1),), ("ex",)),
        Instr("q1", "dma", (whole_y, Access("t", (Idx(0, 128), Idx(0, 2), Idx(0, 64))) ), {}, (Wait("ex", 1),), ()),
    ]
    data = sim.build_neff(p, sim.load_target("trn1"))
    text, consts = sim.disassemble(data)
    assert sim.assemble(text, "t.nxs") == data
    x = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    (y,) = sim.load(data).run({"x": x})
    np.testing.assert_allclose(y, np.exp(x.astype(np.float64)), rtol=1e-6)


def test_program_objects_are_checked_like_text() -> None:
    from nxsat import dtypes as dt
    from nxsat.sim import Access, Instr, Program, Tensor

    def prog(instr: Instr) -> Program:
        p = Program()
        p.tensors = {"t": Tensor("t", "sbuf", dt.F32, (128, 4))}
        p.instrs = [instr]
        return p

    cases = [
        (Instr("dve", "frob", (Access("t"),), {}), "NCC_EASM002"),
        (Instr("zz", "memset", (Access("t"),), {}), "NCC_EASM002"),
        (Instr("dve", "memset", (Access("u"),), {}), "NCC_EASM003"),
        (Instr("dve", "memset", (Access("t"),), {"value": "x"}), "NCC_EASM004"),
        (Instr("dve", "memset", (Access("t"),), {"colour": 1}), "NCC_EASM004"),
        (Instr("dve", "memset", (), {}), "NCC_EASM004"),
        (Instr("dve", "memset", (Access("t"),), {}, signals=("s",)), "NCC_EASM003"),
    ]
    for instr, code in cases:
        with pytest.raises(NxsatError) as e:
            sim.build_neff(prog(instr), sim.load_target("trn1"))
        assert e.value.code == code, (instr, str(e.value))

"""The text form: canonical printing round trips, access patterns, and coded errors with line numbers."""

from __future__ import annotations

import numpy as np
import pytest
from nxsim_progs import EXAMPLES, big_matmul, build

from nxsat import dtypes as dt
from nxsat import sim
from nxsat.diagnostics import NxsatError
from nxsat.sim.asm import format_program, parse
from nxsat.sim.isa import OPS
from nxsat.sim.program import Access, Idx, Tensor, resolve

HEAD = ".isa 1.0\n.target trn1\n"


def _canon(text: str) -> str:
    prog = parse(text, "t.nxs")
    target = sim.load_target(prog.target or "trn1")
    prog.target, prog.lnc = target.name, target.lnc
    from nxsat.sim.verify import link

    lk = link(prog, target)
    return format_program(lk.program, target.psum_bank_bytes)


@pytest.mark.parametrize("name", ["matmul", "softmax", "layernorm", "gather"])
def test_canonical_text_is_a_fixed_point(name: str) -> None:
    once = _canon((EXAMPLES / f"{name}.nxs").read_text())
    assert _canon(once) == once
    assert "#" not in once  # comments are not part of the program


def test_generated_program_round_trips() -> None:
    once = _canon(big_matmul(m_tiles=2, k_tiles=2, panels=3))
    assert _canon(once) == once


def test_access_spellings_normalise() -> None:
    text = HEAD + """
input   x: f32[8, 16]
output  y: f32[16, 8]
sbuf    t: f32[8, 4, 4]
sbuf    u: f32[4, 8]
sem     s
q0    dma   t, x[0:8, :].reshape(8, 4, 4), signal=s
q1    dma   y[-8:, :].T, t[:, 2:4, :].reshape(8, 8), wait=s>=1
q1    dma   y[0:8:1, :].T, x[:, ::2]
"""
    out = _canon(text)
    assert "q0    dma            t, x.reshape(8, 4, 4), signal=s" in out
    assert "q1    dma            y[8:16, :].T, t[:, 2:4, :].reshape(8, 8), wait=s>=1" in out
    assert "q1    dma            y[0:8, :].T, x[:, 0:15:2]" in out


def test_syntax_error_has_line_and_column() -> None:
    with pytest.raises(NxsatError) as e:
        parse(HEAD + "input x: f32[4]\nq0 dma x, x $\n", "p.nxs")
    assert e.value.code == "NCC_EASM001"
    assert (e.value.loc.line, e.value.loc.column) == (4, 13)
    assert str(e.value).startswith("p.nxs:4:13: error NCC_EASM001")


BAD = [
    # (program body after the header, code, line of the error)
    ("sbuf t: f32[128, 4]\nsem s\ndve frobnicate t\n", "NCC_EASM002", 5),
    ("sbuf t: f32[128, 4]\nxyz memset t\n", "NCC_EASM002", 4),
    ("sbuf t: f32[128, 4]\ndve memset t, value=1 ; 2\n", "NCC_EASM001", 4),  # a character no token begins with
    ("sbuf t: f32[128, 4]\ndve memset t, value=+\n", "NCC_EASM001", 4),  # a sign without its number
    ("sbuf t: f32[129, 4]\ndve memset t\n", "NCC_EASM005", 3),
    ("sbuf t: f32[64, 4] partition=100\ndve memset t\n", "NCC_EASM005", 3),
    ("sbuf t: f32[128, 50000]\ndve memset t\n", "NCC_EASM005", 3),
    ("psum p: f32[128, 4097]\n", "NCC_EASM006", 3),  # 16388 bytes per partition: past the end of PSUM
    ("dve memset nope\n", "NCC_EASM003", 3),
    ("sbuf t: f32[128, 4]\ndve memset t, wait=ghost>=1\n", "NCC_EASM003", 4),
    ("sbuf t: f32[128, 4]\nsbuf t: f32[128, 4]\n", "NCC_EASM003", 4),
    ("output y: f32[128, 4]\nsbuf t: f32[128, 4]\nq0 dma y, t\n", "NCC_EASM007", 5),
    ("output y: f32[128, 4]\nsbuf t: f32[128, 4]\nsem s\ndve memset t\nq0 dma y, t\n", "NCC_EASM008", 7),
    ("output y: f32[128, 4]\nsbuf t: f32[128, 4]\nsem r\nsem s\ndve memset t, wait=s>=1, signal=r\n"
     "q0 dma y, t, wait=r>=1, signal=s\n", "NCC_EASM009", 7),
    ("output y: f32[128, 4]\nsbuf t: f32[128, 4]\nsem s\ndve memset t, signal=s\nq0 dma y, t, wait=s>=2\n",
     "NCC_EASM009", 7),
    ("output y: f32[128, 8]\nsbuf t: f32[128, 8]\nsem s\ndve memset t, signal=s\n"
     "q0 dma y[:, 0:4], t[:, 0:4], wait=s>=1\n",
     "NCC_EASM007", 3),
    ("sbuf t: f32[128, 4]\ndve memset t, t\n", "NCC_EASM004", 4),
    ("sbuf t: f32[128, 4]\ndve memset t, value=up\n", "NCC_EASM004", 4),
    ("sbuf t: f32[128, 4]\ndve memset t[0:200, :]\n", "NCC_EASM004", 4),
    ("sbuf t: f32[128, 4]\npe memset t\n", "NCC_EASM004", 4),
    ("input x: f32[4]\nsbuf t: f32[1, 4]\nq0 dma x, t\n", "NCC_EASM004", 5),
    ("sbuf t: f32[128, 4]\nq20 dma t, t\n", "NCC_EASM002", 4),
    ("sbuf x: f32[1, 4] alias=x\n", "NCC_EASM004", 3),
    ("input x: f32[4]\noutput y: f32[4] alias=3\n", "NCC_EASM001", 4),
]


@pytest.mark.parametrize(("body", "line", "words"), [
    ("input x: f32[4]\noutput y: f32[4] alias=z\n", 4, "must name an input"),
    ("input x: f32[4]\noutput y: f32[5] alias=x\n", 4, "must name an input of the same type, shape"),
    ("input x: f32[4]\nsbuf t: f32[1, 4]\noutput y: f32[4] alias=x\nq0 dma y, t\n", 6, "no storage of its own"),
])
def test_an_alias_names_an_input_like_it_and_nothing_touches_it(body: str, line: int, words: str) -> None:
    """An output that is an input's buffer (the model's input_output_alias): of an input of its type and
    shape, and no instruction reads or writes it (the message, not only the code: before aliases existed
    the option itself was refused with the same code)."""
    with pytest.raises(NxsatError) as e:
        build(HEAD + body)
    assert e.value.code == "NCC_EASM004" and e.value.loc is not None and e.value.loc.line == line
    assert words in e.value.message, e.value.message


def test_an_aliased_output_round_trips_and_returns_its_input() -> None:
    text = HEAD + "input x: f32[4]\noutput y: f32[4] alias=x\n"
    assert "output  y: f32[4]  alias=x" in _canon(text)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(build(text).run({"x": x})[0], x)


@pytest.mark.parametrize(("body", "code", "line"), BAD)
def test_program_errors_are_coded_with_line_numbers(body: str, code: str, line: int) -> None:
    with pytest.raises(NxsatError) as e:
        build(HEAD + body)
    assert e.value.code == code, str(e.value)
    assert e.value.loc is not None and e.value.loc.line == line, str(e.value)


MATMUL_BANK = HEAD + """
sbuf    a: bf16[128, 128]
sbuf    b: bf16[128, 512]
psum    acc: f32[128, 1024]  offset={off}
sem     s
dve     memset a, signal=s
dve     memset b, signal=s
pe      matmul acc[:, 0:512], a, b, start=true, stop=true, wait=s>=2
"""


def test_psum_bank_overflow() -> None:
    build(MATMUL_BANK.format(off=0))  # bytes 0..2048: one bank
    with pytest.raises(NxsatError) as e:
        build(MATMUL_BANK.format(off=1024))  # acc[:, 0:512] spans bytes 1024..3072: two banks
    assert e.value.code == "NCC_EASM006" and e.value.loc.line == 10
    assert "bank" in e.value.message


def test_matmul_shape_rules() -> None:
    body = HEAD + "sbuf a: bf16[128, 128]\nsbuf b: bf16[128, 1024]\npsum acc: f32[128, 1024]\n"
    with pytest.raises(NxsatError) as e:
        build(body + "pe matmul acc, a, b, start=true\n")
    assert e.value.code == "NCC_EASM004" and "N=1024" in e.value.message


def test_fp8_matmul_refused_where_the_target_has_none() -> None:
    text = """.isa 1.0
.target inf1
sbuf    a: f8e4m3fn[128, 128]
sbuf    b: f8e4m3fn[128, 512]
psum    acc: f32[128, 512]
pe      matmul acc, a, b, start=true
"""
    with pytest.raises(NxsatError) as e:
        build(text)
    assert e.value.code == "NCC_ESPP004" and e.value.loc.line == 6


@pytest.mark.parametrize("target,src,says", [("trn1", "s32", "converts among f32, bf16, f16"),
                                               ("inf1", "f32", "dma copies bytes:")])
def test_a_dma_the_target_cannot_convert_is_refused(target: str, src: str, says: str) -> None:
    """trn1's DMA converts between float types as it copies, never to or from an integer; inf1's copies bytes."""
    text = f""".isa 1.0
.target {target}
input   x: {src}[128, 64]
sbuf    t: bf16[128, 64]
q0    dma  t, x
"""
    with pytest.raises(NxsatError) as e:
        build(text)
    assert e.value.code == "NCC_EASM004" and e.value.loc.line == 5 and says in e.value.message


def test_isa_major_version_mismatch() -> None:
    with pytest.raises(NxsatError) as e:
        parse(".isa 2.0\n", "p.nxs")
    assert e.value.code == "NCC_EASM002" and "recompile" in str(e.value)
    with pytest.raises(NxsatError) as e:
        parse("sem s\n", "p.nxs")
    assert e.value.code == "NCC_EASM001"


def test_semaphore_counting_across_producers() -> None:
    """A wait for all of several producers' signals orders after each of them; fewer does not."""
    text = HEAD + """
input   x: f32[256, 4]
output  y: f32[256, 4]
sbuf    t: f32[128, 2, 4]
sem     ld
q0    dma    t[:, 0, :], x[0:128, :], signal=ld
q1    dma    t[:, 1, :], x[128:256, :], signal=ld
q2    dma    y.reshape(2, 128, 4).permute(1, 0, 2), t, wait=ld>={n}
"""
    build(text.format(n=2))
    with pytest.raises(NxsatError) as e:
        build(text.format(n=1))
    assert e.value.code == "NCC_EASM008"


def test_write_after_read_race_is_found() -> None:
    text = HEAD + """
input   x: f32[128, 4]
output  y: f32[128, 4]
sbuf    t: f32[128, 4]
sem     a
sem     b
q0    dma    t, x, signal=a
q1    dma    y, t, wait=a>=1, signal=b
q0    dma    t, x{w}
"""
    build(text.format(w=", wait=b>=1"))
    with pytest.raises(NxsatError) as e:
        build(text.format(w=""))
    assert e.value.code == "NCC_EASM008"
    # Reported at one of the two accesses, naming the other.
    assert {e.value.loc.line, int(e.value.message.split("line ")[1].split()[0])} == {10, 11}


def test_aliasing_tiles_share_memory() -> None:
    """Two declarations at the same SBUF bytes are the same memory (and the checker knows it)."""
    text = HEAD + """
input   x: f32[128, 4]
output  y: bf16[128, 8]
sbuf    t: f32[128, 4]  offset=0
sbuf    u: bf16[128, 8]  offset=0
sem     s
q0    dma    t, x, signal=s
q1    dma    y, u, wait=s>=1
"""
    m = build(text)
    x = np.arange(512, dtype=np.float32).reshape(128, 4) + 0.5
    (y,) = m.run({"x": x})
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))
    with pytest.raises(NxsatError) as e:
        build(text.replace(", wait=s>=1", ""))
    assert e.value.code == "NCC_EASM008"  # u aliases t: reading u races with writing t


def test_auto_placement_is_first_fit_and_explicit_placement_is_kept() -> None:
    text = HEAD + """
sbuf    a: f32[128, 100]
sbuf    b: f32[128, 10]  offset=1024
sbuf    c: f32[128, 200]
sbuf    d: bf16[128, 8]
psum    p: f32[128, 512]
psum    q: f32[128, 16]
"""
    out = _canon(text)
    assert "sbuf    a: f32[128, 100]  offset=0" in out  # 400 bytes
    assert "sbuf    b: f32[128, 10]  offset=1024" in out
    assert "sbuf    c: f32[128, 200]  offset=1088" in out  # does not fit in 448..1024
    assert "sbuf    d: bf16[128, 8]  offset=448" in out
    assert "psum    p: f32[128, 512]  bank=0" in out
    assert "psum    q: f32[128, 16]  bank=1" in out


def _np_view(base: np.ndarray, acc: Access) -> np.ndarray:
    v = base[tuple(ix.start if ix.single else slice(ix.start, ix.stop, ix.step) for ix in acc.index)] \
        if acc.index else base
    for op, arg in acc.views:
        if op == "permute":
            v = v.transpose(arg)
        elif op == "reshape":
            v = np.reshape(v, arg, copy=False)
        else:
            shape = list(v.shape)
            shape[arg[0]] = arg[1]
            v = np.broadcast_to(v, shape)
    return v


def test_access_patterns_match_numpy_views() -> None:
    """resolve() gives the same element offsets as numpy's views, over many index/view combinations."""
    rng = np.random.default_rng(0)
    shape = (6, 4, 10)
    t = Tensor("x", "input", dt.F32, shape)
    base = np.arange(int(np.prod(shape))).reshape(shape)
    checked = 0
    for _ in range(400):
        idx = []
        for n in shape:
            if rng.random() < 0.2:
                i = int(rng.integers(0, n))
                idx.append(Idx(i, i + 1, 1, True))
            else:
                a = int(rng.integers(0, n))
                b = int(rng.integers(a + 1, n + 1))
                k = int(rng.integers(1, 3))
                cnt = len(range(a, b, k))
                idx.append(Idx(a, a + (cnt - 1) * k + 1, k))
        views = []
        rank = sum(1 for i in idx if not i.single)
        if rank and rng.random() < 0.5:
            views.append(("permute", tuple(int(v) for v in rng.permutation(rank))))
        acc = Access("x", tuple(idx), tuple(views))
        v = _np_view(base, acc)
        if v.size > 1 and rng.random() < 0.5:
            for shp in ((v.size,), (1, v.size), (v.size, 1)):
                try:
                    np.reshape(v, shp, copy=False)
                except ValueError:
                    continue
                acc = Access("x", acc.index, acc.views + (("reshape", shp),))
                v = _np_view(base, acc)
                break
        ap = resolve(acc, t)
        assert ap.shape == v.shape
        grid = ap.offset + sum(np.arange(s).reshape([-1 if d == k else 1 for d in range(len(ap.dims))]) * st
                               for k, (s, st) in enumerate(ap.dims)) if ap.dims else np.array(ap.offset)
        np.testing.assert_array_equal(np.broadcast_to(grid, v.shape), v)
        checked += 1
    assert checked == 400


def test_reshape_needing_a_copy_is_refused() -> None:
    with pytest.raises(NxsatError) as e:
        build(HEAD + "input x: f32[8, 16]\noutput y: f32[64]\nq0 dma y, x[:, 0:8].reshape(64)\n")
    assert e.value.code == "NCC_EASM004" and "needs a copy" in e.value.message


def test_every_opcode_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "device-program.md").read_text()
    for name in OPS:
        assert f"`{name}`" in doc, name


def test_streams_and_opcodes_table_is_consistent() -> None:
    for name, op in OPS.items():
        assert op.engines, name
        assert op.doc, name


ACCUMULATE = HEAD + """
sbuf    a: bf16[128, 128]
sbuf    b: bf16[128, 256]
sbuf    o: f32[128, 256]
psum    acc: f32[128, 512]  bank=0
psum    two: f32[128, 256]  bank=1
sem     s
sem     mm
dve     memset a, signal=s
dve     memset b, signal=s
{body}
"""


@pytest.mark.parametrize(("body", "code", "line", "words"), [
    # accumulating after the group ended (stop=true)
    ("pe matmul acc[:, 0:256], a, b, start=true, stop=true, wait=s>=2\npe matmul acc[:, 0:256], a, b, stop=true",
     "NCC_EASM006", 14, "no accumulation group is open"),
    # a second group in a bank that holds an open one (8 banks: 8 groups in flight)
    ("pe matmul acc[:, 0:256], a, b, start=true, wait=s>=2\npe matmul acc[:, 256:512], a, b, start=true, stop=true\n"
     "pe matmul acc[:, 0:256], a, b, stop=true", "NCC_EASM006", 14, "still holds"),
    # restarting an open group (its partial sums would be lost)
    ("pe matmul acc[:, 0:256], a, b, start=true, wait=s>=2\npe matmul acc[:, 0:256], a, b, start=true, stop=true",
     "NCC_EASM006", 14, "still holds"),
    # continuing a group on another region of the bank
    ("pe matmul acc[:, 0:256], a, b, start=true, wait=s>=2\npe matmul acc[0:64, 0:256], a[:, 0:64], b, stop=true",
     "NCC_EASM006", 14, "same PSUM region"),
    # reading the partial sums of an open group
    ("pe matmul acc[:, 0:256], a, b, start=true, wait=s>=2, signal=mm\ndve tensor_copy o, acc[:, 0:256], wait=mm>=1, "
     "signal=mm\npe matmul acc[:, 0:256], a, b, stop=true, wait=mm>=2", "NCC_EASM007", 14, "partial sums"),
    # a group that never ends
    ("pe matmul acc[:, 0:256], a, b, start=true, wait=s>=2\npe matmul acc[:, 0:256], a, b", "NCC_EASM006", 13,
     "never ends"),
])
def test_psum_accumulation_groups(body: str, code: str, line: int, words: str) -> None:
    with pytest.raises(NxsatError) as e:
        build(ACCUMULATE.format(body=body))
    assert e.value.code == code, str(e.value)
    assert e.value.loc.line == line and words in e.value.message, str(e.value)


def test_psum_accumulation_groups_that_are_right() -> None:
    """Groups in different banks interleave; a closed group is read while another bank accumulates;
    start=true, stop=true is a group of one."""
    m = build(ACCUMULATE.format(body="""
pe      matmul acc[:, 0:256], a, b, start=true, wait=s>=2
pe      matmul two, a, b, start=true
pe      matmul acc[:, 0:256], a, b, stop=true, signal=mm
dve     tensor_copy o, acc[:, 0:256], wait=mm>=1
pe      matmul two, a, b, stop=true
pe      matmul acc[:, 256:512], a, b, start=true, stop=true
"""))
    assert [c.attrs["start"] for c in m.linked.instrs if c.op.name == "matmul"] == [True, True, False, False, True]


def test_one_semaphore_chain_across_streams_is_ordered() -> None:
    """Every instruction waits for the count so far and signals the same semaphore: a total order.
    A stream's later signals cannot have happened before an instruction they depend on, which the
    happens-before analysis proves in a second round (the first alone reports a false race)."""
    body = ["output y: f32[128, 4]", "sbuf a: f32[128, 4]", "sbuf c: f32[128, 4]", "sbuf r: f32[128, 1]", "sem s"]
    chain = ["dve memset a", "dve memset c", "dve tensor_reduce r, a, op=max", "dve tensor_copy a, a",
             "act tensor_copy c, a", "pool tensor_copy a, c", "act tensor_copy c, a", "q1 dma y, c"]
    for n, ins in enumerate(chain):
        body.append(ins + (f", wait=s>={n}" if n else "") + ", signal=s")
    m = build(HEAD + "\n".join(body) + "\n")
    lk = m.linked
    for a, b in zip(range(len(chain)), range(1, len(chain))):
        assert lk.hb(a, b)


def test_negative_zero_immediates_are_not_taken_for_their_zero_defaults() -> None:
    """-0.0 equals the default 0.0 but is another fp32 value (x + -0.0 keeps a -0.0, x + 0.0 does
    not): the canonical text must keep it, or the NEFF computes something else than the source."""
    text = HEAD + """
input   x: f32[1, 2]
output  y: f32[1, 2]
sbuf    t: f32[1, 2]
sem     s
q0    dma            t, x, signal=s
dve   tensor_scalar  t, t, op0=add, scalar0=-0.0, wait=s>=1, signal=s
q0    dma            y, t, wait=s>=2
"""
    data = sim.assemble(text, "z.nxs")
    program, _ = sim.disassemble(data)
    assert "scalar0=-0.0" in program
    (y,) = sim.load(data).run({"x": np.array([[-0.0, 1.0]], np.float32)})
    assert np.signbit(y[0, 0])


def test_checks_hold_when_every_instruction_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race check drops accesses ordered before everything still to run (verify._Footprints); with a
    sweep after every instruction the same programs are accepted, and refused with the same code at
    the same line."""
    from nxsat.sim import verify

    monkeypatch.setattr(verify._Footprints, "MIN_VISITS", 0)
    monkeypatch.setattr(verify._Footprints, "SWEEP_COST", 10**12)
    for body, code, line in BAD:
        test_program_errors_are_coded_with_line_numbers(body, code, line)
    test_semaphore_counting_across_producers()
    test_write_after_read_race_is_found()
    test_aliasing_tiles_share_memory()
    test_one_semaphore_chain_across_streams_is_ordered()
    # a read whose only write was dropped by a sweep long before is still a read after a write
    text = HEAD + "input x: f32[128, 4]\noutput y: f32[128, 4]\nsbuf t: f32[128, 4]\nsbuf u: f32[128, 4]\n" \
        "sem a\nsem b\nq0 dma t, x, signal=a\n" + "".join(f"q1 dma u, x, wait=a>=1{', wait=b>=' + str(k) if k else ''}"
                                                        f", signal=b\n" for k in range(4)) + "q2 dma y, t, wait=b>=4\n"
    m = build(text)
    x = np.arange(512, dtype=np.float32).reshape(128, 4)
    np.testing.assert_array_equal(m.run({"x": x})[0], x)


def _instrs(text: str) -> list[tuple]:
    return [(i.stream, i.opcode, i.operands, tuple(i.attrs.items()), i.waits, i.signals, i.line, i.origin)
            for i in parse(text, "t.nxs").instrs]


def test_instructions_read_by_parts_are_what_the_general_parser_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new instruction line is read by its comma-separated parts, each parsed once per program
    (asm._head); the same programs read line by line through the general parser give the same
    instructions: hand-written ones, a generated one, and the text the compiler writes."""
    from nxsat.driver import CompileOptions, compile_model
    from nxsat.sim import asm

    compiled = sim.load(compile_model("tests/data/hlo/layer_norm_1x4096x768_bf16.hlo",
                                      CompileOptions(auto_cast="matmult")).neff).text
    texts = [(EXAMPLES / f"{n}.nxs").read_text() for n in ("matmul", "softmax", "layernorm", "gather")]
    texts += [big_matmul(m_tiles=2, k_tiles=2, panels=3), compiled]
    by_parts = [_instrs(t) for t in texts]
    monkeypatch.setattr(asm, "_head", lambda *a: None)
    for text, got in zip(texts, by_parts):
        want = _instrs(text)
        assert got == want
    assert sum(map(len, by_parts)) > 500

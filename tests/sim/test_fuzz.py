"""Property tests of the NEFF loader and the text form (hypothesis).

- Damaged NEFFs (flipped, truncated, inserted, deleted, overwritten bytes), the damage aimed at a region
  drawn first (each header field, the manifest, the padding after it, each member, the padding between
  members, the tail), are refused with a coded one-line error, within a budget of function calls; a
  single changed byte with the code of its region; nothing but the exact original bytes loads.
- A deliberate editor who fixes every checksum (edits to the manifest's JSON, the program text or a
  constant) still gets only coded errors; whatever such a file loads as is canonical: disassembling
  it and assembling again gives a NEFF that loads to the same program, constants and signature.
- Random valid programs survive assemble -> disassemble -> assemble byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import neffmap as nm
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nxsim_progs import EXAMPLES

from conftest import CallCounter, count_calls
from nxsat import sim
from nxsat.diagnostics import CODES, NxsatError
from nxsat.sim import neff

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_RNG = np.random.default_rng(3)
TRN2_CONSTS = """
.isa 1.0
.target trn2
.flags ["--auto-cast", "matmult"]
input   x: bf16[128, 8]  shard=1
const   w: bf16[128, 8]
const   e: f8e4m3fn[128, 8]
output  y: bf16[128, 8]  shard=1
sbuf    a: bf16[128, 8]
sbuf    b: bf16[128, 8]
sem     s
q0    dma            a, x, signal=s
q1    dma            b, w, signal=s
dve   tensor_tensor  a, a, b, op=add, wait=s>=2, signal=s
q0    dma            y, a, wait=s>=3
"""


def _samples() -> dict[str, bytes]:
    ln = {"gamma": _RNG.standard_normal((1, 768)).astype(np.float32),
          "beta": _RNG.standard_normal((1, 768)).astype(np.float32)}
    trn2 = {"w": (np.arange(1024).reshape(128, 8) / 7).astype(ml_dtypes.bfloat16),
            "e": np.linspace(-400, 400, 1024).reshape(128, 8).astype(ml_dtypes.float8_e4m3fn)}
    return {
        "layernorm": sim.assemble((EXAMPLES / "layernorm.nxs").read_text(), "ln", ln),
        "matmul": sim.assemble((EXAMPLES / "matmul.nxs").read_text(), "mm"),
        "trn2": sim.assemble(TRN2_CONSTS, "c", trn2),
        "odd": nm.odd_sample()[0],  # padding between all its members
    }


SAMPLES = _samples()
NAMES = sorted(SAMPLES)
# The work a load may do: a few times what loading the largest sample takes (counted in function calls,
# not seconds, so that a loaded machine cannot fail it); a hang or a blow-up exceeds it at once.
BUDGET = 5 * max(count_calls(sim.load, data, "f.neff", verify=True) for data in SAMPLES.values()) + 200_000
SIGNATURE = ("target", "lnc", "ranks", "compile_flags", "inputs", "outputs", "constants", "isa_version")


def _refusal(data: bytes) -> tuple[sim.Model | None, NxsatError | None]:
    """Load within the call budget; a refusal must be one coded line."""
    try:
        with CallCounter(limit=BUDGET):
            return sim.load(data, "f.neff", verify=True), None
    except NxsatError as exc:
        assert exc.code in CODES, exc.code
        line = exc.format()
        assert "\n" not in line and exc.code in line and len(line) < 2000
        return None, exc


def _load(data: bytes) -> sim.Model | None:
    return _refusal(data)[0]


def _assert_canonical(m: sim.Model) -> None:
    """A loaded NEFF is what nxsat writes: its disassembly reassembles to the same model."""
    again = sim.load(sim.assemble(m.text, "again.nxs", m.consts))
    assert again.text == m.text
    assert {k: again.manifest[k] for k in SIGNATURE} == {k: m.manifest[k] for k in SIGNATURE}
    assert sorted(again.consts) == sorted(m.consts)
    for k, v in m.consts.items():
        assert again.consts[k].tobytes() == v.tobytes() and again.consts[k].dtype == v.dtype


# --- damaged bytes ---------------------------------------------------------------------------------

def _regions(data: bytes) -> list[tuple[str, int, int]]:
    """The sample's regions, and its tail (an empty range at the end, where bytes can be appended)."""
    return nm.layout(data).regions() + [("tail", len(data), len(data))]


KINDS = ["header", "manifest", "manifest_padding", "member", "padding", "tail"]


def _kind(region: str) -> str:
    return region.split(".")[0].split(":")[0]


@settings(SETTINGS, max_examples=300)
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_damaged_neffs_are_refused_with_codes(kind: str, data: st.DataObject) -> None:
    """Damage aimed at a kind of region drawn first (then a sample that has one, then the region), so
    that the padding and every member are hit as often as the header (bytes drawn anywhere in the file
    mostly land in the magic, the length or the header CRC, or in the largest member)."""
    name = data.draw(st.sampled_from([n for n in NAMES if any(_kind(r) == kind for r, _, _ in
                                                                 _regions(SAMPLES[n]))]))
    orig = SAMPLES[name]
    region, start, end = data.draw(st.sampled_from([r for r in _regions(orig) if _kind(r[0]) == kind]))
    b = bytearray(orig)
    # changes in place (flip, overwrite) are the damage only a checksum or a padding check can see: drawn
    # as often as the three that move bytes
    kinds = (["append", "truncate"] if region == "tail"
             else ["flip", "overwrite", "flip", "overwrite", "flip", "truncate", "insert", "delete"])
    damage = [data.draw(st.sampled_from(kinds)) for _ in range(data.draw(st.integers(1, 3)))]
    for what in damage:
        at = data.draw(st.integers(min(start, len(b)), max(min(start, len(b)), min(end, len(b)) - 1)))
        if what == "flip" and at < len(b):
            b[at] ^= data.draw(st.integers(1, 255))
        elif what == "truncate":
            del b[at:]
        elif what == "append":
            b += data.draw(st.binary(min_size=1, max_size=64))
        elif what == "insert":
            b[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        elif what == "delete":
            del b[at:at + data.draw(st.integers(1, 64))]
        elif what == "overwrite":
            blob = data.draw(st.binary(min_size=1, max_size=16))
            b[at:at + len(blob)] = blob
    m, exc = _refusal(bytes(b))
    if m is not None:
        assert bytes(b) == orig  # only the untouched file loads
        return
    diff = [i for i, (x, y) in enumerate(zip(b, orig)) if x != y] if len(b) == len(orig) else []
    if len(diff) == 1:  # a single changed byte: the code of the region it is in
        code, fragment = nm.flip_code(next(r for r, lo, hi in _regions(orig) if lo <= diff[0] < hi))
        assert exc is not None and exc.code == code and fragment in exc.message, (region, exc)
    elif region != "tail" and damage == ["truncate"] and len(b) > 0:
        assert exc is not None and exc.code == "NCC_ENEF001", (region, exc)
    elif region == "tail" and "truncate" not in damage:
        assert exc is not None and exc.code == "NCC_ENEF002" and "after the end" in exc.message, exc


def test_the_damage_strategy_reaches_every_region_of_every_sample() -> None:
    """The regions the strategy draws from: every header field, the manifest and its padding, each
    member and each padding between members (the odd sample has one before every constant)."""
    for name, data in SAMPLES.items():
        regions = {r for r, _, _ in _regions(data)}
        members = {f"member:{e['name']}" for e in nm.manifest(data)["members"]}
        assert {f"header.{k}" for k in nm.FIELDS} | {"manifest", "tail"} | members <= regions, name
    odd = {r for r, _, _ in _regions(SAMPLES["odd"])}
    assert {"manifest_padding", "padding:const/a.npy", "padding:const/b.npy", "padding:const/c.npy"} <= odd
    assert {_kind(r) for data in SAMPLES.values() for r, _, _ in _regions(data)} == set(KINDS)


# --- a deliberate editor (every checksum fixed) --------------------------------------------------------

def _parts(data: bytes) -> tuple[dict[str, Any], bytes]:
    """The manifest and the member area (everything after the padded manifest)."""
    return nm.manifest(data), nm.member_area(data)


_raw_pack = nm.pack  # a container around any manifest bytes, with a consistent header (size, SHA-256, CRC)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _set(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    node = obj
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return obj


@SETTINGS
@given(name=st.sampled_from(NAMES), data=st.data())
def test_edited_manifest_with_fixed_checksums_is_coded(name: str, data: st.DataObject) -> None:
    manifest, area = _parts(SAMPLES[name])
    path = data.draw(st.sampled_from(_paths(manifest)))
    kind = data.draw(st.sampled_from(["replace", "delete", "raw"]))
    if kind == "replace":
        manifest = _set(manifest, path, data.draw(JSON))
        mbytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    elif kind == "delete" and path:
        parent = manifest
        for k in path[:-1]:
            parent = parent[k]
        del parent[path[-1]]
        mbytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    else:
        text = bytearray(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
        at = data.draw(st.integers(0, len(text) - 1))
        text[at:at + 1] = data.draw(st.binary(min_size=0, max_size=3))
        mbytes = bytes(text)
    m = _load(_raw_pack(mbytes, area))
    if m is not None:
        _assert_canonical(m)


PIECES = ["0", "1", "-1", "127", "128", "129", "512", "4097", "99999999999999999999", "1e38", "nan", "-inf",
          "x", "acc", "t", "s", "f32", "bf16", "s32", "pred", ".T", ".reshape(2, 64)", ".broadcast(0, 4)",
          "start=true", "stop=true", "wait=s>=9", "signal=s", "bank=7", "offset=1", "partition=64", "shard=0",
          ", ", "[", "]", ":", "::2", "(", ")", "\n", "#", "q15", "q16", "pe", "pool", "matmul", "dma", "nop",
          "\x00", "\u00e9", "\ud7ff"]


@SETTINGS
@given(name=st.sampled_from(NAMES), data=st.data())
def test_edited_program_or_constant_with_fixed_checksums_is_coded(name: str, data: st.DataObject) -> None:
    box = neff.unpack(SAMPLES[name])
    manifest = dict(box.manifest)
    members = [(e["name"], box.members[e["name"]]) for e in manifest.pop("members")]
    k = data.draw(st.integers(0, len(members) - 1))
    member, blob = members[k]
    if member == neff.PROGRAM_MEMBER and data.draw(st.booleans()):
        lines = blob.decode().split("\n")
        for _ in range(data.draw(st.integers(1, 3))):
            i = data.draw(st.integers(0, len(lines) - 1))
            op = data.draw(st.sampled_from(["piece", "drop", "dup", "swap"]))
            if op == "piece":
                at = data.draw(st.integers(0, len(lines[i])))
                cut = data.draw(st.integers(0, 4))
                lines[i] = lines[i][:at] + data.draw(st.sampled_from(PIECES)) + lines[i][at + cut:]
            elif op == "drop":
                del lines[i]
            elif op == "dup":
                lines.insert(i, lines[i])
            else:
                j = data.draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
            if not lines:
                lines = [""]
        new = "\n".join(lines).encode("utf-8", "surrogatepass")
    else:
        b = bytearray(blob)
        at = data.draw(st.integers(0, len(b) - 1))
        b[at:at + data.draw(st.integers(0, 4))] = data.draw(st.binary(max_size=4))
        new = bytes(b)
    members[k] = (member, new)
    m = _load(neff.pack(manifest, members))
    if m is not None:
        _assert_canonical(m)


# --- random valid programs round trip ----------------------------------------------------------------

F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
ALU = ["add", "sub", "rsub", "mul", "div", "rdiv", "max", "min", "abs_max", "eq", "ne", "lt", "le", "gt", "ge"]
FUNCS = ["identity", "exp", "tanh", "sigmoid", "relu", "gelu", "silu", "square", "abs", "rsqrt", "reciprocal"]


@st.composite
def programs(draw: st.DrawFn) -> str:
    """A random race-free program: every tile initialised, then a chain of instructions on random
    engines ordered by one semaphore, random slices (steps too), immediates (NaN, inf, -0.0,
    subnormals), activations, conversions, a PSUM accumulation group, then the output."""
    target = draw(st.sampled_from(["trn1", "trn2", "inf2"]))
    p = draw(st.sampled_from([1, 16, 128]))
    f = draw(st.sampled_from([4, 64, 512]))
    dt = draw(st.sampled_from(["f32", "bf16", "f16"]))
    lines = [".isa 1.0", f".target {target}", ".lnc 1" if target == "trn2" else "",
             f".flags {json.dumps(draw(st.lists(st.text('-=abc01', max_size=6), max_size=2)))}",
             f"input   x: {dt}[{p}, {f}]", f"output  y: f32[{p}, {f}]",
             f"sbuf    a: f32[{p}, {f}]", f"sbuf    b: {dt}[{p}, {f}]", f"sbuf    c: f32[{p}, {f}]",
             f"sbuf    i: s32[{p}, {f}]", f"sbuf    r: f32[{p}, 1]", f"psum    acc: f32[{min(p, f, 64)}, {f}]",
             "sem     s"]
    n = 0

    def emit(body: str) -> None:
        nonlocal n
        wait = f", wait=s>={n}" if n else ""
        lines.append(f"{body}{wait}, signal=s")
        n += 1

    emit("q0    dma  b, x")
    for tile in ("a", "c"):
        emit(f"{draw(st.sampled_from(['dve', 'act', 'pool']))}   memset  {tile}, value={draw(F32)!r}")
    emit("pool  iota  i, base=3, channel_multiplier=2")
    emit("dve   tensor_reduce  r, a, op=max")
    for _ in range(draw(st.integers(1, 10))):
        lo = draw(st.integers(0, f - 1))
        hi = draw(st.integers(lo + 1, f))
        step = draw(st.integers(1, 3))
        sl = draw(st.sampled_from(["", f"[:, {lo}:{hi}:{step}]", f"[:, {lo - f}:]"]))
        dst = draw(st.sampled_from(["a", "b", "c"])) + sl
        src = draw(st.sampled_from(["a", "b", "c", "i"])) + sl
        src2 = draw(st.sampled_from(["a", "b", "c"])) + sl
        kind = draw(st.sampled_from(["ts", "tt", "act", "copy", "select", "memset"]))
        if kind == "ts":
            op1 = draw(st.sampled_from(["", f", op1={draw(st.sampled_from(ALU))}, scalar1={draw(F32)!r}"]))
            scalar = draw(st.sampled_from([repr(draw(F32)), "r"]))
            emit(f"{draw(st.sampled_from(['dve', 'act', 'pool']))}   tensor_scalar  {dst}, {src}, "
                 f"op0={draw(st.sampled_from(ALU))}, scalar0={scalar}{op1}")
        elif kind == "tt":
            emit(f"{draw(st.sampled_from(['dve', 'pool']))}   tensor_tensor  {dst}, {src}, {src2}, "
                 f"op={draw(st.sampled_from(ALU))}")
        elif kind == "act":
            emit(f"act   activation  {dst}, {src2}, func={draw(st.sampled_from(FUNCS))}, "
                 f"scale={draw(F32)!r}, bias={draw(st.sampled_from([repr(draw(F32)), 'r']))}")
        elif kind == "copy":
            emit(f"{draw(st.sampled_from(['dve', 'act', 'pool']))}   tensor_copy  {dst}, {src}")
        elif kind == "select":
            emit(f"dve   select  {dst}, {src}, {src2}, {draw(st.sampled_from(['a', 'c']))}{sl}")
        else:
            emit(f"dve   memset  {dst}, value={draw(F32)!r}")
    m = min(p, f, 64)
    group = draw(st.integers(0, 3))
    for g in range(group):
        flags = (", start=true" if g == 0 else "") + (", stop=true" if g == group - 1 else "")
        emit(f"pe    matmul  acc, b[:, 0:{m}], b{flags}")
    if group:
        emit(f"act   tensor_copy  a[0:{m}, :], acc")
    emit("act   tensor_copy  c, a")
    emit("q1    dma  y, c")
    return "\n".join(line for line in lines if line) + "\n"


@SETTINGS
@given(text=programs())
def test_random_programs_round_trip_byte_for_byte(text: str) -> None:
    data = sim.assemble(text, "random.nxs")
    program, consts = sim.disassemble(data)
    assert sim.assemble(program, "again.nxs", consts) == data
    assert sim.assemble(text, "random.nxs") == data  # deterministic
    m = _load(data)
    assert m is not None and m.text == program


# --- the happens-before analysis is exact ----------------------------------------------------------------

@st.composite
def sync_programs(draw: st.DrawFn) -> str:
    """Only synchronisation: nops on a few streams waiting for and signalling a few semaphores."""
    streams = draw(st.lists(st.sampled_from(["pe", "act", "dve", "pool", "q0", "q1"]), min_size=2, max_size=4,
                            unique=True))
    sems = ["a", "b", "c"]
    lines = [".isa 1.0", ".target trn1", *(f"sem {x}" for x in sems)]
    for _ in range(draw(st.integers(2, 14))):
        parts = [f"wait={x}>={draw(st.integers(1, 3))}" for x in draw(st.lists(st.sampled_from(sems), max_size=2,
                                                                               unique=True))]
        parts += [f"signal={x}" for x in draw(st.lists(st.sampled_from(sems), max_size=2, unique=True))]
        lines.append(f"{draw(st.sampled_from(streams))} nop {', '.join(parts)}".rstrip())
    return "\n".join(lines) + "\n"


def _reached(prog: Any, stop: int) -> set[int]:
    """Instructions the zero-time replay runs when instruction ``stop`` (and its stream after it) never runs."""
    count: dict[str, int] = {}
    done: set[int] = set()
    blocked = {prog.instrs[stop].stream}
    heads = {s: [i for i, x in enumerate(prog.instrs) if x.stream == s] for s in {x.stream for x in prog.instrs}}
    progress = True
    while progress:
        progress = False
        for s, lst in heads.items():
            while lst and not (s in blocked and lst[0] == stop):
                ins = prog.instrs[lst[0]]
                if any(count.get(w.sem, 0) < w.value for w in ins.waits):
                    break
                for x in ins.signals:
                    count[x] = count.get(x, 0) + 1
                done.add(lst.pop(0))
                progress = True
    return done


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much])
@given(text=sync_programs())
def test_happens_before_is_exact(text: str) -> None:
    """lk.hb(j, i) for instructions on different streams is true exactly when no schedule starts i
    before j completes: checked against a replay with j held back, for every pair."""
    from hypothesis import assume

    from nxsat.sim.asm import parse
    from nxsat.sim.verify import link

    try:
        lk = link(parse(text, "s.nxs"), sim.load_target("trn1"))
    except NxsatError as exc:
        assert exc.code == "NCC_EASM009"
        assume(False)
        return
    prog = lk.program
    for j in range(len(prog.instrs)):
        reached = _reached(prog, j)
        for i in range(len(prog.instrs)):
            if prog.instrs[i].stream != prog.instrs[j].stream:
                assert lk.hb(j, i) == (i not in reached), (j, i)


# --- the race check against every pair of accesses ---------------------------------------------------------

@st.composite
def data_programs(draw: st.DrawFn) -> str:
    """Copies between column ranges of two tiles that share bytes (``b`` overlaps the back of ``a``),
    a scratch tensor, the input and the output, on random streams. Each signals one semaphore and
    mostly waits for every earlier one (a total order), sometimes for all but the last: a program with
    a single race (a write after a read included), or a read of what nothing wrote first, is common.
    (Waits dropped more often made most programs racy many times over, and a check that misses one
    kind of race went unnoticed.) The whole output is written last, after everything."""
    lines = [".isa 1.0", ".target trn1", "input   x: f32[8, 16]", "output  y: f32[8, 16]",
             "scratch h: f32[8, 16]", "sbuf    a: f32[8, 16]  offset=0", "sbuf    b: f32[8, 16]  offset=32",
             "sem     s"]
    places = {"dma": ["a", "b", "h", "y"], "eng": ["a", "b"]}
    first = 0
    for t in ("a", "b", "h"):  # usually written whole first, in order
        if draw(st.integers(0, 9)):
            lines.append(f"q0 dma {t}, x{f', wait=s>={first}' if first else ''}, signal=s")
            first += 1
    for n in range(first, first + draw(st.integers(2, 8))):
        stream = draw(st.sampled_from(["q0", "q1", "dve", "act"]))
        kind = "dma" if stream.startswith("q") else "eng"
        w = draw(st.integers(1, 16))
        d0, s0 = draw(st.integers(0, 16 - w)), draw(st.integers(0, 16 - w))
        dst = draw(st.sampled_from(places[kind]))
        src = draw(st.sampled_from([p for p in (*places[kind], "x") if p != "y" and (kind == "dma" or p != "x")]))
        wait = draw(st.sampled_from([n] * 4 + [n - 1])) if n else 0
        parts = [f"{dst}[:, {d0}:{d0 + w}]", f"{src}[:, {s0}:{s0 + w}]", *([f"wait=s>={wait}"] if wait > 0 else []),
                 "signal=s"]
        lines.append(f"{stream} {'dma' if kind == 'dma' else 'tensor_copy'} {', '.join(parts)}")
    lines.append(f"q1 dma y, x, wait=s>={n + 1}, signal=s")
    return "\n".join(lines) + "\n"


def _brute_dataflow_error(lk: Any) -> bool:
    """Whether some pair of accesses races (different streams, overlapping, one a write, neither
    ordered before the other) or some read has no overlapping write ordered before it: every pair."""
    acc = [(i, ra, w) for i, c in enumerate(lk.instrs) for w, ras in ((False, c.reads), (True, c.writes))
           for ra in ras if ra.tensor.kind not in ("input", "const")]
    stream = [c.stream for c in lk.instrs]

    def before(j: int, i: int) -> bool:
        return lk.pos[j] < lk.pos[i] if stream[j] == stream[i] else lk.hb(j, i)

    for i, ra, w in acc:
        for j, rb, wb in acc:
            if j != i and (w or wb) and ra.overlaps(rb) and not before(i, j) and not before(j, i):
                return True
        if not w and not any(wb and j != i and rb.overlaps(ra) and before(j, i) for j, rb, wb in acc):
            return True
    return False


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.filter_too_much])
@given(text=data_programs(), sweep_each=st.booleans())
def test_race_check_agrees_with_every_pair(text: str, sweep_each: bool) -> None:
    """The race check (verify._dataflow: latest accesses per stream, footprints in flight, reads meeting
    only writes, settled accesses swept) refuses a program exactly when some pair of its accesses
    races or some read has no write before it, sweeping rarely or after every instruction."""
    from hypothesis import assume, event

    from nxsat.sim import verify
    from nxsat.sim.asm import parse

    try:
        lk = verify.link(parse(text, "d.nxs"), sim.load_target("trn1"), races=False)
    except NxsatError as exc:
        assert exc.code == "NCC_EASM009"  # a deadlock: no order to check
        assume(False)
        return
    saved = verify._Footprints.MIN_VISITS, verify._Footprints.SWEEP_COST
    if sweep_each:
        verify._Footprints.MIN_VISITS, verify._Footprints.SWEEP_COST = 0, 10**12
    try:
        verify.check_races(lk)
        refused = False
    except NxsatError as exc:
        assert exc.code in ("NCC_EASM007", "NCC_EASM008"), exc
        refused = True
    finally:
        verify._Footprints.MIN_VISITS, verify._Footprints.SWEEP_COST = saved
    event("refused" if refused else "accepted")
    assert refused == _brute_dataflow_error(lk)

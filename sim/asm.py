"""The text form of a device program: parse (``assemble``'s front half) and print (``disassemble``).

The grammar is line based (docs/device-program.md): directives (``.isa 1.0``), declarations
(``sbuf xt: bf16[128, 512] offset=0``), semaphores (``sem ld``) and instructions
(``pe matmul acc, w[:, 0:128], x, start=true, wait=ld>=1, signal=mm``). Printing is canonical:
every value normalised, defaults left out, placement explicit, so that parsing a printed program
gives the same program and printing it again gives the same text.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import Loc, NxsatError, error
from nxsat.ir import DIM_LIMIT, SHAPE_LIMITS_HINT, shape_limit_problem
from nxsat.sim import numerics as nm
from nxsat.sim.isa import OPS, Attr, Op
from nxsat.sim.program import (
    ISA_VERSION,
    TENSOR_KINDS,
    Access,
    AccessError,
    Idx,
    Instr,
    Program,
    Tensor,
    Wait,
    stream_kind,
    view_shape,
)

MAX_LINE = 100_000
MAX_LINES = 4_000_000
MAX_NAME = 256
MAX_ORIGIN = 500  # characters of an instruction's origin text
MAX_INT_DIGITS = 18  # every size, offset and count fits; Python refuses int() of > 4300 digits
RESERVED = frozenset({"true", "false", "none", "inf", "nan", "sem", "T"} | set(TENSOR_KINDS))

_TOKEN = re.compile(r"""
    (?P<num>[+-]?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)  # number
            |[+-]?(?:inf|nan)\b)                                                      # inf, nan
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<ge>>=)
  | (?P<punct>[\[\](),:=.])
  | (?P<bad>\S)                                                                       # anything else
""", re.X)
_tok = tuple.__new__


class Tok(NamedTuple):
    """One token: its kind (num, name, ge, punct), text and 1-based column."""

    kind: str
    text: str
    col: int


class _Line:
    """Tokens of one line with a cursor; errors point at the current token's column."""

    def __init__(self, text: str, line: int, source: str) -> None:
        self.line = line
        self.source = source
        # the regex names each token's kind (one pass in C; the lines of compiled programs are long)
        self.toks: list[Tok] = [_tok(Tok, (m.lastgroup, m.group(), m.start() + 1)) for m in _TOKEN.finditer(text)]
        for t in self.toks:
            if t.kind == "bad":
                raise error("NCC_EASM001", f"unexpected character {t.text!r}", Loc(source, line, t.col))
        self.i = 0
        self.end_col = len(text) + 1

    def loc(self, at: int | None = None) -> Loc:
        """Where token ``at`` (default: the current one) is; cheap callers keep ``ln.i`` instead."""
        i = self.i if at is None else at
        col = self.toks[i].col if i < len(self.toks) else self.end_col
        return Loc(self.source, self.line, col)

    def fail(self, message: str, code: str = "NCC_EASM001", hint: str | None = None) -> Exception:
        return error(code, message, self.loc(), hint)

    def peek(self, text: str | None = None) -> Tok | None:
        if self.i >= len(self.toks):
            return None
        t = self.toks[self.i]
        if text is not None and t.text != text:
            return None
        return t

    def next(self) -> Tok:
        if self.i >= len(self.toks):
            raise self.fail("unexpected end of line")
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str) -> Tok:
        t = self.peek()
        if t is None or t.text != text:
            raise self.fail(f"expected {text!r}" + (f", found {t.text[:40]!r}" if t else " at end of line"))
        self.i += 1
        return t

    def name(self, what: str = "a name") -> str:
        t = self.peek()
        if t is None or t.kind != "name":
            raise self.fail(f"expected {what}" + (f", found {t.text[:40]!r}" if t else ""))
        if len(t.text) > MAX_NAME:
            raise self.fail(f"name {t.text[:20]}... is longer than {MAX_NAME} characters")
        self.i += 1
        return t.text

    def int(self, what: str = "an integer") -> int:
        t = self.peek()
        if t is None or t.kind != "num" or not re.fullmatch(r"[+-]?\d+", t.text):
            raise self.fail(f"expected {what}" + (f", found {t.text[:40]!r}" if t else ""))
        if len(t.text.lstrip("+-")) > MAX_INT_DIGITS:
            raise self.fail(f"integer {t.text[:20]}... is too large (at most {MAX_INT_DIGITS} digits)")
        self.i += 1
        return int(t.text)

    def done(self) -> bool:
        return self.i >= len(self.toks)

    def end(self) -> None:
        if not self.done():
            raise self.fail(f"unexpected {self.toks[self.i].text[:40]!r}")


# --- parsing ---------------------------------------------------------------------------------------

@dataclass
class _RawIdx:
    start: int | None
    stop: int | None
    step: int | None
    single: bool
    col: int


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _tail_start(body: str) -> int:
    """Where an instruction line's waits and signals begin (the comma or blank before the first
    ``wait=``/``signal=`` key), or -1."""
    a = body.find("wait=")
    b = body.find("signal=")
    at = a if b < 0 or 0 <= a < b else b
    if at <= 0 or body[at - 1] not in ", \t":
        return -1
    k = at - 1
    while k > 0 and body[k - 1] in " \t":
        k -= 1
    if k > 0 and body[k - 1] == ",":
        k -= 1
    return k


def parse(text: str, source: str = "<program>") -> Program:
    """Parse a device program's text. Names are resolved here; shapes and semantics in verify.

    Programs repeat their loop bodies: the part of an instruction line before its waits and signals
    is parsed once and shared; the waits and signals are read by one regular expression. A new
    instruction is read by its comma-separated parts, each parsed once per program (compiled
    programs reuse an access far more often than a whole line). Anything unusual takes the general
    path, which also gives every error its column."""
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        raise error("NCC_EVRF007", f"{source}: {len(lines)} lines; at most {MAX_LINES} are accepted")
    prog = Program(source=source)
    seen_isa = False
    origin: str | None = None
    heads: dict[str, _Head] = {}
    parts: dict[tuple[str, str], tuple[str | None, Any]] = {}
    sems = prog.semaphores
    append = prog.instrs.append
    for n, raw in enumerate(lines, 1):
        if len(raw) > MAX_LINE:
            raise error("NCC_EASM001", f"line longer than {MAX_LINE} characters", Loc(source, n))
        body = raw.split("#", 1)[0] if "#" in raw else raw
        # Fast path: an instruction line seen before, up to its waits and signals.
        # A new one is read part by part (operands and attributes are shared far more than lines are).
        cut = _tail_start(body) if seen_isa else -1
        if cut > 0:
            key = body[:cut]
            head = heads.get(key) or _head(key, prog, heads, parts)
            if head is not None:
                tail = _fast_tail(body, cut, sems, head[2] != () or head[3] != {})
                if tail is not None:
                    append(Instr(head[0], head[1], head[2], head[3], tail[0], tail[1], n, origin))
                    continue
        elif seen_isa:
            head = heads.get(body) or _head(body, prog, heads, parts)
            if head is not None:
                append(Instr(head[0], head[1], head[2], head[3], (), (), n, origin))
                continue
        stripped = body.strip()
        if not stripped:
            continue
        if stripped.startswith(".flags"):
            prog.flags = _parse_flags(raw, n, source)
            continue
        if stripped.startswith(".origin") and (len(stripped) == 7 or stripped[7].isspace()):
            if not seen_isa:
                raise error("NCC_EASM001", "a device program starts with '.isa MAJOR.MINOR'", Loc(source, n))
            rest = raw.strip()[7:].strip()  # the origin text may contain '#'
            if len(rest) > MAX_ORIGIN:
                raise error("NCC_EASM001", f".origin text longer than {MAX_ORIGIN} characters", Loc(source, n))
            origin = None if rest in ("", "-") else rest
            continue
        ln = _Line(body, n, source)
        if ln.peek(".") is not None:
            ln.next()
            seen_isa = _directive(ln, prog, seen_isa)
            continue
        if not seen_isa:
            raise ln.fail("a device program starts with '.isa MAJOR.MINOR'",
                          hint=f"write .isa {ISA_VERSION[0]}.{ISA_VERSION[1]}")
        first = ln.name("a stream, a tensor kind or 'sem'")
        if first in TENSOR_KINDS:
            _declaration(ln, first, prog)
        elif first == "sem":
            _semaphore(ln, prog)
        else:
            ins = _instruction(ln, first, prog)
            ins.origin = origin
            append(ins)
            cut = _tail_start(body)
            if cut < 0:
                heads[body] = (ins.stream, ins.opcode, ins.operands, ins.attrs)
            elif _fast_tail(body, cut, sems, bool(ins.operands) or bool(ins.attrs)) == (ins.waits, ins.signals):
                heads[body[:cut]] = (ins.stream, ins.opcode, ins.operands, ins.attrs)
    if not seen_isa:
        raise error("NCC_EASM001", "empty device program (no '.isa' line)", Loc(source, 1))
    return prog


_Head = tuple[str, str, tuple[Access, ...], dict[str, Any]]
_INSTR_HEAD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s+([A-Za-z_][A-Za-z0-9_]*)(?:\s+(\S.*?))?\s*")
_ATOM = r"(?:[^,\[\]()]+|\[[^\[\]()]*\]|\([^\[\]()]*\))+"  # brackets do not nest in an operand
_ARGS = re.compile(rf"{_ATOM}(?:,{_ATOM})*")
_ARG = re.compile(_ATOM)
_ATTR = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=(?![=>])\s*(.*)", re.S)


def _head(text: str, prog: Program, heads: dict[str, _Head], parts: dict[tuple[str, str], tuple[str | None, Any]]
          ) -> _Head | None:
    """An instruction's stream, opcode, operands and attributes from its comma-separated parts, each
    looked up in ``parts`` (keyed by the opcode and the part's text) or parsed alone and added there;
    None for anything the general path must read (and explain, with its column, if it is wrong)."""
    m = _INSTR_HEAD.fullmatch(text)
    if m is None:
        return None
    stream, opcode, args = m.groups()
    op = OPS.get(opcode)
    if op is None or not stream_kind(stream) or args is not None and _ARGS.fullmatch(args) is None:
        return None
    operands: list[Access] = []
    given: dict[str, Any] = {}
    for raw in _ARG.findall(args) if args is not None else ():
        part = raw.strip()
        entry = parts.get((opcode, part))
        if entry is None:
            entry = _part(part, op, prog)
            if entry is None:
                return None
            parts[(opcode, part)] = entry
        key, value = entry
        if key is None:
            if given:
                return None
            operands.append(value)
        elif key in given:
            return None
        else:
            given[key] = value
    if len(operands) != len(op.operands):
        return None
    attrs: dict[str, Any] = {}
    for a in op.attrs:
        if a.name in given:
            attrs[a.name] = given[a.name]
        elif a.default is None and a.kind not in ("in", "out"):
            return None
        else:
            attrs[a.name] = a.default
    head = heads[text] = (stream, opcode, tuple(operands), attrs)
    return head


def _part(part: str, op: Op, prog: Program) -> tuple[str | None, Any] | None:
    """One operand (key None) or attribute (its name) of an instruction of ``op``, or None."""
    m = _ATTR.fullmatch(part)
    try:
        if m is None:
            ln = _Line(part, 0, prog.source)
            value = _access(ln, prog)
            ln.end()
            return None, value
        spec = next((a for a in op.attrs if a.name == m.group(1)), None)
        if spec is None:
            return None
        ln = _Line(m.group(2), 0, prog.source)
        value = _attr_value(ln, spec, prog)
        ln.end()
        return spec.name, value
    except NxsatError:
        return None


def _fast_tail(body: str, at: int, sems: dict[str, int], need_comma: bool
               ) -> tuple[tuple[Wait, ...], tuple[str, ...]] | None:
    """The waits and signals ending an instruction line, or None when they need the general parser
    (something else follows, a name is unknown, a count is not a positive integer, a semaphore is
    signalled twice)."""
    tail = body[at:].strip()
    if tail.startswith(","):
        tail = tail[1:]
    elif need_comma:
        return None
    waits: list[Wait] = []
    signals: list[str] = []
    fullmatch = _NAME.fullmatch
    for part in tail.split(","):
        part = part.strip()
        if part.startswith("wait="):
            name, sep, count = part[5:].partition(">=")
            name, count = name.strip(), count.strip()
            if not sep or name not in sems or not count.isdigit() or len(count) > 18 or count[0] == "0":
                return None
            waits.append(Wait(name, int(count)))
        elif part.startswith("signal="):
            name = part[7:].strip()
            if name not in sems or name in signals or not fullmatch(name):
                return None
            signals.append(name)
        else:
            return None
    return tuple(waits), tuple(signals)


def _parse_flags(raw: str, n: int, source: str) -> tuple[str, ...]:
    rest = raw.strip()[len(".flags"):].strip()
    try:
        value, end = json.JSONDecoder().raw_decode(rest)
    except json.JSONDecodeError as exc:
        raise error("NCC_EASM001", f".flags takes a JSON list of strings: {exc.msg}", Loc(source, n)) from None
    tail = rest[end:].strip()
    if tail and not tail.startswith("#"):
        raise error("NCC_EASM001", f"unexpected text after .flags: {tail!r}", Loc(source, n))
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise error("NCC_EASM001", ".flags takes a JSON list of strings", Loc(source, n))
    return tuple(value)


def _directive(ln: _Line, prog: Program, seen_isa: bool) -> bool:
    name = ln.name("a directive")
    if name == "isa":
        if seen_isa:
            raise ln.fail("duplicate .isa")
        t = ln.next()
        m = re.fullmatch(r"(\d{1,9})\.(\d{1,9})", t.text)
        if not m:
            raise error("NCC_EASM001", f"expected MAJOR.MINOR after .isa, found {t.text[:40]!r}",
                        Loc(ln.source, ln.line, t.col))
        major, minor = int(m.group(1)), int(m.group(2))
        if major != ISA_VERSION[0]:
            raise error("NCC_EASM002", f"device program ISA {major}.{minor} is not supported by this nxsat "
                        f"(ISA {ISA_VERSION[0]}.x)", Loc(ln.source, ln.line), "recompile with this nxsat")
        prog.version = (major, minor)
        ln.end()
        return True
    if not seen_isa:
        raise ln.fail("a device program starts with '.isa MAJOR.MINOR'")
    if name == "target":
        prog.target = ln.name("a target name")
    elif name == "lnc":
        prog.lnc = ln.int("a logical core count")
    elif name == "ranks":
        r = ln.int("a rank count")
        if not 1 <= r <= 1024:
            raise ln.fail("ranks must be between 1 and 1024", "NCC_EASM004")
        prog.ranks = r
    else:
        raise error("NCC_EASM002", f"unknown directive .{name}", Loc(ln.source, ln.line),
                    "directives: .isa .target .lnc .ranks .flags")
    ln.end()
    return seen_isa


def _dtype(ln: _Line) -> dt.DType:
    name = ln.name("an element type")
    try:
        t = dt.by_name(name)
    except KeyError:
        raise error("NCC_EASM004", f"unknown element type {name!r}", Loc(ln.source, ln.line),
                    "types: " + ", ".join(nm.ALLOWED_DTYPES)) from None
    return t


def _declaration(ln: _Line, kind: str, prog: Program) -> None:
    col = ln.loc()
    name = ln.name("a tensor name")
    if name in RESERVED:
        raise error("NCC_EASM003", f"{name!r} is a reserved word", col)
    if name in prog.tensors or name in prog.semaphores:
        raise error("NCC_EASM003", f"{name} is already declared (line "
                    f"{(prog.tensors.get(name) and prog.tensors[name].line) or prog.semaphores.get(name)})", col)
    ln.expect(":")
    dtype = _dtype(ln)
    shape_at = ln.loc()
    ln.expect("[")
    shape: list[int] = []
    if not ln.peek("]"):
        shape.append(_dim(ln))
        while ln.peek(","):
            ln.next()
            shape.append(_dim(ln))
    ln.expect("]")
    problem = shape_limit_problem(shape)
    if problem:
        raise error("NCC_ESHP001", f"{name}: {problem}", shape_at, SHAPE_LIMITS_HINT)
    opts: dict[str, int] = {}
    alias: str | None = None
    allowed = {"sbuf": {"partition", "offset"}, "psum": {"partition", "offset", "bank"},
               "input": {"shard"}, "output": {"shard", "alias"}}.get(kind, set())
    while not ln.done():
        at = ln.loc()
        key = ln.name("an option")
        if key not in allowed:
            raise error("NCC_EASM004", f"{kind} tensors take no option {key!r}", at,
                        ("options: " + ", ".join(sorted(allowed))) if allowed else None)
        ln.expect("=")
        if key in opts or (key == "alias" and alias is not None):
            raise ln.fail(f"duplicate option {key}")
        if key == "alias":
            alias = ln.name("an input's name for alias")
        else:
            opts[key] = ln.int(f"an integer for {key}")
    prog.tensors[name] = Tensor(name, kind, dtype, tuple(shape), partition=opts.get("partition", 0),
                                offset=opts.get("offset"), bank=opts.get("bank"), shard=opts.get("shard"),
                                alias=alias, line=ln.line)


def _dim(ln: _Line) -> int:
    """One dimension of a declaration; one of 2^40 or more is refused where it is written."""
    t = ln.peek()
    if t is not None and t.text.isdigit() and (len(t.text) > MAX_INT_DIGITS or int(t.text) >= DIM_LIMIT):
        shown = t.text if len(t.text) <= 40 else t.text[:20] + "..."
        raise error("NCC_ESHP001", f"dimension {shown} is not below 2^40", ln.loc(), SHAPE_LIMITS_HINT)
    return ln.int("a dimension size")


def _semaphore(ln: _Line, prog: Program) -> None:
    col = ln.loc()
    name = ln.name("a semaphore name")
    if name in RESERVED:
        raise error("NCC_EASM003", f"{name!r} is a reserved word", col)
    if name in prog.tensors or name in prog.semaphores:
        raise error("NCC_EASM003", f"{name} is already declared", col)
    prog.semaphores[name] = ln.line
    ln.end()


def _instruction(ln: _Line, stream: str, prog: Program) -> Instr:
    if not stream_kind(stream):
        raise error("NCC_EASM002", f"unknown stream {stream!r}", Loc(ln.source, ln.line, 1),
                    "streams: pe act dve pool cc q0..q15; declarations: input output const scratch sbuf psum sem")
    op_at = ln.i
    opcode = ln.name("an instruction")
    op = OPS.get(opcode)
    if op is None:
        raise error("NCC_EASM002", f"unknown instruction {opcode!r}", ln.loc(op_at),
                    "instructions: " + ", ".join(sorted(OPS)))
    operands: list[Access] = []
    attrs: dict[str, Any] = {}
    waits: list[Wait] = []
    signals: list[str] = []
    first = True
    while not ln.done():
        if not first:
            ln.expect(",")
        first = False
        if ln.i + 1 < len(ln.toks) and ln.toks[ln.i].kind == "name" and ln.toks[ln.i + 1].text == "=":
            key_at = ln.i
            key = ln.name()
            ln.expect("=")
            if key == "wait":
                sem = _sem_ref(ln, prog)
                ln.expect(">=")
                v = ln.int("a semaphore count")
                if v < 1:
                    raise error("NCC_EASM004", "a wait needs a count of at least 1", ln.loc(key_at))
                waits.append(Wait(sem, v))
            elif key == "signal":
                sem = _sem_ref(ln, prog)
                if sem in signals:
                    raise error("NCC_EASM004", f"{sem} is signalled twice by one instruction", ln.loc(key_at))
                signals.append(sem)
            else:
                spec = next((a for a in op.attrs if a.name == key), None)
                if spec is None:
                    raise error("NCC_EASM004", f"{opcode} has no attribute {key!r}", ln.loc(key_at),
                                ("attributes: " + ", ".join(a.name for a in op.attrs)) if op.attrs else None)
                if key in attrs:
                    raise error("NCC_EASM004", f"duplicate attribute {key}", ln.loc(key_at))
                attrs[key] = _attr_value(ln, spec, prog)
        else:
            if attrs or waits or signals:
                raise ln.fail("operands come before attributes")
            operands.append(_access(ln, prog))
    if len(operands) != len(op.operands):
        raise error("NCC_EASM004", f"{opcode} takes {len(op.operands)} operand(s) "
                    f"({', '.join(o.name for o in op.operands) or 'none'}), got {len(operands)}", ln.loc(op_at))
    for a in op.attrs:
        if a.name not in attrs:
            if a.default is None and a.kind not in ("in", "out"):
                raise error("NCC_EASM004", f"{opcode} needs attribute {a.name}", ln.loc(op_at),
                            ("choices: " + ", ".join(a.choices)) if a.choices else None)
            attrs[a.name] = a.default
    ordered = {a.name: attrs[a.name] for a in op.attrs}
    return Instr(stream, opcode, tuple(operands), ordered, tuple(waits), tuple(signals), ln.line)


def _sem_ref(ln: _Line, prog: Program) -> str:
    loc = ln.loc()
    name = ln.name("a semaphore")
    if name not in prog.semaphores:
        raise error("NCC_EASM003", f"undefined semaphore {name}", loc, "declare it with 'sem NAME'")
    return name


def _float(ln: _Line) -> float:
    t = ln.next()
    if t.kind != "num":
        raise error("NCC_EASM004", f"expected a number, found {t.text[:40]!r}", Loc(ln.source, ln.line, t.col))
    return float(np.float32(float(t.text)))  # immediates are fp32 on the device


def _number(ln: _Line) -> int | float:
    """An immediate: an integer literal stays an exact integer (integer tiles use it unrounded),
    anything else is an fp32 value."""
    t = ln.peek()
    if t is not None and t.kind == "num" and re.fullmatch(r"[+-]?\d+", t.text):
        return ln.int("an integer")
    return _float(ln)


def _attr_value(ln: _Line, a: Attr, prog: Program) -> Any:
    if a.kind == "bool":
        v = ln.name("true or false")
        if v not in ("true", "false"):
            raise ln.fail(f"{a.name} takes true or false", "NCC_EASM004")
        return v == "true"
    if a.kind == "int":
        return ln.int(f"an integer for {a.name}")
    if a.kind == "float":
        return _float(ln)
    if a.kind == "number":
        return _number(ln)
    if a.kind == "enum":
        loc = ln.loc()
        v = ln.name(f"one of {', '.join(a.choices)}")
        if v not in a.choices:
            raise error("NCC_EASM004", f"{a.name}={v} is not one of {', '.join(a.choices)}", loc)
        return v
    if a.kind == "ints":
        if ln.peek("("):
            ln.next()
            vals: list[int] = []
            if not ln.peek(")"):
                vals.append(ln.int())
                while ln.peek(","):
                    ln.next()
                    vals.append(ln.int())
            ln.expect(")")
            return tuple(vals)
        return (ln.int(),)
    if a.kind == "scalar":
        t = ln.peek()
        if t is not None and t.kind == "num":
            return _number(ln)
        return _access(ln, prog)
    if a.kind in ("in", "out"):
        if ln.peek("none"):
            ln.next()
            return None
        return _access(ln, prog)
    raise AssertionError(a.kind)


def _access(ln: _Line, prog: Program) -> Access:
    """``name[index].view(...)[index]...``: a tensor, optionally indexed, then views and further indexes,
    each read against the shape of the view so far."""
    at = ln.i
    name = ln.name("a tensor")
    t = prog.tensors.get(name)
    if t is None:
        raise error("NCC_EASM003", f"undefined tensor {name}", ln.loc(at),
                    "declare tensors before the instructions that use them")
    index: tuple[Idx, ...] = ()
    if ln.peek("["):
        index = _normalize(_raw_index(ln), t.shape, t.name, ln)
    views: list[tuple[str, tuple]] = []
    rank = sum(1 for ix in index if not ix.single) if index else len(t.shape)
    while ln.peek(".") or ln.peek("["):
        if ln.peek("["):
            idx_at = ln.i
            raw = _raw_index(ln)
            try:
                shape = view_shape(t, Access(name, index, tuple(views)))
            except AccessError as exc:
                raise error("NCC_EASM004", str(exc), ln.loc(idx_at)) from None
            idx = _normalize(raw, shape, t.name, ln)
            if idx:  # a whole view indexed with ':' only is no index
                views.append(("index", idx))
                rank = sum(1 for ix in idx if not ix.single)
            continue
        ln.next()
        v_at = ln.i
        v = ln.name("T, permute or reshape")
        if v == "T":
            views.append(("permute", tuple(range(rank - 1, -1, -1))))
        elif v in ("permute", "reshape", "broadcast"):
            ln.expect("(")
            vals = [ln.int()]
            while ln.peek(","):
                ln.next()
                vals.append(ln.int())
            ln.expect(")")
            views.append((v, tuple(vals)))
            if v == "reshape":
                rank = len(vals)
        else:
            raise error("NCC_EASM001", f"unknown view .{v}", ln.loc(v_at),
                        "views: .T .permute(...) .reshape(...) .broadcast(dim, size), and [index]")
    return Access(name, index, tuple(views))


def _raw_index(ln: _Line) -> list[_RawIdx]:
    ln.expect("[")
    raw = [_raw_idx(ln)]
    while ln.peek(","):
        ln.next()
        raw.append(_raw_idx(ln))
    ln.expect("]")
    return raw


def _raw_idx(ln: _Line) -> _RawIdx:
    col = ln.toks[ln.i].col if ln.i < len(ln.toks) else ln.end_col
    start = stop = step = None
    if not ln.peek(":"):
        start = ln.int("an index")
        if not ln.peek(":"):
            return _RawIdx(start, None, None, True, col)
    ln.expect(":")
    if not (ln.peek(":") or ln.peek(",") or ln.peek("]")):
        stop = ln.int("a slice end")
    if ln.peek(":"):
        ln.next()
        if not (ln.peek(",") or ln.peek("]")):
            step = ln.int("a slice step")
    return _RawIdx(start, stop, step, False, col)


def _normalize(raw: list[_RawIdx], shape: tuple[int, ...], name: str, ln: _Line) -> tuple[Idx, ...]:
    if len(raw) != len(shape):
        raise error("NCC_EASM004", f"{name} has {len(shape)} dimension(s) here, the index has {len(raw)}",
                    Loc(ln.source, ln.line, raw[0].col))
    out: list[Idx] = []
    for d, (r, n) in enumerate(zip(raw, shape)):
        loc = Loc(ln.source, ln.line, r.col)
        if r.single:
            i = r.start + n if r.start is not None and r.start < 0 else r.start
            if i is None or not 0 <= i < n:
                raise error("NCC_EASM004", f"index {r.start} out of range for dimension {d} of {name} "
                            f"(size {n})", loc)
            out.append(Idx(i, i + 1, 1, True))
            continue
        step = 1 if r.step is None else r.step
        if step <= 0:
            raise error("NCC_EASM004", f"slice step must be positive (dimension {d} of {name})", loc)
        start = 0 if r.start is None else (r.start + n if r.start < 0 else r.start)
        stop = n if r.stop is None else (r.stop + n if r.stop < 0 else r.stop)
        if not (0 <= start < stop <= n):
            raise error("NCC_EASM004", f"slice {r.start if r.start is not None else ''}:"
                        f"{r.stop if r.stop is not None else ''} is empty or out of range for dimension {d} "
                        f"of {name} (size {n})", loc)
        count = len(range(start, stop, step))
        out.append(Idx(start, start + (count - 1) * step + 1, step, False))
    if all(not ix.single and ix.start == 0 and ix.stop == n and ix.step == 1 for ix, n in zip(out, shape)):
        return ()
    return tuple(out)


# --- printing --------------------------------------------------------------------------------------

def fmt_float(v: float) -> str:
    """The shortest text that reads back as the same fp32 value."""
    return str(np.float32(v))


def fmt_access(a: Access, shape: tuple[int, ...], tensor: Tensor | None = None) -> str:
    """Canonical text of an access: whole tensors unindexed, slices in their shortest exact form (a later
    index is read against the view before it, which ``tensor`` gives)."""
    s = a.tensor + _fmt_index(a.index, shape)
    for k, (op, arg) in enumerate(a.views):
        if op == "index":
            assert tensor is not None, "a later index needs the tensor to print"
            s += _fmt_index(arg, view_shape(tensor, Access(a.tensor, a.index, a.views[:k])))
        elif op == "permute" and len(arg) >= 2 and tuple(arg) == tuple(range(len(arg) - 1, -1, -1)):
            s += ".T"
        else:
            s += f".{op}({', '.join(map(str, arg))})"
    return s


def _fmt_index(index: tuple[Idx, ...], shape: tuple[int, ...]) -> str:
    full = all(not ix.single and ix.start == 0 and ix.stop >= n and ix.step == 1 for ix, n in zip(index, shape))
    if not index or full:
        return ""
    parts = []
    for ix, n in zip(index, shape):
        count = len(range(ix.start, ix.stop, ix.step))
        stop = ix.start + (count - 1) * ix.step + 1
        if ix.single:
            parts.append(str(ix.start))
        elif ix.start == 0 and stop == n and ix.step == 1:
            parts.append(":")
        elif ix.step == 1:
            parts.append(f"{ix.start}:{stop}")
        else:
            parts.append(f"{ix.start}:{stop}:{ix.step}")
    return "[" + ", ".join(parts) + "]"


def _access_text(a: Access, prog: Program, texts: dict[Access, str] | None) -> str:
    s = texts.get(a) if texts is not None else None
    if s is None:
        t = prog.tensors[a.tensor]
        s = fmt_access(a, t.shape, t)
        if texts is not None:
            texts[a] = s
    return s


def _fmt_attr(a: Attr, v: Any, prog: Program, texts: dict[Access, str] | None = None) -> str:
    if a.kind == "bool":
        return "true" if v else "false"
    if a.kind == "float" or (isinstance(v, float) and a.kind in ("number", "scalar")):
        return fmt_float(v)
    if a.kind == "ints":
        return "(" + ", ".join(map(str, v)) + ")"
    if isinstance(v, Access):
        return _access_text(v, prog, texts)
    if isinstance(v, float):
        return fmt_float(v)
    return str(v)


def format_program(prog: Program, bank_bytes: int = 2048) -> str:
    """The canonical text of a program (placement must be resolved: every on-chip offset an int)."""
    out = [f".isa {prog.version[0]}.{prog.version[1]}"]
    if prog.target is not None:
        out.append(f".target {prog.target}")
    if prog.lnc is not None:
        out.append(f".lnc {prog.lnc}")
    out.append(f".ranks {prog.ranks}")
    out.append(".flags " + json.dumps(list(prog.flags)))
    out.append("")
    for t in prog.tensors.values():
        line = f"{t.kind:<8}{t.name}: {t.dtype.name}[{', '.join(map(str, t.shape))}]"
        opts = []
        if t.onchip:
            if t.partition:
                opts.append(f"partition={t.partition}")
            off = t.offset
            if not isinstance(off, int):
                raise ValueError(f"tensor {t.name} is not placed")
            if t.kind == "psum" and off % bank_bytes == 0:
                opts.append(f"bank={off // bank_bytes}")
            else:
                opts.append(f"offset={off}")
        if t.shard is not None:
            opts.append(f"shard={t.shard}")
        if t.alias is not None:
            opts.append(f"alias={t.alias}")
        out.append(line + ("  " + " ".join(opts) if opts else ""))
    for s in prog.semaphores:
        out.append(f"sem     {s}")
    out.append("")
    # A program repeats its loop bodies: the text of each distinct (stream, opcode, operands,
    # attributes) is made once, and waits and signals appended; so is each distinct access's.
    memo: dict[tuple, str] = {}
    texts: dict[Access, str] = {}
    akeys: dict[int, tuple] = {}
    origin: str | None = None
    append = out.append
    for ins in prog.instrs:
        if ins.origin != origin:
            origin = ins.origin
            append(f".origin {_origin_text(origin)}")
        attrs = ins.attrs
        try:
            akey = akeys.get(id(attrs))
            if akey is None:
                akey = akeys[id(attrs)] = tuple((k, v.__class__, v) for k, v in attrs.items())
            key: tuple | None = (ins.stream, ins.opcode, ins.operands, akey)
            head = memo.get(key)
        except TypeError:
            key, head = None, None
        if head is None:
            args = _instr_args(ins, prog, texts)
            head = f"{ins.stream:<5} {ins.opcode:<14} {args}"
            if key is not None:
                memo[key] = head
        if ins.waits or ins.signals:
            tail = ", ".join([f"wait={w.sem}>={w.value}" for w in ins.waits] + [f"signal={x}" for x in ins.signals])
            append(f"{head}, {tail}" if head[-1] != " " else head + tail)
        else:
            append(head.rstrip())
    return "\n".join(out) + "\n"


def _origin_text(origin: str | None) -> str:
    """An origin as one line of text (``-`` for none)."""
    if origin is None:
        return "-"
    text = " ".join(origin.split())[:MAX_ORIGIN]
    return text or "-"


def _same_value(v: Any, default: Any) -> bool:
    """Is an attribute at its default? Floats compare by sign too: -0.0 is not the default 0.0."""
    if isinstance(v, float) and isinstance(default, float):
        return v == default and math.copysign(1.0, v) == math.copysign(1.0, default)
    return bool(v == default) and type(v) is type(default)


def _instr_args(ins: Instr, prog: Program, texts: dict[Access, str] | None = None) -> str:
    """Operands and attributes of one instruction in canonical text (``texts``: the accesses' texts so far)."""
    op = OPS[ins.opcode]
    args = [_access_text(a, prog, texts) for a in ins.operands]
    for a in op.attrs:
        v = ins.attrs.get(a.name, a.default)
        if isinstance(v, float) and a.kind in ("float", "scalar", "number") or a.kind == "float":
            v = float(np.float32(v))  # float immediates are fp32: compare and print as the device holds them
        if v is None or (a.default is not None and not isinstance(v, Access) and _same_value(v, a.default)):
            continue
        args.append(f"{a.name}={_fmt_attr(a, v, prog, texts)}")
    return ", ".join(args)


def _line(ins: Instr, args: str) -> str:
    parts = [args] if args else []
    parts += [f"wait={w.sem}>={w.value}" for w in ins.waits]
    parts += [f"signal={x}" for x in ins.signals]
    return f"{ins.stream:<5} {ins.opcode:<14} {', '.join(parts)}".rstrip()


def format_instr(ins: Instr, prog: Program) -> str:
    """The canonical text of one instruction (also the trace's label for it)."""
    return _line(ins, _instr_args(ins, prog))

"""XLA HLO text -> nxsat IR.

Three steps, each with its own errors: the lark grammar (hlo.lark) parses the text (NCC_EPRS001);
:func:`decode_shape` and the attribute decoders turn tokens into types and attribute values
(NCC_EPRS003, NCC_EMOD025 for dynamic shapes, NCC_EVRF004/005 and NCC_ESPP004 for types nxsat
cannot run); :class:`_ModuleBuilder` resolves names, builds computations and checks every
instruction's declared shape against the registry's shape rule (NCC_EVRF064).
"""

from __future__ import annotations

import functools
import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lark
import ml_dtypes
import numpy as np

from nxsat import dtypes as dt
from nxsat.attrs import ConvDims, DotDims, GatherDims, Metadata, PadDim, ScatterDims, SliceDim, WindowDim
from nxsat.builder import infer_type
from nxsat.diagnostics import Loc, NxsatError, Warnings, error
from nxsat.ir import SHAPE_LIMITS_HINT, Computation, Module, Node, TensorType, TupleType, Type, shape_limit_problem
from nxsat.ops import registry
from nxsat.ops.fused import FUSED

# --- raw syntax ------------------------------------------------------------------------------


@dataclass(slots=True)
class RawAttr:
    name: str
    value: str
    kind: str  # BRACED | STRING | BARE | IOTA_GROUPS | SHAPE
    loc: Loc


# A constant's value as written: one token, or a tuple of them for a tuple-typed constant.
Literal = str | tuple["Literal", ...]


@dataclass(slots=True)
class RawOperand:
    name: str | None  # None for a literal
    shape: Type | None
    literal: str | Literal | None
    loc: Loc


@dataclass(slots=True)
class RawInstruction:
    name: str
    type: Type
    opcode: str
    operands: list[RawOperand]
    attrs: list[RawAttr]
    is_root: bool
    loc: Loc


@dataclass(slots=True)
class RawComputation:
    name: str
    is_entry: bool
    signature: tuple[list[tuple[str, Type]], Type] | None
    instructions: list[RawInstruction]
    loc: Loc


@dataclass(slots=True)
class RawModule:
    name: str = "module"
    attrs: list[RawAttr] = field(default_factory=list)
    computations: list[RawComputation] = field(default_factory=list)
    frames: dict[str, dict[int, str]] = field(default_factory=dict)
    loc: Loc | None = None


def _strip(name: str) -> str:
    return name[1:] if name.startswith("%") else name


# --- shapes ----------------------------------------------------------------------------------

_SHAPE_RE = re.compile(r"([a-z0-9]+)\[([^\]]*)\]")


@functools.lru_cache(maxsize=4096)
def _decode_shape_text(text: str) -> TensorType | tuple[str, str]:
    """Decode ``f32[4,16]{1,0}``; returns (code, message) for the caller to raise with a location."""
    m = _SHAPE_RE.match(text)
    if not m:
        return ("NCC_EPRS003", f"malformed shape {text!r}")
    name, dims = m.group(1), m.group(2).strip()
    if name in dt.COMPLEX_TYPES:
        return ("NCC_EVRF004", f"complex type {name} is not supported")
    if name in dt.OTHER_FP8:
        return ("NCC_EVRF005", f"FP8 variant {name} is not supported (use f8e4m3fn or f8e5m2)")
    if name == "token":
        return ("NCC_EUOC002", "token values (side-effect ordering) are not supported")
    try:
        dtype = dt.by_name(name)
    except KeyError:
        return ("NCC_ESPP004", f"data type {name} is not supported")
    if not dtype.storage:
        return ("NCC_ESPP004", f"{name} is a compute precision, not a storage type")
    shape: list[int] = []
    if dims:
        for d in dims.split(","):
            d = d.strip()
            if d == "?" or d.startswith("<="):
                return ("NCC_EMOD025", f"dynamic dimension {d!r} in {text}: every dimension must be static")
            if not (d.isascii() and d.isdigit()):
                return ("NCC_EPRS003", f"malformed dimension {d!r} in shape {text}")
            if len(d) > 40:  # past any limit; and int() refuses more than 4300 digits
                return ("NCC_ESHP001", f"dimension {d[:20]}... ({len(d)} digits) is too large")
            shape.append(int(d))
    problem = shape_limit_problem(shape)
    if problem:
        return ("NCC_ESHP001", f"{text if len(text) <= 60 else text[:56] + '...'}: {problem}")
    return TensorType(dtype, tuple(shape))


def decode_shape(text: str, loc: Loc) -> TensorType:
    r = _decode_shape_text(text)
    if isinstance(r, tuple):
        raise error(r[0], r[1], loc, _SHAPE_HINTS.get(r[0]))
    return r


_SHAPE_HINTS = {
    "NCC_ESHP001": SHAPE_LIMITS_HINT,
    "NCC_EMOD025": "export the model with static shapes (pad to a fixed size, bucket by length)",
    "NCC_ESPP004": "convert to a supported type before compiling",
}


# --- the parser --------------------------------------------------------------------------------


class _Transform(lark.Transformer):
    """Inline transformer: builds raw records while parsing (no parse tree is kept)."""

    def __init__(self, filename: str) -> None:
        super().__init__()
        self.filename = filename

    def _loc(self, tok: lark.Token) -> Loc:
        return Loc(self.filename, tok.line or 0, tok.column or 0)

    def start(self, items: list) -> RawModule:
        m = RawModule()
        for it in items:
            if isinstance(it, RawModule):  # header
                m.name, m.attrs, m.loc = it.name, it.attrs, it.loc
            elif isinstance(it, RawComputation):
                m.computations.append(it)
            elif isinstance(it, tuple) and it[0] == "table":
                m.frames[it[1]] = it[2]
        return m

    def header(self, items: list) -> RawModule:
        name = items[0]
        return RawModule(name=_strip(str(name)), attrs=list(items[1:]), loc=self._loc(name))

    def frame_table(self, items: list) -> tuple:
        return ("table", str(items[0]), dict(items[1:]))

    def table_row(self, items: list) -> tuple[int, str]:
        return int(items[0]), str(items[1])

    def computation(self, items: list) -> RawComputation:
        is_entry = isinstance(items[0], lark.Token) and items[0].type == "ENTRY"
        if is_entry:
            items = items[1:]
        name_tok = items[0]
        sig = None
        instrs: list[RawInstruction] = []
        for it in items[1:]:
            if isinstance(it, RawInstruction):
                instrs.append(it)
            elif isinstance(it, tuple) and it and it[0] == "sig":
                sig = (it[1], it[2])
        return RawComputation(_strip(str(name_tok)), is_entry, sig, instrs, self._loc(name_tok))

    def signature(self, items: list) -> tuple:
        *params, result = items
        return ("sig", [p for p in params if p is not None], result)

    def param_decl(self, items: list) -> tuple[str, Type]:
        return _strip(str(items[0])), items[1]

    def instruction(self, items: list) -> RawInstruction:
        is_root = isinstance(items[0], lark.Token) and items[0].type == "ROOT"
        if is_root:
            items = items[1:]
        name_tok, shape, opcode_tok, *rest = items
        operands = [r for r in rest if isinstance(r, RawOperand)]
        attrs = [r for r in rest if isinstance(r, RawAttr)]
        return RawInstruction(_strip(str(name_tok)), shape, str(opcode_tok), operands, attrs, is_root,
                              self._loc(name_tok))

    def typed_operand(self, items: list) -> RawOperand:
        shape, name = items
        return RawOperand(_strip(str(name)), shape, None, self._loc(name))

    def bare_operand(self, items: list) -> RawOperand:
        (name,) = items
        return RawOperand(_strip(str(name)), None, None, self._loc(name))

    def operand(self, items: list) -> RawOperand:
        return items[0]

    def literal(self, items: list) -> RawOperand:
        (tok,) = items
        if isinstance(tok, RawOperand):  # a tuple literal
            return tok
        return RawOperand(None, None, str(tok), self._loc(tok))

    def tuple_literal(self, items: list) -> RawOperand:
        return RawOperand(None, None, tuple(i.literal for i in items), items[0].loc)

    def shape(self, items: list) -> Type:
        (tok,) = items
        return decode_shape(str(tok), self._loc(tok))

    def tuple_shape(self, items: list) -> Type:
        elements = tuple(i for i in items if i is not None)
        depth = 1 + max((_tuple_depth(e) for e in elements), default=0)
        if depth > MAX_TUPLE_DEPTH:
            raise error("NCC_EPRS003", f"tuple type nested {depth} deep (the limit is {MAX_TUPLE_DEPTH})",
                        Loc(self.filename, 0, 0))
        return TupleType(elements)

    def attribute(self, items: list) -> RawAttr:
        name, value = items
        if not isinstance(value, lark.Token):  # a shape
            return RawAttr(str(name), str(value), "SHAPE", self._loc(name))
        v = str(value)
        if value.type == "STRING":
            v = _unquote(v)
        return RawAttr(str(name), v, value.type, self._loc(name))


MAX_TUPLE_DEPTH = 32

# custom-call targets that only annotate sharding: the identity on a single device.
SHARDING_ANNOTATIONS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "xla.sdy.FuncResultSharding",
    "xla.sdy.Sharding", "xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape", "LocalToGlobalShape",
    "GlobalToLocalShape", "annotate_device_placement",
})


def _tuple_depth(t: Type) -> int:
    """Nesting depth (bounded: every tuple the parser builds was checked against the limit)."""
    if not isinstance(t, TupleType):
        return 0
    return 1 + max((_tuple_depth(e) for e in t.elements), default=0)


_C_ESCAPE = re.compile(rb"\\([0-7]{1,3}|x[0-9a-fA-F]{1,2}|.)", re.DOTALL)
_C_SIMPLE = {b"n": b"\n", b"t": b"\t", b"r": b"\r", b"a": b"\a", b"b": b"\b", b"f": b"\f", b"v": b"\v"}


def _c_unescape(m: re.Match[bytes]) -> bytes:
    e = m.group(1)
    if e[0] in b"01234567":
        return bytes([int(e, 8) & 0xFF])
    if e[:1] == b"x" and len(e) > 1:
        return bytes([int(e[1:], 16)])
    return _C_SIMPLE.get(e, e)


def _unquote(s: str) -> str:
    """The text of a "string" as XLA writes it (absl::CEscape: \\n, \\", and bytes outside
    printable ASCII as octal, so a UTF-8 path like caf\\303\\251.py reads back as café.py)."""
    body = s[1:-1]
    if "\\" not in body:
        return body
    return _C_ESCAPE.sub(_c_unescape, body.encode("utf-8")).decode("utf-8", errors="replace")


@functools.cache
def _grammar() -> str:
    return (Path(__file__).parent / "hlo.lark").read_text(encoding="utf-8")


@functools.cache
def _parser() -> tuple[lark.Lark, _Transform]:
    """Built once: building the LALR tables takes ~40 ms, parsing a small module well under 1 ms.
    The transformer is reused; ``parse_raw`` sets its file name under a lock."""
    transform = _Transform("<string>")
    return lark.Lark(_grammar(), parser="lalr", lexer="contextual", transformer=transform,
                     maybe_placeholders=True), transform


_PARSE_LOCK = threading.Lock()


def parse_raw(text: str, filename: str = "<string>") -> RawModule:
    """Parse HLO text into raw records (syntax only)."""
    parser, transform = _parser()
    try:
        with _PARSE_LOCK:
            transform.filename = filename
            return parser.parse(text)
    except NxsatError:
        raise
    except lark.exceptions.VisitError as exc:
        if isinstance(exc.orig_exc, NxsatError):
            raise exc.orig_exc from None
        raise
    except lark.exceptions.UnexpectedCharacters as exc:
        raise error("NCC_EPRS001", f"unexpected character {text[exc.pos_in_stream]!r}",
                    Loc(filename, exc.line, exc.column)) from None
    except lark.exceptions.UnexpectedToken as exc:
        tok = exc.token
        if tok.type == "$END":
            raise error("NCC_EPRS001", "unexpected end of file (an unclosed computation or instruction?)",
                        Loc(filename, _last_line(text), 1)) from None
        expected = _describe_expected(exc.expected)
        raise error("NCC_EPRS001", f"unexpected {_describe_token(tok)}{expected}",
                    Loc(filename, tok.line, tok.column)) from None
    except lark.exceptions.UnexpectedEOF:
        raise error("NCC_EPRS001", "unexpected end of file", Loc(filename, _last_line(text), 1)) from None


def _last_line(text: str) -> int:
    return text.count("\n") + 1


_TOKEN_WORDS = {"LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('", "RPAR": "')'", "COMMA": "','", "EQUAL": "'='",
                "NAME": "a name", "SHAPE": "a shape", "NUMBER": "a number", "BRACED": "a {...} value",
                "STRING": "a string", "BARE": "a value", "COLON": "':'", "__ANON_0": "'->'", "ROOT": "ROOT",
                "ENTRY": "ENTRY", "BOOL": "true/false", "INT": "an integer", "IOTA_GROUPS": "replica groups"}


def _describe_token(tok: lark.Token) -> str:
    text = str(tok)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{text!r}"


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_TOKEN_WORDS.get(e, e.lower()) for e in expected})
    if not words or len(words) > 6:
        return ""
    return f" (expected {' or '.join(words)})"


# --- attribute decoding --------------------------------------------------------------------------

_INT_RE = re.compile(r"-?\d+")


def _ints(attr: RawAttr) -> tuple[int, ...]:
    body = attr.value.strip()
    if attr.kind == "BRACED":
        body = body[1:-1]
    body = body.strip()
    if not body:
        return ()
    parts = [p.strip() for p in body.split(",")]
    if not all(_INT_RE.fullmatch(p) for p in parts):
        raise _bad(attr, "a list of integers like {0,1}")
    return tuple(int(p) for p in parts)


def _int(attr: RawAttr) -> int:
    v = attr.value.strip()
    if attr.kind == "BRACED":
        vals = _ints(attr)
        if len(vals) != 1:
            raise _bad(attr, "one integer")
        return vals[0]
    if not _INT_RE.fullmatch(v):
        raise _bad(attr, "an integer")
    return int(v)


def _float(attr: RawAttr) -> float:
    try:
        return float(attr.value)
    except ValueError:
        raise _bad(attr, "a number") from None


def _bool(attr: RawAttr) -> bool:
    v = attr.value.strip().lower()
    if v not in ("true", "false"):
        raise _bad(attr, "true or false")
    return v == "true"


def _bad(attr: RawAttr, what: str) -> NxsatError:
    shown = attr.value if len(attr.value) <= 60 else attr.value[:57] + "..."
    return error("NCC_EPRS003", f"attribute {attr.name}={shown} is not {what}", attr.loc)


_WINDOW_KEYS = {"size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"}


def _window(attr: RawAttr) -> tuple[WindowDim, ...]:
    body = attr.value.strip()
    if attr.kind != "BRACED":
        raise _bad(attr, "a window {size=... stride=... pad=...}")
    fields: dict[str, list[str]] = {}
    for item in body[1:-1].split():
        key, _, val = item.partition("=")
        if key not in _WINDOW_KEYS or not val:
            raise _bad(attr, f"a window (unknown field {key!r})")
        fields[key] = val.split("x")
    if "size" not in fields:
        if body[1:-1].strip() == "":
            return ()
        raise _bad(attr, "a window with a size")
    n = len(fields["size"])
    for key, vals in fields.items():
        if len(vals) != n:
            raise _bad(attr, f"a window whose {key} has {n} entries")
    try:
        size = [int(v) for v in fields["size"]]
        stride = [int(v) for v in fields.get("stride", ["1"] * n)]
        lhs = [int(v) for v in fields.get("lhs_dilate", ["1"] * n)]
        rhs = [int(v) for v in fields.get("rhs_dilate", ["1"] * n)]
        rev = [v == "1" for v in fields.get("rhs_reversal", ["0"] * n)]
        pads = []
        for p in fields.get("pad", ["0_0"] * n):
            lo, _, hi = p.partition("_")
            pads.append((int(lo), int(hi)))
    except ValueError:
        raise _bad(attr, "a window of integers") from None
    if any(s <= 0 for s in size + stride + lhs + rhs):
        raise _bad(attr, "a window with positive sizes, strides and dilations")
    return tuple(WindowDim(size[i], stride[i], pads[i][0], pads[i][1], lhs[i], rhs[i], rev[i]) for i in range(n))


_SLICE_RE = re.compile(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]")


def _slices(attr: RawAttr) -> tuple[SliceDim, ...]:
    body = attr.value.strip()
    if attr.kind != "BRACED":
        raise _bad(attr, "slice ranges like {[0:4], [1:3:2]}")
    inner = body[1:-1].strip()
    out = []
    pos = 0
    for m in _SLICE_RE.finditer(inner):
        if inner[pos:m.start()].strip(" ,"):
            raise _bad(attr, "slice ranges like {[0:4], [1:3:2]}")
        out.append(SliceDim(int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)))
        pos = m.end()
    if inner[pos:].strip(" ,"):
        raise _bad(attr, "slice ranges like {[0:4], [1:3:2]}")
    return tuple(out)


def _padding(attr: RawAttr) -> tuple[PadDim, ...]:
    v = attr.value.strip()
    if not v:
        return ()
    out = []
    for part in v.split("x"):
        nums = part.split("_")
        if len(nums) not in (2, 3) or not all(_INT_RE.fullmatch(n) for n in nums):
            raise _bad(attr, "padding like 0_0x1_1_0 (low_high[_interior] per dimension)")
        lo, hi, *interior = (int(n) for n in nums)
        out.append(PadDim(lo, hi, interior[0] if interior else 0))
    return tuple(out)


MAX_DEVICES = 1 << 16  # replica groups name at most this many devices (bounds the decoding)


def _replica_groups(attr: RawAttr) -> tuple[tuple[int, ...], ...]:
    if attr.kind == "IOTA_GROUPS":
        # [groups,size]<=[dims]T(perm): iota over dims, transposed by perm, cut into groups.
        m = re.fullmatch(r"\[([\d,]*)\]<=\[([\d,]*)\](?:T\(([\d,]*)\))?", attr.value)
        if not m:
            raise _bad(attr, "iota replica groups like [2,2]<=[4]")
        shape, dims = ([int(x) for x in g.split(",") if x] for g in m.group(1, 2))
        perm = [int(x) for x in m.group(3).split(",") if x] if m.group(3) is not None else list(range(len(dims)))
        if len(shape) != 2 or not dims or min(shape + dims) < 1:
            raise _bad(attr, "iota replica groups [groups,size]<=[dims] with positive sizes")
        if math.prod(dims) > MAX_DEVICES:
            raise _bad(attr, f"replica groups over at most {MAX_DEVICES} devices")
        if math.prod(shape) != math.prod(dims):
            raise _bad(attr, "iota replica groups whose sizes agree")
        if sorted(perm) != list(range(len(dims))):
            raise _bad(attr, f"iota replica groups whose T(...) permutes 0..{len(dims) - 1}")
        ids = np.arange(math.prod(dims)).reshape(dims).transpose(perm).reshape(shape)
        return tuple(tuple(int(i) for i in row) for row in ids)
    body = attr.value.strip()
    if attr.kind != "BRACED":
        raise _bad(attr, "replica groups like {{0,1},{2,3}}")
    inner = body[1:-1].strip()
    groups = re.findall(r"\{([^{}]*)\}", inner)
    if re.sub(r"\{[^{}]*\}", "", inner).strip(" ,\n"):
        raise _bad(attr, "replica groups like {{0,1},{2,3}}")
    out = []
    for g in groups:
        g = g.strip()
        if g and not all(_INT_RE.fullmatch(x.strip()) for x in g.split(",")):
            raise _bad(attr, "replica groups of integers")
        out.append(tuple(int(x) for x in g.split(",")) if g else ())
    return tuple(out)


_META_RE = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s}]+)')


def _metadata(attr: RawAttr) -> Metadata:
    fields = {k: (_unquote(v) if v.startswith('"') else v) for k, v in _META_RE.findall(attr.value)}
    line = fields.pop("source_line", "0")
    return Metadata(op_name=fields.pop("op_name", ""), source_file=fields.pop("source_file", ""),
                    source_line=int(line) if line.lstrip("-").isdigit() else 0,
                    extra=tuple(sorted(fields.items())))


# --- literals ------------------------------------------------------------------------------------

_LITERAL_TOKEN = re.compile(r"[-+]?(?:inf|nan(?:\(0x[0-9a-fA-F]+\))?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|"
                            r"\.\d+(?:[eE][-+]?\d+)?)|true|false")


def _decode_value(lit: Literal, t: Type, loc: Loc) -> Any:
    """A constant's value: an array for an array type, a tuple of values for a tuple type; None
    where the literal is elided (``{...}``, which stands for a whole tuple too)."""
    if isinstance(t, TensorType):
        if isinstance(lit, tuple):
            raise error("NCC_EVRF064", f"constant of type {t} is written as a tuple", loc)
        return decode_literal(lit, t, loc)
    if isinstance(lit, str) and lit.replace(" ", "") == "{...}":
        return tuple(_decode_value(lit, e, loc) for e in t.elements)
    if not isinstance(lit, tuple) or len(lit) != len(t.elements):
        n = len(lit) if isinstance(lit, tuple) else 1
        raise error("NCC_EVRF064", f"constant of type {t} has {n} tuple element(s), expected {len(t.elements)}",
                    loc)
    return tuple(_decode_value(v, e, loc) for v, e in zip(lit, t.elements))


def decode_literal(text: str, t: TensorType, loc: Loc) -> np.ndarray | None:
    """The value of a constant literal; None for an elided one (``{...}``)."""
    s = text.strip()
    if s.replace(" ", "") == "{...}":
        return None
    body = s
    if s.startswith("{"):
        body = s.replace("{", " ").replace("}", " ")
    tokens = body.replace(",", " ").split()
    for tok in tokens:
        if not _LITERAL_TOKEN.fullmatch(tok):
            raise error("NCC_EPRS003", f"malformed literal element {tok[:30]!r} in constant", loc)
    if len(tokens) != t.size:
        raise error("NCC_EVRF064", f"constant of type {t} has {len(tokens)} literal values, expected {t.size}",
                    loc)
    if t.rank > 0 and not s.startswith("{"):
        raise error("NCC_EPRS003", f"constant of type {t} needs a {{...}} array literal", loc)
    d = t.dtype
    try:
        if d.is_pred:
            vals = [tok in ("true", "1") or (tok not in ("false", "0") and float(tok) != 0) for tok in tokens]
            arr = np.array(vals, dtype=np.bool_)
        elif d.is_int:
            if any(not re.fullmatch(r"[-+]?\d+", tok) for tok in tokens):
                raise error("NCC_EPRS003", f"integer constant of type {t} has a non-integer value", loc)
            ints = [int(tok) for tok in tokens]
            info = np.iinfo(d.np)
            if ints and (min(ints) < info.min or max(ints) > info.max):
                raise error("NCC_EPRS003", f"constant value out of range for {d.name}", loc)
            arr = np.array(ints, dtype=d.np)
        else:
            floats = np.array([float(tok.partition("(")[0]) for tok in tokens], dtype=np.float64)
            arr = dt.cast(floats, d)
            payloads = [(i, tok) for i, tok in enumerate(tokens) if "(" in tok]
            if payloads:
                arr = _with_nan_payloads(arr, payloads, t, loc)
    except (ValueError, OverflowError):
        raise error("NCC_EPRS003", "malformed constant literal", loc) from None
    return arr.reshape(t.shape)


def _with_nan_payloads(arr: np.ndarray, payloads: list[tuple[int, str]], t: TensorType, loc: Loc) -> np.ndarray:
    """Set the NaNs XLA prints as ``nan(0xP)`` / ``-nan(0xP)``: P is the whole mantissa field
    (quiet bit included), so the value's bits are sign | all-ones exponent | P."""
    d = t.dtype
    if d is dt.F8E4M3FN:
        raise error("NCC_EPRS003", f"{d.name} has no NaN payloads (its only NaN is nan)", loc)
    width = arr.dtype.itemsize * 8
    mant = int(ml_dtypes.finfo(arr.dtype).nmant)
    exponent = ((1 << (width - 1)) - 1) & ~((1 << mant) - 1)
    bits = arr.view(np.dtype(f"u{arr.dtype.itemsize}")).copy()
    for i, tok in payloads:
        payload = int(tok[tok.index("(") + 1:-1], 16)
        if not 0 < payload < (1 << mant):
            raise error("NCC_EPRS003", f"NaN payload {tok} does not fit the {mant}-bit mantissa of {d.name}", loc)
        bits[i] = (1 << (width - 1) if tok.startswith("-") else 0) | exponent | payload
    return bits.view(arr.dtype)


# --- building the IR -----------------------------------------------------------------------------

# Attributes that carry no semantics nxsat needs (scheduling hints, sharding, provenance).
_IGNORED_ATTRS = frozenset({
    "sharding", "frontend_attributes", "backend_config", "statistics", "control-predecessors", "origin",
    "operand_precision", "precision_config", "algorithm_config", "schedule", "kind", "api_version",
    "custom_call_has_side_effect", "output_to_operand_aliasing", "operand_layout_constraints",
    "result_accuracy", "channel_id", "use_global_device_ids", "constrain_layout", "is_cross_program_prefetch",
    "padding_type", "sdy_sharding", "literal", "is_host_transfer", "sort_dim", "custom_call_schedule",
    "dynamic_update_slice_is_in_place", "raw_backend_config_string", "async_execution_thread",
    "allow_spmd_sharding_propagation_to_parameters", "allow_spmd_sharding_propagation_to_output",
    "unique_indices_hint", "metadata", "feature_group_count_hint", "custom_call_target",
})

_COMPARE_TYPES = ("FLOAT", "TOTALORDER", "SIGNED", "UNSIGNED")

_COMPUTATION_ATTRS = {"to_apply": "to_apply", "calls": "to_apply", "condition": "condition", "body": "body",
                      "select": "select", "scatter": "scatter", "comparator": "to_apply"}

_DOT_KEYS = {"lhs_contracting_dims": "lhs_contracting", "rhs_contracting_dims": "rhs_contracting",
             "lhs_batch_dims": "lhs_batch", "rhs_batch_dims": "rhs_batch"}
_GATHER_KEYS = {f: f for f in ("offset_dims", "collapsed_slice_dims", "start_index_map",
                               "operand_batching_dims", "start_indices_batching_dims")}
_SCATTER_KEYS = {f: f for f in ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                                "input_batching_dims", "scatter_indices_batching_dims")}


class _ModuleBuilder:
    def __init__(self, raw: RawModule, filename: str) -> None:
        self.raw = raw
        self.filename = filename
        self.warnings = Warnings()
        self.by_name: dict[str, RawComputation] = {}
        for c in raw.computations:
            if c.name in self.by_name:
                raise error("NCC_EPRS002", f"computation {c.name} is defined twice", c.loc)
            self.by_name[c.name] = c
        self.built: dict[str, Computation] = {}
        self.building: set[str] = set()
        self.ignored: set[str] = set()
        self.extra: list[Node] = []  # nodes an instruction adds besides its own (tuple constants)

    def _origin(self, meta: Metadata) -> str | None:
        """Where the model's own source says an instruction came from: metadata's source_file and
        source_line, or its stack_frame_id resolved through the module's stack-frame tables."""
        if meta.source_file:
            return meta.origin()
        frame_id = dict(meta.extra).get("stack_frame_id")
        frames = self.raw.frames
        if frame_id is None or "StackFrames" not in frames:
            return None

        def field(table: str, key: str | int, name: str) -> str | None:
            row = frames.get(table, {}).get(int(key)) if str(key).isdigit() else None
            if row is None:
                return None
            m = re.search(rf"\b{name}=(\S+?)[\s}}]", row + " ")
            return m.group(1) if m else None

        loc_id = field("StackFrames", frame_id, "file_location_id")
        file_id = field("FileLocations", loc_id, "file_name_id") if loc_id else None
        line = field("FileLocations", loc_id, "line") if loc_id else None
        name = frames.get("FileNames", {}).get(int(file_id)) if file_id and file_id.isdigit() else None
        if not name:
            return None
        name = _unquote(name) if name.startswith('"') else name
        return f"{name}:{line}" if line else name

    # computations are built on first use, so order in the file does not matter
    def computation(self, name: str, loc: Loc) -> Computation:
        name = _strip(name)
        if name in self.built:
            return self.built[name]
        raw = self.by_name.get(name)
        if raw is None:
            raise error("NCC_EPRS002", f"no computation named {name}", loc)
        if name in self.building:
            raise error("NCC_EPRS002", f"computation {name} calls itself (recursion is not allowed)", loc)
        self.building.add(name)
        comp = self._build(raw)
        self.building.discard(name)
        self.built[name] = comp
        return comp

    def _build(self, raw: RawComputation) -> Computation:
        if not raw.instructions:
            raise error("NCC_EPRS004", f"computation {raw.name} has no instructions", raw.loc)
        instrs: dict[str, RawInstruction] = {}
        for ins in raw.instructions:
            if ins.name in instrs:
                raise error("NCC_EPRS002", f"instruction {ins.name} is defined twice in {raw.name}", ins.loc)
            instrs[ins.name] = ins
        roots = [i for i in raw.instructions if i.is_root]
        if len(roots) > 1:
            raise error("NCC_EPRS004", f"computation {raw.name} has {len(roots)} ROOT instructions", roots[1].loc)
        root_raw = roots[0] if roots else raw.instructions[-1]

        nodes: dict[str, Node] = {}
        before: dict[str, list[Node]] = {}
        # Build in dependency order without recursion (operands may be written after their users).
        for start in raw.instructions:
            if start.name in nodes:
                continue
            stack: list[tuple[RawInstruction, bool]] = [(start, False)]
            active: set[str] = set()
            while stack:
                ins, ready = stack.pop()
                if ins.name in nodes:
                    continue
                if ready:
                    active.discard(ins.name)
                    self.extra = []
                    nodes[ins.name] = node = self._instruction(ins, nodes, raw)
                    if self.extra:
                        before[ins.name] = [n for n in self.extra if n is not node]
                    continue
                if ins.name in active:
                    raise error("NCC_EPRS002", f"instruction {ins.name} depends on itself", ins.loc)
                active.add(ins.name)
                stack.append((ins, True))
                for o in ins.operands:
                    if o.name is None or o.name in nodes:
                        continue
                    dep = instrs.get(o.name)
                    if dep is None:
                        raise error("NCC_EPRS002", f"{ins.name} uses undefined value {o.name}", o.loc)
                    if dep.name in active:
                        raise error("NCC_EPRS002", f"cycle through {dep.name} in {raw.name}", o.loc)
                    stack.append((dep, False))

        params = sorted((n for n in nodes.values() if n.op == "parameter"), key=lambda n: n.attrs["index"])
        for i, p in enumerate(params):
            if p.attrs["index"] != i:
                raise error("NCC_EPRS004", f"{raw.name}: parameter numbers must be 0..{len(params) - 1} with "
                            f"none repeated or missing (found {p.attrs['index']} at position {i})", p.loc)
        if raw.signature is not None:
            sig_params, sig_result = raw.signature
            if len(sig_params) != len(params):
                raise error("NCC_EVRF064", f"{raw.name}: signature lists {len(sig_params)} parameters, the body "
                            f"has {len(params)}", raw.loc)
            for (pname, ptype), p in zip(sig_params, params):
                if ptype != p.type:
                    raise error("NCC_EVRF064", f"{raw.name}: signature says {pname} is {ptype}, parameter "
                                f"{p.attrs['index']} is {p.type}", p.loc)
            if sig_result != nodes[root_raw.name].type:
                raise error("NCC_EVRF064", f"{raw.name}: signature returns {sig_result}, the root is "
                            f"{nodes[root_raw.name].type}", root_raw.loc)
        instructions = [n for i in raw.instructions for n in (*before.get(i.name, ()), nodes[i.name])]
        return Computation(raw.name, params, nodes[root_raw.name], instructions, raw.loc)

    def _instruction(self, ins: RawInstruction, nodes: dict[str, Node], comp: RawComputation) -> Node:
        operands: list[Node] = []
        literals: list[RawOperand] = []
        for o in ins.operands:
            if o.name is None:
                literals.append(o)
                continue
            n = nodes[o.name]
            if o.shape is not None and o.shape != n.type:
                raise error("NCC_EVRF064", f"operand {o.name} is written as {o.shape} but is {n.type}", o.loc)
            operands.append(n)
        attrs_raw = {a.name: a for a in ins.attrs}
        if len(attrs_raw) != len(ins.attrs):
            seen: set[str] = set()
            for a in ins.attrs:
                if a.name in seen:
                    raise error("NCC_EPRS003", f"attribute {a.name} given twice", a.loc)
                seen.add(a.name)
        meta = attrs_raw.get("metadata")
        loc = ins.loc
        if meta is not None:
            origin = self._origin(_metadata(meta))
            if origin:
                loc = Loc(loc.file, loc.line, loc.column, origin)
        opcode, attrs = self._attrs(ins, operands, literals, attrs_raw, loc)
        declared = ins.type
        if opcode == "constant" and isinstance(declared, TupleType):
            node = self._tuple_constant(attrs["value"], declared, ins.name, loc)
        else:
            inferred = infer_type(opcode, operands, attrs, loc)
            if inferred != declared:
                raise error("NCC_EVRF064", f"{ins.name}: declared {declared} but {opcode} of "
                            f"({', '.join(str(o.type) for o in operands)}) gives {inferred}", loc)
            node = Node(opcode, operands, attrs, declared, ins.name, loc)
        if any(leaf.dtype in (dt.S64, dt.U64) for leaf in declared.leaves()):
            self.warnings.warn("NCC_WTYP001", "INT64/UINT64 values are computed as 32-bit on the device "
                               "(high bits dropped)", loc)
        return node

    def _tuple_constant(self, value: Any, t: Type, name: str, loc: Loc) -> Node:
        """A tuple-typed constant as the tuple of its elements' constants (``name.0``, ``name.1``,
        ...); the element nodes are listed before it among the computation's instructions."""
        if isinstance(t, TensorType):
            attrs = {"value": value, "type": t}
            node = Node("constant", (), attrs, infer_type("constant", [], attrs, loc), name, loc)
        else:
            parts = [self._tuple_constant(v, e, f"{name}.{i}", loc) for i, (v, e) in enumerate(zip(value, t.elements))]
            node = Node("tuple", parts, {}, infer_type("tuple", parts, {}, loc), name, loc)
        self.extra.append(node)
        return node

    def _attrs(self, ins: RawInstruction, operands: list[Node], literals: list[RawOperand],
               raw: dict[str, RawAttr], loc: Loc) -> tuple[str, dict[str, Any]]:
        """Decode the attributes of one instruction into the registry's attribute names."""
        opcode = ins.opcode
        t = ins.type
        a: dict[str, Any] = {}
        used = {"metadata"}

        def take(key: str) -> RawAttr | None:
            used.add(key)
            return raw.get(key)

        def need(key: str) -> RawAttr:
            v = take(key)
            if v is None:
                raise error("NCC_EPRS003", f"{opcode} needs attribute {key}", loc)
            return v

        if opcode in FUSED:
            raise error("NCC_EUOC002", f"unsupported operator {opcode}: HLO has no such opcode (nxsat's fused "
                        f"{opcode} is introduced by --model-type rule sets only)", loc)
        if literals and opcode not in ("parameter", "constant"):
            raise error("NCC_EPRS001", f"{opcode} operands must be names, not literals", literals[0].loc)
        if opcode == "parameter":
            number = literals[0].literal if len(literals) == 1 else None
            if not isinstance(number, str) or not re.fullmatch(r"\d+", number):
                raise error("NCC_EPRS003", "parameter needs its number: parameter(N)", loc)
            a["index"] = int(number)
            a["type"] = t
        elif opcode == "constant":
            if len(literals) != 1:
                raise error("NCC_EPRS003", "constant needs one literal: constant(VALUE)", loc)
            a["value"] = _decode_value(literals[0].literal or "", t, literals[0].loc)
            a["type"] = t
        elif opcode == "custom-call" and _custom_call_target(raw) == "TopK":
            used.add("custom_call_target")
            if not (isinstance(t, TupleType) and len(t.elements) == 2 and isinstance(t.elements[0], TensorType)):
                raise error("NCC_EVRF064", "TopK custom-call must return (values, indices)", loc)
            opcode = "topk"
            a["k"] = t.elements[0].shape[-1] if t.elements[0].shape else 1
            a["largest"] = True
        elif opcode == "custom-call" and _custom_call_target(raw) in SHARDING_ANNOTATIONS:
            # Sharding annotations (GSPMD / Shardy) pass their value through on one device.
            used.add("custom_call_target")
            if len(operands) != 1 or operands[0].type != t:
                raise error("NCC_EVRF015", f"sharding annotation {_custom_call_target(raw)!r} changes the "
                            "shape: only single-device (replicated) programs are supported", loc)
            opcode = "copy"
        elif opcode == "custom-call":
            self.warnings.warn("NCC_WUOC001", f"custom-call target {_custom_call_target(raw)!r} is unknown: "
                               "the model loads for inspection but cannot run (NCC_EVRF015)", loc)

        # Attributes whose value is the declared result type.
        opdef = registry.get(opcode)
        if opdef is not None and opdef.status == registry.UNSUPPORTED:
            self.warnings.warn("NCC_WUOC001", f"operator {opcode} is not supported ({opdef.notes}): the model "
                               "loads for inspection but cannot run (NCC_EUOC002)", loc)
        if opcode in ("iota", "rng-bit-generator", "rng", "custom-call") or \
                (opdef is not None and opdef.status == registry.UNSUPPORTED):
            a["type"] = t
        if opcode in ("reshape", "bitcast", "broadcast") and isinstance(t, TensorType):
            a["shape"] = t.shape
        if opcode in ("convert", "bitcast-convert", "dot", "convolution") and isinstance(t, TensorType):
            a["dtype"] = t.dtype
        if opcode in ("dot", "convolution"):
            a["precision"] = tuple(_words(raw.get("operand_precision")))
        # Generic decoding by attribute name.
        for key in ("dimensions",):
            if key in raw:
                used.add(key)
                vals = _ints(raw[key])
                if opcode in ("concatenate", "sort", "all-gather", "reduce-scatter", "all-to-all"):
                    if len(vals) != 1:
                        raise _bad(raw[key], "one dimension")
                    a["dimension"] = vals[0]
                else:
                    a["dimensions"] = vals
        if opcode == "broadcast" and "dimensions" not in a:
            a["dimensions"] = ()
        if opcode == "transpose" and "dimensions" not in a:
            raise error("NCC_EPRS003", "transpose needs dimensions={...}", loc)
        for key in ("index", "iota_dimension", "feature_index", "k", "index_vector_dim", "exponent_bits",
                    "mantissa_bits", "feature_group_count", "batch_group_count", "split_dimension",
                    "concat_dimension"):
            if (v := take(key)) is not None:
                a[key] = _int(v)
        if opcode == "get-tuple-element" and "index" not in a:
            raise error("NCC_EPRS003", "get-tuple-element needs index=N", loc)
        for key in ("largest", "is_stable", "indices_are_sorted", "unique_indices"):
            if (v := take(key)) is not None:
                a[key] = _bool(v)
        if (v := take("epsilon")) is not None:
            a["epsilon"] = _float(v)
        for key in ("direction", "distribution", "algorithm"):
            if (v := take(key)) is not None:
                a[key] = v.value.strip()
        if opcode == "compare":
            v = take("type")
            a["type"] = v.value.strip() if v is not None else None
            if v is not None and a["type"] not in _COMPARE_TYPES:
                raise _bad(v, f"a comparison type ({', '.join(_COMPARE_TYPES)})")
            if "direction" not in a:
                raise error("NCC_EPRS003", "compare needs direction=EQ|NE|LT|LE|GT|GE", loc)
        if opcode == "rng-bit-generator":
            a.setdefault("algorithm", "rng_default")
            a["type"] = t
        if opcode == "rng":
            a["type"] = t
        if (v := take("slice")) is not None:
            a["slice"] = _slices(v)
        if (v := take("dynamic_slice_sizes")) is not None:
            a["sizes"] = _ints(v)
        if (v := take("slice_sizes")) is not None:
            a["slice_sizes"] = _ints(v)
        if (v := take("padding")) is not None:
            a["padding"] = _padding(v)
        if (v := take("window")) is not None:
            a["window"] = _window(v)
        if opcode in ("reduce-window", "select-and-scatter", "convolution") and "window" not in a:
            rank = operands[0].tensor.rank if operands and isinstance(operands[0].type, TensorType) else 0
            a["window"] = tuple(WindowDim() for _ in range(rank if opcode != "convolution" else max(rank - 2, 0)))
        if (v := take("dim_labels")) is not None:
            try:
                a["dims"] = ConvDims.from_labels(v.value.strip())
            except ValueError as exc:
                raise error("NCC_EPRS003", str(exc), v.loc) from None
        elif opcode == "convolution":
            raise error("NCC_EPRS003", "convolution needs dim_labels=...", loc)
        if opcode == "convolution":
            a.setdefault("feature_group_count", 1)
            a.setdefault("batch_group_count", 1)
        if opcode == "dot":
            a["dims"] = DotDims(**{field: _ints(raw[key]) if key in raw else () for key, field in _DOT_KEYS.items()})
            used.update(_DOT_KEYS)
        if opcode == "gather":
            fields = {f: _ints(raw[k]) for k, f in _GATHER_KEYS.items() if k in raw}
            used.update(_GATHER_KEYS)
            a["dims"] = GatherDims(index_vector_dim=a.pop("index_vector_dim", 0), **fields)
            a.setdefault("indices_are_sorted", False)
        if opcode == "scatter":
            fields = {f: _ints(raw[k]) for k, f in _SCATTER_KEYS.items() if k in raw}
            used.update(_SCATTER_KEYS)
            a["dims"] = ScatterDims(index_vector_dim=a.pop("index_vector_dim", 0), **fields)
            a.setdefault("indices_are_sorted", False)
            a.setdefault("unique_indices", False)
        if opcode == "sort":
            a.setdefault("is_stable", False)
        if opcode == "topk":
            a.setdefault("largest", True)
        if (v := take("replica_groups")) is not None:
            a["replica_groups"] = _replica_groups(v)
        elif opcode in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
            a["replica_groups"] = ()
        if (v := take("source_target_pairs")) is not None:
            a["source_target_pairs"] = _replica_groups(v)
        for key, field_name in _COMPUTATION_ATTRS.items():
            if (v := take(key)) is not None:
                a[field_name] = self.computation(v.value, v.loc)
        if (v := take("branch_computations")) is not None:
            names = [n.strip() for n in v.value.strip()[1:-1].split(",") if n.strip()]
            if not names:
                raise _bad(v, "a list of computations")
            a["branches"] = tuple(self.computation(n, v.loc) for n in names)
        if "true_computation" in raw or "false_computation" in raw:
            a["branches"] = (self.computation(need("true_computation").value, raw["true_computation"].loc),
                             self.computation(need("false_computation").value, raw["false_computation"].loc))
        if opcode == "custom-call":
            a["target"] = _custom_call_target(raw)
            a["backend_config"] = raw["backend_config"].value if "backend_config" in raw else ""
        for key in raw:
            if key not in used and key not in _IGNORED_ATTRS:
                self.ignored.add(key)
                self.warnings.warn("NCC_WPRS001", f"attribute {key} is not used by nxsat and was ignored",
                                   raw[key].loc)
        return opcode, a

    def module(self) -> Module:
        raw = self.raw
        if not raw.computations:
            raise error("NCC_EPRS004", "the module has no computations", raw.loc or Loc(self.filename, 1, 1))
        entries = [c for c in raw.computations if c.is_entry]
        if len(entries) > 1:
            raise error("NCC_EPRS004", "more than one ENTRY computation", entries[1].loc)
        entry_raw = entries[0] if entries else raw.computations[-1]
        entry = self.computation(entry_raw.name, entry_raw.loc)
        # Computations nobody calls still get parsed and checked (a typo there is still an error).
        for c in raw.computations:
            self.computation(c.name, c.loc)
        header_attrs: dict[str, Any] = {a.name: a.value for a in raw.attrs}
        alias = next((a for a in raw.attrs if a.name == "input_output_alias"), None)
        if alias is not None:
            header_attrs["output_aliases"] = _output_aliases(alias, entry)
        mod = Module(raw.name, entry, attrs=header_attrs, source=self.filename, framework="XLA")
        self._check_entry_layout(raw, entry)
        mod.warnings.extend(self.warnings)
        return mod

    def _check_entry_layout(self, raw: RawModule, entry: Computation) -> None:
        layout = next((a for a in raw.attrs if a.name == "entry_computation_layout"), None)
        if layout is None:
            return
        body = layout.value.strip()[1:-1]
        try:
            sig = _parser_sig().parse(body)
        except (NxsatError, lark.exceptions.VisitError) as exc:  # a type nxsat refuses, said where it is
            e = exc.orig_exc if isinstance(exc, lark.exceptions.VisitError) else exc
            if not isinstance(e, NxsatError):
                raise
            raise error(e.code, f"entry_computation_layout: {e.message}", layout.loc, e.hint) from None
        except lark.exceptions.LarkError:
            raise error("NCC_EPRS003", "entry_computation_layout is not of the form {(params)->result}",
                        layout.loc) from None
        params, result = sig
        if len(params) != len(entry.params) or any(p != q.type for p, q in zip(params, entry.params)):
            raise error("NCC_EVRF064", "entry_computation_layout does not match the ENTRY parameters",
                        layout.loc)
        if result != entry.result_type:
            raise error("NCC_EVRF064", f"entry_computation_layout returns {result}, the ENTRY root is "
                        f"{entry.result_type}", layout.loc)


_ALIAS_ENTRY = re.compile(r"\s*\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}\s*(?:,\s*([\w-]+)\s*)?\)\s*(,|$)")


def _leaf_paths(t: Type, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """The tuple index of each output, in the order the outputs are numbered (depth first)."""
    if isinstance(t, TupleType):
        return [p for i, e in enumerate(t.elements) for p in _leaf_paths(e, prefix + (i,))]
    return [prefix]


def _output_aliases(attr: RawAttr, entry: Computation) -> dict[int, int]:
    """``input_output_alias={ {1}: (0, {}, may-alias), ... }`` as output number -> parameter number: the
    buffers a caller donates, so an output that returns its parameter unchanged needs no copy."""
    body = attr.value.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise error("NCC_EPRS003", "input_output_alias is not of the form { {out}: (param, {}, kind), ... }",
                    attr.loc)
    body, pos, out = body[1:-1].strip(), 0, {}
    paths = {p: k for k, p in enumerate(_leaf_paths(entry.result_type))}
    while pos < len(body):
        m = _ALIAS_ENTRY.match(body, pos)
        if m is None or m.end() == pos:
            raise error("NCC_EPRS003", f"input_output_alias: cannot read {body[pos:pos + 40]!r}", attr.loc,
                        "entries are {output index}: (parameter, {parameter index}, may-alias|must-alias)")
        pos = m.end()
        path = tuple(int(w) for w in m.group(1).replace(",", " ").split())
        param, kind = int(m.group(2)), m.group(4) or "may-alias"
        if kind not in ("may-alias", "must-alias"):
            raise error("NCC_EPRS003", f"input_output_alias: unknown kind {kind!r}", attr.loc,
                        "may-alias or must-alias")
        if path not in paths:
            raise error("NCC_EVRF064", f"input_output_alias names output {{{','.join(map(str, path))}}}, which the "
                        f"ENTRY result {entry.result_type} does not have", attr.loc)
        if param >= len(entry.params) or m.group(3).strip():
            raise error("NCC_EVRF064", f"input_output_alias names parameter {param} "
                        f"{{{m.group(3).strip()}}}, which the ENTRY does not have (its parameters are tensors)",
                        attr.loc)
        k = paths[path]
        if entry.params[param].type != entry.result_type.leaves()[k]:
            raise error("NCC_EVRF064", f"input_output_alias: output {k} is {entry.result_type.leaves()[k]}, "
                        f"parameter {param} is {entry.params[param].type}", attr.loc)
        if k in out:
            raise error("NCC_EVRF064", f"input_output_alias names output {k} twice", attr.loc)
        out[k] = param
    return out


def _words(attr: RawAttr | None) -> list[str]:
    if attr is None:
        return []
    return [w.strip() for w in attr.value.strip("{} ").split(",") if w.strip()]


def _custom_call_target(raw: dict[str, RawAttr]) -> str:
    t = raw.get("custom_call_target")
    return t.value if t is not None else ""


_SIG_GRAMMAR = r"""
start: "(" [shape ("," shape)*] ")" "->" shape
shape: SHAPE -> one | "(" [shape ("," shape)*] ")" -> many
SHAPE: /(pred|token|opaque|[subfc]\d+|bf16|tf32|f\d+e[0-9a-z]+)\[[^\]\n]*\](\{[^{}\n]*\})?/
COMMENT: /\/\*(.|\n)*?\*\//
%import common.WS
%ignore WS
%ignore COMMENT
"""


class _SigTransform(lark.Transformer):
    def start(self, items: list) -> tuple[list[Type], Type]:
        *params, result = items
        return [p for p in params if p is not None], result

    def one(self, items: list) -> Type:
        return decode_shape(str(items[0]), Loc("<layout>"))

    def many(self, items: list) -> Type:
        return TupleType(tuple(i for i in items if i is not None))


@functools.cache
def _parser_sig() -> lark.Lark:
    return lark.Lark(_SIG_GRAMMAR, parser="lalr", transformer=_SigTransform(), maybe_placeholders=True)


def parse_hlo(text: str, filename: str = "<string>") -> Module:
    """Parse and check an HLO module. Raises NxsatError with a code and location on bad input."""
    raw = parse_raw(text, filename)
    try:
        return _ModuleBuilder(raw, filename).module()
    except RecursionError:
        raise error("NCC_EPRS004", "computations call each other too deeply to build", Loc(filename, 1, 1),
                    "flatten the call chain (more than ~900 nested calls)") from None

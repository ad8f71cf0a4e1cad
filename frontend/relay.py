"""TVM Relay text (version 0.0.5) -> nxsat IR.

The text is parsed by the lark grammar in ``relay.lark`` and walked once: every global function
becomes an IR computation (``@main`` the entry, the others reached through ``call``), every Relay
operator call is lowered by :mod:`relay_lower`'s table into registry operators through a
:class:`~nxsat.builder.Builder` (so each node is type-checked where it is built and carries its
``file:line:col``), and each binding's type is checked against what the text declares: parameter
types, ``let`` annotations, return types and the printer's ``/* ty=... */`` comments (after
bindings, calls, tuples, projections, literals, parameters and constants).

A text that is one expression, as TVM prints a function (``fn (...) {...}``) or an expression
(``free_var %x: T;`` lines, then the body), becomes @main with those parameters or free variables.
Closures (``fn``) bound to a name and called are inlined at each call; ``if`` is if-converted
(both branches computed, the result selected). ``match``, ADTs and references are refused with
NCC_EUOC002. Relay tuples are kept as Python tuples while lowering, so ``%3.0`` costs nothing.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lark
import numpy as np
from lark import Token, Tree

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import Loc, NxsatError, error
from nxsat.frontend.relay_consts import RelayConstants
from nxsat.frontend.relay_lower import (
    Attrs,
    Call,
    Emitter,
    find_lowering,
    relay_dtype,
    relay_type_str,
    supported_operators,
    value_type,
)
from nxsat.ir import (
    DIM_LIMIT,
    SHAPE_LIMITS_HINT,
    Computation,
    Module,
    Node,
    TensorType,
    TupleType,
    Type,
    shape_limit_problem,
)

__all__ = ["parse_relay", "supported_operators"]

# Limits that keep hostile or broken input from exhausting the host.
MAX_DEPTH = 100  # nesting of expressions, types and attribute lists
MAX_NODES = 1_000_000  # IR nodes per module (closure inlining could otherwise explode)

_INFIX = {
    "+": "add",
    "-": "subtract",
    "*": "multiply",
    "/": "divide",
    "<": "less",
    "<=": "less_equal",
    ">": "greater",
    ">=": "greater_equal",
    "==": "equal",
    "!=": "not_equal",
}
_ANNOTATION = re.compile(r"\s*/\*\s*ty=(.*?)\*/", re.DOTALL)
_METADATA = re.compile(r"^[ \t]*#\[metadata\][ \t]*$", re.MULTILINE)
_NUMBER = re.compile(r"(-?(?:inf|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?))(?:([fi])([0-9]*))?")
_FLOATS = {16: dt.F16, 32: dt.F32, 64: dt.F64}
_INTS = {8: dt.S8, 16: dt.S16, 32: dt.S32, 64: dt.S64}
# Expressions TVM's printer follows with `/* ty=T */` (calls, constants, tuples, projections).
_ANNOTATED = frozenset({"call", "binop", "tuple", "proj", "meta", "number", "boolean"})
_UNSUPPORTED_CONSTRUCTS = {
    "match_expr": "match expressions (algebraic data types)",
    "typedef": "type definitions (algebraic data types)",
    "ref_expr": "references (ref, ref_read, ref_write)",
    "adt_type": "algebraic data types",
    "fn_type": "function-typed values",
}


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    grammar = (Path(__file__).with_name("relay.lark")).read_text(encoding="utf-8")
    return lark.Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True, start=["start", "type"])


def parse_relay(
    text: str,
    filename: str,
    relay_constants: str | os.PathLike | Mapping[Any, Any] | None = None,
    seed: int = 0,
) -> Module:
    """Parse and lower a Relay text module; ``relay_constants`` gives ``meta[relay.Constant]`` values
    (a .npz or .json file, or a mapping from index to array) and ``seed`` fills a .json spec."""
    program, metadata, meta_line = _split_metadata(text)
    tree = _parse(program, filename)
    fallback = None
    if metadata is not None and relay_constants is None:
        from nxsat.frontend.relay_meta import read_metadata

        fallback = read_metadata(metadata, Loc(filename, meta_line, 1))
    constants = RelayConstants(relay_constants, seed, fallback)
    try:
        return _Lowerer(filename, program, tree, constants).module()
    except RecursionError:
        raise error(
            "NCC_EPRS001",
            f"the program nests more deeply than nxsat accepts ({MAX_DEPTH} levels)",
            Loc(filename),
            "bind subexpressions to %n = ... variables",
        ) from None


def _split_metadata(text: str) -> tuple[str, str | None, int]:
    """The program and its ``#[metadata]`` section (everything after that line), if any."""
    m = _METADATA.search(text)
    if m is None:
        return text, None, 0
    return text[: m.start()], text[m.end() :], text.count("\n", 0, m.start()) + 1


_OUTSIDE_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"?|/\*|//[^\n]*')
_INSIDE_COMMENT = re.compile(r"/\*|\*/")


def _blank_comments(text: str, filename: str) -> str:
    """``text`` with every comment replaced by spaces (newlines kept, so positions stay): ``//``
    to the end of the line, ``/* */`` nested as TVM's tokenizer nests them. Strings are skipped;
    one regex search per string or comment delimiter, so linear in the text."""
    if "/" not in text:
        return text
    out: list[str] = []
    done = pos = 0
    while (m := _OUTSIDE_COMMENT.search(text, pos)) is not None:
        pos = m.end()
        token = m.group()
        if token.startswith('"'):
            continue
        start = m.start()
        if token == "/*":
            depth = 1
            while depth:
                inner = _INSIDE_COMMENT.search(text, pos)
                if inner is None:
                    line = text.count("\n", 0, start) + 1
                    raise error(
                        "NCC_EPRS001",
                        "unterminated /* comment",
                        Loc(filename, line, start - (text.rfind("\n", 0, start) + 1) + 1),
                        "close it with */ (comments nest: each /* needs its own */)",
                    )
                depth += 1 if inner.group() == "/*" else -1
                pos = inner.end()
        out.append(text[done:start])
        out.append(re.sub(r"[^\n]", " ", text[start:pos]))
        done = pos
    out.append(text[done:])
    return "".join(out)


def _parse(text: str, filename: str) -> Tree:
    text = _blank_comments(text, filename)
    try:
        return _parser().parse(text, start="start")
    except lark.exceptions.UnexpectedCharacters as exc:
        ch = text[exc.pos_in_stream] if 0 <= exc.pos_in_stream < len(text) else "?"
        raise error("NCC_EPRS001", f"unexpected character {ch!r}", Loc(filename, exc.line, exc.column)) from None
    except lark.exceptions.UnexpectedToken as exc:
        tok = exc.token
        if tok.type == "$END":
            line, col = _end_position(text)
            raise error(
                "NCC_EPRS001",
                "unexpected end of text",
                Loc(filename, line, col),
                _expected_hint(exc.expected),
            ) from None
        raise error(
            "NCC_EPRS001",
            f"unexpected {_describe(tok)}",
            Loc(filename, tok.line, tok.column),
            _expected_hint(exc.expected),
        ) from None
    except lark.exceptions.UnexpectedEOF as exc:
        line, col = _end_position(text)
        raise error(
            "NCC_EPRS001", "unexpected end of text", Loc(filename, line, col), _expected_hint(exc.expected)
        ) from None
    except lark.exceptions.LarkError as exc:
        raise error("NCC_EPRS001", f"cannot parse: {str(exc).splitlines()[0][:200]}", Loc(filename)) from None


def _end_position(text: str) -> tuple[int, int]:
    line = text.count("\n") + 1
    return line, len(text) - (text.rfind("\n") + 1) + 1


_TOKEN_NAMES = {
    "LOCAL": "a %variable",
    "GLOBAL": "an @function",
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "PROJ": "a projection (.N)",
    "EQ_OP": "'=='",
    "REL_OP": "'<'",
    "ADD_OP": "'+'",
    "MUL_OP": "'*'",
    "VERSION": "#[version = ...]",
}


def _describe(tok: Token) -> str:
    v = str(tok)
    if tok.type in ("RAW_BLOCK", "RAW_HEAD"):  # lexed by the fallback lexer: show where it starts
        v = v.strip()[:1]
    return f"{v[:40]!r}" if v else tok.type


def _expected_hint(expected: Any) -> str | None:
    """What the parser would have accepted, spelled as in the text."""
    names = set()
    for name in expected or ():
        if name in _TOKEN_NAMES:
            names.add(_TOKEN_NAMES[name])
            continue
        try:
            pattern = _parser().get_terminal(name).pattern
        except KeyError:
            continue
        if pattern.type == "str":
            names.add(repr(pattern.value))
    ordered = sorted(names)
    if not ordered:
        return None
    return "expected " + ", ".join(ordered[:10]) + (" ..." if len(ordered) > 10 else "")


# --- values that only live during lowering ----------------------------------------------------


@dataclass
class _Closure:
    tree: Tree
    env: dict[str, Any]
    loc: Loc


@dataclass
class _OpRef:
    name: str


@dataclass
class _GlobalRef:
    name: str


@dataclass
class _Frame:
    """One IR computation being built."""

    builder: Builder
    em: Emitter
    consts: dict[int, Node] = field(default_factory=dict)


def _number(tok: Token, loc: Loc) -> tuple[int | float | bool, dt.DType]:
    """A Relay numeric literal: ``2`` int32, ``0i64``, ``2f`` float32, ``1e-05f``, ``3f16``, ``-inff``."""
    m = _NUMBER.fullmatch(str(tok))
    if m is None:
        raise error("NCC_EPRS003", f"malformed number {str(tok)!r}", loc)
    body, kind, bits = m.group(1), m.group(2), m.group(3)
    is_float_text = "inf" in body or "." in body or "e" in body or "E" in body
    if bits and len(bits) > 3:
        raise error("NCC_EPRS003", f"{str(tok)[:40]!r}: the width must be 8, 16, 32 or 64", loc)
    if kind == "f" or (kind is None and is_float_text):
        d = _FLOATS.get(int(bits) if bits else 32)
        if d is None:
            raise error("NCC_EPRS003", f"{str(tok)!r}: float width must be 16, 32 or 64", loc)
        return float(body), d
    if is_float_text:
        raise error("NCC_EPRS003", f"{str(tok)!r}: an integer suffix on a fractional number", loc)
    if len(body) > 21:  # longer than any int64: do not convert it
        raise error("NCC_EPRS003", f"integer {body[:24]}... does not fit int64", loc)
    value = int(body)
    if kind == "i":
        d = _INTS.get(int(bits) if bits else 32)
        if d is None:
            raise error("NCC_EPRS003", f"{str(tok)!r}: integer width must be 8, 16, 32 or 64", loc)
    else:
        d = dt.S32 if -(2**31) <= value < 2**31 else dt.S64
    info = np.iinfo(d.np)
    if not info.min <= value <= info.max:
        raise error("NCC_EPRS003", f"{str(tok)!r} does not fit {d.relay}", loc)
    return value, d


class _Lowerer:
    def __init__(self, filename: str, text: str, tree: Tree, constants: RelayConstants) -> None:
        self.filename = filename
        self.text = text
        self.tree = tree
        self.constants = constants
        self.reducers: dict[tuple[str, str], Computation] = {}
        self.globals: dict[str, Tree] = {}
        self.comps: dict[str, Computation] = {}
        self.building: list[str] = []
        self.nodes = 0
        self.warned_annotation = False
        self.annotation_types: dict[str, Type | None] = {}
        self.params: dict[int, tuple[str, Type | None]] = {}  # id of a param's tree (kept alive by self.tree)
        self.warnings: list[tuple[str, str, Loc | None]] = []

    def loc(self, item: Tree | Token | None) -> Loc:
        if isinstance(item, Token):
            return Loc(self.filename, item.line or 0, item.column or 0)
        if isinstance(item, Tree) and not item.meta.empty:
            return Loc(self.filename, item.meta.line, item.meta.column)
        return Loc(self.filename)

    # --- module --------------------------------------------------------------------------------
    def module(self) -> Module:
        version = None
        for item in self.tree.children:
            if isinstance(item, Token) and item.type == "VERSION":
                version = item
                continue
            if self.tree.data == "expr_module":
                continue
            if item.data == "typedef":
                raise self.unsupported(item)
            name_tok = item.children[0]
            name = str(name_tok)
            if name in self.globals:
                raise error("NCC_EPRS002", f"{name} is defined twice", self.loc(name_tok))
            self.globals[name] = item
        version_text = "0.0.5"
        if version is not None:
            v = re.search(r'"([^"]*)"', str(version))
            version_text = v.group(1) if v else version_text
            if v and v.group(1) != "0.0.5":
                self.warnings.append(
                    ("NCC_WPRS001", f"Relay text version {v.group(1)}; nxsat reads 0.0.5", self.loc(version))
                )
        if self.tree.data == "expr_module":
            self.comps["@main"] = self._expression_program()
        elif "@main" not in self.globals:
            raise error(
                "NCC_EPRS004",
                "no @main function" if self.globals else "no function definitions",
                Loc(self.filename, 1, 1),
                "the entry point must be def @main(...)",
            )
        for name in self.globals:  # type-check every definition, called or not
            self.global_computation(name, None)
        entry = self.comps["@main"]
        module = Module(
            Path(self.filename).stem or "main",
            entry,
            attrs={"relay_version": version_text},
            source=self.filename,
            framework="RELAY",
        )
        for code, message, loc in self.warnings:
            module.warnings.warn(code, message, loc)
        self._warn_int64(module)
        return module

    def _warn_int64(self, module: Module) -> None:
        wide = [p for p in module.params if any(t.dtype in (dt.S64, dt.U64) for t in p.type.leaves())]
        if wide:
            names = ", ".join(p.name for p in wide)
            module.warnings.warn(
                "NCC_WTYP001",
                f"64-bit integer inputs ({names}) run as 32-bit integers on the "
                "device; values outside the 32-bit range lose their high bits",
                wide[0].loc,
            )
            return
        for comp in module.computations.values():
            for n in comp.instructions:
                if any(t.dtype in (dt.S64, dt.U64) for t in n.type.leaves()):
                    module.warnings.warn(
                        "NCC_WTYP001",
                        "64-bit integer values run as 32-bit integers on the "
                        "device; values outside the 32-bit range lose their high bits",
                        n.loc,
                    )
                    return

    def unsupported(self, item: Tree) -> NxsatError:
        what = _UNSUPPORTED_CONSTRUCTS.get(item.data, item.data)
        return error(
            "NCC_EUOC002",
            f"unsupported Relay construct: {what}",
            self.loc(item),
            "nxsat lowers tensor programs: operators, tuples, let, fn closures that are called, if",
        )

    # --- global functions ----------------------------------------------------------------------
    def global_computation(self, name: str, loc: Loc | None) -> Computation:
        comp = self.comps.get(name)
        if comp is not None:
            return comp
        if name not in self.globals:
            raise error("NCC_EPRS002", f"undefined global function {name}", loc)
        if name in self.building:
            raise error(
                "NCC_EUOC002",
                f"unsupported Relay construct: recursive function {name}",
                loc,
                "nxsat compiles graphs without recursion",
            )
        self.building.append(name)
        try:
            tree = self.globals[name]
            comp = self._lower_function(name, tree.children[1:], self.loc(tree))
        finally:
            self.building.pop()
        self.comps[name] = comp
        return comp

    def _expression_program(self) -> Computation:
        """@main of a text that is one expression, as TVM prints a function (``fn (...) {...}``:
        its parameters are main's) or an expression (``free_var %x: T;`` lines: they are)."""
        *free, seq = [c for c in self.tree.children if isinstance(c, Tree)]
        stmts = seq.children
        if not free and len(stmts) == 1 and isinstance(stmts[0], Tree) and stmts[0].data == "fn_expr":
            fn = stmts[0]
            return self._lower_function("@main", fn.children, self.loc(fn))
        params = Tree("params", free, meta=free[0].meta) if free else None
        return self._lower_function("@main", [params, Tree("block", [seq], meta=seq.meta)], self.loc(seq))

    def _lower_function(self, name: str, children: list[Any], loc: Loc) -> Computation:
        """One computation from a function's parts: type parameters, parameters (and function
        attributes), return type, body block."""
        kids = [c for c in children if c is not None]
        if any(isinstance(c, Tree) and c.data == "type_params" for c in kids):
            raise error("NCC_EUOC002", f"unsupported Relay construct: generic function {name}", loc)
        builder = Builder(name.lstrip("@"), loc)
        frame = _Frame(builder, Emitter(builder, self.reducers, loc))
        env: dict[str, Any] = {}
        ret_tree = None
        for c in kids:
            if c.data == "params":
                for p in c.children:
                    if p.data == "attr":
                        self._function_attr(p)
                        continue
                    pname, ptype = self._param(p, depth=0)
                    if ptype is None:
                        raise error(
                            "NCC_EVRF064",
                            f"free variable {pname} needs a type"
                            if p.data == "free_var"
                            else f"parameter {pname} of {name} needs a type",
                            self.loc(p),
                            "write %x: Tensor[(...), dtype]",
                        )
                    if pname in env:
                        raise error("NCC_EPRS002", f"parameter {pname} is declared twice", self.loc(p))
                    env[pname] = builder.param(ptype, name=pname.lstrip("%"), loc=self.loc(p))
            elif c.data == "ret_type":
                ret_tree = c
        body = kids[-1]
        result = self.block(body, env, frame, 0)
        root = self._materialize(result, frame, self.loc(body))
        if ret_tree is not None:
            want = self.type(ret_tree.children[0], 0)
            if want is not None and not _type_matches(root.type, want):
                raise error(
                    "NCC_EVRF064",
                    f"{name} returns {relay_type_str(root.type)} but is declared to return {relay_type_str(want)}",
                    self._result_loc(body),
                )
        return builder.build(root)

    def _result_loc(self, block: Tree) -> Loc:
        seq = block.children[0]
        return self.loc(seq.children[-1])

    def _function_attr(self, attr: Tree) -> None:
        # Function attributes (Primitive=1, Compiler="...", virtual_device=meta[VirtualDevice][0])
        # describe TVM's partitioning and device placement; the graph is the same without them.
        # Their values must still be well formed (a metadata reference is left unread).
        value = attr.children[1]
        if not (isinstance(value, Tree) and value.data == "meta"):
            self.attr_value(value, 0)

    def _param(self, p: Tree, depth: int) -> tuple[str, Type | None]:
        """A parameter's name and type: the declared one, else the printer's ``/* ty=T */``
        (worked out once per parameter: an inlined closure's are read at every call)."""
        key = id(p)
        if key not in self.params:
            self.params[key] = self._read_param(p, depth)
        return self.params[key]

    def _read_param(self, p: Tree, depth: int) -> tuple[str, Type | None]:
        name = str(p.children[0])
        rest = [c for c in p.children[1:] if c is not None]
        for c in rest:
            if isinstance(c, Tree) and c.data == "device_attrs":  # device placement: same graph
                for a in c.children:
                    if a is not None:
                        self._function_attr(a)
        kinds = [c for c in rest if not (isinstance(c, Tree) and c.data == "device_attrs")]
        ty = self.type(kinds[0], depth) if kinds else None
        noted = self._annotation(p)
        if ty is None:
            return name, noted
        if noted is not None and noted != ty:
            raise error(
                "NCC_EVRF064",
                f"{name} is declared {relay_type_str(ty)} but the text annotates it /* ty={relay_type_str(noted)} */",
                self.loc(p),
                "the annotation is what TVM inferred; the text may have been edited",
            )
        return name, ty

    def _materialize(self, v: Any, frame: _Frame, loc: Loc) -> Node:
        """A value as one IR node (Relay tuples become tuple nodes)."""
        if isinstance(v, Node):
            return v
        if isinstance(v, tuple):
            parts = [self._materialize(e, frame, loc) for e in v]
            self._count(1, loc)
            return frame.builder.op("tuple", parts, loc=loc)
        raise self._not_a_value(v, loc)

    def _not_a_value(self, v: Any, loc: Loc) -> NxsatError:
        """The error for a closure, operator or global function where a tensor is needed."""
        if isinstance(v, _OpRef):
            return error(
                "NCC_EUOC002",
                f"unsupported Relay construct: the operator {v.name} used as a value",
                loc,
                f"call it: {v.name}(...)",
            )
        return error(
            "NCC_EUOC002",
            f"unsupported Relay construct: a {self._kind(v)} used as a value",
            loc,
            "only tensors and tuples of tensors can flow between functions",
        )

    @staticmethod
    def _kind(v: Any) -> str:
        return {_Closure: "closure", _OpRef: "operator", _GlobalRef: "global function"}.get(type(v), "value")

    # --- statements ----------------------------------------------------------------------------
    def block(self, block: Tree, env: dict[str, Any], frame: _Frame, depth: int) -> Any:
        seq = block.children[0]
        scope = dict(env)
        bound: set[str] = set()  # graph variables bound in this block (outer ones may be reused)
        stmts = seq.children
        for i, st in enumerate(stmts):
            last = i == len(stmts) - 1
            if isinstance(st, Tree) and st.data in ("binding", "let_binding"):
                if last:
                    raise error(
                        "NCC_EPRS001",
                        "a block must end with an expression, not a binding",
                        self.loc(st),
                        "add the result, e.g. the variable just bound",
                    )
                self.binding(st, scope, bound, frame, depth)
            else:
                value = self.expr(st, scope, frame, depth + 1, check=not last)
                if last:
                    self._check_annotation(st, value)
                    return value
        raise error("NCC_EPRS001", "empty block", self.loc(block))  # unreachable: the grammar needs one

    def binding(self, st: Tree, env: dict[str, Any], bound: set[str], frame: _Frame, depth: int) -> None:
        name_tok = st.children[0]
        name = str(name_tok)
        ty_tree = st.children[1] if len(st.children) == 3 else None
        expr = st.children[-1]
        if st.data == "binding":
            if name in bound:
                raise error("NCC_EPRS002", f"{name} is bound twice", self.loc(st), "use a new name, or let to shadow")
            bound.add(name)
        before = len(frame.builder.nodes)
        value = self.expr(expr, env, frame, depth + 1, check=False)
        if isinstance(value, Node) and value in frame.builder.nodes[before:]:
            value.name = name.lstrip("%")
        if ty_tree is not None:
            want = self.type(ty_tree, depth)
            got = self._type_of(value, st)
            if want is not None and not _type_matches(got, want):
                raise error(
                    "NCC_EVRF064",
                    f"{name} is declared {relay_type_str(want)} but its value is {relay_type_str(got)}",
                    self.loc(st),
                )
        self._check_annotation(st, value)
        env[name] = value

    def _type_of(self, value: Any, where: Tree) -> Type:
        if isinstance(value, _Closure | _OpRef | _GlobalRef):
            raise error(
                "NCC_EUOC002",
                f"unsupported Relay construct: a typed {self._kind(value)} binding",
                self.loc(where),
            )
        return value_type(value)

    def _annotation(self, item: Tree | Token) -> Type | None:
        """The type in the printer's ``/* ty=T */`` right after ``item``, if there is one."""
        end = item.end_pos if isinstance(item, Token) else (None if item.meta.empty else item.meta.end_pos)
        if end is None:
            return None
        m = _ANNOTATION.match(self.text, end)
        return None if m is None else self._annotation_type(m.group(1), self.loc(item))

    def _check_annotation(self, item: Tree, value: Any) -> None:
        """Check the printer's ``/* ty=T */`` right after ``item`` against the inferred type."""
        if isinstance(value, _Closure | _OpRef | _GlobalRef):
            return
        want = self._annotation(item)
        if want is None:
            return
        got = value_type(value)
        if _type_matches(got, want):
            return
        if item.data == "meta" and isinstance(value, Node):
            raise error(
                "NCC_ERLY003",
                f"{value.name.replace('meta_constant_', 'meta[relay.Constant][')}] from {self.constants.name} "
                f"is {relay_type_str(got)} but the text annotates it /* ty={relay_type_str(want)} */",
                self.loc(item),
                "the constants file does not belong to this model, or is in another order",
            )
        raise error(
            "NCC_EVRF064",
            f"value is {relay_type_str(got)} but the text annotates it /* ty={relay_type_str(want)} */",
            self.loc(item),
            "the annotation is what TVM inferred; the text may have been edited",
        )

    def _annotation_type(self, body: str, loc: Loc) -> Type | None:
        """The type an annotation names (parsed once per distinct spelling: a printed model
        repeats a few types thousands of times)."""
        text = _type_prefix(body)
        if text is None:
            return None
        if text in self.annotation_types:
            return self.annotation_types[text]
        try:
            ty = self.type(_parser().parse(text, start="type"), 0)
        except (lark.exceptions.LarkError, NxsatError):
            ty = None
        if len(self.annotation_types) < 100_000:
            self.annotation_types[text] = ty
        if ty is None:
            if not self.warned_annotation:
                self.warned_annotation = True
                self.warnings.append(
                    ("NCC_WPRS001", f"type annotation /* ty={text[:60]} */ not understood; not checked", loc)
                )
        return ty

    # --- expressions ---------------------------------------------------------------------------
    def expr(self, t: Tree | Token, env: dict[str, Any], frame: _Frame, depth: int, check: bool = True) -> Any:
        """The value of an expression, checked against the printer's ``/* ty=T */`` after it
        (unless the caller checks it with its own location: bindings and block results)."""
        value = self._expr(t, env, frame, depth)
        if check and isinstance(t, Tree) and t.data in _ANNOTATED:
            self._check_annotation(t, value)
        return value

    def _expr(self, t: Tree | Token, env: dict[str, Any], frame: _Frame, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise error(
                "NCC_EPRS001",
                f"expression nested more than {MAX_DEPTH} levels deep",
                self.loc(t),
                "bind subexpressions to %n = ... variables",
            )
        if isinstance(t, Token):  # pragma: no cover - the grammar wraps every token in a rule
            raise error("NCC_EPRS001", f"unexpected {t!s}", self.loc(t))
        kind = t.data
        if kind == "var":
            name = str(t.children[0])
            if name not in env:
                raise error("NCC_EPRS002", f"undefined variable {name}", self.loc(t))
            return env[name]
        if kind == "gvar":
            return _GlobalRef(str(t.children[0]))
        if kind == "opname":
            return _OpRef(str(t.children[0]))
        if kind == "number":
            value, d = _number(t.children[0], self.loc(t))
            return self._scalar(frame, value, d, self.loc(t))
        if kind == "boolean":
            return self._scalar(frame, str(t.children[0]) == "True", dt.PRED, self.loc(t))
        if kind == "meta":
            return self.meta(t, frame)
        if kind == "unit":
            return ()
        if kind == "tuple":
            fields = [(c, self.expr(c, env, frame, depth + 1)) for c in t.children if c is not None]
            for c, v in fields:
                if isinstance(v, _Closure | _OpRef | _GlobalRef):
                    raise self._not_a_value(v, self.loc(c))
            return tuple(v for _, v in fields)
        if kind == "proj":
            proj = t.children[1]
            value = self.expr(t.children[0], env, frame, depth + 1)
            index, _ = _number(Token("NUMBER", str(proj)[1:]), self.loc(proj))
            return self.project(value, index, self.loc(proj), frame)
        if kind == "call":
            return self.call(t, env, frame, depth)
        if kind == "binop":
            left, op_tok, right = t.children
            a = self.expr(left, env, frame, depth + 1)
            b = self.expr(right, env, frame, depth + 1)
            return self.apply_op(_INFIX[str(op_tok)], [a, b], {}, {}, self.loc(op_tok), frame)
        if kind == "block":
            return self.block(t, env, frame, depth + 1)
        if kind == "paren_seq":  # `(let %x = ...; %x)`: the printer's form of a let used as a value
            return self.block(Tree("block", [Tree("seq", t.children, meta=t.meta)], meta=t.meta), env, frame, depth + 1)
        if kind == "fn_expr":
            return _Closure(t, env, self.loc(t))
        if kind == "if_expr":
            return self.if_expr(t, env, frame, depth)
        if kind in _UNSUPPORTED_CONSTRUCTS:
            raise self.unsupported(t)
        raise error("NCC_EPRS001", f"unexpected {kind}", self.loc(t))  # pragma: no cover

    def _scalar(self, frame: _Frame, value: Any, d: dt.DType, loc: Loc) -> Node:
        self._count(1, loc)
        return frame.builder.constant(dt.cast(np.asarray(value), d), d, loc=loc)

    def _count(self, n: int, loc: Loc | None) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            raise error(
                "NCC_EVRF007",
                f"the program lowers to more than {MAX_NODES} operations",
                loc,
                "closures are inlined at every call; call a global function instead",
            )

    def meta(self, t: Tree, frame: _Frame) -> Node:
        kind_tok, index_tok = t.children
        loc = self.loc(t)
        if str(kind_tok) != "relay.Constant":
            raise error(
                "NCC_EPRS003",
                f"meta[{kind_tok}] is not supported here",
                loc,
                "only meta[relay.Constant][i] names values",
            )
        index, _ = _number(index_tok, loc)
        if not isinstance(index, int) or index < 0:
            raise error(
                "NCC_EPRS003",
                f"meta[relay.Constant][{index_tok}]: the index must be a non-negative integer",
                loc,
            )
        node = frame.consts.get(index)
        if node is None:
            value = self.constants.get(index, loc)
            d = dt.from_numpy(value.dtype)
            node = frame.builder.constant(value, d, name=f"meta_constant_{index}", loc=loc)
            self._count(1, loc)
            frame.consts[index] = node
        return node

    def project(self, v: Any, index: int, loc: Loc, frame: _Frame) -> Any:
        """Field ``index`` of a tuple value (a get-tuple-element only for tuple-typed IR nodes)."""
        if isinstance(v, tuple):
            if index >= len(v):
                raise error("NCC_EVRF064", f"projection .{index} out of range for a {len(v)}-tuple", loc)
            return v[index]
        if isinstance(v, Node) and isinstance(v.type, TupleType):
            if index >= len(v.type.elements):
                raise error("NCC_EVRF064", f"projection .{index} out of range for a {len(v.type.elements)}-tuple", loc)
            self._count(1, loc)
            return frame.builder.op("get-tuple-element", [v], loc=loc, index=index)
        what = relay_type_str(v.type) if isinstance(v, Node) else f"a {self._kind(v)}"
        raise error("NCC_EVRF064", f"projection .{index} of {what}, which is not a tuple", loc)

    def call(self, t: Tree, env: dict[str, Any], frame: _Frame, depth: int) -> Any:
        callee_tree, args_tree = t.children
        callee = self.expr(callee_tree, env, frame, depth + 1)
        loc = self.loc(t)
        args: list[Any] = []
        attrs: dict[str, Any] = {}
        attr_locs: dict[str, Loc] = {}
        for a in args_tree.children if args_tree is not None else []:
            if isinstance(a, Tree) and a.data == "attr":
                key = str(a.children[0])
                if key in attrs:
                    raise error("NCC_EPRS003", f"attribute {key} is given twice", self.loc(a))
                attrs[key] = self.attr_value(a.children[1], depth)
                attr_locs[key] = self.loc(a)
            else:
                if attrs:
                    raise error("NCC_EPRS001", "positional argument after attributes", self.loc(a))
                args.append(self.expr(a, env, frame, depth + 1))
        if isinstance(callee, _OpRef):
            return self.apply_op(callee.name, args, attrs, attr_locs, loc, frame)
        if attrs:
            raise error(
                "NCC_EPRS003",
                f"attributes are only given to operators, not to a {self._kind(callee)}",
                attr_locs[next(iter(attrs))],
            )
        if isinstance(callee, _GlobalRef):
            comp = self.global_computation(callee.name, loc)
            operands = [self._materialize(a, frame, loc) for a in args]
            if len(operands) != len(comp.params):
                raise error(
                    "NCC_EVRF064",
                    f"{callee.name} takes {len(comp.params)} arguments, got {len(operands)}",
                    loc,
                )
            for i, (o, p) in enumerate(zip(operands, comp.params)):
                if o.type != p.type:
                    raise error(
                        "NCC_EVRF064",
                        f"argument {i} of {callee.name} is {relay_type_str(o.type)}, "
                        f"the parameter is {relay_type_str(p.type)}",
                        loc,
                    )
            self._count(1, loc)
            return frame.builder.op("call", operands, loc=loc, to_apply=comp)
        if isinstance(callee, _Closure):
            return self.inline(callee, args, loc, frame, depth)
        raise error("NCC_EVRF064", "called value is not a function", loc)

    def inline(self, fn: _Closure, args: list[Any], loc: Loc, frame: _Frame, depth: int) -> Any:
        kids = [c for c in fn.tree.children if c is not None]
        if any(isinstance(c, Tree) and c.data == "type_params" for c in kids):
            raise error("NCC_EUOC002", "unsupported Relay construct: generic closure", fn.loc)
        scope = dict(fn.env)
        params = [p for c in kids if c.data == "params" for p in c.children]
        formal = [p for p in params if p.data == "param"]
        for p in params:
            if p.data == "attr":
                self._function_attr(p)
        if len(formal) != len(args):
            raise error("NCC_EVRF064", f"the closure takes {len(formal)} arguments, got {len(args)}", loc)
        for p, a in zip(formal, args):
            pname, ptype = self._param(p, depth)
            if ptype is not None:
                got = self._type_of(a, p)
                if not _type_matches(got, ptype):
                    raise error(
                        "NCC_EVRF064",
                        f"argument for {pname} is {relay_type_str(got)}, the parameter is {relay_type_str(ptype)}",
                        loc,
                    )
            scope[pname] = a
        body = kids[-1]
        result = self.block(body, scope, frame, depth + 1)
        for c in kids:
            if c.data == "ret_type":
                want = self.type(c.children[0], depth)
                got = self._type_of(result, body)
                if want is not None and not _type_matches(got, want):
                    raise error(
                        "NCC_EVRF064",
                        f"the closure returns {relay_type_str(got)} but is declared to return {relay_type_str(want)}",
                        self._result_loc(body),
                    )
        return result

    def if_expr(self, t: Tree, env: dict[str, Any], frame: _Frame, depth: int) -> Any:
        cond_tree, then_tree, else_tree = t.children
        loc = self.loc(t)
        cond = self.expr(cond_tree, env, frame, depth + 1)
        if not isinstance(cond, Node) or cond.type != TensorType(dt.PRED, ()):
            got = relay_type_str(value_type(cond)) if isinstance(cond, Node | tuple) else self._kind(cond)
            raise error("NCC_EVRF064", f"if: the condition must be a bool scalar, got {got}", self.loc(cond_tree))
        a = self.block(then_tree, env, frame, depth + 1)
        b = self.block(else_tree, env, frame, depth + 1)
        ta, tb = self._type_of(a, then_tree), self._type_of(b, else_tree)
        if ta != tb:
            raise error(
                "NCC_EVRF064",
                f"if: the branches differ in type ({relay_type_str(ta)} vs {relay_type_str(tb)})",
                loc,
            )
        em = frame.em
        em.loc = loc

        def parts(v: Any, n: int) -> list[Any]:
            return list(v) if isinstance(v, tuple) else [self.project(v, i, loc, frame) for i in range(n)]

        def pick(x: Any, y: Any) -> Any:
            t = value_type(x)
            if isinstance(t, TupleType):
                n = len(t.elements)
                return tuple(pick(u, w) for u, w in zip(parts(x, n), parts(y, n)))
            return x if x is y else em.op("select", [cond, x, y])

        return pick(a, b)

    def apply_op(
        self,
        name: str,
        args: list[Any],
        attrs: dict[str, Any],
        attr_locs: dict[str, Loc],
        loc: Loc,
        frame: _Frame,
    ) -> Any:
        for i, a in enumerate(args):
            if isinstance(a, _Closure | _OpRef | _GlobalRef):
                raise error(
                    "NCC_EUOC002",
                    f"unsupported Relay construct: a {self._kind(a)} passed to {name} (argument {i})",
                    loc,
                )
        # A tuple-typed IR value (a call's result) becomes a Relay tuple of its fields.
        args = [self._fields(a, loc, frame) for a in args]
        fn = find_lowering(name)
        if fn is None:
            raise _unsupported_op(name, loc)
        em = frame.em
        em.loc = loc
        call = Call(name, args, Attrs(name, attrs, attr_locs, loc), loc)
        before = len(frame.builder.nodes)
        try:
            result = fn(em, call)
            call.attrs.finish()
        except NxsatError as exc:
            if exc.code == "NCC_EVRF064" and exc.hint is None:
                exc.hint = self._constant_hint(args)
            raise
        self._count(len(frame.builder.nodes) - before, loc)
        return result

    def _fields(self, v: Any, loc: Loc, frame: _Frame) -> Any:
        if isinstance(v, Node) and isinstance(v.type, TupleType):
            return tuple(self._fields(self.project(v, i, loc, frame), loc, frame) for i in range(len(v.type.elements)))
        return v

    def _constant_hint(self, args: list[Any]) -> str | None:
        notes = [
            f"{a.name.replace('meta_constant_', 'meta[relay.Constant][')}] is {relay_type_str(a.type)} "
            f"from {self.constants.name}"
            for a in args
            if isinstance(a, Node) and a.op == "constant" and a.name.startswith("meta_constant_")
        ]
        return "; ".join(notes) if notes else None

    # --- attributes and types ------------------------------------------------------------------
    def attr_value(self, t: Tree | None, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise error("NCC_EPRS001", f"attribute value nested more than {MAX_DEPTH} levels", self.loc(t))
        if t is None:
            return None
        kind = t.data
        if kind == "number":
            return _number(t.children[0], self.loc(t))[0]
        if kind == "string":
            return _unquote(str(t.children[0]), self.loc(t))
        if kind == "boolean":
            return str(t.children[0]) == "True"
        if kind == "none":
            return None
        if kind == "ident":
            return str(t.children[0])
        if kind == "alist":
            return [self.attr_value(c, depth + 1) for c in t.children if c is not None]
        if kind == "meta":
            raise error(
                "NCC_EPRS003",
                "attributes from the metadata table (meta[...]) are not supported",
                self.loc(t),
                "write the attributes in the call",
            )
        raise error("NCC_EPRS003", f"unexpected attribute value {kind}", self.loc(t))  # pragma: no cover

    def type(self, t: Tree | Token | None, depth: int) -> Type | None:
        """An IR type for a Relay type; None for ``_`` (to be inferred)."""
        if depth > MAX_DEPTH:
            raise error("NCC_EPRS001", f"type nested more than {MAX_DEPTH} levels", self.loc(t))
        if t is None:
            return None
        kind = t.data
        if kind == "tensor_type":
            shape_tree, dtype_tok = t.children
            shape = self.shape(shape_tree)
            problem = shape_limit_problem(shape)
            if problem:
                raise error("NCC_ESHP001", f"Tensor[({', '.join(map(str, shape[:8]))}"
                            f"{', ...' if len(shape) > 8 else ''})]: {problem}", self.loc(t), SHAPE_LIMITS_HINT)
            return TensorType(relay_dtype(str(dtype_tok), self.loc(dtype_tok)), shape)
        if kind == "named_type":
            name = str(t.children[0])
            if name[:1].isupper():
                raise self.unsupported(Tree("adt_type", [], t.meta))
            return TensorType(relay_dtype(name, self.loc(t)), ())
        if kind == "tuple_type":
            elems = [self.type(c, depth + 1) for c in t.children if c is not None]
            if any(e is None for e in elems):
                raise error("NCC_EPRS003", "'_' inside a tuple type is not supported", self.loc(t))
            return TupleType(tuple(elems))  # type: ignore[arg-type]
        if kind == "incomplete_type":
            return None
        if kind in _UNSUPPORTED_CONSTRUCTS:
            raise self.unsupported(t)
        raise error("NCC_EPRS003", f"unexpected type {kind}", self.loc(t))  # pragma: no cover

    def shape(self, t: Tree) -> tuple[int, ...]:
        dims = []
        for d in t.children:
            if d is None:
                continue
            if isinstance(d, Tree):
                raise error(
                    "NCC_EMOD025",
                    "dynamic shapes: every dimension must be static",
                    self.loc(d),
                    "give the dimension's value instead of ? or meta[...]",
                )
            digits = re.match(r"\d+", str(d))
            if digits and (len(digits.group()) > 40 or int(digits.group()) >= DIM_LIMIT):
                shown = digits.group() if len(digits.group()) <= 40 else digits.group()[:20] + "..."
                raise error("NCC_ESHP001", f"dimension {shown} is not below 2^40", self.loc(d), SHAPE_LIMITS_HINT)
            value, dtype = _number(d, self.loc(d))
            if not dtype.is_int or not isinstance(value, int) or value < 0:
                raise error("NCC_EPRS003", f"dimension {d!s} must be a non-negative integer", self.loc(d))
            dims.append(value)
        return tuple(dims)


def _type_matches(got: Type, want: Type | None) -> bool:
    return want is None or got == want


def _unquote(s: str, loc: Loc) -> str:
    body = s[1:-1]
    try:
        return body.encode("latin-1", "backslashreplace").decode("unicode_escape") if "\\" in body else body
    except UnicodeDecodeError:
        raise error("NCC_EPRS003", f"malformed string {s[:40]!r}", loc) from None


def _type_prefix(text: str) -> str | None:
    """The type at the start of an annotation (``Tensor[...]`` or ``(...)`` or a dtype), without
    whatever the printer put after it (spans)."""
    text = text.strip()
    if not text:
        return None
    if text[0].isalpha() and not text.startswith("Tensor"):
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text)
        return m.group(0) if m else None
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                return text[: i + 1]
            if depth < 0:
                return None
    return None


def _unsupported_op(name: str, loc: Loc) -> NxsatError:
    if name.startswith("dyn."):
        return error(
            "NCC_EMOD025",
            f"{name}: dynamic shapes are not supported",
            loc,
            "give shapes as attributes (the static form of the operator)",
        )
    if name.startswith("qnn."):
        return error(
            "NCC_EUOC002",
            f"unsupported Relay operator {name} (quantized operators)",
            loc,
            "dequantize to float before compiling",
        )
    if name[:1].isupper():
        return error("NCC_EUOC002", f"unsupported Relay construct: constructor {name} (algebraic data types)", loc)
    return error(
        "NCC_EUOC002",
        f"unsupported Relay operator {name}",
        loc,
        "see docs/relay.md for the operators nxsat lowers",
    )

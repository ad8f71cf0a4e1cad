"""S-expressions with source positions: the reader behind rule files.

Rule files are egglog text; reading them here first (instead of handing the text straight to
egglog) gives every form a file:line for diagnostics, lets the rule compiler read the metadata
keywords (``:name :tag :doc ...``) and expand macros, and gives the rule checker the left-hand
side as data.
"""

from __future__ import annotations

from dataclasses import dataclass

from nxsat.diagnostics import Loc, error

MAX_DEPTH = 200  # nesting deeper than this in a rule file is a mistake, not a rule


@dataclass(frozen=True, slots=True)
class Atom:
    """A symbol, string, integer or float; ``text`` is the spelling (strings without quotes)."""

    text: str
    kind: str  # "sym" | "str" | "int" | "float"
    loc: Loc | None = None

    def __str__(self) -> str:
        if self.kind == "str":
            return '"' + self.text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return self.text

    @property
    def value(self) -> object:
        if self.kind == "int":
            return int(self.text)
        if self.kind == "float":
            return float(self.text)
        return self.text


@dataclass(frozen=True, slots=True)
class SList:
    items: tuple[Atom | SList, ...]
    loc: Loc | None = None

    def __str__(self) -> str:
        return "(" + " ".join(str(i) for i in self.items) + ")"

    @property
    def head(self) -> str | None:
        return self.items[0].text if self.items and isinstance(self.items[0], Atom) else None


SExp = Atom | SList


def sym(text: str, loc: Loc | None = None) -> Atom:
    return Atom(text, "sym", loc)


def is_sym(x: SExp, text: str | None = None) -> bool:
    return isinstance(x, Atom) and x.kind == "sym" and (text is None or x.text == text)


def _atom(text: str, loc: Loc) -> Atom:
    try:
        int(text)
        return Atom(text, "int", loc)
    except ValueError:
        pass
    if any(c.isdigit() for c in text) and text[0] in "+-.0123456789":
        try:
            float(text)
            return Atom(text, "float", loc)
        except ValueError:
            pass
    return Atom(text, "sym", loc)


def read(text: str, filename: str) -> list[SExp]:
    """All top-level forms of ``text``; NCC_ERUL001 (with file:line:col) on malformed input."""
    forms: list[SExp] = []
    stack: list[tuple[list[SExp], Loc]] = []
    i, n = 0, len(text)
    line, col = 1, 1

    def here() -> Loc:
        return Loc(filename, line, col)

    while i < n:
        c = text[i]
        if c == "\n":
            i += 1
            line, col = line + 1, 1
            continue
        if c.isspace():
            i += 1
            col += 1
            continue
        if c == ";":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "(":
            if len(stack) >= MAX_DEPTH:
                raise error("NCC_ERUL001", f"forms nested deeper than {MAX_DEPTH}", here())
            stack.append(([], here()))
            i += 1
            col += 1
            continue
        if c == ")":
            if not stack:
                raise error("NCC_ERUL001", "unbalanced ')'", here())
            items, start = stack.pop()
            node = SList(tuple(items), start)
            (stack[-1][0] if stack else forms).append(node)
            i += 1
            col += 1
            continue
        start = here()
        if c == '"':
            j = i + 1
            buf: list[str] = []
            while j < n and text[j] != '"':
                if text[j] == "\n":
                    raise error("NCC_ERUL001", "string runs past the end of the line", start)
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j + 1])
                    j += 2
                else:
                    buf.append(text[j])
                    j += 1
            if j >= n:
                raise error("NCC_ERUL001", "unterminated string", start)
            atom: SExp = Atom("".join(buf), "str", start)
            col += j + 1 - i
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in '();"':
                j += 1
            atom = _atom(text[i:j], start)
            col += j - i
            i = j
        (stack[-1][0] if stack else forms).append(atom)
    if stack:
        raise error("NCC_ERUL001", "unbalanced '(': this form is never closed", stack[-1][1])
    return forms


def substitute(x: SExp, env: dict[str, SExp]) -> SExp:
    """Replace symbols bound in ``env`` (macro parameters) by their values."""
    if isinstance(x, Atom):
        return env.get(x.text, x) if x.kind == "sym" else x
    return SList(tuple(substitute(i, env) for i in x.items), x.loc)


def symbols(x: SExp) -> set[str]:
    """Every symbol in ``x`` (heads included)."""
    if isinstance(x, Atom):
        return {x.text} if x.kind == "sym" else set()
    out: set[str] = set()
    for i in x.items:
        out |= symbols(i)
    return out

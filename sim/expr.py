"""Cost formulas as data: a tiny arithmetic language for the target specs.

A target spec writes each instruction's cost as a formula (``"max(MIN_II, N) + MIN_II"``) so that
the numbers live beside the facts they come from, not in code. Formulas are parsed with Python's
``ast`` and accepted only if every node is arithmetic, a comparison, a conditional, a number, a
variable or one of a few functions; anything else (attributes, subscripts, lambdas, strings) is
refused, so a spec can never run code.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping

from nxsat.diagnostics import error

FUNCTIONS: dict[str, Callable[..., float]] = {
    "max": max,
    "min": min,
    "ceil": lambda x: float(math.ceil(x)),
    "floor": lambda x: float(math.floor(x)),
    "log2": math.log2,
}

_ALLOWED = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Name,
    ast.Constant, ast.Load,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
    ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
)


class Formula:
    """A checked formula; ``formula(vars)`` evaluates it. ``names`` are the variables it reads."""

    __slots__ = ("text", "names", "_code")

    def __init__(self, text: str, where: str = "formula") -> None:
        if not isinstance(text, (str, int, float)) or isinstance(text, bool):
            raise error("NCC_ETGT001", f"{where}: a formula must be a string or a number, got {text!r}")
        self.text = str(text)
        if len(self.text) > 1000:
            raise error("NCC_ETGT001", f"{where}: formula longer than 1000 characters")
        try:
            tree = ast.parse(self.text, mode="eval")
        except SyntaxError as exc:
            raise error("NCC_ETGT001", f"{where}: cannot parse formula {self.text!r}: {exc.msg}") from None
        names: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, _ALLOWED):
                raise error("NCC_ETGT001", f"{where}: {type(node).__name__} is not allowed in a formula "
                            f"({self.text!r})", hint="use numbers, variables, + - * / // % **, "
                            "comparisons, 'a if c else b' and " + ", ".join(sorted(FUNCTIONS)))
            if isinstance(node, ast.Constant) and (isinstance(node.value, bool)
                                                    or not isinstance(node.value, (int, float))):
                raise error("NCC_ETGT001", f"{where}: only numeric constants are allowed ({self.text!r})")
            if isinstance(node, ast.Call):
                if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                    raise error("NCC_ETGT001", f"{where}: unknown function in {self.text!r}",
                                hint="functions: " + ", ".join(sorted(FUNCTIONS)))
            elif isinstance(node, ast.Name):
                names.add(node.id)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                names.discard(node.func.id)  # type: ignore[union-attr]
        self.names = frozenset(names)
        # Every node has been checked above: the compiled code can only do arithmetic. All of it is
        # in floats (constants here, variables and ceil/floor when called), so that a huge power
        # overflows at once instead of growing an integer without bound.
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant):
                node.value = float(node.value)
        self._code = compile(tree, f"<{where}>", "eval")

    def __call__(self, variables: Mapping[str, float]) -> float:
        missing = self.names - variables.keys()
        if missing:
            raise error("NCC_ETGT001", f"formula {self.text!r} uses unknown variable(s) "
                        + ", ".join(sorted(missing)))
        scope = {**FUNCTIONS, **{k: float(variables[k]) for k in self.names}}
        try:
            value = eval(self._code, {"__builtins__": {}}, scope)  # noqa: S307 - checked AST, see class doc
        except (ZeroDivisionError, OverflowError, ValueError, TypeError) as exc:
            raise error("NCC_ETGT001", f"formula {self.text!r} failed: {exc}") from None
        return float(value)

    def __repr__(self) -> str:
        return f"Formula({self.text!r})"

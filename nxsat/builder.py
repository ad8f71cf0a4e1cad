"""Build IR graphs from Python: front ends, passes and tests all make nodes through here, so every
node's type comes from the registry's shape rule (a wrong graph fails where it is built).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import Loc, error
from nxsat.ir import Computation, Module, Node, TensorType, Type
from nxsat.ops import registry
from nxsat.ops.registry import ShapeError


def infer_type(op: str, operands: Sequence[Node], attrs: dict[str, Any], loc: Loc | None = None) -> Type:
    """The result type of ``op`` applied to ``operands``; NCC_EUOC002 / NCC_EVRF064 on failure."""
    opdef = registry.get(op)
    if opdef is None:
        raise error("NCC_EUOC002", f"unsupported operator {op}", loc, "see nxsat list-operators")
    lo, hi = opdef.arity
    if len(operands) < lo or (hi is not None and len(operands) > hi):
        want = f"{lo}" if lo == hi else f"{lo} to {hi if hi is not None else 'any'}"
        raise error("NCC_EVRF064", f"{op} takes {want} operands, got {len(operands)}", loc)
    try:
        return opdef.infer([o.type for o in operands], attrs)
    except ShapeError as exc:
        raise error("NCC_EVRF064", str(exc), loc) from None
    except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        # A rule met attributes it cannot make sense of (bad input, e.g. a dimension list of the
        # wrong length): still the user's shape error, reported where it is.
        raise error("NCC_EVRF064", f"{op}: attributes do not fit the operands ({type(exc).__name__}: {exc})",
                    loc) from None


class Builder:
    """Accumulates the nodes of one computation."""

    def __init__(self, name: str = "main", loc: Loc | None = None) -> None:
        self.name = name
        self.loc = loc
        self.params: list[Node] = []
        self.nodes: list[Node] = []

    def param(self, t: Type | dt.DType, shape: Sequence[int] | None = None, name: str = "",
              loc: Loc | None = None) -> Node:
        if isinstance(t, dt.DType):
            t = TensorType(t, tuple(shape or ()))
        n = Node("parameter", (), {"index": len(self.params), "type": t}, t, name or f"p{len(self.params)}",
                 loc or self.loc)
        self.params.append(n)
        self.nodes.append(n)
        return n

    def op(self, op: str, operands: Sequence[Node] = (), *, name: str = "", loc: Loc | None = None,
           expect_type: Type | None = None, **attrs: Any) -> Node:
        """Add ``op(operands)``; the type is inferred (and checked against ``expect_type`` if given)."""
        where = loc or self.loc
        inferred = infer_type(op, operands, attrs, where)
        if expect_type is not None and expect_type != inferred:
            raise error("NCC_EVRF064", f"{op} is declared {expect_type} but its operands give {inferred}", where)
        n = Node(op, operands, attrs, inferred, name, where)
        self.nodes.append(n)
        return n

    def constant(self, value: Any, dtype: dt.DType | None = None, name: str = "", loc: Loc | None = None) -> Node:
        a = np.asarray(value)
        d = dtype or dt.from_numpy(a.dtype)
        a = dt.cast(a, d) if a.dtype != d.np else a
        t = TensorType(d, tuple(a.shape))
        n = Node("constant", (), {"value": a, "type": t}, t, name, loc or self.loc)
        self.nodes.append(n)
        return n

    def build(self, root: Node | Sequence[Node]) -> Computation:
        if not isinstance(root, Node):
            root = self.op("tuple", list(root))
        return Computation(self.name, self.params, root, list(self.nodes), self.loc)

    def module(self, root: Node | Sequence[Node], name: str | None = None) -> Module:
        return Module(name or self.name, self.build(root))

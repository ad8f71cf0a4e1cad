"""The IR: a typed dataflow graph with static shapes, tuples and sub-computations.

A :class:`Module` holds named :class:`Computation` s; one is the entry. A computation is a DAG of
:class:`Node` s (one per value) from its parameters to its root. Operators are named by their
HLO opcode and described in the registry (:mod:`nxsat.ops`); attributes are plain Python values
(ints, tuples, :class:`~nxsat.dtypes.DType`, the frozen records of :mod:`nxsat.attrs`, or a
:class:`Computation` for bodies such as ``to_apply``). Nodes are mutable only while a graph is
being built; passes build new graphs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from nxsat.diagnostics import Loc
from nxsat.dtypes import DType


@dataclass(frozen=True, slots=True)
class TensorType:
    dtype: DType
    shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def with_shape(self, shape: Iterable[int]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def __str__(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"

    def leaves(self) -> tuple[TensorType, ...]:
        return (self,)


@dataclass(frozen=True, slots=True)
class TupleType:
    elements: tuple[Type, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.elements)) + ")"

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.elements)

    def leaves(self) -> tuple[TensorType, ...]:
        return tuple(leaf for e in self.elements for leaf in e.leaves())


Type = TensorType | TupleType


def scalar(dtype: DType) -> TensorType:
    return TensorType(dtype, ())


_ids = itertools.count()


class Node:
    """One value: ``op(operands..., attrs)`` of type ``type``, named and located in its source."""

    __slots__ = ("id", "op", "operands", "attrs", "type", "name", "loc")

    def __init__(
        self,
        op: str,
        operands: Iterable[Node],
        attrs: dict[str, Any] | None,
        type: Type,
        name: str = "",
        loc: Loc | None = None,
    ) -> None:
        self.id = next(_ids)
        self.op = op
        self.operands: tuple[Node, ...] = tuple(operands)
        self.attrs: dict[str, Any] = attrs or {}
        self.type = type
        self.name = name or f"{op}.{self.id}"
        self.loc = loc

    @property
    def tensor(self) -> TensorType:
        """The type as a tensor type; only for non-tuple values."""
        assert isinstance(self.type, TensorType), f"{self.name} is a tuple"
        return self.type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    def __repr__(self) -> str:
        return f"<{self.name} = {self.type} {self.op}>"


class Computation:
    """A function body: parameters in order, a root, and the instructions as written."""

    def __init__(self, name: str, params: list[Node], root: Node, instructions: list[Node] | None = None,
                 loc: Loc | None = None) -> None:
        self.name = name
        self.params = params
        self.root = root
        # As written in the source (dead ones included, for inspection); post_order() is what runs.
        self.instructions = instructions if instructions is not None else post_order(root, params)
        self.loc = loc

    @property
    def param_types(self) -> list[Type]:
        return [p.type for p in self.params]

    @property
    def result_type(self) -> Type:
        return self.root.type

    def post_order(self) -> list[Node]:
        """Live nodes (reachable from the root), operands before users; parameters always included."""
        return post_order(self.root, self.params)

    def __repr__(self) -> str:
        return f"<computation {self.name}>"


def post_order(root: Node, params: Iterable[Node] = ()) -> list[Node]:
    """Iterative DFS post-order (no recursion: graphs have tens of thousands of nodes)."""
    seen: set[int] = set()
    order: list[Node] = []
    for p in params:
        if p.id not in seen:
            seen.add(p.id)
            order.append(p)
    stack: list[tuple[Node, int]] = [(root, 0)]
    while stack:
        node, i = stack.pop()
        if i == 0 and node.id in seen:
            continue
        if i < len(node.operands):
            stack.append((node, i + 1))
            child = node.operands[i]
            if child.id not in seen:
                stack.append((child, 0))
        else:
            if node.id not in seen:
                seen.add(node.id)
                order.append(node)
    return order


def subcomputations(node: Node) -> Iterator[Computation]:
    """The computations a node refers to through its attributes (bodies, branches, callees)."""
    for value in node.attrs.values():
        if isinstance(value, Computation):
            yield value
        elif isinstance(value, tuple) and value and isinstance(value[0], Computation):
            yield from value


class Module:
    """A whole program: its computations, the entry, and what the source said about itself."""

    def __init__(self, name: str, entry: Computation, computations: dict[str, Computation] | None = None,
                 attrs: dict[str, Any] | None = None, source: str = "", framework: str = "XLA") -> None:
        self.name = name
        self.entry = entry
        self.computations = computations if computations is not None else collect_computations(entry)
        self.attrs = attrs or {}
        self.source = source
        self.framework = framework
        from nxsat.diagnostics import Warnings

        self.warnings = Warnings()

    @property
    def params(self) -> list[Node]:
        return self.entry.params

    @property
    def outputs(self) -> tuple[TensorType, ...]:
        """The flattened output signature (``out0``, ``out1``, ...)."""
        return self.entry.result_type.leaves()

    def __repr__(self) -> str:
        return f"<module {self.name}: {len(self.computations)} computations>"


def collect_computations(entry: Computation) -> dict[str, Computation]:
    """Every computation reachable from ``entry``, callees first, entry last."""
    out: dict[str, Computation] = {}
    pending: list[tuple[Computation, bool]] = [(entry, False)]
    on_stack: set[str] = set()
    while pending:
        comp, expanded = pending.pop()
        if expanded:
            on_stack.discard(comp.name)
            out[comp.name] = comp
            continue
        if comp.name in out or comp.name in on_stack:
            continue
        on_stack.add(comp.name)
        pending.append((comp, True))
        for node in comp.instructions:
            for sub in subcomputations(node):
                if sub.name not in out:
                    pending.append((sub, False))
    return out


def flatten_types(t: Type) -> list[TensorType]:
    return list(t.leaves())

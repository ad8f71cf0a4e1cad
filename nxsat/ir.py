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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from nxsat.diagnostics import Loc
from nxsat.dtypes import DType

# Shape limits, checked where a reader (HLO, Relay, device program text) meets a type, so that an
# absurd shape is the user's error at its location, not a numpy failure deep in a later stage.
# - rank <= 64: numpy (the interpreter and the simulator) makes arrays of at most 64 dimensions
#   (NPY_MAXDIMS in numpy 2); real models use fewer than 10.
# - each dimension < 2**40 (1.1e12): beyond any real dimension, and a dimension times a stride or
#   element size, or a sum of a few, stays far inside int64, also in a tensor with a zero
#   dimension, whose element count bounds nothing.
# - at most 2**48 elements (2.8e14): 64-bit hosts address at most 2**48 bytes (x86-64 and arm64
#   virtual addresses), so no tensor with more elements can ever be held; its bytes (<= 2**51 at
#   8 bytes an element) fit numpy's int64 sizes with room to spare.
MAX_RANK = 64
DIM_LIMIT = 1 << 40  # every dimension is below this
MAX_ELEMENTS = 1 << 48
SHAPE_LIMITS_HINT = "nxsat takes tensors of rank <= 64, dimensions < 2^40 and at most 2^48 elements"


def shape_limit_problem(shape: Iterable[int]) -> str | None:
    """Why ``shape`` is beyond the limits above, or None; readers raise it as NCC_ESHP001 with
    their location (hint: :data:`SHAPE_LIMITS_HINT`)."""
    dims = tuple(shape)
    if len(dims) > MAX_RANK:
        return f"rank {len(dims)} is over {MAX_RANK}"
    for d in dims:
        if d >= DIM_LIMIT:
            return f"dimension {d} is not below 2^40"
    n = math.prod(dims)
    if n > MAX_ELEMENTS:
        return f"{n:.3g} elements are over 2^48"
    return None


def type_limit_problem(t: Type) -> str | None:
    """:func:`shape_limit_problem` for every tensor of a (tuple) type, naming the tensor."""
    for leaf in t.leaves():
        problem = shape_limit_problem(leaf.shape)
        if problem:
            text = str(leaf)
            return f"{text if len(text) <= 60 else text[:56] + '...'}: {problem}"
    return None


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


_ids = itertools.count()  # unique in the process: what passes key nodes by
_names = itertools.count()  # what names a node made without a name


def restart_names() -> None:
    """Name unnamed nodes from 0 again: a compile that starts here names the nodes it makes as any other
    compile of the same model does (the same bytes in a fresh process or after other compiles)."""
    global _names
    _names = itertools.count()


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
        self.name = name or f"{op}.{next(_names)}"
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


def post_order(root: Node, params: Iterable[Node] = (), seen: set[int] | None = None,
               last: set[int] | None = None) -> list[Node]:
    """Iterative DFS post-order (no recursion: graphs have tens of thousands of nodes); the ids in
    ``seen`` are taken as placed already (and it gains the ids placed now). The operands in ``last``
    are visited after a node's others, so that they come just before it."""
    seen = set() if seen is None else seen
    order: list[Node] = []
    for p in params:
        if p.id not in seen:
            seen.add(p.id)
            order.append(p)

    def operands(n: Node) -> Sequence[Node]:
        if not last or len(n.operands) < 2:
            return n.operands
        return [o for o in n.operands if o.id not in last] + [o for o in n.operands if o.id in last]

    stack: list[tuple[Node, Sequence[Node], int]] = [(root, operands(root), 0)]
    while stack:
        node, ops, i = stack.pop()
        if i == 0 and node.id in seen:
            continue
        if i < len(ops):
            stack.append((node, ops, i + 1))
            child = ops[i]
            if child.id not in seen:
                stack.append((child, operands(child), 0))
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

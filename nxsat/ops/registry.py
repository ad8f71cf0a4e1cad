"""The operator registry: the one place that says what an operator is.

Each operator is declared once (in one of the modules of :mod:`nxsat.ops`) with its HLO
spelling, shape-and-dtype rule, numpy reference implementation, the engine class it maps to,
its support status and notes, and (where it is a 1:1 match) its Relay spelling. The front ends
check every instruction with ``infer``; the reference interpreter runs ``impl``;
``list-operators`` prints ``neuron`` names and ``notes``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from nxsat.ir import Computation, Node, Type

# Engine classes of a NeuronCore (see reference/neuron-hardware.md); "-" for graph plumbing that
# costs nothing (parameters, tuples), "control" for structured control flow the compiler removes.
TENSOR, VECTOR, SCALAR, GPSIMD, DMA, NONE, CONTROL = "TensorE", "VectorE", "ScalarE", "GpSimd", "DMA", "-", "control"

SUPPORTED, PARTIAL, UNSUPPORTED = "supported", "partial", "unsupported"


class ShapeError(Exception):
    """Raised by a shape rule; the front end turns it into NCC_EVRF064 at the instruction."""


class Ctx(Protocol):
    """What a reference implementation may ask of the interpreter running it."""

    node: Node

    def call(self, comp: Computation, args: Sequence[Any]) -> Any: ...

    def warn(self, code: str, message: str) -> None: ...


InferFn = Callable[[list[Type], dict[str, Any]], Type]
ImplFn = Callable[[list[Any], dict[str, Any], Ctx], Any]
FlopsFn = Callable[[list[Type], Type, dict[str, Any]], int]


@dataclass(frozen=True)
class OpDef:
    name: str  # IR name = HLO opcode
    infer: InferFn
    impl: ImplFn | None
    engine: str
    neuron: tuple[str, ...] = ()  # names list-operators prints (neuronx-cc's spelling)
    status: str = SUPPORTED
    notes: str = ""
    relay: tuple[str, ...] = ()
    flops: FlopsFn | None = None
    arity: tuple[int, int | None] = (0, None)  # min, max operand count (None: unbounded)
    error_code: str = "NCC_EUOC002"  # the code an unsupported op fails with


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise ValueError(f"operator {opdef.name} declared twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def op(
    name: str,
    *,
    engine: str,
    neuron: Sequence[str] = (),
    status: str = SUPPORTED,
    notes: str = "",
    relay: Sequence[str] = (),
    flops: FlopsFn | None = None,
    arity: tuple[int, int | None] = (0, None),
    impl: ImplFn | None = None,
    error_code: str = "NCC_EUOC002",
) -> Callable[[InferFn], InferFn]:
    """Decorator form: decorate the shape rule; pass the implementation as ``impl``."""

    def wrap(infer: InferFn) -> InferFn:
        register(OpDef(name, infer, impl, engine, tuple(neuron), status, notes, tuple(relay), flops, arity,
                       error_code))
        return infer

    return wrap


def get(name: str) -> OpDef | None:
    _load_all()
    return _REGISTRY.get(name)


def all_ops() -> list[OpDef]:
    _load_all()
    return sorted(_REGISTRY.values(), key=lambda o: o.name)


_loaded = False


def _load_all() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import nxsat.ops  # noqa: F401  (importing the package declares every operator)


def as_array(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else np.asarray(x)

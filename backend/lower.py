"""Lowering: the extracted IR onto the device, one operator family per module.

Every IR value lives in HBM as a :class:`Ref` (a buffer and an access chain of the value's shape):
a parameter in its input buffer, a constant in a constant buffer, a computed value in a scratch
buffer or, for a model output, in the output buffer. Operators that only move data (reshape,
transpose, slice, broadcast) cost nothing: their value is a new access chain on their operand's
buffer, which whoever reads it loads through a DMA access pattern. Operators that compute are
lowered by the function registered for them (``@lowers``): it loads tiles, emits instructions into
the graph and stores its results. An operator without a lowering is refused with NCC_EUOC002.

Where an IR value's type has no device type, it gets one: 64-bit integers are computed as 32-bit
ones (warning NCC_WTYP001, as neuronx-cc documents), predicates are bytes on chip.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.graph import Buf, Graph, Ref
from nxsat.diagnostics import Warnings, error
from nxsat.ir import Module, Node, TensorType, TupleType
from nxsat.sim.program import AccessError
from nxsat.sim.target import Target

Lower = Callable[["Lowering", Node], None]
LOWERINGS: dict[str, Lower] = {}

DEVICE_TYPES = {"s64": dt.S32, "u64": dt.U32}
REFUSED_TYPES = {"f64": "the NeuronCore has no 64-bit floats; convert the model to f32"}


def lowers(*ops: str) -> Callable[[Lower], Lower]:
    """Register the lowering of IR operators (one function per family of operators)."""

    def wrap(fn: Lower) -> Lower:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"{op} is lowered twice")
            LOWERINGS[op] = fn
        return fn

    return wrap


def device_dtype(d: dt.DType, where: Node | None = None) -> dt.DType:
    """The device type that holds values of IR type ``d`` (in HBM)."""
    if d.name in REFUSED_TYPES:
        raise error("NCC_ESPP004", f"{d.name} is not a device type: {REFUSED_TYPES[d.name]}",
                    where.loc if where is not None else None)
    return DEVICE_TYPES.get(d.name, d)


def onchip_dtype(d: dt.DType) -> dt.DType:
    """The type an on-chip tile holds values of (HBM) type ``d`` in: predicates as bytes."""
    return dt.U8 if d.is_pred else d


@dataclass
class Options:
    """What lowering needs of the compile flags."""

    mixed_precision_accumulation: bool = True
    saturate_infinity: bool = False


@dataclass
class Lowering:
    """The state of lowering one module: the graph being built and where each IR value lives."""

    module: Module
    target: Target
    options: Options = field(default_factory=Options)
    graph: Graph = field(default_factory=Graph)
    values: dict[int, Any] = field(default_factory=dict)  # node id -> Ref, or a tuple of them
    inputs: list[Buf] = field(default_factory=list)
    outputs: list[Buf] = field(default_factory=list)
    warnings: Warnings = field(default_factory=Warnings)
    output_of: dict[int, list[Buf]] = field(default_factory=dict)  # node id -> output buffers it fills
    consumers: dict[int, set[int]] = field(default_factory=dict)  # node id -> ids of the nodes that read it
    cluster_of: dict[int, Any] = field(default_factory=dict)  # elementwise node id -> its fused cluster
    _consts: dict[tuple, Ref] = field(default_factory=dict)

    # --- where values live ----------------------------------------------------------------------
    def ref(self, node: Node) -> Ref:
        """The HBM access of a (non-tuple) node's value."""
        v = self.values[node.id]
        assert isinstance(v, Ref), f"{node.name} is a tuple"
        return v

    def set(self, node: Node, value: Any) -> None:
        self.values[node.id] = value

    def scalar(self, node: Node) -> float | int | None:
        """The value of a node that is one number however it is shaped (a scalar constant, or a
        broadcast or reshape of one): an immediate for the instructions that use it."""
        while node.op in ("broadcast", "reshape", "copy", "bitcast") and node.op != "bitcast":
            node = node.operands[0]
        if node.op == "constant":
            v = node.attrs.get("value")
            if isinstance(v, np.ndarray) and v.size >= 1 and (v.size == 1 or np.all(v == v.flat[0])):
                x = v.flat[0]
                if v.dtype == np.bool_:
                    return int(bool(x))
                return int(x) if v.dtype.kind in "iu" else float(x)
        return None

    def result(self, node: Node, name: str | None = None) -> Ref:
        """Where a computed node's value goes: its output buffer when the model returns it (the first
        one; others are copied), else a new scratch buffer."""
        t = node.tensor
        outs = self.output_of.get(node.id)
        if outs:
            r = outs[0].ref()
        else:
            r = self.graph.buf(name or node.name, "scratch", device_dtype(t.dtype, node), t.shape).ref()
        self.set(node, r)
        return r

    def const(self, value: np.ndarray, dtype: dt.DType, name: str = "const") -> Ref:
        """A constant in HBM (one buffer per distinct value)."""
        d = device_dtype(dtype)
        arr = np.ascontiguousarray(np.asarray(value).astype(d.np if not d.is_pred else np.bool_))
        shape = arr.shape
        key = (d.name, shape, arr.tobytes())
        r = self._consts.get(key)
        if r is None:
            b = self.graph.buf(name, "const", d, shape, arr)
            r = self._consts[key] = b.ref()
        return r

    # --- access chains on values ----------------------------------------------------------------
    def view(self, r: Ref, fn: Callable[[Ref], Ref], node: Node) -> Ref:
        """``fn(r)`` if the access pattern can express it, else ``fn`` of a contiguous copy of ``r``."""
        try:
            out = fn(r)
            out.shape  # noqa: B018 - resolves the chain: raises if it needs a copy
            return out
        except (AccessError, IndexError):
            return fn(self.contiguous(r, node))

    def contiguous(self, r: Ref, node: Node) -> Ref:
        """A copy of ``r``'s elements in a new row-major scratch buffer (one HBM-to-HBM DMA)."""
        shape = r.shape
        b = self.graph.buf(node.name + "_c", "scratch", r.dtype, shape)
        self.graph.add("dma", "dma", b.ref(), r)
        return b.ref()

    # --- the driver -----------------------------------------------------------------------------
    def run(self) -> None:
        from nxsat.backend import families  # noqa: F401 - registers every lowering
        from nxsat.backend.elementwise import clusters

        entry = self.module.entry
        order = entry.post_order()
        for node in order:
            for o in node.operands:
                self.consumers.setdefault(o.id, set()).add(node.id)
        self.cluster_of = clusters(self, order)
        for p in entry.params:
            if not isinstance(p.type, TensorType):
                raise error("NCC_EUOC002", f"parameter {p.name} is a tuple: the device takes tensors", p.loc)
            b = self.graph.buf(p.name, "input", device_dtype(p.type.dtype, p), p.type.shape)
            self.inputs.append(b)
            self.set(p, b.ref())
        leaves = _leaves(entry.root)
        for k, (leaf, path) in enumerate(leaves):
            t = _element(leaf.type, path)
            b = self.graph.buf(f"out{k}_{leaf.name}", "output", device_dtype(t.dtype, leaf), t.shape)
            self.outputs.append(b)
            if not path:  # an element of a tuple-valued operator is copied there at the end
                self.output_of.setdefault(leaf.id, []).append(b)
        for node in order:
            if node.op == "parameter" or node.id in self.values:
                continue
            fn = LOWERINGS.get(node.op)
            if fn is None:
                raise error("NCC_EUOC002", f"operator {node.op} ({node.name}) cannot run on the NeuronCore yet",
                            node.loc, "see `nxsat list-operators --all`")
            for d in _types(node):
                if d.name in ("s64", "u64"):
                    self.warnings.warn("NCC_WTYP001", "64-bit integers are computed as 32-bit on the device "
                                       "(high bits dropped)", node.loc)
            self.graph.origin = _origin(node)
            fn(self, node)
        self.graph.origin = None
        # Outputs a node did not write itself (a parameter, a constant, a view, a value returned twice).
        for k, (leaf, path) in enumerate(leaves):
            v = self.values[leaf.id]
            for i in path:
                v = v[i]
            out = self.outputs[k]
            if v.buf is out and not v.ops:
                continue
            self.graph.origin = _origin(leaf)
            self.graph.add("dma", "dma", out.ref(), v)
        self.graph.origin = None


def _leaves(root: Node) -> list[tuple[Node, tuple[int, ...]]]:
    """The model's outputs in order: (node, index path into its tuple value; () for an array)."""
    if root.op == "tuple":
        out: list[tuple[Node, tuple[int, ...]]] = []
        for op in root.operands:
            out.extend(_leaves(op))
        return out
    return [(root, path) for path in _paths(root.type)]


def _paths(t: Any) -> list[tuple[int, ...]]:
    if isinstance(t, TupleType):
        return [(i, *p) for i, e in enumerate(t.elements) for p in _paths(e)]
    return [()]


def _element(t: Any, path: tuple[int, ...]) -> TensorType:
    for i in path:
        t = t.elements[i]
    assert isinstance(t, TensorType)
    return t


def _types(node: Node) -> list[dt.DType]:
    return [t.dtype for t in node.type.leaves()]


def _origin(node: Node) -> str:
    """What the device program says produced an instruction: the IR node and its source line."""
    loc = node.loc
    where = ""
    if loc is not None and loc.line:
        where = f" {loc.file.rsplit('/', 1)[-1]}:{loc.line}" + (f" ({loc.origin})" if loc.origin else "")
    return f"{node.name}{where}"


def elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.forward import psum_operands
from nxsat.backend.graph import Buf, Graph, Ref
from nxsat.diagnostics import Warnings, error
from nxsat.extract.plan import NARROW_WRITERS
from nxsat.ir import Computation, Module, Node, TensorType, TupleType, post_order
from nxsat.sim.program import AccessError
from nxsat.sim.target import Target

Lower = Callable[["Lowering", Node], None]
LOWERINGS: dict[str, Lower] = {}
Planner = Callable[["Lowering", list[Node]], None]
PLANNERS: list[Planner] = []
# Operators whose lowering can run the elementwise cluster that reads their result on its tiles
# (backend/epilogue.py): lowered when something first reads them, not at their post-order turn.
HOSTS: set[str] = set()

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


# Post-order positions a side computation (one with no product or convolution beneath: a mask made from the
# parameters) is lowered ahead of its reader: early enough that its chain (GpSimd steps with DMA hops
# between them) is done when the reader runs, late enough that the chains of all layers do not come
# first. gemma3_1b under transformer (about 140 nodes a layer): 8,620.9 us all first, 8,584.5 just
# before the reader, 8,551.6 / 8,493.3 / 8,516.9 / 8,547.6 at 100 / 150 / 200 / 400 ahead (stop 33);
# once its attention chain kept more on chip (a shorter chain: the mask's came late), 8,108.2 / 8,137.2 /
# 8,049.9 / 8,068.8 / 8,069.8 / 8,116.3 at 150 / 175 / 200 / 225 / 250 / 300.
HOIST = 200


def side_computations_ahead(entry: Computation) -> list[Node]:
    """The entry's post-order with each side computation (no dot or convolution beneath it) visited after
    its reader's other operands and then moved :data:`HOIST` places earlier. Depth-first, gemma3's
    ``select(mask, scores, -inf)`` reached each layer's mask before its scores, so the 26 layers' masks
    (if-converted conditionals, compares, scatters: a 7 us chain of GpSimd steps and DMA hops each) came
    before layer 0, in order 25 to 0, and GpSimd, in order, ran them all (150 us) before layer 0 could
    start; the weights' stream waited with SBUF's prefetch share full."""
    light: set[int] = set()
    for n in entry.post_order():
        if n.op not in ("dot", "convolution") and all(o.id in light for o in n.operands):
            light.add(n.id)
    post = post_order(entry.root, entry.params, last=light)
    at = {n.id: k - (HOIST if n.id in light else 0) for k, n in enumerate(post)}
    return sorted(post, key=lambda n: at[n.id])  # stable: light values keep their order, as do the others


def hosts(*ops: str) -> None:
    """Declare operators whose lowering takes an epilogue (backend/epilogue.py): each is lowered just
    before the first node that reads it, so every other input of the cluster reading it (a bias, a
    batch-norm scale computed after it in post-order) is computed by then."""
    HOSTS.update(ops)


def plans(fn: Planner) -> Planner:
    """Register a planner: it runs once the clusters are made, before any lowering, and may claim nodes
    that a family's lowering computes itself (``Lowering.absorbed``; e.g. a convert a reduction reads
    through), noting its decisions in ``Lowering.plan``."""
    PLANNERS.append(fn)
    return fn


def device_dtype(d: dt.DType, where: Node | None = None) -> dt.DType:
    """The device type that holds values of IR type ``d`` (in HBM)."""
    if d.name in REFUSED_TYPES:
        raise error("NCC_ESPP004", f"{d.name} is not a device type: {REFUSED_TYPES[d.name]}",
                    where.loc if where is not None else None)
    return DEVICE_TYPES.get(d.name, d)


def onchip_dtype(d: dt.DType) -> dt.DType:
    """The type an on-chip tile holds values of (HBM) type ``d`` in: predicates as bytes."""
    return dt.U8 if d.is_pred else d


def load_dtype(target: Target, src: Ref, want: dt.DType) -> dt.DType:
    """The type to load ``src`` in for use as ``want``: ``want`` itself where ``src`` is a model input or
    constant and the target's DMA converts between the two as it copies (a weight multiplied in bf16: no
    engine pass, and half the SBUF), else ``src``'s own (the caller converts on an engine). ResNet-50 under
    unet-inference: 532.7 -> 502.6 us (generic 590.6 -> 556.9), its 25M fp32 weights no longer converted on
    ScalarE and VectorE."""
    own = onchip_dtype(src.dtype)
    if src.buf.root.kind in ("input", "const") and target.dma_casts(want.name, own.name):
        return want
    return own


@dataclass
class Options:
    """What lowering needs of the compile flags."""

    mixed_precision_accumulation: bool = True
    saturate_infinity: bool = False


# A copy ``Lowering.contiguous`` makes goes in up to this many pieces of at least this many bytes each.
COPY_PIECES = 16
COPY_PIECE_BYTES = 64 * 1024


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
    # (node id, element) -> output buffers an element of a tuple-valued operator (sort, scatter, topk) fills
    element_outputs: dict[tuple[int, int], list[Buf]] = field(default_factory=dict)
    consumers: dict[int, set[int]] = field(default_factory=dict)  # node id -> ids of the nodes that read it
    cluster_of: dict[int, Any] = field(default_factory=dict)  # elementwise node id -> its fused cluster
    absorbed: set[int] = field(default_factory=set)  # nodes another operator's lowering does itself
    deferred: dict[int, Node] = field(default_factory=dict)  # hosts waiting for a reader (run)
    plan: dict[int, Any] = field(default_factory=dict)  # node id -> what a planner decided for its lowering
    fixed: set[int] = field(default_factory=set)  # from parameters and constants alone (elementwise.fixed_values)
    _consts: dict[tuple, Ref] = field(default_factory=dict)
    _copies: dict[tuple, Ref] = field(default_factory=dict)  # (buffer, access) -> its contiguous copy
    # the nodes whose value is a view of such a copy (``view``): a reader that can read the original in pieces
    # leaves the copy unread, and ``Graph.drop_dead`` removes it (backend/epilogue.py ``_row_runs``)
    copied: set[int] = field(default_factory=set)
    # operands a concatenate reads alone, written straight into their slice of its result (``_in_concat``):
    # operand id -> that slice; and each such concatenate's result, made when its first operand asked
    in_place: dict[int, Ref] = field(default_factory=dict)
    _concat_home: dict[int, Ref] = field(default_factory=dict)
    _filling: set[int] = field(default_factory=set)  # their buffers, not sealed while operands still write them
    _by_id: dict[int, Node] = field(default_factory=dict)
    _fresh: list[Any] = field(default_factory=list)  # values set since the last operator was lowered

    # --- where values live ----------------------------------------------------------------------
    def ref(self, node: Node) -> Ref:
        """The HBM access of a (non-tuple) node's value."""
        v = self.values[node.id]
        assert isinstance(v, Ref), f"{node.name} is a tuple"
        return v

    def set(self, node: Node, value: Any) -> None:
        self.values[node.id] = value
        self._fresh.append(value)

    def drop(self, node: Node) -> None:
        """Forget the result buffer made for ``node`` before anything wrote it (an epilogue computes what
        reads it instead)."""
        r = self.values.pop(node.id)
        self._fresh = [v for v in self._fresh if v is not r]
        if self.in_place.pop(node.id, None) is None:  # a concatenate's slice: its buffer is the concatenate's
            self.graph.drop(r.buf)

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

    def node(self, node_id: int) -> Node:
        """The entry computation's node of this id."""
        if not self._by_id:
            self._by_id = {n.id: n for n in self.module.entry.post_order()}
        return self._by_id[node_id]

    def result(self, node: Node, name: str | None = None) -> Ref:
        """Where a computed node's value goes (:meth:`_home`), set as its value."""
        r = self._home(node, name)
        self.set(node, r)
        return r

    def _home(self, node: Node, name: str | None = None) -> Ref:
        """Its output buffer when the model returns it (the first one; others are copied), its slice of a
        concatenation that alone reads it (:meth:`_in_concat`), else a new scratch buffer."""
        home = self._concat_home.get(node.id)  # a concatenate whose result an operand made first
        if home is not None:
            self._filling.discard(id(home.buf))  # sealed once the concatenate is lowered
            return home
        t = node.tensor
        outs = self.output_of.get(node.id)
        via = None if outs else self._returned_reshaped(node)
        if outs:
            return outs[0].ref()
        if via is not None:
            return via
        return self._in_concat(node) or \
            self.graph.buf(name or node.name, "scratch", device_dtype(t.dtype, node), t.shape).ref()

    def _in_concat(self, node: Node) -> Ref | None:
        """The slice of a concatenate's result that ``node``'s value is written to, when that concatenate is
        its only reader (once): the concatenation then copies nothing of it (a UNet's skip concatenation,
        unet_tiny's 1.0 us DMA on its critical path and the trigger's 1.3 us before it). None otherwise."""
        readers = self.consumers.get(node.id, set())
        if len(readers) != 1 or not isinstance(node.type, TensorType):
            return None
        cat = self.node(next(iter(readers)))
        if cat.op != "concatenate" or sum(o.id == node.id for o in cat.operands) != 1 or \
                device_dtype(cat.dtype, cat) is not device_dtype(node.dtype, node):
            return None
        home = self._concat_home.get(cat.id)
        if home is None:
            home = self._concat_home[cat.id] = self._home(cat)
            self._filling.add(id(home.buf))
        r = home[next(key for op, key in concat_parts(cat) if op.id == node.id)]
        self.in_place[node.id] = r
        return r

    def _returned_reshaped(self, node: Node) -> Ref | None:
        """The output buffer seen in ``node``'s shape when the model returns ``node`` only through one
        reshape (backend/elementwise.py ``sink_reshapes`` makes that), or a transpose that moves only
        dimensions of size 1 (a swapped dot's result turned back: gpt_decoder's P.V product of one
        token): written there, not copied after."""
        readers = self.consumers.get(node.id, set())
        if len(readers) != 1:
            return None
        (reader,) = readers
        outs = self.output_of.get(reader)
        return outs[0].ref().reshape(*node.shape) if outs and reshapes(self.node(reader)) else None

    def results(self, node: Node) -> tuple[Ref, ...]:
        """Where each element of a tuple-valued operator's value goes (its output buffer when the model
        returns that element, else a new scratch buffer); sets the node's value to the tuple."""
        assert isinstance(node.type, TupleType)
        users = (self.node(c) for c in self.consumers.get(node.id, ()))
        gtes = {n.attrs["index"]: n for n in users if n.op == "get-tuple-element" and n.id in self.output_of}
        refs = []
        for i, t in enumerate(node.type.elements):
            assert isinstance(t, TensorType), f"{node.name}: nested tuple results"
            outs = self.element_outputs.get((node.id, i)) or (self.output_of[gtes[i].id] if i in gtes else None)
            refs.append(outs[0].ref() if outs else
                        self.graph.buf(f"{node.name}_{i}", "scratch", device_dtype(t.dtype, node), t.shape).ref())
        self.set(node, tuple(refs))
        return tuple(refs)

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
            self.copied.add(node.id)
            return fn(self.contiguous(r, node))

    def contiguous(self, r: Ref, node: Node) -> Ref:
        """A copy of ``r``'s elements in a new row-major scratch buffer (one HBM-to-HBM DMA), made once per
        access: a value is read only once written (sealed), so the copy stays valid. A weight gradient's
        per-position dots read the same output gradient, each copying it (three 1.4 ms copies of one
        [8, 32, 28, 28] value)."""
        key = None if r.buf.onchip else (id(r.buf.root), r.dtype.name, r.ap.offset, r.ap.dims)
        if key in self._copies:
            return self._copies[key]
        b = self.graph.buf(node.name + "_c", "scratch", r.dtype, r.shape)
        # in pieces along the outermost dimension, each a DMA of its own (the scheduler spreads them over
        # the load queues): a reader of some rows waits for the piece that copies them, not for the whole
        # copy (gpt2_extract's residual, a [32, 768] input broadcast over 50 sequences and read as
        # [1600, 768] rows: one 73 us DMA the first dense layer's epilogue waited for)
        d = next((i for i, n in enumerate(r.shape) if n > 1), None)
        rows = r.shape[d] if d is not None else 1
        pieces = max(1, min(COPY_PIECES, rows, b.nbytes // COPY_PIECE_BYTES))
        for k in range(pieces):  # a whole-buffer index (one piece) is the buffer itself
            part = (slice(None),) * d + (slice(rows * k // pieces, rows * (k + 1) // pieces),) if d is not None else ()
            self.graph.add("dma", "dma", b.ref()[part], r[part])
        if key is not None:
            self._copies[key] = b.ref()
        return b.ref()

    # --- the driver -----------------------------------------------------------------------------
    def _lower(self, node: Node) -> None:
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
        # What this operator computed is written completely: read only from now on (Graph.seal).
        while self._fresh:
            v = self._fresh.pop()
            if isinstance(v, tuple):
                self._fresh.extend(v)
            elif isinstance(v, Ref) and v.buf.kind in ("scratch", "output") and id(v.buf) not in self._filling:
                self.graph.seal(v.buf)

    def _reads(self, node: Node) -> list[Node]:
        """What lowering ``node`` reads: its operands, and for the first member of an elementwise cluster
        (which lowers the whole cluster) every member's."""
        cl = self.cluster_of.get(node.id)
        ops = [o for m in cl.members for o in m.operands] if cl is not None and cl.members and \
            cl.members[0] is node else list(node.operands)
        out: list[Node] = []
        for o in ops:  # an absorbed node is computed by its reader: its operands are read
            out.extend(self._reads(o) if o.id in self.absorbed else [o])
        return out

    def require(self, node: Node) -> bool:
        """Have ``node`` computed before the operator being lowered starts (called first thing by it): the
        deferred hosts it reads, or whose epilogue computes it, are lowered now. False when it still
        has no value (it comes later in the order)."""
        if node.id not in self.values:
            cl = self.cluster_of.get(node.id)
            reads = self._reads(node) + ([o for m in cl.members for o in m.operands] if cl is not None else [])
            self._lower_deferred(reads)
        return isinstance(self.values.get(node.id), Ref)

    def _lower_deferred(self, nodes: list[Node]) -> None:
        """Lower the deferred hosts among ``nodes`` (and first the deferred hosts they read)."""
        for n in nodes:
            if self.deferred.pop(n.id, None) is not None:
                self._lower_deferred(self._reads(n))
                self._lower(n)

    def _lower_views(self, nodes: list[Node]) -> None:
        """Lower the constants and views of them and of parameters among ``nodes`` that come later in the
        order: an elementwise cluster reads them from the start (backend/elementwise.py ``clusters``)."""
        from nxsat.backend.elementwise import PURE_VIEWS

        for n in nodes:
            if n.id not in self.values and (n.op == "constant" or n.op in PURE_VIEWS):
                self._lower_views(list(n.operands))
                if all(o.id in self.values for o in n.operands):
                    self._lower(n)

    def run(self) -> None:
        from nxsat.backend import families  # noqa: F401 - registers every lowering
        from nxsat.backend.elementwise import clusters, fixed_values, lowering_order

        entry = self.module.entry
        self.graph.hbm_limit = self.target.hbm_bytes
        self.graph.clocks = {e.stream: e.clock_ghz for e in self.target.engines.values()}
        post = side_computations_ahead(entry)
        self.fixed = fixed_values(post)
        order = lowering_order(post, self.fixed)
        for node in order:
            for o in node.operands:
                self.consumers.setdefault(o.id, set()).add(node.id)
        # tf32 roundings that only feed dots: TensorE's tf32 mode does them (backend/matmul.py)
        nodes = {n.id: n for n in order}
        cand = {n.id for n in order if is_tf32_rounding(n) and n.id not in self.output_of
                and self.consumers.get(n.id) and all(nodes[c].op == "dot" for c in self.consumers[n.id])}
        changed = True
        while changed:  # a dot takes tf32 mode only when both its operands are such roundings
            changed = False
            for i in list(cand):
                if any(not all(o.id in cand for o in nodes[c].operands) for c in self.consumers[i]):
                    cand.discard(i)
                    changed = True
        # Casts to a TensorE type whose readers convert the tiles they load themselves (_absorbs): one
        # HBM read of the source instead of a cast written to scratch and read back; not where a fused
        # pass computes the source (it writes the narrow type itself).
        cand |= {n.id for n in order if is_operand_cast(n) and n.id not in self.output_of
                 and not _fused_source(self, n)
                 and self.target.supports_matmul_dtype(n.dtype.name) and self.consumers.get(n.id)
                 and all(_absorbs(nodes[c], n) for c in self.consumers[n.id])}
        self.absorbed = cand
        self.cluster_of = clusters(self, order)
        for p in entry.params:
            if not isinstance(p.type, TensorType):
                raise error("NCC_EUOC002", f"parameter {p.name} is a tuple: the device takes tensors", p.loc)
            _no_empty(p, p.type)
            b = self.graph.buf(p.name, "input", device_dtype(p.type.dtype, p), p.type.shape)
            b.shard = p.attrs.get("shard_dim")  # backend/partition.py: this rank's part of a weight
            self.inputs.append(b)
            self.set(p, b.ref())
        leaves = _leaves(entry.root)
        for k, (leaf, elem) in enumerate(leaves):
            t = leaf.tensor if elem is None else leaf.type.elements[elem]
            _no_empty(leaf, t)
            b = self.graph.buf(f"out{k}_{leaf.name}", "output", device_dtype(t.dtype, leaf), t.shape)
            b.shard = leaf.attrs.get("shard_dim")
            self.outputs.append(b)
            if elem is None:
                self.output_of.setdefault(leaf.id, []).append(b)
            else:
                self.element_outputs.setdefault((leaf.id, elem), []).append(b)
        for planner in PLANNERS:
            planner(self, order)
        for node in order:
            if node.op == "parameter" or node.id in self.values or node.id in self.absorbed:
                continue
            if node.op in HOSTS and any(c in self.cluster_of for c in self.consumers.get(node.id, ())):
                self.deferred[node.id] = node
                continue
            self._lower_deferred(self._reads(node))
            self._lower_views(self._reads(node))
            self._lower(node)
        for node in list(self.deferred.values()):
            self._lower_deferred([node])
        self.graph.origin = None
        # Outputs a node did not write itself (a parameter, a constant, a view, a value returned twice).
        # One that returns a donated parameter unchanged is that parameter's buffer: nothing moves.
        aliases = self.module.attrs.get("output_aliases", {})
        for k, (leaf, elem) in enumerate(leaves):
            v = self.ref(leaf) if elem is None else self.values[leaf.id][elem]
            out = self.outputs[k]
            if v.buf is out and not v.ops:
                continue
            same = (v.buf.dtype, v.buf.shape, v.buf.shard) == (out.dtype, out.shape, out.shard)
            if leaf.op == "parameter" and elem is None and aliases.get(k) == leaf.attrs["index"] and not v.ops \
                    and v.buf.kind == "input" and same:
                out.alias = v.buf.name
                continue
            self.graph.origin = _origin(leaf)
            self.graph.add("dma", "dma", out.ref(), v)
        self.graph.origin = None
        self.graph.drop_dead()  # what was lowered for a reader that did not read it in the end
        psum_operands(self.graph, self.target)


def concat_parts(node: Node) -> Iterator[tuple[Node, tuple[slice, ...]]]:
    """A concatenate's operands, each with the index of its place in the result."""
    axis = node.attrs["dimension"]
    at = 0
    for op in node.operands:
        n = op.shape[axis]
        yield op, tuple(slice(at, at + n) if d == axis else slice(None) for d in range(len(node.shape)))
        at += n


def _no_empty(node: Node, t: TensorType) -> None:
    """The device program declares no empty tensors: a model input or output without elements is refused."""
    if 0 in t.shape:
        raise error("NCC_EUOC002", f"{node.name} is {t}: a model input or output without elements cannot be "
                    "declared on the NeuronCore (no empty tensors)", node.loc, "see docs/backend.md, Reductions")


IMAGE_CHANNELS = 4  # a convolution converts the tiles of an input of this many channels (RGB, RGBA) itself


def _absorbs(reader: Node, cast: Node) -> bool:
    """Does ``reader`` convert its loaded tiles of the cast's source itself, multiplying in the cast's
    type (so the on-chip cast is the same rounding)? A dot whose operands both have the cast's type; a
    convolution whose operands both have it, of a model input cast (its weights, or an image: resnet's
    stem wrote its bf16 image to HBM and loaded it back, 1.6 us of resnet_small's critical path;
    backend/conv.py: the implicit GEMM converts the tiles it loads; its other paths compute the cast
    first)."""
    if reader.op == "dot":
        return all(o.dtype is cast.dtype for o in reader.operands)
    if reader.op != "convolution" or cast.operands[0].op != "parameter" or \
            not all(o.dtype is cast.dtype for o in reader.operands):
        return False
    if reader.operands[1] is cast:
        return True
    # an input only where it is an image of a few channels: its rows are loaded and transposed on TensorE
    # anyway, and the cast pass wrote the whole image to HBM for the convolution to read back. A wide
    # input's own pass is better: the convolution's loads of it would be twice the bytes and its
    # conversions would run among the evacuations (8x28x28x128 channels-last: 68 -> 87 us)
    return reader.operands[0] is cast and cast.shape[reader.attrs["dims"].input_feature] <= IMAGE_CHANNELS


def _fused_source(lw: Lowering, cast: Node) -> bool:
    """Is the cast's source computed by an elementwise pass of its shape, or by a kernel that rounds its
    result to the type of the one cast reading it (backend/fused.py ``written_as``: a softmax), which
    can write the narrower type itself: half the bytes stored, and half read by every dot that reads it?"""
    from nxsat.backend.elementwise import is_elementwise

    src = cast.operands[0]
    if src.op in NARROW_WRITERS:
        return lw.consumers.get(src.id) == {cast.id} and src.id not in lw.output_of
    return is_elementwise(src) and src.shape == cast.shape


def is_tf32_rounding(node: Node) -> bool:
    """``reduce-precision`` of fp32 to tf32's 8 exponent and 10 mantissa bits (what --auto-cast-type tf32
    puts on TensorE operands)."""
    return (node.op == "reduce-precision" and node.attrs.get("exponent_bits") == 8
            and node.attrs.get("mantissa_bits") == 10 and node.dtype is dt.F32)


def is_operand_cast(node: Node) -> bool:
    """A convert between float types into a type TensorE multiplies in (what --auto-cast matmult puts
    on dot operands)."""
    return (node.op == "convert" and node.dtype.name in ("bf16", "f16", "f8e4m3fn", "f8e5m2")
            and node.operands[0].tensor.dtype.is_float)


def _leaves(root: Node) -> list[tuple[Node, int | None]]:
    """The model's outputs: tensor-valued nodes, or elements of a tuple-valued operator (sort, topk)."""
    if root.op == "tuple":
        out: list[tuple[Node, int | None]] = []
        for op in root.operands:
            out.extend(_leaves(op))
        return out
    if isinstance(root.type, TupleType):
        return [(root, i) for i in range(len(root.type.elements))]
    return [(root, None)]


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


def reshapes(node: Node) -> bool:
    """Is ``node`` a reshape, or a transpose whose dimensions of more than one element keep their order
    (the same elements in the same memory order)?"""
    if node.op == "reshape":
        return True
    if node.op != "transpose":
        return False
    shape = node.operands[0].shape
    moved = [p for p in node.attrs["dimensions"] if shape[p] > 1]
    return moved == sorted(moved)

"""Elementwise operators, fused: a cluster of elementwise operators of one shape is one pass over SBUF
tiles (each input loaded once per tile, each result the model needs stored once), whatever
arithmetic, comparison, selection or conversion it chains.

Clusters are made before lowering (:func:`clusters`): an elementwise node joins the cluster of an
elementwise operand of the same shape when every operand it takes from outside that cluster is
computed before the cluster starts, so the cluster can run as soon as it starts. The values a
cluster computes are stored only where something outside it (or the model's output) reads them.

A cluster's shape is tiled as ``[rows, cols]``: ``cols`` the product of the trailing dimensions
(up to :data:`MAX_COLS` elements per partition, further split in column chunks), ``rows`` the rest,
128 at a time. Each operator becomes one or a few instructions on those tiles (the table below):
activation functions on ScalarE, float arithmetic on VectorE, 32-bit integer arithmetic on GpSimd.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from nxsat import dtypes as dt
from nxsat.backend.graph import Ref
from nxsat.backend.lower import Lowering, device_dtype, lowers, onchip_dtype
from nxsat.backend.tiles import Operand, Tiles, is_num
from nxsat.diagnostics import error
from nxsat.ir import Node, TensorType

MAX_COLS = 1024  # elements per partition of one tile
MAX_CLUSTER = 48  # operators in one fused pass (each live result holds a tile)

# XLA opcode -> ScalarE activation function
ACTIVATION = {"exponential": "exp", "log": "log", "tanh": "tanh", "logistic": "sigmoid", "sqrt": "sqrt",
              "rsqrt": "rsqrt", "sine": "sin", "cosine": "cos", "erf": "erf"}
# XLA opcode -> ALU operation
ALU = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "maximum": "max", "minimum": "min",
       "power": "pow", "and": "and", "or": "or", "xor": "xor", "shift-left": "shl"}
COMPARE = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}

Emit = Callable[["Kernel", Node, list[Operand]], Operand]
EMITTERS: dict[str, Emit] = {}
SHAPE_CHANGING = frozenset({"bitcast-convert"})  # elementwise only when the shape stays


def emits(*ops: str) -> Callable[[Emit], Emit]:
    """Register how an elementwise operator becomes instructions on tiles."""

    def wrap(fn: Emit) -> Emit:
        for op in ops:
            EMITTERS[op] = fn
        return fn

    return wrap


# --- clusters ------------------------------------------------------------------------------------

@dataclass(eq=False)
class Cluster:
    shape: tuple[int, ...]
    members: list[Node] = field(default_factory=list)
    first: int = 0  # post-order position of the first member


def is_elementwise(node: Node) -> bool:
    """An operator computed element by element on tiles of its own shape (a bitcast-convert that
    changes the element width changes the shape too: it is lowered on its own)."""
    if node.op not in EMITTERS or not isinstance(node.type, TensorType):
        return False
    return all(isinstance(o.type, TensorType) and o.shape == node.shape for o in node.operands) or \
        node.op not in SHAPE_CHANGING


def clusters(lw: Lowering, order: list[Node]) -> dict[int, Cluster]:
    """Each elementwise node's cluster (see the module's docstring)."""
    position = {n.id: k for k, n in enumerate(order)}
    of: dict[int, Cluster] = {}
    for k, n in enumerate(order):
        if not is_elementwise(n) or n.id in lw.absorbed:  # an absorbed cast is done by its consumer
            continue
        joined = None
        for o in n.operands:
            c = of.get(o.id)
            if c is None or c.shape != n.shape or len(c.members) >= MAX_CLUSTER:
                continue
            if all(of.get(x.id) is c or position[x.id] < c.first for x in n.operands):
                joined = c
                break
        if joined is None:
            joined = Cluster(n.shape, [], k)
        joined.members.append(n)
        of[n.id] = joined
    return of


# --- the kernel ------------------------------------------------------------------------------------

class Kernel:
    """One tile of one cluster: its inputs loaded, its members computed in order. The tile is rows
    ``at[0]..`` and columns ``at[1]..`` of the cluster's ``shape`` seen as ``[rows, cols]`` (``grid``):
    what an operator whose values depend on the position (iota) needs."""

    def __init__(self, lw: Lowering, tiles: Tiles, shape: tuple[int, ...] = (), at: tuple[int, int] = (0, 0),
                 grid: tuple[int, int] = (1, 1)) -> None:
        self.lw = lw
        self.t = tiles
        self.g = lw.graph
        self.shape = shape
        self.at = at
        self.grid = grid


def _split(shape: tuple[int, ...]) -> tuple[int, int]:
    """``[rows, cols]``: cols the trailing dimensions while they fit a tile (the last one at least)."""
    if not shape:
        return 1, 1
    cols = shape[-1]
    k = len(shape) - 1
    while k > 0 and cols * shape[k - 1] <= MAX_COLS:
        cols *= shape[k - 1]
        k -= 1
    return math.prod(shape[:k]), cols


def lower_cluster(lw: Lowering, cl: Cluster, consumers: dict[int, set[int]]) -> None:
    members = cl.members
    ids = {m.id for m in members}
    outputs = [m for m in members if m.id in lw.output_of or consumers.get(m.id, set()) - ids]
    rows, cols = _split(cl.shape)
    part = lw.target.partitions
    # Every input (an operand from outside the cluster) as a [rows, cols] access, or an immediate.
    inputs: dict[int, Operand] = {}
    for m in members:
        for o in m.operands:
            if o.id in ids or o.id in inputs:
                continue
            s = lw.scalar(o)
            if s is not None:
                inputs[o.id] = s
            elif o.shape == () and cl.shape != ():  # a scalar operand (select's predicate, clamp's bounds)
                inputs[o.id] = lw.ref(o).reshape(1, 1).broadcast(0, rows).broadcast(1, cols)
            else:
                inputs[o.id] = lw.view(lw.ref(o), lambda r: r.reshape(rows, cols), m)
    stores = {m.id: lw.view(lw.result(m), lambda r: r.reshape(rows, cols), m) for m in outputs}
    for r0 in range(0, rows, part):
        rn = min(part, rows - r0)
        for c0 in range(0, cols, MAX_COLS):
            cn = min(MAX_COLS, cols - c0)
            k = Kernel(lw, Tiles(lw.graph, (rn, cn), "ew"), cl.shape, (r0, c0), (rows, cols))
            val: dict[int, Operand] = {}
            for oid, src in inputs.items():
                if is_num(src):
                    val[oid] = src
                    continue
                assert isinstance(src, Ref)
                val[oid] = load_input(lw, k.t, src[r0:r0 + rn, c0:c0 + cn])
            for m in members:
                lw.graph.origin = _origin(m)
                val[m.id] = emit(k, m, [val[o.id] for o in m.operands])
            for m in outputs:
                lw.graph.origin = _origin(m)
                v = val[m.id]
                if is_num(v):
                    v = k.t.memset(v, onchip_dtype(device_dtype(m.dtype)))
                assert isinstance(v, Ref)
                lw.graph.add("dma", "dma", stores[m.id][r0:r0 + rn, c0:c0 + cn], v)


def load_input(lw: Lowering, t: Tiles, src: Ref) -> Ref:
    """A ``[rows, cols]`` input tile. A value repeated along the row (a per-row statistic broadcast
    over the features: stride 0 in HBM) is loaded once per row and repeated on chip; a DMA of it as
    it is would move one element per descriptor."""
    d = onchip_dtype(src.dtype)
    tile = t.tile(d)
    rn, cn = src.shape
    ap = src.resolved().ap
    if cn > 1 and ap is not None and len(ap.dims) == 2 and ap.dims[-1][1] == 0:
        col = lw.graph.tile((rn, 1), d, "sbuf", "ewcol").ref()
        lw.graph.add("dma", "dma", col, src[:, 0:1])
        lw.graph.add("dve", "tensor_copy", tile, col.broadcast(1, cn))
        return tile
    lw.graph.add("dma", "dma", tile, src)
    return tile


def _origin(node: Node) -> str:
    from nxsat.backend.lower import _origin as origin

    return origin(node)


def emit(k: Kernel, node: Node, ops: list[Operand]) -> Ref:
    """One elementwise operator on tiles (or on numbers, folded now), its result in the operator's
    on-chip type as XLA converts: every body evaluated on tiles (fusions, windows, reducers) goes
    through here."""
    fn = EMITTERS.get(node.op)
    if fn is None:
        raise error("NCC_EUOC002", f"operator {node.op} ({node.name}) cannot run on the NeuronCore yet", node.loc)
    if ops and all(is_num(o) for o in ops):
        from nxsat.backend.elementwise_ext import fold

        return fold(node, ops)  # numbers only: computed now, by the reference semantics
    out = fn(k, node, ops)
    want = onchip_dtype(device_dtype(node.dtype))
    if isinstance(out, Ref) and out.dtype is not want:
        out = narrow(k.t, out, want)
    return out


E4M3_NAN_ABOVE = 464.0  # f8e4m3fn: 448 is its largest value; XLA makes what rounds beyond it (> 464) NaN


def narrow(t: Tiles, v: Ref, want: dt.DType) -> Ref:
    """``v`` converted to ``want`` as XLA converts: one engine copy (round to nearest even, float to
    integer truncating and saturating, integers wrapping), except that XLA's f8e4m3fn has no
    saturation (the device's copy saturates at +-448): what rounds beyond 448, and infinity, is NaN."""
    y = t.copy(v, want)
    if want is not dt.F8E4M3FN:
        return y
    big = t.scalar2(v, "abs_max", 0, "gt", E4M3_NAN_ABOVE, dt.U8)
    return t.select(big, math.nan, y, want)


@lowers(*ACTIVATION, *ALU, "compare", "select", "clamp", "negate", "abs", "convert", "sign", "not")
def elementwise(lw: Lowering, node: Node) -> None:
    """Lower the cluster ``node`` starts (its other members are lowered with it)."""
    cl = lw.cluster_of[node.id]
    if node is not cl.members[0]:
        return
    lower_cluster(lw, cl, lw.consumers)


# --- operators -----------------------------------------------------------------------------------

def _dtype(node: Node) -> dt.DType:
    return onchip_dtype(device_dtype(node.dtype))


@emits(*ACTIVATION)
def _activation(k: Kernel, node: Node, ops: list[Operand]) -> Ref:
    x = ops[0]
    if is_num(x):
        x = k.t.memset(x, dt.F32)
    d = _dtype(node)
    return k.t.act(ACTIVATION[node.op], x, dt.F32 if d is dt.F8E4M3FN else d)  # e4m3fn: narrowed as XLA

"""Elementwise operators, fused: a cluster of elementwise operators of one shape is one pass over SBUF
tiles (each input loaded once per tile, each result the model needs stored once), whatever
arithmetic, comparison, selection or conversion it chains.

Clusters are made before lowering (:func:`clusters`): an elementwise node joins the cluster of an
elementwise operand of the same shape when every operand it takes from outside that cluster is
computed before the cluster starts, so the cluster can run as soon as it starts. The values a
cluster computes are stored only where something outside it (or the model's output) reads them.

A cluster's shape is tiled without copying an operand (:func:`plan_layout`): its dimensions are grouped
into runs that every operand's access pattern walks as one dimension, and seen as ``[*outer, rows,
*free]`` (one run split in two where that makes fewer tiles), each tile ``<= 128`` rows on the partitions
and the free dimensions flat (up to :data:`MAX_COLS` elements per partition, :data:`WIDE_COLS` in a
cluster large enough to keep many tiles of that width, a longer single run in column chunks), loaded
and stored by one DMA through the operands' own access patterns. A value
repeated over the whole shape (a scalar parameter broadcast) is loaded once per cluster into a column,
one repeated along the row once per tile; both are read as stride-0 views of that column. Each
operator becomes one or a few instructions on those tiles (the table below): activation functions on
ScalarE, float arithmetic on VectorE, 32-bit integer arithmetic on GpSimd.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nxsat import dtypes as dt
from nxsat.backend.graph import Ref
from nxsat.backend.lower import HOIST, Lowering, device_dtype, lowers, onchip_dtype
from nxsat.backend.tiles import COMMUTATIVE, SWAPPED, Operand, Tiles, column, is_num
from nxsat.diagnostics import error
from nxsat.extract.plan import MAX_COLS, WIDE_COLS, WIDE_TILES, max_cols  # noqa: F401 - the tiles' widths
from nxsat.ir import Module, Node, TensorType, post_order

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
    host: int | None = None  # the node whose lowering ran it on its result's tiles (backend/epilogue.py)


def is_elementwise(node: Node) -> bool:
    """An operator computed element by element on tiles of its own shape (a bitcast-convert that
    changes the element width changes the shape too: it is lowered on its own)."""
    if node.op not in EMITTERS or not isinstance(node.type, TensorType):
        return False
    return all(isinstance(o.type, TensorType) and o.shape == node.shape for o in node.operands) or \
        node.op not in SHAPE_CHANGING


EARLY_ELEMENTS = 1 << 16  # a value computed from the model's inputs alone this small is computed first
EARLY_VIEWS = frozenset({"parameter", "constant", "reshape", "broadcast", "transpose", "slice", "bitcast", "copy"})
PURE_VIEWS = frozenset({"reshape", "broadcast", "bitcast"})  # an access pattern over the operand, no instruction
VIEWS = PURE_VIEWS | {"transpose"}  # and a permutation of it


def fixed_values(order: list[Node]) -> set[int]:
    """The values of the post-order ``order`` computed from parameters and constants alone: views of
    them, and small elementwise values (a batch-norm scale ``gamma * rsqrt(var + eps)``)."""
    fixed: set[int] = set()
    for n in order:
        if all(o.id in fixed for o in n.operands) and (
                n.op in EARLY_VIEWS or is_elementwise(n) and math.prod(n.shape) <= EARLY_ELEMENTS):
            fixed.add(n.id)
    return fixed


def lowering_order(order: list[Node], fixed: set[int] | None = None) -> list[Node]:
    """The post-order ``order`` rearranged for clusters, which take only operands computed before they
    start. A small value computed from parameters and constants alone (``fixed``: :func:`fixed_values`)
    that is broadcast goes ahead of its first reader, with the views of parameters, level by level (so
    that the engines run each level's steps back to back): then the cluster applying it to a convolution's
    or a dot's result can start with that result and run as its epilogue (backend/epilogue.py). Every other
    elementwise operator goes just before its first reader (a causal mask's comparison, layernorm's
    ``x - mean`` once the variance is known): a reader of its shape computes it in its pass, after
    whatever else the pass reads."""
    fixed = fixed_values(order) if fixed is None else fixed
    readers: dict[int, list[Node]] = {}
    for n in order:
        for o in n.operands:
            readers.setdefault(o.id, []).append(n)
    early = set(fixed)
    for n in reversed(order):  # an elementwise value moves to the front only to be viewed (broadcast)
        rs = readers.get(n.id, ())
        if n.id in early and n.op not in EARLY_VIEWS and (not any(r.id in early for r in rs) or any(
                r.id not in early and is_elementwise(r) and r.shape == n.shape for r in rs)):
            early.discard(n.id)
    for n in order:  # a view of a value that moves later moves with it
        if n.id in early and not all(o.id in early for o in n.operands):
            early.discard(n.id)
    # level by level (a value after the values it reads; each level in program order): ResNet-50's 53
    # batch-norm scales and shifts, computed value by value, alternated VectorE and GpSimd one step at a
    # time ahead of its stem; level by level each engine runs its steps back to back
    depth: dict[int, int] = {}
    for n in order:
        if n.id in early:
            depth[n.id] = 1 + max((depth.get(o.id, 0) for o in n.operands), default=0)
    # ... each :data:`HOIST` places ahead of its first reader outside them (as side computations are), not
    # all ahead of the first: ResNet-50's 53 batch-norm scales and shifts held the stem's image rows behind
    # ~380 parameter loads and its first steps behind 200 VectorE steps (unet-inference 636.0 -> 604.0 us)
    pos = {n.id: k for k, n in enumerate(order)}
    due: dict[int, int] = {}
    for n in reversed(order):
        if n.id in early:
            due[n.id] = min((due[r.id] if r.id in early else pos[r.id] for r in readers.get(n.id, ())), default=0)
    batches: dict[int, list[Node]] = {}
    for n in sorted((n for n in order if n.id in early), key=lambda n: depth[n.id]):
        batches.setdefault(max(0, due[n.id] - HOIST), []).append(n)
    out: list[Node] = []
    placed = set(early)
    late = fixed | {n.id for n in order if is_elementwise(n)}
    keys = sorted(batches, reverse=True)

    def batches_until(k: int) -> None:
        while keys and keys[-1] <= k:
            out.extend(batches[keys.pop()])

    for k, n in enumerate(order):  # each after the moved values it reads (post_order skips what is placed)
        if n.id not in placed and n.id not in late:
            batches_until(k)
            out.extend(post_order(n, seen=placed))
    batches_until(len(order))
    for n in order:  # a moved value nothing reads (a model output)
        if n.id not in placed:
            out.extend(post_order(n, seen=placed))
    return out


def clusters(lw: Lowering, order: list[Node]) -> dict[int, Cluster]:
    """Each elementwise node's cluster (see the module's docstring)."""
    position = {n.id: k for k, n in enumerate(order)}
    for n in order:  # a parameter, a constant and views of them are read where they lie: there from the start
        if n.op in ("parameter", "constant") or n.op in PURE_VIEWS and all(
                position.get(o.id, 0) < 0 for o in n.operands):
            position[n.id] = -1
    of: dict[int, Cluster] = {}
    read_by: dict[int, list[Cluster]] = {}  # value id -> the clusters that read it from outside
    for k, n in enumerate(order):
        if not is_elementwise(n) or n.id in lw.absorbed:  # an absorbed cast is done by its consumer
            continue
        # the cluster of an operand, else one that already reads an operand (GELU's 0.5 * x beside its
        # x ** 3 chain: one pass loads x once, and stores nothing the pass itself reads back)
        near = [of[o.id] for o in n.operands if o.id in of] + [c for o in n.operands for c in read_by.get(o.id, ())]
        joined = next((c for c in near if c.shape == n.shape and len(c.members) < MAX_CLUSTER and all(
            of.get(x.id) is c or position[x.id] < c.first for x in n.operands)), None)
        if joined is None:
            joined = Cluster(n.shape, [], k)
        joined.members.append(n)
        of[n.id] = joined
        for o in n.operands:
            if of.get(o.id) is not joined and joined not in read_by.setdefault(o.id, []):
                read_by[o.id].append(joined)
    return of


@dataclass(frozen=True)
class Scaled:
    """``src * scale + bias`` not computed: the activation that alone reads it applies them itself."""

    src: Ref
    scale: float
    bias: float = -0.0


def _pass_readers(members: list[Node]) -> tuple[set[int], dict[int, list[Node]]]:
    """The members' ids, and per member the members that read it (a pass's own edges)."""
    ids = {m.id for m in members}
    readers: dict[int, list[Node]] = {}
    for m in members:
        for o in m.operands:
            if o.id in ids:
                readers.setdefault(o.id, []).append(m)
    return ids, readers


def scale_folds(lw: Lowering, members: list[Node], kept: set[int]) -> dict[int, tuple[Node, float, float]]:
    """The fp32 multiplications by a number, and additions or subtractions of one, that only an activation
    of the same pass reads (GELU's ``tanh(0.797885 * u)``, softmax's scaled ``exp``, a norm's
    ``rsqrt(var + eps)``): ScalarE computes ``func(scale * x + bias)`` in fp32, so the number is its
    ``scale`` or its ``bias`` and VectorE's (or ScalarE's own) pass over the tile is saved (resnet_small's
    19 batch norms: 19 fewer ScalarE steps ahead of the stem). ``1 * x + b`` is ``x + b`` and
    ``-1 * x + b`` is ``b - x`` exactly, so an addition or subtraction folds as XLA computes it. Member id
    -> (the operand, the scale, the bias); ``kept``: the members whose values are stored or read elsewhere."""
    ids = {m.id for m in members}
    readers: dict[int, list[Node]] = {}
    for m in members:
        for o in m.operands:
            readers.setdefault(o.id, []).append(m)
    out = {}
    for m in members:
        rs = readers.get(m.id, [])
        if m.op not in ("multiply", "add", "subtract") or m.id in kept or len(rs) != 1 or \
                EMITTERS.get(rs[0].op) is not _activation or lw.consumers.get(m.id, set()) - ids or \
                _dtype(m) is not dt.F32:
            continue
        nums = [lw.scalar(o) if o.id not in ids else None for o in m.operands]
        k = next((i for i, v in enumerate(nums) if v is not None), None)
        if k is None or nums[1 - k] is not None or not math.isfinite(float(nums[k])):
            continue
        v = float(nums[k])
        if m.op == "multiply":
            out[m.id] = (m.operands[1 - k], v, -0.0)
        elif m.op == "add" or k == 1:  # x + b, b + x, x - b
            out[m.id] = (m.operands[1 - k], 1.0, v if m.op == "add" else -v)
        else:  # b - x is b + (-x) in IEEE arithmetic, and -1 * x is exact
            out[m.id] = (m.operands[1], -1.0, v)
    return out


SHARED_ARITH = frozenset({"multiply", "add", "subtract"})  # x op number: identity(scale * x + bias) on ScalarE


@dataclass(frozen=True)
class Share:
    """How a pass's work per tile is split: the members ScalarE takes (:func:`act_share`), and the
    passes over the tile each engine then makes (a two-tile VectorE operation counting two)."""

    on_act: frozenset[int]
    act: int
    dve: int
    chained: frozenset[int] = frozenset()  # members their one reader takes as its first step (:func:`chains`)
    activated: frozenset[int] = frozenset()  # chains' second steps a ReLU takes as its scale and bias (:func:`relus`)
    doubled: tuple[tuple[int, Node], ...] = ()  # members also written in a reader's narrower type (:func:`doubles`)
    narrowed: tuple[tuple[int, Node], ...] = ()  # members written in their one reader's type (:func:`narrowings`)


def act_share(lw: Lowering, members: list[Node], folds: dict[int, tuple[Node, float, float]]) -> Share:
    """The members of a pass that ScalarE computes instead of VectorE: a float times, plus or minus a
    number is ``identity(scale * x + bias)`` on ScalarE, in fp32 as VectorE computes it. Taken in order
    while ScalarE has less of the pass's work than VectorE (a two-tile VectorE operation counting
    double): GELU's chain is seven VectorE passes over each tile and one ScalarE pass without it."""
    ids = {m.id for m in members}
    act = sum(1 for m in members if m.op in ACTIVATION)
    dve = sum(2 if sum(o.id in ids or lw.scalar(o) is None for o in m.operands) > 1 else 1
              for m in members if m.op not in ACTIVATION and m.id not in folds)
    out = set()
    for m in members:
        if act + 1 > dve - 1:
            break
        if m.op in SHARED_ARITH and m.id not in folds and _dtype(m) in (dt.F32, dt.BF16) and \
                sum(o.id not in ids and lw.scalar(o) is not None for o in m.operands) == 1 and \
                (m.op != "subtract" or m.operands[0].id in ids or lw.scalar(m.operands[0]) is None):
            out.add(m.id)
            act, dve = act + 1, dve - 1
    return Share(frozenset(out), act, dve)


def pass_plan(lw: Lowering, members: list[Node], kept: set[int]) -> tuple[dict[int, tuple[Node, float, float]], Share]:
    """What a pass over ``members`` computes where: the products its activations take as their scale
    (:func:`scale_folds`) and ScalarE's share of the rest (:func:`act_share`); ``kept``: the members
    whose values are stored or read elsewhere. A fused pass and a producer's epilogue both follow it."""
    folds = scale_folds(lw, members, kept)
    share = act_share(lw, members, folds)
    chained = chains(lw, members, kept, folds, share.on_act)
    narrowed = narrowings(lw, members, kept, folds, chained)
    return folds, replace(share, chained=chained, narrowed=narrowed, activated=relus(lw, members, kept, chained),
                          doubled=doubles(lw, members, folds, chained, narrowed))


def narrowings(lw: Lowering, members: list[Node], kept: set[int], folds: dict[int, tuple[Node, float, float]],
               chained: frozenset[int]) -> tuple[tuple[int, Node], ...]:
    """The members whose one reader converts them to a narrower float (an activation cast to bf16 for
    the next matmul): the engines compute in fp32 and round once as they write, so the member writes the
    converted type itself and the convert's pass over the tile goes (ResNet-50: 62 us of VectorE on its
    critical path). The member must be fp32, an arithmetic or activation step of one instruction, and its
    value needed by nothing else. Member id -> the convert."""
    from nxsat.backend.elementwise_ext import _arith

    ids, readers = _pass_readers(members)
    out = []
    for m in members:
        rs = readers.get(m.id, [])
        if len(rs) != 1 or rs[0].op != "convert" or m.id in kept or m.id in folds or m.id in chained \
                or lw.consumers.get(m.id, set()) - ids or EMITTERS.get(m.op) not in (_activation, _arith) \
                or m.op == "power" or _dtype(m) is not dt.F32:
            continue
        if _narrower(_dtype(rs[0])):
            out.append((m.id, rs[0]))
    return tuple(out)


SCALAR_ALU = frozenset({"add", "subtract", "multiply", "maximum", "minimum", "divide"})  # tensor_scalar's steps


def chains(lw: Lowering, members: list[Node], kept: set[int], folds: dict[int, tuple[Node, float, float]],
           on_act: frozenset[int]) -> frozenset[int]:
    """The members that may be the first step of their reader's ``tensor_scalar``: ``(x op0 a) op1 b``
    is one VectorE pass when ``a`` and ``b`` are numbers or one value per partition (a batch norm's
    ``(x - mean) * scale``, then ``+ beta`` and the ReLU). The first result must be fp32 (the instruction
    carries it to the second step in fp32 unrounded, as the separate steps would), read once and by the
    pass alone; whether the other operands are numbers or columns is seen when the tile is made."""
    ids, readers = _pass_readers(members)
    out: set[int] = set()
    seconds: set[int] = set()
    for m in members:
        rs = readers.get(m.id, [])
        if (m.op not in SCALAR_ALU or m.id in kept or m.id in folds or m.id in on_act or m.id in seconds
                or _dtype(m) is not dt.F32 or lw.consumers.get(m.id, set()) - ids or len(rs) != 1):
            continue
        r = rs[0]
        if r.op in SCALAR_ALU and r.id not in folds and r.id not in on_act and _dtype(r).is_float \
                and sum(o.id == m.id for o in r.operands) == 1:
            out.add(m.id)
            seconds.add(r.id)
    return frozenset(out)


def _narrower(want: dt.DType) -> bool:
    """A float an fp32 step may write rounded as the convert would (not fp8, which XLA saturates to NaN)."""
    return want.is_float and want.itemsize < 4 and want is not dt.F8E4M3FN


def doubles(lw: Lowering, members: list[Node], folds: dict[int, tuple[Node, float, float]], chained: frozenset[int],
            narrowed: tuple[tuple[int, Node], ...]) -> tuple[tuple[int, Node], ...]:
    """The members that one reader converts to a narrower float while others (or a store) read them in
    fp32 (a residual block's ReLU: the next block's shortcut adds it in fp32, its first convolution reads
    it in bf16): the step is made twice, the second time written in the convert's type, where it was
    followed by a copy (the same rounding: the engines compute in fp32 and round once as they write).
    The two steps go to whichever of ScalarE and VectorE has less work, where the copy was VectorE's:
    ResNet-50's residual blocks end in an fp32 add on VectorE (two cycles an element), which the copy
    queued behind. Member id -> the convert. One instruction of arithmetic or an activation on one tile
    (a step of two costs VectorE twice the copy it replaces: BERT generic's residual adds, 1,563.8 ->
    1,687.8 us), fp32, into a narrower float (not fp8)."""
    from nxsat.backend.elementwise_ext import _arith

    ids, readers = _pass_readers(members)
    done = {mid for mid, _ in narrowed}
    out = []
    for m in members:
        rs = readers.get(m.id, [])
        casts = [r for r in rs if r.op == "convert" and sum(o.id == m.id for o in r.operands) == 1]
        if len(casts) != 1 or len(rs) + len(lw.consumers.get(m.id, set()) - ids) < 2 or m.id in done \
                or m.id in folds or m.id in chained or EMITTERS.get(m.op) not in (_activation, _arith) \
                or m.op == "power" or _dtype(m) is not dt.F32 \
                or sum(o.id in ids or lw.scalar(o) is None for o in m.operands) != 1:
            continue
        if _narrower(_dtype(casts[0])):
            out.append((m.id, casts[0]))
    return tuple(out)


def relus(lw: Lowering, members: list[Node], kept: set[int], chained: frozenset[int]) -> frozenset[int]:
    """The second steps of chains (:func:`chains`) whose one reader is a ReLU, ``max(y, 0)``: when the chain
    is ``x * a + b`` (a batch norm's scale and shift), the ReLU is one ScalarE ``activation`` of ``x``
    with ``a`` and ``b`` as its scale and bias, in fp32 as the ``tensor_scalar`` computes them (two
    roundings, no fused multiply-add): one pass over the tile instead of two. Whether the chain has that
    form is seen when the tile is made (a chain of other steps keeps its ``tensor_scalar``)."""
    ids, readers = _pass_readers(members)
    seconds = {r.id for m in members if m.id in chained for r in readers.get(m.id, [])}
    out = set()
    for m in members:
        rs = readers.get(m.id, [])
        if m.id not in seconds or m.id in kept or lw.consumers.get(m.id, set()) - ids or len(rs) != 1 \
                or _dtype(m) is not dt.F32:
            continue
        r = rs[0]
        others = [o for o in r.operands if o.id != m.id]
        if r.op == "maximum" and len(others) == 1 and lw.scalar(others[0]) == 0 and _dtype(r).is_float:
            out.add(m.id)
    return frozenset(out)


# --- reshapes sunk below elementwise chains --------------------------------------------------------

def _scalar_splat(n: Node) -> bool:
    return n.op == "broadcast" and isinstance(n.operands[0].type, TensorType) and n.operands[0].shape == ()


def sinkable_reshapes(module: Module) -> dict[int, tuple[int, ...]]:
    """The elementwise nodes to compute in the shape their operands had before a reshape (node id ->
    that shape): every tensor operand a reshape of a value of that shape, a number broadcast, or
    another such node. Relay's GELU after a dense reads ``reshape(dense + bias)`` in ``[50, 32, 3072]``
    where the dense made ``[1600, 3072]``: computed in the dense's shape, the chain joins the bias's
    pass and runs as the dense's epilogue, and one reshape (a view) follows it. A node is left where
    it is when an elementwise reader of it would stay in the other shape (the pass would split). A model
    input or constant operand is read reshaped (a view)."""
    from nxsat.backend import families  # noqa: F401 - every emitter registered (is_elementwise)

    order = module.entry.post_order()
    readers: dict[int, list[Node]] = {}
    for n in order:
        for o in n.operands:
            readers.setdefault(o.id, []).append(n)
    to: dict[int, tuple[int, ...]] = {}
    for n in order:
        if not is_elementwise(n) or not n.operands:
            continue
        shapes = {o.operands[0].shape if o.op == "reshape" else to[o.id] for o in n.operands
                  if o.op == "reshape" or o.id in to}
        if len(shapes) == 1 and all(o.op == "reshape" or o.id in to or _scalar_splat(o) or _input(o)
                                    for o in n.operands):
            (shape,) = shapes
            if shape != n.shape and math.prod(shape) == math.prod(n.shape):
                to[n.id] = shape
    by_id = {n.id: n for n in order}
    changed = True
    while changed:
        changed = False
        for nid in list(to):  # a node whose elementwise reader stays: one pass would become two
            if any(is_elementwise(r) and r.id not in to for r in readers.get(nid, ())):
                del to[nid]
                changed = True
        for group in _groups(to, by_id):  # a group that joins no producer's pass, or only casts: left
            sources = [o.operands[0] for n in group for o in n.operands if o.op == "reshape"]
            if all(n.op == "convert" for n in group) or not any(
                    is_elementwise(x) or x.op in ("dot", "convolution") for x in sources):
                for n in group:
                    del to[n.id]
                changed = True
    return to


def _input(o: Node) -> bool:
    """A model input or a constant, or a broadcast of one, read where it lies: a reshape of it is a view, or
    where no access pattern expresses it, one copy made once (gpt2_extract's residual constant, [32, 768]
    broadcast over 50 sequences and read as the dense's [1600, 768] rows: ``Lowering.contiguous``)."""
    while o.op in ("broadcast", "reshape") and o.operands and not _scalar_splat(o):
        o = o.operands[0]
    return o.op in ("parameter", "constant") and isinstance(o.type, TensorType) and not _scalar_splat(o)


def _groups(to: dict[int, tuple[int, ...]], by_id: dict[int, Node]) -> list[list[Node]]:
    """The chosen nodes in groups joined by operand edges (each group one pass after the change)."""
    parent = {nid: nid for nid in to}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for nid in to:
        for o in by_id[nid].operands:
            if o.id in to:
                parent[root(o.id)] = root(nid)
    groups: dict[int, list[Node]] = {}
    for nid in to:  # in the order chosen (post-order): deterministic
        groups.setdefault(root(nid), []).append(by_id[nid])
    return list(groups.values())


def sink_reshapes(module: Module) -> Module:
    """``module`` with :func:`sinkable_reshapes` applied: each chosen node computed in its operands' shape,
    followed by a reshape to its own (the same values)."""
    from nxsat.passes import rewrite_module

    to = sinkable_reshapes(module)
    if not to:
        return module

    def expand(rw: Any, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
        shape = to.get(node.id)
        if shape is None:
            return None
        new_ops = []
        for o in ops:
            if o.op == "reshape" and o.operands[0].shape == shape:
                new_ops.append(o.operands[0])
            elif _input(o):  # a model input or constant seen in the other shape (a view)
                new_ops.append(Node("reshape", [o], {"shape": shape}, o.tensor.with_shape(shape), f"{o.name}.reshape",
                                    o.loc))
            else:  # a number broadcast
                new_ops.append(Node("broadcast", o.operands, {"shape": shape, "dimensions": ()},
                                    o.tensor.with_shape(shape), o.name, o.loc))
        inner = Node(node.op, new_ops, attrs, node.tensor.with_shape(shape), node.name, node.loc)
        return Node("reshape", [inner], {"shape": node.shape}, node.type, f"{node.name}.reshape", node.loc)

    return rewrite_module(module, expand)


# --- the kernel ------------------------------------------------------------------------------------

class Kernel:
    """One tile of one cluster: its inputs loaded, its members computed in order. The tile is rows
    ``at[0]..`` and columns ``at[1]..`` of the cluster's ``shape`` seen as ``[rows, cols]`` (``grid``):
    what an operator whose values depend on the position (iota) needs."""

    def __init__(self, lw: Lowering, tiles: Tiles, shape: tuple[int, ...] = (), at: tuple[int, int] = (0, 0),
                 grid: tuple[int, int] = (1, 1), share: Share | None = None) -> None:
        self.lw = lw
        self.t = tiles
        self.g = lw.graph
        self.shape = shape
        self.at = at
        self.grid = grid
        self.on_act = share.on_act if share else frozenset()  # members ScalarE computes (act_share)
        self.chained = share.chained if share else frozenset()  # first steps of a tensor_scalar (chains)
        self.narrowed = dict(share.narrowed) if share else {}  # members written in their convert's type
        self.activated = share.activated if share else frozenset()  # chains a ReLU's activation takes (relus)
        self.doubled = dict(share.doubled) if share else {}  # members also written narrow (doubles)
        self.early: dict[int, Ref] = {}  # convert id -> the value its operand's second step wrote


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


@dataclass(frozen=True)
class Layout:
    """How a cluster's shape is tiled without copying any operand: ``shape`` seen as ``axes`` (each a run
    of the cluster's dimensions, or a factor of one, that every operand's access pattern walks as one
    dimension), the last ``len(free)`` of them flat on a tile's free axis (``cols`` elements per
    partition; with ``chunk`` the one free axis in pieces of ``cols_max``), axis ``rows`` on the
    partitions (``<= 128`` at a time) and every other one looped over. ``view`` orders the axes so: loops,
    rows, free."""

    axes: tuple[int, ...]
    rows: int  # the index of the axis on the partitions
    nfree: int
    chunk: bool
    cols_max: int = MAX_COLS  # a chunk's elements per partition

    @property
    def free(self) -> tuple[int, ...]:
        return self.axes[len(self.axes) - self.nfree:]

    @property
    def cols(self) -> int:
        return math.prod(self.free)

    @property
    def loops(self) -> tuple[int, ...]:
        """The looped axes' indices, outermost first."""
        return tuple(i for i in range(len(self.axes) - self.nfree) if i != self.rows)

    @property
    def perm(self) -> tuple[int, ...]:
        return (*self.loops, self.rows, *range(len(self.axes) - self.nfree, len(self.axes)))

    @property
    def positional(self) -> bool:
        """Are a tile's rows consecutive rows of the shape seen as ``[-1, cols]`` (what iota needs)?"""
        return self.rows == len(self.axes) - self.nfree - 1

    def view(self, r: Ref) -> Ref:
        """``r`` (of the cluster's shape) as ``[*loops, rows, *free]``."""
        return r.reshape(*self.axes).permute(*self.perm)


def _runs(shape: tuple[int, ...], aps: list[tuple[tuple[int, int], ...]]) -> list[list[int]]:
    """The cluster's dimensions grouped into maximal runs that every access pattern (``(size, stride)``
    per dimension) walks as one dimension."""
    groups: list[list[int]] = []
    last: list[tuple[int, int] | None] = [None] * len(aps)  # per access: the run's innermost dimension
    for d, n in enumerate(shape):
        joins = bool(groups) and all(
            n == 1 or lst is None or lst[1] == ap[d][1] * n for ap, lst in zip(aps, last))
        if not joins:
            groups.append([])
            last = [None] * len(aps)
        groups[-1].append(n)
        if n != 1:
            last = [ap[d] for ap in aps]
    return groups


MIN_ROW = 16  # elements a partition of a small elementwise tile (plan_layout)
# A large cluster's tiling is the one of least time (plan_layout), in an engine's cycles: per tile and step,
# the elements a partition holds (at least MIN_II, an instruction's least time) and TILE_FIXED for its fixed
# costs and its loads and stores; less ROUND_TRIP for each input (two at most) read in its producer's
# partitions, a store and a load through HBM saved. By tile count alone CLIP's scores went in 6 tiles of
# [8, 1024], 8 of 128 lanes busy, rather than 8 of [77, 77]; with TILE_FIXED 64, gemma3's MLP product went
# in 8 tiles of [11, 864] rather than 7 of [11, 1024] (+0.3%); without the round trips, in 11 of [128, 54]
# that read its inputs through HBM (+1.8%).
MIN_II = 64
TILE_FIXED = 512
ROUND_TRIP = 8192
# A cluster of at most this many elements reads each input in its producer's partitions where a tiling
# can (then the forwarding pass copies it on chip instead of a store and a load through HBM, ~3 us on
# the critical path), in as few tiles as can; a larger one weighs that against its time (above)
FOLLOW_ELEMS = 16384
# ... and does so even in more tiles, while their extra steps (an instruction per operator and tile, ~0.06
# us each) cost less than the round trip through HBM they save (a store and a load, ~3 us): a [1, 256] mean
# whose producer holds channel ``j * 128 + p`` on partition ``p`` read as two [128, 1] tiles, not one
# [128, 2] (resnet_small's pooled features: two round trips through HBM, 5.7 us, before the dense);
# ResNet-50's [1, 2048] mean divided and converted in 16 (4 tiles at most: 604.0 -> 596.1 us)
FOLLOW_STEPS = 32


def plan_layout(shape: tuple[int, ...], aps: list[tuple[tuple[int, int], ...]], part: int,
                positional: bool = False, of_params: bool = False,
                stored: tuple[tuple[int, int], ...] = (), steps: int = 1) -> Layout:
    """The tiling with the fewest tiles (then the most partitions per tile) over the runs of ``shape``: the
    free axis the innermost runs (the outermost of them maybe split), the partitions any other axis (with
    ``positional``, the one just outside the free axis). First of all, the fewest operands read element by
    element: one whose innermost free elements are not adjacent is a DMA descriptor per element (150 us
    for a [128, 768] bf16 tile) unless it is one value per row over the whole free axis (a column)."""
    cap = max_cols(shape, part)
    groups = _runs(shape, aps) if shape else [[1]]
    sizes = [math.prod(g) for g in groups]
    # per access, per run: the stride of the run's innermost dimension (None: the run is all 1s)
    strides: list[list[int | None]] = []
    for ap in aps:
        row, d = [], 0
        for g in groups:
            inner = [ap[i][1] for i in range(d, d + len(g)) if shape and shape[i] != 1]
            row.append(inner[-1] if inner else None)
            d += len(g)
        strides.append(row)

    def scattered(k: int) -> int:
        n = 0
        for row in strides:
            free = [st for st in row[k:] if st is not None]
            if free and free[-1] != 1 and any(free):
                n += 1
        return n

    # ``of_params``: the cluster computes from the model's parameters and constants alone, for
    # elementwise readers (which load it from HBM whatever its layout). A small one-run shape (a batch
    # norm's per-channel vectors) then goes on fewer partitions in rows of MIN_ROW: each partition row
    # loaded or stored is a DMA descriptor (12 ns of engine time; ResNet-50 starts with 230 such loads),
    # while an instruction's time hardly depends on so few elements. A value that comes from or goes to
    # another operator (a softmax's per-row statistic, a decoder's token) keeps the most partitions:
    # that layout lets it be forwarded in SBUF.
    total_elems = math.prod(shape) if shape else 1
    small = of_params and len(groups) == 1 and MIN_ROW * 4 <= total_elems < part * MIN_ROW
    useful = max(1, total_elems // MIN_ROW)
    follow = total_elems <= FOLLOW_ELEMS

    def follows(k: int, b: int, rows: int, lead: tuple[int, ...]) -> int:
        """How many of the ``stored`` inputs this tiling reads with their producer's partition stride."""
        n = 0
        for a, stride in stored:
            inner = strides[a][rows] if rows < k else (None if strides[a][k] is None else strides[a][k] * b)
            n += lead[rows] > 1 and inner == stride
        return n

    best: tuple[tuple[int, ...], Layout] | None = None
    for k in range(len(sizes) - 1, -1, -1):
        tail = math.prod(sizes[k + 1:])
        if tail > cap:
            break
        g = sizes[k]
        options = [(b, False) for b in range(1, min(g, cap // tail) + 1) if g % b == 0]
        if k == len(sizes) - 1 and g > cap:
            options.append((g, True))
        for b, chunk in options:
            free = tuple(x for x in (b, *sizes[k + 1:]) if x != 1) or (1,)
            lead = (*sizes[:k], g // b)
            total = math.prod(lead)
            for rows in ([len(lead) - 1] if positional else range(len(lead))):
                n = lead[rows]
                tiles = total // n * -(-n // part) * (-(-b // cap) if chunk else 1)
                est = tiles * (max(MIN_II, min(b, cap) * tail if chunk else math.prod(free)) + TILE_FIXED)
                fl = -follows(k, b, rows, lead)
                if follow:  # a small cluster: the fewest tiles, then its producers' partitions
                    first = (0 if tiles * steps <= FOLLOW_STEPS else est, fl)
                else:  # a large one: the least time (MIN_II above)
                    first = (est * steps + ROUND_TRIP * max(fl, -2), est)
                score = (scattered(k), *first, est, -min(n, part, useful) if small else -min(n, part),
                         n if small and n > useful else 0)
                if best is None or score < best[0]:
                    best = (score, Layout((*lead, *free), rows, len(free), chunk, cap))
    assert best is not None
    return best[1]


def stored_stride(r: Ref) -> int | None:
    """The stride (in elements of the whole tensor) between the partitions of the SBUF tiles that stored
    the scratch tensor ``r`` views, where every store of it has the same; else None."""
    b = r.buf.root
    if b.kind != "scratch":
        return None
    found: set[int] = set()
    for u in b.users:
        for w in u.writes:
            if w.buf.root is b:
                if not (u.engine == "dma" and u.operands[1].buf.onchip):
                    return None
                dims = w.ap.dims
                if dims and dims[0][0] > 1:
                    found.add(dims[0][1])
    return found.pop() if len(found) == 1 else None


SCATTERED_RUN = 64  # bytes: an operand read in runs shorter than this is read one descriptor a run
COMPACT_REUSE = 4  # ... and compacted once where the cluster reads each of its elements this many times
COMPACT_DESCRIPTORS = 4096  # ... and its reads would take this many descriptors (~3 us of all 16 engines):
# below, the copy's own round trip through HBM costs more than it saves (gemma3's [11, 11] masks broadcast
# over the heads: 7,966.5 -> 7,977.2 us under transformer, generic 8,914.3 -> 9,282.2, compacted)


def _compacted(lw: Lowering, v: Ref, node: Node) -> Ref:
    """``v``, or where it is a broadcast of a scattered HBM value (each element read many times, each read
    a descriptor of a few bytes) the same broadcast of a compact copy: the distinct elements copied once,
    in the order the tiles read them. Swin's relative-position bias, a [3, 49, 49] view of a gathered
    [2401, 3] table broadcast over 64 windows, was loaded four bytes at a time for every window."""
    dims = v.ap.dims
    wide = [i for i, (n, st) in enumerate(dims) if st == 0 and n > 1]
    if v.buf.onchip or not wide:
        return v
    src = v[tuple(slice(0, 1) if i in wide else slice(None) for i in range(len(dims)))]
    run = src.ap.contiguous_run()
    reads = math.prod(v.shape)
    if run * v.dtype.itemsize >= SCATTERED_RUN or reads < COMPACT_REUSE * math.prod(src.shape) \
            or reads // run < COMPACT_DESCRIPTORS:
        return v
    out = lw.contiguous(src, node)
    for i in wide:
        out = out.broadcast(i, v.shape[i])
    return out


def _read_elementwise(lw: Lowering, nid: int) -> bool:
    """Is value ``nid`` read only by elementwise operators (through views), and not returned? Not by a dot,
    which would take it from SBUF in the layout its producer chose."""
    if nid in lw.output_of:
        return False
    for c in lw.consumers.get(nid, ()):
        op = lw.node(c).op
        if op in VIEWS:
            if not _read_elementwise(lw, c):
                return False
        elif op not in EMITTERS:
            return False
    return True


def lower_cluster(lw: Lowering, cl: Cluster, consumers: dict[int, set[int]]) -> None:
    """One pass over tiles of the cluster's shape (:class:`Layout`): every input read in place through its
    access pattern (a value repeated over the whole shape loaded once into a column; one repeated along a
    tile's row loaded as a column per tile), every needed result stored once."""
    members = cl.members
    ids = {m.id for m in members}
    outputs = [m for m in members if m.id in lw.output_of or consumers.get(m.id, set()) - ids]
    part = lw.target.partitions
    shape = cl.shape
    if math.prod(shape) == 0:
        return
    # Every input (an operand from outside the cluster): an immediate, a value repeated everywhere, or a view.
    inputs: dict[int, Operand] = {}
    repeated: dict[int, Ref] = {}  # one element seen everywhere, as a [1, 1] access
    for m in members:
        for o in m.operands:
            if o.id in ids or o.id in inputs or o.id in repeated:
                continue
            s = lw.scalar(o)
            if s is not None:
                inputs[o.id] = s
                continue
            r = lw.ref(o)
            if o.shape == ():
                repeated[o.id] = r.reshape(1, 1)
            elif all(n == 1 or st == 0 for n, st in r.ap.dims):
                repeated[o.id] = r[(0,) * len(shape)].reshape(1, 1)
            else:
                inputs[o.id] = r
    stores = {m.id: lw.result(m) for m in outputs}
    folds, share = pass_plan(lw, members, set(stores))
    views = [r for r in inputs.values() if isinstance(r, Ref)] + list(stores.values())
    of_params = all(m.id in lw.fixed for m in members) and all(_read_elementwise(lw, m.id) for m in outputs)
    stored = tuple((a, st) for a, r in enumerate(views[:len(views) - len(stores)])
                   if (st := stored_stride(r)) is not None)
    lay = plan_layout(shape, [r.ap.dims for r in views], part, any(m.op == "iota" for m in members), of_params,
                      stored, len(members))
    nf = lay.nfree
    view_of = {oid: _compacted(lw, lay.view(r), members[0]) for oid, r in inputs.items() if isinstance(r, Ref)}
    # inputs repeated along the free axes (a per-row value): a column per tile
    per_row = {oid for oid, v in view_of.items() if lay.cols > 1
               and all(n == 1 or st == 0 for n, st in v.ap.dims[-nf:])}
    store_of = {mid: lay.view(r) for mid, r in stores.items()}
    nrows = lay.axes[lay.rows]
    pmax = min(part, nrows)
    cols_of: dict[int, Ref] = {}
    for oid, r in repeated.items():
        lw.graph.origin = _origin(next(m for m in members if any(o.id == oid for o in m.operands)))
        col = lw.graph.tile((pmax, 1), onchip_dtype(r.dtype), "sbuf", "ewrep").ref()
        lw.graph.add("dma", "dma", col, r.broadcast(0, pmax))
        cols_of[oid] = col
    rows_total = math.prod(lay.axes[:len(lay.axes) - nf])
    for o_flat, o_idx in enumerate(itertools.product(*(range(lay.axes[i]) for i in lay.loops))):
        for r0 in range(0, nrows, part):
            rn = min(part, nrows - r0)
            for c0 in range(0, lay.cols, lay.cols_max if lay.chunk else lay.cols):
                cn = min(lay.cols_max, lay.cols - c0) if lay.chunk else lay.cols
                at: tuple = (*o_idx, slice(r0, r0 + rn))
                key = (*at, *((slice(c0, c0 + cn),) if lay.chunk else ()))
                k = Kernel(lw, Tiles(lw.graph, (rn, cn), "ew"), shape, (o_flat * nrows + r0, c0),
                           (rows_total, lay.cols), share)
                val: dict[int, Operand] = {}
                for oid, src in inputs.items():
                    if is_num(src):
                        val[oid] = src
                    elif oid in per_row:
                        col = lw.graph.tile((rn, 1), onchip_dtype(src.dtype), "sbuf", "ewcol").ref()
                        lw.graph.add("dma", "dma", col, view_of[oid][(*at, *([0] * nf))].reshape(rn, 1))
                        val[oid] = col.broadcast(1, cn)
                    else:
                        tile = k.t.tile(onchip_dtype(src.dtype))
                        lw.graph.load(_shaped(tile, rn, lay, cn), view_of[oid][key])
                        val[oid] = tile
                for oid, col in cols_of.items():
                    c = col[0:rn]
                    val[oid] = c.broadcast(1, cn) if cn > 1 else c
                for m in members:
                    lw.graph.origin = _origin(m)
                    val[m.id] = folded(k, m, val, folds)
                for m in outputs:
                    lw.graph.origin = _origin(m)
                    v = val[m.id]
                    if is_num(v):
                        v = k.t.memset(v, onchip_dtype(device_dtype(m.dtype)))
                    assert isinstance(v, Ref)
                    lw.graph.add("dma", "dma", store_of[m.id][key], _shaped(v, rn, lay, cn))


def _shaped(tile: Ref, rn: int, lay: Layout, cn: int) -> Ref:
    """A ``[rn, cn]`` tile (or view of one) as the tile's view of the layout: ``[rn, *free]``."""
    if lay.chunk or len(lay.free) == 1:
        return tile
    return tile.reshape(rn, *lay.free)


def _origin(node: Node) -> str:
    from nxsat.backend.lower import _origin as origin

    return origin(node)


@dataclass(frozen=True)
class Chained:
    """``src op scalar`` not computed: its one reader makes it the first step of its ``tensor_scalar``."""

    src: Ref
    op: str
    scalar: Ref | float | int


@dataclass(frozen=True)
class Affine:
    """``src * scale + bias`` not computed: the ReLU reading it is one activation of ``src`` (:func:`relus`)."""

    src: Ref
    scale: Ref | float | int
    bias: Ref | float | int


def _scalar_form(m: Node, ops: list[Any]) -> tuple[Any, str, Ref | float | int] | None:
    """``m`` as ``x op s`` with ``s`` a number or a column (one value per partition), if it is one."""
    if len(ops) != 2 or m.op not in SCALAR_ALU:
        return None
    op = ALU[m.op]
    a, b = ops
    if any(isinstance(v, Ref) and not v.dtype.is_float for v in ops):
        return None
    sb = b if is_num(b) else column(b)
    if sb is not None and not is_num(a) and column(a) is None:
        return a, op, sb
    sa = a if is_num(a) else column(a)
    if sa is not None and not is_num(b) and column(b) is None and (op in COMMUTATIVE or op in SWAPPED):
        return b, op if op in COMMUTATIVE else SWAPPED[op], sa
    return None


def folded(k: Kernel, m: Node, val: dict[int, Any], folds: dict[int, tuple[Node, float, float]]) -> Any:
    """``m`` on the tiles of ``val``, unless it is a product an activation takes as its scale (``folds``)
    or the first step of its reader's ``tensor_scalar`` (``Kernel.chained``), or a convert its operand
    already wrote (``Kernel.narrowed``)."""
    if m.op == "convert" and m.operands[0].id in k.narrowed:
        v = val[m.operands[0].id]
        if isinstance(v, Ref) and v.dtype is _dtype(m):
            return v
    if m.id in k.early:
        return k.early.pop(m.id)
    if m.id in k.narrowed:  # computed as before, written in the convert's type
        m = copy.copy(m)
        m.type = k.narrowed[m.id].type
    if m.id in folds and isinstance(val[folds[m.id][0].id], Ref):
        return Scaled(val[folds[m.id][0].id], folds[m.id][1], folds[m.id][2])
    ops = [val[o.id] for o in m.operands]
    aff = next((v for v in ops if isinstance(v, Affine)), None)
    if aff is not None:  # a ReLU of a batch norm's x * a + b (relus): one activation
        out = k.t.tile(_dtype(m))
        k.g.add("act", "activation", out, aff.src, func="relu",
                scale=aff.scale if isinstance(aff.scale, Ref) else float(aff.scale),
                bias=aff.bias if isinstance(aff.bias, Ref) else float(aff.bias))
        return out
    if m.op not in ACTIVATION:  # only an activation takes a product as its scale
        ops = [_unfolded(k, v) if isinstance(v, Scaled) else v for v in ops]
    first = next((v for v in ops if isinstance(v, Chained)), None)
    if first is not None:
        form = _scalar_form(m, [v.src if v is first else v for v in ops])
        if form is not None and form[0] is first.src and m.id not in k.on_act:
            if m.id in k.activated and first.op == "mul" and form[1] == "add":
                return Affine(first.src, first.scalar, form[2])
            return k.t.scalar2(first.src, first.op, first.scalar, form[1], form[2], _dtype(m))
        ops = [k.t.scalar2(v.src, v.op, v.scalar, "none", 0, dt.F32) if v is first else v for v in ops]
    if m.id in k.chained and all(isinstance(v, Ref) or is_num(v) for v in ops):
        form = _scalar_form(m, ops)
        if form is not None and isinstance(form[0], Ref):
            return Chained(*form)
    cast = k.doubled.get(m.id)
    if cast is not None and all(isinstance(v, Ref) or is_num(v) for v in ops):
        narrow = copy.copy(m)
        narrow.type = cast.type
        k.early[cast.id] = emit(k, narrow, ops)  # first: the narrow value is the one the next matmul waits for
    return emit(k, m, ops)


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
    if node is not cl.members[0] or cl.host is not None:
        return
    lower_cluster(lw, cl, lw.consumers)


# --- operators -----------------------------------------------------------------------------------

def _dtype(node: Node) -> dt.DType:
    return onchip_dtype(device_dtype(node.dtype))


@emits(*ACTIVATION)
def _activation(k: Kernel, node: Node, ops: list[Operand]) -> Ref:
    x, scale, bias = (ops[0].src, ops[0].scale, ops[0].bias) if isinstance(ops[0], Scaled) else (ops[0], 1.0, -0.0)
    if is_num(x):
        x = k.t.memset(x, dt.F32)
    d = _dtype(node)
    return k.t.act(ACTIVATION[node.op], x, dt.F32 if d is dt.F8E4M3FN else d, scale, bias)  # e4m3fn: narrowed as XLA


def _unfolded(k: Kernel, v: Scaled) -> Ref:
    """A fold's value computed after all (a reader other than an activation): ``src * scale + bias``, the
    steps the fold stood for (a bias of -0.0 adds nothing: ``x + -0.0`` is ``x``)."""
    x = v.src if v.scale == 1.0 else k.t.binary("mul", v.src, v.scale, dt.F32)
    return x if v.bias == 0.0 and math.copysign(1.0, v.bias) < 0 else k.t.binary("add", x, v.bias, dt.F32)

"""Reductions: ``reduce`` in every form XLA emits, on the partitions of the NeuronCore.

**Layout.** The operand's dimensions are grouped into the runs one access-pattern dimension covers
(kept and reduced ones apart, merged where memory allows). One group goes to the partitions, split as
``[A <= 128, B]`` (partition ``a`` holds the group's elements ``a*B .. a*B+B-1``, so each partition
reads long runs; or, interleaved, ``a, a + A, ...``, the partitions of a producer that stored it from SBUF
a row per partition, which the forwarding pass then reads in place; a remainder of fewer than ``A``
elements is a second, shorter piece); every other group
(and ``B``) is a free dimension of the tile, in memory order so that DMAs move contiguous runs.
:func:`choose_layout` prices the candidates (DMA bytes and descriptors against per-partition compute):
a kept group on the partitions needs nothing more; a reduced one (a full reduction, or sums over an
outer dimension whose inner one is kept) spreads the work over the partitions and combines the
partials across them at the end:

- float add: TensorE, a ones vector against the partials, accumulating every tile in one PSUM group;
- float max/min (and mul where the transpose is exact): a TensorE transpose, then ``tensor_reduce``.
  NeuronCore-v2 transposes through an identity matmul, where an infinity becomes NaN along its row:
  there the partials are clamped to finite values and two flags (an infinity that wins, nothing but
  the other infinity) restore the result;
- anything else (integers, bitwise, other bodies): the partials go through an HBM scratch and come
  back transposed (exact for every type).

**Arithmetic.** Tiles are cut to :data:`CHUNK_BYTES` per partition. Float add/mul/max/min run as one
``tensor_reduce`` per tile on VectorE (fp32 accumulation, NaN propagating), partials combine in fp32
(mixed-precision accumulation; with it disabled, in the operand's type) and are rounded once; 32-bit
integers reduce exactly on GpSimd (narrower ones are widened first for add/mul, and wrap like XLA on
the way out); predicates as bytes (and = min, or = max). Bitwise bodies on integers and any other body
(variadic argmax/argmin, ...) are evaluated elementwise on tiles, pairwise over the reduced axes (a
tree: log2 steps), with the elementwise emitters of :mod:`nxsat.backend.elementwise`. The init value
enters once, at the end. An ``iota`` operand (argmax's indices) is generated on chip.

**Fusion.** A widening convert feeding the reduction (``reduce(convert(bf16 -> f32))``) is read
through: the tiles load the narrow values and accumulate in fp32. A float convert that only consumes
the result is written directly (the result is rounded once, to its type).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.elementwise import EMITTERS, Kernel, emit, lower_cluster, stored_stride
from nxsat.backend.epilogue import Epilogue, prologue
from nxsat.backend.graph import Ref
from nxsat.backend.lower import HOSTS, Lowering, device_dtype, lowers, onchip_dtype, plans
from nxsat.backend.tiles import Operand, Tiles, is_num
from nxsat.diagnostics import error
from nxsat.ir import Computation, Node, TensorType, TupleType

CHUNK_BYTES = 2048  # bytes per partition of one input tile (small: loads in flight share the DMA engines,
# so the first tiles arrive sooner and compute overlaps the rest)
BODY_CHUNK = 512  # elements per partition of one tile when a body is evaluated on it (many temporaries)
PSUM_COLS = 512  # fp32 columns of one PSUM bank: the kept elements one matmul combine produces
MAX_OUT_TILE = 2048  # kept elements per partition held in one output tile (stored with one DMA)
FMAX = float(np.finfo(np.float32).max)
INTERLEAVE_MARGIN = 1.0  # an interleaved layout's price over a blocked one's that chooses it (choose_layout)
ACT_SPLIT = 8  # kept elements per tile up to which a float sum may run on ScalarE (one activation each)

# Body operator -> tensor_reduce / ALU operation, for floats and integers.
ALU = {"add": "add", "multiply": "mul", "maximum": "max", "minimum": "min"}
# On predicates (bytes holding 0 or 1): or is max, and is min.
PRED_ALU = {"add": "max", "or": "max", "maximum": "max", "multiply": "min", "and": "min", "minimum": "min"}
BITWISE = ("and", "or", "xor")
IDENTITY = {"add": 0, "mul": 1}


# --- the body ---------------------------------------------------------------------------------------

def body_op(body: Computation) -> str | None:
    """The operator a reduction body applies to its two parameters, when it is one binary operator."""
    root = body.root
    if len(body.params) == 2 and len(root.operands) == 2 and \
            {o.id for o in root.operands} == {p.id for p in body.params} and isinstance(root.type, TensorType):
        return root.op
    return None


@dataclass
class Reducer:
    """How one reduction computes: ``alu`` (a tensor_reduce operation), ``bitwise`` (a pairwise tree of
    one bitwise operator) or ``body`` (the body evaluated pairwise), and the types partials accumulate in
    (one per operand; 32-bit integers compute exactly on GpSimd)."""

    lw: Lowering
    node: Node
    alu: str | None = None
    bitwise: str | None = None
    body: Computation | None = None
    acc: list[dt.DType] = field(default_factory=list)

    def engine(self, *tiles: Ref) -> str:
        return "pool" if all(t.dtype.name in ("s32", "u32") for t in tiles) else "dve"

    def tiles(self, shape: tuple[int, ...]) -> Tiles:
        return Tiles(self.lw.graph, shape, "red")

    def combine(self, a: Sequence[Operand], b: Sequence[Operand], shape: tuple[int, ...]) -> list[Ref]:
        """``a (+) b`` elementwise into new tiles of ``shape``."""
        if self.body is not None:
            return apply_body(self.lw, self.node, self.body, list(a), list(b), shape, self.acc)
        op = self.alu or self.bitwise
        assert op is not None
        return [self.tiles(shape).binary(op, a[0], b[0], self.acc[0])]

    def combine_into(self, dst: Sequence[Ref], b: Sequence[Ref]) -> None:
        """``dst = dst (+) b`` in place."""
        if self.body is None:
            op = self.alu or self.bitwise
            assert op is not None
            self.tiles(dst[0].shape).binary_into(dst[0], op, dst[0], b[0])
            return
        new = self.combine(dst, b, dst[0].shape)
        for d, v in zip(dst, new):
            copy_tile(self.lw, d, v)

    def fold(self, tiles: Sequence[Ref], axes: Sequence[int]) -> list[Ref]:
        """Reduce ``tiles`` over the free ``axes`` (positions in the tile's shape): the partials, with
        those axes gone."""
        g = self.lw.graph
        if self.alu is not None:
            src = tiles[0]
            keep = [s for i, s in enumerate(src.shape) if i not in axes]
            out = self.tiles(tuple(keep)).tile(self.acc[0])
            g.add(self.engine(out, src), "tensor_reduce", out, src, op=self.alu, axes=tuple(axes))
            return [out]
        cur = list(tiles)
        for ax in sorted(axes, reverse=True):
            cur = self.tree(cur, ax)
        idx = tuple(0 if i in axes else slice(None) for i in range(len(tiles[0].shape)))
        return [c[idx] for c in cur]

    def tree(self, tiles: list[Ref], ax: int) -> list[Ref]:
        """Pairwise over axis ``ax`` (halves, an odd element folded into the first) until it is 1 long."""
        n = tiles[0].shape[ax]
        if self.body is not None and any(t.dtype is not a for t, a in zip(tiles, self.acc)):
            tiles = [t if t.dtype is a else copy_new(self.lw, t, a) for t, a in zip(tiles, self.acc)]
        while n > 1:
            h = n // 2
            lo = [_on(t, ax, slice(0, h)) for t in tiles]
            hi = [_on(t, ax, slice(h, 2 * h)) for t in tiles]
            new = self.combine(lo, hi, lo[0].shape)
            if n % 2:
                self.combine_into([_on(t, ax, slice(0, 1)) for t in new], [_on(t, ax, slice(2 * h, n)) for t in tiles])
            tiles, n = new, h
        return tiles


def _on(t: Ref, ax: int, s: slice) -> Ref:
    return t[tuple(s if i == ax else slice(None) for i in range(len(t.shape)))]


def copy_tile(lw: Lowering, dst: Ref, src: Ref) -> None:
    """``dst = src``, converted (integers exactly: bits move, widths wrap)."""
    Tiles(lw.graph, dst.shape).copy_into(dst, src)


def pad_partitions(lw: Lowering, t: Ref, parts: int) -> Ref:
    """``t`` on the first of ``parts`` partitions, zeros on the rest: every matmul of an accumulation group
    contracts over the same partitions (the simulator batches a group's products)."""
    if t.shape[0] == parts:
        return t
    out = lw.graph.tile((parts, *t.shape[1:]), t.dtype, "sbuf", "pad").ref()
    lw.graph.add("dve", "memset", out, value=0.0)
    lw.graph.add("dve", "tensor_copy", out[0:t.shape[0]], t)
    return out


def copy_new(lw: Lowering, src: Ref, dtype: dt.DType) -> Ref:
    """``src`` converted into a new tile of ``dtype``."""
    t = Tiles(lw.graph, src.shape, "red")
    return t.copy(src, dtype)


def apply_body(lw: Lowering, node: Node, body: Computation, accs: list[Operand], xs: list[Operand],
               shape: tuple[int, ...], types: list[dt.DType]) -> list[Ref]:
    """The body evaluated elementwise on tiles of ``shape`` (its parameters: accumulators, then inputs);
    its results as tiles of ``types``. Its operators are the fused elementwise ones."""
    k = Kernel(lw, Tiles(lw.graph, shape, "body"))
    val: dict[int, object] = {p.id: v for p, v in zip(body.params, [*accs, *xs])}
    for n in body.post_order():
        if n.id in val:
            continue
        if n.op == "constant":
            v = lw.scalar(n)
            if v is None:
                raise error("NCC_EUOC002", f"reduce {node.name}: constant {n.name} of its body {body.name} is not "
                            "a number", n.loc)
            val[n.id] = v
        elif n.op == "tuple":
            val[n.id] = tuple(val[o.id] for o in n.operands)
        elif n.op == "get-tuple-element":
            val[n.id] = val[n.operands[0].id][n.attrs["index"]]  # type: ignore[index]
        elif n.op in ("broadcast", "reshape", "copy", "bitcast") and n.shape == n.operands[0].shape == ():
            val[n.id] = val[n.operands[0].id]
        elif n.op in EMITTERS and isinstance(n.type, TensorType) and n.shape == ():
            val[n.id] = emit(k, n, [val[o.id] for o in n.operands])  # type: ignore[arg-type]
        else:
            raise error("NCC_EUOC002", f"reduce {node.name}: its body {body.name} uses {n.op} ({n.name}), which has "
                        "no tile form (only scalar elementwise operators are evaluated on chip)", n.loc)
    root = val[body.root.id]
    outs = list(root) if isinstance(root, tuple) else [root]
    res = []
    for v, t in zip(outs, types):
        if is_num(v):
            v = k.t.memset(v, t)
        assert isinstance(v, Ref)
        res.append(v if v.dtype is t else k.t.copy(v, t))
    return res


def make_reducer(lw: Lowering, node: Node, src_types: list[dt.DType]) -> Reducer:
    """The reducer of ``node`` given the types its operand tiles load in."""
    n = len(node.operands) // 2
    body: Computation = node.attrs["to_apply"]
    op = body_op(body) if n == 1 else None
    r = Reducer(lw, node)
    if op is not None:
        d = onchip_dtype(device_dtype(body.root.dtype))
        if body.root.dtype.is_pred and op in PRED_ALU:
            r.alu, r.acc = PRED_ALU[op], [dt.U8]
            return r
        if d.is_int and op in BITWISE or body.root.dtype.is_pred and op == "xor":
            r.bitwise, r.acc = op, [d]
            return r
        if op in ALU:
            r.alu = ALU[op]
            if d.is_float:
                wide = lw.options.mixed_precision_accumulation or d is dt.F32
                r.acc = [dt.F32 if wide else d]
            elif d.itemsize == 4 or r.alu in ("max", "min"):
                r.acc = [d]  # 32-bit: exact on GpSimd; narrower max/min: exact in fp32 on VectorE
            else:
                r.acc = [dt.S32 if d.is_signed else dt.U32]  # add/mul widened, wrapped on the way out
            return r
    r.body = body
    r.acc = [onchip_dtype(device_dtype(p.dtype)) for p in body.params[:n]]
    return r


# --- layout -----------------------------------------------------------------------------------------

@dataclass
class Group:
    """Operand dimensions one access-pattern dimension covers (outer first), kept or reduced."""

    dims: tuple[int, ...]
    size: int
    stride: int  # of the first operand (memory order)
    kept: bool


@dataclass
class Layout:
    """Group ``pg`` on the partitions as ``[A, B]``; ``free`` the free dimensions in tile order, as group
    indices (``-1`` is ``B``); how partials combine across partitions when ``pg`` is reduced."""

    groups: list[Group]
    pg: int
    A: int
    B: int
    free: list[int]
    cross: str = ""  # "" (pg kept), "matmul", "transpose", "transpose_fix", "regroup"
    interleave: bool = False  # partition a holds the group's elements a, a + A, a + 2A, ... (not a*B ..)

    @property
    def part(self) -> Group:
        return self.groups[self.pg]

    @property
    def rem(self) -> int:
        return self.part.size - self.A * self.B

    def kept_free(self, i: int) -> bool:
        return self.part.kept if i == -1 else self.groups[i].kept

    def free_size(self, i: int, piece: int) -> int:
        return (self.B if piece == 0 else 1) if i == -1 else self.groups[i].size


def merge_groups(refs: list[Ref | None], kept: list[int], red: list[int], shape: tuple[int, ...],
                 merge: bool) -> list[Group]:
    """Kept dims then reduced dims, runs merged where every operand's strides allow (``merge``)."""
    strides = []
    for r in refs:
        if r is None:
            continue
        ap = r.ap
        strides.append([st for _, st in ap.dims])
    groups: list[Group] = []
    pos = {d: i for i, d in enumerate([*kept, *red])}  # position in the permuted views
    for is_kept, dims in ((True, kept), (False, red)):
        cur: list[int] = []
        for d in dims:
            if shape[d] == 1:
                continue
            if cur and merge and all(st[pos[cur[-1]]] == st[pos[d]] * shape[d] for st in strides):
                cur.append(d)
            else:
                if cur:
                    groups.append(_group(cur, shape, [[st[pos[e]] for e in cur] for st in strides], is_kept))
                cur = [d]
        if cur:
            groups.append(_group(cur, shape, [[st[pos[e]] for e in cur] for st in strides], is_kept))
    for is_kept in (True, False):  # a virtual group of one element keeps both kinds present
        if not any(gr.kept == is_kept for gr in groups):
            groups.append(Group((), 1, 0, is_kept))
    return groups


def _group(dims: list[int], shape: tuple[int, ...], strides: list[list[int]], kept: bool) -> Group:
    """``strides``: per operand, the strides of ``dims``; the group's is its innermost one's."""
    return Group(tuple(dims), math.prod(shape[d] for d in dims), strides[0][-1] if strides else 1, kept)


def choose_layout(groups: list[Group], red: Reducer, itemsize: int, target_exact_transpose: bool,
                  follow: Sequence[tuple[list[int], int]] = (), loads: int = 1) -> Layout:
    """The cheapest layout (see the module docstring): estimated DMA time (bytes and descriptors) against
    per-partition compute, plus the cross-partition combine. ``follow``: of the ``loads`` operands loaded
    per tile, those a producer stored from SBUF, as (the stride of each group's innermost dimension in
    it, the stride between the producer's partitions): a layout whose partitions are the producer's
    reads that operand where it still lies (backend/forward.py copies it on chip), no DMA."""
    total = math.prod(g.size for g in groups)
    kept = math.prod(g.size for g in groups if g.kept)
    best: tuple[tuple[float, float], int, Layout] | None = None
    for i, gr in enumerate(groups):
        A = min(128, gr.size)
        B = gr.size // A
        others = [j for j in range(len(groups)) if j != i]
        cross = "" if gr.kept else cross_method(red, target_exact_transpose)
        for inter in (False, True) if gr.kept and B > 1 else (False,):
            bstride = gr.stride * (A if inter else 1)
            free = sorted([*others, -1], key=lambda j: -(bstride if j == -1 else groups[j].stride))
            lay = Layout(groups, i, A, B, free, cross, inter)
            run = 1
            for j in reversed(free):  # contiguous elements of the innermost free dims
                size, stride = (B, bstride) if j == -1 else (groups[j].size, groups[j].stride)
                if size == 1:
                    continue
                if stride != run:
                    break
                run *= size
            run = max(1, min(run, CHUNK_BYTES // itemsize))
            engines = min(16, max(1, -(-A // 8)))
            kept_in_place = sum(st == inner[i] * (1 if inter else B) for inner, st in follow)
            dma = (total * itemsize / 272 + total / run * 12 / engines) * (1 - kept_in_place / max(1, loads))
            if inter:  # a partition's B results lie apart: a descriptor each, where blocked they are a run
                dma += kept * (1 - 1 / B) * 12 / engines
            compute = total / A * (8 if red.body is not None else 1)
            extra = {"": 0, "matmul": 500, "transpose": 500, "transpose_fix": 1500, "regroup": 3000}[cross]
            # by price alone: with a margin of 0.85 (the forwarding pass's copies and the layout the readers
            # then get not priced), ResNet-50's mean went to HBM and back twice; its readers now follow the
            # interleaved layout (backend/elementwise.py FOLLOW_STEPS): 604.0 -> 596.1 us
            cost = (round((max(dma, compute) + extra) / (INTERLEAVE_MARGIN if inter else 1), 6), round(dma, 6))
            if best is None or cost < best[0]:
                best = (cost, i, lay)
    assert best is not None
    return best[2]


def cross_method(red: Reducer, exact_transpose: bool) -> str:
    """How partials on several partitions combine (see the module docstring)."""
    if red.alu is not None and red.acc[0].is_float:
        if red.alu == "add":
            return "matmul"
        if red.alu in ("max", "min"):
            return "transpose" if exact_transpose else "transpose_fix"
        if exact_transpose:
            return "transpose"
    return "regroup"


def kept_limit(cross: str) -> int:
    """Kept elements one cross-partition combine handles: a PSUM bank of fp32, or the transpose's rows."""
    return {"": 1 << 30, "matmul": PSUM_COLS, "transpose": 128, "transpose_fix": 32, "regroup": 128}[cross]


def block_limit(cross: str) -> int:
    """Kept elements of one tile: unbounded with a kept group on the partitions, else what one
    accumulator holds (combined across partitions a chunk of :func:`kept_limit` at a time)."""
    return 1 << 30 if not cross else PSUM_COLS


def block_sizes(sizes: list[int], kept: list[bool], budget: int, kmax: int, single_kept: bool) -> list[int]:
    """Block size per free dimension: the innermost ones whole while the tile stays within ``budget``
    elements (and its kept part within ``kmax``, in one dimension when ``single_kept``), the next one cut,
    the outer ones one at a time."""
    bs = [1] * len(sizes)
    prod = kprod = 1
    for i in range(len(sizes) - 1, -1, -1):
        s = sizes[i]
        cap = budget // prod
        if kept[i]:
            cap = min(cap, kmax // kprod)
            if single_kept and kprod > 1 and s > 1:
                cap = 1
        b = min(s, max(1, cap))
        bs[i] = b
        prod *= b
        if kept[i]:
            kprod *= b
        if b < s:
            break
    return bs


def blocks(sizes: list[int], bs: list[int], dims: list[int]) -> list[dict[int, slice]]:
    """Every block position over the free dimensions ``dims`` (indices into ``sizes``)."""
    ranges = [[slice(s, min(s + bs[d], sizes[d])) for s in range(0, sizes[d], bs[d])] for d in dims]
    return [dict(zip(dims, combo)) for combo in itertools.product(*ranges)]


# --- operand sources ---------------------------------------------------------------------------------

@dataclass
class Iota:
    """An operand that is an iota (through broadcasts): its value is the index along operand dim ``dim``."""

    dim: int | None  # None: a dimension of size 1 (always 0)
    dtype: dt.DType


def iota_source(node: Node) -> Iota | None:
    """``node`` as an index ramp along one of its dimensions, when it is an iota or a broadcast of one."""
    if node.op == "iota":
        return Iota(node.attrs["iota_dimension"], onchip_dtype(device_dtype(node.dtype)))
    if node.op == "broadcast":
        inner = iota_source(node.operands[0])
        if inner is not None and inner.dim is not None:
            return Iota(tuple(node.attrs["dimensions"])[inner.dim], inner.dtype)
    return None


def _absorbable_iota(lw: Lowering, node: Node, nodes: dict[int, Node]) -> bool:
    if node.id in lw.output_of or iota_source(node) is None or node.dtype.is_float:
        return False
    for c in lw.consumers.get(node.id, ()):
        cn = nodes[c]
        if cn.op == "reduce" and node in cn.operands[:len(cn.operands) // 2]:
            continue
        if cn.op == "broadcast" and _absorbable_iota(lw, cn, nodes):
            continue
        return False
    return True


WIDENING = {("bf16", "f32"), ("f16", "f32")}


@plans
def plan_reductions(lw: Lowering, order: list[Node]) -> None:
    """Claim what reductions compute themselves: iota operands (generated on chip), a widening convert
    they read through, a float convert of their result (written directly)."""
    nodes = {n.id: n for n in order}
    for n in order:
        if n.op in ("iota", "broadcast") and _absorbable_iota(lw, n, nodes):
            lw.absorbed.add(n.id)
    for n in order:
        if n.op != "reduce" or isinstance(n.type, TupleType):
            continue
        note: dict[str, object] = {}
        x = n.operands[0]
        if (x.op == "convert" and (x.operands[0].dtype.name, x.dtype.name) in WIDENING and x.id not in lw.output_of
                and (x.id in lw.absorbed or x.id in lw.cluster_of)
                and all(nodes[c].op == "reduce" and len(nodes[c].operands) == 2 and nodes[c].operands[0] is x
                        for c in lw.consumers.get(x.id, ()))):
            _leave_cluster(lw, x)
            lw.absorbed.add(x.id)
            note["input"] = x.operands[0]
        users = lw.consumers.get(n.id, set())
        if len(users) == 1 and n.id not in lw.output_of and 0 not in n.operands[0].shape:
            c = nodes[next(iter(users))]
            if (c.op == "convert" and c.dtype.is_float and n.dtype.is_float and c.id in lw.cluster_of
                    and c.id not in lw.absorbed):
                _leave_cluster(lw, c)
                lw.absorbed.add(c.id)
                note["output"] = c
        if note:
            lw.plan[n.id] = note


@plans
def plan_prologues(lw: Lowering, order: list[Node]) -> None:
    """A reduction whose source a fused elementwise pass computes (layernorm's ``(x - mean)^2``), when
    nothing reads that pass's values before the reduction: the reduction computes the pass on its own
    tiles (``epilogue.prologue``) and the pass stores only what others read, instead of storing the
    source for the reduction to load back. A pass that reads a dot's or a convolution's result is left
    to be that producer's epilogue."""
    position = {n.id: k for k, n in enumerate(order)}
    for n in order:
        if n.op != "reduce" or isinstance(n.type, TupleType) or len(n.operands) != 2:
            continue
        note = lw.plan.get(n.id, {})
        x = n.operands[0]
        src = note.get("input", x)
        cl = lw.cluster_of.get(src.id)
        if (x.id in lw.absorbed and "input" not in note) or cl is None or cl.host is not None or \
                cl.shape != src.shape or any(m.op == "iota" for m in cl.members):
            continue
        ids = {m.id for m in cl.members}
        served = frozenset({n.id, x.id})
        if any(position[c] < position[n.id] for m in cl.members for c in lw.consumers.get(m.id, ())
               if c not in ids and c not in served):
            continue
        if any(o.op in HOSTS for m in cl.members for o in m.operands if o.id not in ids):
            continue
        cl.host = n.id
        lw.plan[n.id] = {**note, "prologue": (cl, src, served)}


def _leave_cluster(lw: Lowering, node: Node) -> None:
    """Take ``node`` out of its fused elementwise cluster (a reduction computes it; nothing in the cluster
    reads it)."""
    cl = lw.cluster_of.pop(node.id, None)
    if cl is not None:
        cl.members[:] = [m for m in cl.members if m is not node]


# --- lowering ---------------------------------------------------------------------------------------

@lowers("reduce")
def reduce(lw: Lowering, node: Node) -> None:
    """``reduce`` with any dimensions, body and number of operands (see the module docstring)."""
    n = len(node.operands) // 2
    xs, inits = list(node.operands[:n]), list(node.operands[n:])
    dims = sorted(node.attrs["dimensions"])
    shape = xs[0].shape
    kept = [d for d in range(len(shape)) if d not in dims]
    note = lw.plan.get(node.id, {})
    types = [t for t in node.type.leaves()]
    if "output" in note:
        outs = [lw.result(note["output"])]
        out_types = [onchip_dtype(device_dtype(note["output"].dtype))]
    else:
        outs = list(lw.results(node)) if isinstance(node.type, TupleType) else [lw.result(node)]
        out_types = [onchip_dtype(device_dtype(t.dtype)) for t in types]
    if 0 in [shape[d] for d in kept]:
        return  # nothing to compute
    if 0 in [shape[d] for d in dims]:
        for o, init in zip(outs, inits):  # no elements: the init value everywhere
            src = lw.ref(init).reshape(*([1] * len(o.shape))) if o.shape else lw.ref(init)
            for d, s in enumerate(o.shape):
                src = src.broadcast(d, s)
            lw.graph.add("dma", "dma", o, src)
        return
    pro: tuple[Epilogue, Node] | None = None
    if "prologue" in note:  # the pass computing the source runs on this reduction's tiles
        cl, src_node, served = note["prologue"]
        lw.result(src_node)  # the source's layout (a buffer kept only if something else reads it)
        ep = prologue(lw, node, cl, served)
        if ep is None:  # an input not computed yet: the pass on its own
            lw.drop(src_node)
            cl.host = None
            lower_cluster(lw, cl, lw.consumers)
        else:
            pro = (ep, src_node)
    sources: list[Ref | Iota] = []
    for x in xs:
        if pro is not None:
            sources.append(lw.ref(pro[1]))
        elif "input" in note:
            sources.append(lw.ref(note["input"]))  # the convert's operand: read through it
        elif x.id in lw.absorbed:
            src = iota_source(x)
            assert src is not None
            sources.append(src)
        else:
            sources.append(lw.ref(x))
    src_types = [s.dtype if isinstance(s, Iota) else onchip_dtype(s.dtype) for s in sources]
    red = make_reducer(lw, node, src_types)
    perm = [*kept, *dims]
    views: list[Ref | None] = [s.permute(*perm) if isinstance(s, Ref) else None for s in sources]
    groups = merge_groups(views, kept, dims, shape, merge=not any(isinstance(s, Iota) for s in sources))
    itemsize = max(t.itemsize for t in src_types)
    loaded = [r for r in (pro[0].inputs.values() if pro is not None else sources) if isinstance(r, Ref)]
    full = [r for r in loaded if all(n == 1 or st for n, st in r.ap.dims)]  # not a value repeated along a row
    # per operand a producer stored from SBUF: the stride of each group's innermost dimension in it
    follow = [([r.ap.dims[gr.dims[-1]][1] if gr.dims else 0 for gr in groups], st)
              for r in full if (st := stored_stride(r)) is not None]
    lay = choose_layout(groups, red, itemsize, bool(lw.target.spec["transpose"]["exact"]), follow, len(full))
    Reduction(lw, node, red, lay, sources, src_types, inits, outs, out_types, shape, perm, pro).run()
    if pro is not None and pro[1].id not in pro[0].stores:
        lw.drop(pro[1])


class Reduction:
    """One reduce node lowered through one :class:`Layout`."""

    def __init__(self, lw: Lowering, node: Node, red: Reducer, lay: Layout, sources: list[Ref | Iota],
                 src_types: list[dt.DType], inits: list[Node], outs: list[Ref], out_types: list[dt.DType],
                 shape: tuple[int, ...], perm: list[int], prologue: tuple[Epilogue, Node] | None = None) -> None:
        self.lw, self.g, self.node, self.red, self.lay = lw, lw.graph, node, red, lay
        self.prologue = prologue  # the pass that computes the (one) source on each tile, and the source
        self.sources, self.src_types, self.inits = sources, src_types, inits
        self.out_types = out_types
        self.shape, self.perm = shape, perm
        gs = lay.groups
        # every operand as [pg, others in free order] (B not yet split off)
        self.others = [j for j in lay.free if j != -1]
        order = [lay.pg, *self.others]
        self.order = order
        self.views: list[Ref | None] = [None if isinstance(s, Iota) else self.frame(s) for s in sources]
        kept_groups = [i for i, gr in enumerate(gs) if gr.kept]
        korder = ([lay.pg] if lay.part.kept else []) + [j for j in self.others if gs[j].kept]
        self.outs = [o.reshape(*[gs[i].size for i in kept_groups]).permute(*[kept_groups.index(i) for i in korder])
                     for o in outs]
        budget = (BODY_CHUNK if red.body is not None or red.bitwise is not None else CHUNK_BYTES // max(
            t.itemsize for t in src_types))
        self.budget = budget
        self.ones: dict[str, Ref] = {}
        self.turn = 0

    def frame(self, s: Ref) -> Ref:
        """A value of the operand's shape as ``[pg, others in free order]``."""
        gs = self.lay.groups
        v = s.permute(*self.perm).reshape(*[gr.size for gr in gs]) if gs else s
        return v.permute(*self.order)

    # pieces: 0 = the main [A, B] split of the partition group, 1 = its remainder
    def pieces(self) -> list[int]:
        return [0] + ([1] if self.lay.rem else [])

    def piece_view(self, v: Ref, piece: int) -> Ref:
        """``v`` ([pg, others...]) restricted to a piece, as [partitions, free dims in tile order]."""
        lay = self.lay
        size = lay.part.size
        rest = [lay.groups[j].size for j in self.others]
        if piece == 0:
            w = self.split(v[0:lay.A * lay.B], rest) if lay.B > 1 or size != lay.A else v.reshape(lay.A, 1, *rest)
        else:
            w = v[lay.A * lay.B:size].reshape(lay.rem, 1, *rest)
        pos = lay.free.index(-1)
        order = [0, *[2 + k for k in range(pos)], 1, *[2 + k for k in range(pos, len(rest))]]
        return w.permute(*order)

    def split(self, v: Ref, rest: list[int]) -> Ref:
        """The partition group's first ``A * B`` elements of ``v`` as ``[A, B, *rest]``."""
        lay = self.lay
        if not lay.interleave:
            return v.reshape(lay.A, lay.B, *rest)
        return v.reshape(lay.B, lay.A, *rest).permute(1, 0, *range(2, 2 + len(rest)))

    def out_view(self, o: Ref, piece: int) -> Ref:
        """The output ``o`` ([pg if kept, kept others in free order]) as [partitions?, kept free dims in tile
        order] for a piece."""
        lay = self.lay
        if not lay.part.kept:
            return o
        rest = [lay.groups[j].size for j in self.others if lay.groups[j].kept]
        size = lay.part.size
        if piece == 0:
            w = self.split(o[0:lay.A * lay.B], rest)
        else:
            w = o[lay.A * lay.B:size].reshape(lay.rem, 1, *rest)
        kept_free = [j for j in lay.free if lay.kept_free(j)]
        pos = kept_free.index(-1)
        order = [0, *[2 + k for k in range(pos)], 1, *[2 + k for k in range(pos, len(rest))]]
        return w.permute(*order)

    def run(self) -> None:
        lay = self.lay
        nfree = len(lay.free)
        kdims = [k for k in range(nfree) if lay.kept_free(lay.free[k])]
        rdims = [k for k in range(nfree) if not lay.kept_free(lay.free[k])]
        kmax = block_limit(lay.cross)
        single = lay.cross not in ("", "matmul")
        if lay.part.kept:
            for piece in self.pieces():
                sizes = [lay.free_size(j, piece) for j in lay.free]
                bs = block_sizes(sizes, [k in kdims for k in range(nfree)], self.budget, kmax, single)
                self.kept_piece(piece, sizes, bs, kdims, rdims)
        else:
            sizes = {p: [lay.free_size(j, p) for j in lay.free] for p in self.pieces()}
            bs0 = block_sizes(sizes[0], [k in kdims for k in range(nfree)], self.budget, kmax, single)
            for kb in blocks(sizes[0], bs0, kdims):
                work = [(p, rb) for p in self.pieces()
                        for rb in blocks(sizes[p], [bs0[k] if k in rdims else 1 for k in range(nfree)], rdims)]
                self.spread_block(kb, work)

    # --- a kept group on the partitions ---------------------------------------------------------------
    def kept_piece(self, piece: int, sizes: list[int], bs: list[int], kdims: list[int], rdims: list[int]) -> None:
        lay = self.lay
        pn = lay.A if piece == 0 else lay.rem
        ksizes = [sizes[k] for k in kdims]
        whole = math.prod(ksizes) <= MAX_OUT_TILE
        res_tiles = [self.g.tile((pn, *ksizes), t, "sbuf", "redout").ref() for t in self.out_types] if whole else []
        for kb in blocks(sizes, bs, kdims):
            acc: list[Ref] | None = None
            for rb in blocks(sizes, bs, rdims):
                box = {**kb, **rb}
                part = self.partials(piece, box, pn, rdims)
                if acc is None:
                    acc = part
                else:
                    acc = self.red.combine(acc, part, acc[0].shape)
            assert acc is not None
            # gathered into the result tile, the partials are converted by the copy that puts them there
            res = self.finish(acc, convert=not whole)
            key = tuple(kb[k] for k in kdims)
            for k, (o, r) in enumerate(zip(self.outs, res)):
                if whole:
                    copy_tile(self.lw, res_tiles[k][(slice(None), *key)], r)
                else:
                    self.g.add("dma", "dma", self.out_view(o, piece)[(slice(None), *key)], self._typed(r, k))
        for k, o in enumerate(self.outs):
            if whole:
                self.g.add("dma", "dma", self.out_view(o, piece), res_tiles[k])

    def _typed(self, r: Ref, k: int) -> Ref:
        return r if r.dtype is self.out_types[k] else copy_new(self.lw, r, self.out_types[k])

    def partials(self, piece: int, box: dict[int, slice], pn: int, rdims: list[int]) -> list[Ref]:
        """Load the tiles of ``box`` and reduce them over their reduced free dimensions: every other tile of
        a float sum on ScalarE (an activation's sum of its results), the others on VectorE, so that
        the two engines share the work."""
        tiles = self.load(piece, box, pn)
        axes = [1 + k for k in rdims]
        self.turn += 1
        t = tiles[0]
        nd = len(t.shape)
        red = self.red
        if (self.turn % 2 == 0 and red.alu == "add" and red.acc[0] is dt.F32 and axes == list(range(nd - len(axes), nd))
                and math.prod(t.shape[1:nd - len(axes)]) <= ACT_SPLIT):
            kshape = t.shape[:nd - len(axes)]
            out = self.g.tile(kshape, dt.F32, "sbuf", "redact").ref()
            for idx in itertools.product(*[range(n) for n in kshape[1:]]):
                src = t[(slice(None), *idx)]
                self.g.add("act", "activation", src, src, accum=out[(slice(None), *idx)] if idx else out)
            return [out]
        return red.fold(tiles, axes)

    def load(self, piece: int, box: dict[int, slice], pn: int) -> list[Ref]:
        lay = self.lay
        nfree = len(lay.free)
        key = tuple(box[k] for k in range(nfree))
        tshape = (pn, *[s.stop - s.start for s in key])
        out = []
        for s, v, t, acc in zip(self.sources, self.views, self.src_types, self.red.acc):
            if self.prologue is not None:
                out.append(self.computed(piece, key, tshape, t))
                continue
            tile = self.g.tile(tshape, t, "sbuf", "redin").ref()
            if isinstance(s, Iota):
                self.iota(tile, s, piece, key)
            else:
                assert v is not None
                self.g.load(tile, self.piece_view(v, piece)[(slice(None), *key)])
            if t.is_int and acc.is_int and acc.itemsize == 4 and t.itemsize < 4:
                tile = copy_new(self.lw, tile, acc)  # widened: exact 32-bit arithmetic on GpSimd
            out.append(tile)
        return out

    def computed(self, piece: int, key: tuple[slice, ...], tshape: tuple[int, ...], t: dt.DType) -> Ref:
        """The source's tile, computed by the prologue's pass (a float: no widening needed)."""
        assert self.prologue is not None
        ep, src = self.prologue
        val = ep.compute(lambda r: self.piece_view(self.frame(r), piece)[(slice(None), *key)], tshape)
        v = val[src.id]
        flat = (tshape[0], math.prod(tshape[1:]))
        if is_num(v) or v.ops:  # a number, or a view of an input (a column repeated along the row)
            tile = self.g.tile(flat, t, "sbuf", "redin").ref()
            if is_num(v):
                self.g.add("pool" if t.is_int else "dve", "memset", tile, value=v)
            else:
                self.g.add("dve", "tensor_copy", tile, v)
            v = tile
        return v.reshape(*tshape) if len(tshape) != 2 else v

    def iota(self, tile: Ref, s: Iota, piece: int, key: tuple[slice, ...]) -> None:
        """The index along operand dimension ``s.dim`` of every element of the tile."""
        lay = self.lay
        base, cm = 0, 0
        steps = [0] * len(key)
        gi = next((i for i, gr in enumerate(lay.groups) if s.dim in gr.dims), None)
        if gi is not None:
            for k, j in enumerate(lay.free):
                if j == gi or (j == -1 and gi == lay.pg):
                    step = lay.A if j == -1 and lay.interleave and piece == 0 else 1
                    steps[k] = step
                    base += key[k].start * step
            if gi == lay.pg:
                if piece == 0:
                    cm = 1 if lay.interleave else lay.B
                else:
                    cm, base = 1, base + lay.A * lay.B
        self.g.add("pool", "iota", tile, base=base, channel_multiplier=cm, steps=tuple(steps))

    def finish(self, acc: list[Ref], convert: bool = True) -> list[Ref]:
        """The init value combined with the partials (once), converted to the result types (unless the
        caller's copy converts them)."""
        shape = acc[0].shape
        red = self.red
        inits: list[Operand] = []
        for init in self.inits:
            v = self.lw.scalar(init)
            if v is None:
                tile = self.g.tile(shape, onchip_dtype(device_dtype(init.dtype)), "sbuf", "init").ref()
                src = self.lw.ref(init).reshape(*([1] * len(shape)))
                for d, n in enumerate(shape):
                    src = src.broadcast(d, n)
                self.g.add("dma", "dma", tile, src)
                inits.append(tile)
            else:
                inits.append(v)
        if red.body is None:
            op = red.alu or red.bitwise
            v = inits[0]
            pred = self.node.attrs["to_apply"].root.dtype.is_pred
            if is_num(v) and _is_identity(op, v, red.acc[0], pred):  # type: ignore[arg-type]
                res = acc
            else:
                res = red.combine([v], acc, shape)
        else:  # numbers as tiles: the body's operators expect at most one immediate operand
            tiles = Tiles(self.g, shape, "init")
            res = red.combine([tiles.memset(v, a) if is_num(v) else v for v, a in zip(inits, red.acc)], acc, shape)
        if not convert:
            return res
        return [r if r.dtype is t else copy_new(self.lw, r, t) for r, t in zip(res, self.out_types)]

    # --- a reduced group on the partitions ------------------------------------------------------------
    def spread_block(self, kb: dict[int, slice], work: list[tuple[int, dict[int, slice]]]) -> None:
        """One block of kept elements: every tile's partials combined per partition, then across them."""
        lay = self.lay
        nfree = len(lay.free)
        rdims = [k for k in range(nfree) if not lay.kept_free(lay.free[k])]
        kdims = [k for k in range(nfree) if lay.kept_free(lay.free[k])]
        kshape = tuple(kb[k].stop - kb[k].start for k in kdims)
        kflat = math.prod(kshape)
        okey = tuple(kb[k] for k in kdims)
        outs = [o[okey] if okey else o for o in self.outs]
        if lay.cross == "matmul":
            ps = self.g.tile((1, *kshape), dt.F32, "psum", "redps").ref()
            for j, (piece, rb) in enumerate(work):
                pn = lay.A if piece == 0 else lay.rem
                box = {**kb, **rb}
                tiles = self.load(piece, box, pn)
                direct = all(box[k].stop - box[k].start == 1 for k in rdims)
                if direct and tiles[0].dtype.name in ("f32", "bf16", "f16"):  # TensorE sums the tile itself
                    mv = tiles[0][(slice(None), *[0 if k in rdims else slice(None) for k in range(nfree)])]
                else:
                    mv = self.red.fold(tiles, [1 + k for k in rdims])[0]
                mv = pad_partitions(self.lw, mv, lay.A)
                self.g.add("pe", "matmul", ps, self.ones_of(mv.dtype)[0:lay.A], mv, start=j == 0,
                           stop=j == len(work) - 1)
            self.store_spread(outs, [ps])
            return
        acc: list[Ref] | None = None
        for piece, rb in work:
            pn = lay.A if piece == 0 else lay.rem
            part = self.partials(piece, {**kb, **rb}, pn, rdims)
            if acc is None:  # the main piece (all A partitions) comes first: its partials, in tiles of their own
                acc = [p if not p.ops else copy_new(self.lw, p, p.dtype) for p in part]
            elif pn == lay.A:
                acc = self.red.combine(acc, part, acc[0].shape)
            else:
                self.red.combine_into([a[0:pn] for a in acc], part)
        assert acc is not None
        flat = [a.reshape(lay.A, kflat) for a in acc]
        oflat = [o.reshape(kflat) for o in outs]  # one kept dimension in the block: flat
        lim = kept_limit(lay.cross)
        scratch = []
        if lay.cross == "regroup":  # the partials through HBM, to come back transposed
            for f in flat:
                scr = self.g.buf(f"{self.node.name}_part", "scratch", f.dtype, (lay.A, kflat)).ref()
                self.g.add("dma", "dma", scr, f)
                scratch.append(scr)
        if lay.cross in ("transpose", "transpose_fix"):
            res = self.cross_transpose(flat[0], lay.cross == "transpose_fix")
            full, cn = divmod(kflat, lim)
            final = self.finish([res])
            for o, r in zip(oflat, final):
                if full:
                    self.g.add("dma", "dma", o[0:full * lim].reshape(full, lim).T, r[:, 0:full])
                if cn:
                    self.g.add("dma", "dma", o[full * lim:kflat], r[0:cn, full])
            return
        for c0 in range(0, kflat, lim):
            cn = min(lim, kflat - c0)
            back = []
            for scr in scratch:
                t = self.g.tile((cn, lay.A), scr.dtype, "sbuf", "redrg").ref()
                self.g.add("dma", "dma", t, scr.T[c0:c0 + cn])
                back.append(t)
            self.store_spread([o[c0:c0 + cn] for o in oflat], self.red.fold(back, [1]))

    def cross_transpose(self, flat: Ref, fix: bool) -> Ref:
        """max/min/mul of ``flat`` ([A, kflat]) across its partitions: TensorE transposes ``lim`` columns at a
        time, ``tensor_reduce`` reduces each (column c of the result, ``[lim, chunks]``, holds the kept
        elements ``c*lim ...``).

        With ``fix`` (NeuronCore-v2, whose identity-matmul transpose turns an infinity into NaN along its
        row) the values go clamped to finite ones, 32 per chunk, and beside them (at columns 64 and 96 of
        the chunk) whether a partial is the infinity that wins and whether any is not the one that loses;
        after the reduction those restore the infinite results (a NaN still wins)."""
        g = self.g
        A, kflat = flat.shape
        alu = self.red.alu
        assert alu is not None
        lim = kept_limit("transpose_fix" if fix else "transpose")
        full, cn = divmod(kflat, lim)
        nch = full + (1 if cn else 0)
        m = g.tile((lim, nch), dt.F32, "sbuf", "redm").ref()
        if not fix:
            for c in range(nch):
                w = lim if c < full else cn
                ps = g.tile((w, A), dt.F32, "psum", "redtp").ref()
                g.add("pe", "transpose", ps, flat[:, c * lim:c * lim + w])
                g.add("dve", "tensor_reduce", m[0:w, c], ps, op=alu)
            return m
        win = math.inf if alu == "max" else -math.inf
        t = g.tile((A, nch, 128), dt.F32, "sbuf", "redfx").ref()
        g.add("dve", "memset", t, value=0.0)
        parts = []
        if full:
            parts.append((t[:, 0:full, :], flat[:, 0:full * lim].reshape(A, full, lim), lim))
        if cn:
            parts.append((t[:, full:full + 1, :], flat[:, full * lim:kflat].reshape(A, 1, cn), cn))
        for dst, src, w in parts:
            g.add("dve", "tensor_scalar", dst[:, :, 0:w], src, op0="max", scalar0=-FMAX, op1="min", scalar1=FMAX)
            g.add("dve", "tensor_scalar", dst[:, :, 64:64 + w], src, op0="eq", scalar0=win)
            g.add("dve", "tensor_scalar", dst[:, :, 96:96 + w], src, op0="ne", scalar0=-win)
        f = g.tile((64, nch), dt.F32, "sbuf", "redf").ref()
        for c in range(nch):
            ps = g.tile((128, A), dt.F32, "psum", "redtp").ref()
            g.add("pe", "transpose", ps, t[:, c, :])
            g.add("dve", "tensor_reduce", m[:, c], ps[0:lim], op=alu)
            g.add("dve", "tensor_reduce", f[:, c], ps[64:128], op="max")
        tt = Tiles(g, (lim, nch), "redfx")
        real = tt.binary("eq", m, m, dt.F32)
        hit = tt.binary("mul", real, f[0:32], dt.F32)
        r = tt.select(hit, win, m, dt.F32)
        return tt.select(f[32:64], r, -win, dt.F32)

    def ones_of(self, d: dt.DType) -> Ref:
        if d.name not in self.ones:
            t = self.g.tile((128, 1), d, "sbuf", "ones").ref()
            self.g.add("dve", "memset", t, value=1.0)
            self.ones[d.name] = t
        return self.ones[d.name]

    def store_spread(self, outs: list[Ref], res: list[Ref]) -> None:
        """The cross-partition results (``[1, kept...]`` or ``[kept, 1]``) finished and stored."""
        final = self.finish(res)
        for k, (o, r) in enumerate(zip(outs, final)):
            if r.buf.kind == "psum":  # DMA does not reach PSUM
                r = copy_new(self.lw, r, self.out_types[k])
            self.g.add("dma", "dma", o, r)


def _is_identity(op: str, v: float | int, acc: dt.DType, pred: bool) -> bool:
    """Does combining with ``v`` leave every value as it is (the init value need not enter)?"""
    if op in IDENTITY:
        return v == IDENTITY[op]
    if op in ("max", "min"):
        if acc.is_float:
            return v == (-math.inf if op == "max" else math.inf)
        if pred:
            return v == (0 if op == "max" else 1)
        info = np.iinfo(acc.np)
        return v == (info.min if op == "max" else info.max)
    if op == "or" or op == "xor":
        return v == 0
    if op == "and":
        return v == -1 or (not acc.is_signed and v == 2 ** (8 * acc.itemsize) - 1)
    return False


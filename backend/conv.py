"""Convolution (implicit GEMM on TensorE), pooling (``reduce-window``) and its gradient
(``select-and-scatter``) on VectorE and GpSimd.

**convolution.** The operands are viewed in canonical order: input ``X[N, C, S...]``, weights
``W[O, I, K...]``, result ``Y[N', O, Q...]`` (access patterns on the model's layout, nothing is copied).
Each spatial dimension's window arithmetic (stride, padding, base and window dilation, reversal) is
reduced to classes of outputs on which every tap reads the input at ``i0 + j * istep``
(:func:`nxsat.extract.plan.window_classes`; base dilation makes several classes, which is how a
transposed convolution skips the holes instead of multiplying zeros). For every block of outputs (one
PSUM bank: at most 512 positions of one class), every output-channel tile and every (input-channel
tile, tap) pair, one matmul adds ``W[tap][c, o].T @ X[c, positions shifted by the tap]`` into the bank:
the filter tap is the stationary operand ``[C <= 128, O <= 128]``, the input the moving one, a strided
view of an SBUF tile that holds the block's input box with channels on partitions. Padding is a
zero-filled tile (only the part of the box inside the input is loaded; taps that meet only padding
are skipped). The tiling is :func:`nxsat.extract.plan.conv_plan`:

- few channels: ``fold`` taps of one spatial dimension are stacked on the partitions (block ``b`` holds
  the input shifted by tap ``b``), so a 3-channel 7x7 stem contracts 21 rows per matmul, not 3;
- grouped and depthwise convolutions: ``pack`` groups share one matmul through a block-diagonal
  stationary (built on VectorE with a mask from ``iota``); TensorE at 448 columns per matmul beats
  a VectorE multiply-accumulate per tap by 3-7x in the cost model, so depthwise runs there too. A
  consequence: a NaN or infinity in one channel reaches the other channels of its pack at that
  position (``0 x inf``), as in the NKI depthwise kernel, which reduces its products with an identity
  matmul;
- batch groups (weight gradients) are separate jobs, each reading its slice of the batch;
- channels-last layouts (JAX's NHWC): the input is brought to channels-on-partitions by ``dma_transpose``
  on NeuronCore-v3, by TensorE transposes of 128-position blocks on v2 (an identity matmul there: a
  NaN or infinity spreads along its block's channel row, as the device does), and a channels-last
  result is transposed back on TensorE before its store, so every DMA moves whole rows rather than
  single elements;
- mixed types: operands multiply in their common TensorE type (bf16 exactly, bf16 x f32 and integers
  in fp32: exact below 2^24, as ``backend/matmul.py``), products accumulate in fp32 in PSUM and the
  evacuation converts to the result type.

**reduce-window** and **select-and-scatter**: see :func:`reduce_window` and :func:`select_and_scatter`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from itertools import product

import numpy as np

from nxsat import dtypes as dt
from nxsat.attrs import ConvDims, DotDims, PadDim, SliceDim, WindowDim
from nxsat.backend.elementwise import Cluster, lower_cluster
from nxsat.backend.epilogue import Epilogue, epilogue
from nxsat.backend.forward import engine_ok
from nxsat.backend.graph import Graph, Ref
from nxsat.backend.lower import (
    Lowering,
    _fused_source,
    device_dtype,
    hosts,
    load_dtype,
    lowers,
    onchip_dtype,
    plans,
)
from nxsat.backend.matmul import operand_type
from nxsat.backend.tiles import Operand, Tiles, is_num
from nxsat.builder import Builder, infer_type
from nxsat.diagnostics import error
from nxsat.extract.plan import (
    ADD_ENGINES,
    DMA_T_BLOCK,
    PE_BLOCK,
    ConvGeometry,
    ConvPlan,
    DepthwisePlan,
    PlaneTiling,
    WindowClass,
    WindowPlan,
    cast_split,
    conv_plan,
    depthwise_gradient_fits,
    depthwise_gradient_tiling,
    depthwise_plan,
    fold_growth,
    fold_homes,
    gradient_stacking_pays,
    out_block,
    packed_outputs_last,
    rows_fit,
    valid_range,
    weights_by_rows,
    window_classes,
    window_plan,
)
from nxsat.ir import Computation, Module, Node, TensorType, TupleType
from nxsat.passes import Rewriter, rewrite_module
from nxsat.sim.program import AccessError

# One convolution's matmuls at most (an eighth of a device program's 2,000,000 instructions): beyond it
# the implicit GEMM is the wrong form (weight gradients whose window is a whole image), and is refused.
MAX_MATMULS = 250_000


# --- convolution ---------------------------------------------------------------------------------

Chunk = tuple[tuple[int, int], ...]  # a block of outputs: (start, size) of the batch and of each class's j
Combo = tuple[WindowClass, ...]  # one class per spatial dimension


@dataclass(frozen=True)
class Job:
    """One independent part of a convolution: input batches from ``n0``, input channels
    ``[c0, c0 + cn)``, output channels ``[o0, o0 + on)``; ``pack`` feature groups in one matmul."""

    n0: int
    c0: int
    cn: int
    o0: int
    on: int
    pack: int


@dataclass(frozen=True)
class Tap:
    """A tap active in an output block: window element ``t``, input index ``i0`` at ``j = 0``, kernel
    index ``k`` (after reversal)."""

    t: int
    i0: int
    k: int


Group = tuple[list[Tap], ...]  # the taps one input tile serves, per spatial dimension
TapCombo = tuple[Tap | None, ...]  # one tap per spatial dimension (None on the fold dimension)


@dataclass
class Conv:
    """What lowering one convolution needs everywhere."""

    lw: Lowering
    node: Node
    X: Ref  # [N, C, S...]
    W: Ref  # [O, I, K...]
    Y: Ref  # [N', O, Q...]
    geo: ConvGeometry
    plan: ConvPlan
    mt: dt.DType  # the multiply type
    out_t: dt.DType
    window: tuple[WindowDim, ...]
    ep: Epilogue  # where result tiles go: Y, and the elementwise cluster reading it (backend/epilogue.py)
    evac: int = 0
    weights: dict = field(default_factory=dict)
    masks: dict = field(default_factory=dict)
    later: list[Callable[[], None]] = field(default_factory=list)  # a bank's preparation's second stage

    @property
    def g(self) -> Graph:
        return self.lw.graph

    @property
    def nsp(self) -> int:
        return len(self.window)

    def kidx(self, d: int, t: int) -> int:
        w = self.window[d]
        return w.size - 1 - t if w.reversal else t


def _stride_one(lw: Lowering, r: Ref, dim: int) -> bool:
    """Is dimension ``dim`` of the HBM access ``r`` contiguous (and larger than one)?"""
    dims = r.ap.dims
    return r.shape[dim] > 1 and dims[dim][1] == 1


hosts("convolution")


@lowers("convolution")
def convolution(lw: Lowering, node: Node) -> None:
    lhs, rhs = node.operands
    d: ConvDims = node.attrs["dims"]
    window: tuple[WindowDim, ...] = tuple(node.attrs["window"])
    fgc = int(node.attrs.get("feature_group_count", 1) or 1)
    bgc = int(node.attrs.get("batch_group_count", 1) or 1)
    if plane_weight_gradient(node):
        _cast_first(lw, lhs)
        _cast_first(lw, rhs)
        _plane_weight_gradient(lw, node)
        return
    # a cast the lowering absorbed (lower.py): the tiles are converted on chip as they are loaded
    X = lw.ref(lhs.operands[0] if lhs.id in lw.absorbed else lhs).permute(d.input_batch, d.input_feature,
                                                                           *d.input_spatial)
    # a cast of the weights the lowering absorbed (lower.py): the weight tiles are converted on chip
    wsrc = rhs.operands[0] if rhs.id in lw.absorbed else rhs
    kernel = (d.kernel_output_feature, d.kernel_input_feature, *d.kernel_spatial)
    W = lw.ref(wsrc).permute(*kernel)
    Y = lw.result(node).permute(d.output_batch, d.output_feature, *d.output_spatial)
    mt = operand_type(onchip_dtype(device_dtype(lhs.dtype)), onchip_dtype(device_dtype(rhs.dtype)), lw)
    out_t = onchip_dtype(device_dtype(node.dtype))
    N, C = X.shape[0], X.shape[1]
    O = W.shape[0]
    geo = ConvGeometry(
        batch=N // bgc, in_channels=C // fgc, out_channels=O // (fgc * bgc), groups=fgc, batch_groups=bgc,
        in_spatial=tuple(X.shape[2:]), out_spatial=tuple(Y.shape[2:]), window=window, dtype=mt.name,
        itemsize=mt.itemsize,
        channels_last_in=bool(window) and _stride_one(lw, X, 1) and X.dtype.is_float and X.dtype.itemsize in (2, 4),
        channels_last_out=bool(window) and _stride_one(lw, Y, 1) and out_t.is_float and out_t.itemsize in (2, 4),
        rows_contiguous=all(r.shape[-1] == 1 or _stride_one(lw, r, len(r.shape) - 1) for r in (X, Y)))
    plan = conv_plan(geo, lw.target)
    dw = depthwise_plan(geo, plan, lw.target)
    if dw is not None and dw.pays:
        if _cast_first(lw, rhs):  # the vector engines multiply in the weights' type: cast them first
            W = lw.ref(rhs).permute(*kernel)
        if _cast_first(lw, lhs):  # and in the input's
            X = lw.ref(lhs).permute(d.input_batch, d.input_feature, *d.input_spatial)
        _depthwise(lw, X, W, Y, window, dw, out_t)
        return
    matmuls = plan.matmuls(geo)
    if matmuls > MAX_MATMULS:
        taps = math.prod(w.size for w in window)
        raise error("NCC_EUOC002", f"convolution {node.name} would take {matmuls} matmuls as an implicit GEMM "
                    f"({taps} taps per output, {math.prod(Y.shape)} outputs: a weight gradient over whole images?), "
                    f"more than the backend emits for one operator ({MAX_MATMULS})", node.loc,
                    "see docs/backend.md, 'Convolution and windows'")
    perm = (d.output_batch, d.output_feature, *d.output_spatial)
    ep = epilogue(lw, node, lambda r: r.permute(*perm))
    cv = Conv(lw, node, X, W, Y, geo, plan, mt, out_t, window, ep)
    Np = geo.batch
    if bgc > 1:
        jobs = [Job(b * Np, 0, C, b * geo.out_channels, geo.out_channels, 1) for b in range(bgc)]
    else:
        I, Og = geo.in_channels, geo.out_channels
        jobs = [Job(0, g0 * I, min(plan.pack, fgc - g0) * I, g0 * Og, min(plan.pack, fgc - g0) * Og,
                    min(plan.pack, fgc - g0)) for g0 in range(0, fgc, plan.pack)]
    for job in jobs:
        _job(cv, job)


def _cast_first(lw: Lowering, cast: Node) -> bool:
    """Compute a cast of the weights or the input the lowering absorbed (lower.py: the implicit GEMM
    converts the tiles it loads) as a pass of its own, for a path that reads them in their cast type;
    True if so."""
    if cast.id not in lw.absorbed:
        return False
    lw.absorbed.discard(cast.id)
    lower_cluster(lw, Cluster(cast.shape, [cast]), lw.consumers)
    return True


# --- depthwise on the vector engines ---------------------------------------------------------------

def _depthwise(lw: Lowering, X: Ref, W: Ref, Y: Ref, window: tuple[WindowDim, ...], dw: DepthwisePlan,
               out_t: dt.DType) -> None:
    """A depthwise convolution by :class:`~nxsat.extract.plan.DepthwisePlan`."""
    tl = dw.tiling
    N, C = X.shape[0], X.shape[1]
    k = 0
    for c0, cn in tl.chunks(C):
        stacks = _stacks(tl, c0, cn, N)
        wt = _channel_weights(lw, W[:, 0], c0, cn, stacks[0].jn)
        for planes in stacks:
            for q0 in range(0, Y.shape[2], tl.block):
                _depthwise_tile(lw, X, Y, wt[:planes.partitions], window, planes,
                                (q0, min(tl.block, Y.shape[2] - q0)), out_t, ADD_ENGINES[k % 2])
                k += 1


@dataclass(frozen=True)
class _Planes:
    """One tile's planes: channels ``[c0, c0 + cn)`` of ``jn`` groups of ``m`` batch elements from ``n0``;
    partition ``j * cn + c`` holds channel ``c0 + c`` of batch elements ``n0 + j * m ..``."""

    c0: int
    cn: int
    n0: int
    jn: int
    m: int

    @property
    def partitions(self) -> int:
        return self.jn * self.cn

    def groups(self) -> Iterator[tuple[slice, slice, slice]]:
        """Per group: its partitions, and the batch and channel slices of the tensor it holds."""
        for j in range(self.jn):
            n = self.n0 + j * self.m
            yield slice(j * self.cn, (j + 1) * self.cn), slice(n, n + self.m), slice(self.c0, self.c0 + self.cn)

    def load(self, lw: Lowering, tile: Ref, src: Ref, spatial: tuple[slice, ...]) -> None:
        """``tile[partitions, m, ...] = src[batch, channels, spatial...]`` (channels onto the partitions)."""
        for part, n, c in self.groups():
            v = src[(n, c, *spatial)]
            lw.graph.add("dma", "dma", tile[part], v.permute(1, 0, *range(2, len(v.shape))))

    def store(self, lw: Lowering, dst: Ref, tile: Ref, spatial: tuple[slice, ...]) -> None:
        for part, n, c in self.groups():
            v = dst[(n, c, *spatial)]
            lw.graph.add("dma", "dma", v.permute(1, 0, *range(2, len(v.shape))), tile[part])


def _stacks(tl: PlaneTiling, c0: int, cn: int, batch: int) -> list[_Planes]:
    """A channel chunk's tiles over the batch: ``tl.stack`` groups deep, the last maybe fewer."""
    J = tl.stack(cn, batch)
    return [_Planes(c0, cn, n0, min(J, (batch - n0) // tl.batch), tl.batch) for n0 in range(0, batch, J * tl.batch)]


class _Pair:
    """Two tiles of one shape used in turn (each made when first needed): the next use of one waits only
    for the use before last, and a tile of many uses costs two allocations, not one each."""

    def __init__(self, lw: Lowering, shape: tuple[int, ...], name: str) -> None:
        self.lw, self.shape, self.name = lw, shape, name
        self.tiles: list[Ref] = []

    def next(self) -> Ref:
        if len(self.tiles) < 2:
            self.tiles.insert(0, self.lw.graph.tile(self.shape, dt.F32, "sbuf", self.name).ref())
        t = self.tiles[0]
        self.tiles.reverse()
        return t


def _channel_weights(lw: Lowering, Wk: Ref, c0: int, cn: int, J: int) -> Ref:
    """``[J * cn, taps]`` fp32: partition ``j * cn + c`` holds the kernel of channel ``c0 + c`` (``Wk``:
    ``[C, K...]``), one DMA per group."""
    g = lw.graph
    ksize = Wk.shape[1:]
    raw = g.tile((J * cn, *ksize), onchip_dtype(Wk.dtype), "sbuf", "dww").ref()
    for j in range(J):
        g.add("dma", "dma", raw[j * cn:(j + 1) * cn], Wk[c0:c0 + cn])
    if raw.dtype is not dt.F32:
        f32 = g.tile((J * cn, *ksize), dt.F32, "sbuf", "dwwf").ref()
        g.add("dve", "tensor_copy", f32, raw)
        raw = f32
    return raw.reshape(J * cn, math.prod(ksize))


def _depthwise_tile(lw: Lowering, X: Ref, Y: Ref, wt: Ref, window: tuple[WindowDim, ...], planes: _Planes,
                    rows: tuple[int, int], out_t: dt.DType, engine: str) -> None:
    """One tile: ``planes``, output rows ``[q0, q0 + qn)`` of the outermost spatial dimension (all of
    the others). Only the input the block reads is loaded; each tap adds where it meets the input
    (padding contributes nothing, as in the implicit GEMM), and a tap that meets it everywhere starts
    the sum, so no memset is needed."""
    g = lw.graph
    q0, qn = rows
    S, Q = X.shape[2:], Y.shape[2:]
    first = (q0, *(0 for _ in Q[1:]))
    count = (qn, *Q[1:])
    lo, hi = [], []
    for d, w in enumerate(window):
        lo.append(max(0, first[d] * w.stride - w.pad_lo))
        hi.append(min(S[d], (first[d] + count[d] - 1) * w.stride + (w.size - 1) * w.rhs_dilation - w.pad_lo + 1))
    taps = []  # (weight column, per dimension (first output, last output + 1, input index of the first))
    for t in product(*(range(w.size) for w in window)):
        box = []
        for d, w in enumerate(window):
            off = t[d] * w.rhs_dilation - w.pad_lo  # the input index of output 0
            qa, qb = valid_range(off, w.stride, S[d], first[d], first[d] + count[d])
            if qa >= qb:
                break
            box.append((qa, qb, qa * w.stride + off))
        else:
            kidx = [w.size - 1 - i if w.reversal else i for w, i in zip(window, t)]
            taps.append((int(np.ravel_multi_index(kidx, [w.size for w in window])), box))
    P, m = planes.partitions, planes.m
    acc = g.tile((P, m, *count), dt.F32, "sbuf", "dwacc").ref()
    if taps:
        xt = g.tile((P, m, *(h - a for a, h in zip(lo, hi))), onchip_dtype(X.dtype), "sbuf", "dwin").ref()
        planes.load(lw, xt, X, tuple(slice(a, h) for a, h in zip(lo, hi)))

    def inputs(box: list) -> Ref:
        return xt[(slice(None), slice(None), *(slice(i - lo[d], i - lo[d] + (qb - qa - 1) * w.stride + 1, w.stride)
                                               for d, ((qa, qb, i), w) in enumerate(zip(box, window))))]

    whole = next((tp for tp in taps if all((qa, qb) == (first[d], first[d] + count[d])
                                           for d, (qa, qb, _) in enumerate(tp[1]))), None)
    if whole is not None:
        g.add("act", "activation", acc, inputs(whole[1]), scale=wt[:, whole[0]:whole[0] + 1])
    else:
        g.add(engine, "memset", acc, value=0.0)
    prods = _Pair(lw, (P, m, *count), "dwprod")
    for col, box in taps:
        if whole is not None and col == whole[0]:
            continue
        prod_t = prods.next()[(slice(None), slice(None), *(slice(0, qb - qa) for qa, qb, _ in box))]
        g.add("act", "activation", prod_t, inputs(box), scale=wt[:, col:col + 1])
        part = acc[(slice(None), slice(None),
                    *(slice(qa - first[d], qb - first[d]) for d, (qa, qb, _) in enumerate(box)))]
        g.add(engine, "tensor_tensor", part, part, prod_t, op="add")
    res = acc
    if out_t is not dt.F32:
        res = g.tile((P, m, *count), out_t, "sbuf", "dwout").ref()
        g.add("act", "activation", res, acc)
    planes.store(lw, Y, res, (slice(q0, q0 + qn),))


def _tiles(n: int, size: int) -> list[tuple[int, int]]:
    return [(k, min(size, n - k)) for k in range(0, n, size)]


@dataclass
class Work:
    """One PSUM bank of results to compute: its (channel tile, tap group, taps) steps, the input tiles
    they read (shared by the output-channel tiles of a block when the chunks are outside) and the
    stationary operand of each step."""

    job: Job
    combo: tuple[WindowClass, ...]
    chunk: tuple[tuple[int, int], ...]
    ot: tuple[int, int]
    inputs: dict
    reset_weights: bool
    steps: list | None = None  # None: no tap meets the input, the results are zero
    stationary: list = field(default_factory=list)
    homes: list = field(default_factory=list)  # per tap group: the group whose tile it reads, the move there


def _job(cv: Conv, job: Job) -> None:
    """Every PSUM bank of the job, software-pipelined by one: the next bank's inputs and weights are
    prepared (loads, transposes) before this bank's matmuls, so TensorE need not wait for them."""
    plan = cv.plan
    c_tiles = _tiles(job.cn, plan.c_tile) if job.pack == 1 else [(0, job.cn)]
    o_tiles = _tiles(job.on, plan.o_tile) if job.pack == 1 else [(0, job.on)]
    classes = cv.geo.classes()
    combos = list(product(*classes))
    cv.weights = {}

    def works() -> Iterator[Work]:
        if plan.chunk_outer:
            for combo in combos:
                for chunk in _chunks(cv, combo):
                    inputs: dict = {}
                    for ot in o_tiles:
                        yield _work(cv, job, combo, chunk, c_tiles, ot, inputs, not plan.cache_weights)
        else:
            for ot in o_tiles:
                first = True
                for combo in combos:
                    for chunk in _chunks(cv, combo):
                        yield _work(cv, job, combo, chunk, c_tiles, ot, {}, first or not plan.cache_weights)
                        first = False

    # Two stages deep where a bank's inputs are made in two (a stem's rows transposed, then its windows of
    # rows): this bank's first stage, the last bank's second, the one before's matmuls, so that TensorE
    # has the next transposes to do while ScalarE copies the last ones out of PSUM.
    staged: list[tuple[Work, list[Callable[[], None]]]] = []
    for w in works():
        cv.later = []
        _prepare(cv, w)
        staged.append((w, cv.later))
        if len(staged) >= 2:
            for step in staged[-2][1]:
                step()
            staged[-2][1].clear()
        if len(staged) >= 3:
            _compute(cv, staged.pop(0)[0])
    for _, steps in staged:
        for step in steps:
            step()
        steps.clear()  # the steps hold the Conv: no cycle left for a collector that is off
    cv.later = []
    for w, _ in staged:
        _compute(cv, w)


def _chunks(cv: Conv, combo: tuple[WindowClass, ...]) -> Iterator[tuple[tuple[int, int], ...]]:
    """Output blocks of one class combination: ``(start, size)`` of the batch and of each class's ``j``."""
    extents = (cv.geo.batch, *(c.count for c in combo))
    ranges = [_tiles(n, min(n, c)) for n, c in zip(extents, cv.plan.chunk)]
    yield from product(*ranges)


def _active(cv: Conv, combo: Combo, chunk: Chunk) -> list[list[Tap]] | None:
    """Per spatial dimension, the taps that meet the input somewhere in the block (None: none in some
    dimension, so the block is zero)."""
    out = []
    for d, cls in enumerate(combo):
        ja, jn = chunk[d + 1]
        taps = []
        for t, i0 in cls.taps:
            lo, hi = cls.valid(i0, cv.geo.in_spatial[d], ja, ja + jn)
            if lo < hi:
                taps.append(Tap(t, i0, cv.kidx(d, t)))
        if not taps:
            return None
        out.append(taps)
    return out


def _blocks(taps: list[Tap], size: int) -> list[list[Tap]]:
    return [taps[k:k + size] for k in range(0, len(taps), size)]


@dataclass(frozen=True)
class Box:
    """How an input tile holds one spatial dimension: tile index ``e < extent`` is input index
    ``lo + e * step``."""

    lo: int
    step: int
    extent: int


def _box(taps: list[Tap], istep: int, ja: int, jn: int) -> Box:
    offs = [tp.i0 for tp in taps]
    lo = min(offs) + ja * istep
    hi = max(offs) + (ja + jn - 1) * istep
    step = istep if jn > 1 else 0
    for o in offs:
        step = math.gcd(step, o - offs[0])
    step = step or 1
    return Box(lo, step, (hi - lo) // step + 1)


def _work(cv: Conv, job: Job, combo: Combo, chunk: Chunk, c_tiles: list[tuple[int, int]],
          ot: tuple[int, int], inputs: dict, reset_weights: bool) -> Work:
    """The steps of one PSUM bank: every (channel tile, tap group, tap combination)."""
    plan = cv.plan
    nsp = cv.nsp
    w = Work(job, combo, chunk, ot, inputs, reset_weights)
    active = _active(cv, combo, chunk)
    if active is None:
        return w
    folding = plan.fold > 1
    fd = plan.fold_dim
    per_dim = [_blocks(taps, plan.fold if folding and d == fd else plan.tap_block[d])
               for d, taps in enumerate(active)]
    w.steps = []
    w.homes = fold_homes(plan, [[[tp.i0 for tp in grp] for grp in groups] for groups in per_dim],
                         [cls.istep for cls in combo])
    for ct in c_tiles:
        for gid, group in enumerate(product(*per_dim)):
            others = [group[d] if not (folding and d == fd) else [None] for d in range(nsp)]
            for combo_taps in product(*others):
                w.steps.append((ct, gid, group, combo_taps))
    return w


def _prepare(cv: Conv, w: Work) -> None:
    """Load (or find loaded) the bank's input tiles and stationary operands."""
    if w.reset_weights:
        cv.weights = {}
    grow = fold_growth(w.homes)
    groups = {gid: group for _, gid, group, _ in w.steps or ()}
    for ct, gid, group, taps in w.steps or ():
        home = w.homes[gid][0]
        key = (ct, home)
        if key not in w.inputs:
            w.inputs[key] = _load_input(cv, w.job, w.combo, w.chunk, ct, groups[home], grow.get(home, 0))
        w.stationary.append(_stationary(cv, w.job, ct, w.ot, group, taps))


def _compute(cv: Conv, w: Work) -> None:
    """The bank's matmuls, then its evacuation (converting to the result type) and store."""
    g = cv.g
    o_off, on = w.ot
    nb, sp = w.chunk[0][1], w.chunk[1:]
    out_shape = (on, nb, *(jn for _, jn in sp))
    if w.steps is None:
        res = g.tile(out_shape, cv.out_t, "sbuf", "cvzero").ref()
        g.add("pool" if cv.out_t.is_int else "dve", "memset", res, value=0)
        _store(cv, w.job, w.combo, w.chunk, w.ot, res)
        return
    pieces = _pieces(cv, w.chunk)
    if len(pieces) == 1:
        acc = g.tile(out_shape, dt.F32, "psum", "cvacc").ref()
        banks = [acc]
    else:  # one bank a piece, each piece at its bank's start
        acc = g.tile((on, len(pieces), cv.lw.target.psum_bank_bytes // 4), dt.F32, "psum", "cvacc").ref()
        banks = [acc[:, b, :math.prod(n for _, n in pc)].reshape(on, *(n for _, n in pc))
                 for b, pc in enumerate(pieces)]
    for bank, piece in zip(banks, pieces):
        for k, ((ct, gid, group, taps), st) in enumerate(zip(w.steps, w.stationary)):
            home, move = w.homes[gid]
            tile, boxes = w.inputs[(ct, home)]
            mv = _moving(cv, tile, boxes, w.combo, piece, group, taps, st.shape[0], w.chunk, move)
            g.add("pe", "matmul", bank, st, mv, start=k == 0, stop=k == len(w.steps) - 1)
    if (cv.plan.transpose_out == "dma" or cv.nsp == 0) and cv.ep.reads_psum(cv.out_t):
        # the epilogue's first step reads the accumulator itself, bank by bank, pipelined
        for _ in pieces:
            cv.ep.evacuate_on_act(copy=False)
        cv.ep.pipelined([(_place(w.job, w.combo, piece, w.ot), bank) for bank, piece in zip(banks, pieces)])
        return
    res = g.tile(out_shape, cv.out_t, "sbuf", "cvres").ref()
    if len(pieces) == 1:
        _evacuate(cv, res, acc)
    else:
        # the full pieces in one pass over their banks, a shorter last piece on its own
        size = [math.prod(n for _, n in pc) for pc in pieces]
        flat = res.reshape(on, sum(size))
        full = sum(1 for n in size if n == size[0])
        _evacuate(cv, flat[:, :full * size[0]].reshape(on, full, size[0]), acc[:, :full, :size[0]])
        if full < len(pieces):
            _evacuate(cv, flat[:, full * size[0]:], acc[:, full, :size[-1]])
    _store(cv, w.job, w.combo, w.chunk, w.ot, res)


def _pieces(cv: Conv, chunk: Chunk) -> list[Chunk]:
    """The chunk cut into its PSUM banks' pieces (:attr:`ConvPlan.piece`; a last chunk may have fewer)."""
    plan = cv.plan
    if not plan.bank_len:
        return [chunk]
    k = plan.bank_dim
    step = plan.bank_len
    a, n = chunk[k]
    return [tuple((a + b, min(step, n - b)) if i == k else c for i, c in enumerate(chunk)) for b in range(0, n, step)]


def _evacuate(cv: Conv, dst: Ref, src: Ref) -> None:
    """PSUM to SBUF with the conversion: on the engine with less of the epilogue's work, or on ScalarE
    and VectorE in turn."""
    if cv.ep.cluster is not None:
        on_act = cv.ep.evacuate_on_act()
    else:
        on_act = cv.evac % 2 == 0
        cv.evac += 1
    cv.g.copy(on_act, dst, src)


# --- inputs ----------------------------------------------------------------------------------------

def _load_input(cv: Conv, job: Job, combo: Combo, chunk: Chunk, ct: tuple[int, int], group: Group,
                grow: int = 0) -> tuple[Ref, list]:
    """The input tile of one (channel tile, tap group): ``[K, nb, E...]``, K = channels x fold blocks;
    ``grow`` more outputs' rows on the fold dimension for the later groups that read it (``fold_homes``).

    Returns the tile and per spatial dimension its :class:`Box` (or, on the fold dimension, the list of
    per-block boxes)."""
    plan = cv.plan
    folding = plan.fold > 1
    fd = plan.fold_dim
    c_off, ck = ct
    (n0, nb), sp = chunk[0], chunk[1:]
    boxes: list = []
    union: list[Box] = []
    for d, taps in enumerate(group):
        cls = combo[d]
        ja, jn = sp[d]
        u = _box(taps, cls.istep, ja, jn)
        union.append(u)
        if folding and d == fd:
            boxes.append([Box(tp.i0 + ja * cls.istep, cls.istep, jn + grow) for tp in taps])
        else:
            boxes.append(u)
    nblk = len(group[fd]) if folding else 1
    cin = job.c0 + c_off
    nin = job.n0 + n0
    channels_last = plan.transpose_in != "dma"
    # what TensorE transposes fill holds the multiply type: the loaded positions are converted first
    # (ResNet-50's fp32 image, transposed as fp32: 38 us more of TensorE)
    in_t = cv.mt if plan.transpose_in == "pe" else onchip_dtype(cv.X.dtype)
    if not folding or not channels_last:
        # direct: each fold block straight from HBM
        ext = [len_of(b) for b in boxes]
        raw_t = load_dtype(cv.lw.target, cv.X, cv.mt)
        last = boxes[-1] if boxes else None
        if (not channels_last and not folding and isinstance(last, Box) and last.step > 1
                and _stride_one(cv.lw, cv.X, cv.nsp + 1)):
            # a strided window along contiguous rows (a stride-2 convolution stored channels-first): one
            # element per descriptor; the whole span loads as rows instead and is read every step-th
            dense = Box(last.lo, 1, (last.extent - 1) * last.step + 1)
            raw = cv.g.tile((ck, nb, *ext[:-1], dense.extent), raw_t, "sbuf", "cvin").ref()
            _fill_direct(cv, raw, [(0, [*boxes[:-1], dense])], cin, ck, nin, nb)
            view = raw[(*[slice(None)] * (cv.nsp + 1), slice(0, dense.extent, last.step))]
            return _converted(cv, view), boxes
        stride = _fold_stride(cv, ck, nblk)
        raw = cv.g.tile(((nblk - 1) * stride + ck, nb, *ext), in_t if channels_last else raw_t, "sbuf",
                        "cvin").ref()
        if channels_last:
            _fill_transposed(cv, raw, union, cin, ck, nin, nb)
        else:
            regions = []
            for b in range(nblk):
                bx = [bx[b] if isinstance(bx, list) else bx for bx in boxes]
                regions.append((b * stride, bx))
            _fill_direct(cv, raw, regions, cin, ck, nin, nb, zero=stride != ck)
        return _converted(cv, raw), boxes
    u = union[fd]
    fext = [len_of(b) for b in boxes]
    if (cv.nsp >= 2 and fd == cv.nsp - 2 and cv.X.dtype.itemsize in (2, 4)
            and all(bx.lo - u.lo == b * u.step for b, bx in enumerate(boxes[fd]))):
        # the fold's blocks are consecutive rows: TensorE transposes sliding windows of rows (exact on v3)
        tile = cv.g.tile((nblk * ck, nb, *fext), cv.mt, "sbuf", "cvin").ref()
        _fill_transposed_fold(cv, tile, union, boxes[fd][0].step // u.step, nblk, cin, ck, nin, nb)
        return _converted(cv, tile), boxes
    # channels-last with folding: transpose the union box once, then copy each block's shifted rows
    ext = [u.extent for u in union]
    base = cv.g.tile((ck, nb, *ext), in_t, "sbuf", "cvbase").ref()
    _fill_transposed(cv, base, union, cin, ck, nin, nb)
    tile = cv.g.tile((nblk * ck, nb, *fext), in_t, "sbuf", "cvin").ref()
    for b, bx in enumerate(boxes[fd]):
        key = [slice(None)] * (cv.nsp + 1)
        start = (bx.lo - u.lo) // u.step
        step = bx.step // u.step if bx.extent > 1 else 1
        key[fd + 1] = slice(start, start + (bx.extent - 1) * step + 1, step)
        dkey = [slice(None)] * (cv.nsp + 1)
        cv.g.add("dma", "dma", tile[(slice(b * ck, (b + 1) * ck), *dkey)], base[(slice(None), *key)])
    return _converted(cv, tile), boxes


def _fold_stride(cv: Conv, ck: int, nblk: int) -> int:
    """The partitions between consecutive fold blocks of ``ck`` channels: ``ck`` where every block then
    starts where an engine may start an operand of ``ck`` partitions, else the nearest such start that
    makes them all so and still fits (a quadrant's multiple on NeuronCore-v2: 0, 32, 64, 96), else ``ck``.
    A block at such a start is filled by an engine copy of a value still on chip (the forwarding pass)
    where a block at partition 16 took an SBUF-to-SBUF DMA, 1.8 us on resnet_small's critical path for a
    copy of 0.2. The rows between blocks are zeros in both operands (TensorE's time is the moving
    operand's columns, not its rows). Only for inputs loaded channels-first, the fold blocks' own loads."""
    target = cv.lw.target
    starts = target.start_partitions(ck)
    if nblk < 2 or cv.plan.transpose_in != "dma" or all(k * ck in starts for k in range(nblk)):
        return ck
    return next((s for s in starts if s >= ck and all(k * s in starts for k in range(nblk))
                 and (nblk - 1) * s + ck <= target.partitions), ck)


def len_of(b: Box | list[Box]) -> int:
    return b[0].extent if isinstance(b, list) else b.extent


def _converted(cv: Conv, raw: Ref) -> Ref:
    """``raw`` in the multiply type (one engine copy when the input's type is another), on GpSimd, which a
    convolution leaves idle: on VectorE, among the evacuations and epilogues, an absorbed fp32 image's
    conversions made ResNet-50's stem alone 128.5 us where its cost is 96.9 (the same rounding)."""
    if raw.dtype is cv.mt:
        return raw
    t = cv.g.tile(raw.shape, cv.mt, "sbuf", "cvinc").ref()
    cv.g.add("pool", "tensor_copy", t, raw)
    return t


def _valid(bx: Box, n: int) -> tuple[int, int]:
    """Tile indices ``[lo, hi)`` of a box that hold input elements."""
    lo = 0 if bx.lo >= 0 else -(bx.lo // bx.step)
    last = (n - 1 - bx.lo) // bx.step if bx.lo <= n - 1 else -1
    return lo, max(lo, min(bx.extent, last + 1))


def _memset(cv: Conv, t: Ref, value: float | int = 0) -> None:
    cv.g.add("pool", "memset", t, value=value)


def _fill_direct(cv: Conv, tile: Ref, regions: list, cin: int, ck: int, nin: int, nb: int,
                 zero: bool = False) -> None:
    """DMA each region's input box (partitions from ``p0``) into ``tile``, zero where it is padding (and
    everywhere first with ``zero``: rows between the regions)."""
    n_in = cv.geo.in_spatial
    loads = []
    slabs: list[tuple[slice, ...]] = []  # the padding each region reads
    for p0, bxs in regions:
        whole = [slice(p0, p0 + ck), slice(0, nb), *(slice(0, bx.extent) for bx in bxs)]
        dst_key: list = [slice(p0, p0 + ck), slice(0, nb)]
        src_key: list = [slice(nin, nin + nb), slice(cin, cin + ck)]
        empty = False
        for d, bx in enumerate(bxs):
            lo, hi = _valid(bx, n_in[d])
            if lo >= hi:
                empty = True
                break
            dst_key.append(slice(lo, hi))
            a = bx.lo + lo * bx.step
            src_key.append(slice(a, a + (hi - lo - 1) * bx.step + 1, bx.step))
        if empty:
            slabs.append(tuple(whole))
            continue
        slabs += _outside(whole, dst_key)
        perm = (1, 0, *range(2, cv.nsp + 2))
        loads.append((tile[tuple(dst_key)], cv.X[tuple(src_key)].permute(*perm)))
    slabs = _merged(slabs)
    if zero or not all(engine_ok(tile[sl], cv.lw.target) for sl in slabs):  # where GpSimd may not start
        _memset(cv, tile)
    else:
        # only the padding: the loads write the rest (a stage-1 3x3 input tile of ResNet-50, 128 x 34 x 58,
        # took GpSimd 0.66 us zeroed whole, beside VectorE's port)
        for slab in slabs:
            _memset(cv, tile[slab])
    for dst, src in loads:
        cv.g.add("dma", "dma", dst, src)


def _merged(slabs: list[tuple[slice, ...]]) -> list[tuple[slice, ...]]:
    """Slabs of consecutive partitions and the same free extent as one slab each (a fold's blocks share
    their padding columns)."""
    out: list[tuple[slice, ...]] = []
    for sl in slabs:
        for k, o in enumerate(out):
            if o[1:] == sl[1:] and o[0].stop == sl[0].start:
                out[k] = (slice(o[0].start, sl[0].stop), *sl[1:])
                break
        else:
            out.append(sl)
    return out


def _rows(valid: list[tuple[int, int]], nb: int, seg_cap: int, cap: int, max_rows: int = 1 << 30
          ) -> Iterator[tuple[int, tuple, int, tuple[int, int]]]:
    """Blocks of positions for the transposing loads and stores: ``(n, outer indices, rows along the
    last outer dimension, (w0, w1) along the innermost)``: at most ``seg_cap`` positions along the
    innermost dimension (one transpose's partitions), ``cap`` in all and ``max_rows`` rows."""
    *outer, (w0, w1) = valid
    segs = [(a, min(w1, a + seg_cap)) for a in range(w0, w1, seg_cap)]
    if not outer:
        for n in range(nb):
            for sg in segs:
                yield n, (), 1, sg
        return
    *head, (r0, r1) = outer
    for n in range(nb):
        for hidx in product(*(range(a, b) for a, b in head)):
            for sg in segs:
                m = max(1, min(max_rows, cap // (sg[1] - sg[0])))
                for r in range(r0, r1, m):
                    yield n, (*hidx, r), min(m, r1 - r), sg


def _fill_transposed(cv: Conv, tile: Ref, bxs: list[Box], cin: int, ck: int, nin: int, nb: int) -> None:
    """Fill ``tile [ck, nb, E...]`` (channels on partitions) from a channels-last input, a block of
    positions at a time: on NeuronCore-v3 a DMA transpose; on v2 one DMA of ``[positions along the
    innermost dimension, rows, channels]`` (runs of whole channel vectors), a TensorE transpose per row
    into one PSUM bank and one copy out of it."""
    g = cv.g
    n_in = cv.geo.in_spatial
    valid = [_valid(bx, n) for bx, n in zip(bxs, n_in)]
    if any(lo >= hi for lo, hi in valid):
        _memset(cv, tile)
        return
    if any(lo > 0 or hi < bx.extent for (lo, hi), bx in zip(valid, bxs)):
        _memset(cv, tile)
    use_dma = cv.plan.transpose_in == "dma_transpose"
    nsp = cv.nsp
    bank = cv.lw.target.psum_bank_bytes // 4
    seg_cap = DMA_T_BLOCK if use_dma else PE_BLOCK
    for n, outer, rn, (w0, w1) in _rows(valid, nb, seg_cap, DMA_T_BLOCK if use_dma else bank):
        wn = w1 - w0
        src_key: list = [nin + n, slice(cin, cin + ck)]
        dst_key: list = [slice(None), n]
        for d in range(nsp - 1):
            bx = bxs[d]
            e = outer[d]
            if d == nsp - 2:
                a = bx.lo + e * bx.step
                src_key.append(slice(a, a + (rn - 1) * bx.step + 1, bx.step))
                dst_key.append(slice(e, e + rn))
            else:
                src_key.append(bx.lo + e * bx.step)
                dst_key.append(e)
        bx = bxs[-1]
        a = bx.lo + w0 * bx.step
        src_key.append(slice(a, a + (wn - 1) * bx.step + 1, bx.step))
        dst_key.append(slice(w0, w1))
        src = cv.X[tuple(src_key)]  # [ck, (rows), w]
        dst = tile[tuple(dst_key)]  # [ck, (rows), w]
        if use_dma:
            rows = src.permute(*range(1, len(src.shape)), 0)  # [(rows), w, ck]
            try:
                flat = rows.reshape(rn * wn, ck)
                flat.shape  # noqa: B018 - resolves the chain
                g.add("dma", "dma_transpose", dst, flat)
            except (AccessError, IndexError):
                for k in range(rn):
                    g.add("dma", "dma_transpose", dst[:, k] if nsp > 1 else dst, rows[k] if nsp > 1 else rows)
            continue
        # [w, rows, ck]: partition = position along the innermost dimension
        tmp = g.tile((wn, rn, ck), load_dtype(cv.lw.target, src, cv.mt), "sbuf", "cvtin").ref()
        g.add("dma", "dma", tmp, src.reshape(ck, rn, wn).permute(2, 1, 0))
        tmp = _converted(cv, tmp)
        ps = g.tile((ck, rn, wn), dt.F32, "psum", "cvtps").ref()
        for k in range(rn):
            g.add("pe", "transpose", ps[:, k], tmp[:, k])
        _evacuate(cv, dst, ps if nsp > 1 else ps[:, 0])


def _fill_transposed_fold(cv: Conv, tile: Ref, union: list[Box], rstep: int, nblk: int, cin: int, ck: int,
                          nin: int, nb: int) -> None:
    """Fill a folded tile ``[nblk * ck, nb, ..., rows, w]`` from a channels-last input whose fold blocks
    are consecutive rows (taps ``b`` of the row dimension): the union's rows ``[w, rows, ck]`` are loaded
    once per block of rows, and one TensorE transpose of the contiguous window ``[w, nblk * ck]`` of
    rows ``j * rstep ..`` gives every block of fold row ``j`` at once (a transpose costs its source's
    partitions, so the fold's extra rows cost nothing)."""
    g = cv.g
    nsp = cv.nsp
    n_in = cv.geo.in_spatial
    rd = nsp - 2
    u = union[rd]
    cnt = tile.shape[2 + rd]
    kk = nblk * ck
    valid = [_valid(bx, n) for bx, n in zip(union, n_in)]
    w0, w1 = valid[-1]
    outer_valid = valid[:rd]
    if w0 >= w1 or any(lo >= hi for lo, hi in outer_valid):
        _memset(cv, tile)
        return
    if any(lo > 0 or hi < bx.extent for (lo, hi), bx in zip(outer_valid, union)):
        _memset(cv, tile)
    else:
        # only the padding columns: the transposes write every other element (ResNet-50's stem zeroed
        # 32 whole tiles for their three columns each side, 10 us of GpSimd beside VectorE's port)
        for a, b in ((0, w0), (w1, union[-1].extent)):
            if a < b:
                _memset(cv, tile[..., a:b])
    bank = cv.lw.target.psum_bank_bytes // 4
    segs = [(a, min(w1, a + PE_BLOCK)) for a in range(w0, w1, PE_BLOCK)]
    for n in range(nb):
        for hidx in product(*(range(a, b) for a, b in outer_valid)):
            for sw0, sw1 in segs:
                seg = sw1 - sw0
                m = max(1, bank // seg)
                for j0 in range(0, cnt, m):
                    rn = min(m, cnt - j0)
                    r0 = j0 * rstep  # union rows r0 .. r0 + R - 1
                    R = (rn - 1) * rstep + nblk
                    vlo, vhi = _valid(Box(u.lo + r0 * u.step, u.step, R), n_in[rd])
                    src = None
                    if vlo < vhi:
                        key: list = [nin + n, slice(cin, cin + ck)]
                        key += [union[d].lo + e * union[d].step for d, e in enumerate(hidx)]
                        a = u.lo + (r0 + vlo) * u.step
                        key.append(slice(a, a + (vhi - vlo - 1) * u.step + 1, u.step))
                        bw = union[-1]
                        a = bw.lo + sw0 * bw.step
                        key.append(slice(a, a + (seg - 1) * bw.step + 1, bw.step))
                        src = cv.X[tuple(key)]
                    # rows transposed on TensorE are written out of PSUM in the multiply type already
                    by_rows = src is None or _rows_fit(cv, src)
                    in_t = cv.mt if by_rows else load_dtype(cv.lw.target, src, cv.mt)
                    tmp = g.tile((seg, R, ck), in_t, "sbuf", "cvtin").ref()
                    if vlo > 0 or vhi < R:
                        _memset(cv, tmp)
                    if src is not None:
                        _load_positions(cv, tmp[:, vlo:vhi], src)
                    tmp = _converted(cv, tmp)

                    def windows(tmp: Ref = tmp, rn: int = rn, seg: int = seg,
                                at: tuple = (slice(None), n, *hidx, slice(j0, j0 + rn), slice(sw0, sw1))) -> None:
                        ps = g.tile((kk, rn, seg), dt.F32, "psum", "cvtps").ref()
                        for k in range(rn):
                            a = k * rstep
                            g.add("pe", "transpose", ps[:, k], tmp[:, a:a + nblk].reshape(seg, kk))
                        _evacuate(cv, tile[at], ps)

                    cv.later.append(windows)


def _rows_fit(cv: Conv, src: Ref) -> bool:
    """Does :func:`_load_positions` load ``src [ck, rows, w]`` as whole rows transposed on TensorE (short
    channel vectors, rows that fit the array and one PSUM bank)?"""
    ck, rn, wn = src.shape
    try:
        src.permute(1, 2, 0).reshape(rn, wn * ck).ap  # noqa: B018 - whole rows: each is one run
    except AccessError:
        return False
    return rows_fit(ck, rn, wn, src.dtype.itemsize, cv.lw.target, src.dtype.is_float)


def _load_positions(cv: Conv, dst: Ref, src: Ref) -> None:
    """``dst [w, rows, ck]`` (positions on partitions) from the channels-last ``src [ck, rows, w]``: one
    DMA whose descriptors are the channel vectors, or, where those are a few bytes (a 3-channel image:
    6 bytes, at 12 ns of DMA engine time each ResNet-50's stem took 85 us of its critical path), one DMA
    of the rows as they lie (``[rows, w * ck]``, whole rows per descriptor) and a TensorE transpose per
    channel into one PSUM tile, copied out once (exact for finite values, as every TensorE transpose on
    NeuronCore-v2)."""
    g = cv.g
    ck, rn, wn = src.shape
    rows = src.permute(1, 2, 0)  # [rows, w, ck]
    if not _rows_fit(cv, src):
        g.add("dma", "dma", dst, src.permute(2, 1, 0))
        return
    nat = g.tile((rn, wn, ck), load_dtype(cv.lw.target, src, cv.mt), "sbuf", "cvrows").ref()
    g.add("dma", "dma", nat, rows)
    nat = _converted(cv, nat)  # transposed in the multiply type (an fp32 transpose takes more TensorE passes)
    ps = g.tile((wn, ck, rn), dt.F32, "psum", "cvrowsps").ref()
    for c in range(ck):
        g.add("pe", "transpose", ps[:, c, :], nat[:, :, c])
    _evacuate(cv, dst, ps.permute(0, 2, 1))


def _moving(cv: Conv, tile: Ref, boxes: list, combo: Combo, chunk: Chunk, group: Group, taps: TapCombo,
            k: int, base: Chunk, move: int = 0) -> Ref:
    """The moving operand of one matmul: the tile's view that the tap combination reads for the outputs
    ``chunk`` (a piece of ``base``, the chunk the tile was loaded for; ``move`` outputs on along the fold
    dimension where the tile is another tap group's, ``fold_homes``)."""
    plan = cv.plan
    folding = plan.fold > 1
    (na, nb) = chunk[0]
    key: list = [slice(0, k), slice(na - base[0][0], na - base[0][0] + nb)]
    for d, cls in enumerate(combo):
        ja, jn = chunk[d + 1]
        if folding and d == plan.fold_dim:  # the tile holds the chunk's outputs one for one
            off = ja - base[d + 1][0] + move
            key.append(slice(off, off + jn))
            continue
        bx = boxes[d]
        tp = taps[d]
        start = (tp.i0 + ja * cls.istep - bx.lo) // bx.step
        step = cls.istep // bx.step if jn > 1 else 1
        key.append(slice(start, start + (jn - 1) * step + 1, step))
    return tile[tuple(key)]


# --- weights ---------------------------------------------------------------------------------------

def _stationary(cv: Conv, job: Job, ct: tuple[int, int], ot: tuple[int, int], group: Group, taps: TapCombo
                ) -> Ref:
    """The stationary operand ``[K, O_tile]`` of one matmul (weights of the tap combination)."""
    plan = cv.plan
    g = cv.g
    nsp = cv.nsp
    c_off, ck = ct
    o_off, on = ot
    if job.pack > 1:
        return _packed(cv, job, taps)
    W = cv.W
    o0 = job.o0 + o_off
    wperm = (1, *range(2, nsp + 2), 0)  # [I, K..., O]
    if plan.fold > 1:
        fd = plan.fold_dim
        fk = tuple(tp.k for tp in group[fd])
        key = ("fold", job, ct, ot, fk)
        wt = cv.weights.get(key)
        if wt is None:
            raw_t = load_dtype(cv.lw.target, W, cv.mt)
            kshape = [W.shape[2 + d] for d in range(nsp) if d != fd]
            stride = _fold_stride(cv, ck, len(fk))
            raw = g.tile(((len(fk) - 1) * stride + ck, *kshape, on), raw_t, "sbuf", "cvw").ref()
            if stride != ck:
                _memset(cv, raw)  # the rows between blocks
            for b, kk in enumerate(fk):
                src_key = [slice(o0, o0 + on), slice(c_off, c_off + ck)] + \
                    [kk if d == fd else slice(None) for d in range(nsp)]
                src = W[tuple(src_key)]
                g.add("dma", "dma", raw[b * stride:b * stride + ck], src.permute(*range(1, len(src.shape)), 0))
            wt = cv.weights[key] = _weights_converted(cv, raw)
        idx = [taps[d].k for d in range(nsp) if d != fd]
        return wt[(slice(None), *idx, slice(None))]
    span = plan.weight_group(cv.geo, onchip_dtype(W.dtype).itemsize) * plan.o_tile  # output channels a load
    ga = o_off // span * span  # the group's first output channel in the job
    key = ("all", job, ct, ga)
    wt = cv.weights.get(key)
    if wt is None:
        gn = min(span, job.on - ga)
        rows = W[job.o0 + ga:job.o0 + ga + gn, c_off:c_off + ck]
        if weights_by_rows(plan, rows.dtype.is_float, rows.permute(*wperm).ap.contiguous_run() * rows.dtype.itemsize,
                           rows.ap.contiguous_run(), ck * math.prod(W.shape[2:])):
            wt = cv.weights[key] = _weights_transposed(cv, rows)
        else:
            raw = g.tile((ck, *W.shape[2:], gn), load_dtype(cv.lw.target, rows, cv.mt), "sbuf", "cvw").ref()
            g.add("dma", "dma", raw, rows.permute(*wperm))
            wt = cv.weights[key] = _weights_converted(cv, raw)
    return wt[(slice(None), *(tp.k for tp in taps), slice(o_off - ga, o_off - ga + on))]


def _weights_transposed(cv: Conv, rows: Ref) -> Ref:
    """The ``[I, K..., O]`` stationary tile of weights that lie output channel by output channel in HBM
    (PyTorch's OIHW: an ``[I, K..., O]`` load would move one element per descriptor, 114 us for a 3x3
    convolution of 128 channels): each output channel's row loaded whole (``[O <= 128, I * K]``), then each
    tap's ``[O, I]`` block transposed on TensorE into PSUM and copied out in the multiply type, as
    backend/matmul.py's ``_load_pe_transposed`` does a dot's K-contiguous operand. Finite values are exact; a
    NaN or infinity spreads along its block (the transpose is an identity matmul on NeuronCore-v2)."""
    g = cv.g
    gn, ck, *ks = rows.shape
    taps = math.prod(ks)
    part = cv.lw.target.matmul["rows"]
    bank = cv.lw.target.psum_bank_bytes // 4
    wt = g.tile((ck, taps, gn), cv.mt, "sbuf", "cvwc").ref()
    raw_t = load_dtype(cv.lw.target, rows, cv.mt)
    for o0 in range(0, gn, part):
        on = min(part, gn - o0)
        nat = g.tile((on, ck, taps), raw_t, "sbuf", "cvwrow").ref()
        g.add("dma", "dma", nat, rows[o0:o0 + on].reshape(on, ck, taps))
        per = max(1, bank // on)  # taps one bank holds
        for t0 in range(0, taps, per):
            cnt = min(per, taps - t0)
            ps = g.tile((ck, cnt, on), dt.F32, "psum", "cvwtp").ref()
            for i in range(cnt):
                g.add("pe", "transpose", ps[:, i, :], nat[:, :, t0 + i])
            g.copy(bool((o0 // part + t0 // per) % 2), wt[:, t0:t0 + cnt, o0:o0 + on], ps)
    return wt.reshape(ck, *ks, gn)


def _weights_converted(cv: Conv, raw: Ref) -> Ref:
    if raw.dtype is cv.mt:
        return raw
    t = cv.g.tile(raw.shape, cv.mt, "sbuf", "cvwc").ref()
    # floats on ScalarE: in a convolution it only evacuates PSUM, while VectorE runs the layers'
    # elementwise work (ResNet-50: 165 us of weight casts on VectorE, 8% of ScalarE busy); the same rounding.
    # A long one shared with VectorE (cast_split).
    if not (raw.dtype.is_float and cv.mt.is_float):
        cv.g.copy(False, t, raw)
        return t
    cols = raw.shape[-1]
    k = cast_split(cv.lw.target, math.prod(raw.shape[1:]), cols)
    cv.g.copy(True, t[..., :k], raw[..., :k])
    if k < cols:
        cv.g.copy(False, t[..., k:], raw[..., k:])
    return t


def _packed(cv: Conv, job: Job, taps: TapCombo) -> Ref:
    """A block-diagonal stationary ``[pack * I, pack * Og]`` for ``pack`` feature groups at once: the
    weights of group ``g`` on rows ``g*I..`` and columns ``g*Og..``, zero elsewhere (a select, not a
    product, so a NaN weight stays in its group)."""
    g = cv.g
    nsp = cv.nsp
    I, Og, gp = cv.geo.in_channels, cv.geo.out_channels, job.pack
    cp = gp * I
    key = ("packraw", job)
    raw = cv.weights.get(key)
    W = cv.W
    o_last = packed_outputs_last(I, Og, W.ap.dims[0][1])
    if raw is None:
        shape = (cp, *W.shape[2:], Og) if o_last else (cp, Og, *W.shape[2:])
        raw = g.tile(shape, onchip_dtype(W.dtype), "sbuf", "cvw").ref()
        if I == 1:
            src = W[job.o0:job.o0 + gp * Og, 0]
            g.add("dma", "dma", raw, src.reshape(gp, Og, *W.shape[2:]))
        else:
            order = (1, *range(2, nsp + 2), 0) if o_last else (1, 0, *range(2, nsp + 2))
            for k in range(gp):
                src = W[job.o0 + k * Og:job.o0 + (k + 1) * Og]
                g.add("dma", "dma", raw[k * I:(k + 1) * I], src.permute(*order))
        cv.weights[key] = raw
    mkey = (cp, gp, Og, I)
    if mkey not in cv.masks:
        u = g.tile((cp, gp, Og), dt.F32, "sbuf", "cvmu").ref()
        # u = 2p - 2I*g - (I-1): |u| <= I-1 exactly when row p belongs to group g
        g.add("pool", "iota", u, base=-(I - 1), channel_multiplier=2, steps=(-2 * I, 0))
        mask = g.tile((cp, gp, Og), dt.U8, "sbuf", "cvmask").ref()
        g.add("dve", "tensor_scalar", mask, u, op0="abs_max", scalar0=0.0, op1="le", scalar1=float(I - 1))
        zero = g.tile((cp, gp, Og), cv.mt, "sbuf", "cvzero").ref()
        g.add("pool", "memset", zero, value=0)
        cv.masks[mkey] = (mask, zero)
    mask, zero = cv.masks[mkey]
    skey = ("pack", job, tuple(tp.k for tp in taps))
    st = cv.weights.get(skey)
    if st is None:
        tk = tuple(tp.k for tp in taps)
        col = raw[(slice(None), *tk, slice(None))] if o_last else raw[(slice(None), slice(None), *tk)]  # [cp, Og]
        st = g.tile((cp, gp, Og), cv.mt, "sbuf", "cvst").ref()
        g.add("dve", "select", st, mask, col.reshape(cp, 1, Og).broadcast(1, gp), zero)
        st = cv.weights[skey] = st.reshape(cp, gp * Og)
    return st


# --- results ---------------------------------------------------------------------------------------

def _qkeys(combo: Combo, chunk: Chunk) -> list[slice]:
    """The block's output positions per spatial dimension (class progressions)."""
    keys = []
    for cls, (ja, jn) in zip(combo, chunk[1:]):
        a = cls.first + ja * cls.step
        keys.append(slice(a, a + (jn - 1) * cls.step + 1, cls.step))
    return keys


def _place(job: Job, combo: Combo, chunk: Chunk, ot: tuple[int, int]) -> Callable[[Ref], Ref]:
    """Where a channels-first block ``[O_tile, nb, j...]`` lies in (a value of) Y's frame."""
    (n0, nb) = chunk[0]
    o0, on = job.o0 + ot[0], ot[1]
    key = (slice(n0, n0 + nb), slice(o0, o0 + on), *_qkeys(combo, chunk))
    perm = (1, 0, *range(2, len(chunk) + 1))
    return lambda y: y[key].permute(*perm)


def _store(cv: Conv, job: Job, combo: Combo, chunk: Chunk, ot: tuple[int, int], res: Ref) -> None:
    """The block's results ``[O_tile, nb, j...]`` to their places in Y (class progressions)."""
    g = cv.g
    o_off, on = ot
    (n0, nb), sp = chunk[0], chunk[1:]
    o0 = job.o0 + o_off
    qkeys = _qkeys(combo, chunk)
    if cv.plan.transpose_out == "dma" or cv.nsp == 0:
        cv.ep.tile(_place(job, combo, chunk, ot), res)
        return
    # channels-last result: blocks of up to 128 positions transposed on TensorE into one PSUM bank, one
    # copy out of it and one DMA of whole channel vectors
    bank = cv.lw.target.psum_bank_bytes // 4
    nsp = cv.nsp
    npos = math.prod(jn for _, jn in sp)
    flat_ok = True
    flats = []
    def positions(y: Ref, n: int) -> Ref:
        """Batch element ``n0 + n`` of the block in ``y`` (framed) as ``[positions, channels]``."""
        return y[(n0 + n, slice(o0, o0 + on), *qkeys)].permute(*range(1, nsp + 1), 0).reshape(npos, on)

    for n in range(nb):
        try:
            flat = positions(cv.Y, n)
            flat.shape  # noqa: B018 - resolves the chain: positions that do not merge need rows
        except (AccessError, IndexError):
            flat_ok = False
            break
        flats.append(flat)
    if flat_ok:
        bp = out_block(npos)
        per_bank = max(1, bank // on)
        for n in range(len(flats)):
            src = res[:, n].reshape(on, npos) if nsp > 1 else res[:, n]
            p0 = 0
            while p0 < npos:
                full = min(per_bank, (npos - p0) // bp)
                if full == 0:  # a last, partial block
                    pn = npos - p0
                    ps = g.tile((pn, on), dt.F32, "psum", "cvtps").ref()
                    g.add("pe", "transpose", ps, src[:, p0:npos])
                    tmp = g.tile((pn, on), cv.out_t, "sbuf", "cvtout").ref()
                    _evacuate(cv, tmp, ps)
                    cv.ep.tile(lambda y, n=n, p0=p0: positions(y, n)[p0:npos], tmp)
                    break
                ps = g.tile((bp, full, on), dt.F32, "psum", "cvtps").ref()
                for k in range(full):
                    a = p0 + k * bp
                    g.add("pe", "transpose", ps[:, k], src[:, a:a + bp])
                tmp = g.tile((bp, full, on), cv.out_t, "sbuf", "cvtout").ref()
                _evacuate(cv, tmp, ps)
                cv.ep.tile(lambda y, n=n, p0=p0, full=full: positions(y, n)[p0:p0 + full * bp].reshape(
                    full, bp, on).permute(1, 0, 2), tmp)
                p0 += full * bp
        return
    valid = [(0, jn) for _, jn in sp]
    for n, outer, rn, (w0, w1) in _rows(valid, nb, PE_BLOCK, bank * PE_BLOCK, max(1, bank // on)):
        seg = w1 - w0
        dkey: list = [n0 + n, slice(o0, o0 + on)]
        rkey: list = [slice(None), n]
        for d in range(nsp - 1):
            q = qkeys[d]
            e = outer[d]
            if d == nsp - 2:
                dkey.append(slice(q.start + e * q.step, q.start + (e + rn - 1) * q.step + 1, q.step))
                rkey.append(slice(e, e + rn))
            else:
                dkey.append(q.start + e * q.step)
                rkey.append(e)
        q = qkeys[-1]
        dkey.append(slice(q.start + w0 * q.step, q.start + (w1 - 1) * q.step + 1, q.step))
        rkey.append(slice(w0, w1))
        blk = res[tuple(rkey)]  # [on, (rows), w]
        ps = g.tile((seg, rn, on), dt.F32, "psum", "cvtps").ref()
        for k in range(rn):
            g.add("pe", "transpose", ps[:, k], blk[:, k] if nsp > 1 else blk)
        tmp = g.tile((seg, rn, on), cv.out_t, "sbuf", "cvtout").ref()
        _evacuate(cv, tmp, ps)
        cv.ep.tile(lambda y, dkey=tuple(dkey), rn=rn, seg=seg: y[dkey].reshape(on, rn, seg).permute(2, 1, 0), tmp)


# --- windows on VectorE/GpSimd (reduce-window, select-and-scatter) ---------------------------------

@dataclass
class WinBlock:
    """One tile of a windowed operator: per dimension its output class and range ``(ja, jn)``, the taps
    active in the range and (except along the partition dimension) the input box the tile holds.
    Along the partition dimension ``part`` each partition is one output and the tile's axis 1 holds
    the input rows of the active taps ``taps[part]``."""

    classes: tuple[WindowClass, ...]
    ranges: tuple[tuple[int, int], ...]
    taps: list[list[Tap]]
    boxes: list[Box | None]
    part: int | None

    @property
    def P(self) -> int:  # noqa: N802 - the partition count
        return self.ranges[self.part][1] if self.part is not None else 1

    @property
    def empty(self) -> bool:
        return any(not t for t in self.taps)

    def acc_shape(self, packed: int = 1) -> tuple[int, ...]:
        """``packed``: blocks of this shape stacked on the partitions (:func:`_packs`)."""
        free = tuple(jn for k, (_, jn) in enumerate(self.ranges) if k != self.part)
        return (self.P * packed, *free) if free else (self.P * packed, 1)

    def tile_shape(self, packed: int = 1) -> tuple[int, ...]:
        ext = tuple(b.extent for k, b in enumerate(self.boxes) if k != self.part and b is not None)
        if self.part is not None:
            return (self.P * packed, len(self.taps[self.part]), *ext)
        return (1, *ext) if ext else (1, 1)

    def combos(self) -> list[tuple[Tap, ...]]:
        """Every tap combination, in the window's row-major order."""
        return list(product(*self.taps))

    def view(self, tile: Ref, combo: tuple[Tap, ...], whole: int | None = None) -> Ref:
        """The tile's elements that tap combination ``combo`` brings to the block's outputs (on all the
        tile's partitions: packed blocks share the view); along dimension ``whole``, every element of its
        box instead (a separable window's first pass, :func:`_rw_separable`)."""
        key: list = [slice(0, tile.shape[0])]
        if self.part is not None:
            ti = self.taps[self.part].index(combo[self.part])
            key.append(slice(ti, ti + 1))
        for k in range(len(self.ranges)):
            if k == self.part:
                continue
            bx = self.boxes[k]
            assert bx is not None
            key.append(slice(0, bx.extent) if k == whole else self.tap_slice(k, combo[k]))
        return tile[tuple(key)]

    def tap_slice(self, k: int, tp: Tap) -> slice:
        """Where tap ``tp`` of dimension ``k`` meets the block's outputs, in the input box's elements."""
        cls, (ja, jn), bx = self.classes[k], self.ranges[k], self.boxes[k]
        assert bx is not None
        start = (tp.i0 + ja * cls.istep - bx.lo) // bx.step
        step = cls.istep // bx.step if jn > 1 else 1
        return slice(start, start + (jn - 1) * step + 1, step)

    def separable(self) -> tuple[int, int] | None:
        """The two dimensions of a window to reduce one after the other, the one to reduce first first,
        where two passes (the first one's taps over every element of the other's box, then the other's
        taps) take fewer element-steps than one step per tap combination over the outputs; None where
        the window has taps along other than two free dimensions."""
        dims = [k for k, tp in enumerate(self.taps) if len(tp) > 1]
        if len(dims) != 2 or self.part in dims:
            return None
        n = {k: len(self.taps[k]) for k in dims}
        out = {k: self.ranges[k][1] for k in dims}
        ext = {k: self.boxes[k].extent for k in dims}  # type: ignore[union-attr]  # free dimensions have boxes
        direct = (n[dims[0]] * n[dims[1]] - 1) * out[dims[0]] * out[dims[1]]
        costs = {(a, b): (n[a] - 1) * out[a] * ext[b] + (n[b] - 1) * out[a] * out[b]
                 for a, b in (dims, dims[::-1])}
        best = min(costs, key=lambda ab: (costs[ab], ab))
        return best if costs[best] < direct else None

    def out_view(self, Y: Ref) -> Ref:
        """The block's outputs in ``Y`` (partition dimension first)."""
        key = []
        for cls, (ja, jn) in zip(self.classes, self.ranges):
            a = cls.first + ja * cls.step
            key.append(slice(a, a + (jn - 1) * cls.step + 1, cls.step))
        v = Y[tuple(key)] if key else Y
        if self.part is not None and self.part != 0:
            perm = [self.part] + [k for k in range(len(key)) if k != self.part]
            v = v.permute(*perm)
        return v

    def invalid(self, shape: tuple[int, ...], combo: tuple[Tap, ...]) -> bool:
        """Does the tap combination meet padding or holes anywhere in the block?"""
        for k, (cls, (ja, jn)) in enumerate(zip(self.classes, self.ranges)):
            lo, hi = cls.valid(combo[k].i0, shape[k], ja, ja + jn)
            if lo > ja or hi < ja + jn:
                return True
        return False

    def valid_region(self, shape: tuple[int, ...], combo: tuple[Tap, ...]) -> tuple | None:
        """The outputs of the block (as an index of the accumulator) where the combination meets input."""
        key: list = []
        part_key = slice(0, self.P)
        for k, (cls, (ja, jn)) in enumerate(zip(self.classes, self.ranges)):
            lo, hi = cls.valid(combo[k].i0, shape[k], ja, ja + jn)
            if lo >= hi:
                return None
            if k == self.part:
                part_key = slice(lo - ja, hi - ja)
            else:
                key.append(slice(lo - ja, hi - ja))
        return (part_key, *key) if key else (part_key, slice(0, 1))


def _win_blocks(shape: tuple[int, ...], window: tuple[WindowDim, ...], out_shape: tuple[int, ...],
                plan: WindowPlan) -> Iterator[WinBlock]:
    classes = [window_classes(n, w.size, w.stride, w.pad_lo, w.lhs_dilation, w.rhs_dilation, q)
               for n, w, q in zip(shape, window, out_shape)]
    for combo in product(*classes):
        extents = [c.count for c in combo]
        for ranges in product(*(_tiles(n, min(n, c)) for n, c in zip(extents, plan.chunk))):
            taps: list[list[Tap]] = []
            boxes: list[Box | None] = []
            for k, (cls, (ja, jn)) in enumerate(zip(combo, ranges)):
                act = []
                for t, i0 in cls.taps:
                    lo, hi = cls.valid(i0, shape[k], ja, ja + jn)
                    if lo < hi:
                        act.append(Tap(t, i0, t))
                taps.append(act)
                boxes.append(_box(act, cls.istep, ja, jn) if act and k != plan.part else None)
            yield WinBlock(tuple(combo), tuple(ranges), taps, boxes, plan.part)


def _win_load(lw: Lowering, X: Ref, blk: WinBlock, dtype: dt.DType, fill: float | int, into: Ref | None = None,
              p0: int = 0) -> Ref:
    """The block's input tile (``fill`` where the window meets padding or holes: only there, on GpSimd,
    so the loads need not wait for a memset of the whole tile behind VectorE's work on the block before;
    ResNet-50's max-pool waited 6 us a block); ``into``: a tile of packed blocks, this one's from
    partition ``p0``."""
    g = lw.graph
    shape = X.shape
    tile = into if into is not None else g.tile(blk.tile_shape(), dtype, "sbuf", "winin").ref()
    full = [slice(p0, p0 + blk.P)] + [slice(0, n) for n in tile.shape[1:]]
    loads = []
    holes: list[tuple[slice, ...]] = []  # the parts of the tile no load writes
    part_taps = blk.taps[blk.part] if blk.part is not None else [None]
    for ti, ptap in enumerate(part_taps):
        dkey: list = []
        skey: list = [None] * len(shape)
        region = list(full)
        if blk.part is not None:
            region[1] = slice(ti, ti + 1)
            cls = blk.classes[blk.part]
            ja, jn = blk.ranges[blk.part]
            lo, hi = cls.valid(ptap.i0, shape[blk.part], ja, ja + jn)
            if lo >= hi:
                holes.append(tuple(region))
                continue
            dkey += [slice(p0 + lo - ja, p0 + hi - ja), slice(ti, ti + 1)]
            a = ptap.i0 + lo * cls.istep
            skey[blk.part] = slice(a, a + (hi - lo - 1) * cls.istep + 1, cls.istep)
        else:
            dkey.append(slice(0, 1))
        inside = _free_keys(blk, shape, dkey, skey)
        if inside is None:
            holes.append(tuple(region))
            continue
        if dkey[0] != region[0]:  # rows of partitions: engines start at partition 0, 32, 64 or 96
            holes.append(tuple(region))
        elif not inside:
            holes += _outside(region, dkey)
        loads.append((tile[tuple(dkey)], _part_first(X[tuple(skey)] if skey else X, blk)))
    for h in holes:
        g.add("pool", "memset", tile[h], value=fill)
    for dst, src in loads:
        g.add("dma", "dma", dst, src)
    return tile


def _outside(region: list[slice], box: list[slice]) -> list[tuple[slice, ...]]:
    """The slabs of ``region`` outside ``box`` (the same partitions; a slice per dimension), disjoint."""
    out = []
    cur = list(region)
    for d in range(1, len(region)):
        r, b = region[d], box[d]
        if b.start > r.start:
            out.append(tuple(cur[:d] + [slice(r.start, b.start)] + cur[d + 1:]))
        if b.stop < r.stop:
            out.append(tuple(cur[:d] + [slice(b.stop, r.stop)] + cur[d + 1:]))
        cur[d] = b
    return out


# reduction body operator -> (ALU operation, identity for floats, for signed ints, for unsigned ints)
WIN_OPS = {"add": "add", "multiply": "mul", "maximum": "max", "minimum": "min"}


def _identity(op: str, d: dt.DType) -> float | int:
    """What a skipped window position holds: the element the operation leaves unchanged."""
    if op == "add" or op == "or" or op == "xor":
        return 0
    if op == "mul":
        return 1
    if op == "and":
        return -1 if d.is_signed else (1 << (8 * d.itemsize)) - 1
    low = op == "max"
    if d.is_float:
        return float("-inf") if low else float("inf")
    if d.name == "u8":  # predicates: false/true
        return 0 if low else 1
    bits = 8 * d.itemsize
    if d.is_signed:
        return -(1 << (bits - 1)) if low else (1 << (bits - 1)) - 1
    return 0 if low else (1 << bits) - 1


def _single_op(body: Computation) -> str | None:
    """The ALU operation of a body that is one commutative operator of its two parameters."""
    root = body.root
    if len(body.params) != 2 or len(root.operands) != 2 or \
            {o.id for o in root.operands} != {p.id for p in body.params}:
        return None
    if root.op in WIN_OPS:
        return WIN_OPS[root.op]
    if root.op in ("and", "or"):
        if root.dtype.is_pred:
            return "min" if root.op == "and" else "max"
        return root.op
    if root.op == "xor" and not root.dtype.is_pred:
        return "xor"
    return None


def _acc_type(d: dt.DType, op: str) -> dt.DType:
    """Where a window reduction accumulates: fp32 for floats, exact 32-bit integers on GpSimd."""
    if d.is_float:
        return dt.F32
    if d.name == "u8" and op in ("min", "max"):
        return dt.U8
    if op in ("and", "or", "xor"):
        return d
    return dt.S32 if d.is_signed or d.name == "u8" else dt.U32


def _window_plan(lw: Lowering, X: Ref, window: tuple[WindowDim, ...], out_shape: tuple[int, ...],
                 itemsize: int, trivial_part: bool = False) -> WindowPlan:
    dims = X.ap.dims
    inner = next((k for k in range(len(dims) - 1, -1, -1) if dims[k][0] > 1 and dims[k][1] == 1), None)
    return window_plan(tuple(X.shape), window, out_shape, itemsize, inner, lw.target, trivial_part)


def _init_operand(lw: Lowering, init: Node, shape: tuple[int, ...], dtype: dt.DType) -> Operand:
    """The init value as an immediate, or as a tile broadcast from HBM."""
    v = lw.scalar(init)
    if v is not None:
        return v
    g = lw.graph
    t = g.tile((shape[0], 1), onchip_dtype(init.dtype), "sbuf", "wininit").ref()
    src = lw.ref(init)
    g.add("dma", "dma", t, src.reshape(1, 1).broadcast(0, shape[0]))
    full = g.tile(shape, dtype, "sbuf", "wininitf").ref()
    view = t.reshape(shape[0], *([1] * (len(shape) - 1)))
    for k in range(1, len(shape)):
        if shape[k] > 1:
            view = view.broadcast(k, shape[k])
    Tiles(g, shape).copy_into(full, view)
    return full


def _memset_value(lw: Lowering, shape: tuple[int, ...], value: Operand, dtype: dt.DType, name: str) -> Ref:
    t = lw.graph.tile(shape, dtype, "sbuf", name).ref()
    if isinstance(value, Ref):
        Tiles(lw.graph, shape).copy_into(t, value)
    else:
        lw.graph.add("pool" if dtype.is_int else "dve", "memset", t, value=value)
    return t


@plans
def plan_window_pads(lw: Lowering, order: list[Node]) -> None:
    """Claim a pad that only a pooling reads (Keras's ZeroPadding2D before MaxPooling2D in ResNet-50): the
    pooling loads the unpadded input and fills its tiles' edges with the pad's value, where the pad would
    copy the whole activation from HBM to HBM first (47 us on ResNet-50's critical path). The value must be
    the reduction's identity, or the reduction idempotent (max, min: an edge position that meets only
    padding adds the value once); the pooling's own window may not pad or dilate."""
    for n in order:
        if n.op != "reduce-window" or len(n.operands) != 2 or n.operands[0].op != "pad":
            continue
        x = n.operands[0]
        op = _single_op(n.attrs["to_apply"])
        v = lw.scalar(x.operands[1])
        pads = x.attrs["padding"]
        window = n.attrs["window"]
        if (op is None or v is None or x.id in lw.output_of or x.id in lw.absorbed
                or lw.consumers.get(x.id) != {n.id} or len(pads) != len(window)
                or any(p.interior or p.lo < 0 or p.hi < 0 for p in pads)
                or any(w.pad_lo or w.pad_hi or w.lhs_dilation != 1 or w.rhs_dilation != 1 for w in window)):
            continue
        x_t = onchip_dtype(device_dtype(x.dtype))
        if float(v) != float(_identity(op, x_t)) and op not in ("max", "min"):
            continue
        lw.absorbed.add(x.id)
        lw.plan.setdefault(n.id, {})["pad"] = (x, v)


@lowers("reduce-window")
def reduce_window(lw: Lowering, node: Node) -> None:
    """Pooling and its relatives on VectorE (GpSimd for exact 32-bit integers), window position by
    window position over strided views of one input tile per block (:class:`WindowPlan`): a body that
    is one commutative operator (add, multiply, maximum, minimum, and, or, xor) accumulates in fp32
    (exact integers) with skipped positions holding its identity, then meets the init value once; any
    other body (variadic argmax, ...) is evaluated elementwise on tiles (``backend/elementwise.py``'s
    emitters), one window position after another from the init values, a position that meets padding
    or a hole leaving the accumulators as they were."""
    n = len(node.operands) // 2
    xs, inits = node.operands[:n], node.operands[n:]
    body: Computation = node.attrs["to_apply"]
    window = tuple(node.attrs["window"])
    fill = None
    padded = lw.plan.get(node.id, {}).get("pad")  # a pad claimed by plan_window_pads: read through
    if padded is not None:
        pad, fill = padded
        xs = [pad.operands[0]]
        window = tuple(replace(w, pad_lo=p.lo, pad_hi=p.hi) for w, p in zip(window, pad.attrs["padding"]))
    X = [lw.ref(x) for x in xs]
    leaves = list(node.type.leaves())
    out_shape = tuple(leaves[0].shape)
    op = _single_op(body) if n == 1 else None
    if len(leaves) == 1 and not isinstance(node.type, TupleType):
        # a max pooling that only a cast to bf16 reads (ResNet's, before its first convolutions) writes the
        # cast's value itself, rounding its fp32 maxima once as the cast would: the cast's own pass went
        # through HBM twice (its tiles laid out otherwise than the pooling's and the convolution's)
        from nxsat.backend.fused import narrowing_reader

        cast = narrowing_reader(lw, node) if op is not None and node.dtype.is_float else None
        written = cast if cast is not None and _fused_source(lw, cast) else node
        Ys = [lw.result(written)]
    else:
        Ys = [lw.graph.buf(f"{node.name}_{k}", "scratch", device_dtype(t.dtype, node), t.shape).ref()
              for k, t in enumerate(leaves)]
        lw.set(node, tuple(Ys))
    if not out_shape and not xs[0].shape:
        window = ()
    x_t = [onchip_dtype(x.dtype) for x in X]
    plan = _window_plan(lw, X[0], window, out_shape, max(d.itemsize for d in x_t))
    in_shape = tuple(X[0].shape)
    Xv = [x.reshape(1) if not in_shape else x for x in X]
    Yv = [y.reshape(1) if not out_shape else y for y in Ys]
    shape0 = in_shape or (1,)
    win = window or (WindowDim(),)
    outs0 = out_shape or (1,)
    blocks = list(_win_blocks(shape0, win, outs0, plan))
    if op is None:
        for blk in blocks:
            _rw_general(lw, node, blk, Xv, Yv, x_t, body, inits, shape0)
        return
    for pack in _packs(blocks, lw.target.partitions):
        _rw_single(lw, node, pack, Xv[0], Yv[0], x_t[0], op, inits[0], shape0, fill, win)


def _packs(blocks: list[WinBlock], partitions: int) -> list[list[WinBlock]]:
    """Consecutive blocks stacked on the partitions where each fills at most half of them: blocks with the
    same taps and tile shapes share every instruction's view, so a pack of them takes one instruction per
    window position where each took one (ResNet-50's max pooling: 64 channels per block, 2.8 us a step
    on VectorE)."""
    out: list[list[WinBlock]] = []
    for blk in blocks:
        last = out[-1] if out else None
        if last is not None and blk.part is not None and not blk.empty and blk.P % 32 == 0 \
                and (len(last) + 1) * blk.P <= partitions and _same_windows(last[0], blk):
            last.append(blk)
        else:
            out.append([blk])
    return out


def _same_windows(a: WinBlock, b: WinBlock) -> bool:
    """Do two blocks read their tiles through the same views (the same active taps, boxes of the same
    extents and steps, the same partition and free shapes)?"""
    return (a.part == b.part and a.classes == b.classes and a.taps == b.taps
            and [rn for _, rn in a.ranges] == [rn for _, rn in b.ranges]
            and [(bx.extent, bx.step) if bx else None for bx in a.boxes]
            == [(bx.extent, bx.step) if bx else None for bx in b.boxes])


SPLIT_TAPS = 6  # a max or min pooling window of this many taps is reduced in two chains on two engines


def _rw_single(lw: Lowering, node: Node, pack: list[WinBlock], X: Ref, Y: Ref, x_t: dt.DType, op: str,
               init: Node, shape: tuple[int, ...], fill: float | int | None = None,
               window: tuple[WindowDim, ...] = ()) -> None:
    """A block of a one-operator pooling, or a pack of blocks stacked on the partitions (:func:`_packs`);
    ``fill``: the value of the window's padding where it is not the operator's identity (an absorbed pad,
    :func:`plan_window_pads`: max or min, so meeting it once is enough, and a tap that meets only padding
    anywhere in the block is skipped, so it is met once more)."""
    g = lw.graph
    blk = pack[0]
    out_t = onchip_dtype(Y.dtype)
    acc_t = _acc_type(x_t, op)
    ashape = blk.acc_shape(len(pack))
    t = Tiles(g, ashape, "rw")
    init_v = _init_operand(lw, init, ashape, acc_t)
    if fill is not None and float(fill) == float(_identity(op, x_t)):
        fill = None
    if blk.empty:
        res = _memset_value(lw, ashape, init_v, out_t if fill is None else acc_t, "rwres")
        if fill is not None:
            res = t.binary(op, res, fill, out_t)
        g.add("dma", "dma", blk.out_view(Y), res)
        return
    tile = g.tile(blk.tile_shape(len(pack)), x_t, "sbuf", "winin").ref()
    for k, b in enumerate(pack):
        _win_load(lw, X, b, x_t, _identity(op, x_t) if fill is None else fill, tile, k * blk.P)
    combos = blk.combos()
    acc = t.tile(acc_t)
    # the init is the identity (XLA's -inf for a max pooling): nothing to combine, and the last step writes
    # the result's type (a narrower float rounded once, as a cast of the fp32 result would be)
    direct = is_num(init_v) and float(init_v) == float(_identity(op, acc_t)) and op in ("max", "min")
    res = (acc if acc_t is out_t else t.tile(out_t)) if direct else acc
    filled = fill is not None and any(len(tp) < w.size for tp, w in zip(blk.taps, window))
    last = acc if filled else res  # what the window's last step writes
    sep = blk.separable() if op in ("max", "min") else None
    if len(combos) == 1:
        t.copy_into(last, blk.view(tile, combos[0]))
    elif sep is not None:
        _rw_separable(t, blk, tile, op, acc_t, acc, last, *sep)
    elif op in ("max", "min") and acc_t.is_float and len(combos) >= SPLIT_TAPS:
        # the window's taps in two chains, on VectorE and on GpSimd (idle in a pooling), then one step: the
        # same maximum in any order (ResNet's 3x3 max pooling: 8 dependent VectorE steps, 4.1 us of
        # resnet_small's critical path)
        half = (len(combos) + 1) // 2
        other = t.tile(acc_t)
        for dst, cs, eng in ((acc, combos[:half], "dve"), (other, combos[half:], "pool")):
            g.add(eng, "tensor_tensor", dst, blk.view(tile, cs[0]), blk.view(tile, cs[1]), op=op)
            for c in cs[2:]:
                g.add(eng, "tensor_tensor", dst, dst, blk.view(tile, c), op=op)
        t.binary_into(last, op, acc, other)
    else:
        _chain(t, op, [blk.view(tile, c) for c in combos], acc, last)
    if filled:
        t.binary_into(res, op, acc, fill)
    if not direct:
        res = t.tile(out_t)
        t.binary_into(res, op, acc, init_v)
    for k, b in enumerate(pack):
        g.add("dma", "dma", b.out_view(Y), res[k * b.P:(k + 1) * b.P])


def _rw_separable(t: Tiles, blk: WinBlock, tile: Ref, op: str, acc_t: dt.DType, acc: Ref, last: Ref,
                  first: int, second: int) -> None:
    """A max or min window in two passes (:meth:`WinBlock.separable`): dimension ``first``'s taps over every
    element of ``second``'s box, then ``second``'s taps over that; the same extremum in any order. A 3x3
    max pooling at stride 2 (ResNet's, after its stem) is 2 steps over 33 rows of 16 and 2 over 16 x 16,
    where one step per tap was 8 over 16 x 16 (VectorE's tensor_tensor takes 2 cycles an element, and
    GpSimd, which took half of them, shares its SBUF port: the pooling's span of resnet_small's critical
    path 3.5 -> 3.1 us)."""
    fixed = tuple(tp[0] for tp in blk.taps)
    rows = [blk.view(tile, fixed[:first] + (tp,) + fixed[first + 1:], whole=second) for tp in blk.taps[first]]
    half = t.tile(acc_t, rows[0].shape)
    _chain(t, op, rows, half, half)
    axis = 1 + (blk.part is not None) + sum(1 for k in range(second) if k != blk.part)  # ``second``'s in ``half``
    key = [slice(0, n) for n in half.shape]
    cols = []
    for tp in blk.taps[second]:
        key[axis] = blk.tap_slice(second, tp)
        cols.append(half[tuple(key)])
    _chain(t, op, cols, acc, last)


def _chain(t: Tiles, op: str, views: list[Ref], acc: Ref, last: Ref) -> None:
    """``op`` over ``views`` (two or more), one step after another into ``acc``, the last step into ``last``."""
    t.binary_into(last if len(views) == 2 else acc, op, views[0], views[1])
    for k, v in enumerate(views[2:], start=3):
        t.binary_into(last if k == len(views) else acc, op, acc, v)


def _eval_body(lw: Lowering, body: Computation, args: list[Operand], shape: tuple[int, ...]) -> list[Operand]:
    """A scalar computation evaluated elementwise on tiles of ``shape`` (the elementwise emitters)."""
    from nxsat.backend.elementwise import EMITTERS, Kernel, emit

    k = Kernel(lw, Tiles(lw.graph, shape, "body"))
    val: dict[int, object] = {}
    for p, a in zip(body.params, args):
        val[p.id] = a
    for nd in body.post_order():
        if nd.id in val:
            continue
        ops = [val[o.id] for o in nd.operands]
        if nd.op == "constant":
            v = lw.scalar(nd)
            if v is None:
                raise error("NCC_EUOC002", f"{body.name}: constant {nd.name} is not a scalar", nd.loc)
            val[nd.id] = v
        elif nd.op == "tuple":
            val[nd.id] = tuple(ops)
        elif nd.op == "get-tuple-element":
            val[nd.id] = ops[0][nd.attrs["index"]]  # type: ignore[index]
        elif nd.op in ("broadcast", "reshape", "copy", "bitcast") and len(ops) == 1 and nd.shape == ():
            val[nd.id] = ops[0]
        elif nd.op in EMITTERS:
            val[nd.id] = emit(k, nd, ops)  # type: ignore[arg-type]
        else:
            raise error("NCC_EUOC002", f"{body.name}: operator {nd.op} ({nd.name}) cannot run in a window body: "
                        "bodies run elementwise on VectorE/GpSimd, and the backend has no elementwise form of it",
                        nd.loc, "see docs/backend.md, 'Convolution and windows'")
    root = val[body.root.id]
    return list(root) if isinstance(root, tuple) else [root]  # type: ignore[arg-type]


def _as_tile(lw: Lowering, v: Operand, shape: tuple[int, ...], dtype: dt.DType, name: str) -> Ref:
    if isinstance(v, Ref):
        return v
    return _memset_value(lw, shape, v, dtype, name)


def _valid_mask(lw: Lowering, blk: WinBlock, shape: tuple[int, ...], combo: tuple[Tap, ...]) -> Ref | None:
    """A 0/1 tile of the block's outputs where the tap combination meets input (None: everywhere)."""
    if not blk.invalid(shape, combo):
        return None
    g = lw.graph
    ashape = blk.acc_shape()
    m = g.tile(ashape, dt.U8, "sbuf", "winvalid").ref()
    g.add("dve", "memset", m, value=0)
    region = blk.valid_region(shape, combo)
    if region is not None:
        dst = m[region]
        one = lw.const(np.ones(1, dtype=np.uint8), dt.U8, "one").reshape(*([1] * len(dst.shape)))
        for k, s in enumerate(dst.shape):
            if s > 1:
                one = one.broadcast(k, s)
        g.add("dma", "dma", dst, one)
    return m


def _rw_general(lw: Lowering, node: Node, blk: WinBlock, X: list[Ref], Y: list[Ref], x_t: list[dt.DType],
                body: Computation, inits: list[Node], shape: tuple[int, ...]) -> None:
    g = lw.graph
    n = len(X)
    ashape = blk.acc_shape()
    acc_t = [onchip_dtype(device_dtype(p.type.dtype)) for p in body.params[:n]]
    out_t = [onchip_dtype(y.dtype) for y in Y]
    accs: list[Operand] = [_init_operand(lw, i, ashape, d) for i, d in zip(inits, acc_t)]
    if not blk.empty:
        tiles = [_win_load(lw, x, blk, d, 0) for x, d in zip(X, x_t)]
        t = Tiles(g, ashape, "rw")
        for combo in blk.combos():
            xs = [blk.view(tl, combo) for tl in tiles]
            new = _eval_body(lw, body, [*accs, *xs], ashape)
            mask = _valid_mask(lw, blk, shape, combo)
            if mask is not None:
                new = [t.select(mask, nv, a, d) for nv, a, d in zip(new, accs, acc_t)]
            accs = new
    for a, y, d in zip(accs, Y, out_t):
        res = _as_tile(lw, a, ashape, d, "rwres")
        if res.dtype is not d:
            res = Tiles(g, ashape).copy(res, d)
        g.add("dma", "dma", blk.out_view(y), res)


def _win_store(lw: Lowering, Y: Ref, blk: WinBlock, tile: Ref) -> None:
    """The part of an input-shaped tile that lies inside ``Y`` (a tile without a tap axis of more than
    one: the partition dimension, if any, is one the window leaves alone), stored back."""
    shape = Y.shape
    dkey: list = []
    skey: list = [None] * len(shape)
    if blk.part is not None:
        ja, jn = blk.ranges[blk.part]
        dkey += [slice(0, jn), slice(0, 1)]
        skey[blk.part] = slice(ja, ja + jn)
    else:
        dkey.append(slice(0, 1))
    if _free_keys(blk, shape, dkey, skey) is None:
        return
    lw.graph.add("dma", "dma", _part_first(Y[tuple(skey)] if skey else Y, blk), tile[tuple(dkey)])


def _free_keys(blk: WinBlock, shape: tuple[int, ...], dkey: list, skey: list) -> bool | None:
    """Extend the tile's key ``dkey`` and the tensor's key ``skey`` by the block's free dimensions, each
    clipped to the tensor: None when a dimension has nothing inside it, else whether all was inside."""
    inside = True
    for k, bx in enumerate(blk.boxes):
        if k == blk.part:
            continue
        assert bx is not None
        lo, hi = _valid(bx, shape[k])
        if lo >= hi:
            return None
        inside = inside and lo == 0 and hi == bx.extent
        dkey.append(slice(lo, hi))
        a = bx.lo + lo * bx.step
        skey[k] = slice(a, a + (hi - lo - 1) * bx.step + 1, bx.step)
    return inside


def _part_first(r: Ref, blk: WinBlock) -> Ref:
    """``r`` with the block's partition dimension first."""
    if blk.part is None or blk.part == 0:
        return r
    return r.permute(blk.part, *(k for k in range(len(r.shape)) if k != blk.part))


@lowers("select-and-scatter")
def select_and_scatter(lw: Lowering, node: Node) -> None:
    """Max-pool gradients: per block of windows (a dimension the window leaves alone on the partitions,
    :class:`WindowPlan`), the ``select`` body picks one element per window, window position by window
    position in row-major order (a later element replaces the pick when ``select(pick, element)`` is
    false; padding and holes are never picked), keeping the pick's window position; then, window
    positions in reverse row-major order (so that every target sees its sources in row-major order,
    as XLA applies them), ``scatter(target, source)`` replaces each target its window picked, on a
    strided view of an input-shaped tile that starts at the init value. Blocks whose targets overlap
    (windows that cross a block's edge) meet through HBM: the output starts as the init value there and
    each block adds its share in turn."""
    operand, source, init = node.operands
    window = tuple(node.attrs["window"])
    select: Computation = node.attrs["select"]
    scatter: Computation = node.attrs["scatter"]
    X, S = lw.ref(operand), lw.ref(source)
    Y = lw.result(node)
    g = lw.graph
    x_t, s_t, o_t = onchip_dtype(X.dtype), onchip_dtype(S.dtype), onchip_dtype(Y.dtype)
    shape, out_shape = tuple(X.shape), tuple(S.shape)
    if not shape:  # a scalar: its one window picks it
        X, S, Y = X.reshape(1), S.reshape(1), Y.reshape(1)
        shape, out_shape, window = (1,), (1,), (WindowDim(),)
    plan = _window_plan(lw, X, window, out_shape, max(x_t.itemsize, o_t.itemsize), trivial_part=True)
    blocks = list(_win_blocks(shape, window, out_shape, plan))
    whole = len(blocks) == 1 and all(
        (k == blk.part and blk.ranges[k][1] == shape[k]) or
        (bx is not None and bx.step == 1 and bx.lo <= 0 and bx.lo + bx.extent >= shape[k])
        for blk in blocks for k, bx in enumerate(blk.boxes))
    init_v = lw.scalar(init)
    if not whole:
        # the output starts as the init value everywhere; each block then updates its targets
        fill = lw.ref(init).reshape(*([1] * len(shape)))
        for k, n in enumerate(shape):
            if n > 1:
                fill = fill.broadcast(k, n)
        g.add("dma", "dma", Y, fill)
    for blk in blocks:
        if blk.empty:
            if whole:
                _win_store(lw, Y, blk, _memset_value(lw, blk.tile_shape(), init_v if init_v is not None else 0,
                                                      o_t, "sasout"))
            continue
        ashape = blk.acc_shape()
        t = Tiles(g, ashape, "sas")
        xt = _win_load(lw, X, blk, x_t, 0)
        st = g.tile(ashape, s_t, "sbuf", "sassrc").ref()
        g.add("dma", "dma", st, blk.out_view(S))
        if whole:
            if init_v is not None:
                ot = _memset_value(lw, blk.tile_shape(), init_v, o_t, "sasout")
            else:
                ot = g.tile(blk.tile_shape(), o_t, "sbuf", "sasout").ref()
                fill = lw.ref(init).reshape(*([1] * len(ot.shape)))
                for k, n in enumerate(ot.shape):
                    if n > 1:
                        fill = fill.broadcast(k, n)
                g.add("dma", "dma", ot, fill)
        else:
            ot = _win_load(lw, Y, blk, o_t, init_v if init_v is not None else 0)
        combos = blk.combos()
        # select: the pick's value, its window position, whether the window has met an element yet
        chosen = t.copy(blk.view(xt, combos[0]), x_t)
        idx = t.memset(0.0, dt.F32)
        seen = _valid_mask(lw, blk, shape, combos[0])
        for k, c in enumerate(combos[1:], 1):
            xc = blk.view(xt, c)
            keep = _eval_body(lw, select, [chosen, xc], ashape)[0]
            if not isinstance(keep, Ref):
                keep = t.memset(int(bool(keep)), dt.U8)
            both = keep if seen is None else t.binary("mul", seen, keep, dt.U8)
            take = t.binary("eq", both, 0, dt.U8)
            valid = _valid_mask(lw, blk, shape, c)
            if valid is not None:
                take = t.binary("mul", take, valid, dt.U8)
                if seen is not None:
                    seen = t.binary("max", seen, valid, dt.U8)
            elif seen is not None:
                seen = None
            chosen = t.select(take, xc, chosen, x_t)
            idx = t.select(take, float(k), idx, dt.F32)
        # scatter, window positions in reverse row-major order
        for k in range(len(combos) - 1, -1, -1):
            target = blk.view(ot, combos[k])
            hit = t.binary("eq", idx, float(k), dt.U8)
            if seen is not None:
                hit = t.binary("mul", hit, seen, dt.U8)
            new = _eval_body(lw, scatter, [target, st], ashape)[0]
            new = _as_tile(lw, new, ashape, o_t, "sasnew")
            g.add("pool" if o_t.name in ("s32", "u32") and new.dtype.name in ("s32", "u32") else "dve", "select",
                  target, hit, new, target)
        _win_store(lw, Y, blk, ot)


# --- weight gradients: one dot per output position -------------------------------------------------

def weight_gradients(module: Module) -> Module:
    """Rewrite every convolution with more window taps than output positions (a weight gradient: its
    window is a whole image, its output a kernel) as one contraction per output position.

    The implicit GEMM contracts over input channels (there the training batch) one tap at a time:
    96x112x112 taps make millions of matmuls with 96 rows each. Here each output position is a dot
    over channels *and* taps (the batch and the image, K = 1.2M for mobilenet_v2's first layer, on
    partitions 128 at a time), or, when a batch group has one channel in and out (the depthwise
    layers' gradients), a multiply and a sum over the same elements on VectorE. Both read the
    operands through slices (views, no copies); padding only narrows the slice.

    Contract: the module computes the same values (the sums in another order, in fp32 as the
    convolution accumulates)."""
    return rewrite_module(module, _weight_gradient)


def is_weight_gradient(node: Node) -> bool:
    """More taps than outputs, no input dilation, no feature groups: the form :func:`weight_gradients` takes."""
    if node.op != "convolution":
        return False
    window: tuple[WindowDim, ...] = tuple(node.attrs["window"])
    d: ConvDims = node.attrs["dims"]
    out = [node.shape[i] for i in d.output_spatial]
    return (bool(window) and all(w.lhs_dilation == 1 for w in window)
            and int(node.attrs.get("feature_group_count", 1) or 1) == 1
            and math.prod(w.size for w in window) > math.prod(out))


def plane_weight_gradient(node: Node) -> bool:
    """A depthwise layer's weight gradient that the backend lowers on the vector engines
    (:func:`_plane_weight_gradient`) rather than as :func:`weight_gradients` rewrites it: batch groups of
    one element, one output feature per group, float types, no window reversal, both operands' rows
    contiguous (their last dimension is the last spatial one) and a kernel row that fits a tile."""
    if not is_weight_gradient(node):
        return False
    G = int(node.attrs.get("batch_group_count", 1) or 1)
    d: ConvDims = node.attrs["dims"]
    window: tuple[WindowDim, ...] = tuple(node.attrs["window"])
    x, k = node.operands
    return (G > 1 and x.shape[d.input_batch] == G and k.shape[d.kernel_output_feature] == G
            and node.shape[d.output_feature] == G and node.dtype.is_float and x.dtype.is_float and k.dtype.is_float
            and not any(w.reversal for w in window)
            and d.input_spatial[-1] == len(x.shape) - 1 and d.kernel_spatial[-1] == len(k.shape) - 1
            and depthwise_gradient_fits(tuple(x.shape[i] for i in d.input_spatial),
                                        tuple(k.shape[i] for i in d.kernel_spatial), window))


def _plane_weight_gradient(lw: Lowering, node: Node) -> None:
    """``Y[0, g, q] = sum over f, t of X[g, f, q * stride + t * dilation - pad] * K[g, f, t]``: a depthwise
    layer's weight gradient (``g`` its channels, ``f`` the training batch), tiled by
    :func:`~nxsat.extract.plan.depthwise_gradient_tiling`. Per tile and output position, one product of
    the input's shifted window with the kernel rows (VectorE and GpSimd by tile) and one ScalarE pass
    summing it along the free axes into that position's column; the tiles of a channel chunk add up on
    VectorE, and where several batch groups share the partitions one selection matmul (a 0/1 matrix
    from ``iota``) sums them on TensorE, exactly in fp32. Replaces a multiply and a reduce of the whole
    image per output position, which wrote every product to HBM (mobilenet_v2: 60 thousand instructions
    for its first depthwise layer's gradient)."""
    g = lw.graph
    d: ConvDims = node.attrs["dims"]
    window: tuple[WindowDim, ...] = tuple(node.attrs["window"])
    lhs, rhs = node.operands
    # channels first, then the batch: [G, F, S...] and [G, F, K...]
    X = lw.ref(lhs).permute(d.input_batch, d.input_feature, *d.input_spatial)
    K = lw.ref(rhs).permute(d.kernel_output_feature, d.kernel_input_feature, *d.kernel_spatial)
    Y = lw.result(node).permute(d.output_batch, d.output_feature, *d.output_spatial)  # [1, G, Q...]
    G, F = X.shape[0], X.shape[1]
    S, KS, Q = X.shape[2:], K.shape[2:], Y.shape[2:]
    positions = list(product(*(range(n) for n in Q)))
    T = len(positions)
    tl = depthwise_gradient_tiling(F, G, S, KS, window, lw.target.partitions)
    assert tl is not None
    out_t = onchip_dtype(device_dtype(node.dtype))
    Xc, Kc = X.permute(1, 0, *range(2, len(S) + 2)), K.permute(1, 0, *range(2, len(KS) + 2))  # batch first
    k = 0
    for c0, cn in tl.chunks(G):
        stacks = _stacks(tl, c0, cn, F)
        J = stacks[0].jn
        acc: Ref | None = None
        for planes in stacks:
            engine = ADD_ENGINES[k % 2]
            k += 1
            for t0 in range(0, KS[0], tl.block):
                part = _gradient_block(lw, Xc, Kc, window, planes, (t0, min(tl.block, KS[0] - t0)), positions,
                                       engine)
                if acc is None:
                    acc = part
                else:
                    view = acc[:planes.partitions]
                    g.add(engine, "tensor_tensor", view, view, part, op="add")
        assert acc is not None
        res = g.tile((cn, T), out_t, "sbuf", "dwgres").ref()
        if J == 1:
            g.add("act", "activation", res, acc)
        else:
            ps = g.tile((cn, T), dt.F32, "psum", "dwgps").ref()
            g.add("pe", "matmul", ps, _selection(lw, J, cn), acc, start=True, stop=True)
            g.add("act", "activation", res, ps)
        g.add("dma", "dma", Y[0, c0:c0 + cn], res.reshape(cn, *Q))


def _gradient_block(lw: Lowering, Xc: Ref, Kc: Ref, window: tuple[WindowDim, ...], planes: _Planes,
                    rows: tuple[int, int], positions: list[tuple[int, ...]], engine: str) -> Ref:
    """``[partitions, T]`` fp32: per partition and output position, the sum over its planes and the kernel
    rows ``rows`` (all of the inner dimensions) of the kernel times the input window it meets."""
    g = lw.graph
    t0, tn = rows
    S, KS = Xc.shape[2:], Kc.shape[2:]
    kfirst, kcount = (t0, *(0 for _ in KS[1:])), (tn, *KS[1:])
    spans = []  # per position, per dimension: (first t, last t + 1, input index of the first)
    for q in positions:
        box: list | None = []
        for dd, (w, qi) in enumerate(zip(window, q)):
            base = qi * w.stride - w.pad_lo
            ta, tb = valid_range(base, w.rhs_dilation, S[dd], kfirst[dd], kfirst[dd] + kcount[dd])
            if ta >= tb:
                box = None
                break
            box.append((ta, tb, base + ta * w.rhs_dilation))
        spans.append(box)
    P, m = planes.partitions, planes.m
    part = g.tile((P, len(positions)), dt.F32, "sbuf", "dwgpart").ref()
    if any(b is None for b in spans):
        g.add(engine, "memset", part, value=0.0)  # positions this block never reaches sum to zero
    live = [b for b in spans if b is not None]
    if not live:
        return part
    lo = [min(b[dd][2] for b in live) for dd in range(len(S))]
    hi = [max(b[dd][2] + (b[dd][1] - b[dd][0] - 1) * w.rhs_dilation + 1 for b in live)
          for dd, w in enumerate(window)]
    xt = g.tile((P, m, *(h - a for a, h in zip(lo, hi))), onchip_dtype(Xc.dtype), "sbuf", "dwgx").ref()
    planes.load(lw, xt, Xc, tuple(slice(a, h) for a, h in zip(lo, hi)))
    kt = g.tile((P, m, *kcount), onchip_dtype(Kc.dtype), "sbuf", "dwgk").ref()
    planes.load(lw, kt, Kc, (slice(t0, t0 + tn),))
    prods = _Pair(lw, (P, m, *kcount), "dwgprod")
    for j, box in enumerate(spans):
        if box is None:
            continue
        xv = xt[(slice(None), slice(None),
                 *(slice(i - lo[dd], i - lo[dd] + (tb - ta - 1) * w.rhs_dilation + 1, w.rhs_dilation)
                   for dd, ((ta, tb, i), w) in enumerate(zip(box, window))))]
        kv = kt[(slice(None), slice(None), *(slice(ta - kfirst[dd], tb - kfirst[dd])
                                             for dd, (ta, tb, _) in enumerate(box)))]
        prod_t = prods.next()[(slice(None), slice(None), *(slice(0, tb - ta) for ta, tb, _ in box))]
        g.add(engine, "tensor_tensor", prod_t, xv, kv, op="mul")
        g.add("act", "activation", prod_t, prod_t, accum=part[:, j:j + 1])
    return part


def _selection(lw: Lowering, J: int, cn: int) -> Ref:
    """``[J * cn, cn]`` fp32, 1 where partition ``p`` holds channel ``c`` (``p mod cn == c``): from one
    ``iota`` of ``p - c``, an equality per group."""
    g = lw.graph
    u = g.tile((J * cn, cn), dt.F32, "sbuf", "dwgiota").ref()
    g.add("pool", "iota", u, base=0, channel_multiplier=1, steps=(-1,))
    sel = g.tile((J * cn, cn), dt.F32, "sbuf", "dwgsel").ref()
    g.add("dve", "tensor_scalar", sel, u, op0="eq", scalar0=0.0)
    for j in range(1, J):
        hit = g.tile((J * cn, cn), dt.F32, "sbuf", "dwghit").ref()
        g.add("dve", "tensor_scalar", hit, u, op0="eq", scalar0=float(j * cn))
        g.add("dve", "tensor_tensor", sel, sel, hit, op="add")
    return sel


def _weight_gradient(rw: Rewriter, node: Node, ops: list[Node], attrs: dict) -> Node | None:
    if not is_weight_gradient(node) or plane_weight_gradient(node):
        return None
    d: ConvDims = attrs["dims"]
    window: tuple[WindowDim, ...] = tuple(attrs["window"])
    G = int(attrs.get("batch_group_count", 1) or 1)
    loc = node.loc
    out_t = node.dtype

    def op(name: str, operands: list[Node], **kw: object) -> Node:
        return Node(name, operands, kw, infer_type(name, operands, kw, loc), "", loc)

    # A cast of an operand to a narrower float (the precision policy's, under --auto-cast) moves to the
    # dots, each reading its slice of the wide source and converting its loaded tiles (the cast absorbed):
    # cast whole, the operand went through HBM in the narrow type, and was widened back to the result's
    # type there before the dots read it (fp32 products of rounded values, two passes more).
    def narrow(n: Node, t: dt.DType | None) -> Node:
        return op("convert", [n], dtype=t) if t is not None and t != n.dtype else n

    def zeros(t: dt.DType) -> Node:
        return op("constant", [], value=np.zeros((), t.np), type=TensorType(t, ()))

    (xs0, tx), (ws0, tw) = (_narrowing(o) for o in ops[:2])
    X = op("transpose", [xs0], dimensions=(d.input_batch, d.input_feature, *d.input_spatial))  # [N', C, S]
    W = op("transpose", [ws0], dimensions=(d.kernel_output_feature, d.kernel_input_feature, *d.kernel_spatial))
    n_, c = X.shape[0], X.shape[1]
    o = W.shape[0]
    b, og = n_ // G, o // G
    Xo, Wo = xs0, ws0  # in their own dimension order (stacked)
    if (tx or X.dtype) != (tw or W.dtype) or (G > 1 and b == og == 1):
        # mixed types, or products summed on VectorE: in the result's type (the casts first, as written)
        X, W = narrow(narrow(X, tx), out_t), narrow(narrow(W, tw), out_t)
        Xo, Wo = narrow(narrow(Xo, tx), out_t), narrow(narrow(Wo, tw), out_t)
        tx = tw = None
    spatial = X.shape[2:]
    out_sp = tuple(node.shape[i] for i in d.output_spatial)
    nsp = len(window)
    add = _add_body(out_t)
    zero = zeros(out_t)
    taps = tuple(range(2, 2 + nsp))  # the spatial dimensions of X and W (and of their slices)

    def position(q: tuple[int, ...]) -> Node:
        """The [b, O] result at output position ``q``."""
        xs, ws, rev = [], [], []
        for k, (w, qi, s) in enumerate(zip(window, q, spatial)):
            base = qi * w.stride - w.pad_lo
            t0, t1 = valid_range(base, w.rhs_dilation, s, 0, w.size)
            if t1 <= t0:
                return op("broadcast", [zero], shape=(b, o), dimensions=())
            start = base + t0 * w.rhs_dilation
            xs.append(SliceDim(start, start + (t1 - t0 - 1) * w.rhs_dilation + 1, w.rhs_dilation))
            ws.append(SliceDim(w.size - t1, w.size - t0) if w.reversal else SliceDim(t0, t1))
            if w.reversal:
                rev.append(2 + k)
        xq = op("slice", [X], slice=(SliceDim(0, n_), SliceDim(0, c), *xs))
        wq = op("slice", [W], slice=(SliceDim(0, o), SliceDim(0, c), *ws))
        if rev:
            wq = op("reverse", [wq], dimensions=tuple(rev))
        if G == 1:  # the operand with fewer rows stationary: fewer matmuls for the same transposes
            xq, wq = narrow(xq, tx), narrow(wq, tw)
            if n_ <= o:
                return op("dot", [xq, wq], dims=DotDims((1, *taps), (1, *taps)), dtype=out_t)
            r = op("dot", [wq, xq], dims=DotDims((1, *taps), (1, *taps)), dtype=out_t)
            return op("transpose", [r], dimensions=(1, 0))
        tq = xq.shape[2:]
        if b == 1 and og == 1:  # one channel per group: a product summed on VectorE
            prod = op("multiply", [xq, wq])
            total = op("reduce", [prod, zero], dimensions=(1, *taps), to_apply=add)
            return op("reshape", [total], shape=(1, G))
        xg = narrow(op("reshape", [xq], shape=(G, b, c, *tq)), tx)
        wg = narrow(op("reshape", [wq], shape=(G, og, c, *tq)), tw)
        taps3 = tuple(range(3, 3 + nsp))
        r = op("dot", [xg, wg], dims=DotDims((2, *taps3), (2, *taps3), (0,), (0,)), dtype=out_t)  # [G, b, og]
        return op("reshape", [op("transpose", [r], dimensions=(1, 0, 2))], shape=(b, o))

    def assemble(prefix: tuple[int, ...]) -> Node:
        """The [b, O, Q[k:]...] block of the result whose leading positions are ``prefix``."""
        k = len(prefix)
        if k == nsp:
            return position(prefix)
        parts = [assemble((*prefix, i)) for i in range(out_sp[k])]
        parts = [op("reshape", [p], shape=(b, o, 1, *out_sp[k + 1:])) for p in parts]
        return parts[0] if len(parts) == 1 else op("concatenate", parts, dimension=2)

    def stacked() -> Node:
        """All positions as one dot: the input padded once so that every position's window is whole,
        the windows concatenated along a new leading axis (an im2col of the kernel positions), one
        contraction against the unsliced gradient. Returns the [b, O, Q...] result.

        The windows hold the contraction in the operand's memory order, its batch outermost: an NHWC
        image's windows copy rows of ``kw * C`` elements. With the channels first they copied one element
        per descriptor (a ViT's 8x8 patches of a 2x32x32x3 image: 62.2 -> 39.7 us for its whole block)."""
        order = (d.input_batch, *sorted((d.input_feature, *d.input_spatial)))
        Xs = op("transpose", [Xo], dimensions=order)
        at = {i: k for k, i in enumerate(order)}  # an operand dimension's place in Xs
        pads = [PadDim(max(0, w.pad_lo), max(0, (n_out - 1) * w.stride - w.pad_lo + (w.size - 1) * w.rhs_dilation
                                              - (sz - 1)))
                for w, n_out, sz in zip(window, out_sp, spatial)]  # the first window starts at -pad_lo
        pad_cfg = [PadDim()] * len(order)
        for k, i in enumerate(d.input_spatial):
            pad_cfg[at[i]] = pads[k]
        Xp = Xs if not any(p.lo or p.hi for p in pads) else op(
            "pad", [Xs, zero if Xs.dtype == out_t else zeros(Xs.dtype)], padding=tuple(pad_cfg))
        windows = []
        for q in np.ndindex(*out_sp):
            key = [SliceDim(0, n) for n in Xs.shape]
            for k, (w, qi, p) in enumerate(zip(window, q, pads)):
                start = qi * w.stride - w.pad_lo + p.lo
                key[at[d.input_spatial[k]]] = SliceDim(start, start + (w.size - 1) * w.rhs_dilation + 1,
                                                       w.rhs_dilation)
            xq = op("slice", [Xp], slice=tuple(key))
            windows.append(op("reshape", [xq], shape=(1, *xq.shape)))
        xcat = op("concatenate", windows, dimension=0)  # [P, b, the contraction's dimensions in order]
        rev = tuple(i for k, i in enumerate(d.kernel_spatial) if window[k].reversal)
        wq = op("reverse", [Wo], dimensions=rev) if rev else Wo
        pair = {d.input_feature: d.kernel_input_feature, **dict(zip(d.input_spatial, d.kernel_spatial))}
        r = op("dot", [narrow(xcat, tx), narrow(wq, tw)],
               dims=DotDims(tuple(range(2, 1 + len(order))), tuple(pair[i] for i in order[1:])),
               dtype=out_t)  # [P, b, O]
        r = op("reshape", [r], shape=(*out_sp, b, o))
        return op("transpose", [r], dimensions=(nsp, nsp + 1, *range(nsp)))

    positions = math.prod(out_sp)
    if G == 1 and gradient_stacking_pays(positions, n_, o, c * math.prod(w.size for w in window),
                                         math.prod(X.shape)):
        canon = stacked()
    else:
        canon = assemble(())  # [b, O, Q...]
    perm = [0] * (2 + nsp)
    perm[d.output_batch], perm[d.output_feature] = 0, 1
    for j, i in enumerate(d.output_spatial):
        perm[i] = 2 + j
    out = op("transpose", [canon], dimensions=tuple(perm))
    assert out.type == node.type, (out.type, node.type)
    out.name = node.name
    return out


def _narrowing(n: Node) -> tuple[Node, dt.DType | None]:
    """``n``'s source and type when ``n`` casts a float to a narrower float, else ``(n, None)``."""
    if n.op == "convert" and n.dtype.is_float and n.operands[0].dtype.is_float \
            and n.dtype.itemsize < n.operands[0].dtype.itemsize:
        return n.operands[0], n.dtype
    return n, None


def _add_body(t: dt.DType) -> Computation:
    b = Builder("add")
    return b.build(b.op("add", [b.param(t, (), "a"), b.param(t, (), "b")]))

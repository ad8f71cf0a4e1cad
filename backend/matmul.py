"""Matrix products on TensorE: ``dot`` with any dimension numbers.

The operands are viewed as ``L[B, M, K]`` and ``R[B, K, N]`` (batch, free and contracting dimensions
each merged; contracting dimensions that do not merge as outer segments of ones that do, see
:func:`_split_contraction`; a view the access patterns cannot express otherwise is copied first)
and the result is ``[B, M, N]``, XLA's order. For every batch, the plan (:func:`nxsat.extract.plan.matmul_plan`) tiles M
by the array's columns, N by one PSUM bank and K by its rows: each K tile of L is loaded transposed
(K on partitions) as the stationary operand, each K tile of R as the moving one (consecutive K tiles
in runs, one DMA each: ``MatmulPlan.runs``), and the K tiles accumulate in one PSUM bank
(``start``/``stop``). ScalarE or VectorE (whichever has less of the epilogue's work:
``Epilogue.evacuate_on_act``) evacuates the bank, converting to the result type, and one DMA stores
the tile. Two shapes take their own paths: one M tile against a few N tiles of a weight lying
N-contiguous loads the weight in rows as long as a block of N tiles (:func:`_matmul_wide`), and a
product with one column stores its results as rows, gathered and transposed (:class:`_Columns`).
Integer operands are multiplied as fp32 (exact below 2^24, as the device computes dots).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.epilogue import Epilogue
from nxsat.backend.fused import SoftmaxEpilogue, require_probs_reader, softmax_epilogue
from nxsat.backend.graph import Ref
from nxsat.backend.lower import (
    Lowering,
    _origin,
    device_dtype,
    hosts,
    is_tf32_rounding,
    load_dtype,
    lowers,
    onchip_dtype,
)
from nxsat.extract.plan import (
    MatmulPlan,
    dot_sizes,
    matmul_plan,
    pe_transpose_pays,
    rows_per_partition,
    segments_pay,
    vector_dot,
)
from nxsat.ir import Module, Node, TensorType
from nxsat.sim.program import AccessError
from nxsat.sim.target import Target

TENSOR_TYPES = ("bf16", "f16", "f8e4m3fn", "f8e5m2", "f32")


def operand_type(a: dt.DType, b: dt.DType, lw: Lowering) -> dt.DType:
    """The type TensorE multiplies two operand types in: their common type if it has one, else fp32."""
    if a is b and a.name in TENSOR_TYPES and lw.target.supports_matmul_dtype(a.name):
        return a
    if {a.name, b.name} <= {"bf16", "f16", "f32"} and a is not b:
        return dt.F32
    return dt.F32


hosts("dot")


def dot_dims(node: Node) -> tuple[list[int], list[int], tuple[int, int, int, int]]:
    """A dot's free dimensions of each operand and its sizes ``(B, M, K, N)``: the ``[B, M, K] @ [B, K, N]``
    it is lowered as."""
    lhs, rhs = node.operands
    dims = node.attrs["dims"]
    lf = [d for d in range(len(lhs.shape)) if d not in dims.lhs_batch and d not in dims.lhs_contracting]
    rf = [d for d in range(len(rhs.shape)) if d not in dims.rhs_batch and d not in dims.rhs_contracting]
    return lf, rf, dot_sizes(lhs.shape, rhs.shape, dims)


@lowers("dot")
def dot(lw: Lowering, node: Node) -> None:
    if node.id in lw.values:
        return  # computed on the probabilities' tiles by the dot whose softmax it reads (backend/fused.py)
    require_probs_reader(lw, node)
    lw.graph.origin = _origin(node)
    lhs, rhs = node.operands
    dims = node.attrs["dims"]
    lb, lc, rb, rc = dims.lhs_batch, dims.lhs_contracting, dims.rhs_batch, dims.rhs_contracting
    lf, rf, (B, M, K, N) = dot_dims(node)
    tf32 = is_tf32_rounding(lhs) and lhs.id in lw.absorbed and is_tf32_rounding(rhs) and rhs.id in lw.absorbed
    # An operand cast lowering absorbed (a tf32 rounding, or a cast into a TensorE type) is done on the
    # loaded tile: the dot reads the cast's source and multiplies in the cast's type.
    types = [lhs.dtype, rhs.dtype]
    if lhs.id in lw.absorbed:
        lhs = lhs.operands[0]
    if rhs.id in lw.absorbed:
        rhs = rhs.operands[0]
    if math.prod(rhs.shape) > math.prod(lhs.shape):  # the larger operand (a weight) read as it lies
        lc, rc = _contraction_order(lw.ref(rhs), lc, rc)
    Lp, Rp = lw.ref(lhs).permute(*lb, *lf, *lc), lw.ref(rhs).permute(*rb, *rc, *rf)
    by_heads = None if device_dtype(node.dtype).is_int else _by_heads(
        lw, node, Lp, Rp, lw.ref(lhs).permute(*lb, *lc, *lf), (B, M, K, N),
        [lhs.shape[d] for d in lf], [rhs.shape[d] for d in rf])
    if by_heads is not None:
        frame, L, R = by_heads
        matmul(lw, node, L, R, softmax_epilogue(lw, node, frame), "tf32" if tf32 else "fp32",
               mt=operand_type(*types, lw))
        return
    if device_dtype(node.dtype).is_int and Lp.dtype.is_int and Rp.dtype.is_int:
        out = lw.view(lw.result(node), lambda r: r.reshape(B, M, N), node)
        L = lw.view(Lp, lambda r: r.reshape(B, M, K), node)
        return int_matmul(lw, L, lw.view(Rp, lambda r: r.reshape(B, K, N), node), out)
    ep = softmax_epilogue(lw, node, lambda r: r.reshape(B, M, N))
    if not tf32 and vector_dot(B, M, K, N) and not isinstance(ep, SoftmaxEpilogue):
        try:  # batch dimensions that merge into one stride (the access patterns resolved here)
            L, R = Lp.reshape(B, M, K), Rp.reshape(B, K, N)
            L.ap, R.ap  # noqa: B018
        except AccessError:
            pass  # TensorE, batch by batch
        else:
            return _dot_on_vector(lw, L, R, ep, operand_type(*types, lw))
    split = _split_contraction(Lp, Rp, B, M, N, [lhs.shape[d] for d in lc], lw.target)
    if split is None:
        bs = [lhs.shape[d] for d in lb]
        L = batched_view(lw, Lp, bs, (M, 1, K), node, (lw.ref(lhs).permute(*lb, *lc, *lf), M))
        R = batched_view(lw, Rp, bs, (1, K, N), node, (lw.ref(rhs).permute(*rb, *rf, *rc), K))
    else:
        L, R = split
    matmul(lw, node, L, R, ep, "tf32" if tf32 else "fp32", mt=operand_type(*types, lw))


@dataclass(frozen=True)
class PerBatch:
    """An operand ``[B, ...]`` whose batch dimensions do not merge into one stride (attention's heads
    between its batch and its positions: ``[b, s, h, d]`` read by batches ``(b, h)``), read one batch at
    a time: ``op[b, ...]`` is the batch's own view. Merged, it was a permuted copy through HBM first, a
    2-byte descriptor per element (7.5 us on transformer_layer's critical path, twice)."""

    src: Ref  # [batch..., rest...]
    batch: tuple[int, ...]
    rest: tuple[int, ...]  # each batch's shape

    @property
    def shape(self) -> tuple[int, ...]:
        return (math.prod(self.batch), *self.rest)

    @property
    def dtype(self) -> dt.DType:
        return self.src.dtype

    def __getitem__(self, key: Any) -> Ref:
        b, more = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        r = self.src[tuple(int(i) for i in np.unravel_index(int(b), self.batch))].reshape(*self.rest)
        return r[more] if more else r


def batched_view(lw: Lowering, ref: Ref, batch: list[int], rest: tuple[int, ...], node: Node,
                 swapped: tuple[Ref, int] | None = None) -> Ref | PerBatch:
    """``ref`` (``[batch..., rest...]`` in dimensions) as ``[B, *rest]``: one view where the batch dimensions
    merge, else one view per batch (:class:`PerBatch`), else a contiguous copy. ``swapped``: the same
    operand with its two groups of dimensions (free and contracted) traded, ``[batch..., second...,
    first...]``, and the size of the first group; where its copy keeps more of the source's contiguous
    run than ``ref``'s, that is the copy made, read back through a transposing view (a weight gradient's
    output gradient ``[b, o, h, w]`` contracted over ``(b, h, w)``: copied ``o``-innermost it moved a
    4-byte descriptor per element, 160 us for each batch's 100 KB)."""
    B = math.prod(batch)
    try:
        out = ref.reshape(B, *rest)
        out.shape  # noqa: B018 - resolves the chain: raises if it needs a copy
        return out
    except (AccessError, IndexError):
        pass
    if len(batch) > 1:
        per = PerBatch(ref, tuple(batch), rest)
        try:
            for b in range(B):
                per[b].shape  # noqa: B018
            return per
        except (AccessError, IndexError):
            pass
    if swapped is not None and _run_of(swapped[0]) > _run_of(ref):
        other, first = swapped
        second = math.prod(rest) // first
        return lw.contiguous(other, node).reshape(B, second, first).permute(0, 2, 1).reshape(B, *rest)
    return lw.contiguous(ref, node).reshape(B, *rest)


def _run_of(r: Ref) -> int:
    """Elements of the innermost run of ``r`` contiguous in its source (what a copy in ``r``'s order moves a
    descriptor at a time); 1 when the chain is not a plain pattern."""
    try:
        return r.ap.contiguous_run()
    except (AccessError, IndexError):
        return 1


def _contraction_order(R: Ref, lc: tuple[int, ...] | list[int], rc: tuple[int, ...] | list[int]
                       ) -> tuple[list[int], list[int]]:
    """The contracted dimensions in the right operand's memory order (outermost first; the left operand's
    paired with them): a sum does not depend on the order its terms are named in, and a weight
    contracted over (head_dim, heads) whose bytes lie (heads, head_dim) then merges into one run instead
    of being copied (gemma's output projections)."""
    if len(rc) < 2:
        return list(lc), list(rc)
    strides = {d: st for d, (_, st) in enumerate(R.ap.dims)} if len(R.ap.dims) == len(R.shape) else None
    if strides is None:
        return list(lc), list(rc)
    pairs = sorted(zip(lc, rc), key=lambda p: -strides[p[1]])
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _by_heads(lw: Lowering, node: Node, Lp: Ref, Rp: Ref, Lk: Ref, sizes: tuple[int, int, int, int],
              lfree: list[int], rfree: list[int]) -> tuple[Callable[[Ref], Ref], Ref, Ref] | None:
    """An operand whose free dimensions do not merge into one stride but split as ``H`` outer by ``n`` inner
    ones that do (heads by head_dim: gemma's q projection ``[4, 1152, 256]`` on the right, its k/v one
    ``dot(W[2, 1, 1152, 256], x)`` as -O1 extracted it, on the left), in a dot without batch dimensions:
    each head a batch of its own, the other operand repeated through a stride-0 view, rather than a
    copy of the whole weight into a contiguous scratch (153 MB of gemma3's HBM traffic on the right;
    on the left, 2-byte descriptors, 10.3 ms of DMA engine time). The result's frame, L and R; None
    otherwise (the usual path). ``Lk``: the left operand K-major, ``[K..., M...]``, as ``Rp`` is."""
    B, M, K, N = sizes
    heads = _free_heads(Rp, B, K, N, rfree)
    if heads is not None:
        H, n = heads
        return (lambda r: r.reshape(M, H, n).permute(1, 0, 2),
                lw.view(Lp, lambda r: r.reshape(1, M, 1, K).broadcast(0, H), node),
                Rp.reshape(K, H, n).permute(1, 0, 2).reshape(H, 1, K, n))
    heads = _free_heads(Lk, B, K, M, lfree)
    if heads is not None:
        H, m = heads
        return (lambda r: r.reshape(H, m, N),
                Lk.reshape(K, H, m).permute(1, 2, 0).reshape(H, m, 1, K),
                lw.view(Rp, lambda r: r.reshape(1, 1, K, N).broadcast(0, H), node))
    return None


def _free_heads(Xk: Ref, B: int, K: int, F: int, free: list[int]) -> tuple[int, int] | None:
    """``(H, n)`` when the free dimensions ``free`` (``F`` elements) of an operand seen K-major (``Xk``:
    ``[K..., free...]``) do not merge into one stride but split as ``H`` outer by ``n`` inner ones that
    do, for a dot without batch dimensions whose contraction merges; None otherwise."""
    if B != 1 or len(free) < 2:
        return None
    try:
        Xk.reshape(1, 1, K, F).ap  # noqa: B018 - merges: the usual path
        return None
    except AccessError:
        pass
    for s in range(1, len(free)):
        H, n = math.prod(free[:s]), math.prod(free[s:])
        try:
            Xk.reshape(K, H, n).permute(1, 0, 2).reshape(H, 1, K, n).ap  # noqa: B018
            return H, n
        except AccessError:
            continue
    return None


def _split_contraction(L: Ref, R: Ref, B: int, M: int, N: int, kdims: list[int], target: Target
                       ) -> tuple[Ref, Ref] | None:
    """``L`` as ``[B, M, Ko, Ki]`` and ``R`` as ``[B, Ko, Ki, N]``: the contracting dimensions merged
    into one where their strides allow (``Ko = 1``), else into the fewest outer segments whose inner
    part merges, while :func:`nxsat.extract.plan.segments_pay` (None: the caller copies). A weight
    gradient contracts over (batch, rows, columns) of activations laid out ``[batch, channels, rows,
    columns]``: batch and position do not merge."""
    for s in range(len(kdims)):
        ko, ki = math.prod(kdims[:s]), math.prod(kdims[s:])
        if not segments_pay(ko, ki, target):
            return None
        try:
            Ls, Rs = L.reshape(B, M, ko, ki), R.reshape(B, ko, ki, N)
            Ls.ap, Rs.ap  # noqa: B018 - resolved: raises where the strides do not merge
        except AccessError:
            continue
        return Ls, Rs
    return None


def matmul(lw: Lowering, node: Node, L: Ref, R: Ref, ep: Epilogue, precision: str = "fp32",
           mt: dt.DType | None = None) -> None:
    """``out[b] = L[b] @ R[b]`` for every batch: L ``[B, M, Ko, Ki]``, R ``[B, Ko, Ki, N]``, out
    ``[B, M, N]``, contracting over ``Ko`` segments of ``Ki`` (K tiles never cross a segment); the
    operands are multiplied in ``mt`` (default: their common TensorE type), cast on chip. Each result
    tile goes to ``ep`` (stored, and through the elementwise cluster that reads it)."""
    g = lw.graph
    B, M, Ko, Ki = L.shape
    N = R.shape[3]
    t = lw.target
    mt = mt or operand_type(L.dtype, R.dtype, lw)
    plan = matmul_plan(M, Ko * Ki, N, mt.name, t)
    out_t = onchip_dtype(device_dtype(node.dtype))
    transpose_dma = bool(t.dma["transpose_efficiency"]) and mt.itemsize in (2, 4)
    joint = plan.joint and _joint_transposable(L[0, :, 0, :].T, R[0, 0, :, :], mt, transpose_dma)
    # a weight lying K-contiguous (transposed on TensorE) loads in longer rows: LOAD_BYTES per partition
    # (priced so by extract/cost.py: the moving operand transposed, not jointly)
    r_kmajor = _k_contiguous(R[0, 0])
    rows = not joint and r_kmajor and _pe_transposable(R[0, 0], mt, transpose_dma, Ko * Ki)
    wide = plan.is_wide(joint, r_kmajor)
    # M tiles whose resident stationary tiles load together (whole K-contiguous rows, several a partition)
    lk = L[0, :, 0, :].T
    st_rows = plan.stationary_rows(M, Ki, onchip_dtype(L.dtype).itemsize, plan.group(rows, wide)) \
        if not joint and Ko == 1 and _k_contiguous(lk) and _pe_transposable(lk, mt, transpose_dma, Ki) else 1
    groups = [(ko, *grp) for ko in range(Ko) for grp in plan.runs(Ki, rows, wide)]
    first = [sum(grp[3] for grp in groups[:gi]) for gi in range(len(groups))]  # a group's first K tile
    last = Ko * plan.k_tiles(Ki) - 1
    attrs = {"precision": "tf32"} if precision == "tf32" and mt is dt.F32 else {}
    for b in range(B):
        if joint:
            _matmul_joint(lw, L[b], R[b], ep, b, groups, mt, out_t, b % 2 == 0, attrs)
            continue
        if wide:
            _matmul_wide(lw, L[b], R[b], ep, b, groups, plan, mt, out_t, transpose_dma, attrs)
            continue
        def moving(ko: int, k0: int, kn: int, n: int, n0: int, nn: int, b: int = b) -> list[Ref]:
            return _load_ktiles(lw, R[b, ko, k0:k0 + n * kn, n0:n0 + nn], kn, mt, transpose_dma, Ko * Ki)

        # N in blocks whose moving tiles are loaded once for every M tile (plan.n_block), or one block
        # whose moving tiles are loaded per M tile
        width = plan.n_block * plan.n_tile or N
        for nb0 in range(0, N, width):
            n_tiles = [(n0, min(plan.n_tile, N - n0)) for n0 in range(nb0, min(N, nb0 + width), plan.n_tile)]
            # kept moving tiles are loaded where the first M tile needs them (N tile by N tile): loaded
            # all at once, the block's loads shared the DMA bandwidth and the first one, which TensorE
            # waits for, arrived with the last (a 2048^3 bf16 dot: TensorE idle for its first 36 us)
            kept: dict[int, list[Ref]] | None = {} if plan.n_block else None
            columns = _Columns.of(lw, ep, b, out_t, plan.m_tile) if plan.column_rows(M, N) else None
            residents: dict[int, list[Ref] | None] = {}

            def stationary(ko: int, k0: int, kn: int, n: int, m0: int, b: int = b, tiles: int = 1) -> list[Ref]:
                mn = min(plan.m_tile * tiles, M - m0)
                return _load_ktiles(lw, L[b, m0:m0 + mn, ko, k0:k0 + n * kn].T, kn, mt, transpose_dma, Ko * Ki)

            def operands(m0: int, n0: int, nn: int, gi: int, kept: dict[int, list[Ref]] | None = kept,
                         residents: dict[int, list[Ref] | None] = residents, stationary: Callable[..., list[Ref]]
                         = stationary, moving: Callable[..., list[Ref]] = moving) -> tuple[list[Ref], list[Ref]]:
                if m0 not in residents:  # an M tile's resident stationary tiles load where it first needs them
                    if not plan.resident:
                        residents[m0] = None
                    else:  # several M tiles in one load where whole rows lie end to end (plan.stationary_rows)
                        mtile = plan.m_tile
                        tiles = st_rows if m0 + st_rows * mtile <= M else 1
                        sts = [st for grp in groups for st in stationary(*grp, m0, tiles=tiles)]
                        for j in range(tiles):
                            residents[m0 + j * mtile] = [st[:, j * mtile:(j + 1) * mtile] for st in sts] \
                                if tiles > 1 else sts
                resident = residents[m0]
                ko, k0, kn, n = groups[gi]
                j = first[gi]
                if kept is not None and n0 not in kept:
                    kept[n0] = [mv for ko_, k0_, kn_, n_ in groups for i in range(n_)
                                for mv in moving(ko_, k0_ + i * kn_, kn_, 1, n0, nn)]
                sts = resident[j:j + n] if resident is not None else stationary(ko, k0, kn, n, m0)
                mvs = kept[n0][j:j + n] if kept is not None else moving(ko, k0, kn, n, n0, nn)
                return sts, mvs

            # One group ahead, across N and M tiles: a group's operands (loads, and TensorE transposes
            # evacuated by VectorE and ScalarE) are emitted before the previous group's matmuls, so TensorE
            # transposes the next weights while the last ones are copied out of PSUM instead of waiting for
            # the copy (gemma3's projections: weights stored K-innermost, every tile transposed; its LM head,
            # W @ x, one group per M tile: without the lookahead across M tiles TensorE's transposes, the
            # copy and the matmuls ran in series: 2,577.7 us against the weight stream's 2,417; 2,447.1 now).
            # Kept moving tiles (plan.n_block) still load after the N tile before them has started
            # (test_dot: loaded together, the first matmul waited for all of them).
            # A tile the epilogue skips (a causal mask fills it whole) is a marker, group -1: no operands
            def groups_of(m0: int, n0: int, nn: int, b: int = b) -> range | tuple[int]:
                mn = min(plan.m_tile, M - m0)
                return (-1,) if ep.skips(_place(b, m0, n0, mn, nn), (b, m0, n0), (mn, nn)) else range(len(groups))

            work = [(m0, n0, nn, gi) for m0 in range(0, M, plan.m_tile) for n0, nn in n_tiles
                    for gi in groups_of(m0, n0, nn)]
            real = [w for w, item in enumerate(work) if item[3] >= 0]
            after = {w: nxt for w, nxt in zip(real, real[1:])}  # the next computed work item
            ready: tuple[list[Ref], list[Ref]] | None = None
            acc = None
            for w, (m0, n0, nn, gi) in enumerate(work):
                mn = min(plan.m_tile, M - m0)
                if gi < 0:
                    ep.skip(_place(b, m0, n0, mn, nn), (b, m0, n0), (mn, nn))
                    continue
                sts, mvs = ready if ready is not None else operands(m0, n0, nn, gi)
                ready = None
                nxt = after.get(w)
                if nxt is not None and (kept is None or work[nxt][1] == n0):
                    ready = operands(*work[nxt])
                if gi == 0:
                    acc = g.tile((mn, nn), dt.F32, "psum", "acc").ref()
                for i, (st, mv) in enumerate(zip(sts, mvs)):
                    j = first[gi] + i
                    g.add("pe", "matmul", acc, st, mv, start=j == 0, stop=j == last, **attrs)
                if gi == len(groups) - 1:
                    if columns is not None and mn == plan.m_tile:
                        columns.add(m0, acc)
                    else:
                        _store(lw, ep, (b, m0, n0), acc, out_t)
            if columns is not None:
                columns.flush()
    ep.flush()


@dataclass
class _Columns:
    """The ``[128, 1]`` result tiles of a product with one column (an LM head, ``W @ x`` for one token:
    the long weight stationary, the result's positions on the partitions) stored as rows: up to 128
    of them gathered as the columns of an fp32 tile, transposed on TensorE and stored as rows of 128
    values. Stored one by one, each was 128 descriptors of one value (12 ns of DMA-engine time each:
    gemma3's 262,144 logits, 197 us of its DMA engines' time). A NaN or an infinity spreads along the
    128 results of its tile (a TensorE transpose on NeuronCore-v2 is a matmul against the identity)."""

    lw: Lowering
    ep: Epilogue
    b: int
    out_t: dt.DType
    rows: int  # results per column (the M tile)
    first: int = -1  # the first result of the columns gathered
    cols: list[Ref] = field(default_factory=list)
    tile: Ref | None = None

    @staticmethod
    def of(lw: Lowering, ep: Epilogue, b: int, out_t: dt.DType, m_tile: int) -> _Columns | None:
        """The gatherer for batch ``b`` of a product whose plan stores its result as rows
        (``MatmulPlan.column_rows``), when that result is stored plainly (no elementwise reader on its
        tiles) in positions that lie side by side."""
        if type(ep) is not Epilogue or ep.cluster is not None or ep.out is None or not out_t.is_float:
            return None
        try:
            view = ep.out[b, 0:m_tile * 2, 0].reshape(2, m_tile)
            if view.ap.dims[-1][1] != 1:
                return None
        except AccessError:
            return None
        return _Columns(lw, ep, b, out_t, m_tile)

    def add(self, m0: int, acc: Ref) -> None:
        g = self.lw.graph
        if self.tile is None:  # a transpose takes at most the array's columns
            self.tile = g.tile((self.rows, self.lw.target.matmul["cols"]), dt.F32, "sbuf", "mmcol").ref()
            self.first = m0
        col = self.tile[:, len(self.cols):len(self.cols) + 1]
        g.copy(self.ep.evacuate_on_act(), col, acc)
        self.cols.append(col)
        if len(self.cols) == self.tile.shape[1]:
            self.flush()

    def flush(self) -> None:
        if not self.cols:
            return
        g = self.lw.graph
        n = len(self.cols)
        assert self.tile is not None
        ps = g.tile((n, self.rows), dt.F32, "psum", "mmcolps").ref()
        g.add("pe", "transpose", ps, self.tile[:, 0:n])
        res = g.tile((n, self.rows), self.out_t, "sbuf", "mmrows").ref()
        g.copy(self.ep.evacuate_on_act(), res, ps)
        a = self.first
        g.add("dma", "dma", self.ep.out[self.b, a:a + n * self.rows, 0].reshape(n, self.rows), res)
        self.cols, self.tile = [], None


def _place(b: int, m0: int, n0: int, mn: int, nn: int) -> Callable[[Ref], Ref]:
    """The ``[mn, nn]`` tile at ``[b, m0:, n0:]`` of a ``[B, M, N]`` result, as a view of it."""
    return lambda r: r[b, m0:m0 + mn, n0:n0 + nn]


def _store(lw: Lowering, ep: Epilogue, at: tuple[int, int, int], acc: Ref, out_t: dt.DType,
           on_act: bool | None = None) -> None:
    """A PSUM accumulator (the ``[mn, nn]`` tile at ``[b, m0:, n0:]`` of the ``[B, M, N]`` result) evacuated
    into SBUF in the result type (by ScalarE or VectorE: ``on_act``, else as the epilogue says) and
    handed to the epilogue; or handed over as it is when the epilogue reads PSUM itself."""
    b, m0, n0 = at
    mn, nn = acc.shape
    if ep.reads_psum(out_t):  # the epilogue's first step reads the accumulator itself
        ep.evacuate_on_act(copy=False)
        ep.tile(_place(b, m0, n0, mn, nn), acc, at)
        return
    on_act = ep.evacuate_on_act() if on_act is None else on_act
    res = lw.graph.tile(acc.shape, out_t, "sbuf", "mm").ref()
    lw.graph.copy(on_act, res, acc)
    ep.tile(_place(b, m0, n0, mn, nn), res, at)


def _matmul_wide(lw: Lowering, L: Ref, R: Ref, ep: Epilogue, b: int, groups: list[tuple[int, int, int, int]],
                 plan: MatmulPlan, mt: dt.DType, out_t: dt.DType, transpose_dma: bool, attrs: dict[str, str]) -> None:
    """``out = L @ R`` (:attr:`~nxsat.extract.plan.MatmulPlan.wide`: L one M tile, resident; R's N tiles
    lying N-contiguous, in blocks of ``plan.wide_tiles``): each K group of a block is loaded once in rows
    as long as the block, and every N tile's matmuls read their columns, accumulating in a PSUM bank of
    their own; one group's operands are loaded ahead of the previous group's matmuls, and a block's
    results are stored while the next block computes."""
    g = lw.graph
    M, Ko, Ki = L.shape
    N = R.shape[2]
    width = plan.wide_tiles * plan.n_tile
    last = sum(n for *_, n in groups) - 1
    kept: dict[int, list[Ref]] = {}  # the stationary K tiles of each group, loaded for the first block

    def operands(c0: int, cn: int, gi: int) -> tuple[list[Ref], list[Ref]]:
        ko, k0, kn, n = groups[gi]
        if gi not in kept:
            kept[gi] = _load_ktiles(lw, L[:, ko, k0:k0 + n * kn].T, kn, mt, transpose_dma, Ko * Ki)
        return kept[gi], _load_ktiles(lw, R[ko, k0:k0 + n * kn, c0:c0 + cn], kn, mt, transpose_dma, Ko * Ki)

    work = [(c0, min(width, N - c0), gi) for c0 in range(0, N, width) for gi in range(len(groups))]
    ready = operands(*work[0])
    accs: list[tuple[int, Ref]] = []
    j = 0
    for w, (c0, cn, gi) in enumerate(work):
        sts, mvs = ready
        if w + 1 < len(work):
            ready = operands(*work[w + 1])
        if gi == 0:
            accs = [(n0, g.tile((M, min(plan.n_tile, cn - n0)), dt.F32, "psum", "acc").ref())
                    for n0 in range(0, cn, plan.n_tile)]
            j = 0
        for st, mv in zip(sts, mvs):
            for n0, acc in accs:
                g.add("pe", "matmul", acc, st, mv[:, n0:n0 + acc.shape[1]], start=j == 0, stop=j == last, **attrs)
            j += 1
        if gi == len(groups) - 1:
            for n0, acc in accs:
                _store(lw, ep, (b, 0, c0 + n0), acc, out_t)


def _joint_transposable(Lk: Ref, Rk: Ref, mt: dt.DType, transpose_dma: bool) -> bool:
    """Both ``[K, X]`` operands lie K-contiguous and go through TensorE transposes (a weight gradient:
    activations and output gradients both laid out with positions innermost)."""
    return onchip_dtype(Lk.dtype) is onchip_dtype(Rk.dtype) and all(
        _k_contiguous(r) and _pe_transposable(r, mt, transpose_dma) for r in (Lk, Rk))


def _matmul_joint(lw: Lowering, L: Ref, R: Ref, ep: Epilogue, b: int, groups: list[tuple[int, int, int, int]],
                  mt: dt.DType, out_t: dt.DType, on_act: bool, attrs: dict[str, str]) -> None:
    """``out = L @ R`` (:attr:`~nxsat.extract.plan.MatmulPlan.joint`: R one N tile, L a few M tiles)
    when both operands lie K-contiguous: each K block of both is transposed by TensorE with their rows
    stacked (L's above R's, 128 rows per transpose), and every M tile's matmul takes its stationary and
    moving operands from column ranges of that one tile, accumulating in its own PSUM bank. A
    [144, K] @ [K, 24] weight gradient takes two transposes per K block instead of four."""
    g = lw.graph
    M, N = L.shape[0], R.shape[2]
    mtile = lw.target.matmul["cols"]
    m_tiles = [(m0, min(mtile, M - m0)) for m0 in range(0, M, mtile)]
    accs = [g.tile((mn, N), dt.F32, "psum", "acc").ref() for _, mn in m_tiles]
    last = sum(n for *_, n in groups) - 1
    j = 0
    for ko, k0, kn, n in groups:
        tile = _load_pe_transposed(lw, [L[:, ko, k0:k0 + n * kn], R[ko, k0:k0 + n * kn, :].T], kn, n, mt)
        for i in range(n):
            for acc, (m0, mn) in zip(accs, m_tiles):
                g.add("pe", "matmul", acc, tile[:, i, m0:m0 + mn], tile[:, i, M:M + N], start=j == 0,
                      stop=j == last, **attrs)
            j += 1
    for k, (acc, (m0, _)) in enumerate(zip(accs, m_tiles)):
        _store(lw, ep, (b, m0, 0), acc, out_t, on_act == (k % 2 == 0))


# Rows of L per tile and contraction elements per pass of the exact integer product.
INT_K_CHUNK = 2048


def _dot_on_vector(lw: Lowering, L: Ref, R: Ref, ep: Epilogue, mt: dt.DType) -> None:
    """Many tiny products (:func:`~nxsat.extract.plan.vector_dot`) with their batches on the partitions: per
    tile of batches, the operands loaded whole (one row of ``M * K`` and ``K * N`` elements a batch), rounded
    to the multiply type ``mt`` as TensorE would multiply them, every product ``L[b, m, k] * R[b, k, n]``
    in one VectorE multiply of stride-0 views and the sums over ``k`` in one reduction, in fp32 as PSUM
    accumulates; the epilogue takes the ``[batches, M, N]`` tile."""
    g = lw.graph
    B, M, K = L.shape
    N = R.shape[2]
    P = lw.target.partitions
    for b0 in range(0, B, P):
        bn = min(P, B - b0)
        ops = []
        for src in (L[b0:b0 + bn], R[b0:b0 + bn]):
            # loaded in its memory order (DLRM's right operand is the left one transposed: read as it lies,
            # a row of 48 elements a batch, not 48 descriptors), seen in the product's order on chip
            swap = len(src.ap.dims) == 3 and src.ap.dims[2][1] > src.ap.dims[1][1]
            mem = src.permute(0, 2, 1) if swap else src
            t = g.tile(mem.shape, onchip_dtype(src.dtype), "sbuf", "vdot").ref()
            g.load(t, mem)
            if t.dtype is not mt and mt is not dt.F32:  # an absorbed cast: TensorE's operand rounding
                r = g.tile(mem.shape, mt, "sbuf", "vdotc").ref()
                g.add("dve", "tensor_copy", r, t)
                t = r
            ops.append(t.permute(0, 2, 1) if swap else t)
        a, c = ops
        prod = g.tile((bn, M, N, K), dt.F32, "sbuf", "vdotp").ref()
        g.add("dve", "tensor_tensor", prod, a.reshape(bn, M, 1, K).broadcast(2, N),
              c.permute(0, 2, 1).reshape(bn, 1, N, K).broadcast(1, M), op="mul")
        res = g.tile((bn, M, N), onchip_dtype(device_dtype(ep.node.dtype)), "sbuf", "vdotr").ref()
        g.add("dve", "tensor_reduce", res, prod, op="add", axes=(3,))
        ep.tile(lambda r, b0=b0, bn=bn: r[b0:b0 + bn], res)
    ep.flush()


def int_matmul(lw: Lowering, L: Ref, R: Ref, out: Ref) -> None:
    """An integer dot computed exactly, wrapping as XLA's does: TensorE multiplies in fp32 (exact only
    below 2^24), so GpSimd's 32-bit integer arithmetic does it instead, a row tile of L at a time:
    for each output column, the column of R broadcast over the partitions, multiplied elementwise
    and summed along the free axis (products and sums wrap on writing; modular arithmetic makes the
    wrapped sum the wrapped result). Slow next to TensorE, but integer dots are rare and small."""
    g = lw.graph
    B, M, K = L.shape
    N = R.shape[2]
    rt = onchip_dtype(out.dtype)
    acc_t = dt.S32 if rt.is_signed else dt.U32
    P = lw.target.partitions
    for b in range(B):
        for m0 in range(0, M, P):
            mn = min(P, M - m0)
            res = g.tile((mn, N), acc_t, "sbuf", "imm").ref()
            for k0 in range(0, K, INT_K_CHUNK):
                kn = min(INT_K_CHUNK, K - k0)
                a = _int_tile(lw, L[b, m0:m0 + mn, k0:k0 + kn], acc_t)
                for n in range(N):
                    col = R[b, k0:k0 + kn, n].reshape(1, kn).broadcast(0, mn)
                    bt = _int_tile(lw, col, acc_t)
                    prod = g.tile((mn, kn), acc_t, "sbuf", "iprod").ref()
                    g.add("pool", "tensor_tensor", prod, a, bt, op="mul")
                    if k0 == 0:
                        g.add("pool", "tensor_reduce", res[:, n:n + 1], prod, op="add")
                    else:
                        part = g.tile((mn, 1), acc_t, "sbuf", "ipart").ref()
                        g.add("pool", "tensor_reduce", part, prod, op="add")
                        g.add("pool", "tensor_tensor", res[:, n:n + 1], res[:, n:n + 1], part, op="add")
            if rt is not acc_t:
                res = res.bitcast(rt) if rt.itemsize == 4 else _narrow(lw, res, rt)
            g.add("dma", "dma", out[b, m0:m0 + mn, :], res)


def _int_tile(lw: Lowering, src: Ref, t: dt.DType) -> Ref:
    """An SBUF tile of 32-bit integers holding ``src``: a 32-bit source as its bits, a narrower one
    widened (exact: at most 16 bits through fp32)."""
    g = lw.graph
    sd = onchip_dtype(src.dtype)
    tile = g.tile(src.shape, sd, "sbuf", "iop").ref()
    g.add("dma", "dma", tile, src)
    if sd.itemsize == 4:
        return tile if sd is t else tile.bitcast(t)
    wide = g.tile(src.shape, t, "sbuf", "iwide").ref()
    g.add("pool", "tensor_copy", wide, tile)
    return wide


def _narrow(lw: Lowering, res: Ref, t: dt.DType) -> Ref:
    """32-bit integers wrapped to a narrower integer type: the low bits, kept by masking (and, for a
    signed type, sign-extended) in 32 bits, then copied (exact: the value fits)."""
    g = lw.graph
    bits = 8 * t.itemsize
    wrapped = g.tile(res.shape, res.dtype, "sbuf", "iwrap").ref()
    if t.is_signed:  # the shift left wraps on writing (the exact domain keeps 64 bits within one instruction)
        g.add("pool", "tensor_scalar", wrapped, res, op0="shl", scalar0=32 - bits)
        g.add("pool", "tensor_scalar", wrapped, wrapped, op0="shr", scalar0=32 - bits)
    else:
        g.add("pool", "tensor_scalar", wrapped, res, op0="and", scalar0=(1 << bits) - 1)
    narrow = g.tile(res.shape, t, "sbuf", "inarrow").ref()
    g.add("pool", "tensor_copy", narrow, wrapped)
    return narrow


def _load_kmajor(lw: Lowering, src: Ref, dtype: dt.DType, transpose_dma: bool, k: int | None = None) -> Ref:
    """A ``[K, X]`` operand tile (K on partitions) read the way its bytes lie: a plain DMA when X is
    the contiguous dimension in HBM, else a transposing load of the ``[X, K]`` view (the DMA
    engines' transpose where the target has one) rather than an element-by-element copy."""
    if _k_contiguous(src):
        return _load(lw, src.T, src.shape, dtype, transpose=True, transpose_dma=transpose_dma, k=k)
    return _load(lw, src, src.shape, dtype)


def _load_ktiles(lw: Lowering, src: Ref, kn: int, dtype: dt.DType, transpose_dma: bool, k: int | None = None
                 ) -> list[Ref]:
    """The ``[kn, X]`` operand tiles of the consecutive K tiles of ``src`` (``[n * kn, X]``), loaded
    together where their bytes allow: one DMA for the ``n`` tiles of a run that lies in rows (one
    ``[kn, n, X]`` tile), or one DMA of the ``[X, n * kn]`` rows, transposed on TensorE block by block
    into one PSUM bank and evacuated once (:func:`_load_pe_transposed`). A DMA takes about 1.3 us to
    start whatever it moves, and a K tile of 128 x 144 fp32 is 576 bytes per partition. ``k``: the
    operand's whole contraction (whether TensorE transposes pay is decided for the operand, not the run)."""
    n = src.shape[0] // kn
    if n > 1:
        X = src.shape[1]
        if not _k_contiguous(src):
            try:
                grouped = src.reshape(n, kn, X).permute(1, 0, 2)
                grouped.ap  # noqa: B018 - a run that crosses the view's merged dimensions has no box
            except AccessError:
                grouped = None
            if grouped is not None:
                tile = _load(lw, grouped, (kn, n, X), dtype)
                return [tile[:, i, :] for i in range(n)]
        elif _pe_transposable(src, dtype, transpose_dma, k):
            tile = _load_pe_transposed(lw, src.T, kn, n, dtype)
            return [tile[:, i, :] for i in range(n)]
    return [_load_kmajor(lw, src[i * kn:(i + 1) * kn, :], dtype, transpose_dma, k) for i in range(n)]


def _k_contiguous(src: Ref) -> bool:
    """``src`` (``[K, X]``) has K, not X, as its contiguous dimension in memory."""
    return _inner_stride(src) != 1 and _inner_stride(src.T) == 1


def _inner_stride(r: Ref) -> int | None:
    """The element stride of a 2-D access's last dimension (None when the chain is not a box)."""
    ap = r.ap
    if ap is None or not ap.dims:
        return None
    size, stride = ap.dims[-1]
    return 1 if size == 1 else stride


def _pe_transposable(src: Ref, dtype: dt.DType, transpose_dma: bool, k: int | None = None) -> bool:
    """A K-contiguous ``[K, X]`` operand goes through TensorE transposes (no DMA transpose on the
    target, a type TensorE transposes, and an operand large enough to pay for it: ``k`` its whole
    contraction, else the tile's)."""
    return (not transpose_dma and onchip_dtype(src.dtype) in PE_TRANSPOSABLE and dtype.is_float
            and pe_transpose_pays(src.shape[1], k or src.shape[0]))


def _load(lw: Lowering, src: Ref, shape: tuple[int, ...], dtype: dt.DType, transpose: bool = False,
          transpose_dma: bool = False, k: int | None = None) -> Ref:
    """An SBUF tile of ``shape`` and ``dtype`` holding ``src`` (transposed when asked), converted on chip
    when the operand's type is not the multiply type: by whichever of ScalarE and VectorE would finish it
    sooner after its recent work (``Graph.lighter``; ScalarE copies at 1.4 GHz to VectorE's 1.12). Always
    on VectorE, BERT-base's fp32 weights kept it 48.5% busy (3,693.4 -> 3,371.9 us on ScalarE); always on
    ScalarE, ResNet-50's classifier's eight weight tiles were converted one after another behind the last
    block's epilogue (resnet50 unet-inference 724.2 -> 723.0 us, BERT-12 generic 1,563.8 -> 1,559.7)."""
    g = lw.graph
    if transpose and _pe_transposable(src.T, dtype, transpose_dma, k):
        return _load_pe_transposed(lw, src, shape[0], 1, dtype)[:, 0, :]
    sd = onchip_dtype(src.dtype) if transpose and transpose_dma else load_dtype(lw.target, src, dtype)
    tile = g.tile(shape, sd, "sbuf", "mmop").ref()
    if transpose and transpose_dma:
        g.add("dma", "dma_transpose", tile, src)
    else:
        g.add("dma", "dma", tile, src.T if transpose else src)
    if sd is dtype:
        return tile
    conv = g.tile(shape, dtype, "sbuf", "mmcv").ref()
    g.copy(g.lighter(("act", "dve"), math.prod(shape[1:])) == "act", conv, tile)
    return conv


PE_TRANSPOSABLE = (dt.F32, dt.BF16, dt.F16)


def _load_pe_transposed(lw: Lowering, src: Ref | list[Ref], kn: int, n: int, dtype: dt.DType) -> Ref:
    """The ``[kn, n, X]`` tile of ``n`` K tiles of an ``[X, n * kn]`` view (K contiguous in HBM) on a
    target without DMA transposes (NeuronCore-v2): rows of 128 loaded as they lie (long contiguous
    DMAs), each K block transposed on TensorE into a PSUM bank (fp32 on v2; as many blocks as the bank
    holds) and the bank copied into the tile in the multiply type, as the NKI kernels transpose
    operands, instead of a DMA that moves one element per descriptor. Finite values are exact; a NaN
    or infinity spreads along its 128-row block (the transpose is an identity matmul on v2). A list
    of views (of one type) is stacked row-wise and transposed together, 128 rows at a time. Whole rows
    that lie end to end load several to a partition (:func:`~nxsat.extract.plan.rows_per_partition`:
    longer descriptors), each row's blocks transposed apart and put back in order by the copy out of
    PSUM (gemma3's gating weights and LM head: 2,304-byte rows, four a partition)."""
    g = lw.graph
    srcs = src if isinstance(src, list) else [src]
    X = sum(s.shape[0] for s in srcs)
    rows = lw.target.matmul["rows"]
    bank = lw.target.psum_bank_bytes // 4
    width = n * kn
    tile = g.tile((kn, n, X), dtype, "sbuf", "mmop").ref()
    # the rows loaded in the multiply type where the DMA converts (a transpose in bf16: one TensorE pass)
    types = {load_dtype(lw.target, s, dtype) for s in srcs}
    nat_t = types.pop() if len(types) == 1 else onchip_dtype(srcs[0].dtype)
    per_row = 1
    # (a model input's or constant's rows: an activation's loads stay within the tiles that stored it, so
    # that the forwarding pass can read them on chip)
    if len(srcs) == 1 and X >= 2 * rows and srcs[0].buf.root.kind in ("input", "const") \
            and srcs[0].ap is not None and srcs[0].ap.contiguous_run() >= 2 * width:
        per_row = rows_per_partition(width * onchip_dtype(srcs[0].dtype).itemsize, X, rows)

    x0 = 0
    while x0 < X:
        r = per_row if X - x0 >= per_row * rows else 1
        xn = min(rows, X - x0)
        nat = g.tile((xn, r, width), nat_t, "sbuf", "mmnat").ref()
        if r > 1:
            g.add("dma", "dma", nat, srcs[0][x0:x0 + r * xn, :].reshape(xn, r, width))
        else:
            at = 0
            for s in srcs:  # the rows of each view that fall in this block
                lo, hi = max(at, x0), min(at + s.shape[0], x0 + xn)
                if lo < hi:
                    g.add("dma", "dma", nat[lo - x0:hi - x0, 0, :], s[lo - at:hi - at, :])
                at += s.shape[0]
        per = max(1, bank // xn // r)  # K blocks (of r transposes each) one bank holds
        for i0 in range(0, n, per):
            cnt = min(per, n - i0)
            ps = g.tile((kn, cnt, r, xn), dt.F32, "psum", "mmtp").ref()
            for i in range(cnt):
                for j in range(r):
                    g.add("pe", "transpose", ps[:, i, j, :], nat[:, j, (i0 + i) * kn:(i0 + i + 1) * kn])
            out = tile[:, i0:i0 + cnt, x0:x0 + r * xn]
            if r > 1:  # partition p's row j is row p * r + j
                out = out.reshape(kn, cnt, xn, r).permute(0, 1, 3, 2)
            # copied out by VectorE and ScalarE in turn, as result tiles are evacuated
            g.copy(bool((x0 // rows + i0 // per) % 2), out, ps if r > 1 else ps[:, :, 0, :])
        x0 += r * xn
    return tile


# --- constant operands laid out K-major ------------------------------------------------------------

def _kmajor_perm(node: Node, side: int) -> tuple[int, ...] | None:
    """The order of a dot operand's dimensions that puts its contraction before its free dimensions
    (batch first); None when the operand already lies that way or has no free dimension."""
    d = node.attrs["dims"]
    batch, contracting = (d.lhs_batch, d.lhs_contracting) if side == 0 else (d.rhs_batch, d.rhs_contracting)
    rank = len(node.operands[side].shape)
    free = tuple(i for i in range(rank) if i not in batch and i not in contracting)
    perm = (*batch, *contracting, *free)
    return perm if free and contracting and perm != tuple(range(rank)) else None


def _kernel_perm(node: Node, side: int) -> tuple[int, ...] | None:
    """The order of a convolution kernel's dimensions that puts its output channels innermost (spatial,
    input channels, output channels: JAX's HWIO), as conv.py loads its ``[C, O]`` tap tiles; None for
    the input side or a kernel already in that order."""
    if side != 1:
        return None
    d = node.attrs["dims"]
    perm = (*d.kernel_spatial, d.kernel_input_feature, d.kernel_output_feature)
    return perm if perm != tuple(range(len(perm))) else None


def kmajor_constants(module: Module) -> Module:
    """Constant dot operands stored with their contraction outermost, and constant convolution kernels with
    their output channels innermost (the constant transposed at compile time, read through a transpose: a
    view). A weight kept as ``[out, in]`` (Relay's dense, gemma's projections) is otherwise K-contiguous:
    on trn1 every tile of it goes through a TensorE transpose, a PSUM copy on ScalarE or VectorE, then the
    matmul; laid out ``[in, out]`` it loads with plain DMAs. A Relay convolution's OIHW kernel loads its
    ``[C, O]`` tap tiles one element per descriptor (O is the outermost dimension): ResNet-50 spent 17 ms
    of DMA time on them. A constant is moved only when every reader (through conversions) is a dot or a
    convolution kernel that wants the same order."""
    from nxsat.passes import rewrite_module

    order = module.entry.post_order()
    readers: dict[int, list[Node]] = {}
    for n in order:
        for o in n.operands:
            readers.setdefault(o.id, []).append(n)

    def dot_uses(n: Node) -> list[tuple[Node, int]] | None:
        """The (dot, operand side) pairs reading ``n`` through conversions; None if anything else reads it."""
        out: list[tuple[Node, int]] = []
        for r in readers.get(n.id, ()):
            if r.op == "convert":
                sub = dot_uses(r)
                if sub is None:
                    return None
                out.extend(sub)
            elif r.op in ("dot", "convolution"):
                out.extend((r, side) for side, o in enumerate(r.operands) if o is n)
            else:
                return None
        return out

    chosen: dict[int, tuple[int, ...]] = {}
    for n in order:
        if n.op != "constant" or not isinstance(n.type, TensorType) or len(n.shape) < 2:
            continue
        uses = dot_uses(n)
        perms = {(_kmajor_perm if r.op == "dot" else _kernel_perm)(r, side) for r, side in uses} if uses else {None}
        if len(perms) == 1 and None not in perms:
            chosen[n.id] = perms.pop()
    if not chosen:
        return module

    def expand(rw: Any, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
        perm = chosen.get(node.id)
        if perm is None:
            return None
        value = np.ascontiguousarray(np.transpose(attrs["value"], perm))
        t = node.tensor.with_shape(value.shape)
        stored = Node("constant", [], {**attrs, "value": value, "type": t}, t, f"{node.name}.kmajor", node.loc)
        inverse = tuple(int(i) for i in np.argsort(perm))
        return Node("transpose", [stored], {"dimensions": inverse}, node.type, node.name, node.loc)

    return rewrite_module(module, expand)

"""Indexing operators on the NeuronCore: iota, dynamic-slice, dynamic-update-slice, gather, scatter,
sort and topk, all on the device (no host step, no callback).

**Rows addressed at run time.** The device program's access patterns are static, so data whose
place depends on a runtime value moves with GpSimd's indirect copies (``gather``/``scatter``: rows
of an HBM table by an index tile). The four addressing operators share one scheme (:class:`Rows`):
the operand is seen as a table of rows, a row being the block of trailing dimensions whose start is
always 0 (whole dimensions, or window dimensions no index moves); each runtime index vector is
loaded into SBUF, converted to int32, clamped (gather, dynamic slices: XLA's semantics) or checked
(scatter: an update whose window leaves the operand is skipped) and weighted by its dimension's row
stride, all on GpSimd, whose 32-bit integer arithmetic is exact (VectorE and ScalarE would compute
in fp32). The static part of every row index (window offsets, batching positions) is a constant.
A skipped update gets an index past the table, which the copy with ``oob=skip`` leaves alone.

**Combining scatters.** ``set`` is one scatter per tile (the last update of a row wins, in update
order, as XLA's reference applies them); an fp32 ``add`` is the device's scatter-add, which adds in
fp32 in update order, exactly as the reference does. Every other update computation (integer add,
multiply, min, max, low-precision add, any body) reads the current rows (gather), combines on the
engines (the body evaluated on tiles with the elementwise emitters) and writes them back (scatter),
one index vector at a time: the rows of one window never collide, so each round is exact, and the
rounds run in update order.

**Sorting** runs a bitonic network along the free dimension of SBUF tiles (rows on partitions):
every stage views the tile as its pairs, evaluates the comparator computation on them with the
elementwise emitters (compares of 32-bit integers and IEEE total-order keys exactly on GpSimd),
breaks ties by the original position (stable, a strict total order) and moves every operand with
selects. **Top-k** is k rounds of (max, first index of the max, knock it out) per partition on
int32 total-order keys on GpSimd; a long row is split over partitions whose candidates merge in a
tree. docs/backend.md ("Indexing, sorting and top-k") lists what is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.elementwise import COMPARE, Kernel, emit
from nxsat.backend.graph import Ref
from nxsat.backend.lower import Lowering, device_dtype, lowers, onchip_dtype
from nxsat.backend.tiles import Operand, Tiles, is_num
from nxsat.diagnostics import error
from nxsat.ir import Computation, Node
from nxsat.ops.elementwise import total_order_key
from nxsat.ops.indexing import _combiners, _gather_plan, _scatter_plan, _starts
from nxsat.sim.program import AccessError

LIMIT = 8192  # bytes per partition of one data tile
PARTS = 128
BIG = 1 << 30  # an index past every table and row (positions are below it)
INT_MIN = -(1 << 31)


def _dtype(d: dt.DType) -> dt.DType:
    """The on-chip type of values of IR type ``d``."""
    return onchip_dtype(device_dtype(d))


def _blocks(r0: int, r1: int, per: int) -> Iterator[tuple[int, int, int]]:
    """Rows ``[r0, r1)`` as blocks ``(first, partitions, rows per partition)`` in row order, at most
    :data:`PARTS` partitions and ``per`` rows per partition each, spread over partitions first."""
    m = r0
    while m < r1:
        rem = r1 - m
        nc = max(1, min(per, -(-rem // PARTS)))
        pc = min(PARTS, rem // nc)
        yield m, pc, nc
        m += pc * nc


def _writable(lw: Lowering, ref: Ref, shape: tuple[int, ...], name: str) -> tuple[Ref, Callable[[], None]]:
    """``ref`` reshaped to ``shape`` for writing, and what to call when it is written: where the access
    pattern cannot express the view, a contiguous scratch takes the writes and one DMA moves it."""
    try:
        v = ref.reshape(*shape)
        v.shape  # noqa: B018 - resolves the chain
        return v, lambda: None
    except (AccessError, IndexError):
        s = lw.graph.buf(name + "_w", "scratch", ref.dtype, ref.shape).ref()
        return s.reshape(*shape), lambda: lw.graph.add("dma", "dma", ref, s)


def _bytes_table(lw: Lowering, ref: Ref, name: str) -> Ref:
    """A table the indirect copies can move into on-chip tiles: predicates as bytes (a DMA copies them)."""
    if not ref.dtype.is_pred:
        return ref
    s = lw.graph.buf(name + "_u8", "scratch", dt.U8, ref.shape).ref()
    lw.graph.add("dma", "dma", s, ref)
    return s


# --- iota ------------------------------------------------------------------------------------------

@lowers("iota")
def iota(lw: Lowering, node: Node) -> None:
    """``iota`` on GpSimd straight into tiles of the result type (the instruction computes exact integers
    and rounds them once to the tile's type, as XLA converts its ramp); each tile is stored to every
    block of the dimensions the ramp does not vary along."""
    g = lw.graph
    shape = node.shape
    out = lw.result(node)
    if math.prod(shape) == 0:
        return
    d = node.attrs["iota_dimension"]
    A, n, B = math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])
    o3 = out.reshape(A, n, B)
    tdt = _dtype(node.dtype)
    cap = LIMIT // 4
    Bc = min(B, cap)
    if B * 4 >= 512 or A == 1:
        # partitions along the ramp: partition p holds values i0 + p*Q .. i0 + p*Q + Q-1
        Ac = min(A, max(1, cap // Bc))
        i0 = 0
        while i0 < n:
            P = min(PARTS, n - i0)
            Q = max(1, min((n - i0) // P, cap // (Ac * Bc)))
            t = _iota_tile(lw, (P, Ac, Q, Bc), tdt, base=i0, cm=Q, steps=(0, 1, 0))
            for a0 in range(0, A, Ac):
                an = min(Ac, A - a0)
                for b0 in range(0, B, Bc):
                    bn = min(Bc, B - b0)
                    dst = o3[a0:a0 + an, i0:i0 + P * Q, b0:b0 + bn].reshape(an, P, Q, bn).permute(1, 0, 2, 3)
                    g.add("dma", "dma", dst, t[:, 0:an, :, 0:bn])
            i0 += P * Q
    else:
        # partitions along the outer dimensions: every partition holds whole ramps
        nc = min(n, max(1, cap // Bc))
        for i0 in range(0, n, nc):
            nn = min(nc, n - i0)
            for a0, pc, qa in _blocks(0, A, max(1, cap // (nc * Bc))):
                t = _iota_tile(lw, (pc, qa, nn, Bc), tdt, base=i0, cm=0, steps=(0, 1, 0))
                for b0 in range(0, B, Bc):
                    bn = min(Bc, B - b0)
                    dst = o3[a0:a0 + pc * qa, i0:i0 + nn, b0:b0 + bn].reshape(pc, qa, nn, bn)
                    g.add("dma", "dma", dst, t[:, :, :, 0:bn])


def _iota_tile(lw: Lowering, shape: tuple[int, ...], dtype: dt.DType, base: int, cm: int,
               steps: tuple[int, ...]) -> Ref:
    """A tile of ``base + cm * p + steps . i`` in ``dtype``."""
    t = lw.graph.tile(shape, dtype, "sbuf", "iota").ref()
    lw.graph.add("pool", "iota", t, base=base, channel_multiplier=cm, steps=steps)
    return t


# --- rows addressed at run time --------------------------------------------------------------------

@dataclass
class Rows:
    """An operand seen as a table of rows, addressed by runtime start indices (see the module docstring).

    ``window`` is the extent taken along each operand dimension; ``dynamic`` pairs an operand dimension
    with the index component that moves its start, ``batching`` an operand dimension with the batch axis
    whose position is its start. Dimensions ``[lead, rank)`` form the row (their start is always 0); the
    rows of one index vector are its window's offsets in dimensions ``[0, lead)``, in row-major order, so
    that ``(index vector, window row, row element)`` is the canonical order of a gather's result and of
    a scatter's updates."""

    shape: tuple[int, ...]
    window: tuple[int, ...]
    dynamic: tuple[tuple[int, int], ...]
    batching: tuple[tuple[int, int], ...]
    batch_shape: tuple[int, ...]
    lead: int = field(init=False)

    def __post_init__(self) -> None:
        rank = len(self.shape)
        moved = [d for d, _ in self.dynamic] + [d for d, _ in self.batching]
        partial = [d for d in range(rank) if self.window[d] != self.shape[d]]
        # the row: trailing dimensions no index moves, all whole but the first (so they flatten)
        self.lead = max([0] + [d + 1 for d in moved] + [max(partial, default=-1)])
        self.lead = min(self.lead, rank)

    @property
    def V(self) -> int:  # noqa: N802 - rows of the table
        return math.prod(self.shape[:self.lead])

    @property
    def W(self) -> int:  # noqa: N802 - rows per index vector
        return math.prod(self.window[:self.lead])

    @property
    def R(self) -> int:  # noqa: N802 - elements per row
        return math.prod(self.window[self.lead:])

    @property
    def B(self) -> int:  # noqa: N802 - index vectors
        return math.prod(self.batch_shape)

    def stride(self, d: int) -> int:
        """Rows between consecutive positions of dimension ``d < lead``."""
        return math.prod(self.shape[d + 1:self.lead])

    def table(self, ref: Ref) -> Ref:
        """``ref`` (the operand's shape) as the ``[V, R]`` table of rows."""
        key = tuple(slice(None) if d < self.lead else slice(0, self.window[d]) for d in range(len(self.shape)))
        return (ref[key] if key else ref).reshape(self.V, self.R)

    def static(self) -> np.ndarray:
        """``[B, W]``: the part of every row index known at compile time (batching positions, window
        offsets)."""
        bpart = np.zeros(self.batch_shape, np.int64)
        for d, ax in self.batching:
            shp = [1] * len(self.batch_shape)
            shp[ax] = self.batch_shape[ax]
            bpart = bpart + np.arange(self.batch_shape[ax]).reshape(shp) * self.stride(d)
        wshape = self.window[:self.lead]
        wpart = np.zeros(wshape, np.int64)
        for d in range(self.lead):
            shp = [1] * self.lead
            shp[d] = wshape[d]
            wpart = wpart + np.arange(wshape[d]).reshape(shp) * self.stride(d)
        return bpart.reshape(-1, 1) + wpart.reshape(1, -1)


Loader = Callable[[int, int], Ref]  # (first index vector, count) -> [count, K] tile of raw indices


@dataclass
class Indexer:
    """Row indices of a :class:`Rows` on the device: ``load(b0, pc)`` gives the raw index vectors
    ``[pc, K]`` (any integer type) of vectors ``b0 .. b0+pc-1``; ``clamp`` clamps each start into range
    (gather, dynamic slices), else a vector whose window leaves the operand gets indices past the table."""

    lw: Lowering
    rows: Rows
    load: Loader | None
    clamp: bool
    name: str
    _static: np.ndarray | None = None
    _scratch: Ref | None = None

    def base(self, b0: int, pc: int) -> Ref | None:
        """``[pc, 1]`` int32: the dynamic part of the row index of vectors ``b0..`` (None: always 0), past
        the table where the vector is skipped."""
        rows, g = self.rows, self.lw.graph
        if not rows.dynamic:
            return None
        assert self.load is not None
        raw = self.load(b0, pc)
        t = Tiles(g, (pc, 1), "ix")
        acc: Ref | None = None
        ok: Ref | None = None
        for d, k in rows.dynamic:
            col = raw[:, k:k + 1]
            hi = rows.shape[d] - rows.window[d]
            if col.dtype.name not in ("s32", "u32"):
                col = t.copy(col, dt.S32)  # widen, exactly
            if self.clamp:
                s = t.tile(dt.S32)
                if col.dtype is dt.U32:
                    g.add("pool", "tensor_scalar", s, col, op0="min", scalar0=hi)
                else:
                    g.add("pool", "tensor_scalar", s, col, op0="max", scalar0=0, op1="min", scalar1=hi)
            else:
                # in range iff 0 <= start <= hi: one unsigned compare of the bits
                s = col if col.dtype is dt.S32 else col.bitcast(dt.S32)
                v = t.tile(dt.S32)
                if ok is None:
                    g.add("pool", "tensor_scalar", v, col.bitcast(dt.U32), op0="le", scalar0=hi)
                else:
                    g.add("pool", "tensor_scalar", v, col.bitcast(dt.U32), op0="le", scalar0=hi, op1="mul",
                          scalar1=ok)
                ok = v
            step = rows.stride(d)
            nxt = t.tile(dt.S32)
            if acc is None:
                if step == 1:
                    acc = s
                    continue
                g.add("pool", "tensor_scalar", nxt, s, op0="mul", scalar0=step)
            elif step == 1:
                g.add("pool", "tensor_scalar", nxt, s, op0="add", scalar0=acc)
            else:
                g.add("pool", "tensor_scalar", nxt, s, op0="mul", scalar0=step, op1="add", scalar1=acc)
            acc = nxt
        assert acc is not None
        if ok is not None:
            acc = t.select(ok, acc, rows.V, dt.S32)
        return acc

    def static_const(self) -> np.ndarray:
        if self._static is None:
            self._static = self.rows.static()
        return self._static

    def tile(self, base: Ref | None, static: np.ndarray, pc: int, nc: int, src: Ref | None) -> Ref:
        """``[pc, nc]`` row indices: the static part (``src``, a ``[pc, nc]`` constant access, or all
        zeros) plus ``base`` per partition."""
        g = self.lw.graph
        if base is not None and nc == 1 and not static.any():
            return base
        t = g.tile((pc, nc), dt.S32, "sbuf", "idx").ref()
        if not static.any():
            g.add("pool", "memset", t, value=0)
        else:
            assert src is not None
            g.add("dma", "dma", t, src)
        if base is None:
            return t
        out = g.tile((pc, nc), dt.S32, "sbuf", "idx").ref()
        g.add("pool", "tensor_scalar", out, t, op0="add", scalar0=base)
        return out

    def scratch(self) -> Ref:
        """All row indices, ``[B * W]`` int32 in HBM (computed once): for layouts whose partitions do not
        follow the index vectors."""
        if self._scratch is not None:
            return self._scratch
        rows, lw = self.rows, self.lw
        st = self.static_const()
        sc = lw.graph.buf(self.name + "_rows", "scratch", dt.S32, (rows.B, rows.W)).ref()
        cst = lw.const(st, dt.S32, self.name + "_static") if st.any() else None
        wc = max(1, LIMIT // 4)
        for b0 in range(0, rows.B, PARTS):
            pc = min(PARTS, rows.B - b0)
            base = self.base(b0, pc)
            for w0 in range(0, rows.W, wc):
                wn = min(wc, rows.W - w0)
                src = cst[b0:b0 + pc, w0:w0 + wn] if cst is not None else None
                t = self.tile(base, st[b0:b0 + pc, w0:w0 + wn], pc, wn, src)
                lw.graph.add("dma", "dma", sc[b0:b0 + pc, w0:w0 + wn], t)
        self._scratch = sc.reshape(rows.B * rows.W)
        return self._scratch

    def blocks(self, per: int, rounds: bool = False) -> Iterator[tuple[int, int, int, Ref]]:
        """``(first row, partitions, rows per partition, [pc, nc] index tile)`` over every row
        ``m = vector * W + window row`` in order, at most ``per`` rows per partition. With ``rounds``,
        no block mixes the rows of two index vectors (so no two of its rows can be the same)."""
        rows, lw = self.rows, self.lw
        st = self.static_const()
        M = rows.B * rows.W
        if rows.B == 1:
            flat = st.reshape(-1)
            cst = lw.const(flat, dt.S32, self.name + "_static") if flat.any() else None
            base = self.base(0, min(PARTS, M)) if rows.dynamic else None
            for m0, pc, nc in _blocks(0, M, per):
                src = cst[m0:m0 + pc * nc].reshape(pc, nc) if cst is not None else None
                b = base[0:pc, :] if base is not None else None
                yield m0, pc, nc, self.tile(b, flat[m0:m0 + pc * nc], pc, nc, src)
        elif rows.W <= per and not rounds:
            cst = lw.const(st, dt.S32, self.name + "_static") if st.any() else None
            for b0 in range(0, rows.B, PARTS):
                pc = min(PARTS, rows.B - b0)
                src = cst[b0:b0 + pc, :] if cst is not None else None
                yield b0 * rows.W, pc, rows.W, self.tile(self.base(b0, pc), st[b0:b0 + pc], pc, rows.W, src)
        else:
            sc = self.scratch()
            ranges = [(b * rows.W, (b + 1) * rows.W) for b in range(rows.B)] if rounds else [(0, M)]
            for r0, r1 in ranges:
                for m0, pc, nc in _blocks(r0, r1, per):
                    t = lw.graph.tile((pc, nc), dt.S32, "sbuf", "idx").ref()
                    lw.graph.add("dma", "dma", t, sc[m0:m0 + pc * nc].reshape(pc, nc))
                    yield m0, pc, nc, t


def _per_partition(rows: Rows, itemsize: int) -> tuple[int, int]:
    """(rows per partition, row elements per copy): a data tile stays within :data:`LIMIT` bytes."""
    row = rows.R * itemsize
    if row <= LIMIT:
        return max(1, LIMIT // row), rows.R
    return 1, max(1, LIMIT // itemsize)


def _gather_rows(lw: Lowering, ix: Indexer, table: Ref, out: Ref, dtype: dt.DType) -> None:
    """``out[m, :] = table[row index m, :]`` for every row ``m`` (``out`` ``[M, R]`` in HBM)."""
    g = lw.graph
    per, cols = _per_partition(ix.rows, dtype.itemsize)
    for m0, pc, nc, idx in ix.blocks(per):
        for c0 in range(0, ix.rows.R, cols):
            cn = min(cols, ix.rows.R - c0)
            t = g.tile((pc, nc, cn), dtype, "sbuf", "gath").ref()
            g.add("pool", "gather", t, table[:, c0:c0 + cn], idx)
            g.add("dma", "dma", out[m0:m0 + pc * nc, c0:c0 + cn].reshape(pc, nc, cn), t)


def _scalar_loader(lw: Lowering, starts: list[Node], wanted: set[int]) -> Loader:
    """Raw start indices of a dynamic slice: every partition gets the scalars (one broadcast DMA each)."""

    def load(b0: int, pc: int) -> Ref:
        d = _dtype(starts[0].dtype)
        t = lw.graph.tile((pc, len(starts)), d, "sbuf", "starts").ref()
        for k, s in enumerate(starts):
            if k in wanted:
                lw.graph.add("dma", "dma", t[:, k:k + 1], lw.ref(s).reshape(1, 1).broadcast(0, pc))
        return t

    return load


# --- dynamic slices ----------------------------------------------------------------------------------

def _fixed_starts(lw: Lowering, starts: list[Node], shape: tuple[int, ...], sizes: tuple[int, ...]
                  ) -> tuple[tuple[slice, ...], set[int]]:
    """Start indices that are constants, clamped now (XLA's clamp): the slice they take of every dimension
    (whole dimensions elsewhere) and which dimensions they fix."""
    key, fixed = [], set()
    for d, s in enumerate(starts):
        c = lw.scalar(s)
        if c is None:
            key.append(slice(None))
            continue
        c = min(max(int(c), 0), shape[d] - sizes[d])
        key.append(slice(c, c + sizes[d]))
        fixed.add(d)
    return tuple(key), fixed


def _slice_rows(lw: Lowering, node: Node, ref: Ref, starts: list[Node], sizes: tuple[int, ...]
                ) -> tuple[Rows, Indexer, Ref] | None:
    """A dynamic slice's rows: dimensions with a constant start are sliced out of ``ref`` first (the rows
    then start at 0 there), the others are clamped at run time; the table of ``ref`` (None: ``ref``'s
    access pattern cannot be seen as one)."""
    shape = ref.shape
    key, fixed = _fixed_starts(lw, starts, shape, sizes)
    for attempt in (fixed, set()):
        sub = ref[tuple(k if d in attempt else slice(None) for d, k in enumerate(key))] if key else ref
        sshape = tuple(sizes[d] if d in attempt else shape[d] for d in range(len(sizes)))
        dyn = tuple((d, d) for d in range(len(sizes)) if sshape[d] > sizes[d])
        rows = Rows(sshape, sizes, dyn, (), ())
        try:
            table = rows.table(sub)
            table.shape  # noqa: B018 - resolves the chain
        except (AccessError, IndexError):
            continue
        return rows, Indexer(lw, rows, _scalar_loader(lw, starts, {k for _, k in dyn}), True, node.name), table
    return None


@lowers("dynamic-slice")
def dynamic_slice(lw: Lowering, node: Node) -> None:
    """A gather of the slice's rows at the clamped start (see the module docstring); constant starts are
    a plain slice of the access pattern (nothing moves)."""
    x, *starts = node.operands
    sizes = tuple(node.attrs["sizes"])
    key, fixed = _fixed_starts(lw, starts, x.shape, sizes)
    if len(fixed) == len(starts) or math.prod(sizes) == 0:
        lw.set(node, lw.ref(x)[key] if key else lw.ref(x))
        return
    out = lw.result(node)
    src = _bytes_table(lw, lw.ref(x), node.name)
    plan = _slice_rows(lw, node, src, starts, sizes) or _slice_rows(lw, node, lw.contiguous(src, node), starts, sizes)
    assert plan is not None  # a contiguous operand is always a table
    rows, ix, table = plan
    dst, done = _writable(lw, out, (rows.W, rows.R), node.name)
    _gather_rows(lw, ix, table, dst, table.dtype)
    done()


@lowers("dynamic-update-slice")
def dynamic_update_slice(lw: Lowering, node: Node) -> None:
    """The operand copied to the result, then the update's rows scattered at the clamped start (a DMA
    into a slice when every start is a constant)."""
    x, upd, *starts = node.operands
    out = lw.result(node)
    lw.graph.add("dma", "dma", out, lw.ref(x))
    if math.prod(upd.shape) == 0:
        return
    key, fixed = _fixed_starts(lw, starts, x.shape, upd.shape)
    if len(fixed) == len(starts):
        lw.graph.add("dma", "dma", out[key] if key else out, lw.ref(upd))
        return
    tg = _Target(lw, out)
    plan = _slice_rows(lw, node, tg.buf, starts, upd.shape)
    assert plan is not None  # the result is contiguous
    rows, ix, tg.table = plan
    src = lw.view(lw.ref(upd), lambda r: r.reshape(rows.W, rows.R), node)
    _scatter_rows(lw, ix, [tg], [src], node)


@dataclass
class _Target:
    """A scatter's result as a table (predicates through a byte scratch copied back at the end)."""

    lw: Lowering
    out: Ref
    buf: Ref = field(init=False)
    table: Ref = field(init=False)

    def __post_init__(self) -> None:
        self.buf = self.out
        if self.out.dtype.is_pred:
            self.buf = self.lw.graph.buf(self.out.buf.name + "_u8", "scratch", dt.U8, self.out.shape).ref()
            self.lw.graph.add("dma", "dma", self.buf, self.out)

    def finish(self) -> None:
        if self.buf is not self.out:
            self.lw.graph.add("dma", "dma", self.out, self.buf)


def _scatter_rows(lw: Lowering, ix: Indexer, targets: list[_Target], updates: list[Ref], node: Node,
                  body: Computation | None = None, kinds: list[str] | None = None) -> None:
    """Apply the updates (each ``[M, R]`` in HBM, in update order) to the targets' rows: replace
    (``kinds`` None or "replace"), fp32 scatter-add, or read-combine-write rounds with ``body``."""
    g = lw.graph
    rows = ix.rows
    kinds = kinds or ["replace"] * len(targets)
    direct = [i for i, k in enumerate(kinds) if k == "replace" or (k == "add" and targets[i].table.dtype is dt.F32)]
    rounds = [i for i in range(len(targets)) if i not in direct]
    for i in direct:
        tg, dtype = targets[i], targets[i].table.dtype
        per, cols = _per_partition(rows, dtype.itemsize)
        for m0, pc, nc, idx in ix.blocks(per):
            for c0 in range(0, rows.R, cols):
                cn = min(cols, rows.R - c0)
                t = g.tile((pc, nc, cn), dtype, "sbuf", "upd").ref()
                g.add("dma", "dma", t, updates[i][m0:m0 + pc * nc, c0:c0 + cn].reshape(pc, nc, cn))
                g.add("pool", "scatter", tg.table[:, c0:c0 + cn], idx, t, mode="add" if kinds[i] == "add" else "set",
                      oob="skip")
    if rounds:
        assert body is not None
        if kinds is not None and all(k != "body" for k in kinds):
            for i in rounds:  # independent combiners: one operand at a time
                _rounds(lw, ix, [targets[i]], [updates[i]], _combine_one(kinds[i]))
        else:
            _rounds(lw, ix, targets, updates, lambda k, cur, new: _apply(k, body, [*cur, *new]))
    for tg in targets:
        tg.finish()


def _combine_one(kind: str) -> Callable[[Kernel, list[Ref], list[Ref]], list[Operand]]:
    alu = {"add": "add", "multiply": "mul", "maximum": "max", "minimum": "min"}[kind]

    def fn(k: Kernel, cur: list[Ref], new: list[Ref]) -> list[Operand]:
        return [k.t.binary(alu, cur[0], new[0], cur[0].dtype)]

    return fn


def _rounds(lw: Lowering, ix: Indexer, targets: list[_Target], updates: list[Ref],
            combine: Callable[[Kernel, list[Ref], list[Ref]], list[Operand]]) -> None:
    """Read the rows an index vector addresses, combine them with its updates, write them back; one index
    vector after another (its rows are distinct), so updates to the same row apply in order."""
    g = lw.graph
    rows = ix.rows
    size = max(tg.table.dtype.itemsize for tg in targets)
    per, cols = _per_partition(rows, size)
    for m0, pc, nc, idx in ix.blocks(per, rounds=True):
        for c0 in range(0, rows.R, cols):
            cn = min(cols, rows.R - c0)
            k = Kernel(lw, Tiles(g, (pc, nc, cn), "scat"))
            cur, new = [], []
            for tg, up in zip(targets, updates):
                c = g.tile((pc, nc, cn), tg.table.dtype, "sbuf", "cur").ref()
                g.add("pool", "gather", c, tg.table[:, c0:c0 + cn], idx, oob="skip")
                u = g.tile((pc, nc, cn), up.dtype, "sbuf", "upd").ref()
                g.add("dma", "dma", u, up[m0:m0 + pc * nc, c0:c0 + cn].reshape(pc, nc, cn))
                cur.append(c)
                new.append(u)
            res = combine(k, cur, new)
            for tg, r in zip(targets, res):
                if is_num(r):
                    r = k.t.memset(r, tg.table.dtype)
                if r.dtype is not tg.table.dtype:
                    r = k.t.copy(r, tg.table.dtype)
                g.add("pool", "scatter", tg.table[:, c0:c0 + cn], idx, r, oob="skip")


# --- gather and scatter ----------------------------------------------------------------------------

def _vector_loader(lw: Lowering, indices: Node, ivd: int, node: Node) -> tuple[Loader, tuple[int, ...]]:
    """Raw index vectors ``[pc, K]`` of a gather or scatter (the index vector dimension last), and the
    batch shape."""
    ref = lw.ref(indices)
    shape = indices.shape
    if ivd == len(shape):
        ref = ref.reshape(*shape, 1) if shape else ref.reshape(1)
        shape = shape + (1,)
    perm = [a for a in range(len(shape)) if a != ivd] + [ivd]
    batch = tuple(shape[a] for a in perm[:-1])
    K = shape[ivd]
    view = lw.view(ref.permute(*perm), lambda r: r.reshape(math.prod(batch), K), node)
    d = _dtype(indices.dtype)

    def load(b0: int, pc: int) -> Ref:
        t = lw.graph.tile((pc, K), d, "sbuf", "ind").ref()
        # one index vector serves every partition (its rows are spread over them)
        src = view[b0:b0 + pc, :] if math.prod(batch) > 1 else view.broadcast(0, pc) if pc > 1 else view
        lw.graph.add("dma", "dma", t, src)
        return t

    return load, batch


@lowers("gather")
def gather(lw: Lowering, node: Node) -> None:
    """XLA's gather with any dimension numbers: the rows of every slice, at its clamped start, by
    indirect copies into the result in canonical order (batch, then window dimensions)."""
    operand, indices = node.operands
    plan, dims, sizes = _gather_plan(operand.tensor, indices.tensor, node.attrs)
    out = lw.result(node)
    if math.prod(node.shape) == 0:
        return
    if any(sizes[d] == 0 for d in range(len(sizes))):
        raise error("NCC_EUOC002", f"gather {node.name}: a slice size of 0 on a collapsed dimension leaves the "
                    "result undefined in XLA", node.loc)
    if _gather_repeats(lw, node, out) or _gather_columns(lw, node, plan, dims, sizes, out):
        return
    ivd = plan.index_vector_dim
    dyn = tuple((d, k) for k, d in enumerate(plan.index_map) if operand.shape[d] > sizes[d])
    batching = tuple((d_op, d_ix - (d_ix > ivd)) for d_op, d_ix in zip(plan.operand_batching, plan.index_batching))
    load, _ = _vector_loader(lw, indices, ivd, node)
    rows = Rows(operand.shape, sizes, dyn, batching, plan.batch_shape)
    ix = Indexer(lw, rows, load, True, node.name)
    table = lw.view(_bytes_table(lw, lw.ref(operand), node.name), rows.table, node)
    batch_axes = [d for d in range(len(node.shape)) if d not in dims.offset_dims]
    canon = out.permute(*batch_axes, *dims.offset_dims)
    dst, done = _writable(lw, canon, (rows.B * rows.W, rows.R), node.name)
    _gather_rows(lw, ix, table, dst, table.dtype)
    done()


def repeat_pattern(starts: np.ndarray) -> tuple[int, int, int] | None:
    """``(base, step, k)`` when ``starts[i] == base + (i // k) * step`` with ``step >= 1`` (or one value
    repeated throughout: step 1), else None: every k-th start a step further on."""
    n = len(starts)
    if n == 0:
        return None
    k = int(np.argmax(starts != starts[0])) or n  # the first run's length
    if n % k:
        return None
    base = int(starts[0])
    step = int(starts[k] - base) if k < n else 1
    if step < 1 or not np.array_equal(starts, base + (np.arange(n) // k) * step):
        return None
    return base, step, k


def repeat_gather(node: Node) -> tuple[int, int, int, int] | None:
    """``(d, base, step, k)`` when ``node`` is a gather along dimension ``d`` by constant start indices
    ``base + (i // k) * step`` (:func:`repeat_pattern`, after the gather's clamping) whose result has the
    operand's dimensions, the gathered one in its place: nearest-neighbour up-sampling
    (``jax.image.resize``'s ``floor((i + 0.5) / 2)``, once generic has folded it to ``i // 2``) and
    strided takes. None for any other gather."""
    if node.op != "gather":
        return None
    operand, indices = node.operands
    value = indices.attrs.get("value") if indices.op == "constant" else None
    if value is None:
        return None
    plan, dims, sizes = _gather_plan(operand.tensor, indices.tensor, node.attrs)
    if len(plan.index_map) != 1 or plan.operand_batching or len(plan.batch_shape) != 1:
        return None
    (d,) = plan.index_map
    rank = len(sizes)
    if tuple(dims.collapsed_slice_dims) != (d,) or tuple(dims.offset_dims) != tuple(e for e in range(rank) if e != d) \
            or any(sizes[e] != operand.shape[e] for e in range(rank) if e != d):
        return None
    starts = _starts(plan, np.asarray(value).reshape(indices.shape))[:, d]
    np.clip(starts, 0, operand.shape[d] - 1, out=starts)
    found = repeat_pattern(starts)
    return None if found is None else (d, *found)


def _gather_repeats(lw: Lowering, node: Node, out: Ref) -> bool:
    """:func:`repeat_gather`'s gathers: the operand's slices at that stride, each repeated, one DMA whose
    source repeats through a stride-0 dimension, where the general path makes a GpSimd indirect copy per
    slice (unet_diffusers' up-sampling to 32 x 32: two gathers, 14.3 us of its critical path). A gather of
    such a gather along another dimension, its only reader, is one DMA from the first one's operand (the
    first one's DMA, unread, is dropped: a 2-D up-sampling is one hop through HBM, not two). False for
    any other gather (the general path then runs)."""
    found = repeat_gather(node)
    if found is None:
        return False
    inner = node.operands[0]
    below = repeat_gather(inner) if lw.consumers.get(inner.id) == {node.id} and inner.id not in lw.output_of \
        else None
    tries: list[tuple[tuple[tuple[int, int, int, int], ...], Node]] = [((found,), inner)]
    if below is not None and below[0] != found[0]:
        tries.insert(0, ((found, below), inner.operands[0]))
    for pats, src in tries:
        try:
            lw.graph.add("dma", "dma", *_repeated(out, lw.ref(src), pats))
            return True
        except (AccessError, IndexError, ValueError):
            continue
    return False


def _repeated(out: Ref, src: Ref, pats: tuple[tuple[int, int, int, int], ...]) -> tuple[Ref, Ref]:
    """The DMA's destination and source for ``out = src`` gathered by each ``(d, base, step, k)`` of
    ``pats`` (different dimensions): ``out`` with each such dimension split into ``[m, k]``, ``src`` with
    ``m`` of its slices at ``step`` from ``base`` and a stride-0 dimension of ``k`` after each."""
    by_dim = {d: (base, step, k) for d, base, step, k in pats}
    m = {d: out.shape[d] // k for d, (_, _, k) in by_dim.items()}
    src = src[tuple(slice(by_dim[d][0], by_dim[d][0] + by_dim[d][1] * (m[d] - 1) + 1, by_dim[d][1])
                    if d in by_dim else slice(None) for d in range(len(out.shape)))]
    for d in sorted(by_dim, reverse=True):
        src = src.reshape(*src.shape[:d + 1], 1, *src.shape[d + 1:]).broadcast(d + 1, by_dim[d][2])
    split = [x for d, n in enumerate(out.shape) for x in ((m[d], by_dim[d][2]) if d in by_dim else (n,))]
    dst = out.reshape(*split)
    src.ap, dst.ap  # noqa: B018 - resolved: raises where the access pattern cannot express the view
    return dst, src


COLUMN_GATHER_MAX = 4096  # index vectors x columns a partition's selection tile takes (the column path)


def _gather_columns(lw: Lowering, node: Node, plan: Any, dims: Any, sizes: tuple[int, ...], out: Ref) -> bool:
    """A gather of whole columns of a float ``[Q, D]`` matrix (DLRM's take of the interaction's upper
    triangle: 15 of 36 columns of 3,616 rows), where a row of the table is one element: 54,240 four-byte
    indirect copies on GpSimd (122 us). Instead the matrix loads in tiles of 128 rows as it lies, and each
    tile's columns are selected on chip: ``out[q, j] = max_c select(c == idx[j], A[q, c], -inf)`` (one
    select over ``[rows, B, D]`` and one reduction; the maximum of a value and -infs is that value, a
    zero's sign and a NaN included, and a NaN elsewhere in the row is not read; a sum with -0.0 lost the
    sign of -0.0). The indices are clamped as the gather's starts are.
    False when the gather is not of that form (the general path then runs)."""
    operand, indices = node.operands
    if len(operand.shape) != 2 or not operand.dtype.is_float or tuple(plan.index_map) != (1,) \
            or plan.operand_batching or tuple(dims.collapsed_slice_dims) != (1,) or sizes != (operand.shape[0], 1):
        return False
    Q, D = operand.shape
    ivd = plan.index_vector_dim
    B = math.prod(plan.batch_shape)
    if not 1 < D or B * D > COLUMN_GATHER_MAX or len(plan.batch_shape) != 1 or \
            (ivd < len(indices.shape) and indices.shape[ivd] != 1):
        return False
    g = lw.graph
    P = lw.target.partitions
    it = _dtype(indices.dtype)
    if not it.is_int or it.itemsize != 4:
        return False
    raw = g.tile((P, B), it, "sbuf", "colix").ref()
    g.add("dma", "dma", raw, lw.ref(indices).reshape(1, B).broadcast(0, P))
    idx = g.tile((P, B), dt.S32, "sbuf", "colixc").ref()
    g.add("pool", "tensor_scalar", idx, raw, op0="max", scalar0=0, op1="min", scalar1=D - 1)
    cols = _iota_tile(lw, (P, B, D), dt.S32, 0, 0, (0, 1))
    hit = g.tile((P, B, D), dt.S32, "sbuf", "colhit").ref()
    g.add("pool", "tensor_tensor", hit, cols, idx.reshape(P, B, 1).broadcast(2, D), op="eq")
    ninf = g.tile((P, 1), dt.F32, "sbuf", "colninf").ref()
    g.add("dve", "memset", ninf, value=float("-inf"))
    A = lw.ref(operand)
    canon = out.permute(*[d for d in range(2) if d not in dims.offset_dims], *dims.offset_dims)  # [B, Q]
    for q0 in range(0, Q, P):
        pn = min(P, Q - q0)
        a = g.tile((pn, D), _dtype(operand.dtype), "sbuf", "colrows").ref()
        g.add("dma", "dma", a, A[q0:q0 + pn])
        sel = g.tile((pn, B, D), dt.F32, "sbuf", "colsel").ref()
        g.add("dve", "select", sel, hit[:pn], a.reshape(pn, 1, D).broadcast(1, B),
              ninf[:pn].reshape(pn, 1, 1).broadcast(1, B).broadcast(2, D))
        res = g.tile((pn, B), _dtype(node.dtype), "sbuf", "colres").ref()
        g.add("dve", "tensor_reduce", res, sel, op="max", axes=(2,))
        g.add("dma", "dma", canon.permute(1, 0)[q0:q0 + pn], res)
    return True


@lowers("scatter")
def scatter(lw: Lowering, node: Node) -> None:
    """XLA's scatter, variadic, with any dimension numbers: each operand copied to its result, then the
    updates applied by row (see the module docstring for how each update computation runs)."""
    n = len(node.operands) // 2
    operands, indices, updates = node.operands[:n], node.operands[n], node.operands[n + 1:]
    plan, dims, scatter_dims = _scatter_plan(operands[0].tensor, indices.tensor, updates[0].tensor, node.attrs)
    outs = lw.results(node) if n > 1 else (lw.result(node),)
    for o, x in zip(outs, operands):
        lw.graph.add("dma", "dma", o, lw.ref(x))
    if math.prod(updates[0].shape) == 0 or math.prod(operands[0].shape) == 0:
        return
    window = [1] * len(operands[0].shape)
    for u, d in zip(dims.update_window_dims, plan.window_dims):
        window[d] = updates[0].shape[u]
    ivd = plan.index_vector_dim
    dyn = tuple((d, k) for k, d in enumerate(plan.index_map))
    batching = tuple((d_op, d_ix - (d_ix > ivd)) for d_op, d_ix in zip(plan.operand_batching, plan.index_batching))
    load, _ = _vector_loader(lw, indices, ivd, node)
    rows = Rows(operands[0].shape, tuple(window), dyn, batching, plan.batch_shape)
    ix = Indexer(lw, rows, load, False, node.name)
    order = [*scatter_dims, *dims.update_window_dims]
    srcs = [_bytes_table(lw, lw.view(lw.ref(u).permute(*order), lambda r: r.reshape(rows.B * rows.W, rows.R), node),
                         node.name) for u in updates]
    targets = [_Target(lw, o) for o in outs]
    for tg in targets:
        tg.table = rows.table(tg.buf)
    body: Computation = node.attrs["to_apply"]
    kinds = _combiners(body, n)
    same = all(p.type.dtype is a.dtype for p, a in zip(body.params, [*operands, *updates]))
    if kinds is None or not same:
        kinds = ["body"] * n
    _scatter_rows(lw, ix, targets, srcs, node, body, kinds)


# --- computations on tiles -------------------------------------------------------------------------

def _apply(k: Kernel, comp: Computation, args: list[Operand]) -> list[Operand]:
    """Evaluate a scalar computation (a comparator, an update computation) elementwise on tiles of
    ``k``'s shape: the elementwise emitters, except that compares of 32-bit integers and IEEE
    total-order compares run exactly on GpSimd (giving int32 0/1)."""
    val: dict[int, Operand | list[Operand]] = {p.id: a for p, a in zip(comp.params, args)}
    for node in comp.post_order():
        if node.id in val:
            continue
        ops = [val[o.id] for o in node.operands]
        if node.op == "constant":
            v = k.lw.scalar(node)
            if v is None:
                raise error("NCC_EUOC002", f"{comp.name}: constant {node.name} is not a scalar", node.loc)
            val[node.id] = v
        elif node.op == "tuple":
            val[node.id] = ops  # type: ignore[assignment]
        elif node.op == "compare":
            val[node.id] = _compare(k, node, ops)  # type: ignore[arg-type]
        elif node.op in ("copy", "opt-barrier") or (node.op in ("reshape", "broadcast") and node.shape == ()):
            val[node.id] = ops[0]
        else:
            from nxsat.backend.elementwise import EMITTERS

            if node.op not in EMITTERS:
                raise error("NCC_EUOC002", f"{comp.name}: operator {node.op} ({node.name}) in a sort comparator or "
                            "scatter computation cannot run on the NeuronCore yet", node.loc)
            val[node.id] = emit(k, node, ops)  # type: ignore[arg-type]
    res = val[comp.root.id]
    return list(res) if isinstance(res, list) else [res]  # type: ignore[list-item]


def _compare(k: Kernel, node: Node, ops: list[Operand]) -> Operand:
    a, b = ops
    src = node.operands[0].dtype
    op = COMPARE[node.attrs["direction"]]
    total = node.attrs.get("type") == "TOTALORDER" and src.is_float
    if is_num(a) and is_num(b):
        x, y = (total_order_key(np.array([a, b], _dtype(src).np)) if total else np.array([a, b], np.float64))
        return int(bool({"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y}[op]))
    dev = device_dtype(src)
    if total:
        ka = _order_key(k.t, a) if not is_num(a) else int(total_order_key(np.array([a], _dtype(src).np))[0])
        kb = _order_key(k.t, b) if not is_num(b) else int(total_order_key(np.array([b], _dtype(src).np))[0])
        return k.t.binary(op, ka, kb, dt.S32)
    if dev.name in ("s32", "u32"):
        return k.t.binary(op, a, b, dt.S32)
    return k.t.binary(op, a, b, dt.U8)


def _order_key(t: Tiles, x: Ref) -> Ref:
    """int32 keys of a float tile ordered as IEEE totalOrder (-NaN < -inf < -0 < +0 < inf < +NaN): the
    bits, with the magnitude bits flipped where the sign is set (bitwise, on the bits: exact)."""
    width = x.dtype.itemsize * 8
    sint = {32: dt.S32, 16: dt.S16, 8: dt.S8}[width]
    bits = x.bitcast(sint)
    if sint is not dt.S32:
        bits = t.copy(bits, dt.S32)  # sign-extends
    mask = t.scalar2(bits, "shr", width - 1, "and", (1 << (width - 1)) - 1, dt.S32)
    return t.binary("xor", bits, mask, dt.S32)


# --- sort ------------------------------------------------------------------------------------------

SORT_ROW_BYTES = 32768  # per partition: a row of every operand and its positions, padded to a power of 2


def _memset(lw: Lowering, ref: Ref, value: float | int) -> None:
    lw.graph.add("pool" if ref.dtype.is_int else "dve", "memset", ref, value=value)


@lowers("sort")
def sort(lw: Lowering, node: Node) -> None:
    """A stable sort by any comparator: a bitonic network along the free dimension (rows on partitions,
    several rows per partition when they are short), the comparator evaluated on whole stages."""
    ops = node.operands
    d = node.attrs["dimension"]
    comp: Computation = node.attrs["to_apply"]
    outs = lw.results(node) if len(ops) > 1 else (lw.result(node),)
    shape = ops[0].shape
    n = shape[d]
    if math.prod(shape) == 0:
        return
    if n == 1:
        for o, x in zip(outs, ops):
            lw.graph.add("dma", "dma", o, lw.ref(x))
        return
    types = [_dtype(x.dtype) for x in ops]
    Np = 1 << (n - 1).bit_length()
    row = Np * (sum(t.itemsize for t in types) + 4)
    if row > SORT_ROW_BYTES:
        raise error("NCC_EUOC002", f"sort {node.name}: rows of {n} elements ({row} bytes per partition with the "
                    f"positions, over {SORT_ROW_BYTES}) do not fit the on-chip sorting network", node.loc,
                    "docs/backend.md, 'Indexing, sorting and top-k'")
    perm = [a for a in range(len(shape)) if a != d] + [d]
    R = math.prod(shape) // n
    srcs = [lw.view(lw.ref(x).permute(*perm), lambda r: r.reshape(R, n), node) for x in ops]
    dsts = [_writable(lw, o.permute(*perm), (R, n), f"{node.name}_{i}") for i, o in enumerate(outs)]
    g = lw.graph
    for r0, pc, gr in _blocks(0, R, max(1, LIMIT // row)):
        arrays = []
        for x, t in zip(srcs, types):
            a = g.tile((pc, gr, Np), t, "sbuf", "sortv").ref()
            g.add("dma", "dma", a[:, :, 0:n], x[r0:r0 + pc * gr].reshape(pc, gr, n))
            if Np > n:
                _memset(lw, a[:, :, n:Np], 0)
            arrays.append(a)
        pos = g.tile((pc, gr, Np), dt.S32, "sbuf", "sortp").ref()
        g.add("pool", "iota", pos, steps=(0, 1))
        arrays.append(pos)
        k = 2
        while k <= Np:
            j = k // 2
            while j >= 1:
                arrays = _sort_stage(lw, comp, arrays, n, k, j)
                j //= 2
            k *= 2
        for (dst, _), a in zip(dsts, arrays):
            g.add("dma", "dma", dst[r0:r0 + pc * gr].reshape(pc, gr, n), a[:, :, 0:n])
    for _, done in dsts:
        done()


def _sort_stage(lw: Lowering, comp: Computation, arrays: list[Ref], n: int, k: int, j: int) -> list[Ref]:
    """One stage of the bitonic network: elements ``i`` and ``i + j`` (``i & j == 0``) are exchanged when
    they are out of order for the direction of their block of ``k`` (ascending where ``i & k == 0``).
    "Before" is the comparator, ties broken by position (``arrays[-1]``), pads (positions ``>= n``) last:
    a strict total order, so the network's result is the stable sort."""
    g = lw.graph
    pc, gr, Np = arrays[0].shape
    shape = (pc, gr, Np // (2 * j), j)
    t = Tiles(g, shape, "sortc")
    kern = Kernel(lw, t)

    def half(a: Ref, h: int) -> Ref:
        return a.reshape(pc, gr, Np // (2 * j), 2, j)[:, :, :, h, :]

    A = [half(a, 0) for a in arrays]
    B = [half(a, 1) for a in arrays]
    c_ba = _apply(kern, comp, [v for pair in zip(B[:-1], A[:-1]) for v in pair])[0]
    c_ab = _apply(kern, comp, [v for pair in zip(A[:-1], B[:-1]) for v in pair])[0]
    t_ba = t.binary("lt", B[-1], A[-1], dt.S32)
    before = t.binary("max", c_ba, t.binary("lt", c_ab, t_ba, dt.S32), dt.S32)  # c_ba or (not c_ab and t_ba)
    if Np > n:
        pad = t.binary("ge", t.binary("max", A[-1], B[-1], dt.S32), n, dt.S32)
        before = t.select(pad, t_ba, before, dt.S32)
    if k < Np:
        at = t.tile(dt.S32)
        g.add("pool", "iota", at, steps=(0, 2 * j, 0))  # the position of each pair's first element
        desc = t.scalar2(at, "and", k, "shr", k.bit_length() - 1, dt.S32)
        before = t.binary("xor", before, desc, dt.S32)
    out = []
    for a, x, y in zip(arrays, A, B):
        na = g.tile(a.shape, a.dtype, "sbuf", "sortv").ref()
        eng = "pool" if a.dtype.name in ("s32", "u32") else "dve"
        g.add(eng, "select", half(na, 0), before, y, x)
        g.add(eng, "select", half(na, 1), before, x, y)
        out.append(na)
    return out


# --- topk ------------------------------------------------------------------------------------------

TOPK_FREE = 1024  # elements per partition of one top-k round
TOPK_MAX_SPLIT = 4096  # elements per partition when a row is spread over every partition
TOPK_MERGE = 128  # candidates per partition in a merge round: small rounds, few levels


def _topk_keys(t: Tiles, x: Ref, largest: bool) -> Ref:
    """int32 keys whose signed order is the order top-k ranks ``x`` in (totalOrder for floats; the
    smallest first becomes the largest key when ``largest`` is false)."""
    if x.dtype.is_float:
        key = _order_key(t, x)
    elif x.dtype is dt.U32:
        key = t.binary("xor", x, INT_MIN, dt.S32)  # unsigned order as signed
    else:
        key = t.copy(x, dt.S32) if x.dtype is not dt.S32 else t.binary("add", x, 0, dt.S32)
    return t.binary("xor", key, -1, dt.S32) if not largest else key


def _topk_values(t: Tiles, key: Ref, dtype: dt.DType, largest: bool) -> Ref:
    """The values the keys came from (bit for bit)."""
    if not largest:
        key = t.binary("xor", key, -1, dt.S32)
    if dtype.is_float:
        width = dtype.itemsize * 8
        bits = t.binary("xor", key, t.scalar2(key, "shr", 31, "and", (1 << (width - 1)) - 1, dt.S32), dt.S32)
        sint = {32: dt.S32, 16: dt.S16, 8: dt.S8}[width]
        if sint is not dt.S32:
            bits = t.copy(bits, sint)
        return bits.bitcast(dtype)
    if dtype is dt.U32:
        return t.binary("xor", key, INT_MIN, dt.U32)
    return key if dtype is dt.S32 else t.copy(key, dtype)


def _topk_rounds(lw: Lowering, km: Ref, posa: Ref, pos: Ref, kk: int, payload: Ref | None) -> tuple[Ref, Ref]:
    """``kk`` rounds of: the largest key of every row (``[P, G, F]`` tiles, exact on GpSimd), the first
    position holding it among the live ones (``posa``: the position, or BIG once taken or a pad), and
    knocking it out. Returns the keys ``[P, G, kk]`` in rank order and their indices (the positions, or
    ``payload`` at them; BIG for a round that found nothing live)."""
    g = lw.graph
    P, G, F = km.shape
    t = Tiles(g, (P, G, F), "topk")
    big = t.memset(BIG, dt.S32)
    low = t.memset(INT_MIN, dt.S32)
    keys = g.tile((P, G, kk), dt.S32, "sbuf", "topkk").ref()
    idx = g.tile((P, G, kk), dt.S32, "sbuf", "topki").ref()
    for i in range(kk):
        m = keys[:, :, i:i + 1]
        g.add("pool", "tensor_reduce", keys[:, :, i], km, op="max", axes=(2,))
        eq = _eq_rows(t, km, m)
        cand = t.select(eq, posa, big, dt.S32)
        sel = idx[:, :, i:i + 1] if payload is None else g.tile((P, G, 1), dt.S32, "sbuf", "topks").ref()
        g.add("pool", "tensor_reduce", sel.reshape(P, G), cand, op="min", axes=(2,))
        if payload is None and i == kk - 1:
            break
        hit = _eq_rows(t, pos, sel)
        if payload is not None:
            pv = t.select(hit, payload, big, dt.S32)
            g.add("pool", "tensor_reduce", idx[:, :, i], pv, op="min", axes=(2,))
        if i < kk - 1:
            g.add("pool", "select", km, hit, low, km)
            g.add("pool", "select", posa, hit, big, posa)
    return keys, idx


def _eq_rows(t: Tiles, x: Ref, v: Ref) -> Ref:
    """``x == v`` with ``v`` ``[P, G, 1]`` one value per row: a per-partition scalar when a partition holds
    one row (one pass), else a broadcast operand."""
    P, G, F = x.shape
    if G > 1:
        return t.binary("eq", x, v.broadcast(2, F), dt.S32)
    out = t.tile(dt.S32)
    t.g.add("pool", "tensor_scalar", out, x, op0="eq", scalar0=v)
    return out


@lowers("topk")
def topk(lw: Lowering, node: Node) -> None:
    """The k largest (or smallest) along the last dimension with their int32 indices, ties to the lower
    index: rounds of max / first index / knock out on GpSimd over int32 total-order keys. A long row is
    spread over partitions; their candidates merge in a tree of the same rounds (candidates keep row
    order, so ties still go to the lower index)."""
    g = lw.graph
    x = node.operands[0]
    k = node.attrs["k"]
    largest = node.attrs.get("largest", True)
    vals, idxs = lw.results(node)
    n = x.shape[-1]
    R = math.prod(x.shape[:-1])
    if k == 0 or R == 0:
        return
    X = lw.view(lw.ref(x), lambda r: r.reshape(R, n), node)
    V, I = vals.reshape(R, k), idxs.reshape(R, k)
    xt = _dtype(x.dtype)
    if n <= TOPK_FREE:
        for r0, pc, gr in _blocks(0, R, max(1, TOPK_FREE // n)):
            t = Tiles(g, (pc, gr, n), "topk")
            xs = t.tile(xt)
            g.add("dma", "dma", xs, X[r0:r0 + pc * gr].reshape(pc, gr, n))
            km = _topk_keys(t, xs, largest)
            pos = t.tile(dt.S32)
            g.add("pool", "iota", pos, steps=(0, 1))
            posa = t.binary("add", pos, 0, dt.S32)
            keys, idx = _topk_rounds(lw, km, posa, pos, k, None)
            _topk_store(lw, keys, idx, V[r0:r0 + pc * gr].reshape(pc, gr, k), I[r0:r0 + pc * gr].reshape(pc, gr, k),
                        vals.dtype, largest)
        return
    S = min(PARTS, -(-n // 256))
    F = -(-n // S)
    S = -(-n // F)
    if F > TOPK_MAX_SPLIT:
        raise error("NCC_EUOC002", f"topk {node.name}: rows of {n} elements exceed {PARTS * TOPK_MAX_SPLIT} (the "
                    "partitions times the elements each takes)", node.loc, "docs/backend.md, 'Indexing, sorting and "
                    "top-k'")
    rb = max(1, PARTS // S)
    for r0 in range(0, R, rb):
        rn = min(rb, R - r0)
        P = rn * S
        t = Tiles(g, (P, 1, F), "topk")
        xs = t.tile(xt)
        full = n // F
        if full * F < n or S * F > n:
            _memset(lw, xs, 0)
        for r in range(rn):
            g.add("dma", "dma", xs[r * S:r * S + full, :, :], X[r0 + r, 0:full * F].reshape(full, 1, F))
            if full * F < n:
                g.add("dma", "dma", xs[r * S + full:r * S + full + 1, :, 0:n - full * F],
                      X[r0 + r:r0 + r + 1, full * F:n].reshape(1, 1, n - full * F))
        pos = t.tile(dt.S32)
        g.add("pool", "iota", pos, channel_multiplier=F, steps=(0, 1))
        if rn > 1:  # positions within the row: minus (p // S) * S * F
            pt = Tiles(g, (P, 1), "topk")
            p = pt.tile(dt.S32)
            g.add("pool", "iota", p, channel_multiplier=1)
            off = pt.scalar2(p, "div", S, "mul", -S * F, dt.S32)
            pos2 = t.tile(dt.S32)
            g.add("pool", "tensor_scalar", pos2, pos, op0="add", scalar0=off)
            pos = pos2
        key = _topk_keys(t, xs, largest)
        live = t.binary("lt", pos, n, dt.S32)
        km = t.select(live, key, INT_MIN, dt.S32)
        posa = t.select(live, pos, BIG, dt.S32)
        kk = min(k, F)
        keys, idx = _topk_rounds(lw, km, posa, pos, kk, None)
        cur = S
        while cur > 1:
            f = max(2, TOPK_MERGE // kk)
            nxt = -(-cur // f)
            slots = f * kk
            t2 = Tiles(g, (rn * nxt, 1, slots), "topk")
            ck, ci = t2.tile(dt.S32), t2.tile(dt.S32)
            if cur % f:
                _memset(lw, ck, INT_MIN)
                _memset(lw, ci, BIG)
            for r in range(rn):
                for s2 in range(nxt):
                    cnt = min(f, cur - s2 * f)
                    at = r * nxt + s2
                    src = r * cur + s2 * f
                    for dst_t, src_t in ((ck, keys), (ci, idx)):
                        g.add("dma", "dma", dst_t[at:at + 1, :, 0:cnt * kk].reshape(1, cnt, kk),
                              src_t[src:src + cnt, 0, :])
            pos = t2.tile(dt.S32)
            g.add("pool", "iota", pos, steps=(0, 1))
            live = t2.binary("lt", ci, BIG, dt.S32)
            posa = t2.select(live, pos, BIG, dt.S32)
            kk = min(k, slots)
            keys, idx = _topk_rounds(lw, ck, posa, pos, kk, ci)
            cur = nxt
        _topk_store(lw, keys, idx, V[r0:r0 + rn].reshape(rn, 1, k), I[r0:r0 + rn].reshape(rn, 1, k), vals.dtype,
                    largest)


def _topk_store(lw: Lowering, keys: Ref, idx: Ref, vdst: Ref, idst: Ref, dtype: dt.DType, largest: bool) -> None:
    t = Tiles(lw.graph, keys.shape, "topk")
    v = _topk_values(t, keys, _dtype(dtype), largest)
    lw.graph.add("dma", "dma", vdst, v)
    lw.graph.add("dma", "dma", idst, idx)

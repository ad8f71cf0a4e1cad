"""Batch normalization: ``batch-norm-training``, ``batch-norm-inference`` and ``batch-norm-grad``, any
``feature_index``, as XLA defines them (nxsat/ops/norm.py): statistics per feature over every other
dimension, the biased variance, ``epsilon`` added before the square root. Everything computes in fp32 and
rounds once to the operand's type.

Two layouts, chosen by where the feature dimension lies in memory:

- **features on the partitions** (``[C, rest]``, 128 features at a time; NCHW and most others): the
  statistics of a training step are VectorE's ``bn_stats`` over every 512 elements of a partition and
  ``bn_aggr`` merging them (64 groups at a time, then the merged (count, mean, M2) triples again: Chan's
  formula all the way, in one pass). The per-feature values are ``[P, 1]`` scalars of ``tensor_scalar``:
  ``y = (x - mean) * (scale * rsqrt(var + eps)) + offset`` is two instructions per tile.
- **features on the free axis** (the feature dimension innermost in memory and the others one run,
  e.g. NHWC): the other elements go to the partitions (``[A <= 128, B]`` each, as reductions do) and the
  features along the free axis, 512 at a time; sums over the partitions are TensorE matmuls of a ones
  vector accumulating in PSUM. The variance is computed shifted by the first element of each feature
  (``var = E[(x - s)^2] - E[x - s]^2``, accurate when ``s`` is a sample), and per-feature values are
  broadcast over the partitions by a one-row matmul.

``batch-norm-grad`` sums ``dy`` and ``dy * (x - mean)`` per feature in a first pass, then
``dx = (dy - mean(dy) - (x - mean) * rstd^2 * mean(dy * (x - mean))) * scale * rstd`` in a second. A
feature block whose data fits :data:`KEEP_BYTES` per partition is loaded once for both passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.graph import Graph, Ref
from nxsat.backend.lower import Lowering, device_dtype, lowers, onchip_dtype
from nxsat.backend.reduce import block_sizes, blocks, copy_new, merge_groups, pad_partitions
from nxsat.backend.tiles import Tiles
from nxsat.ir import Module, Node, TensorType

# bytes per partition of one tile: half the instructions of 4 KiB; with 16 KiB, mobilenet_v2's SBUF
# fragmented until no tile could be placed (NCC_EOOM001 in scheduling)
CHUNK_BYTES = 8192
KEEP_BYTES = 32 * 1024  # a feature block's data up to this many bytes per partition stays on chip between passes
BN_MAX = 512  # elements one bn_stats reads per partition
GROUPS = 64  # bn_stats groups one bn_aggr merges
COLS = 512  # features per block on the free axis (one PSUM bank of fp32)
SPLIT_MIN = 4096  # elements per feature from which a block of few features spreads each over several partitions


@lowers("batch-norm-training", "batch-norm-inference", "batch-norm-grad")
def batch_norm(lw: Lowering, node: Node) -> None:
    x = node.operands[0]
    fi = node.attrs["feature_index"]
    outs = list(lw.results(node)) if node.op != "batch-norm-inference" else [lw.result(node)]
    refs = [lw.ref(o) for o in node.operands]
    shape = x.shape
    others = [d for d in range(len(shape)) if d != fi]
    big = [lw.ref(x)] + ([refs[4]] if node.op == "batch-norm-grad" else [])  # operands shaped like x
    groups = merge_groups([r.permute(*others, fi) for r in (*big, outs[0])], others, [fi], shape, merge=True)
    inner = [gr for gr in groups if gr.kept]
    feat = [gr for gr in groups if not gr.kept][0]
    cls: type[Norm] = Rows
    if len(inner) == 1 and feat.stride == 1 and inner[0].size >= 128 and shape[fi] > 1:
        cls = Cols
    cls(lw, node, refs, outs, fi).run()


def lazily(loads: list[Callable[[], Ref]], which: int, kept: dict[int, list[Ref]] | None) -> Iterator[Ref]:
    """The tiles of one operand, each loaded when the pass reaches it (so that a pass over data larger than
    SBUF streams it), or, when the block's data stays on chip (``kept``), the tiles a first pass loaded."""
    if kept is not None and which in kept:
        yield from kept[which]
        return
    got: list[Ref] = []
    if kept is not None:
        kept[which] = got  # filled as the first pass goes
    for load in loads:
        t = load()
        got.append(t)
        yield t


class Norm:
    """One batch-norm node: its operands and results, the per-feature arithmetic of its layout."""

    def __init__(self, lw: Lowering, node: Node, refs: list[Ref], outs: list[Ref], fi: int) -> None:
        self.lw, self.g, self.node, self.refs, self.outs, self.fi = lw, lw.graph, node, refs, outs, fi
        self.eps = float(node.attrs["epsilon"])
        self.shape = node.operands[0].shape
        self.C = self.shape[fi]
        self.M = math.prod(self.shape) // max(1, self.C)
        self.xt = onchip_dtype(device_dtype(node.operands[0].dtype))
        self.out_types = [onchip_dtype(device_dtype(t.dtype)) for t in node.type.leaves()]

    def run(self) -> None:
        raise NotImplementedError

    def f32(self, t: Ref) -> Ref:
        return t if t.dtype is dt.F32 else copy_new(self.lw, t, dt.F32)

    def store(self, out: Ref, t: Ref, k: int) -> None:
        """A result tile converted to result ``k``'s type and stored."""
        self.g.add("dma", "dma", out, t if t.dtype is self.out_types[k] else copy_new(self.lw, t, self.out_types[k]))


# --- features on the partitions ------------------------------------------------------------------------

class Rows(Norm):
    """Features on the partitions: ``[P, free...]`` tiles, per-feature values as ``[P, 1]`` scalars. A block
    of ``cn <= 64`` features with much data each takes ``S`` partitions per feature (``P = S * cn``;
    partition ``s * cn + c`` holds segment ``s`` of feature ``c``'s outermost dimension): statistics and
    sums per partition combine per feature through a TensorE matmul against a 0/1 block matrix, and the
    per-feature values go back to every partition of their feature through its transpose."""

    def run(self) -> None:
        others = [d for d in range(len(self.shape)) if d != self.fi]
        big = [self.refs[0], *([self.refs[4]] if self.node.op == "batch-norm-grad" else []), self.outs[0]]
        groups = merge_groups([r.permute(*others, self.fi) for r in big], others, [self.fi], self.shape, True)
        rest = sorted([gr for gr in groups if gr.kept], key=lambda gr: -gr.stride)
        self.sizes = [gr.size for gr in rest]
        order = [d for gr in rest for d in gr.dims]
        order += [d for d in others if d not in order]  # dimensions of one element
        self.views = [r.permute(self.fi, *order).reshape(self.C, *self.sizes) for r in big]
        for c0 in range(0, self.C, 128):
            cn = min(128, self.C - c0)
            self.block(c0, cn, self.segments(cn))

    def segments(self, cn: int) -> int:
        """Partitions per feature: as many as fit and divide the outermost free dimension, for large data."""
        if self.M < SPLIT_MIN:
            return 1
        return next((s for s in range(128 // cn, 1, -1) if self.sizes[0] % s == 0), 1)

    def setup(self, c0: int, cn: int, S: int) -> None:
        """The block's partitions, segment views, tiles and (with segments) its block matrices."""
        self.c0, self.cn, self.S, self.P = c0, cn, S, cn * S
        sizes = [self.sizes[0] // S, *self.sizes[1:]]
        self.seg = [[v.reshape(self.C, S, *sizes)[:, s] for s in range(S)] for v in self.views]
        bs = block_sizes(sizes, [False] * len(sizes), CHUNK_BYTES // 4, 1, False)
        self.tile_keys = [tuple(b[k] for k in range(len(sizes))) for b in blocks(sizes, bs, list(range(len(sizes))))]
        self.keep = self.M // S * 4 <= KEEP_BYTES
        if S > 1:
            e = (np.arange(self.P)[:, None] % cn == np.arange(cn)[None, :]).astype(np.float32)
            self.E = self.const_tile(e)
            self.ET = self.const_tile(np.ascontiguousarray(e.T))

    def const_tile(self, a: np.ndarray) -> Ref:
        t = self.g.tile(a.shape, dt.F32, "sbuf", "bnblk").ref()
        self.g.add("dma", "dma", t, self.lw.const(a, dt.F32, "bn_blocks"))
        return t

    def per_feature(self, t: Ref) -> Ref:
        """Sums of ``t`` ([P, k]) over each feature's partitions: ``[cn, k]``."""
        if self.S == 1:
            return t
        ps = self.g.tile((self.cn, t.shape[1]), dt.F32, "psum", "bnps").ref()
        self.g.add("pe", "matmul", ps, self.E, t, start=True, stop=True)
        return copy_new(self.lw, ps, dt.F32)

    def per_partition(self, t: Ref) -> Ref:
        """A per-feature ``[cn, k]`` on each of its feature's partitions: ``[P, k]``."""
        if self.S == 1:
            return t
        ps = self.g.tile((self.P, t.shape[1]), dt.F32, "psum", "bnps").ref()
        self.g.add("pe", "matmul", ps, self.ET, t, start=True, stop=True)
        return copy_new(self.lw, ps, dt.F32)

    def vec(self, r: Ref) -> Ref:
        """A per-feature operand as a ``[cn, 1]`` fp32 tile."""
        t = self.g.tile((self.cn, 1), onchip_dtype(r.dtype), "sbuf", "bnvec").ref()
        self.g.add("dma", "dma", t, r[self.c0:self.c0 + self.cn].reshape(self.cn, 1))
        return self.f32(t)

    def load(self, which: int, key: tuple[slice, ...]) -> Ref:
        cn = self.cn
        t = self.g.tile((self.P, *[s.stop - s.start for s in key]), onchip_dtype(self.views[which].dtype), "sbuf",
                        "bnx").ref()
        for s, v in enumerate(self.seg[which]):
            self.g.add("dma", "dma", t[s * cn:(s + 1) * cn], v[(slice(self.c0, self.c0 + cn), *key)])
        return t

    def store_tile(self, key: tuple[slice, ...], y: Ref) -> None:
        cn = self.cn
        for s, v in enumerate(self.seg[-1]):
            self.g.add("dma", "dma", v[(slice(self.c0, self.c0 + cn), *key)], y[s * cn:(s + 1) * cn])

    def tiles(self, which: int, kept: dict[int, list[Ref]] | None) -> Iterator[Ref]:
        """Every tile of operand ``which`` (0: x, 1: dy) of the feature block (see :func:`lazily`)."""
        return lazily([lambda key=key: self.load(which, key) for key in self.tile_keys], which, kept)

    def block(self, c0: int, cn: int, S: int) -> None:
        self.setup(c0, cn, S)
        g = self.g
        op = self.node.op
        kept: dict[int, list[Ref]] | None = {} if self.keep else None
        T = Tiles(g, (cn, 1), "bnv")
        if op == "batch-norm-inference":
            scale, offset, mean, var = (self.vec(r) for r in self.refs[1:5])
        elif op == "batch-norm-training":
            scale, offset = (self.vec(r) for r in self.refs[1:3])
            mean, var = self.stats(kept)
            self.store(self.outs[1][c0:c0 + cn], mean, 1)
            self.store(self.outs[2][c0:c0 + cn], var, 2)
        else:
            scale, mean, var = (self.vec(r) for r in self.refs[1:4])
        rstd = T.tile(dt.F32)
        g.add("act", "activation", rstd, var, func="rsqrt", bias=self.eps)
        if op == "batch-norm-grad":
            self.grad(kept, scale, mean, rstd)
            return
        mean_p, a_p, off_p = (self.per_partition(v) for v in (mean, T.binary("mul", scale, rstd, dt.F32), offset))
        for key, x in zip(self.tile_keys, self.tiles(0, kept)):
            t = Tiles(g, x.shape, "bny")
            u = t.tile(dt.F32)
            g.add("dve", "tensor_scalar", u, x, op0="sub", scalar0=mean_p, op1="mul", scalar1=a_p)
            y = t.tile(self.out_types[0])
            g.add("act", "activation", y, u, bias=off_p)
            self.store_tile(key, y)

    def stats(self, kept: dict[int, list[Ref]] | None) -> tuple[Ref, Ref]:
        """``[cn, 1]`` each: mean and population variance of every feature of the block. With segments, the
        partitions' (equal-count) statistics merge exactly: the mean of the means, and the mean of the
        variances plus the squared deviations of the means from it."""
        st = Stats(self.g, self.P)
        for x in self.tiles(0, kept):
            n = math.prod(x.shape[1:])
            flat = x.reshape(self.P, n)
            for k0 in range(0, n, BN_MAX):
                st.add(flat[:, k0:min(n, k0 + BN_MAX)])
        mv = st.result()
        if self.S == 1:
            return mv[:, 0:1], mv[:, 1:2]
        T = Tiles(self.g, (self.cn, 1), "bnv")
        mean = T.binary("mul", self.per_feature(mv[:, 0:1]), 1.0 / self.S, dt.F32)
        P = Tiles(self.g, (self.P, 1), "bnp")
        d = P.binary("sub", mv[:, 0:1], self.per_partition(mean), dt.F32)
        q = P.binary("add", P.binary("mul", d, d, dt.F32), mv[:, 1:2], dt.F32)
        return mean, T.binary("mul", self.per_feature(q), 1.0 / self.S, dt.F32)

    def grad(self, kept: dict[int, list[Ref]] | None, scale: Ref, mean: Ref, rstd: Ref) -> None:
        g = self.g
        P = self.P
        mean_p = self.per_partition(mean)
        n_t = len(self.tile_keys)
        sums = g.tile((P, 2, n_t), dt.F32, "sbuf", "bnsum").ref()  # per tile: sum dy, sum dy * (x - mean)
        for j, (x, dy) in enumerate(zip(self.tiles(0, kept), self.tiles(1, kept))):
            t = Tiles(g, x.shape, "bng")
            c = t.tile(dt.F32)
            g.add("dve", "tensor_scalar", c, x, op0="sub", scalar0=mean_p)
            gc = t.binary("mul", dy, c, dt.F32)
            g.add("dve", "tensor_reduce", sums[:, 1, j:j + 1], gc, op="add")
            junk = t.tile(dt.F32)
            g.add("act", "activation", junk, dy, accum=sums[:, 0, j:j + 1])
        tot = g.tile((P, 2), dt.F32, "sbuf", "bnsum").ref()
        g.add("dve", "tensor_reduce", tot, sums, op="add", axes=(2,))
        s = self.per_feature(tot)
        s_dy, s_gc = s[:, 0:1], s[:, 1:2]
        T = Tiles(g, (self.cn, 1), "bnv")
        inv_n = 1.0 / self.M
        c0, cn = self.c0, self.cn
        self.store(self.outs[1][c0:c0 + cn], T.binary("mul", s_gc, rstd, dt.F32), 1)
        self.store(self.outs[2][c0:c0 + cn], s_dy, 2)
        mean_g = T.binary("mul", s_dy, inv_n, dt.F32)
        k1 = T.binary("mul", T.binary("mul", T.binary("mul", rstd, rstd, dt.F32), s_gc, dt.F32), inv_n, dt.F32)
        k2 = T.binary("mul", scale, rstd, dt.F32)
        mg_p, k1_p, k2_p = (self.per_partition(v) for v in (mean_g, k1, k2))
        for key, x, dy in zip(self.tile_keys, self.tiles(0, kept), self.tiles(1, kept)):
            t = Tiles(g, x.shape, "bng")
            w = t.tile(dt.F32)
            g.add("dve", "tensor_scalar", w, x, op0="sub", scalar0=mean_p, op1="mul", scalar1=k1_p)
            v = t.binary("sub", dy, w, dt.F32)
            gx = t.tile(self.out_types[0])
            g.add("dve", "tensor_scalar", gx, v, op0="sub", scalar0=mg_p, op1="mul", scalar1=k2_p)
            self.store_tile(key, gx)


class Stats:
    """Running (count, mean, M2) of each partition's elements: ``bn_stats`` groups, merged :data:`GROUPS` at
    a time by ``bn_aggr``, whose (mean, variance) go on as triples (count, mean, variance * count) to the
    next level, merged alike (Chan's formula at every level)."""

    def __init__(self, g: Graph, cn: int) -> None:
        self.g = g
        self.cn = cn
        self.levels: list[tuple[Ref, list[int]]] = []  # per level: its tile and the counts of its triples

    def _level(self, k: int) -> tuple[Ref, list[int]]:
        while len(self.levels) <= k:
            t = self.g.tile((self.cn, 6 * GROUPS), dt.F32, "sbuf", "bnst").ref()
            self.levels.append((t, []))
        return self.levels[k]

    def add(self, src: Ref) -> None:
        n = math.prod(src.shape[1:])
        t, counts = self._level(0)
        j = len(counts)
        self.g.add("dve", "bn_stats", t[:, 3 * j:3 * j + 6], src)
        counts.extend([(n + 1) // 2, n // 2])
        if len(counts) == 2 * GROUPS:
            self._push(0)

    def _push(self, k: int) -> Ref:
        """Merge level ``k`` into one triple of level ``k + 1``; its (mean, variance)."""
        g = self.g
        t, counts = self.levels[k]
        mv = g.tile((self.cn, 2), dt.F32, "sbuf", "bnmv").ref()
        g.add("dve", "bn_aggr", mv, t[:, 0:3 * len(counts)])
        total = sum(counts)
        self.levels[k] = (g.tile((self.cn, 6 * GROUPS), dt.F32, "sbuf", "bnst").ref(), [])
        up, ucounts = self._level(k + 1)
        j = len(ucounts)
        g.add("dve", "memset", up[:, 3 * j:3 * j + 1], value=float(total))
        g.add("dve", "tensor_copy", up[:, 3 * j + 1:3 * j + 2], mv[:, 0:1])
        g.add("dve", "tensor_scalar", up[:, 3 * j + 2:3 * j + 3], mv[:, 1:2], op0="mul",
              scalar0=float(total))
        ucounts.append(total)
        if len(ucounts) == 2 * GROUPS:
            self._push(k + 1)
        return mv

    def result(self) -> Ref:
        """``[cn, 2]`` mean and variance of everything added: each level merged into the next, up to the
        highest that holds anything."""
        for k, (t, counts) in enumerate(self.levels):
            if not counts:
                continue
            if any(c for _, c in self.levels[k + 1:]):
                self._push(k)
                continue
            mv = self.g.tile((self.cn, 2), dt.F32, "sbuf", "bnmv").ref()
            self.g.add("dve", "bn_aggr", mv, t[:, 0:3 * len(counts)])
            return mv
        raise AssertionError("no statistics")


# --- features on the free axis ----------------------------------------------------------------------

class Cols(Norm):
    """Features along the free axis (x as ``[M, C]``, M split over the partitions as ``[A, B]``), per-feature
    values as ``[A, cb]`` tiles broadcast over the rest of a tile."""

    def run(self) -> None:
        others = [d for d in range(len(self.shape)) if d != self.fi]
        big = [self.refs[0], *([self.refs[4]] if self.node.op == "batch-norm-grad" else []), self.outs[0]]
        M, C = self.M, self.C
        self.A = min(128, M)
        self.B = M // self.A
        self.rem = M - self.A * self.B
        self.views = [r.permute(*others, self.fi).reshape(M, C) for r in big]
        keep = self.M // self.A * 4 * min(C, COLS) <= KEEP_BYTES
        for c0 in range(0, C, COLS):
            cb = min(COLS, C - c0)
            self.block(c0, cb, keep)

    def pieces(self, cb: int) -> list[tuple[int, int, int, int]]:
        """Tiles of a column block: (first row, partitions, rows per partition, columns)."""
        out = []
        bb = max(1, CHUNK_BYTES // 4 // cb)
        for b0 in range(0, self.B, bb):
            out.append((b0, self.A, min(bb, self.B - b0), cb))
        if self.rem:
            out.append((-1, self.rem, 1, cb))
        return out

    def view(self, which: int, piece: tuple[int, int, int, int], c0: int) -> Ref:
        b0, pn, bn, cb = piece
        v = self.views[which]
        A, B = self.A, self.B
        if b0 >= 0:
            return v[0:A * B, c0:c0 + cb].reshape(A, B, cb)[:, b0:b0 + bn, :]
        return v[A * B:self.M, c0:c0 + cb].reshape(pn, 1, cb)

    def tiles(self, which: int, c0: int, cb: int, kept: dict[int, list[Ref]] | None) -> Iterator[Ref]:
        def load(p: tuple[int, int, int, int]) -> Ref:
            v = self.view(which, p, c0)
            t = self.g.tile((p[1], p[2], cb), onchip_dtype(v.dtype), "sbuf", "bnx").ref()
            self.g.add("dma", "dma", t, v)
            return t

        return lazily([lambda p=p: load(p) for p in self.pieces(cb)], which, kept)

    def row(self, r: Ref, c0: int, cb: int) -> Ref:
        """A per-feature operand as a ``[1, cb]`` fp32 row."""
        t = self.g.tile((1, cb), onchip_dtype(r.dtype), "sbuf", "bnrow").ref()
        self.g.add("dma", "dma", t, r[c0:c0 + cb].reshape(1, cb))
        return self.f32(t)

    def bcast(self, row: Ref, cb: int) -> Ref:
        """A ``[1, cb]`` fp32 row on every partition: ``[A, cb]`` (TensorE: a one-row matmul)."""
        g = self.g
        ps = g.tile((self.A, cb), dt.F32, "psum", "bnbc").ref()
        g.add("pe", "matmul", ps, self.ones_row, row, start=True, stop=True)
        t = g.tile((self.A, cb), dt.F32, "sbuf", "bnb").ref()
        g.add("act", "activation", t, ps)
        return t

    def over(self, vec: Ref, x: Ref) -> Ref:
        """``vec`` ([A, cb]) seen with the shape of tile ``x`` ([pn, bn, cb])."""
        pn, bn, cb = x.shape
        return vec[0:pn].reshape(pn, 1, cb).broadcast(1, bn)

    def colsum(self, ps: Ref, tiles: list[Ref], first: bool, last: bool) -> None:
        """Accumulate the per-column sums of ``tiles`` into the PSUM row ``ps`` (a ones-vector matmul per row
        of each tile)."""
        g = self.g
        work = [(t, b) for t in tiles for b in range(t.shape[1])]
        for j, (t, b) in enumerate(work):
            g.add("pe", "matmul", ps, self.ones_col[0:self.A], pad_partitions(self.lw, t[:, b, :], self.A),
                  start=first and j == 0, stop=last and j == len(work) - 1)

    def block(self, c0: int, cb: int, keep: bool) -> None:
        g = self.g
        op = self.node.op
        kept: dict[int, list[Ref]] | None = {} if keep else None
        self.ones_col = g.tile((128, 1), dt.F32, "sbuf", "ones").ref()
        g.add("dve", "memset", self.ones_col, value=1.0)
        self.ones_row = g.tile((1, self.A), dt.F32, "sbuf", "ones").ref()
        g.add("dve", "memset", self.ones_row, value=1.0)
        R = Tiles(g, (1, cb), "bnr")
        if op == "batch-norm-inference":
            scale, offset, mean, var = (self.row(r, c0, cb) for r in self.refs[1:5])
        elif op == "batch-norm-training":
            scale, offset = (self.row(r, c0, cb) for r in self.refs[1:3])
            mean, var = self.stats(c0, cb, kept)
            self.store(self.outs[1][c0:c0 + cb].reshape(1, cb), mean, 1)
            self.store(self.outs[2][c0:c0 + cb].reshape(1, cb), var, 2)
        else:
            scale, mean, var = (self.row(r, c0, cb) for r in self.refs[1:4])
        rstd = R.tile(dt.F32)
        g.add("act", "activation", rstd, var, func="rsqrt", bias=self.eps)
        mean_b = self.bcast(mean, cb)
        if op == "batch-norm-grad":
            self.grad(c0, cb, kept, scale, mean_b, rstd)
            return
        a_b = self.bcast(R.binary("mul", scale, rstd, dt.F32), cb)
        off_b = self.bcast(offset, cb)
        for p, x in zip(self.pieces(cb), self.tiles(0, c0, cb, kept)):
            t = Tiles(g, x.shape, "bny")
            u = t.binary("sub", x, self.over(mean_b, x), dt.F32)
            w = t.binary("mul", u, self.over(a_b, x), dt.F32)
            y = t.tile(self.out_types[0])
            g.add("pool" if not self.lw.target.spec["port_conflicts"] else "dve", "tensor_tensor", y, w,
                  self.over(off_b, x), op="add")
            g.add("dma", "dma", self.view(-1, p, c0), y)

    def stats(self, c0: int, cb: int, kept: dict[int, list[Ref]] | None) -> tuple[Ref, Ref]:
        """``[1, cb]`` rows: mean and population variance of each feature, shifted by its first element."""
        g = self.g
        s_row = g.tile((1, cb), onchip_dtype(self.views[0].dtype), "sbuf", "bnrow").ref()
        g.add("dma", "dma", s_row, self.views[0][0:1, c0:c0 + cb])
        s_row = self.f32(s_row)
        s_b = self.bcast(s_row, cb)
        ps1 = g.tile((1, cb), dt.F32, "psum", "bnps").ref()
        ps2 = g.tile((1, cb), dt.F32, "psum", "bnps").ref()
        n = len(self.pieces(cb))
        for j, x in enumerate(self.tiles(0, c0, cb, kept)):
            t = Tiles(g, x.shape, "bns")
            d = t.binary("sub", x, self.over(s_b, x), dt.F32)
            d2 = t.act("square", d, dt.F32)
            self.colsum(ps1, [d], j == 0, j == n - 1)
            self.colsum(ps2, [d2], j == 0, j == n - 1)
        R = Tiles(g, (1, cb), "bnr")
        inv = 1.0 / self.M
        md = R.tile(dt.F32)
        g.add("dve", "tensor_scalar", md, ps1, op0="mul", scalar0=inv)
        m2 = R.tile(dt.F32)
        g.add("dve", "tensor_scalar", m2, ps2, op0="mul", scalar0=inv)
        var = R.binary("sub", m2, R.binary("mul", md, md, dt.F32), dt.F32)
        var = R.binary("max", var, 0.0, dt.F32)
        mean = R.binary("add", md, s_row, dt.F32)
        return mean, var

    def grad(self, c0: int, cb: int, kept: dict[int, list[Ref]] | None, scale: Ref, mean_b: Ref, rstd: Ref) -> None:
        g = self.g
        n = len(self.pieces(cb))
        xs = self.tiles(0, c0, cb, kept)
        dys = self.tiles(1, c0, cb, kept)
        ps1 = g.tile((1, cb), dt.F32, "psum", "bnps").ref()
        ps2 = g.tile((1, cb), dt.F32, "psum", "bnps").ref()
        for j, (x, dy) in enumerate(zip(xs, dys)):
            t = Tiles(g, x.shape, "bng")
            c = t.binary("sub", x, self.over(mean_b, x), dt.F32)
            gc = t.binary("mul", dy, c, dt.F32)
            dyf = self.f32(dy) if dy.dtype is not dt.F32 else dy
            self.colsum(ps1, [dyf], j == 0, j == n - 1)
            self.colsum(ps2, [gc], j == 0, j == n - 1)
        R = Tiles(g, (1, cb), "bnr")
        s_dy = R.tile(dt.F32)
        g.add("dve", "tensor_copy", s_dy, ps1)
        s_gc = R.tile(dt.F32)
        g.add("dve", "tensor_copy", s_gc, ps2)
        inv = 1.0 / self.M
        self.store(self.outs[1][c0:c0 + cb].reshape(1, cb), R.binary("mul", s_gc, rstd, dt.F32), 1)
        self.store(self.outs[2][c0:c0 + cb].reshape(1, cb), s_dy, 2)
        k1 = R.binary("mul", R.binary("mul", R.binary("mul", rstd, rstd, dt.F32), s_gc, dt.F32), inv, dt.F32)
        k1_b = self.bcast(k1, cb)
        mg_b = self.bcast(R.binary("mul", s_dy, inv, dt.F32), cb)
        k2_b = self.bcast(R.binary("mul", scale, rstd, dt.F32), cb)
        for p, x, dy in zip(self.pieces(cb), self.tiles(0, c0, cb, kept), self.tiles(1, c0, cb, kept)):
            t = Tiles(g, x.shape, "bng")
            c = t.binary("sub", x, self.over(mean_b, x), dt.F32)
            w = t.binary("mul", c, self.over(k1_b, x), dt.F32)
            v = t.binary("sub", dy, w, dt.F32)
            u = t.binary("sub", v, self.over(mg_b, x), dt.F32)
            gx = t.binary("mul", u, self.over(k2_b, x), self.out_types[0])
            g.add("dma", "dma", self.view(-1, p, c0), gx)


def expand_inference(module: Module) -> Module:
    """An fp32 ``batch-norm-inference`` as the elementwise operators its kernel runs (device-forms):
    ``(x - mean) * (scale * rsqrt(var + eps)) + offset`` in fp32, the same steps in the same order. As
    operators of their own the batch norm's steps join the elementwise cluster around them: after a
    convolution they are its evacuation's per-channel steps, before one (a pre-activation ResNet's
    batch norm and ReLU) a step of the residual add's pass, where the kernel read its input from HBM and
    stored its result there (Relay's ResNet-50: 30 MB of its 98 MB of spill)."""
    from nxsat.backend.elementwise import is_elementwise
    from nxsat.backend.precision import folded
    from nxsat.builder import infer_type
    from nxsat.passes import rewrite_module

    order = module.entry.post_order()
    readers: dict[int, list[Node]] = {}
    for n in order:
        for o in n.operands:
            readers.setdefault(o.id, []).append(n)
    # only where there is a neighbour to fuse with: a batch norm of a model input that the model returns
    # runs faster as the kernel, whose few features spread over all the partitions (batch_norm_extract:
    # 18.4 us, 19.9 as a pass on its 32 features' partitions)
    chosen = {n.id for n in order if n.op == "batch-norm-inference" and n.dtype is dt.F32
              and (n.operands[0].op not in ("parameter", "constant")
                   or any(is_elementwise(r) for r in readers.get(n.id, ())))}
    if not chosen:
        return module

    def mk(op: str, operands: list[Node], like: Node, **attrs: Any) -> Node:
        return Node(op, operands, attrs, infer_type(op, operands, attrs, like.loc), "", like.loc)

    def expand(rw: Any, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
        if node.id not in chosen or any(o.dtype is not dt.F32 for o in ops):
            return None
        x, scale, offset, mean, var = ops
        fi = attrs["feature_index"]
        shape = tuple(x.shape)

        def spread(v: Node) -> Node:
            return mk("broadcast", [v], node, shape=shape, dimensions=(fi,))

        eps = mk("broadcast", [Node("constant", [], {"value": np.float32(attrs["epsilon"])},
                                    TensorType(dt.F32, ()), "", node.loc)], node, shape=tuple(var.shape),
                 dimensions=())
        factor = mk("multiply", [scale, mk("rsqrt", [mk("add", [var, eps], node)], node)], node)
        if scale.op == "constant" and var.op == "constant":  # a Relay model's: computed now, not at run time
            factor = folded(factor)
        centred = mk("subtract", [x, spread(mean)], node)
        out = mk("add", [mk("multiply", [centred, spread(factor)], node), spread(offset)], node)
        return Node(out.op, list(out.operands), dict(out.attrs), out.type, node.name, node.loc)

    return rewrite_module(module, expand)

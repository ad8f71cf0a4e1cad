"""Fused operators (nxsat/ops/fused.py): the patterns model-type rule sets recognise, each run as one
kernel instead of the passes its pattern would take (docs/backend.md, "Fused operators").

- activations (gelu-tanh, silu): one ScalarE instruction, emitted like any elementwise operator, so they
  join fused passes and epilogues;
- softmax and layer-norm over the last dimension: rows on the partitions in ``[P, k, L]`` tiles (one DMA
  in and one out, each partition's rows contiguous in HBM; :func:`nxsat.extract.plan.softmax_rows`, which
  the cost model prices too; a layer norm's ``k`` is 1, the dots' row tiling, so that its input and result
  stay on chip between them: :func:`~nxsat.extract.plan.layer_norm_rows`), fp32 between load and store,
  software-pipelined (the next tile's
  VectorE statistics are issued before this tile's ScalarE pass); a layer norm hosts the elementwise
  cluster reading it (its scale and shift) as an epilogue;
- a softmax whose scores a dot computes is computed by that dot, on its result tiles as they leave
  PSUM (:func:`plan_softmax_hosts`): attention's scores never go to HBM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from nxsat import dtypes as dt
from nxsat.backend.affine import rows_keep, tile_params, virtual, whole_tile
from nxsat.backend.elementwise import Kernel, elementwise, emits
from nxsat.backend.epilogue import Epilogue, epilogue
from nxsat.backend.graph import Graph, Ref
from nxsat.backend.lower import Lowering, _origin, device_dtype, hosts, lowers, onchip_dtype, plans
from nxsat.backend.tiles import Operand, is_num
from nxsat.diagnostics import error
from nxsat.extract.plan import (
    BN_STATS_MAX,
    GROUP_NORM_RESIDENT,
    LAYER_NORM_MAX_ROW,
    hosts_rows,
    layer_norm_rows,
    matmul_plan,
    softmax_rows,
)
from nxsat.ir import Node
from nxsat.ops.fused import ACTIVATIONS

F32 = dt.F32


lowers(*ACTIVATIONS)(elementwise)  # lowered with the fused pass (or epilogue) of the cluster holding them


@emits(*ACTIVATIONS)
def _activation(k: Kernel, node: Node, ops: list[Operand]) -> Ref:
    """A fused activation (gelu-tanh, silu): one ScalarE instruction, so it joins fused passes and
    epilogues as any elementwise operator does."""
    x = ops[0]
    if is_num(x):
        x = k.t.memset(x, F32)
    return k.t.act(ACTIVATIONS[node.op][1], x, onchip_dtype(device_dtype(node.dtype)))


@lowers("softmax")
def softmax(lw: Lowering, node: Node) -> None:
    """Per tile: VectorE's maximum of each row; ScalarE's ``exp(scale * x - scale * max)`` row by row (a
    folded scale costs nothing), the row's sum accumulated by the same instruction (activation's
    ``accum``); VectorE's reciprocals of the sums and ScalarE's multiply of each row by its own (the
    activation's per-partition scale) into the result's type. One read and one write of the data where
    the pattern reads the scores three times and writes the exponentials once more. Measured on a
    [2048, 4096] bf16 softmax: 220.9 us in tile order with the multiply on VectorE, 175.9 pipelined,
    155.4 with the multiply on ScalarE."""
    written = written_as(lw, node)
    if written.id in lw.values:
        return  # computed by the dot it reads (plan_softmax_hosts)
    x = node.operands[0]
    shape = x.shape
    if node.attrs["dimension"] != len(shape) - 1:
        raise error("NCC_EUOC002", f"softmax {node.name}: only the last dimension is supported on the "
                    f"NeuronCore (dimension {node.attrs['dimension']} of {list(shape)})", node.loc)
    L = shape[-1]
    R = math.prod(shape[:-1])
    out = lw.result(written)
    if R == 0 or L == 0:
        return
    src = lw.view(lw.ref(x), lambda r: r.reshape(R, L), x)
    dst = out.reshape(R, L)
    g = lw.graph
    part = lw.target.partitions
    k_max = softmax_rows(L, R, part)
    in_t = onchip_dtype(src.dtype)
    out_t = onchip_dtype(dst.dtype)
    scale = float(node.attrs.get("scale", 1.0))  # max(scale * x) is scale * min(x) when scale < 0
    def load(r0: int, pn: int, k: int) -> tuple[Ref, Ref]:
        xt = g.tile((pn, k, L), in_t, "sbuf", "smx").ref()
        g.load(xt, src[r0:r0 + pn * k].reshape(pn, k, L))
        return xt, _maxima(g, xt, scale)

    def finish(r0: int, pn: int, k: int, xt: Ref, neg: Ref) -> None:
        g.add("dma", "dma", dst[r0:r0 + pn * k].reshape(pn, k, L), _normalized(g, xt, neg, scale, out_t))

    _pipelined(_row_tiles(R, part, k_max), load, finish)


def written_as(lw: Lowering, s: Node) -> Node:
    """The node whose value a softmax's kernel writes: the narrowing cast that alone reads it when lowering
    left the cast to it (``lower._fused_source``: the kernel rounds its fp32 result to the cast's type,
    as the cast would, and the dot that multiplies in that type loads half the bytes), else the
    softmax."""
    from nxsat.backend.lower import _fused_source

    c = narrowing_reader(lw, s)
    return c if c is not None and _fused_source(lw, c) else s


def narrowing_reader(lw: Lowering, n: Node) -> Node | None:
    """The cast to a narrower float that alone reads ``n`` (left to lowering, not a reader's absorbed cast):
    a kernel that computes ``n`` in fp32 can round as it writes and store the cast's value instead."""
    readers = lw.consumers.get(n.id, set())
    if len(readers) != 1 or n.id in lw.output_of:
        return None
    c = lw.node(next(iter(readers)))
    narrowing = c.op == "convert" and c.dtype.is_float and n.dtype.is_float and c.dtype.itemsize < n.dtype.itemsize
    return c if narrowing and c.id not in lw.absorbed else None


def _maxima(g: Graph, xt: Ref, scale: float, engine: str = "dve") -> Ref:
    """``-max(scale * x)`` of each row of ``xt`` (``[P, k, L]``): the exponential's bias, ``[P, k]`` fp32."""
    pn, k, _ = xt.shape
    mx = g.tile((pn, k), F32, "sbuf", "smmax").ref()
    g.add(engine, "tensor_reduce", mx, xt, op="max" if scale >= 0 else "min", axes=(2,))
    neg = g.tile((pn, k), F32, "sbuf", "smneg").ref()
    g.add("dve", "tensor_scalar", neg, mx, op0="mul", scalar0=-scale)
    return neg


def _normalized(g: Graph, xt: Ref, neg: Ref, scale: float, out_t: dt.DType) -> Ref:
    """The softmax of each row of ``xt`` (``[P, k, L]``) given its bias, in ``out_t``: ScalarE's exp with
    the row's sum accumulated, VectorE's reciprocals, ScalarE's multiply by them."""
    pn, k, L = xt.shape
    et = g.tile((pn, k, L), F32, "sbuf", "smexp").ref()
    sums = g.tile((pn, k), F32, "sbuf", "smsum").ref()
    for j in range(k):
        g.add("act", "activation", et[:, j], xt[:, j], func="exp", scale=scale, bias=neg[:, j:j + 1],
              accum=sums[:, j:j + 1])
    rec = g.tile((pn, k), F32, "sbuf", "smrec").ref()
    g.add("dve", "activation", rec, sums, func="reciprocal")
    yt = g.tile((pn, k, L), out_t, "sbuf", "smy").ref()
    for j in range(k):  # ScalarE again (1.4 GHz; VectorE's reduce reads the next tile meanwhile)
        g.add("act", "activation", yt[:, j], et[:, j], scale=rec[:, j:j + 1], bias=0.0)
    return yt


def _least(g: Graph, negs: list[Ref]) -> Ref:
    """The row's bias from its tiles' (``-max`` of each, ``[P, 1]``): their minimum."""
    both = g.tile((negs[0].shape[0], len(negs)), F32, "sbuf", "smparts").ref()
    for t, n in enumerate(negs):
        g.add("dve", "tensor_copy", both[:, t:t + 1], n.reshape(n.shape[0], 1))
    neg = g.tile((negs[0].shape[0], 1), F32, "sbuf", "smneg").ref()
    g.add("dve", "tensor_reduce", neg, both, op="min", axes=(1,))
    return neg


def _normalized_row(g: Graph, parts: list[Ref], neg: Ref, scale: float, out_t: dt.DType, defer: bool = False
                    ) -> tuple[list[Ref], Ref]:
    """The softmax of rows held as consecutive tiles (``[P, 1, n]`` each) given the rows' bias: ScalarE's
    exp of each tile with its sums accumulated in a column of its own, VectorE's total and reciprocals,
    ScalarE's multiply of each tile; ``[P, n]`` tiles in ``out_t``, and the reciprocals (``[P, 1]``).
    ``defer``: no multiply; the exponentials (in ``out_t``) are the tiles, and the reader scales its
    products by the reciprocals instead (flash attention's deferred normalization)."""
    pn = parts[0].shape[0]
    sums = g.tile((pn, len(parts)), F32, "sbuf", "smsum").ref()
    ets = []
    for t, xt in enumerate(parts):
        et = g.tile((pn, xt.shape[2]), out_t if defer else F32, "sbuf", "smexp").ref()
        g.add("act", "activation", et, xt[:, 0], func="exp", scale=scale, bias=neg.reshape(pn, 1),
              accum=sums[:, t:t + 1])
        ets.append(et)
    total = g.tile((pn, 1), F32, "sbuf", "smtot").ref()
    g.add("dve", "tensor_reduce", total, sums, op="add", axes=(1,))
    rec = g.tile((pn, 1), F32, "sbuf", "smrec").ref()
    g.add("dve", "activation", rec, total, func="reciprocal")
    if defer:
        return ets, rec
    out = []
    for et in ets:
        yt = g.tile(et.shape, out_t, "sbuf", "smy").ref()
        g.add("act", "activation", yt, et, scale=rec, bias=0.0)
        out.append(yt)
    return out, rec


# --- layer normalization ----------------------------------------------------------------------------

hosts("layer-norm")


@lowers("layer-norm")
def layer_norm(lw: Lowering, node: Node) -> None:
    """Rows on the partitions, ``[P, k, L]`` tiles (``k`` from ``layer_norm_rows``: one). Per row VectorE's
    ``bn_stats`` over every 512 elements and ``bn_aggr`` merging them (mean and variance in one pass, Chan's
    formula); per tile ScalarE's ``rsqrt(var + eps)`` and VectorE's ``-mean * rstd``; per row one ScalarE pass
    ``x * rstd - mean * rstd`` into the result's type. The elementwise cluster reading the result (a layer
    norm's scale and shift) runs on each tile as its epilogue (backend/epilogue.py); tiles are
    software-pipelined as the softmax's (the next tile's statistics before this tile's pass)."""
    x = node.operands[0]
    shape = x.shape
    L = shape[-1]
    R = math.prod(shape[:-1])
    if L > LAYER_NORM_MAX_ROW:
        raise error("NCC_EUOC002", f"layer-norm {node.name}: rows of {L:,} elements are over the "
                    f"{LAYER_NORM_MAX_ROW:,} one bn_aggr merges", node.loc)
    if R == 0 or L == 0:  # nothing to compute: an empty result (its readers run on their own)
        lw.result(node)
        return
    ep = epilogue(lw, node, lambda r: r.reshape(R, L))
    src = lw.view(lw.ref(x), lambda r: r.reshape(R, L), x)
    g = lw.graph
    part = lw.target.partitions
    k_max = layer_norm_rows(L, R, part)
    in_t = onchip_dtype(src.dtype)
    out_t = onchip_dtype(device_dtype(node.dtype))
    eps = float(node.attrs.get("epsilon", 0.0))
    chunks = [(c0, min(BN_STATS_MAX, L - c0)) for c0 in range(0, L, BN_STATS_MAX)]

    def load(r0: int, pn: int, k: int) -> tuple[Ref, Ref, Ref]:
        xt = g.tile((pn, k, L), in_t, "sbuf", "lnx").ref()
        g.load(xt, src[r0:r0 + pn * k].reshape(pn, k, L))
        mv = g.tile((pn, k, 2), F32, "sbuf", "lnmv").ref()
        for j in range(k):
            st = g.tile((pn, 6 * len(chunks)), F32, "sbuf", "lnst").ref()
            for c, (c0, cn) in enumerate(chunks):
                g.add("dve", "bn_stats", st[:, 6 * c:6 * c + 6], xt[:, j, c0:c0 + cn])
            g.add("dve", "bn_aggr", mv[:, j], st)
        rstd = g.tile((pn, k), F32, "sbuf", "lnrstd").ref()
        g.add("act", "activation", rstd, mv[:, :, 1], func="rsqrt", bias=eps)
        nb = g.tile((pn, k), F32, "sbuf", "lnnb").ref()  # -mean * rstd, the pass's bias
        if k == 1:  # rstd a per-partition scalar: one instruction, (mean * rstd) * -1 (the same bits)
            g.add("dve", "tensor_scalar", nb, mv[:, :, 0], op0="mul", scalar0=rstd, op1="mul", scalar1=-1.0)
        else:
            g.add("dve", "tensor_tensor", nb, mv[:, :, 0], rstd, op="mul")
            g.add("dve", "tensor_scalar", nb, nb, op0="mul", scalar0=-1.0)
        return xt, rstd, nb

    def finish(r0: int, pn: int, k: int, xt: Ref, rstd: Ref, nb: Ref) -> None:
        yt = g.tile((pn, k, L), out_t, "sbuf", "lny").ref()
        for j in range(k):
            g.add("act", "activation", yt[:, j], xt[:, j], scale=rstd[:, j:j + 1], bias=nb[:, j:j + 1])
        ep.tile(lambda r: r[r0:r0 + pn * k].reshape(pn, k, L), yt)

    _pipelined(_row_tiles(R, part, k_max), load, finish)
    ep.flush()


# --- RMS normalization ------------------------------------------------------------------------------

hosts("rms-norm")


@lowers("rms-norm")
def rms_norm(lw: Lowering, node: Node) -> None:
    """The layer norm's ``[P, k, L]`` row tiles. Per row one ScalarE square with the row's sum accumulated
    by the same instruction; per tile one ScalarE ``rsqrt(sum / L + eps)``; per row one ScalarE pass
    ``x * rstd`` into the result's type, and the elementwise cluster reading it (Gemma's ``1 + scale``)
    as the epilogue. VectorE has nothing to do: it is free for the neighbouring passes."""
    x = node.operands[0]
    L = x.shape[-1]
    R = math.prod(x.shape[:-1])
    if R == 0 or L == 0:
        lw.result(node)
        return
    ep = epilogue(lw, node, lambda r: r.reshape(R, L))
    src = lw.view(lw.ref(x), lambda r: r.reshape(R, L), x)
    g = lw.graph
    in_t = onchip_dtype(src.dtype)
    out_t = onchip_dtype(device_dtype(node.dtype))
    eps = float(node.attrs.get("epsilon", 0.0))

    def load(r0: int, pn: int, k: int) -> tuple[Ref, Ref]:
        xt = g.tile((pn, k, L), in_t, "sbuf", "rmsx").ref()
        g.load(xt, src[r0:r0 + pn * k].reshape(pn, k, L))
        ss = g.tile((pn, k), F32, "sbuf", "rmsss").ref()
        sq = g.tile((pn, L), F32, "sbuf", "rmssq").ref()  # the squares themselves are not kept
        for j in range(k):
            g.add("act", "activation", sq, xt[:, j], func="square", accum=ss[:, j:j + 1])
        rstd = g.tile((pn, k), F32, "sbuf", "rmsrstd").ref()
        g.add("act", "activation", rstd, ss, func="rsqrt", scale=1.0 / L, bias=eps)
        return xt, rstd

    def finish(r0: int, pn: int, k: int, xt: Ref, rstd: Ref) -> None:
        yt = g.tile((pn, k, L), out_t, "sbuf", "rmsy").ref()
        for j in range(k):
            g.add("act", "activation", yt[:, j], xt[:, j], scale=rstd[:, j:j + 1], bias=0.0)
        ep.tile(lambda r: r[r0:r0 + pn * k].reshape(pn, k, L), yt)

    _pipelined(_row_tiles(R, lw.target.partitions, layer_norm_rows(L, R, lw.target.partitions)), load, finish)
    ep.flush()


# --- group normalization ----------------------------------------------------------------------------

hosts("group-norm")


@lowers("group-norm")
def group_norm(lw: Lowering, node: Node) -> None:
    """Per batch, its positions on the partitions in ``[P, k, C]`` tiles (the layer norm's tiles over rows
    of C channels). Per tile, VectorE's sums of x and (ScalarE's squares) of x^2 over each group's
    positions and channels in one ``tensor_reduce`` each; TensorE's ones-matmul adds the tiles' sums
    across the partitions into one PSUM bank, which also hands every partition the totals; then per
    group the mean, ``var = max(E[x^2] - mean^2, 0)`` (what Flax's pattern computes, in fp32) and
    ``rstd``; per tile two VectorE passes ``x * rstd - mean * rstd`` with the group's values read
    through stride-0 views, and the elementwise cluster reading the result (its scale and shift, a SiLU)
    as the epilogue. A batch whose tiles fit :data:`~nxsat.extract.plan.GROUP_NORM_RESIDENT` per
    partition is loaded once; a larger one is loaded again for the second pass."""
    x = node.operands[0]
    N, C = x.shape[0], x.shape[-1]
    R = math.prod(x.shape[1:-1])
    G = int(node.attrs["groups"])
    cg = C // G
    if N * R * C == 0:
        lw.result(node)
        return
    ep = epilogue(lw, node, lambda r: r.reshape(N * R, C))
    src = lw.view(lw.ref(x), lambda r: r.reshape(N * R, C), x)
    g = lw.graph
    part = lw.target.partitions
    in_t = onchip_dtype(src.dtype)
    out_t = onchip_dtype(device_dtype(node.dtype))
    eps = float(node.attrs.get("epsilon", 0.0))
    tiles = _row_tiles(R, part, layer_norm_rows(C, R, part))
    hold = R * C * 4 <= GROUP_NORM_RESIDENT * part
    ones = g.tile((min(part, R), part), F32, "sbuf", "gnones").ref()
    g.add("dve", "memset", ones, value=1.0)

    def load(n: int, r0: int, pn: int, k: int) -> Ref:
        xt = g.tile((pn, k, C), in_t, "sbuf", "gnx").ref()
        g.add("dma", "dma", xt, src[n * R + r0:n * R + r0 + pn * k].reshape(pn, k, C))
        return xt

    for n in range(N):
        acc = g.tile((part, 2 * G), F32, "psum", "gnacc").ref()
        held = []
        for i, (r0, pn, k) in enumerate(tiles):
            xt = load(n, r0, pn, k)
            st = g.tile((pn, 2 * G), F32, "sbuf", "gnst").ref()
            g.add("dve", "tensor_reduce", st[:, :G], xt.reshape(pn, k, G, cg), op="add", axes=(1, 3))
            sq = g.tile((pn, k, C), F32, "sbuf", "gnsq").ref()
            g.add("act", "activation", sq, xt, func="square")
            g.add("dve", "tensor_reduce", st[:, G:], sq.reshape(pn, k, G, cg), op="add", axes=(1, 3))
            g.add("pe", "matmul", acc, ones[:pn, :], st, start=i == 0, stop=i == len(tiles) - 1)
            held.append(xt if hold else None)
        mom = g.tile((part, 2 * G), F32, "sbuf", "gnmom").ref()  # mean | E[x^2] on every partition
        g.add("act", "activation", mom, acc, scale=1.0 / (R * cg))
        var = g.tile((part, G), F32, "sbuf", "gnvar").ref()
        g.add("dve", "tensor_tensor", var, mom[:, :G], mom[:, :G], op="mul")
        g.add("dve", "tensor_tensor", var, mom[:, G:], var, op="sub")
        g.add("dve", "tensor_scalar", var, var, op0="max", scalar0=0.0)
        rstd = g.tile((part, G), F32, "sbuf", "gnrstd").ref()
        g.add("act", "activation", rstd, var, func="rsqrt", bias=eps)
        nb = g.tile((part, G), F32, "sbuf", "gnnb").ref()  # -mean * rstd
        g.add("dve", "tensor_tensor", nb, mom[:, :G], rstd, op="mul")
        g.add("dve", "tensor_scalar", nb, nb, op0="mul", scalar0=-1.0)
        for (r0, pn, k), xt in zip(tiles, held):
            xt = xt if xt is not None else load(n, r0, pn, k)
            per = (pn, k, G, cg)
            scaled = g.tile(per, F32, "sbuf", "gnmul").ref()
            g.add("dve", "tensor_tensor", scaled, xt.reshape(*per), _per_group(rstd[:pn], k, cg), op="mul")
            yt = g.tile((pn, k, C), out_t, "sbuf", "gny").ref()
            g.add("dve", "tensor_tensor", yt.reshape(*per), scaled, _per_group(nb[:pn], k, cg), op="add")
            base = n * R + r0
            ep.tile(lambda r, base=base, pn=pn, k=k: r[base:base + pn * k].reshape(pn, k, C), yt)
    ep.flush()


def _per_group(v: Ref, k: int, cg: int) -> Ref:
    """A ``[P, G]`` value seen as ``[P, k, G, cg]``: each group's number over its rows and channels."""
    pn, G = v.shape
    return v.reshape(pn, 1, G, 1).broadcast(1, k).broadcast(3, cg)


def _pipelined(tiles: list[tuple[int, int, int]], first: Callable[..., tuple], then: Callable[..., None]) -> None:
    """Software pipelining of row tiles: ``first`` (the load and VectorE's statistics) of the next tile is
    issued before ``then`` (ScalarE's pass and the store) of this one, so the engines work on
    neighbouring tiles at once."""
    ahead = first(*tiles[0])
    for i, tile in enumerate(tiles):
        done = ahead
        if i + 1 < len(tiles):
            ahead = first(*tiles[i + 1])
        then(*tile, *done)


def _row_tiles(R: int, part: int, k_max: int) -> list[tuple[int, int, int]]:
    """(first row, partitions, rows per partition) of each tile: ``[part, k]`` rows while there are that
    many, the rest ``part`` at a time, then fewer partitions."""
    tiles = []
    r0 = 0
    while r0 < R:
        left = R - r0
        pn, k = (part, min(k_max, left // part)) if left >= part else (left, 1)
        tiles.append((r0, pn, k))
        r0 += pn * k
    return tiles


# --- a softmax computed by the dot whose result it reads ---------------------------------------------

@dataclass(frozen=True)
class ProbsReader:
    """The dot that alone reads a hosted softmax's probabilities (attention's ``P @ V``), through
    ``chain`` (reshapes, the cast to its multiply type): computed on the probabilities' row blocks as
    they are made, so they never reach HBM. ``side``: which of its operands the probabilities are."""

    dot: Node
    side: int
    chain: tuple[Node, ...]


@dataclass(frozen=True)
class SoftmaxHost:
    """The dot computes ``softmax`` on its result tiles: ``source`` is the softmax's operand (the dot
    itself, or a value of the elementwise cluster the dot runs as its epilogue: BERT's scaled and
    masked scores), ``chain`` the reshapes between them; ``reader``: the dot reading the probabilities
    that it computes too."""

    softmax: Node
    source: Node
    chain: tuple[Node, ...]
    reader: ProbsReader | None = None

    @property
    def claimed(self) -> set[int]:
        """The reshapes: views of values that never reach HBM; with a ``reader``, the softmax and the chain
        to it too. (Without one the softmax is not claimed: the dot sets its value, and the softmax's
        own lowering then has nothing to do.)"""
        out = {n.id for n in self.chain}
        if self.reader is not None:
            out |= {self.softmax.id, *(n.id for n in self.reader.chain)}
        return out


@plans
def plan_softmax_hosts(lw: Lowering, order: list[Node]) -> None:
    """A softmax whose operand a dot computes (its result, or a value of the cluster that reads it, through
    reshapes nothing else reads), when one result tile holds whole rows (the plan's N tile covers the
    softmax's last dimension): the dot computes the softmax on each tile as it leaves PSUM (attention's
    scores never go to HBM). The reshapes are claimed (``Lowering.absorbed``); the dot gives them back
    when its epilogue does not take the cluster after all (:func:`softmax_epilogue`)."""
    for s in order:
        if s.op != "softmax" or s.attrs["dimension"] != len(s.shape) - 1:
            continue
        chain: list[Node] = []
        x = s.operands[0]
        while x.op == "reshape":
            chain.append(x)
            x = x.operands[0]
        seq = [x, *chain[::-1], s]  # source -> reshapes -> softmax: each read by the next alone
        if any(a.id in lw.output_of or lw.consumers.get(a.id) != {b.id} for a, b in zip(seq, seq[1:])):
            continue
        dot = x if x.op == "dot" else _cluster_dot(lw, x)
        if dot is None or dot.id in lw.plan or not dot.dtype.is_float:
            continue
        from nxsat.backend.matmul import dot_dims, operand_type  # matmul.py imports this module

        _, _, (B, M, K, N) = dot_dims(dot)
        mt = operand_type(dot.operands[0].dtype, dot.operands[1].dtype, lw)  # as backend/matmul.py decides it
        if N != s.shape[-1] or not hosts_rows(matmul_plan(M, K, N, mt.name, lw.target), N):
            continue
        host = SoftmaxHost(s, x, tuple(chain), _probs_reader(lw, s, B, M, N))
        lw.plan[dot.id] = host
        lw.absorbed |= host.claimed


def _probs_reader(lw: Lowering, s: Node, B: int, M: int, N: int) -> ProbsReader | None:
    """The dot that alone reads the probabilities of ``s`` (``[B..., M, N]`` rows of the hosting dot's
    batches), through reshapes and a float cast nothing else reads, contracting their last dimension
    with the batches in order; its other operand's free size fits the array's columns (when the
    probabilities are the moving operand) or one PSUM bank (when they are the stationary one)."""
    from nxsat.backend.matmul import dot_dims  # matmul.py imports this module

    chain: list[Node] = []
    x = s
    while True:
        readers = lw.consumers.get(x.id, set())
        if x.id in lw.output_of or len(readers) != 1:
            return None
        r = lw.node(next(iter(readers)))
        if r.op == "reshape" or (r.op == "convert" and r.dtype.is_float and r.id not in lw.absorbed):
            chain.append(r)
            x = r
            continue
        break
    if r.op != "dot" or not r.dtype.is_float or [o.id for o in r.operands].count(x.id) != 1:
        return None
    side = 0 if r.operands[0] is x else 1
    d = r.attrs["dims"]
    batch, contracting = (d.lhs_batch, d.lhs_contracting) if side == 0 else (d.rhs_batch, d.rhs_contracting)
    rank = len(x.shape)
    if tuple(batch) != tuple(range(rank - 2)) or tuple(contracting) != (rank - 1,) or x.shape[-2:] != (M, N):
        return None
    _, _, (Bp, Mp, Kp, Np) = dot_dims(r)
    if Bp != B or Kp != N:
        return None
    width = Np if side == 0 else Mp  # the other operand's free size
    if width > (lw.target.psum_bank_bytes // 4 if side == 0 else lw.target.matmul["cols"]):
        return None
    return ProbsReader(r, side, tuple(chain))


def require_probs_reader(lw: Lowering, dot: Node) -> None:
    """Before ``dot`` hosts a softmax whose probabilities' reader it computes too: the reader's other operand
    computed now (the value projection of attention may come later in the order); when it cannot be,
    the reader is given back to be lowered on its own."""
    host = lw.plan.get(dot.id)
    if not isinstance(host, SoftmaxHost) or host.reader is None:
        return
    other = host.reader.dot.operands[1 - host.reader.side]
    if lw.require(other.operands[0] if other.id in lw.absorbed else other):
        return
    lw.absorbed -= host.claimed
    lw.plan[dot.id] = host = SoftmaxHost(host.softmax, host.source, host.chain)
    lw.absorbed |= host.claimed


def _cluster_dot(lw: Lowering, x: Node) -> Node | None:
    """The dot of ``x``'s shape that ``x``'s elementwise cluster reads (the one that would host it)."""
    cl = lw.cluster_of.get(x.id)
    if cl is None:
        return None
    dots = [o for m in cl.members for o in m.operands if o.op == "dot" and o.shape == cl.shape]
    return dots[0] if len({d.id for d in dots}) == 1 else None


# Row blocks whose maxima a hosting dot takes before it finishes the oldest (its exponentials, multiply and
# the reader's products): the engines then work on neighbouring blocks at once. (2 and 3 measured no
# better on attention_s2048, mha_block and transformer_layer.)
SOFTMAX_AHEAD = 1


class _Part(NamedTuple):
    """One tile of a row block: its place in the dot's result, its ``(b, m0, n0)``, its values
    (``[P, 1, n]``; None for a tile the mask fills whole, :meth:`SoftmaxEpilogue.skips`) and its width."""

    place: Callable[[Ref], Ref]
    at: tuple[int, ...]
    x: Ref | None
    width: int


class SoftmaxEpilogue(Epilogue):
    """A dot's result tiles, through the cluster of its epilogue ``inner`` when the softmax reads one of
    its values, turned into the softmax's and stored to its result, or handed to the dot that reads the
    probabilities (:class:`_ProbsDot`). A row longer than one tile arrives as consecutive tiles of the
    same rows (:func:`~nxsat.extract.plan.hosts_rows`): they are kept on chip until the last, each
    tile's maxima taken as it arrives, then the row's maximum, the exponentials with their sums, and
    the multiply, tile by tile (a 2,048-key attention's scores never reach HBM)."""

    def __init__(self, lw: Lowering, dot: Node, host: SoftmaxHost, inner: Epilogue, frame: Callable[[Ref], Ref]
                 ) -> None:
        super().__init__(lw, dot, frame)
        self.host = host
        self.inner = inner
        self.scale = float(host.softmax.attrs.get("scale", 1.0))
        self.row = host.softmax.shape[-1]
        self.reader = _ProbsDot(lw, host.reader, self.row) if host.reader is not None else None
        if self.reader is not None:  # the probabilities never reach HBM: made in their reader's type
            self.dst = None
            self.out_t = self.reader.p_type
        else:
            written = written_as(lw, host.softmax)
            self.dst = frame(lw.result(written))
            self.out_t = onchip_dtype(device_dtype(written.dtype))
        self.parts: list[tuple[_Part, Ref | None]] = []  # this row block's so far, with their maxima
        self.pending: list[tuple[list[_Part], Ref]] = []  # row blocks with their maxima, waiting to finish
        # a finished block's, for the reader: its (b, m0, 0), tiles, their widths, the rows' scales (or None)
        self.products: tuple[tuple[int, ...], list[Ref | None], list[int], Ref | None] | None = None
        self.zeros: dict[tuple[int, int], Ref] = {}  # a skipped tile's probabilities, stored (set once)

    def evacuate_on_act(self, copy: bool = True) -> bool:
        """The scores' copies out of PSUM all on ScalarE where rows span several tiles and a dot reads the
        probabilities: VectorE has half the transposed probabilities' copies and the rows' small steps,
        ScalarE the exponentials (attention_s2048 422.3 -> 387.0 us). With rows of one tile it was not
        measured when this was decided; measured since: no change on transformer_layer, mha_block and
        BERT-12, gpt_decoder 50.0 -> 49.7 us (not applied yet)."""
        if self.reader is not None and self.row > self.lw.target.psum_bank_bytes // 4:
            return True
        return super().evacuate_on_act(copy)

    def reads_psum(self, res_type: dt.DType) -> bool:
        """Scores that nothing else reads, in fp32, whole rows in one PSUM bank: the maxima (VectorE) and
        the exponentials (ScalarE) read the accumulator itself, so no copy passes over the tile first.
        Rows spanning several tiles are copied out: they wait on chip for the row's last tile, and PSUM's
        eight banks are the dot's accumulators."""
        inner = self.inner
        if inner.cluster is not None or inner.out is not None:
            return inner.reads_psum(res_type)
        return res_type is dt.F32 and self.row * 4 <= self.lw.target.psum_bank_bytes

    def tile(self, place: Callable[[Ref], Ref], res: Ref, at: tuple[int, ...] = ()) -> None:
        """This tile's maxima now; once its rows are complete, their exponentials after the next rows'
        maxima (software-pipelined as the standalone kernel is: VectorE and ScalarE work on neighbouring
        tiles). A block of rows one tile long is finished only when the next tile arrives, after that
        tile's operands and matmul are emitted (mha_block 16.4 -> 16.2 us); one over several tiles as soon
        as it is complete (deferred so, the 2,048-key x 4-head bf16 case ran 398 -> 442 us)."""
        g = self.lw.graph
        g.origin = _origin(self.host.softmax)
        self._finish_ahead()
        g.origin = _origin(self.node)
        x = self.inner.tile(place, res).get(self.host.source.id, res)
        assert isinstance(x, Ref), "a softmax of a constant is folded before lowering"
        g.origin = _origin(self.host.softmax)
        mn, nn = res.shape
        xt = x.reshape(mn, 1, nn)
        # each tile's maxima on GpSimd, idle beside ScalarE's exponentials and VectorE's copies (mha_block
        # 15.4 -> 14.5 us, attention_s2048 387.0 -> 376.6); on VectorE where they read PSUM, which GpSimd cannot
        eng = "dve" if x.buf.kind == "psum" else "pool"
        self.parts.append((_Part(place, at, xt, nn), _maxima(g, xt, self.scale, eng)))
        self._row_done()
        g.origin = _origin(self.node)

    def skips(self, place: Callable[[Ref], Ref], at: tuple[int, ...], shape: tuple[int, int]) -> bool:
        """Is the tile at ``place`` (of ``shape``, at ``at = (b, m0, n0)``) one the mask fills whole, in rows
        each of which keeps some score: a causal attention's tile above the diagonal? Its probabilities are
        then zeros (exp(fill - max) underflows; the sums are the other tiles'), so the dot neither computes
        it nor, reading the probabilities, multiplies it (flash attention's causal block skipping). Only
        for a mask the softmax reads directly, of a fill below -1e30, the scores not stored. Non-finite
        scores or values meet zeros where the skipped tiles' products would have been NaN."""
        inner, src = self.inner, self.host.source
        if src.op != "select" or self.scale <= 0 or inner.cluster is None or inner.out is not None or inner.stores:
            return False
        p, _, f = src.operands
        pred, fill = inner.affine.get(p.id), inner.inputs.get(f.id)
        if pred is None or not is_num(fill) or not float(fill) <= -1e30:
            return False
        whole = inner.frame(virtual(p))
        tile, row = tile_params(pred, place(whole)), tile_params(pred, whole[at[0], at[1]:at[1] + shape[0], :])
        return tile is not None and row is not None and whole_tile(pred.cmp, *tile, shape) is False \
            and rows_keep(pred.cmp, *row, (shape[0], self.row))

    def skip(self, place: Callable[[Ref], Ref], at: tuple[int, ...], shape: tuple[int, int]) -> None:
        """The tile :meth:`skips` said the mask fills whole: a part of its rows with no values."""
        g = self.lw.graph
        g.origin = _origin(self.host.softmax)
        self._finish_ahead()
        self.parts.append((_Part(place, at, None, shape[1]), None))
        self._row_done()
        g.origin = _origin(self.node)

    def _row_done(self) -> None:
        """Once the row block's tiles are all in: the rows' bias from the tiles' maxima, the block pending."""
        if sum(p.width for p, _ in self.parts) != self.row:
            return
        negs = [n for _, n in self.parts if n is not None]
        neg = negs[0] if len(negs) == 1 else _least(self.lw.graph, negs)
        self.pending.append(([p for p, _ in self.parts], neg))
        self.parts = []
        if len(self.pending[-1][0]) > 1:
            self._finish_ahead()

    def _finish_ahead(self) -> None:
        while len(self.pending) > SOFTMAX_AHEAD:
            self._finish(*self.pending.pop(0))

    def flush(self) -> None:
        while self.pending:
            self._finish(*self.pending.pop(0))
        self._products()

    def _products(self) -> None:
        """The reader's products of the row block finished last (if any)."""
        if self.products is None or self.reader is None:
            return
        g = self.lw.graph
        g.origin = _origin(self.reader.node)
        self.reader.rows(*self.products)
        self.products = None
        g.origin = _origin(self.node)

    def _finish(self, parts: list[_Part], neg: Ref) -> None:
        """A row block's exponentials, sums and multiply, then its store or its reader's products."""
        g = self.lw.graph
        ys: list[Ref | None]
        # P @ V scaled once per row as its product is evacuated, not P tile by tile: ScalarE's pass over
        # every probability saved (mha_block 16.2 -> 15.4 us). With P on the right its rows lie along the
        # product's free axis: repeating the factors on the partitions (a transpose, a matmul, a copy)
        # saved 0.4% on attention_s2048 and cost transformer_layer 5%
        defer = self.reader is not None and self.reader.side == 0
        rec = None
        if len(parts) == 1 and not defer:  # whole rows in one tile: ``[P, 1, n]``, as the standalone kernel's
            xt = parts[0].x
            assert xt is not None, "a row keeps some score: its only tile is not skipped"
            ys = [_normalized(g, xt, neg, self.scale, self.out_t).reshape(xt.shape[0], xt.shape[2])]
        else:
            made, rec = _normalized_row(g, [p.x for p in parts if p.x is not None], neg, self.scale, self.out_t,
                                        defer)
            kept = iter(made)
            ys = [None if p.x is None else next(kept) for p in parts]
        if self.reader is not None:  # its products after the next block's exponentials (one more stage)
            self._products()
            self.products = (parts[0].at, ys, [p.width for p in parts], rec if defer else None)
            return
        assert self.dst is not None
        rows = next(y.shape[0] for y in ys if y is not None)
        for p, y in zip(parts, ys):
            if y is None:  # a skipped tile's probabilities: zeros
                y = self.zeros.get((rows, p.width))
                if y is None:
                    y = self.zeros[(rows, p.width)] = g.tile((rows, p.width), self.out_t, "sbuf", "smzero").ref()
                    g.add("pool", "memset", y, value=0.0)
            g.add("dma", "dma", p.place(self.dst), y)


class _ProbsDot:
    """The dot reading the probabilities (:class:`ProbsReader`), one row block of the hosting dot at a
    time: the block's ``[rows, keys]`` probability tiles transposed by TensorE 128 keys at a time (a PSUM
    bank's worth together, copied out by ScalarE and VectorE in turn: keys on the partitions), each multiplied with the
    matching K tile of the other operand (loaded once per batch) and accumulated in one PSUM bank; the
    result evacuated and stored where the dot's result has those rows."""

    def __init__(self, lw: Lowering, reader: ProbsReader, keys: int) -> None:
        from nxsat.backend.matmul import batched_view, dot_dims, operand_type

        self.lw, self.keys, self.side = lw, keys, reader.side
        self.node = dot = reader.dot
        other = dot.operands[1 - reader.side]
        self.mt = operand_type(dot.operands[0].dtype, dot.operands[1].dtype, lw)
        self.p_type = onchip_dtype(device_dtype(dot.operands[reader.side].dtype))
        # A cast alone reading the result (attention's output to bf16 for the output projection) is
        # written by the evacuation: the fp32 result never exists, half the bytes are stored and loaded.
        cast = narrowing_reader(lw, dot)
        if cast is not None:
            lw.absorbed.add(dot.id)
        written = dot if cast is None else cast
        self.out_t = onchip_dtype(device_dtype(written.dtype))
        lf, rf, (B, M, K, N) = dot_dims(dot)
        d = dot.attrs["dims"]
        src = other.operands[0] if other.id in lw.absorbed else other  # a cast it absorbs: done on load
        if reader.side == 1:  # probabilities on the right: [B, d, rows] = other[B, d, K] @ P^T
            view = lw.ref(src).permute(*d.lhs_batch, *d.lhs_contracting, *lf)
            self.width, batch = M, d.lhs_batch
        else:  # [B, rows, d] = P @ other[B, K, d]
            view = lw.ref(src).permute(*d.rhs_batch, *d.rhs_contracting, *rf)
            self.width, batch = N, d.rhs_batch
        self.other = batched_view(lw, view, [src.shape[i] for i in batch], (K, self.width), src)
        self.out = lw.result(written).reshape(B, M, N)
        self.loaded: dict[int, list[tuple[int, int, Ref]]] = {}
        self.copies = 0

    def _other_tiles(self, b: int) -> list[tuple[int, int, Ref]]:
        """The other operand's K tiles of batch ``b`` (``[keys, width]``, in the multiply type), loaded once."""
        from nxsat.backend.matmul import _load_kmajor

        if b not in self.loaded:
            rows = self.lw.target.matmul["rows"]
            transpose_dma = bool(self.lw.target.dma["transpose_efficiency"]) and self.mt.itemsize in (2, 4)
            self.loaded = {b: [(k0, min(rows, self.keys - k0),
                                _load_kmajor(self.lw, self.other[b, k0:k0 + rows, :], self.mt, transpose_dma))
                               for k0 in range(0, self.keys, rows)]}
        return self.loaded[b]

    def rows(self, at: tuple[int, ...], ys: list[Ref | None], widths: list[int], scale: Ref | None = None) -> None:
        """The dot's result for the rows ``at = (b, m0, 0)`` of the hosting dot, whose probabilities are
        the consecutive ``[rows, n]`` tiles ``ys`` of ``widths`` (None: zeros, the keys not multiplied);
        ``scale``: each row's factor (``[rows, 1]``: the softmax's normalization, deferred to here)."""
        g = self.lw.graph
        b, m0 = at[0], at[1]
        mn = next(y.shape[0] for y in ys if y is not None)
        shape = (self.width, mn) if self.side == 1 else (mn, self.width)
        acc = g.tile(shape, F32, "psum", "pvacc").ref()

        def block(k0: int, kn: int) -> Ref | None:  # the probabilities of keys k0..k0+kn (within one tile)
            t, c0 = 0, k0
            while c0 >= widths[t]:
                c0 -= widths[t]
                t += 1
            y = ys[t]
            return None if y is None else y[:, c0:c0 + kn]

        tiles = [t for t in self._other_tiles(b) if block(t[0], t[1]) is not None]

        # K tiles of one size transposed into one PSUM bank together and copied out at once
        per = max(1, self.lw.target.psum_bank_bytes // 4 // mn)
        groups = [tiles[i:i + per] for i in range(0, len(tiles), per)]
        groups = [[t for t in grp if t[1] == kn] for grp in groups for kn in dict.fromkeys(t[1] for t in grp)]
        j = 0

        def products(grp: list[tuple[int, int, Ref]], pt: Ref) -> None:
            nonlocal j
            for i, (_, _, ot) in enumerate(grp):
                st, mv = (ot, pt[:, i, :]) if self.side == 1 else (pt[:, i, :], ot)
                g.add("pe", "matmul", acc, st, mv, start=j == 0, stop=j == len(tiles) - 1)
                j += 1

        # software-pipelined by one group: TensorE transposes the next group while this one is copied out
        ready: tuple[list[tuple[int, int, Ref]], Ref] | None = None
        for grp in groups:
            kn = grp[0][1]
            ps = g.tile((kn, len(grp), mn), F32, "psum", "pvtp").ref()
            for i, (k0, _, _) in enumerate(grp):
                blk = block(k0, kn)
                assert blk is not None
                g.add("pe", "transpose", ps[:, i, :], blk)
            if ready is not None:
                products(*ready)
            pt = g.tile((kn, len(grp), mn), self.mt, "sbuf", "pvp").ref()
            if self.copies % 2:
                g.add("act", "activation", pt, ps)
            else:
                g.add("dve", "tensor_copy", pt, ps)
            self.copies += 1
            ready = (grp, pt)
        if ready is not None:
            products(*ready)
        res = g.tile(shape, self.out_t, "sbuf", "pvo").ref()
        assert scale is None or self.side == 0, "the rows' factors scale partitions"
        g.add("act", "activation", res, acc, **({} if scale is None else {"scale": scale}))
        dst = self.out[b, :, m0:m0 + mn] if self.side == 1 else self.out[b, m0:m0 + mn, :]
        g.add("dma", "dma", dst, res)


def softmax_epilogue(lw: Lowering, dot: Node, frame: Callable[[Ref], Ref]) -> Epilogue:
    """The dot's epilogue (backend/epilogue.py), computing the softmax :func:`plan_softmax_hosts` gave it
    too when the softmax's operand is the dot's result or a value of the cluster the epilogue takes;
    otherwise the softmax and its reshapes are given back to be lowered on their own."""
    host = lw.plan.get(dot.id)
    if not isinstance(host, SoftmaxHost):
        return epilogue(lw, dot, frame)
    if host.source is dot:  # nothing but the softmax reads the scores: they are not stored
        return SoftmaxEpilogue(lw, dot, host, Epilogue(lw, dot, frame), frame)
    reader = (host.chain[-1] if host.chain else host.softmax).id  # served: a cluster without the source has
    inner = epilogue(lw, dot, frame, frozenset({reader}))         # no member it reads, so nothing changes
    if inner.cluster is None or host.source not in inner.cluster.members:
        lw.absorbed -= host.claimed
        del lw.plan[dot.id]
        return inner
    return SoftmaxEpilogue(lw, dot, host, inner, frame)

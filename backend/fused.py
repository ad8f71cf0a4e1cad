"""Fused operators (nxsat/ops/fused.py): the patterns model-type rule sets recognise, each run as one
kernel instead of the passes its pattern would take.

**softmax** of ``scale * x`` over the last dimension (``L`` elements per row): rows on the partitions, ``k`` rows per
partition per tile (``[P, k, L]``, one DMA in and one out, each partition's rows contiguous in HBM).
Per tile: VectorE's maximum of each row; ScalarE's ``exp(scale * x - scale * max)`` row by row (the
scale a rule folded in costs nothing), the row's sum
accumulated by the same instruction (activation's ``accum``: the sum costs nothing extra); VectorE's
reciprocal of the sums and ScalarE's multiply of each row by its own (the activation's per-partition
scale), into the result's type. The tiles are software-pipelined: VectorE reduces the next tile while
ScalarE works on this one (measured on a [2048, 4096] bf16 softmax: 220.9 us in tile order with the
multiply on VectorE, 175.9 pipelined, 155.4 with the multiply on ScalarE).
Everything between load and store is fp32. One read and one write of the data: the pattern it replaces
reads the scores three times and writes the exponentials once more (a maximum, an exp-and-sum pass and
a division). The plan (rows per tile) is :func:`nxsat.extract.plan.softmax_rows`, which the cost model
prices too.
"""

from __future__ import annotations

import math

from nxsat import dtypes as dt
from nxsat.backend.lower import Lowering, lowers, onchip_dtype
from nxsat.extract.plan import softmax_rows
from nxsat.ir import Node

F32 = dt.F32


@lowers("softmax")
def softmax(lw: Lowering, node: Node) -> None:
    x = node.operands[0]
    shape = x.shape
    if node.attrs["dimension"] != len(shape) - 1:
        from nxsat.diagnostics import error

        raise error("NCC_EUOC002", f"softmax {node.name}: only the last dimension is supported on the "
                    f"NeuronCore (dimension {node.attrs['dimension']} of {list(shape)})", node.loc)
    L = shape[-1]
    R = math.prod(shape[:-1])
    out = lw.result(node)
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
    tiles = []  # (first row, partitions, rows per partition)
    r0 = 0
    while r0 < R:
        left = R - r0
        pn, k = (part, min(k_max, left // part)) if left >= part else (left, 1)
        tiles.append((r0, pn, k))
        r0 += pn * k

    def maxima(r0: int, pn: int, k: int) -> tuple:
        xt = g.tile((pn, k, L), in_t, "sbuf", "smx").ref()
        g.add("dma", "dma", xt, src[r0:r0 + pn * k].reshape(pn, k, L))
        mx = g.tile((pn, k), F32, "sbuf", "smmax").ref()
        g.add("dve", "tensor_reduce", mx, xt, op="max" if scale >= 0 else "min", axes=(2,))
        neg = g.tile((pn, k), F32, "sbuf", "smneg").ref()  # -max(scale * x), the exponential's bias
        g.add("dve", "tensor_scalar", neg, mx, op0="mul", scalar0=-scale)
        return xt, neg

    # software-pipelined: the next tile's maxima (VectorE) are issued before this tile's exponentials
    # (ScalarE), so the two engines work on neighbouring tiles at once
    ahead = maxima(*tiles[0])
    for i, (r0, pn, k) in enumerate(tiles):
        xt, neg = ahead
        if i + 1 < len(tiles):
            ahead = maxima(*tiles[i + 1])
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
        g.add("dma", "dma", dst[r0:r0 + pn * k].reshape(pn, k, L), yt)

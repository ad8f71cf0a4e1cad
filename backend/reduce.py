"""Reductions: ``reduce`` whose body is one commutative operator (add, multiply, maximum, minimum, and,
or) on VectorE, along the free axis.

The operand is viewed as ``[R, K]``: the kept dimensions as rows (on partitions, 128 at a time), the
reduced ones as a row's elements, ``K`` taken in chunks of :data:`CHUNK`. Each chunk's
``tensor_reduce`` gives a partial per row, the partials combine in fp32 (mixed-precision
accumulation) or exactly for 32-bit integers (on GpSimd), then the init value enters once and the
result is converted to the output type.
"""

from __future__ import annotations

import math

from nxsat import dtypes as dt
from nxsat.backend.lower import Lowering, device_dtype, lowers, onchip_dtype
from nxsat.backend.tiles import Tiles
from nxsat.diagnostics import error
from nxsat.ir import Computation, Node

CHUNK = 2048
OPS = {"add": "add", "multiply": "mul", "maximum": "max", "minimum": "min", "and": "min", "or": "max"}


def body_op(body: Computation) -> str | None:
    """The operator a reduction body applies to its two parameters, if it is one of :data:`OPS`."""
    root = body.root
    if root.op in OPS and len(body.params) == 2 and {o.id for o in root.operands} == {p.id for p in body.params}:
        if root.op in ("and", "or") and not root.dtype.is_pred:
            return None  # bitwise on integers: not a min/max
        return root.op
    return None


@lowers("reduce")
def reduce(lw: Lowering, node: Node) -> None:
    n = len(node.operands) // 2
    op = body_op(node.attrs["to_apply"]) if n == 1 else None
    if op is None:
        raise error("NCC_EUOC002", f"reduce {node.name}: a {'variadic ' if n > 1 else ''}body other than one "
                    "add, multiply, maximum, minimum, and or or cannot run on the NeuronCore yet", node.loc)
    x, init = node.operands
    dims = tuple(node.attrs["dimensions"])
    kept = [d for d in range(len(x.shape)) if d not in dims]
    R = math.prod(x.shape[d] for d in kept)
    K = math.prod(x.shape[d] for d in dims)
    X = lw.view(lw.ref(x).permute(*kept, *dims), lambda r: r.reshape(R, K), node)
    out = lw.view(lw.result(node), lambda r: r.reshape(R, 1), node)
    reduce_rows(lw, node, X, out, OPS[op], init)


def reduce_rows(lw: Lowering, node: Node, X, out, alu: str, init: Node) -> None:  # noqa: ANN001
    """``out[r, 0] = init alu X[r, 0] alu X[r, 1] ...`` for ``X`` ``[R, K]``."""
    g = lw.graph
    R, K = X.shape
    src_t = onchip_dtype(X.dtype)
    exact_int = src_t.name in ("s32", "u32")
    acc_t = src_t if exact_int else (dt.F32 if src_t.is_float or src_t.is_int else src_t)
    out_t = onchip_dtype(device_dtype(node.dtype))
    init_v = lw.scalar(init)
    part = lw.target.partitions
    for r0 in range(0, R, part):
        rn = min(part, R - r0)
        t = Tiles(g, (rn, 1), "red")
        acc = None
        for k0 in range(0, K, CHUNK):
            kn = min(CHUNK, K - k0)
            tile = g.tile((rn, kn), src_t, "sbuf", "redin").ref()
            g.add("dma", "dma", tile, X[r0:r0 + rn, k0:k0 + kn])
            part_r = t.tile(acc_t)
            g.add("pool" if exact_int else "dve", "tensor_reduce", part_r, tile, op=alu)
            acc = part_r if acc is None else t.binary(alu, acc, part_r, acc_t)
        assert acc is not None
        if init_v is not None:
            acc = t.binary(alu, acc, init_v, acc_t)
        else:
            it = g.tile((rn, 1), onchip_dtype(init.dtype), "sbuf", "init").ref()
            g.add("dma", "dma", it, lw.ref(init).reshape(1, 1).broadcast(0, rn))
            acc = t.binary(alu, acc, it, acc_t)
        res = acc if acc.dtype is out_t else t.copy(acc, out_t)
        g.add("dma", "dma", out[r0:r0 + rn, :], res)

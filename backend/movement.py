"""Data movement: operators whose value is a new access pattern on their operand's buffer (reshape,
transpose, broadcast, slice), or DMAs between HBM buffers where elements only move (concatenate,
pad, reverse, copy). Nothing here computes."""

from __future__ import annotations

import math

import numpy as np

from nxsat.backend.graph import Ref
from nxsat.backend.lower import Lowering, concat_parts, device_dtype, lowers, onchip_dtype, reshapes
from nxsat.ir import Node


@lowers("constant")
def constant(lw: Lowering, node: Node) -> None:
    value = node.attrs.get("value")
    if value is None:
        from nxsat.diagnostics import error

        raise error("NCC_ECON001", f"constant {node.name} has no value (the model was dumped with its literals "
                    "elided)", node.loc)
    lw.set(node, lw.const(np.asarray(value).reshape(node.shape), node.dtype, node.name))


@lowers("opt-barrier")
def passthrough(lw: Lowering, node: Node) -> None:
    vals = [lw.values[o.id] for o in node.operands]
    lw.set(node, vals[0] if len(vals) == 1 else tuple(vals))


@lowers("tuple")
def make_tuple(lw: Lowering, node: Node) -> None:
    lw.set(node, tuple(lw.values[o.id] for o in node.operands))


@lowers("get-tuple-element")
def get_tuple_element(lw: Lowering, node: Node) -> None:
    lw.set(node, lw.values[node.operands[0].id][node.attrs["index"]])


@lowers("reshape")
def reshape(lw: Lowering, node: Node) -> None:
    src = lw.ref(node.operands[0])
    shape = node.shape
    lw.set(node, lw.view(src, lambda r: r.reshape(*shape), node))


@lowers("transpose")
def transpose(lw: Lowering, node: Node) -> None:
    if reshapes(node):  # only dimensions of size 1 move: the same bytes in the same order
        shape = node.shape
        lw.set(node, lw.view(lw.ref(node.operands[0]), lambda r: r.reshape(*shape), node))
        return
    perm = tuple(node.attrs["dimensions"])
    lw.set(node, lw.ref(node.operands[0]).permute(*perm))


@lowers("broadcast")
def broadcast(lw: Lowering, node: Node) -> None:
    """Operand dimension i becomes result dimension dimensions[i]; the others repeat (stride 0)."""
    src = lw.ref(node.operands[0])
    out_shape = node.shape
    dims = tuple(node.attrs["dimensions"])
    lw.set(node, lw.view(src, lambda r: broadcast_view(r, dims, out_shape), node))


def broadcast_view(r: Ref, dims: tuple[int, ...], out_shape: tuple[int, ...]) -> Ref:
    """``r`` broadcast into ``out_shape``, its dimension i landing at ``dims[i]``."""
    src_shape = r.shape
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    if tuple(order) != tuple(range(len(dims))):
        r = r.permute(*order)
        src_shape = tuple(src_shape[i] for i in order)
        dims = tuple(dims[i] for i in order)
    expanded = [1] * len(out_shape)
    for i, d in enumerate(dims):
        expanded[d] = src_shape[i]
    r = r.reshape(*expanded) if tuple(expanded) != tuple(src_shape) or not out_shape else r
    for d, n in enumerate(out_shape):
        if expanded[d] != n:
            r = r.broadcast(d, n)
    return r


@lowers("slice")
def slice_(lw: Lowering, node: Node) -> None:
    src = lw.ref(node.operands[0])
    key = tuple(slice(s.start, s.limit, s.stride) for s in node.attrs["slice"])
    lw.set(node, src[key] if key else src)


@lowers("copy")
def copy(lw: Lowering, node: Node) -> None:
    lw.set(node, lw.ref(node.operands[0]))


@lowers("concatenate")
def concatenate(lw: Lowering, node: Node) -> None:
    """Each operand's elements are DMAed into their place in the result (a slice strided along its
    innermost dimension through SBUF: :func:`_strided_rows`), except those written there as they were
    computed (``Lowering._in_concat``)."""
    out = lw.result(node)
    for op, key in concat_parts(node):
        if lw.in_place.get(op.id) is lw.values.get(op.id, False):
            continue  # written there already (Lowering._in_concat)
        if not _strided_rows(lw, out[key], op):
            lw.graph.add("dma", "dma", out[key], lw.ref(op))


def _strided_rows(lw: Lowering, dst: Ref, op: Node) -> bool:
    """``dst = op`` for a slice strided along its innermost dimension (or a reshape of one that only adds
    or drops dimensions of size 1): the rows it takes every ``s``-th element of are loaded whole into
    SBUF, one row a partition (the second-innermost dimension, 128 at a time), their elements picked on
    chip by a strided engine copy, and the rows stored whole. As one DMA each element was a descriptor:
    the stacked windows of a stride-2 layer's weight gradient (mobilenet_v2's first, 9 x 3.6 million
    elements) took 91 ms of DMA time. False for anything else."""
    sl = op
    if sl.op == "reshape" and sl.operands[0].op == "slice" and \
            tuple(d for d in sl.shape if d != 1) == tuple(d for d in sl.operands[0].shape if d != 1):
        sl = sl.operands[0]
    if sl.op != "slice" or len(sl.shape) < 2 or sl.attrs["slice"][-1].stride == 1 or 0 in sl.shape:
        return False
    dims = sl.attrs["slice"]
    x = sl.operands[0]
    last = dims[-1]
    n, rows = sl.shape[-1], sl.shape[-2]
    span = (n - 1) * last.stride + 1
    dtype = onchip_dtype(device_dtype(sl.dtype))
    if span * dtype.itemsize > 32 * 1024:
        return False
    try:
        src = lw.ref(x)[(*(slice(d.start, d.limit, d.stride) for d in dims[:-1]), slice(last.start, last.start + span))]
        dst = dst.reshape(*sl.shape)
    except (ValueError, AssertionError, IndexError):
        return False
    g = lw.graph
    P = lw.target.partitions
    engines = ("act", "dve")
    k = 0
    for outer in np.ndindex(*sl.shape[:-2]):
        for r0 in range(0, rows, P):
            pn = min(P, rows - r0)
            whole = g.tile((pn, span), dtype, "sbuf", "strows").ref()
            g.add("dma", "dma", whole, src[(*outer, slice(r0, r0 + pn))])
            picked = g.tile((pn, n), dtype, "sbuf", "stpick").ref()
            engine = "pool" if dtype.is_int else engines[k % 2]  # ScalarE and VectorE in turn (floats)
            k += 1
            if engine == "act":
                g.add("act", "activation", picked, whole[:, 0:span:last.stride])
            else:
                g.add(engine, "tensor_copy", picked, whole[:, 0:span:last.stride])
            g.add("dma", "dma", dst[(*outer, slice(r0, r0 + pn))], picked)
    return True


@lowers("reverse")
def reverse(lw: Lowering, node: Node) -> None:
    """Access patterns step forward only: the reversed dimensions are moved one index at a time (a
    DMA per combination of reversed indices, each moving everything else at once)."""
    out = lw.result(node)
    src = lw.ref(node.operands[0])
    dims = tuple(node.attrs["dimensions"])
    shape = node.shape
    combos = np.ndindex(*(shape[d] for d in dims)) if dims else [()]
    for combo in combos:
        okey = [slice(None)] * len(shape)
        ikey = [slice(None)] * len(shape)
        for d, i in zip(dims, combo):
            okey[d] = i
            ikey[d] = shape[d] - 1 - i
        lw.graph.add("dma", "dma", out[tuple(okey)], src[tuple(ikey)])


@lowers("pad")
def pad(lw: Lowering, node: Node) -> None:
    """The operand's elements at their place (interior padding as a stride, negative edges as a crop of
    the operand), one HBM-to-HBM DMA; then the padding value around them (:func:`_fill`)."""
    out = lw.result(node)
    src = lw.ref(node.operands[0])
    okey, ikey = [], []
    for p, n_in in zip(node.attrs["padding"], node.operands[0].shape):
        step = p.interior + 1
        first_in = 0 if p.lo >= 0 else (-p.lo + step - 1) // step  # inputs that land below 0 are cropped
        at = p.lo + first_in * step
        count = 0
        while first_in + count < n_in and at + count * step < node.shape[len(okey)]:
            count += 1
        if count == 0:  # nothing of the operand is kept
            _fill(lw, node, [out])
            return
        okey.append(slice(at, at + (count - 1) * step + 1, step))
        ikey.append(slice(first_in, first_in + count))
    holes = any(p.interior and k.stop - k.start > 1 for p, k in zip(node.attrs["padding"], okey))
    if holes and _pad_on_chip(lw, node, out, src, okey, ikey):
        return
    if holes:
        _fill(lw, node, [out])  # holes between the elements: the value everywhere first
    else:
        _fill(lw, node, _border(out, node.shape, okey))
    lw.graph.add("dma", "dma", out[tuple(okey)], src[tuple(ikey)])


PAD_TILE_BYTES = 48 * 1024  # a padded row block's bytes per partition (its operand's beside it)


def _pad_on_chip(lw: Lowering, node: Node, out: Ref, src: Ref, okey: list[slice], ikey: list[slice]) -> bool:
    """Interior padding (holes between the elements) made in SBUF: the dimensions before the first padded
    one go on the partitions, 128 rows at a time; each block's operand rows are loaded whole, the padded
    block filled with the value and the rows copied in at their stride by an engine, and the block stored
    whole. Copied into place by one HBM-to-HBM DMA instead, every element was a descriptor of its own
    (a [96, 96, 56, 56] bf16 gradient dilated for a transposed convolution: 23.5 ms). False when the
    padded rows do not fit a tile or the operand's access pattern cannot take the row view."""
    pads = node.attrs["padding"]
    k = next(i for i, p in enumerate(pads) if p.lo or p.hi or p.interior)
    outer = math.prod(node.shape[:k])
    if outer != math.prod(node.operands[0].shape[:k]) or any(s.stop - s.start != n for s, n in
                                                             zip(okey[:k], node.shape[:k])):
        return False
    dtype = onchip_dtype(device_dtype(node.dtype))
    oshape, ishape = node.shape[k:], tuple(s.stop - s.start for s in ikey[k:])
    if math.prod(oshape) * dtype.itemsize > PAD_TILE_BYTES or not ishape:
        return False
    try:
        rows_out = out.reshape(outer, *oshape)
        rows_in = src[(slice(None),) * k + tuple(ikey[k:])].reshape(outer, *ishape)
    except (ValueError, AssertionError, IndexError):
        return False
    g = lw.graph
    value = lw.scalar(node.operands[1])
    inner = tuple(slice(s.start, s.stop, s.step) for s in okey[k:])
    P = lw.target.partitions
    col = None
    if value is None:  # a value computed at run time: one column, repeated along each block
        col = g.tile((P, 1), dtype, "sbuf", "padval").ref()
        g.add("dma", "dma", col, lw.ref(node.operands[1]).reshape(1, 1).broadcast(0, P))
    for r0 in range(0, outer, P):
        pn = min(P, outer - r0)
        blk = g.tile((pn, *oshape), dtype, "sbuf", "padblk").ref()
        if value is not None:
            g.add("pool", "memset", blk, value=value)
        else:
            flat = blk.reshape(pn, math.prod(oshape))
            g.add("dve", "tensor_copy", flat, col[0:pn].broadcast(1, math.prod(oshape)))
        rows = g.tile((pn, *ishape), dtype, "sbuf", "padrows").ref()
        g.add("dma", "dma", rows, rows_in[r0:r0 + pn])
        if dtype.is_int:  # bits move exactly on GpSimd
            g.add("pool", "tensor_copy", blk[(slice(None), *inner)], rows)
        else:  # ScalarE's copy (fp32 inside: every float type exact), beside GpSimd's fill
            g.add("act", "activation", blk[(slice(None), *inner)], rows)
        g.add("dma", "dma", rows_out[r0:r0 + pn], blk)
    return True


def _border(out: Ref, shape: tuple[int, ...], inner: list[slice]) -> list[Ref]:
    """The parts of ``out`` outside the box ``inner``: per dimension, the slabs before and after the box
    (the dimensions before it inside the box, those after it whole)."""
    slabs = []
    for d, k in enumerate(inner):
        head = [*inner[:d]]
        tail = [slice(None)] * (len(shape) - d - 1)
        for part in (slice(0, k.start), slice(k.stop, shape[d])):
            if part.stop > part.start:
                slabs.append(out[(*head, part, *tail)])
    return slabs


FILL_COLS = 2048  # the fill tile's elements per partition


def _pieces(r: Ref, P: int, cols: int) -> list[Ref]:
    """``r`` in DMAs from a ``[P, cols]`` tile: its first dimension on the partitions (128 at a time),
    the others flat when they fit a partition, else one piece per index of the first dimension."""
    shape = r.shape
    if len(shape) < 2:
        n = shape[0] if shape else 1
        flat = r.reshape(1, n)
        return [flat[:, c0:c0 + cols] for c0 in range(0, n, cols)]
    if shape[0] == 1:
        return _pieces(r[0], P, cols)
    if math.prod(shape[1:]) > cols:
        return [v for i in range(shape[0]) for v in _pieces(r[i], P, cols)]
    return [r[r0:r0 + P] for r0 in range(0, shape[0], P)]


def _fill(lw: Lowering, node: Node, parts: list[Ref]) -> None:
    """The pad value into ``parts`` from one SBUF tile holding it (a stride-0 read of the scalar in HBM
    is a DMA descriptor per element: 650 us for ResNet-50's 3.3 MB max-pool pad), in the pieces
    :func:`_pieces` cuts."""
    g = lw.graph
    parts = [r for r in parts if math.prod(r.shape) > 0]
    if not parts:
        return
    dtype = onchip_dtype(device_dtype(node.dtype))
    P = lw.target.partitions
    cols = min(FILL_COLS, max(math.prod(r.shape[1:]) if len(r.shape) > 1 else math.prod(r.shape) for r in parts))
    tile = g.tile((P, cols), dtype, "sbuf", "padfill").ref()
    value = lw.scalar(node.operands[1])
    if value is not None:
        g.add("pool", "memset", tile, value=value)
    else:  # a value computed at run time: one column, repeated along the tile
        col = g.tile((P, 1), dtype, "sbuf", "padval").ref()
        g.add("dma", "dma", col, lw.ref(node.operands[1]).reshape(1, 1).broadcast(0, P))
        g.add("dve", "tensor_copy", tile, col.broadcast(1, cols))
    for r in parts:
        for piece in _pieces(r, P, cols):
            p, rest = piece.shape[0], piece.shape[1:]
            g.add("dma", "dma", piece, tile[0:p, 0:math.prod(rest)].reshape(p, *rest))

"""Data movement: operators whose value is a new access pattern on their operand's buffer (reshape,
transpose, broadcast, slice), or DMAs between HBM buffers where elements only move (concatenate,
pad, reverse, copy). Nothing here computes."""

from __future__ import annotations

import numpy as np

from nxsat.backend.graph import Ref
from nxsat.backend.lower import Lowering, lowers
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
    """Each operand's elements are DMAed into their place in the result."""
    out = lw.result(node)
    axis = node.attrs["dimension"]
    at = 0
    for op in node.operands:
        n = op.shape[axis]
        key = tuple(slice(at, at + n) if d == axis else slice(None) for d in range(len(node.shape)))
        lw.graph.add("dma", "dma", out[key], lw.ref(op))
        at += n


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
    """The padding value everywhere, then the operand's elements at their place (interior padding as a
    stride, negative edges as a crop of the operand)."""
    out = lw.result(node)
    src = lw.ref(node.operands[0])
    value = lw.ref(node.operands[1])
    fill = value.reshape(*([1] * len(node.shape))) if node.shape else value
    for d, n in enumerate(node.shape):
        fill = fill.broadcast(d, n)
    lw.graph.add("dma", "dma", out, fill)
    okey, ikey = [], []
    for p, n_in in zip(node.attrs["padding"], node.operands[0].shape):
        step = p.interior + 1
        first_in = 0 if p.lo >= 0 else (-p.lo + step - 1) // step  # inputs that land below 0 are cropped
        at = p.lo + first_in * step
        count = 0
        while first_in + count < n_in and at + count * step < node.shape[len(okey)]:
            count += 1
        if count == 0:
            return  # nothing of the operand is kept
        okey.append(slice(at, at + (count - 1) * step + 1, step))
        ikey.append(slice(first_in, first_in + count))
    lw.graph.add("dma", "dma", out[tuple(okey)], src[tuple(ikey)])


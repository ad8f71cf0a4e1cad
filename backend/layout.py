"""Where a value's dimensions go in memory: convolution networks stored channels-first.

JAX and Keras write convolutions channels-last (``NHWC``, ``dim_labels=b01f_01io->b01f``). The
NeuronCore contracts over the partitions, so a convolution wants its input with channels on the
partitions (backend/conv.py): a channels-last input goes through TensorE transposes (or DMA transposes
on NeuronCore-v3) before the first matmul, the result is transposed back before its store, and each
DMA moves rows of ``C`` elements (128 bytes for 64 bf16 channels: a descriptor's fixed cost then
outweighs its transfer). Stored channels-first, the same values need none of that: the input box loads
channel by channel with whole image rows per descriptor, and the result leaves PSUM straight to HBM.

:func:`channels_first` decides that for whole regions, since a layout change only pays when nothing
has to change it back: a convolution's result is stored ``[N, C, spatial...]`` and the values computed
from it element by element (a batch norm, a ReLU, a residual add), by pooling (``reduce-window``) or by
padding keep that order, each operator rewritten on the permuted shape (a per-channel parameter's
broadcast lands on the channel dimension where it now is). Every reader of such a value must take the
new order for free: another convolution reads its input through a transpose (a view: conv.py follows
the strides), a reduction over the spatial dimensions (global average pooling) ends in the same order
either way. A value read by anything else (a reshape, a dot, a group norm, the model's output) stays as
it was, and so, in turn, do the values it is computed from: no transpose is ever added that moves data.

Channels-first is not always better: a late ResNet stage (7x7 positions, 2,048 channels) loads rows of
seven elements, where channels-last loads 4 KB channel vectors. Each region (the values joined by
element-wise operators, one decision for all of them) is stored channels-first only where the cost
model (extract/cost.py ``conv_ns``, which prices both layouts as backend/conv.py emits them) says the
convolutions that write and read it are faster so; the regions are settled one at a time until none
changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nxsat.attrs import ConvDims
from nxsat.extract.cost import CostModel, Value
from nxsat.ir import Module, Node, TensorType
from nxsat.sim.target import Target

# Operators computed in any order of their operand's dimensions once their attributes follow it.
_FOLLOWERS = frozenset({"reduce-window", "pad"})


def _inverse(p: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(p))


def _conv_order(n: Node) -> tuple[int, ...] | None:
    """The channels-first order of a convolution's result (logical dimensions, outermost first), or None
    when it already is, has no spatial dimension or is a weight gradient (rewritten on its own)."""
    from nxsat.backend.conv import is_weight_gradient

    d: ConvDims = n.attrs["dims"]
    if not d.output_spatial or is_weight_gradient(n):
        return None
    p = (d.output_batch, d.output_feature, *d.output_spatial)
    return None if p == tuple(range(len(p))) else p


def _full(o: Node) -> bool:
    """Is ``o`` an operand the order must follow (not a scalar, not a broadcast that can be remade)?"""
    return isinstance(o.type, TensorType) and o.shape != () and o.op != "broadcast"


def _reduce_keeps_order(r: Node, p: tuple[int, ...]) -> bool:
    """Does a reduction of a value stored in order ``p`` give its result in the result's own order?"""
    dims = set(r.attrs["dimensions"])
    return [d for d in p if d not in dims] == sorted(d for d in range(len(p)) if d not in dims)


def channels_first_orders(module: Module, target: Target) -> dict[int, tuple[int, ...]]:
    """The nodes to store in another order (node id -> the order of its logical dimensions in memory)."""
    from nxsat.backend import families  # noqa: F401 - every emitter registered (is_elementwise)
    from nxsat.backend.elementwise import is_elementwise

    order = module.entry.post_order()
    readers: dict[int, list[Node]] = {}
    for n in order:
        for o in n.operands:
            readers.setdefault(o.id, []).append(n)
    root = module.entry.root
    returned = {root.id} | ({o.id for o in root.operands} if root.op == "tuple" else set())

    def follows(n: Node) -> tuple[int, ...] | None:
        """The order ``n`` takes from its operands, if every operand that matters has it."""
        if n.op == "convolution":
            return _conv_order(n)
        if n.op in _FOLLOWERS:
            ops = n.operands[:1]
        elif is_elementwise(n):
            ops = [o for o in n.operands if _full(o)]
        else:
            return None
        ps = {perm.get(o.id) for o in ops}
        return ps.pop() if len(ps) == 1 and None not in ps else None

    def accepts(r: Node, n: Node) -> bool:
        if r.id in perm:
            return r.op != "convolution" or r.operands[0] is n and r.operands[1] is not n
        if r.op == "convolution":
            return r.operands[0] is n and r.operands[1] is not n
        return r.op == "reduce" and len(r.operands) == 2 and _reduce_keeps_order(r, perm[n.id])

    perm: dict[int, tuple[int, ...]] = {}
    for n in order:
        p = follows(n)
        if p is not None:
            perm[n.id] = p
    by_id = {n.id: n for n in order}
    changed = True
    while changed:  # drop what a reader cannot take, then what no longer gets its order from its operands
        changed = False
        for nid in list(perm):
            n = by_id[nid]
            if nid in returned or not all(accepts(r, n) for r in readers.get(nid, ())) or follows(n) != perm[nid]:
                del perm[nid]
                changed = True
    return _priced(order, perm, target)


def _priced(order: list[Node], perm: dict[int, tuple[int, ...]], target: Target) -> dict[int, tuple[int, ...]]:
    """``perm`` kept only for the regions whose convolutions the cost model prices faster so."""
    region: dict[int, int] = {}  # node id -> its region's first node
    for n in order:
        if n.id in perm:
            joined = [region[o.id] for o in n.operands if o.id in region and n.op != "convolution"]
            first = min(joined, default=n.id)
            for r in set(joined):  # merge the regions it joins
                for k, v in region.items():
                    if v == r:
                        region[k] = first
            region[n.id] = first
    convs = [n for n in order if n.op == "convolution" and (n.id in perm or n.operands[0].id in perm)]
    if not convs:
        return perm
    cm = CostModel(target)
    flipped = dict.fromkeys(sorted(set(region.values())), True)

    def price(c: Node) -> float:
        x = c.operands[0]
        p_in = perm.get(x.id) if x.id in region and flipped[region[x.id]] else None
        p_out = perm.get(c.id) if c.id in region and flipped[region[c.id]] else None
        return _conv_price(cm, c, p_in, p_out)

    for _ in range(8):  # coordinate descent over the regions (two rounds settle a ResNet-50)
        changed = False
        for r in flipped:
            touching = [c for c in convs if region.get(c.id) == r or region.get(c.operands[0].id) == r]
            was = flipped[r]
            costs = {}
            for choice in (True, False):
                flipped[r] = choice
                costs[choice] = sum(price(c) for c in touching)
            flipped[r] = costs[True] < costs[False]
            changed |= flipped[r] != was
        if not changed:
            break
    return {nid: p for nid, p in perm.items() if flipped[region[nid]]}


def _conv_price(cm: CostModel, c: Node, p_in: tuple[int, ...] | None, p_out: tuple[int, ...] | None) -> float:
    """The cost model's time for convolution ``c`` with its input stored in order ``p_in`` and its result
    in ``p_out`` (None: as written)."""
    x, w = c.operands[0], c.operands[1]
    d: ConvDims = c.attrs["dims"]
    xs, ys = x.shape, c.shape
    ib, if_, isp = d.input_batch, d.input_feature, d.input_spatial
    ob, of, osp = d.output_batch, d.output_feature, d.output_spatial
    if p_in is not None:
        inv = _inverse(p_in)
        xs = tuple(x.shape[k] for k in p_in)
        ib, if_, isp = inv[ib], inv[if_], tuple(inv[k] for k in isp)
    if p_out is not None:
        ys = tuple(c.shape[k] for k in p_out)
        ob, of, osp = 0, 1, tuple(range(2, 2 + len(osp)))
    dims = ConvDims(ib, if_, isp, d.kernel_input_feature, d.kernel_output_feature, d.kernel_spatial, ob, of, osp)
    return cm.conv_ns({**c.attrs, "dims": dims}, [Value(xs, x.dtype.name), Value(w.shape, w.dtype.name)],
                      Value(ys, c.dtype.name))


def channels_first(module: Module, target: Target) -> Module:
    """``module`` with :func:`channels_first_orders` applied: each chosen node computed on its permuted
    shape; the readers that keep their own order read it through a transpose (a view)."""
    from nxsat.passes import rewrite_module

    perm = channels_first_orders(module, target)
    if not perm:
        return module

    def expand(rw: Any, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
        p = perm.get(node.id)
        if node.op == "convolution" and node.operands[0].id in perm:  # its input read through a view
            src = ops[0]
            ops = [Node("transpose", [src], {"dimensions": _inverse(perm[node.operands[0].id])},
                        node.operands[0].type, f"{src.name}.logical", src.loc), *ops[1:]]
        if p is None:
            if node.op == "convolution":
                return Node(node.op, ops, attrs, node.type, node.name, node.loc)
            if node.op == "reduce" and node.operands[0].id in perm:
                inv = _inverse(perm[node.operands[0].id])
                dims = tuple(sorted(inv[d] for d in attrs["dimensions"]))
                return Node(node.op, ops, {**attrs, "dimensions": dims}, node.type, node.name, node.loc)
            return None
        inv = _inverse(p)
        shape = tuple(node.shape[d] for d in p)
        t = node.tensor.with_shape(shape)
        if node.op == "convolution":
            d: ConvDims = attrs["dims"]
            nsp = len(d.output_spatial)
            dims = ConvDims(d.input_batch, d.input_feature, d.input_spatial, d.kernel_input_feature,
                            d.kernel_output_feature, d.kernel_spatial, 0, 1, tuple(range(2, 2 + nsp)))
            return Node(node.op, ops, {**attrs, "dims": dims}, t, node.name, node.loc)
        if node.op == "reduce-window":
            window = tuple(attrs["window"][d] for d in p)
            return Node(node.op, ops, {**attrs, "window": window}, t, node.name, node.loc)
        if node.op == "pad":
            padding = tuple(attrs["padding"][d] for d in p)
            return Node(node.op, ops, {**attrs, "padding": padding}, t, node.name, node.loc)
        new_ops = []
        for o, new in zip(node.operands, ops):
            if o.op == "broadcast" and o.id not in perm:  # remade on the permuted shape
                dims = tuple(inv[d] for d in new.attrs["dimensions"])
                new = Node("broadcast", new.operands, {"shape": shape, "dimensions": dims},
                           new.tensor.with_shape(shape), f"{new.name}.cf", new.loc)
            new_ops.append(new)
        return Node(node.op, new_ops, attrs, t, node.name, node.loc)

    return rewrite_module(module, expand)

"""Partitioning over a logical core's physical cores (trn2 ``--logical-nc-config 2``).

The device program runs SPMD on every physical core of the logical core (docs/device-program.md,
"SPMD ranks"): each rank has its own SBUF, PSUM and HBM tensors, a ``shard=D`` input hands each
rank one part of a host array, and a ``shard=D`` output is assembled from the ranks' parts. With
nothing sharded both cores compute everything; this pass gives them different work.

It shards weights (tensor parallelism, as Megatron splits a linear layer's columns): a parameter
whose only use is one dot operand, through element-preserving steps (convert, the tf32 rounding,
transpose, copy), is split along one of its free (non-contracting, non-batch) dimensions. Each core
then loads its part and computes its part of the dot's result; an ``all-gather`` on the cc stream
(marked ``spmd``) joins the parts, or, when the dot's result is a model output, the output itself
is sharded and the host joins them. A split is taken only where the cost model says the weight
bytes and FLOPs saved outweigh the all-gather (:func:`nxsat.extract.plan.shard_plan`).

Contract: the module computes the same values; a sharded parameter has the local shape and its
``shard_dim``; a sharded output leaf carries ``shard_dim``; every other value is whole on every
rank. Data parallelism (splitting a batch across the cores) is not done: it needs every operator's
dimension mapping, and is left to the performance work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nxsat.extract.plan import shard_plan
from nxsat.ir import Computation, Module, Node, TensorType, TupleType
from nxsat.sim.target import Target, physical_cores

# Steps between a weight parameter and its dot that keep every element (and so a shard of it).
_CARRIERS = ("convert", "reduce-precision", "transpose", "copy")


@dataclass
class Sharding:
    """What the pass decided, for the report and ``--workdir``."""

    ranks: int
    sharded: list[dict[str, Any]] = field(default_factory=list)
    declined: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        gathers = sum(1 for s in self.sharded if s["joined_by"] == "all-gather")
        return {"ranks": self.ranks, "sharded_weights": len(self.sharded), "all_gathers": gathers,
                "weights": self.sharded, "declined": self.declined}


@dataclass(frozen=True)
class _Candidate:
    param: Node
    chain: tuple[Node, ...]  # carriers from the parameter to the dot operand, in order
    dot: Node
    side: int  # 0: lhs, 1: rhs
    param_dim: int  # the dimension of the parameter that is split
    out_dim: int  # the dimension of the dot's result it becomes


def partition(module: Module, target: Target, matmul_dtype: str) -> tuple[Module, Sharding]:
    """Shard the weights that pay for it across ``target``'s physical cores."""
    ranks = physical_cores(target)
    info = Sharding(ranks)
    if ranks == 1:
        return module, info
    entry = module.entry
    order = entry.post_order()
    users: dict[int, list[Node]] = {}
    for n in order:
        for o in n.operands:
            users.setdefault(o.id, []).append(n)
    leaves = _leaves(entry.root)
    leaf_ids = {n.id for n in leaves}
    best: dict[int, tuple[float, _Candidate, dict[str, Any], bool]] = {}  # dot id -> its best weight
    for p in entry.params:
        cand = _candidate(p, users, leaf_ids, ranks)
        if cand is None:
            continue
        dot = cand.dot
        gathered = not _only_leaf(dot, users, entry.root)
        other = dot.operands[1 - cand.side]
        plan = shard_plan(_nbytes(p.tensor), _nbytes(other.tensor), _nbytes(dot.tensor),
                          _dot_flops(dot), matmul_dtype, gathered, target)
        row = {"parameter": p.name, "dim": cand.param_dim, "dot": dot.name,
               "saved_us": round(plan.saved_ns / 1000, 3), "gather_us": round(plan.gather_ns / 1000, 3)}
        net = plan.saved_ns - plan.gather_ns
        if not plan.pays:
            info.declined.append(row)
        elif dot.id not in best or net > best[dot.id][0]:
            if dot.id in best:
                info.declined.append(best[dot.id][2])
            best[dot.id] = (net, cand, row, gathered)
        else:
            info.declined.append(row)
    chosen = {k: v[1] for k, v in best.items()}
    for _, _, row, gathered in best.values():
        info.sharded.append({**row, "joined_by": "all-gather" if gathered else "output"})
    if not chosen:
        return module, info
    return _rewrite(module, chosen, users, ranks), info


def _candidate(p: Node, users: dict[int, list[Node]], leaf_ids: set[int], ranks: int) -> _Candidate | None:
    """The dot a parameter feeds through carriers only, and the dimension to split, if any."""
    if not isinstance(p.type, TensorType) or not p.dtype.is_float or p.id in leaf_ids:
        return None
    chain: list[Node] = []
    node = p
    perm = tuple(range(len(p.shape)))  # perm[i]: the parameter dimension that is dimension i of node
    while True:
        us = users.get(node.id, [])
        if len(us) != 1 or node is not p and node.id in leaf_ids:
            return None
        (u,) = us
        if u.op == "dot":
            break
        if u.op not in _CARRIERS:
            return None
        if u.op == "transpose":
            perm = tuple(perm[d] for d in u.attrs["dimensions"])
        chain.append(u)
        node = u
    dot = u
    if dot.operands[0] is dot.operands[1]:
        return None
    side = 0 if dot.operands[0] is node else 1
    dims = dot.attrs["dims"]
    batch = dims.lhs_batch if side == 0 else dims.rhs_batch
    contracting = dims.lhs_contracting if side == 0 else dims.rhs_contracting
    free = [d for d in range(len(node.shape)) if d not in batch and d not in contracting]
    # The result's dimensions: batch, lhs free, rhs free (XLA's dot_general order).
    lhs_rank = len(dot.operands[0].shape)
    lhs_free = lhs_rank - len(dims.lhs_batch) - len(dims.lhs_contracting)
    base = len(batch) + (lhs_free if side == 1 else 0)
    best = None
    for k, d in enumerate(free):
        if node.shape[d] % ranks == 0 and (best is None or node.shape[d] > node.shape[best[0]]):
            best = (d, base + k)
    if best is None:
        return None
    d, out_dim = best
    return _Candidate(p, tuple(chain), dot, side, perm[d], out_dim)


def _rewrite(module: Module, chosen: dict[int, _Candidate], users: dict[int, list[Node]], ranks: int) -> Module:
    entry = module.entry
    local: dict[int, Node] = {}  # old node id -> its rank-local replacement
    cand_of_param = {c.param.id: c for c in chosen.values()}
    params = []
    for p in entry.params:
        c = cand_of_param.get(p.id)
        if c is None:
            params.append(p)
            continue
        shape = list(p.shape)
        shape[c.param_dim] //= ranks
        q = Node("parameter", (), {**p.attrs, "shard_dim": c.param_dim}, p.tensor.with_shape(shape), p.name, p.loc)
        params.append(q)
        local[p.id] = q
    mapping: dict[int, Node] = {p.id: q for p, q in zip(entry.params, params)}
    leaves = {n.id for n in _leaves(entry.root)}
    for n in entry.post_order():
        if n.id in mapping:
            continue
        ops = [mapping[o.id] for o in n.operands]
        if n.id in chosen:
            c = chosen[n.id]
            shape = list(n.shape)
            shape[c.out_dim] //= ranks
            joined_by_output = n.id in leaves and _only_leaf(n, users, entry.root)
            attrs = dict(n.attrs)
            if joined_by_output:
                attrs["shard_dim"] = c.out_dim
            part = Node(n.op, ops, attrs, n.tensor.with_shape(shape), n.name + ("" if joined_by_output else ".part"),
                        n.loc)
            if joined_by_output:
                mapping[n.id] = part
            else:
                attrs = {"dimension": c.out_dim, "replica_groups": (tuple(range(ranks)),), "spmd": True}
                mapping[n.id] = Node("all-gather", [part], attrs, n.type, n.name, n.loc)
        elif any(o.id in local for o in n.operands) and n.op in _CARRIERS:
            (src,) = n.operands
            new_shape = _carried_shape(n, mapping[src.id].shape)
            local[n.id] = mapping[n.id] = Node(n.op, ops, dict(n.attrs), n.tensor.with_shape(new_shape), n.name, n.loc)
        else:
            mapping[n.id] = n if all(a is b for a, b in zip(ops, n.operands)) else Node(
                n.op, ops, dict(n.attrs), n.type, n.name, n.loc)
    new_entry = Computation(entry.name, params, mapping[entry.root.id], None, entry.loc)
    return Module(module.name, new_entry, attrs=dict(module.attrs), source=module.source, framework=module.framework)


def _carried_shape(n: Node, src_shape: tuple[int, ...]) -> tuple[int, ...]:
    if n.op == "transpose":
        return tuple(src_shape[d] for d in n.attrs["dimensions"])
    return src_shape


def _only_leaf(n: Node, users: dict[int, list[Node]], root: Node) -> bool:
    """Is ``n`` used only as the model's result (the root itself, or an element of the root tuple)?"""
    us = users.get(n.id, [])
    return n is root or (len(us) == 1 and us[0] is root and root.op == "tuple"
                         and sum(o is n for o in root.operands) == 1)


def _leaves(root: Node) -> list[Node]:
    if isinstance(root.type, TupleType):
        return [leaf for o in root.operands for leaf in _leaves(o)]
    return [root]


def _nbytes(t: TensorType) -> int:
    return math.prod(t.shape) * t.dtype.itemsize


def _dot_flops(dot: Node) -> int:
    lhs = dot.operands[0].shape
    k = math.prod(lhs[d] for d in dot.attrs["dims"].lhs_contracting)
    return 2 * math.prod(dot.shape) * k

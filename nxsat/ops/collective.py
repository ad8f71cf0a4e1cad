"""Collectives: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute, replica-id,
partition-id.

nxsat runs a module on one replica for now. The shape rules are the multi-replica ones (all-gather
multiplies the gathered dimension by the group size, reduce-scatter divides it), so models written
for many replicas load and inspect correctly; running one whose replica groups name more than one
replica fails with NCC_EUOC002. Over a group of one replica every collective is the identity
(a collective-permute that sends nothing to replica 0 gives zeros), and replica-id and
partition-id are 0. On a Neuron device collectives are driven by DMA rings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import error
from nxsat.ir import Computation, Node, TensorType, TupleType, Type
from nxsat.ops.common import count, tensor, tensors
from nxsat.ops.reduce import body_attr, similar
from nxsat.ops.registry import DMA, NONE, Ctx, ShapeError, op

_HINT = "compile the model for a single replica (replica groups of one), or shard it with nxsat's own flags"


def replica_groups(attrs: dict, name: str, *, uniform: bool) -> tuple[tuple[int, ...], ...]:
    """The replica groups, checked: non-negative ids, each replica in at most one group, and (for
    collectives that split or concatenate data) every group the same size. Empty: all replicas."""
    groups = attrs.get("replica_groups") or ()
    if not isinstance(groups, tuple) or not all(isinstance(g, tuple) for g in groups):
        raise ShapeError(f"{name}: replica_groups must be a tuple of groups")
    seen: set[int] = set()
    for g in groups:
        if not g:
            raise ShapeError(f"{name}: an empty replica group")
        for r in g:
            if not isinstance(r, int) or isinstance(r, bool) or r < 0:
                raise ShapeError(f"{name}: replica id {r!r} is not a non-negative integer")
            if r in seen:
                raise ShapeError(f"{name}: replica {r} appears in more than one place in the replica groups")
            seen.add(r)
    if uniform and len({len(g) for g in groups}) > 1:
        sizes = ", ".join(str(len(g)) for g in groups)
        raise ShapeError(f"{name}: replica groups have different sizes ({sizes})")
    return groups


def group_size(attrs: dict, name: str) -> int:
    """How many replicas take part in each group (1 when the groups are left to the runtime: a
    module nxsat runs has one replica)."""
    groups = replica_groups(attrs, name, uniform=True)
    return len(groups[0]) if groups else 1


def check_single_replica(node: Node) -> None:
    """Refuse a collective over more than one replica (the interpreter and the backend alike)."""
    if node.op == "collective-permute":
        pairs = node.attrs.get("source_target_pairs") or ()
        if any(r != 0 for p in pairs for r in p):
            shown = ",".join(f"{{{s},{t}}}" for s, t in pairs)
            raise error("NCC_EUOC002", f"collective-permute {node.name} with pairs {{{shown}}}: "
                        "multi-replica execution is not supported yet (nxsat runs one replica)", node.loc, _HINT)
        return
    groups = node.attrs.get("replica_groups") or ()
    if any(len(g) > 1 for g in groups):
        shown = "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
        raise error("NCC_EUOC002", f"{node.op} {node.name} over replica groups {shown}: "
                    "multi-replica execution is not supported yet (nxsat runs one replica)",
                    node.loc, _HINT)


def permute_receives(node: Node) -> bool:
    """Does replica 0 receive anything from a (single-replica) collective-permute? If not, zeros."""
    return (0, 0) in (node.attrs.get("source_target_pairs") or ())


def _identity(args: list[Any], attrs: dict, ctx: Ctx) -> Any:
    check_single_replica(ctx.node)
    return args[0] if len(args) == 1 else tuple(args)


def _one_or_tuple(ts: list[TensorType]) -> Type:
    return ts[0] if len(ts) == 1 else TupleType(tuple(ts))


def _check_combiner(attrs: dict, operands: list[TensorType], name: str) -> None:
    """The reduction computation: two scalars of the operands' element type to one."""
    body: Computation = body_attr(attrs, "to_apply", name)
    ps = body.param_types
    if len(ps) != 2 or not all(isinstance(p, TensorType) and p.shape == () for p in ps):
        raise ShapeError(f"{name}: {body.name} must take two scalars, takes ({', '.join(map(str, ps))})")
    r = body.result_type
    if not isinstance(r, TensorType) or r != ps[0] or ps[0] != ps[1]:
        raise ShapeError(f"{name}: {body.name} must map two scalars of one type to that type, "
                         f"is ({', '.join(map(str, ps))}) -> {r}")
    for t in operands:
        if not similar(t.dtype, r.dtype):
            raise ShapeError(f"{name}: operand {t} does not match {body.name} on {r}")


def _dimension(attrs: dict, t: TensorType, name: str) -> int:
    d = attrs.get("dimension")
    if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < t.rank:
        raise ShapeError(f"{name}: dimension {d} is out of range for {t}")
    return d


# --- all-reduce, all-gather, reduce-scatter, all-to-all --------------------------------------

@op("all-reduce", engine=DMA, arity=(1, None), impl=_identity, neuron=("Allreduce",),
    notes="variadic; single replica for now (a group of one is the identity)")
def _all_reduce(types: list[Type], attrs: dict) -> Type:
    ts = tensors(types)
    replica_groups(attrs, "all-reduce", uniform=False)
    _check_combiner(attrs, ts, "all-reduce")
    return _one_or_tuple(ts)


@op("all-gather", engine=DMA, arity=(1, None), impl=_identity, neuron=("Allgather",),
    notes="concatenates along dimension over the group; single replica for now")
def _all_gather(types: list[Type], attrs: dict) -> Type:
    ts = tensors(types)
    n = group_size(attrs, "all-gather")
    out = []
    for t in ts:
        d = _dimension(attrs, t, "all-gather")
        out.append(t.with_shape(s * n if i == d else s for i, s in enumerate(t.shape)))
    return _one_or_tuple(out)


@op("reduce-scatter", engine=DMA, arity=(1, None), impl=_identity, neuron=("ReduceScatter",),
    notes="reduces over the group, each replica keeps its slice of dimension; single replica for now")
def _reduce_scatter(types: list[Type], attrs: dict) -> Type:
    ts = tensors(types)
    n = group_size(attrs, "reduce-scatter")
    _check_combiner(attrs, ts, "reduce-scatter")
    out = []
    for t in ts:
        d = _dimension(attrs, t, "reduce-scatter")
        if t.shape[d] % n:
            raise ShapeError(f"reduce-scatter: dimension {d} of {t} ({t.shape[d]}) is not divisible by the "
                             f"replica group size {n}")
        out.append(t.with_shape(s // n if i == d else s for i, s in enumerate(t.shape)))
    return _one_or_tuple(out)


@op("all-to-all", engine=DMA, arity=(1, None), impl=_identity,
    notes="array form (split and concatenate along dimension) or tuple form; single replica for now")
def _all_to_all(types: list[Type], attrs: dict) -> Type:
    ts = tensors(types)
    n = group_size(attrs, "all-to-all")
    if attrs.get("dimension") is None:
        for i, t in enumerate(ts[1:], 1):
            if t != ts[0]:
                raise ShapeError(f"all-to-all: operand {i} is {t}, operand 0 is {ts[0]}; the tuple form "
                                 "needs one type")
        return _one_or_tuple(ts)
    if len(ts) != 1:
        raise ShapeError(f"all-to-all with a split dimension takes one operand, got {len(ts)}")
    d = _dimension(attrs, ts[0], "all-to-all")
    if ts[0].shape[d] % n:
        raise ShapeError(f"all-to-all: dimension {d} of {ts[0]} ({ts[0].shape[d]}) is not divisible by the "
                         f"replica group size {n}")
    return ts[0]


# --- collective-permute ----------------------------------------------------------------------

def _pairs(attrs: dict, name: str) -> tuple[tuple[int, int], ...]:
    pairs = attrs.get("source_target_pairs") or ()
    if not isinstance(pairs, tuple):
        raise ShapeError(f"{name}: source_target_pairs must be a tuple of (source, target) pairs")
    sources: set[int] = set()
    targets: set[int] = set()
    for p in pairs:
        if (not isinstance(p, tuple) or len(p) != 2
                or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in p)):
            raise ShapeError(f"{name}: {p!r} is not a (source, target) pair of replica ids")
        if p[0] in sources or p[1] in targets:
            raise ShapeError(f"{name}: replica {p[0] if p[0] in sources else p[1]} sends or receives twice")
        sources.add(p[0])
        targets.add(p[1])
    return pairs


def _collective_permute_impl(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
    (x,) = args
    check_single_replica(ctx.node)
    return x if permute_receives(ctx.node) else np.zeros_like(x)  # a replica no pair sends to gets zeros


@op("collective-permute", engine=DMA, arity=(1, 1), impl=_collective_permute_impl,
    notes="sends to the replicas named by source_target_pairs; single replica for now")
def _collective_permute(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "collective-permute")
    _pairs(attrs, "collective-permute")
    return tensor(types[0])


# --- replica-id, partition-id ----------------------------------------------------------------

def _zero_id(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
    return np.zeros((), dtype=np.uint32)


def _id_rule(name: str) -> Any:
    def infer(types: list[Type], attrs: dict) -> Type:
        count(types, 0, name)
        return TensorType(dt.U32, ())

    return infer


op("replica-id", engine=NONE, arity=(0, 0), impl=_zero_id,
   notes="u32[]; 0 (one replica)")(_id_rule("replica-id"))
op("partition-id", engine=NONE, arity=(0, 0), impl=_zero_id,
   notes="u32[]; 0 (one partition)")(_id_rule("partition-id"))

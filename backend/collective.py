"""Collectives. A model's own collectives run over one replica (nxsat runs one, as the interpreter
does: nxsat/ops/collective.py), where each is the identity, a collective-permute that sends
nothing to replica 0 gives zeros, and replica-id and partition-id are 0; a group of more than one
replica is refused with NCC_EUOC002. The all-gathers the partitioner adds (``spmd``, over the
physical cores of a logical core: backend/partition.py) are cc-stream ``all_gather`` instructions."""

from __future__ import annotations

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.graph import Ref
from nxsat.backend.lower import Lowering, lowers
from nxsat.ir import Node
from nxsat.ops.collective import check_single_replica, permute_receives
from nxsat.sim.target import physical_cores


@lowers("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
def collective(lw: Lowering, node: Node) -> None:
    if node.attrs.get("spmd"):
        return spmd_all_gather(lw, node)
    check_single_replica(node)
    vals = [lw.values[o.id] for o in node.operands]
    lw.set(node, vals[0] if len(vals) == 1 else tuple(vals))


def spmd_all_gather(lw: Lowering, node: Node) -> None:
    """Every rank's part, concatenated along ``dimension`` in rank order, on every rank."""
    (group,) = node.attrs["replica_groups"]
    assert node.op == "all-gather" and len(group) == physical_cores(lw.target), node
    out = lw.result(node)
    lw.graph.add("cc", "all_gather", out, lw.ref(node.operands[0]), axis=node.attrs["dimension"])


@lowers("collective-permute")
def collective_permute(lw: Lowering, node: Node) -> None:
    check_single_replica(node)
    src = node.operands[0]
    lw.set(node, lw.ref(src) if permute_receives(node) else zeros(lw, node))


@lowers("replica-id", "partition-id")
def replica_id(lw: Lowering, node: Node) -> None:
    lw.set(node, lw.const(np.zeros((), np.uint32), dt.U32, node.name))


def zeros(lw: Lowering, node: Node) -> Ref:
    """A broadcast zero of the node's shape: one element in HBM, read with stride 0."""
    z = lw.const(np.zeros((1,) * max(1, len(node.shape))), node.dtype, "zero")
    if not node.shape:
        return z.reshape()
    for d, n in enumerate(node.shape):
        z = z.broadcast(d, n)
    return z

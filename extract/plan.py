"""Tiling plans: how an operator is cut into device instructions, as data.

One plan per operator family, decided here from the target's geometry, so that the backend that
emits the instructions and the cost model that prices them (the extraction issue) read the same
decision and never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from nxsat.sim.target import Target


@dataclass(frozen=True)
class MatmulPlan:
    """Tiles of ``[M, K] @ [K, N]``: ``m_tile`` stationary columns (output partitions), ``k_tile``
    contraction rows (partitions), ``n_tile`` moving columns (one PSUM bank of fp32)."""

    m_tile: int
    k_tile: int
    n_tile: int

    def instructions(self, M: int, K: int, N: int) -> int:
        """Matmul instructions the plan emits for one batch."""
        return -(-M // self.m_tile) * -(-K // self.k_tile) * -(-N // self.n_tile)


def matmul_plan(M: int, K: int, N: int, dtype: str, target: Target) -> MatmulPlan:
    """The largest tiles the array and one PSUM bank take."""
    mm = target.matmul
    n_bank = target.psum_bank_bytes // 4
    return MatmulPlan(min(M, mm["cols"]), min(K, mm["rows"]), min(N, mm["max_moving"], n_bank))


@dataclass(frozen=True)
class ShardPlan:
    """Splitting one dot's weight across the ``ranks`` physical cores of a logical core: each core
    loads and multiplies ``1/ranks`` of the weight, and an all-gather on the cc stream joins the
    partial results (none when the result is a model output: the host joins the shards)."""

    ranks: int
    saved_ns: float  # the weight bytes and FLOPs one core no longer does
    gather_ns: float  # the all-gather that puts the result back together (0 for an output)

    @property
    def pays(self) -> bool:
        return self.saved_ns > self.gather_ns


def shard_plan(weight_bytes: int, other_bytes: int, result_bytes: int, flops: int, matmul_dtype: str,
               gathered: bool, target: Target) -> ShardPlan:
    """What sharding a dot's weight over the logical core's physical cores saves, and what the
    all-gather costs, in the target's own terms: the dot takes max(bytes moved / memory bandwidth,
    FLOPs / TensorE peak) (its roofline), and the all-gather the collective cost formula the timing
    model charges. Sharded, a core moves its part of the weight and of the result, all of the other
    operand, and does its part of the FLOPs."""
    from nxsat.sim.target import physical_cores

    r = physical_cores(target)
    peak = target.peak_flops(matmul_dtype) or target.peak_flops("f32")
    bw = target.memory_bw

    def roof(wb: float, rb: float, f: float) -> float:
        return max((wb + other_bytes + rb) / bw, f / peak if peak else 0.0)

    saved = roof(weight_bytes, result_bytes, flops) - roof(weight_bytes / r, result_bytes / r, flops / r)
    gather = 0.0
    if gathered and r > 1:
        col = target.collectives
        cost = target.cost("all_gather", "cc", ())
        assert cost is not None, f"{target.name} prices no all_gather"
        wire = (r - 1) * result_bytes / r
        gather = cost({**target.constants, "N": 0, "P": 0, "R": r, "steps": r - 1, "wire_bytes": wire,
                       "fixed_ns": col["fixed_ns"], "hop_ns": col["hop_ns"],
                       "link_gbps": col["link_gbps_per_rank"]}) / target.engines["cc"].clock_ghz
    return ShardPlan(r, saved, gather)

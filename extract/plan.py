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

"""The functional executor: runs a linked device program on numpy, whole tiles at a time.

Memory is modeled as bytes: SBUF and PSUM are ``[partitions, bytes]`` arrays per rank and an on-chip
tensor is a typed view at its partition and offset, so tiles that share memory really share it.
HBM tensors are separate arrays; a scratch tensor exists from its first access to its last
(:func:`scratch_lives`). Instructions run in the verifier's order (any order the semaphores
allow gives the same result, since the verifier refused races); each rank of an SPMD program has
its own memory and collectives combine them.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from nxsat.diagnostics import Warnings, error
from nxsat.sim import numerics as nm
from nxsat.sim.isa import RAccess
from nxsat.sim.program import Program, Tensor
from nxsat.sim.verify import Linked

DEFAULT_MAX_BYTES = 8 << 30


def max_host_bytes() -> int:
    """Host memory the executor may use (NXSAT_SIM_MAX_BYTES, default 8 GiB)."""
    try:
        return int(os.environ.get("NXSAT_SIM_MAX_BYTES", DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


@dataclass
class RankState:
    """The memory of one rank: HBM tensors by name, SBUF and PSUM as byte arrays, cached typed views."""

    hbm: dict[str, np.ndarray]
    sbuf: np.ndarray
    psum: np.ndarray
    bases: dict[str, np.ndarray] = field(default_factory=dict)


class _Ctx:
    """The memory of one rank as instructions see it (implements isa.ExecCtx)."""

    def __init__(self, state: RankState, rank: int, saturate: dict[str, bool], warnings: Warnings,
                 shared: frozenset[str] = frozenset()) -> None:
        self.state = state
        self.rank = rank
        self.shared = shared  # HBM tensors rank 0 writes for every rank (private_tensors): writes skipped
        self.saturate = saturate
        self.warnings = warnings
        self.groups: dict[tuple[int, int], tuple[list[np.ndarray], list[np.ndarray]]] = {}

    def _base(self, t: Tensor) -> np.ndarray:
        b = self.state.bases.get(t.name)
        if b is None:
            if t.onchip:
                mem = self.state.sbuf if t.kind == "sbuf" else self.state.psum
                assert t.offset is not None
                rows = mem[t.partition:t.partition + t.shape[0], t.offset:t.offset + t.row_bytes]
                b = rows.view(t.dtype.np).reshape(t.shape)
            else:
                b = self.state.hbm[t.name]
            self.state.bases[t.name] = b
        return b

    def view(self, ra: RAccess, writable: bool = False) -> np.ndarray:
        v = self.state.bases.get(ra.name)
        if v is None:
            v = self._base(ra.tensor)
        if ra.npindex is not None:
            v = v[ra.npindex]
        for op, arg in ra.acc.views:
            if op == "index":
                v = v[tuple(ix.start if ix.single else slice(ix.start, ix.stop, ix.step) for ix in arg)]
            elif op == "permute":
                v = v.transpose(arg)
            elif op == "broadcast":
                shape = list(v.shape)
                shape[arg[0]] = arg[1]
                v = np.broadcast_to(v, shape)
            else:
                v = np.reshape(v, arg, copy=False) if writable else np.reshape(v, arg)
        return v

    def read(self, ra: RAccess) -> np.ndarray:
        return self.view(ra)

    def write(self, ra: RAccess, values: np.ndarray) -> None:
        if ra.name in self.shared:
            return
        v = self.view(ra, writable=True)
        cast = nm.device_cast(values, ra.dtype, self.saturate.get(ra.dtype.name, False))
        v[...] = np.asarray(cast).reshape(v.shape)

    def write_raw(self, ra: RAccess, values: np.ndarray) -> None:
        if ra.name in self.shared:
            return
        v = self.view(ra, writable=True)
        v[...] = np.asarray(values).reshape(v.shape)

    def warn(self, message: str) -> None:
        self.warnings.warn("NCC_WRUN001", message)


def shard(prog: Program, t: Tensor, value: np.ndarray, rank: int) -> np.ndarray:
    """Rank ``rank``'s part of a host array for tensor ``t`` (the whole array when not sharded)."""
    if t.shard is None or prog.ranks == 1:
        return value
    return np.split(value, prog.ranks, axis=t.shard)[rank]


def identical_ranks(lk: Linked) -> bool:
    """Every rank computes the same bits: no input or output is split across them and no instruction
    combines them (one program on the same state; no instruction reads its rank). One rank's state is
    then held and run for all: resnet50 compiled for trn2 (no weight split pays) ran in 0.56-1.04 s
    instead of 1.25-1.53 s."""
    return all(t.shard is None for t in lk.program.tensors.values()) and not any(
        c.op.combines_ranks for c in lk.instrs)


def private_tensors(lk: Linked) -> set[str]:
    """The HBM tensors whose contents may differ between ranks. Every other HBM tensor is one array that
    all ranks share: rank 0 writes it, the others compute the same bits and skip the write. mobilenet_v2
    on trn2 splits one weight (a 1.2 us gain) and simulating both ranks in full took 14.1 GiB.

    Rank-dependent data starts in a sharded input or output and in a collective that hands each rank its
    own part (``Op.rank_dependent``), and flows forward: an instruction that reads it writes it (a
    collective that combines the ranks' parts into one result, all_gather or all_reduce, writes the same
    data everywhere). On chip it is followed byte by byte in program order (a map of SBUF and PSUM: an
    access counts by its hull of partitions and row bytes, and only a dense write of rank-independent
    data clears what it covers); in HBM by tensor, for the whole run. An instruction with several
    results makes its HBM results private (skipping one write of several would not be sound)."""
    prog = lk.program
    target = lk.target
    private = {t.name for t in prog.tensors.values() if not t.onchip and t.shard is not None}
    maps = {"sbuf": np.zeros((target.partitions, target.sbuf_bytes), bool),
            "psum": np.zeros((target.partitions, target.psum_bytes), bool)}
    any_tainted = False
    for i in lk.order:
        c = lk.instrs[i]
        if c.op.rank_dependent:
            div = True
        elif c.op.combines_ranks:
            div = False
        else:
            div = any(ra.name in private if not ra.onchip else
                      any_tainted and bool(maps[ra.memory][ra.p0:ra.p1, ra.lo:ra.hi].any()) for ra in c.reads)
        hbm = [ra.name for ra in c.writes if not ra.onchip]
        if div or (hbm and len(c.writes) > 1):
            private.update(hbm)
        for ra in c.writes:
            if not ra.onchip:
                continue
            if div:
                maps[ra.memory][ra.p0:ra.p1, ra.lo:ra.hi] = True
                any_tainted = True
            elif any_tainted and ra.dense:
                maps[ra.memory][ra.p0:ra.p1, ra.lo:ra.hi] = False
    return private


def scratch_lives(lk: Linked, weight: Callable[[Tensor], int] = lambda t: 1
                  ) -> tuple[dict[int, list[Tensor]], dict[int, list[Tensor]], int]:
    """The scratch tensors each step of the run order creates (zeros, at their first access) and frees
    (after their last), and the most bytes they hold at once (each counted ``weight`` times). A compiled
    training step keeps every intermediate in a scratch tensor of its own: mobilenet_v2's add up to
    24 GiB, far more than are live at any one time."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step, i in enumerate(lk.order):
        c = lk.instrs[i]
        for ra in (*c.reads, *c.writes):
            if ra.tensor.kind == "scratch":
                first.setdefault(ra.name, step)
                last[ra.name] = step
    tensors = lk.program.tensors
    born: dict[int, list[Tensor]] = defaultdict(list)
    dies: dict[int, list[Tensor]] = defaultdict(list)
    change: dict[int, int] = defaultdict(int)
    for name in sorted(first, key=first.__getitem__):
        t = tensors[name]
        born[first[name]].append(t)
        dies[last[name]].append(t)
        change[first[name]] += t.nbytes * weight(t)
        change[last[name] + 1] -= t.nbytes * weight(t)
    live = peak = 0
    for step in sorted(change):
        live += change[step]
        peak = max(peak, live)
    return born, dies, peak


def execute(lk: Linked, inputs: Mapping[str, np.ndarray], consts: Mapping[str, np.ndarray],
            warnings: Warnings | None = None) -> list[np.ndarray]:
    """Run the program; ``inputs`` and ``consts`` by tensor name, host (global) shapes and exact dtypes.
    Returns the outputs in declaration order, host shapes."""
    prog = lk.program
    target = lk.target
    warnings = warnings if warnings is not None else Warnings()
    ranks = 1 if identical_ranks(lk) else prog.ranks
    private = private_tensors(lk) if ranks > 1 else set()
    copies = {name: ranks if name in private else 1 for name in prog.tensors}
    born, dies, scratch_peak = scratch_lives(lk, lambda t: copies[t.name])
    hbm_bytes = sum(t.nbytes * copies[t.name] for t in prog.tensors.values() if not t.onchip and t.kind != "scratch")
    onchip = target.partitions * (target.sbuf_bytes + target.psum_bytes)
    need = hbm_bytes + scratch_peak + ranks * onchip
    if need > max_host_bytes():
        raise error("NCC_ERUN001", f"simulating this program needs {need / 2**30:.1f} GiB of host memory; "
                    f"the limit is {max_host_bytes() / 2**30:.1f} GiB", hint="raise NXSAT_SIM_MAX_BYTES")
    saturate = {name: target.fp8_saturates(name) for name in nm.FP8_MAX}
    shared = frozenset(t.name for t in prog.tensors.values() if not t.onchip and t.name not in private)
    ctxs: list[_Ctx] = []
    for r in range(ranks):
        hbm: dict[str, np.ndarray] = {}
        for t in prog.tensors.values():
            if t.onchip or t.kind == "scratch":
                continue
            if r and t.name in shared:
                hbm[t.name] = ctxs[0].state.hbm[t.name]
            elif t.kind == "input":
                hbm[t.name] = np.ascontiguousarray(shard(prog, t, inputs[t.name], r)).copy()
            elif t.kind == "const":
                hbm[t.name] = np.ascontiguousarray(consts[t.name]).copy()
            else:
                hbm[t.name] = np.zeros(t.shape, dtype=t.dtype.np)
        state = RankState(hbm, np.zeros((target.partitions, target.sbuf_bytes), np.uint8),
                          np.zeros((target.partitions, target.psum_bytes), np.uint8))
        ctxs.append(_Ctx(state, r, saturate, warnings, shared if r else frozenset()))
    # One BLAS thread: a program's matmuls are small (a member multiplies at most 128x128 by 128x512),
    # threads gain little on them, and while another process holds a core OpenBLAS's spinning threads
    # made a run 22x slower (6.2 ms against 0.28 ms per instruction, bench/sim_scale.py's program).
    # Transcendental functions over large tiles use the host's cores on their own (numerics.threads).
    with threadpool_limits(limits=1, user_api="blas"), np.errstate(all="ignore"):
        for step, i in enumerate(lk.order):
            for t in born.get(step, ()):
                first = np.zeros(t.shape, dtype=t.dtype.np)
                for x in ctxs:
                    x.state.hbm[t.name] = first if x.rank == 0 or t.name in shared else np.zeros_like(first)
            c = lk.instrs[i]
            c.op.run_all(ctxs, c)
            for t in dies.get(step, ()):
                for x in ctxs:
                    del x.state.hbm[t.name]
                    x.state.bases.pop(t.name, None)
    outs: list[np.ndarray] = []
    for t in prog.outputs():
        parts = [x.state.hbm[t.name] for x in ctxs]
        if t.shard is not None and prog.ranks > 1:
            outs.append(np.concatenate(parts, axis=t.shard))
        else:
            outs.append(parts[0].copy())
    return outs

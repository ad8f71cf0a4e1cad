"""The functional executor: runs a linked device program on numpy, whole tiles at a time.

Memory is modeled as bytes: SBUF and PSUM are ``[partitions, bytes]`` arrays per rank and an on-chip
tensor is a typed view at its partition and offset, so tiles that share memory really share it.
HBM tensors are separate arrays; a scratch tensor exists from its first access to its last.
Instructions run as the device's queues would run them, each stream in order once its semaphore
waits are met, the large numpy work of some on the host's other cores (:class:`_Streams`): any
order the semaphores allow gives the same result, since the verifier refused races. Each rank of an
SPMD program has its own memory and collectives combine them.
"""

from __future__ import annotations

import ctypes
import functools
import heapq
import os
import queue
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from nxsat.diagnostics import Warnings, error
from nxsat.sim import numerics as nm
from nxsat.sim.isa import LInstr, RAccess
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

    def __init__(self, state: RankState, rank: int, saturate: dict[str, bool],
                 shared: frozenset[str] = frozenset()) -> None:
        self.state = state
        self.rank = rank
        self.shared = shared  # HBM tensors rank 0 writes for every rank (private_tensors): writes skipped
        self.saturate = saturate
        self.warned: list[tuple[int, str]] = []  # (instruction, message): reported in the verifier's order
        self.groups: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {}

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
        self.warned.append((_running.instr, message))


_running = threading.local()  # the instruction this host thread runs (``instr``)


class _Streams:
    """Runs the instructions as the device's queues would: each stream in its own order, an instruction
    once the semaphores it waits for have been signalled by instructions that have finished; of those
    ready, the earliest in the verifier's order first.

    An instruction runs on this thread as soon as it is ready; one whose numpy work is large (a matmul
    group's products, a transcendental function over a big tile) reads its operands here and returns
    the rest (``Op.run``), which runs on a host thread while the streams go on. Its own stream goes on
    too, past instructions that touch nothing it still has to write, and its signals (and those of
    the instructions after it in its stream) count once it has finished, in stream order. The
    verifier proved the program race-free, so any order the semaphores allow computes the same bits:
    a pipelined program's products, activations and copies overlap on the host's cores as they do on
    the engines. A scratch tensor exists from the first instruction that touches it to the last."""

    def __init__(self, lk: Linked, ctxs: list[_Ctx], shared: frozenset[str]) -> None:
        self.lk = lk
        self.ctxs = ctxs
        self.shared = shared
        self.linked = lk.instrs
        self.step = [0] * len(self.linked)  # place in the verifier's order: priority among ready ones
        for n, i in enumerate(lk.order):
            self.step[i] = n
        self.lists = [lk.by_stream[s] for s in lk.streams]
        self.head = [0] * len(self.lists)  # next to start, per stream
        self.retired = [0] * len(self.lists)  # finished and signalled, per stream (a prefix)
        self.finished = bytearray(len(self.linked))
        self.flying: list[list[int]] = [[] for _ in self.lists]  # started, still writing, per stream
        self.stalled = [False] * len(self.lists)  # its next instruction touches what one of those writes
        self.count = dict.fromkeys(lk.program.semaphores, 0)  # signals of retired instructions
        self.parked: dict[str, list[tuple[int, int]]] = defaultdict(list)  # sem -> (count awaited, stream)
        self.ready: list[tuple[int, int]] = []  # (step of its next instruction, stream)
        tensors = lk.program.tensors
        self.scratch = {i: [tensors[n] for n in names] for i, names in lk.scratch_touches.items()}
        self.users: dict[str, int] = defaultdict(int)  # scratch tensor -> instructions yet to finish
        for names in lk.scratch_touches.values():
            for n in names:
                self.users[n] += 1

    def run(self) -> None:
        helpers = _Helpers(nm.threads() - 1)
        for k in range(len(self.lists)):
            self.wake(k)
        try:
            while True:
                while self.ready:
                    self.advance(heapq.heappop(self.ready)[1], helpers)
                if not helpers.flying:
                    break
                for k, i in helpers.landed(wait=True):
                    self.landed(k, i)
        finally:
            helpers.close()
        assert self.retired == [len(lst) for lst in self.lists], "the verifier let a deadlock through"

    def consider(self, k: int) -> bool:
        """Is stream ``k``'s next instruction ready? If not, park the stream on a semaphore it still
        waits for, or stall it until its own instructions have written what it touches."""
        lst = self.lists[k]
        h = self.head[k]
        if h == len(lst):
            return False
        i = lst[h]
        for w in self.linked[i].instr.waits:
            if self.count[w.sem] < w.value:
                heapq.heappush(self.parked[w.sem], (w.value, k))
                return False
        if self.flying[k] and _touches(self.linked[i], self.flying[k], self.linked):
            self.stalled[k] = True
            return False
        return True

    def advance(self, k: int, helpers: _Helpers) -> None:
        """Run stream ``k``'s instructions while each is ready and the earliest ready."""
        lst, flying, linked = self.lists[k], self.flying[k], self.linked
        while True:
            i = lst[self.head[k]]
            self.head[k] += 1
            if i in self.scratch:
                self.start(i)
            _running.instr = i
            c = linked[i]
            later = c.op.run_all(self.ctxs, c)
            if later is not None and helpers.threads:
                flying.append(i)
                helpers.submit((k, i, later))
            else:
                if later is not None:
                    _finish_later(later)
                self.finished[i] = 1
                self.retire(k)
            if helpers.flying:
                for kk, j in helpers.landed():
                    self.landed(kk, j)
            if not self.consider(k):
                return
            step = self.step[lst[self.head[k]]]
            if self.ready and self.ready[0][0] < step:
                heapq.heappush(self.ready, (step, k))
                return

    def landed(self, k: int, i: int) -> None:
        """A host thread has finished instruction ``i`` of stream ``k``."""
        self.finished[i] = 1
        self.flying[k].remove(i)
        self.retire(k)
        if self.stalled[k]:
            self.stalled[k] = False
            self.wake(k)

    def wake(self, k: int) -> None:
        if self.consider(k):
            heapq.heappush(self.ready, (self.step[self.lists[k][self.head[k]]], k))

    def retire(self, k: int) -> None:
        """Signal for stream ``k``'s finished instructions, in stream order."""
        lst, r = self.lists[k], self.retired[k]
        while r < self.head[k] and self.finished[lst[r]]:
            j = lst[r]
            r += 1
            self.retired[k] = r
            if j in self.scratch:
                self.free(j)
            for sig in self.linked[j].instr.signals:
                n = self.count[sig] + 1
                self.count[sig] = n
                p = self.parked.get(sig)
                while p and p[0][0] <= n:
                    self.wake(heapq.heappop(p)[1])

    def start(self, i: int) -> None:
        for t in self.scratch[i]:
            if t.name in self.ctxs[0].state.hbm:
                continue
            first = np.zeros(t.shape, dtype=t.dtype.np)
            for x in self.ctxs:
                x.state.hbm[t.name] = first if x.rank == 0 or t.name in self.shared else np.zeros_like(first)

    def free(self, i: int) -> None:
        for t in self.scratch[i]:
            self.users[t.name] -= 1
            if not self.users[t.name]:
                for x in self.ctxs:
                    del x.state.hbm[t.name]
                    x.state.bases.pop(t.name, None)


def _touches(c: LInstr, flying: list[int], linked: list[LInstr]) -> bool:
    """Does ``c`` access what one of the ``flying`` instructions has still to write?"""
    return any(a.overlaps(b) for j in flying for b in linked[j].writes for a in (*c.reads, *c.writes))


def _finish_later(later: Callable[[], None]) -> None:
    with np.errstate(all="ignore"), nm.alone():  # numpy's error state is per thread
        later()


class _Helpers:
    """Host threads that finish what instructions leave (``Op.run``), one fewer than the executor's
    threads: the executor's own thread is the last, and takes a waiting task itself when no
    instruction is ready. Tasks start in the order they were given."""

    def __init__(self, threads: int) -> None:
        self.threads = max(0, threads)
        self.waiting: deque[tuple[int, int, Callable[[], None]]] = deque()
        self.done: queue.SimpleQueue[tuple[int, int, BaseException | None]] = queue.SimpleQueue()
        self.flying = 0
        self.closed = False
        self.cv = threading.Condition()
        self.pool = [threading.Thread(target=self._work, name=f"nxsat-finish-{n}", daemon=True)
                     for n in range(self.threads)]
        for t in self.pool:
            t.start()

    def submit(self, task: tuple[int, int, Callable[[], None]]) -> None:
        self.flying += 1
        with self.cv:
            self.waiting.append(task)
            self.cv.notify()

    def _take(self) -> tuple[int, int, Callable[[], None]] | None:
        with self.cv:
            return self.waiting.popleft() if self.waiting else None

    def _work(self) -> None:
        while True:
            with self.cv:
                while not self.waiting and not self.closed:
                    self.cv.wait()
                if not self.waiting:
                    return
                k, i, later = self.waiting.popleft()
            self._finish(k, i, later)

    def _finish(self, k: int, i: int, later: Callable[[], None]) -> None:
        try:
            _finish_later(later)
            self.done.put((k, i, None))
        except BaseException as e:  # noqa: BLE001 - handed to the executor's thread, which raises it
            self.done.put((k, i, e))

    def landed(self, wait: bool = False) -> list[tuple[int, int]]:
        """Tasks that have finished (``wait``: at least one, doing a waiting one here if any)."""
        if wait and self.done.empty():
            task = self._take()
            if task is not None:
                self._finish(*task)
        out = []
        while self.flying and (wait or not self.done.empty()):
            k, i, err = self.done.get()
            self.flying -= 1
            if err is not None:
                raise err
            out.append((k, i))
            wait = False
        return out

    def close(self) -> None:
        """Stop the threads once the tasks given have finished (an instruction that failed leaves the
        others to land before its error propagates)."""
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        for t in self.pool:
            t.join()


@functools.cache
def _keep_freed_blocks() -> None:
    """Keep freed heap blocks in the process (glibc: blocks up to 32 MiB from the heap, up to 512 MiB of
    free heap kept). Every instruction makes and frees temporaries of a few hundred KiB; glibc's
    defaults hand them back to the kernel and fault fresh zeroed pages in for the next, which took a
    quarter of a first run (bench/sim_scale.py at 10k instructions, one thread: 4.3 s against 2.9 s,
    1 s of it system time). A no-op off glibc."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 4 << 20)
    mallopt(_M_TRIM_THRESHOLD, 512 << 20)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


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


def scratch_peak(lk: Linked, weight: Callable[[Tensor], int] = lambda t: 1) -> int:
    """The most bytes scratch tensors hold at once in the verifier's order, each existing from its first
    access to its last and counted ``weight`` times: the executor's memory check (its own order differs
    where streams run side by side). A compiled training step keeps every intermediate in a scratch
    tensor of its own: mobilenet_v2's add up to 24 GiB, far more than are live at any one time."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    touches = lk.scratch_touches
    for step, i in enumerate(lk.order):
        for name in touches.get(i, ()):
            first.setdefault(name, step)
            last[name] = step
    change: dict[int, int] = defaultdict(int)
    for name, step in first.items():
        t = lk.program.tensors[name]
        change[step] += t.nbytes * weight(t)
        change[last[name] + 1] -= t.nbytes * weight(t)
    live = peak = 0
    for step in sorted(change):
        live += change[step]
        peak = max(peak, live)
    return peak


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
    scratch = scratch_peak(lk, lambda t: copies[t.name])
    hbm_bytes = sum(t.nbytes * copies[t.name] for t in prog.tensors.values()
                    if not t.onchip and t.kind != "scratch" and t.alias is None)
    onchip = target.partitions * (target.sbuf_bytes + target.psum_bytes)
    need = hbm_bytes + scratch + ranks * onchip
    if need > max_host_bytes():
        raise error("NCC_ERUN001", f"simulating this program needs {need / 2**30:.1f} GiB of host memory; "
                    f"the limit is {max_host_bytes() / 2**30:.1f} GiB", hint="raise NXSAT_SIM_MAX_BYTES")
    saturate = {name: target.fp8_saturates(name) for name in nm.FP8_MAX}
    shared = frozenset(t.name for t in prog.tensors.values() if not t.onchip and t.name not in private)
    ctxs: list[_Ctx] = []
    for r in range(ranks):
        hbm: dict[str, np.ndarray] = {}
        for t in prog.tensors.values():
            if t.onchip or t.kind == "scratch" or t.alias is not None:
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
        ctxs.append(_Ctx(state, r, saturate, shared if r else frozenset()))
    # One BLAS thread: a program's matmuls are small (a member multiplies at most 128x128 by 128x512),
    # threads gain little on them, and while another process holds a core OpenBLAS's spinning threads
    # made a run 22x slower (6.2 ms against 0.28 ms per instruction, bench/sim_scale.py's program).
    # Transcendental functions over large tiles use the host's cores on their own (numerics.threads).
    _keep_freed_blocks()
    with threadpool_limits(limits=1, user_api="blas"), np.errstate(all="ignore"):
        _Streams(lk, ctxs, shared).run()
    warned = [w for x in ctxs for w in x.warned]
    if warned:  # in the verifier's order, whichever order the streams ran in
        step = {i: n for n, i in enumerate(lk.order)}
        for _, message in sorted(warned, key=lambda w: step[w[0]]):
            warnings.warn("NCC_WRUN001", message)
    outs: list[np.ndarray] = []
    for t in prog.outputs():
        parts = [x.state.hbm[t.alias or t.name] for x in ctxs]
        if t.shard is not None and prog.ranks > 1:
            outs.append(np.concatenate(parts, axis=t.shard))
        else:
            outs.append(parts[0].copy())
    return outs

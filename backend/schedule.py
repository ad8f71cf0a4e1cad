"""Scheduling: the instruction graph onto engine streams and DMA queues, tiles into SBUF and PSUM,
dependences into semaphores, and the result as a device program.

A memory-aware list scheduler: an instruction is ready when everything it depends on is scheduled;
among the ready ones it takes the earliest in program order, except that a DMA load may go ahead
of its turn (within a window, and while SBUF has room) so that data arrives before it is needed.
An on-chip tile gets its place when its first instruction is scheduled and gives it back after its
last one; an instruction whose tile does not fit waits until enough is freed. A tile placed where
an earlier one lived also waits for that tile's last users (the reuse is a dependence too).

Every instruction signals its stream's semaphore, so "the n-th instruction of stream k has
completed" is ``wait=s_k>=n``; each instruction waits for the producers on other streams it
depends on (a wait an earlier instruction of the same stream already made is left out). Streams
are slices of one global order consistent with the dependences, so the program cannot deadlock,
and each semaphore has one signalling stream (the verifier checks it in one pass).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from nxsat.backend.graph import Buf, Graph, Inst, Ref
from nxsat.diagnostics import error
from nxsat.sim.program import Access, Instr, Program, Tensor, Wait
from nxsat.sim.target import Target

ALIGN = 64
LOOKAHEAD = 48  # how many instructions a DMA load may go ahead of program order
PREFETCH_SBUF_FRACTION = 0.6  # and only while SBUF stays below this fraction in use
ENGINES = ("pe", "act", "dve", "pool", "cc")


@dataclass
class Scheduled:
    """The device program and what the report wants to know about the schedule."""

    program: Program
    constants: dict[str, np.ndarray]
    sbuf_peak: int = 0
    psum_peak: int = 0
    order: list[Inst] = field(default_factory=list)


def _lo(u: tuple[int, int, Buf]) -> int:
    return u[0]


def _hi(u: tuple[int, int, Buf]) -> int:
    return u[1]


class _Space:
    """Next-fit allocation of one memory's bytes per partition (all partitions alike): the search starts
    where the last allocation ended and wraps around, so a tile rarely lands where one was just freed
    (whose last users it would have to wait for)."""

    FAR = 64  # live places walked past before the search jumps to the free end

    def __init__(self, size: int, align: int) -> None:
        self.size = size
        self.align = align
        self.used: list[tuple[int, int, Buf]] = []  # sorted (lo, hi, buf): disjoint, so by ``hi`` too
        self.place: dict[int, int] = {}  # id(buf) -> its ``lo`` in ``used``
        self.history: list[tuple[int, int, list[Inst]]] = []  # freed (lo, hi, last users): disjoint, by lo
        self.history_lo: list[int] = []  # their ``lo``, for bisection
        self.in_use = 0
        self.peak = 0
        self.cursor = 0  # next fit: memory just freed is reused last, so its users need not be waited for

    def alloc(self, buf: Buf, nbytes: int, bank: int | None = None) -> tuple[int, list[Inst]] | None:
        """A place for ``nbytes`` (at a multiple of ``bank`` bytes when given, not crossing one when it
        fits in one), and the instructions that last used that memory."""
        step = bank or self.align
        need = nbytes if bank is None else -(-nbytes // bank) * bank
        off = self._fit(self.cursor, need, step)
        if off is None:
            off = self._fit(0, need, step)
        if off is None:
            return None
        self.cursor = off + need
        insort(self.used, (off, off + need, buf), key=_lo)
        self.place[id(buf)] = off
        self.in_use += need
        self.peak = max(self.peak, self.in_use)
        waits = [u for k in self._history_over(off, off + need) for u in self.history[k][2]]
        return off, waits

    def _fit(self, start: int, need: int, step: int) -> int | None:
        """The first place at or after ``start`` with room for ``need`` bytes."""
        off = -(-start // step) * step
        used = self.used
        first = bisect_right(used, off, key=_hi)  # the first place ending after ``off``
        for k in range(first, len(used)):
            lo, hi, _ = used[k]
            if off + need <= lo:
                break
            if k - first == self.FAR:
                # a long run of live places: past the last one, if there is room, rather than walking
                # them all at every allocation
                end = -(-used[-1][1] // step) * step
                if end + need <= self.size:
                    return end
            off = max(off, -(-hi // step) * step)
        return off if off + need <= self.size else None

    def _index(self, buf: Buf) -> int:
        """Where ``buf``'s place is in ``used`` (found by its ``lo``: the places are disjoint)."""
        k = bisect_left(self.used, self.place[id(buf)], key=_lo)
        while self.used[k][2] is not buf:  # an empty place may share its ``lo`` with the next one
            k += 1
        return k

    def commit(self, buf: Buf) -> None:
        """The place given to ``buf`` is taken: earlier tiles' records there are no longer needed (whoever
        uses this memory next waits for ``buf``'s users, which waited for theirs)."""
        lo0, hi0, _ = self.used[self._index(buf)]
        self._forget(lo0, hi0)

    def _history_over(self, lo0: int, hi0: int) -> range:
        """The indices of the freed records that meet ``[lo0, hi0)`` (the records are disjoint, by ``lo``)."""
        i = bisect_right(self.history_lo, lo0) - 1
        if i < 0 or self.history[i][1] <= lo0:
            i += 1
        j = bisect_left(self.history_lo, hi0, lo=max(i, 0))
        return range(max(i, 0), j)

    def _forget(self, lo0: int, hi0: int) -> None:
        over = self._history_over(lo0, hi0)
        if not over:
            return
        keep = []
        for k in over:
            lo, hi, users = self.history[k]
            if lo < lo0:
                keep.append((lo, lo0, users))
            if hi0 < hi:
                keep.append((hi0, hi, users))
        self.history[over.start:over.stop] = keep
        self.history_lo[over.start:over.stop] = [r[0] for r in keep]

    def _take(self, buf: Buf) -> tuple[int, int] | None:
        """``buf``'s place, given back (None when it has none)."""
        if id(buf) not in self.place:
            return None
        lo, hi, _ = self.used.pop(self._index(buf))
        del self.place[id(buf)]
        self.in_use -= hi - lo
        return lo, hi

    def unalloc(self, buf: Buf) -> None:
        """Take back a place just given (before it is committed: nothing has used it)."""
        self._take(buf)

    def free(self, buf: Buf, last_users: list[Inst]) -> None:
        place = self._take(buf)
        if place is not None:
            lo, hi = place
            self._forget(lo, hi)
            at = bisect_left(self.history_lo, lo)
            self.history.insert(at, (lo, hi, last_users))
            self.history_lo.insert(at, lo)


def schedule(graph: Graph, target: Target, inputs: list[Buf], outputs: list[Buf], flags: tuple[str, ...] = (),
             lnc: int | None = None) -> Scheduled:
    """Order, place and synchronise the graph; the device program for ``target``."""
    insts = graph.insts
    n = len(insts)
    succ: dict[int, list[Inst]] = defaultdict(list)
    indeg = [0] * n
    for i in insts:
        for d in i.deps:
            succ[d.index].append(i)
        indeg[i.index] = len(i.deps)
    sbuf = _Space(target.sbuf_bytes, ALIGN)
    psum = _Space(target.psum_bytes, ALIGN)
    bank = target.psum_bank_bytes
    # Tiles that own memory (views of a tile's bytes are placed with it; their uses count as its uses).
    remaining: dict[int, int] = {id(b): len({u.index for u in b.users}) for b in graph.bufs
                                 if b.onchip and b.base is None}
    placed: set[int] = set()
    extra: dict[int, list[Inst]] = defaultdict(list)  # reuse dependences found while placing
    # A tile's reuse dependences, for every instruction that writes it: two writers of disjoint parts of a
    # tile (a load and a memset of its padding) need not be ordered, so each waits for the memory itself.
    reuse: dict[int, list[Inst]] = {}

    def is_load(i: Inst) -> bool:
        return i.engine == "dma" and bool(i.writes) and i.writes[0].buf.onchip

    ready_loads: list[int] = []
    ready_other: list[int] = []
    for i in insts:
        if indeg[i.index] == 0:
            heapq.heappush(ready_loads if is_load(i) else ready_other, i.index)
    order: list[Inst] = []
    frontier = 0  # lowest unscheduled program position
    scheduled = [False] * n

    def place(i: Inst) -> bool:
        new = list({id(r.buf.root): r.buf.root for r in i.writes
                    if r.buf.onchip and id(r.buf.root) not in placed}.values())
        got: list[tuple[Buf, _Space]] = []
        for b in new:
            space = sbuf if b.kind == "sbuf" else psum
            res = space.alloc(b, b.row_bytes, bank if b.kind == "psum" else None)
            if res is None:
                for g, sp in got:  # undo: nothing used that memory
                    sp.unalloc(g)
                    placed.discard(id(g))
                    g.offset = None
                return False
            b.offset, waits = res
            placed.add(id(b))
            reuse[id(b)] = waits
            got.append((b, space))
        for b, space in got:
            space.commit(b)
        for b in {id(r.buf): r.buf for r in i.writes if r.buf.onchip}.values():
            extra[i.index].extend(reuse.get(id(b), ()))
        return True

    while len(order) < n:
        pick = None
        # A load may go ahead of program order (within a window, while SBUF has room): its data then
        # arrives in a tile of its own while the tiles before it are still in use (double buffering).
        if ready_loads and ready_loads[0] <= frontier + LOOKAHEAD and (
                ready_loads[0] == frontier or sbuf.in_use <= PREFETCH_SBUF_FRACTION * sbuf.size):
            if place(insts[ready_loads[0]]):
                pick = insts[heapq.heappop(ready_loads)]
        if pick is None:
            stuck: list[tuple[list[int], int]] = []
            while ready_loads or ready_other:
                h = ready_loads if not ready_other or (ready_loads and ready_loads[0] < ready_other[0]) \
                    else ready_other
                idx = heapq.heappop(h)
                if place(insts[idx]):
                    pick = insts[idx]
                    break
                stuck.append((h, idx))
            for h, idx in stuck:
                heapq.heappush(h, idx)
        if pick is None:
            need = max((sum(r.buf.row_bytes for r in insts[i].writes if r.buf.kind == "sbuf")
                        for i in (*ready_loads, *ready_other)), default=0)
            raise error("NCC_EOOM001", f"the working set does not fit on chip: {sbuf.in_use} of {sbuf.size} SBUF "
                        f"bytes per partition are live and {need} more are needed",
                        hint="the model's tiles are too large for this target")
        scheduled[pick.index] = True
        order.append(pick)
        while frontier < n and scheduled[frontier]:
            frontier += 1
        for s in succ[pick.index]:
            indeg[s.index] -= 1
            if indeg[s.index] == 0:
                heapq.heappush(ready_loads if is_load(s) else ready_other, s.index)
        for b in {id(r.buf.root): r.buf.root for r in (*pick.reads, *pick.writes)}.values():
            if not b.onchip:
                continue
            remaining[id(b)] -= 1
            if remaining[id(b)] == 0:
                (sbuf if b.kind == "sbuf" else psum).free(b, list(b.users))
    if len(order) != n:
        raise error("NCC_IINT001", "internal compiler error: the instruction graph has a cycle")
    return _emit(graph, target, order, extra, inputs, outputs, flags, lnc, sbuf.peak, psum.peak)


def _emit(graph: Graph, target: Target, order: list[Inst], extra: dict[int, list[Inst]], inputs: list[Buf],
          outputs: list[Buf], flags: tuple[str, ...], lnc: int | None, sbuf_peak: int, psum_peak: int) -> Scheduled:
    prog = Program(target=target.name, lnc=lnc, flags=tuple(flags))
    consts: dict[str, np.ndarray] = {}
    order_kinds = {"input": 0, "output": 1, "const": 2, "scratch": 3}
    hbm = [b for b in graph.bufs if not b.onchip and b.users or b in inputs or b in outputs]
    hbm_sorted = ([b for b in inputs] + [b for b in outputs]
                  + sorted((b for b in hbm if b.kind in ("const", "scratch")),
                           key=lambda b: (order_kinds[b.kind], b.name)))
    for b in hbm_sorted:
        prog.tensors[b.name] = Tensor(b.name, b.kind, b.dtype, b.shape, shard=b.shard)
        if b.kind == "const":
            consts[b.name] = b.value
    slot: dict[int, str] = {}
    slots: dict[tuple, str] = {}
    for b in graph.bufs:
        if not b.onchip or not b.users:
            continue
        if b.base is not None:  # a view: the same bytes as its base
            b.partition, b.offset = b.base.partition, b.base.offset
        key = (b.kind, b.partition, b.offset, b.dtype.name, b.shape)
        name = slots.get(key)
        if name is None:
            name = f"{'sb' if b.kind == 'sbuf' else 'ps'}{len(slots)}"
            slots[key] = name
            prog.tensors[name] = Tensor(name, b.kind, b.dtype, b.shape, partition=b.partition, offset=b.offset)
        slot[id(b)] = name

    def access(r: Ref) -> Access:
        a = r.access()
        name = slot.get(id(r.buf), r.buf.name)
        if r.as_type is not None:  # a bitcast: a tensor of the other type over the same bytes
            b = r.buf
            key = (b.kind, b.partition, b.offset, r.as_type.name, b.shape)
            name = slots.get(key)
            if name is None:
                name = slots[key] = f"{'sb' if b.kind == 'sbuf' else 'ps'}{len(slots)}"
                prog.tensors[name] = Tensor(name, b.kind, r.as_type, b.shape, partition=b.partition, offset=b.offset)
        return Access(name, a.index, a.views)

    # Streams: engines as named; DMA queues chosen round-robin, loads and stores apart.
    stream: dict[int, str] = {}
    queues = target.dma_queues
    load_q = list(range(0, max(1, queues * 3 // 4)))
    store_q = list(range(len(load_q), queues)) or load_q
    nl = ns = 0
    for i in order:
        if i.engine != "dma":
            stream[i.index] = i.engine
        elif i.writes and i.writes[0].buf.onchip:
            stream[i.index] = f"q{load_q[nl % len(load_q)]}"
            nl += 1
        else:
            stream[i.index] = f"q{store_q[ns % len(store_q)]}"
            ns += 1
    pos: dict[int, int] = {}
    count: dict[str, int] = defaultdict(int)
    for i in order:
        s = stream[i.index]
        count[s] += 1
        pos[i.index] = count[s]  # the semaphore value once it has completed
    used = sorted(count, key=lambda s: (s not in ENGINES, ENGINES.index(s) if s in ENGINES else int(s[1:])))
    for s in used:
        prog.semaphores[f"s_{s}"] = 0
    known: dict[str, dict[str, int]] = defaultdict(dict)  # stream -> semaphore -> value already waited for
    for i in order:
        s = stream[i.index]
        need: dict[str, int] = {}
        for d in (*i.deps, *extra.get(i.index, ())):
            ds = stream[d.index]
            if ds == s:
                continue
            sem = f"s_{ds}"
            if pos[d.index] > need.get(sem, 0):
                need[sem] = pos[d.index]
        waits = []
        for sem, v in sorted(need.items()):
            if known[s].get(sem, 0) >= v:
                continue
            known[s][sem] = v
            waits.append(Wait(sem, v))
        attrs = {k: (access(v) if isinstance(v, Ref) else v) for k, v in i.attrs.items()}
        prog.instrs.append(Instr(s, i.opcode, tuple(access(r) for r in i.operands), attrs, tuple(waits),
                                 (f"s_{s}",), origin=i.origin))
    return Scheduled(prog, consts, sbuf_peak, psum_peak, order)

"""Scheduling: the instruction graph onto engine streams and DMA queues, tiles into SBUF and PSUM,
dependences into semaphores, and the result as a device program.

A memory-aware list scheduler: an instruction is ready when everything it depends on is scheduled;
among the ready ones it takes the earliest in program order (or, as -O2 and -O3 also try, the one with
the longest chain of work behind it, and either in time: ``ScheduleOptions``), except that a DMA load may
go ahead of its turn (within a window, and while SBUF has room) so that data arrives before it is needed.
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
import itertools
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from nxsat.backend.graph import Buf, Graph, Inst, Ref
from nxsat.diagnostics import error
from nxsat.extract.plan import (
    PREFETCH_SBUF_FRACTION,  # a load goes ahead only while SBUF stays below it
    load_queues,
)
from nxsat.sim.program import Access, Instr, Program, Tensor, Wait
from nxsat.sim.target import Target

ALIGN = 64
LOOKAHEAD = 48  # how many instructions a DMA load may go ahead of program order
# Of the weights' queues, with a ring: the ones for the weights that do not stream through it (the rest are
# the ring's). ResNet-50 generic (trn1, -O2, bf16; 8 weight queues): the ring's schedule 612.8 us with no
# queues of its own; with 1 to 6 left free 568.1, 567.0, over 598.6 (the schedule without a ring kept),
# 562.9, 560.6, 561.9: no trend worth fitting, 2 kept.
RING_FREE_QUEUES = 2
# Out of program order, an accumulator leaves this many PSUM banks to the frontier: its work may hold one
# (an attention's P.V accumulator) while it transposes into another (attention_s2048 under transformer,
# critical-path order: seven output projections' accumulators started ahead, waiting for SBUF to evacuate
# into, and the frontier's P.V then found no bank for its transposes with one left to it)
PSUM_FRONTIER_BANKS = 2
REACH = 512  # how far past the lowest unscheduled instruction one may take on-chip memory
ENGINES = ("pe", "act", "dve", "pool", "cc")


@dataclass(frozen=True)
class ScheduleOptions:
    """The scheduler's choices that -O3 measures (nxsat.driver's search): how many instructions a load may go
    ahead of program order, and how many of the load queues the model's inputs (weights) take, the rest
    kept for loads of computed values (0: all loads share them). Kept apart, an activation's load no longer
    waits in a queue behind a weight streaming ahead (gemma3: 3.6% faster; BERT-base: 1% slower, its loads
    nearly all weights). ``critical``: ready instructions taken longest chain of work first
    (``_critical_order``) rather than in program order."""

    lookahead: int = LOOKAHEAD
    weight_queues: int = 0
    critical: bool = False
    prefetch: float = PREFETCH_SBUF_FRACTION  # the share of SBUF loads issued ahead may fill
    # > 0: instead, a load goes ahead while the SBUF the program holds until its tile's first use, with
    # every load already ahead, stays within this share (``_Profile``)
    room: float = 0.0
    # ready instructions taken in time (``_Clock``, ``_Ready``): per engine the first by rank (program order,
    # or with ``critical`` the longest chain) unless another fits in the gap before it can start
    timed: bool = False
    # forwarding (backend/forward.py) writes an elementwise result straight into the place of the copy that
    # was its only reader (``_write_in_place``); -O1 does not: its instructions then stay alike, and the NEFF
    # stage and the replay take them by template (BERT-12: 0.25 s of -O1's 3.2)
    write_in_place: bool = True
    # > 0: the weights loaded to be converted to the matmul's type (``_streamed``) stream through a ring of
    # this share of SBUF, at its top, apart from the work's tiles: each load goes ahead, in program order, as
    # soon as the ring has room, however far ahead of its use, and the work's tiles neither wait behind the
    # weights nor find their memory cut up by them (ResNet-50: the stem's and first stages' activations held
    # the weights back behind the prefetch share, the DMA queues idle for 100 us)
    ring: float = 0.0
    # with ``critical``: loads go ahead longest chain first too, where otherwise they go in program order
    # (resnet_small under unet-inference: the 76 vectors of its batch norms, computed first in the
    # program, were queued ahead of the stem's image)
    loads_by_rank: bool = False
    # with ``timed``: the clock counts the waits between dependent steps as the simulator replays them (the
    # same engine's dependent-instruction stall, another's access latency), where otherwise it counts a
    # flat stall between engines only. Neither wins everywhere: resnet_small under unet-inference, its
    # batch norms' chains of three dependent VectorE steps filling the gap before the max pool, 20.9 ->
    # 20.4 us with them (with ``loads_by_rank``); mha_block generic 19.8 -> 20.7 us
    stalls: bool = False

    def to_json(self) -> dict[str, int | bool | float]:
        out: dict[str, int | bool | float] = {"lookahead": self.lookahead, "weight_queues": self.weight_queues,
                                              "critical": self.critical}
        if self.prefetch != PREFETCH_SBUF_FRACTION:
            out["prefetch"] = self.prefetch
        if self.room:
            out["room"] = self.room
        if self.timed:
            out["timed"] = True
        if not self.write_in_place:
            out["write_in_place"] = False
        if self.ring:
            out["ring"] = self.ring
        if self.loads_by_rank:
            out["loads_by_rank"] = True
        if self.stalls:
            out["stalls"] = True
        return out


DEFAULT_SCHEDULE = ScheduleOptions()  # -O2's
LEVEL1_SCHEDULE = ScheduleOptions(write_in_place=False)  # -O1's


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


class _Gaps:
    """The free gaps of a memory by their aligned start (one slot per ``align`` bytes), each slot holding
    the room its gap has from there: a max-tree over the slots finds the first gap at or after a slot
    with room for a request in a few steps, where a walk over the live places took thousands."""

    def __init__(self, size: int, align: int) -> None:
        self.align = align
        self.leaves = 1 << max(1, -(-size // align) - 1).bit_length()
        self.tree = [0] * (2 * self.leaves)

    def room(self, lo: int, hi: int) -> tuple[int, int]:
        """The gap ``[lo, hi)``'s slot and its room from the aligned start (0 when none)."""
        slot = -(-lo // self.align)
        return slot, max(0, hi - slot * self.align)

    def set(self, lo: int, hi: int, present: bool) -> None:
        """Add or remove the gap ``[lo, hi)`` (only gaps with room are kept: their slots are distinct)."""
        slot, room = self.room(lo, hi)
        if not room:
            return
        tree, i = self.tree, slot + self.leaves
        tree[i] = room if present else 0
        while i > 1:
            i >>= 1
            wide = max(tree[2 * i], tree[2 * i + 1])
            if tree[i] == wide:
                break  # nothing above changes
            tree[i] = wide

    def widest(self) -> int:
        return self.tree[1]

    def last(self, need: int) -> int | None:
        """The last slot whose gap has room for ``need`` bytes."""
        tree = self.tree
        if tree[1] < need:
            return None
        i = 1
        while i < self.leaves:
            i = 2 * i + 1 if tree[2 * i + 1] >= need else 2 * i
        return i - self.leaves

    def room_at(self, slot: int) -> int:
        return self.tree[slot + self.leaves]

    def first(self, slot: int, need: int) -> int | None:
        """The first slot at or after ``slot`` whose gap has room for ``need`` bytes."""
        tree, i = self.tree, slot + self.leaves
        if slot >= self.leaves:
            return None
        while tree[i] < need:
            while i & 1:  # a right child: up until the subtree to the right is a sibling
                i >>= 1
            if i == 0:
                return None
            i += 1
        while i < self.leaves:
            i = 2 * i if tree[2 * i] >= need else 2 * i + 1
        return i - self.leaves


def _profiles(graph: Graph, space: _Space) -> tuple[_Profile, _Profile]:
    """Per program position: the SBUF bytes per partition held (each tile from its first instruction to its
    last), and the largest tile placed there."""
    n = len(graph.insts)
    diff = [0] * (n + 1)
    largest = [0] * n
    for b in graph.bufs:
        if b.kind == "sbuf" and b.base is None and b.users:
            pos = [u.index for u in b.users]
            need = space.need(b.row_bytes)
            diff[min(pos)] += need
            diff[max(pos) + 1] -= need
            largest[min(pos)] = max(largest[min(pos)], need)
    return _Profile(list(itertools.accumulate(diff[:n]))), _Profile(largest)


class _Profile:
    """The SBUF bytes per partition the program holds at each of its positions, taken in program order (each
    tile from its first instruction to its last), plus what loads issued ahead add: a load that goes ahead
    at position ``f`` holds its tile from there to its first use ``u``. A load may go ahead while that
    stays within a share of SBUF over ``[f, u)``: its data then arrives early without taking the room the
    work between needs (a fixed share does not know it: ResNet-50's weights streamed only once the share
    of its first stages' activations fell below it, and a larger share took room those stages needed).
    A max-tree with range increments over the positions."""

    def __init__(self, values: list[int]) -> None:
        n = len(values)
        self.n, self.h = n, max(1, n.bit_length())
        self.t = [0] * n + values
        self.d = [0] * n
        for i in range(n - 1, 0, -1):
            self.t[i] = max(self.t[2 * i], self.t[2 * i + 1])

    def _apply(self, p: int, v: int) -> None:
        self.t[p] += v
        if p < self.n:
            self.d[p] += v

    def _build(self, p: int) -> None:
        t, d = self.t, self.d
        while p > 1:
            p >>= 1
            t[p] = max(t[2 * p], t[2 * p + 1]) + d[p]

    def _push(self, p: int) -> None:
        d = self.d
        for sh in range(self.h, 0, -1):
            i = p >> sh
            if 0 < i < self.n and d[i]:
                self._apply(2 * i, d[i])
                self._apply(2 * i + 1, d[i])
                d[i] = 0

    def add(self, lo: int, hi: int, v: int) -> None:
        """``v`` more bytes held over positions ``[lo, hi)``."""
        lo, hi = lo + self.n, hi + self.n
        l0, r0 = lo, hi
        while lo < hi:
            if lo & 1:
                self._apply(lo, v)
                lo += 1
            if hi & 1:
                hi -= 1
                self._apply(hi, v)
            lo >>= 1
            hi >>= 1
        self._build(l0)
        self._build(r0 - 1)

    def most(self, lo: int, hi: int) -> int:
        """The most bytes held at any position of ``[lo, hi)``."""
        lo, hi = lo + self.n, hi + self.n
        self._push(lo)
        self._push(hi - 1)
        out = -(1 << 62)
        t = self.t
        while lo < hi:
            if lo & 1:
                out = max(out, t[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                out = max(out, t[hi])
            lo >>= 1
            hi >>= 1
        return out


class _Space:
    """Next-fit allocation of one memory's bytes per partition (all partitions alike): the search starts
    where the last allocation ended and wraps around, so a tile rarely lands where one was just freed
    (whose last users it would have to wait for). Places start at multiples of ``align``; with
    ``whole``, a tile takes whole units of it (PSUM: banks, so a tile never crosses one it fits in)."""

    FAR = 64  # live places passed before the search jumps to the free end

    def __init__(self, size: int, align: int, whole: bool = False) -> None:
        self.size = size
        self.align = align
        self.whole = whole
        self.used: list[tuple[int, int, Buf]] = []  # sorted (lo, hi, buf): disjoint, so by ``hi`` too
        self.place: dict[int, int] = {}  # id(buf) -> its ``lo`` in ``used`` (-1: an empty tile, not in it)
        self.history: list[tuple[int, int, list[Inst]]] = []  # freed (lo, hi, last users): disjoint, by lo
        self.history_lo: list[int] = []  # their ``lo``, for bisection
        self.in_use = 0
        self.peak = 0
        self.cursor = 0  # next fit: memory just freed is reused last, so its users need not be waited for
        # the free gaps, for a search that does not walk the live places (and fails at once when no gap
        # is wide enough: a full SBUF refuses many ready instructions at every step)
        self.gaps = _Gaps(size, align)
        self.gaps.set(0, size, True)

    def alloc(self, buf: Buf, nbytes: int, high: bool = False) -> tuple[int, list[Inst]] | None:
        """A place for ``nbytes``, and the instructions that last used that memory. ``high``: at the top of
        the last gap with room (a tile loaded far ahead of its use: kept apart from the work at hand's
        tiles, which come and go next-fit from below, so it does not cut the free memory into pieces too
        small for them)."""
        need = self.need(nbytes)
        if need == 0:  # an empty tile takes no place (an empty place would break the order by ``hi``)
            self.place[id(buf)] = -1
            return 0, []
        if need > self.widest():
            return None
        if high:
            slot = self.gaps.last(need)
            if slot is None:
                return None
            off = (slot * self.align + self.gaps.room_at(slot) - need) // self.align * self.align
        else:
            off = self._fit(self.cursor, need)
            if off is None:
                off = self._fit(0, need)
            if off is None:
                return None
            self.cursor = off + need
        k = bisect_right(self.used, off, key=_lo)
        prev, nxt = self._bounds(k, k)
        self.used.insert(k, (off, off + need, buf))
        self.gaps.set(prev, nxt, False)
        self.gaps.set(prev, off, True)
        self.gaps.set(off + need, nxt, True)
        self.place[id(buf)] = off
        self.in_use += need
        self.peak = max(self.peak, self.in_use)
        waits = [u for k in self._history_over(off, off + need) for u in self.history[k][2]]
        return off, waits

    def need(self, nbytes: int) -> int:
        """The bytes an allocation of ``nbytes`` takes."""
        return -(-nbytes // self.align) * self.align if self.whole else nbytes

    def _fit(self, start: int, need: int) -> int | None:
        """The first place at or after ``start`` with room for ``need`` bytes; past the last live place
        instead, if there is room there, when the first is more than FAR places on."""
        step = self.align
        off = -(-start // step) * step
        used = self.used
        first = bisect_right(used, off, key=_hi)  # the first place ending after ``off``
        if off + need <= (used[first][0] if first < len(used) else self.size):
            return off
        if first == len(used):
            return None
        slot = self.gaps.first(-(-used[first][1] // step), need)
        if slot is None:
            return None
        at = slot * step
        if bisect_right(used, at, key=_hi) - first > self.FAR:
            end = -(-used[-1][1] // step) * step
            if end + need <= self.size:
                return end
        return at

    def _bounds(self, before: int, after: int) -> tuple[int, int]:
        """The end of the place before index ``before`` and the start of the one at index ``after``."""
        return (self.used[before - 1][1] if before else 0,
                self.used[after][0] if after < len(self.used) else self.size)

    def widest(self) -> int:
        """The most bytes one allocation could get now."""
        return self.gaps.widest()

    def _index(self, buf: Buf) -> int:
        """Where ``buf``'s place is in ``used`` (found by its ``lo``: the places are disjoint)."""
        k = bisect_left(self.used, self.place[id(buf)], key=_lo)
        assert self.used[k][2] is buf
        return k

    def commit(self, buf: Buf) -> None:
        """The place given to ``buf`` is taken: earlier tiles' records there are no longer needed (whoever
        uses this memory next waits for ``buf``'s users, which waited for theirs)."""
        if self.place[id(buf)] < 0:
            return
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
        if self.place[id(buf)] < 0:
            del self.place[id(buf)]
            return None
        k = self._index(buf)
        prev, nxt = self._bounds(k, k + 1)
        lo, hi, _ = self.used.pop(k)
        self.gaps.set(prev, lo, False)
        self.gaps.set(hi, nxt, False)
        self.gaps.set(prev, nxt, True)
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
             lnc: int | None = None, options: ScheduleOptions = DEFAULT_SCHEDULE) -> Scheduled:
    """Order, place and synchronise the graph; the device program for ``target``."""
    insts = graph.insts
    n = len(insts)
    succ: dict[int, list[Inst]] = defaultdict(list)
    indeg = [0] * n
    for i in insts:
        for d in i.deps:
            succ[d.index].append(i)
        indeg[i.index] = len(i.deps)
    ring_bytes = int(options.ring * target.sbuf_bytes) // ALIGN * ALIGN
    streamed = _streamed(graph, ring_bytes // 2) if ring_bytes else set()
    ring_bytes = ring_bytes if streamed else 0
    sbuf = _Space(target.sbuf_bytes - ring_bytes, ALIGN)
    ring = _Space(ring_bytes, ALIGN)  # the top of SBUF, above ``sbuf``'s bytes
    psum = _Space(target.psum_bytes, target.psum_bank_bytes, whole=True)

    def space_of(b: Buf) -> _Space:
        return psum if b.kind == "psum" else ring if id(b) in streamed else sbuf
    # Tiles that own memory (views of a tile's bytes are placed with it; their uses count as its uses).
    remaining: dict[int, int] = {id(b): len({u.index for u in b.users}) for b in graph.bufs
                                 if b.onchip and b.base is None}
    placed: set[int] = set()
    extra: dict[int, list[Inst]] = defaultdict(list)  # reuse dependences found while placing
    # A tile's reuse dependences, for every instruction that writes it: two writers of disjoint parts of a
    # tile (a load and a memset of its padding) need not be ordered, so each waits for the memory itself.
    reuse: dict[int, list[Inst]] = {}

    ready_loads: list[int] = []
    ring_loads: list[int] = []  # the streamed weights' loads, by program position
    # The order ready instructions are taken in (loads apart, by program position): program order, or with
    # ``critical`` the longest chain of work still behind each first (see ScheduleOptions).
    by_rank = _critical_order(insts, succ) if options.critical else list(range(n))
    rank = by_rank if not options.critical else _inverse(by_rank)

    clock = _Clock(target, _Queues(target, options.weight_queues, False, streamed), extra,
                   options.stalls) if options.timed else None
    ready_other = _Ready(insts, rank, by_rank, clock)
    # the key loads wait by (``ready_loads``, ``parked_loads``): program position, or with ``loads_by_rank``
    # their rank; ``at`` maps a key back to the instruction
    by_rank_loads = options.loads_by_rank and options.critical
    key: Callable[[int], int] = rank.__getitem__ if by_rank_loads else int
    at: Callable[[int], int] = by_rank.__getitem__ if by_rank_loads else int

    def push_ready(idx: int) -> None:
        """Loads by program position, the rest by ``rank`` (``_Ready``)."""
        if _is_load(insts[idx]):
            if id(insts[idx].writes[0].buf.root) in streamed:
                heapq.heappush(ring_loads, idx)
            else:
                heapq.heappush(ready_loads, key(idx))
        else:
            ready_other.push(idx)

    for i in insts:
        if indeg[i.index] == 0:
            push_ready(i.index)
    order: list[Inst] = []
    frontier = 0  # lowest unscheduled program position
    scheduled = [False] * n

    # Instructions whose new tile did not fit wait aside (per memory, by the bytes that did not fit) until
    # a free makes a gap that wide: nothing else can make room, and retrying every refused instruction
    # at every step was quadratic once thousands of loads were ready and SBUF was full.
    parked: dict[int, list[tuple[int, int]]] = {id(sbuf): [], id(psum): [], id(ring): []}  # heaps of (need, index)
    parked_loads: list[int] = []  # heap of parked loads' indices (an entry is stale once unparked)
    is_parked = bytearray(n)
    # Instructions more than REACH past the frontier that would take memory wait for it to come nearer:
    # a tile placed for far-off work (a memset of padding, ready from the start) holds its memory until
    # that work runs, and enough of them left the frontier no room (mobilenet_v2: 110 KB of SBUF per
    # partition held for instructions up to 300k ahead).
    deferred: list[int] = []

    def new_tiles(i: Inst) -> list[Buf]:
        """The tiles ``i`` writes first."""
        return list({id(r.buf.root): r.buf.root for r in i.writes
                     if r.buf.onchip and id(r.buf.root) not in placed}.values())

    def place(i: Inst, new: list[Buf]) -> tuple[_Space, int] | None:
        """Give ``i``'s new tiles their places; None, or the memory and bytes that did not fit."""
        got: list[tuple[Buf, _Space]] = []
        for b in new:
            space = space_of(b)
            if space is psum and (options.critical or options.timed) and i.index != frontier and \
                    psum.size - psum.in_use - psum.need(b.row_bytes) < PSUM_FRONTIER_BANKS * target.psum_bank_bytes:
                # out of program order, an accumulator may not take the last bank: the work it waits for may
                # need one (an epilogue's per-channel column, transposed on TensorE), and eight accumulators
                # started ahead held them all (ResNet-50's last convolution in critical-path order)
                res = None
            else:
                res = space.alloc(b, b.row_bytes, high=profile is not None and space is sbuf and i.index > frontier
                                  and _is_load(i))
            if res is None:
                for g, sp in got:  # undo: nothing used that memory
                    sp.unalloc(g)
                    placed.discard(id(g))
                    g.offset = None
                return space, space.need(b.row_bytes)
            b.offset, waits = res
            if space is ring:
                b.offset += sbuf.size
            placed.add(id(b))
            reuse[id(b)] = waits
            got.append((b, space))
        for b, space in got:
            space.commit(b)
        for b in {id(r.buf): r.buf for r in i.writes if r.buf.onchip}.values():
            extra[i.index].extend(reuse.get(id(b), ()))
        return None

    def park(idx: int, blocked: tuple[_Space, int], load: bool) -> None:
        space, need = blocked
        heapq.heappush(parked[id(space)], (need, idx))
        is_parked[idx] = 1
        if load:
            heapq.heappush(parked_loads, key(idx))

    def unpark(space: _Space, everything: bool = False) -> None:
        waiting, wide = parked[id(space)], space.widest()
        while waiting and (everything or waiting[0][0] <= wide):
            idx = heapq.heappop(waiting)[1]
            is_parked[idx] = 0
            push_ready(idx)

    profile, largest = _profiles(graph, sbuf) if options.room else (None, None)
    room = options.room * sbuf.size
    refused_at = [-1, -1]  # (load, frontier) of the last load the profile kept back

    def may_go_ahead(idx: int) -> bool:
        """May the load ``idx`` be issued now, ahead of program order? (at the frontier it always may)"""
        if idx == frontier:
            return True
        if profile is None:
            return sbuf.in_use <= options.prefetch * sbuf.size
        if refused_at == [idx, frontier]:
            return False
        tiles = [b for b in new_tiles(insts[idx]) if b.kind == "sbuf"]
        need = sum(sbuf.need(b.row_bytes) for b in tiles)
        first = min((min(u.index for u in b.users) for b in tiles), default=idx)
        # what is live now beyond the profile (tiles placed out of program order) is taken to stay live
        # and the largest tile the work before its use places must still find a gap
        if first > frontier and (sbuf.in_use + profile.most(frontier, first) - profile.most(frontier, frontier + 1)
                                 + need > room or sbuf.widest() - need < largest.most(frontier, first)):
            refused_at[:] = [idx, frontier]
            return False
        return True

    def went_ahead(idx: int, new: list[Buf]) -> None:
        """The profile holds the new tiles of a load issued ahead from the frontier to their first use."""
        if profile is None or idx == frontier:
            return
        for b in new:
            first = min(u.index for u in b.users)
            if b.kind == "sbuf" and first > frontier:
                profile.add(frontier, first, sbuf.need(b.row_bytes))

    def lowest_parked_load() -> int:
        while parked_loads and not is_parked[at(parked_loads[0])]:
            heapq.heappop(parked_loads)
        return parked_loads[0] if parked_loads else n

    while len(order) < n:
        pick = None
        # A streamed weight goes ahead as soon as the ring has room for it, in program order: the first
        # waits for room (it leaves the heap only once placed), the rest behind it
        if ring_loads and place(insts[ring_loads[0]], new_tiles(insts[ring_loads[0]])) is None:
            pick = insts[heapq.heappop(ring_loads)]
        # A load may go ahead of program order (within a window, while SBUF has room): its data then
        # arrives in a tile of its own while the tiles before it are still in use (double buffering).
        # (the earliest load first: when that one is parked, it would not fit)
        first = at(ready_loads[0]) if ready_loads else n
        if pick is None and ready_loads and first <= frontier + options.lookahead \
                and ready_loads[0] < lowest_parked_load() and may_go_ahead(first):
            new = new_tiles(insts[first])
            blocked = place(insts[first], new)
            heapq.heappop(ready_loads)
            if blocked is None:
                went_ahead(first, new)
                pick = insts[first]
            else:
                park(first, blocked, True)
        for retry in (False, True):
            if pick is not None:
                break
            if retry:  # a parked instruction whose other tile another one has placed may fit now
                for space in (sbuf, psum):
                    unpark(space, everything=True)
            while ready_loads or ready_other:
                load = not ready_other or bool(ready_loads) and rank[at(ready_loads[0])] < rank[ready_other.peek()]
                idx = at(heapq.heappop(ready_loads)) if load else ready_other.pop()
                new = new_tiles(insts[idx])
                if new and idx > frontier + REACH:
                    heapq.heappush(deferred, idx)
                    continue
                blocked = place(insts[idx], new)
                if blocked is None:
                    pick = insts[idx]
                    break
                park(idx, blocked, load)
        if pick is None:
            waiting = [idx for heap in parked.values() for _, idx in heap]
            cands = (*map(at, ready_loads), *ready_other, *waiting)

            def most_needed(kind: str, cands: tuple[int, ...] = cands) -> tuple[int, int]:
                return max(((sum(r.buf.row_bytes for r in insts[i].writes if r.buf.kind == kind), i)
                            for i in cands), default=(0, -1))

            space, kind = sbuf, "SBUF"
            need, at = most_needed("sbuf")
            if need == 0:  # blocked on accumulators, not on SBUF
                space, kind = psum, "PSUM"
                need, at = most_needed("psum")
            where = f" (at {insts[at].origin})" if at >= 0 and insts[at].origin else ""
            raise error("NCC_EOOM001", f"the working set does not fit on chip: {space.in_use} of {space.size} {kind} "
                        f"bytes per partition are live and {need} more are needed{where}",
                        hint="the model's tiles are too large for this target")
        scheduled[pick.index] = True
        order.append(pick)
        if clock is not None:
            clock.issue(pick)
        while frontier < n and scheduled[frontier]:
            frontier += 1
        while deferred and deferred[0] <= frontier + REACH:
            push_ready(heapq.heappop(deferred))
        for s in succ[pick.index]:
            indeg[s.index] -= 1
            if indeg[s.index] == 0:
                push_ready(s.index)
        for b in {id(r.buf.root): r.buf.root for r in (*pick.reads, *pick.writes)}.values():
            if not b.onchip:
                continue
            remaining[id(b)] -= 1
            if remaining[id(b)] == 0:
                space = space_of(b)
                space.free(b, list(b.users))
                unpark(space)
    if len(order) != n:
        raise error("NCC_IINT001", "internal compiler error: the instruction graph has a cycle")
    return _emit(graph, target, order, extra, inputs, outputs, flags, lnc, sbuf.peak + ring.peak, psum.peak,
                 options.weight_queues, streamed)


class _Ready:
    """The ready instructions other than loads, highest ``rank`` first. With a clock (``timed``), per engine:
    its highest-ranked step, unless another fits, by the clock, in the gap before that one can start (its
    inputs still on their way: backfilling never delays it); and of the engines' next steps, the one that
    can start first. An engine runs its stream in order, so program or chain order alone queues it behind a
    step whose inputs are late (mha_block: every head's transposes ahead of the first head's scores)."""

    def __init__(self, insts: list[Inst], rank: list[int], by_rank: list[int], clock: _Clock | None) -> None:
        self.insts, self.rank, self.by_rank, self.clock = insts, rank, by_rank, clock
        self.heaps: dict[str, list[int]] = defaultdict(list)  # ranks, per engine (one heap without a clock)
        self.by_ready: dict[str, list[tuple[float, int]]] = defaultdict(list)  # (inputs there, rank)
        self.live: set[int] = set()

    def _key(self, idx: int) -> str:
        return self.insts[idx].engine if self.clock is not None else ""

    def push(self, idx: int) -> None:
        r = self.rank[idx]
        self.live.add(r)
        heapq.heappush(self.heaps[self._key(idx)], r)
        if self.clock is not None and self.insts[idx].engine != "dma":
            heapq.heappush(self.by_ready[self._key(idx)], (self.clock.ready(self.insts[idx]), r))

    def __bool__(self) -> bool:
        return bool(self.live)

    def __iter__(self) -> Iterator[int]:
        return (self.by_rank[r] for r in self.live)

    def _top_rank(self, h: list[int]) -> int | None:
        while h and h[0] not in self.live:  # taken already (entries are left behind, not removed)
            heapq.heappop(h)
        return h[0] if h else None

    def _top_ready(self, h: list[tuple[float, int]]) -> tuple[float, int] | None:
        while h and h[0][1] not in self.live:
            heapq.heappop(h)
        return h[0] if h else None

    def peek(self) -> int:
        """The instruction :meth:`pop` takes."""
        if self.clock is None:
            return self.by_rank[self._top_rank(self.heaps[""])]
        best: tuple[float, int] | None = None
        for e, h in self.heaps.items():
            r = self._top_rank(h)
            if r is None:
                continue
            c = self.insts[self.by_rank[r]]
            choice = (self.clock.could_start(c), r)
            x = self._top_ready(self.by_ready[e]) if e != "dma" else None
            if x is not None and x[1] != r:
                filler = self.insts[self.by_rank[x[1]]]
                start = self.clock.could_start(filler)
                if start + self.clock.duration(filler) <= choice[0]:
                    choice = (start, x[1])
            if best is None or choice < best:
                best = choice
        assert best is not None
        return self.by_rank[best[1]]

    def pop(self) -> int:
        idx = self.peek()
        self.live.discard(self.rank[idx])
        return idx


class _Clock:
    """When each scheduled instruction would start and end, roughly (``ScheduleOptions.timed``), for
    :class:`_Ready` to take the steps in time. Durations follow the target's cost table in shape, not to
    the cycle (a pass of N elements per partition, two-input passes at 2N; a matmul of N moving columns,
    fp32 at four passes), a step on another engine than its input's producer waits the dependent-step
    stall (with ``ScheduleOptions.stalls``, the waits the simulator replays: :meth:`ready`); a DMA takes
    the fixed latency, then its bytes over the engines its descriptors keep busy, at most an even share
    of the core's DMA engines with the transfers in flight when it begins (the simulator shares them
    max-min fairly: a transfer issued beside seven others moves at an eighth of the rate, however few
    bytes they have), and no sooner than the engines finish every transfer issued before it, after the
    transfer before it on its queue (the queue ``_emit`` will give it: a queue runs its transfers one
    after the other). What the simulator measures is what -O2 keeps."""

    PASS = {"tensor_tensor": 2.0, "select": 2.0}  # cycles per element where not one

    def __init__(self, target: Target, queues: _Queues, extra: dict[int, list[Inst]], stalls: bool = False) -> None:
        self.queues, self.extra = queues, extra
        self.queue_free: dict[int, float] = defaultdict(float)  # when each DMA queue's last transfer ends
        self.ghz = {k: e.clock_ghz for k, e in target.engines.items()}
        dma = target.dma
        self.latency = float(dma["fixed_latency_ns"])
        self.engine_bpns = float(dma["engine_gbps"])
        self.engines = int(dma["engines"])
        self.per_engine = int(dma["partitions_per_engine"])
        self.overhead = float(dma["descriptor_overhead_ns"])
        lat = target.spec["latency"]
        # a step's wait after its producer, on the same engine (``same``, by engine) and after another
        # (``handoff``, by the producer's engine). Without ``stalls``: none on the same engine, the
        # dependent-instruction stall at ScalarE's clock after another; with: the same engine's
        # dependent-instruction stall (where it has one), and the producer's access latency and the
        # semaphore's after another, as the simulator replays them
        flat = float(lat["dependent_stall_cycles"]) / self.ghz.get("act", 1.4)
        self.same = {e: float(lat["dependent_stall_cycles"]) / self.ghz[e]
                     for e in lat.get("dependent_stall_engines", ()) if e in self.ghz} if stalls else {}
        self.handoff = {e: float(lat["access_cycles"]) / g + float(lat.get("semaphore_ns", 0.0))
                        for e, g in self.ghz.items()} if stalls else {}
        self.handoff_else = 0.0 if stalls else flat  # after a producer ``handoff`` does not list (a DMA)
        self.min_ii = float(target.constants.get("MIN_II", 64))
        self.free: dict[str, float] = defaultdict(float)
        self.end: dict[int, float] = {}
        self.dma_pool = 0.0  # when the DMA engines' share of the transfers issued so far is done
        self.in_flight: list[float] = []  # heap: when each transfer issued so far ends

    def ready(self, i: Inst) -> float:
        return max((self.end[d.index] + (self.same.get(i.engine, 0.0) if d.engine == i.engine
                                          else self.handoff.get(d.engine, self.handoff_else)) for d in i.deps),
                   default=0.0)

    def could_start(self, i: Inst) -> float:
        t = self.ready(i)
        return t if i.engine == "dma" else max(t, self.free[i.engine])

    def duration(self, i: Inst) -> float:
        """An engine step's ns."""
        return self._cycles(i) / self.ghz.get(i.engine, 1.4)

    def issue(self, i: Inst) -> None:
        t = self.could_start(i)
        if i.engine == "dma":
            end = self._transfer(i, t)
        else:
            end = t + self.duration(i)
            self.free[i.engine] = end
        self.end[i.index] = end

    def _cycles(self, i: Inst) -> float:
        chip = [r for r in i.operands if r.buf.onchip]
        n = max((r.ap.free_elems for r in chip), default=1)
        if i.engine == "pe":
            moving = i.operands[-1] if i.operands else None
            cols = moving.ap.free_elems if moving is not None and moving.buf.onchip else n
            return max(self.min_ii, cols) * (4.0 if any(r.dtype.name == "f32" for r in i.operands[1:]) else 1.0)
        return max(self.min_ii, self.PASS.get(i.opcode, 1.0) * n)

    def _transfer(self, i: Inst, t: float) -> float:
        dst = i.operands[0]
        nbytes = dst.ap.free_elems * (dst.ap.part[1] if dst.ap.part else 1) * dst.dtype.itemsize
        chip = next((r for r in i.operands if r.buf.onchip), None)
        parts = chip.ap.part[1] if chip is not None and chip.ap.part else 1
        hbm = next((r for r in i.operands if not r.buf.onchip), None)
        run = hbm.ap.contiguous_run() if hbm is not None else nbytes
        row = max(1, nbytes // max(1, parts))
        desc = max(1, min(row, run * (hbm.dtype.itemsize if hbm is not None else 1)))
        work = nbytes * (1.0 / self.engine_bpns + self.overhead / desc)  # engine-ns
        k = max(1, min(self.engines, -(-parts // self.per_engine)))
        q = self.queues.pick(i, self.extra)
        begin = max(t + self.latency, self.queue_free[q])  # the latency overlaps the queue's transfer before
        self.dma_pool = max(self.dma_pool, begin) + work / self.engines
        flying = self.in_flight
        while flying and flying[0] <= begin:
            heapq.heappop(flying)
        # an even share of the engines with the transfers still in flight when it begins, at most its own
        share = min(k, self.engines / (len(flying) + 1))
        end = self.queue_free[q] = max(begin + work / share, self.dma_pool)
        heapq.heappush(flying, end)
        return end


# The weight of a DMA against an engine instruction's 1 in a chain's length (``_critical_order``): its ~1.3 us
# fixed latency is some thirty of the small instructions a chain of dependent steps is made of.
DMA_CHAIN_WEIGHT = 30.0


def _critical_order(insts: list[Inst], succ: dict[int, list[Inst]]) -> list[int]:
    """The instructions' indices by the longest chain of work from each to the end of the program (each
    instruction 1, a DMA ``DMA_CHAIN_WEIGHT``), longest first, then by program position: list scheduling's
    critical-path priority. Each engine runs its stream in order, so taking the next step of the longest
    chain first lets an engine work on the next head of an attention (or the next block) while another
    finishes this one's, where program order queued every engine behind one operator at a time."""
    level = [0.0] * len(insts)
    for i in reversed(insts):
        w = DMA_CHAIN_WEIGHT if i.engine == "dma" else 1.0
        level[i.index] = w + max((level[s.index] for s in succ.get(i.index, ())), default=0.0)
    return sorted(range(len(insts)), key=lambda k: (-level[k], k))


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for r, k in enumerate(perm):
        inv[k] = r
    return inv


def _is_load(i: Inst) -> bool:
    """A DMA into SBUF or PSUM."""
    return i.engine == "dma" and bool(i.writes) and i.writes[0].buf.onchip


def _of_inputs(i: Inst) -> bool:
    """Reads only the model's inputs and constants (a weight's load)."""
    return all(r.buf.kind in ("input", "const") for r in i.reads)


def _streamed(graph: Graph, most: int) -> set[int]:
    """The tiles that stream through the ring (``ScheduleOptions.ring``): weights converted to the matmul's
    type as they are loaded (written only by loads of the model's inputs and constants into a narrower
    type), at most ``most`` bytes per partition. Their uses come in program order, so the ring gives their
    room back in the order it took it. (Every loaded weight, the ones read as they are and the small
    per-channel ones among them: ResNet-50 543.0 us under unet-inference and 613.1 generic, against 532.7
    and 590.6 with the converted ones, when they were converted on an engine.)"""
    out: set[int] = set()
    for b in graph.bufs:
        if b.kind != "sbuf" or b.base is not None or not b.users or b.row_bytes > most:
            continue
        writers = [u for u in b.users if any(w.buf.root is b for w in u.writes)]
        if writers and all(_is_load(u) and _of_inputs(u) and _narrowing(u) for u in writers):
            out.add(id(b))
    return out


def _narrowing(i: Inst) -> bool:
    """A copy of one tile into a narrower type (a weight converted to bf16 as it is loaded)."""
    return (len(i.reads) == 1 and len(i.writes) == 1 and i.writes[0].buf.onchip
            and i.writes[0].dtype.itemsize < i.reads[0].dtype.itemsize)


def _passthrough(i: Inst, extra: dict[int, list[Inst]]) -> bool:
    """A DMA from the model's inputs or constants into its outputs that waits for nothing (the caller
    checks that nothing waits for it: a KV cache copied before its update is not one)."""
    return (i.engine == "dma" and not i.deps and not extra.get(i.index) and bool(i.writes)
            and all(w.buf.kind == "output" for w in i.writes) and _of_inputs(i))


class _Queues:
    """Which DMA queue each transfer goes on, taken in issue order (``_emit``; the clock of a timed schedule
    asks the same): loads round-robin over the load queues (the model's inputs, with ``weight_queues``, over
    that many of their own), and copies that wait for nothing with them (they cannot hold a queue up);
    the store queues are for what waits on compute (gemma3: 2.6% faster with its HBM-to-HBM copies among
    the loads). With ``background`` transfers (copies of inputs into outputs), the last queue is theirs:
    ``_emit`` puts them there before the rest; the clock, which does not know them yet, counts them among
    the loads (a model with such copies is priced a few queues off)."""

    def __init__(self, target: Target, weight_queues: int, background: bool,
                 streamed: set[int] | frozenset[int] = frozenset()) -> None:
        queues = target.dma_queues
        load_q = list(range(load_queues(target)))
        self.store_q = list(range(len(load_q), queues - background)) or list(range(len(load_q), queues)) or load_q
        self.background = queues - 1
        self.split = 0 < weight_queues < len(load_q)
        self.weight_q, self.other_q = (load_q[:weight_queues], load_q[weight_queues:]) if self.split \
            else (load_q, load_q)
        # the ring's weights, loaded far ahead, on queues of their own: the weights loaded for the work at
        # hand (and the image) do not wait behind them in a queue
        self.streamed = streamed
        self.ring_q = self.weight_q[:-RING_FREE_QUEUES] if streamed and len(self.weight_q) > RING_FREE_QUEUES \
            else []
        if self.ring_q:
            self.weight_q = self.weight_q[-RING_FREE_QUEUES:]
        self.nl = self.ns = self.nw = self.nr = 0

    def pick(self, i: Inst, extra: dict[int, list[Inst]]) -> int:
        if self.ring_q and _is_load(i) and id(i.writes[0].buf.root) in self.streamed:
            self.nr += 1
            return self.ring_q[(self.nr - 1) % len(self.ring_q)]
        if self.split and _is_load(i) and _of_inputs(i):
            self.nw += 1
            return self.weight_q[(self.nw - 1) % len(self.weight_q)]
        if _is_load(i) or not i.deps and not extra.get(i.index):
            self.nl += 1
            return self.other_q[(self.nl - 1) % len(self.other_q)]
        self.ns += 1
        return self.store_q[(self.ns - 1) % len(self.store_q)]


def _emit(graph: Graph, target: Target, order: list[Inst], extra: dict[int, list[Inst]], inputs: list[Buf],
          outputs: list[Buf], flags: tuple[str, ...], lnc: int | None, sbuf_peak: int, psum_peak: int,
          weight_queues: int = 0, streamed: set[int] | frozenset[int] = frozenset()) -> Scheduled:
    prog = Program(target=target.name, lnc=lnc, flags=tuple(flags))
    consts: dict[str, np.ndarray] = {}
    order_kinds = {"input": 0, "output": 1, "const": 2, "scratch": 3}
    hbm = [b for b in graph.bufs if not b.onchip and b.users or b in inputs or b in outputs]
    hbm_sorted = ([b for b in inputs] + [b for b in outputs]
                  + sorted((b for b in hbm if b.kind in ("const", "scratch")),
                           key=lambda b: (order_kinds[b.kind], b.name)))
    for b in hbm_sorted:
        prog.tensors[b.name] = Tensor(b.name, b.kind, b.dtype, b.shape, shard=b.shard, alias=b.alias)
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

    # Streams: engines as named; DMA queues chosen round-robin, loads and stores apart. Copies of the
    # model's inputs into its outputs (state a step returns unchanged: ResNet-50's 100 MB of weights)
    # depend on nothing and nothing depends on them: they go first, on a queue of their own, and flow
    # under the whole run instead of after it.
    stream: dict[int, str] = {}
    depended = {d.index for i in order for d in (*i.deps, *extra.get(i.index, ()))}
    background = [i for i in order if i.index not in depended and _passthrough(i, extra)]
    queue = _Queues(target, weight_queues, bool(background), streamed)
    if background:
        ids = {i.index for i in background}
        order = background + [i for i in order if i.index not in ids]
        for i in background:
            stream[i.index] = f"q{queue.background}"
    for i in order:
        if i.index in stream:
            continue
        stream[i.index] = i.engine if i.engine != "dma" else f"q{queue.pick(i, extra)}"
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

"""Store-to-load forwarding: a value that one operator stores from SBUF to a scratch tensor in HBM and
the next loads back into SBUF is copied on chip instead.

Lowering works operator by operator, and every value lives in HBM between them (docs/backend.md): a
convolution's output tile goes out by DMA and the next convolution's load brings it back. Each of
those DMAs costs ~1.3 us before its first byte moves (reference/neuron-hardware.md) and the pair
sits on the critical path of every layer; on a small network that is most of the latency. This pass
runs on the instruction graph after lowering: a load whose every element one store wrote, from a
tile nothing writes again, reads that tile instead: a GpSimd ``tensor_copy`` where the engines' access
rules allow it (the same bits: both are exact copies), else one SBUF-to-SBUF DMA (a convolution that
stacks taps on other partitions). A load several such stores wrote is read in pieces, one per writer
(``_pieces``: cut along one dimension, and each part along another where it still has several). A
scratch tensor nobody loads any more loses its stores and its HBM buffer.

What it may not do is run SBUF out: a forwarded tile stays live until its last read, so wherever it
does, the tiles live in program order plus the ones kept must stay within ``BUDGET`` of a partition's
SBUF (the rest is the scheduler's, to load ahead). The scheduler may still find no room, as it orders
differently: the driver then undoes the pass and forwards within a smaller budget, or not at all
(``BUDGETS``, ``nxsat.driver._backend``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.backend.graph import Buf, Graph, Inst, Ref
from nxsat.sim.program import AP, AccessError
from nxsat.sim.target import Target
from nxsat.sim.verify import engine_access_fault

BUDGET = 0.5  # of a partition's SBUF bytes: the most the tiles live in program order may take with forwarding
# The budgets the driver tries in turn when the scheduler finds no room (its order and prefetching are not
# program order, and long-lived tiles fragment SBUF: mobilenet_v2's training step fails at 0.3, fits at
# 0.15); 0: no forwarding.
BUDGETS = (BUDGET, 0.15, 0.0)
COPY_ENGINE = "pool"  # GpSimd: an exact copy, and the engine the layers leave idlest


@dataclass
class Forwarded:
    """What the pass did, for the compile report."""

    loads: int = 0  # loads that read a value on chip instead of from HBM
    copies: int = 0  # of them, engine copies (the rest are DMAs from SBUF to SBUF)
    bytes: int = 0  # the bytes they would have loaded
    stores: int = 0  # stores removed with their scratch tensor
    tensors: int = 0  # scratch tensors removed
    refused: int = 0  # loads of a value still in its tile that would have kept too much SBUF live
    split: int = 0  # loads read in pieces, one per tile that stored part of what they read
    in_place: int = 0  # of the copies, those not made: their readers read the stored tile itself
    written_in_place: int = 0  # of the copies, those not made: the stored tile's writer wrote the copy's place
    undo: Callable[[], None] | None = field(default=None, repr=False, compare=False)  # the graph as it was

    def to_json(self) -> dict[str, int]:
        return {"loads": self.loads, "copies": self.copies, "bytes": self.bytes, "stores": self.stores,
                "tensors": self.tensors, "refused_for_sbuf": self.refused, "split": self.split,
                "read_in_place": self.in_place, "written_in_place": self.written_in_place}


def addresses(ap: AP) -> np.ndarray:
    """The element offsets an access pattern touches, in its row-major order (within one partition's row
    for an on-chip access)."""
    a = np.array([ap.offset], dtype=np.int64)
    for size, stride in ap.dims:
        a = (a[:, None] + np.arange(size, dtype=np.int64) * stride).reshape(-1)
    return a


def _is_dma(i: Inst) -> bool:
    return i.engine == "dma" and i.opcode == "dma"


def _box(pos: np.ndarray, shape: tuple[int, ...]) -> tuple[slice, ...] | None:
    """The slice of an array of ``shape`` whose elements, in row-major order, are the flat positions
    ``pos`` (None when they are no such slice). Were they one, the first and last positions would be its
    corners, and the position after each inner block (its dimensions' counts multiplied) one step along
    the next dimension out: that names the only candidate, which is then compared with ``pos`` whole
    (no pass over every element's coordinates: this runs on every tile a load may read on chip)."""
    n = len(pos)
    if n == 0:
        return None
    first = [int(c) for c in np.unravel_index(int(pos[0]), shape)]
    last = [int(c) for c in np.unravel_index(int(pos[-1]), shape)]
    key: list[slice] = []
    block = 1  # elements in the dimensions inside the current one
    for d in range(len(shape) - 1, -1, -1):
        lo, hi = first[d], last[d]
        if hi == lo:
            key.append(slice(lo, lo + 1, 1))
            continue
        if hi < lo or block >= n:
            return None
        step = int(np.unravel_index(int(pos[block]), shape)[d]) - lo
        if step <= 0 or (hi - lo) % step:
            return None
        key.append(slice(lo, hi + 1, step))
        block *= (hi - lo) // step + 1
    if block != n:
        return None
    key.reverse()
    strides = np.cumprod((1, *shape[:0:-1]))[::-1]
    expect = np.zeros((), dtype=np.int64)
    for k, st in zip(key, strides):
        expect = expect[..., None] + np.arange(k.start, k.stop, k.step, dtype=np.int64) * int(st)
    return tuple(key) if np.array_equal(expect.reshape(-1), pos) else None


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def engine_ok(r: Ref, target: Target) -> bool:
    """Whether a compute engine may access ``r`` (the verifier's rule)."""
    p0, n = r.ap.part
    return engine_access_fault(p0, n, r.ap, target) is None


def _source(dst: Ref, store: Inst, pos: np.ndarray, target: Target) -> tuple[Ref, bool] | None:
    """The view of ``store``'s source tile that a load into ``dst`` would read back (``pos``: where each
    element it reads sits in the order the store wrote them), and whether an engine may copy it
    (same partitions, as the engines' access rules allow) or only a DMA may move it (SBUF to SBUF: one
    transfer instead of a store and a load); None when no view of the tile expresses it. The view is a
    slice of the tile as stored or, where the load cuts across its rows (a convolution's next tiling of
    the same image), of each partition's row taken whole."""
    src = store.operands[1]
    free = math.prod(src.shape[1:])
    if dst.shape[0] > 1 and pos[0] // free != pos[len(pos) // dst.shape[0] - 1] // free:
        return None  # the load's first partition gathers from several of the tile's: no view reads that
    bases = [src] if len(src.shape) <= 2 else [src, src.reshape(src.shape[0], int(np.prod(src.shape[1:])))]
    for base in bases:
        key = _box(pos, base.shape)
        if key is None:
            continue
        try:
            view = base[key]
            if view.shape[0] == dst.shape[0] and _squeezed(view.shape[1:]) != _squeezed(dst.shape[1:]):
                view = view.reshape(*dst.shape)
            view.ap  # noqa: B018 - resolves the chain: raises where the tile cannot be read so
        except (AccessError, IndexError, ValueError):
            continue
        if view.shape[0] == dst.shape[0] and _squeezed(view.shape[1:]) == _squeezed(dst.shape[1:]) \
                and engine_ok(view, target) and engine_ok(dst, target):
            return view, True
        if _squeezed(view.shape) == _squeezed(dst.shape):
            return view, False
    return None


def _writes(load: Inst) -> list[tuple[Inst, Ref]]:
    """The writes that overlap what ``load`` reads, with the instructions making them, in program order.
    The graph's dependences already hold the answer: a load waits for every write it overlaps (a write
    covered by a later one is replaced by it)."""
    root = load.operands[1].buf.root
    return sorted(((d, r) for d in load.deps for r in d.writes if r.buf.root is root), key=lambda dw: dw[0].index)


# the most on-chip reads one load may become (ResNet-50's max pooling reads each half of the stem's
# output, 57 rows, from the fifteen tiles of four rows its epilogue stored: at 8, two 1.6 MB DMAs of
# 17.5 us each on the critical path; at 16, 743.6 -> 724.2 us)
MAX_PIECES = 16
COPY_MIN_PARTITIONS = 32  # a piece on fewer partitions is moved by an SBUF-to-SBUF DMA, not an engine copy


def _pieces(load: Inst, writes: list[tuple[Inst, Ref]], target: Target,
            owners: _Memo) -> list[tuple[Inst, Ref, Ref, bool]] | None:
    """``load`` as on-chip reads of the tiles ``writes`` stored, one per piece of its destination: the
    destination cut along one dimension where the writer changes (a pooling's window over the two tiles
    of rows the convolution before it stored). Each piece is (store, destination piece, view of the
    store's tile, engine copy?); None when some element has no single writer, some piece has several
    or no view, or there would be more than MAX_PIECES."""
    if len(writes) > MAX_PIECES:
        return None  # a piece per writer at least
    dst, src = load.operands
    key = (src.ap, tuple(w.ap for _, w in writes))  # the same loads and stores recur layer after layer
    got = owners.get(key, lambda: _owners(*key))
    if got is None:
        return None
    flat = np.arange(math.prod(dst.shape), dtype=np.int64).reshape(dst.shape)
    # cut along one dimension, or two (a projection's [128, 2, 128] load of four heads' [64, 128] tiles)
    out = _cut(_Cut(dst, writes, flat, *got, target), [(0, n) for n in dst.shape], 2)
    return out if out is not None and len(out) > 1 else None


MEMO_BYTES = 256 << 20  # the most a pass keeps of its tables for loads and stores that recur


class _Memo:
    """Tables (numpy arrays) by the access patterns they were made from, the least recently used dropped
    past :data:`MEMO_BYTES`: the same loads and stores recur layer after layer, one after another, but
    kept to the end of the pass mobilenet_v2's training step held 13.4 GB of them (7,268 loads taken in
    pieces, each a table as long as it reads)."""

    def __init__(self, limit: int = MEMO_BYTES) -> None:
        self.limit = limit
        self.kept: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self.nbytes = 0

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key][0]
        value = make()
        n = sum(a.nbytes for a in (value if isinstance(value, tuple) else (value,)) if isinstance(a, np.ndarray))
        self.kept[key] = (value, n)
        self.nbytes += n
        while self.nbytes > self.limit and len(self.kept) > 1:
            self.nbytes -= self.kept.popitem(last=False)[1][1]
        return value


def _owners(read: AP, writes: tuple[AP, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """For each element ``read`` reads, the write (of ``writes``) that wrote it and its place in that
    write's order; None when some element has no writer or two."""
    b = addresses(read)
    written = [addresses(w) for w in writes]
    lo = min(int(a.min()) for a in written)
    hi = max(int(a.max()) for a in written) + 1
    if int(b.min()) < lo or int(b.max()) >= hi:
        return None  # reads an element no writer wrote
    if hi - lo <= 8 * sum(len(a) for a in written):  # by tables over the writers' span (as _places)
        # who wrote each element of the span (an int8: at most MAX_PIECES writers), its place in that
        # write's order, and whether a second write met it (only an element the load reads matters)
        who = np.full(hi - lo, -1, dtype=np.int8)
        at = np.zeros(hi - lo, dtype=np.int64)
        twice = np.zeros(hi - lo, dtype=bool)
        for j, a in enumerate(written):
            k = a - lo
            met = who[k] >= 0
            if met.any():
                twice[k[met]] = True
            who[k] = j
            at[k] = np.arange(len(a), dtype=np.int64)
        k = b - lo
        if bool(twice[k].any()):
            return None  # written twice: the later write is not the only one
        owner, place = who[k], at[k]
    else:
        owner = np.full(len(b), -1, dtype=np.int64)
        place = np.zeros(len(b), dtype=np.int64)
        for j, a in enumerate(written):
            order = np.argsort(a, kind="stable")
            k = np.clip(np.searchsorted(a[order], b), 0, len(a) - 1)
            hit = a[order[k]] == b
            if bool((hit & (owner >= 0)).any()):
                return None
            owner[hit] = j
            place[hit] = order[k[hit]]
    if bool((owner < 0).any()):
        return None
    return owner, place


@dataclass
class _Cut:
    """What :func:`_cut` reads: the load's destination, its writers, each element's index in the
    destination, its writer and its place in that writer's order (a function of its own, not a closure
    calling itself: that cycle kept every load's arrays alive while the cycle collector is off, and
    mobilenet_v2's compile went past 14 GB)."""

    dst: Ref
    writes: list[tuple[Inst, Ref]]
    flat: np.ndarray
    owner: np.ndarray
    place: np.ndarray
    target: Target


def _cut(c: _Cut, box: list[tuple[int, int]], cuts_left: int) -> list[tuple[Inst, Ref, Ref, bool]] | None:
    """The box of the destination as pieces: itself when one writer wrote it all, else cut along one
    dimension where the writer changes, each part again (up to ``cuts_left`` times deep)."""
    key = tuple(slice(lo, hi) for lo, hi in box)
    sub = c.flat[key]
    ks = sub.reshape(-1)
    j = int(c.owner[ks[0]])
    if not bool((c.owner[ks] != j).any()):
        piece = c.dst[key]
        got = _source(piece, c.writes[j][0], c.place[ks], c.target)
        if got is None:
            return None
        # an engine copy takes as long on 11 partitions as on 128: a narrow piece goes by DMA (gemma's
        # [11, 1024] MLP products over two [11, 512] tiles: as GpSimd copies the model ran 1.7% slower)
        return [(c.writes[j][0], piece, got[0], got[1] and piece.shape[0] >= COPY_MIN_PARTITIONS)]
    if not cuts_left:
        return None
    for d, n in enumerate(sub.shape):
        if n < 2:
            continue
        own = c.owner[np.moveaxis(sub, d, 0).reshape(n, -1)[:, 0]]  # the writer of each index's first element
        cuts = [0] + [i for i in range(1, n) if own[i] != own[i - 1]]
        if len(cuts) == 1 or len(cuts) > MAX_PIECES:
            continue
        out: list[tuple[Inst, Ref, Ref, bool]] = []
        for lo, hi in zip(cuts, [*cuts[1:], n]):
            part = _cut(c, [*box[:d], (box[d][0] + lo, box[d][0] + hi), *box[d + 1:]], cuts_left - 1)
            if part is None or len(out) + len(part) > MAX_PIECES:
                break
            out.extend(part)
        else:
            return out
    return None


def _places(w: Ref, r: Ref) -> np.ndarray:
    """Where each element ``r`` reads sits in the order ``w`` wrote them (``w`` covers ``r``): by reading
    each address as digits of ``w``'s strides where they nest (a store's pattern almost always: no
    element set of ``w`` is built), else by a table over ``w``'s span where that is not much larger than
    ``w``, else by search."""
    b = addresses(r.ap)
    got = _decode(w.ap, b)
    if got is not None:
        return got
    a = addresses(w.ap)
    lo, hi = int(a.min()), int(a.max()) + 1
    if hi - lo <= 8 * len(a):
        at = np.empty(hi - lo, dtype=np.int64)
        at[a - lo] = np.arange(len(a), dtype=np.int64)
        return at[b - lo]
    order = np.argsort(a, kind="stable")
    return order[np.searchsorted(a, b, sorter=order)]


def _decode(ap: AP, addr: np.ndarray) -> np.ndarray | None:
    """The row-major positions in ``ap``'s enumeration of the element offsets ``addr``, found by mixed
    radix: with its dimensions taken by stride, largest first, each stride longer than everything the
    dimensions inside it reach, an offset's coordinate there is its quotient by the stride. None where
    the strides do not nest that way or some offset is not one ``ap`` touches."""
    dims = [(n, st, k) for k, (n, st) in enumerate(ap.dims) if n > 1]
    place = [1] * len(ap.dims)  # each dimension's weight in the row-major position
    for k in range(len(ap.dims) - 2, -1, -1):
        place[k] = place[k + 1] * ap.dims[k + 1][0]
    dims.sort(key=lambda d: -d[1])
    reach = 0
    for n, st, _ in reversed(dims):
        if st <= reach:
            return None
        reach += (n - 1) * st
    rest = addr - ap.offset
    pos = np.zeros(len(addr), dtype=np.int64)
    for n, st, k in dims:
        c = rest // st
        if bool(((c < 0) | (c >= n)).any()):
            return None
        rest = rest - c * st
        pos += c * place[k]
    return pos if not bool(rest.any()) else None


class _Live:
    """The SBUF bytes live at each instruction, kept in blocks with their maxima, so that the largest over
    a range (asked once per candidate load of a program hundreds of thousands of instructions long) and an
    addition over a range (a tile kept live longer) each cost a block's length plus the blocks between."""

    BLOCK = 256

    def __init__(self, v: np.ndarray) -> None:
        self.v = np.pad(v, (0, -len(v) % self.BLOCK))
        self.blocks = self.v.reshape(-1, self.BLOCK).max(axis=1)

    def max(self, lo: int, hi: int) -> int:
        """The most live over instructions ``lo`` to ``hi - 1`` (hi > lo)."""
        b0, b1 = -(-lo // self.BLOCK), hi // self.BLOCK
        if b0 >= b1:
            return int(self.v[lo:hi].max())
        return int(max(self.blocks[b0:b1].max(), self.v[lo:b0 * self.BLOCK].max(initial=0),
                       self.v[b1 * self.BLOCK:hi].max(initial=0)))

    def add(self, lo: int, hi: int, nbytes: int) -> None:
        self.v[lo:hi] += nbytes
        b0, b1 = lo // self.BLOCK, -(-hi // self.BLOCK)
        self.blocks[b0:b1] = self.v[b0 * self.BLOCK:b1 * self.BLOCK].reshape(-1, self.BLOCK).max(axis=1)


def forward_stores(g: Graph, target: Target, budget: float = BUDGET, write_in_place: bool = True) -> Forwarded:
    """Turn the loads of values still on chip into on-chip reads, and drop the stores and scratch tensors
    left without readers (the graph is edited in place; instruction indices are renumbered); with
    ``write_in_place``, a copy's source tile written where the copy would put it (:func:`_write_in_place`)."""
    stats = Forwarded()
    n = len(g.insts)
    first_use: dict[int, int] = {}  # tile root -> its first and last instruction, and its last writer
    last_use: dict[int, int] = {}
    last_write: dict[int, int] = {}
    writers: dict[int, list[Inst]] = defaultdict(list)  # scratch tensor -> the instructions writing it
    loads: dict[int, list[Inst]] = defaultdict(list)  # scratch tensor -> the DMAs loading it into SBUF
    reads: dict[int, int] = defaultdict(int)  # scratch tensor -> how many instructions read it
    bufs: dict[int, Buf] = {}
    tiles: dict[int, Buf] = {}
    for i in g.insts:
        for r in i.writes:
            b = r.buf.root
            if b.onchip:
                tiles[id(b)] = b
                first_use.setdefault(id(b), i.index)
                last_use[id(b)] = last_write[id(b)] = i.index
            elif b.kind == "scratch":
                writers[id(b)].append(i)
                bufs[id(b)] = b
        for r in i.reads:
            b = r.buf.root
            if b.onchip:
                tiles[id(b)] = b
                first_use.setdefault(id(b), i.index)
                last_use[id(b)] = i.index
            elif b.kind == "scratch":
                reads[id(b)] += 1
                if _is_dma(i) and i.operands[0].buf.kind == "sbuf":
                    loads[id(b)].append(i)

    def stored(st: Inst, ld: Inst) -> bool:
        """``st`` stores a tile, which nothing writes again before ``ld`` reads what it stored."""
        if not (_is_dma(st) and st.operands[1].buf.kind == "sbuf" and len(st.writes) == 1):
            return False
        tile = st.operands[1].buf.root
        return st.index < ld.index and last_write[id(tile)] <= st.index and tile is not ld.operands[0].buf.root \
            and ld.operands[0].dtype is st.operands[1].dtype

    # Candidates by tile, by the checks that need no element sets: the load reads elements one store
    # wrote from this tile, after the store and before anything writes the tile again. A load several
    # such stores wrote is taken in pieces, after the others (``split``).
    by_tile: dict[int, list[tuple[Inst, Ref, Inst]]] = defaultdict(list)
    split: list[tuple[Inst, list[tuple[Inst, Ref]]]] = []
    for key, lds in loads.items():
        if key not in writers:
            continue
        for ld in lds:
            ws = _writes(ld)
            if not ws or not all(stored(st, ld) for st, _ in ws):
                continue
            if len(ws) == 1 and g.resolved(ws[0][1]).covers(g.resolved(ld.operands[1])):
                by_tile[id(ws[0][0].operands[1].buf.root)].append((ws[0][0], ws[0][1], ld))
            elif len(ws) > 1:
                split.append((ld, ws))

    # Tile by tile in program order, nearest load first: a tile read by a forwarded load lives on from its
    # last use as lowered to that load, and wherever it does, the tiles live in program order plus those
    # kept must stay within the budget; past the first load that does not fit, none of the tile's does.
    limit = budget * target.sbuf_bytes
    delta = np.zeros(n + 1, dtype=np.int64)
    for key, first in first_use.items():
        delta[first] += tiles[key].row_bytes
        delta[last_use[key] + 1] -= tiles[key].row_bytes
    live = _Live(np.cumsum(delta))
    accepted: list[tuple[Inst, Inst, Ref, bool]] = []
    places = _Memo()  # (store's access, load's access) -> _places
    owners = _Memo()  # (load's, stores' accesses) -> _owners
    reach_of = dict(last_use)  # tile -> the last instruction it is live to, forwarded loads included
    for key, cs in sorted(by_tile.items(), key=lambda kv: last_use[kv[0]]):
        nbytes = tiles[key].row_bytes
        reach = last_use[key]  # the tile is live up to here
        cs.sort(key=lambda c: c[2].index)
        for k, (st, w, ld) in enumerate(cs):
            if ld.index > reach and live.max(reach + 1, ld.index + 1) + nbytes > limit:
                stats.refused += len(cs) - k
                break
            key = (w.ap, ld.operands[1].ap)  # the same store and load shapes recur layer after layer
            pos = places.get(key, partial(_places, w, ld.operands[1]))
            got = _source(ld.operands[0], st, pos, target)
            if got is None:
                continue
            if ld.index > reach:
                live.add(reach + 1, ld.index + 1, nbytes)
                reach = ld.index
            accepted.append((st, ld, *got))
        reach_of[key] = reach

    # Loads in pieces, in program order: every tile they read must fit live up to the load.
    pieced: list[tuple[Inst, list[tuple[Inst, Ref, Ref, bool]]]] = []
    for ld, ws in sorted(split, key=lambda c: c[0].index):
        keys = {id(st.operands[1].buf.root) for st, _ in ws}
        longer = [k for k in keys if reach_of[k] < ld.index]
        if longer and live.max(min(reach_of[k] for k in longer) + 1, ld.index + 1) \
                + sum(tiles[k].row_bytes for k in longer) > limit:
            stats.refused += 1
            continue
        pieces = _pieces(ld, ws, target, owners)
        if pieces is None:
            continue
        for k in longer:
            live.add(reach_of[k] + 1, ld.index + 1, tiles[k].row_bytes)
            reach_of[k] = ld.index
        pieced.append((ld, pieces))

    if not accepted and not pieced:
        return stats
    # A scratch tensor nobody reads once the accepted loads read the tiles loses its writers.
    for ld in [ld for _, ld, _, _ in accepted] + [ld for ld, _ in pieced]:
        reads[id(ld.operands[1].buf.root)] -= 1
    dead: set[Inst] = set()
    gone: set[int] = set()
    for key in {id(st.operands[0].buf.root) for st, _, _, _ in accepted} | \
            {id(st.operands[0].buf.root) for _, ps in pieced for st, _, _, _ in ps}:
        ws = writers[key]
        if reads[key] == 0 and all(_is_dma(w) and len(w.writes) == 1 for w in ws):
            dead.update(ws)
            gone.add(key)
            stats.stores += len(ws)
            stats.tensors += 1
    forwarded_stores = {id(st) for st, _, _, _ in accepted} | {id(st) for _, ps in pieced for st, _, _, _ in ps}
    in_place = {id(ld): m for st, ld, view, copy in accepted
                if copy and (m := _in_place(ld, view, target, forwarded_stores)) is not None}
    in_place.update({id(ld): m for ld, ps in pieced
                     if (m := _in_place_pieces(ld, ps, target, forwarded_stores)) is not None})
    stats.undo = _undo(g, accepted + [(st, ld, view, copy) for ld, ps in pieced for st, _, view, copy in ps], dead,
                       [u for m in in_place.values() for u in m])

    changed: dict[int, Buf] = {}  # buffers some instruction no longer touches

    def counted(dst: Ref, copy: bool) -> None:
        stats.loads += 1
        stats.copies += copy
        stats.bytes += int(np.prod(dst.shape)) * dst.dtype.itemsize

    copies: list[Inst] = []

    def read_on_chip(ld: Inst, st: Inst, dst: Ref, view: Ref, copy: bool, waits: set[Inst]) -> None:
        if copy:
            ld.engine, ld.opcode, ld.attrs = COPY_ENGINE, "tensor_copy", {}
            copies.append(ld)
        ld.operands, ld.reads, ld.writes = (dst, view), [view], [dst]
        ld.deps = waits | st.deps
        _uses(ld, view.buf, view.buf.root, dst.buf, dst.buf.root)
        counted(dst, copy)

    unused: list[Buf] = []
    for st, ld, view, copy in accepted:
        changed[id(ld.operands[1].buf)] = ld.operands[1].buf
        m = in_place.get(id(ld))
        if m is None:
            read_on_chip(ld, st, ld.operands[0], view, copy, ld.deps - {st})
            continue
        # no copy: its readers read the stored tile (they wait for what the copy would have waited for)
        ld.deps = (ld.deps - {st}) | st.deps
        dead.add(ld)
        for u, swap in m.items():
            _swap(u, swap)
            _uses(u, view.buf, view.buf.root)
        changed[id(view.buf)] = view.buf
        changed[id(ld.operands[0].buf)] = ld.operands[0].buf
        unused.append(ld.operands[0].buf)
        counted(ld.operands[0], True)
        stats.in_place += 1
    added: dict[int, list[Inst]] = {}  # a load taken in pieces -> the instructions reading its other pieces
    for ld, ps in pieced:
        changed[id(ld.operands[1].buf)] = ld.operands[1].buf
        waits = ld.deps - {st for st, _, _, _ in ps}
        m = in_place.get(id(ld))
        if m is not None:
            # no copies: each reader reads the stored tile of the piece it reads (ResNet-50's 1x1
            # convolutions read their input tile row block by row block, each block one tile the layer
            # before stored: GpSimd copied it into the tile and TensorE read it back as it was)
            ld.deps = waits | {d for st, _, _, _ in ps for d in st.deps}
            dead.add(ld)
            for u, swap in m.items():
                _swap(u, swap)
                for r in swap.values():
                    _uses(u, r.buf, r.buf.root)
                    changed[id(r.buf)] = r.buf
            changed[id(ld.operands[0].buf)] = ld.operands[0].buf
            unused.append(ld.operands[0].buf)
            for _, dst, _, _ in ps:
                counted(dst, True)
            stats.in_place += len(ps)
            stats.split += 1
            continue
        first, *rest = ps
        more = [Inst(ld.engine, ld.opcode, ld.operands, dict(ld.attrs), ld.origin, ld.index) for _ in rest]
        for inst, (st, dst, view, copy) in zip([ld, *more], ps):
            read_on_chip(inst, st, dst, view, copy, waits)
        added[id(ld)] = more
        stats.split += 1
    if added:
        g.insts = [x for i in g.insts for x in (i, *added.get(id(i), ()))]
        for k, i in enumerate(g.insts):
            i.index = k
        for i in g.insts:  # what waited for a load waits for each of its pieces
            extra = [x for d in i.deps for x in added.get(id(d), ())]
            i.deps = set(iter(i.deps)) | set(extra)  # re-hashed: renumbered (set(a_set) keeps the old hashes)
        dead = set(iter(dead))
    g.remove(dead, changed)
    g.drop(*(bufs[key] for key in gone), *unused)
    written = _write_in_place(g, [ld for ld in copies if ld.opcode == "tensor_copy"], target) if write_in_place \
        else None
    if written:
        stats.written_in_place, put_back = written
        undo = stats.undo
        assert undo is not None

        def undo_all() -> None:
            put_back()
            undo()

        stats.undo = undo_all
    return stats


def _swap(inst: Inst, swap: dict[int, Ref]) -> None:
    """``inst`` reads (and names among its operands and attributes) ``swap[id(r)]`` where it named ``r``."""
    inst.operands = tuple(swap.get(id(r), r) for r in inst.operands)
    inst.reads = [swap.get(id(r), r) for r in inst.reads]
    inst.attrs = {k: swap.get(id(v), v) if isinstance(v, Ref) else v for k, v in inst.attrs.items()}


def _uses(inst: Inst, *bs: Buf) -> None:
    """``inst`` among the users of each buffer ``bs`` names (once)."""
    for b in {id(b): b for b in bs}.values():
        if not any(u is inst for u in b.users):
            b.users.append(inst)


def _in_place(ld: Inst, view: Ref, target: Target, forwarded_stores: set[int]) -> dict[Inst, dict[int, Ref]] | None:
    """The readers of forwarded load ``ld``'s tile and, for each, its accesses of the tile as accesses of
    ``view`` (the stored tile it would copy), when they may read that instead: ``ld`` writes the whole
    tile, nothing else writes it, every reader reads it through the tile itself (no other type's view)
    on the same partitions, in access patterns the engines accept, none is a store another forwarded load
    reads the tile in place of (that load's view names this tile), and the stored tile is no larger (so
    keeping it live up to the last reader holds no more SBUF than the tile the copy made). None
    otherwise: the copy stays."""
    dst = ld.operands[0]
    if view.as_type is not None or view.dtype is not dst.dtype or view.buf.root.row_bytes > dst.buf.row_bytes:
        return None
    try:
        base = view if view.shape == dst.shape else view.reshape(*dst.shape)
        base.ap  # noqa: B018 - resolves: raises where the stored tile cannot be read in the tile's shape
    except (AccessError, ValueError):
        return None

    def stored(r: Ref) -> Ref | None:
        new = Ref(base.buf, base.ops + r.ops, None)
        return new if new.shape == r.shape and _same_partitions(new, r) else None

    return _readers_in_place(ld, stored, target, forwarded_stores)


def _in_place_pieces(ld: Inst, pieces: list[tuple[Inst, Ref, Ref, bool]], target: Target,
                     forwarded_stores: set[int]) -> dict[Inst, dict[int, Ref]] | None:
    """:func:`_in_place` for a load read in pieces: every reader of its tile reads exactly one piece
    (the same elements in the same order), which it may read in its stored tile instead; every piece an
    engine copy, and the stored tiles together no larger than the tile. None otherwise: the copies stay."""
    dst = ld.operands[0]
    if not all(copy for *_, copy in pieces) or sum(v.buf.root.row_bytes for _, _, v, _ in pieces) > dst.buf.row_bytes \
            or any(v.as_type is not None or v.dtype is not dst.dtype for _, _, v, _ in pieces):
        return None
    by_ap = {(p.ap.offset, p.ap.dims, p.ap.part): v for _, p, v, _ in pieces}

    def stored(r: Ref) -> Ref | None:
        view = by_ap.get((r.ap.offset, r.ap.dims, r.ap.part))
        if view is None:
            return None
        new = view if view.shape == r.shape else view.reshape(*r.shape)
        return new if _same_partitions(new, r) else None

    return _readers_in_place(ld, stored, target, forwarded_stores)


ELEMENTWISE_WRITERS = ("activation", "tensor_scalar", "tensor_tensor", "tensor_copy")


def _write_in_place(g: Graph, copies: list[Inst], target: Target) -> tuple[int, Callable[[], None]] | None:
    """Copies not made: where a forwarded copy reads the whole of a tile that one elementwise instruction
    wrote and nothing else reads, that instruction writes the copy's place instead (ResNet-50's stem and
    1x1 convolutions wrote their result tiles and GpSimd copied each into the padded input tile of the
    pooling or 3x3 convolution after it: 50 us of GpSimd, beside VectorE's SBUF port). Only on the same
    partitions (an engine's lane reads and writes its own), in access patterns the engines accept; the writer
    then waits for what the copy waited for. The count and what puts the writers back (the graph's lists and
    dependences are the pass's own undo's)."""
    done: list[tuple[Inst, tuple, list, list, dict]] = []
    dead: set[Inst] = set()
    changed: dict[int, Buf] = {}
    for c in copies:
        dst, view = c.operands
        tile = view.buf
        if tile is not tile.root or view.as_type is not None or dst.as_type is not None or dst.dtype is not view.dtype:
            continue
        ws = [u for u in tile.users if u is not c]
        if len(ws) != 1:
            continue
        w = ws[0]
        if w.engine not in ("act", "dve", "pool") or w.opcode not in ELEMENTWISE_WRITERS or "accum" in w.attrs \
                or len(w.writes) != 1 or w.writes[0].buf is not tile or w.operands[0] is not w.writes[0] \
                or any(r.buf.root is tile for r in w.reads) or w in dead:
            continue
        out = w.writes[0]
        # what the copy waited for besides the writer (the place's earlier writes: a memset of the padded
        # tile) the writer now waits for; one after it in program order must not wait for anything after
        # the writer itself (no cycle)
        others = c.deps - {w}
        if w not in c.deps or any(d.index > w.index and any(e.index >= w.index for e in d.deps) for d in others):
            continue
        try:
            full = tile.ref().reshape(*out.shape)
            whole = view.reshape(*out.shape) if view.shape != out.shape else view
            if whole.ap != full.ap or out.ap != full.ap:
                continue
            swap: dict[int, Ref] = {id(out): dst}
            for r in (*w.operands[1:], *(v for v in w.attrs.values() if isinstance(v, Ref))):
                if r.shape == out.shape:
                    swap[id(r)] = r.reshape(*dst.shape) if r.shape != dst.shape else r
            if not (_same_partitions(dst, out) and engine_ok(dst, target)
                    and all(engine_ok(v, target) for v in swap.values() if v.buf.onchip)):
                continue
        except (AccessError, ValueError, IndexError):
            continue
        done.append((w, w.operands, w.reads, w.writes, w.attrs))
        _swap(w, swap)
        w.writes = [dst]
        w.deps = w.deps | others
        _uses(w, dst.buf, dst.buf.root)
        dead.add(c)
        changed[id(tile)] = tile
    if not done:
        return None
    g.remove(dead, changed)
    g.drop(*{id(v.buf): v.buf for c in dead for v in c.operands[1:]}.values())

    def put_back() -> None:
        for w, *was in done:
            w.operands, w.reads, w.writes, w.attrs = was

    return len(done), put_back


def _same_partitions(new: Ref, r: Ref) -> bool:
    """Does ``new`` lie on the partitions ``r`` reads (both tiles placed where they are)?"""
    return new.ap.part[0] + new.buf.root.partition == r.ap.part[0] + r.buf.partition


def _readers_in_place(ld: Inst, stored: Callable[[Ref], Ref | None], target: Target,
                      forwarded_stores: set[int]) -> dict[Inst, dict[int, Ref]] | None:
    """Each reader of load ``ld``'s tile with its accesses of the tile as ``stored`` reads them in the stored
    tile(s), when every one may: ``ld`` writes the whole tile and nothing else does, every reader reads it
    through the tile itself (no other type's view), in access patterns the engines accept, and none is a
    store another forwarded load reads the tile in place of. None otherwise."""
    dst = ld.operands[0]
    tile = dst.buf
    if tile is not tile.root or dst.ops or dst.as_type is not None:
        return None
    out: dict[Inst, dict[int, Ref]] = {}
    for u in tile.users:
        if u is ld:
            continue
        if id(u) in forwarded_stores or any(r.buf.root is tile for r in u.writes):
            return None
        swap: dict[int, Ref] = {}
        for r in (*u.reads, *(v for v in u.attrs.values() if isinstance(v, Ref))):
            if r.buf.root is not tile:
                continue
            if r.buf is not tile or r.as_type is not None:
                return None
            try:
                new = stored(r)
            except (AccessError, ValueError, IndexError):
                return None
            if new is None or (u.engine != "dma" and not engine_ok(new, target)):
                return None
            swap[id(r)] = new
        if not swap:
            return None
        out[u] = swap
    return out or None


def _undo(g: Graph, accepted: list[tuple[Inst, Inst, Ref, bool]], dead: set[Inst],
          rewired: list[Inst] = ()) -> Callable[[], None]:
    """What puts the graph back as lowered, taken before the pass edits it: the driver's retry within a
    smaller budget then needs no second lowering (mobilenet_v2's takes 40 s). The edits replace, never
    mutate, the instructions' fields and dependence sets, so keeping the old objects is enough."""
    insts, bufs, hbm = list(g.insts), list(g.bufs), g.hbm_bytes
    deps = [i.deps for i in insts]
    loads = [(ld, ld.engine, ld.opcode, ld.attrs, ld.operands, ld.reads, ld.writes) for _, ld, _, _ in accepted]
    touched = {id(r.buf): r.buf for _, ld, view, _ in accepted for r in (view, *ld.operands)}
    touched.update({id(r.buf): r.buf for i in dead for r in (*i.reads, *i.writes)})
    touched.update({id(b.root): b.root for b in list(touched.values())})
    touched.update({id(r.buf.root): r.buf.root for i in rewired for r in i.reads})
    users = [(b, list(b.users)) for b in touched.values()]
    fields = [(i, i.operands, i.reads, i.attrs) for i in rewired]

    def undo() -> None:
        g.insts, g.bufs, g.hbm_bytes = list(insts), list(bufs), hbm
        for k, i in enumerate(insts):
            i.index, i.deps = k, deps[k]  # hashed by index: the old sets match the old numbers
        for ld, *was in loads:
            ld.engine, ld.opcode, ld.attrs, ld.operands, ld.reads, ld.writes = was
        for i, *was in fields:
            i.operands, i.reads, i.attrs = was
        for b, us in users:
            b.users = list(us)

    return undo


def psum_operands(g: Graph, target: Target) -> int:
    """Evacuations written back into their PSUM bank where VectorE adds them to another tile: one ScalarE or
    VectorE step copies a PSUM tile (scaled and biased: a batch norm) into an fp32 SBUF tile whose one reader
    is a VectorE ``tensor_tensor`` with its other input in SBUF (the residual add after a convolution). The
    step then writes in place in the bank and the add reads it there: an input in PSUM puts the add at
    VectorE's PSUM rate, N cycles a partition rather than 2N (the target's cost table), and the SBUF tile is
    not made. Only where nothing after the step touches that part of the bank but the add. The count."""
    done = 0
    gone: list[Buf] = []
    for add in g.insts:
        if add.engine != "dve" or add.opcode != "tensor_tensor" or len(add.operands) != 3 \
                or any(not x.buf.onchip or x.buf.kind == "psum" for x in add.operands[1:]):
            continue
        for x in add.operands[1:]:
            swap = _evacuated(g, target, add, x)
            if swap is None:
                continue
            step, place = swap
            out = step.writes[0]
            _swap(step, {id(out): place})
            step.writes = [place]
            _swap(add, {id(x): place.reshape(*x.shape) if place.shape != x.shape else place})
            _uses(add, place.buf, place.buf.root)
            x.buf.users = []
            gone.append(x.buf)
            done += 1
            break
    g.drop(*gone)
    return done


def _evacuated(g: Graph, target: Target, add: Inst, x: Ref) -> tuple[Inst, Ref] | None:
    """The step that wrote ``add``'s input ``x`` out of a PSUM tile, and the place in that tile it may write
    instead (:func:`psum_operands`); None where it may not."""
    t = x.buf
    if t is not t.root or t.kind != "sbuf" or t.dtype is not dt.F32 or x.as_type is not None \
            or len(t.users) != 2 or sum(o.buf is t for o in add.operands[1:]) != 1:
        return None
    step = next(u for u in t.users if u is not add)
    if step.engine not in ("act", "dve") or step.opcode not in ELEMENTWISE_WRITERS or "accum" in step.attrs \
            or len(step.writes) != 1 or step.writes[0].buf is not t or step.operands[0] is not step.writes[0] \
            or step.index > add.index:
        return None
    out = step.writes[0]
    src = next((o for o in step.operands[1:] if o.buf.kind == "psum" and o.dtype is dt.F32 and o.as_type is None),
               None)
    if src is None:
        return None
    bank = src.buf.root
    try:
        full = t.ref().reshape(*out.shape)
        place = src.reshape(*out.shape) if src.shape != out.shape else src
        if out.ap != full.ap or x.reshape(*out.shape).ap != full.ap \
                or not (_same_partitions(place, out) and engine_ok(place, target)):
            return None
        there = g.resolved(place)
        for u in bank.users:
            if u is step or u is add:
                continue
            # after the step, only the add may touch what it writes; before it, only the matmuls that
            # accumulated it (the step waits for the last, which waited for the others) may have read it
            later = u.index > step.index
            if any(a.buf.root is bank and g.resolved(a).overlaps(there)
                   for a in (*u.reads, *(u.writes if later else ()))) and (later or u.opcode != "matmul"):
                return None
    except (AccessError, ValueError, IndexError):
        return None
    return step, place

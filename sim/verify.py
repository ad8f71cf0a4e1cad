"""Checking a device program against a target, before anything runs.

``link`` places on-chip tensors, resolves every access, checks every instruction's operands, then
analyses synchronisation: it replays the streams in zero time (a wait proceeds once enough signals
have happened) to find deadlocks and an execution order, and computes exactly which instructions
are *guaranteed* to happen before which (per stream, the same replay with that stream held back).
With that it refuses a read that no write is guaranteed to precede ("read before any write"), two
conflicting accesses on different streams that no semaphore orders (a race), and misused PSUM
accumulation groups. A program that passes is deterministic: the functional result does not
depend on timing.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from nxsat.diagnostics import Loc, error
from nxsat.sim import numerics as nm
from nxsat.sim.isa import OPS, Attr, CheckFail, LInstr, RAccess
from nxsat.sim.program import (
    TENSOR_KINDS,
    Access,
    AccessError,
    Instr,
    Program,
    Tensor,
    boxes_overlap,
    index_box,
    is_broadcast,
    resolve,
    stream_kind,
    stream_order,
)
from nxsat.sim.target import Target

MAX_INSTRUCTIONS = 2_000_000
MAX_COVERAGE_ELEMS = 1 << 26
ALIGN = 64


@dataclass
class Linked:
    """A checked program: resolved instructions, streams, execution order, happens-before clocks."""

    program: Program
    target: Target
    instrs: list[LInstr]
    streams: list[str]
    by_stream: dict[str, list[int]]
    sid: list[int]
    pos: list[int]
    order: list[int]
    vc: np.ndarray = field(repr=False)

    def hb(self, a: int, b: int) -> bool:
        """Is instruction ``a`` guaranteed to complete before ``b`` starts (or precede it in its stream)?"""
        if self.sid[a] == self.sid[b]:
            return self.pos[a] < self.pos[b]
        return self.pos[a] < int(self.vc[b, self.sid[a]])


def _loc(prog: Program, line: int) -> Loc:
    return Loc(prog.source, line)


def link(prog: Program, target: Target) -> Linked:
    """Check ``prog`` for ``target``; raise a coded error at the offending line, or return it linked."""
    _check_header(prog, target)
    placed = _place(prog, target)
    prog.tensors = placed
    if len(prog.instrs) > MAX_INSTRUCTIONS:
        raise error("NCC_EVRF007", f"{len(prog.instrs)} instructions; the simulator accepts at most "
                    f"{MAX_INSTRUCTIONS}", _loc(prog, prog.instrs[MAX_INSTRUCTIONS].line))
    cache: dict[tuple[Access, str], RAccess] = {}
    instrs = [_link_instr(prog, target, ins, i, cache) for i, ins in enumerate(prog.instrs)]
    streams = sorted({ins.stream for ins in prog.instrs}, key=stream_order)
    by_stream: dict[str, list[int]] = {s: [] for s in streams}
    sid = [0] * len(instrs)
    pos = [0] * len(instrs)
    index = {s: k for k, s in enumerate(streams)}
    for i, ins in enumerate(prog.instrs):
        pos[i] = len(by_stream[ins.stream])
        by_stream[ins.stream].append(i)
        sid[i] = index[ins.stream]
    order = _replay(prog, by_stream, streams)
    vc = _clocks(prog, streams, by_stream, sid, pos, order)
    linked = Linked(prog, target, instrs, streams, by_stream, sid, pos, order, vc)
    _dataflow(linked)
    _accumulation(linked)
    _coverage(linked)
    return linked


# --- header and placement ----------------------------------------------------------------------

def _check_header(prog: Program, target: Target) -> None:
    if prog.target is not None and prog.target != target.name:
        raise error("NCC_EASM004", f"the program is for {prog.target}, not {target.name}", _loc(prog, 1))
    if prog.lnc is not None and prog.lnc != target.lnc:
        raise error("NCC_EASM004", f"the program is for logical core config {prog.lnc}, the target uses "
                    f"{target.lnc}", _loc(prog, 1))
    if prog.ranks is None:
        prog.ranks = target.lnc
    if prog.ranks % target.lnc:
        raise error("NCC_EARG001", f"{target.name} with lnc={target.lnc} runs a program on {target.lnc} "
                    f"physical cores: .ranks must be a multiple of {target.lnc}, not {prog.ranks}", _loc(prog, 1))
    if len(prog.semaphores) > target.max_semaphores:
        name = list(prog.semaphores)[target.max_semaphores]
        raise error("NCC_EASM004", f"{len(prog.semaphores)} semaphores; {target.name} has "
                    f"{target.max_semaphores}", _loc(prog, prog.semaphores[name]))


def _place(prog: Program, target: Target) -> dict[str, Tensor]:
    """Check declarations and give every on-chip tensor an explicit offset (first fit, 64-byte aligned)."""
    out: dict[str, Tensor] = {}
    hbm_total = 0
    placed: dict[str, list[tuple[int, int, int, int]]] = {"sbuf": [], "psum": []}  # (p0, p1, lo, hi)
    pending: list[Tensor] = []
    for t in prog.tensors.values():
        loc = _loc(prog, t.line)
        if t.kind not in TENSOR_KINDS or not all(isinstance(d, int) for d in t.shape):
            raise error("NCC_EASM004", f"{t.name}: kind {t.kind!r} and shape {t.shape!r} must be one of "
                        f"{', '.join(TENSOR_KINDS)} and integers", loc)
        allowed = nm.ALLOWED_DTYPES + (nm.HBM_ONLY_DTYPES if not t.onchip else ())
        if t.dtype.name not in allowed:
            raise error("NCC_ESPP004", f"{t.name}: element type {t.dtype.name} is not supported on the device"
                        + (" on-chip" if t.dtype.name in nm.HBM_ONLY_DTYPES else ""), loc,
                        "types: " + ", ".join(allowed))
        if any(d < 1 for d in t.shape):
            raise error("NCC_EASM004", f"{t.name}: every dimension must be at least 1", loc)
        if t.shard is not None:
            if t.kind not in ("input", "output") or not 0 <= t.shard < len(t.shape):
                raise error("NCC_EASM004", f"{t.name}: shard={t.shard} does not fit a {t.kind} of rank "
                            f"{len(t.shape)}", loc)
        if not t.onchip:
            hbm_total += t.nbytes * prog.ranks
            if hbm_total > target.hbm_bytes:
                raise error("NCC_EOOM002", f"HBM tensors need {hbm_total} bytes; {target.name} has "
                            f"{target.hbm_bytes}", loc)
            out[t.name] = t
            continue
        if not t.shape:
            raise error("NCC_EASM004", f"{t.name}: an on-chip tensor needs a partition dimension", loc)
        if t.partition < 0 or t.partition + t.shape[0] > target.partitions:
            raise error("NCC_EASM005", f"{t.name}: partitions {t.partition}..{t.partition + t.shape[0] - 1} "
                        f"exceed the {target.partitions} partitions", loc,
                        "a tile has at most 128 partitions; split it")
        if t.kind == "psum":
            if t.dtype.name not in target.psum_dtypes:
                raise error("NCC_EASM004", f"{t.name}: PSUM holds {', '.join(target.psum_dtypes)}, not "
                            f"{t.dtype.name}", loc)
            if t.bank is not None:
                if not 0 <= t.bank < target.psum_banks:
                    raise error("NCC_EASM006", f"{t.name}: bank {t.bank} does not exist ({target.psum_banks} "
                                "banks)", loc)
                t = replace(t, offset=t.bank * target.psum_bank_bytes + (t.offset or 0), bank=None)
        if t.offset is None:
            pending.append(t)
            out[t.name] = t
            continue
        _check_fits(t, target, prog)
        placed[t.kind].append((t.partition, t.partition + t.shape[0], t.offset, t.offset + t.row_bytes))
        out[t.name] = t
    for t in pending:
        busy = sorted((lo, hi) for p0, p1, lo, hi in placed[t.kind]
                      if p0 < t.partition + t.shape[0] and t.partition < p1)
        off = 0
        align = target.psum_bank_bytes if t.kind == "psum" and t.row_bytes <= target.psum_bank_bytes else ALIGN
        for lo, hi in busy:
            if off + t.row_bytes <= lo:
                break
            off = max(off, -(-hi // align) * align)
        t = replace(t, offset=off)
        _check_fits(t, target, prog)
        placed[t.kind].append((t.partition, t.partition + t.shape[0], off, off + t.row_bytes))
        out[t.name] = t
    return {name: out[name] for name in prog.tensors}


def _check_fits(t: Tensor, target: Target, prog: Program) -> None:
    loc = _loc(prog, t.line)
    assert t.offset is not None
    if t.offset % t.dtype.itemsize or t.offset < 0:
        raise error("NCC_EASM004", f"{t.name}: offset {t.offset} is not aligned to its {t.dtype.itemsize}-byte "
                    "elements", loc)
    if t.kind == "sbuf" and t.offset + t.row_bytes > target.sbuf_bytes:
        raise error("NCC_EASM005", f"{t.name}: bytes {t.offset}..{t.offset + t.row_bytes} per partition exceed "
                    f"the {target.sbuf_bytes}-byte SBUF partition of {target.name}", loc)
    if t.kind == "psum" and t.offset + t.row_bytes > target.psum_bytes:
        raise error("NCC_EASM006", f"{t.name}: bytes {t.offset}..{t.offset + t.row_bytes} per partition exceed "
                    f"PSUM ({target.psum_banks} banks of {target.psum_bank_bytes} bytes)", loc)


# --- instructions -------------------------------------------------------------------------------

def _link_instr(prog: Program, target: Target, ins: Instr, index: int,
                cache: dict[tuple[Access, str], RAccess]) -> LInstr:
    loc = _loc(prog, ins.line)
    op = OPS.get(ins.opcode)
    kind = stream_kind(ins.stream)
    # The parser guarantees these for text; programs built in Python are checked here.
    if op is None:
        raise error("NCC_EASM002", f"unknown instruction {ins.opcode!r}", loc)
    if not kind:
        raise error("NCC_EASM002", f"unknown stream {ins.stream!r}", loc)
    if len(ins.operands) != len(op.operands):
        raise error("NCC_EASM004", f"{ins.opcode} takes {len(op.operands)} operand(s), got {len(ins.operands)}", loc)
    for acc in ins.operands:
        if not isinstance(acc, Access) or acc.tensor not in prog.tensors:
            raise error("NCC_EASM003", f"undefined tensor {getattr(acc, 'tensor', acc)}", loc)
    for sem in [w.sem for w in ins.waits] + list(ins.signals):
        if sem not in prog.semaphores:
            raise error("NCC_EASM003", f"undefined semaphore {sem}", loc)
    if any(w.value < 1 for w in ins.waits) or len(set(ins.signals)) != len(ins.signals):
        raise error("NCC_EASM004", "a wait needs a count of at least 1, and a semaphore is signalled once", loc)
    if kind == "dma" and int(ins.stream[1:]) >= target.dma_queues:
        raise error("NCC_EASM002", f"stream {ins.stream}: {target.name} has DMA queues q0..q{target.dma_queues - 1}",
                    loc)
    if kind not in op.engines:
        names = ", ".join("q<n>" if e == "dma" else e for e in op.engines)
        raise error("NCC_EASM004", f"{ins.opcode} does not run on {ins.stream}", loc, f"it runs on {names}")

    def res(acc: Access, what: str) -> RAccess:
        t = prog.tensors[acc.tensor]
        ra = cache.get((acc, t.name))
        if ra is None:
            try:
                ap = resolve(acc, t)
            except AccessError as exc:
                raise error("NCC_EASM004", f"{ins.opcode} {what}: {exc}", loc) from None
            ra = RAccess(acc, t, ap, index_box(acc, t))
            cache[(acc, t.name)] = ra
        if kind == "pool" and t.memory == "psum":
            raise error("NCC_EASM004", f"{ins.opcode} {what}: GpSimd cannot access PSUM ({t.name})", loc)
        return ra

    ops = []
    for spec, acc in zip(op.operands, ins.operands):
        ra = res(acc, spec.name)
        if ra.memory not in spec.memories:
            raise error("NCC_EASM004", f"{ins.opcode} {spec.name} must be in {' or '.join(sorted(spec.memories))}; "
                        f"{ra.name} is in {ra.memory}", loc)
        ops.append(ra)
    unknown = sorted(set(ins.attrs) - {a.name for a in op.attrs})
    if unknown:
        raise error("NCC_EASM004", f"{ins.opcode} has no attribute {unknown[0]}", loc)
    attrs = {a.name: _attr_value(prog, ins, a, loc) for a in op.attrs}
    for a in op.attrs:
        v = attrs.get(a.name)
        if a.kind in ("scalar", "in", "out") and v is not None and not isinstance(v, (int, float)):
            ra = res(v, a.name)
            if not ra.tensor.onchip:
                raise error("NCC_EASM004", f"{ins.opcode} {a.name} must be an on-chip tile", loc)
            attrs[a.name] = ra
    c = LInstr(ins, index, op, ops, attrs, ranks=prog.ranks)
    try:
        op.check(c, target)
    except CheckFail as exc:
        msg = str(exc) if str(exc).startswith(ins.opcode) else f"{ins.opcode}: {exc}"
        raise error(exc.code, msg, loc) from None
    try:
        c.domains = op.domains(c, target)
    except CheckFail as exc:
        raise error(exc.code, f"{ins.opcode}: {exc}", loc) from None
    c.reads, c.writes = op.effects(c)
    for w in c.writes:
        if is_broadcast(w.acc):
            raise error("NCC_EASM004", f"{ins.opcode} writes {w.name} through a broadcast view", loc)
        if w.tensor.kind in ("input", "const"):
            raise error("NCC_EASM004", f"{ins.opcode} writes {w.name}, a read-only {w.tensor.kind}", loc)
    return c


def _attr_value(prog: Program, ins: Instr, a: Attr, loc: Loc) -> object:
    """An attribute's value, defaulted and checked against its kind (programs built in Python too)."""
    v = ins.attrs.get(a.name, a.default)
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    ok = {
        "bool": isinstance(v, bool),
        "int": isinstance(v, int) and not isinstance(v, bool),
        "float": number,
        "number": number,
        "enum": v in a.choices,
        "ints": isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
        "scalar": number or isinstance(v, Access),
        "in": v is None or isinstance(v, Access),
        "out": v is None or isinstance(v, Access),
    }[a.kind]
    if not ok:
        want = f"one of {', '.join(a.choices)}" if a.kind == "enum" else a.kind
        raise error("NCC_EASM004", f"{ins.opcode} attribute {a.name}={v!r} must be {want}", loc)
    if isinstance(v, Access) and v.tensor not in prog.tensors:
        raise error("NCC_EASM003", f"undefined tensor {v.tensor}", loc)
    return v


# --- synchronisation ----------------------------------------------------------------------------

def _replay(prog: Program, by_stream: dict[str, list[int]], streams: list[str]) -> list[int]:
    """A zero-time execution: every stream runs while its waits are met. Semaphores only count up,
    so any maximal run reaches the same end: stuck streams mean a deadlock in every schedule."""
    total: dict[str, int] = defaultdict(int)
    for ins in prog.instrs:
        for s in ins.signals:
            total[s] += 1
    for ins in prog.instrs:
        for w in ins.waits:
            if w.value > total[w.sem]:
                raise error("NCC_EASM009", f"{ins.stream} {ins.opcode} waits for {w.sem}>={w.value} but the program "
                            f"signals {w.sem} only {total[w.sem]} time(s)", _loc(prog, ins.line))
    count: dict[str, int] = defaultdict(int)
    head = dict.fromkeys(streams, 0)
    order: list[int] = []
    progress = True
    while progress:
        progress = False
        for s in streams:
            lst = by_stream[s]
            k = head[s]
            while k < len(lst):
                ins = prog.instrs[lst[k]]
                if any(count[w.sem] < w.value for w in ins.waits):
                    break
                order.append(lst[k])
                for sig in ins.signals:
                    count[sig] += 1
                k += 1
                progress = True
            head[s] = k
    if len(order) < len(prog.instrs):
        stuck = []
        for s in streams:
            if head[s] < len(by_stream[s]):
                ins = prog.instrs[by_stream[s][head[s]]]
                w = next(w for w in ins.waits if count[w.sem] < w.value)
                stuck.append((ins, w))
        ins, w = stuck[0]
        others = "; ".join(f"{i.stream} at line {i.line} waits {x.sem}>={x.value} ({count[x.sem]} signalled)"
                           for i, x in stuck[1:4])
        raise error("NCC_EASM009", f"deadlock: {ins.stream} {ins.opcode} waits for {w.sem}>={w.value} but only "
                    f"{count[w.sem]} signal(s) can ever happen before it" + (f"; also {others}" if others else ""),
                    _loc(prog, ins.line), "check the wait counts and which stream signals each semaphore")
    return order


def _clocks(prog: Program, streams: list[str], by_stream: dict[str, list[int]], sid: list[int], pos: list[int],
            order: list[int]) -> np.ndarray:
    """vc[i, k] = how many instructions of stream k are guaranteed to complete before i starts.

    Exact, by the same argument as the deadlock check: instruction j must complete before i starts
    exactly when the zero-time replay with j's stream stopped at j never reaches i (had some
    schedule started i first, everything that completed before it would be a run of that stopped
    replay). Stopping stream k at 0, 1, 2, ... instructions and resuming the same replay each time
    (counters only grow) gives every instruction the position of k it first became reachable at:
    one pass over the program per stream that signals anything.
    """
    n = len(prog.instrs)
    vc = np.zeros((n, len(streams)), dtype=np.int64)
    idx = np.arange(n)
    sids = np.asarray(sid, dtype=np.int64)
    vc[idx, sids] = pos
    lists = [by_stream[s] for s in streams]
    for k, lst in enumerate(lists):
        if not any(prog.instrs[i].signals for i in lst):
            continue  # nothing can wait for this stream
        col = np.asarray(_first_reachable(prog, lists, k), dtype=np.int64)
        other = sids != k
        vc[other, k] = col[other]
    return vc


def _first_reachable(prog: Program, lists: list[list[int]], k: int) -> list[int]:
    """For every instruction: how many instructions of stream ``k`` must complete before it can start
    (the replay with stream k let run ``limit`` instructions, for limit = 0, 1, ...)."""
    need = [0] * len(prog.instrs)
    count: dict[str, int] = defaultdict(int)
    head = [0] * len(lists)
    waiters: dict[str, list[tuple[int, int]]] = defaultdict(list)  # sem -> heap of (value, stream)
    work = list(range(len(lists)))
    limit = [0]  # stream k may run its first limit[0] instructions

    def advance(s: int) -> None:
        lst = lists[s]
        while head[s] < len(lst):
            if s == k and head[s] >= limit[0]:
                return
            i = lst[head[s]]
            ins = prog.instrs[i]
            for w in ins.waits:
                if count[w.sem] < w.value:
                    heapq.heappush(waiters[w.sem], (w.value, s))
                    return
            need[i] = limit[0]
            for sem in ins.signals:
                count[sem] += 1
                h = waiters.get(sem)
                while h and h[0][0] <= count[sem]:
                    work.append(heapq.heappop(h)[1])
            head[s] += 1

    for p in range(len(lists[k]) + 1):
        limit[0] = p
        work.append(k)
        while work:
            advance(work.pop())
    return need


# --- dataflow: read before write, races ------------------------------------------------------------

@dataclass
class _Entry:
    tensor: str
    box: tuple[tuple[int, int, int], ...]
    phys: tuple[int, int, int, int] | None
    stream: int
    write: bool
    instr: int
    lo: int  # the 1-D interval the access may touch: bytes of a partition row on chip, elements in HBM
    hi: int
    seq: int  # creation order: candidates are checked in it, so the first conflict reported is stable


def _phys(ra: RAccess) -> tuple[int, int, int, int] | None:
    if not ra.tensor.onchip:
        return None
    p0, pn = ra.abs_partitions()
    lo, hi = ra.byte_range()
    return (p0, p0 + pn, lo, hi)


def _interval(ra: RAccess) -> tuple[int, int]:
    """A 1-D interval every element of the access lies in (two accesses that share an element
    share a point of it): row bytes on chip (shared by aliasing tensors), flat elements in HBM."""
    return ra.byte_range() if ra.tensor.onchip else ra.ap.span()


class _Store:
    """The latest accesses to one storage (a tensor, or on-chip tensors sharing memory), one per
    (tensor, box, stream), found by the interval they touch: a check looks only at the entries in
    the buckets its interval covers, so a program of many small accesses stays linear rather than
    quadratic. Entries covering many buckets sit in a list every query sees."""

    BUCKETS = 512
    WIDE = 8

    def __init__(self, extent: int) -> None:
        self.shift = max(0, (max(1, extent) - 1).bit_length() - self.BUCKETS.bit_length() + 1)
        self.buckets: dict[int, dict[tuple, _Entry]] = defaultdict(dict)
        self.wide: dict[tuple, _Entry] = {}
        self.entries: dict[tuple, _Entry] = {}

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        return lo >> self.shift, (max(lo + 1, hi) - 1) >> self.shift

    def add(self, key: tuple, e: _Entry) -> None:
        self.entries[key] = e
        b0, b1 = self._span(e.lo, e.hi)
        if b1 - b0 >= self.WIDE:
            self.wide[key] = e
        else:
            for b in range(b0, b1 + 1):
                self.buckets[b][key] = e

    def remove(self, key: tuple) -> None:
        e = self.entries.pop(key)
        b0, b1 = self._span(e.lo, e.hi)
        if b1 - b0 >= self.WIDE:
            del self.wide[key]
        else:
            for b in range(b0, b1 + 1):
                del self.buckets[b][key]

    def near(self, lo: int, hi: int) -> list[tuple[tuple, _Entry]]:
        """Entries whose interval may meet [lo, hi), in creation order."""
        b0, b1 = self._span(lo, hi)
        found: dict[tuple, _Entry] = dict(self.wide)
        if b1 - b0 + 1 >= len(self.buckets):
            for b, d in self.buckets.items():
                if b0 <= b <= b1:
                    found.update(d)
        else:
            for b in range(b0, b1 + 1):
                d = self.buckets.get(b)
                if d:
                    found.update(d)
        return sorted(((k, e) for k, e in found.items() if e.lo < hi and lo < e.hi), key=lambda ke: ke[1].seq)


def _alias_groups(prog: Program) -> dict[str, str]:
    """Storage key of every tensor: on-chip tensors whose memory overlaps share one key."""
    parent = {name: name for name in prog.tensors}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for kind in ("sbuf", "psum"):
        ts = sorted((t for t in prog.tensors.values() if t.kind == kind), key=lambda t: t.offset or 0)
        # Sweep by byte offset: only tensors whose byte ranges overlap can alias.
        active: list[Tensor] = []
        for t in ts:
            lo = t.offset or 0
            active = [a for a in active if (a.offset or 0) + a.row_bytes > lo]
            for a in active:
                if a.partition < t.partition + t.shape[0] and t.partition < a.partition + a.shape[0]:
                    parent[find(t.name)] = find(a.name)
            active.append(t)
    return {name: find(name) for name in prog.tensors}


def _overlap(e: _Entry, ra: RAccess) -> bool:
    if e.tensor == ra.name:
        return boxes_overlap(e.box, ra.box)
    p = _phys(ra)
    if e.phys is None or p is None:
        return False
    return e.phys[0] < p[1] and p[0] < e.phys[1] and e.phys[2] < p[3] and p[2] < e.phys[3]


def _contains(outer: tuple[tuple[int, int, int], ...], inner: tuple[tuple[int, int, int], ...]) -> bool:
    return all(k == 1 and s <= s2 and e2 <= e for (s, e, k), (s2, e2, _) in zip(outer, inner))


def _dataflow(lk: Linked) -> None:
    prog = lk.program
    target = lk.target
    group = _alias_groups(prog)

    def extent(key: str) -> int:
        t = prog.tensors[key]
        if t.kind == "sbuf":
            return target.sbuf_bytes
        if t.kind == "psum":
            return target.psum_bytes
        return t.size

    # Per storage: the latest access of each (tensor, box, stream), writes and reads apart.
    writes: dict[str, _Store] = {}
    reads: dict[str, _Store] = {}
    seq = 0
    # Changes to each storage's entries, in all and per stream: a later instruction of a stream that
    # repeats an access already checked, with no other stream's change since, needs no new check
    # (what preceded the earlier one precedes it too).
    total: dict[str, int] = defaultdict(int)
    by_stream: dict[tuple[str, int], int] = defaultdict(int)
    checked: dict[tuple[str, str, tuple, int, bool], int] = {}

    def store(table: dict[str, _Store], key: str) -> _Store:
        st = table.get(key)
        if st is None:
            st = table[key] = _Store(extent(key))
        return st

    def foreign(key: str, s: int) -> int:
        return total[key] - by_stream[(key, s)]

    for i in lk.order:
        c = lk.instrs[i]
        s = lk.sid[i]
        loc = _loc(prog, c.line)
        for ra in c.reads:
            if ra.tensor.kind in ("input", "const"):
                continue
            key = group[ra.name]
            memo = (key, ra.name, ra.box, s, False)
            if checked.get(memo) == foreign(key, s):
                continue
            found = False
            for _, e in store(writes, key).near(*_interval(ra)):
                if not _overlap(e, ra):
                    continue
                if e.stream == s or lk.hb(e.instr, i):
                    found = True
                else:
                    w = lk.instrs[e.instr]
                    raise error("NCC_EASM008", f"race: {c.stream} {c.op.name} reads {ra.name} written by "
                                f"{w.stream} {w.op.name} at line {w.line} with no semaphore ordering them",
                                loc, f"make {c.stream} wait for a semaphore that line {w.line} signals")
            if not found:
                raise error("NCC_EASM007", f"read before any write: {c.stream} {c.op.name} reads {ra.name}"
                            f"{list(ra.shape)} but no write to it is guaranteed to happen before", loc,
                            "write it first, or wait for the semaphore its writer signals")
            checked[memo] = foreign(key, s)
        for ra in c.writes:
            key = group[ra.name]
            memo = (key, ra.name, ra.box, s, True)
            if checked.get(memo) == foreign(key, s):
                continue
            iv = _interval(ra)
            near = store(writes, key).near(*iv) + store(reads, key).near(*iv)
            for _, e in sorted(near, key=lambda ke: ke[1].seq):
                if e.stream == s or not _overlap(e, ra) or lk.hb(e.instr, i):
                    continue
                w = lk.instrs[e.instr]
                what = "writes" if e.write else "reads"
                raise error("NCC_EASM008", f"race: {c.stream} {c.op.name} writes {ra.name} which {w.stream} "
                            f"{w.op.name} at line {w.line} {what} with no semaphore ordering them", loc,
                            f"make {c.stream} wait for a semaphore that line {w.line} signals")
            checked[memo] = foreign(key, s)
        for is_write, ras in ((False, c.reads), (True, c.writes)):
            for ra in ras:
                if ra.tensor.kind in ("input", "const"):
                    continue
                key = group[ra.name]
                total[key] += 1
                by_stream[(key, s)] += 1
                iv = _interval(ra)
                if is_write:
                    # A write that covers an earlier access ordered before it makes that entry redundant:
                    # whatever conflicts with the old access conflicts with this write too.
                    for table in (writes, reads):
                        st = store(table, key)
                        for k, e in st.near(*iv):
                            if (e.tensor == ra.name and _contains(ra.box, e.box)
                                    and (e.stream == s or lk.hb(e.instr, i))):
                                st.remove(k)
                st = store(writes if is_write else reads, key)
                ekey = (ra.name, ra.box, s)
                old = st.entries.get(ekey)
                if old is not None:
                    old.instr = i
                else:
                    st.add(ekey, _Entry(ra.name, ra.box, _phys(ra), s, is_write, i, iv[0], iv[1], seq))
                    seq += 1


def _accumulation(lk: Linked) -> None:
    """PSUM accumulation groups: a matmul with ``start=true`` opens a group on its output region, the
    matmuls with ``start=false`` after it on TensorE add to exactly that region, and one with
    ``stop=true`` closes it. A PSUM bank holds one open group (8 banks: 8 groups in flight), nothing
    but the group's own matmuls may touch its region while it is open (its partial sums are not a
    result), and every group is closed. Run after the race check, so the zero-time order agrees
    with every schedule for the accesses compared here."""
    prog = lk.program
    bank_bytes = lk.target.psum_bank_bytes
    open_by_bank: dict[int, tuple[tuple[int, int, int, int], int]] = {}  # bank -> (region, opening instr)

    def describe(i: int) -> str:
        return f"the accumulation group opened at line {lk.instrs[i].line}"

    for i in lk.order:
        c = lk.instrs[i]
        loc = _loc(prog, c.line)
        if c.op.name == "matmul":
            region = _phys(c.ops[0])
            assert region is not None
            bank = region[2] // bank_bytes  # the matmul check keeps an output inside one bank
            cur = open_by_bank.get(bank)
            if c.attrs["start"]:
                if cur is not None:
                    raise error("NCC_EASM006", f"matmul starts an accumulation group in PSUM bank {bank}, which "
                                f"still holds {describe(cur[1])} (no stop=true yet)", loc,
                                "end that group with stop=true, or accumulate in another bank (one open group "
                                "per bank)")
                cur = (region, i)
                open_by_bank[bank] = cur
            elif cur is None:
                raise error("NCC_EASM006", f"matmul accumulates (start=false) into {c.ops[0].name} but no "
                            f"accumulation group is open in PSUM bank {bank}", loc,
                            "the first matmul of a group has start=true")
            elif cur[0] != region:
                raise error("NCC_EASM006", f"matmul accumulates into {c.ops[0].name} at partitions "
                            f"{region[0]}..{region[1] - 1}, bytes {region[2]}..{region[3]}, but {describe(cur[1])} "
                            f"covers partitions {cur[0][0]}..{cur[0][1] - 1}, bytes {cur[0][2]}..{cur[0][3]}: "
                            "the matmuls of a group all write the same PSUM region", loc)
            if c.attrs["stop"]:
                del open_by_bank[bank]
            continue
        if not open_by_bank:
            continue
        for ra in (*c.reads, *c.writes):
            p = _phys(ra)
            if p is None or ra.memory != "psum":
                continue
            for region, first in open_by_bank.values():
                if p[0] < region[1] and region[0] < p[1] and p[2] < region[3] and region[2] < p[3]:
                    what = "writes" if any(ra is w for w in c.writes) else "reads"
                    raise error("NCC_EASM007", f"{c.stream} {c.op.name} {what} {ra.name} while {describe(first)} "
                                "is still accumulating there (partial sums)", loc,
                                "wait for a semaphore the group's stop=true matmul signals")
    if open_by_bank:
        first = min(i for _, i in open_by_bank.values())
        raise error("NCC_EASM006", "accumulation group never ends: no matmul with stop=true closes it",
                    _loc(prog, lk.instrs[first].line), "give the group's last matmul stop=true")


def _coverage(lk: Linked) -> None:
    """Every element of every output must be written (the host reads them all)."""
    prog = lk.program
    for t in prog.outputs():
        if t.size > MAX_COVERAGE_ELEMS:
            continue
        mask = np.zeros(t.shape, dtype=bool)
        for c in lk.instrs:
            for ra in c.writes:
                if ra.name == t.name:
                    mask[tuple(slice(s, e, k) for s, e, k in ra.box)] = True
        if not mask.all():
            missing = np.argwhere(~mask)
            raise error("NCC_EASM007", f"output {t.name}: {len(missing)} of {t.size} element(s) are never written "
                        f"(first at index {list(map(int, missing[0]))})", _loc(prog, t.line),
                        "the host reads every element of an output")


def flops_total(lk: Linked) -> dict[str, float]:
    """TensorE FLOPs of the program by precision (what MFU and the compute roofline count)."""
    out: dict[str, float] = defaultdict(float)
    for c in lk.instrs:
        f = c.op.flops(c)
        if f:
            out[f[0]] += f[1]
    return dict(out)

"""Checking a device program against a target, before anything runs.

``link`` places on-chip tensors, resolves every access, checks every instruction's operands, then
analyses synchronisation: it replays the streams in zero time (a wait proceeds once enough signals
have happened) to find deadlocks and an execution order, and computes exactly which instructions
are *guaranteed* to happen before which. With that it refuses a read that no write is guaranteed
to precede ("read before any write"), two conflicting accesses on different streams that no
semaphore orders (a race), and misused PSUM accumulation groups. A program that passes is
deterministic: the functional result does not depend on timing.

Built for programs of millions of instructions: instructions that repeat (same stream, opcode,
operands and attributes: a loop's body) are checked once; the happens-before relation is computed
in one pass when every semaphore has a single signalling stream (what the backend emits), and with
one pass per signalling stream otherwise; the race check keeps, per memory, only the accesses a
later one can still conflict with. ``races=False`` (a NEFF this nxsat wrote and checked) skips the
happens-before and race analysis and keeps everything else.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from nxsat.diagnostics import Loc, error
from nxsat.lazy import cached_property
from nxsat.sim import numerics as nm
from nxsat.sim.isa import OPS, Attr, CheckFail, LInstr, RAccess
from nxsat.sim.program import (
    AP,
    TENSOR_KINDS,
    Access,
    AccessError,
    Instr,
    Program,
    Tensor,
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
    """A checked program: resolved instructions, streams, execution order, happens-before clocks.

    ``program`` is the checked copy (on-chip tensors placed, ranks resolved); the program given to
    :func:`link` is never modified. ``vc`` is None when the race analysis was skipped."""

    program: Program
    target: Target
    instrs: list[LInstr]
    streams: list[str]
    by_stream: dict[str, list[int]]
    sid: list[int]
    pos: list[int]
    order: list[int]
    vc: np.ndarray | None = field(default=None, repr=False)
    templates: int = 0  # distinct (stream, opcode, operands, attributes): LInstr.template < templates
    single: bool = False  # every semaphore has a single signalling stream (the race check's fast path)

    @cached_property
    def scratch_touches(self) -> dict[int, tuple[str, ...]]:
        """The scratch tensors each instruction touches (those that touch any), for the executor, which
        makes each at its first access and frees it after its last."""
        out = {}
        for i, c in enumerate(self.instrs):
            names = {ra.name for ra in (*c.reads, *c.writes) if ra.tensor.kind == "scratch"}
            if names:
                out[i] = tuple(sorted(names))
        return out

    @cached_property
    def template_ids(self) -> np.ndarray:
        """Each instruction's template, as an array (for per-template sums over the program)."""
        return np.fromiter((c.template for c in self.instrs), dtype=np.int64, count=len(self.instrs))

    def hb(self, a: int, b: int) -> bool:
        """Is instruction ``a`` guaranteed to complete before ``b`` starts (or precede it in its stream)?"""
        if self.sid[a] == self.sid[b]:
            return self.pos[a] < self.pos[b]
        if self.vc is None:
            raise ValueError("happens-before is only known when linked with races=True")
        return self.pos[a] < int(self.vc[b, self.sid[a]])


def _loc(prog: Program, line: int, origin: str | None = None) -> Loc:
    return Loc(prog.source, line, origin=origin)


def _iloc(prog: Program, ins: Instr) -> Loc:
    return Loc(prog.source, ins.line, origin=ins.origin)


def link(prog: Program, target: Target, races: bool = True) -> Linked:
    """Check ``prog`` for ``target``; raise a coded error at the offending line, or return it linked."""
    ranks = _check_header(prog, target)
    prog = replace(prog, target=target.name, lnc=target.lnc, ranks=ranks)
    prog.tensors = _place(prog, target)
    n = len(prog.instrs)
    if n > MAX_INSTRUCTIONS:
        raise error("NCC_EVRF007", f"{n} instructions; the simulator accepts at most {MAX_INSTRUCTIONS}",
                    _iloc(prog, prog.instrs[MAX_INSTRUCTIONS]))
    linker = _Linker(prog, target)
    instrs = [linker.link(ins, i) for i, ins in enumerate(prog.instrs)]
    streams = sorted({ins.stream for ins in prog.instrs}, key=stream_order)
    by_stream: dict[str, list[int]] = {s: [] for s in streams}
    sid = [0] * n
    pos = [0] * n
    index = {s: k for k, s in enumerate(streams)}
    for i, ins in enumerate(prog.instrs):
        lst = by_stream[ins.stream]
        pos[i] = len(lst)
        lst.append(i)
        sid[i] = index[ins.stream]
    order, single = _replay(prog, by_stream, streams)
    lk = Linked(prog, target, instrs, streams, by_stream, sid, pos, order, templates=linker.count, single=single)
    if races:
        check_races(lk)
    _accumulation(lk)
    _coverage(lk)
    return lk


def check_races(lk: Linked) -> None:
    """What ``races=True`` adds: the happens-before clocks (fast where every semaphore has a single
    signalling stream), then read-before-write and races."""
    lk.vc = _clocks_fast(lk) if lk.single else _clocks(lk.program, lk.streams, lk.by_stream, lk.sid, lk.pos,
                                                      lk.order)
    _dataflow(lk)


# --- header and placement ----------------------------------------------------------------------

def _check_header(prog: Program, target: Target) -> int:
    """The program's SPMD rank count, after checking its header against the target."""
    if prog.target is not None and prog.target != target.name:
        raise error("NCC_EASM004", f"the program is for {prog.target}, not {target.name}", _loc(prog, 1))
    if prog.lnc is not None and prog.lnc != target.lnc:
        raise error("NCC_EASM004", f"the program is for logical core config {prog.lnc}, the target uses "
                    f"{target.lnc}", _loc(prog, 1))
    ranks = target.lnc if prog.ranks is None else prog.ranks
    if ranks % target.lnc:
        raise error("NCC_EARG001", f"{target.name} with lnc={target.lnc} runs a program on {target.lnc} "
                    f"physical cores: .ranks must be a multiple of {target.lnc}, not {ranks}", _loc(prog, 1))
    if len(prog.semaphores) > target.max_semaphores:
        name = list(prog.semaphores)[target.max_semaphores]
        raise error("NCC_EASM004", f"{len(prog.semaphores)} semaphores; {target.name} has "
                    f"{target.max_semaphores}", _loc(prog, prog.semaphores[name]))
    return ranks


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
        if t.alias is not None:
            src = prog.tensors.get(t.alias)
            if src is None or src.kind != "input" or (src.dtype, src.shape, src.shard) != (t.dtype, t.shape, t.shard):
                raise error("NCC_EASM004", f"{t.name}: alias={t.alias} must name an input of the same type, "
                            f"shape and shard ({t.dtype.name}{list(t.shape)})", loc)
            out[t.name] = t
            continue
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

class _Linker:
    """Links instructions, checking each distinct (stream, opcode, operands, attributes) once."""

    def __init__(self, prog: Program, target: Target) -> None:
        self.prog = prog
        self.target = target
        self.access: dict[Access, RAccess] = {}
        self.templates: dict[tuple, LInstr] = {}
        self.count = 0  # templates made (an instruction with an unhashable attribute gets one of its own)
        self.attr_keys: dict[int, tuple] = {}  # id(attrs dict) -> its key (the dicts live as long as the program)
        self.sems = prog.semaphores
        self.queues = target.dma_queues

    def link(self, ins: Instr, index: int) -> LInstr:
        attrs = ins.attrs
        akey = self.attr_keys.get(id(attrs))  # the parser shares one dict among a loop's instructions
        try:
            if akey is None:
                akey = tuple((k, v.__class__, v) for k, v in attrs.items()) if attrs else ()
                hash(akey)
                self.attr_keys[id(attrs)] = akey
            key = (ins.stream, ins.opcode, ins.operands, akey)
            proto = self.templates.get(key)
        except TypeError:  # an unhashable attribute (a program built in Python): check it the long way
            key, proto = None, None
        sems = self.sems
        for w in ins.waits:
            if w.sem not in sems:
                raise error("NCC_EASM003", f"undefined semaphore {w.sem}", _iloc(self.prog, ins))
            if w.value < 1:
                raise error("NCC_EASM004", "a wait needs a count of at least 1", _iloc(self.prog, ins))
        for sem in ins.signals:
            if sem not in sems:
                raise error("NCC_EASM003", f"undefined semaphore {sem}", _iloc(self.prog, ins))
        if len(ins.signals) > 1 and len(set(ins.signals)) != len(ins.signals):
            raise error("NCC_EASM004", "a semaphore is signalled once by one instruction", _iloc(self.prog, ins))
        if proto is None:
            proto = self._link_new(ins, index)
            proto.template = self.count
            self.count += 1
            if key is not None:
                self.templates[key] = proto
            return proto
        return LInstr(ins, index, proto.op, proto.ops, proto.attrs, proto.reads, proto.writes, proto.ranks,
                      proto.domains, proto.template)

    def _link_new(self, ins: Instr, index: int) -> LInstr:
        prog, target = self.prog, self.target
        loc = _iloc(prog, ins)
        op = OPS.get(ins.opcode)
        kind = stream_kind(ins.stream)
        # The parser guarantees these for text; programs built in Python are checked here.
        if op is None:
            raise error("NCC_EASM002", f"unknown instruction {ins.opcode!r}", loc)
        if not kind:
            raise error("NCC_EASM002", f"unknown stream {ins.stream!r}", loc)
        if len(ins.operands) != len(op.operands):
            raise error("NCC_EASM004", f"{ins.opcode} takes {len(op.operands)} operand(s), got {len(ins.operands)}",
                        loc)
        for acc in ins.operands:
            if not isinstance(acc, Access) or acc.tensor not in prog.tensors:
                raise error("NCC_EASM003", f"undefined tensor {getattr(acc, 'tensor', acc)}", loc)
        if kind == "dma" and int(ins.stream[1:]) >= self.queues:
            raise error("NCC_EASM002", f"stream {ins.stream}: {target.name} has DMA queues q0..q{self.queues - 1}",
                        loc)
        if kind not in op.engines:
            names = ", ".join("q<n>" if e == "dma" else e for e in op.engines)
            raise error("NCC_EASM004", f"{ins.opcode} does not run on {ins.stream}", loc, f"it runs on {names}")
        if prog.version < op.since:
            raise error("NCC_EASM002", f"{ins.opcode} is an ISA {op.since[0]}.{op.since[1]} instruction; the program "
                        f"says .isa {prog.version[0]}.{prog.version[1]}", loc,
                        f"write .isa {op.since[0]}.{op.since[1]}")

        def res(acc: Access, what: str) -> RAccess:
            ra = self.access.get(acc)
            if ra is None:
                t = prog.tensors[acc.tensor]
                try:
                    ap = resolve(acc, t)
                except AccessError as exc:
                    raise error("NCC_EASM004", f"{ins.opcode} {what}: {exc}", loc) from None
                ra = RAccess(acc, t, ap, index_box(acc, t, ap))
                self.access[acc] = ra
            if kind == "pool" and ra.memory == "psum":
                raise error("NCC_EASM004", f"{ins.opcode} {what}: GpSimd cannot access PSUM ({ra.name})", loc)
            return ra

        ops = []
        for spec, acc in zip(op.operands, ins.operands):
            ra = res(acc, spec.name)
            if ra.memory not in spec.memories:
                raise error("NCC_EASM004", f"{ins.opcode} {spec.name} must be in "
                            f"{' or '.join(sorted(spec.memories))}; {ra.name} is in {ra.memory}", loc)
            ops.append(ra)
        unknown = sorted(set(ins.attrs) - {a.name for a in op.attrs})
        if unknown:
            raise error("NCC_EASM004", f"{ins.opcode} has no attribute {unknown[0]}", loc)
        attrs = {a.name: _attr_value(prog, ins, a, loc) for a in op.attrs}
        for a in op.attrs:
            if prog.version < a.since and attrs[a.name] != a.default:
                raise error("NCC_EASM002", f"{ins.opcode} attribute {a.name} is ISA {a.since[0]}.{a.since[1]}; the "
                            f"program says .isa {prog.version[0]}.{prog.version[1]}", loc,
                            f"write .isa {a.since[0]}.{a.since[1]}")
            v_since = dict(a.choices_since).get(attrs[a.name]) if a.choices_since else None
            if v_since is not None and prog.version < v_since:
                raise error("NCC_EASM002", f"{ins.opcode} {a.name}={attrs[a.name]} is ISA {v_since[0]}.{v_since[1]}; "
                            f"the program says .isa {prog.version[0]}.{prog.version[1]}", loc,
                            f"write .isa {v_since[0]}.{v_since[1]}")
        for a in op.attrs:
            v = attrs.get(a.name)
            if a.kind in ("scalar", "in", "out") and isinstance(v, Access):
                ra = res(v, a.name)
                if not ra.onchip:
                    raise error("NCC_EASM004", f"{ins.opcode} {a.name} must be an on-chip tile", loc)
                attrs[a.name] = ra
        c = LInstr(ins, index, op, ops, attrs, ranks=prog.ranks)
        try:
            op.check(c, target)
            if kind in ("pe", "act", "dve", "pool"):
                _engine_access(c, target)
            c.domains = op.domains(c, target)
        except CheckFail as exc:
            msg = str(exc) if str(exc).startswith(ins.opcode) else f"{ins.opcode}: {exc}"
            raise error(exc.code, msg, loc) from None
        c.reads, c.writes = op.effects(c)
        for w in c.writes:
            if is_broadcast(w.acc):
                raise error("NCC_EASM004", f"{ins.opcode} writes {w.name} through a broadcast view", loc)
            if w.tensor.kind in ("input", "const"):
                raise error("NCC_EASM004", f"{ins.opcode} writes {w.name}, a read-only {w.tensor.kind}", loc)
        for a in (*c.reads, *c.writes):
            if a.tensor.alias is not None:
                raise error("NCC_EASM004", f"{ins.opcode} accesses {a.name}, an alias of input {a.tensor.alias} "
                            "(it has no storage of its own)", loc)
        return c


def engine_access_fault(p0: int, n: int, ap: AP, target: Target, name: str = "",
                        shape: tuple[int, ...] = ()) -> CheckFail | None:
    """The documented rule a compute engine's on-chip operand of ``n`` partitions from ``p0`` breaks, or
    None: it starts at 0 (n > 64), 0 or 64 (32 < n <= 64) or a multiple of 32 (n <= 32), which also limits
    the moves across partitions to whole halves and quadrants; at most four free dimensions. The
    verifier raises it; the backend asks before it emits an engine access (backend/forward.py)."""
    starts = target.start_partitions(n)
    if p0 not in starts:
        return CheckFail(f"{name}: an engine access of {n} partition(s) starts at partition "
                         f"{', '.join(map(str, starts))}, not {p0}", code="NCC_EASM005")
    most, dims = target.access["max_free_dims"], ap.merged_free_dims()
    if dims > most:
        return CheckFail(f"{name}{list(shape)}: an engine access pattern has at most {most} free dimensions, "
                         f"this one {dims}")
    return None


def _engine_access(c: LInstr, target: Target) -> None:
    for ra in (*c.ops, *(v for v in c.attrs.values() if isinstance(v, RAccess))):
        if ra.onchip:
            fault = engine_access_fault(ra.p0, ra.p1 - ra.p0, ra.ap, target, ra.name, ra.shape)
            if fault is not None:
                raise fault


def _attr_value(prog: Program, ins: Instr, a: Attr, loc: Loc) -> object:
    """An attribute's value, defaulted and checked against its kind (programs built in Python too)."""
    v = ins.attrs.get(a.name, a.default)
    k = a.kind
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if k == "bool":
        ok = isinstance(v, bool)
    elif k == "int":
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif k in ("float", "number"):
        ok = number
    elif k == "enum":
        ok = v in a.choices
    elif k == "ints":
        ok = isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    elif k == "scalar":
        ok = number or isinstance(v, Access)
    else:  # in, out
        ok = v is None or isinstance(v, Access)
    if not ok:
        want = f"one of {', '.join(a.choices)}" if k == "enum" else k
        raise error("NCC_EASM004", f"{ins.opcode} attribute {a.name}={v!r} must be {want}", loc)
    if isinstance(v, Access) and v.tensor not in prog.tensors:
        raise error("NCC_EASM003", f"undefined tensor {v.tensor}", loc)
    return v


# --- synchronisation ----------------------------------------------------------------------------

def _replay(prog: Program, by_stream: dict[str, list[int]], streams: list[str]) -> tuple[list[int], bool]:
    """A zero-time execution: every stream runs while its waits are met. Semaphores only count up,
    so any maximal run reaches the same end: stuck streams mean a deadlock in every schedule.
    Returns the execution order and whether every semaphore has a single signalling stream."""
    instrs = prog.instrs
    total: dict[str, int] = defaultdict(int)
    signallers: dict[str, set[str]] = defaultdict(set)
    for ins in instrs:
        for s in ins.signals:
            total[s] += 1
            signallers[s].add(ins.stream)
    for ins in instrs:
        for w in ins.waits:
            if w.value > total[w.sem]:
                raise error("NCC_EASM009", f"{ins.stream} {ins.opcode} waits for {w.sem}>={w.value} but the program "
                            f"signals {w.sem} only {total[w.sem]} time(s)", _iloc(prog, ins))
    count: dict[str, int] = dict.fromkeys(prog.semaphores, 0)
    # Event-driven: a blocked stream is parked on the semaphore it waits for and resumed when that
    # semaphore reaches the count (a heap per semaphore), so the replay is linear in the program.
    parked: dict[str, list[tuple[int, int]]] = defaultdict(list)
    lists = [by_stream[s] for s in streams]
    head = [0] * len(lists)
    order: list[int] = []
    ready = list(range(len(lists) - 1, -1, -1))
    while ready:
        k = ready.pop()
        lst = lists[k]
        h = head[k]
        while h < len(lst):
            ins = instrs[lst[h]]
            blocked = None
            for w in ins.waits:
                if count[w.sem] < w.value:
                    blocked = w
                    break
            if blocked is not None:
                heapq.heappush(parked[blocked.sem], (blocked.value, k))
                break
            order.append(lst[h])
            for sig in ins.signals:
                c = count[sig] + 1
                count[sig] = c
                p = parked.get(sig)
                while p and p[0][0] <= c:
                    ready.append(heapq.heappop(p)[1])
            h += 1
        head[k] = h
    if len(order) < len(instrs):
        stuck = []
        for k in range(len(streams)):
            if head[k] < len(lists[k]):
                ins = instrs[lists[k][head[k]]]
                w = next(w for w in ins.waits if count[w.sem] < w.value)
                stuck.append((ins, w))
        ins, w = stuck[0]
        others = "; ".join(f"{i.stream} at line {i.line} waits {x.sem}>={x.value} ({count[x.sem]} signalled)"
                           for i, x in stuck[1:4])
        raise error("NCC_EASM009", f"deadlock: {ins.stream} {ins.opcode} waits for {w.sem}>={w.value} but only "
                    f"{count[w.sem]} signal(s) can ever happen before it" + (f"; also {others}" if others else ""),
                    _iloc(prog, ins), "check the wait counts and which stream signals each semaphore")
    return order, all(len(v) == 1 for v in signallers.values())


def _clocks_fast(lk: Linked) -> np.ndarray:
    """vc[i, k] = how many instructions of stream k are guaranteed to complete before i starts,
    when every semaphore has one signalling stream.

    Then ``wait S>=v`` is met exactly when the v-th signal of S's stream has completed, so the
    instructions that must precede i are its stream predecessors, those signallers, and everything
    that must precede them: one pass in execution order, taking maxima of the predecessors' clocks.
    (Exact: every instruction outside that closure can be held back without stopping i.)"""
    prog = lk.program
    instrs = prog.instrs
    sid, pos = lk.sid, lk.pos
    n = len(instrs)
    vc = np.zeros((n, max(1, len(lk.streams))), dtype=np.int32)
    nth: dict[str, list[int]] = defaultdict(list)  # sem -> its signalling instructions in stream order
    for s in lk.streams:
        for i in lk.by_stream[s]:
            for sig in instrs[i].signals:
                nth[sig].append(i)
    prev = [-1] * len(lk.streams)
    for i in lk.order:
        ins = instrs[i]
        s = sid[i]
        p = prev[s]
        row = vc[i]
        if p >= 0:
            row[:] = vc[p]
        for w in ins.waits:
            j = nth[w.sem][w.value - 1]
            np.maximum(row, vc[j], out=row)
            sj = sid[j]
            if row[sj] <= pos[j]:
                row[sj] = pos[j] + 1
        row[s] = pos[i]
        prev[s] = i
    return vc


def _clocks(prog: Program, streams: list[str], by_stream: dict[str, list[int]], sid: list[int], pos: list[int],
            order: list[int]) -> np.ndarray:
    """vc[i, k] = how many instructions of stream k are guaranteed to complete before i starts, for
    semaphores signalled from several streams.

    Exact, by the same argument as the deadlock check: instruction j must complete before i starts
    exactly when the zero-time replay with j's stream stopped at j never reaches i (had some
    schedule started i first, everything that completed before it would be a run of that stopped
    replay). Stopping stream k at 0, 1, 2, ... instructions and resuming the same replay each time
    (counters only grow) gives every instruction the position of k it first became reachable at:
    one pass over the program per stream that signals anything.
    """
    n = len(prog.instrs)
    vc = np.zeros((n, len(streams)), dtype=np.int32)
    idx = np.arange(n)
    sids = np.asarray(sid, dtype=np.int64)
    vc[idx, sids] = pos
    lists = [by_stream[s] for s in streams]
    for k, lst in enumerate(lists):
        if not any(prog.instrs[i].signals for i in lst):
            continue  # nothing can wait for this stream
        col = np.asarray(_first_reachable(prog, lists, k), dtype=np.int32)
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

def _storage_keys(prog: Program) -> dict[str, str]:
    """Storage key of every tensor: an on-chip tensor's memory (its accesses are filed by absolute
    partition-row bytes, so tensors sharing memory meet there), an HBM tensor its own. Grouping only the
    on-chip tensors that overlap was a sweep of 20 s over mobilenet_v2's program, and compiler output
    reuses SBUF so much that nearly all of them fell into one group anyway."""
    return {name: f"<{t.memory}>" if t.onchip else name for name, t in prog.tensors.items()}  # <>: no tensor name


class _Intervals:
    """Footprints filed by the interval they cover in their storage (row bytes on chip, flat elements in
    HBM), so that an access finds the footprints that may overlap it without visiting the others.
    Buckets: level 0's about half as wide as a typical access of the storage, each next level
    ``2**LEVEL_BITS`` times wider. A footprint is filed at the first level where it spans fewer than
    ``WIDE`` buckets, so a small access meets only the large ones that lie over it, not every large one
    of its storage. Footprints leave as well as enter (a bucket is an insertion-ordered dict)."""

    WIDE = 16
    LEVEL_BITS = 3

    def __init__(self, shifts: dict[str, int]) -> None:
        self.shifts = shifts
        # storage -> levels: a level's buckets (bucket -> footprints, oldest first) and their sorted keys
        self.levels: dict[str, list[tuple[dict[int, dict[int, None]], list[int]]]] = defaultdict(list)
        self.epoch: dict[str, int] = defaultdict(int)  # storage -> changes so far (what was found may be reused)

    def _level(self, storage: str, lo: int, last: int) -> tuple[int, int]:
        s = self.shifts[storage]
        while (last >> s) - (lo >> s) >= self.WIDE:
            s += self.LEVEL_BITS
        return (s - self.shifts[storage]) // self.LEVEL_BITS, s

    def add(self, fid: int, storage: str, lo: int, last: int) -> None:
        self.epoch[storage] += 1
        level, s = self._level(storage, lo, last)
        levels = self.levels[storage]
        while len(levels) <= level:
            levels.append(({}, []))
        buckets, keys = levels[level]
        for b in range(lo >> s, (last >> s) + 1):
            bl = buckets.get(b)
            if bl is None:
                buckets[b] = {fid: None}
                insort(keys, b)
            else:
                bl[fid] = None

    def remove(self, fid: int, storage: str, lo: int, last: int) -> None:
        self.epoch[storage] += 1
        level, s = self._level(storage, lo, last)
        buckets, keys = self.levels[storage][level]
        for b in range(lo >> s, (last >> s) + 1):
            bl = buckets[b]
            del bl[fid]
            if not bl:
                del buckets[b]
                del keys[bisect_left(keys, b)]

    def near(self, storage: str, lo: int, last: int) -> Iterator[int]:
        """The filed footprints whose buckets meet ``[lo, last]`` (newest first within a bucket; one
        that spans several buckets comes once per bucket)."""
        s = self.shifts[storage]
        for buckets, keys in self.levels[storage]:
            for b in keys[bisect_left(keys, lo >> s):bisect_right(keys, last >> s)]:
                yield from reversed(buckets[b])
            s += self.LEVEL_BITS


class _Footprints:
    """The distinct footprints (tensor and index box) a program's accesses touch, numbered, with the
    latest read and write of each stream, and which of them an access meets (``RAccess.overlaps``:
    exact within a tensor, by bytes between on-chip tensors that share memory).

    An access older than every instruction still to run (on its stream ``k``, before ``done[k]``: the
    least that any stream's next instruction is guaranteed to follow) is ordered before everything
    left, so it can never race again; its only remaining effect is that a write there counts as
    written for a later read. Only footprints with accesses that may still race are *filed*, by their
    intervals (:class:`_Intervals`): all of them for a write to meet, those with a write in flight for
    a read to meet (reads never race with reads: a tensor written once and read tile by tile costs
    its reads nothing among themselves). A sweep drops settled accesses and unfiles what is left
    without any. So an access meets the footprints in flight, not every earlier one at its bytes: on
    compiler output, where SBUF is reused all program long, that was quadratic. A footprint whose
    write was dropped is filed for good in a third index, consulted only by a read that finds no write
    in flight. Sweeps run when the footprints met since the last one outnumber a quarter of those
    filed (meeting one costs about four entries of a sweep) and 64K, so they cost about what the
    checks would."""

    SWEEP_COST = 4  # meeting a footprint costs about as much as sweeping this many filed ones
    MIN_VISITS = 1 << 16  # visits between two sweeps at least (tests: 0, and SWEEP_COST huge: a sweep each time)

    def __init__(self, lk: Linked, shifts: dict[str, int]) -> None:
        self.lk = lk
        self.ras: list[RAccess] = []
        self.spans: list[tuple[str, int, int]] = []  # (storage, first, last) of each footprint
        self.by_key: dict[tuple, int] = {}
        self.memo_w: dict[int, tuple[int, list[int]]] = {}  # footprint -> (epoch, what a write met), in flight
        self.memo_r: dict[int, tuple[int, list[int]]] = {}
        self.last_write: list[dict[int, int]] = []  # footprint -> {stream: instruction}
        self.last_read: list[dict[int, int]] = []
        self.filed: dict[int, None] = {}  # footprints with an access in flight
        self.inflight = _Intervals(shifts)  # those
        self.writing = _Intervals(shifts)  # those with a write in flight
        self.settled = _Intervals(shifts)  # footprints a dropped write touched
        self.settled_write: list[bool] = []
        self.written: set[int] = set()  # footprints known to overlap a dropped write
        self.visits = 0
        streams = max(lk.sid, default=0) + 1
        self.queue: list[list[int]] = [[] for _ in range(streams)]  # each stream's instructions, run order
        for i in lk.order:
            self.queue[lk.sid[i]].append(i)
        self.head = [0] * streams

    def id(self, ra: RAccess, storage: str) -> int:
        key = (ra.name, ra.key)
        fid = self.by_key.get(key)
        if fid is None:
            fid = self.by_key[key] = len(self.ras)
            self.ras.append(ra)
            self.spans.append((storage, ra.lo, max(ra.lo + 1, ra.hi) - 1))
            self.last_write.append({})
            self.last_read.append({})
            self.settled_write.append(False)
        return fid

    def near(self, fid: int, write: bool) -> list[int]:
        """The footprints in flight that an access to ``fid`` meets: for a write every one it overlaps,
        for a read those with a write in flight (found again only when its storage's index changed:
        a tile used again and again between two sweeps finds them once)."""
        index, memo = (self.inflight, self.memo_w) if write else (self.writing, self.memo_r)
        span = self.spans[fid]
        epoch = index.epoch[span[0]]
        hit = memo.get(fid)
        if hit is not None and hit[0] == epoch:
            self.visits += len(hit[1])
            return hit[1]
        ra, ras = self.ras[fid], self.ras
        cand = dict.fromkeys(index.near(*span))
        self.visits += len(cand)
        found = [g for g in cand if g == fid or ra.overlaps(ras[g])]
        memo[fid] = (epoch, found)
        return found

    def accessed(self, fid: int, stream: int, i: int, write: bool) -> None:
        if write:
            lw = self.last_write[fid]
            if not lw:  # its first write in flight
                self.writing.add(fid, *self.spans[fid])
            lw[stream] = i
        else:
            self.last_read[fid][stream] = i
        if fid not in self.filed:
            self.filed[fid] = None
            self.inflight.add(fid, *self.spans[fid])

    def written_long_ago(self, fid: int) -> bool:
        """A write to a footprint overlapping ``fid`` was dropped by a sweep: it precedes every
        instruction left, so a read there is not a read before any write."""
        if self.settled_write[fid] or fid in self.written:
            return True
        ra = self.ras[fid]
        if any(ra.overlaps(self.ras[g]) for g in self.settled.near(*self.spans[fid])):
            self.written.add(fid)
            return True
        return False

    def ran(self, i: int) -> None:
        self.head[self.lk.sid[i]] += 1
        if self.visits > max(self.MIN_VISITS, len(self.filed) // self.SWEEP_COST):
            self._sweep()

    def _sweep(self) -> None:
        self.visits = 0
        self.memo_w.clear()
        self.memo_r.clear()
        lk = self.lk
        nxt = [q[h] for q, h in zip(self.queue, self.head) if h < len(q)]
        if not nxt:
            return
        assert lk.vc is not None
        done = lk.vc[nxt].min(axis=0).tolist()
        pos, sid = lk.pos, lk.sid
        for g in list(self.filed):
            lw, lr = self.last_write[g], self.last_read[g]
            had_write = bool(lw)
            for d, is_write in ((lw, True), (lr, False)):
                old = [k for k, j in d.items() if pos[j] < done[sid[j]]]
                for k in old:
                    del d[k]
                if old and is_write and not self.settled_write[g]:
                    self.settled_write[g] = True
                    self.settled.add(g, *self.spans[g])
            if had_write and not lw:
                self.writing.remove(g, *self.spans[g])
            if not lw and not lr:
                del self.filed[g]
                self.inflight.remove(g, *self.spans[g])


def _dataflow(lk: Linked) -> None:
    """Read before any write and races. For each footprint, the latest read and the latest write of
    every stream: an access conflicts with those of the footprints it overlaps, and an older access of
    the same stream is ordered before the latest, so checking the latest is enough (and accesses
    ordered before everything still to run are dropped: :class:`_Footprints`)."""
    prog = lk.program
    group = _storage_keys(prog)
    instrs = lk.instrs
    pos, sid, vc = lk.pos, lk.sid, lk.vc
    assert vc is not None
    spans: dict[str, list[int]] = defaultdict(list)
    seen: set[int] = set()
    for c in instrs:
        if c.template in seen:
            continue
        seen.add(c.template)
        for ra in (*c.reads, *c.writes):
            spans[group[ra.name]].append(ra.hi - ra.lo)
    shifts = {k: max(0, max(1, sorted(v)[len(v) // 2]).bit_length() - 2) for k, v in spans.items()}
    fps = _Footprints(lk, shifts)
    last_write, last_read = fps.last_write, fps.last_read
    fid_of: dict[int, int] = {}  # id(RAccess) -> footprint (RAccess objects are shared and live as long)

    def race(c: LInstr, ra: RAccess, j: int, mine: str, theirs: str) -> Exception:
        w = instrs[j]
        other = f"{w.stream} {w.op.name} at line {w.line}" + (f" ({w.instr.origin})" if w.instr.origin else "")
        what = f"written by {other}" if mine == "reads" else f"which {other} {theirs}"
        return error("NCC_EASM008", f"race: {c.stream} {c.op.name} {mine} {ra.name} {what} with no semaphore "
                     "ordering them", _iloc(prog, c.instr),
                     f"make {c.stream} wait for a semaphore that line {w.line} signals")

    for i in lk.order:
        c = instrs[i]
        s = sid[i]
        row = None
        updates: list[tuple[int, bool]] = []
        for is_write, ras in ((False, c.reads), (True, c.writes)):
            for ra in ras:
                kind = ra.tensor.kind
                if kind == "input" or kind == "const":
                    continue
                fid = fid_of.get(id(ra))
                if fid is None:
                    fid = fid_of[id(ra)] = fps.id(ra, group[ra.name])
                updates.append((fid, is_write))
                found = False
                for g in fps.near(fid, is_write):
                    for k, j in last_write[g].items():
                        if k == s:
                            found = True
                            continue
                        if row is None:
                            row = vc[i].tolist()
                        if pos[j] < row[k]:
                            found = True
                        else:
                            raise race(c, ra, j, "writes" if is_write else "reads", "writes")
                    if is_write:
                        for k, j in last_read[g].items():
                            if k == s:
                                continue
                            if row is None:
                                row = vc[i].tolist()
                            if pos[j] >= row[k]:
                                raise race(c, ra, j, "writes", "reads")
                if not is_write and not found and not fps.written_long_ago(fid):
                    raise error("NCC_EASM007", f"read before any write: {c.stream} {c.op.name} reads {ra.name}"
                                f"{list(ra.shape)} but no write to it is guaranteed to happen before",
                                _iloc(prog, c.instr), "write it first, or wait for the semaphore its writer signals")
        for fid, is_write in updates:
            fps.accessed(fid, s, i, is_write)
        fps.ran(i)


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
        if c.op.name == "matmul":
            loc = Loc(prog.source, c.instr.line, origin=c.instr.origin)
            d = c.ops[0]
            region = (d.p0, d.p1, d.lo, d.hi)
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
                raise error("NCC_EASM006", f"matmul accumulates (start=false) into {d.name} but no "
                            f"accumulation group is open in PSUM bank {bank}", loc,
                            "the first matmul of a group has start=true")
            elif cur[0] != region:
                raise error("NCC_EASM006", f"matmul accumulates into {d.name} at partitions "
                            f"{region[0]}..{region[1] - 1}, bytes {region[2]}..{region[3]}, but {describe(cur[1])} "
                            f"covers partitions {cur[0][0]}..{cur[0][1] - 1}, bytes {cur[0][2]}..{cur[0][3]}: "
                            "the matmuls of a group all write the same PSUM region", loc)
            if c.attrs["stop"]:
                del open_by_bank[bank]
            continue
        if not open_by_bank:
            continue
        for ra in (*c.reads, *c.writes):
            if ra.memory != "psum":
                continue
            for region, first in open_by_bank.values():
                if ra.p0 < region[1] and region[0] < ra.p1 and ra.lo < region[3] and region[2] < ra.hi:
                    what = "writes" if any(ra is w for w in c.writes) else "reads"
                    raise error("NCC_EASM007", f"{c.stream} {c.op.name} {what} {ra.name} while {describe(first)} "
                                "is still accumulating there (partial sums)", _iloc(prog, c.instr),
                                "wait for a semaphore the group's stop=true matmul signals")
    if open_by_bank:
        first = min(i for _, i in open_by_bank.values())
        raise error("NCC_EASM006", "accumulation group never ends: no matmul with stop=true closes it",
                    _iloc(prog, lk.instrs[first].instr), "give the group's last matmul stop=true")


def _coverage(lk: Linked) -> None:
    """Every element of every output must be written (the host reads them all)."""
    prog = lk.program
    outputs = {t.name: t for t in prog.outputs() if t.size <= MAX_COVERAGE_ELEMS and t.alias is None}
    if not outputs:
        return
    writes: dict[str, dict[tuple, RAccess]] = {name: {} for name in outputs}
    for c in lk.instrs:
        for ra in c.writes:
            w = writes.get(ra.name)
            if w is not None:
                w.setdefault(ra.key, ra)
    for name, t in outputs.items():
        mask = np.zeros(t.shape, dtype=bool)
        flat = mask.reshape(-1)
        for ra in writes[name].values():
            if ra.box is not None:
                mask[tuple(slice(s, e, k) for s, e, k in ra.box)] = True
            else:
                for a, b in zip(*ra.runs):
                    flat[a:b] = True
        if not mask.all():
            missing = np.argwhere(~mask)
            raise error("NCC_EASM007", f"output {t.name}: {len(missing)} of {t.size} element(s) are never written "
                        f"(first at index {list(map(int, missing[0]))})", _loc(prog, t.line),
                        "the host reads every element of an output")


def flops_total(lk: Linked) -> dict[str, float]:
    """TensorE FLOPs of the program by precision (what MFU and the compute roofline count)."""
    counts = np.bincount(lk.template_ids, minlength=lk.templates)
    out: dict[str, float] = defaultdict(float)
    seen: set[int] = set()
    for c in lk.instrs:
        if c.template in seen:
            continue
        seen.add(c.template)
        f = c.op.flops(c)
        if f:
            out[f[0]] += f[1] * int(counts[c.template])
    return dict(out)

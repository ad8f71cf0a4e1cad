"""The timing model: an event-driven replay of every stream with semaphores, DMA queues and HBM.

Each compute engine runs its stream in order. An instruction starts when the engine is free, its
semaphore waits are met, the instruction before it on the same engine has written what it reads
(plus the documented dependent-instruction stall), and no conflicting engine holds a shared memory
port; it occupies the engine for its cost (the target spec's formula, in cycles of the engine's
clock) and signals its semaphores after the fixed access latency. DMA queues trigger their
transfers in order; after the fixed trigger latency a transfer flows through the DMA engines,
sharing the engines and the core's HBM bandwidth with every other transfer in flight (max-min fair
rates, recomputed whenever a transfer starts or ends). Everything the model assumes beyond the
published facts is in the target spec's ``assumptions``.

Time is kept exactly, in integer picoseconds: a replay of any length (a training step simulates
hundreds of milliseconds) advances by whole picoseconds and never stalls on float resolution. An
instruction's cost is rounded to the nearest picosecond once; a transfer finishes at the first
picosecond by which its bytes have moved. Everything static (costs, transfers, which earlier
instruction of the same engine an instruction waits for) is worked out once per distinct
instruction before the replay.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from nxsat.diagnostics import error
from nxsat.lazy import cached_property
from nxsat.sim.isa import Transfer
from nxsat.sim.program import stream_kind
from nxsat.sim.verify import Linked

PS = 1000  # picoseconds per nanosecond
STALL_WINDOW = 4  # earlier instructions of the same engine an instruction may wait on for its data
_SBUF, _PSUM = 1, 2


@dataclass
class Slice:
    """One interval on one track of the trace (nanoseconds)."""

    stream: str
    start: float
    end: float
    instr: int
    phase: str = ""  # "" or "transfer" (the DMA part of a gather/scatter)


@dataclass
class Timeline:
    """What the replay produced: when each instruction ran, and the totals the report needs.

    Times are kept in integer picoseconds (``start_ps``: an engine instruction's issue or a DMA's
    trigger; ``end_ps``: when its semaphores are signalled) and shown in nanoseconds."""

    latency_ps: int
    start_ps: np.ndarray
    end_ps: np.ndarray
    busy_ps: dict[str, int]
    hbm_bytes: float
    spill_bytes: float
    dma_engine_ps: float
    dma_bytes: float  # bytes the DMA engines moved (an HBM-to-HBM copy once, though HBM sees it twice)
    streams: list[str]
    spans: np.ndarray  # (stream index, start ps, end ps, instruction, phase 0|1) per trace slice
    transfers: dict[int, Transfer] = field(default_factory=dict)

    @property
    def latency(self) -> float:
        return self.latency_ps / PS

    @cached_property
    def start(self) -> np.ndarray:
        return self.start_ps / PS

    @cached_property
    def end(self) -> np.ndarray:
        return self.end_ps / PS

    @property
    def busy(self) -> dict[str, float]:
        return {k: v / PS for k, v in self.busy_ps.items()}

    @property
    def dma_engine_ns(self) -> float:
        return self.dma_engine_ps / PS

    @cached_property
    def slices(self) -> list[Slice]:
        return [Slice(self.streams[int(s)], a / PS, b / PS, int(i), "transfer" if ph else "")
                for s, a, b, i, ph in self.spans.tolist()]


class _Flow:
    __slots__ = ("instr", "owner", "remaining", "ecost", "cap", "hfac", "rate", "start", "version", "tr")

    def __init__(self, instr: int, owner: int, tr: Transfer, ecost: float, start: int) -> None:
        self.instr = instr
        self.owner = owner  # stream index
        self.tr = tr
        self.remaining = float(tr.nbytes)
        self.ecost = ecost  # DMA-engine picoseconds per byte
        self.cap = float(tr.engines)  # DMA engines the transfer's shape can use
        self.hfac = (tr.hbm_bytes / tr.nbytes) / ecost if tr.nbytes else 0.0  # HBM bytes per engine-ps
        self.rate = 0.0  # bytes per ps
        self.start = start
        self.version = 0


def engine_ps_per_byte(tr: Transfer, engine_bpps: float, overhead_ps: float) -> float:
    """DMA-engine picoseconds a byte of ``tr`` costs: its share of a descriptor's bytes at the engine's rate
    and of the descriptor's fixed overhead (so short runs cost more than their bytes)."""
    desc = max(1.0, tr.descriptor_bytes)
    return (desc / engine_bpps + overhead_ps) / desc / tr.efficiency


def _fair_share(flows: list[_Flow], engines: float, hbm: float) -> None:
    """Max-min fair shares of DMA-engine time: every transfer in flight gets an equal number of engines
    (engines serve them round-robin), up to the engines its shape allows, the core's engines and its
    HBM bandwidth; a transfer's byte rate is its engine time over its engine cost per byte."""
    free = sorted(flows, key=lambda f: f.cap)
    used_e = used_h = 0.0
    while free:
        n = len(free)
        sh = sum(f.hfac for f in free)
        lam = free[0].cap
        lim_e = (engines - used_e) / n
        lim_h = (hbm - used_h) / sh if sh > 0 else math.inf
        level = max(0.0, min(lam, lim_e, lim_h))
        if level == lam and lam <= lim_e and lam <= lim_h:
            # the transfers with the smallest cap are satisfied; the rest keep rising
            while free and free[0].cap <= level:
                f = free.pop(0)
                f.rate = f.cap / f.ecost
                used_e += f.cap
                used_h += f.hfac * f.cap
            continue
        if lim_e <= lim_h:
            for f in free:
                f.rate = level / f.ecost
            return
        rest = []
        for f in free:  # HBM is saturated: transfers that touch it stop here
            if f.hfac > 0:
                f.rate = level / f.ecost
                used_e += level
            else:
                rest.append(f)
        used_h = hbm
        free = rest


def simulate(lk: Linked) -> Timeline:
    """Replay the program in time; deterministic (ties are broken by stream order)."""
    t = lk.target
    n = len(lk.instrs)
    instrs = lk.instrs
    streams = lk.streams
    kinds = [stream_kind(s) for s in streams]
    ns = len(streams)
    sid = lk.sid
    spec_lat = t.spec["latency"]
    dma = t.dma

    # --- static: per distinct instruction (template), then per instruction ------------------------
    tmpl_cost: dict[int, int] = {}
    tmpl_tr: dict[int, Transfer | None] = {}
    tmpl_mem: dict[int, int] = {}
    cost = [0] * n
    mems = [0] * n
    for c in instrs:
        k = c.template
        if k not in tmpl_cost:
            kind = stream_kind(c.stream)
            tr = c.op.transfer(c, t)
            tmpl_tr[k] = tr
            if kind == "dma":
                tmpl_cost[k] = 0
            else:
                tmpl_cost[k] = round(t.engines[kind].ns(c.op.cycles(c, t)) * PS)
            m = 0
            for ra in (*c.reads, *c.writes):
                if ra.memory == "sbuf":
                    m |= _SBUF
                elif ra.memory == "psum":
                    m |= _PSUM
            tmpl_mem[k] = m
        cost[c.index] = tmpl_cost[k]
        mems[c.index] = tmpl_mem[k]
    access_ps = {s: round(t.engines[s].ns(spec_lat["access_cycles"]) * PS) if s != "cc" else 0
                 for s in t.engines}
    stall_ps = {s: round(t.engines[s].ns(spec_lat["dependent_stall_cycles"]) * PS)
                for s in spec_lat["dependent_stall_engines"] if s in t.engines}
    restart_ps = {s: round(e.ns(e.idle_restart_cycles) * PS) for s, e in t.engines.items() if e.idle_restart_cycles}
    sem_ps = round(float(spec_lat["semaphore_ns"]) * PS)
    fixed_ps = round(float(dma["fixed_latency_ns"]) * PS)
    pipelined = bool(dma.get("queue_pipelined", True))
    overhead_ps = float(dma["descriptor_overhead_ns"]) * PS
    engine_bpps = float(dma["engine_gbps"]) / PS  # bytes per ps per engine at full speed
    n_engines = float(dma["engines"])
    hbm_bpps = t.hbm_bw / PS

    # Which recent instruction of the same engine each instruction waits on for its data.
    deps: dict[int, list[int]] = {}
    pair: dict[tuple[int, int], bool] = {}
    for s in streams:
        if s not in stall_ps:
            continue
        lst = lk.by_stream[s]
        for p, i in enumerate(lst):
            c = instrs[i]
            found = []
            for j in lst[max(0, p - STALL_WINDOW):p]:
                prev = instrs[j]
                key = (prev.template, c.template)
                hit = pair.get(key)
                if hit is None:
                    reads = c.op.data_reads(c)
                    hit = pair[key] = any(w.overlaps(r) for w in prev.writes for r in reads)
                if hit:
                    found.append(j)
            if found:
                deps[i] = found
    conflicts: list[list[tuple[int, int]]] = [[] for _ in range(ns)]  # stream -> [(other stream, memory bit)]
    index = {s: k for k, s in enumerate(streams)}
    for rule in t.spec.get("port_conflicts", []):
        bit = _SBUF if rule["memory"] == "sbuf" else _PSUM
        engs = [e for e in rule["engines"] if e in index]
        for a in engs:
            for b in engs:
                if a != b:
                    conflicts[index[a]].append((index[b], bit))

    # --- the replay --------------------------------------------------------------------------------
    queue = [lk.by_stream[s] for s in streams]
    head = [0] * ns
    free_at = [0] * ns
    last_end = [-1] * ns
    blocked = [False] * ns  # an engine waiting for its own transfer (gather/scatter)
    wake_at = [-1] * ns
    pending: list[deque[tuple[int, int]]] = [deque() for _ in range(ns)]  # DMA: (instr, may start at)
    active = [False] * ns  # DMA: a transfer of this queue is flowing
    port_busy = [[0, 0, 0] for _ in range(ns)]  # per stream: busy until, by memory bit (1: sbuf, 2: psum)
    count = dict.fromkeys(lk.program.semaphores, 0)
    waiters: dict[str, list[tuple[int, int]]] = {}
    start = np.full(n, -1, dtype=np.int64)
    end = np.full(n, -1, dtype=np.int64)
    busy = [0] * ns
    spans: list[tuple[int, int, int, int, int]] = []
    transfers: dict[int, Transfer] = {}
    flows: list[_Flow] = []
    heap: list[tuple[int, int, int, int, int]] = []  # (time, seq, kind, payload, version)
    seq = 0
    hbm_bytes = 0.0
    dma_bytes = 0.0
    spill = 0.0
    engine_ps = 0.0
    last_flow_t = 0
    dirty: set[int] = set(range(ns))
    WAKE, DONE, FLOWEND, FLOWSTART = 0, 1, 2, 3

    def push(time: int, kind: int, payload: int, version: int = 0) -> None:
        nonlocal seq
        heapq.heappush(heap, (time, seq, kind, payload, version))
        seq += 1

    def wake(k: int, time: int) -> None:
        if wake_at[k] != time:
            wake_at[k] = time
            push(time, WAKE, k)

    def waits_met(i: int, k: int) -> bool:
        for w in instrs[i].instr.waits:
            if count[w.sem] < w.value:
                heapq.heappush(waiters.setdefault(w.sem, []), (w.value, k))
                return False
        return True

    def advance_flows(now: int) -> None:
        nonlocal last_flow_t, engine_ps
        dt = now - last_flow_t
        if dt and flows:
            use = 0.0
            for f in flows:
                f.remaining -= f.rate * dt
                use += f.rate * f.ecost
            engine_ps += use * dt
        last_flow_t = now

    def reflow(now: int) -> None:
        if not flows:
            return
        _fair_share(flows, n_engines, hbm_bpps)
        for f in flows:
            f.version += 1
            left = max(0.0, f.remaining)
            push(now + max(1, math.ceil(left / f.rate)) if f.rate > 0 else now + 1, FLOWEND, f.instr, f.version)

    def start_flow(i: int, k: int, tr: Transfer, now: int) -> None:
        advance_flows(now)
        ecost = engine_ps_per_byte(tr, engine_bpps, overhead_ps)
        transfers[i] = tr
        flows.append(_Flow(i, k, tr, ecost, now))
        reflow(now)

    def try_engine(k: int, now: int) -> bool:
        if blocked[k] or head[k] >= len(queue[k]):
            return False
        i = queue[k][head[k]]
        if now < free_at[k]:
            wake(k, free_at[k])
            return False
        if not waits_met(i, k):
            return False
        ready = now
        d = deps.get(i)
        if d is not None:
            st = stall_ps[streams[k]]
            for j in d:
                r = start[j] + cost[j] + st
                if r > ready:
                    ready = r
        m = mems[i]
        for other, bit in conflicts[k]:
            if m & bit:
                r = port_busy[other][bit]
                if r > ready:
                    ready = r
        if ready > now:
            wake(k, int(ready))
            return False
        b = cost[i]
        rs = restart_ps.get(kinds[k])
        if rs and now > last_end[k] and instrs[i].op.name != "nop":
            b += rs
        start[i] = now
        fin = now + b
        free_at[k] = last_end[k] = fin
        if m & _SBUF and port_busy[k][_SBUF] < fin:
            port_busy[k][_SBUF] = fin
        if m & _PSUM and port_busy[k][_PSUM] < fin:
            port_busy[k][_PSUM] = fin
        spans.append((k, now, fin, i, 0))
        busy[k] += b
        head[k] += 1
        tr = tmpl_tr[instrs[i].template]
        if tr is not None:
            blocked[k] = True
            push(fin, FLOWSTART, i)
        else:
            push(fin + access_ps[kinds[k]] + sem_ps, DONE, i)
        return True

    def try_queue(k: int, now: int) -> bool:
        progressed = False
        lst = queue[k]
        pend = pending[k]
        while head[k] < len(lst):
            if not pipelined and (pend or active[k]):
                break
            i = lst[head[k]]
            if not waits_met(i, k):
                break
            start[i] = now  # the trigger; the transfer is a slice of its own
            pend.append((i, now + fixed_ps))
            head[k] += 1
            progressed = True
        while not active[k] and pend:
            i, ready = pend[0]
            if ready > now:
                wake(k, ready)
                break
            pend.popleft()
            tr = tmpl_tr[instrs[i].template]
            if tr is None or tr.nbytes == 0:  # a nop on a queue: done when its turn comes
                spans.append((k, now, now, i, 0))
                push(now + sem_ps, DONE, i)
                continue
            active[k] = True
            start_flow(i, k, tr, now)
            progressed = True
        return progressed

    def signal(i: int, now: int) -> None:
        end[i] = now
        for sem in instrs[i].instr.signals:
            c = count[sem] + 1
            count[sem] = c
            h = waiters.get(sem)
            while h and h[0][0] <= c:
                dirty.add(heapq.heappop(h)[1])

    now = 0
    is_dma = [kk == "dma" for kk in kinds]
    while True:
        while dirty:
            k = min(dirty)
            dirty.discard(k)
            if (try_queue if is_dma[k] else try_engine)(k, now):
                dirty.add(k)
        if not heap:
            break
        now = heap[0][0]
        while heap and heap[0][0] == now:
            _, _, kind, payload, version = heapq.heappop(heap)
            if kind == DONE:
                signal(payload, now)
            elif kind == WAKE:
                if wake_at[payload] == now:
                    wake_at[payload] = -1
                dirty.add(payload)
            elif kind == FLOWSTART:
                c = instrs[payload]
                start_flow(payload, sid[payload], tmpl_tr[c.template], now)
            else:  # FLOWEND
                f = next((f for f in flows if f.instr == payload), None)
                if f is None or f.version != version:
                    continue
                advance_flows(now)
                flows.remove(f)
                hbm_bytes += f.tr.hbm_bytes
                dma_bytes += f.tr.nbytes
                spill += f.tr.spill_bytes
                k = f.owner
                spans.append((k, f.start, now, payload, 0 if is_dma[k] else 1))
                busy[k] += now - f.start
                if is_dma[k]:
                    active[k] = False
                else:
                    blocked[k] = False
                    if free_at[k] < now:
                        free_at[k] = now
                push(now + sem_ps, DONE, payload)
                dirty.add(k)
                reflow(now)
    if (end < 0).any():
        raise error("NCC_IINT001", "internal compiler error: the timing replay is stuck "
                    "(the verifier should have found this deadlock)")
    latency = int(end.max()) if n else 0
    span_arr = np.array(spans, dtype=np.int64).reshape(-1, 5)
    return Timeline(latency, start, end, {s: busy[k] for k, s in enumerate(streams)}, hbm_bytes, spill, engine_ps,
                    dma_bytes, list(streams), span_arr, transfers)

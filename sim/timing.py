"""The timing model: an event-driven replay of every stream with semaphores, DMA queues and HBM.

Each compute engine runs its stream in order. An instruction starts when the engine is free, its
semaphore waits are met, the instruction before it on the same engine has written what it reads
(plus the documented dependent-instruction stall), and no conflicting engine holds a shared memory
port; it occupies the engine for its cost (the target spec's formula, in cycles of the engine's
clock) and signals its semaphores after the fixed access latency. DMA queues trigger their
transfers in order; after the fixed trigger latency a transfer flows through the DMA engines,
sharing the 16 engines and the core's HBM bandwidth with every other transfer in flight (max-min
fair rates, recomputed whenever a transfer starts or ends). Everything the model assumes beyond the
published facts is in the target spec's ``assumptions``.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nxsat.diagnostics import error
from nxsat.sim.isa import LInstr, RAccess, Transfer
from nxsat.sim.program import boxes_overlap, stream_kind
from nxsat.sim.verify import Linked

EPS = 1e-9
MAX_EVENTS_PER_INSTR = 64


@dataclass
class Slice:
    """One interval on one track of the trace."""

    stream: str
    start: float
    end: float
    instr: int
    phase: str = ""  # "" or "transfer" (the DMA part of a gather/scatter)


@dataclass
class Timeline:
    """What the replay produced: when each instruction ran, and the totals the report needs."""

    latency: float
    slices: list[Slice]
    start: list[float]
    end: list[float]
    busy: dict[str, float]
    hbm_bytes: float
    spill_bytes: float
    dma_engine_ns: float
    transfers: dict[int, Transfer] = field(default_factory=dict)


@dataclass
class _Flow:
    instr: int
    owner: str
    remaining: float
    cap: float
    engine_cost: float  # DMA-engine ns per byte
    hbm_factor: float  # HBM bytes per byte moved
    start: float
    rate: float = 0.0


class _Stream:
    def __init__(self, name: str, queue: list[int]) -> None:
        self.name = name
        self.kind = stream_kind(name)
        self.queue = queue
        self.head = 0
        self.free_at = 0.0
        self.last_end = -math.inf  # when the previous instruction's busy period ended
        self.recent: list[tuple[float, LInstr]] = []  # (ready-for-dependents time, instr)
        self.pending: list[tuple[int, float]] = []  # DMA: triggered (instr, transfer may start at)
        self.active = False  # DMA: a transfer of this queue is flowing
        self.blocked_flow = False  # engine waiting for its own transfer (gather/scatter)

    def done(self) -> bool:
        return self.head >= len(self.queue) and not self.pending and not self.active and not self.blocked_flow


def _regions_overlap(a: RAccess, b: RAccess) -> bool:
    if a.name == b.name:
        return boxes_overlap(a.box, b.box)
    if not (a.tensor.onchip and b.tensor.onchip) or a.memory != b.memory:
        return False
    pa, na = a.abs_partitions()
    pb, nb = b.abs_partitions()
    la, ha = a.byte_range()
    lb, hb = b.byte_range()
    return pa < pb + nb and pb < pa + na and la < hb and lb < ha


class _Costs:
    """Per-instruction engine time from the target's formulas, memoised on the formula's inputs."""

    def __init__(self, lk: Linked) -> None:
        self.lk = lk
        self.t = lk.target
        self.memo: dict[tuple[Any, ...], float] = {}

    def busy_ns(self, c: LInstr) -> float:
        kind = stream_kind(c.stream)
        key = c.op.cost_key(c)
        f = self.t.cost(key, kind) or (self.t.cost(c.op.name, kind) if key != c.op.name else None)
        if f is None:
            raise error("NCC_ETGT001", f"target {self.t.name} has no cost for {c.op.name} on {kind}",
                        hint=f"add costs.{c.op.name} or costs.{c.op.name}@{kind} to the target spec")
        v = c.op.cost_vars(c, self.t)
        key = (f.text, kind, tuple(sorted(v.items())))
        ns = self.memo.get(key)
        if ns is None:
            cycles = f({**self.t.constants, **v})
            if not math.isfinite(cycles) or cycles < 0:
                raise error("NCC_ETGT001", f"cost of {c.op.name} on {kind} is {cycles} cycles")
            ns = self.t.engines[kind].ns(cycles)
            self.memo[key] = ns
        return ns


def simulate(lk: Linked) -> Timeline:
    """Replay the program in time; deterministic (ties are broken by stream order)."""
    t = lk.target
    n = len(lk.instrs)
    costs = _Costs(lk)
    streams = [_Stream(s, lk.by_stream[s]) for s in lk.streams]
    by_name = {s.name: s for s in streams}
    dma = t.dma
    lat_cycles = t.spec["latency"]["access_cycles"]
    stall_cycles = t.spec["latency"]["dependent_stall_cycles"]
    stall_engines = frozenset(t.spec["latency"]["dependent_stall_engines"])
    sem_ns = float(t.spec["latency"]["semaphore_ns"])
    first_mm = t.matmul["first_latency_cycles"]
    pipelined = bool(dma.get("queue_pipelined", True))
    conflicts = [(tuple(r["engines"]), r["memory"]) for r in t.spec.get("port_conflicts", [])]
    port_busy: dict[tuple[str, str], float] = defaultdict(float)

    count: dict[str, int] = defaultdict(int)
    waiting: dict[str, set[int]] = defaultdict(set)
    start = [math.nan] * n
    end = [math.nan] * n
    slices: list[Slice] = []
    busy: dict[str, float] = defaultdict(float)
    transfers: dict[int, Transfer] = {}
    flows: list[_Flow] = []
    heap: list[tuple[float, int, str, int]] = []
    seq = 0
    hbm_bytes = 0.0
    spill = 0.0
    engine_ns = 0.0
    stream_index = {s.name: k for k, s in enumerate(streams)}
    dirty: set[int] = set(range(len(streams)))

    def push(time: float, kind: str, payload: int) -> None:
        nonlocal seq
        heapq.heappush(heap, (time, seq, kind, payload))
        seq += 1

    def waits_met(c: LInstr, k: int) -> bool:
        for w in c.instr.waits:
            if count[w.sem] < w.value:
                waiting[w.sem].add(k)
                return False
        return True

    def mems(c: LInstr) -> set[str]:
        return {ra.memory for ra in (*c.reads, *c.writes) if ra.tensor.onchip}

    def make_flow(i: int, owner: str, now: float, tr: Transfer) -> _Flow:
        per_engine = dma["engine_gbps"]
        desc = max(1.0, tr.descriptor_bytes)
        eff = desc / (desc / per_engine + dma["descriptor_overhead_ns"])  # bytes per ns per engine
        return _Flow(i, owner, float(tr.nbytes), tr.engines * eff, 1.0 / eff,
                     tr.hbm_bytes / tr.nbytes if tr.nbytes else 0.0, now)

    def try_start(k: int, now: float) -> bool:
        st = streams[k]
        if st.kind == "dma":
            return try_dma(k, now)
        if st.head >= len(st.queue) or st.blocked_flow:
            return False
        i = st.queue[st.head]
        c = lk.instrs[i]
        if now + EPS < st.free_at:
            push(st.free_at, "wake", k)
            return False
        if not waits_met(c, k):
            return False
        eng = t.engines[st.kind]
        ready = now
        for r_time, prev in st.recent:
            if r_time > ready and any(_regions_overlap(w, r) for w in prev.writes for r in c.op.data_reads(c)):
                ready = r_time
        used = mems(c)
        for engs, mem in conflicts:
            if st.kind in engs and mem in used:
                for other in engs:
                    if other != st.kind:
                        ready = max(ready, port_busy[(other, mem)])
        if ready > now + EPS:
            push(ready, "wake", k)
            return False
        b = costs.busy_ns(c)
        if st.kind == "pe" and c.op.name == "matmul" and now > st.last_end + EPS:
            b += eng.ns(first_mm)  # the array was idle: first-matmul latency
        start[i] = now
        st.free_at = now + b
        st.last_end = now + b
        for mem in used:
            port_busy[(st.kind, mem)] = max(port_busy[(st.kind, mem)], now + b)
        if st.kind in stall_engines:
            st.recent = [(rt, p) for rt, p in st.recent if rt > now][-3:] + [(now + b + eng.ns(stall_cycles), c)]
        slices.append(Slice(st.name, now, now + b, i))
        busy[st.name] += b
        st.head += 1
        tr = c.op.transfer(c, t)
        if tr is not None:
            st.blocked_flow = True
            transfers[i] = tr
            push(now + b, "flow", i)
        else:
            push(now + b + (eng.ns(lat_cycles) if st.kind != "cc" else 0.0) + sem_ns, "done", i)
        return True

    def try_dma(k: int, now: float) -> bool:
        st = streams[k]
        progressed = False
        while st.head < len(st.queue):
            if not pipelined and (st.pending or st.active):
                break
            i = st.queue[st.head]
            c = lk.instrs[i]
            if not waits_met(c, k):
                break
            start[i] = now  # trigger time; the transfer start is recorded separately
            st.pending.append((i, now + dma["fixed_latency_ns"]))
            st.head += 1
            progressed = True
        if not st.active and st.pending:
            i, ready = st.pending[0]
            if ready > now + EPS:
                push(ready, "wake", k)
            else:
                st.pending.pop(0)
                c = lk.instrs[i]
                tr = c.op.transfer(c, t)
                if tr is None or tr.nbytes == 0:  # a nop on a queue
                    push(now + sem_ns, "done", i)
                    slices.append(Slice(st.name, now, now, i))
                    st.active = True
                    push(now, "qfree", k)
                else:
                    transfers[i] = tr
                    flows.append(make_flow(i, st.name, now, tr))
                    st.active = True
                progressed = True
        return progressed

    def rates() -> None:
        """Max-min fair shares of DMA-engine time: every transfer in flight gets an equal share of
        engine time (engines serve queues round-robin), up to its own engine count, the 16 engines
        and the core's HBM bandwidth; byte rate = engine time / engine cost per byte."""
        if not flows:
            return
        ecost = np.array([f.engine_cost for f in flows])
        caps = np.array([f.cap * f.engine_cost for f in flows])  # = engines the transfer can use
        hfac = np.array([f.hbm_factor for f in flows]) / ecost  # HBM bytes per engine-ns
        use = np.zeros(len(flows))  # engine-ns per ns
        free = np.ones(len(flows), dtype=bool)
        res = [(np.ones(len(flows)), float(dma["engines"])), (hfac, t.hbm_bw)]
        for _ in range(2 * len(flows) + 4):
            if not free.any():
                break
            limits = [float(np.min(caps[free] - use[free]))]
            for w, cap in res:
                denom = float(w[free].sum())
                if denom > EPS:
                    limits.append((cap - float(w @ use)) / denom)
            use[free] += max(0.0, min(limits))
            free &= use < caps * (1 - 1e-9)
            for w, cap in res:
                if float(w @ use) >= cap * (1 - 1e-9):
                    free &= w <= 0
        for f, u, e in zip(flows, use, ecost):
            f.rate = float(u / e)

    def signal(i: int, now: float) -> None:
        c = lk.instrs[i]
        end[i] = now
        for sem in c.instr.signals:
            count[sem] += 1
            dirty.update(waiting.pop(sem, ()))

    now = 0.0
    steps = 0
    limit = MAX_EVENTS_PER_INSTR * (n + 1)
    while True:
        steps += 1
        if steps > limit:
            raise error("NCC_IINT001", "internal compiler error: the timing replay did not converge")
        started_flow = len(flows)
        while dirty:
            k = min(dirty)
            dirty.discard(k)
            if try_start(k, now):
                dirty.add(k)
        if len(flows) != started_flow or any(f.rate == 0 for f in flows):
            rates()
        if all(s.done() for s in streams) and not heap:
            break
        t_next = heap[0][0] if heap else math.inf
        for f in flows:
            if f.rate > 0:
                t_next = min(t_next, now + f.remaining / f.rate)
        if not math.isfinite(t_next):
            raise error("NCC_IINT001", "internal compiler error: the timing replay is stuck "
                        "(the verifier should have found this deadlock)")
        dt = max(0.0, t_next - now)
        if flows:
            use = sum(f.rate * f.engine_cost for f in flows)
            engine_ns += use * dt
            for f in flows:
                f.remaining -= f.rate * dt
        now = max(now, t_next)
        finished = [f for f in flows if f.remaining <= max(1e-6, 1e-12 * f.cap)]
        if finished:
            for f in finished:
                flows.remove(f)
                f.remaining = 0.0
                i = f.instr
                tr = transfers[i]
                hbm_bytes += tr.hbm_bytes
                spill += tr.spill_bytes
                st = by_name[f.owner]
                if st.kind == "dma":
                    slices.append(Slice(st.name, f.start, now, i))
                    busy[st.name] += now - f.start
                    st.active = False
                    push(now + sem_ns, "done", i)
                else:
                    slices.append(Slice(st.name, f.start, now, i, "transfer"))
                    busy[st.name] += now - f.start
                    st.blocked_flow = False
                    st.free_at = max(st.free_at, now)
                    push(now + sem_ns, "done", i)
                dirty.add(stream_index[st.name])
            rates()
        while heap and heap[0][0] <= now + EPS:
            _, _, kind, payload = heapq.heappop(heap)
            if kind == "done":
                signal(payload, now)
            elif kind == "wake":
                dirty.add(payload)
            elif kind == "qfree":
                streams[payload].active = False
                dirty.add(payload)
            elif kind == "flow":
                c = lk.instrs[payload]
                flows.append(make_flow(payload, c.stream, now, transfers[payload]))
    latency = max((e for e in end if not math.isnan(e)), default=0.0)
    return Timeline(latency, slices, start, end, dict(busy), hbm_bytes, spill, engine_ns, transfers)

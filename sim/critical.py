"""The critical path of a replayed program: what its latency is made of.

Walked back from the instruction that finishes last, each instruction to the one that released it last:
the instruction before it on its own stream (an engine runs its stream in order, a DMA queue its
transfers) or the one whose signal met one of its semaphore waits (a semaphore counts its signals, so
the n-th signal meets a wait for n). Each step on the path is its execution (an engine instruction, a
DMA transfer) and the wait before it (from its release to its start: a DMA's trigger latency, the
semaphore and access latencies, a dependent-instruction stall or a memory-port conflict), so the path
adds up to the latency. Busy time and utilization say what an engine did; the path says which of it a
faster program has to shorten: ResNet-50's weights' transfers, or a chain of small dependent steps.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from nxsat.sim.program import stream_kind
from nxsat.sim.timing import PS, Timeline
from nxsat.sim.verify import Linked

WAITING = "waiting"  # the path's time between a release and the next step's start


@dataclass(frozen=True)
class Step:
    """One instruction on the critical path: when it ran (ns) and how long it waited before."""

    instr: int
    stream: str
    origin: str  # the operator that produced it ("" for a hand-written instruction)
    start: float
    end: float
    wait: float


def critical_path(lk: Linked, tl: Timeline) -> list[Step]:
    """The critical path, first step first."""
    n = len(lk.instrs)
    if n == 0:
        return []
    run_start = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    run_end = np.full(n, -1, dtype=np.int64)
    spans = np.asarray(tl.spans, dtype=np.int64).reshape(-1, 5)
    np.minimum.at(run_start, spans[:, 3], spans[:, 1])
    np.maximum.at(run_end, spans[:, 3], spans[:, 2])
    done = tl.end_ps
    # who gave each semaphore its n-th signal (in the order the replay signalled them)
    signalled: dict[str, list[int]] = defaultdict(list)
    for i in sorted(range(n), key=lambda k: (int(done[k]), k)):
        for sem in lk.instrs[i].instr.signals:
            signalled[sem].append(i)
    before = {}  # instruction -> the one before it on its stream
    for lst in lk.by_stream.values():
        for a, b in zip(lst, lst[1:]):
            before[b] = a

    steps: list[Step] = []
    cur = int(np.argmax(done))
    seen = set()
    while cur >= 0 and cur not in seen:
        seen.add(cur)
        c = lk.instrs[cur]
        start = int(run_start[cur]) if run_end[cur] >= 0 else int(tl.start_ps[cur])
        # the releases: the instruction before it on its stream (when it stopped running), and each wait's
        # signaller (when it signalled); the latest is the one it waited for
        best, at = -1, -1
        p = before.get(cur)
        if p is not None and run_end[p] >= 0:
            best, at = p, int(run_end[p])
        for w in c.instr.waits:
            sig = signalled.get(w.sem, ())
            if 0 < w.value <= len(sig):
                j = sig[w.value - 1]
                if int(done[j]) > at:
                    best, at = j, int(done[j])
        end = int(run_end[cur]) if run_end[cur] >= 0 else start
        ran = int(run_end[best]) if best >= 0 and run_end[best] >= 0 else 0  # the wait counts from there
        steps.append(Step(cur, lk.streams[lk.sid[cur]], (c.instr.origin or "").split(" ")[0], start / PS, end / PS,
                          max(0, start - ran) / PS))
        cur = best
    steps.reverse()
    return steps


def path_summary(lk: Linked, tl: Timeline, top: int = 8, steps: list[Step] | None = None) -> dict[str, Any]:
    """The path's time by engine (DMA queues as one) and waiting, and its ``top`` operators by engine
    (``steps``: the path, when the caller has it already)."""
    steps = critical_path(lk, tl) if steps is None else steps
    by_kind: dict[str, float] = defaultdict(float)
    by_op: dict[tuple[str, str], float] = defaultdict(float)
    for s in steps:
        kind = stream_kind(s.stream) if stream_kind(s.stream) == "dma" else s.stream
        by_kind[kind] += s.end - s.start
        by_kind[WAITING] += s.wait
        by_op[(kind, s.origin)] += s.end - s.start
    if steps:  # after the last step: its signal's latency
        by_kind[WAITING] += max(0.0, tl.latency - steps[-1].end)
    ops = sorted(by_op.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return {"steps": len(steps),
            "by_engine_ns": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0]))},
            "operators": [{"engine": k, "operator": o, "ns": round(v, 3)} for (k, o), v in ops]}


def shares(s: dict[str, Any], names: dict[str, str] | None = None, digits: int = 0, least: float = 0.005,
           sep: str = ", ") -> str:
    """A path summary's time by engine (and waiting) as shares of the whole, the latency, largest first;
    those under ``least`` of it left out. ``names``: what to call each engine."""
    total = sum(s["by_engine_ns"].values())
    rows = sorted(s["by_engine_ns"].items(), key=lambda kv: (-kv[1], kv[0]))
    return sep.join(f"{(names or {}).get(k, k)} {v / total:.{digits}%}" for k, v in rows
                    if v > 0 and v >= least * total)


def format_path(s: dict[str, Any], latency_ns: float, names: dict[str, str]) -> str:
    """The path's summary as text lines for ``nxsat profile``."""
    if not latency_ns:
        return "critical path  (empty program)"
    lines = [f"critical path  {s['steps']} steps: {shares(s, names, digits=1, least=0.0)}"]
    for o in s["operators"]:
        lines.append(f"  {o['ns'] / 1000:>9.3f} us  {names.get(o['engine'], o['engine']):<8} {o['operator'] or '-'}")
    return "\n".join(lines)

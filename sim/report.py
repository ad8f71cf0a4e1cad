"""What ``nxsat profile`` shows: latency, utilization, MFU, bandwidth, memory peaks, the roofline,
and the Chrome/Perfetto trace (one track per engine and per DMA queue)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from nxsat.sim.asm import format_instr
from nxsat.sim.program import ENGINE_STREAMS, stream_kind, stream_order
from nxsat.sim.timing import PS, Timeline, engine_ps_per_byte
from nxsat.sim.verify import Linked, flops_total


def roofline(lk: Linked, hbm_bytes: float, dma_bytes: float | None = None) -> dict[str, Any]:
    """The fastest any schedule could be on this target: all TensorE work at peak, or all memory traffic
    at full speed (HBM bytes over the core's HBM share, and the bytes the DMA engines move over what they
    sustain together: 272 GB/s on trn1, below its 410 GB/s HBM share), whichever takes longer (per rank)."""
    t = lk.target
    compute = 0.0
    for prec, f in flops_total(lk).items():
        peak = t.peak_flops(prec)
        compute += f / peak if peak else 0.0
    moved = hbm_bytes if dma_bytes is None else dma_bytes
    memory = max(hbm_bytes / t.hbm_bw, moved / t.dma_ceiling_gbps)
    return {"compute_ns": compute, "memory_ns": memory, "bound_ns": max(compute, memory),
            "bound": "compute" if compute >= memory else "memory"}


def _live_peak(lk: Linked, tl: Timeline, memory: str) -> int:
    """Peak bytes of ``memory`` held by live tensors (first write to last access), counting memory
    shared by aliasing tensors once."""
    tids = lk.template_ids
    ntmpl = lk.templates
    smin = np.full(ntmpl, np.iinfo(np.int64).max, dtype=np.int64)
    emax = np.full(ntmpl, -1, dtype=np.int64)
    np.minimum.at(smin, tids, tl.start_ps)
    np.maximum.at(emax, tids, tl.end_ps)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    seen: set[int] = set()
    for c in lk.instrs:
        if c.template in seen:
            continue
        seen.add(c.template)
        s, e = int(smin[c.template]), int(emax[c.template])
        for ra in c.writes:
            if ra.memory == memory and first.get(ra.name, s) >= s:
                first[ra.name] = s
        for ra in (*c.reads, *c.writes):
            if ra.memory == memory and last.get(ra.name, e) <= e:
                last[ra.name] = e
    ts = [lk.program.tensors[n] for n in first]
    if not ts:
        return 0
    boxes = {t.name: (t.partition, t.partition + t.shape[0], t.offset or 0, (t.offset or 0) + t.row_bytes) for t in ts}
    pb = sorted({v for b in boxes.values() for v in (b[0], b[1])})
    bb = sorted({v for b in boxes.values() for v in (b[2], b[3])})
    area = np.outer(np.diff(pb), np.diff(bb)).astype(np.int64)
    cnt = np.zeros(area.shape, dtype=np.int64)
    pi = {v: k for k, v in enumerate(pb)}
    bi = {v: k for k, v in enumerate(bb)}
    events = []
    for t in ts:
        events.append((last[t.name], 0, t.name))
        events.append((first[t.name], 1, t.name))
    used = peak = 0
    for _, kind, name in sorted(events):
        p0, p1, b0, b1 = boxes[name]
        sl = (slice(pi[p0], pi[p1]), slice(bi[b0], bi[b1]))
        region = cnt[sl]
        if kind == 1:
            used += int(area[sl][region == 0].sum())
            region += 1
            peak = max(peak, used)
        else:
            region -= 1
            used -= int(area[sl][region == 0].sum())
    return peak


def _union(spans: np.ndarray) -> np.ndarray:
    """[start, end) intervals merged where they touch or overlap, sorted: shape (n, 2)."""
    if not len(spans):
        return np.zeros((0, 2), dtype=np.int64)
    iv = spans[np.argsort(spans[:, 0], kind="stable")]
    reach = np.maximum.accumulate(iv[:, 1])
    new = np.ones(len(iv), dtype=bool)
    new[1:] = iv[1:, 0] > reach[:-1]
    starts = iv[new, 0]
    ends = reach[np.r_[np.flatnonzero(new)[1:] - 1, len(iv) - 1]]
    return np.stack([starts, ends], axis=1)


def _intersection_ps(a: np.ndarray, b: np.ndarray) -> int:
    """Total length of the intersection of two merged, sorted interval sets."""
    if not len(a) or not len(b):
        return 0
    cuts = np.unique(np.concatenate([a.ravel(), b.ravel()]))
    left = cuts[:-1]

    def inside(iv: np.ndarray) -> np.ndarray:
        k = np.searchsorted(iv[:, 0], left, side="right") - 1
        return (k >= 0) & (left < iv[np.maximum(k, 0), 1])

    return int(np.diff(cuts)[inside(a) & inside(b)].sum())


def overlap(tl: Timeline) -> dict[str, float]:
    """How far data movement hides behind TensorE: the time TensorE is busy, the time some DMA transfer
    is under way, and the time both are (what a prefetching schedule shows in the trace), in ns and as
    fractions of TensorE's busy time and of the run."""
    sp = np.asarray(tl.spans, dtype=np.int64).reshape(-1, 5)
    kind = np.array([stream_kind(s) for s in tl.streams] + [""])[sp[:, 0]]
    pe = _union(sp[kind == "pe"][:, 1:3])
    dma = _union(sp[(kind == "dma") | (sp[:, 4] == 1)][:, 1:3])
    pe_ps = int((pe[:, 1] - pe[:, 0]).sum())
    dma_ps = int((dma[:, 1] - dma[:, 0]).sum())
    both = _intersection_ps(pe, dma)
    lat = tl.latency_ps
    return {"pe_busy_ns": pe_ps / PS, "dma_busy_ns": dma_ps / PS, "both_ns": both / PS,
            "pe_with_dma": round(both / pe_ps, 6) if pe_ps else 0.0,
            "dma_of_run": round(dma_ps / lat, 6) if lat else 0.0,
            "both_of_run": round(both / lat, 6) if lat else 0.0}


def descriptor_runs(tl: Timeline, dma: dict[str, Any]) -> list[dict[str, Any]]:
    """The program's transfers by descriptor size (powers of two, the bytes of each run): the bytes moved in
    them, their DMA work (their engines' time over all the engines) and the engines' efficiency on them (their
    bytes at full rate over that time): why the DMA work exceeds the bytes' own time."""
    bpps = float(dma["engine_gbps"]) / PS
    overhead = float(dma["descriptor_overhead_ns"]) * PS
    runs: dict[int, list[float]] = {}
    for tr in tl.transfers.values():
        size = 1 << max(0, int(tr.descriptor_bytes).bit_length() - 1)
        r = runs.setdefault(size, [0.0, 0.0])
        r[0] += tr.nbytes
        r[1] += tr.nbytes * engine_ps_per_byte(tr, bpps, overhead)
    return [{"descriptor_bytes": size, "bytes": int(b), "work_ns": round(ps / PS / float(dma["engines"]), 3),
             "efficiency": round(b / bpps / ps, 6) if ps else 1.0} for size, (b, ps) in sorted(runs.items())]


def summarize(lk: Linked, tl: Timeline) -> dict[str, Any]:
    """The profile as a JSON-ready dict (numbers per rank; SPMD ranks run the same timeline)."""
    t = lk.target
    lat = tl.latency
    prog = lk.program
    flops = flops_total(lk)
    total_flops = sum(flops.values())
    counts = {s: len(v) for s, v in lk.by_stream.items()}
    engines: dict[str, Any] = {}
    for s in sorted(set(ENGINE_STREAMS) | set(counts), key=stream_order):
        b = tl.busy.get(s, 0.0)
        name = t.engines[s].name if s in t.engines else f"DMA queue {s}"
        engines[s] = {"name": name, "instructions": counts.get(s, 0), "busy_ns": round(b, 3),
                      "utilization": round(b / lat, 6) if lat else 0.0}
    peak = t.peak_flops("bf16")
    roof = roofline(lk, tl.hbm_bytes, tl.dma_bytes)
    sbuf_peak = _live_peak(lk, tl, "sbuf")
    psum_peak = _live_peak(lk, tl, "psum")
    return {
        "target": t.name, "core": t.core, "lnc": t.lnc, "ranks": prog.ranks,
        "instructions": len(lk.instrs),
        "latency_ns": round(lat, 3),
        "roofline": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in roof.items()},
        "engines": engines,
        "flops": {k: flops[k] for k in sorted(flops)},
        "tflops": round(total_flops / lat / 1000, 6) if lat else 0.0,
        "mfu": round(roof["compute_ns"] / lat, 6) if lat else 0.0,
        "peak_bf16_tflops": round(peak / 1000, 6),
        "hbm": {"bytes": int(tl.hbm_bytes), "gbps": round(tl.hbm_bytes / lat, 6) if lat else 0.0,
                "peak_gbps": round(t.memory_bw, 6), "hbm_share_gbps": round(t.hbm_bw, 6),
                "utilization": round(tl.hbm_bytes / lat / t.memory_bw, 6) if lat else 0.0},
        # the DMA engines' time for the program's transfers at their descriptors' rates, spread over all of
        # them: no schedule of these transfers ends sooner (descriptors of a few hundred bytes, where the
        # model's layout makes them so, cost time the roofline's bandwidth does not count)
        "dma": {"engine_utilization": round(tl.dma_engine_ns / (lat * t.dma["engines"]), 6) if lat else 0.0,
                "work_ns": round(tl.dma_engine_ns / t.dma["engines"], 3), "runs": descriptor_runs(tl, t.dma)},
        "sbuf": {"peak_bytes": sbuf_peak, "capacity": t.partitions * t.sbuf_bytes,
                 "utilization": round(sbuf_peak / (t.partitions * t.sbuf_bytes), 6)},
        "psum": {"peak_bytes": psum_peak, "capacity": t.partitions * t.psum_bytes,
                 "utilization": round(psum_peak / (t.partitions * t.psum_bytes), 6)},
        "spill_bytes": int(tl.spill_bytes),
        "overlap": {k: (round(v, 3) if k.endswith("_ns") else v) for k, v in overlap(tl).items()},
    }


def format_summary(s: dict[str, Any]) -> str:
    """The profile as text for a terminal."""
    lat = s["latency_ns"]
    roof = s["roofline"]
    lines = [
        f"target {s['target']} ({s['core']}, lnc={s['lnc']}), {s['ranks']} rank(s), {s['instructions']} instructions",
        f"latency        {lat / 1000:.3f} us",
        f"roofline       {roof['bound_ns'] / 1000:.3f} us ({roof['bound']}-bound: compute "
        f"{roof['compute_ns'] / 1000:.3f} us, HBM {roof['memory_ns'] / 1000:.3f} us)"
        + (f"; roofline efficiency {roof['bound_ns'] / lat:.1%}" if lat else ""),
        f"compute        {s['tflops']:.3f} TFLOPS, MFU {s['mfu']:.1%} (bf16 peak {s['peak_bf16_tflops']:.2f} TFLOPS)",
        f"HBM            {s['hbm']['bytes']} bytes, {s['hbm']['gbps']:.1f} GB/s "
        f"({s['hbm']['utilization']:.1%} of {s['hbm']['peak_gbps']:.1f})",
        f"DMA engines    {s['dma']['engine_utilization']:.1%} busy; their work {s['dma']['work_ns'] / 1000:.3f} us "
        "(no schedule of these transfers ends sooner)",
        "DMA runs       " + _runs_line(s["dma"]["runs"]),
        f"SBUF peak      {s['sbuf']['peak_bytes']} bytes ({s['sbuf']['utilization']:.1%})",
        f"PSUM peak      {s['psum']['peak_bytes']} bytes ({s['psum']['utilization']:.1%})",
        f"spill          {s['spill_bytes']} bytes",
        f"overlap        DMA under way for {s['overlap']['dma_of_run']:.1%} of the run and "
        f"{s['overlap']['pe_with_dma']:.1%} of TensorE's busy time (both busy {s['overlap']['both_of_run']:.1%})",
        "engine         instrs      busy us   util",
    ]
    for k, e in s["engines"].items():
        lines.append(f"  {k:<6} {e['name'][:13]:<13} {e['instructions']:>6} {e['busy_ns'] / 1000:>11.3f} "
                     f"{e['utilization']:>6.1%}")
    return "\n".join(lines)


def _runs_line(runs: list[dict[str, Any]], most: int = 4) -> str:
    """The descriptor sizes that take most of the DMA work, each with its bytes and the engines' efficiency."""
    top = sorted(runs, key=lambda r: -r["work_ns"])[:most]
    return ", ".join(f"{_size(r['descriptor_bytes'])} runs {_size(r['bytes'])} at {r['efficiency']:.0%}"
                     for r in sorted(top, key=lambda r: r["descriptor_bytes"])) or "none"


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n // 1024} KB" if n >= 1024 else f"{n} B"


def chrome_trace(lk: Linked, tl: Timeline, critical: frozenset[int] = frozenset()) -> str:
    """A Chrome trace-event JSON (Perfetto opens it): one track (thread) per engine and DMA queue; the
    instructions on the critical path (``critical``) carry ``"critical": true``, which Perfetto finds."""
    t = lk.target
    prog = lk.program
    tracks = sorted(set(ENGINE_STREAMS) | set(lk.streams), key=stream_order)
    tid = {s: k + 1 for k, s in enumerate(tracks)}
    ev: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                                 "args": {"name": f"{t.name} NeuronCore ({t.core}), rank 0"}}]
    for s in tracks:
        label = f"{t.engines[s].name} ({s})" if s in t.engines else f"DMA queue {s}"
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[s], "args": {"name": label}})
        ev.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid[s],
                   "args": {"sort_index": tid[s]}})
    order = sorted(range(len(tl.spans)), key=lambda r: (int(tl.spans[r, 1]), tid[tl.streams[int(tl.spans[r, 0])]],
                                                        int(tl.spans[r, 3])))
    labels: dict[int, str] = {}
    for r in order:
        k, a, b, i, phase = (int(x) for x in tl.spans[r])
        stream = tl.streams[k]
        c = lk.instrs[i]
        label = labels.get(i)
        if label is None:
            label = labels[i] = format_instr(c.instr, prog)
        args: dict[str, Any] = {"line": c.line, "instruction": label}
        if i in critical:
            args["critical"] = True
        if c.instr.origin:
            args["origin"] = c.instr.origin
        tr = tl.transfers.get(i)
        if tr is not None and (stream_kind(stream) == "dma" or phase):
            args.update({"bytes": tr.nbytes, "descriptor_bytes": tr.descriptor_bytes, "dma_engines": tr.engines})
            if stream_kind(stream) == "dma":
                args["triggered_us"] = round(int(tl.start_ps[i]) / 1e6, 6)
        f = c.op.flops(c)
        if f:
            args["flops"] = f[1]
            args["precision"] = f[0]
        ev.append({"name": c.op.name + (" (transfer)" if phase else ""), "cat": stream, "ph": "X",
                   "pid": 1, "tid": tid[stream], "ts": round(a / 1e6, 6), "dur": round((b - a) / 1e6, 6),
                   "args": args})
    doc = {"traceEvents": ev, "displayTimeUnit": "ns",
           "otherData": {"target": t.name, "latency_us": round(tl.latency / 1000, 6), "source": prog.source}}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)  # strict JSON: trace viewers reject NaN

"""The compiled BERT-base's trace shows data movement overlapping compute (issue: backend performance):
checked on the Chrome/Perfetto trace itself, not a screenshot. BERT-base at batch 1 streams its
weights once and is memory-bound, so the check is that DMA transfers are under way for most of the
run and during most of TensorE's busy time."""

from __future__ import annotations

import json

import numpy as np
import pytest
from harness import DATA

from nxsat.driver import CompileOptions, compile_model
from nxsat.sim.program import stream_kind
from nxsat.sim.report import _intersection_ps, _union


def _busy(events: list[dict], kind: str) -> np.ndarray:
    """The merged busy intervals (trace microseconds as integer picoseconds) of the tracks of a kind
    (an event's category is its engine or queue; an engine-triggered transfer counts as DMA)."""
    iv = [(round(e["ts"] * 1e6), round((e["ts"] + e["dur"]) * 1e6)) for e in events if e["ph"] == "X"
          and (stream_kind(e["cat"]) == kind or (kind == "dma" and e["name"].endswith("(transfer)")))]
    return _union(np.array(iv, dtype=np.int64).reshape(-1, 2))


@pytest.mark.slow
def test_bert_base_trace_shows_dma_under_tensor_engine_work() -> None:
    result = compile_model(str(DATA / "bert" / "bert_base_l12.hlo"), CompileOptions(auto_cast="matmult"),
                           keep_model=True)
    summary, tl = result.model.profile()
    doc = json.loads(result.model.trace(tl))
    pe, dma = _busy(doc["traceEvents"], "pe"), _busy(doc["traceEvents"], "dma")
    both = _intersection_ps(pe, dma)
    pe_busy = int((pe[:, 1] - pe[:, 0]).sum())
    dma_busy = int((dma[:, 1] - dma[:, 0]).sum())
    latency = doc["otherData"]["latency_us"] * 1e6
    assert both / pe_busy > 0.5, "TensorE mostly works with no DMA under way"
    assert dma_busy / latency > 0.5, "the DMA queues idle for most of the run"
    # the report's figures are the trace's (to the trace's rounding of times to the picosecond)
    o = summary["overlap"]
    assert o == result.report["overlap"]
    assert abs(o["pe_with_dma"] - both / pe_busy) < 1e-3 and abs(o["dma_of_run"] - dma_busy / latency) < 1e-3

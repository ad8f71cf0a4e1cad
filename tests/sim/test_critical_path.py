"""The critical path (sim/critical.py): the chain of instructions the latency is made of."""

from __future__ import annotations

import json

import pytest
from nxsim_progs import EXAMPLES, build

from nxsat.cli import main
from nxsat.io import atomic_write
from nxsat.sim.critical import WAITING, critical_path, path_summary, shares

# Two independent chains: a long one (a 2 MiB load, a pass over it on ScalarE, its store) and a short one
# (a 64 KiB load, a copy on VectorE, its store). The latency is the long chain's.
TWO_CHAINS = """.isa 1.0
.target trn1
input   big: f32[128, 4096]
input   small: f32[128, 128]
output  y: f32[128, 4096]
output  z: f32[128, 128]
sbuf    b: f32[128, 4096]
sbuf    b2: f32[128, 4096]
sbuf    s: f32[128, 128]
sbuf    s2: f32[128, 128]
sem     lb
sem     ls
sem     eb
sem     es
q0    dma            b, big, signal=lb
q1    dma            s, small, signal=ls
act   activation     b2, b, func=exp, wait=lb>=1, signal=eb
dve   tensor_copy    s2, s, wait=ls>=1, signal=es
q2    dma            y, b2, wait=eb>=1
q3    dma            z, s2, wait=es>=1
"""


def _path(text: str) -> tuple[list, object, object]:
    m = build(text)
    tl = m.timeline()
    return critical_path(m.linked, tl), m, tl


def test_the_path_is_the_longer_chain_and_adds_up_to_the_latency() -> None:
    steps, m, tl = _path(TWO_CHAINS)
    assert [(s.stream, m.linked.instrs[s.instr].instr.opcode) for s in steps] == \
        [("q0", "dma"), ("act", "activation"), ("q2", "dma")]
    assert all(a.end <= b.start - b.wait + 1e-9 for a, b in zip(steps, steps[1:]))
    s = path_summary(m.linked, tl)
    assert sum(s["by_engine_ns"].values()) == pytest.approx(tl.latency, abs=1e-6)
    assert s["by_engine_ns"]["dma"] > s["by_engine_ns"]["act"] > 0 and s["by_engine_ns"][WAITING] > 0
    assert set(s["by_engine_ns"]) == {"dma", "act", WAITING}  # VectorE's copy is off the path


def test_a_wait_is_released_by_the_signal_that_met_it() -> None:
    """``wait=l>=2`` is met by the second signal of ``l``: the larger load, on its own queue, signals last
    (whichever queue it is on), and the path runs through it, not through the first."""
    for big_queue in ("q0", "q1"):
        other = "q1" if big_queue == "q0" else "q0"
        text = TWO_CHAINS.replace("q0    dma            b, big, signal=lb",
                                  f"{big_queue}    dma            b, big, signal=lb") \
            .replace("q1    dma            s, small, signal=ls", f"{other}    dma            s, small, signal=lb") \
            .replace("wait=lb>=1", "wait=lb>=2").replace("wait=ls>=1", "wait=lb>=2")
        steps, m, _ = _path(text)
        assert steps[0].stream == big_queue
        assert m.linked.instrs[steps[0].instr].ops[0].name == "b"


def test_a_summary_adds_up_and_lists_its_longest_operators_first() -> None:
    m = build((EXAMPLES / "matmul.nxs").read_text())
    tl = m.timeline()
    s = path_summary(m.linked, tl, top=3)
    assert sum(s["by_engine_ns"].values()) == pytest.approx(tl.latency, abs=1e-6)
    ns = [o["ns"] for o in s["operators"]]
    assert 0 < len(ns) <= 3 and ns == sorted(ns, reverse=True)
    assert shares(s, least=0.0).split(", ")[0].startswith(max(s["by_engine_ns"], key=s["by_engine_ns"].get))


def test_profile_prints_and_reports_it(tmp_path, capsys) -> None:
    neff = tmp_path / "two.neff"
    from nxsat import sim

    atomic_write(str(neff), sim.assemble(TWO_CHAINS, "two.nxs"))
    assert main(["profile", str(neff), "--critical-path", "2"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("critical path"))
    assert "3 steps" in line and "DMA" in line and "ScalarE" in line
    assert len([x for x in out.splitlines() if x.startswith("  ") and " us  " in x]) == 2
    assert main(["profile", str(neff), "--json", "--trace", str(tmp_path / "t.json")]) == 0
    rep = json.loads(capsys.readouterr().out)
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    marked = [e for e in events if e.get("args", {}).get("critical")]
    assert sorted(e["cat"] for e in marked) == ["act", "q0", "q2"]  # the long chain's load, pass and store
    assert rep["critical_path"]["steps"] == 3
    assert sum(rep["critical_path"]["by_engine_ns"].values()) == pytest.approx(rep["latency_ns"], abs=1e-3)
    with pytest.raises(SystemExit):
        main(["profile", str(neff), "--critical-path", "-1"])
    assert "at least 0" in capsys.readouterr().err

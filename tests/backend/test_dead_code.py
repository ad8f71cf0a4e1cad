"""Dead instructions (backend/graph.py ``Graph.drop_dead``): what lowering computed for a reader that did not
read it in the end goes, with the scratch tensors left unwritten; what an output needs stays, and the
dependences of what stays still order it."""

from __future__ import annotations

from nxsat import dtypes as dt
from nxsat import sim
from nxsat.backend.graph import Graph
from nxsat.backend.schedule import schedule

TARGET = sim.load_target("trn1")


def _graph() -> tuple[Graph, dict[str, object]]:
    g = Graph()
    x = g.buf("x", "input", dt.F32, (32, 64))
    y = g.buf("y", "output", dt.F32, (32, 64))
    unread = g.buf("unread", "scratch", dt.F32, (32, 64))
    mid = g.buf("mid", "scratch", dt.F32, (32, 64))
    t, u, v, w = (g.tile((32, 64), dt.F32, "sbuf", n) for n in "tuvw")
    g.add("dma", "dma", t.ref(), x.ref())                                # live: y reads what it loads
    g.add("act", "activation", u.ref(), t.ref(), func="exp")             # dead: u is only stored to `unread`
    g.add("dma", "dma", unread.ref(), u.ref())                           # dead: nothing loads `unread`
    g.add("pool", "memset", v.ref(), value=0.0)                          # dead: v is never read
    g.add("act", "activation", w.ref(), t.ref(), func="exp")             # live, through `mid`
    g.add("dma", "dma", mid.ref(), w.ref())
    g.add("pool", "memset", w.ref(), value=1.0)                          # dead: w is not read after it
    g.add("dma", "dma", v.ref(), mid.ref())                              # live: reloaded into v, stored to y
    g.add("dma", "dma", y.ref(), v.ref())
    return g, {"unread": unread, "mid": mid}


def test_what_no_live_instruction_reads_goes() -> None:
    g, bufs = _graph()
    assert g.drop_dead() == 4
    assert [(i.engine, i.opcode) for i in g.insts] == [("dma", "dma"), ("act", "activation"), ("dma", "dma"),
                                                       ("dma", "dma"), ("dma", "dma")]
    assert bufs["unread"] not in g.bufs and bufs["mid"] in g.bufs
    assert [i.index for i in g.insts] == list(range(5))
    assert all(d in g.insts for i in g.insts for d in i.deps)
    assert g.insts[2].deps == {g.insts[1]} and g.insts[3].deps >= {g.insts[2]}
    assert g.drop_dead() == 0


def test_the_remaining_program_schedules() -> None:
    g, _ = _graph()
    g.drop_dead()
    inputs = [b for b in g.bufs if b.kind == "input"]
    outputs = [b for b in g.bufs if b.kind == "output"]
    program = schedule(g, TARGET, inputs, outputs).program
    assert [i.opcode for i in program.instrs].count("memset") == 0
    assert "unread" not in program.tensors

"""The scheduler: its memory allocator (`backend.schedule._Space`) against brute force (after any
sequence of allocations and frees, an allocation fails exactly when no aligned place has room, and
the widest free gap it keeps, its fail-fast test, is the true one), its rule that work far ahead
of program order takes no on-chip memory, loads ahead by the program's profile (``room``) and the converted
weights' ring (``ring``)."""

from __future__ import annotations

import random

import ml_dtypes
import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat import sim
from nxsat.backend.graph import Buf, Graph, Inst
from nxsat.backend.schedule import REACH, ScheduleOptions, _Profile, _Space, schedule


def _gaps(space: _Space) -> list[tuple[int, int]]:
    edges = [0] + [x for lo, hi, _ in space.used for x in (lo, hi)] + [space.size]
    return [(a, b) for a, b in zip(edges[::2], edges[1::2]) if b > a]


def _fits(space: _Space, need: int) -> bool:
    step = space.align
    return need == 0 or any(-(-a // step) * step + need <= b for a, b in _gaps(space))


def _walk(space: _Space, start: int, need: int) -> int | None:
    """Next fit place by place (the search before the gap tree): the first place at or after ``start``,
    or the free end when that is more than FAR live places on and has room."""
    step, used = space.align, space.used
    off = -(-start // step) * step
    first = next((k for k, (_, hi, _) in enumerate(used) if hi > off), len(used))
    for k in range(first, len(used)):
        lo, hi, _ = used[k]
        if off + need <= lo:
            break
        if k - first == _Space.FAR:
            end = -(-used[-1][1] // step) * step
            if end + need <= space.size:
                return end
        off = max(off, -(-hi // step) * step)
    return off if off + need <= space.size else None


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("align,whole", [(64, False), (2048, True)])  # SBUF; PSUM's banks
def test_allocation_fails_exactly_when_no_place_has_room(seed: int, align: int, whole: bool) -> None:
    rng = random.Random(seed)
    space = _Space(16384, align, whole)
    live: list[Buf] = []
    refused = 0
    for n in range(1500):
        if live and rng.random() < 0.45:
            space.free(live.pop(rng.randrange(len(live))), [])
        else:
            nbytes = rng.choice([0, 64, 128, 640, 2048, 3000, 4096])
            b = Buf(f"t{n}", "sbuf", dt.F32, (128, max(nbytes // 4, 0)))
            need = -(-nbytes // align) * align if whole else nbytes
            could = _fits(space, need)
            got = space.alloc(b, nbytes)
            assert (got is not None) == could, (n, nbytes, _gaps(space))
            if got is None:
                refused += 1
                continue
            space.commit(b)
            live.append(b)
        assert space.widest() == max([0] + [b - -(-a // align) * align for a, b in _gaps(space)])
        assert space.in_use == sum(hi - lo for lo, hi, _ in space.used)
    assert refused > 50  # the sequence does fill the memory


@pytest.mark.parametrize("seed", range(3))
def test_the_gap_search_finds_what_a_walk_over_the_places_finds(seed: int) -> None:
    """Many small tiles (more live places than FAR): the tree's answer, jumps to the free end included,
    is the place-by-place walk's."""
    rng = random.Random(seed)
    space = _Space(65536, 64)
    live: list[Buf] = []
    for n in range(3000):
        if live and rng.random() < 0.4:
            space.free(live.pop(rng.randrange(len(live))), [])
        else:
            nbytes = rng.choice([64, 100, 128, 192, 1000])
            b = Buf(f"t{n}", "sbuf", dt.F32, (128, nbytes // 4))
            if space.alloc(b, nbytes) is not None:
                space.commit(b)
                live.append(b)
        for _ in range(4):
            start, need = rng.randrange(space.size), rng.choice([64, 128, 256, 1024, 4096])
            assert space._fit(start, need) == _walk(space, start, need), (n, start, need)
    assert len(space.used) > 2 * _Space.FAR


@pytest.mark.parametrize("seed", range(3))
def test_the_profile_tree_adds_over_ranges_and_finds_their_maxima(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([1, 7, 64, 300])
    base = [rng.randrange(1000) for _ in range(n)]
    tree, ref = _Profile(list(base)), list(base)
    for _ in range(400):
        lo = rng.randrange(n)
        hi = rng.randrange(lo, n) + 1
        if rng.random() < 0.5:
            v = rng.randrange(-300, 300)
            tree.add(lo, hi, v)
            for k in range(lo, hi):
                ref[k] += v
        else:
            assert tree.most(lo, hi) == max(ref[lo:hi])


@pytest.mark.parametrize("seed", range(3))
def test_a_high_allocation_takes_the_top_of_the_last_gap_with_room(seed: int) -> None:
    rng = random.Random(seed)
    space = _Space(16384, 64)
    live: list[Buf] = []
    for n in range(800):
        if live and rng.random() < 0.4:
            space.free(live.pop(rng.randrange(len(live))), [])
            continue
        nbytes = rng.choice([64, 100, 640, 2048])
        b = Buf(f"t{n}", "sbuf", dt.F32, (128, nbytes // 4))
        high = rng.random() < 0.5
        want = [g for g in _gaps(space) if -(-g[0] // 64) * 64 + nbytes <= g[1]]
        got = space.alloc(b, nbytes, high=high)
        assert (got is not None) == bool(want)
        if got is None:
            continue
        if high:
            lo, hi = want[-1]
            assert got[0] == (hi - nbytes) // 64 * 64 and got[0] >= lo
        space.commit(b)
        live.append(b)
        assert space.in_use == sum(hi - lo for lo, hi, _ in space.used)


def test_loads_go_ahead_while_the_programs_profile_has_room() -> None:
    """``room``: a load goes ahead of program order while what the program holds until the load's use, with
    the loads already ahead, stays within that share of SBUF. Three weights (20% of SBUF each) used after a
    step that holds 40%: with 0.75 one goes ahead of it (40 + 20 + 20 is above it), with 0.35 none, with the
    prefetch share two (it looks at what is live when the load is issued, not until its use); the same values."""
    g = Graph()
    t = sim.load_target("trn1")
    cols = t.sbuf_bytes // 5 // 4
    ws = [g.buf(f"w{k}", "input", dt.F32, (128, cols)).ref() for k in range(3)]
    x = g.buf("x", "input", dt.F32, (128, 2 * cols)).ref()
    y = g.buf("y", "output", dt.F32, (128, 2 * cols)).ref()
    outs = [g.buf(f"out{k}", "output", dt.F32, (128, cols)).ref() for k in range(3)]
    big = g.tile((128, 2 * cols), dt.F32)
    g.add("dma", "dma", big.ref(), x)
    g.add("act", "activation", big.ref(), big.ref(), func="exp")
    g.add("dma", "dma", y, big.ref())
    loads = []
    for w, o in zip(ws, outs):
        tile = g.tile((128, cols), dt.F32)
        loads.append(g.add("dma", "dma", tile.ref(), w))
        g.add("act", "activation", tile.ref(), tile.ref(), func="exp")
        g.add("dma", "dma", o, tile.ref())
    step = 1  # the exp over the big tile

    def ahead(room: float) -> int:
        sch = schedule(g, t, [w.buf for w in ws] + [x.buf], [y.buf] + [o.buf for o in outs],
                       options=ScheduleOptions(lookahead=100, room=room))
        order = [i.index for i in sch.order]
        return sum(order.index(ld.index) < order.index(step) for ld in loads), sch

    assert ahead(0.75)[0] == 1
    assert ahead(0.35)[0] == 0
    assert ahead(0.0)[0] == 2  # the prefetch share (0.6) sees only what is live now: 40%, then 60%
    data = {f"w{k}": np.full((128, cols), k, np.float32) for k in range(3)}
    data["x"] = np.zeros((128, 2 * cols), np.float32)
    got = sim.load(sim.build_neff(ahead(0.75)[1].program, t, ahead(0.75)[1].constants), verify=True).run(data)
    for k in range(3):
        np.testing.assert_allclose(got[1 + k], np.exp(np.float32(k)), rtol=1e-6)


def test_converted_weights_stream_through_a_ring_of_their_own() -> None:
    """``ring``: a weight the DMA converts to bf16 as it loads it goes ahead, in program order, while the ring
    (its own share of SBUF, at the top) has room, however much the work before its use holds; with half the
    prefetch share and no ring, none goes ahead of a step that holds half of SBUF. A weight loaded as it is
    (not converted) stays in the work's memory. The same values either way."""
    g = Graph()
    t = sim.load_target("trn1")
    cols = t.sbuf_bytes * 12 // 100 // 2  # 12% of SBUF in bf16: three fit a ring of 40%, not four
    ws = [g.buf(f"w{k}", "input", dt.F32, (128, cols)).ref() for k in range(4)]
    x = g.buf("x", "input", dt.F32, (128, 2 * cols + 32)).ref()  # 48% of SBUF
    y = g.buf("y", "output", dt.F32, x.buf.shape).ref()
    outs = [g.buf(f"out{k}", "output", dt.BF16, (128, cols)).ref() for k in range(4)]
    plain = g.buf("plain", "output", dt.F32, (128, cols)).ref()
    big = g.tile(x.buf.shape, dt.F32)
    g.add("dma", "dma", big.ref(), x)
    step = g.add("act", "activation", big.ref(), big.ref(), func="exp")
    g.add("dma", "dma", y, big.ref())
    loads, raws = [], []
    for w, o in zip(ws, outs):
        raw = g.tile((128, cols), dt.BF16)
        loads.append(g.add("dma", "dma", raw.ref(), w))  # converted as it is loaded
        g.add("dma", "dma", o, raw.ref())
        raws.append(raw)
    kept = g.tile((128, cols), dt.F32)
    g.add("dma", "dma", kept.ref(), ws[0])
    g.add("act", "activation", kept.ref(), kept.ref(), func="exp")
    g.add("dma", "dma", plain, kept.ref())

    def run(ring: float) -> tuple[int, list]:
        sch = schedule(g, t, [w.buf for w in ws] + [x.buf], [y.buf, *(o.buf for o in outs), plain.buf],
                       options=ScheduleOptions(lookahead=100, prefetch=0.3, ring=ring))
        order = [i.index for i in sch.order]
        ahead = sum(order.index(ld.index) < order.index(step.index) for ld in loads)
        data = {f"w{k}": np.random.default_rng(k).standard_normal((128, cols)).astype(np.float32) for k in range(4)}
        data["x"] = np.zeros(x.buf.shape, np.float32)
        got = sim.load(sim.build_neff(sch.program, t, sch.constants), verify=True).run(data)
        for k in range(4):
            np.testing.assert_array_equal(got[1 + k], data[f"w{k}"].astype(ml_dtypes.bfloat16))
        np.testing.assert_allclose(got[5], np.exp(data["w0"]), rtol=1e-6)
        return ahead, [b.offset for b in (*raws, kept)]

    ahead, _ = run(0.0)
    assert ahead == 0
    ahead, offsets = run(0.4)
    assert ahead == 3
    top = t.sbuf_bytes - int(0.4 * t.sbuf_bytes) // 64 * 64
    assert all(off >= top for off in offsets[:4]) and offsets[4] + kept.row_bytes <= top


def test_far_ahead_work_takes_no_memory_while_the_frontier_waits_for_some() -> None:
    """The second big load waits for the first one's tile; meanwhile the independent copies run, and the
    memset of a tile used only at the end (ready from the start) is not given memory REACH instructions
    ahead of the load still waiting (such tiles filled SBUF in mobilenet_v2 until nothing fit)."""
    g = Graph()
    t = sim.load_target("trn1")
    cols = t.sbuf_bytes * 6 // 10 // 4  # 60% of SBUF: two such tiles do not fit together
    x = g.buf("x", "input", dt.F32, (128, cols)).ref()
    outs = [g.buf(f"out{k}", "output", dt.F32, (128, cols)).ref() for k in range(2)]
    fill = g.buf("fill", "output", dt.F32, (REACH + 88, 8)).ref()
    last = g.buf("last", "output", dt.F32, (128, 1)).ref()
    a, b, m = g.tile((128, cols), dt.F32), g.tile((128, cols), dt.F32), g.tile((128, 1), dt.F32)
    g.add("dma", "dma", a.ref(), x)
    wait = g.add("dma", "dma", b.ref(), x)  # its tile fits once the first is stored
    for k in range(REACH + 88):  # independent HBM copies, no on-chip memory
        g.add("dma", "dma", fill[k:k + 1, :], x[0:1, 0:8])
    far = g.add("pool", "memset", m.ref(), value=3.0)
    g.add("dma", "dma", outs[0], a.ref())
    g.add("dma", "dma", outs[1], b.ref())
    g.add("dma", "dma", last, m.ref())
    sch = schedule(g, t, [x.buf], [o.buf for o in (*outs, fill, last)])
    order = [i.index for i in sch.order]
    assert order.index(far.index) > order.index(wait.index)
    xs = np.random.default_rng(0).standard_normal((128, cols)).astype(np.float32)
    got = sim.load(sim.build_neff(sch.program, t, sch.constants), verify=True).run({"x": xs})
    np.testing.assert_array_equal(got[0], xs)
    np.testing.assert_array_equal(got[1], xs)
    np.testing.assert_array_equal(got[2], np.broadcast_to(xs[0:1, 0:8], (REACH + 88, 8)))
    np.testing.assert_array_equal(got[3], np.full((128, 1), 3.0, np.float32))


def test_weight_queues_keep_the_models_inputs_apart_from_other_loads() -> None:
    """``ScheduleOptions.weight_queues``: loads of the model's inputs go to the first queues, loads of computed
    values to the other load queues (0: all share them); the values do not change."""
    from harness import DATA, module_of

    from nxsat.backend import ScheduleOptions, compile_graph

    module = module_of(DATA / "jax" / "transformer_layer.hlo", optimized=True)
    target = sim.load_target("trn1")
    load_queues = target.dma_queues * 3 // 4
    for wq in (0, 8):
        prog = compile_graph(module, target, schedule=ScheduleOptions(weight_queues=wq)).program
        kinds = {name: t.kind for name, t in prog.tensors.items()}
        weight, other = set(), set()
        for ins in prog.instrs:
            if not ins.stream.startswith("q") or kinds.get(ins.operands[0].tensor) != "sbuf":
                continue
            src = kinds.get(ins.operands[1].tensor)
            (weight if src in ("input", "const") else other if src == "scratch" else set()).add(int(ins.stream[1:]))
        assert weight and other
        if wq:
            assert max(weight) < wq <= min(other) and max(other) < load_queues
        else:
            assert weight & other


LAYERS = """HloModule m

ENTRY main {
  x = f32[4,8] parameter(0)
  w0 = f32[8,8] parameter(1)
  w1 = f32[8,8] parameter(2)
  e0 = s32[4,8] parameter(3)
  e1 = s32[4,8] parameter(4)
  z = f32[] constant(-1e9)
  zb = f32[4,8] broadcast(z), dimensions={}
  d0 = f32[4,8] dot(x, w0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  m0 = pred[4,8] compare(e0, e1), direction=GT
  s0 = f32[4,8] select(m0, d0, zb)
  d1 = f32[4,8] dot(s0, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  m1 = pred[4,8] compare(e1, e0), direction=GT
  ROOT s1 = f32[4,8] select(m1, d1, zb)
}
"""


def test_a_side_computation_is_lowered_near_its_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two layers, each masking its product's result with a mask made from the parameters alone
    (gemma3's ``select(mask, scores, -inf)``). Depth-first, the last layer's mask comes before the
    first layer's product (every layer's mask first: gemma3's 150 us start); with side computations
    visited after their reader's other operands, it comes after it, and :data:`HOIST` places earlier than
    its reader. Same values as the interpreter."""
    from harness import assert_device_matches, module_of

    from nxsat.backend import lower

    entry = module_of(LAYERS).entry
    pos = {n.name: k for k, n in enumerate(entry.post_order())}
    assert pos["m1"] < pos["d0"]
    monkeypatch.setattr(lower, "HOIST", 0)
    pos = {n.name: k for k, n in enumerate(lower.side_computations_ahead(entry))}
    assert pos["d0"] < pos["s0"] < pos["d1"] < pos["m1"] < pos["s1"]
    monkeypatch.setattr(lower, "HOIST", 2)  # two places ahead: before the second product, after the first
    order = [n.name for n in lower.side_computations_ahead(entry)]
    assert order.index("d0") < order.index("m1") < order.index("d1")
    assert_device_matches(module_of(LAYERS), target="trn1")


def test_critical_path_order_takes_the_longest_chain_first() -> None:
    """Ready instructions by the work still behind them (a DMA weighing DMA_CHAIN_WEIGHT): a short chain
    written first waits for the first step of a long one written after it."""
    from nxsat.backend.schedule import DMA_CHAIN_WEIGHT, _critical_order

    g = Graph()
    x = g.buf("x", "input", dt.F32, (32, 8))
    y = g.buf("y", "output", dt.F32, (32, 8))
    a, b = g.tile((32, 8), dt.F32, "sbuf", "a"), g.tile((32, 8), dt.F32, "sbuf", "b")
    g.add("act", "activation", a.ref(), a.ref(), func="exp")  # 0: a chain of one
    g.add("dve", "tensor_copy", b.ref(), b.ref())  # 1: the head of a chain of four
    for _ in range(2):
        g.add("dve", "tensor_scalar", b.ref(), b.ref(), op0="mul", scalar0=2.0)
    g.add("dma", "dma", y.ref(), b.ref())
    g.add("dma", "dma", b.ref(), x.ref())  # 4: a load the long chain's tile is written by again
    succ: dict[int, list] = {}
    for i in g.insts:
        for d in i.deps:
            succ.setdefault(d.index, []).append(i)
    order = _critical_order(g.insts, succ)
    assert order[0] == 1 and order.index(1) < order.index(0)
    assert DMA_CHAIN_WEIGHT > 1


def test_critical_path_order_overlaps_an_attentions_heads() -> None:
    """mha_block (12 heads): in program order every engine works on one head at a time; taking the longest
    chain first, TensorE starts the next head's scores while ScalarE and VectorE finish this one's softmax;
    in time (``timed``), it also starts them before the later heads' inputs have arrived. Faster, the
    same bits."""
    from harness import DATA, module_of

    from nxsat.backend import compile_graph
    from nxsat.backend.schedule import ScheduleOptions

    module = module_of(DATA / "hlo" / "mha_block_1x12x128x64_bf16.hlo", optimized=True)
    target = sim.load_target("trn1")
    rng = np.random.default_rng(5)
    inputs = {f"in{i}": dt.cast(rng.standard_normal(p.type.shape), p.type.dtype)
              for i, p in enumerate(module.entry.params)}
    runs = []
    for options in (ScheduleOptions(), ScheduleOptions(critical=True), ScheduleOptions(critical=True, timed=True)):
        c = compile_graph(module, target, schedule=options)
        model = sim.load(sim.build_neff(c.program, target, c.constants), verify=True)
        runs.append((model.run(inputs), model.profile()[1].latency, c.program))
    (plain, t_plain, _), (crit, t_crit, p_crit), (timed, t_timed, p_timed) = runs
    # (the softmax's reductions on chip since its row statistics follow the scores' tiles: 46.7 against
    # 45.8 us; with them through HBM, program order waited more and chain order gained over 5%)
    assert t_crit < t_plain
    assert all(np.array_equal(a, b) for a, b in zip(plain, crit, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(plain, timed, strict=True))

    def pe(prog: object) -> list[str]:
        return [i.opcode for i in prog.instrs if i.stream == "pe"]

    # Chain order alone queued every head's transposes (ready, their loads issued) ahead of the first
    # head's scores on TensorE; in time, the scores of the heads whose inputs are there go first.
    assert pe(p_crit).index("matmul") == 24  # q and k of all 12 heads transposed first
    assert pe(p_timed).index("matmul") < 24
    assert t_timed < t_crit


LAST_CONV = """HloModule last_conv
ENTRY main {
  x = bf16[1,512,7,7]{3,2,1,0} parameter(0)
  w = bf16[1,1,512,2048]{3,2,1,0} parameter(1)
  s = f32[2048]{0} parameter(2)
  b = f32[2048]{0} parameter(3)
  r = f32[1,2048,7,7]{3,2,1,0} parameter(4)
  c = f32[1,2048,7,7]{3,2,1,0} convolution(x, w), window={size=1x1}, dim_labels=bf01_01io->bf01
  sb = f32[1,2048,7,7]{3,2,1,0} broadcast(s), dimensions={1}
  bb = f32[1,2048,7,7]{3,2,1,0} broadcast(b), dimensions={1}
  m = f32[1,2048,7,7]{3,2,1,0} multiply(c, sb)
  a = f32[1,2048,7,7]{3,2,1,0} add(m, bb)
  y = f32[1,2048,7,7]{3,2,1,0} add(a, r)
  z = f32[] constant(0)
  zb = f32[1,2048,7,7]{3,2,1,0} broadcast(z), dimensions={}
  ROOT o = f32[1,2048,7,7]{3,2,1,0} maximum(y, zb)
}
"""


def test_critical_path_order_leaves_the_frontier_a_psum_bank() -> None:
    """ResNet-50's last convolution (2,048 channels: 16 accumulators of one bank each) in critical-path
    order: accumulators started ahead of program order took all eight banks while the epilogue of the
    first waited for its per-channel scale, which TensorE transposes into a bank of its own. Out of
    program order an accumulator may not take the last bank, so the schedule completes, and computes what
    program order computes."""
    from harness import assert_device_matches, module_of

    from nxsat.backend import compile_graph
    from nxsat.backend.schedule import ScheduleOptions

    module = module_of(LAST_CONV)
    target = sim.load_target("trn1")
    c = compile_graph(module, target, schedule=ScheduleOptions(critical=True))
    model = sim.load(sim.build_neff(c.program, target, c.constants), verify=True)
    rng = np.random.default_rng(3)
    inputs = {f"in{i}": dt.cast(rng.standard_normal(p.type.shape), p.type.dtype)
              for i, p in enumerate(module.entry.params)}
    plain = assert_device_matches(module, inputs)
    assert all(np.array_equal(a, b) for a, b in zip(plain.run(inputs), model.run(inputs), strict=True))


def test_in_time_a_step_whose_inputs_are_there_fills_the_gap_before_one_whose_are_not() -> None:
    """``timed``: ScalarE's first step in program order waits for a 4 MB load; a short step whose tile is
    there goes first (it fits, by the clock, in the gap before the load lands), a step longer than that gap
    does not (backfilling never delays the step ranked first); program order queues both behind the
    load. Either way the same values."""
    t = sim.load_target("trn1")

    def program() -> tuple[Graph, list[Buf], list[Buf]]:
        g = Graph()
        x = g.buf("x", "input", dt.F32, (128, 8192))
        ys = [g.buf(f"y{k}", "output", dt.F32, shape) for k, shape in enumerate(((128, 8192), (128, 16), (128, 32768)))]
        late, short, long_ = (g.tile(y.shape, dt.F32, "sbuf", name) for y, name in zip(ys, ("late", "short", "long")))
        g.add("dma", "dma", late.ref(), x.ref())
        g.add("act", "activation", late.ref(), late.ref(), func="exp")  # waits for the load
        g.add("pool", "memset", short.ref(), value=1.0)
        g.add("act", "activation", short.ref(), short.ref(), func="exp")  # 64 cycles: fits before the load lands
        g.add("pool", "memset", long_.ref(), value=2.0)
        g.add("act", "activation", long_.ref(), long_.ref(), func="exp")  # 23 us: longer than the load's ~17
        for y, tile in zip(ys, (late, short, long_)):
            g.add("dma", "dma", y.ref(), tile.ref())
        return g, [x], ys

    def act_order(timed: bool) -> tuple[list[str], dict]:
        g, ins, outs = program()
        sch = schedule(g, t, ins, outs, options=ScheduleOptions(timed=timed))
        names = [i.operands[0].buf.name for i in sch.order if i.engine == "act"]
        model = sim.load(sim.build_neff(sch.program, t, sch.constants), verify=True)
        return names, model.run({"x": np.linspace(-1, 1, 128 * 8192, dtype=np.float32).reshape(128, 8192)})

    plain, out_plain = act_order(False)
    timed, out_timed = act_order(True)
    assert plain == ["late", "short", "long"]
    assert timed == ["short", "late", "long"]
    assert all(np.array_equal(a, b) for a, b in zip(out_plain, out_timed, strict=True))


def test_in_time_a_load_waits_for_the_transfer_before_it_on_its_queue() -> None:
    """``timed``: the clock runs a load after the transfer before it on the queue it will get (``_Queues``:
    loads round-robin over the load queues, so the 13th shares the first's). A 1 MB load into 8 partitions
    has one DMA engine (~60 us); a small load queued behind it lands late, and ScalarE's step that waits
    for it goes after a 23 us step whose tile is there (it fits in the gap); the same small load on a queue
    of its own lands in a few us (the engines' pool is shared, not the queue), and its step goes first.
    The same values either way."""
    from nxsat.extract.plan import load_queues

    t = sim.load_target("trn1")
    nq = load_queues(t)

    def program(fillers: int) -> tuple[Graph, list[Buf], list[Buf]]:
        g = Graph()
        big_in = g.buf("big_in", "input", dt.F32, (8, 32768))
        small_in = g.buf("small_in", "input", dt.F32, (128, 16))
        fill_in = [g.buf(f"f{k}", "input", dt.F32, (128, 16)) for k in range(fillers)]
        outs = [g.buf("y_big", "output", dt.F32, (8, 32768)), g.buf("y_small", "output", dt.F32, (128, 16)),
                g.buf("y_mid", "output", dt.F32, (128, 32768))]
        outs += [g.buf(f"y_f{k}", "output", dt.F32, (128, 16)) for k in range(fillers)]
        big, small, mid = (g.tile(o.shape, dt.F32, "sbuf", name) for o, name in zip(outs, ("big", "small", "mid")))
        fills = [g.tile((128, 16), dt.F32, "sbuf", f"fill{k}") for k in range(fillers)]
        g.add("dma", "dma", big.ref(), big_in.ref())  # the first load queue
        for tile, src in zip(fills, fill_in):
            g.add("dma", "dma", tile.ref(), src.ref())
        g.add("dma", "dma", small.ref(), small_in.ref())  # with nq - 1 fillers: the first queue again
        g.add("act", "activation", small.ref(), small.ref(), func="exp")
        g.add("pool", "memset", mid.ref(), value=1.0)
        g.add("act", "activation", mid.ref(), mid.ref(), func="exp")  # ~23 us
        for y, tile in zip(outs, (big, small, mid, *fills)):
            g.add("dma", "dma", y.ref(), tile.ref())
        return g, [big_in, small_in, *fill_in], outs

    def act_order(fillers: int) -> tuple[list[str], list[np.ndarray]]:
        g, ins, outs = program(fillers)
        sch = schedule(g, t, ins, outs, options=ScheduleOptions(timed=True))
        names = [i.operands[0].buf.name for i in sch.order if i.engine == "act"]
        model = sim.load(sim.build_neff(sch.program, t, sch.constants), verify=True)
        rng = np.random.default_rng(0)
        return names, model.run({b.name: rng.standard_normal(b.shape).astype(np.float32) for b in ins})

    queued, out_queued = act_order(nq - 1)
    apart, out_apart = act_order(nq - 2)
    assert queued == ["mid", "small"]
    assert apart == ["small", "mid"]
    assert all(np.array_equal(a, b) for a, b in zip(out_queued[:3], out_apart[:3], strict=True))


def test_the_clock_shares_the_dma_engines_with_the_transfers_in_flight() -> None:
    """A load issued beside seven small ones in flight (one DMA engine each, few bytes: the engines' total
    work is done long before) moves at an even share of the engines, as the simulator shares them: the
    clock lands it several times later than on its own (resnet_small's ScalarE had waited at a weight's
    conversion the clock expected 1 us sooner)."""
    from nxsat.backend.schedule import _Clock, _Queues

    t = sim.load_target("trn1")
    g = Graph()

    def load(name: str, rows: int, cols: int) -> Inst:
        src = g.buf(f"{name}_in", "input", dt.F32, (rows, cols))
        return g.add("dma", "dma", g.tile((rows, cols), dt.F32, "sbuf", name).ref(), src.ref())

    x = load("x", 128, 2048)
    small = [load(f"s{k}", 8, 4096) for k in range(7)]
    alone = _Clock(t, _Queues(t, 0, False), {})
    alone.issue(x)
    beside = _Clock(t, _Queues(t, 0, False), {})
    for s in small:
        beside.issue(s)
    beside.issue(x)
    lat = float(t.dma["fixed_latency_ns"])
    assert beside.end[x.index] - lat > 4 * (alone.end[x.index] - lat)
    assert max(beside.end[s.index] for s in small) < beside.end[x.index]


def test_critical_path_order_leaves_the_frontier_two_psum_banks() -> None:
    """attention_s2048 under transformer (trn1, bf16): with its inputs loaded in bf16 (the DMA converting
    them), critical-path order started seven output projections' accumulators ahead, each waiting for SBUF
    to evacuate into, and the frontier's P.V, holding its own accumulator, found no bank for its
    transposes: the schedule ran out of PSUM and was redone with less forwarding (350.3 us, not 323.3).
    Out of program order an accumulator leaves the frontier two banks (``PSUM_FRONTIER_BANKS``)."""
    from pathlib import Path

    from nxsat.driver import CompileOptions, compile_model

    path = Path(__file__).resolve().parents[1] / "data" / "models" / "attention_s2048.hlo"
    report = compile_model(str(path),
                           CompileOptions(model_type="transformer", auto_cast="matmult")).report
    chosen = report["search"]["tried"][report["search"]["chosen"]]
    assert chosen["critical"] and report["forwarded"]["refused_for_sbuf"] == 0, (chosen, report["forwarded"])


def test_loads_by_rank_go_ahead_longest_chain_first() -> None:
    """resnet_small under unet-inference: its batch norms' vectors, computed first in the program, were
    loaded ahead of the stem's image, which the longest chain waits for. With ``loads_by_rank`` (in
    critical-path order) the loads go ahead by their chains too: the image's first; in program order
    otherwise. Either way the same values."""
    t = sim.load_target("trn1")

    def program() -> tuple[Graph, list[Buf], list[Buf]]:
        g = Graph()
        vs = [g.buf(f"v{k}", "input", dt.F32, (64, 1)) for k in range(4)]
        x = g.buf("x", "input", dt.F32, (64, 512))
        outs = [g.buf(f"o{k}", "output", dt.F32, (64, 1)) for k in range(4)] + [g.buf("y", "output", dt.F32, (64, 512))]
        for k, (v, o) in enumerate(zip(vs, outs)):  # a short chain each: load, one step, store
            tile = g.tile((64, 1), dt.F32, "sbuf", f"vt{k}")
            g.add("dma", "dma", tile.ref(), v.ref())
            g.add("act", "activation", tile.ref(), tile.ref(), func="rsqrt", bias=1e-5)
            g.add("dma", "dma", o.ref(), tile.ref())
        xt = g.tile((64, 512), dt.F32, "sbuf", "xt")
        g.add("dma", "dma", xt.ref(), x.ref())
        for _ in range(8):  # the long chain
            g.add("dve", "tensor_scalar", xt.ref(), xt.ref(), op0="mul", scalar0=0.5)
        g.add("dma", "dma", outs[-1].ref(), xt.ref())
        return g, [*vs, x], outs

    def loads(by_rank: bool) -> tuple[list[str], list[np.ndarray]]:
        g, ins, outs = program()
        sch = schedule(g, t, ins, outs, options=ScheduleOptions(critical=True, timed=True, loads_by_rank=by_rank))
        names = [i.operands[0].buf.name for i in sch.order if i.engine == "dma" and i.operands[0].buf.onchip]
        model = sim.load(sim.build_neff(sch.program, t, sch.constants), verify=True)
        rng = np.random.default_rng(5)
        arrays = {b.name: np.abs(rng.standard_normal(b.shape)).astype(np.float32) for b in ins}
        return names, model.run(arrays)

    plain, out_plain = loads(False)
    by_rank, out_by_rank = loads(True)
    assert plain == ["vt0", "vt1", "vt2", "vt3", "xt"]
    assert by_rank[0] == "xt"
    assert all(np.array_equal(a, b) for a, b in zip(out_plain, out_by_rank, strict=True))


def test_the_clock_times_the_stalls_the_simulator_replays() -> None:
    """``stalls``: a step after its producer on the same engine waits that engine's dependent-instruction
    stall (ScalarE: 100 cycles at 1.4 GHz), after another engine's the producer's access latency (ScalarE:
    60 cycles at 1.4 GHz), after a load nothing more (its end is when its data is there); without, a flat
    stall after any other engine or a load, and none on one engine."""
    from nxsat.backend.schedule import _Clock, _Queues

    t = sim.load_target("trn1")
    g = Graph()
    x = g.buf("x", "input", dt.F32, (128, 64))
    a, b, c, d = (g.tile((128, 64), dt.F32, "sbuf", n) for n in "abcd")
    load = g.add("dma", "dma", a.ref(), x.ref())
    first = g.add("act", "activation", b.ref(), a.ref(), func="exp")
    same = g.add("act", "activation", c.ref(), b.ref(), func="exp")
    other = g.add("dve", "tensor_scalar", d.ref(), b.ref(), op0="mul", scalar0=2.0)
    assert load in first.deps and first in same.deps and first in other.deps
    for stalls, after_load, want in ((True, 0.0, (100 / 1.4, 60 / 1.4)), (False, 100 / 1.4, (0.0, 100 / 1.4))):
        clock = _Clock(t, _Queues(t, 0, False, set()), {}, stalls)
        clock.issue(load)
        assert clock.ready(first) - clock.end[load.index] == pytest.approx(after_load)
        clock.issue(first)
        assert [clock.ready(i) - clock.end[first.index] for i in (same, other)] == pytest.approx(want)

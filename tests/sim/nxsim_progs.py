"""Helpers of the device-model tests: building models, type-aware comparison, and device programs
generated in the text form (for tests and benchmarks too large to write by hand)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nxsat import dtypes as dt
from nxsat import sim

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "programs"

# Explicit mantissa bits of each storage type: one unit in the last place is 2**-bits relative.
MANTISSA = {"f32": 23, "bf16": 7, "f16": 10, "f8e4m3fn": 3, "f8e5m2": 2}


def build(text: str, consts: dict | None = None, target: str | None = None, verify: bool = True) -> sim.Model:
    """Assemble and load (by default redoing the race analysis, so tests can ask ``hb``)."""
    return sim.load(sim.assemble(text, "test.nxs", consts, target), verify=verify)


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """Values as the device stores them in ``dtype`` (round to nearest even)."""
    return dt.cast(np.asarray(x, dtype=np.float32), dt.by_name(dtype))


def assert_close_dtype(actual: np.ndarray, ref: np.ndarray, dtype: str, ulps: float = 1.0,
                       atol: float = 0.0) -> None:
    """|actual - ref| within ``ulps`` units in the last place of ``dtype`` at ref's magnitude."""
    a = np.asarray(actual).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    assert a.shape == r.shape
    err = np.abs(a - r) - (ulps * 2.0 ** -MANTISSA[dtype] * np.abs(r) + atol)
    assert not (err > 0).any(), (f"{int((err > 0).sum())} of {err.size} values off by more than {ulps} ulp "
                                 f"of {dtype}; worst excess {err.max():.3g}")


def big_matmul(m_tiles: int = 8, k_tiles: int = 16, panels: int = 8, dtype: str = "bf16") -> str:
    """C[128 m, 512 p] = A[128 m, 128 k] @ B[128 k, 512 p], A given transposed (K on partitions).

    Output-panel loop: for each 512-wide panel of B, K outer and the M tiles inner, each M tile
    accumulating in its own PSUM bank (up to 8). A^T stays in SBUF after panel 0; B panels are
    double-buffered. One queue streams A^T and one B, in the order TensorE needs them; ScalarE
    evacuates every bank (VectorE and ScalarE cannot share the PSUM port, so two evacuating engines
    would only wait for each other); one queue per M tile stores.
    """
    M, K, N = 128 * m_tiles, 128 * k_tiles, 512 * panels
    assert m_tiles <= 8
    lines = [
        ".isa 1.0", ".target trn1", "",
        f"input   at: {dtype}[{K}, {M}]",
        f"input   b: {dtype}[{K}, {N}]",
        f"output  c: {dtype}[{M}, {N}]",
        f"sbuf    as: {dtype}[128, {k_tiles}, {M}]",
        f"sbuf    bs: {dtype}[128, 2, {k_tiles}, 512]",
        f"sbuf    os: {dtype}[128, {m_tiles}, 512]",
        f"psum    acc: f32[128, {m_tiles}, 512]",
    ]
    sems = ["la0", "la1", "lb", "pd", "mm", "ev"] + [f"st{m}" for m in range(m_tiles)]
    lines += [f"sem     {s}" for s in sems] + [""]
    for kt in range(k_tiles):  # A^T on two queues, so that it arrives at TensorE's pace
        q = "q0" if kt % 2 == 0 else "q10"
        lines.append(f"{q}   dma  as[:, {kt}, :], at[{kt * 128}:{kt * 128 + 128}, :], signal=la{kt % 2}")
    for p in range(panels):
        buf = p % 2
        for kt in range(k_tiles):
            waits = f", wait=pd>={p - 1}" if p >= 2 and kt == 0 else ""
            lines.append(f"q1    dma  bs[:, {buf}, {kt}, :], b[{kt * 128}:{kt * 128 + 128}, "
                         f"{p * 512}:{p * 512 + 512}]{waits}, signal=lb")
        for kt in range(k_tiles):
            for m in range(m_tiles):
                w = []
                if m == 0:
                    w.append(f"wait=lb>={p * k_tiles + kt + 1}")
                    if p == 0:
                        w.append(f"wait=la{kt % 2}>={kt // 2 + 1}")
                if kt == 0 and p >= 1:
                    w.append(f"wait=ev>={(p - 1) * m_tiles + m + 1}")
                flags = (["start=true"] if kt == 0 else []) + (["stop=true"] if kt == k_tiles - 1 else [])
                sig = []
                if kt == k_tiles - 1:
                    sig.append("signal=mm")
                    if m == m_tiles - 1:
                        sig.append("signal=pd")
                args = [f"acc[:, {m}, :]", f"as[:, {kt}, {m * 128}:{m * 128 + 128}]", f"bs[:, {buf}, {kt}, :]"]
                lines.append("pe    matmul  " + ", ".join(args + flags + w + sig))
        for m in range(m_tiles):
            w = [f"wait=mm>={p * m_tiles + m + 1}"] + ([f"wait=st{m}>={p}"] if p >= 1 else [])
            lines.append(f"act   tensor_copy  os[:, {m}, :], acc[:, {m}, :], " + ", ".join(w) + ", signal=ev")
            lines.append(f"q{2 + m}    dma  c[{m * 128}:{m * 128 + 128}, {p * 512}:{p * 512 + 512}], os[:, {m}, :], "
                         f"wait=ev>={p * m_tiles + m + 1}, signal=st{m}")
    return "\n".join(lines) + "\n"


def dma_copy(queues: int = 8, chunks: int = 4, rows: int = 128, cols: int = 4096, dtype: str = "f32") -> str:
    """y = x through SBUF: every queue loads a [128, cols] chunk and stores it back, ``chunks`` times."""
    total = queues * chunks * rows
    lines = [".isa 1.0", ".target trn1", "", f"input   x: {dtype}[{total}, {cols}]",
             f"output  y: {dtype}[{total}, {cols}]"]
    lines += [f"sbuf    b{q}: {dtype}[{rows}, {cols}]" for q in range(queues)] + [""]
    for c in range(chunks):
        for q in range(queues):
            r0 = (c * queues + q) * rows
            lines.append(f"q{q}    dma  b{q}, x[{r0}:{r0 + rows}, :]")
            lines.append(f"q{q}    dma  y[{r0}:{r0 + rows}, :], b{q}")
    return "\n".join(lines) + "\n"


def random_program(seed: int, target: str = "trn1") -> str:
    """A few independent jobs (matmul, activation, copy) on random engines and queues, random sizes."""
    import numpy as np

    rng = np.random.default_rng(seed)
    decl: list[str] = []
    body: list[str] = []
    sems: list[str] = []
    for j in range(int(rng.integers(1, 6))):
        kind = ["mm", "act", "copy"][int(rng.integers(0, 3))]
        q = [f"q{int(x)}" for x in rng.integers(0, 16, 3)]
        sems += [f"L{j}", f"C{j}", f"E{j}"]
        if kind == "mm":
            dtype = ["bf16", "f32", "f16"][int(rng.integers(0, 3))]
            kt = int(rng.integers(1, 4))
            m = int(rng.choice([32, 64, 128]))
            n = int(rng.choice([64, 256, 512]))
            decl += [f"input   a{j}: {dtype}[{128 * kt}, {m}]", f"input   b{j}: {dtype}[{128 * kt}, {n}]",
                     f"output  c{j}: f32[{m}, {n}]", f"sbuf    sa{j}: {dtype}[128, {kt}, {m}]",
                     f"sbuf    sb{j}: {dtype}[128, {kt}, {n}]", f"sbuf    sc{j}: f32[{m}, {n}]",
                     f"psum    p{j}: f32[{m}, {n}]"]
            body += [f"{q[0]} dma sa{j}, a{j}.reshape({kt}, 128, {m}).permute(1, 0, 2), signal=L{j}",
                     f"{q[1]} dma sb{j}, b{j}.reshape({kt}, 128, {n}).permute(1, 0, 2), signal=L{j}"]
            for k in range(kt):
                flags = (", start=true" if k == 0 else "") + (", stop=true, signal=C" + str(j) if k == kt - 1 else "")
                wait = f", wait=L{j}>=2" if k == 0 else ""
                body.append(f"pe matmul p{j}, sa{j}[:, {k}, :], sb{j}[:, {k}, :]{flags}{wait}")
            eng = ["act", "dve"][int(rng.integers(0, 2))]
            body += [f"{eng} tensor_copy sc{j}, p{j}, wait=C{j}>=1, signal=E{j}",
                     f"{q[2]} dma c{j}, sc{j}, wait=E{j}>=1"]
        else:
            p = int(rng.choice([16, 64, 128]))
            f = int(rng.choice([64, 512, 2048]))
            decl += [f"input   x{j}: f32[{p}, {f}]", f"output  y{j}: f32[{p}, {f}]", f"sbuf    sx{j}: f32[{p}, {f}]",
                     f"sbuf    sy{j}: f32[{p}, {f}]"]
            body.append(f"{q[0]} dma sx{j}, x{j}, signal=L{j}")
            if kind == "act":
                body.append(f"act activation sy{j}, sx{j}, func=exp, wait=L{j}>=1, signal=E{j}")
            else:
                body.append(f"dve tensor_copy sy{j}, sx{j}, wait=L{j}>=1, signal=E{j}")
            body.append(f"{q[1]} dma y{j}, sy{j}, wait=E{j}>=1")
    return "\n".join([".isa 1.0", f".target {target}", *decl, *(f"sem {s}" for s in sems), *body]) + "\n"


def pipeline_program(steps: int, tiles: int | None = None, load_queues: int = 4,
                     funcs: tuple[str, ...] = ("gelu", "identity"), target: str = "trn1") -> sim.Program:
    """A software-pipelined layer built through the Python API (no text), the shape of what the backend
    emits: per step, one DMA loads a [128, 4 x 512] bf16 tile (rotating over ``load_queues`` queues),
    four matmuls accumulate it against resident weights in one of 8 PSUM banks, ScalarE evacuates the
    bank through an activation (cycling over ``funcs``), VectorE adds a bias tile, one queue stores
    the [128, 512] result. Double-buffered, every semaphore signalled by one stream. 8 instructions
    per step plus 2: ``pipeline_program(125_000)`` has a million."""
    from nxsat.sim import Access, Idx, Instr, Tensor, Wait

    tiles = tiles or min(16, steps)
    shared: dict[object, object] = {}

    def one(v: object) -> object:
        """Equal records shared, as a code generator that interns them would (a million instructions
        touch a few hundred distinct accesses)."""
        return shared.setdefault((type(v), v), v)

    def ix(*parts: object) -> tuple[Idx, ...]:
        return one(tuple(one(Idx(p, p + 1, 1, True) if isinstance(p, int) else Idx(p[0], p[1])) for p in parts))

    def acc(name: str, *parts: object) -> Access:
        return one(Access(name, ix(*parts) if parts else ()))

    attr_dicts: dict[tuple, dict] = {}

    def attrs(**kw: object) -> dict:
        return attr_dicts.setdefault(tuple(kw.items()), kw)

    bf, f32 = dt.BF16, dt.F32
    p = sim.Program(target=target)
    for name, kind, dtype, shape in [("x", "input", bf, (tiles, 128, 4, 512)), ("w", "input", bf, (128, 4, 128)),
                                     ("y", "output", bf, (tiles, 128, 512)), ("ws", "sbuf", bf, (128, 4, 128)),
                                     ("xs", "sbuf", bf, (128, 2, 4, 512)), ("ys", "sbuf", bf, (128, 2, 512)),
                                     ("zs", "sbuf", bf, (128, 2, 512)), ("bias", "sbuf", bf, (128, 512)),
                                     ("acc", "psum", f32, (128, 8, 512))]:
        p.tensors[name] = Tensor(name, kind, dtype, shape)
    for s in [f"ld{q}" for q in range(load_queues)] + ["wl", "mm", "ev", "ad", "st", "bi"]:
        p.semaphores[s] = 0
    full = (0, 128)
    add = p.instrs.append
    add(Instr("q15", "dma", (acc("ws"), acc("w")), {}, (), ("wl",), origin="weights"))
    add(Instr("pool", "memset", (acc("bias"),), {"value": 0.5}, (), ("bi",), origin="bias"))
    for s in range(steps):
        t, b, q, bank = s % tiles, s % 2, s % load_queues, s % 8
        origin = f"step {s}"
        add(Instr(f"q{q}", "dma", one((acc("xs", full, b, (0, 4), (0, 512)), acc("x", t, full, (0, 4), (0, 512)))),
                  attrs(), (Wait("mm", s - 1),) if s >= 2 else (), one((f"ld{q}",)), origin=origin))
        for k in range(4):
            waits = []
            if k == 0:
                waits.append(Wait(f"ld{q}", s // load_queues + 1))
                if s == 0:
                    waits.append(Wait("wl", 1))
                if s >= 8:
                    waits.append(Wait("ev", s - 7))
            add(Instr("pe", "matmul", one((acc("acc", full, bank, (0, 512)), acc("ws", full, k, (0, 128)),
                                           acc("xs", full, b, k, (0, 512)))),
                      attrs(start=k == 0, stop=k == 3), tuple(waits), ("mm",) if k == 3 else (), origin=origin))
        add(Instr("act", "activation", one((acc("ys", full, b, (0, 512)), acc("acc", full, bank, (0, 512)))),
                  attrs(func=funcs[s % len(funcs)]), (Wait("mm", s + 1),) + ((Wait("ad", s - 1),) if s >= 2 else ()),
                  ("ev",), origin=origin))
        add(Instr("dve", "tensor_tensor", one((acc("zs", full, b, (0, 512)), acc("ys", full, b, (0, 512)),
                                               acc("bias"))), attrs(op="add"),
                  (Wait("ev", s + 1),) + ((Wait("st", s - 1),) if s >= 2 else ())
                  + ((Wait("bi", 1),) if s == 0 else ()),
                  ("ad",), origin=origin))
        add(Instr("q4", "dma", one((acc("y", t, full, (0, 512)), acc("zs", full, b, (0, 512)))), attrs(),
                  (Wait("ad", s + 1),), ("st",), origin=origin))
    return p


def pipeline_reference(m: sim.Model, inputs: dict[str, np.ndarray], steps: int, tiles: int | None = None,
                       funcs: tuple[str, ...] = ("gelu", "identity")) -> np.ndarray:
    """What :func:`pipeline_program` computes, in numpy (each matmul's product exact and rounded once
    to fp32, the four added in fp32; bf16 roundings where the device rounds): the last step written
    to each output tile."""
    return _pipeline_reference(inputs, steps, tiles or min(16, steps), funcs)


def _pipeline_reference(inputs: dict[str, np.ndarray], steps: int, tiles: int, funcs: tuple[str, ...]) -> np.ndarray:
    from scipy import special

    x = np.asarray(inputs["in0"], np.float32)
    w = np.asarray(inputs["in1"], np.float32)
    y = np.zeros((tiles, 128, 512), np.float32)
    fn = {"gelu": lambda v: 0.5 * v * (1 + special.erf(v / np.sqrt(2.0))), "identity": lambda v: v,
          "exp": np.exp, "relu": lambda v: np.maximum(v, 0)}
    f64 = np.float64
    for s in range(max(0, steps - tiles), steps):
        t = s % tiles
        acc = sum((w[:, k, :].T.astype(f64) @ x[t, :, k, :].astype(f64)).astype(np.float32) for k in range(4))
        act = rounded(fn[funcs[s % len(funcs)]](acc.astype(np.float64)).astype(np.float32), "bf16")
        y[t] = rounded(act.astype(np.float32) + np.float32(0.5), "bf16")
    return y

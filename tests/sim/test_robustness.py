"""Bad input of any kind ends in a coded error, never another exception: mutated programs, mutated NEFFs."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from nxsim_progs import EXAMPLES

from conftest import CallCounter
from nxsat import sim
from nxsat.diagnostics import NxsatError

PIECES = ["[", "]", ",", ":", "=", ".", "(", ")", ">=", "-1", "0", "7", "129", "99999999999", "x", "acc", "signal=",
          "wait=", "sem", "pe", "q0", "dma", "matmul", "start=true", ".T", ".reshape(2, 2)", ".broadcast(0, 4)",
          "f32", "bf16", "inf", "nan", "#", "\n", " ", "1.5e3", "offset=1", "bank=9", "shard=0", "partition=127"]


@pytest.mark.parametrize("name", ["matmul", "softmax", "layernorm", "gather"])
def test_mutated_programs_fail_with_codes(name: str) -> None:
    text = (EXAMPLES / f"{name}.nxs").read_text()
    consts = {"gamma": np.zeros((1, 768), np.float32), "beta": np.zeros((1, 768), np.float32)} \
        if name == "layernorm" else None
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    ok = failed = 0
    for _ in range(150):
        t = list(text)
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(0, len(t)))
            r = rng.random()
            if r < 0.4:
                del t[pos:pos + int(rng.integers(1, 6))]
            elif r < 0.8:
                t[pos:pos] = list(PIECES[int(rng.integers(0, len(PIECES)))])
            else:
                t[pos] = chr(int(rng.integers(32, 127)))
        mutated = "".join(t)
        try:
            data = sim.assemble(mutated, "m.nxs", consts)
        except NxsatError as e:
            assert e.code.startswith("NCC_"), e
            failed += 1
            continue
        m = sim.load(data)  # what assembles must load
        assert sim.assemble(m.text, "again", m.consts) == data
        ok += 1
    assert failed > 50


def test_mutated_neffs_are_refused_with_codes() -> None:
    data = sim.assemble((EXAMPLES / "softmax.nxs").read_text(), "s")
    rng = np.random.default_rng(0)
    codes = set()
    for _ in range(300):
        b = bytearray(data)
        r = rng.random()
        if r < 0.3:
            b = b[:int(rng.integers(0, len(b)))]
        elif r < 0.9:
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        else:
            b[int(rng.integers(0, len(b))):int(rng.integers(0, len(b)))] = bytes(rng.integers(0, 256, 8).tolist())
        if bytes(b) == data:
            continue
        with pytest.raises(NxsatError) as e:
            sim.load(bytes(b))
        codes.add(e.value.code)
    assert {"NCC_ENEF001", "NCC_ENEF002", "NCC_ENEF003"} <= codes


def test_bad_inputs_to_run() -> None:
    m = sim.load(sim.assemble((EXAMPLES / "gather.nxs").read_text(), "g"))
    table = np.zeros((1000, 64), np.float32)
    for bad in ({"in0": table}, {"in0": table, "in1": np.zeros((128, 1), np.float32) + 0.5},
                {"in0": table, "in1": np.zeros((128, 2), np.int32)}, {"in0": table, "ids": np.zeros((128, 1), np.int32),
                                                                      "extra": table}):
        with pytest.raises(NxsatError) as e:
            m.run(bad)
        assert e.value.code == "NCC_EINP001"
    # Reference outputs in the same file are ignored, as by `nxsat interpret`.
    out = m.run({"in0": table, "in1": np.zeros((128, 1), np.int64), "out0": table})
    assert out[0].shape == (128, 64)


def test_host_memory_limit(monkeypatch) -> None:
    m = sim.load(sim.assemble((EXAMPLES / "gather.nxs").read_text(), "g"))
    monkeypatch.setenv("NXSAT_SIM_MAX_BYTES", str(1 << 20))
    with pytest.raises(NxsatError) as e:
        m.run({"in0": np.zeros((1000, 64), np.float32), "in1": np.zeros((128, 1), np.int32)})
    assert e.value.code == "NCC_ERUN001"


def test_scratch_lives_from_first_to_last_access(monkeypatch) -> None:
    """Four 4 MiB scratch tensors in a chain, each dead once the next is written: at most two exist at
    once, so the run fits a limit below their sum (the executor creates each at its first access and
    frees it after its last), and the chain still carries the value through."""
    from nxsat.sim import execute

    lines = [".isa 1.0", ".target trn1", "input x: f32[1024, 1024]", "output y: f32[1024, 1024]",
             *(f"scratch h{k}: f32[1024, 1024]" for k in range(4)), "sem s"]
    chain = ["x", "h0", "h1", "h2", "h3", "y"]
    lines += [f"q{k % 2} dma {dst}, {src}" + (f", wait=s>={k}" if k else "") + ", signal=s"
              for k, (src, dst) in enumerate(zip(chain, chain[1:]))]
    m = sim.load(sim.assemble("\n".join(lines) + "\n", "chain"))
    peak = execute.scratch_peak(m.linked)
    assert peak == 2 * (4 << 20)
    # the executor makes each at its first access and frees it after its last: never more than two
    alive: list[set[str]] = []
    hbm: set[str] = set()
    start, free = execute._Streams.start, execute._Streams.free

    def track(fn):  # noqa: ANN001, ANN202
        def wrapped(self, i: int) -> None:
            fn(self, i)
            hbm.clear()
            hbm.update(n for n in self.ctxs[0].state.hbm if n.startswith("h"))
            alive.append(set(hbm))
        return wrapped

    monkeypatch.setattr(execute._Streams, "start", track(start))
    monkeypatch.setattr(execute._Streams, "free", track(free))
    m.run({"x": np.zeros((1024, 1024), np.float32)})
    assert set().union(*alive) == {"h0", "h1", "h2", "h3"} and max(map(len, alive)) == 2 and not alive[-1]
    t = sim.load_target("trn1")
    onchip = t.partitions * (t.sbuf_bytes + t.psum_bytes)
    need = onchip + 2 * (4 << 20) + peak  # x, y and two of h
    monkeypatch.setenv("NXSAT_SIM_MAX_BYTES", str(need))
    x = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
    np.testing.assert_array_equal(m.run({"x": x})[0], x)
    monkeypatch.setenv("NXSAT_SIM_MAX_BYTES", str(need - 1))
    with pytest.raises(NxsatError) as e:
        m.run({"x": x})
    assert e.value.code == "NCC_ERUN001"


def _many_small_accesses(n: int) -> str:
    engines = ["dve", "act", "pool"]
    lines = [".isa 1.0", ".target trn1", "sbuf t: f32[128, 8000]", "sem s"]
    lines += [f"{engines[i % 3]} memset t[:, {i}:{i + 1}], " + (f"wait=s>={i}, " if i else "") + "signal=s"
              for i in range(n)]
    return "\n".join(lines) + "\n"


def test_checking_many_small_accesses_stays_linear() -> None:
    """Writes of distinct columns of one tile, on three streams ordered by one semaphore: the race and
    happens-before analyses look only at accesses that may overlap (this took minutes for 4000 when
    every access was compared with every earlier one). 4x the instructions must cost about 4x the
    function calls to assemble and load (comparing all pairs would be 16x); seconds are in
    bench/unit_timings.py."""
    work = {}
    for n in (500, 2000):
        text = _many_small_accesses(n)
        with CallCounter() as c:
            m = sim.load(sim.assemble(text, "many.nxs"), verify=True)  # the race analysis at build and at load
        work[n] = c.calls
        assert m.linked.hb(0, n - 1)
    assert work[2000] < 4 * work[500] * 1.25, work

"""The executor runs streams side by side (sim/execute.py, ``_Streams``): large numpy work finishes on
host threads while the streams go on. Any order the semaphores allow must give the bits of the
verifier's order, and a stream must not pass an instruction of its own that has still to write what
the next one touches (same-engine dependences need no semaphore)."""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest

from nxsat import sim
from nxsat.sim import execute, isa
from nxsat.sim import numerics as nm

THREADS = ("1", "2")


def _program(lines: list[str]) -> sim.Model:
    return sim.load(sim.assemble("\n".join([".isa 1.0", ".target trn1", *lines]) + "\n", "streams"))


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


@pytest.mark.parametrize("threads", THREADS)
def test_a_stream_waits_for_its_own_unfinished_writes(threads: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """exp over a large tile finishes on a host thread; the next activation on the same engine reads
    its result (read after write), the one after overwrites it (write after write). Neither has a
    semaphore: stream order is the dependence."""
    monkeypatch.setenv("NXSAT_SIM_THREADS", threads)
    n = nm.OFFLOAD_MIN // 128
    m = _program([f"input x: f32[128, {n}]", f"output y1: f32[128, {n}]", f"output y2: f32[128, {n}]",
                  f"sbuf xs: f32[128, {n}]", f"sbuf t1: f32[128, {n}]", f"sbuf t2: f32[128, {n}]", "sem s",
                  "sem d",
                  "q0 dma xs, x, signal=s",
                  "act activation t1, xs, func=exp, wait=s>=1",
                  "act activation t2, t1, func=exp",
                  "act activation t1, xs, func=square, signal=d",
                  "q0 dma y1, t1, wait=d>=1",
                  "q1 dma y2, t2, wait=d>=1"])
    x = np.random.default_rng(0).uniform(-2, 1, (128, n)).astype(np.float32)
    y1, y2 = m.run({"x": x})
    np.testing.assert_array_equal(y1, x * x)
    np.testing.assert_array_equal(y2, _f32(np.exp(_f32(np.exp(x.astype(np.float64))).astype(np.float64))))


def test_the_same_engine_check_is_what_keeps_it_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: without the check a stream passes its own unfinished exp (made slow, so the host thread
    cannot finish first), and the test above fails."""
    exp = nm.ACTIVATIONS["exp"]

    def slow_exp(t: np.ndarray) -> np.ndarray:
        time.sleep(0.05)
        return exp(t)

    monkeypatch.setitem(nm.ACTIVATIONS, "exp", slow_exp)
    monkeypatch.setattr(execute, "_touches", lambda *a: False)
    with pytest.raises(AssertionError):
        test_a_stream_waits_for_its_own_unfinished_writes("2", monkeypatch)


@pytest.mark.parametrize("threads", THREADS)
def test_a_group_of_mixed_contractions_on_a_host_thread(threads: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An accumulation group whose members contract 128, 64 and 128 partitions, large enough to finish
    on a host thread: each product exact and rounded once to fp32, added in fp32 in program order."""
    monkeypatch.setenv("NXSAT_SIM_THREADS", threads)
    ks = (128, 64, 128)
    assert sum(k * 128 * 512 for k in ks) >= isa.OFFLOAD_MACS
    m = _program(["input w: bf16[128, 3, 128]", "input x: bf16[128, 3, 512]", "output y: f32[128, 512]",
                  "sbuf ws: bf16[128, 3, 128]", "sbuf xs: bf16[128, 3, 512]", "sbuf ys: f32[128, 512]",
                  "psum acc: f32[128, 512]", "sem l", "sem mm", "sem c",
                  "q0 dma ws, w, signal=l", "q1 dma xs, x, signal=l",
                  "pe matmul acc, ws[:, 0, :], xs[:, 0, :], start=true, wait=l>=2",
                  "pe matmul acc, ws[0:64, 1, :], xs[0:64, 1, :]",
                  "pe matmul acc, ws[:, 2, :], xs[:, 2, :], stop=true, signal=mm",
                  "dve tensor_copy ys, acc, wait=mm>=1, signal=c",
                  "q0 dma y, ys, wait=c>=1"])
    rng = np.random.default_rng(1)
    w = rng.standard_normal((128, 3, 128)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((128, 3, 512)).astype(ml_dtypes.bfloat16)
    want = np.zeros((128, 512), np.float32)
    for j, k in enumerate(ks):
        a, b = w[:k, j, :].astype(np.float64), x[:k, j, :].astype(np.float64)
        want += _f32(a.T @ b)
    np.testing.assert_array_equal(m.run({"w": w, "x": x})[0], want)


def test_an_error_on_a_host_thread_is_raised_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a host thread raises reaches the caller once the other threads have stopped."""
    monkeypatch.setenv("NXSAT_SIM_THREADS", "2")

    def fail(members: list) -> np.ndarray:
        raise RuntimeError("planted")

    monkeypatch.setattr(isa, "_group_sum", fail)
    with pytest.raises(RuntimeError, match="planted"):
        test_a_group_of_mixed_contractions_on_a_host_thread("2", monkeypatch)

"""The semantic checks bite: each test plants a bug in the executor (monkeypatch) and shows that the
check of the affected instruction, which passes on the real executor, then fails.

The bugs are planted where the executor computes (``nxsat.sim.numerics`` tables, ``nxsat.dtypes``,
the instruction classes of ``nxsat.sim.isa``), through the instruction's view of memory where needed
(``_Proxy``), so the programs still go through assemble, load and run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import semchecks as sc
from scipy import special

from nxsat import dtypes as dt
from nxsat.sim import isa
from nxsat.sim import numerics as nm


def bites(check: Callable[..., None], *args: Any, **kwargs: Any) -> Callable[[], None]:
    """The check passes as things are; returns a function that asserts it fails once the bug is in."""
    check(*args, **kwargs)

    def planted() -> None:
        with pytest.raises(AssertionError):
            check(*args, **kwargs)

    return planted


class _Proxy:
    """An instruction's memory (isa.ExecCtx) with some reads or writes altered."""

    def __init__(self, x: Any, read: Callable[[Any, np.ndarray], np.ndarray] | None = None,
                 write: Callable[[Any, np.ndarray], np.ndarray] | None = None) -> None:
        self._x, self._read, self._write = x, read, write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._x, name)

    def read(self, ra: Any) -> np.ndarray:
        v = self._x.read(ra)
        return self._read(ra, v) if self._read else v

    def write(self, ra: Any, values: np.ndarray) -> None:
        self._x.write(ra, self._write(ra, values) if self._write else values)


def _f64(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(x.astype(np.float64)).astype(np.float32)
    return run


# --- activation functions -------------------------------------------------------------------------------

def test_sigmoid_of_minus_x_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_activation, "act", "f32", "f32", ["sigmoid"])
    monkeypatch.setitem(nm.ACTIVATIONS, "sigmoid", _f64(lambda x: special.expit(-x)))
    planted()


def test_silu_off_by_a_tiny_constant_is_caught(monkeypatch) -> None:
    """x * sigmoid(x) + 2^-24: less than one fp32 ulp for results of magnitude 1 and above."""
    planted = bites(sc.check_activation, "act", "f32", "f32", ["silu"])
    monkeypatch.setitem(nm.ACTIVATIONS, "silu", _f64(lambda x: x * special.expit(x) + 2.0**-24))
    planted()


def test_gelu_computed_as_gelu_tanh_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_activation, "act", "bf16", "bf16", ["gelu"])
    monkeypatch.setitem(nm.ACTIVATIONS, "gelu", nm.ACTIVATIONS["gelu_tanh"])
    planted()


@pytest.mark.parametrize("func", ["exp", "log", "tanh", "softplus", "rsqrt", "sin", "cos"])
def test_fp32_instead_of_correctly_rounded_transcendentals_is_caught(monkeypatch, func: str) -> None:
    """The same function evaluated in fp32 by numpy (not correctly rounded, off by an ulp here and there)."""
    np_fn = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "softplus": lambda x: np.logaddexp(np.float32(0), x),
             "rsqrt": lambda x: np.float32(1) / np.sqrt(x), "sin": np.sin, "cos": np.cos}[func]
    planted = bites(sc.check_activation, "act", "f32", "f32", [func])

    def f32_version(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(np_fn(x.astype(np.float32)), np.float32)

    monkeypatch.setitem(nm.ACTIVATIONS, func, f32_version)
    planted()


def test_scale_ignored_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_activation, "act", "f32", "f32", ["identity"])
    orig = isa.Activation.run

    def run(self: Any, x: Any, c: Any) -> None:
        orig(self, x, dataclasses.replace(c, attrs={**c.attrs, "scale": 1.0}))

    monkeypatch.setattr(isa.Activation, "run", run)
    planted()


def test_accum_of_rounded_results_is_caught(monkeypatch) -> None:
    """accum must sum the fp32 results, not the values rounded to dst's type."""
    planted = bites(sc.check_activation, "act", "bf16", "bf16", ["exp"])
    orig = isa.Activation.run

    def run(self: Any, x: Any, c: Any) -> None:
        dst, acc = c.ops[0], c.attrs["accum"]

        def write(ra: Any, values: np.ndarray) -> np.ndarray:
            if acc is not None and ra is acc:
                stored = x.read(dst).astype(np.float32).reshape(dst.partitions, -1)
                return np.add.reduce(stored, axis=1, dtype=np.float32).reshape(acc.shape)
            return values

        orig(self, _Proxy(x, write=write), c)

    monkeypatch.setattr(isa.Activation, "run", run)
    planted()


# --- ALU operations -------------------------------------------------------------------------------------

def test_rsub_with_swapped_operands_is_caught(monkeypatch) -> None:
    tt = bites(sc.check_tensor_tensor, "dve", "f32", "f32", "f32", ["rsub"])
    ts = bites(sc.check_tensor_scalar, "pool", "s32", "s32", ["rsub"])
    monkeypatch.setitem(nm.BINARY, "rsub", np.subtract)
    tt()
    ts()


@pytest.mark.parametrize("dtype", ["f32", "bf16", "s32", "u8"])
def test_lt_and_le_exchanged_are_caught(monkeypatch, dtype: str) -> None:
    lt = bites(sc.check_tensor_tensor, "dve", dtype, dtype, dtype, ["lt"])
    le = bites(sc.check_tensor_scalar, "pool", dtype, dtype, ["le"])
    lt_, le_ = nm.BINARY["lt"], nm.BINARY["le"]
    monkeypatch.setitem(nm.BINARY, "lt", le_)
    monkeypatch.setitem(nm.BINARY, "le", lt_)
    lt()
    le()


def test_abs_max_without_the_second_abs_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_tensor_tensor, "pool", "bf16", "bf16", "bf16", ["abs_max"])
    monkeypatch.setitem(nm.BINARY, "abs_max", lambda a, b: np.maximum(np.abs(a), b))
    planted()


@pytest.mark.parametrize("op,wrong", [
    ("div", lambda a, b: a // np.where(b == 0, 1, b)),  # floor division, not truncation
    ("shl", lambda a, b: np.left_shift(a, np.clip(b, 0, 31))),  # counts clamped at 31, not 63
    ("shr", lambda a, b: np.right_shift(a & 0xFFFFFFFF, np.clip(b, 0, 63))),  # logical, not arithmetic
    ("pow", lambda a, b: np.power(a, np.abs(b)))])  # |exponent|, not max(exponent, 0)
def test_integer_rules_are_caught(monkeypatch, op: str, wrong: Callable[..., np.ndarray]) -> None:
    planted = bites(sc.check_tensor_tensor, "pool", "s32", "s32", "s32", [op])
    orig = nm.BINARY[op]
    monkeypatch.setitem(nm.BINARY, op, lambda a, b: wrong(a, b) if a.dtype.kind == "i" else orig(a, b))
    planted()


def test_exact_integer_arithmetic_on_vector_engine_is_caught(monkeypatch) -> None:
    """VectorE computes integer arithmetic in fp32; the model before that was exact everywhere."""
    planted = bites(sc.check_tensor_tensor, "dve", "s32", "s32", "s32", ["add", "mul"])
    orig = nm.compute_domain
    monkeypatch.setattr(nm, "compute_domain", lambda engine, op, types, exact_engines=frozenset(),
                        exact_types=frozenset(): orig(engine, op, types, exact_engines | {"dve"}, exact_types))
    planted()


def test_gpsimd_integers_through_fp32_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_tensor_scalar, "pool", "u32", "u32", ["add", "max"])
    orig = nm.compute_domain
    monkeypatch.setattr(nm, "compute_domain", lambda engine, op, types, exact_engines=frozenset(),
                        exact_types=frozenset(): orig(engine, op, types, frozenset(), exact_types))
    planted()


def test_fp32_rounding_between_chained_steps_skipped_is_caught(monkeypatch) -> None:
    """tensor_scalar rounds op0's result to fp32 before op1: computing the chain in float64 differs."""
    planted = bites(sc.check_tensor_scalar, "dve", "f32", "f32", ["mul", "add"])
    monkeypatch.setattr(nm, "load", lambda x, domain: np.asarray(x).astype(np.float64) if domain == "f32"
                        else np.asarray(x).astype(np.int64))
    planted()


# --- instructions ---------------------------------------------------------------------------------------

def test_bn_aggr_sample_variance_is_caught(monkeypatch) -> None:
    """The variance divided by n - 1 instead of n (off by n / (n - 1))."""
    planted = bites(sc.check_bn, "f32")
    orig = isa.BnAggr.run

    def run(self: Any, x: Any, c: Any) -> None:
        dst, src = c.ops
        n = x.read(src).astype(np.float64).reshape(src.partitions, -1, 3)[..., 0].sum(axis=1)

        def write(ra: Any, values: np.ndarray) -> np.ndarray:
            v = np.array(values, np.float64).reshape(dst.partitions, 2)
            v[:, 1] *= n / (n - 1)
            return v.astype(np.float32).reshape(dst.shape)

        orig(self, _Proxy(x, write=write), c)

    monkeypatch.setattr(isa.BnAggr, "run", run)
    planted()


def test_gather_off_by_one_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_gather, "f32")
    orig = isa.Gather.run

    def run(self: Any, x: Any, c: Any) -> None:
        idx = c.ops[2]
        orig(self, _Proxy(x, read=lambda ra, v: v + 1 if ra is idx else v), c)

    monkeypatch.setattr(isa.Gather, "run", run)
    planted()


def test_gather_of_an_out_of_range_index_wrapping_around_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_gather, "bf16", "s32", True)
    orig = isa.Gather.run

    def run(self: Any, x: Any, c: Any) -> None:
        idx, rows = c.ops[2], c.ops[1].shape[0]
        orig(self, _Proxy(x, read=lambda ra, v: np.mod(v, rows).astype(v.dtype) if ra is idx else v), c)

    monkeypatch.setattr(isa.Gather, "run", run)
    planted()


def test_scatter_first_write_wins_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_scatter, "f32", "set")
    orig = isa.Scatter.run

    def run(self: Any, x: Any, c: Any) -> None:
        _, idx, src = c.ops

        def read(ra: Any, v: np.ndarray) -> np.ndarray:
            if ra is idx:
                return v.reshape(-1)[::-1].reshape(v.shape)
            if ra is src:
                return v.reshape(idx.size, -1)[::-1].reshape(v.shape)
            return v

        orig(self, _Proxy(x, read=read), c)

    monkeypatch.setattr(isa.Scatter, "run", run)
    planted()


def test_tensor_reduce_max_computing_min_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_tensor_reduce, "dve", "f32", "f32", ["max"])
    monkeypatch.setitem(nm.REDUCE, "max", np.minimum.reduce)
    planted()


def test_tensor_reduce_accumulating_in_the_source_type_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_tensor_reduce, "pool", "bf16", "bf16", ["add"])
    monkeypatch.setattr(nm, "load", lambda x, domain: np.asarray(x) if domain == "f32" else nm.to_int(x))
    planted()


def test_matmul_tf32_rounding_skipped_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_matmul, "f32", "tf32")
    monkeypatch.setattr(dt, "round_tf32", lambda x: np.asarray(x, np.float32))
    planted()


def test_matmul_products_rounded_to_the_operand_type_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_matmul, "bf16")

    def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        prods = (a[:, :, None] * b[:, None, :]).astype(dt.BF16.np).astype(np.float32)
        return prods.sum(axis=0, dtype=np.float32)

    def run(self: Any, x: Any, c: Any) -> None:
        dst, st, mv = c.ops
        s = nm.to_f32(x.read(st)).reshape(st.partitions, -1)
        m = nm.to_f32(x.read(mv)).reshape(st.partitions, -1)
        r = matmul(s, m)
        if not c.attrs["start"]:
            r = nm.to_f32(x.read(dst)).reshape(r.shape) + r
        x.write(dst, r.reshape(dst.shape))

    monkeypatch.setattr(isa.Matmul, "run", run)
    planted()


def test_matmul_start_not_clearing_the_accumulator_is_caught(monkeypatch) -> None:
    """A group's sums added to what PSUM held before its start=true matmul."""
    planted = bites(sc.check_matmul, "f16")
    orig = isa.Matmul.run

    def run(self: Any, x: Any, c: Any) -> None:
        dst = c.ops[0]
        orig(self, _Proxy(x, write=lambda ra, v: np.asarray(v) + x.read(dst).reshape(np.shape(v))
                          if ra is dst else v), c)

    monkeypatch.setattr(isa.Matmul, "run", run)
    planted()


def test_matmul_double_row_contracting_one_row_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_matmul_double_row, "f8e4m3fn")
    orig = isa.Matmul.run

    def run(self: Any, x: Any, c: Any) -> None:
        _, st, mv = c.ops
        rows = {st, mv} if c.attrs["perf"] == "double_row" else set()

        def read(ra: Any, v: np.ndarray) -> np.ndarray:
            if ra in rows:  # the second row of every partition dropped
                v = np.array(v)
                v[:, 1] = 0
            return v

        orig(self, _Proxy(x, read=read), c)

    monkeypatch.setattr(isa.Matmul, "run", run)
    planted()


def test_trn1_transpose_without_the_identity_matmul_is_caught(monkeypatch) -> None:
    """NeuronCore-v2 transposes through a matmul: a NaN or infinity spreads along its output row."""
    planted = bites(sc.check_transpose, "bf16", "f32", "trn1")

    def run(self: Any, x: Any, c: Any) -> None:
        dst, src = c.ops
        x.write(dst, nm.to_f32(x.read(src).reshape(src.partitions, -1)).T.reshape(dst.shape))

    monkeypatch.setattr(isa.Transpose, "run", run)
    planted()


def test_dma_transpose_of_the_wrong_dimensions_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_dma_transpose, "bf16")

    def run(self: Any, x: Any, c: Any) -> None:
        dst, src = c.ops
        x.write_raw(dst, np.ascontiguousarray(x.read(src)).reshape(dst.shape))  # a reshape, not a transpose

    monkeypatch.setattr(isa.DmaTranspose, "run", run)
    planted()


def test_gather_zeroing_rows_it_does_not_write_is_caught(monkeypatch) -> None:
    """An out-of-range row is left unwritten, not zeroed."""
    planted = bites(sc.check_gather, "f32", "s32", True)

    def run(self: Any, x: Any, c: Any) -> None:
        dst, table, idx = c.ops
        t = x.read(table).reshape(table.shape[0], -1)
        i = nm.to_int(x.read(idx)).reshape(-1)
        ok = (i >= 0) & (i < t.shape[0])
        out = np.zeros((i.size, t.shape[1]), t.dtype)
        out[ok] = t[i[ok]]
        x.warn("failed to run scatter/gather (indirect memory copy gather at line 1), due to out-of-bound access")
        x.write_raw(dst, out.reshape(dst.shape))

    monkeypatch.setattr(isa.Gather, "run", run)
    planted()


def test_oob_skip_still_warning_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_gather, "bf16", "s32", True, mode="skip")
    orig = isa.Gather.run
    monkeypatch.setattr(isa.Gather, "run", lambda self, x, c: orig(self, x, dataclasses.replace(
        c, attrs={**c.attrs, "oob": "error"})))
    planted()


def test_transpose_moving_bits_into_a_wider_type_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_transpose, "s32", "f32")

    def run(self: Any, x: Any, c: Any) -> None:
        dst, src = c.ops
        x.write_raw(dst, np.ascontiguousarray(x.read(src).T).view(dst.dtype.np).reshape(dst.shape))

    monkeypatch.setattr(isa.Transpose, "run", run)
    planted()


def test_same_type_copy_on_scalar_engine_moving_bits_is_caught(monkeypatch) -> None:
    """ScalarE's copy goes through fp32 (an s32 above 2^24 rounds); VectorE and GpSimd move bits."""
    planted = bites(sc.check_tensor_copy, "act", "s32", ["s32"])
    monkeypatch.setattr(isa.TensorCopy, "domains", lambda self, c, target: ("raw",) if c.ops[0].dtype is
                        c.ops[1].dtype else ("f32",))
    planted()


def test_e4m3_cast_without_saturation_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_tensor_copy, "dve", "f32", ["f8e4m3fn"])
    from nxsat.sim.target import Target

    monkeypatch.setattr(Target, "fp8_saturates", lambda self, name: False)
    planted()


def test_select_inverted_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_select, "pool")
    orig = isa.Select.run

    def run(self: Any, x: Any, c: Any) -> None:
        orig(self, x, dataclasses.replace(c, ops=[c.ops[0], c.ops[1], c.ops[3], c.ops[2]]))

    monkeypatch.setattr(isa.Select, "run", run)
    planted()


def test_iota_channel_multiplier_ignored_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_iota, "pool", "s32")
    orig = isa.Iota.run

    def run(self: Any, x: Any, c: Any) -> None:
        orig(self, x, dataclasses.replace(c, attrs={**c.attrs, "channel_multiplier": 0}))

    monkeypatch.setattr(isa.Iota, "run", run)
    planted()


def test_integer_memset_through_fp32_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_memset, "dve", ["s32"])
    monkeypatch.setattr(isa.Memset, "run", lambda self, x, c: x.write(c.ops[0], np.full(c.ops[0].shape,
                                                                                         c.attrs["value"], np.float32)))
    planted()


def test_dma_copying_in_memory_order_is_caught(monkeypatch) -> None:
    """A permuted source copied in its memory order rather than the access pattern's."""
    planted = bites(sc.check_dma, "bf16")

    def run(self: Any, x: Any, c: Any) -> None:
        dst, src = c.ops
        x.write_raw(dst, np.ravel(x.read(src), order="K").reshape(dst.shape))

    monkeypatch.setattr(isa.Dma, "run", run)
    planted()


def test_all_gather_in_reverse_rank_order_is_caught(monkeypatch) -> None:
    planted = bites(sc.check_collective, "all_gather", "f32", ranks=4)

    def run_all(self: Any, xs: list[Any], c: Any) -> None:
        dst, src = c.ops
        v = np.concatenate([x.read(src) for x in reversed(xs)], axis=c.attrs["axis"])
        for x in xs:
            x.write_raw(dst, v.reshape(dst.shape))

    monkeypatch.setattr(isa.AllGather, "run_all", run_all)
    planted()


def test_all_reduce_exact_instead_of_fp32_is_caught(monkeypatch) -> None:
    """Collectives compute in fp32: s32 values above 2^24 round (two ranks: one rounding, any order)."""
    planted = bites(sc.check_collective, "all_reduce", "s32")

    def run_all(self: Any, xs: list[Any], c: Any) -> None:
        dst, src = c.ops
        total = sum(x.read(src).astype(np.int64) for x in xs)
        for x in xs:
            x.write_raw(dst, total.astype(dst.dtype.np).reshape(dst.shape))

    monkeypatch.setattr(isa.AllReduce, "run_all", run_all)
    planted()

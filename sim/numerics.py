"""Device numerics: where the NeuronCore rounds, and how.

Engines other than TensorE read any element type, compute in fp32 and cast on output; TensorE
multiplies exactly and accumulates in fp32 in PSUM. So the rounding points are: the fp32 result of
each engine step, and the cast to the destination type (round to nearest even; fp8 e4m3 saturates
at +-448 as the target spec says). Integer-only instructions compute exactly in 64 bits and wrap
to the destination type. Transcendental functions are correctly rounded fp32 results: the
device's own approximation error is not published and not modeled.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import ml_dtypes
import numpy as np

from nxsat import dtypes as dt

F32 = np.float32
T = TypeVar("T")

ALLOWED_DTYPES = ("f32", "bf16", "f16", "f8e4m3fn", "f8e5m2", "s32", "u32", "s16", "u16", "s8", "u8")
HBM_ONLY_DTYPES = ("pred",)
FP8_MAX = {"f8e4m3fn": float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max),
           "f8e5m2": float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)}


def to_f32(x: np.ndarray) -> np.ndarray:
    """An engine's input cast: every storage type widens to fp32 (exactly, except 32-bit ints)."""
    return np.asarray(x).astype(F32, copy=False)


def to_int(x: np.ndarray) -> np.ndarray:
    """An integer-only instruction's input: exact in 64 bits."""
    return np.asarray(x).astype(np.int64, copy=False)


def device_cast(x: np.ndarray, dtype: dt.DType, saturate_fp8: bool) -> np.ndarray:
    """An engine's output cast of fp32 (or exact int64) values to a storage type."""
    a = np.asarray(x)
    if dtype.is_pred:
        return a != 0
    if dtype.is_int:
        if a.dtype.kind in "iub":
            return a.astype(dtype.np)  # wraps, two's complement
        return dt.cast(a.astype(F32, copy=False), dtype)  # truncate toward zero, saturate, NaN -> 0
    a = a.astype(F32, copy=False)
    if dtype.name in FP8_MAX and saturate_fp8:
        m = FP8_MAX[dtype.name]
        a = np.clip(a, -m, m)  # NaN stays NaN
    with np.errstate(over="ignore", invalid="ignore"):
        return a.astype(dtype.np)


PARALLEL_MIN = 1 << 15  # elements: below this a thread hand-off costs more than it saves


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="nxsat-sim")


_local = threading.local()


@contextmanager
def alone() -> Iterator[None]:
    """The block runs beside other host threads (the executor's, finishing what instructions left):
    its numpy calls are not split again."""
    was = getattr(_local, "alone", False)
    _local.alone = True
    try:
        yield
    finally:
        _local.alone = was


def threads() -> int:
    """Host threads for the executor's large numpy calls: NXSAT_SIM_THREADS, by default the cores this
    process may use (one inside :func:`alone`)."""
    if getattr(_local, "alone", False):
        return 1
    try:
        n = int(os.environ.get("NXSAT_SIM_THREADS", "0"))
    except ValueError:
        n = 0
    return max(1, n or len(os.sched_getaffinity(0)))


def parallel_map(fn: Callable[..., T], *args: Sequence[Any]) -> list[T]:
    """``[fn(*a) for a in zip(*args)]`` over the host's threads. Numpy, scipy and BLAS release the GIL,
    and each call computes exactly what it would alone, so the thread count cannot change a bit of the
    result."""
    n = min(threads(), len(args[0]))
    if n <= 1:
        return list(map(fn, *args))
    return list(_pool(n).map(fn, *args))


def _f64(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Evaluate in float64 and round once to fp32: a correctly rounded fp32 function (~20 ns per
    element for the normal CDF behind gelu, so a large tile is split over the host's cores)."""

    def part(x: np.ndarray, out: np.ndarray) -> None:
        with np.errstate(all="ignore"):
            out[...] = fn(x.astype(np.float64))

    def run(x: np.ndarray) -> np.ndarray:
        out = np.empty(np.shape(x), F32)
        n = threads() if out.size >= PARALLEL_MIN else 1
        flat, dst = np.ravel(x), out.reshape(-1)
        spans = [slice(flat.size * i // n, flat.size * (i + 1) // n) for i in range(n)]
        parallel_map(part, [flat[s] for s in spans], [dst[s] for s in spans])
        return out

    run.costly = True  # type: ignore[attr-defined]
    return run


def _special() -> Any:
    """scipy.special, imported where an activation first needs it: the import is 0.2 s of a compile's
    start-up, and most programs never evaluate one of these on the host."""
    from scipy import special

    return special


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    # 0.5 x (1 + tanh y) == x sigmoid(2y): no cancellation in the far negative tail
    return x * _special().expit(2.0 * np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))


def _f32(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """A function IEEE fp32 arithmetic already rounds correctly (exact, or one correctly rounded
    operation): the same bits as the fp64 evaluation, several times faster."""

    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(x.astype(F32, copy=False)), dtype=F32)

    return run


_ZERO = F32(0.0)
_ONE = F32(1.0)

# ScalarE functions f(t), t = scale * x + bias in fp32.
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": _f32(lambda x: x),
    "exp": _f64(np.exp),
    "log": _f64(np.log),
    "tanh": _f64(np.tanh),
    "sigmoid": _f64(lambda x: _special().expit(x)),
    "relu": _f32(lambda x: np.maximum(x, _ZERO)),
    "gelu": _f64(lambda x: x * _special().ndtr(x)),  # the normal CDF: no cancellation for x << 0
    "gelu_tanh": _f64(_gelu_tanh),
    "silu": _f64(lambda x: x * _special().expit(x)),
    "softplus": _f64(lambda x: np.logaddexp(0.0, x)),
    "sqrt": _f32(np.sqrt),
    "rsqrt": _f64(lambda x: 1.0 / np.sqrt(x)),
    "reciprocal": _f32(lambda x: _ONE / x),
    "square": _f32(np.square),
    "abs": _f32(np.abs),
    "sign": _f32(np.sign),
    "sin": _f64(np.sin),
    "cos": _f64(np.cos),
    "erf": _f64(lambda x: _special().erf(x)),
    "arctan": _f64(np.arctan),  # ISA 1.1 (NKI's ScalarE has arctan): atan2's core, correctly rounded
}
# The functions that cost the host more than a pass over memory (the executor runs them beside the rest
# of the program when the tile is large).
COSTLY_ACTIVATIONS = frozenset(name for name, fn in ACTIVATIONS.items() if getattr(fn, "costly", False))
OFFLOAD_MIN = 1 << 15  # elements of a costly function (~0.3 ms in float64) worth a host thread of its own

# Functions added after ISA 1.0: a program of an older version that uses one is refused.
ACTIVATION_SINCE: dict[str, tuple[int, int]] = {"arctan": (1, 1)}


def matmul(s: np.ndarray, m: np.ndarray) -> np.ndarray:
    """TensorE's product of fp32 operands (``[..., M, K] @ [..., K, N]``), exact and rounded once to
    fp32: products of fp32 values are exact in fp64 and 128 of them sum there far below fp32's
    rounding, so the result is the same on every host. numpy's fp32 matmul sums in its BLAS kernel's
    order: OpenBLAS's AVX-512 and AVX2 kernels put mobilenet_v2's batch-norm gradients up to 30% apart
    (docs/compiling.md, "Checking a training step")."""
    return np.matmul(s.astype(np.float64, copy=False), m.astype(np.float64, copy=False)).astype(F32)


def _cmp(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda a, b: fn(a, b).astype(a.dtype)


def _fdiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        return a / b
    b = np.where(b == 0, 1, b)  # integer division by zero: defined as a / 1 (documented)
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q)  # truncating, like C


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":  # in float64, rounded once: numpy's fp32 pow is not correctly rounded on
        # every host (7.0 ** 10 gave 282475232 on one, where fp32's nearest is 282475264)
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return np.power(a, np.maximum(b, 0))


# Binary ALU operations of VectorE / GpSimd (and tensor_scalar's op0/op1). Float inputs are fp32
# arrays and results are fp32 (numpy's float32 arithmetic rounds like the device's fp32 ALU);
# integer inputs are int64 arrays.
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "rsub": lambda a, b: np.subtract(b, a),
    "mul": np.multiply,
    "div": _fdiv,
    "rdiv": lambda a, b: _fdiv(b, a),
    "max": np.maximum,
    "min": np.minimum,
    "pow": _pow,
    "abs_max": lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    "eq": _cmp(np.equal),
    "ne": _cmp(np.not_equal),
    "lt": _cmp(np.less),
    "le": _cmp(np.less_equal),
    "gt": _cmp(np.greater),
    "ge": _cmp(np.greater_equal),
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "shl": lambda a, b: np.left_shift(a, np.clip(b, 0, 63)),
    "shr": lambda a, b: np.right_shift(a, np.clip(b, 0, 63)),
}
INT_ONLY_OPS = frozenset({"and", "or", "xor", "shl", "shr"})

# tensor_reduce operations and the identity each starts from.
REDUCE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add.reduce,
    "mul": np.multiply.reduce,
    "max": np.maximum.reduce,
    "min": np.minimum.reduce,
}

COLLECTIVE_REDUCE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "max": np.maximum, "min": np.minimum, "mul": np.multiply,
}


def compute_domain(engine: str, op: str | None, types: tuple[dt.DType, ...] | list[dt.DType],
                   exact_engines: frozenset[str] = frozenset(), exact_types: frozenset[str] = frozenset()) -> str:
    """Where an engine computes ``op`` on tiles of ``types``: ``int`` (exact, in 64 bits, wrapped on
    writing) or ``f32``.

    The NKI ISA reference documents it: arithmetic on VectorE and ScalarE converts every input to fp32
    (an int32 above 2**24 loses its low bits), bitwise operators treat integers as bit patterns, and
    GpSimd uses native integer arithmetic when every tile is a 32-bit integer (``exact_engines`` and
    ``exact_types``, from the target spec). ``op`` None is a plain move (copy, select, reduce's
    identity), which is exact when nothing converts."""
    if not all(t.is_int for t in types):
        return "f32"
    if op in INT_ONLY_OPS:
        return "int"
    if engine in exact_engines and all(t.name in exact_types for t in types):
        return "int"
    return "f32"


def load(x: np.ndarray, domain: str) -> np.ndarray:
    """An operand widened to its instruction's compute domain (``int``: int64, ``f32``: fp32)."""
    return to_int(x) if domain == "int" else to_f32(x)

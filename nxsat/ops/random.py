"""Random-number operators: rng-bit-generator (bit-exact with XLA) and rng (distributions).

rng-bit-generator computes what XLA's RngBitGeneratorExpander builds (xla/hlo/builder/lib/prng.cc):
the state is ``[key, counter...]`` (u64); the key stays, the counter advances by the number of
blocks drawn. ``rng_default`` is Philox, as on XLA's CPU and GPU back ends.

* Threefry-2x32 (20 rounds), state u64[2]: 64-bit counters ``state[1] + i``, split into two u32
  words, encrypted under the key's two u32 halves. 32-bit (and narrower) outputs draw half as
  many blocks as elements: the shape is halved along its first even dimension (else its largest)
  and the two output words of a block become neighbours along that dimension. 64-bit outputs draw
  one block per element (low word | high word << 32). 8/16-bit outputs are the 32-bit output
  truncated. The counter advances by the number of blocks.
* Philox-4x32 (10 rounds), state u64[3] = (key, counter low, counter high) or u64[2] = (key,
  counter low) with the key doubling as the counter's high word; a 128-bit counter per block of
  four u32 outputs (two u64), laid out round-robin; the new state keeps u64[2]'s high word.

rng (``rng_uniform`` over [a, b), ``rng_normal`` with mean a and deviation b) is
implementation-defined in XLA; nxsat draws from numpy's PCG64 seeded from the node's name, so a
graph gives the same numbers on every run (and a node in a loop the same numbers each iteration).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.ir import TensorType, TupleType, Type
from nxsat.ops.common import count, tensor, tensors, to_dtype
from nxsat.ops.registry import GPSIMD, Ctx, ShapeError, op

ALGORITHMS = ("rng_default", "rng_three_fry", "rng_philox")
STATE_SIZES = {"rng_default": (2, 3), "rng_three_fry": (2,), "rng_philox": (2, 3)}

_U32 = np.uint32
_U64 = np.uint64
_MASK32 = _U64(0xFFFFFFFF)


def _lo(x: np.ndarray) -> np.ndarray:
    return (x & _MASK32).astype(_U32)


def _hi(x: np.ndarray) -> np.ndarray:
    return (x >> _U64(32)).astype(_U32)


def _join(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.astype(_U64) | (hi.astype(_U64) << _U64(32))


# --- Threefry-2x32 ---------------------------------------------------------------------------

_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = _U32(0x1BD11BDA)


def threefry2x32(key: tuple[np.ndarray, np.ndarray], x: tuple[np.ndarray, np.ndarray]) -> tuple[
        np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011) on u32 arrays, as XLA computes it."""
    ks = (_U32(key[0]), _U32(key[1]), _U32(key[0]) ^ _U32(key[1]) ^ _THREEFRY_PARITY)
    with np.errstate(over="ignore"):  # u32 arithmetic wraps, as intended
        x0 = np.asarray(x[0], _U32) + ks[0]
        x1 = np.asarray(x[1], _U32) + ks[1]
        for group in range(5):
            for r in _THREEFRY_ROTATIONS[group % 2]:
                x0 = x0 + x1
                x1 = (x1 << _U32(r)) | (x1 >> _U32(32 - r))
                x1 = x0 ^ x1
            x0 = x0 + ks[(group + 1) % 3]
            x1 = x1 + ks[(group + 2) % 3] + _U32(group + 1)
    return x0, x1


def _split_in_halves(shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """XLA's SplitShapeIntoHalves: the dimension to halve and the block grid's shape."""
    if not shape:
        return 0, (1,)
    even = [d for d, n in enumerate(shape) if n % 2 == 0]
    split = even[0] if even else int(np.argmax(shape))
    return split, shape[:split] + (-(-shape[split] // 2),) + shape[split + 1:]


def _threefry_bits(state: np.ndarray, shape: tuple[int, ...], bits: int) -> tuple[np.ndarray, np.ndarray]:
    key = (_lo(state[0]), _hi(state[0]))
    if bits == 64:
        blocks = int(np.prod(shape, dtype=np.int64))
        counters = state[1] + np.arange(blocks, dtype=_U64)
        y0, y1 = threefry2x32(key, (_lo(counters), _hi(counters)))
        values = _join(y0, y1).reshape(shape)
    else:
        split, grid = _split_in_halves(shape)
        blocks = int(np.prod(grid, dtype=np.int64))
        counters = state[1] + np.arange(blocks, dtype=_U64)
        y0, y1 = threefry2x32(key, (_lo(counters), _hi(counters)))
        if not shape:
            values = y0[0]
        else:
            # The two words of a block are neighbours along the halved dimension.
            pair = np.stack([y0.reshape(grid), y1.reshape(grid)], axis=split + 1)
            values = pair.reshape(grid[:split] + (2 * grid[split],) + grid[split + 1:])
            values = values[tuple(slice(0, n) for n in shape)]
    new_state = np.array([state[0], state[1] + _U64(blocks)], dtype=_U64)
    return np.asarray(values), new_state


# --- Philox-4x32 -----------------------------------------------------------------------------

_PHILOX_MUL = (_U64(0xD2511F53), _U64(0xCD9E8D57))
_PHILOX_STEP = (_U32(0x9E3779B9), _U32(0xBB67AE85))


def philox4x32(key: tuple[np.ndarray, np.ndarray], c: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Philox-4x32 with 10 rounds on u32 arrays, as XLA computes it."""
    k0, k1 = _U32(key[0]), _U32(key[1])
    c0, c1, c2, c3 = (np.asarray(v, _U32) for v in c)
    with np.errstate(over="ignore"):  # u32 arithmetic wraps, as intended
        for _ in range(10):
            p0 = c0.astype(_U64) * _PHILOX_MUL[0]
            p1 = c2.astype(_U64) * _PHILOX_MUL[1]
            c0, c1, c2, c3 = _hi(p1) ^ c1 ^ k0, _lo(p1), _hi(p0) ^ c3 ^ k1, _lo(p0)
            k0, k1 = k0 + _PHILOX_STEP[0], k1 + _PHILOX_STEP[1]
    return c0, c1, c2, c3


def _philox_bits(state: np.ndarray, shape: tuple[int, ...], bits: int) -> tuple[np.ndarray, np.ndarray]:
    key = (_lo(state[0]), _hi(state[0]))
    low, high = (state[1], state[2]) if len(state) >= 3 else (state[1], state[0])
    n = int(np.prod(shape, dtype=np.int64))
    blocks = -(-(2 * n if bits == 64 else n) // 4)
    counter_lo = low + np.arange(blocks, dtype=_U64)
    counter_hi = np.where(counter_lo < low, high + _U64(1), high).astype(_U64)
    b = philox4x32(key, (_lo(counter_lo), _hi(counter_lo), _lo(counter_hi), _hi(counter_hi)))
    if bits == 64:
        words = np.stack([_join(b[0], b[1]), _join(b[2], b[3])], axis=1)
    else:
        words = np.stack(b, axis=1)
    values = words.reshape(-1)[:n].reshape(shape)
    new_low = low + _U64(blocks)
    new_high = high + _U64(1) if new_low < low else high
    new_state = [state[0], new_low, new_high] if len(state) >= 3 else [state[0], new_low]
    return values, np.array(new_state, dtype=_U64)


def rng_bits(algorithm: str, state: np.ndarray, out: TensorType) -> tuple[np.ndarray, np.ndarray]:
    """(new state, random bits of type ``out``) for an rng-bit-generator."""
    state = np.asarray(state, dtype=_U64)
    bits = 64 if out.dtype.bits == 64 else 32
    gen = _threefry_bits if algorithm == "rng_three_fry" else _philox_bits
    with np.errstate(over="ignore"):
        values, new_state = gen(state, out.shape, bits)
    unsigned = np.dtype(f"u{out.dtype.itemsize}")
    # Narrow outputs keep the low bits of the 32-bit words; signed outputs are the same bits.
    values = np.asarray(values).astype(unsigned).view(out.dtype.np).reshape(out.shape)
    return new_state, values


def _rbg_infer(types: list[Type], attrs: dict) -> Type:
    count(types, 1, "rng-bit-generator")
    state = tensor(types[0], "state")
    alg = attrs.get("algorithm")
    if alg not in ALGORITHMS:
        raise ShapeError(f"rng-bit-generator: algorithm {alg!r} is not one of {', '.join(ALGORITHMS)}")
    if state.dtype is not dt.U64 or state.rank != 1:
        raise ShapeError(f"rng-bit-generator: the state must be a u64 vector, got {state}")
    if state.shape[0] not in STATE_SIZES[alg]:
        sizes = " or ".join(f"u64[{s}]" for s in STATE_SIZES[alg])
        raise ShapeError(f"rng-bit-generator: {alg} takes a state of {sizes}, got {state}")
    t = attrs.get("type")
    if not isinstance(t, TupleType) or len(t.elements) != 2:
        raise ShapeError("rng-bit-generator needs its result type (state, output)")
    out_state, out = t.elements
    if out_state != state:
        raise ShapeError(f"rng-bit-generator: the output state {out_state} must match the input state "
                         f"{state}")
    if not isinstance(out, TensorType) or not out.dtype.is_int:
        raise ShapeError(f"rng-bit-generator: the output must be an integer array, got {out}")
    return t


def _rbg_impl(args: list[Any], attrs: dict, ctx: Ctx) -> tuple[np.ndarray, np.ndarray]:
    out = attrs["type"].elements[1]
    return rng_bits(attrs["algorithm"], args[0], out)


op("rng-bit-generator", engine=GPSIMD, arity=(1, 1), impl=_rbg_impl, neuron=("RngBitGenerator",),
   notes="bit-exact with XLA: rng_default = Philox-4x32 (XLA CPU/GPU), rng_philox, rng_three_fry; the "
         "device accepts only rng_default (NCC_EVRF006) and honours 32-bit seeds")(_rbg_infer)


# --- rng -------------------------------------------------------------------------------------

DISTRIBUTIONS = ("rng_uniform", "rng_normal")


def _rng_infer(types: list[Type], attrs: dict) -> Type:
    count(types, 2, "rng")
    a, b = tensors(types)
    dist = attrs.get("distribution")
    if dist not in DISTRIBUTIONS:
        raise ShapeError(f"rng: distribution {dist!r} is not one of {', '.join(DISTRIBUTIONS)}")
    if a.shape != () or b.shape != ():
        raise ShapeError(f"rng: both parameters must be scalars, got {a} and {b}")
    if a.dtype is not b.dtype:
        raise ShapeError(f"rng: parameters differ in type: {a.dtype.name} vs {b.dtype.name}")
    if dist == "rng_normal" and not a.dtype.is_float:
        raise ShapeError(f"rng: rng_normal needs floating-point parameters, got {a.dtype.name}")
    t = attrs.get("type")
    if not isinstance(t, TensorType):
        raise ShapeError("rng needs its result type")
    if t.dtype is not a.dtype:
        raise ShapeError(f"rng: result {t} must have the parameters' type {a.dtype.name}")
    return t


def seed_of(name: str) -> int:
    """A 64-bit seed from a node's name: stable across runs, machines and Python versions."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def _rng_impl(args: list[Any], attrs: dict, ctx: Ctx) -> np.ndarray:
    t: TensorType = attrs["type"]
    a, b = (np.asarray(v) for v in args)
    gen = np.random.Generator(np.random.PCG64(seed_of(ctx.node.name)))
    if attrs["distribution"] == "rng_normal":
        z = gen.standard_normal(t.shape)
        return to_dtype(float(a) + float(b) * z, t.dtype)
    if t.dtype.is_float:
        lo, hi = float(a), float(b)
        if not lo < hi:  # XLA leaves this undefined
            return np.full(t.shape, a, dtype=t.dtype.np)
        x = to_dtype(lo + (hi - lo) * gen.random(t.shape), t.dtype)
        # Rounding may reach b; the interval is half-open.
        below = np.nextafter(b.astype(t.dtype.np), a.astype(t.dtype.np))
        return np.where(x >= b, below, x).astype(t.dtype.np)
    lo_i, hi_i = int(a), int(b)
    if not lo_i < hi_i:
        return np.full(t.shape, a, dtype=t.dtype.np)
    wide = np.uint64 if lo_i >= 0 and t.dtype.kind == "uint" else np.int64
    return gen.integers(lo_i, hi_i, size=t.shape, dtype=wide).astype(t.dtype.np)


op("rng", engine=GPSIMD, arity=(2, 2), impl=_rng_impl, neuron=("RngUniform",),
   notes="rng_uniform over [a, b) (float, integer, pred) and rng_normal(mean a, deviation b); values are "
         "implementation-defined in XLA: nxsat seeds PCG64 from the node's name (deterministic)")(_rng_infer)

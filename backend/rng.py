"""Random numbers on GpSimd: ``rng-bit-generator`` bit-exact with XLA, and ``rng`` (distributions).

``rng-bit-generator`` with ``rng_default`` is Philox-4x32-10, as XLA's CPU and GPU back ends compute
it (nxsat/ops/random.py): 10 rounds of two 32 x 32 -> 64-bit multiplies, xors and key additions, on
u32 tiles with exact integer arithmetic. GpSimd keeps the low 32 bits of a product, so the high half
is assembled from 16-bit limbs (every partial product and sum below 2**32). The other algorithms
(``rng_philox``, ``rng_three_fry``) are refused with NCC_EVRF006, as neuronx-cc refuses them
(docs/backend.md says why). A 64-bit state word is one 32-bit word on the device (NCC_WTYP001), so
the key and counters have zero high halves there: the device draws what XLA draws for a state whose
words fit 32 bits.

``rng`` (``rng_uniform``, ``rng_normal``) is implementation-defined in XLA: the device draws Philox
bits keyed by the node's name (the interpreter's seed, so a graph draws the same numbers on every
run) and maps them: uniform floats from 23 random mantissa bits, integers by a remainder, normals by
Box-Muller (ScalarE's log, sqrt and cos).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from nxsat import dtypes as dt
from nxsat.backend.elementwise import narrow
from nxsat.backend.graph import Graph, Ref
from nxsat.backend.lower import Lowering, device_dtype, lowers, onchip_dtype
from nxsat.backend.tiles import Tiles
from nxsat.diagnostics import error
from nxsat.ir import Node, TensorType, TupleType
from nxsat.ops.random import seed_of

U32, S32, F32, U8 = dt.U32, dt.S32, dt.F32, dt.U8
PHILOX_MUL = (0xD2511F53, 0xCD9E8D57)
PHILOX_STEP = (0x9E3779B9, 0xBB67AE85)
MAX_BLOCKS = 256  # Philox blocks per partition of one tile (each of its ~20 live tiles: 1 KiB)

Scalar = Ref | int  # a per-partition [P, 1] u32 tile, or a number


class _Philox:
    """Philox-4x32-10 on ``[P, B]`` u32 tiles (one block per element) on GpSimd."""

    def __init__(self, t: Tiles) -> None:
        self.t = t
        self.g = t.g

    def ts(self, a: Ref, op: str, s: Scalar, dtype: dt.DType = U32) -> Ref:
        """``a op s``, ``s`` an immediate or a per-partition scalar tile."""
        out = self.t.tile(dtype)
        self.g.add("pool", "tensor_scalar", out, a, op0=op, scalar0=s)
        return out

    def tt(self, a: Ref, op: str, b: Ref) -> Ref:
        out = self.t.tile(U32)
        self.g.add("pool", "tensor_tensor", out, a, b, op=op)
        return out

    def full(self, v: Scalar, zeros: Ref) -> Ref:
        """A tile holding ``v`` everywhere."""
        if isinstance(v, int):
            return self.t.memset(v & 0xFFFFFFFF, U32)
        return self.ts(zeros, "add", v)

    def mulhilo(self, m: int, c: Ref) -> tuple[Ref, Ref]:
        """(high, low) 32 bits of ``m * c``: the low half is GpSimd's wrapped product; the high half is
        ``ah + (s >> 16) + (s2 >> 16)`` over the 16-bit limbs c = a 2**16 + b, m = mh 2**16 + ml, with
        s = b mh + (b ml >> 16) and s2 = (s & 0xFFFF) + a ml (each below 2**32)."""
        mh, ml = m >> 16, m & 0xFFFF
        lo = self.ts(c, "mul", m)
        a, b = self.ts(c, "shr", 16), self.ts(c, "and", 0xFFFF)
        bl = self.t.tile(U32)
        self.g.add("pool", "tensor_scalar", bl, b, op0="mul", scalar0=ml, op1="shr", scalar1=16)
        s = self.tt(self.ts(b, "mul", mh), "add", bl)
        s2 = self.tt(self.ts(s, "and", 0xFFFF), "add", self.ts(a, "mul", ml))
        hi = self.tt(self.tt(self.ts(a, "mul", mh), "add", self.ts(s, "shr", 16)), "add", self.ts(s2, "shr", 16))
        return hi, lo

    def key_add(self, k: Scalar, step: int) -> Scalar:
        if isinstance(k, int):
            return (k + step) & 0xFFFFFFFF
        out = self.g.tile(k.shape, U32, "sbuf", "key").ref()
        self.g.add("pool", "tensor_scalar", out, k, op0="add", scalar0=step)
        return out

    def run(self, key: tuple[Scalar, Scalar], c: list[Ref]) -> list[Ref]:
        k0, k1 = key
        c0, c1, c2, c3 = c
        for r in range(10):
            hi0, lo0 = self.mulhilo(PHILOX_MUL[0], c0)
            hi1, lo1 = self.mulhilo(PHILOX_MUL[1], c2)
            c0 = self.ts(self.tt(hi1, "xor", c1), "xor", k0)
            c1 = lo1
            c2 = self.ts(self.tt(hi0, "xor", c3), "xor", k1)
            c3 = lo0
            if r < 9:
                k0, k1 = self.key_add(k0, PHILOX_STEP[0]), self.key_add(k1, PHILOX_STEP[1])
        return [c0, c1, c2, c3]


def _layout(n: int, per_block: int, partitions: int) -> tuple[int, int, int]:
    """(blocks, blocks per row B, rows): the flat outputs as rows of B blocks of ``per_block`` each."""
    nb = -(-n // per_block)
    b = max(1, min(MAX_BLOCKS, -(-nb // partitions)))
    return nb, b, -(-nb // b)


def _store_flat(g: Graph, out_flat: Ref, tile: Ref, e0: int, rn: int, width: int, n: int) -> None:
    """Rows of ``tile`` (``[rn, width]``) are the flat outputs ``e0 ...``: whole rows in one DMA, the last
    partial row (where the outputs end) in another."""
    full = min(rn, (n - e0) // width)
    if full > 0:
        g.add("dma", "dma", out_flat[e0:e0 + full * width].reshape(full, width), tile[0:full, :])
    rem = min(n - e0 - full * width, width)
    if full < rn and rem > 0:
        g.add("dma", "dma", out_flat[e0 + full * width:e0 + full * width + rem].reshape(1, rem),
              tile[full:full + 1, 0:rem])


Emit = Callable[[Tiles, list[Ref], int, int, int, int], None]


def _words(lw: Lowering, n: int, per_block: int, scalars: Callable[[int], tuple[Scalar, Scalar, Scalar]],
           emit: Emit) -> None:
    """Draw Philox blocks for ``n`` outputs, ``per_block`` a block, and hand each tile of blocks to
    ``emit(t, words, r0, rn, B, e0)``. ``scalars(rn)`` gives the key's low word, the 64-bit counter's
    low word (the block index is added to it) and the low word of its high half, for ``rn`` partitions
    (per-partition tiles or numbers); the high words are 0 on the device."""
    g = lw.graph
    part = lw.target.partitions
    nb, B, rows = _layout(n, per_block, part)
    for r0 in range(0, rows, part):
        rn = min(part, rows - r0)
        t = Tiles(g, (rn, B), "rng")
        ph = _Philox(t)
        blk = t.tile(U32)
        g.add("pool", "iota", blk, base=r0 * B, channel_multiplier=B, steps=(1,))
        zeros = t.memset(0, U32)
        key, low, c2 = scalars(rn)
        lo = ph.ts(blk, "add", low)
        carry = ph.ts(lo, "lt", low)  # the carry into the 64-bit counter's high word
        words = ph.run((key, 0), [lo, carry, ph.full(c2, zeros), zeros])
        emit(t, words, r0, rn, B, r0 * B * per_block)


# --- rng-bit-generator -----------------------------------------------------------------------------

@lowers("rng-bit-generator")
def rng_bit_generator(lw: Lowering, node: Node) -> None:
    alg = node.attrs["algorithm"]
    if alg != "rng_default":
        raise error("NCC_EVRF006", f"rng-bit-generator {node.name} uses {alg}: the device runs only rng_default "
                    "(Philox-4x32, which is what rng_philox computes too: write algorithm=rng_default)", node.loc)
    state_node = node.operands[0]
    assert isinstance(node.type, TupleType)
    out_t = node.type.elements[1]
    assert isinstance(out_t, TensorType)
    g = lw.graph
    part = lw.target.partitions
    size = state_node.shape[0]
    state = lw.ref(state_node)  # u32 words on the device
    n = math.prod(out_t.shape)
    wide = out_t.dtype.bits == 64
    per_block = 2 if wide else 4  # a 64-bit output takes two words (its low one is the device's value)
    od = onchip_dtype(device_dtype(out_t.dtype, node))
    new_state = g.buf(node.name + "_state", "scratch", U32, (size,)).ref()
    values = g.buf(node.name + "_bits", "scratch", od, out_t.shape).ref()
    # The state in every partition: key (word 0), counter low (word 1), counter high (word 2, or the key).
    st = g.tile((part, size), U32, "sbuf", "state").ref()
    g.add("dma", "dma", st, state.reshape(1, size).broadcast(0, part))
    high = 2 if size >= 3 else 0  # the counter's high half: word 2, or the key
    nb = -(-n // per_block)

    def emit(t: Tiles, words: list[Ref], r0: int, rn: int, B: int, e0: int) -> None:
        outs = g.tile((rn, B, per_block), U32, "sbuf", "bits").ref()
        for j in range(per_block):
            g.add("pool", "tensor_copy", outs[:, :, j], words[2 * j if wide else j])
        flat = outs.reshape(rn, B * per_block)
        if od is not U32:
            narrowed = g.tile((rn, B * per_block), od, "sbuf", "bits").ref()
            g.add("pool", "tensor_scalar", narrowed, flat, op0="or", scalar0=0)  # keeps the low bits
            flat = narrowed
        if n:
            _store_flat(g, values.reshape(n), flat, e0, rn, B * per_block, n)

    _words(lw, n, per_block, lambda rn: (st[0:rn, 0:1], st[0:rn, 1:2], st[0:rn, high:high + 1]), emit)
    # The new state: the counter advanced by the blocks drawn (wrapping at 32 bits on the device).
    cur = g.tile((1, size), U32, "sbuf", "state").ref()
    g.add("dma", "dma", cur, state.reshape(1, size))
    nxt = g.tile((1, size), U32, "sbuf", "state").ref()
    g.add("pool", "tensor_copy", nxt, cur)
    g.add("pool", "tensor_scalar", nxt[:, 1:2], cur[:, 1:2], op0="add", scalar0=nb)
    g.add("dma", "dma", new_state.reshape(1, size), nxt)
    lw.set(node, (new_state, values))


# --- rng ----------------------------------------------------------------------------------------------

@lowers("rng")
def rng(lw: Lowering, node: Node) -> None:
    """``rng_uniform`` over [a, b) and ``rng_normal`` (mean a, deviation b): Philox bits keyed by the
    node's name, mapped on VectorE/ScalarE (floats) or GpSimd (integers)."""
    g = lw.graph
    part = lw.target.partitions
    d = onchip_dtype(device_dtype(node.dtype, node))
    out = lw.result(node)
    n = math.prod(node.shape)
    seed = seed_of(node.name) & 0xFFFFFFFF  # the key's high word is 0, as for rng-bit-generator
    normal = node.attrs["distribution"] == "rng_normal"
    ct = F32 if d.is_float else (U32 if d is U32 else S32)
    params = []
    for o in node.operands:  # a and b in every partition, in the computing type
        p = g.tile((part, 1), ct, "sbuf", "param").ref()
        s = lw.scalar(o)
        if s is not None:
            g.add("pool" if ct.is_int else "dve", "memset", p, value=s)
        else:
            src = g.tile((part, 1), onchip_dtype(device_dtype(o.dtype)), "sbuf", "param").ref()
            g.add("dma", "dma", src, lw.ref(o).reshape(1, 1).broadcast(0, part))
            Tiles(g, (part, 1)).copy_into(p, src)
        params.append(p)
    a, b = params
    span = g.tile((part, 1), ct, "sbuf", "span").ref()
    g.add("pool" if ct.is_int else "dve", "tensor_tensor", span, b, a, op="sub")
    uspan = g.alias(span.buf, U32, (part, 1)).ref() if ct.is_int else span  # b - a read unsigned
    per_block = 2 if normal else 4

    def emit(t: Tiles, words: list[Ref], r0: int, rn: int, B: int, e0: int) -> None:
        ts = Tiles(g, (rn, B), "rng")
        vals = g.tile((rn, B, per_block), d, "sbuf", "rand").ref()
        pa, pb, pspan = a[0:rn, :], b[0:rn, :], uspan[0:rn, :]
        for j in range(per_block):
            if normal:
                z = _normal(ts, words[2 * j], words[2 * j + 1])
                x = ts.tile(F32)
                g.add("dve", "tensor_scalar", x, z, op0="mul", scalar0=pb, op1="add", scalar1=pa)
                g.add("dve", "tensor_copy", vals[:, :, j], x if d is F32 else narrow(ts, x, d))
            elif d.is_float:
                u = _unit(ts, words[j])
                x = ts.tile(F32)
                g.add("dve", "tensor_scalar", x, u, op0="mul", scalar0=pspan, op1="add", scalar1=pa)
                y = x if d is F32 else narrow(ts, x, d)
                below = ts.tile(U8)  # rounding may reach b: [a, b) is half-open
                g.add("dve", "tensor_scalar", below, y, op0="lt", scalar0=pb)
                lo = ts.tile(d)
                g.add("dve", "tensor_scalar", lo, ts.memset(0, d), op0="add", scalar0=pa)
                g.add("dve", "select", vals[:, :, j], below, y, lo)
            else:
                w = words[j]
                q = ts.tile(U32)
                g.add("pool", "tensor_scalar", q, w, op0="div", scalar0=pspan)
                m = ts.tile(U32)
                g.add("pool", "tensor_scalar", m, q, op0="mul", scalar0=pspan)
                r = ts.binary("sub", w, m, U32)
                x = ts.tile(ct)
                g.add("pool", "tensor_scalar", x, r, op0="add", scalar0=pa)
                g.add("pool", "tensor_scalar", vals[:, :, j], x, op0="or", scalar0=0)
        if n:
            _store_flat(g, out.reshape(n), vals.reshape(rn, B * per_block), e0, rn, B * per_block, n)

    _words(lw, n, per_block, lambda rn: (seed, 0, 0), emit)


def _unit(t: Tiles, w: Ref) -> Ref:
    """23 random bits as a float in [0, 1): ``1.m - 1`` (exact)."""
    bits = t.scalar2(w, "shr", 9, "or", 0x3F800000, U32)
    return t.binary("add", t.view(bits, F32), -1.0, F32)


def _normal(t: Tiles, w1: Ref, w2: Ref) -> Ref:
    """Box-Muller: ``sqrt(-2 log u1) cos(2 pi u2 - pi)``, u1 in (0, 1] (a standard normal)."""
    u1 = t.scalar2(_unit(t, w1), "mul", -1.0, "add", 1.0, F32)
    r = t.act("sqrt", t.act("log", u1, F32), F32, scale=-2.0, bias=0.0)
    c = t.act("cos", _unit(t, w2), F32, scale=2 * math.pi, bias=-math.pi)
    return t.binary("mul", r, c, F32)

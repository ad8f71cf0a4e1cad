"""The device program: tensors placed in HBM, SBUF or PSUM, per-engine instruction streams, semaphores.

This is what the backend emits and what the simulator runs (documented in docs/device-program.md).
The records here are plain data; :mod:`nxsat.sim.asm` reads and prints their text form,
:mod:`nxsat.sim.verify` checks them against a target, and the access-pattern algebra at the end
turns an access (``x[:, 0:4].T``) into the offsets and strides the engines and DMA see.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from nxsat.dtypes import DType
from nxsat.lazy import cached_property

ISA_VERSION = (1, 1)

HBM_KINDS = ("input", "output", "const", "scratch")
ONCHIP_KINDS = ("sbuf", "psum")
TENSOR_KINDS = HBM_KINDS + ONCHIP_KINDS

# Streams in their fixed order: compute engines, the collective engine, then the DMA queues.
ENGINE_STREAMS = ("pe", "act", "dve", "pool", "cc")


def stream_kind(stream: str) -> str:
    """``pe``/``act``/``dve``/``pool``/``cc`` for engines, ``dma`` for a queue ``q<i>``."""
    if stream in ENGINE_STREAMS:
        return stream
    if stream.startswith("q") and stream[1:].isdigit() and str(int(stream[1:])) == stream[1:]:
        return "dma"
    return ""


def stream_order(stream: str) -> tuple[int, int]:
    """Sort key of the fixed stream order (engines, then queues by number): ties and tracks follow it."""
    if stream in ENGINE_STREAMS:
        return (0, ENGINE_STREAMS.index(stream))
    return (1, int(stream[1:]))


@dataclass(frozen=True)
class Tensor:
    """A declared tensor. On-chip tensors are ``[partitions, *free]`` at a partition and byte offset."""

    name: str
    kind: str
    dtype: DType
    shape: tuple[int, ...]
    partition: int = 0
    offset: int | None = None  # bytes within each partition; None until placed
    bank: int | None = None  # psum, as written: offset counts from this bank (resolved when placed)
    shard: int | None = None  # input/output: dimension split across ranks
    alias: str | None = None  # output: the input whose buffer it is (input_output_alias); no storage of its own
    line: int = 0

    @property
    def memory(self) -> str:
        return self.kind if self.kind in ONCHIP_KINDS else "hbm"

    @property
    def onchip(self) -> bool:
        return self.kind in ONCHIP_KINDS

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def partitions(self) -> int:
        return self.shape[0]

    @property
    def row_elems(self) -> int:
        """Elements per partition (on-chip tensors)."""
        return math.prod(self.shape[1:])

    @property
    def row_bytes(self) -> int:
        return self.row_elems * self.dtype.itemsize


class Idx(NamedTuple):
    """One dimension of an index: a slice ``start:stop:step`` or, with ``single``, the index ``start``.

    Index, access and wait records are named tuples: programs hold millions of them, and they are
    hashed (the verifier links each distinct access once) at C speed."""

    start: int
    stop: int
    step: int = 1
    single: bool = False

    @property
    def size(self) -> int:
        return len(range(self.start, self.stop, self.step))


class Access(NamedTuple):
    """``tensor[index]`` then view operations (``("permute", perm)``, ``("reshape", shape)``,
    ``("broadcast", (dim, size))``).

    ``index`` is empty for the whole tensor; otherwise one :class:`Idx` per declared dimension.
    """

    tensor: str
    index: tuple[Idx, ...] = ()
    views: tuple[tuple[str, tuple[int, ...]], ...] = ()


class Wait(NamedTuple):
    """``wait=SEM>=VALUE``: the instruction starts once the semaphore has counted to ``value``."""

    sem: str
    value: int


@dataclass(slots=True)
class Instr:
    """One instruction: stream, opcode, operands, attributes, waits, signals, where it came from.

    ``line`` is its line in the program text (0 for a program built in Python); ``origin`` names what
    produced it, e.g. the IR node and model source line a compiler lowered (``dot.12 model.hlo:34``):
    errors, the disassembly (``.origin`` lines) and the trace show it.
    """

    stream: str
    opcode: str
    operands: tuple[Access, ...]
    attrs: dict[str, Any]
    waits: tuple[Wait, ...] = ()
    signals: tuple[str, ...] = ()
    line: int = 0
    origin: str | None = None


@dataclass
class Program:
    """A whole device program. ``source`` names where it came from (for error locations)."""

    version: tuple[int, int] = ISA_VERSION
    target: str | None = None
    lnc: int | None = None
    ranks: int | None = None  # SPMD ranks (physical cores); None: the target's lnc
    flags: tuple[str, ...] = ()
    tensors: dict[str, Tensor] = field(default_factory=dict)
    semaphores: dict[str, int] = field(default_factory=dict)  # name -> declaring line
    instrs: list[Instr] = field(default_factory=list)
    source: str = "<program>"

    def inputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.kind == "input"]

    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.kind == "output"]

    def consts(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.kind == "const"]

    def streams(self) -> list[str]:
        """The streams that have instructions, in the fixed stream order."""
        return sorted({i.stream for i in self.instrs}, key=stream_order)

    def global_shape(self, t: Tensor) -> tuple[int, ...]:
        """The shape the host sees: a sharded input/output is ``ranks`` shards along its shard dim."""
        if t.shard is None or not self.ranks or self.ranks == 1:
            return t.shape
        s = list(t.shape)
        s[t.shard] *= self.ranks
        return tuple(s)


# --- access patterns ---------------------------------------------------------------------------

class AccessError(ValueError):
    """An access that does not fit its tensor; the verifier turns it into a coded error."""


@dataclass(frozen=True)
class AP:
    """Where an access lies in its tensor: ``offset`` plus ``(size, stride)`` dims, in elements.

    For on-chip tensors ``part`` is ``(first, count)`` relative to the tensor's first partition and
    ``offset``/``dims`` describe the free dimensions inside one partition's row; for HBM tensors
    ``part`` is None and ``dims`` cover every dimension of the flat tensor.
    """

    offset: int
    dims: tuple[tuple[int, int], ...]
    part: tuple[int, int] | None = None

    @cached_property
    def shape(self) -> tuple[int, ...]:
        free = tuple(s for s, _ in self.dims)
        return free if self.part is None else (self.part[1], *free)

    @cached_property
    def free_elems(self) -> int:
        return math.prod(s for s, _ in self.dims)

    def span(self) -> tuple[int, int]:
        """(lowest, highest + 1) element offset touched within a row (or the flat tensor)."""
        lo = self.offset + sum((s - 1) * st for s, st in self.dims if st < 0)
        hi = self.offset + sum((s - 1) * st for s, st in self.dims if st > 0) + 1
        return lo, hi

    def merged_free_dims(self) -> int:
        """Free dimensions as the hardware sees them: dimensions of one element dropped, and a dimension
        merged into the one inside it when together they step evenly."""
        merged: list[tuple[int, int]] = []
        for size, stride in self.dims:
            if size == 1:
                continue
            if merged and merged[-1][1] == stride * size:
                merged[-1] = (merged[-1][0] * size, stride)
            else:
                merged.append((size, stride))
        return len(merged)

    def contiguous_run(self) -> int:
        """Elements in the longest innermost run that is contiguous in memory."""
        run = 1
        for size, stride in reversed(self.dims):
            if size == 1:
                continue
            if stride != run:
                break
            run *= size
        return run


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of a shape."""
    out = []
    acc = 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def resolve(acc: Access, t: Tensor) -> AP:
    """The access pattern of ``acc`` on tensor ``t``; :class:`AccessError` when it does not fit.

    An access is the tensor, optionally indexed, then a chain of views and further indexes
    (``x[0].reshape(8, 16)[0:4, :].T``): each step is applied to the access pattern so far."""
    strides = contiguous_strides(t.shape)
    if t.onchip:
        dims = [(n, st) for n, st in zip(t.shape[1:], strides[1:])]  # within a partition's row
        part: tuple[int, int] | None = (0, t.shape[0])
    else:
        dims = list(zip(t.shape, strides))
        part = None
    ap = AP(0, tuple(dims), part)
    ops: tuple[tuple[str, object], ...] = ((("index", acc.index),) if acc.index else ()) + acc.views
    for op, arg in ops:
        ap = view_step(ap, op, arg, t.name)
    return ap


def view_step(ap: AP, op: str, arg: Any, name: str) -> AP:
    """One step of an access chain (``index``, ``permute``, ``reshape``, ``broadcast``) applied to the
    access pattern so far: the backend resolves its own chains step by step with it."""
    dims, part, offset = list(ap.dims), ap.part, ap.offset
    if op == "index":
        offset, dims, part = _index(offset, dims, part, arg, name)
    elif op == "permute":
        dims, part = _permute(dims, part, arg, name)
    elif op == "reshape":
        dims = _reshape(dims, part, arg, name)
    elif op == "broadcast":
        dims = _broadcast(dims, part, arg, name)
    else:
        raise AccessError(f"unknown view operation {op}")
    return AP(offset, tuple(dims), part)


def _index(offset: int, dims: list[tuple[int, int]], part: tuple[int, int] | None, index: tuple[Idx, ...],
           name: str) -> tuple[int, list[tuple[int, int]], tuple[int, int] | None]:
    """Index the view so far: one entry per dimension (the partition dimension first, on chip)."""
    shape = ([part[1]] if part is not None else []) + [n for n, _ in dims]
    if len(index) != len(shape):
        raise AccessError(f"{name} has {len(shape)} dimension(s) here, the index has {len(index)}")
    out: list[tuple[int, int]] = []
    d0 = 0
    if part is not None:
        ix = index[0]
        n = part[1]
        if ix.single:
            raise AccessError(f"the partition dimension of {name} can be sliced, not indexed")
        if ix.step != 1:
            raise AccessError(f"the partition dimension of {name} cannot be strided")
        if not (0 <= ix.start < n and ix.stop <= n and ix.size > 0):
            raise AccessError(f"slice {ix.start}:{ix.stop} is out of range or empty for the partitions of {name} "
                              f"({n})")
        part = (part[0] + ix.start, ix.size)
        d0 = 1
    for d, (ix, (n, st)) in enumerate(zip(index[d0:], dims), d0):
        if ix.single:
            if not 0 <= ix.start < n:
                raise AccessError(f"index {ix.start} is out of range for dimension {d} of {name} (size {n})")
        elif ix.step <= 0:
            raise AccessError(f"slice step must be positive (dimension {d} of {name})")
        elif not (0 <= ix.start < n and ix.stop <= n and ix.size > 0):
            raise AccessError(f"slice {ix.start}:{ix.stop} is out of range or empty for dimension {d} "
                              f"of {name} (size {n})")
        offset += ix.start * st
        if not ix.single:
            out.append((ix.size, st * ix.step))
    return offset, out, part


def view_shape(t: Tensor, acc: Access) -> tuple[int, ...]:
    """The shape of an access (the text form needs it to read a later index's ``:`` and negatives)."""
    return resolve(acc, t).shape


def _permute(dims: list[tuple[int, int]], part: tuple[int, int] | None, perm: tuple[int, ...],
             name: str) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    rank = len(dims) + (part is not None)
    if sorted(perm) != list(range(rank)):
        raise AccessError(f"permutation {list(perm)} does not fit a view of rank {rank}")
    if part is not None:
        if perm[0] != 0:
            raise AccessError(f"a view of on-chip tensor {name} must keep the partition dimension first")
        return [dims[p - 1] for p in perm[1:]], part
    return [dims[p] for p in perm], part


def _reshape(dims: list[tuple[int, int]], part: tuple[int, int] | None, shape: tuple[int, ...],
             name: str) -> list[tuple[int, int]]:
    if any(s <= 0 for s in shape):
        raise AccessError(f"reshape to {list(shape)}: sizes must be positive")
    if part is not None:
        if not shape or shape[0] != part[1]:
            raise AccessError(f"a reshape of on-chip tensor {name} must keep the partition dimension "
                              f"({part[1]}) first")
        shape = shape[1:]
    old = [(s, st) for s, st in dims if s != 1]
    total = math.prod(s for s, _ in dims)
    if math.prod(shape) != total:
        raise AccessError(f"cannot reshape {total} elements to {list(shape)}")
    new = list(shape)
    out: list[tuple[int, int]] = []
    i = j = 0
    while j < len(new):
        if new[j] == 1:
            out.append((1, 0))
            j += 1
            continue
        # Group old dims [i0, i) with new dims [j0, j) of equal product.
        i0, j0 = i, j
        op, np_ = old[i][0], new[j]
        i += 1
        j += 1
        while op != np_:
            if op < np_:
                op *= old[i][0]
                i += 1
            else:
                np_ *= new[j]
                j += 1
        group = old[i0:i]
        for (_, st_hi), (s_lo, st_lo) in zip(group, group[1:]):
            if st_hi != st_lo * s_lo:
                raise AccessError(f"reshape of a non-contiguous view of {name} to {list(shape)} needs a copy")
        stride = group[-1][1]
        tail: list[tuple[int, int]] = []
        for k in range(j - 1, j0 - 1, -1):
            tail.append((new[k], stride))
            stride *= new[k]
        out.extend(reversed(tail))
    return out


def _broadcast(dims: list[tuple[int, int]], part: tuple[int, int] | None, arg: tuple[int, ...],
               name: str) -> list[tuple[int, int]]:
    """Repeat a size-1 dimension ``size`` times (stride 0): a read-only view."""
    if len(arg) != 2:
        raise AccessError("broadcast takes (dimension, size)")
    dim, size = arg
    if part is not None:
        if dim == 0:
            raise AccessError(f"the partition dimension of on-chip tensor {name} cannot be broadcast")
        dim -= 1
    if not 0 <= dim < len(dims) or dims[dim][0] != 1 or size < 1:
        raise AccessError(f"broadcast({arg[0]}, {size}): dimension {arg[0]} must exist and have size 1")
    out = list(dims)
    out[dim] = (size, 0)
    return out


def is_broadcast(acc: Access) -> bool:
    """Does the access repeat elements (a stride-0 view)? Such an access may be read, never written."""
    return any(op == "broadcast" for op, _ in acc.views)


def index_box(acc: Access, t: Tensor, ap: AP | None = None) -> tuple[tuple[int, int, int], ...] | None:
    """The element set of an access as one arithmetic progression per declared dimension, or None when
    it is not one (a later index of a reshaped view can take a row range that spans rows)."""
    if not any(op == "index" for op, _ in acc.views):
        if not acc.index:
            return tuple((0, n, 1) for n in t.shape)
        return tuple((ix.start, ix.start + 1, 1) if ix.single else (ix.start, ix.stop, ix.step) for ix in acc.index)
    ap = ap if ap is not None else resolve(acc, t)
    return _ap_box(ap, t)


def _ap_box(ap: AP, t: Tensor) -> tuple[tuple[int, int, int], ...] | None:
    """A declared-dimension box with exactly the elements of ``ap``, if there is one."""
    shape = t.shape[1:] if t.onchip else t.shape
    strides = contiguous_strides(shape)
    coord = [(ap.offset // st) % n if n else 0 for n, st in zip(shape, strides)]
    if sum(c * st for c, st in zip(coord, strides)) != ap.offset:
        return None
    box = [(c, c + 1, 1) for c in coord]
    used: set[int] = set()
    for size, stride in ap.dims:
        if size == 1 or stride == 0:
            continue  # a broadcast repeats elements: the set is the same
        d = next((d for d, st in enumerate(strides) if st <= stride and stride % st == 0 and d not in used), None)
        if d is None:
            return None
        step = stride // strides[d]
        if coord[d] + (size - 1) * step >= shape[d]:
            return None
        used.add(d)
        box[d] = (coord[d], coord[d] + (size - 1) * step + 1, step)
    if t.onchip:
        assert ap.part is not None
        box.insert(0, (ap.part[0], ap.part[0] + ap.part[1], 1))
    count = math.prod(len(range(*b)) for b in box) // (ap.part[1] if t.onchip and ap.part else 1)
    distinct = math.prod(s for s, st in ap.dims if st != 0)
    return tuple(box) if count == distinct else None


MAX_RUNS = 1 << 22


def ap_runs(ap: AP) -> tuple[np.ndarray, np.ndarray]:
    """The elements of an access pattern (of a partition's row, on chip) as sorted, merged flat
    intervals ``[starts[i], ends[i])``: the exact footprint of an access that is not a box."""
    dims = sorted(((s, st) for s, st in ap.dims if s > 1 and st != 0), key=lambda d: -d[1])
    run = 1
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    count = math.prod(s for s, _ in dims)
    if count > MAX_RUNS:  # too fragmented to enumerate: its whole span (may report a race that is not one)
        lo, hi = ap.span()
        return np.array([lo], np.int64), np.array([hi], np.int64)
    starts = np.array([ap.offset], dtype=np.int64)
    for s, st in dims:
        starts = (starts[:, None] + np.arange(s, dtype=np.int64) * st).ravel()
    starts.sort()
    ends = starts + run
    if len(starts) > 1:  # merge touching or overlapping intervals
        reach = np.maximum.accumulate(ends)
        keep = np.empty(len(starts), dtype=bool)
        keep[0] = True
        keep[1:] = starts[1:] > reach[:-1]
        first = np.flatnonzero(keep)
        starts, ends = starts[first], np.maximum.reduceat(ends, first)
    return starts, ends


def box_runs(box: tuple[tuple[int, int, int], ...], shape: tuple[int, ...], onchip: bool) -> tuple[np.ndarray,
                                                                                                     np.ndarray]:
    """The flat intervals of a declared-dimension box (a partition's row on chip)."""
    if onchip:
        box, shape = box[1:], shape[1:]
    strides = contiguous_strides(shape)
    offset = sum(s * st for (s, _, _), st in zip(box, strides))
    dims = tuple((len(range(s, e, k)), st * k) for (s, e, k), st in zip(box, strides))
    return ap_runs(AP(offset, dims))


SMALL_RUNS = 4


def runs_overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    """Do two sorted, merged interval lists share a point?"""
    if len(a[0]) < len(b[0]):
        a, b = b, a  # search the longer list for the shorter's intervals: work by the shorter
    a_s, a_e = a
    b_s, b_e = b
    if not len(a_s) or not len(b_s) or a_e[-1] <= b_s[0] or b_e[-1] <= a_s[0]:
        return False
    if len(b_s) <= SMALL_RUNS:  # a few intervals: bisection per interval beats numpy's per-call cost
        for s, e in zip(b_s.tolist(), b_e.tolist()):
            i = bisect_right(a_e, s)  # the first interval of a ending after s
            if i < len(a_s) and a_s[i] < e:
                return True
        return False
    i = np.searchsorted(a_e, b_s, side="right")  # the first interval of a ending after each start of b
    ok = i < len(a_s)
    return bool(np.any(a_s[i[ok]] < b_e[ok]))


def runs_cover(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    """Does the interval list ``a`` contain every interval of ``b``?"""
    a_s, a_e = a
    b_s, b_e = b
    if not len(b_s):
        return True
    i = np.searchsorted(a_e, b_s, side="right")
    if np.any(i >= len(a_s)):
        return False
    return bool(np.all((a_s[i] <= b_s) & (b_e <= a_e[i])))


def boxes_overlap(a: tuple[tuple[int, int, int], ...], b: tuple[tuple[int, int, int], ...]) -> bool:
    """Do two index boxes of the same tensor share an element? Exact for strided boxes."""
    if a == b:
        return True
    for (s1, e1, _), (s2, e2, _) in zip(a, b):
        if s1 >= e2 or s2 >= e1:
            return False
    for (s1, e1, k1), (s2, e2, k2) in zip(a, b):
        lo, hi = max(s1, s2), min(e1, e2)
        if lo >= hi:
            return False
        if k1 == 1 and k2 == 1:
            continue
        if not _progressions_meet(s1, k1, s2, k2, lo, hi):
            return False
    return True


def _progressions_meet(s1: int, k1: int, s2: int, k2: int, lo: int, hi: int) -> bool:
    """Is there x in [lo, hi) with x = s1 (mod k1) and x = s2 (mod k2)?"""
    g = math.gcd(k1, k2)
    if (s2 - s1) % g:
        return False
    # Solve x = s1 + k1 * t = s2 (mod k2): t = (s2 - s1)/g * inv(k1/g) mod (k2/g).
    m = k2 // g
    t = ((s2 - s1) // g * pow(k1 // g, -1, m)) % m if m > 1 else 0
    x0 = s1 + k1 * t
    period = k1 * m
    first = x0 + ((lo - x0 + period - 1) // period) * period
    return first < hi

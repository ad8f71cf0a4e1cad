"""The instruction graph: what lowering builds and scheduling orders.

Lowering turns operators into device instructions on *buffers*: HBM tensors (inputs, outputs,
constants, scratch) and on-chip tiles whose place in SBUF or PSUM is not chosen yet. Each
instruction records the accesses it makes (:class:`Ref`: a buffer and an access chain, the same
chains the device program uses), and the graph derives its data dependences as it is built
(read after write, write after read, write after write, exactly per footprint). Scheduling then
orders the graph onto engine streams and DMA queues, places the tiles by liveness and turns the
dependences into semaphores (backend/schedule.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nxsat import dtypes as dt
from nxsat.diagnostics import error
from nxsat.lazy import cached_property
from nxsat.sim.isa import OPS, RAccess
from nxsat.sim.program import (
    AP,
    Access,
    Idx,
    Tensor,
    contiguous_strides,
    index_box,
    resolve,
    view_step,
)

ONCHIP = ("sbuf", "psum")
MAX_INSTRUCTIONS = 2_000_000  # what the device program accepts (sim/verify.py)


@dataclass(eq=False)
class Buf:
    """A buffer: an HBM tensor (``input output const scratch``) or an on-chip tile (``sbuf psum``).

    On-chip tiles are placed by the scheduler (``partition``/``offset``); an HBM constant carries its
    value. A tile with a ``base`` is a view of that tile's bytes as another element type or shape
    (:meth:`Graph.alias`): it has no place of its own, and its uses keep its base alive."""

    name: str
    kind: str
    dtype: dt.DType
    shape: tuple[int, ...]
    value: Any = None  # const: the numpy array
    partition: int = 0
    offset: int | None = None
    shard: int | None = None  # input/output: the dimension split across the SPMD ranks
    alias: str | None = None  # output: the input whose buffer it is (the module's input_output_alias)
    users: list[Inst] = field(default_factory=list, repr=False)
    base: Buf | None = field(default=None, repr=False)
    _decl: tuple[Any, Tensor] | None = field(default=None, repr=False)  # (place, tensor) last declared
    _ap0: AP | None = field(default=None, repr=False)  # the access pattern of the whole buffer
    sealed: bool = False  # HBM: written completely; only read from now on (:meth:`Graph.seal`)

    @property
    def root(self) -> Buf:
        """The buffer that owns the bytes (itself, unless it is a view of another tile)."""
        return self.base if self.base is not None else self

    @property
    def onchip(self) -> bool:
        return self.kind in ONCHIP

    @property
    def row_bytes(self) -> int:
        """Bytes per partition of an on-chip tile."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def tensor(self) -> Tensor:
        """The device-program declaration (on-chip tiles at a placeholder place until allocated); made once
        per place (every access of the buffer resolves against it)."""
        place = (self.partition, self.offset, self.shard)
        if self._decl is None or self._decl[0] != place:
            t = Tensor(self.name, self.kind, self.dtype, self.shape, partition=self.partition,
                       offset=self.offset if self.offset is not None else (0 if self.onchip else None),
                       shard=self.shard)
            self._decl = (place, t)
        return self._decl[1]

    @property
    def ap0(self) -> AP:
        """The access pattern of the whole buffer (where every access chain starts)."""
        if self._ap0 is None:
            self._ap0 = resolve(Access(self.name), self.tensor())
        return self._ap0

    def ref(self) -> Ref:
        return Ref(self, ())

    # Numpy-like construction of accesses on the whole buffer.
    def __getitem__(self, key: Any) -> Ref:
        return self.ref()[key]

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name}: {self.dtype.name}{list(self.shape)}>"


@dataclass(frozen=True, eq=False)
class Ref:
    """An access to a buffer: a chain of ``index``, ``permute``, ``reshape`` and ``broadcast`` steps,
    built numpy-style (``buf[0:128, 3].reshape(128, 4, 2).T``). ``as_type`` reads an on-chip tile's
    bytes as another type of the same width (:meth:`bitcast`).

    The access pattern is resolved step by step (:attr:`ap`: the chain's last step applied to the access
    pattern of the chain before it, ``parent``), once per Ref: lowering derives tile after tile from one
    view, and replaying every chain from the buffer was most of its time."""

    buf: Buf
    ops: tuple[tuple[str, Any], ...]
    as_type: dt.DType | None = None
    parent: Ref | None = field(default=None, repr=False)  # the same chain without its last step, if known

    def _then(self, op: str, arg: Any) -> Ref:
        return Ref(self.buf, self.ops + ((op, arg),), self.as_type, self)

    def bitcast(self, dtype: dt.DType) -> Ref:
        """The same elements of an on-chip tile seen as ``dtype`` (same width): the device program declares
        a tensor of that type over the tile's bytes, as on-chip tensors may share memory. Dependences
        stay exact: the geometry is the tile's own."""
        if not self.buf.onchip or dtype.itemsize != self.buf.dtype.itemsize:
            raise ValueError(f"cannot view {self.buf} as {dtype.name}")
        return Ref(self.buf, self.ops, None if dtype is self.buf.dtype else dtype, self.parent)

    @cached_property
    def ap(self) -> AP:
        """Where the access lies in its buffer (:class:`AccessError` if the chain does not fit it)."""
        if not self.ops:
            return self.buf.ap0
        parent = self.parent if self.parent is not None else Ref(self.buf, self.ops[:-1], self.as_type)
        op, arg = self.ops[-1]
        return view_step(parent.ap, op, arg, self.buf.name)

    @cached_property
    def shape(self) -> tuple[int, ...]:  # a Ref never changes: resolved once
        return self.ap.shape

    @property
    def dtype(self) -> dt.DType:
        return self.as_type or self.buf.dtype

    def __getitem__(self, key: Any) -> Ref:
        shape = self.shape
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1:]
        key = key + (slice(None),) * (len(shape) - len(key))
        if len(key) != len(shape):
            raise IndexError(f"{len(key)} indices for a view of rank {len(shape)}")
        idx = []
        whole = True
        for k, n in zip(key, shape):
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                count = len(range(start, stop, step))
                if count <= 0:
                    raise IndexError(f"empty slice {k} of a dimension of {n}")
                idx.append(Idx(start, start + (count - 1) * step + 1, step, False))
                whole = whole and start == 0 and count == n and step == 1
            else:
                i = int(k) + (n if int(k) < 0 else 0)
                if not 0 <= i < n:
                    raise IndexError(f"index {k} out of range for a dimension of {n}")
                idx.append(Idx(i, i + 1, 1, True))
                whole = False
        if whole:
            return self
        return self._then("index", tuple(idx))

    def permute(self, *perm: int) -> Ref:
        if self.ops and self.ops[-1][0] == "permute":  # a permute of a permute is one
            prev = self.ops[-1][1]
            return self._up().permute(*(prev[p] for p in perm))
        if tuple(perm) == tuple(range(len(perm))):
            return self
        return self._then("permute", tuple(perm))

    def _up(self) -> Ref:
        """The chain without its last step."""
        return self.parent if self.parent is not None else Ref(self.buf, self.ops[:-1], self.as_type)

    @property
    def T(self) -> Ref:  # noqa: N802 - numpy's spelling
        return self.permute(*range(len(self.shape) - 1, -1, -1))

    def reshape(self, *shape: int) -> Ref:
        if tuple(shape) == self.shape:
            return self
        if self.ops and self.ops[-1][0] == "reshape":  # a reshape of a reshape is one (no rank-0 step between)
            return self._up().reshape(*shape)
        return self._then("reshape", tuple(int(s) for s in shape))

    def broadcast(self, dim: int, size: int) -> Ref:
        return self._then("broadcast", (dim, size))

    def access(self) -> Access:
        """The device program's form: a leading index, then the rest of the chain."""
        if self.ops and self.ops[0][0] == "index":
            return Access(self.buf.name, self.ops[0][1], self.ops[1:])
        return Access(self.buf.name, (), self.ops)

    def resolved(self) -> RAccess:
        t = self.buf.tensor()
        acc = self.access()
        return RAccess(acc, t, self.ap, index_box(acc, t, self.ap))

    def __repr__(self) -> str:
        return f"Ref({self.buf.name}, {self.ops})"


@dataclass(eq=False)
class Inst:
    """One device instruction: engine (``pe act dve pool cc`` or ``dma``), opcode, operands and
    attributes (an attribute may be a :class:`Ref`), what produced it, and what it must wait for."""

    engine: str
    opcode: str
    operands: tuple[Ref, ...]
    attrs: dict[str, Any]
    origin: str | None
    index: int
    deps: set[Inst] = field(default_factory=set, repr=False)
    reads: list[Ref] = field(default_factory=list, repr=False)
    writes: list[Ref] = field(default_factory=list, repr=False)

    def __hash__(self) -> int:
        return self.index

    def __repr__(self) -> str:
        return f"<{self.index} {self.engine} {self.opcode} {[r.buf.name for r in self.operands]}>"


class _Track:
    """The accesses of one buffer a later access may still depend on (latest per footprint; an access
    that covers older ones replaces them). The accesses are also filed by the ranges they span
    (``BUCKETS`` buckets of an HBM buffer's elements, or of an on-chip buffer's row bytes), so a new
    access meets only those that may overlap it: a tensor read or written tile by tile would
    otherwise cost every tile a pass over all the others. A read meets only the writes: reads of a
    tensor written once and read tile by tile (whatever their spans) cost nothing among themselves."""

    __slots__ = ("entries", "buckets", "wide", "writes", "shift", "serial")

    def __init__(self, buf: Buf) -> None:
        self.entries: dict[int, tuple[RAccess, Inst, bool, Any]] = {}
        self.serial = 0
        # the span an access's (lo, hi) ranges over: flat elements in HBM, a partition row's bytes on chip
        elems = math.prod(buf.shape[1:]) * buf.dtype.itemsize if buf.onchip else math.prod(buf.shape)
        self.shift = max(0, (elems // BUCKETS).bit_length()) if elems > BUCKETS else -1
        self.buckets: dict[int, set[int]] = {}
        self.wide: set[int] = set()
        self.writes: set[int] = set()

    def _span(self, ra: RAccess) -> range | None:
        if self.shift < 0:
            return None
        first, last = ra.lo >> self.shift, max(ra.lo, ra.hi - 1) >> self.shift
        return range(first, last + 1) if last - first < WIDE_BUCKETS else None

    def candidates(self, ra: RAccess, write: bool) -> list[int]:
        """The keys of the accesses that ``ra`` may conflict with (a write: every access it may
        overlap; a read: the writes it may overlap), in the order they were made."""
        span = self._span(ra)
        if span is None:
            return list(self.entries) if write else sorted(self.writes)
        found = set(self.wide) if write else self.wide & self.writes
        for b in span:
            bucket = self.buckets.get(b, set())
            found.update(bucket if write else bucket & self.writes)
        return sorted(found)

    def remove(self, key: int) -> None:
        ra = self.entries.pop(key)[0]
        self.writes.discard(key)
        span = self._span(ra)
        if span is None:
            self.wide.discard(key)
        else:
            for b in span:
                self.buckets[b].discard(key)

    def add(self, ra: RAccess, inst: Inst, write: bool, h: tuple[tuple[int, int], ...] | None = None) -> None:
        key = self.serial
        self.serial += 1
        self.entries[key] = (ra, inst, write, h)
        if write:
            self.writes.add(key)
        span = self._span(ra)
        if span is None:
            self.wide.add(key)
        else:
            for b in span:
                self.buckets.setdefault(b, set()).add(key)


BUCKETS = 512  # element-range buckets per HBM buffer
# The narrowest column range Graph.load splits a load into: narrower, its descriptors cost more than reading
# the piece on chip saves.
MIN_LOAD_PIECE = 64
WIDE_BUCKETS = 32  # an access spanning more buckets is checked against every later access


RESERVED = frozenset(("true", "false", "none", "inf", "nan", "sem", "T", "sbuf", "psum", "input", "output", "const",
                      "scratch"))


# Opcodes that write every element of their output operand (a scatter writes the rows it is given; a
# matmul that accumulates reads its accumulator, and says so)
WHOLE_WRITERS = frozenset({"activation", "tensor_tensor", "tensor_scalar", "tensor_copy", "memset", "iota",
                           "affine_select", "dma", "transpose"})


def _from_psum(r: Ref) -> bool:
    """An input VectorE will read at its PSUM rate from a bank an evacuation is done with: an fp32 tile one
    step wrote from PSUM and nothing else has read, which forward.py's ``psum_operands`` turns into that bank
    (its test as far as lowering knows it when the add is made: the bank's later readers are not made yet).
    Not an input read from PSUM as lowered (a bias add on the matmul's bank): counted at N too, ResNeXt-50 ran
    309.3 -> 314.3 us, every schedule of its search slower (VectorE reading PSUM holds the port ScalarE's
    evacuations share, the target's port conflicts, which this count does not see)."""
    b = r.buf.root
    if b.kind != "sbuf" or b.dtype is not dt.F32 or len(b.users) != 1:
        return False
    w = b.users[0]
    return w.engine in ("act", "dve") and any(x.buf.kind == "psum" and x.buf.dtype is dt.F32 for x in w.reads)


class Graph:
    """The instruction graph of one program, with the dependences derived as instructions are added."""

    def __init__(self) -> None:
        self.insts: list[Inst] = []
        self.bufs: list[Buf] = []
        self._names: set[str] = set()
        self._next: dict[str, int] = {}  # the next suffix to try for a name (names stay unique in O(1))
        self._track: dict[int, _Track] = {}
        self.origin: str | None = None
        self.hbm_bytes = 0
        self.hbm_limit: int | None = None
        self.clocks: dict[str, float] = {}  # engine -> GHz (the target's), for :meth:`lighter`
        self._recent: dict[str, float] = {"act": 0.0, "dve": 0.0, "pool": 0.0}

    def release(self) -> None:
        """Break the graph's only reference cycles (an instruction refers to its buffers, a buffer to its
        users), so that reference counting frees it when the last reference goes: the cycle collector
        took 15 s over mobilenet_v2's graph."""
        for b in self.bufs:
            b.users.clear()
        self._track.clear()

    def remove(self, dead: set[Inst], changed: dict[int, Buf] | None = None) -> None:
        """Take ``dead`` out of the graph (what waited for one of them waits for what it waited for) and bring
        the users of the buffers they touched (and those in ``changed``: the forwarding pass's rewritten
        loads') up to date."""
        changed = {} if changed is None else changed
        for i in dead:
            for r in (*i.reads, *i.writes):
                changed[id(r.buf)] = r.buf
        for b in list(changed.values()):
            changed[id(b.root)] = b.root
        for b in changed.values():
            b.users = [u for u in b.users if u not in dead and any(r.buf is b or r.buf.root is b
                                                                   for r in (*u.reads, *u.writes))]
        if not dead:
            return
        via: dict[int, set[Inst]] = {}  # a dead instruction -> the live ones it waited for, through dead ones
        for i in sorted(dead, key=lambda x: x.index):  # what one waits for comes before it
            via[i.index] = set().union(*(via[d.index] if d in dead else {d} for d in i.deps))
        kept = []
        for i in self.insts:
            if i in dead:
                continue
            if not i.deps.isdisjoint(dead):
                i.deps = {d for d in i.deps if d not in dead} | set().union(*(via[d.index] for d in i.deps
                                                                              if d in dead))
            kept.append(i)
        for k, i in enumerate(kept):
            i.index = k
        for i in kept:
            i.deps = set(iter(i.deps))  # hashed by index: renumbered, so re-hashed (set(a_set) keeps old hashes)
        self.insts = kept

    def drop_dead(self) -> int:
        """Remove the instructions whose every write lands in SBUF, PSUM or a scratch tensor that no
        remaining instruction reads afterwards (in reverse program order: a tile or tensor is needed once a
        live instruction after its write reads any of it, until a write of all of it before that read),
        and the tensors left unused; the count removed.
        What lowering computes for a reader that turned out not to read it: a causal mask every one of
        whose tiles the attention's epilogue applies as an affine_select (attention_s2048: 21 MB of DMA and
        70 us of GpSimd ahead of the projections)."""
        needed: set[int] = set()
        dead: set[Inst] = set()
        for i in reversed(self.insts):
            roots = [r.buf.root for r in i.writes]
            if roots and all(b.kind in ("sbuf", "psum", "scratch") and id(b) not in needed for b in roots):
                dead.add(i)
                continue
            # a write of every element of a buffer ends what the readers after it need of the writes before it
            if i.opcode in WHOLE_WRITERS:
                needed.difference_update(id(r.buf) for r in i.writes
                                         if not r.ops and r.as_type is None and r.buf.base is None)
            needed.update(id(r.buf.root) for r in i.reads)
        if dead:
            written = {id(r.buf.root) for i in dead for r in i.writes}
            self._track.clear()  # it refers to them; nothing is added after lowering, which ends here
            self.remove(dead)
            self.drop(*[b for b in self.bufs if id(b) in written and b.kind == "scratch" and not b.users])
        return len(dead)

    def buf(self, name: str, kind: str, dtype: dt.DType, shape: Iterable[int], value: Any = None) -> Buf:
        """A new buffer; its name is made unique."""
        base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name) or "t"
        if not (base[0].isalpha() or base[0] == "_"):
            base = "t_" + base
        base = base[:60]
        n = base
        k = self._next.get(base, 1)
        while n in self._names or n in RESERVED:
            n = f"{base}_{k}"
            k += 1
        self._next[base] = k
        self._names.add(n)
        b = Buf(n, kind, dtype, tuple(int(s) for s in shape), value)
        self.bufs.append(b)
        if not b.onchip:
            self.hbm_bytes += b.nbytes
            if self.hbm_limit is not None and self.hbm_bytes > self.hbm_limit:
                raise error("NCC_EOOM001", f"the model needs more than {self.hbm_bytes:,} bytes of device memory "
                            f"(inputs, outputs, constants and intermediates, at {self.origin or 'its inputs'}); "
                            f"the device has {self.hbm_limit:,}", hint="shard the model or use a larger target")
        return b

    def drop(self, *bufs: Buf) -> None:
        """Remove buffers no instruction uses (made before lowering knew they would not be needed, or left
        unread by forwarding)."""
        if not bufs:
            return
        for buf in bufs:
            assert not buf.users, f"{buf.name} is in use"
            if not buf.onchip:
                self.hbm_bytes -= buf.nbytes
        gone = {id(b) for b in bufs}
        self.bufs = [b for b in self.bufs if id(b) not in gone]

    def tile(self, shape: Iterable[int], dtype: dt.DType, mem: str = "sbuf", name: str = "t") -> Buf:
        return self.buf(name, mem, dtype, shape)

    def alias(self, buf: Buf, dtype: dt.DType, shape: Iterable[int]) -> Buf:
        """A view of on-chip tile ``buf``'s bytes as ``dtype[shape]`` (same partitions, starting at its
        first byte, no more bytes per partition): bit reinterpretation with no instruction. The
        scheduler places it with its base and keeps the base alive for the view's uses; dependences
        between the two are exact per byte (they are tracked as one buffer)."""
        root = buf.root
        shape = tuple(int(s) for s in shape)
        if not root.onchip:
            raise ValueError(f"{root.name} is not an on-chip tile: only tiles can be viewed as another type")
        if shape[0] != root.shape[0] or math.prod(shape[1:]) * dtype.itemsize > root.row_bytes:
            raise ValueError(f"a {dtype.name}{list(shape)} view does not fit tile {root}")
        b = self.buf(root.name + "_as_" + dtype.name, root.kind, dtype, shape)
        b.base = root
        return b

    def add(self, engine: str, opcode: str, *operands: Ref, **attrs: Any) -> Inst:
        """Append an instruction; its reads and writes come from the opcode's operand schema."""
        if len(self.insts) >= MAX_INSTRUCTIONS:
            raise error("NCC_EVRF007", f"the program needs more than {MAX_INSTRUCTIONS:,} instructions (at "
                        f"{self.origin or 'the start'})", hint="the model is too large for one NeuronCore program")
        op = OPS[opcode]
        inst = Inst(engine, opcode, tuple(operands), dict(attrs), self.origin, len(self.insts))
        for spec, r in zip(op.operands, operands):
            (inst.writes if spec.write else inst.reads).append(r)
        for a in op.attrs:
            v = attrs.get(a.name)
            if isinstance(v, Ref):
                (inst.writes if a.kind == "out" else inst.reads).append(v)
        if opcode == "matmul" and not attrs.get("start", False):
            inst.reads.append(operands[0])  # accumulates into the partial sum
        if opcode == "scatter" and attrs.get("mode") == "add":
            inst.reads.append(operands[0])
        self._depend(inst)
        self.insts.append(inst)
        if engine in self._recent:
            self._account(inst)
        touched = {id(r.buf): r.buf for r in (*inst.reads, *inst.writes)}
        touched.update({id(b.root): b.root for b in list(touched.values())})
        for b in touched.values():
            b.users.append(inst)
        return inst

    def copy(self, on_act: bool, dst: Ref, src: Ref) -> Inst:
        """``src`` copied into ``dst`` (out of PSUM, into another type) on ScalarE (``activation``) or on
        VectorE (``tensor_copy``): the two engines that both convert, and take turns at it."""
        return self.add("act", "activation", dst, src) if on_act else self.add("dve", "tensor_copy", dst, src)

    RECENT = 0.98  # per compute instruction: how much of the engines' recent work :meth:`lighter` still counts

    def _account(self, inst: Inst) -> None:
        """The compute engines' recent work (ns, decayed per instruction): an instruction's elements per
        partition, at least the 64-cycle minimum, twice for a two-tile VectorE operation but one whose input
        will be read from PSUM (:func:`_from_psum`)."""
        r = self._recent
        for e in r:
            r[e] *= self.RECENT
        free = math.prod(inst.operands[0].shape[1:]) if inst.operands else 1
        two = inst.opcode == "tensor_tensor" and not any(_from_psum(x) for x in inst.reads)
        cycles = max(64, free) * (2 if two else 1)
        r[inst.engine] += cycles / self.clocks.get(inst.engine, 1.0)

    def lighter(self, engines: tuple[str, ...], free: int) -> str:
        """Of ``engines`` (each able to run the instruction), the one that would finish an instruction of
        ``free`` elements per partition soonest after its recent work; the first on a tie."""
        r = self._recent
        return min(engines, key=lambda e: r[e] + max(64, free) / self.clocks.get(e, 1.0))

    def resolved(self, r: Ref) -> RAccess:
        """``r`` resolved against its buffer as declared during lowering (kept with the Ref of a tile, which
        instructions use again and again; an HBM access's element set can be large, and is dropped)."""
        if not r.buf.onchip:
            return r.resolved()
        ra = r.__dict__.get("_ra")
        if ra is None:
            ra = r.__dict__["_ra"] = r.resolved()
        return ra

    def seal(self, buf: Buf) -> None:
        """HBM buffer ``buf`` is written completely and only read from now on (a lowered operator's
        result): its reads need not be remembered for a later write, which would have to wait for them;
        a write to it is an error. A model's value is read tile by tile by many operators: remembering
        each read cost memory and time in proportion to the program."""
        if buf.onchip or buf.sealed:
            return
        buf.sealed = True
        tr = self._track.get(id(buf))
        if tr is not None:
            for key in [k for k, e in tr.entries.items() if not e[2]]:
                tr.remove(key)

    def load(self, dst: Ref, src: Ref) -> None:
        """``src`` (in HBM) loaded into ``dst``: one DMA, or one per column range where the stores that wrote
        ``src`` split its last dimension, so that each piece has one writer and backend/forward.py can
        read it from the tile the store left in SBUF (BERT's layer norms read a residual sum its dot
        stored in N tiles of 512 and 256 columns: the whole row had two writers and went through HBM)."""
        L = src.shape[-1]
        cuts = {0, L}
        # the view's last dimension is its buffer's whole rows (as the writers' boxes see them), whatever the
        # view does to the others
        ap = src.ap
        plain = bool(src.buf.shape) and src.buf.shape[-1] == L and bool(ap.dims) and tuple(ap.dims[-1]) == (L, 1) \
            and ap.offset % L == 0
        if src.buf.kind == "scratch" and plain and dst.shape == src.shape:
            for inst, ra in self.writers(src):
                if inst.engine != "dma" or ra.box is None or ra.box[-1][2] != 1:
                    cuts = {0, L}
                    break
                cuts.update(c for c in ra.box[-1][:2] if 0 < c < L)
        edges = sorted(cuts)
        if len(edges) == 2 or min(b - a for a, b in zip(edges, edges[1:])) < MIN_LOAD_PIECE:
            self.add("dma", "dma", dst, src)
            return
        lead = (slice(None),) * (len(src.shape) - 1)
        for a, b in zip(edges, edges[1:]):
            self.add("dma", "dma", dst[(*lead, slice(a, b))], src[(*lead, slice(a, b))])

    def writers(self, r: Ref) -> list[tuple[Inst, RAccess]]:
        """The writes a read of ``r`` would depend on now (the latest per footprint), oldest first."""
        tr = self._track.get(id(r.buf.root))
        if tr is None:
            return []
        ra = self.resolved(r)
        out = []
        for key in tr.candidates(ra, False):
            e_ra, e_inst, e_write, _ = tr.entries[key]
            if e_write and e_ra.overlaps(ra):
                out.append((e_inst, e_ra))
        return out

    def _depend(self, inst: Inst) -> None:
        for is_write, refs in ((False, inst.reads), (True, inst.writes)):
            for r in refs:
                if r.buf.kind in ("input", "const") and not is_write:
                    continue
                root = r.buf.root
                tr = self._track.get(id(root))
                if tr is None:
                    tr = self._track[id(root)] = _Track(root)  # a view and its base: one memory
                if root.sealed and is_write:
                    raise AssertionError(f"{root.name} is written after it was sealed (at {self.origin})")
                ra = self.resolved(r)
                h = hull(ra)
                for key in tr.candidates(ra, is_write):
                    e_ra, e_inst, e_write, e_h = tr.entries[key]
                    if e_inst is inst:
                        continue
                    if h is not None and e_h is not None and not all(
                            a <= d and c <= b for (a, b), (c, d) in zip(h, e_h)):
                        continue  # apart in some dimension: neither overlaps nor covers the other
                    if (is_write or e_write) and e_ra.overlaps(ra):
                        inst.deps.add(e_inst)
                    # An access that covers an older one and is ordered after it replaces it: a write
                    # (it depends on every access it overlaps), or a read after that read's own write.
                    ordered = is_write or (not e_write and e_inst in inst.deps)
                    if ordered and ra.covers(e_ra):
                        tr.remove(key)
                if not root.sealed:
                    tr.add(ra, inst, is_write, h)


def hull(ra: RAccess) -> tuple[tuple[int, int], ...] | None:
    """Per declared dimension of an HBM tensor, a range ``(first, last)`` of the coordinates the access
    may touch (its box's, or for an access that is no box, a superset worked out from its pattern), so
    that two accesses apart in some dimension are told apart without their exact element sets; None on
    chip (tiles are compared by partitions and bytes) or where no such range is known."""
    if ra.onchip:
        return None
    if ra.box is not None:
        return tuple((s, e - 1) for s, e, _ in ra.box)
    shape = ra.tensor.shape
    strides = contiguous_strides(shape)
    n = len(shape)
    ap = ra.ap
    first = [(ap.offset // st) % m for st, m in zip(strides, shape)]
    ext = [0] * n
    for size, st in ap.dims:
        if size == 1 or st == 0:
            continue
        if st < 0:
            return None
        d = next(d for d in range(n) if strides[d] <= st and st % strides[d] == 0)
        ext[d] += (size - 1) * (st // strides[d])
    out = []
    carry = 0
    for d in range(n - 1, -1, -1):  # a dimension that overflows spans its whole range and carries outward
        top = first[d] + ext[d] + carry
        if top >= shape[d]:
            carry = top // shape[d]
            out.append((0, shape[d] - 1))
        else:
            carry = 0
            out.append((first[d], top))
    return tuple(reversed(out)) if not carry else None

"""The instruction set: one record per opcode with its operands, attributes, checks and semantics.

Everything about an instruction lives in its class here: which streams may run it, what its
operands and attributes are, which shapes and types it accepts (``check``), what it computes on
numpy (``run``), and the variables its cost formula in the target spec reads (``cost_vars``). The
timing model adds engine clocks, DMA and semaphores; the text form is in :mod:`nxsat.sim.asm`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import error
from nxsat.sim import numerics as nm
from nxsat.sim.program import (
    AP,
    Access,
    Instr,
    Tensor,
    ap_runs,
    box_runs,
    boxes_overlap,
    runs_cover,
    runs_overlap,
    stream_kind,
)

# --- resolved instructions ---------------------------------------------------------------------

class RAccess:
    """An access resolved against its tensor: shape, memory, access pattern, and where it lies.

    Built once per distinct access of a program (the verifier shares them), so everything the
    checks, the executor and the timing model ask of it is computed here, once. ``p0:p1`` are its
    absolute partitions and ``lo:hi`` the row bytes it may touch (on chip), or ``lo:hi`` its flat
    element span (HBM). ``overlaps`` and ``covers`` are the one definition of when two accesses
    meet: exactly (strided index boxes) within a tensor, by partitions and bytes between on-chip
    tensors that share memory."""

    __slots__ = ("acc", "tensor", "ap", "box", "name", "dtype", "memory", "onchip", "shape", "size", "nbytes",
                 "partitions", "free", "p0", "p1", "lo", "hi", "dense", "npindex", "_runs")

    def __init__(self, acc: Access, tensor: Tensor, ap: AP, box: tuple[tuple[int, int, int], ...] | None) -> None:
        self.acc = acc
        self.tensor = tensor
        self.ap = ap
        self.box = box  # None: the element set is not one box of the declared dimensions (see ``runs``)
        self._runs: tuple[np.ndarray, np.ndarray] | None = None
        self.name = tensor.name
        # The numpy index of the access on its tensor's array (the executor's view).
        self.npindex = tuple(ix.start if ix.single else slice(ix.start, ix.stop, ix.step) for ix in acc.index) \
            if acc.index else None
        self.dtype = tensor.dtype
        self.memory = tensor.memory
        self.onchip = tensor.onchip
        self.shape = ap.shape
        self.size = math.prod(self.shape)
        self.nbytes = self.size * self.dtype.itemsize
        if ap.part:
            self.partitions = ap.part[1]
            self.free = ap.free_elems
            lo, hi = ap.span()
            item = self.dtype.itemsize
            base = tensor.offset or 0
            self.p0 = tensor.partition + ap.part[0]
            self.p1 = self.p0 + ap.part[1]
            self.lo, self.hi = base + lo * item, base + hi * item
            self.dense = (hi - lo) == self.free
        else:
            self.partitions = self.shape[0] if self.shape else 1
            self.free = self.size // max(1, self.partitions)
            self.p0 = self.p1 = 0
            self.lo, self.hi = ap.span()
            self.dense = (self.hi - self.lo) == self.size

    def byte_range(self) -> tuple[int, int]:
        """(lo, hi) bytes within a partition row that this access may touch (on-chip only)."""
        return self.lo, self.hi

    def abs_partitions(self) -> tuple[int, int]:
        """(first, count) absolute partitions (on-chip only)."""
        return self.p0, self.p1 - self.p0

    @property
    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        """The exact element set as flat intervals (of a partition's row, on chip), made when needed."""
        if self._runs is None:
            self._runs = box_runs(self.box, self.tensor.shape, self.onchip) if self.box is not None \
                else ap_runs(self.ap)
        return self._runs

    @property
    def key(self) -> tuple:
        """What identifies the element set within its tensor (equal keys: the same elements)."""
        if self.box is not None:
            return self.box
        s, e = self.runs
        return (self.p0, self.p1, s.tobytes(), e.tobytes())

    def overlaps(self, o: RAccess) -> bool:
        """Do the two accesses share an element (a byte, between on-chip tensors sharing memory)?"""
        if self.name == o.name:
            if self.box is not None and o.box is not None:
                return boxes_overlap(self.box, o.box)
            if self.onchip and not (self.p0 < o.p1 and o.p0 < self.p1):
                return False
            return runs_overlap(self.runs, o.runs)
        if not self.onchip or self.memory != o.memory:
            return False
        return self.p0 < o.p1 and o.p0 < self.p1 and self.lo < o.hi and o.lo < self.hi

    def covers(self, o: RAccess) -> bool:
        """Does this access touch every element (byte) that ``o`` touches?"""
        if self.name == o.name:
            if self.box is not None and o.box is not None:
                return all(k == 1 and s <= s2 and e2 <= e for (s, e, k), (s2, e2, _) in zip(self.box, o.box))
            if self.onchip and not (self.p0 <= o.p0 and o.p1 <= self.p1):
                return False
            return runs_cover(self.runs, o.runs)
        if not self.onchip or not self.dense or self.memory != o.memory:
            return False
        return self.p0 <= o.p0 and o.p1 <= self.p1 and self.lo <= o.lo and o.hi <= self.hi

    def __repr__(self) -> str:
        return f"RAccess({self.name}{list(self.shape)})"


@dataclass(slots=True, eq=False)
class LInstr:
    """An instruction linked to its resolved operands; ``index`` is its place in the program.

    Instructions with the same stream, opcode, operands and attributes share one ``template``
    (their operands, attributes and effects are the same objects): they are checked once, and the
    timing model prices them once."""

    instr: Instr
    index: int
    op: Op
    ops: list[RAccess]
    attrs: dict[str, Any]
    reads: list[RAccess] = field(default_factory=list)
    writes: list[RAccess] = field(default_factory=list)
    ranks: int = 1
    domains: tuple[str, ...] = ()  # per ALU step: "int" (exact), "f32" or "raw" (bits moved), set when linked
    template: int = -1

    @property
    def line(self) -> int:
        return self.instr.line

    @property
    def stream(self) -> str:
        return self.instr.stream


class CheckFail(ValueError):
    """Raised by a check; the verifier turns it into a coded error at the instruction's line."""

    def __init__(self, message: str, code: str = "NCC_EASM004") -> None:
        super().__init__(message)
        self.code = code


Later = Callable[[], None] | None  # what an instruction's run leaves to finish on a host thread


class ExecCtx(Protocol):
    """What an instruction's ``run`` sees: memory of one rank, the target, warnings."""

    rank: int
    saturate: dict[str, bool]
    groups: dict[tuple[int, int], list[Any]]  # open PSUM accumulation groups: their members' operands

    def read(self, ra: RAccess) -> np.ndarray: ...
    def write(self, ra: RAccess, values: np.ndarray) -> None: ...
    def write_raw(self, ra: RAccess, values: np.ndarray) -> None: ...
    def warn(self, message: str) -> None: ...


@dataclass(frozen=True)
class Transfer:
    """Data an instruction moves through the DMA engines (for the timing model)."""

    nbytes: int
    hbm_bytes: int
    descriptor_bytes: float
    engines: int
    spill_bytes: int = 0
    efficiency: float = 1.0  # fraction of the engines' rate the transfer reaches (a DMA transpose: 0.9)


# --- operand and attribute schemas -------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """An operand slot of an opcode: its name, the memories it may be in, whether it is written."""

    name: str
    memories: frozenset[str]
    write: bool = False


@dataclass(frozen=True)
class Attr:
    """An attribute: ``kind`` is bool | int | float | enum | ints | scalar (float or [P,1] access,
    read) | in (access, read) | out (access, written)."""

    name: str
    kind: str
    default: Any = None
    choices: tuple[str, ...] = ()
    since: tuple[int, int] = (1, 0)  # the ISA version that introduced it (a non-default value needs it)
    choices_since: tuple[tuple[str, tuple[int, int]], ...] = ()  # enum values added by a later version


SB = frozenset({"sbuf"})
PS = frozenset({"psum"})
SBPS = frozenset({"sbuf", "psum"})
HBM = frozenset({"hbm"})
SBHBM = frozenset({"sbuf", "hbm"})


def inner_stride_bytes(ra: RAccess) -> int:
    """Bytes between consecutive elements of an access's innermost dimension that has more than one
    (an engine reads a larger stride at a fraction of its rate)."""
    for size, stride in reversed(ra.ap.dims):
        if size > 1:
            return abs(stride) * ra.dtype.itemsize
    return ra.dtype.itemsize


def _sq(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s for s in shape if s != 1)


def same_shape(a: RAccess, b: RAccess) -> bool:
    """Equal shapes up to size-1 dimensions (on-chip: equal partition counts too)."""
    if a.ap.part and b.ap.part:
        return a.ap.part[1] == b.ap.part[1] and _sq(a.shape[1:]) == _sq(b.shape[1:])
    return _sq(a.shape) == _sq(b.shape)


def _shape_str(ra: RAccess) -> str:
    return f"{ra.name}{list(ra.shape)}"


def _need_same(a: RAccess, b: RAccess, what: str) -> None:
    if not same_shape(a, b):
        raise CheckFail(f"{what}: {_shape_str(a)} and {_shape_str(b)} differ in shape")


def _need_per_partition(s: RAccess, dst: RAccess, what: str) -> None:
    if s.ap.part is None or s.ap.part[1] != dst.partitions or s.free != 1:
        raise CheckFail(f"{what} must be a [{dst.partitions}, 1] on-chip access (one value per partition), "
                        f"got {_shape_str(s)}")


def _per_partition(x: ExecCtx, s: RAccess, rank: int, domain: str) -> np.ndarray:
    v = nm.load(x.read(s), domain).reshape(-1)
    return v.reshape((-1,) + (1,) * (rank - 1))


def _scalar(x: ExecCtx, v: Any, dst: RAccess, domain: str) -> Any:
    if isinstance(v, RAccess):
        return _per_partition(x, v, len(dst.shape), domain)
    return np.int64(v) if domain == "int" else np.float32(v)


def _alu_domain(c: LInstr, target: Any, op: str | None, *ras: RAccess) -> str:
    """The domain one ALU step of ``c`` computes in on its engine (see numerics.compute_domain)."""
    return nm.compute_domain(c.stream, op, [r.dtype for r in ras], target.exact_int_engines, target.exact_int_types)


def _convert(v: np.ndarray, src: str, dst: str, tile: dt.DType) -> np.ndarray:
    """An intermediate value carried from one ALU step's domain to the next's: into the integer
    domain it truncates and saturates to the 32-bit range of the tile's signedness (a u32 tile's
    3e9 stays 3e9)."""
    if src == dst:
        return v
    if dst == "f32":
        return nm.to_f32(v)
    wide = dt.S32 if tile.is_signed else dt.U32
    return dt.cast(np.asarray(v, dtype=np.float32), wide).astype(np.int64)


# --- opcodes -----------------------------------------------------------------------------------

class Op:
    """Base of every opcode. Subclasses set the class attributes and override what they need."""

    name = ""
    engines: tuple[str, ...] = ()
    operands: tuple[Operand, ...] = ()
    attrs: tuple[Attr, ...] = ()
    doc = ""
    combines_ranks = False  # a collective: its result on one rank depends on the others'
    rank_dependent = False  # its result differs from rank to rank whatever it reads (reduce_scatter)
    since: tuple[int, int] = (1, 0)  # the ISA version that introduced the instruction

    def attr(self, name: str) -> Attr:
        return next(a for a in self.attrs if a.name == name)

    def check(self, c: LInstr, target: Any) -> None:
        """Shape and type rules beyond the operand memories (raise CheckFail)."""

    def effects(self, c: LInstr) -> tuple[list[RAccess], list[RAccess]]:
        reads = [ra for o, ra in zip(self.operands, c.ops) if not o.write]
        writes = [ra for o, ra in zip(self.operands, c.ops) if o.write]
        for a in self.attrs:
            v = c.attrs.get(a.name)
            if isinstance(v, RAccess):
                (writes if a.kind == "out" else reads).append(v)
        return reads, writes

    def data_reads(self, c: LInstr) -> list[RAccess]:
        """Reads that must wait for an earlier instruction of the same engine to write them."""
        return c.reads

    def domains(self, c: LInstr, target: Any) -> tuple[str, ...]:
        """Where each ALU step computes (``int``, ``f32`` or ``raw``); decided once, when linked."""
        return ()

    # Attributes whose values may have a cost of their own in the spec (``activation[func=reciprocal]``).
    cost_attrs: tuple[str, ...] = ()

    def cycles(self, c: LInstr, target: Any) -> float:
        """The engine cycles this instruction occupies: the target spec's cost formula (the one table
        where every cost is written, with its source) evaluated on this instruction's ``cost_vars``;
        an engine access whose innermost stride passes the spec's limit runs at a fraction of the
        rate (``access.strided_factor``, documented)."""
        kind = stream_kind(c.stream)
        variants = tuple(f"{a}={c.attrs[a]}" for a in self.cost_attrs)
        f = target.cost(self.name, kind, variants)
        if f is None:
            raise error("NCC_ETGT001", f"target {target.name} has no cost for {self.name} on {kind}",
                        hint=f"add costs.{self.name} or costs.{self.name}@{kind} to the target spec")
        cycles = f({**target.constants, **self.cost_vars(c, target)})
        if not math.isfinite(cycles) or cycles < 0:
            raise error("NCC_ETGT001", f"cost of {self.name} on {kind} is {cycles} cycles")
        acc = target.access
        if kind in acc["strided_engines"] and any(
                ra.onchip and inner_stride_bytes(ra) > acc["strided_bytes"] for ra in (*c.reads, *c.writes)):
            cycles *= acc["strided_factor"]
        return cycles

    def run(self, x: ExecCtx, c: LInstr) -> Later:
        """Read the operands and compute; large numpy work that releases the GIL (a group's products, a
        transcendental function over a big tile) may be returned instead, to finish writing the results
        later: the executor runs it on a host thread while other streams go on (sim/execute.py)."""
        raise NotImplementedError

    def run_all(self, xs: list[ExecCtx], c: LInstr) -> Later:
        """Run on every rank: independently, except for collectives, which combine the ranks."""
        later = [f for x in xs if (f := self.run(x, c)) is not None]
        if len(later) <= 1:
            return later[0] if later else None

        def finish() -> None:
            for f in later:
                f()

        return finish

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        """The variables a cost formula may read (docs/device-model.md lists them)."""
        dst = c.ops[0] if c.ops else None
        onchip = [ra for ra in c.ops if ra.onchip]
        ins = [ra for o, ra in zip(self.operands, c.ops) if not o.write]
        return {
            "N": max((ra.free for ra in onchip), default=1),
            "P": dst.partitions if dst is not None else 1,
            "psum_in": 1 if any(ra.memory == "psum" for ra in ins) else 0,
            "all_sbuf": 1 if onchip and all(ra.memory == "sbuf" for ra in onchip) else 0,
            "lowp": 1 if c.ops and all(ra.dtype in (dt.BF16, dt.F16) for ra in c.ops) else 0,
            "contig": 1 if all(inner_stride_bytes(ra) <= ra.dtype.itemsize for ra in onchip) else 0,
            "fp32": 1 if any(ra.dtype is dt.F32 for ra in ins) else 0,
        }

    def flops(self, c: LInstr) -> tuple[str, float] | None:
        """(precision, FLOPs) of TensorE work that counts toward MFU."""
        return None

    def transfer(self, c: LInstr, target: Any) -> Transfer | None:
        return None



# TensorE --------------------------------------------------------------------------------------

SMALL_MATMUL = 1 << 18  # M*K*N below which numpy's per-call overhead outweighs a batching copy
OFFLOAD_MACS = 1 << 24  # a group's multiply-adds (~0.5 ms in fp64) worth a host thread: smaller ones ran
# 3x slower there than here (mha_block's), their operands in another core's cache
SMALL_BATCH = 1024  # small products per batched call (fp64 copies of 9,408 members would be 1 GB)


class Matmul(Op):
    name = "matmul"
    engines = ("pe",)
    operands = (Operand("dst", PS, write=True), Operand("stationary", SB), Operand("moving", SB))
    attrs = (Attr("start", "bool", False), Attr("stop", "bool", False),
             Attr("precision", "enum", "fp32", ("fp32", "tf32")),
             Attr("perf", "enum", "normal", ("normal", "double_row"), since=(1, 1)))
    doc = ("dst[M, N] (psum, f32) = or += stationary[K, M].T @ moving[K, N]; K on partitions. perf=double_row "
           "(NeuronCore-v3 fp8): stationary[K, 2, M] and moving[K, 2, N] contract over 2K in the time of K")

    @staticmethod
    def rows(c: LInstr) -> int:
        """Contraction rows per partition: 2 in double-row mode."""
        return 2 if c.attrs["perf"] == "double_row" else 1

    def check(self, c: LInstr, target: Any) -> None:
        dst, st, mv = c.ops
        mm = target.matmul
        k = st.partitions
        if c.attrs["perf"] == "double_row":
            if not target.double_row(st.dtype.name):
                raise CheckFail(f"perf=double_row needs fp8 operands on a core that has the mode "
                                f"({target.name}: {', '.join(mm.get('double_row_dtypes', ())) or 'none'})",
                                code="NCC_ESPP004")
            if len(st.shape) < 3 or st.shape[1] != 2 or len(mv.shape) < 3 or mv.shape[1] != 2:
                raise CheckFail(f"perf=double_row takes stationary [K, 2, M] and moving [K, 2, N], got "
                                f"{_shape_str(st)} and {_shape_str(mv)}")
        m = st.free // self.rows(c)
        if len(_sq(st.shape[1 + (self.rows(c) == 2):])) > 1:
            raise CheckFail(f"stationary {_shape_str(st)} must be [K, M]")
        if mv.partitions != k:
            raise CheckFail(f"contraction mismatch: stationary has K={k} partitions, moving has {mv.partitions}")
        if k > mm["rows"]:
            raise CheckFail(f"K={k} exceeds the {mm['rows']}-row array")
        if m > mm["cols"]:
            raise CheckFail(f"M={m} (stationary columns) exceeds the {mm['cols']}-column array")
        n = mv.free // self.rows(c)
        if n > mm["max_moving"]:
            raise CheckFail(f"N={n} (moving columns) exceeds {mm['max_moving']}")
        if dst.dtype is not dt.F32:
            raise CheckFail(f"matmul writes fp32 PSUM; {dst.name} is {dst.dtype.name}")
        if dst.partitions != m or dst.free != n:
            raise CheckFail(f"dst {_shape_str(dst)} must be [{m}, {n}] for stationary "
                            f"{_shape_str(st)} and moving {_shape_str(mv)}")
        if st.dtype is not mv.dtype:
            raise CheckFail(f"stationary is {st.dtype.name} but moving is {mv.dtype.name}")
        prec = self.precision(c)
        if not target.supports_matmul_dtype(prec):
            raise CheckFail(f"TensorE of {target.name} does not multiply {prec}", code="NCC_ESPP004")
        if c.attrs["precision"] == "tf32" and st.dtype is not dt.F32:
            raise CheckFail("precision=tf32 applies to f32 operands only")
        lo, hi = dst.byte_range()
        bank = target.psum_bank_bytes
        if lo // bank != (hi - 1) // bank:
            raise CheckFail(f"matmul output {_shape_str(dst)} at bytes {lo}..{hi} crosses a PSUM bank boundary "
                            f"(banks of {bank} bytes per partition)", code="NCC_EASM006")

    @staticmethod
    def precision(c: LInstr) -> str:
        st = c.ops[1]
        if st.dtype is dt.F32:
            return "tf32" if c.attrs["precision"] == "tf32" else "f32"
        return st.dtype.name

    def effects(self, c: LInstr) -> tuple[list[RAccess], list[RAccess]]:
        reads, writes = super().effects(c)
        if not c.attrs["start"]:
            reads = [c.ops[0], *reads]  # accumulate: reads the partial sum
        return reads, writes

    def data_reads(self, c: LInstr) -> list[RAccess]:
        return list(c.ops[1:])  # PSUM accumulates in place: no stall for the partial sum

    def run(self, x: ExecCtx, c: LInstr) -> Later:
        """An accumulation group is computed at its ``stop=true`` matmul over the operands each member
        read when it ran (nothing may touch the group's region before then): each member's product
        (exact, rounded once to fp32: :func:`~nxsat.sim.numerics.matmul`) added in fp32 in program
        order, the same result as adding each product into PSUM as it arrives. Small products of one
        shape go to numpy as batched matmuls. The stop member returns the arithmetic and the write, to
        be finished while other streams go on."""
        dst, st, mv = c.ops
        k = st.partitions * self.rows(c)  # double row: (partition, row) pairs are the contraction
        # the operands as they are now, widened (a copy) in their own layout: numpy's transposing cast
        # from a 16-bit float is several times slower; BLAS reads the stationary transposed
        tf32 = self.precision(c) == "tf32"
        wide = np.float32 if tf32 else np.float64
        s, m = x.read(st).reshape(k, -1).astype(wide), x.read(mv).reshape(k, -1).astype(wide)
        if tf32:
            s, m = dt.round_tf32(s), dt.round_tf32(m)
        member = (s.T, m)
        key = (dst.p0, dst.lo)
        group = x.groups[key] = [] if c.attrs["start"] else x.groups[key]
        group.append(member)
        if not c.attrs["stop"]:
            return None
        del x.groups[key]
        if sum(a.shape[0] * a.shape[1] * b.shape[1] for a, b in group) >= OFFLOAD_MACS:
            return lambda: x.write(dst, _group_sum(group).reshape(dst.shape))
        x.write(dst, _group_sum(group).reshape(dst.shape))
        return None

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        _, st, mv = c.ops
        r = self.rows(c)
        return {"M": st.free // r, "N": mv.free // r, "K": st.partitions, "P": st.partitions,
                "dtype_factor": target.matmul_dtype_factor(self.precision(c)) or 1.0}

    def flops(self, c: LInstr) -> tuple[str, float] | None:
        _, st, mv = c.ops
        r = self.rows(c)
        return self.precision(c), 2.0 * st.partitions * st.free * mv.free / r


def _group_sum(members: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """An accumulation group's products (each member's [M, K] stationary and [K, N] moving operand as
    read and widened), added in fp32 in program order."""
    ss = [a for a, _ in members]
    ms = [b for _, b in members]
    small = ss[0].shape[0] * ss[0].shape[1] * ms[0].shape[1] < SMALL_MATMUL
    if len(ss) > 1 and small and len({(a.shape, b.shape) for a, b in zip(ss, ms)}) == 1:
        batches = range(0, len(ss), SMALL_BATCH)  # one call for many small ones
        products = [p for i in batches
                    for p in nm.matmul(np.stack(ss[i:i + SMALL_BATCH]), np.stack(ms[i:i + SMALL_BATCH]))]
    else:
        products = [nm.matmul(a, b) for a, b in zip(ss, ms)]
    r = products[0]
    for p in products[1:]:
        r += p
    return r


class Transpose(Op):
    name = "transpose"
    engines = ("pe",)
    operands = (Operand("dst", PS, write=True), Operand("src", SB))
    doc = ("dst[F, P] (psum) = src[P, F].T through TensorE: on NeuronCore-v2 a matmul against the identity "
           "(fp32 result; a NaN or infinity spreads along its output row), on v3 a bit-exact transpose mode "
           "(16-bit results allowed)")

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        allowed = target.spec["transpose"]["psum_dtypes"]
        if dst.dtype.name not in allowed or (dst.dtype is not dt.F32 and dst.dtype is not src.dtype):
            raise CheckFail(f"transpose on {target.core} writes {' or '.join(allowed)} (a 16-bit result needs a "
                            f"source of that type), not {dst.dtype.name}")
        if len(_sq(src.shape[1:])) > 1:
            raise CheckFail(f"transpose source {_shape_str(src)} must be [P, F]")
        if src.free > target.matmul["cols"] or src.partitions > target.matmul["rows"]:
            raise CheckFail(f"transpose of {_shape_str(src)} exceeds the {target.matmul['rows']}x"
                            f"{target.matmul['cols']} array")
        if dst.partitions != src.free or dst.free != src.partitions:
            raise CheckFail(f"dst {_shape_str(dst)} must be [{src.free}, {src.partitions}]")
        lo, hi = dst.byte_range()
        bank = target.psum_bank_bytes
        if lo // bank != (hi - 1) // bank:
            raise CheckFail(f"transpose output {_shape_str(dst)} crosses a PSUM bank boundary", code="NCC_EASM006")

    def domains(self, c: LInstr, target: Any) -> tuple[str, ...]:
        return ("raw",) if target.spec["transpose"]["exact"] else ("f32",)

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        v = x.read(src).reshape(src.partitions, -1)
        if c.domains[0] == "raw":
            x.write_raw(dst, np.ascontiguousarray(v.T).reshape(dst.shape)) if dst.dtype is src.dtype else \
                x.write(dst, nm.to_f32(v).T.reshape(dst.shape))
            return
        f = nm.to_f32(v)
        if np.isfinite(f).all():
            x.write(dst, f.T.reshape(dst.shape))
        else:  # an identity matmul: 0 * inf and 0 * nan are nan, so they spread along the output row
            x.write(dst, np.matmul(f.T, np.eye(f.shape[0], dtype=np.float32)).reshape(dst.shape))

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        v = super().cost_vars(c, target)
        _, src = c.ops
        v["P"], v["N"] = src.partitions, src.free
        return v


# ScalarE ---------------------------------------------------------------------------------------

# The activation functions VectorE also runs (NKI's VectorE reciprocal, at a documented 8x ScalarE's cost).
DVE_FUNCTIONS = ("identity", "relu", "abs", "square", "sign", "reciprocal")


class Activation(Op):
    name = "activation"
    engines = ("act", "dve")
    operands = (Operand("dst", SBPS, write=True), Operand("src", SBPS))
    attrs = (Attr("func", "enum", "identity", tuple(nm.ACTIVATIONS), choices_since=tuple(nm.ACTIVATION_SINCE.items())),
             Attr("scale", "scalar", 1.0),
             Attr("bias", "scalar", 0.0), Attr("accum", "out", None))
    doc = ("dst = func(scale * src + bias) in fp32; accum (optional) = per-partition sum of those fp32 "
           "results (before their cast to dst's type)")

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        _need_same(dst, src, "activation")
        for k in ("scale", "bias"):
            if isinstance(c.attrs[k], RAccess):
                _need_per_partition(c.attrs[k], dst, k)
        acc = c.attrs["accum"]
        if acc is not None:
            _need_per_partition(acc, dst, "accum")
            if not acc.dtype.is_float:
                raise CheckFail("accum must be a float tile")
        if c.stream == "dve" and c.attrs["func"] not in DVE_FUNCTIONS:
            raise CheckFail(f"VectorE has no {c.attrs['func']} function; run it on act")

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        v = nm.to_f32(x.read(src)).reshape(dst.shape)
        scale = c.attrs["scale"]
        if not isinstance(scale, RAccess) and scale == 1.0:  # x * 1 is x: one pass over the tile saved
            t = v + _scalar(x, c.attrs["bias"], dst, "f32")
        else:
            t = v * _scalar(x, scale, dst, "f32") + _scalar(x, c.attrs["bias"], dst, "f32")
        fn, acc = nm.ACTIVATIONS[c.attrs["func"]], c.attrs["accum"]

        def finish() -> None:
            y = fn(np.asarray(t, dtype=np.float32))
            x.write(dst, y)
            if acc is not None:
                s = np.add.reduce(y.reshape(dst.partitions, -1), axis=1, dtype=np.float32)
                x.write(acc, s.reshape(acc.shape))

        if c.attrs["func"] in nm.COSTLY_ACTIVATIONS and t.size >= nm.OFFLOAD_MIN:
            return finish  # a transcendental function over a large tile: on a host thread
        finish()
        return None

    cost_attrs = ("func",)

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        v = super().cost_vars(c, target)
        v["accum"] = 1 if c.attrs["accum"] is not None else 0
        return v


# VectorE / GpSimd elementwise -------------------------------------------------------------------

ALU_OPS = tuple(nm.BINARY)


class TensorTensor(Op):
    name = "tensor_tensor"
    engines = ("dve", "pool")
    operands = (Operand("dst", SBPS, write=True), Operand("a", SBPS), Operand("b", SBPS))
    attrs = (Attr("op", "enum", None, ALU_OPS),)
    doc = "dst = a op b, elementwise, same shapes"

    def check(self, c: LInstr, target: Any) -> None:
        dst, a, b = c.ops
        _need_same(dst, a, "tensor_tensor")
        _need_same(dst, b, "tensor_tensor")
        if a.memory == "psum" and b.memory == "psum":
            raise CheckFail("tensor_tensor cannot read both inputs from PSUM (one PSUM read port per engine): "
                            "copy one to SBUF first")
        _check_int_op(c.attrs["op"], dst, a, b)

    def domains(self, c: LInstr, target: Any) -> tuple[str, ...]:
        return (_alu_domain(c, target, c.attrs["op"], *c.ops),)

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, a, b = c.ops
        d = c.domains[0]
        va = nm.load(x.read(a), d).reshape(dst.shape)
        vb = nm.load(x.read(b), d).reshape(dst.shape)
        x.write(dst, nm.BINARY[c.attrs["op"]](va, vb))  # the executor ignores fp errors (inf, nan)

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        v = super().cost_vars(c, target)
        bf16_fast = (all(r.dtype is dt.BF16 for r in c.ops) and c.attrs["op"] in ("add", "mul", "sub")
                     and all(r.ap.contiguous_run() == r.free for r in c.ops))
        v["fast"] = 1 if (v["psum_in"] or bf16_fast) else 0
        return v


def _check_int_op(op: str, *ras: RAccess, stream: str = "") -> None:
    if op in nm.INT_ONLY_OPS and not all(r.dtype.is_int for r in ras):
        raise CheckFail(f"{op} works on integer tiles only")
    if op in nm.INT_ONLY_OPS and stream == "act":
        raise CheckFail(f"ScalarE has no bitwise operators ({op}): run it on dve or pool")


class TensorScalar(Op):
    name = "tensor_scalar"
    engines = ("dve", "pool", "act")
    operands = (Operand("dst", SBPS, write=True), Operand("src", SBPS))
    attrs = (Attr("op0", "enum", None, ALU_OPS), Attr("scalar0", "scalar", 0.0),
             Attr("op1", "enum", "none", ("none", *ALU_OPS)), Attr("scalar1", "scalar", 0.0))
    doc = "dst = (src op0 scalar0) op1 scalar1; a scalar is an immediate or a [P, 1] tile"

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        _need_same(dst, src, "tensor_scalar")
        for k in ("scalar0", "scalar1"):
            if isinstance(c.attrs[k], RAccess):
                _need_per_partition(c.attrs[k], dst, k)
        _check_int_op(c.attrs["op0"], dst, src, stream=c.stream)
        if c.attrs["op1"] != "none":
            _check_int_op(c.attrs["op1"], dst, src, stream=c.stream)

    def domains(self, c: LInstr, target: Any) -> tuple[str, ...]:
        dst, src = c.ops
        out = []
        for k in ("0", "1"):
            op, v = c.attrs["op" + k], c.attrs["scalar" + k]
            if op == "none":
                break
            tiles = (dst, src) + ((v,) if isinstance(v, RAccess) else ())
            d = _alu_domain(c, target, op, *tiles)
            if d == "int" and not isinstance(v, RAccess) and float(v) != int(v):
                raise CheckFail(f"op{k}={op} computes on integers here: scalar{k}={v} must be an integer")
            out.append(d)
        return tuple(out)

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        d0 = c.domains[0]
        v = nm.load(x.read(src), d0).reshape(dst.shape)
        v = nm.BINARY[c.attrs["op0"]](v, _scalar(x, c.attrs["scalar0"], dst, d0))
        if c.attrs["op1"] != "none":
            d1 = c.domains[1]
            v = nm.BINARY[c.attrs["op1"]](_convert(v, d0, d1, dst.dtype), _scalar(x, c.attrs["scalar1"], dst, d1))
        x.write(dst, v)


class TensorReduce(Op):
    name = "tensor_reduce"
    engines = ("dve", "pool")
    operands = (Operand("dst", SBPS, write=True), Operand("src", SBPS))
    attrs = (Attr("op", "enum", None, tuple(nm.REDUCE)), Attr("axes", "ints", ()))
    doc = "dst = reduce(op) of src over free axes (default: all free axes), fp32 accumulation"

    def axes(self, c: LInstr) -> tuple[int, ...]:
        src = c.ops[1]
        return c.attrs["axes"] or tuple(range(1, len(src.shape)))

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        axes = self.axes(c)
        if any(a < 1 or a >= len(src.shape) for a in axes) or len(set(axes)) != len(axes):
            raise CheckFail(f"axes {list(axes)} must be distinct free axes of {_shape_str(src)} "
                            f"(1..{len(src.shape) - 1})")
        kept = tuple(s for i, s in enumerate(src.shape) if i not in axes)
        if dst.partitions != src.partitions or _sq(dst.shape[1:]) != _sq(kept[1:]):
            raise CheckFail(f"dst {_shape_str(dst)} must be {list(kept)} (reduced over axes {list(axes)})")

    def domains(self, c: LInstr, target: Any) -> tuple[str, ...]:
        return (_alu_domain(c, target, c.attrs["op"], *c.ops),)

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        d = c.domains[0]
        v = nm.load(x.read(src), d)
        r = nm.REDUCE[c.attrs["op"]](v, axis=self.axes(c))
        x.write(dst, np.asarray(r).reshape(dst.shape))

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        v = super().cost_vars(c, target)
        dst, src = c.ops
        v["N"] = src.free
        v["half"] = 1 if dst.dtype is dt.BF16 and c.attrs["op"] in ("add", "max") else 0
        return v


class TensorCopy(Op):
    name = "tensor_copy"
    engines = ("dve", "pool", "act")
    operands = (Operand("dst", SBPS, write=True), Operand("src", SBPS))
    doc = "dst = src, converted to dst's type (round to nearest even)"

    def check(self, c: LInstr, target: Any) -> None:
        _need_same(c.ops[0], c.ops[1], "tensor_copy")

    def domains(self, c: LInstr, target: Any) -> tuple[str, ...]:
        # NKI: VectorE and GpSimd copy bits when the types agree, else cast through fp32; ScalarE
        # (NeuronCore-v2) always casts through fp32.
        dst, src = c.ops
        exact = c.stream in target.spec["numerics"]["exact_copy_engines"]
        return ("raw",) if dst.dtype is src.dtype and exact else ("f32",)

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        v = x.read(src).reshape(dst.shape)
        if c.domains[0] == "raw":
            x.write_raw(dst, v)
        else:
            x.write(dst, nm.to_f32(v))


class Select(Op):
    name = "select"
    engines = ("dve", "pool")
    operands = (Operand("dst", SBPS, write=True), Operand("pred", SBPS), Operand("on_true", SBPS),
                Operand("on_false", SBPS))
    doc = "dst = on_true where pred != 0 else on_false"

    def check(self, c: LInstr, target: Any) -> None:
        dst = c.ops[0]
        for r in c.ops[1:]:
            _need_same(dst, r, "select")

    def domains(self, c: LInstr, target: Any) -> tuple[str, ...]:
        dst, _, a, b = c.ops
        return ("raw",) if dst.dtype is a.dtype is b.dtype else ("f32",)  # a move, unless a type changes

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, p, a, b = c.ops
        cond = x.read(p).reshape(dst.shape) != 0
        va, vb = x.read(a).reshape(dst.shape), x.read(b).reshape(dst.shape)
        if c.domains[0] == "raw":
            x.write_raw(dst, np.where(cond, va, vb))
        else:
            x.write(dst, np.where(cond, nm.to_f32(va), nm.to_f32(vb)))


class Iota(Op):
    name = "iota"
    engines = ("pool", "dve")
    operands = (Operand("dst", SBPS, write=True),)
    attrs = (Attr("base", "int", 0), Attr("channel_multiplier", "int", 0), Attr("steps", "ints", ()))
    doc = "dst[p, i...] = base + channel_multiplier * p + sum(steps[k] * i_k) (default steps: row-major index)"

    def check(self, c: LInstr, target: Any) -> None:
        dst = c.ops[0]
        steps = c.attrs["steps"]
        if steps and len(steps) != len(dst.shape) - 1:
            raise CheckFail(f"steps needs one value per free dimension of {_shape_str(dst)}")

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst = c.ops[0]
        free = dst.shape[1:]
        steps = c.attrs["steps"] or tuple(np.cumprod((1, *free[::-1]))[:-1][::-1].tolist())
        v = np.full(dst.shape, c.attrs["base"], dtype=np.int64)
        v += c.attrs["channel_multiplier"] * np.arange(dst.shape[0], dtype=np.int64).reshape((-1,) + (1,) * len(free))
        for k, (n, s) in enumerate(zip(free, steps)):
            shape = [1] * len(dst.shape)
            shape[k + 1] = n
            v += s * np.arange(n, dtype=np.int64).reshape(shape)
        x.write(dst, v)


class AffineSelect(Op):
    name = "affine_select"
    engines = ("pool",)
    operands = (Operand("dst", SB, write=True), Operand("src", SB))
    attrs = (Attr("base", "int", 0), Attr("channel_multiplier", "int", 0), Attr("steps", "ints", ()),
             Attr("cmp", "enum", "ge", ("ge", "gt", "le", "lt", "eq", "ne")), Attr("fill", "number", 0.0))
    doc = ("dst = src where (base + channel_multiplier * p + sum(steps[k] * i_k)) cmp 0 else fill: a mask that "
           "is an affine function of the position (a causal mask), computed as it is applied")

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        _need_same(dst, src, "affine_select")
        if dst.dtype is not src.dtype:
            raise CheckFail(f"affine_select moves elements: dst {dst.dtype.name} must be src's {src.dtype.name}")
        if len(c.attrs["steps"]) != len(dst.shape) - 1:
            raise CheckFail(f"steps needs one value per free dimension of {_shape_str(dst)}")

    def domains(self, c: LInstr, target: Any) -> tuple[str, ...]:
        return ("raw",)

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        v = np.full(dst.shape, c.attrs["base"], dtype=np.int64)
        v += c.attrs["channel_multiplier"] * np.arange(dst.shape[0], dtype=np.int64).reshape(
            (-1,) + (1,) * (len(dst.shape) - 1))
        for k, (n, s) in enumerate(zip(dst.shape[1:], c.attrs["steps"])):
            shape = [1] * len(dst.shape)
            shape[k + 1] = n
            v += s * np.arange(n, dtype=np.int64).reshape(shape)
        keep = nm.BINARY[c.attrs["cmp"]](v, np.int64(0)).astype(bool)  # the ALU's comparison of the position
        fill = nm.device_cast(np.full(dst.shape, float(c.attrs["fill"])), dst.dtype, False)
        x.write_raw(dst, np.where(keep, x.read(src).reshape(dst.shape), np.asarray(fill).reshape(dst.shape)))


class Memset(Op):
    name = "memset"
    engines = ("dve", "pool", "act")
    operands = (Operand("dst", SBPS, write=True),)
    attrs = (Attr("value", "number", 0.0),)
    doc = "dst = value (exact for an integer tile: the value is not passed through fp32)"

    def check(self, c: LInstr, target: Any) -> None:
        dst = c.ops[0]
        v = c.attrs["value"]
        if dst.dtype.is_int:
            info = np.iinfo(dst.dtype.np)
            if float(v) != int(v) or not info.min <= int(v) <= info.max:
                raise CheckFail(f"memset of {dst.dtype.name} tile {dst.name}: value {v} is not a "
                                f"{dst.dtype.name} integer")

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        v = super().cost_vars(c, target)
        v["zero_bf16"] = 1 if c.ops[0].dtype is dt.BF16 and c.attrs["value"] == 0 else 0
        return v

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst = c.ops[0]
        v = c.attrs["value"]
        if dst.dtype.is_int:
            x.write_raw(dst, np.full(dst.shape, int(v), dtype=dst.dtype.np))
        else:
            x.write(dst, np.full(dst.shape, v, dtype=np.float32))


class BnStats(Op):
    name = "bn_stats"
    engines = ("dve",)
    operands = (Operand("dst", SBPS, write=True), Operand("src", SBPS))
    doc = ("dst[P, 6] = (count, mean, M2) of src's even-indexed and of its odd-indexed elements per "
           "partition (M2 = sum of squared deviations), fp32")

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        if dst.dtype is not dt.F32 or dst.free != 6 or dst.partitions != src.partitions:
            raise CheckFail(f"bn_stats writes f32 [{src.partitions}, 6], got {dst.dtype.name}{list(dst.shape)}")
        limit = target.spec["bn_stats"]["max_free"]
        if src.free > limit:
            raise CheckFail(f"bn_stats reads at most {limit} elements per partition, {src.name} has {src.free}: "
                            "split it into groups and merge them with bn_aggr")

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        v = nm.to_f32(x.read(src)).reshape(src.partitions, -1).astype(np.float64)
        out = np.zeros((src.partitions, 6), dtype=np.float64)
        for h in range(2):
            part = v[:, h::2]
            n = part.shape[1]
            if n:
                mean = part.mean(axis=1)
                out[:, 3 * h] = n
                out[:, 3 * h + 1] = mean
                out[:, 3 * h + 2] = ((part - mean[:, None]) ** 2).sum(axis=1)
        x.write(dst, out.astype(np.float32).reshape(dst.shape))


class BnAggr(Op):
    name = "bn_aggr"
    engines = ("dve",)
    operands = (Operand("dst", SBPS, write=True), Operand("src", SBPS))
    doc = "dst[P, 2] = (mean, population variance) merged from bn_stats groups src[P, 6k] (Chan's formula)"

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        if dst.dtype is not dt.F32 or dst.free != 2 or dst.partitions != src.partitions:
            raise CheckFail(f"bn_aggr writes f32 [{src.partitions}, 2], got {dst.dtype.name}{list(dst.shape)}")
        if src.dtype is not dt.F32 or src.free % 3 or src.free == 0:
            raise CheckFail(f"bn_aggr reads f32 bn_stats groups [P, 6k], got {src.dtype.name}{list(src.shape)}")

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        g = nm.to_f32(x.read(src)).reshape(src.partitions, -1, 3).astype(np.float64)
        n, mean, m2 = g[..., 0], g[..., 1], g[..., 2]
        total = n.sum(axis=1)
        safe = np.where(total > 0, total, 1.0)
        mu = (n * mean).sum(axis=1) / safe
        var = (m2.sum(axis=1) + (n * (mean - mu[:, None]) ** 2).sum(axis=1)) / safe
        out = np.stack([mu, var], axis=1)
        x.write(dst, out.astype(np.float32).reshape(dst.shape))

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        return {"N": c.ops[1].free, "P": c.ops[1].partitions}


# GpSimd indirect memory copies ------------------------------------------------------------------

OOB_TEXT = "failed to run scatter/gather (indirect memory copy {what} at {where}), due to out-of-bound access"


def _index_rows(x: ExecCtx, c: LInstr, idx: RAccess, rows: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices and which are in range; out-of-range ones are reported (oob=error) or not (oob=skip)."""
    i = nm.to_int(x.read(idx)).reshape(-1)
    ok = (i >= 0) & (i < rows)
    if not ok.all() and c.attrs["oob"] == "error":
        where = f"line {c.line}" + (f", {c.instr.origin}" if c.instr.origin else "")
        bad = i[~ok]
        x.warn(OOB_TEXT.format(what=what, where=where)
               + f": {bad.size} index(es) outside [0, {rows}), first {int(bad[0])}")
    return i, ok


class _Indirect(Op):
    """GpSimd indirect copies: rows of an HBM table moved to or from an SBUF tile by index."""

    def parts(self, c: LInstr) -> tuple[RAccess, RAccess, RAccess]:
        """(SBUF tile, HBM table, index tile)."""
        raise NotImplementedError

    def traffic_factor(self, c: LInstr) -> int:
        return 1

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        tile, _, idx = self.parts(c)
        return {"rows": idx.size, "N": tile.free, "P": tile.partitions}

    def transfer(self, c: LInstr, target: Any) -> Transfer | None:
        tile, table, idx = self.parts(c)
        row = tile.nbytes // max(1, idx.size)
        return _indirect_transfer(tile.nbytes, row, tile.partitions, target, table, self.traffic_factor(c))


class Gather(_Indirect):
    name = "gather"
    engines = ("pool",)
    operands = (Operand("dst", SB, write=True), Operand("table", HBM), Operand("idx", SB))
    attrs = (Attr("oob", "enum", "error", ("error", "skip"), since=(1, 1)),)
    doc = ("dst[p, j, :] = table[idx[p, j], :]; a row whose index is outside the table is left unwritten, with "
           "the runtime's out-of-bound report (oob=error, the default) or silently (oob=skip)")

    def check(self, c: LInstr, target: Any) -> None:
        dst, table, idx = c.ops
        _check_indirect(dst, table, idx, "gather")

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, table, idx = c.ops
        t = x.read(table).reshape(table.shape[0], -1)
        i, ok = _index_rows(x, c, idx, t.shape[0], "gather")
        if ok.all():
            out = t[i]
        else:
            out = np.array(x.read(dst)).reshape(i.size, -1)
            out[ok] = t[i[ok]]
        x.write_raw(dst, out.reshape(dst.shape))

    def parts(self, c: LInstr) -> tuple[RAccess, RAccess, RAccess]:
        dst, table, idx = c.ops
        return dst, table, idx


class Scatter(_Indirect):
    name = "scatter"
    engines = ("pool",)
    operands = (Operand("table", HBM, write=True), Operand("idx", SB), Operand("src", SB))
    attrs = (Attr("mode", "enum", "set", ("set", "add")), Attr("oob", "enum", "error", ("error", "skip"), since=(1, 1)))
    doc = ("table[idx[p, j], :] = (or +=) src[p, j, :]; duplicates: the last in (p, j) order wins for "
           "set, all add for add (fp32); out-of-range indices are skipped, with the runtime's report (oob=error) "
           "or silently (oob=skip)")

    def check(self, c: LInstr, target: Any) -> None:
        table, idx, src = c.ops
        _check_indirect(src, table, idx, "scatter")
        if table.tensor.kind in ("input", "const"):
            raise CheckFail(f"{table.name} is a read-only {table.tensor.kind}")

    def effects(self, c: LInstr) -> tuple[list[RAccess], list[RAccess]]:
        reads, writes = super().effects(c)
        if c.attrs["mode"] == "add":
            reads = [c.ops[0], *reads]
        return reads, writes

    def run(self, x: ExecCtx, c: LInstr) -> None:
        table, idx, src = c.ops
        t = x.read(table)
        rows = t.shape[0]
        flat = t.reshape(rows, -1)
        i, ok = _index_rows(x, c, idx, rows, "scatter")
        vals = x.read(src).reshape(i.size, -1)[ok]
        i = i[ok]
        if c.attrs["mode"] == "add":
            # Scatter with compute runs in fp32 on the device (documented), integer tables included.
            acc = nm.to_f32(flat).copy()
            np.add.at(acc, i, nm.to_f32(vals))
            new = acc
        else:
            new = flat.copy()
            # Last write wins, made explicit: keep the last occurrence of every index.
            rev_unique, rev_pos = np.unique(i[::-1], return_index=True)
            new[rev_unique] = vals[::-1][rev_pos]
        if c.attrs["mode"] == "add":
            x.write(table, new.reshape(table.shape))
        else:
            x.write_raw(table, new.reshape(table.shape))

    def parts(self, c: LInstr) -> tuple[RAccess, RAccess, RAccess]:
        table, idx, src = c.ops
        return src, table, idx

    def traffic_factor(self, c: LInstr) -> int:
        return 2 if c.attrs["mode"] == "add" else 1  # scatter-add reads the rows too


def _check_indirect(tile: RAccess, table: RAccess, idx: RAccess, what: str) -> None:
    if not idx.dtype.is_int:
        raise CheckFail(f"{what} indices must be an integer tile, {idx.name} is {idx.dtype.name}")
    if idx.partitions != tile.partitions:
        raise CheckFail(f"{what}: indices {_shape_str(idx)} and tile {_shape_str(tile)} differ in partitions")
    if len(table.shape) < 1:
        raise CheckFail(f"{what}: table must have a row dimension")
    row = math.prod(table.shape[1:])
    if tile.free != idx.free * row:
        raise CheckFail(f"{what}: tile {_shape_str(tile)} must hold {idx.free} row(s) of {row} element(s) "
                        f"per partition")
    if tile.dtype is not table.dtype:
        raise CheckFail(f"{what}: tile is {tile.dtype.name}, table is {table.dtype.name}")


def _indirect_transfer(nbytes: int, row: int, partitions: int, target: Any, table: RAccess,
                       factor: int = 1) -> Transfer:
    d = target.dma
    engines = max(1, min(d["engines"], math.ceil(partitions / d["partitions_per_engine"])))
    spill = nbytes if table.tensor.kind == "scratch" else 0
    return Transfer(nbytes * factor, nbytes * factor, max(1, row), engines, spill)


# DMA -------------------------------------------------------------------------------------------

class Dma(Op):
    name = "dma"
    engines = ("dma",)
    operands = (Operand("dst", SBHBM, write=True), Operand("src", SBHBM))
    doc = ("dst = src, byte for byte (same element type) or converted between the float types the target's "
           "DMA casts (rounded to nearest even), any strides on either side")

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        if not _sq(dst.shape) == _sq(src.shape):
            raise CheckFail(f"dma: {_shape_str(dst)} and {_shape_str(src)} differ in shape")
        same = dst.dtype is src.dtype or {dst.dtype.name, src.dtype.name} == {"pred", "u8"}
        if not same and not target.dma_casts(dst.dtype.name, src.dtype.name):
            casts = target.dma_cast_dtypes
            how = f"copies bytes or converts among {', '.join(casts)}" if casts else "copies bytes"
            raise CheckFail(f"dma {how}: {dst.name} is {dst.dtype.name}, {src.name} is {src.dtype.name} "
                            "(convert on an engine)")
        if dst.tensor.kind in ("input", "const"):
            raise CheckFail(f"{dst.name} is a read-only {dst.tensor.kind}")

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        v = x.read(src)
        if dst.dtype.is_float and src.dtype.is_float and dst.dtype is not src.dtype:
            x.write(dst, nm.to_f32(v).reshape(dst.shape))  # a converting copy (check: the target casts)
            return
        if dst.dtype is not src.dtype:
            v = v.view(dst.dtype.np)
        x.write_raw(dst, v.reshape(dst.shape))

    def transfer(self, c: LInstr, target: Any) -> Transfer | None:
        dst, src = c.ops
        return dma_transfer(dst, src, target)


class DmaTranspose(Op):
    name = "dma_transpose"
    engines = ("dma",)
    operands = (Operand("dst", SB, write=True), Operand("src", SBHBM))
    since = (1, 1)
    doc = ("dst[P, F] (SBUF) = src[F, P].T, moved by the DMA engines (NeuronCore-v3): the source's innermost "
           "dimension becomes the partition dimension; bit-exact, 2- and 4-byte types")

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        if not target.dma["transpose_efficiency"]:
            raise CheckFail(f"DMA transpose needs NeuronCore-v3 ({target.name} has {target.core}): transpose on "
                            "TensorE, or load through a transposing access pattern (slow: element-sized descriptors)")
        if dst.dtype is not src.dtype or dst.dtype.itemsize not in (2, 4):
            raise CheckFail(f"DMA transpose moves 2- or 4-byte elements of one type: {dst.name} is "
                            f"{dst.dtype.name}, {src.name} is {src.dtype.name}")
        a, b = _two_dims(src, "source")
        if (dst.partitions, dst.free) != (b, a):
            raise CheckFail(f"dst {_shape_str(dst)} must be [{b}, {a}] for source {_shape_str(src)}")

    def run(self, x: ExecCtx, c: LInstr) -> None:
        dst, src = c.ops
        a, b = _two_dims(src, "source")
        x.write_raw(dst, np.ascontiguousarray(x.read(src).reshape(a, b).T).reshape(dst.shape))

    def transfer(self, c: LInstr, target: Any) -> Transfer | None:
        dst, src = c.ops
        d = target.dma
        eff = d["transpose_efficiency"] if src.memory == "hbm" else d["sbuf_transpose_efficiency"]
        # All the engines work on one transpose together (documented), in large descriptors.
        return Transfer(dst.nbytes, dst.nbytes if src.memory == "hbm" else 0, float(d["saturating_bytes"]),
                        int(d["engines"]), dst.nbytes if src.tensor.kind == "scratch" else 0, float(eff))


def _two_dims(ra: RAccess, what: str) -> tuple[int, int]:
    shape = ra.shape if not ra.onchip else (ra.partitions, ra.free)
    dims = _sq(tuple(shape)) or (1,)
    if len(dims) == 1:
        dims = (1, dims[0]) if not ra.onchip or ra.partitions == 1 else (dims[0], 1)
    if len(dims) != 2:
        raise CheckFail(f"DMA transpose {what} {_shape_str(ra)} must be two-dimensional")
    return dims[0], dims[1]


def dma_transfer(dst: RAccess, src: RAccess, target: Any) -> Transfer:
    """Descriptor size and DMA-engine count of a copy between two access patterns (a converting one at its
    wider side's bytes)."""
    d = target.dma
    size = max(dst.dtype.itemsize, src.dtype.itemsize)
    run = min(dst.ap.contiguous_run(), src.ap.contiguous_run())
    nbytes = max(dst.nbytes, src.nbytes)
    engines = 1
    for r in (dst, src):
        if r.ap.part:
            engines = max(engines, math.ceil(r.partitions / d["partitions_per_engine"]))
    if not dst.ap.part and not src.ap.part:
        engines = math.ceil(nbytes / d["hbm_hbm_engines_per_bytes"])
    engines = max(1, min(d["engines"], engines))
    hbm = nbytes * sum(1 for r in (dst, src) if r.memory == "hbm")
    spill = nbytes if any(r.tensor.kind == "scratch" for r in (dst, src)) else 0
    return Transfer(nbytes, hbm, float(run * size), engines, spill)


# Collectives -----------------------------------------------------------------------------------

class _Collective(Op):
    engines = ("cc",)
    combines_ranks = True
    operands = (Operand("dst", SBHBM, write=True), Operand("src", SBHBM))

    def run(self, x: ExecCtx, c: LInstr) -> None:
        raise AssertionError("collectives run on all ranks at once (run_all)")

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        dst, src = c.ops
        r = c.ranks
        col = target.collectives
        steps, wire = self.ring(src.nbytes, dst.nbytes, r)
        return {"N": src.free, "P": src.partitions, "R": r, "steps": steps, "wire_bytes": wire,
                "fixed_ns": col["fixed_ns"], "hop_ns": col["hop_ns"], "link_gbps": col["link_gbps_per_rank"]}

    def ring(self, src_bytes: int, dst_bytes: int, r: int) -> tuple[int, float]:
        raise NotImplementedError


class AllReduce(_Collective):
    name = "all_reduce"
    attrs = (Attr("op", "enum", "add", tuple(nm.COLLECTIVE_REDUCE)),)
    doc = "dst = op over ranks of src (every rank gets the result)"

    def check(self, c: LInstr, target: Any) -> None:
        dst, src = c.ops
        _need_same(dst, src, "all_reduce")
        if dst.dtype is not src.dtype:
            raise CheckFail("all_reduce: dst and src must have the same type")

    def run_all(self, xs: list[ExecCtx], c: LInstr) -> None:
        dst, src = c.ops
        vals = [nm.to_f32(x.read(src)) for x in xs]  # collectives compute in fp32 (documented)
        acc = vals[0]
        for v in vals[1:]:
            acc = nm.COLLECTIVE_REDUCE[c.attrs["op"]](acc, v)
        for x in xs:
            x.write(dst, np.asarray(acc).reshape(dst.shape))

    def ring(self, src_bytes: int, dst_bytes: int, r: int) -> tuple[int, float]:
        return 2 * (r - 1), 2.0 * (r - 1) / r * src_bytes


class AllGather(_Collective):
    name = "all_gather"
    attrs = (Attr("axis", "int", 0),)
    doc = "dst = concatenation over ranks of src along axis"

    def check(self, c: LInstr, target: Any) -> None:
        _check_concat(c, c.ops[1], c.ops[0], "all_gather")

    def run_all(self, xs: list[ExecCtx], c: LInstr) -> None:
        dst, src = c.ops
        v = np.concatenate([x.read(src) for x in xs], axis=c.attrs["axis"])
        for x in xs:
            x.write_raw(dst, v.reshape(dst.shape))

    def ring(self, src_bytes: int, dst_bytes: int, r: int) -> tuple[int, float]:
        return r - 1, float((r - 1) * src_bytes)


class ReduceScatter(_Collective):
    name = "reduce_scatter"
    rank_dependent = True
    attrs = (Attr("op", "enum", "add", tuple(nm.COLLECTIVE_REDUCE)), Attr("axis", "int", 0))
    doc = "dst = rank r's part (along axis) of op over ranks of src"

    def check(self, c: LInstr, target: Any) -> None:
        _check_concat(c, c.ops[0], c.ops[1], "reduce_scatter")

    def run_all(self, xs: list[ExecCtx], c: LInstr) -> None:
        dst, src = c.ops
        vals = [nm.to_f32(x.read(src)) for x in xs]  # collectives compute in fp32 (documented)
        acc = vals[0]
        for v in vals[1:]:
            acc = nm.COLLECTIVE_REDUCE[c.attrs["op"]](acc, v)
        parts = np.split(np.asarray(acc), len(xs), axis=c.attrs["axis"])
        for x, p in zip(xs, parts):
            x.write(dst, p.reshape(dst.shape))

    def ring(self, src_bytes: int, dst_bytes: int, r: int) -> tuple[int, float]:
        return r - 1, float((r - 1) * dst_bytes)


def _check_concat(c: LInstr, part: RAccess, whole: RAccess, what: str) -> None:
    r = c.ranks
    axis = c.attrs["axis"]
    if not 0 <= axis < len(part.shape) or len(part.shape) != len(whole.shape):
        raise CheckFail(f"{what}: axis {axis} and shapes {_shape_str(part)}, {_shape_str(whole)} do not fit")
    want = list(part.shape)
    want[axis] *= r
    if tuple(want) != whole.shape:
        raise CheckFail(f"{what} over {r} rank(s): {_shape_str(whole)} must be {want}")
    if part.dtype is not whole.dtype:
        raise CheckFail(f"{what}: dst and src must have the same type")


class Nop(Op):
    name = "nop"
    engines = ("pe", "act", "dve", "pool", "cc", "dma")
    doc = "nothing: a place to wait on and signal semaphores"

    def run(self, x: ExecCtx, c: LInstr) -> None:
        return None

    def cost_vars(self, c: LInstr, target: Any) -> dict[str, float]:
        return {"N": 0, "P": 0}


OPS: dict[str, Op] = {op.name: op for op in (
    Matmul(), Transpose(), Activation(), TensorTensor(), TensorScalar(), TensorReduce(), TensorCopy(),
    Select(), Iota(), AffineSelect(), Memset(), BnStats(), BnAggr(), Gather(), Scatter(), Dma(), DmaTranspose(),
    AllReduce(), AllGather(),
    ReduceScatter(), Nop(),
)}

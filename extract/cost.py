"""The device cost model: nanoseconds an operator takes on the target, as the backend lowers it.

An operator's time is the longest of the resources it keeps busy (TensorE, ScalarE, VectorE,
GpSimd, the DMA engines) plus the latency no pipelining hides (the first load before any compute,
the last store after it), each priced by the target spec's own formulas (``Target.cost``: the ones
the timing model charges) on the tiles the shared plans (:mod:`nxsat.extract.plan`) cut. The
extractors add these costs over the e-classes they choose, so a cost is local to one operator:

- a matmul is priced by :func:`~nxsat.extract.plan.matmul_plan` (which operand is stationary sets M
  and N, so ``dot(a, b)`` and ``transpose(dot(b, a))`` cost differently), in the precision
  ``--auto-cast`` gives TensorE (or the type of the casts it absorbs);
- a convolution by :func:`~nxsat.extract.plan.conv_plan`, chunk by chunk as backend/conv.py emits it,
  or by the depthwise plan on the vector engines;
- an elementwise operator is fused by the backend with its elementwise neighbours into one pass over
  SBUF, so it pays its engine time and one write of its result; only the inputs of the model it
  reads (parameters, constants) add their load;
- a view (reshape, bitcast, broadcast, a slice) costs nothing; a transpose costs the copy that
  materializes it, unless only contractions read it (:func:`node_costs`: then it is their access
  pattern), and a cast only contractions read is absorbed by them.

Every operator also pays :data:`NODE_NS`, so that of two programs that cost the same the one with
fewer operators wins, and no chain of free views can be chosen as a cycle. docs/extraction.md says
what the model leaves out (an operator's layout as its reader sees it; overlap between operators).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nxsat import dtypes as dt
from nxsat.extract.plan import (
    ADD_ENGINES,
    BN_STATS_MAX,
    DMA_T_BLOCK,
    FORMULA_DEFAULTS,
    GROUP_NORM_RESIDENT,
    MAX_COLS,
    NARROW_WRITERS,
    PE_BLOCK,
    PREFETCH_SBUF_FRACTION,
    ConvGeometry,
    ConvPlan,
    DepthwisePlan,
    cast_split,
    conv_plan,
    depthwise_plan,
    dot_sizes,
    fold_growth,
    fold_homes,
    forwarded_input,
    hosts_rows,
    layer_norm_rows,
    load_queues,
    matmul_plan,
    max_cols,
    op_ns,
    out_block,
    packed_outputs_last,
    pe_transpose_pays,
    rows_fit,
    segments_pay,
    softmax_rows,
    vector_dot,
    weights_by_rows,
)
from nxsat.ops import registry
from nxsat.rules import terms
from nxsat.rules.egraph import EGraph, View, operand_layout
from nxsat.sim.target import Target

NODE_NS = 0.01  # every operator's own price: a tie-break, far below any instruction's time

# Operators the backend lowers as access patterns on their operand's buffer (backend/movement.py).
VIEWS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "reshape", "bitcast", "broadcast",
                   "slice", "opt-barrier", "iota"})
# Engine formulas of the elementwise families (backend/tiles.py picks the instruction).
_ENGINE = {registry.SCALAR: ("act", "activation"), registry.VECTOR: ("dve", "tensor_tensor"),
           registry.GPSIMD: ("pool", "tensor_tensor")}
# A depthwise tile's products and sums (extract/plan.py prices the same instructions): fp32 in SBUF, strided.
_DW_VARS = {"psum_in": 0, "all_sbuf": 1, "lowp": 0, "contig": 0, "fp32": 1, "fast": 0, "accum": 0}


@dataclass(frozen=True)
class Value:
    """What the cost model needs of a value: its shape and element type."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * _itemsize(self.dtype)


def _itemsize(name: str) -> int:
    try:
        return max(1, dt.by_name(name).itemsize)
    except (KeyError, ValueError):
        return 4


# The chain between a group norm's statistics and its passes (PSUM -> ScalarE -> VectorE x3 -> ScalarE ->
# VectorE x2), each hop an engine-to-engine handoff the per-instruction prices do not include.
GROUP_NORM_HOPS_NS = 1100.0  # fitted on the cost table's first four group norms; its last two are held out

# What a channels-last convolution result costs more when every convolution is to be channels-first: more than
# any program's layout could save, finite so that a convolution without a channels-first form is still chosen.
CHANNELS_LAST_NS = 1e6


class CostModel:
    """Prices operators for one target; ``matmul_dtype`` is the type TensorE multiplies in (what the
    precision policy gives dots under ``--auto-cast``; f32 without)."""

    def __init__(self, target: Target, matmul_dtype: str = "f32", in_program: bool = False,
                 channels_first: bool = False) -> None:
        self.target = target
        # every convolution channels-first where it has such a form (``--layout channels-first``, and the
        # program -O2 measures against the cost model's choice of layouts): a channels-last result costs
        # CHANNELS_LAST_NS more, so it is kept only where no channels-first form exists
        self.channels_first = channels_first
        # in a program (the extractors' view): a dot's loads of model inputs (weights) are issued ahead,
        # under earlier operators, and leave its critical path; alone (the calibrated view) they are not
        self.in_program = in_program
        self._conv_cache: dict[tuple, float] = {}  # convolution prices by geometry and layout
        self._siblings: dict[str, CostModel] = {}  # the same target, TensorE in another type
        self.matmul_dtype = matmul_dtype if target.supports_matmul_dtype(matmul_dtype) else "f32"
        self.bw = target.memory_bw  # bytes per ns
        dma = target.dma
        self.dma_fixed = float(dma["fixed_latency_ns"])
        self.dma_engines = int(dma["engines"])
        self.descriptor_ns = float(dma.get("descriptor_overhead_ns", 0.0))
        self.engine_bytes_ns = float(dma["engine_gbps"])
        self.P = target.partitions

    # -- resources ------------------------------------------------------------------------------------

    def dma_ns(self, nbytes: float, run_bytes: float, partitions: int | None = None) -> float:
        """DMA-engine time of moving ``nbytes`` in descriptors of ``run_bytes`` (the timing model's
        engine cost per byte: the transfer rate plus each descriptor's overhead), spread over the
        engines a transfer of ``partitions`` partitions uses (one per 8), at most the core's HBM rate."""
        if nbytes <= 0:
            return 0.0
        run = max(1.0, run_bytes)
        engines = self.dma_engines if partitions is None else max(1, min(
            self.dma_engines, -(-partitions // int(self.target.dma["partitions_per_engine"]))))
        per_byte = (run / self.engine_bytes_ns + self.descriptor_ns) / run
        return max(nbytes * per_byte / engines, nbytes / self.target.hbm_bw)

    def engine_ns(self, engine: str, opcode: str, elements: int, **values: float) -> float:
        """``elements`` spread over the partitions, one instruction per tile of up to 512 per partition."""
        per = -(-elements // self.P)
        if per == 0:
            return 0.0
        v = {**FORMULA_DEFAULTS, **values}
        tile = min(per, 512)
        full, rest = divmod(per, tile)
        ns = full * op_ns(self.target, opcode, engine, N=tile, **v)
        return ns + (op_ns(self.target, opcode, engine, N=rest, **v) if rest else 0.0)

    def instr_ns(self, engine: str, opcode: str, count: int, **values: float) -> float:
        """``count`` instructions of one shape on ``engine`` (the formula's variables in ``values``)."""
        return count * op_ns(self.target, opcode, engine, **{**FORMULA_DEFAULTS, **values}) if count else 0.0

    @staticmethod
    def pipelined(stages: Sequence[float], resources: Sequence[float], tiles: int) -> float:
        """``tiles`` tiles flowing through ``stages`` (the serial steps of one tile: load, compute,
        store) that keep ``resources`` busy (the engines, the DMA engines: their totals): the busiest
        resource in the steady state, plus one tile's pass through the stages it does not hide
        (the pipeline's fill and drain). One tile is the stages one after the other."""
        steady = max(resources, default=0.0)
        return steady + max(0.0, sum(stages) - steady) / max(1, tiles)

    # -- operators --------------------------------------------------------------------------------------

    def op_ns(self, op: str, attrs: dict[str, Any], operands: Sequence[Value | None], result: Value | None,
              inputs: Sequence[bool] = (), multiply_in: str | None = None, hosted: bool = False,
              loaded: Sequence[bool] | None = None) -> float:
        """The time of one operator; ``inputs[i]``: operand i is read from HBM (a model input or a
        constant) rather than from a neighbour fused on chip; ``multiply_in``: the type a dot's
        operands are converted to on chip (a cast the dot absorbs), when not the model's; ``hosted``:
        a softmax the dot making its scores computes on its tiles; ``loaded[i]``: operand i is a model input
        or constant itself (default ``inputs``), which the DMA can convert as it loads it, where ``inputs``
        also counts data another operator left in HBM."""
        if result is None or op in VIEWS:
            return NODE_NS
        loaded = inputs if loaded is None else loaded
        if op == "dot":
            ahead = tuple(inputs) if self.in_program else ()
            return NODE_NS + self.dot_ns(attrs, operands, result, multiply_in, ahead, tuple(loaded))
        if op == "convolution":
            computed = bool(inputs) and not inputs[0]
            weights_computed = len(loaded) > 1 and not loaded[1]
            return NODE_NS + self.conv_ns(attrs, operands, result, multiply_in, computed, weights_computed)
        if op == "transpose":
            return NODE_NS + self.transpose_ns(attrs, operands[0] if operands else None, result)
        if op == "softmax" and operands and operands[0] is not None:
            return NODE_NS + self.softmax_ns(operands[0], hosted)
        if op == "layer-norm" and operands and operands[0] is not None:
            return NODE_NS + self.layer_norm_ns(operands[0])
        if op == "rms-norm" and operands and operands[0] is not None:
            return NODE_NS + self.rms_norm_ns(operands[0])
        if op == "group-norm" and operands and operands[0] is not None:
            return NODE_NS + self.group_norm_ns(operands[0], int(attrs.get("groups", 1)))
        od = registry.get(op)
        engine = od.engine if od is not None else registry.DMA
        flags = list(inputs) + [False] * (len(operands) - len(inputs))
        if engine in _ENGINE and _is_elementwise(operands, result):
            return NODE_NS + self.elementwise_ns(op, engine, operands, result, flags)
        if op == "reduce" and len(operands) == 2 and operands[0] is not None:
            return NODE_NS + self.reduce_ns(attrs, operands[0], result)
        if op in ("reduce", "reduce-window", "batch-norm-training", "batch-norm-inference", "batch-norm-grad"):
            src = sum(v.size for v in operands if v is not None)
            compute = self.engine_ns("dve", "tensor_reduce", src // max(1, len(operands) // 2 or 1), half=0)
            moved = sum(v.nbytes for v in operands if v is not None) + result.nbytes
            return NODE_NS + max(compute, self.dma_ns(moved, 2048)) + 2 * self.dma_fixed
        # data movement between HBM buffers (copy, concatenate, pad, gather ...): what it moves
        moved = sum(v.nbytes for v in operands if v is not None) + result.nbytes
        return NODE_NS + self.dma_ns(moved, 2048) + self.dma_fixed

    def elementwise_ns(self, op: str, engine: str, operands: Sequence[Value | None], result: Value,
                       inputs: Sequence[bool]) -> float:
        """One operator of a fused elementwise pass (backend/elementwise.py): tiles of 128 rows and
        :func:`~nxsat.extract.plan.max_cols` elements per partition, one instruction each. The
        operands read from HBM are loaded (and pay the DMA trigger latency before the first tile);
        the result is stored, but an operand computed by a fused neighbour of the same shape is not
        stored by it (its store is credited here: over a chain the stores add up to the last one's)."""
        eng, opcode = _ENGINE[engine]
        if result.dtype in ("s32", "u32") and eng != "act":
            eng = "pool"
        size = _itemsize(result.dtype)
        per_partition = -(-result.size // self.P)
        cols = min(max_cols(result.shape, self.P), per_partition) or 1
        tiles = max(1, -(-per_partition // cols))
        fast = int(result.dtype in ("bf16", "f16") and op in ("add", "subtract", "multiply"))
        compute = self.instr_ns(eng, opcode, tiles, N=cols, fast=fast)
        rows = min(self.P, result.size)
        load_bytes = sum(v.nbytes for v, hbm in zip(operands, inputs) if v is not None and hbm)
        fused = sum(v.nbytes for v, hbm in zip(operands, inputs) if v is not None and not hbm
                    and v.shape == result.shape)
        store_bytes = max(0, result.nbytes - fused)
        load = self.dma_ns(load_bytes, cols * size, rows)
        store = self.dma_ns(store_bytes, cols * size, rows)
        # the trigger latency before the first load is the pass's: paid by an operator that starts it
        # (no operand from a fused neighbour), as the one before the last store by the one that stores
        fixed = self.dma_fixed * ((bool(load_bytes) and not fused) + bool(store_bytes))
        if not load_bytes and not store_bytes:
            # fully fused: its engine runs in the shadow of the pass's DMA, which moves at least one
            # tensor of its shape in and one out; only the compute beyond that, and its share of the
            # pipeline's fill, add to the pass
            shadow = 2 * self.dma_ns(result.nbytes, cols * size, rows)
            return max(0.0, compute - shadow) + compute / tiles
        return self.pipelined((load, compute, store), (load + store, compute), tiles) + fixed

    def softmax_ns(self, x: Value, hosted: bool = False) -> float:
        """A fused softmax (backend/fused.py): per tile VectorE's row maxima, ScalarE's exp with the sum
        accumulated (one instruction per row), VectorE's reciprocals, ScalarE's multiply per row.
        ``hosted``: the dot computes it on its result tiles (``plan_softmax_hosts``): no load, and the
        store the dot would have made of its scores is credited (the engines' work and the
        probabilities' store remain)."""
        if hosted:
            return self.softmax_hosted_ns(x)
        L, k, tiles = self._row_tiles(x, softmax_rows)
        rows = tiles * k  # rows per partition over the whole softmax
        half = int(x.dtype in ("bf16", "f16"))
        dve = (self.instr_ns("dve", "tensor_reduce", tiles, N=k * L, half=half)
               + self.instr_ns("dve", "tensor_scalar", tiles, N=k) + self.instr_ns("dve", "activation", tiles, N=k))
        act = self.instr_ns("act", "activation", rows, N=L, accum=1) + self.instr_ns("act", "activation", rows, N=L)
        return self._row_kernel_ns(x, k, tiles, dve, act)

    def softmax_hosted_ns(self, x: Value) -> float:
        """The softmax a dot computes on its ``[128, n]`` result tiles (n: one PSUM bank of the row, the
        matmul plan's N tile), as ``SoftmaxEpilogue`` emits it: per tile GpSimd's maxima (VectorE's when
        they read PSUM) and ScalarE's exp with accumulate and multiply; per row block VectorE's bias and
        reciprocal (and, for rows over several tiles, the tiles' maxima gathered and reduced, the sums
        reduced); the probabilities stored in the dot's store's place (the scores' store is not made)."""
        L = x.shape[-1] if x.shape else 1
        blocks = -(-max(1, x.size // max(1, L)) // self.P)  # row blocks of 128 rows
        n = min(L, self.target.psum_bank_bytes // 4)
        per = -(-L // n)  # tiles per row
        tiles = blocks * per
        in_psum = x.dtype == "f32" and per == 1  # SoftmaxEpilogue.reads_psum
        # the maxima on GpSimd, on VectorE where they read PSUM (which GpSimd cannot)
        maxima = self.instr_ns("dve" if in_psum else "pool", "tensor_reduce", tiles, N=n)
        dve = (self.instr_ns("dve", "tensor_scalar", tiles, N=1) + self.instr_ns("dve", "activation", blocks, N=1)
               + (maxima if in_psum else 0.0))
        pool = 0.0 if in_psum else maxima
        if per > 1:
            dve += (self.instr_ns("dve", "tensor_copy", tiles, N=1)
                    + 2 * self.instr_ns("dve", "tensor_reduce", blocks, N=per))
        act = 2 * self.instr_ns("act", "activation", tiles, N=n)
        busiest = max(dve, act, pool)
        own = busiest + (dve + act + pool - busiest) / blocks
        if in_psum:
            # fp32 scores whose rows fit one PSUM bank are read there (SoftmaxEpilogue.reads_psum): the dot's
            # copies out of PSUM, ScalarE and VectorE in turn, are not made, and each was a step of its tile's
            # chain (matmul, copy, maxima, exp): both engines' share leaves the critical path
            own -= (self.instr_ns("act", "activation", (tiles + 1) // 2, N=n)
                    + self.instr_ns("dve", "tensor_copy", tiles // 2, N=n))
        return own

    def layer_norm_ns(self, x: Value) -> float:
        """A fused layer norm (backend/fused.py): per row VectorE's bn_stats over every 512 elements and a
        bn_aggr, one ScalarE pass; per tile an rsqrt and two small VectorE steps."""
        L, k, tiles = self._row_tiles(x, layer_norm_rows)
        rows = tiles * k
        chunks = -(-L // BN_STATS_MAX)
        dve = (self.instr_ns("dve", "bn_stats", rows * (L // BN_STATS_MAX), N=BN_STATS_MAX)
               + (self.instr_ns("dve", "bn_stats", rows, N=L % BN_STATS_MAX) if L % BN_STATS_MAX else 0.0)
               + self.instr_ns("dve", "bn_aggr", rows, N=2 * chunks)
               + self.instr_ns("dve", "tensor_tensor", tiles, N=k) + self.instr_ns("dve", "tensor_scalar", tiles, N=k))
        act = self.instr_ns("act", "activation", rows, N=L) + self.instr_ns("act", "activation", tiles, N=k)
        return self._row_kernel_ns(x, k, tiles, dve, act)

    def rms_norm_ns(self, x: Value) -> float:
        """A fused RMS norm (backend/fused.py): the layer norm's tiles, all on ScalarE: per row a square
        with the sum accumulated and a pass ``x * rstd``, per tile one rsqrt."""
        L, k, tiles = self._row_tiles(x, layer_norm_rows)
        rows = tiles * k
        act = (self.instr_ns("act", "activation", rows, N=L, accum=1) + self.instr_ns("act", "activation", rows, N=L)
               + self.instr_ns("act", "activation", tiles, N=k))
        return self._row_kernel_ns(x, k, tiles, 0.0, act)

    def group_norm_ns(self, x: Value, groups: int) -> float:
        """A fused group norm (backend/fused.py): per batch its positions in the layer norm's tiles, all loaded
        with two VectorE reductions, a ScalarE square and a small TensorE matmul per tile; then a chain of
        small steps (:data:`GROUP_NORM_HOPS_NS`); then two VectorE passes per tile, each tile stored after
        them. The stores cannot start before the last load's statistics, so loads and stores do not
        overlap as a row kernel's do; a batch too large to keep is loaded again for the passes."""
        N, C = (x.shape[0], x.shape[-1]) if len(x.shape) >= 2 else (1, max(1, x.size))
        R = max(1, x.size // max(1, N * C))
        k = layer_norm_rows(C, R, self.P)
        tiles = N * max(1, -(-R // (self.P * k)))
        stats = (2 * self.instr_ns("dve", "tensor_reduce", tiles, N=k * C)
                 + self.instr_ns("act", "activation", tiles, N=k * C)
                 + self.instr_ns("pe", "matmul", tiles, M=self.P, N=2 * groups, K=min(self.P, R), dtype_factor=4))
        passes = 2 * self.instr_ns("dve", "tensor_tensor", tiles, N=k * C)
        parts = min(self.P, R)
        load = self.dma_ns(x.nbytes, k * C * _itemsize(x.dtype), parts)
        store = load
        if R * C * 4 > GROUP_NORM_RESIDENT * self.P:
            store += load  # loaded again beside the stores
        return (max(load, stats) + stats / tiles + N * GROUP_NORM_HOPS_NS + max(passes, store)
                + min(passes, store) / tiles + 2 * self.dma_fixed)

    def _row_tiles(self, x: Value, rows_of: Callable[[int, int, int], int]) -> tuple[int, int, int]:
        """(row length, rows per partition per tile, tiles) of a kernel over the last dimension."""
        L = x.shape[-1] if x.shape else 1
        R = max(1, x.size // max(1, L))
        k = rows_of(L, R, self.P)
        return L, k, max(1, -(-R // (self.P * k)))

    def _row_kernel_ns(self, x: Value, k: int, tiles: int, dve: float, act: float) -> float:
        """``[128, k, L]`` tiles of ``x``, each loaded and stored once, through VectorE and ScalarE. The
        loads are issued together, one per DMA queue, and share the DMA engines, so those of one round
        land together: compute starts after the first round, unless the stores (the DMA's other half) are
        what bound it."""
        L = x.shape[-1] if x.shape else 1
        parts = min(self.P, max(1, x.size // max(1, L)))
        load = self.dma_ns(x.nbytes, k * L * _itemsize(x.dtype), parts)
        store = load
        first = load * min(1.0, self.target.dma_queues / max(1, tiles))  # the first round of loads
        landed = first + max(dve, act) + (min(dve, act) + store) / tiles
        return max(self.pipelined((load, dve + act, store), (load + store, dve, act), tiles), landed) \
            + 2 * self.dma_fixed

    def reduce_ns(self, attrs: dict[str, Any], src: Value, result: Value) -> float:
        """A reduction (backend/reduce.py): the source in tiles of 128 rows, reduced along the free axis
        by VectorE when the reduced dimensions are innermost; otherwise the kept inner dimensions on
        the partitions and the reduced ones along the free axis (a strided load)."""
        dims = tuple(attrs.get("dimensions", ()))
        size = _itemsize(src.dtype)
        inner = len(src.shape) - 1
        last = bool(dims) and set(dims) == set(range(inner - len(dims) + 1, inner + 1))
        red = math.prod(src.shape[d] for d in dims) if dims else 1
        keep = max(1, src.size // max(1, red))
        if last:
            run = red * size
            per_row = red
        else:
            run = math.prod(n for d, n in enumerate(src.shape) if d > max(dims)) * size
            per_row = red
        row_tiles = -(-keep // self.P)
        cols = min(per_row, 2 * MAX_COLS)
        col_tiles = -(-per_row // cols)
        tiles = row_tiles * col_tiles
        if last:
            # the accumulation is fp32 whatever the source type: no half-rate bf16 reduce
            compute = self.instr_ns("dve", "tensor_reduce", tiles, N=cols)
            load = self.dma_ns(src.nbytes, run, min(self.P, keep))
            store = self.dma_ns(result.nbytes, _itemsize(result.dtype), min(self.P, keep))
            return self.pipelined((load, compute, store), (load + store, compute), tiles) + 2 * self.dma_fixed
        # an outer dimension reduced: it goes on the partitions (long runs), the partials of every tile
        # combined across the partitions by TensorE (a ones vector against each tile, one PSUM bank of
        # kept elements at a time: a PSUM group is a tile of the pipeline)
        bank = self.target.psum_bank_bytes // 4
        n = min(keep, bank)
        matmuls = -(-red // self.P) * -(-keep // n)
        pe = self.instr_ns("pe", "matmul", matmuls, M=1, N=n, K=self.P, dtype_factor=4)
        evac = self.instr_ns("dve", "tensor_copy", -(-keep // n), N=n)
        load = self.dma_ns(src.nbytes, min(run, 2048))
        store = self.dma_ns(result.nbytes, n * _itemsize(result.dtype), 1)
        groups = -(-keep // n)
        body = getattr(getattr(attrs.get("to_apply"), "root", None), "op", "add")
        if body != "add":
            # max/min: TensorE transposes of the partials, then VectorE, after the loads that share the
            # DMA engines and land together: the stages one after the other
            return load + pe + evac + store + 2 * self.dma_fixed
        return self.pipelined((load, pe, evac, store), (load + store, pe, evac), groups) + 2 * self.dma_fixed

    def transpose_ns(self, attrs: dict[str, Any], src: Value | None, result: Value) -> float:
        """A transpose is a view (backend/movement.py): whoever reads it reads through the permuted
        access pattern. It is priced as that read when it is materialized (a copy by the DMA engines
        in descriptors of the longest run the permutation keeps contiguous: one element when the
        contiguous dimension moves), which is what an output, an elementwise reader or a
        non-contraction read pays."""
        perm = tuple(attrs.get("dimensions", ()))
        if src is None or not perm:
            return 0.0
        kept = [d for d in range(len(src.shape)) if src.shape[d] > 1]
        order = [p for p in perm if src.shape[p] > 1]
        if order == kept:
            return 0.0  # only unit dimensions move: a reshape
        run = 1
        for a, b in zip(reversed(kept), reversed(order)):
            if a != b:
                break
            run *= src.shape[a]
        size = _itemsize(result.dtype)
        return self.dma_ns(result.nbytes, run * size) + self.dma_fixed

    def dot_ns(self, attrs: dict[str, Any], operands: Sequence[Value | None], result: Value,
               multiply_in: str | None = None, ahead: Sequence[bool] = (), loaded: Sequence[bool] = ()) -> float:
        """``loaded[i]``: operand i is a model input or constant, which the DMA converts to the multiply type
        as it loads it where the target's can (backend/lower.py ``load_dtype``)."""
        lhs, rhs = operands[0], operands[1]
        if lhs is None or rhs is None:
            return 0.0
        d = attrs["dims"]
        B, M, K, N = dot_sizes(lhs.shape, rhs.shape, d)
        if lhs.dtype in ("s32", "u32", "s64") or rhs.dtype in ("s32", "u32", "s64"):
            return self.engine_ns("pool", "tensor_tensor", B * M * K * N) + 2 * self.dma_fixed
        mt = self.multiply_type(lhs.dtype, rhs.dtype)
        if multiply_in is not None and self.target.supports_matmul_dtype(multiply_in):
            mt = multiply_in
        if vector_dot(B, M, K, N):
            return self.vector_dot_ns(B, M, K, N, lhs, rhs, result, mt)
        # K is an operand's contiguous dimension when its contracting dimensions are its innermost ones
        lk = _inner(d.lhs_contracting, lhs.shape)
        rk = _inner(d.rhs_contracting, rhs.shape)
        flags = tuple(ahead) + (False, False)
        cast = tuple(bool(f) and self.target.dma_casts(mt, v.dtype) for f, v in zip(loaded, (lhs, rhs))) \
            + (False, False)
        return self.matmul_ns(B, M, K, N, mt, lhs, rhs, result, lhs_k_contiguous=lk, rhs_k_contiguous=rk,
                              ahead=flags[:2], dma_cast=cast[:2])

    def vector_dot_ns(self, B: int, M: int, K: int, N: int, lhs: Value, rhs: Value, result: Value, mt: str) -> float:
        """Many tiny products on VectorE (backend/matmul.py ``_dot_on_vector``): per tile of 128 batches both
        operands loaded (and rounded to ``mt`` when it is not theirs), one multiply over ``M * N * K``
        products and one reduction, the result stored."""
        tiles = -(-B // self.P)
        per = M * N * K
        compute = tiles * (self.instr_ns("dve", "tensor_tensor", 1, N=per)
                           + self.instr_ns("dve", "tensor_reduce", 1, N=per)
                           + sum(self.instr_ns("dve", "tensor_copy", 1, N=v.size // max(1, B))
                                 for v in (lhs, rhs) if v.dtype != mt and mt != "f32"))
        loads = self.dma_ns(lhs.nbytes + rhs.nbytes, lhs.nbytes / B, self.P)
        store = self.dma_ns(result.nbytes, result.nbytes / B, self.P)
        # the first tile's loads and the last one's store are not under the multiplies
        return max(compute, loads + store) + (loads + store) / tiles + 2 * self.dma_fixed

    def multiply_type(self, lhs: str, rhs: str) -> str:
        """The type TensorE multiplies a dot's operands of these types in: fp32 ones in the model's
        ``matmul_dtype`` (the policy's), others in their common type when TensorE has it, else fp32."""
        if lhs == rhs == "f32" or self.matmul_dtype != "f32":
            return self.matmul_dtype
        return lhs if lhs == rhs and self.target.supports_matmul_dtype(lhs) else "f32"

    def matmul_ns(self, B: int, M: int, K: int, N: int, mt: str, lhs: Value, rhs: Value, result: Value,
                  lhs_k_contiguous: bool = True, rhs_k_contiguous: bool = False,
                  ahead: tuple[bool, bool] = (False, False), k_run: int = 0, repeats: int = 1,
                  dma_cast: tuple[bool, bool] = (False, False)) -> float:
        """``B`` products ``[M, K] @ [K, N]`` as backend/matmul.py emits them, tiled by
        :func:`matmul_plan`: per M tile the stationary operand's K tiles (once if resident, else once
        per N tile), per (M, N) tile the moving operand's (once per N tile when the plan keeps them
        across the M tiles, the stationary then once per block), ``ceil(K / k_tile)`` matmuls accumulating in
        one PSUM bank, evacuated by ScalarE and VectorE in turn and stored. An operand whose
        contiguous dimension is K is loaded in rows and transposed on TensorE (fp32 into PSUM, copied
        out by VectorE); otherwise one DMA of rows of M (N) elements. A joint plan (both operands
        K-contiguous, one N tile) transposes them together, the moving one once. An operand whose
        type is not the multiply type is converted on chip (VectorE) when it is loaded plainly, unless
        ``dma_cast`` says the DMA converts it as it loads it (rows then transposed in the multiply type).
        ``k_run``: the length of the contraction's contiguous segments (a weight gradient's taps), which
        the backend's K groups never cross (0: K is one segment). ``repeats``: that many such products
        one after another (a weight gradient's output positions), each loading while the one before
        multiplies."""
        t = self.target
        plan = matmul_plan(M, K, N, mt, t)
        factor = t.matmul_dtype_factor(mt) or 1.0
        mtiles, ktiles, ntiles = -(-M // plan.m_tile), plan.k_tiles(K), -(-N // plan.n_tile)
        pe_t = bool(t.dma["transpose_efficiency"]) is False
        lt = lhs_k_contiguous and pe_t and pe_transpose_pays(M, K)
        rt = rhs_k_contiguous and pe_t and pe_transpose_pays(N, K)
        joint = plan.joint and lt and rt
        # times each operand is loaded: the stationary once per M tile if resident (once per N block
        # when the moving one is kept across the M tiles), else once per N tile; the moving once per
        # M tile, or once when kept
        blocks = -(-ntiles // plan.n_block) if plan.n_block else 1
        st_loads = 1 if joint else blocks if plan.resident else ntiles
        mv_loads = 1 if joint or plan.n_block else mtiles
        pe = dve = act = 0.0
        for mn, mc in _tiles(M, plan.m_tile):
            for nn, nc in _tiles(N, plan.n_tile):
                pe += mc * nc * ktiles * op_ns(t, "matmul", "pe", M=mn, N=nn, K=plan.k_tile, P=plan.k_tile,
                                               dtype_factor=factor)
                ev = mc * nc
                act += (ev + 1) // 2 * op_ns(t, "activation", "act", **{**FORMULA_DEFAULTS, "N": nn})
                dve += ev // 2 * op_ns(t, "tensor_copy", "dve", **{**FORMULA_DEFAULTS, "N": nn})
        bank = t.psum_bank_bytes // 4

        def transposed(rows: int, loads: int, dtype: str) -> tuple[float, float, float]:
            """TensorE, VectorE and ScalarE time of the K tiles of ``rows`` rows transposed ``loads`` times
            (the banks copied out by VectorE and ScalarE in turn)."""
            fp32 = int(_itemsize(dtype) == 4)
            p_ns = v_ns = a_ns = 0.0
            for xn, xc in _tiles(rows, t.matmul["rows"]):
                per_bank = max(1, bank // xn)
                p_ns += xc * ktiles * op_ns(t, "transpose", "pe", P=xn, N=plan.k_tile, fp32=fp32)
                for cnt, cc in _tiles(ktiles, per_bank):
                    copies = xc * cc
                    v_ns += (copies + 1) // 2 * op_ns(t, "tensor_copy", "dve", **{**FORMULA_DEFAULTS, "N": cnt * xn})
                    a_ns += copies // 2 * op_ns(t, "activation", "act", **{**FORMULA_DEFAULTS, "N": cnt * xn})
            return p_ns * loads, v_ns * loads, a_ns * loads

        if lt:
            p, v, a = transposed(M, st_loads, mt if dma_cast[0] else lhs.dtype)
            pe, dve, act = pe + p, dve + v, act + a
        elif lhs.dtype != mt and not ahead[0] and not dma_cast[0]:  # a prefetched one is converted ahead too
            act += st_loads * self.instr_ns("act", "activation", mtiles * ktiles, N=min(M, plan.m_tile))
        if joint:
            p, v, a = transposed(N, 1, mt if dma_cast[1] else rhs.dtype)
            pe, dve, act = pe + p, dve + v, act + a
        elif rt:
            p, v, a = transposed(N, mv_loads, mt if dma_cast[1] else rhs.dtype)
            pe, dve, act = pe + p, dve + v, act + a
        elif rhs.dtype != mt and not ahead[1] and not dma_cast[1]:
            act += mv_loads * self.instr_ns("act", "activation", ntiles * ktiles, N=min(N, plan.n_tile))
        ls, rs, os_ = _itemsize(lhs.dtype), _itemsize(rhs.dtype), _itemsize(result.dtype)
        st_bytes = M * K * ls * st_loads
        mv_bytes = K * N * rs * mv_loads
        wide = plan.is_wide(joint, rhs_k_contiguous)  # the moving operand loaded in rows N long
        group = plan.group(rt and not joint, wide)
        run = plan.k_tile * group  # K per load (backend/matmul.py groups)
        # a K-contiguous operand's whole rows lying end to end load several to a partition
        # (of model inputs and constants only: backend/matmul.py keeps an activation's loads within the
        # tiles that stored it, which the forwarding pass reads on chip)
        stored = ahead if self.in_program else (True, True)
        # a K-contiguous operand TensorE does not transpose is read through a transposing access pattern,
        # a descriptor per element, where the target has no DMA transpose (backend/matmul.py _load)
        st_run = min(K, run) * ls * (plan.stationary_rows(M, K, ls, group) if stored[0] and not joint else 1) if lt \
            else ls if lhs_k_contiguous and pe_t else min(M, plan.m_tile) * ls
        mv_run = min(K, run) * rs * (plan.moving_rows(K, N, rs) if stored[1] and not joint else 1) if rt \
            else rs if rhs_k_contiguous and pe_t else min(N, (plan.wide_tiles if wide else 1) * plan.n_tile) * rs
        # a model input's load issued ahead hides under the operators before it only as far as the prefetch
        # share of SBUF holds it: the rest of a weight far bigger (gemma3's LM head, 604 MB) streams on the
        # dot's own path, which its DMA then bounds whichever operand is stationary
        ahead_bytes = B * (st_bytes * ahead[0] + mv_bytes * ahead[1])
        cap = PREFETCH_SBUF_FRACTION * self.P * t.sbuf_bytes
        exposed = max(0.0, 1.0 - cap / ahead_bytes) if ahead_bytes else 1.0
        load = B * (self.dma_ns(st_bytes, st_run) * (exposed if ahead[0] else 1.0)
                    + self.dma_ns(mv_bytes, mv_run) * (exposed if ahead[1] else 1.0))
        if plan.column_rows(M, N):
            # gathered 128 tiles at a time, transposed and stored as rows (a result stored plainly, as this
            # prices a dot alone)
            store = B * self.dma_ns(M * os_, plan.m_tile * os_, min(-(-M // plan.m_tile), self.P))
            for cn, cc in _tiles(mtiles, t.matmul["cols"]):
                pe += cc * op_ns(t, "transpose", "pe", P=plan.m_tile, N=cn, fp32=1)
                act += cc * op_ns(t, "activation", "act", **{**FORMULA_DEFAULTS, "N": plan.m_tile})
        else:
            store = B * self.dma_ns(M * N * os_, min(N, plan.n_tile) * os_, min(M, self.P))
        pe, act, dve = B * pe, B * act, B * dve
        tiles = B * mtiles * ntiles
        runs: list[int] = []  # a joint plan's K per group, as backend/matmul.py forms the groups
        if joint:
            seg = k_run if 0 < k_run < K and K % k_run == 0 and segments_pay(K // k_run, k_run, t) else K
            runs = [kn * n for _, kn, n in plan.runs(seg)] * (K // seg)
        groups = len(runs)
        if groups > 1:
            # backend/matmul.py _matmul_joint, a group of K tiles at a time: the next group loads while
            # TensorE transposes this one, waits for the last bank's copy out of PSUM, then multiplies
            # (a weight gradient's long contraction: TensorE the whole run, a bubble per group). The
            # groups' loads are issued together, a DMA per 128-row block and operand, one per load queue:
            # as many groups as fill the queues share the engines (a queue whose load ends takes the next
            # group's), and TensorE starts when the first has arrived with that share of the bandwidth
            # (over 4 x 56 x 56: 24 us, not the 6 of its bytes alone). Each group's matmuls wait for its banks'
            # copies out of PSUM, ScalarE's and VectorE's in turn: hidden under fp32 transposes, exposed under
            # bf16 ones (rows the DMA converted as it loaded them: 4 x 64 x 56 x 56 predicted 42.3 us with
            # them spread over the groups, 49.2 now, simulated 53.2)
            xn = min(M + N, t.matmul["rows"])
            per_bank = max(1, t.psum_bank_bytes // 4 // xn)  # K tiles one bank holds
            bubbles = sum(op_ns(t, "tensor_copy", "dve", **{**FORMULA_DEFAULTS,
                                                             "N": min(per_bank, -(-r // plan.k_tile)) * xn})
                          for r in runs)
            rows = t.matmul["rows"]  # a DMA per 128-row block and operand in it (_load_pe_transposed)
            per_group = sum((x0 < M) + (x0 + rows > M) for x0 in range(0, M + N, rows))
            together = max(1, load_queues(t) // per_group)
            first = min(load, self.dma_ns(B * (M * ls + N * rs) * runs[0] * min(together, groups), min(st_run, mv_run)))
            steady = max(repeats * (load + store), first + repeats * (pe + B * bubbles + (act + dve) / 2))
            return steady + 2 * self.dma_fixed  # the first wave once, not per repeat
        steady = self.pipelined((load, pe, max(act, dve), store), (load + store, pe, act, dve), tiles)
        if plan.n_block and not joint:
            # the first N tile's kept moving tiles (backend/matmul.py loads each N tile's where the first
            # M tile needs them) and the first M tiles' stationary ones (one per free DMA queue) start
            # together and share the engines: TensorE starts when that first wave has arrived
            # at most one load per queue, less two: a calibration (the [3072, 768] @ [768, 128] trace
            # showed the moving block beside 11 stationary loads)
            queues = int(t.dma["queues"]) - 2
            first = K * min(N, plan.n_tile) * rs + min(mtiles, queues) * min(M, plan.m_tile) * K * ls
            steady = max(steady, self.dma_ns(first, min(st_run, mv_run)) + pe)
        return repeats * steady + 2 * self.dma_fixed

    def _weight_gradient_ns(self, x: Value, w: Value, result: Value, d: Any, window: tuple, bgc: int,
                            mt: str, dma_cast: tuple[bool, bool] = (False, False)) -> float:
        """A weight gradient as device-forms rewrites it (backend/conv.py ``weight_gradients``): per
        output position, a dot of the input's and the output gradient's windows over (channels, taps),
        the operand with fewer rows stationary; a group of one channel in and out a product summed on
        VectorE. Both operands are read through slices whose taps are their contiguous dimension;
        ``dma_cast``: the DMA converts the input's, the gradient's slices (model inputs)."""
        n_, c = x.shape[d.input_batch], x.shape[d.input_feature]
        o = w.shape[d.kernel_output_feature]
        b, og = n_ // bgc, o // bgc
        positions = math.prod(result.shape[i] for i in d.output_spatial)
        taps = math.prod(min(wd.size, x.shape[i]) for wd, i in zip(window, d.input_spatial))
        K = c * taps
        if bgc > 1 and b == 1 and og == 1:
            per = self.engine_ns("dve", "tensor_tensor", bgc * K) + self.engine_ns("dve", "tensor_reduce", bgc * K)
            moved = self.dma_ns(bgc * K * 2 * _itemsize(x.dtype), taps * _itemsize(x.dtype))
            return positions * max(per, moved) + 2 * self.dma_fixed
        M, N = min(b, og), max(b, og)
        lhs, rhs = Value((M, K), x.dtype), Value((K, N), w.dtype)
        # the taps lie in runs: the innermost spatial dimensions the window covers whole, and the next's window
        run = 1
        for wd, i in sorted(zip(window, d.input_spatial), key=lambda wi: -wi[1]):
            run *= min(wd.size, x.shape[i])
            if wd.size < x.shape[i]:
                break
        return self.matmul_ns(bgc, M, K, N, mt, lhs, rhs, Value((M, N), result.dtype), lhs_k_contiguous=True,
                              rhs_k_contiguous=True, k_run=run, repeats=positions, dma_cast=dma_cast)

    def conv_ns(self, attrs: dict[str, Any], operands: Sequence[Value | None], result: Value,
                multiply_in: str | None = None, computed: bool = False, weights_computed: bool = False) -> float:
        """A convolution as backend/conv.py emits :func:`~nxsat.extract.plan.conv_plan`: fp32 operands that
        TensorE multiplies in a narrower type are converted by a pass through HBM first (the precision
        policy's ``convert`` nodes); then per output chunk its input tiles (one DMA per fold block,
        zero-filled where padding; channels-last inputs in blocks of positions transposed on TensorE),
        the weights when not kept, the matmuls, the PSUM evacuation and the store (channels-last results
        transposed back first), counted chunk by chunk (:meth:`_gemm_ns`); a depthwise convolution on
        the vector engines by :meth:`_depthwise_ns`. ``multiply_in``: fp32 weights (a model input) cast to
        the input's type by the convolution as it loads them (the cast it absorbs). ``computed``: the input
        is another operator's result, not a model input; in a program its channels-first tiles are then
        read on chip (:func:`forwarded_input`). A model input's (or constant's) tiles, the image and the
        weights, are converted by the DMA that loads them where the target's can (``weights_computed``:
        the weights are another operator's result, converted on chip)."""
        x, w = operands[0], operands[1]
        if x is None or w is None:
            return 0.0
        if multiply_in is not None and w.dtype == "f32" and x.dtype == multiply_in:
            x = Value(x.shape, "f32")  # as the policy's fp32 model: its weights' cast absorbed, its input's
            return (self._with_matmul_dtype(multiply_in).conv_ns(attrs, [x, w], result, computed=computed,
                                                                 weights_computed=weights_computed)
                    - self._convert_x(x, multiply_in))
        d = attrs["dims"]
        window = tuple(attrs["window"])
        fgc = int(attrs.get("feature_group_count", 1) or 1)
        bgc = int(attrs.get("batch_group_count", 1) or 1)
        # fp32 operands multiply in the precision policy's type; others in their common type (backend/matmul.py's
        # operand_type), fp32 when TensorE has no such type
        mt = self.matmul_dtype if x.dtype == w.dtype == "f32" else x.dtype if x.dtype == w.dtype else "f32"
        if not self.target.supports_matmul_dtype(mt):
            mt = "f32"
        nb, c = x.shape[d.input_batch], x.shape[d.input_feature]
        o = w.shape[d.kernel_output_feature]
        xdims = (d.input_batch, d.input_feature, *d.input_spatial)
        wdims = (d.kernel_output_feature, d.kernel_input_feature, *d.kernel_spatial)
        ydims = (d.output_batch, d.output_feature, *d.output_spatial)
        rows_contiguous = all(not dims[2:] or shape[dims[-1]] == 1 or dims[-1] == len(shape) - 1
                              for dims, shape in ((xdims, x.shape), (ydims, result.shape)))
        geo = ConvGeometry(
            batch=nb // bgc, in_channels=c // fgc, out_channels=o // (fgc * bgc), groups=fgc, batch_groups=bgc,
            in_spatial=tuple(x.shape[i] for i in d.input_spatial),
            out_spatial=tuple(result.shape[i] for i in d.output_spatial), window=window, dtype=mt,
            itemsize=_itemsize(mt), channels_last_in=bool(window) and d.input_feature == len(x.shape) - 1,
            channels_last_out=bool(window) and d.output_feature == len(result.shape) - 1,
            rows_contiguous=rows_contiguous)
        convert = convert_x = 0.0
        w_wide = w
        if _weight_gradient(window, fgc, result, d):
            # device-forms' per-position dots absorb the policy's casts: they load the fp32 slices and
            # convert the tiles (backend/conv.py _weight_gradient)
            # the DMA converts both operands' rows where both are model inputs read whole: a window narrower
            # than the input is a slice the backend copies into a scratch first, and the rows TensorE
            # transposes together share one type (backend/matmul.py _load_pe_transposed)
            whole = all(wd.size >= x.shape[i] for wd, i in zip(window, d.input_spatial))
            cast = whole and not computed and not weights_computed and self.target.dma_casts(mt, x.dtype) \
                and self.target.dma_casts(mt, w.dtype)
            return self._weight_gradient_ns(x, w, result, d, window, bgc, mt, (cast, cast))
        if mt != "f32" and x.dtype == w.dtype == "f32":
            # the precision policy's converts: an operand through VectorE and back to HBM, one trigger
            # latency of each pass hidden under its neighbour's; the implicit GEMM absorbs the weights'
            # (backend/lower.py: it converts the fp32 weight tiles it loads), the depthwise path does not
            convert_x = self._convert_x(x, mt)
            convert = convert_x + self.elementwise_ns(
                "convert", registry.VECTOR, [w], Value(w.shape, mt), [True]) - self.dma_fixed
            x, w = Value(x.shape, mt), Value(w.shape, mt)
        try:
            plan = conv_plan(geo, self.target)
        except (ValueError, AssertionError, ZeroDivisionError):
            moved = x.nbytes + w.nbytes + result.nbytes
            return convert + self.dma_ns(moved, 1024) + 2 * self.dma_fixed
        dw = depthwise_plan(geo, plan, self.target)
        xs, ws, ys = (_canonical_strides(v.shape, dims) for v, dims in ((x, xdims), (w, wdims), (result, ydims)))
        cache = self._conv_cache
        on_chip = self.in_program and computed and forwarded_input(geo, plan)
        # the DMA converts a model input's tiles as it loads them (backend/lower.py load_dtype)
        x_cast = not computed and self.target.dma_casts(mt, x.dtype)
        w_cast = not weights_computed and self.target.dma_casts(mt, w_wide.dtype)
        key = (geo, x.dtype, w_wide.dtype, result.dtype, xs, ws, ys, on_chip, x_cast, w_cast)
        if key not in cache:
            if dw is not None and dw.pays:
                cache[key] = self._depthwise_ns(geo, dw, x, w, result, xs, ys)
            else:
                cache[key] = self._gemm_ns(geo, plan, x, w_wide, result, xs, ws, ys, on_chip, x_cast, w_cast)
        forced = CHANNELS_LAST_NS if self.channels_first and geo.channels_last_out else 0.0
        return (convert if dw is not None and dw.pays else convert_x) + cache[key] + forced

    # -- convolution parts ------------------------------------------------------------------------------

    def _convert_x(self, x: Value, mt: str) -> float:
        """The policy's cast of a convolution's fp32 input: a pass through VectorE and back to HBM, its
        trigger latency hidden under its neighbour's."""
        return self.elementwise_ns("convert", registry.VECTOR, [x], Value(x.shape, mt), [True]) - self.dma_fixed

    def _with_matmul_dtype(self, mt: str) -> CostModel:
        """This model with TensorE multiplying fp32 operands in ``mt`` (its convolution prices cached apart)."""
        other = self._siblings.get(mt)
        if other is None:
            other = self._siblings[mt] = CostModel(self.target, mt, self.in_program, self.channels_first)
        return other

    def _xfer(self, nbytes: float, run_bytes: float, partitions: int) -> tuple[float, float]:
        """A DMA's share of the DMA engines (its engine time over all of them) and its time alone."""
        return self.dma_ns(nbytes, run_bytes), self.dma_ns(nbytes, run_bytes, partitions)

    def _engines_busy(self, act: float, dve: float, pool: float, act_psum: float) -> float:
        """The busiest engine, VectorE sharing its SBUF port with GpSimd and its PSUM port with ScalarE
        (the target's port conflicts)."""
        pairs = {frozenset(r["engines"]) for r in self.target.spec.get("port_conflicts", [])}
        busy = [act, dve, pool]
        if frozenset(("dve", "pool")) in pairs:
            busy.append(dve + pool)
        if frozenset(("dve", "act")) in pairs:
            busy.append(dve + act_psum)
        return max(busy)

    def _gemm_ns(self, geo: ConvGeometry, plan: ConvPlan, x: Value, w: Value, y: Value, xs: tuple[int, ...],
                 ws: tuple[int, ...], ys: tuple[int, ...], on_chip: bool = False, x_cast: bool = False,
                 w_cast: bool = False) -> float:
        """The implicit GEMM chunk by chunk, as backend/conv.py's ``_job`` walks it (one representative job,
        times the jobs); ``on_chip``: its input tiles are copied from the producer's (the forwarding pass);
        ``x_cast``, ``w_cast``: the DMA converts the input's, the weights' tiles to the multiply type."""
        t = self.target
        nsp = len(geo.in_spatial)
        isz, wsz, osz = _itemsize(x.dtype), _itemsize(w.dtype), _itemsize(y.dtype)
        w_float = dt.by_name(w.dtype).is_float
        factor = t.matmul_dtype_factor(geo.dtype) or 1.0
        bank = t.psum_bank_bytes // 4
        fp32_in = int((geo.itemsize if x_cast else isz) == 4)
        fp32_out = int(osz == 4)
        groups = geo.groups * geo.batch_groups
        jobs = -(-groups // plan.pack)
        if plan.pack == 1:
            c_tiles = [n for n, k in _tiles(geo.in_channels, plan.c_tile) for _ in range(k)]
            o_tiles = [n for n, k in _tiles(geo.out_channels, plan.o_tile) for _ in range(k)]
        else:
            c_tiles, o_tiles = [geo.in_channels * plan.pack], [geo.out_channels * plan.pack]
        folding = plan.fold > 1
        fd = plan.fold_dim
        cl_out = plan.transpose_out != "dma" and nsp > 0
        classes = geo.classes()
        ksize = [wd.size for wd in geo.window]
        dma_res = pe = act = dve = pool = act_psum = 0.0
        w_pe, w_keys = 0.0, 0  # TensorE's transposes of weights loaded as rows, and how many loads they follow
        evac: list[tuple[float, float]] = []  # (ScalarE, VectorE) price of each PSUM evacuation

        def evacuate(n: int, parts: int) -> None:
            evac.append((op_ns(t, "activation", "act", **{**FORMULA_DEFAULTS, "N": n, "P": parts}),
                         op_ns(t, "tensor_copy", "dve", **{**FORMULA_DEFAULTS, "N": n, "P": parts})))

        # --- weights: bytes and run of one key's loads, and TensorE's transposes of them
        def weight_load(ck: int, on: int) -> tuple[float, float, float]:
            ext = (on, ck, *ksize)
            row = ck * math.prod(ksize)
            if weights_by_rows(plan, w_float, _run(ws, ext, (1, *range(2, nsp + 2), 0)) * wsz,
                               _run(ws, ext, (0, 1, *range(2, nsp + 2))), row):
                # output channels' rows, each tap's [O, I] block transposed (backend/conv.py
                # _weights_transposed); its copy out of PSUM is the conversion counted below
                parts = min(on, t.matmul["rows"])
                tps = -(-on // parts) * math.prod(ksize)
                return (*self._xfer(on * row * wsz, row * wsz, parts),
                        tps * op_ns(t, "transpose", "pe", P=parts, N=ck,
                                    fp32=int((geo.itemsize if w_cast else wsz) == 4)))
            if plan.pack > 1:
                og = geo.out_channels
                o_last = packed_outputs_last(geo.in_channels, og, ws[0])
                run = _run(ws, (1, og, *ksize), (1, 0, *range(2, nsp + 2))) if geo.in_channels == 1 else \
                    _run(ws, (og, 1, *ksize), (*range(2, nsp + 2), 0) if o_last else (0, *range(2, nsp + 2)))
                return (*self._xfer(ck * og * math.prod(ksize) * wsz, run * wsz, ck), 0.0)
            if folding:
                others = [k for dd, k in enumerate(ksize) if dd != fd]
                ext = (on, ck, *[1 if dd == fd else k for dd, k in enumerate(ksize)])
                free = math.prod(others) * on
                run = min(free, _run(ws, ext, (1, *range(2, nsp + 2), 0)))
                nbytes = ck * free * wsz
            else:
                ext = (on, ck, *ksize)
                free = math.prod(ksize) * on
                run = min(free, _run(ws, ext, (1, *range(2, nsp + 2), 0)))
                nbytes = ck * free * wsz
            return (*self._xfer(nbytes, run * wsz, ck), 0.0)

        # --- one work's pieces
        works = 0
        loaded: set = set()
        first_load = last_tail = 0.0
        pre_done = False
        o_outer = not plan.chunk_outer

        def chunk_list() -> list[tuple[tuple, tuple]]:
            out = []
            for combo in _product_list([cl for cl in classes]):
                extents = (geo.batch, *(cl.count for cl in combo))
                ranges = [[(k, min(cc, n - k)) for k in range(0, n, cc)]
                          for n, cc in zip(extents, [min(n, c) for n, c in zip(extents, plan.chunk)])]
                for chunk in _product_list(ranges):
                    out.append((combo, chunk))
            return out

        chunks = chunk_list()
        wgroup = plan.weight_group(geo, wsz)
        order = [(ot, ch) for ot in range(len(o_tiles)) for ch in chunks] if o_outer else \
            [(ot, ch) for ch in chunks for ot in range(len(o_tiles))]
        inputs_seen: set = set()
        in_res = 0.0  # every input tile's DMA share, one job
        for idx, (oi, (combo, chunk)) in enumerate(order):
            on = o_tiles[oi]
            reset = not plan.cache_weights or (o_outer and (idx % len(chunks) == 0))
            if reset:
                loaded = set()
            if not o_outer and oi == 0:
                inputs_seen = set()
            w_res = w_lat = l_res = l_lat = 0.0
            # active taps per dimension
            active = []
            for dd, cls in enumerate(combo):
                ja, jn = chunk[dd + 1]
                taps = [(tt, i0) for tt, i0 in cls.taps if cls.valid(i0, geo.in_spatial[dd], ja, ja + jn)[0]
                        < cls.valid(i0, geo.in_spatial[dd], ja, ja + jn)[1]]
                active.append(taps)
            nbk, nbn = chunk[0]
            out_elems = math.prod(jn for _, jn in chunk[1:])
            if any(not a for a in active):
                pool += op_ns(t, "memset", "dve", **{**FORMULA_DEFAULTS, "N": nbn * out_elems})
                s_res, s_lat = self._xfer(on * nbn * out_elems * osz, out_elems * osz, on)
                dma_res += s_res
                works += 1
                continue
            per_dim = [[taps[k:k + (plan.fold if folding and dd == fd else plan.tap_block[dd])]
                        for k in range(0, len(taps), plan.fold if folding and dd == fd else plan.tap_block[dd])]
                       for dd, taps in enumerate(active)]
            steps = 0
            groups = _product_list(per_dim)
            homes = fold_homes(plan, [[[i0 for _, i0 in g] for g in gs] for gs in per_dim], [c.istep for c in combo])
            grow = fold_growth(homes)
            loaded_here: set = set()  # this work's input tiles (one a home, however many groups read it)
            for ci, ck in enumerate(c_tiles):
                for gid, group in enumerate(groups):
                    steps += math.prod(1 if folding and dd == fd else len(g) for dd, g in enumerate(group))
                    # the input tile of (channel tile, tap group): another group's, grown, where fold_homes says
                    ikey = (ci, homes[gid][0])
                    if ikey not in inputs_seen and ikey not in loaded_here:
                        loaded_here.add(ikey)
                        if not o_outer:
                            inputs_seen.add(ikey)
                        home = homes[gid][0]
                        r_, l_ = self._conv_input(geo, plan, combo, chunk, ck, groups[home], xs, isz, bank, fp32_in,
                                                     evacuate, on_chip, grow.get(home, 0), x_cast)
                        l_res += r_[0]
                        l_lat = max(l_lat, l_)
                        pe += r_[1]
                        pool += r_[2]
                    # weights
                    gi = oi // wgroup  # output-channel tiles loaded together (ConvPlan.weight_group)
                    wkey = (ci, oi, tuple(tp for tp, _ in group[fd])) if folding else (ci, gi)
                    if plan.pack > 1:
                        wkey = ("pack",)
                    if wkey not in loaded:
                        loaded.add(wkey)
                        nblk = len(group[fd]) if folding else 1
                        won = sum(o_tiles[gi * wgroup:(gi + 1) * wgroup]) if wgroup > 1 else on
                        r1, r2, tps = weight_load(ck, won)
                        w_res += r1 * nblk
                        w_lat = max(w_lat, r2)
                        pe += tps
                        w_pe += tps
                        w_keys += bool(tps)
                        if (wsz != geo.itemsize and not w_cast or tps) and plan.pack == 1:  # converted (or
                            # copied out of PSUM)
                            per = math.prod(ksize) // (ksize[fd] if folding else 1) * won
                            copy = {**FORMULA_DEFAULTS, "P": ck * nblk}
                            if w_float and tps == 0 and dt.by_name(geo.dtype).is_float:  # (not w_cast)
                                # backend/conv.py's _weights_converted: ScalarE's share, VectorE's the rest
                                k = cast_split(t, per, won)
                                act += op_ns(t, "activation", "act", **{**copy, "N": per * k // won})
                                if k < won:
                                    dve += op_ns(t, "tensor_copy", "dve", **{**copy, "N": per * (won - k) // won})
                            else:
                                dve += op_ns(t, "tensor_copy", "dve", **{**copy, "N": per})
                        if plan.pack > 1:
                            dve += math.prod(ksize) * op_ns(t, "select", "dve", **{**FORMULA_DEFAULTS,
                                                                                  "N": on})
            # matmuls: one per step per PSUM piece
            pieces = 1
            piece_n = nbn * out_elems
            if plan.bank_len:
                a, n = chunk[plan.bank_dim]
                pieces = -(-n // plan.bank_len)
                piece_n = piece_n * plan.bank_len // n if pieces > 1 else piece_n
            kk = (plan.fold * c_tiles[0]) if folding else c_tiles[0]
            mm = steps * pieces * op_ns(t, "matmul", "pe", M=on, N=piece_n, K=kk, P=kk, dtype_factor=factor)
            pe += mm
            n_ev = len(evac)
            evacuate(nbn * out_elems, on)
            # the store
            if not cl_out:
                # a class of a base-dilated window holds every step-th output position: its rows are strided
                strided = (ys[0], ys[1], *(st * cl.step for st, cl in zip(ys[2:], combo)))
                run = _run(strided, (nbn, on, *(jn for _, jn in chunk[1:])), (0, *range(2, nsp + 2)))
                s_res, s_lat = self._xfer(on * nbn * out_elems * osz, run * osz, on)
            else:
                s_res = s_lat = 0.0
                bp = out_block(out_elems)
                per_bank = max(1, bank // on)
                blocks = -(-out_elems // bp)
                groups_ = -(-blocks // per_bank)
                for _ in range(nbn):
                    pe += blocks * op_ns(t, "transpose", "pe", P=on, N=bp, fp32=fp32_out)
                    for gi in range(groups_):
                        nblks = min(per_bank, blocks - gi * per_bank)
                        evacuate(nblks * on, bp)
                        r1, r2 = self._xfer(nblks * bp * on * osz, on * osz, bp)
                        s_res += r1
                        s_lat = max(s_lat, r2)
            dma_res += l_res + w_res + s_res
            in_res += l_res
            works += 1
            ev_tail = sum(min(a_, d_) for a_, d_ in evac[n_ev:])
            if not pre_done:
                first_load = max(l_res + w_res, l_lat, w_lat)
                pre_done = True
            last_tail = mm / max(1, steps * pieces) + ev_tail + s_lat
        for k, (a_, d_) in enumerate(evac):
            if k % 2 == 0:
                act += a_
                act_psum += a_
            else:
                dve += d_
        dma_res, pe, act, dve, pool, act_psum = (v * jobs for v in (dma_res, pe, act, dve, pool, act_psum))
        works *= jobs
        busy = self._engines_busy(act, dve, pool, act_psum)
        if plan.pack > 1:
            # packed jobs' input tiles wait for nothing but their memsets: every job's loads are issued at
            # the start and share the DMA engines, so the first matmul waits for about all of them
            first_load = max(first_load, in_res * jobs)
        # a load's transposes run while the loads after it arrive: the last one's follow them all
        overlapped = w_pe * jobs * (w_keys - 1) / w_keys if w_keys else 0.0
        steady = max(dma_res, first_load + pe - overlapped, busy)
        return steady + last_tail + 2 * self.dma_fixed

    def _conv_input(self, geo: ConvGeometry, plan: ConvPlan, combo: tuple, chunk: tuple, ck: int, group: tuple,
                    xs: tuple[int, ...], isz: int, bank: int, fp32: int, evacuate: Any, on_chip: bool = False,
                    grow: int = 0, cast: bool = False) -> tuple[tuple[float, float, float], float]:
        """One input tile (backend/conv.py's ``_load_input``): ((DMA share, TensorE, GpSimd), DMA time alone);
        ``on_chip``: the tile's loads are GpSimd copies of the producer's tiles instead; ``grow``: more rows
        on the fold dimension for the groups that read it (``fold_homes``); ``cast``: the DMA converts the
        loaded positions to the multiply type (no GpSimd conversion)."""
        t = self.target
        nsp = len(geo.in_spatial)
        folding = plan.fold > 1
        fd = plan.fold_dim
        nb = chunk[0][1]
        boxes = []  # per dimension: (lo, step, extent) of the union, and the fold blocks' boxes
        blocks = []
        for dd, taps in enumerate(group):
            cls = combo[dd]
            ja, jn = chunk[dd + 1]
            offs = [i0 for _, i0 in taps]
            lo = min(offs) + ja * cls.istep
            hi = max(offs) + (ja + jn - 1) * cls.istep
            step = cls.istep if jn > 1 else 0
            for o_ in offs:
                step = math.gcd(step, o_ - offs[0])
            step = step or 1
            boxes.append((lo, step, (hi - lo) // step + 1))
            blocks.append([(i0 + ja * cls.istep, cls.istep, jn + (grow if dd == fd else 0)) for i0 in offs])
        nblk = len(group[fd]) if folding else 1
        dma = lat = pe = pool = 0.0
        cl = plan.transpose_in != "dma"
        if not cl or not folding:
            regions = []
            if folding:
                for b in range(nblk):
                    regions.append([blocks[dd][b] if dd == fd else boxes[dd] for dd in range(nsp)])
            else:
                regions.append(list(boxes))
            ext = [bx[2] for bx in regions[0]]
            pad = False
            padding = 0  # elements zeroed: only where a region meets padding (backend/conv.py _fill_direct)
            if not cl:
                for bxs in regions:
                    if not folding and bxs[-1][1] > 1 and xs[-1] == 1:  # a strided window: its span as rows
                        lo_, st_, ex_ = bxs[-1]
                        bxs = [*bxs[:-1], (lo_, 1, (ex_ - 1) * st_ + 1)]
                        ext = [bx[2] for bx in bxs]
                    valid = [_box_valid(bx, n) for bx, n in zip(bxs, geo.in_spatial)]
                    if any(a >= b for a, b in valid):
                        pad = True
                        padding += nb * math.prod(ext)
                        continue
                    cnt = [b - a for a, b in valid]
                    pad = pad or any(c_ < e for c_, e in zip(cnt, ext))
                    padding += nb * (math.prod(ext) - math.prod(cnt))
                    # runs: the tile's rows (whole when no padding cuts them) and the input's (step 1)
                    dst_run = _run(_strides((nb, *ext)), (nb, *cnt), tuple(range(nsp + 1)))
                    steps_ = [bx[1] for bx in bxs]
                    src_str = (xs[0], *(s_ * st for s_, st in zip(xs[2:], steps_)))
                    src_run = _run(src_str, (nb, *cnt), tuple(range(nsp + 1)))
                    if on_chip:
                        pool += op_ns(t, "tensor_copy", "pool", **{**FORMULA_DEFAULTS, "N": nb * math.prod(cnt),
                                                                   "P": ck})
                        continue
                    nbytes = ck * nb * math.prod(cnt) * isz
                    r_, l_ = self._xfer(nbytes, min(dst_run, src_run) * isz, ck)
                    dma += r_
                    lat = max(lat, l_)
                if pad:
                    pool += op_ns(t, "memset", "pool", **{**FORMULA_DEFAULTS, "N": padding})
                return (dma, pe, pool), lat
            # channels-last: blocks of positions [w, rows, ck] loaded, transposed on TensorE, evacuated
            valid = [_box_valid(bx, n) for bx, n in zip(boxes, geo.in_spatial)]
            if any(a >= b for a, b in valid) or any(a > 0 or b < bx[2] for (a, b), bx in zip(valid, boxes)):
                pool += op_ns(t, "memset", "pool", **{**FORMULA_DEFAULTS, "N": nb * math.prod(ext)})
            if any(a >= b for a, b in valid):
                return (dma, pe, pool), lat
            use_dma = plan.transpose_in == "dma_transpose"
            seg_cap = DMA_T_BLOCK if use_dma else PE_BLOCK
            cap = DMA_T_BLOCK if use_dma else bank
            w0, w1 = valid[-1]
            outer = valid[:-1]
            head = math.prod(b - a for a, b in outer[:-1]) if outer else 1
            rows = outer[-1][1] - outer[-1][0] if outer else 1
            for a in range(w0, w1, seg_cap):
                wn = min(w1, a + seg_cap) - a
                m = max(1, cap // wn) if outer else 1
                for r in range(0, rows, m):
                    rn = min(m, rows - r)
                    cnt = nb * head
                    if use_dma:
                        r_, l_ = self._xfer(rn * wn * ck * isz, 2 * 1024, ck)
                        dma += cnt * r_
                        lat = max(lat, l_)
                        continue
                    r_, l_ = self._xfer(wn * rn * ck * isz, ck * isz, wn)
                    dma += cnt * r_
                    lat = max(lat, l_)
                    pe += cnt * rn * op_ns(t, "transpose", "pe", P=wn, N=ck, fp32=fp32)
                    for _ in range(cnt):
                        evacuate(rn * wn, ck)
            return (dma, pe, pool), lat
        # channels-last and folded: rows of the union transposed in sliding windows (or a base tile copied)
        u = boxes[fd]
        ext = [bx[2] for bx in boxes]
        kk = nblk * ck
        cnt_fd = chunk[fd + 1][1]
        valid = [_box_valid(bx, n) for bx, n in zip(boxes, geo.in_spatial)]
        w0, w1 = valid[-1]
        head = math.prod(b - a for a, b in valid[:fd]) if fd else 1
        if w0 > 0 or w1 < ext[-1] or any(a > 0 or b < bx[2] for (a, b), bx in zip(valid[:fd], boxes)):
            # the fold tile zeroed where the window meets padding: a block's rows of the union's width
            fext = [blocks[fd][0][2] if dd == fd else e for dd, e in enumerate(ext)]
            pool += op_ns(t, "memset", "pool", **{**FORMULA_DEFAULTS, "N": nb * math.prod(fext)})
        rstep = max(1, blocks[fd][0][1] // u[1])
        for a in range(w0, w1, PE_BLOCK):
            seg = min(w1, a + PE_BLOCK) - a
            m = max(1, bank // seg)
            for j0 in range(0, cnt_fd, m):
                rn = min(m, cnt_fd - j0)
                R = (rn - 1) * rstep + nblk
                if rows_fit(ck, R, seg, isz, t):
                    # backend/conv.py's _load_positions: whole rows, converted once, a transpose per channel,
                    # copied out of PSUM in the multiply type (the windows' transposes then read that type)
                    r_, l_ = self._xfer(seg * R * ck * isz, seg * ck * isz, R)
                    if isz != _itemsize(self.matmul_dtype) and not cast:
                        pool += nb * head * op_ns(t, "tensor_copy", "pool", **{**FORMULA_DEFAULTS, "N": seg * ck,
                                                                              "P": R})
                    pe += nb * head * ck * op_ns(t, "transpose", "pe", P=R, N=seg, fp32=0)
                    for _ in range(nb * head):
                        evacuate(ck * R, seg)
                    fp32_win = 0
                else:
                    r_, l_ = self._xfer(seg * R * ck * isz, ck * isz, seg)
                    fp32_win = fp32
                dma += nb * head * r_
                lat = max(lat, l_)
                pe += nb * head * rn * op_ns(t, "transpose", "pe", P=seg, N=kk, fp32=fp32_win)
                for _ in range(nb * head):
                    evacuate(rn * seg, kk)
        return (dma, pe, pool), lat

    def _depthwise_ns(self, geo: ConvGeometry, dw: DepthwisePlan, x: Value, w: Value, y: Value,
                      xs: tuple[int, ...], ys: tuple[int, ...]) -> float:
        """backend/conv.py's ``_depthwise``: per tile its planes loaded (one DMA per stacked group), per tap
        one ScalarE product and one add (VectorE and GpSimd in turn by tile, which share an SBUF port),
        the fp32 sum stored (through a ScalarE conversion when the result is narrower)."""
        t = self.target
        tl = dw.tiling
        taps = math.prod(wd.size for wd in geo.window)
        inner_out = math.prod(geo.out_spatial[1:])
        qrows = geo.out_spatial[0]
        isz, osz = _itemsize(x.dtype), _itemsize(y.dtype)
        wd0 = geo.window[0]
        act = dve = pool = dma = 0.0
        first = last = 0.0
        k = 0
        for _, cn in tl.chunks(geo.groups):
            J = tl.stack(cn, geo.batch)
            r_, _ = self._xfer(J * cn * taps * _itemsize(w.dtype), taps * _itemsize(w.dtype), J * cn)
            dma += r_
            if w.dtype != "f32":
                dve += op_ns(t, "tensor_copy", "dve", **{**FORMULA_DEFAULTS, "N": taps})
            for n0 in range(0, geo.batch, J * tl.batch):
                jn = min(J, (geo.batch - n0) // tl.batch)
                parts = jn * cn
                for q0 in range(0, qrows, tl.block):
                    qn = min(tl.block, qrows - q0)
                    lo = max(0, q0 * wd0.stride - wd0.pad_lo)
                    hi = min(geo.in_spatial[0], (q0 + qn - 1) * wd0.stride + (wd0.size - 1) * wd0.rhs_dilation
                             - wd0.pad_lo + 1)
                    in_elems = tl.batch * (hi - lo) * math.prod(geo.in_spatial[1:])
                    elems = tl.batch * qn * inner_out
                    run_in = _run(xs, (tl.batch, cn, hi - lo, *geo.in_spatial[1:]), (0, *range(2, len(xs))))
                    lres, llat = self._xfer(in_elems * cn * isz, run_in * isz, cn)
                    ld_res, ld_lat = jn * lres, llat + (jn - 1) * lres
                    prod_ns = op_ns(t, "activation", "act", N=elems, P=parts, **_DW_VARS)
                    eng = ADD_ENGINES[k % 2]
                    add_ns = op_ns(t, "tensor_tensor", eng, N=elems, P=parts, **_DW_VARS)
                    act += taps * prod_ns
                    if eng == "dve":
                        dve += (taps - 1) * add_ns
                    else:
                        pool += (taps - 1) * add_ns
                    if osz != 4:
                        act += op_ns(t, "activation", "act", **{**FORMULA_DEFAULTS, "N": elems, "P": parts})
                    run_out = _run(ys, (tl.batch, cn, qn, *geo.out_spatial[1:]), (0, *range(2, len(ys))))
                    sres, slat = self._xfer(elems * cn * osz, run_out * osz, cn)
                    dma += ld_res + jn * sres
                    if k == 0:
                        first = max(ld_res, ld_lat)
                    last = add_ns + max(jn * sres, slat)
                    k += 1
        busy = self._engines_busy(act, dve, pool, 0.0)
        return max(dma, first + busy) + last + 2 * self.dma_fixed

def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def _canonical_strides(shape: tuple[int, ...], dims: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a row-major tensor of ``shape`` in the order ``dims`` (the canonical view)."""
    st = _strides(shape)
    return tuple(st[k] for k in dims)


def _run(strides: Sequence[int], extents: Sequence[int], order: Sequence[int]) -> int:
    """Elements of the longest contiguous run of a box of ``extents`` walked in ``order`` (outermost
    first) on a tensor of ``strides``: the DMA descriptor the access pattern gives (sim's
    ``contiguous_run``)."""
    run = 1
    for k in reversed(order):
        if extents[k] == 1:
            continue
        if strides[k] != run:
            break
        run *= extents[k]
    return run


def _box_valid(bx: tuple[int, int, int], n: int) -> tuple[int, int]:
    """Tile indices ``[lo, hi)`` of a box ``(lo, step, extent)`` that hold input elements (conv.py's ``_valid``)."""
    lo_, step, extent = bx
    lo = 0 if lo_ >= 0 else -(lo_ // step)
    last = (n - 1 - lo_) // step if lo_ <= n - 1 else -1
    return lo, max(lo, min(extent, last + 1))


def _product_list(ranges: Sequence[Sequence[Any]]) -> list[tuple]:
    out: list[tuple] = [()]
    for r in ranges:
        out = [o + (k,) for o in out for k in r]
    return out


def _weight_gradient(window: tuple, fgc: int, result: Value, d: Any) -> bool:
    """More window taps than output positions (backend/conv.py's ``is_weight_gradient``): device-forms
    rewrites it into one contraction per output position before lowering."""
    out = math.prod(result.shape[i] for i in d.output_spatial)
    return (bool(window) and all(wd.lhs_dilation == 1 for wd in window) and fgc == 1
            and math.prod(wd.size for wd in window) > out)


def _tiles(n: int, tile: int) -> list[tuple[int, int]]:
    """(size, count) of the tiles cutting ``n``: the full ones and a last partial one."""
    full, rest = divmod(n, tile)
    return [(tile, full)] * bool(full) + [(rest, 1)] * bool(rest)


def _inner(dims: Sequence[int], shape: tuple[int, ...]) -> bool:
    """``dims`` (of a tensor of ``shape``) are its innermost non-unit dimensions: contiguous in memory."""
    rest = [d for d in range(len(shape)) if d not in dims and shape[d] > 1]
    return bool(dims) and all(r < min(dims) for r in rest)


def _is_elementwise(operands: Sequence[Value | None], result: Value) -> bool:
    return all(v is None or v.shape in (result.shape, ()) for v in operands)




def node_costs(eg: EGraph, view: View, model: CostModel) -> list[float]:
    """The price of every e-node of ``view`` (list cells: 0), by its operator, its operands' and its
    result's shapes and types (the e-graph's analyses), and which operands are model inputs.
    Priced once per distinct (operator, attributes, operand types).

    A transpose is the one price that depends on who reads the value: the backend makes it an access
    pattern, which a contraction (dot, convolution) reads as its operand's strides, directly or through
    reshapes (measured: attention's ``(0,3,1,2)`` output transpose feeding the output projection costs
    nothing beyond the dot), while anyone else must move its elements. A transpose whose every reader
    in the e-graph is a contraction, or a view only contractions read, is priced as a view."""
    inputs = [any(view.nodes[i].ctor in _INPUT_CTORS for i in nodes) for nodes in view.class_nodes]
    # a cast of a constant is done at compile time (backend/precision.py fold_constant_casts): its readers
    # load the narrow constant; a model input's cast is absorbed by the reader that loads the wide one
    params = [any(view.nodes[i].ctor == "Parameter" for i in nodes) for nodes in view.class_nodes]
    ops = [eg.operator(n)[0] if n.ctor in terms.BY_CTOR and n.ctor not in ("Fill",) else "" for n in view.nodes]
    # A dot's price does not depend on its operands' order in memory beyond what its own dimension
    # numbers say, so a transpose only dots read is their access pattern. A convolution's does (its
    # labels say which dimension is contiguous): a transposed input is read as it lies by the
    # convolution with permuted labels (conv-transpose-input), which the cost model prices in that
    # layout, while a convolution of the transpose is priced in the layout its labels give it.
    # Free, the transpose let the extraction pair the cheaper layout's price with the other's data.
    # (A cast on the way, the precision set's, is one the dot absorbs: it loads through the view and converts
    # on chip. Counted as a reader, it made BERT's attention output transpose a copy, 76 us a layer, and the
    # extraction took the other orientation of P.V: 11% slower.)
    dotted = _read_only_by(view, ops, _DOTS, _PASS_VIEWS | {"convert"})
    reduced = _reductions_of(view, ops)
    # A cast only contractions read is absorbed by them (backend/matmul.py: the source is loaded and
    # converted on chip): the dot is priced on the source, multiplying in the cast's type, and the
    # cast itself costs nothing more. Per class: the source class of such a cast.
    # A cast read through a pad counts as read by the contraction beneath it: generic's conv-pad gives
    # that convolution a form reading the cast itself (its window padding), in which it is absorbed;
    # priced as a pass, the cast kept ResNet-50's image pad at -O2 where -O1's policy dropped it.
    cast_read = _read_only_by(view, ops, _CONTRACTIONS, _PASS_VIEWS | {"pad"})
    # A cast of a value an operator computes is written narrow by that operator (the backend's cluster ends
    # in the cast, a dot's evacuation writes it): the dot loads the narrow value and converts nothing. So
    # is a cast of a transpose of one (backend/precision.py casts the source): attention's output written
    # bf16 by its evacuation and loaded transposed, half the bytes each way.
    produced = _produced(view, ops)
    # A cast of a computed value that only concatenates read is written narrow by its producer too: the
    # pieces are copied narrow, where a cast of the concatenation is a pass of its own through HBM
    # (generic's convert-concatenate; gemma's rotary halves cast to bf16 for the KV cache)
    joined = _read_only_by(view, ops, frozenset({"concatenate"}), _PASS_VIEWS | _LIST_CELLS)
    # ... and a concatenation lies in HBM (its pieces are copied there by DMA): a pass reading it loads it
    moved = [bool(nodes) and all(ops[i] == "concatenate" for i in nodes) for nodes in view.class_nodes]
    cast_from: dict[int, int] = {}
    for i, node in enumerate(view.nodes):
        c = view.node_class[i]
        if ops[i] == "convert" and cast_read[c] and node.children:
            cast_from.setdefault(c, node.children[0])

    def value(c: int) -> Value | None:
        shape, dtype = view.shape.get(c), view.dtype.get(c)
        return None if shape is None or dtype is None else Value(tuple(shape), dtype)

    side = _side_work(view, ops)
    cache: dict[tuple, float] = {}
    out: list[float] = []
    for i, node in enumerate(view.nodes):
        c = view.node_class[i]
        if view.class_is_list[c]:
            out.append(0.0)
            continue
        if node.ctor in ("Parameter", "Constant", "Fill") or (ops[i] == "convert" and cast_read[c]) \
                or side[i] \
                or (ops[i] == "transpose" and dotted[c]) \
                or (ops[i] == "convert" and joined[c] and bool(node.children) and produced[node.children[0]]):
            out.append(NODE_NS)
            continue
        fixed, variadic = operand_layout(node)
        kids = list(node.children[:fixed])
        if variadic:
            kids += view.list_items(node.children[fixed]) or []
        multiply_in = None
        if ops[i] == "dot" and all(k in cast_from for k in kids):
            multiply_in = view.dtype.get(kids[0])
            kids = [k if produced[cast_from[k]] or (inputs[cast_from[k]] and not params[cast_from[k]])
                    else cast_from[k] for k in kids]
        elif ops[i] == "convolution" and len(kids) == 2 and kids[1] in cast_from and params[cast_from[kids[1]]] \
                and view.dtype.get(kids[0]) == view.dtype.get(kids[1]):
            # fp32 weights cast to the input's type: the implicit GEMM loads and converts them (backend/lower.py
            # _absorbs), so they are priced as the fp32 weights the policy's convolution reads
            multiply_in = view.dtype.get(kids[1])
            kids = [kids[0], cast_from[kids[1]]]
        vals = tuple(value(k) for k in kids)
        # an operand that another operand reduces (softmax's x - max(x), e / sum(e)) was stored before
        # the reduction could finish: it is loaded back, not fused (the backend's passes do the same)
        reread = set().union(*(reduced[k] for k in kids)) if ops[i] not in _CONTRACTIONS else set()
        hosted = ops[i] == "softmax" and bool(kids) and _hosts_softmax(eg, view, ops, kids[0], model)
        from_hbm = [inputs[k] or k in reread or moved[k] for k in kids]
        if ops[i] == "convolution" and kids and kids[0] in cast_from and inputs[cast_from[kids[0]]]:
            from_hbm[0] = True  # a model input's cast, absorbed or a pass of its own: loaded from HBM either way
        loaded = tuple(inputs[k] for k in kids)  # the model's own inputs and constants: the DMA converts them
        key = (node.ctor, node.slots, vals, value(c), tuple(from_hbm), multiply_in, hosted, loaded)
        cost = cache.get(key)
        if cost is None:
            op, attrs = eg.operator(node)
            cost = cache[key] = model.op_ns(op, attrs, vals, value(c), key[4], multiply_in, hosted, loaded)
        out.append(cost)
    return out


# A per-channel vector computed from the model's parameters and constants alone (a batch norm's shift
# b - mean * s) is computed ahead of the work that reads it (backend/elementwise.py ``lowering_order``),
# off its chain, in the engines' gaps: priced as the side work it is, as a view is.
SIDE_ELEMENTS = 4096


def _side_work(view: View, ops: Sequence[str]) -> list[bool]:
    """Per node: an elementwise operator of at most :data:`SIDE_ELEMENTS` elements whose operands are all
    computed from parameters and constants alone (through views and such operators). A class is made so
    once one of its nodes is: from the leaves up, each node visited when its last operand class is."""
    shapes = [view.shape.get(c) for c in range(len(view.class_nodes))]
    small = [s is not None and math.prod(s) <= SIDE_ELEMENTS for s in shapes]
    fixed = [False] * len(view.class_nodes)
    waiting = [len(set(node.children)) for node in view.nodes]
    users: dict[int, list[int]] = {}
    for i, node in enumerate(view.nodes):
        for k in set(node.children):
            users.setdefault(k, []).append(i)
    leaf = [node.ctor in _INPUT_CTORS or node.ctor == "Fill" for node in view.nodes]
    ready = [i for i in range(len(view.nodes)) if leaf[i]]
    while ready:
        i = ready.pop()
        c = view.node_class[i]
        if fixed[c] or not leaf[i] and not (ops[i] in _VIEW_OPS or ops[i] in _SIDE_OPS and small[c]):
            continue
        fixed[c] = True
        for j in users.get(c, ()):
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    return [ops[i] in _SIDE_OPS and small[view.node_class[i]] and bool(node.children)
            and all(fixed[k] for k in node.children) for i, node in enumerate(view.nodes)]


_SIDE_OPS = frozenset({"add", "subtract", "multiply", "divide", "negate", "rsqrt", "sqrt", "maximum", "minimum",
                       "convert", "exponential", "log", "abs"})


def _produced(view: View, ops: Sequence[str]) -> list[bool]:
    """Per class: its value is written by a producer a cast joins (backend/lower.py ``_fused_source``): an
    elementwise pass of its shape on ScalarE or VectorE (a fused norm's epilogue too), a dot's or a
    convolution's evacuation, a softmax; not a model input, a view, a reduction (its result written
    apart), nor data moved by DMA (a concatenate: a cast of it is a pass of its own). A transpose of such a
    value counts too: backend/precision.py casts the source and transposes the cast (a view)."""
    def computes(i: int) -> bool:
        node, op = view.nodes[i], ops[i]
        od = registry.get(op) if op else None
        if od is None or node.ctor in _INPUT_CTORS or op in _VIEW_OPS:
            return False
        if op in _CONTRACTIONS or op in NARROW_WRITERS:
            return True
        shape = view.shape.get(view.node_class[i])
        return od.engine in (registry.SCALAR, registry.VECTOR) and shape is not None and all(
            view.shape.get(k) in (shape, None) for k in node.children[:operand_layout(node)[0]])

    out = [any(computes(i) for i in nodes) for nodes in view.class_nodes]
    transposes = [(view.node_class[i], view.nodes[i].children[0]) for i in range(len(view.nodes))
                  if ops[i] == "transpose" and view.nodes[i].children]
    changed = True
    while changed:
        changed = False
        for c, src in transposes:
            if out[src] and not out[c]:
                out[c] = changed = True
    return out


_CONTRACTIONS = frozenset({"dot", "convolution"})
_DOTS = frozenset({"dot"})
_PASS_VIEWS = frozenset({"reshape", "bitcast", "transpose"})
_LIST_CELLS = frozenset({""})  # a variadic operator's operand list (no operator of its own)
_VIEW_OPS = _PASS_VIEWS | {"broadcast"}


def _read_only_by(view: View, ops: Sequence[str], readers: frozenset[str],
                  passes: frozenset[str] = frozenset()) -> list[bool]:
    """Per class: it has readers, and every one is one of ``readers`` (contractions, say) or one of
    ``passes`` (default: a view, reshape, bitcast or transpose) of which the same holds. Decided from the
    readers up, cycles of views counting as not so read."""
    passes = passes or _PASS_VIEWS
    read_by: list[list[int]] = [[] for _ in range(view.n_classes)]
    for i, node in enumerate(view.nodes):
        for k in set(node.children):
            read_by[k].append(i)
    memo: dict[int, bool] = {}

    def ok(c: int, open_: set[int]) -> bool:
        if c in memo:
            return memo[c]
        if c in open_ or not read_by[c]:
            return False
        open_.add(c)
        res = all(ops[i] in readers or (ops[i] in passes and ok(view.node_class[i], open_))
                  for i in read_by[c])
        open_.discard(c)
        memo[c] = res
        return res

    return [not view.class_is_list[c] and ok(c, set()) for c in range(view.n_classes)]


def _hosts_softmax(eg: EGraph, view: View, ops: Sequence[str], x: int, model: CostModel) -> bool:
    """Would the backend have a dot compute a softmax of class ``x`` (backend/fused.py
    ``plan_softmax_hosts``)? ``x`` holds the dot, a reshape of it, or an elementwise operator reading a
    dot of its size (the dot's epilogue: BERT's scaled and masked scores), and the dot's tiles deliver
    whole rows (:func:`~nxsat.extract.plan.hosts_rows`)."""
    row = (view.shape.get(x) or (1,))[-1]

    def dot_in(c: int, depth: int) -> bool:
        for i in view.class_nodes[c]:
            if ops[i] == "dot":
                node = view.nodes[i]
                lhs, rhs = (view.shape.get(k) for k in node.children[:2])
                if lhs is None or rhs is None:
                    continue
                _, M, K, N = dot_sizes(lhs, rhs, eg.operator(node)[1]["dims"])
                mt = model.multiply_type(*(view.dtype.get(k, "f32") for k in node.children[:2]))
                if N == row and hosts_rows(matmul_plan(M, K, N, mt, model.target), N):
                    return True
            elif depth and ops[i] in _PASS_VIEWS | _ELEMENTWISE_HOSTED and view.nodes[i].children:
                size = math.prod(view.shape.get(c) or ())
                if any(math.prod(view.shape.get(k) or ()) == size and dot_in(k, depth - 1)
                       for k in view.nodes[i].children):
                    return True
        return False

    return dot_in(x, 2)


# what a dot's epilogue cluster computes on the scores before a softmax reads them
_ELEMENTWISE_HOSTED = frozenset({"add", "subtract", "multiply", "divide", "select", "convert"})


def _reductions_of(view: View, ops: Sequence[str]) -> list[frozenset[int]]:
    """Per class: the classes it is a reduction of, directly or through views, broadcasts and casts (the
    statistic a softmax or a normalization broadcasts back over what it reduced)."""
    memo: dict[int, frozenset[int]] = {}

    def of(c: int, open_: set[int]) -> frozenset[int]:
        if c in memo:
            return memo[c]
        if c in open_:
            return frozenset()
        open_.add(c)
        found: set[int] = set()
        for i in view.class_nodes[c]:
            kids = view.nodes[i].children
            if ops[i] == "reduce" and kids:
                found.add(kids[0])
            elif ops[i] in _STAT_VIEWS and kids:
                found |= of(kids[0], open_)
        open_.discard(c)
        memo[c] = frozenset(found)
        return memo[c]

    return [frozenset() if view.class_is_list[c] else of(c, set()) for c in range(view.n_classes)]


_STAT_VIEWS = frozenset({"reshape", "bitcast", "transpose", "broadcast", "convert"})
_INPUT_CTORS = ("Parameter", "Constant")


__all__ = ["NODE_NS", "CostModel", "Value", "node_costs"]

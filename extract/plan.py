"""Tiling plans: how an operator is cut into device instructions, as data.

One plan per operator family, decided here from the target's geometry, so that the backend that
emits the instructions and the cost model that prices them (the extraction issue) read the same
decision and never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nxsat import dtypes as dt
from nxsat.sim.target import Target


@dataclass(frozen=True)
class MatmulPlan:
    """Tiles of ``[M, K] @ [K, N]``: ``m_tile`` stationary columns (output partitions), ``k_tile``
    contraction rows (partitions), ``n_tile`` moving columns (one PSUM bank of fp32). ``resident``:
    an M tile's stationary K tiles are loaded once and kept on chip for all its N tiles; otherwise
    each is loaded beside the moving tile it meets (once per N tile), so a long contraction does not
    hold its whole stationary operand in SBUF. ``k_group``: K tiles loaded by one DMA (a run of
    them), so a load moves at least :data:`LOAD_BYTES` per partition when the contraction is long."""

    m_tile: int
    k_tile: int
    n_tile: int
    resident: bool = True
    k_group: int = 1
    # K tiles one load covers when the moving operand lies K-contiguous (rows of the weight, transposed
    # on TensorE: gemma's [6912, 1152] projections): its rows are then k_group_rows * k_tile long
    k_group_rows: int = 1
    # one N tile and at most JOINT_M_TILES M tiles: K-contiguous operands are transposed with their rows
    # stacked (fewer TensorE transposes), each M tile accumulating in its own PSUM bank
    joint: bool = False
    # N tiles whose moving operand is loaded once and kept for every M tile (0: loaded per M tile): the
    # N dimension in blocks of this many tiles, the M tiles inside each block, so the moving operand
    # is read once and the stationary one once per block
    n_block: int = 0
    # One M tile against N tiles of a moving operand lying N-contiguous, in blocks of wide_tiles N tiles
    # (at most WIDE_N_TILES): each K group of a block is loaded in rows as long as the block
    # (k_group_wide K tiles a load), and every N tile's matmul reads its columns, the block's N tiles
    # accumulating in PSUM banks of their own; a block is stored while the next one computes (gemma's
    # output projection, N = 1,152: rows of 512 bf16, 1 KiB descriptors, became rows of 2,304 bytes)
    wide: bool = False
    k_group_wide: int = 1
    wide_tiles: int = 1  # N tiles per wide block (the N tiles in blocks of at most WIDE_N_TILES, balanced)

    def k_tiles(self, K: int) -> int:
        return -(-K // self.k_tile)

    def runs(self, K: int, rows: bool = False, wide: bool = False) -> list[tuple[int, int, int]]:
        """The contraction as ``(k0, rows, tiles)``: runs of up to ``k_group`` (``k_group_rows`` for a
        moving operand loaded as rows, ``k_group_wide`` for one loaded N long) whole K tiles loaded
        together, and a last partial tile alone."""
        kt, whole = self.k_tile, K // self.k_tile
        group = self.group(rows, wide)
        out = [(i * kt, kt, min(group, whole - i)) for i in range(0, whole, group)]
        return out + ([(whole * kt, K - whole * kt, 1)] if K % kt else [])

    def group(self, rows: bool = False, wide: bool = False) -> int:
        return self.k_group_rows if rows else self.k_group_wide if wide else self.k_group

    def stationary_rows(self, M: int, K: int, size: int, group: int) -> int:
        """M tiles whose resident stationary operand, lying K-contiguous and read in whole rows (K in one
        run of ``group`` tiles), loads in one DMA, :func:`rows_per_partition` rows on each partition
        (an LM head laid out ``W @ x``, its [262144, 1152] table 128 rows, 2,304-byte descriptors, a DMA),
        when it streams through at least STREAM_M_TILES M tiles: with a few, TensorE waits for a first
        load four times larger ([3072, 768] @ [768, 128] bf16: 37.0 -> 42.9 us)."""
        whole = self.resident and group * self.k_tile >= K and -(-M // self.m_tile) >= STREAM_M_TILES
        return rows_per_partition(K * size, M) if whole else 1

    def moving_rows(self, K: int, N: int, size: int) -> int:
        """The rows per partition of a moving operand lying K-contiguous, per N tile (gemma's [6912, 1152]
        gating weights and its LM head, ``x @ E.T``: four rows of 1,152 per partition, 9,216-byte
        descriptors)."""
        whole = self.k_group_rows * self.k_tile >= K
        return rows_per_partition(K * size, min(N, self.n_tile)) if whole else 1

    def column_rows(self, M: int, N: int) -> bool:
        """Does a product's result go out as rows: one column and several M tiles (an LM head for one
        token), its ``[m_tile, 1]`` tiles gathered, transposed and stored as rows (backend/matmul.py
        ``_Columns``), where one by one each was ``m_tile`` descriptors of one value?"""
        return N == 1 and M >= 2 * self.m_tile

    def is_wide(self, joint: bool, k_contiguous: bool) -> bool:
        """Is the moving operand loaded N long (:attr:`wide`), given whether the dot takes the joint path
        and whether its moving operand lies K-contiguous (transposed as it loads: its runs are K's)?"""
        return self.wide and not joint and not k_contiguous


# Kernels that write their result in the type of a narrowing cast reading it alone (backend/fused.py
# ``written_as``; backend/lower.py ``_fused_source``), so the cast costs a dot reading it nothing
# (extract/cost.py ``_produced``), as an elementwise pass's or a contraction's evacuation does.
# A pooling (reduce-window) accumulates in fp32 and rounds once as it writes, which is the cast's rounding.
NARROW_WRITERS = frozenset({"softmax", "reduce-window"})
# The share of SBUF loads issued ahead of program order may fill (backend/schedule.py prefetches within it;
# extract/cost.py hides a model input's load under the operators before it up to that many bytes).
PREFETCH_SBUF_FRACTION = 0.6
# The share of SBUF an M tile's stationary operand may keep resident across its N tiles.
STATIONARY_SBUF_SHARE = 1 / 8
# The share of SBUF a block of N tiles' moving operand may keep resident across the M tiles.
MOVING_SBUF_SHARE = 1 / 4
# PSUM banks the M tiles of a joint matmul may hold at once (of eight; transposes use the others).
JOINT_M_TILES = 4
# PSUM banks the N tiles of a wide matmul may hold at once.
WIDE_N_TILES = 4
# Bytes per partition a grouped operand load moves at least: the size from which a DMA runs at full
# rate (docs: ~1.3 us from trigger to transfer, >= 4 KiB per partition saturates).
LOAD_BYTES = 4096
# Bytes per partition that rows shorter than this are gathered to, several to a partition: a descriptor
# costs a DMA engine 12 ns against 17 bytes a ns (the target spec), so 2,304-byte rows pay 8.9% over the
# transfer, 9,216-byte runs 2.2% (gemma3's weights all lie in rows of 1,152 bf16: 621 us of its DMA
# engines' 8,326)
GATHERED_ROW_BYTES = 16384
# Adjacent rows a partition of a TensorE-transposed operand holds at most: each row's K blocks are
# transposed apart (128 rows a transpose, as before) and the copy out of PSUM puts the columns back in
# order; four keeps one bank's four 128-column blocks to one K block.
MAX_ROWS_PER_PARTITION = 4
# M tiles from which a resident stationary operand streams: its loads then take several rows a partition.
STREAM_M_TILES = 64


# A dot of many tiny products (DLRM's feature interaction: 3,616 batches of [6, 8] @ [8, 6]) runs on VectorE
# with its batches on the partitions: every product of a tile of batches in one multiply, the sums in one
# reduction, where TensorE took two loads, a matmul, an evacuation and a store per batch.
VECTOR_DOT_PRODUCTS = 512  # products per batch (M * N * K) the vector path takes, one tile's free size
VECTOR_DOT_BATCHES = 32  # batches it needs at least (fewer: TensorE's few instructions are as quick)


def vector_dot(B: int, M: int, K: int, N: int) -> bool:
    """Does a ``[B, M, K] @ [B, K, N]`` float dot run on VectorE, its batches on the partitions?"""
    return B >= VECTOR_DOT_BATCHES and M * N * K <= VECTOR_DOT_PRODUCTS


def load_queues(target: Target) -> int:
    """The DMA queues the scheduler gives loads (backend/schedule.py), three quarters of them: the rest
    take the stores, which wait on compute and would hold loads up behind them."""
    return max(1, target.dma_queues * 3 // 4)


def rows_per_partition(row_bytes: int, rows: int, partitions: int = 128) -> int:
    """Adjacent rows of ``row_bytes`` each (a K-contiguous operand read in whole rows) one partition
    loads, of ``rows``: as many as stay within :data:`GATHERED_ROW_BYTES` (at least one), of the whole
    blocks of ``partitions`` rows there are."""
    r = MAX_ROWS_PER_PARTITION
    while r > 1 and (r * partitions > rows or r * row_bytes > max(GATHERED_ROW_BYTES, row_bytes)):
        r //= 2
    return r


# A contraction split into segments may take this many more K tiles than merged before a copy is cheaper.
SPLIT_TILES = 1.25


def dot_sizes(lhs: Sequence[int], rhs: Sequence[int], dims: Any) -> tuple[int, int, int, int]:
    """A dot's ``(B, M, K, N)``, the ``[B, M, K] @ [B, K, N]`` it is computed as: batch, the left operand's
    free, contracted and the right operand's free dimensions, each merged (``dims``: its DotDims)."""
    lb, lc, rb, rc = dims.lhs_batch, dims.lhs_contracting, dims.rhs_batch, dims.rhs_contracting
    return (math.prod(lhs[d] for d in lb), math.prod(n for d, n in enumerate(lhs) if d not in lb and d not in lc),
            math.prod(lhs[d] for d in lc), math.prod(n for d, n in enumerate(rhs) if d not in rb and d not in rc))


def matmul_plan(M: int, K: int, N: int, dtype: str, target: Target) -> MatmulPlan:
    """The largest tiles the array and one PSUM bank take; the stationary operand resident when its K
    tiles fit the SBUF share (mobilenet_v2's weight gradients contract over 75k positions: 588 K
    tiles, loaded all at once, left no room for the moving ones)."""
    mm = target.matmul
    n_bank = target.psum_bank_bytes // 4
    m, k, n = min(M, mm["cols"]), min(K, mm["rows"]), min(N, mm["max_moving"], n_bank)
    size = dt.by_name(dtype).itemsize
    ktiles, mtiles, ntiles = -(-K // k), -(-M // m), -(-N // n)
    stationary = ktiles * m * size  # bytes per partition
    resident = stationary <= STATIONARY_SBUF_SHARE * target.sbuf_bytes
    group = max(1, min(ktiles, LOAD_BYTES // (n * size)))
    group_rows = max(1, min(ktiles, LOAD_BYTES // (k * size)))
    # Several M tiles read the same moving operand: keep it for as many N tiles as fit MOVING_SBUF_SHARE
    # when that moves fewer bytes (a 2048 x 2048 x 2048 bf16 dot re-read its moving operand for each of
    # its 16 M tiles: 151 MB of DMA for 25 MB of operands, TensorE busy 30% of the time)
    # (always fewer bytes: blocks x M + N against M + N x M tiles, blocks being at most N / n_tile)
    block = min(ntiles, int(MOVING_SBUF_SHARE * target.sbuf_bytes) // (ktiles * n * size)) \
        if mtiles > 1 and resident else 0
    wide = mtiles == 1 and ntiles > 1 and resident
    blocks = -(-ntiles // WIDE_N_TILES)
    wide_tiles = -(-ntiles // blocks)
    group_wide = max(1, min(ktiles, LOAD_BYTES // (min(N, wide_tiles * n) * size)))
    return MatmulPlan(m, k, n, resident, group, group_rows, joint=N <= n and mtiles <= JOINT_M_TILES, n_block=block,
                      wide=wide, k_group_wide=group_wide, wide_tiles=wide_tiles)


PE_MIN = 16  # rows of a K-contiguous operand from which TensorE transposes pay whatever K is
PE_MIN_ELEMENTS = 256  # elements from which they pay however few the rows (an element-wise DMA: 12 ns each;
# rows loaded as they lie may also be read on chip, where the producer left them: gemma3's probabilities)


def packed_outputs_last(in_channels: int, out_channels: int, out_stride: int) -> bool:
    """Does a packed (block-diagonal) convolution load each group's weights with its output channels
    innermost (``[I, K..., Og]``; backend/conv.py ``_packed``)? Where they lie together in HBM (HWIO, and the
    constant kernels ``kmajor_constants`` stores output-innermost): each group's rows then load in runs of
    them, not a 4-byte descriptor per element (ResNeXt-50 1,312.3 -> 354.2 us)."""
    return in_channels > 1 and out_channels > 1 and out_stride == 1


def pe_transpose_pays(rows: int, k: int) -> bool:
    """Does a K-contiguous ``[rows, K]`` operand (K on the partitions wanted) go through TensorE transposes
    (rows loaded as they lie, a transpose per 128 of K, a copy out of PSUM) rather than an element-wise
    DMA, a descriptor per element? A narrow tile is cheaper element-wise only while it is small: gemma's
    11 tokens against a 6,912-long contraction were 76,032 descriptors per dot (2.75 ms of DMA engine
    time over its 26 layers)."""
    return min(rows, k) >= PE_MIN or rows * k >= PE_MIN_ELEMENTS


def segments_pay(ko: int, ki: int, target: Target) -> bool:
    """A contraction run as ``ko`` segments of ``ki`` (K tiles never crossing one) rather than copied
    into one merged run: worth it while the segments' partial tiles add at most ``SPLIT_TILES`` times
    the merged K tile count (a copy of an operand whose dimensions do not merge is an
    element-by-element DMA of all of it)."""
    rows = target.matmul["rows"]
    return ko * -(-ki // rows) <= SPLIT_TILES * -(-(ko * ki) // rows)


@dataclass(frozen=True)
class ShardPlan:
    """Splitting one dot's weight across the ``ranks`` physical cores of a logical core: each core
    loads and multiplies ``1/ranks`` of the weight, and an all-gather on the cc stream joins the
    partial results (none when the result is a model output: the host joins the shards)."""

    ranks: int
    saved_ns: float  # the weight bytes and FLOPs one core no longer does
    gather_ns: float  # the all-gather that puts the result back together (0 for an output)

    @property
    def pays(self) -> bool:
        return self.saved_ns > self.gather_ns


def shard_plan(weight_bytes: int, other_bytes: int, result_bytes: int, flops: int, matmul_dtype: str,
               gathered: bool, target: Target) -> ShardPlan:
    """What sharding a dot's weight over the logical core's physical cores saves, and what the
    all-gather costs, in the target's own terms: the dot takes max(bytes moved / memory bandwidth,
    FLOPs / TensorE peak) (its roofline), and the all-gather the collective cost formula the timing
    model charges. Sharded, a core moves its part of the weight and of the result, all of the other
    operand, and does its part of the FLOPs."""
    from nxsat.sim.target import physical_cores

    r = physical_cores(target)
    peak = target.peak_flops(matmul_dtype) or target.peak_flops("f32")
    bw = target.memory_bw

    def roof(wb: float, rb: float, f: float) -> float:
        return max((wb + other_bytes + rb) / bw, f / peak if peak else 0.0)

    saved = roof(weight_bytes, result_bytes, flops) - roof(weight_bytes / r, result_bytes / r, flops / r)
    gather = 0.0
    if gathered and r > 1:
        col = target.collectives
        wire = (r - 1) * result_bytes / r
        gather = op_ns(target, "all_gather", "cc", N=0, P=0, R=r, steps=r - 1, wire_bytes=wire,
                       fixed_ns=col["fixed_ns"], hop_ns=col["hop_ns"], link_gbps=col["link_gbps_per_rank"])
    return ShardPlan(r, saved, gather)


# The variables of the target's cost formulas an operator-level price does not distinguish.
FORMULA_DEFAULTS = {"fast": 0, "accum": 0, "half": 0, "zero_bf16": 0, "fp32": 0, "psum_in": 0, "all_sbuf": 1,
                    "lowp": 0, "contig": 1, "P": 128}
# A weight conversion at least this long a partition is shared by ScalarE and VectorE (cast_split). ResNet-50
# under unet-inference, its streaming schedule, with a fold's shared tiles (fold_homes): 566.4 us shared from
# 512 elements, 567.7 from 1,024, 573.0 from 256 (more, shorter instructions), 580.6 all on ScalarE.
CAST_SPLIT_FREE = 512


def cast_split(target: Target, free: int, cols: int) -> int:
    """How many of a float weight conversion's ``cols`` (its last dimension; ``free`` elements a partition in
    all) ScalarE converts, VectorE the rest: in proportion to their speeds, so that both finish together.
    A convolution's weights are converted next to it, and once SBUF is full of weights in their own type the
    next loads wait for those conversions: ResNet-50's 3x3 512-channel kernels took ScalarE 3.3 us a
    quarter, one after another, while VectorE was idle and the DMA queues fell to 190 GB/s. All on ScalarE
    below :data:`CAST_SPLIT_FREE` (an instruction's fixed cost) or with one column."""
    if free < CAST_SPLIT_FREE or cols < 2:
        return cols
    values = {**FORMULA_DEFAULTS, "N": free}
    act = op_ns(target, "activation", "act", **values)
    dve = op_ns(target, "tensor_copy", "dve", **values)
    return max(1, min(cols - 1, round(cols * dve / (act + dve))))


def op_ns(target: Target, opcode: str, engine: str, **values: float) -> float:
    """Nanoseconds one instruction takes on ``engine`` under the target's cost formula (``values``: the
    formula's variables, as sim/isa.py's ``cost_vars`` gives them)."""
    f = target.cost(opcode, engine)
    assert f is not None, f"{target.name} prices no {opcode} on {engine}"
    return target.engines[engine].ns(float(f({**target.constants, **values})))


# --- elementwise ------------------------------------------------------------------------------------

MAX_COLS = 1024  # elements per partition of one tile
# ... and of a large cluster's tile (at least WIDE_TILES such tiles): half the instructions, with as many
# tiles left to overlap loads, compute and stores (mobilenet_v2's training step: 38k fewer instructions;
# resnet50's clusters, a few tiles each, lost 4.5% of latency to the wider tiles)
WIDE_COLS = 2048
WIDE_TILES = 16


def max_cols(shape: tuple[int, ...], part: int) -> int:
    """The widest tile a cluster of ``shape`` takes: :data:`WIDE_COLS` when it still makes
    :data:`WIDE_TILES` full tiles, else :data:`MAX_COLS`."""
    return WIDE_COLS if math.prod(shape) >= WIDE_COLS * part * WIDE_TILES else MAX_COLS


# --- convolution -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WindowClass:
    """One class of output positions of one spatial dimension: outputs ``first + step * j`` for
    ``j < count``, on which every window tap lands on real input elements in the same pattern.

    Base (lhs) dilation puts holes between the input elements, so whether a tap meets an element or
    a hole depends on the output position modulo ``step``; without it there is one class. Tap ``t``
    (window element, before any reversal) of output ``j`` reads input index ``i0 + j * istep``, where
    ``(t, i0)`` is an entry of ``taps``; indices outside the input are padding. Taps that never meet
    an input element of the class are left out, as are classes beyond the output."""

    first: int
    step: int
    count: int
    istep: int
    taps: tuple[tuple[int, int], ...]

    def valid(self, i0: int, n_in: int, ja: int, jb: int) -> tuple[int, int]:
        return valid_range(i0, self.istep, n_in, ja, jb)


def valid_range(i0: int, step: int, n_in: int, ja: int, jb: int) -> tuple[int, int]:
    """The range of ``j`` in ``[ja, jb)`` (``ja >= 0``) whose input index ``i0 + j * step`` lies in
    ``[0, n_in)``: where a tap meets the input (window arithmetic's one question, asked of outputs
    for a tap, or of taps for an output)."""
    lo = max(ja, -(i0 // step) if i0 < 0 else 0)
    hi = min(jb, (n_in - 1 - i0) // step + 1) if i0 <= n_in - 1 else ja
    return lo, max(lo, hi)


def window_classes(n_in: int, size: int, stride: int, pad_lo: int, lhs_dilation: int, rhs_dilation: int,
                   n_out: int) -> list[WindowClass]:
    """XLA's window arithmetic for one dimension as classes of outputs (see :class:`WindowClass`):
    output ``q`` and tap ``t`` meet position ``q * stride + t * rhs_dilation - pad_lo`` of the
    base-dilated input, a real element when that is a multiple of ``lhs_dilation``."""
    g = math.gcd(stride, lhs_dilation)
    step = lhs_dilation // g
    istep = stride // g
    out = []
    for r in range(min(step, n_out)):
        count = (n_out - r + step - 1) // step
        cls = WindowClass(r, step, count, istep, ())
        taps = []
        for t in range(size):
            v = r * stride + t * rhs_dilation - pad_lo
            if v % lhs_dilation:
                continue
            i0 = v // lhs_dilation
            lo, hi = cls.valid(i0, n_in, 0, count)
            if lo < hi:
                taps.append((t, i0))
        out.append(WindowClass(r, step, count, istep, tuple(taps)))
    return out


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution in the backend's canonical terms: per job (a feature group, or a batch group) an
    input ``[batch, in_channels, in_spatial...]`` and weights ``[out_channels, in_channels, window...]``
    giving ``[batch, out_channels, out_spatial...]``; ``groups`` feature groups (``in_channels`` and
    ``out_channels`` are per group), ``batch_groups`` batch groups (``batch`` is per batch group)."""

    batch: int
    in_channels: int
    out_channels: int
    groups: int
    batch_groups: int
    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    window: tuple  # of nxsat.attrs.WindowDim
    dtype: str  # the type TensorE multiplies in
    itemsize: int
    channels_last_in: bool = False  # the input's channels are its innermost (contiguous) dimension
    channels_last_out: bool = False
    rows_contiguous: bool = True  # the input's and the result's last spatial dimensions are contiguous

    def classes(self) -> list[list[WindowClass]]:
        return [window_classes(n, w.size, w.stride, w.pad_lo, w.lhs_dilation, w.rhs_dilation, q)
                for n, w, q in zip(self.in_spatial, self.window, self.out_spatial)]


@dataclass(frozen=True)
class ConvPlan:
    """How a convolution becomes matmuls (implicit GEMM, the filter stationary).

    - ``pack`` feature groups share one matmul through a block-diagonal stationary (depthwise and
      small groups: the array's rows and columns would otherwise sit idle);
    - the contraction is ``c_tile`` input channels (partitions) times ``fold`` taps of spatial
      dimension ``fold_dim`` stacked on the partitions (``fold`` blocks of ``c_tile`` partitions, each
      holding the input shifted by one tap), so a convolution with few channels still fills the array;
    - ``o_tile`` output channels are the stationary's columns and the result's partitions;
    - ``chunk`` is the block of outputs ``(batch, spatial...)`` one input tile serves and one
      evacuation and one store take out, over every (channel tile, tap) pair: with ``bank_len``, pieces
      of ``bank_len`` along dimension ``bank_dim``, each one PSUM bank of at most ``n_max`` = 512 fp32
      and one matmul per step (up to :data:`PSUM_BANKS` of them; NCHW layouts, channels-last ones keep
      one bank a chunk); without, one bank;
    - ``tap_block`` taps per spatial dimension share one input tile (all of them unless the tile would
      be too large);
    - ``chunk_outer``: loop over output chunks outside the output-channel tiles (inputs loaded once,
      weights once if ``cache_weights``), else output-channel tiles outside (weights loaded once, the
      inputs once per output-channel tile);
    - ``transpose_in``/``transpose_out``: how a channels-last input reaches the channels-on-partitions
      tiles, and a result its channels-last output: ``dma`` (an access pattern: element-sized
      descriptors), ``pe`` (TensorE transposes of 128-position blocks) or ``dma_transpose`` (NeuronCore-v3).
    """

    pack: int
    c_tile: int
    fold_dim: int
    fold: int
    o_tile: int
    chunk: tuple[int, ...]
    tap_block: tuple[int, ...]
    chunk_outer: bool
    cache_weights: bool
    transpose_in: str
    transpose_out: str
    bank_dim: int = 0
    bank_len: int = 0

    @property
    def piece(self) -> tuple[int, ...]:
        """The outputs one matmul (one PSUM bank) accumulates."""
        if not self.bank_len:
            return self.chunk
        return tuple(self.bank_len if k == self.bank_dim else c for k, c in enumerate(self.chunk))

    def matmuls(self, geo: ConvGeometry) -> int:
        """Matmul instructions the plan emits (taps that only meet padding are skipped)."""
        groups = geo.groups * geo.batch_groups
        jobs = -(-groups // self.pack)
        c_tiles = -(-(geo.in_channels * self.pack) // self.c_tile)
        o_tiles = -(-(geo.out_channels * self.pack) // self.o_tile)
        total = 0
        classes = geo.classes()
        for combo in _product([range(len(c)) for c in classes]):
            counts = [1] * (len(classes) + 1)
            counts[0] = geo.batch
            taps = 1
            for d, k in enumerate(combo):
                cls = classes[d][k]
                counts[d + 1] = cls.count
                n = len(cls.taps)
                taps *= -(-n // self.fold) if d == self.fold_dim else n
            pieces = math.prod(-(-n // c) for n, c in zip(counts, self.piece))
            total += pieces * taps
        return jobs * c_tiles * o_tiles * total

    def weight_group(self, geo: ConvGeometry, raw_itemsize: int) -> int:
        """Output-channel tiles whose weights one DMA loads for an input-channel tile (rows of all their
        output channels, sliced into tiles on chip): an HWIO weight's rows are then up to ``O`` elements
        long, not 128 (ResNet-50's fp32 taps moved in 512-byte runs, a third of its DMA engines' time).
        Only where loaded weights are kept for the job (``chunk_outer`` and ``cache_weights``), and as many
        tiles as keep the input-channel tiles' loads within :data:`WEIGHT_BUDGET` in the weights' own type;
        1 is a load per output-channel tile."""
        if self.pack > 1 or self.fold > 1 or not (self.chunk_outer and self.cache_weights):
            return 1
        o_tiles = -(-geo.out_channels // self.o_tile)
        per_tile = -(-geo.in_channels // self.c_tile) * math.prod(w.size for w in geo.window) * self.o_tile \
            * raw_itemsize
        return max(1, min(o_tiles, WEIGHT_BUDGET // max(1, per_tile)))


def _product(ranges: list) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [o + (k,) for o in out for k in r]
    return out


# --- softmax (backend/fused.py) ---------------------------------------------------------------------

SOFTMAX_TILE = 16 * 1024  # bytes per partition of a tile's fp32 exponentials
SOFTMAX_TILES = 4  # tiles a softmax is cut into at least, when it has the rows: loads overlap compute
SOFTMAX_MAX_ROW = 8192  # elements of a row one partition holds (the transformer rule's guard says the same)


HOSTED_ROW_BYTES = 16 * 1024  # bytes per partition of fp32 scores a dot keeps on chip for a softmax's rows


def hosts_rows(plan: MatmulPlan, N: int) -> bool:
    """A dot of this plan can compute a softmax over rows of its ``N`` columns on its own tiles: one tile
    holds them, or the tiles of an M tile's rows come one after another (one block of N tiles) and their
    fp32 scores fit :data:`HOSTED_ROW_BYTES` per partition."""
    if N <= plan.n_tile:
        return True
    return (plan.n_block == 0 or plan.n_block * plan.n_tile >= N) and 4 * N <= HOSTED_ROW_BYTES


BN_STATS_MAX = 512  # elements one bn_stats reads per partition (nki.isa.bn_stats)
LAYER_NORM_MAX_ROW = 64 * BN_STATS_MAX  # one bn_aggr merges the groups of a row (the rule's guard is looser)


GROUP_NORM_RESIDENT = 96 * 1024  # bytes per partition of one batch's (fp32-sized) tiles a group norm keeps


def layer_norm_rows(L: int, R: int, partitions: int) -> int:
    """Rows per partition of one layer-norm (RMS norm, group norm) tile: one, the dots' own row tiling (a
    dot's result has one row a partition, and so has the operand it loads), so that the forwarding pass
    reads the norm's input from the tiles the dot before it stored and the next dot reads its result from
    SBUF. Its instructions are per row whatever the tiling (bn_stats, bn_aggr, the scaling pass); more rows
    a partition only saved two small instructions and a DMA per tile, and made every neighbour's tiles
    other rows: gpt2_extract's layer norm between two dense layers had both sides go through HBM (29.1 MB
    of spill; 299.3 -> 277.9 us under transformer with one row a partition, 9.8 MB left)."""
    return 1


def softmax_rows(L: int, R: int, partitions: int) -> int:
    """Rows per partition of one softmax tile (``[P, k, L]``) for ``R`` rows of ``L`` elements."""
    by_budget = max(1, SOFTMAX_TILE // (4 * L))
    return max(1, min(by_budget, R // (partitions * SOFTMAX_TILES)))


TILE_BUDGET = 32 * 1024  # bytes per partition of one input tile (room to double-buffer)
PSUM_BANKS = 4  # PSUM banks one block of outputs fills: one input tile, evacuation and store serve them all
WEIGHT_BUDGET = 96 * 1024  # bytes per partition of the weights kept on chip for one output-channel tile


def chunk_of(extents: tuple[int, ...], limit: int, max_dims: int = 4) -> tuple[int, ...]:
    """The output block: whole inner dimensions while they fit ``limit`` elements, then a balanced part
    of the next one; at most ``max_dims`` dimensions larger than 1 (an engine access's free dimensions)."""
    sizes = [1] * len(extents)
    prod = 1
    used = 0
    for k in reversed(range(len(extents))):
        n = extents[k]
        if n == 1:
            continue
        if used == max_dims:
            break
        if prod * n <= limit:
            sizes[k] = n
            prod *= n
            used += 1
            continue
        m = limit // prod
        if m > 1:
            parts = -(-n // m)
            sizes[k] = -(-n // parts)
        break
    return tuple(sizes)


def _span(cls: WindowClass, count: int, taps: int) -> int:
    """Input elements one tile spans along a dimension: ``count`` outputs, ``taps`` consecutive taps."""
    offs = sorted(i0 for _, i0 in cls.taps)
    if not offs:
        return 1
    reach = max(offs[k + taps - 1] - offs[k] for k in range(len(offs) - taps + 1)) if taps <= len(offs) \
        else offs[-1] - offs[0]
    return (count - 1) * cls.istep + reach + 1


def forwarded_input(geo: ConvGeometry, plan: ConvPlan) -> bool:
    """Are the input tiles of a convolution of another operator's result read on chip? A channels-first
    input is loaded as boxes of whole rows per channel tile (per fold block: the box shifted by its tap,
    on partitions from ``b * c_tile``), which the forwarding pass (backend/forward.py) reads from the
    tiles that stored them, a GpSimd copy each where the engines may start on those partitions (multiples
    of 32); a channels-last input's blocks of positions, transposed on TensorE, are not what its producer
    stored. Measured on ResNet-50 (trn1, -O2, bf16): priced as DMAs, the bottleneck
    3x3 convolutions took channels-last inputs, each stored by the 1x1 convolution before it and
    loaded back (888.9 us); read on chip, 801.9 us."""
    return not geo.channels_last_in and (plan.fold == 1 or plan.c_tile % 32 == 0) and plan.pack == 1 \
        and geo.batch_groups == 1


def conv_plan(geo: ConvGeometry, target: Target) -> ConvPlan:
    """Pick the tiles (see :class:`ConvPlan`): pack groups when a group is small, fold taps into the
    partitions when the channels are few, fill one PSUM bank, and keep the input tile within
    :data:`TILE_BUDGET` by shrinking the chunk and then the taps per tile."""
    rows, cols = target.matmul["rows"], target.matmul["cols"]
    n_max = min(target.matmul["max_moving"], target.psum_bank_bytes // 4)
    groups = geo.groups
    pack = 1
    if groups > 1 and geo.batch_groups == 1:
        pack = max(1, min(groups, rows // geo.in_channels, cols // geo.out_channels))
    c_all = geo.in_channels * pack
    c_tile = min(c_all, rows)
    o_tile = min(geo.out_channels * pack, cols)
    classes = geo.classes()
    nsp = len(geo.in_spatial)
    ntaps = [max((len(c.taps) for c in cl), default=0) for cl in classes]
    fold_dim, fold = 0, 1
    if pack == 1 and c_tile < rows and nsp:
        # the dimension with the most taps (the outermost among equals) gives the most
        best = max(range(nsp), key=lambda d: (ntaps[d], -d))
        f = min(ntaps[best], rows // c_tile)
        if f > 1:
            fold_dim, fold = best, f
    extents = (geo.batch, *(max((c.count for c in cl), default=1) for cl in classes))
    chunk: list[int] = []
    tap_block: list[int] = []

    def tile_bytes() -> int:
        elems = chunk[0]
        for d in range(nsp):
            cls = max(classes[d], key=lambda c: len(c.taps)) if classes[d] else None
            if cls is None:
                continue
            if d == fold_dim and fold > 1:
                elems *= chunk[d + 1]
            else:
                elems *= _span(cls, chunk[d + 1], tap_block[d])
        return elems * geo.itemsize

    def fit(limit: int) -> None:
        chunk[:] = chunk_of(extents, limit)
        tap_block[:] = [fold if d == fold_dim and fold > 1 else max(1, ntaps[d]) for d in range(nsp)]
        while tile_bytes() > TILE_BUDGET:
            # shrink the outermost chunk dimension larger than 1, then the taps per tile
            k = next((k for k in range(len(chunk)) if chunk[k] > 1), None)
            if k is not None:
                chunk[k] = max(1, chunk[k] // 2)
                continue
            d = next((d for d in range(nsp) if tap_block[d] > 1 and not (d == fold_dim and fold > 1)), None)
            if d is None:
                break
            tap_block[d] = max(1, tap_block[d] // 2)

    fit(n_max)
    bank_dim, bank_len = 0, 0
    cut = next((k for k in range(len(chunk)) if chunk[k] < extents[k]), None)
    if not (geo.channels_last_in or geo.channels_last_out) and cut is not None and all(
            c == 1 for c in chunk[:cut]):
        # several banks a chunk, cut along the dimension the bank's chunk cuts: as many as the input tile allows
        one = list(chunk)
        for p in range(PSUM_BANKS, 1, -1):
            chunk[cut] = min(extents[cut], one[cut] * p)
            if chunk[cut] > one[cut] and tile_bytes() <= TILE_BUDGET:
                bank_dim, bank_len = cut, one[cut]
                break
            chunk[:] = one
    chunk_t = tuple(chunk)
    o_tiles = -(-(geo.out_channels * pack) // o_tile)
    c_tiles = -(-c_all // c_tile)
    chunks = sum(math.prod(-(-n // c) for n, c in zip((geo.batch, *(cl.count for cl in combo)), chunk_t))
                 for combo in _product(classes))
    # the weights of one output-channel tile, bytes per partition (every kernel tap is loaded)
    ksize = [w.size for w in geo.window]
    if pack > 1:
        weight_bytes = math.prod(ksize) * (geo.out_channels + o_tile) * geo.itemsize
    elif fold > 1:
        weight_bytes = c_tiles * -(-ksize[fold_dim] // fold) * math.prod(ksize) // ksize[fold_dim] * o_tile \
            * geo.itemsize
    else:
        weight_bytes = c_tiles * math.prod(ksize) * o_tile * geo.itemsize
    in_bytes = tile_bytes() * c_tiles
    if chunks == 1 or weight_bytes * o_tiles <= WEIGHT_BUDGET:
        chunk_outer, cache_weights = True, True  # everything is loaded once
    else:
        # output-channel tiles outside: each input tile once per output-channel tile; chunks outside:
        # the weights once per chunk
        chunk_outer = in_bytes * chunks * o_tiles + weight_bytes * o_tiles > in_bytes * chunks + \
            weight_bytes * o_tiles * chunks
        cache_weights = not chunk_outer and weight_bytes <= WEIGHT_BUDGET
    two_byte = geo.itemsize in (2, 4) and geo.dtype in ("f32", "bf16", "f16")
    v3 = bool(target.dma.get("transpose_efficiency"))
    t_in = "dma"
    if geo.channels_last_in and two_byte:
        t_in = "dma_transpose" if v3 else "pe"
    t_out = "pe" if geo.channels_last_out and geo.out_channels * pack > 1 else "dma"
    return ConvPlan(pack, c_tile, fold_dim, fold, o_tile, chunk_t, tuple(tap_block), chunk_outer, cache_weights,
                    t_in, t_out, bank_dim, bank_len)


PE_BLOCK = 128  # positions per TensorE transpose of a channels-last input or result
ROW_LOAD_BYTES = 32  # a channel vector this short loads as image rows, transposed on TensorE (rows_fit)


def rows_fit(ck: int, rows: int, width: int, itemsize: int, target: Target, is_float: bool = True) -> bool:
    """Are ``rows`` image rows of ``width`` positions of ``ck`` channels loaded whole and transposed on
    TensorE, a channel at a time, into positions on the partitions (backend/conv.py ``_load_positions``)
    rather than one DMA descriptor per channel vector (6 bytes of a 3-channel bf16 image)? When the
    vectors are short, the rows fit the array and their transposes one PSUM bank."""
    return ck * itemsize < ROW_LOAD_BYTES and rows <= target.matmul["rows"] and width <= target.matmul["cols"] \
        and is_float and itemsize in (2, 4) and ck * rows * 4 <= target.psum_bank_bytes


# weights whose [I, K..., O] load moves runs this short (PyTorch's OIHW: one element) load output channel by
# output channel and are transposed on TensorE (weights_by_rows)
WEIGHT_RUN_BYTES = 64


def weights_by_rows(plan: ConvPlan, is_float: bool, run_bytes: int, row_run: int, row: int) -> bool:
    """Are a convolution's weights loaded as ``[O, I * K]`` rows and each tap's block transposed on TensorE
    (backend/conv.py ``_weights_transposed``) rather than by a DMA into ``[I, K..., O]`` whose descriptors
    move ``run_bytes`` each? When those runs are short and each output channel's ``row`` elements lie
    together (``row_run``: the rows' contiguous run), for floats (TensorE transposes them), in a plan of
    plain tap tiles (not folded, not packed) that keeps the weights across its chunks (``cache_weights``:
    reloaded for every chunk, the transposes and their copies would be made again each time, as in
    mobilenet_v2's training step)."""
    return plan.fold == 1 and plan.pack == 1 and plan.cache_weights and is_float \
        and run_bytes < WEIGHT_RUN_BYTES and row_run >= row


def fold_homes(plan: ConvPlan, per_dim: list[list[list[int]]], isteps: list[int]) -> list[tuple[int, int]]:
    """Per tap group of one output block (``itertools.product(*per_dim)`` order; ``per_dim[d]`` the tap
    groups of dimension ``d`` as the taps' input offsets): the group whose input tile it reads and by how
    many outputs its taps move along the fold dimension there. A folded tile's block ``b`` holds the input
    shifted by tap ``b``; a later fold group whose every block is the first group's block moved by one
    whole number of outputs reads that tile, grown by as many rows, instead of a tile of its own (a 3x3
    convolution of 64 channels folds taps 0 and 1; tap 2 is block 0 two rows on: ResNet-50's stage 1 copied
    each input row into three places, now two). Only for the tiles loaded directly, block by block (a
    channels-last input's fold is made by transposes of sliding windows)."""
    groups = list(_product([range(len(g)) for g in per_dim]))
    out = [(k, 0) for k in range(len(groups))]
    fd = plan.fold_dim
    if plan.fold < 2 or plan.transpose_in != "dma" or fd >= len(per_dim):
        return out
    index = {g: k for k, g in enumerate(groups)}
    first = per_dim[fd][0]
    for k, g in enumerate(groups):
        later = per_dim[fd][g[fd]]
        moves = {q - p for p, q in zip(first, later)}  # a later group has no more taps than the first
        if g[fd] == 0 or len(moves) != 1:
            continue
        move = moves.pop()
        if move > 0 and move % isteps[fd] == 0:
            out[k] = (index[(*g[:fd], 0, *g[fd + 1:])], move // isteps[fd])
    return out


def fold_growth(homes: list[tuple[int, int]]) -> dict[int, int]:
    """The rows each home tile of :func:`fold_homes` grows by: its readers' largest move."""
    grow: dict[int, int] = {}
    for home, move in homes:
        grow[home] = max(grow.get(home, 0), move)
    return grow


DMA_T_BLOCK = 2048  # positions per DMA transpose (NeuronCore-v3)


def out_block(positions: int) -> int:
    """Positions per TensorE transpose of a channels-last result's block of ``positions``: a divisor
    between 64 and :data:`PE_BLOCK` when there is one (whole blocks), else up to :data:`PE_BLOCK`."""
    return max((b for b in range(64, PE_BLOCK + 1) if positions % b == 0), default=min(positions, PE_BLOCK))


DEPTHWISE_TILE = 16 * 1024  # bytes per partition of one fp32 accumulator (and of each of its two product tiles)


@dataclass(frozen=True)
class PlaneTiling:
    """Depthwise work on the vector engines, where each channel's planes are independent: the channels in
    chunks, and on the partitions ``stack(cn)`` groups of one chunk's ``cn`` channels (partition
    ``j * cn + c`` holds channel ``c0 + c`` of ``batch`` consecutive batch elements, the ``j``-th group of
    them), so every lane works however few the channels; per partition, ``batch`` planes of ``block``
    rows of the outermost spatial dimension (all of the others) in the free axes. Every partition of a
    chunk always holds the same channel: its weights load once, and sums over the batch add up tile by
    tile."""

    chunk: int
    batch: int
    block: int
    partitions: int

    def chunks(self, channels: int) -> list[tuple[int, int]]:
        return [(c0, min(self.chunk, channels - c0)) for c0 in range(0, channels, self.chunk)]

    def stack(self, cn: int, batch: int) -> int:
        return max(1, min(self.partitions // cn, batch // self.batch))

    def tiles(self, channels: int, batch: int, rows: int) -> int:
        per = -(-rows // self.block)
        return sum(-(-batch // (self.stack(cn, batch) * self.batch)) * per for _, cn in self.chunks(channels))


def plane_tiling(batch: int, channels: int, rows: int, row_bytes: int, partitions: int) -> PlaneTiling | None:
    """The fewest tiles: whole planes and as many batch elements a partition as fit :data:`DEPTHWISE_TILE`
    (a divisor of the batch, so every group is full), else one plane in balanced blocks of rows; the
    channel chunk that leaves the fewest tiles (96 channels: three chunks of 32, stacked four deep).
    ``row_bytes``: bytes per partition of one row of one plane (the largest tile's). None when one row
    is already too large."""
    most = DEPTHWISE_TILE // row_bytes
    if most < 1:
        return None
    if most >= rows:
        m = max(k for k in range(1, batch + 1) if batch % k == 0 and k * rows <= most)
        block = rows
    else:
        m = 1
        block = -(-rows // -(-rows // most))  # balanced: 56 + 56 rows, not 54 + 54 + 4
    best: PlaneTiling | None = None
    fewest = -(-channels // partitions)
    for k in range(fewest, max(fewest, min(channels, 64)) + 1):
        t = PlaneTiling(-(-channels // k), m, block, partitions)
        if best is None or t.tiles(channels, batch, rows) < best.tiles(channels, batch, rows):
            best = t
    return best


@dataclass(frozen=True)
class DepthwisePlan:
    """A depthwise convolution (one input and one output channel per group) on the vector engines
    instead of TensorE, tiled by ``tiling``. Per tile each tap is one ScalarE activation (the input
    window times its channel's weight, a per-partition scale) and one add into an fp32 accumulator, the
    adds alternating between VectorE and GpSimd by tile. ``vector_ns`` and ``tensor_ns`` are the
    busiest engine's time each way: the plan pays when the first is smaller."""

    tiling: PlaneTiling
    vector_ns: float
    tensor_ns: float

    @property
    def pays(self) -> bool:
        return self.vector_ns < self.tensor_ns


# what the instructions of a depthwise tile look like to the cost formulas (sim/isa.py's cost_vars):
# fp32 products and sums in SBUF, inputs read through strided windows
_VECTOR_VARS = {"psum_in": 0, "all_sbuf": 1, "lowp": 0, "contig": 0, "fp32": 1, "fast": 0, "accum": 0}
ADD_ENGINES = ("dve", "pool")  # a depthwise tile's adds run on one of these, in turn by tile


def depthwise_plan(geo: ConvGeometry, plan: ConvPlan, target: Target) -> DepthwisePlan | None:
    """The vector-engine plan of a depthwise convolution (None for any other convolution), priced
    against TensorE's matmuls under the target's cost formulas (``plan``: the implicit GEMM it replaces).
    TensorE packs depthwise channels block-diagonally, so it uses as many rows of its array as there
    are channels (at most 128) and, for fp32, runs at a quarter rate; the vector engines use every lane
    (:class:`PlaneTiling`). Windows with base dilation (transposed convolutions), and layouts whose
    rows are not contiguous, stay on TensorE."""
    if not (geo.groups > 1 and geo.in_channels == 1 and geo.out_channels == 1 and geo.batch_groups == 1):
        return None
    if not geo.out_spatial or any(w.lhs_dilation != 1 for w in geo.window) or geo.dtype not in ("f32", "bf16", "f16"):
        return None
    if not geo.rows_contiguous:
        return None  # planes would move element by element (a channels-last layout)
    inner_out = math.prod(geo.out_spatial[1:])
    inner_in = math.prod(geo.in_spatial[1:]) * geo.window[0].stride
    tiling = plane_tiling(geo.batch, geo.groups, geo.out_spatial[0], 4 * max(inner_out, inner_in), target.partitions)
    if tiling is None:
        return None
    taps = math.prod(w.size for w in geo.window)
    elems = tiling.batch * tiling.block * inner_out
    tiles = tiling.tiles(geo.groups, geo.batch, geo.out_spatial[0])
    P = target.partitions
    busy = [tiles * taps * op_ns(target, "activation", "act", N=elems, P=P, **_VECTOR_VARS)]  # the products
    for k, e in enumerate(ADD_ENGINES):  # each tile's adds on one engine
        busy.append(len(range(k, tiles, 2)) * (taps - 1) * op_ns(target, "tensor_tensor", e, N=elems, P=P,
                                                                 **_VECTOR_VARS))
    factor = target.matmul_dtype_factor(geo.dtype) or 1.0
    tensor = plan.matmuls(geo) * op_ns(target, "matmul", "pe", M=plan.o_tile, N=math.prod(plan.piece),
                                       K=plan.c_tile, P=plan.c_tile, dtype_factor=factor)
    return DepthwisePlan(tiling, max(busy), tensor)


def _gradient_row_bytes(in_spatial: tuple[int, ...], kernel_spatial: tuple[int, ...], window: tuple) -> int:
    """Bytes per partition a kernel row of a depthwise gradient tile costs: its products, and the input
    rows it reads, at twice fp32's size (input, kernel and two products are live at once, and the
    next tile's loads beside them: each within half of :data:`DEPTHWISE_TILE`)."""
    inner_k = math.prod(kernel_spatial[1:])
    inner_x = math.prod(in_spatial[1:]) * window[0].rhs_dilation
    return 8 * max(inner_k, inner_x)


def depthwise_gradient_fits(in_spatial: tuple[int, ...], kernel_spatial: tuple[int, ...], window: tuple) -> bool:
    """Does one kernel row fit a tile (:func:`depthwise_gradient_tiling` is not None)?"""
    return _gradient_row_bytes(in_spatial, kernel_spatial, window) <= DEPTHWISE_TILE


def depthwise_gradient_tiling(batch: int, channels: int, in_spatial: tuple[int, ...], kernel_spatial: tuple[int, ...],
                              window: tuple, partitions: int) -> PlaneTiling | None:
    """The tiles of a depthwise layer's weight gradient on the vector engines: :class:`PlaneTiling`
    over the kernel's rows."""
    return plane_tiling(batch, channels, kernel_spatial[0], _gradient_row_bytes(in_spatial, kernel_spatial, window),
                        partitions)


def gradient_stacking_pays(positions: int, rows: int, grad_rows: int, k: int, input_elems: int) -> bool:
    """Is a weight gradient cheaper as one dot over its kernel positions' windows stacked (an im2col:
    the input padded once, ``positions`` windows of ``rows x k`` copied side by side, the output
    gradient's ``grad_rows x k`` read once) than as one dot per position (the output gradient read,
    and on NeuronCore-v2 transposed, once per position)? Priced in HBM elements moved, which for
    these contractions (K in the millions, a few dozen rows) also counts their TensorE transposes."""
    per_position = positions * (rows * k + grad_rows * k)
    stacked = 3 * input_elems + 3 * positions * rows * k + grad_rows * k  # pad, copy in and read, gradient once
    return positions > 1 and stacked < per_position


# --- windows (reduce-window, select-and-scatter) -------------------------------------------------

@dataclass(frozen=True)
class WindowPlan:
    """How a windowed reduction is tiled on VectorE/GpSimd: dimension ``part`` on the partitions (one
    output index per partition; a windowed dimension brings each partition its own input rows, the
    window's taps along it becoming a free axis), every other dimension in the free axes; ``chunk``
    outputs per dimension per tile (along ``part``: at most the partitions). ``part`` is None when
    every dimension stays in the free axes (one partition)."""

    part: int | None
    chunk: tuple[int, ...]

    def tiles(self, out_shape: tuple[int, ...]) -> int:
        return math.prod(-(-n // c) for n, c in zip(out_shape, self.chunk)) if out_shape else 1


WINDOW_TILE_BUDGET = 32 * 1024  # bytes per partition of one input tile
# outputs per partition of one tile: ResNet-50's max pooling in four blocks, packed two by two, so the first
# pack runs while the stem still computes the rows of the second (2,048: two blocks, one pack after the stem;
# generic 706.1 -> 688.4 us)
WINDOW_FREE = 1024


def trivial_window(w) -> bool:  # noqa: ANN001 - a WindowDim
    """A dimension the window leaves alone (every output is its input element)."""
    return (w.size == 1 and w.stride == 1 and w.pad_lo == 0 and w.pad_hi == 0 and w.lhs_dilation == 1
            and w.rhs_dilation == 1)


def window_plan(shape: tuple[int, ...], window: tuple, out_shape: tuple[int, ...], itemsize: int,
                innermost: int | None, target: Target, trivial_part: bool = False) -> WindowPlan:
    """Choose the partition dimension (the most outputs, up to the partitions; a dimension the window
    leaves alone first, and not the input's contiguous one, which keeps DMA rows long) and the chunk
    (whole inner dimensions up to :data:`WINDOW_FREE` outputs, halved until the input tile fits
    :data:`WINDOW_TILE_BUDGET`). ``trivial_part``: only a dimension the window leaves alone may be on
    the partitions (select-and-scatter: partitions must not share input elements)."""
    parts = target.partitions
    r = len(shape)
    classes = [window_classes(n, w.size, w.stride, w.pad_lo, w.lhs_dilation, w.rhs_dilation, q)
               for n, w, q in zip(shape, window, out_shape)]
    extent = [max((c.count for c in cl), default=0) for cl in classes]
    cands = [k for k in range(r) if extent[k] > 1 and k != innermost
             and (not trivial_part or trivial_window(window[k]))]
    if not cands:  # the contiguous dimension, rather than one partition
        cands = [k for k in range(r) if extent[k] > 1 and (not trivial_part or trivial_window(window[k]))]
    part = max(cands, key=lambda k: (min(extent[k], parts), trivial_window(window[k]), -k)) if cands else None
    others = [k for k in range(r) if k != part]
    chunk = [1] * r
    if part is not None:
        chunk[part] = min(extent[part], parts)
    sub = chunk_of(tuple(extent[k] for k in others), WINDOW_FREE, 3)
    for k, c in zip(others, sub):
        chunk[k] = max(1, c)

    def tile_bytes() -> int:
        elems = 1
        for k in range(r):
            cl = max(classes[k], key=lambda c: len(c.taps)) if classes[k] else None
            if cl is None:
                continue
            if k == part:
                elems *= max(1, len(cl.taps))
            else:
                elems *= _span(cl, chunk[k], max(1, len(cl.taps)))
        return elems * itemsize

    while tile_bytes() > WINDOW_TILE_BUDGET:
        k = next((k for k in others if chunk[k] > 1), None)
        if k is None:
            break
        chunk[k] = max(1, chunk[k] // 2)
    return WindowPlan(part, tuple(chunk))

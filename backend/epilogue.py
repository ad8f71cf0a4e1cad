"""Epilogues: the elementwise cluster that reads an operator's result, computed on the result's tiles as
they leave PSUM instead of after a round trip through HBM.

A dot's result tile is evacuated from PSUM into SBUF and stored; the cluster that reads it (a bias add,
an activation, a residual add, a cast: BERT's ``dense -> + bias -> gelu``) would load it back, tile by
tile, and store its own results. When the cluster has the dot's shape and every other value it reads is
computed before the dot (lowering defers a dot until something reads it, ``lower.hosts``, so a bias
reshaped and broadcast after it in post-order is), :func:`epilogue` makes the dot run the cluster on each
evacuated tile: the cluster's other inputs are loaded in the tile's place of the result (once per
distinct access: a bias repeated along M is loaded once per N tile), its members emitted as
:mod:`nxsat.backend.elementwise` emits them, and only the values something else reads are stored (the
dot's own result too, when something outside the cluster reads it). A convolution does the same on its
three store paths. A reduction uses the same machinery the other way round (:func:`prologue`): it
computes the cluster that makes its source on its own tiles instead of loading the source back. The
cost model already prices an operator's elementwise readers as fused with it (extract/cost.py
``elementwise_ns``: no load of a computed operand of the same shape); this makes the backend do what
it priced.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from nxsat import dtypes as dt
from nxsat.backend.affine import AffinePredicate, affine_predicate, tile_params, virtual, whole_tile
from nxsat.backend.elementwise import ACTIVATION, Cluster, Kernel, Share, folded, pass_plan
from nxsat.backend.graph import Graph, Ref
from nxsat.backend.lower import Lowering, _origin, device_dtype, onchip_dtype
from nxsat.backend.tiles import Operand, Tiles, is_num
from nxsat.ir import Node
from nxsat.sim.program import AccessError


def _finish(steps: Generator[None, None, dict[int, Operand]]) -> dict[int, Operand]:
    """Run :meth:`Epilogue.steps` to its end: its members' values."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


@dataclass
class Epilogue:
    """Where the tiles of an operator's result go: stored to ``out`` (when anything but the cluster reads
    the result) and, with a ``cluster``, through its members. Values of the result's shape are held
    as seen in the operator's ``frame`` (a dot's ``[B, M, N]``, a convolution's ``[N, C, spatial...]``);
    a tile's place is a view of that."""

    lw: Lowering
    node: Node
    frame: Callable[[Ref], Ref]
    out: Ref | None = None
    cluster: Cluster | None = None
    inputs: dict[int, Operand] = field(default_factory=dict)  # operand id -> framed view, or a number
    stores: dict[int, Ref] = field(default_factory=dict)  # member id -> framed view of its result
    affine: dict[int, AffinePredicate] = field(default_factory=dict)  # input id -> the mask it is (backend/affine.py)
    _loaded: dict[tuple, Ref] = field(default_factory=dict)  # distinct accesses -> the tile holding them
    _share: tuple[dict[int, tuple[Node, float, float]], Share] | None = None  # the cluster's folds and engine split
    _work: list[int] = field(default_factory=lambda: [0, 0])  # passes over tiles so far: ScalarE, VectorE

    def split(self) -> tuple[dict[int, tuple[Node, float, float]], Share]:
        """The cluster's products folded into activations and its ScalarE share (backend/elementwise.py)."""
        if self._share is None:
            assert self.cluster is not None
            self._share = pass_plan(self.lw, self.cluster.members, set(self.stores))
        return self._share

    def evacuate_on_act(self, copy: bool = True) -> bool:
        """Which engine copies the producer's next PSUM tile out: the one with less of the epilogue's work
        so far (ScalarE first; without a cluster they take turns). A dot whose epilogue is GELU's chain
        and a bias gave VectorE 400 us of 658 while ScalarE idled: every copy goes to ScalarE.
        ``copy=False``: the tile is not copied (:meth:`reads_psum`); its work is counted."""
        share = self.split()[1] if self.cluster is not None else Share(frozenset(), 0, 0)
        act, dve = share.act, share.dve
        on_act = self._work[0] + act <= self._work[1] + dve
        self._work[0] += act + (copy and on_act)
        self._work[1] += dve + (copy and not on_act)
        return on_act

    def reads_psum(self, res_type: dt.DType) -> bool:
        """Can the cluster read the producer's fp32 PSUM tile itself, with no copy into SBUF first? When
        the result is needed only by the cluster, in fp32, and by one member that reads it once, as a
        VectorE or ScalarE operand (a bias add: VectorE reads PSUM at its fast rate, and the copy's
        pass over the tile is saved)."""
        cl = self.cluster
        if cl is None or self.out is not None or res_type is not dt.F32:
            return False
        readers = [m for m in cl.members if any(o.id == self.node.id for o in m.operands)]
        return len(readers) == 1 and sum(o.id == self.node.id for o in readers[0].operands) == 1 and \
            readers[0].op in PSUM_READERS

    def skips(self, place: Callable[[Ref], Ref], at: tuple[int, ...], shape: tuple[int, int]) -> bool:
        """May the producer leave out the result tile at ``place`` (``at``, of ``shape``), handing it to
        :meth:`skip` instead of computing it? Only a softmax a dot hosts says so (backend/fused.py)."""
        return False

    def skip(self, place: Callable[[Ref], Ref], at: tuple[int, ...], shape: tuple[int, int]) -> None:
        raise AssertionError(f"{type(self).__name__} skips no tile")

    def tile(self, place: Callable[[Ref], Ref], res: Ref, at: tuple[int, ...] = ()) -> dict[int, Operand]:
        """``res`` is an evacuated tile of the result (``[partitions, *free]``), in its type, at
        ``place(framed value)`` (``at``: its first index there, when the producer says: a dot's
        ``(b, m0, n0)``); the cluster's values on it (empty without a cluster)."""
        if self.out is not None:
            self.lw.graph.add("dma", "dma", place(self.out), res)
        return self.compute(place, res.shape, res) if self.cluster is not None else {}

    def flush(self) -> None:
        """Emit what the epilogue held back for a later tile (the producer calls it after its last tile)."""

    def compute(self, place: Callable[[Ref], Ref], shape: tuple[int, ...], res: Ref | None = None
                ) -> dict[int, Operand]:
        """The cluster on the tile of ``shape`` at ``place`` (``res``: the producer's value there), its
        values needed elsewhere stored; every member's value, on 2-D ``[partitions, free]`` tiles."""
        return _finish(self.steps(place, shape, res))

    def pipelined(self, tiles: list[tuple[Callable[[Ref], Ref], Ref]]) -> None:
        """The cluster on several tiles of the result (``(place, res)`` each, in PSUM: :meth:`reads_psum`),
        each tile's first instruction emitted before the previous tile's other steps. Each engine runs its
        instructions in order: tile by tile, ScalarE's batch norm of the next bank waited behind this bank's
        ReLU, which waited for VectorE's residual add (ResNet-50's stage 2: 1.8 us a bank, the engines
        taking turns)."""
        prev = None
        for place, res in tiles:
            cur = self.steps(place, res.shape, res)
            next(cur, None)
            if prev is not None:
                _finish(prev)
            prev = cur
        if prev is not None:
            _finish(prev)

    def steps(self, place: Callable[[Ref], Ref], shape: tuple[int, ...], res: Ref | None = None
              ) -> Generator[None, None, dict[int, Operand]]:
        """:meth:`compute`, pausing once after its first instruction (:meth:`pipelined`)."""
        lw, g = self.lw, self.lw.graph
        cl = self.cluster
        assert cl is not None
        flat = (shape[0], math.prod(shape[1:]))  # the members run on 2-D tiles, as a fused pass's do
        folds, share = self.split()
        k = Kernel(lw, Tiles(g, flat, "ep"), cl.shape, share=share)
        val: dict[int, Operand] = {} if res is None else {self.node.id: _flat(res, flat)}
        for oid, src in self.inputs.items():
            if oid not in self.affine:  # a mask of the position: loaded only if no affine_select applies it
                val[oid] = src if is_num(src) else self._load(oid, place, flat)
        paused = False
        for m in cl.members:
            g.origin = _origin(m)
            masked = self._affine_select(m, val, place, shape, k.t) if m.op == "select" else None
            if masked is not None:
                val[m.id] = masked
                continue
            for o in m.operands:
                if o.id not in val:
                    val[o.id] = self._load(o.id, place, flat)
            before = len(g.insts)
            val[m.id] = folded(k, m, val, folds)
            if not paused and len(g.insts) > before:
                paused = True
                yield
                g.origin = _origin(m)
        for mid, dst in self.stores.items():
            v = val[mid]
            if is_num(v):
                m = next(x for x in cl.members if x.id == mid)
                v = k.t.memset(v, onchip_dtype(device_dtype(m.dtype)))
            assert isinstance(v, Ref)
            g.add("dma", "dma", place(dst), v if len(shape) == 2 else v.reshape(*shape))
        g.origin = _origin(self.node)
        return val

    def _affine_select(self, m: Node, val: dict[int, Operand], place: Callable[[Ref], Ref], shape: tuple[int, ...],
                       t: Tiles) -> Ref | None:
        """``select(mask, x, fill)`` whose mask is an affine predicate of the position (a causal mask): one
        GpSimd ``affine_select`` on this tile, the mask never loaded; None when it does not apply (the
        mask is not such a predicate, ``x`` is not a tile of the result's type, ``fill`` not a number, or
        the tile's place is not affine in the mask's dimensions)."""
        p, x, f = m.operands
        pred = self.affine.get(p.id)
        src, fill = val.get(x.id), val.get(f.id)
        out_t = onchip_dtype(device_dtype(m.dtype))
        if pred is None or not isinstance(src, Ref) or src.dtype is not out_t or not is_num(fill):
            return None
        params = tile_params(pred, place(self.frame(virtual(p))))
        if params is None:
            return None
        base, cm, steps = params
        shaped = (lambda r: r) if len(shape) == 2 else (lambda r: r.reshape(*shape))
        if whole_tile(pred.cmp, base, cm, steps, shaped(src).shape):
            # kept whole, no instruction: a causal mask's tiles below the diagonal (attention_s2048: 24 of
            # its 64 score tiles, 769.5 -> 697.9 us). One above it (all fill) is still selected: a memset
            # in its place, which need not wait for the scores, measured slower (707.3 us)
            return src
        out = t.tile(out_t)
        self.lw.graph.add("pool", "affine_select", shaped(out), shaped(src), base=base, channel_multiplier=cm,
                          steps=steps, cmp=pred.cmp, fill=float(fill))
        return out

    def _ones(self, n: int) -> Ref:
        """A ``[1, n]`` fp32 row of ones (TensorE's stationary operand that repeats a row on ``n``
        partitions), set once per epilogue."""
        key = ("ones", n)
        t = self._loaded.get(key)
        if t is None:
            t = self._loaded[key] = self.lw.graph.tile((1, n), dt.F32, "sbuf", "epones").ref()
            self.lw.graph.add("pool", "memset", t, value=1.0)
        return t

    def _load(self, oid: int, place: Callable[[Ref], Ref], flat: tuple[int, int]) -> Ref:
        """Input ``oid``'s tile at ``place``, loaded once per distinct access (a bias repeated along M: once
        per N tile); a value repeated along the free axes (a per-row statistic, a per-channel scale) as a
        column read through a stride-0 view (a DMA of stride-0 elements is a descriptor per element).
        Where the place's view cannot be expressed on the input's access pattern, a contiguous copy of
        the input is read instead (made once)."""
        g = self.lw.graph
        src = self.inputs[oid]
        assert isinstance(src, Ref)
        node = next(o for m in self.cluster.members for o in m.operands if o.id == oid)  # type: ignore[union-attr]
        copied = node.id in self.lw.copied  # src is a copy made because a view failed: try the original first
        view: Ref | None = None
        if not copied:
            try:
                view = place(src)
                view.ap  # noqa: B018 - resolved: raises where the strides do not merge
            except AccessError:
                view = None
        if view is None:
            runs = _row_runs(self.lw, node, place(self.frame(virtual(node))))
            if runs is not None:
                return self._load_runs(runs, flat)
            if not copied:
                self.inputs[oid] = src = self.frame(self.lw.contiguous(self.lw.ref(node), node))
            view = place(src)
        shape = view.shape
        dims = view.ap.dims
        # free dimensions repeated (stride 0) at the end of the tile: loaded once, then repeated on chip
        # (a DMA of stride-0 elements is a descriptor per element)
        rep = len(shape)
        while rep > 1 and (shape[rep - 1] == 1 or dims[rep - 1][1] == 0):
            rep -= 1
        part = view if rep == len(shape) else view[(*[slice(None)] * rep, *[slice(0, 1)] * (len(shape) - rep))]
        key = (part.buf.name, part.ap.offset, part.ap.dims)
        tile = self._loaded.get(key)
        if tile is None:
            tile = g.tile(part.shape, onchip_dtype(src.dtype), "sbuf", "epin").ref()
            row = _as_row(part) if rep == 1 else None
            spread = _spread_row(part) if row is None else None
            if row is not None:
                _column_from_row(self.lw, tile.reshape(shape[0], 1), row)
            elif spread is not None:
                _rows_from_row(self.lw, tile.reshape(shape[0], spread.shape[1]), spread, self._ones(shape[0]))
            else:
                g.add("dma", "dma", tile, part)
            self._loaded[key] = tile
        if rep == len(shape):
            return _flat(tile, flat)
        if rep == 1:  # one value per partition: a column read through a stride-0 view
            return tile.reshape(shape[0], 1).broadcast(1, flat[1])
        full = g.tile(flat, tile.dtype, "sbuf", "eprep").ref()
        wide = tile
        for d in range(rep, len(shape)):
            wide = wide.broadcast(d, shape[d])
        g.add("dve", "tensor_copy", full.reshape(*shape), wide)
        return full

    def _load_runs(self, runs: list[tuple[int, Ref]], flat: tuple[int, int]) -> Ref:
        """A tile loaded run by run (:func:`_row_runs`), once per distinct set of runs: the tiles of a value
        repeated along the rows (every one of them, when the period divides the tile) share one load."""
        key = ("runs", *((p0, r.buf.name, r.ap.offset, r.ap.dims) for p0, r in runs))
        tile = self._loaded.get(key)
        if tile is None:
            rows = sum(r.shape[0] for _, r in runs)
            tile = self._loaded[key] = self.lw.graph.tile((rows, runs[0][1].shape[1]), onchip_dtype(runs[0][1].dtype),
                                                          "sbuf", "epin").ref()
            for p0, r in runs:
                self.lw.graph.add("dma", "dma", tile[p0:p0 + r.shape[0]], r)
        return _flat(tile, flat)


# at most this many loads make an input tile run by run (_row_runs); more, and the input is copied whole
ROW_RUNS = 8


def _row_runs(lw: Lowering, node: Node, where: Ref) -> list[tuple[int, Ref]] | None:
    """The tile of ``node``'s value at ``where`` (that place in a contiguous value of its shape: a
    ``[rows, cols]`` view) as at most :data:`ROW_RUNS` runs of consecutive rows, each one view of the
    value a reshape was made of: ``(first partition, view)``. A value whose rows do not merge into one
    stride (a ``[32, 768]`` embedding broadcast over 50 sequences, read as ``[1600, 768]`` rows by the
    dense layer whose epilogue adds it) loads in runs of 32 rows instead of being copied whole first
    (gpt2_extract: a 4.9 MB HBM-to-HBM copy, 46.8 us of DMA on its critical path). None where it does not
    come apart that way."""
    base = node
    while base.op == "reshape":
        base = base.operands[0]
    if base is node:  # no reshape to see through: the copy is what there is to read
        return None
    try:
        src = lw.ref(base)
        src.ap  # noqa: B018 - the reshape's source resolves
        dims = where.ap.dims
    except (AccessError, KeyError, AssertionError):
        return None
    shape = tuple(base.shape)
    if len(where.shape) != 2 or len(shape) < 2:
        return None
    rows, cols = where.shape
    if len(dims) == 2 and tuple(dims[1]) == (cols, 1):
        pstride = dims[0][1]
    elif len(dims) == 1 and tuple(dims[0]) == (rows * cols, 1):  # whole rows, merged into one run
        pstride = cols
    else:
        return None
    last = shape[-1]
    offset = where.ap.offset
    # a tile's row within one row of the value, and the next partition whole rows of it further on
    if offset % last + cols > last or pstride <= 0 or pstride % last:
        return None
    step = pstride // last  # the value's rows along its second-to-last dimension from one partition to the next
    runs: list[tuple[int, Ref]] = []
    p = 0
    while p < rows:
        idx = []
        rest = offset + p * pstride
        for n in reversed(shape):
            idx.append(rest % n)
            rest //= n
        idx.reverse()
        n = min(rows - p, (shape[-2] - idx[-2] + step - 1) // step)
        key = (*idx[:-2], slice(idx[-2], idx[-2] + (n - 1) * step + 1, step), slice(idx[-1], idx[-1] + cols))
        runs.append((p, src[key]))
        p += n
        if len(runs) > ROW_RUNS:
            return None
    return runs


# a column at least this tall, of a vector at least this long, whose values lie side by side loads as one
# row and a TensorE transpose (below)
COLUMN_ROW_PARTITIONS = 16
COLUMN_ROW_VALUES = 512


def _as_row(part: Ref) -> Ref | None:
    """``part`` (one value per partition) as the ``[1, P]`` row it is in memory, where the values lie side by
    side and the vector is long enough that its descriptors, one per partition, cost more than the
    transpose's latency: a batch norm's per-channel scale read by a convolution's tiles was 128
    four-byte descriptors a tile (12 ns of DMA-engine time each: ResNet-50 spent 51 us of its DMA
    engines' time on them). A short vector (a small model's 16 to 256 channels) keeps its descriptors:
    there the chain of a load, a transpose and a copy costs more latency than it saves (resnet_small
    66.4 -> 71.4 us)."""
    n = part.shape[0]
    if n < COLUMN_ROW_PARTITIONS or math.prod(part.buf.shape) < COLUMN_ROW_VALUES or not part.dtype.is_float \
            or part.dtype.itemsize not in (2, 4):
        return None
    try:
        row = part.reshape(1, n)
        dims = row.ap.dims
    except AccessError:
        return None
    return row if dims[-1][1] == 1 else None


# a value repeated on the partitions (a bias along a dot's N, the same for every token) from this many bytes
# on: its row loaded once and repeated by TensorE, not loaded once per partition (below)
SPREAD_BYTES = 64 * 1024


def _spread_row(part: Ref) -> Ref | None:
    """``part`` (``[P, ...]``, the same on every partition: stride 0) as the ``[1, F]`` row it repeats, where
    a DMA reading it once per partition would move at least :data:`SPREAD_BYTES` (BERT-base's biases:
    a [128, 512] fp32 tile is 256 KB read for 2 KB of bias, 72 MB of its DMA traffic)."""
    n = part.shape[0]
    f = math.prod(part.shape[1:])
    if n < 2 or n * f * part.dtype.itemsize < SPREAD_BYTES or not part.dtype.is_float \
            or part.dtype.itemsize not in (2, 4) or f > SPREAD_MAX:
        return None
    try:
        if part.ap.dims[0][1] != 0:
            return None
        row = part[0:1].reshape(1, f)
        row.ap  # noqa: B018 - resolved: raises where the strides do not merge
    except AccessError:
        return None
    return row


SPREAD_MAX = 4096  # values of a repeated row (in PSUM banks of 512 fp32 values)


def _rows_from_row(lw: Lowering, dst: Ref, row: Ref, ones: Ref) -> None:
    """``dst [P, F]``: the ``[1, F]`` row in HBM on every partition. One descriptor, a TensorE matmul of a
    row of ones (stationary, one contraction row: each result is the value times 1, exact for every
    value) against the row (moving, in fp32) per PSUM bank of it, and a copy out of PSUM
    (:func:`copy_out`)."""
    g = lw.graph
    n, f = dst.shape
    nat = g.tile((1, f), row.dtype, "sbuf", "eprow").ref()
    g.add("dma", "dma", nat, row)
    if nat.dtype is not dt.F32:
        wide = g.tile((1, f), dt.F32, "sbuf", "eprow32").ref()
        g.add("act", "activation", wide, nat)
        nat = wide
    bank = lw.target.psum_bank_bytes // 4
    for c0 in range(0, f, bank):
        cn = min(bank, f - c0)
        ps = g.tile((n, cn), dt.F32, "psum", "eprowsps").ref()
        g.add("pe", "matmul", ps, ones, nat[:, c0:c0 + cn], start=True, stop=True)
        copy_out(g, dst[:, c0:c0 + cn], ps)


def _column_from_row(lw: Lowering, dst: Ref, row: Ref) -> None:
    """``dst [P, 1]`` from the ``[1, P]`` row in HBM: one descriptor, a TensorE transpose (one contraction
    row: exact for every value, infinities and NaN included) and a copy out of PSUM (:func:`copy_out`)."""
    g = lw.graph
    n = row.shape[1]
    nat = g.tile((1, n), row.dtype, "sbuf", "eprow").ref()
    g.add("dma", "dma", nat, row)
    ps = g.tile((n, 1), dt.F32, "psum", "eprowps").ref()
    g.add("pe", "transpose", ps, nat)
    copy_out(g, dst, ps)


def copy_out(g: Graph, dst: Ref, ps: Ref) -> None:
    """PSUM tile ``ps`` copied into ``dst`` by whichever of ScalarE and VectorE has had less work lately."""
    g.copy(g.lighter(("act", "dve"), math.prod(ps.shape[1:])) == "act", dst, ps)


# the members that may take the producer's PSUM tile as an operand (one VectorE or ScalarE instruction each)
PSUM_READERS = frozenset({"add", "subtract", "multiply", "maximum", "minimum", *ACTIVATION})


def _flat(tile: Ref, flat: tuple[int, int]) -> Ref:
    return tile if len(tile.shape) == 2 else tile.reshape(*flat)


def epilogue(lw: Lowering, node: Node, frame: Callable[[Ref], Ref], served: frozenset[int] = frozenset()
             ) -> Epilogue:
    """The epilogue of ``node`` (an operator ``lower.hosts`` names) whose lowering sees values of its
    result's shape as ``frame`` does: its elementwise reader's cluster when that can run on the result's
    tiles, else just the store. A result buffer the lowering made already is dropped when only the
    cluster reads the result. ``served``: readers of the cluster's values the host computes itself (a
    softmax, backend/fused.py), which need no store."""
    cl = _reader(lw, node)
    ep = Epilogue(lw, node, frame, None, cl)
    if cl is not None and (any(m.op == "iota" for m in cl.members) or not _bind(lw, ep, cl, served)):
        ep.cluster, ep.inputs, ep.stores = None, {}, {}
    ep_cl = ep.cluster
    readers = lw.consumers.get(node.id, set())
    outside = ep_cl is None or node.id in lw.output_of or any(lw.cluster_of.get(c) is not ep_cl for c in readers)
    made = lw.values.get(node.id)
    if outside:
        ep.out = frame(made) if isinstance(made, Ref) else lw.view(lw.result(node), frame, node)
    elif isinstance(made, Ref):
        lw.drop(node)
    if ep_cl is not None:
        ep_cl.host = node.id
    return ep


def prologue(lw: Lowering, host: Node, cl: Cluster, served: frozenset[int]) -> Epilogue | None:
    """The cluster ``cl`` computed tile by tile by ``host``, which reads one of its members (a reduction
    computing its source instead of loading it): values are seen in their own shape; None when an
    input is not computed yet."""
    ep = Epilogue(lw, host, lambda r: r, None, cl)
    return ep if _bind(lw, ep, cl, served | {host.id}) else None


def _reader(lw: Lowering, node: Node) -> Cluster | None:
    """The first cluster of ``node``'s shape that reads it and has not yet run."""
    found = [c for c in (lw.cluster_of.get(r) for r in lw.consumers.get(node.id, ())) if c is not None
             and c.shape == node.shape and c.host is None and c.members]
    return min(found, key=lambda c: c.first) if found else None


def _bind(lw: Lowering, ep: Epilogue, cl: Cluster, served: frozenset[int] = frozenset()) -> bool:
    """Find every input of the cluster in the frame (or as a number) and its results' places (a result
    buffer made already is used; ``served``: readers the host computes itself, which need no store);
    False when an input is not computed yet or its access pattern cannot be framed."""
    ids = {m.id for m in cl.members} | served
    try:
        for m in cl.members:
            for o in m.operands:
                if o.id in ids or o.id == ep.node.id or o.id in ep.inputs:
                    continue
                s = lw.scalar(o)
                if s is not None:
                    ep.inputs[o.id] = s
                    continue
                if not isinstance(lw.values.get(o.id), Ref):
                    return False  # not computed yet (or a tuple)
                ep.inputs[o.id] = ep.frame(lw.ref(o))
                pred = affine_predicate(o) if o.dtype.is_pred else None
                if pred is not None:
                    ep.affine[o.id] = pred
                ep.inputs[o.id].ap  # noqa: B018 - resolved: raises where the strides do not merge
        for m in cl.members:
            if m.id in lw.output_of or lw.consumers.get(m.id, set()) - ids:
                made = lw.values.get(m.id)
                ep.stores[m.id] = ep.frame(made if isinstance(made, Ref) else lw.result(m))
    except AccessError:
        return False
    return True


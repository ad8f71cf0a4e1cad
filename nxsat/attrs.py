"""Structured operator attributes (frozen, hashable): windows, dimension numbers, slices, padding.

They mirror XLA's semantics field for field, so every front end lowers into the same records and
the registry's shape rules and reference implementations read one form.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class WindowDim:
    """One spatial dimension of a convolution or reduce-window window."""

    size: int = 1
    stride: int = 1
    pad_lo: int = 0
    pad_hi: int = 0
    lhs_dilation: int = 1  # a.k.a. base dilation: holes inserted between input elements
    rhs_dilation: int = 1  # a.k.a. window dilation: holes between window elements
    reversal: bool = False

    @property
    def dilated_size(self) -> int:
        return 0 if self.size == 0 else (self.size - 1) * self.rhs_dilation + 1

    def output_size(self, input_size: int) -> int:
        base = 0 if input_size == 0 else (input_size - 1) * self.lhs_dilation + 1
        padded = base + self.pad_lo + self.pad_hi
        span = self.dilated_size
        if padded < span or self.stride <= 0:
            return 0
        return (padded - span) // self.stride + 1


Window = tuple[WindowDim, ...]


@dataclass(frozen=True, slots=True)
class ConvDims:
    """Which dimension of input, kernel and output plays which role (XLA's dim_labels)."""

    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]

    @staticmethod
    def from_labels(labels: str) -> ConvDims:
        """Parse ``bf01_oi01->bf01`` (raises ValueError when malformed)."""
        try:
            lhs_rhs, out = labels.split("->")
            lhs, rhs = lhs_rhs.split("_")
        except ValueError:
            raise ValueError(f"dim_labels {labels!r} is not of the form LHS_RHS->OUT") from None
        nsp = len(lhs) - 2
        if nsp < 0 or len(rhs) != nsp + 2 or len(out) != nsp + 2:
            raise ValueError(f"dim_labels {labels!r}: the three parts must have the same rank")

        def roles(s: str, a: str, b: str) -> tuple[int, int, tuple[int, ...]]:
            if sorted(s) != sorted([a, b, *map(str, range(nsp))]):
                raise ValueError(f"dim_labels {labels!r}: {s!r} must name {a}, {b} and 0..{nsp - 1} once each")
            return s.index(a), s.index(b), tuple(s.index(str(i)) for i in range(nsp))

        ib, if_, isp = roles(lhs, "b", "f")
        ki, ko, ksp = roles(rhs, "i", "o")
        ob, of, osp = roles(out, "b", "f")
        return ConvDims(ib, if_, isp, ki, ko, ksp, ob, of, osp)

    def labels(self) -> str:
        def spell(n: int, a: tuple[int, str], b: tuple[int, str], sp: tuple[int, ...]) -> str:
            s = [""] * n
            s[a[0]], s[b[0]] = a[1], b[1]
            for i, d in enumerate(sp):
                s[d] = str(i)
            return "".join(s)

        n = len(self.input_spatial) + 2
        return (spell(n, (self.input_batch, "b"), (self.input_feature, "f"), self.input_spatial) + "_"
                + spell(n, (self.kernel_input_feature, "i"), (self.kernel_output_feature, "o"),
                        self.kernel_spatial) + "->"
                + spell(n, (self.output_batch, "b"), (self.output_feature, "f"), self.output_spatial))


@dataclass(frozen=True, slots=True)
class DotDims:
    lhs_contracting: tuple[int, ...] = ()
    rhs_contracting: tuple[int, ...] = ()
    lhs_batch: tuple[int, ...] = ()
    rhs_batch: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GatherDims:
    offset_dims: tuple[int, ...] = ()
    collapsed_slice_dims: tuple[int, ...] = ()
    start_index_map: tuple[int, ...] = ()
    index_vector_dim: int = 0
    operand_batching_dims: tuple[int, ...] = ()
    start_indices_batching_dims: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ScatterDims:
    update_window_dims: tuple[int, ...] = ()
    inserted_window_dims: tuple[int, ...] = ()
    scatter_dims_to_operand_dims: tuple[int, ...] = ()
    index_vector_dim: int = 0
    input_batching_dims: tuple[int, ...] = ()
    scatter_indices_batching_dims: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SliceDim:
    start: int
    limit: int
    stride: int = 1


@dataclass(frozen=True, slots=True)
class PadDim:
    lo: int = 0
    hi: int = 0
    interior: int = 0


@dataclass(frozen=True, slots=True)
class Metadata:
    """What HLO metadata says about where an instruction came from (kept for diagnostics)."""

    op_name: str = ""
    source_file: str = ""
    source_line: int = 0
    extra: tuple[tuple[str, str], ...] = field(default=())

    def origin(self) -> str | None:
        if self.source_file:
            return f"{self.source_file}:{self.source_line}" if self.source_line else self.source_file
        return None

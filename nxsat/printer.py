"""IR -> HLO text that nxsat's HLO front end (and XLA's) reads back.

Used for ``--workdir`` dumps after each pass and by tests that round-trip graphs. Names are made
unique per computation (inlining copies bodies, so IR names repeat); sub-computations are printed
before their users, the entry last.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from nxsat.attrs import ConvDims, DotDims, GatherDims, PadDim, ScatterDims, SliceDim, WindowDim
from nxsat.ir import Computation, Module, Node, TupleType, Type, subcomputations


def type_text(t: Type) -> str:
    if isinstance(t, TupleType):
        return "(" + ", ".join(type_text(e) for e in t.elements) + ")"
    layout = "{" + ",".join(str(i) for i in reversed(range(t.rank))) + "}" if t.rank else ""
    return f"{t.dtype.name}[{','.join(map(str, t.shape))}]{layout}"


def _ints(v: tuple[int, ...]) -> str:
    return "{" + ",".join(str(int(i)) for i in v) + "}"


def _window(w: tuple[WindowDim, ...]) -> str:
    if not w:
        return "{}"
    parts = ["size=" + "x".join(str(d.size) for d in w)]
    if any(d.stride != 1 for d in w):
        parts.append("stride=" + "x".join(str(d.stride) for d in w))
    if any(d.pad_lo or d.pad_hi for d in w):
        parts.append("pad=" + "x".join(f"{d.pad_lo}_{d.pad_hi}" for d in w))
    if any(d.lhs_dilation != 1 for d in w):
        parts.append("lhs_dilate=" + "x".join(str(d.lhs_dilation) for d in w))
    if any(d.rhs_dilation != 1 for d in w):
        parts.append("rhs_dilate=" + "x".join(str(d.rhs_dilation) for d in w))
    if any(d.reversal for d in w):
        parts.append("rhs_reversal=" + "x".join("1" if d.reversal else "0" for d in w))
    return "{" + " ".join(parts) + "}"


def _float_text(x: float) -> str:
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def _nan_text(x: np.ndarray) -> str:
    """A NaN as XLA prints it: its sign, and its mantissa field when that is not the plain quiet
    NaN (``-nan``, ``nan(0x1)``), so that printing and parsing keep every bit."""
    width = x.dtype.itemsize * 8
    bits = int(x.view(np.dtype(f"u{x.dtype.itemsize}"))[0])
    mant = int(ml_dtypes.finfo(x.dtype).nmant)
    payload = bits & ((1 << mant) - 1)
    sign = "-" if bits >> (width - 1) else ""
    plain = payload == 1 << (mant - 1) or x.dtype == ml_dtypes.float8_e4m3fn
    return f"{sign}nan" + ("" if plain else f"(0x{payload:x})")


LARGE_CONSTANT = 64


def literal_text(value: np.ndarray) -> str:
    a = np.asarray(value)
    if a.dtype == np.bool_:
        flat = ["true" if v else "false" for v in a.ravel()]
    elif a.dtype.kind in "iu":
        flat = [str(int(v)) for v in a.ravel()]
    else:
        with np.errstate(invalid="ignore"):  # signaling NaNs widen quietly
            wide = a.astype(np.float64).ravel()
        flat = [_float_text(float(v)) for v in wide]
        for i in np.flatnonzero(np.isnan(wide)):
            flat[i] = _nan_text(a.ravel()[i : i + 1])
    if a.ndim == 0:
        return flat[0]

    def nest(offset: int, dims: tuple[int, ...]) -> tuple[str, int]:
        if len(dims) == 1:
            return "{" + ", ".join(flat[offset:offset + dims[0]]) + "}", offset + dims[0]
        parts = []
        for _ in range(dims[0]):
            s, offset = nest(offset, dims[1:])
            parts.append(s)
        return "{ " + ", ".join(parts) + " }", offset

    if a.size == 0:
        return "{}"
    return nest(0, a.shape)[0]


class _Printer:
    def __init__(self, module: Module, large_constants: bool = True) -> None:
        self.module = module
        self.large_constants = large_constants
        self.comp_names: dict[int, str] = {}
        used: set[str] = set()
        self.order = _callees_first(module.entry)
        for comp in self.order:
            self.comp_names[id(comp)] = _unique(comp.name, used)

    def attrs(self, node: Node) -> list[str]:
        out: list[str] = []
        a = node.attrs
        for key, value in sorted(a.items()):
            text = self.attr(node.op, key, value)
            if text is not None:
                out.append(text)
        return out

    def attr(self, op: str, key: str, v: Any) -> str | None:
        if key in ("type", "value", "index") and op in ("parameter", "constant"):
            return None
        if key in ("shape",) or (key == "dtype" and op in ("convert", "bitcast-convert", "dot", "convolution")):
            return None
        if key == "type" and op in ("iota", "rng", "rng-bit-generator", "custom-call"):
            return None
        if key == "precision":
            return f"operand_precision={{{','.join(v)}}}" if v else None
        if isinstance(v, Computation):
            name = {"to_apply": "calls" if op == "fusion" else "to_apply"}.get(key, key)
            return f"{name}=%{self.comp_names[id(v)]}"
        if key == "branches":
            return "branch_computations={" + ", ".join(f"%{self.comp_names[id(c)]}" for c in v) + "}"
        if key == "dimension":
            return f"dimensions={{{v}}}"
        if key == "dims" and isinstance(v, DotDims):
            parts = [f"lhs_batch_dims={_ints(v.lhs_batch)}"] if v.lhs_batch else []
            parts += [f"rhs_batch_dims={_ints(v.rhs_batch)}"] if v.rhs_batch else []
            parts += [f"lhs_contracting_dims={_ints(v.lhs_contracting)}",
                      f"rhs_contracting_dims={_ints(v.rhs_contracting)}"]
            return ", ".join(parts)
        if key == "dims" and isinstance(v, ConvDims):
            return f"dim_labels={v.labels()}"
        if key == "dims" and isinstance(v, GatherDims | ScatterDims):
            fields = [f for f in type(v).__dataclass_fields__ if f != "index_vector_dim"]
            parts = [f"{f}={_ints(getattr(v, f))}" for f in fields if getattr(v, f) or "batching" not in f]
            return ", ".join(parts + [f"index_vector_dim={v.index_vector_dim}"])
        if key == "window":
            return f"window={_window(v)}"
        if key == "slice":
            return "slice={" + ", ".join(f"[{s.start}:{s.limit}" + (f":{s.stride}]" if s.stride != 1 else "]")
                                         for s in v) + "}"
        if key == "padding":
            return "padding=" + "x".join(f"{p.lo}_{p.hi}" + (f"_{p.interior}" if p.interior else "") for p in v)
        if key == "sizes":
            return f"dynamic_slice_sizes={_ints(v)}"
        if key in ("replica_groups", "source_target_pairs"):
            return f"{key}={{" + ",".join(_ints(g) for g in v) + "}"
        if key == "target":
            return f'custom_call_target="{v}"'
        if key == "backend_config":
            return f'backend_config="{v}"' if v else None
        if key == "type":  # compare's comparison type
            return f"type={v}" if v else None
        if isinstance(v, bool):
            return f"{key}={'true' if v else 'false'}"
        if isinstance(v, int | float | str):
            return f"{key}={v}"
        if isinstance(v, tuple) and all(isinstance(i, int) for i in v):
            return f"{key}={_ints(v)}"
        if isinstance(v, SliceDim | PadDim):
            return None
        return None

    def computation(self, comp: Computation, entry: bool) -> str:
        names: dict[int, str] = {}
        used: set[str] = set()
        for p in comp.params:
            names[p.id] = _unique(p.name, used)
        lines = []
        order = comp.post_order()
        for n in order:
            if n.id not in names:
                names[n.id] = _unique(n.name, used)
        for n in order:
            root = "ROOT " if n is comp.root else ""
            if n.op == "parameter":
                args = str(n.attrs["index"])
            elif n.op == "constant":
                v = n.attrs.get("value")
                shown = v is not None and (self.large_constants or np.size(v) <= LARGE_CONSTANT)
                args = literal_text(v) if shown else "{...}"
            else:
                args = ", ".join(f"%{names[o.id]}" for o in n.operands)
            attrs = self.attrs(n)
            tail = "".join(", " + a for a in attrs)
            lines.append(f"  {root}%{names[n.id]} = {type_text(n.type)} {n.op}({args}){tail}")
        params = ", ".join(f"{names[p.id]}: {type_text(p.type)}" for p in comp.params)
        head = ("ENTRY " if entry else "") + f"%{self.comp_names[id(comp)]} ({params}) -> {type_text(comp.root.type)}"
        return head + " {\n" + "\n".join(lines) + "\n}\n"

    def module_text(self) -> str:
        comps = self.order
        params = ", ".join(type_text(p.type) for p in self.module.entry.params)
        header = (f"HloModule {_safe(self.module.name)}, entry_computation_layout={{({params})->"
                  f"{type_text(self.module.entry.root.type)}}}\n\n")
        return header + "\n".join(self.computation(c, c is self.module.entry) for c in comps)


def _callees_first(entry: Computation) -> list[Computation]:
    """Live computations, each after every computation it uses, in first-use order of the live
    nodes (independent of how the source ordered its text)."""
    order: list[Computation] = []
    done: set[int] = set()
    stack: list[tuple[Computation, bool]] = [(entry, False)]
    while stack:
        comp, expanded = stack.pop()
        if id(comp) in done:
            continue
        if expanded:
            done.add(id(comp))
            order.append(comp)
            continue
        stack.append((comp, True))
        subs = [c for n in comp.post_order() for c in subcomputations(n)]
        stack.extend((c, False) for c in reversed(subs) if id(c) not in done)
    return order


def _safe(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name.lstrip("%"))
    return out if out and (out[0].isalpha() or out[0] == "_") else "m_" + out


def _unique(name: str, used: set[str]) -> str:
    base = _safe(name)
    candidate, i = base, 1
    while candidate in used:
        candidate = f"{base}.{i}"
        i += 1
    used.add(candidate)
    return candidate


def to_hlo_text(module: Module, large_constants: bool = True) -> str:
    """The module as HLO text (deterministic: same graph, same text). ``large_constants=False`` writes
    constants of more than LARGE_CONSTANT elements as ``{...}``, as XLA's dumps do (a model's weights
    would otherwise be most of the text)."""
    return _Printer(module, large_constants).module_text()


def computation_text(comp: Computation) -> str:
    return to_hlo_text(Module(comp.name, comp))


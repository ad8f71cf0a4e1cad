"""The precision policy: ``--auto-cast`` and ``--auto-cast-type`` as neuronx-cc documents them, as a pass
on the extracted graph (the -O1 path, and the baseline the cost model's choices must beat).

- ``none``: no type changes.
- ``matmult``: the operands of TensorE operations (``dot``, ``convolution``) that are fp32 are cast to
  the auto-cast type; the result stays fp32 (TensorE accumulates in fp32). For ``tf32`` the operands
  are rounded to tf32 (``reduce-precision`` to 8 exponent and 10 mantissa bits, which the backend
  turns into TensorE's tf32 mode) and stay fp32 in memory.
- ``all``: in addition, every fp32 elementwise operation computes in the auto-cast type.
  Reductions keep accumulating in fp32 with mixed-precision accumulation (the default); with
  ``--disable-mixed-precision-accumulation`` a reduction over a cast value accumulates in it.

Inputs and outputs keep their types: a cast value is converted back to fp32 wherever something
that stays fp32 (an output among them) reads it. The casts are explicit ``convert`` nodes, so the
reference interpreter computes exactly what the device does, and the report counts each decision.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from nxsat import dtypes as dt
from nxsat.builder import infer_type
from nxsat.ir import Computation, Module, Node, TensorType, TupleType

CAST_TYPES = {"bf16": dt.BF16, "fp16": dt.F16, "fp8_e4m3": dt.F8E4M3FN, "tf32": dt.F32}
TENSOR_OPS = ("dot", "convolution")
# Elementwise fp32 operations ``all`` computes in the auto-cast type.
ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "remainder", "atan2", "abs", "negate",
    "sign", "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "sqrt", "rsqrt", "cbrt", "tanh",
    "sine", "cosine", "tan", "erf", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "clamp", "select",
})


@dataclass
class PrecisionReport:
    """What the policy decided: operations per computing type, and each cast it inserted."""

    mode: str
    cast_type: str
    ops_by_type: dict[str, int] = field(default_factory=dict)
    casts: int = 0
    decisions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"auto_cast": self.mode, "auto_cast_type": self.cast_type, "ops_by_type": dict(self.ops_by_type),
                "casts_inserted": self.casts}


def apply_precision(module: Module, mode: str = "none", cast_type: str = "bf16",
                    mixed_accumulation: bool = True, saturate_infinity: bool = False,
                    tensor_ops: tuple[str, ...] = TENSOR_OPS) -> tuple[Module, PrecisionReport]:
    """The module with the policy applied (a new module; ``module`` is not changed). ``tensor_ops``:
    the TensorE operations the policy casts (at -O2 and -O3 the extraction chose the dots' precision
    already: only convolutions, which the e-graph keeps opaque, are left to it)."""
    rep = PrecisionReport(mode, cast_type)
    if saturate_infinity:
        module = _saturate_infinity(module, rep)
    if mode == "none":
        rep.ops_by_type = _count(module.entry)
        return module, rep
    low = CAST_TYPES[cast_type]
    entry = module.entry
    mapping: dict[int, Node] = {p.id: p for p in entry.params}
    cast_cache: dict[tuple[int, str], Node] = {}

    def convert(x: Node, to: dt.DType) -> Node:
        if x.dtype is to:
            return x
        key = (x.id, to.name)
        n = cast_cache.get(key)
        if n is None and x.op == "transpose":
            # cast the source and transpose the cast (a view): a cast of the view would be a pass that
            # moves every element into the other order (a channels-first value read by a channels-last
            # convolution: 3.8 ms of ResNet-50's DMA time)
            src = convert(x.operands[0], to)
            n = Node("transpose", (src,), dict(x.attrs), x.tensor.with_dtype(to), f"{src.name}.t", x.loc)
            cast_cache[key] = n
        if n is None:
            attrs = {"dtype": to}
            n = Node("convert", (x,), attrs, infer_type("convert", [x], attrs), f"{x.name}.{to.name}", x.loc)
            cast_cache[key] = n
            rep.casts += 1
        return n

    def tf32(x: Node) -> Node:
        key = (x.id, "tf32")
        n = cast_cache.get(key)
        if n is None:
            attrs = {"exponent_bits": 8, "mantissa_bits": 10}
            n = Node("reduce-precision", (x,), attrs, x.type, f"{x.name}.tf32", x.loc)
            cast_cache[key] = n
            rep.casts += 1
        return n

    for node in entry.post_order():
        if node.op == "parameter":
            continue
        ops = [mapping[o.id] for o in node.operands]
        new: Node
        if node.op in tensor_ops and all(o.dtype is dt.F32 for o in node.operands):
            if cast_type == "tf32":
                ops = [tf32(o) for o in ops]
            else:
                ops = [convert(o, low) for o in ops]
            rep.decisions.append(f"{node.name}: {node.op} operands in {cast_type}")
            new = Node(node.op, ops, dict(node.attrs), node.type, node.name, node.loc)
        elif (mode == "all" and cast_type != "tf32" and node.op in ELEMENTWISE and isinstance(node.type, TensorType)
              and node.dtype is dt.F32):
            ops = [convert(o, low) if o.dtype is dt.F32 else o for o in ops]
            t = infer_type(node.op, ops, node.attrs, node.loc)
            new = Node(node.op, ops, dict(node.attrs), t, node.name, node.loc)
        elif (mode == "all" and not mixed_accumulation and cast_type != "tf32" and node.op == "reduce"
              and len(node.operands) == 2 and node.dtype is dt.F32 and _simple_body(node.attrs["to_apply"])):
            body = _body_in(node.attrs["to_apply"], low)
            ops = [convert(o, low) for o in ops]
            attrs = dict(node.attrs, to_apply=body)
            new = Node("reduce", ops, attrs, infer_type("reduce", ops, attrs, node.loc), node.name, node.loc)
        elif node.op == "convert" and isinstance(node.type, TensorType) and ops[0].dtype is node.operands[0].dtype \
                and ops[0].op == "transpose" and ops[0].operands[0].op not in ("parameter", "constant"):
            # a cast the extraction chose of a transposed computed value: the source's cast transposed (a
            # view), so the source's producer writes it narrow (extract/cost.py ``_produced`` prices it so).
            # A transposed model input's cast stays the dot's, which loads and converts it (cast apart,
            # gpt_decoder's LM head weight took a pass of its own: +1.7 us).
            new = convert(ops[0], node.dtype)
        else:
            # Everything else keeps fp32: a cast value it reads is converted back.
            ops = [convert(m, o.dtype) if isinstance(o.type, TensorType) and m.dtype is not o.dtype else m
                   for m, o in zip(ops, node.operands)]
            new = Node(node.op, ops, node.attrs, node.type, node.name, node.loc)
        mapping[node.id] = new
    root = mapping[entry.root.id]
    root = _restore(root, entry.root, convert)
    comp = Computation(entry.name, list(entry.params), root, None, entry.loc)
    out = Module(module.name, comp, None, module.attrs, module.source, module.framework)
    out.warnings.extend(module.warnings)
    rep.ops_by_type = _count(comp)
    return out, rep


SATURATED_OPS = ("multiply", "divide", "dot", "convolution")


def _saturate_infinity(module: Module, rep: PrecisionReport) -> Module:
    """``--enable-saturate-infinity``: the float operands of operations that turn an infinity into NaN
    (inf x 0, inf / inf) are clamped to the largest finite values first, as explicit ``clamp`` nodes."""
    entry = module.entry
    mapping: dict[int, Node] = {p.id: p for p in entry.params}
    made: dict[int, Node] = {}

    def clamp(x: Node) -> Node:
        if not isinstance(x.type, TensorType) or not x.dtype.is_float:
            return x
        c = made.get(x.id)
        if c is None:
            big = float(ml_dtypes.finfo(x.dtype.np).max)
            t = TensorType(x.dtype, ())
            lo = Node("constant", (), {"value": np.asarray(-big).astype(x.dtype.np), "type": t}, t, f"{x.name}.lo")
            hi = Node("constant", (), {"value": np.asarray(big).astype(x.dtype.np), "type": t}, t, f"{x.name}.hi")
            c = made[x.id] = Node("clamp", (lo, x, hi), {}, x.type, f"{x.name}.sat", x.loc)
            rep.decisions.append(f"{x.name}: infinities saturated")
        return c

    for node in entry.post_order():
        if node.op == "parameter":
            continue
        ops = [mapping[o.id] for o in node.operands]
        if node.op in SATURATED_OPS:
            ops = [clamp(o) for o in ops]
        mapping[node.id] = Node(node.op, ops, node.attrs, node.type, node.name, node.loc)
    comp = Computation(entry.name, list(entry.params), mapping[entry.root.id], None, entry.loc)
    out = Module(module.name, comp, None, module.attrs, module.source, module.framework)
    out.warnings.extend(module.warnings)
    return out


def _restore(new: Node, old: Node, convert: Any) -> Node:
    """The outputs in their original types."""
    if isinstance(old.type, TupleType):
        ops = [_restore(n, o, convert) for n, o in zip(new.operands, old.operands)]
        return Node("tuple", ops, {}, TupleType(tuple(o.type for o in ops)), new.name, new.loc)
    return convert(new, old.dtype) if new.dtype is not old.dtype else new


def _simple_body(body: Computation) -> bool:
    r = body.root
    return len(body.params) == 2 and r.op in ("add", "multiply", "maximum", "minimum") and \
        {o.id for o in r.operands} == {p.id for p in body.params}


def _body_in(body: Computation, d: dt.DType) -> Computation:
    t = TensorType(d, ())
    a = Node("parameter", (), {"index": 0, "type": t}, t, "a")
    b = Node("parameter", (), {"index": 1, "type": t}, t, "b")
    r = Node(body.root.op, (a, b), {}, t, "r")
    return Computation(f"{body.name}_{d.name}", [a, b], r)


def _count(comp: Computation) -> dict[str, int]:
    """Computing operations per result type (data movement, parameters and constants left out)."""
    skip = {"parameter", "constant", "reshape", "transpose", "broadcast", "slice", "tuple", "get-tuple-element",
            "copy", "bitcast", "concatenate", "pad", "reverse", "convert", "reduce-precision"}
    c: Counter[str] = Counter()
    for n in comp.post_order():
        if n.op in skip or not isinstance(n.type, TensorType):
            continue
        key = n.dtype.name
        if n.op == "dot" and n.operands and n.operands[0].op == "reduce-precision":
            key = "tf32"
        elif n.op in TENSOR_OPS and n.operands:
            key = n.operands[0].dtype.name
        c[key] += 1
    return dict(sorted(c.items()))


def fold_constant_casts(module: Module) -> Module:
    """Casts of constants done at compile time (device-forms): ``convert`` (and tf32's
    ``reduce-precision``) of a constant becomes the constant in the new type, computed by the reference
    semantics, so nothing reads the wide value and writes the narrow one at run time, and the narrow
    one is what the NEFF holds (a Relay model's fp32 weights cast to bf16 by --auto-cast: half the bytes
    a convolution or a dense loads)."""
    from nxsat.passes import rewrite_module

    casts = {n.id for n in module.entry.post_order()
             if n.op in ("convert", "reduce-precision") and n.operands and n.operands[0].op == "constant"
             and isinstance(n.type, TensorType) and n.type.shape}
    if not casts:
        return module

    def expand(rw: Any, node: Node, ops: list[Node], attrs: dict[str, Any]) -> Node | None:
        if node.id not in casts or ops[0].op != "constant":
            return None
        return folded(Node(node.op, [ops[0]], attrs, node.type), node)

    return rewrite_module(module, expand)


def folded(value: Node, like: Node | None = None) -> Node:
    """``value``, computed from constants alone, as a constant (named and placed as ``like``, else a new
    constant where ``value`` is), by the reference semantics: what the device would compute at run time,
    at compile time."""
    from nxsat.interpreter import Interpreter

    got = Interpreter().call(Computation("fold", [], value), [])
    name, loc = (like.name, like.loc) if like is not None else ("", value.loc)
    return Node("constant", [], {"value": np.asarray(got), "type": value.type}, value.type, name, loc)

"""The term language: how every IR operator appears in the e-graph.

One table (:data:`TERMS`) says, per operator, which egglog constructor stands for it, which
operands it takes (fixed ``T`` operands, optionally followed by a ``TList`` of the rest) and how
each attribute is spelled as egglog primitives (``i64``, ``String``, ``IVec`` = ``(Vec i64)``).
Loading, extraction, the rule checker and the documentation all read this table, so adding an
operator to the rewrite language is one entry here. Operators without an entry, and nodes whose
attributes the entry cannot spell, become ``(Opaque op key operands)``: the key points to a side
table holding the original attributes (sub-computations included), so they round-trip unchanged.

Constructor arguments are always operands first, then attributes, in HLO's order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from nxsat import dtypes as dt
from nxsat.attrs import ConvDims, DotDims, PadDim, SliceDim, WindowDim
from nxsat.ir import Computation, Node, TensorType

I64, STRING, IVEC = "i64", "String", "IVec"
T, TLIST = "T", "TList"


class NotRepresentable(Exception):
    """An attribute value the term's spelling cannot hold (the node then loads as Opaque)."""


@dataclass(frozen=True)
class Codec:
    """How one IR attribute becomes egglog slots and back."""

    sorts: tuple[str, ...]
    encode: Callable[[Any], tuple]
    decode: Callable[[tuple], Any]
    default: Any = None  # the value a missing attribute means
    has_default: bool = False


def _int(v: Any) -> tuple:
    if isinstance(v, bool) or not isinstance(v, int):
        raise NotRepresentable(v)
    return (v,)


def _dims(v: Any) -> tuple:
    if not isinstance(v, tuple | list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise NotRepresentable(v)
    return (tuple(v),)


def _dtype(v: Any) -> tuple:
    if not isinstance(v, dt.DType):
        raise NotRepresentable(v)
    return (v.name,)


def _opt_dtype(v: Any) -> tuple:
    return ("",) if v is None else _dtype(v)


def _opt_str(v: Any) -> tuple:
    if v is None:
        return ("",)
    if not isinstance(v, str) or not v or any(c in v for c in "\t\n\r"):
        raise NotRepresentable(v)
    return (v,)


def _dot_dims(v: Any) -> tuple:
    d = DotDims() if v is None else v
    if not isinstance(d, DotDims):
        raise NotRepresentable(v)
    return (tuple(d.lhs_contracting), tuple(d.rhs_contracting), tuple(d.lhs_batch), tuple(d.rhs_batch))


def _precision(v: Any) -> tuple:
    p = tuple(v or ())
    if len(p) == 0:
        return ("", "")
    if len(p) == 2 and all(isinstance(x, str) and x and "\t" not in x for x in p):
        return p
    raise NotRepresentable(v)


def _slice(v: Any) -> tuple:
    if not isinstance(v, tuple) or not all(isinstance(s, SliceDim) for s in v):
        raise NotRepresentable(v)
    return (tuple(s.start for s in v), tuple(s.limit for s in v), tuple(s.stride for s in v))


def _padding(v: Any) -> tuple:
    if not isinstance(v, tuple) or not all(isinstance(p, PadDim) for p in v):
        raise NotRepresentable(v)
    return (tuple(p.lo for p in v), tuple(p.hi for p in v), tuple(p.interior for p in v))


def _window(v: Any) -> tuple:
    """A window as seven vectors: sizes, strides, padding low and high, base and window dilation, reversal."""
    if not isinstance(v, tuple) or not all(isinstance(w, WindowDim) for w in v):
        raise NotRepresentable(v)
    return (tuple(w.size for w in v), tuple(w.stride for w in v), tuple(w.pad_lo for w in v),
            tuple(w.pad_hi for w in v), tuple(w.lhs_dilation for w in v), tuple(w.rhs_dilation for w in v),
            tuple(int(w.reversal) for w in v))


def _window_decode(s: tuple) -> tuple[WindowDim, ...]:
    return tuple(WindowDim(a, b, c, d, e, f, bool(g)) for a, b, c, d, e, f, g in zip(*s))


def _conv_dims(v: Any) -> tuple:
    """A convolution's dimension numbers as three label vectors: input (batch, feature, spatial...),
    kernel (input feature, output feature, spatial...), output (batch, feature, spatial...)."""
    if not isinstance(v, ConvDims):
        raise NotRepresentable(v)
    return ((v.input_batch, v.input_feature, *v.input_spatial),
            (v.kernel_input_feature, v.kernel_output_feature, *v.kernel_spatial),
            (v.output_batch, v.output_feature, *v.output_spatial))


def _conv_dims_decode(s: tuple) -> ConvDims:
    i, k, o = (tuple(x) for x in s)
    return ConvDims(i[0], i[1], i[2:], k[0], k[1], k[2:], o[0], o[1], o[2:])


def _tensor_type(v: Any) -> tuple:
    if not isinstance(v, TensorType):
        raise NotRepresentable(v)
    return (v.dtype.name, tuple(v.shape))


# The scalar bodies a Reduce term can spell: one binary operator of its two parameters, either order.
REDUCERS = ("add", "multiply", "maximum", "minimum", "and", "or", "xor")


def _reducer(v: Any) -> tuple:
    """(operator, element type) of a reduction body ``(a, b) -> a op b``; anything else stays Opaque."""
    if not isinstance(v, Computation) or len(v.params) != 2:
        raise NotRepresentable(v)
    root, (a, b) = v.root, v.params
    if root.op not in REDUCERS or len(root.operands) != 2 or {o.id for o in root.operands} != {a.id, b.id}:
        raise NotRepresentable(v)
    t = root.type
    if not isinstance(t, TensorType) or t.shape or a.type != t or b.type != t:
        raise NotRepresentable(v)
    return (root.op, t.dtype.name)


@cache
def reducer_body(op: str, dtype: str) -> Computation:
    """The canonical body of a Reduce term (one per operator and type, shared, so output is deterministic)."""
    if op not in REDUCERS:
        raise ValueError(f"no reducer {op!r}")
    t = TensorType(dt.by_name(dtype), ())
    a = Node("parameter", (), {"index": 0, "type": t}, t, "a")
    b = Node("parameter", (), {"index": 1, "type": t}, t, "b")
    root = Node(op, (a, b), {}, t, op)
    return Computation(f"reducer_{op}_{dtype}", [a, b], root, [a, b, root])


def number_text(f: float) -> str:
    """How the splat analysis spells a float: "0", "1", "-1", "0.5", "inf", "-inf", "nan", "-0"."""
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    if f.is_integer() and abs(f) < 2**53:
        return str(int(f))
    return repr(f)


def _number(v: Any) -> tuple:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise NotRepresentable(v)
    return (number_text(float(v)),)


INT = Codec((I64,), _int, lambda s: s[0])
COUNT = Codec((I64,), _int, lambda s: s[0], 1, True)  # a group count: 1 when absent
DIMS = Codec((IVEC,), _dims, lambda s: tuple(s[0]))
DTYPE = Codec((STRING,), _dtype, lambda s: dt.by_name(s[0]))
OPT_DTYPE = Codec((STRING,), _opt_dtype, lambda s: dt.by_name(s[0]) if s[0] else None, None, True)
OPT_STR = Codec((STRING,), _opt_str, lambda s: s[0] or None, None, True)
DOT_DIMS = Codec((IVEC, IVEC, IVEC, IVEC), _dot_dims, lambda s: DotDims(*map(tuple, s)), None, True)
PRECISION = Codec((STRING, STRING), _precision, lambda s: tuple(x for x in s if x), (), True)
SLICE = Codec((IVEC, IVEC, IVEC), _slice,
              lambda s: tuple(SliceDim(a, b, c) for a, b, c in zip(s[0], s[1], s[2])))
PADDING = Codec((IVEC, IVEC, IVEC), _padding,
                lambda s: tuple(PadDim(a, b, c) for a, b, c in zip(s[0], s[1], s[2])))
TENSOR_TYPE = Codec((STRING, IVEC), _tensor_type, lambda s: TensorType(dt.by_name(s[0]), tuple(s[1])))
REDUCER = Codec((STRING, STRING), _reducer, lambda s: reducer_body(s[0], s[1]))
WINDOW = Codec((IVEC,) * 7, _window, _window_decode)
CONV_DIMS = Codec((IVEC, IVEC, IVEC), _conv_dims, _conv_dims_decode)
NUMBER = Codec((STRING,), _number, lambda s: float(s[0]), 1.0, True)  # a float, spelled as splats are
EPSILON = Codec((STRING,), _number, lambda s: float(s[0]), 0.0, True)


@dataclass(frozen=True)
class Term:
    """One constructor of the term language."""

    ctor: str  # egglog constructor name
    op: str  # IR operator ("" for terms that are not one IR node: Fill, Opaque, list cells)
    operands: int = 0  # fixed T operands
    variadic: bool = False  # then a TList of the remaining operands
    attrs: tuple[tuple[str, Codec], ...] = ()
    slot_names: tuple[str, ...] = ()  # one name per egglog attribute slot (documentation)
    elementwise: bool = False  # result has the type of its first operand (or pred, see pred_result)
    pred_result: bool = False
    doc: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def sorts(self) -> tuple[str, ...]:
        """The egglog argument sorts, in order."""
        out = [T] * self.operands + ([TLIST] if self.variadic else [])
        for _key, codec in self.attrs:
            out.extend(codec.sorts)
        return tuple(out)

    @property
    def slot_sorts(self) -> tuple[str, ...]:
        return tuple(s for _k, c in self.attrs for s in c.sorts)

    def encode(self, attrs: dict[str, Any]) -> tuple:
        """The slot values of a node's attributes; NotRepresentable if something would be lost."""
        known = {k for k, _c in self.attrs} | set(self.extra.get("ignored", ()))
        if any(k not in known for k in attrs):
            raise NotRepresentable(sorted(set(attrs) - known))
        out: list[Any] = []
        for key, codec in self.attrs:
            if key in attrs:
                out.extend(codec.encode(attrs[key]))
            elif codec.has_default:
                out.extend(codec.encode(codec.default))
            else:
                raise NotRepresentable(key)
        return tuple(out)

    def decode(self, slots: Sequence[Any]) -> dict[str, Any]:
        """IR attributes from slot values."""
        out: dict[str, Any] = {}
        i = 0
        for key, codec in self.attrs:
            n = len(codec.sorts)
            out[key] = codec.decode(tuple(slots[i:i + n]))
            i += n
        return out

    def signature(self) -> str:
        """``(Transpose T IVec:dimensions) -> T``, for listings."""
        args = [T] * self.operands + ([f"{TLIST}:operands"] if self.variadic else [])
        args += [f"{s}:{n}" for s, n in zip(self.slot_sorts, self.slot_names)]
        return f"({self.ctor} {' '.join(args)})".replace(" )", ")")


def camel(op: str) -> str:
    return "".join(part.capitalize() for part in op.replace("_", "-").split("-"))


UNARY = ("abs", "negate", "sign", "ceil", "floor", "round-nearest-afz", "round-nearest-even", "exponential",
         "exponential-minus-one", "log", "log-plus-one", "logistic", "sqrt", "rsqrt", "cbrt", "tanh", "sine",
         "cosine", "tan", "erf", "not", "popcnt", "count-leading-zeros", "copy")
BINARY = ("add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "atan2", "and",
          "or", "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic")


def _terms() -> list[Term]:
    ts: list[Term] = []
    for name in UNARY:
        ts.append(Term(camel(name), name, 1, elementwise=True, doc=f"elementwise {name}"))
    ts.append(Term("IsFinite", "is-finite", 1, elementwise=True, pred_result=True, doc="elementwise is-finite"))
    for name in BINARY:
        ts.append(Term(camel(name), name, 2, elementwise=True, doc=f"elementwise {name}"))
    ts += [
        Term("Compare", "compare", 2, attrs=(("direction", OPT_STR), ("type", OPT_STR)),
             slot_names=("direction", "type"), elementwise=True, pred_result=True,
             doc="direction EQ NE LT LE GT GE; type \"\" (default), FLOAT, TOTALORDER, SIGNED, UNSIGNED"),
        Term("Select", "select", 3, doc="select(pred, on_true, on_false)"),
        Term("Clamp", "clamp", 3, doc="clamp(lo, x, hi)"),
        Term("ReducePrecision", "reduce-precision", 1, attrs=(("exponent_bits", INT), ("mantissa_bits", INT)),
             slot_names=("exponent_bits", "mantissa_bits"), elementwise=True, doc="round to a narrower float"),
        Term("Parameter", "parameter", 0, attrs=(("index", INT),), slot_names=("index",),
             extra={"ignored": ("type",)}, doc="input number index of the graph"),
        Term("Constant", "constant", 0, slot_names=("key",),
             doc="a literal, by key into the constant table (equal literals share a key)"),
        Term("Iota", "iota", 0, attrs=(("type", TENSOR_TYPE), ("iota_dimension", INT)),
             slot_names=("dtype", "shape", "iota_dimension"), doc="0, 1, 2, ... along iota_dimension"),
        Term("Broadcast", "broadcast", 1, attrs=(("shape", DIMS), ("dimensions", DIMS)),
             slot_names=("shape", "dimensions"), doc="operand dimension i becomes result dimension dimensions[i]"),
        Term("Reshape", "reshape", 1, attrs=(("shape", DIMS),), slot_names=("shape",), doc="row-major reshape"),
        Term("Bitcast", "bitcast", 1, attrs=(("shape", DIMS),), slot_names=("shape",),
             doc="layout-only reshape"),
        Term("Transpose", "transpose", 1, attrs=(("dimensions", DIMS),), slot_names=("dimensions",),
             doc="result dimension i is operand dimension dimensions[i]"),
        Term("Reverse", "reverse", 1, attrs=(("dimensions", DIMS),), slot_names=("dimensions",),
             elementwise=True, doc="reverses the listed dimensions"),
        Term("Slice", "slice", 1, attrs=(("slice", SLICE),), slot_names=("starts", "limits", "strides"),
             doc="static start:limit:stride per dimension"),
        Term("DynamicSlice", "dynamic-slice", 1, True, attrs=(("sizes", DIMS),), slot_names=("sizes",),
             doc="operand, then the start indices as a list"),
        Term("DynamicUpdateSlice", "dynamic-update-slice", 2, True,
             doc="operand, update, then the start indices as a list"),
        Term("Concatenate", "concatenate", 0, True, attrs=(("dimension", INT),), slot_names=("dimension",),
             doc="the operands as a list, along one dimension"),
        Term("Pad", "pad", 2, attrs=(("padding", PADDING),), slot_names=("lo", "hi", "interior"),
             doc="pad(x, value); negative lo/hi crop"),
        Term("Convert", "convert", 1, attrs=(("dtype", DTYPE),), slot_names=("dtype",),
             doc="element type conversion"),
        Term("BitcastConvert", "bitcast-convert", 1, attrs=(("dtype", DTYPE),), slot_names=("dtype",),
             doc="bit reinterpretation"),
        Term("Dot", "dot", 2, attrs=(("dims", DOT_DIMS), ("dtype", OPT_DTYPE), ("precision", PRECISION)),
             slot_names=("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch", "dtype",
                         "lhs_precision", "rhs_precision"),
             doc="general dot; result = batch, lhs free, rhs free; dtype \"\" = default"),
        Term("Convolution", "convolution", 2,
             attrs=(("window", WINDOW), ("dims", CONV_DIMS), ("feature_group_count", COUNT),
                    ("batch_group_count", COUNT), ("dtype", OPT_DTYPE), ("precision", PRECISION)),
             slot_names=("window_sizes", "strides", "pad_lo", "pad_hi", "lhs_dilation", "rhs_dilation", "reversal",
                         "input_labels", "kernel_labels", "output_labels", "feature_group_count",
                         "batch_group_count", "dtype", "lhs_precision", "rhs_precision"),
             doc="convolution(input, kernel); labels list the dimension of each role: input (batch, "
                 "feature, spatial...), kernel (input feature, output feature, spatial...), output (batch, "
                 "feature, spatial...); reversal 0/1 per spatial dimension; dtype \"\" = default"),
        Term("ReduceWindow", "reduce-window", 2,
             attrs=(("window", WINDOW), ("to_apply", REDUCER)),
             slot_names=("window_sizes", "strides", "pad_lo", "pad_hi", "lhs_dilation", "rhs_dilation", "reversal",
                         "reducer", "reducer_dtype"),
             doc="reduce-window(x, init) with one binary operator (pooling); multi-operand forms stay Opaque"),
        Term("Reduce", "reduce", 2, attrs=(("dimensions", DIMS), ("to_apply", REDUCER)),
             slot_names=("dimensions", "reducer", "reducer_dtype"),
             doc="reduce(x, init) over dimensions with one binary operator (add, maximum, ...) of type "
                 "reducer_dtype; other bodies and multi-operand reductions stay Opaque"),
        Term("Gelu", "gelu", 1, elementwise=True, doc="fused: GELU's erf form, x * Phi(x) (transformer rule set)"),
        Term("GeluTanh", "gelu-tanh", 1, elementwise=True, doc="fused: GELU's tanh form (transformer rule set)"),
        Term("Silu", "silu", 1, elementwise=True, doc="fused: x * logistic(x) (transformer rule set)"),
        Term("LayerNorm", "layer-norm", 1, attrs=(("epsilon", EPSILON),), slot_names=("epsilon",), elementwise=True,
             doc="fused: (x - mean) / sqrt(var + epsilon) over the last dimension (transformer rule set)"),
        Term("RmsNorm", "rms-norm", 1, attrs=(("epsilon", EPSILON),), slot_names=("epsilon",), elementwise=True,
             doc="fused: x / sqrt(mean(x^2) + epsilon) over the last dimension (transformer rule set)"),
        Term("GroupNorm", "group-norm", 1, attrs=(("groups", INT), ("epsilon", EPSILON)),
             slot_names=("groups", "epsilon"), elementwise=True,
             doc="fused: channels last, each (batch, group of channels) normalized over its positions and "
                 "channels (unet-inference rule set)"),
        Term("Softmax", "softmax", 1, attrs=(("dimension", INT), ("scale", NUMBER)), slot_names=("dimension", "scale"),
             elementwise=True, doc="fused: softmax of scale * x along dimension, scale spelled as splats are "
                                   "(\"1\", \"0.125\"); transformer rule set"),
        Term("Tuple", "tuple", 0, True, doc="groups values"),
        Term("GetTupleElement", "get-tuple-element", 1, attrs=(("index", INT),), slot_names=("index",),
             doc="element index of a tuple"),
    ]
    return ts


TERMS: dict[str, Term] = {t.op: t for t in _terms()}
BY_CTOR: dict[str, Term] = {t.ctor: t for t in TERMS.values()}

# Terms that are not one IR operator.
FILL = Term("Fill", "", 0, slot_names=("value", "dtype", "shape"),
            doc="a constant with every element = value (spelled as the splat analysis spells it); "
                "extracted as broadcast(constant)")
OPAQUE = Term("Opaque", "", 0, True, slot_names=("op", "key"),
              doc="any other node: op name, key into the attribute table, operands")
SPECIAL_SORTS = {"Constant": (I64,), "Fill": (STRING, STRING, IVEC), "Opaque": (STRING, I64)}
BY_CTOR["Fill"] = FILL
BY_CTOR["Opaque"] = OPAQUE

# Operators that must never be merged with an identical-looking node: each call draws new values or
# has effects, so the e-graph keys them by node, not by content.
NONDETERMINISTIC = frozenset({"rng", "custom-call", "infeed", "outfeed", "send", "recv", "send-done",
                              "recv-done", "after-all", "rng-get-and-update-state"})


def ctor_sorts(ctor: str) -> tuple[str, ...]:
    """Argument sorts of any constructor of sort T."""
    if ctor in SPECIAL_SORTS:
        base = SPECIAL_SORTS[ctor]
        return (*base, TLIST) if ctor == "Opaque" else base
    return BY_CTOR[ctor].sorts


def declarations() -> str:
    """egglog declarations of the term language (sorts and constructors)."""
    lines = [
        "(sort IVec (Vec i64))",
        "(sort IFn (UnstableFn (i64) i64))",
        "(sort T)",
        "(datatype TList (TNil) (TCons T TList))",
    ]
    for term in TERMS.values():
        if term.op == "constant":
            continue
        lines.append(f"(constructor {term.ctor} ({' '.join(term.sorts)}) T)")
    lines.append("(constructor Constant (i64) T)")
    lines.append("(constructor Fill (String String IVec) T)")
    lines.append("(constructor Opaque (String i64 TList) T)")
    return "\n".join(lines) + "\n"


# --- element-type facts (generated from nxsat.dtypes, so they cannot disagree with it) ---------

def _float_bits(d: dt.DType) -> tuple[int, int]:
    """(exponent bits, mantissa bits) of a float type."""
    return {"f16": (5, 10), "bf16": (8, 7), "f32": (8, 23), "f64": (11, 52), "f8e4m3fn": (4, 3),
            "f8e5m2": (5, 2)}[d.name]


def lossless(a: dt.DType, b: dt.DType) -> bool:
    """Does converting a to b keep every value of a exactly (so a second conversion sees the same value)?
    Seeing the same value is not always enough: see :func:`transparent`."""
    if a is b:
        return True
    if a.is_pred:
        return True  # 0 and 1 are exact in every type, and x != 0 brings them back
    if b.is_pred:
        return False
    if a.is_float:
        if not b.is_float:
            return False
        ea, ma = _float_bits(a)
        eb, mb = _float_bits(b)
        return eb >= ea and mb >= ma
    if b.is_float:
        _e, mb = _float_bits(b)
        value_bits = a.bits - (1 if a.kind == "int" else 0)  # magnitude bits; -2^k is exact anyway
        return mb + 1 >= value_bits
    if a.kind == b.kind:
        return b.bits >= a.bits
    if a.kind == "uint" and b.kind == "int":
        return b.bits > a.bits
    return False


def transparent(a: dt.DType, b: dt.DType) -> bool:
    """Is converting a to b invisible to any later conversion: lossless, and a later conversion treats
    the b value as it would the a value? Not so from integers to floats: float-to-integer conversion
    saturates while integer-to-integer conversion wraps (s32 -> f64 -> s8 clamps, s32 -> s8 wraps)."""
    if not lossless(a, b):
        return False
    return a.is_pred or a is b or (a.is_float and b.is_float) or (a.is_int and b.is_int)


def dtype_facts() -> str:
    """Relations over element-type names that rule guards use."""
    lines = [
        "(relation float-type (String))",
        "(relation int-type (String))",
        "(relation signed-int-type (String))",
        "(relation pred-type (String))",
        "(relation signed-type (String))",
        "(relation lossless-convert (String String))",
        "(relation transparent-convert (String String))",
        "(relation rank-dim (i64 i64))",
    ]
    for d in dt.ALL:
        if d.is_signed:
            lines.append(f'(signed-type "{d.name}")')
        if d.is_float:
            lines.append(f'(float-type "{d.name}")')
        elif d.is_int:
            lines.append(f'(int-type "{d.name}")')
            if d.kind == "int":
                lines.append(f'(signed-int-type "{d.name}")')
        else:
            lines.append(f'(pred-type "{d.name}")')
    for a in dt.ALL:
        for b in dt.ALL:
            if a is not b and lossless(a, b):
                lines.append(f'(lossless-convert "{a.name}" "{b.name}")')
            if a is not b and transparent(a, b):
                lines.append(f'(transparent-convert "{a.name}" "{b.name}")')
    for r in range(MAX_RANK + 1):
        for d in range(r):
            lines.append(f"(rank-dim {r} {d})")
    return "\n".join(lines) + "\n"


# Ranks the rank-dim relation enumerates (rules that quantify over a dimension see ranks up to this).
MAX_RANK = 12

"""What every Relay operator lowering shares: the emitter (IR building with Relay's implicit rules
made explicit), typed attribute access, and the table from Relay operator names to lowerings.

A lowering is ``fn(em, call) -> Value``: it reads ``call.args`` (IR nodes or Python tuples of
values) and ``call.attrs``, builds IR through ``em`` (so every node is type-checked by the registry
and carries the call's source location), and returns the Relay value. The table is filled by
:mod:`relay_tensor` (tensor, shape, reduction, indexing operators) and :mod:`relay_nn` (``nn.*``);
Relay operators that are a 1:1 elementwise match of an IR operator come from the registry's
``relay`` spellings, so the registry stays the one place that names them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import Loc, NxsatError, error
from nxsat.ir import SHAPE_LIMITS_HINT, Computation, Node, TensorType, TupleType, Type, type_limit_problem
from nxsat.ops import registry

# A Relay value during lowering: an IR node (tensor, or tuple-typed such as a call's result) or a
# Relay tuple kept as a Python tuple so projections need no IR nodes.
Value: TypeAlias = Node | tuple["Value", ...]

_REQUIRED = object()


def value_type(v: Value) -> Type:
    """The Relay type of a value, as an IR type."""
    if isinstance(v, tuple):
        return TupleType(tuple(value_type(e) for e in v))
    return v.type


def relay_type_str(t: Type) -> str:
    """A type spelled the way Relay prints it (``Tensor[(1, 3), float32]``, a scalar ``float32``),
    for messages."""
    if isinstance(t, TupleType):
        inner = ", ".join(relay_type_str(e) for e in t.elements)
        return f"({inner},)" if len(t.elements) == 1 else f"({inner})"
    if not t.shape:
        return t.dtype.relay
    dims = ", ".join(map(str, t.shape))
    return f"Tensor[({dims}), {t.dtype.relay}]"


def relay_dtype(name: str, loc: Loc | None, what: str = "dtype") -> dt.DType:
    """The IR element type of a Relay dtype name; coded errors for unknown or unsupported ones."""
    try:
        d = dt.by_relay(name)
    except KeyError:
        d = None
    if d is not None:
        if not d.storage:
            raise error("NCC_ESPP004", f"{what} {name} is a compute precision, not a storage type", loc)
        return d
    base = name.split("x")[0] if "x" in name and name[-1].isdigit() and "float8" not in name else name
    if base != name and base in {t.relay for t in dt.ALL}:
        raise error("NCC_ESPP004", f"vector {what} {name} is not supported", loc, "use the scalar type")
    if name.startswith(("int", "uint", "float", "bfloat", "custom")) or name in (
        "e4m3_float8",
        "e5m2_float8",
    ):
        raise error(
            "NCC_ESPP004",
            f"{what} {name} is not supported",
            loc,
            "supported: " + ", ".join(t.relay for t in dt.ALL),
        )
    raise error("NCC_EPRS003", f"unknown {what} {name!r}", loc)


def normalize_axis(axis: int, rank: int, loc: Loc | None, what: str = "axis", extra: int = 0) -> int:
    """A Relay axis (negative counts from the end) as an index in ``0..rank-1+extra``."""
    n = rank + extra
    a = axis + n if axis < 0 else axis
    if not 0 <= a < n:
        raise error("NCC_EVRF064", f"{what} {axis} is out of range for a tensor of rank {rank}", loc)
    return a


# --- attributes ------------------------------------------------------------------------------


class Attrs:
    """A call's ``key=value`` attributes with typed access. Every attribute given must be read by
    the lowering (``finish`` reports the rest), so a misspelled or unsupported one is an error."""

    def __init__(self, op: str, items: dict[str, Any], locs: dict[str, Loc], loc: Loc | None) -> None:
        self.op = op
        self.items = items
        self.locs = locs
        self.loc = loc
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def _bad(self, key: str, want: str) -> NxsatError:
        return error(
            "NCC_EPRS003",
            f"{self.op}: attribute {key} must be {want}, got {self.items[key]!r}",
            self.locs.get(key, self.loc),
        )

    def _get(self, key: str, default: Any) -> Any:
        self.used.add(key)
        if key not in self.items:
            if default is _REQUIRED:
                raise error("NCC_EPRS003", f"{self.op} needs the attribute {key}", self.loc)
            return default
        return self.items[key]

    def raw(self, key: str, default: Any = None) -> Any:
        return self._get(key, default)

    def int(self, key: str, default: Any = _REQUIRED) -> Any:
        v = self._get(key, default)
        if key in self.items and (not isinstance(v, int) or isinstance(v, bool)):
            raise self._bad(key, "an integer")
        return v

    def opt_int(self, key: str) -> int | None:
        v = self._get(key, None)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise self._bad(key, "an integer or None")
        return v

    def float(self, key: str, default: Any = _REQUIRED) -> Any:
        v = self._get(key, default)
        if key in self.items:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise self._bad(key, "a number")
            return float(v)
        return v

    def bool(self, key: str, default: Any = _REQUIRED) -> Any:
        v = self._get(key, default)
        if key in self.items:
            if isinstance(v, bool):
                return v
            if isinstance(v, int) and v in (0, 1):
                return bool(v)
            raise self._bad(key, "True or False")
        return v

    def str(self, key: str, default: Any = _REQUIRED) -> Any:
        v = self._get(key, default)
        if key in self.items and not isinstance(v, str):
            raise self._bad(key, "a string")
        return v

    def ints(self, key: str, default: Any = _REQUIRED, length: int | None = None, scalar_ok: bool = True) -> Any:
        """A list of integers (a single integer counts as a one-element list when ``scalar_ok``)."""
        v = self._get(key, default)
        if key not in self.items:
            return v
        if v is None:
            raise self._bad(key, "a list of integers")
        if isinstance(v, int) and not isinstance(v, bool) and scalar_ok:
            v = [v]
        if not isinstance(v, list) or not all(isinstance(e, int) and not isinstance(e, bool) for e in v):
            raise self._bad(key, "a list of integers")
        if length is not None and len(v) != length:
            raise error(
                "NCC_EPRS003",
                f"{self.op}: attribute {key} needs {length} values, got {len(v)}",
                self.locs.get(key, self.loc),
            )
        return tuple(v)

    def ints_or_none(self, key: str) -> tuple[int | None, ...]:
        """A required list whose entries are integers or None (strided_slice's ``begin=[None, 1]``:
        TVM's "from the start" / "to the end")."""
        v = self._get(key, _REQUIRED)
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, list) or not all(e is None or (isinstance(e, int) and not isinstance(e, bool)) for e in v):
            raise self._bad(key, "a list of integers (or None)")
        return tuple(v)

    def opt_ints(self, key: str, length: int | None = None) -> tuple[int, ...] | None:
        if self.items.get(key, None) is None:
            self.used.add(key)
            return None
        return self.ints(key, None, length)

    def nested_ints(self, key: str) -> tuple[tuple[int, ...], ...]:
        v = self._get(key, _REQUIRED)
        if not isinstance(v, list) or not all(
            isinstance(row, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in row) for row in v
        ):
            raise self._bad(key, "a list of integer lists")
        return tuple(tuple(row) for row in v)

    def dtype(self, key: str, default: dt.DType | None = None) -> dt.DType | None:
        """A dtype attribute; an empty string (Relay's "same as the input") gives ``default``."""
        v = self._get(key, None)
        if v is None or v == "":
            return default
        if not isinstance(v, str):
            raise self._bad(key, "a dtype string")
        return relay_dtype(v, self.locs.get(key, self.loc), f"{self.op} {key}")

    def finish(self) -> None:
        extra = sorted(set(self.items) - self.used)
        if extra:
            raise error(
                "NCC_EPRS003",
                f"{self.op} has no attribute {extra[0]}",
                self.locs.get(extra[0], self.loc),
                "known attributes: " + (", ".join(sorted(self.used)) or "none"),
            )


# --- calls -----------------------------------------------------------------------------------


@dataclass
class Call:
    """One Relay operator call being lowered."""

    op: str
    args: list[Value]
    attrs: Attrs
    loc: Loc | None

    def arity(self, lo: int, hi: int | None = None) -> None:
        hi = lo if hi is None else hi
        n = len(self.args)
        if n < lo or n > hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise error("NCC_EVRF064", f"{self.op} takes {want} argument{'s' if hi != 1 else ''}, got {n}", self.loc)

    def tensor(self, i: int) -> Node:
        v = self.args[i]
        if isinstance(v, tuple) or not isinstance(v.type, TensorType):
            raise error(
                "NCC_EVRF064",
                f"{self.op}: argument {i} must be a tensor, got {relay_type_str(value_type(v))}",
                self.loc,
            )
        return v

    def tensors(self, n: int, hi: int | None = None) -> list[Node]:
        self.arity(n, hi)
        return [self.tensor(i) for i in range(len(self.args))]

    def tensor_list(self, i: int) -> list[Node]:
        """A tuple argument (``concatenate((%a, %b))``) as its tensors."""
        v = self.args[i]
        if isinstance(v, Node) and isinstance(v.type, TupleType):
            raise error(
                "NCC_EVRF064",
                f"{self.op}: argument {i} must be a tuple written in the text "
                "(a tuple-typed call result is not supported here)",
                self.loc,
            )
        if not isinstance(v, tuple):
            raise error(
                "NCC_EVRF064",
                f"{self.op}: argument {i} must be a tuple of tensors, got {relay_type_str(value_type(v))}",
                self.loc,
            )
        out = []
        for e in v:
            if isinstance(e, tuple) or not isinstance(e.type, TensorType):
                raise error("NCC_EVRF064", f"{self.op}: tuple elements must be tensors", self.loc)
            out.append(e)
        if not out:
            raise error("NCC_EVRF064", f"{self.op} needs at least one tensor", self.loc)
        return out


Lowering = Callable[["Emitter", Call], Value]
_TABLE: dict[str, tuple[Lowering, str]] = {}


def lowering(*names: str, notes: str) -> Callable[[Lowering], Lowering]:
    """Register ``fn`` as the lowering of the Relay operators ``names``; ``notes`` says what it
    becomes in the IR (``nxsat list-operators --framework RELAY`` prints it)."""

    def wrap(fn: Lowering) -> Lowering:
        for n in names:
            if n in _TABLE:
                raise ValueError(f"Relay operator {n} lowered twice")
            _TABLE[n] = (fn, notes)
        return fn

    return wrap


_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        from nxsat.frontend import relay_nn, relay_tensor  # noqa: F401  (fill the table)


@functools.lru_cache(maxsize=1)
def _registry_spellings() -> dict[str, registry.OpDef]:
    """Relay spellings the registry declares for 1:1 elementwise operators."""
    out: dict[str, registry.OpDef] = {}
    for opdef in registry.all_ops():
        if opdef.arity in ((1, 1), (2, 2)) and opdef.impl is not None:
            for name in opdef.relay:
                if name[:1].islower():  # TupleGetItem and the like are Relay syntax, not operators
                    out.setdefault(name, opdef)
    return out


def find_lowering(name: str) -> Lowering | None:
    """The lowering of a Relay operator, or None when nxsat does not support it."""
    _load()
    entry = _TABLE.get(name)
    if entry is not None:
        return entry[0]
    opdef = _registry_spellings().get(name)
    if opdef is None:
        return None
    return _unary(opdef.name) if opdef.arity == (1, 1) else _binary(opdef.name)


def supported_operators() -> dict[str, str]:
    """Every Relay operator the front end lowers, with what it becomes in the IR."""
    _load()
    rows = {name: notes for name, (_, notes) in _TABLE.items()}
    for name, opdef in _registry_spellings().items():
        rows.setdefault(name, opdef.name + (" (broadcast operands)" if opdef.arity == (2, 2) else ""))
    return dict(sorted(rows.items()))


def _unary(op: str) -> Lowering:
    def lower(em: Emitter, call: Call) -> Value:
        (x,) = call.tensors(1)
        return em.op(op, [x])

    return lower


def _binary(op: str) -> Lowering:
    def lower(em: Emitter, call: Call) -> Value:
        a, b = call.tensors(2)
        return em.binary(op, a, b)

    return lower


# --- the emitter -----------------------------------------------------------------------------

_REDUCER_OPS = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum", "and": "and", "or": "or"}


class Emitter:
    """Builds IR for one Relay computation with Relay's implicit rules made explicit."""

    def __init__(
        self, builder: Builder, computations: dict[tuple[str, str], Computation], loc: Loc | None = None
    ) -> None:
        self.b = builder
        self.loc = loc
        self._reducers = computations  # shared across the module: one body per (kind, dtype)

    def fail(self, code: str, message: str, hint: str | None = None) -> NxsatError:
        return error(code, message, self.loc, hint)

    # basic nodes
    def op(self, name: str, operands: Sequence[Node] = (), **attrs: Any) -> Node:
        """Add one IR node; a result beyond the shape limits (a ``reshape``, ``tile`` or ``zeros``
        of absurd size) is the user's error here, not the interpreter's later."""
        node = self.b.op(name, list(operands), loc=self.loc, **attrs)
        problem = type_limit_problem(node.type)
        if problem:
            raise error("NCC_ESHP001", f"this call makes {problem}", self.loc, SHAPE_LIMITS_HINT)
        return node

    def const(self, value: Any, dtype: dt.DType) -> Node:
        return self.b.constant(dt.cast(np.asarray(value), dtype), dtype, loc=self.loc)

    def full(self, value: Any, dtype: dt.DType, shape: Sequence[int]) -> Node:
        """``value`` broadcast to ``shape`` (a scalar constant and one broadcast)."""
        s = self.const(value, dtype)
        return self.broadcast_in_dim(s, tuple(shape), ())

    def broadcast_in_dim(self, x: Node, shape: tuple[int, ...], dims: tuple[int, ...]) -> Node:
        if x.shape == shape and dims == tuple(range(len(shape))):
            return x
        return self.op("broadcast", [x], shape=tuple(shape), dimensions=tuple(dims))

    def reshape(self, x: Node, shape: Sequence[int]) -> Node:
        shape = tuple(int(s) for s in shape)
        return x if x.shape == shape else self.op("reshape", [x], shape=shape)

    def transpose(self, x: Node, perm: Sequence[int]) -> Node:
        perm = tuple(perm)
        return x if perm == tuple(range(len(perm))) else self.op("transpose", [x], dimensions=perm)

    def convert(self, x: Node, dtype: dt.DType) -> Node:
        return x if x.dtype is dtype else self.op("convert", [x], dtype=dtype)

    # Relay's implicit broadcasting
    def broadcast_shape(self, *shapes: tuple[int, ...]) -> tuple[int, ...]:
        rank = max(len(s) for s in shapes)
        out = []
        for i in range(rank):
            dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
            dims.discard(1)
            if len(dims) > 1:
                raise self.fail(
                    "NCC_EVRF064",
                    "shapes " + " and ".join(str(list(s)) for s in shapes) + " do not broadcast",
                )
            out.append(dims.pop() if dims else 1)
        return tuple(out)

    def broadcast_to(self, x: Node, shape: tuple[int, ...]) -> Node:
        """Numpy-style broadcasting made explicit: size-1 dimensions that expand are reshaped away,
        then one broadcast places the rest (the form XLA's HLO uses)."""
        shape = tuple(shape)
        if x.shape == shape:
            return x
        offset = len(shape) - len(x.shape)
        if offset < 0:
            raise self.fail("NCC_EVRF064", f"cannot broadcast {list(x.shape)} to {list(shape)}")
        keep = []
        for i, n in enumerate(x.shape):
            if n == shape[offset + i]:
                keep.append(i)
            elif n != 1:
                raise self.fail("NCC_EVRF064", f"cannot broadcast {list(x.shape)} to {list(shape)}")
        x = self.reshape(x, [x.shape[i] for i in keep])
        return self.broadcast_in_dim(x, shape, tuple(offset + i for i in keep))

    def same_dtype(self, what: str, *xs: Node) -> dt.DType:
        d = xs[0].dtype
        for x in xs[1:]:
            if x.dtype is not d:
                raise self.fail(
                    "NCC_EVRF064",
                    f"{what}: operand types differ (" + ", ".join(x.dtype.relay for x in xs) + ")",
                    "insert a cast so both operands have one dtype",
                )
        return d

    def binary(self, op: str, a: Node, b: Node, **attrs: Any) -> Node:
        self.same_dtype(op if op != "compare" else f"compare {attrs.get('direction')}", a, b)
        shape = self.broadcast_shape(a.shape, b.shape)
        return self.op(op, [self.broadcast_to(a, shape), self.broadcast_to(b, shape)], **attrs)

    def compare(self, direction: str, a: Node, b: Node) -> Node:
        return self.binary("compare", a, b, direction=direction)

    def select(self, pred: Node, a: Node, b: Node) -> Node:
        if pred.dtype is not dt.PRED:
            raise self.fail("NCC_EVRF064", f"condition must be bool, got {pred.dtype.relay}")
        self.same_dtype("where", a, b)
        shape = self.broadcast_shape(pred.shape, a.shape, b.shape)
        return self.op(
            "select",
            [self.broadcast_to(pred, shape), self.broadcast_to(a, shape), self.broadcast_to(b, shape)],
        )

    def scalar_binary(self, op: str, x: Node, value: Any) -> Node:
        """``x op value`` with the scalar in x's dtype."""
        return self.binary(op, x, self.const(value, x.dtype))

    # reductions
    def identity(self, kind: str, d: dt.DType) -> Any:
        if kind == "add" or kind == "or":
            return 0
        if kind == "mul" or kind == "and":
            return 1
        if d.is_pred:
            return kind == "min"
        if d.is_float:
            return -np.inf if kind == "max" else np.inf
        info = np.iinfo(d.np)
        return info.min if kind == "max" else info.max

    def body(self, kind: str, d: dt.DType, make: Callable[[Builder], Node]) -> Computation:
        """The sub-computation ``relay_<kind>_<dtype>``, built by ``make`` once per module (so
        every reduction of one kind and type shares one body)."""
        key = (kind, d.name)
        comp = self._reducers.get(key)
        if comp is None:
            sub = Builder(f"relay_{kind}_{d.name}", self.loc)
            comp = sub.build(make(sub))
            self._reducers[key] = comp
        return comp

    def reducer(self, kind: str, d: dt.DType) -> Computation:
        """The scalar body ``(a, b) -> a op b``."""
        return self.body(
            kind, d, lambda sub: sub.op(_REDUCER_OPS[kind], [sub.param(d, (), "a"), sub.param(d, (), "b")])
        )

    def reduce(self, x: Node, axes: Sequence[int], kind: str) -> Node:
        axes = tuple(sorted(set(axes)))
        if not axes:
            return x
        init = self.const(self.identity(kind, x.dtype), x.dtype)
        return self.op("reduce", [x, init], dimensions=axes, to_apply=self.reducer(kind, x.dtype))

    def keep_dims(self, r: Node, shape: tuple[int, ...], axes: Sequence[int]) -> Node:
        """The reduced result reshaped with size-1 dimensions where ``axes`` were."""
        return self.reshape(r, [1 if i in set(axes) else n for i, n in enumerate(shape)])

    def mean(self, x: Node, axes: Sequence[int], keepdims: bool = False) -> Node:
        count = math.prod(x.shape[a] for a in axes)
        r = self.reduce(x, axes, "add")
        if count != 1:
            r = self.scalar_binary("divide", r, count)
        return self.keep_dims(r, x.shape, axes) if keepdims else r

    def along(self, v: Node, shape: tuple[int, ...], axis: int) -> Node:
        """A rank-1 ``v`` broadcast along ``axis`` of ``shape`` (per-channel parameters)."""
        if len(v.shape) != 1 or v.shape[0] != shape[axis]:
            raise self.fail(
                "NCC_EVRF064",
                f"expected a vector of {shape[axis]} values for axis {axis} of {list(shape)}, got {list(v.shape)}",
            )
        return self.broadcast_in_dim(v, shape, (axis,))

"""The reference interpreter: runs any IR graph with the registry's numpy implementations.

It is the oracle of every equivalence test, so it is plain: evaluate nodes in post-order, check
each result against the node's declared type, and free values after their last use so that
large models fit in memory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from nxsat.diagnostics import NxsatError, Warnings, error
from nxsat.ir import Computation, Module, Node, TensorType, TupleType, Type
from nxsat.ops import registry
from nxsat.ops.common import to_dtype
from nxsat.progress import Progress

PROGRESS_EVERY = 16  # entry nodes between progress updates (an update is a clock read at most)


class _Frame:
    """What an implementation sees as ``ctx``: the node being run and the interpreter."""

    __slots__ = ("node", "interp")

    def __init__(self, interp: Interpreter, node: Node) -> None:
        self.interp = interp
        self.node = node

    def call(self, comp: Computation, args: Sequence[Any]) -> Any:
        return self.interp.call(comp, list(args))

    def warn(self, code: str, message: str) -> None:
        self.interp.warnings.warn(code, message, self.node.loc)


def host_memory_bytes() -> int:
    """Physical memory of this machine (64 GiB when the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 64 << 30


class Interpreter:
    """Runs computations of one module. ``check_types`` verifies every result (on by default).

    A value larger than ``max_value_bytes`` (default: the host's physical memory) is refused with
    NCC_EOOM002 before it is computed: numpy would otherwise fail late, or the OS would kill the
    process while the pages are touched.
    """

    def __init__(self, warnings: Warnings | None = None, check_types: bool = True,
                 max_value_bytes: int | None = None) -> None:
        self.warnings = warnings if warnings is not None else Warnings()
        self.check_types = check_types
        self.max_value_bytes = max_value_bytes if max_value_bytes is not None else host_memory_bytes()
        self._orders: dict[int, tuple[list[Node], dict[int, int]]] = {}

    def _plan(self, comp: Computation) -> tuple[list[Node], dict[int, int]]:
        key = id(comp)
        if key not in self._orders:
            order = comp.post_order()
            last_use: dict[int, int] = {}
            for i, n in enumerate(order):
                for o in n.operands:
                    last_use[o.id] = i
            last_use[comp.root.id] = len(order)
            self._orders[key] = (order, last_use)
        return self._orders[key]

    def call(self, comp: Computation, args: list[Any], progress: Progress | None = None) -> Any:
        """Run ``comp`` on ``args``; ``progress`` (the entry's run only) counts its nodes as they finish."""
        if len(args) != len(comp.params):
            raise error("NCC_EEXE001", f"{comp.name} takes {len(comp.params)} arguments, got {len(args)}",
                        comp.loc)
        order, last_use = self._plan(comp)
        values: dict[int, Any] = {p.id: a for p, a in zip(comp.params, args)}
        lanes = _applied_to_arrays(comp, args)
        tick = progress.update if progress is not None and progress.enabled else None
        with np.errstate(all="ignore"):
            for i, node in enumerate(order):
                if node.op != "parameter":
                    values[node.id] = self.run_node(node, [values[o.id] for o in node.operands], lanes)
                for o in node.operands:
                    if last_use.get(o.id) == i:
                        values.pop(o.id, None)
                if tick is not None and i % PROGRESS_EVERY == 0:
                    tick(i + 1)
        return values[comp.root.id]

    def run_node(self, node: Node, args: list[Any], lanes: bool = False) -> Any:
        """Run one node on its operand values; the result is checked against the node's type."""
        opdef = registry.get(node.op)
        if opdef is None or opdef.impl is None:
            raise error("NCC_EUOC002", f"operator {node.op} has no reference implementation", node.loc)
        if node.type.nbytes > self.max_value_bytes:
            raise error("NCC_EOOM002", f"{node.op} at {node.name} makes a {node.type} value of "
                        f"{_gib(node.type.nbytes)}, more than the {_gib(self.max_value_bytes)} the reference "
                        "interpreter may use on this host", node.loc, "run it on a host with more memory")
        try:
            out = opdef.impl(args, node.attrs, _Frame(self, node))
            if lanes and isinstance(node.type, TensorType) and node.shape == () and not isinstance(out, tuple) \
                    and not any(isinstance(a, tuple) for a in args) \
                    and np.shape(out) != np.broadcast_shapes(*(np.shape(a) for a in args)):
                raise ValueError(f"{node.op} is not elementwise over lanes")  # a dot of two scalars: lane by lane
        except NxsatError:
            raise
        except MemoryError:
            raise error("NCC_EOOM002", f"the host ran out of memory computing {node.op} at {node.name} "
                        f"({node.type})", node.loc, "run it on a host with more memory") from None
        except Exception as exc:  # a bug in an implementation: say where, keep the cause for --debug
            out = self._lane_by_lane(opdef, node, args) if lanes and isinstance(node.type, TensorType) else None
            if out is None:
                raise error("NCC_IINT001", f"reference implementation of {node.op} failed at {node.name}: "
                            f"{type(exc).__name__}: {exc}", node.loc, "please report this with the model") from exc
        return self._conform(out, node.type, node, lanes) if self.check_types else out

    def _lane_by_lane(self, opdef: Any, node: Node, args: list[Any]) -> np.ndarray | None:
        """A scalar operator that is not elementwise (a ``dot`` of two scalars in a reducer) given whole
        arrays of lanes (:func:`_applied_to_arrays`): run once per lane. None if it fails there too."""
        if any(isinstance(a, tuple) for a in args):
            return None
        arrays = np.broadcast_arrays(*[np.asarray(a) for a in args])
        out = np.empty(arrays[0].shape, dtype=node.tensor.dtype.np)
        try:
            for idx in np.ndindex(out.shape):
                out[idx] = opdef.impl([a[idx] for a in arrays], node.attrs, _Frame(self, node))
        except Exception:
            return None
        return out

    def _conform(self, value: Any, t: Type, node: Node, lanes: bool = False) -> Any:
        if isinstance(t, TupleType):
            if not isinstance(value, tuple) or len(value) != len(t.elements):
                raise error("NCC_IINT001", f"{node.op} at {node.name} returned {type(value).__name__}, "
                            f"expected a {len(t.elements)}-tuple", node.loc)
            return tuple(self._conform(v, e, node, lanes) for v, e in zip(value, t.elements))
        a = np.asarray(value)
        if a.dtype != t.dtype.np:
            a = to_dtype(a, t.dtype)
        if a.shape != t.shape and not (lanes and t.shape == ()):
            raise error("NCC_IINT001", f"{node.op} at {node.name} computed shape {list(a.shape)}, "
                        f"declared {t}", node.loc)
        return a


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def _applied_to_arrays(comp: Computation, args: Sequence[Any]) -> bool:
    """A scalar computation (a reduce body, a comparator, a mapped function) given whole arrays:
    its operators are elementwise, so one run over the arrays computes every lane at once; its
    scalar values may then hold arrays."""
    if not all(t.shape == () for p in comp.params for t in p.type.leaves()):
        return False
    return any(np.ndim(a) > 0 for a in flatten(tuple(args)))


def flatten(value: Any) -> list[np.ndarray]:
    """Tuple results flattened depth-first: the order of ``out0``, ``out1``, ..."""
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten(v)]
    return [np.asarray(value)]


def run_module(module: Module, inputs: Sequence[np.ndarray], warnings: Warnings | None = None,
               progress: Progress | None = None) -> list[np.ndarray]:
    """Run the entry computation on inputs given in parameter order; returns the flattened outputs.
    ``progress`` shows a "run" stage counting the entry's instructions (see nxsat.progress)."""
    params = module.entry.params
    if len(inputs) != len(params):
        raise error("NCC_EINP001", f"{module.name} takes {len(params)} inputs, got {len(inputs)}")
    args = []
    for p, x in zip(params, inputs):
        t = p.type
        if isinstance(t, TensorType) and tuple(np.shape(x)) != t.shape:
            raise error("NCC_EINP001", f"input for parameter {p.name} has shape {list(np.shape(x))}, "
                        f"expected {t}", p.loc)
        args.append(x)
    interp = Interpreter(warnings if warnings is not None else module.warnings)
    if progress is not None:
        progress.stage("run", total=len(interp._plan(module.entry)[0]), unit="instructions")
    return flatten(interp.call(module.entry, args, progress))

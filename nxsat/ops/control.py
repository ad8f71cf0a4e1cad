"""Structured control flow and calls: call, fusion, map, while, conditional, custom-call.

The compiler removes these before the e-graph (calls are inlined, conditionals if-converted,
while loops with a static trip count unrolled); the reference interpreter runs them as written.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import error
from nxsat.ir import Computation, TensorType, TupleType, Type
from nxsat.ops.common import tensor, tensors
from nxsat.ops.registry import CONTROL, NONE, UNSUPPORTED, ShapeError, op

# The interpreter refuses to run a loop longer than this (a model's loops are short; a runaway
# loop in bad input must end with a diagnostic, not a hang).
MAX_WHILE_ITERATIONS = 1_000_000


def _computation(attrs: dict, key: str, name: str) -> Computation:
    c = attrs.get(key)
    if not isinstance(c, Computation):
        raise ShapeError(f"{name} needs a computation for {key}")
    return c


def _check_call(comp: Computation, types: list[Type], name: str) -> None:
    if len(comp.params) != len(types):
        raise ShapeError(f"{name}: {comp.name} takes {len(comp.params)} arguments, got {len(types)}")
    for i, (p, t) in enumerate(zip(comp.param_types, types)):
        if p != t:
            raise ShapeError(f"{name}: argument {i} is {t}, {comp.name} expects {p}")


def _call_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    return ctx.call(attrs["to_apply"], args)


def _call_rule(name: str) -> Any:
    def infer(types: list[Type], attrs: dict) -> Type:
        comp = _computation(attrs, "to_apply", name)
        _check_call(comp, types, name)
        return comp.result_type

    return infer


op("call", engine=CONTROL, impl=_call_impl, notes="inlined by the compiler")(_call_rule("call"))
op("fusion", engine=CONTROL, impl=_call_impl,
   notes="an already-fused computation; inlined and re-fused by nxsat")(_call_rule("fusion"))


def _map_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    # A scalar computation applied elementwise: run it once over whole arrays.
    out = ctx.call(attrs["to_apply"], args)
    return np.broadcast_to(out, args[0].shape).copy() if np.ndim(out) == 0 else out


@op("map", engine=CONTROL, impl=_map_impl, notes="a scalar computation applied elementwise")
def _map(types: list[Type], attrs: dict) -> Type:
    comp = _computation(attrs, "to_apply", "map")
    ts = tensors(types)
    if not ts or any(t.shape != ts[0].shape for t in ts):
        raise ShapeError("map: operands must share one shape")
    _check_call(comp, [TensorType(t.dtype, ()) for t in ts], "map")
    r = tensor(comp.result_type, "map result")
    return TensorType(r.dtype, ts[0].shape)


def _while_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    cond, body = attrs["condition"], attrs["body"]
    state = args[0]
    for _ in range(MAX_WHILE_ITERATIONS):
        if not bool(np.asarray(ctx.call(cond, [state]))):
            return state
        state = ctx.call(body, [state])
    raise error("NCC_EEXE001", f"while loop {ctx.node.name} ran over {MAX_WHILE_ITERATIONS} iterations",
                ctx.node.loc)


@op("while", engine=CONTROL, arity=(1, 1), impl=_while_impl, neuron=("While",),
    notes="run as a loop; unrolled when the trip count is static")
def _while(types: list[Type], attrs: dict) -> Type:
    cond = _computation(attrs, "condition", "while")
    body = _computation(attrs, "body", "while")
    if len(types) != 1:
        raise ShapeError("while takes one operand (the loop state)")
    _check_call(cond, types, "while condition")
    _check_call(body, types, "while body")
    if cond.result_type != TensorType(dt.PRED, ()):
        raise ShapeError(f"while: condition must return pred[], returns {cond.result_type}")
    if body.result_type != types[0]:
        raise ShapeError(f"while: body returns {body.result_type}, state is {types[0]}")
    return types[0]


def _conditional_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    selector, *operands = args
    branches: tuple[Computation, ...] = attrs["branches"]
    s = np.asarray(selector)
    if s.dtype == np.bool_:
        i = 0 if bool(s) else 1  # true_computation first
    else:
        i = int(s)
        if not 0 <= i < len(branches):
            i = len(branches) - 1  # XLA: an out-of-range index runs the last branch
    return ctx.call(branches[i], [operands[i]])


@op("conditional", engine=CONTROL, impl=_conditional_impl, neuron=("Conditional",),
    notes="branches are side-effect free: if-converted (all run, results selected)")
def _conditional(types: list[Type], attrs: dict) -> Type:
    branches = attrs.get("branches")
    if not branches or not all(isinstance(b, Computation) for b in branches):
        raise ShapeError("conditional needs branch computations")
    if len(types) != len(branches) + 1:
        raise ShapeError(f"conditional: {len(branches)} branches need {len(branches) + 1} operands, "
                         f"got {len(types)}")
    sel = tensor(types[0], "branch selector")
    if sel.shape != () or sel.dtype not in (dt.PRED, dt.S32):
        raise ShapeError(f"conditional: selector must be pred[] or s32[], got {sel}")
    if sel.dtype is dt.PRED and len(branches) != 2:
        raise ShapeError("conditional: a pred selector needs exactly two branches")
    result = branches[0].result_type
    for b, t in zip(branches, types[1:]):
        _check_call(b, [t], "conditional")
        if b.result_type != result:
            raise ShapeError(f"conditional: branch {b.name} returns {b.result_type}, not {result}")
    return result


# custom-call: the front end lowers the targets nxsat knows (TopK) to real operators; whatever is
# left is an unknown target.
def _custom_call_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    raise error("NCC_EVRF015", f"unknown custom-call target {attrs.get('target')!r}", ctx.node.loc)


@op("custom-call", engine=NONE, impl=_custom_call_impl, neuron=("Customcall",), error_code="NCC_EVRF015",
    notes="targets: TopK (lowered to topk); others are refused with NCC_EVRF015")
def _custom_call(types: list[Type], attrs: dict) -> Type:
    t = attrs.get("type")
    if not isinstance(t, TensorType | TupleType):
        raise ShapeError("custom-call needs its result type")
    return t


# Operators XLA has that nxsat refuses, each with why. Declared so list-operators and diagnostics
# can say so, instead of "unknown opcode".
_UNSUPPORTED = {
    "fft": "FFT is not mapped to any NeuronCore engine",
    "cholesky": "linear-algebra decompositions are not supported",
    "triangular-solve": "linear-algebra solvers are not supported",
    "infeed": "host I/O inside a graph is not supported",
    "outfeed": "host I/O inside a graph is not supported",
    "send": "point-to-point transfers are not supported",
    "send-done": "point-to-point transfers are not supported",
    "recv": "point-to-point transfers are not supported",
    "recv-done": "point-to-point transfers are not supported",
    "after-all": "tokens (side-effect ordering) are not supported",
    "add-dependency": "tokens (side-effect ordering) are not supported",
    "domain": "sharding domains are not supported",
    "get-dimension-size": "dynamic shapes are not supported (NCC_EMOD025)",
    "set-dimension-size": "dynamic shapes are not supported (NCC_EMOD025)",
    "dynamic-reshape": "dynamic shapes are not supported (NCC_EMOD025)",
    "real": "complex types are not supported (NCC_EVRF004)",
    "imag": "complex types are not supported (NCC_EVRF004)",
    "complex": "complex types are not supported (NCC_EVRF004)",
    "stochastic-convert": "stochastic rounding is a runtime option, not an operator",
    "async-start": "asynchronous wrappers are not supported; give the synchronous form",
    "async-update": "asynchronous wrappers are not supported; give the synchronous form",
    "async-done": "asynchronous wrappers are not supported; give the synchronous form",
    "copy-start": "asynchronous copies are not supported",
    "copy-done": "asynchronous copies are not supported",
    "all-reduce-start": "asynchronous collectives are not supported; give all-reduce",
    "all-reduce-done": "asynchronous collectives are not supported; give all-reduce",
    "all-gather-start": "asynchronous collectives are not supported; give all-gather",
    "all-gather-done": "asynchronous collectives are not supported; give all-gather",
    "collective-permute-start": "asynchronous collectives are not supported",
    "collective-permute-done": "asynchronous collectives are not supported",
}


def _unsupported_rule(name: str, why: str) -> Any:
    def infer(types: list[Type], attrs: dict) -> Type:
        t = attrs.get("type")
        if isinstance(t, TensorType | TupleType):
            return t
        raise ShapeError(f"{name}: {why}")

    return infer


def _unsupported_impl(args: list[Any], attrs: dict, ctx: Any) -> Any:
    raise error("NCC_EUOC002", f"operator {ctx.node.op} is not supported", ctx.node.loc)


for _name, _why in _UNSUPPORTED.items():
    op(_name, engine=NONE, status=UNSUPPORTED, notes=_why, impl=_unsupported_impl)(_unsupported_rule(_name, _why))

"""Operator declarations. Importing this package declares every operator in the registry.

Where to find an operator: elementwise (arithmetic, logic, compare, select, clamp), shape
(parameters, constants, data movement, conversions, tuples), reduce (reduce, reduce-window,
select-and-scatter), linalg (dot, convolution), indexing (gather, scatter), sort (sort, topk),
random (rng-bit-generator, rng), norm (batch-norm-*), fused (what model-type rule sets introduce:
softmax), collective (all-reduce & co.), control
(call, while, conditional, custom-call, and the operators nxsat refuses).
"""

from nxsat.ops import (  # noqa: F401
    collective,
    control,
    elementwise,
    fused,
    indexing,
    linalg,
    norm,
    random,
    reduce,
    shape,
    sort,
)
from nxsat.ops.registry import OpDef, all_ops, get

__all__ = ["OpDef", "all_ops", "get"]

"""Collectives: multi-replica shape rules, single-replica execution, clear refusal otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from nxsat import dtypes as dt
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module
from nxsat.ops import get

RNG = np.random.default_rng(3)


def add_body(d=dt.F32):
    b = Builder("add")
    x, y = b.param(d, ()), b.param(d, ())
    return b.build(b.op("add", [x, y]))


def build(op, shapes, d=dt.F32, **attrs):
    b = Builder("main")
    ps = [b.param(d, s) for s in shapes]
    node = b.op(op, ps, **attrs)
    return b.module(node), node


def expect_code(code, fn):
    with pytest.raises(NxsatError) as exc:
        fn()
    assert exc.value.code == code, exc.value
    return exc.value.message


@pytest.mark.parametrize("groups", [(), ((0,),), ((0,), (1,), (2,))])
def test_all_reduce_over_one_replica_is_identity(groups):
    x, y = RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
    m, node = build("all-reduce", [(3, 4)], to_apply=add_body(), replica_groups=groups)
    (got,) = run_module(m, [x])
    np.testing.assert_array_equal(got, x)
    m, node = build("all-reduce", [(3, 4), (5,)], to_apply=add_body(), replica_groups=groups)
    assert str(node.type) == "(f32[3,4], f32[5])"
    got = run_module(m, [x, y])
    np.testing.assert_array_equal(got[0], x)
    np.testing.assert_array_equal(got[1], y)


def test_all_gather_and_reduce_scatter_shapes_follow_the_group():
    _, n = build("all-gather", [(2, 3)], dimension=1, replica_groups=((0, 1, 2, 3),))
    assert n.shape == (2, 12)
    _, n = build("all-gather", [(2, 3)], dimension=0, replica_groups=((0, 2), (1, 3)))
    assert n.shape == (4, 3)
    _, n = build("reduce-scatter", [(8, 3)], dimension=0, to_apply=add_body(), replica_groups=((0, 1, 2, 3),))
    assert n.shape == (2, 3)
    _, n = build("all-to-all", [(8, 3)], dimension=0, replica_groups=((0, 1, 2, 3),))
    assert n.shape == (8, 3)
    _, n = build("all-gather", [(2, 3)], dimension=1)  # groups left to the runtime: one replica here
    assert n.shape == (2, 3)


@pytest.mark.parametrize("op,attrs", [
    ("all-reduce", {"to_apply": add_body()}),
    ("all-gather", {"dimension": 0}),
    ("reduce-scatter", {"dimension": 0, "to_apply": add_body()}),
    ("all-to-all", {"dimension": 0}),
])
def test_single_replica_identity_and_multi_replica_refusal(op, attrs):
    x = RNG.standard_normal((4, 2)).astype(np.float32)
    m, _ = build(op, [(4, 2)], replica_groups=((0,),), **attrs)
    np.testing.assert_array_equal(run_module(m, [x])[0], x)
    m, _ = build(op, [(4, 2)], replica_groups=((0, 1),), **attrs)
    msg = expect_code("NCC_EUOC002", lambda: run_module(m, [x]))
    assert "multi-replica execution is not supported" in msg and "{{0,1}}" in msg


def test_collective_permute():
    x = RNG.standard_normal(6).astype(np.float32)
    m, _ = build("collective-permute", [(6,)], source_target_pairs=((0, 0),))
    np.testing.assert_array_equal(run_module(m, [x])[0], x)
    m, _ = build("collective-permute", [(6,)], source_target_pairs=())
    np.testing.assert_array_equal(run_module(m, [x])[0], np.zeros(6, np.float32))
    m, _ = build("collective-permute", [(6,)], source_target_pairs=((0, 1), (1, 0)))
    assert "multi-replica" in expect_code("NCC_EUOC002", lambda: run_module(m, [x]))


def test_replica_and_partition_id_are_zero():
    for op in ("replica-id", "partition-id"):
        b = Builder("main")
        n = b.op(op, [])
        assert str(n.type) == "u32[]"
        (got,) = run_module(b.module(n), [])
        assert got.dtype == np.uint32 and got.shape == () and int(got) == 0


@pytest.mark.parametrize("make,needle", [
    (lambda: build("reduce-scatter", [(6, 3)], dimension=0, to_apply=add_body(),
                   replica_groups=((0, 1, 2, 3),)),
     "dimension 0 of f32[6,3] (6) is not divisible by the replica group size 4"),
    (lambda: build("all-gather", [(2, 3)], dimension=2), "dimension 2 is out of range"),
    (lambda: build("all-gather", [(2, 3)], dimension=0, replica_groups=((0, 1), (2,))), "different sizes"),
    (lambda: build("all-reduce", [(2,)], to_apply=add_body(), replica_groups=((0, 1), (1, 2))),
     "replica 1 appears in more than one place"),
    (lambda: build("all-reduce", [(2,)], to_apply=add_body(dt.S32)), "does not match"),
    (lambda: build("all-reduce", [(2,)]), "needs a computation for to_apply"),
    (lambda: build("all-to-all", [(6, 2)], dimension=0, replica_groups=((0, 1, 2, 3),)), "not divisible"),
    (lambda: build("collective-permute", [(2,)], source_target_pairs=((0, 1), (2, 1))),
     "sends or receives twice"),
])
def test_collective_shape_errors(make, needle):
    assert needle in expect_code("NCC_EVRF064", make)


def test_registry_entries():
    for name in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"):
        assert get(name).engine == "DMA"
    assert "Allreduce" in get("all-reduce").neuron
    assert "Allgather" in get("all-gather").neuron
    assert "ReduceScatter" in get("reduce-scatter").neuron

"""trn2's logical core of two physical cores: weights sharded where it pays (backend/partition.py), the
parts joined by a cc-stream all-gather or by a sharded output; and a model's own collectives over one
replica (backend/collective.py). Every compiled model runs on the simulator against the interpreter."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from harness import DATA, reference_run

from nxsat import sim
from nxsat.diagnostics import NxsatError
from nxsat.driver import CompileOptions, compile_model
from nxsat.frontend import load

LINEAR = """HloModule linear

ENTRY main {
  x = f32[128,1024] parameter(0)
  w = f32[1024,4096] parameter(1)
  d = f32[128,4096] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = f32[128,4096] tanh(d)
}
"""

# The weight stored [N, K] (as torch.nn.Linear keeps it), the product returned as it is.
LINEAR_T = """HloModule linear_t

ENTRY main {
  x = f32[128,1024] parameter(0)
  w = f32[4096,1024] parameter(1)
  wt = f32[1024,4096] transpose(w), dimensions={1,0}
  ROOT d = f32[128,4096] dot(x, wt), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def _compile(tmp_path: Path, text: str, **opts: object) -> tuple[sim.Model, dict, Path]:
    src = tmp_path / "model.hlo"
    src.write_text(text)
    r = compile_model(str(src), CompileOptions(**opts))  # type: ignore[arg-type]
    return sim.load(r.neff, verify=True), r.report, src


def _check(model: sim.Model, src: Path, rtol: float = 2e-5, normwise: float | None = None) -> None:
    module = load(str(src))
    rng = np.random.default_rng(7)
    inputs = {p.name: rng.standard_normal(p.shape).astype(np.float32) for p in module.entry.params}
    got = model.run({f"in{i}": v for i, v in enumerate(inputs.values())})
    want = reference_run(module, inputs)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        if normwise is not None:
            assert np.linalg.norm(g - w) / np.linalg.norm(w) < normwise
            continue
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(np.abs(w).max()))


def test_weight_split_across_the_two_cores_joined_by_all_gather(tmp_path: Path) -> None:
    model, rep, src = _compile(tmp_path, LINEAR, target="trn2", lnc=2)
    sh = rep["sharding"]
    assert sh["ranks"] == 2 and [(w["parameter"], w["dim"], w["joined_by"]) for w in sh["weights"]] == [
        ("w", 1, "all-gather")]
    # x was a candidate too (its rows), but what it saves does not pay for the all-gather
    assert [d["parameter"] for d in sh["declined"]] == ["x"]
    text = model.text
    assert re.search(r"input +w: f32\[1024, 2048\] +shard=1", text) and "all_gather" in text
    _check(model, src, rtol=1e-4)  # tanh of sums of 1024 products (|d| ~ 30): fp32 order differences
    # the all-gather costs on the cc stream what the partitioner priced it at
    summary, _ = model.profile()
    assert summary["engines"]["cc"]["busy_ns"] == pytest.approx(sh["weights"][0]["gather_us"] * 1000, rel=1e-3)


def test_sharded_output_needs_no_collective(tmp_path: Path) -> None:
    model, rep, src = _compile(tmp_path, LINEAR_T, target="trn2", lnc=2)
    (w,) = rep["sharding"]["weights"]
    assert (w["parameter"], w["dim"], w["joined_by"], w["gather_us"]) == ("w", 0, "output", 0.0)
    assert "all_gather" not in model.text and "shard=1" in model.text
    _check(model, src)


def test_split_halves_the_latency_of_a_weight_bound_layer(tmp_path: Path) -> None:
    one, r1, _ = _compile(tmp_path, LINEAR_T, target="trn2", lnc=1)
    two, r2, _ = _compile(tmp_path, LINEAR_T, target="trn2", lnc=2)
    assert r1["sharding"]["sharded_weights"] == 0
    assert r2["latency_us"] < 0.65 * r1["latency_us"]
    # the roofline is the logical core's: both physical cores
    assert r2["roofline_us"] == pytest.approx(r1["roofline_us"] / 2, rel=1e-3)


def test_auto_cast_weight_is_cast_on_chip_and_still_split(tmp_path: Path) -> None:
    model, rep, src = _compile(tmp_path, LINEAR, target="trn2", lnc=2, auto_cast="matmult")
    assert rep["sharding"]["sharded_weights"] == 1
    # the bf16 casts are done on the loaded tiles, not written to scratch and read back
    assert not re.search(r"scratch +\S+: bf16", model.text)
    _check(model, src, normwise=1e-2)  # bf16 operands against the f32 model


def test_small_models_keep_both_cores_whole(tmp_path: Path) -> None:
    """A weight whose split saves less than an all-gather costs stays whole; the report says why."""
    r = compile_model(str(DATA / "jax" / "mlp.hlo"), CompileOptions(target="trn2", lnc=2))
    sh = r.report["sharding"]
    assert sh["sharded_weights"] == 0 and sh["declined"]
    assert all(d["saved_us"] <= d["gather_us"] for d in sh["declined"])


@pytest.mark.parametrize("target,lnc", [("trn1", 1), ("trn2", 1), ("inf2", 1)])
def test_one_core_targets_never_shard(tmp_path: Path, target: str, lnc: int) -> None:
    model, rep, src = _compile(tmp_path, LINEAR_T, target=target, lnc=lnc)
    assert rep["sharding"] == {"ranks": 1, "sharded_weights": 0, "all_gathers": 0, "weights": [], "declined": []}
    assert "shard=" not in model.text


COLLECTIVES = """HloModule coll

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[4,8] parameter(0)
  r = f32[4,8] all-reduce(x), replica_groups={}, to_apply=add
  g = f32[4,8] all-gather(r), dimensions={0}, replica_groups={{0}}
  p = f32[4,8] collective-permute(g), source_target_pairs={{0,0}}
  z = f32[4,8] collective-permute(g), source_target_pairs={}
  i = u32[] replica-id()
  ROOT t = (f32[4,8], f32[4,8], u32[]) tuple(p, z, i)
}
"""


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_single_replica_collectives(tmp_path: Path, target: str) -> None:
    model, _, src = _compile(tmp_path, COLLECTIVES, target=target)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    p, z, i = model.run({"in0": x})
    np.testing.assert_array_equal(p, x)
    np.testing.assert_array_equal(z, np.zeros_like(x))
    assert i.shape == () and int(i) == 0


def test_a_collective_over_several_replicas_is_refused(tmp_path: Path) -> None:
    text = COLLECTIVES.replace("replica_groups={}", "replica_groups={{0,1}}")
    with pytest.raises(NxsatError) as e:
        _compile(tmp_path, text)
    assert e.value.code == "NCC_EUOC002" and "all-reduce" in e.value.message and e.value.loc.line == 11

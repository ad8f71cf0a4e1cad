"""--auto-cast: what the policy casts, and how close the compiled models stay to XLA's fp32 outputs.

Tolerances are normwise (||device - xla|| / ||xla||) and derived from the unit roundoff u of the
type the operands are rounded to: a dot of rounded operands is off by about u per product, relative
errors of a few u survive a layer. We allow 4u: bf16 (u = 2^-8) 1.6e-2, fp16 and tf32 (u = 2^-11)
2e-3, and with ``all`` (every fp32 operation rounds to bf16) 5u = 2e-2. docs/compiling.md says the
same."""

from __future__ import annotations

import numpy as np
import pytest
from harness import DATA, device_run, module_of

from nxsat import dtypes as dt
from nxsat.backend.precision import apply_precision

TOL = {("matmult", "bf16"): 1.6e-2, ("matmult", "fp16"): 2e-3, ("matmult", "tf32"): 2e-3, ("all", "bf16"): 2e-2}
MODELS = sorted(p.stem for p in (DATA / "jax").glob("*.hlo"))  # every JAX model


@pytest.mark.parametrize("mode,cast", list(TOL))
@pytest.mark.parametrize("name", MODELS)
def test_auto_cast_stays_within_the_types_tolerance(name: str, mode: str, cast: str) -> None:
    if (name, mode) == ("random_dropout", "all"):
        pytest.skip("`all` rounds the uniform draws to bf16 before they are compared with the keep "
                    "probability: a discrete mask flips (docs/compiling.md); measured in test_dropout_mask_under_all")
    ref = np.load(DATA / "jax" / f"{name}.npz")
    module, rep = apply_precision(module_of(DATA / "jax" / f"{name}.hlo", optimized=True), mode, cast)
    got, _ = device_run(module, {k: ref[k] for k in ref.files if k.startswith("in")})
    for k, g in enumerate(got):
        r = ref[f"out{k}"].astype(np.float64)
        err = np.linalg.norm(g.astype(np.float64) - r) / max(np.linalg.norm(r), 1e-30)
        assert err <= TOL[(mode, cast)], (name, mode, cast, err)
        assert g.dtype == ref[f"out{k}"].dtype  # outputs keep their types


def test_none_changes_no_type() -> None:
    m = module_of(DATA / "jax" / "transformer_layer.hlo", optimized=True)
    out, rep = apply_precision(m, "none")
    assert out is m and rep.casts == 0


def test_matmult_casts_only_tensor_engine_operands() -> None:
    m = module_of(DATA / "jax" / "transformer_layer.hlo", optimized=True)
    out, rep = apply_precision(m, "matmult", "bf16")
    dots = [n for n in out.entry.post_order() if n.op == "dot"]
    assert dots and all(o.dtype is dt.BF16 for d in dots for o in d.operands)
    assert all(d.dtype is dt.F32 for d in dots)  # accumulation and result stay fp32
    # a transposed operand is cast at its source and read through the transpose (a view of the cast)
    changed = [n for n in out.entry.post_order() if n.op not in ("dot", "convert", "transpose") and n.op != "parameter"
               and hasattr(n.type, "dtype") and n.dtype is dt.BF16]
    assert not changed
    views = [n for n in out.entry.post_order() if n.op == "transpose" and n.dtype is dt.BF16]
    assert views and all(v.operands[0].op == "convert" for v in views)
    assert [p.type for p in out.entry.params] == [p.type for p in m.entry.params]
    assert out.entry.root.type == m.entry.root.type


def test_tf32_uses_tensor_engine_tf32_mode() -> None:
    from nxsat import sim
    from nxsat.backend import compile_graph

    m, _ = apply_precision(module_of(DATA / "jax" / "mlp.hlo", optimized=True), "matmult", "tf32")
    c = compile_graph(m, sim.load_target("trn1"))
    mm = [i for i in c.program.instrs if i.opcode == "matmul"]
    assert mm and all(i.attrs.get("precision") == "tf32" for i in mm)
    assert not any(i.opcode == "tensor_scalar" and "reduce" in (i.origin or "") for i in c.program.instrs)


def test_saturate_infinity_keeps_inf_times_zero_finite() -> None:
    from harness import module_of as mod

    text = ("HloModule m\nENTRY e {\n  a = f32[4] parameter(0)\n  b = f32[4] parameter(1)\n"
            "  ROOT m = f32[4] multiply(a, b)\n}\n")
    m = mod(text)
    x = {"in0": np.array([np.inf, -np.inf, 1, 2], np.float32), "in1": np.array([0, 0, 3, 4], np.float32)}
    plain, _ = device_run(m, x)
    sat, rep = apply_precision(m, "none", saturate_infinity=True)
    got, _ = device_run(sat, x)
    assert np.isnan(plain[0][:2]).all() and np.array_equal(got[0], [0, 0, 3, 8]) and rep.decisions


def test_dropout_mask_under_all() -> None:
    """Under `all` the dropout mask is drawn from bf16-rounded uniforms: kept elements are exact
    multiples of the input, and the mask differs from XLA's in few places."""
    ref = np.load(DATA / "jax" / "random_dropout.npz")
    module, _ = apply_precision(module_of(DATA / "jax" / "random_dropout.hlo", optimized=True), "all", "bf16")
    (got,), _ = device_run(module, {k: ref[k] for k in ref.files if k.startswith("in")})
    want = ref["out0"]
    flipped = float(np.mean((got == 0) != (want == 0)))
    assert flipped < 0.1, flipped


@pytest.mark.parametrize("name", MODELS)
def test_precision_chosen_by_cost_stays_within_bf16s_tolerance(name: str) -> None:
    """-O2's default: the extraction picks each dot's precision (the precision-bf16 rule set), every
    choice reported with both prices; outputs keep their types and shapes, and the compiled model
    reproduces XLA within bf16's tolerance (which operands are cast: the test below)."""

    from nxsat import sim
    from nxsat.driver import CompileOptions, compile_model

    path = DATA / "jax" / f"{name}.hlo"
    result = compile_model(str(path), CompileOptions(auto_cast="matmult"))
    ex = result.report["extraction"]
    for c in ex.get("casts", []):
        assert c["chosen"] in ("bf16", "f32") and c["f32_us"] > 0 and c["bf16_us"] > 0
    ref = np.load(DATA / "jax" / f"{name}.npz")
    got = sim.load(result.neff).run({k: ref[k] for k in ref.files if k.startswith("in")})
    for k, g in enumerate(got):
        r = ref[f"out{k}"]
        assert g.dtype == r.dtype and g.shape == r.shape
        if r.dtype.kind == "f":
            rf = r.astype(np.float64)
            err = np.linalg.norm(g.astype(np.float64) - rf) / max(np.linalg.norm(rf), 1e-30)
            assert err <= TOL[("matmult", "bf16")], (name, err)
        else:
            np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("mode,cast", [("matmult", "fp16"), ("all", "bf16")])
@pytest.mark.parametrize("name", ["transformer_layer", "convnet", "mlp", "unet_tiny"])
def test_precision_by_cost_in_the_other_permissions(name: str, mode: str, cast: str) -> None:
    """fp16's precision set, and ``all`` (TensorE operations by cost, elementwise ones by the policy): the
    compiled model stays within the type's tolerance, outputs keep their types, and the report says who
    chose."""
    from nxsat import sim
    from nxsat.driver import CompileOptions, compile_model

    # the DAG extractor named: -O2 then keeps its own program (it may keep -O1's, with the policy's casts)
    result = compile_model(str(DATA / "jax" / f"{name}.hlo"), CompileOptions(auto_cast=mode, auto_cast_type=cast,
                                                                          extractor="dag"))
    d = result.report["decisions"]
    assert d["precision"] == "cost" and d["offered"] > 0
    ref = np.load(DATA / "jax" / f"{name}.npz")
    got = sim.load(result.neff).run({k: ref[k] for k in ref.files if k.startswith("in")})
    assert len(got) == sum(1 for k in ref.files if k.startswith("out"))
    for k, g in enumerate(got):
        r = ref[f"out{k}"]
        assert g.dtype == r.dtype and g.shape == r.shape
        rf = r.astype(np.float64)
        err = np.linalg.norm(g.astype(np.float64) - rf) / max(np.linalg.norm(rf), 1e-30)
        assert err <= TOL[(mode, cast)], (name, mode, cast, err)


def test_precision_by_cost_casts_only_dot_operands_and_none_changes_nothing() -> None:
    from nxsat.driver import CompileOptions
    from nxsat.extract import extract
    from nxsat.extract.cost import CostModel
    from nxsat.rules import saturate_module

    m = module_of(DATA / "jax" / "transformer_layer.hlo")
    before = {n.dtype.name for n in m.entry.post_order() if n.op != "tuple"}
    for sets in ((), ("precision-bf16",)):
        sat = saturate_module(m, "generic", 2, allow_approximate=bool(sets), canonical=True, extra_sets=sets)
        ex = extract(sat.egraph, sat.loaded, "ilp", CostModel(sim_target(), "f32", in_program=True))
        out = ex.module
        casts = [n for n in out.entry.post_order() if n.op == "convert" and n.dtype is dt.BF16]
        # with the precision set every dot is offered in both types and takes the one the extraction chose
        # (the report's casts, both prices each): the written dots whose bf16 variant is cheaper by 1% or
        # more are cast (a cast of a value computed on chip is written narrow by its producer and costs
        # nothing); the head-major queries' and keys' projections and the scores stay fp32, which their
        # tiny products simulate faster (26.5 against 26.6 us cast)
        dots = [n for n in out.entry.post_order() if n.op == "dot"]
        cast = {d.name for d in dots if all(o.dtype is dt.BF16 for o in d.operands)}
        if sets:
            assert len(ex.casts) == len(dots) and {c["chosen"] for c in ex.casts} == {"bf16", "f32"}
            assert {c["op"] for c in ex.casts if c["bf16_us"] < 0.99 * c["f32_us"] and c["op"].startswith("dot_")} \
                <= cast
        else:
            assert not cast and not ex.casts
        for n in casts:
            assert all(u.op == "dot" for u in _users(out, n)), n
        if not sets:  # no precision rules: no type that was not in the model
            assert {n.dtype.name for n in out.entry.post_order() if n.op != "tuple"} <= before
    assert CompileOptions().precision == "cost"


def test_a_chosen_cast_of_a_transpose_casts_its_source() -> None:
    """The extraction's ``convert(transpose(x))`` becomes ``transpose(convert(x))`` (a view of the cast), as
    the policy places its casts: x's producer writes it narrow (a dot's evacuation) instead of a pass over
    the transposed value, or a wide load the dot converts (attention_s2048's output before its projection:
    2,101.5 -> 2,091.6 us)."""
    from nxsat.attrs import DotDims
    from nxsat.builder import Builder

    b = Builder("m")
    x, w = b.param(dt.F32, (4, 8)), b.param(dt.BF16, (4, 6))
    t = b.op("transpose", [b.op("exponential", [x])], dimensions=(1, 0))
    d = b.op("dot", [b.op("convert", [t], dtype=dt.BF16), w], dims=DotDims((1,), (0,)))
    out, _ = apply_precision(b.module(d), "matmult", tensor_ops=())
    lhs = out.entry.root.operands[0]
    assert lhs.op == "transpose" and lhs.dtype is dt.BF16
    assert lhs.operands[0].op == "convert" and lhs.operands[0].operands[0].op == "exponential"
    # a transposed model input's cast stays the dot's to absorb (loaded wide and converted on chip)
    b = Builder("m")
    x, w = b.param(dt.F32, (4, 8)), b.param(dt.BF16, (4, 6))
    t = b.op("convert", [b.op("transpose", [x], dimensions=(1, 0))], dtype=dt.BF16)
    out, _ = apply_precision(b.module(b.op("dot", [t, w], dims=DotDims((1,), (0,)))), "matmult", tensor_ops=())
    assert out.entry.root.operands[0].op == "convert"


def sim_target():  # noqa: ANN201
    from nxsat import sim

    return sim.load_target("trn1")


def _users(m, node):  # noqa: ANN001, ANN202
    return [n for n in m.entry.post_order() if any(o is node for o in n.operands)]


@pytest.mark.parametrize("name", ["batched_matmul", "mlp", "transformer_layer", "convnet"])
def test_dots_the_extraction_casts_run_within_bf16s_tolerance(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 variants the precision set offers, when the extraction takes them (forced here: an fp32
    product is priced out; on these small models the cost model keeps fp32, which pays), compile and
    reproduce XLA within bf16's tolerance, with only dot operands cast."""
    from nxsat import sim
    from nxsat.driver import CompileOptions, compile_model
    from nxsat.extract.cost import CostModel

    real = CostModel.matmul_ns

    def priced_out(self, B, M, K, N, mt, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        return real(self, B, M, K, N, mt, *args, **kw) * (100.0 if mt == "f32" else 1.0)

    monkeypatch.setattr(CostModel, "matmul_ns", priced_out)
    result = compile_model(str(DATA / "jax" / f"{name}.hlo"), CompileOptions(auto_cast="matmult"))
    casts = result.report["extraction"]["casts"]
    assert casts and all(c["chosen"] == "bf16" for c in casts)
    ref = np.load(DATA / "jax" / f"{name}.npz")
    got = sim.load(result.neff).run({k: ref[k] for k in ref.files if k.startswith("in")})
    for k, g in enumerate(got):
        r = ref[f"out{k}"].astype(np.float64)
        assert g.dtype == ref[f"out{k}"].dtype
        err = np.linalg.norm(g.astype(np.float64) - r) / max(np.linalg.norm(r), 1e-30)
        assert err <= TOL[("matmult", "bf16")], (name, err)


def test_each_dot_has_one_bf16_variant_exempt_from_the_confidence_margin() -> None:
    from nxsat.extract import _precision_variants
    from nxsat.rules import saturate_module
    from nxsat.rules.extract import original_nodes

    m = module_of(DATA / "jax" / "transformer_layer.hlo")
    dots = sum(1 for n in m.entry.post_order() if n.op == "dot")
    for sets, want in (((), 0), (("precision-bf16",), dots)):
        sat = saturate_module(m, "generic", 2, allow_approximate=bool(sets), canonical=True, extra_sets=sets)
        view = sat.egraph.view()
        found = _precision_variants(view, frozenset(original_nodes(view, sat.loaded)))
        assert len({view.node_class[i] for i in found}) == want

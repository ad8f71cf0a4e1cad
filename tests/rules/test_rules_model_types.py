"""Every rule of the model-type sets (transformer, attention, activations, unet), shown firing on a small
graph, with the e-graph still sound (tests/rules/test_rules_generic.py does the same for the generic set); and the sets
firing on the corpus, where `--model-type transformer` (or unet-inference) extracts the fused operators."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from firing import fire_alone

from nxsat import dtypes as dt
from nxsat.attrs import ConvDims, WindowDim
from nxsat.builder import Builder
from nxsat.interpreter import run_module
from nxsat.ir import Module, Node
from nxsat.ops.fused import FUSED
from nxsat.rules.catalog import catalog
from nxsat.rules.terms import reducer_body

F32, BF16 = dt.F32, dt.BF16
DATA = Path(__file__).resolve().parents[1] / "data"


def _splat(b: Builder, v: float, d: dt.DType, shape: tuple[int, ...]) -> Node:
    return b.op("broadcast", [b.constant(v, d)], shape=shape, dimensions=())


def _softmax_pattern(d: dt.DType, f32_sum: bool) -> Callable[[], Module]:
    """exp(x - max) / sum(exp(x - max)) over the last dimension, as JAX writes it (the sum in f32 for a
    narrow type when ``f32_sum``)."""
    def make() -> Module:
        b = Builder("sm")
        shape = (2, 3, 5)
        x = b.param(d, shape)
        keep = (0, 1)
        m = b.op("reduce", [x, b.constant(-np.inf, d)], dimensions=(2,), to_apply=reducer_body("maximum", d.name))
        e = b.op("exponential", [b.op("subtract", [x, b.op("broadcast", [m], shape=shape, dimensions=keep)])])
        if f32_sum:
            s32 = b.op("reduce", [b.op("convert", [e], dtype=F32), b.constant(0.0, F32)], dimensions=(2,),
                       to_apply=reducer_body("add", "f32"))
            s = b.op("convert", [s32], dtype=d)
        else:
            s = b.op("reduce", [e, b.constant(0.0, d)], dimensions=(2,), to_apply=reducer_body("add", d.name))
        return b.module(b.op("divide", [e, b.op("broadcast", [s], shape=shape, dimensions=keep)]))
    return make


def _scaled(left: bool) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder("ss")
        x = b.param(F32, (4, 6))
        c = _splat(b, 0.125, F32, (4, 6))
        y = b.op("multiply", [c, x] if left else [x, c])
        return b.module(b.op("softmax", [y], dimension=1, scale=1.0))
    return make


def _gelu_jax(t: dt.DType = F32) -> Module:
    """jax.nn.gelu(approximate=True); in bf16 (gemma3's MLP) its constants are bf16's."""
    b = Builder("gelu")
    x = b.param(t, (2, 5))
    c = lambda v: _splat(b, v, t, (2, 5))  # noqa: E731
    cube = b.op("multiply", [b.op("multiply", [x, x]), x])
    inner = b.op("multiply", [b.op("add", [x, b.op("multiply", [cube, c(0.044715)])]), c(math.sqrt(2 / math.pi))])
    half = b.op("multiply", [b.op("add", [b.op("tanh", [inner]), c(1.0)]), c(0.5)])
    return b.module(b.op("multiply", [x, half]))


# XLA's erfc expansion (its constants, as transformer_layer's HLO has them)
_ERFC_SMALL = (7.853861461626366e-05, -0.0008010193705558777, 0.005188327748328447, -0.026853812858462334,
               0.1128358542919159, -0.3761262595653534, 1.1283791065216064)
_ERFC_MID = (0.0232682004570961, -0.13870394229888916, 0.3687424659729004, -0.5824732780456543,
             0.6210004687309265, -0.49445152282714844, 0.3404879868030548, -0.2741127014160156, 0.5638259649276733)
_ERFC_LARGE = (-10.47766399383545, 12.97719955444336, -7.495518684387207, 2.9210190773010254, -1.0152652263641357,
               0.42184633016586304, -0.28207674622535706, 0.5641894936561584)


def _gelu_erf_xla() -> Module:
    """jax.nn.gelu(approximate=False) as XLA expands it: 0.5 x * erfc(-x / sqrt 2), erfc by its rational
    approximations (transformer_layer's MLP)."""
    b = Builder("gelu")
    shape = (2, 8, 16)
    x = b.param(F32, shape)
    c = lambda v: _splat(b, v, F32, shape)  # noqa: E731
    op = b.op

    def horner(v: Node, coeffs: tuple[float, ...]) -> Node:
        e = op("add", [op("multiply", [v, c(coeffs[0])]), c(coeffs[1])])
        for k in coeffs[2:]:
            e = op("add", [op("multiply", [e, v]), c(k)])
        return e

    def lt(a: Node, v: Node) -> Node:
        return op("compare", [a, v], direction="LT")

    z = op("multiply", [op("negate", [x]), c(0.7071067690849304)])
    z2, a = op("multiply", [z, z]), op("abs", [z])
    small = op("subtract", [c(1.0), op("multiply", [z, horner(z2, _ERFC_SMALL)])])
    q = op("divide", [c(1.0), z2])
    ratio = op("select", [lt(a, c(2.0)), horner(q, _ERFC_MID), horner(q, _ERFC_LARGE)])
    tail = op("multiply", [op("multiply", [op("exponential", [op("negate", [z2])]), op("divide", [c(1.0), a])]),
                           ratio])
    tail = op("select", [lt(op("negate", [z2]), c(-88.72283935546875)), c(0.0), tail])
    big = op("select", [lt(z, c(0.0)), op("subtract", [c(2.0), tail]), tail])
    erfc = op("select", [lt(a, c(1.0)), small, big])
    return b.module(op("multiply", [op("multiply", [x, c(0.5)]), erfc]))


def _gelu_torch() -> Module:
    b = Builder("gelu")
    x = b.param(F32, (2, 5))
    c = lambda v: _splat(b, v, F32, (2, 5))  # noqa: E731
    inner = b.op("multiply", [c(math.sqrt(2 / math.pi)),
                              b.op("add", [x, b.op("multiply", [c(0.044715), b.op("power", [x, c(3.0)])])])])
    return b.module(b.op("multiply", [b.op("multiply", [c(0.5), x]), b.op("add", [c(1.0), b.op("tanh", [inner])])]))


def _gelu_relay() -> Module:
    """tests/data/relay/gpt2_extract.relay's GELU: every constant on the right, sqrt(2/pi) printed as 0.797885."""
    b = Builder("gelu")
    x = b.param(F32, (2, 5))
    c = lambda v: _splat(b, v, F32, (2, 5))  # noqa: E731
    cube = b.op("multiply", [b.op("power", [x, c(3.0)]), c(0.044715)])
    inner = b.op("tanh", [b.op("multiply", [b.op("add", [x, cube]), c(0.797885)])])
    return b.module(b.op("multiply", [b.op("multiply", [x, c(0.5)]), b.op("add", [inner, c(1.0)])]))


def _silu(form: str) -> Callable[[], Module]:
    def make() -> Module:
        b = Builder("silu")
        x = b.param(F32, (3, 4))
        if form == "reciprocal":
            one = _splat(b, 1.0, F32, (3, 4))
            sig = b.op("divide", [one, b.op("add", [b.op("exponential", [b.op("negate", [x])]), one])])
            return b.module(b.op("multiply", [x, sig]))
        sig = b.op("logistic", [x])
        return b.module(b.op("multiply", [x, sig] if form == "right" else [sig, x]))
    return make


def _layer_norm_flax() -> Module:
    """Flax's LayerNorm: var = max(E[x^2] - mean^2, 0), (x - mean) * (rsqrt(var + eps) * scale)."""
    b = Builder("ln")
    shape, keep = (2, 3, 8), (0, 1)
    x, g = b.param(F32, shape), b.param(F32, shape)
    n = _splat(b, 8.0, F32, (2, 3))
    add = reducer_body("add", "f32")
    m = b.op("divide", [b.op("reduce", [x, b.constant(0.0, F32)], dimensions=(2,), to_apply=add), n])
    ex2 = b.op("divide", [b.op("reduce", [b.op("multiply", [x, x]), b.constant(0.0, F32)], dimensions=(2,),
                                 to_apply=add), n])
    var = b.op("maximum", [b.op("subtract", [ex2, b.op("multiply", [m, m])]), _splat(b, 0.0, F32, (2, 3))])
    r = b.op("rsqrt", [b.op("add", [b.op("reshape", [var], shape=(2, 3, 1)), _splat(b, 1e-6, F32, (2, 3, 1))])])
    rb = b.op("broadcast", [b.op("reshape", [r], shape=(2, 3))], shape=shape, dimensions=keep)
    d = b.op("subtract", [x, b.op("broadcast", [m], shape=shape, dimensions=keep)])
    return b.module(b.op("multiply", [d, b.op("multiply", [rb, g])]))


def _group_norm_flax() -> Module:
    """Flax's GroupNorm on NHWC [2, 3, 4, 6] in 3 groups of 2 channels: the statistics per (batch, group) over
    H, W and the group's channels, broadcast back through [N, G, 2] -> [N, C], the scale folded into the
    reciprocal as Flax writes it ([N, 1, 1, C])."""
    b = Builder("gn")
    shape, grouped, C = (2, 3, 4, 6), (2, 3, 4, 3, 2), 6
    x, g = b.param(F32, shape), b.param(F32, (2, 1, 1, C))
    xr = b.op("reshape", [x], shape=grouped)
    n = _splat(b, 24.0, F32, (2, 3))
    add = reducer_body("add", "f32")
    m = b.op("divide", [b.op("reduce", [xr, b.constant(0.0, F32)], dimensions=(1, 2, 4), to_apply=add), n])
    ex2 = b.op("divide", [b.op("reduce", [b.op("multiply", [xr, xr]), b.constant(0.0, F32)], dimensions=(1, 2, 4),
                                 to_apply=add), n])
    var = b.op("maximum", [b.op("subtract", [ex2, b.op("multiply", [m, m])]), _splat(b, 0.0, F32, (2, 3))])

    def per_channel(v, to):  # [N, G] -> [N, G, 2] -> the reshape ``to`` (channels last)
        return b.op("reshape", [b.op("broadcast", [v], shape=(2, 3, 2), dimensions=(0, 1))], shape=to)

    r = b.op("rsqrt", [b.op("add", [per_channel(var, (2, 1, 1, C)), _splat(b, 1e-6, F32, (2, 1, 1, C))])])
    rg = b.op("reshape", [b.op("multiply", [r, g])], shape=(2, C))
    d = b.op("subtract", [x, b.op("broadcast", [per_channel(m, (2, C))], shape=shape, dimensions=(0, 3))])
    return b.module(b.op("multiply", [d, b.op("broadcast", [rg], shape=shape, dimensions=(0, 3))]))


def _bf16_rows(name: str) -> tuple[Builder, Node, Callable[[Node], Node], Callable[[Node], Node]]:
    """A bf16 ``[2, 4, 16]`` value normalized over its rows as JAX writes it: ``mean`` sums in f32 and
    rounds the ``[2, 4, 1]`` mean back to bf16; ``back`` broadcasts a row statistic over the rows."""
    b = Builder(name)
    shape = (2, 4, 16)
    x = b.param(BF16, shape)
    n = _splat(b, 16.0, F32, (2, 4, 1))
    add = reducer_body("add", "f32")

    def mean(v: Node) -> Node:
        s = b.op("reduce", [b.op("convert", [v], dtype=F32), b.constant(0.0, F32)], dimensions=(2,), to_apply=add)
        return b.op("convert", [b.op("divide", [b.op("reshape", [s], shape=(2, 4, 1)), n])], dtype=BF16)

    def back(v: Node) -> Node:
        return b.op("broadcast", [b.op("reshape", [v], shape=(2, 4))], shape=shape, dimensions=(0, 1))

    return b, x, mean, back


def _layer_norm_two_pass() -> Module:
    """tests/data/hlo/layer_norm's form: bf16 values, f32 statistics rounded back, two passes."""
    b, x, mean, back = _bf16_rows("ln")
    d = b.op("subtract", [x, back(mean(x))])
    v = b.op("add", [mean(b.op("multiply", [d, d])), _splat(b, 1e-5, BF16, (2, 4, 1))])
    return b.module(b.op("divide", [d, back(b.op("sqrt", [v]))]))


def _rms_norm_f32_sum() -> Module:
    """Gemma's RMSNorm: bf16 squares summed in f32, the mean rounded back, eps added, rsqrt, times x."""
    b, x, mean, back = _bf16_rows("rms")
    r = b.op("rsqrt", [b.op("add", [mean(b.op("multiply", [x, x])), _splat(b, 1e-6, BF16, (2, 4, 1))])])
    return b.module(b.op("multiply", [x, back(r)]))


def _layer_norm_centred() -> Module:
    """TVM Relay's layer_norm (GPT-2), f32: d = x - mean, d / sqrt(mean(d * d) + eps)."""
    b = Builder("ln")
    shape, keep = (3, 2, 12), (0, 1)
    x = b.param(F32, shape)
    n = _splat(b, 12.0, F32, (3, 2))
    add = reducer_body("add", "f32")
    mean = b.op("divide", [b.op("reduce", [x, b.constant(0.0, F32)], dimensions=(2,), to_apply=add), n])
    d = b.op("subtract", [x, b.op("broadcast", [mean], shape=shape, dimensions=keep)])
    v = b.op("divide", [b.op("reduce", [b.op("multiply", [d, d]), b.constant(0.0, F32)], dimensions=(2,),
                               to_apply=add), n])
    sd = b.op("sqrt", [b.op("add", [b.op("reshape", [v], shape=(3, 2, 1)), _splat(b, 1e-5, F32, (3, 2, 1))])])
    return b.module(b.op("divide", [d, b.op("broadcast", [b.op("reshape", [sd], shape=(3, 2))], shape=shape,
                                              dimensions=keep)]))


def _batch_norm(form: str) -> Callable[[], Module]:
    """An inference batch norm after a 3x3 convolution of a [1, 5, 5, 3] NHWC image into 4 channels, its
    per-channel values [1, C] broadcast along (batch, feature) as JAX writes them: Keras's
    ``(conv + bias) * s + shift`` or Flax's ``(conv - mean) * s + b``."""
    def make() -> Module:
        b = Builder("bn")
        x, w = b.param(F32, (1, 5, 5, 3)), b.param(F32, (3, 3, 3, 4))
        window = (WindowDim(3, 1, 1, 1), WindowDim(3, 1, 1, 1))
        conv = b.op("convolution", [x, w], window=window, dims=ConvDims.from_labels("b01f_01io->b01f"),
                    feature_group_count=1, batch_group_count=1)

        def per_channel() -> Node:
            return b.op("broadcast", [b.param(F32, (1, 4))], shape=(1, 5, 5, 4), dimensions=(0, 3))

        first = b.op("add" if form == "keras" else "subtract", [conv, per_channel()])
        return b.module(b.op("add", [b.op("multiply", [first, per_channel()]), per_channel()]))
    return make


# rules that rewrite a pattern in other operators rather than into a fused one
UNFUSED = frozenset({"batch-norm-keras", "batch-norm-flax"})

CASES: dict[str, Callable[[], Module]] = {
    "batch-norm-keras": _batch_norm("keras"),
    "batch-norm-flax": _batch_norm("flax"),
    "layer-norm-centred": _layer_norm_centred,
    "layer-norm-flax": _layer_norm_flax,
    "layer-norm-two-pass": _layer_norm_two_pass,
    "group-norm-flax": _group_norm_flax,
    "rms-norm-f32-sum": _rms_norm_f32_sum,
    "gelu-erf-xla": _gelu_erf_xla,
    "gelu-tanh": _gelu_jax,
    "gelu-tanh-bf16": lambda: _gelu_jax(BF16),
    "gelu-tanh-torch": _gelu_torch,
    "gelu-tanh-relay": _gelu_relay,
    "silu": _silu("right"),
    "silu-left": _silu("left"),
    "silu-reciprocal": _silu("reciprocal"),
    "softmax": _softmax_pattern(F32, False),
    "softmax-f32-sum": _softmax_pattern(BF16, True),
    "softmax-scale": _scaled(False),
    "softmax-scale-left": _scaled(True),
}


def test_every_model_type_rule_has_a_case():
    assert {r.name for r in catalog().set_rules(["transformer", "attention", "activations", "unet"])} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_fires_and_stays_equivalent(name):
    module = CASES[name]()
    rng = np.random.default_rng(0)
    inputs = [dt.cast(rng.standard_normal(p.type.shape) * 3, p.type.dtype) for p in module.entry.params]
    out = fire_alone(name, module, inputs)
    assert sum(n.op in FUSED for n in out.entry.post_order()) == (0 if name in UNFUSED else 1)
    for a, b in zip(run_module(module, inputs), run_module(out, inputs), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        tol = 2 ** -7 if a.dtype == BF16.np else 1e-6
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


def _extracted(path: Path, model_type: str, level: int = 2) -> Module:
    """The module the compile driver's extract stage hands the backend (same saturation, extractor, costs)."""
    from nxsat import sim
    from nxsat.driver import CompileOptions, _cost_model
    from nxsat.extract import LEVEL_EXTRACTOR, extract
    from nxsat.frontend import load
    from nxsat.passes import canonicalize
    from nxsat.rules import saturate_module

    opts = CompileOptions(model_type=model_type, optlevel=level, auto_cast="matmult")
    sat = saturate_module(canonicalize(load(str(path))), model_type, level, canonical=True)
    cost = _cost_model(sim.load_target("trn1"), opts, ())
    return extract(sat.egraph, sat.loaded, LEVEL_EXTRACTOR[level], cost).module


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("path,scale", [(DATA / "jax" / "softmax.hlo", 1.0),
                                        (DATA / "jax" / "transformer_layer.hlo", 1.0),
                                        (DATA / "hlo" / "mha_block_1x12x128x64_bf16.hlo", 0.125)],
                         ids=["softmax", "transformer_layer", "mha_block"])
def test_the_corpus_softmaxes_become_one_operator(path, scale, level):
    """Under --model-type transformer every softmax of these models is extracted as one fused operator
    (with mha_block's 1/sqrt(64) folded in); under generic none is."""
    fused = [n for n in _extracted(path, "transformer", level).entry.post_order() if n.op == "softmax"]
    assert fused and all(n.attrs["scale"] == scale for n in fused)
    assert not any(n.op == "softmax" for n in _extracted(path, "generic", level).entry.post_order())


@pytest.mark.parametrize("path,model_type,fused", [
    (DATA / "jax" / "unet_tiny.hlo", "unet-inference", {"group-norm": 3, "silu": 3}),
    (DATA / "jax" / "unet_tiny.hlo", "transformer", {"silu": 3}),
    (DATA / "bert" / "bert_base_l2.hlo", "transformer", {"gelu-tanh": 2, "softmax": 2, "layer-norm": 5}),
    (DATA / "hlo" / "layer_norm_1x4096x768_bf16.hlo", "transformer", {"layer-norm": 1}),
    (DATA / "hlo" / "gemma3_1b_flax_call.hlo", "transformer", {"rms-norm": 157, "softmax": 26, "gelu-tanh": 26}),
    # the scores' re-read priced (extract/cost.py _reductions_of): before, the pattern looked fused
    (DATA / "models" / "attention_s2048.hlo", "transformer", {"softmax": 1}),
    (DATA / "models" / "unet_diffusers.hlo", "unet-inference", {"group-norm": 8, "silu": 7, "softmax": 1}),
], ids=["unet_tiny-unet", "unet_tiny-transformer", "bert_l2", "layer_norm", "gemma3", "attention_s2048",
        "unet_diffusers"])
def test_the_corpus_patterns_become_fused_operators(path, model_type, fused):
    ops = [n.op for n in _extracted(path, model_type).entry.post_order()]
    assert {op: ops.count(op) for op in FUSED if op in ops} == fused
    assert not any(op in FUSED for op in (n.op for n in _extracted(path, "generic").entry.post_order()))


@pytest.mark.parametrize("path,count,unmerged", [
    (DATA / "hlo" / "resnet50_keras_jax_f32.hlo", 53, "add"),
    # Flax's (conv - mean) * s + b, at 4x4 to 32x32: the merged shift b - mean * s is a per-channel vector
    # of parameters alone, priced as side work (extract/cost.py ``_side_work``): without that, 15 of the 19
    # stayed unmerged, the [C] steps priced above the full-size subtract they save
    (DATA / "models" / "resnet_small.hlo", 19, "subtract"),
], ids=["resnet50-keras", "resnet_small-flax"])
def test_batch_norms_merge_their_shifts_under_unet_inference(path, count, unmerged):
    """Keras writes each of ResNet-50's 53 convolutions with a bias, then the batch norm's scale and shift;
    Flax subtracts the mean first. Under unet-inference (batch-norm-keras, batch-norm-flax) the extraction
    takes conv * s + shift for every one: the convolution's result is read by the scale; under generic by
    the bias add or the mean's subtraction."""
    for model_type, reader in (("unet-inference", "multiply"), ("generic", unmerged)):
        order = _extracted(path, model_type).entry.post_order()
        readers: dict[int, list[str]] = {}
        for n in order:
            for o in n.operands:
                readers.setdefault(o.id, []).append(n.op)
        convs = [n for n in order if n.op == "convolution"]
        assert len(convs) == count
        assert all(readers[c.id] == [reader] for c in convs), model_type

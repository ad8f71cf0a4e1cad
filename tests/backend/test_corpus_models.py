"""Every model of the corpus (tests/data/hlo, tests/data/relay) compiled by `nxsat compile`'s driver at
-O2 for trn1 and for trn2, run on the simulator with seeded random inputs, against the reference
interpreter on the same inputs (mobilenet_v2's runs only with NXSAT_EXTENDED=1: the suite's budget).

Tolerances: a float output within two units of its type's rounding (at least 1e-5, the issue's XLA
comparison, so 2e-5 for fp32), four for bf16 (2^-6), relative to the output's largest value, since the device fuses
elementwise chains and rounds once where the interpreter rounds after every operator, and sums in
another order; integers exactly. Models dumped without their literals (dlrm, gemma3) get seeded
constants (``--fill-elided-constants``), the interpreter the same ones. mobilenet_v2's training step
is judged output by output against how far one ulp of its images moves the interpreter's result
(nxsat/sensitivity.py, docs/compiling.md "Checking a training step"): its gradients are long sums
that no element-wise tolerance judges.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from harness import DATA, reference_run

from nxsat import sim
from nxsat.cli.model import random_inputs
from nxsat.driver import CompileOptions, compile_model
from nxsat.frontend import load
from nxsat.ir import Module
from nxsat.passes import fill_elided_constants
from nxsat.sensitivity import Table, judge


@dataclass(frozen=True)
class Case:
    path: str
    consts: str | None = None  # Relay: the constants' [shape, dtype] file
    fill: bool = False  # literals elided in the dump
    slow: bool = False
    # scalar parameters given their meaning instead of a random draw, by name: a model whose hardtanh
    # bound is a parameter collapses to constants with a random one, and its gradients are rounding noise
    scalars: tuple[tuple[str, float], ...] = ()
    # a training step: each output judged by the interpreter's own sensitivity to one ulp of the images
    # (nxsat/sensitivity.py; the stored table, made by bench/sensitivity.py --write-table)
    sensitivities: str | None = None
    # run the model the compile built instead of loading the NEFF's bytes back with the race analysis
    # redone (mobilenet_v2: 437,707 instructions took 42-45 s to load; the other models cover the round trip)
    reload: bool = True
    # inputs as a trained model sees them: float matrices N(0, 1/rows) instead of N(0, 1) and integers 0 or
    # 1 (BERT's token ids, token types and mask: a token type over 1 gathers JAX's NaN fill, unit weights
    # overflow in two layers, and a comparison of NaN with NaN proves nothing)
    fan_in: bool = False
    parallel_targets: bool = False  # the two targets' tests in different workers (see _marks)
    # targets whose run the suite leaves to NXSAT_EXTENDED=1 (see _marks)
    extended: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return Path(self.path).stem


CASES = [
    Case("hlo/depthwise_conv_3x3_1x256x56x56_bf16.hlo"),
    Case("hlo/dlrm_keras_jax_f32_test_step.hlo", fill=True, slow=True),
    Case("hlo/gemma3_1b_flax_call.hlo", fill=True, slow=True),
    Case("hlo/layer_norm_1x4096x768_bf16.hlo"),
    Case("hlo/mean_axis_1x4096x1024_bf16.hlo"),
    Case("hlo/mha_block_1x12x128x64_bf16.hlo"),
    Case("hlo/mobilenet_v2.hlo", slow=True,
         scalars=(("p12.42", 6.0), ("p317.2351", 49.0), ("p314.2029", 96.0), ("p315.2045", 0.8)),
         sensitivities="hlo/mobilenet_v2.sensitivity.json", reload=False, parallel_targets=True,
         extended=("trn1", "trn2")),
    Case("hlo/resnet50_keras_jax_f32.hlo", slow=True),
    Case("hlo/sum_axis_1x4096x1024_bf16.hlo"),
    Case("hlo/topk_logits_k10_1x50000_bf16.hlo"),
    Case("hlo/xnn.parallel_dots.optimized.hlo"),
    Case("relay/batch_norm_extract.relay", "relay/batch_norm_extract.consts.tvm.json"),
    Case("relay/gpt2_extract.relay", "relay/gpt2_extract.consts.json", slow=True),
    Case("relay/mnist.relay", "relay/mnist.consts.json"),
    Case("relay/mnist.printed.relay", "relay/mnist.consts.json"),
    Case("relay/resnet50.relay", "relay/resnet50.consts.json", slow=True),
    Case("relay/resnext50_32x4d.relay", "relay/resnext50_32x4d.consts.json", slow=True),
]


def _marks(c: Case, target: str) -> list[pytest.MarkDecorator]:
    # both targets of a model in one worker (--dist loadgroup): the interpreter's reference runs once;
    # except mobilenet_v2's, whose compile and run take 7-8 minutes per target: one on each worker
    marks = [pytest.mark.xdist_group(f"{c.id}-{target}" if c.parallel_targets else c.id)]
    if c.slow:
        marks.append(pytest.mark.slow)
    # mobilenet_v2's training step takes 7 to 9 minutes per target (compile, interpreter, simulator): with
    # both, the suite took 13 to 17 minutes on 2 cores, and with trn1's alone still 16:47 (1,007 s, of which
    # that one test was 554 s) on 2026-11-29, past its 15-minute budget. Its lowering's parts (batch norms
    # in training, depthwise layers and their gradients) have tests of their own; NXSAT_EXTENDED=1 runs it
    if target in c.extended:
        marks.append(pytest.mark.skipif(os.environ.get("NXSAT_EXTENDED") != "1",
                                        reason="7 to 9 minutes: NXSAT_EXTENDED=1 runs it (README, the test command)"))
    return marks


def _params(cases: list[Case]) -> list[object]:
    return [pytest.param(c, t, id=f"{c.id}-{t}", marks=_marks(c, t)) for c in cases for t in ("trn1", "trn2")]


@cache
def _module(case: Case) -> Module:
    kw = {"relay_constants": str(DATA / case.consts)} if case.consts else {}
    m = load(str(DATA / case.path), **kw)
    return fill_elided_constants(m, 0) if case.fill else m


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every xdist worker of this session sees (their base temp directories' parent)."""
    return tmp_path_factory.getbasetemp().parent


def _reference_shared(case: Case, shared: Path) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]:
    """:func:`_reference`, computed by the first worker that needs it and read from a file by the other
    (mobilenet_v2's takes about 110 s; its two targets run on different workers)."""
    import fcntl
    import json

    from nxsat.io import read_npz, write_npz

    path, types = shared / f"reference-{case.id}.npz", shared / f"reference-{case.id}.json"
    with open(shared / f"reference-{case.id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while the first computes it
        if types.exists():  # written last: the arrays are complete
            kinds = json.loads(types.read_text())
            data = {k: v.astype(np.dtype(kinds[k])) for k, v in read_npz(path).items()}  # bf16 is stored as fp32
            n = sum(1 for k in data if k.startswith("out:"))
            return {k[3:]: v for k, v in data.items() if k.startswith("in:")}, tuple(data[f"out:{i}"] for i in range(n))
        inputs, want = _reference(case)
        arrays = {**{f"in:{k}": v for k, v in inputs.items()}, **{f"out:{i}": w for i, w in enumerate(want)}}
        write_npz(path, arrays)
        types.write_text(json.dumps({k: str(np.asarray(v).dtype) for k, v in arrays.items()}))
        return inputs, want


@cache
def _reference(case: Case) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]:
    """The seeded inputs and the interpreter's outputs (shared by both targets' tests)."""
    m = _module(case)
    inputs = random_inputs(m, 0, fixed=dict(case.scalars))
    if case.fan_in:
        inputs = {k: (v / np.sqrt(v.shape[0])).astype(v.dtype) if v.dtype.kind == "f" and v.ndim >= 2 else
                  (v % 2).astype(v.dtype) if v.dtype.kind in "iu" else v for k, v in inputs.items()}
    return inputs, tuple(reference_run(m, inputs))


def _ulp_of(dtype: np.dtype) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).eps) / 2 if dtype.kind == "f" or "float" in str(dtype) else 0.0


@pytest.mark.parametrize("case,target", _params(CASES))
def test_model_compiles_and_matches_the_interpreter(case: Case, target: str, shared_dir: Path) -> None:
    _compiles_and_matches(case, target, "generic", shared_dir)


# The corpus's transformers whose program --model-type transformer changes (fused softmaxes, layer norms and
# GELUs, gpt2_extract's as TVM prints it; the softmax computed by the dot making the scores); BERT's 38M
# weights are seeded inputs, like the others'
# (gemma3's softmaxes are mha_block's form; its 70 s compile and reference are left to bench/model_types.py)
TRANSFORMERS = [c for c in CASES if c.id in ("mha_block_1x12x128x64_bf16", "layer_norm_1x4096x768_bf16")] \
    + [c for c in CASES if c.id == "gpt2_extract"] + [Case("bert/bert_base_l2.hlo", fan_in=True)]


@pytest.mark.parametrize("case,target", [p for p in _params(TRANSFORMERS)
                                         if p.values[1] == "trn1" or not p.values[0].slow])  # type: ignore
def test_transformer_model_type_matches_the_interpreter(case: Case, target: str, shared_dir: Path) -> None:
    _compiles_and_matches(case, target, "transformer", shared_dir)


def _compiles_and_matches(case: Case, target: str, model_type: str, shared: Path) -> None:
    opts = CompileOptions(target=target, optlevel=2, relay_constants=str(DATA / case.consts) if case.consts else None,
                          fill_elided_constants=0 if case.fill else None, model_type=model_type)
    result = compile_model(str(DATA / case.path), opts, keep_model=not case.reload)
    model = sim.load(result.neff, verify=True) if case.reload else result.model
    inputs, want = _reference_shared(case, shared) if case.parallel_targets else _reference(case)
    if case.fan_in:
        assert all(np.isfinite(w).all() for w in want), "the reference overflows: the comparison would prove nothing"
    got = model.run({f"in{i}": v for i, v in enumerate(inputs.values())})
    model = result.model = None  # the simulator's state is gigabytes for mobilenet_v2
    assert len(got) == len(want)
    assert result.report["latency_us"] >= result.report["roofline_us"] > 0
    if case.sensitivities:
        _judge_by_sensitivity(Table.load(DATA / case.sensitivities), want, got)
        return
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"out{k}: {g.dtype}{g.shape}, want {w.dtype}{w.shape}"
        ulp = _ulp_of(w.dtype)
        if not ulp:
            np.testing.assert_array_equal(g, w, err_msg=f"out{k}")
            continue
        gf, wf = g.astype(np.float64), w.astype(np.float64)
        scale = float(np.abs(wf[np.isfinite(wf)]).max(initial=0.0))
        # two units of the type's rounding; four for 16-bit floats, whose models (gemma3) the device runs
        # with fused chains in fp32 where the interpreter rounds after every operator: through norms and
        # softmaxes the roundings drift by a few bf16 units (gemma3 on trn2: 1 of 2,816 elements at 1.2%
        # of its output's largest value)
        tol = max(ulp, 1e-5) * (4 if w.dtype.itemsize == 2 else 2)
        np.testing.assert_allclose(gf, wf, rtol=tol, atol=tol * scale, equal_nan=True, err_msg=f"out{k}")


def _judge_by_sensitivity(table: Table, want: tuple[np.ndarray, ...], got: list[np.ndarray]) -> None:
    why = table.stale(list(want))
    assert why is None, f"the sensitivity table does not fit the interpreter's outputs ({why}): remake it " \
                        "with bench/sensitivity.py --write-table (its docstring)"
    failed = []
    for k, (w, g, sens) in enumerate(zip(want, got, table.sensitivities)):
        if w.dtype.kind in "iu" and w.dtype.itemsize == 8:  # a 32-bit word on the device (NCC_WTYP001)
            w = w.astype(w.dtype.str.replace("8", "4"))
        assert g.shape == w.shape and g.dtype == w.dtype, f"out{k}: {g.dtype}{g.shape}, want {w.dtype}{w.shape}"
        cls, dev, bound = judge(w, g, sens)
        if dev > bound:
            failed.append(f"out{k} ({cls}): deviation {dev:.3g}, bound {bound:.3g}")
    assert not failed, f"{len(failed)} of {len(want)} outputs: " + "; ".join(failed[:10])

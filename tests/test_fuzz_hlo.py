"""Mutated corpus text: the only outcome is a model or a coded diagnostic, never another exception,
never a hang (each example is bounded by hypothesis' deadline). A mutant that loads is also
inspected (canonicalization, FLOPs) and, when small, run on random inputs: a bug there would be an
internal error (NCC_IINT001), which fails the test like any other exception."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA
from nxsat.diagnostics import CODES, NxsatError
from nxsat.frontend.hlo import parse_hlo
from nxsat.interpreter import Interpreter, flatten
from nxsat.ir import TensorType
from nxsat.modelinfo import model_info

SOURCES = {p.name: p.read_text() for p in sorted((DATA / "jax").glob("*.hlo"))}
SOURCES.update({n: (DATA / "hlo" / n).read_text() for n in
                ("dlrm_keras_jax_f32_test_step.hlo", "mha_block_1x12x128x64_bf16.hlo",
                 "xnn.parallel_dots.optimized.hlo", "topk_logits_k10_1x50000_bf16.hlo")})
# One small module per operator corner (gather, scatter, convolution, sort, rng, control flow, ...):
# they exercise every attribute decoder and shape rule.
SOURCES.update({f"xla_ops/{p.name}": p.read_text() for p in sorted((DATA / "xla_ops").glob("*.hlo"))})
NAMES = sorted(SOURCES)
RUN_LIMIT = 1 << 20  # run mutants whose inputs total at most 1 MiB (and no value over 64 MiB)
OPCODES = ["add", "multiply", "dot", "convolution", "reduce", "broadcast", "reshape", "transpose", "slice",
           "gather", "scatter", "while", "call", "tuple", "get-tuple-element", "parameter", "constant", "sort",
           "frobnicate", "select", "compare", "pad", "iota", "concatenate", "convert", "custom-call"]
DTYPES = ["f32", "bf16", "s32", "pred", "u8", "f16", "s64", "c64", "f8e4m3fn", "token", "q7"]


ATTR_VALUES = ["{}", "{0}", "{0,0}", "{1,0}", "{-1}", "{7}", "{2147483648}", "{[0:1]}", "{[2:1]}", "{[0:4:0]}",
               "{size=0}", "{size=2x2 stride=0x1}", "{size=3 pad=-5_-5}", "0_0", "-9_-9_-1", "%nope", '"x"', "x",
               "b01f_01io->b01f", "bf_io->bf", "[2,2]<=[3]", "{{0,1},{1}}", "true", "EQ", "TOTALORDER", "-3", "0"]


def _check(text: str) -> None:
    try:
        module = parse_hlo(text, "fuzz.hlo")
        model_info(module)
        _run_if_small(module)
    except NxsatError as exc:
        assert exc.code in CODES
        assert exc.code != "NCC_IINT001", exc.format()  # an internal error is a bug in nxsat
        line = exc.format()
        assert "\n" not in line and exc.code in line


def _run_if_small(module) -> None:
    params = module.entry.params
    if not all(isinstance(p.type, TensorType) for p in params) or sum(p.type.nbytes for p in params) > RUN_LIMIT:
        return
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(p.type.shape).astype(p.type.dtype.np) if p.type.dtype.is_float
              else rng.integers(0, 4, p.type.shape).astype(p.type.dtype.np) for p in params]
    flatten(Interpreter(module.warnings, max_value_bytes=64 << 20).call(module.entry, inputs))


def _mutate(text: str, data: st.DataObject) -> str:
    lines = text.splitlines(keepends=True)
    kind = data.draw(st.sampled_from(["truncate", "delete", "duplicate", "flip", "shape", "opcode", "dtype",
                                      "swap", "number", "attribute"]))
    if kind == "truncate":
        return text[: data.draw(st.integers(0, len(text)))]
    i = data.draw(st.integers(0, max(len(lines) - 1, 0)))
    if kind == "delete" and lines:
        del lines[i]
    elif kind == "duplicate" and lines:
        lines.insert(i, lines[i])
    elif kind == "swap" and len(lines) > 1:
        j = data.draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "flip":
        pos = data.draw(st.integers(0, max(len(text) - 1, 0)))
        ch = data.draw(st.sampled_from(list("{}()[],=%:;\"'x0-_. \n/*?<>ROOTENTRYa")))
        return text[:pos] + ch + text[pos + 1:]
    elif kind == "shape":
        spots = list(re.finditer(r"\[[\d,]*\]", text))
        if spots:
            m = data.draw(st.sampled_from(spots))
            dims = data.draw(st.lists(st.sampled_from(["0", "1", "2", "3", "7", "?", "<=4", "100000"]), max_size=4))
            return text[: m.start()] + "[" + ",".join(dims) + "]" + text[m.end():]
    elif kind == "opcode":
        spots = list(re.finditer(r"\] ([a-z][a-z\-]*)\(", text))
        if spots:
            m = data.draw(st.sampled_from(spots))
            return text[: m.start(1)] + data.draw(st.sampled_from(OPCODES)) + text[m.end(1):]
    elif kind == "dtype":
        spots = list(re.finditer(r"\b(f32|bf16|s32|pred|u32|s64)\[", text))
        if spots:
            m = data.draw(st.sampled_from(spots))
            return text[: m.start(1)] + data.draw(st.sampled_from(DTYPES)) + text[m.end(1):]
    elif kind == "number":
        spots = list(re.finditer(r"\d+", text))
        if spots:
            m = data.draw(st.sampled_from(spots))
            return text[: m.start()] + str(data.draw(st.sampled_from([0, 1, 2, 5, 64, 2**31, 10**12]))) + text[m.end():]
    elif kind == "attribute":
        spots = list(re.finditer(r", ([a-z_]+)=(\{[^{}]*\}|[^,\s]+)", text))
        if spots:
            m = data.draw(st.sampled_from(spots))
            return text[: m.start(2)] + data.draw(st.sampled_from(ATTR_VALUES)) + text[m.end(2):]
    return "".join(lines)


@settings(max_examples=1500, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.sampled_from(NAMES), st.data())
def test_mutated_corpus_gives_model_or_coded_diagnostic(name, data):
    text = SOURCES[name]
    for _ in range(data.draw(st.integers(1, 3))):
        text = _mutate(text, data)
    _check(text)


def _attribute_sites() -> list[tuple[str, str, int, int]]:
    """The first place each (opcode, attribute) pair occurs in the corpus: (source, key, start, end)."""
    sites: dict[tuple[str, str], tuple[str, str, int, int]] = {}
    for name in NAMES:
        text = SOURCES[name]
        for m in re.finditer(r", ([a-z_]+)=(\{[^{}]*\}|[^,\s]+)", text):
            line = text[text.rfind("\n", 0, m.start()) + 1: text.find("\n", m.end())]
            op = re.search(r" ([a-z\-]+)\(", line)
            key = f"{op.group(1) if op else '-'}:{m.group(1)}"
            sites.setdefault(key, (name, key, m.start(2), m.end(2)))
    return sorted(sites.values(), key=lambda s: s[1])


SCAN_VALUES = ["{}", "{0,0}", "{-1}", "{7}", "{2147483648}", "{[2:1]}", "{size=0}", "{size=3 pad=-5_-5}",
               "-9_-9_-1", "%nope", "bf_io->bf", "[2,2]<=[2,2]T(0,0)", "{{0,1},{1}}", "-3", "0", "99999999999999999999"]


@pytest.mark.parametrize("site", [pytest.param(s, id=s[1]) for s in _attribute_sites()])
def test_every_attribute_decoder_survives_hostile_values(site):
    """Systematic where the mutations above are random: every attribute of every operator in the
    corpus, given each hostile value, loads, inspects and runs or fails with a coded diagnostic."""
    name, _, start, end = site
    text = SOURCES[name]
    for value in SCAN_VALUES:
        _check(text[:start] + value + text[end:])


@settings(max_examples=200, deadline=2000, derandomize=True)
@given(st.text(alphabet=st.sampled_from(list("HloModule ENTRY{}()[]%=,:f32s8pred0123456789.-_x\n ")), max_size=300))
def test_random_text_gives_coded_diagnostic(text):
    _check(text)


def test_pathological_nesting_and_size_are_bounded():
    _check("HloModule m\nENTRY e {\n  ROOT c = f32[2] constant(" + "{" * 5000 + "}" * 5000 + ")\n}\n")
    _check("HloModule m\nENTRY e {\n  ROOT c = (" + "(" * 3000 + "f32[]" + ")" * 3000 + ") parameter(0)\n}\n")
    chain = "".join(f"c{i} {{\n  ROOT r = f32[] call(), to_apply=c{i + 1}\n}}\n" for i in range(3000))
    _check("HloModule m\n" + chain + "c3000 {\n  ROOT r = f32[] constant(1)\n}\n")

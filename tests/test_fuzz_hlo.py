"""Mutated corpus text: the only outcome is a model or a coded diagnostic, never another exception,
never a hang (each example is bounded by hypothesis' deadline)."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DATA
from nxsat.diagnostics import CODES, NxsatError
from nxsat.frontend.hlo import parse_hlo

SOURCES = {p.name: p.read_text() for p in sorted((DATA / "jax").glob("*.hlo"))}
SOURCES.update({n: (DATA / "hlo" / n).read_text() for n in
                ("dlrm_keras_jax_f32_test_step.hlo", "mha_block_1x12x128x64_bf16.hlo",
                 "xnn.parallel_dots.optimized.hlo", "topk_logits_k10_1x50000_bf16.hlo")})
NAMES = sorted(SOURCES)
OPCODES = ["add", "multiply", "dot", "convolution", "reduce", "broadcast", "reshape", "transpose", "slice",
           "gather", "scatter", "while", "call", "tuple", "get-tuple-element", "parameter", "constant", "sort",
           "frobnicate", "select", "compare", "pad", "iota", "concatenate", "convert", "custom-call"]
DTYPES = ["f32", "bf16", "s32", "pred", "u8", "f16", "s64", "c64", "f8e4m3fn", "token", "q7"]


def _check(text: str) -> None:
    try:
        parse_hlo(text, "fuzz.hlo")
    except NxsatError as exc:
        assert exc.code in CODES
        line = exc.format()
        assert "\n" not in line and exc.code in line


def _mutate(text: str, data: st.DataObject) -> str:
    lines = text.splitlines(keepends=True)
    kind = data.draw(st.sampled_from(["truncate", "delete", "duplicate", "flip", "shape", "opcode", "dtype",
                                      "swap", "number"]))
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
    return "".join(lines)


@settings(max_examples=400, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.sampled_from(NAMES), st.data())
def test_mutated_corpus_gives_model_or_coded_diagnostic(name, data):
    text = SOURCES[name]
    for _ in range(data.draw(st.integers(1, 3))):
        text = _mutate(text, data)
    _check(text)


@settings(max_examples=200, deadline=2000, derandomize=True)
@given(st.text(alphabet=st.sampled_from(list("HloModule ENTRY{}()[]%=,:f32s8pred0123456789.-_x\n ")), max_size=300))
def test_random_text_gives_coded_diagnostic(text):
    _check(text)


def test_pathological_nesting_and_size_are_bounded():
    _check("HloModule m\nENTRY e {\n  ROOT c = f32[2] constant(" + "{" * 5000 + "}" * 5000 + ")\n}\n")
    _check("HloModule m\nENTRY e {\n  ROOT c = (" + "(" * 3000 + "f32[]" + ")" * 3000 + ") parameter(0)\n}\n")
    chain = "".join(f"c{i} {{\n  ROOT r = f32[] call(), to_apply=c{i + 1}\n}}\n" for i in range(3000))
    _check("HloModule m\n" + chain + "c3000 {\n  ROOT r = f32[] constant(1)\n}\n")

"""Fuzzing: mutated corpus text (truncated, lines deleted, duplicated or swapped, characters
flipped, numbers and operator names changed) either loads or fails with a coded NxsatError;
never another exception, never a hang."""

from __future__ import annotations

import re
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relay_testkit import DATA
from test_relay_constants import metadata

from nxsat.diagnostics import CODES, NxsatError
from nxsat.frontend.relay import parse_relay
from nxsat.frontend.relay_lower import supported_operators

MODELS = ["mnist", "batch_norm_extract", "gpt2_extract", "resnext50_32x4d"]
TEXTS = {name: (DATA / f"{name}.relay").read_text() for name in MODELS}
SPECS = {
    name: DATA / (f"{name}.consts.tvm.json" if name == "batch_norm_extract" else f"{name}.consts.json")
    for name in MODELS
}
OPS = supported_operators()
MNIST_SHAPES = [(8, 1, 5, 5), (8, 1, 1), (16, 8, 5, 5), (16, 1, 1), (10, 256), (1, 10)]
ALPHABET = "()[]{},;:=%@.-+*/<>!?_\"' \n\t0123456789abcdefxyzfi#"
NUMBER = re.compile(r"-?\d+")
CALL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(?=\()")
WORDS = [
    "fn",
    "let",
    "if",
    "else",
    "match",
    "type",
    "meta",
    "def",
    "True",
    "None",
    "Tensor",
    "float16",
    "int64",
    "%0",
    "@main",
    "/*",
    "*/",
    "//",
    "#[metadata]",
    "ref",
    "_",
    "?",
    "(%x, %x)",
    ".0",
    "1e400f",
    "-inff",
]


def mutate(text: str, data: st.DataObject) -> str:
    kind = data.draw(
        st.sampled_from(["truncate", "delete", "duplicate", "swap", "flip", "insert", "number", "opname", "word"])
    )
    lines = text.split("\n")
    if not text:
        return data.draw(st.sampled_from(WORDS))
    if kind == "truncate":
        return text[: data.draw(st.integers(0, len(text)))]
    if kind in ("delete", "duplicate", "swap"):
        i = data.draw(st.integers(0, len(lines) - 1))
        j = data.draw(st.integers(0, len(lines) - 1))
        if kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(j, lines[i])
        else:
            lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    if kind in ("flip", "insert"):
        pos = data.draw(st.integers(0, len(text) - 1))
        ch = data.draw(st.sampled_from(ALPHABET))
        return text[:pos] + ch + text[pos + (kind == "flip") :]
    spots = list((NUMBER if kind == "number" else CALL).finditer(text))
    if kind == "number" and spots:
        m = data.draw(st.sampled_from(spots))
        value = data.draw(
            st.sampled_from(
                [
                    "0",
                    "1",
                    "-1",
                    "-2",
                    "-3",
                    "-4",
                    "2",
                    "7",
                    "64",
                    "4097",
                    "2147483648",
                    "99999999999999999999",
                    "3i64",
                    "2f",
                ]
            )
        )
        return text[: m.start()] + value + text[m.end() :]
    if kind == "opname" and spots:
        m = data.draw(st.sampled_from(spots))
        name = data.draw(st.sampled_from([*OPS, "nn.frobnicate", "qnn.conv2d", "dyn.reshape", "Cons"]))
        return text[: m.start()] + name + text[m.end() :]
    pos = data.draw(st.integers(0, len(text)))
    return text[:pos] + data.draw(st.sampled_from(WORDS)) + text[pos:]


def check(name: str, text: str) -> None:
    start = time.perf_counter()
    try:
        parse_relay(text, f"{name}.relay", SPECS[name], seed=1)
    except NxsatError as exc:
        assert exc.code in CODES
        assert "\n" not in exc.format()
    assert time.perf_counter() - start < 20, "a mutated model took too long to load"


@settings(max_examples=300, deadline=10_000, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(MODELS[:3]), data=st.data())
def test_mutated_small_models(name, data):
    text = TEXTS[name]
    for _ in range(data.draw(st.integers(1, 3))):
        text = mutate(text, data)
    check(name, text)


@settings(max_examples=40, deadline=10_000, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_resnext(data):
    check("resnext50_32x4d", mutate(TEXTS["resnext50_32x4d"], data))


@settings(max_examples=200, deadline=10_000, derandomize=True)
@given(st.text(alphabet=ALPHABET, max_size=200))
def test_random_text(text):
    check("mnist", '#[version = "0.0.5"]\ndef @main(%x: Tensor[(1, 1, 28, 28), float32]) {' + text)


@settings(max_examples=200, deadline=10_000, derandomize=True)
@given(st.data())
def test_mutated_metadata(data):
    """A damaged #[metadata] section (TVM's JSON with base64 tensors) is NCC_ERLY001, not a crash."""
    rng = np.random.default_rng(0)
    text = TEXTS["mnist"] + metadata(*(rng.standard_normal(s).astype(np.float32) for s in MNIST_SHAPES), indent=None)
    cut = text.index("#[metadata]") + len("#[metadata]\n")
    meta = text[cut:]
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(meta) - 1))
        meta = meta[:pos] + data.draw(st.sampled_from(ALPHABET + "AQZ+/=")) + meta[pos + 1 :]
    try:
        parse_relay(text[:cut] + meta, "mnist.relay", seed=1)
    except NxsatError as exc:
        assert exc.code in CODES

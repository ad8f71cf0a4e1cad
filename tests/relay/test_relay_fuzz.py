"""Fuzzing: mutated corpus text (truncated, lines deleted, duplicated or swapped, characters
flipped, numbers and operator names changed) either loads or fails with a coded NxsatError;
never another exception, never a hang (each parse runs within a budget of function calls)."""

from __future__ import annotations

import functools
import re

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relay_testkit import DATA
from test_relay_constants import metadata

from conftest import CallCounter, count_calls
from nxsat.diagnostics import CODES, NxsatError
from nxsat.frontend.relay import parse_relay
from nxsat.frontend.relay_lower import supported_operators

MODELS = ["mnist", "mnist.printed", "batch_norm_extract", "gpt2_extract", "resnext50_32x4d"]
# The constructs beyond the corpus: a printed function with attributes, closures, if, tuples, a
# let in parentheses, free variables, strided_slice/reshape/split/take special values.
CONSTRUCTS = """#[version = "0.0.5"]
free_var %x: Tensor[(1, 4), float32] /* ty=Tensor[(1, 4), float32] */;
free_var %c: bool;
%0 = fn (%p: Tensor[(1, 4), float32], Primitive=1) -> Tensor[(1, 4), float32] {
  nn.softmax(%p, axis=-1) /* ty=Tensor[(1, 4), float32] */
} /* ty=fn (Tensor[(1, 4), float32]) -> Tensor[(1, 4), float32] */;
%1 = (
  let %y: Tensor[(1, 4), float32] = add(%x, 1f /* ty=float32 */);
  %0(%y)
);
%2 = strided_slice(%1, begin=[0, None], end=[1, 0], strides=[1, -1], axes=None) /* ty=Tensor[(1, 3), float32] */;
%3 = reshape(%1, newshape=[-1, -4, 2, -1]) /* ty=Tensor[(1, 2, 2), float32] */;
%4 = split(%1, indices_or_sections=[1, 3], axis=-1) /* ty=(Tensor[(1, 1), float32], Tensor[(1, 2), float32],
  Tensor[(1, 1), float32]) */;
%5 = if (%c) { (%1, %4.1) } else { (%x, %4.1) };
(%5.0, %3, take(%1, 3, axis=1, mode="wrap"), meta[relay.Constant][0] /* ty=Tensor[(4), float32] */)
"""
SMALL = [*MODELS[:4], "constructs"]
TEXTS = {name: (DATA / f"{name}.relay").read_text() for name in MODELS} | {"constructs": CONSTRUCTS}
SPECS = {
    name: DATA
    / {"batch_norm_extract": "batch_norm_extract.consts.tvm.json", "mnist.printed": "mnist.consts.json"}.get(
        name, f"{name}.consts.json"
    )
    for name in MODELS
} | {"constructs": {0: np.ones(4, np.float32)}}
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
    "free_var %x: float32;",
    "/* ty=Tensor[(1, 10), float16] */",
    "/* ty=(float32, _) */",
    "/* /* nested */",
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


@functools.cache
def budget(name: str) -> int:
    """The function calls a mutant of ``name`` may make: ten times the unmutated model's (a mutation
    changes a few tokens or lines; a hang or a blow-up exceeds any budget). Calls, not seconds, so the
    bound holds on a loaded machine; the seconds are in bench/unit_timings.py."""
    return 10 * count_calls(parse_relay, TEXTS[name], f"{name}.relay", SPECS[name], seed=1) + 100_000


def check(name: str, text: str) -> None:
    with CallCounter(limit=budget(name)):
        try:
            parse_relay(text, f"{name}.relay", SPECS[name], seed=1)
        except NxsatError as exc:
            assert exc.code in CODES
            assert "\n" not in exc.format()


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SMALL), data=st.data())
def test_mutated_small_models(name, data):
    text = TEXTS[name]
    for _ in range(data.draw(st.integers(1, 3))):
        text = mutate(text, data)
    check(name, text)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_resnext(data):
    check("resnext50_32x4d", mutate(TEXTS["resnext50_32x4d"], data))


def test_constructs_text_loads():
    """The fuzzing seed above is itself a valid program."""
    parse_relay(CONSTRUCTS, "constructs.relay", SPECS["constructs"])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(alphabet=ALPHABET, max_size=200))
def test_random_text(text):
    check("mnist", '#[version = "0.0.5"]\ndef @main(%x: Tensor[(1, 1, 28, 28), float32]) {' + text)


@settings(max_examples=200, deadline=None, derandomize=True)
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

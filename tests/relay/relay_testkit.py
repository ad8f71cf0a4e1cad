"""Helpers for the Relay front-end tests: load a program, run it in the reference interpreter,
build small programs from one operator call. (Not a conftest.py: the top-level tests import their
``conftest`` by name, and a second conftest module would shadow it.)"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np

from nxsat.frontend.relay import parse_relay
from nxsat.interpreter import run_module
from nxsat.ir import Module

DATA = Path(__file__).resolve().parent.parent / "data" / "relay"


def relay_type(a: np.ndarray) -> str:
    dims = ", ".join(map(str, a.shape))
    return f"Tensor[({dims}), {'bool' if a.dtype == np.bool_ else a.dtype.name}]"


class Relay:
    """``load(text)`` -> Module; ``run(text, *inputs)`` -> outputs; ``op(call, *inputs)`` wraps one
    call (``%0``, ``%1``, ... name the inputs) in a @main whose parameters are typed from the inputs."""

    def load(self, text: str, consts=None, seed: int = 0, filename: str = "test.relay") -> Module:
        return parse_relay(text, filename, consts, seed)

    def run(self, text: str, *inputs: np.ndarray, consts=None) -> list[np.ndarray]:
        return run_module(self.load(text, consts), list(inputs))

    def program(self, body: str, *inputs: np.ndarray) -> str:
        params = ", ".join(f"%i{k}: {relay_type(np.asarray(a))}" for k, a in enumerate(inputs))
        return f'#[version = "0.0.5"]\ndef @main({params}) {{\n  {body}\n}}\n'

    def op(self, body: str, *inputs: np.ndarray, consts=None) -> np.ndarray:
        outs = self.run(self.program(body, *inputs), *inputs, consts=consts)
        return outs[0] if len(outs) == 1 else outs


relay = Relay()


def tvm_ndarray(a: np.ndarray) -> bytes:
    """TVM's NDArray serialization, written out field by field."""
    code, bits = {"f": (2, 8 * a.itemsize), "i": (0, 8 * a.itemsize), "u": (1, 8 * a.itemsize), "b": (1, 1)}[
        a.dtype.kind
    ]
    head = struct.pack("<QQiii", 0xDD5E40F096B4A13F, 0, 1, 0, a.ndim) + struct.pack("<BBH", code, bits, 1)
    data = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
    return head + struct.pack(f"<{a.ndim}q", *a.shape) + struct.pack("<q", len(data)) + data


def metadata(*arrays: np.ndarray, indent: int | None = 2) -> str:
    nodes = [
        {"type_key": ""},
        {"type_key": "Map", "keys": ["relay.Constant"], "data": [2]},
        {"type_key": "Array", "data": [3 + i for i in range(len(arrays))]},
    ]
    nodes += [
        {"type_key": "relay.Constant", "attrs": {"data": str(i), "span": "0", "_checked_type_": "0"}}
        for i in range(len(arrays))
    ]
    graph = {
        "root": 1,
        "nodes": nodes,
        "attrs": {"tvm_version": "0.19.0"},
        "b64ndarrays": [base64.b64encode(tvm_ndarray(a)).decode() for a in arrays],
    }
    return "#[metadata]\n" + json.dumps(graph, indent=indent) + "\n"

"""The ``#[metadata]`` section TVM's printer appends (``astext(show_meta_data=True)``): TVM's JSON
object graph whose root maps ``relay.Constant`` to the list of constants, each pointing at a
tensor in ``b64ndarrays`` (base64 of TVM's NDArray serialization: magic, reserved, device, ndim,
dtype code/bits/lanes, shape, byte size, little-endian data). Reading it lets a model carry its own
weights, so ``--relay-constants`` is not needed.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import Loc, error

_MAGIC = 0xDD5E40F096B4A13F
# DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat.
_DTYPES = {
    (0, 8): dt.S8,
    (0, 16): dt.S16,
    (0, 32): dt.S32,
    (0, 64): dt.S64,
    (1, 1): dt.PRED,
    (1, 8): dt.U8,
    (1, 16): dt.U16,
    (1, 32): dt.U32,
    (1, 64): dt.U64,
    (2, 16): dt.F16,
    (2, 32): dt.F32,
    (2, 64): dt.F64,
    (4, 16): dt.BF16,
}


def read_metadata(text: str, loc: Loc) -> dict[int, np.ndarray]:
    """The ``relay.Constant`` values of a metadata section (index -> array); NCC_ERLY001 when it
    is not what TVM writes."""
    try:
        graph = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error("NCC_ERLY001", f"#[metadata] is not valid JSON ({exc.msg} at line {exc.lineno})", loc) from None
    except (ValueError, RecursionError) as exc:  # a number too long to convert, nesting too deep
        raise error("NCC_ERLY001", f"#[metadata] is unreadable JSON ({str(exc)[:80]})", loc) from None
    try:
        return _constants(graph, loc)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, struct.error, binascii.Error) as exc:
        raise error(
            "NCC_ERLY001",
            f"#[metadata] is not a TVM metadata table ({type(exc).__name__}: {str(exc)[:100]})",
            loc,
        ) from None


def _constants(graph: Any, loc: Loc) -> dict[int, np.ndarray]:
    nodes = graph["nodes"]
    root = nodes[int(graph["root"])]
    arrays = graph.get("b64ndarrays", [])
    keys, data = root.get("keys", []), root.get("data", [])
    if "relay.Constant" not in keys:
        return {}
    listing = nodes[int(data[keys.index("relay.Constant")])]
    out: dict[int, np.ndarray] = {}
    for i, node_index in enumerate(listing.get("data", [])):
        node = nodes[int(node_index)]
        if node.get("type_key") != "relay.Constant":
            raise ValueError(f"entry {i} is a {node.get('type_key')!r}, not a relay.Constant")
        out[i] = decode_ndarray(base64.b64decode(arrays[int(node["attrs"]["data"])], validate=True), loc)
    return out


def decode_ndarray(blob: bytes, loc: Loc) -> np.ndarray:
    """One tensor in TVM's NDArray byte format."""
    magic, _reserved, _dev_type, _dev_id, ndim = struct.unpack_from("<QQiii", blob, 0)
    if magic != _MAGIC:
        raise ValueError("bad NDArray magic number")
    code, bits, lanes = struct.unpack_from("<BBH", blob, 28)
    d = _DTYPES.get((code, bits))
    if d is None or lanes != 1:
        raise error(
            "NCC_ESPP004",
            f"#[metadata]: constant element type (code {code}, {bits} bits, {lanes} lanes) is not supported",
            loc,
        )
    if not 0 <= ndim <= 32:
        raise ValueError(f"rank {ndim}")
    shape = struct.unpack_from(f"<{ndim}q", blob, 32)
    if any(n < 0 for n in shape):
        raise ValueError(f"negative dimension in {shape}")
    (nbytes,) = struct.unpack_from("<q", blob, 32 + 8 * ndim)
    start = 40 + 8 * ndim
    itemsize = (bits + 7) // 8
    if nbytes != itemsize * math.prod(shape) or len(blob) < start + nbytes:
        raise ValueError(f"{nbytes} data bytes for shape {list(shape)}")
    # TVM writes little-endian data, as the hosts nxsat runs on store it.
    raw = np.frombuffer(blob, dtype=np.uint8 if d.is_pred else d.np, count=math.prod(shape), offset=start)
    return (raw != 0 if d.is_pred else raw.copy()).reshape(shape)

"""The NEFF container: one file with a manifest, the device program and its constants (docs/neff.md).

Layout: a 64-byte header (magic, format version, CRC-32 of the header, total size, manifest size,
SHA-256 of the manifest), the manifest (canonical JSON), then the members at 64-byte aligned
offsets (the program text, one ``.npy`` per constant), each with its SHA-256 in the manifest.
Writing is deterministic: the same program and constants give the same bytes. Reading checks, in
order, everything that can be wrong with the file and refuses it with its own code; nothing in it
is ever executed or unpickled.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import struct
import tokenize
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from nxsat import dtypes as dt
from nxsat.diagnostics import error

MAGIC = b"NXSNEFF\x00"
FORMAT_VERSION = (1, 0)
HEADER = struct.Struct("<8sHHIQQ32s")  # magic, major, minor, crc32, total, manifest size, manifest sha256
HEADER_SIZE = HEADER.size  # 64
ALIGN = 64
MAX_MANIFEST = 64 << 20
MAX_MEMBERS = 100_000
PROGRAM_MEMBER = "program.nxs"
_CONST_MEMBER = re.compile(r"const/([A-Za-z_][A-Za-z0-9_]*)\.npy")

# Constants are stored as their raw bits when numpy's format cannot name the type.
_BITS = {"bf16": np.uint16, "f8e4m3fn": np.uint8, "f8e5m2": np.uint8}


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def npy_bytes(a: np.ndarray, dtype: dt.DType) -> bytes:
    """One constant as .npy bytes (raw bits for bf16/fp8), without pickle."""
    a = np.ascontiguousarray(a)
    if dtype.name in _BITS:
        a = a.view(_BITS[dtype.name])
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def npy_array(data: bytes, dtype: dt.DType, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Parse one constant member and check it is exactly what the manifest says.

    The header is read and checked against the manifest before any array is allocated (a header
    may claim any shape), and the member must be the canonical bytes nxsat writes, so that
    disassembling and assembling again gives the same NEFF.
    """
    stored = np.dtype(_BITS.get(dtype.name, dtype.np))
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            hshape, fortran, hdtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            hshape, fortran, hdtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError, OSError, EOFError,
            tokenize.TokenError) as exc:  # numpy parses the header with tokenize and ast.literal_eval
        raise error("NCC_ENEF002", f"{what} is not a readable .npy array ({str(exc)[:200]})") from None
    if hdtype != stored or tuple(hshape) != tuple(shape) or fortran:
        raise error("NCC_ENEF003", f"{what} holds {hdtype}{list(hshape)}"
                    + (" (Fortran order)" if fortran else "")
                    + f", the manifest says {dtype.name}{list(shape)}")
    count = math.prod(shape)
    start = f.tell()
    if len(data) - start != count * stored.itemsize:
        raise error("NCC_ENEF002", f"{what} holds {len(data) - start} data bytes, its header says "
                    f"{count * stored.itemsize}")
    a = np.frombuffer(data, dtype=stored, count=count, offset=start).reshape(shape).copy()
    if npy_bytes(a, dtype) != data:
        raise error("NCC_ENEF003", f"{what} is not in the canonical form nxsat writes",
                    hint="the NEFF was edited; recompile")
    return a.view(dtype.np) if dtype.name in _BITS else a


def pack(manifest: dict[str, Any], members: list[tuple[str, bytes]]) -> bytes:
    """The NEFF bytes for a manifest (without ``members``) and the member blobs in order."""
    listing = []
    offset = 0
    for name, blob in members:
        offset = _align(offset)
        listing.append({"name": name, "offset": offset, "size": len(blob),
                        "sha256": hashlib.sha256(blob).hexdigest()})
        offset += len(blob)
    man = dict(manifest)
    man["members"] = listing
    mbytes = json.dumps(man, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    data_start = _align(HEADER_SIZE + len(mbytes))
    total = data_start + offset
    out = bytearray(total)
    out[HEADER_SIZE:HEADER_SIZE + len(mbytes)] = mbytes
    for entry, (_, blob) in zip(listing, members):
        at = data_start + entry["offset"]
        out[at:at + len(blob)] = blob
    header = HEADER.pack(MAGIC, FORMAT_VERSION[0], FORMAT_VERSION[1], 0, total, len(mbytes),
                         hashlib.sha256(mbytes).digest())
    crc = zlib.crc32(header)
    out[:HEADER_SIZE] = HEADER.pack(MAGIC, FORMAT_VERSION[0], FORMAT_VERSION[1], crc, total, len(mbytes),
                                    hashlib.sha256(mbytes).digest())
    return bytes(out)


@dataclass
class Container:
    """A validated container: the manifest and the member bytes by name."""

    manifest: dict[str, Any]
    members: dict[str, bytes]
    version: tuple[int, int]


def unpack(data: bytes, source: str = "<neff>") -> Container:
    """Check the container layer and return its parts; each kind of damage has its own code."""
    n = len(data)
    if n < len(MAGIC):
        if n and MAGIC.startswith(data):
            raise error("NCC_ENEF001", f"{source}: truncated NEFF ({n} bytes)")
        raise error("NCC_ENEF006", f"{source}: not an nxsat NEFF (no NXSNEFF header)",
                    hint="is this a NEFF from another compiler? recompile with nxsat")
    if data[:len(MAGIC)] != MAGIC:
        raise error("NCC_ENEF006", f"{source}: not an nxsat NEFF (no NXSNEFF header)",
                    hint="is this a NEFF from another compiler? recompile with nxsat")
    if n < HEADER_SIZE:
        raise error("NCC_ENEF001", f"{source}: truncated NEFF ({n} bytes, the header alone is {HEADER_SIZE})")
    magic, major, minor, crc, total, msize, msha = HEADER.unpack_from(data, 0)
    zeroed = HEADER.pack(magic, major, minor, 0, total, msize, msha)
    if zlib.crc32(zeroed) != crc:
        raise error("NCC_ENEF002", f"{source}: corrupted NEFF: the header fails its checksum")
    if major != FORMAT_VERSION[0]:
        raise error("NCC_ENEF004", f"{source}: NEFF format {major}.{minor}, but this nxsat reads format "
                    f"{FORMAT_VERSION[0]}.x", hint="recompile with this nxsat")
    if n < total:
        raise error("NCC_ENEF001", f"{source}: truncated NEFF: {n} of {total} bytes",
                    hint="the file was cut short; copy or write it again")
    if n > total:
        raise error("NCC_ENEF002", f"{source}: corrupted NEFF: {n - total} unexpected byte(s) after the end")
    if msize > MAX_MANIFEST or HEADER_SIZE + msize > total:
        raise error("NCC_ENEF002", f"{source}: corrupted NEFF: manifest size {msize} does not fit the file")
    mbytes = data[HEADER_SIZE:HEADER_SIZE + msize]
    if hashlib.sha256(mbytes).digest() != msha:
        raise error("NCC_ENEF003", f"{source}: the NEFF manifest does not match its checksum: it was edited or "
                    "corrupted", hint="recompile the model; never edit a NEFF by hand")
    try:
        manifest = json.loads(mbytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: JSON syntax, huge ints
        raise error("NCC_ENEF003", f"{source}: malformed NEFF manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "nxsat-neff":
        raise error("NCC_ENEF003", f"{source}: malformed NEFF manifest (not an nxsat-neff manifest)")
    fv = manifest.get("format_version")
    if fv != f"{major}.{minor}":
        raise error("NCC_ENEF003", f"{source}: manifest format_version {fv!r} disagrees with the header "
                    f"({major}.{minor})")
    listing = manifest.get("members")
    if not isinstance(listing, list) or not listing or len(listing) > MAX_MEMBERS:
        raise error("NCC_ENEF003", f"{source}: malformed NEFF manifest (member list)")
    data_start = _align(HEADER_SIZE + msize)
    if any(data[HEADER_SIZE + msize:min(data_start, n)]):
        raise error("NCC_ENEF002", f"{source}: corrupted NEFF: non-zero padding after the manifest")
    members: dict[str, bytes] = {}
    expect = 0
    for entry in listing:
        if (not isinstance(entry, dict) or set(entry) != {"name", "offset", "size", "sha256"}
                or not isinstance(entry["name"], str) or not isinstance(entry["offset"], int)
                or not isinstance(entry["size"], int) or not isinstance(entry["sha256"], str)):
            raise error("NCC_ENEF003", f"{source}: malformed NEFF manifest (member entry {entry!r:.80})")
        name = entry["name"]
        if name != PROGRAM_MEMBER and not _CONST_MEMBER.fullmatch(name):
            raise error("NCC_ENEF003", f"{source}: unexpected NEFF member {name!r}")
        if name in members:
            raise error("NCC_ENEF003", f"{source}: duplicate NEFF member {name!r}")
        start = _align(expect)
        if entry["offset"] != start or entry["size"] < 0 or data_start + start + entry["size"] > total:
            raise error("NCC_ENEF003", f"{source}: NEFF member {name} is not where the layout puts it")
        if any(data[data_start + expect:data_start + start]):
            raise error("NCC_ENEF002", f"{source}: corrupted NEFF: non-zero padding before {name}")
        blob = data[data_start + start:data_start + start + entry["size"]]
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            raise error("NCC_ENEF002", f"{source}: corrupted NEFF: member {name} fails its checksum",
                        hint="the file was damaged; copy or write it again")
        members[name] = blob
        expect = start + entry["size"]
    if data_start + expect != total:
        raise error("NCC_ENEF003", f"{source}: the NEFF members do not end where the file ends")
    if PROGRAM_MEMBER not in members:
        raise error("NCC_ENEF003", f"{source}: the NEFF has no {PROGRAM_MEMBER}")
    return Container(manifest, members, (major, minor))

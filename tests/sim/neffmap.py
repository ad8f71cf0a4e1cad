"""A map of a NEFF's bytes (docs/neff.md, read here with struct and json, not with the loader) and
writers that damage or edit one region while keeping, or not, every checksum consistent.

Regions: the header's fields, the manifest, the zero padding after it, each member, the zero
padding between members, and the tail (what follows the last member).
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

HEADER = struct.Struct("<8sHHIQQ32s")
HEADER_SIZE = 64
ALIGN = 64
MAGIC = b"NXSNEFF\x00"
# Header fields: name -> (offset, size), docs/neff.md's layout table.
FIELDS = {"magic": (0, 8), "major": (8, 2), "minor": (10, 2), "crc": (12, 4), "total": (16, 8),
          "manifest_size": (24, 8), "manifest_sha": (32, 32)}


# Constants whose .npy members are not multiples of 64 bytes: zero padding between every member.
ODD_TEXT = """
.isa 1.0
.target trn1
input   x: f32[3, 5]
const   a: f32[3, 5]
const   b: bf16[3, 7]
const   c: u8[5, 3]
output  y: f32[3, 5]
output  z: bf16[3, 7]
output  w: u8[5, 3]
sbuf    xs: f32[3, 5]
sbuf    as: f32[3, 5]
sem     s
q0    dma            xs, x, signal=s
q1    dma            as, a, signal=s
dve   tensor_tensor  xs, xs, as, op=add, wait=s>=2, signal=s
q0    dma            y, xs, wait=s>=3
q2    dma            z, b
q3    dma            w, c
"""


def odd_sample() -> tuple[bytes, dict[str, np.ndarray]]:
    """A NEFF with every region: three constants (copied to outputs) of sizes that leave padding."""
    from nxsat import sim

    consts = {"a": np.arange(15, dtype=np.float32).reshape(3, 5) / 4,
              "b": (np.arange(21).reshape(3, 7) - 10).astype(np.float32).astype(ml_dtypes.bfloat16),
              "c": np.arange(15, dtype=np.uint8).reshape(5, 3) * 7}
    return sim.assemble(ODD_TEXT, "odd.nxs", consts), consts


def flip_code(region: str) -> tuple[str, str]:
    """(code, message fragment) the loader gives a file with one byte of ``region`` changed."""
    if region == "header.magic":
        return "NCC_ENEF006", "not an nxsat NEFF"
    if region.startswith("header."):
        return "NCC_ENEF002", "header fails its checksum"
    if region == "manifest":
        return "NCC_ENEF003", "does not match its checksum"
    if region == "manifest_padding":
        return "NCC_ENEF002", "non-zero padding after the manifest"
    kind, name = region.split(":", 1)
    if kind == "member":
        return "NCC_ENEF002", f"member {name} fails its checksum"
    return "NCC_ENEF002", f"non-zero padding before {name}"


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class Layout:
    """Where each region of a NEFF lies: (start, end) byte ranges."""

    header: dict[str, tuple[int, int]]
    manifest: tuple[int, int]
    manifest_padding: tuple[int, int]
    members: list[tuple[str, int, int]]
    paddings: list[tuple[str, int, int]]  # (the member it precedes, start, end), non-empty ones
    total: int
    data_start: int

    def regions(self) -> list[tuple[str, int, int]]:
        """Every non-empty region as (name, start, end), in file order."""
        out = [(f"header.{k}", a, b) for k, (a, b) in self.header.items()]
        out.append(("manifest", *self.manifest))
        if self.manifest_padding[1] > self.manifest_padding[0]:
            out.append(("manifest_padding", *self.manifest_padding))
        out += [(f"member:{n}", a, b) for n, a, b in self.members]
        out += [(f"padding:{n}", a, b) for n, a, b in self.paddings]
        return sorted(out, key=lambda r: r[1])


def fields(data: bytes) -> dict[str, Any]:
    magic, major, minor, crc, total, msize, msha = HEADER.unpack_from(data, 0)
    return {"magic": magic, "major": major, "minor": minor, "crc": crc, "total": total, "manifest_size": msize,
            "manifest_sha": msha}


def manifest(data: bytes) -> dict[str, Any]:
    msize = fields(data)["manifest_size"]
    return json.loads(data[HEADER_SIZE:HEADER_SIZE + msize])


def layout(data: bytes) -> Layout:
    f = fields(data)
    msize = f["manifest_size"]
    start = align(HEADER_SIZE + msize)
    members, paddings = [], []
    end_prev = 0
    for e in manifest(data)["members"]:
        if e["offset"] > end_prev:
            paddings.append((e["name"], start + end_prev, start + e["offset"]))
        members.append((e["name"], start + e["offset"], start + e["offset"] + e["size"]))
        end_prev = e["offset"] + e["size"]
    header = {k: (o, o + n) for k, (o, n) in FIELDS.items()}
    return Layout(header, (HEADER_SIZE, HEADER_SIZE + msize), (HEADER_SIZE + msize, start), members, paddings,
                  f["total"], start)


def header_bytes(magic: bytes, major: int, minor: int, total: int, msize: int, msha: bytes,
                 crc: int | None = None) -> bytes:
    """A header; its CRC computed unless given."""
    zero = HEADER.pack(magic, major, minor, 0, total, msize, msha)
    return HEADER.pack(magic, major, minor, zlib.crc32(zero) if crc is None else crc, total, msize, msha)


def with_header(data: bytes, **changes: Any) -> bytes:
    """The file with header fields changed and the header CRC recomputed (unless ``crc`` is given)."""
    f = fields(data) | changes
    head = header_bytes(f["magic"], f["major"], f["minor"], f["total"], f["manifest_size"], f["manifest_sha"],
                        changes.get("crc"))
    return head + data[HEADER_SIZE:]


def pack(mbytes: bytes, area: bytes, major: int = 1, minor: int = 0) -> bytes:
    """A container around any manifest bytes and member area, with a consistent header."""
    start = align(HEADER_SIZE + len(mbytes))
    total = start + len(area)
    head = header_bytes(MAGIC, major, minor, total, len(mbytes), hashlib.sha256(mbytes).digest())
    return head + mbytes + bytes(start - HEADER_SIZE - len(mbytes)) + area


def canonical_json(man: dict[str, Any]) -> bytes:
    return json.dumps(man, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def member_area(data: bytes) -> bytes:
    return data[layout(data).data_start:]


def with_manifest(data: bytes, mbytes: bytes) -> bytes:
    """The same member area under other manifest bytes (header size, SHA-256 and CRC fixed)."""
    f = fields(data)
    return pack(mbytes, member_area(data), f["major"], f["minor"])


def members_of(data: bytes) -> list[tuple[str, bytes]]:
    lay = layout(data)
    return [(n, data[a:b]) for n, a, b in lay.members]


def rebuild(man: dict[str, Any], members: list[tuple[str, bytes]], fix_sha: bool = True) -> bytes:
    """A NEFF of these members laid out as docs/neff.md says, the manifest listing them (with their
    SHA-256 unless ``fix_sha`` is false: then the listed checksums are ``man``'s)."""
    old = {e["name"]: e for e in man.get("members", [])}
    listing, area = [], b""
    for name, blob in members:
        off = align(len(area))
        area += bytes(off - len(area)) + blob
        sha = hashlib.sha256(blob).hexdigest() if fix_sha or name not in old else old[name]["sha256"]
        listing.append({"name": name, "offset": off, "size": len(blob), "sha256": sha})
    return pack(canonical_json(man | {"members": listing}), area)


def with_member(data: bytes, name: str, blob: bytes, fix_sha: bool = True) -> bytes:
    """The file with one member's bytes replaced (the manifest's listing, and its checksum, updated)."""
    man = manifest(data)
    members = [(n, blob if n == name else b) for n, b in members_of(data)]
    return rebuild(man, members, fix_sha)


def flip(data: bytes, at: int, mask: int = 0x01) -> bytes:
    b = bytearray(data)
    b[at] ^= mask
    return bytes(b)


def put(data: bytes, at: int, value: bytes) -> bytes:
    b = bytearray(data)
    b[at:at + len(value)] = value
    return bytes(b)

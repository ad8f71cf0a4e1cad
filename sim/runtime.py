"""The runtime: build a NEFF from a device program, load one (validating everything), run it.

``assemble`` and ``build_neff`` are the writers (text form, or a :class:`Program` from the
backend); ``load`` is the loader the commands use; ``Model.run`` computes outputs with the
functional executor and ``Model.profile`` replays the timing model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nxsat import __version__
from nxsat import dtypes as dt
from nxsat.collector import no_cycle_collection
from nxsat.diagnostics import Warnings, error
from nxsat.ir import TensorType
from nxsat.sim import neff
from nxsat.sim.asm import format_program, parse
from nxsat.sim.execute import execute
from nxsat.sim.program import Program, Tensor
from nxsat.sim.report import chrome_trace, summarize
from nxsat.sim.target import Target, load_target, target_names
from nxsat.sim.timing import Timeline, simulate
from nxsat.sim.verify import Linked, link

DEFAULT_MAX_NEFF_BYTES = 16 << 30


def resolve_target(prog: Program, target: str | None, lnc: int | None) -> Target:
    """The target a program is built for: its ``.target`` or the one given (they must agree)."""
    name = prog.target or target
    if prog.target and target and prog.target != target:
        raise error("NCC_EARG002", f"--target {target} but the program says .target {prog.target}")
    if name is None:
        raise error("NCC_EARG002", "no target: give --target or write .target in the program",
                    hint="targets: " + ", ".join(target_names()))
    if prog.lnc is not None and lnc is not None and prog.lnc != lnc:
        raise error("NCC_EARG001", f"--lnc {lnc} but the program says .lnc {prog.lnc}")
    return load_target(name, prog.lnc if prog.lnc is not None else lnc)


def _signature(prog: Program, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"name": t.name, "dtype": t.dtype.name, "shape": list(prog.global_shape(t)), "shard": t.shard}
            | ({"alias": t.alias} if t.alias is not None else {})
            for t in prog.tensors.values() if t.kind in kinds]


def conform_constants(prog: Program, constants: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Each ``const`` tensor's value in its exact type; refuse missing, extra, mis-shaped or lossy ones."""
    constants = dict(constants or {})
    out: dict[str, np.ndarray] = {}
    for t in prog.consts():
        if t.name not in constants:
            raise error("NCC_EASM010", f"no value for constant {t.name} ({t.dtype.name}{list(t.shape)})",
                        hint="give it in the --constants .npz under its name")
        a = np.asarray(constants.pop(t.name))
        if tuple(a.shape) != t.shape:
            raise error("NCC_EASM010", f"constant {t.name} has shape {list(a.shape)}, declared {list(t.shape)}")
        out[t.name] = _exact(a, t, f"constant {t.name}", "NCC_EASM010")
    if constants:
        raise error("NCC_EASM010", f"{', '.join(sorted(constants))}: no const tensor of that name")
    return out


def _exact(a: np.ndarray, t: Tensor, what: str, code: str) -> np.ndarray:
    if a.dtype == t.dtype.np:
        return a
    src_float = a.dtype.kind == "f" or a.dtype in (dt.BF16.np, dt.F8E4M3FN.np, dt.F8E5M2.np)
    if t.dtype.is_float and src_float:
        b = dt.cast(a, t.dtype)
        back = b.astype(np.float64)
        orig = a.astype(np.float64)
        if not np.array_equal(back, orig, equal_nan=True):
            raise error(code, f"{what}: values are not exactly representable in {t.dtype.name}",
                        hint="convert them before assembling")
        return b
    if (t.dtype.is_int or t.dtype.is_pred) and a.dtype.kind in "iub":
        b = a.astype(t.dtype.np)
        if not np.array_equal(b.astype(np.int64), a.astype(np.int64)):
            raise error(code, f"{what}: values do not fit {t.dtype.name}")
        return b
    raise error(code, f"{what} is {a.dtype}, declared {t.dtype.name}")


def build_neff(prog: Program, target: Target, constants: Mapping[str, np.ndarray] | None = None) -> bytes:
    """Check a program for ``target`` and write its NEFF bytes (deterministic). ``prog`` is not modified."""
    return build_model(prog, target, constants)[0]


@no_cycle_collection()
def build_model(prog: Program, target: Target, constants: Mapping[str, np.ndarray] | None = None
                ) -> tuple[bytes, Model]:
    """:func:`build_neff`, and the model those bytes load as, without reading them back.

    A compiler runs the NEFF it has just written: parsing its own text again would only repeat the
    printer and parser's round trip (the corpus tests load every compiled NEFF back with ``verify``), and on compiler
    output parsing costs ~100 us an instruction (gemma3: 27 s of a 100 s compile)."""
    return encode(link(prog, target), constants)


@no_cycle_collection()
def encode(lk: Linked, constants: Mapping[str, np.ndarray] | None = None) -> tuple[bytes, Model]:
    """The NEFF bytes of a linked program and the model they load as. :func:`build_model` links with the
    race check; a compiler may link without it (``link(..., races=False)``) and run
    ``verify.check_races`` beside the encoding and the simulation, and then writes the bytes only once it
    has passed."""
    target = lk.target
    prog = lk.program
    consts = conform_constants(prog, constants)
    text = format_program(prog, target.psum_bank_bytes)
    manifest = {
        "format": "nxsat-neff",
        "format_version": f"{neff.FORMAT_VERSION[0]}.{neff.FORMAT_VERSION[1]}",
        "nxsat_version": __version__,
        "isa_version": f"{prog.version[0]}.{prog.version[1]}",
        "target": target.name,
        "lnc": target.lnc,
        "ranks": prog.ranks,
        "compile_flags": list(prog.flags),
        "verified_by": __version__,
        "inputs": _signature(prog, ("input",)),
        "outputs": _signature(prog, ("output",)),
        "constants": [{"name": t.name, "dtype": t.dtype.name, "shape": list(t.shape),
                       "member": f"const/{t.name}.npy"} for t in prog.consts()],
    }
    members = [(neff.PROGRAM_MEMBER, text.encode("utf-8"))]
    members += [(f"const/{t.name}.npy", neff.npy_bytes(consts[t.name], t.dtype)) for t in prog.consts()]
    data = neff.pack(manifest, members)
    packed = neff.unpack(data, "<built>").manifest  # with the member table pack adds
    return data, Model("<built>", packed, text, lk, {t.name: consts[t.name] for t in prog.consts()})


def assemble(text: str, source: str = "<program>", constants: Mapping[str, np.ndarray] | None = None,
             target: str | None = None, lnc: int | None = None) -> bytes:
    """The NEFF of a device program in text form."""
    prog = parse(text, source)
    return build_neff(prog, resolve_target(prog, target, lnc), constants)


@dataclass
class Model:
    """A loaded, validated NEFF."""

    source: str
    manifest: dict[str, Any]
    text: str
    linked: Linked
    consts: dict[str, np.ndarray]

    @property
    def program(self) -> Program:
        return self.linked.program

    @property
    def target(self) -> Target:
        return self.linked.target

    def match_inputs(self, arrays: Mapping[str, np.ndarray], source: str = "inputs") -> dict[str, np.ndarray]:
        """Inputs by position (``in0``, ``in1``, ...) or by name, converted like ``nxsat interpret``."""
        from nxsat.io import conform_input

        prog = self.program
        out: dict[str, np.ndarray] = {}
        used: set[str] = set()
        for i, t in enumerate(prog.inputs()):
            key = next((k for k in (f"in{i}", t.name) if k in arrays), None)
            shape = prog.global_shape(t)
            if key is None:
                raise error("NCC_EINP001", f"{source}: no value for input {i} ({t.name}: {t.dtype.name}{list(shape)})",
                            hint=f"give it as in{i} or {t.name}")
            used.add(key)
            out[t.name] = conform_input(arrays[key], TensorType(t.dtype, shape), f"{source}[{key}]")
        extra = sorted(k for k in set(arrays) - used if not re.fullmatch(r"out\d+", k))
        if extra:
            raise error("NCC_EINP001", f"{source}: {', '.join(extra)} match no input of {self.source}",
                        hint=f"the model takes {len(prog.inputs())} input(s)")
        return out

    def run(self, arrays: Mapping[str, np.ndarray], source: str = "inputs",
            warnings: Warnings | None = None) -> list[np.ndarray]:
        """Outputs (host shapes) for the given inputs; runtime warnings go to ``warnings``."""
        return execute(self.linked, self.match_inputs(arrays, source), self.consts, warnings)

    def timeline(self) -> Timeline:
        return simulate(self.linked)

    def profile(self) -> tuple[dict[str, Any], Timeline]:
        tl = simulate(self.linked)
        return summarize(self.linked, tl), tl

    def trace(self, tl: Timeline, critical: frozenset[int] = frozenset()) -> str:
        return chrome_trace(self.linked, tl, critical)


def max_neff_bytes() -> int:
    """The largest NEFF the runtime reads (NXSAT_MAX_NEFF_BYTES, default 16 GiB)."""
    try:
        return int(os.environ.get("NXSAT_MAX_NEFF_BYTES", DEFAULT_MAX_NEFF_BYTES))
    except ValueError:
        return DEFAULT_MAX_NEFF_BYTES


def read_file(path: str | os.PathLike) -> bytes:
    """A NEFF's bytes, refusing a missing, unreadable or oversized file with a coded error."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_neff_bytes():
            raise error("NCC_ERUN001", f"{path}: {size} bytes; NEFFs up to {max_neff_bytes()} bytes are read",
                        hint="raise NXSAT_MAX_NEFF_BYTES")
        return p.read_bytes()
    except FileNotFoundError:
        raise error("NCC_EFIL001", f"{path}: no such file") from None
    except IsADirectoryError:
        raise error("NCC_EFIL001", f"{path}: is a directory") from None
    except OSError as exc:
        raise error("NCC_EFIL001", f"{path}: {exc.strerror or exc}") from None


def _manifest_field(man: dict[str, Any], key: str, kind: type, source: str) -> Any:
    v = man.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise error("NCC_ENEF003", f"{source}: malformed NEFF manifest ({key})")
    return v


@no_cycle_collection()
def load(data: bytes, source: str = "<neff>", target: str | None = None, lnc: int | None = None,
         verify: bool = False) -> Model:
    """Validate a NEFF and return the runnable model.

    Integrity (checksums) and structure (every declaration, access and instruction, deadlocks,
    accumulation groups, output coverage) are always checked. The race and read-before-write
    analysis was done when the NEFF was built; it is redone when ``verify`` is set or when another
    nxsat version built the file, and the program text must then be in canonical form.
    ``target``/``lnc`` name the device this runtime simulates; a NEFF built for another target is
    refused (NCC_ENEF005). By default the runtime takes the NEFF's own target.
    """
    box = neff.unpack(data, source)
    man = box.manifest
    tname = _manifest_field(man, "target", str, source)
    mlnc = _manifest_field(man, "lnc", int, source)
    if tname not in target_names():
        raise error("NCC_ENEF005", f"{source} was compiled for target {tname!r}, which this nxsat does not know",
                    hint="targets: " + ", ".join(target_names()))
    if target is not None and target != tname:
        raise error("NCC_ENEF005", f"{source} was compiled for {tname}; this runtime is {target}",
                    hint=f"recompile with --target {target}, or run it on {tname}")
    if lnc is not None and lnc != mlnc:
        raise error("NCC_ENEF005", f"{source} was compiled for logical core config {mlnc}; this runtime uses {lnc}",
                    hint=f"recompile with --lnc {lnc}")
    for key, kind in (("ranks", int), ("compile_flags", list), ("inputs", list), ("outputs", list),
                      ("constants", list), ("nxsat_version", str), ("isa_version", str)):
        _manifest_field(man, key, kind, source)
    try:
        text = box.members[neff.PROGRAM_MEMBER].decode("utf-8")
    except UnicodeDecodeError:
        raise error("NCC_ENEF003", f"{source}: the program member is not UTF-8 text") from None
    prog = parse(text, f"{source}:{neff.PROGRAM_MEMBER}")
    if prog.target != tname or prog.lnc != mlnc or prog.ranks != man["ranks"]:
        raise error("NCC_ENEF003", f"{source}: the manifest (target {tname}, lnc {mlnc}, ranks {man['ranks']}) "
                    f"disagrees with the program (target {prog.target}, lnc {prog.lnc}, ranks {prog.ranks})",
                    hint="the manifest was tampered with; recompile")
    if man["isa_version"] != f"{prog.version[0]}.{prog.version[1]}" or list(prog.flags) != man["compile_flags"]:
        raise error("NCC_ENEF003", f"{source}: the manifest disagrees with the program (ISA version or flags)",
                    hint="the manifest was tampered with; recompile")
    tgt = load_target(tname, mlnc)
    full = verify or man.get("verified_by") != __version__
    lk = link(prog, tgt, races=full)
    prog = lk.program
    if full and text != format_program(prog, tgt.psum_bank_bytes):
        raise error("NCC_ENEF003", f"{source}: the program member is not in canonical form",
                    hint="the NEFF was edited; recompile")
    for key, kinds in (("inputs", ("input",)), ("outputs", ("output",))):
        if man[key] != _signature(prog, kinds):
            raise error("NCC_ENEF003", f"{source}: the manifest's {key} disagree with the program",
                        hint="the manifest was tampered with; recompile")
    want = [{"name": t.name, "dtype": t.dtype.name, "shape": list(t.shape), "member": f"const/{t.name}.npy"}
            for t in prog.consts()]
    if man["constants"] != want:
        raise error("NCC_ENEF003", f"{source}: the manifest's constants disagree with the program")
    names = {neff.PROGRAM_MEMBER} | {c["member"] for c in want}
    if set(box.members) != names:
        raise error("NCC_ENEF003", f"{source}: NEFF members {sorted(set(box.members) ^ names)} do not match the "
                    "program's constants")
    consts = {t.name: neff.npy_array(box.members[f"const/{t.name}.npy"], t.dtype, t.shape,
                                     f"{source}: const/{t.name}.npy") for t in prog.consts()}
    return Model(source, man, text, lk, consts)


def load_file(path: str | os.PathLike, target: str | None = None, lnc: int | None = None,
              verify: bool = False) -> Model:
    """:func:`load` of a file (the commands' entry point)."""
    return load(read_file(path), str(path), target, lnc, verify)


def disassemble(data: bytes, source: str = "<neff>") -> tuple[str, dict[str, np.ndarray]]:
    """The canonical program text and the constants of a NEFF (assembling them gives the same bytes)."""
    m = load(data, source)
    return m.text, dict(m.consts)

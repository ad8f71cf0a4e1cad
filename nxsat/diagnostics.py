"""Diagnostics: one error type with a code, a location and a hint; warnings collected once each.

Every failure a user can cause ends as an :class:`NxsatError`; the CLI prints it as one line
(``file:line:col: error NCC_EVRF064: message (hint: ...)``) and exits non-zero. Codes follow
neuronx-cc's ``NCC_`` + four letters + three digits; ours are listed in docs/error-codes.md and
in :data:`CODES` below (the two must agree: a test checks it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, TextIO

# code -> one-line meaning. E = user error, W = warning, I = internal error.
CODES: dict[str, str] = {
    # Mirrored from neuronx-cc.
    "NCC_EARG001": "unsupported logical-core setting for the target",
    "NCC_EUOC002": "unsupported operator",
    "NCC_EVRF001": "unsupported operator variant",
    "NCC_EMOD025": "dynamic shapes: every dimension must be static",
    "NCC_EOOM001": "does not fit device memory (activations)",
    "NCC_EOOM002": "does not fit device memory (inputs/outputs, spills), or the host ran out of memory",
    "NCC_ESPP004": "data type not supported",
    "NCC_EVRF004": "complex types not supported",
    "NCC_EVRF005": "unsupported FP8 variant",
    "NCC_EVRF006": "RngBitGenerator with a non-default algorithm",
    "NCC_EVRF007": "too many instructions",
    "NCC_EVRF010": "unsupported dilation combination in convolution",
    "NCC_EVRF011": "unsupported dilation combination in convolution",
    "NCC_EVRF013": "TopK on integer input",
    "NCC_EVRF015": "unknown custom-call target",
    "NCC_EVRF017": "reduce-window with base dilation",
    "NCC_EVRF018": "reduce-window with window dilation",
    "NCC_EVRF019": "reduce-window operand count",
    "NCC_EVRF022": "shift-right-arithmetic on non-32-bit input",
    "NCC_EVRF031": "scatter index out of bounds",
    "NCC_EVRF056": "gather index out of bounds",
    "NCC_EVRF035": "integer dot would need a lossy downcast",
    "NCC_EVRF064": "HLO violates XLA shape constraints",
    "NCC_ESFH002": "u64 constant cannot be converted to 32 bit safely",
    # nxsat's own.
    "NCC_EARG002": "invalid command-line argument or flag combination",
    "NCC_EFIL001": "input file missing, unreadable or of an unknown kind",
    "NCC_EFIL002": "output cannot be written: an input, a directory, a missing directory, no permission",
    "NCC_EPRS001": "syntax error in model text",
    "NCC_EPRS002": "undefined, duplicate or misused name in model text",
    "NCC_EPRS003": "malformed attribute or literal",
    "NCC_EPRS004": "malformed module structure (entry, parameters, root)",
    "NCC_ECON001": "an elided constant's value is needed",
    "NCC_EINP001": "model inputs do not match the model's parameters",
    "NCC_EEXE001": "reference interpreter cannot execute this graph",
    "NCC_ESHP001": "shape beyond nxsat's limits: rank over 64, a dimension of 2^40 or more, over 2^48 elements",
    "NCC_WTYP001": "64-bit integers run as 32-bit on the device (high bits dropped)",
    "NCC_WPRS001": "model text accepted with a caveat",
    "NCC_WUOC001": "operator not supported: the model loads for inspection only",
    "NCC_IINT001": "internal compiler error",
    # rules
    "NCC_ERUL001": "syntax error in a rule file",
    "NCC_ERUL002": "invalid rule: missing or bad metadata, duplicate name, or egglog rejects it",
    "NCC_ERUL003": "unknown rule, rule set or model type",
    "NCC_ERUL004": "invalid rule configuration (rules/config.toml)",
    # sim / runtime
    "NCC_ETGT001": "invalid target spec",
    "NCC_EASM001": "syntax error in a device program",
    "NCC_EASM002": "unknown instruction, stream or directive in a device program",
    "NCC_EASM003": "undefined or duplicate name in a device program",
    "NCC_EASM004": "operand or attribute does not fit the instruction",
    "NCC_EASM005": "tile does not fit SBUF (over 128 partitions or past the end of a partition)",
    "NCC_EASM006": "PSUM bank overflow",
    "NCC_EASM007": "read before any write",
    "NCC_EASM008": "race: conflicting accesses not ordered by semaphores",
    "NCC_EASM009": "deadlock: a semaphore wait can never be satisfied",
    "NCC_EASM010": "constants missing or not matching their declarations",
    "NCC_ENEF001": "truncated NEFF",
    "NCC_ENEF002": "corrupted NEFF (checksum mismatch)",
    "NCC_ENEF003": "tampered or malformed NEFF manifest",
    "NCC_ENEF004": "NEFF format major version mismatch: recompile with this nxsat",
    "NCC_ENEF005": "NEFF compiled for another target",
    "NCC_ENEF006": "not an nxsat NEFF file",
    "NCC_ERUN001": "simulation exceeds a host limit",
    "NCC_WARG001": "a deprecated flag was given; its replacement is used",
    "NCC_WRUN001": "out-of-bound access in a gather or scatter (indirect memory copy)",
    # relay
    "NCC_ERLY001": "Relay constants (--relay-constants file or #[metadata]) unreadable or malformed",
    "NCC_ERLY002": "a meta[relay.Constant] the model uses has no value",
    "NCC_ERLY003": "a Relay constant has an unusable shape or dtype, or the constants are too large",
}


@dataclass(frozen=True, slots=True)
class Loc:
    """A place in a source file (1-based line and column), optionally with the model's own origin."""

    file: str
    line: int = 0
    column: int = 0
    origin: str | None = None  # e.g. "run_once_1b.py:22" from HLO metadata

    def __str__(self) -> str:
        s = self.file
        if self.line:
            s += f":{self.line}"
            if self.column:
                s += f":{self.column}"
        return s


class NxsatError(Exception):
    """A user-facing failure: code, message, optional location and hint."""

    def __init__(self, code: str, message: str, loc: Loc | None = None, hint: str | None = None) -> None:
        assert code in CODES, f"undocumented error code {code}"
        super().__init__(message)
        self.code = code
        self.message = message
        self.loc = loc
        self.hint = hint

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its fields (a compile's forked jobs send their errors back to the parent)."""
        return NxsatError, (self.code, self.message, self.loc, self.hint)

    def format(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        origin = f" [from {self.loc.origin}]" if self.loc and self.loc.origin else ""
        hint = f" (hint: {self.hint})" if self.hint else ""
        text = f"{where}error {self.code}: {self.message}{origin}{hint}"
        return " ".join(text.split())  # always exactly one line

    def __str__(self) -> str:
        return self.format()


def error(code: str, message: str, loc: Loc | None = None, hint: str | None = None) -> NxsatError:
    """Build an error to raise: ``raise error("NCC_EPRS001", "...", loc)``."""
    return NxsatError(code, message, loc, hint)


@dataclass(frozen=True, slots=True)
class Warning_:
    code: str
    message: str
    loc: Loc | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its fields (a compile's forked jobs send their errors back to the parent)."""
        return NxsatError, (self.code, self.message, self.loc, self.hint)

    def format(self) -> str:
        where = f"{self.loc}: " if self.loc else ""
        return " ".join(f"{where}warning {self.code}: {self.message}".split())


class Warnings:
    """Collects warnings; each (code, message) is kept once, as neuronx-cc warns once."""

    def __init__(self) -> None:
        self._items: list[Warning_] = []
        self._seen: set[tuple[str, str]] = set()

    def warn(self, code: str, message: str, loc: Loc | None = None) -> None:
        assert code in CODES, f"undocumented warning code {code}"
        key = (code, message)
        if key not in self._seen:
            self._seen.add(key)
            self._items.append(Warning_(code, message, loc))

    def __iter__(self):  # noqa: ANN204
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def extend(self, other: Warnings) -> None:
        for w in other:
            self.warn(w.code, w.message, w.loc)

    def print(self, stream: TextIO = sys.stderr) -> None:
        for w in self._items:
            print(w.format(), file=stream)

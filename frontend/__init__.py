"""Front ends: model text -> nxsat IR. ``load`` picks the front end from ``framework`` or the file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nxsat.diagnostics import error
from nxsat.io import read_text
from nxsat.ir import Module

FRAMEWORKS = ("XLA", "RELAY")


def detect_framework(path: str | os.PathLike, text: str) -> str:
    """XLA for HLO text, RELAY for Relay text: by extension first, then by the first line."""
    suffix = Path(path).suffix.lower()
    if suffix == ".hlo" or (suffix == ".txt" and "HloModule" in text[:4096]):
        return "XLA"
    if suffix == ".relay":
        return "RELAY"
    head = text.lstrip()[:4096]
    if head.startswith("#[version") or "def @main" in head:
        return "RELAY"
    if "HloModule" in head or "ENTRY" in text:
        return "XLA"
    raise error("NCC_EFIL001", f"{path}: cannot tell the model's format",
                hint="name it .hlo or .relay, or pass --framework XLA|RELAY")


def load(path: str | os.PathLike, framework: str | None = None, **options: Any) -> Module:
    """Parse and check a model file. Options are front-end specific (Relay: relay_constants, seed)."""
    text = read_text(path)
    return loads(text, str(path), framework, **options)


def loads(text: str, filename: str = "<string>", framework: str | None = None, **options: Any) -> Module:
    fw = (framework or detect_framework(filename, text)).upper()
    if fw == "XLA":
        from nxsat.frontend.hlo import parse_hlo

        if options.get("relay_constants") is not None:
            raise error("NCC_EARG002", f"{filename} is an HLO model: --relay-constants applies to Relay models only",
                        hint="HLO carries its constants in the text")
        return parse_hlo(text, filename)
    if fw == "RELAY":
        try:
            from nxsat.frontend.relay import parse_relay
        except ImportError:
            raise error("NCC_EARG002", "the Relay front end is not available in this build") from None
        return parse_relay(text, filename, **options)
    raise error("NCC_EARG002", f"unknown framework {framework!r}", hint=f"one of {', '.join(FRAMEWORKS)}")

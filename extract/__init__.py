"""Extraction: which equivalent program to take out of a saturated e-graph. Today the smallest-term
extractor (smallest.py); a device plan's pricing (plan.py) is shared with the backend.

``optimize`` is saturation and extraction in one call, the path of the rule tooling and the tests;
the compile driver runs the two stages itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nxsat.ir import Module

if TYPE_CHECKING:
    from nxsat.rules.catalog import Catalog
    from nxsat.rules.saturate import Report


@dataclass
class Optimized:
    module: Module
    report: Report


def optimize(module: Module, model_type: str | None = None, level: int = 2, allow_approximate: bool = False,
             canonical: bool = False, cat: Catalog | None = None, extra_sets: Sequence[str] = (),
             time_rules: bool = False) -> Optimized:
    """Saturate (:func:`nxsat.rules.saturate_module`) and extract the smallest equivalent program."""
    from nxsat.extract.smallest import extract
    from nxsat.rules import saturate_module

    sat = saturate_module(module, model_type, level, allow_approximate, canonical, cat, extra_sets, time_rules)
    return Optimized(extract(sat.egraph, sat.loaded), sat.report)


__all__ = ["Optimized", "optimize"]

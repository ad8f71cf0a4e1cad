"""What the per-set rule tests share: a rule run alone on a small graph that holds its left-hand side."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nxsat.extract.smallest import extract
from nxsat.ir import Module
from nxsat.rules.catalog import catalog
from nxsat.rules.checker import verify
from nxsat.rules.egraph import EGraph
from nxsat.rules.saturate import Budget, saturate


def fire_alone(name: str, module: Module, inputs: Sequence[np.ndarray]) -> Module:
    """Saturate ``module`` with rule ``name`` alone: it must match, every e-node of every e-class must
    still evaluate to its class's value on ``inputs``; the extracted module."""
    cat = catalog()
    (rule,) = cat.find([name])
    eg = EGraph([rule], cat)
    loaded = eg.load(module)
    report = saturate(eg, Budget(3, 30.0, 10_000), rules=[rule])
    assert report.matches.get(name, 0) > 0, report.format(all_rules=True)
    assert verify(eg, loaded, inputs) is None
    return extract(eg, loaded)

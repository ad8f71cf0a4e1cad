"""The backend: the extracted graph onto the NeuronCore (lowering per operator family, then scheduling
and placement), ending in a device program the simulator runs. Start at :func:`compile_graph`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nxsat.backend.lower import Lowering, Options
from nxsat.backend.schedule import Scheduled, schedule
from nxsat.diagnostics import Warnings
from nxsat.ir import Module
from nxsat.sim.program import Program
from nxsat.sim.target import Target


@dataclass
class Compiled:
    program: Program
    constants: dict[str, np.ndarray]
    scheduled: Scheduled
    warnings: Warnings
    instructions: int


def compile_graph(module: Module, target: Target, options: Options | None = None,
                  flags: tuple[str, ...] = ()) -> Compiled:
    """Lower ``module``'s entry computation and schedule it for ``target``."""
    lw = Lowering(module, target, options or Options())
    lw.run()
    sch = schedule(lw.graph, target, lw.inputs, lw.outputs, flags, target.lnc)
    return Compiled(sch.program, sch.constants, sch, lw.warnings, len(sch.program.instrs))


__all__ = ["Compiled", "Options", "compile_graph"]

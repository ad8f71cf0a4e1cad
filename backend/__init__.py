"""The backend: the extracted graph onto the NeuronCore (lowering per operator family, then scheduling
and placement), ending in a device program the simulator runs. Start at :func:`compile_graph`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from nxsat.backend.graph import Buf, Graph
from nxsat.backend.lower import Lowering, Options
from nxsat.backend.schedule import DEFAULT_SCHEDULE, Scheduled, ScheduleOptions, schedule
from nxsat.collector import no_cycle_collection
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
    inputs: list[Buf]
    outputs: list[Buf]

    @property
    def instructions(self) -> int:
        return len(self.program.instrs)


def device_forms(module: Module, target: Target) -> Module:
    """The same values with operators rewritten into the forms the backend tiles best:

    - convolutions that are weight gradients (more window taps than outputs) as one contraction per
      output position (:func:`nxsat.backend.conv.weight_gradients`; a depthwise layer's stays, for the
      planes path);
    - elementwise chains read through a reshape computed before it
      (:func:`nxsat.backend.elementwise.sink_reshapes`);
    - casts of constants done at compile time (:func:`nxsat.backend.precision.fold_constant_casts`);
    - an fp32 batch norm in inference as the elementwise steps of its kernel
      (:func:`nxsat.backend.norm.expand_inference`), which then fuse with their neighbours;
    - constant dot operands stored with their contraction outermost, constant convolution kernels with
      their output channels innermost (:func:`nxsat.backend.matmul.kmajor_constants`).

    A module with nothing to rewrite comes back as it is (the driver then dumps nothing)."""
    from nxsat.backend.conv import is_weight_gradient, plane_weight_gradient, weight_gradients
    from nxsat.backend.elementwise import sink_reshapes
    from nxsat.backend.matmul import kmajor_constants
    from nxsat.backend.norm import expand_inference
    from nxsat.backend.precision import fold_constant_casts

    if any(is_weight_gradient(n) and not plane_weight_gradient(n) for n in module.entry.post_order()):
        module = weight_gradients(module)
    return kmajor_constants(sink_reshapes(fold_constant_casts(expand_inference(module))))


def lower_graph(module: Module, target: Target, options: Options | None = None) -> Lowering:
    """Lower ``module``'s entry computation (after :func:`device_forms`): the instruction graph and
    where every value lives."""
    lw = Lowering(module, target, options or Options())
    with no_cycle_collection():
        lw.run()
    return lw


def schedule_graph(lw: Lowering, target: Target, flags: tuple[str, ...] = (),
                   options: ScheduleOptions = DEFAULT_SCHEDULE) -> Compiled:
    """Order, place and synchronise a lowered graph into a device program."""
    with no_cycle_collection():
        sch = schedule(lw.graph, target, lw.inputs, lw.outputs, flags, target.lnc, options)
    return Compiled(sch.program, sch.constants, sch, lw.warnings, lw.inputs, lw.outputs)


def compile_graph(module: Module, target: Target, options: Options | None = None,
                  flags: tuple[str, ...] = (), schedule: ScheduleOptions = DEFAULT_SCHEDULE) -> Compiled:
    """Rewrite into device forms, lower and schedule ``module`` for ``target`` (the driver's last
    stages, without the front end and the e-graph)."""
    return schedule_graph(lower_graph(device_forms(module, target), target, options), target, flags, schedule)


def graph_summary(g: Graph) -> dict[str, object]:
    """What lowering made: instructions by engine and opcode, buffers by kind."""
    by = Counter(f"{i.engine} {i.opcode}" for i in g.insts)
    bufs = Counter(b.kind for b in g.bufs)
    return {"instructions": len(g.insts), "by_engine_opcode": dict(sorted(by.items())), "buffers": dict(bufs)}


__all__ = ["DEFAULT_SCHEDULE", "Compiled", "Options", "ScheduleOptions", "compile_graph", "device_forms",
           "graph_summary", "lower_graph", "schedule_graph"]

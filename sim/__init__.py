"""The device model: target specs, the device program, NEFF, functional executor and timing model.

Start here: :func:`assemble` (text form -> NEFF bytes), :func:`build_neff` (a :class:`Program` from
the backend -> NEFF bytes; :func:`build_model` also returns the model they hold), :func:`load` /
:func:`load_file` (the runtime's validating loader), ``Model.run`` (outputs) and ``Model.profile``
(timing). Docs: docs/device-model.md, docs/device-program.md, docs/neff.md.
"""

from nxsat.sim.asm import format_program, parse
from nxsat.sim.program import ISA_VERSION, Access, Idx, Instr, Program, Tensor, Wait
from nxsat.sim.runtime import Model, assemble, build_model, build_neff, disassemble, load, load_file
from nxsat.sim.target import Target, load_target, target_names

__all__ = [
    "ISA_VERSION", "Access", "Idx", "Instr", "Model", "Program", "Target", "Tensor", "Wait", "assemble",
    "build_model", "build_neff", "disassemble", "format_program", "load", "load_file", "load_target", "parse",
    "target_names",
]

"""Commands on device programs and NEFFs: run, profile, assemble, disassemble."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from nxsat.cli.common import array_summary, count_arg, input_arrays, random_array
from nxsat.diagnostics import Warnings


def _verify_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verify", action="store_true",
                   help="redo the race and read-before-write analysis the build did (on by itself for a NEFF "
                   "another nxsat version wrote)")


def _target_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--target", metavar="T", help=what)
    p.add_argument("--lnc", "--logical-nc-config", dest="lnc", type=int, metavar="N",
                   help="logical core config (trn2: 1 or 2)")


def _random_inputs(model: Any, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    prog = model.program
    return {f"in{i}": random_array(rng, prog.global_shape(t), t.dtype) for i, t in enumerate(prog.inputs())}


def cmd_run(args: argparse.Namespace) -> int:
    """``nxsat run``: outputs from the functional model, latency from the timing model."""
    from nxsat.io import atomic_write, check_output, outputs_dict, write_npz
    from nxsat.sim import load_file

    if args.output:
        check_output(args.output, inputs=[args.model, args.inputs])
    if args.trace:
        check_output(args.trace, inputs=[args.model, args.inputs], outputs=[args.output])
    model = load_file(args.model, args.target, args.lnc, args.verify)
    arrays, source = input_arrays(args.inputs, args.seed, lambda seed: _random_inputs(model, seed))
    warnings = Warnings()
    outputs = model.run(arrays, source, warnings)
    warnings.print(sys.stderr)
    summary, tl = model.profile()
    if args.output:
        write_npz(args.output, outputs_dict(outputs))
    if args.trace:
        atomic_write(args.trace, model.trace(tl))
    print(f"{args.model}: {len(outputs)} output(s)" + (f" written to {args.output}" if args.output else ""))
    for i, o in enumerate(outputs):
        print(array_summary(f"out{i}", o))
    print(f"latency: {summary['latency_ns'] / 1000:.3f} us on {summary['target']} "
          f"(this program's own bound {summary['roofline']['bound_ns'] / 1000:.3f} us from the HBM bytes it moves "
          f"and its FLOPs, MFU {summary['mfu']:.1%}; the model's roofline is in `nxsat compile`'s report)")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """``nxsat profile``: the timing report (text or JSON) and optionally the Perfetto trace."""
    from nxsat.io import atomic_write, check_output
    from nxsat.sim import load_file
    from nxsat.sim.critical import critical_path, format_path, path_summary
    from nxsat.sim.report import format_summary

    if args.trace:
        check_output(args.trace, inputs=[args.model])
    model = load_file(args.model, args.target, args.lnc, args.verify)
    summary, tl = model.profile()
    steps = critical_path(model.linked, tl)
    if args.trace:
        atomic_write(args.trace, model.trace(tl, frozenset(s.instr for s in steps)))
    summary["critical_path"] = path_summary(model.linked, tl, args.critical_path, steps)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary))
        names = {k: e["name"] for k, e in summary["engines"].items()} | {"dma": "DMA"}
        print(format_path(summary["critical_path"], summary["latency_ns"], names))
        if args.trace:
            print(f"trace written to {args.trace} (open it in ui.perfetto.dev)")
    return 0


def cmd_assemble(args: argparse.Namespace) -> int:
    """``nxsat assemble``: check a device program and write its NEFF."""
    from nxsat.io import atomic_write, check_output, read_npz, read_text
    from nxsat.sim import assemble

    check_output(args.output, inputs=[args.program, args.constants])
    text = read_text(args.program)
    consts = read_npz(args.constants) if args.constants else None
    data = assemble(text, args.program, consts, args.target, args.lnc)
    atomic_write(args.output, data)
    print(f"{args.output}: {len(data)} bytes")
    return 0


def cmd_disassemble(args: argparse.Namespace) -> int:
    """``nxsat disassemble``: the canonical program text (and constants) of a NEFF."""
    from nxsat.io import atomic_write, check_output, write_npz
    from nxsat.sim import load_file

    if args.output:
        check_output(args.output, inputs=[args.model])
    if args.constants:
        check_output(args.constants, inputs=[args.model], outputs=[args.output])
    model = load_file(args.model)
    if args.constants:
        write_npz(args.constants, model.consts)
    if args.output:
        atomic_write(args.output, model.text)
    else:
        sys.stdout.write(model.text)
    return 0


def register(sub: Any) -> None:
    """Add the device commands to the CLI's subparsers."""
    p = sub.add_parser("run", help="simulate a NEFF: outputs and latency",
                       description="Load and validate a NEFF, run it on the device model (numerics of the "
                       "device) and report its latency from the timing model. Inputs are read from an .npz "
                       "by position (in0, in1, ...) or by name; outputs are written flattened as out0, "
                       "out1, ...")
    p.add_argument("model", metavar="MODEL.neff")
    p.add_argument("--inputs", metavar="IN.npz", help="input values (default: seeded random inputs)")
    p.add_argument("--output", "-o", metavar="OUT.npz", help="where to write the outputs")
    p.add_argument("--trace", metavar="TRACE.json", help="also write a Chrome/Perfetto trace")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    _target_args(p, "the device this runtime simulates (default: the NEFF's own; another is refused)")
    _verify_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("profile", help="timing of a NEFF: latency, utilization, MFU, bandwidth, trace",
                       description="Replay a NEFF on the timing model: latency, roofline bound, per-engine "
                       "busy time and utilization, MFU, HBM traffic and bandwidth, SBUF/PSUM peaks, spills.")
    p.add_argument("model", metavar="MODEL.neff")
    p.add_argument("--trace", metavar="TRACE.json", help="write a Chrome/Perfetto trace (one track per engine "
                   "and DMA queue; the critical path's slices carry critical: true)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--critical-path", type=count_arg(0), default=8, metavar="N",
                   help="how many of the critical path's operators to list, longest first (default 8): the "
                   "chain of instructions, each waiting for the one before it, that the latency is made of")
    _target_args(p, "the device this runtime simulates (default: the NEFF's own; another is refused)")
    _verify_arg(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("assemble", help="build a NEFF from a device program in text form",
                       description="Check a device program (docs/device-program.md) against the target and "
                       "write it as a NEFF with its constants.")
    p.add_argument("program", metavar="PROGRAM.nxs")
    p.add_argument("--constants", metavar="C.npz", help="values of the program's const tensors, by name")
    p.add_argument("--output", "-o", metavar="X.neff", required=True)
    _target_args(p, "target (default: the program's .target)")
    p.set_defaults(func=cmd_assemble)

    p = sub.add_parser("disassemble", help="print the device program of a NEFF",
                       description="Print the canonical text of a NEFF's device program; assembling it (with "
                       "the constants) gives the same NEFF bytes.")
    p.add_argument("model", metavar="X.neff")
    p.add_argument("--output", "-o", metavar="PROGRAM.nxs", help="write the text here instead of stdout")
    p.add_argument("--constants", metavar="C.npz", help="also write the constants here")
    p.set_defaults(func=cmd_disassemble)

"""Commands on model files: inspect, interpret, list-operators."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from nxsat.cli.common import array_summary, input_arrays, random_array
from nxsat.diagnostics import error
from nxsat.ir import Module, TensorType
from nxsat.progress import Progress


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The options every command that reads a model takes (shared with later command groups)."""
    p.add_argument("model", metavar="MODEL", help="HLO text (.hlo) or Relay text (.relay)")
    p.add_argument("--framework", choices=["XLA", "RELAY"], type=str.upper,
                   help="input format (default: from the file name and its first line)")
    p.add_argument("--relay-constants", metavar="FILE",
                   help="Relay only: values of meta[relay.Constant][i] (.npz, or JSON [shape, dtype] list)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed for generated values (Relay constants from JSON, random inputs); default 0")


def add_elided_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fill-elided-constants", action="store_true",
                   help="give constants the model text elided (constant({...})) seeded random values (--seed), "
                   "as XLA's tools do to run such a model: its cost is real, its results are not")


def load_model(args: argparse.Namespace) -> Module:
    from nxsat.frontend import load

    options: dict[str, Any] = {}
    if getattr(args, "relay_constants", None):
        options["relay_constants"] = args.relay_constants
    if getattr(args, "seed", None) is not None and (args.framework == "RELAY" or str(args.model).endswith(".relay")):
        options["seed"] = args.seed
    return load(args.model, args.framework, **options)


def print_warnings(module: Module) -> None:
    module.warnings.print(sys.stderr)


# --- inspect ---------------------------------------------------------------------------------

def cmd_inspect(args: argparse.Namespace) -> int:
    from nxsat.modelinfo import format_info, model_info

    module = load_model(args)
    info = model_info(module)
    if args.json:
        print(json.dumps(info.to_json(), indent=2, sort_keys=True))
    else:
        print(format_info(info, max_params=10**9 if args.all else 20))
    return 0


# --- interpret -------------------------------------------------------------------------------

def random_inputs(module: Module, seed: int, progress: Progress | None = None,
                  fixed: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs for every parameter (see :func:`nxsat.cli.common.random_array`); a billion
    weights take seconds, so ``progress`` counts the parameters. ``fixed`` gives scalar parameters
    their meaning by name (a training step's hardtanh bound or batch size: a random one collapses
    the model); the others draw what they would without it."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    params = module.entry.params
    unknown = set(fixed or ()) - {p.name for p in params}
    if unknown:
        raise error("NCC_EINP001", f"the model has no parameters named {', '.join(sorted(unknown))}")
    if progress is not None:
        progress.stage("random inputs", total=len(params), unit="parameters")
    for i, p in enumerate(params):
        if not isinstance(p.type, TensorType):
            raise error("NCC_EINP001", f"parameter {p.name} is a tuple; give its values with --inputs", p.loc)
        out[f"in{i}"] = random_array(rng, p.type.shape, p.type.dtype)
        if fixed and p.name in fixed:
            if p.type.shape != ():
                raise error("NCC_EINP001", f"parameter {p.name} is not a scalar; give its values with --inputs",
                            p.loc)
            out[f"in{i}"] = np.asarray(fixed[p.name], dtype=out[f"in{i}"].dtype)
        if progress is not None:
            progress.update(i + 1)
    return out


def cmd_interpret(args: argparse.Namespace) -> int:
    from nxsat.interpreter import run_module
    from nxsat.io import check_output, match_inputs, outputs_dict, write_npz

    if args.output:
        check_output(args.output, inputs=[args.model, args.inputs, args.relay_constants])
    with Progress() as progress:  # a large model loads for seconds and runs for minutes
        progress.stage("load")
        module = load_model(args)
        if args.fill_elided_constants:
            from nxsat.passes import fill_elided_constants

            module = fill_elided_constants(module, args.seed)
        progress.clear()  # input_arrays may say that the inputs are random
        arrays, source = input_arrays(args.inputs, args.seed, lambda seed: random_inputs(module, seed, progress))
        inputs = match_inputs(module, arrays, source=source)
        outputs = run_module(module, inputs, progress=progress)
    print_warnings(module)
    if args.output:
        write_npz(args.output, outputs_dict(outputs))
    print(f"{module.name}: {len(outputs)} output(s)" + (f" written to {args.output}" if args.output else ""))
    for i, o in enumerate(outputs):
        print(array_summary(f"out{i}", o))
    return 0


# --- list-operators --------------------------------------------------------------------------

def _camel(opcode: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[-_]", opcode))


def operator_rows(framework: str, include_unsupported: bool = False) -> list[dict[str, str]]:
    """One row per operator name the framework's users see, sorted by name."""
    from nxsat.ops import all_ops
    from nxsat.ops.registry import UNSUPPORTED

    rows: list[dict[str, str]] = []
    if framework == "XLA":
        for o in all_ops():
            if o.status == UNSUPPORTED and not include_unsupported:
                continue
            if o.name == "parameter":
                continue
            for name in o.neuron or (_camel(o.name),):
                rows.append({"name": name, "hlo": o.name, "engine": o.engine, "status": o.status,
                             "notes": o.notes})
    else:
        try:
            from nxsat.frontend.relay import supported_operators
        except ImportError:
            supported_operators = None
        if supported_operators is not None:
            for name, notes in supported_operators().items():
                rows.append({"name": name, "hlo": "", "engine": "", "status": "supported", "notes": notes})
        else:
            for o in all_ops():
                for name in o.relay:
                    rows.append({"name": name, "hlo": o.name, "engine": o.engine, "status": o.status,
                                 "notes": o.notes})
    return sorted(rows, key=lambda r: (r["name"].lower(), r["hlo"]))


def cmd_list_operators(args: argparse.Namespace) -> int:
    rows = operator_rows(args.framework, args.all)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows) if rows else 0
    for r in rows:
        where = ", ".join(x for x in (r["hlo"], r["engine"]) if x)
        where = f"({where})" if where else ""
        flag = "" if r["status"] == "supported" else f" [{r['status']}]"
        notes = f": {r['notes']}" if r["notes"] else ""
        print(f"{r['name']:<{width}}  {where}{flag}{notes}".rstrip())
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="operators, parameters, FLOPs and outputs of a model",
                       description="Load and check a model; print its operator histogram, parameters "
                       "(shapes, dtypes, bytes), exact dot/convolution FLOPs, outputs and warnings.")
    add_model_arguments(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="list every parameter (default: the first 20)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("interpret", help="run a model with the reference interpreter",
                       description="Run a model with nxsat's reference semantics (numpy). Inputs are "
                       "read from an .npz by parameter order (in0, in1, ...) or by parameter name; "
                       "outputs are written flattened as out0, out1, ...")
    add_model_arguments(p)
    p.add_argument("--inputs", metavar="IN.npz", help="input values (default: seeded random inputs)")
    p.add_argument("--output", "-o", metavar="OUT.npz", help="where to write the outputs")
    add_elided_argument(p)
    p.set_defaults(func=cmd_interpret)

    p = sub.add_parser("list-operators", help="the operators nxsat supports",
                       description="One supported operator per line, with the engine it maps to and notes.")
    p.add_argument("--framework", choices=["XLA", "RELAY"], type=str.upper, default="XLA")
    p.add_argument("--all", action="store_true", help="include operators nxsat knows but refuses")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list_operators)

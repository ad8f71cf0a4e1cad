"""The ``nxsat`` command line. Each group of commands lives in its own module of this package and
adds its subcommands in ``register``; this module only dispatches and turns errors into one line.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import sys
import traceback
from collections.abc import Sequence

from nxsat import __version__
from nxsat.diagnostics import NxsatError

# Modules that contribute subcommands, in the order `nxsat --help` lists them.
COMMAND_MODULES = ("nxsat.cli.compile", "nxsat.cli.model", "nxsat.cli.device", "nxsat.cli.rules")


# Exit statuses, as docs/error-codes.md documents them.
EXIT_INPUT = 1  # an error in the input (any E code but NCC_EARG*)
EXIT_USAGE = 2  # a bad command line (NCC_EARG*)
EXIT_INTERNAL = 70  # an internal error (NCC_I*): EX_SOFTWARE of sysexits.h


def exit_status(code: str) -> int:
    """The exit status of an error code, by its class: one rule for every command, so that a
    script can tell a bad command line (2) and a bug in nxsat (70) from a bad model (1)."""
    kind = code.removeprefix("NCC_")
    if kind.startswith("I"):
        return EXIT_INTERNAL
    if kind.startswith("EARG"):
        return EXIT_USAGE
    return EXIT_INPUT


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one coded line (exit 2), like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error NCC_EARG002: {message} (hint: {self.prog} --help)", file=sys.stderr)
        raise SystemExit(exit_status("NCC_EARG002"))


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(prog="nxsat", description="An equality-saturation graph compiler for AWS Neuron devices.")
    parser.add_argument("--version", action="version", version=f"nxsat {__version__}")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "compile":
        argv = ["compile", *env_flags(), *argv[1:]]  # the command line's flags come last and win
    args = parser.parse_args(argv)
    if getattr(args, "command", None) == "compile":
        args.flags_given = [a for a in argv[1:] if a != args.model]
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    debug = args.debug or bool(os.environ.get("NXSAT_DEBUG"))
    # What the imports made (modules, classes, functions, grammars) lives as long as the process: out of
    # the cycle collector's view, its passes over the model's objects cost half as much (BERT-12 -O1: 0.13 s
    # -> 0.05 s of collection)
    gc.freeze()
    try:
        return int(args.func(args) or 0)
    except NxsatError as exc:
        if debug:
            traceback.print_exc()
        print(exc.format(), file=sys.stderr)
        return exit_status(exc.code)
    except KeyboardInterrupt:
        print("nxsat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:
        print("error NCC_EOOM002: the host ran out of memory", file=sys.stderr)
        return exit_status("NCC_EOOM002")
    except RecursionError as exc:
        if debug:
            traceback.print_exc()
        print(f"error NCC_IINT001: internal compiler error: {exc} (hint: rerun with --debug and report it)",
              file=sys.stderr)
        return exit_status("NCC_IINT001")
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(f"error NCC_IINT001: internal compiler error: {type(exc).__name__}: {exc} "
              "(hint: rerun with --debug and report it)".replace("\n", " "), file=sys.stderr)
        return exit_status("NCC_IINT001")


def env_flags(var: str = "NEURON_CC_FLAGS") -> list[str]:
    """Flags from the environment, as frameworks pass them to neuronx-cc."""
    return shlex.split(os.environ.get(var, ""))


if __name__ == "__main__":
    sys.exit(main())

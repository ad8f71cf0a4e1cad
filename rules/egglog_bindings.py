"""egglog's Rust bindings, loaded without its Python API.

nxsat drives egglog through its bindings only (``egglog.bindings``: the e-graph, commands, run
reports). Importing the ``egglog`` package also runs its high-level API, which costs 0.2-0.7 s of
start-up and keeps, in the classes it defines at import time, the frame that defined them: through
``f_back`` every function on the importing stack then stays alive with its locals. The first compile
in a process imports egglog from inside ``compile_model``, so that call's whole graph (1.3 GB for
gemma3) was never freed, and the process spent 17 s tearing it down at exit. Loading the extension
module by itself avoids both. When egglog is already imported, its bindings are used as they are.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NAME = "egglog.bindings"


def load() -> ModuleType:
    """The ``egglog.bindings`` extension module (registered under that name, so a later ``import
    egglog`` reuses it: the extension may be initialised only once per process)."""
    mod = sys.modules.get(NAME)
    if mod is not None:
        return mod
    spec = importlib.util.find_spec("egglog")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"bindings{suffix}"
            if path.is_file():
                loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
                ext = importlib.util.spec_from_file_location(NAME, path, loader=loader)
                assert ext is not None
                mod = importlib.util.module_from_spec(ext)
                loader.exec_module(mod)
                sys.modules[NAME] = mod
                return mod
    from egglog import bindings  # an installation laid out otherwise: the package's own import

    return bindings

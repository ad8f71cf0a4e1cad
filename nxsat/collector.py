"""Python's cyclic garbage collector, paused where nxsat builds millions of long-lived objects.

Lowering, scheduling, linking and parsing a device program make instructions and access records that
all live until the stage ends, and almost no cyclic garbage: the collector's repeated passes over
them found next to nothing (a few hundred objects on resnet50) but took a third of lowering's time on
mobilenet_v2 and about 40% of loading gemma3_1b's NEFF. One mechanism for all of them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """The collector paused for the block and resumed afterwards (if it was running); reference
    counting still frees everything acyclic at once."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

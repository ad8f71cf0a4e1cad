"""A one-line progress display on standard error, for commands that run long enough to look hung:
``nxsat interpret`` on a large model now, the stages of ``nxsat compile`` later.

It shows the stage, a counter when the stage has one (``7,100/7,442 instructions``) and the
seconds since the command began, redrawn in place with ``\\r`` at most ten times a second and
erased when the work ends (or fails), so that what the command prints stays as it was. It is shown
only where someone watches: standard error is a terminal, the ``CI`` variable is not set, and
``NXSAT_PROGRESS`` is not ``0``; ``NXSAT_PROGRESS=1`` forces it on (tests, terminals the check
misses). Switched off, every call returns at once.

    with Progress() as progress:
        progress.stage("load")
        module = load(path)
        progress.stage("run", total=n, unit="instructions")
        for i in range(n):
            ...
            progress.update(i + 1)    # cheap: a clock read; draws at most every 0.1 s
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

INTERVAL = 0.1  # seconds between redraws: ten a second is smooth and costs nothing


def progress_wanted(stream: TextIO) -> bool:
    """Whether to show progress on ``stream``: NXSAT_PROGRESS=1/0 decides; else a terminal outside CI."""
    forced = os.environ.get("NXSAT_PROGRESS", "").strip()
    if forced == "1":
        return True
    if forced == "0":
        return False
    if os.environ.get("CI"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """One progress line for a command: named stages, an optional counter each, elapsed seconds."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None,
                 interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_wanted(self.stream) if enabled is None else enabled
        self.interval = interval
        self._clock = clock
        self._start = clock()
        self._last = -float("inf")
        self._shown = 0  # characters on the line now (0: nothing to erase)
        self.name = ""
        self.total: int | None = None
        self.unit = ""
        self.done = 0

    def stage(self, name: str, total: int | None = None, unit: str = "") -> None:
        """Begin a stage, shown at once; ``total`` (and ``unit``) give it a counter for :meth:`update`."""
        self.name, self.total, self.unit, self.done = name, total, unit, 0
        if self.enabled:
            self._draw(self._clock())

    def update(self, done: int) -> None:
        """How far the stage is (``done`` of its total); redraws only when ``interval`` has passed."""
        if not self.enabled:
            return
        self.done = done
        now = self._clock()
        if now - self._last >= self.interval:
            self._draw(now)

    def clear(self) -> None:
        """Erase the line, e.g. before printing something else; the next update draws it again."""
        if self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0

    def line(self, now: float | None = None) -> str:
        """The text shown: ``run: 7,100/7,442 instructions (95%)  12.3 s``."""
        elapsed = (self._clock() if now is None else now) - self._start
        text = self.name
        if self.total is not None:
            pct = f" ({100 * self.done // self.total}%)" if self.total else ""
            text += f": {self.done:,}/{self.total:,}{' ' + self.unit if self.unit else ''}{pct}"
        return f"{text}  {elapsed:.1f} s"

    def _draw(self, now: float) -> None:
        self._last = now
        width = max(20, shutil.get_terminal_size((80, 24)).columns - 1)  # never wrap: \r returns one row
        text = self.line(now)[:width]
        self.stream.write("\r" + text + " " * max(0, self._shown - len(text)))
        self.stream.flush()
        self._shown = len(text)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.clear()

"""docs/hlo.md's speed section quotes what bench/parse_throughput.py prints: its command, its modules,
their sizes and instruction counts (the times are the machine's; the counts must not drift)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from nxsat.frontend import load

ROOT = Path(__file__).resolve().parent.parent
SPEED = (ROOT / "docs" / "hlo.md").read_text().split("## Speed", 1)[1]


def _bench():
    spec = importlib.util.spec_from_file_location("parse_throughput", ROOT / "bench" / "parse_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_speed_table_is_what_the_benchmark_prints():
    bench = _bench()
    assert "`python bench/parse_throughput.py`" in SPEED and "2-core" in SPEED
    table = re.search(r"```\n(module .*?)```", SPEED, re.S).group(1).splitlines()
    assert table[0].split() == ["module", "MB", "instrs", "best", "s", "median", "s", "instr/s", "target"]
    rows = [line.split() for line in table[1:]]
    assert [r[0] for r in rows] == bench.MODULES
    for name, mb, instrs, best, median, rate, *_ in rows:
        path = bench.DATA / name
        assert mb == f"{path.stat().st_size / 1e6:.2f}", name
        m = load(path)
        assert int(instrs) == sum(len(c.instructions) for c in m.computations.values()), name
        assert float(best) <= float(median) < bench.TARGET_S, name
        # instr/s comes from the unrounded median: within what the printed median's rounding allows
        assert int(instrs) / (float(median) + 0.005) - 1 <= int(rate) <= int(instrs) / (float(median) - 0.005) + 1

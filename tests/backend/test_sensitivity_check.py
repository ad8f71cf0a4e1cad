"""bench/sensitivity.py, the check of a training step's outputs against the interpreter's own rounding
(docs/compiling.md): a whole run on a small model, with the sensitivities measured and stored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_compiled_convnet_passes() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "sensitivity.py"), str(ROOT / "tests/data/jax/convnet.hlo")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS: 1 of 1 outputs within their bounds" in out.stdout


def test_stored_sensitivities_judge_like_measured_ones(tmp_path: Path) -> None:
    table = tmp_path / "convnet.sensitivity.json"
    model = str(ROOT / "tests/data/jax/convnet.hlo")
    cmd = [sys.executable, str(ROOT / "bench" / "sensitivity.py"), model]
    out = subprocess.run(cmd + ["--skip-device", "--write-table", str(table)], capture_output=True, text=True)
    assert out.returncode == 0 and table.exists(), out.stdout + out.stderr
    out = subprocess.run(cmd + ["--table", str(table)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS: 1 of 1 outputs within their bounds" in out.stdout
    out = subprocess.run(cmd + ["--table", str(ROOT / "tests/data/hlo/mobilenet_v2.sensitivity.json")],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "does not fit" in out.stdout, out.stdout + out.stderr

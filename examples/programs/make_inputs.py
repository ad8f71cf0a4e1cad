"""Write inputs (and layernorm's constants) for the example device programs, deterministically.

    python examples/programs/make_inputs.py OUTDIR

writes OUTDIR/matmul.npz, softmax.npz, layernorm.npz, layernorm.consts.npz, gather.npz (with one
out-of-range id, to show the device's runtime warning) and, for each program, the numpy reference
outputs as out0 in the same file (the corpus convention).
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from nxsat.io import write_npz


def main(outdir: str) -> None:
    out = Path(outdir)
    rng = np.random.default_rng(2024)
    bf16 = ml_dtypes.bfloat16

    a = rng.standard_normal((128, 512)).astype(bf16)
    b = rng.standard_normal((512, 512)).astype(bf16)
    write_npz(out / "matmul.npz", {"a": a, "b": b, "out0": a.astype(np.float64) @ b.astype(np.float64)})

    x = (2 * rng.standard_normal((128, 512))).astype(bf16)
    e = np.exp(x.astype(np.float64) - x.astype(np.float64).max(1, keepdims=True))
    write_npz(out / "softmax.npz", {"x": x, "out0": e / e.sum(1, keepdims=True)})

    x = (3 * rng.standard_normal((128, 768)) + 1).astype(np.float32)
    gamma = rng.standard_normal((1, 768)).astype(np.float32)
    beta = rng.standard_normal((1, 768)).astype(np.float32)
    xn = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    write_npz(out / "layernorm.npz", {"x": x, "out0": xn * gamma + beta})
    write_npz(out / "layernorm.consts.npz", {"gamma": gamma, "beta": beta})

    table = rng.standard_normal((1000, 64)).astype(np.float32)
    ids = rng.integers(0, 1000, (128, 1)).astype(np.int32)
    ids[7, 0] = 1000  # out of range: the device keeps running, the row reads as zeros
    ref = table[np.clip(ids[:, 0], 0, 999)]
    ref[7] = 0
    write_npz(out / "gather.npz", {"table": table, "ids": ids, "out0": ref})
    print(f"inputs written to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")

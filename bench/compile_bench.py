"""Compile benchmark: per model, compile seconds per stage, peak memory, instructions, simulated latency,
roofline and their ratio (trn1, -O2, --auto-cast matmult, bf16 unless told otherwise), XLA's own CPU
compile of an HLO model when JAX is installed (and nxsat's wall time over it), and from the profile:
TensorE's utilization (PE%), the part of the run with a DMA transfer under way (DMA%) and the part of
TensorE's busy time with one (PE&DMA%: data movement hidden behind compute).

    python bench/compile_bench.py                       # the issue's models
    python bench/compile_bench.py --models mha_block_1x12x128x64_bf16 --auto-cast none
    python bench/compile_bench.py --variants O2:smallest,O1,O2,O3   # extractors and levels side by side
    python bench/compile_bench.py --model-type transformer          # with the transformer rule set

Each model compiles in a fresh process (``nxsat compile --report``), so its peak memory (max RSS) is
its own; models whose text elides constants compile with --fill-elided-constants. Each is compiled
``--repeat`` times (3) and the fastest wall time kept, as XLA's figure is the fastest of three (the
machines here are noisy); the stage times and memory shown are that run's. The compiles may write
Python's bytecode cache (PYTHONDONTWRITEBYTECODE is dropped from their environment), as an installed
package has it: otherwise every compile would also compile nxsat's own source (0.3 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "resnet50": ROOT / "tests/data/hlo/resnet50_keras_jax_f32.hlo",
    "gemma3_1b": ROOT / "tests/data/hlo/gemma3_1b_flax_call.hlo",
    "mha_block": ROOT / "tests/data/hlo/mha_block_1x12x128x64_bf16.hlo",
    "layer_norm": ROOT / "tests/data/hlo/layer_norm_1x4096x768_bf16.hlo",
    "transformer_layer": ROOT / "tests/data/jax/transformer_layer.hlo",
    "bert_base_l12": ROOT / "tests/data/bert/bert_base_l12.hlo",
    # written for the benchmark: a large bf16 matmul-bound model (the issue's TensorE utilization target)
    "matmul_bf16_2048": ROOT / "bench/data/matmul_bf16_2048.hlo",
}


def compile_args(ap: argparse.ArgumentParser) -> None:
    """The flags :func:`compile_one` reads, with the benchmarks' defaults (trn1, -O2, bf16 matmuls)."""
    ap.add_argument("--target", default="trn1")
    ap.add_argument("-O", type=int, default=2)
    ap.add_argument("--auto-cast", default="matmult")
    ap.add_argument("--auto-cast-type", default="bf16")


def compile_one(path: Path, args: argparse.Namespace, level: int, extractor: str | None = None,
                model_type: str = "generic", extra: list[str] | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "nxsat", "compile", str(path), "-o", str(Path(tmp) / "m.neff"), "--report",
               str(rep), "--logfile", "", "--verbose", "error", "--target", args.target, f"-O{level}",
               "--auto-cast", args.auto_cast, "--auto-cast-type", args.auto_cast_type, "--fill-elided-constants"]
        if extractor:
            cmd += ["--extractor", extractor]
        if model_type != "generic":
            cmd += ["--model-type", model_type]
        cmd += extra or []
        t0 = time.perf_counter()
        with open(os.devnull, "w") as out, tempfile.TemporaryFile("w+") as err:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            p = subprocess.Popen(cmd, stdout=out, stderr=err, env=dict(env, NXSAT_PROGRESS="0"))
            _, status, usage = os.wait4(p.pid, 0)  # this child's own peak memory (ru_maxrss, KB)
            code = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - t0
            err.seek(0)
            stderr = err.read().strip()
        if code != 0:
            return {"error": stderr.splitlines()[-1] if stderr else f"exit {code}"}
        r = json.loads(rep.read_text())
        r["wall_s"] = wall
        r["peak_rss_mb"] = usage.ru_maxrss / 1024
        return r


def xla_compile_seconds(path: Path, repeat: int = 3) -> float | None:
    """XLA's own CPU compile of the same HLO text (parse, convert to StableHLO, compile), the best of
    ``repeat`` in this process, for issue 11's ratio; None without JAX, for a Relay model, or where this
    JAX's (private, fast-moving) API differs: ``jax._src.lib.xla_client`` as of JAX 0.10."""
    if path.suffix != ".hlo":
        return None
    try:
        import jax
        from jax._src.lib import xla_client as xc
    except ImportError:
        return None
    text = path.read_text()
    best = float("inf")
    try:
        cpu = jax.devices("cpu")
        for _ in range(repeat):
            t0 = time.perf_counter()
            proto = xc.hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
            cpu[0].client.compile_and_load(xc._xla.mlir.hlo_to_stablehlo(proto), cpu[:1], xc.CompileOptions())
            best = min(best, time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - a JAX without this API: no figure, said so
        print(f"(XLA's compile not measured: {type(e).__name__}: {str(e)[:100]})", file=sys.stderr)
        return None
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="names (see MODELS) or paths, comma-separated")
    compile_args(ap)
    ap.add_argument("--model-type", default="generic", help="generic (default), transformer, unet-inference")
    ap.add_argument("--variants", default=None,
                    help="LEVEL[:EXTRACTOR],... e.g. O2:smallest,O1,O2,O3: each model compiled each way; "
                         "'vs first' is the latency over the first variant's (default: -O as given)")
    ap.add_argument("--repeat", type=int, default=3, help="compiles per model and variant; the fastest is kept "
                    "(default 3)")
    args = ap.parse_args()
    variants = [(int(v.split(":")[0].lstrip("O")), v.split(":")[1] if ":" in v else None)
                for v in (args.variants or f"O{args.O}").split(",")]
    print(f"target {args.target}, --model-type {args.model_type}, --auto-cast {args.auto_cast} "
          f"({args.auto_cast_type}); seconds (the fastest of {args.repeat} compiles), MB, us")
    print(f"{'model':<18} {'variant':>12} {'wall':>6} {'front':>6} {'satur':>6} {'extr':>6} {'lower':>6} "
          f"{'fwd':>6} {'sched':>6} {'neff':>6} {'sim':>6} {'races':>6} {'RSS':>6} {'instr':>9} {'latency':>11} "
          f"{'roofline':>10} {'ratio':>8} {'vs first':>8} {'PE%':>5} {'DMA%':>5} {'PE&DMA%':>7}")
    xla_lines = []
    for name in args.models.split(","):
        path = MODELS.get(name, Path(name))
        first = None
        walls = []
        for level, extractor in variants:
            label = f"O{level}" + (f":{extractor}" if extractor else "")
            runs = [compile_one(path, args, level, extractor, args.model_type) for _ in range(max(1, args.repeat))]
            r = next((x for x in runs if "error" in x), None) or min(runs, key=lambda x: x["wall_s"])
            if "error" in r:
                print(f"{name:<18} {label:>12} failed: {r['error'][:150]}")
                continue
            s = r["stages"]
            first = first or r["latency_us"]
            walls.append((label, r["wall_s"]))
            print(f"{name:<18} {label:>12} {r['wall_s']:6.1f} {s['frontend']:6.2f} {s['saturate']:6.2f} "
                  f"{s['extract']:6.2f} {s['lower']:6.2f} {s.get('forward', 0.0):6.2f} {s['schedule']:6.2f} "
                  f"{s['neff']:6.2f} {s['simulate']:6.2f} "
                  f"{s.get('races', 0.0):6.2f} {r['peak_rss_mb']:6.0f} {r['instructions']:9,} {r['latency_us']:11.1f} "
                  f"{r['roofline_us']:10.2f} {r['latency_over_roofline']:8.1f} {r['latency_us'] / first:8.4f} "
                  f"{r['engines']['pe']:5.1%} {r['overlap']['dma_of_run']:5.1%} {r['overlap']['pe_with_dma']:7.1%}",
                  flush=True)
        xla = xla_compile_seconds(path)
        if xla is not None:
            xla_lines.append(f"{name}: XLA's CPU compile {xla:.3f} s; nxsat's wall / XLA's: "
                             + ", ".join(f"{label} {wall / xla:.1f}x" for label, wall in walls))
    for line in xla_lines:
        print(line)


if __name__ == "__main__":
    main()

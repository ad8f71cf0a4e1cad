"""Model-type benchmark (issue: model-type rule sets): each model of a family compiled under generic, under
its family's --model-type and under the other family's, on trn1 at -O2 with --auto-cast matmult (bf16).
Prints the simulated latency of each beside the roofline, the speed-up of the family's type over generic
(the target: >= 1.3x, or within 1.1x of the roofline), the other type's slowdown (the target: <= 2%), and
the fused operators and model-type rules of the family's compile.

    python bench/model_types.py
    python bench/model_types.py --models mha_block --family transformer

Each compile runs in a fresh process (`nxsat compile --report`), as bench/compile_bench.py does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_bench import ROOT, compile_args, compile_one  # noqa: E402

from nxsat.sim.critical import shares  # noqa: E402

FAMILIES = {
    "transformer": {
        "transformer_layer": ROOT / "tests/data/jax/transformer_layer.hlo",
        "mha_block": ROOT / "tests/data/hlo/mha_block_1x12x128x64_bf16.hlo",
        "gemma3_1b": ROOT / "tests/data/hlo/gemma3_1b_flax_call.hlo",
        "bert_base_l12": ROOT / "tests/data/bert/bert_base_l12.hlo",
        "gpt2_extract": ROOT / "tests/data/relay/gpt2_extract.relay",
        "gpt_decoder": ROOT / "tests/data/models/gpt_decoder.hlo",
        "attention_s2048": ROOT / "tests/data/models/attention_s2048.hlo",
    },
    "unet-inference": {
        "unet_tiny": ROOT / "tests/data/jax/unet_tiny.hlo",
        "resnet50": ROOT / "tests/data/hlo/resnet50_keras_jax_f32.hlo",
        "unet_diffusers": ROOT / "tests/data/models/unet_diffusers.hlo",
        "resnet_small": ROOT / "tests/data/models/resnet_small.hlo",
    },
}
RELAY_CONSTANTS = {"gpt2_extract": ROOT / "tests/data/relay/gpt2_extract.consts.json"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(FAMILIES), action="append", help="default: every family")
    ap.add_argument("--models", default=None, help="names of FAMILIES' models, comma-separated (default: all)")
    compile_args(ap)
    args = ap.parse_args()
    wanted = set(args.models.split(",")) if args.models else None
    print(f"target {args.target}, -O{args.O}, --auto-cast {args.auto_cast} ({args.auto_cast_type}); us")
    print(f"{'model':<18} {'family':<15} {'generic':>11} {'family':>11} {'other':>11} {'roofline':>10} "
          f"{'speed-up':>8} {'fam/roof':>8} {'other/gen':>9} {'met':>4}  fused / rules")
    for family in args.family or sorted(FAMILIES):
        other = next(f for f in FAMILIES if f != family)
        for name, path in FAMILIES[family].items():
            if wanted and name not in wanted:
                continue
            runs = {}
            for mt in ("generic", family, other):
                extra = ["--relay-constants", str(RELAY_CONSTANTS[name])] if name in RELAY_CONSTANTS else []
                runs[mt] = compile_one(path, args, args.O, model_type=mt, extra=extra)
            report(name, family, other, runs)


def report(name: str, family: str, other: str, runs: dict[str, dict]) -> None:
    """One model's row; below it, where it misses the target, what limits it: the critical path of the
    family's program (the compile report's; ``nxsat profile`` prints it in full) and its DMA work (the DMA
    engines' time for its transfers, at their descriptors' rates: a floor the roofline's bytes do not show)."""
    bad = next((r for r in runs.values() if "error" in r), None)
    if bad:
        print(f"{name:<18} {family:<15} failed: {bad['error'][:150]}")
        return
    g, f, o = (runs[k]["latency_us"] for k in ("generic", family, other))
    roof = runs[family]["roofline_us"]
    met = g / f >= 1.3 or f / roof <= 1.1
    fused = ", ".join(f"{k} x{v}" for k, v in runs[family].get("fused", {}).items()) or "-"
    rules = ", ".join(f"{k} {v}" for k, v in runs[family]["egraph"].get("model_type_rules", {}).items())
    print(f"{name:<18} {family:<15} {g:11.1f} {f:11.1f} {o:11.1f} {roof:10.2f} {g / f:8.3f} {f / roof:8.2f} "
          f"{o / g - 1:+9.2%} {'yes' if met else 'no':>4}  {fused}" + (f" / {rules}" if rules else ""), flush=True)
    if not met:
        p = runs[family]["critical_path"]
        ops = ", ".join(f"{o['operator'] or '-'} on {o['engine']} {o['ns'] / 1000:.1f}" for o in p["operators"])
        work = runs[family]["dma_work_us"]
        print(f"{'':<18} critical path: {shares(p)}\n{'':<18} longest: {ops} (us)\n{'':<18} DMA work {work:.1f} us "
              f"({work / roof:.2f}x the roofline; generic's {runs['generic']['dma_work_us']:.1f}): no schedule of its "
              "transfers ends sooner", flush=True)


if __name__ == "__main__":
    main()

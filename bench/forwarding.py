"""Store-to-load forwarding (backend/forward.py): each model compiled with and without it (trn1, -O2,
--auto-cast matmult, bf16 by default), both NEFFs run on the simulator with the same inputs. Prints the
simulated latency of each beside the roofline, what the pass did, and whether the outputs are
bit-identical (they must be: forwarding moves the same bits on chip instead of through HBM).

    python bench/forwarding.py
    python bench/forwarding.py --models resnet_small,gpt_decoder --model-type generic

Inputs are the model's XLA inputs where tests/data has them (``NAME.npz``), else seeded random ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "resnet_small": ROOT / "tests/data/models/resnet_small.hlo",
    "gpt_decoder": ROOT / "tests/data/models/gpt_decoder.hlo",
    "transformer_layer": ROOT / "tests/data/jax/transformer_layer.hlo",
    "unet_tiny": ROOT / "tests/data/jax/unet_tiny.hlo",
    "unet_diffusers": ROOT / "tests/data/models/unet_diffusers.hlo",
    "bert_base_l2": ROOT / "tests/data/bert/bert_base_l2.hlo",
    "resnet50": ROOT / "tests/data/hlo/resnet50_keras_jax_f32.hlo",
}


def _inputs(path: Path, model: object) -> dict[str, np.ndarray]:
    ref = path.with_suffix(".npz")
    if ref.exists():
        data = np.load(ref)
        return {k: data[k] for k in data.files if k.startswith("in")}
    from nxsat.cli.device import _random_inputs

    return _random_inputs(model, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="names of MODELS, comma-separated (default: all)")
    ap.add_argument("--model-type", default="generic")
    ap.add_argument("--target", default="trn1")
    ap.add_argument("-O", type=int, default=2)
    ap.add_argument("--auto-cast", default="matmult")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from nxsat import sim
    from nxsat.driver import CompileOptions, compile_model

    names = args.models.split(",") if args.models else list(MODELS)
    print(f"target {args.target}, -O{args.O}, --model-type {args.model_type}, --auto-cast {args.auto_cast}; us")
    print(f"{'model':18} {'without':>10} {'with':>10} {'ratio':>7} {'roofline':>10} {'loads':>6} {'copies':>6} "
          f"{'tensors':>7} {'refused':>7}  outputs")
    for name in names:
        path = MODELS[name]
        runs = []
        for forward in (False, True):
            opts = CompileOptions(target=args.target, optlevel=args.O, auto_cast=args.auto_cast,
                                  model_type=args.model_type, forward=forward)
            result = compile_model(str(path), opts)
            model = sim.load(result.neff, verify=True)
            runs.append((result.report, model.run(_inputs(path, model))))
        (off, got_off), (on, got_on) = runs
        f = on["forwarded"]
        same = len(got_on) == len(got_off) and all(np.array_equal(a, b, equal_nan=True)
                                                   for a, b in zip(got_on, got_off))
        print(f"{name:18} {off['latency_us']:10.1f} {on['latency_us']:10.1f} "
              f"{on['latency_us'] / off['latency_us']:7.3f} {on['roofline_us']:10.2f} {f['loads']:6} {f['copies']:6} "
              f"{f['tensors']:7} {f['refused_for_sbuf']:7}  {'bit-identical' if same else 'DIFFERENT'}", flush=True)


if __name__ == "__main__":
    main()

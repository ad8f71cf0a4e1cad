"""Generate BERT-base encoder HLO modules from JAX (needs jax and flax), for compile benchmarks.

    python generate_bert.py OUTDIR

For N in 2, 12, 24 writes bert_base_lN.hlo (HLO text exactly as JAX lowers it, before any
XLA optimization) and bert_base_xla_compile.json with the seconds XLA's CPU backend takes
for jax.jit(fn).lower(*args).compile() (best of 3, caches cleared, fresh jit each time),
plus the jax/jaxlib versions and nproc. No .npz: the weights (~110M-335M floats) are not kept.

Model: BERT-base, float32 throughout. Embeddings included: word (30522) + position (512)
+ token type (2) embeddings, then LayerNorm. Each layer: self-attention (hidden 768, 12 heads
of 64, separate Q/K/V/output Dense with bias, scores scaled by 1/8 plus an additive mask
(1 - attention_mask) * -10000), residual, LayerNorm; FFN 768->3072->768 with GELU, tanh
approximation (flax nn.gelu default), residual, LayerNorm (post-LN as in BERT, eps 1e-12).
No pooler. Entry parameters: input_ids, token_type_ids, attention_mask (int32 [1,128] each),
then the weights in flax's flattened tree order (as in ../jax/generate.py's with_params).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
import jaxlib
import flax
from flax import linen as nn

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
HIDDEN, HEADS, FFN, VOCAB, MAX_POS, TYPES, EPS = 768, 12, 3072, 30522, 512, 2, 1e-12
BATCH, SEQ = 1, 128


def with_params(module, *sample):
    """Like ../jax/generate.py's with_params, but weights are abstract (shape/dtype only): they are
    entry parameters of the lowered module and never materialized."""
    variables = jax.eval_shape(module.init, jax.random.PRNGKey(7), *sample)
    leaves, tree = jax.tree_util.tree_flatten(variables)
    def fn(*xs):
        v = jax.tree_util.tree_unflatten(tree, list(xs[len(sample):]))
        return module.apply(v, *xs[:len(sample)])
    return fn, list(sample) + [jax.ShapeDtypeStruct(l.shape, l.dtype) for l in leaves]


class SelfAttention(nn.Module):
    @nn.compact
    def __call__(self, x, bias):
        b, s, _ = x.shape
        d = HIDDEN // HEADS
        split = lambda t: t.reshape(b, s, HEADS, d)
        q = split(nn.Dense(HIDDEN, name="query")(x))
        k = split(nn.Dense(HIDDEN, name="key")(x))
        v = split(nn.Dense(HIDDEN, name="value")(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d).astype(np.float32) + bias
        probs = jax.nn.softmax(scores, axis=-1)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, HIDDEN)
        return nn.Dense(HIDDEN, name="output")(ctx)


class Layer(nn.Module):
    @nn.compact
    def __call__(self, x, bias):
        x = nn.LayerNorm(epsilon=EPS)(x + SelfAttention()(x, bias))
        h = nn.gelu(nn.Dense(FFN)(x), approximate=True)
        return nn.LayerNorm(epsilon=EPS)(x + nn.Dense(HIDDEN)(h))


class BertEncoder(nn.Module):
    layers: int

    @nn.compact
    def __call__(self, input_ids, token_type_ids, attention_mask):
        pos = jnp.arange(input_ids.shape[1])[None, :]
        x = (nn.Embed(VOCAB, HIDDEN, name="word")(input_ids)
             + nn.Embed(MAX_POS, HIDDEN, name="position")(pos)
             + nn.Embed(TYPES, HIDDEN, name="token_type")(token_type_ids))
        x = nn.LayerNorm(epsilon=EPS, name="embed_ln")(x)
        bias = ((1.0 - attention_mask.astype(jnp.float32)) * -10000.0)[:, None, None, :]
        for i in range(self.layers):
            x = Layer(name=f"layer_{i}")(x, bias)
        return x


def xla_compile_seconds(fn, args, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        jax.clear_caches()
        f = lambda *a: fn(*a)  # fresh function object: no jit/lowering cache hit
        t0 = time.perf_counter()
        jax.jit(f).lower(*args).compile()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    rng = np.random.default_rng(1234)
    ids = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
    types = np.zeros((BATCH, SEQ), np.int32)
    mask = np.ones((BATCH, SEQ), np.int32)
    result = {}
    for n in (2, 12, 24):
        name = f"bert_base_l{n}"
        fn, args = with_params(BertEncoder(layers=n), ids, types, mask)
        text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
        with open(os.path.join(OUT, name + ".hlo"), "w") as f:
            f.write(text)
        count = sum(" = " in line for line in text.splitlines())
        weights = sum(int(np.prod(a.shape)) for a in args[3:])
        result[name] = round(xla_compile_seconds(fn, args), 3)
        print(f"{name}: {count} instructions, {weights} weights, XLA CPU compile {result[name]:.3f} s")
    result.update(jax=jax.__version__, jaxlib=jaxlib.__version__, flax=flax.__version__,
                  nproc=int(subprocess.check_output(["nproc"]).strip()))
    with open(os.path.join(OUT, "bert_base_xla_compile.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

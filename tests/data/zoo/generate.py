"""Generate the zoo of tests/data/zoo with XLA reference outputs (needs jax; no flax).

    python generate.py OUTDIR

Small models written the way users write them, each the smallest form of a pattern a compiler
must not do badly on. NAME.hlo is the HLO text exactly as JAX lowers it (before any XLA optimization);
NAME.npz holds the inputs in0..inN in parameter order and XLA CPU's results out0..outM (bf16 arrays
are stored as numpy saves them, raw 2-byte values).

- vit_patch: a ViT block on a 2x32x32x3 image: 8x8 patches (a stride-8 convolution with more taps
  than outputs), pre-LayerNorm attention of 4 heads, a tanh-GELU MLP;
- swin_window: Swin window attention on 56x56x96 (windows of 7, 3 heads) with its relative-position
  bias, a [3, 49, 49] view of a gathered [169, 3] table, added to the scores of all 64 windows;
- mbconv: an EfficientNet block (1x1 expand, depthwise 5x5 stride 2, squeeze-excite, 1x1 project)
  with SiLU as JAX writes it, x * 1 / (1 + exp(-x));
- clip_causal: a CLIP text layer (77 tokens, 8 heads of 16) with its causal mask added as triu of
  -inf, and the quick GELU, x * sigmoid(1.702 x);
- bert_padding: BERT attention (4 sequences of 128, 4 heads of 32) with a padding mask added as
  (1 - mask) * -10000, then a residual LayerNorm;
- bf16_mlp: a dense layer on bf16 inputs;
- cnn_batch4: a small CNN on a batch of 4 (5x5 stride-2 and 3x3 convolutions with ReLU, 3x3 max
  pooling, global average pooling, a dense head): its layout measured channels-first beats the cost
  model's.
"""
import os
import sys

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(2026_12_01)


def rand(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def emit(name, fn, args):
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    with open(os.path.join(OUT, name + ".hlo"), "w") as f:
        f.write(text)
    outs = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    arrays = {f"in{i}": np.asarray(a) for i, a in enumerate(args)}
    arrays.update({f"out{i}": np.asarray(o) for i, o in enumerate(outs)})
    np.savez(os.path.join(OUT, name + ".npz"), **arrays)
    print(name, sum(" = " in line for line in text.splitlines()), "instructions")


def conv(x, w, stride=1, pad="SAME", groups=1):
    return lax.conv_general_dilated(x, w, (stride, stride), pad, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    feature_group_count=groups)


def layer_norm(z, g, b=0.0, eps=1e-6):
    m = z.mean(-1, keepdims=True)
    v = ((z - m) ** 2).mean(-1, keepdims=True)
    return (z - m) * lax.rsqrt(v + eps) * g + b


def heads(z, n):
    b, t, c = z.shape
    return z.reshape(b, t, n, c // n).transpose(0, 2, 1, 3)


def vit_patch(x, wp, bp, wq, wk, wv, wo, w1, w2, g1, g2):
    h = conv(x, wp, stride=8, pad="VALID") + bp
    b, hh, ww, c = h.shape
    t = h.reshape(b, hh * ww, c)
    a = layer_norm(t, g1)
    q, k, v = heads(a @ wq, 4), heads(a @ wk, 4), heads(a @ wv, 4)
    s = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(c // 4), -1)
    t = t + (s @ v).transpose(0, 2, 1, 3).reshape(b, -1, c) @ wo
    t = t + jax.nn.gelu(layer_norm(t, g2) @ w1, approximate=True) @ w2
    return t.mean(1)


def swin_window(x, wqkv, wo, table, idx):
    b, hh, ww, c = x.shape
    w = 7
    xw = x.reshape(b, hh // w, w, ww // w, w, c).transpose(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)
    qkv = (xw @ wqkv).reshape(xw.shape[0], w * w, 3, 3, c // 3).transpose(2, 0, 3, 1, 4)
    s = qkv[0] @ qkv[1].transpose(0, 1, 3, 2) / np.sqrt(c // 3)
    bias = table[idx.reshape(-1)].reshape(w * w, w * w, 3).transpose(2, 0, 1)
    o = (jax.nn.softmax(s + bias[None], -1) @ qkv[2]).transpose(0, 2, 1, 3).reshape(-1, w * w, c) @ wo
    return o.reshape(b, hh // w, ww // w, w, w, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, hh, ww, c)


def mbconv(x, we, wd, ws1, ws2, wp):
    silu = lambda z: z * (1.0 / (1.0 + jnp.exp(-z)))  # noqa: E731 - as JAX lowers jax.nn.silu
    h = silu(conv(x, we))
    h = silu(conv(h, wd, stride=2, groups=h.shape[-1]))
    s = h.mean((1, 2))
    h = h * jax.nn.sigmoid(silu(s @ ws1) @ ws2)[:, None, None, :]
    return conv(h, wp)


def clip_causal(x, wqkv, wo, w1, w2, g1, b1, g2, b2):
    t, d = x.shape[1], x.shape[2]
    q, k, v = jnp.split(layer_norm(x, g1, b1, 1e-5) @ wqkv, 3, -1)
    q, k, v = heads(q, 8), heads(k, 8), heads(v, 8)
    s = q @ k.transpose(0, 1, 3, 2) / 4.0 + jnp.triu(jnp.full((t, t), -jnp.inf), 1)
    x = x + (jax.nn.softmax(s, -1) @ v).transpose(0, 2, 1, 3).reshape(1, t, d) @ wo
    h = layer_norm(x, g2, b2, 1e-5) @ w1
    return x + (h * jax.nn.sigmoid(1.702 * h)) @ w2


def bert_padding(x, mask, wq, wk, wv, wo, g):
    b, t, c = x.shape
    q, k, v = heads(x @ wq, 4), heads(x @ wk, 4), heads(x @ wv, 4)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(c // 4) + (1.0 - mask[:, None, None, :]) * -10000.0
    o = (jax.nn.softmax(s, -1) @ v).transpose(0, 2, 1, 3).reshape(b, t, c) @ wo
    return layer_norm(x + o, g)


def bf16_mlp(x, w, b):
    return jax.nn.relu(x @ w + b).sum(-1)


def cnn_batch4(x, w1, w2, w3, wd):
    h = jax.nn.relu(conv(x, w1, 2))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    h = jax.nn.relu(conv(h, w2))
    h = jax.nn.relu(conv(h, w3, 2))
    return h.mean((1, 2)) @ wd


def main():
    c = 64
    emit("vit_patch", vit_patch, [rand(2, 32, 32, 3), rand(8, 8, 3, c, scale=0.1), rand(c),
                                  *[rand(c, c, scale=0.1) for _ in range(4)], rand(c, 4 * c, scale=0.1),
                                  rand(4 * c, c, scale=0.1), rand(c), rand(c)])
    coords = np.stack(np.meshgrid(np.arange(7), np.arange(7), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + 6
    emit("swin_window", swin_window, [rand(1, 56, 56, 96), rand(96, 288, scale=0.05), rand(96, 96, scale=0.05),
                                      rand(169, 3, scale=0.1), (rel[..., 0] * 13 + rel[..., 1]).astype(np.int32)])
    emit("mbconv", mbconv, [rand(1, 56, 56, 40), rand(1, 1, 40, 240, scale=0.1), rand(5, 5, 1, 240, scale=0.1),
                            rand(240, 10, scale=0.1), rand(10, 240, scale=0.1), rand(1, 1, 240, 80, scale=0.1)])
    d = 128
    emit("clip_causal", clip_causal, [rand(1, 77, d), rand(d, 3 * d, scale=0.08), rand(d, d, scale=0.08),
                                      rand(d, 4 * d, scale=0.08), rand(4 * d, d, scale=0.05),
                                      rand(d), rand(d), rand(d), rand(d)])
    mask = np.ones((4, 128), np.float32)
    mask[1, 100:] = 0
    mask[3, 17:] = 0
    emit("bert_padding", bert_padding, [rand(4, 128, d), mask, *[rand(d, d, scale=0.08) for _ in range(4)], rand(d)])
    emit("cnn_batch4", cnn_batch4, [rand(4, 40, 40, 3), rand(5, 5, 3, 24, scale=0.2), rand(3, 3, 24, 40, scale=0.1),
                                    rand(3, 3, 40, 136, scale=0.1), rand(136, 11, scale=0.1)])
    emit("bf16_mlp", bf16_mlp, [jnp.asarray(rand(8, 64), jnp.bfloat16), jnp.asarray(rand(64, 32, scale=0.1), jnp.bfloat16),
                                jnp.asarray(rand(32), jnp.bfloat16)])


if __name__ == "__main__":
    main()

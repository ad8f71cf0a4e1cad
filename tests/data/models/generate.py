"""Generate the model-type benchmark's JAX models with XLA reference outputs (needs jax and flax).

    python generate.py OUTDIR

Each model NAME gives NAME.hlo (HLO text exactly as JAX lowers it, before any XLA optimization) and
NAME.npz with inputs in0..inN (parameter order) and XLA CPU's results out0..outM, as ../jax/generate.py
does. Weights are drawn fan-in-scaled (trained-like magnitudes: N(0, 1) weights overflow a deep model),
normalization statistics and scales perturbed away from their initial 0 and 1 so folding them is not
trivially exact.

- attention_s2048: causal self-attention over 2,048 positions (4 heads of 64, hidden 256), flax's
  MultiHeadDotProductAttention with nn.make_causal_mask: its fp32 scores (64 MB) do not fit in SBUF;
- gpt_decoder: one decoding step of a 2-layer GPT (pre-LayerNorm, 4 heads of 32, tanh GELU, tied
  vocabulary of 512) over a KV cache of 128 positions: the new key and value written into the cache
  with dynamic-update-slice at the step's position, the causal mask as a select against an iota;
- unet_diffusers: a diffusers-style UNet (conv in, ResNet blocks of GroupNorm + SiLU + conv with a
  skip, a strided down-sampling conv, a self-attention block over positions, nearest up-sampling,
  skip concatenation, GroupNorm + SiLU + conv out), 32x32x4 input;
- resnet_small: a ResNet (stem conv + BatchNorm + ReLU + max pool, bottleneck blocks with projection
  shortcuts, global average pool, dense head) with BatchNorm in inference mode (running statistics).
"""
import os
import sys

import numpy as np
import jax
import jax.numpy as jnp
from flax import linen as nn

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(2026)


def rand(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def emit(name, fn, args):
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    with open(os.path.join(OUT, name + ".hlo"), "w") as f:
        f.write(text)
    outs = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    arrays = {f"in{i}": np.asarray(a) for i, a in enumerate(args)}
    arrays.update({f"out{i}": np.asarray(o) for i, o in enumerate(outs)})
    assert all(np.isfinite(np.asarray(o, np.float64)).all() for o in outs), name
    np.savez_compressed(os.path.join(OUT, name + ".npz"), **arrays)
    print(name, sum(" = " in line for line in text.splitlines()), "instructions")


def perturbed(path, leaf):
    """Trained-like parameters: kernels fan-in scaled, biases small, scales near 1, variances positive."""
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    shape = np.shape(leaf)
    if name.endswith("kernel"):
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        return rand(*shape, scale=1.0 / np.sqrt(fan_in))
    if name.endswith("embedding"):
        return rand(*shape, scale=0.5)
    if name.endswith("scale"):
        return (1.0 + rand(*shape, scale=0.1)).astype(np.float32)
    if name.endswith("var"):
        return (0.5 + rng.random(shape)).astype(np.float32)
    return rand(*shape, scale=0.1)  # biases, running means


def with_params(module, *sample):
    variables = module.init(jax.random.PRNGKey(7), *sample)
    variables = jax.tree_util.tree_map_with_path(perturbed, variables)
    leaves, tree = jax.tree_util.tree_flatten(variables)

    def fn(*xs):
        v = jax.tree_util.tree_unflatten(tree, list(xs[len(sample):]))
        return module.apply(v, *xs[:len(sample)])
    return fn, list(sample) + [np.asarray(leaf) for leaf in leaves]


class CausalAttention(nn.Module):
    heads: int = 4

    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        return nn.MultiHeadDotProductAttention(num_heads=self.heads)(x, x, mask=mask)


class GPTDecoder(nn.Module):
    """One decoding step: the token at position ``pos`` reads the KV cache of every layer."""
    vocab: int = 512
    hidden: int = 128
    heads: int = 4
    layers: int = 2
    max_len: int = 128

    @nn.compact
    def __call__(self, token, pos, k_cache, v_cache):
        d = self.hidden // self.heads
        embed = nn.Embed(self.vocab, self.hidden)
        x = embed(token) + nn.Embed(self.max_len, self.hidden)(pos)[:, None, :]  # [1, 1, hidden]
        ks, vs = [], []
        visible = jnp.arange(self.max_len)[None, None, None, :] <= pos[0]  # [1, 1, 1, max_len]
        for i in range(self.layers):
            h = nn.LayerNorm()(x)
            q = nn.DenseGeneral((self.heads, d))(h)  # [1, 1, H, d]
            k = nn.DenseGeneral((self.heads, d))(h)
            v = nn.DenseGeneral((self.heads, d))(h)
            kc = jax.lax.dynamic_update_slice(k_cache[i], k, (0, pos[0], 0, 0))  # [1, max_len, H, d]
            vc = jax.lax.dynamic_update_slice(v_cache[i], v, (0, pos[0], 0, 0))
            ks.append(kc)
            vs.append(vc)
            s = jnp.einsum("bqhd,bkhd->bhqk", q, kc) / np.sqrt(d).astype(np.float32)
            s = jnp.where(visible, s, jnp.finfo(jnp.float32).min)
            a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), vc)
            x = x + nn.DenseGeneral(self.hidden, axis=(-2, -1))(a)
            h = nn.LayerNorm()(x)
            x = x + nn.Dense(self.hidden)(nn.gelu(nn.Dense(4 * self.hidden)(h), approximate=True))
        logits = embed.attend(nn.LayerNorm()(x))
        return logits, jnp.stack(ks), jnp.stack(vs)


class ResBlock(nn.Module):
    ch: int

    @nn.compact
    def __call__(self, x):
        h = nn.Conv(self.ch, (3, 3), padding="SAME")(nn.silu(nn.GroupNorm(num_groups=8)(x)))
        h = nn.Conv(self.ch, (3, 3), padding="SAME")(nn.silu(nn.GroupNorm(num_groups=8)(h)))
        skip = x if x.shape[-1] == self.ch else nn.Conv(self.ch, (1, 1))(x)
        return skip + h


class AttnBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        b, hh, ww, c = x.shape
        h = nn.GroupNorm(num_groups=8)(x).reshape(b, hh * ww, c)
        h = nn.MultiHeadDotProductAttention(num_heads=1)(h, h)
        return x + h.reshape(b, hh, ww, c)


class DiffusersUNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Conv(32, (3, 3), padding="SAME")(x)
        s1 = ResBlock(32)(h)
        d = nn.Conv(32, (3, 3), strides=(2, 2), padding="SAME")(s1)
        d = AttnBlock()(ResBlock(64)(d))
        b, hh, ww, c = d.shape
        u = nn.Conv(64, (3, 3), padding="SAME")(jax.image.resize(d, (b, hh * 2, ww * 2, c), "nearest"))
        u = ResBlock(32)(jnp.concatenate([u, s1], axis=-1))
        return nn.Conv(x.shape[-1], (3, 3), padding="SAME")(nn.silu(nn.GroupNorm(num_groups=8)(u)))


class Bottleneck(nn.Module):
    ch: int
    stride: int = 1

    @nn.compact
    def __call__(self, x):
        bn = lambda: nn.BatchNorm(use_running_average=True)  # noqa: E731
        h = nn.relu(bn()(nn.Conv(self.ch, (1, 1), use_bias=False)(x)))
        h = nn.relu(bn()(nn.Conv(self.ch, (3, 3), strides=self.stride, padding="SAME", use_bias=False)(h)))
        h = bn()(nn.Conv(4 * self.ch, (1, 1), use_bias=False)(h))
        if x.shape[-1] != 4 * self.ch or self.stride != 1:
            x = bn()(nn.Conv(4 * self.ch, (1, 1), strides=self.stride, use_bias=False)(x))
        return nn.relu(x + h)


class SmallResNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(32, (7, 7), strides=2, padding="SAME",
                                                                     use_bias=False)(x)))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for ch, stride in ((16, 1), (16, 1), (32, 2), (32, 1), (64, 2)):
            x = Bottleneck(ch, stride)(x)
        return nn.Dense(10)(x.mean(axis=(1, 2)))


def main():
    fn, args = with_params(CausalAttention(), rand(1, 2048, 256))
    emit("attention_s2048", fn, args)
    dec = GPTDecoder()
    d = dec.hidden // dec.heads
    caches = [rand(dec.layers, 1, dec.max_len, dec.heads, d, scale=0.5) for _ in range(2)]
    fn, args = with_params(dec, np.array([[17]], np.int32), np.array([40], np.int32), *caches)
    emit("gpt_decoder", fn, args)
    fn, args = with_params(DiffusersUNet(), rand(1, 32, 32, 4))
    emit("unet_diffusers", fn, args)
    fn, args = with_params(SmallResNet(), rand(1, 64, 64, 3))
    emit("resnet_small", fn, args)


if __name__ == "__main__":
    main()

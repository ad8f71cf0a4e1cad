"""Regenerate the XLA rng-bit-generator references in this folder (needs jax and jaxlib, not nxsat).

    python generate.py [OUTDIR]

Each case NAME gives NAME.hlo (the HLO text XLA runs) and NAME.npz: the inputs in0.. in parameter
order and XLA CPU's results out0.. flattened (out0 = the new state, out1 = the random bits).
Most cases are jax.lax.rng_bit_generator lowered by JAX (with jax_enable_x64, so the state is a
u64 vector). JAX refuses a u64[3] Philox state, which XLA accepts; those cases are HLO text written
here, compiled and run by the same XLA CPU client (HLO -> StableHLO -> compile), marked "hlo".
Files are written whole (temporary file, then rename) with fixed zip timestamps.
"""
import io
import os
import sys
import tempfile
import zipfile

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

jax.config.update("jax_enable_x64", True)
import jax.extend  # noqa: E402  (after the x64 switch)
from jax._src.lib import xla_client as xc  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
ALG = {"rng_default": lax.RandomAlgorithm.RNG_DEFAULT, "rng_three_fry": lax.RandomAlgorithm.RNG_THREE_FRY,
       "rng_philox": lax.RandomAlgorithm.RNG_PHILOX}
U64_MAX = np.iinfo(np.uint64).max


def write(path, data):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def save(name, text, inputs, outputs):
    write(os.path.join(OUT, name + ".hlo"), text.encode())
    arrays = {f"in{i}": np.asarray(a) for i, a in enumerate(inputs)}
    arrays.update({f"out{i}": np.asarray(o) for i, o in enumerate(outputs)})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(value, order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, member.getvalue())
    write(os.path.join(OUT, name + ".npz"), buf.getvalue())
    print(name, [f"{k}:{v.dtype}{list(v.shape)}" for k, v in arrays.items()])


def emit_jax(name, algorithm, state, shape, dtype):
    """jax.lax.rng_bit_generator as JAX lowers it."""
    def fn(s):
        return lax.rng_bit_generator(s, shape, dtype=dtype, algorithm=ALG[algorithm])
    text = jax.jit(fn).lower(state).as_text(dialect="hlo")
    outs = jax.tree_util.tree_leaves(jax.jit(fn)(state))
    save(name, text, [state], outs)


def emit_hlo(name, algorithm, state, shape, dtype):
    """A module written here (for what JAX will not lower), compiled and run by XLA CPU."""
    st = f"u64[{len(state)}]"
    out = f"{np.dtype(dtype).name.replace('uint', 'u').replace('int', 's')}[{','.join(map(str, shape))}]"
    text = (f"HloModule {name}, entry_computation_layout={{({st}{{0}})->({st}{{0}}, {out})}}\n\n"
            f"ENTRY main {{\n  state = {st} parameter(0)\n"
            f"  ROOT rng = ({st}, {out}) rng-bit-generator(state), algorithm={algorithm}\n}}\n")
    module = xc.hlo.hlo_module_from_text(text)
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    backend = jax.extend.backend.get_backend("cpu")
    exe = backend.compile_and_load(stablehlo, backend.devices()[:1], xc.CompileOptions())
    outs = [np.asarray(o) for o in exe.execute([jax.device_put(state)])]
    save(name, text, [state], outs)


def main():
    s = np.array([1, 2], np.uint64)
    big = np.array([0x0123456789ABCDEF, 0xFEDCBA9876543210], np.uint64)
    cases = [
        # rng_default (Philox on XLA CPU)
        (emit_jax, "default_u32_3x5", "rng_default", s, (3, 5), jnp.uint32),
        (emit_jax, "default_u32_scalar", "rng_default", big, (), jnp.uint32),
        (emit_jax, "default_u8_2x3x5", "rng_default", big, (2, 3, 5), jnp.uint8),
        (emit_jax, "default_u16_9", "rng_default", big, (9,), jnp.uint16),
        (emit_jax, "default_u64_3x3", "rng_default", big, (3, 3), jnp.uint64),
        (emit_jax, "default_u32_64x130", "rng_default", big, (64, 130), jnp.uint32),
        (emit_jax, "default_u32_0x3", "rng_default", s, (0, 3), jnp.uint32),
        (emit_jax, "default_u32_wrap", "rng_default", np.array([7, U64_MAX - 1], np.uint64), (4, 3),
         jnp.uint32),
        # rng_philox, u64[2] and u64[3] states (the latter with a carry into the high word)
        (emit_jax, "philox_u32_4x6", "rng_philox", big, (4, 6), jnp.uint32),
        (emit_jax, "philox_u64_5", "rng_philox", big, (5,), jnp.uint64),
        (emit_jax, "philox_u16_7x3", "rng_philox", s, (7, 3), jnp.uint16),
        # JAX's u32[4] key form: bitcast to u64[2] around the generator
        (emit_jax, "philox_u32key_2x5", "rng_philox", np.array([1, 2, 3, 4], np.uint32), (2, 5), jnp.uint32),
        (emit_hlo, "philox3_u32_3x7", "rng_philox", np.array([5, 6, 7], np.uint64), (3, 7), np.uint32),
        (emit_hlo, "philox3_u64_carry", "rng_philox", np.array([9, U64_MAX - 2, 4], np.uint64), (5, 3),
         np.uint64),
        (emit_hlo, "default3_u8_carry", "rng_default", np.array([3, U64_MAX, U64_MAX], np.uint64), (6, 2),
         np.uint8),
        # rng_three_fry: even and odd dimensions (the shape is halved along an even one, else the largest)
        (emit_jax, "threefry_u32_3x5", "rng_three_fry", s, (3, 5), jnp.uint32),
        (emit_jax, "threefry_u32_4x6", "rng_three_fry", big, (4, 6), jnp.uint32),
        (emit_jax, "threefry_u32_5x3x7", "rng_three_fry", big, (5, 3, 7), jnp.uint32),
        (emit_jax, "threefry_u32_7", "rng_three_fry", big, (7,), jnp.uint32),
        (emit_jax, "threefry_u32_scalar", "rng_three_fry", big, (), jnp.uint32),
        (emit_jax, "threefry_u8_5x5", "rng_three_fry", big, (5, 5), jnp.uint8),
        (emit_jax, "threefry_u16_3x4", "rng_three_fry", s, (3, 4), jnp.uint16),
        (emit_jax, "threefry_u64_2x2", "rng_three_fry", s, (2, 2), jnp.uint64),
        (emit_jax, "threefry_u64_5x3", "rng_three_fry", big, (5, 3), jnp.uint64),
        (emit_jax, "threefry_u32_wrap", "rng_three_fry", np.array([11, U64_MAX - 2], np.uint64), (3, 4),
         jnp.uint32),
    ]
    for emit, name, algorithm, state, shape, dtype in cases:
        emit(name, algorithm, state, shape, dtype)


if __name__ == "__main__":
    main()

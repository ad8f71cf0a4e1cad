# Provenance: written for nxsat (tests/data/xla_ops); the fixtures beside it are its output with
# jax/jaxlib 0.10.2 on XLA CPU (x86-64). Needs jax (not a dependency of nxsat; the tests never import it).
"""Regenerate the per-operator HLO fixtures in this folder from JAX and XLA CPU.

    python generate.py [OUTDIR]

Each case NAME gives NAME.hlo and NAME.npz (inputs in0..inN in parameter order, XLA CPU's results
out0..outM flattened depth-first). Most cases are lowered by JAX
(``jax.jit(f).lower(*args).as_text(dialect="hlo")``, before any XLA optimization). Operators and
attribute forms JAX never emits (batch-norm-*, logistic, map, fusion, copy, collectives without
sharding annotations, the TopK custom-call, pred-selected conditionals, explicit compare types,
integer power, ...) are written here as HLO text and run by the same XLA CPU (parsed by XLA,
converted to StableHLO, compiled and executed); those .hlo files are that text verbatim.

bf16 and fp8 arrays are stored widened to float32 (exact), since .npz cannot hold them; the
test reads the element type from the module. Denormal f32 values are avoided: XLA CPU flushes
them to zero (FTZ/DAZ), which is a property of the runtime, not of the operators.
"""
from __future__ import annotations

import io
import os
import sys
import zipfile

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax._src.lib import xla_client as xc

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20240602)

f32, f16, f64 = np.float32, np.float16, np.float64
bf16, e4m3, e5m2 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
s8, s16, s32, s64 = np.int8, np.int16, np.int32, np.int64
u8, u16, u32, u64 = np.uint8, np.uint16, np.uint32, np.uint64
nan, inf = np.nan, np.inf
NEG_NAN = float(np.array(0xFFC00000, np.uint32).view(np.float32))
# A quiet NaN with a payload (bitcast must keep its bits).
NAN_PAYLOAD = float(np.array(0x7FC01234, np.uint32).view(np.float32))

# Values where elementwise semantics are subtle: NaN (both signs), infinities, signed zeros,
# halves (rounding), values near overflow of exp and of f32, small normals (not denormals).
SPECIAL = [nan, NEG_NAN, inf, -inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.1, -0.3,
           3.7, -3.7, 1e-3, -2e-4, 7.0, -9.0, 20.0, -20.0, 60.0, -60.0, 88.0, -87.0, 100.0, 1e4,
           -1e6, 3e38, -3e38, 1e-30]
# The operand grid of binary operators: every pair of these values.
GRID = [nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.0, -3.5, 0.7, 1e30, -1e-20, 5.25]

NAMES: list[str] = []


# --- writing -------------------------------------------------------------------------------------

def storable(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype in (np.dtype(bf16), np.dtype(e4m3), np.dtype(e5m2)):
        return a.astype(np.float32)  # exact widening; the test converts back by the module's types
    return a


def write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Deterministic .npz: fixed timestamps, keys in order, so regenerating gives the same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(storable(value), order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, member.getvalue())
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def save(name: str, text: str, args, outs) -> None:
    assert name not in NAMES, name
    NAMES.append(name)
    with open(os.path.join(OUT, name + ".hlo"), "w") as f:
        f.write(text)
    arrays = {f"in{i}": np.asarray(a) for i, a in enumerate(args)}
    arrays.update({f"out{i}": np.asarray(o) for i, o in enumerate(outs)})
    write_npz(os.path.join(OUT, name + ".npz"), arrays)


def emit(name: str, fn, args, x64: bool = False) -> None:
    """Lower ``fn`` with JAX; the reference is XLA CPU's result of the same jit."""
    jitted = jax.jit(fn, keep_unused=True)  # every input stays a parameter, used or not
    with jax.enable_x64(x64):
        text = jitted.lower(*args).as_text(dialect="hlo")
        outs = jax.tree_util.tree_leaves(jitted(*args))
    save(name, text, args, outs)


def run_hlo(text: str, args) -> list[np.ndarray]:
    """Run HLO text on XLA CPU: XLA parses it, converts it to StableHLO, compiles and executes."""
    module = xc.hlo.hlo_module_from_text(text)
    stablehlo = xc._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    devices = jax.devices("cpu")[:1]
    exe = devices[0].client.compile_and_load(stablehlo, xc.DeviceList(tuple(devices)), xc.CompileOptions())
    with jax.enable_x64(True):  # keep 64-bit inputs 64-bit on the way in
        bufs = [jax.device_put(np.asarray(a), devices[0]) for a in args]
    return [np.asarray(o) for o in exe.execute(bufs)]


def emit_hlo(name: str, text: str, args, reference_text: str | None = None) -> None:
    """A hand-written module; ``reference_text`` (same semantics) runs instead when XLA's
    HLO-to-StableHLO converter cannot take the stored text."""
    text = text.strip() + "\n"
    save(name, text, args, run_hlo(reference_text or text, args))


# --- inputs --------------------------------------------------------------------------------------

def rand(*shape, dtype=f32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def ints(lo, hi, *shape, dtype=s32):
    return rng.integers(lo, hi, shape).astype(dtype)


def special(dtype=f32, extra: int = 30, scale: float = 3.0):
    """SPECIAL followed by random values, as a (4, n) array."""
    vals = np.concatenate([np.array(SPECIAL, np.float64), rng.standard_normal(extra) * scale])
    vals = vals[: (len(vals) // 4) * 4]
    with np.errstate(over="ignore"):
        return vals.astype(np.float32).astype(dtype).reshape(4, -1)


def grid(values, dtype):
    a = np.array(values, np.float64)
    x, y = np.meshgrid(a, a, indexing="ij")
    with np.errstate(over="ignore"):
        return x.astype(dtype), y.astype(dtype)


def int_grid(dtype):
    info = np.iinfo(dtype)
    bits = info.bits
    vals = [0, 1, 2, 3, 7, bits - 1, bits, bits + 1, 100, info.max, info.max - 1]
    if info.min < 0:
        vals += [-1, -2, -7, -100, info.min, info.min + 1]
    else:
        vals += [info.max // 2, info.max // 2 + 1, 200]
    vals = [v for v in dict.fromkeys(vals) if info.min <= v <= info.max]
    a = np.array(vals, dtype=object)
    x, y = np.meshgrid(a, a, indexing="ij")
    return x.astype(dtype), y.astype(dtype)


# --- cases: elementwise --------------------------------------------------------------------------

UNARY_FLOAT = {
    "exp": lax.exp, "expm1": lax.expm1, "log": lax.log, "log1p": lax.log1p, "sqrt": lax.sqrt,
    "rsqrt": lax.rsqrt, "cbrt": lax.cbrt, "tanh": lax.tanh, "sin": lax.sin, "cos": lax.cos,
    "tan": lax.tan, "erf": lax.erf, "floor": lax.floor, "ceil": lax.ceil,
    "round_afz": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
    "round_even": lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN),
    "sign": lax.sign, "abs": lax.abs, "neg": lax.neg, "is_finite": lax.is_finite,
}


def unary_cases() -> None:
    for name, fn in UNARY_FLOAT.items():
        emit(f"unary_{name}_f32", fn, [special()])
    for name in ("exp", "tanh", "sqrt", "rsqrt", "sin", "floor", "round_even", "is_finite", "log1p"):
        emit(f"unary_{name}_bf16", UNARY_FLOAT[name], [special(bf16)])
    for name in ("exp", "log", "cos", "round_afz", "sign", "erf"):
        emit(f"unary_{name}_f16", UNARY_FLOAT[name], [special(f16, scale=2.0)])
    for name in ("exp", "log1p", "sin", "tanh", "cbrt", "expm1"):
        emit(f"unary_{name}_f64", UNARY_FLOAT[name], [special(f64)], x64=True)
    # logistic: JAX spells it 1/(1+exp(-x)); the HLO opcode itself only comes from other producers.
    for t, dtype in (("f32", f32), ("bf16", bf16)):
        emit_hlo(f"unary_logistic_{t}", f"""
HloModule logistic_{t}
ENTRY main {{
  x = {t}[4,16] parameter(0)
  ROOT y = {t}[4,16] logistic(x)
}}""", [special(dtype)])
    # Integer unary operators on the extremes of each type.
    for t in (s8, s16, s32, u8, u32):
        info = np.iinfo(t)
        x = np.array(sorted({0, 1, 2, 3, 5, 100 % (info.max + 1), info.max, info.max - 1, info.min, info.min + 1,
                             info.max // 3, -1 % (info.max + 1) if info.min == 0 else -1, -2 if info.min else 7,
                             -77 if info.min else 77}), dtype=object).astype(t)
        name = np.dtype(t).name.replace("int", "s").replace("us", "u")
        if info.min < 0:
            emit(f"unary_int_{name}", lambda x: (lax.abs(x), lax.neg(x), lax.sign(x), lax.bitwise_not(x),
                                                 lax.population_count(x), lax.clz(x)), [x])
        else:
            emit(f"unary_int_{name}", lambda x: (lax.bitwise_not(x), lax.population_count(x), lax.clz(x)), [x])
    x = np.array([0, 1, -1, 2**62, -(2**63), 2**63 - 1, 12345678901234, -3], s64)
    emit("unary_int_s64", lambda x: (lax.abs(x), lax.neg(x), lax.sign(x), lax.bitwise_not(x),
                                     lax.population_count(x), lax.clz(x)), [x], x64=True)
    x = np.array([0, 1, 2**63, 2**64 - 1, 2**32, 12345678901234, 7], u64)
    emit("unary_int_u64", lambda x: (lax.bitwise_not(x), lax.population_count(x), lax.clz(x)), [x], x64=True)
    emit("unary_not_pred", lambda p: lax.bitwise_not(p), [np.array([True, False, True])])


BINARY_FLOAT = {
    "add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "rem": lax.rem,
    "max": lax.max, "min": lax.min, "pow": lax.pow, "atan2": lax.atan2,
}


def binary_cases() -> None:
    for name, fn in BINARY_FLOAT.items():
        emit(f"binary_{name}_f32", fn, list(grid(GRID, f32)))
    for name in ("add", "mul", "div", "max", "pow", "atan2", "rem"):
        emit(f"binary_{name}_bf16", BINARY_FLOAT[name], list(grid(GRID, bf16)))
    for name in ("add", "div", "pow", "min"):
        emit(f"binary_{name}_f16", BINARY_FLOAT[name], list(grid(GRID, f16)))
    for name in ("div", "pow", "atan2", "rem"):
        emit(f"binary_{name}_f64", BINARY_FLOAT[name], list(grid(GRID, f64)), x64=True)
    # pow with an integer exponent: JAX converts the exponent to the base's type.
    emit("binary_pow_f32_int_exponent", lax.pow,
         [np.array([2, -2, 0.5, -0.5, 0, -0.0, 3, -3, 10, inf, nan, 1], f32),
          np.array([3, 3, -2, -3, -1, -1, 0, 2, 40, -1, 0, 1000000], s32)])

    def int_ops(x, y):
        return (lax.add(x, y), lax.sub(x, y), lax.mul(x, y), lax.div(x, y), lax.rem(x, y), lax.max(x, y),
                lax.min(x, y), lax.bitwise_and(x, y), lax.bitwise_or(x, y), lax.bitwise_xor(x, y))

    def shifts(x, y):
        return lax.shift_left(x, y), lax.shift_right_logical(x, y), lax.shift_right_arithmetic(x, y)

    def compares(x, y):
        return (lax.eq(x, y), lax.ne(x, y), lax.lt(x, y), lax.le(x, y), lax.gt(x, y), lax.ge(x, y))

    for t, name in ((s8, "s8"), (u8, "u8"), (s16, "s16"), (u16, "u16"), (s32, "s32"), (u32, "u32")):
        emit(f"binary_int_{name}", int_ops, list(int_grid(t)))
        emit(f"shift_{name}", shifts, list(int_grid(t)))
        emit(f"compare_{name}", compares, list(int_grid(t)))
    for t, name in ((s64, "s64"), (u64, "u64")):
        emit(f"binary_int_{name}", int_ops, list(int_grid(t)), x64=True)
        emit(f"shift_{name}", shifts, list(int_grid(t)), x64=True)
        emit(f"compare_{name}", compares, list(int_grid(t)), x64=True)
    for t, name in ((f32, "f32"), (bf16, "bf16"), (f16, "f16")):
        emit(f"compare_{name}", compares, list(grid(GRID, t)))
    p, q = np.meshgrid(np.array([False, True]), np.array([False, True]), indexing="ij")
    emit("logic_pred", lambda p, q: (lax.bitwise_and(p, q), lax.bitwise_or(p, q), lax.bitwise_xor(p, q),
                                     lax.eq(p, q), lax.lt(p, q), lax.max(p, q)), [p, q])

    # Integer power (HLO power on integers; JAX only offers integer_pow with a static exponent).
    small_x = np.array([[0, 1, -1, 2, -2, 3, -3, 5, 7, -7, 46341, 65536, 2**31 - 1, -(2**31)]] * 14, s32)
    small_y = small_x.T.copy()
    small_y[small_y > 40] = 31
    small_y[small_y < -40] = -5
    for t, xs, ys in (("s32", small_x, small_y), ("u8", small_x.astype(u8), np.abs(small_y).astype(u8))):
        emit_hlo(f"binary_pow_{t}", f"""
HloModule pow_{t}
ENTRY main {{
  x = {t}[14,14] parameter(0)
  y = {t}[14,14] parameter(1)
  ROOT p = {t}[14,14] power(x, y)
}}""", [xs, ys])
    emit("integer_pow_static", lambda x: (lax.integer_pow(x, 3), lax.integer_pow(x, -2)),
         [np.array([0.5, -2, 3, 1e13, -0.0, 7], f32)])

    # Compare with an explicit comparison type, all six directions.
    directions = ("EQ", "NE", "LT", "LE", "GT", "GE")
    cases = (("totalorder_f32", "f32", "TOTALORDER",
              grid([nan, NEG_NAN, inf, -inf, 0.0, -0.0, 1.0, -1.0, 3e38, 1e-30], f32)),
             ("totalorder_bf16", "bf16", "TOTALORDER", grid([nan, NEG_NAN, inf, -inf, 0.0, -0.0, 1.0, -2.0], bf16)),
             ("float_f32", "f32", "FLOAT", grid([nan, NEG_NAN, inf, -inf, 0.0, -0.0, 1.0, -1.0], f32)),
             ("signed_s32", "s32", "SIGNED", int_grid(s32)),
             ("unsigned_u32", "u32", "UNSIGNED", int_grid(u32)))
    for case, t, kind, (a, b) in cases:
        shape = ",".join(map(str, a.shape))
        lines = "\n".join(f"  {d.lower()} = pred[{shape}] compare(a, b), direction={d}, type={kind}"
                          for d in directions)
        emit_hlo(f"compare_{case}", f"""
HloModule compare_{case}
ENTRY main {{
  a = {t}[{shape}] parameter(0)
  b = {t}[{shape}] parameter(1)
{lines}
  ROOT t = ({", ".join([f"pred[{shape}]"] * 6)}) tuple({", ".join(d.lower() for d in directions)})
}}""", [a, b])


def select_clamp_cases() -> None:
    x, y = special(), special()[::-1].copy()
    emit("select_f32", lambda p, a, b: lax.select(p, a, b), [x > y, x, y])
    emit("select_scalar_pred", lambda p, a, b: (lax.select_n(p, a, b),),
         [np.bool_(True), rand(3, 4), rand(3, 4)])
    emit("select_n_s32", lambda i, a, b, c: lax.select_n(i, a, b, c),
         [ints(0, 3, 4, 5), ints(-9, 9, 4, 5), ints(-9, 9, 4, 5), ints(-9, 9, 4, 5)])
    emit("select_bf16", lambda p, a, b: lax.select(p, a, b), [x < 0, x.astype(bf16), y.astype(bf16)])
    emit("clamp_scalar_bounds", lambda x: lax.clamp(f32(-1.5), x, f32(2.0)), [special()])
    lo = np.array([0, 0, nan, 0, 2, -inf, 1, -1], f32)
    hi = np.array([1, 1, 1, nan, 1, inf, 1, -2], f32)
    xx = np.array([0.5, nan, 0.5, 0.5, 1.5, 3.0, -5, 0.0], f32)
    emit("clamp_array_bounds", lambda lo, x, hi: lax.clamp(lo, x, hi), [lo, xx, hi])
    emit("clamp_s32", lambda x: lax.clamp(s32(-100), x, s32(2**30)), [int_grid(s32)[0]])
    emit("clamp_u8", lambda lo, x, hi: lax.clamp(lo, x, hi),
         [np.array([0, 10, 200, 5], u8), np.array([255, 3, 100, 7], u8), np.array([100, 20, 100, 9], u8)])
    emit("clamp_bf16", lambda x: lax.clamp(bf16(-1.0), x, bf16(1.0)), [special(bf16)])


# --- conversions ---------------------------------------------------------------------------------

TO_INT = [nan, NEG_NAN, inf, -inf, 0.0, -0.0, 0.4, 0.5, 0.6, -0.5, -0.9999, 1.5, -1.5, 2.5, 127.5, 128.0,
          -128.7, -129.0, 255.9, 256.0, 32767.5, -32769.0, 65535.5, 65536.0, 2147483520.0, 2147483648.0,
          -2147483648.0, -2147483904.0, 4.3e9, -4.3e9, 1e19, 2e19, -1e19, 1e30, 3e38, -3e38]
# Rounding corners of the narrow float types (ties to even, overflow to inf or NaN, subnormals).
TO_NARROW = [nan, NEG_NAN, inf, -inf, 0.0, -0.0, 1.0, -1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20,
             -(1 + 2**-8), 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.0, 65520.0, 1e5, 448.0, 464.0, 465.0,
             480.0, 500.0, 57344.0, 61439.0, 61440.0, 1e-5, 6e-8, 2e-8, 3e-5, 2**-9, 2**-10, 3 * 2**-10,
             2**-16, 2**-17, 0.3, -0.3, 3.14159265, 3e38, -3e38, 1.7e38, 3.3895e38]


def conversion_cases() -> None:
    x = np.array(TO_INT, f32)
    emit("convert_f32_to_ints", lambda x: tuple(lax.convert_element_type(x, t) for t in (s8, u8, s16, u16, s32, u32)),
         [x])
    emit("convert_f32_to_64bit_ints", lambda x: (lax.convert_element_type(x, s64), lax.convert_element_type(x, u64)),
         [x], x64=True)
    emit("convert_f64_to_ints", lambda x: (lax.convert_element_type(x, s32), lax.convert_element_type(x, s64),
                                           lax.convert_element_type(x, u64)),
         [np.array(TO_INT + [9.3e18, 9.2233720368547758e18, -9.2233720368547758e18, 1.8446744073709552e19], f64)],
         x64=True)
    emit("convert_bf16_to_ints", lambda x: (lax.convert_element_type(x, s8), lax.convert_element_type(x, s32),
                                            lax.convert_element_type(x, u16)), [x.astype(bf16)])
    with np.errstate(over="ignore"):
        emit("convert_f16_to_ints", lambda x: (lax.convert_element_type(x, s8), lax.convert_element_type(x, u8),
                                               lax.convert_element_type(x, s32)), [x.astype(f16)])
    n = np.array(TO_NARROW, f32)
    emit("convert_f32_to_narrow_floats", lambda x: tuple(lax.convert_element_type(x, t) for t in (bf16, f16, e4m3, e5m2)),
         [n])
    emit("convert_f64_to_narrow_floats",
         lambda x: tuple(lax.convert_element_type(x, t) for t in (f32, bf16, f16)),
         [np.array(TO_NARROW + [1 + 2**-8 + 2**-30, 1 + 2**-24 + 2**-40, 1e39, -1e300, 1e-50], f64)], x64=True)
    emit("convert_f32_to_f64", lambda x: lax.convert_element_type(x, f64), [n], x64=True)
    with np.errstate(over="ignore"):
        emit("convert_bf16_to_floats", lambda x: tuple(lax.convert_element_type(x, t) for t in (f32, f16, e4m3, e5m2)),
             [n.astype(bf16)])
        emit("convert_f16_to_floats", lambda x: tuple(lax.convert_element_type(x, t) for t in (f32, bf16, e4m3, e5m2)),
             [n.astype(f16)])
    e4 = np.array(TO_NARROW, f32).astype(e4m3)
    emit("convert_f8e4m3fn_to_floats", lambda x: tuple(lax.convert_element_type(x, t) for t in (f32, bf16, f16, e5m2)),
         [e4])
    e5 = np.array(TO_NARROW, f32).astype(e5m2)
    emit("convert_f8e5m2_to_floats", lambda x: tuple(lax.convert_element_type(x, t) for t in (f32, bf16, f16, e4m3)),
         [e5])
    emit("convert_f8_to_ints", lambda a, b: (lax.convert_element_type(a, s8), lax.convert_element_type(b, s32),
                                             lax.convert_element_type(b, u8)), [e4, e5])
    big = np.array([0, 1, -1, 255, 256, 257, 259, 2**24, 2**24 + 1, 2**24 + 3, 2**31 - 1, -(2**31), 65504, 65520,
                    70000, -70000, 448, 449, 464, 480, 100000, 123456789], s32)
    emit("convert_s32_to_floats", lambda x: tuple(lax.convert_element_type(x, t) for t in (f32, bf16, f16, e4m3, e5m2)),
         [big])
    emit("convert_u32_to_floats", lambda x: (lax.convert_element_type(x, f32), lax.convert_element_type(x, bf16)),
         [np.array([0, 1, 2**32 - 1, 2**31, 2**31 + 1, 2**24 + 1, 4294967040, 4294967168], u32)])
    w = np.array([0, 1, -1, 2**63 - 1, -(2**63), 2**53 + 1, 2**24 + 1, -(2**40) - 3, 9007199254740993], s64)
    emit("convert_s64_to_floats", lambda x: (lax.convert_element_type(x, f32), lax.convert_element_type(x, f64),
                                             lax.convert_element_type(x, bf16)), [w], x64=True)
    emit("convert_u64_to_floats", lambda x: (lax.convert_element_type(x, f32), lax.convert_element_type(x, f64)),
         [np.array([0, 1, 2**64 - 1, 2**63, 2**53 + 1, 18446744073709549568], u64)], x64=True)
    ii = np.array([0, 1, -1, 127, 128, 255, 256, -128, -129, 32767, 32768, 65535, 65536, 2**31 - 1, -(2**31)], s32)
    emit("convert_s32_to_ints", lambda x: tuple(lax.convert_element_type(x, t) for t in (s8, u8, s16, u16, u32)), [ii])
    emit("convert_s8_to_ints", lambda x: tuple(lax.convert_element_type(x, t) for t in (u8, s16, u16, s32, u32)),
         [np.array([0, 1, -1, 127, -128, -2], s8)])
    emit("convert_u32_to_ints", lambda x: (lax.convert_element_type(x, s32), lax.convert_element_type(x, s8)),
         [np.array([0, 1, 2**31, 2**32 - 1, 255, 256, 2**31 - 1], u32)])
    emit("convert_64bit_to_ints", lambda a, b: (lax.convert_element_type(a, s32), lax.convert_element_type(a, u8),
                                                lax.convert_element_type(b, s8), lax.convert_element_type(b, s64),
                                                lax.convert_element_type(a, u64)),
         [w, np.array([0, 1, 2**64 - 1, 2**63, 255, 2**32 + 5, 7, 8, 9], u64)], x64=True)
    emit("convert_pred_to_numbers", lambda p: tuple(lax.convert_element_type(p, t) for t in (f32, s32, u8, bf16, f16)),
         [np.array([True, False, True, True, False])])
    # JAX spells x.astype(bool) as x != 0; the convert-to-pred opcode is written by hand.
    lines, outs, args, params = [], [], [], []
    for i, (t, a) in enumerate((("f32", np.array([nan, NEG_NAN, inf, -inf, 0.0, -0.0, 0.5, -1e-30, 3.0], f32)),
                                ("s32", np.array([0, 1, -1, 2**31 - 1, -(2**31), 256, 7, 0, 2], s32)),
                                ("bf16", np.array([nan, 0.0, -0.0, 1.0, -inf, 1e-30, 0.0, 2.0, 3.0], f32).astype(bf16)),
                                ("u8", np.array([0, 1, 255, 128, 0, 2, 3, 4, 5], u8)))):
        params.append(f"  x{i} = {t}[9] parameter({i})")
        lines.append(f"  c{i} = pred[9] convert(x{i})")
        outs.append(f"c{i}")
        args.append(a)
    emit_hlo("convert_to_pred", "HloModule convert_to_pred\nENTRY main {\n" + "\n".join(params + lines)
             + f"\n  ROOT t = ({', '.join(['pred[9]'] * 4)}) tuple({', '.join(outs)})\n}}", args)


def bitcast_cases() -> None:
    x = np.array([nan, NEG_NAN, NAN_PAYLOAD, inf, -inf, 0.0, -0.0, 1.0, -2.5, 3e38], f32)
    with np.errstate(over="ignore"):
        x16 = x.astype(f16)
    emit("bitcast_f32_s32_u32", lambda x: (lax.bitcast_convert_type(x, s32), lax.bitcast_convert_type(x, u32)), [x])
    emit("bitcast_s32_to_f32", lambda i: lax.bitcast_convert_type(i, f32),
         [np.array([0, -(2**31), 0x3F800000, 0x7F800000, -8388608, 0x7FC00000, 0x00800000, 0x7F7FFFFF, 12345678],
                   s32)])
    emit("bitcast_f32_to_u8", lambda x: lax.bitcast_convert_type(x, u8), [x])
    emit("bitcast_u8_to_f32", lambda b: lax.bitcast_convert_type(b, f32),
         [np.array([[0, 0, 128, 63], [0, 0, 192, 127], [1, 2, 3, 4], [0, 0, 128, 191]], u8)])
    emit("bitcast_u16_to_f32", lambda b: lax.bitcast_convert_type(b, f32),
         [np.array([[0, 16256], [0, 65408], [4660, 17185]], u16)])
    emit("bitcast_bf16_f16_to_16bit", lambda a, h: (lax.bitcast_convert_type(a, s16), lax.bitcast_convert_type(h, u16),
                                                    lax.bitcast_convert_type(a, f16)),
         [x.astype(bf16), x16])
    emit("bitcast_f32_to_bf16_pairs", lambda x: lax.bitcast_convert_type(x, bf16),
         [np.array([1.0, -2.5, 3.14159, 1e10], f32)])
    emit("bitcast_64bit", lambda a, b: (lax.bitcast_convert_type(a, s32), lax.bitcast_convert_type(a, f64),
                                        lax.bitcast_convert_type(b, u64), lax.bitcast_convert_type(b, u16)),
         [np.array([0, -1, 2**62 + 5, 0x3FF0000000000000, -(2**63)], s64),
          np.array([1.0, -0.0, inf, 1e300, 2.5], f64)], x64=True)
    emit("bitcast_u32_pairs_to_f64", lambda b: lax.bitcast_convert_type(b, f64),
         [np.array([[0, 0x3FF00000], [1, 0x7FF00000], [0, 0x80000000]], u32)], x64=True)
    e4 = np.array([0.0, -0.0, 1.0, 448.0, -448.0, nan, 0.001953125, 2.5], f32).astype(e4m3)
    emit("bitcast_f8", lambda a, b: (lax.bitcast_convert_type(a, u8), lax.bitcast_convert_type(b, e5m2),
                                     lax.bitcast_convert_type(b, e4m3)),
         [e4, np.array([0, 1, 60, 124, 127, 128, 252, 255], u8)])


# --- data movement -------------------------------------------------------------------------------

def shape_cases() -> None:
    emit("iota_variants", lambda: (lax.broadcasted_iota(s32, (3, 5), 1), lax.broadcasted_iota(f32, (2, 3, 4), 0),
                                   lax.iota(bf16, 300), lax.iota(u8, 300), lax.broadcasted_iota(s8, (2, 200), 1),
                                   lax.iota(f16, 2100)), [])
    emit("iota_f8", lambda: (lax.iota(e4m3, 40), lax.iota(e5m2, 40)), [])
    emit("iota_s64", lambda: lax.broadcasted_iota(s64, (2, 4), 1), [], x64=True)
    emit("broadcast_reshape_transpose",
         lambda x, s: (lax.broadcast_in_dim(x, (4, 2, 5, 3), (1, 3)), lax.reshape(x, (3, 2)),
                       lax.transpose(lax.broadcast_in_dim(x, (2, 3, 4), (0, 1)), (2, 0, 1)),
                       lax.broadcast_in_dim(s, (2, 2), ()), lax.reshape(x, (6,), dimensions=(1, 0))),
         [rand(2, 3), np.float32(7.5)])
    emit("transpose_4d_s8", lambda x: lax.transpose(x, (3, 1, 0, 2)), [ints(-100, 100, 2, 3, 4, 5, dtype=s8)])
    emit("slice_strided", lambda x: (lax.slice(x, (1, 0, 5), (7, 6, 6), (2, 3, 1)), x[::-1, 1:5:2, ::-2],
                                     lax.slice(x, (0, 2, 0), (8, 2, 7))), [rand(8, 6, 7)])
    emit("reverse_dims", lambda x: (lax.rev(x, (0, 2)), lax.rev(x, (1,)), lax.rev(x, ())), [ints(-50, 50, 3, 4, 5)])
    emit("concatenate", lambda a, b, c: (lax.concatenate([a, b, c], 1), lax.concatenate([c, a], 1)),
         [rand(2, 3, 4), rand(2, 1, 4), rand(2, 5, 4)])
    emit("concatenate_u8_pred", lambda a, b, p: (lax.concatenate([a, b, a], 0), lax.concatenate([p, ~p], 1)),
         [ints(0, 255, 2, 3, dtype=u8), ints(0, 255, 1, 3, dtype=u8), np.array([[True, False, True]])])
    x = rand(4, 5)
    emit("pad_negative_interior", lambda x: (
        lax.pad(x, f32(-7.0), [(1, 2, 1), (-1, -2, 0)]),
        lax.pad(x, f32(0.5), [(-2, -3, 2), (0, 0, 0)]),
        lax.pad(x, f32(9.0), [(0, 0, 0), (-1, -1, 3)]),
        lax.pad(x, f32(1.0), [(-3, -3, 1), (2, -5, 2)]),
        lax.pad(x, f32(3.0), [(-3, 1, 0), (3, -4, 0)])), [x])
    emit("pad_s32_scalar_operand", lambda x, v: lax.pad(x, v, [(2, 1, 2), (0, 3, 1), (1, -1, 0)]),
         [ints(-9, 9, 2, 3, 2), np.int32(-1)])
    emit("pad_bf16", lambda x: lax.pad(x, bf16(inf), [(1, 1, 1)]), [rand(5, dtype=bf16)])


def dynamic_slice_cases() -> None:
    x = rand(6, 7)
    ds = lambda x, i, j: lax.dynamic_slice(x, (i, j), (3, 4), allow_negative_indices=False)  # noqa: E731
    for name, (i, j) in {"in_range": (1, 2), "clamp_high": (5, 100), "clamp_negative": (-2, -100),
                         "clamp_int_min": (-(2**31), 2**31 - 1)}.items():
        emit(f"dynamic_slice_{name}", ds, [x, np.int32(i), np.int32(j)])
    emit("dynamic_slice_negative_wraps", lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 2)),
         [x, np.int32(-1), np.int32(-3)])
    emit("dynamic_slice_u8_index", lambda x, i: lax.dynamic_slice(x, (i, i), (2, 3), allow_negative_indices=False),
         [x, np.uint8(250)])
    # Unsigned indices are never negative: 0xFFFFFFFF clamps high, not low.
    emit("dynamic_slice_u32_index_huge",
         lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 3), allow_negative_indices=False),
         [x, np.uint32(2**32 - 1), np.uint32(1)])
    emit("dynamic_slice_s8_index", lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 3), allow_negative_indices=False),
         [x, np.int8(-128), np.int8(127)])
    emit("dynamic_update_slice_u32_index_huge",
         lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j), allow_negative_indices=False),
         [x, rand(2, 2), np.uint32(2**32 - 1), np.uint32(2**31)])
    emit("dynamic_slice_s64_index", lambda x, i, j: lax.dynamic_slice(x, (i, j), (2, 3), allow_negative_indices=False),
         [x, np.int64(2**40), np.int64(3)], x64=True)
    u = rand(3, 4)
    dus = lambda x, u, i, j: lax.dynamic_update_slice(x, u, (i, j), allow_negative_indices=False)  # noqa: E731
    for name, (i, j) in {"in_range": (2, 1), "clamp_high": (4, 50), "clamp_negative": (-1, 2)}.items():
        emit(f"dynamic_update_slice_{name}", dus, [x, u, np.int32(i), np.int32(j)])
    emit("dynamic_update_slice_s8_full", lambda x, u, i: lax.dynamic_update_slice(x, u, (i, i, i)),
         [ints(-5, 5, 2, 3, 2, dtype=s8), ints(50, 60, 2, 3, 2, dtype=s8), np.int32(1)])


def gather_cases() -> None:
    GD = lax.GatherDimensionNumbers
    raw = lax.GatherScatterMode.PROMISE_IN_BOUNDS  # no masking by JAX: XLA's own clamping applies
    table = rand(6, 4)
    emit("gather_rows_clamped", lambda t, i: lax.gather(t, i, GD((1,), (0,), (0,)), (1, 4), mode=raw),
         [table, np.array([[0], [5], [7], [-1], [2], [-100]], s32)])
    emit("gather_window_2d_clamped", lambda t, i: lax.gather(t, i, GD((1, 2), (), (0, 1)), (2, 3), mode=raw),
         [rand(5, 7), np.array([[0, 0], [3, 5], [4, 6], [-1, 2]], s32)])
    emit("gather_permuted_index_map", lambda t, i: lax.gather(t, i, GD((2,), (0, 2), (2, 0)), (1, 5, 1), mode=raw),
         [rand(4, 5, 6), np.array([[[5, 3], [9, -2], [2, 1]], [[1, 2], [4, 3], [3, 0]]], s32)])
    emit("gather_batching_dims",
         lambda t, i: lax.gather(t, i, GD(offset_dims=(2,), collapsed_slice_dims=(1,), start_index_map=(1,),
                                          operand_batching_dims=(0,), start_indices_batching_dims=(0,)),
                                 (1, 1, 4), mode=raw),
         [rand(3, 5, 4), np.array([[[4], [0]], [[2], [9]], [[1], [1]]], s32)])
    emit("gather_batching_dims_not_leading",
         lambda t, i: lax.gather(t, i, GD(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,),
                                          operand_batching_dims=(2,), start_indices_batching_dims=(1,)),
                                 (1, 3, 1), mode=raw),
         [rand(6, 3, 2), np.array([[[5], [0]], [[1], [9]], [[3], [3]], [[-4], [2]]], s32)])
    emit("gather_offset_dims_middle", lambda t, i: lax.gather(t, i, GD((0, 2), (1,), (1,)), (3, 1, 2), mode=raw),
         [rand(3, 6, 2), np.array([[1], [5], [0], [3]], s32)])
    emit("gather_scalar_indices", lambda t, i: lax.gather(t, i, GD((0,), (1,), (1,)), (4, 1), mode=raw),
         [rand(4, 6), np.array([3], s32)])
    emit("gather_take_fill", lambda t, i: jnp.take(t, i, axis=0, mode="fill", fill_value=-1.0),
         [table, np.array([[0, 5], [6, -1]], s32)])
    emit("gather_take_along_axis", lambda t, i: jnp.take_along_axis(t, i, axis=1),
         [rand(3, 5), np.array([[0, 4], [2, 2], [1, 3]], s32)])
    emit("gather_embedding_bf16", lambda t, i: jnp.take(t, i, axis=0, mode="clip"),
         [rand(10, 3, dtype=bf16), np.array([[1, 9], [12, -3]], s32)])
    emit("gather_u8_indices", lambda t, i: lax.gather(t, i, GD((1,), (0,), (0,)), (1, 3), mode=raw),
         [ints(-1000, 1000, 5, 3), np.array([[4], [200], [0]], u8)])
    emit("gather_u32_indices_huge", lambda t, i: lax.gather(t, i, GD((1,), (0,), (0,)), (1, 3), mode=raw),
         [ints(-1000, 1000, 5, 3), np.array([[4], [2**32 - 1], [2**31], [1]], u32)])
    # index_vector_dim=0 (JAX always puts it last).
    emit_hlo("gather_index_vector_dim_0", """
HloModule gather_index_vector_dim_0
ENTRY main {
  t = f32[5,6] parameter(0)
  i = s32[2,3] parameter(1)
  ROOT g = f32[3,2] gather(t, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0,1}, index_vector_dim=0, slice_sizes={1,2}
}""", [rand(5, 6), np.array([[0, 4, 2], [1, 5, 7]], s32)])


def scatter_cases() -> None:
    SD = lax.ScatterDimensionNumbers
    raw = lax.GatherScatterMode.PROMISE_IN_BOUNDS
    rows = SD(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,))
    # Duplicated indices; integer-valued floats so the order of accumulation does not matter.
    dup = np.array([[1], [3], [1], [5], [1]], s32)
    upd = ints(-8, 8, 5, 3).astype(f32)
    emit("scatter_add_duplicates", lambda x, i, u: lax.scatter_add(x, i, u, rows, mode=raw),
         [ints(-4, 4, 6, 3).astype(f32), dup, upd])
    emit("scatter_mul_duplicates", lambda x, i, u: lax.scatter_mul(x, i, u, rows, mode=raw),
         [ints(1, 4, 6, 3).astype(f32), dup, ints(-3, 4, 5, 3).astype(f32)])
    emit("scatter_min_max_nan", lambda x, i, u: (lax.scatter_min(x, i, u, rows, mode=raw),
                                                 lax.scatter_max(x, i, u, rows, mode=raw)),
         [rand(6, 3), dup, np.where(rng.random((5, 3)) < 0.2, nan, rand(5, 3)).astype(f32)])
    # Out-of-range (and negative) indices: XLA skips the whole update window.
    emit("scatter_set_out_of_range", lambda x, i, u: lax.scatter(x, i, u, rows, mode=raw),
         [rand(6, 3), np.array([[0], [7], [-1], [4], [6]], s32), rand(5, 3)])
    win = SD(update_window_dims=(1, 2), inserted_window_dims=(), scatter_dims_to_operand_dims=(0, 1))
    emit("scatter_window_partly_out", lambda x, i, u: lax.scatter_add(x, i, u, win, mode=raw),
         [np.zeros((5, 6), f32), np.array([[1, 1], [4, 4], [3, 5], [0, 4], [-1, 0]], s32),
          ints(1, 9, 5, 2, 2).astype(f32)])
    emit("scatter_points_set", lambda x, r, c, v: x.at[r, c].set(v, unique_indices=True),
         [rand(4, 5), np.array([0, 3, 1, 2], s32), np.array([4, 0, 1, 3], s32), rand(4)])
    cols = SD(update_window_dims=(0,), inserted_window_dims=(1,), scatter_dims_to_operand_dims=(1,))
    emit("scatter_columns_window_first", lambda x, i, u: lax.scatter_add(x, i, u, cols, mode=raw),
         [ints(0, 5, 3, 6), np.array([[5], [0], [5]], s32), ints(0, 100, 3, 3)])
    emit("scatter_batching_dims",
         lambda x, i, u: lax.scatter_add(x, i, u, SD(update_window_dims=(2,), inserted_window_dims=(1,),
                                                      scatter_dims_to_operand_dims=(1,), operand_batching_dims=(0,),
                                                      scatter_indices_batching_dims=(0,)), mode=raw),
         [np.zeros((3, 5, 2), f32), np.array([[[4], [0], [4]], [[2], [9], [1]], [[1], [1], [3]]], s32),
          ints(1, 5, 3, 3, 2).astype(f32)])
    emit("scatter_batching_dims_not_leading",
         lambda x, i, u: lax.scatter_add(x, i, u, SD(update_window_dims=(1,), inserted_window_dims=(0,),
                                                      scatter_dims_to_operand_dims=(0,), operand_batching_dims=(2,),
                                                      scatter_indices_batching_dims=(1,)), mode=raw),
         [np.zeros((6, 3, 2), f32), np.array([[[5], [0]], [[1], [9]], [[5], [3]], [[-4], [2]]], s32),
          ints(1, 5, 4, 3, 2).astype(f32)])
    emit("scatter_s32_wraps", lambda x, i, u: lax.scatter_add(x, i, u, rows, mode=raw),
         [np.full((4, 2), 2**31 - 5, s32), np.array([[0], [0], [3]], s32), np.full((3, 2), 3, s32)])
    emit("scatter_u32_indices_huge", lambda x, i, u: lax.scatter_add(x, i, u, rows, mode=raw),
         [np.zeros((4, 3), f32), np.array([[2**32 - 1], [2], [2**31], [0]], u32), ints(1, 9, 4, 3).astype(f32)])
    emit("scatter_jnp_at_drop", lambda x, i, u: x.at[i].add(u, mode="drop"),
         [rand(5, 2), np.array([0, 5, -1, 2, -6], s32), rand(5, 2)])
    emit("scatter_apply_bf16", lambda x, i, u: x.at[i].max(u), [rand(5, 3, dtype=bf16), np.array([4, 0, 4], s32),
                                                                rand(3, 3, dtype=bf16)])
    # Two operands scattered together (JAX never emits variadic scatter).
    emit_hlo("scatter_variadic", """
HloModule scatter_variadic
combine {
  a0 = f32[] parameter(0)
  b0 = s32[] parameter(1)
  a1 = f32[] parameter(2)
  b1 = s32[] parameter(3)
  s = f32[] add(a0, a1)
  m = s32[] maximum(b0, b1)
  ROOT t = (f32[], s32[]) tuple(s, m)
}
ENTRY main {
  x = f32[5,2] parameter(0)
  y = s32[5,2] parameter(1)
  i = s32[4,1] parameter(2)
  u = f32[4,2] parameter(3)
  v = s32[4,2] parameter(4)
  ROOT r = (f32[5,2], s32[5,2]) scatter(x, y, i, u, v), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=combine
}""", [ints(-3, 3, 5, 2).astype(f32), ints(-9, 9, 5, 2), np.array([[2], [4], [2], [9]], s32),
       ints(-3, 3, 4, 2).astype(f32), ints(-20, 20, 4, 2)])


# --- reductions ----------------------------------------------------------------------------------

def reduce_cases() -> None:
    x = rand(3, 4, 5)
    emit("reduce_sum_axes", lambda x: (jnp.sum(x, axis=(0, 2)), jnp.sum(x), jnp.sum(x, axis=1)), [x])
    emit("reduce_prod_min_max", lambda x: (jnp.prod(x, axis=1), jnp.min(x, axis=0), jnp.max(x, axis=2)), [x])
    xn = rand(4, 6)
    xn[1, 2] = nan
    xn[2, :] = -inf
    xn[3, 5] = inf
    emit("reduce_min_max_nan", lambda x: (jnp.max(x, axis=1), jnp.min(x, axis=1), jnp.max(x, axis=0)), [xn])
    emit("reduce_and_or_pred", lambda p: (jnp.all(p, axis=1), jnp.any(p, axis=1), jnp.all(p), jnp.any(p, axis=0)),
         [np.array([[True, True, True], [True, False, True], [False, False, False], [False, True, False]])])
    xa = np.array([[1, 3, 3, 2, nan, 3], [0, -0.0, -1, -inf, -inf, 5], [2, 2, 2, 2, 2, 2],
                   [nan, 1, nan, 9, 9, -9]], f32)
    emit("reduce_argmax_argmin", lambda x: (jnp.argmax(x, axis=1), jnp.argmin(x, axis=1), jnp.argmax(x, axis=0),
                                            jnp.argmin(x[:, :4], axis=0)), [xa])
    emit("reduce_argmax_bf16", lambda x: (jnp.argmax(x, axis=1), jnp.argmin(x, axis=1), jnp.max(x, axis=1)),
         [xa.astype(bf16)])
    emit("reduce_argmax_s32", lambda x: (jnp.argmax(x, axis=0), jnp.argmin(x, axis=1)),
         [np.array([[5, -3, 7], [5, 9, -2**31], [2**31 - 1, 0, 7]], s32)])
    emit("reduce_int_wrap", lambda x, y: (jnp.sum(x, axis=0, dtype=s32), jnp.prod(x, axis=1, dtype=s32),
                                          jnp.max(y, axis=1), jnp.min(y, axis=0), jnp.sum(y, axis=1, dtype=u8)),
         [np.array([[2**30, 3, -7], [2**30, 5, 11], [2**30, 1000, 13]], s32), ints(0, 256, 3, 4, dtype=u8)])
    emit("reduce_s64_u64", lambda x, y: (jnp.sum(x, axis=1), jnp.max(y, axis=0)),
         [np.array([[2**62, 2**62, 2**62], [-1, 1, -(2**63)]], s64), np.array([[2**64 - 1, 0], [5, 2**63]], u64)],
         x64=True)
    # bf16: integer-valued so the result does not depend on the order or width of accumulation.
    emit("reduce_bf16", lambda x: (lax.reduce(x, bf16(0), lax.add, (1,)), lax.reduce(x, bf16(-inf), lax.max, (0,)),
                                   lax.reduce(x, bf16(1), lax.mul, (1,))),
         [ints(-4, 5, 3, 4).astype(bf16)])
    emit("reduce_empty_dim", lambda x: (jnp.sum(x, axis=1), jnp.max(x, axis=1, initial=-5.0)),
         [np.zeros((4, 0), f32)])
    emit("reduce_variadic_custom", lambda x, y: lax.reduce((x, y), (f32(0), s32(0)),
                                                           lambda a, b: (a[0] + b[0], a[1] ^ b[1]), (0,)),
         [ints(-9, 9, 5, 3).astype(f32), ints(0, 2**20, 5, 3)])
    emit("reduce_xor_or_u32", lambda x: (lax.reduce(x, u32(0), lax.bitwise_xor, (1,)),
                                         lax.reduce(x, u32(0), lax.bitwise_or, (1,)),
                                         lax.reduce(x, u32(0xFFFFFFFF), lax.bitwise_and, (1,))),
         [ints(0, 2**32, 4, 5, dtype=u32)])
    emit("reduce_f16_mean", lambda x: jnp.mean(x, axis=1), [ints(-6, 7, 3, 8).astype(f16)])


def _argmax_pair(a, b):
    """(value, index) pairs: larger value wins, ties go to the smaller index (order-independent)."""
    take_a = (a[0] > b[0]) | ((a[0] == b[0]) & (a[1] < b[1]))
    return jnp.where(take_a, a[0], b[0]), jnp.where(take_a, a[1], b[1])


def reduce_window_cases() -> None:
    x = rand(3, 8)
    emit("reduce_window_cumulative", lambda x: (jnp.cumsum(x, axis=1), jnp.cumprod(x, axis=0),
                                                lax.cummax(x, axis=1), lax.cummin(x, axis=1, reverse=True)), [x])
    img = rand(2, 7, 6, 3)
    emit("reduce_window_maxpool_same", lambda x: lax.reduce_window(x, -inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
         [img])
    emit("reduce_window_avgpool_padded", lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 2, 1),
                                                                     ((0, 0), (0, 0), (1, 1), (2, 0))) / 9.0,
         [rand(1, 2, 6, 5)])
    emit("reduce_window_dilated", lambda x: (
        lax.reduce_window(x, 0.0, lax.add, (2, 3), (1, 2), ((1, 0), (0, 2)), window_dilation=(2, 1)),
        lax.reduce_window(x, -inf, lax.max, (2, 2), (1, 1), "VALID", base_dilation=(2, 1)),
        lax.reduce_window(x, 0.0, lax.add, (3, 2), (2, 3), ((1, 1), (2, 2)), base_dilation=(2, 3),
                          window_dilation=(1, 2))), [rand(5, 6)])
    emit("reduce_window_s32_max", lambda x: lax.reduce_window(x, s32(-(2**31)), lax.max, (2, 2), (2, 1), "SAME"),
         [ints(-1000, 1000, 5, 4)])
    xv = rand(2, 6)
    xv[0, 1] = xv[0, 2] = 5.0
    emit("reduce_window_variadic_argmax",
         lambda x, i: lax.reduce_window((x, i), (f32(-inf), s32(0)),
                                        _argmax_pair,
                                        (1, 3), (1, 1), "VALID"),
         [xv, np.broadcast_to(np.arange(6, dtype=s32), (2, 6)).copy()])
    emit("reduce_window_pred_and", lambda p: lax.reduce_window(p, True, lax.bitwise_and, (2,), (1,), "VALID"),
         [np.array([True, True, False, True, True, True])])
    emit("reduce_window_bf16_sum", lambda x: lax.reduce_window(x, bf16(0), lax.add, (3,), (2,), ((1, 1),)),
         [ints(-5, 6, 9).astype(bf16)])
    # Gradients: max-pool backward is select-and-scatter; avg-pool backward pads with interior.
    xt = ints(0, 4, 1, 6, 6, 1).astype(f32)  # small integers: ties inside windows
    w3 = rand(1, 3, 3, 1)
    emit("select_and_scatter_maxpool_grad",
         lambda x, w: jax.grad(lambda x: (lax.reduce_window(x, -inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
                                          * w).sum())(x), [xt, w3])
    emit("select_and_scatter_same_padding",
         lambda x, w: jax.grad(lambda x: (lax.reduce_window(x, -inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
                                          * w).sum())(x), [xt, w3])
    emit("select_and_scatter_overlapping_min",
         lambda x, w: jax.grad(lambda x: (lax.reduce_window(x, inf, lax.min, (1, 3, 3, 1), (1, 1, 1, 1), "VALID")
                                          * w[:, :, :, :]).sum())(x), [ints(0, 3, 1, 5, 5, 1).astype(f32), w3])
    # Written directly: a non-zero init, GT (the last maximum wins ties) or GE (the first), a
    # maximum as the scatter, and padding.
    sas = """
HloModule select_and_scatter_{name}
sel {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction={direction}
}}
combine {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] {scatter}(a, b)
}}
ENTRY main {{
  x = f32[5,6] parameter(0)
  s = f32[3,3] parameter(1)
  init = f32[] constant({init})
  ROOT r = f32[5,6] select-and-scatter(x, s, init), window={{size=3x3 stride=2x2 pad=1_1x1_0}}, select=sel, scatter=combine
}}"""
    xs = ints(0, 3, 5, 6).astype(f32)
    for name, direction, scatter, init in (("gt_last_max", "GT", "add", "10"), ("ge_first_max", "GE", "add", "-1"),
                                           ("lt_scatter_max", "LT", "maximum", "0")):
        emit_hlo(f"select_and_scatter_{name}", sas.format(name=name, direction=direction, scatter=scatter, init=init),
                 [xs, ints(1, 9, 3, 3).astype(f32)])
    emit("avgpool_grad", lambda x, w: jax.grad(lambda x: (lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1),
                                                                            "VALID") * w).sum())(x),
         [rand(1, 6, 6, 1), w3])


# --- linear algebra ------------------------------------------------------------------------------

def dot_cases() -> None:
    emit("dot_matmul", lambda a, b: a @ b, [rand(5, 7), rand(7, 3)])
    emit("dot_batch", lambda a, b: jnp.einsum("bij,bjk->bik", a, b), [rand(3, 4, 6), rand(3, 6, 2)])
    emit("dot_batch_not_leading", lambda a, b: lax.dot_general(a, b, (((2,), (0,)), ((1,), (2,)))),
         [rand(4, 2, 5), rand(5, 3, 2)])
    emit("dot_two_contracting", lambda a, b: lax.dot_general(a, b, (((1, 2), (1, 0)), ((), ()))),
         [rand(3, 4, 5), rand(5, 4, 2)])
    emit("dot_vector", lambda a, b: (jnp.dot(a, b), jnp.outer(a, b)), [rand(6), rand(6)])
    emit("dot_bf16_to_f32", lambda a, b: lax.dot(a, b, preferred_element_type=f32),
         [rand(4, 16, dtype=bf16), rand(16, 3, dtype=bf16)])
    emit("dot_bf16_exact", lambda a, b: a @ b, [ints(-8, 8, 4, 6).astype(bf16), ints(-8, 8, 6, 5).astype(bf16)])
    emit("dot_f16_to_f32", lambda a, b: lax.dot(a, b, preferred_element_type=f32),
         [rand(3, 8, dtype=f16), rand(8, 2, dtype=f16)])
    emit("dot_s8_to_s32", lambda a, b: lax.dot(a, b, preferred_element_type=s32),
         [ints(-128, 128, 3, 64, dtype=s8), ints(-128, 128, 64, 4, dtype=s8)])
    emit("dot_u8_to_u32", lambda a, b: lax.dot(a, b, preferred_element_type=u32),
         [ints(0, 256, 2, 16, dtype=u8), ints(0, 256, 16, 3, dtype=u8)])
    emit("dot_s32_wraps", lambda a, b: a @ b, [ints(-2**20, 2**20, 3, 5), ints(-2**20, 2**20, 5, 2)])
    emit("dot_precision_highest", lambda a, b: jnp.matmul(a, b, precision=lax.Precision.HIGHEST),
         [rand(2, 3, 4), rand(2, 4, 5)])
    emit("dot_f64", lambda a, b: a @ b, [rand(3, 4, dtype=f64), rand(4, 2, dtype=f64)], x64=True)


def conv_cases() -> None:
    cg = lax.conv_general_dilated
    emit("conv_nchw_same", lambda x, w: cg(x, w, (1, 1), "SAME"), [rand(2, 3, 6, 6), rand(4, 3, 3, 3)])
    emit("conv_nhwc_strided_asym_pad", lambda x, w: cg(x, w, (2, 1), ((1, 0), (2, 1)),
                                                       dimension_numbers=("NHWC", "HWIO", "NHWC")),
         [rand(1, 7, 6, 2), rand(3, 2, 2, 4)])
    emit("conv_negative_padding", lambda x, w: cg(x, w, (1, 1), ((-1, 0), (0, -2))), [rand(1, 2, 7, 7),
                                                                                      rand(3, 2, 3, 2)])
    emit("conv_lhs_dilation", lambda x, w: cg(x, w, (1, 1), ((1, 1), (2, 1)), lhs_dilation=(2, 3)),
         [rand(1, 2, 4, 3), rand(2, 2, 3, 3)])
    emit("conv_rhs_dilation", lambda x, w: cg(x, w, (1, 2), "VALID", rhs_dilation=(2, 3)),
         [rand(2, 1, 9, 10), rand(2, 1, 3, 2)])
    emit("conv_feature_groups", lambda x, w: cg(x, w, (1, 1), "SAME", feature_group_count=2),
         [rand(1, 4, 5, 5), rand(6, 2, 3, 3)])
    emit("conv_depthwise_nhwc", lambda x, w: cg(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                feature_group_count=3), [rand(1, 6, 6, 3), rand(3, 3, 1, 6)])
    emit("conv_batch_groups", lambda x, w: cg(x, w, (1, 1), "VALID", batch_group_count=2),
         [rand(4, 3, 5, 5), rand(6, 3, 3, 3)])
    emit("conv_weight_grad_grouped", lambda x, w, g: jax.grad(
        lambda w: (cg(x, w, (1, 1), "SAME", feature_group_count=2) * g).sum())(w),
         [rand(3, 4, 5, 5), rand(6, 2, 3, 3), rand(3, 6, 5, 5)])
    emit("conv_weight_grad_strided", lambda x, w, g: jax.grad(
        lambda w: (cg(x, w, (2, 2), ((1, 1), (0, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")) * g).sum())(w),
         [rand(2, 6, 5, 2), rand(3, 3, 2, 4), rand(2, 3, 2, 4)])
    emit("conv_input_grad_strided", lambda x, w, g: jax.grad(
        lambda x: (cg(x, w, (2, 2), ((1, 1), (0, 1)), rhs_dilation=(1, 2)) * g).sum())(x),
         [rand(1, 2, 6, 7), rand(3, 2, 3, 2), rand(1, 3, 3, 3)])
    emit("conv_1d", lambda x, w: cg(x, w, (2,), ((2, 1),), dimension_numbers=("NWC", "WIO", "NWC")),
         [rand(2, 9, 3), rand(4, 3, 2)])
    emit("conv_3d", lambda x, w: cg(x, w, (1, 2, 1), "SAME"), [rand(1, 2, 3, 4, 4), rand(2, 2, 2, 3, 2)])
    emit("conv_odd_layouts", lambda x, w: cg(x, w, (1, 1), ((0, 1), (1, 0)), dimension_numbers=("HCNW", "WOHI", "CWNH")),
         [rand(5, 3, 2, 4), rand(2, 4, 3, 3)])
    emit("conv_bf16_to_f32", lambda x, w: cg(x, w, (1, 1), "SAME", preferred_element_type=f32),
         [rand(1, 4, 5, 5, dtype=bf16), rand(2, 4, 3, 3, dtype=bf16)])
    emit("conv_bf16_exact", lambda x, w: cg(x, w, (1, 1), "VALID"),
         [ints(-4, 5, 1, 2, 4, 4).astype(bf16), ints(-3, 4, 2, 2, 2, 2).astype(bf16)])
    emit("conv_s32", lambda x, w: cg(x, w, (1, 1), "VALID"), [ints(-100, 100, 1, 2, 4, 4), ints(-100, 100, 3, 2, 2, 2)])
    emit("conv_s8_to_s32", lambda x, w: cg(x, w, (1, 1), "SAME", preferred_element_type=s32),
         [ints(-128, 128, 1, 3, 4, 4, dtype=s8), ints(-128, 128, 2, 3, 3, 3, dtype=s8)])
    emit("conv_lhs_dilation_negative_pad", lambda x, w: cg(x, w, (1, 2), ((-1, 2), (1, -1)), lhs_dilation=(2, 1)),
         [rand(1, 2, 5, 6), rand(3, 2, 2, 3)])
    # Window reversal (a flipped kernel), which JAX expresses with rev instead.
    emit_hlo("conv_window_reversal", """
HloModule conv_window_reversal
ENTRY main {
  x = f32[2,2,5,5] parameter(0)
  w = f32[3,2,3,2] parameter(1)
  ROOT c = f32[2,3,3,5] convolution(x, w), window={size=3x2 pad=0_0x1_0 rhs_reversal=1x0}, dim_labels=bf01_oi01->bf01
}""", [rand(2, 2, 5, 5), rand(3, 2, 3, 2)])
    emit("conv_1x1_pointwise", lambda x, w: cg(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")),
         [rand(2, 3, 3, 8), rand(1, 1, 8, 5)])


# --- sorting -------------------------------------------------------------------------------------

def sort_cases() -> None:
    x = np.array([[3, nan, -0.0, 0.0, -inf, 1, inf, NEG_NAN, 1, -2],
                  [5, 4, 3, 2, 1, 0, -1, -2, -3, -4],
                  [2, 2, 2, 1, 1, 1, 3, 3, 0, 0]], f32)
    emit("sort_f32_nan_zeros", lambda x: (jnp.sort(x, axis=1), jnp.sort(x, axis=0)), [x])
    emit("sort_descending", lambda x: jnp.sort(x, axis=1, descending=True), [x])
    emit("argsort_stable", lambda x: (jnp.argsort(x, axis=1, stable=True),
                                      jnp.argsort(x, axis=1, stable=True, descending=True)), [x])
    k1 = np.array([2, 1, 2, 1, 0, 2, 1, 0], s32)
    k2 = np.array([5, 5, 3, 7, 1, 3, 5, 1], s32)
    v = np.arange(8, dtype=f32) * 1.5
    emit("sort_two_keys_payload", lambda a, b, c: lax.sort((a, b, c), num_keys=2, is_stable=True), [k1, k2, v])
    emit("sort_one_key_stable_payload", lambda a, c: lax.sort((a, c), num_keys=1, is_stable=True), [k1, v])
    emit("sort_ints", lambda a, b: (jnp.sort(a), jnp.sort(b, axis=0)),
         [np.array([5, -1, 2**31 - 1, -(2**31), 0, 7, -1], s32), ints(0, 256, 5, 2, dtype=u8)])
    emit("sort_bf16", lambda a: jnp.sort(a), [np.array([1.5, nan, -2, 0.0, -0.0, 300, 301, -inf], f32).astype(bf16)])
    emit("sort_pred", lambda p: jnp.sort(p), [np.array([True, False, True, False, False])])
    emit("sort_s64", lambda a: jnp.sort(a), [np.array([2**62, -(2**63), 5, -5, 2**63 - 1], s64)], x64=True)
    # A descending comparator written directly (JAX reverses an ascending sort instead).
    emit_hlo("sort_gt_comparator_multi", """
HloModule sort_gt_comparator_multi
gt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  ROOT c = pred[] compare(a, b), direction=GT
}
ENTRY main {
  x = f32[2,6] parameter(0)
  y = s32[2,6] parameter(1)
  ROOT s = (f32[2,6], s32[2,6]) sort(x, y), dimensions={1}, is_stable=true, to_apply=gt
}""", [np.array([[3, 1, 4, 1, 5, 9], [2, 7, 1, 8, 2, 8]], f32), np.array([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]], s32)])
    x2 = np.array([[1, 3, 3, 2, 5, 5, 0], [-1, -0.0, 0.0, nan, inf, -inf, 2], [4, 4, 4, 4, 4, 4, 4]], f32)
    emit("topk_ties", lambda x: lax.top_k(x, 3), [x2])
    emit("topk_nan_zeros_full", lambda x: lax.top_k(x, 7), [x2])
    emit("topk_bf16_s32", lambda a, b: (lax.top_k(a, 2), lax.top_k(b, 4)),
         [rand(3, 8, dtype=bf16), np.array([5, -1, 2**31 - 1, -(2**31), 0, 7, -1, 7], s32)])
    emit("topk_axis0", lambda x: lax.top_k(x, 2, axis=0), [rand(5, 3)])
    # The TopK custom-call that older producers (TF, PyTorch/XLA) write.
    emit_hlo("topk_custom_call", """
HloModule topk_custom_call
ENTRY main {
  x = f32[3,7] parameter(0)
  ROOT t = (f32[3,2], s32[3,2]) custom-call(x), custom_call_target="TopK"
}""", [x2])


# --- random --------------------------------------------------------------------------------------

def random_cases() -> None:
    key = np.array([0, 42, 7, 2**32 - 1], u32)
    alg = lax.RandomAlgorithm
    emit("rng_bit_generator_default_u32", lambda k: lax.rng_bit_generator(k, (4, 8)), [key])
    emit("rng_bit_generator_default_u8_u64", lambda k: (lax.rng_bit_generator(k, (3, 5), dtype=u8),
                                                        lax.rng_bit_generator(k, (7,), dtype=u64)), [key], x64=True)
    emit("rng_bit_generator_default_odd_shape", lambda k: lax.rng_bit_generator(k, (3, 3, 3), dtype=u16),
         [np.array([1, 2, 3, 4], u32)])
    emit("rng_bit_generator_three_fry", lambda k: lax.rng_bit_generator(k, (2, 5), algorithm=alg.RNG_THREE_FRY), [key])
    emit("rng_bit_generator_philox", lambda k: lax.rng_bit_generator(k, (2, 5), algorithm=alg.RNG_PHILOX), [key])
    for name, state, out, algorithm, seed in (
            ("philox_u64_state3", "u64[3]", "u32[5,3]", "rng_philox", [1, 2, 2**64 - 1]),
            ("philox_u64_output", "u64[2]", "u64[3,3]", "rng_philox", [2**63, 5]),
            ("three_fry_u64_output", "u64[2]", "u64[5]", "rng_three_fry", [7, 2**40]),
            ("default_u16_odd", "u64[2]", "u16[3,5]", "rng_default", [0, 0])):
        emit_hlo(f"rng_bit_generator_{name}", f"""
HloModule rng_bit_generator_{name}
ENTRY main {{
  s = {state} parameter(0)
  ROOT r = ({state}, {out}) rng-bit-generator(s), algorithm={algorithm}
}}""", [np.array(seed, u64)])
    emit("random_uniform_threefry", lambda k: jax.random.uniform(jax.random.wrap_key_data(k), (3, 4)),
         [np.array([0, 42], u32)])
    # rng (uniform/normal): XLA's values are implementation-defined; the test checks range/moments only.
    emit("rng_uniform_stat", lambda a, b: lax.rng_uniform(a, b, (4096,)), [f32(-2.0), f32(3.0)])
    emit("rng_uniform_s32_stat", lambda a, b: lax.rng_uniform(a, b, (4096,)), [s32(-5), s32(7)])
    emit_hlo("rng_normal_stat", """
HloModule rng_normal_stat
ENTRY main {
  mu = f32[] parameter(0)
  sigma = f32[] parameter(1)
  ROOT r = f32[4096] rng(mu, sigma), distribution=rng_normal
}""", [f32(1.5), f32(0.5)])


# --- control flow and calls ----------------------------------------------------------------------

def control_cases() -> None:
    emit("while_fori_static", lambda x: lax.fori_loop(0, 5, lambda i, c: c * 2.0 + i.astype(f32), x), [rand(3)])
    emit("while_fori_dynamic", lambda x, n: lax.fori_loop(0, n, lambda i, c: c + i, x), [ints(0, 10, 4), s32(7)])
    emit("while_fori_dynamic_zero_trips", lambda x, n: lax.fori_loop(0, n, lambda i, c: c * 3, x),
         [ints(1, 10, 4), s32(-3)])

    def collatz(n):
        def body(s):
            v, k = s
            return jnp.where(v % 2 == 0, v // 2, 3 * v + 1), k + 1
        return lax.while_loop(lambda s: s[0] != 1, body, (n, s32(0)))
    emit("while_data_dependent", collatz, [s32(27)])
    emit("scan_cumulative", lambda xs: lax.scan(lambda c, x: (c * 0.5 + x, c), jnp.zeros(2, f32), xs), [rand(6, 2)])
    emit("cond_true", lambda p, x: lax.cond(p, lambda x: x * 2.0, lambda x: x - 1.0, x), [np.bool_(True), rand(3)])
    emit("cond_false", lambda p, x: lax.cond(p, lambda x: x * 2.0, lambda x: x - 1.0, x), [np.bool_(False), rand(3)])
    branches = [lambda x: x + 1, lambda x: x * x, lambda x: -x]
    for name, i in (("in_range", 1), ("clamped_high", 5), ("clamped_negative", -3)):
        emit(f"switch_{name}", lambda i, x: lax.switch(i, branches, x), [s32(i), rand(2, 2)])
    emit("switch_tuple_operands", lambda i, x, y: lax.switch(i, [lambda x, y: (x + y, y), lambda x, y: (x, x * y)],
                                                             x, y), [s32(1), rand(3), rand(3)])

    @jax.jit
    def inner(x, y):
        return jnp.tanh(x) * y

    @jax.jit
    def middle(x):
        return inner(x, x + 1.0) + inner(x, 2.0 * x)

    emit("call_nested_jit", lambda x: middle(x) * middle(-x), [rand(2, 3)])
    emit("opt_barrier", lambda x, y: lax.optimization_barrier((x * 2.0, y + 1)), [rand(3), ints(0, 9, 2)])
    # Conditional forms JAX does not write: a pred selector, and an s32 index out of range (XLA
    # runs the last branch).
    cond_text = """
HloModule conditional_{name}
on_true {{
  a = f32[3] parameter(0)
  ROOT r = f32[3] multiply(a, a)
}}
on_false {{
  b = (f32[3], s32[]) parameter(0)
  v = f32[3] get-tuple-element(b), index=0
  k = s32[] get-tuple-element(b), index=1
  kf = f32[] convert(k)
  kb = f32[3] broadcast(kf), dimensions={{}}
  ROOT r = f32[3] subtract(v, kb)
}}
ENTRY main {{
  p = {sel} parameter(0)
  x = f32[3] parameter(1)
  n = s32[] parameter(2)
  t = (f32[3], s32[]) tuple(x, n)
  ROOT c = f32[3] conditional(p, x, t), {branches}
}}"""
    for name, sel, branches, p in (
            ("pred_true", "pred[]", "true_computation=on_true, false_computation=on_false", np.bool_(True)),
            ("pred_false", "pred[]", "true_computation=on_true, false_computation=on_false", np.bool_(False)),
            ("index_out_of_range", "s32[]", "branch_computations={on_true, on_false}", s32(7)),
            ("index_negative", "s32[]", "branch_computations={on_true, on_false}", s32(-1))):
        emit_hlo(f"conditional_{name}", cond_text.format(name=name, sel=sel, branches=branches),
                 [p, rand(3), s32(4)])


def hlo_only_cases() -> None:
    emit_hlo("batch_norm_inference", """
HloModule batch_norm_inference
ENTRY main {
  x = f32[2,3,4,2] parameter(0)
  scale = f32[3] parameter(1)
  offset = f32[3] parameter(2)
  mean = f32[3] parameter(3)
  var = f32[3] parameter(4)
  ROOT y = f32[2,3,4,2] batch-norm-inference(x, scale, offset, mean, var), epsilon=0.001, feature_index=1
}""", [rand(2, 3, 4, 2), rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.5])
    emit_hlo("batch_norm_training", """
HloModule batch_norm_training
ENTRY main {
  x = f32[3,4,2,5] parameter(0)
  scale = f32[5] parameter(1)
  offset = f32[5] parameter(2)
  ROOT y = (f32[3,4,2,5], f32[5], f32[5]) batch-norm-training(x, scale, offset), epsilon=1e-05, feature_index=3
}""", [rand(3, 4, 2, 5, scale=2.0) + 1.0, rand(5), rand(5)])
    emit_hlo("batch_norm_grad", """
HloModule batch_norm_grad
ENTRY main {
  x = f32[2,4,3,3] parameter(0)
  scale = f32[4] parameter(1)
  mean = f32[4] parameter(2)
  var = f32[4] parameter(3)
  dy = f32[2,4,3,3] parameter(4)
  ROOT g = (f32[2,4,3,3], f32[4], f32[4]) batch-norm-grad(x, scale, mean, var, dy), epsilon=0.001, feature_index=1
}""", [rand(2, 4, 3, 3), rand(4), rand(4), np.abs(rand(4)) + 0.5, rand(2, 4, 3, 3)])
    emit_hlo("collectives_single_replica", """
HloModule collectives_single_replica
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
max {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT c = s32[] maximum(a, b)
}
ENTRY main {
  x = f32[4,3] parameter(0)
  y = s32[5] parameter(1)
  ar = f32[4,3] all-reduce(x), replica_groups={}, to_apply=add
  ar2 = s32[5] all-reduce(y), channel_id=1, replica_groups={{0}}, use_global_device_ids=true, to_apply=max
  ag = f32[4,3] all-gather(x), dimensions={1}, replica_groups={{0}}
  rs = f32[4,3] reduce-scatter(x), dimensions={0}, replica_groups={{0}}, to_apply=add
  ROOT t = (f32[4,3], s32[5], f32[4,3], f32[4,3]) tuple(ar, ar2, ag, rs)
}""", [rand(4, 3), ints(-9, 9, 5)])
    emit_hlo("collectives_permute_all_to_all_ids", """
HloModule collectives_permute_all_to_all_ids
ENTRY main {
  x = f32[4,3] parameter(0)
  cp = f32[4,3] collective-permute(x), channel_id=1, source_target_pairs={{0,0}}
  a2a = f32[4,3] all-to-all(x), replica_groups={{0}}, dimensions={1}
  r = u32[] replica-id()
  p = u32[] partition-id()
  ROOT t = (f32[4,3], f32[4,3], u32[], u32[]) tuple(cp, a2a, r, p)
}""", [rand(4, 3)])
    emit_hlo("copy_map_fusion", """
HloModule copy_map_fusion
hyp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  aa = f32[] multiply(a, a)
  bb = f32[] multiply(b, b)
  s = f32[] add(aa, bb)
  ROOT r = f32[] sqrt(s)
}
fused {
  p = f32[2,3] parameter(0)
  q = f32[2,3] parameter(1)
  m = f32[2,3] multiply(p, q)
  ROOT e = f32[2,3] exponential(m)
}
ENTRY main {
  x = f32[2,3] parameter(0)
  y = f32[2,3] parameter(1)
  c = f32[2,3] copy(x)
  h = f32[2,3] map(c, y), dimensions={0,1}, to_apply=hyp
  f = f32[2,3] fusion(x, y), kind=kLoop, calls=fused
  inner = (f32[2,3], f32[2,3]) tuple(h, f)
  ROOT t = ((f32[2,3], f32[2,3]), f32[2,3]) tuple(inner, c)
}""", [rand(2, 3), rand(2, 3)])
    # bitcast with the default layout is a reshape; XLA's HLO-to-StableHLO converter refuses the
    # opcode, so XLA runs the same module spelled with reshape.
    bitcast = """
HloModule bitcast_default_layout
ENTRY main {
  x = f32[2,3,4]{2,1,0} parameter(0)
  b = f32[6,4]{1,0} OP(x)
  ROOT n = f32[6,4]{1,0} negate(b)
}"""
    emit_hlo("bitcast_default_layout", bitcast.replace("OP", "bitcast"), [rand(2, 3, 4)],
             reference_text=bitcast.replace("OP", "reshape"))
    emit_hlo("reduce_precision_formats", """
HloModule reduce_precision_formats
ENTRY main {
  x = f32[44] parameter(0)
  a = f32[44] reduce-precision(x), exponent_bits=5, mantissa_bits=10
  b = f32[44] reduce-precision(x), exponent_bits=8, mantissa_bits=7
  c = f32[44] reduce-precision(x), exponent_bits=4, mantissa_bits=3
  d = f32[44] reduce-precision(x), exponent_bits=2, mantissa_bits=1
  ROOT t = (f32[44], f32[44], f32[44], f32[44]) tuple(a, b, c, d)
}""", [np.array(TO_NARROW + [2.0**-14, 2.0**-15], f32)])
    emit("reduce_precision_jax", lambda x: (lax.reduce_precision(x, 5, 10), lax.reduce_precision(x, 8, 7)),
         [np.array(TO_NARROW, f32)])
    emit("reduce_precision_f64", lambda x: lax.reduce_precision(x, 8, 23),
         [np.array(TO_NARROW + [1 + 2**-24, 1 + 2**-24 + 2**-40, 1e39, 1e-39, 1e-50], f64)], x64=True)
    emit("shard_map_collectives", _shard_map_collectives(), [rand(4, 2)])


def _shard_map_collectives():
    """psum/all_gather/psum_scatter on a one-device mesh, as JAX writes them (with sdy annotations)."""
    from jax import shard_map
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("i",))
    return shard_map(lambda x: (lax.psum(x, "i"), lax.all_gather(x, "i", axis=1, tiled=True),
                                lax.psum_scatter(x, "i", scatter_dimension=0, tiled=True)),
                     mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for group in (unary_cases, binary_cases, select_clamp_cases, conversion_cases, bitcast_cases, shape_cases,
                  dynamic_slice_cases, gather_cases, scatter_cases, reduce_cases, reduce_window_cases, dot_cases,
                  conv_cases, sort_cases, random_cases, control_cases, hlo_only_cases):
        group()
    total = sum(os.path.getsize(os.path.join(OUT, f"{n}.{e}")) for n in NAMES for e in ("hlo", "npz"))
    print(f"{len(NAMES)} cases, {total} bytes, jax {jax.__version__}")


if __name__ == "__main__":
    main()

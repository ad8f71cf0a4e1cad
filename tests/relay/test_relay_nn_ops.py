"""nn.* operators lowered from Relay text, checked against numpy computations written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from relay_numpy_ref import ref_conv2d, ref_pool2d, ref_softmax
from relay_testkit import relay

from nxsat.diagnostics import NxsatError

# --- convolution -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stride,pad,dil",
    [((1, 1), (0, 0, 0, 0), (1, 1)), ((2, 2), (1, 1, 1, 1), (1, 1)), ((1, 2), (2, 0, 1, 3), (2, 1))],
)
def test_conv2d_nchw(stride, pad, dil):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 9, 10)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    got = relay.op(
        f"nn.conv2d(%i0, %i1, strides={list(stride)}, padding={list(pad)}, dilation={list(dil)}, "
        "channels=4, kernel_size=[3, 2])",
        x,
        w,
    )
    np.testing.assert_allclose(got, ref_conv2d(x, w, stride, pad, dil), rtol=1e-4, atol=1e-4)


def test_conv2d_padding_forms():
    """Relay padding: one value, one per spatial dimension, or (top, left, bottom, right)."""
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    one = relay.op("nn.conv2d(%i0, %i1, padding=[1])", x, w)
    two = relay.op("nn.conv2d(%i0, %i1, padding=[2, 1])", x, w)
    np.testing.assert_allclose(one, ref_conv2d(x, w, pad=(1, 1, 1, 1)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(two, ref_conv2d(x, w, pad=(2, 1, 2, 1)), rtol=1e-4, atol=1e-4)


def test_grouped_conv2d():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 8, 7, 7)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    got = relay.op("nn.conv2d(%i0, %i1, padding=[1, 1, 1, 1], groups=2, channels=6, kernel_size=[3, 3])", x, w)
    assert got.shape == (1, 6, 7, 7)
    np.testing.assert_allclose(got, ref_conv2d(x, w, pad=(1, 1, 1, 1), groups=2), rtol=1e-4, atol=1e-4)


def test_depthwise_conv2d():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 5, 6, 6)).astype(np.float32)
    w = rng.standard_normal((5, 1, 3, 3)).astype(np.float32)
    got = relay.op(
        "nn.conv2d(%i0, %i1, strides=[2, 2], padding=[1, 1, 1, 1], groups=5, channels=5, kernel_size=[3, 3])",
        x,
        w,
    )
    np.testing.assert_allclose(got, ref_conv2d(x, w, (2, 2), (1, 1, 1, 1), groups=5), rtol=1e-4, atol=1e-4)


def test_depthwise_conv2d_channel_multiplier():
    """TVM's depthwise weight [C, M, kh, kw]: output channel c*M+m uses filter (c, m)."""
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    got = relay.op("nn.conv2d(%i0, %i1, padding=[1, 1, 1, 1], groups=3, channels=6, kernel_size=[3, 3])", x, w)
    want = ref_conv2d(x, w.reshape(6, 1, 3, 3), pad=(1, 1, 1, 1), groups=3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_depthwise_conv2d_nhwc_hwoi_with_multiplier():
    """TensorFlow's depthwise form: NHWC data, HWOI weight [kh, kw, C, M] (O the channel, I the
    multiplier), output channel c*M+m."""
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 5, 5, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 2)).astype(np.float32)
    got = relay.op(
        "nn.conv2d(%i0, %i1, padding=[1, 1, 1, 1], groups=3, channels=6, kernel_size=[3, 3], "
        'data_layout="NHWC", kernel_layout="HWOI")',
        x,
        w,
    )
    w_grouped = w.transpose(2, 3, 0, 1).reshape(6, 1, 3, 3)  # [C, M, kh, kw] -> [C*M, 1, kh, kw]
    want = ref_conv2d(x.transpose(0, 3, 1, 2), w_grouped, pad=(1, 1, 1, 1), groups=3).transpose(0, 2, 3, 1)
    assert got.shape == (1, 5, 5, 6)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv2d_nhwc_hwio():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 8, 9, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 5)).astype(np.float32)
    got = relay.op(
        "nn.conv2d(%i0, %i1, strides=[2, 1], padding=[1, 1, 1, 1], channels=5, kernel_size=[3, 3], "
        'data_layout="NHWC", kernel_layout="HWIO")',
        x,
        w,
    )
    want = ref_conv2d(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), (2, 1), (1, 1, 1, 1)).transpose(0, 2, 3, 1)
    assert got.shape == want.shape == (2, 4, 9, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv2d_nchw_in_nhwc_out():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    got = relay.op('nn.conv2d(%i0, %i1, out_layout="NHWC")', x, w)
    np.testing.assert_allclose(got, ref_conv2d(x, w).transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-4)


def test_conv1d():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 11)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3)).astype(np.float32)
    got = relay.op("nn.conv1d(%i0, %i1, strides=[2], padding=[1, 2], dilation=[2])", x, w)
    want = ref_conv2d(x[:, :, None, :], w[:, :, None, :], (1, 2), (0, 1, 0, 2), (1, 2))[:, :, 0, :]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def ref_conv2d_transpose(x, w, stride, pad, out_pad=(0, 0)):
    """Scatter form: each input pixel adds w * x into the (upsampled) output, then crop padding."""
    n, ci, h, wd = x.shape
    _, co, kh, kw = w.shape  # IOHW
    full = np.zeros((n, co, (h - 1) * stride[0] + kh + out_pad[0], (wd - 1) * stride[1] + kw + out_pad[1]))
    for r in range(h):
        for q in range(wd):
            full[:, :, r * stride[0] : r * stride[0] + kh, q * stride[1] : q * stride[1] + kw] += np.einsum(
                "ni,iokl->nokl", x[:, :, r, q], w
            )
    return full[:, :, pad[0] : full.shape[2] - pad[2], pad[1] : full.shape[3] - pad[3]]


def test_conv2d_transpose():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 3, 4, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    got = relay.op(
        "nn.conv2d_transpose(%i0, %i1, channels=2, kernel_size=[3, 3], strides=[2, 2], "
        "padding=[1, 1, 1, 1], output_padding=[1, 1])",
        x,
        w,
    )
    want = ref_conv2d_transpose(x, w, (2, 2), (1, 1, 1, 1), (1, 1))
    assert got.shape == want.shape == (1, 2, 8, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv2d_checks_channels_and_kernel():
    x = np.zeros((1, 3, 5, 5), np.float32)
    w = np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(NxsatError) as e:
        relay.op("nn.conv2d(%i0, %i1, channels=8, kernel_size=[3, 3])", x, w)
    assert e.value.code == "NCC_EVRF064" and "channels=8" in e.value.message
    with pytest.raises(NxsatError) as e:
        relay.op("nn.conv2d(%i0, %i1, kernel_size=[5, 5])", x, w)
    assert e.value.code == "NCC_EVRF064"
    with pytest.raises(NxsatError) as e:
        relay.op('nn.conv2d(%i0, %i1, data_layout="NCHW4c")', x, w)
    assert e.value.code == "NCC_EVRF001"
    with pytest.raises(NxsatError) as e:
        relay.op("nn.conv2d(%i0, %i1, padding=[1, 1, 1])", x, w)
    assert e.value.code == "NCC_EPRS003"


# --- matrix products -------------------------------------------------------------------------


def test_dense():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)
    w = rng.standard_normal((4, 6)).astype(np.float32)
    got = relay.op("nn.dense(%i0, %i1, units=4)", x, w)
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(NxsatError, match="units=5"):
        relay.op("nn.dense(%i0, %i1, units=5)", x, w)


def test_matmul():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    w = rng.standard_normal((5, 2)).astype(np.float32)
    np.testing.assert_allclose(relay.op("nn.matmul(%i0, %i1)", x, w), x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        relay.op("nn.matmul(%i0, %i1, transpose_b=True)", x, w.T.copy()), x @ w, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("ta,tb", [(False, True), (False, False), (True, False), (True, True)])
def test_batch_matmul(ta, tb):
    rng = np.random.default_rng(1234)
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5, 2)).astype(np.float32)
    xa = a.transpose(0, 2, 1).copy() if ta else a
    xb = b.transpose(0, 2, 1).copy() if tb else b
    got = relay.op(f"nn.batch_matmul(%i0, %i1, transpose_a={ta}, transpose_b={tb})", xa, xb)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_batch_matmul_broadcasts_batch():
    rng = np.random.default_rng(1234)
    a = rng.standard_normal((1, 4, 5)).astype(np.float32)
    b = rng.standard_normal((3, 2, 5)).astype(np.float32)
    got = relay.op('nn.batch_matmul(%i0, %i1, out_dtype="float32")', a, b)
    np.testing.assert_allclose(got, a @ b.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)


def test_bias_add():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(relay.op("nn.bias_add(%i0, %i1)", x, b), x + b[:, None], rtol=1e-6)
    b4 = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(relay.op("nn.bias_add(%i0, %i1, axis=-1)", x, b4), x + b4, rtol=1e-6)


# --- normalization, softmax, activations -----------------------------------------------------


def test_batch_norm_tuple():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    g, b, m = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    v = rng.random(3).astype(np.float32) + 0.5
    out, mean, var = relay.op("nn.batch_norm(%i0, %i1, %i2, %i3, %i4, epsilon=1e-3f)", x, g, b, m, v)
    c = (slice(None), None, None)
    want = (x - m[c]) / np.sqrt(v[c] + 1e-3) * g[c] + b[c]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mean, m)
    np.testing.assert_array_equal(var, v)
    # Projections pick tuple fields; center/scale False drop beta/gamma; axis picks the channel.
    got = relay.op(
        "%0 = nn.batch_norm(%i0, %i1, %i2, %i3, %i4, axis=3, center=False, scale=False);\n  %0.0",
        x.transpose(0, 2, 3, 1).copy(),
        g,
        b,
        m,
        v,
    )
    np.testing.assert_allclose(got, ((x - m[c]) / np.sqrt(v[c] + 1e-5)).transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


def test_layer_norm():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    g, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    got = relay.op("nn.layer_norm(%i0, %i1, %i2, epsilon=1e-5f)", x, g, b)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(got, (x - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-4, atol=1e-5)


def test_group_and_instance_norm():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 6, 3, 3)).astype(np.float32)
    g, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    c = (slice(None), None, None)
    got = relay.op("nn.group_norm(%i0, %i1, %i2, num_groups=3)", x, g, b)
    xg = x.reshape(2, 3, 2, 3, 3)
    norm = (xg - xg.mean((2, 3, 4), keepdims=True)) / np.sqrt(xg.var((2, 3, 4), keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, norm.reshape(x.shape) * g[c] + b[c], rtol=1e-4, atol=1e-5)
    got = relay.op("nn.instance_norm(%i0, %i1, %i2)", x, g, b)
    norm = (x - x.mean((2, 3), keepdims=True)) / np.sqrt(x.var((2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, norm * g[c] + b[c], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_and_log_softmax(axis):
    rng = np.random.default_rng(1234)
    x = (rng.standard_normal((3, 4, 5)) * 4).astype(np.float32)
    np.testing.assert_allclose(relay.op(f"nn.softmax(%i0, axis={axis})", x), ref_softmax(x, axis), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        relay.op(f"nn.log_softmax(%i0, axis={axis})", x), np.log(ref_softmax(x, axis)), rtol=1e-5, atol=1e-5
    )


def test_activations():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    a = rng.random(3).astype(np.float32)
    np.testing.assert_array_equal(relay.op("nn.relu(%i0)", x), np.maximum(x, 0))
    np.testing.assert_allclose(relay.op("nn.leaky_relu(%i0, alpha=0.1f)", x), np.where(x > 0, x, 0.1 * x), rtol=1e-6)
    np.testing.assert_allclose(relay.op("nn.prelu(%i0, %i1, axis=1)", x, a), np.where(x > 0, x, a * x), rtol=1e-6)
    np.testing.assert_allclose(
        relay.op("nn.l2_normalize(%i0, eps=1e-10f, axis=[1])", x),
        x / np.sqrt((x * x).sum(1, keepdims=True)),
        rtol=1e-5,
    )


def test_dropout_is_identity_with_mask():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out, mask = relay.op("nn.dropout(%i0, rate=0.3f)", x)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(mask, np.ones_like(x))
    np.testing.assert_array_equal(relay.op("%0 = nn.dropout(%i0);\n  %0.0", x), x)


def test_batch_flatten():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(relay.op("nn.batch_flatten(%i0)", x), x.reshape(2, 12))


# --- pooling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size,stride,pad,ceil_mode",
    [
        ((2, 2), (2, 2), (0, 0, 0, 0), False),
        ((3, 3), (2, 2), (1, 1, 1, 1), False),
        ((3, 2), (2, 3), (0, 1, 1, 0), True),
        ((2, 2), (3, 3), (0, 0, 0, 0), True),
    ],
)
def test_max_pool2d(size, stride, pad, ceil_mode):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    got = relay.op(
        f"nn.max_pool2d(%i0, pool_size={list(size)}, strides={list(stride)}, padding={list(pad)}, "
        f"ceil_mode={ceil_mode})",
        x,
    )
    want = ref_pool2d(x, size, stride, pad, "max", ceil_mode)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize(
    "size,stride,pad,ceil_mode",
    [
        ((3, 3), (2, 2), (1, 1, 1, 1), False),
        ((3, 3), (2, 2), (1, 1, 1, 1), True),
        ((2, 3), (1, 2), (1, 0, 0, 2), False),
    ],
)
def test_avg_pool2d(size, stride, pad, ceil_mode, include_pad):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 2, 7, 8)).astype(np.float32)
    got = relay.op(
        f"nn.avg_pool2d(%i0, pool_size={list(size)}, strides={list(stride)}, padding={list(pad)}, "
        f"ceil_mode={ceil_mode}, count_include_pad={include_pad})",
        x,
    )
    want = ref_pool2d(x, size, stride, pad, "avg", ceil_mode, include_pad)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pool_nhwc_and_dilation():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 9, 9, 2)).astype(np.float32)
    got = relay.op('nn.max_pool2d(%i0, pool_size=[2, 2], dilation=[2, 2], layout="NHWC")', x)
    want = ref_pool2d(x.transpose(0, 3, 1, 2), (2, 2), (1, 1), (0, 0, 0, 0), "max", dil=(2, 2))
    np.testing.assert_array_equal(got, want.transpose(0, 2, 3, 1).astype(np.float32))


def test_global_and_adaptive_pools():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    np.testing.assert_allclose(relay.op("nn.global_avg_pool2d(%i0)", x), x.mean((2, 3), keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(relay.op("nn.global_max_pool2d(%i0)", x), x.max((2, 3), keepdims=True))
    got = relay.op("nn.adaptive_avg_pool2d(%i0, output_size=[3, 2])", x)
    want = np.zeros((2, 3, 3, 2))
    for i in range(3):
        for j in range(2):
            r0, r1 = (i * 6) // 3, math.ceil((i + 1) * 6 / 3)
            c0, c1 = (j * 5) // 2, math.ceil((j + 1) * 5 / 2)
            want[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean((2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    got = relay.op("nn.adaptive_max_pool2d(%i0, output_size=[4, 3])", x)
    want = np.zeros((2, 3, 4, 3))
    for i in range(4):
        for j in range(3):
            r0, r1 = (i * 6) // 4, math.ceil((i + 1) * 6 / 4)
            c0, c1 = (j * 5) // 3, math.ceil((j + 1) * 5 / 3)
            want[:, :, i, j] = x[:, :, r0:r1, c0:c1].max((2, 3))
    np.testing.assert_array_equal(got, want.astype(np.float32))


# --- padding, upsampling ---------------------------------------------------------------------


def test_pad_modes():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    width = [[0, 1], [2, 0], [1, 2]]
    np.testing.assert_array_equal(
        relay.op(f"nn.pad(%i0, 1.5f, pad_width={width})", x), np.pad(x, width, constant_values=1.5)
    )
    np.testing.assert_array_equal(
        relay.op(f'nn.pad(%i0, 0f, pad_width={width}, pad_mode="edge")', x), np.pad(x, width, mode="edge")
    )
    np.testing.assert_array_equal(
        relay.op(f'nn.pad(%i0, 0f, pad_width={width}, pad_mode="reflect")', x),
        np.pad(x, width, mode="reflect"),
    )


def test_upsampling_nearest():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    got = relay.op("nn.upsampling(%i0, scale_h=2f, scale_w=3f)", x)
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(3, axis=3))

"""dot and convolution against independent references (np.einsum, a direct loop convolution)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nxsat import dtypes as dt
from nxsat.attrs import ConvDims, DotDims, WindowDim
from nxsat.builder import Builder
from nxsat.diagnostics import NxsatError
from nxsat.interpreter import run_module
from nxsat.ops import get

RNG = np.random.default_rng(99)


def rand(shape, d: dt.DType):
    if d.is_float:
        return dt.cast(RNG.standard_normal(shape), d)
    info = np.iinfo(d.np)
    return RNG.integers(max(info.min, -50), min(info.max, 50), shape).astype(d.np)


def expect_code(code, fn):
    with pytest.raises(NxsatError) as exc:
        fn()
    assert exc.value.code == code, exc.value
    return exc.value.message


def run_op(op, xs, **attrs):
    b = Builder("main")
    ps = [b.param(dt.from_numpy(x.dtype), x.shape) for x in xs]
    node = b.op(op, ps, **attrs)
    (out,) = run_module(b.module(node), xs)
    return node, out


# --- dot -------------------------------------------------------------------------------------

def einsum_dot(lhs, rhs, d: DotDims):
    """The reference: name every dimension with a letter and let einsum contract."""
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lhs_l = [next(letters) for _ in range(lhs.ndim)]
    rhs_l = [next(letters) for _ in range(rhs.ndim)]
    for i, j in zip(d.lhs_batch + d.lhs_contracting, d.rhs_batch + d.rhs_contracting):
        rhs_l[j] = lhs_l[i]
    out = [lhs_l[i] for i in d.lhs_batch]
    out += [c for i, c in enumerate(lhs_l) if i not in d.lhs_batch + d.lhs_contracting]
    out += [c for j, c in enumerate(rhs_l) if j not in d.rhs_batch + d.rhs_contracting]
    spec = f"{''.join(lhs_l)},{''.join(rhs_l)}->{''.join(out)}"
    wide = np.int64 if lhs.dtype.kind in "iub" else np.float64
    return np.einsum(spec, lhs.astype(wide), rhs.astype(wide))


DOTS = [
    ((4, 5), (5, 3), DotDims((1,), (0,))),  # matmul
    ((5, 4), (3, 5), DotDims((0,), (1,))),  # both transposed
    ((2, 4, 5), (2, 5, 3), DotDims((2,), (1,), (0,), (0,))),  # batch matmul
    ((4, 2, 5), (5, 3, 2), DotDims((2,), (0,), (1,), (2,))),  # batch dims in odd places
    ((2, 3, 4, 5), (5, 4, 6), DotDims((2, 3), (1, 0))),  # two contracting dimensions
    ((3, 2, 6, 4), (2, 3, 4, 7), DotDims((3,), (2,), (1, 0), (0, 1))),  # two batch dimensions
    ((3,), (4,), DotDims()),  # outer product
    ((7,), (7,), DotDims((0,), (0,))),  # vector dot: scalar
    ((0, 3), (3, 2), DotDims((1,), (0,))),  # empty
    ((2, 0), (0, 3), DotDims((1,), (0,))),  # empty contraction: zeros
]


@pytest.mark.parametrize("lshape,rshape,dims", DOTS)
@pytest.mark.parametrize("d", [dt.F32, dt.S32, dt.BF16])
def test_dot_matches_einsum(lshape, rshape, dims, d):
    lhs, rhs = rand(lshape, d), rand(rshape, d)
    node, got = run_op("dot", [lhs, rhs], dims=dims)
    want = einsum_dot(lhs, rhs, dims)
    assert got.dtype == d.np and got.shape == want.shape
    if d is dt.S32:
        np.testing.assert_array_equal(got, want.astype(np.int32))
    else:  # fp64 accumulation, one rounding: within half an ulp of the exact result
        np.testing.assert_array_equal(got, dt.cast(want, d))
    lhs_t = node.operands[0].tensor
    k = math.prod(lhs_t.shape[i] for i in dims.lhs_contracting)
    assert get("dot").flops([o.type for o in node.operands], node.type, node.attrs) == 2 * got.size * k


@pytest.mark.parametrize("d", [dt.F32, dt.BF16, dt.S32])
def test_dot_in_blocks_matches_einsum(monkeypatch, d):
    """Large operands are widened a block at a time; force tiny blocks and compare."""
    import nxsat.ops.linalg as linalg

    monkeypatch.setattr(linalg, "BLOCK", 7)
    for ls, rs, dims in [((2, 5, 6), (2, 6, 9), DotDims((2,), (1,), (0,), (0,))),
                         ((3, 40), (40, 2), DotDims((1,), (0,))), ((1, 3), (3, 17), DotDims((1,), (0,)))]:
        lhs, rhs = rand(ls, d), rand(rs, d)
        _, got = run_op("dot", [lhs, rhs], dims=dims)
        np.testing.assert_array_equal(got, dt.cast(einsum_dot(lhs, rhs, dims), d))


def test_dot_preferred_element_type():
    lhs, rhs = rand((3, 8), dt.BF16), rand((8, 2), dt.BF16)
    _, got = run_op("dot", [lhs, rhs], dims=DotDims((1,), (0,)), dtype=dt.F32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, einsum_dot(lhs, rhs, DotDims((1,), (0,))).astype(np.float32))
    a, b = rand((4, 64), dt.S8), rand((64, 3), dt.S8)
    a[:] = 127
    b[:] = -128
    _, got = run_op("dot", [a, b], dims=DotDims((1,), (0,)), dtype=dt.S32)
    assert got.dtype == np.int32 and (got == 127 * -128 * 64).all()


def test_integer_dot_is_exact_then_wraps():
    a = np.full((2, 3), 2 ** 20, np.int32)
    b = np.full((3, 2), 2 ** 15, np.int32)
    _, got = run_op("dot", [a, b], dims=DotDims((1,), (0,)))
    exact = 3 * 2 ** 35
    assert (got == np.int64(exact).astype(np.int32)).all()


def test_float_dot_rounds_once():
    # 1 + 2^-24 + 2^-24 rounds to 1 at every step in f32, but to 1 + 2^-23 when summed exactly.
    lhs = np.array([[1.0, 2.0 ** -24, 2.0 ** -24]], np.float32)
    rhs = np.ones((3, 1), np.float32)
    _, got = run_op("dot", [lhs, rhs], dims=DotDims((1,), (0,)))
    assert got[0, 0] == np.float32(1 + 2.0 ** -23)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_dot_property(data):
    nb, nc = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
    lfree, rfree = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
    sizes = [data.draw(st.integers(1, 3)) for _ in range(nb + nc)]
    lperm = data.draw(st.permutations(range(nb + nc + lfree)))
    rperm = data.draw(st.permutations(range(nb + nc + rfree)))
    lshape = [0] * len(lperm)
    rshape = [0] * len(rperm)
    for role, (lp, rp) in enumerate(zip(lperm, rperm)):
        if role < nb + nc:
            lshape[lp] = rshape[rp] = sizes[role]
    for role in range(nb + nc, len(lperm)):
        lshape[lperm[role]] = data.draw(st.integers(1, 3))
    for role in range(nb + nc, len(rperm)):
        rshape[rperm[role]] = data.draw(st.integers(1, 3))
    dims = DotDims(tuple(lperm[nb:nb + nc]), tuple(rperm[nb:nb + nc]), tuple(lperm[:nb]), tuple(rperm[:nb]))
    lhs, rhs = rand(tuple(lshape), dt.S32), rand(tuple(rshape), dt.S32)
    _, got = run_op("dot", [lhs, rhs], dims=dims)
    np.testing.assert_array_equal(got, einsum_dot(lhs, rhs, dims).astype(np.int32))


def _dot_node(ls, rs, dims, lt=dt.F32, rt=dt.F32, **attrs):
    b = Builder("bad")
    return b.op("dot", [b.param(lt, ls), b.param(rt, rs)], dims=dims, **attrs)


@pytest.mark.parametrize("make,needle", [
    (lambda: _dot_node((2, 3), (4, 2), DotDims((1,), (0,))), "contracting dimension sizes differ"),
    (lambda: _dot_node((2, 3), (3, 2), DotDims((1,), ())), "must pair up"),
    (lambda: _dot_node((2, 3, 4), (3, 3, 2), DotDims((1,), (1,), (0,), (0,))),
     "batch dimension sizes differ"),
    (lambda: _dot_node((2, 3), (3, 2), DotDims((2,), (0,))), "out of range"),
    (lambda: _dot_node((2, 3), (3, 2), DotDims((1,), (0,), (1,), (0,))), "repeat"),
    (lambda: _dot_node((2, 3), (3, 2), DotDims((1,), (0,)), dt.S32, dt.F32), "element types differ"),
    (lambda: _dot_node((2, 3), (3, 2), DotDims((1,), (0,)), dt.S32, dt.S32, dtype=dt.S8), "narrower"),
    (lambda: _dot_node((2, 3), (3, 2), DotDims((1,), (0,)), dtype=dt.S32), "not of the kind"),
])
def test_dot_shape_errors(make, needle):
    assert needle in expect_code("NCC_EVRF064", make)


def test_dot_result_types():
    assert str(_dot_node((2, 3), (3, 5), DotDims((1,), (0,)), dt.BF16, dt.F32).type) == "f32[2,5]"
    assert str(_dot_node((6, 2, 3), (3, 6, 5), DotDims((2,), (0,), (0,), (1,))).type) == "f32[6,2,5]"


# --- convolution -----------------------------------------------------------------------------

def W(size, stride=1, lo=0, hi=0, ld=1, rd=1, rev=False):
    return WindowDim(size, stride, lo, hi, ld, rd, rev)


def ref_conv(x, w, window, fgc=1, bgc=1):
    """Direct loops over outputs and kernel taps in canonical layout (x: N,C,S..., w: O,I,K...),
    following XLA's definition index by index: skip dilation holes and padding."""
    wide = np.int64 if x.dtype.kind in "iub" else np.float64
    x, w = x.astype(wide), w.astype(wide)
    n, c = x.shape[:2]
    o_count, i_count = w.shape[:2]
    spatial = x.shape[2:]
    out_sp = []
    for s, wd in zip(spatial, window):
        base = 0 if s == 0 else (s - 1) * wd.lhs_dilation + 1
        span = (wd.size - 1) * wd.rhs_dilation + 1
        padded = base + wd.pad_lo + wd.pad_hi
        out_sp.append(0 if padded < span else (padded - span) // wd.stride + 1)
    nb = n // bgc
    out = np.zeros((nb, o_count, *out_sp), dtype=wide)
    per_fg, per_bg = o_count // fgc, o_count // bgc
    for o in range(o_count):
        fg, bg = o // per_fg, o // per_bg
        for b in range(nb):
            for pos in itertools.product(*map(range, out_sp)):
                acc = wide(0)
                for tap in itertools.product(*(range(wd.size) for wd in window)):
                    idx = []
                    for p, t, wd, s in zip(pos, tap, window, spatial):
                        u = p * wd.stride + t * wd.rhs_dilation - wd.pad_lo
                        if u % wd.lhs_dilation or not 0 <= u // wd.lhs_dilation < s:
                            break
                        idx.append(u // wd.lhs_dilation)
                    else:
                        k = tuple(wd.size - 1 - t if wd.reversal else t for t, wd in zip(tap, window))
                        xs = x[(b + bg * nb, slice(fg * i_count, (fg + 1) * i_count), *idx)]
                        acc += xs @ w[(o, slice(None), *k)]
                out[(b, o, *pos)] = acc
    return out


def layout(a, labels: str, canon: str):
    """Transpose a canonical-layout array (``canon``, e.g. 'bf01') into ``labels`` order."""
    return np.ascontiguousarray(np.transpose(a, [canon.index(ch) for ch in labels]))


def conv(x_c, w_c, window, labels="bf01_oi01->bf01", fgc=1, bgc=1, dtype=None):
    """Run nxsat's convolution on canonical inputs laid out per ``labels``; return canonical."""
    lhs_l, rest = labels.split("_")
    rhs_l, out_l = rest.split("->")
    nsp = len(window)
    sp = "".join(map(str, range(nsp)))
    x = layout(x_c, lhs_l, "bf" + sp)
    w = layout(w_c, rhs_l, "oi" + sp)
    attrs = dict(window=tuple(window), dims=ConvDims.from_labels(labels), feature_group_count=fgc,
                 batch_group_count=bgc)
    if dtype is not None:
        attrs["dtype"] = dtype
    node, got = run_op("convolution", [x, w], **attrs)
    back = np.transpose(got, [out_l.index(ch) for ch in "bf" + sp])
    return node, back


CONVS = [
    # (x canonical shape, w canonical shape, window, labels, fgc, bgc)
    ((2, 3, 6, 5), (4, 3, 3, 3), [W(3, 1, 1, 1), W(3, 1, 1, 1)], "bf01_oi01->bf01", 1, 1),
    ((2, 3, 7, 6), (4, 3, 3, 2), [W(3, 2, 0, 1), W(2, 2, 1, 0)], "b01f_01io->b01f", 1, 1),
    ((1, 2, 9), (3, 2, 4), [W(4, 2, 2, 1)], "bf0_oi0->bf0", 1, 1),
    ((2, 2, 4, 3, 5), (3, 2, 2, 2, 3), [W(2, 1, 1, 0), W(2, 2, 0, 1), W(3, 1, 1, 1)],
     "b012f_012io->b012f", 1, 1),
    ((1, 2, 4, 4), (3, 2, 3, 3), [W(3, 1, 2, 2, ld=2), W(3, 1, 1, 2, ld=2)], "bf01_oi01->bf01", 1, 1),
    ((1, 2, 8, 7), (2, 2, 3, 2), [W(3, 1, 0, 0, rd=2), W(2, 2, 1, 1, rd=3)], "b01f_01io->b01f", 1, 1),
    ((2, 2, 7, 6), (3, 2, 2, 3), [W(2, 1, -1, -2), W(3, 2, 2, -1)], "bf01_oi01->bf01", 1, 1),
    ((1, 3, 5, 5), (2, 3, 3, 2), [W(3, 1, 1, 1, rev=True), W(2, 1, 0, 1, rev=True)], "bf01_oi01->bf01", 1, 1),
    ((2, 4, 5, 5), (6, 2, 3, 3), [W(3, 1, 1, 1), W(3, 2, 1, 1)], "b01f_01io->b01f", 2, 1),  # grouped
    ((1, 4, 6, 6), (8, 1, 3, 3), [W(3, 1, 1, 1), W(3, 1, 1, 1)], "b01f_01io->b01f", 4, 1),  # depthwise x2
    ((4, 3, 5, 4), (6, 3, 2, 2), [W(2), W(2, 2)], "bf01_oi01->bf01", 1, 2),  # batch groups
    # weight-gradient style: every batch element its own group
    ((3, 2, 6, 5), (3, 2, 4, 3), [W(4, 1, 0, 0), W(3, 1, 1, 0)], "fb01_io01->bf01", 1, 3),
    ((2, 3, 5, 4), (4, 3, 2, 2), [W(2, 2), W(2, 1, 1, 1)], "f01b_i01o->01fb", 1, 1),  # odd layouts
    ((2, 3, 5, 4), (4, 3, 2, 2), [W(2, 1, 0, 0), W(2)], "bf10_oi10->fb01", 1, 1),
]


@pytest.mark.parametrize("xs,ws,window,labels,fgc,bgc", CONVS)
def test_convolution_matches_loops(xs, ws, window, labels, fgc, bgc):
    x, w = rand(xs, dt.F32), rand(ws, dt.F32)
    node, got = conv(x, w, window, labels, fgc, bgc)
    want = ref_conv(x, w, window, fgc, bgc)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6, atol=1e-6)
    # FLOPs: 2 x output elements x kernel taps x kernel input features, exactly
    flops = get("convolution").flops([o.type for o in node.operands], node.type, node.attrs)
    assert flops == 2 * got.size * math.prod(ws[2:]) * ws[1]


@pytest.mark.parametrize("d", [dt.S32, dt.BF16])
def test_convolution_dtypes(d):
    x, w = rand((2, 4, 6, 5), d), rand((4, 2, 3, 2), d)
    window = [W(3, 2, 1, 1), W(2, 1, 0, 1, rd=2)]
    _, got = conv(x, w, window, "b01f_01io->b01f", fgc=2)
    want = ref_conv(x, w, window, fgc=2)
    assert got.dtype == d.np
    np.testing.assert_array_equal(got, dt.cast(want, d))
    if d is dt.BF16:  # bf16 inputs, f32 result (preferred element type)
        _, got = conv(x, w, window, "b01f_01io->b01f", fgc=2, dtype=dt.F32)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want.astype(np.float32))


def test_convolution_with_empty_dimensions():
    node, got = conv(rand((1, 2, 3, 3), dt.F32), rand((2, 2, 3, 3), dt.F32), [W(3, 1, -1, 0), W(3)])
    assert got.shape == (1, 2, 0, 1)
    _, got = conv(rand((2, 0, 4, 4), dt.F32), rand((3, 0, 2, 2), dt.F32), [W(2), W(2)])  # no features
    np.testing.assert_array_equal(got, np.zeros((2, 3, 3, 3), np.float32))
    _, got = conv(rand((0, 2, 4, 4), dt.F32), rand((0, 2, 2, 2), dt.F32), [W(2), W(2)])
    assert got.shape == (0, 0, 3, 3)


def test_convolution_output_shape_like_resnet_stem():
    b = Builder("shape")
    x, w = b.param(dt.F32, (1, 230, 230, 3)), b.param(dt.F32, (7, 7, 3, 64))
    n = b.op("convolution", [x, w], window=(W(7, 2), W(7, 2)), dims=ConvDims.from_labels("b01f_01io->b01f"),
             feature_group_count=1, batch_group_count=1)
    assert n.shape == (1, 112, 112, 64)
    assert get("convolution").flops([x.type, w.type], n.type, n.attrs) == 2 * 112 * 112 * 64 * 49 * 3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_convolution_property(data):
    nsp = data.draw(st.integers(1, 2))
    groups = data.draw(st.sampled_from([(1, 1), (2, 1), (1, 2)]))
    fgc, bgc = groups
    n = bgc * data.draw(st.integers(1, 2))
    cg = data.draw(st.integers(1, 2))
    o = fgc * bgc * data.draw(st.integers(1, 2))
    window, spatial = [], []
    for _ in range(nsp):
        s = data.draw(st.integers(1, 5))
        wd = W(data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2)), data.draw(st.integers(-1, 2)),
               data.draw(st.integers(-1, 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)),
               data.draw(st.booleans()))
        if (s - 1) * wd.lhs_dilation + 1 + wd.pad_lo + wd.pad_hi < 0:
            wd = W(wd.size, wd.stride, 0, 0, wd.lhs_dilation, wd.rhs_dilation, wd.reversal)
        window.append(wd)
        spatial.append(s)
    x = rand((n, cg * fgc, *spatial), dt.S32)
    w = rand((o, cg, *(wd.size for wd in window)), dt.S32)
    sp = "".join(map(str, range(nsp)))
    labels = data.draw(st.sampled_from([f"bf{sp}_oi{sp}->bf{sp}", f"b{sp}f_{sp}io->b{sp}f"]))
    _, got = conv(x, w, window, labels, fgc, bgc)
    np.testing.assert_array_equal(got, ref_conv(x, w, window, fgc, bgc).astype(np.int32))


def _conv_node(xs, ws, window, labels="bf01_oi01->bf01", fgc=1, bgc=1, xt=dt.F32, wt=dt.F32):
    b = Builder("bad")
    return b.op("convolution", [b.param(xt, xs), b.param(wt, ws)], window=tuple(window),
                dims=ConvDims.from_labels(labels), feature_group_count=fgc, batch_group_count=bgc)


@pytest.mark.parametrize("make,needle", [
    (lambda: _conv_node((1, 4, 5, 5), (2, 3, 3, 3), [W(3), W(3)]),
     "input feature dimension 4 must equal kernel input feature dimension 3 x feature_group_count 1"),
    (lambda: _conv_node((1, 6, 5, 5), (4, 2, 3, 3), [W(3), W(3)], fgc=3),
     "output feature dimension 4 is not divisible by feature_group_count 3"),
    (lambda: _conv_node((3, 2, 5, 5), (4, 2, 3, 3), [W(3), W(3)], bgc=2),
     "input batch dimension 3 is not divisible by batch_group_count 2"),
    (lambda: _conv_node((4, 2, 5, 5), (3, 2, 3, 3), [W(3), W(3)], bgc=2),
     "output feature dimension 3 is not a multiple of batch_group_count 2"),
    (lambda: _conv_node((4, 4, 5, 5), (4, 2, 3, 3), [W(3), W(3)], fgc=2, bgc=2), "cannot both"),
    (lambda: _conv_node((1, 2, 5, 5), (2, 2, 3, 3), [W(3), W(2)]), "do not match the kernel"),
    (lambda: _conv_node((1, 2, 5, 5), (2, 2, 3, 3), [W(3)]), "window has 1 dimensions"),
    (lambda: _conv_node((1, 2, 5), (2, 2, 3, 3), [W(3), W(3)]), "lhs must have rank 4"),
    (lambda: _conv_node((1, 2, 5, 5), (2, 2, 3, 3), [W(3, 1, -4, -3), W(3)]), "removes more"),
    (lambda: _conv_node((1, 2, 5, 5), (2, 2, 3, 3), [W(3, 0), W(3)]), "non-positive stride"),
    (lambda: _conv_node((1, 2, 5, 5), (2, 2, 3, 3), [W(3), W(3)], fgc=0), "must be a positive number"),
    (lambda: _conv_node((1, 2, 5, 5), (2, 2, 3, 3), [W(3), W(3)], xt=dt.S32), "element types differ"),
])
def test_convolution_shape_errors(make, needle):
    assert needle in expect_code("NCC_EVRF064", make)


def test_convolution_rejects_malformed_dimension_numbers():
    b = Builder("bad")
    x, w = b.param(dt.F32, (1, 2, 5, 5)), b.param(dt.F32, (2, 2, 3, 3))
    bad = ConvDims(0, 1, (2, 2), 1, 0, (2, 3), 0, 1, (2, 3))  # input spatial repeats dimension 2
    msg = expect_code("NCC_EVRF064", lambda: b.op("convolution", [x, w], window=(W(3), W(3)), dims=bad,
                                                  feature_group_count=1, batch_group_count=1))
    assert "input dimensions must name each dimension exactly once" in msg


def test_registry_entries():
    assert {"Dot", "DotGeneral"} <= set(get("dot").neuron) and get("dot").engine == "TensorE"
    assert "Convolution" in get("convolution").neuron and get("convolution").engine == "TensorE"

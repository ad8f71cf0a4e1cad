"""Independent numpy definitions of the operators the Relay tests check (written from the
operators' definitions, not from the code under test)."""

from __future__ import annotations

import numpy as np


def ref_conv2d(x, w, stride=(1, 1), pad=(0, 0, 0, 0), dil=(1, 1), groups=1):
    """NCHW x OIHW, padding (top, left, bottom, right): a sum over kernel taps, one einsum each."""
    n, c, h, wd = x.shape
    o, i, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * i : (g + 1) * i]
        ws = w[g * og : (g + 1) * og].astype(np.float64)
        for a in range(kh):
            for b in range(kw):
                patch = xs[
                    :,
                    :,
                    a * dil[0] : a * dil[0] + stride[0] * (oh - 1) + 1 : stride[0],
                    b * dil[1] : b * dil[1] + stride[1] * (ow - 1) + 1 : stride[1],
                ]
                out[:, g * og : (g + 1) * og] += np.einsum("nihw,oi->nohw", patch, ws[:, :, a, b])
    return out


def ref_pool2d(x, size, stride, pad, kind, ceil_mode=False, include_pad=False, dil=(1, 1)):
    """NCHW pooling by explicit windows over a padded copy; padding cells are masked out."""
    n, c, h, w = x.shape
    outs = []
    for d, (sz, st, lo, hi, dl) in enumerate(zip(size, stride, (pad[0], pad[1]), (pad[2], pad[3]), dil)):
        full = (h, w)[d] + lo + hi - (dl * (sz - 1) + 1)
        outs.append((-(-full // st) if ceil_mode else full // st) + 1)
    oh, ow = outs
    big = 64
    xp = np.full((n, c, h + 2 * big, w + 2 * big), np.nan)
    xp[:, :, big : big + h, big : big + w] = x
    region = np.zeros((h + 2 * big, w + 2 * big), bool)  # explicit padding region
    region[big - pad[0] : big + h + pad[2], big - pad[1] : big + w + pad[3]] = True
    res = np.zeros((n, c, oh, ow))
    for r in range(oh):
        for q in range(ow):
            rows = big - pad[0] + r * stride[0] + dil[0] * np.arange(size[0])
            cols = big - pad[1] + q * stride[1] + dil[1] * np.arange(size[1])
            win = xp[:, :, rows][:, :, :, cols]
            if kind == "max":
                res[:, :, r, q] = np.nanmax(np.where(np.isnan(win), -np.inf, win), axis=(2, 3))
            else:
                total = np.nansum(win, axis=(2, 3))
                if include_pad:
                    count = region[rows][:, cols].sum()
                else:
                    count = max(int((~np.isnan(win[0, 0])).sum()), 1)
                res[:, :, r, q] = total / count
    return res


def ref_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)

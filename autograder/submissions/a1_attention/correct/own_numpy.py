"""A correct a1 submission written independently of the solution source (selftest: must score 100%)."""
import numpy as np


def _acc(*xs):
    return np.result_type(np.float32, *[x.dtype for x in xs])


def safe_softmax(x, axis=-1):
    x = np.asarray(x)
    xc = x.astype(_acc(x))
    m = np.max(xc, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(xc - m)
    s = e.sum(axis=axis, keepdims=True)
    return (e / np.where(s > 0, s, 1)).astype(x.dtype)


def online_softmax(x, block_size=128):
    if not hasattr(x, "dtype"):
        x = np.asarray(x)
    ct = _acc(x)
    m = np.full(x.shape[:-1], -np.inf, ct)
    l = np.zeros(x.shape[:-1], ct)
    for i in range(0, x.shape[-1], block_size):
        b = np.asarray(x[..., i:i + block_size]).astype(ct)
        mn = np.maximum(m, b.max(axis=-1))
        ms = np.where(np.isfinite(mn), mn, 0)
        l = l * np.exp(np.where(np.isfinite(m), m - ms, -np.inf)) + np.exp(b - ms[..., None]).sum(axis=-1)
        m = mn
    ms = np.where(np.isfinite(m), m, 0)[..., None]
    out = np.empty(x.shape, x.dtype)
    for j in range(0, x.shape[-1], block_size):
        b = np.asarray(x[..., j:j + block_size]).astype(ct)
        out[..., j:j + block_size] = np.exp(b - ms) / np.where(l > 0, l, 1)[..., None]
    return out


def merge_states(o_a, lse_a, o_b, lse_b):
    ct = _acc(o_a, lse_a, o_b, lse_b)
    la, lb = lse_a.astype(ct), lse_b.astype(ct)
    m = np.maximum(la, lb)
    ms = np.where(np.isfinite(m), m, 0)
    wa, wb = np.exp(la - ms), np.exp(lb - ms)
    tot = wa + wb
    with np.errstate(divide="ignore"):
        lse = np.where(tot > 0, ms + np.log(np.where(tot > 0, tot, 1)), -np.inf)
    den = np.where(tot > 0, tot, 1)[..., None]
    o = (np.where(wa[..., None] > 0, wa[..., None] * o_a.astype(ct), 0)
         + np.where(wb[..., None] > 0, wb[..., None] * o_b.astype(ct), 0)) / den
    lse_dt = np.float64 if ct == np.float64 else np.float32
    return o.astype(np.result_type(o_a.dtype, o_b.dtype)), lse.astype(lse_dt)


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    ct = _acc(q, k, v)
    d = q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    s = (q.astype(ct) @ np.swapaxes(k.astype(ct), -1, -2)) * ct.type(scale)
    nq, nk = q.shape[-2], k.shape[-2]
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    o = ((p / np.where(l > 0, l, 1)) @ v.astype(ct)).astype(q.dtype)
    if not return_lse:
        return o
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1)), -np.inf)
    return o, lse.astype(np.float64 if ct == np.float64 else np.float32)

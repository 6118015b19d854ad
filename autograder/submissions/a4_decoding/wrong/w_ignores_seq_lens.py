"""WRONG: a NumPy Flash-Decoding that ignores seq_lens (attends padding keys); flash_decode is not written."""
import math

import numpy as np


def flash_decoding(q, k, v, num_splits=4, seq_lens=None, scale=None):
    b, hq, d = q.shape
    hkv, n = k.shape[1], k.shape[2]
    g = hq // hkv
    ct = np.result_type(np.float32, q.dtype, k.dtype, v.dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qg = q.astype(ct).reshape(b, hkv, g, d)
    chunk = math.ceil(n / num_splits)
    m_all = np.full((b, hkv, g), -np.inf, ct)
    l_all = np.zeros((b, hkv, g), ct)
    acc = np.zeros((b, hkv, g, d), ct)
    for s in range(num_splits):
        lo, hi = min(s * chunk, n), min((s + 1) * chunk, n)
        if lo == hi:
            continue
        sc = np.einsum("bhgd,bhnd->bhgn", qg, k[:, :, lo:hi].astype(ct)) * scale
        m = np.maximum(m_all, sc.max(-1))
        p = np.exp(sc - m[..., None])
        a = np.exp(m_all - m)
        l_all = a * l_all + p.sum(-1)
        acc = a[..., None] * acc + np.einsum("bhgn,bhnd->bhgd", p, v[:, :, lo:hi].astype(ct))
        m_all = m
    o = acc / l_all[..., None]
    lse = m_all + np.log(l_all)
    return o.reshape(b, hq, d).astype(q.dtype), lse.reshape(b, hq).astype(np.float64 if ct == np.float64 else np.float32)

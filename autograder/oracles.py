"""The grader's own float64 oracle (NumPy, CPU). It runs only in the grading parent, never in a submission's
process, and shares no code with ``reference`` so a bug there cannot hide here (the project's tests compare it
with torch autograd in float64: ``tests/test_autograder_units.py::test_oracle_matches_torch_autograd``).

Conventions are docs/design.md §3: bottom-right causal mask (query i may attend key j iff j <= i + Nk - Nq), GQA (query
head h reads kv head h // (Hq // Hkv)), natural-log lse of the scaled scores, a row with no key gives o = 0 and
lse = -inf.
"""
from __future__ import annotations

import math

import numpy as np


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _expand(x: np.ndarray, hq: int) -> np.ndarray:
    """(…, Hkv, N, d) -> (…, Hq, N, d): query head h reads kv head h // group."""
    if x.ndim < 3 or x.shape[-3] == hq:
        return x
    return np.repeat(x, hq // x.shape[-3], axis=-3)


def _sum_group(dx: np.ndarray, hkv: int) -> np.ndarray:
    if dx.ndim < 3 or dx.shape[-3] == hkv:
        return dx
    g = dx.shape[-3] // hkv
    return dx.reshape(dx.shape[:-3] + (hkv, g) + dx.shape[-2:]).sum(axis=-3)


def allowed(nq: int, nk: int) -> np.ndarray:
    """Boolean (nq, nk): j <= i + (nk - nq)."""
    return np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)


def _probs(s: np.ndarray):
    """Row softmax of scores with -inf entries; returns (P, lse). Rows of all -inf: P = 0, lse = -inf."""
    m = s.max(axis=-1, keepdims=True)
    ms = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - ms)
    l = e.sum(axis=-1, keepdims=True)
    p = e / np.where(l > 0, l, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, ms[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)), -np.inf)
    return p, lse


def scores(q, k, causal=False, scale=None, key_mask=None):
    q, k = f64(q), f64(k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    k = _expand(k, q.shape[-3]) if q.ndim >= 3 else k
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    if causal:
        s = np.where(allowed(q.shape[-2], k.shape[-2]), s, -np.inf)
    if key_mask is not None:
        s = np.where(key_mask, s, -np.inf)
    return s


def attention(q, k, v, causal=False, scale=None, key_mask=None):
    """(o, lse) in float64: O = softmax(scale Q K^T + mask) V."""
    s = scores(q, k, causal, scale, key_mask)
    p, lse = _probs(s)
    v = f64(v)
    v = _expand(v, s.shape[-3]) if s.ndim >= 3 else v
    return p @ v, lse


def attention_grads(q, k, v, do, causal=False, scale=None):
    """(dq, dk, dv) of sum(O * dO): dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = s dS K, dK = s dS^T Q.

    GQA gradients of a kv head are summed over the query heads that read it.
    """
    q, k, v, do = f64(q), f64(k), f64(v), f64(do)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    hkv = k.shape[-3] if k.ndim >= 3 else None
    s = scores(q, k, causal, scale)
    p, _ = _probs(s)
    ke = _expand(k, q.shape[-3]) if hkv else k
    ve = _expand(v, q.shape[-3]) if hkv else v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(ve, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = (ds @ ke) * scale
    dk = (np.swapaxes(ds, -1, -2) @ q) * scale
    if hkv:
        dk, dv = _sum_group(dk, hkv), _sum_group(dv, hkv)
    return dq, dk, dv


def softmax(x, axis=-1):
    """Row softmax along ``axis`` in float64; an all -inf row gives zeros."""
    x = np.moveaxis(f64(x), axis, -1)
    p, _ = _probs(x)
    return np.moveaxis(p, -1, axis)


def merge_states(o_a, lse_a, o_b, lse_b):
    """lse = log(e^a + e^b), o = e^(a - lse) o_a + e^(b - lse) o_b; two empty sets give o = 0, lse = -inf."""
    o_a, lse_a, o_b, lse_b = f64(o_a), f64(lse_a), f64(o_b), f64(lse_b)
    m = np.maximum(lse_a, lse_b)
    ms = np.where(np.isfinite(m), m, 0.0)
    wa, wb = np.exp(lse_a - ms), np.exp(lse_b - ms)
    tot = wa + wb
    with np.errstate(divide="ignore"):
        lse = np.where(tot > 0, ms + np.log(np.where(tot > 0, tot, 1.0)), -np.inf)
    den = np.where(tot > 0, tot, 1.0)
    o = np.where((wa > 0)[..., None], (wa / den)[..., None] * np.nan_to_num(o_a), 0.0) + \
        np.where((wb > 0)[..., None], (wb / den)[..., None] * np.nan_to_num(o_b), 0.0)
    return o, lse


def decode(q, k, v, seq_lens=None, scale=None):
    """One query token per sequence: q (B, Hq, d), k, v (B, Hkv, Nmax, d); keys >= seq_lens[b] ignored."""
    q, k, v = f64(q), f64(k), f64(v)
    b, nmax = k.shape[0], k.shape[2]
    lens = np.full(b, nmax) if seq_lens is None else np.asarray(seq_lens, dtype=np.int64)
    mask = (np.arange(nmax)[None, :] < lens[:, None])[:, None, None, :]     # (B, 1, 1, Nmax)
    o, lse = attention(q[:, :, None, :], k, v, scale=scale, key_mask=mask)
    return o[:, :, 0, :], lse[:, :, 0]


def gather_paged(k_cache, v_cache, block_tables, seq_lens):
    """Contiguous (B, Hkv, Nmax, d) K and V from a paged cache (num_blocks, block_size, Hkv, d)."""
    kc, vc = f64(k_cache), f64(v_cache)
    bs = kc.shape[1]
    tables = np.asarray(block_tables, dtype=np.int64)
    lens = np.asarray(seq_lens, dtype=np.int64)
    b = tables.shape[0]
    nmax = max(1, int(lens.max()) if b else 1)
    k = np.zeros((b, kc.shape[2], nmax, kc.shape[3]))
    v = np.zeros_like(k)
    for i in range(b):
        for t in range(int(lens[i])):
            blk = tables[i, t // bs]
            k[i, :, t] = kc[blk, t % bs]
            v[i, :, t] = vc[blk, t % bs]
    return k, v, lens


def paged(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    k, v, lens = gather_paged(k_cache, v_cache, block_tables, seq_lens)
    o, _ = decode(q, k, v, lens, scale)
    return o

"""Stage 2: FlashAttention-2 in NumPy -- tiled forward (Algorithm 1) and recomputation backward (Algorithm 2).

NumPy has no SRAM, so "on chip" here means "a small array": the code follows the algorithms line by line and
never holds more than one ``block_q x block_k`` tile of S or P (per batch x head slice; all heads and batch
entries are processed together, so the live tile has shape ``(..., block_q, block_k)``). Python loops run only
over tiles; everything inside a tile is vectorised. Memory is O(N d) instead of O(N^2).

Layout trick for GQA: query heads that share a kv head are packed next to each other, q ``(B, Hkv, G, N, d)`` ->
``(B*Hkv, N*G, d)`` with packed row ``n*G + g``. A query tile of ``block_q`` positions is then one contiguous
``(block_q*G, d)`` slab, it meets each K/V tile of its kv head in a single matmul, and K/V are never repeated.

Causal masking is bottom-right aligned (row i sees key j iff j <= i + Nk - Nq). Tiles entirely above the
diagonal are skipped, tiles entirely below it are not masked, only the tiles crossing it pay for a mask. Rows
that see no key (Nq > Nk) get o = 0 and lse = -inf; the running max of such rows stays -inf and is replaced by 0
before it is subtracted, so no ``-inf - (-inf) = NaN`` is ever formed.
"""
from __future__ import annotations

import math

import numpy as np

from ._validate import (as_float_array, check_flag, check_positive_int, check_qkv, check_scale, compute_dtype,
                        lse_dtype)

__all__ = ["flash_attention_forward", "flash_attention_backward"]


class _Layout:
    """Shapes of one call and the packing ``(..., Hq, N, *rest) <-> (B*Hkv, N*G, *rest)`` (see module doc)."""

    def __init__(self, q, k, group):
        self.group = group
        self.nq, self.nk, self.d = q.shape[-2], k.shape[-2], q.shape[-1]
        if q.ndim == 2:
            self.bh = 1
            self.hkv = 1
        else:
            self.hkv = k.shape[-3]
            self.bh = math.prod(q.shape[:-3]) * self.hkv

    def pack_q(self, x, n_trailing, dtype):
        """Query-side array with ``n_trailing`` dims after N (1 for q/o/do, 0 for lse) -> packed, ``dtype``."""
        rest = x.shape[x.ndim - n_trailing:]
        x = x.reshape((self.bh, self.group, self.nq) + rest)
        x = np.swapaxes(x, 1, 2)  # (BH, N, G, *rest): the G heads of one position become adjacent rows
        # always a fresh copy: callers scale/patch it in place and must never touch the caller's array
        return np.array(x, dtype=dtype, order="C", copy=True).reshape((self.bh, self.nq * self.group) + rest)

    def unpack_q(self, x, n_trailing, shape):
        rest = x.shape[x.ndim - n_trailing:]
        x = np.swapaxes(x.reshape((self.bh, self.nq, self.group) + rest), 1, 2)
        return x.reshape(shape)

    def pack_kv(self, x, dtype):
        return np.ascontiguousarray(x, dtype=dtype).reshape(self.bh, self.nk, self.d)


def _ranges(n, block):
    return [(s, min(s + block, n)) for s in range(0, n, block)]


def _tile_mask(r0, r1, c0, c1, offset, group):
    """Allowed-mask of a tile in packed rows: packed row p is query position r0 + p // group."""
    rows = np.repeat(np.arange(r0, r1), group) + offset
    return np.arange(c0, c1)[None, :] <= rows[:, None]


def _validate(q, k, v, causal, scale, block_q, block_k):
    q, k, v, group = check_qkv(q, k, v)
    causal = check_flag(causal, "causal")
    scale = check_scale(scale, q.shape[-1])
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    return q, k, v, group, causal, scale, block_q, block_k


def flash_attention_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
    """FlashAttention-2 forward pass (FA2 Algorithm 1), returning ``(o, lse)``.

    ``q (..., Hq, Nq, d)``, ``k, v (..., Hkv, Nk, d)`` or single-head ``(N, d)``; any Nq, Nk, any block sizes
    (the last tiles are ragged). ``o`` has q's dtype; ``lse`` (natural log, shape ``q.shape[:-1]``) is float32,
    float64 for float64 inputs. Arithmetic is float32 (float64 for float64 inputs).

    Line by line (B_r = ``block_q``, B_c = ``block_k``; S is pre-scaled by folding ``scale`` into Q once):
      1-2: split Q, O, L into T_r row blocks and K, V into T_c column blocks (``_ranges``).
      3-5: for each query block i: load Q_i, set O_i = 0, l_i = 0, m_i = -inf.
      6-7: for each key block j (causal: only j not entirely above the diagonal): load K_j, V_j.
        8: S = Q_i K_j^T (masked to -inf above the diagonal on tiles that cross it).
        9: m_new = max(m, rowmax(S)); P~ = exp(S - m_new); l = e^{m - m_new} l + rowsum(P~).
       10: O_i = diag(e^{m - m_new}) O_i + P~ V_j. (The FA2 paper, and the seeds' slide, print this factor with
           an extra ^-1; the running output must be multiplied by e^{m_old - m_new} <= 1, as here.)
       12: O_i = diag(l)^-1 O_i -- the only division, once per row at the end.
       13: L_i = m + log(l).
    """
    q, k, v, group, causal, scale, block_q, block_k = _validate(q, k, v, causal, scale, block_q, block_k)
    ct = compute_dtype(q, k, v)
    lay = _Layout(q, k, group)
    nq, nk, g = lay.nq, lay.nk, group
    offset = nk - nq
    qp = lay.pack_q(q, 1, ct)
    qp *= ct.type(scale)
    kp, vp = lay.pack_kv(k, ct), lay.pack_kv(v, ct)
    op = np.zeros_like(qp)
    lsep = np.empty(qp.shape[:-1], dtype=ct)
    if lay.bh == 1:  # one head: drop the batch axis so every matmul is a plain 2-D BLAS call
        qp, kp, vp, op, lsep = qp[0], kp[0], vp[0], op[0], lsep[0]
    lead = qp.shape[:-2]
    neg_inf = ct.type(-np.inf)
    for r0, r1 in _ranges(nq, block_q):                              # line 3
        rows = slice(r0 * g, r1 * g)
        q_i = qp[..., rows, :]                                       # line 4
        o_i = np.zeros(lead + (q_i.shape[-2], lay.d), dtype=ct)     # line 5
        l_i = np.zeros(lead + (q_i.shape[-2],), dtype=ct)
        m_i = np.full(lead + (q_i.shape[-2],), neg_inf, dtype=ct)
        k_end = min(nk, r1 + offset) if causal else nk              # causal: later key tiles are all masked
        for c0, c1 in _ranges(max(k_end, 0), block_k):               # line 6
            k_j, v_j = kp[..., c0:c1, :], vp[..., c0:c1, :]          # line 7
            s = q_i @ np.swapaxes(k_j, -1, -2)                       # line 8
            crosses = causal and c1 - 1 > r0 + offset
            if crosses:
                np.copyto(s, neg_inf, where=~_tile_mask(r0, r1, c0, c1, offset, g))
            m_new = np.maximum(m_i, s.max(axis=-1))                  # line 9
            m_use = np.where(m_new == neg_inf, 0, m_new) if crosses else m_new
            s -= m_use[..., None]
            p = np.exp(s, out=s)                                     # line 9: P~ (overwrites S: one tile alive)
            alpha = np.exp(m_i - m_use)
            l_i *= alpha
            l_i += p.sum(axis=-1)
            o_i *= alpha[..., None]                                  # line 10
            o_i += p @ v_j
            m_i = m_new
        empty = l_i == 0                                             # rows that attended no key
        o_i /= np.where(empty, 1, l_i)[..., None]                   # line 12
        with np.errstate(divide="ignore"):
            lsep[..., rows] = np.where(empty, neg_inf, m_i + np.log(l_i))  # line 13
        op[..., rows, :] = o_i                                       # line 14
    if lay.bh == 1:
        op, lsep = op[None], lsep[None]
    o = lay.unpack_q(op, 1, q.shape).astype(q.dtype, copy=False)
    lse = lay.unpack_q(lsep, 0, q.shape[:-1]).astype(lse_dtype(q, k, v), copy=False)
    return o, lse


def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_q=64, block_k=64):
    """FlashAttention-2 backward pass with recomputation (FA2 Algorithm 2), returning ``(dq, dk, dv)``.

    Needs only O(N) saved statistics: ``lse`` from the forward pass (and ``o``); P is recomputed tile by tile.
    Gradients are of ``sum(O * dO)``; dtypes follow q, k, v; accumulation is float32 (float64 for float64).

      4: D = rowsum(dO * O) (one value per query row), computed once up front.
      5-7: for each key block j: load K_j, V_j; dK_j = 0, dV_j = 0 (causal: start at the first query block
           that can see key block j -- earlier tiles are entirely masked and skipped).
      8-9: for each query block i: load Q_i, dO_i, L_i, D_i.
       10: S = Q_i K_j^T (scale folded into Q; masked only on tiles that cross the diagonal).
       11: P = exp(S - L_i)  -- recomputation; rows with L = -inf (saw no key) get P = 0.
       12: dV_j += P^T dO_i.
       13: dP = dO_i V_j^T.
       14: dS = P * (dP - D_i).
       15: dQ_i += dS K_j  (dQ lives in one float32 (N, d) buffer; ``scale`` is applied once at the end).
       16: dK_j += scale * dS^T Q_i.
       18: write dK_j, dV_j. GQA: the group's query heads are packed rows of the same tile, so the matmuls of
           lines 12 and 16 already sum their gradients onto the shared kv head.
    """
    q, k, v, group, causal, scale, block_q, block_k = _validate(q, k, v, causal, scale, block_q, block_k)
    o = as_float_array(o, "o", min_ndim=2)
    do = as_float_array(do, "do", min_ndim=2)
    lse = as_float_array(lse, "lse", min_ndim=1)
    if o.shape != q.shape:
        raise ValueError(f"o must have the shape of q {q.shape}, got {o.shape}")
    if do.shape != q.shape:
        raise ValueError(f"do must have the shape of q {q.shape}, got {do.shape}")
    if lse.shape != q.shape[:-1]:
        raise ValueError(f"lse must have shape q.shape[:-1] = {q.shape[:-1]}, got {lse.shape}")
    if np.isnan(lse).any() or np.isposinf(lse).any():
        raise ValueError("lse must be finite or -inf (a row that saw no key), as flash_attention_forward "
                         "returns it; it contains NaN or +inf")
    ct = compute_dtype(q, k, v, o, do)
    lay = _Layout(q, k, group)
    nq, nk, g = lay.nq, lay.nk, group
    offset = nk - nq
    qp = lay.pack_q(q, 1, ct)
    qp *= ct.type(scale)
    dop = lay.pack_q(do, 1, ct)
    d_all = np.sum(lay.pack_q(o, 1, ct) * dop, axis=-1)             # line 4
    lp = lay.pack_q(lse, 0, ct)
    lp[~np.isfinite(lp)] = np.inf  # L = -inf (row saw no key): exp(S - inf) = 0, never exp(-inf + inf) = NaN
    kp, vp = lay.pack_kv(k, ct), lay.pack_kv(v, ct)
    dqp = np.zeros_like(qp)
    dkp, dvp = np.zeros_like(kp), np.zeros_like(vp)
    if lay.bh == 1:
        qp, dop, d_all, lp, kp, vp, dqp, dkp, dvp = (a[0] for a in (qp, dop, d_all, lp, kp, vp, dqp, dkp, dvp))
    neg_inf = ct.type(-np.inf)
    for c0, c1 in _ranges(nk, block_k):                              # line 5
        k_j, v_j = kp[..., c0:c1, :], vp[..., c0:c1, :]              # line 6
        dk_j, dv_j = dkp[..., c0:c1, :], dvp[..., c0:c1, :]          # line 7 (zeroed views of the outputs)
        first = max(0, c0 - offset) if causal else 0                 # first query row that sees key c0
        for r0, r1 in _ranges(nq, block_q)[first // block_q:]:       # line 8
            rows = slice(r0 * g, r1 * g)
            q_i, do_i = qp[..., rows, :], dop[..., rows, :]          # line 9
            s = q_i @ np.swapaxes(k_j, -1, -2)                       # line 10
            if causal and c1 - 1 > r0 + offset:
                np.copyto(s, neg_inf, where=~_tile_mask(r0, r1, c0, c1, offset, g))
            s -= lp[..., rows, None]
            p = np.exp(s, out=s)                                     # line 11
            dv_j += np.swapaxes(p, -1, -2) @ do_i                    # line 12
            ds = do_i @ np.swapaxes(v_j, -1, -2)                     # line 13
            ds -= d_all[..., rows, None]
            ds *= p                                                  # line 14
            dqp[..., rows, :] += ds @ k_j                            # line 15
            dk_j += np.swapaxes(ds, -1, -2) @ q_i                    # line 16 (q_i already carries scale)
    dqp *= ct.type(scale)
    if lay.bh == 1:
        dqp, dkp, dvp = dqp[None], dkp[None], dvp[None]
    dq = lay.unpack_q(dqp, 1, q.shape).astype(q.dtype, copy=False)
    return dq, dkp.reshape(k.shape).astype(k.dtype, copy=False), dvp.reshape(v.shape).astype(v.dtype, copy=False)

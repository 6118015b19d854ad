"""Stage 0: standard attention that materialises the full score matrix S and probabilities P.

    S = scale * Q K^T        (Nq x Nk)
    P = softmax(S)           (row-wise, safe softmax with the max trick)
    O = P V                  (Nq x d)

This is the baseline FlashAttention is measured against: it reads and writes the N x N matrices S and P, so its
memory is Theta(N^2). Conventions are docs/design.md §3: ``q (..., Hq, Nq, d)``, ``k, v (..., Hkv, Nk, d)`` (or
single head ``(Nq, d)``), GQA by repeating kv heads (query head h reads kv head h // (Hq // Hkv)), bottom-right
causal mask, and a fully masked row gives output 0 and lse -inf.
"""
from __future__ import annotations


import numpy as np

from ._validate import (as_float_array, check_flag, check_gqa, check_positive_int, check_qkv, check_scale,
                        compute_dtype, lse_dtype, repeat_kv)

__all__ = ["attention", "attention_backward", "causal_mask", "multi_head_attention"]


def causal_mask(nq, nk):
    """Boolean ``(nq, nk)`` mask, True where query i may attend key j: ``j <= i + (nk - nq)`` (bottom-right).

    With nq == nk this is the lower triangle; with nq == 1 (decoding) every key is visible; with nq > nk the
    first ``nq - nk`` rows are all False (they attend nothing).
    """
    nq = check_positive_int(nq, "nq")
    nk = check_positive_int(nk, "nk")
    return np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)


def _probs(q, k, causal, scale, ct):
    """Materialise P = softmax(scale Q K^T) (masked) and the row lse; k already repeated to Hq heads."""
    s = q.astype(ct, copy=False) @ np.swapaxes(k.astype(ct, copy=False), -1, -2)
    s *= ct.type(scale)
    if causal:
        np.copyto(s, -np.inf, where=~causal_mask(q.shape[-2], k.shape[-2]))
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(m == -np.inf, 0, m)  # fully masked row: keep exp(-inf - 0) = 0 instead of NaN
    s -= m  # in place: this baseline keeps one N x N buffer (S, then P) alive, not three
    p = np.exp(s, out=s)
    l = np.sum(p, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(l))[..., 0]  # l == 0 gives lse = -inf
    p /= np.where(l == 0, 1, l)
    return p, lse


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    """Standard attention ``O = softmax(scale Q K^T [+ causal mask]) V``, materialising S and P.

    Returns ``o`` in the input dtype (shape of q), and if ``return_lse`` also ``lse`` (shape ``q.shape[:-1]``,
    float32, or float64 for float64 inputs): the natural-log log-sum-exp of each row of the scaled, masked
    scores. Rows that may attend no key give ``o = 0`` and ``lse = -inf``.
    """
    q, k, v, group = check_qkv(q, k, v)
    causal = check_flag(causal, "causal")
    return_lse = check_flag(return_lse, "return_lse")
    scale = check_scale(scale, q.shape[-1])
    ct = compute_dtype(q, k, v)
    p, lse = _probs(q, repeat_kv(k, group), causal, scale, ct)
    o = (p @ repeat_kv(v, group).astype(ct, copy=False)).astype(q.dtype, copy=False)
    if return_lse:
        return o, lse.astype(lse_dtype(q, k, v), copy=False)
    return o


def _sum_groups(dx: np.ndarray, group: int) -> np.ndarray:
    """Gradient of ``repeat_kv``: sum the ``group`` query heads that read each kv head."""
    if group == 1 or dx.ndim < 3:
        return dx
    return dx.reshape(dx.shape[:-3] + (dx.shape[-3] // group, group) + dx.shape[-2:]).sum(axis=-3)


def attention_backward(q, k, v, do, causal=False, scale=None):
    """Gradients ``(dq, dk, dv)`` of ``sum(O * dO)`` for standard attention, materialising P.

    With P recomputed as in ``attention`` and O = P V:

        dV = P^T dO,  dP = dO V^T,  D = rowsum(dO * O),  dS = P * (dP - D),
        dQ = scale dS K,  dK = scale dS^T Q.

    (D = rowsum(P * dP) = rowsum(dO * O) is the softmax Jacobian term.) For GQA the gradients of each group of
    query heads are summed back onto their kv head. Returns arrays in the dtypes of q, k, v.
    """
    q, k, v, group = check_qkv(q, k, v)
    do = as_float_array(do, "do", min_ndim=2)
    if do.shape != q.shape:
        raise ValueError(f"do must have the shape of q {q.shape}, got {do.shape}")
    causal = check_flag(causal, "causal")
    scale = check_scale(scale, q.shape[-1])
    ct = compute_dtype(q, k, v, do)
    qc, doc = q.astype(ct, copy=False), do.astype(ct, copy=False)
    kr = repeat_kv(k, group).astype(ct, copy=False)
    vr = repeat_kv(v, group).astype(ct, copy=False)
    p, _ = _probs(qc, kr, causal, scale, ct)
    o = p @ vr
    dv = np.swapaxes(p, -1, -2) @ doc
    dp = doc @ np.swapaxes(vr, -1, -2)
    d_row = np.sum(doc * o, axis=-1, keepdims=True)
    ds = p * (dp - d_row)
    dq = (ds @ kr) * ct.type(scale)
    dk = (np.swapaxes(ds, -1, -2) @ qc) * ct.type(scale)
    return (dq.astype(q.dtype, copy=False), _sum_groups(dk, group).astype(k.dtype, copy=False),
            _sum_groups(dv, group).astype(v.dtype, copy=False))


def multi_head_attention(x, w_q, w_k, w_v, w_o, n_heads, n_kv_heads=None, causal=False):
    """Multi-head (or grouped-query) self-attention layer without biases.

    ``x (..., N, d_model)``; ``w_q (d_model, n_heads * d_head)``; ``w_k, w_v (d_model, n_kv_heads * d_head)``;
    ``w_o (n_heads * d_head, d_model)``. Projections are split into heads ``(..., H, N, d_head)``, attended with
    ``attention`` (GQA when ``n_kv_heads < n_heads``), concatenated and projected by ``w_o``. Returns
    ``(..., N, d_model)`` in the promoted dtype of the inputs.
    """
    x = as_float_array(x, "x", min_ndim=2)
    w_q, w_k, w_v, w_o = (as_float_array(w, name, min_ndim=2)
                          for w, name in ((w_q, "w_q"), (w_k, "w_k"), (w_v, "w_v"), (w_o, "w_o")))
    n_heads = check_positive_int(n_heads, "n_heads")
    n_kv_heads = n_heads if n_kv_heads is None else check_positive_int(n_kv_heads, "n_kv_heads")
    causal = check_flag(causal, "causal")
    check_gqa(n_heads, n_kv_heads, "n_heads", "n_kv_heads")
    d_model = x.shape[-1]
    for w, name in ((w_q, "w_q"), (w_k, "w_k"), (w_v, "w_v"), (w_o, "w_o")):
        if w.ndim != 2:
            raise ValueError(f"{name} must be a 2-D matrix, got shape {w.shape}")
    if w_q.shape[0] != d_model or w_q.shape[1] % n_heads:
        raise ValueError(f"w_q must have shape (d_model={d_model}, n_heads*d_head) with n_heads={n_heads}, "
                         f"got {w_q.shape}")
    d_head = w_q.shape[1] // n_heads
    if d_head == 0:
        raise ValueError(f"w_q must have at least one column per head, got shape {w_q.shape}")
    for w, name in ((w_k, "w_k"), (w_v, "w_v")):
        if w.shape != (d_model, n_kv_heads * d_head):
            raise ValueError(f"{name} must have shape (d_model, n_kv_heads*d_head) = "
                             f"{(d_model, n_kv_heads * d_head)}, got {w.shape}")
    if w_o.shape != (n_heads * d_head, d_model):
        raise ValueError(f"w_o must have shape (n_heads*d_head, d_model) = {(n_heads * d_head, d_model)}, "
                         f"got {w_o.shape}")
    out_dtype = np.result_type(x, w_q, w_k, w_v, w_o)
    ct = compute_dtype(x, w_q, w_k, w_v, w_o)
    xc = x.astype(ct, copy=False)

    def heads(w, h):  # (..., N, h*d_head) -> (..., h, N, d_head)
        y = xc @ w.astype(ct, copy=False)
        return np.swapaxes(y.reshape(y.shape[:-1] + (h, d_head)), -2, -3)

    o = attention(heads(w_q, n_heads), heads(w_k, n_kv_heads), heads(w_v, n_kv_heads), causal=causal)
    o = np.swapaxes(o, -2, -3)
    o = o.reshape(o.shape[:-2] + (n_heads * d_head,))
    return (o @ w_o.astype(ct, copy=False)).astype(out_dtype, copy=False)

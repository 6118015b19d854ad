"""Variable-length ("varlen") attention: many sequences packed into one tensor, no padding.

A serving engine batches prompts of different lengths. Padding them to the longest wastes memory and compute
on pad tokens; FlashAttention's varlen API instead concatenates the sequences along the token axis and passes
their boundaries as cumulative lengths:

    q (total_q, Hq, d),  k, v (total_k, Hkv, d),
    cu_seqlens_q = [0, n_q(0), n_q(0) + n_q(1), ..., total_q]      (B + 1 integers, non-decreasing)
    cu_seqlens_k = [0, n_k(0), ..., total_k]

Sequence ``b`` owns query rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1`` and key rows
``cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1``; its queries never see another sequence's keys. Inside a sequence
the rules are the course's (``docs/design.md §3``): GQA (query head ``h`` reads kv head ``h // (Hq // Hkv)``),
bottom-right causal alignment (row ``i`` sees key ``j`` iff ``j <= i + n_k - n_q``), and a row that sees no key
gives ``o = 0``, ``lse = -inf``. A sequence may be empty (``n_q = 0`` or ``n_k = 0``).

This NumPy version is the readable definition: a loop over sequences calling standard attention
(``reference.numpy.attention``). ``reference.triton.flash_attention_varlen`` is the fast one.
"""
from __future__ import annotations

import numpy as np

from ._validate import as_float_array, check_flag, check_gqa, check_scale, compute_dtype, lse_dtype
from ._validate import check_cu_seqlens  # noqa: F401  (public here too)
from .attention import attention, attention_backward

__all__ = ["varlen_attention", "varlen_attention_backward", "check_cu_seqlens"]


def _check_packed(q, k, v):
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 3:
            raise ValueError(f"{name} must be packed as (total_tokens, heads, d), got shape {x.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (total_k, Hkv, d), got k {k.shape} and v {v.shape}")
    if q.shape[2] != k.shape[2] or q.shape[2] == 0:
        raise ValueError(f"q and k must have the same positive head dimension d, got q {q.shape} and k {k.shape}")
    check_gqa(q.shape[1], k.shape[1])
    return q, k, v


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale):
    q, k, v = _check_packed(q, k, v)
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    cu_k = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0], batch=cu_q.shape[0] - 1)
    return q, k, v, cu_q, cu_k, check_flag(causal, "causal"), check_scale(scale, q.shape[2])


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None):
    """Attention of each packed sequence to its own keys; returns ``(o, lse)``.

    ``o[cu_q[b]:cu_q[b+1]] = attention(q_b, k_b, v_b)`` for every sequence ``b`` (module docstring), with
    ``o (total_q, Hq, d)`` in q's dtype and ``lse (Hq, total_q)`` (natural log, float32; float64 for float64
    inputs) -- the layout of FlashAttention's varlen forward. Rows that see no key: ``o = 0``, ``lse = -inf``.
    """
    q, k, v, cu_q, cu_k, causal, scale = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale)
    o = np.zeros(q.shape, dtype=q.dtype)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf, dtype=lse_dtype(q, k, v))
    for b in range(cu_q.shape[0] - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0 or k1 == k0:  # no query, or no key: o = 0, lse = -inf
            continue
        ob, lb = attention(q[q0:q1].swapaxes(0, 1), k[k0:k1].swapaxes(0, 1), v[k0:k1].swapaxes(0, 1),
                           causal=causal, scale=scale, return_lse=True)  # (H, n, d): head-major per sequence
        o[q0:q1] = ob.swapaxes(0, 1)
        lse[:, q0:q1] = lb
    return o, lse


def varlen_attention_backward(q, k, v, do, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None):
    """Gradients ``(dq, dk, dv)`` of ``sum(o * do)`` for :func:`varlen_attention`, sequence by sequence.

    Each sequence's gradients are standard attention's (``attention_backward``: dV = P^T dO, dS = P (dP - D),
    dQ = scale dS K, dK = scale dS^T Q); keys of a sequence no query sees get ``dk = dv = 0``.
    """
    q, k, v, cu_q, cu_k, causal, scale = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale)
    do = as_float_array(do, "do")
    if do.shape != q.shape:
        raise ValueError(f"do must have the shape of q {q.shape}, got {do.shape}")
    ct = compute_dtype(q, k, v, do)
    dq, dk, dv = np.zeros(q.shape, ct), np.zeros(k.shape, ct), np.zeros(v.shape, ct)
    for b in range(cu_q.shape[0] - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        g = attention_backward(*(x.swapaxes(0, 1) for x in (q[q0:q1], k[k0:k1], v[k0:k1], do[q0:q1])),
                               causal=causal, scale=scale)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (x.swapaxes(0, 1) for x in g)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)

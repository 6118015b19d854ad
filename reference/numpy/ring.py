"""One ring-attention step in NumPy, on global positions: the reference for the optional assignment a6_ring.

Rank ``r`` at ring step ``s`` holds its queries (global positions ``q_pos``) and a visiting K/V chunk (global
positions ``k_pos``). Under the causal rule "key ``t`` is visible to query ``p`` iff ``t <= p``" (self-attention,
``Nq = Nk``) the chunk's attention ``(o_b, lse_b)`` is computed with that mask, and folded into the running state
with the recursive-attention merge (``reference.numpy.merge.merge_states``). A query that sees none of the chunk
has ``lse_b = -inf`` and keeps its state unchanged; if its state is empty too, it stays ``o = 0``,
``lse = -inf``. The torch ring (``reference.distributed.ring_attention``) does the same per kernel call.

``ring_backward_step`` is the backward of one step (FlashAttention-2's backward, Algorithm 2, on one key
chunk): with the *global* ``lse`` and ``delta = rowsum(dO * O)`` of the rank's queries, the chunk's
probabilities ``P = exp(S - lse)`` are exact without seeing the other chunks, so the rank adds the chunk's share
to its own ``dq`` (dQ stays local) and its share to the chunk's ``dk, dv`` accumulators (which travel on with
the chunk and reach its owner after ``W`` hops).
"""
from __future__ import annotations

import numpy as np

from ._validate import as_float_array, check_qkv, check_scale, compute_dtype, repeat_kv
from .merge import merge_states


def _positions(x, name: str, n: int) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind not in "iu" or x.shape != (n,):
        raise ValueError(f"{name} must be an integer array of shape ({n},), got {x.dtype} {x.shape}")
    return x


def _check_step(q, k, q_pos, k_pos, causal, scale):
    """The checks ``ring_step`` and ``ring_backward_step`` share: ``q_pos`` (nq,) and ``k_pos`` (nk,) integer
    positions, a bool ``causal``, the scale; return ``(q_pos, k_pos, scale)``."""
    q_pos = _positions(q_pos, "q_pos", q.shape[-2])
    k_pos = _positions(k_pos, "k_pos", k.shape[-2])
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    return q_pos, k_pos, check_scale(scale, q.shape[-1])


def ring_step(o, lse, q, k, v, q_pos, k_pos, causal=True, scale=None):
    """Merge the attention of ``q (..., Hq, nq, d)`` to the visiting ``k, v (..., Hkv, nk, d)`` into the state
    ``o (..., Hq, nq, d)``, ``lse (..., Hq, nq)``; return the new ``(o, lse)`` in the dtypes of ``o`` and ``lse``.

    Scores ``S = scale q k^T`` (GQA: query head h reads kv head h // (Hq // Hkv)), masked to ``k_pos[j] <=
    q_pos[i]`` when ``causal``; ``lse_b = log sum exp S`` per row; ``o_b = softmax(S) v``; then
    ``merge_states(o, lse, o_b, lse_b)``.
    """
    k_arr = as_float_array(k, "k", min_ndim=2)
    if k_arr.shape[-2] == 0:   # an empty visiting chunk (ragged rings have them): the state is unchanged
        o, lse = as_float_array(o, "o", min_ndim=2), as_float_array(lse, "lse", min_ndim=1)
        if lse.shape != o.shape[:-1]:
            raise ValueError(f"lse must have shape {o.shape[:-1]} to match o {o.shape}, got {lse.shape}")
        return o.copy(), lse.copy()
    q, k, v, group = check_qkv(q, k, v)
    o = as_float_array(o, "o", min_ndim=2)
    lse = as_float_array(lse, "lse", min_ndim=1)
    if o.shape != q.shape or lse.shape != q.shape[:-1]:
        raise ValueError(f"o must have q's shape {q.shape} and lse {q.shape[:-1]}, got {o.shape} and {lse.shape}")
    q_pos, k_pos, scale = _check_step(q, k, q_pos, k_pos, causal, scale)
    acc = compute_dtype(q, k, v)
    s = (q.astype(acc) @ np.swapaxes(repeat_kv(k, group).astype(acc), -1, -2)) * scale
    if causal:
        s = np.where(k_pos[None, :] <= q_pos[:, None], s, -np.inf)
    m = s.max(axis=-1)
    m_safe = np.where(np.isfinite(m), m, 0.0)                   # rows that see nothing: no -inf - -inf
    e = np.exp(s - m_safe[..., None])
    total = e.sum(axis=-1)
    seen = total > 0
    with np.errstate(divide="ignore"):
        lse_b = np.where(seen, m_safe + np.log(np.where(seen, total, 1.0)), -np.inf)
    o_b = (e @ repeat_kv(v, group).astype(acc)) / np.where(seen, total, 1.0)[..., None]
    o_new, lse_new = merge_states(o, lse, o_b, lse_b)
    return o_new.astype(o.dtype), lse_new.astype(lse.dtype)


def ring_backward_step(dq, dk, dv, q, k, v, do, lse, delta, q_pos, k_pos, causal=True, scale=None):
    """Add one visiting chunk's gradient shares: return ``(dq + dq_b, dk + dk_b, dv + dv_b)`` in the dtypes of
    ``dq (..., Hq, nq, d)``, ``dk, dv (..., Hkv, nk, d)``.

    FA2 Algorithm 2 on one key chunk, with the global ``lse, delta (..., Hq, nq)``: ``P = exp(scale q k^T -
    lse)`` (0 where ``causal`` and ``k_pos[j] > q_pos[i]``), ``dv_b = P^T do``, ``dS = P (do v^T - delta)``,
    ``dq_b = scale dS k``, ``dk_b = scale dS^T q``; GQA: ``dk_b, dv_b`` of a kv head summed over its query heads.
    """
    q, k, v, group = check_qkv(q, k, v)
    do = as_float_array(do, "do", min_ndim=2)
    lse, delta = as_float_array(lse, "lse", min_ndim=1), as_float_array(delta, "delta", min_ndim=1)
    dq, dk, dv = (as_float_array(x, name, min_ndim=2) for x, name in ((dq, "dq"), (dk, "dk"), (dv, "dv")))
    if do.shape != q.shape or dq.shape != q.shape:
        raise ValueError(f"do and dq must have q's shape {q.shape}, got do {do.shape}, dq {dq.shape}")
    if dk.shape != k.shape or dv.shape != v.shape:
        raise ValueError(f"dk and dv must have k's shape {k.shape}, got dk {dk.shape}, dv {dv.shape}")
    if lse.shape != q.shape[:-1] or delta.shape != q.shape[:-1]:
        raise ValueError(f"lse and delta must have shape {q.shape[:-1]}, got lse {lse.shape}, delta {delta.shape}")
    q_pos, k_pos, scale = _check_step(q, k, q_pos, k_pos, causal, scale)
    acc = compute_dtype(q, k, v, do, dq, dk, dv)
    qa, doa = q.astype(acc), do.astype(acc)
    ke, ve = repeat_kv(k, group).astype(acc), repeat_kv(v, group).astype(acc)
    s = (qa @ np.swapaxes(ke, -1, -2)) * scale
    p = np.exp(s - lse.astype(acc)[..., None])
    if causal:
        p = np.where(k_pos[None, :] <= q_pos[:, None], p, 0.0)
    dp = doa @ np.swapaxes(ve, -1, -2)
    ds = p * (dp - delta.astype(acc)[..., None])
    dq_b = (ds @ ke) * scale
    dk_b = (np.swapaxes(ds, -1, -2) @ qa) * scale
    dv_b = np.swapaxes(p, -1, -2) @ doa

    def per_kv_head(x):      # (..., Hq, nk, d) -> (..., Hkv, nk, d): sum over each kv head's group
        return x.reshape(*x.shape[:-3], x.shape[-3] // group, group, *x.shape[-2:]).sum(axis=-3)

    return ((dq.astype(acc) + dq_b).astype(dq.dtype), (dk.astype(acc) + per_kv_head(dk_b)).astype(dk.dtype),
            (dv.astype(acc) + per_kv_head(dv_b)).astype(dv.dtype))

"""One ring-attention step in NumPy, on global positions: the reference for the optional assignment a6_ring.

Rank ``r`` at ring step ``s`` holds its queries (global positions ``q_pos``) and a visiting K/V chunk (global
positions ``k_pos``). Under the causal rule "key ``t`` is visible to query ``p`` iff ``t <= p``" (self-attention,
``Nq = Nk``) the chunk's attention ``(o_b, lse_b)`` is computed with that mask, and folded into the running state
with the recursive-attention merge (``reference.numpy.merge.merge_states``). A query that sees none of the chunk
has ``lse_b = -inf`` and keeps its state unchanged; if its state is empty too, it stays ``o = 0``,
``lse = -inf``. The torch ring (``reference.distributed.ring_attention``) does the same per kernel call.
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
    q_pos = _positions(q_pos, "q_pos", q.shape[-2])
    k_pos = _positions(k_pos, "k_pos", k.shape[-2])
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    scale = check_scale(scale, q.shape[-1])
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

"""The serving path in NumPy: chunked prefill over a paged KV cache, and cascade decode for a shared prefix.

*Paged (chunked) prefill.* A long prompt is prefilled in chunks, and a prompt whose beginning is already
cached (prefix caching) only computes its new tokens. Either way the new chunk's queries attend causally to
their own chunk and fully to everything before it, which already sits in ``PagedKVCache`` blocks. With the
chunk's K/V appended to the cache first (as vLLM does), this is bottom-right causal attention of the chunk's
``n_q`` queries over the sequence's ``seq_len`` cached keys: row ``i`` sees key ``j`` iff
``j <= i + seq_len - n_q``.

*Cascade decode.* When B requests share one prefix (a system prompt), decode attention splits each request's
keys into two disjoint sets, the shared prefix and its own suffix. Attention over a union of disjoint key sets
is the merge of the attention states over each set (``reference.numpy.merge.merge_states``; FlashInfer,
"recursive attention"), so the prefix is attended ONCE for all B queries -- one (B * G) x P matrix product per
kv head, reading the prefix's K/V once -- and each suffix separately; the two states are then merged.
"""
from __future__ import annotations

import numpy as np

from ._validate import (as_float_array, check_block_tables, check_cu_seqlens, check_paged_caches, check_scale,
                        compute_dtype, lse_dtype)
from .attention import attention
from .merge import merge_states
from .varlen import varlen_attention

__all__ = ["paged_prefill", "cascade_decode", "gather_paged"]


def _check_caches(k_cache, v_cache, d: int, hq: int):
    k_cache, v_cache = check_paged_caches(k_cache, v_cache, d, hq)
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must have the same dtype, got {k_cache.dtype} and {v_cache.dtype}")
    return k_cache, v_cache


def gather_paged(k_cache, v_cache, tables, lens):
    """Packed ``(sum(lens), Hkv, d)`` copies of each sequence's first ``lens[b]`` keys and values, read
    through its block table row (validated ``tables``/``lens`` from ``check_block_tables``)."""
    bs, hkv, d = k_cache.shape[1:]
    ks, vs = [], []
    for row, n in zip(tables, lens):
        blocks = row[:-(-int(n) // bs)]
        ks.append(k_cache[blocks].reshape(-1, hkv, d)[:n])
        vs.append(v_cache[blocks].reshape(-1, hkv, d)[:n])
    return np.concatenate(ks), np.concatenate(vs)


def paged_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, causal=True, scale=None):
    """Prefill a chunk of each sequence against its paged KV cache; returns ``(o, lse)``.

    Args:
        q: ``(total_q, Hq, d)`` the chunks' queries, packed (varlen layout, sequence ``b`` owns rows
            ``cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1``).
        k_cache, v_cache: ``(num_blocks, block_size, Hkv, d)`` holding every sequence's keys, the chunk's own
            included (append it before attending).
        block_tables: ``(B, max_blocks)`` int, padded with -1; seq_lens: ``(B,)`` keys in the cache per sequence.
        causal: bottom-right causal (the chunk is the last ``n_q`` positions of its sequence).
    Returns:
        ``o (total_q, Hq, d)`` and ``lse (Hq, total_q)``, as :func:`reference.numpy.varlen.varlen_attention`
        over the gathered keys (which is what this computes: gather, then attend).
    """
    q = as_float_array(q, "q")
    if q.ndim != 3:
        raise ValueError(f"q must be packed as (total_q, Hq, d), got shape {q.shape}")
    k_cache, v_cache = _check_caches(k_cache, v_cache, q.shape[2], q.shape[1])
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    tables, lens = check_block_tables(block_tables, seq_lens, cu_q.shape[0] - 1, *k_cache.shape[:2])
    k, v = gather_paged(k_cache, v_cache, tables, lens)
    cu_k = np.concatenate([[0], np.cumsum(lens)])
    return varlen_attention(q, k, v, cu_q, cu_k, causal=causal, scale=scale)


def cascade_decode(q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, scale=None):
    """Decode attention of B requests over a shared prefix plus their own paged suffixes; ``(o, lse)``.

    Request ``b`` attends to ``concat(prefix, suffix_b)``. The prefix state is computed once for the whole
    batch: the ``G = Hq / Hkv`` query heads of every request that read kv head ``h`` are stacked into one
    ``(B * G, d)`` block, so the prefix's K/V are read once (not B times). The suffix state comes from each
    request's blocks; ``merge_states`` combines the two (lse rule).

    Args:
        q: ``(B, Hq, d)`` one query token per request.
        prefix_k, prefix_v: ``(P, Hkv, d)`` the shared prefix, ``P >= 1``.
        k_cache, v_cache, block_tables, seq_lens: each request's suffix in a paged cache, as in
            ``reference.numpy.paged.paged_attention``; ``seq_lens[b] >= 0`` suffix tokens (0: prefix only).
    Returns:
        ``o (B, Hq, d)`` in q's dtype and ``lse (B, Hq)`` over the whole of each request's keys.
    """
    q = as_float_array(q, "q")
    if q.ndim != 3:
        raise ValueError(f"q must have shape (B, Hq, d) (one query token per request), got {q.shape}")
    B, hq, d = q.shape
    prefix_k = as_float_array(prefix_k, "prefix_k")
    prefix_v = as_float_array(prefix_v, "prefix_v")
    if prefix_k.ndim != 3 or prefix_k.shape[0] == 0 or prefix_k.shape[2] != d:
        raise ValueError(f"prefix_k must have shape (P, Hkv, d) with P >= 1 and d = {d}, got {prefix_k.shape}")
    if prefix_v.shape != prefix_k.shape:
        raise ValueError(f"prefix_v must have the shape of prefix_k {prefix_k.shape}, got {prefix_v.shape}")
    k_cache, v_cache = _check_caches(k_cache, v_cache, d, hq)
    hkv = k_cache.shape[2]
    if prefix_k.shape[1] != hkv:
        raise ValueError(f"prefix_k must have Hkv = {hkv} heads (as k_cache), got {prefix_k.shape}")
    tables, lens = check_block_tables(block_tables, seq_lens, B, *k_cache.shape[:2])
    scale = check_scale(scale, d)
    g = hq // hkv
    ct = compute_dtype(q, prefix_k, prefix_v, k_cache, v_cache)
    # prefix: rows (B*G) of kv head h = query heads h*G .. h*G+G-1 of every request, one matmul per kv head
    q_rows = q.astype(ct).reshape(B, hkv, g, d).transpose(1, 0, 2, 3).reshape(hkv, B * g, d)
    o_p, lse_p = attention(q_rows, prefix_k.astype(ct).swapaxes(0, 1), prefix_v.astype(ct).swapaxes(0, 1),
                           scale=scale, return_lse=True)
    o_p = o_p.reshape(hkv, B, g, d).transpose(1, 0, 2, 3).reshape(B, hq, d)
    lse_p = lse_p.reshape(hkv, B, g).transpose(1, 0, 2).reshape(B, hq)
    # suffixes: one decode query per request over its own blocks (a request with no suffix: o = 0, lse = -inf)
    o_s = np.zeros((B, hq, d), ct)
    lse_s = np.full((B, hq), -np.inf, ct)
    if lens.sum() > 0:
        k, v = gather_paged(k_cache, v_cache, tables, lens)
        cu = np.concatenate([[0], np.cumsum(lens)])
        o_v, lse_v = varlen_attention(q.astype(ct), k.astype(ct), v.astype(ct), np.arange(B + 1), cu,
                                      scale=scale)
        o_s, lse_s = o_v, lse_v.T
    o, lse = merge_states(o_p[:, :, None], lse_p[:, :, None], o_s[:, :, None], lse_s[:, :, None])
    return o[:, :, 0].astype(q.dtype), lse[:, :, 0].astype(lse_dtype(q, prefix_k, k_cache))

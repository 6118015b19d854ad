"""A mixed prefill + decode step in NumPy: one batch of prefill chunks and decode rows over a paged KV cache.

A serving engine's step (vLLM V1, FlashInfer's batch attention) does not run prefill and decode as separate
kernels: it packs every request's new tokens into one varlen batch -- ``n_q = 1`` for a request that decodes,
``n_q = chunk`` for one that prefills part of its prompt -- appends their K/V to the paged cache, and runs ONE
attention call. With each request's keys in the cache, every request is the same problem: its ``n_q`` new
queries are the last ``n_q`` of ``seq_len`` positions, so query ``i`` sees key ``j`` iff
``j <= i + seq_len - n_q`` (bottom-right causal; a decode row, ``n_q = 1``, sees all ``seq_len`` keys).

``mixed_attention`` is that definition, row by row. ``mixed_plan`` is how a kernel divides the work, and
``mixed_attention_by_plan`` runs the plan in NumPy to show it computes the same thing:

* a request's queries are cut into *tiles* of ``tile_tokens`` tokens; the ``G = Hq / Hkv`` query heads that
  read one kv head are stacked into the tile's rows (GQA packing: a tile of ``t`` tokens is ``t * G`` rows,
  and each key block is loaded once per kv head). Tiles of short requests (decode rows) use a small tile
  (``small_rows``), the others a large one (``large_rows``), so a decode row does not multiply 128 mostly
  empty rows;
* a tile's keys are those its last token sees, ``[0, seq_len - n_q + t0 + t)``; when there are more than
  ``split_keys`` of them they are cut into *splits* (Flash-Decoding), each giving a partial state
  ``(o_s, lse_s)`` that ``merge_states`` folds (lse rule: ``lse = log sum_s exp(lse_s)``,
  ``o = sum_s exp(lse_s - lse) o_s``). Short decodes are one work item; a 32k decode is several, so no
  program streams a whole long context while the others idle.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._validate import (as_float_array, check_block_tables, check_cu_seqlens, check_paged_caches, check_positive_int,
                        check_scale, compute_dtype, lse_dtype)
from .merge import merge_many

__all__ = ["mixed_attention", "mixed_plan", "mixed_attention_by_plan", "MixedPlan", "check_mixed_lengths"]


def check_mixed_lengths(q_lens, seq_lens):
    """Every request holds its own new tokens: ``seq_lens[b] >= n_q[b]`` (the chunk's K/V are appended to the
    cache before attending). Raises ValueError naming seq_lens and the first request that breaks it."""
    short = np.nonzero(np.asarray(seq_lens) < np.asarray(q_lens))[0]
    if short.size:
        b = int(short[0])
        raise ValueError(f"seq_lens[{b}] = {int(seq_lens[b])} is less than request {b}'s query count "
                         f"n_q = {int(q_lens[b])} (cu_seqlens_q): append the new tokens' K/V to the cache first")


def _check(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens):
    q = as_float_array(q, "q")
    if q.ndim != 3:
        raise ValueError(f"q must be packed as (total_q, Hq, d), got shape {q.shape}")
    k_cache, v_cache = check_paged_caches(k_cache, v_cache, q.shape[2], q.shape[1])
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must have the same dtype, got {k_cache.dtype} and {v_cache.dtype}")
    cu = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    tables, lens = check_block_tables(block_tables, seq_lens, cu.shape[0] - 1, *k_cache.shape[:2])
    check_mixed_lengths(np.diff(cu), lens)
    return q, k_cache, v_cache, cu, tables, lens


def _keys(cache, table, n, bs):
    """The first ``n`` rows of a sequence, read page by page through its block-table row: ``(n, Hkv, d)``."""
    pages = [cache[table[p]] for p in range(-(-n // bs))]
    return np.concatenate(pages)[:n] if pages else cache[:0, 0]


def mixed_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale=None):
    """Attention of a mixed batch (prefill chunks and decode rows) over a paged KV cache; ``(o, lse)``.

    Args:
        q: ``(total_q, Hq, d)`` every request's new queries, packed: request ``b`` owns rows
            ``cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1`` (one row for a decode, a chunk for a prefill, zero rows
            allowed).
        k_cache, v_cache: ``(num_blocks, block_size, Hkv, d)``, already holding the new tokens' K/V.
        block_tables: ``(B, max_blocks)`` int, padded with -1; seq_lens: ``(B,)`` keys of request ``b``,
            ``>= n_q[b]``.
    Returns:
        ``o (total_q, Hq, d)`` in q's dtype and ``lse (Hq, total_q)`` (natural log): row ``i`` of request ``b``
        attends keys ``0 .. seq_lens[b] - n_q[b] + i`` (bottom-right causal), query head ``h`` reading kv
        head ``h // (Hq // Hkv)``.
    """
    q, k_cache, v_cache, cu, tables, lens = _check(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens)
    scale = check_scale(scale, q.shape[2])
    ct = compute_dtype(q, k_cache, v_cache)
    hq, hkv = q.shape[1], k_cache.shape[2]
    g = hq // hkv
    o = np.zeros(q.shape, ct)
    lse = np.full((hq, q.shape[0]), -np.inf, ct)
    for b in range(cu.shape[0] - 1):
        n_q, n = int(cu[b + 1] - cu[b]), int(lens[b])
        if n_q == 0:
            continue
        k = _keys(k_cache, tables[b], n, k_cache.shape[1]).astype(ct)
        v = _keys(v_cache, tables[b], n, k_cache.shape[1]).astype(ct)
        for i in range(n_q):
            row, seen = int(cu[b]) + i, n - n_q + i + 1          # keys 0 .. n - n_q + i
            for h in range(hq):
                s = k[:seen, h // g] @ q[row, h].astype(ct) * scale
                m = s.max()
                p = np.exp(s - m)
                o[row, h] = p @ v[:seen, h // g] / p.sum()
                lse[h, row] = m + np.log(p.sum())
    return o.astype(q.dtype), lse.astype(lse_dtype(q, k_cache, v_cache))


class MixedPlan(NamedTuple):
    """Work items of a mixed batch: ``items (n_items, 9)`` int32 columns ``ITEM_COLUMNS``, the heaviest first.

    ``n_slots``: partial-state slots (one per split of a tile cut into several; 0 when none is); ``q_lens``,
    ``seq_lens``: the host lengths the plan was made for; the tile shapes it assumed.
    """
    items: np.ndarray
    n_slots: int
    q_lens: np.ndarray
    seq_lens: np.ndarray
    group: int
    small_rows: int
    large_rows: int
    split_keys: int
    causal: bool = True


#: columns of ``MixedPlan.items``: request, first token of the tile, tokens in it, key range [k_lo, k_hi),
#: large tile (1) or small (0), splits of the tile, its first partial slot (-1: one split), this item's split
ITEM_COLUMNS = ("b", "t0", "n_tok", "k_lo", "k_hi", "large", "n_splits", "slot0", "split")


def mixed_plan(q_lens, seq_lens, group, small_rows=16, large_rows=64, split_keys=4096, align=64, causal=True):
    """Cut a mixed batch into work items (module docstring); returns a :class:`MixedPlan`.

    q_lens, seq_lens: ``(B,)`` ints (host values); group: ``G = Hq / Hkv``; small_rows / large_rows: rows of the
    two tile shapes (a tile holds ``rows // G`` tokens; requests with at most ``small_rows // G`` tokens get a
    small tile); split_keys: most keys per work item, a multiple of ``align`` (split boundaries fall on key-block
    and page boundaries). Items are sorted by work (keys x rows), the heaviest first: GPU programs launch in
    order, so long items do not start last and leave the tail to one SM. ``causal=False``: every tile sees all
    ``seq_len`` keys (a non-causal paged prefill).
    """
    q_lens = np.asarray(q_lens, dtype=np.int64).reshape(-1)
    seq_lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
    group = check_positive_int(group, "group")
    small_rows, large_rows = check_positive_int(small_rows, "small_rows"), check_positive_int(large_rows, "large_rows")
    split_keys, align = check_positive_int(split_keys, "split_keys"), check_positive_int(align, "align")
    if small_rows < group or large_rows < group:
        raise ValueError(f"small_rows and large_rows must hold at least one token of G = {group} rows, got "
                         f"{small_rows} and {large_rows}")
    if split_keys % align:
        raise ValueError(f"split_keys must be a multiple of align = {align}, got {split_keys}")
    if q_lens.shape != seq_lens.shape:
        raise ValueError(f"q_lens and seq_lens must have the same shape (B,), got {q_lens.shape} and {seq_lens.shape}")
    check_mixed_lengths(q_lens, seq_lens)
    small_tok, large_tok = small_rows // group, large_rows // group
    items, slots = [], 0
    for b, (n_q, n) in enumerate(zip(q_lens.tolist(), seq_lens.tolist())):
        large = int(n_q > small_tok)
        tok = large_tok if large else small_tok
        for t0 in range(0, n_q, tok):
            n_tok = min(tok, n_q - t0)
            hi = n - n_q + t0 + n_tok if causal else n     # the keys the tile's last token sees
            n_splits = max(1, -(-hi // split_keys))
            slot0 = slots if n_splits > 1 else -1
            slots += n_splits if n_splits > 1 else 0
            for s in range(n_splits):
                items.append((b, t0, n_tok, s * split_keys, min(hi, (s + 1) * split_keys), large, n_splits, slot0, s))
    arr = np.asarray(items, dtype=np.int32).reshape(-1, len(ITEM_COLUMNS))
    work = (arr[:, 4].astype(np.int64) - arr[:, 3]) * np.where(arr[:, 5] == 1, large_rows, small_rows)
    arr = arr[np.argsort(-work, kind="stable")]
    return MixedPlan(arr, slots, q_lens, seq_lens, group, small_rows, large_rows, split_keys, bool(causal))


def mixed_attention_by_plan(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, plan: MixedPlan,
                            scale=None):
    """``mixed_attention`` computed the kernel's way: item by item of ``plan``, GQA-packed tiles, partial states
    of split tiles merged with the lse rule (``merge_many``). Returns ``(o, lse)`` as ``mixed_attention``."""
    q, k_cache, v_cache, cu, tables, lens = _check(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens)
    if not (np.array_equal(plan.q_lens, np.diff(cu)) and np.array_equal(plan.seq_lens, lens)) or not plan.causal:
        raise ValueError("plan was made for other lengths than cu_seqlens_q / seq_lens; make it with mixed_plan")
    scale = check_scale(scale, q.shape[2])
    ct = compute_dtype(q, k_cache, v_cache)
    hq, hkv, d = q.shape[1], k_cache.shape[2], q.shape[2]
    g = hq // hkv
    o = np.zeros(q.shape, ct)
    lse = np.full((hq, q.shape[0]), -np.inf, ct)
    parts: dict = {}
    for b, t0, n_tok, k_lo, k_hi, _, n_splits, _, _ in plan.items.tolist():
        n_q, n = int(cu[b + 1] - cu[b]), int(lens[b])
        k = _keys(k_cache, tables[b], k_hi, k_cache.shape[1])[k_lo:].astype(ct)   # (keys, Hkv, d)
        v = _keys(v_cache, tables[b], k_hi, k_cache.shape[1])[k_lo:].astype(ct)
        rows = q[cu[b] + t0:cu[b] + t0 + n_tok].astype(ct).reshape(n_tok, hkv, g, d)  # token-major, then head
        pos = np.arange(k_lo, k_hi)
        for h in range(hkv):
            tile = rows[:, h].reshape(n_tok * g, d)                                  # row r: token r // G, head r % G
            s = tile @ k[:, h].T * scale
            seen = pos[None, :] <= (n - n_q + t0 + np.arange(n_tok * g) // g)[:, None]
            s = np.where(seen, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            m_safe = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(s - m_safe)
            den = p.sum(axis=1, keepdims=True)
            o_t = (p @ v[:, h]) / np.where(den > 0, den, 1.0)
            l_t = np.where(den[:, 0] > 0, m_safe[:, 0] + np.log(np.where(den[:, 0] > 0, den[:, 0], 1.0)), -np.inf)
            parts.setdefault((b, t0, h), []).append((o_t, l_t))
            if len(parts[(b, t0, h)]) < n_splits:
                continue
            o_m, l_m = merge_many([x[0] for x in parts[(b, t0, h)]], [x[1] for x in parts[(b, t0, h)]])
            r0 = int(cu[b]) + t0
            o[r0:r0 + n_tok, h * g:(h + 1) * g] = o_m.reshape(n_tok, g, d)
            lse[h * g:(h + 1) * g, r0:r0 + n_tok] = l_m.reshape(n_tok, g).T
    return o.astype(q.dtype), lse.astype(lse_dtype(q, k_cache, v_cache))

"""Cascade decode in ONE launch: a shared prefix read once for the batch, each request's paged suffix, merged.

Definition: ``reference.numpy.serving.cascade_decode`` (attention over prefix + suffix = the merge of the two
states, FlashInfer's recursive attention). The earlier Triton version (``experiments.serving_baselines.cascade_decode_separate``)
ran a dense FA2 call over the prefix, a paged varlen call over the suffixes and a merge kernel: three to four
launches and a dozen host-side tensor operations, 3.8x its CUDA-graph time when called eagerly. Here one
kernel has two kinds of programs, ``(item, kv head)``:

* **prefix items** ``(tile, split)``: a tile is ``ROWS`` query rows of the batch, the ``G`` query heads of kv
  head ``h`` of ``ROWS / G`` consecutive requests (row ``r``: request ``tile * ROWS/G + r // G``, head
  ``h * G + r % G``), over one of ``S`` chunks of the prefix's keys (contiguous ``(P, Hkv, d)``), so the
  prefix is read ``ceil(B G / ROWS)`` times per kv head instead of ``B`` times;
* **suffix items** ``b``: request ``b``'s ``G`` rows over its own pages (page-aligned key blocks,
  ``reference.triton.paged_keys._key_rows``).

Each writes its partial state ``(o, lse)`` into slot ``split`` (prefix) or ``S`` (suffix, rows of its request)
of its tile, then takes a ticket from the tile's counter; the program that draws the last one (``S`` prefix
items + one per request of the tile) merges the ``S + 1`` states with the lse rule and writes the output.
Eager calls repeat a recorded launch (``reference.triton._fastlaunch``) when shapes, strides, dtypes and
options (``config`` included) match an earlier call, as ``flash_decode`` does (``fast_launch=False``: never).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from . import _checks, _fastlaunch, backends
from ._checks import check_block_tables, check_cascade_inputs
from ._device import device_limits, tma_device
from ._kernel_helpers import LOG2E, dot, dot_acc, lse_merge_finish, lse_merge_step
from ._device import INTERPRET, num_sms
from .configs import CASCADE_DEFAULT, CASCADE_OVERLAP as OVERLAP_DEFAULT, CascadeConfig
from .paged_keys import key_loop

__all__ = ["cascade_decode", "CascadeConfig", "cascade_num_splits"]


@triton.jit
def _merge_tile(OUT, LOUT, OPart, LPart, tile, n_states, hk, n_kv_heads, batch, stride_ob, stride_oh,
                GROUP: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """lse rule over the tile's ``n_states`` partial states: ``o = sum_s exp2(lse_s - lse) o_s``."""
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    REQ: tl.constexpr = ROWS // GROUP
    b = tile * REQ + offs_r // GROUP
    heads = hk * GROUP + offs_r % GROUP
    ok = (offs_r < REQ * GROUP) & (b < batch)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    den = tl.zeros([ROWS], tl.float32)
    num = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    for s in range(0, n_states):
        ps = ((tile * n_states + s) * n_kv_heads + hk).to(tl.int64) * ROWS + offs_r
        ls = tl.load(LPart + ps, mask=ok, other=float("-inf"), cache_modifier=".cg")
        os_ = tl.load(OPart + ps[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0,
                      cache_modifier=".cg")
        m, den, num = lse_merge_step(m, den, num, ls, os_)
    out, lse = lse_merge_finish(m, den, num)
    b64 = b.to(tl.int64)
    tl.store(OUT + b64[:, None] * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(OUT.dtype.element_ty), mask=ok[:, None])
    tl.store(LOUT + b64 * (n_kv_heads * GROUP) + heads, lse, mask=ok)


@triton.jit
def _rows_start(Q, q_rows, heads, row_ok, lo, hi, stride_qb, stride_qh, M: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """The start of a row tile's pass over keys ``[lo, hi)`` (FA2 Algorithm 1, lines 4-5): its query rows (request
    ``q_rows``, head ``heads``; rows not ``row_ok`` read as 0), the empty state ``m = -inf, l = 0, acc = 0`` and
    ``mid``, the end of the whole ``BLOCK_N`` key blocks (the blocks after it need the key mask)."""
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + q_rows.to(tl.int64)[:, None] * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, HEAD_DIM], tl.float32)
    return q, m_i, l_i, acc, lo + (hi - lo) // BLOCK_N * BLOCK_N


@triton.jit
def _attend_rows(Q, q_rows, heads, row_ok, K, V, bt, hk, lo, hi, stride_qb, stride_qh,
                 stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, qk_scale,
                 M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
                 INTERP: tl.constexpr):
    """Rows (request ``q_rows``, query head ``heads``) over keys ``[lo, hi)`` of kv head ``hk``; base-2 state."""
    q, m_i, l_i, acc, mid = _rows_start(Q, q_rows, heads, row_ok, lo, hi, stride_qb, stride_qh, M, HEAD_DIM, BLOCK_N)
    qpos = tl.zeros([M], tl.int32)
    k_base = K + hk.to(tl.int64) * stride_kh
    v_base = V + hk.to(tl.int64) * stride_vh
    acc, l_i, m_i = key_loop(acc, l_i, m_i, q, k_base, v_base, K, V, bt, hk, lo, mid, hi, qpos, 0,
                              stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                              BLOCK_N, HEAD_DIM, PAGE, False, False, False, INTERP)
    acc, l_i, m_i = key_loop(acc, l_i, m_i, q, k_base, v_base, K, V, bt, hk, mid, hi, hi, qpos, 0,
                              stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                              BLOCK_N, HEAD_DIM, PAGE, False, True, False, INTERP)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    return acc / l_safe[:, None], tl.where(l_i > 0, m_i + tl.math.log2(l_safe), float("-inf"))


@triton.jit
def _tma_key_block(q, DescK, DescV, n0, col, hi, offs_n, acc, l_i, m_i, qk_scale, MASKED: tl.constexpr,
                   INTERP: tl.constexpr):
    """One key block of ``_prefix_rows_tma`` (FA2 Algorithm 1, lines 8-10, base 2): the TMA boxes at ``(n0, col)``;
    ``MASKED`` (the partial last block): keys ``>= hi`` score ``-inf`` and a row with no finite score uses max 0."""
    k = DescK.load([n0, col])
    if MASKED:
        s = tl.where((n0 + offs_n)[None, :] < hi, dot(q, tl.trans(k), INTERP) * qk_scale, float("-inf"))
    else:
        s = dot(q, tl.trans(k), INTERP) * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = DescV.load([n0, col])
    acc = dot_acc(p.to(v.dtype), v, acc * alpha[:, None], INTERP)
    return acc, l_i, m_new


@triton.jit
def _prefix_rows_tma(Q, q_rows, heads, row_ok, DescK, DescV, hk, lo, hi, stride_qb, stride_qh,
                     qk_scale, M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                     INTERP: tl.constexpr):
    """``_attend_rows`` over prefix keys ``[lo, hi)`` with the key blocks as TMA boxes ``(BLOCK_N, d)`` at
    ``(n0, hk * d)`` of the ``(P, Hkv * d)`` prefix (Hopper): whole blocks without masks, then the partial last
    block (rows past ``P`` are zero-filled by the copy engine; their scores are masked). FA2 Algorithm 1, lines
    6-10, base 2."""
    offs_n = tl.arange(0, BLOCK_N)
    q, m_i, l_i, acc, mid = _rows_start(Q, q_rows, heads, row_ok, lo, hi, stride_qb, stride_qh, M, HEAD_DIM, BLOCK_N)
    col = hk * HEAD_DIM
    for n0 in range(lo, mid, BLOCK_N):
        acc, l_i, m_i = _tma_key_block(q, DescK, DescV, n0, col, hi, offs_n, acc, l_i, m_i, qk_scale, False, INTERP)
    if mid < hi:
        acc, l_i, m_i = _tma_key_block(q, DescK, DescV, mid, col, hi, offs_n, acc, l_i, m_i, qk_scale, True, INTERP)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    return acc / l_safe[:, None], tl.where(l_i > 0, m_i + tl.math.log2(l_safe), float("-inf"))


@triton.jit
def _prefix_item(Q, PK, PV, BT, OPart, LPart, pid, hk, n_splits, n_states, n_kv_heads, batch, prefix_len, chunk,
                 stride_qb, stride_qh, stride_pkn, stride_pkh, stride_pvn, stride_pvh, qk_scale, DescK, DescV,
                 GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                 INTERP: tl.constexpr, USE_TMA: tl.constexpr):
    """Prefix item ``(tile, split)``: the tile's ROWS rows over one chunk of the prefix; writes state ``split``."""
    REQ: tl.constexpr = ROWS // GROUP
    tile = pid // n_splits
    split = pid % n_splits
    offs_r = tl.arange(0, ROWS)
    reqs = tile * REQ + offs_r // GROUP
    heads = hk * GROUP + offs_r % GROUP
    row_ok = (offs_r < REQ * GROUP) & (reqs < batch)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, prefix_len)
    if USE_TMA:
        o, lse2 = _prefix_rows_tma(Q, reqs, heads, row_ok, DescK, DescV, hk, lo, hi, stride_qb, stride_qh,
                                   qk_scale, ROWS, HEAD_DIM, BLOCK_N, INTERP)
    else:
        o, lse2 = _attend_rows(Q, reqs, heads, row_ok, PK, PV, BT, hk, lo, hi, stride_qb, stride_qh,
                               0, stride_pkn, stride_pkh, 0, stride_pvn, stride_pvh, qk_scale,
                               ROWS, HEAD_DIM, BLOCK_N, 0, INTERP)
    part = ((tile * n_states + split) * n_kv_heads + hk).to(tl.int64) * ROWS + offs_r
    tl.store(OPart + part[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], o)
    tl.store(LPart + part, lse2)
    return tile


@triton.jit
def _suffix_item(Q, KC, VC, BT, SeqLens, OPart, LPart, b, hk, n_splits, n_states, n_kv_heads,
                 stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_tb,
                 qk_scale, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SMALL: tl.constexpr,
                 BLOCK_N: tl.constexpr, PAGE: tl.constexpr, INTERP: tl.constexpr):
    """Suffix item: request ``b``'s G rows over its own pages; writes its rows of the tile's last state."""
    REQ: tl.constexpr = ROWS // GROUP
    tile = b // REQ
    offs_g = tl.arange(0, SMALL)
    row_ok = offs_g < GROUP
    heads = hk * GROUP + offs_g
    reqs = tl.zeros([SMALL], tl.int32) + b
    n_keys = tl.load(SeqLens + b).to(tl.int32)
    o, lse2 = _attend_rows(Q, reqs, heads, row_ok, KC, VC, BT + b.to(tl.int64) * stride_tb, hk, 0, n_keys,
                           stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs,
                           stride_vh, qk_scale, SMALL, HEAD_DIM, BLOCK_N, PAGE, INTERP)
    part = ((tile * n_states + n_splits) * n_kv_heads + hk).to(tl.int64) * ROWS + (b % REQ) * GROUP + offs_g
    tl.store(OPart + part[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], o, mask=row_ok[:, None])
    tl.store(LPart + part, lse2, mask=row_ok)
    return tile


@triton.jit
def _fold_request_states(m, den, num, OPart, LPart, b, hk, n_slots, n_splits, n_kv_heads, GROUP: tl.constexpr,
                         HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SMALL: tl.constexpr, CACHE: tl.constexpr):
    """Fold slots ``0 .. n_slots - 1`` of request ``b``'s G rows (kv head ``hk``) of its tile's partial states into
    the running lse merge ``(m, den, num)`` (``lse_merge_step``); ``CACHE`` the loads' cache modifier."""
    REQ: tl.constexpr = ROWS // GROUP
    tile = b // REQ
    offs_g = tl.arange(0, SMALL)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_g < GROUP
    for s in range(0, n_slots):
        ps = ((tile * (n_splits + 1) + s) * n_kv_heads + hk).to(tl.int64) * ROWS + (b % REQ) * GROUP + offs_g
        ls = tl.load(LPart + ps, mask=row_ok, other=float("-inf"), cache_modifier=CACHE)
        os_ = tl.load(OPart + ps[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0,
                      cache_modifier=CACHE)
        m, den, num = lse_merge_step(m, den, num, ls, os_)
    return m, den, num


@triton.jit
def _write_request(OUT, LOUT, m, den, num, b, hk, n_kv_heads, stride_ob, stride_oh, GROUP: tl.constexpr,
                   HEAD_DIM: tl.constexpr, SMALL: tl.constexpr):
    """Request ``b``'s G rows of kv head ``hk``: ``o = num / den`` and ``lse`` of the merged state, stored."""
    offs_g = tl.arange(0, SMALL)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_g < GROUP
    heads = hk * GROUP + offs_g
    out, lse = lse_merge_finish(m, den, num)
    b64 = b.to(tl.int64)
    tl.store(OUT + b64 * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(LOUT + b64 * (n_kv_heads * GROUP) + heads, lse, mask=row_ok)


@triton.jit
def _suffix_merge_item(Q, KC, VC, BT, SeqLens, OUT, LOUT, OPart, LPart, b, hk, n_splits, n_kv_heads,
                       stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                       stride_tb, stride_ob, stride_oh, qk_scale, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                       ROWS: tl.constexpr, SMALL: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
                       INTERP: tl.constexpr):
    """Request ``b``'s G rows over its own pages, then the lse rule over this state and the ``S`` prefix states an
    earlier launch wrote for its rows (slots ``0 .. S-1`` of its tile): every request merges its own rows in
    parallel, no ticket and no partial write of the suffix state (the merge of ``_merge_tile``, G rows wide)."""
    offs_g = tl.arange(0, SMALL)
    row_ok = offs_g < GROUP
    heads = hk * GROUP + offs_g
    n_keys = tl.load(SeqLens + b).to(tl.int32)
    o, lse2 = _attend_rows(Q, tl.zeros([SMALL], tl.int32) + b, heads, row_ok, KC, VC, BT + b.to(tl.int64) * stride_tb,
                           hk, 0, n_keys, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs,
                           stride_vh, qk_scale, SMALL, HEAD_DIM, BLOCK_N, PAGE, INTERP)
    m = tl.full([SMALL], float("-inf"), tl.float32)
    den = tl.zeros([SMALL], tl.float32)
    num = tl.zeros([SMALL, HEAD_DIM], tl.float32)
    m, den, num = lse_merge_step(m, den, num, lse2, o)
    m, den, num = _fold_request_states(m, den, num, OPart, LPart, b, hk, n_splits, n_splits, n_kv_heads, GROUP,
                                       HEAD_DIM, ROWS, SMALL, "")
    _write_request(OUT, LOUT, m, den, num, b, hk, n_kv_heads, stride_ob, stride_oh, GROUP, HEAD_DIM, SMALL)


@triton.jit
def _merge_request(OUT, LOUT, OPart, LPart, b, hk, n_splits, n_kv_heads, stride_ob, stride_oh,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SMALL: tl.constexpr):
    """Request ``b``'s G rows of kv head ``hk``: the lse rule over the ``S + 1`` states of its tile (``S`` prefix
    states, the suffix state in slot ``S``), ``o = sum_s exp2(lse_s - lse) o_s`` (``_merge_tile``, G rows wide);
    ``.cg`` loads: another grid wrote the prefix states, so no stale L1 line."""
    m = tl.full([SMALL], float("-inf"), tl.float32)
    den = tl.zeros([SMALL], tl.float32)
    num = tl.zeros([SMALL, HEAD_DIM], tl.float32)
    m, den, num = _fold_request_states(m, den, num, OPart, LPart, b, hk, n_splits + 1, n_splits, n_kv_heads, GROUP,
                                       HEAD_DIM, ROWS, SMALL, ".cg")
    _write_request(OUT, LOUT, m, den, num, b, hk, n_kv_heads, stride_ob, stride_oh, GROUP, HEAD_DIM, SMALL)


@triton.jit
def _overlap_items(Q, KC, VC, BT, SeqLens, OUT, LOUT, OPart, LPart, batch, n_kv_heads, n_splits,
                   stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_tb,
                   stride_ob, stride_oh, qk_scale, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                   SMALL: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, INTERP: tl.constexpr,
                   OVERLAP: tl.constexpr):
    """The overlapped Gluon path's Triton programs, a persistent grid over the ``(request, kv head)`` items
    ``pid, pid + programs, ..``: ``OVERLAP`` 1 writes each item's suffix state (slot ``S``, ``_suffix_item``); 2
    does that, then waits for the prefix grid this launch depends on (``gdc_wait``: PTX ``griddepcontrol.wait``,
    which returns once that grid has completed and its writes are visible; its CTAs were all resident before this
    grid could start, so it completes without this one) and merges its items; 3 merges only (after a join)."""
    n_items = batch * n_kv_heads
    if OVERLAP != 3:
        for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
            _suffix_item(Q, KC, VC, BT, SeqLens, OPart, LPart, item // n_kv_heads, item % n_kv_heads, n_splits,
                         n_splits + 1, n_kv_heads, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp,
                         stride_vs, stride_vh, stride_tb, qk_scale, GROUP, HEAD_DIM, ROWS, SMALL, BLOCK_N, PAGE,
                         INTERP)
    if OVERLAP != 1:
        tl.debug_barrier()  # this program's suffix states (other threads' stores) before its merge reads them
        if OVERLAP == 2:
            gdc_wait()
        for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
            _merge_request(OUT, LOUT, OPart, LPart, item // n_kv_heads, item % n_kv_heads, n_splits, n_kv_heads,
                           stride_ob, stride_oh, GROUP, HEAD_DIM, ROWS, SMALL)


@triton.jit
def _cascade_kernel(Q, PK, PV, KC, VC, BT, SeqLens, OUT, LOUT, OPart, LPart, Counters, DescK, DescV,
                    stride_qb, stride_qh, stride_pkn, stride_pkh, stride_pvn, stride_pvh,
                    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_tb,
                    stride_ob, stride_oh, batch, n_kv_heads, prefix_len, chunk, n_splits, n_tiles, qk_scale,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, SMALL: tl.constexpr,
                    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, INTERP: tl.constexpr,
                    PREFIX_FIRST: tl.constexpr = False, USE_TMA: tl.constexpr = False,
                    PREFIX_DONE: tl.constexpr = False, OVERLAP: tl.constexpr = 0):
    """``PREFIX_DONE``: an earlier launch (the Gluon prefix pass on Hopper) wrote the prefix states; the grid
    ``(B, Hkv)`` holds the suffix items only, each merging its own request's rows (``_suffix_merge_item``).
    ``OVERLAP`` 1 / 2 / 3: the programs of the overlapped Gluon path (``_overlap_items``)."""
    REQ: tl.constexpr = ROWS // GROUP
    n_states = n_splits + 1
    n_prefix = n_tiles * n_splits
    if OVERLAP != 0:
        _overlap_items(Q, KC, VC, BT, SeqLens, OUT, LOUT, OPart, LPart, batch, n_kv_heads, n_splits,
                       stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                       stride_tb, stride_ob, stride_oh, qk_scale, GROUP, HEAD_DIM, ROWS, SMALL, BLOCK_N, PAGE, INTERP,
                       OVERLAP)
    elif PREFIX_DONE:  # no prefix code compiled, no tickets: the prefix states are complete at launch
        _suffix_merge_item(Q, KC, VC, BT, SeqLens, OUT, LOUT, OPart, LPart, tl.program_id(0), tl.program_id(1),
                           n_splits, n_kv_heads, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp,
                           stride_vs, stride_vh, stride_tb, stride_ob, stride_oh, qk_scale, GROUP, HEAD_DIM, ROWS,
                           SMALL, BLOCK_N, PAGE, INTERP)
    else:
        if PREFIX_FIRST:  # 1-D grid: every head's prefix items (tiles of a chunk adjacent), then the suffix items
            g = tl.program_id(0)
            if g < n_prefix * n_kv_heads:
                t = g % n_tiles
                rest = g // n_tiles
                hk = rest // n_splits
                pid = t * n_splits + rest % n_splits
            else:
                g -= n_prefix * n_kv_heads
                hk = g % n_kv_heads
                pid = n_prefix + g // n_kv_heads
        else:
            pid = tl.program_id(0)
            hk = tl.program_id(1)
        if pid < n_prefix:  # prefix item (tile, split)
            tile = _prefix_item(Q, PK, PV, BT, OPart, LPart, pid, hk, n_splits, n_states, n_kv_heads, batch,
                                prefix_len, chunk, stride_qb, stride_qh, stride_pkn, stride_pkh, stride_pvn,
                                stride_pvh, qk_scale, DescK, DescV, GROUP, HEAD_DIM, ROWS, BLOCK_N, INTERP, USE_TMA)
        else:  # suffix item: request b's G rows over its pages
            tile = _suffix_item(Q, KC, VC, BT, SeqLens, OPart, LPart, pid - n_tiles * n_splits, hk, n_splits,
                                n_states, n_kv_heads, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp,
                                stride_vs, stride_vh, stride_tb, qk_scale, GROUP, HEAD_DIM, ROWS, SMALL, BLOCK_N, PAGE,
                                INTERP)
        # the last of the tile's S prefix items and its requests' suffix items merges (acq_rel publishes partials)
        tl.debug_barrier()
        counter = Counters + tile * n_kv_heads + hk
        ticket = tl.atomic_add(counter, 1, sem="acq_rel")
        if ticket == n_splits + tl.minimum(REQ, batch - tile * REQ) - 1:
            tl.debug_barrier()
            _merge_tile(OUT, LOUT, OPart, LPart, tile, n_states, hk, n_kv_heads, batch, stride_ob, stride_oh,
                        GROUP, ROWS, HEAD_DIM)
            tl.atomic_xchg(counter, 0)


def cascade_num_splits(batch: int, group: int, n_kv_heads: int, prefix_len: int, config: CascadeConfig | None = None,
                       sms: int | None = None) -> int:
    """Prefix chunks: about ``programs_per_sm * sms`` prefix programs over ``n_kv_heads`` and the row tiles,
    each chunk at least ``min_split_keys`` keys and (where that allows) at most ``max_split_keys``."""
    config = CASCADE_DEFAULT if config is None else config
    sms = num_sms() if sms is None else sms
    tiles = math.ceil(batch * group / _rows(config, batch, group))
    want = max(1, round(config.programs_per_sm * sms / (tiles * n_kv_heads)), math.ceil(prefix_len / config.max_split_keys))
    return max(1, min(want, prefix_len // config.min_split_keys))


def prefix_first_order(n_prefix_programs: int, config: CascadeConfig, sms: int | None = None) -> bool:
    """``config.prefix_first``, or when it is None whether the prefix programs fit one per SM."""
    if config.prefix_first is not None:
        return config.prefix_first
    return n_prefix_programs <= (num_sms() if sms is None else sms)


def _tma_ok(prefix_k, prefix_v) -> bool:
    """The prefix pass may load TMA boxes: a Hopper GPU (not the interpreter) and contiguous fp16/bf16 prefix
    tensors with 16-byte aligned bases (one 2-D ``(P, Hkv * d)`` view each)."""
    return (tma_device(prefix_k.device) and prefix_k.dtype in (torch.float16, torch.bfloat16)
            and all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (prefix_k, prefix_v)))


def gluon_prefix_reason(q, prefix_k, prefix_v) -> str | None:
    """None where the Gluon prefix kernel takes these inputs, else what it needs (``backends.prefix_ok``)."""
    if INTERPRET or q.device.type != "cuda":
        return ("needs a Hopper GPU (compute capability 9.0); the inputs are on "
                f"{q.device}" + (" under the interpreter" if INTERPRET else ""))
    if not backends.prefix_ok(q, prefix_k, prefix_v, device_limits(q.device)):
        return ("needs compute capability 9.0, fp16/bf16, d in {64, 128}, Hq/Hkv dividing 64 and a contiguous 16-byte "
                "aligned prefix")
    return None


def use_gluon_prefix(config: CascadeConfig, q, prefix_k, prefix_v, *, capturing: bool | None = None) -> bool:
    """Whether ``cascade_decode`` runs the prefix pass as the Hopper Gluon kernel: ``config.prefix_gluon``, or
    when it is None, where the kernel applies (``cascade_prefix_gluon.prefix_ok``) and the batch has at least
    ``config.gluon_min_rows`` packed rows ``B * G`` per kv head under CUDA-graph capture, at least
    ``max(gluon_min_rows, eager_gluon_min_rows)`` in an eager call (``capturing``: None asks the current
    stream). ``prefix_gluon=True`` where the kernel does not apply raises ``ValueError`` naming the requirement."""
    if config.prefix_gluon is False:
        return False
    reason = gluon_prefix_reason(q, prefix_k, prefix_v)
    if config.prefix_gluon:
        if reason is not None:
            raise ValueError(f"CascadeConfig.prefix_gluon=True {reason}")
        return True
    if reason is not None:
        return False
    if capturing is None:
        capturing = torch.cuda.is_current_stream_capturing()
    _checks.check_flag(capturing, "capturing")
    least = config.gluon_min_rows if capturing else max(config.gluon_min_rows, config.eager_gluon_min_rows)
    return q.shape[0] * (q.shape[1] // prefix_k.shape[1]) >= least


def _rows(config: CascadeConfig, batch: int, group: int) -> int:
    return max(16, min(config.rows, triton.next_power_of_2(batch * group)), triton.next_power_of_2(group))


#: the in-kernel merge's ticket counters, one int32 per (row tile, kv head)
_COUNTERS = _fastlaunch.TicketCounters(1024)
LAUNCH_CACHE = _fastlaunch.LaunchCache()
_SIDE: dict = {}


class GluonLaunches(NamedTuple):
    """The recorded launches of the Hopper path: the Gluon prefix kernel (``prefix``), the Triton kernel after it
    (``main``: suffix + merge, or the suffix programs of an overlap) and, for ``overlap = "streams"``, the merge
    after the join (``merge``); ``block_n`` the prefix descriptors' box rows."""
    prefix: object
    main: object
    merge: object
    mode: str
    block_n: int


def overlap_mode(config: CascadeConfig, rows: int) -> str:
    """How the Gluon path runs its passes for ``rows = B * G`` packed rows per kv head: ``config.overlap``, or where
    it is None the pinned ``configs.CASCADE_OVERLAP`` up to ``config.overlap_max_rows`` rows and "off" above."""
    if config.overlap is not None:
        return config.overlap
    return OVERLAP_DEFAULT if rows <= config.overlap_max_rows else "off"


def _side_stream(device):
    """``(side stream, fork event, join event)`` of the current stream: the prefix kernel's stream of the
    ``"streams"`` overlap (high priority: where both kernels wait for SMs, the prefix CTAs are placed first)."""
    cur = torch.cuda.current_stream(device)
    key = (device.index, cur.cuda_stream)
    side = _SIDE.get(key)
    if side is None:
        stream = torch.cuda.Stream(device=device, priority=-1)
        if stream.cuda_stream == cur.cuda_stream:  # pragma: no cover - pool streams never equal the current one
            stream = torch.cuda.Stream(device=device, priority=-1)
        side = _SIDE[key] = (stream, torch.cuda.Event(), torch.cuda.Event())
    return (cur, *side)


def overlap_programs(batch: int, n_kv_heads: int, n_prefix_ctas: int, config: CascadeConfig,
                     sms: int | None = None) -> int:
    """Suffix programs of an overlap: ``overlap_suffix_per_sm`` on each SM the prefix CTAs leave free (all SMs where
    they leave none), at most one per ``(request, kv head)`` item."""
    sms = num_sms() if sms is None else sms
    free = sms - n_prefix_ctas if n_prefix_ctas < sms else sms
    return max(1, min(batch * n_kv_heads, free * config.overlap_suffix_per_sm))
_SLOTS = ("Q", "PK", "PV", "KC", "VC", "BT", "SeqLens", "OUT", "LOUT", "DescK", "DescV")


def clear_launch_cache() -> None:
    """Forget every recorded cascade launch."""
    LAUNCH_CACHE.clear()


def launch_key(tensors, *options, enabled: bool = True):
    """``(key, stream handle, device addresses of tensors)`` of a recorded launch (``options`` include the call's
    config), or None: the full path. The key holds each tensor's shape, strides, dtype, device index and 16-byte
    alignment, the options, the stream and the capture state (an eager call and a captured one may take different
    paths, ``use_gluon_prefix``)."""
    if INTERPRET or not enabled:
        return None
    parts, ptrs = [], []
    for t in tensors:
        if type(t) is not torch.Tensor or not t.is_cuda:
            return None
        p = t.data_ptr()
        ptrs.append(p)
        parts.append((t.shape, t.stride(), t.dtype, t.get_device(), p % 16 == 0))
    stream = _fastlaunch.stream_handle(tensors[0].get_device())
    return ("cascade", *parts, *options, stream, torch.cuda.is_current_stream_capturing()), stream, ptrs


def recorded_launch(tensors, *options, enabled: bool = True):
    """``(key, stream, addresses, recorded launch or None)``, or None where the call takes the full path (no key,
    or an unhashable option: the full path's checks name it)."""
    found = launch_key(tensors, *options, enabled=enabled)
    if found is None:
        return None
    try:
        return (*found, LAUNCH_CACHE.get(found[0]))
    except TypeError:
        return None


class CascadePlan(NamedTuple):
    """How one ``cascade_decode`` call runs: ``mode`` "triton" (the one-launch Triton kernel) or the Hopper path's
    "off" / "pdl" / "streams" (the Gluon prefix pass, then the Triton suffix and merge: ``overlap_mode``); the
    prefix split into ``num_splits`` chunks of ``chunk`` keys; ``rows`` per row tile, ``n_tiles`` tiles;
    ``prefix_first`` (``prefix_first_order``) and ``use_tma`` (TMA prefix boxes) of the Triton kernel."""
    mode: str
    num_splits: int
    chunk: int
    rows: int
    n_tiles: int
    prefix_first: bool
    use_tma: bool


def choose_backend(backend: str, config: CascadeConfig, q, prefix_k, prefix_v) -> str:
    """"triton" or "gluon" for ``backend`` ("auto": ``use_gluon_prefix``); ``ValueError`` naming the reason where
    the asked backend cannot run these inputs or contradicts ``config.prefix_gluon``."""
    if backend not in backends.BACKENDS:
        raise ValueError(f"backend must be one of {backends.BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "gluon" if use_gluon_prefix(config, q, prefix_k, prefix_v) else "triton"
    if config.prefix_gluon is not None and config.prefix_gluon != (backend == "gluon"):
        raise ValueError(f"backend={backend!r} contradicts CascadeConfig.prefix_gluon={config.prefix_gluon}")
    reason = gluon_prefix_reason(q, prefix_k, prefix_v) if backend == "gluon" else None
    if reason is not None:
        raise ValueError(f"backend='gluon' (the Hopper prefix pass) {reason}")
    return backend


def plan_cascade(q, prefix_k, prefix_v, num_splits, config: CascadeConfig, backend: str) -> CascadePlan:
    """The plan of a call on checked inputs (``backend``: "triton" or "gluon", ``choose_backend``'s answer)."""
    B, hq, _ = q.shape
    P, hkv = prefix_k.shape[0], prefix_k.shape[1]
    g = hq // hkv
    gluon = backend == "gluon"
    mode = overlap_mode(config, B * g) if gluon else "triton"
    if gluon:  # Hopper: the Gluon prefix pass fills 64-row tiles' states, split on gluon_block_n keys
        cpg = backends.cascade_prefix()
        if num_splits is None:  # an overlap gives the prefix overlap_prefix_share of the SMs
            num_splits = cpg.gluon_num_splits(B, g, hkv, P, num_sms(), config.min_split_keys,
                                              config.programs_per_sm if mode == "off" else config.overlap_prefix_share)
        key_block, rows = config.gluon_block_n, cpg.HALF.value
    else:
        if num_splits is None:
            num_splits = cascade_num_splits(B, g, hkv, P, config)
        key_block, rows = config.block_n, _rows(config, B, g)
    num_splits = min(num_splits, P)
    chunk = triton.cdiv(triton.cdiv(P, num_splits), key_block) * key_block
    num_splits = triton.cdiv(P, chunk)
    n_tiles = triton.cdiv(B, rows // g)
    prefix_first = not gluon and prefix_first_order(n_tiles * num_splits * hkv, config)
    use_tma = config.use_tma and not gluon and _tma_ok(prefix_k, prefix_v)
    return CascadePlan(mode, num_splits, chunk, rows, n_tiles, prefix_first, use_tma)


def cascade_decode(q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, scale=None, *,
                   num_splits=None, config=None, validate=True, fast_launch=True, backend="auto"):
    """Decode attention of B requests over one shared prefix plus each request's paged suffix; ``(o, lse)``.

    q: ``(B, Hq, d)``; prefix_k, prefix_v: ``(P, Hkv, d)``, ``P >= 1``, read once per row tile for the whole
    batch; k_cache, v_cache ``(num_blocks, block_size, Hkv, d)``, block_tables ``(B, max_blocks)``, seq_lens
    ``(B,)``: each request's suffix (``seq_lens[b] = 0``: prefix only), as in ``paged_decode``. num_splits:
    prefix chunks (None: ``cascade_num_splits``); config: a ``CascadeConfig``. Returns ``o (B, Hq, d)`` in q's
    dtype and ``lse (B, Hq)`` float32 over each request's whole key set. One kernel launch; ``validate=False``
    skips the checks that need a device sync; ``fast_launch=False`` always takes the full path (no recorded
    launch). backend: ``"triton"`` the one-launch Triton kernel, ``"gluon"`` the Hopper path (the Gluon prefix
    pass through ``backends``; ``ValueError`` with the reason where it cannot run), ``"auto"`` the Gluon path
    where ``use_gluon_prefix`` picks it, the Triton kernel elsewhere.
    """
    found = recorded_launch((q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens), num_splits, scale, config,
                            backend, enabled=fast_launch is True)
    key, rec = (found[0], found[3]) if found is not None else (None, None)
    if rec is not None and type(validate) is bool:  # a recorded launch: shapes, strides, dtypes, options match
        if validate:
            check_block_tables(block_tables, seq_lens, q.shape[0], k_cache.shape[0], k_cache.shape[1], True)
        return _replay(rec, found, q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens)
    _checks.check_flag(fast_launch, "fast_launch")
    B, hq, d, hkv, block_size, block_tables, seq_lens = check_cascade_inputs(
        q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, validate)
    if config is not None and not isinstance(config, CascadeConfig):
        raise TypeError(f"config must be a CascadeConfig or None, got {type(config).__name__}")
    cfg = CASCADE_DEFAULT if config is None else config
    scale = _checks.check_scale(scale, d)
    if num_splits is not None:
        num_splits = _checks.check_positive_int(num_splits, "num_splits")
    direct = (q.stride(-1) == 1 and all(x.stride(-1) == 1 for x in (prefix_k, prefix_v, k_cache, v_cache))
              and block_tables.stride(1) == 1 and seq_lens.is_contiguous())
    q, prefix_k, prefix_v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, prefix_k, prefix_v))
    k_cache, v_cache = (x if x.stride(-1) == 1 else x.contiguous() for x in (k_cache, v_cache))
    plan = plan_cascade(q, prefix_k, prefix_v, num_splits, cfg, choose_backend(backend, cfg, q, prefix_k, prefix_v))
    P, g = prefix_k.shape[0], hq // hkv
    o_part = torch.empty((plan.n_tiles, plan.num_splits + 1, hkv, plan.rows, d), dtype=torch.float32, device=q.device)
    l_part = torch.empty((plan.n_tiles, plan.num_splits + 1, hkv, plan.rows), dtype=torch.float32, device=q.device)
    counters = _COUNTERS.buffer(q.device, plan.n_tiles * hkv)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, hq), dtype=torch.float32, device=q.device)
    if plan.use_tma:  # (P, Hkv * d) views, boxes (block_n, d)
        from triton.tools.tensor_descriptor import TensorDescriptor
        desc_k, desc_v = (TensorDescriptor(x, [P, hkv * d], [hkv * d, 1], [cfg.block_n, d])
                          for x in (prefix_k, prefix_v))
    else:
        desc_k, desc_v = prefix_k, prefix_v
    args = (q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, out, lse, o_part, l_part, counters,
            desc_k, desc_v,
            q.stride(0), q.stride(1), prefix_k.stride(0), prefix_k.stride(1), prefix_v.stride(0), prefix_v.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
            B, hkv, P, plan.chunk, plan.num_splits, plan.n_tiles, scale * LOG2E.value)
    meta = dict(GROUP=g, HEAD_DIM=d, ROWS=plan.rows, SMALL=max(16, triton.next_power_of_2(g)), BLOCK_N=cfg.block_n,
                PAGE=block_size, INTERP=INTERPRET, PREFIX_FIRST=plan.prefix_first, USE_TMA=plan.use_tma,
                PREFIX_DONE=plan.mode != "triton", num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    key = key if key is not None and direct and q.is_contiguous() else None  # None: record nothing
    if plan.mode == "triton":
        _launch_triton(plan, args, meta, key, B, hkv)
    else:
        _launch_gluon(plan, cfg, args, meta, key, q, prefix_k, prefix_v, o_part, l_part, scale)
    return out, lse


def _launch_triton(plan: CascadePlan, args, meta, key, batch: int, hkv: int) -> None:
    """Mode "triton": the one-launch kernel over every prefix item and suffix item (recorded under ``key``)."""
    n_items = plan.n_tiles * plan.num_splits + batch
    grid = (n_items * hkv, 1) if plan.prefix_first else (n_items, hkv)
    if key is None:
        _cascade_kernel[grid](*args, **meta)
        return
    recd = _fastlaunch.launch_and_record(_cascade_kernel, grid, args, meta, _SLOTS)
    if recd is not None:
        LAUNCH_CACHE.put(key, recd)


def _launch_gluon(plan: CascadePlan, cfg: CascadeConfig, args, meta, key, q, prefix_k, prefix_v, o_part, l_part,
                  scale) -> None:
    """The Hopper modes: the Gluon prefix launch (prefix states 0 .. S-1 of every 64-row tile), then the Triton
    launch(es): "off" the suffix and merge after it in stream order, "pdl" a persistent grid of suffix programs
    programmatically dependent on it, "streams" those on a forked stream and the merge after the join
    (``_launch_streams``). Recorded under ``key`` as ``GluonLaunches``."""
    B, hkv, g = q.shape[0], prefix_k.shape[1], q.shape[1] // prefix_k.shape[1]
    cpg = backends.cascade_prefix()
    grid_p, args_p, meta_p = cpg.launch_spec(q, prefix_k, prefix_v, o_part, l_part, plan.num_splits, plan.chunk, scale,
                                             cfg.gluon_block_n, cfg.gluon_stages, pdl_trigger=plan.mode == "pdl")
    meta = dict(meta, OVERLAP={"off": 0, "pdl": 2, "streams": 1}[plan.mode])
    if plan.mode == "off":
        grid = (B, hkv)  # suffix items only; the merge waits for its tile's requests
    else:  # a persistent grid of suffix programs beside the prefix CTAs
        grid = (overlap_programs(B, hkv, hkv * plan.num_splits * cpg.tiles(B, g)[1], cfg), 1)
    if plan.mode == "pdl":
        meta.update(launch_pdl=True)
    launch = _fastlaunch.launch_and_record if key is not None else _launch
    if plan.mode == "streams":
        rec_p, rec_m, rec_x = _launch_streams(launch, cpg, (grid_p, args_p, meta_p), (grid, args, meta), B * hkv,
                                              q.device)
    else:
        rec_p = launch(cpg.cascade_prefix_kernel, grid_p, args_p, meta_p, cpg.SLOTS)
        rec_m = launch(_cascade_kernel, grid, args, meta, _SLOTS)
        rec_x = True
    if key is not None and rec_p is not None and rec_m is not None and rec_x is not None:
        LAUNCH_CACHE.put(key, GluonLaunches(rec_p, rec_m, None if rec_x is True else rec_x, plan.mode,
                                            cfg.gluon_block_n))


def _launch_streams(launch, cpg, prefix, main, n_items: int, device):
    """Mode "streams": fork, the prefix launch on the side stream and the suffix programs here; join; merge."""
    grid, args, meta = main
    cur, side, fork, join = _side_stream(device)
    fork.record(cur)
    side.wait_event(fork)
    with torch.cuda.stream(side):
        rec_p = launch(cpg.cascade_prefix_kernel, *prefix, cpg.SLOTS)
    rec_m = launch(_cascade_kernel, grid, args, meta, _SLOTS)
    join.record(side)
    cur.wait_event(join)
    rec_x = launch(_cascade_kernel, (n_items, 1), args, dict(meta, OVERLAP=3), _SLOTS)
    return rec_p, rec_m, rec_x


def _replay(rec, found, q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens):
    """A recorded launch (``rec``, looked up with ``found = recorded_launch(...)``) on this call's tensors."""
    main = rec.main if type(rec) is GluonLaunches else rec
    out = torch.empty_like(q)  # q's strides are the recorded (contiguous) ones
    lse = torch.empty_like(main.args[main.slots["LOUT"]])  # the recorded call's lse: (B, Hq) float32
    if main is not rec:  # Hopper: the Gluon prefix launch and the Triton launch(es)
        return _replay_gluon(rec, q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, out, lse)
    values = (q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, out, lse, prefix_k, prefix_v)
    dk = rec.args[rec.slots["DescK"]]
    if type(dk) is torch.Tensor:  # pointer loads: the addresses of the key's tensors (_SLOTS order)
        p = found[2]
        rec.launch(values, found[1], addresses=(*p, out.data_ptr(), lse.data_ptr(), p[1], p[2]))
    else:  # a launch recorded with TMA boxes: descriptors of the new prefix (same shape and box)
        from triton.tools.tensor_descriptor import TensorDescriptor
        desc_k, desc_v = (TensorDescriptor(x, dk.shape, dk.strides, dk.block_shape) for x in (prefix_k, prefix_v))
        rec.launch(values[:9] + (desc_k, desc_v), found[1])
    return out, lse


def _launch(kernel, grid, args, meta, slots):
    kernel[grid](*args, **meta)


def _replay_gluon(rec: GluonLaunches, q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, out, lse):
    """The recorded Hopper launches on this call's tensors; the prefix descriptors come from
    ``cascade_prefix_gluon.cached_descriptors`` (built once per prefix tensor)."""
    desc_k, desc_v = backends.cached_descriptors(prefix_k, prefix_v, rec.block_n)
    tensors = {"Q": q, "PK": prefix_k, "PV": prefix_v, "KC": k_cache, "VC": v_cache, "BT": block_tables,
               "SeqLens": seq_lens, "OUT": out, "LOUT": lse, "DescK": prefix_k, "DescV": prefix_v}
    prefix = {"desc_k": desc_k, "desc_v": desc_v, "Q": q}
    if rec.mode == "streams":
        cur, side, fork, join = _side_stream(q.device)
        fork.record(cur)
        side.wait_event(fork)
        rec.prefix(prefix, stream=side.cuda_stream)
        rec.main(tensors)
        join.record(side)
        cur.wait_event(join)
        rec.merge(tensors)
    else:
        rec.prefix(prefix)
        rec.main(tensors)
    return out, lse


def compile_sm90(rows: int = 64, block_n: int = 64, num_warps: int = 4, num_stages: int = 3,
                 prefix_first: bool = False, use_tma: bool = False, group: int = 4, d: int = 128, page: int = 16,
                 prefix_done: bool = False, overlap: int = 0):
    """The cascade kernel compiled for sm_90a on any machine (``serving_aot``): bf16, GQA group ``group``, head
    dim ``d``, ``page``-token suffix pages; ``rows`` the prefix tile's rows; ``prefix_done``: the suffix-and-merge
    kernel that follows the Gluon prefix pass on Hopper; ``overlap`` 1 / 2 / 3: the overlapped path's programs
    (suffix states / suffix states, grid-dependency wait and merge / merge: ``_overlap_items``)."""
    from .serving_aot import compile_with_hints
    k = _cascade_kernel
    ptrs = {"Q": "*bf16", "PK": "*bf16", "PV": "*bf16", "KC": "*bf16", "VC": "*bf16", "BT": "*i32", "SeqLens": "*i32",
            "OUT": "*bf16", "LOUT": "*fp32", "OPart": "*fp32", "LPart": "*fp32", "Counters": "*i32"}
    desc = f"tensordesc<bf16[{block_n},{d}]>" if use_tma else "*bf16"
    types = {**ptrs, "DescK": desc, "DescV": desc, "qk_scale": "fp32"}
    const = dict(GROUP=group, HEAD_DIM=d, ROWS=rows, SMALL=max(16, group), BLOCK_N=block_n, PAGE=page, INTERP=False,
                 PREFIX_FIRST=prefix_first, USE_TMA=use_tma, PREFIX_DONE=prefix_done, OVERLAP=overlap)
    div = list(ptrs) + [n for n in k.arg_names if n.startswith("stride")] + ["prefix_len", "chunk"]
    return compile_with_hints(k, types, const, div, num_warps, num_stages)

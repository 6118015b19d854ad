"""Flash-Decoding in Triton: split-KV attention for one query token per sequence, with GQA packing.

Decode attention has one query row per head, so FlashAttention's parallelism over query blocks leaves the GPU
almost empty at small batch (B x H programs for 132 SMs). Flash-Decoding (seed slides "Flash-Decoding
Parallelizes Across Keys/Values") splits the keys and values into chunks and runs:

1. *stage 1* (``_split_kv_kernel``): one program per (batch, kv head, split). It attends the query heads of
   one GQA group to the split's keys with FlashAttention's online softmax (FA2 Algorithm 1, lines 8-10, in
   base 2) and writes a partial output ``o_s`` and its log-sum-exp ``lse_s``;
2. *stage 2*: the splits are merged with the log-sum-exp rule ``lse = log sum_s exp(lse_s)``,
   ``o = sum_s exp(lse_s - lse) o_s`` (the same merge as ``reference.numpy.merge.merge_states``). By default
   (``DecodeConfig.fuse_merge``) the merge runs inside stage 1: each program takes a ticket from an atomic counter of its
   (batch, kv head) after writing its partial result, and the program that draws the last ticket merges the
   group's splits and resets the counter. This saves the second launch and the gap between the kernels,
   which are a tenth of a batch-1 decode step at 32k keys. ``DecodeConfig(fuse_merge=False)`` runs the separate
   ``_merge_kernel`` (one program per (batch, query head)) instead.

GQA packing (FlashAttention-3 talk, "GQA Packing: compute for multiple query heads per KV head"): the
``G = Hq / Hkv`` query heads that share a kv head are the M rows of one tile, padded to at least 16 rows for
``tl.dot``, so each K/V block is read from memory once per kv head instead of once per query head.

The same kernel reads K/V either from a contiguous cache ``(B, Hkv, Nmax, d)`` or, with ``PAGED``, through a
block table from a vLLM-style paged cache ``(num_blocks, block_size, Hkv, d)``; ``reference.triton.paged`` is
the paged front end. The package's ``reference.triton.flash_decode`` / ``paged_decode`` are these calls with
recorded launches (``reference.triton.decode_serving``); options that were measured and not pinned (programmatic
dependent launch, a two-level merge, dynamic splits) are ``experiments/decode_variants.py``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import _checks, _device, configs
from .configs import PROGRAMS_PER_SM, DecodeConfig
from ._kernel_helpers import LOG2E
from ._checks import check_decode_q, check_kv_cache, check_seq_lens
from .configs import check_decode_config
from ._device import INTERPRET, num_sms

#: the tuned stage-1 configurations (``DecodeConfig``: key block, warps, stages, fused merge) live in
#: ``reference.triton.configs.DECODE_PINS``; callers pass ``config=`` or scope ``configs.pinned(decode=...)``.
#: a split gets at least this many key blocks, so its fixed costs (Q load, partial-result write) stay small
MIN_BLOCKS_PER_SPLIT = 4
#: splits merged per step of stage 2's loop
MERGE_CHUNK = 32


@triton.jit
def _attend_block(q, m_i, l_i, acc, start_n, end, b64, kvh, K, V, BlockTables,
                  stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_tb, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  IEEE_DOT: tl.constexpr):
    """One key block of the online softmax (FA2 Algorithm 1, lines 8-10, base 2): update (m_i, l_i, acc)."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    key_ok = offs_n < end
    if PAGED:
        if PAGE_SIZE % BLOCK_N == 0:  # the tile lies inside one page: one table entry
            phys = tl.load(BlockTables + b64 * stride_tb + start_n // PAGE_SIZE)
        else:  # the tile spans several pages: one table entry per key (cached: neighbours share it)
            phys = tl.load(BlockTables + b64 * stride_tb + offs_n // PAGE_SIZE, mask=key_ok, other=0)
        key_ok = key_ok & (phys >= 0)
        phys = tl.maximum(phys, 0).to(tl.int64)
        k_rows = phys * stride_kb + kvh * stride_kh + (offs_n % PAGE_SIZE) * stride_kn
        v_rows = phys * stride_vb + kvh * stride_vh + (offs_n % PAGE_SIZE) * stride_vn
    else:
        k_rows = b64 * stride_kb + kvh * stride_kh + offs_n.to(tl.int64) * stride_kn
        v_rows = b64 * stride_vb + kvh * stride_vh + offs_n.to(tl.int64) * stride_vn
    kt = tl.load(K + k_rows[None, :] + offs_d[:, None], mask=key_ok[None, :], other=0.0)  # (d, BLOCK_N)
    vb = tl.load(V + v_rows[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0)  # (BLOCK_N, d)
    return _online_block(q, kt, vb, key_ok, m_i, l_i, acc, qk_scale, True, IEEE_DOT)


@triton.jit
def _online_block(q, kt, vb, key_ok, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr, IEEE_DOT: tl.constexpr):
    """FA2 Algorithm 1, lines 8-10 (base 2) on one loaded block: ``kt`` (d, BLOCK_N), ``vb`` (BLOCK_N, d); keys
    outside ``key_ok`` get score -inf when ``MASKED``."""
    if IEEE_DOT:
        s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    if MASKED:
        s = tl.where(key_ok[None, :], s * qk_scale, float("-inf"))  # qk_scale includes log2(e): exp2 below
    else:
        s = s * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every block holds >= 1 valid key
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE_DOT:
        acc = acc * alpha[:, None] + tl.dot(p, vb.to(tl.float32), input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
    m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _tma_blocks(q, m_i, l_i, acc, DescK, DescV, row0, start, end, qk_scale, BLOCK_N: tl.constexpr,
                IEEE_DOT: tl.constexpr):
    """Keys ``[start, end)`` of one (batch, kv head) whose key 0 is row ``row0`` of the 2-D K/V descriptors: whole
    blocks without masks (the pipelined TMA loop), then the partial last block, whose rows past ``end`` (the
    next head's keys, or never-written cache slots that may hold NaN) are masked out of the scores and zeroed in
    V. FA2 Algorithm 1, lines 8-10, as ``_attend_block``."""
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(start, full_end, BLOCK_N):
        kb = DescK.load([row0 + start_n, 0])
        vb = DescV.load([row0 + start_n, 0])
        m_i, l_i, acc = _online_block(q, tl.trans(kb), vb, offs_n < BLOCK_N, m_i, l_i, acc, qk_scale, False,
                                      IEEE_DOT)
    if full_end < end:
        key_ok = full_end + offs_n < end
        kb = DescK.load([row0 + full_end, 0])
        vb = tl.where(key_ok[:, None], DescV.load([row0 + full_end, 0]), 0.0)
        m_i, l_i, acc = _online_block(q, tl.trans(kb), vb, key_ok, m_i, l_i, acc, qk_scale, True, IEEE_DOT)
    return m_i, l_i, acc


@triton.jit
def key_range(q, m_i, l_i, acc, start, end, pid_bh, b64, kvh, K, V, BlockTables, DescK, DescV,
               stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_tb, n_max, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
               IEEE_DOT: tl.constexpr, USE_TMA: tl.constexpr):
    """Keys ``[start, end)`` of one (batch, kv head) folded into the online softmax (FA2 Algorithm 1, lines 8-10):
    TMA boxes (``_tma_blocks``) or pointer loads (``_attend_block``), a key block a step."""
    if USE_TMA:  # Hopper, contiguous cache: (BLOCK_N, d) TMA boxes of the (B * Hkv * Nmax, d) view
        m_i, l_i, acc = _tma_blocks(q, m_i, l_i, acc, DescK, DescV, pid_bh * n_max, start, end, qk_scale,
                                    BLOCK_N, IEEE_DOT)
    else:
        for start_n in range(start, end, BLOCK_N):
            m_i, l_i, acc = _attend_block(q, m_i, l_i, acc, start_n, end, b64, kvh, K, V, BlockTables,
                                          stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                                          stride_tb, qk_scale, HEAD_DIM, BLOCK_N, PAGED, PAGE_SIZE, IEEE_DOT)
    return m_i, l_i, acc


@triton.jit
def merge_if_last(OPart, LsePart, Out, Counters, pid_bh, b64, kvh, group, n_kv_heads, num_splits, stride_ob,
                  stride_oh, HEAD_DIM: tl.constexpr, MERGE_M: tl.constexpr, MERGE_CHUNK_S: tl.constexpr):
    """Stage 2 inside stage 1: take a ticket of this (batch, kv head); the program that draws the last one merges
    the group's splits (``fused_merge``) and resets the counter for the next launch. Returns whether it merged."""
    ticket = tl.atomic_add(Counters + pid_bh, 1, sem="acq_rel")
    last = ticket == num_splits - 1
    if last:
        tl.debug_barrier()
        fused_merge(OPart, LsePart, Out, b64, kvh, group, n_kv_heads, num_splits, 0, num_splits,
                    stride_ob, stride_oh, HEAD_DIM, MERGE_M, MERGE_CHUNK_S)
        tl.atomic_xchg(Counters + pid_bh, 0)  # ready for the next launch (kernel end orders it)
    return last


@triton.jit
def split_program(n_kv_heads):
    """Stage 1's program in the grid ``(num_splits, B * Hkv)`` -> ``(split, batch x kv head, batch, batch as int64
    for offsets, kv head)``: the (batch, kv head) picks the query rows (FA2 Algorithm 1's outer loop, line 3, one
    program per GQA group), the split a part of its key loop (line 6)."""
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_kv_heads
    return pid_s, pid_bh, b, b.to(tl.int64), pid_bh % n_kv_heads


@triton.jit
def split_bounds(SeqLens, b, pid_s, n_max, num_splits, BLOCK_N: tl.constexpr, HAS_SEQLENS: tl.constexpr):
    """Sequence ``b``'s key count, its key blocks and split ``pid_s``'s keys ``[start, end)``: the key blocks
    ``j = 1 .. T_c`` of FA2 Algorithm 1's loop (line 6), divided evenly over the splits; surplus splits get none."""
    if HAS_SEQLENS:
        seq_len = tl.load(SeqLens + b).to(tl.int32)
        seq_len = tl.minimum(tl.maximum(seq_len, 0), n_max)  # memory safety; the wrapper validates values
    else:
        seq_len = n_max
    n_blocks = tl.cdiv(seq_len, BLOCK_N)
    blocks_per_split = tl.cdiv(n_blocks, num_splits)
    start = pid_s * blocks_per_split * BLOCK_N
    end = tl.minimum(start + blocks_per_split * BLOCK_N, seq_len)
    return seq_len, n_blocks, start, end


@triton.jit
def group_query(Q, b64, kvh, group, stride_qb, stride_qh, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """The query heads of kv head ``kvh``'s group as the rows of one tile (GQA packing; rows past ``group`` read
    as 0: FA2 Algorithm 1, line 4's ``Q_i``) and the empty online-softmax state ``m = -inf, l = 0, acc = 0``
    (line 5)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < group
    heads = kvh * group + offs_m  # the query heads of this kv head's group: GQA packing
    q = tl.load(Q + b64 * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of base-2 scores
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    return q, heads, row_ok, m_i, l_i, acc


@triton.jit
def store_split(Out, OPart, LsePart, m_i, l_i, acc, b64, heads, row_ok, pid_s, n_kv_heads, group, num_splits,
                stride_ob, stride_oh, HEAD_DIM: tl.constexpr, DIRECT_OUT: tl.constexpr):
    """FA2 Algorithm 1, lines 12-15: ``o = acc / l`` and ``lse = m + log2 l``, written; one split writes the
    output, several their partial ``(o_s, lse_s)`` (base 2) for the merge."""
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]  # an empty split (or seq_len 0) leaves acc = 0: o = 0, lse = -inf
    offs_d = tl.arange(0, HEAD_DIM)
    if DIRECT_OUT:  # one split: this is the final output, no merge needed
        tl.store(Out + b64 * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(Out.dtype.element_ty), mask=row_ok[:, None])
    else:
        lse2 = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))  # base 2; -inf: the split saw no key
        row = (b64 * n_kv_heads * group + heads) * num_splits + pid_s  # OPart (B, Hq, S, d), LsePart (B, Hq, S)
        tl.store(OPart + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None])
        tl.store(LsePart + row, lse2, mask=row_ok)


@triton.jit
def _split_kv_kernel(
    Q, K, V, SeqLens, BlockTables, Out, OPart, LsePart, Counters, DescK, DescV,
    stride_qb, stride_qh,
    stride_kb, stride_kh, stride_kn,  # contiguous: (batch, head, token); paged: (block, head, token-in-block)
    stride_vb, stride_vh, stride_vn,
    stride_tb,  # block table row stride
    stride_ob, stride_oh,
    n_kv_heads, group, n_max, num_splits, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    DIRECT_OUT: tl.constexpr, IEEE_DOT: tl.constexpr,
    FUSED: tl.constexpr = False, MERGE_M: tl.constexpr = 1, MERGE_CHUNK_S: tl.constexpr = 1,
    USE_TMA: tl.constexpr = False,
):
    # IEEE_DOT: dots in true fp32, for fp32 inputs (no TF32) and under the interpreter (Triton 3.6's interpreter
    # multiplies bf16 operands as their raw uint16 bits).
    """Stage 1: partial attention of one GQA group over one split of the keys (FA2 Alg. 1 lines 8-10)."""
    pid_s, pid_bh, b, b64, kvh = split_program(n_kv_heads)
    _, _, start, end = split_bounds(SeqLens, b, pid_s, n_max, num_splits, BLOCK_N, HAS_SEQLENS)
    q, heads, row_ok, m_i, l_i, acc = group_query(Q, b64, kvh, group, stride_qb, stride_qh, HEAD_DIM, BLOCK_M)
    m_i, l_i, acc = key_range(q, m_i, l_i, acc, start, end, pid_bh, b64, kvh, K, V, BlockTables, DescK, DescV,
                              stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_tb,
                              n_max, qk_scale, HEAD_DIM, BLOCK_N, PAGED, PAGE_SIZE, IEEE_DOT, USE_TMA)
    store_split(Out, OPart, LsePart, m_i, l_i, acc, b64, heads, row_ok, pid_s, n_kv_heads, group, num_splits,
                stride_ob, stride_oh, HEAD_DIM, DIRECT_OUT)
    if FUSED and not DIRECT_OUT:
        # All threads' partial stores precede the ticket (barrier); the acq_rel atomic publishes them to
        # the program that draws the last ticket and makes the others' stores visible to it.
        tl.debug_barrier()
        merge_if_last(OPart, LsePart, Out, Counters, pid_bh, b64, kvh, group, n_kv_heads, num_splits, stride_ob,
                      stride_oh, HEAD_DIM, MERGE_M, MERGE_CHUNK_S)


#: stage 1 by its public name (``serving_aot.compile_decode`` compiles it ahead of time)
split_kv_kernel = _split_kv_kernel


@triton.jit
def _fused_merge_chunk(OPart, LsePart, row_base, h_ok, s0, s_end, m, den, acc,
                       HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr):
    """Fold the splits ``s0 .. min(s0 + CHUNK, s_end) - 1`` of every query head of a group into the running
    log-sum-exp merge (3-D tiles)."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_s = s0 + tl.arange(0, CHUNK)
    ok = h_ok[:, None] & (offs_s < s_end)[None, :]  # (M, CHUNK)
    rows = row_base[:, None] + offs_s[None, :]
    # .cg: read from L2, never a stale L1 line (other SMs wrote these partials)
    lse = tl.load(LsePart + rows, mask=ok, other=float("-inf"), cache_modifier=".cg")
    o_s = tl.load(OPart + rows[:, :, None] * HEAD_DIM + offs_d[None, None, :], mask=ok[:, :, None], other=0.0,
                  cache_modifier=".cg")  # (M, CHUNK, d)
    m_new = tl.maximum(m, tl.max(lse, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: keep weights 0, not NaN
    w = tl.exp2(lse - m_ref[:, None])
    alpha = tl.exp2(m - m_ref)
    den = den * alpha + tl.sum(w, 1)
    acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o_s, 1)
    return m_new, den, acc


@triton.jit
def merge_states(OPart, LsePart, row_base, h_ok, s_lo, s_hi,
                  HEAD_DIM: tl.constexpr, MERGE_M: tl.constexpr, CHUNK: tl.constexpr):
    """The log-sum-exp merge of the states ``s_lo .. s_hi - 1`` of rows ``row_base`` (one per query head of the
    group): ``o = sum_s exp2(lse_s - lse) o_s``, ``lse = log2 sum_s exp2(lse_s)`` (base 2; -inf, o = 0 when
    every state is empty)."""
    m = tl.full([MERGE_M], float("-inf"), tl.float32)
    den = tl.zeros([MERGE_M], tl.float32)
    acc = tl.zeros([MERGE_M, HEAD_DIM], tl.float32)
    for s0 in range(s_lo, s_hi, CHUNK):
        m, den, acc = _fused_merge_chunk(OPart, LsePart, row_base, h_ok, s0, s_hi, m, den, acc, HEAD_DIM, CHUNK)
    pos = den > 0
    o = acc / tl.where(pos, den, 1.0)[:, None]  # seq_len 0: every split empty, o = 0
    lse2 = tl.where(pos, m + tl.log2(tl.where(pos, den, 1.0)), float("-inf"))
    return o, lse2


@triton.jit
def fused_merge(OPart, LsePart, Out, b64, kvh, group, n_kv_heads, num_splits, s_lo, s_hi, stride_ob, stride_oh,
                 HEAD_DIM: tl.constexpr, MERGE_M: tl.constexpr, CHUNK: tl.constexpr):
    """Stage 2 inside stage 1: o = sum_s exp(lse_s - lse) o_s for the group's query heads (log-sum-exp merge)
    over the splits ``s_lo .. s_hi - 1`` of partial states laid out ``(B, Hq, num_splits)``."""
    offs_h = tl.arange(0, MERGE_M)
    offs_d = tl.arange(0, HEAD_DIM)
    h_ok = offs_h < group
    heads = kvh * group + offs_h
    row_base = (b64 * n_kv_heads * group + heads) * num_splits
    o, _ = merge_states(OPart, LsePart, row_base, h_ok, s_lo, s_hi, HEAD_DIM, MERGE_M, CHUNK)
    tl.store(Out + b64 * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], o.to(Out.dtype.element_ty),
             mask=h_ok[:, None])


@triton.jit
def _merge_chunk(OPart, LsePart, base, s0, num_splits, m, den, acc, HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr):
    """Fold CHUNK splits into the running (max, denominator, numerator) of the log-sum-exp merge."""
    offs_d = tl.arange(0, HEAD_DIM)
    offs_s = s0 + tl.arange(0, CHUNK)
    ok = offs_s < num_splits
    lse = tl.load(LsePart + base + offs_s, mask=ok, other=float("-inf"))
    o_s = tl.load(OPart + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
    m_new = tl.maximum(m, tl.max(lse, 0))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: keep weights 0, not NaN
    w = tl.exp2(lse - m_ref)
    alpha = tl.exp2(m - m_ref)
    den = den * alpha + tl.sum(w, 0)
    acc = acc * alpha + tl.sum(w[:, None] * o_s, 0)
    m = m_new
    return m, den, acc


@triton.jit
def _merge_kernel(OPart, LsePart, Out, stride_ob, stride_oh, n_heads, num_splits,
                  HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr):
    """Stage 2: o = sum_s exp(lse_s - lse) o_s over the splits, streamed CHUNK splits at a time (online merge)."""
    pid = tl.program_id(0)  # = b * n_heads + h
    b = pid // n_heads
    h = pid % n_heads
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full([1], float("-inf"), tl.float32)
    den = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    base = pid.to(tl.int64) * num_splits
    for s0 in range(0, num_splits, CHUNK):
        m, den, acc = _merge_chunk(OPart, LsePart, base, s0, num_splits, m, den, acc, HEAD_DIM, CHUNK)
    o = acc / tl.where(den > 0, den, 1.0)  # seq_len 0: every split empty, o = 0
    tl.store(Out + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, o.to(Out.dtype.element_ty))


def choose_num_splits(batch: int, n_kv_heads: int, n_keys: int, sms: int | None = None,
                      block_n: int | None = None) -> int:
    """Heuristic number of splits: fill the GPU, but give every split >= MIN_BLOCKS_PER_SPLIT key blocks.

    Stage 1 has ``batch * n_kv_heads * splits`` programs. We want about ``PROGRAMS_PER_SM * sms`` of them
    (two waves with the default config's one resident program per SM: splitting finer shortens each program
    so the second wave balances the first; measured on an H200 at batch 1, 33 splits beat 16, 24, 48, 64 and
    96 at 32k, 64k and 128k keys), so ``splits = round(target / (batch * n_kv_heads))``, capped so each split
    still streams ``MIN_BLOCKS_PER_SPLIT * block_n`` keys (splitting finer only adds partial-result traffic
    and merge work), then lowered to the number of splits that actually receive blocks. Rounding, not ceil:
    batch 32 x 8 kv heads = 256 programs already fill an H100/H200 (measured: 2 splits were 13% slower than
    1), so it gets 1 split; batch 8 gets ``round(264 / 64) = 4``; batch 1 at 64k keys wants
    ``round(264 / 8) = 33``, whose 16-block splits need only 32 programs, so 32.
    """
    sms = num_sms() if sms is None else sms
    block_n = configs.decode_pin("contiguous").block_n if block_n is None else block_n
    programs = max(1, batch * n_kv_heads)
    want = round(PROGRAMS_PER_SM * sms / programs)
    n_blocks = math.ceil(n_keys / block_n)
    splits = max(1, min(want, n_blocks // MIN_BLOCKS_PER_SPLIT))
    # Stage 1 gives each split ceil(n_blocks / splits) blocks; drop the splits that would then get none
    # (e.g. 33 -> 32 at 32k keys): the same work per program, fewer programs and partials to merge.
    return math.ceil(n_blocks / math.ceil(n_blocks / splits))


def _block_m(group: int) -> int:
    return max(16, triton.next_power_of_2(group))


def pin_kind(dtype, paged=False, num_splits=None) -> str:
    """The key of ``configs.DECODE_PINS`` for these inputs."""
    if dtype == torch.float32:
        return "fp32"
    if paged:
        return "paged_one_split" if num_splits == 1 else "paged"
    return "contiguous"


def base_config(dtype, paged=False, num_splits=None, config: DecodeConfig | None = None) -> DecodeConfig:
    """``config``, else the default stage-1 configuration for these inputs (``configs.decode_pin``)."""
    return config if config is not None else configs.decode_pin(pin_kind(dtype, paged, num_splits))


def decode_need(cfg: dict, d: int, es: int, limits, group: int = 1) -> _device.Need:
    return _device.Need(_device.smem_decode(cfg["block_n"], cfg["num_stages"], d, es, limits, _block_m(group)),
                        cfg["num_warps"])


def launch_config(dtype, paged=False, num_splits=None, d: int = 128, limits=None, group: int = 1,
                  config: DecodeConfig | None = None) -> dict:
    """``base_config(...).launch()`` (``block_n``, ``num_warps``, ``num_stages``), or on a GPU with less shared
    memory than it needs (T4, sm_86/89 at d = 128) the first of its fallbacks that fits (fewer stages, then
    shorter key blocks: ``_device.stage_ladder``). ``limits`` defaults to the current device's
    (``_device.device_limits``)."""
    limits = _device.device_limits() if limits is None else limits
    es = dtype.itemsize
    base = base_config(dtype, paged, num_splits, config).launch()
    return _device.pick_config(_device.stage_ladder(base, "block_n"), lambda c: decode_need(c, d, es, limits, group),
                               limits)


class DecodeCall(NamedTuple):
    """The checked arguments of one decode call, as ``launch_decode`` takes them."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    seq_lens: torch.Tensor | None
    block_tables: torch.Tensor | None
    n_max: int
    n_kv_heads: int
    scale: float
    num_splits: int
    page_size: int
    config: DecodeConfig | None


class Stage1(NamedTuple):
    """One stage-1 launch: ``_split_kv_kernel[grid](*args, **kwargs)``; ``out`` the output, ``o_part`` / ``lse_part``
    the splits' partial states (``out`` itself with one split); ``fused`` whether the kernel merges them."""
    grid: tuple
    args: tuple
    kwargs: dict
    out: torch.Tensor
    o_part: torch.Tensor
    lse_part: torch.Tensor
    fused: bool


def stage1(q, k, v, seq_lens, block_tables, n_max, n_kv_heads, scale, num_splits, page_size,
           config: DecodeConfig | None = None, counters=None) -> Stage1:
    """Stage 1's launch on validated inputs (a ``DecodeCall``'s fields); K/V strides name the layout. ``config``:
    the stage-1 ``DecodeConfig`` (None: ``base_config``'s default for these inputs). ``counters(device, n)``:
    ``n`` zeroed int32 ticket counters for the fused merge, which the kernel leaves zeroed (None: fresh zeros)."""
    B, Hq, d = q.shape
    paged = block_tables is not None
    group = Hq // n_kv_heads
    base = base_config(q.dtype, paged, num_splits, config)
    limits = _device.device_limits(q.device)
    cfg = launch_config(q.dtype, paged, num_splits, d, limits, group, config)
    use_tma = base.use_tma and tma_ok(q, k, v, paged, limits)
    out = torch.empty_like(q)
    if paged:  # cache (num_blocks, block_size, Hkv, d): (block, head, token-in-block)
        sk = (k.stride(0), k.stride(2), k.stride(1))
        sv = (v.stride(0), v.stride(2), v.stride(1))
        bt, stride_tb = block_tables, block_tables.stride(0)
    else:  # (B, Hkv, Nmax, d): (batch, head, token)
        sk = (k.stride(0), k.stride(1), k.stride(2))
        sv = (v.stride(0), v.stride(1), v.stride(2))
        bt, stride_tb = q, 0  # unused dummy pointer
    fused = num_splits > 1 and base.fuse_merge
    if num_splits > 1:
        o_part = torch.empty((B, Hq, num_splits, d), device=q.device, dtype=torch.float32)
        lse_part = torch.empty((B, Hq, num_splits), device=q.device, dtype=torch.float32)
    else:
        o_part = lse_part = out  # unused
    if not fused:
        tickets = out  # unused
    elif counters is None:
        tickets = torch.zeros(B * n_kv_heads, dtype=torch.int32, device=q.device)
    else:
        tickets = counters(q.device, B * n_kv_heads)
    merge_m = max(2, triton.next_power_of_2(group))
    chunk = min(triton.next_power_of_2(max(num_splits, 1)), max(1, base.merge_rows // merge_m))
    has_seq = seq_lens is not None
    desc_k, desc_v = descriptors(k, v, cfg["block_n"]) if use_tma else (k, v)
    args = (q, k, v, seq_lens if has_seq else q, bt, out, o_part, lse_part, tickets, desc_k, desc_v,
            q.stride(0), q.stride(1), *sk, *sv, stride_tb, out.stride(0), out.stride(1),
            n_kv_heads, group, n_max, num_splits, scale * LOG2E.value)
    kwargs = dict(HEAD_DIM=d, BLOCK_M=_block_m(group), BLOCK_N=cfg["block_n"], HAS_SEQLENS=has_seq, PAGED=paged,
                  PAGE_SIZE=page_size, DIRECT_OUT=num_splits == 1, IEEE_DOT=q.dtype == torch.float32 or INTERPRET,
                  FUSED=fused, MERGE_M=merge_m, MERGE_CHUNK_S=chunk, USE_TMA=use_tma,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return Stage1((num_splits, B * n_kv_heads), args, kwargs, out, o_part, lse_part, fused)


def merge_splits(st: Stage1) -> None:
    """Stage 2 as its own launch (``DecodeConfig(fuse_merge=False)``): ``_merge_kernel`` over the partial states."""
    B, Hq, num_splits, d = st.o_part.shape
    _merge_kernel[(B * Hq,)](st.o_part, st.lse_part, st.out, st.out.stride(0), st.out.stride(1), Hq, num_splits,
                             HEAD_DIM=d, CHUNK=MERGE_CHUNK, num_warps=4)


def launch_decode(q, k, v, seq_lens, block_tables, n_max, n_kv_heads, scale, num_splits, page_size,
                  config: DecodeConfig | None = None, counters=None, launch=None):
    """Run stage 1 (``stage1``) and, when num_splits > 1 without the fused merge, stage 2; returns the output.
    ``launch(kernel, grid, args, kwargs)``: how stage 1 is launched (None: ``kernel[grid](*args, **kwargs)``); the
    serving layer's recorded launches pass theirs (``reference.triton.decode_serving``)."""
    st = stage1(q, k, v, seq_lens, block_tables, n_max, n_kv_heads, scale, num_splits, page_size, config, counters)
    if launch is None:
        _split_kv_kernel[st.grid](*st.args, **st.kwargs)
    else:
        launch(_split_kv_kernel, st.grid, st.args, st.kwargs)
    if num_splits > 1 and not st.fused:
        merge_splits(st)
    return st.out


def tma_ok(q, k, v, paged, limits) -> bool:
    """TMA K/V boxes apply: a Hopper GPU (not the interpreter), a contiguous ``(B, Hkv, Nmax, d)`` fp16/bf16 cache
    (one 2-D ``(B * Hkv * Nmax, d)`` view) with 16-byte aligned bases; otherwise the pointer loads run."""
    return (not paged and _device.tma_device(q.device, limits) and q.dtype in (torch.float16, torch.bfloat16)
            and all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (k, v)))


def descriptors(k, v, block_n: int):
    """Host TMA descriptors of the K and V caches as ``(B * Hkv * Nmax, d)`` matrices, boxes ``(block_n, d)``."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    d = k.shape[-1]
    return tuple(TensorDescriptor(x, [x.numel() // d, d], [d, 1], [block_n, d]) for x in (k, v))


def check_call(q, k, v, seq_lens=None, num_splits=None, scale=None, validate=True, config=None) -> DecodeCall:
    """``flash_decode``'s checks (each bad argument named) and defaults: the ``DecodeCall`` it launches."""
    B = check_decode_q(q)[0]
    validate = _checks.check_flag(validate, "validate")
    config = check_decode_config(config)
    Bk, Hkv, n_max, _ = check_kv_cache(q, k, v, "k", "v", "(B, Hkv, Nmax, d)", hkv_axis=1)
    if Bk != B:
        raise ValueError(f"k must have batch size B={B} (q is {tuple(q.shape)}), got k {tuple(k.shape)}")
    if n_max == 0:
        raise ValueError(f"k and v must hold at least one key slot (Nmax >= 1), got k {tuple(k.shape)}")
    if seq_lens is not None:
        seq_lens = check_seq_lens(seq_lens, B, n_max, "Nmax = k.shape[2]", validate)
    return checked_call(q, k, v, seq_lens, None, n_max, Hkv, scale, num_splits, 1, config)


def checked_call(q, k, v, seq_lens, block_tables, n_max, n_kv_heads, scale, num_splits, page_size,
                 config) -> DecodeCall:
    """The ``DecodeCall`` of inputs whose tensors are checked: ``num_splits`` (None: ``choose_num_splits`` for
    the configuration's key block) and ``scale`` (None: ``1/sqrt(d)``) checked, q and the caches' rows made
    contiguous."""
    B, Hq, d = q.shape
    paged = block_tables is not None
    if num_splits is None:
        cfg = launch_config(q.dtype, paged, d=d, limits=_device.device_limits(q.device), group=Hq // n_kv_heads,
                            config=config)
        num_splits = choose_num_splits(B, n_kv_heads, n_max, block_n=cfg["block_n"])
    num_splits = _checks.check_positive_int(num_splits, "num_splits")
    scale = _checks.check_scale(scale, d)
    q = q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    return DecodeCall(q, k, v, seq_lens, block_tables, n_max, n_kv_heads, scale, num_splits, page_size, config)


def flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None, *, validate=True, config=None):
    """Split-KV decode attention (Flash-Decoding) with GQA packing; returns ``o (B, Hq, d)`` in q's dtype.

    q: ``(B, Hq, d)`` (one new token per sequence); k, v: ``(B, Hkv, Nmax, d)``, ``Hq % Hkv == 0``;
    seq_lens: ``(B,)`` int32/int64 tensor of valid key counts (None: all ``Nmax``); sequence ``b`` attends
    keys ``0 .. seq_lens[b]-1`` (a length of 0 gives output 0). num_splits: None picks
    ``choose_num_splits(B, Hkv, Nmax)``; any positive integer is accepted (surplus splits are empty).
    scale defaults to ``1/sqrt(d)``. validate=False skips the one check that needs a device sync (seq_lens
    values within ``[0, Nmax]``); out-of-range lengths are then clamped in the kernel, never read out of
    bounds. config: a ``reference.triton.configs.DecodeConfig`` (None: ``configs.decode_pin``, the tuned pin
    for the dtype). ``reference.triton.flash_decode`` is this call with recorded launches
    (``reference.triton.decode_serving``).
    """
    return launch_decode(*check_call(q, k, v, seq_lens, num_splits, scale, validate, config))

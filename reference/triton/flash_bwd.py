"""FlashAttention-2 backward in Triton with recomputation (FA2 paper, Algorithm 2), GQA and bottom-right causal.

``flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None) -> (dq, dk, dv)``. Nothing of size
``Nq x Nk`` is stored: P is recomputed tile by tile from Q, K and the forward's ``lse``. Three kernels:

1. ``_bwd_preprocess`` (Algorithm 2, line 4): ``D = rowsum(dO * O)`` and ``lse`` in base-2 units, with the
   ``-inf`` of a row that saw no key turned into ``+inf`` so that its recomputed ``P = exp2(s - lse)`` is 0
   (not ``exp2(s + inf) = inf``): such rows contribute nothing to any gradient and get ``dq = 0``.
2. ``_bwd_dkdv``: one program per KEY block ``K_j, V_j`` (Algorithm 2, lines 5-19) looping over the query
   blocks that can see it (lines 8-17), accumulating ``dK_j, dV_j`` on chip. The dQ update of line 15 is not
   done here: every key block adds into every ``dQ_i`` it sees, which across programs needs atomic adds.
3. ``_bwd_dq``: one program per QUERY block recomputing ``P`` and ``dS`` over its key blocks to form
   ``dQ_i = scale * sum_j dS_ij K_j`` (line 15 of Algorithm 2) in registers, written once.

The dQ organisation is a choice among three (lecture 04, section 3): the FA2 paper and its CUDA code use atomic
adds into an fp32 accumulator plus a conversion kernel (10 N^2 d backward matmul FLOPs, non-deterministic
summation order); the Triton tutorial loops over key blocks for dQ inside the dK/dV kernel; this module uses a
separate pass. The separate pass recomputes ``S`` and ``dP`` (14 N^2 d FLOPs, +40%) in exchange for
deterministic gradients, no fp32 scratch buffer and two small kernels that run unchanged in the interpreter.

GQA: the dK/dV program of kv head ``hk`` loops over the ``group`` query heads that read it and sums their
contributions in registers, so no per-query-head dK/dV copy is ever allocated (the alternative -- per query
head dK/dV, then a sum over the group -- costs ``group`` times the dK/dV memory). Causal key/query ranges are
split, as in the forward, into unmasked blocks and masked diagonal/ragged blocks; blocks that cannot see each
other are skipped.

Configuration is passed, never set on the module: ``config={"dkdv": {...}, "dq": {...}}`` pins one block
configuration per kernel (default ``reference.triton.configs.backward_pin()``: pinned in the interpreter,
autotuned on a GPU); ``use_tma`` loads the inner loops' tiles through tensor descriptors (``None``: where the
GPU and strides allow; default ``False``, pointer loads, as fast within noise on an H100). The fused atomic-dQ
variants that lost on speed are described, with their numbers, in notes/experiments_removed.md.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._checks import check_attention_inputs, check_backward_inputs, check_flag, check_scale
from ._kernel_helpers import LOG2E, causal_key_range, dot, dot_acc, pinned_or_tuned, varlen_bounds
from . import flash_fwd
from ._device import INTERPRET
from . import _device, configs
from .flash_fwd import Varlen, load_tile, packed_strides, tuning_bench

PRE_BLOCK = 64


# --------------------------------------------------------------------------------------------------------------
# line 4: D = rowsum(dO * O)
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _bwd_preprocess(O, DO, LSE, DELTA, LSE2,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    stride_lb, stride_lh, H, N_Q, CU_Q,
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, VARLEN: tl.constexpr = False):
    """FA2 Algorithm 2, line 4: ``D_i = rowsum(dO_i * O_i)``; also ``L_i`` in base 2 (``+inf`` if empty).

    ``LSE``, ``DELTA`` and ``LSE2`` share one layout (strides ``stride_lb, stride_lh``, rows contiguous);
    ``VARLEN``: rows of sequence ``b`` start at ``CU_Q[b]`` (see ``flash_fwd._attn_fwd``)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    q_start = 0
    if VARLEN:
        N_Q, _, q_start, _ = varlen_bounds(CU_Q, CU_Q, b, 0)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = rows < N_Q
    o = tl.load(O + b * stride_ob + h * stride_oh + (q_start + rows)[:, None] * stride_om
                + offs_d[None, :] * stride_od, mask=ok[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + (q_start + rows)[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row_off = b * stride_lb + h * stride_lh + q_start + rows
    lse = tl.load(LSE + row_off, mask=ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    tl.store(DELTA + row_off, delta, mask=ok)
    tl.store(LSE2 + row_off, lse2, mask=ok)


# --------------------------------------------------------------------------------------------------------------
# dK, dV: one program per key block (Algorithm 2, lines 5-19)
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _dkdv_block(dk, dv, k, v, q_base, do_base, lse2_base, delta_base, desc_q, desc_do, b, h,
                start_m, offs_m, offs_n, offs_d, q_strides, do_strides,
                N_Q, OFFSET, qk_scale, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                MASK_ROWS: tl.constexpr, INTERP: tl.constexpr, USE_TMA: tl.constexpr):
    """Lines 9-14 and 16 of Algorithm 2 for query block ``i`` (starting at ``start_m``), computed transposed
    (``P^T``, ``dS^T`` of shape ``BLOCK_N x BLOCK_M``) so the key block stays the row operand; line 15 (dQ) is
    the separate ``_bwd_dq`` pass. ``q_strides``, ``do_strides``: (batch, head, row, d) strides."""
    rows = start_m + offs_m
    # line 9: load Q_i, dO_i, L_i, D_i (rows past N_Q: zeros and L = +inf, so P = 0 there)
    q = load_tile(q_base, desc_q, b, h, start_m, offs_m, offs_d, q_strides[2], q_strides[3], N_Q, q_base, 0,
                   BLOCK_M, HEAD_DIM, USE_TMA, MASK_ROWS)
    do = load_tile(do_base, desc_do, b, h, start_m, offs_m, offs_d, do_strides[2], do_strides[3], N_Q, do_base, 0,
                    BLOCK_M, HEAD_DIM, USE_TMA, MASK_ROWS)
    if MASK_ROWS:
        rm = rows < N_Q
        l2 = tl.load(lse2_base + rows, mask=rm, other=float("inf"))
        di = tl.load(delta_base + rows, mask=rm, other=0.0)
    else:
        l2 = tl.load(lse2_base + rows)
        di = tl.load(delta_base + rows)
    # lines 10-11: S^T = K_j Q_i^T, P^T = exp(scale * S^T - L_i) (in base 2)
    pT = tl.math.exp2(dot(k, tl.trans(q), INTERP) * qk_scale - l2[None, :])
    if MASK_CAUSAL:
        pT = tl.where(offs_n[:, None] <= rows[None, :] + OFFSET, pT, 0.0)
    # line 12: dV_j += P^T dO_i
    dv = dot_acc(pT.to(do.dtype), do, dv, INTERP)
    # line 13: dP^T = V_j dO_i^T
    dpT = dot(v, tl.trans(do), INTERP)
    # line 14: dS = P * (dP - D_i)
    dsT = (pT * (dpT - di[None, :])).to(q.dtype)
    # line 16: dK_j += dS^T Q_i (the softmax scale is applied once, at the end)
    dk = dot_acc(dsT, q, dk, INTERP)
    return dk, dv


@triton.jit
def _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse2_base, delta_base, desc_q, desc_do,
                       b, h, lo, hi, offs_m, offs_n, offs_d, q_strides, do_strides, N_Q, OFFSET, qk_scale,
                       BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                       MASK_ROWS: tl.constexpr, INTERP: tl.constexpr, USE_TMA: tl.constexpr):
    """Line 8: loop over query blocks ``[lo, hi)``."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, lse2_base, delta_base, desc_q, desc_do,
                             b, h, start_m, offs_m, offs_n, offs_d, q_strides, do_strides, N_Q, OFFSET, qk_scale,
                             BLOCK_M, HEAD_DIM, MASK_CAUSAL, MASK_ROWS, INTERP, USE_TMA)
    return dk, dv


@triton.jit
def _sequence(CU_Q, CU_K, b, N_Q, N_K, VARLEN: tl.constexpr):
    """``(N_Q, N_K, first query row, first key row)`` of batch entry ``b``: the padded tensors' own, or with
    ``VARLEN`` those of sequence ``b`` of the packed batch (``varlen_bounds``)."""
    q_start = 0
    k_start = 0
    if VARLEN:
        N_Q, N_K, q_start, k_start = varlen_bounds(CU_Q, CU_K, b, 0)
    return N_Q, N_K, q_start, k_start


@triton.jit
def _bwd_dkdv(Q, K, V, DO, DK, DV, LSE2, DELTA, desc_q, desc_do,
              q_strides, k_strides, v_strides, do_strides, dk_strides, lse_strides,
              H_KV, N_Q, N_K, sm_scale, qk_scale, CU_Q, CU_K,
              GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, INTERP: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VARLEN: tl.constexpr = False,
              USE_TMA: tl.constexpr = False):
    """One program = key block ``j`` of one (batch, kv head): Algorithm 2, lines 6-18, summed over the GQA group.
    ``*_strides``: (batch, head, row, d) strides of each tensor (``lse_strides``: (batch, head) of LSE2 and
    DELTA, rows contiguous). (``VARLEN``: packed sequences, as in ``flash_fwd._attn_fwd``; dK/dV share K's
    layout.) ``USE_TMA``: Q and dO through tensor descriptors."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H_KV
    hk = pid_bh % H_KV
    N_Q, N_K, q_start, k_start = _sequence(CU_Q, CU_K, b, N_Q, N_K, VARLEN)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    b64 = b.to(tl.int64)
    key_ok = offs_n[:, None] < N_K
    # line 6: load K_j, V_j (key rows past N_K read zeros; their dK/dV rows are never stored)
    k = tl.load(K + b64 * k_strides[0] + hk.to(tl.int64) * k_strides[1] + (k_start + offs_n)[:, None] * k_strides[2]
                + offs_d[None, :] * k_strides[3], mask=key_ok, other=0.0)
    v = tl.load(V + b64 * v_strides[0] + hk.to(tl.int64) * v_strides[1] + (k_start + offs_n)[:, None] * v_strides[2]
                + offs_d[None, :] * v_strides[3], mask=key_ok, other=0.0)
    # line 7: dK_j = dV_j = 0
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Query blocks that see this key block (bottom-right causal: row i sees key j iff i >= j - OFFSET):
    # [q_lo, q_full) straddle the diagonal (masked), [q_full, q_even) see every key (no mask),
    # [q_tail, N_Q) is the ragged last block (row mask only). (Inline on purpose: as a @triton.jit helper the
    # (64, 64, 4, 2) causal d = 128 build spills 648 stack bytes instead of 432; notes/kernel_split.md.)
    OFFSET = N_K - N_Q
    if CAUSAL:
        q_lo = tl.maximum(start_n - OFFSET, 0) // BLOCK_M * BLOCK_M
        q_full = (tl.maximum(start_n + BLOCK_N - 1 - OFFSET, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        q_full = tl.minimum(q_full, (N_Q + BLOCK_M - 1) // BLOCK_M * BLOCK_M)
    else:
        q_lo = 0
        q_full = 0
    q_even = N_Q // BLOCK_M * BLOCK_M
    q_tail = tl.maximum(q_full, q_even)
    q_end = N_Q
    if VARLEN:  # a key block past this sequence's end: no query blocks, nothing stored
        live = start_n < N_K
        q_lo = tl.where(live, q_lo, 0)
        q_full = tl.where(live, q_full, 0)
        q_even = tl.where(live, q_even, 0)
        q_tail = tl.where(live, q_tail, 0)
        q_end = tl.where(live, q_end, 0)

    for g in range(GROUP):  # GQA: every query head of this kv head's group
        h32 = hk * GROUP + g  # descriptor coordinates are int32, addresses int64
        h = h32.to(tl.int64)
        q_base = Q + b64 * q_strides[0] + h * q_strides[1] + q_start * q_strides[2]
        do_base = DO + b64 * do_strides[0] + h * do_strides[1] + q_start * do_strides[2]
        lse2_base = LSE2 + b64 * lse_strides[0] + h * lse_strides[1] + q_start
        delta_base = DELTA + b64 * lse_strides[0] + h * lse_strides[1] + q_start
        # line 8: for each query block i: masked diagonal blocks, full blocks, the ragged last block
        dk, dv = _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse2_base, delta_base, desc_q, desc_do,
                                    b, h32, q_lo, q_full, offs_m, offs_n, offs_d, q_strides, do_strides,
                                    N_Q, OFFSET, qk_scale, BLOCK_M, HEAD_DIM, CAUSAL, True, INTERP, USE_TMA)
        dk, dv = _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse2_base, delta_base, desc_q, desc_do,
                                    b, h32, q_full, q_even, offs_m, offs_n, offs_d, q_strides, do_strides,
                                    N_Q, OFFSET, qk_scale, BLOCK_M, HEAD_DIM, False, False, INTERP, USE_TMA)
        dk, dv = _dkdv_query_blocks(dk, dv, k, v, q_base, do_base, lse2_base, delta_base, desc_q, desc_do,
                                    b, h32, q_tail, q_end, offs_m, offs_n, offs_d, q_strides, do_strides,
                                    N_Q, OFFSET, qk_scale, BLOCK_M, HEAD_DIM, False, True, INTERP, USE_TMA)

    # line 18: write dK_j (times the softmax scale, since S = scale * Q K^T) and dV_j
    dk_off = (b64 * dk_strides[0] + hk.to(tl.int64) * dk_strides[1] + (k_start + offs_n)[:, None] * dk_strides[2]
              + offs_d[None, :] * dk_strides[3])
    tl.store(DK + dk_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=key_ok)
    tl.store(DV + dk_off, dv.to(DV.dtype.element_ty), mask=key_ok)


# --------------------------------------------------------------------------------------------------------------
# dQ: one program per query block (Algorithm 2, line 15)
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _dq_block(dq, q, do, l2, di, k_base, v_base, desc_k, desc_v, b, hk, start_n, offs_m, offs_n, offs_d,
              k_strides, v_strides, N_K, OFFSET, qk_scale, BLOCK_N: tl.constexpr,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, INTERP: tl.constexpr,
              USE_TMA: tl.constexpr):
    """Recompute P_ij and dS_ij for key block ``j`` and add ``dS_ij K_j`` to dQ_i (lines 10-15)."""
    cols = start_n + offs_n
    k = load_tile(k_base, desc_k, b, hk, start_n, offs_n, offs_d, k_strides[2], k_strides[3], N_K, k_base, 0,
                   BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
    v = load_tile(v_base, desc_v, b, hk, start_n, offs_n, offs_d, v_strides[2], v_strides[3], N_K, v_base, 0,
                   BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
    # lines 10-11: P_ij = exp(scale * Q_i K_j^T - L_i)
    p = tl.math.exp2(dot(q, tl.trans(k), INTERP) * qk_scale - l2[:, None])
    if MASKED:
        ok = cols[None, :] < N_K
        if CAUSAL:
            ok = ok & (cols[None, :] <= offs_m[:, None] + OFFSET)
        p = tl.where(ok, p, 0.0)
    # line 13: dP_ij = dO_i V_j^T; line 14: dS_ij = P_ij * (dP_ij - D_i)
    ds = p * (dot(do, tl.trans(v), INTERP) - di[:, None])
    # line 15: dQ_i += dS_ij K_j
    dq = dot_acc(ds.to(k.dtype), k, dq, INTERP)
    return dq


@triton.jit
def _dq_key_blocks(dq, q, do, l2, di, k_base, v_base, desc_k, desc_v, b, hk, lo, hi, offs_m, offs_n, offs_d,
                   k_strides, v_strides, N_K, OFFSET, qk_scale,
                   BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                   INTERP: tl.constexpr, USE_TMA: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        dq = _dq_block(dq, q, do, l2, di, k_base, v_base, desc_k, desc_v, b, hk, start_n, offs_m, offs_n, offs_d,
                       k_strides, v_strides, N_K, OFFSET, qk_scale, BLOCK_N, HEAD_DIM, CAUSAL, MASKED, INTERP,
                       USE_TMA)
    return dq


@triton.jit
def _bwd_dq(Q, K, V, DO, DQ, LSE2, DELTA, desc_k, desc_v,
            q_strides, k_strides, v_strides, do_strides, dq_strides, lse_strides,
            H_Q, GROUP, N_Q, N_K, sm_scale, qk_scale, CU_Q, CU_K,
            HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, INTERP: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VARLEN: tl.constexpr = False,
            USE_TMA: tl.constexpr = False):
    """One program = query block ``i`` of one (batch, query head): dQ_i over the key blocks it sees
    (``*_strides`` as in ``_bwd_dkdv``; ``USE_TMA``: K and V through tensor descriptors)."""
    pid_m = tl.program_id(0)
    if CAUSAL:  # heaviest query blocks first, as in the forward
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b32 = pid_bh // H_Q
    b64 = b32.to(tl.int64)
    h = pid_bh % H_Q
    hk32 = h // GROUP
    hk = hk32.to(tl.int64)
    h = h.to(tl.int64)
    N_Q, N_K, q_start, k_start = _sequence(CU_Q, CU_K, b64, N_Q, N_K, VARLEN)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rm = offs_m < N_Q
    # line 9: Q_i, dO_i, L_i, D_i (rows past N_Q: zeros and L = +inf, never stored)
    rows = q_start + offs_m
    q = tl.load(Q + b64 * q_strides[0] + h * q_strides[1] + rows[:, None] * q_strides[2]
                + offs_d[None, :] * q_strides[3], mask=rm[:, None], other=0.0)
    do = tl.load(DO + b64 * do_strides[0] + h * do_strides[1] + rows[:, None] * do_strides[2]
                 + offs_d[None, :] * do_strides[3], mask=rm[:, None], other=0.0)
    row_off = b64 * lse_strides[0] + h * lse_strides[1] + rows
    l2 = tl.load(LSE2 + row_off, mask=rm, other=float("inf"))
    di = tl.load(DELTA + row_off, mask=rm, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_base = K + b64 * k_strides[0] + hk * k_strides[1] + k_start * k_strides[2]
    v_base = V + b64 * v_strides[0] + hk * v_strides[1] + k_start * v_strides[2]

    OFFSET = N_K - N_Q
    full_end, hi = causal_key_range(start_m, N_K, OFFSET, BLOCK_M, BLOCK_N, CAUSAL)
    if VARLEN:  # a query block past this sequence's end: no key blocks, nothing stored
        full_end = tl.where(start_m < N_Q, full_end, 0)
        hi = tl.where(start_m < N_Q, hi, 0)
    dq = _dq_key_blocks(dq, q, do, l2, di, k_base, v_base, desc_k, desc_v, b32, hk32, 0, full_end, offs_m, offs_n,
                        offs_d, k_strides, v_strides, N_K, OFFSET, qk_scale, BLOCK_N, HEAD_DIM, CAUSAL, False, INTERP,
                        USE_TMA)
    dq = _dq_key_blocks(dq, q, do, l2, di, k_base, v_base, desc_k, desc_v, b32, hk32, full_end, hi, offs_m, offs_n,
                        offs_d, k_strides, v_strides, N_K, OFFSET, qk_scale, BLOCK_N, HEAD_DIM, CAUSAL, True, INTERP,
                        USE_TMA)
    tl.store(DQ + b64 * dq_strides[0] + h * dq_strides[1] + rows[:, None] * dq_strides[2]
             + offs_d[None, :] * dq_strides[3], (dq * sm_scale).to(DQ.dtype.element_ty), mask=rm[:, None])


# --------------------------------------------------------------------------------------------------------------
# configs and autotuning
# --------------------------------------------------------------------------------------------------------------
def _configs(table):
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in table]


# (BLOCK_M, BLOCK_N, num_warps, num_stages); dK/dV keeps two BLOCK_N x d fp32 accumulators in registers.
# H100 sweep at d=128 (notes/hopper.md section 1): (64, 64, 4, 2) + (128, 64, 8, 3) lead non-causal.
DKDV_CONFIGS = [(64, 64, 4, 2), (64, 128, 8, 2), (32, 64, 4, 3), (32, 128, 8, 3)]
DQ_CONFIGS = [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 3)]
#: smaller GPUs (T4, sm_86/89), used only where no entry of the table above fits (notes/any_gpu.md); dK/dV
#: owns the key block (BLOCK_M <= BLOCK_N), dQ the query block (BLOCK_M >= BLOCK_N), as in the tables
DKDV_FALLBACK = [(32, 64, 4, 2), (32, 32, 4, 2), (16, 32, 4, 1)]
DQ_FALLBACK = [(64, 32, 4, 2), (32, 32, 4, 2), (32, 16, 4, 1)]


def bwd_need(cfg, d: int, es: int, limits) -> _device.Need:
    bm, bn, w, s = cfg
    return _device.Need(_device.smem_backward(bm, bn, s, d, es, limits), w)


def bwd_configs_for(table, fallback, d: int, es: int, limits) -> list:
    """The configs of ``table`` to autotune over on ``limits``: those that fit the device (and 8 warps for
    wide tiles at d = 128); if the warp rule drops all, the last that fits; if none fits, the first fitting
    entry of ``fallback``."""
    fit = [c for c in table if _device.fits(bwd_need(c, d, es, limits), limits)]
    kept = [c for c in fit if not (d >= 128 and c[1] * d > 8192 and c[2] < 8)]
    if kept:
        return kept
    if fit:
        return fit[-1:]
    return [_device.pick_config(fallback, lambda c: bwd_need(c, d, es, limits), limits)]


def _prune_for(table, fallback):
    def prune(configs, named_args, **kwargs):
        d = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
        q = named_args["Q"]
        want = bwd_configs_for(table, fallback, d, q.element_size(), _device.device_limits(q.device))
        kept = [c for c in configs if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in want]
        return kept or configs[-1:]
    return prune


_KEY = ["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "GROUP", "VARLEN", "USE_TMA"]


def _set_block_shapes(nargs):
    """Config pre-hook: a host tensor descriptor carries its block shape, which depends on the config."""
    bm, bn, d = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["HEAD_DIM"]
    for name, rows in (("desc_q", bm), ("desc_do", bm), ("desc_k", bn), ("desc_v", bn)):
        if isinstance(nargs.get(name), TensorDescriptor):
            nargs[name].block_shape = [1, 1, rows, d]


def _tuner(kernel, table, fallback):
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s, pre_hook=_set_block_shapes)
               for bm, bn, w, s in table + fallback]
    return triton.autotune(configs=configs, key=_KEY,
                           prune_configs_by={"early_config_prune": _prune_for(table, fallback)},
                           do_bench=tuning_bench)(kernel)


_bwd_dkdv_tuned = _tuner(_bwd_dkdv, DKDV_CONFIGS, DKDV_FALLBACK)
_bwd_dq_tuned = _tuner(_bwd_dq, DQ_CONFIGS, DQ_FALLBACK)


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def _desc(t, d):  # block shape set per config by _set_block_shapes
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 64, d])


def preprocess(o, do, lse, delta, lse2, Nq: int, varlen: Varlen | None = None, launch=None):
    """Algorithm 2 line 4 (``_bwd_preprocess``): write ``delta = rowsum(do * o)`` and ``lse2`` (``lse`` in base 2,
    ``+inf`` for rows that saw no key) for the first ``Nq`` rows of each head. ``delta``, ``lse2`` have ``lse``'s
    layout: dense ``(B, Hq, rows >= Nq)``, or ``(Hq, total_q)`` with ``varlen`` (packed ``o``, ``do``).
    ``launch(kernel, grid, args, kwargs)``: how the kernel is launched (None: ``kernel[grid](*args, **kwargs)``;
    the Hopper training op records the launch and returns what ``launch`` returns)."""
    d = o.shape[-1]
    if varlen is None:
        B, Hq = lse.shape[:2]
        st = lambda t: t.stride()  # noqa: E731
        lstr, cu_q, rows = (lse.stride(0), lse.stride(1)), lse, Nq
    else:
        B, Hq = varlen.batch, o.shape[1]
        st, lstr, cu_q, rows = packed_strides, (0, lse.stride(0)), varlen.cu_q, varlen.max_q
    grid = (triton.cdiv(rows, PRE_BLOCK), B * Hq)
    args = (o, do, lse, delta, lse2, *st(o), *st(do), *lstr, Hq, Nq, cu_q)
    meta = dict(BLOCK_M=PRE_BLOCK, HEAD_DIM=d, VARLEN=varlen is not None)
    if launch is not None:
        return launch(_bwd_preprocess, grid, args, meta)
    _bwd_preprocess[grid](*args, **meta)


def launch_backward(q, k, v, o, lse, do, dq, dk, dv, causal: bool, scale: float, group: int,
                    varlen: Varlen | None = None, config: dict | None = None, use_tma: bool | None = False) -> None:
    """Run the backward kernels on validated inputs, writing ``dq, dk, dv`` in place (layouts as in
    ``flash_fwd.launch_forward``; with ``varlen`` every tensor is packed, never paged). ``config``: see
    ``flash_attention_backward``; ``use_tma``: tensor-descriptor loads (``None``: where the GPU allows)."""
    d = q.shape[-1]
    if varlen is None:
        B, Hq, Nq, _ = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        rows = Nq
        st = lambda t: t.stride()  # noqa: E731
        cu_q = cu_k = q  # unused dummy pointers
    else:
        B, Hq, Hkv = varlen.batch, q.shape[1], k.shape[1]
        Nq, Nk = triton.next_power_of_2(varlen.max_q), triton.next_power_of_2(varlen.max_k)
        rows = varlen.max_q
        st = packed_strides
        cu_q, cu_k = varlen.cu_q, varlen.cu_k
    use_tma = varlen is None and _use_tma(use_tma, q, k, v, do)
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    lstr = (lse.stride(0), lse.stride(1)) if varlen is None else (0, lse.stride(0))
    preprocess(o, do, lse, delta, lse2, Nq, varlen)

    qk_scale = scale * LOG2E.value
    common = (st(q), st(k), st(v), st(do))
    kw = dict(HEAD_DIM=d, CAUSAL=causal, INTERP=INTERPRET, VARLEN=varlen is not None, USE_TMA=use_tma)
    keys = Nk if varlen is None else varlen.max_k
    pin = configs.backward_pin() if config is None else config
    pin = pin or {}
    descs = (_desc(q, d), _desc(do, d)) if use_tma else (q, q)
    dkdv = pinned_or_tuned(_bwd_dkdv, _bwd_dkdv_tuned, pin.get("dkdv"), pre_hook=_set_block_shapes)
    dkdv[lambda m: (triton.cdiv(keys, m["BLOCK_N"]), B * Hkv)](
        q, k, v, do, dk, dv, lse2, delta, *descs, *common, st(dk), lstr, Hkv, Nq, Nk, scale,
        qk_scale, cu_q, cu_k, GROUP=group, **kw)
    descs = (_desc(k, d), _desc(v, d)) if use_tma else (k, v)
    dq_kernel = pinned_or_tuned(_bwd_dq, _bwd_dq_tuned, pin.get("dq"), pre_hook=_set_block_shapes)
    dq_kernel[lambda m: (triton.cdiv(rows, m["BLOCK_M"]), B * Hq)](
        q, k, v, do, dq, lse2, delta, *descs, *common, st(dq), lstr, Hq, group, Nq, Nk, scale, qk_scale, cu_q, cu_k,
        **kw)


def _use_tma(use_tma, *tensors) -> bool:
    if use_tma is False:
        return False
    ok = flash_fwd.tma_ok(None, *tensors)
    if use_tma and not ok:
        raise ValueError("flash_attention_backward: use_tma=True needs a Hopper GPU and 16-byte aligned strides")
    return ok


def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, *, config=None, use_tma=False):
    """Gradients ``(dq, dk, dv)`` of ``sum(o * do)`` for ``o = attention(q, k, v)`` (FA2 Algorithm 2).

    ``o, lse`` are the forward's outputs (``flash_attention_forward``); ``do`` has ``o``'s shape. ``dk, dv``
    have ``k``'s shape: for GQA they are summed over the query heads of each kv head's group.
    ``config``: ``{"dkdv": {...}, "dq": {...}}`` (``BLOCK_M, BLOCK_N, num_warps, num_stages`` each) pins one
    configuration per kernel; ``None`` takes ``reference.triton.configs.backward_pin()`` (a pin in the
    interpreter, autotuning on a GPU). ``use_tma``: ``False`` (default) pointer loads, ``None`` tensor descriptors
    where the GPU and strides allow, ``True`` insists on them.
    """
    B, Hq, Hkv, Nq, Nk, d, group = check_attention_inputs(q, k, v)
    causal = check_flag(causal, "causal")
    scale = check_scale(scale, d)
    check_backward_inputs(q, o, lse, do)
    lse = lse.contiguous()
    dq = torch.empty((B, Hq, Nq, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((B, Hkv, Nk, d), dtype=k.dtype, device=k.device)
    dv = torch.empty((B, Hkv, Nk, d), dtype=v.dtype, device=v.device)
    launch_backward(q, k, v, o, lse, do, dq, dk, dv, causal, scale, group, config=config, use_tma=use_tma)
    return dq, dk, dv


def backward_flops(B: int, H: int, Nq: int, Nk: int, d: int, causal: bool) -> float:
    """FA convention: the backward counts 2.5x the forward's FLOPs (5 matmuls vs 2)."""
    f = 2.5 * 4.0 * B * H * Nq * Nk * d
    return f / 2 if causal else f


__all__ = ["flash_attention_backward", "backward_flops", "preprocess", "launch_backward"]

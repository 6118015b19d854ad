"""FlashAttention backward for Hopper in Gluon: one fused kernel, dQ by fp32 atomics (10 N^2 d matmul FLOPs).

``flash_attention_backward_gluon(q, k, v, o, lse, do, causal=False, scale=None) -> (dq, dk, dv)``, the contract
of ``flash_bwd.flash_attention_backward`` (FA2 paper, Algorithm 2; GQA, bottom-right causal, ragged N) restricted
to a Hopper GPU (compute capability 9.0), bfloat16/float16 and ``d`` in {64, 128}.

Why: our Triton backward runs dQ as a separate pass that recomputes ``S`` and ``dP`` (14 N^2 d FLOPs against the
10 of FA2/FA3), because a fused Triton tile spills at 255 registers (notes/hopper.md section 1b). Gluon writes
the wgmma calls, their waits and the operand placement itself, as in FA3 (Shah et al., 2024, section 3):

* one CTA (two warpgroups, 8 warps) per ``BLOCK_N = 128``-row key block ``K_j, V_j`` (Algorithm 2, lines 5-7),
  each warpgroup owning 64 key rows of the transposed tiles; ``dK_j, dV_j`` stay in registers (fp32);
* the query blocks ``Q_i, dO_i`` that can see the key block stream through a ``STAGES``-deep TMA/mbarrier ring
  (line 8-9), over every query head of the GQA group; ``L_i`` (base 2) and ``D_i = rowsum(dO_i * O_i)`` come
  from ``flash_bwd._bwd_preprocess`` (line 4) and are read with plain loads;
* per query block (lines 10-16, transposed so the key block is the M side of every wgmma):
  ``S^T = K_j Q_i^T`` and ``dP^T = V_j dO_i^T`` issued back to back, ``P^T = exp2(S^T scale log2 e - L_i)``
  computed while ``dP^T`` runs; ``dV_j += P^T dO_i`` with ``P^T`` a register operand; ``dS^T = P^T (dP^T - D_i)``;
  ``dK_j += dS^T Q_i`` (register operand) and ``dQ_i += dS_ij K_j``, whose A operand is ``dS^T`` written to
  shared memory and read through a transposed view; the dQ tile is added into an fp32 buffer with atomics
  (line 15) and ``flash_bwd._dq_convert`` scales and casts it at the end.

Ragged ``N``: tensors are viewed as 2-D ``(B * H * N, d)`` for TMA; query rows past ``N_Q`` get ``L = +inf`` (so
``P = 0``) and are never added into dQ; key rows past ``N_K`` are masked to ``P = 0`` and never stored.
The interpreter cannot run Gluon; ``tests/test_triton_gluon_bwd.py`` compiles the kernel for sm_90a on CPU.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from . import flash_bwd
from ._checks import check_attention_inputs, check_backward_inputs, check_flag, check_scale
from .flash_gluon import GLUON_DTYPES, GLUON_HEAD_DIMS, LOG2E_F, _tile_descriptor, check_gluon_device

#: (BLOCK_M query rows per step, BLOCK_N key rows per CTA, STAGES of the Q/dO ring, num_warps, EARLY_DP, DK_RS,
#: DQ_VEC: 1 scalar atomics, 2 / 4 vector reductions of 2 / 4 floats; PIPE: step t's dK/dQ products and dQ
#: atomics overlap step t+1's S^T)
#: the default is the timed one (notes/hopper.md section 1d); PIPE = (64, 128, 3, 8, False, False, 2, True) passes
#: the same float64 checks on an H100 but was not timed
DEFAULT_CONFIG = (64, 128, 2, 8, False, False, 2, False)


@gluon.jit
def _issue_q(desc_q, desc_do, q_smem, do_smem, bars, t, row_of_t, n_iter, STAGES: gl.constexpr):
    """TMA-copy ``Q_i, dO_i`` of step ``t`` (if ``t < n_iter``) into ring slot ``t % STAGES``."""
    slot = t % STAGES
    pred = t < n_iter
    bar = bars.index(slot)
    mbarrier.expect(bar, desc_q.block_type.nbytes + desc_do.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc_q, [row_of_t, 0], bar, q_smem.index(slot), pred=pred)
    tma.async_copy_global_to_shared(desc_do, [row_of_t, 0], bar, do_smem.index(slot), pred=pred)


@gluon.jit
def _q_row(t, per_head, m_lo, q_head0, N_Q, BLOCK_M: gl.constexpr):
    """Row of step ``t``'s query block in the 2-D ``(B * Hq * N_Q, d)`` view: head ``t // per_head`` of the group,
    block ``m_lo + t % per_head``."""
    return (q_head0 + t // per_head) * N_Q + (m_lo + t % per_head) * BLOCK_M


@gluon.jit
def _dq_add(dq_base, dq, dq_offs, red_offs, red_layout: gl.constexpr, DQ_VEC: gl.constexpr):
    """Algorithm 2 line 15 across CTAs: ``dQ_i += dS_ij K_j`` into the fp32 accumulator, ``DQ_VEC`` floats per
    reduction (1: Triton's scalar atomics; 2: the wgmma layout's column pairs; 4: after a layout conversion)."""
    if DQ_VEC == 0:  # timing ablation only (wrong dQ): plain stores in place of the reductions
        gl.store(dq_base + dq_offs, dq)
    elif DQ_VEC == 1:
        gl.atomic_add(dq_base + dq_offs, dq, sem="relaxed")
    elif DQ_VEC == 2:
        _red_add_v(dq_base + dq_offs, dq, 2)
    else:
        _red_add_v(dq_base + red_offs, gl.convert_layout(dq, red_layout), 4)


@gluon.jit
def _load_rows(LSE2, DELTA, t, n_iter, per_head, m_lo, q_head0, N_Q, offs, BLOCK_M: gl.constexpr):
    """``L_i`` (base 2) and ``D_i`` of step ``t``'s query block, one value per thread (rows past ``N_Q``, or no
    step ``t``: ``L = +inf``, so ``P = 0``). Per-element pointers in the wgmma layout would hold 2 x 16 64-bit
    addresses per thread; the caller broadcasts with a layout conversion instead."""
    start_m = (m_lo + t % per_head) * BLOCK_M
    row0 = (q_head0 + t // per_head) * N_Q + start_m
    ok = (offs < N_Q - start_m) & (t < n_iter)
    l2 = gl.load(LSE2 + row0 + offs, mask=ok, other=float("inf"))
    di = gl.load(DELTA + row0 + offs, mask=ok, other=0.0)
    return l2, di


@gluon.jit
def _mask_pt(pT, keys, start_m, N_Q, N_K, need_mask, col_l: gl.constexpr, BLOCK_M: gl.constexpr,
             CAUSAL: gl.constexpr):
    """``P^T`` (key rows ``keys``, query columns ``start_m ..``) set to 0 where a key is past ``N_K`` or, causal
    (bottom-right), after the query: row ``i`` sees key ``j`` iff ``j <= i + N_K - N_Q``. Only if ``need_mask``."""
    if need_mask:
        visible = keys[:, None] < N_K
        if CAUSAL:
            cols = start_m + gl.arange(0, BLOCK_M, layout=col_l)
            visible = visible & (keys[:, None] <= cols[None, :] + (N_K - N_Q))
        pT = gl.where(visible, pT, 0.0)
    return pT


@gluon.jit
def _store_dkdv(dk, dv, DK, DV, kv_row0, key0, N_K, sm_scale, layout: gl.constexpr, ROWS: gl.constexpr,
                HEAD_DIM: gl.constexpr):
    """Algorithm 2 lines 17-18: write ``dK`` (scaled once here) and ``dV`` of key rows ``key0 .. key0 + ROWS - 1``
    (those ``< N_K``) of the kv head whose first row is ``kv_row0``."""
    out_keys = key0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    ok = (out_keys[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    off = (kv_row0 + out_keys).to(gl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
    gl.store(DK + off, (dk * sm_scale).to(DK.dtype.element_ty), mask=ok)
    gl.store(DV + off, dv.to(DV.dtype.element_ty), mask=ok)


@gluon.jit
def _red_add_v(ptrs, x, VEC: gl.constexpr):
    """``*ptrs += x`` with sm_90's vector reduction ``red.global.add.v{VEC}.f32`` (Triton emits one scalar atomic
    per element); each thread's ``VEC`` consecutive elements must be contiguous and ``4 VEC``-byte aligned."""
    addr = ptrs.to(gl.int64, bitcast=True)
    bits = x.to(gl.int32, bitcast=True)
    if VEC == 4:
        gl.inline_asm_elementwise(
            "red.relaxed.gpu.global.add.v4.f32 [$4], {$8, $9, $10, $11};\n"
            "mov.b32 $0, 0;\nmov.b32 $1, 0;\nmov.b32 $2, 0;\nmov.b32 $3, 0;",
            "=r,=r,=r,=r,l,l,l,l,r,r,r,r", [addr, bits], dtype=gl.int32, is_pure=False, pack=4)
    else:
        gl.inline_asm_elementwise(
            "red.relaxed.gpu.global.add.v2.f32 [$2], {$4, $5};\nmov.b32 $0, 0;\nmov.b32 $1, 0;",
            "=r,=r,l,l,r,r", [addr, bits], dtype=gl.int32, is_pure=False, pack=2)


@gluon.jit
def _bwd_kernel(desc_q, desc_k, desc_v, desc_do, DQ_ACC, DK, DV, LSE2, DELTA, H_KV, GROUP, N_Q, N_K,
                qk_scale, sm_scale,
                HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                CAUSAL: gl.constexpr, EARLY_DP: gl.constexpr, DK_RS: gl.constexpr,
                DQ_VEC: gl.constexpr, PIPE: gl.constexpr, num_warps: gl.constexpr):
    """One CTA = key block ``j`` of one (batch, kv head); grid ``(cdiv(N_K, BLOCK_N), B * H_KV)`` (Alg. 2 l. 5-19)."""
    dtype: gl.constexpr = desc_q.dtype
    # transposed tiles: key rows split over the warpgroups
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    # dQ_i (BLOCK_M x d): the warpgroups split the head dimension
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, num_warps // 4],
                                                        instr_shape=[16, HEAD_DIM // (num_warps // 4), 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_l: gl.constexpr = gl.SliceLayout(0, st_layout)
    key_l: gl.constexpr = gl.SliceLayout(1, st_layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)

    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // H_KV
    hk = pid_bh % H_KV
    start_n = pid_n * BLOCK_N
    kv_row0 = pid_bh * N_K
    OFFSET = N_K - N_Q

    k_buf = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_buf = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_q.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_do.layout)
    ds_bufs = gl.allocate_shared_memory(dtype, [2 if PIPE else 1, BLOCK_N, BLOCK_M], ds_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_bars.index(i), count=1)
    fence_async_shared()

    # query blocks that see this key block (row i sees key j iff j <= i + OFFSET): [m_lo, n_m) of BLOCK_M
    n_m = gl.cdiv(N_Q, BLOCK_M)
    N_Q_PAD = n_m * BLOCK_M
    if CAUSAL:
        m_lo = gl.minimum(gl.maximum(start_n - OFFSET, 0) // BLOCK_M, n_m)
        # blocks < m_full straddle the diagonal: masked
        m_full = gl.minimum(gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - OFFSET, 0), BLOCK_M), n_m)
    else:
        m_lo = 0
        m_full = 0
    per_head = n_m - m_lo
    n_iter = per_head * GROUP
    key_ragged = start_n + BLOCK_N > N_K
    q_head0 = b * H_KV * GROUP + hk * GROUP  # first query head of the group

    mbarrier.expect(kv_bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, [kv_row0 + start_n, 0], kv_bar, k_buf.index(0))
    tma.async_copy_global_to_shared(desc_v, [kv_row0 + start_n, 0], kv_bar, v_buf.index(0))
    for i in gl.static_range(STAGES):
        _issue_q(desc_q, desc_do, q_smem, do_smem, q_bars, i, _q_row(i, gl.maximum(per_head, 1), m_lo, q_head0, N_Q,
                 BLOCK_M), n_iter, STAGES)

    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    keys = start_n + gl.arange(0, BLOCK_N, layout=key_l)
    offs_lm = gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
    dq_rows_l: gl.constexpr = gl.SliceLayout(1, dq_layout)
    offs_dq_m = gl.arange(0, BLOCK_M, layout=dq_rows_l)
    offs_dq_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    dq_offs = offs_dq_m[:, None] * HEAD_DIM + offs_dq_d[None, :]
    red_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
    red_offs = (gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, red_layout))[:, None] * HEAD_DIM
                + gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, red_layout))[None, :])
    l2n, din = _load_rows(LSE2, DELTA, 0, n_iter, per_head, m_lo, q_head0, N_Q, offs_lm, BLOCK_M)
    dq = dq_zero
    prev_base = DQ_ACC
    # P^T as dV's register operand: kept alive (a wait's deps) until its product retires
    p_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, layout=a_layout)
    gl.static_assert(not (PIPE and DK_RS), "PIPE keeps dS^T's operand in shared memory (DK_RS=False)")
    if PIPE:  # the products are carried across iterations unfinished: loop-carried as wgmma accumulators
        dk = warpgroup_mma_init(dk)
        dv = warpgroup_mma_init(dv)
        dq = warpgroup_mma_init(dq)
    mbarrier.wait(kv_bar, 0)

    for t in range(n_iter):
        g = t // per_head
        m = m_lo + t % per_head
        start_m = m * BLOCK_M
        q_row = (q_head0 + g) * N_Q + start_m
        slot = t % STAGES
        # index 0 written so that the compiler cannot hoist K's and V's wgmma descriptors out of the loop: held
        # across it, a dozen 64-bit descriptors spill (measured with the sm_90a compile: 25 spills -> see notes)
        k_smem = k_buf.index(t >> 30)
        v_smem = v_buf.index(t >> 30)
        # line 9: L_i, D_i were loaded one step ahead (their latency hides under this step); fetch the next ones
        l2c = l2n
        dic = din
        l2n, din = _load_rows(LSE2, DELTA, t + 1, n_iter, per_head, m_lo, q_head0, N_Q, offs_lm, BLOCK_M)
        mbarrier.wait(q_bars.index(slot), (t // STAGES) & 1)
        qs = q_smem.index(slot)
        dos = do_smem.index(slot)
        ds_smem = ds_bufs.index(t % 2 if PIPE else 0)
        # lines 10 and 13: S^T = K Q^T, dP^T = V dO^T, both in flight
        sT = warpgroup_mma(k_smem, qs.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        if EARLY_DP:  # dP^T runs under the exponentials (two 128 x BLOCK_M fp32 tiles live at once)
            dpT = warpgroup_mma(v_smem, dos.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        if PIPE:  # step t-1's products retire first (in order); its dQ atomics run under S^T (and dP^T)
            dv, dk, dq, p_op = warpgroup_mma_wait(2 if EARLY_DP else 1, deps=(dv, dk, dq, p_op))
            if t > 0:
                _dq_add(prev_base, dq, dq_offs, red_offs, red_layout, DQ_VEC)
        if EARLY_DP:
            sT = warpgroup_mma_wait(1, deps=(sT,))
        else:
            sT = warpgroup_mma_wait(0, deps=(sT,))
        # line 11: P^T = exp2(S^T * scale * log2 e - L) (masked: causal diagonal, key rows past N_K)
        l2 = gl.convert_layout(l2c, col_l)
        pT = gl.exp2(sT * qk_scale - l2[None, :])
        need_mask = key_ragged
        if CAUSAL:
            need_mask = need_mask | (m < m_full)
        pT = _mask_pt(pT, keys, start_m, N_Q, N_K, need_mask, col_l, BLOCK_M, CAUSAL)
        # line 12: dV += P^T dO
        pT = pT.to(dtype)  # kept in 16 bits: dS^T below is rounded to 16 bits anyway
        p_op = gl.convert_layout(pT, a_layout)
        if not EARLY_DP:  # dP^T and dV issued together; dS^T is computed while dV runs
            dpT = warpgroup_mma(v_smem, dos.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dv = warpgroup_mma(p_op, dos, dv, is_async=True)
        dpT = warpgroup_mma_wait(1, deps=(dpT,))
        # line 14: dS^T = P^T (dP^T - D)
        di = gl.convert_layout(dic, col_l)
        dsT = (pT.to(gl.float32) * (dpT - di[None, :])).to(dtype)
        ds_smem.store(dsT)
        fence_async_shared()
        gl.thread_barrier()  # dS^T of both warpgroups written before either reads it for dQ
        if PIPE:
            if t > 0:  # every warp is past step t-1's dK/dV/dQ: its Q/dO slot is free
                _issue_q(desc_q, desc_do, q_smem, do_smem, q_bars, t - 1 + STAGES,
                         _q_row(t - 1 + STAGES, per_head, m_lo, q_head0, N_Q, BLOCK_M), n_iter, STAGES)
        # line 16: dK += dS^T Q; line 15: dQ_i += dS K (A: the transposed view of dS^T in shared memory)
        if DK_RS:  # A operand from registers (a layout shuffle; waited for below) or from the shared copy
            ds_op = gl.convert_layout(dsT, a_layout)
            dk = warpgroup_mma(ds_op, qs, dk, is_async=True)
        else:
            dk = warpgroup_mma(ds_smem, qs, dk, is_async=True)
        dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_zero, use_acc=False, is_async=True)
        # DQ_ACC is padded to whole query blocks per head: no mask, every row exists
        dq_base = DQ_ACC + ((q_head0 + g) * N_Q_PAD + start_m).to(gl.int64) * HEAD_DIM
        if DK_RS:
            dv, dk, dq, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, dq, p_op, ds_op))
        if not PIPE:
            dv, dk, dq, p_op = warpgroup_mma_wait(0, deps=(dv, dk, dq, p_op))
            gl.thread_barrier()  # every warp is done with slot and ds_smem
            _issue_q(desc_q, desc_do, q_smem, do_smem, q_bars, t + STAGES, _q_row(t + STAGES, per_head, m_lo, q_head0,
                     N_Q, BLOCK_M), n_iter, STAGES)
            _dq_add(dq_base, dq, dq_offs, red_offs, red_layout, DQ_VEC)
        prev_base = dq_base
    if PIPE:  # the last step's dQ
        dv, dk, dq, p_op = warpgroup_mma_wait(0, deps=(dv, dk, dq, p_op))
        if n_iter > 0:
            _dq_add(prev_base, dq, dq_offs, red_offs, red_layout, DQ_VEC)

    _store_dkdv(dk, dv, DK, DV, kv_row0, start_n, N_K, sm_scale, kv_layout, BLOCK_N, HEAD_DIM)


def check_backward_args(q, k, v, o, lse, do, causal, scale, name="flash_attention_backward_gluon"):
    """The input checks of the Gluon backwards (``name`` is the entry point the messages name); return
    ``(B, Hq, Hkv, Nq, Nk, d, group, causal, scale)``. The device check comes last, so a bad argument is named
    before a missing GPU."""
    B, Hq, Hkv, Nq, Nk, d, group = check_attention_inputs(q, k, v, head_dims=GLUON_HEAD_DIMS)
    if q.dtype not in GLUON_DTYPES:
        raise ValueError(f"{name}: q, k, v must be bfloat16 or float16, got {q.dtype}")
    causal = check_flag(causal, "causal")
    scale = check_scale(scale, d)
    check_backward_inputs(q, o, lse, do)
    return B, Hq, Hkv, Nq, Nk, d, group, causal, scale


def check_backward_device(device, name="flash_attention_backward_gluon"):
    """``check_gluon_device`` with the message naming the backward entry point ``name``."""
    check_gluon_device(device, name)


def backward_preprocess(o, do, lse, Nq, rows=None):
    """FA2 Algorithm 2 line 4 with ``flash_bwd._bwd_preprocess``: ``(delta, lse2)``, ``D = rowsum(dO * O)`` and
    ``L`` in base 2, both ``(B, Hq, rows)`` float32; ``rows >= Nq`` pads each head (``D = 0``, ``L = +inf``: no
    probability mass) so that a TMA box of whole query blocks never crosses a head."""
    rows = rows or Nq
    if rows != Nq:
        lse = torch.nn.functional.pad(lse, (0, rows - Nq))
        delta = torch.zeros_like(lse)
        lse2 = torch.full_like(lse, float("inf"))
    else:
        delta = torch.empty_like(lse)
        lse2 = torch.empty_like(lse)
    B, Hq = lse.shape[:2]
    st = lambda t: t.stride()  # noqa: E731
    pre = flash_bwd.PRE_BLOCK
    flash_bwd._bwd_preprocess[(triton.cdiv(Nq, pre), B * Hq)](
        o, do, lse, delta, lse2, *st(o), *st(do), lse.stride(0), lse.stride(1), Hq, Nq, lse, BLOCK_M=pre,
        HEAD_DIM=o.shape[-1])
    return delta, lse2


def finish_dq(dq_acc, q, scale):
    """``dq = scale * dq_acc`` in ``q``'s dtype; ``dq_acc (B, Hq, Nq_pad, d)`` fp32, padded to whole query blocks."""
    Nq = q.shape[2]
    if dq_acc.shape[2] != Nq:
        return (dq_acc[:, :, :Nq] * scale).to(q.dtype)
    dq = torch.empty_like(q)
    n = dq.numel()
    flash_bwd._dq_convert[(triton.cdiv(n, flash_bwd.CONVERT_BLOCK),)](dq_acc, dq, n, scale,
                                                                      BLOCK=flash_bwd.CONVERT_BLOCK)
    return dq


def flash_attention_backward_gluon(q, k, v, o, lse, do, causal=False, scale=None, config=None):
    """Gradients ``(dq, dk, dv)`` of ``sum(o * do)``, as ``flash_bwd.flash_attention_backward``, on Hopper.

    ``config``: ``(BLOCK_M, BLOCK_N, STAGES, num_warps, EARLY_DP, DK_RS, DQ_VEC, PIPE)``, default
    ``DEFAULT_CONFIG``;
    ``EARLY_DP`` issues ``dP^T = V dO^T`` right after ``S^T`` (it runs under the exponentials, at the cost of
    registers); ``DK_RS`` feeds ``dS^T`` to ``dK += dS^T Q`` from registers instead of shared memory;
    ``DQ_VEC`` (1, 2, 4; 0: a timing ablation with plain stores, wrong dQ) floats per atomic add into the dQ
    accumulator; ``PIPE`` leaves step ``t``'s ``dK``/``dQ``
    products running into step ``t + 1`` (whose ``S^T`` they share the tensor cores with) and adds ``dQ_t``
    there (two ``dS^T`` buffers; use ``STAGES >= 3``, since a Q/dO slot is refilled one step later).
    """
    B, Hq, Hkv, Nq, Nk, d, group, causal, scale = check_backward_args(q, k, v, o, lse, do, causal, scale)
    if config is not None and (not isinstance(config, (tuple, list)) or len(config) != 8):
        raise ValueError("config must be a tuple of 8 (BLOCK_M, BLOCK_N, STAGES, num_warps, EARLY_DP, DK_RS, DQ_VEC, "
                         f"PIPE), got {config!r}")
    check_backward_device(q.device)
    bm, bn, stages, warps, early_dp, dk_rs, dq_vec, pipe = config or DEFAULT_CONFIG
    q, k, v, o, do = (x.contiguous() for x in (q, k, v, o, do))
    lse = lse.contiguous()
    delta, lse2 = backward_preprocess(o, do, lse, Nq)
    nq_pad = triton.cdiv(Nq, bm) * bm
    dq_acc = torch.zeros((B, Hq, nq_pad, d), dtype=torch.float32, device=q.device)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    q2, k2, v2, do2 = (x.view(-1, d) for x in (q, k, v, do))
    _bwd_kernel[(triton.cdiv(Nk, bn), B * Hkv)](
        _tile_descriptor(q2, bm, d), _tile_descriptor(k2, bn, d), _tile_descriptor(v2, bn, d),
        _tile_descriptor(do2, bm, d), dq_acc, dk, dv, lse2, delta, Hkv, group, Nq, Nk, scale * LOG2E_F, scale,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, CAUSAL=causal, EARLY_DP=early_dp, DK_RS=dk_rs,
        DQ_VEC=dq_vec, PIPE=pipe, num_warps=warps)
    return finish_dq(dq_acc, q, scale), dk, dv


def compile_backward(head_dim: int = 128, causal: bool = False, config=None, dtype: str = "bf16"):
    """Compile the backward kernel for sm_90a ahead of time (no GPU needed); return the compiled kernel
    (``reference.triton._aot.resource_usage`` reads its registers, spills and SASS). Run in a process with
    ``TRITON_INTERPRET=0``."""
    from ._aot import compile_gluon, descriptor_signature
    bm, bn, stages, warps, early_dp, dk_rs, dq_vec, pipe = config or DEFAULT_CONFIG
    sig = {"desc_q": descriptor_signature(bm, head_dim, dtype), "desc_k": descriptor_signature(bn, head_dim, dtype),
           "desc_v": descriptor_signature(bn, head_dim, dtype), "desc_do": descriptor_signature(bm, head_dim, dtype),
           "DQ_ACC": "*fp32", "DK": f"*{dtype}", "DV": f"*{dtype}", "LSE2": "*fp32", "DELTA": "*fp32",
           "H_KV": "i32", "GROUP": "i32", "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32", "sm_scale": "fp32"}
    cx = {"HEAD_DIM": head_dim, "BLOCK_M": bm, "BLOCK_N": bn, "STAGES": stages, "CAUSAL": causal,
          "EARLY_DP": early_dp, "DK_RS": dk_rs, "DQ_VEC": dq_vec, "PIPE": pipe, "num_warps": warps}
    return compile_gluon(_bwd_kernel, sig, cx, warps)


__all__ = ["flash_attention_backward_gluon", "compile_backward", "DEFAULT_CONFIG"]

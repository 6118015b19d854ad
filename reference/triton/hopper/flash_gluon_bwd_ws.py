"""FlashAttention backward for Hopper in Gluon, warp-specialised (FA3 section 3.1 applied to FA2 Algorithm 2).

``flash_attention_backward_gluon_ws(q, k, v, o, lse, do, causal=False, scale=None, dq_mode="split",
config=None) -> (dq, dk, dv)``: the contract of ``flash_bwd.flash_attention_backward`` (FA2 Algorithm 2; GQA,
bottom-right causal, ragged N) on Hopper, bfloat16/float16, ``d`` in {64, 128}. The preprocess (``L`` in base 2,
``D = rowsum(dO * O)``), the final dQ scale/cast and the checks are the wing's (``hopper.common``).

It superseded a serial Gluon kernel (one partition of 8 warps waiting for each matmul with CTA barriers and
adding dQ with atomics from its own threads; notes/hopper.md section 1d, notes/experiments_removed.md): this
one splits the CTA by role, as the Gluon forward's ping-pong kernel does (section 1e has the attempts and
numbers):

* one CTA per ``BLOCK_N = 128``-row key block ``K_j, V_j`` (Algorithm 2, lines 5-7); ``gl.warp_specialize``
  partitions: a **producer** warp that TMA-loads ``K_j, V_j`` once and then, per step, ``Q_i, dO_i``
  (``BLOCK_M = 64`` rows) and the rows ``L_i, D_i`` of every query block that sees the key block into a
  ``STAGES``-deep ring (ready/empty mbarriers, the empty ones counting both consumers); two **consumer**
  warpgroups, consumer ``w`` owning key rows ``64 w .. 64 w + 63`` with its own fp32 ``dK, dV`` (64 x d each);
  ``setmaxnreg`` budgets (240 registers per consumer thread, 24 for the producer);
* per step and consumer (lines 10-16, transposed so the key rows are the wgmma M side): ``S^T = K_w Q_i^T`` and
  ``dP^T = V_w dO_i^T`` in flight together, ``P^T = exp2(S^T scale log2 e - L_i)`` (masked on the causal diagonal
  and past ``N_K`` only), ``dV_w += P^T dO_i`` (``P^T`` a register operand), ``dS^T = P^T (dP^T - D_i)``,
  ``dK_w += dS^T Q_i`` (register operand), then line 15, ``dQ_i += dS_ij K_j``, by ``dq_mode``:

  - ``"split"`` (default): both consumers write ``dS^T`` to shared memory and meet on an mbarrier; consumer
    ``w`` computes the head-dimension half ``w`` of ``dQ_i`` over all 128 keys, ``sum_u dS_u K_u[:, half w]``:
    one reduction per dQ element per key block, as in FA3;
  - ``"own"``: each consumer multiplies its own 64 keys, ``dS_w K_w`` (64 x d): no meeting, twice the reductions;

* ``config = (BLOCK_M, STAGES, DQ_TMA, DEFER, LD_TMA)``, default ``(64, 2, True, True, True)``: ``DQ_TMA`` stages
  the dQ tile in shared memory and has the copy engine add it into the fp32 buffer (a TMA reduce,
  ``cp.reduce.async.bulk.tensor``), instead of ``red.global.add.v2.f32`` from the consumers' registers;
  ``DEFER`` issues step ``t``'s dQ product at the end of step ``t + 1``, so the consumers wait for each other's
  ``dS^T`` one step late; ``LD_TMA`` has the producer copy ``L_i, D_i`` (padded per head) into the ring,
  instead of the consumers loading and shuffling them. The non-default values are the measured attempts.

Ragged ``N``: query rows past ``N_Q`` get ``L = +inf`` (``P = 0``) and land in the
padded rows of the dQ buffer; key rows past ``N_K`` are masked to ``P = 0`` and never stored. The interpreter
cannot run Gluon; ``tests/test_triton_gluon_bwd_ws.py`` compiles the kernel for sm_90a on CPU.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ._aot import compile_gluon, descriptor_signature
from .common import (LOG2E_F, backward_preprocess, check_backward_args, check_gluon_device, finish_dq, load_rows,
                     mask_pt, q_row, red_add_v2, store_dkdv, tile_descriptor)

NAME = "flash_attention_backward_gluon_ws"
DQ_MODES = ("split", "own")
#: (BLOCK_M query rows per step, STAGES of the Q/dO ring, DQ_TMA, DEFER, LD_TMA); the key block is 128 rows, 64
#: per consumer
DEFAULT_CONFIG = (64, 2, True, True, True)
BLOCK_N = 128
#: setmaxnreg budgets (second consumer warpgroup, producer warp) and the kernel-wide cap they are carved from
#: (2 x 128 x 240 + 32 x 24 <= 64K registers), as in the forward's ping-pong kernel
WS_REGS = (240, 24)
WS_MAXNREG = 168


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``global[coord] += src`` for a shared-memory tile, by the copy engine (``cp.reduce.async.bulk.tensor``; Gluon
    3.6's Hopper ``tma`` module has no wrapper, its builder does). Completes like a TMA store (``tma.store_wait``)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _query_blocks(start_n, N_Q, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Query blocks ``[m_lo, n_m)`` of ``BLOCK_M`` rows that see key rows ``start_n .. start_n + BLOCK_N - 1``;
    blocks ``< m_full`` straddle the causal diagonal (masked). Bottom-right causal: row ``i`` sees key ``j`` iff
    ``j <= i + N_K - N_Q``."""
    n_m = gl.cdiv(N_Q, BLOCK_M)
    if CAUSAL:
        offset = N_K - N_Q
        m_lo = gl.minimum(gl.maximum(start_n - offset, 0) // BLOCK_M, n_m)
        m_full = gl.minimum(gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - offset, 0), BLOCK_M), n_m)
    else:
        m_lo = 0
        m_full = 0
    return m_lo, m_full, n_m


@gluon.jit
def _producer(desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, k_smem, v_smem, q_smem, do_smem, l_smem, d_smem,
              kv_bar, ready, empty, kv_row0, start_n, n_iter, per_head, m_lo, q_head0, N_Q,
              HALF: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, LD_TMA: gl.constexpr):
    """The producer warp: ``K_j, V_j`` (two 64-row halves each, one per consumer), then ``Q_i, dO_i`` (and with
    ``LD_TMA`` the rows ``L_i, D_i``) of step ``t`` into slot ``t % STAGES`` once both consumers released it."""
    mbarrier.expect(kv_bar, 2 * desc_k.block_type.nbytes + 2 * desc_v.block_type.nbytes)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(desc_k, [kv_row0 + start_n + w * HALF, 0], kv_bar, k_smem.index(w))
        tma.async_copy_global_to_shared(desc_v, [kv_row0 + start_n + w * HALF, 0], kv_bar, v_smem.index(w))
    for t in range(n_iter):
        slot = t % STAGES
        mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1: first round free
        bar = ready.index(slot)
        if LD_TMA:
            mbarrier.expect(bar, desc_q.block_type.nbytes + desc_do.block_type.nbytes + 2 * desc_l.block_type.nbytes)
        else:
            mbarrier.expect(bar, desc_q.block_type.nbytes + desc_do.block_type.nbytes)
        row = q_row(t, per_head, m_lo, q_head0, N_Q, BLOCK_M)
        tma.async_copy_global_to_shared(desc_q, [row, 0], bar, q_smem.index(slot))
        tma.async_copy_global_to_shared(desc_do, [row, 0], bar, do_smem.index(slot))
        if LD_TMA:  # (B * Hq, N_Q_PAD) views: row = query head, column = the block's first query
            head = q_head0 + t // per_head
            col = (m_lo + t % per_head) * BLOCK_M
            tma.async_copy_global_to_shared(desc_l, [head, col], bar, l_smem.index(slot))
            tma.async_copy_global_to_shared(desc_d, [head, col], bar, d_smem.index(slot))


@gluon.jit
def _dq_issue(ds_smem, k_smem, buf, t, dq_zero, WG: gl.constexpr, DQ_COLS: gl.constexpr, SPLIT: gl.constexpr):
    """Line 15's product for the step whose ``dS^T`` sits in ``ds_smem`` slot ``buf`` (async wgmma): ``"split"``:
    columns ``WG * DQ_COLS ..`` of ``dS K`` over both consumers' keys; ``"own"``: ``dS_WG K_WG``. ``(t >> 30)``
    is 0 (keeps K's descriptors in the loop, see ``_consumer``)."""
    if SPLIT:
        dq = warpgroup_mma(ds_smem.index(buf).permute((1, 0)),
                           k_smem.index(t >> 30).slice(WG * DQ_COLS, DQ_COLS, dim=1), dq_zero,
                           use_acc=False, is_async=True)
        dq = warpgroup_mma(ds_smem.index(buf + 1).permute((1, 0)),
                           k_smem.index(1 + (t >> 30)).slice(WG * DQ_COLS, DQ_COLS, dim=1), dq, is_async=True)
    else:
        dq = warpgroup_mma(ds_smem.index(buf + WG).permute((1, 0)), k_smem.index(WG + (t >> 30)), dq_zero,
                           use_acc=False, is_async=True)
    return dq


@gluon.jit
def _dq_add(dq, dq_smem, desc_dq, dq_ptrs, row, COL0: gl.constexpr, DQ_TMA: gl.constexpr):
    """Add a finished ``dQ_i`` share into the fp32 buffer: staged in shared memory and reduce-added by the copy
    engine (``DQ_TMA``; the tile's first column ``COL0``), or by ``red.global.add.v2.f32`` from the registers
    (``DQ_TMA = 2``: a timing ablation that drops the add, wrong dQ)."""
    if DQ_TMA == 2:
        pass
    elif DQ_TMA:
        tma.store_wait(0)  # the previous step's reduce has read dq_smem (a no-op in all but the issuing thread)
        gl.thread_barrier()
        dq_smem.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        _tma_reduce_add(desc_dq, [row, COL0], dq_smem)
    else:
        red_add_v2(dq_ptrs, dq)


@gluon.jit
def _consumer(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, l_smem, d_smem, kv_bar, ready, empty, ds_bars,
              desc_dq,
              DQ_ACC, DK, DV, LSE2, DELTA, kv_row0, start_n, n_iter, per_head, m_lo, q_head0, N_Q, N_K,
              qk_scale, sm_scale,
              WG: gl.constexpr, HALF: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, SPLIT: gl.constexpr, DQ_TMA: gl.constexpr,
              DEFER: gl.constexpr, LD_TMA: gl.constexpr):
    """Consumer warpgroup ``WG``: key rows ``start_n + HALF * WG ..`` (Algorithm 2 lines 8-18 for them).

    ``DEFER`` ("split" only): step ``t``'s dQ product is issued at the end of step ``t + 1`` (where the
    undeferred one issues step ``t + 1``'s), so a consumer waits for the other's ``dS^T`` one step late and the
    two need not run in lockstep; three ``dS^T`` buffers, and a consumer arrives on ``ds_bars`` only after its
    previous dQ product retired."""
    dtype: gl.constexpr = q_smem.dtype
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    DQ_COLS: gl.constexpr = HEAD_DIM // 2 if SPLIT else HEAD_DIM
    COL0: gl.constexpr = WG * DQ_COLS if SPLIT else 0  # this consumer's first dQ column
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_l: gl.constexpr = gl.SliceLayout(0, st_layout)
    key_l: gl.constexpr = gl.SliceLayout(1, st_layout)
    gl.static_assert(SPLIT or not DEFER, "DEFER needs dq_mode 'split'")
    NBUF: gl.constexpr = 3 if DEFER else 2  # dS^T buffers (pairs, one per consumer) in "split"
    my_n = start_n + WG * HALF
    # this consumer's first query block and masked blocks (WG 1 may start one block later than the CTA)
    my_lo, my_full, n_m = _query_blocks(my_n, N_Q, N_K, BLOCK_M, HALF, CAUSAL)
    N_Q_PAD = n_m * BLOCK_M
    key_ragged = my_n + HALF > N_K

    dk = gl.zeros([HALF, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([HALF, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([HALF, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, layout=dq_layout)
    keys = my_n + gl.arange(0, HALF, layout=key_l)
    offs_lm = gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([1], [32], [4], [0]))
    dq_offs = (gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))[:, None] * HEAD_DIM
               + gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, dq_layout))[None, :])
    if SPLIT:
        dq_offs = dq_offs + WG * DQ_COLS
        skip_below = m_lo  # both consumers take part in every step (they meet on ds_bars)
    else:
        skip_below = my_lo
    if not LD_TMA:
        l2n, din = load_rows(LSE2, DELTA, 0, n_iter, per_head, m_lo, q_head0, N_Q, offs_lm, BLOCK_M)
    prev_row = q_head0 * N_Q_PAD
    mbarrier.wait(kv_bar, 0)
    for t in range(n_iter):
        g = t // per_head
        m = m_lo + t % per_head
        start_m = m * BLOCK_M
        slot = t % STAGES
        # index 0 written so that the wgmma descriptors of K and V are not hoisted out of the loop (they spill
        # when held across it; notes/hopper.md section 1d, G4)
        k_w = k_smem.index(WG + (t >> 30))
        v_w = v_smem.index(WG + (t >> 30))
        if not LD_TMA:  # L_i, D_i loaded one step ahead (their latency hides under this step)
            l2c = l2n
            dic = din
            l2n, din = load_rows(LSE2, DELTA, t + 1, n_iter, per_head, m_lo, q_head0, N_Q, offs_lm, BLOCK_M)
        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        qs = q_smem.index(slot)
        dos = do_smem.index(slot)
        row = (q_head0 + g) * N_Q_PAD + start_m  # dQ_i's first row in the padded (B * Hq * N_Q_PAD, d) buffer
        if m < skip_below:  # every key of this consumer comes after the block's rows: nothing to add
            mbarrier.arrive(empty.index(slot))
        else:
            # lines 10 and 13: S^T = K Q^T and dP^T = V dO^T in flight together
            sT = warpgroup_mma(k_w, qs.permute((1, 0)), st_zero, use_acc=False, is_async=True)
            dpT = warpgroup_mma(v_w, dos.permute((1, 0)), st_zero, use_acc=False, is_async=True)
            sT = warpgroup_mma_wait(1, deps=(sT,))
            # line 11: P^T = exp2(S^T scale log2 e - L) (masked on the diagonal and past N_K)
            if LD_TMA:  # (1, BLOCK_M) rows read straight into the score layout: a broadcast, no shuffle
                pT = gl.exp2(sT * qk_scale - l_smem.index(slot).load(st_layout))
            else:
                l2 = gl.convert_layout(l2c, col_l)
                pT = gl.exp2(sT * qk_scale - l2[None, :])
            need_mask = key_ragged
            if CAUSAL:
                need_mask = need_mask | (m < my_full)
            pT = mask_pt(pT, keys, start_m, N_Q, N_K, need_mask, col_l, BLOCK_M, CAUSAL)
            # line 12: dV += P^T dO
            pT = pT.to(dtype)
            p_op = gl.convert_layout(pT, a_layout)
            dv = warpgroup_mma(p_op, dos, dv, is_async=True)
            dpT = warpgroup_mma_wait(1, deps=(dpT,))
            # line 14: dS^T = P^T (dP^T - D)
            if LD_TMA:
                dsT = (pT.to(gl.float32) * (dpT - d_smem.index(slot).load(st_layout))).to(dtype)
            else:
                di = gl.convert_layout(dic, col_l)
                dsT = (pT.to(gl.float32) * (dpT - di[None, :])).to(dtype)
            # line 16: dK += dS^T Q (register operand)
            ds_op = gl.convert_layout(dsT, a_layout)
            dk = warpgroup_mma(ds_op, qs, dk, is_async=True)
            # line 15: dQ_i += dS K, A = the transposed view of dS^T in shared memory
            buf = (t % NBUF) * 2 if SPLIT else 0
            ds_smem.index(buf + WG).store(dsT)
            fence_async_shared()
            gl.thread_barrier()  # this warpgroup's dS^T is written (a barrier of the partition's 4 warps)
            if DEFER:  # step t-1's dQ (at t = 0 the product of an unwritten buffer, never added)
                prev = (t + NBUF - 1) % NBUF
                mbarrier.wait(ds_bars.index(prev), ((t + NBUF - 1) // NBUF - 1) & 1, pred=t > 0)
                dq = _dq_issue(ds_smem, k_smem, prev * 2, t, dq_zero, WG, DQ_COLS, SPLIT)
                dv, dk, dq, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, dq, p_op, ds_op))
                mbarrier.arrive(ds_bars.index(t % NBUF))  # dS^T(t) written and dQ(t-1) has read buffer prev
                mbarrier.arrive(empty.index(slot))  # Q_i, dO_i read: the producer may refill the slot
                if t > 0:
                    _dq_add(dq, dq_smem, desc_dq, DQ_ACC + prev_row.to(gl.int64) * HEAD_DIM + dq_offs, prev_row,
                            COL0, DQ_TMA)
            else:
                if SPLIT:
                    mbarrier.arrive(ds_bars.index(t % 2))
                    mbarrier.wait(ds_bars.index(t % 2), (t // 2) & 1)  # and the other consumer's
                dq = _dq_issue(ds_smem, k_smem, buf, t, dq_zero, WG, DQ_COLS, SPLIT)
                dv, dk, dq, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, dq, p_op, ds_op))
                mbarrier.arrive(empty.index(slot))  # Q_i, dO_i read: the producer may refill the slot
                _dq_add(dq, dq_smem, desc_dq, DQ_ACC + row.to(gl.int64) * HEAD_DIM + dq_offs, row, COL0, DQ_TMA)
                if not SPLIT:
                    gl.thread_barrier()  # every warp's dQ product has read dS^T before the next step writes it
        prev_row = row
    if DEFER:  # the last step's dQ
        if n_iter > 0:
            last = n_iter - 1
            mbarrier.wait(ds_bars.index(last % NBUF), (last // NBUF) & 1)
            dq = _dq_issue(ds_smem, k_smem, (last % NBUF) * 2, last, dq_zero, WG, DQ_COLS, SPLIT)
            dq = warpgroup_mma_wait(0, deps=(dq,))
            _dq_add(dq, dq_smem, desc_dq, DQ_ACC + prev_row.to(gl.int64) * HEAD_DIM + dq_offs, prev_row, COL0,
                    DQ_TMA)
    if DQ_TMA == 1:
        tma.store_wait(0)

    store_dkdv(dk, dv, DK, DV, kv_row0, my_n, N_K, sm_scale, kv_layout, HALF, HEAD_DIM)


@gluon.jit
def _bwd_ws_kernel(desc_q, desc_k, desc_v, desc_do, desc_dq, desc_l, desc_d, DQ_ACC, DK, DV, LSE2, DELTA, H_KV,
                   GROUP, N_Q, N_K, qk_scale, sm_scale,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                   SPLIT: gl.constexpr, DQ_TMA: gl.constexpr, DEFER: gl.constexpr, LD_TMA: gl.constexpr,
                   CONSUMER_REGS: gl.constexpr,
                   PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """One CTA = key block ``j`` (128 rows) of one (batch, kv head); grid ``(cdiv(N_K, 128), B * H_KV)``; the
    default partition is consumer 0 (``num_warps = 4``), the workers consumer 1 and the producer."""
    HALF: gl.constexpr = 64
    dtype: gl.constexpr = desc_q.dtype
    pid_n = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // H_KV
    hk = pid_bh % H_KV
    start_n = pid_n * (2 * HALF)
    kv_row0 = pid_bh * N_K
    q_head0 = b * H_KV * GROUP + hk * GROUP  # first query head of the GQA group
    m_lo, m_full, n_m = _query_blocks(start_n, N_Q, N_K, BLOCK_M, 2 * HALF, CAUSAL)
    per_head = gl.maximum(n_m - m_lo, 1)
    n_iter = (n_m - m_lo) * GROUP

    k_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], desc_v.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_q.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_do.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [(6 if DEFER else 4) if SPLIT else 2, HALF, BLOCK_M], ds_layout)
    if DQ_TMA == 1:  # one fp32 dQ_i share per consumer, staged for the copy engine's reduce-add
        dq_smem = gl.allocate_shared_memory(gl.float32, [2] + desc_dq.block_type.shape, desc_dq.layout)
    else:
        dq_smem = ds_smem  # unused
    l_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_l.block_type.shape, desc_l.layout)
    d_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_d.block_type.shape, desc_d.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_bars = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(3):
        mbarrier.init(ds_bars.index(i), count=2)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem.index(0), l_smem, d_smem, kv_bar, ready,
                     empty, ds_bars, desc_dq, DQ_ACC, DK, DV, LSE2, DELTA, kv_row0, start_n, n_iter, per_head, m_lo,
                     q_head0, N_Q, N_K, qk_scale, sm_scale, 0, HALF, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, SPLIT,
                     DQ_TMA, DEFER, LD_TMA)),
        (_consumer, (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem.index(1), l_smem, d_smem, kv_bar, ready,
                     empty, ds_bars, desc_dq, DQ_ACC, DK, DV, LSE2, DELTA, kv_row0, start_n, n_iter, per_head, m_lo,
                     q_head0, N_Q, N_K, qk_scale, sm_scale, 1, HALF, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, SPLIT,
                     DQ_TMA, DEFER, LD_TMA)),
        (_producer, (desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, k_smem, v_smem, q_smem, do_smem, l_smem,
                     d_smem, kv_bar, ready, empty, kv_row0, start_n, n_iter, per_head, m_lo, q_head0, N_Q, HALF,
                     BLOCK_M, STAGES, LD_TMA)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def check_ws_config(config, dq_mode):
    """``config = (BLOCK_M, STAGES, DQ_TMA, DEFER, LD_TMA)`` (default ``DEFAULT_CONFIG``) and ``dq_mode`` in
    ``DQ_MODES``; return the config as a tuple."""
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")
    if config is None:
        config = DEFAULT_CONFIG
    if (not isinstance(config, (tuple, list)) or len(config) != 5
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in config[:2])
            or not all(isinstance(x, bool) for x in config[2:])):
        raise ValueError("config must be a tuple (BLOCK_M: int, STAGES: int, DQ_TMA: bool, DEFER: bool, LD_TMA: "
                         f"bool), got {config!r}")
    bm, stages, _, defer, _ = config
    if bm != 64 or stages not in (2, 3):
        raise ValueError(f"config: BLOCK_M must be 64 (one wgmma N tile per step) and STAGES 2 or 3, got "
                         f"{tuple(config)}")
    if defer and dq_mode != "split":
        raise ValueError(f"config: DEFER needs dq_mode='split', got dq_mode={dq_mode!r}")
    return tuple(config)


def flash_attention_backward_gluon_ws(q, k, v, o, lse, do, causal=False, scale=None, dq_mode="split",
                                      config=None, _ablate_dq_add=False):
    """Gradients ``(dq, dk, dv)`` of ``sum(o * do)`` on Hopper, warp-specialised (module docstring).

    ``q, o, do (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)`` bfloat16/float16, ``d`` in {64, 128}, ``lse (B, Hq, Nq)``
    float32 (natural log, ``-inf`` for rows that see no key); ``dq_mode`` ``"split"`` or ``"own"``;
    ``config = (BLOCK_M, STAGES, DQ_TMA, DEFER, LD_TMA)``: ``DQ_TMA`` adds dQ with the copy engine's reduce-add
    from shared memory instead of vector atomics from registers; ``DEFER`` issues each dQ product one step late;
    ``LD_TMA``: the producer also copies ``L_i, D_i`` (padded per head) into the ring instead of the consumers
    loading them.
    ``_ablate_dq_add``: a timing ablation only, dQ products computed but never added (dq is wrong).
    """
    B, Hq, Hkv, Nq, Nk, d, group, causal, scale = check_backward_args(q, k, v, o, lse, do, causal, scale, NAME)
    bm, stages, dq_tma, defer, ld_tma = check_ws_config(config, dq_mode)
    check_gluon_device(q.device, NAME)
    q, k, v, o, do = (x.contiguous() for x in (q, k, v, o, do))
    nq_pad = triton.cdiv(Nq, bm) * bm
    delta, lse2 = backward_preprocess(o, do, lse.contiguous(), Nq, rows=nq_pad if ld_tma else Nq)
    if ld_tma:
        desc_l, desc_d = (tile_descriptor(x.view(-1, nq_pad), 1, bm) for x in (lse2, delta))
    else:  # unused by the kernel
        desc_l = desc_d = tile_descriptor(torch.empty((1, bm), dtype=torch.float32, device=q.device), 1, bm)
    dq_acc = torch.zeros((B, Hq, nq_pad, d), dtype=torch.float32, device=q.device)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    q2, k2, v2, do2 = (x.view(-1, d) for x in (q, k, v, do))
    _bwd_ws_kernel[(triton.cdiv(Nk, BLOCK_N), B * Hkv)](
        tile_descriptor(q2, bm, d), tile_descriptor(k2, BLOCK_N // 2, d), tile_descriptor(v2, BLOCK_N // 2, d),
        tile_descriptor(do2, bm, d), tile_descriptor(dq_acc.view(-1, d), bm, d // 2 if dq_mode == "split" else d),
        desc_l, desc_d, dq_acc, dk, dv, lse2, delta, Hkv, group, Nq, Nk, scale * LOG2E_F, scale,
        HEAD_DIM=d, BLOCK_M=bm, STAGES=stages, CAUSAL=causal, SPLIT=dq_mode == "split",
        DQ_TMA=2 if _ablate_dq_add else int(dq_tma),
        DEFER=defer, LD_TMA=ld_tma, CONSUMER_REGS=WS_REGS[0], PRODUCER_REGS=WS_REGS[1], num_warps=4,
        maxnreg=WS_MAXNREG)
    return finish_dq(dq_acc, q, scale), dk, dv


def compile_backward_ws(head_dim: int = 128, causal: bool = False, dq_mode: str = "split", config=None,
                        dtype: str = "bf16"):
    """Compile the kernel for sm_90a ahead of time (no GPU needed; run with ``TRITON_INTERPRET=0``); return it for
    ``reference.triton.hopper._aot.resource_usage``."""
    bm, stages, dq_tma, defer, ld_tma = check_ws_config(config, dq_mode)
    half = BLOCK_N // 2
    dq_cols = head_dim // 2 if dq_mode == "split" else head_dim
    sig = {"desc_q": descriptor_signature(bm, head_dim, dtype), "desc_k": descriptor_signature(half, head_dim, dtype),
           "desc_v": descriptor_signature(half, head_dim, dtype), "desc_do": descriptor_signature(bm, head_dim, dtype),
           "desc_dq": descriptor_signature(bm, dq_cols, "fp32"), "desc_l": descriptor_signature(1, bm, "fp32"),
           "desc_d": descriptor_signature(1, bm, "fp32"),
           "DQ_ACC": "*fp32", "DK": f"*{dtype}", "DV": f"*{dtype}", "LSE2": "*fp32", "DELTA": "*fp32",
           "H_KV": "i32", "GROUP": "i32", "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32", "sm_scale": "fp32"}
    cx = {"HEAD_DIM": head_dim, "BLOCK_M": bm, "STAGES": stages, "CAUSAL": causal, "SPLIT": dq_mode == "split",
          "DQ_TMA": int(dq_tma), "DEFER": defer, "LD_TMA": ld_tma, "CONSUMER_REGS": WS_REGS[0],
          "PRODUCER_REGS": WS_REGS[1],
          "num_warps": 4}
    return compile_gluon(_bwd_ws_kernel, sig, cx, 4, maxnreg=WS_MAXNREG)


__all__ = ["flash_attention_backward_gluon_ws", "compile_backward_ws", "DEFAULT_CONFIG", "DQ_MODES"]

"""FlashAttention backward for Hopper in Gluon, warp-specialised (FA3 section 3.1 applied to FA2 Algorithm 2).

``flash_attention_backward_gluon_ws(q, k, v, o, lse, do, causal=False, scale=None, config=None)
-> (dq, dk, dv)``: the contract of ``flash_bwd.flash_attention_backward`` (FA2 Algorithm 2; GQA,
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
  ``dK_w += dS^T Q_i`` (register operand), then line 15, ``dQ_i += dS_ij K_j``: both consumers write ``dS^T``
  to shared memory and meet on an mbarrier; consumer ``w`` computes the head-dimension half ``w`` of ``dQ_i``
  over all 128 keys, ``sum_u dS_u K_u[:, half w]``: one reduction per dQ element per key block, as in FA3 (the
  "own" mode, each consumer ``dS_w K_w`` over its own keys, lost: notes/experiments_removed.md);

* ``config``: a ``configs.GluonBackwardConfig`` (``block_m``, ``num_stages``, ``dq_tma``, ``defer``, ``ld_tma``,
  ``persistent``), default ``configs.GLUON_BACKWARD[d]`` (``GLUON_BACKWARD_CAUSAL[d]`` when causal): 64 query rows a
  step at d = 128, 128 at d = 64, every flag on, persistent when causal;
  ``DQ_TMA`` stages
  the dQ tile in shared memory and has the copy engine add it into the fp32 buffer (a TMA reduce,
  ``cp.reduce.async.bulk.tensor``), instead of ``red.global.add.v2.f32`` from the consumers' registers;
  ``DEFER`` issues step ``t``'s dQ product at the end of step ``t + 1``, so the consumers wait for each other's
  ``dS^T`` one step late; ``LD_TMA`` has the producer copy ``L_i, D_i`` (padded per head) into the ring,
  instead of the consumers loading and shuffling them. The non-default values are the measured attempts.

* the schedule: one CTA per work item (a key block of one (batch, kv head)), in ``_program_order``; or
  ``persistent``: one CTA per SM walking its run of a list the host made by list scheduling the same sequence
  (``persistent_schedule``), the ring's slots and phases, the ``dS^T`` buffers and ``bars.ds`` counted over the CTA's
  steps (``g``) rather than the item's (``t``), and ``bars.kv_free`` releasing K, V to the producer for the next
  item while the consumers store dK, dV (notes/hopper.md, "A persistent backward").

Kernel structure: ``_bwd_ws_kernel`` allocates and groups (named tuples ``Smem``, ``Bars``, ``Out``, ``Launch``,
``Cfg``), then forks into ``_consumer`` x 2 and ``_producer``, each looping over its items (``_items``, ``_place``);
``_consumer_item`` is set-up, the query-step loop (``_scores_and_grads``: lines 10-14 and 16; ``_dq_step``: line
15), ``_dq_last`` and the dK/dV store.

Ragged ``N``: query rows past ``N_Q`` get ``L = +inf`` (``P = 0``) and land in the
padded rows of the dQ buffer; key rows past ``N_K`` are masked to ``P = 0`` and never stored. The interpreter
cannot run Gluon; ``tests/test_triton_gluon_bwd_ws.py`` compiles the kernel for sm_90a on CPU.
"""
from __future__ import annotations

import functools
import heapq
from collections import namedtuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ._aot import compile_gluon, descriptor_signature
from .. import _fastlaunch, configs, flash_bwd
from .._checks import check_backward_args, check_gluon_device
from .common import LOG2E_F, finish_dq, load_rows, mask_pt, q_row, red_add_v2, store_dkdv, tile_descriptor

NAME = "flash_attention_backward_gluon_ws"
#: key rows per CTA (64 per consumer warpgroup): the kernel's layouts are written for it
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


#: the CTA's shared-memory buffers (``k, v``: two 64-row halves, one per consumer; ``q, do, l, d``: the
#: ``STAGES``-slot ring; ``ds``: ``dS^T`` pairs; ``dq``: this consumer's fp32 dQ staging tile)
Smem = namedtuple("Smem", ["k", "v", "q", "do", "ds", "dq", "l", "d"])
#: its mbarriers: ``kv`` (K_j, V_j arrived), ring ``ready`` / ``empty``, ``ds`` (both consumers' dS^T written),
#: ``kv_free`` (both consumers done with K_j, V_j: a persistent CTA's producer may load the next item's)
Bars = namedtuple("Bars", ["kv", "ready", "empty", "ds", "kv_free"])
#: global memory the consumers write or read by pointer (dQ by ``desc_dq``)
Out = namedtuple("Out", ["desc_dq", "dq_acc", "dk", "dv", "lse2", "delta"])
#: the CTA's work: its key block's first row in the ``(B * H_KV * N_K, d)`` view and in its head, the query
#: steps (``n_iter`` of them: ``per_head`` blocks from ``m_lo`` per query head of the group from ``q_head0``)
Place = namedtuple("Place", ["kv_row0", "start_n", "n_iter", "per_head", "m_lo", "q_head0", "N_Q", "N_K"])
#: the launch's runtime values every partition maps its work items with (``SCHED``: the persistent schedule)
Launch = namedtuple("Launch", ["sched", "n_blocks", "H_KV", "GROUP", "N_Q", "N_K"])
#: compile-time configuration (all ``constexpr``)
Cfg = namedtuple("Cfg", ["HALF", "HEAD_DIM", "BLOCK_M", "STAGES", "CAUSAL", "DQ_TMA", "DEFER", "LD_TMA",
                         "ORDER_HEADS", "PERSISTENT"])


@gluon.constexpr_function
def _wgmma_layout(n):
    """Accumulator layout of a 4-warp wgmma with ``n`` columns."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.constexpr_function
def _a_operand(n):
    """Register A-operand layout of a wgmma whose accumulator has ``n`` columns."""
    return gl.DotOperandLayout(operand_index=0, parent=_wgmma_layout(n), k_width=2)


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
def _program_order(pid, n_programs, n_blocks, ORDER_HEADS):
    """Program ``pid`` -> (key block, (batch, kv head) index). The hardware issues programs in ``pid`` order and
    gives each next one to the SM that frees up first (list scheduling). The (batch, kv head) pairs go in groups
    of ``ORDER_HEADS`` (the last group may be smaller); inside a group the key block is the slow index and the
    head the fast one, so under the causal mask (key block ``j`` sees ``n_m - m_lo(j)`` query blocks, ``j = 0``
    the most) the group's blocks come longest-first across its heads (LPT, Graham 1969;
    ``reference.simulators.scheduling``). ``ORDER_HEADS = 1`` is the head-major order (key block fastest:
    every head's blocks longest to shortest, head after head), whose last heads leave a tail of short blocks
    after the long ones of the previous heads: with GQA (``GROUP`` times fewer, ``GROUP`` times longer programs)
    the simulated busy fraction at 8k is 0.81-0.90 against 0.99 with the heads interleaved (notes/hopper.md,
    "GQA backward schedule")."""
    n_heads = n_programs // n_blocks
    span = n_blocks * ORDER_HEADS
    grp = pid // span
    in_grp = gl.minimum(ORDER_HEADS, n_heads - grp * ORDER_HEADS)
    r = pid - grp * span
    return r // in_grp, grp * ORDER_HEADS + r % in_grp


@gluon.jit
def _items(launch, cfg):
    """This program's work items ``[lo, hi)``: one (its own key block) in a launch of one program per key block;
    in a persistent launch the run ``SCHED[pid] .. SCHED[pid + 1]`` of the schedule's item list
    (``persistent_schedule``)."""
    if cfg.PERSISTENT:
        lo = gl.load(launch.sched + gl.program_id(0))
        hi = gl.load(launch.sched + gl.program_id(0) + 1)
    else:
        lo = 0
        hi = 1
    return lo, hi


@gluon.jit
def _place(k, launch, cfg):
    """Work item ``k`` -> its ``Place``: the key block and (batch, kv head) from the schedule's list (item code
    ``bh * n_blocks + j``, after the ``n_programs + 1`` run offsets), from the 2-D grid (head-major at d = 128) or
    from ``_program_order``."""
    if cfg.PERSISTENT:
        code = gl.load(launch.sched + gl.num_programs(0) + 1 + k)
        pid_n = code % launch.n_blocks
        pid_bh = code // launch.n_blocks
    elif cfg.ORDER_HEADS == 1 and cfg.HEAD_DIM > 64:  # head-major, the 2-D grid (cdiv(N_K, 128), B * H_KV)
        pid_n = gl.program_id(0)
        pid_bh = gl.program_id(1)
    else:
        pid_n, pid_bh = _program_order(gl.program_id(0), gl.num_programs(0), launch.n_blocks, cfg.ORDER_HEADS)
    start_n = pid_n * (2 * cfg.HALF)
    q_head0 = (pid_bh // launch.H_KV) * launch.H_KV * launch.GROUP + (pid_bh % launch.H_KV) * launch.GROUP
    m_lo, m_full, n_m = _query_blocks(start_n, launch.N_Q, launch.N_K, cfg.BLOCK_M, 2 * cfg.HALF, cfg.CAUSAL)
    return Place(pid_bh * launch.N_K, start_n, (n_m - m_lo) * launch.GROUP, gl.maximum(n_m - m_lo, 1), m_lo, q_head0,
                 launch.N_Q, launch.N_K)


@gluon.jit
def _producer(descs, smem, bars, launch, cfg):
    """The producer warp, per work item: ``K_j, V_j`` (two 64-row halves each, one per consumer) once both
    consumers are done with the previous item's, then ``Q_i, dO_i`` (and with ``LD_TMA`` the rows ``L_i, D_i``) of
    step ``t`` into slot ``g % STAGES`` (``g``: the CTA's step count over its items) once both consumers released
    it. ``descs = (q, k, v, do, l, d)``."""
    desc_q, desc_k, desc_v, desc_do, desc_l, desc_d = descs
    STAGES: gl.constexpr = cfg.STAGES
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    lo, hi = _items(launch, cfg)
    it = 0
    for k in range(lo, hi):
        place = _place(k, launch, cfg)
        # a fresh barrier passes phase 1: the first item's K, V slots are free
        mbarrier.wait(bars.kv_free, ((k - lo) & 1) ^ 1)
        mbarrier.expect(bars.kv, 2 * desc_k.block_type.nbytes + 2 * desc_v.block_type.nbytes)
        for w in gl.static_range(2):
            row = place.kv_row0 + place.start_n + w * cfg.HALF
            tma.async_copy_global_to_shared(desc_k, [row, 0], bars.kv, smem.k.index(w))
            tma.async_copy_global_to_shared(desc_v, [row, 0], bars.kv, smem.v.index(w))
        for t in range(place.n_iter):
            g = it + t
            slot = g % STAGES
            mbarrier.wait(bars.empty.index(slot), ((g // STAGES) & 1) ^ 1)
            bar = bars.ready.index(slot)
            if cfg.LD_TMA:
                mbarrier.expect(bar, desc_q.block_type.nbytes + desc_do.block_type.nbytes
                                + 2 * desc_l.block_type.nbytes)
            else:
                mbarrier.expect(bar, desc_q.block_type.nbytes + desc_do.block_type.nbytes)
            row = q_row(t, place.per_head, place.m_lo, place.q_head0, place.N_Q, BLOCK_M)
            tma.async_copy_global_to_shared(desc_q, [row, 0], bar, smem.q.index(slot))
            tma.async_copy_global_to_shared(desc_do, [row, 0], bar, smem.do.index(slot))
            if cfg.LD_TMA:  # (B * Hq, N_Q_PAD) views: row = query head, column = the block's first query
                head = place.q_head0 + t // place.per_head
                col = (place.m_lo + t % place.per_head) * BLOCK_M
                tma.async_copy_global_to_shared(desc_l, [head, col], bar, smem.l.index(slot))
                tma.async_copy_global_to_shared(desc_d, [head, col], bar, smem.d.index(slot))
        it += place.n_iter


@gluon.jit
def _dq_issue(smem, buf, t, dq_zero, WG: gl.constexpr, DQ_COLS: gl.constexpr):
    """Line 15's product for the step whose ``dS^T`` pair sits in ``smem.ds`` slots ``buf, buf + 1`` (async
    wgmma): columns ``WG * DQ_COLS ..`` of ``dS K`` over both consumers' keys. ``(t >> 30)`` is 0 (keeps K's
    descriptors in the loop, see ``_key_loop_step``)."""
    dq = warpgroup_mma(smem.ds.index(buf).permute((1, 0)),
                       smem.k.index(t >> 30).slice(WG * DQ_COLS, DQ_COLS, dim=1), dq_zero,
                       use_acc=False, is_async=True)
    dq = warpgroup_mma(smem.ds.index(buf + 1).permute((1, 0)),
                       smem.k.index(1 + (t >> 30)).slice(WG * DQ_COLS, DQ_COLS, dim=1), dq, is_async=True)
    return dq


@gluon.jit
def _dq_add(dq, smem, out, dq_offs, row, COL0: gl.constexpr, HEAD_DIM: gl.constexpr, DQ_TMA: gl.constexpr):
    """Add a finished ``dQ_i`` share (rows from ``row`` of the padded buffer) into the fp32 buffer: staged in
    shared memory and reduce-added by the copy engine (``DQ_TMA``; the tile's first column ``COL0``), or by
    ``red.global.add.v2.f32`` from the registers (``DQ_TMA = 2``: a timing ablation that drops the add, wrong
    dQ)."""
    if DQ_TMA == 2:
        pass
    elif DQ_TMA:
        tma.store_wait(0)  # the previous step's reduce has read dq_smem (a no-op in all but the issuing thread)
        gl.thread_barrier()
        smem.dq.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        _tma_reduce_add(out.desc_dq, [row, COL0], smem.dq)
    else:
        red_add_v2(out.dq_acc + row.to(gl.int64) * HEAD_DIM + dq_offs, dq)


@gluon.jit
def _scores_and_grads(k_w, v_w, qs, dos, l_rows, d_rows, dk, dv, keys, start_m, need_mask, place, qk_scale,
                      cfg):
    """Algorithm 2 lines 10-14 and 16 for this consumer's keys and query block ``start_m`` (transposed: key rows
    are the wgmma M side): ``S^T, dP^T`` in flight together, ``P^T``, ``dV += P^T dO``, ``dS^T``,
    ``dK += dS^T Q``. ``l_rows, d_rows``: ``L_i, D_i`` as ring slots (``LD_TMA``) or one value per thread. Returns
    ``dk, dv`` (async, not waited for), ``dS^T`` and the two register operands the caller's wait must keep."""
    HALF: gl.constexpr = cfg.HALF
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    st_layout: gl.constexpr = _wgmma_layout(BLOCK_M)
    a_layout: gl.constexpr = _a_operand(cfg.HEAD_DIM)
    col_l: gl.constexpr = gl.SliceLayout(0, st_layout)
    dtype: gl.constexpr = qs.dtype
    st_zero = gl.zeros([HALF, BLOCK_M], gl.float32, layout=st_layout)
    # lines 10 and 13: S^T = K Q^T and dP^T = V dO^T in flight together
    sT = warpgroup_mma(k_w, qs.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    dpT = warpgroup_mma(v_w, dos.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    sT = warpgroup_mma_wait(1, deps=(sT,))
    # line 11: P^T = exp2(S^T scale log2 e - L) (masked on the diagonal and past N_K)
    if cfg.LD_TMA:  # (1, BLOCK_M) rows read straight into the score layout: a broadcast, no shuffle
        pT = gl.exp2(sT * qk_scale - l_rows.load(st_layout))
    else:
        l2 = gl.convert_layout(l_rows, col_l)
        pT = gl.exp2(sT * qk_scale - l2[None, :])
    pT = mask_pt(pT, keys, start_m, place.N_Q, place.N_K, need_mask, col_l, BLOCK_M, cfg.CAUSAL)
    # line 12: dV += P^T dO
    pT = pT.to(dtype)
    p_op = gl.convert_layout(pT, a_layout)
    dv = warpgroup_mma(p_op, dos, dv, is_async=True)
    dpT = warpgroup_mma_wait(1, deps=(dpT,))
    # line 14: dS^T = P^T (dP^T - D)
    if cfg.LD_TMA:
        dsT = (pT.to(gl.float32) * (dpT - d_rows.load(st_layout))).to(dtype)
    else:
        di = gl.convert_layout(d_rows, col_l)
        dsT = (pT.to(gl.float32) * (dpT - di[None, :])).to(dtype)
    # line 16: dK += dS^T Q (register operand)
    ds_op = gl.convert_layout(dsT, a_layout)
    dk = warpgroup_mma(ds_op, qs, dk, is_async=True)
    return dk, dv, dsT, p_op, ds_op


@gluon.jit
def _dq_step(dsT, dk, dv, p_op, ds_op, smem, bars, out, dq_offs, t, g, slot, row, prev_row, cfg,
             WG: gl.constexpr):
    """Line 15, ``dQ_i += dS K`` for this step (A = the transposed view of ``dS^T`` in shared memory): store this
    consumer's ``dS^T``, meet the other consumer on ``bars.ds``, issue the product (``DEFER``: step ``t - 1``'s),
    retire every wgmma of the step, release the ring slot, add dQ. ``t``: the step in this work item, ``g``: in
    the CTA (buffers and barrier phases run on across a persistent CTA's items). Returns ``dk, dv``."""
    HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
    DQ_COLS: gl.constexpr = HEAD_DIM // 2
    NBUF: gl.constexpr = 3 if cfg.DEFER else 2  # dS^T buffer pairs
    dq_zero = gl.zeros([cfg.BLOCK_M, DQ_COLS], gl.float32, layout=_wgmma_layout(DQ_COLS))
    buf = (g % NBUF) * 2
    smem.ds.index(buf + WG).store(dsT)
    fence_async_shared()
    gl.thread_barrier()  # this warpgroup's dS^T is written (a barrier of the partition's 4 warps)
    if cfg.DEFER:  # step t-1's dQ (at t = 0 the product of a buffer not of this item, never added)
        prev = (g + NBUF - 1) % NBUF
        mbarrier.wait(bars.ds.index(prev), ((g + NBUF - 1) // NBUF - 1) & 1, pred=t > 0)
        dq = _dq_issue(smem, prev * 2, t, dq_zero, WG, DQ_COLS)
        dv, dk, dq, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, dq, p_op, ds_op))
        mbarrier.arrive(bars.ds.index(g % NBUF))  # dS^T(t) written and dQ(t-1) has read buffer prev
        mbarrier.arrive(bars.empty.index(slot))  # Q_i, dO_i read: the producer may refill the slot
        if t > 0:
            _dq_add(dq, smem, out, dq_offs, prev_row, WG * DQ_COLS, HEAD_DIM, cfg.DQ_TMA)
    else:
        mbarrier.arrive(bars.ds.index(g % 2))
        mbarrier.wait(bars.ds.index(g % 2), (g // 2) & 1)  # and the other consumer's
        dq = _dq_issue(smem, buf, t, dq_zero, WG, DQ_COLS)
        dv, dk, dq, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, dq, p_op, ds_op))
        mbarrier.arrive(bars.empty.index(slot))  # Q_i, dO_i read: the producer may refill the slot
        _dq_add(dq, smem, out, dq_offs, row, WG * DQ_COLS, HEAD_DIM, cfg.DQ_TMA)
    return dk, dv


@gluon.jit
def _dq_last(smem, bars, out, dq_offs, prev_row, n_iter, it, cfg, WG: gl.constexpr):
    """``DEFER``'s epilogue: the last step's dQ product and add (the caller waits for the reduces to finish,
    ``tma.store_wait(0)``, after its dK/dV stores, so those overlap the last reduce). ``it``: the CTA's step count
    before this item."""
    DQ_COLS: gl.constexpr = cfg.HEAD_DIM // 2
    if cfg.DEFER:
        if n_iter > 0:
            last = it + n_iter - 1
            mbarrier.wait(bars.ds.index(last % 3), (last // 3) & 1)
            dq_zero = gl.zeros([cfg.BLOCK_M, DQ_COLS], gl.float32, layout=_wgmma_layout(DQ_COLS))
            dq = _dq_issue(smem, (last % 3) * 2, n_iter, dq_zero, WG, DQ_COLS)
            dq = warpgroup_mma_wait(0, deps=(dq,))
            _dq_add(dq, smem, out, dq_offs, prev_row, WG * DQ_COLS, cfg.HEAD_DIM, cfg.DQ_TMA)


@gluon.jit
def _consumer_item(smem, bars, out, place, it, kv_phase, qk_scale, sm_scale, cfg, WG: gl.constexpr):
    """Consumer warpgroup ``WG`` on one work item: key rows ``start_n + HALF * WG ..`` (Algorithm 2 lines 8-18
    for them): set-up, the loop over query steps (``_scores_and_grads``, then ``_dq_step``), ``_dq_last``, the
    release of K, V (``bars.kv_free``) and the dK/dV store. ``it``: the CTA's step count before this item.

    ``DEFER``: step ``t``'s dQ product is issued at the end of step ``t + 1`` (where the undeferred one issues step
    ``t + 1``'s), so a consumer waits for the other's ``dS^T`` one step late and the two need not run in
    lockstep; three ``dS^T`` buffer pairs, and a consumer arrives on ``bars.ds`` only after its previous dQ
    product retired."""
    HALF: gl.constexpr = cfg.HALF
    HEAD_DIM: gl.constexpr = cfg.HEAD_DIM
    BLOCK_M: gl.constexpr = cfg.BLOCK_M
    DQ_COLS: gl.constexpr = HEAD_DIM // 2  # this consumer's dQ columns: WG * DQ_COLS ..
    kv_layout: gl.constexpr = _wgmma_layout(HEAD_DIM)
    dq_layout: gl.constexpr = _wgmma_layout(DQ_COLS)
    my_n = place.start_n + WG * HALF
    # the blocks on this consumer's causal diagonal (WG 1's may start one block later than the CTA's); both
    # consumers still take part in every step from the CTA's m_lo (they meet on bars.ds)
    my_lo, my_full, n_m = _query_blocks(my_n, place.N_Q, place.N_K, BLOCK_M, HALF, cfg.CAUSAL)
    N_Q_PAD = n_m * BLOCK_M
    key_ragged = my_n + HALF > place.N_K

    dk = gl.zeros([HALF, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([HALF, HEAD_DIM], gl.float32, layout=kv_layout)
    keys = my_n + gl.arange(0, HALF, layout=gl.SliceLayout(1, _wgmma_layout(BLOCK_M)))
    offs_lm = gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([1], [32], [4], [0]))
    dq_offs = (gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))[:, None] * HEAD_DIM
               + gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, dq_layout))[None, :]) + WG * DQ_COLS
    if not cfg.LD_TMA:
        l2n, din = load_rows(out.lse2, out.delta, 0, place.n_iter, place.per_head, place.m_lo, place.q_head0,
                             place.N_Q, offs_lm, BLOCK_M)
    prev_row = place.q_head0 * N_Q_PAD
    mbarrier.wait(bars.kv, kv_phase)
    for t in range(place.n_iter):
        g = it + t
        m = place.m_lo + t % place.per_head
        start_m = m * BLOCK_M
        slot = g % cfg.STAGES
        # index 0 written so that the wgmma descriptors of K and V are not hoisted out of the loop (they spill
        # when held across it; notes/hopper.md section 1d, G4)
        k_w = smem.k.index(WG + (t >> 30))
        v_w = smem.v.index(WG + (t >> 30))
        if cfg.LD_TMA:
            l_rows = smem.l.index(slot)
            d_rows = smem.d.index(slot)
        else:  # L_i, D_i loaded one step ahead (their latency hides under this step)
            l_rows = l2n
            d_rows = din
            l2n, din = load_rows(out.lse2, out.delta, t + 1, place.n_iter, place.per_head, place.m_lo,
                                 place.q_head0, place.N_Q, offs_lm, BLOCK_M)
        mbarrier.wait(bars.ready.index(slot), (g // cfg.STAGES) & 1)
        # dQ_i's first row in the padded (B * Hq * N_Q_PAD, d) buffer
        row = (place.q_head0 + t // place.per_head) * N_Q_PAD + start_m
        need_mask = key_ragged
        if cfg.CAUSAL:
            need_mask = need_mask | (m < my_full)
        dk, dv, dsT, p_op, ds_op = _scores_and_grads(k_w, v_w, smem.q.index(slot), smem.do.index(slot), l_rows,
                                                     d_rows, dk, dv, keys, start_m, need_mask, place, qk_scale,
                                                     cfg)
        dk, dv = _dq_step(dsT, dk, dv, p_op, ds_op, smem, bars, out, dq_offs, t, g, slot, row, prev_row, cfg, WG)
        prev_row = row
    _dq_last(smem, bars, out, dq_offs, prev_row, place.n_iter, it, cfg, WG)
    mbarrier.arrive(bars.kv_free)  # every product that reads K_j, V_j has retired
    # the copy engine must have read dq_smem before the CTA (and its shared memory) ends. At d = 64 (128-row
    # steps) waiting after the dK/dV stores overlaps them with the last reduce and leaves 7 spill instructions
    # instead of 12-13: 0.99-1.02x cuDNN against 0.85-0.87 at N = 2k-4k non-causal on an H100; at d = 128 the
    # wait stays before them (notes/hopper.md, "GQA backward schedule")
    if cfg.DQ_TMA == 1 and HEAD_DIM > 64:
        tma.store_wait(0)
    store_dkdv(dk, dv, out.dk, out.dv, place.kv_row0, my_n, place.N_K, sm_scale, kv_layout, HALF, HEAD_DIM)
    if cfg.DQ_TMA == 1 and HEAD_DIM == 64:
        tma.store_wait(0)


@gluon.jit
def _consumer(smem, bars, out, launch, qk_scale, sm_scale, cfg, WG: gl.constexpr):
    """Consumer warpgroup ``WG``: its share of each of the program's work items, in order (``_consumer_item``)."""
    lo, hi = _items(launch, cfg)
    it = 0
    for k in range(lo, hi):
        place = _place(k, launch, cfg)
        _consumer_item(smem, bars, out, place, it, (k - lo) & 1, qk_scale, sm_scale, cfg, WG)
        it += place.n_iter


@gluon.jit
def _bwd_ws_kernel(desc_q, desc_k, desc_v, desc_do, desc_dq, desc_l, desc_d, DQ_ACC, DK, DV, LSE2, DELTA, SCHED,
                   H_KV, GROUP, N_Q, N_K, qk_scale, sm_scale,
                   ORDER_HEADS: gl.constexpr, PERSISTENT: gl.constexpr, HEAD_DIM: gl.constexpr,
                   BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                   DQ_TMA: gl.constexpr, DEFER: gl.constexpr, LD_TMA: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """A work item = key block ``j`` (128 rows) of one (batch, kv head). One program per item: grid
    ``(cdiv(N_K, 128), B * H_KV)`` (``ORDER_HEADS = 1`` at d = 128) or a 1-D grid of as many programs in the order
    ``_program_order`` gives; ``PERSISTENT``: one program per SM, each looping over its run of the host's schedule
    ``SCHED`` (``persistent_schedule``), its barriers' phases carried from item to item. The default partition is
    consumer 0 (``num_warps = 4``), the workers consumer 1 and the producer."""
    HALF: gl.constexpr = 64
    dtype: gl.constexpr = desc_q.dtype
    launch = Launch(SCHED, gl.cdiv(N_K, 2 * HALF), H_KV, GROUP, N_Q, N_K)
    cfg: gl.constexpr = Cfg(HALF, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, DQ_TMA, DEFER, LD_TMA, ORDER_HEADS, PERSISTENT)

    k_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], desc_v.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_q.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_do.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [6 if DEFER else 4, HALF, BLOCK_M], ds_layout)
    if DQ_TMA == 1:  # one fp32 dQ_i share per consumer, staged for the copy engine's reduce-add
        dq_smem = gl.allocate_shared_memory(gl.float32, [2] + desc_dq.block_type.shape, desc_dq.layout)
    else:
        dq_smem = ds_smem  # unused
    l_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_l.block_type.shape, desc_l.layout)
    d_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_d.block_type.shape, desc_d.layout)
    bars = Bars(gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()),
                gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
                gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
                gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout()),
                gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout()))
    mbarrier.init(bars.kv, count=1)
    mbarrier.init(bars.kv_free, count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.ready.index(i), count=1)
        mbarrier.init(bars.empty.index(i), count=2)
    for i in gl.static_range(3):
        mbarrier.init(bars.ds.index(i), count=2)
    fence_async_shared()
    out = Out(desc_dq, DQ_ACC, DK, DV, LSE2, DELTA)
    smem0 = Smem(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem.index(0), l_smem, d_smem)
    smem1 = Smem(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem.index(1), l_smem, d_smem)
    gl.warp_specialize([
        (_consumer, (smem0, bars, out, launch, qk_scale, sm_scale, cfg, 0)),
        (_consumer, (smem1, bars, out, launch, qk_scale, sm_scale, cfg, 1)),
        (_producer, ((desc_q, desc_k, desc_v, desc_do, desc_l, desc_d), smem0, bars, launch, cfg)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def check_ws_config(config, head_dim=None, causal=False) -> configs.GluonBackwardConfig:
    """``config``: a ``configs.GluonBackwardConfig`` (default ``configs.GLUON_BACKWARD[head_dim]``, or
    ``GLUON_BACKWARD_CAUSAL[head_dim]`` for a causal launch: the persistent schedule; d = 128's without a head
    dimension); return it.

    ``block_n = 128`` keys a CTA and ``num_warps = 4`` per consumer (the kernel's layouts); ``block_m = 128`` only at
    ``head_dim = 64``: the consumer's ``S^T, dP^T`` tiles (64 x block_m fp32) and its ``dK, dV`` (64 x d) must fit
    its 240 registers (at d = 128: 4 x 64 > 240); its shared memory fits only some flag combinations
    (``compile_backward_ws`` + ``_aot.resource_usage``; notes/hopper.md section 1g)."""
    if config is None:
        pins = configs.GLUON_BACKWARD_CAUSAL if causal else configs.GLUON_BACKWARD
        return pins.get(head_dim, pins[128])
    if type(config) is not configs.GluonBackwardConfig:
        raise TypeError(f"config must be a reference.triton.configs.GluonBackwardConfig or None, got {config!r}")
    bm, stages = config.block_m, config.num_stages
    if (bm not in (64, 128) or (bm == 128 and head_dim not in (None, 64)) or stages not in (2, 3)
            or config.block_n != BLOCK_N or config.num_warps != 4):
        raise ValueError(f"config: block_m must be 64 (or 128 at head_dim 64), num_stages 2 or 3, block_n {BLOCK_N} "
                         f"and num_warps 4, got {config} at head_dim {head_dim}")
    return config


def block_costs(causal, Nq, Nk, block_m):
    """Query steps of each 128-row key block (``n_m - m_lo(j)``; every block ``n_m`` without the causal mask), per
    query head of a GQA group."""
    n_m = -(-Nq // block_m)
    n_blocks = -(-Nk // BLOCK_N)
    if not causal:
        return [n_m] * n_blocks
    return [n_m - min(max(j * BLOCK_N - (Nk - Nq), 0) // block_m, n_m) for j in range(n_blocks)]


def longest_share(causal, Nq, Nk, block_m, n_heads, n_sms):
    """The longest program's work over one SM's share of the launch (``sum of all programs / n_sms``), programs
    = key blocks of 128 rows x ``n_heads`` (batch, kv head) pairs, each ``n_m - m_lo(j)`` query steps (times the
    GQA group, which cancels). Near or above ``1 / waves`` the head-major order's last heads start their longest
    blocks too late to finish with the rest (list scheduling's bound: makespan <= average + longest)."""
    costs = block_costs(causal, Nq, Nk, block_m)
    total = sum(costs) * n_heads
    return max(costs) * n_sms / total if total else 0.0


def program_order(n_blocks, n_heads, order_heads):
    """``_program_order`` on the host: the (key block, (batch, kv head)) pairs in program order, ``order_heads``
    heads interleaved per group (key block the slow index inside a group)."""
    out = []
    for g0 in range(0, n_heads, order_heads):
        heads = range(g0, min(g0 + order_heads, n_heads))
        out += [(j, h) for j in range(n_blocks) for h in heads]
    return out


#: a work item's fixed cost in query steps for the persistent schedule (the K, V loads, the dK/dV store and the
#: last dQ product, partly hidden under the neighbouring items): a model parameter, not measured per kernel
ITEM_OVERHEAD_STEPS = 1.0


def persistent_schedule(causal, Nq, Nk, block_m, n_heads, group, order_heads, n_programs):
    """The persistent launch's schedule: ``program_order``'s items dealt out by list scheduling (each next item to
    the program that frees up first, by the cost model ``group * block_costs + ITEM_OVERHEAD_STEPS``; Graham 1966,
    what the hardware does with one CTA per item, here decided ahead of time). Returns the int32 list the kernel
    reads: ``n_programs + 1`` run offsets, then the item codes ``bh * n_blocks + j`` program after program."""
    for name, v in (("Nq", Nq), ("Nk", Nk), ("block_m", block_m), ("n_heads", n_heads), ("group", group),
                    ("order_heads", order_heads), ("n_programs", n_programs)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"persistent_schedule: {name} must be a positive int, got {v!r}")
    costs = block_costs(causal, Nq, Nk, block_m)
    n_blocks = len(costs)
    heap = [(0.0, p) for p in range(n_programs)]
    runs = [[] for _ in range(n_programs)]
    for j, h in program_order(n_blocks, n_heads, order_heads):
        busy, p = heapq.heappop(heap)
        runs[p].append(h * n_blocks + j)
        heapq.heappush(heap, (busy + costs[j] * group + ITEM_OVERHEAD_STEPS, p))
    offsets = [0]
    for run in runs:
        offsets.append(offsets[-1] + len(run))
    return offsets + [c for run in runs for c in run]


@functools.lru_cache(maxsize=64)
def _schedule_tensor(device, *args) -> torch.Tensor:
    return torch.tensor(persistent_schedule(*args), dtype=torch.int32, device=device)


def check_order_heads(order_heads, causal, n_heads, share=0.0):
    """``order_heads`` (``_program_order``'s ``ORDER_HEADS``): ``None`` for the default ``configs.GLUON_BWD_ORDER``
    (causal launches whose ``longest_share`` is at least its ``min_share`` interleave ``heads`` heads; every other
    launch is head-major, 1), ``0`` for all ``n_heads`` (batch, kv head) pairs, else a positive int (capped at
    ``n_heads``)."""
    if order_heads is None:
        from .. import configs
        pin = configs.GLUON_BWD_ORDER
        order_heads = pin["heads"] if causal and share >= pin["min_share"] else 1
    if not isinstance(order_heads, int) or isinstance(order_heads, bool) or order_heads < 0:
        raise ValueError(f"order_heads must be an int >= 0 (0: all heads), got {order_heads!r}")
    return min(order_heads, n_heads) if order_heads else n_heads


@functools.lru_cache(maxsize=None)
def _sm_count_of(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device):
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


def preprocess_buffers(lse, Nq, rows=None):
    """``(lse, delta, lse2)`` for FA2 Algorithm 2 line 4 (``flash_bwd.preprocess``, the portable kernel): ``D =
    rowsum(dO * O)`` and ``L`` in base 2 go to ``delta, lse2``, both ``(B, Hq, rows)`` float32; ``rows >= Nq`` pads
    each head (``D = 0``, ``L = +inf``: no probability mass; ``lse`` padded to match) so that a TMA box of whole query
    blocks never crosses a head."""
    rows = rows or Nq
    if rows != Nq:
        lse = torch.nn.functional.pad(lse, (0, rows - Nq))
        return lse, torch.zeros_like(lse), torch.full_like(lse, float("inf"))
    return lse, torch.empty_like(lse), torch.empty_like(lse)


def backward_preprocess(o, do, lse, Nq, rows=None):
    """``(delta, lse2)`` of ``preprocess_buffers``, written by ``flash_bwd.preprocess``."""
    lse, delta, lse2 = preprocess_buffers(lse, Nq, rows)
    flash_bwd.preprocess(o, do, lse, delta, lse2, Nq)
    return delta, lse2


#: the backward's recorded launches (``_fastlaunch``, as ``flash_gluon.FWD_LAUNCHES``): per key the preprocess, the
#: warp-specialised kernel and the dQ conversion (None where torch converts a padded dQ)
BWD_LAUNCHES = _fastlaunch.LaunchCache()
PRE_SLOTS = ("O", "DO", "LSE", "DELTA", "LSE2", "CU_Q")
BWD_SLOTS = ("desc_q", "desc_k", "desc_v", "desc_do", "desc_dq", "desc_l", "desc_d", "DQ_ACC", "DK", "DV", "LSE2",
             "DELTA")
CONVERT_SLOTS = ("DQ_ACC", "DQ")


def _recorder(slots):
    """``launch(kernel, grid, args, kwargs)`` that launches through Triton and returns the recorded launch (None
    under the interpreter or a CUDA-graph capture), keeping no reference to this call's slot arguments."""
    return lambda kernel, grid, args, meta: _fastlaunch.launch_and_record(kernel, grid, args, meta, slots,
                                                                          drop_slots=True)


def clear_launches() -> None:
    """Forget the backward's recorded launches."""
    BWD_LAUNCHES.clear()


@functools.lru_cache(maxsize=None)
def _unused_rows(device, bm: int) -> torch.Tensor:
    """The ``(1, bm)`` float32 tensor behind the L and D descriptors of a launch that does not read them
    (``ld_tma`` off), one per device."""
    return torch.empty((1, bm), dtype=torch.float32, device=device)


def flash_attention_backward_gluon_ws(q, k, v, o, lse, do, causal=False, scale=None, config=None,
                                      order_heads=None, _ablate_dq_add=False, _programs=None):
    """Gradients ``(dq, dk, dv)`` of ``sum(o * do)`` on Hopper, warp-specialised (module docstring).

    ``q, o, do (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)`` bfloat16/float16, ``d`` in {64, 128}, ``lse (B, Hq, Nq)``
    float32 (natural log, ``-inf`` for rows that see no key);
    ``config``: a ``configs.GluonBackwardConfig`` (``check_ws_config``): ``dq_tma`` adds dQ with the copy engine's
    reduce-add from shared memory instead of vector atomics from registers; ``defer`` issues each dQ product one step
    late; ``ld_tma``: the producer also copies ``L_i, D_i`` (padded per head) into the ring instead of the consumers
    loading them.
    ``order_heads``: the program order (``_program_order``): how many (batch, kv head) pairs interleave their key
    blocks longest-first; ``None`` the default (``check_order_heads``), ``0`` all of them, ``1`` the head-major order.
    ``_ablate_dq_add``: a timing ablation only, dQ products computed but never added (dq is wrong).
    ``_programs``: a persistent launch's program count if below the SM count (tests: many items a program on small
    shapes).
    """
    B, Hq, Hkv, Nq, Nk, d, group, causal, scale = check_backward_args(q, k, v, o, lse, do, causal, scale, NAME)
    cfg = check_ws_config(config, d, causal)
    bm, stages, dq_tma, defer, ld_tma = cfg.block_m, cfg.num_stages, cfg.dq_tma, cfg.defer, cfg.ld_tma
    persistent = cfg.persistent
    share = 0.0
    if order_heads is None and causal:
        share = longest_share(causal, Nq, Nk, bm, B * Hkv, _sm_count(q.device))
    order_heads = check_order_heads(order_heads, causal, B * Hkv, share)
    check_gluon_device(q.device, NAME)
    q, k, v, o, do, lse = (x.contiguous() for x in (q, k, v, o, do, lse))
    nq_pad = triton.cdiv(Nq, bm) * bm
    tk = _fastlaunch.tensor_key
    aligned = tuple(x.data_ptr() % 16 == 0 for x in (o, do, lse))
    key = (tk(q), tk(k), tk(v), aligned, causal, scale, cfg, order_heads, _ablate_dq_add, _programs)
    lse_rows, delta, lse2 = preprocess_buffers(lse, Nq, rows=nq_pad if ld_tma else Nq)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    q2, k2, v2, do2 = (x.view(-1, d) for x in (q, k, v, do))
    recs = BWD_LAUNCHES.get(key)
    if recs is not None:  # a repeat: the three recorded launches on this call's tensors
        pre, main, conv = recs
        pre.launch([o, do, lse_rows, delta, lse2, lse_rows])
        dq_acc = torch.zeros((B, Hq, nq_pad, d), dtype=torch.float32, device=q.device)
        desc = _fastlaunch.DescArg
        lsel, dl = (lse2.view(-1, nq_pad), delta.view(-1, nq_pad)) if ld_tma else (_unused_rows(q.device, bm),) * 2
        main.launch([desc(q2), desc(k2), desc(v2), desc(do2), desc(dq_acc.view(-1, d)), desc(lsel), desc(dl),
                     dq_acc, dk, dv, lse2, delta])
        if conv is None:  # padded dq_acc: torch converts
            return finish_dq(dq_acc, q, scale), dk, dv
        dq = torch.empty_like(q)
        conv.launch([dq_acc, dq])
        return dq, dk, dv
    pre = flash_bwd.preprocess(o, do, lse_rows, delta, lse2, Nq, launch=_recorder(PRE_SLOTS))
    dq_acc = torch.zeros((B, Hq, nq_pad, d), dtype=torch.float32, device=q.device)
    # head-major at d = 128: the 2-D grid (in the order sweep the same order by the 1-D grid and _program_order
    # measured 2-7% slower on causal GQA, with the dQ wait after the dK/dV stores too: not separated); at d = 64
    # the 1-D grid measured with the late dQ wait (notes/hopper.md, "GQA backward schedule")
    n_blocks = triton.cdiv(Nk, BLOCK_N)
    if persistent:
        n_programs = min(_programs or _sm_count(q.device), n_blocks * B * Hkv)
        grid = (n_programs,)
        sched = _schedule_tensor(q.device, causal, Nq, Nk, bm, B * Hkv, group, order_heads, n_programs)
    else:
        grid = (n_blocks, B * Hkv) if order_heads == 1 and d > 64 else (n_blocks * B * Hkv,)
        sched = _unused_rows(q.device, bm)  # unread
    if ld_tma:
        desc_l, desc_d = (tile_descriptor(x.view(-1, nq_pad), 1, bm) for x in (lse2, delta))
    else:  # unused by the kernel
        desc_l = desc_d = tile_descriptor(_unused_rows(q.device, bm), 1, bm)
    args = (tile_descriptor(q2, bm, d), tile_descriptor(k2, BLOCK_N // 2, d), tile_descriptor(v2, BLOCK_N // 2, d),
            tile_descriptor(do2, bm, d), tile_descriptor(dq_acc.view(-1, d), bm, d // 2),
            desc_l, desc_d, dq_acc, dk, dv, lse2, delta, sched, Hkv, group, Nq, Nk, scale * LOG2E_F, scale)
    # a persistent launch reads its order from the schedule: one compiled kernel for every order
    meta = dict(ORDER_HEADS=1 if persistent else order_heads, PERSISTENT=persistent, HEAD_DIM=d, BLOCK_M=bm, STAGES=stages, CAUSAL=causal,
                DQ_TMA=2 if _ablate_dq_add else int(dq_tma), DEFER=defer, LD_TMA=ld_tma,
                CONSUMER_REGS=WS_REGS[0], PRODUCER_REGS=WS_REGS[1], num_warps=4, maxnreg=WS_MAXNREG)
    main = _recorder(BWD_SLOTS)(_bwd_ws_kernel, grid, args, meta)
    dq, conv = finish_dq(dq_acc, q, scale, launch=_recorder(CONVERT_SLOTS))
    if pre is not None and main is not None and (conv is not None or nq_pad != Nq):
        BWD_LAUNCHES.put(key, (pre, main, conv))
    return dq, dk, dv


def compile_backward_ws(head_dim: int = 128, causal: bool = False, config=None, dtype: str = "bf16",
                        order_heads: int = 1):
    """Compile the kernel for sm_90a ahead of time (no GPU needed; run with ``TRITON_INTERPRET=0``); return it for
    ``reference.triton.hopper._aot.resource_usage``."""
    cfg = check_ws_config(config, head_dim, causal)
    bm, stages, dq_tma, defer, ld_tma = cfg.block_m, cfg.num_stages, cfg.dq_tma, cfg.defer, cfg.ld_tma
    half = BLOCK_N // 2
    dq_cols = head_dim // 2
    sig = {"desc_q": descriptor_signature(bm, head_dim, dtype), "desc_k": descriptor_signature(half, head_dim, dtype),
           "desc_v": descriptor_signature(half, head_dim, dtype), "desc_do": descriptor_signature(bm, head_dim, dtype),
           "desc_dq": descriptor_signature(bm, dq_cols, "fp32"), "desc_l": descriptor_signature(1, bm, "fp32"),
           "desc_d": descriptor_signature(1, bm, "fp32"),
           "DQ_ACC": "*fp32", "DK": f"*{dtype}", "DV": f"*{dtype}", "LSE2": "*fp32", "DELTA": "*fp32",
           "SCHED": "*i32" if cfg.persistent else "*fp32", "H_KV": "i32", "GROUP": "i32", "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32", "sm_scale": "fp32"}
    cx = {"ORDER_HEADS": order_heads, "PERSISTENT": cfg.persistent, "HEAD_DIM": head_dim, "BLOCK_M": bm, "STAGES": stages, "CAUSAL": causal,
          "DQ_TMA": int(dq_tma), "DEFER": defer, "LD_TMA": ld_tma, "CONSUMER_REGS": WS_REGS[0],
          "PRODUCER_REGS": WS_REGS[1],
          "num_warps": 4}
    return compile_gluon(_bwd_ws_kernel, sig, cx, 4, maxnreg=WS_MAXNREG)


__all__ = ["flash_attention_backward_gluon_ws", "compile_backward_ws", "check_order_heads", "longest_share",
           "check_ws_config", "block_costs", "program_order", "persistent_schedule"]

"""FlashAttention-3-style forward for Hopper in Gluon (Triton's lower-level dialect): explicit wgmma, TMA, mbarriers.

``flash_attention_forward_gluon(q, k, v, causal=False, scale=None, config=None) -> (o, lse)``, the same contract
as ``flash_attention_forward`` (FA2 Algorithm 1, bottom-right causal, GQA, ragged N) restricted to what the
kernel is written for: a Hopper GPU (compute capability 9.0), bfloat16/float16, ``d`` in {64, 128}.

Why Gluon: Triton decides the schedule of a ``tl.dot`` loop itself, and its software pipeliner keeps the chain
``S_j = Q K_j^T -> softmax(S_j) -> O += P_j V_j`` of one iteration in order, so the tensor cores idle while the
warpgroup does its softmax (measured: SM throughput 55% vs cuDNN's 75%, notes/hopper.md section 1). Gluon
exposes the asynchronous ``warpgroup_mma`` (wgmma), its wait, TMA copies and mbarriers, so the kernel writes
the schedule of the FA3 paper (Shah et al., 2024) itself. The production kernel (``fwd_ws_persistent_kernel``)
combines three of its ideas:

* intra-warpgroup overlap, FA3 Algorithm 2 (``attend_overlapped``): in iteration ``j`` the warps issue
  ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` back to back, wait only for ``S_j`` (wgmma groups retire in
  order), and run the softmax of ``S_j`` while ``P_{j-1} V_{j-1}`` is still on the tensor cores (in the SASS only
  where ptxas keeps that wait below the softmax: the ``key_loop`` option ``fence``, pinned at d = 128);
* warp specialisation with ping-pong, FA3 section 3.1: one producer warp issues every TMA copy into
  ``STAGES``-deep K/V rings (ready/empty mbarriers); two consumer warpgroups (``gl.warp_specialize``
  partitions, register budgets set by ``setmaxnreg``: few for the producer, the rest for the consumers) each
  own 64 query rows of a 128-row tile; an mbarrier "turn" pair makes them issue their matmuls alternately (one
  warpgroup's softmax under the other's GEMMs);
* persistence: one CTA per SM loops over query tiles, its producer loading the next tile's Q (double-buffered)
  and K/V while the consumers finish the current one. Tiles go head-major, causal ones in heavy/light pairs
  (``_work_item``).

The ablations lecture 06 measures (the overlap-only kernel, warp specialisation without the turns, one CTA per
tile) are in ``experiments/gluon_schedules.py``, built from this module's pieces; their numbers are in
notes/hopper.md section 1c.

FA2 choices as in ``flash_fwd``: exp2 with ``log2(e)`` folded into the scale, the running max in base 2, a "safe"
max of 0 for rows that have seen no key yet, fp32 accumulators, ``lse`` in natural log. Tensors are viewed as
2-D ``(B * H * N, d)`` for the TMA descriptors: a query tile that runs past its head's ``N`` reads the next
head's rows (or the copy engine's zeros past the end), which are never stored; a key tile that does is masked
to ``-inf`` like the causal diagonal, so ragged ``N`` needs no padding.

The interpreter cannot run Gluon: on a machine without a Hopper GPU the entry point raises ``RuntimeError``
naming the requirement, and the kernel is only compiled (``compile_forward``; ``tests/test_triton_gluon.py``
compiles it for sm_90a ahead of time on CPU, which checks the code and reports registers and spills).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .. import _fastlaunch, configs
from .._checks import check_flag, check_gluon_device, check_gluon_inputs
from ..configs import HOPPER_SMEM, GluonForwardConfig
from ._aot import compile_gluon, descriptor_signature
from .common import LOG2E_F, item_tile, load_q_halves, pingpong_buffers, store_output, tile_descriptor

# The CTA tile is a ``configs.GluonForwardConfig`` (default ``configs.GLUON_FORWARD``: 128 query rows, two consumer
# warpgroups of 64 with 4 warps each, 128-key K/V slots, 2 stages); ``check_gluon_config`` says which values the
# layouts below take and whether the tiles fit a CTA's shared memory.
#: setmaxnreg budgets of the worker partitions: (second consumer warpgroup, producer warp)
PINGPONG_REGS = (240, 24)
#: the kernel-wide register cap the budgets are carved from: 3 warpgroups x 128 threads x 168 <= 64K registers
PINGPONG_MAXNREG = 168
#: ``online_softmax``'s ``MASK``: test ``j >= full_end`` at run time (a branch in the key loop), never mask (the
#: peeled loop over blocks ``< full_end``), always mask (the peeled loop over blocks ``>= full_end``)
MASK_CHECK = gl.constexpr(0)
MASK_NEVER = gl.constexpr(1)
MASK_ALWAYS = gl.constexpr(2)


# --------------------------------------------------------------------------------------------------------------
# the steps of one query tile (shared with the ablations in experiments/gluon_schedules.py)
# --------------------------------------------------------------------------------------------------------------
@gluon.jit
def key_range(start_m, N_Q, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Key blocks ``[0, hi)`` this query block reads; blocks ``>= full_end`` need the mask (FA2 Alg. 1 line 6).

    Bottom-right causal: row ``i`` sees key ``j`` iff ``j <= i + (N_K - N_Q)``.
    """
    n_blocks = gl.cdiv(N_K, BLOCK_N)
    if CAUSAL:
        offset = N_K - N_Q
        hi = gl.minimum(gl.cdiv(gl.maximum(start_m + BLOCK_M + offset, 0), BLOCK_N), n_blocks)
        full_end = gl.minimum(gl.maximum(start_m + offset + 1, 0) // BLOCK_N, hi)
    else:
        hi = n_blocks
        full_end = N_K // BLOCK_N
    return full_end, hi


@gluon.jit
def online_softmax(s, m_i, l_i, j, full_end, start_m, N_Q, N_K, qk_scale,
                    s_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                    MASK: gl.constexpr = MASK_CHECK):
    """FA2 Algorithm 1, lines 9-10 on one score tile ``s = Q_i K_j^T`` (raw, unscaled, fp32).

    Returns ``(p, alpha, m_new, l_new)`` with ``p = exp2(s * qk_scale - m_new)`` and ``alpha = exp2(m_i - m_new)``,
    the factor the caller applies to ``O`` before adding ``p V_j``. Masked (diagonal / ragged) blocks set
    invisible scores to ``-inf``; the max used for the exponent is 0 where no key was seen yet (no inf - inf).
    ``MASK``: ``MASK_CHECK`` masks the blocks ``j >= full_end`` (a run-time branch), ``MASK_NEVER`` /
    ``MASK_ALWAYS`` decide at compile time (no branch: the peeled key loops of ``attend_overlapped``).
    """
    if MASK == MASK_ALWAYS:
        s = mask_scores(s, j, start_m, N_Q, N_K, s_layout, BLOCK_M, BLOCK_N, CAUSAL)
    elif MASK == MASK_CHECK:
        if j >= full_end:
            s = mask_scores(s, j, start_m, N_Q, N_K, s_layout, BLOCK_M, BLOCK_N, CAUSAL)
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def mask_scores(s, j, start_m, N_Q, N_K, s_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                CAUSAL: gl.constexpr):
    """``s`` with the scores of keys past ``N_K`` and, ``CAUSAL``, above the bottom-right diagonal (row ``i``
    sees key ``k`` iff ``k <= i + N_K - N_Q``) set to ``-inf`` (FA2 Algorithm 1, the mask of line 9)."""
    cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    visible = cols[None, :] < N_K
    if CAUSAL:
        rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        visible = visible & (cols[None, :] <= rows[:, None] + (N_K - N_Q))
    return gl.where(visible, s, float("-inf"))


@gluon.jit
def issue_kv(desc, smem, bars, tile, row0, hi, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """TMA-copy key/value tile ``tile`` (if ``tile < hi``) into ring slot ``tile % STAGES``, arriving on its barrier."""
    slot = tile % STAGES
    pred = tile < hi
    bar = bars.index(slot)
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [row0 + tile * BLOCK_N, 0], bar, smem.index(slot), pred=pred)


@gluon.jit
def attend_overlapped(q_smem, k_smem, v_smem, k_bars, v_bars, desc_k, desc_v, kv_row0, full_end, hi,
                       start_m, N_Q, N_K, qk_scale,
                       turn_bars, WG, it0, r0,
                       s_layout: gl.constexpr, o_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                       LOADS: gl.constexpr, SYNC: gl.constexpr, PINGPONG: gl.constexpr,
                       PEELED: gl.constexpr = False, FENCE: gl.constexpr = False):
    """Key blocks ``0 .. hi-1`` for one query tile already in ``q_smem``; return ``(acc, m_i, l_i)``.

    FA3 Algorithm 2: iteration ``j`` issues ``S_j = Q K_j^T`` then ``O += P_{j-1} V_{j-1}`` (both async), waits for
    ``S_j`` only, computes softmax(S_j) while the ``P V`` product runs, then waits for it and rescales ``O``.
    ``LOADS``: this partition also refills the rings (the "overlap" schedule; ``SYNC``: with two warpgroups, a CTA
    barrier first, so the leading warpgroup cannot overwrite a tile the other has not multiplied yet); otherwise
    a producer does, and this partition releases each slot by arriving on its "empty" barrier
    (``k_bars[STAGES + slot]``, count 2: both consumers). ``PINGPONG``: before each round of matmul issues the
    warpgroup waits for its turn (``turn_bars[WG]``) and afterwards hands the turn over, so the two consumers'
    GEMMs alternate and each one's softmax runs under the other's GEMMs.

    ``it0``: how many K/V tiles the rings carried before this query tile (a persistent CTA keeps its rings
    running across tiles: key block ``j`` sits in slot ``(it0 + j) % STAGES`` with phase ``(it0 + j) // STAGES``);
    ``r0``: how many matmul rounds the two consumers took turns on before (``hi + 1`` per tile). Both 0 for a CTA
    that owns one tile (the "overlap" schedule's refills index the ring by ``j`` alone).

    Where the ``P_{j-1} V_{j-1}`` wait lands is ptxas's choice: ``warpgroup_mma_wait`` has no register operands in
    the PTX (Gluon's ``deps`` constrain LLVM only), and ptxas schedules it as early as the basic block allows. In
    the plain loop the mask's run-time ``if j >= full_end`` (``online_softmax``) ends a block, so the softmax and
    the wait share the block after it and the wait lands at its top, above the exps: no overlap (the SASS has
    0 of 64 exps before it; notes/hopper.md, "the peeled key loop"). Two options move it:

    * ``FENCE`` (producer mode only): release K slot ``j`` after the softmax, inside ``if N_K > 0`` (always true
      when there is a key block): the branch ends the softmax's block, and the wait starts the next one;
    * ``PEELED``: the loop split at ``full_end`` into blocks ``1 .. full_end - 1`` without the mask and the rest
      with it (FA3 peels its masked iterations the same way): no branch in either body. Alone it does not move
      the wait in this kernel (ptxas still puts it right after the K release); with ``FENCE`` it also drops
      the mask's compare from the unmasked blocks.
    """
    dtype: gl.constexpr = q_smem.dtype
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    if hi > 0:
        # peeled iteration 0: S_0 and its softmax; no P V yet
        mbarrier.wait(k_bars.index(it0 % STAGES), (it0 // STAGES) & 1)
        if PINGPONG:  # round r of WG 1 follows round r of WG 0; round r of WG 0 follows round r - 1 of WG 1
            mbarrier.wait(turn_bars.index(WG), (r0 & 1) ^ (1 - WG))
        s = warpgroup_mma(q_smem, k_smem.index(it0 % STAGES).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn_bars.index(1 - WG))
        s = warpgroup_mma_wait(0, deps=(s,))
        if SYNC:
            gl.thread_barrier()
        if LOADS:
            issue_kv(desc_k, k_smem, k_bars, STAGES, kv_row0, hi, BLOCK_N, STAGES)
        else:
            mbarrier.arrive(k_bars.index(STAGES + it0 % STAGES))
        p, alpha, m_i, l_i = online_softmax(s, m_i, l_i, 0, full_end, start_m, N_Q, N_K, qk_scale,
                                             s_layout, BLOCK_M, BLOCK_N, CAUSAL)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        # PEELED: part 0 = blocks 1 .. full_end - 1 (no mask), part 1 = the rest (masked); else one loop that
        # tests each block (a branch in the body, after which ptxas puts the P V wait above the softmax)
        for part in gl.static_range(2 if PEELED else 1):
            lo = 1 if part == 0 else gl.maximum(full_end, 1)
            end = (full_end if PEELED else hi) if part == 0 else hi
            for j in range(lo, end):
                slot = (it0 + j) % STAGES
                prev = (it0 + j - 1) % STAGES
                mbarrier.wait(k_bars.index(slot), ((it0 + j) // STAGES) & 1)
                mbarrier.wait(v_bars.index(prev), ((it0 + j - 1) // STAGES) & 1)
                if PINGPONG:
                    mbarrier.wait(turn_bars.index(WG), ((r0 + j) & 1) ^ (1 - WG))
                s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
                acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                if PINGPONG:
                    mbarrier.arrive(turn_bars.index(1 - WG))
                s = warpgroup_mma_wait(1, deps=(s,))  # S_j done; P_{j-1} V_{j-1} may still run
                if SYNC:
                    gl.thread_barrier()
                if LOADS:
                    issue_kv(desc_k, k_smem, k_bars, j + STAGES, kv_row0, hi, BLOCK_N, STAGES)
                elif not FENCE:
                    mbarrier.arrive(k_bars.index(STAGES + slot))
                p, alpha, m_i, l_i = online_softmax(s, m_i, l_i, j, full_end, start_m, N_Q, N_K, qk_scale,
                                                     s_layout, BLOCK_M, BLOCK_N, CAUSAL,
                                                     (MASK_NEVER if part == 0 else MASK_ALWAYS) if PEELED
                                                     else MASK_CHECK)
                if FENCE and not LOADS:
                    if N_K > 0:  # always true here; the branch keeps the next wait below the softmax
                        mbarrier.arrive(k_bars.index(STAGES + slot))
                acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
                if SYNC:
                    gl.thread_barrier()
                if LOADS:
                    issue_kv(desc_v, v_smem, v_bars, j - 1 + STAGES, kv_row0, hi, BLOCK_N, STAGES)
                else:
                    mbarrier.arrive(v_bars.index(STAGES + prev))
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                p_op = gl.convert_layout(p.to(dtype), p_layout)
        last = (it0 + hi - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((it0 + hi - 1) // STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(turn_bars.index(WG), ((r0 + hi) & 1) ^ (1 - WG))
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn_bars.index(1 - WG))
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        if not LOADS:
            mbarrier.arrive(v_bars.index(STAGES + last))
    return acc, m_i, l_i


@gluon.jit
def produce_kv(desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, kv_row0, hi, it, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr):
    """The producer's key loop: ``K_t, V_t`` for ``t < hi`` into ring slot ``it % STAGES`` (``it`` counts the tiles
    the rings carried before), each once both consumers freed it; return the new ``it``."""
    for t in range(hi):
        slot = it % STAGES
        free_phase = ((it // STAGES) & 1) ^ 1  # a fresh barrier counts as phase 1 complete: the first pass is free
        mbarrier.wait(k_bars.index(STAGES + slot), free_phase)
        mbarrier.expect(k_bars.index(slot), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [kv_row0 + t * BLOCK_N, 0], k_bars.index(slot), k_smem.index(slot))
        mbarrier.wait(v_bars.index(STAGES + slot), free_phase)
        mbarrier.expect(v_bars.index(slot), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_v, [kv_row0 + t * BLOCK_N, 0], v_bars.index(slot), v_smem.index(slot))
        it += 1
    return it


# --------------------------------------------------------------------------------------------------------------
# the production kernel: warp-specialised, ping-pong, persistent (one CTA per SM looping over work items)
# --------------------------------------------------------------------------------------------------------------
@gluon.jit
def _work_item(item, sub, n_m, H_Q, GROUP, N_Q, N_K, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """Query tile ``sub`` of work item ``item`` -> ``(valid, start_m, q_row0, kv_row0)`` (as ``tile_origin`` of the
    one-tile kernels in experiments/gluon_schedules.py), in ``common.item_tile``'s order."""
    bh, pid_m, valid = item_tile(item, sub, n_m, CAUSAL)
    b = bh // H_Q
    h = bh % H_Q
    return valid, pid_m * BLOCK_M, bh * N_Q, (b * (H_Q // GROUP) + h // GROUP) * N_K


#: ``_work_item`` under a public name, for the other persistent Gluon forward (``flash_fp8_gluon``)
work_item = _work_item


@gluon.jit
def _ws_consumer_persistent(q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, n_items, n_m, H_Q,
                            GROUP, N_Q, N_K, qk_scale, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                            CAUSAL: gl.constexpr, TURNS: gl.constexpr, PEELED: gl.constexpr,
                            FENCE: gl.constexpr):
    """Consumer ``WG`` of a persistent CTA: its 64 query rows of each tile the CTA owns, in item order.

    Q is double-buffered (tile ``c`` of this CTA in buffer ``c % 2``): ``q_bars[2 * buf + WG]`` says this
    warpgroup's half arrived, ``q_bars[4 + 2 * buf + WG]`` hands it back after the tile's last matmul, so the
    producer loads the tile after next while this one runs, and the next tile's K/V fill the ring under this
    tile's epilogue.
    """
    HALF: gl.constexpr = BLOCK_M // 2
    SUBS: gl.constexpr = 2 if CAUSAL else 1
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    it = 0
    rnd = 0
    count = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        for sub in range(SUBS):  # a loop, not unrolled: one copy of the body
            valid, start_m, q_row0, kv_row0 = _work_item(item, sub, n_m, H_Q, GROUP, N_Q, N_K, BLOCK_M, CAUSAL)
            if valid:
                full_end, hi = key_range(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
                my_start = start_m + WG * HALF
                q_slot = 2 * (count % 2) + WG
                mbarrier.wait(q_bars.index(q_slot), (count // 2) & 1)
                acc, m_i, l_i = attend_overlapped(q_smem.index(q_slot), k_smem, v_smem, k_bars, v_bars, k_bars,
                                                   v_bars, kv_row0, full_end, hi, my_start, N_Q, N_K, qk_scale,
                                                   turn_bars, WG, it, rnd, s_layout, o_layout, HALF, BLOCK_N,
                                                   HEAD_DIM, STAGES, CAUSAL, LOADS=False, SYNC=False,
                                                   PINGPONG=TURNS, PEELED=PEELED, FENCE=FENCE)
                mbarrier.arrive(q_bars.index(4 + q_slot))
                store_output(acc, m_i, l_i, O, LSE, q_row0, my_start, N_Q, o_layout, HALF, HEAD_DIM)
                it += hi
                rnd += gl.where(hi > 0, hi + 1, 0)
                count += 1


@gluon.jit
def _ws_producer_persistent(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, n_items, n_m,
                            H_Q, GROUP, N_Q, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """The producer warp of a persistent CTA: per tile, both query halves into the free Q buffer, then K_t, V_t
    for ``t < hi`` into the ring slots as both consumers free them, running ahead into the next tile."""
    HALF: gl.constexpr = BLOCK_M // 2
    SUBS: gl.constexpr = 2 if CAUSAL else 1
    it = 0
    count = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        for sub in range(SUBS):  # a loop, not unrolled: one copy of the body
            valid, start_m, q_row0, kv_row0 = _work_item(item, sub, n_m, H_Q, GROUP, N_Q, N_K, BLOCK_M, CAUSAL)
            if valid:
                full_end, hi = key_range(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
                load_q_halves(desc_q, q_smem, q_bars, count, q_row0, start_m, HALF)
                it = produce_kv(desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, kv_row0, hi, it, BLOCK_N, STAGES)
                count += 1


@gluon.jit
def fwd_ws_persistent_kernel(desc_q, desc_k, desc_v, O, LSE, H_Q, GROUP, N_Q, N_K, qk_scale, BH,
                              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                              STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                              PRODUCER_REGS: gl.constexpr, TURNS: gl.constexpr, num_warps: gl.constexpr,
                              PEELED: gl.constexpr = False, FENCE: gl.constexpr = False):
    """Grid = min(work items, SMs); CTA ``p`` takes items ``p, p + grid, ...`` (``_work_item``), each with the
    producer/consumer partitions of ``_fwd_ws_kernel`` and the K/V ring and turn phases carried across tiles.
    ``PEELED``, ``FENCE``: the consumers' key-loop options (``attend_overlapped``; ``key_loop_constexprs``)."""
    n_m = gl.cdiv(N_Q, BLOCK_M)
    if CAUSAL:
        n_items = BH * ((n_m + 1) // 2)
    else:
        n_items = BH * n_m
    q_smem, k_smem, v_smem, q_bars, turn_bars, k_bars, v_bars = pingpong_buffers(desc_q, desc_k, desc_v, HEAD_DIM,
                                                                                  BLOCK_M, BLOCK_N, STAGES)
    gl.warp_specialize([
        (_ws_consumer_persistent, (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, n_items, n_m,
                                   H_Q, GROUP, N_Q, N_K, qk_scale, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                                   TURNS, PEELED, FENCE)),
        (_ws_consumer_persistent, (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, n_items, n_m,
                                   H_Q, GROUP, N_Q, N_K, qk_scale, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                                   TURNS, PEELED, FENCE)),
        (_ws_producer_persistent, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, n_items,
                                   n_m, H_Q, GROUP, N_Q, N_K, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def check_gluon_config(config, head_dim: int | None = None) -> GluonForwardConfig:
    """Validate ``config``, a ``configs.GluonForwardConfig``; return it (``configs.GLUON_FORWARD`` if None).

    The kernel's layouts fix what is legal: two consumer warpgroups of 64 rows (``block_m = 128``,
    ``num_warps = 4`` per consumer), ``block_n`` 64 or 128, 2 or 3 stages. With ``head_dim``, the tiles must also
    fit a CTA's shared memory (``GluonForwardConfig.fits``): 128 x 128 tiles with 3 stages at d = 128 need 256 KiB,
    more than the 227 KiB allowed.
    """
    if config is None:
        return configs.GLUON_FORWARD
    if type(config) is not GluonForwardConfig:
        raise TypeError(f"config must be a reference.triton.configs.GluonForwardConfig or None, got {config!r}")
    if config.block_n not in (64, 128) or config.num_stages not in (2, 3):
        raise ValueError(f"config: block_n must be 64 or 128 and num_stages 2 or 3, got {config}")
    if config.block_m != 128 or config.num_warps != 4:
        raise ValueError(f"config: block_m = 128 and num_warps = 4 (two consumer warpgroups of 64 rows), got {config}")
    if head_dim is not None and not config.fits(head_dim):
        raise ValueError(f"config {config} at head_dim {head_dim} needs {config.shared_bytes(head_dim)} B of shared "
                         f"memory (two Q buffers + num_stages K/V slots), more than the {HOPPER_SMEM} B a Hopper CTA "
                         f"may use: use num_stages = 2 or block_n = 64")
    return config


def ws_constexprs(d: int, config: GluonForwardConfig, causal: bool, turns: bool = True) -> dict:
    """The constexpr arguments of the warp-specialised kernels for ``config`` (``turns``: the ping-pong order)."""
    return dict(HEAD_DIM=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, STAGES=config.num_stages, CAUSAL=causal,
                CONSUMER_REGS=PINGPONG_REGS[0], PRODUCER_REGS=PINGPONG_REGS[1], TURNS=turns,
                num_warps=config.num_warps)


def forward_args(q, k, v, o, lse, block_n: int, q_rows: int, scale: float, group: int) -> tuple:
    """The runtime arguments every Gluon forward kernel starts with: TMA descriptors of the 2-D views of q (boxes
    of ``q_rows``), k and v (boxes of ``block_n``), then ``O, LSE, H_Q, GROUP, N_Q, N_K, qk_scale``."""
    d = q.shape[-1]
    q2, k2, v2 = (x.contiguous().view(-1, d) for x in (q, k, v))
    bn = block_n
    return (tile_descriptor(q2, q_rows, d), tile_descriptor(k2, bn, d), tile_descriptor(v2, bn, d), o, lse,
            q.shape[1], group, q.shape[2], k.shape[2], scale * LOG2E_F)


def forward_signature(q_rows: int, bn: int, head_dim: int, dtype: str = "bf16") -> dict:
    """``compile_gluon`` signature of ``forward_args`` (for the sm_90a compile without a GPU)."""
    return {"desc_q": descriptor_signature(q_rows, head_dim, dtype),
            "desc_k": descriptor_signature(bn, head_dim, dtype),
            "desc_v": descriptor_signature(bn, head_dim, dtype), "O": f"*{dtype}", "LSE": "*fp32", "H_Q": "i32",
            "GROUP": "i32", "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32"}


def persistent_grid(B: int, Hq: int, Nq: int, bm: int, causal: bool, n_sms: int) -> tuple:
    """One CTA per SM, at most one per work item (a causal item is a heavy/light pair of query tiles)."""
    n_m = triton.cdiv(Nq, bm)
    items = B * Hq * ((n_m + 1) // 2 if causal else n_m)
    return (min(items, n_sms),)


def key_loop_constexprs(key_loop=None, head_dim: int = 128) -> dict:
    """``key_loop``: ``{"peeled": bool, "fence": bool}`` (``attend_overlapped``'s ``PEELED`` / ``FENCE``; a key left
    out is False), None for the default of ``head_dim`` in ``configs.GLUON_FWD_KEY_LOOP``; returns the kernel's
    constexprs."""
    if key_loop is None:
        key_loop = configs.GLUON_FWD_KEY_LOOP[head_dim]
    if not isinstance(key_loop, dict) or not set(key_loop) <= {"peeled", "fence"}:
        raise ValueError(f"key_loop must be a dict with keys among peeled, fence, got {key_loop!r}")
    return {"PEELED": check_flag(key_loop.get("peeled", False), "key_loop['peeled']"),
            "FENCE": check_flag(key_loop.get("fence", False), "key_loop['fence']")}


#: the forward's recorded launches (``_fastlaunch``): a training loop calls it with the same shapes every step, and
#: Triton's launch path (argument binding, specialization, ten-microsecond descriptor objects) made a short step's
#: host time longer than its GPU time (notes/hopper.md, "The training step's host time")
FWD_LAUNCHES = _fastlaunch.LaunchCache()
FWD_SLOTS = ("desc_q", "desc_k", "desc_v", "O", "LSE")


def clear_launches() -> None:
    """Forget the forward's recorded launches."""
    FWD_LAUNCHES.clear()


def flash_attention_forward_gluon(q, k, v, causal=False, scale=None, config=None, key_loop=None):
    """FA3-style forward on Hopper: return ``(o, lse)`` as ``flash_attention_forward`` does.

    ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)``, bfloat16 or float16, ``d`` in {64, 128}, ``Hq % Hkv == 0``;
    non-contiguous inputs are copied. ``config``: a ``configs.GluonForwardConfig``, default
    ``configs.GLUON_FORWARD`` (``check_gluon_config`` says what is legal). ``key_loop``: where the consumers' key loop
    waits for ``P V`` (``key_loop_constexprs``, ``attend_overlapped``), default ``configs.GLUON_FWD_KEY_LOOP[d]``.
    """
    B, Hq, Hkv, Nq, Nk, d, group, causal, scale = check_gluon_inputs(q, k, v, causal, scale,
                                                                     "flash_attention_forward_gluon")
    config = check_gluon_config(config, d)
    loop = key_loop_constexprs(key_loop, d)
    check_gluon_device(q.device)
    q, k, v = (x if x.is_contiguous() else x.contiguous() for x in (q, k, v))
    o = torch.empty((B, Hq, Nq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    tk = _fastlaunch.tensor_key
    key = (tk(q), tk(k), tk(v), causal, scale, config, loop["PEELED"], loop["FENCE"])
    rec = FWD_LAUNCHES.get(key)
    if rec is not None:  # a repeat: the recorded launch on this call's tensors
        desc = _fastlaunch.DescArg
        rec.launch([desc(q.view(-1, d)), desc(k.view(-1, d)), desc(v.view(-1, d)), o, lse])
        return o, lse
    bm = config.block_m
    grid = persistent_grid(B, Hq, Nq, bm, causal, torch.cuda.get_device_properties(q.device).multi_processor_count)
    args = (*forward_args(q, k, v, o, lse, config.block_n, bm // 2, scale, group), B * Hq)
    rec = _fastlaunch.launch_and_record(fwd_ws_persistent_kernel, grid, args,
                                        dict(ws_constexprs(d, config, causal), **loop, maxnreg=PINGPONG_MAXNREG),
                                        FWD_SLOTS, drop_slots=True)
    if rec is not None:
        FWD_LAUNCHES.put(key, rec)
    return o, lse


def compile_forward(head_dim: int = 128, causal: bool = False, config=None, dtype: str = "bf16", turns: bool = True,
                    key_loop=None):
    """Compile the production kernel for sm_90a ahead of time (no GPU needed); return the compiled kernel.

    ``reference.triton.hopper._aot.resource_usage`` then reads its registers, spills and SASS (tests,
    notes/hopper.md). ``turns=False``: without the ping-pong turn barriers (the "specialized" ablation);
    ``key_loop``: as ``flash_attention_forward_gluon``'s.
    """
    config = check_gluon_config(config)
    sig = dict(forward_signature(config.block_m // 2, config.block_n, head_dim, dtype), BH="i32")
    cx = dict(ws_constexprs(head_dim, config, causal, turns), **key_loop_constexprs(key_loop, head_dim))
    return compile_gluon(fwd_ws_persistent_kernel, sig, cx, config.num_warps, maxnreg=PINGPONG_MAXNREG)


__all__ = ["flash_attention_forward_gluon", "compile_forward", "check_gluon_config"]

"""FP8 (e4m3) FlashAttention forward for Hopper in Gluon: the production kernel's warp-specialised ping-pong
schedule (``flash_gluon.fwd_ws_persistent_kernel``) on FP8 tensor cores.

``flash_attention_forward_fp8_gluon(q, k, v, causal=False, scale=None, hadamard=False, seed=0) -> (o, lse)`` has
the contract and the quantisation of ``flash_fp8.flash_attention_forward_fp8`` (FA3 paper, Shah et al. 2024,
section 3.3; that module's docstring derives the scalings), and reuses its host-side pieces
(``prepare_fp8``: the optional random Hadamard rotation of Q and K, one e4m3 scale per 64 query rows and per
128 key / value rows, V stored transposed because FP8 wgmma reads its B operand K-major only):

* ``S_ij = (Q8_i K8_j^T) * (sq_i sk_j * scale * log2 e)``: the FP8 wgmma accumulates in fp32, the two block
  scales are one scalar per (consumer, key block), folded into the factor the bf16 kernel already applies;
* online softmax in base 2 (FA2 Algorithm 1, lines 9-10) with ``P~ = exp2(S - m + 8 + c_j)``: the ``2^8`` lifts P
  above e4m3's smallest normal, ``c_j = log2(sv_j / max_j sv_j) <= 0`` folds V's block scale into P, and
  ``l`` adds ``rowsum(P~) * 2^-c_j`` so it carries the ``2^8`` alone;
* ``O += P8 V8_j`` on the FP8 tensor cores with P rounded to e4m3 in registers (the A operand) and ``V^T``'s
  tile read K-major from shared memory;
* lines 12-15: ``O = acc * max_j sv_j / l``, ``lse = (m + log2 l - 8) ln 2`` (natural log), ``o`` in bfloat16.

The schedule is the bf16 production kernel's (``flash_gluon`` module docstring): one producer warp issues the
TMA copies of both 64-row Q halves (double-buffered across tiles) and the K / V^T tiles into a ``STAGES``-deep
ring; two consumer warpgroups (``setmaxnreg`` budgets) own 64 query rows each and take turns issuing their
matmuls (FA3 section 3.1 ping-pong), each overlapping its softmax of ``S_j`` with its own ``P_{j-1} V_{j-1}``
(FA3 Algorithm 2); the grid is persistent, tiles head-major, causal tiles in heavy/light pairs
(``flash_gluon.work_item``). What differs from bf16: e4m3 tiles (half the bytes, so a deeper ring fits),
the per-block scales (two scalar loads per key block, issued one block ahead), P's conversion to e4m3 and its
register layout for the FP8 A operand (``k_width = 4``: four 8-bit values per 32-bit register).

Quantised tensors are padded per head to whole blocks (``prepare_fp8``), so the 2-D TMA views
``(B * H * Npad, d)`` never cross a head; padded keys are masked to ``-inf`` like the causal diagonal.

Requirements: a Hopper GPU (compute capability 9.0; Gluon's wgmma / TMA / setmaxnreg are sm_90a), ``d`` in
{64, 128}; ``q, k, v`` float16, bfloat16 or float32 (quantised on the host). Elsewhere the entry point raises
``RuntimeError`` naming the requirement; ``compile_fp8_gluon`` compiles the kernel for sm_90a without a GPU
(tests, ``aot_report fp8g``).
"""
from __future__ import annotations

import dataclasses

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .._checks import check_attention_inputs, check_flag, check_gluon_device
from ..configs import FP8_GLUON_CONFIG, FP8_GLUON_SCHEDULE, HOPPER_SMEM, Fp8GluonConfig
from ._aot import compile_gluon, descriptor_signature
from .common import LOG2E_F, init_ring_barriers, load_q_halves, store_output, tile_descriptor
from .flash_fp8 import Fp8Inputs, Fp8KeyPermuted, prepare_fp8
from .fp8_quant import permute_keys  # noqa: F401  (re-exported: the public name stays here too)
from .fp8_quant import check_finite_mode, raise_if_nonfinite
# MASK_*: ``softmax_fp8``'s ``MASK`` (the bf16 ``online_softmax``'s: a run-time test of ``j >= full_end``, never,
# always); ``mask_scores``: the mask of FA2 Algorithm 1 line 9, shared with the bf16 forward
from .flash_gluon import (MASK_ALWAYS, MASK_CHECK, MASK_NEVER, PINGPONG_MAXNREG, PINGPONG_REGS, key_range,
                          mask_scores, persistent_grid, work_item)

#: head dimensions of the Gluon FP8 kernel (the bf16 Gluon kernel's; ``flash_fp8`` also takes 32)
FP8_GLUON_HEAD_DIMS = (64, 128)
#: rows of Q per consumer warpgroup = the query quantisation block
HALF_M = 64
#: log2 of the factor P is multiplied by before its e4m3 rounding (``flash_fp8.P_SHIFT``; the epilogue removes it)
P_SHIFT = gl.constexpr(8.0)
#: threads of one consumer warpgroup: with ``schedule["thread_arrive"]`` each arrives on a ring slot's free barrier
CONSUMER_THREADS = gl.constexpr(128)
NAME = "flash_attention_forward_fp8_gluon"


# --------------------------------------------------------------------------------------------------------------
# one consumer's key loop
# --------------------------------------------------------------------------------------------------------------
@gluon.jit
def softmax_fp8(s, m_i, l_i, j, full_end, start_m, N_Q, N_K, scale_j, c_j, s_layout: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, SPLIT: gl.constexpr,
                MASK: gl.constexpr = MASK_CHECK):
    """FA2 Algorithm 1, lines 9-10 on one raw FP8 score tile ``s = Q8 K8_j^T`` (fp32), with the FP8 scalings.

    ``scale_j = sq sk_j scale log2(e)`` (base-2 scores), ``c_j = log2(sv_j / max sv) <= 0``. Returns
    ``(p, alpha, m_new, l_new)`` with ``p = 2^8 P 2^c_j`` (rounded to e4m3 by the caller), ``alpha`` the factor
    of ``O`` and ``l_new = alpha l + rowsum(p) 2^-c_j`` (carrying the ``2^8``). Masked blocks (diagonal, keys
    past ``N_K``) set invisible scores to ``-inf``; a row that has seen no key uses max 0 (no inf - inf).
    ``SPLIT``: how the row max and sum are reduced (``row_reduce``). ``MASK``: ``MASK_CHECK`` masks the blocks
    ``j >= full_end`` (a run-time branch), ``MASK_NEVER`` / ``MASK_ALWAYS`` decide at compile time (no branch).
    """
    if MASK == MASK_ALWAYS:
        s = mask_scores(s, j, start_m, N_Q, N_K, s_layout, BLOCK_M, BLOCK_N, CAUSAL)
    elif MASK == MASK_CHECK:
        if j >= full_end:
            s = mask_scores(s, j, start_m, N_Q, N_K, s_layout, BLOCK_M, BLOCK_N, CAUSAL)
    m_new = gl.maximum(m_i, row_reduce(s, gl.SliceLayout(1, s_layout), BLOCK_M, BLOCK_N, SPLIT, True) * scale_j)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * scale_j - (m_use - (8.0 + c_j))[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_new = l_i * alpha + row_reduce(p, gl.SliceLayout(1, s_layout), BLOCK_M, BLOCK_N, SPLIT, False) * gl.exp2(-c_j)
    return p, alpha, m_new, l_new


@gluon.jit
def row_reduce(x, row_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr,
               IS_MAX: gl.constexpr):
    """Row max (``IS_MAX``) or row sum of a score tile in the wgmma accumulator layout.

    ``gl.max`` / ``gl.sum`` reduce a thread's 32 values of a row as one dependent chain (SASS: 31 FMNMX / FADD,
    each waiting for the last). ``SPLIT``: first reduce over the ``SPLIT`` column blocks of ``BLOCK_N / SPLIT``
    (columns ``c = (BLOCK_N / SPLIT) a + b``: for ``BLOCK_N / SPLIT >= 8`` the block index ``a`` is inside each
    thread, so this step needs no shuffle), giving ``BLOCK_N / SPLIT`` independent chains of ``SPLIT``, then
    over the rest. ``SPLIT = 1``: the plain reduction."""
    if SPLIT > 1:
        x3 = gl.reshape(x, [BLOCK_M, SPLIT, BLOCK_N // SPLIT])
        if IS_MAX:
            r = gl.max(gl.max(x3, axis=1), axis=1)
        else:
            r = gl.sum(gl.sum(x3, axis=1), axis=1)
        return gl.convert_layout(r, row_layout)  # the same rows per thread: no data moves
    if IS_MAX:
        return gl.max(x, axis=1)
    return gl.sum(x, axis=1)


@gluon.jit
def p_operand(p, p_layout: gl.constexpr, fp8: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              PERMUTED: gl.constexpr):
    """``P`` rounded to e4m3 in the register layout of the FP8 wgmma's A operand (``k_width = 4``).

    The accumulator layout of ``S`` gives a thread, in each 32-key chunk of a row, keys ``{8i + 2t, 8i + 2t + 1 :
    i < 4}`` (``t`` = lane % 4); the 8-bit A operand wants keys ``{16h + 4t + e : h < 2, e < 4}``. ``PERMUTED``: the
    keys of each 32-key chunk are renumbered ``8i + 2t + e -> 16 (i // 2) + 4t + 2 (i % 2) + e`` (a reshape and a
    permute, which move no data between threads) and ``V^T``'s columns were permuted alike on the host
    (``permute_keys``), so ``P V`` is unchanged and the conversion stays inside each thread; otherwise
    ``convert_layout`` moves the bytes between lanes (shuffles)."""
    if PERMUTED:
        p = gl.reshape(p, [BLOCK_M, BLOCK_N // 32, 2, 2, 4, 2])
        p = gl.permute(p, (0, 1, 2, 4, 3, 5))
        p = gl.reshape(p, [BLOCK_M, BLOCK_N])
        # fp32 in the operand layout (a renaming of registers), then 4 consecutive keys -> one 32-bit register
        p = gl.convert_layout(p, p_layout)
        return gl.inline_asm_elementwise(
            "{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\nmov.b32 $0, {lo, hi};\n}",
            "=r,r,r,r,r", [p], dtype=gl.float8e4nv, is_pure=True, pack=4)
    return gl.convert_layout(p.to(fp8), p_layout)


@gluon.constexpr_function
def free_offset(STAGES, THREAD_ARRIVE):
    """Index of ring slot 0's "free" barrier in its allocation: ``STAGES`` where the free barriers follow the
    full ones in one allocation (the default), 0 where they have their own (``THREAD_ARRIVE``)."""
    return 0 if THREAD_ARRIVE else STAGES


@gluon.jit
def release(bar, THREAD_ARRIVE: gl.constexpr):
    """Free a ring slot (its consumer is done reading it). ``mbarrier.arrive`` lowers to a warpgroup ``bar.sync``
    and one elected thread's arrive (count: one per consumer); ``THREAD_ARRIVE``: every thread arrives for itself
    (``cp.async.mbarrier.arrive.noinc``, with no cp.async outstanding an immediate arrive; count: all consumer
    threads), so no thread waits for the others of its warpgroup. Each thread arrives after its own
    ``warpgroup_mma_wait`` on the wgmma that read the slot, so the slot completes only when every warp is done."""
    if THREAD_ARRIVE:
        async_copy.mbarrier_arrive(bar, increment_count=False)
    else:
        mbarrier.arrive(bar)


@gluon.jit
def key_block(j, p, acc, m_i, l_i, sk, cj, q_smem, k_smem, v_smem, k_bars, v_bars, k_free, v_free, turn_bars, SK, SV_LOG2, kblk0,
              full_end, hi, start_m, N_Q, N_K, q_scale, WG, it0, r0, s_zero, s_layout: gl.constexpr,
              o_layout: gl.constexpr, p_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, CAUSAL: gl.constexpr, PERMUTED: gl.constexpr, TURNS: gl.constexpr,
              MERGED: gl.constexpr, SPLIT: gl.constexpr, MASK: gl.constexpr, FENCE: gl.constexpr = False,
              THREAD_ARRIVE: gl.constexpr = False):
    """Iteration ``j >= 1`` of ``attend_fp8``'s key loop (FA3 Algorithm 2): issue ``S_j = Q K_j^T`` and
    ``O += P_{j-1} V_{j-1}``, wait for ``S_j`` only, free its K slot, softmax (``softmax_fp8``, ``MASK``) while
    ``P_{j-1} V_{j-1}`` runs, wait for it, free its V slot, rescale ``O``. ``sk, cj``: block ``j``'s scales;
    returns ``(p, acc, m_i, l_i)`` and block ``j + 1``'s scales (loaded one block ahead). ``FENCE`` (not with
    ``MERGED``): K slot ``j`` is freed after the softmax instead, inside ``if N_K > 0`` (always true here): the
    branch ends the softmax's basic block, so ptxas cannot hoist the ``P_{j-1} V_{j-1}`` wait above the exps
    (the bf16 kernel's ``flash_gluon.attend_overlapped(FENCE=True)``)."""
    fp8: gl.constexpr = k_smem.dtype
    FREE: gl.constexpr = free_offset(STAGES, THREAD_ARRIVE)
    # P_{j-1} is carried in fp32 and rounded here: an e4m3 tensor carried across the loop is one byte per
    # register (unpacked and repacked each iteration, measured in the SASS), packed it is 16 registers
    p_op = p_operand(p, p_layout, fp8, BLOCK_M, BLOCK_N, PERMUTED)
    slot = (it0 + j) % STAGES
    prev = (it0 + j - 1) % STAGES
    mbarrier.wait(k_bars.index(slot), ((it0 + j) // STAGES) & 1)
    mbarrier.wait(v_bars.index(prev), ((it0 + j - 1) // STAGES) & 1)
    if TURNS:
        mbarrier.wait(turn_bars.index(WG), ((r0 + j) & 1) ^ (1 - WG))
    s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_op, v_smem.index(prev).permute((1, 0)), acc, is_async=True)
    if TURNS:
        mbarrier.arrive(turn_bars.index(1 - WG))
    nxt = gl.minimum(j + 1, hi - 1)
    sk_n = gl.load(SK + kblk0 + nxt)
    cj_n = gl.load(SV_LOG2 + kblk0 + nxt)
    s = warpgroup_mma_wait(1, deps=(s,))  # S_j done; P_{j-1} V_{j-1} may still run
    if not MERGED and not FENCE:
        release(k_free.index(FREE + slot), THREAD_ARRIVE)
    p, alpha, m_i, l_i = softmax_fp8(s, m_i, l_i, j, full_end, start_m, N_Q, N_K, q_scale * sk, cj, s_layout,
                                     BLOCK_M, BLOCK_N, CAUSAL, SPLIT, MASK)
    if FENCE:
        if N_K > 0:  # always true here; the branch keeps the next wait below the softmax
            release(k_free.index(FREE + slot), THREAD_ARRIVE)
    # MASK_CHECK: the mask's branch splits the body into basic blocks and ptxas hoists this wait to the top of
    # the one holding the softmax, above the first exp; MASK_NEVER / MASK_ALWAYS (no branch) or FENCE leave it here
    acc = warpgroup_mma_wait(0, deps=(acc,))
    if MERGED:
        release(k_free.index(FREE + prev), THREAD_ARRIVE)
    else:
        release(v_free.index(FREE + prev), THREAD_ARRIVE)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return p, acc, m_i, l_i, sk_n, cj_n


@gluon.jit
def attend_fp8(q_smem, k_smem, v_smem, k_bars, v_bars, k_free, v_free, turn_bars, SK, SV_LOG2, kblk0, full_end, hi, start_m,
               N_Q, N_K, q_scale, WG, it0, r0, s_layout: gl.constexpr, o_layout: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
               CAUSAL: gl.constexpr, PERMUTED: gl.constexpr, TURNS: gl.constexpr, MERGED: gl.constexpr,
               SPLIT: gl.constexpr, PEELED: gl.constexpr, FENCE: gl.constexpr = False,
               THREAD_ARRIVE: gl.constexpr = False):
    """Key blocks ``0 .. hi-1`` of one consumer's 64 query rows (already in ``q_smem``): ``(acc, m_i, l_i)``.

    The bf16 kernel's ``flash_gluon.attend_overlapped`` (FA3 Algorithm 2 under ping-pong turns) on e4m3 tiles:
    iteration ``j`` waits for its turn, issues ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` (async), hands the
    turn over, waits for ``S_j`` only, frees K slot ``j``, runs ``softmax_fp8`` while ``P V`` runs, then waits
    for it, frees V slot ``j - 1`` and rescales ``O``. Key block ``j`` sits in ring slot ``(it0 + j) % STAGES``;
    ``r0`` counts the matmul rounds of earlier tiles (``hi + 1`` each). The scales of block ``j + 1``
    (``SK``/``SV_LOG2`` at ``kblk0 + j + 1``) are loaded while block ``j`` is processed.

    ``TURNS=False``: no ping-pong turns (the two consumers issue as they are ready). ``MERGED``: one release per
    ring slot (``k_bars[STAGES + slot]``, after ``P_j V_j`` is done) instead of K's after ``S_j`` and V's after
    ``P_j V_j``: one warpgroup barrier + arrive less per key block, K's slot held one step longer. ``PEELED``:
    the loop split at ``full_end`` into an unmasked and a masked loop (``key_block``), no branch in either body.
    ``FENCE``: K slot ``j`` freed after the softmax in an always-taken branch (``key_block``), which keeps the
    ``P_{j-1} V_{j-1}`` wait below the exps in every loop, masked ones included.
    """
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    FREE: gl.constexpr = free_offset(STAGES, THREAD_ARRIVE)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    fp8: gl.constexpr = k_smem.dtype
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    if hi > 0:
        sk = gl.load(SK + kblk0)
        cj = gl.load(SV_LOG2 + kblk0)
        mbarrier.wait(k_bars.index(it0 % STAGES), (it0 // STAGES) & 1)
        if TURNS:
            mbarrier.wait(turn_bars.index(WG), (r0 & 1) ^ (1 - WG))
        s = warpgroup_mma(q_smem, k_smem.index(it0 % STAGES).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        if TURNS:
            mbarrier.arrive(turn_bars.index(1 - WG))
        nxt = gl.minimum(1, hi - 1)  # the next block's scales (a valid index even when hi == 1)
        sk_n = gl.load(SK + kblk0 + nxt)
        cj_n = gl.load(SV_LOG2 + kblk0 + nxt)
        s = warpgroup_mma_wait(0, deps=(s,))
        if not MERGED:
            release(k_free.index(FREE + it0 % STAGES), THREAD_ARRIVE)
        p, alpha, m_i, l_i = softmax_fp8(s, m_i, l_i, 0, full_end, start_m, N_Q, N_K, q_scale * sk, cj,
                                         s_layout, BLOCK_M, BLOCK_N, CAUSAL, SPLIT)
        if PEELED:
            # keys blocks 1 .. full_end - 1 need no mask, full_end .. hi - 1 do: two loops with no branch in their
            # bodies, so ptxas keeps the P V wait after the softmax's exps (notes/hopper.md, "the P V wait")
            for j in range(1, full_end):
                p, acc, m_i, l_i, sk_n, cj_n = key_block(
                    j, p, acc, m_i, l_i, sk_n, cj_n, q_smem, k_smem, v_smem, k_bars, v_bars, k_free, v_free, turn_bars, SK, SV_LOG2,
                    kblk0, full_end, hi, start_m, N_Q, N_K, q_scale, WG, it0, r0, s_zero, s_layout, o_layout,
                    p_layout, BLOCK_M, BLOCK_N, STAGES, CAUSAL, PERMUTED, TURNS, MERGED, SPLIT, MASK_NEVER, FENCE, THREAD_ARRIVE)
            for j in range(gl.maximum(full_end, 1), hi):
                p, acc, m_i, l_i, sk_n, cj_n = key_block(
                    j, p, acc, m_i, l_i, sk_n, cj_n, q_smem, k_smem, v_smem, k_bars, v_bars, k_free, v_free, turn_bars, SK, SV_LOG2,
                    kblk0, full_end, hi, start_m, N_Q, N_K, q_scale, WG, it0, r0, s_zero, s_layout, o_layout,
                    p_layout, BLOCK_M, BLOCK_N, STAGES, CAUSAL, PERMUTED, TURNS, MERGED, SPLIT, MASK_ALWAYS, FENCE, THREAD_ARRIVE)
        else:
            for j in range(1, hi):
                p, acc, m_i, l_i, sk_n, cj_n = key_block(
                    j, p, acc, m_i, l_i, sk_n, cj_n, q_smem, k_smem, v_smem, k_bars, v_bars, k_free, v_free, turn_bars, SK, SV_LOG2,
                    kblk0, full_end, hi, start_m, N_Q, N_K, q_scale, WG, it0, r0, s_zero, s_layout, o_layout,
                    p_layout, BLOCK_M, BLOCK_N, STAGES, CAUSAL, PERMUTED, TURNS, MERGED, SPLIT, MASK_CHECK, FENCE, THREAD_ARRIVE)
        p_op = p_operand(p, p_layout, fp8, BLOCK_M, BLOCK_N, PERMUTED)
        last = (it0 + hi - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((it0 + hi - 1) // STAGES) & 1)
        if TURNS:
            mbarrier.wait(turn_bars.index(WG), ((r0 + hi) & 1) ^ (1 - WG))
        acc = warpgroup_mma(p_op, v_smem.index(last).permute((1, 0)), acc, is_async=True)
        if TURNS:
            mbarrier.arrive(turn_bars.index(1 - WG))
        acc = warpgroup_mma_wait(0, deps=(acc,))
        if MERGED:
            release(k_free.index(FREE + last), THREAD_ARRIVE)
        else:
            release(v_free.index(FREE + last), THREAD_ARRIVE)
    return acc, m_i, l_i


# --------------------------------------------------------------------------------------------------------------
# the partitions and the kernel
# --------------------------------------------------------------------------------------------------------------
@gluon.jit
def _fp8_consumer(q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, k_free, v_free, turn_bars, SQ, SK, SV_LOG2, SV_MAX, O, LSE,
                  n_items, n_m, H_Q, GROUP, N_Q, N_K, N_PAD_Q, N_PAD_K, qk_scale, WG: gl.constexpr,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, PERMUTED: gl.constexpr, TURNS: gl.constexpr, MERGED: gl.constexpr,
                  SPLIT: gl.constexpr, PEELED: gl.constexpr, FENCE: gl.constexpr,
                  THREAD_ARRIVE: gl.constexpr):
    """Consumer ``WG`` of a persistent CTA: its 64 query rows of each tile the CTA owns, in item order (the bf16
    kernel's ``_ws_consumer_persistent``; Q buffer ``2 * (count % 2) + WG``, freed after the tile's last
    matmul). ``work_item`` is called with the padded lengths, so its row origins index the padded 2-D views;
    the output rows use the unpadded ``N_Q``."""
    HALF: gl.constexpr = BLOCK_M // 2
    SUBS: gl.constexpr = 2 if CAUSAL else 1
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 32])
    it = 0
    rnd = 0
    count = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        for sub in range(SUBS):
            valid, start_m, q_row0, kv_row0 = work_item(item, sub, n_m, H_Q, GROUP, N_PAD_Q, N_PAD_K, BLOCK_M,
                                                         CAUSAL)
            if valid:
                full_end, hi = key_range(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
                my_start = start_m + WG * HALF
                bhk = kv_row0 // N_PAD_K
                # a 128-row tile may end past the padded head (N_PAD_Q is a multiple of 64): that half's rows
                # are never stored, and its scale index is clamped into the head
                q_scale = gl.load(SQ + (q_row0 + gl.minimum(my_start, N_PAD_Q - HALF)) // HALF) * qk_scale
                sv_max = gl.load(SV_MAX + bhk)
                q_slot = 2 * (count % 2) + WG
                mbarrier.wait(q_bars.index(q_slot), (count // 2) & 1)
                acc, m_i, l_i = attend_fp8(q_smem.index(q_slot), k_smem, v_smem, k_bars, v_bars, k_free, v_free,
                                           turn_bars, SK, SV_LOG2, kv_row0 // BLOCK_N, full_end, hi, my_start, N_Q,
                                           N_K, q_scale, WG, it, rnd, s_layout, o_layout, HALF, BLOCK_N, HEAD_DIM,
                                           STAGES, CAUSAL, PERMUTED, TURNS, MERGED, SPLIT, PEELED, FENCE,
                                           THREAD_ARRIVE)
                mbarrier.arrive(q_bars.index(4 + q_slot))
                store_output(acc, m_i, l_i, O, LSE, (q_row0 // N_PAD_Q) * N_Q, my_start, N_Q, o_layout, HALF,
                             HEAD_DIM, sv_max, SCALED=True, LSE_SHIFT=P_SHIFT)
                it += hi
                rnd += gl.where(hi > 0, hi + 1, 0)
                count += 1


@gluon.jit
def _fp8_producer(desc_q, desc_k, desc_vt, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, k_free, v_free, n_items, n_m, H_Q,
                  GROUP, N_Q, N_K, N_PAD_Q, N_PAD_K, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, MERGED: gl.constexpr,
                  THREAD_ARRIVE: gl.constexpr):
    """The producer warp (``flash_gluon._ws_producer_persistent`` + ``produce_kv``): per tile both Q halves into
    the free Q buffer, then ``K_t`` (rows ``kv_row0 + t BLOCK_N``) and ``V^T_t`` (rows ``bhk d``, columns
    ``t BLOCK_N`` of the transposed view) into ring slot ``it % STAGES`` once both consumers freed it."""
    HALF: gl.constexpr = BLOCK_M // 2
    SUBS: gl.constexpr = 2 if CAUSAL else 1
    FREE: gl.constexpr = free_offset(STAGES, THREAD_ARRIVE)
    it = 0
    count = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        for sub in range(SUBS):
            valid, start_m, q_row0, kv_row0 = work_item(item, sub, n_m, H_Q, GROUP, N_PAD_Q, N_PAD_K, BLOCK_M,
                                                         CAUSAL)
            if valid:
                full_end, hi = key_range(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
                load_q_halves(desc_q, q_smem, q_bars, count, q_row0, start_m, HALF)
                vt_row = (kv_row0 // N_PAD_K) * HEAD_DIM
                for t in range(hi):
                    slot = it % STAGES
                    free_phase = ((it // STAGES) & 1) ^ 1
                    mbarrier.wait(k_free.index(FREE + slot), free_phase)
                    mbarrier.expect(k_bars.index(slot), desc_k.block_type.nbytes)
                    tma.async_copy_global_to_shared(desc_k, [kv_row0 + t * BLOCK_N, 0], k_bars.index(slot),
                                                    k_smem.index(slot))
                    if not MERGED:
                        mbarrier.wait(v_free.index(FREE + slot), free_phase)
                    mbarrier.expect(v_bars.index(slot), desc_vt.block_type.nbytes)
                    tma.async_copy_global_to_shared(desc_vt, [vt_row, t * BLOCK_N], v_bars.index(slot),
                                                    v_smem.index(slot))
                    it += 1
                count += 1


@gluon.jit
def fwd_fp8_ws_kernel(desc_q, desc_k, desc_vt, SQ, SK, SV_LOG2, SV_MAX, O, LSE, H_Q, GROUP, N_Q, N_K, N_PAD_Q,
                      N_PAD_K, qk_scale, BH, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STAGES: gl.constexpr, CAUSAL: gl.constexpr, PERMUTED: gl.constexpr, TURNS: gl.constexpr,
                      MERGED: gl.constexpr, SPLIT: gl.constexpr, PEELED: gl.constexpr, FENCE: gl.constexpr,
                      THREAD_ARRIVE: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                      PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """Persistent FP8 forward: grid = min(work items, SMs), CTA ``p`` takes items ``p, p + grid, ...``; shared
    memory: 2 x 2 Q halves (64 x d e4m3), ``STAGES`` K slots (``BLOCK_N x d``) and V^T slots (``d x BLOCK_N``)."""
    HALF: gl.constexpr = BLOCK_M // 2
    fp8: gl.constexpr = desc_q.dtype
    n_m = gl.cdiv(N_Q, BLOCK_M)
    if CAUSAL:
        n_items = BH * ((n_m + 1) // 2)
    else:
        n_items = BH * n_m
    q_smem = gl.allocate_shared_memory(fp8, [4, HALF, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(fp8, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(fp8, [STAGES, HEAD_DIM, BLOCK_N], desc_vt.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [8, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    if THREAD_ARRIVE:
        # the "free" barriers in allocations of their own: Triton's shared-memory barrier analysis orders accesses
        # per allocation, so an arrive on one and a wait on the other need no warpgroup bar.sync between them
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    else:
        k_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
        k_free = k_bars  # the "free" barriers are entries STAGES .. 2 STAGES - 1 (``free_offset``)
        v_free = v_bars
    for i in gl.static_range(8):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    if THREAD_ARRIVE:
        for i in gl.static_range(STAGES):  # every consumer thread arrives on a free barrier
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)
            mbarrier.init(k_free.index(i), count=2 * CONSUMER_THREADS)
            mbarrier.init(v_free.index(i), count=2 * CONSUMER_THREADS)
    else:
        init_ring_barriers(k_bars, v_bars, STAGES, 2)
    fence_async_shared()
    gl.warp_specialize([
        (_fp8_consumer, (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, k_free, v_free, turn_bars, SQ, SK, SV_LOG2, SV_MAX, O, LSE,
                         n_items, n_m, H_Q, GROUP, N_Q, N_K, N_PAD_Q, N_PAD_K, qk_scale, 0, HEAD_DIM, BLOCK_M,
                         BLOCK_N, STAGES, CAUSAL, PERMUTED, TURNS, MERGED, SPLIT, PEELED, FENCE, THREAD_ARRIVE)),
        (_fp8_consumer, (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, k_free, v_free, turn_bars, SQ, SK, SV_LOG2, SV_MAX, O, LSE,
                         n_items, n_m, H_Q, GROUP, N_Q, N_K, N_PAD_Q, N_PAD_K, qk_scale, 1, HEAD_DIM, BLOCK_M,
                         BLOCK_N, STAGES, CAUSAL, PERMUTED, TURNS, MERGED, SPLIT, PEELED, FENCE, THREAD_ARRIVE)),
        (_fp8_producer, (desc_q, desc_k, desc_vt, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, k_free, v_free, n_items, n_m, H_Q,
                         GROUP, N_Q, N_K, N_PAD_Q, N_PAD_K, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL, MERGED,
                         THREAD_ARRIVE)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def prepare_fp8_gluon(q, k, v, causal=False, scale=None, hadamard=False, seed=0, config=None,
                      permuted: bool = True, fused=None, defer_check=False) -> Fp8Inputs:
    """Validate and quantise for the Gluon kernel: ``flash_fp8.prepare_fp8`` (rotation, 64-row query blocks,
    ``BLOCK_N``-row key blocks, ``V^T``) with, if ``permuted``, ``V^T``'s keys renumbered (``Fp8KeyPermuted``).
    On a GPU (``fused=None`` or True) that is one launch of ``fp8_quant.quantize_qkv_fp8``, which writes ``V^T``
    renumbered directly; ``fused=False`` takes the torch path (rotation, block quantisation, then
    ``permute_keys`` on the e4m3 ``V^T``). ``defer_check``: as ``prepare_fp8`` (``attention_fp8_gluon`` then
    reads the non-finite flag after its launch). Bad input raises naming the argument, a GPU other than Hopper
    ``RuntimeError`` naming compute capability 9.0."""
    check_fp8_gluon_inputs(q, k, v)
    config = check_fp8_gluon_config(config, q.shape[-1])
    check_flag(permuted, "permuted")
    check_gluon_device(q.device, NAME)
    return prepare_fp8(q, k, v, causal=causal, scale=scale, hadamard=hadamard, seed=seed, block_m=HALF_M,
                       block_n=config.block_n, permute_v=permuted, fused=fused, defer_check=defer_check)


def check_fp8_gluon_config(config, head_dim: int | None = None) -> Fp8GluonConfig:
    """``config``: a ``configs.Fp8GluonConfig`` (default ``configs.FP8_GLUON_CONFIG``): two consumer warpgroups of
    64 rows (``block_m = 128``, 4 warps each), ``block_n = 128`` (the key quantisation block), ``num_stages`` in
    2..4 within the 227 KiB of a Hopper CTA's shared memory (``Fp8GluonConfig.fits``)."""
    if config is None:
        return FP8_GLUON_CONFIG
    if type(config) is not Fp8GluonConfig:
        raise TypeError(f"config must be a reference.triton.configs.Fp8GluonConfig or None, got {config!r}")
    if (config.block_m != 2 * HALF_M or config.block_n != 128 or config.num_warps != 4
            or config.num_stages not in (2, 3, 4)):
        raise ValueError(f"config: block_m = 128, block_n = 128, num_warps = 4 and num_stages in 2..4, got {config}")
    if head_dim is not None and not config.fits(head_dim):
        raise ValueError(f"config {config} at head_dim {head_dim} needs {config.shared_bytes(head_dim)} B of shared "
                         f"memory, more than the {HOPPER_SMEM} B a Hopper CTA may use")
    return config


def check_schedule(schedule) -> dict:
    """``schedule``: ``{"turns": bool, "merged": bool, "split": 1 | 2 | 4 | 8, "peeled": bool, "fence": bool}``
    (``attend_fp8``, ``row_reduce``), default ``configs.FP8_GLUON_SCHEDULE``; ``split`` (1), ``peeled`` and
    ``fence`` (False) may be left out; ``fence`` moves the K release, which ``merged`` removes: not both."""
    if schedule is None:
        schedule = FP8_GLUON_SCHEDULE
    keys = {"turns", "merged", "split", "peeled", "fence", "thread_arrive"}
    if not isinstance(schedule, dict) or not {"turns", "merged"} <= set(schedule) <= keys:
        raise ValueError(f"schedule must be a dict with keys turns, merged (and split, peeled, fence), got "
                         f"{schedule!r}")
    split = schedule.get("split", 1)
    if split not in (1, 2, 4, 8) or isinstance(split, bool):
        raise ValueError(f"schedule['split'] must be 1, 2, 4 or 8, got {split!r}")
    out = {"turns": check_flag(schedule["turns"], "schedule['turns']"),
           "merged": check_flag(schedule["merged"], "schedule['merged']"), "split": split,
           "peeled": check_flag(schedule.get("peeled", False), "schedule['peeled']"),
           "fence": check_flag(schedule.get("fence", False), "schedule['fence']"),
           "thread_arrive": check_flag(schedule.get("thread_arrive", False), "schedule['thread_arrive']")}
    if out["fence"] and out["merged"]:
        raise ValueError("schedule['fence'] moves the K slot's own release, which schedule['merged'] removes: "
                         "set at most one of them")
    return out


def fp8_gluon_constexprs(d: int, config: Fp8GluonConfig, causal: bool, permuted: bool = True, schedule=None) -> dict:
    """The kernel's constexpr arguments (``permuted``: ``V^T``'s keys renumbered, ``p_operand``; ``schedule``:
    ``check_schedule``)."""
    sched = check_schedule(schedule)
    return dict(HEAD_DIM=d, BLOCK_M=config.block_m, BLOCK_N=config.block_n, STAGES=config.num_stages, CAUSAL=causal,
                PERMUTED=permuted,
                TURNS=sched["turns"], MERGED=sched["merged"], SPLIT=sched["split"], PEELED=sched["peeled"],
                FENCE=sched["fence"], THREAD_ARRIVE=sched["thread_arrive"],
                CONSUMER_REGS=PINGPONG_REGS[0], PRODUCER_REGS=PINGPONG_REGS[1], num_warps=config.num_warps)


def fp8_gluon_signature(head_dim: int, bn: int = 128) -> dict:
    """``compile_gluon`` signature of the kernel's runtime arguments (the sm_90a compile without a GPU)."""
    return {"desc_q": descriptor_signature(HALF_M, head_dim, "fp8e4nv"),
            "desc_k": descriptor_signature(bn, head_dim, "fp8e4nv"),
            "desc_vt": descriptor_signature(head_dim, bn, "fp8e4nv"),
            "SQ": "*fp32", "SK": "*fp32", "SV_LOG2": "*fp32", "SV_MAX": "*fp32", "O": "*bf16", "LSE": "*fp32",
            "H_Q": "i32", "GROUP": "i32", "N_Q": "i32", "N_K": "i32", "N_PAD_Q": "i32", "N_PAD_K": "i32",
            "qk_scale": "fp32", "BH": "i32"}


def attention_fp8_gluon(x: Fp8Inputs, config=None, out_dtype=torch.bfloat16, schedule=None):
    """Run the Gluon FP8 kernel on inputs from ``prepare_fp8_gluon`` (or ``flash_fp8.prepare_fp8`` with 64-row
    query and 128-row key blocks: then ``V^T`` is not renumbered and P goes through ``convert_layout``):
    ``(o (B, Hq, Nq, d) out_dtype, lse (B, Hq, Nq) float32)``. Time this to time the kernel alone (with the two
    per-head reductions of V's scales, as ``flash_fp8.attention_fp8`` does). ``schedule``: ``check_schedule``."""
    if not isinstance(x, Fp8Inputs):
        raise TypeError(f"x must be the Fp8Inputs of prepare_fp8_gluon, got {type(x).__name__}")
    d = x.q.data.shape[-1]
    config = check_fp8_gluon_config(config, d)
    schedule = check_schedule(schedule)
    bn = config.block_n
    if x.q.block != HALF_M or x.k.block != bn or x.v.block != bn or not x.v.transposed:
        raise ValueError(f"x: quantised with query blocks of {x.q.block} and key blocks of {x.k.block}; the Gluon "
                         f"FP8 kernel needs {HALF_M} and {bn} and V transposed (prepare_fp8_gluon)")
    check_gluon_device(x.q.data.device, NAME)
    B, Hq, nq_pad, _ = x.q.data.shape
    nk_pad = x.k.data.shape[2]
    nq, nk = x.q.n, x.k.n
    sv_max = x.v.scale.amax(dim=-1).contiguous()
    sv_log2 = torch.log2(x.v.scale / sv_max[..., None]).contiguous()
    dev = x.q.data.device
    o = torch.empty((B, Hq, nq, d), dtype=out_dtype, device=dev)
    lse = torch.empty((B, Hq, nq), dtype=torch.float32, device=dev)
    desc_q = tile_descriptor(x.q.data.view(-1, d), HALF_M, d)
    desc_k = tile_descriptor(x.k.data.view(-1, d), bn, d)
    desc_vt = tile_descriptor(x.v.data.view(-1, nk_pad), d, bn)
    grid = persistent_grid(B, Hq, nq, config.block_m, x.causal,
                           torch.cuda.get_device_properties(dev).multi_processor_count)
    fwd_fp8_ws_kernel[grid](desc_q, desc_k, desc_vt, x.q.scale, x.k.scale, sv_log2, sv_max, o, lse, Hq, x.group,
                            nq, nk, nq_pad, nk_pad, x.scale * LOG2E_F, B * Hq,
                            **fp8_gluon_constexprs(d, config, x.causal, isinstance(x.v, Fp8KeyPermuted), schedule),
                            maxnreg=PINGPONG_MAXNREG)
    if x.pending_flag is not None:  # prepare_fp8_gluon(defer_check=True): raise now, the outputs are dropped
        raise_if_nonfinite(x.pending_flag)
    return o, lse


def check_fp8_gluon_inputs(q, k, v):
    """Shapes (``d`` in ``FP8_GLUON_HEAD_DIMS``, GQA) and dtype (float16 / bfloat16 / float32, quantised to e4m3
    on the host) of the entry point: ``check_attention_inputs`` names the argument."""
    check_attention_inputs(q, k, v, head_dims=FP8_GLUON_HEAD_DIMS)


def flash_attention_forward_fp8_gluon(q, k, v, causal=False, scale=None, hadamard=False, seed=0, config=None,
                                      check_finite=True):
    """FP8 (e4m3) forward on Hopper, warp-specialised Gluon kernel: ``(o, lse)`` as ``flash_attention_forward_fp8``.

    ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)`` float16/bfloat16/float32 on an H100/H200, ``d`` in {64, 128},
    GQA, ragged N and bottom-right causal. Quantisation as ``flash_fp8.prepare_fp8`` with 64-row query blocks and
    128-row key blocks (``hadamard=True`` rotates Q and K first; ``seed`` draws its signs). ``o`` is bfloat16,
    ``lse`` float32 natural log. ``config``: a ``configs.Fp8GluonConfig``, default ``configs.FP8_GLUON_CONFIG``.
    Raises ``RuntimeError`` naming compute capability 9.0 without a Hopper GPU.
    ``check_finite``: as ``flash_attention_forward_fp8`` (``False``: no host sync per call, CUDA-graph capture
    allowed, non-finite inputs not reported; H100, ``h100-fp8-quant.json`` column ``fp8_gluon_e2e_flag_unread``).
    """
    check_finite = check_finite_mode(check_finite, "flash_attention_forward_fp8_gluon")
    x = prepare_fp8_gluon(q, k, v, causal=causal, scale=scale, hadamard=hadamard, seed=seed, config=config,
                          defer_check=True)
    if not check_finite:
        x = dataclasses.replace(x, pending_flag=None)
    return attention_fp8_gluon(x, config)


def compile_fp8_gluon(head_dim: int = 128, causal: bool = False, config=None, permuted: bool = True,
                      schedule=None):
    """Compile the kernel for sm_90a ahead of time (no GPU; run with ``TRITON_INTERPRET=0``); return it for
    ``_aot.resource_usage`` (registers, spills, shared memory, SASS: QGMMA is the FP8 wgmma)."""
    config = check_fp8_gluon_config(config, head_dim)
    sig = fp8_gluon_signature(head_dim, config.block_n)
    return compile_gluon(fwd_fp8_ws_kernel, sig, fp8_gluon_constexprs(head_dim, config, causal, permuted, schedule),
                         config.num_warps, maxnreg=PINGPONG_MAXNREG)


__all__ = ["flash_attention_forward_fp8_gluon", "prepare_fp8_gluon", "attention_fp8_gluon", "compile_fp8_gluon",
           "check_fp8_gluon_config", "permute_keys", "FP8_GLUON_HEAD_DIMS"]

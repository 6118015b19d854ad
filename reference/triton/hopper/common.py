"""Shared pieces of the Hopper wing (public inside ``reference.triton.hopper``): what the Gluon forward, the
warp-specialised Gluon backward and their autograd op have in common.

* host helpers: TMA tensor descriptors and the final dQ scale/cast (``finish_dq``) around a kernel that
  accumulates dQ in fp32 (the Gluon kernels' input checks live in ``reference.triton._checks``, with every other
  check; this module imports nothing from the package, so every Gluon kernel module stays two imports deep);
* ``@gluon.jit`` helpers of the backward (the query-block row of a step, ``L_i``/``D_i`` loads, the ``P^T``
  mask, the dK/dV store, a vector reduction) and of the forwards (bf16 ``flash_gluon``, FP8 ``flash_fp8_gluon``):
  their rings (``init_ring_barriers``), the producer's Q loads (``load_q_halves``), the epilogue
  (``store_output``).

Nothing here launches a kernel on its own but ``finish_dq`` (a plain Triton kernel, which runs in the interpreter
too).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E_F = 1.4426950408889634
LN2_F = 0.6931471805599453
CONVERT_BLOCK = 1024


# --------------------------------------------------------------------------------------------------------------
# host helpers
# --------------------------------------------------------------------------------------------------------------
def gl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
            torch.float8_e4m3fn: gl.float8e4nv}[dtype]


def tile_descriptor(x2d: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    """TMA descriptor of the 2-D view ``x2d`` with box ``[rows, cols]`` in the default NVMMA shared layout."""
    layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl_dtype(x2d.dtype))
    return TensorDescriptor(x2d, list(x2d.shape), list(x2d.stride()), [rows, cols], layout)


@triton.jit
def _dq_convert(DQ_ACC, DQ, n, scale, BLOCK: tl.constexpr):
    """``dQ = scale * dQ_acc`` cast to dQ's dtype (the kernels accumulate unscaled fp32)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(DQ + offs, (tl.load(DQ_ACC + offs, mask=ok, other=0.0) * scale).to(DQ.dtype.element_ty), mask=ok)


def finish_dq(dq_acc, q, scale, launch=None):
    """``dq = scale * dq_acc`` in ``q``'s dtype; ``dq_acc (B, Hq, Nq_pad, d)`` fp32, padded to whole query blocks.
    ``launch(kernel, grid, args, kwargs)``: how ``_dq_convert`` is launched (None: ``kernel[grid](...)``); its
    return value comes back as ``(dq, launch's result)`` (``None`` for a padded ``dq_acc``, converted by torch)."""
    Nq = q.shape[2]
    if dq_acc.shape[2] != Nq:
        dq = (dq_acc[:, :, :Nq] * scale).to(q.dtype)
        return dq if launch is None else (dq, None)
    dq = torch.empty_like(q)
    n = dq.numel()
    grid, args, meta = (triton.cdiv(n, CONVERT_BLOCK),), (dq_acc, dq, n, scale), dict(BLOCK=CONVERT_BLOCK)
    if launch is not None:
        return dq, launch(_dq_convert, grid, args, meta)
    _dq_convert[grid](*args, **meta)
    return dq


# --------------------------------------------------------------------------------------------------------------
# @gluon.jit helpers
# --------------------------------------------------------------------------------------------------------------
@gluon.jit
def init_ring_barriers(k_bars, v_bars, STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    """K/V rings of ``STAGES`` slots filled by a producer: barrier ``slot`` says the tile arrived (one TMA
    arrival), barrier ``STAGES + slot`` that all ``CONSUMERS`` released it."""
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(k_bars.index(STAGES + i), count=CONSUMERS)
        mbarrier.init(v_bars.index(STAGES + i), count=CONSUMERS)


@gluon.jit
def item_tile(item, sub, n_m, CAUSAL: gl.constexpr):
    """Query tile ``sub`` of a persistent kernel's work item ``item``, with ``n_m`` query tiles per (batch, head)
    -> ``(bh, pid_m, paired)``: the (batch, head) index, the query tile and whether the item runs it.

    Items run head-major: the query tiles of one (batch, head) are neighbours, so the CTAs that run at the same
    time share a few heads' K/V in L2. (Head-minor order re-reads each head's K/V from memory once per query
    tile; measured at 0.54-0.59x cuDNN at N = 2k, notes/hopper.md section 1c.) Non-causal: one tile per item.
    Causal: item ``i`` of a head pairs query block ``n_m - 1 - i`` (the most key blocks) with block ``i`` (the
    fewest), so every item costs about ``n_m + 1`` key blocks and a static round-robin over items is balanced.
    """
    if CAUSAL:
        per_head = (n_m + 1) // 2
    else:
        per_head = n_m
    i = item % per_head
    if CAUSAL:
        pid_m = gl.where(sub == 0, n_m - 1 - i, i)
    else:
        pid_m = i
    # an odd n_m's middle block is sub 0 of its item only
    return item // per_head, pid_m, (sub == 0) | (pid_m < n_m - 1 - pid_m)


@gluon.jit
def pingpong_buffers(desc_q, desc_k, desc_v, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """A persistent ping-pong CTA's shared memory and barriers (FA3 Algorithm 1's circular buffers, the two
    consumer warpgroups' turns of its Algorithm 2 schedule), initialised and fenced: two Q tiles of two
    ``BLOCK_M // 2``-row halves (barriers: ready x4, then free x4), the K/V rings of ``STAGES`` slots
    (``init_ring_barriers``, two consumers) and one turn barrier per consumer."""
    HALF: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = desc_q.dtype
    q_smem = gl.allocate_shared_memory(dtype, [4, HALF, HEAD_DIM], desc_q.layout)  # 2 buffers x 2 halves
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [8, 1], mbarrier.MBarrierLayout())  # ready x4, then free x4
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())  # ready, then empty
    v_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(8):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    init_ring_barriers(k_bars, v_bars, STAGES, 2)
    fence_async_shared()
    return q_smem, k_smem, v_smem, q_bars, turn_bars, k_bars, v_bars


@gluon.jit
def load_q_halves(desc_q, q_smem, q_bars, count, q_row0, start_m, HALF: gl.constexpr):
    """The producer's Q loads of its ``count``-th tile: both ``HALF``-row halves (rows ``q_row0 + start_m ..`` of
    the 2-D view) into Q buffer ``count % 2`` (slots ``2 (count % 2) + w``), each once its consumer freed it."""
    for w in gl.static_range(2):
        q_slot = 2 * (count % 2) + w
        mbarrier.wait(q_bars.index(4 + q_slot), ((count // 2) & 1) ^ 1)  # fresh: phase 1 complete
        mbarrier.expect(q_bars.index(q_slot), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [q_row0 + start_m + w * HALF, 0], q_bars.index(q_slot),
                                        q_smem.index(q_slot))


@gluon.jit
def store_output(acc, m_i, l_i, O, LSE, o_row0, start_m, N_Q, o_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                 HEAD_DIM: gl.constexpr, o_scale=1.0, SCALED: gl.constexpr = False, LSE_SHIFT: gl.constexpr = 0.0):
    """FA2 Algorithm 1, lines 12-15: ``O_i = acc / l_i``, ``L_i = m_i + log l_i`` (0 and -inf for empty rows).

    ``m_i`` is the running max in base 2; rows ``start_m ..`` (those ``< N_Q``) of the head whose first output row
    is ``o_row0``. The FP8 forward passes ``SCALED`` with ``o_scale = max_j sv_j`` (``O_i = acc o_scale / l_i``)
    and ``LSE_SHIFT = 8`` (its ``acc`` and ``l_i`` carry ``2^8``: ``L_i = (m_i + log2 l_i - 8) ln 2``).
    """
    row_l: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_i = gl.convert_layout(m_i, row_l)
    l_i = gl.convert_layout(l_i, row_l)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    if SCALED:
        o = acc * (o_scale / l_safe)[:, None]
    else:
        o = acc / l_safe[:, None]
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe) - LSE_SHIFT) * 0.6931471805599453)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_l)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    row_ok = offs_m < N_Q
    rows = (o_row0 + offs_m).to(gl.int64)
    gl.store(LSE + rows, lse, mask=row_ok)
    ptrs = O + rows[:, None] * HEAD_DIM + offs_d[None, :]
    gl.store(ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@gluon.jit
def q_row(t, per_head, m_lo, q_head0, N_Q, BLOCK_M: gl.constexpr):
    """Row of step ``t``'s query block in the 2-D ``(B * Hq * N_Q, d)`` view: head ``t // per_head`` of the group,
    block ``m_lo + t % per_head``."""
    return (q_head0 + t // per_head) * N_Q + (m_lo + t % per_head) * BLOCK_M


@gluon.jit
def load_rows(LSE2, DELTA, t, n_iter, per_head, m_lo, q_head0, N_Q, offs, BLOCK_M: gl.constexpr):
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
def mask_pt(pT, keys, start_m, N_Q, N_K, need_mask, col_l: gl.constexpr, BLOCK_M: gl.constexpr,
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
def store_dkdv(dk, dv, DK, DV, kv_row0, key0, N_K, sm_scale, layout: gl.constexpr, ROWS: gl.constexpr,
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
def red_add_v2(ptrs, x):
    """``*ptrs += x`` with sm_90's vector reduction ``red.global.add.v2.f32`` (Triton emits one scalar atomic per
    element); each thread's 2 consecutive elements must be contiguous and 8-byte aligned."""
    addr = ptrs.to(gl.int64, bitcast=True)
    bits = x.to(gl.int32, bitcast=True)
    gl.inline_asm_elementwise(
        "red.relaxed.gpu.global.add.v2.f32 [$2], {$4, $5};\nmov.b32 $0, 0;\nmov.b32 $1, 0;",
        "=r,=r,l,l,r,r", [addr, bits], dtype=gl.int32, is_pure=False, pack=2)

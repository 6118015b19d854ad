"""Paged prefill on Hopper in Gluon: the warp-specialised ping-pong forward whose producer reads the block table.

``paged_prefill_gluon(q, k_cache, v_cache, o, lse, cu_q, seq_lens, block_tables, max_q, causal, scale, group)``
writes what ``reference.triton.serving.paged_prefill`` returns (packed chunk queries after each sequence's cached keys,
bottom-right causal, GQA; FA2 Algorithm 1) on inputs that entry point has already checked; it is selected there
with ``gather="tma"``, the default (``configs.PAGED_PREFILL``), on a Hopper GPU for the inputs ``gluon_paged_ok``
accepts; the Triton kernels stay the path everywhere else.

Why (notes/serving_perf.md, "Paged prefill on Triton page tiles"): the Triton page-tile kernel executes the contiguous
kernel's instructions but stalls on the block-table load that Triton's pipeliner puts next to the copy it feeds
(5.28 vs 4.51 cycles per issued instruction at 16-token pages). Here the table is read by the **producer warp**
only, so the consumer warpgroups never wait on it:

* the pool ``(num_blocks, page, Hkv, d)`` is one 2-D TMA descriptor ``(num_blocks * page, Hkv * d)``; kv head
  ``hk`` is the column ``hk * d`` of a box;
* a key tile of ``BLOCK_N`` keys is ``BLOCK_N / page`` boxes of ``(page, d)`` (one per page, from the table row
  of the request) copied into row slices of one ring stage, all arriving on the stage's one mbarrier, whose
  expected bytes are the whole tile's; a page of ``>= BLOCK_N`` keys gives one box of ``(BLOCK_N, d)``;
* pages past the sequence's last key are read at a row past the pool's end: the copy engine writes zeros
  (never the table's -1 padding); a -1 inside a sequence (only possible with ``validate=False``) reads page 0.

The consumers are the contiguous kernel's: ``flash_gluon.attend_overlapped`` (FA3 Algorithm 2, one warpgroup's
64 query rows, ping-pong turns between the two consumer warpgroups) over the ring the producer fills, with the
request's own ``n_q`` (chunk length) and ``n_k`` (keys, cached + chunk): key ``j`` is visible to chunk row ``i``
iff ``j <= i + n_k - n_q``. Work items (persistent CTAs, ``flash_gluon._work_item``'s order): head-major over
(request, query head), each causal item a heavy/light pair of 128-row query tiles of one chunk; every request
gets ``cdiv(max_q, 128)`` tiles and the ones past its chunk are skipped.

Q is one 2-D descriptor ``(total_q, Hq * d)`` (head ``h`` at column ``h * d``): a query tile that runs past its
chunk reads the next chunk's rows (or the copy engine's zeros past the end), which are never stored.

Contract on the cache: the slots past ``seq_lens[b]`` inside a sequence's last page are copied with the page and
their scores are masked, but their V rows enter ``P V`` with weight 0, so they must hold finite values (a NaN
there gives NaN output: ``0 * NaN``). A zero-initialised cache, or one that only ever held K/V, satisfies it.
The Triton kernels mask those loads instead. ``serving.paged_prefill`` checks the contract when it validates
(``serving.tail_values_finite``: one gather of a page per sequence) and runs the Triton kernel where it fails.
"""
from __future__ import annotations

import re

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from ._aot import compile_gluon, descriptor_signature, resource_usage, sass_text
from .common import LOG2E_F, item_tile, pingpong_buffers, tile_descriptor
from .flash_gluon import (PINGPONG_MAXNREG, attend_overlapped, check_gluon_config, key_range, persistent_grid,
                          ws_constexprs)

__all__ = ["paged_prefill_gluon", "gluon_paged_ok", "compile_paged_prefill", "aot_summary", "key_loops", "box_rows"]

#: the smallest page a box may be: one 128-byte swizzle atom is 8 rows, and a box must start on one
MIN_PAGE = 8


def box_rows(page: int, block_n: int) -> int | None:
    """Rows of one TMA box for ``page``-token pages and ``block_n``-key tiles: the page when it divides the tile
    (``block_n / page`` boxes per tile), the tile when the page holds whole tiles (one box), None otherwise (a
    page that is not a power of two, or smaller than a swizzle atom: the Triton kernel serves it)."""
    if page >= MIN_PAGE and block_n % page == 0:
        return page
    if page % block_n == 0:
        return block_n
    return None


def gluon_paged_ok(q, k_cache, config=None) -> str | None:
    """None if ``paged_prefill_gluon`` can run these (already checked) inputs, else why not: a Hopper GPU
    (compute capability 9.0), bf16/fp16, ``d`` in {64, 128}, a page that gives whole boxes (``box_rows``)."""
    config = check_gluon_config(config)
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device) == (9, 0)):
        return "needs a Hopper GPU (compute capability 9.0)"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"needs bfloat16 or float16, got {q.dtype}"
    if q.shape[-1] not in (64, 128):
        return f"needs head dimension 64 or 128, got {q.shape[-1]}"
    if box_rows(k_cache.shape[1], config.block_n) is None:
        return (f"needs a page size that divides or is a multiple of the {config.block_n}-key tile and is "
                f">= {MIN_PAGE}, got {k_cache.shape[1]}")
    return None


# --------------------------------------------------------------------------------------------------------------
# @gluon.jit pieces
# --------------------------------------------------------------------------------------------------------------
@gluon.jit
def _paged_item(item, sub, n_m, H_Q, CU_Q, SEQ_LENS, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """Query tile ``sub`` of work item ``item`` -> ``(valid, b, h, start_m, q_start, n_q, n_k)``.

    ``common.item_tile``'s order with a uniform ``n_m = cdiv(max_q, BLOCK_M)`` tiles per (request, head):
    head-major, a causal item pairs tile ``n_m - 1 - i`` with tile ``i``. A tile past its request's chunk
    (``start_m >= n_q``) is not valid."""
    bh, pid_m, paired = item_tile(item, sub, n_m, CAUSAL)
    b = bh // H_Q
    h = bh % H_Q
    q_start = gl.load(CU_Q + b)
    n_q = gl.load(CU_Q + b + 1) - q_start
    n_k = gl.load(SEQ_LENS + b)
    start_m = pid_m * BLOCK_M
    valid = paired & (start_m < n_q)
    return valid, b, h, start_m, q_start, n_q, n_k


@gluon.jit
def _load_q(desc_q, q_smem, q_bars, count, row0, col, HALF: gl.constexpr):
    """Both ``HALF``-row query halves (rows ``row0 ..`` of the ``(total_q, Hq * d)`` view, column ``col``) into Q
    buffer ``count % 2`` (``common.load_q_halves`` with a column), each once its consumer freed it."""
    for w in gl.static_range(2):
        q_slot = 2 * (count % 2) + w
        mbarrier.wait(q_bars.index(4 + q_slot), ((count // 2) & 1) ^ 1)  # fresh: phase 1 complete
        mbarrier.expect(q_bars.index(q_slot), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [row0 + w * HALF, col], q_bars.index(q_slot), q_smem.index(q_slot))


@gluon.jit
def _tile_rows(bt_row, t, n_k, kv_rows, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, BOX: gl.constexpr):
    """Pool rows (of the ``(num_blocks * PAGE, Hkv * d)`` view) where the ``BLOCK_N / BOX`` boxes of key tile
    ``t`` start, as a vector over the boxes: ``table[page] * PAGE + offset in page``; a box past ``n_k`` starts at
    ``kv_rows`` (past the pool: the copy engine writes zeros). One vector load of the table row per tile."""
    BOXES: gl.constexpr = BLOCK_N // BOX
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    key0 = t * BLOCK_N + gl.arange(0, BOXES, layout=layout) * BOX
    inside = key0 < n_k
    phys = gl.load(bt_row + key0 // PAGE, mask=inside, other=0)
    rows = gl.maximum(phys, 0) * PAGE + key0 % PAGE  # a -1 inside a sequence (validate=False): page 0
    return gl.where(inside, rows, kv_rows), gl.arange(0, BOXES, layout=layout)


@gluon.jit
def _copy_tile(desc, smem, bar, rows, idx, col, BLOCK_N: gl.constexpr, BOX: gl.constexpr):
    """Box ``p`` of ``rows`` into rows ``p * BOX ..`` of the stage ``smem``, all arriving on ``bar``, which expects
    the whole tile's bytes."""
    BOXES: gl.constexpr = BLOCK_N // BOX
    mbarrier.expect(bar, desc.block_type.nbytes * BOXES)
    for p in gl.static_range(BOXES):
        row = gl.max(gl.where(idx == p, rows, -1), axis=0)
        tma.async_copy_global_to_shared(desc, [row, col], bar, smem.slice(p * BOX, BOX))


@gluon.jit
def produce_paged_kv(desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, bt_row, n_k, kv_rows, col, hi, it,
                     PAGE: gl.constexpr, BLOCK_N: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr):
    """The producer's key loop (``flash_gluon.produce_kv`` through the block table): ``K_t, V_t`` for ``t < hi``
    into ring slot ``it % STAGES`` once both consumers freed it, page by page; the table row of tile ``t`` is
    read before waiting for the slot, so its latency hides under that wait. Returns the new ``it``."""
    for t in range(hi):
        rows, idx = _tile_rows(bt_row, t, n_k, kv_rows, PAGE, BLOCK_N, BOX)
        slot = it % STAGES
        free_phase = ((it // STAGES) & 1) ^ 1  # a fresh barrier counts as phase 1 complete: the first pass is free
        mbarrier.wait(k_bars.index(STAGES + slot), free_phase)
        _copy_tile(desc_k, k_smem.index(slot), k_bars.index(slot), rows, idx, col, BLOCK_N, BOX)
        mbarrier.wait(v_bars.index(STAGES + slot), free_phase)
        _copy_tile(desc_v, v_smem.index(slot), v_bars.index(slot), rows, idx, col, BLOCK_N, BOX)
        it += 1
    return it


@gluon.jit
def _store_rows(acc, m_i, l_i, O, LSE, q_start, start_m, n_q, h, H_Q, TOTAL_Q, o_layout: gl.constexpr,
                ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """FA2 Algorithm 1, lines 12-15 (``common.store_output`` in the packed layouts): ``O_i = acc / l_i`` into rows
    ``q_start + start_m ..`` (those ``< n_q``) of ``o (total_q, Hq, d)`` at head ``h``; ``L_i = (m_i + log2 l_i)
    ln 2`` into ``lse (Hq, total_q)``; 0 and -inf for a row that saw no key."""
    row_l: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_i = gl.convert_layout(m_i, row_l)
    l_i = gl.convert_layout(l_i, row_l)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    offs_m = start_m + gl.arange(0, ROWS, layout=row_l)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    row_ok = offs_m < n_q
    rows = (q_start + offs_m).to(gl.int64)
    gl.store(LSE + h.to(gl.int64) * TOTAL_Q + rows, lse, mask=row_ok)
    ptrs = O + (rows * H_Q + h)[:, None] * HEAD_DIM + offs_d[None, :]
    gl.store(ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@gluon.jit
def _paged_consumer(q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, CU_Q, SEQ_LENS, n_items,
                    n_m, H_Q, TOTAL_Q, qk_scale, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Consumer ``WG`` (``flash_gluon._ws_consumer_persistent`` with per-request lengths): its 64 rows of each
    query tile this CTA owns, ``attend_overlapped`` over the ring, then the packed-layout epilogue."""
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
        for sub in range(SUBS):
            valid, b, h, start_m, q_start, n_q, n_k = _paged_item(item, sub, n_m, H_Q, CU_Q, SEQ_LENS, BLOCK_M,
                                                                  CAUSAL)
            if valid:
                full_end, hi = key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
                my_start = start_m + WG * HALF
                q_slot = 2 * (count % 2) + WG
                mbarrier.wait(q_bars.index(q_slot), (count // 2) & 1)
                acc, m_i, l_i = attend_overlapped(q_smem.index(q_slot), k_smem, v_smem, k_bars, v_bars, k_bars,
                                                   v_bars, 0, full_end, hi, my_start, n_q, n_k, qk_scale,
                                                   turn_bars, WG, it, rnd, s_layout, o_layout, HALF, BLOCK_N,
                                                   HEAD_DIM, STAGES, CAUSAL, LOADS=False, SYNC=False,
                                                   PINGPONG=True)
                mbarrier.arrive(q_bars.index(4 + q_slot))
                # the request's numbers again (cached loads) rather than held through the key loop: at d = 128
                # the consumers are at their register budget, and holding them spills
                _, b, h, _, q_start, n_q, _ = _paged_item(item, sub, n_m, H_Q, CU_Q, SEQ_LENS, BLOCK_M, CAUSAL)
                _store_rows(acc, m_i, l_i, O, LSE, q_start, my_start, n_q, h, H_Q, TOTAL_Q, o_layout, HALF,
                            HEAD_DIM)
                it += hi
                rnd += gl.where(hi > 0, hi + 1, 0)
                count += 1


@gluon.jit
def _paged_producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, CU_Q, SEQ_LENS, BT,
                    stride_bt, n_items, n_m, H_Q, GROUP, KV_ROWS, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PAGE: gl.constexpr, BOX: gl.constexpr,
                    CAUSAL: gl.constexpr):
    """The producer warp: per query tile, both Q halves (head ``h``'s columns), then the tile's key blocks page
    by page through the request's table row (``produce_paged_kv``), running ahead into the next tile."""
    HALF: gl.constexpr = BLOCK_M // 2
    SUBS: gl.constexpr = 2 if CAUSAL else 1
    it = 0
    count = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        for sub in range(SUBS):
            valid, b, h, start_m, q_start, n_q, n_k = _paged_item(item, sub, n_m, H_Q, CU_Q, SEQ_LENS, BLOCK_M,
                                                                  CAUSAL)
            if valid:
                full_end, hi = key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
                _load_q(desc_q, q_smem, q_bars, count, q_start + start_m, h * HEAD_DIM, HALF)
                bt_row = BT + b.to(gl.int64) * stride_bt
                it = produce_paged_kv(desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, bt_row, n_k, KV_ROWS,
                                      (h // GROUP) * HEAD_DIM, hi, it, PAGE, BLOCK_N, BOX, STAGES)
                count += 1


@gluon.jit
def paged_prefill_ws_kernel(desc_q, desc_k, desc_v, O, LSE, CU_Q, SEQ_LENS, BT, stride_bt, n_m, B, H_Q, GROUP,
                            TOTAL_Q, KV_ROWS, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                            BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PAGE: gl.constexpr, BOX: gl.constexpr,
                            CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                            num_warps: gl.constexpr):
    """Grid = min(work items, SMs), persistent (``flash_gluon.fwd_ws_persistent_kernel``'s partitions and rings;
    the producer reads the block table)."""
    if CAUSAL:
        n_items = B * H_Q * ((n_m + 1) // 2)
    else:
        n_items = B * H_Q * n_m
    q_smem, k_smem, v_smem, q_bars, turn_bars, k_bars, v_bars = pingpong_buffers(desc_q, desc_k, desc_v, HEAD_DIM,
                                                                                  BLOCK_M, BLOCK_N, STAGES)
    gl.warp_specialize([
        (_paged_consumer, (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, CU_Q, SEQ_LENS,
                           n_items, n_m, H_Q, TOTAL_Q, qk_scale, 0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        (_paged_consumer, (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, CU_Q, SEQ_LENS,
                           n_items, n_m, H_Q, TOTAL_Q, qk_scale, 1, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        (_paged_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, CU_Q, SEQ_LENS,
                           BT, stride_bt, n_items, n_m, H_Q, GROUP, KV_ROWS, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                           PAGE, BOX, CAUSAL)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def _constexprs(d: int, page: int, config, causal: bool) -> dict:
    """The contiguous kernel's (``flash_gluon.ws_constexprs``, no ping-pong switch: the turns are always on) with
    the page and its TMA box."""
    cx = {k: v for k, v in ws_constexprs(d, config, causal).items() if k != "TURNS"}
    return dict(cx, PAGE=page, BOX=box_rows(page, config.block_n))


def paged_prefill_gluon(q, k_cache, v_cache, o, lse, cu_q, seq_lens, block_tables, max_q: int, causal: bool,
                        scale: float, group: int, config=None) -> None:
    """Write ``o (total_q, Hq, d)`` and ``lse (Hq, total_q)`` of ``serving.paged_prefill`` for inputs it has
    checked (``gluon_paged_ok(q, k_cache)`` is None; q and the caches contiguous; ``cu_q``, ``seq_lens``,
    ``block_tables`` int32 on the device, the table's rows contiguous). ``config``: a ``configs.GluonForwardConfig``,
    default ``configs.GLUON_FORWARD`` (``flash_gluon.check_gluon_config`` says what is legal)."""
    total_q, hq, d = q.shape
    num_blocks, page, hkv, _ = k_cache.shape
    config = check_gluon_config(config, d)
    bm, bn = config.block_m, config.block_n
    box = box_rows(page, bn)
    batch = cu_q.shape[0] - 1
    n_m = triton.cdiv(max_q, bm)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = persistent_grid(batch, hq, max_q, bm, causal, sms)
    desc_q = tile_descriptor(q.view(total_q, hq * d), bm // 2, d)
    desc_k = tile_descriptor(k_cache.view(num_blocks * page, hkv * d), box, d)
    desc_v = tile_descriptor(v_cache.view(num_blocks * page, hkv * d), box, d)
    paged_prefill_ws_kernel[grid](desc_q, desc_k, desc_v, o, lse, cu_q, seq_lens, block_tables,
                                  block_tables.stride(0), n_m, batch, hq, group, total_q, num_blocks * page,
                                  scale * LOG2E_F, **_constexprs(d, page, config, causal), maxnreg=PINGPONG_MAXNREG)


def compile_paged_prefill(head_dim: int = 128, page: int = 16, causal: bool = True, config=None,
                          dtype: str = "bf16"):
    """Compile ``paged_prefill_ws_kernel`` for sm_90a ahead of time (no GPU); ``_aot.resource_usage`` reads it."""
    config = check_gluon_config(config, head_dim)
    bm, bn, warps = config.block_m, config.block_n, config.num_warps
    box = box_rows(page, bn)
    if box is None:
        raise ValueError(f"page {page} gives no whole TMA boxes for {bn}-key tiles (box_rows)")
    sig = {"desc_q": descriptor_signature(bm // 2, head_dim, dtype),
           "desc_k": descriptor_signature(box, head_dim, dtype),
           "desc_v": descriptor_signature(box, head_dim, dtype), "O": f"*{dtype}", "LSE": "*fp32", "CU_Q": "*i32",
           "SEQ_LENS": "*i32", "BT": "*i32", "stride_bt": "i32", "n_m": "i32", "B": "i32", "H_Q": "i32",
           "GROUP": "i32", "TOTAL_Q": "i32", "KV_ROWS": "i32", "qk_scale": "fp32"}
    return compile_gluon(paged_prefill_ws_kernel, sig, _constexprs(head_dim, page, config, causal), warps,
                         maxnreg=PINGPONG_MAXNREG)


def key_loops(compiled) -> list[dict]:
    """The innermost loops of the SASS that issue wgmma (consumer key loops) or TMA copies (the producer's key
    loop): conditional backward branches, each ``{"start", "end", "HGMMA", "UTMALDG", "LDL", "STL"}`` (byte
    addresses and opcode counts inside). ``LDL``/``STL`` there are register spills on the hot path; the ones a
    d = 128 compile has elsewhere (kernel entry, once per work item) are not."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass_text(compiled))
    ins = [(int(a, 16), bool(pred), op, rest) for a, pred, op, rest in lines]
    loops = []
    for addr, pred, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" and pred else None
        if target and int(target.group(1), 16) < addr:
            loops.append((int(target.group(1), 16), addr))

    def count(lo, hi, prefix):
        return sum(1 for a, _, o, _ in ins if lo <= a <= hi and (o == prefix or o.startswith(prefix + ".")))
    hot = [(lo, hi) for lo, hi in loops if count(lo, hi, "HGMMA") or count(lo, hi, "UTMALDG")]
    inner = [(lo, hi) for lo, hi in hot if not any((a, b) != (lo, hi) and lo <= a and b <= hi for a, b in hot)]
    return [dict(start=lo, end=hi, **{op: count(lo, hi, op) for op in ("HGMMA", "UTMALDG", "LDL", "STL")})
            for lo, hi in inner]


def aot_summary(head_dim: int = 128, page: int = 16, causal: bool = True) -> dict:
    """Resource usage of the sm_90a compile (``_aot.resource_usage``) and its key loops (``key_loops``)."""
    compiled = compile_paged_prefill(head_dim, page, causal)
    return dict(d=head_dim, page=page, causal=causal, **resource_usage(compiled), key_loops=key_loops(compiled))


if __name__ == "__main__":  # TRITON_INTERPRET=0 python -m reference.triton.hopper.paged_prefill_gluon PAGE D [causal]
    import json
    import sys

    args = sys.argv[1:]
    print(json.dumps(aot_summary(int(args[1]) if len(args) > 1 else 128, int(args[0]) if args else 16,
                                 len(args) < 3 or args[2] == "causal")))

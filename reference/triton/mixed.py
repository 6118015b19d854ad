"""One launch for a mixed serving step: prefill chunks and decode rows of different requests over a paged cache.

The definition and the work plan are ``reference.numpy.mixed`` (``mixed_attention``, ``mixed_plan``): request
``b``'s ``n_q`` new queries are the last ``n_q`` of its ``seq_len`` cached positions (bottom-right causal; a
decode row has ``n_q = 1``). The host cuts the batch into work items (FlashInfer's plan / run split, vLLM V1's
unified batch); the kernel runs one program per (work item, kv head):

* **GQA-packed tiles.** A tile's rows are ``tokens x G`` (row ``r``: token ``r // G``, query head
  ``h * G + r % G``), so each key block is loaded once per kv head, for a decode row and a prefill chunk alike.
  The kernel holds two tile shapes, ``SMALL_M`` rows for decode rows and short chunks and ``LARGE_M`` rows for
  prefill chunks, and picks one per item at run time (two branches of one kernel, one launch).
* **Page-aligned key tiles.** Key blocks start at multiples of ``BLOCK_N``. With ``page % BLOCK_N == 0`` a key
  block lies in one page: one block-table entry, then ``BLOCK_N`` consecutive rows of that page (the same
  address pattern as a contiguous cache; on Hopper optionally one TMA box per block, ``use_tma``). Shorter
  pages that divide the block: one table entry per page, the block loaded as a ``(pages, page, d)`` tile
  (``whole_pages``); other page sizes: one table entry per key (a row gather). The next block's table entries
  are loaded while the current block is computed (``table_ahead``).
* **Key splits merged in the same launch.** A tile with more than ``split_keys`` visible keys is several work
  items (Flash-Decoding). Each writes its partial state ``(o_s, lse_s)``; the program that draws the last
  ticket of its tile's atomic counter merges them (lse rule, as ``merge_states``) and writes the output, so
  there is no second kernel (as ``reference.triton.decode``'s fused merge).

FA2 Algorithm 1 inside each item (lines 6-10: online softmax over key blocks, base 2, ``qk_scale`` carrying
``log2 e``); key blocks every row fully sees run without mask arithmetic, the diagonal and tail with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from . import _checks, _fastlaunch
from ._checks import check_block_tables, check_cu_seqlens, check_paged_cache
from ._device import INTERPRET, tma_device
from ._kernel_helpers import LN2, LOG2E, lse_merge_finish, lse_merge_step
from .paged_keys import key_loop
from .configs import MIXED_DEFAULT, MixedConfig
from ..numpy.mixed import ITEM_COLUMNS, check_mixed_lengths, mixed_plan

__all__ = ["mixed_attention", "make_mixed_plan", "MixedConfig", "MixedDevicePlan"]


# --------------------------------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _tile(Q, K, V, O, LSE, BT, OPart, LPart, Counters, desc_k, desc_v,
          b, t0, n_tok, k_lo, k_hi, n_splits, slot0, split, hk, n_kv_heads, q0, n_q, n_keys,
          stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
          stride_ot, stride_oh, stride_lh, stride_tb, qk_scale,
          GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PART_M: tl.constexpr,
          BLOCK_N: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
          INTERP: tl.constexpr, AHEAD: tl.constexpr, WHOLE_PAGES: tl.constexpr):
    """One work item with a ``BLOCK_M``-row tile: attend, then write the output or a partial state (merging
    the tile's partials if this program finishes it)."""
    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    tok = offs_r // GROUP
    heads = hk * GROUP + offs_r % GROUP
    row_ok = tok < n_tok
    q_rows = (q0 + t0 + tok).to(tl.int64)
    q = tl.load(Q + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    qpos = t0 + tok
    offset = n_keys - n_q  # bottom-right causal: query i sees keys j <= i + offset
    bt = BT + b.to(tl.int64) * stride_tb
    k_base = K + hk.to(tl.int64) * stride_kh
    v_base = V + hk.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_hi = tl.minimum(k_hi, n_keys)  # memory safety if the plan and seq_lens disagree (validate=False)
    if CAUSAL:
        full = tl.minimum((offset + t0 + 1) // BLOCK_N * BLOCK_N, n_keys // BLOCK_N * BLOCK_N)
    else:
        full = n_keys // BLOCK_N * BLOCK_N
    mid = tl.maximum(tl.minimum(full, k_hi), k_lo)
    acc, l_i, m_i = key_loop(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, bt, hk, k_lo, mid, n_keys, qpos,
                              offset, stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                              BLOCK_N, HEAD_DIM, PAGE, CAUSAL, False, USE_TMA, INTERP, AHEAD, WHOLE_PAGES)
    acc, l_i, m_i = key_loop(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, bt, hk, mid, k_hi, n_keys, qpos,
                              offset, stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
                              BLOCK_N, HEAD_DIM, PAGE, CAUSAL, True, USE_TMA, INTERP, AHEAD, WHOLE_PAGES)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse2 = tl.where(l_i > 0, m_i + tl.math.log2(l_safe), float("-inf"))  # base 2; -inf: no key seen
    o_ptrs = O + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    l_ptrs = LSE + heads.to(tl.int64) * stride_lh + q_rows
    if n_splits == 1:
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])
        tl.store(l_ptrs, lse2 * LN2, mask=row_ok)
    else:
        part = ((slot0 + split) * n_kv_heads + hk).to(tl.int64) * PART_M + offs_r
        tl.store(OPart + part[:, None] * HEAD_DIM + offs_d[None, :], o)
        tl.store(LPart + part, lse2)
        # every thread's partial stores precede the ticket; acq_rel publishes them to the last program
        tl.debug_barrier()
        counter = Counters + slot0 * n_kv_heads + hk
        ticket = tl.atomic_add(counter, 1, sem="acq_rel")
        if ticket == n_splits - 1:
            tl.debug_barrier()
            m = tl.full([BLOCK_M], float("-inf"), tl.float32)
            den = tl.zeros([BLOCK_M], tl.float32)
            num = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
            for s in range(0, n_splits):  # lse rule: o = sum_s exp2(lse_s - lse) o_s
                ps = ((slot0 + s) * n_kv_heads + hk).to(tl.int64) * PART_M + offs_r
                ls = tl.load(LPart + ps, cache_modifier=".cg")
                os_ = tl.load(OPart + ps[:, None] * HEAD_DIM + offs_d[None, :], cache_modifier=".cg")
                m, den, num = lse_merge_step(m, den, num, ls, os_)
            out, lse_out = lse_merge_finish(m, den, num)
            tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])
            tl.store(l_ptrs, lse_out, mask=row_ok)
            tl.atomic_xchg(counter, 0)  # zero again for the next launch


@triton.jit
def _mixed_kernel(Q, K, V, O, LSE, CU, SeqLens, BT, Items, OPart, LPart, Counters, desc_k, desc_v,
                  stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                  stride_ot, stride_oh, stride_lh, stride_tb, n_kv_heads, qk_scale,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SMALL_M: tl.constexpr, LARGE_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
                  INTERP: tl.constexpr, N_COLS: tl.constexpr, AHEAD: tl.constexpr, WHOLE_PAGES: tl.constexpr):
    """Program (item, kv head): read the item's row of the plan (``ITEM_COLUMNS``) and run it with the small
    or the large tile."""
    item = Items + tl.program_id(0).to(tl.int64) * N_COLS
    hk = tl.program_id(1)
    b = tl.load(item)
    t0 = tl.load(item + 1)
    n_tok = tl.load(item + 2)
    k_lo = tl.load(item + 3)
    k_hi = tl.load(item + 4)
    large = tl.load(item + 5)
    n_splits = tl.load(item + 6)
    slot0 = tl.load(item + 7)
    split = tl.load(item + 8)
    q0 = tl.load(CU + b)
    n_q = tl.load(CU + b + 1) - q0
    n_keys = tl.load(SeqLens + b).to(tl.int32)
    if large != 0:
        _tile(Q, K, V, O, LSE, BT, OPart, LPart, Counters, desc_k, desc_v,
              b, t0, n_tok, k_lo, k_hi, n_splits, slot0, split, hk, n_kv_heads, q0, n_q, n_keys,
              stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
              stride_ot, stride_oh, stride_lh, stride_tb, qk_scale,
              GROUP, HEAD_DIM, LARGE_M, LARGE_M, BLOCK_N, PAGE, CAUSAL, USE_TMA, INTERP, AHEAD,
              WHOLE_PAGES and LARGE_M >= 64)
    else:
        _tile(Q, K, V, O, LSE, BT, OPart, LPart, Counters, desc_k, desc_v,
              b, t0, n_tok, k_lo, k_hi, n_splits, slot0, split, hk, n_kv_heads, q0, n_q, n_keys,
              stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
              stride_ot, stride_oh, stride_lh, stride_tb, qk_scale,
              GROUP, HEAD_DIM, SMALL_M, LARGE_M, BLOCK_N, PAGE, CAUSAL, USE_TMA, INTERP, AHEAD,
              WHOLE_PAGES and SMALL_M >= 64)  # small tiles (mma.sync, not wgmma): no async copy of 3-D tiles


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MixedDevicePlan:
    """A ``reference.numpy.mixed.MixedPlan`` with its items on the device, for the config it was made for."""
    plan: object
    items: torch.Tensor
    config: MixedConfig
    page: int


def _align(config: MixedConfig, page: int) -> int:
    return max(config.block_n, page) if (page % config.block_n == 0 or config.block_n % page == 0) else config.block_n


def make_mixed_plan(q_lens, seq_lens, n_q_heads: int, n_kv_heads: int, page_size: int, *, causal=True,
                    config: MixedConfig | None = None, device=None) -> MixedDevicePlan:
    """The work plan of a mixed batch from HOST lengths (lists or arrays; no device sync), ready for
    ``mixed_attention(..., plan=...)``; an engine makes it once per step, a CUDA graph keeps it fixed."""
    config = MIXED_DEFAULT if config is None else config
    group = _checks.check_gqa(n_q_heads, n_kv_heads)
    page_size = _checks.check_positive_int(page_size, "page_size")
    align = _align(config, page_size)
    split = max(align, config.split_keys // align * align)
    plan = mixed_plan(q_lens, seq_lens, group, config.small_rows, config.large_rows, split, align, causal)
    from ._device import DEVICE
    items = torch.from_numpy(np.ascontiguousarray(plan.items)).to(device or DEVICE)
    return MixedDevicePlan(plan, items, config, page_size)


#: the in-kernel merge's ticket counters, one int32 per (split slot, kv head)
_COUNTERS = _fastlaunch.TicketCounters(1024)


def _use_tma(config: MixedConfig, page: int, k_cache, v_cache) -> bool:
    if config.use_tma is False or INTERPRET or page % config.block_n:
        return False
    if not tma_device(k_cache.device):
        if config.use_tma:
            raise ValueError("config.use_tma=True needs a Hopper (sm_90+) GPU")
        return False
    es = k_cache.element_size()
    return all(c.is_contiguous() and c.data_ptr() % 16 == 0 and (c.shape[2] * c.shape[3] * es) % 16 == 0
               for c in (k_cache, v_cache))


def _check(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, plan, validate):
    _checks.check_tensor(q, "q", ndim=3)
    num_blocks, block_size, hkv, d = check_paged_cache(q, k_cache, v_cache)
    _checks.check_head_dim(d, "head dimension d (q.shape[-1])")
    validate = _checks.check_flag(validate, "validate")
    cu, _ = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0], None, None, validate)
    batch = cu.shape[0] - 1
    block_tables, seq_lens = check_block_tables(block_tables, seq_lens, batch, num_blocks, block_size, validate)
    if plan is not None:
        if not isinstance(plan, MixedDevicePlan):
            raise TypeError(f"plan must come from make_mixed_plan (a MixedDevicePlan), got {type(plan).__name__}")
        if plan.page != block_size or plan.plan.group != q.shape[1] // hkv:
            raise ValueError(f"plan was made for page_size {plan.page} and G = {plan.plan.group}, but k_cache has "
                             f"block_size {block_size} and q, k_cache give G = {q.shape[1] // hkv}")
        if plan.plan.q_lens.shape[0] != batch:
            raise ValueError(f"plan was made for {plan.plan.q_lens.shape[0]} requests, cu_seqlens_q has {batch}")
        if plan.items.device != q.device:
            raise ValueError(f"plan's items are on {plan.items.device}, q is on {q.device}")
    if validate:  # one sync: the lengths' values
        q_lens = torch.diff(cu.to("cpu", torch.int64)).numpy()
        lens = seq_lens.to("cpu", torch.int64).numpy()
        check_mixed_lengths(q_lens, lens)
        if plan is not None and not (np.array_equal(plan.plan.q_lens, q_lens)
                                     and np.array_equal(plan.plan.seq_lens, lens)):
            raise ValueError("plan was made for other lengths than cu_seqlens_q / seq_lens; make a new one")
    return cu, block_tables, seq_lens, _checks.check_scale(scale, d), block_size, hkv


def mixed_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale=None, *, causal=True,
                    plan=None, config=None, validate=True):
    """Prefill chunks and decode rows of different requests in ONE launch over a paged KV cache; ``(o, lse)``.

    q: ``(total_q, Hq, d)`` packed new queries (request ``b``: rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1``;
    one row for a decode, a chunk for a prefill, none for an idle request); k_cache, v_cache ``(num_blocks,
    block_size, Hkv, d)`` already holding the new tokens' K/V; block_tables ``(B, max_blocks)`` int32 padded
    with -1; seq_lens ``(B,)``, ``seq_lens[b] >= n_q[b]``. Bottom-right causal (``causal=False``: every query
    sees all ``seq_lens[b]`` keys). plan: ``make_mixed_plan(...)`` for these lengths (None: made here from the
    lengths, one device sync). config: a ``MixedConfig`` (None: the default; ignored when ``plan`` is given).
    Returns ``o (total_q, Hq, d)`` in q's dtype and ``lse (Hq, total_q)`` float32, natural log.
    ``validate=False`` skips the value checks that sync (lengths, block indices, plan vs lengths).
    """
    for c in (config, getattr(plan, "config", None)):
        if isinstance(c, MixedConfig) and type(c) is not MixedConfig:  # its extra options would be ignored here
            raise TypeError(f"config must be a MixedConfig, got a {type(c).__name__} (it runs with "
                            "experiments.serving_baselines.mixed_attention_variant)")
    return launch_mixed(*prepare_mixed(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, causal, plan,
                                       config, validate))


class MixedCall(NamedTuple):
    """The checked arguments of one ``mixed_attention`` call and its plan (``prepare_mixed``)."""
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    page: int
    hkv: int
    causal: bool
    plan: MixedDevicePlan


def prepare_mixed(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale=None, causal=True, plan=None,
                  config=None, validate=True) -> MixedCall:
    """``mixed_attention``'s checks (each bad argument named) and its plan (``make_mixed_plan`` where none is given;
    a ``config`` that is not a ``MixedConfig`` is a ``TypeError``)."""
    cu, block_tables, seq_lens, scale, page, hkv = _check(q, k_cache, v_cache, block_tables, cu_seqlens_q,
                                                          seq_lens, scale, plan, validate)
    causal = _checks.check_flag(causal, "causal")
    if plan is None:
        if config is not None and not isinstance(config, MixedConfig):
            raise TypeError(f"config must be a MixedConfig or None, got {type(config).__name__}")
        plan = make_mixed_plan(torch.diff(cu.to("cpu", torch.int64)).numpy(), seq_lens.to("cpu").numpy(),
                               q.shape[1], hkv, page, causal=causal, config=config, device=q.device)
    elif plan.plan.causal != causal:
        raise ValueError(f"plan was made with causal={plan.plan.causal}, the call asks causal={causal}")
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    return MixedCall(q, k_cache, v_cache, block_tables, cu, seq_lens, scale, page, hkv, causal, plan)


def launch_mixed(q, k_cache, v_cache, block_tables, cu, seq_lens, scale, page, hkv, causal, plan, *,
                 table_ahead=True, whole_pages=True):
    """The launch of a prepared call (``MixedCall``'s fields); ``(o, lse)``. ``table_ahead`` / ``whole_pages``: the
    paged key loop's lookups (``paged_keys.key_loop``'s ``AHEAD`` / ``WHOLE_PAGES``); the course launches both, the
    simpler lookups they replaced are ``experiments/serving_baselines.py``'s ``mixed_attention_variant``."""
    cfg = plan.config
    d = q.shape[2]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    n_items = plan.items.shape[0]
    if n_items == 0:
        return o, lse
    slots = max(plan.plan.n_slots, 1)
    o_part = torch.empty((slots, hkv, cfg.large_rows, d), dtype=torch.float32, device=q.device)
    l_part = torch.empty((slots, hkv, cfg.large_rows), dtype=torch.float32, device=q.device)
    counters = _COUNTERS.buffer(q.device, slots * hkv)
    use_tma = _use_tma(cfg, page, k_cache, v_cache)
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        desc_k, desc_v = (TensorDescriptor(c.view(-1, hkv * d), [c.shape[0] * page, hkv * d], [hkv * d, 1],
                                           [cfg.block_n, d]) for c in (k_cache, v_cache))
    else:
        desc_k, desc_v = k_cache, v_cache
    _mixed_kernel[(n_items, hkv)](
        q, k_cache, v_cache, o, lse, cu, seq_lens, block_tables, plan.items, o_part, l_part, counters,
        desc_k, desc_v,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), o.stride(0), o.stride(1), lse.stride(0),
        block_tables.stride(0), hkv, scale * LOG2E.value,
        GROUP=q.shape[1] // hkv, HEAD_DIM=d, SMALL_M=cfg.small_rows, LARGE_M=cfg.large_rows, BLOCK_N=cfg.block_n,
        PAGE=page, CAUSAL=causal, USE_TMA=use_tma, INTERP=INTERPRET, N_COLS=len(ITEM_COLUMNS),
        AHEAD=table_ahead, WHOLE_PAGES=whole_pages,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return o, lse

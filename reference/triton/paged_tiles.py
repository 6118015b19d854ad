"""Paged prefill with page-aligned key tiles: the contiguous varlen forward with one table lookup per page.

``flash_fwd._attn_fwd`` with ``PAGE > 0`` (the first ``paged_prefill``) finds every key row through the block
table: ``BLOCK_N`` table loads per key block, and the K/V loads' addresses depend on a table load of the same
loop iteration. Compiled for sm_90a (``notes/serving_perf.md``, "Paged prefill on Triton page tiles") Triton's software
pipeliner then gives the table load a stage of its own: K and V keep 2 shared-memory buffers instead of 3 and
the kernel needs ~240 registers instead of ~180.

This kernel is the same FA2 forward (Algorithm 1; one program per query block of one (sequence, query head), the
same bottom-right causal split into unmasked and masked key blocks) with two changes in how a key block is found:

* **Per page, not per row.** Key blocks start at multiples of ``BLOCK_N``. With ``PAGE % BLOCK_N == 0`` a block
  lies inside one page: one scalar table entry, then ``BLOCK_N`` consecutive rows, the contiguous kernel's
  address pattern (``base + row * stride + d``). With ``BLOCK_N % PAGE == 0`` (16-token pages, 64-row tiles and
  up) the block is ``BLOCK_N / PAGE`` whole pages: one entry per page, a ``(pages, PAGE, d)`` tile loaded and
  reshaped to ``(BLOCK_N, d)`` (Triton copies it asynchronously into one shared buffer and reshapes the buffer
  for wgmma). Other page sizes keep one entry per row.
* **One block ahead** (``AHEAD``): the table entries of block ``j + 1`` are loaded while block ``j`` is computed
  and carried through the loop, so the K/V addresses of an iteration do not wait on a load of that iteration.

Layouts as ``paged_prefill``: ``q, o (total_q, Hq, d)`` packed chunks, ``k_cache, v_cache (num_blocks, PAGE,
Hkv, d)``, ``lse (Hq, total_q)``; ``CU_Q`` cumulative chunk lengths, ``SEQ_LENS`` keys per sequence, ``BT`` the
block table.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import configs
from ._device import device_limits
from .flash_fwd import FWD_CONFIGS, FWD_FALLBACK, SMALL_Q_CONFIG, fwd_configs_for, small_q_config, tuning_bench
from ._kernel_helpers import LN2, LOG2E, causal_key_range, dot, dot_acc, mask_running_max, pinned_or_tuned
from ._device import INTERPRET

__all__ = ["paged_prefill_kernel", "table_entries", "launch_paged_prefill"]


@triton.jit
def table_entries(bt, start, offs_n, n_keys, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, WHOLE: tl.constexpr):
    """Block-table entries (int64) of keys ``[start, start + BLOCK_N)``, ``start % BLOCK_N == 0``:

    * ``PAGE % BLOCK_N == 0``: the block lies in one page: one scalar entry;
    * ``WHOLE`` and ``BLOCK_N % PAGE == 0``: the block is ``BLOCK_N / PAGE`` whole pages: one entry per page;
    * otherwise (a page size that neither divides nor is divided by the key block, or not ``WHOLE``): one entry
      per key row.

    Entries of pages (rows) at or past ``n_keys`` read as 0, never as the table's -1 padding (and a -1 inside a
    sequence, possible only with ``validate=False``, reads page 0: wrong output, no out-of-bounds read)."""
    if PAGE % BLOCK_N == 0:
        phys = tl.load(bt + start // PAGE, mask=start < n_keys, other=0)
    elif WHOLE and BLOCK_N % PAGE == 0:
        pages = start // PAGE + tl.arange(0, BLOCK_N // PAGE)
        phys = tl.load(bt + pages, mask=pages * PAGE < n_keys, other=0)
    else:
        rows = start + offs_n
        phys = tl.load(bt + rows // PAGE, mask=rows < n_keys, other=0)
    return tl.maximum(phys, 0).to(tl.int64)  # validate=False with a -1 inside a sequence: wrong, never unsafe


@triton.jit
def load_paged_block(base, phys, start, offs_n, offs_d, stride_page, stride_slot, n_keys,
                     PAGE: tl.constexpr, BLOCK_N: tl.constexpr, BOUNDS: tl.constexpr, WHOLE: tl.constexpr):
    """The ``(BLOCK_N, d)`` tile of keys ``[start, start + BLOCK_N)`` given their pages ``phys``
    (``table_entries``); rows ``>= n_keys`` read as zeros when ``BOUNDS``.

    ``WHOLE`` and ``BLOCK_N % PAGE == 0`` loads a ``(BLOCK_N / PAGE, PAGE, d)`` tile, ``PAGE`` consecutive rows
    of each page, and reshapes the loaded tile to ``(BLOCK_N, d)``: Triton then copies each page's rows into slices of one
    shared-memory buffer and hands the reshaped buffer to the MMA (``ttg.memdesc_reshape``), with no per-row
    address arithmetic. (Only for wgmma tiles, ``BLOCK_M >= 64``: with the 16-row tiles' mma.sync the 3-D load
    is not copied asynchronously, so those keep the row gather.)"""
    if PAGE % BLOCK_N == 0:  # BLOCK_N consecutive slots of one page: the contiguous address pattern
        ptrs = base + phys * stride_page + ((start % PAGE) + offs_n)[:, None] * stride_slot + offs_d[None, :]
        if BOUNDS:
            x = tl.load(ptrs, mask=(start + offs_n)[:, None] < n_keys, other=0.0)
        else:
            x = tl.load(ptrs)
    elif WHOLE and BLOCK_N % PAGE == 0:  # whole pages: a (pages, PAGE, d) tile
        slots = tl.arange(0, PAGE)
        ptrs = (base + phys[:, None, None] * stride_page + slots[None, :, None] * stride_slot
                + offs_d[None, None, :])
        if BOUNDS:
            rows = start + tl.arange(0, BLOCK_N // PAGE)[:, None, None] * PAGE + slots[None, :, None]
            x = tl.load(ptrs, mask=rows < n_keys, other=0.0)
        else:
            x = tl.load(ptrs)
        x = tl.reshape(x, (BLOCK_N, offs_d.shape[0]))
    else:  # one table entry per row
        ptrs = (base + (phys * stride_page + ((start + offs_n) % PAGE).to(tl.int64) * stride_slot)[:, None]
                + offs_d[None, :])
        if BOUNDS:
            x = tl.load(ptrs, mask=(start + offs_n)[:, None] < n_keys, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def paged_key_blocks(acc, l_i, m_i, q, k_base, v_base, bt, lo, hi, offs_m, offs_n, offs_d,
                     stride_kp, stride_ks, stride_vp, stride_vs, N_K, OFFSET, qk_scale,
                     BLOCK_N: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                     AHEAD: tl.constexpr, INTERP: tl.constexpr, WHOLE: tl.constexpr):
    """FA2 Algorithm 1, lines 6-10, over key blocks ``[lo, hi)`` of a paged cache (``flash_fwd.attend_key_block``
    with ``load_paged_block`` for K_j and V_j)."""
    phys_next = table_entries(bt, lo, offs_n, N_K, PAGE, BLOCK_N, WHOLE)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        if AHEAD:  # this block's entries were loaded one iteration ago; fetch the next block's now
            phys = phys_next
            phys_next = table_entries(bt, start_n + BLOCK_N, offs_n, N_K, PAGE, BLOCK_N, WHOLE)
        else:
            phys = table_entries(bt, start_n, offs_n, N_K, PAGE, BLOCK_N, WHOLE)
        # line 7-8: K_j, S_ij = Q_i K_j^T in base-2 units
        k = load_paged_block(k_base, phys, start_n, offs_n, offs_d, stride_kp, stride_ks, N_K, PAGE, BLOCK_N, MASKED,
                             WHOLE)
        s = dot(q, tl.trans(k), INTERP) * qk_scale
        # line 9: masks on the diagonal / ragged tail, running max, probabilities
        s, m_new, m_use = mask_running_max(s, m_i, start_n, offs_m, offs_n, N_K, OFFSET, CAUSAL, MASKED)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        # line 10: O_i = diag(alpha) O_i + P_ij V_j
        v = load_paged_block(v_base, phys, start_n, offs_n, offs_d, stride_vp, stride_vs, N_K, PAGE, BLOCK_N, MASKED,
                             WHOLE)
        acc = acc * alpha[:, None]
        acc = dot_acc(p.to(v.dtype), v, acc, INTERP)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def paged_prefill_kernel(Q, K, V, O, LSE, CU_Q, SEQ_LENS, BT,
                         stride_qm, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                         stride_om, stride_oh, stride_lh, stride_tb,
                         H_Q, GROUP, N_Q, N_K, qk_scale,
                         HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr, AHEAD: tl.constexpr,
                         INTERP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program = query block ``pid_m`` of one (sequence b, query head h): FA2 Algorithm 1, lines 4-15.

    ``N_Q``/``N_K`` are the autotuning bucket only; the sequence's own lengths come from ``CU_Q`` and
    ``SEQ_LENS``. Query blocks past a chunk's end load no key block and store nothing.
    """
    pid_m = tl.program_id(0)
    if CAUSAL:  # the heaviest query blocks first (shorter tail), as flash_fwd._attn_fwd
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    hk = h // GROUP
    q_start = tl.load(CU_Q + b).to(tl.int64)
    n_q = (tl.load(CU_Q + b + 1) - tl.load(CU_Q + b)).to(tl.int32)
    n_k = tl.load(SEQ_LENS + b).to(tl.int32)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q
    q_ptrs = Q + (q_start + offs_m)[:, None] * stride_qm + h.to(tl.int64) * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)  # line 4
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # line 5
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bt = BT + b.to(tl.int64) * stride_tb
    k_base = K + hk.to(tl.int64) * stride_kh
    v_base = V + hk.to(tl.int64) * stride_vh
    offset = n_k - n_q  # bottom-right causal alignment
    full_end, hi = causal_key_range(start_m, n_k, offset, BLOCK_M, BLOCK_N, CAUSAL)
    full_end = tl.where(start_m < n_q, full_end, 0)  # a query block past this chunk's end: no key blocks
    hi = tl.where(start_m < n_q, hi, 0)
    acc, l_i, m_i = paged_key_blocks(acc, l_i, m_i, q, k_base, v_base, bt, 0, full_end, offs_m, offs_n, offs_d,
                                     stride_kp, stride_ks, stride_vp, stride_vs, n_k, offset, qk_scale,
                                     BLOCK_N, PAGE, CAUSAL, False, AHEAD, INTERP, BLOCK_M >= 64)
    acc, l_i, m_i = paged_key_blocks(acc, l_i, m_i, q, k_base, v_base, bt, full_end, hi, offs_m, offs_n, offs_d,
                                     stride_kp, stride_ks, stride_vp, stride_vs, n_k, offset, qk_scale,
                                     BLOCK_N, PAGE, CAUSAL, True, AHEAD, INTERP, BLOCK_M >= 64)
    # lines 12-15; a row with no visible key gives o = 0, lse = -inf
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    tl.store(LSE + h.to(tl.int64) * stride_lh + q_start + offs_m, lse, mask=row_ok)
    o_ptrs = O + (q_start + offs_m)[:, None] * stride_om + h.to(tl.int64) * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])


# --------------------------------------------------------------------------------------------------------------
# configs and launch
# --------------------------------------------------------------------------------------------------------------
def _configs():
    """The contiguous forward's autotuning list (``flash_fwd.FWD_CONFIGS`` + fallbacks), so both kernels choose
    among the same tiles (notes/serving_perf.md, "Paged prefill on Triton page tiles", call 2: the 128x128 tile, though it spills 24-48 B
    here, was the fastest pin on 16-token pages)."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bm, bn, w, st in FWD_CONFIGS + FWD_FALLBACK]


def _prune(configs_, named_args, **kwargs):
    """``flash_fwd.fwd_configs_for`` on the tensors' GPU, as the contiguous forward prunes."""
    d = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    q = named_args["Q"]
    want = fwd_configs_for(d, q.element_size(), named_args["N_Q"], named_args["N_K"], device_limits(q.device))
    keep = [c for c in configs_ if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) in want]
    return keep or configs_[-1:]


paged_prefill_tuned = triton.autotune(
    configs=_configs(), key=["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "GROUP", "PAGE", "AHEAD"],
    prune_configs_by={"early_config_prune": _prune}, do_bench=tuning_bench)(paged_prefill_kernel)


def launch_paged_prefill(q, k_cache, v_cache, o, lse, cu_q, seq_lens, block_tables, max_q: int, causal: bool,
                         scale: float, group: int, *, config: dict | None = None, ahead: bool = True) -> None:
    """Launch ``paged_prefill_kernel`` on validated inputs (``q, o (total_q, Hq, d)``, caches ``(num_blocks,
    page, Hkv, d)`` with unit last stride, ``lse (Hq, total_q)``), writing ``o`` and ``lse``. ``config``: one
    forward pin (None: ``configs.forward_pin()``; 16-row tiles when ``max_q <= 16``, as ``flash_fwd``);
    ``ahead``: load block ``j + 1``'s table entries during block ``j`` (False: in the same iteration)."""
    d, page = q.shape[-1], k_cache.shape[1]
    batch, hq = cu_q.shape[0] - 1, q.shape[1]
    n_k = block_tables.shape[1] * page
    pin = configs.forward_pin() if config is None else configs.check_pin(config, "config")
    if max_q <= SMALL_Q_CONFIG["BLOCK_M"]:
        pin = small_q_config(d, q.element_size(), device_limits(q.device))
    kernel = pinned_or_tuned(paged_prefill_kernel, paged_prefill_tuned, pin)
    kernel[lambda meta: (triton.cdiv(max_q, meta["BLOCK_M"]), batch * hq)](
        q, k_cache, v_cache, o, lse, cu_q, seq_lens, block_tables,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), o.stride(0), o.stride(1), lse.stride(0),
        block_tables.stride(0), hq, group, triton.next_power_of_2(max_q), triton.next_power_of_2(n_k),
        scale * LOG2E.value, HEAD_DIM=d, PAGE=page, CAUSAL=causal, AHEAD=ahead, INTERP=INTERPRET)

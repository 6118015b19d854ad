"""The key loop over a paged KV cache that two serving kernels run: ``mixed._mixed_kernel`` (the engines' step)
and ``cascade._cascade_kernel`` (each request's suffix after the shared prefix).

FA2 Algorithm 1, lines 6-10, over page-aligned key blocks: ``_pages`` reads a block's block-table entries (one per
block when the block lies in one page, one per page for whole pages, else one per key), ``_load_kv`` its K or V
tile (consecutive rows, a ``(pages, page, d)`` tile, a row gather, or on Hopper one TMA box), ``key_loop`` the online
softmax over ``[lo, hi)`` with the next block's table entries loaded ahead (``AHEAD``). Its own module, so neither
kernel module imports the other for it (``mixed``'s docstring has the page layouts).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._kernel_helpers import dot, dot_acc, mask_running_max


@triton.jit
def _pages(bt, n0, n_end, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, WHOLE_PAGES: tl.constexpr = False):
    """Block-table entries (int64) of keys ``n0 .. n0 + BLOCK_N - 1`` (``n0 % BLOCK_N == 0``): one scalar when
    the block lies in one page (``PAGE % BLOCK_N == 0``), one per page when the block is whole pages
    (``WHOLE_PAGES`` and ``BLOCK_N % PAGE == 0``), else one per key (a row gather). Keys ``>= n_end`` and -1 entries read as
    page 0; ``PAGE == 0`` (not paged): a dummy 0."""
    if PAGE == 0:
        phys = (n0 * 0).to(tl.int64)
    elif PAGE % BLOCK_N == 0:
        phys = tl.maximum(tl.load(bt + n0 // PAGE, mask=n0 < n_end, other=0), 0).to(tl.int64)
    elif WHOLE_PAGES and BLOCK_N % PAGE == 0:  # whole pages: one entry per page
        pages = n0 // PAGE + tl.arange(0, BLOCK_N // PAGE)
        phys = tl.maximum(tl.load(bt + pages, mask=pages * PAGE < n_end, other=0), 0).to(tl.int64)
    else:
        keys = n0 + tl.arange(0, BLOCK_N)
        phys = tl.maximum(tl.load(bt + keys // PAGE, mask=keys < n_end, other=0), 0).to(tl.int64)
    return phys


@triton.jit
def _key_rows(phys, n0, n_end, stride_p, stride_s, BLOCK_N: tl.constexpr, PAGE: tl.constexpr):
    """Offsets of keys ``n0 .. n0 + BLOCK_N - 1`` in a paged cache, given their pages ``phys`` (``_pages``).

    ``PAGE == 0``: not paged, row ``n`` at ``n * stride_s``. Returns ``(rows, ok)``: the element offset of each
    key's row (kv head and d not added) and whether it is below ``n_end``."""
    offs = tl.arange(0, BLOCK_N)
    ok = n0 + offs < n_end
    if PAGE == 0:  # a contiguous (N, Hkv, d) tensor
        rows = (n0 + offs).to(tl.int64) * stride_s
    elif PAGE % BLOCK_N == 0:  # the block lies in one page: one table entry, consecutive rows
        rows = phys * stride_p + ((n0 % PAGE) + offs).to(tl.int64) * stride_s
    else:  # one table entry per key
        rows = phys * stride_p + ((n0 + offs) % PAGE).to(tl.int64) * stride_s
    return rows, ok


@triton.jit
def _load_kv(base, desc, phys, n0, n_end, hk, stride_p, stride_s, offs_d,
             BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, MASKED: tl.constexpr,
             USE_TMA: tl.constexpr, WHOLE_PAGES: tl.constexpr = False):
    """One ``(BLOCK_N, HEAD_DIM)`` key or value block of kv head ``hk`` (zeros past ``n_end`` when MASKED),
    its pages ``phys`` looked up by ``_pages``."""
    if USE_TMA:  # PAGE % BLOCK_N == 0: one box of the (num_blocks * PAGE, Hkv * d) view
        x = desc.load([(phys * PAGE + n0 % PAGE).to(tl.int32), hk * HEAD_DIM])
    elif WHOLE_PAGES and PAGE > 0 and PAGE < BLOCK_N and BLOCK_N % PAGE == 0:
        # whole pages: a (pages, PAGE, d) tile reshaped to (BLOCK_N, d) after the load; Triton copies each
        # page's rows into a slice of one shared buffer and gives the MMA the reshaped buffer (the first
        # version reshaped the row offsets instead and measured 2.4x slower on an H100: no async copy)
        slots = tl.arange(0, PAGE)
        ptrs = (base + phys[:, None, None] * stride_p + slots[None, :, None].to(tl.int64) * stride_s
                + offs_d[None, None, :])
        if MASKED:
            keys = n0 + tl.arange(0, BLOCK_N // PAGE)[:, None, None] * PAGE + slots[None, :, None]
            x = tl.load(ptrs, mask=keys < n_end, other=0.0)
        else:
            x = tl.load(ptrs)
        x = tl.reshape(x, (BLOCK_N, HEAD_DIM))
    else:
        rows, ok = _key_rows(phys, n0, n_end, stride_p, stride_s, BLOCK_N, PAGE)
        ptrs = base + rows[:, None] + offs_d[None, :]
        if MASKED:
            x = tl.load(ptrs, mask=ok[:, None], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def key_loop(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, bt, hk, lo, hi, n_keys, qpos, offset,
              stride_kp, stride_ks, stride_vp, stride_vs, qk_scale,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, CAUSAL: tl.constexpr,
              MASKED: tl.constexpr, USE_TMA: tl.constexpr, INTERP: tl.constexpr, AHEAD: tl.constexpr = False,
              WHOLE_PAGES: tl.constexpr = False):
    """FA2 Algorithm 1, lines 6-10, over key blocks ``[lo, hi)``: row ``r`` (query ``qpos[r]``) sees key ``j``
    iff ``j < n_keys`` and (causal) ``j <= qpos[r] + offset``. ``AHEAD``: block ``j + 1``'s table entries are
    loaded while block ``j`` is computed, so the K/V loads do not wait on a table load of their own iteration
    (``reference.triton.paged_tiles``: Triton's pipeliner then keeps K/V as deep as on a contiguous cache).
    ``WHOLE_PAGES``: a block of several whole pages is loaded as ``(pages, PAGE, d)`` and reshaped (``_load_kv``)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    phys_next = _pages(bt, lo, n_keys, BLOCK_N, PAGE, WHOLE_PAGES)
    for n0 in range(lo, hi, BLOCK_N):
        n0 = tl.multiple_of(n0, BLOCK_N)
        if AHEAD:
            phys = phys_next
            phys_next = _pages(bt, n0 + BLOCK_N, n_keys, BLOCK_N, PAGE, WHOLE_PAGES)
        else:
            phys = _pages(bt, n0, n_keys, BLOCK_N, PAGE, WHOLE_PAGES)
        k = _load_kv(k_base, desc_k, phys, n0, n_keys, hk, stride_kp, stride_ks, offs_d, BLOCK_N, HEAD_DIM, PAGE,
                     MASKED, USE_TMA, WHOLE_PAGES)
        s = dot(q, tl.trans(k), INTERP) * qk_scale
        s, m_new, m_use = mask_running_max(s, m_i, n0, qpos, offs_n, n_keys, offset, CAUSAL, MASKED)
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_kv(v_base, desc_v, phys, n0, n_keys, hk, stride_vp, stride_vs, offs_d, BLOCK_N, HEAD_DIM, PAGE,
                     MASKED, USE_TMA, WHOLE_PAGES)
        acc = dot_acc(p.to(v.dtype), v, acc * alpha[:, None], INTERP)
        m_i = m_new
    return acc, l_i, m_i

"""Split-KV decode options that were measured and not pinned, kept runnable beside the course's kernel.

``reference.triton.decode`` teaches one stage-1 kernel: fixed split ranges, the fused one-level merge. Three options
were tried on it (notes/triton_decode.md, notes/serving_perf.md "Decode at 32k and the one-launch cascade"; the sweeps
``benchmarks/tuning/sweep_decode_32k.py`` and ``probe_decode_variants.py``) and none was pinned:

* ``pdl``: programmatic dependent launch on Hopper (the next kernel on the stream may start while this one
  drains; this one waits for its predecessor with ``griddepcontrol.wait`` before reading anything): slower there;
* ``merge_group``: the fused merge in two levels (``two_level_merge``): the last program of each group of
  ``merge_group`` consecutive splits merges the group's partial states into one, and the last group to finish
  merges the groups' states; keeps the merge on the critical path short at high split counts (one level costs
  6.4 us at 128 splits, ncu);
* ``dynamic_chunk``: each of the ``num_splits`` programs of a (batch, kv head) draws chunks of ``dynamic_chunk`` key
  blocks from a counter until none are left, folding them all into one online-softmax state (the keys' order
  does not matter), instead of one fixed contiguous range; fast programs take more chunks.

``_split_kv_variant_kernel`` is the course kernel's stage 1 (its key loop ``key_range`` and merges ``merge_if_last``,
``fused_merge``, ``merge_states``, and its program ids, split bounds, query tile and partial write
``split_program``, ``split_bounds``, ``group_query``, ``store_split``) with these three switches;
``flash_decode_variant`` runs it with ``flash_decode``'s arguments and checks. The tests compare it with
``flash_decode`` and the float64 oracle (``tests/test_triton_decode_variants.py``). Nothing in ``reference/``
imports this module.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

import reference.triton  # noqa: F401  (first: without a GPU it switches Triton to its interpreter before any kernel)
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from reference.triton import _device, decode
from reference.triton._fastlaunch import TicketCounters
from reference.triton.configs import DecodeConfig
from reference.triton.decode import (fused_merge, group_query, key_range, merge_if_last, merge_states, split_bounds,
                                     split_program, store_split)

__all__ = ["DecodeVariant", "flash_decode_variant", "compile_variant"]


@dataclass(frozen=True)
class DecodeVariant(DecodeConfig):
    """A ``DecodeConfig`` with the options measured and not pinned (module docstring): ``pdl`` (Hopper only),
    ``merge_group`` (0: one level; else an int >= 2), ``dynamic_chunk`` (key blocks a chunk; 0: fixed ranges;
    needs the fused merge, whose last program resets the chunk counter)."""
    pdl: bool = False
    merge_group: int = 0
    dynamic_chunk: int = 0

    def __post_init__(self):
        super().__post_init__()
        if type(self.pdl) is not bool:
            raise ValueError(f"DecodeVariant.pdl must be a bool, got {self.pdl!r}")
        g = self.merge_group
        if type(g) is not int or g < 0 or g == 1:
            raise ValueError(f"DecodeVariant.merge_group must be 0 (one level) or an int >= 2, got {g!r}")
        c = self.dynamic_chunk
        if type(c) is not int or c < 0:
            raise ValueError(f"DecodeVariant.dynamic_chunk must be an int >= 0 (key blocks a chunk; 0: fixed "
                             f"ranges), got {c!r}")
        if c and not self.fuse_merge:
            raise ValueError("DecodeVariant.dynamic_chunk needs fuse_merge=True (the merging program resets the "
                             "chunk counter)")


@triton.jit
def two_level_merge(OPart, LsePart, OPart2, LsePart2, Out, Counters, ChunkCounters, pid_s, pid_bh, b64, kvh, group,
                     n_kv_heads, num_splits, stride_ob, stride_oh, HEAD_DIM: tl.constexpr, MERGE_M: tl.constexpr,
                     CHUNK: tl.constexpr, MERGE_GROUP: tl.constexpr, CHUNK_BLOCKS: tl.constexpr):
    """The fused merge in two levels (``DecodeVariant.merge_group``): tickets per group of MERGE_GROUP
    consecutive splits (counters after the B * Hkv head counters); the group's last program merges its splits
    into one state of ``(OPart2, LsePart2)``, laid out ``(B, Hq, n_groups)``, then takes a ticket of the
    (batch, kv head); the last group merges the groups' states into ``Out``. The log-sum-exp merge is
    associative, so the result is the one-level merge's up to rounding. Each level resets its counter."""
    n_groups = tl.cdiv(num_splits, MERGE_GROUP)
    g = pid_s // MERGE_GROUP
    g_lo = g * MERGE_GROUP
    g_hi = tl.minimum(g_lo + MERGE_GROUP, num_splits)
    n_bh = tl.num_programs(1)
    g_counter = Counters + n_bh + pid_bh * n_groups + g
    ticket = tl.atomic_add(g_counter, 1, sem="acq_rel")
    if ticket == g_hi - g_lo - 1:
        tl.debug_barrier()
        offs_h = tl.arange(0, MERGE_M)
        offs_d = tl.arange(0, HEAD_DIM)
        h_ok = offs_h < group
        heads = kvh * group + offs_h
        hrow = b64 * n_kv_heads * group + heads
        o, lse2 = merge_states(OPart, LsePart, hrow * num_splits, h_ok, g_lo, g_hi, HEAD_DIM, MERGE_M, CHUNK)
        row2 = hrow * n_groups + g
        tl.store(OPart2 + row2[:, None] * HEAD_DIM + offs_d[None, :], o, mask=h_ok[:, None])
        tl.store(LsePart2 + row2, lse2, mask=h_ok)
        tl.atomic_xchg(g_counter, 0)
        tl.debug_barrier()
        ticket2 = tl.atomic_add(Counters + pid_bh, 1, sem="acq_rel")
        if ticket2 == n_groups - 1:
            tl.debug_barrier()
            fused_merge(OPart2, LsePart2, Out, b64, kvh, group, n_kv_heads, n_groups, 0, n_groups, stride_ob,
                         stride_oh, HEAD_DIM, MERGE_M, CHUNK)
            tl.atomic_xchg(Counters + pid_bh, 0)
            if CHUNK_BLOCKS > 0:
                tl.atomic_xchg(ChunkCounters + pid_bh, 0)



@triton.jit
def _merge_splits(OPart, LsePart, OPart2, LsePart2, Out, Counters, ChunkCounters, pid_s, pid_bh, b64, kvh, group,
                  n_kv_heads, num_splits, stride_ob, stride_oh, HEAD_DIM: tl.constexpr, MERGE_M: tl.constexpr,
                  MERGE_CHUNK_S: tl.constexpr, MERGE_GROUP: tl.constexpr, CHUNK_BLOCKS: tl.constexpr,
                  FUSED: tl.constexpr, DIRECT_OUT: tl.constexpr):
    """After the partial write, with the fused merge: in one level (``merge_if_last``; its merging program also
    resets the chunk counter) or in two (``two_level_merge``)."""
    if FUSED and not DIRECT_OUT:
        tl.debug_barrier()  # every thread's partial stores before the ticket (acq_rel publishes them)
        if MERGE_GROUP == 0:
            last = merge_if_last(OPart, LsePart, Out, Counters, pid_bh, b64, kvh, group, n_kv_heads, num_splits,
                                 stride_ob, stride_oh, HEAD_DIM, MERGE_M, MERGE_CHUNK_S)
            if CHUNK_BLOCKS > 0:
                if last:  # every program of this kv head has left its chunk loop
                    tl.atomic_xchg(ChunkCounters + pid_bh, 0)
        else:
            two_level_merge(OPart, LsePart, OPart2, LsePart2, Out, Counters, ChunkCounters, pid_s, pid_bh, b64,
                            kvh, group, n_kv_heads, num_splits, stride_ob, stride_oh, HEAD_DIM, MERGE_M,
                            MERGE_CHUNK_S, MERGE_GROUP, CHUNK_BLOCKS)


@triton.jit
def _split_kv_variant_kernel(
    Q, K, V, SeqLens, BlockTables, Out, OPart, LsePart, Counters, DescK, DescV,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_tb,
    stride_ob, stride_oh, n_kv_heads, group, n_max, num_splits, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    DIRECT_OUT: tl.constexpr, IEEE_DOT: tl.constexpr,
    FUSED: tl.constexpr = False, MERGE_M: tl.constexpr = 1, MERGE_CHUNK_S: tl.constexpr = 1,
    USE_TMA: tl.constexpr = False, PDL: tl.constexpr = False,
    OPart2=None, LsePart2=None, MERGE_GROUP: tl.constexpr = 0,
    ChunkCounters=None, CHUNK_BLOCKS: tl.constexpr = 0,
):
    """``decode._split_kv_kernel`` with ``PDL``, ``MERGE_GROUP`` (``two_level_merge``) and ``CHUNK_BLOCKS`` (chunks
    of the kv head's keys drawn from a counter)."""
    if PDL:  # programmatic dependent launch (Hopper): let the next kernel launch now; wait for the previous one
        gdc_launch_dependents()  # before touching memory (its writes: q, the K/V cache, our ticket counters)
        gdc_wait()
    pid_s, pid_bh, b, b64, kvh = split_program(n_kv_heads)
    seq_len, n_blocks, start, end = split_bounds(SeqLens, b, pid_s, n_max, num_splits, BLOCK_N, HAS_SEQLENS)
    q, heads, row_ok, m_i, l_i, acc = group_query(Q, b64, kvh, group, stride_qb, stride_qh, HEAD_DIM, BLOCK_M)
    if CHUNK_BLOCKS > 0:
        n_chunks = tl.cdiv(n_blocks, CHUNK_BLOCKS)
        c = tl.atomic_add(ChunkCounters + pid_bh, 1, sem="relaxed")
        while c < n_chunks:
            c_next = tl.atomic_add(ChunkCounters + pid_bh, 1, sem="relaxed")  # in flight during this chunk
            lo = c * (CHUNK_BLOCKS * BLOCK_N)
            hi = tl.minimum(lo + CHUNK_BLOCKS * BLOCK_N, seq_len)
            m_i, l_i, acc = key_range(q, m_i, l_i, acc, lo, hi, pid_bh, b64, kvh, K, V, BlockTables, DescK, DescV,
                                      stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_tb,
                                      n_max, qk_scale, HEAD_DIM, BLOCK_N, PAGED, PAGE_SIZE, IEEE_DOT, USE_TMA)
            c = c_next
    else:
        m_i, l_i, acc = key_range(q, m_i, l_i, acc, start, end, pid_bh, b64, kvh, K, V, BlockTables, DescK, DescV,
                                  stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_tb,
                                  n_max, qk_scale, HEAD_DIM, BLOCK_N, PAGED, PAGE_SIZE, IEEE_DOT, USE_TMA)
    store_split(Out, OPart, LsePart, m_i, l_i, acc, b64, heads, row_ok, pid_s, n_kv_heads, group, num_splits,
                stride_ob, stride_oh, HEAD_DIM, DIRECT_OUT)
    _merge_splits(OPart, LsePart, OPart2, LsePart2, Out, Counters, ChunkCounters, pid_s, pid_bh, b64, kvh, group,
                  n_kv_heads, num_splits, stride_ob, stride_oh, HEAD_DIM, MERGE_M, MERGE_CHUNK_S, MERGE_GROUP,
                  CHUNK_BLOCKS, FUSED, DIRECT_OUT)


#: the variant's ticket counters: per (batch, kv head), per merge group, and the chunk counters
_COUNTERS = TicketCounters(256)


def flash_decode_variant(q, k, v, seq_lens=None, num_splits=None, scale=None, *, validate=True,
                         config: DecodeConfig | None = None):
    """``flash_decode`` (its arguments, checks and result) on ``_split_kv_variant_kernel`` with ``config``'s options
    (a ``DecodeVariant``; a plain ``DecodeConfig`` runs as the course kernel does)."""
    if config is not None and not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeVariant, a DecodeConfig or None, got {type(config).__name__}")
    plain = None if config is None else DecodeConfig(**{f.name: getattr(config, f.name)
                                                         for f in dataclasses.fields(DecodeConfig)})
    call = decode.check_call(q, k, v, seq_lens, num_splits, scale, validate, plain)
    q, num_splits = call.q, call.num_splits
    base = config if config is not None else decode.base_config(q.dtype, False, num_splits)
    B, Hq, d = q.shape
    n_bh = B * call.n_kv_heads
    fused = num_splits > 1 and base.fuse_merge
    merge_group = getattr(base, "merge_group", 0)
    merge_group = merge_group if fused and merge_group < num_splits else 0
    n_groups = -(-num_splits // merge_group) if merge_group else 0
    chunk_blocks = getattr(base, "dynamic_chunk", 0) if fused else 0
    n_counters = n_bh * (1 + n_groups + (chunk_blocks > 0))
    st = decode.stage1(*call[:-1], config=call.config, counters=lambda device, _: _COUNTERS.buffer(device, n_counters))
    kw = dict(st.kwargs)
    pdl = (getattr(base, "pdl", False) and q.device.type == "cuda" and not _device.INTERPRET
           and _device.hopper(_device.device_limits(q.device)))
    if merge_group:
        kw.update(OPart2=torch.empty((B, Hq, n_groups, d), device=q.device, dtype=torch.float32),
                  LsePart2=torch.empty((B, Hq, n_groups), device=q.device, dtype=torch.float32),
                  MERGE_GROUP=merge_group,
                  MERGE_CHUNK_S=min(triton.next_power_of_2(max(merge_group, n_groups)),
                                    max(1, base.merge_rows // kw["MERGE_M"])))
    if chunk_blocks:
        kw.update(ChunkCounters=st.args[8][n_bh * (1 + n_groups):], CHUNK_BLOCKS=chunk_blocks)
    if pdl:
        kw.update(PDL=True, launch_pdl=True)
    _split_kv_variant_kernel[st.grid](*st.args, **kw)
    if num_splits > 1 and not st.fused:
        decode.merge_splits(st)
    return st.out


def compile_variant(pdl: bool = False, merge_group: int = 0, dynamic_chunk: int = 0, **kw):
    """``_split_kv_variant_kernel`` compiled for sm_90a on any machine (``serving_aot.compile_decode``'s arguments
    ``kw``; several splits)."""
    from reference.triton.serving_aot import compile_decode
    ptrs = {}
    const = dict(PDL=pdl, MERGE_GROUP=merge_group, CHUNK_BLOCKS=dynamic_chunk)
    if merge_group:
        ptrs.update(OPart2="*fp32", LsePart2="*fp32")
    else:
        const.update(OPart2=None, LsePart2=None)
    if dynamic_chunk:
        ptrs.update(ChunkCounters="*i32")
    else:
        const.update(ChunkCounters=None)
    return compile_decode(kernel=_split_kv_variant_kernel, constexprs=const, pointers=ptrs, **kw)

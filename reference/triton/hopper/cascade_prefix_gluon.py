"""The prefix pass of cascade decode on Hopper in Gluon: a non-causal split-KV prefill of GQA-packed query rows.

``reference.triton.cascade.cascade_decode`` splits decode attention over a shared prefix ``(P, Hkv, d)`` plus each
request's paged suffix into partial states merged with the lse rule (FlashInfer's recursive attention). For kv
head ``h`` the prefix part is ONE attention problem: the ``B * G`` query rows of the batch that read kv head ``h``
(packed row ``r``: request ``r // G``, query head ``h * G + r % G``) over the ``P`` prefix keys, non-causal. At
``B = 64, G = 4, P = 32k`` that is 2048 rows x 32k keys per head, 34 GFLOP over the 8 heads: a prefill, compute-
bound, which the portable Triton kernel runs as 64-row ``tl.dot`` tiles with a serial ``QK -> softmax -> PV``
chain (0.31 of copy bandwidth at B = 64, notes/serving_perf.md "Decode at 32k and the one-launch cascade"). Here it runs on the production Gluon
forward's schedule (``flash_gluon``, FA3 sections 3.1 and Algorithm 2):

* a work item (one CTA) is ``(kv head, 128-row tile of packed rows, key split)``; items of one ``(head, split)``
  are adjacent in the grid, so the tiles that read the same keys run together and share them in L2;
* one producer warp streams the split's key and value blocks as TMA boxes ``(BLOCK_N, d)`` at column ``h * d`` of
  the ``(P, Hkv * d)`` view into a ``STAGES``-deep ring (``produce_kv_at``: ``flash_gluon.produce_kv`` with a
  column coordinate; that one addresses column 0 of a per-head 2-D view);
* two consumer warpgroups own 64 packed rows each (their Q rows are gathered with pointer loads, since the
  packed rows are ``G``-row runs ``Hq`` rows apart, and stored to shared memory) and run
  ``flash_gluon.attend_overlapped`` with the ping-pong turns: each one's softmax under the other's GEMMs, its own
  ``P_{j-1} V_{j-1}`` under its softmax of ``S_j``;
* the epilogue writes the partial state ``(o = acc / l, lse2 = m + log2 l)`` (fp32, base 2: FA2 Algorithm 1 lines
  12-15 without the final cast) into slot ``split`` of the 64-row tile ``2 * tile + warpgroup`` of the cascade's
  partial buffers, which the Triton cascade kernel's suffix programs merge (the last of a tile's requests).

So the Hopper cascade is two launches in stream order (one CUDA graph): this kernel, then the Triton kernel with
suffix items only (``PREFIX_DONE``). Keys past the split's end (the next split's or TMA zeros past ``P``) are
masked to ``-inf`` by ``attend_overlapped``'s ragged-tile mask (``N_K`` = the split's key count).

The interpreter cannot run Gluon; ``compile_cascade_prefix`` compiles the kernel for sm_90a on any machine (tests).
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._aot import compile_gluon, descriptor_signature
from .._checks import GLUON_DTYPES, GLUON_HEAD_DIMS, gluon_supported
from ..configs import HOPPER_SMEM, check_gluon_prefix_fields
from .common import LOG2E_F, init_ring_barriers, tile_descriptor
from .flash_gluon import PINGPONG_MAXNREG, PINGPONG_REGS, attend_overlapped

#: rows of a consumer warpgroup = the rows of the Triton cascade kernel's partial-state tile on this path
HALF = gl.constexpr(64)


@gluon.jit
def produce_kv_at(desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, row0, col, hi, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr):
    """The producer's key loop (``flash_gluon.produce_kv`` with a column): boxes ``[row0 + t * BLOCK_N, col]`` of
    K and V for ``t < hi`` into ring slot ``t % STAGES``, each once both consumers released the slot."""
    for t in range(hi):
        slot = t % STAGES
        free_phase = ((t // STAGES) & 1) ^ 1  # a fresh barrier counts as phase 1 complete: the first pass is free
        mbarrier.wait(k_bars.index(STAGES + slot), free_phase)
        mbarrier.expect(k_bars.index(slot), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [row0 + t * BLOCK_N, col], k_bars.index(slot), k_smem.index(slot))
        mbarrier.wait(v_bars.index(STAGES + slot), free_phase)
        mbarrier.expect(v_bars.index(slot), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_v, [row0 + t * BLOCK_N, col], v_bars.index(slot), v_smem.index(slot))


@gluon.jit
def launch_dependents():
    """PTX ``griddepcontrol.launch_dependents``: this CTA no longer holds back the programmatically dependent
    launch that follows in the stream; its CTAs are scheduled once every CTA of this grid has issued it (or exited),
    i.e. once all of this grid's CTAs are resident, so a dependent waiting for this grid (``griddepcontrol.wait``)
    never holds resources this grid still needs (CUDA programmatic dependent launch)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _item(n_t128, n_splits):
    """Work item of this CTA -> ``(tile, split, kv head)``; the tiles of one ``(head, split)`` are neighbours."""
    pid = gl.program_id(0)
    rest = pid // n_t128
    return pid % n_t128, rest % n_splits, rest // n_splits


@gluon.jit
def _split_keys(split, chunk, prefix_len, BLOCK_N: gl.constexpr):
    """Keys ``[lo, lo + n_keys)`` of a split; ``full_end`` whole blocks, ``hi`` blocks in all (FA2 Alg. 1 line 6)."""
    lo = split * chunk
    n_keys = gl.minimum(chunk, prefix_len - lo)
    return lo, n_keys, n_keys // BLOCK_N, gl.cdiv(n_keys, BLOCK_N)


@gluon.jit
def _consumer(q_smem, k_smem, v_smem, k_bars, v_bars, turn_bars, Q, OPart, LPart, stride_qb, stride_qh, batch,
              n_tiles64, n_t128, n_splits, n_kv_heads, prefix_len, chunk, qk_scale, WG: gl.constexpr,
              GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Consumer ``WG``: packed rows ``(2 tile + WG) * 64 ..`` of kv head ``hk`` over the split's keys; writes the
    partial state into slot ``split`` of 64-row tile ``2 tile + WG`` (``(tile64, state, head, row)`` order)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    t, split, hk = _item(n_t128, n_splits)
    lo, n_keys, full_end, hi = _split_keys(split, chunk, prefix_len, BLOCK_N)
    tile64 = 2 * t + WG
    # this warpgroup's Q rows: packed row r -> request r // G, head hk * G + r % G (zeros past the batch)
    r = tile64 * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, ld))
    c = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld))
    b = r // GROUP
    head = hk * GROUP + r % GROUP
    q = gl.load(Q + (b.to(gl.int64) * stride_qb + head * stride_qh)[:, None] + c[None, :],
                mask=(b < batch)[:, None], other=0.0)
    my_q = q_smem.index(WG)
    my_q.store(q)
    fence_async_shared()
    gl.thread_barrier()  # every thread's rows are in shared memory before the warpgroup's wgmma reads them
    acc, m_i, l_i = attend_overlapped(my_q, k_smem, v_smem, k_bars, v_bars, k_bars, v_bars, lo, full_end, hi,
                                       0, 1, n_keys, qk_scale, turn_bars, WG, 0, 0, s_layout, o_layout, HALF, BLOCK_N,
                                       HEAD_DIM, STAGES, False, LOADS=False, SYNC=False, PINGPONG=True)
    # partial state, FA2 Algorithm 1 lines 12-15 in base 2 (the Triton merge's convention)
    row_l: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_i = gl.convert_layout(m_i, row_l)
    l_i = gl.convert_layout(l_i, row_l)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse2 = gl.where(l_i > 0.0, m_i + gl.log2(l_safe), float("-inf"))
    offs_r = gl.arange(0, HALF, layout=row_l)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    n_states = n_splits + 1
    rows = ((tile64 * n_states + split) * n_kv_heads + hk).to(gl.int64) * HALF + offs_r
    ok = (offs_r < HALF) & (tile64 < n_tiles64)  # an odd count of 64-row tiles: the last CTA's second half is idle
    gl.store(LPart + rows, lse2, mask=ok)
    gl.store(OPart + rows[:, None] * HEAD_DIM + offs_d[None, :], o, mask=ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@gluon.jit
def _producer(desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, n_t128, n_splits, prefix_len, chunk,
              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    t, split, hk = _item(n_t128, n_splits)
    lo, n_keys, full_end, hi = _split_keys(split, chunk, prefix_len, BLOCK_N)
    produce_kv_at(desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, lo, hk * HEAD_DIM, hi, BLOCK_N, STAGES)


@gluon.jit
def cascade_prefix_kernel(desc_k, desc_v, Q, OPart, LPart, stride_qb, stride_qh, batch, n_tiles64, n_t128, n_splits,
                          n_kv_heads, prefix_len, chunk, qk_scale, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                          PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr, PDL_TRIGGER: gl.constexpr = False):
    """Grid = ``n_kv_heads * n_splits * n_t128`` work items, one CTA each (module docstring). ``PDL_TRIGGER``: the
    first instruction lets the launch that follows (the suffix kernel, launched programmatically dependent) start
    its CTAs beside this grid's once every CTA of this grid is resident (``launch_dependents``)."""
    if PDL_TRIGGER:
        launch_dependents()
    dtype: gl.constexpr = desc_k.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], desc_k.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())  # ready, then empty
    v_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    init_ring_barriers(k_bars, v_bars, STAGES, 2)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (q_smem, k_smem, v_smem, k_bars, v_bars, turn_bars, Q, OPart, LPart, stride_qb, stride_qh, batch,
                     n_tiles64, n_t128, n_splits, n_kv_heads, prefix_len, chunk, qk_scale, 0, GROUP, HEAD_DIM,
                     BLOCK_N, STAGES)),
        (_consumer, (q_smem, k_smem, v_smem, k_bars, v_bars, turn_bars, Q, OPart, LPart, stride_qb, stride_qh, batch,
                     n_tiles64, n_t128, n_splits, n_kv_heads, prefix_len, chunk, qk_scale, 1, GROUP, HEAD_DIM,
                     BLOCK_N, STAGES)),
        (_producer, (desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, n_t128, n_splits, prefix_len, chunk, HEAD_DIM,
                     BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def shared_bytes(block_n: int, stages: int, head_dim: int, elem_bytes: int = 2) -> int:
    """Shared memory of the tiles: two 64-row Q halves and ``stages`` K and V slots of ``block_n x d``."""
    return (2 * HALF.value + 2 * stages * block_n) * head_dim * elem_bytes


def check_prefix_config(block_n, stages, head_dim: int | None = None) -> tuple:
    """``(block_n, stages)`` of the kernel: block_n in {64, 128}, stages in {2, 3, 4}, within a CTA's shared memory."""
    check_gluon_prefix_fields(block_n, stages)
    if head_dim is not None and shared_bytes(block_n, stages, head_dim) + 1024 > HOPPER_SMEM:
        raise ValueError(f"Gluon cascade prefix: block_n={block_n}, stages={stages} at d={head_dim} need "
                         f"{shared_bytes(block_n, stages, head_dim)} B of shared memory, more than {HOPPER_SMEM} B")
    return block_n, stages


def prefix_ok(q, prefix_k, prefix_v, limits) -> bool:
    """The Hopper prefix pass applies: compute capability 9.0 (``gluon_supported``), fp16/bf16, ``d`` in {64, 128},
    the GQA group divides the 64-row half tiles, q's last dim and the prefix contiguous, 16-byte aligned bases."""
    g = q.shape[1] // prefix_k.shape[1]
    return (gluon_supported(limits) and q.dtype in GLUON_DTYPES and q.shape[-1] in GLUON_HEAD_DIMS
            and HALF.value % g == 0 and q.stride(-1) == 1
            and all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (prefix_k, prefix_v)))


def tiles(batch: int, group: int) -> tuple[int, int]:
    """``(64-row tiles, 128-row work-item tiles)`` of the ``batch * group`` packed rows of one kv head."""
    n64 = triton.cdiv(batch * group, HALF.value)
    return n64, triton.cdiv(n64, 2)


def gluon_num_splits(batch: int, group: int, n_kv_heads: int, prefix_len: int, sms: int, min_split_keys: int,
                     programs_per_sm: int = 1) -> int:
    """Key splits: about ``programs_per_sm * sms`` CTAs (one fits an SM: ``shared_bytes``), each split at least
    ``min_split_keys`` keys."""
    want = max(1, round(programs_per_sm * sms / (tiles(batch, group)[1] * n_kv_heads)))
    return max(1, min(want, prefix_len // max(1, min_split_keys)))


#: the per-call arguments of a recorded launch (``_fastlaunch``; the partial buffers are the recorded ones)
SLOTS = ("desc_k", "desc_v", "Q")


def descriptors(prefix_k, prefix_v, block_n: int) -> tuple:
    """TMA descriptors of the ``(P, Hkv * d)`` views of the prefix, boxes ``(block_n, d)``."""
    P, hkv, d = prefix_k.shape
    return tuple(tile_descriptor(x.view(P, hkv * d), block_n, d) for x in (prefix_k, prefix_v))


class _Base:
    """What a recorded launch reads of a descriptor's base (``data_ptr``, ``dtype``), without holding the tensor:
    a cached descriptor must not keep a freed prefix's memory alive."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, x):
        self.ptr, self.dtype = x.data_ptr(), x.dtype

    def data_ptr(self) -> int:
        return self.ptr


_DESC_CACHE: dict = {}
_DESC_CACHE_LIMIT = 64


def desc_key(x, block_n: int) -> tuple:
    """Everything a descriptor of ``x``'s ``(P, Hkv * d)`` view encodes: base address, shape, strides, dtype, device
    and the box; a tensor with another address (or shape, ...) gets a descriptor of its own."""
    return (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device, block_n)


def clear_descriptor_cache() -> None:
    """Forget every cached prefix descriptor."""
    _DESC_CACHE.clear()


def cached_descriptors(prefix_k, prefix_v, block_n: int) -> tuple:
    """``descriptors`` for the recorded (eager) launches, cached per ``desc_key`` (the serving case: the same
    shared prefix every decode step), so a call builds no descriptor object; the cached ones hold the base's address
    (``_Base``), not the tensor. Only a launch through ``_fastlaunch`` may use them (Triton's JIT path reads the
    base tensor)."""
    out = []
    for x in (prefix_k, prefix_v):
        key = desc_key(x, block_n)
        desc = _DESC_CACHE.get(key)
        if desc is None:
            if len(_DESC_CACHE) >= _DESC_CACHE_LIMIT:
                _DESC_CACHE.clear()
            P, hkv, d = x.shape
            full = tile_descriptor(x.view(P, hkv * d), block_n, d)
            desc = _DESC_CACHE[key] = TensorDescriptor(_Base(x), full.shape, full.strides, full.block_shape,
                                                       full.layout)
        out.append(desc)
    return tuple(out)


def launch_spec(q, prefix_k, prefix_v, o_part, l_part, n_splits: int, chunk: int, scale: float, block_n: int = 128,
                stages: int = 2, pdl_trigger: bool = False) -> tuple:
    """``(grid, args, meta)`` of the launch that writes prefix states ``0 .. n_splits - 1`` of ``o_part (n64, S + 1,
    Hkv, 64, d)`` / ``l_part`` (keys ``[s * chunk, (s + 1) * chunk)`` in split ``s``); the caller
    (``cascade_decode``) has checked the inputs and ``prefix_ok``."""
    B, hq, d = q.shape
    P, hkv, _ = prefix_k.shape
    n64, n128 = tiles(B, hq // hkv)
    dk, dv = descriptors(prefix_k, prefix_v, block_n)
    args = (dk, dv, q, o_part, l_part, q.stride(0), q.stride(1), B, n64, n128, n_splits, hkv, P, chunk,
            scale * LOG2E_F)
    meta = dict(constexprs(hq // hkv, d, block_n, stages, pdl_trigger), maxnreg=PINGPONG_MAXNREG)
    return (hkv * n_splits * n128,), args, meta


def constexprs(group: int, d: int, block_n: int, stages: int, pdl_trigger: bool = False) -> dict:
    return dict(GROUP=group, HEAD_DIM=d, BLOCK_N=block_n, STAGES=stages, CONSUMER_REGS=PINGPONG_REGS[0],
                PRODUCER_REGS=PINGPONG_REGS[1], num_warps=4, PDL_TRIGGER=pdl_trigger)


def compile_cascade_prefix(group: int = 4, head_dim: int = 128, block_n: int = 128, stages: int = 2,
                           dtype: str = "bf16", pdl_trigger: bool = False):
    """The kernel compiled for sm_90a without a GPU (``_aot.resource_usage`` reads registers, spills, HGMMA);
    ``pdl_trigger``: the variant that starts the dependent suffix launch (``CascadeConfig.overlap = "pdl"``)."""
    check_prefix_config(block_n, stages, head_dim)
    desc = descriptor_signature(block_n, head_dim, dtype)
    sig = {"desc_k": desc, "desc_v": desc, "Q": f"*{dtype}", "OPart": "*fp32", "LPart": "*fp32"}
    sig.update({n: "i32" for n in ("stride_qb", "stride_qh", "batch", "n_tiles64", "n_t128", "n_splits", "n_kv_heads",
                                   "prefix_len", "chunk")})
    sig["qk_scale"] = "fp32"
    return compile_gluon(cascade_prefix_kernel, sig, constexprs(group, head_dim, block_n, stages, pdl_trigger), 4,
                         maxnreg=PINGPONG_MAXNREG)


__all__ = ["launch_spec", "descriptors", "cached_descriptors", "clear_descriptor_cache", "prefix_ok", "gluon_num_splits", "tiles", "compile_cascade_prefix", "check_prefix_config",
           "shared_bytes"]

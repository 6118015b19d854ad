"""A persistent FlashAttention-2 forward that pulls (batch, head, query block) work items in LPT order.

``flash_attention_forward_persistent(q, k, v, causal=True, seq_lens=None, order="lpt", persistent=True)``
returns ``(o, lse)`` like ``flash_attention_forward``. It is the FlashAttention-3 talk's causal load
balancing (slides 26-45), which ``reference.simulators.scheduling.schedule`` simulates, made real:

* The host lists every work item (query block ``i`` of head ``h`` of sequence ``b``) as a
  ``reference.simulators.scheduling.Tile`` whose cost is the number of key blocks it visits, and orders them with
  ``reference.simulators.scheduling.order_tiles`` ("lpt": longest first, Graham 1969; "naive": launch order).
* ``persistent=True`` launches as many programs as fit on the GPU at once (``reference.triton.num_sms()`` times
  ``CONFIG["programs_per_sm"]``); each program takes the next
  item from a global counter (``tl.atomic_add``) whenever it finishes one: the greedy list scheduler of
  ``reference.simulators.scheduling.schedule``, in hardware. ``persistent=False`` launches one program per item in the same
  order and leaves the choice to the GPU's block scheduler (the baseline).
* ``seq_lens`` (int, ``(B,)``) gives each sequence its own length ``L_b <= N`` inside padded ``(B, H, N, d)``
  tensors (self-attention: ``Nq == Nk``); rows and keys past ``L_b`` are ignored, their ``o`` is 0 and ``lse``
  is ``-inf``. A batch of mixed lengths is where the order matters most: its items' costs vary by a factor of
  ``max L / BLOCK_N``.

Each item runs the same FA2 Algorithm 1 body as ``flash_fwd`` (``fwd_key_blocks``: unmasked key blocks, then
the masked diagonal and ragged tail), with plain pointer loads.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from reference.simulators.scheduling import Tile, order_tiles

from .. import _device
from .._checks import INT_DTYPES, check_attention_inputs, check_flag, check_scale, check_tensor
from .._kernel_helpers import LN2, LOG2E, causal_key_range
from .._device import INTERPRET, num_sms
from ..flash_fwd import fwd_key_blocks, load_tile

#: one block configuration (items are fixed before launch, so no autotuning): BLOCK_M, BLOCK_N, warps, stages,
#: and programs per SM: the 64 x 64 tile with 3 stages takes 113 KB of shared memory, so two fit on an SM
#: (ncu: "Block Limit Shared Mem 2"); one program per SM left half of it idle (notes/hopper.md).
CONFIG: dict = ({"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "programs_per_sm": 1} if INTERPRET
                else {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "programs_per_sm": 2})


@triton.jit
def _attn_fwd_persistent(Q, K, V, O, LSE, ITEMS, COUNTER, SEQ_LENS, n_items, stride_q, stride_k, stride_v, stride_o,
                         H_Q, GROUP, N_Q_MAX, N_K_MAX, qk_scale,
                         HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, VARLEN: tl.constexpr,
                         DYNAMIC: tl.constexpr, INTERP: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Loop: take work item ``ITEMS[2t], ITEMS[2t+1] = (b * H_Q + h, query block)``; run FA2 lines 4-15 on it.

    ``stride_q`` .. ``stride_o``: each tensor's ``(batch, head, row, column)`` strides as one tuple (``x.stride()``).
    """
    if DYNAMIC:
        item = tl.atomic_add(COUNTER, 1)
    else:
        item = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    while item < n_items:
        pid_bh = tl.load(ITEMS + 2 * item)
        pid_m = tl.load(ITEMS + 2 * item + 1)
        b = pid_bh // H_Q
        h = pid_bh % H_Q
        hk = h // GROUP
        b64 = b.to(tl.int64)
        if VARLEN:
            N_Q = tl.load(SEQ_LENS + b)
            N_K = N_Q
        else:
            N_Q = N_Q_MAX
            N_K = N_K_MAX
        start_m = pid_m * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_base = Q + b64 * stride_q[0] + h.to(tl.int64) * stride_q[1]
        k_base = K + b64 * stride_k[0] + hk.to(tl.int64) * stride_k[1]
        v_base = V + b64 * stride_v[0] + hk.to(tl.int64) * stride_v[1]
        q = load_tile(q_base, Q, b, h, start_m, tl.arange(0, BLOCK_M), offs_d, stride_q[2], stride_q[3], N_Q, Q, 0,
                       BLOCK_M, HEAD_DIM, False, True)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        OFFSET = N_K - N_Q
        full_end, hi = causal_key_range(start_m, N_K, OFFSET, BLOCK_M, BLOCK_N, CAUSAL)
        acc, l_i, m_i = fwd_key_blocks(acc, l_i, m_i, q, k_base, v_base, K, V, b, hk, 0, full_end,
                                        offs_m, offs_n, offs_d, stride_k[2], stride_k[3], stride_v[2], stride_v[3],
                                        N_K, OFFSET, qk_scale, Q, 0, 0, BLOCK_N, HEAD_DIM, CAUSAL, False, False,
                                        INTERP, 0)
        acc, l_i, m_i = fwd_key_blocks(acc, l_i, m_i, q, k_base, v_base, K, V, b, hk, full_end, hi,
                                        offs_m, offs_n, offs_d, stride_k[2], stride_k[3], stride_v[2], stride_v[3],
                                        N_K, OFFSET, qk_scale, Q, 0, 0, BLOCK_N, HEAD_DIM, CAUSAL, True, False,
                                        INTERP, 0)
        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
        row_ok = offs_m < N_Q
        tl.store(LSE + pid_bh.to(tl.int64) * N_Q_MAX + offs_m, lse, mask=row_ok)
        o_ptrs = (O + b64 * stride_o[0] + h.to(tl.int64) * stride_o[1]
                  + offs_m[:, None] * stride_o[2] + offs_d[None, :] * stride_o[3])
        tl.store(o_ptrs, (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None])
        if DYNAMIC:
            item = tl.atomic_add(COUNTER, 1)
        else:
            item += tl.num_programs(0)


def work_items(B: int, Hq: int, nq: int, nk: int, lens, causal: bool, block_m: int, block_n: int):
    """Every (b, h, query block) of the forward as a ``reference.simulators.scheduling.Tile``; cost = key blocks visited."""
    tiles = []
    for b in range(B):
        n_q = nq if lens is None else lens[b]
        n_k = nk if lens is None else lens[b]
        for i in range(-(-n_q // block_m)):
            if causal:
                hi = min(n_k, (i + 1) * block_m + n_k - n_q)
                cost = max(-(-hi // block_n), 0) if hi > 0 else 0
            else:
                cost = -(-n_k // block_n)
            for h in range(Hq):
                tiles.append(Tile(b, h, i, max(cost, 1)))
    return tiles


@functools.lru_cache(maxsize=64)
def _plan(B, Hq, Nq, Nk, lens, causal, bm, bn, order, heads_per_group, device):
    """The ordered item table ``(b * Hq + h, query block)`` as int32 on ``device`` (cached: host work stays
    out of repeated calls), the lengths as int32 on ``device``, and the item count."""
    tiles = order_tiles(work_items(B, Hq, Nq, Nk, lens, causal, bm, bn), order, heads_per_group)
    items = torch.tensor([(t.batch * Hq + t.head, t.q_block) for t in tiles], dtype=torch.int32).reshape(-1)
    sl = torch.tensor(lens if lens is not None else [0], dtype=torch.int32)
    return items.to(device), sl.to(device), len(tiles)


def _check_seq_lens(seq_lens, B: int, N: int, nq: int, nk: int):
    if seq_lens is None:
        return None
    check_tensor(seq_lens, "seq_lens", ndim=1, dtypes=INT_DTYPES, device=False)
    if seq_lens.shape[0] != B:
        raise ValueError(f"seq_lens must have one length per sequence (shape ({B},)), got {tuple(seq_lens.shape)}")
    if nq != nk:
        raise ValueError(f"seq_lens needs q and k of the same length (self-attention), got Nq={nq}, Nk={nk}")
    lens = [int(x) for x in seq_lens.tolist()]
    if any(n < 1 or n > N for n in lens):
        raise ValueError(f"seq_lens must be in [1, {N}] (the padded length), got {lens}")
    return tuple(lens)


def persistent_config(d: int, es: int, limits) -> dict:
    """``CONFIG``, or the first of its fallbacks (fewer stages, shorter key blocks) that fits ``limits``."""
    return _device.pick_config(
        _device.stage_ladder(CONFIG, "BLOCK_N"),
        lambda c: _device.Need(_device.smem_forward(c["BLOCK_M"], c["BLOCK_N"], c["num_stages"], d, es, limits),
                               c["num_warps"]), limits)


def l2_heads_per_group(k: torch.Tensor, group: int) -> int:
    """Query heads whose K and V fill at most half the L2 cache (at least one KV head's worth)."""
    l2 = 50 * 2 ** 20 if INTERPRET else torch.cuda.get_device_properties(k.device).L2_cache_size
    per_kv_head = 2 * k.shape[2] * k.shape[3] * k.element_size()
    return max(1, (l2 // 2) // per_kv_head) * group


def compile_persistent(head_dim: int = 128, causal: bool = True):
    """Compile the kernel (dynamic work queue) for sm_90a without a GPU (run with ``TRITON_INTERPRET=0``) with
    128 x 64 blocks, 8 warps, 3 stages; ``_aot.resource_usage`` reads registers, spills and SASS."""
    from ._aot import compile_triton
    kernel = _attn_fwd_persistent
    sig = {n: ("*bf16" if n in "QKVO" else "*fp32" if n == "LSE" else "*i32" if n in ("ITEMS", "COUNTER", "SEQ_LENS")
               else "fp32" if n == "qk_scale" else ("i32",) * 4 if n.startswith("stride_") else "i32")
           for n in kernel.arg_names}
    cx = dict(HEAD_DIM=head_dim, CAUSAL=causal, VARLEN=False, DYNAMIC=True, INTERP=False, BLOCK_M=128, BLOCK_N=64)
    return compile_triton(kernel, sig, cx, 8, 3)


def flash_attention_forward_persistent(q, k, v, causal=True, scale=None, seq_lens=None, order="lpt",
                                       persistent=True, l2_group=True):
    """FA2 forward with (batch, head, query block) items taken in ``order``; return ``(o, lse)``.

    Shapes, dtypes, GQA and the bottom-right causal mask as ``flash_attention_forward``. ``seq_lens``: optional
    int tensor ``(B,)`` of per-sequence lengths in ``[1, N]`` (needs ``Nq == Nk``). ``order``: "lpt" or "naive"
    (``reference.simulators.scheduling.order_tiles``). ``persistent``: one program per SM pulling items from an atomic counter
    (True) or one program per item (False). ``l2_group`` (with "lpt"): order longest-first within groups of
    heads whose K/V fit in half the L2 cache (``reference.simulators.scheduling.order_tiles``'s ``heads_per_group``), not
    across all heads at once.
    """
    B, Hq, Hkv, Nq, Nk, d, group = check_attention_inputs(q, k, v)
    causal = check_flag(causal, "causal")
    scale = check_scale(scale, d)
    persistent = check_flag(persistent, "persistent")
    hpg = l2_heads_per_group(k, group) if check_flag(l2_group, "l2_group") and order == "lpt" else None
    lens = _check_seq_lens(seq_lens, B, Nq, Nq, Nk)
    cfg = persistent_config(d, q.element_size(), _device.device_limits(q.device))
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    items, sl, n_items = _plan(B, Hq, Nq, Nk, lens, causal, bm, bn, order, hpg, q.device)
    counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    if lens is None:
        o = torch.empty((B, Hq, Nq, d), dtype=q.dtype, device=q.device)
        lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    else:
        o = torch.zeros((B, Hq, Nq, d), dtype=q.dtype, device=q.device)
        lse = torch.full((B, Hq, Nq), float("-inf"), dtype=torch.float32, device=q.device)
    grid = (min(num_sms() * cfg["programs_per_sm"], n_items),) if persistent else (n_items,)
    _attn_fwd_persistent[grid](q, k, v, o, lse, items, counter, sl, n_items,
                               q.stride(), k.stride(), v.stride(), o.stride(),
                               Hq, group, Nq, Nk, scale * LOG2E.value,
                               HEAD_DIM=d, CAUSAL=causal, VARLEN=lens is not None, DYNAMIC=persistent,
                               INTERP=INTERPRET, BLOCK_M=bm, BLOCK_N=bn,
                               num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return o, lse


__all__ = ["flash_attention_forward_persistent", "work_items", "CONFIG"]

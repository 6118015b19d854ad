"""FlashAttention-2 forward in Triton (FA2 paper, Algorithm 1), with GQA, bottom-right causal and ragged N.

``flash_attention_forward(q, k, v, causal=False, scale=None) -> (o, lse)`` with ``q (B, Hq, Nq, d)`` and
``k, v (B, Hkv, Nk, d)`` (docs/design.md §3 and 4). One program owns one block of ``BLOCK_M`` query rows of one (batch,
query head) pair: grid ``(cdiv(Nq, BLOCK_M), B * Hq)``, i.e. Algorithm 1's outer loop (line 3) is the grid and
the inner loop (line 6) runs inside the program over ``BLOCK_N``-key blocks.

Implementation choices a reader should know:

* exp2 instead of exp: ``log2(e)`` is folded into the softmax scale (``qk_scale = scale * log2(e)``), so every
  exponential is one ``ex2`` instruction. The running max ``m`` therefore lives in base-2 units; the returned
  ``lse`` is converted back to natural log (``lse = (m + log2(l)) * ln 2``).
* Causal masking is bottom-right aligned: row ``i`` sees key ``j`` iff ``j <= i + (Nk - Nq)``. Each program
  runs two loops: key blocks that every row of its block fully sees (no mask arithmetic at all), then the few
  blocks on the diagonal and the ragged tail with the mask. Key blocks above the diagonal are never loaded.
  A row that sees no key (``Nq > Nk``) keeps ``l = 0`` and writes ``o = 0``, ``lse = -inf``: the masked loop
  subtracts a "safe" max of 0 where the running max is still ``-inf``, so no ``inf - inf`` NaN appears.
* GQA: query head ``h`` reads kv head ``h // group`` through its base pointer; K/V are never copied.
* Loads: plain pointer loads with arbitrary strides, or (``use_tma``, Hopper and later) 4-D tensor
  descriptors over ``(B, H, N, d)`` whose out-of-range rows are zero-filled by the copy engine.
* float32 inputs are accepted; on a GPU ``tl.dot`` then runs in TF32 (about 1e-3 relative error).

Keyword arguments (``flash_attention_forward(..., config=None, use_tma=None)``):
``config`` -- a dict ``{"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}`` pins one config (the kernel is then
autotuned over that single config, which Triton launches without benchmarking); ``None`` takes
``reference.triton.configs.forward_pin()`` (the interpreter pin on CPU, autotuning on a GPU). The tuned pins of
the benchmarks and tests live in ``reference.triton.configs``.
``use_tma`` -- ``None`` picks tensor descriptors when the GPU is Hopper or newer and the strides allow it;
``False`` forces pointer loads.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import _device, configs
from ._checks import check_attention_inputs, check_flag, check_scale
from ._kernel_helpers import (LN2, LOG2E, causal_key_range, dot, dot_acc, mask_running_max, pinned_or_tuned,
                              varlen_bounds)
from ._device import INTERPRET

#: packed launches whose longest sequence has at most 16 query rows (decode steps, the suffix pass of cascade
#: decode): a 16-row tile instead of the 64-128 rows the autotuned configurations would mostly leave empty
SMALL_Q_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


# --------------------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def load_tile(base, desc, b, h, start, offs, offs_d, stride_n, stride_d, n_rows, bt, stride_page,
               BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr, BOUNDS: tl.constexpr,
               PAGE: tl.constexpr = 0):
    """Load rows ``[start, start + BLOCK)`` of one head as a ``(BLOCK, HEAD_DIM)`` tile (zeros past ``n_rows``).

    ``PAGE > 0``: the rows live in a paged cache; row ``n`` is slot ``n % PAGE`` of physical block
    ``bt[n // PAGE]`` (``bt`` points at the sequence's block-table row, ``stride_page`` is the block stride).
    """
    if USE_TMA:
        x = desc.load([b, h, start, 0]).reshape(BLOCK, HEAD_DIM)
    elif PAGE > 0:
        rows = start + offs
        if BOUNDS:
            phys = tl.load(bt + rows // PAGE, mask=rows < n_rows, other=0).to(tl.int64)
        else:
            phys = tl.load(bt + rows // PAGE).to(tl.int64)
        ptrs = base + phys[:, None] * stride_page + (rows % PAGE)[:, None] * stride_n + offs_d[None, :] * stride_d
        if BOUNDS:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs)
    else:
        ptrs = base + (start + offs)[:, None] * stride_n + offs_d[None, :] * stride_d
        if BOUNDS:
            x = tl.load(ptrs, mask=(start + offs)[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def attend_key_block(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, b, hk, start_n,
                     offs_m, offs_n, offs_d, stride_kn, stride_kd, stride_vn, stride_vd, N_K, OFFSET, qk_scale,
                     bt, stride_kp, stride_vp,
                     BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                     MASKED: tl.constexpr, USE_TMA: tl.constexpr, INTERP: tl.constexpr, PAGE: tl.constexpr):
    """FA2 Algorithm 1, lines 7-10, for the key block starting at ``start_n``: the heart of the forward kernel.

    A teaching API: lecture 05 prints this function's source next to lecture 03's NumPy loop. It is a
    ``@triton.jit`` device function, callable only from inside a kernel (here: ``fwd_key_blocks``).

    State of one program's ``BLOCK_M`` query rows, updated and returned: ``acc (BLOCK_M, HEAD_DIM)`` the
    unnormalised output O_i, ``l_i`` the running row sums, ``m_i`` the running row maxima in base-2 units
    (``qk_scale = scale * log2(e)``, so every exponential is an ``exp2``). ``q`` is the loaded Q_i tile.
    K_j and V_j are read from ``k_base``/``v_base`` (pointers with strides) or through the tensor descriptors
    ``desc_k``/``desc_v`` (``USE_TMA``), or through block table ``bt`` when ``PAGE > 0`` (paged K/V).
    ``MASKED`` compiles the masked variant (ragged tail, causal diagonal: query row ``i`` sees key ``j`` iff
    ``j <= i + OFFSET``, ``OFFSET = Nk - Nq``); fully visible blocks take the unmasked path with no mask
    arithmetic. ``INTERP`` widens dot operands to fp32 for the Triton interpreter.
    """
    # line 7: load K_j (V_j is loaded just before its use, below)
    k = load_tile(k_base, desc_k, b, hk, start_n, offs_n, offs_d, stride_kn, stride_kd, N_K, bt, stride_kp,
                   BLOCK_N, HEAD_DIM, USE_TMA, MASKED, PAGE)
    # line 8: S_ij = Q_i K_j^T, already scaled into base-2 units
    s = dot(q, tl.trans(k), INTERP) * qk_scale
    # line 9: masks where the block needs them, then the new running max (0 subtracted on rows with no key yet)
    s, m_new, m_use = mask_running_max(s, m_i, start_n, offs_m, offs_n, N_K, OFFSET, CAUSAL, MASKED)
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    # line 10: O_i = diag(alpha) O_i + P_ij V_j
    v = load_tile(v_base, desc_v, b, hk, start_n, offs_n, offs_d, stride_vn, stride_vd, N_K, bt, stride_vp,
                   BLOCK_N, HEAD_DIM, USE_TMA, MASKED, PAGE)
    acc = acc * alpha[:, None]
    acc = dot_acc(p.to(v.dtype), v, acc, INTERP)
    return acc, l_i, m_new


@triton.jit
def fwd_key_blocks(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, b, hk, lo, hi,
                    offs_m, offs_n, offs_d, stride_kn, stride_kd, stride_vn, stride_vd, N_K, OFFSET, qk_scale,
                    bt, stride_kp, stride_vp,
                    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                    MASKED: tl.constexpr, USE_TMA: tl.constexpr, INTERP: tl.constexpr, PAGE: tl.constexpr):
    """FA2 Algorithm 1, line 6: the inner loop over key blocks ``[lo, hi)``.

    A plain ``for`` loop, which the GPU compiler software-pipelines; the interpreter runs the same loop
    (``reference.triton._device`` lets it take run-time bounds under NumPy >= 2.4).
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        acc, l_i, m_i = attend_key_block(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, b, hk, start_n,
                                         offs_m, offs_n, offs_d, stride_kn, stride_kd, stride_vn, stride_vd,
                                         N_K, OFFSET, qk_scale, bt, stride_kp, stride_vp,
                                         BLOCK_N, HEAD_DIM, CAUSAL, MASKED, USE_TMA, INTERP, PAGE)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, desc_q, desc_k, desc_v, desc_o,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_om, stride_od,
              stride_lb, stride_lh,
              H_Q, GROUP, N_Q, N_K, qk_scale,
              CU_Q, CU_K, BT, stride_tb, stride_kp, stride_vp,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, INTERP: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VARLEN: tl.constexpr = False, PAGE: tl.constexpr = 0):
    """One program = one query block Q_i of one (batch, query head): FA2 Algorithm 1, lines 4-15.

    ``VARLEN``: sequence ``b`` is rows ``CU_Q[b] .. CU_Q[b+1]-1`` of a packed q (and, unless paged, rows
    ``CU_K[b] .. CU_K[b+1]-1`` of packed k, v); ``N_Q``/``N_K`` arrive as the maxima and are replaced by the
    sequence's own lengths, and the query blocks past a short sequence's end do nothing. ``PAGE > 0``: k, v
    are paged caches ``(num_blocks, PAGE, Hkv, d)`` read through block-table row ``BT + b * stride_tb``, and
    ``CU_K[b]`` is sequence ``b``'s key count.
    """
    pid_m = tl.program_id(0)
    if CAUSAL:  # causal work grows with the row index: launch the heaviest blocks first (shorter tail)
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    hk = h // GROUP  # GQA: query head h reads kv head h // group
    b64 = b.to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_start = 0
    k_start = 0
    if VARLEN:
        N_Q, N_K, q_start, k_start = varlen_bounds(CU_Q, CU_K, b, PAGE)
    q_base = Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + q_start * stride_qm
    bt = BT + b64 * stride_tb
    if PAGE > 0:
        k_base = K + hk.to(tl.int64) * stride_kh
        v_base = V + hk.to(tl.int64) * stride_vh
    else:
        k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh + k_start * stride_kn
        v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh + k_start * stride_vn

    # line 4: load Q_i (rows past N_Q read as zeros and are never stored)
    q = load_tile(q_base, desc_q, b, h, start_m, tl.arange(0, BLOCK_M), offs_d, stride_qm, stride_qd, N_Q, bt, 0,
                   BLOCK_M, HEAD_DIM, USE_TMA, True)
    # line 5: O_i = 0, l_i = 0, m_i = -inf
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    OFFSET = N_K - N_Q  # bottom-right causal alignment
    full_end, hi = causal_key_range(start_m, N_K, OFFSET, BLOCK_M, BLOCK_N, CAUSAL)
    if VARLEN:  # a query block past this sequence's end: no key blocks, nothing stored
        full_end = tl.where(start_m < N_Q, full_end, 0)
        hi = tl.where(start_m < N_Q, hi, 0)
    # line 6: key blocks every row fully sees, then the diagonal / ragged tail with the mask
    acc, l_i, m_i = fwd_key_blocks(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, b, hk, 0, full_end,
                                    offs_m, offs_n, offs_d, stride_kn, stride_kd, stride_vn, stride_vd,
                                    N_K, OFFSET, qk_scale, bt, stride_kp, stride_vp,
                                    BLOCK_N, HEAD_DIM, CAUSAL, False, USE_TMA, INTERP, PAGE)
    acc, l_i, m_i = fwd_key_blocks(acc, l_i, m_i, q, k_base, v_base, desc_k, desc_v, b, hk, full_end, hi,
                                    offs_m, offs_n, offs_d, stride_kn, stride_kd, stride_vn, stride_vd,
                                    N_K, OFFSET, qk_scale, bt, stride_kp, stride_vp,
                                    BLOCK_N, HEAD_DIM, CAUSAL, True, USE_TMA, INTERP, PAGE)

    # lines 12-13: O_i = O_i / l_i, L_i = m_i + log l_i; a row with no visible key gives 0 and -inf
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    # lines 14-15: write O_i and L_i
    row_ok = offs_m < N_Q
    tl.store(LSE + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start + offs_m, lse, mask=row_ok)
    o = o.to(O.dtype.element_ty)
    if USE_TMA:
        desc_o.store([b, h, start_m, 0], o.reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        o_ptrs = (O + b64 * stride_ob + h.to(tl.int64) * stride_oh
                  + (q_start + offs_m)[:, None] * stride_om + offs_d[None, :] * stride_od)
        tl.store(o_ptrs, o, mask=row_ok[:, None])


# --------------------------------------------------------------------------------------------------------------
# configs and autotuning
# --------------------------------------------------------------------------------------------------------------
def _set_block_shapes(nargs):
    """Autotune pre-hook: host tensor descriptors carry the block shape, which depends on the config."""
    bm, bn, d = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["HEAD_DIM"]
    for name, rows in (("desc_q", bm), ("desc_o", bm), ("desc_k", bn), ("desc_v", bn)):
        if isinstance(nargs[name], TensorDescriptor):
            nargs[name].block_shape = [1, 1, rows, d]


# (BLOCK_M, BLOCK_N, num_warps, num_stages). Measured on an H200 (notes/triton_attention.md): (64, 64, 4, 3)
# wins most shapes, (64, 128, 4, 3) d=64 at long N, (128, 128, 8, 3) is close for d=128.
FWD_CONFIGS = [(64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3)]
#: smaller GPUs (T4: 64 KB, sm_86/89: 99 KB of shared memory) when none of FWD_CONFIGS fits, e.g. float32 at
#: d = 128; never tuned on a GPU where a FWD_CONFIGS entry fits (notes/any_gpu.md)
FWD_FALLBACK = [(64, 32, 4, 2), (32, 32, 4, 2), (32, 16, 4, 1)]


def _fwd_configs():
    out = []
    for bm, bn, w, s in FWD_CONFIGS + FWD_FALLBACK:
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s,
                                 pre_hook=_set_block_shapes))
    return out


def fwd_need(cfg, d: int, es: int, limits) -> _device.Need:
    """What a forward config ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` needs of the device."""
    bm, bn, w, s = cfg
    return _device.Need(_device.smem_forward(bm, bn, s, d, es, limits), w)


def fwd_configs_for(d: int, es: int, n_q: int, n_k: int, limits) -> list:
    """The forward configs to autotune over on ``limits``: those of FWD_CONFIGS that fit the device and suit
    the shape (blocks not much larger than the sequence; 8 warps for 128-key tiles at d = 128); if the shape
    rules drop all, the last that fits; if none fits, the first fitting FWD_FALLBACK entry."""
    fit = [c for c in FWD_CONFIGS if _device.fits(fwd_need(c, d, es, limits), limits)]
    kept = []
    for c in fit:
        bm, bn, w, _ = c
        if bm > max(64, triton.next_power_of_2(n_q)) or bn > max(32, triton.next_power_of_2(n_k)):
            continue
        if d >= 128 and bn == 128 and w < 8:
            continue
        kept.append(c)
    if kept:
        return kept
    if fit:
        return fit[-1:]
    return [_device.pick_config(FWD_FALLBACK, lambda c: fwd_need(c, d, es, limits), limits)]


def _as_tuple(c) -> tuple:
    return (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)


def _prune_fwd(configs, named_args, **kwargs):
    """Keep the configs of ``fwd_configs_for`` (device limits from the tensors' GPU)."""
    d = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    q = named_args["Q"]
    want = fwd_configs_for(d, q.element_size(), named_args["N_Q"], named_args["N_K"], _device.device_limits(q.device))
    return [c for c in configs if _as_tuple(c) in want] or configs[-1:]


def small_q_config(d: int, es: int, limits) -> dict:
    """``SMALL_Q_CONFIG``, or the first of its fallbacks (fewer stages, shorter key blocks) that fits."""
    return _device.pick_config(
        _device.stage_ladder(SMALL_Q_CONFIG, "BLOCK_N"),
        lambda c: fwd_need((c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]), d, es, limits), limits)


def tuning_bench(kernel_call, quantiles):
    """Autotuner timing: short (5 ms warm-up, 25 ms of repeats) medians, to keep tuning cheap."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


_attn_fwd_tuned = triton.autotune(
    configs=_fwd_configs(), key=["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "USE_TMA", "GROUP", "VARLEN", "PAGE"],
    prune_configs_by={"early_config_prune": _prune_fwd}, do_bench=tuning_bench)(_attn_fwd)


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def tma_ok(use_tma, *tensors) -> bool:
    """Whether to load ``tensors`` through tensor descriptors: never if ``use_tma is False``; with ``None`` only on
    Hopper+ (not in the interpreter); in both other cases only if each has a contiguous last axis and 16-byte
    aligned base and strides (the descriptors' requirement)."""
    if use_tma is False:
        return False
    if use_tma is None:
        if INTERPRET or not _device.hopper(_device.device_limits(tensors[0].device)):
            return False
    for t in tensors:
        es = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * es) % 16 for s in t.stride()[:-1]):
            return False
        if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):  # broadcast (expanded) axis
            return False
    return True


def _descriptor(t: torch.Tensor, rows: int, d: int):
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, d])


class Varlen(NamedTuple):
    """How a launch finds its sequences when q/k/v are packed (``None`` instead of this: dense ``(B, H, N, d)``).

    ``cu_q`` (B + 1,) cumulative query lengths; ``cu_k`` (B + 1,) cumulative key lengths, or for a paged
    cache (``page > 0``) the (B,) key counts; ``block_tables`` (B, max_blocks) for a paged cache, else None.
    ``max_q``/``max_k`` bound the lengths (they size the grid and pick the autotuning bucket).
    """
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    batch: int
    max_q: int
    max_k: int
    block_tables: torch.Tensor | None = None
    page: int = 0


def packed_strides(x: torch.Tensor) -> tuple:
    """Strides of a packed ``(tokens, heads, d)`` tensor in the kernels' (batch, head, row, d) order."""
    return (0, x.stride(1), x.stride(0), x.stride(2))


def paged_strides(cache: torch.Tensor) -> tuple:
    """(batch, head, row, d) strides of a paged cache ``(num_blocks, block_size, heads, d)``; rows are slots."""
    return (0, cache.stride(2), cache.stride(1), cache.stride(3))


def launch_forward(q, k, v, o, lse, causal: bool, scale: float, group: int, varlen: Varlen | None = None,
                   config: dict | None = None, use_tma: bool | None = None) -> None:
    """Launch the forward kernel on validated inputs, writing ``o`` and ``lse`` in place.

    Dense: ``q, o (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)``, ``lse (B, Hq, Nq)``. With ``varlen``: ``q, o
    (total_q, Hq, d)``, ``lse (Hq, total_q)``, and k, v packed ``(total_k, Hkv, d)`` or paged caches.
    ``config``, ``use_tma``: as in ``flash_attention_forward``.
    """
    d = q.shape[-1]
    if varlen is None:
        B, Hq, Nq, _ = q.shape
        Nk = k.shape[2]
        use_tma = tma_ok(use_tma, q, k, v, o)
        strides = (*q.stride(), *k.stride(), *v.stride(), *o.stride(), lse.stride(0), lse.stride(1))
        extra = (q, q, q, 0, 0, 0)  # no cu_seqlens / block table: dummy pointers, zero strides
    else:
        B, Hq = varlen.batch, q.shape[1]
        # the kernel only uses Nq/Nk as autotuning bucket and pruning hint here: powers of two, few retunes
        Nq, Nk = triton.next_power_of_2(varlen.max_q), triton.next_power_of_2(varlen.max_k)
        use_tma = False
        kv = paged_strides if varlen.page else packed_strides
        strides = (*packed_strides(q), *kv(k), *kv(v), *packed_strides(o), 0, lse.stride(0))
        bt = varlen.block_tables
        extra = (varlen.cu_q, varlen.cu_k, q if bt is None else bt, 0 if bt is None else bt.stride(0),
                 k.stride(0) if varlen.page else 0, v.stride(0) if varlen.page else 0)
    if use_tma:  # block shapes are placeholders: the config's pre-hook (_set_block_shapes) sets them
        dq, dk, dv, do_ = (_descriptor(t, 64, d) for t in (q, k, v, o))
    else:
        dq, dk, dv, do_ = q, k, v, o
    rows = Nq if varlen is None else varlen.max_q
    pin = configs.forward_pin() if config is None else configs.check_pin(config, "config")
    if varlen is not None and varlen.max_q <= SMALL_Q_CONFIG["BLOCK_M"]:
        # a few query rows per sequence (decode-like): one 16-row tile, no autotuning
        pin = small_q_config(d, q.element_size(), _device.device_limits(q.device))
    kernel = pinned_or_tuned(_attn_fwd, _attn_fwd_tuned, pin, pre_hook=_set_block_shapes)
    kernel[lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]), B * Hq)](
        q, k, v, o, lse, dq, dk, dv, do_, *strides, Hq, group, Nq, Nk, scale * LOG2E.value, *extra,
        HEAD_DIM=d, CAUSAL=causal, USE_TMA=use_tma, INTERP=INTERPRET, VARLEN=varlen is not None,
        PAGE=varlen.page if varlen is not None else 0)


def flash_attention_forward(q, k, v, causal=False, scale=None, *, config=None, use_tma=None):
    """FlashAttention-2 forward (Algorithm 1): return ``(o, lse)``.

    ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)`` on ``reference.triton.DEVICE``, float16/bfloat16/float32,
    ``d`` in {16, 32, 64, 128}, ``Hq % Hkv == 0``. ``o`` has q's dtype and shape (contiguous); ``lse`` is the
    natural-log log-sum-exp of the scaled scores, float32 ``(B, Hq, Nq)``; rows that see no key (causal with
    ``Nq > Nk``) give ``o = 0`` and ``lse = -inf``. Inputs may be strided (any strides; the tensor-descriptor
    path needs a contiguous last axis and 16-byte aligned strides, else the pointer path is used).
    ``config``: one pinned block configuration (module docstring; default ``configs.forward_pin()``);
    ``use_tma``: ``None`` tensor descriptors where possible, ``False`` pointer loads.
    """
    B, Hq, Hkv, Nq, Nk, d, group = check_attention_inputs(q, k, v)
    causal = check_flag(causal, "causal")
    scale = check_scale(scale, d)
    o = torch.empty((B, Hq, Nq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    launch_forward(q, k, v, o, lse, causal, scale, group, config=config, use_tma=use_tma)
    return o, lse


def forward_flops(B: int, H: int, Nq: int, Nk: int, d: int, causal: bool) -> float:
    """FLOPs of the forward (two matmuls, 2 flops per multiply-add), halved for causal (FA convention)."""
    f = 4.0 * B * H * Nq * Nk * d
    return f / 2 if causal else f


__all__ = ["flash_attention_forward", "forward_flops", "attend_key_block", "launch_forward", "load_tile", "tma_ok"]

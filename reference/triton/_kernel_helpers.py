"""Pieces the Triton kernels share: the exp2/log2 constants, the fp32 dot, the causal key range, a packed
sequence's bounds, and the one launch path of an autotuned kernel whose config may be pinned.

Kernels read ``LOG2E``/``LN2`` as globals, so they are ``tl.constexpr`` (Triton refuses other globals); host
code takes the float with ``LOG2E.value``. The softmax runs in base 2 (``exp(x) = exp2(x * log2 e)``, one
``ex2`` instruction) and a base-2 log-sum-exp goes back to natural log with ``* ln 2``.
"""
from __future__ import annotations

import functools

import triton
import triton.language as tl

__all__ = ["LOG2E", "LN2", "dot", "dot_acc", "causal_key_range", "varlen_bounds", "pinned_or_tuned"]

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e)
LN2 = tl.constexpr(0.6931471805599453)    # ln(2)


@triton.jit
def dot(a, b, INTERP: tl.constexpr):
    """``a @ b`` in fp32. The Triton 3.6 interpreter's bf16 ``tl.dot`` is wrong, so there (``INTERP``) both
    operands are widened to fp32 first (exact for fp16/bf16 values, like the GPU's fp32-accumulating MMA)."""
    if INTERP:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def dot_acc(a, b, acc, INTERP: tl.constexpr):
    """``acc + a @ b`` (the MMA's accumulate form); see ``dot`` for ``INTERP``."""
    if INTERP:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def causal_key_range(start_m, N_K, OFFSET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key ranges for query rows ``[start_m, start_m + BLOCK_M)`` under the bottom-right mask (row ``i`` sees key
    ``j`` iff ``j <= i + OFFSET``, ``OFFSET = N_K - N_Q``): ``[0, full_end)`` is visible to every row and inside
    ``N_K`` (no mask needed); ``[full_end, hi)`` holds the diagonal and the ragged tail (masked); keys ``>= hi``
    are above the diagonal and are never loaded."""
    if CAUSAL:
        hi = tl.minimum(N_K, start_m + BLOCK_M + OFFSET)
        full_end = tl.maximum(start_m + OFFSET + 1, 0) // BLOCK_N * BLOCK_N
        full_end = tl.minimum(full_end, N_K // BLOCK_N * BLOCK_N)
    else:
        hi = N_K
        full_end = N_K // BLOCK_N * BLOCK_N
    return full_end, hi


@triton.jit
def mask_running_max(s, m_i, start_n, offs_m, offs_n, N_K, OFFSET, CAUSAL: tl.constexpr, MASKED: tl.constexpr):
    """FA2 Algorithm 1, line 9, with the masks: returns ``(s, m_new, m_use)``.

    ``MASKED`` (a ragged tail or the causal diagonal) sets the scores of keys ``>= N_K`` and, under ``CAUSAL``,
    of keys ``j > i + OFFSET`` to ``-inf``; fully visible blocks skip the mask arithmetic. ``m_new`` is the new
    running row max; ``m_use`` is the max to subtract, 0 for a row that has seen no key yet (``m_new = -inf``),
    so such a row gives ``exp2(-inf) = 0`` instead of NaN.
    """
    if MASKED:
        cols = start_n + offs_n
        ok = cols[None, :] < N_K
        if CAUSAL:
            ok = ok & (cols[None, :] <= offs_m[:, None] + OFFSET)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
    return s, m_new, m_use


@triton.jit
def varlen_bounds(CU_Q, CU_K, b, PAGE: tl.constexpr):
    """Sequence ``b`` of a packed batch: ``(n_q, n_k, first q row, first k row)`` from the cumulative lengths
    (paged: ``CU_K`` holds per-sequence key counts and keys are found through the block table instead)."""
    q_start = tl.load(CU_Q + b).to(tl.int64)
    n_q = (tl.load(CU_Q + b + 1) - tl.load(CU_Q + b)).to(tl.int32)
    if PAGE > 0:
        k_start = q_start * 0
        n_k = tl.load(CU_K + b).to(tl.int32)
    else:
        k_start = tl.load(CU_K + b).to(tl.int64)
        n_k = (tl.load(CU_K + b + 1) - tl.load(CU_K + b)).to(tl.int32)
    return n_q, n_k, q_start, k_start

@triton.jit
def lse_merge_step(m, den, num, lse_s, o_s):
    """Fold one partial state ``(lse_s, o_s)`` (base-2 lse per row, ``o_s (rows, d)``) into the running
    ``(m, den, num)`` of the log-sum-exp merge ``o = sum_s exp2(lse_s - lse) o_s``, ``lse = log2 sum_s
    exp2(lse_s)`` (``reference.numpy.merge.merge_states``), an online max as in FA2 Algorithm 1 line 9; a
    state that saw no key (``lse_s = -inf``) weighs 0, and rows with no key so far keep weights 0, not NaN."""
    m_new = tl.maximum(m, lse_s)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    w = tl.math.exp2(lse_s - m_ref)
    alpha = tl.math.exp2(m - m_ref)
    return m_new, den * alpha + w, num * alpha[:, None] + w[:, None] * o_s


@triton.jit
def lse_merge_finish(m, den, num):
    """``(o, lse)`` of a finished ``lse_merge_step`` loop, ``lse`` in natural log; a row whose states all saw no
    key gets ``o = 0``, ``lse = -inf``."""
    out = num / tl.where(den > 0, den, 1.0)[:, None]
    lse = tl.where(den > 0, (tl.where(m == float("-inf"), 0.0, m) + tl.math.log2(tl.where(den > 0, den, 1.0))) * LN2,
                   float("-inf"))
    return out, lse



@functools.lru_cache(maxsize=None)
def _single_config(kernel, block_m: int, block_n: int, num_warps: int, num_stages: int, pre_hook):
    config = triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=num_warps, num_stages=num_stages,
                           pre_hook=pre_hook)
    return triton.autotune(configs=[config], key=[])(kernel)


def pinned_or_tuned(kernel, tuned, pin: dict | None, pre_hook=None):
    """The kernel to launch: ``tuned`` (an autotuner over several configs) when ``pin`` is None, else an
    autotuner over the one pinned config ``{"BLOCK_M", "BLOCK_N", "num_warps"=4, "num_stages"=2}``.

    Triton benchmarks only when it has more than one config, so a pinned config costs no tuning and both cases
    launch the same way: ``k[lambda meta: grid(meta["BLOCK_M"], ...)](...)``. Compiled binaries are cached by
    ``kernel`` itself, so the pinned and tuned wrappers share them.
    """
    if pin is None:
        return tuned
    return _single_config(kernel, pin["BLOCK_M"], pin["BLOCK_N"], pin.get("num_warps", 4),
                          pin.get("num_stages", 2), pre_hook)

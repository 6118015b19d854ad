"""Variable-length (packed) FlashAttention-2 in Triton, forward and backward, FlashAttention's varlen convention.

``flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
scale=None) -> o`` with ``q (total_q, Hq, d)``, ``k, v (total_k, Hkv, d)``: sequence ``b`` is query rows
``cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1`` and key rows ``cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1`` (the
definition is ``reference.numpy.varlen``). Differentiable: ``o.backward(do)`` fills ``q.grad, k.grad, v.grad``.

No new kernel: the FA2 kernels of ``flash_fwd``/``flash_bwd`` take a ``VARLEN`` switch. Each program reads its
sequence's bounds from the cumulative lengths and offsets its base pointers; the grid is sized by the longest
sequence (``cdiv(max_seqlen_q, BLOCK_M)`` query blocks per (sequence, head)) and the blocks past a shorter
sequence's end exit without loading anything. Packing saves the pad tokens' memory and every tile that would
hold only padding; the benchmark (``benchmarks/course/bench_serving.py``) measures it against padding to the longest.
"""
from __future__ import annotations

import torch

from . import _checks
from ._checks import check_cu_seqlens
from .flash_bwd import launch_backward
from .flash_fwd import Varlen, launch_forward

__all__ = ["flash_attention_varlen", "flash_attention_varlen_forward", "check_cu_seqlens"]


def _check_max(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{name} must be a non-negative int (the longest sequence), got {value!r}")
    return value


def check_packed(q, k, v, names=("q", "k", "v")):
    """``q (total_q, Hq, d)``, ``k, v (total_k, Hkv, d)`` of one dtype on DEVICE; returns ``(Hq, Hkv, d)``."""
    for name, x in zip(names, (q, k, v)):
        _checks.check_tensor(x, name, ndim=3)
    _checks.check_same_dtype(**dict(zip(names, (q, k, v))))
    if k.shape != v.shape:
        raise ValueError(f"{names[1]} and {names[2]} must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    _, hq, d = q.shape
    hkv = k.shape[-2]
    if k.shape[-1] != d:
        raise ValueError(f"q and {names[1]} must have the same head dimension d, got q {tuple(q.shape)} and "
                         f"{names[1]} {tuple(k.shape)}")
    _checks.check_gqa(hq, hkv)
    _checks.check_head_dim(d, "head dimension d (q.shape[-1])")
    return hq, hkv, d


def _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, validate):
    hq, hkv, d = check_packed(q, k, v)
    validate = _checks.check_flag(validate, "validate")
    max_q = _check_max(max_seqlen_q, "max_seqlen_q")
    max_k = _check_max(max_seqlen_k, "max_seqlen_k")
    cu_q, _ = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_q, None, validate)
    batch = cu_q.shape[0] - 1
    cu_k, _ = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_k, batch, validate)
    return (Varlen(cu_q, cu_k, batch, max_q, max_k), _checks.check_flag(causal, "causal"),
            _checks.check_scale(scale, d), hq // hkv)


def flash_attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   causal=False, scale=None, *, validate=True):
    """Varlen forward: ``(o (total_q, Hq, d), lse (Hq, total_q) float32)``; rows that see no key give
    ``o = 0``, ``lse = -inf``. ``validate=False`` skips the checks of the cumulative lengths' values (one
    device sync): wrong values then give wrong output (never an out-of-bounds read of q, k or v)."""
    vl, causal, scale, group = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        causal, scale, validate)
    return _forward(q, k, v, vl, causal, scale, group)


def _forward(q, k, v, vl: Varlen, causal, scale, group):
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    if vl.max_q > 0:
        launch_forward(q, k, v, o, lse, causal, scale, group, vl)
    else:  # no query rows at all
        o.zero_()
        lse.fill_(float("-inf"))
    return o, lse


class FlashAttentionVarlenFunction(torch.autograd.Function):
    """Packed attention with the recomputing Triton backward (FA2 Algorithms 1 and 2, ``VARLEN`` kernels)."""

    @staticmethod
    def forward(ctx, q, k, v, vl, causal, scale, group):
        o, lse = _forward(q, k, v, vl, causal, scale, group)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.vl, ctx.causal, ctx.scale, ctx.group = vl, causal, scale, group
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        do = do.to(q.dtype).contiguous()
        dq = torch.zeros_like(q, memory_format=torch.contiguous_format)
        dk = torch.zeros_like(k, memory_format=torch.contiguous_format)
        dv = torch.zeros_like(v, memory_format=torch.contiguous_format)
        if ctx.vl.max_q > 0 and ctx.vl.max_k > 0:
            launch_backward(q, k, v, o, lse, do, dq, dk, dv, ctx.causal, ctx.scale, ctx.group, ctx.vl)
        return dq, dk, dv, None, None, None, None


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                           scale=None, *, validate=True):
    """Differentiable attention over packed variable-length sequences (FlashAttention's varlen API).

    ``q (total_q, Hq, d)``, ``k, v (total_k, Hkv, d)`` (fp16/bf16/fp32 on ``reference.triton.DEVICE``, ``d`` in
    {16, 32, 64, 128}, ``Hq % Hkv == 0``); ``cu_seqlens_q, cu_seqlens_k`` int32 ``(B + 1,)`` cumulative
    lengths; ``max_seqlen_q/k`` the longest sequence's lengths (they size the grid). Bottom-right causal per
    sequence. Returns ``o (total_q, Hq, d)``. ``validate=False``: see ``flash_attention_varlen_forward``.
    """
    vl, causal, scale, group = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        causal, scale, validate)
    return FlashAttentionVarlenFunction.apply(q, k, v, vl, causal, scale, group)

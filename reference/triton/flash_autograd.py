"""Differentiable FlashAttention-2: the Triton forward (Algorithm 1) and backward (Algorithm 2) as one
``torch.autograd.Function``.

The forward saves only ``q, k, v, o`` and the per-row ``lse`` (O(N d) memory, never the N x N matrix P); the
backward recomputes P from them (recomputation, FA2 section 3.1.2).
"""
from __future__ import annotations

import torch

from ._checks import check_attention_inputs, check_flag, check_scale
from .flash_bwd import launch_backward
from .flash_fwd import launch_forward


class FlashAttentionFunction(torch.autograd.Function):
    """``o = softmax(scale * q k^T [+ causal mask]) v`` with a recomputing Triton backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, group):
        B, Hq, Nq, d = q.shape
        o = torch.empty((B, Hq, Nq, d), dtype=q.dtype, device=q.device)
        lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
        launch_forward(q, k, v, o, lse, causal, scale, group)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.group = causal, scale, group
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        if do.dtype != q.dtype:
            do = do.to(q.dtype)
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        launch_backward(q, k, v, o, lse, do, dq, dk, dv, ctx.causal, ctx.scale, ctx.group)
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, causal=False, scale=None):
    """Differentiable FlashAttention-2 (forward FA2 Algorithm 1, backward Algorithm 2 with recomputation).

    Same inputs as ``flash_attention_forward``: ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)`` on
    ``reference.triton.DEVICE``, fp16/bf16/fp32, ``d`` in {16, 32, 64, 128}, bottom-right causal, GQA.
    Returns ``o (B, Hq, Nq, d)``; ``o.backward(do)`` fills ``q.grad``, ``k.grad``, ``v.grad`` (for GQA
    ``k.grad``/``v.grad`` sum over the query heads of each kv head).
    """
    *_, d, group = check_attention_inputs(q, k, v)
    causal = check_flag(causal, "causal")
    scale = check_scale(scale, d)
    return FlashAttentionFunction.apply(q, k, v, causal, scale, group)


__all__ = ["flash_attention", "FlashAttentionFunction"]

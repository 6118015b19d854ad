"""Differentiable FlashAttention on Hopper from the Gluon kernels: the FA3-style forward
(``flash_gluon.flash_attention_forward_gluon``, persistent ping-pong) and the warp-specialised backward
(``flash_gluon_bwd_ws.flash_attention_backward_gluon_ws``) as one ``torch.autograd.Function``.

The same recomputation contract as ``flash_autograd.flash_attention`` (FA2 section 3.1.2): the forward saves
``q, k, v, o`` and the per-row ``lse``, never P; the backward recomputes P from them. Hopper GPUs only
(compute capability 9.0), bfloat16/float16, ``d`` in {64, 128}: elsewhere use ``flash_attention``.
"""
from __future__ import annotations

import torch

from .._checks import check_gluon_device, check_gluon_inputs
from . import flash_gluon, flash_gluon_bwd_ws
from .flash_gluon import flash_attention_forward_gluon, key_loop_constexprs
from .flash_gluon_bwd_ws import flash_attention_backward_gluon_ws


class FlashAttentionGluonFunction(torch.autograd.Function):
    """``o = softmax(scale * q k^T [+ causal mask]) v``; forward and backward by the Gluon kernels."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, key_loop=None, bwd_config=None, bwd_order_heads=None):
        o, lse = flash_attention_forward_gluon(q, k, v, causal=causal, scale=scale, key_loop=key_loop)
        ctx.save_for_backward(q, k, v, o, lse)
        # the backward's keyword arguments
        ctx.bwd = {"causal": causal, "scale": scale, "config": bwd_config, "order_heads": bwd_order_heads}
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward_gluon_ws(q, k, v, o, lse, do.to(q.dtype), **ctx.bwd)
        return dq, dk, dv, None, None, None, None, None


def flash_attention_gluon(q, k, v, causal=False, scale=None, key_loop=None, bwd_config=None, bwd_order_heads=None):
    """Differentiable attention on an H100/H200 with the Gluon forward and warp-specialised backward.

    ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)``, bfloat16 or float16, ``d`` in {64, 128}, ``Hq % Hkv == 0``
    (GQA: ``k.grad``/``v.grad`` sum over each kv head's query heads), bottom-right causal. Returns ``o``;
    ``o.backward(do)`` fills ``q.grad``, ``k.grad``, ``v.grad``. ``key_loop``: the forward's key-loop options
    (``flash_gluon.key_loop_constexprs``; default the default ``configs.GLUON_FWD_KEY_LOOP`` of ``d``).
    ``bwd_config``, ``bwd_order_heads``: the backward's ``config`` (a ``configs.GluonBackwardConfig``, e.g. with
    ``persistent=True``) and ``order_heads`` (``flash_gluon_bwd_ws.flash_attention_backward_gluon_ws``); default
    its defaults.
    """
    *_, causal, scale = check_gluon_inputs(q, k, v, causal, scale, "flash_attention_gluon")
    key_loop_constexprs(key_loop, q.shape[-1])  # a bad option is named before any launch
    try:  # a bad backward option is named before the forward runs
        flash_gluon_bwd_ws.check_ws_config(bwd_config, q.shape[-1])
        if bwd_order_heads is not None:
            flash_gluon_bwd_ws.check_order_heads(bwd_order_heads, causal, 1)
    except (TypeError, ValueError) as exc:
        arg = "bwd_order_heads" if "order_heads" in str(exc) else "bwd_config"
        raise type(exc)(f"flash_attention_gluon: {arg}: {exc}") from None
    check_gluon_device(q.device, "flash_attention_gluon")
    return FlashAttentionGluonFunction.apply(q, k, v, causal, scale, key_loop, bwd_config, bwd_order_heads)


def recorded_launches() -> tuple[int, int]:
    """How many shapes the forward and the backward have recorded launches for (``_fastlaunch``: a repeat with the
    same shapes, dtypes, options and alignment skips Triton's launch path)."""
    return len(flash_gluon.FWD_LAUNCHES), len(flash_gluon_bwd_ws.BWD_LAUNCHES)


def clear_recorded_launches() -> None:
    """Forget the forward's and the backward's recorded launches."""
    flash_gluon.clear_launches()
    flash_gluon_bwd_ws.clear_launches()


__all__ = ["flash_attention_gluon", "FlashAttentionGluonFunction", "recorded_launches", "clear_recorded_launches"]
